//! ICRC golden vectors derived independently of this crate by `icrc_vectors.py` (zlib's CRC-32
//! over the masked bytes), plus one captured from ConnectX-4 Lx hardware. The byte arrays are
//! that script's output, pasted.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use hw_defs::roce::aeth::{AethRepr, Syndrome};
use hw_defs::roce::bth::BthRepr;
use hw_defs::roce::icrc::{self, IpFields};
use hw_defs::roce::immdt::ImmDtRepr;
use hw_defs::roce::ipv4::Ipv4Repr;
use hw_defs::roce::ipv6::Ipv6Repr;
use hw_defs::roce::reth::RethRepr;
use hw_defs::roce::{DatagramRepr, IpRepr, Opcode, PacketRepr, Psn, UdpRepr};
use hw_defs::Error;

/// ICRC 0xc77c8b1b, stored as 1b 8b 7c c7.
const IPV4_WRITE_ONLY: [u8; 68] = [
    0x45, 0x02, 0x00, 0x44, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xae, 0x7f, 0xc6, 0x12, 0x00, 0x01,
    0xc6, 0x12, 0x00, 0x02, 0xc5, 0xe3, 0x12, 0xb7, 0x00, 0x30, 0x00, 0x00, 0x0a, 0x10, 0xff, 0xff,
    0x40, 0x00, 0x00, 0x11, 0x80, 0x12, 0x34, 0x56, 0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x10, 0x00,
    0x00, 0x00, 0x12, 0x34, 0x00, 0x00, 0x00, 0x07, 0x52, 0x6f, 0x43, 0x45, 0x76, 0x32, 0x21, 0x00,
    0x1b, 0x8b, 0x7c, 0xc7,
];

/// ICRC 0xc9d039d2, stored as d2 39 d0 c9.
const IPV6_SEND_ONLY_IMM: [u8; 76] = [
    0x62, 0x8a, 0xbc, 0xde, 0x00, 0x24, 0x11, 0x40, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0xd0, 0x0d, 0x12, 0xb7, 0x00, 0x24, 0x1f, 0xa1,
    0x05, 0x80, 0xff, 0xff, 0x00, 0xab, 0xcd, 0xef, 0x80, 0xff, 0xff, 0xff, 0xde, 0xad, 0xbe, 0xef,
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0xd2, 0x39, 0xd0, 0xc9,
];

/// ICRC 0xa62e829e, stored as 9e 82 2e a6.
const IPV4_ACK_MASKED: [u8; 48] = [
    0x45, 0xb8, 0x00, 0x30, 0x00, 0x00, 0x40, 0x00, 0x01, 0x11, 0xec, 0xdd, 0xc6, 0x12, 0x00, 0x02,
    0xc6, 0x12, 0x00, 0x01, 0xc0, 0x01, 0x12, 0xb7, 0x00, 0x1c, 0xbe, 0xef, 0x11, 0x00, 0xff, 0xff,
    0x80, 0x00, 0x00, 0x22, 0x00, 0x00, 0x01, 0x00, 0x1f, 0x00, 0x01, 0x02, 0x9e, 0x82, 0x2e, 0xa6,
];

/// ICRC 0x2a00fd82, stored as 82 fd 00 2a.
const CONNECTX4_LX_CNP: [u8; 60] = [
    0x45, 0xc2, 0x00, 0x3c, 0x71, 0x8c, 0x40, 0x00, 0x40, 0x11, 0x91, 0x61, 0x0a, 0x00, 0x11, 0x01,
    0x0a, 0x00, 0x12, 0x01, 0x00, 0x00, 0x12, 0xb7, 0x00, 0x28, 0x00, 0x00, 0x81, 0x00, 0xff, 0xff,
    0x40, 0x00, 0x01, 0x18, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x82, 0xfd, 0x00, 0x2a,
];

fn carried_icrc(datagram: &[u8]) -> u32 {
    let n = datagram.len();
    u32::from_le_bytes([
        datagram[n - 4],
        datagram[n - 3],
        datagram[n - 2],
        datagram[n - 1],
    ])
}

