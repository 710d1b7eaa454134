//! RoCEv2 over UDP sockets bound to one netdev, IPv4 or IPv6.
//!
//! Receiving over IPv4 must see each packet's IP header: the ICRC covers the sender's IP
//! identification and flags, which a UDP socket does not hand over, and Linux rxe numbers its
//! packets. So an IPv4 device receives on a raw IPv4 socket (`SOCK_RAW`, `IPPROTO_UDP`) bound
//! to the netdev and the address, whose classic BPF filter keeps unfragmented UDP to port
//! 4791, read with `recvmmsg` into a header scratch and the packet buffer. Beside it a UDP
//! socket stays bound to `addr:4791`, so the kernel has a listener (no ICMP port-unreachable
//! goes out) and still does ARP for the sends; a filter that keeps nothing empties it. Without
//! CAP_NET_RAW the device falls back to receiving on that UDP socket, rebuilding the IP header
//! as rxe and railshift send it (ID 0, DF), and says so once: packets from senders that number
//! their IDs then fail the ICRC check. IPv6 needs no header: the ICRC masks every IPv6 field a
//! UDP socket does not give (traffic class, flow label, hop limit). Decisions and the
//! measurement against a UDP receive: `docs/softnic.md`.
//!
//! Sends leave from one socket per UDP source port (the port rxe would choose for the QPN),
//! bound with SO_REUSEPORT, with path-MTU discovery "do" so Linux never fragments and, for
//! IPv4, sets DF and IP ID 0 as rxe does: that makes the IP header reconstructible for the ICRC
//! check on the far side (IPv6 masks every field a router may change). Sends are batched with
//! `sendmmsg`, one call per run of packets sharing a source port; over IPv4 with UDP checksum 0
//! as rxe sends them (`SO_NO_CHECK`), over IPv6 with the checksum IPv6 requires (RFC 8200).
//! Over IPv6 a datagram with checksum 0 is accepted (`UDP_NO_CHECK6_RX`): Linux rxe sends 0
//! there as well.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use crate::wire::{Batch, Ipv4Ident, PortState, ROCE_PORT};
use netdev_link::LinkMonitor;

/// The UDP source port rxe uses for a QP: `0xC000 + hash_32(qpn, 14)`.
pub fn rxe_source_port(qpn: u32) -> u16 {
    const GOLDEN_RATIO_32: u32 = 0x61C8_8647;
    0xC000 + (qpn.wrapping_mul(GOLDEN_RATIO_32) >> (32 - 14)) as u16
}

const SOCKET_BUFFER: libc::c_int = 16 << 20;
/// How often the link monitor is read when nothing wakes the engine for it.
const LINK_POLL_INTERVAL: Duration = Duration::from_millis(1);

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// A socket address of either family, as the kernel takes it, and its length.
fn sockaddr(addr: IpAddr, port: u16) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; all-zero is valid.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        IpAddr::V4(a) => {
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            let sa = unsafe { &mut *(&mut storage as *mut _ as *mut libc::sockaddr_in) };
            sa.sin_family = libc::AF_INET as libc::sa_family_t;
            sa.sin_port = port.to_be();
            sa.sin_addr.s_addr = u32::from(a).to_be();
            std::mem::size_of::<libc::sockaddr_in>()
        }
        IpAddr::V6(a) => {
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            let sa = unsafe { &mut *(&mut storage as *mut _ as *mut libc::sockaddr_in6) };
            sa.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sa.sin6_port = port.to_be();
            sa.sin6_addr.s6_addr = a.octets();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

/// The address and port in a socket address the kernel filled in, if it is IPv4 or IPv6.
fn from_sockaddr(storage: &libc::sockaddr_storage) -> Option<(IpAddr, u16)> {
    match libc::c_int::from(storage.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sa = unsafe { &*(storage as *const _ as *const libc::sockaddr_in) };
            let ip = Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr));
            Some((IpAddr::V4(ip), u16::from_be(sa.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sa = unsafe { &*(storage as *const _ as *const libc::sockaddr_in6) };
            let ip = Ipv6Addr::from(sa.sin6_addr.s6_addr);
            Some((IpAddr::V6(ip), u16::from_be(sa.sin6_port)))
        }
        _ => None,
    }
}

fn set_int(fd: RawFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: passes a live c_int of the stated size.
    check(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as u32,
        )
    })
    .map(|_| ())
}

