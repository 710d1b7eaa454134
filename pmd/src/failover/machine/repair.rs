//! Repairing a side lost while the connection runs on (`docs/failover.md` 5d): the backup side
//! (the backup data QP and the control QP on the backup devices), lost while everything runs
//! on the default pair, or the control channel on the default devices. Both ends reset the
//! side and bring it up in a new incarnation, led by the leader as a rearm of the default pair
//! is; each side's repair messages travel on the other side's channel. The machine owns one
//! [`SideRepair`] per side.

use super::{Actions, Failover};
use crate::failover::action::Action;
use crate::failover::config::{Config, Role};
use crate::failover::message::ControlMessage;
use crate::failover::observation::Observation;
use crate::failover::time::Timestamp;
use crate::failover::vocab::{FailReason, Side, SideEpoch};

/// Where one side of a connection end stands: usable or lost, its incarnation, its repair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct SideRepair {
    /// False once a QP of the side went to ERR (here, or at the peer, which said so): it
    /// cannot come back without the peer, so it carries nothing until it is repaired.
    pub(super) usable: bool,
    /// The highest incarnation of the side this end has used or agreed to.
    pub(super) epoch: SideEpoch,
    /// Leader: the follower refused `epoch`, so neither end's side came up in it and no
    /// packet of it was sent: its PSN quarter is still fresh and the next attempt stays in it
    /// ([`SideRepair::next_epoch`]).
    pub(super) epoch_sent_nothing: bool,
    /// Bringing the side back.
    pub(super) repair: Repair,
    /// Consecutive failed repair attempts (leader).
    pub(super) failures: u32,
}

/// The steps of one side's repair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Repair {
    /// Nothing to repair, or nothing for this end to do.
    Idle,
    /// The side is lost. Leader: the next attempt, not before `not_before` (and the side's
    /// link up for the hold-down). Follower: `tell_leader` means it owes the leader a
    /// `SideLost`, sent at the same conditions.
    Lost {
        not_before: Timestamp,
        tell_leader: bool,
    },
    /// Leader: its side is reset; `SideRearm` sent, waiting for `SideRearmDone`.
    AwaitingFollower { deadline: Timestamp },
    /// Leader: the follower's side is up; bringing its own up.
    BringingUp { deadline: Timestamp },
    /// Follower: bringing its side up at the leader's request, which came over the
    /// management network if `reply_over_management` (the answer goes back the same way).
    FollowerBringingUp { reply_over_management: bool },
}

impl SideRepair {
    /// A side just set up: usable, in its first incarnation.
    pub(super) fn new(side: Side) -> Self {
        SideRepair {
            usable: true,
            epoch: SideEpoch::new(side, 0),
            epoch_sent_nothing: false,
            repair: Repair::Idle,
            failures: 0,
        }
    }

    /// Whether an attempt is under way (between the reset and the bring-up's result).
    fn in_progress(&self) -> bool {
        matches!(
            self.repair,
            Repair::AwaitingFollower { .. }
                | Repair::BringingUp { .. }
                | Repair::FollowerBringingUp { .. }
        )
    }

    /// The incarnation the leader's next attempt brings the side up in, laid out as the
    /// default pair's (`Failover::next_epoch`): four on, in the same PSN quarter, after an
    /// attempt the follower refused; one on after any other, since a follower whose answer
    /// did not come back in time, or whose side came up while the leader's did not, may have
    /// sent packets of it. So refused attempts use no PSN space: a quarter is entered again
    /// only after three later incarnations may have sent, however many were refused between.
    fn next_epoch(&self) -> SideEpoch {
        let step = if self.epoch_sent_nothing { 4 } else { 1 };
        SideEpoch::new(self.epoch.side(), self.epoch.number().saturating_add(step))
    }

    /// The attempt failed, or the side was lost again: the leader tries again after the
    /// backoff for `failures` failed attempts in a row.
    fn failed(&mut self, now: Timestamp, config: &Config) {
        self.failures = self.failures.saturating_add(1);
        let not_before = now + config.backoff(self.failures);
        tracing::debug!(epoch = %self.epoch, failures = self.failures, "failover: repair attempt failed");
        self.usable = false;
        self.repair = Repair::Lost {
            not_before,
            tell_leader: false,
        };
    }
}

