//! The transport's decoded view of a packet: what the requester, responder and completer act
//! on. `codec` turns wire bytes into a [`Header`] (checking lengths and the ICRC with hw-defs'
//! layouts) and an [`OutHeader`] back into bytes.

use std::ops::Range;

/// What a packet is, by the RC opcode table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Send,
    Write,
    ReadRequest,
    ReadResponse,
    Ack,
    AtomicAck,
    CompareSwap,
    FetchAdd,
    /// A UD SEND (Only, with or without immediate): only a UD QP takes it, its DETH read
    /// from the packet by `crate::ud`.
    UdSend,
}

impl Kind {
    /// Whether a requester sends it (the responder handles it).
    pub fn is_request(self) -> bool {
        matches!(
            self,
            Kind::Send | Kind::Write | Kind::ReadRequest | Kind::CompareSwap | Kind::FetchAdd
        )
    }
}

/// RETH: the remote buffer of a WRITE or READ.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Reth {
    pub va: u64,
    pub rkey: u32,
    pub len: u32,
}

/// AtomicETH.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct AtomicEth {
    pub va: u64,
    pub rkey: u32,
    pub swap_add: u64,
    pub compare: u64,
}

/// DETH: a UD packet's queue key and sending QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Deth {
    pub qkey: u32,
    pub src_qp: u32,
}

/// NAK codes (AETH syndrome 011 + code).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NakCode {
    PsnSequence,
    InvalidRequest,
    RemoteAccess,
    RemoteOperational,
    /// A reserved code: treated as a remote operational error.
    Other(u8),
}

impl NakCode {
    /// Whether the NAK ends the connection (every code but the PSN sequence error).
    pub fn is_fatal(self) -> bool {
        self != NakCode::PsnSequence
    }
}

/// What an AETH says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AckKind {
    /// Positive acknowledgement (credit field ignored: we do not do end-to-end flow control).
    Ack,
    /// Receiver not ready, with the 5-bit timer code.
    Rnr(u8),
    Nak(NakCode),
}

/// A received packet, parsed and ICRC-checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub kind: Kind,
    /// First packet of a message (or only).
    pub first: bool,
    /// Last packet of a message (or only).
    pub last: bool,
    pub solicited: bool,
    pub ack_req: bool,
    pub dest_qpn: u32,
    pub psn: u32,
    pub reth: Option<Reth>,
    pub atomic: Option<AtomicEth>,
    pub aeth: Option<(AckKind, u32)>,
    pub atomic_ack: Option<u64>,
    pub imm: Option<u32>,
    /// Where the payload lies in the packet bytes (pad and ICRC excluded).
    pub payload: Range<usize>,
}

/// A packet to send, before layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OutHeader {
    pub kind: Kind,
    pub first: bool,
    pub last: bool,
    pub solicited: bool,
    pub ack_req: bool,
    pub dest_qpn: u32,
    pub psn: u32,
    pub reth: Option<Reth>,
    pub atomic: Option<AtomicEth>,
    pub aeth: Option<(AckKind, u32)>,
    pub atomic_ack: Option<u64>,
    pub imm: Option<u32>,
    pub payload_len: u32,
}

impl OutHeader {
    pub fn new(kind: Kind, dest_qpn: u32, psn: u32) -> OutHeader {
        OutHeader {
            kind,
            first: true,
            last: true,
            solicited: false,
            ack_req: false,
            dest_qpn,
            psn,
            reth: None,
            atomic: None,
            aeth: None,
            atomic_ack: None,
            imm: None,
            payload_len: 0,
        }
    }
}

/// The RNR timer code's wait (IBA table 45), rounded to microseconds. Code 0 is 655.36 ms.
pub(crate) fn rnr_timer(code: u8) -> std::time::Duration {
    const MICROS: [u32; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560,
        3_840, 5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880,
        163_840, 245_760, 327_680, 491_520,
    ];
    std::time::Duration::from_micros(MICROS[(code & 31) as usize] as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rnr_timer_code_zero_is_the_longest() {
        assert_eq!(rnr_timer(0), Duration::from_micros(655_360));
        assert_eq!(rnr_timer(1), Duration::from_micros(10));
        assert_eq!(rnr_timer(31), Duration::from_micros(491_520));
    }
}
