//! Root only (CI is root): the ICRC of a received packet is checked over the IPv4 header it
//! arrived with. Linux rxe numbers its packets (IP ID 0x4153, 0x4154, ... with DF), and the
//! ICRC covers the ID and the flags; a receiver that rebuilds the header with ID 0 drops every
//! such packet as an ICRC error (softnic once dropped all of rxe's packets that way).
//!
//! Each test sends handmade RoCEv2 packets from a raw socket with `IP_HDRINCL` on `lo` to a
//! softnic device bound to an address of its own, and reads the device's counters: a SEND to a
//! QP number the device does not have parses (ICRC good) and is counted as an unknown-QPN drop;
//! one whose ICRC does not match is counted as an ICRC error.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use hw_defs::roce::icrc::{self, IpFields};
use softnic::{Counters, Device, DeviceConfig, Wire, ROCE_PORT};

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A SEND_ONLY without payload to QP `dest_qpn`, PSN 0, with the ICRC computed over an IPv4
/// header carrying `ident` and `dont_frag`; `corrupt` flips a bit of the ICRC.
fn send_only(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    src_port: u16,
    ident: u16,
    dont_frag: bool,
    corrupt: bool,
) -> Vec<u8> {
    let dest_qpn: u32 = 0x00_0011;
    let mut roce = vec![0u8; 12 + icrc::ICRC_LEN];
    roce[0] = 0x04; // RC SEND_ONLY
    roce[2..4].copy_from_slice(&0xffffu16.to_be_bytes()); // default P_Key
    roce[4..8].copy_from_slice(&dest_qpn.to_be_bytes()); // byte 4 reserved, then the QPN
    let ip = IpFields::V4 {
        src,
        dst,
        ident,
        dont_frag,
    };
    let mut crc = icrc::compute_for_udp_payload(ip, src_port, ROCE_PORT, &roce).unwrap();
    if corrupt {
        crc ^= 1;
    }
    let n = roce.len();
    roce[n - 4..].copy_from_slice(&crc.to_le_bytes());

    let total = 20 + 8 + roce.len();
    let mut pkt = vec![0u8; total];
    pkt[0] = 0x45;
    pkt[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    pkt[4..6].copy_from_slice(&ident.to_be_bytes());
    pkt[6] = if dont_frag { 0x40 } else { 0 };
    pkt[8] = 64; // TTL
    pkt[9] = 17; // UDP
    pkt[12..16].copy_from_slice(&src.octets());
    pkt[16..20].copy_from_slice(&dst.octets());
    // The header checksum: IP_HDRINCL has the kernel fill it in when it is 0.
    pkt[20..22].copy_from_slice(&src_port.to_be_bytes());
    pkt[22..24].copy_from_slice(&ROCE_PORT.to_be_bytes());
    pkt[24..26].copy_from_slice(&((8 + roce.len()) as u16).to_be_bytes());
    // UDP checksum 0, as rxe sends over IPv4.
    pkt[28..].copy_from_slice(&roce);
    pkt
}

/// Sends `pkt` (a whole IPv4 datagram) to `dst` from a raw socket with `IP_HDRINCL`.
fn send_raw(dst: Ipv4Addr, pkt: &[u8]) {
    // SAFETY: plain syscalls on a descriptor this function owns and closes.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW);
        assert!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
        let one: libc::c_int = 1;
        libc::setsockopt(
            fd,
            libc::IPPROTO_IP,
            libc::IP_HDRINCL,
            (&one as *const libc::c_int).cast(),
            4,
        );
        let mut sa: libc::sockaddr_in = std::mem::zeroed();
        sa.sin_family = libc::AF_INET as libc::sa_family_t;
        sa.sin_addr.s_addr = u32::from(dst).to_be();
        let sent = libc::sendto(
            fd,
            pkt.as_ptr().cast(),
            pkt.len(),
            0,
            (&sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as u32,
        );
        assert_eq!(
            sent,
            pkt.len() as isize,
            "sendto: {}",
            std::io::Error::last_os_error()
        );
        libc::close(fd);
    }
}

fn open(addr: Ipv4Addr) -> Device {
    Device::open(DeviceConfig::new(
        format!("rxhdr-{addr}"),
        Wire::Udp {
            netdev: "lo".into(),
            addr: addr.into(),
        },
    ))
    .expect("open a softnic device on lo")
}

/// Waits until `pred` holds for the device's counters (the engine runs on its own thread).
fn wait_counters(dev: &Device, pred: impl Fn(&Counters) -> bool) -> Counters {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let c = dev.counters();
        if pred(&c) || Instant::now() > end {
            return c;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn packets_numbered_as_rxe_numbers_them_pass_the_icrc_check() {
    if !is_root() {
        println!("skipped: raw sockets need root (CI runs as root)");
        return;
    }
    let (src, dst) = (Ipv4Addr::new(127, 78, 1, 1), Ipv4Addr::new(127, 78, 1, 2));
    let dev = open(dst);
    // rxe's numbering with DF, an ID without DF, then ID 0 with DF (our own senders). (The
    // kernel fills in an IP_HDRINCL header's ID 0 without DF, so that case cannot be sent.)
    for (i, (ident, df)) in [
        (0x4153u16, true),
        (0x4154, true),
        (0x0001, false),
        (0, true),
    ]
    .into_iter()
    .enumerate()
    {
        send_raw(dst, &send_only(src, dst, 0xc123, ident, df, false));
        let c = wait_counters(&dev, |c| c.unknown_qpn_drops + c.icrc_errors > i as u64);
        assert_eq!(
            (c.unknown_qpn_drops, c.icrc_errors, c.malformed_drops),
            (i as u64 + 1, 0, 0),
            "packet {i} (IP ID {ident:#06x}, DF {df}): parsed and dropped for its QPN, not \
             for its ICRC"
        );
    }
}

#[test]
fn a_packet_whose_icrc_does_not_match_its_header_is_an_icrc_error() {
    if !is_root() {
        println!("skipped: raw sockets need root (CI runs as root)");
        return;
    }
    let (src, dst) = (Ipv4Addr::new(127, 78, 2, 1), Ipv4Addr::new(127, 78, 2, 2));
    let dev = open(dst);
    send_raw(dst, &send_only(src, dst, 0xc123, 0x4153, true, true));
    // The ICRC computed for ID 0x4153 while the header says 0x4154.
    let mut other_id = send_only(src, dst, 0xc123, 0x4153, true, false);
    other_id[4..6].copy_from_slice(&0x4154u16.to_be_bytes());
    send_raw(dst, &other_id);
    let c = wait_counters(&dev, |c| c.icrc_errors >= 2);
    assert_eq!((c.icrc_errors, c.unknown_qpn_drops), (2, 0));
}

#[test]
fn udp_to_other_ports_and_other_addresses_is_not_taken() {
    if !is_root() {
        println!("skipped: raw sockets need root (CI runs as root)");
        return;
    }
    let (src, dst) = (Ipv4Addr::new(127, 78, 3, 1), Ipv4Addr::new(127, 78, 3, 2));
    let dev = open(dst);
    let mut other_port = send_only(src, dst, 0xc123, 0x4153, true, false);
    other_port[22..24].copy_from_slice(&4792u16.to_be_bytes());
    send_raw(dst, &other_port);
    // A first fragment (MF set): the IP layer would hold it for reassembly, so the ring's
    // filter must not take it either.
    let mut fragment = send_only(src, dst, 0xc123, 0x4154, false, false);
    fragment[6] = 0x20;
    send_raw(dst, &fragment);
    let elsewhere = Ipv4Addr::new(127, 78, 3, 3);
    send_raw(
        elsewhere,
        &send_only(src, elsewhere, 0xc123, 0x4153, true, false),
    );
    // Then one that is ours, to know the others had their chance to arrive first.
    send_raw(dst, &send_only(src, dst, 0xc123, 0x4155, true, false));
    let c = wait_counters(&dev, |c| c.unknown_qpn_drops >= 1);
    assert_eq!(
        (c.unknown_qpn_drops, c.icrc_errors, c.malformed_drops),
        (1, 0, 0),
        "only the packet to {dst}:4791 reached the device"
    );
}

#[test]
fn more_packets_than_the_receive_ring_has_frames_all_arrive() {
    if !is_root() {
        println!("skipped: raw sockets need root (CI runs as root)");
        return;
    }
    // The ring of a device has 16 MiB of frames of about 4.3 KiB (3,840); every frame read
    // must go back to the kernel, or receiving stops when the ring has gone round once.
    // Sent in bursts the engine reads before the next, so the ring never overflows.
    const BURST: u64 = 400;
    const PACKETS: u64 = 10_000;
    let (src, dst) = (Ipv4Addr::new(127, 78, 4, 1), Ipv4Addr::new(127, 78, 4, 2));
    let dev = open(dst);
    let pkt = send_only(src, dst, 0xc123, 0x4153, true, false);
    let mut sent = 0;
    while sent < PACKETS {
        for _ in 0..BURST {
            send_raw(dst, &pkt);
        }
        sent += BURST;
        let c = wait_counters(&dev, |c| c.unknown_qpn_drops >= sent);
        assert_eq!(
            (c.unknown_qpn_drops, c.icrc_errors, c.malformed_drops),
            (sent, 0, 0),
            "after {sent} packets"
        );
    }
}
