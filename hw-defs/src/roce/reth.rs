//! The RDMA Extended Transport Header: where an RDMA WRITE or READ goes.

use crate::bytes::{be_u32, be_u64, put_be_u32, put_be_u64};
use crate::error::Error;

/// Byte ranges of the RETH (IBA 9.3.3), named as the spec names them.
pub(crate) mod field {
    use core::ops::Range;
    pub const VA: Range<usize> = 0..8;
    pub const R_KEY: Range<usize> = 8..12;
    pub const DMA_LENGTH: Range<usize> = 12..16;
}

/// Length of the RETH.
pub const HEADER_LEN: usize = field::DMA_LENGTH.end;

fixed_view!(
    /// A view of a RETH over a byte buffer.
    Reth,
    HEADER_LEN,
    "RETH"
);

impl<T: AsRef<[u8]>> Reth<T> {
    /// The remote virtual address.
    pub fn va(&self) -> u64 {
        be_u64(&self.buffer.as_ref()[field::VA])
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        be_u32(&self.buffer.as_ref()[field::R_KEY])
    }

    /// The length of the whole message in bytes.
    pub fn dma_length(&self) -> u32 {
        be_u32(&self.buffer.as_ref()[field::DMA_LENGTH])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Reth<T> {
    /// Sets the remote virtual address.
    pub fn set_va(&mut self, va: u64) {
        put_be_u64(&mut self.buffer.as_mut()[field::VA], va);
    }

    /// Sets the remote key.
    pub fn set_rkey(&mut self, rkey: u32) {
        put_be_u32(&mut self.buffer.as_mut()[field::R_KEY], rkey);
    }

    /// Sets the message length.
    pub fn set_dma_length(&mut self, len: u32) {
        put_be_u32(&mut self.buffer.as_mut()[field::DMA_LENGTH], len);
    }
}

/// A parsed RETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RethRepr {
    /// The remote virtual address.
    pub va: u64,
    /// The remote key.
    pub rkey: u32,
    /// The length of the whole message in bytes.
    pub dma_length: u32,
}

impl RethRepr {
    /// Parses a RETH.
    pub fn parse<T: AsRef<[u8]>>(reth: &Reth<T>) -> Result<Self, Error> {
        reth.check_len()?;
        Ok(RethRepr {
            va: reth.va(),
            rkey: reth.rkey(),
            dma_length: reth.dma_length(),
        })
    }

    /// Writes the RETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, reth: &mut Reth<T>) {
        reth.set_va(self.va);
        reth.set_rkey(self.rkey);
        reth.set_dma_length(self.dma_length);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_bytes_round_trip() {
        let golden: [u8; 16] = [
            0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x10, 0x00, // VA
            0x00, 0x00, 0xab, 0xcd, // R_Key
            0x00, 0x01, 0x00, 0x00, // DMA length 65536
        ];
        let repr = RethRepr::parse(&Reth::new_checked(&golden[..]).unwrap()).unwrap();
        assert_eq!(
            repr,
            RethRepr {
                va: 0x7f00_0000_1000,
                rkey: 0xabcd,
                dma_length: 65536
            }
        );
        let mut buf = [0u8; 16];
        repr.emit(&mut Reth::new_unchecked(&mut buf[..]));
        assert_eq!(buf, golden);
    }

    #[test]
    fn short_buffer_is_rejected() {
        assert!(Reth::new_checked(&[0u8; 15][..]).is_err());
    }
}
