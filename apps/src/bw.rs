//! The bandwidth tools: WRITE, SEND, READ and FETCH_ADD streams with `tx_depth` work
//! requests in flight, one signaled every `cq_mod`, and the server that answers them.
//!
//! `shift_write_bw --check` is NCCL-Simple-like traffic: each iteration writes its own
//! pattern into a slot of the server's buffer (one WRITE per 64 KiB) and then a zero-length
//! WRITE_WITH_IMM whose immediate is the iteration number. The server checks the order of the
//! immediates and the slot's bytes, and hands slots back with an 8-byte inline RDMA WRITE of
//! its checked count into the client's buffer (NCCL's receiver updates the sender's head the
//! same way), so the client never overwrites a slot the server has not checked.
//!
//! `shift_send_bw --check` sends iteration `i`'s pattern as SEND `i`. The server keeps one
//! receive per slot posted, so SEND `i` must land in receive `i` and slot `i mod slots`; it
//! checks the receive's number, the length and the bytes before it posts that slot's receive
//! again, and hands receives back with the same credit word, so the client never sends into
//! a receive the server has not posted (no RNR).
//!
//! `shift_read_bw --check` reads slots whose contents change under the client: after every
//! [`CHANGE_EVERY`] READs the client posts a fenced zero-length SEND, change `j`, and the
//! server answers it by rewriting slot `j mod slots` with that slot's next generation and
//! writing `j + 1` into the client's credit word. The client expects every READ to bring the
//! generation of the changes it had sent before the READ, so a READ that executed again after
//! a later change shows as wrong bytes. It reads a slot only once every
//! change of it is acknowledged, and the fence keeps a change behind every earlier READ, as
//! plain RC needs as well (a READ whose response is lost is executed again by the responder).

use std::time::{Duration, Instant};

use pmd::{QpCaps, RecvWr, SendOp, SendWr, WcOpcode, WorkCompletion};

use crate::cli::{Options, Tool};
use crate::endpoint::{Conn, Memory};
use crate::error::AppError;
use crate::exchange::Msg;
use crate::pattern;
use crate::report::{AtomicJson, CheckJson, ResultRow, Timeline};
use crate::row::PeerRow;
use crate::session::{Idle, Length, PeerWatch, Session};

/// Largest WRITE of a `--check` iteration.
const CHUNK: usize = 64 * 1024;
/// Room at the end of the buffer for the credit word.
const CONTROL: usize = 64;
/// Buffers stay below this (slots shrink, down to two).
const MAX_BUFFER: usize = 64 << 20;
/// Receives the server keeps posted.
const RECV_DEPTH: u32 = 256;
/// A run that completes nothing for this long has lost its peer.
const STALL: Duration = Duration::from_secs(20);
/// `shift_read_bw --check`: READs between two changes of the server's buffer.
pub const CHANGE_EVERY: u64 = 8;

/// The shape of a bandwidth run, the same on both sides.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    /// Largest message.
    pub size: usize,
    /// Slots of `size` bytes in the buffer.
    pub slots: usize,
    /// WQEs per iteration.
    pub wqes_per_iter: u32,
    /// Iterations in flight at most.
    pub in_flight: u64,
    /// One signaled iteration every this many.
    pub cq_mod: u64,
    /// Receives the receiving side keeps posted per QP.
    pub recv_depth: u32,
    /// Under `--check` (WRITE, SEND): iterations the client may be ahead of the server's
    /// checked count (its credit word); 0 when the client does not wait for credits.
    pub credit_window: u64,
}

impl Layout {
    /// The layout `o` asks for.
    pub fn of(o: &Options) -> Layout {
        let size = *o.sizes.iter().max().expect("at least one size");
        let check_write = o.tool == Tool::WriteBw && o.flags.check;
        let wqes_per_iter = if check_write {
            size.div_ceil(CHUNK) as u32 + 1
        } else {
            1
        };
        let tx = o.flags.tx_depth.max(wqes_per_iter);
        let in_flight = u64::from((tx / wqes_per_iter).max(1));
        let want = (2 * in_flight as usize).max(8);
        let slots = (MAX_BUFFER / size).clamp(2, want.max(2));
        let in_flight = in_flight.min(slots as u64);
        // Every iteration is signaled under --check (its notification); otherwise -Q, or
        // perftest's 100, or less for a shallow queue. More than in flight would never signal.
        let cq_mod = if o.flags.check {
            1
        } else {
            o.flags
                .cq_mod
                .map_or((in_flight / 2).clamp(1, 100), u64::from)
                .min(in_flight)
        };
        // A checked SEND stream keeps one receive per slot posted, so a slot is reused only
        // after the server checked what its previous receive brought.
        let check_send = o.tool == Tool::SendBw && o.flags.check;
        let recv_depth = if check_send {
            RECV_DEPTH.min(slots as u32)
        } else {
            RECV_DEPTH
        };
        let credit_window = if check_write {
            slots as u64
        } else if check_send {
            u64::from(recv_depth)
        } else {
            0
        };
        Layout {
            size,
            slots,
            wqes_per_iter,
            in_flight,
            cq_mod,
            recv_depth,
            credit_window,
        }
    }

