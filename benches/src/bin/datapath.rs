//! The datapath benchmark: what the driver costs per WQE and per CQE, on the soft provider.
//!
//! Two softnic devices on an in-memory fabric, manual progress, one QP pair. Only driver work
//! is timed: the devices run between timed regions (fetching WQEs, moving packets, writing
//! CQEs), never inside them, so the device's own processing is not counted as the driver's.
//!
//! - `post_single_ns`: one RDMA WRITE (one 8-byte SGE) posted and its doorbell rung, per WQE;
//! - `post_batch32_ns`: 32 WRITEs posted, then one doorbell, per WQE;
//! - `poll_ns`: CQEs already written by the device, polled 32 at a time, per CQE;
//! - `floor_copy64_ns`: copying a 64-byte WQE into the next slot of a ring, per copy: what
//!   writing one WQE costs at the very least, measured in the same run;
//! - `resilient_post_batch32_ns`, `resilient_poll_ns`: the same two loops through a
//!   `pmd::resilient::ResilientQp` (default and backup QP on four devices of the same fabric,
//!   protected, nothing failing); `resilient_bypass_post_batch32_ns`,
//!   `resilient_bypass_poll_ns`: the same loops on that QP's own default QP and CQ used
//!   directly, in alternating rounds (the same rings, so memory placement cannot tell the two
//!   apart); `overhead_post_ratio`, `overhead_poll_ratio`: the median over back-to-back round
//!   pairs of resilient over direct, the pair's order alternating (`*_best_ratio`: best round
//!   over best round); `resilient_vs_plain_*_ratio`: the resilient medians over the plain
//!   QP's, for reference. The plain
//!   QP pair above is no baseline for this: the same posting code on the resilient QP's own
//!   default QP measured 5-20% away from it (either way) on this machine, from where the
//!   rings and bookkeeping land in memory alone.
//!
//! - `shim_post_calls32_ns`, `shim_poll_ns`: the verbs shim's data path (`verbs/`), a QP pair
//!   on two plain shim devices of another fabric, posted 32 WRITEs to a list and polled 32 at
//!   a time through the `ibv_context_ops` function pointers, as `verbs.h`'s static inline
//!   `ibv_post_send` and `ibv_poll_cq` call them; `shim_direct_post_calls32_ns`,
//!   `shim_direct_poll_ns`: the same QP's pmd QP and CQ used directly (32 `post_send` calls and
//!   a doorbell; polls of 32), in alternating rounds; `overhead_shim_post_ratio`,
//!   `overhead_shim_poll_ratio`: the median over round pairs of shim over direct (as the
//!   resilient ones). The devices' helper threads are kept out (the benchmark runs the devices
//!   between timed regions, as everywhere here). Without `--no-instr` the same four
//!   measurements are also counted by callgrind (`shim_post_calls32_instr`,
//!   `shim_direct_post_calls32_instr`, `shim_poll_instr`, `shim_direct_poll_instr`, per WRITE
//!   and per CQE), with `overhead_shim_post_instr_ratio` and `overhead_shim_poll_instr_ratio`:
//!   the same ratios in instructions, which the machine's load does not move.
//!
//! Each figure is the median over rounds (the report's main keys) and the best round (the
//! `*_best_ns` keys beside them: the cost when no other process disturbs the core). Usage:
//! `cargo run --release -p benches --bin datapath -- [--json OUT.json] [--rounds N]`

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use benches::report::Report;
use pmd::provider::soft::register_fabric;
use pmd::provider::ProgressModel;
use pmd::resilient::{
    Clock, FailoverService, ResilientBuffer, ResilientConfig, ResilientContext, ResilientQp,
};
use pmd::{
    Access, AddressVector, Context, ContextConfig, Cq, Mtu, Qp, QpAttr, QpCaps, QpState, Remote,
    SendOp, SendWr, Sge, WorkCompletion,
};

/// WQEs per timed round.
const ROUND: usize = 512;
/// CQEs per timed poll round.
const POLL_ROUND: usize = 512;

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 512,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

fn open(name: &str) -> Arc<Context> {
    let config = ContextConfig {
        progress: ProgressModel::Manual,
        ..ContextConfig::default()
    };
    Context::open(name, &config).unwrap_or_else(|e| panic!("open {name}: {e}"))
}

fn fabric(ports: usize) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let name = format!("bench{}", N.fetch_add(1, Ordering::Relaxed));
    let fabric = softnic::Fabric::new(1, Duration::ZERO);
    for p in 0..ports {
        fabric.add_port(
            format!("198.18.{}.{}", p % 2, 1 + p / 2)
                .parse()
                .expect("address"),
        );
    }
    register_fabric(&name, &fabric);
    name
}

fn attrs(gid: pmd::Gid, qpn: u32) -> [(QpState, QpAttr); 3] {
    [
        (QpState::Init, QpAttr::init(Access::ALL)),
        (
            QpState::Rtr,
            QpAttr::rtr(AddressVector::to_gid(gid), qpn, 0, Mtu::Mtu4096),
        ),
        (QpState::Rts, QpAttr::rts(0)),
    ]
}

