//! `shift_allreduce`: N ranks run a ring allreduce of float32 buffers the way NCCL's Simple
//! protocol moves data, and verify every iteration's result.
//!
//! Ranks and the ring: rank 0 is the process started without a host (it waits on `-p`); every
//! other rank is started with rank 0's address and `--ranks N` on all of them. Rank 0 takes
//! N - 1 connections, numbers the ranks in the order they connect, collects each rank's two QPs
//! (one that sends to the next rank, one that receives from the previous) and hands each rank
//! its neighbours' attributes (a `ring` message). With 2 ranks this is exactly the tools'
//! server/client convention.
//!
//! Each iteration fills the buffer (element i of rank r is `(r + 1) * (i % 7 + 1) + k % 5`
//! in iteration k: small integers, so every sum is exact in float32), runs N - 1
//! reduce-scatter and N - 1 allgather steps, and checks every element against the expected
//! sum. A step moves one chunk (1/N of the buffer): bulk RDMA WRITEs into a staging slot of
//! the next rank, then a zero-length WRITE_WITH_IMM notification whose immediate is the step's
//! sequence number (bit 31: "this is the last iteration"). The receiver reduces or copies the
//! slot into its buffer and hands the slot back with an 8-byte inline WRITE of its consumed
//! count into the sender's credit word, as NCCL's receiver returns its head. Rank 0 decides
//! which iteration is the last (`-n` or `-D`) and the flag travels around the ring with the
//! notifications, so all ranks stop after the same iteration.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use pmd::{QpCaps, RecvWr, SendOp, SendWr, WcOpcode, WorkCompletion};

use crate::bw::completion_error;
use crate::cli::Options;
use crate::endpoint::{agree_mtu, mtu_of, Conn, Host, Memory};
use crate::error::AppError;
use crate::exchange::{self, Channel, ExchangeError, Hello, Msg, QpInfo, RingPlace};
use crate::outcome::{base_report, RunOutcome};
use crate::report::{self, CheckJson, FailoverJson, Report, ResultRow, Timeline, RULE};
use crate::session::{device_options, params, Idle, Length, PEER_TIMEOUT};
use crate::wall_clock;

/// Staging slots per ring edge.
const SLOTS: u64 = 4;
/// Receives kept posted for notifications.
const RECVS: u64 = 64;
/// No progress for this long means a rank or the path is gone.
const STALL: Duration = Duration::from_secs(20);
/// wr_id of credit WRITEs.
const CREDIT_WR: u64 = u64::MAX;
/// Bit 31 of an immediate: the sender knows this iteration is the last.
const LAST: u32 = 1 << 31;

/// Where things are in every rank's buffer (the same on all ranks).
#[derive(Debug, Clone, Copy)]
struct Layout {
    size: usize,
    count: usize,
    ranks: usize,
    chunk_elems: usize,
    staging: usize,
    credit: usize,
    len: usize,
}

impl Layout {
    fn new(size: usize, ranks: usize) -> Layout {
        let count = size / 4;
        let chunk_elems = count.div_ceil(ranks);
        let staging = size.next_multiple_of(64);
        let credit = staging + SLOTS as usize * chunk_elems * 4;
        Layout {
            size,
            count,
            ranks,
            chunk_elems,
            staging,
            credit,
            len: credit + 64,
        }
    }

    /// Byte offset and length of chunk `j` in the data region.
    fn chunk(&self, j: usize) -> (usize, usize) {
        let start = (j * self.chunk_elems).min(self.count);
        let end = ((j + 1) * self.chunk_elems).min(self.count);
        (start * 4, (end - start) * 4)
    }

    fn slot(&self, q: u64) -> usize {
        self.staging + (q % SLOTS) as usize * self.chunk_elems * 4
    }
}

/// The value rank `r` contributes at element `i` in iteration `k`.
fn contribution(r: usize, i: usize, k: u64) -> f32 {
    ((r + 1) * (i % 7 + 1) + (k % 5) as usize) as f32
}