/// The calling thread's network namespace, as an fd.
fn current_netns() -> io::Result<OwnedFd> {
    Ok(std::fs::File::open("/proc/thread-self/ns/net")?.into())
}

/// Whether the calling thread is in the namespace `ns` (true when it cannot tell).
fn same_netns(ns: &OwnedFd) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(here) = std::fs::metadata("/proc/thread-self/ns/net") else {
        return true;
    };
    // SAFETY: stat is plain data; fstat fills it for an fd we own.
    let mut there: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a live fd and a live stat buffer.
    if unsafe { libc::fstat(ns.as_raw_fd(), &mut there) } < 0 {
        return true;
    }
    here.ino() == there.st_ino && here.dev() == there.st_dev
}

/// A nonblocking UDP socket of `addr`'s family bound to `netdev` and `addr:port`.
fn bound_socket(netdev: &str, addr: IpAddr, port: u16, reuse_port: bool) -> io::Result<OwnedFd> {
    let domain = match addr {
        IpAddr::V4(_) => libc::AF_INET,
        IpAddr::V6(_) => libc::AF_INET6,
    };
    // SAFETY: plain syscall; checked and owned below.
    let fd = check(unsafe {
        libc::socket(
            domain,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    })?;
    // SAFETY: fresh descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let raw = fd.as_raw_fd();
    // SAFETY: passes the name bytes with their length.
    check(unsafe {
        libc::setsockopt(
            raw,
            libc::SOL_SOCKET,
            libc::SO_BINDTODEVICE,
            netdev.as_ptr().cast(),
            netdev.len() as u32,
        )
    })?;
    if reuse_port {
        set_int(raw, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)?;
    }
    match addr {
        IpAddr::V4(_) => {
            // UDP checksum 0, as rxe sends over IPv4: the ICRC protects the packet, and a
            // partial (offloaded) checksum would show as bad in captures taken on the sending
            // side.
            set_int(raw, libc::SOL_SOCKET, libc::SO_NO_CHECK, 1)?;
            set_int(
                raw,
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_PMTUDISC_DO,
            )?;
        }
        IpAddr::V6(_) => {
            // This socket speaks IPv6 only (no IPv4-mapped peers), never fragments, and keeps
            // the UDP checksum, which IPv6 receivers require. It accepts checksum 0 all the
            // same: Linux rxe sends 0 over IPv6 too (the ICRC protects the packet), and
            // without this the kernel drops every such datagram (Udp6InCsumErrors).
            set_int(raw, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 1)?;
            set_int(raw, libc::IPPROTO_UDP, libc::UDP_NO_CHECK6_RX, 1)?;
            set_int(
                raw,
                libc::IPPROTO_IPV6,
                libc::IPV6_MTU_DISCOVER,
                libc::IPV6_PMTUDISC_DO,
            )?;
        }
    }
    // Large buffers: a burst of MTU segments must not overflow them. FORCE needs CAP_NET_ADMIN;
    // without it the plain option is capped by rmem_max/wmem_max, which is still better.
    for (force, plain) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        if set_int(raw, libc::SOL_SOCKET, force, SOCKET_BUFFER).is_err() {
            let _ = set_int(raw, libc::SOL_SOCKET, plain, SOCKET_BUFFER);
        }
    }
    let (sa, len) = sockaddr(addr, port);
    // SAFETY: a valid socket address of the length passed.
    check(unsafe { libc::bind(raw, (&sa as *const libc::sockaddr_storage).cast(), len) })?;
    Ok(fd)
}

/// An IPv4 header without options and a UDP header: what the raw receive socket reads before
/// the RoCE packet.
const RAW_HEADERS: usize = 20 + 8;

// Classic BPF, as `linux/filter.h` spells it.
const BPF_LD: u16 = 0x00;
const BPF_LDX: u16 = 0x01;
const BPF_JMP: u16 = 0x05;
const BPF_RET: u16 = 0x06;
const BPF_H: u16 = 0x08;
const BPF_B: u16 = 0x10;
const BPF_ABS: u16 = 0x20;
const BPF_IND: u16 = 0x40;
const BPF_MSH: u16 = 0xa0;
const BPF_JEQ: u16 = 0x10;
const BPF_JSET: u16 = 0x40;
const BPF_K: u16 = 0x00;

