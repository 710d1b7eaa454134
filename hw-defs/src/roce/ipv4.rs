//! The IPv4 header, as far as RoCEv2 needs it: 20 bytes, no options, no fragments.
//!
//! rxe computes the ICRC over exactly 20 bytes of IPv4 header, so a header with options
//! cannot carry a valid RoCEv2 packet; parsing refuses it rather than misreading it.

use std::net::Ipv4Addr;

use super::checksum;
use crate::bytes::{be_u16, put_be_u16};
use crate::error::{check_len, Error};

/// Byte ranges of the IPv4 header (RFC 791).
pub(crate) mod field {
    use core::ops::Range;
    pub const VER_IHL: usize = 0;
    /// `DSCP[7:2] ECN[1:0]`, the old type-of-service byte.
    pub const DSCP_ECN: usize = 1;
    pub const TOTAL_LENGTH: Range<usize> = 2..4;
    pub const IDENTIFICATION: Range<usize> = 4..6;
    /// `reserved[15] DF[14] MF[13]` fragment `offset[12:0]`.
    pub const FLAGS_FRAG_OFFSET: Range<usize> = 6..8;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const HEADER_CHECKSUM: Range<usize> = 10..12;
    pub const SRC_ADDR: Range<usize> = 12..16;
    pub const DST_ADDR: Range<usize> = 16..20;
}

/// Length of the header without options.
pub const HEADER_LEN: usize = field::DST_ADDR.end;
/// The protocol number of UDP.
pub const PROTOCOL_UDP: u8 = 17;

const LAYOUT: &str = "IPv4 header";
const FLAG_DF: u16 = 0x4000;
const FLAG_MF: u16 = 0x2000;
const FRAG_OFFSET_MASK: u16 = 0x1fff;

/// A view of an IPv4 header (and what follows it) over a byte buffer.
#[derive(Debug, Clone)]
pub struct Ipv4Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    /// Wraps `buffer` without checking its length; accessors panic if it is too short.
    pub const fn new_unchecked(buffer: T) -> Self {
        Ipv4Packet { buffer }
    }

    /// Wraps `buffer` after checking it holds the header and the total length it states.
    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Checks the buffer holds the 20-byte header and the total length it states, and that
    /// the stated lengths are consistent.
    pub fn check_len(&self) -> Result<(), Error> {
        let b = self.buffer.as_ref();
        check_len(LAYOUT, b, HEADER_LEN)?;
        let header_len = self.header_len();
        let total = usize::from(self.total_length());
        if header_len < HEADER_LEN || total < header_len {
            return Err(Error::LengthMismatch {
                layout: LAYOUT,
                field: "total length",
                stated: total,
                actual: header_len.max(HEADER_LEN),
            });
        }
        if b.len() < total {
            return Err(Error::LengthMismatch {
                layout: LAYOUT,
                field: "total length",
                stated: total,
                actual: b.len(),
            });
        }
        Ok(())
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The version (4 for IPv4).
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VER_IHL] >> 4
    }

    /// The header length in bytes (IHL x 4).
    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[field::VER_IHL] & 0x0f) * 4
    }

    /// The DSCP and ECN byte.
    pub fn dscp_ecn(&self) -> u8 {
        self.buffer.as_ref()[field::DSCP_ECN]
    }

    /// The total length: header and payload.
    pub fn total_length(&self) -> u16 {
        be_u16(&self.buffer.as_ref()[field::TOTAL_LENGTH])
    }

    /// The identification.
    pub fn ident(&self) -> u16 {
        be_u16(&self.buffer.as_ref()[field::IDENTIFICATION])
    }

    fn flags_frag(&self) -> u16 {
        be_u16(&self.buffer.as_ref()[field::FLAGS_FRAG_OFFSET])
    }

    /// The don't-fragment flag.
    pub fn dont_frag(&self) -> bool {
        self.flags_frag() & FLAG_DF != 0
    }

    /// The more-fragments flag.
    pub fn more_frags(&self) -> bool {
        self.flags_frag() & FLAG_MF != 0
    }

    /// The fragment offset in 8-byte units.
    pub fn frag_offset(&self) -> u16 {
        self.flags_frag() & FRAG_OFFSET_MASK
    }

    /// The time to live.
    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[field::TTL]
    }

    /// The protocol of the payload.
    pub fn protocol(&self) -> u8 {
        self.buffer.as_ref()[field::PROTOCOL]
    }

    /// The header checksum.
    pub fn checksum(&self) -> u16 {
        be_u16(&self.buffer.as_ref()[field::HEADER_CHECKSUM])
    }

    /// The source address.
    pub fn src_addr(&self) -> Ipv4Addr {
        let b = &self.buffer.as_ref()[field::SRC_ADDR];
        Ipv4Addr::new(b[0], b[1], b[2], b[3])
    }

    /// The destination address.
    pub fn dst_addr(&self) -> Ipv4Addr {
        let b = &self.buffer.as_ref()[field::DST_ADDR];
        Ipv4Addr::new(b[0], b[1], b[2], b[3])
    }

    /// Whether the header checksum is right.
    pub fn verify_checksum(&self) -> bool {
        checksum::sum(&self.buffer.as_ref()[..self.header_len()]) == 0xffff
    }

    /// The payload, up to the total length.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..usize::from(self.total_length())]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    /// Sets version 4 and the header length in bytes.
    pub fn set_version_and_header_len(&mut self, header_len: usize) {
        self.buffer.as_mut()[field::VER_IHL] = 0x40 | ((header_len / 4) as u8 & 0x0f);
    }

    /// Sets the DSCP and ECN byte.
    pub fn set_dscp_ecn(&mut self, value: u8) {
        self.buffer.as_mut()[field::DSCP_ECN] = value;
    }

    /// Sets the total length.
    pub fn set_total_length(&mut self, len: u16) {
        put_be_u16(&mut self.buffer.as_mut()[field::TOTAL_LENGTH], len);
    }

    /// Sets the identification.
    pub fn set_ident(&mut self, ident: u16) {
        put_be_u16(&mut self.buffer.as_mut()[field::IDENTIFICATION], ident);
    }

    /// Sets the flags and fragment offset: DF as given, MF clear, offset zero.
    pub fn set_dont_frag(&mut self, df: bool) {
        put_be_u16(
            &mut self.buffer.as_mut()[field::FLAGS_FRAG_OFFSET],
            if df { FLAG_DF } else { 0 },
        );
    }

    /// Sets the time to live.
    pub fn set_ttl(&mut self, ttl: u8) {
        self.buffer.as_mut()[field::TTL] = ttl;
    }

    /// Sets the protocol.
    pub fn set_protocol(&mut self, protocol: u8) {
        self.buffer.as_mut()[field::PROTOCOL] = protocol;
    }

    /// Sets the source address.
    pub fn set_src_addr(&mut self, addr: Ipv4Addr) {
        self.buffer.as_mut()[field::SRC_ADDR].copy_from_slice(&addr.octets());
    }

    /// Sets the destination address.
    pub fn set_dst_addr(&mut self, addr: Ipv4Addr) {
        self.buffer.as_mut()[field::DST_ADDR].copy_from_slice(&addr.octets());
    }

    /// Computes and writes the header checksum.
    pub fn fill_checksum(&mut self) {
        put_be_u16(&mut self.buffer.as_mut()[field::HEADER_CHECKSUM], 0);
        let header_len = self.header_len();
        let sum = !checksum::sum(&self.buffer.as_ref()[..header_len]);
        put_be_u16(&mut self.buffer.as_mut()[field::HEADER_CHECKSUM], sum);
    }

    /// The payload, writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let (start, end) = (self.header_len(), usize::from(self.total_length()));
        &mut self.buffer.as_mut()[start..end]
    }
}

