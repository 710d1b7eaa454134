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

/// How a doorbell register may be written (UCX's `uct_ib_mlx5_mmio_mode` in spirit: the kind
/// of MMIO is named, not implied by a size of 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DoorbellMode {
    /// A dedicated BlueFlame register of two halves of `half` bytes (whole basic blocks):
    /// a doorbell publishing one WQE that fits a half copies it there whole.
    BlueFlame {
        /// Bytes of each half.
        half: u32,
    },
    /// Only the 8-byte doorbell, at offset 0: a register shared with other QPs, a device
    /// without BlueFlame, or a host where write-combining is off (`MLX5_SHUT_UP_BF`).
    Plain,
}

/// A BlueFlame/UAR doorbell register in MMIO space.
#[derive(Debug)]
pub struct MmioDoorbell {
    reg: NonNull<u8>,
    /// Bytes of each BlueFlame half; 0 in [`DoorbellMode::Plain`].
    bf_size: u32,
    /// Which half the next BlueFlame write goes to (0 or `bf_size`).
    offset: u32,
}

// SAFETY: the register page stays mapped for the life of the QP that owns this doorbell; MMIO
// writes are not tied to a thread.
unsafe impl Send for MmioDoorbell {}

impl MmioDoorbell {
    /// A doorbell at `reg` (`mlx5dv_qp.bf.reg`) written as `mode` says.
    ///
    /// # Safety
    /// `reg` must point to a mapping of at least 8 writable bytes (`2 * half` for BlueFlame),
    /// 8-byte aligned (64-byte for BlueFlame), that stays mapped as long as this value lives.
    /// With BlueFlame nothing else may write it concurrently (libmlx5 shares a BlueFlame
    /// register between QPs only under a lock; the mlx5 provider gives each QP a thread
    /// domain, which has a register of its own). Plain writes only whole 8-byte doorbells, at
    /// offset 0, which other writers' equally whole doorbells cannot tear.
    pub unsafe fn new(reg: NonNull<u8>, mode: DoorbellMode) -> MmioDoorbell {
        let bf_size = match mode {
            DoorbellMode::BlueFlame { half } => half,
            DoorbellMode::Plain => 0,
        };
        MmioDoorbell {
            reg,
            bf_size,
            offset: 0,
        }
    }

    /// How the register is written.
    pub fn mode(&self) -> DoorbellMode {
        match self.bf_size {
            0 => DoorbellMode::Plain,
            half => DoorbellMode::BlueFlame { half },
        }
    }

    /// Rings the register as libmlx5's `post_send_db` does after its doorbell-record store:
    /// `mmio_wc_start`, then either `mlx5_bf_copy` of the whole WQE or `mmio_write64_be` of its
    /// first 8 bytes at `reg + offset`, then `mmio_flush_writes`, then `offset ^= bf_size`.
    #[inline]
    fn ring(&mut self, last: LastWqe) {
        // mmio_wc_start (sfence on x86): the doorbell record is an ordinary store and the
        // register is write-combining memory, which x86 does not order after ordinary stores;
        // the record must reach the device before the register write makes it fetch.
        barrier::wc_flush();
        let dst = self.reg.as_ptr().wrapping_add(self.offset as usize) as *mut u64;
        let bytes = last.bbs as usize * hw_defs::mlx5::wqe::SEND_WQE_BB;
        if last.blueflame_ok && self.bf_size != 0 && bytes <= self.bf_size as usize {
            // BlueFlame (mlx5_bf_copy): the whole WQE in 64-byte chunks, one basic block at a
            // time, following the ring when the WQE wraps past its end.
            for b in 0..last.bbs {
                // SAFETY: bb(b) is a whole basic block inside the ring; the chunk at
                // `dst + 64 * b` stays inside this half because bytes <= bf_size (checked
                // above); both are 8-byte aligned (rings are page-aligned, the register by
                // `new`'s contract).
                unsafe { copy_block(dst.add(b as usize * 8), last.bb(b) as *const u64) };
            }
        } else {
            // mmio_write64_be: the first 8 bytes of the control segment, already big-endian
            // in the ring, as one 8-byte store.
            // SAFETY: those bytes lie in the ring; the register has at least 8 writable,
            // aligned bytes at `offset` (`new`'s contract).
            unsafe { dst.write_volatile((last.bb(0) as *const u64).read()) };
        }
        // mmio_flush_writes (sfence): push the write out of the CPU's write-combining buffer
        // now, so the device sees this doorbell before any later one, and the next copy
        // cannot merge with this one.
        barrier::wc_flush();
        // The next BlueFlame write goes to the other half (no-op without BlueFlame), so it
        // does not land on a buffer the device may still be reading.
        self.offset ^= self.bf_size;
    }
}

