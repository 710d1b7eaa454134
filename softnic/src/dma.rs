//! Copies between registered memory and packet buffers, and atomics on registered memory.
//! Every range is checked against the MR table first; the raw accesses rely on the promise
//! `reg_mr` makes its caller give (the range stays mapped while registered).
//!
//! Registered memory is shared with the application's threads, and a peer decides when the
//! engine writes it: a peer's WRITE may land while the application reads the same bytes (a
//! bug, or a hostile peer). With plain (or volatile) copies that is a data race, undefined
//! behaviour in Rust's memory model; so every copy here is byte-wise relaxed atomic loads or
//! stores, which race with the application's byte-wise atomic copies (the pmd's
//! `RegisteredBuffer::read`, the harness's `Buffer::read`) without undefined behaviour. Bytes,
//! not words: racing atomics of different sizes that partially overlap are undefined too,
//! and a byte is the one size every copy, at any alignment, can agree on.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use crate::mr::{Access, KeyError, MrTable, PdId};

/// One gather or scatter element of a WQE.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Sge {
    pub addr: u64,
    pub len: u32,
    pub lkey: u32,
}

/// Copies `len` bytes from registered memory at `addr` into `out`.
pub(crate) fn read_mem(
    mrs: &MrTable,
    key: u32,
    pd: PdId,
    addr: u64,
    out: &mut [u8],
    need: Access,
) -> Result<(), KeyError> {
    mrs.check(key, pd, addr, out.len() as u64, need)?;
    // SAFETY: [addr, addr+len) lies inside a registered MR (checked above), which the
    // registrant promised stays mapped until deregistered.
    unsafe { load_shared(addr as usize as *const u8, out) };
    Ok(())
}

/// Copies `data` into registered memory at `addr`.
pub(crate) fn write_mem(
    mrs: &MrTable,
    key: u32,
    pd: PdId,
    addr: u64,
    data: &[u8],
    need: Access,
) -> Result<(), KeyError> {
    mrs.check(key, pd, addr, data.len() as u64, need)?;
    // SAFETY: as in read_mem; the MR grants a write access, so it is writable memory.
    unsafe { store_shared(data, addr as usize as *mut u8) };
    Ok(())
}

/// Copies `out.len()` bytes from shared memory at `src`, one relaxed atomic load per byte.
///
/// # Safety
/// `src..src + out.len()` must be mapped and readable for the whole call.
pub(crate) unsafe fn load_shared(src: *const u8, out: &mut [u8]) {
    for (i, byte) in out.iter_mut().enumerate() {
        // SAFETY: inside the range the caller vouched for; AtomicU8 has alignment 1. A relaxed
        // load of one byte is allowed even on read-only memory (`core::sync::atomic`, "Atomic
        // accesses to read-only memory"), and nothing is written through the reference.
        *byte = unsafe { &*src.add(i).cast::<AtomicU8>() }.load(Ordering::Relaxed);
    }
}

/// Copies `data` into shared memory at `dst`, one relaxed atomic store per byte.
///
/// # Safety
/// `dst..dst + data.len()` must be mapped and writable for the whole call.
pub(crate) unsafe fn store_shared(data: &[u8], dst: *mut u8) {
    for (i, byte) in data.iter().enumerate() {
        // SAFETY: inside the writable range the caller vouched for; AtomicU8 has alignment 1.
        unsafe { AtomicU8::from_ptr(dst.add(i)) }.store(*byte, Ordering::Relaxed);
    }
}

/// Gathers bytes `offset..offset+out.len()` of the message described by `sges` into `out`.
pub(crate) fn gather(
    mrs: &MrTable,
    pd: PdId,
    sges: &[Sge],
    mut offset: u64,
    mut out: &mut [u8],
) -> Result<(), KeyError> {
    for sge in sges {
        if out.is_empty() {
            break;
        }
        let len = sge.len as u64;
        if offset >= len {
            offset -= len;
            continue;
        }
        let n = ((len - offset) as usize).min(out.len());
        let (now, rest) = out.split_at_mut(n);
        read_mem(mrs, sge.lkey, pd, sge.addr + offset, now, Access::NONE)?;
        out = rest;
        offset = 0;
    }
    Ok(())
}

/// Scatters `data` to bytes `offset..` of the buffer described by `sges`. Returns false if the
/// scatter list is too short (the caller reports a length error).
pub(crate) fn scatter(
    mrs: &MrTable,
    pd: PdId,
    sges: &[Sge],
    mut offset: u64,
    mut data: &[u8],
) -> Result<bool, KeyError> {
    for sge in sges {
        if data.is_empty() {
            break;
        }
        let len = sge.len as u64;
        if offset >= len {
            offset -= len;
            continue;
        }
        let n = ((len - offset) as usize).min(data.len());
        write_mem(
            mrs,
            sge.lkey,
            pd,
            sge.addr + offset,
            &data[..n],
            Access::LOCAL_WRITE,
        )?;
        data = &data[n..];
        offset = 0;
    }
    Ok(data.is_empty())
}