const fn bpf(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// On a raw IPv4 socket (its data starts at the IP header): keep UDP to port 4791 that is not
/// a fragment; drop everything else. The destination address is the socket's bind.
const ROCE_V4_FILTER: [libc::sock_filter; 9] = [
    bpf(BPF_LD | BPF_B | BPF_ABS, 0, 0, 9),        // A = protocol
    bpf(BPF_JMP | BPF_JEQ | BPF_K, 0, 6, 17),      // UDP, else drop
    bpf(BPF_LD | BPF_H | BPF_ABS, 0, 0, 6),        // A = flags and fragment offset
    bpf(BPF_JMP | BPF_JSET | BPF_K, 4, 0, 0x3fff), // a fragment (MF or offset): drop
    bpf(BPF_LDX | BPF_B | BPF_MSH, 0, 0, 0),       // X = IP header length
    bpf(BPF_LD | BPF_H | BPF_IND, 0, 0, 2),        // A = UDP destination port
    bpf(BPF_JMP | BPF_JEQ | BPF_K, 0, 1, ROCE_PORT as u32), // 4791, else drop
    bpf(BPF_RET | BPF_K, 0, 0, 0x0004_0000),       // keep the whole packet
    bpf(BPF_RET | BPF_K, 0, 0, 0),                 // drop
];

/// Keeps nothing: the UDP listener beside a raw receive socket queues no copies.
const DROP_ALL_FILTER: [libc::sock_filter; 1] = [bpf(BPF_RET | BPF_K, 0, 0, 0)];

fn attach_filter(fd: RawFd, program: &[libc::sock_filter]) -> io::Result<()> {
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

/// Reads and discards whatever `fd` queued (before its filter was attached).
fn drain(fd: RawFd) {
    let mut scratch = [0u8; 64];
    // SAFETY: reads into a live buffer of the stated length; nonblocking.
    while unsafe {
        libc::recv(
            fd,
            scratch.as_mut_ptr().cast(),
            scratch.len(),
            libc::MSG_DONTWAIT | libc::MSG_TRUNC,
        )
    } >= 0
    {}
}

/// A nonblocking raw IPv4 socket for UDP bound to `netdev` and `addr`, filtered to RoCEv2.
fn raw_v4_socket(netdev: &str, addr: Ipv4Addr) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; checked and owned below.
    let fd = check(unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            libc::IPPROTO_UDP,
        )
    })?;
    // SAFETY: fresh descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let raw = fd.as_raw_fd();
    attach_filter(raw, &ROCE_V4_FILTER)?;
    // SAFETY: passes the name bytes with their length.
    check(unsafe {
        libc::setsockopt(
            raw,
            libc::SOL_SOCKET,
            libc::SO_BINDTODEVICE,
            netdev.as_ptr().cast(),
            netdev.len() as u32,
        )
    })?;
    if set_int(raw, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, SOCKET_BUFFER).is_err() {
        let _ = set_int(raw, libc::SOL_SOCKET, libc::SO_RCVBUF, SOCKET_BUFFER);
    }
    let (sa, len) = sockaddr(IpAddr::V4(addr), 0);
    // SAFETY: a valid socket address of the length passed.
    check(unsafe { libc::bind(raw, (&sa as *const libc::sockaddr_storage).cast(), len) })?;
    // Whatever arrived before the filter and the binding took effect.
    drain(raw);
    Ok(fd)
}

/// Where received packets come from.
enum Receiver {
    /// A raw IPv4 socket that sees the IP header; `listener` is the UDP socket on port 4791
    /// beside it, filtered empty (it sends only as a fallback).
    RawV4 { raw: OwnedFd, listener: OwnedFd },
    /// The UDP socket on port 4791 itself (IPv6, or IPv4 without CAP_NET_RAW).
    Udp(OwnedFd),
}

