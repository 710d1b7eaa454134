//! The control segment: the first 16 bytes of every mlx5 send WQE (`struct mlx5_wqe_ctrl_seg`).

use crate::bytes::{be_u16, be_u32, put_be_u16, put_be_u32};
use crate::error::Error;

/// Byte ranges of the control segment, named as `mlx5dv.h` names them.
pub(crate) mod field {
    use core::ops::Range;
    /// `opmod[31:24] wqe_index[23:8] opcode[7:0]`.
    pub const OPMOD_IDX_OPCODE: Range<usize> = 0..4;
    /// `qpn[31:8] ds[5:0]`; ds counts the 16-byte units of the whole WQE.
    pub const QPN_DS: Range<usize> = 4..8;
    pub const SIGNATURE: usize = 8;
    pub const DCI_STREAM_CHANNEL_ID: Range<usize> = 9..11;
    /// fence `mode[7:5]` completion `event[3:2] solicited[1]`.
    pub const FM_CE_SE: usize = 11;
    pub const IMM: Range<usize> = 12..16;
}

/// Size of the control segment in bytes.
pub const SIZE: usize = 16;

/// `MLX5_WQE_CTRL_CQ_UPDATE`: ask for a CQE when this WQE completes (a signaled WR).
pub const CTRL_CQ_UPDATE: u8 = 2 << 2;
/// `MLX5_WQE_CTRL_SOLICITED`: set the solicited-event bit in the packet.
pub const CTRL_SOLICITED: u8 = 1 << 1;
/// `MLX5_WQE_CTRL_FENCE`: what libmlx5 writes for `IBV_SEND_FENCE` (fence mode 4).
pub const CTRL_FENCE: u8 = 4 << 5;
/// `MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE` (fence mode 1).
pub const CTRL_INITIATOR_SMALL_FENCE: u8 = 1 << 5;

/// Width of the `ds` field (`qpn_ds[5:0]`): a WQE is at most `2^DS_BITS - 1` 16-byte units.
pub const DS_BITS: u32 = 6;
const DS_MASK: u32 = (1 << DS_BITS) - 1;
const QPN_MASK: u32 = 0x00ff_ffff;
const FENCE_SHIFT: u8 = 5;
const CE_MASK: u8 = 0x3 << 2;

enum_with_unknown! {
    /// A send WQE opcode (`MLX5_OPCODE_*`), the low byte of `opmod_idx_opcode`.
    pub enum SendOpcode(u8) {
        /// `MLX5_OPCODE_NOP`.
        Nop = 0x00,
        /// `MLX5_OPCODE_RDMA_WRITE`.
        RdmaWrite = 0x08,
        /// `MLX5_OPCODE_RDMA_WRITE_IMM`.
        RdmaWriteImm = 0x09,
        /// `MLX5_OPCODE_SEND`.
        Send = 0x0a,
        /// `MLX5_OPCODE_SEND_IMM`.
        SendImm = 0x0b,
        /// `MLX5_OPCODE_RDMA_READ`.
        RdmaRead = 0x10,
        /// `MLX5_OPCODE_ATOMIC_CS`: compare and swap.
        AtomicCs = 0x11,
        /// `MLX5_OPCODE_ATOMIC_FA`: fetch and add.
        AtomicFa = 0x12,
    }
}

impl SendOpcode {
    /// Whether the WQE carries a remote-address segment after the control segment.
    pub fn has_raddr_seg(self) -> bool {
        matches!(
            self,
            SendOpcode::RdmaWrite
                | SendOpcode::RdmaWriteImm
                | SendOpcode::RdmaRead
                | SendOpcode::AtomicCs
                | SendOpcode::AtomicFa
        )
    }

    /// Whether the WQE carries an atomic segment after the remote-address segment.
    pub fn has_atomic_seg(self) -> bool {
        matches!(self, SendOpcode::AtomicCs | SendOpcode::AtomicFa)
    }

    /// Whether the control segment's `imm` field travels as the packet's ImmDt.
    pub fn has_immediate(self) -> bool {
        matches!(self, SendOpcode::RdmaWriteImm | SendOpcode::SendImm)
    }

    /// Whether the WQE's data segments scatter a response (read, atomics) rather than gather.
    pub fn scatters_response(self) -> bool {
        matches!(
            self,
            SendOpcode::RdmaRead | SendOpcode::AtomicCs | SendOpcode::AtomicFa
        )
    }
}

