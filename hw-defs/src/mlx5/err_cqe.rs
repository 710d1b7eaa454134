//! The error CQE (`struct mlx5_err_cqe`): the same 64 bytes as a CQE, with the syndrome that
//! says what went wrong, and the mapping from syndrome to libibverbs' work-completion status.

use super::cqe::{self, CqeOpcode};
use crate::bytes::{be_u16, be_u32, put_be_u16, put_be_u32};
use crate::error::Error;
use crate::verbs::WcStatus;

/// Byte ranges of the error CQE, named as `mlx5dv.h` names them.
pub(crate) mod field {
    use core::ops::Range;
    pub const SRQN: Range<usize> = 32..36;
    pub const VENDOR_ERR_SYND: usize = 54;
    pub const SYNDROME: usize = 55;
    /// `wqe_opcode[31:24] qpn[23:0]`: the opcode of the failed WQE and the QP number.
    pub const S_WQE_OPCODE_QPN: Range<usize> = 56..60;
    pub const WQE_COUNTER: Range<usize> = 60..62;
    pub const SIGNATURE: usize = 62;
    pub const OP_OWN: usize = 63;
}

/// Size of an error CQE in bytes.
pub const SIZE: usize = 64;

const QPN_MASK: u32 = 0x00ff_ffff;

enum_with_unknown! {
    /// An error CQE syndrome (`MLX5_CQE_SYNDROME_*`).
    pub enum Syndrome(u8) {
        /// `MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR`.
        LocalLengthErr = 0x01,
        /// `MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR`.
        LocalQpOpErr = 0x02,
        /// `MLX5_CQE_SYNDROME_LOCAL_PROT_ERR`.
        LocalProtErr = 0x04,
        /// `MLX5_CQE_SYNDROME_WR_FLUSH_ERR`.
        WrFlushErr = 0x05,
        /// `MLX5_CQE_SYNDROME_MW_BIND_ERR`.
        MwBindErr = 0x06,
        /// `MLX5_CQE_SYNDROME_BAD_RESP_ERR`.
        BadRespErr = 0x10,
        /// `MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR`.
        LocalAccessErr = 0x11,
        /// `MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR`.
        RemoteInvalReqErr = 0x12,
        /// `MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR`.
        RemoteAccessErr = 0x13,
        /// `MLX5_CQE_SYNDROME_REMOTE_OP_ERR`.
        RemoteOpErr = 0x14,
        /// `MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR`.
        TransportRetryExcErr = 0x15,
        /// `MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR`.
        RnrRetryExcErr = 0x16,
        /// `MLX5_CQE_SYNDROME_REMOTE_ABORTED_ERR`.
        RemoteAbortedErr = 0x22,
    }
}

impl Syndrome {
    /// The work-completion status libmlx5 reports for this syndrome. A syndrome it does not
    /// know becomes `IBV_WC_GENERAL_ERR`, as in libmlx5's `mlx5_handle_error_cqe`; the raw
    /// byte stays available in the CQE (and the vendor syndrome beside it).
    pub fn wc_status(self) -> WcStatus {
        match self {
            Syndrome::LocalLengthErr => WcStatus::LocLenErr,
            Syndrome::LocalQpOpErr => WcStatus::LocQpOpErr,
            Syndrome::LocalProtErr => WcStatus::LocProtErr,
            Syndrome::WrFlushErr => WcStatus::WrFlushErr,
            Syndrome::MwBindErr => WcStatus::MwBindErr,
            Syndrome::BadRespErr => WcStatus::BadRespErr,
            Syndrome::LocalAccessErr => WcStatus::LocAccessErr,
            Syndrome::RemoteInvalReqErr => WcStatus::RemInvReqErr,
            Syndrome::RemoteAccessErr => WcStatus::RemAccessErr,
            Syndrome::RemoteOpErr => WcStatus::RemOpErr,
            Syndrome::TransportRetryExcErr => WcStatus::RetryExcErr,
            Syndrome::RnrRetryExcErr => WcStatus::RnrRetryExcErr,
            Syndrome::RemoteAbortedErr => WcStatus::RemAbortErr,
            Syndrome::Unknown(_) => WcStatus::GeneralErr,
        }
    }

