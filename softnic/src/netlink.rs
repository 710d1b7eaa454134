//! A UDP device's port state is its netdev's link state, which `udp` reads through the
//! workspace's `netdev-link` crate (rtnetlink on `netlink-sys`, `netlink-packet-core` and
//! `netlink-packet-route`; the pmd's link watch reads ConnectX netdevs through the same
//! crate): the port is active when the netdev is up, running and lower-up, as that crate
//! documents.

use netdev_link::LinkState;

use crate::wire::PortState;

impl From<LinkState> for PortState {
    fn from(state: LinkState) -> PortState {
        match state {
            LinkState::Up => PortState::Active,
            LinkState::Down => PortState::Down,
        }
    }
}
