//! A send WQE as the device holds it once fetched from the ring: what it asks for, its
//! fields, and the requester's progress on it. The ring's block sizes are hw-defs'
//! (`hw_defs::mlx5::{SEND_WQE_BB, SEND_WQE_DS, MAX_WQE_BYTES}`).

use std::net::IpAddr;

use crate::dma::Sge;

/// Where a UD SEND goes: its WQE's datagram segment, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct UdDest {
    /// The destination's address (its GID, IPv4-mapped for an IPv4 peer).
    pub addr: IpAddr,
    /// The destination QP.
    pub qpn: u32,
    /// The Q_Key the destination QP must have.
    pub qkey: u32,
}

/// What a send WQE asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WqeOp {
    Nop,
    Write,
    WriteImm,
    Send,
    SendImm,
    Read,
    CompareSwap,
    FetchAdd,
}

impl WqeOp {
    pub fn is_read_or_atomic(self) -> bool {
        matches!(self, WqeOp::Read | WqeOp::CompareSwap | WqeOp::FetchAdd)
    }
}

/// A send WQE as fetched, plus the requester's progress on it.
#[derive(Clone, Debug)]
pub(crate) struct SendWqe {
    pub op: WqeOp,
    pub mlx5_opcode: u8,
    /// WQE index (BB producer counter & 0xffff) of its first BB.
    pub index: u16,
    pub bbs: u16,
    pub signaled: bool,
    pub solicited: bool,
    pub fence: bool,
    pub imm: u32,
    pub raddr: u64,
    pub rkey: u32,
    pub swap_add: u64,
    pub compare: u64,
    pub sges: Vec<Sge>,
    pub inline: bool,
    pub inline_data: Vec<u8>,
    pub length: u32,
    /// A UD SEND's destination (None on an RC QP, and for a UD NOP).
    pub ud: Option<UdDest>,
    /// A fetch-time fault; reported when the WQE reaches the requester.
    pub fault: Option<u8>,
    // Requester progress.
    pub started: bool,
    pub first_psn: u32,
    pub last_psn: u32,
    /// Messages this QP started before this one (24 bits): the MSN a responder's NAK at one
    /// of its PSNs carries.
    pub msn: u32,
    pub sent_all: bool,
    /// A READ or atomic got its whole response.
    pub done: bool,
}

impl SendWqe {
    pub fn empty(max_sge: usize, max_inline: usize) -> SendWqe {
        SendWqe {
            op: WqeOp::Nop,
            mlx5_opcode: 0,
            index: 0,
            bbs: 1,
            signaled: false,
            solicited: false,
            fence: false,
            imm: 0,
            raddr: 0,
            rkey: 0,
            swap_add: 0,
            compare: 0,
            sges: Vec::with_capacity(max_sge.max(1)),
            inline: false,
            inline_data: Vec::with_capacity(max_inline),
            length: 0,
            ud: None,
            fault: None,
            started: false,
            first_psn: 0,
            last_psn: 0,
            msn: 0,
            sent_all: false,
            done: false,
        }
    }

    /// Packets (PSNs) this WQE occupies at path MTU `mtu`.
    pub fn packets(&self, mtu: u32) -> u32 {
        match self.op {
            WqeOp::Nop => 0,
            WqeOp::CompareSwap | WqeOp::FetchAdd => 1,
            _ => self.length.div_ceil(mtu).max(1),
        }
    }
}
