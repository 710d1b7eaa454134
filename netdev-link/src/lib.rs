//! A netdev's link state through rtnetlink, on the ecosystem's rtnetlink crates
//! (`netlink-sys` for the sockets, `netlink-packet-core` for the framing,
//! `netlink-packet-route` for the link messages): look a netdev up by name, ask its state now,
//! and watch it without blocking.
//!
//! One rule says when a link is up, for the query and for the watch alike: the interface
//! flags IFF_UP, IFF_RUNNING and IFF_LOWER_UP all set. IFF_RUNNING (operstate up) is what
//! makes it later than carrier: after recent link events the kernel reports a returning link
//! first with carrier but not running, and running only when its rate-limited linkwatch work
//! runs, which is also when the device's qdisc starts passing traffic (`docs/testbed.md`,
//! "Known problems").
//!
//! Both the softnic (the port state of a UDP device) and the pmd (the link watch of a
//! ConnectX's netdev) read links through this crate: softnic cannot depend on the pmd, and a
//! crate below both keeps one rtnetlink reader instead of two. It depends on neither.
//!
//! Only the fixed 16-byte link header (index and flags) of each message is parsed, never its
//! attributes: they are many and driver-specific, none of them changes the rule above, and an
//! attribute the parser does not know must not hide a link change.

use std::io;
use std::os::fd::{AsRawFd, RawFd};

use std::net::{IpAddr, Ipv4Addr};

use netlink_packet_core::{
    ErrorBuffer, NetlinkBuffer, NetlinkHeader, NetlinkMessage, NetlinkPayload, NLMSG_ERROR,
    NLM_F_ACK, NLM_F_CREATE, NLM_F_REPLACE, NLM_F_REQUEST,
};
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkHeader, LinkMessage};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

/// The receive buffer of a socket: a link message without VF details (which only a request
/// with `IFLA_EXT_MASK` gets) is a few kilobytes; a datagram is one or more whole messages.
const RECV_BUFFER: usize = 32 << 10;

/// A link's state, by the rule in the crate's documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkState {
    /// IFF_UP, IFF_RUNNING and IFF_LOWER_UP all set: traffic can flow.
    Up,
    /// Anything else, or the netdev was deleted.
    Down,
}

impl LinkState {
    /// The state a netdev's interface flags say.
    pub fn from_flags(flags: LinkFlags) -> LinkState {
        if flags.contains(LinkFlags::Up | LinkFlags::Running | LinkFlags::LowerUp) {
            LinkState::Up
        } else {
            LinkState::Down
        }
    }

    /// True for [`LinkState::Up`].
    pub fn is_up(self) -> bool {
        self == LinkState::Up
    }
}

/// A netdev as rtnetlink reported it just now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    /// Its interface index.
    pub index: u32,
    /// Its link state.
    pub state: LinkState,
}

/// Checks that `netdev` can be an interface name: not empty, shorter than `IFNAMSIZ`, no NUL.
fn check_name(netdev: &str) -> io::Result<()> {
    if netdev.is_empty() || netdev.len() >= libc::IFNAMSIZ || netdev.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{netdev:?} is not a netdev name"),
        ));
    }
    Ok(())
}

/// Sends `request` about `netdev` on `socket` (rtnetlink) and reads the answer until
/// `done` takes a payload of the kind it wants (returning `Some`), or the kernel answers with
/// an error message: an error code, or (for code 0, an ACK) what `ack` says.
fn exchange<T>(
    socket: &Socket,
    netdev: &str,
    request: RouteNetlinkMessage,
    flags: u16,
    mut done: impl FnMut(u16, &[u8]) -> Option<T>,
    ack: impl Fn() -> io::Result<T>,
) -> io::Result<T> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = 1;
    let mut message = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(request));
    message.finalize();
    let mut bytes = vec![0u8; message.buffer_len()];
    message.serialize(&mut bytes);

    socket.send_to(&bytes, &SocketAddr::new(0, 0), 0)?;
    let mut buf = vec![0u8; RECV_BUFFER];
    loop {
        let n = socket.recv(&mut &mut buf[..], 0)?;
        for (kind, payload) in messages(&buf[..n.min(buf.len())]) {
            if kind == NLMSG_ERROR {
                let code = ErrorBuffer::new_checked(payload)
                    .ok()
                    .and_then(|e| e.code())
                    .map_or(0, |c| -c.get());
                return match code {
                    libc::ENODEV => Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("no netdev named {netdev}"),
                    )),
                    0 => ack(),
                    errno => Err(io::Error::from_raw_os_error(errno)),
                };
            }
            if let Some(answer) = done(kind, payload) {
                return Ok(answer);
            }
        }
    }
}

