//! The data segment (`struct mlx5_wqe_data_seg`): one gather entry of a send WQE, one scatter
//! entry of a receive WQE, and, with the invalid lkey, the terminator of a short receive WQE.

use crate::bytes::{be_u32, be_u64, put_be_u32, put_be_u64};
use crate::error::Error;

/// Byte ranges of the data segment, named as `mlx5dv.h` names them.
pub(crate) mod field {
    use core::ops::Range;
    pub const BYTE_COUNT: Range<usize> = 0..4;
    pub const LKEY: Range<usize> = 4..8;
    pub const ADDR: Range<usize> = 8..16;
}

/// Size of the data segment in bytes.
pub const SIZE: usize = 16;

/// `MLX5_INVALID_LKEY`: the lkey of the segment that ends a receive WQE with fewer SGEs than
/// its slot holds.
pub const INVALID_LKEY: u32 = 0x100;

fixed_view!(
    /// A view of a data segment over a byte buffer.
    DataSeg,
    SIZE,
    "mlx5 data segment"
);

impl<T: AsRef<[u8]>> DataSeg<T> {
    /// The byte count. Read it raw: in a send WQE the top bit would mark an inline segment,
    /// which is why [`super::inline_seg`] checks it first.
    pub fn byte_count(&self) -> u32 {
        be_u32(&self.buffer.as_ref()[field::BYTE_COUNT])
    }

    /// The local key.
    pub fn lkey(&self) -> u32 {
        be_u32(&self.buffer.as_ref()[field::LKEY])
    }

    /// The local virtual address.
    pub fn addr(&self) -> u64 {
        be_u64(&self.buffer.as_ref()[field::ADDR])
    }

    /// Whether this is the terminator of a receive WQE (lkey [`INVALID_LKEY`]).
    pub fn is_terminator(&self) -> bool {
        self.lkey() == INVALID_LKEY
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> DataSeg<T> {
    /// Sets the byte count.
    pub fn set_byte_count(&mut self, count: u32) {
        put_be_u32(&mut self.buffer.as_mut()[field::BYTE_COUNT], count);
    }

    /// Sets the local key. Rewriting it is how a copied WQE moves to a backup MR.
    pub fn set_lkey(&mut self, lkey: u32) {
        put_be_u32(&mut self.buffer.as_mut()[field::LKEY], lkey);
    }

    /// Sets the local virtual address.
    pub fn set_addr(&mut self, addr: u64) {
        put_be_u64(&mut self.buffer.as_mut()[field::ADDR], addr);
    }
}

/// A parsed data segment: one scatter/gather entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DataSegRepr {
    /// The byte count.
    pub byte_count: u32,
    /// The local key.
    pub lkey: u32,
    /// The local virtual address.
    pub addr: u64,
}

impl DataSegRepr {
    /// The receive-WQE terminator libmlx5 writes: byte count 0, lkey 0x100, address 0.
    pub const TERMINATOR: DataSegRepr = DataSegRepr {
        byte_count: 0,
        lkey: INVALID_LKEY,
        addr: 0,
    };

    /// Parses a data segment.
    pub fn parse<T: AsRef<[u8]>>(seg: &DataSeg<T>) -> Result<Self, Error> {
        seg.check_len()?;
        Ok(DataSegRepr {
            byte_count: seg.byte_count(),
            lkey: seg.lkey(),
            addr: seg.addr(),
        })
    }

    /// Writes the whole segment.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, seg: &mut DataSeg<T>) {
        seg.set_byte_count(self.byte_count);
        seg.set_lkey(self.lkey);
        seg.set_addr(self.addr);
    }

    /// Whether this is the receive-WQE terminator.
    pub fn is_terminator(&self) -> bool {
        self.lkey == INVALID_LKEY
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_bytes_round_trip() {
        let golden: [u8; 16] = [
            0x00, 0x00, 0x10, 0x00, // byte_count 4096
            0x00, 0x00, 0x12, 0x34, // lkey 0x1234
            0x00, 0x00, 0x55, 0x55, 0x00, 0x00, 0x10, 0x00, // addr
        ];
        let repr = DataSegRepr::parse(&DataSeg::new_checked(&golden[..]).unwrap()).unwrap();
        assert_eq!(
            repr,
            DataSegRepr {
                byte_count: 4096,
                lkey: 0x1234,
                addr: 0x5555_0000_1000
            }
        );
        let mut buf = [0xee; 16];
        repr.emit(&mut DataSeg::new_unchecked(&mut buf[..]));
        assert_eq!(buf, golden);
    }

    #[test]
    fn terminator_bytes_are_what_libmlx5_writes() {
        let mut buf = [0xee; 16];
        DataSegRepr::TERMINATOR.emit(&mut DataSeg::new_unchecked(&mut buf[..]));
        assert_eq!(buf, [0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert!(DataSeg::new_unchecked(&buf[..]).is_terminator());
    }

    #[test]
    fn short_buffer_is_rejected() {
        assert!(DataSeg::new_checked(&[0u8; 15][..]).is_err());
    }
}
