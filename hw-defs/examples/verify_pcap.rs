//! Verifies every RoCEv2 frame of a pcap capture with hw-defs: Ethernet, then IPv4 or IPv6,
//! UDP to port 4791, each frame parsed whole (`FrameRepr::parse`: lengths, checksums, and the
//! ICRC recomputed over the header the frame carries). Wireshark shows the ICRC but does not
//! verify it; `tools/interop` runs this on its capture of the traffic with Linux rxe.
//!
//!     cargo run -p hw-defs --example verify_pcap -- FILE.pcap
//!
//! Prints how many RoCE frames verified; exits 1 if any did not (naming the first few), if
//! there were none, or if the file is not a pcap.
//!
//! Linux rxe sends UDP checksum 0 over IPv6 as over IPv4 (`prepare_udp_hdr` in `rxe_net.c`),
//! and accepts it (its UDP tunnel socket does not require IPv6 checksums). Such a frame is
//! verified with the checksum filled in, everything else as parsed (the ICRC does not cover the
//! UDP checksum), and counted apart.

use std::net::IpAddr;

use hw_defs::pcap;
use hw_defs::roce::udp::UdpPacket;
use hw_defs::roce::FrameRepr;

fn main() -> std::process::ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: verify_pcap FILE.pcap");
        return std::process::ExitCode::from(2);
    };
    let file = match std::fs::read(&path) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("verify_pcap: {path}: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let records = match pcap::records(&file) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("verify_pcap: {path} is not a pcap file: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let (mut verified, mut bad, mut zero_v6) = (0u64, 0u64, 0u64);
    for (n, rec) in records.enumerate() {
        let frame = match rec {
            Ok((_, frame)) => frame,
            Err(e) => {
                eprintln!("verify_pcap: record {}: {e}", n + 1);
                return std::process::ExitCode::FAILURE;
            }
        };
        // Ethernet, then IPv4 (protocol at 23, UDP from 34) or IPv6 (next header at 20, UDP
        // from 54), UDP destination port 4791.
        let udp_at = match frame.get(12..14) {
            Some([0x08, 0x00]) if frame.get(23) == Some(&17) => Some(34),
            Some([0x86, 0xdd]) if frame.get(20) == Some(&17) => Some(54),
            _ => None,
        };
        let is_roce =
            udp_at.is_some_and(|at| frame.get(at + 2..at + 4) == Some(&4791u16.to_be_bytes()[..]));
        if !is_roce {
            continue;
        }
        // Linux rxe's IPv6 frames carry UDP checksum 0: verified with it filled in.
        let filled = udp_at
            .filter(|&at| at == 54 && frame.get(at + 6..at + 8) == Some(&[0, 0][..]))
            .and_then(|at| with_udp6_checksum(frame, at));
        zero_v6 += u64::from(filled.is_some());
        let frame = filled.as_deref().unwrap_or(frame);
        match FrameRepr::parse(frame) {
            Ok(_) => verified += 1,
            Err(e) => {
                bad += 1;
                if bad <= 5 {
                    eprintln!("verify_pcap: frame {} does not verify: {e}", n + 1);
                }
            }
        }
    }
    let zero = if zero_v6 > 0 {
        format!(" ({zero_v6} over IPv6 with UDP checksum 0)")
    } else {
        String::new()
    };
    println!("{path}: {verified} RoCE frames verified{zero}, {bad} did not");
    if bad > 0 || verified == 0 {
        std::process::ExitCode::FAILURE
    } else {
        std::process::ExitCode::SUCCESS
    }
}

/// A copy of an IPv6 `frame` whose UDP header at `udp_at` has its checksum filled in.
fn with_udp6_checksum(frame: &[u8], udp_at: usize) -> Option<Vec<u8>> {
    let src: [u8; 16] = frame.get(22..38)?.try_into().ok()?;
    let dst: [u8; 16] = frame.get(38..54)?.try_into().ok()?;
    let len = usize::from(u16::from_be_bytes(frame.get(18..20)?.try_into().ok()?));
    let mut copy = frame.to_vec();
    let mut udp = UdpPacket::new_checked(copy.get_mut(udp_at..udp_at + len)?).ok()?;
    udp.fill_checksum(IpAddr::from(src), IpAddr::from(dst));
    Some(copy)
}
