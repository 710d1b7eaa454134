//! The JSON report (`docs/apps-json.md`), the timeline every `--timeline-ms`, and the
//! failover summary, in the JSON and on stdout.

use std::time::{Duration, Instant};

use pmd::resilient::{FailoverEvent, FailoverStats};
use serde::Serialize;

pub use crate::row::Latency;
use crate::row::PeerRow;
use crate::wall_clock::unix_ms_now;

/// One row of the results table.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ResultRow {
    /// Message size.
    pub size: usize,
    /// Completed iterations.
    pub iterations: u64,
    /// Peak bandwidth (the best timeline interval; the average when the run is shorter).
    pub bw_peak_gbps: f64,
    /// Average bandwidth.
    pub bw_avg_gbps: f64,
    /// Messages per second, millions.
    pub msg_rate_mpps: f64,
    /// Measured wall time, seconds.
    pub duration_s: f64,
    /// Latency tools: this size's latency figures.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub latency: Option<Latency>,
}

impl ResultRow {
    /// The row as a `done` message carries it to the peer.
    pub fn to_peer(&self) -> PeerRow {
        PeerRow {
            size: self.size,
            iterations: self.iterations,
            bw_peak_gbps: self.bw_peak_gbps,
            bw_avg_gbps: self.bw_avg_gbps,
            msg_rate_mpps: self.msg_rate_mpps,
            duration_s: self.duration_s,
            latency: self.latency,
        }
    }

    /// The peer's row.
    pub fn of_peer(p: &PeerRow) -> ResultRow {
        ResultRow {
            size: p.size,
            iterations: p.iterations,
            bw_peak_gbps: p.bw_peak_gbps,
            bw_avg_gbps: p.bw_avg_gbps,
            msg_rate_mpps: p.msg_rate_mpps,
            duration_s: p.duration_s,
            latency: p.latency,
        }
    }

    /// `-b`: this side's row with the peer's direction added, as perftest sums a
    /// bidirectional run (bandwidths and message rates add up; the iterations stay this
    /// side's).
    pub fn plus(&self, p: &PeerRow) -> ResultRow {
        ResultRow {
            bw_peak_gbps: self.bw_peak_gbps + p.bw_peak_gbps,
            bw_avg_gbps: self.bw_avg_gbps + p.bw_avg_gbps,
            msg_rate_mpps: self.msg_rate_mpps + p.msg_rate_mpps,
            ..self.clone()
        }
    }
}

/// One timeline sample.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Sample {
    /// Milliseconds since measuring started, at the end of the interval.
    pub t_ms: f64,
    /// Unix milliseconds at the end of the interval.
    pub unix_ms: f64,
    /// Bandwidth over the interval.
    pub bw_gbps: f64,
    /// Message rate over the interval.
    pub msg_rate_mpps: f64,
    /// Successful completions (iterations) in the interval.
    pub completions: u64,
    /// Error completions in the interval.
    pub errors: u64,
    /// Failover state at the end of the interval.
    pub state: String,
}

/// Samples bandwidth every interval and prints a line per sample.
#[derive(Debug)]
pub struct Timeline {
    interval: Option<Duration>,
    start: Instant,
    start_unix_ms: f64,
    next: Instant,
    last_at: Instant,
    last_bytes: u64,
    last_completions: u64,
    last_errors: u64,
    /// The samples so far.
    pub samples: Vec<Sample>,
    print: bool,
}

impl Timeline {
    /// A timeline starting now; `interval_ms` 0 takes no samples.
    pub fn new(interval_ms: u64, print: bool) -> Timeline {
        let start = Instant::now();
        let interval = (interval_ms > 0).then(|| Duration::from_millis(interval_ms));
        Timeline {
            interval,
            start,
            start_unix_ms: unix_ms_now(),
            next: start + interval.unwrap_or(Duration::from_secs(u64::MAX / 4)),
            last_at: start,
            last_bytes: 0,
            last_completions: 0,
            last_errors: 0,
            samples: Vec::new(),
            print,
        }
    }

    /// When measuring started.
    pub fn start(&self) -> Instant {
        self.start
    }

    /// Whether a sample is due at `now`.
    #[inline]
    pub fn due(&self, now: Instant) -> bool {
        now >= self.next
    }

