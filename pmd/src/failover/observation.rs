//! What the failover machine observed while it handled events, for the driver's log and
//! statistics: the machine says what happened instead of the driver comparing its phases
//! before and after each call (as quinn-proto's connection hands out its events with `poll`).

use super::config::Epoch;
use super::status::WcStatus;
use super::vocab::SideEpoch;

/// Something the machine observed; the driver takes them with
/// [`Failover::poll_observation`](super::Failover::poll_observation), oldest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Observation {
    /// A failover round started (state 1 -> 2 begins): the default pair failed.
    RoundStarted {
        /// The epoch this end was in when the round started.
        epoch: Epoch,
        /// What started it.
        trigger: RoundTrigger,
    },
    /// The default path is confirmed again and the send queue starts switching back (state
    /// 2 -> 3): sends stay on the backup QP until the fence.
    SwitchBackStarted {
        /// The epoch the default pair came back in.
        epoch: Epoch,
    },
    /// A side lost while the connection ran on was brought back (reset and reconnected with
    /// the peer): the backup side (the connection is protected again) or the default
    /// devices' channel (backup repairs and failbacks are possible again).
    SideRepaired {
        /// The side and the incarnation it came back in.
        epoch: SideEpoch,
    },
    /// The backup failed while traffic depended on it and the default path is up: a failback
    /// round started (`docs/failover.md` 5e).
    FailbackStarted {
        /// The epoch this end was in when the round started.
        epoch: Epoch,
    },
    /// Traffic is back on the default pair after a failback, in `epoch`.
    FailedBack {
        /// The epoch the default pair came back in.
        epoch: Epoch,
    },
}

/// What started a failover round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RoundTrigger {
    /// An error completion of the default QP with this status (a flush counts: the QP was
    /// moved to ERR by something the driver did not report first).
    ErrorCompletion(WcStatus),
    /// The default device's link went down.
    LinkDown,
    /// The peer's `Failover` message came first.
    Peer,
}

/// The machine's queue of observations not yet taken. Inline: a call of
/// [`Failover::handle`](super::Failover::handle) observes at most one of each kind, and the
/// driver takes them after every call, so nothing allocates.
pub(super) type Observations = smallvec::SmallVec<[Observation; 4]>;