/// What the timed loops drive: a plain QP with its CQ, or a resilient QP.
trait Endpoint {
    fn post(&mut self, wr: &SendWr<'_>);
    /// Posts a batch with one call (`post_send_batch`).
    fn post_batch(&mut self, wrs: &[SendWr<'_>]);
    fn ring(&mut self);
    fn poll(&mut self, wcs: &mut [WorkCompletion]) -> usize;
    /// Completions written by the device and not polled yet.
    fn ready(&mut self) -> u32;
}

/// A plain QP and its CQ.
struct Plain {
    qp: Qp,
    cq: Cq,
}

impl Endpoint for Plain {
    #[inline(always)]
    fn post(&mut self, wr: &SendWr<'_>) {
        self.qp.post_send(wr).expect("post");
    }
    #[inline(always)]
    fn post_batch(&mut self, wrs: &[SendWr<'_>]) {
        self.qp.post_send_batch(wrs).expect("post");
    }
    #[inline(always)]
    fn ring(&mut self) {
        self.qp.ring_doorbell();
    }
    #[inline(always)]
    fn poll(&mut self, wcs: &mut [WorkCompletion]) -> usize {
        self.cq.poll(wcs)
    }
    fn ready(&mut self) -> u32 {
        self.cq.poller().ready()
    }
}

impl Endpoint for ResilientQp {
    #[inline(always)]
    fn post(&mut self, wr: &SendWr<'_>) {
        self.post_send(wr).expect("post");
    }
    #[inline(always)]
    fn post_batch(&mut self, wrs: &[SendWr<'_>]) {
        self.post_send_batch(wrs).expect("post");
    }
    #[inline(always)]
    fn ring(&mut self) {
        self.ring_doorbell();
    }
    #[inline(always)]
    fn poll(&mut self, wcs: &mut [WorkCompletion]) -> usize {
        ResilientQp::poll(self, wcs)
    }
    fn ready(&mut self) -> u32 {
        self.completions_waiting()
    }
}

/// The resilient QP's own default QP and CQ, used directly: the same rings without the
/// resilient layer, the baseline its overhead is measured against.
struct Bypass<'a> {
    qp: &'a mut Qp,
    cq: &'a mut Cq,
}

impl Endpoint for Bypass<'_> {
    #[inline(always)]
    fn post(&mut self, wr: &SendWr<'_>) {
        self.qp.post_send(wr).expect("post");
    }
    #[inline(always)]
    fn post_batch(&mut self, wrs: &[SendWr<'_>]) {
        self.qp.post_send_batch(wrs).expect("post");
    }
    #[inline(always)]
    fn ring(&mut self) {
        self.qp.ring_doorbell();
    }
    #[inline(always)]
    fn poll(&mut self, wcs: &mut [WorkCompletion]) -> usize {
        self.cq.poll(wcs)
    }
    fn ready(&mut self) -> u32 {
        self.cq.poller().ready()
    }
}

/// One measured endpoint and what keeps it working: the devices to run between timed
/// regions, its local buffer and the peer's, and whatever must stay alive (the peer side).
struct Bench<E> {
    a: E,
    devices: Vec<Arc<Context>>,
    local: Sge,
    remote: Remote,
    wcs: Vec<WorkCompletion>,
    _keep: Box<dyn std::any::Any>,
}

/// A plain QP pair on two devices.
fn plain() -> Bench<Plain> {
    let name = fabric(2);
    let side = |port| {
        let ctx = open(&format!("fabric:{name}/{port}"));
        let pd = ctx.alloc_pd().expect("alloc_pd");
        let cq = ctx
            .create_cq(4 * POLL_ROUND as u32, false)
            .expect("create_cq");
        let qp = pd.create_qp(&cq, &cq, caps()).expect("create_qp");
        let buf = pd.alloc_buffer(1 << 20, Access::ALL).expect("alloc_buffer");
        (ctx, Plain { qp, cq }, buf)
    };
    let (ca, mut a, buf_a) = side(0);
    let (cb, mut b, buf_b) = side(1);
    let (ga, gb) = (ca.query_gid(0).expect("gid"), cb.query_gid(0).expect("gid"));
    let (qa, qb) = (a.qp.qpn(), b.qp.qpn());
    for (to, attr) in attrs(gb, qb) {
        a.qp.modify(to, &attr).expect("bring-up");
    }
    for (to, attr) in attrs(ga, qa) {
        b.qp.modify(to, &attr).expect("bring-up");
    }
    Bench {
        a,
        devices: vec![ca, cb],
        local: buf_a.sge(0, 8),
        remote: buf_b.remote(0),
        wcs: vec![WorkCompletion::EMPTY; 64],
        _keep: Box::new((b, buf_a, buf_b)),
    }
}

/// A resilient QP pair: default and backup devices on each side, manual failover services
/// (stepped during setup only, so nothing runs beside the timed loops), protected.
fn resilient() -> Bench<ResilientQp> {
    let name = fabric(4);
    let host = |ports: [usize; 2]| {
        let clock = Clock::real();
        let service = FailoverService::manual(clock).expect("service");
        let d = open(&format!("fabric:{name}/{}", ports[0]));
        let b = open(&format!("fabric:{name}/{}", ports[1]));
        let ctx = ResilientContext::new(
            d.clone(),
            Some(b.clone()),
            &service,
            ResilientConfig::default(),
            None,
        );
        let pd = ctx.alloc_pd().expect("alloc_pd");
        let buf: ResilientBuffer = pd.alloc_buffer(1 << 20, Access::ALL).expect("alloc_buffer");
        let mut caps = caps();
        caps.max_recv_wr = (4 * POLL_ROUND as u32).saturating_sub(caps.max_send_wr) / 2;
        let qp = pd.create_qp(caps).expect("create_qp");
        (service, ctx, pd, buf, qp, [d, b])
    };
    let (sa, xa, pa, buf_a, mut a, da) = host([0, 1]);
    let (sb, xb, pb, buf_b, mut b, db) = host([2, 3]);
    let devices: Vec<Arc<Context>> = da.iter().chain(db.iter()).cloned().collect();
    let step = |devices: &[Arc<Context>]| {
        for d in devices {
            d.progress();
        }
        sa.run_once();
        sb.run_once();
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let blob = |qp: &ResilientQp| loop {
        if let Some(b) = qp.try_rendezvous_blob().expect("backup side") {
            return b;
        }
        step(&devices);
        assert!(Instant::now() < deadline, "no backup QP");
    };
    let (blob_a, blob_b) = (blob(&a), blob(&b));
    a.connect_backup(&blob_b).expect("rendezvous");
    b.connect_backup(&blob_a).expect("rendezvous");
    let (ga, gb) = (
        da[0].query_gid(0).expect("gid"),
        db[0].query_gid(0).expect("gid"),
    );
    let (qa, qb) = (a.qpn(), b.qpn());
    for (to, attr) in attrs(gb, qb) {
        a.modify(to, &attr).expect("bring-up");
    }
    for (to, attr) in attrs(ga, qa) {
        b.modify(to, &attr).expect("bring-up");
    }
    while !(a.is_protected() && b.is_protected()) {
        step(&devices);
        a.progress();
        b.progress();
        assert!(Instant::now() < deadline, "not protected after 10 s");
    }
    Bench {
        local: buf_a.sge(0, 8),
        remote: buf_b.remote(0),
        a,
        devices,
        wcs: vec![WorkCompletion::EMPTY; 64],
        _keep: Box::new((b, buf_a, buf_b, pa, pb, xa, xb, sa, sb)),
    }
}

impl Bench<ResilientQp> {
    /// Runs `round` on the same bench with the resilient QP's default QP and CQ used directly.
    fn bypass_round(&mut self, round: impl FnOnce(&mut Bench<Bypass<'_>>) -> f64) -> f64 {
        let (qp, cq) = self.a.bypass();
        let mut direct = Bench {
            a: Bypass { qp, cq },
            devices: self.devices.clone(),
            local: self.local,
            remote: self.remote,
            wcs: vec![WorkCompletion::EMPTY; 64],
            _keep: Box::new(()),
        };
        round(&mut direct)
    }
}

impl Bench<Plain> {
    fn local_page_size(&self) -> pmd::memory::PageSize {
        let keep = self
            ._keep
            .downcast_ref::<(Plain, pmd::RegisteredBuffer, pmd::RegisteredBuffer)>()
            .expect("a plain bench keeps its buffers");
        keep.1.page_size()
    }
}

impl<E: Endpoint> Bench<E> {
    /// WRITEs of 8 bytes each to distinct remote slots; only the last one signaled unless
    /// `signal_all`.
    fn writes(&self, n: usize, signal_all: bool) -> Vec<SendWr<'static>> {
        (0..n)
            .map(|i| {
                let remote = Remote {
                    addr: self.remote.addr + ((i % 4096) * 8) as u64,
                    rkey: self.remote.rkey,
                };
                let wr = SendWr::new(i as u64, SendOp::Write { remote }, &[self.local]);
                if signal_all || i == n - 1 {
                    wr.signaled()
                } else {
                    wr
                }
            })
            .collect()
    }

    fn run_devices(&self) {
        for d in &self.devices {
            d.progress();
        }
    }

    /// Runs the devices until `n` CQEs wait in the CQ (untimed).
    fn settle(&mut self, n: u32) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.a.ready() < n {
            self.run_devices();
            assert!(
                Instant::now() < deadline,
                "devices did not write {n} CQEs in 10 s"
            );
        }
    }

    /// Runs the devices and polls until `n` completions arrived, all successful (untimed).
    fn drain(&mut self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut got = 0;
        while got < n {
            self.run_devices();
            let k = self.a.poll(&mut self.wcs);
            for wc in &self.wcs[..k] {
                assert!(wc.is_ok(), "benchmark WRITE failed: {wc:?}");
            }
            got += k;
            assert!(
                Instant::now() < deadline,
                "only {got} of {n} completions in 10 s"
            );
        }
    }

    /// ns per WQE of one posting round of `ROUND` WRITEs, one doorbell per `batch`.
    fn post_round(&mut self, wrs: &[SendWr<'static>], batch: usize, api: Api) -> f64 {
        let start = Instant::now();
        measured(|| timed_posts(&mut self.a, wrs, batch, api));
        let ns = start.elapsed().as_nanos() as f64 / ROUND as f64;
        self.drain(1);
        ns
    }

    /// One round of `ROUND` WRITEs posted in batches of 32 without a doorbell inside the
    /// measured region (one doorbell after it): what writing WQEs costs alone. For the
    /// instruction count.
    fn post_only_round(&mut self, wrs: &[SendWr<'static>]) {
        measured(|| {
            for group in black_box(wrs).chunks(32) {
                self.a.post_batch(group);
            }
        });
        self.a.ring();
        self.drain(1);
    }

    /// ns per CQE of one polling round of `POLL_ROUND` CQEs already written.
    fn poll_round(&mut self, wrs: &[SendWr<'static>], wcs: &mut [WorkCompletion]) -> f64 {
        for batch in wrs.chunks(32) {
            for wr in batch {
                self.a.post(wr);
            }
            self.a.ring();
            // Keep the device's work out of the timed region below.
            let written = self.a.ready() + batch.len() as u32;
            self.settle(written);
        }
        let start = Instant::now();
        let got = measured(|| timed_polls(&mut self.a, wcs));
        let elapsed = start.elapsed().as_nanos() as f64;
        assert_eq!(
            got, POLL_ROUND,
            "the device had not written every CQE before polling"
        );
        black_box(&wcs);
        elapsed / got as f64
    }
}

/// A figure over rounds: the median (what the report's main keys carry) and the best round
/// (what the code costs when nothing else on the machine gets in its way).
#[derive(Debug, Clone, Copy)]
struct Figure {
    median: f64,
    best: f64,
}

impl Figure {
    fn of(mut samples: Vec<f64>) -> Figure {
        samples.sort_by(f64::total_cmp);
        Figure {
            median: samples[samples.len() / 2],
            best: samples[0],
        }
    }
}

/// The measured region of every round: out of line, so that callgrind
/// (`--toggle-collect='datapath::measured*'`) counts exactly what the clock times.
#[inline(never)]
fn measured<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// The timed posting loop.
#[inline(always)]
fn timed_posts<E: Endpoint>(qp: &mut E, wrs: &[SendWr<'static>], batch: usize, api: Api) {
    // The list is opaque to the compiler (it cannot specialise the posts to its contents);
    // each post then reads its request from memory, as an application's would.
    for group in black_box(wrs).chunks(batch) {
        match api {
            Api::Batch => qp.post_batch(group),
            Api::Calls => {
                for wr in group {
                    qp.post(wr);
                }
            }
        }
        qp.ring();
    }
}

/// How a group of work requests is posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    /// One `post_send_batch` call per group.
    Batch,
    /// One `post_send` call per work request.
    Calls,
}

/// The timed polling loop: polls until the CQ is empty; returns the completions polled.
#[inline(always)]
fn timed_polls<E: Endpoint>(qp: &mut E, wcs: &mut [WorkCompletion]) -> usize {
    let mut got = 0;
    loop {
        let k = qp.poll(black_box(&mut *wcs));
        if k == 0 {
            return got;
        }
        got += k;
    }
}

/// ns per WQE of posting rounds of `ROUND` WRITEs with one doorbell per `batch` of them.
fn post<E: Endpoint>(bench: &mut Bench<E>, rounds: usize, batch: usize, api: Api) -> Figure {
    let wrs = bench.writes(ROUND, false);
    Figure::of(
        (0..rounds)
            .map(|_| bench.post_round(&wrs, batch, api))
            .collect(),
    )
}

fn poll<E: Endpoint>(bench: &mut Bench<E>, rounds: usize) -> Figure {
    let wrs = bench.writes(POLL_ROUND, true);
    let mut wcs = [WorkCompletion::EMPTY; 32];
    Figure::of(
        (0..rounds)
            .map(|_| bench.poll_round(&wrs, &mut wcs))
            .collect(),
    )
}

/// A figure of the default QP used directly and the same figure through the resilient QP,
/// from rounds taken in alternation.
struct Compared {
    plain: Figure,
    resilient: Figure,
    /// The median over round pairs of resilient over direct: each pair ran back to back, so
    /// whatever else the machine did hit both of it alike.
    paired: f64,
}

impl Compared {
    fn of(plain: Vec<f64>, resilient: Vec<f64>) -> Compared {
        let ratios: Vec<f64> = plain.iter().zip(&resilient).map(|(p, r)| r / p).collect();
        Compared {
            paired: Figure::of(ratios).median,
            plain: Figure::of(plain),
            resilient: Figure::of(resilient),
        }
    }

    fn best_ratio(&self) -> f64 {
        self.resilient.best / self.plain.best
    }
}

/// Posting (batches of 32) and polling through the resilient QP and, in alternating rounds,
/// directly on its default QP and CQ: the same rings, so the ratio is what the resilient
/// layer itself costs.
fn compare(resilient: &mut Bench<ResilientQp>, rounds: usize) -> (Compared, Compared) {
    let wr = resilient.writes(ROUND, false);
    let (mut p, mut r) = (Vec::new(), Vec::new());
    // Which of a pair runs first alternates: whatever the first round of a pair pays (or
    // leaves warm for the second) falls on both sides alike.
    for i in 0..rounds {
        if i % 2 == 0 {
            p.push(resilient.bypass_round(|b| b.post_round(&wr, 32, Api::Batch)));
            r.push(resilient.post_round(&wr, 32, Api::Batch));
        } else {
            r.push(resilient.post_round(&wr, 32, Api::Batch));
            p.push(resilient.bypass_round(|b| b.post_round(&wr, 32, Api::Batch)));
        }
    }
    let post = Compared::of(std::mem::take(&mut p), std::mem::take(&mut r));
    let wr = resilient.writes(POLL_ROUND, true);
    let mut wcs = [WorkCompletion::EMPTY; 32];
    for i in 0..rounds / 2 + 1 {
        if i % 2 == 0 {
            p.push(resilient.bypass_round(|b| b.poll_round(&wr, &mut wcs)));
            r.push(resilient.poll_round(&wr, &mut wcs));
        } else {
            r.push(resilient.poll_round(&wr, &mut wcs));
            p.push(resilient.bypass_round(|b| b.poll_round(&wr, &mut wcs)));
        }
    }
    let poll = Compared::of(p, r);
    (post, poll)
}

fn floor_copy64(ctx: &Arc<Context>, rounds: usize) -> Figure {
    let slots = 4096usize;
    let ring = ctx.memory().alloc(slots * 64, 64).expect("ring");
    let wqe = [0x5au8; 64];
    let mut at = 0usize;
    let samples = (0..rounds * 4)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..ROUND {
                // SAFETY: `at < slots`, so the 64 bytes lie inside the ring block we own.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        black_box(wqe.as_ptr()),
                        ring.as_ptr().add(at * 64),
                        64,
                    );
                }
                at = (at + 1) & (slots - 1);
            }
            black_box(ring.as_ptr());
            start.elapsed().as_nanos() as f64 / ROUND as f64
        })
        .collect();
    Figure::of(samples)
}

/// Counts instructions (after the timed part, so valgrind's own work disturbs no timing),
/// prints them against their goals and adds them to the report.
fn instruction_report(report: &mut Report) {
    println!("instructions per operation, counted by callgrind in `measured` ({COUNTED_ROUNDS} rounds each):");
    let counts = match count_instructions() {
        Ok(c) => c,
        Err(e) => {
            println!("  not counted: {e}");
            report.text("instr_error", &e);
            return;
        }
    };
    let get = |what| counts.iter().find(|(c, _)| *c == what).map(|(_, v)| *v);
    for (what, per_op) in &counts {
        report.number(what.key(), *per_op);
    }
    let (Some(post32), Some(post_only)) = (get(Counting::Post32), get(Counting::PostOnly)) else {
        return;
    };
    // A batch is 32 posts and one doorbell: the doorbell is what the batch costs beyond them.
    let doorbell = (post32 - post_only) * 32.0;
    report.number("doorbell_instr", doorbell);
    let goal = |v: f64, g: f64| {
        if v <= g {
            format!("goal <= {g}: met")
        } else {
            format!("goal <= {g}: missed")
        }
    };
    let poll = get(Counting::Poll).unwrap_or(f64::NAN);
    println!(
        "  {:<44} {post32:>7.1}  {}",
        "post_instr (batches of 32 + doorbell, per WQE)",
        goal(post32, 60.0)
    );
    println!(
        "  {:<44} {post_only:>7.1}",
        "post_only_instr (per WQE, no doorbell)"
    );
    println!("  {:<44} {doorbell:>7.1}", "doorbell_instr (per doorbell)");
    println!(
        "  {:<44} {poll:>7.1}  {}",
        "poll_instr (per CQE, polls of 32)",
        goal(poll, 35.0)
    );
    for (layer, name, r, b) in [
        (
            "resilient",
            "post",
            Counting::ResilientPost32,
            Counting::BypassPost32,
        ),
        (
            "resilient",
            "poll",
            Counting::ResilientPoll,
            Counting::BypassPoll,
        ),
        ("shim", "post", Counting::ShimPost, Counting::ShimDirectPost),
        ("shim", "poll", Counting::ShimPoll, Counting::ShimDirectPoll),
    ] {
        if let (Some(r), Some(b)) = (get(r), get(b)) {
            let key = if layer == "shim" {
                format!("overhead_shim_{name}_instr_ratio")
            } else {
                format!("overhead_{name}_instr_ratio")
            };
            report.number(&key, r / b);
            println!(
                "  {:<44} {r:>7.1}  direct {b:.1}, ratio {:.3}",
                format!("{layer}_{name}_instr"),
                r / b
            );
        }
    }
}

struct Args {
    json: Option<PathBuf>,
    rounds: usize,
    /// Run as the instruction-counting child for this measurement only.
    count: Option<Counting>,
    /// Skip the instruction counts.
    no_instr: bool,
}

/// What one instruction-counting child (run under callgrind by the parent) measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Counting {
    /// Batches of 32 WRITEs (`post_send_batch`) and one doorbell each, on the plain QP:
    /// `post_instr`.
    Post32,
    /// 32 WRITEs posted one `post_send` call each, then one doorbell: `post_call_instr`.
    PostCalls32,
    /// WRITEs without their doorbell, on the plain QP: `post_only_instr`.
    PostOnly,
    /// CQEs polled 32 at a time, on the plain QP's CQ: `poll_instr`.
    Poll,
    /// `Post32` through the resilient QP.
    ResilientPost32,
    /// `Post32` on the resilient QP's own default QP used directly.
    BypassPost32,
    /// `Poll` through the resilient QP.
    ResilientPoll,
    /// `Poll` on the resilient QP's own default CQ used directly.
    BypassPoll,
    /// Lists of 32 WRITEs through the verbs shim's ops-table `post_send`.
    ShimPost,
    /// The same QP's pmd QP used directly: 32 `post_send` calls and a doorbell.
    ShimDirectPost,
    /// CQEs polled 32 at a time through the verbs shim's ops-table `poll_cq`.
    ShimPoll,
    /// The same CQ's pmd CQ polled directly, 32 at a time.
    ShimDirectPoll,
}

impl Counting {
    const ALL: [Counting; 12] = [
        Counting::Post32,
        Counting::PostCalls32,
        Counting::PostOnly,
        Counting::Poll,
        Counting::ResilientPost32,
        Counting::BypassPost32,
        Counting::ResilientPoll,
        Counting::BypassPoll,
        Counting::ShimPost,
        Counting::ShimDirectPost,
        Counting::ShimPoll,
        Counting::ShimDirectPoll,
    ];

    fn name(self) -> &'static str {
        match self {
            Counting::Post32 => "post32",
            Counting::PostCalls32 => "post-calls32",
            Counting::PostOnly => "post-only",
            Counting::Poll => "poll",
            Counting::ResilientPost32 => "resilient-post32",
            Counting::BypassPost32 => "bypass-post32",
            Counting::ResilientPoll => "resilient-poll",
            Counting::BypassPoll => "bypass-poll",
            Counting::ShimPost => "shim-post",
            Counting::ShimDirectPost => "shim-direct-post",
            Counting::ShimPoll => "shim-poll",
            Counting::ShimDirectPoll => "shim-direct-poll",
        }
    }

    /// The report key of its instructions per operation.
    fn key(self) -> &'static str {
        match self {
            Counting::Post32 => "post_instr",
            Counting::PostCalls32 => "post_call_instr",
            Counting::PostOnly => "post_only_instr",
            Counting::Poll => "poll_instr",
            Counting::ResilientPost32 => "resilient_post_instr",
            Counting::BypassPost32 => "resilient_bypass_post_instr",
            Counting::ResilientPoll => "resilient_poll_instr",
            Counting::BypassPoll => "resilient_bypass_poll_instr",
            Counting::ShimPost => "shim_post_calls32_instr",
            Counting::ShimDirectPost => "shim_direct_post_calls32_instr",
            Counting::ShimPoll => "shim_poll_instr",
            Counting::ShimDirectPoll => "shim_direct_poll_instr",
        }
    }

