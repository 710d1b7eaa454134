//! The failover machine of one resilient connection end.

use core::time::Duration;

use super::action::{Action, Route};
use super::config::{Config, Epoch, Role};
use super::event::{Event, Progress};
use super::message::ControlMessage;
use super::observation::{Observation, Observations, RoundTrigger};
use super::status::{ErrorClass, WcStatus};
use super::time::Timestamp;
use super::vocab::{FailReason, Path, Side};

mod failback;
mod repair;

use failback::{FailbackRound, PeerFailback};
use repair::SideRepair;

/// The SHIFT failover machine of one end of a resilient connection.
///
/// Sans-IO: [`Failover::handle`] takes an event and the time and returns the actions the
/// driver must perform, in an inline [`Actions`] of [`MAX_ACTIONS_PER_EVENT`] slots; it reads
/// no clock, makes no system call and allocates nothing. What it observed on the way (a round
/// started, a switch-back started) waits for [`Failover::poll_observation`]. The driver
/// calls it only on events (an error completion, a link change, a control message, a timer);
/// while both directions run on the default QP it is never called per WQE, and the routes
/// ([`Failover::send_route`], [`Failover::recv_route`]) do not change.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Failover {
    config: Config,
    /// The send queue: the paper's states 1-4, and the failover round that leads to state 2.
    send: SendState,
    /// The receive queue: where the application's receive WQEs are.
    recv: RecvState,
    /// This end's default QP.
    default_qp: DefaultQp,
    /// The highest epoch this end has used or agreed to.
    epoch: Epoch,
    /// Leader: no packet of `epoch` was sent by either end (the attempt has not brought this
    /// end's QP up, and the follower sends only after this end's probe), so its PSN quarter is
    /// still fresh and the next epoch stays in it ([`Failover::next_epoch`]).
    epoch_sent_nothing: bool,
    /// The epoch of the last failover round this end sent its `Failover` message for.
    last_round: Option<Epoch>,
    /// The epoch the last failback brought the default pair up in: rearm messages of the
    /// backup channel for it or earlier ones are stale.
    last_failback: Option<Epoch>,
    /// Consecutive failed rearm attempts (leader).
    rearm_failures: u32,
    /// Follower: it refused the leader's last rearm attempt and owes it a `RearmReady` once
    /// its default link has been up for the hold-down.
    owes_rearm_ready: bool,
    /// Leader: the rearm attempt under way started while the default link was reported down
    /// (past `Config::link_down_trust`); a link-up abandons it for one held down as usual.
    rearm_unreported: bool,
    default_link: Link,
    /// The default link's last report up followed one down (or a message proved the path
    /// back): an RC error soon after is the tail of that outage (`default_answers_first_at`).
    default_link_bounced: bool,
    backup_link: Link,
    /// The backup side (the backup data QP and the control QP on the backup devices): lost
    /// when one of them goes to ERR, since the backup pair cannot be brought back without
    /// the peer, so the connection runs unprotected until both ends repair it.
    backup: SideRepair,
    /// The control channel on the default devices, which carries the backup side's repair
    /// and the failback; lost and repaired the same way, over the backup devices' channel.
    default_channel: SideRepair,
    /// Stale receive WQEs left at the head of the backup RQ by the last receive switch-back.
    stale_backup_recvs: u64,
    /// The backup link is down while something needs it: the connection fails if it is not
    /// back by then (`Config::backup_wait`, the QP's own RC retry budget), as a plain RC QP
    /// would fail after its retries, not at the link-down.
    backup_deadline: Option<Timestamp>,
    failed: Option<FailReason>,
    /// What happened that the driver has not taken yet ([`Failover::poll_observation`]).
    observations: Observations,
}

/// The most actions one call of [`Failover::handle`] returns.
pub const MAX_ACTIONS_PER_EVENT: usize = 4;

/// The actions of one event, in order: inline, never more than [`MAX_ACTIONS_PER_EVENT`]
/// (the failover tests and the model checker check it), so handling an event allocates
/// nothing.
pub type Actions = smallvec::SmallVec<[Action; MAX_ACTIONS_PER_EVENT]>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum SendState {
    /// State 1: sends go to the default QP.
    Default,
    /// State 1 -> 2: the default pair failed; sends are withheld on the default QP until they
    /// are copied to the backup QP.
    FailingOver(Round),
    /// State 2: sends go to the backup QP.
    Fallback,
    /// State 3: the default path is back; sends still go to the backup QP until the
    /// application posts a signaled WR, the fence.
    WaitSignaled,
    /// State 4: the fence is on the backup QP, later sends are withheld on the default QP.
    /// `notified`: the fence completed and the peer was told; waiting for its receive queue
    /// to follow, until the deadline.
    WaitDrained {
        sends_before: u64,
        notified: Option<Timestamp>,
    },
    /// The backup failed while traffic depended on it: both directions move to the default
    /// pair in a new epoch (`docs/failover.md` 5e); sends are withheld on the default QP.
    FailingBack(FailbackRound),
}

