//! The UDP header. RoCEv2 packets go to destination port 4791.

use std::net::IpAddr;

use super::checksum;
use crate::bytes::{be_u16, put_be_u16};
use crate::error::{check_len, Error};

/// Byte ranges of the UDP header (RFC 768).
pub(crate) mod field {
    use core::ops::Range;
    pub const SRC_PORT: Range<usize> = 0..2;
    pub const DST_PORT: Range<usize> = 2..4;
    pub const LENGTH: Range<usize> = 4..6;
    pub const CHECKSUM: Range<usize> = 6..8;
}

/// Length of the UDP header.
pub const HEADER_LEN: usize = field::CHECKSUM.end;
/// The UDP destination port of RoCEv2.
pub const ROCEV2_PORT: u16 = 4791;

const LAYOUT: &str = "UDP header";

/// A view of a UDP datagram over a byte buffer.
#[derive(Debug, Clone)]
pub struct UdpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> UdpPacket<T> {
    /// Wraps `buffer` without checking its length; accessors panic if it is too short.
    pub const fn new_unchecked(buffer: T) -> Self {
        UdpPacket { buffer }
    }

    /// Wraps `buffer` after checking it holds the header and the length it states.
    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Checks the buffer holds the header and the length it states.
    pub fn check_len(&self) -> Result<(), Error> {
        let b = self.buffer.as_ref();
        check_len(LAYOUT, b, HEADER_LEN)?;
        let len = usize::from(self.len());
        if len < HEADER_LEN || len > b.len() {
            return Err(Error::LengthMismatch {
                layout: LAYOUT,
                field: "length",
                stated: len,
                actual: b.len(),
            });
        }
        Ok(())
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The source port.
    pub fn src_port(&self) -> u16 {
        be_u16(&self.buffer.as_ref()[field::SRC_PORT])
    }

    /// The destination port.
    pub fn dst_port(&self) -> u16 {
        be_u16(&self.buffer.as_ref()[field::DST_PORT])
    }

    /// The length: header and payload.
    pub fn len(&self) -> u16 {
        be_u16(&self.buffer.as_ref()[field::LENGTH])
    }

    /// Whether the stated length is zero (which `check_len` refuses).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The checksum (0: none, allowed over IPv4).
    pub fn checksum(&self) -> u16 {
        be_u16(&self.buffer.as_ref()[field::CHECKSUM])
    }

    /// The payload, up to the stated length.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..usize::from(self.len())]
    }

    /// Whether the checksum is right for this source and destination (a zero checksum over
    /// IPv4 means "none" and passes).
    pub fn verify_checksum(&self, src: IpAddr, dst: IpAddr) -> bool {
        if self.checksum() == 0 && src.is_ipv4() {
            return true;
        }
        let datagram = &self.buffer.as_ref()[..usize::from(self.len())];
        checksum::combine(&[
            pseudo_header(src, dst, datagram.len()),
            checksum::sum(datagram),
        ]) == 0xffff
    }
}

fn pseudo_header(src: IpAddr, dst: IpAddr, len: usize) -> u16 {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => checksum::pseudo_header_v4(s, d, 17, len as u32),
        (IpAddr::V6(s), IpAddr::V6(d)) => checksum::pseudo_header_v6(s, d, 17, len as u32),
        (s, d) => checksum::pseudo_header_v6(to_v6(s), to_v6(d), 17, len as u32),
    }
}

fn to_v6(addr: IpAddr) -> std::net::Ipv6Addr {
    match addr {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> UdpPacket<T> {
    /// Sets the source port.
    pub fn set_src_port(&mut self, port: u16) {
        put_be_u16(&mut self.buffer.as_mut()[field::SRC_PORT], port);
    }

    /// Sets the destination port.
    pub fn set_dst_port(&mut self, port: u16) {
        put_be_u16(&mut self.buffer.as_mut()[field::DST_PORT], port);
    }

    /// Sets the length.
    pub fn set_len(&mut self, len: u16) {
        put_be_u16(&mut self.buffer.as_mut()[field::LENGTH], len);
    }

    /// Sets the checksum.
    pub fn set_checksum(&mut self, checksum: u16) {
        put_be_u16(&mut self.buffer.as_mut()[field::CHECKSUM], checksum);
    }

    /// Computes and writes the checksum over the pseudo-header, header and payload (a result
    /// of zero is sent as 0xffff, RFC 768).
    pub fn fill_checksum(&mut self, src: IpAddr, dst: IpAddr) {
        self.set_checksum(0);
        let len = usize::from(self.len());
        let datagram = &self.buffer.as_ref()[..len];
        let sum = !checksum::combine(&[pseudo_header(src, dst, len), checksum::sum(datagram)]);
        self.set_checksum(if sum == 0 { 0xffff } else { sum });
    }

    /// The payload, writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let len = usize::from(self.len());
        &mut self.buffer.as_mut()[HEADER_LEN..len]
    }
}

/// A parsed UDP header. The length and checksum follow from the payload and the addresses and
/// are computed on emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdpRepr {
    /// The source port (rxe derives it from the QPN).
    pub src_port: u16,
    /// The destination port (4791 for RoCEv2).
    pub dst_port: u16,
}