    fn parse(s: &str) -> Result<Counting, String> {
        Counting::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| format!("--count: unknown measurement {s:?}"))
    }
}

/// Rounds an instruction-counting child measures (instruction counts do not vary between
/// rounds the way times do, so a few suffice; the first round's one-time work, such as
/// filling the key cache, is spread over all of them).
const COUNTED_ROUNDS: usize = 8;

/// The instruction-counting child: sets up what `what` measures, runs `COUNTED_ROUNDS` rounds
/// through `measured` (the function callgrind collects in) and prints how many operations
/// went through it.
fn count_child(what: Counting) -> u64 {
    let rounds = COUNTED_ROUNDS;
    let ops = match what {
        Counting::Post32 | Counting::PostCalls32 | Counting::PostOnly | Counting::Poll => {
            let mut bench = plain();
            match what {
                Counting::Post32 => {
                    post(&mut bench, rounds, 32, Api::Batch);
                }
                Counting::PostCalls32 => {
                    post(&mut bench, rounds, 32, Api::Calls);
                }
                Counting::PostOnly => {
                    let wrs = bench.writes(ROUND, false);
                    (0..rounds).for_each(|_| bench.post_only_round(&wrs));
                }
                _ => {
                    poll(&mut bench, rounds);
                }
            }
            rounds
                * if what == Counting::Poll {
                    POLL_ROUND
                } else {
                    ROUND
                }
        }
        Counting::ResilientPost32 | Counting::BypassPost32 => {
            let mut protected = resilient();
            let wrs = protected.writes(ROUND, false);
            for _ in 0..rounds {
                if what == Counting::ResilientPost32 {
                    protected.post_round(&wrs, 32, Api::Batch);
                } else {
                    protected.bypass_round(|b| b.post_round(&wrs, 32, Api::Batch));
                }
            }
            rounds * ROUND
        }
        Counting::ResilientPoll | Counting::BypassPoll => {
            let mut protected = resilient();
            let wrs = protected.writes(POLL_ROUND, true);
            let mut wcs = [WorkCompletion::EMPTY; 32];
            for _ in 0..rounds {
                if what == Counting::ResilientPoll {
                    protected.poll_round(&wrs, &mut wcs);
                } else {
                    protected.bypass_round(|b| b.poll_round(&wrs, &mut wcs));
                }
            }
            rounds * POLL_ROUND
        }
        Counting::ShimPost | Counting::ShimDirectPost => {
            compare_shim(rounds, Some(what));
            rounds * ROUND
        }
        Counting::ShimPoll | Counting::ShimDirectPoll => {
            compare_shim(rounds, Some(what));
            rounds * POLL_ROUND
        }
    };
    ops as u64
}