/// Asks the kernel for `netdev` by name (`RTM_GETLINK` with `IFLA_IFNAME`): its index and its
/// state now. A netdev that does not exist is an error of kind `NotFound` naming it.
pub fn query(netdev: &str) -> io::Result<Link> {
    link_by_name(&Socket::new(NETLINK_ROUTE)?, netdev)
}

/// `RTM_GETLINK` for `netdev` by name on `socket`: its index and its state now.
fn link_by_name(socket: &Socket, netdev: &str) -> io::Result<Link> {
    check_name(netdev)?;
    let mut request = LinkMessage::default();
    request
        .attributes
        .push(LinkAttribute::IfName(netdev.to_string()));
    exchange(
        socket,
        netdev,
        RouteNetlinkMessage::GetLink(request),
        NLM_F_REQUEST,
        |kind, payload| {
            if kind != libc::RTM_NEWLINK {
                return None;
            }
            LinkHeader::parse(payload).ok().map(|link| Link {
                index: link.index,
                state: LinkState::from_flags(link.flags),
            })
        },
        || {
            Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("rtnetlink answered the query for {netdev} with no link"),
            ))
        },
    )
}

/// Sets `netdev`'s administrative state (IFF_UP), as `ip link set dev <netdev> up|down` does,
/// in the calling thread's network namespace: [`LinkControl::set_admin_state`] on a socket
/// opened for the one request.
pub fn set_admin_state(netdev: &str, up: bool) -> io::Result<()> {
    LinkControl::open()?.set_admin_state(netdev, up)
}

/// An rtnetlink socket for changing links, bound to the network namespace it was opened in
/// for its whole life: open one inside each namespace ahead of time, then change links there
/// from any thread without entering the namespace.
#[derive(Debug)]
pub struct LinkControl {
    socket: Socket,
}

impl LinkControl {
    /// A socket in the calling thread's network namespace.
    pub fn open() -> io::Result<LinkControl> {
        Ok(LinkControl {
            socket: Socket::new(NETLINK_ROUTE)?,
        })
    }

    /// Sets `netdev`'s administrative state (IFF_UP), as `ip link set dev <netdev> up|down`
    /// does, in the socket's namespace, and returns once the kernel acknowledged it: one
    /// `RTM_SETLINK` by name, with IFF_UP alone in the change mask.
    ///
    /// Why not `ip`: spawning `ip netns exec` is a fork and two execs, a few milliseconds of
    /// CPU that, on a machine whose cores are taken by busy-polling lcores, stretched to 8 to
    /// 13 ms between the testbed deciding to cut a link and the link going down
    /// (`docs/testbed.md`); and a thread spawned to enter the namespace waited up to
    /// a scheduler tick for a core, which a socket opened there beforehand does not.
    pub fn set_admin_state(&mut self, netdev: &str, up: bool) -> io::Result<()> {
        check_name(netdev)?;
        let mut request = LinkMessage::default();
        request.header.flags = if up {
            LinkFlags::Up
        } else {
            LinkFlags::empty()
        };
        request.header.change_mask = LinkFlags::Up;
        request
            .attributes
            .push(LinkAttribute::IfName(netdev.to_string()));
        exchange(
            &self.socket,
            netdev,
            RouteNetlinkMessage::SetLink(request),
            NLM_F_REQUEST | NLM_F_ACK,
            |_, _| None,
            || Ok(()),
        )
    }

