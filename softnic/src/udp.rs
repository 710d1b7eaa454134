//! RoCEv2 over UDP sockets bound to one netdev, IPv4 or IPv6.
//!
//! Receiving over IPv4 must see each packet's IP header: the ICRC covers the sender's IP
//! identification and flags, which a UDP socket does not hand over, and Linux rxe numbers its
//! packets. So an IPv4 device receives from a `PACKET_MMAP` ring on the netdev
//! (`rx_ring::RxRing`), whose classic BPF filter keeps unfragmented UDP to the device's address
//! and port 4791, polled in memory. Beside it a UDP socket stays bound to `addr:4791`, so the
//! kernel has a listener (no ICMP port-unreachable goes out) and still does ARP for the sends;
//! a filter that keeps nothing empties it. Without CAP_NET_RAW the device falls back to
//! receiving on that UDP socket, rebuilding the IP header as rxe and railshift send it (ID 0,
//! DF), and says so once: packets from senders that number their IDs then fail the ICRC
//! check. IPv6 needs no header: the ICRC masks every IPv6 field a UDP socket does not give
//! (traffic class, flow label, hop limit). Decisions and the measurements against a UDP and a
//! raw-socket receive: `docs/softnic.md`.
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

use crate::eth_tx::EthTx;
use crate::rx_ring::{attach_filter, bpf, RxRing, BPF_K, BPF_RET};
use crate::send_batch::send_all;
use crate::wire::{Batch, PacketBuf, PortState, ROCE_PORT};
use netdev_link::LinkMonitor;

/// How a device on a netdev sends its packets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SendPath {
    /// Whole frames with its own headers through a packet socket, to the peer's MAC address
    /// resolved when a QP is connected (the default; UDP sockets where that is not possible).
    #[default]
    Frames,
    /// Through the kernel's UDP sockets, which resolve the peer with ARP as they send (what
    /// the device did before it sent frames; kept to measure against).
    UdpSockets,
}

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

/// Keeps nothing: the UDP listener beside a receive ring queues no copies.
const DROP_ALL_FILTER: [libc::sock_filter; 1] = [bpf(BPF_RET | BPF_K, 0, 0, 0)];

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

/// Where received packets come from.
enum Receiver {
    /// A receive ring that sees the IP header (boxed: the wire enum stays small); `listener`
    /// is the UDP socket on port 4791 beside it, filtered empty (it sends only as a fallback).
    RingV4 {
        ring: Box<RxRing>,
        listener: OwnedFd,
    },
    /// The UDP socket on port 4791 itself (IPv6, or IPv4 without CAP_NET_RAW).
    Udp(OwnedFd),
}

impl Receiver {
    fn fd(&self) -> RawFd {
        match self {
            Receiver::RingV4 { ring, .. } => ring.fd(),
            Receiver::Udp(fd) => fd.as_raw_fd(),
        }
    }

    /// The UDP socket on port 4791 (it can send, too).
    fn udp_fd(&self) -> RawFd {
        match self {
            Receiver::RingV4 { listener, .. } => listener.as_raw_fd(),
            Receiver::Udp(fd) => fd.as_raw_fd(),
        }
    }

    fn open(netdev: &str, addr: IpAddr) -> io::Result<Receiver> {
        let listener = bound_socket(netdev, addr, ROCE_PORT, false)?;
        let IpAddr::V4(v4) = addr else {
            return Ok(Receiver::Udp(listener));
        };
        match RxRing::open(netdev, v4, SOCKET_BUFFER as usize) {
            Ok(ring) => {
                attach_filter(listener.as_raw_fd(), &DROP_ALL_FILTER)?;
                drain(listener.as_raw_fd());
                Ok(Receiver::RingV4 {
                    ring: Box::new(ring),
                    listener,
                })
            }
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                tracing::warn!(
                    netdev,
                    %addr,
                    "no packet socket (needs CAP_NET_RAW): receiving on UDP, so packets whose \
                     sender numbers its IPv4 IDs (Linux rxe) fail the ICRC check"
                );
                Ok(Receiver::Udp(listener))
            }
            Err(e) => Err(e),
        }
    }
}

