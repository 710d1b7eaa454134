//! The third channel (`docs/failover.md` 5f): a connection end's control messages over the
//! management network, which depends on neither RDMA device.
//!
//! One [`ManagementPeer`] per connection end, sans-IO: it turns the machine's messages into
//! datagrams, and datagrams from the network into messages, acknowledgments and datagrams to
//! send back; the caller owns the socket and the clock. Each end draws a random connection id
//! and a random 32-byte key and hands both to the peer in the rendezvous; a datagram is for
//! the end whose id it names and is sealed with that end's key, so that a stranger on the
//! management network, who has neither, cannot forge one, and the sequence numbers make a
//! copy of an old one (a replay, or a retransmission whose acknowledgment was lost) a
//! duplicate that is dropped and counted.
//!
//! A datagram (big-endian, 88 bytes):
//!
//! ```text
//!  0       4     5      6       8                 16                24                 56          88
//!  +-------+-----+------+-------+-----------------+-----------------+------------------+-----------+
//!  | "RSMG"| ver | kind | 0   0 | receiver's id   | sequence number | control message  | HMAC (32) |
//!  +-------+-----+------+-------+-----------------+-----------------+------------------+-----------+
//! ```
//!
//! - kind 1, a message: its number (the first is 1) and the 32 bytes of the control ring's
//!   format ([`ControlRepr`], its destination QPN the receiver's default QPN);
//! - kind 2, an acknowledgment: the highest number delivered in order; the message field zero.
//!
//! The MAC is HMAC-SHA256 over `"railshift management v1\0"` and the 56 bytes before it.
//! Messages are delivered in order, once: a message is taken only if it is the next one; the
//! sender resends every unacknowledged one, in order, until the acknowledgment comes.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::service::mailbox::DeadlineBoard;
use crate::failover::{
    ControlMessage, ControlPacket, ControlRepr, Event, Timestamp, CONTROL_MESSAGE_LEN,
};
use crate::resilient::channel::ChannelOwner;
use crate::resilient::rendezvous::ManagementEndpoint;

/// The length of a management datagram.
pub(crate) const DATAGRAM_LEN: usize = 88;
/// The length of a connection end's key.
pub(crate) const KEY_LEN: usize = 32;

const MAGIC: u32 = 0x5253_4d47; // "RSMG"
const VERSION: u8 = 1;
const KIND_MESSAGE: u8 = 1;
const KIND_ACK: u8 = 2;
const SEALED: usize = 56;
const DOMAIN: &[u8] = b"railshift management v1\0";

/// How long an unacknowledged message waits before it is sent again: the management network
/// is a LAN, and a message there is rare (a failback's two, a repair's three).
pub(crate) const RESEND_AFTER: Duration = Duration::from_millis(10);

mod field {
    use core::ops::Range;
    pub const MAGIC: Range<usize> = 0..4;
    pub const VERSION: usize = 4;
    pub const KIND: usize = 5;
    pub const RESERVED: Range<usize> = 6..8;
    pub const RECEIVER: Range<usize> = 8..16;
    pub const SEQUENCE: Range<usize> = 16..24;
    pub const MESSAGE: Range<usize> = 24..56;
    pub const MAC: Range<usize> = 56..88;
}

/// One end's identity on the management network: what it publishes for the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EndIdentity {
    /// Names the end in every datagram for it.
    pub id: u64,
    /// Seals every datagram for it.
    pub key: [u8; KEY_LEN],
}

/// What the management network dropped at one end, by reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ManagementDrops {
    /// Datagrams that were not sealed with this end's key (a wrong MAC, a wrong id, a
    /// malformed datagram or message): forged, altered, or for another connection.
    pub forged: u64,
    /// Sealed messages already delivered (a replay, or a resend whose acknowledgment was
    /// lost), or ahead of the next one (an earlier one lost: it comes again first).
    pub out_of_sequence: u64,
}

