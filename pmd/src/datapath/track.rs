//! Per-WQE bookkeeping shared between a work queue (which posts) and the CQ (which completes).
//!
//! The send side keeps, for every basic block where a WQE starts, the WQE's `wr_id`, its size
//! in basic blocks, its opcode and whether it was signaled. A requester CQE names the WQE index
//! of the WQE it completes; the consumer counter then jumps past that WQE, which also retires
//! every unsignaled WQE before it: that is how unsignaled work completes without completions
//! of its own, and why the wr_id reported is the signaled WQE's and not the oldest one's.
//!
//! Fields are atomics so that a queue and its CQ may live on different threads without a data
//! race; on the datapath they are `Relaxed` loads and stores (plain moves on x86), ordered by
//! the doorbell and the CQE owner byte. The consumer counter is the one exception: the poller
//! publishes it with `Release` after reading the slots, and the poster reads it with `Acquire`
//! before reusing them.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use hw_defs::mlx5::SendOpcode;

/// Bookkeeping of one send WQE, as stored in the send track.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WqeInfo {
    /// Basic blocks the WQE takes.
    pub bbs: u8,
    /// Its mlx5 opcode.
    pub opcode: SendOpcode,
    /// Whether it asked for a completion on success.
    pub signaled: bool,
}

impl WqeInfo {
    #[inline]
    fn pack(self) -> u32 {
        u32::from(self.bbs)
            | (u32::from(u8::from(self.opcode)) << 8)
            | (u32::from(self.signaled) << 16)
    }

    #[inline]
    fn unpack(v: u32) -> WqeInfo {
        WqeInfo {
            bbs: v as u8,
            opcode: SendOpcode::from((v >> 8) as u8),
            signaled: v & (1 << 16) != 0,
        }
    }
}

/// What the CQ learns when a requester CQE retires send WQEs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SendRetired {
    pub wr_id: u64,
    /// The raw mlx5 opcode: the CQ maps it straight to a completion opcode.
    pub opcode: u8,
}

/// The send queue's per-WQE table and counters.
#[derive(Debug)]
pub(crate) struct SendTrack {
    wr_id: Box<[AtomicU64]>,
    info: Box<[AtomicU32]>,
    mask: u32,
    /// Consumer counter in basic blocks: everything before it has completed.
    ci: AtomicU32,
    /// Producer counter in basic blocks: everything before it has been written.
    pi: AtomicU32,
}

impl SendTrack {
    pub fn new(bbs: u32) -> SendTrack {
        SendTrack {
            wr_id: (0..bbs).map(|_| AtomicU64::new(0)).collect(),
            info: (0..bbs).map(|_| AtomicU32::new(0)).collect(),
            mask: bbs - 1,
            ci: AtomicU32::new(0),
            pi: AtomicU32::new(0),
        }
    }

    /// Records a WQE written at producer counter `at`.
    #[inline]
    pub fn record(&self, at: u32, wr_id: u64, info: WqeInfo) {
        let slot = (at & self.mask) as usize;
        self.wr_id[slot].store(wr_id, Ordering::Relaxed);
        self.info[slot].store(info.pack(), Ordering::Relaxed);
    }

    /// Publishes the producer counter (for the CQ's sanity check of WQE indices).
    #[inline]
    pub fn set_pi(&self, pi: u32) {
        self.pi.store(pi, Ordering::Relaxed);
    }

    /// The consumer counter, for the poster's queue-full check.
    #[inline]
    pub fn ci(&self) -> u32 {
        // Acquire: the poller's reads of the slots before this counter are done; they may be
        // overwritten.
        self.ci.load(Ordering::Acquire)
    }

    /// The bookkeeping of the WQE at producer counter `at`.
    #[inline]
    pub fn get(&self, at: u32) -> (u64, WqeInfo) {
        let slot = (at & self.mask) as usize;
        (
            self.wr_id[slot].load(Ordering::Relaxed),
            WqeInfo::unpack(self.info[slot].load(Ordering::Relaxed)),
        )
    }

