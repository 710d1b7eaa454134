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
    /// The `wr_id` of the WQE starting at each basic block.
    wr_id: Box<[AtomicU64]>,
    /// The packed [`WqeInfo`] of the WQE starting at each basic block.
    info: Box<[AtomicU32]>,
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
            wr_id: (0..bbs).map(|_| AtomicU64::new(0)).collect(),
            info: (0..bbs).map(|_| AtomicU32::new(0)).collect(),
            wqe_m: bbs - 1,
            wqe_ci: AtomicU32::new(0),
            wqe_db_pi: AtomicU32::new(0),
        }
    }

    /// Records a WQE written at producer counter `at`.
    #[inline]
    pub fn record(&self, at: u32, wr_id: u64, info: WqeInfo) {
        let slot = (at & self.wqe_m) as usize;
        self.wr_id[slot].store(wr_id, Ordering::Relaxed);
        self.info[slot].store(info.pack(), Ordering::Relaxed);
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

    /// The bookkeeping of the WQE at producer counter `at`.
    #[inline]
    pub fn get(&self, at: u32) -> (u64, WqeInfo) {
        let slot = (at & self.wqe_m) as usize;
        (
            self.wr_id[slot].load(Ordering::Relaxed),
            WqeInfo::unpack(self.info[slot].load(Ordering::Relaxed)),
        )
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
        let slot = (at & self.wqe_m) as usize;
        let wr_id = self.wr_id[slot].load(Ordering::Relaxed);
        // The packed info, unpacked by hand: the enum conversion is a chain of compares.
        let info = self.info[slot].load(Ordering::Relaxed);
        let next = at.wrapping_add(u32::from((info as u8).max(1)));
        // Release: the slot reads above happen before the poster may reuse the slots.
        self.wqe_ci.store(next, Ordering::Release);
        Some(SendRetired {
            wr_id,
            opcode: (info >> 8) as u8,
        })
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
        t.set_wqe_db_pi(4);
        let r = t.retire(3).unwrap();
        assert_eq!(r.wr_id, 102);
        assert_eq!(r.opcode, u8::from(SendOpcode::RdmaWrite));
        assert_eq!(t.counters(), (4, 4));
    }

    #[test]
    fn indices_outside_the_outstanding_window_are_refused() {
        let t = SendTrack::new(16);
        t.record(0, 1, info(1, true));
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
        t.record(base, 1, info(1, false));
        t.record(base + 1, 2, info(1, false));
        t.record(base + 2, 3, info(1, true));
        t.set_wqe_db_pi(base + 3);
        assert_eq!(t.retire(0).unwrap().wr_id, 3);
        assert_eq!(t.counters().0, base + 3);
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
