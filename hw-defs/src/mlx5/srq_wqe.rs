//! Shared receive queue WQEs: the next segment (`struct mlx5_wqe_srq_next_seg`) heading each
//! slot, then up to `stride / 16 - 1` data segments ended as a receive WQE's are. The free
//! slots form a list through `next_wqe_index`: the driver writes a receive into the slot at
//! its head and moves the head to that slot's next; the device consumes slots in the same
//! order, so it follows the same links, and names the consumed slot in the CQE's
//! `wqe_counter`. The SRQ's doorbell record is one big-endian 32-bit count of receives posted.

use crate::bytes::{be_u16, put_be_u16};

/// Byte ranges of the next segment, named as `mlx5dv.h` names them.
pub(crate) mod field {
    use core::ops::Range;
    pub const NEXT_WQE_INDEX: Range<usize> = 2..4;
    pub const SIGNATURE: usize = 4;
}

/// Size of the next segment in bytes.
pub const NEXT_SEG_SIZE: usize = 16;

fixed_view!(
    /// A view of an SRQ WQE's next segment over a byte buffer.
    SrqNextSeg,
    NEXT_SEG_SIZE,
    "mlx5 SRQ next segment"
);

impl<T: AsRef<[u8]>> SrqNextSeg<T> {
    /// The slot that follows this one in the list of free slots.
    pub fn next_wqe_index(&self) -> u16 {
        be_u16(&self.buffer.as_ref()[field::NEXT_WQE_INDEX])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> SrqNextSeg<T> {
    /// Links this slot to `index`.
    pub fn set_next_wqe_index(&mut self, index: u16) {
        put_be_u16(&mut self.buffer.as_mut()[field::NEXT_WQE_INDEX], index);
    }
}

/// The byte offset of SRQ slot `index` in a ring of `stride`-byte slots.
pub const fn srq_wqe_offset(index: u16, stride: usize) -> usize {
    index as usize * stride
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_index_is_big_endian_at_byte_2() {
        let mut b = [0u8; NEXT_SEG_SIZE];
        SrqNextSeg::new_checked(&mut b[..])
            .unwrap()
            .set_next_wqe_index(0x0102);
        assert_eq!(&b[..5], &[0, 0, 1, 2, 0]);
        assert_eq!(
            SrqNextSeg::new_checked(&b[..]).unwrap().next_wqe_index(),
            0x0102
        );
        assert!(SrqNextSeg::new_checked(&b[..15]).is_err());
        assert_eq!(srq_wqe_offset(3, 64), 192);
    }
}