    /// Buffer length: the slots and the control words.
    pub fn buffer_len(&self) -> usize {
        self.slots * self.size + CONTROL
    }

    /// Offset of the credit word (the server's checked count, in the client's buffer).
    pub fn credit_offset(&self) -> usize {
        self.slots * self.size
    }

    /// The QP's queues.
    pub fn caps(&self, o: &Options) -> QpCaps {
        // A checked READ stream adds one change SEND every CHANGE_EVERY iterations.
        let changes = if o.tool == Tool::ReadBw && o.flags.check {
            (self.in_flight / CHANGE_EVERY) as u32 + 1
        } else {
            0
        };
        let send = (self.in_flight as u32 * self.wqes_per_iter + changes + 16).next_power_of_two();
        QpCaps {
            max_send_wr: send,
            max_recv_wr: RECV_DEPTH,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: o.inline_size.max(16),
        }
    }
}

/// What a bandwidth side reports besides its rows.
#[derive(Debug, Default)]
pub struct BwOutcome {
    /// One row per size.
    pub rows: Vec<ResultRow>,
    /// What `--check` verified.
    pub check: Option<CheckJson>,
    /// Atomic counters.
    pub atomic: Option<AtomicJson>,
    /// The error that stopped the run.
    pub error: Option<AppError>,
    /// The peer's rows from its `done`: the client's for a server, the other direction's
    /// for `-b`.
    pub peer_rows: Vec<PeerRow>,
}

/// Describes a failed completion, with the failover's account of it.
pub fn completion_error(conn: &Conn, wc: &WorkCompletion, what: &str) -> AppError {
    let detail = conn
        .events()
        .last()
        .map(|e| format!(" (failover: {} {})", e.kind.as_str(), e.cause.as_str()))
        .unwrap_or_default();
    AppError::Completion {
        status: wc.status,
        vendor: wc.vendor_err,
        what: what.to_owned(),
        detail,
    }
}