fn bth(opcode: Opcode, dest_qp: u32, psn: u32) -> BthRepr {
    BthRepr {
        opcode,
        solicited: false,
        mig_req: false,
        pad_count: 0,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qp,
        ack_req: false,
        psn: Psn::new(psn),
    }
}

fn no_headers(bth: BthRepr, payload: &[u8]) -> PacketRepr<'_> {
    PacketRepr {
        deth: None,
        bth,
        reth: None,
        atomic_eth: None,
        aeth: None,
        atomic_ack_eth: None,
        immdt: None,
        payload,
    }
}

#[test]
fn icrc_of_each_vector_matches_the_independent_derivation() {
    for (name, datagram, icrc) in [
        ("IPv4 write", &IPV4_WRITE_ONLY[..], 0xc77c_8b1b),
        ("IPv6 send", &IPV6_SEND_ONLY_IMM[..], 0xc9d0_39d2),
        ("IPv4 ack", &IPV4_ACK_MASKED[..], 0xa62e_829e),
        ("ConnectX-4 Lx CNP", &CONNECTX4_LX_CNP[..], 0x2a00_fd82),
    ] {
        assert_eq!(icrc::compute(datagram), Ok(icrc), "{name}");
        assert_eq!(carried_icrc(datagram), icrc, "{name}: stored little-endian");
        assert_eq!(icrc::verify(datagram), Ok(()), "{name}");
    }
}

#[test]
fn the_hardware_icrc_is_reproduced_from_the_udp_payload_alone() {
    // What a receiver on a UDP socket has: addresses, ports, and the bytes after UDP; the
    // captured IPv4 header has DF set and IP ID 0x718c.
    let ip = IpFields::V4 {
        src: Ipv4Addr::new(10, 0, 17, 1),
        dst: Ipv4Addr::new(10, 0, 18, 1),
        ident: 0x718c,
        dont_frag: true,
    };
    let packet = &CONNECTX4_LX_CNP[28..];
    assert_eq!(
        icrc::compute_for_udp_payload(ip, 0, 4791, packet),
        Ok(0x2a00_fd82)
    );
    assert_eq!(icrc::verify_udp_payload(ip, 0, 4791, packet), Ok(()));
}

#[test]
fn the_ipv4_write_vector_is_what_our_datagram_emitter_writes() {
    let payload = b"RoCEv2!";
    let repr = DatagramRepr {
        ip: IpRepr::Ipv4(Ipv4Repr {
            src_addr: Ipv4Addr::new(198, 18, 0, 1),
            dst_addr: Ipv4Addr::new(198, 18, 0, 2),
            protocol: 17,
            payload_len: 0,
            ttl: 64,
            dscp_ecn: 0x02,
            ident: 0,
            dont_frag: true,
        }),
        udp: UdpRepr {
            src_port: 0xc5e3,
            dst_port: 4791,
        },
        packet: PacketRepr {
            deth: None,
            bth: BthRepr {
                becn: true,
                ack_req: true,
                ..bth(Opcode::RdmaWriteOnly, 0x11, 0x12_3456)
            },
            reth: Some(RethRepr {
                va: 0x7f00_0000_1000,
                rkey: 0x1234,
                dma_length: 7,
            }),
            ..no_headers(bth(Opcode::RdmaWriteOnly, 0, 0), payload)
        },
    };
    assert_eq!(repr.to_vec().unwrap(), IPV4_WRITE_ONLY);
    let parsed = DatagramRepr::parse(&IPV4_WRITE_ONLY).unwrap();
    assert_eq!(
        parsed.packet,
        PacketRepr {
            deth: None,
            bth: BthRepr {
                pad_count: 1,
                ..repr.packet.bth
            },
            ..repr.packet
        }
    );
}