/// The UDP wire of a device.
pub(crate) struct UdpWire {
    netdev: String,
    addr: IpAddr,
    /// The network namespace the device was opened in.
    netns: OwnedFd,
    rx: Receiver,
    tx: HashMap<u16, OwnedFd>,
    /// Frames with our own headers to resolved peers (`None` without CAP_NET_RAW or on a
    /// netdev that is not Ethernet: everything goes through `tx`).
    eth: Option<Box<EthTx>>,
    /// Indices of the packets of a batch `eth` did not take (scratch).
    rest: Vec<usize>,
    monitor: LinkMonitor,
    state: PortState,
    last_link_poll: Instant,
    // Scratch arrays for recvmmsg/sendmmsg, sized to the largest batch seen; their pointers
    // are refilled on every call.
    hdrs: Vec<libc::mmsghdr>,
    iovs: Vec<libc::iovec>,
    names: Vec<libc::sockaddr_storage>,
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
    /// Opens the receive socket, the link monitor and, for [`SendPath::Frames`], the packet
    /// socket frames are sent through.
    pub(crate) fn open(netdev: &str, addr: IpAddr, send_path: SendPath) -> io::Result<UdpWire> {
        let netns = current_netns()?;
        let monitor = LinkMonitor::open(netdev)?;
        let rx = Receiver::open(netdev, addr)?;
        let state = monitor.state().into();
        let eth = match send_path {
            SendPath::UdpSockets => None,
            SendPath::Frames => match EthTx::open(netdev, addr) {
                Ok(eth) => Some(Box::new(eth)),
                Err(e) => {
                    tracing::warn!(
                        netdev,
                        %addr,
                        error = %e,
                        "no packet socket to send frames through: sending through UDP sockets, \
                         whose packets wait for ARP after a link flap"
                    );
                    None
                }
            },
        };
        Ok(UdpWire {
            netdev: netdev.to_string(),
            addr,
            netns,
            rx,
            tx: HashMap::new(),
            eth,
            rest: Vec::new(),
            monitor,
            state,
            last_link_poll: Instant::now(),
            hdrs: Vec::new(),
            iovs: Vec::new(),
            names: Vec::new(),
        })
    }

    pub(crate) fn local_addr(&self) -> IpAddr {
        self.addr
    }

    pub(crate) fn poll_fds(&self) -> Vec<RawFd> {
        vec![self.rx.fd(), self.monitor.fd()]
    }

    /// The receive ring's socket: taking the netdev down sets `ENETDOWN` on it, which epoll
    /// reports until read; the link monitor reports the same as the port state.
    pub(crate) fn error_notice_fds(&self) -> Vec<RawFd> {
        match &self.rx {
            Receiver::RingV4 { ring, .. } => vec![ring.fd()],
            Receiver::Udp(_) => Vec::new(),
        }
    }

