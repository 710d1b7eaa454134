//! Copies between registered memory and packet buffers, and atomics on registered memory.
//! Every range is checked against the MR table first; the raw accesses rely on the promise
//! `reg_mr` makes its caller give (the range stays mapped while registered).

use std::sync::atomic::{AtomicU64, Ordering};

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
    if !out.is_empty() {
        // SAFETY: [addr, addr+len) lies inside a registered MR (checked above), which the
        // registrant promised stays mapped until deregistered; `out` is our own buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(addr as usize as *const u8, out.as_mut_ptr(), out.len())
        }
    }
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
    if !data.is_empty() {
        // SAFETY: as in read_mem; the MR is writable memory of the registrant.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), addr as usize as *mut u8, data.len())
        }
    }
    Ok(())
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
        let mut mrs = MrTable::new(Some(1));
        let pd = PdId(1);
        let ks = mrs
            .insert(pd, src.as_ptr() as u64, 10, Access::NONE)
            .unwrap();
        let kd = mrs
            .insert(pd, dst.as_mut_ptr() as u64, 10, Access::LOCAL_WRITE)
            .unwrap();
        let sges = [
            Sge {
                addr: src.as_ptr() as u64,
                len: 3,
                lkey: ks,
            },
            Sge {
                addr: src.as_ptr() as u64 + 3,
                len: 7,
                lkey: ks,
            },
        ];
        let mut out = [0u8; 5];
        gather(&mrs, pd, &sges, 1, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3, 4, 5]);
        let dsges = [
            Sge {
                addr: dst.as_ptr() as u64,
                len: 4,
                lkey: kd,
            },
            Sge {
                addr: dst.as_ptr() as u64 + 4,
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
        let mut mrs = MrTable::new(Some(1));
        let k = mrs
            .insert(PdId(1), dst.as_mut_ptr() as u64, 8, Access::NONE)
            .unwrap();
        let sges = [Sge {
            addr: dst.as_ptr() as u64,
            len: 8,
            lkey: k,
        }];
        assert!(matches!(
            scatter(&mrs, PdId(1), &sges, 0, &[1]),
            Err(KeyError::NoAccess { .. })
        ));
    }
}
