//! A shared receive queue, as libmlx5 drives one: its free slots linked through their next
//! segments (hw-defs' `srq_wqe`) from `head` to `tail`, one slot always free as the tail; a
//! receive goes into the head slot, and a completion (which names the slot) links the slot
//! back at the tail. Posts and completions may come from different threads (several QPs'
//! CQs retire into one SRQ), so both take the SRQ's lock, as libmlx5 takes its spinlock; the
//! device reads only the doorbell record's count and the slots it names.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use hw_defs::mlx5::srq_wqe::NEXT_SEG_SIZE;
use hw_defs::mlx5::{DataSeg, DataSegRepr, SrqNextSeg};

use super::sq::check_sge;
use super::wr::{PostError, RecvWr};
use crate::keys::KeyTable;
use crate::verbs::Access;

const SEG: usize = hw_defs::mlx5::data_seg::SIZE;

/// The ring and its free list, behind the SRQ's lock.
#[derive(Debug)]
struct Slots {
    /// First byte of the ring.
    ring: NonNull<u8>,
    /// Slots in the ring (a power of two).
    count: u32,
    /// log2 of the slot size in bytes.
    stride_shift: u32,
    /// The next slot a receive goes into.
    head: u16,
    /// The last free slot: a completed slot is linked after it.
    tail: u16,
    /// Receives posted (the doorbell record's count).
    posted: u32,
    /// Per slot: the receive's `wr_id` while posted.
    wr_ids: Vec<Option<u64>>,
}

/// A shared receive queue's driver side. Shared by the control object, the QPs on it and the
/// CQs they complete into.
#[derive(Debug)]
pub struct SharedRecvQueue {
    slots: Mutex<Slots>,
    /// The doorbell record: receives posted, big-endian.
    dbrec: NonNull<AtomicU32>,
    /// Largest scatter list a receive may carry.
    max_sge: u32,
    /// The SRQ's protection domain: every entry's MR must be in it.
    pd: u32,
    keys: Arc<KeyTable>,
    /// The device's name, for errors.
    device: Arc<str>,
}

// SAFETY: the ring and the doorbell record are provider memory alive as long as the SRQ (the
// control object destroys it only after the last QP on it); the ring is written only under
// the lock, the record only by atomic stores.
unsafe impl Send for SharedRecvQueue {}
// SAFETY: as above: every access to the raw memory is under `slots`' lock or atomic.
unsafe impl Sync for SharedRecvQueue {}

pub(crate) struct SrqParts {
    pub ring: NonNull<u8>,
    pub slots: u32,
    pub stride: u32,
    pub dbrec: NonNull<AtomicU32>,
    pub max_sge: u32,
    pub pd: u32,
    pub keys: Arc<KeyTable>,
    pub device: Arc<str>,
}

impl SharedRecvQueue {
    /// Links every slot to the next, as libmlx5 does at creation. The caller checked that
    /// `slots` is a power of two of at least 2 and `stride` one of at least 32.
    pub(crate) fn new(p: SrqParts) -> SharedRecvQueue {
        let mut s = Slots {
            ring: p.ring,
            count: p.slots,
            stride_shift: p.stride.trailing_zeros(),
            head: 0,
            tail: (p.slots - 1) as u16,
            posted: 0,
            wr_ids: vec![None; p.slots as usize],
        };
        for i in 0..p.slots {
            s.next_seg(i as u16)
                .set_next_wqe_index(((i + 1) % p.slots) as u16);
        }
        // SAFETY: the record is 4 bytes of provider memory alive as long as the SRQ.
        unsafe { p.dbrec.as_ref() }.store(0, Ordering::Release);
        SharedRecvQueue {
            slots: Mutex::new(s),
            dbrec: p.dbrec,
            max_sge: p.max_sge.min((p.stride / SEG as u32) - 1),
            pd: p.pd,
            keys: p.keys,
            device: p.device,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Receives the SRQ can hold at once (one slot stays free as the list's tail).
    pub fn capacity(&self) -> u32 {
        self.lock().count - 1
    }

    /// Largest scatter list a receive may carry.
    pub fn max_sge(&self) -> u32 {
        self.max_sge
    }

    /// Receives posted and not completed.
    pub fn outstanding(&self) -> u32 {
        self.lock().wr_ids.iter().filter(|w| w.is_some()).count() as u32
    }

    /// Validates `wr`, writes it into the head slot and publishes it.
    pub fn post(&self, wr: &RecvWr) -> Result<(), PostError> {
        if wr.sges.len() > self.max_sge as usize {
            return Err(PostError::TooManySges {
                count: wr.sges.len(),
                max: self.max_sge,
                queue: "shared receive",
            });
        }
        for sge in wr.sges.iter().filter(|s| s.len != 0) {
            check_sge(&self.keys, self.pd, &self.device, sge, Access::LOCAL_WRITE)?;
        }
        let mut s = self.lock();
        if s.head == s.tail {
            let capacity = s.count - 1;
            return Err(PostError::QueueFull {
                queue: "shared receive",
                outstanding: capacity,
                capacity,
                needed: 1,
            });
        }
        let at = s.head;
        let slot_segs = (1usize << s.stride_shift) / SEG - 1;
        let next = s.next_seg(at).next_wqe_index();
        let slot = s.slot(at);
        let data = &mut slot[NEXT_SEG_SIZE..];
        let mut n = 0;
        for sge in wr.sges.iter().filter(|s| s.len != 0) {
            DataSegRepr {
                byte_count: sge.len,
                lkey: sge.lkey,
                addr: sge.addr,
            }
            .emit(&mut DataSeg::new_unchecked(
                &mut data[n * SEG..(n + 1) * SEG],
            ));
            n += 1;
        }
        if n < slot_segs {
            DataSegRepr::TERMINATOR.emit(&mut DataSeg::new_unchecked(
                &mut data[n * SEG..(n + 1) * SEG],
            ));
        }
        s.wr_ids[at as usize] = Some(wr.wr_id);
        s.head = next;
        s.posted = s.posted.wrapping_add(1);
        // Release: the slot's bytes before the count (libmlx5: udma_to_device_barrier, then
        // the store to the record).
        super::barrier::to_device();
        // SAFETY: the record is alive as long as the SRQ.
        unsafe { self.dbrec.as_ref() }.store(s.posted.to_be(), Ordering::Release);
        Ok(())
    }

    /// Retires the receive in `slot` (a CQE's `wqe_counter`): its `wr_id`, the slot linked
    /// back at the tail of the free list. `None` if the slot holds no posted receive (a stale
    /// or bogus CQE).
    pub(crate) fn complete(&self, slot: u16) -> Option<u64> {
        let mut s = self.lock();
        let wr_id = s.wr_ids.get_mut(slot as usize)?.take()?;
        let tail = s.tail;
        s.next_seg(tail).set_next_wqe_index(slot);
        s.tail = slot;
        Some(wr_id)
    }
}

impl Slots {
    fn slot(&mut self, at: u16) -> &mut [u8] {
        let offset = ((u32::from(at) & (self.count - 1)) as usize) << self.stride_shift;
        // SAFETY: the slot lies inside the ring; the lock (held through `&mut self`) keeps
        // other writers out, and the device reads a slot only while it is posted, which a
        // slot being written is not.
        unsafe {
            std::slice::from_raw_parts_mut(self.ring.as_ptr().add(offset), 1 << self.stride_shift)
        }
    }

    fn next_seg(&mut self, at: u16) -> SrqNextSeg<&mut [u8]> {
        SrqNextSeg::new_unchecked(&mut self.slot(at)[..NEXT_SEG_SIZE])
    }
}
