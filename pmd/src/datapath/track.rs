//! Per-WQE bookkeeping shared between a work queue (which posts) and the CQ (which completes).
//!
//! The send side keeps, for every basic block where a WQE starts, a [`Slot`]: the WQE's
//! `wr_id`, its work-request sequence number and its size in basic blocks. A requester CQE
//! names the WQE index of the WQE it completes; the consumer counter then jumps past that WQE,
//! which also retires every unsignaled WQE before it: that is how unsignaled work completes
//! without completions of its own, and why the wr_id reported is the signaled WQE's and not
//! the oldest one's. The opcode and flags of a WQE are in its control segment in the ring
//! (the send queue reads them there, [`WqeInfo`]); a requester CQE carries the opcode too.
//!
//! Fields are atomics so that a queue and its CQ may live on different threads without a data
//! race; on the datapath they are `Relaxed` loads and stores (plain moves on x86), ordered by
//! the doorbell and the CQE owner byte. The consumer counter is the one exception: the poller
//! publishes it with `Release` after reading the slots, and the poster reads it with `Acquire`
//! before reusing them.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use hw_defs::mlx5::SendOpcode;

/// What a send WQE is, as its control segment says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WqeInfo {
    /// Basic blocks the WQE takes.
    pub bbs: u8,
    /// Its mlx5 opcode.
    pub opcode: SendOpcode,
    /// Whether it asked for a completion on success.
    pub signaled: bool,
}

/// The bookkeeping of the WQE that starts at one basic block of the send ring.
#[derive(Debug, Default)]
#[repr(C)]
pub(crate) struct Slot {
    /// The work request's id.
    pub wr_id: AtomicU64,
    /// [`Slot::meta`]: its basic blocks (low half) and the blocks posted beyond one per work
    /// request before it (high half), so that `counter - extra` is the work-request counter
    /// at it (`max_send_wr` counts work requests, the ring basic blocks).
    pub meta: AtomicU64,
}

impl Slot {
    /// The `meta` word of a WQE of `bbs` blocks with `extra` blocks beyond one per work
    /// request before it.
    pub const fn meta(bbs: u32, extra: u32) -> u64 {
        bbs as u64 | (extra as u64) << 32
    }
}

/// What the CQ learns when a requester CQE retires send WQEs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SendRetired {
    pub wr_id: u64,
}

/// The send queue's per-WQE table and counters.
#[derive(Debug)]
pub(crate) struct SendTrack {
    /// One slot per basic block; a WQE's is the one of its first block.
    slots: Box<[Slot]>,
    /// Mask of the ring in basic blocks (entries - 1).
    wqe_m: u32,
    /// Consumer counter (basic blocks): everything before it has completed (the CQ writes it).
    wqe_ci: AtomicU32,
    /// Producer counter published in the doorbell record (the send queue writes it): a CQE
    /// can only name a WQE before it.
    wqe_db_pi: AtomicU32,
}

impl SendTrack {
    pub fn new(bbs: u32) -> SendTrack {
        SendTrack {
            slots: (0..bbs).map(|_| Slot::default()).collect(),
            wqe_m: bbs - 1,
            wqe_ci: AtomicU32::new(0),
            wqe_db_pi: AtomicU32::new(0),
        }
    }

    /// The slot table, for the send queue's fast path, which writes slot `counter & wqe_m`
    /// through it. The table lives as long as the track. Taken from the whole table, not its
    /// first element: a pointer from `&slots[0]` may reach that slot only, and writing the
    /// others through it was undefined behaviour (Miri, Stacked Borrows).
    pub fn slots_ptr(&self) -> std::ptr::NonNull<Slot> {
        std::ptr::NonNull::from(&self.slots[..]).cast()
    }

