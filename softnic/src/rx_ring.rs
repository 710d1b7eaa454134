//! A `PACKET_MMAP` receive ring (TPACKET_V2) on one netdev: how an IPv4 device receives RoCEv2
//! packets with the IP header they arrived with, polled in memory.
//!
//! The kernel copies each packet that a classic BPF filter keeps (unfragmented UDP without IP
//! options, addressed to this host at the device's address and port 4791) into the next free
//! frame of a ring shared with the process and hands the frame over in its status word; a
//! round reads that word, copies the packet out and hands the frame back. A round that finds
//! nothing costs a load, not a syscall, and the kernel neither clones the packet nor queues
//! it on a socket. This replaced a raw IPv4 socket read with `recvmmsg`, which cost the 8-byte
//! WRITE latency 0.6-1.3 us (docs/testbed.md, "Receive path"). V2, not V3: V3 hands over
//! whole blocks, a block that does not fill only when a timer retires it.
//!
//! The ring sits before the IP layer, so the filter does what the IP layer would have
//! decided for us: the packet is for this host (link-layer type `PACKET_HOST`) and for this
//! device's address. The IPv4 header checksum is not verified: the ICRC covers every header
//! field but TOS, TTL and the checksum itself. Netfilter's input rules do not apply to what the
//! ring reads (they still apply to the UDP socket beside it, which keeps nothing).

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::wire::{Batch, Ipv4Ident, MAX_PACKET, ROCE_PORT};

/// An IPv4 header without options and a UDP header: what precedes a RoCE packet in a frame.
pub(crate) const IPV4_UDP_HEADERS: usize = 20 + 8;

const fn align16(n: usize) -> usize {
    (n + 15) & !15
}

/// Where the kernel puts the network header of a frame of a `SOCK_DGRAM` packet socket: the
/// TPACKET_V2 header and the `sockaddr_ll` behind it, with at least 16 bytes for a link
/// header (`tpacket_rcv`). Frames are sized with it; reads take `tp_net` from the frame.
const NET_OFFSET: usize = align16(libc::TPACKET2_HDRLEN + 16);
/// One frame holds the largest packet the device accepts behind its IP and UDP headers.
const FRAME_SIZE: usize = align16(NET_OFFSET + IPV4_UDP_HEADERS + MAX_PACKET);
/// Blocks are what the kernel allocates; frames never straddle them.
const BLOCK_SIZE: usize = 128 << 10;
const FRAMES_PER_BLOCK: usize = BLOCK_SIZE / FRAME_SIZE;
// The kernel refuses a ring whose frames are not 16-byte aligned; a block of one frame would
// waste most of it.
const _: () = assert!(FRAME_SIZE % 16 == 0 && FRAMES_PER_BLOCK >= 16);

// Classic BPF, as `linux/filter.h` spells it.
pub(crate) const BPF_LD: u16 = 0x00;
pub(crate) const BPF_JMP: u16 = 0x05;
pub(crate) const BPF_RET: u16 = 0x06;
const BPF_W: u16 = 0x00;
const BPF_H: u16 = 0x08;
const BPF_B: u16 = 0x10;
const BPF_ABS: u16 = 0x20;
const BPF_JEQ: u16 = 0x10;
const BPF_JSET: u16 = 0x40;
pub(crate) const BPF_K: u16 = 0x00;