/// What one received datagram brings.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Received {
    /// The message to hand the machine, if it was the next one.
    pub message: Option<ControlMessage>,
    /// The acknowledgment to send back, for a sealed message (new or not).
    pub reply: Option<[u8; DATAGRAM_LEN]>,
}

/// One connection end's side of the management channel.
#[derive(Debug)]
pub(crate) struct ManagementPeer {
    local: EndIdentity,
    peer: EndIdentity,
    /// The peer's default QPN, the destination of every message to it.
    peer_default_qpn: u32,
    /// This end's default QPN, what every message for it must name.
    local_default_qpn: u32,
    /// The number the next message sent gets.
    next_send: u64,
    /// Sent and not acknowledged, oldest first: (number, message).
    unacked: VecDeque<(u64, ControlMessage)>,
    /// When the unacknowledged messages were last sent.
    sent_at: Option<Timestamp>,
    /// The highest number delivered in order.
    delivered: u64,
    drops: ManagementDrops,
}

impl ManagementPeer {
    /// The channel between `local` (whose default QP is `local_default_qpn`) and `peer`.
    pub(crate) fn new(
        local: EndIdentity,
        local_default_qpn: u32,
        peer: EndIdentity,
        peer_default_qpn: u32,
    ) -> ManagementPeer {
        ManagementPeer {
            local,
            peer,
            peer_default_qpn,
            local_default_qpn,
            next_send: 1,
            unacked: VecDeque::new(),
            sent_at: None,
            delivered: 0,
            drops: ManagementDrops::default(),
        }
    }

    /// What was dropped so far.
    pub(crate) fn drops(&self) -> ManagementDrops {
        self.drops
    }

    /// Queues `message` and returns its datagram, to send now.
    pub(crate) fn send(&mut self, message: ControlMessage, now: Timestamp) -> [u8; DATAGRAM_LEN] {
        let number = self.next_send;
        self.next_send += 1;
        self.unacked.push_back((number, message));
        if self.unacked.len() == 1 {
            self.sent_at = Some(now);
        }
        self.message_datagram(number, message)
    }

    /// When the unacknowledged messages are due to be sent again, if any are.
    pub(crate) fn resend_due(&self) -> Option<Timestamp> {
        self.sent_at
            .filter(|_| !self.unacked.is_empty())
            .map(|at| at + RESEND_AFTER)
    }

    /// The unacknowledged messages' datagrams, oldest first, if they are due at `now`.
    pub(crate) fn resend(&mut self, now: Timestamp, out: &mut Vec<[u8; DATAGRAM_LEN]>) {
        if self.resend_due().is_none_or(|due| now < due) {
            return;
        }
        self.sent_at = Some(now);
        let datagrams: Vec<_> = self
            .unacked
            .iter()
            .map(|&(number, message)| self.message_datagram(number, message))
            .collect();
        out.extend(datagrams);
    }

    /// Takes one datagram from the network (untrusted bytes).
    pub(crate) fn receive(&mut self, bytes: &[u8]) -> Received {
        let Some((kind, number, message)) = self.open(bytes) else {
            self.drops.forged += 1;
            return Received::default();
        };
        match kind {
            KIND_ACK => {
                if number >= self.next_send {
                    // Sealed with our key but acknowledging what was never sent: not the
                    // peer's doing.
                    self.drops.forged += 1;
                } else {
                    self.unacked.retain(|&(n, _)| n > number);
                }
                Received::default()
            }
            _ => {
                let message = if number == self.delivered + 1 {
                    self.delivered = number;
                    message
                } else {
                    self.drops.out_of_sequence += 1;
                    None
                };
                Received {
                    message,
                    reply: Some(self.ack_datagram()),
                }
            }
        }
    }

