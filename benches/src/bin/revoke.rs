//! `revoke`: the two revocation figures for a resilient connection on softnic devices
//! of an in-process fabric (engine threads, no root, no network), against a plain QP's bare
//! teardown measured in the same run.
//!
//! Each repetition connects host A to host B (resilient: both NICs, protected; plain: one
//! QP), keeps `--window` 64-byte RDMA WRITEs from A to B's memory in flight, and after
//! `--warm` successful ones revokes B's grant, while A goes on writing as a peer that ignores
//! the revocation would (a new WRITE for every completion) until its first error:
//! - `revoke_us`: how long the revoke call takes (resilient: `Leases::revoke`, both QPs to
//!   ERR and the MR deregistered on both NICs; plain, the baseline: the QP to ERR and
//!   `Mr::deregister`, the bare "2ERR_QP + DESTROY_MKEY"); `ratio` is resilient /
//!   plain;
//! - `succeeded_after_revoke`: WRITEs posted after the revoke returned that completed
//!   successfully (the window a non-cooperating peer keeps succeeding; 0 is the contract),
//!   and `in_flight_succeeded`, those posted before it that completed successfully after it;
//! - `bytes_landed_after_revoke`: WRITEs posted after the revoke whose bytes are in B's
//!   memory (checked byte for byte; must be 0);
//! - `first_error_ms`: from the revoke's return to A's first error completion, and its
//!   status (the dataplane observation latency, reported as ~1.4 s on a ConnectX-5).
//!
//! Scenarios: `default` (revoked while the connection runs on the default NICs: A's retries
//! then run into a failover attempt, which B never answers), `fallback` (A's default link
//! is taken down first; the revoke comes while both ends run on the backup NICs). Transport
//! timeout 4 ms x 3 retries, failover handshake timeout 200 ms. Medians over `--reps`.
//!
//!     cargo run --release -p benches --bin revoke -- [--reps 5] [--json OUT]

use std::time::{Duration, Instant};

use benches::fabric::{caps, rtr, Fabric, A_BACKUP, A_DEFAULT, B_BACKUP, B_DEFAULT};
use clap::Parser;
use pmd::resilient::{
    Clock, FailoverService, Grant, LeaseId, Leases, ResilientConfig, ResilientContext, ResilientQp,
    ResilientState, RevokeOutcome, ServiceConfig,
};
use pmd::{Access, QpAttr, QpState, SendOp, SendWr, WcStatus, WorkCompletion};
use serde_json::json;

#[derive(Parser)]
#[command(about = "revoke latency and the non-cooperating peer's window")]
struct Args {
    /// Repetitions of each scenario.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// WRITEs A keeps in flight.
    #[arg(long, default_value_t = 16)]
    window: usize,
    /// Successful WRITEs before the revoke.
    #[arg(long, default_value_t = 2000)]
    warm: usize,
    /// Also write the JSON here.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

const BUF: usize = 1 << 20;
const SLOT: usize = 64;
const LIMIT: Duration = Duration::from_secs(20);

fn rts() -> QpAttr {
    let mut rts = QpAttr::rts(0);
    rts.timeout = Some(10);
    rts.retry_cnt = Some(3);
    rts
}

/// What one repetition measured.
#[derive(Debug, Clone, Default)]
struct Run {
    revoke: Duration,
    succeeded_after: u64,
    in_flight_succeeded: u64,
    landed_after: u64,
    first_error: Option<(Duration, WcStatus)>,
}

/// A's side of the traffic: which WRITEs were posted after the revoke, and what came back.
struct Writer {
    posted: u64,
    in_flight: usize,
    revoked_at: Option<(u64, Instant)>,
    ok_before: u64,
    run: Run,
}

impl Writer {
    fn new() -> Writer {
        Writer {
            posted: 0,
            in_flight: 0,
            revoked_at: None,
            ok_before: 0,
            run: Run::default(),
        }
    }

