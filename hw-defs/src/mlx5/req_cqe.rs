//! The send opcode a successful requester CQE carries in the top byte of `sop_drop_qpn`.
//!
//! For `MLX5_CQE_REQ`, libmlx5's `handle_good_req` reads `be32toh(cqe->sop_drop_qpn) >> 24` as
//! the `MLX5_OPCODE_*` of the completed WQE to fill `ibv_wc.opcode` (and, for READ and atomics,
//! `byte_len`). [`super::cqe::CqeRepr`] writes only the QPN there; a device writes the opcode
//! with [`set_req_wqe_opcode`] after the body, before `op_own`.

use super::cqe::{field, SIZE};
use super::ctrl_seg::SendOpcode;
use crate::error::{check_len, Error};

/// Writes `opcode` into the top byte of `sop_drop_qpn` of the CQE in `cqe`, keeping the QPN.
pub fn set_req_wqe_opcode(cqe: &mut [u8], opcode: SendOpcode) -> Result<(), Error> {
    check_len("mlx5 CQE64", cqe, SIZE)?;
    cqe[field::SOP_DROP_QPN.start] = opcode.into();
    Ok(())
}

/// The send opcode a requester CQE carries (meaningful for `MLX5_CQE_REQ` only).
pub fn req_wqe_opcode(cqe: &[u8]) -> Result<SendOpcode, Error> {
    check_len("mlx5 CQE64", cqe, SIZE)?;
    Ok(SendOpcode::from(cqe[field::SOP_DROP_QPN.start]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mlx5::cqe::{Cqe64, CqeOpcode, CqeRepr};

    #[test]
    fn the_opcode_sits_above_the_qpn_and_leaves_it_intact() {
        let mut b = [0u8; 64];
        let repr = CqeRepr {
            opcode: CqeOpcode::Req,
            wqe_counter: 5,
            byte_count: 8,
            imm: 0,
            qpn: 0x00_0123,
            solicited: false,
            timestamp: 0,
        };
        repr.emit(&mut Cqe64::new_unchecked(&mut b[..]), false);
        set_req_wqe_opcode(&mut b, SendOpcode::AtomicFa).unwrap();
        // Written out by hand: sop_drop_qpn = 0x12 << 24 | 0x000123.
        assert_eq!(&b[56..60], &[0x12, 0x00, 0x01, 0x23]);
        assert_eq!(req_wqe_opcode(&b).unwrap(), SendOpcode::AtomicFa);
        assert_eq!(Cqe64::new_checked(&b[..]).unwrap().qpn(), 0x123);
    }

    #[test]
    fn a_short_buffer_is_refused() {
        assert!(set_req_wqe_opcode(&mut [0u8; 63], SendOpcode::Send).is_err());
    }
}