/// The shim's ops-table post and poll against the same QP's pmd rings used directly, in
/// alternating rounds: what the verbs layer costs (conversion of each `ibv_send_wr`, the
/// QP's and CQ's mutex, the function pointers). With `only` (an instruction-counting child),
/// `rounds` rounds of that one measurement and nothing else; `None` returned.
fn compare_shim(rounds: usize, only: Option<Counting>) -> Option<(Compared, Compared)> {
    use benches::verbs_shim::{configure, poll_cq, post_send, Pair};
    use railshift_verbs::abi::{ibv_send_wr, ibv_send_wr_wr, ibv_sge, ibv_wc};
    configure(&fabric(2));
    let pair = Pair::new(1 << 20, 4 * POLL_ROUND as i32, ROUND as u32);
    let _held = pair.hold_helpers();
    let devices = pair.devices();
    let run = || {
        for d in &devices {
            d.progress();
        }
    };
    let (dqp, dcq) = pair.direct();
    // SAFETY: the pair's live MRs.
    let (la, lkey, rb, rkey) = unsafe {
        let (a, b) = (&*pair.a.mr, &*pair.b.mr);
        (a.addr as u64, a.lkey, b.addr as u64, b.rkey)
    };
    let remote = |i: usize| rb + ((i % 4096) * 8) as u64;
    let local = Sge::new(la, 8, lkey);
    let pmd_wrs = |n: usize, all: bool| -> Vec<SendWr<'static>> {
        (0..n)
            .map(|i| {
                let op = SendOp::Write {
                    remote: Remote {
                        addr: remote(i),
                        rkey,
                    },
                };
                let wr = SendWr::new(i as u64, op, &[local]);
                if all || i == n - 1 {
                    wr.signaled()
                } else {
                    wr
                }
            })
            .collect()
    };
    // The application's lists, built once: 32 requests linked per list.
    let mut sges = vec![
        ibv_sge {
            addr: la,
            length: 8,
            lkey,
        };
        ROUND
    ];
    let mut chain: Vec<ibv_send_wr> = (0..ROUND)
        .map(|i| ibv_send_wr {
            wr_id: i as u64,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 1,
            opcode: railshift_verbs::abi::IBV_WR_RDMA_WRITE,
            send_flags: if i == ROUND - 1 {
                railshift_verbs::abi::IBV_SEND_SIGNALED
            } else {
                0
            },
            imm_data: 0,
            wr: ibv_send_wr_wr {
                remote_addr: remote(i),
                rdma_rkey_or_compare_add: u64::from(rkey),
                swap: 0,
                atomic_rkey: 0,
            },
            _tail: [0; 7],
        })
        .collect();
    for i in 0..ROUND {
        chain[i].sg_list = &mut sges[i];
        if (i + 1) % 32 != 0 {
            chain[i].next = &mut chain[i + 1];
        }
    }
    let qp = pair.a.qp;
    let cq = pair.a.cq;
    let drain = |n: usize| {
        let mut wcs = [WorkCompletion::EMPTY; 32];
        let mut got = 0;
        let deadline = Instant::now() + Duration::from_secs(10);
        while got < n {
            run();
            let k = dcq.lock().poll(&mut wcs);
            assert!(wcs[..k].iter().all(|w| w.is_ok()), "WRITE failed: {wcs:?}");
            got += k;
            assert!(
                Instant::now() < deadline,
                "{got} of {n} completions in 10 s"
            );
        }
    };
    let post_wrs = pmd_wrs(ROUND, false);
    let shim_post = |chain: &mut [ibv_send_wr]| {
        let start = Instant::now();
        measured(|| {
            for head in black_box(&mut *chain).chunks_mut(32) {
                // SAFETY: our live QP; the list is 32 linked valid requests.
                let rc = unsafe { post_send(qp, head.as_mut_ptr()) };
                debug_assert_eq!(rc, 0);
            }
        });
        let ns = start.elapsed().as_nanos() as f64 / ROUND as f64;
        drain(1);
        ns
    };
    let direct_post = || {
        let mut q = dqp.lock().expect("qp");
        let start = Instant::now();
        measured(|| {
            for group in black_box(&post_wrs).chunks(32) {
                for wr in group {
                    q.post_send(wr).expect("post");
                }
                q.ring_doorbell();
            }
        });
        let ns = start.elapsed().as_nanos() as f64 / ROUND as f64;
        drop(q);
        drain(1);
        ns
    };
    let post = match only {
        Some(what @ (Counting::ShimPost | Counting::ShimDirectPost)) => {
            for _ in 0..rounds {
                if what == Counting::ShimPost {
                    shim_post(&mut chain);
                } else {
                    direct_post();
                }
            }
            return None;
        }
        // Counting a poll: no post is measured.
        Some(_) => None,
        None => {
            // Warm both once.
            shim_post(&mut chain);
            direct_post();
            let (mut d, mut v) = (Vec::new(), Vec::new());
            for i in 0..rounds {
                if i % 2 == 0 {
                    d.push(direct_post());
                    v.push(shim_post(&mut chain));
                } else {
                    v.push(shim_post(&mut chain));
                    d.push(direct_post());
                }
            }
            Some(Compared::of(d, v))
        }
    };
    // Polling: the device writes POLL_ROUND CQEs first (untimed), then one side polls them.
    let poll_wrs = pmd_wrs(POLL_ROUND, true);
    let fill = || {
        for batch in poll_wrs.chunks(32) {
            let written = {
                // Counted before the doorbell: the device may write some of the batch's CQEs
                // at once (the shim's helper thread runs it while nothing polls), and a count
                // read after them would wait for CQEs that never come.
                let before = dcq.lock().poller().ready();
                let mut q = dqp.lock().expect("qp");
                for wr in batch {
                    q.post_send(wr).expect("post");
                }
                q.ring_doorbell();
                before + batch.len() as u32
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            while dcq.lock().poller().ready() < written {
                run();
                assert!(Instant::now() < deadline, "CQEs not written in 10 s");
            }
        }
    };
    let shim_poll = || {
        fill();
        // SAFETY: ibv_wc is plain data; all zeroes is a valid value.
        let mut wcs: [ibv_wc; 32] = unsafe { std::mem::zeroed() };
        let start = Instant::now();
        let got = measured(|| {
            let mut got = 0;
            while got < POLL_ROUND {
                // SAFETY: our live CQ; 32 entries.
                let k = unsafe { poll_cq(cq, 32, black_box(wcs.as_mut_ptr())) };
                assert!(k > 0, "the CQ ran dry");
                got += k as usize;
            }
            got
        });
        let ns = start.elapsed().as_nanos() as f64 / got as f64;
        assert!(wcs.iter().all(|w| w.status == 0), "a WRITE failed");
        ns
    };
    let direct_poll = || {
        fill();
        let mut wcs = [WorkCompletion::EMPTY; 32];
        let mut c = dcq.lock();
        let start = Instant::now();
        let got = measured(|| {
            let mut got = 0;
            while got < POLL_ROUND {
                let k = c.poll(black_box(&mut wcs));
                assert!(k > 0, "the CQ ran dry");
                got += k;
            }
            got
        });
        let ns = start.elapsed().as_nanos() as f64 / got as f64;
        assert!(wcs.iter().all(|w| w.is_ok()), "a WRITE failed");
        ns
    };
    if let Some(what) = only {
        for _ in 0..rounds {
            if what == Counting::ShimPoll {
                shim_poll();
            } else {
                direct_poll();
            }
        }
        return None;
    }
    let (mut d, mut v) = (Vec::new(), Vec::new());
    for i in 0..rounds / 4 + 1 {
        if i % 2 == 0 {
            d.push(direct_poll());
            v.push(shim_poll());
        } else {
            v.push(shim_poll());
            d.push(direct_poll());
        }
    }
    Some((post?, Compared::of(d, v)))
}