/// The atomic operations of RC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AtomicOp {
    CompareSwap { compare: u64, swap: u64 },
    FetchAdd { add: u64 },
}

/// Runs an atomic on the 8 bytes at `addr` (already checked: registered, REMOTE_ATOMIC, 8-byte
/// aligned) and returns the original value. The value is in host byte order, as rxe does.
pub(crate) fn atomic(addr: u64, op: AtomicOp) -> u64 {
    // SAFETY: the caller checked addr is 8-byte aligned and inside a registered MR that stays
    // mapped; everything that touches it concurrently in this process does so atomically (the
    // atomics of every softnic device in the process go through here).
    let cell = unsafe { AtomicU64::from_ptr(addr as usize as *mut u64) };
    match op {
        AtomicOp::FetchAdd { add } => cell.fetch_add(add, Ordering::AcqRel),
        AtomicOp::CompareSwap { compare, swap } => {
            match cell.compare_exchange(compare, swap, Ordering::AcqRel, Ordering::Acquire) {
                Ok(v) | Err(v) => v,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_and_scatter_cross_element_boundaries() {
        let mut src = [0u8; 10];
        for (i, b) in src.iter_mut().enumerate() {
            *b = i as u8;
        }
        let mut dst = vec![0u8; 10];
        // The device gets addresses as integers, as hardware does: expose read-write pointers.
        let (src_addr, dst_addr) = (src.as_mut_ptr() as u64, dst.as_mut_ptr() as u64);
        let mut mrs = MrTable::new(Some(1));
        let pd = PdId(1);
        let ks = mrs.insert(pd, src_addr, 10, Access::NONE).unwrap();
        let kd = mrs.insert(pd, dst_addr, 10, Access::LOCAL_WRITE).unwrap();
        let sges = [
            Sge {
                addr: src_addr,
                len: 3,
                lkey: ks,
            },
            Sge {
                addr: src_addr + 3,
                len: 7,
                lkey: ks,
            },
        ];
        let mut out = [0u8; 5];
        gather(&mrs, pd, &sges, 1, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3, 4, 5]);
        let dsges = [
            Sge {
                addr: dst_addr,
                len: 4,
                lkey: kd,
            },
            Sge {
                addr: dst_addr + 4,
                len: 2,
                lkey: kd,
            },
        ];
        assert!(scatter(&mrs, pd, &dsges, 2, &[9, 9, 9, 9]).unwrap());
        assert!(!scatter(&mrs, pd, &dsges, 2, &[9, 9, 9, 9, 9]).unwrap());
        assert_eq!(&dst[..6], &[0, 0, 9, 9, 9, 9]);
    }

    #[test]
    fn a_scatter_without_local_write_is_refused() {
        let mut dst = vec![0u8; 8];
        let dst_addr = dst.as_mut_ptr() as u64;
        let mut mrs = MrTable::new(Some(1));
        let k = mrs.insert(PdId(1), dst_addr, 8, Access::NONE).unwrap();
        let sges = [Sge {
            addr: dst_addr,
            len: 8,
            lkey: k,
        }];
        assert!(matches!(
            scatter(&mrs, PdId(1), &sges, 0, &[1]),
            Err(KeyError::NoAccess { .. })
        ));
    }

    /// A peer's WRITE landing while the application reads the same bytes: a bug or a hostile
    /// peer, never undefined behaviour. Under Miri (`cargo +nightly miri test -p softnic --lib
    /// dma`) a plain copy on either side is reported as a data race; natively the test only
    /// shows that the reads see whole bytes of one write or the other.
    #[test]
    fn a_write_racing_the_application_s_read_is_not_a_data_race() {
        let mut mem = vec![0u8; 64];
        let addr = mem.as_mut_ptr() as u64;
        let mut mrs = MrTable::new(Some(1));
        let key = mrs.insert(PdId(1), addr, 64, Access::ALL).unwrap();
        let rounds = if cfg!(miri) { 3 } else { 1000 };
        std::thread::scope(|s| {
            s.spawn(|| {
                for round in 0..rounds {
                    let data = [round as u8 | 1; 64];
                    write_mem(&mrs, key, PdId(1), addr, &data, Access::REMOTE_WRITE).unwrap();
                }
            });
            let mut seen = [0u8; 64];
            for _ in 0..rounds {
                // What the application's side does (`harness::Buffer::read`, the pmd's
                // `RegisteredBuffer::read`).
                // SAFETY: the 64 bytes stay allocated until the scope ends.
                unsafe { load_shared(addr as usize as *const u8, &mut seen) };
                assert!(seen.iter().all(|b| *b == 0 || b % 2 == 1), "{seen:?}");
            }
        });
        drop(mem);
    }
}
