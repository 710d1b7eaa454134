//! One round of device work, and the engine thread that runs rounds in auto mode (with what it
//! shares with the device object).
//!
//! A round: read the port state, take doorbells, receive and process packet batches, fire
//! timers, let each QP's requester send, flush the transmit batch. The device lock is taken once
//! per round, never per packet, and between rounds the engine gives way to a control call
//! waiting for it ([`CoreLock`]). In auto mode an idle engine sleeps in `epoll_wait` on its
//! socket, link monitor and doorbell eventfd, with the nearest timer as the timeout.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::clock::Clock;
use crate::codec::{self, psn_delta, ParseError};
use crate::completer;
use crate::counters::Counters;
use crate::cq::Cq;
use crate::events::{AsyncEvent, EventQueue};
use crate::medium::WireImpl;
use crate::mr::MrTable;
use crate::packet::Kind;
use crate::path_budget::PathBudgets;
use crate::qp::{ErrorCtx, Qp};
use crate::qp_attr::{QpState, QpType};
use crate::requester;
use crate::responder;
use crate::trace::Trace;
use crate::tx::{Tx, BATCH};
use crate::ud;
use crate::waker::Waker;
use crate::wire::{Batch, PacketBuf, PortState, ROCE_PORT};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

/// Receive batches per round at most, so the requester gets its turn.
const RX_BATCHES_PER_ROUND: usize = 4;
/// Packets one QP's requester may send per pass at most, for fairness between QPs.
const REQ_BUDGET: usize = 2 * BATCH;
/// READ response packets (and atomic ACKs) one QP's responder may send per pass at most, for
/// the same fairness: a long READ is answered over many rounds, the device lock released
/// between them.
const ANSWER_BUDGET: usize = 2 * BATCH;
/// Packets the QPs of one pass share: each of `n` QPs may send `PASS_BUDGET / n`, between
/// [`MIN_TURN`] and the per-QP budgets above, and a pass stops giving turns once this many
/// packets went out; the QPs it did not reach go first in the next. With many busy QPs a pass
/// would otherwise send every QP's full budget (256 QPs: 32,768 packets) before the engine
/// reads its wire again, and a QP with one small message (a control QP, a READ request) would
/// wait behind all of them. One or two QPs keep their full budgets.
const PASS_BUDGET: usize = 4 * BATCH;
/// Packets a QP with that much to send sends in a turn at least, however many QPs share the
/// pass: one 64 KiB message at a 4 KiB MTU. Its last packet asks for an ACK (a turn's last
/// always does), so a turn of one packet costs one ACK packet per data packet: at 1,000 busy
/// QPs a pass of 256 one-packet turns sent nearly as many ACKs as requests, and the engines'
/// time went to them. A turn of 16 gets about one ACK per message, as one QP alone does.
const MIN_TURN: usize = 16;
/// How soon an engine with a QP in error looks again: what is posted to it meanwhile is
/// flushed by a round, and a posted receive rings no doorbell, so an engine with nothing else
/// to do would flush it only at its 100 ms idle wake (a failover's drain waited for that).
const ERROR_FLUSH_INTERVAL: Duration = Duration::from_millis(1);
/// Rounds in a row that may leave received packets unread before the QPs' timers fire anyway.
/// Timers wait while what arrived is unread: an engine that did not run for a while (a
/// descheduled thread on a loaded machine) finds the ACKs of hundreds of QPs waiting, reads
/// 256 a round, and would time out the QPs whose ACKs are still in its own receive queue. A
/// wire that never drains (more arrives than a round reads) fires them at most this many
/// rounds late; a packet ring of 3,840 frames is read in 15 full rounds.
const TIMER_WAIT_ROUNDS: u32 = 16;

/// The packets each of `qps` QPs may send in one pass, of at most `budget` each.
#[inline]
fn fair_share(qps: usize, budget: usize) -> usize {
    (PASS_BUDGET / qps.max(1)).clamp(MIN_TURN.min(budget), budget)
}

