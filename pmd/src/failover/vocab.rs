//! The words the failover machine's events, actions and control messages share: which path,
//! and why a connection failed. A leaf: it imports nothing of the machine, so `action`,
//! `event` and `message` all use it without importing each other in a circle. (Epochs, the
//! other shared word, are in `config`, also a leaf.)

use super::status::WcStatus;

/// One of the two QPs of a resilient connection end, and the device it lives on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Path {
    /// The default QP on the default device: carries traffic when nothing has failed.
    Default,
    /// The backup QP on the backup device (which also carries the control QP).
    Backup,
}

/// Why failover gave up and surfaced an error to the application.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailReason {
    /// A protection or request error (not a path failure): retrying on another NIC would
    /// bypass it.
    Refused {
        /// The refusing completion's status.
        status: WcStatus,
    },
    /// An atomic was in flight when the path failed: it may have executed, so it cannot be
    /// retransmitted, and it cannot be skipped.
    AtomicInFlight,
    /// A READ was in flight when the path failed and the peer executed a send posted after
    /// it: executed again on the backup, the READ could return data changed since, so it is
    /// neither retransmitted nor reported as a success.
    ReadOvertaken,
    /// Work depended on the backup path and the backup path failed (link down, QP error,
    /// control send failed): no path is left that the protocol can use.
    BackupUnavailable,
    /// No path answered for the outage tolerance (`Config::outage_tolerance`) while work
    /// was held for one.
    OutageTolerance,
    /// The peer failed its end.
    PeerAborted,
    /// The peer did not answer a failover handshake in time.
    HandshakeTimeout,
    /// The peer said something the protocol does not allow in this state.
    ProtocolViolation,
    /// The application revoked the connection (`pmd::resilient::Leases::revoke`): it ends
    /// here and never fails over or re-arms. The machine never decides this itself.
    Revoked,
}

impl FailReason {
    /// The status the application sees first.
    pub fn status(self) -> WcStatus {
        match self {
            FailReason::Refused { status } => status,
            _ => WcStatus::RetryExcErr,
        }
    }

    /// The wire code and the status it carries ([`WcStatus::Success`] unless refused).
    pub(crate) fn code(self) -> (u64, WcStatus) {
        match self {
            FailReason::Refused { status } => (1, status),
            FailReason::AtomicInFlight => (2, WcStatus::Success),
            FailReason::BackupUnavailable => (3, WcStatus::Success),
            FailReason::PeerAborted => (4, WcStatus::Success),
            FailReason::HandshakeTimeout => (5, WcStatus::Success),
            FailReason::ProtocolViolation => (6, WcStatus::Success),
            FailReason::ReadOvertaken => (7, WcStatus::Success),
            FailReason::Revoked => (8, WcStatus::Success),
            FailReason::OutageTolerance => (9, WcStatus::Success),
        }
    }

    /// The reason a wire code names, if any.
    pub(crate) fn from_code(code: u64, status: WcStatus) -> Option<Self> {
        Some(match code {
            1 => FailReason::Refused { status },
            2 => FailReason::AtomicInFlight,
            3 => FailReason::BackupUnavailable,
            4 => FailReason::PeerAborted,
            5 => FailReason::HandshakeTimeout,
            6 => FailReason::ProtocolViolation,
            7 => FailReason::ReadOvertaken,
            8 => FailReason::Revoked,
            9 => FailReason::OutageTolerance,
            _ => return None,
        })
    }
}

impl core::fmt::Display for FailReason {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            FailReason::Refused { status } => {
                write!(f, "refused by the NIC ({status:?}); never failed over")
            }
            FailReason::AtomicInFlight => {
                f.write_str("an atomic was in flight; it cannot be retransmitted")
            }
            FailReason::BackupUnavailable => f.write_str("the backup path failed too"),
            FailReason::OutageTolerance => {
                f.write_str("no path answered for the whole outage tolerance")
            }
            FailReason::PeerAborted => f.write_str("the peer failed its end"),
            FailReason::HandshakeTimeout => {
                f.write_str("the peer did not answer the failover handshake")
            }
            FailReason::ProtocolViolation => f.write_str("the peer broke the failover protocol"),
            FailReason::Revoked => f.write_str("the application revoked the connection"),
            FailReason::ReadOvertaken => f.write_str(
                "a READ was in flight and the peer executed a later send; it cannot be executed again",
            ),
        }
    }
}
