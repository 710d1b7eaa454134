//! What the failover machine asks the driver to do, and where application work goes.

use super::config::Epoch;
use super::message::ControlMessage;
use super::status::WcStatus;
use super::vocab::{FailReason, Path, Side, SideEpoch};

/// One step for the driver. The driver performs actions in the order given and reports their
/// results as events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Move `path`'s QP to ERR now. Its flush completions belong to the failover, not to the
    /// application.
    MoveQpToErr {
        /// Which QP.
        path: Path,
    },
    /// Poll the default CQ until both queues of the (errored) default QP are flushed:
    /// successful completions go to the WC buffer in order and into the counters, flushes of
    /// outstanding WQEs are swallowed (the WQEs stay in the rings to be copied). Scan the
    /// rung, uncompleted send WQEs for atomics. Report [`Event::DefaultDrained`].
    ///
    /// [`Event::DefaultDrained`]: super::Event::DefaultDrained
    DrainDefault,
    /// Copy the default RQ's outstanding receive WQEs, in order, to the backup RQ behind
    /// whatever is posted there, rewriting lkeys; update the backup receive doorbell record.
    CopyRecvsToBackup,
    /// Move the default SQ's outstanding WQEs (rung or withheld) to the backup SQ and ring the
    /// backup doorbell:
    /// 1. every WQE up to and including the `skip_through`-th two-sided send of the connection
    ///    was executed by the peer: complete it to the application (success for signaled
    ///    ones), do not send it again;
    /// 2. post `burn` zero-length SENDs first, to consume the peer's stale receive WQEs;
    /// 3. copy the rest in order, rewriting lkeys, rkeys, WQE index and QPN.
    CopySendsToBackup {
        /// Zero-length SENDs to post before the copies.
        burn: u64,
        /// Two-sided sends the peer has consumed, counted since the connection began.
        skip_through: u64,
    },
    /// Take the default QP to RESET (its rings go back to index 0).
    ResetDefaultQp,
    /// Take the default QP from RESET through INIT and RTR to RTS with the saved attributes
    /// and the PSNs of `epoch` ([`Epoch::start_psn`]); report [`Event::DefaultQpUp`].
    ///
    /// [`Event::DefaultQpUp`]: super::Event::DefaultQpUp
    BringUpDefaultQp {
        /// The incarnation to bring up.
        epoch: Epoch,
    },
    /// Post a zero-length, signaled RDMA WRITE on the default QP and ring; report
    /// [`Event::ProbeCompleted`](super::Event::ProbeCompleted).
    PostProbe,
    /// Send a control message to the peer on the control QP on `via`'s devices: the backup
    /// devices' channel carries the protocol; the default devices' channel carries what the
    /// backup side cannot carry itself (its repair, a failback, an abort once it is gone).
    SendControl {
        /// Which channel.
        via: Path,
        /// The message.
        message: ControlMessage,
    },
    /// Send a control message to the peer over the management network (`docs/failover.md`
    /// 5f), which depends on neither RDMA device: only asked for when
    /// [`Config::management`](super::Config::management) is set, for a failback's messages
    /// and for the default devices' channel's repair while the backup side is lost too.
    SendManagement {
        /// The message.
        message: ControlMessage,
    },
    /// Take `side` to RESET, so that it leaves its epoch: the backup side (the backup data QP
    /// and the control QP on the backup devices; the backup rings go back to index 0, stale
    /// receive WQEs with them) or the control QP on the default devices (message numbers back
    /// to 0 both ways); then its control QP to INIT with its receives posted.
    ResetSide {
        /// Which side.
        side: Side,
    },
    /// Bring `epoch`'s side up in it, with the PSNs of that incarnation ([`Epoch::start_psn`]
    /// of the saved starting PSNs): the backup data QP from RESET through INIT and RTR to RTS
    /// and the backup control QP from INIT to RTS, or the default devices' control QP from
    /// INIT to RTS; report [`Event::SideUp`].
    ///
    /// [`Event::SideUp`]: super::Event::SideUp
    BringUpSide {
        /// The side and the incarnation to bring up.
        epoch: SideEpoch,
    },
    /// Poll the backup CQ: successful completions to the WC buffer in order and into the
    /// counters; report [`Event::BackupDrained`](super::Event::BackupDrained).
    DrainBackup,
    /// Copy the backup RQ's receive WQEs after the `consumed_through`-th application receive,
    /// in order, to the default RQ and update its doorbell record. The originals stay posted
    /// on the backup RQ as stale WQEs: the peer consumes them with zero-length SENDs at the
    /// next failover, and their completions are swallowed.
    MoveRecvsToDefault {
        /// Application receives completed so far.
        consumed_through: u64,
    },
    /// Failback (`docs/failover.md` 5e): poll both CQs until both QPs (moved to ERR just
    /// before) have completed or flushed every WQE and receive they were told about (or the
    /// drain deadline passed, for a device that died without flushing): successful
    /// completions to the WC buffer in order and into the counters, flushes swallowed (the
    /// WQEs stay in the rings to be moved). Scan the rung, uncompleted send WQEs of both SQs
    /// for atomics and READs. Report [`Event::FailbackDrained`](super::Event::FailbackDrained).
    DrainForFailback,
    /// Failback: take the default QP to RESET and up to RTS in `epoch` (as
    /// [`Action::BringUpDefaultQp`]), then re-post on it, in order, what was outstanding
    /// before the reset: the backup RQ's application receives, then the default RQ's (lkeys
    /// mapped back to the default device; published); the backup SQ's application WQEs, then
    /// the default SQ's (rung or withheld), keys mapped back, the ones up to and including
    /// the `skip_through`-th two-sided send completed to the application and not sent again,
    /// the rest written with the doorbell withheld. Report
    /// [`Event::DefaultQpUp`](super::Event::DefaultQpUp).
    Failback {
        /// The incarnation both ends bring their default QP up in.
        epoch: Epoch,
        /// Two-sided sends the peer has consumed, counted since the connection began.
        skip_through: u64,
    },
    /// Ring the default SQ doorbell for every WQE withheld there.
    ReleaseDefaultDoorbell,
    /// Fail the resilient QP, as a plain QP in ERR fails: outstanding WRs (on either QP, rung
    /// or withheld) complete with `status` for the first and `WR_FLUSH_ERR` for the rest,
    /// receives are flushed, later posts fail.
    SurfaceError {
        /// The status of the first error completion the application sees.
        status: WcStatus,
        /// Why failover could not hide the failure (for logs and statistics).
        reason: FailReason,
    },
}

/// Where the driver puts a WR the application posts now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// Post on the default QP and ring (update the receive doorbell record).
    Default,
    /// Write into the default QP's ring without ringing: the WQE waits there until the machine
    /// releases the doorbell or copies it to the backup QP.
    DefaultWithheld,
    /// Post on the backup QP and ring.
    Backup,
    /// The resilient QP has failed: refuse the post.
    Closed,
}