impl Receiver {
    fn fd(&self) -> RawFd {
        match self {
            Receiver::RawV4 { raw, .. } => raw.as_raw_fd(),
            Receiver::Udp(fd) => fd.as_raw_fd(),
        }
    }

    /// The UDP socket on port 4791 (it can send, too).
    fn udp_fd(&self) -> RawFd {
        match self {
            Receiver::RawV4 { listener, .. } => listener.as_raw_fd(),
            Receiver::Udp(fd) => fd.as_raw_fd(),
        }
    }

    fn open(netdev: &str, addr: IpAddr) -> io::Result<Receiver> {
        let listener = bound_socket(netdev, addr, ROCE_PORT, false)?;
        let IpAddr::V4(v4) = addr else {
            return Ok(Receiver::Udp(listener));
        };
        match raw_v4_socket(netdev, v4) {
            Ok(raw) => {
                attach_filter(listener.as_raw_fd(), &DROP_ALL_FILTER)?;
                drain(listener.as_raw_fd());
                Ok(Receiver::RawV4 { raw, listener })
            }
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                tracing::warn!(
                    netdev,
                    %addr,
                    "no raw socket (needs CAP_NET_RAW): receiving on UDP, so packets whose \
                     sender numbers its IPv4 IDs (Linux rxe) fail the ICRC check"
                );
                Ok(Receiver::Udp(listener))
            }
            Err(e) => Err(e),
        }
    }
}

/// The IPv4 and UDP headers a raw socket read ahead of a RoCE packet: the sender, its UDP
/// source port, what the ICRC needs of the IP header, and the RoCE packet's length by the UDP
/// header. `None` for anything this device does not take (IP options, not to port 4791, a
/// length that does not add up).
fn parse_raw_headers(
    h: &[u8; RAW_HEADERS],
    read: usize,
) -> Option<(IpAddr, u16, Ipv4Ident, usize)> {
    if h[0] != 0x45 || h[9] != 17 || read < RAW_HEADERS {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([h[2], h[3]]));
    let udp_len = usize::from(u16::from_be_bytes([h[24], h[25]]));
    let dst_port = u16::from_be_bytes([h[22], h[23]]);
    if dst_port != ROCE_PORT || total != read || udp_len != total - 20 || udp_len < 8 {
        return None;
    }
    let src = IpAddr::V4(Ipv4Addr::new(h[12], h[13], h[14], h[15]));
    let src_port = u16::from_be_bytes([h[20], h[21]]);
    let ident = Ipv4Ident {
        ident: u16::from_be_bytes([h[4], h[5]]),
        dont_frag: h[6] & 0x40 != 0,
    };
    Some((src, src_port, ident, udp_len - 8))
}

/// The UDP wire of a device.
pub(crate) struct UdpWire {
    netdev: String,
    addr: IpAddr,
    /// The network namespace the device was opened in.
    netns: OwnedFd,
    rx: Receiver,
    tx: HashMap<u16, OwnedFd>,
    monitor: LinkMonitor,
    state: PortState,
    last_link_poll: Instant,
    // Scratch arrays for recvmmsg/sendmmsg, sized to the largest batch seen; their pointers
    // are refilled on every call.
    hdrs: Vec<libc::mmsghdr>,
    iovs: Vec<libc::iovec>,
    names: Vec<libc::sockaddr_storage>,
    /// The IPv4 and UDP headers of each packet a raw receive read.
    raw_headers: Vec<[u8; RAW_HEADERS]>,
}

// SAFETY: the raw pointers in the scratch arrays are rewritten before every use and never
// dereferenced outside the call that set them.
unsafe impl Send for UdpWire {}

impl std::fmt::Debug for UdpWire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UdpWire({}@{})", self.addr, self.netdev)
    }
}

impl UdpWire {
    /// Opens the receive socket and the link monitor.
    pub(crate) fn open(netdev: &str, addr: IpAddr) -> io::Result<UdpWire> {
        let netns = current_netns()?;
        let monitor = LinkMonitor::open(netdev)?;
        let rx = Receiver::open(netdev, addr)?;
        let state = monitor.state().into();
        Ok(UdpWire {
            netdev: netdev.to_string(),
            addr,
            netns,
            rx,
            tx: HashMap::new(),
            monitor,
            state,
            last_link_poll: Instant::now(),
            hdrs: Vec::new(),
            iovs: Vec::new(),
            names: Vec::new(),
            raw_headers: Vec::new(),
        })
    }

