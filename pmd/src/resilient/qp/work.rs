//! How the resilient driver tells work apart: its own WQEs from the application's, sends that
//! consume a receive at the peer, receive completions. A leaf of `resilient`: the QP, its
//! book, its planner and its driver all use it without importing each other for it.

use hw_defs::mlx5::SendOpcode;

use crate::datapath::wr::{WcOpcode, WorkCompletion};

/// wr_id of the driver's own WQEs (probes, fences); their completions are never reported.
const INTERNAL_WR_ID: u64 = u64::MAX;

/// The internal wr_id, for the driver.
pub(super) const fn internal_wr_id() -> u64 {
    INTERNAL_WR_ID
}

/// Whether a send WQE's opcode consumes a receive at the peer.
pub(super) fn two_sided_opcode(opcode: SendOpcode) -> bool {
    matches!(
        opcode,
        SendOpcode::Send | SendOpcode::SendImm | SendOpcode::RdmaWriteImm
    )
}

/// Whether `wc` is a receive completion.
pub(super) fn is_recv(wc: &WorkCompletion) -> bool {
    matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
}
