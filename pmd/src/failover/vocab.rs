//! The words the failover machine's events, actions and control messages share: which path,
//! which side a repair brings back, and why a connection failed. A leaf but for `config`'s
//! epochs (also a leaf): it imports nothing of the machine, so `action`, `event` and
//! `message` all use it without importing each other in a circle.

use super::config::{BackupEpoch, ChannelEpoch};
use super::status::WcStatus;

/// One of the two QPs of a resilient connection end, and the device it lives on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Path {
    /// The default QP on the default device: carries traffic when nothing has failed.
    Default,
    /// The backup QP on the backup device (which also carries the control QP).
    Backup,
}

/// A part of a connection end that is lost while the connection runs on, and that the two
/// ends repair by resetting it and bringing it up in a new incarnation (`docs/failover.md`
/// 5d). Each side's repair messages travel on the other side's channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// The backup data QP and the control QP on the backup devices; repaired over the
    /// control channel on the default devices.
    Backup,
    /// The control channel on the default devices (the channel backup repairs and failbacks
    /// travel on); repaired over the backup devices' channel.
    DefaultChannel,
}

impl Side {
    /// The device pair this side lives on: its link must be up for it to come back.
    pub fn path(self) -> Path {
        match self {
            Side::Backup => Path::Backup,
            Side::DefaultChannel => Path::Default,
        }
    }

    /// The control channel this side's repair messages travel on: the other side's.
    pub fn repaired_via(self) -> Path {
        match self {
            Side::Backup => Path::Default,
            Side::DefaultChannel => Path::Backup,
        }
    }

    /// The other side, whose channel carries this side's repair.
    pub fn other(self) -> Side {
        match self {
            Side::Backup => Side::DefaultChannel,
            Side::DefaultChannel => Side::Backup,
        }
    }
}

/// One incarnation of a repaired [`Side`]: which side, and its epoch, typed by side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SideEpoch {
    /// An incarnation of the backup side.
    Backup(BackupEpoch),
    /// An incarnation of the default devices' control channel.
    DefaultChannel(ChannelEpoch),
}

impl SideEpoch {
    /// Incarnation `number` of `side`.
    pub fn new(side: Side, number: u32) -> Self {
        match side {
            Side::Backup => SideEpoch::Backup(BackupEpoch(number)),
            Side::DefaultChannel => SideEpoch::DefaultChannel(ChannelEpoch(number)),
        }
    }

    /// The side it is an incarnation of.
    pub fn side(self) -> Side {
        match self {
            SideEpoch::Backup(_) => Side::Backup,
            SideEpoch::DefaultChannel(_) => Side::DefaultChannel,
        }
    }

    /// Its number within its side.
    pub fn number(self) -> u32 {
        match self {
            SideEpoch::Backup(BackupEpoch(n)) | SideEpoch::DefaultChannel(ChannelEpoch(n)) => n,
        }
    }

    /// The first PSN of this incarnation, for a QP whose saved starting PSN is `base`: laid
    /// out as the default pair's epochs are ([`Epoch::start_psn`]).
    ///
    /// [`Epoch::start_psn`]: super::Epoch::start_psn
    pub fn start_psn(self, base: u32) -> u32 {
        match self {
            SideEpoch::Backup(epoch) => epoch.start_psn(base),
            SideEpoch::DefaultChannel(epoch) => epoch.start_psn(base),
        }
    }
}

impl core::fmt::Display for SideEpoch {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SideEpoch::Backup(epoch) => epoch.fmt(f),
            SideEpoch::DefaultChannel(epoch) => epoch.fmt(f),
        }
    }
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
