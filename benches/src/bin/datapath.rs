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
//!   writing one WQE costs at the very least, measured in the same run.
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
use pmd::{
    Access, AddressVector, Context, ContextConfig, Cq, Mtu, Qp, QpAttr, QpCaps, QpState,
    RegisteredBuffer, SendOp, SendWr, WorkCompletion,
};

/// WQEs per timed round.
const ROUND: usize = 512;
/// CQEs per timed poll round.
const POLL_ROUND: usize = 512;

struct Side {
    ctx: Arc<Context>,
    cq: Cq,
    qp: Qp,
    buf: RegisteredBuffer,
}

fn open(name: &str) -> Arc<Context> {
    let config = ContextConfig {
        progress: ProgressModel::Manual,
        ..ContextConfig::default()
    };
    Context::open(name, &config).unwrap_or_else(|e| panic!("open {name}: {e}"))
}

fn side(ctx: &Arc<Context>) -> Side {
    let pd = ctx.alloc_pd().expect("alloc_pd");
    let cq = ctx
        .create_cq(4 * POLL_ROUND as u32, false)
        .expect("create_cq");
    let caps = QpCaps {
        max_send_wr: 512,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = pd.create_qp(&cq, &cq, caps).expect("create_qp");
    let buf = pd.alloc_buffer(1 << 20, Access::ALL).expect("alloc_buffer");
    Side {
        ctx: ctx.clone(),
        cq,
        qp,
        buf,
    }
}

fn connect(qp: &mut Qp, gid: pmd::Gid, qpn: u32) {
    qp.modify(QpState::Init, &QpAttr::init(Access::ALL))
        .expect("INIT");
    qp.modify(
        QpState::Rtr,
        &QpAttr::rtr(AddressVector::to_gid(gid), qpn, 0, Mtu::Mtu4096),
    )
    .expect("RTR");
    qp.modify(QpState::Rts, &QpAttr::rts(0)).expect("RTS");
}

struct Bench {
    a: Side,
    b: Side,
    wcs: Vec<WorkCompletion>,
}

impl Bench {
    fn new() -> Bench {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!("bench{}", N.fetch_add(1, Ordering::Relaxed));
        let fabric = softnic::Fabric::new(1, Duration::ZERO);
        fabric.add_port("198.18.0.1".parse().expect("address"));
        fabric.add_port("198.18.0.2".parse().expect("address"));
        register_fabric(&name, &fabric);
        let mut a = side(&open(&format!("fabric:{name}/0")));
        let mut b = side(&open(&format!("fabric:{name}/1")));
        let (ga, gb) = (
            a.ctx.query_gid(0).expect("gid"),
            b.ctx.query_gid(0).expect("gid"),
        );
        let (qa, qb) = (a.qp.qpn(), b.qp.qpn());
        connect(&mut a.qp, gb, qb);
        connect(&mut b.qp, ga, qa);
        Bench {
            a,
            b,
            wcs: vec![WorkCompletion::EMPTY; 64],
        }
    }

    /// WRITEs of 8 bytes each to distinct remote slots; only the last one signaled when
    /// `signal_last`, all of them when `signal_all`.
    fn writes(&self, n: usize, signal_all: bool) -> Vec<SendWr<'static>> {
        (0..n)
            .map(|i| {
                let remote = self.b.buf.remote((i % 4096) * 8);
                let wr = SendWr::new(i as u64, SendOp::Write { remote }, &[self.a.buf.sge(0, 8)]);
                if signal_all || i == n - 1 {
                    wr.signaled()
                } else {
                    wr
                }
            })
            .collect()
    }

    /// Runs both devices until `n` CQEs wait in the CQ (untimed).
    fn settle(&mut self, n: u32) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.a.cq.poller().ready() < n {
            self.a.ctx.progress();
            self.b.ctx.progress();
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
            self.a.ctx.progress();
            self.b.ctx.progress();
            let k = self.a.cq.poll(&mut self.wcs);
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

/// The timed posting loop, kept out of line so an instruction counter (callgrind's
/// `--toggle-collect=datapath::timed_posts`) can measure exactly it.
#[inline(never)]
fn timed_posts(qp: &mut Qp, wrs: &[SendWr<'static>], batch: usize) {
    for group in wrs.chunks(batch) {
        for wr in group {
            qp.post_send(black_box(wr)).expect("post");
        }
        qp.ring_doorbell();
    }
}

/// The timed polling loop: polls until the CQ is empty; returns the completions polled.
#[inline(never)]
fn timed_polls(cq: &mut Cq, wcs: &mut [WorkCompletion]) -> usize {
    let mut got = 0;
    loop {
        let k = cq.poll(black_box(&mut *wcs));
        if k == 0 {
            return got;
        }
        got += k;
    }
}

/// ns per WQE of posting rounds of `ROUND` WRITEs with one doorbell per `batch` of them.
fn post(bench: &mut Bench, rounds: usize, batch: usize) -> Figure {
    let wrs = bench.writes(ROUND, false);
    let samples = (0..rounds)
        .map(|_| {
            let start = Instant::now();
            timed_posts(&mut bench.a.qp, &wrs, batch);
            let ns = start.elapsed().as_nanos() as f64 / ROUND as f64;
            bench.drain(1);
            ns
        })
        .collect();
    Figure::of(samples)
}

fn poll(bench: &mut Bench, rounds: usize) -> Figure {
    let wrs = bench.writes(POLL_ROUND, true);
    let mut wcs = [WorkCompletion::EMPTY; 32];
    let samples = (0..rounds)
        .map(|_| {
            for batch in wrs.chunks(32) {
                for wr in batch {
                    bench.a.qp.post_send(wr).expect("post");
                }
                bench.a.qp.ring_doorbell();
                // Keep the device's work out of the timed region below.
                let written = bench.a.cq.poller().ready() + batch.len() as u32;
                bench.settle(written);
            }
            let start = Instant::now();
            let got = timed_polls(&mut bench.a.cq, &mut wcs);
            let elapsed = start.elapsed().as_nanos() as f64;
            assert_eq!(
                got, POLL_ROUND,
                "the device had not written every CQE before polling"
            );
            black_box(&wcs);
            elapsed / got as f64
        })
        .collect();
    Figure::of(samples)
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

struct Args {
    json: Option<PathBuf>,
    rounds: usize,
}

fn args() -> Result<Args, String> {
    let mut out = Args {
        json: None,
        rounds: 200,
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
            "-h" | "--help" => {
                return Err("usage: datapath [--json OUT.json] [--rounds N]".into());
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
    let rounds = args.rounds;
    let lcore = pmd::lcore::launch("bench-datapath", core, move || {
        let mut bench = Bench::new();
        // Warm caches, rings and the branch predictor once before measuring.
        post(&mut bench, 5, 32);
        let floor = floor_copy64(&bench.a.ctx, rounds);
        let single = post(&mut bench, rounds, 1);
        let batch = post(&mut bench, rounds, 32);
        let poll = poll(&mut bench, rounds / 4 + 1);
        let pages = match bench.a.buf.page_size() {
            pmd::memory::PageSize::Huge => "2 MiB hugepages",
            pmd::memory::PageSize::Base => "4 KiB pages",
        };
        (floor, single, batch, poll, pages)
    })
    .expect("launch the benchmark lcore");
    let (floor, single, batch, poll, pages) = lcore.join().expect("benchmark lcore");

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
    if let Some(path) = args.json {
        if let Err(e) = report.write(&path) {
            eprintln!("cannot write {}: {e}", path.display());
            std::process::exit(1);
        }
        println!("wrote {}", path.display());
    }
}
