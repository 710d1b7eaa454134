//! What a resilient QP counts and logs: per-QP statistics and the failover event log that the
//! apps write into their JSON (`docs/apps-json.md`, `failover.events[]`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

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
    /// Datagrams of the management network (`docs/failover.md` 5f) naming this QP's end that
    /// were not sealed with its key (forged, altered) or were malformed.
    pub management_forged: u64,
    /// Sealed management messages dropped as already delivered (a replay, or a resend whose
    /// acknowledgment was lost) or ahead of a lost one (it comes again in order).
    pub management_out_of_sequence: u64,
}

/// Events a QP keeps; later ones are counted in [`FailoverStats::events_dropped`].
pub const EVENT_LOG_CAPACITY: usize = 4096;

/// What happened. In JSON, its name ([`EventKind::as_str`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "&'static str", try_from = "String")]
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
    /// Every kind, for reading names back.
    const ALL: [EventKind; 5] = [
        EventKind::Failover,
        EventKind::SwitchBack,
        EventKind::Refused,
        EventKind::Error,
        EventKind::Failback,
    ];

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

/// Why it happened. In JSON, its name ([`Cause::as_str`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "&'static str", try_from = "String")]
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
    /// One cause of each name, for reading names back: a refusal's name is its status, and
    /// statuses without a name of their own read back as a general error, which has none
    /// either.
    const ALL: [Cause; 26] = [
        Cause::LinkDown,
        Cause::DeviceFatal,
        Cause::RetryExceeded,
        Cause::ResponseTimeout,
        Cause::Fatal,
        Cause::Flushed,
        Cause::PeerFailover,
        Cause::PathRecovered,
        Cause::BackupFailed,
        Cause::Refused(WcStatus::RemAccessErr),
        Cause::Refused(WcStatus::LocProtErr),
        Cause::Refused(WcStatus::RemInvReqErr),
        Cause::Refused(WcStatus::LocLenErr),
        Cause::Refused(WcStatus::RemOpErr),
        Cause::Refused(WcStatus::LocQpOpErr),
        Cause::Refused(WcStatus::RnrRetryExcErr),
        Cause::Refused(WcStatus::LocAccessErr),
        Cause::Refused(WcStatus::GeneralErr),
        Cause::AtomicInFlight,
        Cause::ReadOvertaken,
        Cause::BackupUnavailable,
        Cause::OutageTolerance,
        Cause::PeerAborted,
        Cause::HandshakeTimeout,
        Cause::ProtocolViolation,
        Cause::Revoked,
    ];

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

/// One entry of a QP's event log: exactly what `failover.events[]` of the apps' JSON holds
/// (`docs/apps-json.md`), and what the testbed reads back from it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailoverEvent {
    /// What happened.
    pub kind: EventKind,
    /// When the event completed (the round finished, the sends switched back, the error was
    /// surfaced), Unix milliseconds (virtual milliseconds under a virtual clock).
    pub unix_ms: f64,
    /// Why.
    pub cause: Cause,
    /// The device that failed (failover, refusal, error) or came back (switch-back, failback:
    /// the default device).
    pub device: String,
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
    /// The default-pair incarnation the event concerns. Not in the JSON: 0 when read from it.
    #[serde(skip)]
    pub epoch: u32,
}

impl FailoverEvent {
    /// Detection to completion of the event itself, milliseconds.
    pub fn duration_ms(&self) -> f64 {
        self.unix_ms - self.detected_unix_ms
    }
}

/// A name in an event's JSON that names no [`EventKind`] or [`Cause`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {name:?}")]
pub struct UnknownName {
    /// `event kind` or `cause`.
    what: &'static str,
    /// The name as read.
    name: String,
}

/// JSON for a type with `as_str` names and an `ALL` list: serialized as its name, read back
/// from it.
macro_rules! named_in_json {
    ($type:ident, $what:literal) => {
        #[doc = concat!("Serializes as [`", stringify!($type), "::as_str`].")]
        impl From<$type> for &'static str {
            fn from(value: $type) -> &'static str {
                value.as_str()
            }
        }

        #[doc = concat!("Reads a [`", stringify!($type), "::as_str`] name back.")]
        impl TryFrom<String> for $type {
            type Error = UnknownName;

            fn try_from(name: String) -> Result<$type, UnknownName> {
                read_name(&$type::ALL, $type::as_str, $what, name)
            }
        }
    };
}

named_in_json!(EventKind, "event kind");
named_in_json!(Cause, "cause");

/// The member of `all` whose name is `name`.
fn read_name<T: Copy>(
    all: &[T],
    name_of: fn(T) -> &'static str,
    what: &'static str,
    name: String,
) -> Result<T, UnknownName> {
    all.iter()
        .copied()
        .find(|&value| name_of(value) == name)
        .ok_or(UnknownName { what, name })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_event_kind_reads_back_from_its_name() {
        for kind in EventKind::ALL {
            assert_eq!(EventKind::try_from(kind.as_str().to_owned()), Ok(kind));
        }
    }

    #[test]
    fn every_cause_reads_back_as_a_cause_of_the_same_name() {
        let refusals = (0..=u8::MAX).map(|s| Cause::Refused(WcStatus::from(s)));
        for cause in Cause::ALL.into_iter().chain(refusals) {
            let read = Cause::try_from(cause.as_str().to_owned());
            assert_eq!(read.map(Cause::as_str), Ok(cause.as_str()), "{cause:?}");
        }
    }

    #[test]
    fn an_unknown_name_is_an_error_that_names_it() {
        let err = Cause::try_from("sunspots".to_owned()).unwrap_err();
        assert_eq!(err.to_string(), r#"unknown cause "sunspots""#);
        assert!(EventKind::try_from("Failover".to_owned()).is_err());
    }

    #[test]
    fn an_event_is_written_with_names_and_without_its_epoch_and_reads_back() {
        let event = FailoverEvent {
            kind: EventKind::SwitchBack,
            unix_ms: 2004.5,
            cause: Cause::Refused(WcStatus::RemAccessErr),
            device: "soft:nic0".to_owned(),
            detected_unix_ms: 2001.5,
            first_success_unix_ms: Some(2003.0),
            fallback_latency_us: None,
            wqes_copied: 3,
            wqes_retransmitted: 2,
            wqes_skipped: 1,
            epoch: 7,
        };
        let json = serde_json::to_string(&event).unwrap();
        assert_eq!(
            json,
            r#"{"kind":"switch-back","unix_ms":2004.5,"cause":"remote-access-error","device":"soft:nic0","detected_unix_ms":2001.5,"first_success_unix_ms":2003.0,"fallback_latency_us":null,"wqes_copied":3,"wqes_retransmitted":2,"wqes_skipped":1}"#
        );
        let read: FailoverEvent = serde_json::from_str(&json).unwrap();
        assert_eq!(read, FailoverEvent { epoch: 0, ..event });
    }
}
