//! Control messages between the two ends of a resilient connection, and their wire format.
//!
//! Control messages travel as 32-byte RDMA WRITE_WITH_IMMs into the peer's control ring, on
//! a dedicated control QP pair on the backup devices (see `docs/failover.md` section 4 for why
//! not on the data QPs, and `crate::resilient` for the ring). The layout,
//! all fields big-endian:
//!
//! ```text
//!  0      2     3     4          8        12         16                24                32
//!  +------+-----+-----+----------+--------+----------+-----------------+-----------------+
//!  | "RS" | ver |kind | dest QPN |  epoch | reserved |      value a    |      value b    |
//!  +------+-----+-----+----------+--------+----------+-----------------+-----------------+
//! ```
//!
//! `dest QPN` names the receiving end's default QP, so one control QP pair can serve every
//! resilient connection between two backup devices. Counters travel as full 64-bit values: no
//! wrap-around reconstruction is needed on the receiving side. A wait travels as a duration in
//! nanoseconds, never as a point in time: the two ends' clocks are not synchronized.

use core::time::Duration;

use super::config::Epoch;
use super::status::WcStatus;
use super::vocab::{FailReason, Side, SideEpoch};

/// What one end tells the other about the failover protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ControlMessage {
    /// "My default QP has left `epoch` (it is in ERR); my receive WQEs are on the backup QP,
    /// behind `stale_recvs` stale ones; I have consumed `recvs_completed` of your two-sided
    /// sends." Each end sends it once per failed epoch; it is both the paper's notification
    /// and its acknowledgment.
    Failover {
        /// The default-pair incarnation that failed.
        epoch: Epoch,
        /// Application receives the sender has completed, counted since the connection began.
        recvs_completed: u64,
        /// Stale receive WQEs at the head of the sender's backup RQ, to be consumed by
        /// zero-length SENDs before anything else.
        stale_recvs: u64,
    },
    /// Leader to follower: "my default QP has left every epoch before `epoch`; bring yours up
    /// in `epoch`."
    Rearm {
        /// The new incarnation.
        epoch: Epoch,
    },
    /// Follower to leader: "my default QP is in RTS in `epoch`" (or could not be brought up).
    RearmDone {
        /// The incarnation the leader asked for.
        epoch: Epoch,
        /// Whether the follower's QP reached RTS.
        ok: bool,
    },
    /// Follower to leader: "I refused `epoch`; my default link has now been up for the
    /// hold-down, try again." Without it the leader would find a recovery on the follower's
    /// side only at its next backoff, up to `backoff_max` after the hold-down.
    RearmReady {
        /// The epoch the follower refused last.
        epoch: Epoch,
    },
    /// Leader to follower: "a probe went through the default path in `epoch`."
    PathUp {
        /// The confirmed incarnation.
        epoch: Epoch,
    },
    /// Sender to receiver: "all my WRs on the backup QP have completed; I posted
    /// `sends_before` two-sided sends before switching my send queue back to the default QP."
    SwitchBack {
        /// The default-pair incarnation switched back to.
        epoch: Epoch,
        /// Two-sided sends posted before the switch, counted since the connection began.
        sends_before: u64,
    },
    /// Receiver to sender: "receive WQEs for your next sends are on my default QP."
    SwitchBackReady {
        /// The default-pair incarnation switched back to.
        epoch: Epoch,
    },
    /// Follower to leader, on the other side's channel: "my `epoch.side()` went to ERR while
    /// we ran on; repair it." `epoch` is the follower's incarnation of that side
    /// (`docs/failover.md` 5d): its backup side (the backup data QP or the control QP on the
    /// backup devices), told over the default devices' channel, or its control QP on the
    /// default devices, told over the backup devices' channel.
    SideLost {
        /// The side and the incarnation that failed.
        epoch: SideEpoch,
    },
    /// Leader to follower, on the other side's channel: "my `epoch.side()` has left every
    /// incarnation before `epoch` (it is in RESET); bring yours up in `epoch`."
    SideRearm {
        /// The side and its new incarnation.
        epoch: SideEpoch,
    },
    /// Follower to leader, on the other side's channel: "my `epoch.side()` is in RTS in
    /// `epoch`" (or could not be, or may not be now).
    SideRearmDone {
        /// The incarnation the leader asked for.
        epoch: SideEpoch,
        /// Whether the follower's side reached RTS.
        ok: bool,
    },
    /// On the default devices' channel: "my backup side failed while traffic was on it; my
    /// backup QP and my default QP are in ERR (they left every epoch), drained: I have
    /// consumed `recvs_completed` of your two-sided sends. Bring your default QP up in the
    /// higher of our two `epoch`s." Each end sends it once per failback round; it starts the
    /// peer's round if the peer had not detected the failure (`docs/failover.md` 5e).
    Failback {
        /// The epoch this end proposes: one past every epoch its default QP was in.
        epoch: Epoch,
        /// Application receives the sender has completed, counted since the connection began.
        recvs_completed: u64,
        /// How long, from the moment the sender posted this, until its default QP's last
        /// incarnation that carried traffic is the backoff past leaving RTS; zero if it is
        /// already. The receiver brings its default QP up no sooner than that after the
        /// message arrived (`docs/failover.md` 6, "Old packets"). At most
        /// [`MAX_FAILBACK_WAIT`]: a longer wait is sent as that.
        wait: Duration,
    },
    /// On the default devices' channel: "my default QP is in RTS in `epoch` and my receive
    /// WQEs are on it: ring what you moved there."
    FailbackReady {
        /// The incarnation both ends agreed on.
        epoch: Epoch,
    },
    /// "I failed the connection; fail yours."
    Abort {
        /// Why the sender failed.
        reason: FailReason,
    },
}

