//! The receive queue: scatter lists in the ring, published through the receive counter of the
//! doorbell record (a receive queue has no doorbell register; the device reads the counter
//! when a request needs a receive WQE).

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use hw_defs::mlx5::{DataSeg, DataSegRepr};

use super::gate::QpGate;
use super::sq::check_sge;
use super::track::RecvTrack;
use super::wr::{PostError, RecvWr};
use crate::keys::KeyTable;
use crate::qp_state::QpState;
use crate::verbs::Access;

const SEG: usize = hw_defs::mlx5::data_seg::SIZE;

/// The hot half of a QP's receive side. Owned by one lcore.
#[derive(Debug)]
pub struct RecvQueue {
    /// First byte of the receive ring.
    ring: NonNull<u8>,
    /// Mask of the ring in receive WQEs (entries - 1): a counter's slot is `counter & rwqe_m`.
    rwqe_m: u32,
    /// log2 of the slot size in bytes.
    stride_shift: u32,
    /// Data segments a slot holds.
    slot_segs: u32,
    /// Largest scatter list a receive may carry.
    max_sge: u32,
    /// Producer counter: receives before it are written.
    rwqe_pi: u32,
    /// Producer counter published in the doorbell record: receives the device may use.
    rwqe_db_pi: u32,
    /// Consumer counter as last read from the track (the CQ advances it); re-read only when
    /// the ring looks full.
    rwqe_ci: u32,
    /// The QP's number, for errors.
    qpn: u32,
    /// The QP's protection domain: every entry's MR must be in it.
    pd: u32,
    /// The receive counter of the doorbell record (big-endian `rwqe_db_pi` mod 2^16).
    dbrec: NonNull<AtomicU32>,
    /// Per-receive bookkeeping shared with the CQ (`wr_id`; `rwqe_ci`).
    track: Arc<RecvTrack>,
    /// The device's registered MRs, read lock-free.
    keys: Arc<KeyTable>,
    /// The QP's gate, for its state as the control half last set it.
    gate: Arc<QpGate>,
    /// The device's name, for errors.
    device: Arc<str>,
}

// SAFETY: as for SendQueue: provider-owned memory alive as long as the QP, used through
// `&mut self` by one thread at a time.
unsafe impl Send for RecvQueue {}

pub(crate) struct RecvQueueParts {
    pub ring: NonNull<u8>,
    pub slots: u32,
    pub stride: u32,
    pub max_sge: u32,
    pub qpn: u32,
    pub pd: u32,
    pub dbrec: NonNull<AtomicU32>,
    pub track: Arc<RecvTrack>,
    pub keys: Arc<KeyTable>,
    pub gate: Arc<QpGate>,
    pub device: Arc<str>,
}

impl RecvQueue {
    pub(crate) fn new(p: RecvQueueParts) -> RecvQueue {
        let slot_segs = p.stride / SEG as u32;
        RecvQueue {
            ring: p.ring,
            rwqe_m: p.slots - 1,
            stride_shift: p.stride.trailing_zeros(),
            slot_segs,
            max_sge: p.max_sge.min(slot_segs),
            rwqe_pi: 0,
            rwqe_db_pi: 0,
            rwqe_ci: 0,
            qpn: p.qpn,
            pd: p.pd,
            dbrec: p.dbrec,
            track: p.track,
            keys: p.keys,
            gate: p.gate,
            device: p.device,
        }
    }

    /// Slots in the ring.
    pub fn capacity(&self) -> u32 {
        self.rwqe_m + 1
    }

    /// Receives written so far (`rwqe_pi`).
    pub fn written(&self) -> u32 {
        self.rwqe_pi
    }

    /// Receives completed so far (`rwqe_ci`).
    pub fn completed(&self) -> u32 {
        self.track.rwqe_ci()
    }

    /// Receives the device has been told about (`rwqe_db_pi`).
    pub fn published(&self) -> u32 {
        self.rwqe_db_pi
    }

    fn slot(&mut self, at: u32) -> &mut [u8] {
        let offset = ((at & self.rwqe_m) as usize) << self.stride_shift;
        // SAFETY: the slot lies inside the ring (index <= rwqe_m, stride = 1 << stride_shift);
        // it is free (between producer and consumer counters), and `&mut self` keeps other
        // writers out.
        unsafe {
            std::slice::from_raw_parts_mut(self.ring.as_ptr().add(offset), 1 << self.stride_shift)
        }
    }

    fn reserve(&mut self) -> Result<(), PostError> {
        let capacity = self.rwqe_m + 1;
        if self.rwqe_pi.wrapping_sub(self.rwqe_ci) >= capacity {
            self.rwqe_ci = self.track.rwqe_ci();
            let outstanding = self.rwqe_pi.wrapping_sub(self.rwqe_ci);
            if outstanding >= capacity {
                return Err(PostError::QueueFull {
                    queue: "receive",
                    outstanding,
                    capacity,
                    needed: 1,
                });
            }
        }
        Ok(())
    }