/// One failover round: both ends put their default QP in ERR, drain it, move receives to the
/// backup QP, exchange `Failover` messages and move sends the peer has not consumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Round {
    /// The default-pair incarnation that failed.
    epoch: Epoch,
    step: RoundStep,
    /// The peer's `Failover` message, if it arrived while we were still draining.
    peer: Option<PeerFailover>,
    deadline: Timestamp,
    /// When the round began: a default link reported up after it came back during the round.
    started: Timestamp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum RoundStep {
    /// Waiting for the driver to drain the default QP.
    Draining,
    /// Our `Failover` message is sent; waiting for the peer's.
    AwaitingPeer {
        drained: Progress,
        sends_before_first_read: Option<u64>,
    },
    /// The default QP is drained, and the backup side is lost (its QPs in ERR): our
    /// `Failover` waits for its repair over the management network, or the round becomes a
    /// failback when the default path answers first (`docs/failover.md` 5c, "whichever path
    /// answers first").
    AwaitingBackupSide {
        drained: Progress,
        sends_before_first_read: Option<u64>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct PeerFailover {
    recvs_completed: u64,
    stale_recvs: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum RecvState {
    /// Receive WQEs are posted on the default QP.
    Default,
    /// Receive WQEs are posted on the backup QP.
    Fallback,
    /// The peer switched its sends back after `sends_before` two-sided sends; waiting for our
    /// backup CQ to show them all before moving the remaining receive WQEs.
    SwitchingBack {
        sends_before: u64,
        redrain_at: Timestamp,
    },
    /// A failback round: receives are written to the default RQ without being published,
    /// behind what the round moves there.
    FailingBack,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum DefaultQp {
    /// In RTS in the current epoch. `confirmed` once a probe went through in this epoch.
    Live { confirmed: bool },
    /// Out of its last epoch (ERR or RESET). The leader tries again after `backoff_until`.
    Dead { backoff_until: Timestamp },
    /// Leader: a rearm attempt for the current epoch.
    Rearming {
        step: RearmStep,
        deadline: Timestamp,
    },
    /// Follower: being brought up into the current epoch at the leader's request.
    BringingUp,
    /// Out of its epoch (ERR, then RESET) and brought up again by a failback round, no sooner
    /// than `up_after` (the backoff after its last incarnation that carried traffic left RTS)
    /// nor, unless `peer_covered` (`up_after` is past the peer's bound too), than the peer's
    /// own bound its `Failback` carried: the bound a rearm keeps too (`docs/failover.md` 6,
    /// "Old packets").
    FailingBack {
        up_after: Timestamp,
        peer_covered: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum RearmStep {
    AwaitingFollower,
    BringingUp,
    Probing,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Link {
    up: bool,
    since: Timestamp,
}

impl Link {
    /// From when this end may try the path as far as its link reports go: the hold-down
    /// after a link-up; after a link-down, once the report has stood for
    /// `Config::link_down_trust`. A report is a hint (`docs/failover.md` 5c): past the trust,
    /// the attempt's own probe decides whether the path carries packets.
    /// `None`: never, while the link is reported down and such reports are believed for
    /// ever (`Duration::MAX`).
    fn tried_from(&self, config: &Config) -> Option<Timestamp> {
        match self.up {
            true => Some(self.since + config.holddown),
            false if config.link_down_trust == Duration::MAX => None,
            false => Some(self.since + config.link_down_trust),
        }
    }

    /// Whether what was just brought up on the path may count: the link up, or reported down
    /// for longer than such a report is believed.
    fn may_carry(&self, now: Timestamp, config: &Config) -> bool {
        self.up || now >= self.since + config.link_down_trust
    }
}

/// Where the send queue is, for logs, statistics and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SendPhase {
    /// State 1: on the default QP.
    Default,
    /// A failover round is running.
    FailingOver,
    /// State 2: on the backup QP.
    Fallback,
    /// State 3: waiting for the application's next signaled WR.
    WaitSignaled,
    /// State 4: waiting for the fence to complete and the peer to follow.
    WaitDrained,
    /// A failback round is running: traffic moves from a dead backup to the default pair.
    FailingBack,
    /// The connection failed.
    Failed,
}

/// Where the receive queue is, for logs, statistics and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecvPhase {
    /// Receive WQEs on the default QP.
    Default,
    /// Receive WQEs on the backup QP.
    Fallback,
    /// Moving receive WQEs back to the default QP.
    SwitchingBack,
    /// The connection failed.
    Failed,
}

/// Where this end's default QP is, for logs, statistics and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DefaultQpPhase {
    /// In RTS and confirmed by a probe.
    Live,
    /// In RTS, not yet confirmed by a probe.
    Unconfirmed,
    /// In ERR or RESET.
    Dead,
    /// Being brought back (a rearm attempt).
    Rearming,
}

impl Failover {
    /// A connection end that has just been set up: both paths up, everything on the default
    /// QP, epoch 0.
    pub fn new(config: Config, now: Timestamp) -> Self {
        Failover {
            config,
            send: SendState::Default,
            recv: RecvState::Default,
            default_qp: DefaultQp::Live { confirmed: true },
            epoch: Epoch(0),
            epoch_sent_nothing: false,
            last_round: None,
            last_failback: None,
            rearm_failures: 0,
            owes_rearm_ready: false,
            rearm_unreported: false,
            default_link: Link {
                up: true,
                since: now,
            },
            default_link_bounced: false,
            backup_link: Link {
                up: true,
                since: now,
            },
            backup: SideRepair::new(Side::Backup),
            default_channel: SideRepair::new(Side::DefaultChannel),
            stale_backup_recvs: 0,
            backup_deadline: None,
            failed: None,
            observations: Observations::new(),
        }
    }

    /// Handles one event at time `now` and returns the actions the driver must perform, in
    /// order (at most [`MAX_ACTIONS_PER_EVENT`]). A failed end ignores every event.
    pub fn handle(&mut self, event: Event, now: Timestamp) -> Actions {
        let mut out = Actions::new();
        if self.failed.is_none() {
            self.dispatch(event, now, &mut out);
        }
        out
    }

    /// What the machine observed since the last call, oldest first; `None` when there is
    /// nothing more. The driver takes them after every [`Failover::handle`].
    pub fn poll_observation(&mut self) -> Option<Observation> {
        if self.observations.is_empty() {
            return None;
        }
        Some(self.observations.remove(0))
    }

    fn dispatch(&mut self, event: Event, now: Timestamp, out: &mut Actions) {
        use ControlMessage as Msg;
        match event {
            // State 1 -> 2: the default path failed, here or at the peer.
            Event::ErrorCompletion {
                path: Path::Default,
                status,
            } => self.default_failed(status, now, out),
            Event::LinkDown {
                path: Path::Default,
            } => self.default_link_down(now, out),
            Event::Control(Msg::Failover {
                epoch,
                recvs_completed,
                stale_recvs,
            }) => self.peer_failed_over(
                epoch,
                PeerFailover {
                    recvs_completed,
                    stale_recvs,
                },
                now,
                out,
            ),
            Event::DefaultDrained {
                progress,
                first_error,
                atomic_in_flight,
                sends_before_first_read,
            } => self.default_drained(
                progress,
                first_error,
                atomic_in_flight,
                sends_before_first_read,
                now,
                out,
            ),
            // The backup path failed.
            Event::ErrorCompletion {
                path: Path::Backup,
                status,
            } => self.backup_failed(status, true, now, out),
            Event::LinkDown { path: Path::Backup } => {
                self.backup_link = Link {
                    up: false,
                    since: now,
                };
                self.pause_backup_handshakes();
                if self.repair_in_progress(Side::Backup) {
                    self.repair_failed(Side::Backup, now);
                }
                if self.repair_in_progress(Side::DefaultChannel) {
                    // Its messages travel on the backup devices' channel.
                    self.repair_failed(Side::DefaultChannel, now);
                }
                self.backup_failed(WcStatus::RetryExcErr, false, now, out)
            }
            Event::ControlFailed { via: Path::Backup } => {
                self.backup_failed(WcStatus::RetryExcErr, true, now, out)
            }
            // Back to the default pair when the backup dies with traffic on it.
            Event::Control(Msg::Failback {
                epoch,
                recvs_completed,
                wait,
            }) => self.peer_failing_back(
                PeerFailback {
                    epoch,
                    recvs_completed,
                    up_after: now + wait,
                },
                false,
                now,
                out,
            ),
            Event::FailbackDrained {
                progress,
                atomic_in_flight,
                sends_before_first_read,
            } => self.failback_drained(
                progress,
                atomic_in_flight,
                sends_before_first_read,
                now,
                out,
            ),
            Event::Control(Msg::FailbackReady { epoch }) => self.peer_failback_ready(epoch, out),
            // Repairing a side lost while the connection runs on.
            Event::ControlFailed { via: Path::Default } => {
                tracing::warn!("failover: the control QP on the default devices failed; no backup repair or failback until it is repaired");
                if self.failing_back() && !self.config.management {
                    self.default_channel.usable = false;
                    return self.fail(FailReason::BackupUnavailable, out);
                }
                self.side_lost(Side::DefaultChannel, now);
            }
            Event::Control(Msg::SideLost { epoch }) => self.peer_lost_side(epoch, now, out),
            Event::Control(Msg::SideRearm { epoch }) => {
                self.side_rearm_requested(epoch, false, now, out)
            }
            Event::Management(message) => self.management_message(message, now, out),
            Event::Control(Msg::SideRearmDone { epoch, ok }) => {
                self.side_rearm_done(epoch, ok, now, out)
            }
            Event::SideUp { epoch, ok } => self.side_up(epoch, ok, now, out),
            Event::LinkUp {
                path: Path::Default,
            } => {
                self.default_link_bounced = !self.default_link.up;
                self.default_link = Link {
                    up: true,
                    since: now,
                };
                self.abandon_unreported_rearm(now, out);
                self.failback_link_up(now, out);
                self.default_back_first(now, out);
            }
            Event::LinkUp { path: Path::Backup } => {
                self.backup_link = Link {
                    up: true,
                    since: now,
                };
                self.backup_deadline = None;
                self.resume_backup_handshakes(now);
            }
            // State 2: bring the default pair back into a new epoch and probe it.
            Event::Tick => self.tick(now, out),
            Event::Control(Msg::Rearm { epoch }) => self.rearm_requested(epoch, now, out),
            Event::DefaultQpUp { epoch, ok } => self.default_qp_up(epoch, ok, now, out),
            Event::Control(Msg::RearmDone { epoch, ok }) => self.rearm_done(epoch, ok, now, out),
            Event::Control(Msg::RearmReady { epoch }) => self.follower_ready(epoch, now, out),
            Event::ProbeCompleted { ok } => self.probe_completed(ok, now, out),
            Event::Control(Msg::PathUp { epoch }) => self.path_up(epoch, out),
            // States 2 -> 3 -> 4 -> 1: switch back behind a fence, one direction at a time.
            Event::SignaledPosted { progress } => self.fence_posted(progress),
            Event::FenceCompleted => self.fence_completed(now, out),
            Event::Control(Msg::SwitchBack {
                epoch,
                sends_before,
            }) => self.peer_switching_back(epoch, sends_before, now, out),
            Event::BackupDrained { progress } => self.backup_drained(progress, now, out),
            Event::Control(Msg::SwitchBackReady { epoch }) => self.peer_recvs_ready(epoch, out),
            Event::Control(Msg::Abort { reason }) => {
                tracing::warn!(peer_reason = %reason, "failover: peer aborted the connection");
                self.fail(FailReason::PeerAborted, out)
            }
        }
    }

    /// Where to post an application send WR now.
    pub fn send_route(&self) -> Route {
        if self.failed.is_some() {
            return Route::Closed;
        }
        match self.send {
            SendState::Default => Route::Default,
            SendState::FailingOver(_)
            | SendState::WaitDrained { .. }
            | SendState::FailingBack(_) => Route::DefaultWithheld,
            SendState::Fallback | SendState::WaitSignaled => Route::Backup,
        }
    }

    /// Where to post an application receive WR now.
    pub fn recv_route(&self) -> Route {
        if self.failed.is_some() {
            return Route::Closed;
        }
        match (self.recv, self.send) {
            (RecvState::Default, SendState::FailingOver(_)) | (RecvState::FailingBack, _) => {
                Route::DefaultWithheld
            }
            (RecvState::Default, _) => Route::Default,
            (RecvState::Fallback | RecvState::SwitchingBack { .. }, _) => Route::Backup,
        }
    }

    /// Whether the driver must report [`Event::SignaledPosted`] after posting a signaled WR.
    pub fn reports_signaled_posts(&self) -> bool {
        self.failed.is_none() && self.send == SendState::WaitSignaled
    }

    /// When the driver must next deliver [`Event::Tick`], if ever.
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        if self.failed.is_some() {
            return None;
        }
        let send = match self.send {
            SendState::FailingOver(round) => Some(
                self.default_answers_first_at(round)
                    .map_or(round.deadline, |due| due.min(round.deadline)),
            ),
            SendState::FailingBack(round) => Some(round.deadline),
            SendState::WaitDrained { notified, .. } => notified,
            _ => None,
        };
        let recv = match self.recv {
            RecvState::SwitchingBack { redrain_at, .. } => Some(redrain_at),
            _ => None,
        };
        let rearm = match self.default_qp {
            DefaultQp::Rearming { deadline, .. } => Some(deadline),
            DefaultQp::Dead { .. } => self.next_rearm().or(self.rearm_ready_at()),
            _ => None,
        };
        [
            send,
            recv,
            rearm,
            self.backup_deadline,
            self.failback_bring_up_at(),
            self.repair_due(Side::Backup),
            self.repair_due(Side::DefaultChannel),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Why the connection failed, if it did.
    pub fn failed(&self) -> Option<FailReason> {
        self.failed
    }

    /// The current (or last) epoch of this end's default QP.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// Where the send queue is.
    pub fn send_phase(&self) -> SendPhase {
        if self.failed.is_some() {
            return SendPhase::Failed;
        }
        match self.send {
            SendState::Default => SendPhase::Default,
            SendState::FailingOver(_) => SendPhase::FailingOver,
            SendState::Fallback => SendPhase::Fallback,
            SendState::WaitSignaled => SendPhase::WaitSignaled,
            SendState::WaitDrained { .. } => SendPhase::WaitDrained,
            SendState::FailingBack(_) => SendPhase::FailingBack,
        }
    }

    /// Where the receive queue is.
    pub fn recv_phase(&self) -> RecvPhase {
        if self.failed.is_some() {
            return RecvPhase::Failed;
        }
        match self.recv {
            RecvState::Default => RecvPhase::Default,
            RecvState::Fallback => RecvPhase::Fallback,
            RecvState::SwitchingBack { .. } | RecvState::FailingBack => RecvPhase::SwitchingBack,
        }
    }

    /// Where this end's default QP is.
    pub fn default_qp_phase(&self) -> DefaultQpPhase {
        match self.default_qp {
            DefaultQp::Live { confirmed: true } => DefaultQpPhase::Live,
            DefaultQp::Live { confirmed: false } => DefaultQpPhase::Unconfirmed,
            DefaultQp::Dead { .. } => DefaultQpPhase::Dead,
            DefaultQp::Rearming { .. } | DefaultQp::BringingUp | DefaultQp::FailingBack { .. } => {
                DefaultQpPhase::Rearming
            }
        }
    }

    // ---- State 1 -> 2: failing over -------------------------------------------------------

    fn default_failed(&mut self, status: WcStatus, now: Timestamp, out: &mut Actions) {
        match ErrorClass::of(status) {
            ErrorClass::Refusal => self.fail(FailReason::Refused { status }, out),
            // Probe failures arrive as ProbeCompleted; anything else on a dead QP is a
            // leftover flush.
            ErrorClass::Path | ErrorClass::Flush if self.default_is_live() => self.start_round(
                self.epoch,
                None,
                RoundTrigger::ErrorCompletion(status),
                now,
                out,
            ),
            ErrorClass::Path | ErrorClass::Flush => {}
        }
    }

    fn default_link_down(&mut self, now: Timestamp, out: &mut Actions) {
        self.default_link = Link {
            up: false,
            since: now,
        };
        match self.default_qp {
            DefaultQp::Live { .. } if self.config.link_watch => {
                self.start_round(self.epoch, None, RoundTrigger::LinkDown, now, out)
            }
            DefaultQp::Rearming { .. } => {
                out.push(Action::MoveQpToErr {
                    path: Path::Default,
                });
                self.rearm_failed(now);
            }
            DefaultQp::FailingBack { .. } => self.failback_link_down(now),
            _ => {}
        }
    }

    /// Both ends run one round per failed epoch; the peer's `Failover` message either starts
    /// ours or completes it.
    fn peer_failed_over(
        &mut self,
        epoch: Epoch,
        peer: PeerFailover,
        now: Timestamp,
        out: &mut Actions,
    ) {
        if self.failing_back() || self.last_failback.is_some_and(|last| epoch < last) {
            // The peer's round from before a failback, late on the backup channel: the
            // failback took its place (the peer follows our `Failback`).
            return;
        }
        self.backup_path_carried(now);
        match self.send {
            SendState::FailingOver(round) if round.epoch == epoch && round.peer.is_none() => {
                match round.step {
                    RoundStep::Draining | RoundStep::AwaitingBackupSide { .. } => {
                        self.send = SendState::FailingOver(Round {
                            peer: Some(peer),
                            ..round
                        })
                    }
                    RoundStep::AwaitingPeer {
                        drained,
                        sends_before_first_read,
                    } => self.finish_round(peer, drained, sends_before_first_read, now, out),
                }
            }
            SendState::FailingOver(_) => {
                self.protocol_violation("Failover during another round", out)
            }
            _ if self.last_round.is_some_and(|last| epoch <= last) => {
                self.protocol_violation("Failover for an epoch already failed over", out)
            }
            _ if epoch > self.epoch || (self.default_is_live() && epoch != self.epoch) => {
                self.protocol_violation("Failover for an epoch this end is not in", out)
            }
            _ => self.start_round(epoch, Some(peer), RoundTrigger::Peer, now, out),
        }
    }

    fn start_round(
        &mut self,
        epoch: Epoch,
        peer: Option<PeerFailover>,
        trigger: RoundTrigger,
        now: Timestamp,
        out: &mut Actions,
    ) {
        let tolerates = !self.config.no_path_wait().is_zero();
        // The backup side is lost (being repaired). With the management network the round
        // waits for whichever path answers first: the backup side's repair goes over the
        // management network, and then the round goes on over the repaired backup; the
        // default path coming back first turns it into a failback (`default_back_first`,
        // `default_answers_first_at`).
        let awaits_backup_side = !self.backup.usable && self.config.management && tolerates;
        if !self.backup.usable && !awaits_backup_side && self.may_fail_back() && tolerates {
            // Without it: wait for the default path, within the outage tolerance, by a
            // failback round (5e). A peer whose backup works follows on our `Failback`.
            tracing::warn!(%epoch, "failover: default path failed and the backup side is lost; waiting for the default path");
            return self.start_failback(None, true, now, out);
        }
        if awaits_backup_side {
            tracing::warn!(%epoch, "failover: default path failed and the backup side is lost; waiting for its repair or for the default path");
        }
        if (!self.backup.usable && !awaits_backup_side)
            || (!self.backup_link.up && self.config.no_path_wait().is_zero())
        {
            tracing::warn!(%epoch, "failover: default path failed and the backup path is down");
            return self.fail(FailReason::BackupUnavailable, out);
        }
        if !self.backup_link.up {
            // Drain the default now; the `Failover` message waits for the backup link, for the
            // outage tolerance (at least as long as a plain RC QP would retry).
            let deadline = now + self.config.no_path_wait();
            self.backup_deadline.get_or_insert(deadline);
            tracing::warn!(%epoch, wait = ?self.config.no_path_wait(), "failover: default path failed while the backup link is down; waiting for it");
        }
        self.observations.push(Observation::RoundStarted {
            epoch: self.epoch,
            trigger,
        });
        tracing::info!(%epoch, started_by_peer = peer.is_some(), "failover: default path failed, failing over");
        let deadline = now + self.config.handshake_wait();
        self.send = SendState::FailingOver(Round {
            epoch,
            step: RoundStep::Draining,
            peer,
            deadline,
            started: now,
        });
        if let RecvState::SwitchingBack { .. } = self.recv {
            // The receive WQEs have not moved yet: they stay on the backup QP.
            self.recv = RecvState::Fallback;
        }
        self.default_qp = DefaultQp::Dead {
            backoff_until: now + self.config.backoff_initial,
        };
        self.rearm_failures = 0;
        out.push(Action::MoveQpToErr {
            path: Path::Default,
        });
        out.push(Action::DrainDefault);
    }

    fn default_drained(
        &mut self,
        progress: Progress,
        first_error: Option<WcStatus>,
        atomic: bool,
        sends_before_first_read: Option<u64>,
        now: Timestamp,
        out: &mut Actions,
    ) {
        let SendState::FailingOver(round) = self.send else {
            return;
        };
        if round.step != RoundStep::Draining {
            return;
        }
        if let Some(status) = first_error.filter(|s| ErrorClass::of(*s) == ErrorClass::Refusal) {
            return self.fail(FailReason::Refused { status }, out);
        }
        if atomic {
            return self.fail(FailReason::AtomicInFlight, out);
        }
        if !self.backup.usable {
            // The backup side is being repaired (`start_round`): the `Failover` goes over it
            // once it is back (`backup_side_repaired`).
            self.send = SendState::FailingOver(Round {
                step: RoundStep::AwaitingBackupSide {
                    drained: progress,
                    sends_before_first_read,
                },
                ..round
            });
            return;
        }
        self.send_failover(round, progress, sends_before_first_read, now, out);
        if !self.backup_link.up {
            // The link is reported down, which is a hint, not the truth (a kernel reports a
            // netdev running up to seconds late): the message goes now, and the control QP
            // delivers it at its first retransmission once the path carries packets. The
            // handshake's wait starts at the link-up (or at the peer's answer, which shows
            // the path works); the outage tolerance bounds the wait till then.
            tracing::info!(epoch = %round.epoch, "failover: backup link reported down; the Failover message goes anyway");
            self.pause_backup_handshakes();
        }
    }

    /// A `Failover` came over the backup path: it carries packets, whatever the link watch
    /// said (as [`Failover::default_path_carried`] for the default path).
    fn backup_path_carried(&mut self, now: Timestamp) {
        if !self.backup_link.up {
            tracing::info!(
                "failover: a Failover message came over the backup path; its link is taken as up"
            );
            self.backup_link = Link {
                up: true,
                since: now,
            };
            self.backup_deadline = None;
            self.resume_backup_handshakes(now);
        }
    }

    /// Moves the receives and sends our `Failover` message, then finishes the round at once
    /// if the peer's came first, else waits for it.
    fn send_failover(
        &mut self,
        round: Round,
        progress: Progress,
        sends_before_first_read: Option<u64>,
        now: Timestamp,
        out: &mut Actions,
    ) {
        if self.recv == RecvState::Default {
            out.push(Action::CopyRecvsToBackup);
            self.recv = RecvState::Fallback;
        }
        out.push(Action::SendControl {
            via: Path::Backup,
            message: ControlMessage::Failover {
                epoch: round.epoch,
                recvs_completed: progress.recvs_completed,
                stale_recvs: self.stale_backup_recvs,
            },
        });
        // The peer burns them before anything else it sends on the backup QP.
        self.stale_backup_recvs = 0;
        self.last_round = Some(round.epoch);
        match round.peer {
            Some(peer) => self.finish_round(peer, progress, sends_before_first_read, now, out),
            None => {
                self.send = SendState::FailingOver(Round {
                    step: RoundStep::AwaitingPeer {
                        drained: progress,
                        sends_before_first_read,
                    },
                    deadline: round.deadline.min(now + self.config.handshake_wait()),
                    ..round
                })
            }
        }
    }

    fn finish_round(
        &mut self,
        peer: PeerFailover,
        drained: Progress,
        sends_before_first_read: Option<u64>,
        now: Timestamp,
        out: &mut Actions,
    ) {
        if peer.recvs_completed > drained.sends_posted {
            return self.protocol_violation("peer consumed more sends than were posted", out);
        }
        // The peer executed a send posted after a READ whose response never came: executed
        // again now, the READ would read what that send (and anything before it) changed.
        if sends_before_first_read.is_some_and(|before| peer.recvs_completed > before) {
            return self.fail(FailReason::ReadOvertaken, out);
        }
        tracing::info!(
            epoch = %self.epoch,
            skipped_as_delivered = peer.recvs_completed.saturating_sub(drained.sends_completed),
            stale_burned = peer.stale_recvs,
            "failover: traffic moved to the backup path"
        );
        out.push(Action::CopySendsToBackup {
            burn: peer.stale_recvs,
            skip_through: peer.recvs_completed,
        });
        out.push(Action::ResetDefaultQp);
        self.send = SendState::Fallback;
        // The peer's default QP left RTS before its `Failover` left (it drained first), and
        // possibly long after ours: the next incarnation comes up no sooner than the backoff
        // after the peer's too (6, "Old packets"). Counted from now, no sooner than the
        // message's arrival, so no clock is compared.
        if let DefaultQp::Dead { backoff_until } = self.default_qp {
            self.default_qp = DefaultQp::Dead {
                backoff_until: backoff_until.max(now + self.config.backoff_initial),
            };
        }
    }

    // ---- The backup path ------------------------------------------------------------------

    /// The backup path failed; `qp_in_error`: a backup or control QP is in ERR for good (a
    /// link that went down may come back, a QP in ERR cannot without the peer).
    fn backup_failed(
        &mut self,
        status: WcStatus,
        qp_in_error: bool,
        now: Timestamp,
        out: &mut Actions,
    ) {
        if self.failing_back() {
            // The round moved the backup QP to ERR itself: its flushes, a link that follows.
            return;
        }
        if qp_in_error {
            self.side_lost(Side::Backup, now);
        }
        match ErrorClass::of(status) {
            ErrorClass::Refusal => self.fail(FailReason::Refused { status }, out),
            // The backup QP cannot come back without the peer: move the traffic to the
            // default pair, at once.
            _ if self.needs_backup() && qp_in_error && self.may_fail_back() => {
                self.start_failback(None, false, now, out)
            }
            _ if self.needs_backup() && (qp_in_error || self.config.no_path_wait().is_zero()) => {
                self.fail(FailReason::BackupUnavailable, out)
            }
            // A link down is not yet a dead path: the backup QP keeps retrying for its RC
            // budget, as a plain RC QP would, and a link back by then loses nothing; past
            // the budget its QP fails, and the traffic moves to the default pair.
            _ if self.needs_backup() => {
                let deadline = now + self.config.no_path_wait();
                self.backup_deadline.get_or_insert(deadline);
                tracing::warn!(wait = ?self.config.no_path_wait(), "failover: backup link down while in use; failing if it is not back in time");
            }
            // Everything runs on the default pair: keep running, unprotected for now.
            _ => tracing::warn!(
                qp_in_error,
                "failover: backup path lost while idle; connection unprotected"
            ),
        }
    }

    /// The deadline of a handshake on the backup's channel (a failover round's `Failover`
    /// exchange, a switch-back's `SwitchBack` / `SwitchBackReady`) that waits for the peer.
    fn backup_handshake_deadline(&mut self) -> Option<&mut Timestamp> {
        match &mut self.send {
            SendState::FailingOver(Round {
                step: RoundStep::Draining | RoundStep::AwaitingPeer { .. },
                deadline,
                ..
            })
            | SendState::WaitDrained {
                notified: Some(deadline),
                ..
            } => Some(deadline),
            _ => None,
        }
    }

    /// The backup link went down while a handshake on its channel waits for the peer: the
    /// peer cannot answer over a path that carries nothing, so the handshake timeout stops and
    /// the outage tolerance (`backup_deadline`, armed by [`Failover::backup_failed`] since the
    /// handshake needs the backup) bounds the wait instead, so that a backup link down for
    /// less than the tolerance never ends the connection with `handshake-timeout`.
    fn pause_backup_handshakes(&mut self) {
        if let Some(deadline) = self.backup_handshake_deadline() {
            *deadline = Timestamp::MAX;
        }
    }

    /// The backup link is back: a handshake paused by [`Failover::pause_backup_handshakes`]
    /// gets its whole wait ([`Config::handshake_wait`]) from now (the peer's answer, posted
    /// while the link was down, arrives at its control QP's next retransmission).
    fn resume_backup_handshakes(&mut self, now: Timestamp) {
        let resumed = now + self.config.handshake_wait();
        if let Some(deadline) = self.backup_handshake_deadline() {
            *deadline = (*deadline).min(resumed);
        }
    }

    /// Whether some work or some protocol step depends on the backup path.
    fn needs_backup(&self) -> bool {
        self.send != SendState::Default
            || self.recv != RecvState::Default
            || !self.default_is_live()
    }

    /// A round whose `Failover` the peer has not answered, while the default link came back
    /// during it: when it fails back instead of waiting on (issue 29, "whichever path answers
    /// first"). The peer's side of the backup path can be down where this end cannot see it
    /// (its NIC, the switch port facing it), and then the round waits out the handshake
    /// timeout while the default path carries packets; seen in the chaos scenario, where the
    /// default path was up for 1.6 s of such a wait and the connection was lost. The peer is
    /// taken as unable to answer once the handshake timeout has passed since the round began
    /// (a live peer on a working backup answers within its drain, at most the drain deadline
    /// of a device that died without flushing, 100 ms by default): a failback commits to the
    /// default pair, and one started while the peer's answer was on its way would strand a
    /// peer whose default device is dead (the seeded simulation's schedules with one). A
    /// default link that never went down during the round (the round began with an RC error
    /// on a path reported up) is not taken as back.
    ///
    /// A round that waits for the backup side's repair (its `Failover` never left, so no
    /// peer moved anything on its strength) fails back as soon as the default link is
    /// reported back (`default_back_first`), and, when the round began with an RC error on a
    /// default link reported up all along (the failure was at the far end, where this end
    /// sees no link change), once the handshake timeout has passed without the repair: the
    /// failback's own messages then find out whether the default path carries packets, as a
    /// failback round did at once before the repair could go over the management network.
    fn default_answers_first_at(&self, round: Round) -> Option<Timestamp> {
        let waiting = matches!(
            round.step,
            RoundStep::Draining
                | RoundStep::AwaitingPeer { .. }
                | RoundStep::AwaitingBackupSide { .. }
        ) && round.peer.is_none();
        if !(waiting && self.default_link.up && self.may_fail_back()) {
            return None;
        }
        let back = self.default_link.since > round.started;
        let timeout = round.started + self.config.handshake_timeout;
        if self.round_awaits_backup_side() {
            return Some(if back {
                self.default_link.since
            } else {
                timeout
            });
        }
        // A round begun by an RC error within the outage tolerance of the default link's
        // coming back is the tail of that outage: the QP's retries ran out on the path the
        // flap cut (a netdev carries nothing until the kernel reports it running, up to a
        // second late), and neither end sees a link change during the round. Seen in a
        // ten-minute chaos run (READ, seed 2): the far switch port down 0.9 s, both ends'
        // rounds begun 1.2 s after it came back, waiting for each other over a backup path
        // down at one end, the connection lost with the default path up for 4 s.
        let tail_of_a_flap = self.default_link_bounced
            && self.default_link.since + self.config.no_path_wait() >= round.started;
        (back || tail_of_a_flap).then(|| timeout.max(self.default_link.since))
    }

    /// Whether `round` waits for the backup side's repair: the backup side lost and our
    /// `Failover` not sent (`start_round` with the management network). The backup rings
    /// hold nothing of the application's then (receives stay on the default RQ until the
    /// `Failover` goes), so the repair may reset them.
    pub(super) fn round_awaits_backup_side(&self) -> bool {
        let SendState::FailingOver(round) = self.send else {
            return false;
        };
        !self.backup.usable
            && self.last_round != Some(round.epoch)
            && self.recv == RecvState::Default
            && matches!(
                round.step,
                RoundStep::Draining | RoundStep::AwaitingBackupSide { .. }
            )
    }

    /// The backup side was repaired: a round waiting for it sends its `Failover` over it now.
    pub(super) fn backup_side_repaired(&mut self, now: Timestamp, out: &mut Actions) {
        if let SendState::FailingOver(
            round @ Round {
                step:
                    RoundStep::AwaitingBackupSide {
                        drained,
                        sends_before_first_read,
                    },
                ..
            },
        ) = self.send
        {
            tracing::info!(epoch = %round.epoch, "failover: the backup side is repaired; the round goes on over it");
            self.send_failover(round, drained, sends_before_first_read, now, out);
        }
    }

    // ---- State 2: rearm the default pair and probe it ------------------------------------

    fn tick(&mut self, now: Timestamp, out: &mut Actions) {
        if let Some(deadline) = self.backup_deadline {
            if self.backup_link.up {
                self.backup_deadline = None;
            } else if now >= deadline && self.needs_backup() {
                tracing::warn!(
                    waited = ?self.config.no_path_wait(),
                    "failover: the backup link did not come back within the outage tolerance"
                );
                if self.may_fail_back()
                    && self.default_link.up
                    && !matches!(self.send, SendState::FailingOver(_))
                {
                    return self.start_failback(None, false, now, out);
                }
                return self.fail(self.outage_reason(), out);
            } else if now >= deadline {
                self.backup_deadline = None;
            }
        }
        match self.send {
            SendState::FailingOver(round) if now >= round.deadline => {
                // A round that never sent its `Failover` waited for a path, not for the peer.
                let reason = match round.step {
                    RoundStep::AwaitingBackupSide { .. } => self.outage_reason(),
                    _ => FailReason::HandshakeTimeout,
                };
                return self.fail(reason, out);
            }
            SendState::FailingOver(round)
                if self
                    .default_answers_first_at(round)
                    .is_some_and(|due| now >= due) =>
            {
                tracing::warn!(epoch = %round.epoch, "failover: the peer has not answered over the backup path and the default link is back; failing back");
                return self.start_failback(None, true, now, out);
            }
            SendState::WaitDrained {
                notified: Some(deadline),
                ..
            } if now >= deadline => return self.fail(FailReason::HandshakeTimeout, out),
            SendState::FailingBack(round)
                if (!self.default_link.up || round.default_failed) && self.failback_due(now) =>
            {
                tracing::warn!(waited = ?self.config.no_path_wait(), "failover: failing back, and the default path did not come back within the outage tolerance");
                return self.fail(self.outage_reason(), out);
            }
            SendState::FailingBack(_) if self.failback_due(now) => {
                return self.fail(FailReason::HandshakeTimeout, out)
            }
            SendState::FailingBack(_) => self.maybe_bring_up_failback(now, out),
            _ => {}
        }
        if let RecvState::SwitchingBack {
            sends_before,
            redrain_at,
        } = self.recv
        {
            if now >= redrain_at {
                out.push(Action::DrainBackup);
                self.recv = RecvState::SwitchingBack {
                    sends_before,
                    redrain_at: now + self.config.redrain_interval,
                };
            }
        }
        match self.default_qp {
            DefaultQp::Rearming { deadline, .. } if now >= deadline => self.rearm_failed(now),
            DefaultQp::Dead { .. } if self.next_rearm().is_some_and(|due| now >= due) => {
                self.start_rearm(now, out)
            }
            DefaultQp::Dead { .. } if self.rearm_ready_at().is_some_and(|due| now >= due) => {
                self.owes_rearm_ready = false;
                out.push(Action::SendControl {
                    via: Path::Backup,
                    message: ControlMessage::RearmReady { epoch: self.epoch },
                });
            }
            _ => {}
        }
        if self.repair_due(Side::Backup).is_some_and(|due| now >= due) {
            self.repair_tick(Side::Backup, now, out);
        }
        // At most two actions; with less room left (a rearm attempt started by this tick),
        // the next tick, due at once, takes it.
        if self
            .repair_due(Side::DefaultChannel)
            .is_some_and(|due| now >= due)
            && out.len() + 2 <= MAX_ACTIONS_PER_EVENT
        {
            self.repair_tick(Side::DefaultChannel, now, out);
        }
    }

    /// Follower that refused a rearm attempt: when it may tell the leader to try again (its
    /// default link up for the hold-down, no failover round running), if it owes that at all.
    fn rearm_ready_at(&self) -> Option<Timestamp> {
        let allowed = self.owes_rearm_ready
            && matches!(self.default_qp, DefaultQp::Dead { .. })
            && self.paths_allow_rearm();
        allowed
            .then(|| self.default_link.tried_from(&self.config))
            .flatten()
    }

    /// What a rearm needs of this end, whichever role: the backup path (which carries the
    /// control messages) up and usable, and no failover round running. The default link's
    /// reports decide only when ([`Link::tried_from`]).
    fn paths_allow_rearm(&self) -> bool {
        self.backup_link.up
            && self.backup.usable
            && !matches!(
                self.send,
                SendState::FailingOver(_) | SendState::FailingBack(_)
            )
    }

    /// Leader: the follower refused `epoch` and is ready now; try again without waiting out
    /// the backoff (the hold-down at this end still applies).
    fn follower_ready(&mut self, epoch: Epoch, now: Timestamp, out: &mut Actions) {
        if self.config.role == Role::Follower {
            return self.protocol_violation("RearmReady to a follower", out);
        }
        if epoch != self.epoch {
            // About an attempt this end has since replaced: the newer one decides.
            return;
        }
        if let DefaultQp::Dead { backoff_until } = self.default_qp {
            self.rearm_failures = 0;
            self.default_qp = DefaultQp::Dead {
                backoff_until: backoff_until.min(now),
            };
        }
    }

    /// Leader, default QP dead: when the next rearm attempt may start (after the backoff and
    /// the hold-down), if one may start at all.
    fn next_rearm(&self) -> Option<Timestamp> {
        let DefaultQp::Dead { backoff_until } = self.default_qp else {
            return None;
        };
        let allowed = self.config.role == Role::Leader && self.paths_allow_rearm();
        let tried_from = self.default_link.tried_from(&self.config)?;
        allowed.then(|| backoff_until.max(tried_from))
    }

    /// The epoch this end's default QP enters next (a rearm attempt, or a failback's
    /// proposal): in the next PSN quarter after an epoch that sent packets, in the same quarter
    /// (four epochs on) after one that sent none. So PSN space is consumed per incarnation
    /// that came up, not per attempt: a quarter is entered again only after three later
    /// incarnations came up, however many attempts were refused in between.
    pub(super) fn next_epoch(&self) -> Epoch {
        let step = if self.epoch_sent_nothing { 4 } else { 1 };
        Epoch(self.epoch.0.saturating_add(step))
    }

    fn start_rearm(&mut self, now: Timestamp, out: &mut Actions) {
        // Our QP leaves the old epoch (RESET) before the follower hears of the new one.
        self.epoch = self.next_epoch();
        // The follower brings its QP up but sends nothing until this end's probe went through.
        self.epoch_sent_nothing = true;
        self.rearm_unreported = !self.default_link.up;
        tracing::debug!(epoch = %self.epoch, link_reported_up = self.default_link.up, "failover: rearm attempt");
        out.push(Action::ResetDefaultQp);
        out.push(Action::SendControl {
            via: Path::Backup,
            message: ControlMessage::Rearm { epoch: self.epoch },
        });
        self.default_qp = DefaultQp::Rearming {
            step: RearmStep::AwaitingFollower,
            deadline: now + self.config.handshake_timeout,
        };
    }

    /// The default link is reported up during an attempt started while it was reported
    /// down: the attempt gives way to one after the hold-down (a recovered NIC may refuse RTR
    /// for a while, and a link that just came up may flap), due at once after it.
    fn abandon_unreported_rearm(&mut self, now: Timestamp, out: &mut Actions) {
        if self.rearm_unreported && matches!(self.default_qp, DefaultQp::Rearming { .. }) {
            out.push(Action::MoveQpToErr {
                path: Path::Default,
            });
            self.rearm_failures = 0;
            self.default_qp = DefaultQp::Dead { backoff_until: now };
        }
        self.rearm_unreported = false;
    }

    fn rearm_failed(&mut self, now: Timestamp) {
        self.rearm_failures = self.rearm_failures.saturating_add(1);
        let backoff_until = now + self.config.backoff(self.rearm_failures);
        tracing::debug!(epoch = %self.epoch, failures = self.rearm_failures, "failover: rearm attempt failed");
        self.default_qp = DefaultQp::Dead { backoff_until };
    }

    /// Follower: the leader's QP has left every epoch before `epoch`.
    fn rearm_requested(&mut self, epoch: Epoch, now: Timestamp, out: &mut Actions) {
        if self.failing_back() || self.last_failback.is_some_and(|last| epoch <= last) {
            // An attempt of the leader's from before the failback, late on the backup
            // channel: the failback's epoch is above it, and our QP never enters it.
            return;
        }
        if self.config.role == Role::Leader || epoch <= self.epoch {
            return self.protocol_violation("Rearm to a leader or for an old epoch", out);
        }
        self.epoch = epoch;
        self.epoch_sent_nothing = false;
        self.owes_rearm_ready = false;
        let ready = self
            .default_link
            .tried_from(&self.config)
            .is_some_and(|from| now >= from)
            && !matches!(self.send, SendState::FailingOver(_));
        match self.default_qp {
            DefaultQp::Live { confirmed: true }
            | DefaultQp::Rearming { .. }
            | DefaultQp::FailingBack { .. } => {
                self.protocol_violation("Rearm while the default pair is confirmed", out)
            }
            _ if !ready => {
                // Not yet: the leader hears when (a failed bring-up, below, waits out the
                // leader's backoff instead).
                self.refuse_epoch(epoch, now, out);
                self.owes_rearm_ready = true;
            }
            DefaultQp::Live { confirmed: false }
            | DefaultQp::Dead { .. }
            | DefaultQp::BringingUp => {
                // Leave the previous epoch before entering this one.
                if let DefaultQp::Live { .. } = self.default_qp {
                    out.push(Action::MoveQpToErr {
                        path: Path::Default,
                    });
                }
                out.push(Action::ResetDefaultQp);
                out.push(Action::BringUpDefaultQp { epoch });
                self.default_qp = DefaultQp::BringingUp;
            }
        }
    }

    /// Follower: cannot take part in `epoch` now. Its QP leaves whatever epoch it was in.
    fn refuse_epoch(&mut self, epoch: Epoch, now: Timestamp, out: &mut Actions) {
        if matches!(
            self.default_qp,
            DefaultQp::Live { .. } | DefaultQp::BringingUp
        ) {
            out.push(Action::MoveQpToErr {
                path: Path::Default,
            });
        }
        self.default_qp = DefaultQp::Dead { backoff_until: now };
        out.push(Action::SendControl {
            via: Path::Backup,
            message: ControlMessage::RearmDone { epoch, ok: false },
        });
    }

    fn default_qp_up(&mut self, epoch: Epoch, ok: bool, now: Timestamp, out: &mut Actions) {
        if epoch != self.epoch {
            return;
        }
        let up = ok && self.default_link.may_carry(now, &self.config);
        match self.default_qp {
            DefaultQp::BringingUp if up => {
                self.default_qp = DefaultQp::Live { confirmed: false };
                out.push(Action::SendControl {
                    via: Path::Backup,
                    message: ControlMessage::RearmDone { epoch, ok: true },
                });
            }
            DefaultQp::BringingUp => self.refuse_epoch(epoch, now, out),
            DefaultQp::Rearming {
                step: RearmStep::BringingUp,
                deadline,
            } if up => {
                // The follower's QP is in RTS in this epoch: a probe can only be answered by it.
                out.push(Action::PostProbe);
                self.default_qp = DefaultQp::Rearming {
                    step: RearmStep::Probing,
                    deadline,
                };
            }
            DefaultQp::Rearming {
                step: RearmStep::BringingUp,
                ..
            } => {
                out.push(Action::MoveQpToErr {
                    path: Path::Default,
                });
                self.rearm_failed(now);
            }
            DefaultQp::FailingBack { .. } => self.failback_up(epoch, up, out),
            _ => {}
        }
    }

    /// Leader: the follower's QP is in RTS in `epoch` (it has left every earlier epoch).
    fn rearm_done(&mut self, epoch: Epoch, ok: bool, now: Timestamp, out: &mut Actions) {
        if self.config.role == Role::Follower {
            return self.protocol_violation("RearmDone to a follower", out);
        }
        match self.default_qp {
            DefaultQp::Rearming {
                step: RearmStep::AwaitingFollower,
                deadline,
            } if epoch == self.epoch => {
                if ok {
                    self.epoch_sent_nothing = false;
                    out.push(Action::BringUpDefaultQp { epoch });
                    self.default_qp = DefaultQp::Rearming {
                        step: RearmStep::BringingUp,
                        deadline,
                    };
                } else {
                    self.rearm_failed(now);
                }
            }
            // An abandoned attempt.
            _ => {}
        }
    }

    fn probe_completed(&mut self, ok: bool, now: Timestamp, out: &mut Actions) {
        let DefaultQp::Rearming {
            step: RearmStep::Probing,
            ..
        } = self.default_qp
        else {
            return;
        };
        if !ok {
            return self.rearm_failed(now);
        }
        tracing::info!(epoch = %self.epoch, "failover: default path is back");
        self.default_qp = DefaultQp::Live { confirmed: true };
        self.rearm_failures = 0;
        out.push(Action::SendControl {
            via: Path::Backup,
            message: ControlMessage::PathUp { epoch: self.epoch },
        });
        self.default_path_confirmed();
    }

    /// Follower: the leader's probe went through in `epoch`.
    fn path_up(&mut self, epoch: Epoch, out: &mut Actions) {
        if self.config.role == Role::Leader {
            return self.protocol_violation("PathUp to a leader", out);
        }
        if self.default_qp == (DefaultQp::Live { confirmed: false }) && epoch == self.epoch {
            self.default_qp = DefaultQp::Live { confirmed: true };
            self.default_path_confirmed();
        }
    }

    /// State 2 -> 3.
    fn default_path_confirmed(&mut self) {
        if self.send == SendState::Fallback {
            self.send = SendState::WaitSignaled;
            self.observations
                .push(Observation::SwitchBackStarted { epoch: self.epoch });
        }
    }

    // ---- States 3 -> 4 -> 1: switch back behind a fence ----------------------------------

    /// State 3 -> 4: the application's signaled WR on the backup QP is the fence.
    fn fence_posted(&mut self, progress: Progress) {
        if self.send == SendState::WaitSignaled {
            self.send = SendState::WaitDrained {
                sends_before: progress.sends_posted,
                notified: None,
            };
        }
    }

    /// Everything posted on the backup QP has executed at the peer: tell it how many
    /// two-sided sends to expect there, and wait for its receive queue to follow.
    fn fence_completed(&mut self, now: Timestamp, out: &mut Actions) {
        if let SendState::WaitDrained {
            sends_before,
            notified: None,
        } = self.send
        {
            out.push(Action::SendControl {
                via: Path::Backup,
                message: ControlMessage::SwitchBack {
                    epoch: self.epoch,
                    sends_before,
                },
            });
            let deadline = now + self.config.handshake_wait();
            self.send = SendState::WaitDrained {
                sends_before,
                notified: Some(deadline),
            };
        }
    }

    /// Receiver: the peer's sends are coming back to the default QP after `sends_before`.
    fn peer_switching_back(
        &mut self,
        epoch: Epoch,
        sends_before: u64,
        now: Timestamp,
        out: &mut Actions,
    ) {
        let current = epoch == self.epoch
            && self.default_qp == (DefaultQp::Live { confirmed: true })
            && !matches!(self.send, SendState::FailingOver(_));
        match self.recv {
            // The default pair failed again since: the peer's round moves its withheld sends.
            _ if !current => {}
            RecvState::Fallback => {
                out.push(Action::DrainBackup);
                self.recv = RecvState::SwitchingBack {
                    sends_before,
                    redrain_at: now + self.config.redrain_interval,
                };
            }
            RecvState::Default | RecvState::SwitchingBack { .. } | RecvState::FailingBack => {
                self.protocol_violation("SwitchBack while receives are not on the backup QP", out)
            }
        }
    }

    fn backup_drained(&mut self, progress: Progress, now: Timestamp, out: &mut Actions) {
        let RecvState::SwitchingBack { sends_before, .. } = self.recv else {
            return;
        };
        match progress.recvs_completed.cmp(&sends_before) {
            core::cmp::Ordering::Equal => {
                out.push(Action::MoveRecvsToDefault {
                    consumed_through: sends_before,
                });
                out.push(Action::SendControl {
                    via: Path::Backup,
                    message: ControlMessage::SwitchBackReady { epoch: self.epoch },
                });
                self.stale_backup_recvs += progress.recvs_posted.saturating_sub(sends_before);
                self.recv = RecvState::Default;
                tracing::info!(epoch = %self.epoch, stale = self.stale_backup_recvs, "failover: receives back on the default path");
            }
            // Completions not visible yet: poll again shortly.
            core::cmp::Ordering::Less => {
                self.recv = RecvState::SwitchingBack {
                    sends_before,
                    redrain_at: now + self.config.redrain_interval,
                }
            }
            core::cmp::Ordering::Greater => {
                self.protocol_violation("more receives completed than the peer sent", out)
            }
        }
    }

    /// State 4 -> 1: the peer's receive WQEs are on its default QP; ring what was withheld.
    fn peer_recvs_ready(&mut self, epoch: Epoch, out: &mut Actions) {
        if let SendState::WaitDrained {
            notified: Some(_), ..
        } = self.send
        {
            if epoch == self.epoch && self.default_is_live() {
                out.push(Action::ReleaseDefaultDoorbell);
                self.send = SendState::Default;
                tracing::info!(epoch = %self.epoch, "failover: sends back on the default path");
            }
        }
    }

    // ---- Giving up ------------------------------------------------------------------------

    fn protocol_violation(&mut self, what: &'static str, out: &mut Actions) {
        tracing::error!(what, epoch = %self.epoch, "failover: protocol violation");
        self.fail(FailReason::ProtocolViolation, out)
    }

    fn fail(&mut self, reason: FailReason, out: &mut Actions) {
        tracing::error!(%reason, epoch = %self.epoch, "failover: connection failed");
        self.failed = Some(reason);
        out.push(Action::SurfaceError {
            status: reason.status(),
            reason,
        });
        let peer_may_hear = !matches!(
            reason,
            FailReason::PeerAborted | FailReason::BackupUnavailable | FailReason::OutageTolerance
        );
        if self.failing_back() || !self.backup.usable && self.last_failback.is_some() {
            // The backup channel is gone; the default devices' one may still carry it.
            if reason != FailReason::PeerAborted && self.default_channel.usable {
                out.push(Action::SendControl {
                    via: Path::Default,
                    message: ControlMessage::Abort { reason },
                });
            }
        } else if peer_may_hear {
            out.push(Action::SendControl {
                via: Path::Backup,
                message: ControlMessage::Abort { reason },
            });
        }
        // The management network (5f) reaches the peer whatever the RDMA devices do: the
        // Abort goes there too, so a peer whose in-band channels cannot carry it (both
        // devices of this host lost, or no path up) ends at once instead of waiting out its
        // handshake. A copy that arrives after the in-band one finds the peer failed already,
        // and a failed end ignores every event.
        if self.config.management && reason != FailReason::PeerAborted {
            out.push(Action::SendManagement {
                message: ControlMessage::Abort { reason },
            });
        }
    }

    /// Why the connection fails when no path answered for the whole wait: the outage
    /// tolerance, or (a tolerance no longer than it) the backup's RC retry budget.
    fn outage_reason(&self) -> FailReason {
        if self.config.outage_tolerance > self.config.backup_wait {
            FailReason::OutageTolerance
        } else {
            FailReason::BackupUnavailable
        }
    }

    fn default_is_live(&self) -> bool {
        matches!(self.default_qp, DefaultQp::Live { .. })
    }

    /// A control message that came over the management network (5f): only what the machine
    /// sends there (a failback's messages, the default devices' channel's repair, an
    /// `Abort`) is taken.
    fn management_message(&mut self, message: ControlMessage, now: Timestamp, out: &mut Actions) {
        use ControlMessage as Msg;
        match message {
            _ if !self.config.management => self.protocol_violation(
                "a message over the management network, which this end does not use",
                out,
            ),
            Msg::Failback {
                epoch,
                recvs_completed,
                wait,
            } => self.peer_failing_back(
                PeerFailback {
                    epoch,
                    recvs_completed,
                    up_after: now + wait,
                },
                true,
                now,
                out,
            ),
            Msg::FailbackReady { epoch } => self.peer_failback_ready(epoch, out),
            Msg::SideLost { epoch } => self.peer_lost_side(epoch, now, out),
            Msg::SideRearm { epoch } => self.side_rearm_requested(epoch, true, now, out),
            Msg::SideRearmDone { epoch, ok } => self.side_rearm_done(epoch, ok, now, out),
            Msg::Abort { reason } => {
                tracing::warn!(peer_reason = %reason, "failover: peer aborted the connection (over the management network)");
                self.fail(FailReason::PeerAborted, out)
            }
            _ => self.protocol_violation("a message the management network does not carry", out),
        }
    }

    /// The link of `path`'s device, as last reported.
    fn link(&self, path: Path) -> Link {
        match path {
            Path::Default => self.default_link,
            Path::Backup => self.backup_link,
        }
    }
}
