//! Sending whole frames through a packet socket, as a RoCE NIC does: our own Ethernet, IP and
//! UDP headers in front of each RoCEv2 packet, to the peer's MAC address resolved once, when a
//! QP to it is connected (RTR), from the kernel's neighbour table (asking the kernel to resolve
//! it when it has no usable entry). That is a RoCE NIC's address vector: once resolved, the
//! address is kept, so a link flap (which flushes the kernel's unpinned entries) never makes a
//! packet wait for ARP.
//!
//! Headers are the ones the UDP socket path made Linux write, so the wire is unchanged: IPv4
//! with DF set, IP ID 0 and UDP checksum 0 (as rxe sends, and as a receiver without the IP
//! header rebuilds it for the ICRC), TTL 64; IPv6 with hop limit 64, traffic class and flow
//! label 0 and the UDP checksum IPv6 requires, computed here over the packet (RFC 8200; rxe
//! sends 0, which our receivers accept, but captures then flag every packet). A peer without a resolved address (not answered yet, behind a router,
//! or of the other family) is sent to through the UDP sockets as before, which ask ARP
//! themselves; the engine looks its address up again every [`REPOLL`].

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use hw_defs::roce::ethernet::{self, EthernetFrame, EthernetRepr};
use hw_defs::roce::ipv4::{self, Ipv4Packet, Ipv4Repr};
use hw_defs::roce::ipv6::{self, Ipv6Packet, Ipv6Repr};
use hw_defs::roce::udp::{self, UdpPacket, UdpRepr};
use netdev_link::LinkControl;

use crate::wire::{PacketBuf, ROCE_PORT};

/// The longest header stack in front of a RoCEv2 packet: Ethernet, IPv6, UDP.
pub(crate) const FRAME_HEADER_MAX: usize =
    ethernet::HEADER_LEN + ipv6::HEADER_LEN + udp::HEADER_LEN;

/// How often the engine looks up the peers whose address is not resolved yet.
pub(crate) const REPOLL: Duration = Duration::from_millis(10);
/// A peer's address resolved this recently is reused by the next QP connected to it without
/// asking the kernel again (a thousand QPs to one peer cost one lookup, not a thousand).
const REUSE: Duration = Duration::from_secs(1);
/// The hop limit (IPv4 TTL) Linux gives UDP by default.
const HOP_LIMIT: u8 = 64;
const ARPHRD_ETHER: u16 = 1;
const ARPHRD_LOOPBACK: u16 = 772;
const SOCKET_BUFFER: libc::c_int = 16 << 20;

/// The ones' complement sum of `data` added to `acc`, 32 bits at a time (folding a sum of
/// 32-bit words gives the sum of the 16-bit words); an odd tail is padded with zero.
fn ones_sum(data: &[u8], mut acc: u64) -> u64 {
    let mut words = data.chunks_exact(4);
    for w in &mut words {
        acc += u64::from(u32::from_be_bytes([w[0], w[1], w[2], w[3]]));
    }
    let tail = words.remainder();
    let mut last = [0u8; 4];
    last[..tail.len()].copy_from_slice(tail);
    acc + u64::from(u32::from_be_bytes(last))
}

/// The UDP checksum over IPv6 of `udp_header` (checksum field zero) and `payload`.
fn udp6_checksum(src: Ipv6Addr, dst: Ipv6Addr, udp_header: &[u8], payload: &[u8]) -> u16 {
    let len = (udp_header.len() + payload.len()) as u64;
    let mut acc = ones_sum(&src.octets(), 0);
    acc = ones_sum(&dst.octets(), acc);
    acc += len + u64::from(ipv4::PROTOCOL_UDP);
    acc = ones_sum(payload, ones_sum(udp_header, acc));
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    match !(acc as u16) {
        0 => 0xffff,
        sum => sum,
    }
}