/// What a round did and when the device next needs attention.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Activity {
    /// Work was done (or is known to be waiting): call again without sleeping.
    pub busy: bool,
    /// The earliest timer (ACK timeout, RNR wait, a delayed fabric packet), on the device clock.
    pub next_deadline: Option<Duration>,
}

/// All protocol state of a device, behind the device lock.
pub(crate) struct Core {
    pub wire: WireImpl,
    pub local_addr: IpAddr,
    /// The port's physical link state: a port that is down sends and receives nothing.
    pub port: PortState,
    /// The link state reported to the driver (port events, [`crate::Device::port_state`]):
    /// the physical one except where a fabric's report rule makes it late or wrong.
    pub reported_port: PortState,
    pub mrs: MrTable,
    pub pds: Vec<bool>,
    pub cqs: Vec<Option<Cq>>,
    pub qps: Vec<Option<Qp>>,
    pub srqs: Vec<Option<crate::srq::SharedSrq>>,
    pub counters: Counters,
    pub retired: Counters,
    pub rx: Batch,
    pub tx: Batch,
    pub trace: Option<Trace>,
    /// The device died ([`crate::Device::kill`]): rounds do nothing.
    pub dead: bool,
    /// Until this time of the device clock, moves to RTR are refused
    /// ([`crate::Device::refuse_rtr`]).
    pub refuse_rtr_until: Option<Duration>,
    /// Until this time of the device clock, CQEs are held back and then written in order
    /// ([`crate::Device::slow_completions`]).
    pub slow_completions_until: Option<Duration>,
    /// The QPs rounds visit.
    pub active: ActiveQps,
    /// Which slot of `qps` each QPN names.
    pub qpns: QpNumbers,
    /// What the QPs may have in flight to each peer address together.
    pub paths: PathBudgets,
    /// Rounds in a row that left received packets unread (their timers waited).
    pub unread_rounds: u32,
}

/// QP numbers, drawn at random over the 24-bit space (not 0 and 1, the special QPs, nor
/// 0xffffff, the multicast QPN), so that an off-path host cannot guess a QP's number from its
/// creation order; and the slot of `Core::qps` each names.
pub(crate) struct QpNumbers {
    slots: std::collections::HashMap<u32, u32>,
    rng: ChaCha20Rng,
}

impl QpNumbers {
    /// `seed` fixes the draws (a simulation replays); None seeds from the OS's entropy.
    pub fn new(seed: Option<u64>) -> QpNumbers {
        QpNumbers {
            slots: std::collections::HashMap::new(),
            rng: match seed {
                // Not the MR table's stream: the keys and the QPNs tell nothing of each other.
                Some(seed) => ChaCha20Rng::seed_from_u64(seed ^ 0x5150_4e73_5150_4e73),
                None => ChaCha20Rng::from_os_rng(),
            },
        }
    }

    /// Draws a QPN no live QP has and gives it slot `slot`.
    pub fn allocate(&mut self, slot: u32) -> u32 {
        loop {
            let qpn = self.rng.random_range(2..0x00ff_ffff);
            if let std::collections::hash_map::Entry::Vacant(e) = self.slots.entry(qpn) {
                e.insert(slot);
                return qpn;
            }
        }
    }

    /// The slot of `qpn`, if a live QP has it.
    pub fn slot(&self, qpn: u32) -> Option<usize> {
        self.slots.get(&qpn).map(|&s| s as usize)
    }

    /// Frees `qpn` (its QP was destroyed).
    pub fn release(&mut self, qpn: u32) {
        self.slots.remove(&qpn);
    }
}

