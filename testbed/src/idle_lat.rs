//! `shift-testbed idle-lat`: the 8-byte WRITE latency of a resilient QP with N idle resilient
//! QPs beside it, against the same QP alone (the SHIFT paper's table 2, "w/ 1000 QP"), both
//! measured in one run, interleaved so that drift on a shared machine falls on both alike.
//!
//! Each run is a `shift_write_lat` pair between the hosts on rail 0 with rail 1 as the backup,
//! polling busy (run-to-completion), with `--idle-qps N` or without. The ratio is the median
//! over the rounds of the with-idle p50 over the median of the alone p50 (nearest rank); the goal is
//! within 5 %.

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use crate::apprun::{self, PairSpec};
use crate::fail;
use crate::report::Percentiles;
use crate::scenario::ScenarioError;
use crate::topology::TestbedInfo;

/// What to run.
#[derive(Debug, Clone)]
pub struct IdleLatOptions {
    /// Idle QPs beside the measured one in the "with" runs.
    pub idle_qps: u32,
    /// Pairs of runs (one alone, one with the idle QPs, which first alternating).
    pub rounds: u32,
    /// Round trips per run.
    pub iters: u64,
    /// Message size.
    pub size: u32,
    /// Where the apps' binaries are.
    pub apps_dir: PathBuf,
    /// Where the apps' reports go.
    pub out_dir: PathBuf,
    /// Out-of-band TCP port of the apps.
    pub port: u16,
}

/// One run's latency, microseconds (one way, as `shift_write_lat` reports it).
#[derive(Debug, Clone, Serialize)]
pub struct LatRun {
    /// Idle QPs beside the measured one.
    pub idle_qps: u32,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Mean.
    pub avg_us: f64,
}

/// What `idle-lat --json` writes.
#[derive(Debug, Clone, Serialize)]
pub struct IdleLatResult {
    /// Idle QPs of the "with" runs.
    pub idle_qps: u32,
    /// Message size.
    pub size: u32,
    /// Round trips per run.
    pub iters: u64,
    /// Every run, in the order run.
    pub runs: Vec<LatRun>,
    /// Median over the runs of the p50, alone.
    pub p50_alone_us: f64,
    /// Median over the runs of the p50, with the idle QPs.
    pub p50_with_idle_us: f64,
    /// `p50_with_idle_us / p50_alone_us`.
    pub ratio: f64,
    /// Median over the runs of the p99, alone and with the idle QPs.
    pub p99_alone_us: f64,
    /// See `p99_alone_us`.
    pub p99_with_idle_us: f64,
    /// The goal: the ratio at most 1.05.
    pub goal_within_5pct: bool,
}

/// Runs one latency pair with `idle` idle QPs.
fn run_once(info: &TestbedInfo, o: &IdleLatOptions, idle: u32) -> Result<LatRun, ScenarioError> {
    fail::wait_all_up(info, Duration::from_secs(5))
        .map_err(|detail| ScenarioError::Links { detail })?;
    let mut common_args: Vec<String> = [
        "-d",
        "soft:nic0",
        "--backup-dev",
        "soft:nic1",
        "-s",
        &o.size.to_string(),
        "-n",
        &o.iters.to_string(),
        "--poll",
        "busy",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if idle > 0 {
        common_args.extend(["--idle-qps".to_owned(), idle.to_string()]);
    }
    let spec = PairSpec {
        tool: "shift_write_lat".to_owned(),
        apps_dir: o.apps_dir.clone(),
        common_args,
        client_args: Vec::new(),
        server_args: Vec::new(),
        port: o.port,
        out_dir: o.out_dir.clone(),
        tag: format!("idle-lat-{idle}"),
        client_timeout: Duration::from_secs(120),
    };
    let pair = apprun::start(info, &spec)?;
    let out_path = pair.client_json.clone();
    let out = pair.finish()?;
    let field = |name: &str| out.client_raw[name].as_f64();
    match (
        field("lat_p50_us"),
        field("lat_p99_us"),
        field("lat_avg_us"),
    ) {
        (Some(p50_us), Some(p99_us), Some(avg_us)) if out.client.error.is_none() => Ok(LatRun {
            idle_qps: idle,
            p50_us,
            p99_us,
            avg_us,
        }),
        _ => Err(ScenarioError::App(apprun::AppRunError::Report {
            path: out_path,
            detail: format!(
                "shift_write_lat --idle-qps {idle} reported no latency{}",
                out.client
                    .error
                    .as_deref()
                    .map(|e| format!(" (error: {e})"))
                    .unwrap_or_default()
            ),
        })),
    }
}

/// Runs `o.rounds` pairs of runs, alone and with the idle QPs, which first alternating;
/// `on_run` sees each run as it finishes.
pub fn run(
    info: &TestbedInfo,
    o: &IdleLatOptions,
    on_run: &mut dyn FnMut(&LatRun),
) -> Result<IdleLatResult, ScenarioError> {
    let mut runs = Vec::new();
    for round in 0..o.rounds.max(1) {
        let order = if round % 2 == 0 {
            [0, o.idle_qps]
        } else {
            [o.idle_qps, 0]
        };
        for idle in order {
            let r = run_once(info, o, idle)?;
            on_run(&r);
            runs.push(r);
        }
    }
    let of = |with_idle: bool, pick: fn(&LatRun) -> f64| {
        Percentiles::of(
            runs.iter()
                .filter(|r| (r.idle_qps > 0) == with_idle)
                .map(pick)
                .collect(),
        )
        .p50
        .unwrap_or(f64::NAN)
    };
    let p50_alone_us = of(false, |r| r.p50_us);
    let p50_with_idle_us = of(true, |r| r.p50_us);
    let ratio = p50_with_idle_us / p50_alone_us;
    Ok(IdleLatResult {
        idle_qps: o.idle_qps,
        size: o.size,
        iters: o.iters,
        p50_alone_us,
        p50_with_idle_us,
        ratio,
        p99_alone_us: of(false, |r| r.p99_us),
        p99_with_idle_us: of(true, |r| r.p99_us),
        goal_within_5pct: ratio <= 1.05,
        runs,
    })
}

/// Prints the result's summary.
pub fn print(r: &IdleLatResult) {
    println!(
        "{}-byte WRITE latency, resilient QP, run-to-completion: p50 {:.2} us alone, {:.2} us with {} idle QPs beside it: ratio {:.3} (goal <= 1.05: {}); p99 {:.2} / {:.2} us",
        r.size,
        r.p50_alone_us,
        r.p50_with_idle_us,
        r.idle_qps,
        r.ratio,
        if r.goal_within_5pct { "met" } else { "MISSED" },
        r.p99_alone_us,
        r.p99_with_idle_us,
    );
}