    /// The index of `netdev` in the socket's namespace (`RTM_GETLINK` by name).
    pub fn index_of(&mut self, netdev: &str) -> io::Result<u32> {
        link_by_name(&self.socket, netdev).map(|link| link.index)
    }

    /// Pins the neighbour entry of `peer` on `netdev` to `mac`, as `ip neigh replace <peer>
    /// lladdr <mac> dev <netdev> nud permanent` does: one `RTM_NEWNEIGH` (create or replace)
    /// with NUD_PERMANENT, acknowledged. A permanent entry survives a carrier loss (the kernel
    /// flushes only the others then) but not the netdev going administratively down.
    pub fn pin_neighbour(&mut self, netdev: &str, peer: Ipv4Addr, mac: [u8; 6]) -> io::Result<()> {
        let index = self.index_of(netdev)?;
        let mut request = NeighbourMessage::default();
        request.header.family = AddressFamily::Inet;
        request.header.ifindex = index;
        request.header.state = NeighbourState::Permanent;
        request
            .attributes
            .push(NeighbourAttribute::Destination(NeighbourAddress::Inet(
                peer,
            )));
        request
            .attributes
            .push(NeighbourAttribute::LinkLayerAddress(mac.to_vec()));
        exchange(
            &self.socket,
            netdev,
            RouteNetlinkMessage::NewNeighbour(request),
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
            |_, _| None,
            || Ok(()),
        )
    }
}

/// The neighbour states whose link-layer address can be sent to: the kernel sends to a stale
/// or probed entry too, while it confirms it.
const NUD_USABLE: u16 = libc::NUD_REACHABLE
    | libc::NUD_STALE
    | libc::NUD_DELAY
    | libc::NUD_PROBE
    | libc::NUD_PERMANENT
    | libc::NUD_NOARP;

impl LinkControl {
    /// The link-layer (MAC) address the kernel's neighbour table holds for `peer` on the
    /// interface `index`, when the entry is usable (reachable, stale, delay, probe,
    /// permanent, noarp); `None` when there is no entry or it is unresolved (incomplete,
    /// failed). One `RTM_GETNEIGH` for the address (kernels from 5.0 answer it directly).
    pub fn neighbour(&mut self, index: u32, peer: IpAddr) -> io::Result<Option<[u8; 6]>> {
        let mut request = NeighbourMessage::default();
        request.header.ifindex = index;
        let (family, address) = match peer {
            IpAddr::V4(a) => (AddressFamily::Inet, NeighbourAddress::Inet(a)),
            IpAddr::V6(a) => (AddressFamily::Inet6, NeighbourAddress::Inet6(a)),
        };
        request.header.family = family;
        request
            .attributes
            .push(NeighbourAttribute::Destination(address));
        let answer = exchange(
            &self.socket,
            &format!("interface {index}"),
            RouteNetlinkMessage::GetNeighbour(request),
            NLM_F_REQUEST,
            |kind, payload| (kind == libc::RTM_NEWNEIGH).then(|| usable_lladdr(payload)),
            || Ok(None),
        );
        match answer {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            other => other,
        }
    }
}

impl LinkControl {
    /// Starts resolving `peer` on the interface `index` if the kernel has no usable entry for
    /// it, as `ip neigh replace <peer> dev <netdev> use nud none` does: an `RTM_NEWNEIGH`
    /// with NTF_USE, which creates the entry if needed and sends an ARP request or neighbour
    /// solicitation, changing nothing about an entry that is resolved (pinned ones included).
    /// Returns once the kernel acknowledged the request, not when the answer came.
    pub fn resolve_neighbour(&mut self, index: u32, peer: IpAddr) -> io::Result<()> {
        let mut request = NeighbourMessage::default();
        request.header.ifindex = index;
        request.header.state = NeighbourState::None;
        request.header.flags = NeighbourFlags::Use;
        let (family, address) = match peer {
            IpAddr::V4(a) => (AddressFamily::Inet, NeighbourAddress::Inet(a)),
            IpAddr::V6(a) => (AddressFamily::Inet6, NeighbourAddress::Inet6(a)),
        };
        request.header.family = family;
        request
            .attributes
            .push(NeighbourAttribute::Destination(address));
        exchange(
            &self.socket,
            &format!("interface {index}"),
            RouteNetlinkMessage::NewNeighbour(request),
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
            |_, _| None,
            || Ok(()),
        )
    }
}