fn signed(wr: SendWr<'_>, signal: bool) -> SendWr<'_> {
    if signal {
        wr.signaled()
    } else {
        wr
    }
}

/// The receives a side keeps posted on every QP: into the slots for SENDs, zero-length for
/// `--check` notifications (WRITE_WITH_IMM).
struct Receiver {
    layout: Layout,
    into_slots: bool,
    posted: Vec<u64>,
}

impl Receiver {
    fn new(layout: Layout, into_slots: bool, qps: usize) -> Receiver {
        Receiver {
            layout,
            into_slots,
            posted: vec![0; qps],
        }
    }

    /// Posts one more receive on QP `q`.
    fn post(&mut self, s: &mut Session, q: usize) -> Result<(), AppError> {
        let k = self.posted[q];
        let slot = (k % self.layout.slots as u64) as usize;
        let wr = if self.into_slots {
            let len = self.layout.size as u32;
            RecvWr::new(k, &[s.mem.sge(slot * self.layout.size, len)])
        } else {
            RecvWr::new(k, &[])
        };
        s.conns[q].post_recv(&wr)?;
        self.posted[q] += 1;
        Ok(())
    }

    /// Fills every QP's receive queue.
    fn fill(&mut self, s: &mut Session) -> Result<(), AppError> {
        for q in 0..self.posted.len() {
            while self.posted[q] < u64::from(self.layout.recv_depth) {
                self.post(s, q)?;
            }
        }
        Ok(())
    }
}

// ---- client -----------------------------------------------------------------------------

/// Per-tool behaviour of the client loop.
struct Traffic {
    tool: Tool,
    check: bool,
    layout: Layout,
    /// Remote slots (the server's buffer).
    remote_slots: usize,
    remote_addr: u64,
    remote_rkey: u32,
    inline: u32,
    scratch: Vec<u8>,
    atomic: AtomicJson,
    /// What the counter held before the first FETCH_ADD (learnt from it when unknown).
    atomic_base: Option<u64>,
    check_json: CheckJson,
    /// `-b` with SENDs: this side receives the peer's too.
    receiver: Option<Receiver>,
    /// `shift_read_bw --check`: the changes of the server's buffer sent so far.
    changes: Changes,
}

/// The client's account of the changes a `shift_read_bw --check` server makes to its slots.
#[derive(Debug, Default)]
struct Changes {
    /// Change SENDs posted.
    sent: u64,
    /// Per remote slot: changes sent (its generation once acknowledged), and the last
    /// change's number.
    generation: Vec<u64>,
    last: Vec<Option<u64>>,
    /// Per local slot: the pattern the READ in flight into it must bring.
    expect: Vec<u64>,
    /// Change SENDs that may await the server's acknowledgement at once.
    window: u64,
}

impl Traffic {
    fn remote(&self, offset: usize) -> pmd::Remote {
        pmd::Remote {
            addr: self.remote_addr + offset as u64,
            rkey: self.remote_rkey,
        }
    }

    /// Whether iteration `i` may be posted: under `--check`, the server must have checked
    /// the slot's (or the receive's) previous iteration.
    fn may_post(&self, s: &Session, i: u64) -> bool {
        if self.tool == Tool::ReadBw && self.check {
            let acked = s.mem.read_u64(self.layout.credit_offset());
            let slot = (i % self.remote_slots as u64) as usize;
            let slot_settled = self.changes.last[slot].is_none_or(|j| acked > j);
            let changes_after = (i + 1) % CHANGE_EVERY == 0;
            return slot_settled
                && (!changes_after || self.changes.sent - acked < self.changes.window);
        }
        if self.layout.credit_window == 0 {
            return true;
        }
        let checked = s.mem.read_u64(self.layout.credit_offset());
        checked + self.layout.credit_window > i
    }

    /// Posts iteration `i` on QP `qp`.
    fn post(
        &mut self,
        s: &mut Session,
        qp: usize,
        i: u64,
        size: usize,
        signal: bool,
    ) -> Result<(), AppError> {
        let slot = (i % self.layout.slots as u64) as usize;
        let offset = slot * self.layout.size;
        let remote_slot = (i % self.remote_slots as u64) as usize * self.layout.size;
        match self.tool {
            Tool::WriteBw if self.check => {
                self.scratch.resize(size, 0);
                pattern::fill(&mut self.scratch, i);
                s.mem.write(offset, &self.scratch);
                let mut at = 0;
                while at < size {
                    let len = CHUNK.min(size - at);
                    let op = SendOp::Write {
                        remote: self.remote(remote_slot + at),
                    };
                    let wr = SendWr::new(i, op, &[s.mem.sge(offset + at, len as u32)]);
                    s.conns[qp].post_send(&wr)?;
                    at += len;
                }
                let op = SendOp::WriteImm {
                    remote: self.remote(remote_slot),
                    imm: i as u32,
                };
                s.conns[qp].post_send(&signed(SendWr::new(i, op, &[]), signal))?;
            }
            Tool::SendBw if self.check => {
                self.scratch.resize(size, 0);
                pattern::fill(&mut self.scratch, i);
                let wr = if size as u32 <= self.inline {
                    SendWr::inline(i, SendOp::Send, &self.scratch)
                } else {
                    s.mem.write(offset, &self.scratch);
                    SendWr::new(i, SendOp::Send, &[s.mem.sge(offset, size as u32)])
                };
                s.conns[qp].post_send(&signed(wr, signal))?;
            }
            Tool::WriteBw | Tool::SendBw => {
                let op = if self.tool == Tool::WriteBw {
                    SendOp::Write {
                        remote: self.remote(remote_slot),
                    }
                } else {
                    SendOp::Send
                };
                let wr = if size as u32 <= self.inline {
                    self.scratch.resize(size, 0xa5);
                    SendWr::inline(i, op, &self.scratch[..size])
                } else {
                    SendWr::new(i, op, &[s.mem.sge(offset, size as u32)])
                };
                s.conns[qp].post_send(&signed(wr, signal))?;
            }
            Tool::ReadBw => {
                let op = SendOp::Read {
                    remote: self.remote(remote_slot),
                };
                if self.check {
                    s.mem.write(offset, &vec![0u8; size]);
                    let r = remote_slot / self.layout.size;
                    let c = &mut self.changes;
                    c.expect[slot] = c.generation[r] * self.remote_slots as u64 + r as u64;
                }
                let wr = SendWr::new(i, op, &[s.mem.sge(offset, size as u32)]);
                s.conns[qp].post_send(&signed(wr, signal))?;
                if self.check && (i + 1) % CHANGE_EVERY == 0 {
                    // Fenced: the server changes the slot only after every earlier READ
                    // completed, so none of them can read the new generation.
                    let c = &mut self.changes;
                    let r = (c.sent % self.remote_slots as u64) as usize;
                    let change = SendWr::new(i, SendOp::Send, &[]).fenced();
                    s.conns[qp].post_send(&change)?;
                    c.generation[r] += 1;
                    c.last[r] = Some(c.sent);
                    c.sent += 1;
                }
            }
            Tool::AtomicBw => {
                let op = SendOp::FetchAdd {
                    remote: self.remote(0),
                    add: 1,
                };
                let wr = SendWr::new(i, op, &[s.mem.sge(slot * 8, 8)]);
                s.conns[qp].post_send(&signed(wr, signal))?;
                self.atomic.posted += 1;
            }
            other => unreachable!("{} is not a bandwidth tool", other.name()),
        }
        Ok(())
    }

    /// Iterations `from..to` completed: verify what came back.
    fn completed(&mut self, s: &Session, size: usize, from: u64, to: u64) -> Result<(), AppError> {
        match self.tool {
            Tool::ReadBw if self.check => {
                self.scratch.resize(size, 0);
                for i in from..to {
                    let slot = (i % self.layout.slots as u64) as usize;
                    s.mem.read(slot * self.layout.size, &mut self.scratch);
                    let bad = pattern::mismatches(&self.scratch, self.changes.expect[slot]);
                    self.check_json.bytes_checked += size as u64;
                    self.check_json.errors += bad;
                    if bad > 0 {
                        return Err(AppError::Check(format!(
                            "READ {i} brought {bad} wrong bytes of {size}"
                        )));
                    }
                }
            }
            Tool::AtomicBw => {
                for i in from..to {
                    let slot = (i % self.layout.slots as u64) as usize;
                    let fetched = s.mem.read_u64(slot * 8);
                    let base = *self.atomic_base.get_or_insert(fetched.wrapping_sub(i));
                    if fetched != base.wrapping_add(i) {
                        self.atomic.fetched_in_sequence = false;
                    }
                }
                self.atomic.completed = to;
            }
            _ => {}
        }
        Ok(())
    }
}

/// Runs the client side of a bandwidth tool over every size.
pub fn client(o: &Options, s: &mut Session, layout: Layout, timeline: &mut Timeline) -> BwOutcome {
    let mut out = BwOutcome::default();
    // The peer's slots and its credit word are addressed from the length it sent (a stock
    // perftest peer has no credit word).
    let control = if s.is_perftest() { 0 } else { CONTROL };
    if let Err(e) = s.peer.check_buffer(control + layout.size) {
        out.error = Some(e.into());
        return out;
    }
    let mut idle = Idle::new(o.flags.poll, &s.host);
    for c in &s.conns {
        c.set_waker(idle.unparker());
    }
    let remote_slots = ((s.peer.len as usize).saturating_sub(control) / layout.size).max(1);
    let mut t = Traffic {
        tool: o.tool,
        check: o.flags.check,
        layout,
        remote_slots,
        remote_addr: s.peer.addr,
        remote_rkey: s.peer.rkey,
        inline: o.inline_size,
        scratch: Vec::new(),
        atomic: AtomicJson {
            fetched_in_sequence: true,
            ..AtomicJson::default()
        },
        // A railshift server's counter starts at 0; a perftest server's buffer holds random
        // bytes, so its first fetched value is the base.
        atomic_base: (!s.is_perftest()).then_some(0),
        check_json: CheckJson {
            enabled: o.flags.check,
            ..CheckJson::default()
        },
        receiver: (o.flags.bidirectional && o.tool == Tool::SendBw)
            .then(|| Receiver::new(layout, true, s.conns.len())),
        changes: Changes {
            generation: vec![0; remote_slots],
            last: vec![None; remote_slots],
            expect: vec![0; layout.slots],
            // Bounded by the server's receives and by its send queue (one acknowledgement
            // WRITE per change), which holds at least the iterations in flight.
            window: (layout.in_flight / CHANGE_EVERY).clamp(1, u64::from(layout.recv_depth / 2)),
            ..Changes::default()
        },
    };
    if let Some(r) = t.receiver.as_mut() {
        if let Err(e) = r.fill(s) {
            out.error = Some(e);
            return out;
        }
    }
    if let Err(e) = s.ready_to_run() {
        out.error = Some(e);
        return out;
    }
    let mut pace = Pace {
        timeline,
        idle: &mut idle,
        before: Totals::default(),
    };
    for &size in &o.sizes {
        let (row, err) = run_size(o, s, &mut t, &mut pace, size);
        pace.before.bytes += row.iterations * size as u64;
        pace.before.iterations += row.iterations;
        out.rows.push(row);
        if let Some(e) = err {
            out.error = Some(e);
            break;
        }
    }
    if o.tool == Tool::ReadBw && o.flags.check && out.error.is_none() {
        if let Err(e) = settle_changes(s, &t, &mut idle) {
            out.error = Some(e);
        }
    }
    if o.flags.bidirectional {
        let ours: Vec<PeerRow> = out.rows.iter().map(ResultRow::to_peer).collect();
        match serve_until_peer_done(s, &mut t, &mut idle, ours) {
            Ok(theirs) => out.peer_rows = theirs,
            Err(e) => {
                out.error.get_or_insert(e);
            }
        }
    }
    if o.tool == Tool::ReadBw && o.flags.check {
        out.check = Some(t.check_json);
    }
    if o.tool == Tool::AtomicBw {
        out.atomic = Some(t.atomic);
    }
    out
}

/// Bytes and iterations of the sizes already run, for the timeline's running totals.
#[derive(Debug, Default, Clone, Copy)]
struct Totals {
    bytes: u64,
    iterations: u64,
}

/// What the client loop keeps across sizes: the timeline, the idle policy, the totals so far.
struct Pace<'a> {
    timeline: &'a mut Timeline,
    idle: &'a mut Idle,
    before: Totals,
}

