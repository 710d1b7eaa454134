//! The round's book: where a resilient QP's unfinished work and the failover's own WQEs stand
//! in the rings of its two QPs. Plain counters and flags, read by the planners
//! ([`super::plan`]) and kept up to date by the driver; no device access.

use std::collections::VecDeque;

use crate::datapath::sq::raw::OutstandingWqe;
use crate::datapath::wr::{WcStatus, WorkCompletion};
use crate::failover::Path;

use super::work::internal_wr_id;

/// What the driver learned from a QP's first error completion since it was brought up.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Errored {
    /// The send queue's consumer counter just before the first failed send completion: from
    /// there on, the WQEs are still the failover's (flushes retire them from the track, the
    /// bytes stay in the ring).
    pub send_start: Option<u32>,
    /// The same for the receive queue.
    pub recv_start: Option<u32>,
    /// The first error that was not a flush.
    pub first_error: Option<WcStatus>,
    /// Its completion, to surface as it is if failover refuses.
    pub error_wc: Option<WorkCompletion>,
    /// The machine has been told.
    pub reported: bool,
}

/// What a drain of the default QP saw while it waited: a slow drain's log says whether it
/// waited for completions, and for which, or was looked at late.
#[derive(Debug, Default)]
pub(super) struct DrainWatch {
    /// When the event that began the drain was handled: the actions before it (moving the
    /// default QP to ERR, which waits for the device's lock) count in the drain's time, as in
    /// its deadline.
    pub started: crate::failover::Timestamp,
    /// How many times it was looked at.
    pub checks: u32,
    /// Sends and receives published to the device without a completion, at the last look.
    pub shortfall: (u32, u32),
}

/// Where the failover's own WQEs and the application's unfinished ones stand.
#[derive(Debug, Default)]
pub(super) struct Book {
    /// Per QP (default, backup): where its error completions started.
    pub errored: [Errored; 2],
    /// A drain of the default QP is running.
    pub draining: bool,
    /// A failback drain of both QPs is running.
    pub failback_draining: bool,
    /// A failover round copied the default RQ's receives to the backup RQ and the default QP
    /// was not reset since: the default RQ counter just past the last one copied. Its ring
    /// still holds the originals, which a failback must not move, nor a failed connection
    /// complete, a second time; receives posted behind them (during a failback that took
    /// the round's place) are only there.
    pub default_recvs_copied: Option<u32>,
    /// A failback moved work onto the default SQ, withheld until the peer is ready: the next
    /// doorbell release ends the failback, not a switch-back.
    pub failing_back: bool,
    /// When the running drain stops waiting for flushes (`ResilientConfig::drain_timeout`).
    pub drain_deadline: Option<crate::failover::Timestamp>,
    /// What the running drain of the default QP has looked at, for its debug log.
    pub drain_watch: DrainWatch,
    /// The default device raised its device-fatal event: no flush will ever come.
    pub default_dead: bool,
    /// Where the default queues' WQEs to move start, (send, receive) counters: set when the
    /// drain ends, until the default QP's reset. Meanwhile the default CQ's completions are
    /// discarded (the round owns everything from these counters on).
    pub moving: Option<(u32, u32)>,
    /// Application receives that completed successfully on the default QP before its last
    /// reset. (Since then: the default receive queue's consumer counter, up to its first
    /// error; nothing is counted per completion on the fast path.)
    pub recvs_before_reset: u64,
    /// Application receives that completed successfully on the backup QP.
    pub recvs_on_backup: u64,
    /// Receive completions of the backup QP to swallow: stale WQEs at the head of its RQ.
    pub backup_stale: u64,
    /// Backup SQ counter ranges `[start, end)` of zero-length SENDs that burn stale receives.
    pub burns: VecDeque<(u32, u32)>,
    /// The default SQ counter of the outstanding probe.
    pub probe: Option<u32>,
    /// The backup SQ counter just past the outstanding switch-back fence.
    pub fence: Option<u32>,
    /// The same, for a fence that completed in error: the backup QP failed, the connection
    /// fails with it, and the error completions it owes the application leave the fence out.
    pub failed_fence: Option<u32>,
    /// Application WQEs a round could not move to the backup SQ (no backup key, no room),
    /// the first the one that failed, oldest first: they complete in error when the
    /// connection fails, after what went to the backup SQ.
    pub unsent: Vec<crate::datapath::sq::raw::OutstandingWqe>,
    /// The same for receives (wr_ids): a failback could not post them on the default RQ
    /// after the reset wiped the rings they came from.
    pub unsent_recvs: Vec<u64>,
}

