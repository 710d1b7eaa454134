//! What a CQE says, before the codec lays it out in mlx5 format.

/// What one CQE says, before it is laid out in mlx5 format by the codec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CqeInfo {
    pub kind: CqeKind,
    pub qpn: u32,
    pub wqe_counter: u16,
    pub byte_count: u32,
    pub imm: Option<u32>,
}

/// The kinds of CQE the device writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CqeKind {
    /// A send-queue WQE completed; carries the WQE's mlx5 opcode.
    Requester { wqe_opcode: u8 },
    /// A SEND arrived into a receive WQE.
    RecvSend,
    /// A UD SEND arrived into a receive WQE, after the 40-byte GRH; from QP `src_qp`.
    RecvUd { src_qp: u32 },
    /// A WRITE_WITH_IMM consumed a receive WQE.
    RecvWriteImm,
    /// A send-queue WQE failed or was flushed.
    RequesterError { wqe_opcode: u8, syndrome: u8 },
    /// A receive WQE failed or was flushed.
    ResponderError { syndrome: u8 },
}