    /// The syndrome a device writes for a work-completion status: the inverse of
    /// [`Syndrome::wc_status`] where there is one. Statuses mlx5 has no syndrome for
    /// (`GENERAL_ERR` among them) give `None`.
    pub fn for_wc_status(status: WcStatus) -> Option<Syndrome> {
        Some(match status {
            WcStatus::LocLenErr => Syndrome::LocalLengthErr,
            WcStatus::LocQpOpErr => Syndrome::LocalQpOpErr,
            WcStatus::LocProtErr => Syndrome::LocalProtErr,
            WcStatus::WrFlushErr => Syndrome::WrFlushErr,
            WcStatus::MwBindErr => Syndrome::MwBindErr,
            WcStatus::BadRespErr => Syndrome::BadRespErr,
            WcStatus::LocAccessErr => Syndrome::LocalAccessErr,
            WcStatus::RemInvReqErr => Syndrome::RemoteInvalReqErr,
            WcStatus::RemAccessErr => Syndrome::RemoteAccessErr,
            WcStatus::RemOpErr => Syndrome::RemoteOpErr,
            WcStatus::RetryExcErr => Syndrome::TransportRetryExcErr,
            WcStatus::RnrRetryExcErr => Syndrome::RnrRetryExcErr,
            WcStatus::RemAbortErr => Syndrome::RemoteAbortedErr,
            _ => return None,
        })
    }
}

fixed_view!(
    /// A view of an error CQE over a byte buffer.
    ErrCqe,
    SIZE,
    "mlx5 error CQE"
);

impl<T: AsRef<[u8]>> ErrCqe<T> {
    /// The raw `op_own` byte.
    pub fn op_own(&self) -> u8 {
        self.buffer.as_ref()[field::OP_OWN]
    }

    /// The CQE opcode (REQ_ERR or RESP_ERR for an error CQE).
    pub fn opcode(&self) -> CqeOpcode {
        CqeOpcode::from(self.op_own() >> cqe::OPCODE_SHIFT)
    }

    /// The syndrome.
    pub fn syndrome(&self) -> Syndrome {
        Syndrome::from(self.buffer.as_ref()[field::SYNDROME])
    }

    /// The vendor syndrome.
    pub fn vendor_err_synd(&self) -> u8 {
        self.buffer.as_ref()[field::VENDOR_ERR_SYND]
    }

    /// The send opcode of the failed WQE (requester errors).
    pub fn wqe_opcode(&self) -> u8 {
        (be_u32(&self.buffer.as_ref()[field::S_WQE_OPCODE_QPN]) >> 24) as u8
    }

    /// The QP number (24 bits).
    pub fn qpn(&self) -> u32 {
        be_u32(&self.buffer.as_ref()[field::S_WQE_OPCODE_QPN]) & QPN_MASK
    }

    /// The WQE counter of the failed WQE.
    pub fn wqe_counter(&self) -> u16 {
        be_u16(&self.buffer.as_ref()[field::WQE_COUNTER])
    }

    /// The SRQ number.
    pub fn srqn(&self) -> u32 {
        be_u32(&self.buffer.as_ref()[field::SRQN])
    }

    /// The signature byte.
    pub fn signature(&self) -> u8 {
        self.buffer.as_ref()[field::SIGNATURE]
    }
}

/// A parsed error CQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ErrCqeRepr {
    /// REQ_ERR (a send WQE failed) or RESP_ERR (a receive WQE failed).
    pub opcode: CqeOpcode,
    /// The syndrome.
    pub syndrome: Syndrome,
    /// The vendor syndrome.
    pub vendor_syndrome: u8,
    /// The send opcode of the failed WQE.
    pub wqe_opcode: u8,
    /// The QP number.
    pub qpn: u32,
    /// The WQE counter of the failed WQE.
    pub wqe_counter: u16,
}

impl ErrCqeRepr {
    /// Parses an error CQE; other opcodes are refused.
    pub fn parse<T: AsRef<[u8]>>(cqe: &ErrCqe<T>) -> Result<Self, Error> {
        cqe.check_len()?;
        let opcode = cqe.opcode();
        if !opcode.is_error() {
            return Err(Error::BadField {
                layout: "mlx5 error CQE",
                field: "op_own",
                value: u64::from(cqe.op_own()),
                expected: "opcode REQ_ERR (13) or RESP_ERR (14)",
            });
        }
        Ok(ErrCqeRepr {
            opcode,
            syndrome: cqe.syndrome(),
            vendor_syndrome: cqe.vendor_err_synd(),
            wqe_opcode: cqe.wqe_opcode(),
            qpn: cqe.qpn(),
            wqe_counter: cqe.wqe_counter(),
        })
    }

    /// The work-completion status this error reports.
    pub fn wc_status(&self) -> WcStatus {
        self.syndrome.wc_status()
    }