    /// Takes a sample if one is due: totals since the start (bytes, successful iterations,
    /// errors) and the state now. `state` is asked only when a sample is due: on a run of a
    /// thousand QPs it reads every QP, which a loop that ticks each pass cannot afford.
    #[inline]
    pub fn tick<'s>(
        &mut self,
        now: Instant,
        bytes: u64,
        completions: u64,
        errors: u64,
        state: impl FnOnce() -> &'s str,
    ) {
        if self.due(now) {
            self.sample(now, bytes, completions, errors, state());
            let interval = self.interval.expect("due only with an interval");
            while self.next <= now {
                self.next += interval;
            }
        }
    }

    /// Takes a sample now (the last, partial interval at the end of a run).
    pub fn sample(&mut self, now: Instant, bytes: u64, completions: u64, errors: u64, state: &str) {
        let secs = now.duration_since(self.last_at).as_secs_f64();
        if secs <= 0.0 {
            return;
        }
        let d_bytes = bytes.saturating_sub(self.last_bytes);
        let d_completions = completions.saturating_sub(self.last_completions);
        let t_ms = now.duration_since(self.start).as_secs_f64() * 1e3;
        let s = Sample {
            t_ms,
            unix_ms: self.start_unix_ms + t_ms,
            bw_gbps: d_bytes as f64 * 8.0 / secs / 1e9,
            msg_rate_mpps: d_completions as f64 / secs / 1e6,
            completions: d_completions,
            errors: errors.saturating_sub(self.last_errors),
            state: state.to_owned(),
        };
        if self.print {
            say!(
                " [timeline] {:>9.1} ms  {:>9.3} Gb/s  {:>9.6} Mpps  completions {:>8}  errors {:>3}  state {}",
                s.t_ms, s.bw_gbps, s.msg_rate_mpps, s.completions, s.errors, s.state
            );
        }
        self.samples.push(s);
        self.last_at = now;
        self.last_bytes = bytes;
        self.last_completions = completions;
        self.last_errors = errors;
    }

    /// Sample intervals of at least half the nominal interval (a last short interval is
    /// noisy) give the peak bandwidth.
    pub fn peak_gbps(&self) -> Option<f64> {
        let interval = self.interval?.as_secs_f64() * 1e3;
        let mut prev = 0.0;
        let mut peak: Option<f64> = None;
        for s in &self.samples {
            if s.t_ms - prev >= interval / 2.0 {
                peak = Some(peak.map_or(s.bw_gbps, |p: f64| p.max(s.bw_gbps)));
            }
            prev = s.t_ms;
        }
        peak
    }
}

/// `failover.events[]` of the JSON: the QP's event record and when it came in the run.
#[derive(Debug, Clone, Serialize)]
pub struct EventJson {
    /// The event as the QP logged it.
    #[serde(flatten)]
    pub event: FailoverEvent,
    /// Since the tool started measuring.
    pub t_ms: f64,
}

/// The `failover` section.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FailoverJson {
    /// Failovers completed.
    pub failovers: u64,
    /// Switch-backs completed.
    pub switch_backs: u64,
    /// Backup sides lost while idle and brought back (reset and reconnected).
    pub backup_rearms: u64,
    /// The default devices' control channel lost and brought back (`docs/failover.md` 5d).
    pub default_control_repairs: u64,
    /// Failbacks: the backup failed with traffic on it and the traffic moved back to the
    /// default path (`docs/failover.md` 5e).
    pub failbacks: u64,
    /// Failures failover refused to hide.
    pub refusals: u64,
    /// Connection failures.
    pub errors: u64,
    /// WQEs sent again.
    pub wqes_retransmitted: u64,
    /// WQEs skipped.
    pub wqes_skipped: u64,
    /// The last fallback latency.
    pub last_fallback_latency_us: Option<f64>,
    /// Every event.
    pub events: Vec<EventJson>,
}

impl FailoverJson {
    /// The section for a QP's counters and log; `start_unix_ms` anchors `t_ms`.
    pub fn new(
        stats: Option<FailoverStats>,
        events: &[FailoverEvent],
        start_unix_ms: f64,
    ) -> FailoverJson {
        let Some(st) = stats else {
            return FailoverJson::default();
        };
        FailoverJson {
            failovers: st.failovers,
            switch_backs: st.switch_backs,
            backup_rearms: st.backup_rearms,
            default_control_repairs: st.default_control_repairs,
            failbacks: st.failbacks,
            refusals: st.refusals,
            errors: st.errors,
            wqes_retransmitted: st.wqes_retransmitted,
            wqes_skipped: st.wqes_skipped,
            last_fallback_latency_us: st.last_fallback_latency.map(|d| d.as_secs_f64() * 1e6),
            events: events
                .iter()
                .map(|e| EventJson {
                    event: e.clone(),
                    t_ms: e.unix_ms - start_unix_ms,
                })
                .collect(),
        }
    }

    /// Adds another QP's section (allreduce ranks run two).
    pub fn merge(&mut self, other: FailoverJson) {
        self.failovers += other.failovers;
        self.switch_backs += other.switch_backs;
        self.backup_rearms += other.backup_rearms;
        self.default_control_repairs += other.default_control_repairs;
        self.failbacks += other.failbacks;
        self.refusals += other.refusals;
        self.errors += other.errors;
        self.wqes_retransmitted += other.wqes_retransmitted;
        self.wqes_skipped += other.wqes_skipped;
        self.last_fallback_latency_us = other
            .last_fallback_latency_us
            .or(self.last_fallback_latency_us);
        self.events.extend(other.events);
        self.events
            .sort_by(|a, b| a.event.unix_ms.total_cmp(&b.event.unix_ms));
    }

