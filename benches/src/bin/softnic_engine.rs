//! `softnic_engine`: how fast softnic's engine carries RDMA WRITEs, the device's own work
//! only (fetching and decoding WQEs, building and sending packets, the responder, ACKs,
//! completions), with no driver in the way.
//!
//! Two softnic devices on an in-memory fabric (no latency, no loss), manual progress driven by
//! this thread through `Sim::run_until`, one QP pair through softnic's test harness. The
//! requester keeps its send ring full: `--window` WQEs outstanding, posted 32 at a time with
//! the 32nd signaled, each a WRITE of `--len` bytes from one SGE. A round carries `--writes`
//! WRITEs; the report is WRITEs per second of each round, their median and best. Run two builds
//! alternately to compare engines (`docs/measurements.md` says how each comparison was run).
//!
//!     cargo run --release -p benches --bin softnic_engine -- [--rounds 9] [--writes 200000]

use std::time::{Duration, Instant};

use clap::Parser;
use hw_defs::verbs::WcStatus;
use serde_json::json;
use softnic::harness::{connect, ConnectOptions, Data, Node, Op, QpSizes, Sim};

/// WRITEs posted per doorbell; the last of each batch is signaled.
const BATCH: u32 = 32;

#[derive(Parser)]
#[command(about = "softnic engine throughput: RDMA WRITEs per second over an in-memory fabric")]
struct Args {
    /// Timed rounds.
    #[arg(long, default_value_t = 9, value_parser = clap::value_parser!(u32).range(1..=1000))]
    rounds: u32,
    /// WRITEs per round.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u32).range(1024..))]
    writes: u32,
    /// WQEs outstanding (the send ring's size in basic blocks; a multiple of 32, a power of two).
    #[arg(long, default_value_t = 256, value_parser = parse_window)]
    window: u32,
    /// Bytes per WRITE.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    len: u32,
}

fn parse_window(s: &str) -> Result<u32, String> {
    let w: u32 = s.parse().map_err(|e| format!("{s:?}: {e}"))?;
    if !(BATCH..=4096).contains(&w) || !w.is_power_of_two() {
        return Err(format!("{w} is not a power of two in {BATCH}..=4096"));
    }
    Ok(w)
}

/// Carries `writes` WRITEs from `a` to `b` with `window` outstanding; returns the wall time.
fn round(sim: &Sim, a: &mut Node, b: &Node, writes: u32, window: u32, len: u32) -> Duration {
    let sge = [a.buf.sge(0, len)];
    let op = Op::Write {
        raddr: b.buf.addr(0),
        rkey: b.buf.keys.rkey,
    };
    let (mut posted, mut completed) = (0u32, 0u32);
    let mut failed = None;
    let start = Instant::now();
    let done = sim.run_until(&[&a.dev, &b.dev], Duration::from_secs(3600), || {
        while let Some(c) = a.scq.poll() {
            if c.status != WcStatus::Success {
                failed = Some(c.status);
                return true;
            }
            completed += BATCH;
        }
        while posted < writes && posted - completed + BATCH <= window {
            for i in 0..BATCH {
                a.qp.post(op, Data::Sges(&sge), i == BATCH - 1);
            }
            a.qp.ring();
            posted += BATCH;
        }
        completed >= writes
    });
    let elapsed = start.elapsed();
    if let Some(status) = failed {
        eprintln!("softnic_engine: a WRITE completed with {status:?}");
        std::process::exit(1);
    }
    if !done {
        eprintln!("softnic_engine: {completed} of {writes} WRITEs completed within the round's virtual hour");
        std::process::exit(1);
    }
    elapsed
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() {
    let args = Args::parse();
    // Whole batches only, so every batch's signaled WRITE completes the round.
    let writes = args.writes / BATCH * BATCH;
    let sizes = QpSizes {
        sq_bbs: args.window,
        ..QpSizes::default()
    };
    let sim = Sim::new(1, Duration::ZERO);
    let open = |name: &str, n: u8| {
        let dev = sim.device(name, n).unwrap_or_else(|e| {
            eprintln!("softnic_engine: opening device {name}: {e}");
            std::process::exit(1);
        });
        Node::new(dev, 1 << 20, sizes).unwrap_or_else(|e| {
            eprintln!("softnic_engine: setting up {name}: {e}");
            std::process::exit(1);
        })
    };
    let (mut a, b) = (open("a", 1), open("b", 2));
    if let Err(e) = connect(&a.dev, &a.qp, &b.dev, &b.qp, &ConnectOptions::default()) {
        eprintln!("softnic_engine: connecting the QPs: {e}");
        std::process::exit(1);
    }
    // One untimed round first: page faults and the first ring laps are not the engine's speed.
    round(
        &sim,
        &mut a,
        &b,
        writes.min(32 * 1024),
        args.window,
        args.len,
    );
    let per_second: Vec<f64> = (0..args.rounds)
        .map(|_| {
            let t = round(&sim, &mut a, &b, writes, args.window, args.len);
            f64::from(writes) / t.as_secs_f64()
        })
        .collect();
    let best = per_second.iter().copied().fold(0.0, f64::max);
    let out = json!({
        "softnic_engine": {
            "writes_per_s_median": median(per_second.clone()),
            "writes_per_s_best": best,
            "writes_per_s_rounds": per_second,
        },
        "writes_per_round": writes,
        "window": args.window,
        "len": args.len,
        "device": "two softnic devices, manual progress on one thread, in-memory fabric",
    });
    println!(
        "{}",
        serde_json::to_string_pretty(&out).expect("a JSON value")
    );
}