impl Failover {
    pub(super) fn side(&self, side: Side) -> &SideRepair {
        match side {
            Side::Backup => &self.backup,
            Side::DefaultChannel => &self.default_channel,
        }
    }

    fn side_mut(&mut self, side: Side) -> &mut SideRepair {
        match side {
            Side::Backup => &mut self.backup,
            Side::DefaultChannel => &mut self.default_channel,
        }
    }

    /// A QP of `side` went to ERR (here, or at the peer, which said so): the side is lost
    /// until both ends reset it and bring it up in a new incarnation. A repair of the other
    /// side under way loses its messages with it.
    pub(super) fn side_lost(&mut self, side: Side, now: Timestamp) {
        self.side_mut(side).usable = false;
        if self.repair_in_progress(side.other()) {
            self.repair_failed(side.other(), now);
        }
        let follower = self.config.role == Role::Follower;
        match self.side(side).repair {
            Repair::Idle => {
                self.side_mut(side).repair = Repair::Lost {
                    not_before: now,
                    tell_leader: follower,
                }
            }
            // An attempt under way: its QPs failed, or an old incarnation's error arrived
            // late; either way the attempt does not stand.
            _ if self.repair_in_progress(side) => self.repair_failed(side, now),
            _ => {}
        }
    }

    pub(super) fn repair_in_progress(&self, side: Side) -> bool {
        self.side(side).in_progress()
    }

    pub(super) fn repair_failed(&mut self, side: Side, now: Timestamp) {
        let config = &self.config;
        match side {
            Side::Backup => self.backup.failed(now, config),
            Side::DefaultChannel => self.default_channel.failed(now, config),
        }
    }

    /// What a repair of `side` needs of this end now: what [`Failover::repair_allowed`] asks,
    /// and both links able to carry it (`Link::may_carry`: reported up, or reported down for
    /// longer than such a report is believed, issue 29 item 1: a report is a hint, and the
    /// attempt's own handshake decides whether the path carries packets).
    fn paths_allow_repair(&self, side: Side, now: Timestamp) -> bool {
        let config = &self.config;
        let via_carries = self.repair_over_management(side)
            || self.link(side.repaired_via()).may_carry(now, config);
        self.repair_allowed(side) && self.link(side.path()).may_carry(now, config) && via_carries
    }

    /// What a repair of `side` needs of this end, its links aside: the other side's channel
    /// (which carries the repair's messages) usable; for the backup side, nothing depending
    /// on the backup path (everything on a live default pair: the backup side is reset, so
    /// nothing may be on it, and its last messages are not lost); for the default devices'
    /// channel, no failback running (it needs the channel as it is: its backup is gone, so no
    /// repair could finish). A failover round does not stop a channel repair: the default
    /// device that failed its QPs starts one at the same moment, and a repair refused for it
    /// would leave the leader's channel reset and the follower's up, so that the follower's
    /// next message (a `Failback`, when its backup dies next) is lost.
    /// With the management network (5f) the default devices' channel is repaired there while
    /// the backup side is lost too: then only its own link counts.
    fn repair_allowed(&self, side: Side) -> bool {
        let idle = match side {
            Side::Backup => !self.needs_backup() || self.round_awaits_backup_side(),
            Side::DefaultChannel => !self.failing_back(),
        };
        let carried = self.repair_over_management(side) || self.side(side.other()).usable;
        carried && idle
    }

    /// From when the links' reports let `side`'s repair be tried: the side's own link up for
    /// the hold-down, or reported down for `Config::link_down_trust`; the link of the channel
    /// that carries the messages up, or reported down for the trust. `None`: not while
    /// link-down reports are believed for ever and one stands.
    fn repair_tried_from(&self, side: Side) -> Option<Timestamp> {
        let own = self.link(side.path()).tried_from(&self.config)?;
        if self.repair_over_management(side) {
            return Some(own);
        }
        let via = self.link(side.repaired_via());
        let via_from = match via.up {
            true => via.since,
            false => via.tried_from(&self.config)?,
        };
        Some(own.max(via_from))
    }

    /// Whether `side`'s repair messages go over the management network (5f): the backup
    /// side's always where there is one (it may be needed while the default path, which
    /// carries them otherwise, is down: a round waiting for it, 5c); the default devices'
    /// channel's only while the backup devices' channel, which carries them otherwise, is
    /// lost too. Once that channel is back, the default devices' channel is repaired over it.
    fn repair_over_management(&self, side: Side) -> bool {
        self.config.management
            && match side {
                Side::Backup => true,
                Side::DefaultChannel => !self.backup.usable,
            }
    }

