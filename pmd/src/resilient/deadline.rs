//! [`DeadlineBoard`]: the earliest of many owners' deadlines, published without a lock, so
//! that a service round walks its owners only once one is due.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::failover::Timestamp;

/// The earliest deadline any QP of a service (or any end of a management socket) published
/// since the service last looked at them all: the service walks its QPs' timers (the
/// socket its ends' resends) only once that time has come, so a round's cost does not grow
/// with QPs that wait for nothing (`docs/failover.md` 9.2).
///
/// Each publish lowers it (`fetch_min`); the service resets it to "never" *before* reading
/// the QPs' deadlines in its walk and lowers it again by each one it leaves waiting, so a
/// deadline published during the walk is either read by the walk or left on the board.
#[derive(Debug, Clone)]
pub(crate) struct DeadlineBoard(Arc<AtomicU64>);

impl DeadlineBoard {
    /// A board with no deadline.
    pub fn new() -> DeadlineBoard {
        DeadlineBoard(Arc::new(AtomicU64::new(u64::MAX)))
    }

    /// Lowers the earliest deadline to `nanos` (`u64::MAX`: no deadline, no change).
    pub fn lower_to(&self, nanos: u64) {
        if nanos != u64::MAX {
            self.0.fetch_min(nanos, Ordering::SeqCst);
        }
    }

    /// The earliest deadline, if any.
    pub fn earliest(&self) -> Option<Timestamp> {
        match self.0.load(Ordering::Relaxed) {
            u64::MAX => None,
            n => Some(Timestamp::from_nanos(n)),
        }
    }

    /// Forgets every deadline, before a walk that reads them all again.
    pub fn clear(&self) {
        // A swap, not a store: it may not pass the deadline loads of the walk after it.
        self.0.swap(u64::MAX, Ordering::SeqCst);
    }
}