impl Book {
    /// What the book knows of `path`'s QP.
    pub fn errored(&self, path: Path) -> &Errored {
        &self.errored[path_index(path)]
    }

    /// The same, to update.
    pub fn errored_mut(&mut self, path: Path) -> &mut Errored {
        &mut self.errored[path_index(path)]
    }

    /// Application receives completed successfully, on either QP, since the connection began,
    /// when the default receive queue's consumer counter is `default_rq_completed`.
    pub fn recvs_completed(&self, default_rq_completed: u32) -> u64 {
        let on_default = self.errored[0].recv_start.unwrap_or(default_rq_completed);
        self.recvs_before_reset + u64::from(on_default) + self.recvs_on_backup
    }

    /// Where the default queues' unfinished work starts, (send, receive) counters, when their
    /// consumer counters are `completed`: where the drain noted it, else where the first
    /// error completion was, else the consumer counters.
    pub fn default_unfinished(&self, completed: (u32, u32)) -> (u32, u32) {
        let e = &self.errored[0];
        self.moving.unwrap_or((
            e.send_start.unwrap_or(completed.0),
            e.recv_start.unwrap_or(completed.1),
        ))
    }

    /// Whether the backup SQ's WQE at `counter` is one of the burns.
    pub fn is_burn(&self, counter: u32) -> bool {
        self.burns.iter().any(|&(s, e)| in_range(counter, s, e))
    }

    /// Whether `w` is the failover's own (a burn, the fence, the probe), whose completion the
    /// application never sees: it carries the internal wr_id and sits where one of them was
    /// posted (an application may use the same wr_id).
    pub fn is_internal(&self, w: &OutstandingWqe) -> bool {
        w.wr_id == internal_wr_id()
            && (self.is_burn(w.counter)
                || [self.fence, self.failed_fence]
                    .iter()
                    .flatten()
                    .any(|&f| w.counter.wrapping_add(u32::from(w.info.bbs)) == f)
                || self.probe == Some(w.counter))
    }

    /// How many of the backup SQ's outstanding WQEs are the failover's own when its consumer
    /// counter is `done`: the burns not completed yet (one basic block each) and an
    /// outstanding fence.
    pub fn internal_on_backup(&self, done: u32) -> u32 {
        let burns: u32 = self
            .burns
            .iter()
            .map(|&(start, end)| {
                if in_range(done, start, end) {
                    end.wrapping_sub(done)
                } else if done.wrapping_sub(end) < (1 << 31) {
                    // `done` is at or past `end`: every burn of the range completed.
                    0
                } else {
                    end.wrapping_sub(start)
                }
            })
            .sum();
        let fences = [self.fence, self.failed_fence]
            .iter()
            .flatten()
            .filter(|&&past| past.wrapping_sub(done).wrapping_sub(1) < (1 << 31))
            .count() as u32;
        burns + fences
    }

    /// Forgets burn ranges the backup SQ has completed past: `done` is its consumer counter,
    /// `written` its producer counter.
    pub fn prune_burns(&mut self, done: u32, written: u32) {
        while let Some(&(_, end)) = self.burns.front() {
            // `end` is at or before the consumer counter: every burn of the range completed.
            if done.wrapping_sub(end) <= written.wrapping_sub(end)
                && done.wrapping_sub(end) < (1 << 31)
            {
                self.burns.pop_front();
            } else {
                break;
            }
        }
    }

    /// The default QP went to RESET (its rings back to index 0) with `default_rq_completed`
    /// receives completed on it: count them, forget where its errors started.
    pub fn default_reset(&mut self, default_rq_completed: u32) {
        let done = self.errored[0].recv_start.unwrap_or(default_rq_completed);
        self.recvs_before_reset += u64::from(done);
        self.errored[0] = Errored::default();
        self.default_recvs_copied = None;
        self.probe = None;
        self.moving = None;
        self.draining = false;
    }
}