    /// Sends one of `side`'s repair messages: on the other side's channel, or over the
    /// management network.
    fn send_repair_message(
        side: Side,
        over_management: bool,
        message: ControlMessage,
        out: &mut Actions,
    ) {
        out.push(if over_management {
            Action::SendManagement { message }
        } else {
            Action::SendControl {
                via: side.repaired_via(),
                message,
            }
        });
    }

    /// When `side`'s repair next needs this end to act: the leader's next attempt (after the
    /// backoff and the links' reports, [`Failover::repair_tried_from`]) or its deadline, the
    /// follower's `SideLost`.
    pub(super) fn repair_due(&self, side: Side) -> Option<Timestamp> {
        match self.side(side).repair {
            Repair::Lost {
                not_before,
                tell_leader,
            } => {
                let acts = self.config.role == Role::Leader || tell_leader;
                let tried_from = self.repair_tried_from(side)?;
                (acts && self.repair_allowed(side)).then(|| not_before.max(tried_from))
            }
            Repair::AwaitingFollower { deadline } | Repair::BringingUp { deadline } => {
                Some(deadline)
            }
            Repair::Idle | Repair::FollowerBringingUp { .. } => None,
        }
    }

    /// Two actions at most.
    pub(super) fn repair_tick(&mut self, side: Side, now: Timestamp, out: &mut Actions) {
        let over_management = self.repair_over_management(side);
        match self.side(side).repair {
            Repair::Lost { .. } if self.config.role == Role::Leader => {
                // Our side leaves its incarnation (RESET) before the follower hears of the
                // next one.
                let r = self.side_mut(side);
                let epoch = r.next_epoch();
                r.epoch = epoch;
                // Until the follower refuses, it may bring its side up and send.
                r.epoch_sent_nothing = false;
                if side == Side::Backup {
                    self.stale_backup_recvs = 0;
                }
                tracing::info!(%epoch, "failover: repairing a lost side");
                out.push(Action::ResetSide { side });
                Self::send_repair_message(
                    side,
                    over_management,
                    ControlMessage::SideRearm { epoch },
                    out,
                );
                self.side_mut(side).repair = Repair::AwaitingFollower {
                    deadline: now + self.config.handshake_timeout,
                };
            }
            Repair::Lost { not_before, .. } => {
                Self::send_repair_message(
                    side,
                    over_management,
                    ControlMessage::SideLost {
                        epoch: self.side(side).epoch,
                    },
                    out,
                );
                self.side_mut(side).repair = Repair::Lost {
                    not_before,
                    tell_leader: false,
                };
            }
            Repair::AwaitingFollower { .. } | Repair::BringingUp { .. } => {
                tracing::debug!(epoch = %self.side(side).epoch, "failover: repair attempt timed out");
                self.repair_failed(side, now)
            }
            Repair::Idle | Repair::FollowerBringingUp { .. } => {}
        }
    }

    /// Leader: the follower lost its `epoch.side()`; ours must be reset with it.
    pub(super) fn peer_lost_side(&mut self, epoch: SideEpoch, now: Timestamp, out: &mut Actions) {
        let side = epoch.side();
        if self.config.role == Role::Follower {
            return self.protocol_violation("SideLost to a follower", out);
        }
        let current = self.side(side).epoch;
        if epoch.number() > current.number() {
            return self.protocol_violation("SideLost for an incarnation not begun", out);
        }
        if epoch == current && !self.repair_in_progress(side) {
            tracing::warn!(%epoch, "failover: the peer lost a side");
            match side {
                Side::Backup => {
                    self.side_lost(side, now);
                    self.fail_back_if_awaiting_ready(now, out);
                }
                // The failback round needs the channel: it cannot finish (with the
                // management network it can: its messages go there too, 5f).
                Side::DefaultChannel if self.failing_back() && !self.config.management => {
                    self.fail(FailReason::BackupUnavailable, out)
                }
                Side::DefaultChannel => self.side_lost(side, now),
            }
        }
    }