    /// Checks a datagram for this end: (kind, number, message for kind 1).
    fn open(&self, bytes: &[u8]) -> Option<(u8, u64, Option<ControlMessage>)> {
        if bytes.len() != DATAGRAM_LEN
            || bytes[field::MAGIC] != MAGIC.to_be_bytes()
            || bytes[field::VERSION] != VERSION
            || bytes[field::RESERVED] != [0, 0]
            || bytes[field::RECEIVER] != self.local.id.to_be_bytes()
        {
            return None;
        }
        let mut mac = mac(&self.local.key);
        mac.update(&bytes[..SEALED]);
        mac.verify_slice(&bytes[field::MAC]).ok()?;
        let number = u64::from_be_bytes(bytes[field::SEQUENCE].try_into().ok()?);
        match bytes[field::KIND] {
            KIND_ACK if bytes[field::MESSAGE].iter().all(|&b| b == 0) => {
                Some((KIND_ACK, number, None))
            }
            KIND_MESSAGE if number > 0 => {
                let packet = ControlPacket::new_checked(&bytes[field::MESSAGE]).ok()?;
                let repr = ControlRepr::parse(&packet).ok()?;
                (repr.dest_qpn == self.local_default_qpn).then_some((
                    KIND_MESSAGE,
                    number,
                    Some(repr.message),
                ))
            }
            _ => None,
        }
    }

    fn message_datagram(&self, number: u64, message: ControlMessage) -> [u8; DATAGRAM_LEN] {
        let mut body = [0u8; CONTROL_MESSAGE_LEN];
        if let Ok(mut packet) = ControlPacket::new_checked(&mut body[..]) {
            ControlRepr {
                dest_qpn: self.peer_default_qpn,
                message,
            }
            .emit(&mut packet);
        }
        self.seal(KIND_MESSAGE, number, &body)
    }

    fn ack_datagram(&self) -> [u8; DATAGRAM_LEN] {
        self.seal(KIND_ACK, self.delivered, &[0u8; CONTROL_MESSAGE_LEN])
    }

    /// A datagram for the peer, sealed with its key.
    fn seal(&self, kind: u8, number: u64, body: &[u8; CONTROL_MESSAGE_LEN]) -> [u8; DATAGRAM_LEN] {
        let mut out = [0u8; DATAGRAM_LEN];
        out[field::MAGIC].copy_from_slice(&MAGIC.to_be_bytes());
        out[field::VERSION] = VERSION;
        out[field::KIND] = kind;
        out[field::RECEIVER].copy_from_slice(&self.peer.id.to_be_bytes());
        out[field::SEQUENCE].copy_from_slice(&number.to_be_bytes());
        out[field::MESSAGE].copy_from_slice(body);
        let mut mac = mac(&self.peer.key);
        mac.update(&out[..SEALED]);
        out[field::MAC].copy_from_slice(&mac.finalize().into_bytes());
        out
    }
}

fn mac(key: &[u8; KEY_LEN]) -> Hmac<Sha256> {
    let mut mac =
        <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(DOMAIN);
    mac
}