/// Why a control message could not be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    /// Fewer bytes than a control message holds.
    #[error("control message truncated: {len} of {CONTROL_MESSAGE_LEN} bytes")]
    Truncated {
        /// The bytes received.
        len: usize,
    },
    /// The first two bytes are not "RS".
    #[error("not a railshift control message: magic {0:#06x}")]
    BadMagic(u16),
    /// A version this build does not speak.
    #[error("control message version {0} is not supported (this build speaks {VERSION})")]
    UnsupportedVersion(u8),
    /// A kind this build does not know.
    #[error("unknown control message kind {0}")]
    UnknownKind(u8),
    /// A field holds a value its kind does not allow (a reserved field not zero, a flag
    /// other than 0 or 1, a QPN wider than 24 bits, an unknown abort reason).
    #[error("control message kind {kind}: bad {field}")]
    BadField {
        /// The message kind.
        kind: u8,
        /// The offending field.
        field: &'static str,
    },
}

/// The size of a control message on the wire.
pub const CONTROL_MESSAGE_LEN: usize = 32;

/// The longest wait a `Failback` message may carry. The wait is what is left of the sender's
/// rearm backoff (100 ms by default), so anything up to it is legitimate; a longer one would
/// only delay the failback (a packet is assumed to live less than the backoff), and the
/// parser refuses it as a malformed field rather than let a peer stall the round.
pub const MAX_FAILBACK_WAIT: Duration = Duration::from_secs(1);

const MAGIC: u16 = 0x5253; // "RS"
const VERSION: u8 = 1;

mod field {
    use core::ops::Range;
    pub const MAGIC: Range<usize> = 0..2;
    pub const VERSION: usize = 2;
    pub const KIND: usize = 3;
    pub const DEST_QPN: Range<usize> = 4..8;
    pub const EPOCH: Range<usize> = 8..12;
    pub const RESERVED: Range<usize> = 12..16;
    pub const A: Range<usize> = 16..24;
    pub const B: Range<usize> = 24..32;
}

mod kind {
    pub const FAILOVER: u8 = 1;
    pub const REARM: u8 = 2;
    pub const REARM_DONE: u8 = 3;
    pub const PATH_UP: u8 = 4;
    pub const SWITCH_BACK: u8 = 5;
    pub const SWITCH_BACK_READY: u8 = 6;
    pub const ABORT: u8 = 7;
    pub const REARM_READY: u8 = 8;
    pub const BACKUP_LOST: u8 = 9;
    pub const BACKUP_REARM: u8 = 10;
    pub const BACKUP_REARM_DONE: u8 = 11;
    pub const FAILBACK: u8 = 12;
    pub const FAILBACK_READY: u8 = 13;
    pub const DEFAULT_CONTROL_LOST: u8 = 14;
    pub const DEFAULT_CONTROL_REARM: u8 = 15;
    pub const DEFAULT_CONTROL_REARM_DONE: u8 = 16;

