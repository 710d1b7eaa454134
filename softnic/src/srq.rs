//! Shared receive queues: a receive ring many QPs take their receive WQEs from, in mlx5's
//! layout (hw-defs' [`srq_wqe`](hw_defs::mlx5::srq_wqe)): each slot a next segment and a
//! scatter list, the free slots linked through the next segments, a doorbell record counting
//! the receives posted. The device follows the links from slot 0, as the driver posts along
//! them, and names the slot it consumed in the CQE. A limit, once armed, tells the taker
//! (who raises `AsyncEvent::SrqLimitReached`) when the receives left drop below it, and
//! disarms.

use std::sync::{Arc, Mutex, MutexGuard};

use hw_defs::mlx5::srq_wqe::NEXT_SEG_SIZE;
use hw_defs::mlx5::SrqNextSeg;

use crate::codec::{self, WqeError};
use crate::dma::Sge;
use crate::memory::QueueMemory;
use crate::mr::PdId;

/// A shared receive queue of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SrqId(pub u32);

/// What the driver gives `create_srq`.
#[derive(Debug)]
pub struct SrqConfig {
    /// Protection domain (the QPs using the SRQ must be in it).
    pub pd: PdId,
    /// The ring: `wqes * stride` bytes.
    pub ring: QueueMemory,
    /// Slots in the ring, a power of two up to 32768 (libmlx5 keeps one free as the list's tail,
    /// so at most `wqes - 1` receives are posted at once).
    pub wqes: u32,
    /// Bytes per slot: a power of two in 32..=1024, the 16-byte next segment and
    /// `stride / 16 - 1` data segments.
    pub stride: u32,
    /// Doorbell record: 4 bytes, the count of receives posted, big-endian.
    pub dbrec: QueueMemory,
    /// The limit, armed at creation when non-zero (`ibv_srq_init_attr.attr.srq_limit`).
    pub limit: u32,
}

/// The device's side of an SRQ.
pub(crate) struct SrqRing {
    pub id: SrqId,
    pub pd: PdId,
    ring: QueueMemory,
    dbrec: QueueMemory,
    wqes: u32,
    stride: usize,
    /// The next slot to consume: where the driver's list of posted receives starts.
    head: u16,
    /// Receives consumed (32-bit, wrapping, as the doorbell record's count).
    consumed: u32,
    limit: u32,
    armed: bool,
    scratch: Vec<u8>,
}

/// An SRQ as the QPs on it hold it: the device lock is held while they use it, so this lock
/// is never contended by the engine; the control verbs take it briefly.
pub(crate) type SharedSrq = Arc<Mutex<SrqRing>>;

impl SrqRing {
    pub fn new(id: SrqId, cfg: SrqConfig) -> Result<SrqRing, &'static str> {
        if !cfg.wqes.is_power_of_two() || cfg.wqes < 2 || cfg.wqes > 1 << 15 {
            return Err("SRQ wqes must be a power of two in 2..=32768");
        }
        if !cfg.stride.is_power_of_two() || cfg.stride < 32 || cfg.stride > 1024 {
            return Err("SRQ stride must be a power of two in 32..=1024");
        }
        if cfg.ring.len() < cfg.wqes as usize * cfg.stride as usize {
            return Err("SRQ ring memory is smaller than wqes * stride");
        }
        if cfg.dbrec.len() < 4 || cfg.dbrec.as_ptr() as usize % 4 != 0 {
            return Err("SRQ doorbell record must be 4 bytes, 4-byte aligned");
        }
        if cfg.limit >= cfg.wqes {
            return Err("SRQ limit must be below its number of WQEs");
        }
        Ok(SrqRing {
            id,
            pd: cfg.pd,
            ring: cfg.ring,
            dbrec: cfg.dbrec,
            wqes: cfg.wqes,
            stride: cfg.stride as usize,
            head: 0,
            consumed: 0,
            limit: cfg.limit,
            armed: cfg.limit > 0,
            scratch: vec![0u8; cfg.stride as usize],
        })
    }

    pub fn into_shared(self) -> SharedSrq {
        Arc::new(Mutex::new(self))
    }

    /// Receives posted and not consumed.
    pub fn available(&self) -> u32 {
        self.dbrec.load_be32(0).wrapping_sub(self.consumed)
    }

    /// The limit and whether it is armed.
    pub fn limit(&self) -> (u32, bool) {
        (self.limit, self.armed)
    }

    /// Sets the limit (`ibv_modify_srq` with `IBV_SRQ_LIMIT`): non-zero arms it, zero disarms.
    pub fn set_limit(&mut self, limit: u32) -> Result<(), &'static str> {
        if limit >= self.wqes {
            return Err("SRQ limit must be below its number of WQEs");
        }
        self.limit = limit;
        self.armed = limit > 0;
        Ok(())
    }

    /// Consumes the next posted receive, its scatter list into `out`; `None` when none is
    /// posted (the caller answers RNR). A slot that does not parse is still consumed (its
    /// error CQE names it), as is its link if that link leaves the ring.
    pub fn take(&mut self, out: &mut Vec<Sge>) -> Option<Taken> {
        if self.available() == 0 {
            return None;
        }
        let index = self.head;
        let off = index as usize * self.stride;
        self.ring.read(off, &mut self.scratch);
        let next = SrqNextSeg::new_unchecked(&self.scratch[..NEXT_SEG_SIZE]).next_wqe_index();
        let parsed = if u32::from(next) < self.wqes {
            self.head = next;
            codec::decode_recv_wqe(&self.scratch[NEXT_SEG_SIZE..], out)
        } else {
            // A broken link: the list cannot be followed from here on; every later receive
            // is read from the same slot and fails the same way.
            Err(WqeError::Malformed)
        };
        self.consumed = self.consumed.wrapping_add(1);
        let limit_reached = self.armed && self.available() < self.limit;
        if limit_reached {
            self.armed = false;
        }
        Some(Taken {
            srq: self.id,
            index,
            parsed,
            limit_reached,
        })
    }
}

