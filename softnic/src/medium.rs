//! The device's wire as one type: a UDP socket on a netdev or a port on the in-memory fabric,
//! chosen when the device opens.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::fabric::FabricPort;
use crate::udp::UdpWire;
use crate::waker::Waker;
use crate::wire::{Batch, PortState};

/// The device's wire.
pub(crate) enum WireImpl {
    /// Boxed: the UDP wire carries its scratch arrays and sockets, the fabric port little.
    Udp(Box<UdpWire>),
    Fabric(FabricPort),
}

impl WireImpl {
    /// Our address (GID 0).
    pub fn local_addr(&self) -> IpAddr {
        match self {
            WireImpl::Udp(w) => w.local_addr(),
            WireImpl::Fabric(p) => p.addr(),
        }
    }

    /// Sends every packet of the batch (dropping what the OS refuses) and empties it.
    /// Returns how many were handed to the medium.
    pub fn send(&mut self, batch: &mut Batch, now: Duration) -> usize {
        let n = match self {
            WireImpl::Udp(w) => w.send(batch),
            WireImpl::Fabric(p) => p.send(batch, now),
        };
        batch.clear();
        n
    }

    /// Makes ready what sending from UDP source port `src_port` needs (a UDP wire's socket
    /// for that port), so that a QP's first packet costs no system calls: called when a QP
    /// is connected (RTR), on the control path.
    pub fn prepare_source_port(&mut self, src_port: u16) {
        match self {
            WireImpl::Udp(w) => w.prepare_source_port(src_port),
            WireImpl::Fabric(_) => {}
        }
    }

    /// Resolves the MAC address of `peer` for a QP being connected (RTR), as a RoCE NIC's
    /// address vector: a UDP wire then sends its frames there without asking ARP again.
    pub fn prepare_peer(&mut self, peer: IpAddr) {
        match self {
            WireImpl::Udp(w) => w.prepare_peer(peer),
            WireImpl::Fabric(_) => {}
        }
    }

    /// Fills the batch with received packets (from empty); returns how many.
    pub fn recv(&mut self, batch: &mut Batch, now: Duration) -> usize {
        batch.clear();
        match self {
            WireImpl::Udp(w) => w.recv(batch),
            WireImpl::Fabric(p) => p.recv(batch, now),
        }
    }

    /// The port's link state now (the netlink monitor's latest word for UDP).
    pub fn port_state(&mut self, now: Duration) -> PortState {
        match self {
            WireImpl::Udp(w) => w.port_state(),
            WireImpl::Fabric(p) => p.state(now),
        }
    }

    /// The link state the port reports to its driver: the physical one, except where a
    /// fabric's [`crate::Fault::LinkReport`] rule says otherwise.
    pub fn reported_port_state(&mut self, now: Duration) -> PortState {
        match self {
            WireImpl::Udp(w) => w.port_state(),
            WireImpl::Fabric(p) => p.reported_state(now),
        }
    }

    /// The earliest time something will arrive that is already on its way (fabric delays).
    pub fn next_arrival(&self, now: Duration) -> Option<Duration> {
        match self {
            WireImpl::Udp(_) => None,
            WireImpl::Fabric(p) => p.next_event(now),
        }
    }

    /// File descriptors the engine sleeps on (socket, netlink).
    pub fn poll_fds(&self) -> Vec<std::os::fd::RawFd> {
        match self {
            WireImpl::Udp(w) => w.poll_fds(),
            WireImpl::Fabric(_) => Vec::new(),
        }
    }

    /// Those of `poll_fds` whose pending socket error epoll reports until it is read, and
    /// which only repeats what the port state says (a receive ring's `ENETDOWN` after its
    /// netdev went down): the engine reads it to sleep again.
    pub fn error_notice_fds(&self) -> Vec<std::os::fd::RawFd> {
        match self {
            WireImpl::Udp(w) => w.error_notice_fds(),
            WireImpl::Fabric(_) => Vec::new(),
        }
    }

    /// Lets the wire wake the engine when a packet arrives (fabric only; sockets use epoll).
    pub fn attach_waker(&mut self, waker: Arc<Waker>) {
        if let WireImpl::Fabric(p) = self {
            p.attach_waker(waker)
        }
    }
}