/// The sum over `ranks` ranks at element `i` in iteration `k`.
fn expected(ranks: usize, i: usize, k: u64) -> f32 {
    ((i % 7 + 1) * ranks * (ranks + 1) / 2 + ranks * (k % 5) as usize) as f32
}

/// Why the ring stopped early.
enum Stop {
    /// This rank's own error.
    Error(AppError),
    /// Another rank stopped or went away.
    PeerGone(String),
}

impl From<AppError> for Stop {
    fn from(e: AppError) -> Stop {
        Stop::Error(e)
    }
}

/// One rank: its two QPs, its buffer, its devices and its out-of-band connections. Fields
/// drop in order: QPs, memory, devices.
struct Rank {
    send: Conn,
    recv: Conn,
    mem: Memory,
    host: Host,
    /// Rank 0: one per other rank, in rank order; others: the one to rank 0.
    chans: Vec<Channel>,
    /// Rank 0: which ranks already said `Done` (read while watching them, not lost).
    done_from: Vec<bool>,
    place: RingPlace,
    layout: Layout,
    mtu: pmd::Mtu,
    /// Notifications received, not yet processed: immediates.
    arrived: VecDeque<u32>,
    /// Notifications (signaled WRITE_IMMs) completed on the send QP.
    sent_done: u64,
    credits_posted: u64,
    credits_done: u64,
    recvs_posted: u64,
    errors: u64,
    check: CheckJson,
    scratch_a: Vec<u8>,
    scratch_b: Vec<u8>,
}

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 64,
        max_recv_wr: RECVS as u32 * 2,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 16,
    }
}

impl Rank {
    fn establish(o: &Options) -> Result<Rank, AppError> {
        let ranks = o.flags.ranks as usize;
        let host = Host::open(&device_options(o))?;
        let layout = Layout::new(o.sizes[0], ranks);
        let mem = host.alloc(layout.len)?;
        let mut send = host.create_qp(caps())?;
        let mut recv = host.create_qp(caps())?;
        let wanted = match o.flags.mtu {
            Some(m) => mtu_of(m).expect("checked by the flags"),
            None => host.active_mtu(),
        };
        let send_info = send.local_info(host.gid(), pmd::random_psn(), &mem, wanted)?;
        let recv_info = recv.local_info(host.gid(), pmd::random_psn(), &mem, wanted)?;
        let hello = Hello::new(params(o), vec![send_info.clone(), recv_info.clone()]);
        let (chans, place) = match &o.flags.host {
            None => coordinate(o, &hello, ranks, &send_info, &recv_info)?,
            Some(server) => {
                let mut ch = exchange::connect(server, o.flags.port)?;
                ch.handshake(&hello, PEER_TIMEOUT)?;
                let place = match ch.recv(PEER_TIMEOUT)? {
                    Msg::Ring(p) => p,
                    Msg::Abort { error } => return Err(ExchangeError::PeerAborted(error).into()),
                    other => {
                        return Err(ExchangeError::Unexpected {
                            expected: "ring",
                            got: format!("{other:?}"),
                        }
                        .into())
                    }
                };
                (vec![ch], place)
            }
        };
        // Offsets into both neighbours' buffers come from the lengths they sent.
        place.next.check_buffer(layout.len)?;
        place.prev.check_buffer(layout.len)?;
        let mtu = agree_mtu(wanted, place.next.mtu.min(place.prev.mtu));
        let mut rank = Rank {
            send: {
                send.bring_up(&send_info, &place.next, mtu, o.flags.qp_timeout)?;
                send
            },
            recv: {
                recv.bring_up(&recv_info, &place.prev, mtu, o.flags.qp_timeout)?;
                recv
            },
            mem,
            host,
            done_from: vec![false; chans.len()],
            chans,
            place,
            layout,
            mtu,
            arrived: VecDeque::new(),
            sent_done: 0,
            credits_posted: 0,
            credits_done: 0,
            recvs_posted: 0,
            errors: 0,
            check: CheckJson {
                enabled: true,
                ..CheckJson::default()
            },
            scratch_a: Vec::new(),
            scratch_b: Vec::new(),
        };
        while rank.recvs_posted < RECVS {
            rank.recv.post_recv(&RecvWr::new(rank.recvs_posted, &[]))?;
            rank.recvs_posted += 1;
        }
        rank.send.wait_protected()?;
        rank.recv.wait_protected()?;
        rank.barrier()?;
        Ok(rank)
    }

