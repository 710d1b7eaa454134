//! An in-memory network for tests: ports with IP addresses, a latency, and seeded fault rules.
//!
//! Deterministic: one ChaCha generator seeded by the test decides every fault, in the order
//! packets are sent, and time comes from the devices' clock (virtual in simulations). With
//! manual progress on one thread the same seed replays the same run, packet for packet.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::clock::Clock;
use crate::waker::Waker;
use crate::wire::{Batch, PortState};

/// What a fault rule does to the packets it matches.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// Drop each matching packet with this probability.
    Drop(f64),
    /// Deliver each matching packet twice with this probability.
    Duplicate(f64),
    /// With this probability hold a packet back by a random extra delay up to `max_delay`, so
    /// packets sent after it overtake it.
    Reorder {
        /// Chance per packet.
        probability: f64,
        /// Upper bound of the extra delay.
        max_delay: Duration,
    },
    /// Add a fixed delay to every matching packet.
    Delay(Duration),
    /// The link into the receiving port carries `bytes_per_sec` and queues up to `queue_bytes`
    /// (a drop-tail switch port, or a veth's backlog): each matching packet waits for those
    /// queued before it and for its own serialization, and one that finds the queue full is
    /// dropped. The queue is the receiving port's, shared by every rule of this kind that
    /// matches a packet to it (give one rule per port, or one for every port).
    Bottleneck {
        /// The link's rate.
        bytes_per_sec: u64,
        /// Bytes the queue holds (a packet finding more queued than this less its length is
        /// dropped).
        queue_bytes: u64,
    },
    /// Flip one random byte of each matching packet with this probability (the ICRC or the UDP
    /// checksum catches it on receipt).
    Corrupt(f64),
    /// Drop every matching packet (combine with `from`/`to` and a window for a partition).
    Partition,
    /// The port's link is down during the rule's window: nothing leaves or arrives, and the
    /// device sees port-error then port-active events.
    LinkDown {
        /// Port index.
        port: usize,
    },
    /// During the rule's window the port's link is *reported* to its device's driver (port
    /// events, the queried port state) as `up` or down, whatever it physically is: a report
    /// that comes late (a kernel that says RUNNING hundreds of ms after the link is back, a
    /// down noticed late) or is wrong (a blip reported that never happened, a dead link
    /// reported up). Packets follow the physical state (`LinkDown`) alone. Of several
    /// active report rules of one port, the one added last decides.
    LinkReport {
        /// Port index.
        port: usize,
        /// What is reported.
        up: bool,
    },
}

impl Fault {
    /// The port a link rule (physical or reported) is about.
    fn link_port(&self) -> Option<usize> {
        match *self {
            Fault::LinkDown { port } | Fault::LinkReport { port, .. } => Some(port),
            _ => None,
        }
    }

    /// Whether the rule changes a port's link state (its edges are moments a simulation
    /// must stop at).
    fn is_link_rule(&self) -> bool {
        self.link_port().is_some()
    }
}

/// A fault, the packets it applies to, and when.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultRule {
    /// What happens.
    pub fault: Fault,
    /// Only packets sent from this port (None: any).
    pub from: Option<usize>,
    /// Only packets sent to this port (None: any).
    pub to: Option<usize>,
    /// Active from this time (inclusive).
    pub start: Duration,
    /// Active until this time (exclusive); None: forever.
    pub end: Option<Duration>,
}

impl FaultRule {
    /// A rule for every packet, active forever.
    pub fn always(fault: Fault) -> FaultRule {
        FaultRule {
            fault,
            from: None,
            to: None,
            start: Duration::ZERO,
            end: None,
        }
    }

    /// Port `port`'s link is down from `down_at` until `up_at` (None: stays down).
    pub fn link_down(port: usize, down_at: Duration, up_at: Option<Duration>) -> FaultRule {
        FaultRule {
            fault: Fault::LinkDown { port },
            from: None,
            to: None,
            start: down_at,
            end: up_at,
        }
    }

    /// Port `port`'s link is reported `up` (or down) from `from` until `until` (None: for
    /// good), whatever it physically is ([`Fault::LinkReport`]).
    pub fn link_report(
        port: usize,
        up: bool,
        from: Duration,
        until: Option<Duration>,
    ) -> FaultRule {
        FaultRule {
            fault: Fault::LinkReport { port, up },
            from: None,
            to: None,
            start: from,
            end: until,
        }
    }

