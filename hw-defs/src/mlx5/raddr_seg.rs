//! The remote-address segment of RDMA and atomic WQEs (`struct mlx5_wqe_raddr_seg`).

use crate::bytes::{be_u32, be_u64, put_be_u32, put_be_u64};
use crate::error::Error;

/// Byte ranges of the remote-address segment, named as `mlx5dv.h` names them.
pub(crate) mod field {
    use core::ops::Range;
    pub const RADDR: Range<usize> = 0..8;
    pub const RKEY: Range<usize> = 8..12;
    pub const RESERVED: Range<usize> = 12..16;
}

/// Size of the remote-address segment in bytes.
pub const SIZE: usize = 16;

fixed_view!(
    /// A view of a remote-address segment over a byte buffer.
    RaddrSeg,
    SIZE,
    "mlx5 remote-address segment"
);

impl<T: AsRef<[u8]>> RaddrSeg<T> {
    /// The remote virtual address.
    pub fn raddr(&self) -> u64 {
        be_u64(&self.buffer.as_ref()[field::RADDR])
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        be_u32(&self.buffer.as_ref()[field::RKEY])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> RaddrSeg<T> {
    /// Sets the remote virtual address.
    pub fn set_raddr(&mut self, raddr: u64) {
        put_be_u64(&mut self.buffer.as_mut()[field::RADDR], raddr);
    }

    /// Sets the remote key. Rewriting it is how a copied WQE moves to a backup MR.
    pub fn set_rkey(&mut self, rkey: u32) {
        put_be_u32(&mut self.buffer.as_mut()[field::RKEY], rkey);
    }

    /// Zeroes the reserved word.
    pub fn clear_reserved(&mut self) {
        self.buffer.as_mut()[field::RESERVED].fill(0);
    }
}

/// A parsed remote-address segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RaddrSegRepr {
    /// The remote virtual address.
    pub raddr: u64,
    /// The remote key.
    pub rkey: u32,
}

impl RaddrSegRepr {
    /// Parses a remote-address segment (the reserved word is ignored).
    pub fn parse<T: AsRef<[u8]>>(seg: &RaddrSeg<T>) -> Result<Self, Error> {
        seg.check_len()?;
        Ok(RaddrSegRepr {
            raddr: seg.raddr(),
            rkey: seg.rkey(),
        })
    }

    /// Writes the whole segment, reserved word zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, seg: &mut RaddrSeg<T>) {
        seg.set_raddr(self.raddr);
        seg.set_rkey(self.rkey);
        seg.clear_reserved();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOLDEN: [u8; 16] = [
        0x00, 0x00, 0x7f, 0x12, 0x34, 0x56, 0x78, 0x00, // raddr 0x7f12_3456_7800
        0x00, 0x01, 0x02, 0x03, // rkey 0x10203
        0x00, 0x00, 0x00, 0x00, // reserved
    ];

    #[test]
    fn golden_bytes_round_trip() {
        let repr = RaddrSegRepr::parse(&RaddrSeg::new_checked(&GOLDEN[..]).unwrap()).unwrap();
        assert_eq!(
            repr,
            RaddrSegRepr {
                raddr: 0x7f12_3456_7800,
                rkey: 0x0001_0203
            }
        );
        let mut buf = [0xaa; 16];
        repr.emit(&mut RaddrSeg::new_unchecked(&mut buf[..]));
        assert_eq!(buf, GOLDEN);
    }

    #[test]
    fn short_buffer_is_rejected() {
        assert!(RaddrSeg::new_checked(&GOLDEN[..12]).is_err());
    }
}