/// The 6-byte link-layer address of a neighbour message (`struct ndmsg`, then attributes)
/// when its state is usable.
fn usable_lladdr(payload: &[u8]) -> Option<[u8; 6]> {
    // struct ndmsg: family u8, pad u8, pad u16, ifindex i32, state u16, flags u8, type u8.
    const NDMSG_LEN: usize = 12;
    let state = u16::from_ne_bytes(payload.get(8..10)?.try_into().ok()?);
    if state & NUD_USABLE == 0 {
        return None;
    }
    let mut attrs = payload.get(NDMSG_LEN..)?;
    while attrs.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([attrs[0], attrs[1]]));
        let kind = u16::from_ne_bytes([attrs[2], attrs[3]]);
        if len < 4 || len > attrs.len() {
            return None;
        }
        if kind == libc::NDA_LLADDR {
            return attrs[4..len].try_into().ok();
        }
        attrs = attrs.get(len.next_multiple_of(4)..).unwrap_or_default();
    }
    None
}

/// The netlink messages of one datagram, as (message type, payload), in order. A truncated
/// or malformed message ends the walk.
fn messages(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        let message = NetlinkBuffer::new_checked(buf).ok()?;
        let len = message.length() as usize;
        let item = (message.message_type(), message.payload());
        // Messages are 4-byte aligned; the last one of a datagram may lack its padding.
        buf = buf.get(len.next_multiple_of(4)..).unwrap_or_default();
        Some(item)
    })
}

/// The state the last link message for interface `index` in `datagram` reports, if any: an
/// `RTM_NEWLINK` by its flags, an `RTM_DELLINK` as down. Messages for other interfaces and of
/// other kinds are skipped; a truncated or malformed message ends the walk.
pub fn latest_state(datagram: &[u8], index: u32) -> Option<LinkState> {
    let mut latest = None;
    for (kind, payload) in messages(datagram) {
        if kind != libc::RTM_NEWLINK && kind != libc::RTM_DELLINK {
            continue;
        }
        let Ok(link) = LinkHeader::parse(payload) else {
            continue;
        };
        if link.index == index {
            latest = Some(if kind == libc::RTM_DELLINK {
                LinkState::Down
            } else {
                LinkState::from_flags(link.flags)
            });
        }
    }
    latest
}

/// A non-blocking rtnetlink socket subscribed to `RTNLGRP_LINK`, reporting one netdev.
#[derive(Debug)]
pub struct LinkMonitor {
    socket: Socket,
    netdev: String,
    index: u32,
    /// The state the monitor last learned (from the query at open, then from messages).
    state: LinkState,
    buf: Vec<u8>,
}

impl LinkMonitor {
    /// Subscribes to link changes, then queries `netdev`: a change after the query is in the
    /// subscription, so none is missed between the two.
    pub fn open(netdev: &str) -> io::Result<LinkMonitor> {
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        socket.bind(&SocketAddr::new(0, 0))?;
        socket.add_membership(libc::RTNLGRP_LINK)?;
        socket.set_non_blocking(true)?;
        let link = query(netdev)?;
        Ok(LinkMonitor {
            socket,
            netdev: netdev.to_string(),
            index: link.index,
            state: link.state,
            buf: vec![0u8; RECV_BUFFER],
        })
    }

    /// The netdev's name.
    pub fn netdev(&self) -> &str {
        &self.netdev
    }

    /// The netdev's interface index.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The state the monitor last learned, without reading the socket.
    pub fn state(&self) -> LinkState {
        self.state
    }