/// A parsed IPv4 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Repr {
    /// The source address.
    pub src_addr: Ipv4Addr,
    /// The destination address.
    pub dst_addr: Ipv4Addr,
    /// The payload protocol.
    pub protocol: u8,
    /// The payload length. Emitting a whole datagram computes it instead.
    pub payload_len: usize,
    /// The time to live.
    pub ttl: u8,
    /// The DSCP and ECN byte.
    pub dscp_ecn: u8,
    /// The identification (0 for what our senders emit, like rxe).
    pub ident: u16,
    /// The don't-fragment flag (set for what our senders emit, like rxe).
    pub dont_frag: bool,
}

impl Ipv4Repr {
    /// Parses a header: version 4, no options, not a fragment, correct checksum.
    pub fn parse<T: AsRef<[u8]>>(packet: &Ipv4Packet<T>) -> Result<Self, Error> {
        packet.check_len()?;
        if packet.version() != 4 {
            return Err(Error::BadField {
                layout: LAYOUT,
                field: "version",
                value: u64::from(packet.version()),
                expected: "4",
            });
        }
        if packet.header_len() != HEADER_LEN {
            return Err(Error::BadField {
                layout: LAYOUT,
                field: "IHL",
                value: packet.header_len() as u64 / 4,
                expected: "5 (RoCEv2 and its ICRC do not allow IPv4 options)",
            });
        }
        if packet.more_frags() || packet.frag_offset() != 0 {
            return Err(Error::BadField {
                layout: LAYOUT,
                field: "flags and fragment offset",
                value: u64::from(packet.flags_frag()),
                expected: "an unfragmented datagram",
            });
        }
        if !packet.verify_checksum() {
            return Err(Error::BadChecksum { layout: LAYOUT });
        }
        Ok(Ipv4Repr {
            src_addr: packet.src_addr(),
            dst_addr: packet.dst_addr(),
            protocol: packet.protocol(),
            payload_len: usize::from(packet.total_length()) - HEADER_LEN,
            ttl: packet.ttl(),
            dscp_ecn: packet.dscp_ecn(),
            ident: packet.ident(),
            dont_frag: packet.dont_frag(),
        })
    }

