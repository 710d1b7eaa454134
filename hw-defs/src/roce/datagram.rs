//! A whole RoCEv2 datagram: IP header, UDP header, transport packet, ICRC.
//!
//! [`DatagramRepr::emit`] computes every length and checksum: IPv4 total length and header
//! checksum, UDP length, the ICRC, and the UDP checksum (zero over IPv4, as rxe sends it; the
//! real checksum over IPv6, where zero is not allowed). [`DatagramRepr::parse`] checks them
//! all.

use std::net::IpAddr;

use super::icrc;
use super::ipv4::{self, Ipv4Packet, Ipv4Repr};
use super::ipv6::{self, Ipv6Packet, Ipv6Repr};
use super::packet::{Packet, PacketRepr};
use super::udp::{self, UdpPacket, UdpRepr};
use crate::error::{check_len, Error};

const LAYOUT: &str = "RoCEv2 datagram";

/// An IP header of either family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpRepr {
    /// IPv4.
    Ipv4(Ipv4Repr),
    /// IPv6.
    Ipv6(Ipv6Repr),
}

impl IpRepr {
    /// The header length.
    pub const fn header_len(&self) -> usize {
        match self {
            IpRepr::Ipv4(_) => ipv4::HEADER_LEN,
            IpRepr::Ipv6(_) => ipv6::HEADER_LEN,
        }
    }

    /// The source address.
    pub fn src_addr(&self) -> IpAddr {
        match self {
            IpRepr::Ipv4(r) => r.src_addr.into(),
            IpRepr::Ipv6(r) => r.src_addr.into(),
        }
    }

    /// The destination address.
    pub fn dst_addr(&self) -> IpAddr {
        match self {
            IpRepr::Ipv4(r) => r.dst_addr.into(),
            IpRepr::Ipv6(r) => r.dst_addr.into(),
        }
    }

    /// The ICRC inputs of this header.
    pub fn icrc_fields(&self) -> icrc::IpFields {
        match *self {
            IpRepr::Ipv4(r) => icrc::IpFields::V4 {
                src: r.src_addr,
                dst: r.dst_addr,
                ident: r.ident,
                dont_frag: r.dont_frag,
            },
            IpRepr::Ipv6(r) => icrc::IpFields::V6 {
                src: r.src_addr,
                dst: r.dst_addr,
            },
        }
    }

    fn with_payload_len(self, payload_len: usize) -> Self {
        match self {
            IpRepr::Ipv4(r) => IpRepr::Ipv4(Ipv4Repr {
                payload_len,
                protocol: ipv4::PROTOCOL_UDP,
                ..r
            }),
            IpRepr::Ipv6(r) => IpRepr::Ipv6(Ipv6Repr {
                payload_len,
                next_header: ipv4::PROTOCOL_UDP,
                ..r
            }),
        }
    }
}

/// A parsed RoCEv2 datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DatagramRepr<'a> {
    /// The IP header. On emit, its payload length and protocol are computed.
    pub ip: IpRepr,
    /// The UDP ports.
    pub udp: UdpRepr,
    /// The transport packet.
    pub packet: PacketRepr<'a>,
}