/// One size's window: iteration i goes to QP i % nq, as its (i / nq)-th; each QP signals
/// every cq_mod of its own and has its own in-flight window, as perftest's QPs do.
struct Window {
    size: usize,
    length: Length,
    nq: u64,
    start: Instant,
    now: Instant,
    /// Iterations posted, over all QPs.
    posted: u64,
    /// Per QP: iterations posted and completed.
    qp_posted: Vec<u64>,
    qp_done: Vec<u64>,
    /// Per QP: posted this round, so its doorbell is due.
    rung: Vec<bool>,
    completed: u64,
    errors: u64,
    last_progress: Instant,
    /// The run's length is reached: post nothing more, wait for what is in flight.
    stopping: bool,
    error: Option<AppError>,
}

impl Window {
    fn new(o: &Options, size: usize, nq: usize) -> Window {
        let start = Instant::now();
        Window {
            size,
            length: Length::of(o),
            nq: nq as u64,
            start,
            now: start,
            posted: 0,
            qp_posted: vec![0; nq],
            qp_done: vec![0; nq],
            rung: vec![false; nq],
            completed: 0,
            errors: 0,
            last_progress: start,
            stopping: false,
            error: None,
        }
    }

    /// Posts what the queues, the credits and the run's length allow.
    fn post(&mut self, s: &mut Session, t: &mut Traffic) {
        let layout = t.layout;
        self.rung.fill(false);
        while !self.stopping {
            let q = (self.posted % self.nq) as usize;
            if self.qp_posted[q] - self.qp_done[q] >= layout.in_flight {
                break;
            }
            // Every QP is at a signaled boundary here, so a run may stop.
            let boundary = self.posted % (self.nq * layout.cq_mod) == 0;
            if boundary && !self.length.wants(self.posted, self.start, self.now) {
                self.stopping = true;
                break;
            }
            if !t.may_post(s, self.posted) {
                break;
            }
            let last = match self.length {
                Length::Iters(n) => self.posted + self.nq >= n,
                Length::Duration(_) => false,
            };
            let signal = (self.qp_posted[q] + 1) % layout.cq_mod == 0 || last;
            if let Err(e) = t.post(s, q, self.posted, self.size, signal) {
                self.error = Some(e);
                break;
            }
            self.posted += 1;
            self.qp_posted[q] += 1;
            self.rung[q] = true;
            if matches!(self.length, Length::Iters(n) if self.posted == n) {
                self.stopping = true;
            }
        }
    }