impl Book {
    /// The backup QP went to RESET (its rings back to index 0) for a repair: the stale
    /// receives, burns and fences it held are gone with its rings.
    pub fn backup_reset(&mut self) {
        self.errored[1] = Errored::default();
        self.backup_stale = 0;
        self.burns.clear();
        self.fence = None;
        self.failed_fence = None;
    }
}

fn path_index(path: Path) -> usize {
    match path {
        Path::Default => 0,
        Path::Backup => 1,
    }
}

/// Whether counter `c` lies in `[start, end)` (wrapping).
pub(super) fn in_range(c: u32, start: u32, end: u32) -> bool {
    c.wrapping_sub(start) < end.wrapping_sub(start)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::track::WqeInfo;
    use hw_defs::mlx5::SendOpcode;

    fn internal_at(counter: u32, bbs: u8) -> OutstandingWqe {
        OutstandingWqe {
            counter,
            wr_id: internal_wr_id(),
            info: WqeInfo {
                bbs,
                opcode: SendOpcode::RdmaWrite,
                signaled: true,
            },
            published: true,
        }
    }

    #[test]
    fn counter_ranges_wrap_around() {
        assert!(in_range(5, 4, 6));
        assert!(!in_range(6, 4, 6));
        assert!(in_range(u32::MAX, u32::MAX - 1, 2));
        assert!(in_range(1, u32::MAX - 1, 2));
        assert!(!in_range(2, u32::MAX - 1, 2));
    }

    #[test]
    fn burns_the_fence_and_the_probe_are_the_failovers_own() {
        let book = Book {
            burns: VecDeque::from([(10, 12)]),
            fence: Some(21),
            probe: Some(7),
            ..Book::default()
        };
        assert!(book.is_internal(&internal_at(11, 1)));
        assert!(book.is_internal(&internal_at(20, 1)));
        assert!(book.is_internal(&internal_at(7, 1)));
        assert!(!book.is_internal(&internal_at(12, 1)));
        // The application may use the same wr_id: position decides.
        let application = OutstandingWqe {
            wr_id: 1,
            ..internal_at(11, 1)
        };
        assert!(!book.is_internal(&application));
    }

    #[test]
    fn the_failovers_own_outstanding_on_the_backup_are_the_burns_and_the_fence_not_done() {
        let book = Book {
            burns: VecDeque::from([(10, 12), (14, 17)]),
            fence: Some(21),
            ..Book::default()
        };
        // Before everything: 2 + 3 burns and the fence (the WQE at 20).
        assert_eq!(book.internal_on_backup(5), 6);
        // Inside the first range: 1 + 3 + 1.
        assert_eq!(book.internal_on_backup(11), 5);
        // Past both ranges, the fence not done.
        assert_eq!(book.internal_on_backup(17), 1);
        assert_eq!(book.internal_on_backup(20), 1);
        // Past the fence.
        assert_eq!(book.internal_on_backup(21), 0);
        // Counters that wrapped.
        let wrapped = Book {
            burns: VecDeque::from([(u32::MAX - 1, 2)]),
            ..Book::default()
        };
        assert_eq!(wrapped.internal_on_backup(u32::MAX - 3), 4);
        assert_eq!(wrapped.internal_on_backup(0), 2);
        assert_eq!(wrapped.internal_on_backup(2), 0);
    }

    #[test]
    fn a_burn_range_is_forgotten_once_the_backup_sq_completed_past_it() {
        let mut book = Book {
            burns: VecDeque::from([(10, 12), (14, 15)]),
            ..Book::default()
        };
        book.prune_burns(11, 20);
        assert_eq!(book.burns.len(), 2);
        book.prune_burns(12, 20);
        assert_eq!(book.burns, [(14, 15)]);
        book.prune_burns(20, 20);
        assert!(book.burns.is_empty());
    }

    #[test]
    fn receives_are_counted_across_resets_and_on_the_backup() {
        let mut book = Book::default();
        assert_eq!(book.recvs_completed(3), 3);
        book.errored[0].recv_start = Some(2);
        assert_eq!(book.recvs_completed(5), 2);
        book.default_reset(5);
        book.recvs_on_backup = 4;
        assert_eq!(book.recvs_completed(1), 2 + 1 + 4);
        assert!(book.errored[0].recv_start.is_none());
    }
}