/// Prints a table of figures measured directly and through a layer, in alternating rounds.
fn print_compared(what: &str, layer: &str, rows: [(&str, &Compared); 2]) {
    println!("{what}, alternating rounds (goal: ratios <= 1.05):");
    println!(
        "{:<34} {:>10} {:>10} {:>9} {:>10}",
        "figure", "direct ns", layer, "ratio", "best/best"
    );
    for (name, c) in rows {
        println!(
            "{name:<34} {:>10.2} {:>10.2} {:>9.3} {:>10.3}",
            c.plain.median,
            c.resilient.median,
            c.paired,
            c.best_ratio()
        );
    }
}

/// Counts every measurement's instructions per operation, each in a child under callgrind.
fn count_instructions() -> Result<Vec<(Counting, f64)>, String> {
    benches::instr::valgrind_available()?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    Counting::ALL
        .into_iter()
        .map(|what| {
            let counted =
                benches::instr::count(&exe, &["--count", what.name()], "datapath::measured*")?;
            Ok((what, counted.per_op()))
        })
        .collect()
}

fn args() -> Result<Args, String> {
    let mut out = Args {
        json: None,
        rounds: 200,
        count: None,
        no_instr: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--json" => out.json = Some(it.next().ok_or("--json needs a path")?.into()),
            "--rounds" => {
                out.rounds = it
                    .next()
                    .ok_or("--rounds needs a number")?
                    .parse()
                    .map_err(|e| format!("--rounds: {e}"))?;
                if out.rounds == 0 {
                    return Err("--rounds must be at least 1".into());
                }
            }
            "--count" => {
                out.count = Some(Counting::parse(&it.next().ok_or("--count needs a name")?)?)
            }
            "--no-instr" => out.no_instr = true,
            "-h" | "--help" => {
                return Err("usage: datapath [--json OUT.json] [--rounds N] [--no-instr]".into());
            }
            other => return Err(format!("unknown argument {other:?}; try --help")),
        }
    }
    Ok(out)
}

