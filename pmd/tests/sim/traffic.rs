//! NCCL-Simple-like traffic over a simulated resilient connection, checked as NCCL's receiver
//! depends on it.
//!
//! Each iteration of a direction writes a slot of the receiver's buffer with two data WRITEs
//! (unsignaled), then sends a zero-length WRITE_WITH_IMM whose immediate is the iteration
//! number (signaled). The receiver, on each notification, checks that it is the next one
//! expected and that the slot holds exactly that iteration's bytes, then overwrites the slot
//! with a marker (as an application that consumed the data reuses the buffer): a data WRITE
//! that executed again after its notification was observed would destroy the marker, and the
//! final check finds it.
//!
//! Optionally (`Dir::credits`) the receiver also answers every notification with a signaled
//! 8-byte INLINE RDMA WRITE of its count into a credit word of the sender's buffer, as
//! `shift_write_bw --check` and NCCL's receiver hand slots back: both ends then post sends.
//! `Dir::recv_window` receives are kept posted (a whole ring, as an application that fills
//! its receive queue does, makes a switch-back leave that many stale receives behind).
//!
//! Two other kinds of traffic (`Dir::kind`) use the same checks: **SEND/RECV**, each iteration
//! one signaled SEND of the slot's bytes into receive `i`, which must land in its own receive
//! (`wr_id`, length, bytes); and **READ**, each iteration a signaled READ of the receiver's
//! slot (the harness writes the pattern there first) followed by the fenced WRITE_WITH_IMM
//! notification: the receiver overwrites the slot with the marker when it sees
//! the notification, so a READ executed again after its notification was consumed brings the
//! marker, and a READ completing with `Success` must bring the pattern.

use std::collections::HashMap;
use std::time::Duration;

use pmd::{PostError, RecvWr, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion};

use super::Sim;

/// Bytes per iteration's slot.
pub const SLOT: usize = 256;
/// Iterations a direction may run (its slots fill a quarter of the buffer).
pub const MAX_ITERATIONS: u64 = (super::BUF / 4 / SLOT) as u64;
const MARKER: u8 = 0xc5;
/// wr_ids of credit WRITEs carry this bit (and the credit's number).
const CREDIT: u64 = 1 << 63;
/// Offset of a direction's credit word in the sender's buffer (past every slot).
fn credit_word(dir: usize) -> usize {
    super::BUF - 64 + dir * 8
}

fn pattern(dir: usize, iteration: u64) -> Vec<u8> {
    (0..SLOT)
        .map(|j| (iteration as usize * 31 + j * 7 + dir * 101) as u8)
        .collect()
}

/// What one iteration of a direction posts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Two data WRITEs and a WRITE_WITH_IMM notification (NCCL Simple).
    Nccl,
    /// One SEND of the slot's bytes into its own receive.
    Send,
    /// A READ of the receiver's slot, then the notification, fenced: it waits for the READ,
    /// as an application that lets the peer change the slot after it must (without the fence
    /// plain RC already returns changed data: a READ whose response is lost is executed
    /// again after the notification).
    Read,
}

/// One direction of traffic.
#[derive(Debug, Clone)]
pub struct Dir {
    /// What each iteration posts.
    pub kind: Kind,
    /// READs that completed successfully, in order.
    pub reads_done: u64,
    /// Host A sends (else B sends).
    pub from_a: bool,
    /// Iterations to run.
    pub total: u64,
    /// Iterations in flight at most.
    pub window: u64,
    /// Virtual time between iteration starts (zero: as fast as the window allows).
    pub interval: Duration,
    pub posted: u64,
    pub completed: u64,
    pub notified: u64,
    pub recvs_posted: u64,
    /// Error completions the sender saw.
    pub send_errors: u64,
    /// Posts the sender's QP refused (it had failed).
    pub refused: u64,
    /// Receives kept posted ahead of the notifications seen.
    pub recv_window: u64,
    /// The receiver returns a credit (an 8-byte INLINE WRITE) per notification.
    pub credits: bool,
    pub credits_posted: u64,
    pub credits_done: u64,
    /// WRs of iteration `posted` already posted: a full send queue stopped it part way.
    pub partial: usize,
    start: Duration,
}

