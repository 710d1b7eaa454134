//! No parser panics, whatever bytes it is handed: arbitrary bytes, and valid packets with bits
//! flipped, cut short or extended (proptest, seeded: see `common::config`). Wire input and
//! shared memory are untrusted; a bad buffer must give an `Err`, never a panic.

mod common;

use std::net::{Ipv4Addr, Ipv6Addr};

use common::{config, mutation};
use hw_defs::mlx5::atomic_seg::{AtomicSeg, AtomicSegRepr};
use hw_defs::mlx5::cqe::{Cqe64, CqeRepr};
use hw_defs::mlx5::ctrl_seg::{CtrlSeg, CtrlSegRepr};
use hw_defs::mlx5::data_seg::{DataSeg, DataSegRepr};
use hw_defs::mlx5::dbrec::{CqDoorbellRecord, DoorbellRecord};
use hw_defs::mlx5::err_cqe::{ErrCqe, ErrCqeRepr};
use hw_defs::mlx5::inline_seg::{self, InlineSeg};
use hw_defs::mlx5::raddr_seg::{RaddrSeg, RaddrSegRepr};
use hw_defs::mlx5::recv_wqe::RecvWqe;
use hw_defs::mlx5::send_wqe::{SendRing, SendWqeRepr, WqeData};
use hw_defs::pcap::{self, FileHeaderRepr};
use hw_defs::roce::aeth::{Aeth, AethRepr};
use hw_defs::roce::atomic_ack_eth::{AtomicAckEth, AtomicAckEthRepr};
use hw_defs::roce::atomic_eth::{AtomicEth, AtomicEthRepr};
use hw_defs::roce::bth::{Bth, BthRepr};
use hw_defs::roce::ethernet::{EthernetFrame, EthernetRepr};
use hw_defs::roce::icrc::{self, IpFields};
use hw_defs::roce::immdt::{ImmDt, ImmDtRepr};
use hw_defs::roce::ipv4::{Ipv4Packet, Ipv4Repr};
use hw_defs::roce::ipv6::{Ipv6Packet, Ipv6Repr};
use hw_defs::roce::reth::{Reth, RethRepr};
use hw_defs::roce::udp::{UdpPacket, UdpRepr};
use hw_defs::roce::{DatagramRepr, FrameRepr, Packet, PacketRepr};
use proptest::prelude::*;

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..max)
}

/// Runs every RoCE parser over `b`, from the Ethernet frame down to single headers, and
/// touches every accessor a successful parse allows.
fn parse_roce(b: &[u8]) {
    if let Ok(f) = FrameRepr::parse(b) {
        // What parses must re-emit.
        f.to_vec().unwrap();
    }
    if let Ok(d) = DatagramRepr::parse(b) {
        d.to_vec().unwrap();
    }
    let _ = icrc::compute(b);
    let _ = icrc::verify(b);
    let ip4 = IpFields::V4 {
        src: Ipv4Addr::LOCALHOST,
        dst: Ipv4Addr::LOCALHOST,
        ident: 0,
        dont_frag: true,
    };
    let ip6 = IpFields::V6 {
        src: Ipv6Addr::LOCALHOST,
        dst: Ipv6Addr::LOCALHOST,
    };
    let _ = icrc::verify_udp_payload(ip4, 1, 4791, b);
    let _ = icrc::compute_for_udp_payload(ip6, 1, 4791, b);
    if let Ok(p) = Packet::new_checked(b) {
        let _ = (p.payload(), p.icrc(), p.header_len(), p.bth().psn());
        let _ = (p.reth().map(|h| h.va()), p.aeth().map(|h| h.msn()));
        let _ = (
            p.atomic_eth().map(|h| h.compare()),
            p.atomic_ack_eth().map(|h| h.orig_rem_dt()),
        );
        let _ = p.immdt().map(|h| h.imm());
        if let Ok(r) = PacketRepr::parse(&p) {
            let mut out = vec![0u8; r.buffer_len()];
            r.emit(&mut out).unwrap();
        }
    }
    if let Ok(p) = Ipv4Packet::new_checked(b) {
        let _ = (Ipv4Repr::parse(&p), p.payload(), p.verify_checksum());
    }
    if let Ok(p) = Ipv6Packet::new_checked(b) {
        let _ = (Ipv6Repr::parse(&p), p.payload());
    }
    if let Ok(p) = UdpPacket::new_checked(b) {
        let _ = (UdpRepr::parse(&p), p.payload());
        let _ = p.verify_checksum(Ipv4Addr::LOCALHOST.into(), Ipv6Addr::LOCALHOST.into());
    }
    if let Ok(e) = EthernetFrame::new_checked(b) {
        let _ = (EthernetRepr::parse(&e), e.payload());
    }
    let _ = Bth::new_checked(b).map(|h| BthRepr::parse(&h));
    let _ = Reth::new_checked(b).map(|h| RethRepr::parse(&h));
    let _ = Aeth::new_checked(b).map(|h| AethRepr::parse(&h));
    let _ = ImmDt::new_checked(b).map(|h| ImmDtRepr::parse(&h));
    let _ = AtomicEth::new_checked(b).map(|h| AtomicEthRepr::parse(&h));
    let _ = AtomicAckEth::new_checked(b).map(|h| AtomicAckEthRepr::parse(&h));
}