    use super::{Side, SideEpoch};

    /// Which side a repair message's kind is about; call only with a repair kind.
    pub fn side(kind: u8) -> Side {
        match kind {
            BACKUP_LOST | BACKUP_REARM | BACKUP_REARM_DONE => Side::Backup,
            _ => Side::DefaultChannel,
        }
    }

    pub fn lost(epoch: SideEpoch) -> u8 {
        match epoch.side() {
            Side::Backup => BACKUP_LOST,
            Side::DefaultChannel => DEFAULT_CONTROL_LOST,
        }
    }

    pub fn rearm(epoch: SideEpoch) -> u8 {
        match epoch.side() {
            Side::Backup => BACKUP_REARM,
            Side::DefaultChannel => DEFAULT_CONTROL_REARM,
        }
    }

    pub fn rearm_done(epoch: SideEpoch) -> u8 {
        match epoch.side() {
            Side::Backup => BACKUP_REARM_DONE,
            Side::DefaultChannel => DEFAULT_CONTROL_REARM_DONE,
        }
    }
}

/// A control message as bytes: a view over a buffer of at least [`CONTROL_MESSAGE_LEN`].
#[derive(Debug, Clone)]
pub struct ControlPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ControlPacket<T> {
    /// Wraps `buffer` after checking its length once, so no accessor can panic.
    pub fn new_checked(buffer: T) -> Result<Self, MessageError> {
        let len = buffer.as_ref().len();
        if len < CONTROL_MESSAGE_LEN {
            return Err(MessageError::Truncated { len });
        }
        Ok(ControlPacket { buffer })
    }

    fn bytes<const N: usize>(&self, range: core::ops::Range<usize>) -> [u8; N] {
        let mut out = [0u8; N];
        out.copy_from_slice(&self.buffer.as_ref()[range]);
        out
    }

    /// The magic number, "RS".
    pub fn magic(&self) -> u16 {
        u16::from_be_bytes(self.bytes(field::MAGIC))
    }

    /// The format version.
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION]
    }

    /// The message kind.
    pub fn kind(&self) -> u8 {
        self.buffer.as_ref()[field::KIND]
    }

    /// The receiving end's default QPN.
    pub fn dest_qpn(&self) -> u32 {
        u32::from_be_bytes(self.bytes(field::DEST_QPN))
    }

    /// The default-pair epoch the message is about.
    pub fn epoch(&self) -> u32 {
        u32::from_be_bytes(self.bytes(field::EPOCH))
    }

    /// The reserved word (zero).
    pub fn reserved(&self) -> u32 {
        u32::from_be_bytes(self.bytes(field::RESERVED))
    }

    /// The first value.
    pub fn a(&self) -> u64 {
        u64::from_be_bytes(self.bytes(field::A))
    }

    /// The second value.
    pub fn b(&self) -> u64 {
        u64::from_be_bytes(self.bytes(field::B))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ControlPacket<T> {
    fn put(&mut self, range: core::ops::Range<usize>, bytes: &[u8]) {
        self.buffer.as_mut()[range].copy_from_slice(bytes);
    }

    /// Sets the magic number.
    pub fn set_magic(&mut self, value: u16) {
        self.put(field::MAGIC, &value.to_be_bytes());
    }

    /// Sets the format version.
    pub fn set_version(&mut self, value: u8) {
        self.buffer.as_mut()[field::VERSION] = value;
    }

    /// Sets the message kind.
    pub fn set_kind(&mut self, value: u8) {
        self.buffer.as_mut()[field::KIND] = value;
    }

    /// Sets the receiving end's default QPN.
    pub fn set_dest_qpn(&mut self, value: u32) {
        self.put(field::DEST_QPN, &value.to_be_bytes());
    }

    /// Sets the epoch.
    pub fn set_epoch(&mut self, value: u32) {
        self.put(field::EPOCH, &value.to_be_bytes());
    }

    /// Sets the reserved word.
    pub fn set_reserved(&mut self, value: u32) {
        self.put(field::RESERVED, &value.to_be_bytes());
    }

    /// Sets the first value.
    pub fn set_a(&mut self, value: u64) {
        self.put(field::A, &value.to_be_bytes());
    }

    /// Sets the second value.
    pub fn set_b(&mut self, value: u64) {
        self.put(field::B, &value.to_be_bytes());
    }
}

/// A parsed control message and the connection it is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ControlRepr {
    /// The receiving end's default QPN (24 bits).
    pub dest_qpn: u32,
    /// The message.
    pub message: ControlMessage,
}