impl Dir {
    pub fn new(from_a: bool, total: u64) -> Dir {
        assert!(total <= MAX_ITERATIONS);
        Dir {
            kind: Kind::Nccl,
            reads_done: 0,
            from_a,
            total,
            window: 8,
            interval: Duration::ZERO,
            posted: 0,
            completed: 0,
            notified: 0,
            recvs_posted: 0,
            send_errors: 0,
            refused: 0,
            recv_window: 32,
            credits: false,
            credits_posted: 0,
            credits_done: 0,
            partial: 0,
            start: Duration::ZERO,
        }
    }

    fn index(&self) -> usize {
        usize::from(!self.from_a)
    }

    /// The receiver's slot of `iteration`.
    fn dst(&self, iteration: u64) -> usize {
        self.index() * super::BUF / 4 + iteration as usize * SLOT
    }

    /// The sender's staging slot of `iteration`.
    fn src(&self, iteration: u64) -> usize {
        super::BUF / 2 + self.index() * super::BUF / 4 + (iteration as usize % 64) * SLOT
    }

    /// Whether every posted WR of the sender has completed, successfully or not.
    pub fn settled(&self) -> bool {
        self.completed + self.send_errors + self.refused >= self.posted
    }

    /// Whether all iterations completed and were observed.
    pub fn finished(&self) -> bool {
        self.completed == self.total
            && self.notified == self.total
            && (!self.credits || self.credits_done == self.total)
    }
}

/// One work request the traffic posted (the post returned `Ok`), and its completions.
#[derive(Debug, Clone, Copy, Default)]
struct Posted {
    /// It asked for a completion (every receive does).
    signaled: bool,
    /// Completions seen, of any status.
    completions: u32,
}

/// Which work request: the host that posted it, whether it is a receive, its wr_id (unique
/// per host and queue in this traffic).
type WrKey = (bool, bool, u64);

/// Traffic in one or two directions, and everything it found wrong.
#[derive(Debug)]
pub struct Traffic {
    pub dirs: Vec<Dir>,
    /// Violations of what the receiver depends on (never allowed).
    pub violations: Vec<String>,
    /// Every WR posted, with its completions: each completes exactly once (a signaled one,
    /// or any one when its QP fails), with the status the contract names.
    posted: HashMap<WrKey, Posted>,
    /// Per host (A, B): error completions it returned so far (only its first may carry a
    /// status other than `WR_FLUSH_ERR`, as a plain RC QP in ERR reports).
    errors_seen: [u64; 2],
}

impl Traffic {
    pub fn new(dirs: Vec<Dir>, now: Duration) -> Traffic {
        let mut dirs = dirs;
        for d in &mut dirs {
            d.start = now;
        }
        Traffic {
            dirs,
            violations: Vec::new(),
            posted: HashMap::new(),
            errors_seen: [0; 2],
        }
    }

    /// Notes a WR whose post returned `Ok`.
    /// Checks a WR posted outside the traffic (by the test itself) as the traffic's own:
    /// completed exactly once, with the status the contract names.
    pub fn track(&mut self, host_a: bool, recv: bool, wr_id: u64, signaled: bool) {
        let old = self.posted.insert(
            (host_a, recv, wr_id),
            Posted {
                signaled,
                completions: 0,
            },
        );
        if old.is_some() {
            self.violations.push(format!(
                "the traffic posted wr_id {wr_id} twice on host {} (a harness bug)",
                host_name(host_a)
            ));
        }
    }