pub(crate) const fn bpf(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The link-layer packet type, as a classic BPF absolute load reads it.
const SKF_PKTTYPE: u32 = (libc::SKF_AD_OFF + libc::SKF_AD_PKTTYPE) as u32;
/// `PACKET_HOST`: addressed to this host.
const PACKET_HOST: u32 = 0;

/// The filter of a ring for `addr` (its data starts at the IP header): keep a packet to this
/// host and `addr` that is IPv4 without options, UDP to port 4791 and not a fragment; drop
/// everything else. Every failed test jumps to the last instruction.
pub(crate) fn roce_v4_filter(addr: Ipv4Addr) -> [libc::sock_filter; 14] {
    const DROP: u8 = 13;
    // `to_drop(i)` is the false branch of the test at instruction i.
    const fn to_drop(i: u8) -> u8 {
        DROP - i - 1
    }
    [
        bpf(BPF_LD | BPF_B | BPF_ABS, 0, 0, SKF_PKTTYPE), // 0: A = packet type
        bpf(BPF_JMP | BPF_JEQ | BPF_K, 0, to_drop(1), PACKET_HOST), // 1: to this host
        bpf(BPF_LD | BPF_B | BPF_ABS, 0, 0, 0),           // 2: A = version and IHL
        bpf(BPF_JMP | BPF_JEQ | BPF_K, 0, to_drop(3), 0x45), // 3: IPv4 without options
        bpf(BPF_LD | BPF_B | BPF_ABS, 0, 0, 9),           // 4: A = protocol
        bpf(BPF_JMP | BPF_JEQ | BPF_K, 0, to_drop(5), 17), // 5: UDP
        bpf(BPF_LD | BPF_H | BPF_ABS, 0, 0, 6),           // 6: A = flags and fragment offset
        bpf(BPF_JMP | BPF_JSET | BPF_K, to_drop(7), 0, 0x3fff), // 7: a fragment (MF or offset)
        bpf(BPF_LD | BPF_W | BPF_ABS, 0, 0, 16),          // 8: A = destination address
        bpf(BPF_JMP | BPF_JEQ | BPF_K, 0, to_drop(9), u32::from(addr)), // 9: ours
        bpf(BPF_LD | BPF_H | BPF_ABS, 0, 0, 20 + 2),      // 10: A = UDP destination port
        bpf(BPF_JMP | BPF_JEQ | BPF_K, 0, to_drop(11), ROCE_PORT as u32), // 11: 4791
        bpf(BPF_RET | BPF_K, 0, 0, 0x0004_0000),          // 12: keep the whole packet
        bpf(BPF_RET | BPF_K, 0, 0, 0),                    // 13: drop
    ]
}

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// Attaches a classic BPF program to a socket.
pub(crate) fn attach_filter(fd: RawFd, program: &[libc::sock_filter]) -> io::Result<()> {
    let prog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: a live sock_fprog pointing at a live program; the kernel copies it.
    check(unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            (&prog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as u32,
        )
    })
    .map(|_| ())
}

fn set_packet_opt<T>(fd: RawFd, name: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: passes a live value of the stated size.
    check(unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_PACKET,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as u32,
        )
    })
    .map(|_| ())
}

/// The IPv4 and UDP headers in front of a RoCE packet: the sender, its UDP source port, what
/// the ICRC needs of the IP header, and the RoCE packet's length by the UDP header. `received`
/// is how many bytes arrived from the IP header on; more than the IP header states is link
/// padding (a frame below Ethernet's minimum), which the IP layer would trim too. `None` for
/// anything this device does not take (IP options, not UDP to port 4791, lengths that do not
/// add up).
pub(crate) fn parse_ipv4_udp_headers(
    h: &[u8; IPV4_UDP_HEADERS],
    received: usize,
) -> Option<(Ipv4Addr, u16, Ipv4Ident, usize)> {
    if h[0] != 0x45 || h[9] != 17 {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([h[2], h[3]]));
    let udp_len = usize::from(u16::from_be_bytes([h[24], h[25]]));
    let dst_port = u16::from_be_bytes([h[22], h[23]]);
    if dst_port != ROCE_PORT
        || total < IPV4_UDP_HEADERS
        || total > received
        || udp_len != total - 20
    {
        return None;
    }
    let src = Ipv4Addr::new(h[12], h[13], h[14], h[15]);
    let src_port = u16::from_be_bytes([h[20], h[21]]);
    let ident = Ipv4Ident {
        ident: u16::from_be_bytes([h[4], h[5]]),
        dont_frag: h[6] & 0x40 != 0,
    };
    Some((src, src_port, ident, udp_len - 8))
}

/// A TPACKET_V2 receive ring bound to one netdev, filtered to RoCEv2 for one IPv4 address.
pub(crate) struct RxRing {
    fd: OwnedFd,
    map: NonNull<u8>,
    map_len: usize,
    frames: usize,
    /// The next frame the kernel fills (in order: it drops rather than skip a frame).
    next: usize,
}

// SAFETY: the mapping belongs to this ring alone; its frames are read and handed back only
// through `&mut self`.
unsafe impl Send for RxRing {}

impl Drop for RxRing {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping this ring made, once; the socket closes after.
        unsafe { libc::munmap(self.map.as_ptr().cast(), self.map_len) };
    }
}

impl std::fmt::Debug for RxRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RxRing({} frames)", self.frames)
    }
}

