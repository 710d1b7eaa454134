//! Send-queue geometry: 64-byte basic blocks (BBs), 16-byte units (ds), WQE indices.
//!
//! A send WQE is a run of 16-byte segments; its size in those units is the control segment's
//! `ds`. The ring is counted in 64-byte basic blocks: a WQE occupies `ceil(ds / 4)` of them,
//! the producer counter advances by that much, and the WQE index written into the control
//! segment (and into the doorbell record) is that counter mod 2^16. A WQE that starts near
//! the end of the ring continues at its start.

use super::ctrl_seg::SendOpcode;
use super::{atomic_seg, ctrl_seg, data_seg, raddr_seg};

/// `MLX5_SEND_WQE_BB`: bytes in a basic block.
pub const SEND_WQE_BB: usize = 64;
/// `MLX5_SEND_WQE_SHIFT`: log2 of [`SEND_WQE_BB`].
pub const SEND_WQE_SHIFT: u32 = 6;
/// `MLX5_SEND_WQE_DS`: bytes in the unit `ds` counts.
pub const SEND_WQE_DS: usize = 16;
/// Units in one basic block.
pub const DS_PER_BB: usize = SEND_WQE_BB / SEND_WQE_DS;
/// The largest `ds` the control segment's 6-bit field holds.
pub const MAX_DS: usize = (1 << ctrl_seg::DS_BITS) - 1;
/// The largest WQE a control segment can describe, in bytes: [`MAX_DS`] 16-byte units.
pub const MAX_WQE_BYTES: usize = MAX_DS * SEND_WQE_DS;
/// The most basic blocks one WQE can span (`MLX5_SEND_WQE_MAX_WQEBBS`).
pub const MAX_WQE_BBS: usize = MAX_DS.div_ceil(DS_PER_BB);

/// The 16-byte units needed for `bytes` bytes of WQE.
pub const fn ds_for_bytes(bytes: usize) -> usize {
    bytes.div_ceil(SEND_WQE_DS)
}

/// The basic blocks a WQE of `ds` units occupies.
pub const fn bbs_for_ds(ds: usize) -> usize {
    ds.div_ceil(DS_PER_BB)
}

/// The basic blocks a WQE of `bytes` bytes occupies.
pub const fn bbs_for_bytes(bytes: usize) -> usize {
    bytes.div_ceil(SEND_WQE_BB)
}

/// The 16-byte units an inline segment of `payload_len` bytes takes (4-byte header included),
/// as libmlx5 counts them: `align(len + 4, 16) / 16`.
pub const fn inline_ds(payload_len: usize) -> usize {
    (payload_len + 4).div_ceil(SEND_WQE_DS)
}

/// The WQE index for a producer counter in basic blocks: the counter mod 2^16.
pub const fn wqe_index(producer_counter: u32) -> u16 {
    producer_counter as u16
}

/// The byte offset of WQE index `index` in a ring of `ring_bbs` basic blocks (a power of two).
pub const fn wqe_offset(index: u16, ring_bbs: usize) -> usize {
    ((index as usize) & (ring_bbs.wrapping_sub(1))) << SEND_WQE_SHIFT
}

/// The units taken by the segments that come before the data: control, then remote address
/// for RDMA and atomics, then the atomic segment for atomics.
pub fn header_ds(opcode: SendOpcode) -> usize {
    let mut bytes = ctrl_seg::SIZE;
    if opcode.has_raddr_seg() {
        bytes += raddr_seg::SIZE;
    }
    if opcode.has_atomic_seg() {
        bytes += atomic_seg::SIZE;
    }
    ds_for_bytes(bytes)
}

/// The `ds` of a WQE with `sges` data segments.
pub fn gather_wqe_ds(opcode: SendOpcode, sges: usize) -> usize {
    header_ds(opcode) + sges * ds_for_bytes(data_seg::SIZE)
}

/// The `ds` of a WQE whose data is `payload_len` inline bytes (none for an empty payload, as
/// libmlx5 writes no inline segment then).
pub fn inline_wqe_ds(opcode: SendOpcode, payload_len: usize) -> usize {
    if payload_len == 0 {
        header_ds(opcode)
    } else {
        header_ds(opcode) + inline_ds(payload_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_with_one_sge_fills_three_units_in_one_block() {
        let ds = gather_wqe_ds(SendOpcode::RdmaWrite, 1);
        assert_eq!(ds, 3);
        assert_eq!(bbs_for_ds(ds), 1);
    }

    #[test]
    fn an_atomic_needs_a_full_block() {
        assert_eq!(header_ds(SendOpcode::AtomicFa), 3);
        assert_eq!(gather_wqe_ds(SendOpcode::AtomicCs, 1), 4);
        assert_eq!(bbs_for_ds(4), 1);
    }

    #[test]
    fn a_send_with_four_sges_spills_into_a_second_block() {
        assert_eq!(header_ds(SendOpcode::Send), 1);
        assert_eq!(gather_wqe_ds(SendOpcode::Send, 4), 5);
        assert_eq!(bbs_for_ds(5), 2);
    }

    #[test]
    fn inline_units_count_the_four_byte_header() {
        assert_eq!(inline_ds(1), 1);
        assert_eq!(inline_ds(12), 1);
        assert_eq!(inline_ds(13), 2);
        assert_eq!(inline_wqe_ds(SendOpcode::RdmaWrite, 0), 2);
        assert_eq!(inline_wqe_ds(SendOpcode::RdmaWrite, 60), 2 + 4);
    }

    #[test]
    fn the_largest_wqe_spans_sixteen_blocks() {
        assert_eq!(MAX_WQE_BBS, 16);
        assert_eq!(bbs_for_bytes(MAX_DS * SEND_WQE_DS), 16);
    }

    #[test]
    fn the_largest_wqe_is_what_six_bits_of_ds_count() {
        assert_eq!(MAX_DS, 63);
        assert_eq!(MAX_WQE_BYTES, 63 * 16);
        assert_eq!(bbs_for_bytes(MAX_WQE_BYTES), MAX_WQE_BBS);
        // The field keeps MAX_DS and nothing above it.
        let mut bytes = [0u8; ctrl_seg::SIZE];
        let mut seg = ctrl_seg::CtrlSeg::new_unchecked(&mut bytes[..]);
        seg.set_ds(MAX_DS as u8);
        assert_eq!(usize::from(seg.ds()), MAX_DS);
        seg.set_ds(MAX_DS as u8 + 1);
        assert_eq!(seg.ds(), 0);
    }

    #[test]
    fn wqe_index_wraps_at_sixteen_bits_and_offset_at_the_ring() {
        assert_eq!(wqe_index(0x1_0005), 5);
        assert_eq!(wqe_offset(5, 4), SEND_WQE_BB);
        assert_eq!(wqe_offset(0xffff, 256), 255 * SEND_WQE_BB);
    }
}
