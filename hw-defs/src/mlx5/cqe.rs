//! The 64-byte completion-queue entry (`struct mlx5_cqe64`) and the owner-bit protocol.
//!
//! The last byte, `op_own`, is `opcode[7:4] format[3:2] solicited[1] owner[0]`. The device
//! writes CQEs around a power-of-two ring; the owner bit it writes is the lap parity of the
//! producer index, so software owns the CQE at consumer index `ci` when its opcode is not
//! INVALID and its owner bit equals `ci & cqe_count != 0` (libmlx5's `get_sw_cqe`). A device
//! writes the body first and `op_own` last, after a release barrier; that is why the
//! [`CqeRepr`] writer separates them.

use crate::bytes::{be_u16, be_u32, be_u64, put_be_u16, put_be_u32, put_be_u64};
use crate::error::Error;

/// Byte ranges of the CQE, named as `mlx5dv.h` names them.
pub(crate) mod field {
    use core::ops::Range;
    pub const WQE_ID: Range<usize> = 2..4;
    pub const ML_PATH: usize = 17;
    pub const SLID: Range<usize> = 22..24;
    /// `flags[31:24]` remote (source) `QPN[23:0]`.
    pub const FLAGS_RQPN: Range<usize> = 24..28;
    pub const HDS_IP_EXT: usize = 28;
    pub const L4_HDR_TYPE_ETC: usize = 29;
    pub const VLAN_INFO: Range<usize> = 30..32;
    pub const SRQN_UIDX: Range<usize> = 32..36;
    /// The immediate (or invalidated rkey, or P_Key), in network order.
    pub const IMM_INVAL_PKEY: Range<usize> = 36..40;
    pub const APP: usize = 40;
    pub const APP_OP: usize = 41;
    pub const APP_INFO: Range<usize> = 42..44;
    pub const BYTE_CNT: Range<usize> = 44..48;
    pub const TIMESTAMP: Range<usize> = 48..56;
    /// `sop[31:24] qpn[23:0]` (start-of-packet and drop bits above the QPN).
    pub const SOP_DROP_QPN: Range<usize> = 56..60;
    pub const WQE_COUNTER: Range<usize> = 60..62;
    pub const SIGNATURE: usize = 62;
    /// `opcode[7:4] format[3:2] solicited[1] owner[0]`.
    pub const OP_OWN: usize = 63;
}

/// Size of a CQE in bytes.
pub const SIZE: usize = 64;
/// Offset of the `op_own` byte, the one a device writes last.
pub const OP_OWN_OFFSET: usize = field::OP_OWN;
/// Offset of `sop_drop_qpn` (the completed WQE's opcode in a requester CQE, then the QPN),
/// for a poller that reads the word whole.
pub const SOP_DROP_QPN_OFFSET: usize = field::SOP_DROP_QPN.start;
/// Offset of `wqe_counter` (big-endian), for a poller that reads it whole.
pub const WQE_COUNTER_OFFSET: usize = field::WQE_COUNTER.start;
/// `MLX5_CQE_OWNER_MASK`.
pub const OWNER_MASK: u8 = 1;
/// Where the opcode sits in `op_own` (its top nibble).
pub const OPCODE_SHIFT: u8 = 4;
/// `MLX5_CQE_INVALID`, the opcode of a CQE the device has not written yet
/// ([`CqeOpcode::Invalid`]).
pub const OPCODE_INVALID: u8 = 15;

/// The QP number's 24 bits in `sop_drop_qpn`.
pub const QPN_MASK: u32 = 0x00ff_ffff;
/// `flags_rqpn` bits 29:28, the received packet's L3 header type on a UD QP's receive: not
/// zero when the receive buffer starts with the 40-byte GRH (libmlx5 then sets `IBV_WC_GRH`).
pub const FLAGS_GRH_MASK: u32 = 3 << 28;
/// The GRH value of [`FLAGS_GRH_MASK`] a device writes when it delivered a GRH.
pub const FLAGS_GRH: u32 = 1 << 28;