/// The QPs a round visits: those rung, those a packet came for, those with a timer, work
/// beyond their budget, an ACK to send or in error (flushing what is posted later), and those
/// the control path changed; not every QP of the device, so that 1,000 idle QPs cost a round
/// nothing (an 8-byte write's latency beside 1,000 idle QPs is that of one QP alone).
#[derive(Debug, Default)]
pub(crate) struct ActiveQps {
    /// Slots to visit in the next pass, each once (`Qp::listed`).
    list: Vec<u32>,
    /// Slots to visit before `list` in the next pass: QPs their path's budget held back, in
    /// the order it did (`crate::path_budget`), so that the room freed next goes to them first.
    first: Vec<u32>,
    /// The list being visited (kept for its allocation).
    visiting: Vec<u32>,
    /// Slots whose doorbell register was rung, taken from the waker.
    rung: Vec<u32>,
}

impl ActiveQps {
    /// Puts `qp` on the list of the next pass, unless it is there.
    pub fn mark(&mut self, qp: &mut Qp) {
        if !qp.listed {
            qp.listed = true;
            self.list.push(qp.bell.slot());
        }
    }

    /// Puts `qp` on the list of the next pass, before the QPs marked with [`ActiveQps::mark`],
    /// unless it is listed already.
    pub fn mark_first(&mut self, qp: &mut Qp) {
        if !qp.listed {
            qp.listed = true;
            self.first.push(qp.bell.slot());
        }
    }
}

/// The QP in slot `i` of `qps`, if there is one.
fn slot(qps: &mut [Option<Qp>], i: u32) -> Option<&mut Qp> {
    qps.get_mut(i as usize).and_then(Option::as_mut)
}

impl Core {
    pub fn qp_index(&self, qpn: u32) -> Option<usize> {
        self.qpns.slot(qpn)
    }

    pub fn qp_mut(&mut self, qpn: u32) -> Option<&mut Qp> {
        let i = self.qp_index(qpn)?;
        self.qps.get_mut(i)?.as_mut()
    }

    /// One round of work at time `now`: the port's state, new work, what arrived, then every
    /// QP's timers and requester.
    /// `clock` is read again when packets arrive, so that what they start (an RNR wait, an
    /// ACK timer) counts from when they were read, not from the round's start: on a loaded
    /// machine the two can be hundreds of microseconds apart (an RNR retry ~9 % early against
    /// Linux rxe, docs/interop.md).
    pub fn round(
        &mut self,
        now: Duration,
        clock: &Clock,
        waker: &Waker,
        events: &EventQueue,
    ) -> Activity {
        if self.dead {
            // No packet in or out, no completion, no timer: the wire's packets wait unread.
            return Activity::default();
        }
        let port_up = self.watch_port(now, events);
        let slow_until = self.release_slow_completions(now, events);
        let Core {
            wire,
            local_addr,
            mrs,
            cqs,
            qps,
            counters,
            rx,
            tx,
            trace,
            active,
            qpns,
            paths,
            unread_rounds,
            ..
        } = self;
        let mut round = Round {
            out: Tx {
                wire,
                batch: tx,
                local_addr: *local_addr,
                now,
                port_up,
                device: counters,
                trace,
                sent: 0,
                built: 0,
            },
            qps,
            qpns,
            active,
            paths,
            mrs,
            ectx: ErrorCtx { cqs, events },
            clock,
            busy: false,
        };
        round.send_new_work(waker);
        let drained = round.receive(rx);
        *unread_rounds = if drained { 0 } else { *unread_rounds + 1 };
        let timer = round.service_qps(drained || *unread_rounds >= TIMER_WAIT_ROUNDS);
        let mut activity = round.finish(timer);
        if let Some(until) = slow_until {
            activity.next_deadline = earliest(activity.next_deadline, until);
        }
        activity
    }

    /// Writes the CQEs held back once the slow period has passed; returns when it ends if it
    /// has not.
    fn release_slow_completions(&mut self, now: Duration, events: &EventQueue) -> Option<Duration> {
        let until = self.slow_completions_until?;
        if now < until {
            return Some(until);
        }
        self.slow_completions_until = None;
        for (i, cq) in self.cqs.iter_mut().enumerate() {
            let Some(cq) = cq else { continue };
            let was_broken = cq.broken;
            if cq.release_held().is_err() && !was_broken {
                self.counters.cq_overruns += 1;
                events.push(crate::AsyncEvent::CqError {
                    cq: crate::cq::CqId(i as u32),
                });
            }
        }
        None
    }

