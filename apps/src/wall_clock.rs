//! Wall-clock time as the reports and the fault log write it: milliseconds since the Unix
//! epoch, so one run's events line up with another process's and with `ip link` logs.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, now.
pub fn unix_ms_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1e3)
        .unwrap_or(0.0)
}