/// libmlx5's `mmio_memcpy_x64` for one 64-byte chunk on x86-64: eight 8-byte stores in
/// ascending address order, which the write-combining buffer merges into one 64-byte write
/// (a `memcpy` could use string instructions that store in any order).
///
/// # Safety
/// `dst` must be 64 writable, 8-byte aligned MMIO bytes and `src` 64 readable, aligned bytes.
#[cfg(not(target_arch = "aarch64"))]
#[inline(always)]
unsafe fn copy_block(dst: *mut u64, src: *const u64) {
    for w in 0..8 {
        // SAFETY: w < 8 words of 8 bytes: inside both 64-byte blocks (the caller's promise).
        // Volatile: every store is emitted, in this order, and none is merged by the compiler.
        unsafe { dst.add(w).write_volatile(src.add(w).read()) };
    }
}

/// libmlx5's `mmio_memcpy_x64` for one 64-byte chunk on aarch64: one `ld4`/`st4` pair of four
/// 128-bit registers, a single 64-byte store instruction (rdma-core's `vst4q_u64(dest,
/// vld4q_u64(src))`; the interleave of `ld4` is undone by `st4`, so the bytes land in order).
/// rdma-core uses `st64b` instead where the CPU has FEAT_LS64 and it was built for it; Rust
/// has no stable `st64b`, so this is the path rdma-core's default build takes.
///
/// # Safety
/// `dst` must be 64 writable, 16-byte aligned MMIO bytes and `src` 64 readable, aligned
/// bytes.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
unsafe fn copy_block(dst: *mut u64, src: *const u64) {
    use core::arch::aarch64::{vld4q_u64, vst4q_u64};
    // SAFETY: 64 readable bytes at `src` and 64 writable bytes at `dst` (the caller's
    // promise); NEON is part of the aarch64 baseline.
    unsafe { vst4q_u64(dst, vld4q_u64(src)) }
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
    /// Mask of the ring in basic blocks (entries - 1).
    pub wqe_m: u32,
    /// Producer counter (basic blocks) where the WQE's control segment is.
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
        let index = (self.start.wrapping_add(i) & self.wqe_m) as usize;
        // SAFETY: index <= wqe_m, and the ring holds wqe_m + 1 basic blocks.
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
            Doorbell::Mmio(db) => db.ring(last),
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
        let mut db = Doorbell::Mmio(unsafe {
            MmioDoorbell::new(NonNull::from(&mut reg).cast(), DoorbellMode::Plain)
        });
        let last = LastWqe {
            ring: NonNull::from(ring.as_mut_slice()).cast(),
            wqe_m: 3,
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
        let mut db = Doorbell::Mmio(unsafe {
            MmioDoorbell::new(
                NonNull::from(&mut reg).cast(),
                DoorbellMode::BlueFlame { half: 128 },
            )
        });
        // A two-block WQE that wraps: blocks 3 and 0.
        let last = LastWqe {
            ring: NonNull::from(ring.as_mut_slice()).cast(),
            wqe_m: 3,
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
        let mut db = Doorbell::Mmio(unsafe {
            MmioDoorbell::new(
                NonNull::from(&mut reg).cast(),
                DoorbellMode::BlueFlame { half: 8 },
            )
        });
        let last = LastWqe {
            ring: NonNull::from(ring.as_mut_slice()).cast(),
            wqe_m: 3,
            start: 0,
            bbs: 1,
            blueflame_ok: true,
        };
        db.ring(last);
        assert_eq!(reg, [1, 0]);
    }
}