enum_with_unknown! {
    /// A CQE opcode, the top nibble of `op_own` (`MLX5_CQE_*`).
    pub enum CqeOpcode(u8) {
        /// `MLX5_CQE_REQ`: a send WQE completed.
        Req = 0,
        /// `MLX5_CQE_RESP_WR_IMM`: an RDMA WRITE with immediate consumed a receive WQE.
        RespWrImm = 1,
        /// `MLX5_CQE_RESP_SEND`: a SEND consumed a receive WQE.
        RespSend = 2,
        /// `MLX5_CQE_RESP_SEND_IMM`: a SEND with immediate consumed a receive WQE.
        RespSendImm = 3,
        /// `MLX5_CQE_RESP_SEND_INV`: a SEND with invalidate consumed a receive WQE (the
        /// invalidated rkey is where an immediate would be).
        RespSendInv = 4,
        /// `MLX5_CQE_REQ_ERR`: a send WQE completed in error (see [`super::err_cqe`]).
        ReqErr = 13,
        /// `MLX5_CQE_RESP_ERR`: a receive WQE completed in error.
        RespErr = 14,
        /// `MLX5_CQE_INVALID`: what a CQE the device has not written yet holds.
        Invalid = 15,
    }
}

impl CqeOpcode {
    /// Whether this is an error CQE (laid out as `struct mlx5_err_cqe`).
    pub fn is_error(self) -> bool {
        matches!(self, CqeOpcode::ReqErr | CqeOpcode::RespErr)
    }

    /// Whether the CQE completes a receive WQE.
    pub fn is_responder(self) -> bool {
        matches!(
            self,
            CqeOpcode::RespWrImm
                | CqeOpcode::RespSend
                | CqeOpcode::RespSendImm
                | CqeOpcode::RespSendInv
                | CqeOpcode::RespErr
        )
    }
}

/// The owner bit software expects at ring index `index` of a ring of `cqe_count` entries
/// (a power of two): the parity of the lap.
pub const fn sw_owner_bit(index: u32, cqe_count: u32) -> bool {
    index & cqe_count != 0
}

/// libmlx5's ownership test: whether the CQE whose last byte is `op_own`, found at consumer
/// index `ci` of a ring of `cqe_count` entries, belongs to software.
pub const fn is_sw_owned(op_own: u8, ci: u32, cqe_count: u32) -> bool {
    (op_own >> OPCODE_SHIFT) != OPCODE_INVALID
        && ((op_own & OWNER_MASK) != 0) == sw_owner_bit(ci, cqe_count)
}

/// The byte offset of the CQE at consumer index `ci` in a ring of `cqe_count` entries.
pub const fn cqe_offset(ci: u32, cqe_count: u32) -> usize {
    ((ci & cqe_count.wrapping_sub(1)) as usize) * SIZE
}

/// The `op_own` byte for a CQE (format 0: no compression).
pub fn op_own(opcode: CqeOpcode, solicited: bool, owner: bool) -> u8 {
    (u8::from(opcode) << OPCODE_SHIFT) | (u8::from(solicited) << 1) | u8::from(owner)
}

fixed_view!(
    /// A view of a CQE over a byte buffer.
    Cqe64,
    SIZE,
    "mlx5 CQE64"
);

impl<T: AsRef<[u8]>> Cqe64<T> {
    /// The raw `op_own` byte.
    pub fn op_own(&self) -> u8 {
        self.buffer.as_ref()[field::OP_OWN]
    }

    /// The opcode.
    pub fn opcode(&self) -> CqeOpcode {
        CqeOpcode::from(self.op_own() >> OPCODE_SHIFT)
    }

    /// The CQE format (0 for a plain CQE, 3 for a compressed block).
    pub fn format(&self) -> u8 {
        (self.op_own() >> 2) & 0x3
    }

    /// Whether the completed message had the solicited-event bit.
    pub fn solicited(&self) -> bool {
        self.op_own() & 0x2 != 0
    }

    /// The owner bit.
    pub fn owner(&self) -> bool {
        self.op_own() & OWNER_MASK != 0
    }