impl<'a> DatagramRepr<'a> {
    /// Parses a datagram starting at the IP header and checks every length and checksum, the
    /// RoCEv2 port and the ICRC. Bytes after the IP length (Ethernet padding) are ignored.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, Error> {
        check_len(LAYOUT, bytes, 1)?;
        let (ip, ip_payload): (IpRepr, &'a [u8]) = match bytes[0] >> 4 {
            4 => {
                let packet = Ipv4Packet::new_checked(bytes)?;
                let repr = Ipv4Repr::parse(&packet)?;
                let end = usize::from(packet.total_length());
                (IpRepr::Ipv4(repr), &bytes[ipv4::HEADER_LEN..end])
            }
            6 => {
                let packet = Ipv6Packet::new_checked(bytes)?;
                let repr = Ipv6Repr::parse(&packet)?;
                let end = ipv6::HEADER_LEN + repr.payload_len;
                (IpRepr::Ipv6(repr), &bytes[ipv6::HEADER_LEN..end])
            }
            version => {
                return Err(Error::BadField {
                    layout: LAYOUT,
                    field: "IP version",
                    value: u64::from(version),
                    expected: "4 or 6",
                })
            }
        };
        let protocol = match ip {
            IpRepr::Ipv4(r) => r.protocol,
            IpRepr::Ipv6(r) => r.next_header,
        };
        if protocol != ipv4::PROTOCOL_UDP {
            return Err(Error::BadField {
                layout: LAYOUT,
                field: "IP protocol",
                value: u64::from(protocol),
                expected: "17 (UDP)",
            });
        }
        let udp_packet = UdpPacket::new_checked(ip_payload)?;
        if usize::from(udp_packet.len()) != ip_payload.len() {
            return Err(Error::LengthMismatch {
                layout: LAYOUT,
                field: "UDP length",
                stated: usize::from(udp_packet.len()),
                actual: ip_payload.len(),
            });
        }
        let udp = UdpRepr::parse(&udp_packet)?;
        if udp.dst_port != udp::ROCEV2_PORT {
            return Err(Error::BadField {
                layout: LAYOUT,
                field: "UDP destination port",
                value: u64::from(udp.dst_port),
                expected: "4791",
            });
        }
        if !udp_packet.verify_checksum(ip.src_addr(), ip.dst_addr()) {
            return Err(Error::BadChecksum {
                layout: "UDP header",
            });
        }
        let transport: &'a [u8] = &ip_payload[udp::HEADER_LEN..];
        let packet = Packet::new_checked(transport)?;
        let repr = PacketRepr::parse(&packet)?;
        icrc::verify_udp_payload(ip.icrc_fields(), udp.src_port, udp.dst_port, transport)?;
        Ok(DatagramRepr {
            ip,
            udp,
            packet: repr,
        })
    }

    /// The bytes the datagram takes.
    pub fn buffer_len(&self) -> usize {
        self.ip.header_len() + udp::HEADER_LEN + self.packet.buffer_len()
    }

    /// Writes the datagram into `buffer`, which must be exactly [`DatagramRepr::buffer_len`]
    /// bytes, with every length, checksum and the ICRC computed.
    pub fn emit(&self, buffer: &mut [u8]) -> Result<(), Error> {
        let len = self.buffer_len();
        if buffer.len() != len {
            return Err(Error::LengthMismatch {
                layout: LAYOUT,
                field: "buffer",
                stated: len,
                actual: buffer.len(),
            });
        }
        let ip_len = self.ip.header_len();
        let udp_len = udp::HEADER_LEN + self.packet.buffer_len();
        let (ip_bytes, rest) = buffer.split_at_mut(ip_len);
        let (udp_bytes, transport) = rest.split_at_mut(udp::HEADER_LEN);
        self.packet.emit(transport)?;
        match self.ip.with_payload_len(udp_len) {
            IpRepr::Ipv4(r) => r.emit(&mut Ipv4Packet::new_unchecked(ip_bytes))?,
            IpRepr::Ipv6(r) => r.emit(&mut Ipv6Packet::new_unchecked(ip_bytes))?,
        }
        self.udp.emit(
            &mut UdpPacket::new_unchecked(&mut *udp_bytes),
            self.packet.buffer_len(),
        )?;
        let icrc = icrc::compute_for_udp_payload(
            self.ip.icrc_fields(),
            self.udp.src_port,
            self.udp.dst_port,
            transport,
        )?;
        Packet::new_unchecked(&mut *transport).set_icrc(icrc);
        if let IpRepr::Ipv6(_) = self.ip {
            UdpPacket::new_unchecked(&mut buffer[ip_len..])
                .fill_checksum(self.ip.src_addr(), self.ip.dst_addr());
        }
        Ok(())
    }

    /// The datagram as a new vector.
    pub fn to_vec(&self) -> Result<Vec<u8>, Error> {
        let mut buffer = vec![0u8; self.buffer_len()];
        self.emit(&mut buffer)?;
        Ok(buffer)
    }
}