    /// Reads the port's link state, raising an async event when its reported state changed;
    /// returns whether the port is physically up.
    fn watch_port(&mut self, now: Duration, events: &EventQueue) -> bool {
        let state = self.wire.port_state(now);
        if state != self.port {
            self.port = state;
            tracing::info!(?state, "port state changed");
        }
        let reported = self.wire.reported_port_state(now);
        if reported != self.reported_port {
            self.reported_port = reported;
            if reported != state {
                tracing::info!(?reported, physical = ?state, "port state reported, not physical");
            }
            events.push(if reported == PortState::Active {
                AsyncEvent::PortActive
            } else {
                AsyncEvent::PortError
            });
        }
        state == PortState::Active
    }
}

/// One round in progress: the core's parts borrowed apart, so that each phase reaches the QPs
/// and the transmit batch at once.
struct Round<'a> {
    /// The round's one way out: the transmit batch, the wire, device counters, the trace.
    out: Tx<'a>,
    qps: &'a mut [Option<Qp>],
    qpns: &'a QpNumbers,
    active: &'a mut ActiveQps,
    paths: &'a mut PathBudgets,
    mrs: &'a MrTable,
    ectx: ErrorCtx<'a>,
    /// The device's clock, read again when packets arrive.
    clock: &'a Clock,
    /// Work was done (or is known to be waiting).
    busy: bool,
}