impl ControlRepr {
    /// Parses untrusted bytes from the control QP.
    pub fn parse<T: AsRef<[u8]>>(packet: &ControlPacket<T>) -> Result<Self, MessageError> {
        if packet.magic() != MAGIC {
            return Err(MessageError::BadMagic(packet.magic()));
        }
        if packet.version() != VERSION {
            return Err(MessageError::UnsupportedVersion(packet.version()));
        }
        let kind = packet.kind();
        let bad = |field| MessageError::BadField { kind, field };
        if packet.dest_qpn() > 0x00FF_FFFF {
            return Err(bad("dest_qpn"));
        }
        if packet.reserved() != 0 {
            return Err(bad("reserved"));
        }
        let epoch = Epoch(packet.epoch());
        let (a, b) = (packet.a(), packet.b());
        let unused = |value: u64, field| if value == 0 { Ok(()) } else { Err(bad(field)) };
        let message = match kind {
            kind::FAILOVER => ControlMessage::Failover {
                epoch,
                recvs_completed: a,
                stale_recvs: b,
            },
            kind::REARM => {
                unused(a, "a")?;
                unused(b, "b")?;
                ControlMessage::Rearm { epoch }
            }
            kind::REARM_DONE => {
                unused(a, "a")?;
                let ok = match b {
                    0 => false,
                    1 => true,
                    _ => return Err(bad("ok")),
                };
                ControlMessage::RearmDone { epoch, ok }
            }
            kind::PATH_UP => {
                unused(a, "a")?;
                unused(b, "b")?;
                ControlMessage::PathUp { epoch }
            }
            kind::SWITCH_BACK => {
                unused(b, "b")?;
                ControlMessage::SwitchBack {
                    epoch,
                    sends_before: a,
                }
            }
            kind::SWITCH_BACK_READY => {
                unused(a, "a")?;
                unused(b, "b")?;
                ControlMessage::SwitchBackReady { epoch }
            }
            kind::REARM_READY => {
                unused(a, "a")?;
                unused(b, "b")?;
                ControlMessage::RearmReady { epoch }
            }
            kind::BACKUP_LOST | kind::DEFAULT_CONTROL_LOST => {
                unused(a, "a")?;
                unused(b, "b")?;
                ControlMessage::SideLost {
                    epoch: SideEpoch::new(kind::side(kind), epoch.0),
                }
            }
            kind::BACKUP_REARM | kind::DEFAULT_CONTROL_REARM => {
                unused(a, "a")?;
                unused(b, "b")?;
                ControlMessage::SideRearm {
                    epoch: SideEpoch::new(kind::side(kind), epoch.0),
                }
            }
            kind::BACKUP_REARM_DONE | kind::DEFAULT_CONTROL_REARM_DONE => {
                unused(a, "a")?;
                let ok = match b {
                    0 => false,
                    1 => true,
                    _ => return Err(bad("ok")),
                };
                ControlMessage::SideRearmDone {
                    epoch: SideEpoch::new(kind::side(kind), epoch.0),
                    ok,
                }
            }
            kind::FAILBACK => {
                let wait = Duration::from_nanos(b);
                if wait > MAX_FAILBACK_WAIT {
                    return Err(bad("wait"));
                }
                ControlMessage::Failback {
                    epoch,
                    recvs_completed: a,
                    wait,
                }
            }
            kind::FAILBACK_READY => {
                unused(a, "a")?;
                unused(b, "b")?;
                ControlMessage::FailbackReady { epoch }
            }
            kind::ABORT => {
                let status = u8::try_from(a).map_err(|_| bad("status"))?;
                let reason =
                    FailReason::from_code(b, WcStatus::from(status)).ok_or(bad("reason"))?;
                ControlMessage::Abort { reason }
            }
            other => return Err(MessageError::UnknownKind(other)),
        };
        Ok(ControlRepr {
            dest_qpn: packet.dest_qpn(),
            message,
        })
    }

