//! The doorbell register: how the driver tells a device that the send producer index moved.
//!
//! Two kinds, one small enum, so the hot path is a `match` and never a virtual call:
//! - [`Doorbell::Mmio`]: an mlx5 UAR page mapped write-combining. Small WQEs are copied whole
//!   into the BlueFlame buffer (the NIC then need not fetch them), alternating between the two
//!   halves of the buffer as libmlx5 does; larger ones get the plain 8-byte doorbell (the
//!   first 8 bytes of the last control segment).
//! - [`Doorbell::Soft`]: the softnic's register, a release store plus a wake-up of its engine
//!   when it sleeps.

use std::ptr::NonNull;

use super::barrier;

/// A BlueFlame/UAR doorbell register in MMIO space.
#[derive(Debug)]
pub struct MmioDoorbell {
    reg: NonNull<u8>,
    /// Bytes of each BlueFlame half; 0 when the device offers no BlueFlame (plain doorbells).
    bf_size: u32,
    /// Which half the next BlueFlame write goes to (0 or `bf_size`).
    offset: u32,
}

// SAFETY: the register page stays mapped for the life of the QP that owns this doorbell; MMIO
// writes are not tied to a thread.
unsafe impl Send for MmioDoorbell {}

impl MmioDoorbell {
    /// A doorbell at `reg` with BlueFlame halves of `bf_size` bytes (`mlx5dv_qp.bf.reg` and
    /// `.size`); `bf_size` 0 means plain 8-byte doorbells only.
    ///
    /// # Safety
    /// `reg` must point to a mapping of at least `max(8, 2 * bf_size)` writable bytes, 8-byte
    /// aligned, that stays mapped as long as this value lives, and nothing else may write it
    /// concurrently (libmlx5 shares a BlueFlame register between QPs only under a lock; the
    /// mlx5 provider must ask for a dedicated one).
    pub unsafe fn new(reg: NonNull<u8>, bf_size: u32) -> MmioDoorbell {
        MmioDoorbell {
            reg,
            bf_size,
            offset: 0,
        }
    }

    /// Largest WQE, in bytes, that goes out as a BlueFlame copy.
    pub fn blueflame_size(&self) -> u32 {
        self.bf_size
    }
}

/// A doorbell register of either kind.
#[derive(Debug)]
pub enum Doorbell {
    /// An mlx5 UAR/BlueFlame register.
    Mmio(MmioDoorbell),
    /// The softnic's register.
    #[cfg(feature = "soft")]
    Soft(softnic::DoorbellRegister),
}

/// Where the WQE that a doorbell announces lives, for a BlueFlame copy.
#[derive(Clone, Copy)]
pub(crate) struct LastWqe {
    /// The SQ ring.
    pub ring: NonNull<u8>,
    /// Basic blocks in the ring, minus one.
    pub mask: u32,
    /// Basic-block index of the WQE's control segment.
    pub start: u32,
    /// Basic blocks the WQE takes.
    pub bbs: u32,
    /// Whether this doorbell publishes only this WQE. BlueFlame carries one WQE; with more
    /// pending the device must fetch them all, so the plain doorbell is used (as libmlx5 does
    /// for batches).
    pub blueflame_ok: bool,
}

impl LastWqe {
    #[inline(always)]
    fn bb(&self, i: u32) -> *const u8 {
        let index = (self.start.wrapping_add(i) & self.mask) as usize;
        // SAFETY: index <= mask, and the ring holds mask + 1 basic blocks.
        unsafe {
            self.ring
                .as_ptr()
                .add(index * hw_defs::mlx5::wqe::SEND_WQE_BB)
        }
    }
}