impl Round<'_> {
    /// Takes the doorbells rung since the last round; each rung QP in RTS sends now, before
    /// this round's receive: that is the latency a driver sees between its doorbell
    /// and the wire.
    fn send_new_work(&mut self, waker: &Waker) {
        if !waker.take_pending() {
            return;
        }
        waker.take_rung(&mut self.active.rung);
        let mut rung = false;
        let share = Share::of(self.active.rung.len());
        let pass_start = self.out.built;
        for k in 0..self.active.rung.len() {
            let Some(qp) = slot(self.qps, self.active.rung[k]) else {
                continue;
            };
            if !qp.bell.take_queued() {
                continue;
            }
            qp.read_send_doorbell();
            rung = true;
            self.active.mark(qp);
            // Past the pass's budget a rung QP sends in `service_qps`, where it is listed now.
            if qp.state == QpState::Rts && self.out.built - pass_start < PASS_BUDGET {
                transmit(
                    qp,
                    self.mrs,
                    &mut self.out,
                    &mut self.ectx,
                    self.paths,
                    share,
                    false,
                );
            }
        }
        self.active.rung.clear();
        if rung {
            self.busy = true;
            self.out.flush();
        }
    }

    /// Receives up to `RX_BATCHES_PER_ROUND` batches and delivers every packet. NAKs go out
    /// after each batch; READ responses, atomic ACKs and coalesced ACKs wait for
    /// `service_qps`. Returns whether it read everything that had arrived.
    fn receive(&mut self, rx: &mut Batch) -> bool {
        for _ in 0..RX_BATCHES_PER_ROUND {
            let n = self.out.wire.recv(rx, self.out.now);
            if n == 0 {
                return true;
            }
            self.out.now = self.out.now.max(self.clock.now());
            self.busy = true;
            if !self.out.port_up {
                self.out.device.port_down_drops += n as u64;
                continue;
            }
            for pkt in rx.filled() {
                self.deliver(pkt);
            }
            self.out.flush();
            if n < rx.slots.len() {
                // The wire is drained; another read would only say so.
                return true;
            }
        }
        false
    }

    /// Parses one received packet and hands it to its QP: requests to the responder,
    /// responses to the completer. Counts what it drops.
    fn deliver(&mut self, pkt: &PacketBuf) {
        let out = &mut self.out;
        if let Some(t) = out.trace.as_mut() {
            t.record(
                pkt.peer,
                pkt.src_port,
                out.local_addr,
                ROCE_PORT,
                pkt.bytes(),
                out.now,
            );
        }
        let h = match codec::parse_packet(
            pkt.bytes(),
            pkt.peer,
            pkt.src_port,
            out.local_addr,
            pkt.ipv4,
        ) {
            Ok(h) => h,
            Err(ParseError::Icrc) => {
                out.device.icrc_errors += 1;
                return;
            }
            Err(ParseError::PKey) => {
                out.device.pkey_drops += 1;
                return;
            }
            Err(ParseError::Malformed) => {
                out.device.malformed_drops += 1;
                return;
            }
        };
        let qp = self
            .qpns
            .slot(h.dest_qpn)
            .and_then(|i| self.qps.get_mut(i))
            .and_then(|q| q.as_mut());
        let Some(qp) = qp else {
            out.device.unknown_qpn_drops += 1;
            return;
        };
        if qp.qp_type == QpType::Ud {
            let from = ud::Arrival {
                src: pkt.peer,
                dst: out.local_addr,
                ipv4: pkt.ipv4,
            };
            ud::receive(qp, &h, pkt.bytes(), &from, self.mrs, &mut self.ectx);
            // Listed so that a QP the receive moved to ERR flushes what is posted later.
            self.active.mark(qp);
            return;
        }
        if h.kind == Kind::UdSend {
            // A UD SEND reaches only a UD QP: an RC QP never takes one as its own SEND.
            qp.counters.malformed_drops += 1;
            return;
        }
        if qp.attrs.dest_addr != Some(pkt.peer) {
            // Not from this QP's peer: RC accepts packets only from its path.
            qp.counters.malformed_drops += 1;
            return;
        }
        match qp.peer_port {
            Some(port) if port != pkt.src_port => {
                // The peer's address but not its port: another sender (RC's path is both).
                qp.counters.source_port_drops += 1;
                return;
            }
            Some(_) => {}
            None => {
                // The peer sends every packet of a QP from one port: learn it from the first
                // packet at a PSN this QP expects, which a forger would have to guess.
                let expected = if h.kind.is_request() {
                    h.psn == qp.resp.epsn
                } else {
                    psn_delta(h.psn, qp.req.comp_psn) >= 0 && psn_delta(h.psn, qp.req.high_psn) < 0
                };
                if expected {
                    qp.peer_port = Some(pkt.src_port);
                }
            }
        }
        qp.counters.rx_packets += 1;
        qp.counters.rx_bytes += pkt.len as u64;
        self.active.mark(qp);
        if h.kind.is_request() {
            responder::handle(qp, &h, pkt.bytes(), self.mrs, out, &mut self.ectx);
        } else {
            let now = out.now;
            completer::handle(qp, &h, pkt.bytes(), self.mrs, now, &mut self.ectx);
            qp.settle_path(self.paths);
        }
    }

    /// The round's last pass over the active QPs: fires their timers, flushes those in error
    /// (anything posted while in error is flushed, as a ConnectX does) and lets the others
    /// send. A QP stays on the list while it has a timer, work or an ACK waiting, or is in
    /// error. Returns the earliest timer left running. Without `fire_timers` (received
    /// packets wait unread, `TIMER_WAIT_ROUNDS`) no timer fires: the next round reads on.
    fn service_qps(&mut self, fire_timers: bool) -> Option<Duration> {
        let now = self.out.now;
        let mut timer = None;
        let mut visiting = std::mem::take(&mut self.active.visiting);
        if self.active.first.is_empty() {
            std::mem::swap(&mut visiting, &mut self.active.list);
        } else {
            visiting.append(&mut self.active.first);
            visiting.append(&mut self.active.list);
        }
        let share = Share::of(visiting.len());
        let pass_start = self.out.built;
        for &i in &visiting {
            let Some(qp) = slot(self.qps, i) else {
                continue;
            };
            qp.listed = false;
            qp.counters.round_visits += 1;
            if fire_timers {
                requester::check_timer(qp, now, &mut self.ectx);
                qp.settle_path(self.paths);
            }
            if qp.state == QpState::Err {
                qp.flush(&mut self.ectx);
                self.active.mark(qp);
                timer = earliest(timer, now + ERROR_FLUSH_INTERVAL);
                continue;
            }
            if self.out.built - pass_start >= PASS_BUDGET {
                // The pass has sent its share: this QP's turn (and any ACK it owes) comes
                // first in the next pass, which the engine runs without sleeping.
                self.active.mark_first(qp);
                self.busy = true;
                continue;
            }
            let more = transmit(
                qp,
                self.mrs,
                &mut self.out,
                &mut self.ectx,
                self.paths,
                share,
                true,
            );
            self.busy |= more;
            let held = qp.path.is_some_and(|p| p.waits());
            let mut waiting = more || held || qp.resp.ack_pending;
            for t in [qp.req.timer, qp.req.probe_at, qp.req.rnr_until]
                .into_iter()
                .flatten()
            {
                timer = earliest(timer, t);
                waiting = true;
            }
            if held {
                self.active.mark_first(qp);
            } else if waiting {
                self.active.mark(qp);
            }
        }
        visiting.clear();
        self.active.visiting = visiting;
        self.out.flush();
        timer
    }

    /// What the round did, and the next deadline: the earliest of `timer` and the wire's next
    /// arrival.
    fn finish(self, timer: Option<Duration>) -> Activity {
        let now = self.out.now;
        Activity {
            busy: self.busy || self.out.sent > 0,
            next_deadline: match self.out.wire.next_arrival(now) {
                Some(t) => earliest(timer, t),
                None => timer,
            },
        }
    }
}