enum_with_unknown! {
    /// The fence mode, bits 7:5 of `fm_ce_se` (`MLX5_FENCE_MODE_*`).
    pub enum FenceMode(u8) {
        /// No fence.
        None = 0,
        /// Wait for earlier local operations (`MLX5_FENCE_MODE_INITIATOR_SMALL`).
        InitiatorSmall = 1,
        /// Wait for earlier RDMA reads and atomics (`MLX5_FENCE_MODE_FENCE`).
        Fence = 2,
        /// Strong ordering (`MLX5_FENCE_MODE_STRONG_ORDERING`).
        StrongOrdering = 3,
        /// Small fence and fence (`MLX5_FENCE_MODE_SMALL_AND_FENCE`): libmlx5's
        /// `IBV_SEND_FENCE`.
        SmallAndFence = 4,
    }
}

fixed_view!(
    /// A view of a control segment over a byte buffer.
    CtrlSeg,
    SIZE,
    "mlx5 control segment"
);

impl<T: AsRef<[u8]>> CtrlSeg<T> {
    fn opmod_idx_opcode(&self) -> u32 {
        be_u32(&self.buffer.as_ref()[field::OPMOD_IDX_OPCODE])
    }

    fn qpn_ds(&self) -> u32 {
        be_u32(&self.buffer.as_ref()[field::QPN_DS])
    }

    /// The opcode.
    pub fn opcode(&self) -> SendOpcode {
        SendOpcode::from(self.opmod_idx_opcode() as u8)
    }

    /// The opcode modifier (zero for the RC opcodes).
    pub fn opmod(&self) -> u8 {
        (self.opmod_idx_opcode() >> 24) as u8
    }

    /// The WQE index: the producer counter in basic blocks, mod 2^16.
    pub fn wqe_index(&self) -> u16 {
        (self.opmod_idx_opcode() >> 8) as u16
    }

    /// The QP number (24 bits).
    pub fn qpn(&self) -> u32 {
        self.qpn_ds() >> 8
    }

    /// The WQE size in 16-byte units, control segment included (6 bits).
    pub fn ds(&self) -> u8 {
        (self.qpn_ds() & DS_MASK) as u8
    }

    /// The signature byte (zero unless WQE signatures are enabled).
    pub fn signature(&self) -> u8 {
        self.buffer.as_ref()[field::SIGNATURE]
    }

    /// The DCI stream channel id (zero for RC).
    pub fn dci_stream_channel_id(&self) -> u16 {
        be_u16(&self.buffer.as_ref()[field::DCI_STREAM_CHANNEL_ID])
    }

    /// The raw `fm_ce_se` byte.
    pub fn fm_ce_se(&self) -> u8 {
        self.buffer.as_ref()[field::FM_CE_SE]
    }

    /// The fence mode.
    pub fn fence_mode(&self) -> FenceMode {
        FenceMode::from(self.fm_ce_se() >> FENCE_SHIFT)
    }

    /// Whether the WQE asks for a CQE on success (`MLX5_WQE_CTRL_CQ_UPDATE`, a signaled WR).
    pub fn cq_update(&self) -> bool {
        self.fm_ce_se() & CTRL_CQ_UPDATE != 0
    }

    /// Whether the packet's solicited-event bit is to be set.
    pub fn solicited(&self) -> bool {
        self.fm_ce_se() & CTRL_SOLICITED != 0
    }

    /// The immediate, as the number the peer sees in ImmDt (the field is big-endian).
    pub fn imm(&self) -> u32 {
        be_u32(&self.buffer.as_ref()[field::IMM])
    }