    /// Writes every byte but `op_own` (the rest zero); see [`cqe::CqeRepr::emit_body`].
    pub fn emit_body<T: AsRef<[u8]> + AsMut<[u8]>>(&self, cqe: &mut ErrCqe<T>) {
        let b = cqe.buffer.as_mut();
        b[..field::OP_OWN].fill(0);
        b[field::SYNDROME] = self.syndrome.into();
        b[field::VENDOR_ERR_SYND] = self.vendor_syndrome;
        put_be_u32(
            &mut b[field::S_WQE_OPCODE_QPN],
            (u32::from(self.wqe_opcode) << 24) | (self.qpn & QPN_MASK),
        );
        put_be_u16(&mut b[field::WQE_COUNTER], self.wqe_counter);
    }

    /// The `op_own` byte for this CQE with owner bit `owner`.
    pub fn op_own(&self, owner: bool) -> u8 {
        cqe::op_own(self.opcode, false, owner)
    }

    /// Writes the whole CQE, `op_own` last.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, cqe: &mut ErrCqe<T>, owner: bool) {
        self.emit_body(cqe);
        cqe.buffer.as_mut()[field::OP_OWN] = self.op_own(owner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A requester error: RDMA_WRITE (0x08) WQE 0x0042 on QP 0x000abc exhausted its transport
    /// retries (syndrome 0x15, vendor syndrome 0x81), first lap. Written out by hand.
    fn golden() -> [u8; 64] {
        let mut b = [0u8; 64];
        b[54] = 0x81; // vendor_err_synd
        b[55] = 0x15; // syndrome
        b[56..60].copy_from_slice(&[0x08, 0x00, 0x0a, 0xbc]); // s_wqe_opcode_qpn
        b[60..62].copy_from_slice(&[0x00, 0x42]); // wqe_counter
        b[63] = 0xd0; // REQ_ERR << 4, owner 0
        b
    }

    fn golden_repr() -> ErrCqeRepr {
        ErrCqeRepr {
            opcode: CqeOpcode::ReqErr,
            syndrome: Syndrome::TransportRetryExcErr,
            vendor_syndrome: 0x81,
            wqe_opcode: 0x08,
            qpn: 0xabc,
            wqe_counter: 0x42,
        }
    }

    #[test]
    fn golden_bytes_parse_to_the_fields_written() {
        let bytes = golden();
        let repr = ErrCqeRepr::parse(&ErrCqe::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(repr, golden_repr());
        assert_eq!(repr.wc_status(), WcStatus::RetryExcErr);
    }

    #[test]
    fn repr_emits_the_golden_bytes() {
        let mut buf = [0x5au8; 64];
        golden_repr().emit(&mut ErrCqe::new_unchecked(&mut buf[..]), false);
        assert_eq!(buf, golden());
    }

    #[test]
    fn syndromes_map_to_libibverbs_statuses_as_libmlx5_does() {
        assert_eq!(Syndrome::from(0x15).wc_status(), WcStatus::RetryExcErr);
        assert_eq!(u8::from(Syndrome::from(0x15).wc_status()), 12);
        assert_eq!(Syndrome::from(0x13).wc_status(), WcStatus::RemAccessErr);
        assert_eq!(u8::from(Syndrome::from(0x13).wc_status()), 10);
        assert_eq!(Syndrome::from(0x05).wc_status(), WcStatus::WrFlushErr);
        assert_eq!(u8::from(Syndrome::from(0x05).wc_status()), 5);
        assert_eq!(Syndrome::from(0x16).wc_status(), WcStatus::RnrRetryExcErr);
        assert_eq!(Syndrome::from(0x04).wc_status(), WcStatus::LocProtErr);
        assert_eq!(Syndrome::from(0x22).wc_status(), WcStatus::RemAbortErr);
    }

    #[test]
    fn unknown_syndromes_report_general_error() {
        assert_eq!(Syndrome::from(0x93), Syndrome::Unknown(0x93));
        assert_eq!(Syndrome::from(0x93).wc_status(), WcStatus::GeneralErr);
        assert_eq!(Syndrome::from(0x00).wc_status(), WcStatus::GeneralErr);
    }

    #[test]
    fn every_named_syndrome_round_trips_through_its_status() {
        for raw in 0..=u8::MAX {
            let syndrome = Syndrome::from(raw);
            if let Syndrome::Unknown(_) = syndrome {
                continue;
            }
            assert_eq!(
                Syndrome::for_wc_status(syndrome.wc_status()),
                Some(syndrome)
            );
        }
        assert_eq!(Syndrome::for_wc_status(WcStatus::GeneralErr), None);
        assert_eq!(Syndrome::for_wc_status(WcStatus::Success), None);
    }

    #[test]
    fn a_success_cqe_is_not_parsed_as_an_error() {
        let mut bytes = golden();
        bytes[63] = 0x00;
        assert!(ErrCqeRepr::parse(&ErrCqe::new_unchecked(&bytes[..])).is_err());
    }
}
