//! Shared receive queues on plain devices: `ibv_create_srq`, `ibv_modify_srq`,
//! `ibv_query_srq`, `ibv_destroy_srq` and the ops table's `post_srq_recv`, over the pmd's
//! [`pmd::Srq`]. A device with a backup refuses them (`EOPNOTSUPP`): resilient QPs cannot
//! share a receive queue (`docs/failover.md`, "Shared receive queues").

use std::ffi::{c_int, c_void};
use std::sync::Mutex;

use crate::abi::*;
use crate::device::null_with;
use crate::objects::{lock, ours, post_recv_list, RsPd};
use crate::real::real_fns;
use crate::util::{invalid, refuse};

real_fns! {
    ibv_create_srq @ "IBVERBS_1.1": fn(*mut ibv_pd, *mut ibv_srq_init_attr) -> *mut ibv_srq;
    ibv_modify_srq @ "IBVERBS_1.1": fn(*mut ibv_srq, *mut ibv_srq_attr, c_int) -> c_int;
    ibv_query_srq @ "IBVERBS_1.1": fn(*mut ibv_srq, *mut ibv_srq_attr) -> c_int;
    ibv_destroy_srq @ "IBVERBS_1.1": fn(*mut ibv_srq) -> c_int;
}

/// A shared receive queue.
#[repr(C)]
pub struct RsSrq {
    ibv: ibv_srq,
    /// The pmd SRQ.
    pub(crate) srq: pmd::Srq,
}

/// Our live SRQs: (context, provider handle, `ibv_srq` address), for the async event that
/// names an SRQ by its handle.
static LIVE: Mutex<Vec<(usize, u64, usize)>> = Mutex::new(Vec::new());

/// The `ibv_srq` of `ctx` whose provider handle is `handle`, if it is live.
pub(crate) fn by_handle(ctx: *mut ibv_context, handle: pmd::provider::Handle) -> Option<u64> {
    lock(&LIVE)
        .iter()
        .find(|&&(c, h, _)| c == ctx as usize && h == handle.0)
        .map(|&(_, _, p)| p as u64)
}

/// `ibv_create_srq`: on our plain devices, an SRQ of `attr.max_wr` receives of
/// `attr.max_sge` entries, its limit armed at `attr.srq_limit` when non-zero; `attr` is
/// updated to what was granted.
///
/// # Safety
/// `pd` is a live PD; `attr` is valid for reads and writes.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    // SAFETY: forwarded from the caller.
    if unsafe { ours(pd) }.is_none() {
        return match system::ibv_create_srq() {
            // SAFETY: not ours.
            Some(f) => unsafe { f(pd, attr) },
            None => null_with(libc::ENOSYS),
        };
    }
    // SAFETY: ours (checked); the pointer is ours.
    let rpd = unsafe { &*pd.cast::<RsPd>() };
    if rpd.resilient.is_some() {
        refuse(
            "ibv_create_srq",
            "shared receive queues on a device with a backup: resilient QPs cannot share one (docs/failover.md)",
            libc::EOPNOTSUPP,
        );
        return std::ptr::null_mut();
    }
    if attr.is_null() {
        invalid("ibv_create_srq", "no attributes", libc::EINVAL);
        return std::ptr::null_mut();
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &mut *attr };
    let srq = match rpd
        .pmd_pd()
        .create_srq(a.attr.max_wr, a.attr.max_sge, a.attr.srq_limit)
    {
        Ok(s) => s,
        Err(e @ pmd::provider::VerbsError::Unsupported { .. }) => {
            refuse("ibv_create_srq", &e.to_string(), libc::EOPNOTSUPP);
            return std::ptr::null_mut();
        }
        Err(e) => {
            invalid("ibv_create_srq", &e.to_string(), libc::EINVAL);
            return std::ptr::null_mut();
        }
    };
    let granted = match srq.query() {
        Ok(g) => g,
        Err(e) => {
            invalid("ibv_create_srq", &e.to_string(), libc::EINVAL);
            return std::ptr::null_mut();
        }
    };
    a.attr.max_wr = granted.max_wr;
    a.attr.max_sge = granted.max_sge;
    let ctx = rpd.context();
    let handle = srq.handle();
    let p = Box::into_raw(Box::new(RsSrq {
        ibv: ibv_srq {
            context: ctx,
            srq_context: a.srq_context,
            pd,
            handle: handle.0 as u32,
            mutex: libc::PTHREAD_MUTEX_INITIALIZER,
            cond: libc::PTHREAD_COND_INITIALIZER,
            events_completed: 0,
        },
        srq,
    }));
    lock(&LIVE).push((ctx as usize, handle.0, p as usize));
    p.cast()
}