/// Lets `qp`'s requester send up to its budget, then sends its coalesced ACK (the one place
/// that does). The ACK rides in the same sendmmsg as the requests just batched. With none, it
/// waits for the round's `last_pass`, where it waits one more round for the reply the
/// application is likely to post (a latency benchmark's answer), then goes alone. Returns
/// whether the QP has work waiting: requests beyond its share (not those its path's budget holds
/// back: they wait for ACKs, `crate::path_budget`), or a deferred ACK.
fn transmit(
    qp: &mut Qp,
    mrs: &MrTable,
    out: &mut Tx<'_>,
    ectx: &mut ErrorCtx<'_>,
    paths: &mut PathBudgets,
    share: Share,
    last_pass: bool,
) -> bool {
    let answering = responder::answer(qp, mrs, out, ectx, share.answers);
    let requests = path_allowance(qp, paths, share.requests);
    let r = match qp.qp_type {
        QpType::Ud => ud::run(qp, mrs, out, ectx, requests),
        _ => requester::run(qp, mrs, out, ectx, requests),
    };
    qp.settle_path(paths);
    let mut held = false;
    if r.more && requests < share.requests {
        if let Some(path) = qp.path.as_mut() {
            // Held back by its path's budget, not its share: the others of the path wait for
            // its turn. Not busy: it waits for ACKs, as a closed window does, and stays listed.
            paths.turned_away(path);
            held = true;
        }
    }
    let more = (r.more && !held) || answering;
    if !qp.resp.ack_pending || answering {
        // An owed ACK waits behind the responses still to send.
        return more;
    }
    if r.packets > 0 || (last_pass && qp.resp.ack_deferred) {
        qp.resp.ack_deferred = false;
        responder::flush_ack(qp, out);
        more
    } else if last_pass {
        qp.resp.ack_deferred = true;
        true
    } else {
        more
    }
}

/// The request packets `qp` may send of its `share`: no more than its path's budget has room
/// for, and none while QPs the budget turned away wait for their turn (unless it is one of
/// them), so that none starves (`crate::path_budget`). Sets whether its packets ask for ACKs.
#[inline]
fn path_allowance(qp: &mut Qp, paths: &mut PathBudgets, share: usize) -> usize {
    let Some(path) = qp.path.as_mut() else {
        return share;
    };
    let room = if paths.others_wait(path) {
        0
    } else {
        paths.room(path) as usize
    };
    qp.req.crowded = paths.crowded(path);
    paths.visited(path);
    share.min(room)
}