impl RxRing {
    /// Opens a ring of about `bytes` on `netdev` for RoCEv2 to `addr`. Without CAP_NET_RAW the
    /// error is `PermissionDenied`.
    pub(crate) fn open(netdev: &str, addr: Ipv4Addr, bytes: usize) -> io::Result<RxRing> {
        let name = std::ffi::CString::new(netdev)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "netdev name has a NUL"))?;
        // SAFETY: a NUL-terminated name.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if ifindex == 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("netdev {netdev}: {e}")));
        }
        // Protocol 0: the socket takes nothing before its bind below, when the filter and the
        // ring are in place, so nothing unfiltered is ever queued.
        // SAFETY: plain syscall; checked and owned below.
        let fd = check(unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        })?;
        // SAFETY: fresh descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let raw = fd.as_raw_fd();
        attach_filter(raw, &roce_v4_filter(addr))?;
        let version = libc::tpacket_versions::TPACKET_V2 as libc::c_int;
        set_packet_opt(raw, libc::PACKET_VERSION, &version)?;
        let blocks = bytes.div_ceil(BLOCK_SIZE).max(1);
        let frames = blocks * FRAMES_PER_BLOCK;
        let req = libc::tpacket_req {
            tp_block_size: BLOCK_SIZE as u32,
            tp_block_nr: blocks as u32,
            tp_frame_size: FRAME_SIZE as u32,
            tp_frame_nr: frames as u32,
        };
        set_packet_opt(raw, libc::PACKET_RX_RING, &req)?;
        let map_len = blocks * BLOCK_SIZE;
        // SAFETY: maps the ring just configured, shared with the kernel; checked below.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                raw,
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ring = RxRing {
            fd,
            map: NonNull::new(map.cast()).expect("mmap returned a mapping"),
            map_len,
            frames,
            next: 0,
        };
        // SAFETY: sockaddr_ll is plain data; all-zero is valid.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = (libc::ETH_P_IP as u16).to_be();
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: a valid link-layer address of the length passed.
        check(unsafe {
            libc::bind(
                raw,
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        })?;
        Ok(ring)
    }

    /// The socket, for epoll: readable while a filled frame waits.
    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn frame(&self, i: usize) -> *mut u8 {
        let offset = (i / FRAMES_PER_BLOCK) * BLOCK_SIZE + (i % FRAMES_PER_BLOCK) * FRAME_SIZE;
        // SAFETY: i < frames, so the frame lies inside the mapping.
        unsafe { self.map.as_ptr().add(offset) }
    }

    /// The status word of frame `i`, which the kernel and this process hand the frame over in.
    fn status(&self, i: usize) -> &AtomicU32 {
        // SAFETY: tp_status is the frame's first, 4-byte aligned word (frames are 16-byte
        // aligned in a page-aligned mapping) and lives as long as the mapping.
        unsafe { &*(self.frame(i) as *const AtomicU32) }
    }

    /// Moves up to the batch's capacity of filled frames into the batch (from empty) and hands
    /// the frames back; returns how many. A frame that is not a whole RoCEv2 packet this
    /// device takes gets length 0, which parsing drops and counts.
    pub(crate) fn recv(&mut self, batch: &mut Batch) -> usize {
        let mut n = 0;
        while n < batch.slots.len() {
            let status = self.status(self.next);
            if status.load(Ordering::Acquire) & libc::TP_STATUS_USER == 0 {
                break;
            }
            let frame = self.frame(self.next);
            // SAFETY: the frame is the user's (status read with Acquire after the kernel's
            // write barrier), its header is the frame's start, and an unaligned read needs
            // nothing more.
            let hdr = unsafe { std::ptr::read_unaligned(frame as *const libc::tpacket2_hdr) };
            let slot = &mut batch.slots[n];
            slot.len = 0;
            slot.ipv4 = None;
            let net = usize::from(hdr.tp_net);
            let snap = hdr.tp_snaplen as usize;
            // The kernel keeps the copy inside the frame; checked all the same, as the copy
            // below must not leave it.
            if net + snap <= FRAME_SIZE && snap >= IPV4_UDP_HEADERS {
                // SAFETY: net + snap bytes lie inside this frame, which is the user's.
                let pkt = unsafe { std::slice::from_raw_parts(frame.add(net), snap) };
                let headers: &[u8; IPV4_UDP_HEADERS] = pkt[..IPV4_UDP_HEADERS]
                    .try_into()
                    .expect("slice of the header length");
                // What was copied must be the whole datagram (not cut at the frame's end).
                if let Some((peer, port, ident, len)) = parse_ipv4_udp_headers(headers, snap) {
                    if len <= slot.data.len() {
                        slot.data[..len]
                            .copy_from_slice(&pkt[IPV4_UDP_HEADERS..IPV4_UDP_HEADERS + len]);
                        slot.peer = peer.into();
                        slot.src_port = port;
                        slot.ipv4 = Some(ident);
                        slot.len = len;
                    }
                }
            }
            status.store(libc::TP_STATUS_KERNEL, Ordering::Release);
            self.next = (self.next + 1) % self.frames;
            n += 1;
        }
        batch.count = n;
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// IPv4 + UDP headers from 198.18.0.2:0xc123 to port `dst_port`, `roce_len` bytes of RoCE
    /// packet behind them.
    fn headers(ident: u16, flags: u8, dst_port: u16, roce_len: usize) -> [u8; IPV4_UDP_HEADERS] {
        let mut h = [0u8; IPV4_UDP_HEADERS];
        h[0] = 0x45;
        h[2..4].copy_from_slice(&((IPV4_UDP_HEADERS + roce_len) as u16).to_be_bytes());
        h[4..6].copy_from_slice(&ident.to_be_bytes());
        h[6] = flags;
        h[8] = 64;
        h[9] = 17;
        h[12..16].copy_from_slice(&[198, 18, 0, 2]);
        h[16..20].copy_from_slice(&[198, 18, 0, 1]);
        h[20..22].copy_from_slice(&0xc123u16.to_be_bytes());
        h[22..24].copy_from_slice(&dst_port.to_be_bytes());
        h[24..26].copy_from_slice(&((8 + roce_len) as u16).to_be_bytes());
        h
    }

    #[test]
    fn headers_give_the_sender_its_port_and_what_the_icrc_covers() {
        let h = headers(0x4153, 0x40, ROCE_PORT, 16);
        assert_eq!(
            parse_ipv4_udp_headers(&h, IPV4_UDP_HEADERS + 16),
            Some((
                Ipv4Addr::new(198, 18, 0, 2),
                0xc123,
                Ipv4Ident {
                    ident: 0x4153,
                    dont_frag: true
                },
                16
            ))
        );
        let h = headers(7, 0, ROCE_PORT, 16);
        assert_eq!(
            parse_ipv4_udp_headers(&h, IPV4_UDP_HEADERS + 16).map(|p| p.2),
            Some(Ipv4Ident {
                ident: 7,
                dont_frag: false
            })
        );
        // Link padding behind the datagram is not part of it.
        assert_eq!(
            parse_ipv4_udp_headers(&h, IPV4_UDP_HEADERS + 16 + 2).map(|p| p.3),
            Some(16)
        );
    }

    #[test]
    fn headers_that_do_not_add_up_are_refused() {
        let good = headers(1, 0x40, ROCE_PORT, 16);
        // Fewer bytes arrived than the IP header states.
        assert_eq!(parse_ipv4_udp_headers(&good, IPV4_UDP_HEADERS + 15), None);
        // IP options (IHL 6), not UDP, another port, a UDP length that disagrees.
        let mut options = good;
        options[0] = 0x46;
        assert_eq!(
            parse_ipv4_udp_headers(&options, IPV4_UDP_HEADERS + 16),
            None
        );
        let mut tcp = good;
        tcp[9] = 6;
        assert_eq!(parse_ipv4_udp_headers(&tcp, IPV4_UDP_HEADERS + 16), None);
        let other = headers(1, 0x40, 4792, 16);
        assert_eq!(parse_ipv4_udp_headers(&other, IPV4_UDP_HEADERS + 16), None);
        let mut udp_len = good;
        udp_len[24..26].copy_from_slice(&30u16.to_be_bytes());
        assert_eq!(
            parse_ipv4_udp_headers(&udp_len, IPV4_UDP_HEADERS + 16),
            None
        );
        // An IP total length shorter than its own headers.
        let mut short = good;
        short[2..4].copy_from_slice(&20u16.to_be_bytes());
        assert_eq!(parse_ipv4_udp_headers(&short, IPV4_UDP_HEADERS + 16), None);
    }

    #[test]
    fn the_roce_filter_jumps_land_on_its_two_returns() {
        // Every conditional jump of the classic BPF program must land inside it, and every
        // path must end in a return: the kernel refuses a program otherwise, and a wrong
        // offset would keep or drop the wrong packets.
        let prog = roce_v4_filter(Ipv4Addr::new(198, 18, 0, 1));
        let last = prog.len() - 1;
        assert_eq!(prog[last].code, BPF_RET | BPF_K);
        assert_eq!(prog[last].k, 0, "the last instruction drops");
        assert_eq!(prog[last - 1].code, BPF_RET | BPF_K);
        assert!(prog[last - 1].k > 0, "the one before keeps");
        let mut tests = 0;
        for (i, insn) in prog.iter().enumerate() {
            if insn.code & 0x07 == BPF_JMP {
                tests += 1;
                for off in [insn.jt, insn.jf] {
                    let to = i + 1 + usize::from(off);
                    assert!(to <= last, "instruction {i} jumps past the end");
                    if off != 0 {
                        assert_eq!(to, last, "instruction {i} jumps elsewhere than to drop");
                    }
                }
            }
        }
        assert_eq!(tests, 6);
        assert_eq!(
            prog[9].k, 0xc612_0001,
            "the address in network order as a load reads it"
        );
    }
}