    pub(crate) fn port_state(&mut self) -> PortState {
        if self.last_link_poll.elapsed() >= LINK_POLL_INTERVAL {
            self.last_link_poll = Instant::now();
            if let Some(s) = self.monitor.poll() {
                self.state = s.into();
            }
            if let Some(eth) = self.eth.as_mut() {
                eth.repoll();
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

    /// Opens the send socket of `src_port` now if it is not open yet (see
    /// [`crate::medium::WireImpl::prepare_source_port`]). Creating it costs a namespace
    /// check, a socket, five options and a bind: measured as 18 % of both lcores' time while
    /// 1,000 QPs failed over, when each backup QP's first packet opened its socket
    /// (`perf`, docs/testbed.md).
    pub(crate) fn prepare_source_port(&mut self, src_port: u16) {
        self.tx_socket(src_port);
    }

    /// Resolves `peer`'s MAC address for a QP being connected (see [`EthTx::prepare_peer`]).
    pub(crate) fn prepare_peer(&mut self, peer: IpAddr) {
        if let Some(eth) = self.eth.as_mut() {
            eth.prepare_peer(peer);
        }
    }

    /// Sends the batch: frames to resolved peers through the packet socket in one
    /// `sendmmsg`; the rest through the UDP sockets, runs sharing a source port in one
    /// `sendmmsg` each.
    pub(crate) fn send(&mut self, batch: &Batch) -> usize {
        let pkts = batch.filled();
        let mut rest = std::mem::take(&mut self.rest);
        rest.clear();
        let mut sent = 0;
        match self.eth.as_mut() {
            Some(eth) => sent += eth.send(pkts, self.addr, &mut rest),
            None => rest.extend(0..pkts.len()),
        }
        if !rest.is_empty() {
            sent += self.send_udp(pkts, &rest);
        }
        self.rest = rest;
        sent
    }

    /// Sends `pkts[i]` for each `i` of `which` through the UDP socket of its source port.
    fn send_udp(&mut self, pkts: &[PacketBuf], which: &[usize]) -> usize {
        self.scratch(which.len());
        let mut sent = 0;
        let mut start = 0;
        while start < which.len() {
            let port = pkts[which[start]].src_port;
            let mut end = start + 1;
            while end < which.len() && pkts[which[end]].src_port == port {
                end += 1;
            }
            let fd = self.tx_socket(port);
            for (slot, &i) in which.iter().enumerate().take(end).skip(start) {
                let pkt = &pkts[i];
                // Only peers of the socket's family can be reached; another family's peer
                // gets no address and fails alone (EDESTADDRREQ), to be retransmitted or
                // errored like any lost packet.
                let (name, namelen) = sockaddr(pkt.peer, ROCE_PORT);
                let namelen = if pkt.peer.is_ipv4() == self.addr.is_ipv4() {
                    namelen
                } else {
                    0
                };
                self.names[slot] = name;
                self.iovs[slot] = libc::iovec {
                    iov_base: pkt.data.as_ptr() as *mut libc::c_void,
                    iov_len: pkt.len,
                };
                let h = &mut self.hdrs[slot].msg_hdr;
                h.msg_name = (&mut self.names[slot] as *mut libc::sockaddr_storage).cast();
                h.msg_namelen = namelen;
                h.msg_iov = &mut self.iovs[slot];
                h.msg_iovlen = 1;
                h.msg_control = std::ptr::null_mut();
                h.msg_controllen = 0;
                h.msg_flags = 0;
            }
            sent += send_all(fd, &mut self.hdrs[start..end]);
            start = end;
        }
        sent
    }

    /// Receives up to the batch's capacity: from the ring's memory, or with one `recvmmsg`.
    pub(crate) fn recv(&mut self, batch: &mut Batch) -> usize {
        let fd = match &mut self.rx {
            Receiver::RingV4 { ring, .. } => return ring.recv(batch),
            Receiver::Udp(fd) => fd.as_raw_fd(),
        };
        let cap = batch.slots.len();
        self.scratch(cap);
        for i in 0..cap {
            let slot = &mut batch.slots[i];
            self.iovs[i] = libc::iovec {
                iov_base: slot.data.as_mut_ptr().cast(),
                iov_len: slot.data.len(),
            };
            let h = &mut self.hdrs[i].msg_hdr;
            h.msg_name = (&mut self.names[i] as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
            h.msg_iov = &mut self.iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = std::ptr::null_mut();
            h.msg_controllen = 0;
            h.msg_flags = 0;
        }
        // SAFETY: hdrs[..cap] point at live names, iovecs and batch buffers.
        let n = unsafe {
            libc::recvmmsg(
                fd,
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
            // Anything this device does not take gets length 0, which parsing drops and counts.
            slot.len = 0;
            slot.ipv4 = None;
            if truncated {
                continue;
            }
            if let Some((peer, port)) = from_sockaddr(&self.names[i]) {
                slot.peer = peer;
                slot.src_port = port;
                slot.len = self.hdrs[i].msg_len as usize;
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

    #[test]
    fn a_prepared_source_port_has_its_socket_before_the_first_send() {
        let mut wire = match UdpWire::open("lo", IpAddr::V4(Ipv4Addr::LOCALHOST), SendPath::Frames)
        {
            Ok(w) => w,
            Err(e) => {
                eprintln!("skipped: cannot open a UDP wire on lo here: {e}");
                return;
            }
        };
        let port = rxe_source_port(0x42);
        assert!(!wire.tx.contains_key(&port));
        wire.prepare_source_port(port);
        let fd = wire.tx.get(&port).map(|f| f.as_raw_fd());
        assert!(fd.is_some(), "no socket for the prepared port");
        // Preparing again, or sending, reuses it.
        wire.prepare_source_port(port);
        assert_eq!(wire.tx.len(), 1);
        assert_eq!(Some(wire.tx_socket(port)), fd);
    }

    #[test]
    fn opening_on_a_missing_netdev_names_it() {
        let err = UdpWire::open(
            "no-such-dev0",
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            SendPath::Frames,
        )
        .unwrap_err();
        assert!(err.to_string().contains("no-such-dev0"), "{err}");
    }
}