/// What one QP may send in a pass that visits others too: round-robin, every QP visited once
/// a pass with an equal part of [`PASS_BUDGET`].
#[derive(Clone, Copy, Debug)]
struct Share {
    /// Request packets (the requester's budget).
    requests: usize,
    /// READ response packets and atomic ACKs (the responder's budget).
    answers: usize,
}

impl Share {
    /// Each QP's part when `qps` QPs are visited.
    #[inline]
    fn of(qps: usize) -> Share {
        Share {
            requests: fair_share(qps, REQ_BUDGET),
            answers: fair_share(qps, ANSWER_BUDGET),
        }
    }
}

/// The earlier of `a` (if any) and `b`.
fn earliest(a: Option<Duration>, b: Duration) -> Option<Duration> {
    Some(a.map_or(b, |a| a.min(b)))
}

/// The device lock over the core, fair to control calls.
///
/// The engine takes the lock for a round and, busy, takes it again at once. std's mutex is not
/// fair: the engine, already running when it releases the lock, nearly always takes it again
/// before a waiter it woke gets to run, so a control call (`dereg_mr`, `modify_qp`) could wait
/// as long as the engine stayed busy (a 1 GiB READ: seconds). So a control call says that it
/// waits, and the engine, between two rounds, gives way: while one waits, it does not take the
/// lock again until one has taken it. A control call then waits for two rounds at most (the
/// one in progress, and the next if the engine looked just before the call said it waits).
/// The engine gives way to one control call per round, so calls that come one after another
/// slow it but cannot stop it.
pub(crate) struct CoreLock {
    core: Mutex<Core>,
    /// Control calls waiting for the lock (the low 32 bits), and how many took it (the high
    /// 32 bits, wrapping): both in one word, so that the engine reads them together and sees
    /// one get in even when another comes meanwhile.
    turns: AtomicU64,
}

/// One control call waiting, in `CoreLock::turns`.
const WAITING: u64 = 1;
/// One control call that took the lock, in `CoreLock::turns`.
const ENTERED: u64 = 1 << 32;

impl CoreLock {
    pub fn new(core: Core) -> CoreLock {
        CoreLock {
            core: Mutex::new(core),
            turns: AtomicU64::new(0),
        }
    }

    /// The lock for a control call (or a manual round): the engine gives way to it.
    pub fn lock(&self) -> MutexGuard<'_, Core> {
        // Relaxed throughout: `turns` orders nothing (the mutex publishes the core); it only
        // tells the engine when to hold back, and an engine that reads it late gives way one
        // round later.
        self.turns.fetch_add(WAITING, Ordering::Relaxed);
        let guard = self.lock_for_round();
        // No longer waiting, and one more in, in one step (the waiting count is at least 1).
        self.turns.fetch_add(ENTERED - WAITING, Ordering::Relaxed);
        guard
    }

    /// The lock for the engine's round.
    pub fn lock_for_round(&self) -> MutexGuard<'_, Core> {
        // The core is plain data; a panic elsewhere must not wedge the device.
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Called by the engine between rounds, without the lock: if a control call waits, returns
    /// once one has taken the lock (or none waits any more). One relaxed load when none waits.
    #[inline]
    pub fn give_way(&self) {
        let seen = self.turns.load(Ordering::Relaxed);
        if seen as u32 != 0 {
            self.wait_for_an_entry(seen);
        }
    }

    #[cold]
    fn wait_for_an_entry(&self, seen: u64) {
        // The engine does not hold the lock, so a waiting call gets it and the count of those
        // that took it moves: this ends (yielding, so that the waiter can run on this CPU).
        loop {
            std::thread::yield_now();
            let now = self.turns.load(Ordering::Relaxed);
            if now as u32 == 0 || now >> 32 != seen >> 32 {
                return;
            }
        }
    }
}

