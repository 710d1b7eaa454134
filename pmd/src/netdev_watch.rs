//! A netdev's link, watched from the pmd: how the failover service learns that a ConnectX's
//! link (its netdev's) went down or came back, under every feature set.
//!
//! Built on the workspace's `netdev-link` crate (rtnetlink through `netlink-sys`,
//! `netlink-packet-core` and `netlink-packet-route`), which the softnic reads its UDP ports'
//! state through too: the lookup by name, the query of the state now and the non-blocking
//! `RTNLGRP_LINK` subscription live there, with the rule for "up" (IFF_UP, IFF_RUNNING and
//! IFF_LOWER_UP). This module adds what a poll loop wants: the socket to sleep on, and only
//! the changes, each burst of messages collapsed to the state it ended in.

use std::io;
use std::os::fd::RawFd;

pub use netdev_link::{query, Link, LinkState};

/// The link watch of one netdev: its state as last reported, and the subscription that
/// reports the next change.
#[derive(Debug)]
pub struct NetdevWatch {
    monitor: netdev_link::LinkMonitor,
    state: LinkState,
}

impl NetdevWatch {
    /// Subscribes to `netdev`'s link changes and reads its state now. Fails if the netdev
    /// does not exist (kind `NotFound`, naming it) or rtnetlink cannot be opened.
    pub fn open(netdev: &str) -> io::Result<NetdevWatch> {
        let monitor = netdev_link::LinkMonitor::open(netdev)?;
        let state = monitor.state();
        Ok(NetdevWatch { monitor, state })
    }

    /// The netdev's name.
    pub fn netdev(&self) -> &str {
        self.monitor.netdev()
    }

    /// The link's state as last reported (at [`NetdevWatch::open`] or by [`NetdevWatch::poll`]).
    pub fn state(&self) -> LinkState {
        self.state
    }

    /// Reads what rtnetlink reported since the last call, without blocking. Returns the new
    /// state if the link changed: a burst collapses to its last message about this netdev, so
    /// a flap that ends where it began reports nothing.
    pub fn poll(&mut self) -> Option<LinkState> {
        let latest = self.monitor.poll()?;
        if latest == self.state {
            return None;
        }
        self.state = latest;
        Some(latest)
    }

    /// The socket, readable when link messages are waiting: a poll loop can sleep on it, or
    /// call [`NetdevWatch::poll`] every so many rounds.
    pub fn fd(&self) -> RawFd {
        self.monitor.fd()
    }
}