    /// Rings the doorbell of every QP posted to this round.
    fn ring(&self, s: &mut Session) {
        for (q, r) in self.rung.iter().enumerate() {
            if *r {
                s.conns[q].ring();
            }
        }
    }

    /// Polls every QP once; returns how many completions came.
    fn poll(
        &mut self,
        o: &Options,
        s: &mut Session,
        t: &mut Traffic,
        wcs: &mut [WorkCompletion],
    ) -> usize {
        let nq = self.nq;
        let mut polled = 0;
        for q in 0..nq as usize {
            let n = s.poll_qp(q, wcs);
            polled += n;
            for wc in &wcs[..n] {
                if !wc.is_ok() {
                    self.errors += 1;
                    if self.error.is_none() {
                        self.error = Some(completion_error(&s.conns[q], wc, o.tool.op()));
                    }
                    continue;
                }
                if wc.opcode == WcOpcode::Recv || wc.opcode == WcOpcode::RecvRdmaWithImm {
                    if let Some(r) = t.receiver.as_mut() {
                        if let Err(e) = r.post(s, q) {
                            self.error.get_or_insert(e);
                        }
                    }
                    continue;
                }
                let done = wc.wr_id / nq + 1;
                if done > self.qp_done[q] {
                    if nq == 1 {
                        if let Err(e) = t.completed(s, self.size, self.qp_done[q], done) {
                            self.error.get_or_insert(e);
                        }
                    }
                    self.completed += done - self.qp_done[q];
                    self.qp_done[q] = done;
                    self.last_progress = self.now;
                }
            }
        }
        polled
    }

    /// The size's result row.
    fn row(&self, o: &Options, timeline: &Timeline) -> ResultRow {
        let secs = self.now.duration_since(self.start).as_secs_f64().max(1e-9);
        let bytes = self.completed * self.size as u64;
        let avg = bytes as f64 * 8.0 / secs / 1e9;
        ResultRow {
            size: self.size,
            iterations: self.completed,
            bw_peak_gbps: timeline
                .peak_gbps()
                .filter(|_| o.sizes.len() == 1)
                .unwrap_or(avg)
                .max(avg),
            bw_avg_gbps: avg,
            msg_rate_mpps: self.completed as f64 / secs / 1e6,
            duration_s: secs,
            latency: None,
        }
    }
}

/// Runs one size: post, ring, poll, tick the timeline, until the length is reached and
/// everything posted completed, or an error or a stall stops it.
fn run_size(
    o: &Options,
    s: &mut Session,
    t: &mut Traffic,
    pace: &mut Pace<'_>,
    size: usize,
) -> (ResultRow, Option<AppError>) {
    let mut w = Window::new(o, size, s.conns.len());
    let mut wcs = [WorkCompletion::EMPTY; 32];
    loop {
        w.post(s, t);
        w.ring(s);
        if w.error.is_some() {
            break;
        }
        let polled = w.poll(o, s, t, &mut wcs);
        w.now = Instant::now();
        let failed = w.error.is_some();
        pace.timeline.tick(
            w.now,
            pace.before.bytes + w.completed * size as u64,
            pace.before.iterations + w.completed,
            w.errors,
            s.state(failed),
        );
        if failed || (w.stopping && w.completed == w.posted) {
            break;
        }
        if polled == 0 && !w.rung.contains(&true) {
            if w.now.duration_since(w.last_progress) > STALL {
                w.error = Some(AppError::Stalled(STALL));
                break;
            }
            pace.idle.idle();
        } else {
            pace.idle.busy();
        }
    }
    (w.row(o, pace.timeline), w.error)
}

