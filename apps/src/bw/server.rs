//! The server of a bandwidth run: it counts what the client's stream brings, checks it and
//! answers it (credits, changes, receives posted again) until the client says it is done or
//! goes away.

use std::time::{Duration, Instant};

use pmd::{WcOpcode, WorkCompletion};

use crate::cli::Options;
use crate::error::AppError;
use crate::exchange::Msg;
use crate::report::{AtomicJson, ResultRow, Timeline};
use crate::session::{Idle, PeerWatch, Session};

use super::check::{Changer, Checker};
use super::{completion_error, BwOutcome, Layout, Receiver, Stream, CONTROL};

/// The FETCH_ADDs executed on this server's buffer: a railshift client adds 1 to its first
/// word; a perftest client walks its cycle buffer in cache-line steps, so every word counts
/// (the buffer starts zeroed, every FETCH_ADD adds 1).
fn atomic_total(s: &Session) -> u64 {
    if !s.is_perftest() {
        return s.mem.read_u64(0);
    }
    (0..s.mem.len() / 8).fold(0u64, |sum, k| sum.wrapping_add(s.mem.read_u64(k * 8)))
}

/// What the server counts, checks and answers while the client runs.
struct Serving {
    layout: Layout,
    /// A checked WRITE or SEND stream: the checks and the credits.
    checker: Option<Checker>,
    /// A checked READ stream: the changes of the slots.
    changer: Option<Changer>,
    receiver: Receiver,
    bytes: u64,
    received: u64,
    errors: u64,
    /// A completion failed.
    failed: bool,
    /// The error that stopped the run, the first one.
    error: Option<AppError>,
}

impl Serving {
    fn new(s: &Session, layout: Layout) -> Serving {
        // Checked by the caller: CONTROL <= len and addr + len does not wrap.
        let control_addr = s.peer.addr + (s.peer.len - CONTROL as u64);
        Serving {
            layout,
            checker: (layout.credit_window > 0)
                .then(|| Checker::new(layout, s.conns.len(), control_addr, s.peer.rkey)),
            changer: (layout.stream == Stream::ChangingRead).then(|| Changer {
                layout,
                next: 0,
                generation: vec![0; layout.slots],
                scratch: Vec::new(),
                ack_addr: control_addr,
                ack_rkey: s.peer.rkey,
            }),
            receiver: Receiver::new(layout, layout.stream.sends(), s.conns.len()),
            bytes: 0,
            received: 0,
            errors: 0,
            failed: false,
            error: None,
        }
    }

    /// One completion polled from QP `q`.
    fn take(&mut self, s: &mut Session, q: usize, wc: &WorkCompletion) {
        if !wc.is_ok() {
            self.errors += 1;
            self.failed = true;
            if self.error.is_none() {
                self.error = Some(completion_error(&s.conns[q], wc, "the server's queue"));
            }
            return;
        }
        if !matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
            return;
        }
        self.received += 1;
        self.bytes += u64::from(wc.byte_len);
        if let Some(c) = self.checker.as_mut() {
            let checked = match wc.imm {
                _ if self.layout.stream.sends() => c.received_send(s, wc),
                Some(imm) => {
                    self.bytes += self.layout.size as u64;
                    c.notification(s, q, imm)
                }
                None => Ok(()),
            };
            if let Err(e) = checked {
                self.error.get_or_insert(e);
            }
        }
        if let Some(c) = self.changer.as_mut() {
            if let Err(e) = c.change(s) {
                self.error.get_or_insert(e);
            }
        }
        if let Err(e) = self.receiver.post(s, q) {
            self.error.get_or_insert(e);
        }
    }

    /// Whether the client's `iterations` are all counted here (its completions can be ahead
    /// of our polls).
    fn caught_up(&self, iterations: u64) -> bool {
        match &self.checker {
            Some(c) => c.next >= iterations,
            None if self.layout.stream.sends() => self.received >= iterations,
            None => true,
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
    let mut serving = Serving::new(s, layout);
    if layout.stream.server_receives() {
        if let Err(e) = serving.receiver.fill(s) {
            out.error = Some(e);
            return out;
        }
    }
    if let Err(e) = s.ready_to_run() {
        out.error = Some(e);
        return out;
    }
    let client_done = serve(o, s, &mut serving, &mut idle, timeline, &mut out.peer_rows);
    let counter = atomic_total(s);
    if client_done {
        let atomic_counter = (layout.stream == Stream::Atomic).then_some(counter);
        if let Ok(chan) = s.chan() {
            let _ = chan.send(&Msg::Summary { atomic_counter });
        }
    }
    let (bytes, received) = (serving.bytes, serving.received);
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
    out.error = serving.error;
    out.check = serving.checker.map(|c| c.json);
    if layout.stream == Stream::Atomic {
        out.atomic = Some(AtomicJson {
            remote_counter: Some(counter),
            fetched_in_sequence: true,
            ..AtomicJson::default()
        });
    }
    out
}

/// Polls every QP and answers what comes, ticking the timeline, until the client said it is
/// done and everything it completed is counted (or two seconds passed since), or it went
/// away. Whether it said it was done; its rows go to `peer_rows`.
fn serve(
    o: &Options,
    s: &mut Session,
    serving: &mut Serving,
    idle: &mut Idle,
    timeline: &mut Timeline,
    peer_rows: &mut Vec<crate::row::PeerRow>,
) -> bool {
    let mut watch = PeerWatch::new(Duration::from_millis(2));
    let mut wcs = [WorkCompletion::EMPTY; 32];
    let mut done_at: Option<(u64, Instant)> = None;
    loop {
        let mut polled = 0;
        for q in 0..s.conns.len() {
            let n = s.poll_qp(q, &mut wcs);
            polled += n;
            for wc in &wcs[..n] {
                serving.take(s, q, wc);
            }
        }
        let now = Instant::now();
        timeline.tick(now, serving.bytes, serving.received, serving.errors, || {
            s.state(serving.failed)
        });
        if let Some((iterations, since)) = done_at {
            if serving.caught_up(iterations) || now.duration_since(since) > Duration::from_secs(2) {
                return true;
            }
        } else {
            match watch.check(now, &mut s.oob) {
                Ok(None) => {}
                // A perftest client says nothing of its count: it is -n, as for perftest's
                // own server.
                Ok(Some(Msg::Done { .. })) if s.is_perftest() => done_at = Some((o.iters, now)),
                Ok(Some(Msg::Done { iterations, rows })) => {
                    *peer_rows = rows;
                    done_at = Some((iterations, now));
                }
                Ok(Some(Msg::Abort { .. })) | Err(_) => return false,
                Ok(Some(_)) => {}
            }
        }
        if polled == 0 {
            idle.idle();
        } else {
            idle.busy();
        }
    }
}