    /// The slot of producer counter `at`.
    #[inline(always)]
    fn slot(&self, at: u32) -> &Slot {
        let i = (at & self.wqe_m) as usize;
        // SAFETY: i <= wqe_m and the table has wqe_m + 1 slots.
        unsafe { self.slots.get_unchecked(i) }
    }

    /// Records a WQE of `bbs` blocks written at producer counter `at`, with `extra` blocks
    /// beyond one per work request posted before it.
    #[inline]
    pub fn record(&self, at: u32, wr_id: u64, bbs: u32, extra: u32) {
        let slot = self.slot(at);
        slot.wr_id.store(wr_id, Ordering::Relaxed);
        slot.meta.store(Slot::meta(bbs, extra), Ordering::Relaxed);
    }

    /// Publishes the doorbell record's producer counter (for the CQ's sanity check of WQE
    /// indices).
    #[inline]
    pub fn set_wqe_db_pi(&self, wqe_db_pi: u32) {
        self.wqe_db_pi.store(wqe_db_pi, Ordering::Relaxed);
    }

    /// The consumer counter, for the poster's queue-full check.
    #[inline]
    pub fn wqe_ci(&self) -> u32 {
        // Acquire: the poller's reads of the slots before this counter are done; they may be
        // overwritten.
        self.wqe_ci.load(Ordering::Acquire)
    }

    /// The `wr_id` of the WQE at producer counter `at`.
    #[inline]
    pub fn wr_id(&self, at: u32) -> u64 {
        self.slot(at).wr_id.load(Ordering::Relaxed)
    }

    /// The blocks beyond one per work request posted before the WQE at producer counter `at`.
    #[inline]
    pub fn extra(&self, at: u32) -> u32 {
        (self.slot(at).meta.load(Ordering::Relaxed) >> 32) as u32
    }

    /// The basic blocks of the WQE at producer counter `at`.
    #[inline]
    pub fn bbs(&self, at: u32) -> u32 {
        self.slot(at).meta.load(Ordering::Relaxed) as u32
    }

    /// Retires everything up to and including the WQE at `wqe_index`; `None` if that index
    /// is not an outstanding WQE (a stale or bogus CQE), in which case nothing changes.
    #[inline]
    pub fn retire(&self, wqe_index: u16) -> Option<SendRetired> {
        let wqe_ci = self.wqe_ci.load(Ordering::Relaxed);
        let wqe_db_pi = self.wqe_db_pi.load(Ordering::Relaxed);
        let distance = u32::from(wqe_index.wrapping_sub(wqe_ci as u16));
        if distance >= wqe_db_pi.wrapping_sub(wqe_ci) {
            return None;
        }
        let at = wqe_ci.wrapping_add(distance);
        let slot = self.slot(at);
        let wr_id = slot.wr_id.load(Ordering::Relaxed);
        let next = at.wrapping_add((slot.meta.load(Ordering::Relaxed) as u32).max(1));
        // Release: the slot reads above happen before the poster may reuse the slots.
        self.wqe_ci.store(next, Ordering::Release);
        Some(SendRetired { wr_id })
    }

    /// The CQ's batch view of this track, for retiring many WQEs with one consumer-counter
    /// store ([`SendRetirer`]).
    #[inline(always)]
    pub fn retirer(&self) -> SendRetirer<'_> {
        let wqe_ci = self.wqe_ci.load(Ordering::Relaxed);
        SendRetirer {
            slots: &self.slots,
            wqe_m: self.wqe_m,
            wqe_ci,
            left: self.wqe_db_pi.load(Ordering::Relaxed).wrapping_sub(wqe_ci),
            track: self,
        }
    }

    /// Both counters back to zero (the QP went to RESET).
    pub fn reset(&self) {
        self.wqe_ci.store(0, Ordering::Release);
        self.wqe_db_pi.store(0, Ordering::Relaxed);
    }

    /// Consumer and published producer counters.
    #[cfg(test)]
    pub fn counters(&self) -> (u32, u32) {
        (
            self.wqe_ci.load(Ordering::Acquire),
            self.wqe_db_pi.load(Ordering::Relaxed),
        )
    }
}

