//! The reliable-connected BTH opcodes, the two unreliable-datagram SENDs, and what each packet
//! carries (IBA 9.2 and 9.3, as rxe's `rxe_opcode` table encodes them).

enum_with_unknown! {
    /// A BTH opcode. The named ones are the RC opcodes railshift speaks (transport RC, bits
    /// 7:5 = 000) and the UD SENDs (bits 7:5 = 011) of softnic's UD QPs; anything else is
    /// `Unknown`.
    pub enum Opcode(u8) {
        /// SEND First.
        SendFirst = 0x00,
        /// SEND Middle.
        SendMiddle = 0x01,
        /// SEND Last.
        SendLast = 0x02,
        /// SEND Last with Immediate.
        SendLastWithImmediate = 0x03,
        /// SEND Only.
        SendOnly = 0x04,
        /// SEND Only with Immediate.
        SendOnlyWithImmediate = 0x05,
        /// RDMA WRITE First.
        RdmaWriteFirst = 0x06,
        /// RDMA WRITE Middle.
        RdmaWriteMiddle = 0x07,
        /// RDMA WRITE Last.
        RdmaWriteLast = 0x08,
        /// RDMA WRITE Last with Immediate.
        RdmaWriteLastWithImmediate = 0x09,
        /// RDMA WRITE Only.
        RdmaWriteOnly = 0x0a,
        /// RDMA WRITE Only with Immediate.
        RdmaWriteOnlyWithImmediate = 0x0b,
        /// RDMA READ Request.
        RdmaReadRequest = 0x0c,
        /// RDMA READ response First.
        RdmaReadResponseFirst = 0x0d,
        /// RDMA READ response Middle.
        RdmaReadResponseMiddle = 0x0e,
        /// RDMA READ response Last.
        RdmaReadResponseLast = 0x0f,
        /// RDMA READ response Only.
        RdmaReadResponseOnly = 0x10,
        /// Acknowledge.
        Acknowledge = 0x11,
        /// ATOMIC Acknowledge.
        AtomicAcknowledge = 0x12,
        /// CmpSwap.
        CompareSwap = 0x13,
        /// FetchAdd.
        FetchAdd = 0x14,
        /// UD SEND Only.
        UdSendOnly = 0x64,
        /// UD SEND Only with Immediate.
        UdSendOnlyWithImmediate = 0x65,
    }
}

/// The operation a packet belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// A SEND (consumes a receive WQE at the responder).
    Send,
    /// An RDMA WRITE.
    RdmaWrite,
    /// An RDMA READ request.
    RdmaReadRequest,
    /// An RDMA READ response.
    RdmaReadResponse,
    /// An ACK or NAK.
    Acknowledge,
    /// The response to an atomic.
    AtomicAcknowledge,
    /// A compare-and-swap request.
    CompareSwap,
    /// A fetch-and-add request.
    FetchAdd,
}

/// Where a packet sits in its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    /// The first packet of a multi-packet message.
    First,
    /// A packet between the first and the last.
    Middle,
    /// The last packet of a multi-packet message.
    Last,
    /// A message of one packet (every request that is not segmented, and every ACK).
    Only,
}

/// What a packet with a given opcode carries after the BTH, in wire order: RETH, AtomicETH,
/// AETH, AtomicAckETH, ImmDt, then payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OpcodeInfo {
    /// The name as the IBA spec and Wireshark spell it.
    pub name: &'static str,
    /// The operation.
    pub operation: Operation,
    /// The position in the message.
    pub position: Position,
    /// Carries a RETH.
    pub reth: bool,
    /// Carries an AtomicETH.
    pub atomic_eth: bool,
    /// Carries a DETH (the UD opcodes; it comes right after the BTH).
    pub deth: bool,
    /// Carries an AETH.
    pub aeth: bool,
    /// Carries an AtomicAckETH.
    pub atomic_ack_eth: bool,
    /// Carries ImmDt.
    pub immdt: bool,
    /// Carries payload.
    pub payload: bool,
}

const fn info(
    name: &'static str,
    operation: Operation,
    position: Position,
    headers: (bool, bool, bool, bool, bool),
    payload: bool,
) -> OpcodeInfo {
    let (reth, atomic_eth, aeth, atomic_ack_eth, immdt) = headers;
    OpcodeInfo {
        name,
        operation,
        position,
        reth,
        atomic_eth,
        deth: false,
        aeth,
        atomic_ack_eth,
        immdt,
        payload,
    }
}

