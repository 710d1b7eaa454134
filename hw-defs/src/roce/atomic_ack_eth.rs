//! The Atomic Acknowledge Extended Transport Header: the value the target held before the
//! atomic.

use crate::bytes::{be_u64, put_be_u64};
use crate::error::Error;

/// Byte ranges of the AtomicAckETH (IBA 9.3.6).
pub(crate) mod field {
    use core::ops::Range;
    pub const ORIG_REM_DT: Range<usize> = 0..8;
}

/// Length of the AtomicAckETH.
pub const HEADER_LEN: usize = field::ORIG_REM_DT.end;

fixed_view!(
    /// A view of an AtomicAckETH over a byte buffer.
    AtomicAckEth,
    HEADER_LEN,
    "AtomicAckETH"
);

impl<T: AsRef<[u8]>> AtomicAckEth<T> {
    /// The original remote data.
    pub fn orig_rem_dt(&self) -> u64 {
        be_u64(&self.buffer.as_ref()[field::ORIG_REM_DT])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicAckEth<T> {
    /// Sets the original remote data.
    pub fn set_orig_rem_dt(&mut self, value: u64) {
        put_be_u64(&mut self.buffer.as_mut()[field::ORIG_REM_DT], value);
    }
}

/// A parsed AtomicAckETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicAckEthRepr {
    /// The value at the target before the atomic executed.
    pub orig_rem_dt: u64,
}

impl AtomicAckEthRepr {
    /// Parses an AtomicAckETH.
    pub fn parse<T: AsRef<[u8]>>(eth: &AtomicAckEth<T>) -> Result<Self, Error> {
        eth.check_len()?;
        Ok(AtomicAckEthRepr {
            orig_rem_dt: eth.orig_rem_dt(),
        })
    }

    /// Writes the AtomicAckETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, eth: &mut AtomicAckEth<T>) {
        eth.set_orig_rem_dt(self.orig_rem_dt);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_bytes_round_trip() {
        let golden = [0, 0, 0, 0, 0, 0, 0x01, 0x00];
        let repr =
            AtomicAckEthRepr::parse(&AtomicAckEth::new_checked(&golden[..]).unwrap()).unwrap();
        assert_eq!(repr.orig_rem_dt, 256);
        let mut buf = [0xffu8; 8];
        repr.emit(&mut AtomicAckEth::new_unchecked(&mut buf[..]));
        assert_eq!(buf, golden);
    }

    #[test]
    fn short_buffer_is_rejected() {
        assert!(AtomicAckEth::new_checked(&[0u8; 7][..]).is_err());
    }
}