    /// WRITE number `n` goes to slot `n` of B's buffer; after the revoke its bytes are
    /// `0xee`, so any of them in B's memory landed after it.
    fn wr(&self, a: &pmd::RegisteredBuffer, remote: pmd::Remote) -> SendWr<'static> {
        let n = self.posted;
        let slot = (n as usize % (BUF / SLOT)) * SLOT;
        let mut remote = remote;
        remote.addr += slot as u64;
        let src = if self.revoked_at.is_some() {
            BUF / 2
        } else {
            0
        };
        SendWr::new(
            n,
            SendOp::Write { remote },
            &[a.sge(src % BUF, SLOT as u32)],
        )
        .signaled()
    }

    /// Takes completions; returns true when done (the first error after the revoke).
    fn take(&mut self, wcs: &[WorkCompletion]) -> bool {
        for wc in wcs {
            self.in_flight -= 1;
            match (self.revoked_at, wc.status) {
                (None, WcStatus::Success) => self.ok_before += 1,
                (None, s) => panic!("WRITE {} failed before the revoke: {s:?}", wc.wr_id),
                (Some((first_after, _)), WcStatus::Success) => {
                    if wc.wr_id >= first_after {
                        self.run.succeeded_after += 1;
                    } else {
                        self.run.in_flight_succeeded += 1;
                    }
                }
                (Some((_, at)), status) => {
                    if self.run.first_error.is_none() {
                        self.run.first_error = Some((at.elapsed(), status));
                    }
                }
            }
        }
        self.run.first_error.is_some()
    }
}

/// Counts the slots of `mem` that hold the post-revoke pattern.
fn landed(mem: *const u8) -> u64 {
    // SAFETY: `mem` is B's buffer of BUF bytes, held (revoked, not yet swept) by the caller.
    let bytes = unsafe { std::slice::from_raw_parts(mem, BUF) };
    bytes
        .chunks(SLOT)
        .filter(|s| s.iter().all(|b| *b == 0xee))
        .count() as u64
}

fn resilient_run(sa: &FailoverService, sb: &FailoverService, fallback: bool, args: &Args) -> Run {
    let f = Fabric::new();
    let config = ResilientConfig {
        handshake_timeout: Duration::from_millis(200),
        ..ResilientConfig::default()
    };
    let ctx_a = ResilientContext::new(
        f.open(A_DEFAULT),
        Some(f.open(A_BACKUP)),
        sa,
        config.clone(),
        None,
    );
    let ctx_b = ResilientContext::new(f.open(B_DEFAULT), Some(f.open(B_BACKUP)), sb, config, None);
    let (pd_a, pd_b) = (ctx_a.alloc_pd().unwrap(), ctx_b.alloc_pd().unwrap());
    let buf_a = pd_a.alloc_buffer(BUF, Access::ALL).unwrap();
    buf_a.write(BUF / 2, &[0xee; SLOT]);
    let buf_b = pd_b.alloc_buffer(BUF, Access::ALL).unwrap();
    let (mut qa, mut qb) = (
        pd_a.create_qp(caps()).unwrap(),
        pd_b.create_qp(caps()).unwrap(),
    );
    let ba = qa.rendezvous_blob(Duration::from_secs(10)).unwrap();
    let bb = qb.rendezvous_blob(Duration::from_secs(10)).unwrap();
    qa.connect_backup(&bb).unwrap();
    qb.connect_backup(&ba).unwrap();
    let ga = ctx_a.default_context().query_gid(0).unwrap();
    let gb = ctx_b.default_context().query_gid(0).unwrap();
    bring_up(&mut qa, gb, qb.qpn());
    bring_up(&mut qb, ga, qa.qpn());
    qb.wait_protected(Duration::from_secs(10)).unwrap();
    qa.wait_protected(Duration::from_secs(10)).unwrap();
    let remote = buf_b.remote(0);
    let mem_b = buf_b.as_ptr();
    let mut leases = Leases::new(Clock::real(), Duration::from_secs(3600));
    let id = leases.grant(qb, vec![Grant::Buffer(buf_b)]);
    if fallback {
        f.set_link(A_DEFAULT, false);
        let deadline = Instant::now() + LIMIT;
        let mut wcs = [WorkCompletion::EMPTY; 32];
        while !(qa.state() == ResilientState::Fallback
            && leases.qp(id).unwrap().state() == ResilientState::Fallback)
        {
            qa.poll(&mut wcs);
            leases.qp(id).unwrap().progress();
            assert!(Instant::now() < deadline, "no failover: {:?}", qa.state());
        }
    }
    let mut w = Writer::new();
    traffic(&mut w, args, &buf_a, remote, &mut qa, &mut leases, id);
    w.run.landed_after = landed(mem_b);
    drop(leases);
    w.run
}