    /// Every rank's QPs are up: ranks send `ready` to rank 0, which answers `go` to all.
    fn barrier(&mut self) -> Result<(), AppError> {
        if self.place.rank == 0 {
            for ch in &mut self.chans {
                ch.expect_ready(PEER_TIMEOUT)?;
            }
            for ch in &mut self.chans {
                ch.send(&Msg::Go)?;
            }
        } else {
            let ch = &mut self.chans[0];
            ch.send(&Msg::Ready)?;
            match ch.recv(PEER_TIMEOUT)? {
                Msg::Go => {}
                Msg::Abort { error } => return Err(ExchangeError::PeerAborted(error).into()),
                other => {
                    return Err(ExchangeError::Unexpected {
                        expected: "go",
                        got: format!("{other:?}"),
                    }
                    .into())
                }
            }
        }
        Ok(())
    }

    /// Polls both QPs and the out-of-band connections once; true if anything happened.
    fn pump(&mut self, wcs: &mut [WorkCompletion]) -> Result<bool, Stop> {
        let mut moved = false;
        let n = self.send.poll(wcs);
        for wc in &wcs[..n] {
            if !wc.is_ok() {
                self.errors += 1;
                return Err(Stop::Error(completion_error(
                    &self.send,
                    wc,
                    "a step's WRITE",
                )));
            }
            self.sent_done = self.sent_done.max(wc.wr_id + 1);
        }
        moved |= n > 0;
        let n = self.recv.poll(wcs);
        for wc in &wcs[..n] {
            if !wc.is_ok() {
                self.errors += 1;
                return Err(Stop::Error(completion_error(
                    &self.recv,
                    wc,
                    "a notification or credit",
                )));
            }
            match wc.opcode {
                WcOpcode::RecvRdmaWithImm => {
                    self.arrived.push_back(wc.imm.unwrap_or(0));
                    self.recv
                        .post_recv(&RecvWr::new(self.recvs_posted, &[]))
                        .map_err(AppError::from)?;
                    self.recvs_posted += 1;
                }
                WcOpcode::RdmaWrite if wc.wr_id == CREDIT_WR => self.credits_done += 1,
                _ => {}
            }
        }
        moved |= n > 0;
        Ok(moved)
    }

    fn watch_peers(&mut self) -> Result<(), Stop> {
        for (i, ch) in self.chans.iter_mut().enumerate() {
            let who = if self.place.rank == 0 {
                format!("rank {}", i + 1)
            } else {
                "rank 0".to_owned()
            };
            match ch.try_recv() {
                Ok(None) => {}
                // A rank that finished before us: `finish` must not wait for it again.
                Ok(Some(Msg::Done { .. })) => self.done_from[i] = true,
                Ok(Some(Msg::Abort { error })) => {
                    return Err(Stop::PeerGone(format!("{who} stopped: {error}")))
                }
                Ok(Some(other)) => {
                    return Err(Stop::PeerGone(format!("{who} sent {other:?} mid-run")))
                }
                Err(_) => return Err(Stop::PeerGone(format!("{who} went away"))),
            }
        }
        Ok(())
    }

