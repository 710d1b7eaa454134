//! The Atomic Extended Transport Header of CmpSwap and FetchAdd requests.

use crate::bytes::{be_u32, be_u64, put_be_u32, put_be_u64};
use crate::error::Error;

/// Byte ranges of the AtomicETH (IBA 9.3.4), named as the spec names them.
pub(crate) mod field {
    use core::ops::Range;
    pub const VA: Range<usize> = 0..8;
    pub const R_KEY: Range<usize> = 8..12;
    /// Swap data (CmpSwap) or add data (FetchAdd).
    pub const SWAP_ADD_DATA: Range<usize> = 12..20;
    pub const COMPARE_DATA: Range<usize> = 20..28;
}

/// Length of the AtomicETH.
pub const HEADER_LEN: usize = field::COMPARE_DATA.end;

fixed_view!(
    /// A view of an AtomicETH over a byte buffer.
    AtomicEth,
    HEADER_LEN,
    "AtomicETH"
);

impl<T: AsRef<[u8]>> AtomicEth<T> {
    /// The remote virtual address (8-byte aligned for a valid request).
    pub fn va(&self) -> u64 {
        be_u64(&self.buffer.as_ref()[field::VA])
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        be_u32(&self.buffer.as_ref()[field::R_KEY])
    }

    /// The swap data (CmpSwap) or add data (FetchAdd).
    pub fn swap_add(&self) -> u64 {
        be_u64(&self.buffer.as_ref()[field::SWAP_ADD_DATA])
    }

    /// The compare data (CmpSwap).
    pub fn compare(&self) -> u64 {
        be_u64(&self.buffer.as_ref()[field::COMPARE_DATA])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicEth<T> {
    /// Sets the remote virtual address.
    pub fn set_va(&mut self, va: u64) {
        put_be_u64(&mut self.buffer.as_mut()[field::VA], va);
    }

    /// Sets the remote key.
    pub fn set_rkey(&mut self, rkey: u32) {
        put_be_u32(&mut self.buffer.as_mut()[field::R_KEY], rkey);
    }

    /// Sets the swap or add data.
    pub fn set_swap_add(&mut self, value: u64) {
        put_be_u64(&mut self.buffer.as_mut()[field::SWAP_ADD_DATA], value);
    }

    /// Sets the compare data.
    pub fn set_compare(&mut self, value: u64) {
        put_be_u64(&mut self.buffer.as_mut()[field::COMPARE_DATA], value);
    }
}

/// A parsed AtomicETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicEthRepr {
    /// The remote virtual address.
    pub va: u64,
    /// The remote key.
    pub rkey: u32,
    /// The swap data (CmpSwap) or add data (FetchAdd).
    pub swap_add: u64,
    /// The compare data (zero for FetchAdd).
    pub compare: u64,
}

impl AtomicEthRepr {
    /// Parses an AtomicETH.
    pub fn parse<T: AsRef<[u8]>>(eth: &AtomicEth<T>) -> Result<Self, Error> {
        eth.check_len()?;
        Ok(AtomicEthRepr {
            va: eth.va(),
            rkey: eth.rkey(),
            swap_add: eth.swap_add(),
            compare: eth.compare(),
        })
    }

    /// Writes the AtomicETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, eth: &mut AtomicEth<T>) {
        eth.set_va(self.va);
        eth.set_rkey(self.rkey);
        eth.set_swap_add(self.swap_add);
        eth.set_compare(self.compare);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_bytes_round_trip() {
        let golden: [u8; 28] = [
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x20, 0x08, // VA
            0x00, 0x00, 0x00, 0x07, // R_Key
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x09, // swap 9
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05, // compare 5
        ];
        let repr = AtomicEthRepr::parse(&AtomicEth::new_checked(&golden[..]).unwrap()).unwrap();
        assert_eq!(
            repr,
            AtomicEthRepr {
                va: 0x2008,
                rkey: 7,
                swap_add: 9,
                compare: 5
            }
        );
        let mut buf = [0u8; 28];
        repr.emit(&mut AtomicEth::new_unchecked(&mut buf[..]));
        assert_eq!(buf, golden);
    }

    #[test]
    fn short_buffer_is_rejected() {
        assert!(AtomicEth::new_checked(&[0u8; 27][..]).is_err());
    }
}