/// A receive taken from an SRQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Taken {
    /// The SRQ.
    pub srq: SrqId,
    /// Its slot.
    pub index: u16,
    /// Whether its scatter list parsed.
    pub parsed: Result<(), WqeError>,
    /// This take left fewer receives than the armed limit (now disarmed): the taker raises
    /// the event.
    pub limit_reached: bool,
}

/// Locks an SRQ; a poisoned lock still holds a consistent ring (every update is one store).
pub(crate) fn lock(srq: &SharedSrq) -> MutexGuard<'_, SrqRing> {
    srq.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hw_defs::mlx5::{DataSeg, DataSegRepr};

    const STRIDE: usize = 64;

    /// An SRQ of `wqes` slots linked 0 -> 1 -> ... as libmlx5 links them at creation.
    fn srq(wqes: u32, limit: u32) -> (SrqRing, QueueMemory, QueueMemory) {
        let ring = QueueMemory::alloc(wqes as usize * STRIDE);
        for i in 0..wqes {
            let mut b = [0u8; NEXT_SEG_SIZE];
            SrqNextSeg::new_unchecked(&mut b[..]).set_next_wqe_index(((i + 1) % wqes) as u16);
            ring.write(i as usize * STRIDE, &b);
        }
        let dbrec = QueueMemory::alloc(4);
        let cfg = SrqConfig {
            pd: PdId(1),
            ring: ring.clone(),
            wqes,
            stride: STRIDE as u32,
            dbrec: dbrec.clone(),
            limit,
        };
        (SrqRing::new(SrqId(0), cfg).unwrap(), ring, dbrec)
    }

    fn post(ring: &QueueMemory, slot: u16, addr: u64) {
        let mut b = [0u8; 16];
        DataSegRepr {
            byte_count: 100,
            lkey: 7,
            addr,
        }
        .emit(&mut DataSeg::new_unchecked(&mut b[..]));
        ring.write(slot as usize * STRIDE + NEXT_SEG_SIZE, &b);
        DataSegRepr::TERMINATOR.emit(&mut DataSeg::new_unchecked(&mut b[..]));
        ring.write(slot as usize * STRIDE + 2 * NEXT_SEG_SIZE, &b);
    }

    #[test]
    fn takes_posted_receives_along_the_links_and_none_when_empty() {
        let (mut s, ring, dbrec) = srq(4, 0);
        let mut sges = Vec::new();
        assert!(s.take(&mut sges).is_none());
        // Relink 0 -> 2 -> 1, as a driver that freed slot 2 before slot 1 would.
        let mut b = [0u8; NEXT_SEG_SIZE];
        SrqNextSeg::new_unchecked(&mut b[..]).set_next_wqe_index(2);
        ring.write(0, &b);
        SrqNextSeg::new_unchecked(&mut b[..]).set_next_wqe_index(1);
        ring.write(2 * STRIDE, &b);
        for (slot, addr) in [(0, 0x1000), (2, 0x2000), (1, 0x3000)] {
            post(&ring, slot, addr);
        }
        dbrec.store_be32(0, 3);
        let mut got = Vec::new();
        while let Some(t) = s.take(&mut sges) {
            t.parsed.unwrap();
            assert!(!t.limit_reached);
            assert_eq!(sges.len(), 1);
            got.push((t.index, sges[0].addr));
        }
        assert_eq!(got, vec![(0, 0x1000), (2, 0x2000), (1, 0x3000)]);
        assert_eq!(s.available(), 0);
    }

    #[test]
    fn an_armed_limit_fires_once_below_it_and_disarms() {
        let (mut s, ring, dbrec) = srq(8, 2);
        for slot in 0..4 {
            post(&ring, slot, 0x1000);
        }
        dbrec.store_be32(0, 4);
        let mut sges = Vec::new();
        let mut fired = || s.take(&mut sges).unwrap().limit_reached;
        assert!(!fired());
        assert!(!fired(), "2 left is not below 2");
        assert!(fired());
        assert!(!fired(), "disarmed");
        assert_eq!(s.limit(), (2, false));
        assert!(s.set_limit(8).is_err());
        s.set_limit(1).unwrap();
        assert_eq!(s.limit(), (1, true));
    }

    #[test]
    fn a_link_out_of_the_ring_fails_the_receive() {
        let (mut s, ring, dbrec) = srq(4, 0);
        let mut b = [0u8; NEXT_SEG_SIZE];
        SrqNextSeg::new_unchecked(&mut b[..]).set_next_wqe_index(9);
        ring.write(0, &b);
        post(&ring, 0, 0x1000);
        dbrec.store_be32(0, 1);
        let mut sges = Vec::new();
        let t = s.take(&mut sges).unwrap();
        assert_eq!((t.index, t.parsed), (0, Err(WqeError::Malformed)));
    }

    #[test]
    fn bad_geometry_is_refused_by_name() {
        let cfg = |wqes, stride, limit| SrqConfig {
            pd: PdId(1),
            ring: QueueMemory::alloc(4096),
            wqes,
            stride,
            dbrec: QueueMemory::alloc(4),
            limit,
        };
        let err = |c| SrqRing::new(SrqId(0), c).err().unwrap();
        assert!(err(cfg(3, 64, 0)).contains("wqes"));
        assert!(err(cfg(4, 16, 0)).contains("stride"));
        assert!(err(cfg(128, 64, 0)).contains("smaller"));
        assert!(err(cfg(4, 64, 4)).contains("limit"));
    }
}
