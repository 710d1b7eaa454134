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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::roce::bth::BthRepr;
    use crate::roce::ipv6::Ipv6Repr;
    use crate::roce::{Opcode, PacketRepr, Psn, UdpRepr};

    fn frame(payload: &[u8]) -> FrameRepr<'_> {
        FrameRepr {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            datagram: DatagramRepr {
                ip: IpRepr::Ipv6(Ipv6Repr {
                    src_addr: "fd00::1".parse().unwrap(),
                    dst_addr: "fd00::2".parse().unwrap(),
                    next_header: 17,
                    payload_len: 8 + 12 + 4 + 4,
                    hop_limit: 64,
                    traffic_class: 0,
                    flow_label: 0,
                }),
                udp: UdpRepr {
                    src_port: 0xc000,
                    dst_port: 4791,
                },
                packet: PacketRepr {
                    deth: None,
                    bth: BthRepr {
                        opcode: Opcode::SendOnly,
                        solicited: false,
                        mig_req: false,
                        pad_count: 0,
                        pkey: 0xffff,
                        fecn: false,
                        becn: false,
                        dest_qp: 3,
                        ack_req: true,
                        psn: Psn::new(9),
                    },
                    reth: None,
                    atomic_eth: None,
                    aeth: None,
                    atomic_ack_eth: None,
                    immdt: None,
                    payload,
                },
            },
        }
    }

    #[test]
    fn an_ipv6_frame_round_trips_with_its_ethertype() {
        let repr = frame(b"ping");
        let bytes = repr.to_vec().unwrap();
        assert_eq!(&bytes[12..14], &[0x86, 0xdd]);
        assert_eq!(FrameRepr::parse(&bytes).unwrap(), repr);
    }

    #[test]
    fn an_ethertype_that_disagrees_with_the_ip_version_is_refused() {
        let mut bytes = frame(b"ping").to_vec().unwrap();
        bytes[12..14].copy_from_slice(&[0x08, 0x00]);
        assert!(matches!(
            FrameRepr::parse(&bytes),
            Err(Error::BadField {
                field: "EtherType",
                ..
            })
        ));
    }
}
