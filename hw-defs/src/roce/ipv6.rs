//! The IPv6 header, as far as RoCEv2 needs it: the fixed 40 bytes, next header UDP, no
//! extension headers (rxe's ICRC covers exactly the fixed header followed by UDP).

use std::net::Ipv6Addr;

use crate::bytes::{be_u16, be_u32, put_be_u16, put_be_u32};
use crate::error::{check_len, Error};

/// Byte ranges of the IPv6 header (RFC 8200).
pub(crate) mod field {
    use core::ops::Range;
    /// `version[31:28]` traffic `class[27:20]` flow `label[19:0]`.
    pub const VER_TC_FLOW: Range<usize> = 0..4;
    pub const PAYLOAD_LENGTH: Range<usize> = 4..6;
    pub const NEXT_HEADER: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SRC_ADDR: Range<usize> = 8..24;
    pub const DST_ADDR: Range<usize> = 24..40;
}

/// Length of the fixed header.
pub const HEADER_LEN: usize = field::DST_ADDR.end;

const LAYOUT: &str = "IPv6 header";
const FLOW_LABEL_MASK: u32 = 0x000f_ffff;

/// A view of an IPv6 header (and what follows it) over a byte buffer.
#[derive(Debug, Clone)]
pub struct Ipv6Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv6Packet<T> {
    /// Wraps `buffer` without checking its length; accessors panic if it is too short.
    pub const fn new_unchecked(buffer: T) -> Self {
        Ipv6Packet { buffer }
    }

    /// Wraps `buffer` after checking it holds the header and the payload length it states.
    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Checks the buffer holds the header and the payload length it states.
    pub fn check_len(&self) -> Result<(), Error> {
        let b = self.buffer.as_ref();
        check_len(LAYOUT, b, HEADER_LEN)?;
        let total = HEADER_LEN + usize::from(self.payload_len());
        if b.len() < total {
            return Err(Error::LengthMismatch {
                layout: LAYOUT,
                field: "payload length",
                stated: usize::from(self.payload_len()),
                actual: b.len() - HEADER_LEN,
            });
        }
        Ok(())
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn ver_tc_flow(&self) -> u32 {
        be_u32(&self.buffer.as_ref()[field::VER_TC_FLOW])
    }

    /// The version (6 for IPv6).
    pub fn version(&self) -> u8 {
        (self.ver_tc_flow() >> 28) as u8
    }

    /// The traffic class.
    pub fn traffic_class(&self) -> u8 {
        (self.ver_tc_flow() >> 20) as u8
    }

    /// The flow label (20 bits).
    pub fn flow_label(&self) -> u32 {
        self.ver_tc_flow() & FLOW_LABEL_MASK
    }

    /// The payload length.
    pub fn payload_len(&self) -> u16 {
        be_u16(&self.buffer.as_ref()[field::PAYLOAD_LENGTH])
    }

    /// The next header.
    pub fn next_header(&self) -> u8 {
        self.buffer.as_ref()[field::NEXT_HEADER]
    }

    /// The hop limit.
    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[field::HOP_LIMIT]
    }

    /// The source address.
    pub fn src_addr(&self) -> Ipv6Addr {
        let mut octets = [0u8; 16];
        octets.copy_from_slice(&self.buffer.as_ref()[field::SRC_ADDR]);
        Ipv6Addr::from(octets)
    }

    /// The destination address.
    pub fn dst_addr(&self) -> Ipv6Addr {
        let mut octets = [0u8; 16];
        octets.copy_from_slice(&self.buffer.as_ref()[field::DST_ADDR]);
        Ipv6Addr::from(octets)
    }

    /// The payload, up to the payload length.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..HEADER_LEN + usize::from(self.payload_len())]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv6Packet<T> {
    /// Sets version 6, the traffic class and the flow label (20 bits).
    pub fn set_version_class_flow(&mut self, traffic_class: u8, flow_label: u32) {
        put_be_u32(
            &mut self.buffer.as_mut()[field::VER_TC_FLOW],
            (6 << 28) | (u32::from(traffic_class) << 20) | (flow_label & FLOW_LABEL_MASK),
        );
    }

    /// Sets the payload length.
    pub fn set_payload_len(&mut self, len: u16) {
        put_be_u16(&mut self.buffer.as_mut()[field::PAYLOAD_LENGTH], len);
    }

    /// Sets the next header.
    pub fn set_next_header(&mut self, next_header: u8) {
        self.buffer.as_mut()[field::NEXT_HEADER] = next_header;
    }

    /// Sets the hop limit.
    pub fn set_hop_limit(&mut self, hop_limit: u8) {
        self.buffer.as_mut()[field::HOP_LIMIT] = hop_limit;
    }