    /// Counts a completion against the WR it names: never one nobody posted, never a second,
    /// never a success for an unsignaled send, and only the host's first error completion
    /// may carry a status other than `WR_FLUSH_ERR`.
    fn count(&mut self, host_a: bool, wc: &WorkCompletion) {
        let recv = matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
        let what = if recv { "receive" } else { "send" };
        let host = host_name(host_a);
        if wc.status != WcStatus::Success {
            let seen = &mut self.errors_seen[usize::from(!host_a)];
            *seen += 1;
            if wc.status != WcStatus::WrFlushErr && *seen > 1 {
                self.violations.push(format!(
                    "host {host}'s {what} {} completed with {:?} after an earlier error completion (later ones must be WR_FLUSH_ERR)",
                    wc.wr_id, wc.status
                ));
            }
        }
        let Some(p) = self.posted.get_mut(&(host_a, recv, wc.wr_id)) else {
            self.violations.push(format!(
                "host {host} completed {what} {} that it never posted: {wc:?}",
                wc.wr_id
            ));
            return;
        };
        p.completions += 1;
        if p.completions > 1 {
            self.violations.push(format!(
                "host {host}'s {what} {} completed {} times (now with {:?})",
                wc.wr_id, p.completions, wc.status
            ));
        }
        if !p.signaled && wc.status == WcStatus::Success {
            self.violations.push(format!(
                "host {host}'s unsignaled send {} completed with Success",
                wc.wr_id
            ));
        }
    }

    /// The WRs of host `a` still owed a completion: every receive and every signaled send
    /// posted that has not completed (`wr_id`s, sorted; receives marked `r`).
    pub fn owed(&self, a: bool) -> Vec<String> {
        let mut owed: Vec<(bool, u64)> = self
            .posted
            .iter()
            .filter(|(&(host, _, _), p)| host == a && p.signaled && p.completions == 0)
            .map(|(&(_, recv, wr_id), _)| (recv, wr_id))
            .collect();
        owed.sort_unstable();
        owed.into_iter()
            .map(|(recv, wr_id)| {
                if recv {
                    format!("r{wr_id}")
                } else {
                    format!("{wr_id}")
                }
            })
            .collect()
    }

    /// Polls both hosts and checks what came, posting nothing.
    pub fn poll_only(&mut self, s: &mut Sim) {
        for a in [true, false] {
            s.poll(a);
            let wcs: Vec<WorkCompletion> = s.host(a).wcs.drain(..).collect();
            for wc in wcs {
                self.completion(s, a, wc);
            }
        }
    }

    /// After the traffic ended: every host whose connection failed, and every direction that
    /// finished, owes no completion. Runs the simulation (polling only) up to `limit` for the
    /// failed hosts' flushes to arrive, then records what is still owed as violations.
    pub fn check_exactly_once(&mut self, s: &mut Sim, limit: Duration) {
        let failed = |s: &Sim, a: bool| {
            let h = if a { &s.a } else { &s.b };
            h.qp.state() == pmd::resilient::ResilientState::Failed
        };
        let finished = self.finished();
        s.run_until(limit, |s| {
            self.poll_only(s);
            [true, false]
                .into_iter()
                .all(|a| !(failed(s, a) || finished) || self.owed(a).is_empty())
        });
        for a in [true, false] {
            if !(failed(s, a) || finished) {
                continue;
            }
            let owed = self.owed(a);
            if !owed.is_empty() {
                self.violations.push(format!(
                    "host {} ({:?}) never completed {} WRs: {}",
                    host_name(a),
                    s.host(a).qp.state(),
                    owed.len(),
                    owed.join(" ")
                ));
            }
        }
    }