    pub(crate) fn local_addr(&self) -> IpAddr {
        self.addr
    }

    pub(crate) fn poll_fds(&self) -> Vec<RawFd> {
        vec![self.rx.fd(), self.monitor.fd()]
    }

    pub(crate) fn port_state(&mut self) -> PortState {
        if self.last_link_poll.elapsed() >= LINK_POLL_INTERVAL {
            self.last_link_poll = Instant::now();
            if let Some(s) = self.monitor.poll() {
                self.state = s.into();
            }
        }
        self.state
    }

    fn scratch(&mut self, n: usize) {
        if self.hdrs.len() < n {
            // SAFETY: these are plain C structs for which all-zero is valid.
            self.hdrs.resize_with(n, || unsafe { std::mem::zeroed() });
            self.iovs.resize(
                n,
                libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                },
            );
            // SAFETY: as above.
            self.names.resize_with(n, || unsafe { std::mem::zeroed() });
        }
    }

    fn tx_socket(&mut self, src_port: u16) -> RawFd {
        if let Some(fd) = self.tx.get(&src_port) {
            return fd.as_raw_fd();
        }
        // Sockets belong to the network namespace of the thread that creates them; the device
        // may be driven from a thread in another namespace than the one it was opened in.
        let created = if same_netns(&self.netns) {
            bound_socket(&self.netdev, self.addr, src_port, true)
        } else {
            let (netns, netdev, addr) = (&self.netns, &self.netdev, self.addr);
            std::thread::scope(|s| {
                s.spawn(|| {
                    // SAFETY: setns on a namespace fd we own; it changes only this short-lived
                    // thread's namespace.
                    if unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    bound_socket(netdev, addr, src_port, true)
                })
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("socket thread panicked")))
            })
        };
        match created {
            Ok(fd) => {
                let raw = fd.as_raw_fd();
                self.tx.insert(src_port, fd);
                raw
            }
            Err(e) => {
                tracing::warn!(src_port, error = %e, "cannot bind a send socket; sending from port 4791");
                self.rx.udp_fd()
            }
        }
    }

    /// Sends the batch; runs sharing a source port go out in one `sendmmsg`.
    pub(crate) fn send(&mut self, batch: &Batch) -> usize {
        let pkts = batch.filled();
        self.scratch(pkts.len());
        let mut sent = 0;
        let mut start = 0;
        while start < pkts.len() {
            let port = pkts[start].src_port;
            let mut end = start + 1;
            while end < pkts.len() && pkts[end].src_port == port {
                end += 1;
            }
            let fd = self.tx_socket(port);
            for (i, pkt) in pkts.iter().enumerate().take(end).skip(start) {
                // Only peers of the socket's family can be reached; another family's peer
                // gets no address and fails alone (EDESTADDRREQ), to be retransmitted or
                // errored like any lost packet.
                let (name, namelen) = sockaddr(pkt.peer, ROCE_PORT);
                let namelen = if pkt.peer.is_ipv4() == self.addr.is_ipv4() {
                    namelen
                } else {
                    0
                };
                self.names[i] = name;
                self.iovs[i] = libc::iovec {
                    iov_base: pkt.data.as_ptr() as *mut libc::c_void,
                    iov_len: pkt.len,
                };
                let h = &mut self.hdrs[i].msg_hdr;
                h.msg_name = (&mut self.names[i] as *mut libc::sockaddr_storage).cast();
                h.msg_namelen = namelen;
                h.msg_iov = &mut self.iovs[i];
                h.msg_iovlen = 1;
                h.msg_control = std::ptr::null_mut();
                h.msg_controllen = 0;
                h.msg_flags = 0;
            }
            let mut at = start;
            let mut stalls = 0;
            while at < end {
                // SAFETY: hdrs[at..end] point at live names, iovecs and packet buffers.
                let n = unsafe {
                    libc::sendmmsg(fd, self.hdrs[at..].as_mut_ptr(), (end - at) as u32, 0)
                };
                if n > 0 {
                    at += n as usize;
                    sent += n as usize;
                    continue;
                }
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::WouldBlock && stalls < 100 {
                    // The socket buffer is full: wait for room briefly instead of dropping.
                    stalls += 1;
                    let mut pfd = libc::pollfd {
                        fd,
                        events: libc::POLLOUT,
                        revents: 0,
                    };
                    // SAFETY: one valid pollfd.
                    unsafe { libc::poll(&mut pfd, 1, 1) };
                    continue;
                }
                if err.kind() != io::ErrorKind::WouldBlock {
                    tracing::debug!(error = %err, "sendmmsg failed; dropping the packet");
                }
                // Drop the packet that failed (e.g. ENETDOWN, EMSGSIZE); the transport retransmits.
                at += 1;
            }
            start = end;
        }
        sent
    }

    /// Receives up to the batch's capacity with one `recvmmsg`.
    pub(crate) fn recv(&mut self, batch: &mut Batch) -> usize {
        let cap = batch.slots.len();
        let raw = matches!(self.rx, Receiver::RawV4 { .. });
        // A raw read scatters each packet over two iovecs: its headers, then its RoCE bytes.
        let per = if raw { 2 } else { 1 };
        self.scratch(cap * per);
        if raw && self.raw_headers.len() < cap {
            self.raw_headers.resize(cap, [0; RAW_HEADERS]);
        }
        for i in 0..cap {
            let slot = &mut batch.slots[i];
            let data = libc::iovec {
                iov_base: slot.data.as_mut_ptr().cast(),
                iov_len: slot.data.len(),
            };
            if raw {
                self.iovs[2 * i] = libc::iovec {
                    iov_base: self.raw_headers[i].as_mut_ptr().cast(),
                    iov_len: RAW_HEADERS,
                };
                self.iovs[2 * i + 1] = data;
            } else {
                self.iovs[i] = data;
            }
            let h = &mut self.hdrs[i].msg_hdr;
            h.msg_name = (&mut self.names[i] as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
            h.msg_iov = &mut self.iovs[per * i];
            h.msg_iovlen = per;
            h.msg_control = std::ptr::null_mut();
            h.msg_controllen = 0;
            h.msg_flags = 0;
        }
        // SAFETY: hdrs[..cap] point at live names, iovecs, header scratch and batch buffers.
        let n = unsafe {
            libc::recvmmsg(
                self.rx.fd(),
                self.hdrs.as_mut_ptr(),
                cap as u32,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n <= 0 {
            return 0;
        }
        let n = n as usize;
        for i in 0..n {
            let slot = &mut batch.slots[i];
            let truncated = self.hdrs[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
            let read = self.hdrs[i].msg_len as usize;
            // Anything this device does not take gets length 0, which parsing drops and counts.
            slot.len = 0;
            slot.ipv4 = None;
            if truncated {
                continue;
            }
            if raw {
                if let Some((peer, port, ident, len)) =
                    parse_raw_headers(&self.raw_headers[i], read)
                {
                    slot.peer = peer;
                    slot.src_port = port;
                    slot.ipv4 = Some(ident);
                    slot.len = len;
                }
            } else if let Some((peer, port)) = from_sockaddr(&self.names[i]) {
                slot.peer = peer;
                slot.src_port = port;
                slot.len = read;
            }
        }
        batch.count = n;
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_ports_follow_rxe_hash_and_stay_in_the_rocev2_range() {
        for qpn in [0u32, 1, 17, 0x1234, 0xff_ffff] {
            let p = rxe_source_port(qpn);
            assert!((0xC000..=0xFFFF).contains(&p));
        }
        // hash_32(17, 14) = (17 * 0x61C88647) >> 18, computed by hand.
        assert_eq!(
            rxe_source_port(17),
            0xC000 + ((17u32.wrapping_mul(0x61C8_8647)) >> 18) as u16
        );
    }

    #[test]
    fn socket_addresses_of_both_families_round_trip() {
        for addr in [
            IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)),
            IpAddr::V6("2001:2::1".parse().unwrap()),
        ] {
            let (sa, len) = sockaddr(addr, 4791);
            let expected = if addr.is_ipv4() {
                std::mem::size_of::<libc::sockaddr_in>()
            } else {
                std::mem::size_of::<libc::sockaddr_in6>()
            };
            assert_eq!(len as usize, expected);
            assert_eq!(from_sockaddr(&sa), Some((addr, 4791)));
        }
        // SAFETY: all-zero is a valid sockaddr_storage (family AF_UNSPEC).
        let unspec: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        assert_eq!(from_sockaddr(&unspec), None);
    }

    /// IPv4 + UDP headers as a raw socket reads them: from 198.18.0.2:0xc123 to port `dst_port`,
    /// `roce_len` bytes of RoCE packet behind them.
    fn raw_headers(ident: u16, flags: u8, dst_port: u16, roce_len: usize) -> [u8; RAW_HEADERS] {
        let mut h = [0u8; RAW_HEADERS];
        h[0] = 0x45;
        h[2..4].copy_from_slice(&((RAW_HEADERS + roce_len) as u16).to_be_bytes());
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
    fn raw_headers_give_the_sender_its_port_and_what_the_icrc_covers() {
        let h = raw_headers(0x4153, 0x40, ROCE_PORT, 16);
        assert_eq!(
            parse_raw_headers(&h, RAW_HEADERS + 16),
            Some((
                IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2)),
                0xc123,
                Ipv4Ident {
                    ident: 0x4153,
                    dont_frag: true
                },
                16
            ))
        );
        let h = raw_headers(7, 0, ROCE_PORT, 16);
        assert_eq!(
            parse_raw_headers(&h, RAW_HEADERS + 16).map(|p| p.2),
            Some(Ipv4Ident {
                ident: 7,
                dont_frag: false
            })
        );
    }

    #[test]
    fn raw_headers_that_do_not_add_up_are_refused() {
        let good = raw_headers(1, 0x40, ROCE_PORT, 16);
        // Fewer bytes read than the IP header states, and more.
        assert_eq!(parse_raw_headers(&good, RAW_HEADERS + 15), None);
        assert_eq!(parse_raw_headers(&good, RAW_HEADERS + 17), None);
        // IP options (IHL 6), not UDP, another port, a UDP length that disagrees.
        let mut options = good;
        options[0] = 0x46;
        assert_eq!(parse_raw_headers(&options, RAW_HEADERS + 16), None);
        let mut tcp = good;
        tcp[9] = 6;
        assert_eq!(parse_raw_headers(&tcp, RAW_HEADERS + 16), None);
        let other = raw_headers(1, 0x40, 4792, 16);
        assert_eq!(parse_raw_headers(&other, RAW_HEADERS + 16), None);
        let mut udp_len = good;
        udp_len[24..26].copy_from_slice(&30u16.to_be_bytes());
        assert_eq!(parse_raw_headers(&udp_len, RAW_HEADERS + 16), None);
        // A read shorter than the headers themselves.
        assert_eq!(parse_raw_headers(&good, 10), None);
    }

    #[test]
    fn the_roce_filter_jumps_land_on_its_two_returns() {
        // Every conditional jump of the classic BPF program must land inside it, and every
        // path must end in a return: the kernel refuses a program otherwise, and a wrong
        // offset would keep or drop the wrong packets.
        let prog = &ROCE_V4_FILTER;
        let last = prog.len() - 1;
        assert_eq!(prog[last].code, BPF_RET | BPF_K);
        assert_eq!(prog[last].k, 0, "the last instruction drops");
        assert_eq!(prog[last - 1].code, BPF_RET | BPF_K);
        assert!(prog[last - 1].k > 0, "the one before keeps");
        for (i, insn) in prog.iter().enumerate() {
            if insn.code & 0x07 == BPF_JMP {
                for off in [insn.jt, insn.jf] {
                    let to = i + 1 + usize::from(off);
                    assert!(to <= last, "instruction {i} jumps past the end");
                    if off != 0 {
                        assert_eq!(to, last, "instruction {i} jumps elsewhere than to drop");
                    }
                }
            }
        }
    }

    #[test]
    fn opening_on_a_missing_netdev_names_it() {
        let err = UdpWire::open("no-such-dev0", IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap_err();
        assert!(err.to_string().contains("no-such-dev0"), "{err}");
    }
}