    /// No packet between ports `a` and `b` (either way) during the window.
    pub fn partition(a: usize, b: usize, start: Duration, end: Option<Duration>) -> [FaultRule; 2] {
        [
            FaultRule {
                fault: Fault::Partition,
                from: Some(a),
                to: Some(b),
                start,
                end,
            },
            FaultRule {
                fault: Fault::Partition,
                from: Some(b),
                to: Some(a),
                start,
                end,
            },
        ]
    }

    fn active(&self, now: Duration) -> bool {
        now >= self.start && self.end.is_none_or(|e| now < e)
    }

    fn matches(&self, from: usize, to: usize, now: Duration) -> bool {
        self.active(now) && self.from.is_none_or(|f| f == from) && self.to.is_none_or(|t| t == to)
    }
}

/// What the fabric did, for tests to check that faults really happened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FabricStats {
    /// Packets handed to the fabric.
    pub sent: u64,
    /// Packets put in an inbox (duplicates count twice).
    pub delivered: u64,
    /// Dropped by a `Drop` rule.
    pub dropped: u64,
    /// Extra copies made by a `Duplicate` rule.
    pub duplicated: u64,
    /// Held back by a `Reorder` rule.
    pub reordered: u64,
    /// Bytes flipped by a `Corrupt` rule.
    pub corrupted: u64,
    /// Dropped by a partition, a down link, or an address nobody has.
    pub blackholed: u64,
    /// Dropped by a full `Bottleneck` queue.
    pub overrun: u64,
}

struct InFlight {
    from_addr: IpAddr,
    src_port: u16,
    data: Vec<u8>,
}

struct PortSlot {
    addr: IpAddr,
    admin_up: bool,
    /// (arrival time, sequence number for FIFO among equal times), index into `flights`.
    inbox: BinaryHeap<Reverse<(Duration, u64, usize)>>,
    waker: Option<Arc<Waker>>,
    /// When the `Bottleneck` link into this port has sent what is queued on it.
    link_busy_until: Duration,
}

struct FabricInner {
    rng: ChaCha8Rng,
    latency: Duration,
    ports: Vec<PortSlot>,
    rules: Vec<FaultRule>,
    flights: Vec<Option<InFlight>>,
    free_flights: Vec<usize>,
    pool: Vec<Vec<u8>>,
    seq: u64,
    stats: FabricStats,
}

/// An in-memory network. Clones share it.
#[derive(Clone)]
pub struct Fabric {
    inner: Arc<Mutex<FabricInner>>,
    /// The epoch of the fabric's real time base: packets are queued for "now + latency" on
    /// the sender's clock and taken when due on the receiver's, so every device on one fabric
    /// must count from the same instant (a device opened 30 ms after its peer would otherwise
    /// see each packet due 30 ms late).
    epoch: Instant,
}

impl std::fmt::Debug for Fabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Fabric")
    }
}

impl Fabric {
    /// A fabric whose faults are drawn from `seed`, with one-way latency `latency`.
    pub fn new(seed: u64, latency: Duration) -> Fabric {
        Fabric {
            inner: Arc::new(Mutex::new(FabricInner {
                rng: ChaCha8Rng::seed_from_u64(seed),
                latency,
                ports: Vec::new(),
                rules: Vec::new(),
                flights: Vec::new(),
                free_flights: Vec::new(),
                pool: Vec::new(),
                seq: 0,
                stats: FabricStats::default(),
            })),
            epoch: Instant::now(),
        }
    }

    /// The fabric's real time base (its epoch is the fabric's creation): the clock every
    /// device on this fabric reads unless a simulation gives them a virtual one.
    pub fn clock(&self) -> Clock {
        Clock::Real(self.epoch)
    }

    fn lock(&self) -> MutexGuard<'_, FabricInner> {
        // A panic elsewhere while holding the lock leaves plain data; keep going.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a port with this address; returns its index.
    pub fn add_port(&self, addr: IpAddr) -> usize {
        let mut f = self.lock();
        f.ports.push(PortSlot {
            addr,
            admin_up: true,
            inbox: BinaryHeap::new(),
            waker: None,
            link_busy_until: Duration::ZERO,
        });
        f.ports.len() - 1
    }

