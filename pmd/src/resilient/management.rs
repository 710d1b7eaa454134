//! The third channel (`docs/failover.md` 5f): a connection end's control messages over the
//! management network, which depends on neither RDMA device.
//!
//! A service's UDP socket per management address ([`ManagementSocket`]) carries the
//! [`Stream`]s of every connection end on it ([`ManagementLink`]), each record to the end its
//! receiver id names. A message goes at once, one record to a datagram; what a service round
//! sends (acknowledgments of what arrived, resends that came due) is packed, every record
//! for the same peer socket in as few datagrams as fit ([`UDP_RECORDS`] each).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use super::deadline::DeadlineBoard;
use super::stream::{
    pack, random_identity, receiver_of, records, EndIdentity, Record, Stream, StreamDrops,
    MAX_RECORDS, RECORD_LEN, UDP_RECORDS,
};
use crate::failover::{ControlMessage, Event, Timestamp};
use crate::resilient::channel::ChannelOwner;
use crate::resilient::rendezvous::ManagementEndpoint;

/// A service's UDP socket on one management address: every connection end of the service
/// with that address takes its datagrams here, told apart by the id each datagram names.
pub(crate) struct ManagementSocket {
    socket: UdpSocket,
    links: Mutex<HashMap<u64, Weak<ManagementLink>>>,
    /// The earliest resend due on any end: a round walks the ends only once it has come, so
    /// that an idle round's cost does not grow with the connections (1,000 ends walked every
    /// round cost a run-to-completion lcore 24 us a round, `service_round --management`).
    resends: DeadlineBoard,
    /// Datagrams that are not whole records, and records naming no connection end of this
    /// socket (forged, or for an end gone).
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

