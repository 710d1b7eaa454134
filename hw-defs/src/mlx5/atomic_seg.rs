//! The atomic segment of compare-and-swap and fetch-and-add WQEs (`struct mlx5_wqe_atomic_seg`).

use crate::bytes::{be_u64, put_be_u64};
use crate::error::Error;

/// Byte ranges of the atomic segment, named as `mlx5dv.h` names them.
pub(crate) mod field {
    use core::ops::Range;
    /// The swap value (compare-and-swap) or the addend (fetch-and-add).
    pub const SWAP_ADD: Range<usize> = 0..8;
    /// The compare value (compare-and-swap only).
    pub const COMPARE: Range<usize> = 8..16;
}

/// Size of the atomic segment in bytes.
pub const SIZE: usize = 16;

fixed_view!(
    /// A view of an atomic segment over a byte buffer.
    AtomicSeg,
    SIZE,
    "mlx5 atomic segment"
);

impl<T: AsRef<[u8]>> AtomicSeg<T> {
    /// The swap value (compare-and-swap) or the addend (fetch-and-add).
    pub fn swap_add(&self) -> u64 {
        be_u64(&self.buffer.as_ref()[field::SWAP_ADD])
    }

    /// The compare value.
    pub fn compare(&self) -> u64 {
        be_u64(&self.buffer.as_ref()[field::COMPARE])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicSeg<T> {
    /// Sets the swap value or addend.
    pub fn set_swap_add(&mut self, value: u64) {
        put_be_u64(&mut self.buffer.as_mut()[field::SWAP_ADD], value);
    }

    /// Sets the compare value.
    pub fn set_compare(&mut self, value: u64) {
        put_be_u64(&mut self.buffer.as_mut()[field::COMPARE], value);
    }
}

/// A parsed atomic segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicSegRepr {
    /// The swap value (compare-and-swap) or the addend (fetch-and-add).
    pub swap_add: u64,
    /// The compare value (zero for fetch-and-add, as libmlx5 writes it).
    pub compare: u64,
}

impl AtomicSegRepr {
    /// Parses an atomic segment.
    pub fn parse<T: AsRef<[u8]>>(seg: &AtomicSeg<T>) -> Result<Self, Error> {
        seg.check_len()?;
        Ok(AtomicSegRepr {
            swap_add: seg.swap_add(),
            compare: seg.compare(),
        })
    }

    /// Writes the whole segment.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, seg: &mut AtomicSeg<T>) {
        seg.set_swap_add(self.swap_add);
        seg.set_compare(self.compare);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_bytes_round_trip() {
        let golden: [u8; 16] = [
            0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, // swap_add
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x2a, // compare 42
        ];
        let repr = AtomicSegRepr::parse(&AtomicSeg::new_checked(&golden[..]).unwrap()).unwrap();
        assert_eq!(repr.swap_add, 0x1122_3344_5566_7788);
        assert_eq!(repr.compare, 42);
        let mut buf = [0u8; 16];
        repr.emit(&mut AtomicSeg::new_unchecked(&mut buf[..]));
        assert_eq!(buf, golden);
    }

    #[test]
    fn short_buffer_is_rejected() {
        assert!(AtomicSeg::new_checked(&[0u8; 8][..]).is_err());
    }
}