    /// Follower: the leader's `epoch.side()` has left every incarnation before `epoch`. The
    /// answer goes back the way the request came (`over_management`): the leader sends there
    /// only when its own end of the in-band channel is lost.
    pub(super) fn side_rearm_requested(
        &mut self,
        epoch: SideEpoch,
        over_management: bool,
        now: Timestamp,
        out: &mut Actions,
    ) {
        let side = epoch.side();
        if self.config.role == Role::Leader || epoch.number() <= self.side(side).epoch.number() {
            return self.protocol_violation("SideRearm to a leader or for an old incarnation", out);
        }
        let r = self.side_mut(side);
        r.epoch = epoch;
        // The leader's side is in RESET: ours cannot carry anything now either.
        r.usable = false;
        if side == Side::DefaultChannel && self.repair_in_progress(Side::Backup) {
            // The backup repair's messages travel on this channel.
            self.repair_failed(Side::Backup, now);
        }
        if !self.paths_allow_repair(side, now) {
            if side == Side::Backup {
                // A switch-back waiting for the leader's `SwitchBackReady`: the reset
                // discarded it if it had not arrived; the refusal below tells the leader the
                // attempt failed, and the traffic moves to the default pair.
                self.fail_back_if_awaiting_ready(now, out);
            }
            self.side_mut(side).repair = Repair::Lost {
                not_before: now,
                tell_leader: false,
            };
            Self::send_repair_message(
                side,
                over_management,
                ControlMessage::SideRearmDone { epoch, ok: false },
                out,
            );
            return;
        }
        if side == Side::Backup {
            self.stale_backup_recvs = 0;
        }
        out.push(Action::ResetSide { side });
        out.push(Action::BringUpSide { epoch });
        self.side_mut(side).repair = Repair::FollowerBringingUp {
            reply_over_management: over_management,
        };
    }

    /// Leader: the follower's `epoch.side()` is in RTS in `epoch` (it left every earlier one).
    pub(super) fn side_rearm_done(
        &mut self,
        epoch: SideEpoch,
        ok: bool,
        now: Timestamp,
        out: &mut Actions,
    ) {
        if self.config.role == Role::Follower {
            return self.protocol_violation("SideRearmDone to a follower", out);
        }
        let side = epoch.side();
        match self.side(side).repair {
            Repair::AwaitingFollower { deadline } if epoch == self.side(side).epoch => {
                if ok && self.paths_allow_repair(side, now) {
                    out.push(Action::BringUpSide { epoch });
                    self.side_mut(side).repair = Repair::BringingUp { deadline };
                } else {
                    // A refusing follower did not bring its side up, and ours is in RESET.
                    self.side_mut(side).epoch_sent_nothing = !ok;
                    self.repair_failed(side, now);
                }
            }
            // An abandoned attempt.
            _ => {}
        }
    }

    /// The driver brought this end's `epoch.side()` up in `epoch`, or could not.
    pub(super) fn side_up(
        &mut self,
        epoch: SideEpoch,
        ok: bool,
        now: Timestamp,
        out: &mut Actions,
    ) {
        let side = epoch.side();
        if epoch != self.side(side).epoch {
            return;
        }
        let up = ok && self.link(side.path()).may_carry(now, &self.config);
        match self.side(side).repair {
            Repair::BringingUp { .. } if up => {
                self.side_repaired(side);
                if side == Side::Backup {
                    self.backup_side_repaired(now, out);
                }
            }
            Repair::BringingUp { .. } => self.repair_failed(side, now),
            Repair::FollowerBringingUp {
                reply_over_management,
            } => {
                Self::send_repair_message(
                    side,
                    reply_over_management,
                    ControlMessage::SideRearmDone { epoch, ok: up },
                    out,
                );
                if up {
                    self.side_repaired(side);
                    if side == Side::Backup {
                        self.backup_side_repaired(now, out);
                    }
                } else {
                    self.side_mut(side).repair = Repair::Lost {
                        not_before: now,
                        tell_leader: false,
                    };
                }
            }
            _ => {}
        }
    }

    fn side_repaired(&mut self, side: Side) {
        let r = self.side_mut(side);
        r.usable = true;
        r.repair = Repair::Idle;
        r.failures = 0;
        let epoch = r.epoch;
        tracing::info!(%epoch, "failover: side repaired");
        self.observations.push(Observation::SideRepaired { epoch });
    }
}
