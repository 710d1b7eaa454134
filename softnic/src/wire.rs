//! What the engine and both wires say packets in: buffers reused across rounds, batches of
//! them, the RoCEv2 port, and a port's link state.

use std::net::IpAddr;

/// The largest UDP payload the device sends or accepts: a 4096-byte MTU segment plus the
/// largest header stack (BTH + RETH + ImmDt) and the ICRC, rounded up.
pub(crate) const MAX_PACKET: usize = 4096 + 128;

/// The RoCEv2 UDP destination port.
pub const ROCE_PORT: u16 = 4791;

/// The IPv4 header fields of a received packet that its ICRC covers and its addresses and
/// ports do not give: what the sender put in the identification and the don't-fragment flag.
/// Linux rxe numbers its packets; our own senders use ID 0 with DF (`docs/softnic.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ipv4Ident {
    /// The identification field.
    pub ident: u16,
    /// The don't-fragment flag.
    pub dont_frag: bool,
}

/// One packet in a batch; its buffer is allocated once and reused.
#[derive(Debug)]
pub(crate) struct PacketBuf {
    /// Peer address: destination for sends, source for receives.
    pub peer: IpAddr,
    /// UDP source port (ours for sends, the peer's for receives).
    pub src_port: u16,
    /// Received over IPv4 with the header seen: its identification and DF flag. `None` where
    /// no header was seen (the in-memory fabric, IPv6, sends): the ICRC check then rebuilds
    /// the header as rxe and our senders write it (ID 0, DF).
    pub ipv4: Option<Ipv4Ident>,
    /// Bytes used in `data`.
    pub len: usize,
    /// The UDP payload (BTH .. ICRC), `MAX_PACKET` bytes of capacity.
    pub data: Box<[u8]>,
}

impl PacketBuf {
    fn new() -> PacketBuf {
        PacketBuf {
            peer: IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            src_port: 0,
            ipv4: None,
            len: 0,
            data: vec![0u8; MAX_PACKET].into_boxed_slice(),
        }
    }

    /// The bytes in use.
    pub fn bytes(&self) -> &[u8] {
        &self.data[..self.len]
    }
}

/// A fixed set of reusable packet buffers, filled from the front.
#[derive(Debug)]
pub(crate) struct Batch {
    pub slots: Vec<PacketBuf>,
    pub count: usize,
}

impl Batch {
    pub fn new(capacity: usize) -> Batch {
        Batch {
            slots: (0..capacity).map(|_| PacketBuf::new()).collect(),
            count: 0,
        }
    }

    pub fn is_full(&self) -> bool {
        self.count == self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The next free slot; the caller fills it and then calls `commit`. None when full.
    pub fn next_slot(&mut self) -> Option<&mut PacketBuf> {
        self.slots.get_mut(self.count)
    }

    pub fn commit(&mut self) {
        self.count += 1;
    }

    pub fn filled(&self) -> &[PacketBuf] {
        &self.slots[..self.count]
    }

    pub fn clear(&mut self) {
        self.count = 0;
    }
}

/// Link state of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortState {
    /// Carrier up: traffic flows.
    Active,
    /// Carrier down or administratively down: nothing is sent or received.
    Down,
}
