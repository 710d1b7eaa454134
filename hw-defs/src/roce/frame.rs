//! An Ethernet frame around a RoCEv2 datagram: what a packet trace records.

use super::datagram::{DatagramRepr, IpRepr};
use super::ethernet::{self, EthernetFrame, EthernetRepr, MacAddr};
use crate::error::{check_len, Error};

/// A parsed Ethernet frame carrying a RoCEv2 datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameRepr<'a> {
    /// The source MAC address.
    pub src_mac: MacAddr,
    /// The destination MAC address.
    pub dst_mac: MacAddr,
    /// The datagram. The EtherType follows from its IP version.
    pub datagram: DatagramRepr<'a>,
}

impl<'a> FrameRepr<'a> {
    /// Parses a frame: Ethernet II with the IPv4 or IPv6 EtherType, then a datagram (every
    /// checksum and the ICRC checked).
    pub fn parse(bytes: &'a [u8]) -> Result<Self, Error> {
        let frame = EthernetFrame::new_checked(bytes)?;
        let eth = EthernetRepr::parse(&frame)?;
        let datagram = DatagramRepr::parse(&bytes[ethernet::HEADER_LEN..])?;
        let expected = ethertype_of(&datagram.ip);
        if eth.ethertype != expected {
            return Err(Error::BadField {
                layout: "Ethernet header",
                field: "EtherType",
                value: u64::from(eth.ethertype),
                expected: "the EtherType of the IP version that follows",
            });
        }
        Ok(FrameRepr {
            src_mac: eth.src_addr,
            dst_mac: eth.dst_addr,
            datagram,
        })
    }

    /// The bytes the frame takes (no FCS).
    pub fn buffer_len(&self) -> usize {
        ethernet::HEADER_LEN + self.datagram.buffer_len()
    }

    /// Writes the frame into `buffer`, which must be exactly [`FrameRepr::buffer_len`] bytes.
    pub fn emit(&self, buffer: &mut [u8]) -> Result<(), Error> {
        check_len("Ethernet header", buffer, ethernet::HEADER_LEN)?;
        let (header, datagram) = buffer.split_at_mut(ethernet::HEADER_LEN);
        self.datagram.emit(datagram)?;
        EthernetRepr {
            src_addr: self.src_mac,
            dst_addr: self.dst_mac,
            ethertype: ethertype_of(&self.datagram.ip),
        }
        .emit(&mut EthernetFrame::new_unchecked(header));
        Ok(())
    }

    /// The frame as a new vector.
    pub fn to_vec(&self) -> Result<Vec<u8>, Error> {
        let mut buffer = vec![0u8; self.buffer_len()];
        self.emit(&mut buffer)?;
        Ok(buffer)
    }
}

fn ethertype_of(ip: &IpRepr) -> u16 {
    match ip {
        IpRepr::Ipv4(_) => ethernet::ETHERTYPE_IPV4,
        IpRepr::Ipv6(_) => ethernet::ETHERTYPE_IPV6,
    }
}