    /// Reads every message waiting, without blocking; returns the state the last one about
    /// our netdev reports (a burst collapses to its end), or `None` if none was about it. If
    /// the socket's buffer overflowed (`ENOBUFS`: messages were dropped, perhaps the last),
    /// the netdev is queried afresh and that answer is the latest.
    pub fn poll(&mut self) -> Option<LinkState> {
        let mut latest = None;
        loop {
            match self.socket.recv(&mut &mut self.buf[..], 0) {
                Ok(0) => break,
                Ok(n) => {
                    let n = n.min(self.buf.len());
                    if let Some(state) = latest_state(&self.buf[..n], self.index) {
                        latest = Some(state);
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    if let Ok(link) = query(&self.netdev) {
                        latest = Some(link.state);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        if let Some(state) = latest {
            self.state = state;
        }
        latest
    }

    /// The socket, readable when link messages are waiting (for poll or epoll).
    pub fn fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A neighbour message payload (`struct ndmsg` and an NDA_DST and an NDA_LLADDR
    /// attribute) in `state`.
    fn ndmsg(state: u16, mac: [u8; 6]) -> Vec<u8> {
        let mut b = vec![libc::AF_INET as u8, 0, 0, 0];
        b.extend_from_slice(&7i32.to_ne_bytes());
        b.extend_from_slice(&state.to_ne_bytes());
        b.extend_from_slice(&[0, 1]);
        b.extend_from_slice(&8u16.to_ne_bytes());
        b.extend_from_slice(&libc::NDA_DST.to_ne_bytes());
        b.extend_from_slice(&[198, 18, 0, 2]);
        b.extend_from_slice(&10u16.to_ne_bytes());
        b.extend_from_slice(&libc::NDA_LLADDR.to_ne_bytes());
        b.extend_from_slice(&mac);
        b.extend_from_slice(&[0, 0]);
        b
    }

    #[test]
    fn a_resolved_neighbour_gives_its_mac_and_an_unresolved_one_none() {
        let mac = [0x02, 0, 0xc6, 0x12, 0, 2];
        for state in [libc::NUD_REACHABLE, libc::NUD_STALE, libc::NUD_PERMANENT] {
            assert_eq!(usable_lladdr(&ndmsg(state, mac)), Some(mac));
        }
        for state in [libc::NUD_INCOMPLETE, libc::NUD_FAILED, libc::NUD_NONE] {
            assert_eq!(usable_lladdr(&ndmsg(state, mac)), None);
        }
        // Truncated: no panic, no address.
        assert_eq!(usable_lladdr(&ndmsg(libc::NUD_REACHABLE, mac)[..20]), None);
    }

    /// An `RTM_NEWLINK` or `RTM_DELLINK` for interface `index` with `flags`, as the kernel
    /// frames it (no attributes).
    fn link_message(kind: u16, index: u32, flags: LinkFlags) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&32u32.to_ne_bytes()); // length
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&[0u8; 10]); // flags, sequence, port
        m.extend_from_slice(&[0u8; 4]); // family, pad, type
        m.extend_from_slice(&index.to_ne_bytes());
        m.extend_from_slice(&flags.bits().to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes()); // change mask
        m
    }

    fn up_flags() -> LinkFlags {
        LinkFlags::Up | LinkFlags::Running | LinkFlags::LowerUp
    }

    #[test]
    fn a_link_is_up_only_when_up_running_and_lower_up() {
        assert_eq!(LinkState::from_flags(up_flags()), LinkState::Up);
        assert_eq!(
            LinkState::from_flags(up_flags() | LinkFlags::Multicast),
            LinkState::Up
        );
        // Carrier back but the kernel's linkwatch has not run yet: not usable.
        assert_eq!(
            LinkState::from_flags(LinkFlags::Up | LinkFlags::LowerUp),
            LinkState::Down
        );
        assert_eq!(
            LinkState::from_flags(LinkFlags::Up | LinkFlags::Running),
            LinkState::Down
        );
        assert_eq!(
            LinkState::from_flags(LinkFlags::Running | LinkFlags::LowerUp),
            LinkState::Down
        );
    }

    #[test]
    fn the_last_message_for_our_interface_wins() {
        let mut buf = link_message(libc::RTM_NEWLINK, 3, up_flags());
        buf.extend(link_message(libc::RTM_NEWLINK, 4, LinkFlags::empty()));
        buf.extend(link_message(libc::RTM_NEWLINK, 3, LinkFlags::Up));
        assert_eq!(latest_state(&buf, 3), Some(LinkState::Down));
        assert_eq!(latest_state(&buf[..32], 3), Some(LinkState::Up));
        assert_eq!(latest_state(&buf[..64], 3), Some(LinkState::Up));
        assert_eq!(latest_state(&buf, 9), None);
    }

    #[test]
    fn a_deleted_link_is_down_whatever_its_flags() {
        let mut buf = link_message(libc::RTM_NEWLINK, 3, up_flags());
        buf.extend(link_message(libc::RTM_DELLINK, 3, up_flags()));
        assert_eq!(latest_state(&buf, 3), Some(LinkState::Down));
    }

    #[test]
    fn messages_of_other_kinds_are_skipped() {
        let mut buf = link_message(libc::RTM_NEWLINK, 3, up_flags());
        buf.extend(link_message(libc::RTM_NEWADDR, 3, LinkFlags::empty()));
        assert_eq!(latest_state(&buf, 3), Some(LinkState::Up));
    }

    #[test]
    fn truncated_messages_are_ignored_without_panic() {
        let buf = link_message(libc::RTM_NEWLINK, 3, LinkFlags::empty());
        for cut in 0..buf.len() {
            assert_eq!(latest_state(&buf[..cut], 3), None);
        }
        let mut bad = buf.clone();
        bad[0..4].copy_from_slice(&1000u32.to_ne_bytes());
        assert_eq!(latest_state(&bad, 3), None);
        let mut short = buf.clone();
        short[0..4].copy_from_slice(&8u32.to_ne_bytes());
        assert_eq!(latest_state(&short, 3), None);
    }

    #[test]
    fn a_truncated_message_ends_the_walk_but_keeps_what_came_before() {
        let mut buf = link_message(libc::RTM_NEWLINK, 3, up_flags());
        buf.extend(link_message(libc::RTM_NEWLINK, 3, LinkFlags::empty()));
        assert_eq!(latest_state(&buf[..50], 3), Some(LinkState::Up));
    }

    #[test]
    fn the_loopback_device_is_found_by_name_and_up() {
        let lo = query("lo").expect("every network namespace has lo");
        assert_eq!(lo.index, 1);
        // lo has no carrier to lose: up, running and lower-up once set up.
        assert_eq!(lo.state, LinkState::Up);
    }

    #[test]
    fn a_netdev_that_does_not_exist_is_not_found_by_name() {
        let e = query("railshift-none0").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        assert!(e.to_string().contains("railshift-none0"), "{e}");
        let e = query("a-name-longer-than-ifnamsiz").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    }

    #[test]
    fn setting_the_state_of_a_netdev_that_does_not_exist_is_not_found_by_name() {
        let e = set_admin_state("rs-no-such-dev", false).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        assert!(e.to_string().contains("rs-no-such-dev"), "{e}");
    }

    #[test]
    fn setting_the_state_of_a_bad_name_is_refused_before_asking() {
        for bad in ["", "a-name-longer-than-ifnamsiz", "nul\0"] {
            let e = set_admin_state(bad, true).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad:?}: {e}");
        }
    }

    #[test]
    fn a_monitor_on_lo_opens_and_has_nothing_to_report() {
        let mut monitor = LinkMonitor::open("lo").expect("a monitor on lo");
        assert_eq!(monitor.index(), 1);
        assert_eq!(monitor.state(), LinkState::Up);
        assert_eq!(monitor.poll(), None);
    }
}