    /// Whether software owns this CQE at consumer index `ci` of a `cqe_count`-entry ring.
    pub fn is_sw_owned(&self, ci: u32, cqe_count: u32) -> bool {
        is_sw_owned(self.op_own(), ci, cqe_count)
    }

    /// The WQE counter: the send WQE index of a requester CQE, the receive counter of a
    /// responder CQE.
    pub fn wqe_counter(&self) -> u16 {
        be_u16(&self.buffer.as_ref()[field::WQE_COUNTER])
    }

    /// The byte count (bytes received for a responder CQE).
    pub fn byte_cnt(&self) -> u32 {
        be_u32(&self.buffer.as_ref()[field::BYTE_CNT])
    }

    /// The immediate, as the number the sender put in ImmDt.
    pub fn imm(&self) -> u32 {
        be_u32(&self.buffer.as_ref()[field::IMM_INVAL_PKEY])
    }

    /// The local QP number (24 bits).
    pub fn qpn(&self) -> u32 {
        be_u32(&self.buffer.as_ref()[field::SOP_DROP_QPN]) & QPN_MASK
    }

    /// The remote QP number (24 bits; meaningful for UD).
    pub fn remote_qpn(&self) -> u32 {
        be_u32(&self.buffer.as_ref()[field::FLAGS_RQPN]) & QPN_MASK
    }

    /// Whether a UD receive's buffer starts with the 40-byte GRH (`flags_rqpn` bits 29:28).
    pub fn has_grh(&self) -> bool {
        be_u32(&self.buffer.as_ref()[field::FLAGS_RQPN]) & FLAGS_GRH_MASK != 0
    }

    /// The SRQ number or user index.
    pub fn srqn_uidx(&self) -> u32 {
        be_u32(&self.buffer.as_ref()[field::SRQN_UIDX])
    }

    /// The timestamp.
    pub fn timestamp(&self) -> u64 {
        be_u64(&self.buffer.as_ref()[field::TIMESTAMP])
    }

    /// The signature byte.
    pub fn signature(&self) -> u8 {
        self.buffer.as_ref()[field::SIGNATURE]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Cqe64<T> {
    /// Sets the raw `op_own` byte.
    pub fn set_op_own(&mut self, value: u8) {
        self.buffer.as_mut()[field::OP_OWN] = value;
    }

    /// Sets the WQE counter.
    pub fn set_wqe_counter(&mut self, counter: u16) {
        put_be_u16(&mut self.buffer.as_mut()[field::WQE_COUNTER], counter);
    }

    /// Sets the byte count.
    pub fn set_byte_cnt(&mut self, count: u32) {
        put_be_u32(&mut self.buffer.as_mut()[field::BYTE_CNT], count);
    }

    /// Sets the immediate.
    pub fn set_imm(&mut self, imm: u32) {
        put_be_u32(&mut self.buffer.as_mut()[field::IMM_INVAL_PKEY], imm);
    }

    /// Sets the local QP number.
    pub fn set_qpn(&mut self, qpn: u32) {
        put_be_u32(
            &mut self.buffer.as_mut()[field::SOP_DROP_QPN],
            qpn & QPN_MASK,
        );
    }

    /// Sets `flags_rqpn` of a UD receive: the sending QP's number and whether a GRH leads the
    /// receive buffer.
    pub fn set_remote_qpn(&mut self, qpn: u32, grh: bool) {
        let flags = if grh { FLAGS_GRH } else { 0 };
        put_be_u32(
            &mut self.buffer.as_mut()[field::FLAGS_RQPN],
            flags | (qpn & QPN_MASK),
        );
    }

    /// Sets the timestamp.
    pub fn set_timestamp(&mut self, timestamp: u64) {
        put_be_u64(&mut self.buffer.as_mut()[field::TIMESTAMP], timestamp);
    }
}

/// A parsed successful CQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CqeRepr {
    /// The opcode (REQ or one of the RESP opcodes).
    pub opcode: CqeOpcode,
    /// The WQE counter.
    pub wqe_counter: u16,
    /// The byte count.
    pub byte_count: u32,
    /// The immediate (zero when the opcode carries none).
    pub imm: u32,
    /// The local QP number.
    pub qpn: u32,
    /// Whether the message had the solicited-event bit.
    pub solicited: bool,
    /// The timestamp (zero when the device keeps none).
    pub timestamp: u64,
}

impl CqeRepr {
    /// Parses a successful CQE; error and invalid CQEs are refused (read those with
    /// [`super::err_cqe::ErrCqeRepr`]).
    pub fn parse<T: AsRef<[u8]>>(cqe: &Cqe64<T>) -> Result<Self, Error> {
        cqe.check_len()?;
        let opcode = cqe.opcode();
        if !matches!(
            opcode,
            CqeOpcode::Req
                | CqeOpcode::RespWrImm
                | CqeOpcode::RespSend
                | CqeOpcode::RespSendImm
                | CqeOpcode::RespSendInv
        ) {
            return Err(Error::BadField {
                layout: "mlx5 CQE64",
                field: "op_own",
                value: u64::from(cqe.op_own()),
                expected: "a REQ or RESP opcode",
            });
        }
        if cqe.format() != 0 {
            return Err(Error::BadField {
                layout: "mlx5 CQE64",
                field: "op_own",
                value: u64::from(cqe.op_own()),
                expected: "CQE format 0 (compression is not supported)",
            });
        }
        Ok(CqeRepr {
            opcode,
            wqe_counter: cqe.wqe_counter(),
            byte_count: cqe.byte_cnt(),
            imm: cqe.imm(),
            qpn: cqe.qpn(),
            solicited: cqe.solicited(),
            timestamp: cqe.timestamp(),
        })
    }