    /// Validates and writes one receive WQE without publishing it.
    #[inline]
    pub fn write(&mut self, wr: &RecvWr) -> Result<(), PostError> {
        if self.gate.state() == QpState::Reset as u8 {
            return Err(PostError::NotReadyToReceive { qpn: self.qpn });
        }
        if wr.sges.len() > self.max_sge as usize {
            return Err(PostError::TooManySges {
                count: wr.sges.len(),
                max: self.max_sge,
                queue: "receive",
            });
        }
        for sge in wr.sges.iter().filter(|s| s.len != 0) {
            check_sge(&self.keys, self.pd, &self.device, sge, Access::LOCAL_WRITE)?;
        }
        self.reserve()?;
        let at = self.rwqe_pi;
        let slot_segs = self.slot_segs as usize;
        let slot = self.slot(at);
        let mut n = 0;
        for sge in wr.sges.iter().filter(|s| s.len != 0) {
            DataSegRepr {
                byte_count: sge.len,
                lkey: sge.lkey,
                addr: sge.addr,
            }
            .emit(&mut DataSeg::new_unchecked(
                &mut slot[n * SEG..(n + 1) * SEG],
            ));
            n += 1;
        }
        if n < slot_segs {
            // Fewer entries than the slot holds: the invalid-lkey terminator ends the list.
            DataSegRepr::TERMINATOR.emit(&mut DataSeg::new_unchecked(
                &mut slot[n * SEG..(n + 1) * SEG],
            ));
        }
        self.track.record(at, wr.wr_id);
        self.rwqe_pi = at.wrapping_add(1);
        self.track.set_rwqe_pi(self.rwqe_pi);
        Ok(())
    }

    /// Tells the device about every receive written so far.
    #[inline]
    pub fn publish(&mut self) {
        if self.rwqe_db_pi == self.rwqe_pi {
            return;
        }
        // Release: the receive WQEs' bytes are visible before the device can see the new
        // counter (libmlx5: udma_to_device_barrier, then the store to the record); the
        // barrier is the device's (aarch64: `dmb oshst`), the release the softnic's.
        super::barrier::to_device();
        // SAFETY: dbrec points into the QP's doorbell record, alive as long as the QP.
        let dbrec = unsafe { self.dbrec.as_ref() };
        dbrec.store(u32::from(self.rwqe_pi as u16).to_be(), Ordering::Release);
        self.rwqe_db_pi = self.rwqe_pi;
    }

    /// Writes and publishes one receive.
    #[inline]
    pub fn post(&mut self, wr: &RecvWr) -> Result<(), PostError> {
        self.write(wr)?;
        self.publish();
        Ok(())
    }

    /// Receives written and not completed, oldest first: (counter, wr_id).
    pub fn outstanding(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        let (ci, _) = self.track.counters();
        self.written_from(ci)
    }

    /// Receives written from counter `start` on, oldest first, completed or not: (counter,
    /// wr_id). As for the send queue, the failover layer passes the counter it read before
    /// flushes retired the receives it is about to copy.
    pub fn written_from(&self, start: u32) -> impl Iterator<Item = (u32, u64)> + '_ {
        (0..self.rwqe_pi.wrapping_sub(start)).map(move |i| {
            let at = start.wrapping_add(i);
            (at, self.track.wr_id(at))
        })
    }

    /// Bytes per receive WQE slot.
    pub fn stride(&self) -> usize {
        1 << self.stride_shift
    }

    /// Copies the slot of the receive at counter `at` into `out` (which must hold a slot);
    /// returns the slot size.
    pub fn copy_wqe(&self, at: u32, out: &mut [u8]) -> usize {
        let stride = 1usize << self.stride_shift;
        let offset = ((at & self.rwqe_m) as usize) << self.stride_shift;
        // SAFETY: the slot lies inside the ring; the device only reads posted receives.
        let src = unsafe { std::slice::from_raw_parts(self.ring.as_ptr().add(offset), stride) };
        out[..stride].copy_from_slice(src);
        stride
    }

    /// Writes a receive WQE given as raw bytes (copied from another ring, keys rewritten),
    /// without publishing it. Only the first slot's worth of bytes is used.
    pub fn write_raw(&mut self, bytes: &[u8], wr_id: u64) -> Result<(), PostError> {
        self.reserve()?;
        let at = self.rwqe_pi;
        let slot = self.slot(at);
        let n = slot.len().min(bytes.len());
        slot[..n].copy_from_slice(&bytes[..n]);
        if n < slot.len() {
            DataSegRepr::TERMINATOR.emit(&mut DataSeg::new_unchecked(&mut slot[n..n + SEG]));
        }
        self.track.record(at, wr_id);
        self.rwqe_pi = at.wrapping_add(1);
        self.track.set_rwqe_pi(self.rwqe_pi);
        Ok(())
    }

    /// Back to index 0 (the QP went to RESET). The doorbell record goes back to 0 too, as
    /// libmlx5 clears it on a reset: the device restarts its receive counter at 0 and reads
    /// the record whenever it needs a receive, so a record left at the last incarnation's
    /// counter announces that many phantom receives, which a move to ERR before the next
    /// publish flushes (one CQE each: enough of them overrun the CQ, `docs/failover.md` 9.8).
    pub(crate) fn reset(&mut self) {
        self.rwqe_pi = 0;
        self.rwqe_db_pi = 0;
        self.rwqe_ci = 0;
        self.track.reset();
        // SAFETY: dbrec points into the QP's doorbell record, alive as long as the QP; the
        // QP is in RESET, where the device does not read it.
        unsafe { self.dbrec.as_ref() }.store(0, Ordering::Release);
    }
}