/// `-b`: this side's traffic is done; tell the peer, and keep serving (reposting receives,
/// failover work) until the peer's traffic is done too, so neither side tears its QPs down
/// under the other's.
fn serve_until_peer_done(
    s: &mut Session,
    t: &mut Traffic,
    idle: &mut Idle,
    rows: Vec<PeerRow>,
) -> Result<Vec<PeerRow>, AppError> {
    let iterations = rows.iter().map(|r| r.iterations).sum();
    s.chan()?.send(&Msg::Done { iterations, rows })?;
    let mut watch = PeerWatch::new(Duration::from_millis(2));
    let mut wcs = [WorkCompletion::EMPTY; 32];
    let since = Instant::now();
    loop {
        let mut polled = 0;
        for q in 0..s.conns.len() {
            let n = s.poll_qp(q, &mut wcs);
            polled += n;
            for wc in &wcs[..n] {
                if !wc.is_ok() {
                    return Err(completion_error(&s.conns[q], wc, "serving the peer"));
                }
                if wc.opcode == WcOpcode::Recv {
                    if let Some(r) = t.receiver.as_mut() {
                        r.post(s, q)?;
                    }
                }
            }
        }
        match watch.check(Instant::now(), &mut s.oob) {
            Ok(Some(Msg::Done { rows, .. })) => return Ok(rows),
            Err(_) => return Ok(Vec::new()),
            Ok(Some(Msg::Abort { error })) => {
                return Err(crate::exchange::ExchangeError::PeerAborted(error).into())
            }
            Ok(_) => {}
        }
        if since.elapsed() > STALL {
            return Err(AppError::Stalled(STALL));
        }
        if polled == 0 {
            idle.idle();
        } else {
            idle.busy();
        }
    }
}

/// `shift_read_bw --check`: waits until the server acknowledged every change SEND (they are
/// unsignaled), so none is still in flight when the client says it is done.
fn settle_changes(s: &mut Session, t: &Traffic, idle: &mut Idle) -> Result<(), AppError> {
    let mut wcs = [WorkCompletion::EMPTY; 32];
    let since = Instant::now();
    while s.mem.read_u64(t.layout.credit_offset()) < t.changes.sent {
        let n = s.conns[0].poll(&mut wcs);
        if let Some(wc) = wcs[..n].iter().find(|wc| !wc.is_ok()) {
            return Err(completion_error(&s.conns[0], wc, "a change SEND"));
        }
        if since.elapsed() > STALL {
            return Err(AppError::Stalled(STALL));
        }
        if n == 0 {
            idle.idle();
        } else {
            idle.busy();
        }
    }
    Ok(())
}

/// The client's end of the run: tell the server (with the client's rows, which a WRITE,
/// READ or atomic server prints), hear what it saw (the atomic counter).
pub fn finish_client(
    s: &mut Session,
    iterations: u64,
    rows: &[ResultRow],
    atomic: Option<&mut AtomicJson>,
) {
    let Ok(chan) = s.chan() else {
        return;
    };
    let rows = rows.iter().map(ResultRow::to_peer).collect();
    if chan.send(&Msg::Done { iterations, rows }).is_err() {
        return;
    }
    if let Ok(Msg::Summary { atomic_counter }) = chan.recv(Duration::from_secs(5)) {
        if let (Some(a), Some(c)) = (atomic, atomic_counter) {
            a.remote_counter = Some(c);
            a.double_executions = c.saturating_sub(a.posted);
        }
    }
    chan.close();
}

// ---- server -----------------------------------------------------------------------------

/// What the server's loop tracks under `--check`.
struct Checker {
    layout: Layout,
    next: u64,
    scratch: Vec<u8>,
    json: CheckJson,
    credit_at: u64,
    credit_addr: u64,
    credit_rkey: u32,
}

impl Checker {
    /// A `shift_write_bw --check` notification: the immediate is the next iteration and its
    /// slot holds that iteration's pattern.
    fn notification(&mut self, s: &mut Session, imm: u32) -> Result<(), AppError> {
        // The immediate carries the iteration's low 32 bits.
        let i = (self.next & !0xffff_ffff) | u64::from(imm);
        if i != self.next {
            self.json.notification_errors += 1;
        }
        self.json.notifications_checked += 1;
        let slot = (i % self.layout.slots as u64) as usize;
        self.scratch.resize(self.layout.size, 0);
        s.mem.read(slot * self.layout.size, &mut self.scratch);
        self.json.errors += pattern::mismatches(&self.scratch, i);
        self.json.bytes_checked += self.layout.size as u64;
        self.next = i + 1;
        self.credit(s)
    }

    /// A `shift_send_bw --check` receive: SEND `next` must have landed in receive `next`
    /// (RC consumes receives in order, one per SEND) with the whole message and its bytes.
    /// A receive out of order, or of another length, is a notification error; wrong bytes
    /// are counted against the pattern of `next`, so a SEND in the wrong receive shows too.
    fn received_send(&mut self, s: &mut Session, wc: &WorkCompletion) -> Result<(), AppError> {
        let i = self.next;
        if wc.wr_id != i || wc.byte_len as usize != self.layout.size {
            self.json.notification_errors += 1;
        }
        self.json.notifications_checked += 1;
        let slot = (wc.wr_id % self.layout.slots as u64) as usize;
        self.scratch.resize(self.layout.size, 0);
        s.mem.read(slot * self.layout.size, &mut self.scratch);
        self.json.errors += pattern::mismatches(&self.scratch, i);
        self.json.bytes_checked += self.layout.size as u64;
        self.next = i + 1;
        self.credit(s)
    }