    /// Writes every byte but `op_own` (the rest zero). A device writing shared memory writes
    /// this, then a release barrier, then [`CqeRepr::op_own`].
    pub fn emit_body<T: AsRef<[u8]> + AsMut<[u8]>>(&self, cqe: &mut Cqe64<T>) {
        cqe.buffer.as_mut()[..field::OP_OWN].fill(0);
        cqe.set_wqe_counter(self.wqe_counter);
        cqe.set_byte_cnt(self.byte_count);
        cqe.set_imm(self.imm);
        cqe.set_qpn(self.qpn);
        cqe.set_timestamp(self.timestamp);
    }

    /// The `op_own` byte for this CQE with owner bit `owner`.
    pub fn op_own(&self, owner: bool) -> u8 {
        op_own(self.opcode, self.solicited, owner)
    }

    /// Writes the whole CQE, `op_own` last.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, cqe: &mut Cqe64<T>, owner: bool) {
        self.emit_body(cqe);
        cqe.set_op_own(self.op_own(owner));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A RESP_SEND_IMM for QP 0x000123, receive counter 7, 300 bytes, immediate 0xcafef00d,
    /// solicited, second lap (owner 1), written out by hand from `struct mlx5_cqe64`.
    fn golden() -> [u8; 64] {
        let mut b = [0u8; 64];
        b[36..40].copy_from_slice(&[0xca, 0xfe, 0xf0, 0x0d]); // imm_inval_pkey
        b[44..48].copy_from_slice(&[0x00, 0x00, 0x01, 0x2c]); // byte_cnt 300
        b[56..60].copy_from_slice(&[0x00, 0x00, 0x01, 0x23]); // sop_drop_qpn
        b[60..62].copy_from_slice(&[0x00, 0x07]); // wqe_counter
        b[63] = 0x33; // opcode 3 << 4 | solicited << 1 | owner
        b
    }

    fn golden_repr() -> CqeRepr {
        CqeRepr {
            opcode: CqeOpcode::RespSendImm,
            wqe_counter: 7,
            byte_count: 300,
            imm: 0xcafe_f00d,
            qpn: 0x123,
            solicited: true,
            timestamp: 0,
        }
    }

