//! mlx5 memory layouts: what the driver and a ConnectX (or the softnic) exchange through host
//! memory. Every struct mirrors `infiniband/mlx5dv.h`; [`abi`] lists them for the
//! `rdma-core-check` test.
//!
//! - send WQEs: [`ctrl_seg`], [`raddr_seg`], [`atomic_seg`], [`data_seg`], [`inline_seg`],
//!   the ring geometry in [`wqe`] and whole WQEs in a ring in [`send_wqe`];
//! - receive WQEs: [`recv_wqe`], and a shared receive queue's in [`srq_wqe`];
//! - completions: [`cqe`], [`req_cqe`] (the send opcode of a requester CQE) and [`err_cqe`]
//!   (syndromes and their `ibv_wc_status`);
//! - doorbell records: [`dbrec`].

pub mod abi;
pub mod atomic_seg;
pub mod cqe;
pub mod ctrl_seg;
pub mod data_seg;
pub mod datagram_seg;
pub mod dbrec;
pub mod err_cqe;
pub mod inline_seg;
pub mod raddr_seg;
pub mod recv_wqe;
pub mod req_cqe;
pub mod send_wqe;
pub mod srq_wqe;
pub mod wqe;

pub use atomic_seg::{AtomicSeg, AtomicSegRepr};
pub use cqe::{Cqe64, CqeOpcode, CqeRepr};
pub use ctrl_seg::{CtrlSeg, CtrlSegRepr, FenceMode, SendOpcode};
pub use data_seg::{DataSeg, DataSegRepr, INVALID_LKEY};
pub use datagram_seg::{DatagramSeg, DatagramSegRepr};
pub use dbrec::{CqDoorbellRecord, DoorbellRecord};
pub use err_cqe::{ErrCqe, ErrCqeRepr, Syndrome};
pub use inline_seg::{InlineData, InlineSeg, INLINE_SEG};
pub use raddr_seg::{RaddrSeg, RaddrSegRepr};
pub use recv_wqe::RecvWqe;
pub use send_wqe::{SendRing, SendWqeRepr, Sges, WqeData};
pub use srq_wqe::SrqNextSeg;
pub use wqe::{MAX_WQE_BYTES, SEND_WQE_BB, SEND_WQE_DS};