    /// The header length when emitted.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the 20-byte header, checksum included. Fails if the payload length does not fit
    /// the 16-bit total length.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        packet: &mut Ipv4Packet<T>,
    ) -> Result<(), Error> {
        check_len(LAYOUT, packet.buffer.as_ref(), HEADER_LEN)?;
        let total = HEADER_LEN + self.payload_len;
        if total > usize::from(u16::MAX) {
            return Err(Error::LengthMismatch {
                layout: LAYOUT,
                field: "total length",
                stated: total,
                actual: usize::from(u16::MAX),
            });
        }
        packet.set_version_and_header_len(HEADER_LEN);
        packet.set_dscp_ecn(self.dscp_ecn);
        packet.set_total_length(total as u16);
        packet.set_ident(self.ident);
        packet.set_dont_frag(self.dont_frag);
        packet.set_ttl(self.ttl);
        packet.set_protocol(self.protocol);
        packet.set_src_addr(self.src_addr);
        packet.set_dst_addr(self.dst_addr);
        packet.fill_checksum();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 198.18.0.1 -> 198.18.0.2, UDP, 40 bytes in all, DF, ID 0, TTL 64, TOS 0: the header rxe
    /// would put in front of a 12-byte UDP payload. Checksum worked by hand:
    /// 4500 + 0028 + 0000 + 4000 + 4011 + c612 + 0001 + c612 + 0002 = 0x2_5160 -> 0x5162,
    /// inverted 0xae9d.
    const GOLDEN: [u8; 20] = [
        0x45, 0x00, 0x00, 0x28, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xae, 0x9d, 198, 18, 0, 1, 198,
        18, 0, 2,
    ];

    fn golden_repr() -> Ipv4Repr {
        Ipv4Repr {
            src_addr: Ipv4Addr::new(198, 18, 0, 1),
            dst_addr: Ipv4Addr::new(198, 18, 0, 2),
            protocol: PROTOCOL_UDP,
            payload_len: 20,
            ttl: 64,
            dscp_ecn: 0,
            ident: 0,
            dont_frag: true,
        }
    }

    fn with_payload(header: &[u8; 20]) -> Vec<u8> {
        let mut v = header.to_vec();
        v.resize(40, 0);
        v
    }

    #[test]
    fn golden_bytes_parse_to_the_fields_written() {
        let bytes = with_payload(&GOLDEN);
        let packet = Ipv4Packet::new_checked(&bytes[..]).unwrap();
        assert!(packet.verify_checksum());
        assert_eq!(Ipv4Repr::parse(&packet).unwrap(), golden_repr());
    }

    #[test]
    fn repr_emits_the_golden_bytes() {
        let mut buf = [0xffu8; 20];
        golden_repr()
            .emit(&mut Ipv4Packet::new_unchecked(&mut buf[..]))
            .unwrap();
        assert_eq!(buf, GOLDEN);
    }

    #[test]
    fn a_wrong_checksum_is_refused() {
        let mut bytes = with_payload(&GOLDEN);
        bytes[11] ^= 1;
        assert_eq!(
            Ipv4Repr::parse(&Ipv4Packet::new_unchecked(&bytes[..])),
            Err(Error::BadChecksum { layout: LAYOUT })
        );
    }

    #[test]
    fn options_are_refused() {
        let mut bytes = with_payload(&GOLDEN);
        bytes[0] = 0x46;
        let packet = Ipv4Packet::new_checked(&bytes[..]).unwrap();
        assert!(matches!(
            Ipv4Repr::parse(&packet),
            Err(Error::BadField { field: "IHL", .. })
        ));
    }

    #[test]
    fn fragments_are_refused() {
        let mut bytes = with_payload(&GOLDEN);
        bytes[6] = 0x20; // MF
        let mut packet = Ipv4Packet::new_unchecked(&mut bytes[..]);
        packet.fill_checksum();
        assert!(matches!(
            Ipv4Repr::parse(&Ipv4Packet::new_unchecked(&bytes[..])),
            Err(Error::BadField {
                field: "flags and fragment offset",
                ..
            })
        ));
    }

    #[test]
    fn a_total_length_beyond_the_buffer_is_refused() {
        assert!(matches!(
            Ipv4Packet::new_checked(&GOLDEN[..]),
            Err(Error::LengthMismatch {
                stated: 40,
                actual: 20,
                ..
            })
        ));
    }

    #[test]
    fn ihl_below_five_is_refused() {
        let mut bytes = with_payload(&GOLDEN);
        bytes[0] = 0x44;
        assert!(Ipv4Packet::new_checked(&bytes[..]).is_err());
    }
}