use Operation as Op;
use Position as Pos;

// (RETH, AtomicETH, AETH, AtomicAckETH, ImmDt)
const NONE: (bool, bool, bool, bool, bool) = (false, false, false, false, false);
const RETH: (bool, bool, bool, bool, bool) = (true, false, false, false, false);
const IMM: (bool, bool, bool, bool, bool) = (false, false, false, false, true);
const RETH_IMM: (bool, bool, bool, bool, bool) = (true, false, false, false, true);
const AETH: (bool, bool, bool, bool, bool) = (false, false, true, false, false);
const AETH_ATOMIC_ACK: (bool, bool, bool, bool, bool) = (false, false, true, true, false);
const ATOMIC: (bool, bool, bool, bool, bool) = (false, true, false, false, false);

/// The table, indexed by opcode 0x00..=0x14.
static TABLE: [OpcodeInfo; 21] = [
    info("SEND First", Op::Send, Pos::First, NONE, true),
    info("SEND Middle", Op::Send, Pos::Middle, NONE, true),
    info("SEND Last", Op::Send, Pos::Last, NONE, true),
    info("SEND Last with Immediate", Op::Send, Pos::Last, IMM, true),
    info("SEND Only", Op::Send, Pos::Only, NONE, true),
    info("SEND Only with Immediate", Op::Send, Pos::Only, IMM, true),
    info("RDMA WRITE First", Op::RdmaWrite, Pos::First, RETH, true),
    info("RDMA WRITE Middle", Op::RdmaWrite, Pos::Middle, NONE, true),
    info("RDMA WRITE Last", Op::RdmaWrite, Pos::Last, NONE, true),
    info(
        "RDMA WRITE Last with Immediate",
        Op::RdmaWrite,
        Pos::Last,
        IMM,
        true,
    ),
    info("RDMA WRITE Only", Op::RdmaWrite, Pos::Only, RETH, true),
    info(
        "RDMA WRITE Only with Immediate",
        Op::RdmaWrite,
        Pos::Only,
        RETH_IMM,
        true,
    ),
    info(
        "RDMA READ Request",
        Op::RdmaReadRequest,
        Pos::Only,
        RETH,
        false,
    ),
    info(
        "RDMA READ response First",
        Op::RdmaReadResponse,
        Pos::First,
        AETH,
        true,
    ),
    info(
        "RDMA READ response Middle",
        Op::RdmaReadResponse,
        Pos::Middle,
        NONE,
        true,
    ),
    info(
        "RDMA READ response Last",
        Op::RdmaReadResponse,
        Pos::Last,
        AETH,
        true,
    ),
    info(
        "RDMA READ response Only",
        Op::RdmaReadResponse,
        Pos::Only,
        AETH,
        true,
    ),
    info("Acknowledge", Op::Acknowledge, Pos::Only, AETH, false),
    info(
        "Atomic Acknowledge",
        Op::AtomicAcknowledge,
        Pos::Only,
        AETH_ATOMIC_ACK,
        false,
    ),
    info("CmpSwap", Op::CompareSwap, Pos::Only, ATOMIC, false),
    info("FetchAdd", Op::FetchAdd, Pos::Only, ATOMIC, false),
];

/// The UD SENDs: a DETH after the BTH, then ImmDt if any, then payload; one packet each.
static UD_SEND_ONLY: OpcodeInfo = OpcodeInfo {
    deth: true,
    ..info("UD SEND Only", Op::Send, Pos::Only, NONE, true)
};
static UD_SEND_ONLY_WITH_IMMEDIATE: OpcodeInfo = OpcodeInfo {
    deth: true,
    ..info(
        "UD SEND Only with Immediate",
        Op::Send,
        Pos::Only,
        IMM,
        true,
    )
};