    /// Writes the message into `packet`, every byte of it.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut ControlPacket<T>) {
        let (kind, epoch, a, b) = match self.message {
            ControlMessage::Failover {
                epoch,
                recvs_completed,
                stale_recvs,
            } => (kind::FAILOVER, epoch, recvs_completed, stale_recvs),
            ControlMessage::Rearm { epoch } => (kind::REARM, epoch, 0, 0),
            ControlMessage::RearmDone { epoch, ok } => (kind::REARM_DONE, epoch, 0, u64::from(ok)),
            ControlMessage::RearmReady { epoch } => (kind::REARM_READY, epoch, 0, 0),
            ControlMessage::PathUp { epoch } => (kind::PATH_UP, epoch, 0, 0),
            ControlMessage::SwitchBack {
                epoch,
                sends_before,
            } => (kind::SWITCH_BACK, epoch, sends_before, 0),
            ControlMessage::SwitchBackReady { epoch } => (kind::SWITCH_BACK_READY, epoch, 0, 0),
            ControlMessage::SideLost { epoch } => (kind::lost(epoch), Epoch(epoch.number()), 0, 0),
            ControlMessage::SideRearm { epoch } => {
                (kind::rearm(epoch), Epoch(epoch.number()), 0, 0)
            }
            ControlMessage::SideRearmDone { epoch, ok } => (
                kind::rearm_done(epoch),
                Epoch(epoch.number()),
                0,
                u64::from(ok),
            ),
            ControlMessage::Failback {
                epoch,
                recvs_completed,
                wait,
            } => {
                let nanos = wait.min(MAX_FAILBACK_WAIT).as_nanos();
                // Within `MAX_FAILBACK_WAIT`, so it fits 64 bits of nanoseconds.
                let wait = u64::try_from(nanos).unwrap_or(u64::MAX);
                (kind::FAILBACK, epoch, recvs_completed, wait)
            }
            ControlMessage::FailbackReady { epoch } => (kind::FAILBACK_READY, epoch, 0, 0),
            ControlMessage::Abort { reason } => {
                let (code, status) = reason.code();
                (kind::ABORT, Epoch(0), u64::from(u8::from(status)), code)
            }
        };
        packet.set_magic(MAGIC);
        packet.set_version(VERSION);
        packet.set_kind(kind);
        packet.set_dest_qpn(self.dest_qpn & 0x00FF_FFFF);
        packet.set_epoch(epoch.0);
        packet.set_reserved(0);
        packet.set_a(a);
        packet.set_b(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Failover message for QPN 0x000abc in epoch 3: 7 receives completed, 2 stale.
    const FAILOVER_BYTES: [u8; 32] = [
        0x52, 0x53, 0x01, 0x01, // "RS", version 1, kind Failover
        0x00, 0x00, 0x0a, 0xbc, // dest QPN
        0x00, 0x00, 0x00, 0x03, // epoch
        0x00, 0x00, 0x00, 0x00, // reserved
        0, 0, 0, 0, 0, 0, 0, 7, // recvs_completed
        0, 0, 0, 0, 0, 0, 0, 2, // stale_recvs
    ];

    /// `message` to QPN 0x123456 as it goes on the wire, emitted over 0xff bytes so that a
    /// byte emit leaves unwritten shows.
    fn emitted(message: ControlMessage) -> [u8; CONTROL_MESSAGE_LEN] {
        let mut bytes = [0xffu8; CONTROL_MESSAGE_LEN];
        let repr = ControlRepr {
            dest_qpn: 0x12_3456,
            message,
        };
        repr.emit(&mut ControlPacket::new_checked(&mut bytes[..]).unwrap());
        bytes
    }

    /// What the parser makes of `bytes`, a whole message.
    fn parsed(bytes: &[u8]) -> Result<ControlRepr, MessageError> {
        ControlRepr::parse(&ControlPacket::new_checked(bytes).unwrap())
    }

    fn round_trip(message: ControlMessage) -> ControlMessage {
        let parsed = parsed(&emitted(message)).unwrap();
        assert_eq!(parsed.dest_qpn, 0x12_3456);
        parsed.message
    }

    #[test]
    fn failover_message_parses_from_golden_bytes() {
        let packet = ControlPacket::new_checked(&FAILOVER_BYTES[..]).unwrap();
        let repr = ControlRepr::parse(&packet).unwrap();
        assert_eq!(repr.dest_qpn, 0xabc);
        assert_eq!(
            repr.message,
            ControlMessage::Failover {
                epoch: Epoch(3),
                recvs_completed: 7,
                stale_recvs: 2
            }
        );
    }

    #[test]
    fn failover_message_emits_golden_bytes() {
        let mut bytes = [0xffu8; 32];
        let repr = ControlRepr {
            dest_qpn: 0xabc,
            message: ControlMessage::Failover {
                epoch: Epoch(3),
                recvs_completed: 7,
                stale_recvs: 2,
            },
        };
        repr.emit(&mut ControlPacket::new_checked(&mut bytes[..]).unwrap());
        assert_eq!(bytes, FAILOVER_BYTES);
    }

    #[test]
    fn every_kind_survives_a_round_trip() {
        let epoch = Epoch(41);
        let backup = SideEpoch::new(Side::Backup, 42);
        let channel = SideEpoch::new(Side::DefaultChannel, 43);
        for message in [
            ControlMessage::Failover {
                epoch,
                recvs_completed: u64::MAX,
                stale_recvs: 1 << 40,
            },
            ControlMessage::Rearm { epoch },
            ControlMessage::RearmDone { epoch, ok: true },
            ControlMessage::RearmReady { epoch },
            ControlMessage::RearmDone { epoch, ok: false },
            ControlMessage::PathUp { epoch },
            ControlMessage::SwitchBack {
                epoch,
                sends_before: 1 << 33,
            },
            ControlMessage::SwitchBackReady { epoch },
            ControlMessage::SideLost { epoch: backup },
            ControlMessage::SideRearm { epoch: backup },
            ControlMessage::SideRearmDone {
                epoch: backup,
                ok: true,
            },
            ControlMessage::SideRearmDone {
                epoch: backup,
                ok: false,
            },
            ControlMessage::Failback {
                epoch,
                recvs_completed: (1 << 40) + 3,
                wait: Duration::from_nanos(87_654_321),
            },
            ControlMessage::Failback {
                epoch,
                recvs_completed: 0,
                wait: MAX_FAILBACK_WAIT,
            },
            ControlMessage::FailbackReady { epoch },
            ControlMessage::SideLost { epoch: channel },
            ControlMessage::SideRearm { epoch: channel },
            ControlMessage::SideRearmDone {
                epoch: channel,
                ok: true,
            },
            ControlMessage::SideRearmDone {
                epoch: channel,
                ok: false,
            },
            ControlMessage::Abort {
                reason: FailReason::AtomicInFlight,
            },
            ControlMessage::Abort {
                reason: FailReason::Refused {
                    status: WcStatus::RemAccessErr,
                },
            },
            ControlMessage::Abort {
                reason: FailReason::ProtocolViolation,
            },
            ControlMessage::Abort {
                reason: FailReason::ReadOvertaken,
            },
        ] {
            assert_eq!(round_trip(message), message);
        }
    }

    #[test]
    fn the_side_of_a_repair_message_is_its_wire_kind() {
        let kind_of = |message| {
            let mut bytes = [0u8; CONTROL_MESSAGE_LEN];
            let repr = ControlRepr {
                dest_qpn: 1,
                message,
            };
            repr.emit(&mut ControlPacket::new_checked(&mut bytes[..]).unwrap());
            (
                bytes[3],
                u32::from_be_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]),
            )
        };
        let backup = SideEpoch::new(Side::Backup, 5);
        let channel = SideEpoch::new(Side::DefaultChannel, 6);
        assert_eq!(kind_of(ControlMessage::SideLost { epoch: backup }), (9, 5));
        assert_eq!(
            kind_of(ControlMessage::SideRearm { epoch: backup }),
            (10, 5)
        );
        let done = |epoch| ControlMessage::SideRearmDone { epoch, ok: true };
        assert_eq!(kind_of(done(backup)), (11, 5));
        assert_eq!(
            kind_of(ControlMessage::SideLost { epoch: channel }),
            (14, 6)
        );
        assert_eq!(
            kind_of(ControlMessage::SideRearm { epoch: channel }),
            (15, 6)
        );
        assert_eq!(kind_of(done(channel)), (16, 6));
    }

    #[test]
    fn short_buffers_are_refused_before_any_access() {
        assert_eq!(
            ControlPacket::new_checked(&[0u8; 31][..]).unwrap_err(),
            MessageError::Truncated { len: 31 }
        );
    }

    #[test]
    fn foreign_bytes_are_refused() {
        let mut bytes = FAILOVER_BYTES;
        bytes[0] = 0x00;
        assert_eq!(parsed(&bytes).unwrap_err(), MessageError::BadMagic(0x0053));
    }

    #[test]
    fn a_newer_version_is_refused() {
        let mut bytes = FAILOVER_BYTES;
        bytes[2] = 2;
        assert_eq!(
            parsed(&bytes).unwrap_err(),
            MessageError::UnsupportedVersion(2)
        );
    }

    #[test]
    fn an_unknown_kind_is_refused() {
        let mut bytes = FAILOVER_BYTES;
        bytes[3] = 99;
        assert_eq!(parsed(&bytes).unwrap_err(), MessageError::UnknownKind(99));
    }

    #[test]
    fn a_rearm_done_flag_other_than_zero_or_one_is_refused() {
        let mut bytes = emitted(ControlMessage::RearmDone {
            epoch: Epoch(1),
            ok: true,
        });
        bytes[31] = 2;
        assert_eq!(
            parsed(&bytes).unwrap_err(),
            MessageError::BadField {
                kind: 3,
                field: "ok"
            }
        );
    }

    fn failback_bytes(wait: Duration) -> [u8; CONTROL_MESSAGE_LEN] {
        emitted(ControlMessage::Failback {
            epoch: Epoch(2),
            recvs_completed: 5,
            wait,
        })
    }

    #[test]
    fn a_failback_wait_travels_as_nanoseconds_in_value_b() {
        let bytes = failback_bytes(Duration::from_millis(42));
        assert_eq!(bytes[3], 12);
        assert_eq!(bytes[24..32], 42_000_000u64.to_be_bytes());
    }

    #[test]
    fn a_failback_wait_above_the_maximum_is_refused() {
        let mut bytes = failback_bytes(Duration::ZERO);
        let over = MAX_FAILBACK_WAIT.as_nanos() as u64 + 1;
        bytes[24..32].copy_from_slice(&over.to_be_bytes());
        assert_eq!(
            parsed(&bytes).unwrap_err(),
            MessageError::BadField {
                kind: 12,
                field: "wait"
            }
        );
        bytes[24..32].copy_from_slice(&u64::MAX.to_be_bytes());
        assert!(parsed(&bytes).is_err());
    }

    #[test]
    fn a_failback_wait_longer_than_the_maximum_is_sent_as_the_maximum() {
        let bytes = failback_bytes(Duration::from_secs(u64::MAX));
        assert_eq!(
            parsed(&bytes).unwrap().message,
            ControlMessage::Failback {
                epoch: Epoch(2),
                recvs_completed: 5,
                wait: MAX_FAILBACK_WAIT,
            }
        );
    }

    #[test]
    fn nonzero_reserved_bytes_are_refused() {
        let mut bytes = FAILOVER_BYTES;
        bytes[13] = 1;
        assert_eq!(
            parsed(&bytes).unwrap_err(),
            MessageError::BadField {
                kind: 1,
                field: "reserved"
            }
        );
    }

    #[test]
    fn a_qpn_wider_than_24_bits_is_refused() {
        let mut bytes = FAILOVER_BYTES;
        bytes[4] = 1;
        assert_eq!(
            parsed(&bytes).unwrap_err(),
            MessageError::BadField {
                kind: 1,
                field: "dest_qpn"
            }
        );
    }
}
