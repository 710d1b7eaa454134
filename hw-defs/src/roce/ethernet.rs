//! The Ethernet II header, for captures (RoCEv2 itself starts at the IP header).

use crate::bytes::{be_u16, put_be_u16};
use crate::error::Error;

/// Byte ranges of the Ethernet II header.
pub(crate) mod field {
    use core::ops::Range;
    pub const DESTINATION: Range<usize> = 0..6;
    pub const SOURCE: Range<usize> = 6..12;
    pub const ETHERTYPE: Range<usize> = 12..14;
}

/// Length of the Ethernet II header.
pub const HEADER_LEN: usize = field::ETHERTYPE.end;
/// The EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// The EtherType of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;

/// A MAC address.
pub type MacAddr = [u8; 6];

fixed_view!(
    /// A view of an Ethernet II header (and its payload) over a byte buffer.
    EthernetFrame,
    HEADER_LEN,
    "Ethernet header"
);

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    /// The destination MAC address.
    pub fn dst_addr(&self) -> MacAddr {
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&self.buffer.as_ref()[field::DESTINATION]);
        mac
    }

    /// The source MAC address.
    pub fn src_addr(&self) -> MacAddr {
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&self.buffer.as_ref()[field::SOURCE]);
        mac
    }

    /// The EtherType.
    pub fn ethertype(&self) -> u16 {
        be_u16(&self.buffer.as_ref()[field::ETHERTYPE])
    }

    /// The payload.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    /// Sets the destination MAC address.
    pub fn set_dst_addr(&mut self, mac: MacAddr) {
        self.buffer.as_mut()[field::DESTINATION].copy_from_slice(&mac);
    }

    /// Sets the source MAC address.
    pub fn set_src_addr(&mut self, mac: MacAddr) {
        self.buffer.as_mut()[field::SOURCE].copy_from_slice(&mac);
    }

    /// Sets the EtherType.
    pub fn set_ethertype(&mut self, ethertype: u16) {
        put_be_u16(&mut self.buffer.as_mut()[field::ETHERTYPE], ethertype);
    }

    /// The payload, writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..]
    }
}

/// A parsed Ethernet II header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EthernetRepr {
    /// The source MAC address.
    pub src_addr: MacAddr,
    /// The destination MAC address.
    pub dst_addr: MacAddr,
    /// The EtherType.
    pub ethertype: u16,
}

impl EthernetRepr {
    /// Parses an Ethernet II header.
    pub fn parse<T: AsRef<[u8]>>(frame: &EthernetFrame<T>) -> Result<Self, Error> {
        frame.check_len()?;
        Ok(EthernetRepr {
            src_addr: frame.src_addr(),
            dst_addr: frame.dst_addr(),
            ethertype: frame.ethertype(),
        })
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, frame: &mut EthernetFrame<T>) {
        frame.set_dst_addr(self.dst_addr);
        frame.set_src_addr(self.src_addr);
        frame.set_ethertype(self.ethertype);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_bytes_round_trip() {
        let golden = [
            0x02, 0, 0, 0, 0, 2, // destination
            0x02, 0, 0, 0, 0, 1, // source
            0x08, 0x00, // IPv4
        ];
        let repr = EthernetRepr::parse(&EthernetFrame::new_checked(&golden[..]).unwrap()).unwrap();
        assert_eq!(
            repr,
            EthernetRepr {
                src_addr: [2, 0, 0, 0, 0, 1],
                dst_addr: [2, 0, 0, 0, 0, 2],
                ethertype: ETHERTYPE_IPV4
            }
        );
        let mut buf = [0u8; 14];
        repr.emit(&mut EthernetFrame::new_unchecked(&mut buf[..]));
        assert_eq!(buf, golden);
    }

    #[test]
    fn short_buffer_is_rejected() {
        assert!(EthernetFrame::new_checked(&[0u8; 13][..]).is_err());
    }
}
