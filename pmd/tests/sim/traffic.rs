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

use std::time::Duration;

use pmd::{RecvWr, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion};

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

/// One direction of traffic.
#[derive(Debug, Clone)]
pub struct Dir {
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
    start: Duration,
}

impl Dir {
    pub fn new(from_a: bool, total: u64) -> Dir {
        assert!(total <= MAX_ITERATIONS);
        Dir {
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

/// Traffic in one or two directions, and everything it found wrong.
#[derive(Debug)]
pub struct Traffic {
    pub dirs: Vec<Dir>,
    /// Violations of what the receiver depends on (never allowed).
    pub violations: Vec<String>,
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
        }
    }

    /// Posts what the windows and schedules allow, polls both hosts and checks what came.
    pub fn step(&mut self, s: &mut Sim) {
        let now = s.now();
        let mut wake: Option<Duration> = None;
        for d in &mut self.dirs {
            let receiver = s.host(!d.from_a);
            while d.recvs_posted < d.total && d.recvs_posted < d.notified + d.recv_window {
                if receiver
                    .qp
                    .post_recv(&RecvWr::new(d.recvs_posted, &[]))
                    .is_err()
                {
                    break;
                }
                d.recvs_posted += 1;
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
                let sender = s.host(d.from_a);
                sender.buf.write(src, &pattern(d.index(), i));
                let half = SLOT / 2;
                let mut ok = true;
                for k in 0..2 {
                    let remote = pmd::Remote {
                        addr: peer.addr + (dst + k * half) as u64,
                        rkey: peer.rkey,
                    };
                    let wr = SendWr::new(
                        i * 10 + k as u64,
                        SendOp::Write { remote },
                        &[sender.buf.sge(src + k * half, half as u32)],
                    );
                    ok &= sender.qp.post_send(&wr).is_ok();
                }
                let note = SendWr::new(
                    i * 10 + 9,
                    SendOp::WriteImm {
                        remote: peer,
                        imm: i as u32,
                    },
                    &[],
                )
                .signaled();
                ok &= sender.qp.post_send(&note).is_ok();
                rang = true;
                if !ok {
                    // The sender's QP failed: nothing more goes out.
                    d.refused += 1;
                    break;
                }
                d.posted += 1;
            }
            if rang {
                s.host(d.from_a).qp.ring_doorbell();
            }
        }
        s.wake_at = wake;
        for a in [true, false] {
            s.poll(a);
            let wcs: Vec<WorkCompletion> = s.host(a).wcs.drain(..).collect();
            for wc in wcs {
                self.completion(s, a, wc);
            }
        }
    }

    fn completion(&mut self, s: &mut Sim, a: bool, wc: WorkCompletion) {
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
        let i = u64::from(wc.imm.unwrap_or(u32::MAX));
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
            // Hand the slot back: the count, inline, into the sender's credit word.
            let word = d.notified.to_le_bytes();
            let remote = s.host(d.from_a).buf.remote(credit_word(dir));
            let wr =
                SendWr::inline(d.notified | CREDIT, SendOp::Write { remote }, &word).signaled();
            let receiver = s.host(!d.from_a);
            match receiver.qp.post_send(&wr) {
                Ok(()) => {
                    receiver.qp.ring_doorbell();
                    d.credits_posted += 1;
                }
                Err(e) if receiver.qp.state() != pmd::resilient::ResilientState::Failed => self
                    .violations
                    .push(format!("credit {} not posted: {e}", d.notified)),
                Err(_) => {}
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