/// A CQ poller's hold on one send track for a batch of completions: the counters in registers,
/// the consumer counter published once at the end ([`SendRetirer::finish`]) instead of per
/// CQE. Only the poller writes the consumer counter, so nothing else moves it meanwhile; the
/// published producer counter is read once (WQEs published later cannot have CQEs yet in
/// this batch's view, and a CQE naming one is taken as stale, as `SendTrack::retire` does).
pub(crate) struct SendRetirer<'a> {
    slots: &'a [Slot],
    wqe_m: u32,
    /// The consumer counter.
    wqe_ci: u32,
    /// Blocks published and not retired: `wqe_db_pi - wqe_ci`, kept instead of the published
    /// counter so the check of a CQE is one compare.
    left: u32,
    track: &'a SendTrack,
}

impl SendRetirer<'_> {
    /// As [`SendTrack::retire`], without publishing the consumer counter.
    #[inline(always)]
    pub fn retire(&mut self, wqe_index: u16) -> Option<u64> {
        let distance = u32::from(wqe_index.wrapping_sub(self.wqe_ci as u16));
        if distance >= self.left {
            return None;
        }
        // The WQE index is the counter mod 2^16 and the table is smaller: its low bits are
        // the slot.
        // SAFETY: the index is masked to the table, which has wqe_m + 1 slots.
        let slot = unsafe {
            self.slots
                .get_unchecked((u32::from(wqe_index) & self.wqe_m) as usize)
        };
        let wr_id = slot.wr_id.load(Ordering::Relaxed);
        let retired = distance.wrapping_add(slot.meta.load(Ordering::Relaxed) as u32);
        self.wqe_ci = self.wqe_ci.wrapping_add(retired);
        self.left = self.left.wrapping_sub(retired);
        Some(wr_id)
    }

    /// Publishes the consumer counter.
    #[inline(always)]
    pub fn finish(self) {
        // Release: the slot reads of this batch happen before the poster may reuse the slots.
        self.track.wqe_ci.store(self.wqe_ci, Ordering::Release);
    }
}

/// The receive queue's wr_ids and counters. Receives complete in order.
#[derive(Debug)]
pub(crate) struct RecvTrack {
    /// The `wr_id` of each receive slot.
    wr_id: Box<[AtomicU64]>,
    /// Mask of the ring in receive WQEs (entries - 1).
    rwqe_m: u32,
    /// Consumer counter: receives before it have completed (the CQ writes it).
    rwqe_ci: AtomicU32,
    /// Producer counter: receives before it are written (the receive queue writes it).
    rwqe_pi: AtomicU32,
}

impl RecvTrack {
    pub fn new(slots: u32) -> RecvTrack {
        RecvTrack {
            wr_id: (0..slots).map(|_| AtomicU64::new(0)).collect(),
            rwqe_m: slots - 1,
            rwqe_ci: AtomicU32::new(0),
            rwqe_pi: AtomicU32::new(0),
        }
    }

    #[inline]
    pub fn record(&self, at: u32, wr_id: u64) {
        self.wr_id[(at & self.rwqe_m) as usize].store(wr_id, Ordering::Relaxed);
    }

    #[inline]
    pub fn set_rwqe_pi(&self, rwqe_pi: u32) {
        self.rwqe_pi.store(rwqe_pi, Ordering::Relaxed);
    }

    #[inline]
    pub fn rwqe_ci(&self) -> u32 {
        self.rwqe_ci.load(Ordering::Acquire)
    }

    #[inline]
    pub fn wr_id(&self, at: u32) -> u64 {
        self.wr_id[(at & self.rwqe_m) as usize].load(Ordering::Relaxed)
    }