    /// Hands slots (or receives) back to the client every half window (at once for a short
    /// one): an inline WRITE of the checked count into the client's credit word.
    fn credit(&mut self, s: &mut Session) -> Result<(), AppError> {
        let step = (self.layout.credit_window / 2).max(1);
        if self.next >= self.credit_at + step {
            self.credit_at = self.next;
            let word = self.next.to_ne_bytes();
            let op = SendOp::Write {
                remote: pmd::Remote {
                    addr: self.credit_addr,
                    rkey: self.credit_rkey,
                },
            };
            s.conns[0].post_send(&SendWr::inline(u64::MAX, op, &word).signaled())?;
            s.conns[0].ring();
        }
        Ok(())
    }
}

/// What a `shift_read_bw --check` server does with the client's change SENDs.
struct Changer {
    layout: Layout,
    /// Changes made so far.
    next: u64,
    /// Per slot: its generation.
    generation: Vec<u64>,
    scratch: Vec<u8>,
    ack_addr: u64,
    ack_rkey: u32,
}

impl Changer {
    /// Change `next`: slot `next mod slots` gets its next generation's pattern, then the
    /// client learns (its credit word) that the change is made.
    fn change(&mut self, s: &mut Session) -> Result<(), AppError> {
        let slots = self.layout.slots;
        let slot = (self.next % slots as u64) as usize;
        self.generation[slot] += 1;
        self.scratch.resize(self.layout.size, 0);
        pattern::fill(
            &mut self.scratch,
            self.generation[slot] * slots as u64 + slot as u64,
        );
        s.mem.write(slot * self.layout.size, &self.scratch);
        self.next += 1;
        let word = self.next.to_ne_bytes();
        let op = SendOp::Write {
            remote: pmd::Remote {
                addr: self.ack_addr,
                rkey: self.ack_rkey,
            },
        };
        s.conns[0].post_send(&SendWr::inline(u64::MAX, op, &word).signaled())?;
        s.conns[0].ring();
        Ok(())
    }
}

/// The FETCH_ADDs executed on this server's buffer: a railshift client adds 1 to its first
/// word; a perftest client walks its cycle buffer in cache-line steps, so every word counts
/// (the buffer starts zeroed, every FETCH_ADD adds 1).
fn atomic_total(s: &Session) -> u64 {
    if !s.is_perftest() {
        return s.mem.read_u64(0);
    }
    (0..s.mem.len() / 8).fold(0u64, |sum, k| sum.wrapping_add(s.mem.read_u64(k * 8)))
}

/// Fills the buffer before the peer can reach it: a `shift_read_bw --check` server's slots
/// hold the patterns the client's READs verify. (Filled after the exchange, a fast client
/// read slots the server had not written yet.)
pub fn prepare_buffer(o: &Options, mem: &Memory, layout: Layout) {
    if o.is_server() && o.tool == Tool::ReadBw && o.flags.check {
        let mut slot = vec![0u8; layout.size];
        for k in 0..layout.slots {
            pattern::fill(&mut slot, k as u64);
            mem.write(k * layout.size, &slot);
        }
    }
}