/// What the device and its engine thread share.
pub(crate) struct Shared {
    pub name: String,
    pub core: CoreLock,
    pub waker: Arc<Waker>,
    pub clock: Clock,
    pub events: Arc<EventQueue>,
    pub stop: AtomicBool,
    pub local_addr: IpAddr,
}

impl Shared {
    /// The device lock, for a control call: see [`CoreLock`].
    pub fn lock_core(&self) -> MutexGuard<'_, Core> {
        self.core.lock()
    }
}

/// The auto-mode engine thread body.
/// `error_notice_fds` are those of `fds` whose socket error only repeats the port state: read
/// when epoll reports it, or the engine would never sleep again.
pub(crate) fn run_engine(
    shared: Arc<Shared>,
    fds: Vec<std::os::fd::RawFd>,
    error_notice_fds: &[std::os::fd::RawFd],
    busy_poll: bool,
) {
    let epoll = match Epoll::new(&fds, error_notice_fds) {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(error = %e, "engine cannot create its epoll set; the device is dead");
            return;
        }
    };
    let mut idle_rounds = 0u32;
    while !shared.stop.load(Ordering::Acquire) {
        let now = shared.clock.now();
        let activity =
            shared
                .core
                .lock_for_round()
                .round(now, &shared.clock, &shared.waker, &shared.events);
        shared.core.give_way();
        if activity.busy {
            idle_rounds = 0;
            continue;
        }
        if busy_poll {
            std::hint::spin_loop();
            continue;
        }
        // A few idle rounds before sleeping catch the reply to what was just sent.
        idle_rounds += 1;
        if idle_rounds < 8 {
            std::thread::yield_now();
            continue;
        }
        if !shared.waker.prepare_sleep() {
            continue;
        }
        let timeout_ms = match (activity.next_deadline, shared.clock.is_virtual()) {
            (_, true) => 1,
            (None, false) => 100,
            (Some(t), false) => {
                let now = shared.clock.now();
                let left = t.saturating_sub(now);
                (left.as_micros().div_ceil(1000) as i32).clamp(0, 100)
            }
        };
        epoll.wait(timeout_ms);
        shared.waker.woke();
    }
}

/// A minimal epoll set.
struct Epoll {
    fd: std::os::fd::OwnedFd,
    /// Sockets whose pending error is read (and so cleared) when epoll reports it.
    error_notice_fds: Vec<std::os::fd::RawFd>,
}

impl Epoll {
    fn new(
        fds: &[std::os::fd::RawFd],
        error_notice_fds: &[std::os::fd::RawFd],
    ) -> std::io::Result<Epoll> {
        use std::os::fd::FromRawFd;
        // SAFETY: plain syscall; the fd is checked and owned.
        let raw = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
        for &f in fds {
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: f as u64,
            };
            // SAFETY: a valid epoll_event for a live fd.
            if unsafe { libc::epoll_ctl(raw, libc::EPOLL_CTL_ADD, f, &mut ev) } < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(Epoll {
            fd,
            error_notice_fds: error_notice_fds.to_vec(),
        })
    }

    fn wait(&self, timeout_ms: i32) {
        use std::os::fd::AsRawFd;
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 8];
        // SAFETY: writes at most 8 events into a live array.
        let n =
            unsafe { libc::epoll_wait(self.fd.as_raw_fd(), events.as_mut_ptr(), 8, timeout_ms) };
        for ev in events.iter().take(n.max(0) as usize) {
            let fd = ev.u64 as std::os::fd::RawFd;
            if ev.events & libc::EPOLLERR as u32 != 0 && self.error_notice_fds.contains(&fd) {
                let mut err: libc::c_int = 0;
                let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
                // SAFETY: reads the socket's error into a live c_int of the stated length;
                // reading it clears it.
                unsafe {
                    libc::getsockopt(
                        fd,
                        libc::SOL_SOCKET,
                        libc::SO_ERROR,
                        (&mut err as *mut libc::c_int).cast(),
                        &mut len,
                    )
                };
            }
        }
    }
}