    /// Datagrams and records that named no end of this socket, so far.
    #[cfg(test)]
    pub(crate) fn unknown(&self) -> u64 {
        self.unknown.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// One service round: takes what arrived (each message to its end's owner, each
    /// acknowledgment sent back) and sends again what is due; returns when the next resend
    /// is due.
    pub(crate) fn poll(&self, now: Timestamp) -> Option<Timestamp> {
        let mut buf = [0u8; MAX_RECORDS * RECORD_LEN + 1];
        // Acknowledgments of what arrives, sent packed once the socket is drained.
        let mut out: Vec<(SocketAddr, Record)> = Vec::new();
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
            let Some(taken) = records(&buf[..len]) else {
                self.unknown
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::debug!(%from, len, "failover: a management datagram that is not whole records; dropped");
                continue;
            };
            for record in taken {
                let link = self
                    .links
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&receiver_of(record))
                    .and_then(Weak::upgrade);
                let Some(link) = link else {
                    self.unknown
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::debug!(%from, "failover: a management record for no connection end; dropped");
                    continue;
                };
                link.receive(record, &mut out);
            }
        }
        self.send_packed(&mut out);
        let earliest = self.resends.earliest();
        if earliest.is_none_or(|due| now < due) {
            return earliest;
        }
        // Cleared before the walk reads the ends' deadlines: a send during the walk lowers
        // the board after the clear, so no resend is forgotten.
        self.resends.clear();
        let links: Vec<Arc<ManagementLink>> = {
            let map = self.links.lock().unwrap_or_else(|p| p.into_inner());
            map.values().filter_map(Weak::upgrade).collect()
        };
        for link in &links {
            if let Some(due) = link.resend(now, &mut out) {
                self.resends.lower_to(due.as_nanos());
            }
        }
        self.send_packed(&mut out);
        self.resends.earliest()
    }

    /// Sends `out`'s records, every record for the same address in as few datagrams as
    /// [`UDP_RECORDS`] allow, each end's in the order it gave them; empties `out`.
    fn send_packed(&self, out: &mut Vec<(SocketAddr, Record)>) {
        // Stable: one end's records keep their order (the receiver takes them in sequence).
        out.sort_by_key(|(to, _)| *to);
        let mut rest = &out[..];
        let mut batch: Vec<Record> = Vec::new();
        while let Some(&(to, _)) = rest.first() {
            let same = rest.iter().take_while(|(t, _)| *t == to).count();
            batch.clear();
            batch.extend(rest[..same].iter().map(|(_, r)| *r));
            for datagram in pack(&batch, UDP_RECORDS) {
                self.send_to(&datagram, to);
            }
            rest = &rest[same..];
        }
        out.clear();
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
    peer: Mutex<Option<(Stream, SocketAddr)>>,
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
        let channel = Stream::new(
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
        let record = channel.send(message, now);
        if let Some(due) = channel.resend_due() {
            self.socket.resends.lower_to(due.as_nanos());
        }
        // At once and alone: a message waits for no round.
        self.socket.send_to(&record, *to);
        Ok(())
    }

    /// What was dropped so far.
    pub(crate) fn drops(&self) -> StreamDrops {
        self.peer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|(channel, _)| channel.drops())
            .unwrap_or_default()
    }

    /// Takes one record for this end; its acknowledgment goes to `out`.
    fn receive(&self, bytes: &[u8], out: &mut Vec<(SocketAddr, Record)>) {
        let (received, to) = {
            let mut peer = self.peer.lock().unwrap_or_else(|p| p.into_inner());
            let Some((channel, to)) = peer.as_mut() else {
                return;
            };
            (channel.receive(bytes), *to)
        };
        if let Some(reply) = received.reply {
            out.push((to, reply));
        }
        if let Some(message) = received.message {
            match self.owner.get().and_then(Weak::upgrade) {
                Some(owner) => owner.post_event(Event::Management(message)),
                None => tracing::debug!(?message, "failover: a management message for a QP gone"),
            }
        }
    }

    /// Queues in `out` what is due to be sent again; returns when the next resend is due.
    fn resend(&self, now: Timestamp, out: &mut Vec<(SocketAddr, Record)>) -> Option<Timestamp> {
        let mut again = Vec::new();
        let (due, to) = {
            let mut peer = self.peer.lock().unwrap_or_else(|p| p.into_inner());
            let (channel, to) = peer.as_mut()?;
            channel.resend(now, &mut again);
            (channel.resend_due(), *to)
        };
        out.extend(again.into_iter().map(|record| (to, record)));
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
    use crate::resilient::stream::tests::{at, identity, READY};
    use crate::resilient::stream::{KEY_LEN, RESEND_AFTER};
    use std::time::Duration;
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
        let mut forged = Stream::new(
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

    /// A plain UDP socket on loopback that takes datagrams and never answers.
    fn silent_peer() -> UdpSocket {
        let peer = UdpSocket::bind(("127.0.0.1", 0)).unwrap();
        peer.set_nonblocking(true).unwrap();
        peer
    }

    /// The datagrams that reach `peer` within 200 ms.
    fn datagrams_at(peer: &UdpSocket) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        let mut buf = [0u8; MAX_RECORDS * RECORD_LEN + 1];
        let wait = std::time::Instant::now() + Duration::from_millis(200);
        while std::time::Instant::now() < wait {
            match peer.recv_from(&mut buf) {
                Ok((len, _)) => got.push(buf[..len].to_vec()),
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
        got
    }

    #[test]
    fn a_socket_resends_an_unacknowledged_message_when_due_and_says_when_the_next_is() {
        let localhost: IpAddr = "127.0.0.1".parse().unwrap();
        let sa = Arc::new(ManagementSocket::bind(localhost).unwrap());
        // The peer is a plain socket that never acknowledges: every datagram A sends to it is
        // counted there.
        let peer = silent_peer();
        let received = || datagrams_at(&peer).len();
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

    #[test]
    fn resends_of_many_ends_to_one_peer_go_packed_and_each_end_s_in_order() {
        let localhost: IpAddr = "127.0.0.1".parse().unwrap();
        let sa = Arc::new(ManagementSocket::bind(localhost).unwrap());
        let peer = silent_peer();
        let ends: Vec<_> = (0..20u8)
            .map(|seed| {
                let end = sa.open_link().unwrap();
                let id = identity(seed);
                let to = ManagementEndpoint {
                    addr: peer.local_addr().unwrap(),
                    id: id.id,
                    key: id.key,
                };
                end.connect(&to, 0x11, 0x22);
                end
            })
            .collect();
        // Two messages each: 40 datagrams of one record, sent at once.
        for end in &ends {
            end.send(READY, at(0)).unwrap();
            end.send(READY, at(0)).unwrap();
        }
        let drain = || datagrams_at(&peer);
        assert_eq!(drain().len(), 40);
        // Nobody acknowledged: the 40 resends go in datagrams of at most 16 records.
        sa.poll(at(0) + RESEND_AFTER);
        let datagrams = drain();
        let sizes: Vec<usize> = datagrams.iter().map(|d| d.len() / RECORD_LEN).collect();
        assert_eq!(sizes, [16, 16, 8]);
        // Each end's two records in order: its first message's number before its second's.
        let mut seen: HashMap<u64, Vec<u64>> = HashMap::new();
        for d in &datagrams {
            for r in records(d).unwrap() {
                let number = u64::from_be_bytes(r[16..24].try_into().unwrap());
                seen.entry(receiver_of(r)).or_default().push(number);
            }
        }
        assert_eq!(seen.len(), 20);
        assert!(seen.values().all(|n| n == &[1, 2]), "{seen:?}");
    }
}