/// Runs the server side of a bandwidth tool until the client says it is done or goes away.
pub fn server(o: &Options, s: &mut Session, layout: Layout, timeline: &mut Timeline) -> BwOutcome {
    let mut out = BwOutcome::default();
    // The credit word sits CONTROL bytes before the end of the buffer the peer described
    // (a stock perftest peer's has none: --check is refused with it).
    let control = if s.is_perftest() { 0 } else { CONTROL };
    if let Err(e) = s.peer.check_buffer(control + layout.size) {
        out.error = Some(e.into());
        return out;
    }
    let mut idle = Idle::new(o.flags.poll, &s.host);
    for c in &s.conns {
        c.set_waker(idle.unparker());
    }
    let changes_slots = o.tool == Tool::ReadBw && o.flags.check;
    let receives =
        o.tool == Tool::SendBw || (o.tool == Tool::WriteBw && o.flags.check) || changes_slots;
    let checks_sends = o.tool == Tool::SendBw;
    let mut changer = changes_slots.then(|| Changer {
        layout,
        next: 0,
        generation: vec![0; layout.slots],
        scratch: Vec::new(),
        // Checked above: CONTROL <= len and addr + len does not wrap.
        ack_addr: s.peer.addr + (s.peer.len - CONTROL as u64),
        ack_rkey: s.peer.rkey,
    });
    let mut checker = (layout.credit_window > 0).then(|| Checker {
        layout,
        next: 0,
        scratch: Vec::new(),
        json: CheckJson {
            enabled: true,
            ..CheckJson::default()
        },
        credit_at: 0,
        // Checked above: CONTROL <= len and addr + len does not wrap.
        credit_addr: s.peer.addr + (s.peer.len - CONTROL as u64),
        credit_rkey: s.peer.rkey,
    });
    let mut receiver = Receiver::new(layout, o.tool == Tool::SendBw, s.conns.len());
    if receives {
        if let Err(e) = receiver.fill(s) {
            out.error = Some(e);
            return out;
        }
    }
    if let Err(e) = s.ready_to_run() {
        out.error = Some(e);
        return out;
    }
    let mut watch = PeerWatch::new(Duration::from_millis(2));
    let mut wcs = [WorkCompletion::EMPTY; 32];
    let (mut bytes, mut received, mut errors) = (0u64, 0u64, 0u64);
    let mut done_at: Option<(u64, Instant)> = None;
    let mut failed = false;
    loop {
        let mut polled = 0;
        for q in 0..s.conns.len() {
            let n = s.poll_qp(q, &mut wcs);
            polled += n;
            for wc in &wcs[..n] {
                if !wc.is_ok() {
                    errors += 1;
                    failed = true;
                    if out.error.is_none() {
                        out.error = Some(completion_error(&s.conns[q], wc, "the server's queue"));
                    }
                    continue;
                }
                match wc.opcode {
                    WcOpcode::Recv | WcOpcode::RecvRdmaWithImm => {
                        received += 1;
                        bytes += u64::from(wc.byte_len);
                        if let Some(c) = checker.as_mut() {
                            let checked = match wc.imm {
                                _ if checks_sends => c.received_send(s, wc),
                                Some(imm) => {
                                    bytes += layout.size as u64;
                                    c.notification(s, imm)
                                }
                                None => Ok(()),
                            };
                            if let Err(e) = checked {
                                out.error.get_or_insert(e);
                            }
                        }
                        if let Some(c) = changer.as_mut() {
                            if let Err(e) = c.change(s) {
                                out.error.get_or_insert(e);
                            }
                        }
                        if let Err(e) = receiver.post(s, q) {
                            out.error.get_or_insert(e);
                        }
                    }
                    _ => {}
                }
            }
        }
        let now = Instant::now();
        timeline.tick(now, bytes, received, errors, s.state(failed));
        if let Some((iters, since)) = done_at {
            // The client's completions can be ahead of our polls: count the rest first.
            let caught_up = match &checker {
                Some(c) => c.next >= iters,
                None if o.tool == Tool::SendBw => received >= iters,
                None => true,
            };
            if caught_up || now.duration_since(since) > Duration::from_secs(2) {
                break;
            }
        } else {
            match watch.check(now, &mut s.oob) {
                Ok(None) => {}
                // A perftest client says nothing of its count: it is -n, as for perftest's
                // own server.
                Ok(Some(Msg::Done { .. })) if s.is_perftest() => done_at = Some((o.iters, now)),
                Ok(Some(Msg::Done { iterations, rows })) => {
                    out.peer_rows = rows;
                    done_at = Some((iterations, now));
                }
                Ok(Some(Msg::Abort { .. })) | Err(_) => break,
                Ok(Some(_)) => {}
            }
        }
        if polled == 0 {
            idle.idle();
        } else {
            idle.busy();
        }
    }
    let counter = atomic_total(s);
    if done_at.is_some() {
        let atomic_counter = (o.tool == Tool::AtomicBw).then_some(counter);
        if let Ok(chan) = s.chan() {
            let _ = chan.send(&Msg::Summary { atomic_counter });
        }
    }
    let secs = timeline.start().elapsed().as_secs_f64().max(1e-9);
    let avg = bytes as f64 * 8.0 / secs / 1e9;
    out.rows.push(ResultRow {
        size: layout.size,
        iterations: received,
        bw_peak_gbps: timeline.peak_gbps().unwrap_or(avg).max(avg),
        bw_avg_gbps: avg,
        msg_rate_mpps: received as f64 / secs / 1e6,
        duration_s: secs,
        latency: None,
    });
    out.check = checker.map(|c| c.json);
    if o.tool == Tool::AtomicBw {
        out.atomic = Some(AtomicJson {
            remote_counter: Some(counter),
            fetched_in_sequence: true,
            ..AtomicJson::default()
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{parse, Tool};

    fn layout(tool: Tool, args: &[&str]) -> Layout {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        Layout::of(&parse(tool, &args).unwrap())
    }

    #[test]
    fn cq_moderation_is_perftests_unless_given_and_never_above_what_is_in_flight() {
        assert_eq!(layout(Tool::WriteBw, &[]).cq_mod, 64, "min(100, 128 / 2)");
        assert_eq!(layout(Tool::WriteBw, &["-t", "512"]).cq_mod, 100);
        assert_eq!(layout(Tool::WriteBw, &["-Q", "1"]).cq_mod, 1);
        assert_eq!(layout(Tool::SendBw, &["-Q", "16"]).cq_mod, 16);
        let deep = layout(Tool::WriteBw, &["-Q", "1000"]);
        assert_eq!(deep.cq_mod, deep.in_flight);
        assert_eq!(layout(Tool::WriteBw, &["--check"]).cq_mod, 1);
    }
}