impl Doorbell {
    /// Writes the register. The caller has already made the WQEs and the doorbell record
    /// visible (see `SendQueue::ring_doorbell`).
    #[inline]
    pub(crate) fn ring(&mut self, last: LastWqe) {
        match self {
            Doorbell::Mmio(db) => {
                // The doorbell record (an ordinary store) must reach the device before the
                // register write starts the fetch, and the register is write-combining memory,
                // which TSO does not order: sfence first (libmlx5's mmio_wc_start).
                barrier::wc_flush();
                let dst = db.reg.as_ptr().wrapping_add(db.offset as usize) as *mut u64;
                let bytes = last.bbs as usize * hw_defs::mlx5::wqe::SEND_WQE_BB;
                if last.blueflame_ok && db.bf_size != 0 && bytes <= db.bf_size as usize {
                    // BlueFlame: the whole WQE, 8 bytes at a time, basic block by basic block
                    // (the WQE may wrap around the end of the ring).
                    for b in 0..last.bbs {
                        let src = last.bb(b) as *const u64;
                        for w in 0..8 {
                            // SAFETY: src is a whole basic block inside the ring; dst stays
                            // within this BlueFlame half because bytes <= bf_size (checked
                            // above); both are 8-byte aligned (rings are page-aligned, the
                            // register is 8-byte aligned by `MmioDoorbell::new`'s contract).
                            unsafe {
                                let v = src.add(w).read();
                                dst.add(b as usize * 8 + w).write_volatile(v);
                            }
                        }
                    }
                } else {
                    // SAFETY: the first 8 bytes of the control segment lie in the ring; the
                    // register has at least 8 writable bytes at `offset`.
                    unsafe {
                        let v = (last.bb(0) as *const u64).read();
                        dst.write_volatile(v);
                    }
                }
                // Flush the write-combining buffer: the NIC sees the doorbell now, and the next
                // BlueFlame copy (into the other half) cannot merge with or pass this one.
                barrier::wc_flush();
                db.offset ^= db.bf_size;
            }
            #[cfg(feature = "soft")]
            Doorbell::Soft(reg) => {
                // SAFETY: the first 8 bytes of the control segment lie in the ring.
                let v = unsafe { (last.bb(0) as *const u64).read() };
                // A release store (and a wake-up if the engine sleeps); the doorbell record's
                // own release store already ordered the WQEs before it.
                reg.ring(v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring_with_pattern(bbs: usize) -> Vec<u64> {
        (0..bbs * 8).map(|i| i as u64 + 1).collect()
    }

    #[test]
    fn plain_doorbell_writes_the_first_eight_bytes_of_the_last_wqe() {
        let mut ring = ring_with_pattern(4);
        let mut reg = [0u64; 2];
        // SAFETY: `reg` is 16 writable, aligned bytes that outlive the doorbell.
        let mut db =
            Doorbell::Mmio(unsafe { MmioDoorbell::new(NonNull::from(&mut reg).cast(), 0) });
        let last = LastWqe {
            ring: NonNull::from(ring.as_mut_slice()).cast(),
            mask: 3,
            start: 2,
            bbs: 1,
            blueflame_ok: true,
        };
        db.ring(last);
        assert_eq!(reg, [17, 0]);
    }

    #[test]
    fn blueflame_copies_small_wqes_whole_and_alternates_halves() {
        let mut ring = ring_with_pattern(4);
        let mut reg = [0u64; 32]; // two 128-byte halves
                                  // SAFETY: 256 writable, aligned bytes that outlive the doorbell.
        let mut db =
            Doorbell::Mmio(unsafe { MmioDoorbell::new(NonNull::from(&mut reg).cast(), 128) });
        // A two-block WQE that wraps: blocks 3 and 0.
        let last = LastWqe {
            ring: NonNull::from(ring.as_mut_slice()).cast(),
            mask: 3,
            start: 3,
            bbs: 2,
            blueflame_ok: true,
        };
        db.ring(last);
        let expected: Vec<u64> = (25..=32).chain(1..=8).collect();
        assert_eq!(&reg[..16], expected.as_slice());
        db.ring(LastWqe {
            start: 1,
            bbs: 1,
            ..last
        });
        assert_eq!(&reg[16..24], (9..=16).collect::<Vec<u64>>().as_slice());
    }

    #[test]
    fn wqes_larger_than_blueflame_get_a_plain_doorbell() {
        let mut ring = ring_with_pattern(4);
        let mut reg = [0u64; 2];
        // SAFETY: BlueFlame size 8 means halves of 8 bytes: 16 writable bytes suffice.
        let mut db =
            Doorbell::Mmio(unsafe { MmioDoorbell::new(NonNull::from(&mut reg).cast(), 8) });
        let last = LastWqe {
            ring: NonNull::from(ring.as_mut_slice()).cast(),
            mask: 3,
            start: 0,
            bbs: 1,
            blueflame_ok: true,
        };
        db.ring(last);
        assert_eq!(reg, [1, 0]);
    }
}
