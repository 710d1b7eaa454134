//! A QP's fast-path gate: one word a post reads to learn, in one compare, everything the fast
//! path must not miss that other threads decide.
//!
//! - the QP's state (bits 7..0, an `ibv_qp_state` number), which the control path changes;
//! - a hold (bit 8), which a layer above the QP sets while its posts must take another route
//!   (the failover layer, when the default QP is not where posts go);
//! - the key epoch (bits 63..9), which moves whenever the MR the QP's send queue cached (the
//!   key it [watches](QpGate::watch_key)) is deregistered, so a send queue's cached MR is
//!   trusted only while the epoch it was filled under holds.
//!
//! A send queue's fast path compares the word with the one it expects (RTS, no hold, the epoch
//! of its key cache); any difference sends it down the general path, which checks each part
//! by itself and says what is wrong. This replaces two loads and two compares (state, then the
//! key table's generation) with one, and lets the failover layer route posts without a branch
//! of its own on the hot path.

use std::sync::atomic::{fence, AtomicU64, Ordering};

use crate::qp_state::QpState;

const STATE_MASK: u64 = 0xff;
const HOLD: u64 = 1 << 8;
const EPOCH_ONE: u64 = 1 << 9;
/// The watched key when none is: no lkey (a `u32`) is equal to it.
const NO_KEY: u64 = u64::MAX;

/// The gate of one QP, shared by its send and receive queues, its control half and the key
/// table of its device.
#[derive(Debug)]
pub struct QpGate {
    word: AtomicU64,
    /// The lkey whose removal must move the key epoch: the one the send queue cached (or is
    /// about to look up), [`NO_KEY`] before the first. Written only by the send queue's
    /// poster, read by the key table's removals.
    watched: AtomicU64,
}

impl QpGate {
    /// A gate for a QP in `state`, epoch 0, not held.
    pub fn new(state: QpState) -> QpGate {
        QpGate {
            word: AtomicU64::new(state as u64),
            watched: AtomicU64::new(NO_KEY),
        }
    }

    /// The whole word, for the fast path's compare.
    #[inline(always)]
    pub fn word(&self) -> u64 {
        // Acquire pairs with the release updates below: a post that sees a word sees what was
        // decided before it was written (the MR removal before the epoch moved; the state).
        self.word.load(Ordering::Acquire)
    }

    /// The word the gate holds when the fast path may run with a key cache filled while the
    /// gate held `seen`: RTS, no hold, `seen`'s epoch.
    pub fn open_word(seen: u64) -> u64 {
        (seen & !(STATE_MASK | HOLD)) | QpState::Rts as u64
    }

    /// The QP's state as an `ibv_qp_state` number.
    #[inline]
    pub fn state(&self) -> u8 {
        (self.word() & STATE_MASK) as u8
    }

    /// Records a state change.
    pub fn set_state(&self, state: QpState) {
        let _ = self
            .word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                Some((w & !STATE_MASK) | state as u64)
            });
    }

    /// Holds (or releases) the fast path: while held, every post takes the general path.
    pub fn set_hold(&self, hold: bool) {
        if hold {
            self.word.fetch_or(HOLD, Ordering::AcqRel);
        } else {
            self.word.fetch_and(!HOLD, Ordering::AcqRel);
        }
    }

    /// Whether the fast path is held.
    pub fn held(&self) -> bool {
        self.word() & HOLD != 0
    }

    /// Moves the key epoch: the MR the send queue cached is going away, so it may not be
    /// trusted without a new lookup.
    pub fn bump_epoch(&self) {
        self.word.fetch_add(EPOCH_ONE, Ordering::AcqRel);
    }

    /// Says that the send queue is about to look `lkey` up and cache it: from now on a removal
    /// of `lkey` moves the epoch, and a removal of another key does not. Call before reading
    /// the word the cache will be trusted under; the caller's previous cache entry must be
    /// dropped first (its key is no longer watched).
    ///
    /// Against a removal ([`crate::keys::KeyTable::remove`]: clear the slot, fence, read the
    /// watched key, bump if it matches) this is the other half of a store-buffering pair, both
    /// fenced SeqCst: either the removal reads `lkey` here and moves the epoch, or this
    /// thread's later reads (the word, the lookup) see the slot already cleared.
    pub fn watch_key(&self, lkey: u32) {
        if self.watched.load(Ordering::Relaxed) != u64::from(lkey) {
            self.watched.store(u64::from(lkey), Ordering::Relaxed);
        }
        fence(Ordering::SeqCst);
    }

    /// Whether a removal of `lkey` must move this gate's epoch (the removal's half of
    /// [`QpGate::watch_key`]; the caller fences SeqCst after clearing the slot and before this).
    pub fn watches(&self, lkey: u32) -> bool {
        self.watched.load(Ordering::Relaxed) == u64::from(lkey)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_open_word_matches_only_rts_unheld_and_the_same_epoch() {
        let g = QpGate::new(QpState::Reset);
        let open = QpGate::open_word(g.word());
        assert_ne!(g.word(), open, "RESET is not open");
        g.set_state(QpState::Rts);
        assert_eq!(g.word(), open);
        g.set_hold(true);
        assert!(g.held());
        assert_ne!(g.word(), open, "held");
        g.set_hold(false);
        assert_eq!(g.word(), open);
        g.bump_epoch();
        assert_ne!(g.word(), open, "a deregistration happened since");
        assert_eq!(
            g.state(),
            QpState::Rts as u8,
            "the epoch leaves the state alone"
        );
        assert_eq!(g.word(), QpGate::open_word(g.word()));
        g.set_state(QpState::Err);
        assert_eq!(g.state(), QpState::Err as u8);
    }
}