    /// Prints the summary perftest lacks, for a resilient QP only: a plain run's output
    /// ends with perftest's table, as a script that reads the last rows expects.
    pub fn print(&self, resilient: bool) {
        if !resilient {
            return;
        }
        say!(
            " Failover summary: {} failover(s), {} switch-back(s), {} refusal(s), {} error(s); WQEs retransmitted {}, skipped {}; last fallback latency {}",
            self.failovers,
            self.switch_backs,
            self.refusals,
            self.errors,
            self.wqes_retransmitted,
            self.wqes_skipped,
            self.last_fallback_latency_us
                .map_or("-".to_owned(), |us| format!("{us:.1} us"))
        );
        for EventJson { event: e, t_ms } in &self.events {
            say!(
                "   {:>10.1} ms  {:<11} cause {:<22} device {:<20} fallback {:>10}  copied {} retransmitted {} skipped {}",
                t_ms,
                e.kind.as_str(),
                e.cause.as_str(),
                e.device,
                e.fallback_latency_us
                    .map_or("-".to_owned(), |us| format!("{us:.1} us")),
                e.wqes_copied,
                e.wqes_retransmitted,
                e.wqes_skipped
            );
        }
    }
}

/// The `check` section.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CheckJson {
    /// Whether `--check` was on.
    pub enabled: bool,
    /// Bytes verified.
    pub bytes_checked: u64,
    /// Corrupted bytes found.
    pub errors: u64,
    /// Notifications verified.
    pub notifications_checked: u64,
    /// Lost, duplicated or reordered notifications.
    pub notification_errors: u64,
}

/// The atomic counters of `shift_atomic_bw` (proof of no double execution).
#[derive(Debug, Clone, Default, Serialize)]
pub struct AtomicJson {
    /// FETCH_ADDs posted.
    pub posted: u64,
    /// FETCH_ADDs completed successfully.
    pub completed: u64,
    /// The server's counter at the end (every executed FETCH_ADD adds one), when known.
    pub remote_counter: Option<u64>,
    /// Whether the fetched values were exactly 0, 1, 2, ... in completion order (the
    /// server writes `true`: it fetches nothing).
    pub fetched_in_sequence: bool,
    /// Executions beyond one per posted FETCH_ADD (`remote_counter - posted`, if positive).
    pub double_executions: u64,
}

/// The whole JSON report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Binary name.
    pub tool: String,
    /// Format version.
    pub version: u32,
    /// client or server.
    pub role: String,
    /// Default device.
    pub device: String,
    /// Backup device.
    pub backup_device: Option<String>,
    /// Whether a resilient QP with failover ran.
    pub failover_enabled: bool,
    /// Who drives the devices and the failover work: `engines` (softnic engine threads and
    /// a failover service thread), `manual` (the polling thread drives the device; no
    /// failover), `run-to-completion` (the polling thread drives both devices and runs the
    /// failover service: a resilient run with `--poll busy`).
    pub progress: String,
    /// write | send | read | atomic | allreduce
    pub op: String,
    /// Message size of the last run.
    pub size: usize,
    /// Iterations of the last run.
    pub iterations: u64,
    /// Wall time of the last run.
    pub duration_s: f64,
    /// Path MTU.
    pub mtu: u32,
    /// QPs.
    pub qps: u32,
    /// `-b`: both sides sent (each report counts its own direction).
    pub bidirectional: bool,
    /// `--idle-qps`: connected QPs beside the measured one that carried nothing.
    pub idle_qps: u32,
    /// Peak bandwidth.
    pub bw_peak_gbps: f64,
    /// Average bandwidth.
    pub bw_avg_gbps: f64,
    /// Peak bandwidth, MiB/s.
    pub bw_peak_mibps: f64,
    /// Average bandwidth, MiB/s.
    pub bw_avg_mibps: f64,
    /// Message rate.
    pub msg_rate_mpps: f64,
    /// One row per size, this side's measurement.
    pub results: Vec<ResultRow>,
    /// What the printed table shows: `self` (`results`); `peer` (a WRITE, READ or atomic
    /// server prints the client's rows, as perftest's server does); `sum` (`-b`: both
    /// directions added up, as perftest prints a bidirectional run).
    pub table_from: String,
    /// The rows the peer sent at the end (the client's for a server, the other
    /// direction's for `-b`); empty otherwise.
    pub peer_results: Vec<ResultRow>,
    /// Latency tools only.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub latency: Option<Latency>,
    /// Allreduce only: iterations per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iterations_per_s: Option<f64>,
    /// Allreduce only: ranks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ranks: Option<u32>,
    /// Allreduce only: this rank.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// The timeline.
    pub timeline: Vec<Sample>,
    /// Failover counters and events.
    pub failover: FailoverJson,
    /// Data check.
    pub check: Option<CheckJson>,
    /// Atomic counters (`shift_atomic_bw`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub atomic: Option<AtomicJson>,
    /// What the tool did with each command of its fault channel (`--fault-fifo`); absent
    /// without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub faults: Option<Vec<crate::faults::FaultJson>>,
    /// The error that stopped the run.
    pub error: Option<String>,
}