/// A random connection-end identity: 8 bytes of id and 32 of key from the kernel's generator.
pub(crate) fn random_identity() -> io::Result<EndIdentity> {
    let mut bytes = [0u8; 8 + KEY_LEN];
    let mut filled = 0;
    while filled < bytes.len() {
        // SAFETY: writes at most the remaining length into a live buffer.
        let n = unsafe {
            libc::getrandom(bytes[filled..].as_mut_ptr().cast(), bytes.len() - filled, 0)
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        filled += n as usize;
    }
    let mut key = [0u8; KEY_LEN];
    key.copy_from_slice(&bytes[8..]);
    Ok(EndIdentity {
        id: u64::from_be_bytes(bytes[..8].try_into().expect("8 bytes")),
        key,
    })
}

/// A service's UDP socket on one management address: every connection end of the service
/// with that address takes its datagrams here, told apart by the id each datagram names.
pub(crate) struct ManagementSocket {
    socket: UdpSocket,
    links: Mutex<HashMap<u64, Weak<ManagementLink>>>,
    /// The earliest resend due on any end: a round walks the ends only once it has come, so
    /// that an idle round's cost does not grow with the connections (1,000 ends walked every
    /// round cost a run-to-completion lcore 24 us a round, `service_round --management`).
    resends: DeadlineBoard,
    /// Datagrams naming no connection end of this socket (forged, or for an end gone).
    unknown: std::sync::atomic::AtomicU64,
}

impl ManagementSocket {
    /// A non-blocking socket on `addr`, any port.
    pub(crate) fn bind(addr: IpAddr) -> io::Result<ManagementSocket> {
        let socket = UdpSocket::bind(SocketAddr::new(addr, 0))?;
        socket.set_nonblocking(true)?;
        Ok(ManagementSocket {
            socket,
            links: Mutex::new(HashMap::new()),
            resends: DeadlineBoard::new(),
            unknown: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// The address the socket is bound to.
    pub(crate) fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    /// The descriptor the service thread sleeps on.
    pub(crate) fn fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }

    /// A new connection end on this socket, with a random identity; its endpoint goes to the
    /// peer in the rendezvous.
    pub(crate) fn open_link(self: &Arc<Self>) -> io::Result<Arc<ManagementLink>> {
        let local = random_identity()?;
        let link = Arc::new(ManagementLink {
            socket: self.clone(),
            local,
            owner: OnceLock::new(),
            peer: Mutex::new(None),
        });
        self.links
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(local.id, Arc::downgrade(&link));
        Ok(link)
    }

    /// Datagrams that named no end of this socket, so far.
    #[cfg(test)]
    pub(crate) fn unknown(&self) -> u64 {
        self.unknown.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// One service round: takes what arrived (each message to its end's owner, each
    /// acknowledgment sent back) and sends again what is due; returns when the next resend
    /// is due.
    pub(crate) fn poll(&self, now: Timestamp) -> Option<Timestamp> {
        let mut buf = [0u8; DATAGRAM_LEN + 1];
        loop {
            let (len, from) = match self.socket.recv_from(&mut buf) {
                Ok(got) => got,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // ICMP errors of an earlier send surface here; nothing to take.
                    tracing::debug!(error = %e, "failover: management socket receive");
                    break;
                }
            };
            let bytes = &buf[..len];
            let link = (len == DATAGRAM_LEN)
                .then(|| u64::from_be_bytes(bytes[field::RECEIVER].try_into().expect("8 bytes")))
                .and_then(|id| {
                    self.links
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get(&id)
                        .and_then(Weak::upgrade)
                });
            let Some(link) = link else {
                self.unknown
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::debug!(%from, len, "failover: a management datagram for no connection end; dropped");
                continue;
            };
            link.receive(bytes);
        }
        if self.resends.earliest().is_none_or(|due| now < due) {
            return self.resends.earliest();
        }
        // Cleared before the walk reads the ends' deadlines: a send during the walk lowers
        // the board after the clear, so no resend is forgotten.
        self.resends.clear();
        let links: Vec<Arc<ManagementLink>> = {
            let map = self.links.lock().unwrap_or_else(|p| p.into_inner());
            map.values().filter_map(Weak::upgrade).collect()
        };
        for link in &links {
            if let Some(due) = link.resend(now) {
                self.resends.lower_to(due.as_nanos());
            }
        }
        self.resends.earliest()
    }

    fn send_to(&self, datagram: &[u8], to: SocketAddr) {
        if let Err(e) = self.socket.send_to(datagram, to) {
            // Resent until acknowledged: a send that fails now is tried again.
            tracing::debug!(%to, error = %e, "failover: management datagram not sent");
        }
    }
}

/// One connection end on a [`ManagementSocket`].
pub(crate) struct ManagementLink {
    socket: Arc<ManagementSocket>,
    local: EndIdentity,
    /// The QP the messages go to, once it is known.
    owner: OnceLock<Weak<dyn ChannelOwner>>,
    /// The channel, once the peer's endpoint is known, and where the peer is.
    peer: Mutex<Option<(ManagementPeer, SocketAddr)>>,
}

impl ManagementLink {
    /// What the peer needs to reach this end.
    pub(crate) fn endpoint(&self) -> io::Result<ManagementEndpoint> {
        Ok(ManagementEndpoint {
            addr: self.socket.socket.local_addr()?,
            id: self.local.id,
            key: self.local.key,
        })
    }

    /// Names the QP the messages go to.
    pub(crate) fn set_owner<O: ChannelOwner + 'static>(&self, owner: &Arc<O>) {
        let owner: Weak<O> = Arc::downgrade(owner);
        let owner: Weak<dyn ChannelOwner> = owner;
        let _ = self.owner.set(owner);
    }

    /// Connects to the peer's endpoint; `local_qpn` and `peer_qpn` are the two ends' default
    /// QPNs, which every message names.
    pub(crate) fn connect(&self, peer: &ManagementEndpoint, local_qpn: u32, peer_qpn: u32) {
        let channel = ManagementPeer::new(
            self.local,
            local_qpn,
            EndIdentity {
                id: peer.id,
                key: peer.key,
            },
            peer_qpn,
        );
        *self.peer.lock().unwrap_or_else(|p| p.into_inner()) = Some((channel, peer.addr));
    }

    /// Sends `message` to the peer (resent by the service until acknowledged).
    pub(crate) fn send(&self, message: ControlMessage, now: Timestamp) -> Result<(), &'static str> {
        let mut peer = self.peer.lock().unwrap_or_else(|p| p.into_inner());
        let Some((channel, to)) = peer.as_mut() else {
            return Err("the peer published no management endpoint");
        };
        let datagram = channel.send(message, now);
        if let Some(due) = channel.resend_due() {
            self.socket.resends.lower_to(due.as_nanos());
        }
        self.socket.send_to(&datagram, *to);
        Ok(())
    }

    /// What was dropped so far.
    pub(crate) fn drops(&self) -> ManagementDrops {
        self.peer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|(channel, _)| channel.drops())
            .unwrap_or_default()
    }

    fn receive(&self, bytes: &[u8]) {
        let (received, to) = {
            let mut peer = self.peer.lock().unwrap_or_else(|p| p.into_inner());
            let Some((channel, to)) = peer.as_mut() else {
                return;
            };
            (channel.receive(bytes), *to)
        };
        if let Some(reply) = received.reply {
            self.socket.send_to(&reply, to);
        }
        if let Some(message) = received.message {
            match self.owner.get().and_then(Weak::upgrade) {
                Some(owner) => owner.post_event(Event::Management(message)),
                None => tracing::debug!(?message, "failover: a management message for a QP gone"),
            }
        }
    }

    fn resend(&self, now: Timestamp) -> Option<Timestamp> {
        let mut again = Vec::new();
        let (due, to) = {
            let mut peer = self.peer.lock().unwrap_or_else(|p| p.into_inner());
            let (channel, to) = peer.as_mut()?;
            channel.resend(now, &mut again);
            (channel.resend_due(), *to)
        };
        for datagram in &again {
            self.socket.send_to(datagram, to);
        }
        due
    }
}