    #[test]
    fn golden_bytes_parse_to_the_fields_written() {
        let bytes = golden();
        let cqe = Cqe64::new_checked(&bytes[..]).unwrap();
        assert_eq!(CqeRepr::parse(&cqe).unwrap(), golden_repr());
        assert!(cqe.owner());
        assert_eq!(cqe.format(), 0);
    }

    #[test]
    fn repr_emits_the_golden_bytes() {
        let mut buf = [0xa5u8; 64];
        golden_repr().emit(&mut Cqe64::new_unchecked(&mut buf[..]), true);
        assert_eq!(buf, golden());
    }

    #[test]
    fn owner_bit_flips_each_lap() {
        // A 4-entry ring: indices 0..4 expect owner 0, 4..8 expect owner 1, 8.. owner 0.
        assert!(!sw_owner_bit(3, 4));
        assert!(sw_owner_bit(4, 4));
        assert!(sw_owner_bit(7, 4));
        assert!(!sw_owner_bit(8, 4));
    }

    #[test]
    fn a_cqe_from_the_current_lap_belongs_to_software() {
        let req_lap0 = op_own(CqeOpcode::Req, false, false);
        let req_lap1 = op_own(CqeOpcode::Req, false, true);
        assert!(is_sw_owned(req_lap0, 2, 4));
        assert!(
            !is_sw_owned(req_lap0, 6, 4),
            "stale CQE from the previous lap"
        );
        assert!(is_sw_owned(req_lap1, 6, 4));
    }

    #[test]
    fn the_invalid_opcode_constant_names_the_invalid_variant() {
        assert_eq!(CqeOpcode::from(OPCODE_INVALID), CqeOpcode::Invalid);
    }

    #[test]
    fn an_invalid_cqe_never_belongs_to_software() {
        let fresh = u8::from(CqeOpcode::Invalid) << 4;
        assert!(!is_sw_owned(fresh, 0, 4));
        assert!(!is_sw_owned(fresh | 1, 4, 4));
    }

    #[test]
    fn error_and_invalid_cqes_are_not_parsed_as_success() {
        let mut bytes = golden();
        bytes[63] = 0xd0; // REQ_ERR
        assert!(CqeRepr::parse(&Cqe64::new_unchecked(&bytes[..])).is_err());
        bytes[63] = 0xf0;
        assert!(CqeRepr::parse(&Cqe64::new_unchecked(&bytes[..])).is_err());
    }

    #[test]
    fn compressed_cqes_are_refused() {
        let mut bytes = golden();
        bytes[63] |= 0x0c;
        assert!(CqeRepr::parse(&Cqe64::new_unchecked(&bytes[..])).is_err());
    }

    #[test]
    fn offsets_wrap_at_the_ring() {
        assert_eq!(cqe_offset(5, 4), 64);
        assert_eq!(cqe_offset(u32::MAX, 256), 255 * 64);
    }

    #[test]
    fn short_buffer_is_rejected() {
        assert!(Cqe64::new_checked(&[0u8; 63][..]).is_err());
    }

    #[test]
    fn a_ud_receive_names_its_sender_and_its_grh_in_flags_rqpn() {
        // struct mlx5_cqe64's flags_rqpn at bytes 24..28: flags 0x10 (l3 type 1: GRH), then
        // the source QPN 0x00abcd, as libmlx5 reads them into wc->src_qp and IBV_WC_GRH.
        let mut bytes = golden();
        let mut cqe = Cqe64::new_unchecked(&mut bytes[..]);
        cqe.set_remote_qpn(0xff00_abcd, true);
        assert_eq!(&bytes[24..28], &[0x10, 0x00, 0xab, 0xcd]);
        let cqe = Cqe64::new_unchecked(&bytes[..]);
        assert_eq!((cqe.remote_qpn(), cqe.has_grh()), (0xabcd, true));
        let mut bytes = golden();
        Cqe64::new_unchecked(&mut bytes[..]).set_remote_qpn(7, false);
        assert!(!Cqe64::new_unchecked(&bytes[..]).has_grh());
    }
}
