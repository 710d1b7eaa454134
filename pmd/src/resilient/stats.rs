//! What a resilient QP counts and logs: per-QP statistics and the failover event log that the
//! apps write into their JSON (`docs/apps-json.md`, `failover.events[]`).

use std::time::Duration;

use crate::failover::{FailReason, WcStatus};

/// Counters of one resilient QP, since it was created.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FailoverStats {
    /// Failover rounds completed (traffic moved to the backup QP).
    pub failovers: u64,
    /// Send switch-backs completed (traffic back on the default QP).
    pub switch_backs: u64,
    /// Backup sides lost while the connection ran on the default path and brought back
    /// (backup data QP and backup control QP reset and reconnected with the peer).
    pub backup_rearms: u64,
    /// The control channel on the default devices lost (its QP in ERR) and brought back
    /// over the backup devices' channel (`docs/failover.md` 5d).
    pub default_control_repairs: u64,
    /// Failbacks completed: the backup failed while traffic depended on it and the traffic
    /// moved back to the default QP in a new epoch (`docs/failover.md` 5e).
    pub failbacks: u64,
    /// Failures failover refused to hide (protection errors, an atomic in flight).
    pub refusals: u64,
    /// Connection failures for any other reason (both paths down, a peer that stopped
    /// answering).
    pub errors: u64,
    /// WQEs copied between QPs: application sends moved to the backup SQ plus receives moved
    /// in either direction.
    pub wqes_copied: u64,
    /// Application sends moved to the backup SQ, to be sent (again) there.
    pub wqes_retransmitted: u64,
    /// Application sends completed without being sent again because the peer had already
    /// consumed them (or a later two-sided send).
    pub wqes_skipped: u64,
    /// The last failover's fallback latency: the first error completion polled (or the
    /// link-down handled, or the peer's message) to the first successful completion on the
    /// backup QP. On the clock the QP runs on (virtual time in simulations).
    pub last_fallback_latency: Option<Duration>,
    /// Events that did not fit in the log (it keeps the first [`EVENT_LOG_CAPACITY`]).
    pub events_dropped: u64,
    /// Control messages the control QP dropped: out of sequence, not one whole slot, or not
    /// a write into the ring (a buggy peer, or forged packets).
    pub control_messages_dropped: u64,
}

/// Events a QP keeps; later ones are counted in [`FailoverStats::events_dropped`].
pub const EVENT_LOG_CAPACITY: usize = 4096;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// Traffic moved from the default QP to the backup QP.
    Failover,
    /// Sends moved back to the default QP.
    SwitchBack,
    /// Failover refused to hide a failure (a protection error, an atomic in flight): the
    /// error went to the application.
    Refused,
    /// The connection failed for another reason (both paths down, the peer stopped
    /// answering or aborted).
    Error,
    /// The backup failed while traffic depended on it, and the traffic moved back to the
    /// default QP in a new epoch (a failback round, `docs/failover.md` 5e).
    Failback,
}

impl EventKind {
    /// The name the apps' JSON uses.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Failover => "failover",
            EventKind::SwitchBack => "switch-back",
            EventKind::Refused => "refused",
            EventKind::Error => "error",
            EventKind::Failback => "failback",
        }
    }
}

/// Why it happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cause {
    /// The default device's link went down (link watch).
    LinkDown,
    /// The default device raised its device-fatal event (it died without flushing).
    DeviceFatal,
    /// A completion with `RETRY_EXC_ERR`: the transport gave up.
    RetryExceeded,
    /// A completion with `RESP_TIMEOUT_ERR`.
    ResponseTimeout,
    /// A completion with `FATAL_ERR`.
    Fatal,
    /// A flush on the default QP with no other cause seen first.
    Flushed,
    /// The peer started the failover (its `Failover` message came first).
    PeerFailover,
    /// The default path came back and was confirmed by a probe.
    PathRecovered,
    /// The backup failed with traffic on it (here, or at the peer, whose `Failback` came
    /// first).
    BackupFailed,
    /// A protection or request error; never failed over.
    Refused(WcStatus),
    /// An atomic was in flight when the path failed.
    AtomicInFlight,
    /// A READ was in flight when the path failed and the peer executed a later send.
    ReadOvertaken,
    /// The backup path failed too.
    BackupUnavailable,
    /// No path answered for the outage tolerance.
    OutageTolerance,
    /// The peer failed its end.
    PeerAborted,
    /// The peer stopped answering the handshake.
    HandshakeTimeout,
    /// The peer broke the protocol.
    ProtocolViolation,
    /// The application revoked the connection (its lease).
    Revoked,
}