    /// The address of port `port`.
    pub fn port_addr(&self, port: usize) -> Option<IpAddr> {
        self.lock().ports.get(port).map(|p| p.addr)
    }

    /// Adds a fault rule.
    pub fn add_rule(&self, rule: FaultRule) {
        self.lock().rules.push(rule);
    }

    /// Removes every fault rule.
    pub fn clear_rules(&self) {
        self.lock().rules.clear();
    }

    /// Sets a port's link administratively up or down (as `ip link set`), now.
    pub fn set_link(&self, port: usize, up: bool) {
        let waker = {
            let mut f = self.lock();
            match f.ports.get_mut(port) {
                Some(p) => {
                    p.admin_up = up;
                    p.waker.clone()
                }
                None => None,
            }
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// What the fabric has done so far.
    pub fn stats(&self) -> FabricStats {
        self.lock().stats
    }

    /// The port's link state at `now`.
    pub fn port_state(&self, port: usize, now: Duration) -> PortState {
        self.lock().state(port, now)
    }

    /// The earliest future moment at which something changes: a delayed packet arrives or a
    /// link rule starts or ends. Simulations advance a virtual clock to it when all is idle.
    pub fn next_event(&self, now: Duration) -> Option<Duration> {
        let f = self.lock();
        let arrivals = f
            .ports
            .iter()
            .filter_map(|p| p.inbox.peek().map(|Reverse((t, _, _))| *t));
        let links = f
            .rules
            .iter()
            .filter(|r| r.fault.is_link_rule())
            .flat_map(|r| [Some(r.start), r.end])
            .flatten();
        arrivals.chain(links).filter(|&t| t > now).min()
    }

    /// A wire end for a device.
    pub fn port(&self, port: usize) -> Option<FabricPort> {
        let addr = self.port_addr(port)?;
        Some(FabricPort {
            fabric: self.clone(),
            port,
            addr,
            wake: Vec::new(),
        })
    }

    /// Puts raw bytes on the fabric as if port `from` had sent them from UDP port `src_port`
    /// to `to` (fault rules apply). For tests that feed devices hostile input. Returns whether
    /// the packet was queued for delivery.
    pub fn inject(
        &self,
        from: usize,
        to: IpAddr,
        src_port: u16,
        bytes: &[u8],
        now: Duration,
    ) -> bool {
        let waker = {
            let mut f = self.lock();
            if from >= f.ports.len() {
                return false;
            }
            match f.transmit(from, to, src_port, bytes, now) {
                Some(port) => f.ports[port].waker.clone(),
                None => return false,
            }
        };
        if let Some(w) = waker {
            w.wake();
        }
        true
    }

    /// Looks a port up by address.
    pub fn port_by_addr(&self, addr: IpAddr) -> Option<usize> {
        self.lock().ports.iter().position(|p| p.addr == addr)
    }
}

impl FabricInner {
    fn state(&self, port: usize, now: Duration) -> PortState {
        let Some(p) = self.ports.get(port) else {
            return PortState::Down;
        };
        let link_rule_down = self
            .rules
            .iter()
            .any(|r| r.fault == Fault::LinkDown { port } && r.active(now));
        if p.admin_up && !link_rule_down {
            PortState::Active
        } else {
            PortState::Down
        }
    }

    /// The link state port `port`'s device reports: a [`Fault::LinkReport`] rule's word
    /// while one is active, the physical state otherwise.
    fn reported_state(&self, port: usize, now: Duration) -> PortState {
        let report = self.rules.iter().rev().find_map(|r| match r.fault {
            Fault::LinkReport { port: p, up } if p == port && r.active(now) => Some(up),
            _ => None,
        });
        match report {
            Some(true) => PortState::Active,
            Some(false) => PortState::Down,
            None => self.state(port, now),
        }
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.rng.random::<f64>() < p
    }

    fn take_buffer(&mut self, bytes: &[u8]) -> Vec<u8> {
        let mut v = self.pool.pop().unwrap_or_default();
        v.clear();
        v.extend_from_slice(bytes);
        v
    }

    fn enqueue(&mut self, to: usize, at: Duration, flight: InFlight) {
        let idx = match self.free_flights.pop() {
            Some(i) => {
                self.flights[i] = Some(flight);
                i
            }
            None => {
                self.flights.push(Some(flight));
                self.flights.len() - 1
            }
        };
        self.seq += 1;
        let seq = self.seq;
        self.ports[to].inbox.push(Reverse((at, seq, idx)));
        self.stats.delivered += 1;
    }

    /// Applies the rules to one packet from `from` and queues what survives.
    fn transmit(
        &mut self,
        from: usize,
        to_addr: IpAddr,
        src_port: u16,
        bytes: &[u8],
        now: Duration,
    ) -> Option<usize> {
        self.stats.sent += 1;
        let from_addr = self.ports[from].addr;
        let Some(to) = self.ports.iter().position(|p| p.addr == to_addr) else {
            self.stats.blackholed += 1;
            return None;
        };
        if self.state(from, now) == PortState::Down || self.state(to, now) == PortState::Down {
            self.stats.blackholed += 1;
            return None;
        }
        let mut delay = self.latency;
        let mut copies = 1;
        let mut corrupt = false;
        // Rules are evaluated in the order they were added; each draw comes from the one seeded
        // generator, so the same sends see the same faults.
        for i in 0..self.rules.len() {
            if !self.rules[i].matches(from, to, now) {
                continue;
            }
            match self.rules[i].fault.clone() {
                Fault::Drop(p) => {
                    if self.chance(p) {
                        self.stats.dropped += 1;
                        return None;
                    }
                }
                Fault::Partition => {
                    self.stats.blackholed += 1;
                    return None;
                }
                Fault::Duplicate(p) => {
                    if self.chance(p) {
                        copies += 1;
                        self.stats.duplicated += 1;
                    }
                }
                Fault::Reorder {
                    probability,
                    max_delay,
                } => {
                    if self.chance(probability) {
                        let extra = self.rng.random_range(0..=max_delay.as_nanos() as u64);
                        delay += Duration::from_nanos(extra);
                        self.stats.reordered += 1;
                    }
                }
                Fault::Delay(d) => delay += d,
                Fault::Bottleneck {
                    bytes_per_sec,
                    queue_bytes,
                } => {
                    let link = &mut self.ports[to].link_busy_until;
                    let start = (*link).max(now);
                    let queued = bytes_in(start - now, bytes_per_sec);
                    if queued + bytes.len() as u64 > queue_bytes {
                        self.stats.overrun += 1;
                        return None;
                    }
                    *link = start + time_for(bytes.len() as u64, bytes_per_sec);
                    delay += *link - now;
                }
                Fault::Corrupt(p) => {
                    if self.chance(p) {
                        corrupt = true;
                    }
                }
                Fault::LinkDown { .. } | Fault::LinkReport { .. } => {}
            }
        }
        for copy in 0..copies {
            let mut data = self.take_buffer(bytes);
            if corrupt && copy == 0 && !data.is_empty() {
                let i = self.rng.random_range(0..data.len());
                let bit = 1u8 << self.rng.random_range(0..8);
                data[i] ^= bit;
                self.stats.corrupted += 1;
            }
            // A duplicate trails the original by a little, as a retransmitting switch would.
            let at = now + delay + Duration::from_nanos(copy as u64 * 500);
            self.enqueue(
                to,
                at,
                InFlight {
                    from_addr,
                    src_port,
                    data,
                },
            );
        }
        Some(to)
    }
}

/// Bytes a link of `bytes_per_sec` sends in `t`.
fn bytes_in(t: Duration, bytes_per_sec: u64) -> u64 {
    (t.as_nanos() * u128::from(bytes_per_sec) / 1_000_000_000) as u64
}

/// How long a link of `bytes_per_sec` (at least 1) takes to send `bytes`.
fn time_for(bytes: u64, bytes_per_sec: u64) -> Duration {
    let nanos = u128::from(bytes) * 1_000_000_000 / u128::from(bytes_per_sec.max(1));
    Duration::from_nanos(nanos.min(u128::from(u64::MAX)) as u64)
}

/// One device's end of the fabric.
pub struct FabricPort {
    fabric: Fabric,
    port: usize,
    addr: IpAddr,
    /// Receivers to wake after a send, reused.
    wake: Vec<Arc<Waker>>,
}

impl std::fmt::Debug for FabricPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FabricPort({}, {})", self.port, self.addr)
    }
}

