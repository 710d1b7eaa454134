//! What the driver tells the failover machine.

use super::config::Epoch;
use super::message::ControlMessage;
use super::status::WcStatus;
use super::vocab::{Path, SideEpoch};

/// The driver's counters of two-sided application work, counted since the connection began.
///
/// Two-sided sends are SEND, SEND_WITH_IMM and WRITE_WITH_IMM: the WRs that consume a receive
/// WQE at the peer. Receives are the application's receive WRs. The failover layer's own
/// messages (control WRITE_WITH_IMMs on their own QP, zero-length SENDs that consume stale
/// receive WQEs, probes) are never counted. The driver keeps these on the datapath (an
/// increment per completion) and hands a snapshot in with the events that need one; the
/// machine is not called per WQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Progress {
    /// Two-sided application sends posted.
    pub sends_posted: u64,
    /// Of those, the ones known to have completed (success seen, directly or through a later
    /// signaled completion).
    pub sends_completed: u64,
    /// Application receives posted.
    pub recvs_posted: u64,
    /// Application receives completed successfully, on either QP.
    pub recvs_completed: u64,
}

/// Something the driver observed, or the result of an action it performed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    /// The first error completion polled from `path`'s QP (send or receive queue) since that
    /// QP was last brought up. Flushes that follow it are the driver's to swallow.
    ErrorCompletion {
        /// Which QP.
        path: Path,
        /// Its status.
        status: WcStatus,
    },
    /// The link of `path`'s device went down (netlink, or a port-error async event).
    LinkDown {
        /// Which device.
        path: Path,
    },
    /// The link of `path`'s device came up.
    LinkUp {
        /// Which device.
        path: Path,
    },
    /// [`Action::DrainDefault`](super::Action::DrainDefault) is done: every successful
    /// completion of the default QP is in the WC buffer and counted in `progress`.
    DefaultDrained {
        /// The counters after the drain.
        progress: Progress,
        /// The first non-flush error completion of the default QP, if any.
        first_error: Option<WcStatus>,
        /// An atomic WR was rung on the default QP and has not completed: it may or may not
        /// have executed, so it cannot be retransmitted.
        atomic_in_flight: bool,
        /// The two-sided sends posted before the oldest READ that was rung on the default QP
        /// and has not completed, if there is one. A READ may be executed again only if the
        /// peer consumed no send posted after it: executed again, it would read what later
        /// requests (and the peer, after that send) changed.
        sends_before_first_read: Option<u64>,
    },
    /// A control message arrived from the peer on one of the control QPs.
    Control(ControlMessage),
    /// A control message arrived from the peer over the management network
    /// ([`Action::SendManagement`](super::Action::SendManagement)): authenticated by the
    /// driver, and, unlike one on a control QP, no sign that an RDMA path carries packets.
    Management(ControlMessage),
    /// The control QP on `via`'s devices failed (a send completed in error, or its receives
    /// flushed). On the backup devices the backup path is gone with it; on the default
    /// devices, until it is repaired (over the backup devices' channel, `docs/failover.md`
    /// 5d) no backup repair and no failback is possible.
    ControlFailed {
        /// Which channel.
        via: Path,
    },
    /// [`Action::BringUpSide`](super::Action::BringUpSide) is done.
    SideUp {
        /// The side and the incarnation it was brought up in.
        epoch: SideEpoch,
        /// Whether it reached RTS.
        ok: bool,
    },
    /// [`Action::BringUpDefaultQp`](super::Action::BringUpDefaultQp) is done.
    DefaultQpUp {
        /// The epoch the QP was brought up in.
        epoch: Epoch,
        /// Whether it reached RTS.
        ok: bool,
    },
    /// The probe posted by [`Action::PostProbe`](super::Action::PostProbe) completed.
    ProbeCompleted {
        /// Success, or any error (retry exhaustion, flush).
        ok: bool,
    },
    /// The application posted a signaled WR on the backup QP (reported only while
    /// [`Failover::reports_signaled_posts`](super::Failover::reports_signaled_posts)).
    SignaledPosted {
        /// The counters including that WR.
        progress: Progress,
    },
    /// The signaled WR reported by [`Event::SignaledPosted`] completed successfully.
    FenceCompleted,
    /// [`Action::DrainBackup`](super::Action::DrainBackup) is done.
    BackupDrained {
        /// The counters after the drain.
        progress: Progress,
    },
    /// [`Action::DrainForFailback`](super::Action::DrainForFailback) is done: both QPs are
    /// in ERR and flushed, every successful completion is in the WC buffer and counted.
    FailbackDrained {
        /// The counters after the drain.
        progress: Progress,
        /// An atomic WR was rung (on either QP) and has not completed.
        atomic_in_flight: bool,
        /// The two-sided sends posted before the oldest READ that was rung (on either QP) and
        /// has not completed, if there is one (as [`Event::DefaultDrained`]).
        sends_before_first_read: Option<u64>,
    },
    /// Time passed; due at [`Failover::poll_timeout`](super::Failover::poll_timeout).
    Tick,
}