impl Opcode {
    /// What the opcode carries; `None` for an unknown opcode.
    pub fn info(self) -> Option<&'static OpcodeInfo> {
        match self {
            Opcode::Unknown(_) => None,
            Opcode::UdSendOnly => Some(&UD_SEND_ONLY),
            Opcode::UdSendOnlyWithImmediate => Some(&UD_SEND_ONLY_WITH_IMMEDIATE),
            known => TABLE.get(usize::from(u8::from(known))),
        }
    }

    /// The name, or "unknown".
    pub fn name(self) -> &'static str {
        self.info().map_or("unknown", |i| i.name)
    }

    /// The operation, if known.
    pub fn operation(self) -> Option<Operation> {
        self.info().map(|i| i.operation)
    }

    /// The position in the message, if known.
    pub fn position(self) -> Option<Position> {
        self.info().map(|i| i.position)
    }

    fn has(self, pick: fn(&OpcodeInfo) -> bool) -> bool {
        self.info().is_some_and(pick)
    }

    /// Carries a RETH.
    pub fn has_reth(self) -> bool {
        self.has(|i| i.reth)
    }

    /// Carries an AtomicETH.
    pub fn has_atomic_eth(self) -> bool {
        self.has(|i| i.atomic_eth)
    }

    /// Carries a DETH (an unreliable datagram).
    pub fn has_deth(self) -> bool {
        self.has(|i| i.deth)
    }

    /// Carries an AETH.
    pub fn has_aeth(self) -> bool {
        self.has(|i| i.aeth)
    }

    /// Carries an AtomicAckETH.
    pub fn has_atomic_ack_eth(self) -> bool {
        self.has(|i| i.atomic_ack_eth)
    }

    /// Carries ImmDt.
    pub fn has_immediate(self) -> bool {
        self.has(|i| i.immdt)
    }

    /// Carries payload.
    pub fn has_payload(self) -> bool {
        self.has(|i| i.payload)
    }

    /// First packet of a multi-packet message.
    pub fn is_first(self) -> bool {
        self.position() == Some(Position::First)
    }

    /// Middle packet of a multi-packet message.
    pub fn is_middle(self) -> bool {
        self.position() == Some(Position::Middle)
    }

    /// Last packet of a multi-packet message.
    pub fn is_last(self) -> bool {
        self.position() == Some(Position::Last)
    }

    /// The only packet of its message.
    pub fn is_only(self) -> bool {
        self.position() == Some(Position::Only)
    }

    /// Starts a message (First or Only).
    pub fn starts_message(self) -> bool {
        matches!(self.position(), Some(Position::First | Position::Only))
    }

    /// Ends a message (Last or Only).
    pub fn ends_message(self) -> bool {
        matches!(self.position(), Some(Position::Last | Position::Only))
    }

    /// Sent by the requester (SEND, WRITE, READ request, atomics); the rest are responses.
    pub fn is_request(self) -> bool {
        matches!(
            self.operation(),
            Some(
                Operation::Send
                    | Operation::RdmaWrite
                    | Operation::RdmaReadRequest
                    | Operation::CompareSwap
                    | Operation::FetchAdd
            )
        )
    }

    /// Sent by the responder (READ responses, ACK, ATOMIC ACK).
    pub fn is_response(self) -> bool {
        matches!(
            self.operation(),
            Some(
                Operation::RdmaReadResponse | Operation::Acknowledge | Operation::AtomicAcknowledge
            )
        )
    }

    /// An RDMA READ response of any position.
    pub fn is_read_response(self) -> bool {
        self.operation() == Some(Operation::RdmaReadResponse)
    }

    /// An atomic request (CmpSwap or FetchAdd).
    pub fn is_atomic(self) -> bool {
        matches!(
            self.operation(),
            Some(Operation::CompareSwap | Operation::FetchAdd)
        )
    }

    /// The message consumes a receive WQE at the responder: every SEND packet, and the
    /// RDMA WRITE packets that carry an immediate.
    pub fn needs_recv_wqe(self) -> bool {
        self.operation() == Some(Operation::Send)
            || (self.operation() == Some(Operation::RdmaWrite) && self.has_immediate())
    }

    /// This packet is where the responder takes the receive WQE: the first packet of a SEND,
    /// the last (or only) packet of a WRITE with immediate (rxe's `RXE_RWR_MASK`).
    pub fn takes_recv_wqe(self) -> bool {
        match self.operation() {
            Some(Operation::Send) => self.starts_message(),
            Some(Operation::RdmaWrite) => self.has_immediate(),
            _ => false,
        }
    }

    /// This packet completes the receive WQE (a responder CQE follows): the last or only
    /// packet of a SEND, and the WRITEs with immediate (rxe's `RXE_COMP_MASK`).
    pub fn completes_recv_wqe(self) -> bool {
        self.needs_recv_wqe() && self.ends_message()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_rows_sit_at_their_opcode() {
        for value in 0u8..=0x14 {
            let opcode = Opcode::from(value);
            assert_ne!(opcode, Opcode::Unknown(value), "{value:#x} is named");
            assert!(opcode.info().is_some());
        }
        assert_eq!(Opcode::from(0x15), Opcode::Unknown(0x15));
        assert_eq!(Opcode::from(0x64), Opcode::UdSendOnly);
        assert_eq!(Opcode::from(0x65), Opcode::UdSendOnlyWithImmediate);
        assert_eq!(Opcode::UdSendOnly.name(), "UD SEND Only");
        // Only the two UD SENDs: the rest of UD (0x60..=0x7f) and the other transports are
        // not spoken.
        assert_eq!(Opcode::from(0x66), Opcode::Unknown(0x66));
        assert_eq!(Opcode::Unknown(0x64).info(), None);
        assert_eq!(Opcode::Unknown(0x64).header_len(), 0);
    }

    #[test]
    fn header_lengths_follow_the_spec() {
        assert_eq!(Opcode::SendOnly.header_len(), 12);
        assert_eq!(Opcode::SendOnlyWithImmediate.header_len(), 16);
        assert_eq!(Opcode::RdmaWriteFirst.header_len(), 28);
        assert_eq!(Opcode::RdmaWriteOnlyWithImmediate.header_len(), 32);
        assert_eq!(Opcode::RdmaReadRequest.header_len(), 28);
        assert_eq!(Opcode::RdmaReadResponseMiddle.header_len(), 12);
        assert_eq!(Opcode::RdmaReadResponseOnly.header_len(), 16);
        assert_eq!(Opcode::Acknowledge.header_len(), 16);
        assert_eq!(Opcode::AtomicAcknowledge.header_len(), 24);
        assert_eq!(Opcode::CompareSwap.header_len(), 40);
        assert_eq!(Opcode::FetchAdd.header_len(), 40);
        assert_eq!(Opcode::UdSendOnly.header_len(), 20);
        assert_eq!(Opcode::UdSendOnlyWithImmediate.header_len(), 24);
        assert!(Opcode::UdSendOnly.has_deth() && !Opcode::SendOnly.has_deth());
        assert!(Opcode::UdSendOnly.takes_recv_wqe() && Opcode::UdSendOnly.completes_recv_wqe());
    }

    #[test]
    fn receive_wqe_use_matches_rxe() {
        use Opcode::*;
        let takes: Vec<Opcode> = (0u8..=0x14)
            .map(Opcode::from)
            .filter(|o| o.takes_recv_wqe())
            .collect();
        assert_eq!(
            takes,
            vec![
                SendFirst,
                SendOnly,
                SendOnlyWithImmediate,
                RdmaWriteLastWithImmediate,
                RdmaWriteOnlyWithImmediate
            ]
        );
        let completes: Vec<Opcode> = (0u8..=0x14)
            .map(Opcode::from)
            .filter(|o| o.completes_recv_wqe())
            .collect();
        assert_eq!(
            completes,
            vec![
                SendLast,
                SendLastWithImmediate,
                SendOnly,
                SendOnlyWithImmediate,
                RdmaWriteLastWithImmediate,
                RdmaWriteOnlyWithImmediate
            ]
        );
        assert!(SendMiddle.needs_recv_wqe() && !SendMiddle.takes_recv_wqe());
        assert!(!RdmaWriteOnly.needs_recv_wqe());
    }

    #[test]
    fn requests_and_responses_split_the_table() {
        for value in 0u8..=0x14 {
            let opcode = Opcode::from(value);
            assert!(
                opcode.is_request() != opcode.is_response(),
                "{}",
                opcode.name()
            );
        }
        assert!(Opcode::RdmaReadResponseLast.is_read_response());
        assert!(Opcode::FetchAdd.is_atomic() && !Opcode::AtomicAcknowledge.is_atomic());
    }

    #[test]
    fn positions_mark_message_boundaries() {
        assert!(Opcode::SendFirst.starts_message() && !Opcode::SendFirst.ends_message());
        assert!(Opcode::RdmaWriteMiddle.is_middle());
        assert!(Opcode::RdmaReadResponseLast.ends_message());
        assert!(Opcode::Acknowledge.is_only());
        assert!(!Opcode::Unknown(0x20).starts_message());
    }
}
