//! The client of a bandwidth run: it posts the stream with `tx_depth` work requests in
//! flight, one signaled every `cq_mod`, over every size, and checks what comes back.

use std::time::{Duration, Instant};

use pmd::{SendOp, SendWr, WcOpcode, WorkCompletion};

use crate::cli::Options;
use crate::error::AppError;
use crate::exchange::Msg;
use crate::pattern;
use crate::report::{AtomicJson, CheckJson, ResultRow, Timeline};
use crate::row::PeerRow;
use crate::session::{Idle, Length, PeerWatch, Session};

use super::check::Changes;
use super::{
    completion_error, signed, BwOutcome, Layout, Receiver, Stream, CHANGE_EVERY, CHUNK, CONTROL,
    STALL,
};

/// Per-tool behaviour of the client loop.
struct Traffic {
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
        if self.layout.stream == Stream::ChangingRead {
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
        match self.layout.stream {
            Stream::CheckedWrite => {
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
            Stream::CheckedSend => {
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
            Stream::Write | Stream::Send => {
                let op = if self.layout.stream == Stream::Write {
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
            stream @ (Stream::Read | Stream::ChangingRead) => {
                let changing = stream == Stream::ChangingRead;
                let op = SendOp::Read {
                    remote: self.remote(remote_slot),
                };
                if changing {
                    s.mem.write(offset, &vec![0u8; size]);
                    let r = remote_slot / self.layout.size;
                    let c = &mut self.changes;
                    c.expect[slot] = c.generation[r] * self.remote_slots as u64 + r as u64;
                }
                let wr = SendWr::new(i, op, &[s.mem.sge(offset, size as u32)]);
                s.conns[qp].post_send(&signed(wr, signal))?;
                if changing && (i + 1) % CHANGE_EVERY == 0 {
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
            Stream::Atomic => {
                let op = SendOp::FetchAdd {
                    remote: self.remote(0),
                    add: 1,
                };
                let wr = SendWr::new(i, op, &[s.mem.sge(slot * 8, 8)]);
                s.conns[qp].post_send(&signed(wr, signal))?;
                self.atomic.posted += 1;
            }
        }
        Ok(())
    }

    /// Iterations `from..to` completed: verify what came back.
    fn completed(&mut self, s: &Session, size: usize, from: u64, to: u64) -> Result<(), AppError> {
        match self.layout.stream {
            Stream::ChangingRead => {
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
            Stream::Atomic => {
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
            enabled: layout.stream.checked(),
            ..CheckJson::default()
        },
        receiver: (o.flags.bidirectional && layout.stream.sends())
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
    if layout.stream == Stream::ChangingRead && out.error.is_none() {
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
    if layout.stream == Stream::ChangingRead {
        out.check = Some(t.check_json);
    }
    if layout.stream == Stream::Atomic {
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
            || s.state(failed),
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
