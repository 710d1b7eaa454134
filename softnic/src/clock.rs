//! Where a device reads the time from: the monotonic clock, or a virtual clock a test advances.
//!
//! Time is a [`Duration`] since the clock's epoch. A virtual clock is shared by every device of a
//! simulation and only moves when the test moves it, so a 67 ms ACK timeout costs no real time
//! and a run replays exactly.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A source of time for a device.
#[derive(Clone, Debug)]
pub enum Clock {
    /// The monotonic clock, counted from when this value was created.
    Real(Instant),
    /// A counter of nanoseconds that only [`Clock::advance_to`] and [`Clock::advance_by`] move.
    Virtual(Arc<AtomicU64>),
}

impl Clock {
    /// The monotonic clock, with its epoch now.
    pub fn real() -> Clock {
        Clock::Real(Instant::now())
    }

    /// A virtual clock at zero.
    pub fn new_virtual() -> Clock {
        Clock::Virtual(Arc::new(AtomicU64::new(0)))
    }

    /// Whether this is a virtual clock.
    pub fn is_virtual(&self) -> bool {
        matches!(self, Clock::Virtual(_))
    }

    /// The current time since the epoch.
    pub fn now(&self) -> Duration {
        match self {
            Clock::Real(epoch) => epoch.elapsed(),
            Clock::Virtual(nanos) => Duration::from_nanos(nanos.load(Ordering::Acquire)),
        }
    }

    /// Moves a virtual clock forward to `t` (never backwards). Does nothing to a real clock.
    pub fn advance_to(&self, t: Duration) {
        if let Clock::Virtual(nanos) = self {
            let t = u64::try_from(t.as_nanos()).unwrap_or(u64::MAX);
            nanos.fetch_max(t, Ordering::AcqRel);
        }
    }

    /// Moves a virtual clock forward by `d`. Does nothing to a real clock.
    pub fn advance_by(&self, d: Duration) {
        self.advance_to(self.now() + d);
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::real()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_clock_moves_only_when_advanced_and_never_back() {
        let clock = Clock::new_virtual();
        assert_eq!(clock.now(), Duration::ZERO);
        clock.advance_by(Duration::from_millis(67));
        assert_eq!(clock.now(), Duration::from_millis(67));
        clock.advance_to(Duration::from_millis(1));
        assert_eq!(clock.now(), Duration::from_millis(67));
    }

    #[test]
    fn clones_of_a_virtual_clock_share_one_time() {
        let a = Clock::new_virtual();
        let b = a.clone();
        a.advance_by(Duration::from_micros(5));
        assert_eq!(b.now(), Duration::from_micros(5));
    }
}