#[test]
fn the_ipv6_send_vector_is_what_our_datagram_emitter_writes() {
    let payload: Vec<u8> = (0..8).collect();
    let repr = DatagramRepr {
        ip: IpRepr::Ipv6(Ipv6Repr {
            src_addr: "2001:db8::1".parse::<Ipv6Addr>().unwrap(),
            dst_addr: "2001:db8::2".parse::<Ipv6Addr>().unwrap(),
            next_header: 17,
            payload_len: 0,
            hop_limit: 64,
            traffic_class: 0x28,
            flow_label: 0xabcde,
        }),
        udp: UdpRepr {
            src_port: 0xd00d,
            dst_port: 4791,
        },
        packet: PacketRepr {
            deth: None,
            bth: BthRepr {
                solicited: true,
                ack_req: true,
                ..bth(Opcode::SendOnlyWithImmediate, 0xab_cdef, 0xff_ffff)
            },
            immdt: Some(ImmDtRepr { imm: 0xdead_beef }),
            ..no_headers(bth(Opcode::SendOnly, 0, 0), &payload)
        },
    };
    assert_eq!(repr.to_vec().unwrap(), IPV6_SEND_ONLY_IMM);
    assert_eq!(
        DatagramRepr::parse(&IPV6_SEND_ONLY_IMM).unwrap(),
        DatagramRepr {
            ip: IpRepr::Ipv6(Ipv6Repr {
                payload_len: 36,
                ..match repr.ip {
                    IpRepr::Ipv6(r) => r,
                    IpRepr::Ipv4(_) => unreachable!(),
                }
            }),
            ..repr
        }
    );
}

#[test]
fn masked_fields_do_not_change_the_icrc() {
    // The ACK vector was sent with TOS 0xb8, TTL 1, a UDP checksum and FECN; ours go out with
    // TOS 0, TTL 64, UDP checksum 0 and no FECN, and must carry the same ICRC.
    let repr = DatagramRepr {
        ip: IpRepr::Ipv4(Ipv4Repr {
            src_addr: Ipv4Addr::new(198, 18, 0, 2),
            dst_addr: Ipv4Addr::new(198, 18, 0, 1),
            protocol: 17,
            payload_len: 0,
            ttl: 64,
            dscp_ecn: 0,
            ident: 0,
            dont_frag: true,
        }),
        udp: UdpRepr {
            src_port: 0xc001,
            dst_port: 4791,
        },
        packet: PacketRepr {
            deth: None,
            aeth: Some(AethRepr {
                syndrome: Syndrome::Ack { credit_code: 0x1f },
                msn: 0x102,
            }),
            ..no_headers(bth(Opcode::Acknowledge, 0x22, 0x100), &[])
        },
    };
    let ours = repr.to_vec().unwrap();
    assert_ne!(ours[..28], IPV4_ACK_MASKED[..28], "the headers do differ");
    assert_eq!(carried_icrc(&ours), carried_icrc(&IPV4_ACK_MASKED));
}

#[test]
fn unmasked_fields_change_the_icrc() {
    // IP ID, DF, addresses, ports, and every BTH byte but byte 4 are covered.
    for offset in [4, 6, 12, 19, 20, 23, 28, 29, 31, 33, 36, 40, 47] {
        let mut datagram = IPV4_WRITE_ONLY;
        datagram[offset] ^= 0x01;
        if offset < 20 {
            // Keep the IPv4 header consistent: only the ICRC should notice.
            let sum = !ipv4_checksum(&datagram[..20]);
            datagram[10..12].copy_from_slice(&sum.to_be_bytes());
        }
        assert!(
            matches!(icrc::verify(&datagram), Err(Error::IcrcMismatch { .. })),
            "byte {offset}"
        );
    }
}

#[test]
fn a_flipped_payload_bit_is_an_icrc_mismatch() {
    let mut datagram = IPV6_SEND_ONLY_IMM;
    datagram[70] ^= 0x80;
    assert_eq!(
        icrc::verify(&datagram),
        Err(Error::IcrcMismatch {
            carried: 0xc9d0_39d2,
            computed: icrc::compute(&datagram).unwrap()
        })
    );
}

#[test]
fn rxe_fields_rebuild_the_ipv4_write_vector() {
    let ip = IpFields::rxe(
        IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)),
        IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2)),
    )
    .unwrap();
    assert_eq!(
        icrc::compute_for_udp_payload(ip, 0xc5e3, 4791, &IPV4_WRITE_ONLY[28..]),
        Ok(0xc77c_8b1b)
    );
}

fn ipv4_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for (i, pair) in header.chunks(2).enumerate() {
        if i != 5 {
            sum += u32::from(u16::from_be_bytes([pair[0], pair[1]]));
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}