    /// Polls until `done` says so, watching the peers; stalls and peers that leave stop it.
    fn wait(
        &mut self,
        idle: &mut Idle,
        wcs: &mut [WorkCompletion],
        mut done: impl FnMut(&Rank) -> bool,
    ) -> Result<(), Stop> {
        let since = Instant::now();
        let mut next_watch = since;
        loop {
            if done(self) {
                return Ok(());
            }
            let moved = self.pump(wcs)?;
            if moved {
                idle.busy();
                continue;
            }
            let now = Instant::now();
            if now >= next_watch {
                self.watch_peers()?;
                next_watch = now + Duration::from_millis(2);
                if now.duration_since(since) > STALL {
                    return Err(Stop::Error(AppError::Stalled(STALL)));
                }
            }
            idle.idle();
        }
    }

    fn credit(&self) -> u64 {
        self.mem.read_u64(self.layout.credit)
    }

    fn fill(&mut self, k: u64) {
        let l = self.layout;
        self.scratch_a.clear();
        for i in 0..l.count {
            self.scratch_a
                .extend_from_slice(&contribution(self.place.rank as usize, i, k).to_le_bytes());
        }
        self.mem.write(0, &self.scratch_a);
    }

    fn verify(&mut self, k: u64) -> u64 {
        let l = self.layout;
        self.scratch_a.resize(l.count * 4, 0);
        self.mem.read(0, &mut self.scratch_a);
        let bad = self
            .scratch_a
            .chunks_exact(4)
            .enumerate()
            .filter(|(i, b)| {
                f32::from_le_bytes([b[0], b[1], b[2], b[3]]) != expected(l.ranks, *i, k)
            })
            .count() as u64;
        self.check.bytes_checked += l.size as u64;
        self.check.errors += bad * 4;
        bad
    }

    /// Sends chunk `j` as step `q` (data WRITEs, then the notification).
    fn send_step(&mut self, q: u64, j: usize, last: bool) -> Result<(), AppError> {
        let (off, len) = self.layout.chunk(j);
        let remote = |offset: usize, p: &RingPlace| pmd::Remote {
            addr: p.next.addr + offset as u64,
            rkey: p.next.rkey,
        };
        let slot = self.layout.slot(q);
        if len > 0 {
            let op = SendOp::Write {
                remote: remote(slot, &self.place),
            };
            self.send
                .post_send(&SendWr::new(q, op, &[self.mem.sge(off, len as u32)]))?;
        }
        let imm = (q as u32 & !LAST) | if last { LAST } else { 0 };
        let op = SendOp::WriteImm {
            remote: remote(slot, &self.place),
            imm,
        };
        self.send.post_send(&SendWr::new(q, op, &[]).signaled())?;
        self.send.ring();
        Ok(())
    }

    /// Takes step `q`'s data into chunk `j`: added (reduce-scatter) or copied (allgather).
    fn take_step(&mut self, q: u64, j: usize, reduce: bool) -> Result<(), AppError> {
        let (off, len) = self.layout.chunk(j);
        let slot = self.layout.slot(q);
        self.scratch_b.resize(len, 0);
        self.mem.read(slot, &mut self.scratch_b);
        if reduce {
            self.scratch_a.resize(len, 0);
            self.mem.read(off, &mut self.scratch_a);
            for (a, b) in self
                .scratch_a
                .chunks_exact_mut(4)
                .zip(self.scratch_b.chunks_exact(4))
            {
                let sum = f32::from_le_bytes([a[0], a[1], a[2], a[3]])
                    + f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                a.copy_from_slice(&sum.to_le_bytes());
            }
            self.mem.write(off, &self.scratch_a);
        } else {
            self.mem.write(off, &self.scratch_b);
        }
        // Hand the slot back: our consumed count into the previous rank's credit word.
        let op = SendOp::Write {
            remote: pmd::Remote {
                addr: self.place.prev.addr + self.layout.credit as u64,
                rkey: self.place.prev.rkey,
            },
        };
        let count = (q + 1).to_ne_bytes();
        self.recv
            .post_send(&SendWr::inline(CREDIT_WR, op, &count).signaled())?;
        self.recv.ring();
        self.credits_posted += 1;
        Ok(())
    }