    /// Posts what the windows and schedules allow, polls both hosts and checks what came.
    pub fn step(&mut self, s: &mut Sim) {
        let now = s.now();
        let mut wake: Option<Duration> = None;
        let mut tracked = Vec::new();
        for dir in 0..self.dirs.len() {
            if self.dirs[dir].credits {
                self.post_credits(s, dir);
            }
        }
        for d in &mut self.dirs {
            let receiver = s.host(!d.from_a);
            while d.recvs_posted < d.total && d.recvs_posted < d.notified + d.recv_window {
                let k = d.recvs_posted;
                let wr = match d.kind {
                    Kind::Send => RecvWr::new(k, &[receiver.buf.sge(d.dst(k), SLOT as u32)]),
                    _ => RecvWr::new(k, &[]),
                };
                if receiver.qp.post_recv(&wr).is_err() {
                    break;
                }
                d.recvs_posted += 1;
                tracked.push((!d.from_a, true, k, true));
            }
            let mut rang = false;
            while d.posted < d.total
                && d.posted < d.completed + d.send_errors + d.window
                && d.refused == 0
            {
                let due = d.start + d.interval * d.posted as u32;
                if due > now {
                    wake = Some(wake.map_or(due, |w| w.min(due)));
                    break;
                }
                let i = d.posted;
                let (src, dst) = (d.src(i), d.dst(i));
                let peer = s.host(!d.from_a).buf.remote(0);
                if d.partial == 0 {
                    // The data, in place before the first WR of the iteration goes out: the
                    // receiver's for a READ (before the READ can reach it), the sender's
                    // otherwise.
                    match d.kind {
                        Kind::Read => {
                            s.host(!d.from_a).buf.write(dst, &pattern(d.index(), i));
                            s.host(d.from_a).buf.write(src, &[0; SLOT]);
                        }
                        Kind::Nccl | Kind::Send => {
                            s.host(d.from_a).buf.write(src, &pattern(d.index(), i))
                        }
                    }
                }
                let sender = s.host(d.from_a);
                let half = SLOT / 2;
                let read_remote = pmd::Remote {
                    addr: peer.addr + dst as u64,
                    rkey: peer.rkey,
                };
                let send_sge = [sender.buf.sge(src, SLOT as u32)];
                let write_sges = [
                    [sender.buf.sge(src, half as u32)],
                    [sender.buf.sge(src + half, half as u32)],
                ];
                // The iteration's WRs in order, each with whether it is signaled.
                let mut wrs: Vec<(SendWr<'_>, bool)> = Vec::with_capacity(3);
                match d.kind {
                    Kind::Send => wrs.push((
                        SendWr::new(i * 10 + 9, SendOp::Send, &send_sge).signaled(),
                        true,
                    )),
                    Kind::Read => wrs.push((
                        SendWr::new(
                            i * 10 + 5,
                            SendOp::Read {
                                remote: read_remote,
                            },
                            &send_sge,
                        )
                        .signaled(),
                        true,
                    )),
                    Kind::Nccl => {
                        for (k, sge) in write_sges.iter().enumerate() {
                            let remote = pmd::Remote {
                                addr: peer.addr + (dst + k * half) as u64,
                                rkey: peer.rkey,
                            };
                            wrs.push((
                                SendWr::new(i * 10 + k as u64, SendOp::Write { remote }, sge),
                                false,
                            ));
                        }
                    }
                }
                if d.kind != Kind::Send {
                    let note = SendWr::new(
                        i * 10 + 9,
                        SendOp::WriteImm {
                            remote: peer,
                            imm: i as u32,
                        },
                        &[],
                    )
                    .signaled();
                    let note = if d.kind == Kind::Read {
                        note.fenced()
                    } else {
                        note
                    };
                    wrs.push((note, true));
                }
                // From where the last step stopped: a send queue that was full (a failback
                // reposts a whole ring) takes the rest when it has room, as an application
                // retries a post refused with ENOMEM; any other refusal means the QP failed.
                let mut full = false;
                let mut failed = false;
                for (wr, signaled) in &wrs[d.partial..] {
                    match sender.qp.post_send(wr) {
                        Ok(()) => {
                            tracked.push((d.from_a, false, wr.wr_id, *signaled));
                            d.partial += 1;
                        }
                        Err(PostError::QueueFull { .. }) => {
                            full = true;
                            break;
                        }
                        Err(_) => {
                            failed = true;
                            break;
                        }
                    }
                }
                rang = true;
                if failed {
                    // The sender's QP failed: nothing more goes out.
                    d.refused += 1;
                    break;
                }
                if full {
                    // Completions make room; the device's progress brings the next step.
                    break;
                }
                d.partial = 0;
                d.posted += 1;
            }
            if rang {
                s.host(d.from_a).qp.ring_doorbell();
            }
        }
        s.wake_at = wake;
        for (host, recv, wr_id, signaled) in tracked {
            self.track(host, recv, wr_id, signaled);
        }
        self.poll_only(s);
    }

    fn completion(&mut self, s: &mut Sim, a: bool, wc: WorkCompletion) {
        self.count(a, &wc);
        let recv = matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
        if !recv && wc.wr_id & CREDIT != 0 {
            let Some(d) = self.dirs.iter_mut().find(|d| d.credits && d.from_a != a) else {
                self.violations
                    .push(format!("a credit completion nobody expects: {wc:?}"));
                return;
            };
            if wc.status != WcStatus::Success {
                return; // the receiver's QP failed
            }
            if wc.wr_id != CREDIT | (d.credits_done + 1) {
                self.violations.push(format!(
                    "credit completion {} out of order ({} expected)",
                    wc.wr_id & !CREDIT,
                    d.credits_done + 1
                ));
            }
            d.credits_done += 1;
            return;
        }
        let Some(d) = self
            .dirs
            .iter_mut()
            .find(|d| if recv { d.from_a != a } else { d.from_a == a })
        else {
            self.violations
                .push(format!("a completion nobody expects: {wc:?}"));
            return;
        };
        if !recv {
            if wc.status != WcStatus::Success {
                // Unsignaled data WRITEs get error completions too when a QP fails.
                if wc.wr_id % 10 == 9 {
                    d.send_errors += 1;
                }
                return;
            }
            if wc.wr_id % 10 == 5 {
                // A READ: it must bring the bytes the receiver had before the notification.
                let i = wc.wr_id / 10;
                if i != d.reads_done || i != d.completed {
                    self.violations.push(format!(
                        "READ completion {i} out of order ({} reads and {} iterations done)",
                        d.reads_done, d.completed
                    ));
                }
                let mut got = vec![0u8; SLOT];
                s.host(a).buf.read(d.src(i), &mut got);
                if got != pattern(d.index(), i) {
                    self.violations.push(format!(
                        "READ {i} completed with Success but brought other bytes (first {:#x})",
                        got[0]
                    ));
                }
                d.reads_done += 1;
                return;
            }
            if wc.wr_id != d.completed * 10 + 9 {
                self.violations.push(format!(
                    "sender completion {} out of order ({} expected)",
                    wc.wr_id,
                    d.completed * 10 + 9
                ));
            }
            d.completed += 1;
            return;
        }
        if wc.status != WcStatus::Success {
            return; // a receive flushed when the receiver's QP failed
        }
        let i = match d.kind {
            Kind::Send => {
                if wc.byte_len as usize != SLOT {
                    self.violations.push(format!(
                        "SEND {} landed with {} bytes, not {SLOT}",
                        wc.wr_id, wc.byte_len
                    ));
                }
                wc.wr_id
            }
            _ => u64::from(wc.imm.unwrap_or(u32::MAX)),
        };
        if d.kind != Kind::Send && wc.wr_id != d.notified {
            // RC consumes receives in the order they were posted.
            self.violations.push(format!(
                "notification {i} landed in receive {}, receive {} expected",
                wc.wr_id, d.notified
            ));
        }
        if i != d.notified {
            self.violations.push(format!(
                "notification {i} observed, {} expected",
                d.notified
            ));
        }
        let dst = d.dst(i.min(MAX_ITERATIONS - 1));
        let dir = d.index();
        let buf = &s.host(!d.from_a).buf;
        let mut got = vec![0u8; SLOT];
        buf.read(dst, &mut got);
        if got != pattern(dir, i) {
            self.violations
                .push(format!("notification {i} observed before its data"));
        }
        buf.write(dst, &[MARKER; SLOT]);
        d.notified += 1;
        if d.credits {
            let dir = d.index();
            self.post_credits(s, dir);
        }
    }

    /// Hands slots back: one credit per notification seen, each the count so far, inline,
    /// into the sender's credit word. A credit the receiver's send queue has no room for
    /// waits for the next step, as an application retries a post refused with ENOMEM: the
    /// sender's window is bounded by its own completions, so one catching up after a stall can
    /// run ahead of credits whose completions a delay holds back (seed 2229 of 10,000: 121
    /// credits outstanding in a send queue of 128).
    fn post_credits(&mut self, s: &mut Sim, dir: usize) {
        let d = &mut self.dirs[dir];
        while d.credits_posted < d.notified {
            let credit = d.credits_posted + 1;
            let word = credit.to_le_bytes();
            let remote = s.host(d.from_a).buf.remote(credit_word(dir));
            let wr = SendWr::inline(credit | CREDIT, SendOp::Write { remote }, &word).signaled();
            let receiver = s.host(!d.from_a);
            match receiver.qp.post_send(&wr) {
                Ok(()) => {
                    receiver.qp.ring_doorbell();
                    d.credits_posted = credit;
                    let wr = Posted {
                        signaled: true,
                        completions: 0,
                    };
                    self.posted.insert((!d.from_a, false, credit | CREDIT), wr);
                }
                Err(PostError::QueueFull { .. }) => break,
                Err(e) if receiver.qp.state() != pmd::resilient::ResilientState::Failed => {
                    self.violations
                        .push(format!("credit {credit} not posted: {e}"));
                    break;
                }
                Err(_) => break,
            }
        }
    }

    /// Every slot whose notification was observed still holds the marker: no data WRITE
    /// executed again after its notification.
    pub fn check_markers(&mut self, s: &mut Sim) {
        for d in &self.dirs {
            let buf = &s.host(!d.from_a).buf;
            for i in 0..d.notified {
                let mut got = vec![0u8; SLOT];
                buf.read(d.dst(i), &mut got);
                if got != [MARKER; SLOT] {
                    self.violations.push(format!(
                        "a data WRITE of iteration {i} executed again after its notification"
                    ));
                }
            }
            if d.credits && d.finished() {
                // The last credit landed last (a re-sent older one comes before it, in order).
                let mut word = [0u8; 8];
                s.host(d.from_a).buf.read(credit_word(d.index()), &mut word);
                let credit = u64::from_le_bytes(word);
                if credit != d.total {
                    self.violations.push(format!(
                        "the credit word holds {credit}, {} notifications were seen",
                        d.total
                    ));
                }
            }
        }
    }

    /// All directions finished.
    pub fn finished(&self) -> bool {
        self.dirs.iter().all(Dir::finished)
    }
}

fn host_name(a: bool) -> &'static str {
    if a {
        "A"
    } else {
        "B"
    }
}

/// NCCL-Simple-like traffic from A to B, checked by B.
pub fn nccl(sim: &Sim, total: u64) -> Traffic {
    Traffic::new(vec![Dir::new(true, total)], sim.now())
}

/// One step of the traffic; true when it finished or went wrong.
pub fn step(t: &mut Traffic, s: &mut Sim) -> bool {
    t.step(s);
    !t.violations.is_empty() || t.finished()
}

/// The traffic finished with every marker found and no violation.
pub fn assert_clean(t: &mut Traffic, s: &mut Sim) {
    t.check_markers(s);
    t.check_exactly_once(s, Duration::from_secs(1));
    assert!(t.violations.is_empty(), "{:#?}", t.violations);
    assert!(t.finished(), "{:?}", t.dirs);
}