fn bring_up(qp: &mut ResilientQp, peer: pmd::Gid, qpn: u32) {
    qp.modify(QpState::Init, &QpAttr::init(Access::ALL))
        .unwrap();
    qp.modify(QpState::Rtr, &rtr(peer, qpn)).unwrap();
    qp.modify(QpState::Rts, &rts()).unwrap();
}

/// The plain baseline: one QP per host, B's memory registered once; revoking is moving B's
/// QP to ERR and deregistering the MR.
fn plain_run(args: &Args) -> Run {
    let f = Fabric::new();
    let (ca, cb) = (f.open(A_DEFAULT), f.open(B_DEFAULT));
    let (pd_a, pd_b) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
    let buf_a = pd_a.alloc_buffer(BUF, Access::ALL).unwrap();
    buf_a.write(BUF / 2, &[0xee; SLOT]);
    let mem_b = pd_b.alloc_buffer(BUF, Access::LOCAL_WRITE).unwrap();
    // SAFETY: the buffer outlives the MR (dropped after it below).
    let mr_b = unsafe { pd_b.register(mem_b.as_ptr(), BUF, Access::ALL) }.unwrap();
    let (cq_a, cq_b) = (
        ca.create_cq(512, false).unwrap(),
        cb.create_cq(512, false).unwrap(),
    );
    let mut qa = pd_a.create_qp(&cq_a, &cq_a, caps()).unwrap();
    let mut qb = pd_b.create_qp(&cq_b, &cq_b, caps()).unwrap();
    let (ga, gb) = (ca.query_gid(0).unwrap(), cb.query_gid(0).unwrap());
    let (na, nb) = (qa.qpn(), qb.qpn());
    for (qp, g, n) in [(&mut qa, gb, nb), (&mut qb, ga, na)] {
        qp.modify(QpState::Init, &QpAttr::init(Access::ALL))
            .unwrap();
        qp.modify(QpState::Rtr, &rtr(g, n)).unwrap();
        qp.modify(QpState::Rts, &rts()).unwrap();
    }
    let remote = mr_b.remote(0);
    let handle_b = qb.handle();
    let mut mr_b = Some(mr_b);
    let mut w = Writer::new();
    let mut cq_a = cq_a;
    traffic_plain(&mut w, args, &buf_a, remote, &mut qa, &mut cq_a, &mut |w| {
        let t0 = Instant::now();
        handle_b.set_error().unwrap();
        mr_b.take().unwrap().deregister().unwrap();
        let t = t0.elapsed();
        w.revoked_at = Some((w.posted, Instant::now()));
        t
    });
    w.run.landed_after = landed(mem_b.as_ptr());
    w.run
}

/// Keeps the window full from a resilient QP (B's leased QP progressing too); revokes the
/// lease after `args.warm` successes.
fn traffic(
    w: &mut Writer,
    args: &Args,
    a: &pmd::RegisteredBuffer,
    remote: pmd::Remote,
    qa: &mut ResilientQp,
    leases: &mut Leases,
    id: LeaseId,
) {
    let deadline = Instant::now() + LIMIT;
    let mut wcs = [WorkCompletion::EMPTY; 32];
    loop {
        while w.in_flight < args.window {
            let wr = w.wr(a, remote);
            if qa.post_send(&wr).is_err() {
                break;
            }
            w.posted += 1;
            w.in_flight += 1;
        }
        qa.ring_doorbell();
        let n = qa.poll(&mut wcs);
        if w.take(&wcs[..n]) {
            return;
        }
        if let Some(q) = leases.qp(id) {
            q.progress();
        }
        if w.revoked_at.is_none() && w.ok_before >= args.warm as u64 {
            let t0 = Instant::now();
            let outcome = leases.revoke(id);
            w.run.revoke = t0.elapsed();
            assert_eq!(outcome, RevokeOutcome::TornDown);
            w.revoked_at = Some((w.posted, Instant::now()));
        }
        assert!(Instant::now() < deadline, "no error after the revoke");
    }
}