impl Cause {
    /// The cause of a failover round started by an error completion with `status`.
    pub(crate) fn of_status(status: WcStatus) -> Cause {
        match status {
            WcStatus::RetryExcErr => Cause::RetryExceeded,
            WcStatus::RespTimeoutErr => Cause::ResponseTimeout,
            WcStatus::FatalErr => Cause::Fatal,
            WcStatus::WrFlushErr => Cause::Flushed,
            other => Cause::Refused(other),
        }
    }

    /// The cause of a connection failure.
    pub(crate) fn of_failure(reason: FailReason) -> Cause {
        match reason {
            FailReason::Refused { status } => Cause::Refused(status),
            FailReason::AtomicInFlight => Cause::AtomicInFlight,
            FailReason::ReadOvertaken => Cause::ReadOvertaken,
            FailReason::BackupUnavailable => Cause::BackupUnavailable,
            FailReason::OutageTolerance => Cause::OutageTolerance,
            FailReason::PeerAborted => Cause::PeerAborted,
            FailReason::HandshakeTimeout => Cause::HandshakeTimeout,
            FailReason::ProtocolViolation => Cause::ProtocolViolation,
            FailReason::Revoked => Cause::Revoked,
        }
    }

    /// The name the apps' JSON uses (kebab case; refusals name the status).
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::LinkDown => "link-down",
            Cause::DeviceFatal => "device-fatal",
            Cause::RetryExceeded => "retry-exceeded",
            Cause::ResponseTimeout => "response-timeout",
            Cause::Fatal => "fatal",
            Cause::Flushed => "flushed",
            Cause::PeerFailover => "peer-failover",
            Cause::PathRecovered => "path-recovered",
            Cause::BackupFailed => "backup-failed",
            Cause::Refused(status) => match status {
                WcStatus::RemAccessErr => "remote-access-error",
                WcStatus::LocProtErr => "local-protection-error",
                WcStatus::RemInvReqErr => "remote-invalid-request",
                WcStatus::LocLenErr => "local-length-error",
                WcStatus::RemOpErr => "remote-operation-error",
                WcStatus::LocQpOpErr => "local-qp-operation-error",
                WcStatus::RnrRetryExcErr => "rnr-retry-exceeded",
                WcStatus::LocAccessErr => "local-access-error",
                _ => "refused",
            },
            Cause::AtomicInFlight => "atomic-in-flight",
            Cause::ReadOvertaken => "read-overtaken",
            Cause::BackupUnavailable => "backup-unavailable",
            Cause::OutageTolerance => "outage-tolerance",
            Cause::PeerAborted => "peer-aborted",
            Cause::HandshakeTimeout => "handshake-timeout",
            Cause::ProtocolViolation => "protocol-violation",
            Cause::Revoked => "revoked",
        }
    }
}

/// One entry of a QP's event log: exactly what `failover.events[]` of the apps' JSON holds.
#[derive(Debug, Clone, PartialEq)]
pub struct FailoverEvent {
    /// What happened.
    pub kind: EventKind,
    /// Why.
    pub cause: Cause,
    /// The device that failed (failover, refusal, error) or came back (switch-back, failback:
    /// the default device).
    pub device: String,
    /// When the event completed (the round finished, the sends switched back, the error was
    /// surfaced), Unix milliseconds (virtual milliseconds under a virtual clock).
    pub unix_ms: f64,
    /// When the failure was detected: the first error completion polled, the link-down
    /// handled, or the peer's message handled.
    pub detected_unix_ms: f64,
    /// The first successful completion on the new path (failovers; filled in when it comes).
    pub first_success_unix_ms: Option<f64>,
    /// Detection to first success, microseconds (failovers; filled in with the above).
    pub fallback_latency_us: Option<f64>,
    /// Application sends moved to the backup SQ plus receives moved.
    pub wqes_copied: u64,
    /// Application sends moved to the backup SQ.
    pub wqes_retransmitted: u64,
    /// Application sends completed without being sent again.
    pub wqes_skipped: u64,
    /// The default-pair incarnation the event concerns.
    pub epoch: u32,
}

impl FailoverEvent {
    /// Detection to completion of the event itself, milliseconds.
    pub fn duration_ms(&self) -> f64 {
        self.unix_ms - self.detected_unix_ms
    }
}