    /// Retires everything up to and including the WQE at `wqe_index`; `None` if that index
    /// is not an outstanding WQE (a stale or bogus CQE), in which case nothing changes.
    #[inline]
    pub fn retire(&self, wqe_index: u16) -> Option<SendRetired> {
        let ci = self.ci.load(Ordering::Relaxed);
        let pi = self.pi.load(Ordering::Relaxed);
        let distance = u32::from(wqe_index.wrapping_sub(ci as u16));
        if distance >= pi.wrapping_sub(ci) {
            return None;
        }
        let at = ci.wrapping_add(distance);
        let slot = (at & self.mask) as usize;
        let wr_id = self.wr_id[slot].load(Ordering::Relaxed);
        // The packed info, unpacked by hand: the enum conversion is a chain of compares.
        let info = self.info[slot].load(Ordering::Relaxed);
        let next = at.wrapping_add(u32::from((info as u8).max(1)));
        // Release: the slot reads above happen before the poster may reuse the slots.
        self.ci.store(next, Ordering::Release);
        Some(SendRetired {
            wr_id,
            opcode: (info >> 8) as u8,
        })
    }

    /// Both counters back to zero (the QP went to RESET).
    pub fn reset(&self) {
        self.ci.store(0, Ordering::Release);
        self.pi.store(0, Ordering::Relaxed);
    }

    /// Consumer and producer counters.
    #[cfg(test)]
    pub fn counters(&self) -> (u32, u32) {
        (
            self.ci.load(Ordering::Acquire),
            self.pi.load(Ordering::Relaxed),
        )
    }
}

/// The receive queue's wr_ids and counters. Receives complete in order.
#[derive(Debug)]
pub(crate) struct RecvTrack {
    wr_id: Box<[AtomicU64]>,
    mask: u32,
    ci: AtomicU32,
    pi: AtomicU32,
}

impl RecvTrack {
    pub fn new(slots: u32) -> RecvTrack {
        RecvTrack {
            wr_id: (0..slots).map(|_| AtomicU64::new(0)).collect(),
            mask: slots - 1,
            ci: AtomicU32::new(0),
            pi: AtomicU32::new(0),
        }
    }

    #[inline]
    pub fn record(&self, at: u32, wr_id: u64) {
        self.wr_id[(at & self.mask) as usize].store(wr_id, Ordering::Relaxed);
    }

    #[inline]
    pub fn set_pi(&self, pi: u32) {
        self.pi.store(pi, Ordering::Relaxed);
    }

    #[inline]
    pub fn ci(&self) -> u32 {
        self.ci.load(Ordering::Acquire)
    }

    #[inline]
    pub fn wr_id(&self, at: u32) -> u64 {
        self.wr_id[(at & self.mask) as usize].load(Ordering::Relaxed)
    }

    /// Retires the oldest receive; `None` if none is outstanding.
    #[inline]
    pub fn retire(&self) -> Option<u64> {
        let ci = self.ci.load(Ordering::Relaxed);
        if ci == self.pi.load(Ordering::Relaxed) {
            return None;
        }
        let wr_id = self.wr_id(ci);
        // Release: as for the send track.
        self.ci.store(ci.wrapping_add(1), Ordering::Release);
        Some(wr_id)
    }

    pub fn reset(&self) {
        self.ci.store(0, Ordering::Release);
        self.pi.store(0, Ordering::Relaxed);
    }

    pub fn counters(&self) -> (u32, u32) {
        (
            self.ci.load(Ordering::Acquire),
            self.pi.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(bbs: u8, signaled: bool) -> WqeInfo {
        WqeInfo {
            bbs,
            opcode: SendOpcode::RdmaWrite,
            signaled,
        }
    }

    #[test]
    fn a_signaled_completion_retires_the_unsignaled_wqes_before_it() {
        let t = SendTrack::new(16);
        t.record(0, 100, info(1, false));
        t.record(1, 101, info(2, false));
        t.record(3, 102, info(1, true));
        t.set_pi(4);
        let r = t.retire(3).unwrap();
        assert_eq!(r.wr_id, 102);
        assert_eq!(r.opcode, u8::from(SendOpcode::RdmaWrite));
        assert_eq!(t.counters(), (4, 4));
    }

    #[test]
    fn indices_outside_the_outstanding_window_are_refused() {
        let t = SendTrack::new(16);
        t.record(0, 1, info(1, true));
        t.set_pi(1);
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
        t.ci.store(base, Ordering::Relaxed);
        t.record(base, 1, info(1, false));
        t.record(base + 1, 2, info(1, false));
        t.record(base + 2, 3, info(1, true));
        t.set_pi(base + 3);
        assert_eq!(t.retire(0).unwrap().wr_id, 3);
        assert_eq!(t.counters().0, base + 3);
    }

    #[test]
    fn receives_retire_in_order_and_not_past_the_producer() {
        let t = RecvTrack::new(4);
        t.record(0, 10);
        t.record(1, 11);
        t.set_pi(2);
        assert_eq!(t.retire(), Some(10));
        assert_eq!(t.retire(), Some(11));
        assert_eq!(t.retire(), None);
    }
}