/// Gb/s to MiB/s.
pub fn gbps_to_mibps(gbps: f64) -> f64 {
    gbps * 1e9 / 8.0 / (1024.0 * 1024.0)
}

impl Report {
    /// Fills in the top-level bandwidth keys from the last row.
    pub fn set_results(&mut self, rows: Vec<ResultRow>) {
        if let Some(last) = rows.last() {
            self.size = last.size;
            self.iterations = last.iterations;
            self.duration_s = last.duration_s;
            self.bw_peak_gbps = last.bw_peak_gbps;
            self.bw_avg_gbps = last.bw_avg_gbps;
            self.bw_peak_mibps = gbps_to_mibps(last.bw_peak_gbps);
            self.bw_avg_mibps = gbps_to_mibps(last.bw_avg_gbps);
            self.msg_rate_mpps = last.msg_rate_mpps;
        }
        self.results = rows;
    }

    /// Writes the report as JSON to `path`.
    pub fn write(&self, path: &std::path::Path) -> Result<(), crate::error::AppError> {
        let text = serde_json::to_string_pretty(self).expect("the report serialises");
        std::fs::write(path, text + "\n").map_err(|e| crate::error::AppError::Output {
            path: path.display().to_string(),
            reason: e.to_string(),
        })
    }
}

/// perftest's separator line.
pub const RULE: &str =
    "---------------------------------------------------------------------------------------";

/// The bandwidth table's header.
pub fn bw_header(gbits: bool) -> String {
    let unit = if gbits { "Gb/sec" } else { "MB/sec" };
    format!(" #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]")
}

/// One bandwidth row.
pub fn bw_row(r: &ResultRow, gbits: bool) -> String {
    let conv = |g: f64| if gbits { g } else { gbps_to_mibps(g) };
    format!(
        " {:<10} {:<10}       {:>10.2}            {:>10.2}          {:>10.6}",
        r.size,
        r.iterations,
        conv(r.bw_peak_gbps),
        conv(r.bw_avg_gbps),
        r.msg_rate_mpps
    )
}

/// A row as a perftest peer's result exchange carries it (bandwidth in the unit of the
/// table, MB/s = MiB/s or Gb/s).
pub fn perftest_bw_report(r: &ResultRow, gbits: bool) -> crate::perftest_exchange::BwReport {
    let conv = |g: f64| if gbits { g } else { gbps_to_mibps(g) };
    crate::perftest_exchange::BwReport {
        size: r.size as u64,
        iters: r.iterations,
        bw_peak: conv(r.bw_peak_gbps),
        bw_avg: conv(r.bw_avg_gbps),
        msg_rate: r.msg_rate_mpps,
    }
}

/// The row of a perftest peer's result (the inverse of [`perftest_bw_report`]).
pub fn row_of_perftest_report(p: &crate::perftest_exchange::BwReport, gbits: bool) -> ResultRow {
    let gbps = |v: f64| {
        if gbits {
            v
        } else {
            v * 1024.0 * 1024.0 * 8.0 / 1e9
        }
    };
    ResultRow {
        size: p.size as usize,
        iterations: p.iters,
        bw_peak_gbps: gbps(p.bw_peak),
        bw_avg_gbps: gbps(p.bw_avg),
        msg_rate_mpps: p.msg_rate,
        duration_s: if p.msg_rate > 0.0 {
            p.iters as f64 / (p.msg_rate * 1e6)
        } else {
            0.0
        },
        latency: None,
    }
}

/// The latency table's header.
pub fn lat_header() -> String {
    " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]"
        .to_owned()
}

/// One latency row.
pub fn lat_row(size: usize, iters: u64, l: &Latency) -> String {
    format!(
        " {:<6} {:<10}     {:<10.2}     {:<10.2}   {:<10.2}         {:<10.2}     {:<10.2}      {:<10.2}             {:<10.2}",
        size,
        iters,
        l.lat_min_us,
        l.lat_max_us,
        l.lat_typical_us,
        l.lat_avg_us,
        l.lat_stdev_us,
        l.lat_p99_us,
        l.lat_p999_us
    )
}
