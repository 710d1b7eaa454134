//! The time a resilient QP runs on: the monotonic clock, or a virtual clock shared with
//! softnic devices in deterministic simulations.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::failover::Timestamp;

/// Where failover timers and event timestamps come from.
///
/// The failover machine never reads a clock; the resilient QP reads this one and hands the
/// time in. A real clock counts from when it was made and pairs that moment with the wall
/// clock, so event logs carry Unix milliseconds that line up with `shift-testbed`'s failure
/// log. A virtual clock only moves when a simulation moves it; its "Unix" milliseconds are
/// virtual milliseconds since the simulation began.
#[derive(Debug, Clone)]
pub struct Clock {
    source: Source,
    /// Unix milliseconds at the clock's origin (0 for a virtual clock).
    unix_origin_ms: f64,
}

#[derive(Debug, Clone)]
enum Source {
    Real(Instant),
    Virtual(Arc<AtomicU64>),
}

impl Clock {
    /// The monotonic clock, with its origin now.
    pub fn real() -> Clock {
        let unix_origin_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64() * 1e3);
        Clock {
            source: Source::Real(Instant::now()),
            unix_origin_ms,
        }
    }

    /// A virtual clock reading `nanos` (nanoseconds since its origin), which the caller moves.
    pub fn virtual_nanos(nanos: Arc<AtomicU64>) -> Clock {
        Clock {
            source: Source::Virtual(nanos),
            unix_origin_ms: 0.0,
        }
    }

    /// The same time as a softnic device's clock: a virtual softnic clock is shared (the
    /// simulation moves both), a real one becomes a real clock of our own.
    #[cfg(feature = "soft")]
    pub fn from_softnic(clock: &softnic::Clock) -> Clock {
        match clock {
            softnic::Clock::Virtual(nanos) => Clock::virtual_nanos(nanos.clone()),
            softnic::Clock::Real(_) => Clock::real(),
        }
    }

    /// Whether the clock is virtual.
    pub fn is_virtual(&self) -> bool {
        matches!(self.source, Source::Virtual(_))
    }

    /// Now.
    pub fn now(&self) -> Timestamp {
        match &self.source {
            Source::Real(origin) => Timestamp::from_nanos(
                u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX),
            ),
            Source::Virtual(nanos) => Timestamp::from_nanos(nanos.load(Ordering::Acquire)),
        }
    }

    /// `t` as Unix milliseconds (virtual milliseconds for a virtual clock).
    pub fn unix_ms(&self, t: Timestamp) -> f64 {
        self.unix_origin_ms + t.as_nanos() as f64 / 1e6
    }

    /// How long from now until `t` (zero if it has passed).
    pub fn until(&self, t: Timestamp) -> Duration {
        t.saturating_since(self.now())
    }
}

impl Default for Clock {
    fn default() -> Clock {
        Clock::real()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_virtual_clock_reads_what_the_simulation_set() {
        let nanos = Arc::new(AtomicU64::new(0));
        let clock = Clock::virtual_nanos(nanos.clone());
        nanos.store(2_500_000, Ordering::Release);
        assert_eq!(clock.now(), Timestamp::from_nanos(2_500_000));
        assert_eq!(clock.unix_ms(clock.now()), 2.5);
    }

    #[test]
    fn a_real_clock_gives_unix_milliseconds_near_the_wall_clock() {
        let clock = Clock::real();
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
            * 1e3;
        assert!((clock.unix_ms(clock.now()) - wall).abs() < 1_000.0);
    }
}