    /// Runs iterations until rank 0's last one; returns how many completed.
    fn run(&mut self, o: &Options, timeline: &mut Timeline) -> (u64, Option<Stop>) {
        let mut idle = Idle::new(o.flags.poll, &self.host);
        self.send.set_waker(idle.unparker());
        self.recv.set_waker(idle.unparker());
        let mut wcs = [WorkCompletion::EMPTY; 32];
        let length = Length::of(o);
        let n = self.layout.ranks;
        let r = self.place.rank as usize;
        let steps = 2 * (n as u64 - 1);
        let start = timeline.start();
        let bytes_per_iter: u64 = (0..steps)
            .map(|s| {
                let j = send_chunk(r, n, s as usize);
                self.layout.chunk(j).1 as u64
            })
            .sum();
        let mut q = 0u64;
        let mut k = 0u64;
        loop {
            let mut last = r == 0 && !length.wants(k + 1, start, Instant::now());
            self.fill(k);
            for s in 0..steps as usize {
                let step = q;
                if let Err(e) = self.wait(&mut idle, &mut wcs, |me| me.credit() + SLOTS > step) {
                    return (k, Some(e));
                }
                if let Err(e) = self.send_step(q, send_chunk(r, n, s), last) {
                    return (k, Some(Stop::Error(e)));
                }
                if let Err(e) = self.wait(&mut idle, &mut wcs, |me| !me.arrived.is_empty()) {
                    return (k, Some(e));
                }
                let imm = self.arrived.pop_front().expect("waited for it");
                self.check.notifications_checked += 1;
                if imm & !LAST != q as u32 & !LAST {
                    self.check.notification_errors += 1;
                    let e = AppError::Check(format!(
                        "rank {r}: step {q} got notification {} instead",
                        imm & !LAST
                    ));
                    return (k, Some(Stop::Error(e)));
                }
                last |= imm & LAST != 0;
                let reduce = s < n - 1;
                if let Err(e) = self.take_step(q, recv_chunk(r, n, s), reduce) {
                    return (k, Some(Stop::Error(e)));
                }
                q += 1;
            }
            // Every WRITE of the iteration done before the buffer is refilled.
            let (sent, credits) = (q, self.credits_posted);
            if let Err(e) = self.wait(&mut idle, &mut wcs, |me| {
                me.sent_done >= sent && me.credits_done >= credits
            }) {
                return (k, Some(e));
            }
            let bad = self.verify(k);
            if bad > 0 {
                let e = AppError::Check(format!(
                    "iteration {k}: {bad} of {} elements differ from the expected sum",
                    self.layout.count
                ));
                return (k, Some(Stop::Error(e)));
            }
            k += 1;
            let (send, recv) = (&self.send, &self.recv);
            timeline.tick(Instant::now(), k * bytes_per_iter, k, self.errors, || {
                crate::endpoint::worst_state([send.state(false), recv.state(false)].into_iter())
            });
            if last {
                return (k, None);
            }
        }
    }