/// Writes the Ethernet, IP and UDP headers of the RoCEv2 packet `payload` (BTH to ICRC) into
/// `buf`; returns their length, or `None` when the addresses are of different families or
/// the length does not fit.
pub(crate) fn write_headers(
    buf: &mut [u8; FRAME_HEADER_MAX],
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: IpAddr,
    dst: IpAddr,
    src_port: u16,
    payload: &[u8],
) -> Option<usize> {
    let payload_len = payload.len();
    let udp_len = udp::HEADER_LEN + payload_len;
    let (eth, rest) = buf.split_at_mut(ethernet::HEADER_LEN);
    let (ethertype, ip_len) = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            Ipv4Repr {
                src_addr: s,
                dst_addr: d,
                protocol: ipv4::PROTOCOL_UDP,
                payload_len: udp_len,
                ttl: HOP_LIMIT,
                dscp_ecn: 0,
                ident: 0,
                dont_frag: true,
            }
            .emit(&mut Ipv4Packet::new_unchecked(
                &mut rest[..ipv4::HEADER_LEN],
            ))
            .ok()?;
            (ethernet::ETHERTYPE_IPV4, ipv4::HEADER_LEN)
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            Ipv6Repr {
                src_addr: s,
                dst_addr: d,
                next_header: ipv4::PROTOCOL_UDP,
                payload_len: udp_len,
                hop_limit: HOP_LIMIT,
                traffic_class: 0,
                flow_label: 0,
            }
            .emit(&mut Ipv6Packet::new_unchecked(
                &mut rest[..ipv6::HEADER_LEN],
            ))
            .ok()?;
            (ethernet::ETHERTYPE_IPV6, ipv6::HEADER_LEN)
        }
        _ => return None,
    };
    let udp_header = &mut rest[ip_len..ip_len + udp::HEADER_LEN];
    UdpRepr {
        src_port,
        dst_port: ROCE_PORT,
    }
    .emit(&mut UdpPacket::new_unchecked(&mut *udp_header), payload_len)
    .ok()?;
    if let (IpAddr::V6(s), IpAddr::V6(d)) = (src, dst) {
        let sum = udp6_checksum(s, d, udp_header, payload);
        UdpPacket::new_unchecked(&mut *udp_header).set_checksum(sum);
    }
    EthernetRepr {
        src_addr: src_mac,
        dst_addr: dst_mac,
        ethertype,
    }
    .emit(&mut EthernetFrame::new_unchecked(eth));
    Some(ethernet::HEADER_LEN + ip_len + udp::HEADER_LEN)
}

/// A peer's address vector: its MAC address once resolved, and when it was last asked for.
#[derive(Debug, Clone, Copy)]
struct Av {
    mac: Option<[u8; 6]>,
    asked: Instant,
}

/// The packet socket a device sends frames through, and its address vectors.
pub(crate) struct EthTx {
    fd: OwnedFd,
    ifindex: u32,
    src_mac: [u8; 6],
    /// `lo`: no neighbours, every frame goes to the zero address.
    loopback: bool,
    /// The device's address family: peers of the other one are never resolved.
    ipv4: bool,
    neigh: LinkControl,
    avs: HashMap<IpAddr, Av>,
    /// The peer of the last frame and its address: a batch usually has one peer.
    last: Option<(IpAddr, [u8; 6])>,
    unresolved: usize,
    last_repoll: Instant,
    dest: libc::sockaddr_ll,
    // Scratch for sendmmsg, sized to the largest batch seen; pointers refilled every call.
    hdrs: Vec<libc::mmsghdr>,
    iovs: Vec<[libc::iovec; 2]>,
    frames: Vec<[u8; FRAME_HEADER_MAX]>,
}

// SAFETY: the raw pointers in the scratch arrays are rewritten before every use and never
// dereferenced outside the call that set them.
unsafe impl Send for EthTx {}

