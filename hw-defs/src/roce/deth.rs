//! The Datagram Extended Transport Header: the queue key and the sending QP of an unreliable
//! datagram (UD) packet. UD carries no connection, so each packet names its sender, and the
//! receiving QP takes it only if the queue key is its own.

use crate::bytes::{be_u32, put_be_u32};
use crate::error::Error;

/// Byte ranges of the DETH (IBA 9.3.2), named as the spec names them.
pub(crate) mod field {
    use core::ops::Range;
    pub const Q_KEY: Range<usize> = 0..4;
    pub const RESERVED: usize = 4;
    pub const SRC_QP: Range<usize> = 5..8;
}

/// Length of the DETH.
pub const HEADER_LEN: usize = field::SRC_QP.end;

/// QP numbers are 24 bits.
const QPN_MASK: u32 = 0x00ff_ffff;

fixed_view!(
    /// A view of a DETH over a byte buffer.
    Deth,
    HEADER_LEN,
    "DETH"
);

impl<T: AsRef<[u8]>> Deth<T> {
    /// The queue key the receiving QP must have.
    pub fn qkey(&self) -> u32 {
        be_u32(&self.buffer.as_ref()[field::Q_KEY])
    }

    /// The sending QP's number (24 bits).
    pub fn src_qp(&self) -> u32 {
        let b = &self.buffer.as_ref()[field::SRC_QP];
        u32::from_be_bytes([0, b[0], b[1], b[2]])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Deth<T> {
    /// Sets the queue key.
    pub fn set_qkey(&mut self, qkey: u32) {
        put_be_u32(&mut self.buffer.as_mut()[field::Q_KEY], qkey);
    }

    /// Sets the sending QP's number (its low 24 bits) and clears the reserved byte.
    pub fn set_src_qp(&mut self, qpn: u32) {
        let bytes = (qpn & QPN_MASK).to_be_bytes();
        let buf = self.buffer.as_mut();
        buf[field::RESERVED] = 0;
        buf[field::SRC_QP].copy_from_slice(&bytes[1..]);
    }
}

/// A parsed DETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DethRepr {
    /// The queue key the receiving QP must have.
    pub qkey: u32,
    /// The sending QP's number (24 bits).
    pub src_qp: u32,
}

impl DethRepr {
    /// Parses a DETH. The reserved byte is ignored, as receivers must (IBA 9.3.2).
    pub fn parse<T: AsRef<[u8]>>(deth: &Deth<T>) -> Result<Self, Error> {
        deth.check_len()?;
        Ok(DethRepr {
            qkey: deth.qkey(),
            src_qp: deth.src_qp(),
        })
    }

    /// Writes the DETH (a source QPN above 24 bits is cut to its low 24).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, deth: &mut Deth<T>) {
        deth.set_qkey(self.qkey);
        deth.set_src_qp(self.src_qp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_bytes_round_trip() {
        let golden: [u8; 8] = [
            0x80, 0x01, 0x02, 0x03, // Q_Key
            0x00, // reserved
            0x12, 0x34, 0x56, // source QP
        ];
        let repr = DethRepr::parse(&Deth::new_checked(&golden[..]).unwrap()).unwrap();
        assert_eq!(
            repr,
            DethRepr {
                qkey: 0x8001_0203,
                src_qp: 0x12_3456
            }
        );
        let mut buf = [0xffu8; 8];
        repr.emit(&mut Deth::new_unchecked(&mut buf[..]));
        assert_eq!(buf, golden);
    }

    #[test]
    fn the_reserved_byte_is_ignored_and_the_qpn_cut_to_24_bits() {
        let mut bytes = [0u8, 0, 0, 1, 0xee, 0, 0, 7];
        let repr = DethRepr::parse(&Deth::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(repr, DethRepr { qkey: 1, src_qp: 7 });
        DethRepr {
            qkey: 1,
            src_qp: 0xab12_3456,
        }
        .emit(&mut Deth::new_unchecked(&mut bytes[..]));
        assert_eq!(&bytes[4..], &[0, 0x12, 0x34, 0x56]);
    }

    #[test]
    fn short_buffer_is_rejected() {
        assert!(Deth::new_checked(&[0u8; 7][..]).is_err());
    }
}
