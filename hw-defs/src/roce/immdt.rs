//! The Immediate Data extended transport header: four bytes handed to the receiver's CQE.

use crate::bytes::{be_u32, put_be_u32};
use crate::error::Error;

/// Byte ranges of ImmDt (IBA 9.3.5).
pub(crate) mod field {
    use core::ops::Range;
    pub const IMMEDIATE_DATA: Range<usize> = 0..4;
}

/// Length of ImmDt.
pub const HEADER_LEN: usize = field::IMMEDIATE_DATA.end;

fixed_view!(
    /// A view of ImmDt over a byte buffer.
    ImmDt,
    HEADER_LEN,
    "ImmDt"
);

impl<T: AsRef<[u8]>> ImmDt<T> {
    /// The immediate, read big-endian (the same number the CQE reports).
    pub fn imm(&self) -> u32 {
        be_u32(&self.buffer.as_ref()[field::IMMEDIATE_DATA])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ImmDt<T> {
    /// Sets the immediate.
    pub fn set_imm(&mut self, imm: u32) {
        put_be_u32(&mut self.buffer.as_mut()[field::IMMEDIATE_DATA], imm);
    }
}

/// A parsed ImmDt: the immediate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ImmDtRepr {
    /// The immediate.
    pub imm: u32,
}

impl ImmDtRepr {
    /// Parses ImmDt.
    pub fn parse<T: AsRef<[u8]>>(immdt: &ImmDt<T>) -> Result<Self, Error> {
        immdt.check_len()?;
        Ok(ImmDtRepr { imm: immdt.imm() })
    }

    /// Writes ImmDt.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, immdt: &mut ImmDt<T>) {
        immdt.set_imm(self.imm);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_bytes_round_trip() {
        let golden = [0x12, 0x34, 0x56, 0x78];
        let repr = ImmDtRepr::parse(&ImmDt::new_checked(&golden[..]).unwrap()).unwrap();
        assert_eq!(repr.imm, 0x1234_5678);
        let mut buf = [0u8; 4];
        repr.emit(&mut ImmDt::new_unchecked(&mut buf[..]));
        assert_eq!(buf, golden);
    }

    #[test]
    fn short_buffer_is_rejected() {
        assert!(ImmDt::new_checked(&[0u8; 3][..]).is_err());
    }
}