impl UdpRepr {
    /// Parses a header (the checksum is not checked here; see
    /// [`UdpPacket::verify_checksum`]).
    pub fn parse<T: AsRef<[u8]>>(packet: &UdpPacket<T>) -> Result<Self, Error> {
        packet.check_len()?;
        Ok(UdpRepr {
            src_port: packet.src_port(),
            dst_port: packet.dst_port(),
        })
    }

    /// The header length when emitted.
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header for `payload_len` bytes of payload with checksum zero; fill it with
    /// [`UdpPacket::fill_checksum`] once the payload is in place, or leave it zero over IPv4 as
    /// rxe does.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        packet: &mut UdpPacket<T>,
        payload_len: usize,
    ) -> Result<(), Error> {
        check_len(LAYOUT, packet.buffer.as_ref(), HEADER_LEN)?;
        let len = HEADER_LEN + payload_len;
        if len > usize::from(u16::MAX) {
            return Err(Error::LengthMismatch {
                layout: LAYOUT,
                field: "length",
                stated: len,
                actual: usize::from(u16::MAX),
            });
        }
        packet.set_src_port(self.src_port);
        packet.set_dst_port(self.dst_port);
        packet.set_len(len as u16);
        packet.set_checksum(0);
        Ok(())
    }
}

/// The UDP source port rxe uses for a QP: `0xC000 + hash_32(qpn, 14)`, Linux's multiplicative
/// hash (`qpn * 0x61C88647`, top 14 bits). Our senders bind this port so packets look like
/// rxe's.
pub const fn rxe_src_port(qpn: u32) -> u16 {
    const GOLDEN_RATIO_32: u32 = 0x61c8_8647;
    0xc000 + (qpn.wrapping_mul(GOLDEN_RATIO_32) >> (32 - 14)) as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    const GOLDEN: [u8; 12] = [
        0xc0, 0x01, 0x12, 0xb7, // source port 0xc001, destination 4791
        0x00, 0x0c, 0x00, 0x00, // length 12, checksum none
        0xde, 0xad, 0xbe, 0xef, // payload
    ];

    #[test]
    fn golden_bytes_round_trip() {
        let packet = UdpPacket::new_checked(&GOLDEN[..]).unwrap();
        let repr = UdpRepr::parse(&packet).unwrap();
        assert_eq!(
            repr,
            UdpRepr {
                src_port: 0xc001,
                dst_port: ROCEV2_PORT
            }
        );
        assert_eq!(packet.payload(), &[0xde, 0xad, 0xbe, 0xef]);
        let mut buf = GOLDEN;
        buf[..8].fill(0xff);
        repr.emit(&mut UdpPacket::new_unchecked(&mut buf[..]), 4)
            .unwrap();
        assert_eq!(buf, GOLDEN);
    }

    #[test]
    fn filled_checksums_verify_over_both_families() {
        let mut buf = GOLDEN;
        let (s4, d4) = (Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2));
        let mut packet = UdpPacket::new_unchecked(&mut buf[..]);
        packet.fill_checksum(s4.into(), d4.into());
        assert_ne!(packet.checksum(), 0);
        assert!(packet.verify_checksum(s4.into(), d4.into()));
        let (s6, d6): (Ipv6Addr, Ipv6Addr) = (
            "2001:db8::1".parse().unwrap(),
            "2001:db8::2".parse().unwrap(),
        );
        packet.fill_checksum(s6.into(), d6.into());
        assert!(packet.verify_checksum(s6.into(), d6.into()));
        packet.payload_mut()[0] ^= 0x40;
        assert!(!packet.verify_checksum(s6.into(), d6.into()));
    }

    #[test]
    fn a_checksum_worked_by_hand_verifies() {
        // Pseudo-header 198.18.0.1 -> 198.18.0.2, proto 17, length 12:
        // c612+0001+c612+0002+0011+000c = 0x1_8c44; header and payload:
        // c001+12b7+000c+0000+dead+beef = 0x2_7060. Total 0x3_fca4 -> 0xfca7, inverted 0x0358.
        let mut buf = GOLDEN;
        buf[6..8].copy_from_slice(&[0x03, 0x58]);
        let packet = UdpPacket::new_unchecked(&buf[..]);
        assert!(packet.verify_checksum(
            Ipv4Addr::new(198, 18, 0, 1).into(),
            Ipv4Addr::new(198, 18, 0, 2).into()
        ));
    }

    #[test]
    fn a_length_beyond_the_buffer_is_refused() {
        assert!(UdpPacket::new_checked(&GOLDEN[..10]).is_err());
        let mut buf = GOLDEN;
        buf[5] = 4; // shorter than the header
        assert!(UdpPacket::new_checked(&buf[..]).is_err());
    }

    #[test]
    fn rxe_source_ports_stay_in_the_upper_quarter() {
        for qpn in [0u32, 1, 17, 0x11, 0xff_ffff] {
            assert!(rxe_src_port(qpn) >= 0xc000);
        }
        // hash_32(17, 14): 17 * 0x61c88647 mod 2^32 = 0x7e50_eab7, top 14 bits 0x1f94.
        assert_eq!(rxe_src_port(17), 0xc000 + 0x1f94);
    }
}