    /// The first eight bytes as one big-endian number: what a doorbell-register write carries.
    /// Writing `doorbell_value().to_be_bytes()` reproduces the bytes in WQE order.
    pub fn doorbell_value(&self) -> u64 {
        let b = self.buffer.as_ref();
        u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> CtrlSeg<T> {
    fn set_opmod_idx_opcode(&mut self, value: u32) {
        put_be_u32(&mut self.buffer.as_mut()[field::OPMOD_IDX_OPCODE], value);
    }

    fn set_qpn_ds(&mut self, value: u32) {
        put_be_u32(&mut self.buffer.as_mut()[field::QPN_DS], value);
    }

    /// Sets the opcode.
    pub fn set_opcode(&mut self, opcode: SendOpcode) {
        let v = self.opmod_idx_opcode();
        self.set_opmod_idx_opcode((v & !0xff) | u32::from(u8::from(opcode)));
    }

    /// Sets the opcode modifier.
    pub fn set_opmod(&mut self, opmod: u8) {
        let v = self.opmod_idx_opcode();
        self.set_opmod_idx_opcode((v & 0x00ff_ffff) | (u32::from(opmod) << 24));
    }

    /// Sets the WQE index. Rewriting it is how a WQE copied to another ring is renumbered.
    pub fn set_wqe_index(&mut self, index: u16) {
        let v = self.opmod_idx_opcode();
        self.set_opmod_idx_opcode((v & 0xff00_00ff) | (u32::from(index) << 8));
    }

    /// Sets the QP number (the high byte of `qpn` is dropped).
    pub fn set_qpn(&mut self, qpn: u32) {
        let v = self.qpn_ds();
        self.set_qpn_ds(((qpn & QPN_MASK) << 8) | (v & 0xff));
    }

    /// Sets the WQE size in 16-byte units (6 bits; higher bits are dropped).
    pub fn set_ds(&mut self, ds: u8) {
        let v = self.qpn_ds();
        self.set_qpn_ds((v & !0xff) | (u32::from(ds) & DS_MASK));
    }

    /// Sets the signature byte.
    pub fn set_signature(&mut self, signature: u8) {
        self.buffer.as_mut()[field::SIGNATURE] = signature;
    }

    /// Sets the DCI stream channel id.
    pub fn set_dci_stream_channel_id(&mut self, id: u16) {
        put_be_u16(&mut self.buffer.as_mut()[field::DCI_STREAM_CHANNEL_ID], id);
    }

    /// Sets the raw `fm_ce_se` byte.
    pub fn set_fm_ce_se(&mut self, value: u8) {
        self.buffer.as_mut()[field::FM_CE_SE] = value;
    }

    /// Sets the immediate (stored big-endian, as it travels in ImmDt).
    pub fn set_imm(&mut self, imm: u32) {
        put_be_u32(&mut self.buffer.as_mut()[field::IMM], imm);
    }
}

/// The `fm_ce_se` byte libmlx5 writes for a WR with these send flags.
///
/// `fence` is the fence mode the WR needs (libmlx5 writes [`FenceMode::SmallAndFence`] for
/// `IBV_SEND_FENCE`); `signaled` sets `CQ_UPDATE`; `solicited` sets `SOLICITED`.
pub fn fm_ce_se(fence: FenceMode, signaled: bool, solicited: bool) -> u8 {
    let mut value = (u8::from(fence) & 0x7) << FENCE_SHIFT;
    if signaled {
        value |= CTRL_CQ_UPDATE;
    }
    if solicited {
        value |= CTRL_SOLICITED;
    }
    value
}

/// A parsed control segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CtrlSegRepr {
    /// The opcode.
    pub opcode: SendOpcode,
    /// The opcode modifier.
    pub opmod: u8,
    /// The WQE index (producer counter in basic blocks, mod 2^16).
    pub wqe_index: u16,
    /// The QP number (24 bits).
    pub qpn: u32,
    /// The WQE size in 16-byte units (6 bits).
    pub ds: u8,
    /// The signature byte.
    pub signature: u8,
    /// The fence mode.
    pub fence: FenceMode,
    /// Whether a CQE is wanted on success.
    pub signaled: bool,
    /// Whether the solicited-event bit is set.
    pub solicited: bool,
    /// The immediate.
    pub imm: u32,
}

impl CtrlSegRepr {
    /// Parses a control segment. The completion-event field keeps only its `CQ_UPDATE` bit,
    /// the only one libmlx5 writes.
    pub fn parse<T: AsRef<[u8]>>(seg: &CtrlSeg<T>) -> Result<Self, Error> {
        seg.check_len()?;
        if seg.fm_ce_se() & CE_MASK & !CTRL_CQ_UPDATE != 0 {
            return Err(Error::BadField {
                layout: "mlx5 control segment",
                field: "fm_ce_se",
                value: u64::from(seg.fm_ce_se()),
                expected: "completion-event bits 0 (on error) or 2 (always)",
            });
        }
        Ok(CtrlSegRepr {
            opcode: seg.opcode(),
            opmod: seg.opmod(),
            wqe_index: seg.wqe_index(),
            qpn: seg.qpn(),
            ds: seg.ds(),
            signature: seg.signature(),
            fence: seg.fence_mode(),
            signaled: seg.cq_update(),
            solicited: seg.solicited(),
            imm: seg.imm(),
        })
    }