fn main() {
    let args = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    // Pin the measuring thread to the last core, away from core 0's interrupts.
    let core = pmd::lcore::cores().last().copied();
    if let Some(what) = args.count {
        let ops = pmd::lcore::launch("bench-count", core, move || count_child(what))
            .expect("launch the counting lcore")
            .join()
            .expect("counting lcore");
        println!("ops {ops}");
        return;
    }
    let rounds = args.rounds;
    let lcore = pmd::lcore::launch("bench-datapath", core, move || {
        let mut bench = plain();
        // Warm caches, rings and the branch predictor once before measuring.
        post(&mut bench, 5, 32, Api::Batch);
        let floor = floor_copy64(&bench.devices[0], rounds);
        let single = post(&mut bench, rounds, 1, Api::Calls);
        let batch = post(&mut bench, rounds, 32, Api::Batch);
        let calls = post(&mut bench, rounds, 32, Api::Calls);
        let poll = poll(&mut bench, rounds / 4 + 1);
        let mut protected = resilient();
        post(&mut protected, 5, 32, Api::Batch);
        let compared = compare(&mut protected, rounds);
        let shim = compare_shim(rounds, None).expect("both sides measured");
        let pages = match bench.local_page_size() {
            pmd::memory::PageSize::Huge => "2 MiB hugepages",
            pmd::memory::PageSize::Base => "4 KiB pages",
        };
        (floor, single, batch, calls, poll, compared, shim, pages)
    })
    .expect("launch the benchmark lcore");
    let (floor, single, batch, calls, poll, (cpost, cpoll), (spost, spoll), pages) =
        lcore.join().expect("benchmark lcore");

    let mut report = Report::new();
    let figures = [
        (
            "post + doorbell, one at a time",
            "post_single_ns",
            single,
            None,
        ),
        (
            "post, batches of 32 + doorbell",
            "post_batch32_ns",
            batch,
            Some(10.0),
        ),
        ("post, 32 calls + doorbell", "post_calls32_ns", calls, None),
        ("poll, per CQE", "poll_ns", poll, Some(5.0)),
        (
            "floor: 64-byte copy to a ring slot",
            "floor_copy64_ns",
            floor,
            None,
        ),
    ];
    for (_, key, figure, _) in &figures {
        report.number(key, figure.median);
        report.number(&key.replace("_ns", "_best_ns"), figure.best);
    }
    // The resilient QP and its own default QP used directly, in alternating rounds.
    for (key, c) in [("post_batch32", &cpost), ("poll", &cpoll)] {
        let short = key.trim_end_matches("_batch32");
        report
            .number(&format!("resilient_{key}_ns"), c.resilient.median)
            .number(&format!("resilient_{key}_best_ns"), c.resilient.best)
            .number(&format!("resilient_bypass_{key}_ns"), c.plain.median)
            .number(&format!("resilient_bypass_{key}_best_ns"), c.plain.best)
            .number(&format!("overhead_{short}_ratio"), c.paired)
            .number(&format!("overhead_{short}_best_ratio"), c.best_ratio());
    }
    // The shim's ops table and the same QP's pmd rings used directly, alternating rounds.
    for (key, c) in [("post_calls32", &spost), ("poll", &spoll)] {
        let short = key.trim_end_matches("_calls32");
        report
            .number(&format!("shim_{key}_ns"), c.resilient.median)
            .number(&format!("shim_{key}_best_ns"), c.resilient.best)
            .number(&format!("shim_direct_{key}_ns"), c.plain.median)
            .number(&format!("shim_direct_{key}_best_ns"), c.plain.best)
            .number(&format!("overhead_shim_{short}_ratio"), c.paired)
            .number(&format!("overhead_shim_{short}_best_ratio"), c.best_ratio());
    }
    // Against the plain QP pair measured earlier in the run (other rings, other devices):
    // what the resilient QP costs over a plain one, memory placement included.
    report
        .number(
            "resilient_vs_plain_post_ratio",
            cpost.resilient.median / batch.median,
        )
        .number(
            "resilient_vs_plain_poll_ratio",
            cpoll.resilient.median / poll.median,
        );
    report
        .text("provider", "soft (fabric, manual progress)")
        .text("pages", pages);
    println!("railshift datapath, soft provider, {pages}, {rounds} rounds of {ROUND} WQEs");
    println!(
        "{:<34} {:>10} {:>9} {:>10} {:>9}",
        "figure", "median ns", "x floor", "best ns", "x floor"
    );
    for (name, _, f, goal) in figures {
        let verdict = goal.map_or(String::new(), |g: f64| {
            let met = |v: f64| if v <= g { "met" } else { "missed" };
            format!(
                "  goal <= {g} ns: median {}, best {}",
                met(f.median),
                met(f.best)
            )
        });
        println!(
            "{name:<34} {:>10.2} {:>9.2} {:>10.2} {:>9.2}{verdict}",
            f.median,
            f.median / floor.median,
            f.best,
            f.best / floor.best
        );
    }
    print_compared(
        "resilient QP over its own default QP used directly",
        "resil. ns",
        [
            ("post, batches of 32 + doorbell", &cpost),
            ("poll, per CQE", &cpoll),
        ],
    );
    print_compared(
        "verbs shim's ops table over the same QP's pmd rings used directly",
        "shim ns",
        [
            ("post, lists of 32 (32 calls direct)", &spost),
            ("poll, per CQE", &spoll),
        ],
    );
    if args.no_instr {
        println!("instruction counts skipped (--no-instr)");
    } else {
        instruction_report(&mut report);
    }
    if let Some(path) = args.json {
        if let Err(e) = report.write(&path) {
            eprintln!("cannot write {}: {e}", path.display());
            std::process::exit(1);
        }
        println!("wrote {}", path.display());
    }
}