/// Runs every mlx5 parser over `b`.
fn parse_mlx5(b: &[u8], index: u16, offset: usize) {
    let _ = CtrlSeg::new_checked(b).map(|s| (CtrlSegRepr::parse(&s), s.doorbell_value()));
    let _ = RaddrSeg::new_checked(b).map(|s| RaddrSegRepr::parse(&s));
    let _ = AtomicSeg::new_checked(b).map(|s| AtomicSegRepr::parse(&s));
    let _ = DataSeg::new_checked(b).map(|s| DataSegRepr::parse(&s));
    let _ = InlineSeg::new_checked(b).map(|s| s.payload_len());
    let _ = inline_seg::read_wrapped(b, offset);
    let _ =
        Cqe64::new_checked(b).map(|c| (CqeRepr::parse(&c), c.is_sw_owned(u32::from(index), 64)));
    let _ = ErrCqe::new_checked(b).map(|c| (ErrCqeRepr::parse(&c), c.syndrome().wc_status()));
    let _ = DoorbellRecord::new_checked(b).map(|r| (r.recv_counter(), r.send_counter()));
    let _ = CqDoorbellRecord::new_checked(b).map(|r| (r.consumer_index(), r.arm_word()));
    if let Ok(slot) = RecvWqe::new_checked(b) {
        let _ = slot.sges().count();
    }
    if let Ok(ring) = SendRing::new_checked(b) {
        if let Ok(wqe) = SendWqeRepr::parse(&ring, index) {
            match wqe.data {
                WqeData::Gather(sges) => {
                    let _ = sges.total_bytes();
                }
                WqeData::Inline(data) => {
                    let _ = data.bytes().count();
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn roce_parsers_survive_arbitrary_bytes(b in bytes(200)) {
        parse_roce(&b);
    }

    #[test]
    fn roce_parsers_survive_arbitrary_bytes_behind_a_valid_ip_header(
        v6: bool, b in bytes(200),
    ) {
        // Random bytes rarely pass the IP checks; give them a plausible start.
        let mut d = if v6 { vec![0x60, 0, 0, 0, 0, 0, 17, 64] } else { vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0] };
        d.resize(if v6 { 40 } else { 20 }, 0);
        let total = d.len() + b.len();
        if v6 {
            d[4..6].copy_from_slice(&(b.len() as u16).to_be_bytes());
        } else {
            d[2..4].copy_from_slice(&(total as u16).to_be_bytes());
            let mut sum: u32 = d.chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum();
            while sum > 0xffff { sum = (sum & 0xffff) + (sum >> 16); }
            d[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        }
        d.extend_from_slice(&b);
        parse_roce(&d);
    }

    #[test]
    fn roce_parsers_survive_mutated_valid_frames(
        (ip, port, p) in common::datagram_parts(), m in mutation(),
    ) {
        let valid = common::frame(common::datagram(ip, port, &p)).to_vec().unwrap();
        let mutated = m.apply(&valid);
        parse_roce(&mutated);
        parse_roce(&mutated[mutated.len().min(14)..]);
        parse_roce(&mutated[mutated.len().min(14 + 28)..]);
    }

    #[test]
    fn mlx5_parsers_survive_arbitrary_bytes(b in bytes(200), index: u16, offset in 0usize..256) {
        parse_mlx5(&b, index, offset);
    }

    #[test]
    fn send_wqe_parsing_survives_arbitrary_rings(
        log_bbs in 0usize..5, fill in bytes(64), index: u16,
    ) {
        // A ring of arbitrary content, built from a repeated random block.
        let len = 64 << log_bbs;
        let mut ring: Vec<u8> = fill.iter().copied().cycle().take(len).collect();
        ring.resize(len, 0);
        // Make the control segment plausible often enough to reach the data segments.
        let at = (usize::from(index) & ((1 << log_bbs) - 1)) * 64;
        ring[at + 3] = [0x08, 0x0a, 0x0b, 0x09, 0x10, 0x11, 0x12, 0x00][usize::from(fill.first().copied().unwrap_or(0)) % 8];
        ring[at + 11] &= 0xe0 | 0x0a;
        parse_mlx5(&ring, index, 0);
    }

    #[test]
    fn pcap_parsers_survive_arbitrary_and_mutated_files(b in bytes(200), m in mutation()) {
        let _ = FileHeaderRepr::parse(&b);
        if let Ok(records) = pcap::records(&b) {
            for record in records {
                let _ = record.map(|(h, frame)| (h.incl_len, frame.len()));
            }
        }
        let mut capture = pcap::Capture::new();
        capture.push(std::time::Duration::from_micros(7), &b);
        capture.push(std::time::Duration::from_micros(8), &[1, 2, 3]);
        let mutated = m.apply(capture.as_bytes());
        if let Ok(records) = pcap::records(&mutated) {
            for record in records {
                let _ = record.map(|(h, frame)| (h.incl_len, frame.len()));
            }
        }
    }
}
