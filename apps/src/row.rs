//! One result row's figures as they travel between the two ends (a client sends its rows in
//! its `done` message, so the server can print perftest's table) and as the report prints
//! them: a leaf both `exchange` and `report` use.

use serde::{Deserialize, Serialize};

/// One result row as the peer measured it (`report::ResultRow`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PeerRow {
    /// Message size.
    pub size: usize,
    /// Completed iterations.
    pub iterations: u64,
    /// Peak bandwidth, Gb/s.
    pub bw_peak_gbps: f64,
    /// Average bandwidth, Gb/s.
    pub bw_avg_gbps: f64,
    /// Messages per second, millions.
    pub msg_rate_mpps: f64,
    /// Measured wall time, seconds.
    pub duration_s: f64,
    /// A latency client's figures for the size: its server prints them, as perftest's
    /// latency server prints a result row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<Latency>,
}

/// Latency figures, microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Smallest sample.
    pub lat_min_us: f64,
    /// Largest sample.
    pub lat_max_us: f64,
    /// perftest's typical: the median.
    pub lat_typical_us: f64,
    /// Mean.
    pub lat_avg_us: f64,
    /// Standard deviation.
    pub lat_stdev_us: f64,
    /// Median.
    pub lat_p50_us: f64,
    /// 99th percentile.
    pub lat_p99_us: f64,
    /// 99.9th percentile.
    pub lat_p999_us: f64,
}
