//! Time as the failover machine sees it: a number handed in by the caller.

use core::ops::Add;
use core::time::Duration;

/// A point on the caller's monotonic clock, in nanoseconds from an arbitrary origin.
///
/// The machine never reads a clock: the driver passes `now` with every event, so a real clock
/// (CLOCK_MONOTONIC, the TSC), softnic's virtual clock and the model checker's frozen clock all
/// drive the same code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp {
    nanos: u64,
}

impl Timestamp {
    /// The origin of the caller's clock.
    pub const ZERO: Timestamp = Timestamp { nanos: 0 };
    /// The end of time: a deadline that never comes.
    pub const MAX: Timestamp = Timestamp { nanos: u64::MAX };

    /// A timestamp `nanos` nanoseconds after the origin.
    pub const fn from_nanos(nanos: u64) -> Self {
        Timestamp { nanos }
    }

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.nanos
    }

    /// How long after `earlier` this is (zero if it is not later).
    pub fn saturating_since(self, earlier: Timestamp) -> Duration {
        Duration::from_nanos(self.nanos.saturating_sub(earlier.nanos))
    }
}

impl Add<Duration> for Timestamp {
    type Output = Timestamp;

    /// Saturates at the end of time rather than wrapping: a deadline too far away to represent
    /// is one that never comes.
    fn add(self, rhs: Duration) -> Timestamp {
        let nanos = u64::try_from(rhs.as_nanos()).unwrap_or(u64::MAX);
        Timestamp {
            nanos: self.nanos.saturating_add(nanos),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adding_a_duration_moves_forward() {
        let t = Timestamp::from_nanos(1_000) + Duration::from_micros(2);
        assert_eq!(t.as_nanos(), 3_000);
    }

    #[test]
    fn adding_saturates_instead_of_wrapping() {
        let t = Timestamp::from_nanos(u64::MAX - 1) + Duration::from_secs(1);
        assert_eq!(t.as_nanos(), u64::MAX);
    }

    #[test]
    fn since_an_later_timestamp_is_zero() {
        let early = Timestamp::from_nanos(5);
        let late = Timestamp::from_nanos(9);
        assert_eq!(early.saturating_since(late), Duration::ZERO);
        assert_eq!(late.saturating_since(early), Duration::from_nanos(4));
    }
}