    /// Retires the oldest receive; `None` if none is outstanding.
    #[inline]
    pub fn retire(&self) -> Option<u64> {
        let rwqe_ci = self.rwqe_ci.load(Ordering::Relaxed);
        if rwqe_ci == self.rwqe_pi.load(Ordering::Relaxed) {
            return None;
        }
        let wr_id = self.wr_id(rwqe_ci);
        // Release: as for the send track.
        self.rwqe_ci
            .store(rwqe_ci.wrapping_add(1), Ordering::Release);
        Some(wr_id)
    }

    pub fn reset(&self) {
        self.rwqe_ci.store(0, Ordering::Release);
        self.rwqe_pi.store(0, Ordering::Relaxed);
    }

    /// Consumer and producer counters.
    pub fn counters(&self) -> (u32, u32) {
        (
            self.rwqe_ci.load(Ordering::Acquire),
            self.rwqe_pi.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signaled_completion_retires_the_unsignaled_wqes_before_it() {
        let t = SendTrack::new(16);
        t.record(0, 100, 1, 0);
        t.record(1, 101, 2, 0);
        t.record(3, 102, 1, 1);
        t.set_wqe_db_pi(4);
        let r = t.retire(3).unwrap();
        assert_eq!(r.wr_id, 102);
        assert_eq!(t.counters(), (4, 4));
    }

    #[test]
    fn indices_outside_the_outstanding_window_are_refused() {
        let t = SendTrack::new(16);
        t.record(0, 1, 1, 0);
        t.set_wqe_db_pi(1);
        assert_eq!(t.retire(1), None);
        assert_eq!(t.retire(0xffff), None);
        assert_eq!(t.counters(), (0, 1));
        assert!(t.retire(0).is_some());
        assert_eq!(t.retire(0), None, "a second CQE for the same WQE is stale");
    }

    #[test]
    fn wqe_indices_wrap_at_sixteen_bits() {
        let t = SendTrack::new(16);
        // Start just below the 16-bit wrap.
        let base = 0xfffe_u32;
        t.wqe_ci.store(base, Ordering::Relaxed);
        t.record(base, 1, 1, 0);
        t.record(base + 1, 2, 1, 0);
        t.record(base + 2, 3, 1, 0);
        t.set_wqe_db_pi(base + 3);
        assert_eq!(t.retire(0).unwrap().wr_id, 3);
        assert_eq!(t.counters().0, base + 3);
    }

    #[test]
    fn the_work_request_counter_is_the_block_counter_less_the_extra_blocks() {
        let t = SendTrack::new(8);
        // WQEs of 1, 3 and 1 blocks: work requests 0, 1 and 2 start at blocks 0, 1 and 4.
        t.record(0, 10, 1, 0);
        t.record(1, 11, 3, 0);
        t.record(4, 12, 1, 2);
        assert_eq!(4 - t.extra(4), 2);
        assert_eq!((t.bbs(1), t.bbs(4)), (3, 1));
    }

    #[test]
    fn a_batch_retirer_agrees_with_retire_and_publishes_once() {
        let t = SendTrack::new(8);
        t.record(0, 10, 2, 0);
        t.record(2, 11, 1, 1);
        t.record(3, 12, 1, 1);
        t.set_wqe_db_pi(4);
        let mut r = t.retirer();
        assert_eq!(r.retire(0), Some(10));
        assert_eq!(r.retire(4), None, "not published");
        assert_eq!(t.counters().0, 0, "nothing published before finish");
        assert_eq!(r.retire(3), Some(12));
        r.finish();
        assert_eq!(t.counters(), (4, 4));
    }

    #[test]
    fn receives_retire_in_order_and_not_past_the_producer() {
        let t = RecvTrack::new(4);
        t.record(0, 10);
        t.record(1, 11);
        t.set_rwqe_pi(2);
        assert_eq!(t.retire(), Some(10));
        assert_eq!(t.retire(), Some(11));
        assert_eq!(t.retire(), None);
    }
}