    /// Sets the source address.
    pub fn set_src_addr(&mut self, addr: Ipv6Addr) {
        self.buffer.as_mut()[field::SRC_ADDR].copy_from_slice(&addr.octets());
    }

    /// Sets the destination address.
    pub fn set_dst_addr(&mut self, addr: Ipv6Addr) {
        self.buffer.as_mut()[field::DST_ADDR].copy_from_slice(&addr.octets());
    }

    /// The payload, writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = HEADER_LEN + usize::from(self.payload_len());
        &mut self.buffer.as_mut()[HEADER_LEN..end]
    }
}

/// A parsed IPv6 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6Repr {
    /// The source address.
    pub src_addr: Ipv6Addr,
    /// The destination address.
    pub dst_addr: Ipv6Addr,
    /// The next header.
    pub next_header: u8,
    /// The payload length. Emitting a whole datagram computes it instead.
    pub payload_len: usize,
    /// The hop limit.
    pub hop_limit: u8,
    /// The traffic class.
    pub traffic_class: u8,
    /// The flow label (20 bits).
    pub flow_label: u32,
}

impl Ipv6Repr {
    /// Parses a header: version 6.
    pub fn parse<T: AsRef<[u8]>>(packet: &Ipv6Packet<T>) -> Result<Self, Error> {
        packet.check_len()?;
        if packet.version() != 6 {
            return Err(Error::BadField {
                layout: LAYOUT,
                field: "version",
                value: u64::from(packet.version()),
                expected: "6",
            });
        }
        Ok(Ipv6Repr {
            src_addr: packet.src_addr(),
            dst_addr: packet.dst_addr(),
            next_header: packet.next_header(),
            payload_len: usize::from(packet.payload_len()),
            hop_limit: packet.hop_limit(),
            traffic_class: packet.traffic_class(),
            flow_label: packet.flow_label(),
        })
    }

    /// The header length when emitted.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the 40-byte header. Fails if the payload length does not fit 16 bits.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        packet: &mut Ipv6Packet<T>,
    ) -> Result<(), Error> {
        check_len(LAYOUT, packet.buffer.as_ref(), HEADER_LEN)?;
        if self.payload_len > usize::from(u16::MAX) {
            return Err(Error::LengthMismatch {
                layout: LAYOUT,
                field: "payload length",
                stated: self.payload_len,
                actual: usize::from(u16::MAX),
            });
        }
        packet.set_version_class_flow(self.traffic_class, self.flow_label);
        packet.set_payload_len(self.payload_len as u16);
        packet.set_next_header(self.next_header);
        packet.set_hop_limit(self.hop_limit);
        packet.set_src_addr(self.src_addr);
        packet.set_dst_addr(self.dst_addr);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2001:db8::1 -> 2001:db8::2, UDP, 8 bytes of payload, traffic class 0x2a, flow label
    /// 0x12345, hop limit 64: written out by hand from RFC 8200.
    const GOLDEN: [u8; 40] = [
        0x62, 0xa1, 0x23, 0x45, // version 6, class 0x2a, flow 0x12345
        0x00, 0x08, 17, 64, // payload length 8, next header UDP, hop limit
        0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, // source
        0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, // destination
    ];

    fn golden_repr() -> Ipv6Repr {
        Ipv6Repr {
            src_addr: "2001:db8::1".parse().unwrap(),
            dst_addr: "2001:db8::2".parse().unwrap(),
            next_header: 17,
            payload_len: 8,
            hop_limit: 64,
            traffic_class: 0x2a,
            flow_label: 0x12345,
        }
    }

    #[test]
    fn golden_bytes_round_trip() {
        let mut bytes = GOLDEN.to_vec();
        bytes.resize(48, 0);
        let repr = Ipv6Repr::parse(&Ipv6Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(repr, golden_repr());
        let mut buf = [0xffu8; 40];
        repr.emit(&mut Ipv6Packet::new_unchecked(&mut buf[..]))
            .unwrap();
        assert_eq!(buf, GOLDEN);
    }

    #[test]
    fn a_payload_length_beyond_the_buffer_is_refused() {
        assert!(matches!(
            Ipv6Packet::new_checked(&GOLDEN[..]),
            Err(Error::LengthMismatch {
                stated: 8,
                actual: 0,
                ..
            })
        ));
    }

    #[test]
    fn another_version_is_refused() {
        let mut bytes = GOLDEN.to_vec();
        bytes.resize(48, 0);
        bytes[0] = 0x42;
        assert!(matches!(
            Ipv6Repr::parse(&Ipv6Packet::new_unchecked(&bytes[..])),
            Err(Error::BadField {
                field: "version",
                ..
            })
        ));
    }
}