    /// Writes the whole segment (the DCI stream channel id is zero).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, seg: &mut CtrlSeg<T>) {
        seg.set_opmod_idx_opcode(
            (u32::from(self.opmod) << 24)
                | (u32::from(self.wqe_index) << 8)
                | u32::from(u8::from(self.opcode)),
        );
        seg.set_qpn_ds(((self.qpn & QPN_MASK) << 8) | (u32::from(self.ds) & DS_MASK));
        seg.set_signature(self.signature);
        seg.set_dci_stream_channel_id(0);
        seg.set_fm_ce_se(fm_ce_se(self.fence, self.signaled, self.solicited));
        seg.set_imm(self.imm);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An RDMA_WRITE_IMM at WQE index 0x1234 on QP 0xabcdef, 3 units long, signaled and
    /// fenced, immediate 0xdeadbeef: written out by hand from `mlx5dv_set_ctrl_seg`.
    const GOLDEN: [u8; 16] = [
        0x00, 0x12, 0x34, 0x09, // opmod 0, wqe_index 0x1234, opcode RDMA_WRITE_IMM
        0xab, 0xcd, 0xef, 0x03, // qpn 0xabcdef, ds 3
        0x00, 0x00, 0x00, // signature, dci_stream_channel_id
        0x88, // fence mode 4 (0x80) | CQ_UPDATE (0x08)
        0xde, 0xad, 0xbe, 0xef, // imm
    ];

    fn golden_repr() -> CtrlSegRepr {
        CtrlSegRepr {
            opcode: SendOpcode::RdmaWriteImm,
            opmod: 0,
            wqe_index: 0x1234,
            qpn: 0xab_cdef,
            ds: 3,
            signature: 0,
            fence: FenceMode::SmallAndFence,
            signaled: true,
            solicited: false,
            imm: 0xdead_beef,
        }
    }

    #[test]
    fn golden_bytes_parse_to_the_fields_written() {
        let seg = CtrlSeg::new_checked(&GOLDEN[..]).unwrap();
        assert_eq!(CtrlSegRepr::parse(&seg).unwrap(), golden_repr());
        assert!(seg.cq_update());
        assert!(!seg.solicited());
    }

    #[test]
    fn repr_emits_the_golden_bytes() {
        let mut buf = [0xffu8; 16];
        golden_repr().emit(&mut CtrlSeg::new_unchecked(&mut buf[..]));
        assert_eq!(buf, GOLDEN);
    }

    #[test]
    fn setters_touch_only_their_bits() {
        let mut buf = GOLDEN;
        let mut seg = CtrlSeg::new_unchecked(&mut buf[..]);
        seg.set_wqe_index(0xffff);
        seg.set_qpn(0x0100_0002);
        assert_eq!(seg.opcode(), SendOpcode::RdmaWriteImm);
        assert_eq!(seg.wqe_index(), 0xffff);
        assert_eq!(seg.qpn(), 0x00_0002);
        assert_eq!(seg.ds(), 3);
        seg.set_ds(0xff);
        assert_eq!(seg.ds(), 0x3f);
        assert_eq!(seg.qpn(), 0x00_0002);
    }

    #[test]
    fn doorbell_value_is_the_first_eight_bytes_in_order() {
        let seg = CtrlSeg::new_unchecked(&GOLDEN[..]);
        assert_eq!(seg.doorbell_value().to_be_bytes(), GOLDEN[..8]);
    }

    #[test]
    fn flag_bits_match_libmlx5() {
        assert_eq!(fm_ce_se(FenceMode::None, true, false), 0x08);
        assert_eq!(fm_ce_se(FenceMode::None, false, true), 0x02);
        assert_eq!(fm_ce_se(FenceMode::SmallAndFence, false, false), CTRL_FENCE);
        assert_eq!(
            fm_ce_se(FenceMode::InitiatorSmall, false, false),
            CTRL_INITIATOR_SMALL_FENCE
        );
    }

    #[test]
    fn short_buffer_is_rejected() {
        assert!(matches!(
            CtrlSeg::new_checked(&GOLDEN[..15]),
            Err(Error::Truncated {
                needed: 16,
                available: 15,
                ..
            })
        ));
    }

    #[test]
    fn unknown_opcode_survives_as_its_number() {
        let mut buf = GOLDEN;
        buf[3] = 0x25; // UMR, not named here
        let seg = CtrlSeg::new_unchecked(&buf[..]);
        assert_eq!(seg.opcode(), SendOpcode::Unknown(0x25));
        assert_eq!(u8::from(seg.opcode()), 0x25);
    }

    #[test]
    fn completion_event_modes_other_than_cq_update_are_rejected() {
        let mut buf = GOLDEN;
        buf[11] = 0x0c; // ce = 3: CQE and event, which libmlx5 never writes
        let seg = CtrlSeg::new_unchecked(&buf[..]);
        assert!(matches!(
            CtrlSegRepr::parse(&seg),
            Err(Error::BadField {
                field: "fm_ce_se",
                ..
            })
        ));
    }
}
