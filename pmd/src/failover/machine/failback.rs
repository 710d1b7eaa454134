//! Failback (`docs/failover.md` 5e): the backup dies while traffic depends on it, and both
//! directions move to the default pair in a new epoch, over the default devices' channel.

use core::time::Duration;

use super::{Actions, DefaultQp, Failover, Link, RecvState, RoundStep, SendState};
use crate::failover::action::Action;
use crate::failover::config::Epoch;
use crate::failover::event::Progress;
use crate::failover::message::ControlMessage;
use crate::failover::observation::Observation;
use crate::failover::time::Timestamp;
use crate::failover::vocab::{FailReason, Path, Side};

/// One failback round: both ends put their backup QP and default QP in ERR, drain them,
/// exchange `Failback` messages on the default devices' channel (an epoch proposal and a
/// receive counter), bring their default QP up in the higher proposal with their receives on
/// it, tell each other (`FailbackReady`) and ring the sends the peer did not consume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct FailbackRound {
    pub(super) step: FailbackStep,
    /// The peer's `Failback` message, once it arrived.
    pub(super) peer: Option<PeerFailback>,
    /// The peer's `FailbackReady` arrived before this end's default QP was up.
    pub(super) peer_ready: bool,
    /// The default pair failed too (the round replaced a failover round, or started from a
    /// default failure with the backup lost): past the deadline both paths were down for
    /// the RC budget, `backup-unavailable`, not a handshake timeout.
    pub(super) default_failed: bool,
    /// Past it the connection fails: the handshake timeout while the default link is up, the
    /// RC retry budget while it is down.
    pub(super) deadline: Timestamp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct PeerFailback {
    pub(super) epoch: Epoch,
    pub(super) recvs_completed: u64,
    /// When the peer's default QP is, at the latest, the backoff past leaving RTS: the wait its
    /// message carried, counted from its arrival here (no sooner than from its sending).
    pub(super) up_after: Timestamp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum FailbackStep {
    /// Waiting for the driver to drain both QPs.
    Draining,
    /// Our `Failback` is sent; waiting for the peer's, and for the default link.
    AwaitingPeer {
        drained: Progress,
        proposed: Epoch,
        sends_before_first_read: Option<u64>,
    },
    /// The default QP is being brought up in `epoch` with the work moved onto it.
    BringingUp { epoch: Epoch },
    /// Our receives are on the default QP in `epoch` and the peer was told; waiting for its
    /// `FailbackReady` to ring our sends.
    AwaitingReady { epoch: Epoch },
}

impl Failover {
    pub(super) fn failing_back(&self) -> bool {
        matches!(self.send, SendState::FailingBack(_))
    }

    /// Whether a backup failure can be answered by moving the traffic to the default pair:
    /// the default devices' channel works and no failback is running. During a failover
    /// round (the default pair failed too) the failback waits for the default path within
    /// the RC budget: whichever path comes back first.
    pub(super) fn may_fail_back(&self) -> bool {
        (self.default_channel.usable || self.config.management) && !self.failing_back()
    }

    /// Sends one of a failback's messages: on the default devices' channel while it works,
    /// and over the management network as well where there is one (5f). The backup channel is
    /// gone during a failback, so the default devices' channel is the last in-band one: were
    /// its QP to fail mid-handshake at either end (the all-targets soak's loss: a device
    /// failing every QP 100 ms after the backup device did), the copy on the management
    /// network still gets through, and neither end needs to learn that the other's channel
    /// failed. Each channel delivers in order, so the first copies arrive in the order sent;
    /// the second copy of each is dropped (`peer_failing_back`, `peer_failback_ready`).
    fn send_failback_message(&self, message: ControlMessage, out: &mut Actions) {
        if self.default_channel.usable {
            out.push(Action::SendControl {
                via: Path::Default,
                message,
            });
        }
        if self.config.management {
            out.push(Action::SendManagement { message });
        }
    }

    pub(super) fn failback_due(&self, now: Timestamp) -> bool {
        matches!(self.send, SendState::FailingBack(round) if now >= round.deadline)
    }

    /// The backup failed while traffic depended on it (or the peer said so): both QPs to ERR
    /// (this end leaves every epoch of both pairs) and drained.
    /// `default_failed`: the default pair failed too (a failover round was running or is
    /// starting): the round waits for it no longer than the RC budget, whatever its link
    /// says.
    pub(super) fn start_failback(
        &mut self,
        peer: Option<PeerFailback>,
        default_failed: bool,
        now: Timestamp,
        out: &mut Actions,
    ) {
        let default_failed = default_failed || matches!(self.send, SendState::FailingOver(_));
        // Whether our own bound covers the peer's old QP too (6, "Old packets"): its
        // `Failover` arrived (a finished round counts the backoff from that, `finish_round`)
        // or a rearm attempt came since (it started past both ends' bounds). Not while the
        // default pair carried traffic until now, nor for a round still waiting for the
        // peer's `Failover`: then the wait the peer's `Failback` carries is what tells.
        let peer_covered = !matches!(self.send, SendState::FailingOver(_))
            && !matches!(self.default_qp, DefaultQp::Live { confirmed: true });
        let deadline = if self.default_link.up && !default_failed {
            // The backup is gone, so the default path is the only one left, and a peer
            // whose side of it is down (a link this end cannot see) cannot answer: the
            // round waits the outage tolerance, not only the handshake timeout (seen in the
            // chaos scenario: a failback gave up 2 s in while the peer's default NIC was
            // down and its own `Failback` waited for it).
            now + self.config.handshake_wait()
        } else {
            // The default path is down too: it may come back within the outage tolerance
            // (5c), counted from the first of the failures that are waiting.
            let budget = now + self.config.no_path_wait();
            self.backup_deadline.map_or(budget, |d| d.min(budget))
        };
        // The backup pair is gone for this round; the repair brings it back later (5d).
        self.side_lost(Side::Backup, now);
        self.backup_deadline = None;
        tracing::warn!(epoch = %self.epoch, started_by_peer = peer.is_some(), default_link_up = self.default_link.up, "failover: traffic needs a path and the backup is gone; failing back to the default path");
        self.observations
            .push(Observation::FailbackStarted { epoch: self.epoch });
        self.send = SendState::FailingBack(FailbackRound {
            step: FailbackStep::Draining,
            peer,
            peer_ready: false,
            default_failed,
            deadline,
        });
        self.recv = RecvState::FailingBack;
        // The bound is on the last incarnation that carried traffic (6, "Old packets"): a
        // rearm attempt's sends nothing but its probe, and starts no sooner than the bound.
        let up_after = match self.default_qp {
            // Out of RTS since the failover round that set the backoff (no attempt since):
            // the rearm's own bound.
            DefaultQp::Dead { backoff_until } if self.rearm_failures == 0 => {
                backoff_until.min(now + self.config.backoff_initial)
            }
            // Carrying traffic until the `MoveQpToErr` below.
            DefaultQp::Live { confirmed: true } => now + self.config.backoff_initial,
            // A rearm attempt came (or is) between: it started past both ends' bounds.
            _ => now,
        };
        self.default_qp = DefaultQp::FailingBack {
            up_after,
            peer_covered,
        };
        self.owes_rearm_ready = false;
        self.rearm_failures = 0;
        out.push(Action::MoveQpToErr { path: Path::Backup });
        out.push(Action::MoveQpToErr {
            path: Path::Default,
        });
        out.push(Action::DrainForFailback);
    }

    /// The peer's `Failback`: it starts our round, or completes what our round waits for.
    /// `over_management`: it came over the management network, which says nothing of the
    /// default path.
    pub(super) fn peer_failing_back(
        &mut self,
        peer: PeerFailback,
        over_management: bool,
        now: Timestamp,
        out: &mut Actions,
    ) {
        if self.last_failback.is_some_and(|last| peer.epoch <= last) {
            if self.config.management {
                // The second copy of a round's `Failback` (5f), after the round brought the
                // default pair up.
                return;
            }
            return self.protocol_violation("Failback for an epoch already failed back to", out);
        }
        if !over_management {
            self.default_path_carried(now);
        }
        match self.send {
            SendState::FailingBack(FailbackRound {
                peer: Some(known), ..
            }) if self.config.management
                && (known.epoch, known.recvs_completed) == (peer.epoch, peer.recvs_completed) =>
            {
                // Its second copy (5f).
            }
            SendState::FailingBack(round) if round.peer.is_none() => {
                self.send = SendState::FailingBack(FailbackRound {
                    peer: Some(peer),
                    ..round
                });
                self.maybe_bring_up_failback(now, out);
            }
            SendState::FailingBack(_) => {
                self.protocol_violation("a second Failback in one failback round", out)
            }
            // Our default pair failed too, and the peer's backup side is gone: the round
            // becomes a failback, waiting for the default path within the RC budget.
            _ => self.start_failback(Some(peer), false, now, out),
        }
    }

    pub(super) fn failback_drained(
        &mut self,
        progress: Progress,
        atomic: bool,
        sends_before_first_read: Option<u64>,
        now: Timestamp,
        out: &mut Actions,
    ) {
        let SendState::FailingBack(
            round @ FailbackRound {
                step: FailbackStep::Draining,
                ..
            },
        ) = self.send
        else {
            return;
        };
        if atomic {
            return self.fail(FailReason::AtomicInFlight, out);
        }
        // Past every epoch our default QP was in (it is in ERR now). The leader's proposal is
        // the higher one (the follower's epochs are the leader's), so its PSN quarter choice
        // decides.
        let proposed = self.next_epoch();
        // What is left of our own bound, for the peer's bring-up (6, "Old packets").
        let wait = match self.default_qp {
            DefaultQp::FailingBack { up_after, .. } => up_after.saturating_since(now),
            _ => Duration::ZERO,
        };
        self.send_failback_message(
            ControlMessage::Failback {
                epoch: proposed,
                recvs_completed: progress.recvs_completed,
                wait,
            },
            out,
        );
        self.send = SendState::FailingBack(FailbackRound {
            step: FailbackStep::AwaitingPeer {
                drained: progress,
                proposed,
                sends_before_first_read,
            },
            ..round
        });
        self.maybe_bring_up_failback(now, out);
    }

    /// Both `Failback`s known, the default link up and the backoff since both ends' default
    /// QPs left RTS over: bring the default QP up in the higher proposal. Both QPs were in
    /// ERR when their message left (H1: neither is in an earlier epoch any more), and each
    /// proposal is above every epoch its end's QP was in. The wait is a rearm's (6, "Old
    /// packets"): an old packet whose PSN is the new start PSN is in sequence as soon as the
    /// receiving QP is up, so each end waits out the peer's bound (carried in its `Failback`)
    /// as well as its own.
    pub(super) fn maybe_bring_up_failback(&mut self, now: Timestamp, out: &mut Actions) {
        let SendState::FailingBack(round) = self.send else {
            return;
        };
        let (
            FailbackStep::AwaitingPeer {
                drained,
                proposed,
                sends_before_first_read,
            },
            Some(peer),
        ) = (round.step, round.peer)
        else {
            return;
        };
        if !self.default_link.up {
            return;
        }
        if peer.recvs_completed > drained.sends_posted {
            return self.protocol_violation("peer consumed more sends than were posted", out);
        }
        if sends_before_first_read.is_some_and(|before| peer.recvs_completed > before) {
            return self.fail(FailReason::ReadOvertaken, out);
        }
        if self.failback_bring_up_at().is_some_and(|due| now < due) {
            // A `Tick` at `poll_timeout` brings it up.
            return;
        }
        let epoch = proposed.max(peer.epoch);
        self.epoch = epoch;
        self.epoch_sent_nothing = false;
        self.last_failback = Some(epoch);
        // The backup RQ is left in ERR; the repair resets it, its stale receives with it.
        self.stale_backup_recvs = 0;
        out.push(Action::Failback {
            epoch,
            skip_through: peer.recvs_completed,
        });
        self.send = SendState::FailingBack(FailbackRound {
            step: FailbackStep::BringingUp { epoch },
            ..round
        });
    }

    /// When a failback round whose bring-up waits only for the backoff since both default
    /// QPs left RTS may bring it up (the peer's `Failback` is here and the default link is
    /// up): the later of our bound and the peer's, unless ours covers the peer's already.
    /// The peer's is counted from its message's arrival, so a message that was long in the
    /// network (a control QP's retransmission, hundreds of milliseconds) makes it later than
    /// it is: only taken where nothing better is known.
    pub(super) fn failback_bring_up_at(&self) -> Option<Timestamp> {
        let (
            SendState::FailingBack(round),
            DefaultQp::FailingBack {
                up_after,
                peer_covered,
            },
        ) = (self.send, self.default_qp)
        else {
            return None;
        };
        let awaiting_peer = matches!(round.step, FailbackStep::AwaitingPeer { .. });
        let peer = round
            .peer
            .filter(|_| awaiting_peer && self.default_link.up)?;
        Some(if peer_covered {
            up_after
        } else {
            up_after.max(peer.up_after)
        })
    }

    /// The default QP is up in `epoch` with everything moved onto it: receives may be
    /// posted there directly, and the peer may ring its sends.
    pub(super) fn failback_up(&mut self, epoch: Epoch, up: bool, out: &mut Actions) {
        let SendState::FailingBack(round) = self.send else {
            return;
        };
        if round.step != (FailbackStep::BringingUp { epoch }) {
            return;
        }
        if !up {
            tracing::warn!(%epoch, "failover: failing back, the default QP did not come up");
            return self.fail(FailReason::BackupUnavailable, out);
        }
        self.recv = RecvState::Default;
        self.send_failback_message(ControlMessage::FailbackReady { epoch }, out);
        if round.peer_ready {
            return self.finish_failback(epoch, out);
        }
        self.send = SendState::FailingBack(FailbackRound {
            step: FailbackStep::AwaitingReady { epoch },
            ..round
        });
    }

    /// A failback message came over the default devices' channel: the default path carries
    /// packets, whatever the link watch said (a netdev can be reported running up to a
    /// second after it is up again, `docs/testbed.md` "Known problems"). As a `Failover`
    /// arriving over the backup path resumes a round that waits for the backup link.
    pub(super) fn default_path_carried(&mut self, now: Timestamp) {
        if !self.default_link.up {
            tracing::info!(
                "failover: a failback message came over the default path; its link is taken as up"
            );
            self.default_link = Link {
                up: true,
                since: now,
            };
            self.default_link_bounced = true;
        }
    }

    /// The peer's receives are on its default QP in `epoch`.
    pub(super) fn peer_failback_ready(&mut self, epoch: Epoch, out: &mut Actions) {
        // With the management network every failback message comes twice (5f): a copy for
        // an epoch already failed back to, outside the round that agreed on it, is the second.
        let awaited = match self.send {
            SendState::FailingBack(round) => match round.step {
                FailbackStep::AwaitingReady { epoch: e } => e == epoch,
                FailbackStep::BringingUp { epoch: e } => e == epoch && !round.peer_ready,
                FailbackStep::Draining | FailbackStep::AwaitingPeer { .. } => false,
            },
            _ => false,
        };
        let second_copy = self.config.management
            && self.last_failback.is_some_and(|last| epoch <= last)
            && !awaited;
        if second_copy {
            return;
        }
        let SendState::FailingBack(round) = self.send else {
            return self.protocol_violation("FailbackReady outside a failback round", out);
        };
        let agreed = match (round.step, round.peer) {
            (
                FailbackStep::AwaitingReady { epoch: e } | FailbackStep::BringingUp { epoch: e },
                _,
            ) => Some(e),
            (FailbackStep::AwaitingPeer { proposed, .. }, Some(peer)) => {
                Some(proposed.max(peer.epoch))
            }
            _ => None,
        };
        if agreed != Some(epoch) {
            return self.protocol_violation("FailbackReady for another epoch", out);
        }
        match round.step {
            FailbackStep::AwaitingReady { .. } => self.finish_failback(epoch, out),
            _ => {
                self.send = SendState::FailingBack(FailbackRound {
                    peer_ready: true,
                    ..round
                })
            }
        }
    }

    pub(super) fn finish_failback(&mut self, epoch: Epoch, out: &mut Actions) {
        out.push(Action::ReleaseDefaultDoorbell);
        self.send = SendState::Default;
        self.default_qp = DefaultQp::Live { confirmed: true };
        tracing::info!(%epoch, "failover: traffic back on the default path after the backup failed");
        self.observations.push(Observation::FailedBack { epoch });
    }

    /// The default link came back while a failover round waits for the backup link: the
    /// default path came back first, so the round becomes a failback. Our `Failover` may
    /// have left (it goes while the backup link is reported down): a peer that took it is
    /// in Fallback and follows our `Failback` from there, and one that takes it later ignores
    /// it (a round from before a failback). A round waiting for the backup side's repair
    /// (`Failover::round_awaits_backup_side`) fails back too, whatever its backup link says.
    pub(super) fn default_back_first(&mut self, now: Timestamp, out: &mut Actions) {
        let SendState::FailingOver(round) = self.send else {
            return;
        };
        let waiting = matches!(
            round.step,
            RoundStep::Draining | RoundStep::AwaitingPeer { .. }
        );
        let awaits_side = self.round_awaits_backup_side();
        if (waiting && !self.backup_link.up || awaits_side) && self.may_fail_back() {
            tracing::info!(epoch = %round.epoch, "failover: the default link came back before the backup link; failing back");
            self.start_failback(None, true, now, out);
        }
    }

    /// The default link went down during a failback: before the default QP is up, the round
    /// waits for it the outage tolerance from now (the handshake timeout stops: the peer
    /// cannot answer over a path that carries nothing), never what is left of the handshake
    /// timeout, which can be a few milliseconds for a link that went down late in it.
    pub(super) fn failback_link_down(&mut self, now: Timestamp) {
        if let SendState::FailingBack(round) = self.send {
            if matches!(
                round.step,
                FailbackStep::Draining | FailbackStep::AwaitingPeer { .. }
            ) {
                self.send = SendState::FailingBack(FailbackRound {
                    deadline: now + self.config.no_path_wait(),
                    ..round
                });
            }
        }
    }

    /// The default link is back during a failback: the handshake may proceed.
    pub(super) fn failback_link_up(&mut self, now: Timestamp, out: &mut Actions) {
        if let SendState::FailingBack(round) = self.send {
            if matches!(
                round.step,
                FailbackStep::Draining | FailbackStep::AwaitingPeer { .. }
            ) {
                // The path is back within the budget: the handshake gets its own time from
                // now. The peer's `Failback`, posted while a link was down, arrives at its
                // control QP's next retransmission, up to one control ACK timeout after
                // the link-up (268 ms at the defaults); counted from the first failure, the
                // RC budget could end before it (seen: both default NICs down 98 ms, the
                // responder's down again 5 ms later for 213 ms, and both ends gave up 1 ms
                // before the retransmission that would have carried their messages).
                self.send = SendState::FailingBack(FailbackRound {
                    deadline: round.deadline.max(now + self.config.handshake_wait()),
                    ..round
                });
                self.maybe_bring_up_failback(now, out);
            }
        }
    }

    /// The peer's backup side is gone (lost, or reset for a repair) while our switch-back
    /// waits for its `SwitchBackReady`, which travels on that side's channel and may have
    /// gone with it: the peer, whose receives are back on its default QP, needs nothing of
    /// the backup and would never fail back itself. Move the traffic to the default pair
    /// (5e) instead of waiting for an answer that may never come.
    pub(super) fn fail_back_if_awaiting_ready(&mut self, now: Timestamp, out: &mut Actions) {
        let awaiting_ready = matches!(
            self.send,
            SendState::WaitDrained {
                notified: Some(_),
                ..
            }
        );
        if awaiting_ready && self.may_fail_back() {
            tracing::warn!(epoch = %self.epoch, "failover: the peer's backup side went away before its SwitchBackReady came; failing back");
            self.start_failback(None, false, now, out);
        }
    }
}