/// The hardware type and address of `netdev` (`SIOCGIFHWADDR` on `fd`).
fn hw_addr(fd: RawFd, netdev: &str) -> io::Result<(u16, [u8; 6])> {
    // struct ifreq: the name (16 bytes), then a struct sockaddr (family, 14 bytes of data).
    let mut ifr = [0u8; 40];
    if netdev.len() >= 16 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("netdev name {netdev:?} is longer than 15 bytes"),
        ));
    }
    ifr[..netdev.len()].copy_from_slice(netdev.as_bytes());
    // SAFETY: ifr is a live, large enough struct ifreq for this request.
    if unsafe { libc::ioctl(fd, libc::SIOCGIFHWADDR, ifr.as_mut_ptr()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let family = u16::from_ne_bytes([ifr[16], ifr[17]]);
    let mut mac = [0u8; 6];
    mac.copy_from_slice(&ifr[18..24]);
    Ok((family, mac))
}

impl EthTx {
    /// Opens a send-only packet socket on `netdev` (it receives nothing: protocol 0) in the
    /// calling thread's namespace. `PermissionDenied` without CAP_NET_RAW; `Unsupported` on
    /// a netdev that is neither Ethernet nor loopback.
    pub(crate) fn open(netdev: &str, local: IpAddr) -> io::Result<EthTx> {
        let name = std::ffi::CString::new(netdev)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "netdev name with NUL"))?;
        // SAFETY: a NUL-terminated name.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if ifindex == 0 {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no netdev named {netdev}"),
            ));
        }
        // SAFETY: plain syscall; checked and owned below.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fresh descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let (hw_type, src_mac) = hw_addr(raw, netdev)?;
        let loopback = match hw_type {
            ARPHRD_ETHER => false,
            ARPHRD_LOOPBACK => true,
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("{netdev} is not Ethernet (hardware type {other})"),
                ))
            }
        };
        let ethertype = if local.is_ipv4() {
            ethernet::ETHERTYPE_IPV4
        } else {
            ethernet::ETHERTYPE_IPV6
        };
        // SAFETY: sockaddr_ll is plain data; all-zero is valid.
        let mut dest: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        dest.sll_family = libc::AF_PACKET as u16;
        dest.sll_ifindex = ifindex as i32;
        dest.sll_protocol = ethertype.to_be();
        let set = |name| {
            // SAFETY: passes a live c_int of the stated size.
            unsafe {
                libc::setsockopt(
                    raw,
                    libc::SOL_SOCKET,
                    name,
                    (&SOCKET_BUFFER as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as u32,
                )
            }
        };
        // A large buffer, as for the UDP sockets; FORCE needs CAP_NET_ADMIN.
        if set(libc::SO_SNDBUFFORCE) < 0 {
            set(libc::SO_SNDBUF);
        }
        Ok(EthTx {
            fd,
            ifindex,
            src_mac,
            loopback,
            ipv4: local.is_ipv4(),
            neigh: LinkControl::open()?,
            avs: HashMap::new(),
            last: None,
            unresolved: 0,
            last_repoll: Instant::now(),
            dest,
            hdrs: Vec::new(),
            iovs: Vec::new(),
            frames: Vec::new(),
        })
    }

    /// Resolves `peer`'s address for a QP being connected: from the kernel's neighbour table,
    /// asking the kernel to resolve it when the table has no usable entry (IPv4; over IPv6 the
    /// first packet sent through the UDP path asks). An address already
    /// known is kept when the kernel has none now (its entry went with a carrier loss), and
    /// replaced when the kernel knows another. Control path.
    pub(crate) fn prepare_peer(&mut self, peer: IpAddr) {
        if self.loopback || peer.is_ipv4() != self.ipv4 {
            return;
        }
        let known = self.avs.get(&peer).copied();
        if known.is_some_and(|av| av.mac.is_some() && av.asked.elapsed() < REUSE) {
            return;
        }
        let mut mac = self.lookup(peer);
        // Over IPv6 an entry made this way stayed INCOMPLETE, its first solicitation not sent
        // (kernel 6.18, veth), and the UDP path's packets then waited behind it: there the
        // first packet sent through the UDP socket starts the resolution, as it always did.
        if mac.is_none() && peer.is_ipv4() {
            if let Err(e) = self.neigh.resolve_neighbour(self.ifindex, peer) {
                tracing::debug!(%peer, error = %e, "cannot ask the kernel to resolve the peer");
            }
            mac = self.lookup(peer);
        }
        self.avs.insert(
            peer,
            Av {
                mac: mac.or(known.and_then(|av| av.mac)),
                asked: Instant::now(),
            },
        );
        self.recount();
    }

    fn lookup(&mut self, peer: IpAddr) -> Option<[u8; 6]> {
        match self.neigh.neighbour(self.ifindex, peer) {
            Ok(mac) => mac,
            Err(e) => {
                tracing::debug!(%peer, error = %e, "neighbour lookup failed");
                None
            }
        }
    }

    fn recount(&mut self) {
        self.unresolved = self.avs.values().filter(|av| av.mac.is_none()).count();
        self.last = None;
    }

    /// Looks up the peers not resolved yet, at most every [`REPOLL`] (what the UDP path sent
    /// them made the kernel ask ARP). Called from the engine's link poll; costs nothing while
    /// every peer is resolved.
    pub(crate) fn repoll(&mut self) {
        if self.unresolved == 0 || self.last_repoll.elapsed() < REPOLL {
            return;
        }
        self.last_repoll = Instant::now();
        let pending: Vec<IpAddr> = self
            .avs
            .iter()
            .filter(|(_, av)| av.mac.is_none())
            .map(|(peer, _)| *peer)
            .collect();
        for peer in pending {
            if let Some(mac) = self.lookup(peer) {
                self.avs.insert(
                    peer,
                    Av {
                        mac: Some(mac),
                        asked: Instant::now(),
                    },
                );
            }
        }
        self.recount();
    }

    /// The MAC address frames to `peer` go to, if it is resolved.
    #[inline]
    fn mac_of(&mut self, peer: IpAddr) -> Option<[u8; 6]> {
        if self.loopback {
            return (peer.is_ipv4() == self.ipv4).then_some([0; 6]);
        }
        if let Some((p, mac)) = self.last {
            if p == peer {
                return Some(mac);
            }
        }
        let mac = self.avs.get(&peer)?.mac?;
        self.last = Some((peer, mac));
        Some(mac)
    }

    /// Sends the packets of `pkts` whose peer is resolved as frames, in one `sendmmsg` (and
    /// more while the socket buffer is full), and pushes the index of every other packet to
    /// `rest` for the UDP path. Returns how many frames the kernel took.
    pub(crate) fn send(
        &mut self,
        pkts: &[PacketBuf],
        local: IpAddr,
        rest: &mut Vec<usize>,
    ) -> usize {
        if self.hdrs.len() < pkts.len() {
            // SAFETY: plain C structs for which all-zero is valid.
            self.hdrs
                .resize_with(pkts.len(), || unsafe { std::mem::zeroed() });
            // SAFETY: as above.
            self.iovs
                .resize_with(pkts.len(), || unsafe { std::mem::zeroed() });
            self.frames.resize(pkts.len(), [0; FRAME_HEADER_MAX]);
        }
        let mut n = 0;
        for (i, p) in pkts.iter().enumerate() {
            let Some(mac) = self.mac_of(p.peer) else {
                rest.push(i);
                continue;
            };
            let Some(hlen) = write_headers(
                &mut self.frames[n],
                self.src_mac,
                mac,
                local,
                p.peer,
                p.src_port,
                p.bytes(),
            ) else {
                rest.push(i);
                continue;
            };
            self.iovs[n] = [
                libc::iovec {
                    iov_base: self.frames[n].as_mut_ptr().cast(),
                    iov_len: hlen,
                },
                libc::iovec {
                    iov_base: p.data.as_ptr() as *mut libc::c_void,
                    iov_len: p.len,
                },
            ];
            let h = &mut self.hdrs[n].msg_hdr;
            h.msg_name = (&mut self.dest as *mut libc::sockaddr_ll).cast();
            h.msg_namelen = std::mem::size_of::<libc::sockaddr_ll>() as u32;
            h.msg_iov = self.iovs[n].as_mut_ptr();
            h.msg_iovlen = 2;
            h.msg_control = std::ptr::null_mut();
            h.msg_controllen = 0;
            h.msg_flags = 0;
            n += 1;
        }
        crate::send_batch::send_all(self.fd.as_raw_fd(), &mut self.hdrs[..n])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const SRC_MAC: [u8; 6] = [0x02, 0, 0xc6, 0x12, 0, 1];
    const DST_MAC: [u8; 6] = [0x02, 0, 0xc6, 0x12, 0, 2];

    #[test]
    fn ipv4_headers_are_what_linux_wrote_for_the_udp_socket() {
        let mut buf = [0u8; FRAME_HEADER_MAX];
        let src = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1));
        let dst = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2));
        let len = write_headers(&mut buf, SRC_MAC, DST_MAC, src, dst, 0xC123, &[7; 100]).unwrap();
        assert_eq!(len, 42);
        #[rustfmt::skip]
        let expected: [u8; 42] = [
            // Ethernet: destination, source, IPv4.
            0x02, 0, 0xc6, 0x12, 0, 2, 0x02, 0, 0xc6, 0x12, 0, 1, 0x08, 0x00,
            // IPv4: 0x45, TOS 0, total 20 + 8 + 100, ID 0, DF, TTL 64, UDP, checksum, addresses.
            0x45, 0x00, 0x00, 0x80, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00,
            198, 18, 0, 1, 198, 18, 0, 2,
            // UDP: source port, 4791, length 108, checksum 0.
            0xc1, 0x23, 0x12, 0xb7, 0x00, 0x6c, 0x00, 0x00,
        ];
        // The header checksum, computed by hand: the one's complement sum of the header's
        // 16-bit words with the checksum field zero.
        let words = [
            0x4500u32, 0x0080, 0, 0x4000, 0x4011, 0, 0xc612, 0x0001, 0xc612, 0x0002,
        ];
        let mut sum: u32 = words.iter().sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        let csum = !(sum as u16);
        let mut expected = expected;
        expected[24..26].copy_from_slice(&csum.to_be_bytes());
        // ID 0 and DF: the header a receiver without it rebuilds for the ICRC check.
        assert_eq!(buf[..42], expected[..]);
    }

    #[test]
    fn ipv6_headers_carry_the_addresses_and_the_udp_checksum_ipv6_requires() {
        let src = IpAddr::V6("2001:2::1".parse::<Ipv6Addr>().unwrap());
        let dst = IpAddr::V6("2001:2::2".parse::<Ipv6Addr>().unwrap());
        // Odd and even lengths, and one whose sum comes out at every tail length.
        for n in [100usize, 101, 102, 103, 4124] {
            let payload: Vec<u8> = (0..n).map(|i| (i * 37 + 11) as u8).collect();
            let mut buf = [0u8; FRAME_HEADER_MAX];
            let len = write_headers(&mut buf, SRC_MAC, DST_MAC, src, dst, 0xC123, &payload);
            assert_eq!(len, Some(FRAME_HEADER_MAX));
            assert_eq!(buf[12..14], [0x86, 0xdd]);
            assert_eq!(buf[14] >> 4, 6);
            assert_eq!(usize::from(u16::from_be_bytes([buf[18], buf[19]])), 8 + n);
            assert_eq!((buf[20], buf[21]), (17, 64));
            assert_eq!(
                buf[22..38],
                "2001:2::1".parse::<Ipv6Addr>().unwrap().octets()
            );
            assert_eq!(buf[54..58], [0xc1, 0x23, 0x12, 0xb7]);
            // hw-defs verifies the checksum over the datagram laid out contiguously.
            let mut datagram = buf[54..62].to_vec();
            datagram.extend_from_slice(&payload);
            assert!(
                UdpPacket::new_unchecked(&datagram[..]).verify_checksum(src, dst),
                "{n} bytes"
            );
            assert_ne!(u16::from_be_bytes([buf[60], buf[61]]), 0);
        }
    }

    #[test]
    fn peers_of_the_other_family_get_no_headers() {
        let mut buf = [0u8; FRAME_HEADER_MAX];
        let v4 = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1));
        let v6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
        assert_eq!(
            write_headers(&mut buf, SRC_MAC, DST_MAC, v4, v6, 1, &[0; 10]),
            None
        );
    }
}