impl FabricPort {
    /// This port's address.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// This port's index.
    pub fn index(&self) -> usize {
        self.port
    }

    pub(crate) fn attach_waker(&mut self, waker: Arc<Waker>) {
        let mut f = self.fabric.lock();
        if let Some(p) = f.ports.get_mut(self.port) {
            p.waker = Some(waker);
        }
    }

    pub(crate) fn state(&self, now: Duration) -> PortState {
        self.fabric.lock().state(self.port, now)
    }

    /// The link state this port's device reports ([`Fault::LinkReport`]).
    pub(crate) fn reported_state(&self, now: Duration) -> PortState {
        self.fabric.lock().reported_state(self.port, now)
    }

    pub(crate) fn next_event(&self, now: Duration) -> Option<Duration> {
        let f = self.fabric.lock();
        let arrival = f
            .ports
            .get(self.port)
            .and_then(|p| p.inbox.peek().map(|Reverse((t, _, _))| *t));
        // Link rules for this port change its state at their edges; the engine must look then.
        let edges = f
            .rules
            .iter()
            .filter(|r| r.fault.link_port() == Some(self.port))
            .flat_map(|r| [Some(r.start), r.end])
            .flatten()
            .filter(|&t| t > now);
        arrival.into_iter().chain(edges).min()
    }