/// `ibv_modify_srq`: `IBV_SRQ_LIMIT` arms (non-zero) or disarms the limit; resizing
/// (`IBV_SRQ_MAX_WR`) is refused with `EINVAL`, as mlx5 refuses it.
///
/// # Safety
/// `srq` is a live SRQ; `attr` is valid for reads.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    // SAFETY: forwarded from the caller.
    if unsafe { ours(srq) }.is_none() {
        return match system::ibv_modify_srq() {
            // SAFETY: not ours.
            Some(f) => unsafe { f(srq, attr, mask) },
            None => libc::ENOSYS,
        };
    }
    if attr.is_null() {
        return invalid("ibv_modify_srq", "no attributes", libc::EINVAL);
    }
    if mask & srq_mask::MAX_WR != 0 {
        return invalid(
            "ibv_modify_srq",
            "resizing an SRQ (IBV_SRQ_MAX_WR) is not supported",
            libc::EINVAL,
        );
    }
    if mask & !srq_mask::LIMIT != 0 {
        return invalid(
            "ibv_modify_srq",
            &format!("attribute mask {mask:#x}"),
            libc::EINVAL,
        );
    }
    if mask & srq_mask::LIMIT == 0 {
        return 0;
    }
    // SAFETY: ours (checked), and the caller's attributes.
    let (rs, a) = unsafe { (&*srq.cast::<RsSrq>(), &*attr) };
    match rs.srq.modify_limit(a.srq_limit) {
        Ok(()) => 0,
        Err(e) => invalid("ibv_modify_srq", &e.to_string(), libc::EINVAL),
    }
}

/// `ibv_query_srq`: its size, entries per receive and limit (0 when disarmed).
///
/// # Safety
/// `srq` is a live SRQ; `attr` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    // SAFETY: forwarded from the caller.
    if unsafe { ours(srq) }.is_none() {
        return match system::ibv_query_srq() {
            // SAFETY: not ours.
            Some(f) => unsafe { f(srq, attr) },
            None => libc::ENOSYS,
        };
    }
    if attr.is_null() {
        return invalid("ibv_query_srq", "no attribute buffer", libc::EINVAL);
    }
    // SAFETY: ours (checked).
    let rs = unsafe { &*srq.cast::<RsSrq>() };
    match rs.srq.query() {
        Ok(q) => {
            // SAFETY: the caller's buffer.
            unsafe {
                attr.write(ibv_srq_attr {
                    max_wr: q.max_wr,
                    max_sge: q.max_sge,
                    srq_limit: q.limit,
                })
            };
            0
        }
        Err(e) => invalid("ibv_query_srq", &e.to_string(), libc::EIO),
    }
}

/// `ibv_destroy_srq`: `EBUSY` while a QP still takes its receives from it.
///
/// # Safety
/// `srq` is a live SRQ, destroyed once.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    // SAFETY: forwarded from the caller.
    if unsafe { ours(srq) }.is_none() {
        return match system::ibv_destroy_srq() {
            // SAFETY: not ours.
            Some(f) => unsafe { f(srq) },
            None => libc::ENOSYS,
        };
    }
    // SAFETY: ours (checked).
    let users = unsafe { &*srq.cast::<RsSrq>() }.srq.users();
    if users > 1 {
        return invalid(
            "ibv_destroy_srq",
            &format!("{} QPs still take their receives from it", users - 1),
            libc::EBUSY,
        );
    }
    lock(&LIVE).retain(|&(_, _, p)| p != srq as usize);
    // SAFETY: ours, freed once.
    drop(unsafe { Box::from_raw(srq.cast::<RsSrq>()) });
    0
}

/// The ops table's `post_srq_recv`: posts the list in order; on a refused request `bad_wr`
/// names it (`ENOMEM` when the SRQ is full, `EINVAL` for a bad request), those before it are
/// posted.
///
/// # Safety
/// `srq` is one of our live SRQs; `wr` is a valid list; `bad_wr` is null or writable.
pub unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: the inline wrapper passes one of our SRQs.
    let rs = unsafe { &*srq.cast::<RsSrq>() };
    // SAFETY: the caller's list and slot, forwarded.
    unsafe { post_recv_list(wr, bad_wr, "ibv_post_srq_recv", |rwr| rs.srq.post_recv(rwr)) }
}

/// The pmd SRQ behind one of ours, for `ibv_create_qp`.
///
/// # Safety
/// `srq` is one of our live SRQs, outliving `'a`.
pub(crate) unsafe fn pmd_srq<'a>(srq: *mut c_void) -> &'a pmd::Srq {
    // SAFETY: forwarded from the caller.
    unsafe { &(*srq.cast::<RsSrq>()).srq }
}