impl Drop for ManagementLink {
    fn drop(&mut self) {
        self.socket
            .links
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.local.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failover::{Epoch, SideEpoch};

    fn identity(seed: u8) -> EndIdentity {
        EndIdentity {
            id: 0x1000 + u64::from(seed),
            key: [seed; KEY_LEN],
        }
    }

    /// Host A (default QPN 0x11) and host B (default QPN 0x22).
    fn pair() -> (ManagementPeer, ManagementPeer) {
        let (a, b) = (identity(1), identity(2));
        (
            ManagementPeer::new(a, 0x11, b, 0x22),
            ManagementPeer::new(b, 0x22, a, 0x11),
        )
    }

    fn at(millis: u64) -> Timestamp {
        Timestamp::from_nanos(millis * 1_000_000)
    }

    const READY: ControlMessage = ControlMessage::FailbackReady { epoch: Epoch(3) };

    #[test]
    fn a_message_is_delivered_once_and_acknowledged() {
        let (mut a, mut b) = pair();
        let datagram = a.send(READY, at(0));
        let got = b.receive(&datagram);
        assert_eq!(got.message, Some(READY));
        assert_eq!(a.resend_due(), Some(at(0) + RESEND_AFTER));
        assert_eq!(
            a.receive(&got.reply.expect("an acknowledgment")),
            Received::default()
        );
        assert_eq!(a.resend_due(), None, "acknowledged: nothing to resend");
        assert_eq!(a.drops(), ManagementDrops::default());
        assert_eq!(b.drops(), ManagementDrops::default());
    }

    #[test]
    fn an_unacknowledged_message_is_sent_again_in_order_and_delivered_once() {
        let (mut a, mut b) = pair();
        let rearm = ControlMessage::SideRearm {
            epoch: SideEpoch::new(crate::failover::Side::DefaultChannel, 1),
        };
        let first = a.send(rearm, at(0));
        let _lost = a.send(READY, at(1));
        let mut again = Vec::new();
        a.resend(at(5), &mut again);
        assert!(again.is_empty(), "not due yet");
        a.resend(at(10), &mut again);
        assert_eq!(again.len(), 2);
        // The first copy of the first came; its resend is a duplicate.
        assert_eq!(b.receive(&first).message, Some(rearm));
        assert_eq!(b.receive(&again[0]).message, None);
        assert_eq!(b.receive(&again[1]).message, Some(READY));
        assert_eq!(b.drops().out_of_sequence, 1);
    }

    #[test]
    fn a_message_ahead_of_a_lost_one_waits_for_it() {
        let (mut a, mut b) = pair();
        let lost = a.send(READY, at(0));
        let second = a.send(READY, at(0));
        assert_eq!(b.receive(&second).message, None);
        assert_eq!(b.receive(&lost).message, Some(READY));
        assert_eq!(b.receive(&second).message, Some(READY));
    }

    #[test]
    fn a_replayed_message_is_dropped_and_counted() {
        let (mut a, mut b) = pair();
        let datagram = a.send(READY, at(0));
        assert_eq!(b.receive(&datagram).message, Some(READY));
        for _ in 0..3 {
            let replay = b.receive(&datagram);
            assert_eq!(replay.message, None);
        }
        assert_eq!(b.drops().out_of_sequence, 3);
        assert_eq!(b.drops().forged, 0);
    }

    #[test]
    fn forged_altered_or_misdirected_datagrams_are_dropped_and_counted() {
        let (mut a, mut b) = pair();
        let genuine = a.send(READY, at(0));
        // A stranger who knows the format and B's id but not B's key.
        let mut stranger = ManagementPeer::new(
            identity(9),
            0x11,
            EndIdentity {
                key: [7; KEY_LEN],
                ..identity(2)
            },
            0x22,
        );
        let forged = stranger.send(READY, at(0));
        let mut altered = genuine;
        altered[field::MESSAGE.start + 8] ^= 1;
        let mut renumbered = genuine;
        renumbered[field::SEQUENCE.end - 1] = 9;
        // Sealed for A, not for B.
        let misdirected = b.send(READY, at(0));
        let mut c = ManagementPeer::new(identity(2), 0x22, identity(1), 0x11);
        for bytes in [
            &forged[..],
            &altered,
            &renumbered,
            &genuine[..40],
            &[0u8; DATAGRAM_LEN],
        ] {
            assert_eq!(b.receive(bytes), Received::default(), "{bytes:?}");
        }
        assert_eq!(c.receive(&misdirected), Received::default());
        assert_eq!(b.drops().forged, 5);
        assert_eq!(c.drops().forged, 1);
        // The genuine one still gets through.
        assert_eq!(b.receive(&genuine).message, Some(READY));
    }

    #[test]
    fn an_acknowledgment_of_what_was_never_sent_is_dropped() {
        let (mut a, mut b) = pair();
        let datagram = a.send(READY, at(0));
        let _ = b.receive(&datagram);
        let _ = b.send(READY, at(0));
        // B acknowledges 1 to A after delivering A's first; A has sent one: fine. A
        // hand-made acknowledgment of message 5, sealed with A's key, is not.
        let ack = b.seal(KIND_ACK, 5, &[0u8; CONTROL_MESSAGE_LEN]);
        assert_eq!(a.receive(&ack), Received::default());
        assert_eq!(a.drops().forged, 1);
        assert_eq!(a.resend_due(), Some(at(0) + RESEND_AFTER));
    }

    struct Inbox(Mutex<Vec<Event>>);

    impl ChannelOwner for Inbox {
        fn post_event(&self, event: Event) {
            self.0.lock().unwrap().push(event);
        }
    }

    /// A socket and a link on each end on loopback, each link connected to the other's (ids
    /// 0x11 and 0x22), what reaches B's link going to the inbox.
    #[allow(clippy::type_complexity)]
    fn loopback_pair() -> (
        Arc<ManagementSocket>,
        Arc<ManagementSocket>,
        Arc<ManagementLink>,
        Arc<ManagementLink>,
        Arc<Inbox>,
    ) {
        let localhost: IpAddr = "127.0.0.1".parse().unwrap();
        let (sa, sb) = (
            Arc::new(ManagementSocket::bind(localhost).unwrap()),
            Arc::new(ManagementSocket::bind(localhost).unwrap()),
        );
        let (a, b) = (sa.open_link().unwrap(), sb.open_link().unwrap());
        let inbox = Arc::new(Inbox(Mutex::new(Vec::new())));
        b.set_owner(&inbox);
        a.connect(&b.endpoint().unwrap(), 0x11, 0x22);
        b.connect(&a.endpoint().unwrap(), 0x22, 0x11);
        (sa, sb, a, b, inbox)
    }

    #[test]
    fn two_ends_on_loopback_sockets_exchange_a_message_and_a_stranger_is_dropped() {
        let (sa, sb, a, b, inbox) = loopback_pair();
        a.send(READY, at(0)).unwrap();
        // A stranger's datagram naming B's id, sealed with a key of its own.
        let stranger = UdpSocket::bind(("127.0.0.1", 0)).unwrap();
        let mut forged = ManagementPeer::new(
            identity(9),
            0x11,
            EndIdentity {
                id: b.endpoint().unwrap().id,
                key: [7; KEY_LEN],
            },
            0x22,
        );
        stranger
            .send_to(&forged.send(READY, at(0)), b.endpoint().unwrap().addr)
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while (inbox.0.lock().unwrap().is_empty() || b.drops().forged == 0)
            && std::time::Instant::now() < deadline
        {
            sb.poll(at(1));
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(*inbox.0.lock().unwrap(), [Event::Management(READY)]);
        assert_eq!(b.drops().forged, 1);
        // B's acknowledgment reaches A: nothing left to resend.
        while a
            .peer
            .lock()
            .unwrap()
            .as_ref()
            .unwrap()
            .0
            .resend_due()
            .is_some()
            && std::time::Instant::now() < deadline
        {
            sa.poll(at(1));
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(sa.poll(at(100)), None);
        assert_eq!(sa.unknown() + sb.unknown(), 0);
    }

    #[test]
    fn an_end_that_fails_tells_its_peer_over_loopback_sockets_and_the_peer_ends_at_once() {
        use crate::failover::{
            Action, Config, FailReason, Failover, Path, Progress, Role, WcStatus,
        };
        let (_sa, sb, a, _b, inbox) = loopback_pair();
        let managed = |role| Config {
            management: true,
            ..Config::new(role)
        };
        let (mut leader, mut follower) = (
            Failover::new(managed(Role::Leader), at(0)),
            Failover::new(managed(Role::Follower), at(0)),
        );
        // The leader's default pair fails and its round's `Failover` never gets an answer
        // (the follower's side of the backup path is gone, and with it its channel).
        leader.handle(
            Event::ErrorCompletion {
                path: Path::Default,
                status: WcStatus::RetryExcErr,
            },
            at(10),
        );
        leader.handle(
            Event::DefaultDrained {
                progress: Progress::default(),
                first_error: None,
                atomic_in_flight: false,
                sends_before_first_read: None,
            },
            at(10),
        );
        let deadline = leader.poll_timeout().expect("the round waits for the peer");
        let mut sent = 0;
        for action in leader.handle(Event::Tick, deadline) {
            // What the driver does with the management network's actions.
            if let Action::SendManagement { message } = action {
                a.send(message, deadline).unwrap();
                sent += 1;
            }
        }
        assert_eq!(leader.failed(), Some(FailReason::HandshakeTimeout));
        assert_eq!(sent, 1, "the Abort goes over the management network");
        let wait = std::time::Instant::now() + Duration::from_secs(5);
        while inbox.0.lock().unwrap().is_empty() && std::time::Instant::now() < wait {
            sb.poll(at(1));
            std::thread::sleep(Duration::from_millis(1));
        }
        let events = std::mem::take(&mut *inbox.0.lock().unwrap());
        assert_eq!(
            events,
            [Event::Management(ControlMessage::Abort {
                reason: FailReason::HandshakeTimeout
            })]
        );
        // The follower ends at once, as a plain RC peer told of the failure would.
        for event in events {
            follower.handle(event, at(20));
        }
        assert_eq!(follower.failed(), Some(FailReason::PeerAborted));
    }

    #[test]
    fn a_socket_resends_an_unacknowledged_message_when_due_and_says_when_the_next_is() {
        let localhost: IpAddr = "127.0.0.1".parse().unwrap();
        let sa = Arc::new(ManagementSocket::bind(localhost).unwrap());
        // The peer is a plain socket that never acknowledges: every datagram A sends to it is
        // counted there.
        let peer = UdpSocket::bind((localhost, 0)).unwrap();
        peer.set_nonblocking(true).unwrap();
        let received = || {
            let mut buf = [0u8; DATAGRAM_LEN + 1];
            let mut n = 0;
            let wait = std::time::Instant::now() + Duration::from_millis(200);
            while std::time::Instant::now() < wait {
                match peer.recv_from(&mut buf) {
                    Ok(_) => n += 1,
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
            n
        };
        let endpoint = |seed| ManagementEndpoint {
            addr: peer.local_addr().unwrap(),
            id: identity(seed).id,
            key: identity(seed).key,
        };
        // Two ends; many idle ones beside them, which a round must not need to walk.
        let idle: Vec<_> = (0..64).map(|_| sa.open_link().unwrap()).collect();
        let (first, second) = (sa.open_link().unwrap(), sa.open_link().unwrap());
        first.connect(&endpoint(1), 0x11, 0x22);
        second.connect(&endpoint(2), 0x12, 0x23);
        assert_eq!(sa.poll(at(0)), None, "nothing sent: nothing due");
        first.send(READY, at(0)).unwrap();
        second.send(READY, at(3)).unwrap();
        assert_eq!(received(), 2);
        assert_eq!(sa.poll(at(1)), Some(at(0) + RESEND_AFTER));
        assert_eq!(received(), 0, "not due yet");
        // The first end's resend is due; the second's comes 3 ms later.
        let due = at(0) + RESEND_AFTER;
        assert_eq!(sa.poll(due), Some(at(3) + RESEND_AFTER));
        assert_eq!(received(), 1);
        assert_eq!(sa.poll(at(3) + RESEND_AFTER), Some(due + RESEND_AFTER));
        assert_eq!(received(), 1);
        drop(idle);
    }
}