    /// Sends a batch under one lock; wakes the receivers once each.
    pub(crate) fn send(&mut self, batch: &Batch, now: Duration) -> usize {
        let mut wake = std::mem::take(&mut self.wake);
        let mut sent = 0;
        {
            let mut f = self.fabric.lock();
            for pkt in batch.filled() {
                if let Some(to) = f.transmit(self.port, pkt.peer, pkt.src_port, pkt.bytes(), now) {
                    sent += 1;
                    if let Some(w) = &f.ports[to].waker {
                        if !wake.iter().any(|x| Arc::ptr_eq(x, w)) {
                            wake.push(w.clone());
                        }
                    }
                }
            }
        }
        for w in wake.drain(..) {
            w.wake();
        }
        self.wake = wake;
        sent
    }

    /// Takes every packet that has arrived by `now`, up to the batch's capacity.
    pub(crate) fn recv(&mut self, batch: &mut Batch, now: Duration) -> usize {
        let mut f = self.fabric.lock();
        let f = &mut *f;
        if f.state(self.port, now) == PortState::Down {
            // A down link loses what was on it.
            while let Some(Reverse((_, _, idx))) = f.ports[self.port].inbox.pop() {
                if let Some(fl) = f.flights[idx].take() {
                    f.pool.push(fl.data);
                }
                f.free_flights.push(idx);
                f.stats.blackholed += 1;
            }
            return 0;
        }
        while !batch.is_full() {
            let Some(&Reverse((at, _, idx))) = f.ports[self.port].inbox.peek() else {
                break;
            };
            if at > now {
                break;
            }
            f.ports[self.port].inbox.pop();
            let Some(fl) = f.flights[idx].take() else {
                continue;
            };
            f.free_flights.push(idx);
            let slot = batch.next_slot().expect("batch not full");
            let n = fl.data.len().min(slot.data.len());
            slot.data[..n].copy_from_slice(&fl.data[..n]);
            slot.len = n;
            slot.peer = fl.from_addr;
            slot.src_port = fl.src_port;
            slot.ipv4 = None;
            batch.commit();
            f.pool.push(fl.data);
        }
        batch.count
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn two_ports(seed: u64) -> (Fabric, FabricPort, FabricPort) {
        let fabric = Fabric::new(seed, Duration::from_micros(1));
        let a = fabric.add_port(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)));
        let b = fabric.add_port(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2)));
        let pa = fabric.port(a).unwrap();
        let pb = fabric.port(b).unwrap();
        (fabric, pa, pb)
    }

    fn send_n(from: &mut FabricPort, to: IpAddr, n: usize, now: Duration) {
        let mut batch = Batch::new(n);
        for i in 0..n {
            let s = batch.next_slot().unwrap();
            s.peer = to;
            s.src_port = 0xc000;
            s.data[..4].copy_from_slice(&(i as u32).to_be_bytes());
            s.len = 4;
            batch.commit();
        }
        from.send(&batch, now);
    }

    fn received(port: &mut FabricPort, now: Duration) -> Vec<u32> {
        let mut batch = Batch::new(256);
        port.recv(&mut batch, now);
        batch
            .filled()
            .iter()
            .map(|p| u32::from_be_bytes(p.data[..4].try_into().unwrap()))
            .collect()
    }

    #[test]
    fn packets_arrive_after_the_latency_in_order() {
        let (_f, mut a, mut b) = two_ports(1);
        send_n(&mut a, b.addr(), 10, Duration::ZERO);
        assert!(received(&mut b, Duration::from_nanos(999)).is_empty());
        assert_eq!(
            received(&mut b, Duration::from_micros(1)),
            (0..10).collect::<Vec<_>>()
        );
    }

    #[test]
    fn the_same_seed_gives_the_same_faults() {
        let run = |seed| {
            let (f, mut a, mut b) = two_ports(seed);
            f.add_rule(FaultRule::always(Fault::Drop(0.3)));
            f.add_rule(FaultRule::always(Fault::Reorder {
                probability: 0.3,
                max_delay: Duration::from_micros(5),
            }));
            send_n(&mut a, b.addr(), 200, Duration::ZERO);
            received(&mut b, Duration::from_millis(1))
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn a_link_down_window_blackholes_traffic_and_reports_the_port_down() {
        let (f, mut a, mut b) = two_ports(1);
        f.add_rule(FaultRule::link_down(
            1,
            Duration::from_millis(1),
            Some(Duration::from_millis(2)),
        ));
        assert_eq!(b.state(Duration::ZERO), PortState::Active);
        assert_eq!(b.state(Duration::from_millis(1)), PortState::Down);
        send_n(&mut a, b.addr(), 3, Duration::from_millis(1));
        assert!(received(&mut b, Duration::from_millis(3)).is_empty());
        assert_eq!(b.state(Duration::from_millis(2)), PortState::Active);
        assert_eq!(f.stats().blackholed, 3);
    }

    #[test]
    fn corruption_flips_exactly_one_bit() {
        let (f, mut a, mut b) = two_ports(3);
        f.add_rule(FaultRule::always(Fault::Corrupt(1.0)));
        send_n(&mut a, b.addr(), 1, Duration::ZERO);
        let got = received(&mut b, Duration::from_millis(1));
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].count_ones(), 1);
    }

    #[test]
    fn a_bottleneck_paces_packets_and_drops_what_overflows_its_queue() {
        let (f, mut a, mut b) = two_ports(1);
        // 4-byte packets, 4,000 bytes/s: one packet per millisecond, a queue of three.
        f.add_rule(FaultRule::always(Fault::Bottleneck {
            bytes_per_sec: 4_000,
            queue_bytes: 12,
        }));
        send_n(&mut a, b.addr(), 5, Duration::ZERO);
        assert_eq!(f.stats().overrun, 2);
        let ms = Duration::from_millis;
        let us = Duration::from_micros;
        assert_eq!(received(&mut b, ms(1)), Vec::<u32>::new());
        assert_eq!(received(&mut b, ms(1) + us(1)), vec![0]);
        assert_eq!(received(&mut b, ms(3) + us(1)), vec![1, 2]);
        // The queue drained: the link takes packets again, paced from now.
        send_n(&mut a, b.addr(), 1, ms(10));
        assert_eq!(received(&mut b, ms(11) + us(1)), vec![0]);
        assert_eq!(f.stats().overrun, 2);
    }

    #[test]
    fn duplicates_arrive_twice() {
        let (f, mut a, mut b) = two_ports(3);
        f.add_rule(FaultRule::always(Fault::Duplicate(1.0)));
        send_n(&mut a, b.addr(), 2, Duration::ZERO);
        assert_eq!(received(&mut b, Duration::from_millis(1)).len(), 4);
    }
}