fn traffic_plain(
    w: &mut Writer,
    args: &Args,
    a: &pmd::RegisteredBuffer,
    remote: pmd::Remote,
    qa: &mut pmd::Qp,
    cq: &mut pmd::Cq,
    revoke: &mut dyn FnMut(&mut Writer) -> Duration,
) {
    let deadline = Instant::now() + LIMIT;
    let mut wcs = [WorkCompletion::EMPTY; 32];
    loop {
        while w.in_flight < args.window {
            let wr = w.wr(a, remote);
            if qa.post_send(&wr).is_err() {
                break;
            }
            w.posted += 1;
            w.in_flight += 1;
        }
        qa.ring_doorbell();
        let n = cq.poll(&mut wcs);
        if w.take(&wcs[..n]) {
            return;
        }
        if w.revoked_at.is_none() && w.ok_before >= args.warm as u64 {
            w.run.revoke = revoke(w);
        }
        assert!(Instant::now() < deadline, "no error after the revoke");
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn summary(runs: &[Run]) -> serde_json::Value {
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    json!({
        "revoke_us": median(runs.iter().map(|r| us(r.revoke)).collect()),
        "succeeded_after_revoke_max": runs.iter().map(|r| r.succeeded_after).max(),
        "in_flight_succeeded_max": runs.iter().map(|r| r.in_flight_succeeded).max(),
        "bytes_landed_after_revoke_max": runs.iter().map(|r| r.landed_after).max(),
        "first_error_ms": median(runs.iter().filter_map(|r| r.first_error).map(|(d, _)| d.as_secs_f64() * 1e3).collect()),
        "first_error_status": runs.iter().filter_map(|r| r.first_error).map(|(_, s)| format!("{s:?}")).collect::<std::collections::BTreeSet<_>>(),
    })
}

fn main() {
    let args = Args::parse();
    let sa = FailoverService::start(ServiceConfig::default()).expect("service A");
    let sb = FailoverService::start(ServiceConfig::default()).expect("service B");
    let reps = args.reps.max(1);
    let (mut plain, mut default, mut fallback) = (Vec::new(), Vec::new(), Vec::new());
    for rep in 0..reps {
        // Alternating order, so drift on a shared machine falls on all alike.
        if rep % 2 == 0 {
            plain.push(plain_run(&args));
            default.push(resilient_run(&sa, &sb, false, &args));
        } else {
            default.push(resilient_run(&sa, &sb, false, &args));
            plain.push(plain_run(&args));
        }
        fallback.push(resilient_run(&sa, &sb, true, &args));
    }
    let p = summary(&plain);
    let d = summary(&default);
    let fb = summary(&fallback);
    let ratio = |s: &serde_json::Value| {
        s["revoke_us"].as_f64().unwrap_or(f64::NAN) / p["revoke_us"].as_f64().unwrap_or(f64::NAN)
    };
    let out = json!({
        "revoke": {
            "plain": p,
            "resilient_default": d,
            "resilient_fallback": fb,
            "revoke_ratio_default": ratio(&d),
            "revoke_ratio_fallback": ratio(&fb),
        },
        "reps": reps,
        "window": args.window,
        "warm": args.warm,
        "device": "softnic on an in-process fabric (engine threads); timeout 4 ms x 3 retries, handshake 200 ms",
    });
    let text = serde_json::to_string_pretty(&out).expect("JSON");
    println!("{text}");
    if let Some(path) = &args.json {
        if let Err(e) = std::fs::write(path, &text) {
            eprintln!("revoke: writing {}: {e}", path.display());
            std::process::exit(1);
        }
    }
}