    /// The end: ranks tell rank 0, rank 0 waits for all and says goodbye, so no rank tears
    /// its QPs down while a neighbour still uses them.
    fn finish(&mut self, iterations: u64) {
        if self.place.rank == 0 {
            for (ch, &done) in self.chans.iter_mut().zip(&self.done_from) {
                if done {
                    continue;
                }
                loop {
                    match ch.recv(Duration::from_secs(10)) {
                        Ok(Msg::Done { .. }) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
            }
            for ch in &mut self.chans {
                let _ = ch.send(&Msg::Bye);
            }
        } else {
            let ch = &mut self.chans[0];
            if ch
                .send(&Msg::Done {
                    iterations,
                    rows: Vec::new(),
                })
                .is_ok()
            {
                let _ = ch.recv(Duration::from_secs(10));
            }
        }
    }

    fn abort(&mut self, error: &str) {
        for ch in &mut self.chans {
            let _ = ch.send(&Msg::Abort {
                error: error.to_owned(),
            });
            ch.close();
        }
    }
}

/// The chunk rank `r` of `n` sends at step `s`.
fn send_chunk(r: usize, n: usize, s: usize) -> usize {
    if s < n - 1 {
        (r + n - s % n) % n
    } else {
        (r + 1 + n - (s - (n - 1)) % n) % n
    }
}

/// The chunk rank `r` of `n` receives at step `s`.
fn recv_chunk(r: usize, n: usize, s: usize) -> usize {
    if s < n - 1 {
        (r + 2 * n - s - 1) % n
    } else {
        (r + n - (s - (n - 1)) % n) % n
    }
}

/// Rank 0's side of setup: take N - 1 ranks, hand out the ring.
fn coordinate(
    o: &Options,
    hello: &Hello,
    ranks: usize,
    send_info: &QpInfo,
    recv_info: &QpInfo,
) -> Result<(Vec<Channel>, RingPlace), AppError> {
    let listener = exchange::listen(o.flags.port)?;
    exchange::print_waiting();
    let mut chans = Vec::new();
    let mut infos = vec![(send_info.clone(), recv_info.clone())];
    for r in 1..ranks {
        let mut ch = exchange::accept(&listener)?;
        let theirs = ch.handshake(hello, PEER_TIMEOUT)?;
        let [s, v] = <[QpInfo; 2]>::try_from(theirs.qps)
            .map_err(|q| AppError::Peer(format!("rank {r} sent {} QPs instead of 2", q.len())))?;
        infos.push((s, v));
        chans.push(ch);
    }
    let place = |r: usize| RingPlace {
        rank: r as u32,
        ranks: ranks as u32,
        next: infos[(r + 1) % ranks].1.clone(),
        prev: infos[(r + ranks - 1) % ranks].0.clone(),
    };
    for (i, ch) in chans.iter_mut().enumerate() {
        ch.send(&Msg::Ring(place(i + 1)))?;
    }
    Ok((chans, place(0)))
}

/// Runs `shift_allreduce`.
pub fn run(o: &Options) -> Result<RunOutcome, AppError> {
    let mut rank = Rank::establish(o)?;
    if let Some(core) = o.flags.cpu {
        crate::session::pin(core)?;
    }
    print_header(o, &rank);
    let mut timeline = Timeline::new(o.flags.timeline_ms, true);
    let (iterations, stop) = rank.run(o, &mut timeline);
    let secs = timeline.start().elapsed().as_secs_f64().max(1e-9);
    let (error, peer_gone) = match stop {
        None => {
            rank.finish(iterations);
            (None, None)
        }
        Some(Stop::Error(e)) => {
            rank.abort(&e.to_string());
            (Some(e), None)
        }
        // A rank whose ring broke elsewhere did not finish either; only rank 0 (the server
        // of the tools' convention) reports just its own side's errors.
        Some(Stop::PeerGone(why)) if rank.place.rank != 0 => {
            rank.abort(&why);
            (Some(AppError::Peer(why)), None)
        }
        Some(Stop::PeerGone(why)) => {
            rank.abort(&why);
            (None, Some(why))
        }
    };
    let n = rank.layout.ranks as u64;
    let sent = iterations * 2 * (n - 1) * (rank.layout.size as u64 / n);
    let avg = sent as f64 * 8.0 / secs / 1e9;
    let row = ResultRow {
        size: rank.layout.size,
        iterations,
        bw_peak_gbps: timeline.peak_gbps().unwrap_or(avg).max(avg),
        bw_avg_gbps: avg,
        msg_rate_mpps: iterations as f64 / secs / 1e6,
        duration_s: secs,
        latency: None,
    };
    println!(
        " Ring allreduce: rank {} of {}, {} float32 per rank, {} iterations, {:.1} iterations/s; bandwidth counts the bytes this rank sent",
        rank.place.rank,
        n,
        rank.layout.count,
        iterations,
        iterations as f64 / secs
    );
    let c = &rank.check;
    println!(
        " Data check: {} bytes and {} notifications checked, {} bad bytes, {} notification errors",
        c.bytes_checked, c.notifications_checked, c.errors, c.notification_errors
    );
    if let Some(why) = &peer_gone {
        println!(" Stopped early: {why}");
    }
    let mut report: Report = base_report(o);
    report.role = if rank.place.rank == 0 {
        "server"
    } else {
        "client"
    }
    .to_owned();
    report.mtu = rank.mtu.bytes();
    report.qps = 2;
    report.set_results(vec![row.clone()]);
    report.iterations_per_s = Some(iterations as f64 / secs);
    report.rank = Some(rank.place.rank);
    report.ranks = Some(rank.place.ranks);
    let start_unix_ms = timeline
        .samples
        .first()
        .map_or(wall_clock::unix_ms_now() - secs * 1e3, |s| {
            s.unix_ms - s.t_ms
        });
    let mut fo = FailoverJson::new(rank.send.stats(), rank.send.events(), start_unix_ms);
    fo.merge(FailoverJson::new(
        rank.recv.stats(),
        rank.recv.events(),
        start_unix_ms,
    ));
    fo.print(rank.host.is_resilient());
    // perftest's table comes last, so a script that reads the last rows finds the result.
    println!("{RULE}");
    println!("{}", report::bw_header(o.flags.report_gbits));
    println!("{}", report::bw_row(&row, o.flags.report_gbits));
    println!("{RULE}");
    report.failover = fo;
    report.timeline = timeline.samples;
    report.check = Some(rank.check.clone());
    report.error = error.as_ref().map(|e| e.to_string());
    if let Some(path) = &o.flags.json {
        report.write(path)?;
    }
    drop(rank);
    Ok(RunOutcome { report, error })
}

fn print_header(o: &Options, rank: &Rank) {
    crate::session::print_title_and_devices(o);
    println!(
        " Rank            : {} of {}",
        rank.place.rank, rank.place.ranks
    );
    println!(
        " Buffer          : {} bytes ({} float32), chunks of {} elements, {} staging slots",
        rank.layout.size, rank.layout.count, rank.layout.chunk_elems, SLOTS
    );
    println!(" Mtu             : {}[B]", rank.mtu.bytes());
    println!("{RULE}");
    println!(
        " to next rank    : QPN {:#06x} -> remote QPN {:#06x} GID {}",
        rank.send.qpn(),
        rank.place.next.qpn,
        rank.place.next.gid
    );
    println!(
        " from prev rank  : QPN {:#06x} <- remote QPN {:#06x} GID {}",
        rank.recv.qpn(),
        rank.place.prev.qpn,
        rank.place.prev.gid
    );
    println!("{RULE}");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the schedule on plain vectors: every rank ends with the full sum.
    #[test]
    fn the_ring_schedule_reduces_and_gathers_every_chunk() {
        for n in 2..=5usize {
            let l = Layout::new(4 * 23, n);
            let mut data: Vec<Vec<f32>> = (0..n)
                .map(|r| (0..l.count).map(|i| contribution(r, i, 3)).collect())
                .collect();
            for s in 0..2 * (n - 1) {
                let sent: Vec<Vec<f32>> = (0..n)
                    .map(|r| {
                        let (off, len) = l.chunk(send_chunk(r, n, s));
                        data[r][off / 4..(off + len) / 4].to_vec()
                    })
                    .collect();
                for (r, d) in data.iter_mut().enumerate() {
                    let from = (r + n - 1) % n;
                    let j = recv_chunk(r, n, s);
                    assert_eq!(j, send_chunk(from, n, s), "n {n} step {s} rank {r}");
                    let (off, _) = l.chunk(j);
                    for (e, v) in sent[from].iter().enumerate() {
                        if s < n - 1 {
                            d[off / 4 + e] += v;
                        } else {
                            d[off / 4 + e] = *v;
                        }
                    }
                }
            }
            for (r, d) in data.iter().enumerate() {
                for (i, v) in d.iter().enumerate() {
                    assert_eq!(*v, expected(n, i, 3), "n {n} rank {r} element {i}");
                }
            }
        }
    }
}
