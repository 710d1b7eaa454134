//! PD, MR, CQ, completion channel and QP on our devices, and the ops-table functions the
//! inline data-path verbs (`ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`,
//! `ibv_req_notify_cq`) call. Each object starts with its `ibv_*` struct, so the pointer a
//! caller holds is the pointer to ours; an object is ours when its context is.

use std::ffi::{c_int, c_void};
use std::mem::MaybeUninit;
use std::sync::{Arc, Mutex, MutexGuard};

use pmd::{
    Access, AddressVector, FastSend, Gid, Mtu, Payload, QpAttr, QpCaps, QpState, RecvWr, Remote,
    SendFlags, SendOp, SendWr, SgList, Sge, WcOpcode, WorkCompletion,
};

use crate::abi::*;
use crate::device::{null_with, our_context, RsContext};
use crate::lock::Lock;
use crate::real::real_fns;
use crate::util::{invalid, refuse};
use pmd::datapath::sq::FastRequest;

real_fns! {
    ibv_alloc_pd @ "IBVERBS_1.1": fn(*mut ibv_context) -> *mut ibv_pd;
    ibv_dealloc_pd @ "IBVERBS_1.1": fn(*mut ibv_pd) -> c_int;
    ibv_reg_mr @ "IBVERBS_1.1": fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr;
    ibv_reg_mr_iova @ "IBVERBS_1.7": fn(*mut ibv_pd, *mut c_void, usize, u64, c_int) -> *mut ibv_mr;
    ibv_reg_mr_iova2 @ "IBVERBS_1.8": fn(*mut ibv_pd, *mut c_void, usize, u64, u32) -> *mut ibv_mr;
    ibv_dereg_mr @ "IBVERBS_1.1": fn(*mut ibv_mr) -> c_int;
    ibv_create_comp_channel @ "IBVERBS_1.0": fn(*mut ibv_context) -> *mut ibv_comp_channel;
    ibv_destroy_comp_channel @ "IBVERBS_1.0": fn(*mut ibv_comp_channel) -> c_int;
    ibv_create_cq @ "IBVERBS_1.1": fn(*mut ibv_context, c_int, *mut c_void, *mut ibv_comp_channel, c_int) -> *mut ibv_cq;
    ibv_destroy_cq @ "IBVERBS_1.1": fn(*mut ibv_cq) -> c_int;
    ibv_get_cq_event @ "IBVERBS_1.1": fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int;
    ibv_ack_cq_events @ "IBVERBS_1.1": fn(*mut ibv_cq, u32) -> ();
    ibv_create_qp @ "IBVERBS_1.1": fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp;
    ibv_modify_qp @ "IBVERBS_1.1": fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int;
    ibv_query_qp @ "IBVERBS_1.1": fn(*mut ibv_qp, *mut ibv_qp_attr, c_int, *mut ibv_qp_init_attr) -> c_int;
    ibv_destroy_qp @ "IBVERBS_1.1": fn(*mut ibv_qp) -> c_int;
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The context of an object whose first field is its `ibv_context *`, if it is ours.
///
/// # Safety
/// `obj` is null or a live verbs object starting with its context pointer.
pub(crate) unsafe fn ours<'a, T>(obj: *mut T) -> Option<&'a RsContext> {
    if obj.is_null() {
        return None;
    }
    // SAFETY: every verbs object this is called on starts with `struct ibv_context *`.
    let ctx = unsafe { obj.cast::<*mut ibv_context>().read() };
    // SAFETY: a live object's context is live.
    unsafe { our_context(ctx) }
}

/// A protection domain.
#[repr(C)]
pub struct RsPd {
    ibv: ibv_pd,
    pd: Arc<pmd::Pd>,
    /// On a resilient device: the PD with its backup twin (`pd` is its default PD).
    pub(crate) resilient: Option<pmd::resilient::ResilientPd>,
}

impl RsPd {
    /// The context the PD was allocated on.
    pub(crate) fn context(&self) -> *mut ibv_context {
        self.ibv.context
    }

    /// The pmd PD (on a resilient device, its default PD).
    pub(crate) fn pmd_pd(&self) -> &Arc<pmd::Pd> {
        &self.pd
    }
}

/// `ibv_alloc_pd`.
///
/// # Safety
/// `ctx` is an open context.
#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    // SAFETY: forwarded from the caller.
    let Some(c) = (unsafe { our_context(ctx) }) else {
        return match system::ibv_alloc_pd() {
            // SAFETY: not ours.
            Some(f) => unsafe { f(ctx) },
            None => null_with(libc::ENOSYS),
        };
    };
    let allocated = match crate::resilient::device_of(c) {
        Some(d) => crate::resilient::alloc_pd(d).map(|(pd, r)| (pd, Some(r))),
        None => c
            .pmd
            .alloc_pd()
            .map(|pd| (pd, None))
            .map_err(|e| e.to_string()),
    };
    match allocated {
        Ok((pd, resilient)) => {
            let handle = pd.id();
            Box::into_raw(Box::new(RsPd {
                ibv: ibv_pd {
                    context: ctx,
                    handle,
                },
                pd,
                resilient,
            }))
            .cast()
        }
        Err(e) => {
            invalid("ibv_alloc_pd", &e, libc::ENOMEM);
            std::ptr::null_mut()
        }
    }
}

/// `ibv_dealloc_pd`. The pmd keeps the PD alive while an MR or QP still uses it.
///
/// # Safety
/// `pd` is a live PD, deallocated once.
#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    // SAFETY: forwarded from the caller.
    if unsafe { ours(pd) }.is_none() {
        return match system::ibv_dealloc_pd() {
            // SAFETY: not ours.
            Some(f) => unsafe { f(pd) },
            None => libc::ENOSYS,
        };
    }
    // SAFETY: ours, made by ibv_alloc_pd, freed once.
    drop(unsafe { Box::from_raw(pd.cast::<RsPd>()) });
    0
}

/// A memory region.
#[repr(C)]
pub struct RsMr {
    ibv: ibv_mr,
    mr: Option<pmd::Mr>,
    /// On a resilient device: the MR with its backup twin (whose rkey the pmd publishes).
    resilient: Option<pmd::resilient::ResilientMr>,
}

/// Access bits the shim takes: the four rights, plus hints a provider may ignore
/// (`MW_BIND`, `HUGETLB`, `RELAXED_ORDERING`). `ZERO_BASED` and `ON_DEMAND` are refused.
const ACCESS_IGNORED: c_int = (1 << 4) | (1 << 7) | (1 << 20);
const ACCESS_ZERO_BASED: c_int = 1 << 5;
const ACCESS_ON_DEMAND: c_int = 1 << 6;

unsafe fn reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    if access & ACCESS_ON_DEMAND != 0 {
        refuse(
            "ibv_reg_mr",
            "IBV_ACCESS_ON_DEMAND (ODP): railshift devices pin nothing on demand",
            libc::EOPNOTSUPP,
        );
        return std::ptr::null_mut();
    }
    if access & ACCESS_ZERO_BASED != 0 || iova != addr as u64 {
        refuse(
            "ibv_reg_mr",
            "an iova other than the address (zero-based MRs)",
            libc::EOPNOTSUPP,
        );
        return std::ptr::null_mut();
    }
    let known = Access::ALL.bits() as c_int | ACCESS_IGNORED;
    if access & !known != 0 {
        invalid(
            "ibv_reg_mr",
            &format!("unknown access bits {:#x}", access & !known),
            libc::EINVAL,
        );
        return std::ptr::null_mut();
    }
    // SAFETY: `pd` is ours (checked by the callers).
    let rs = unsafe { &*pd.cast::<RsPd>() };
    let rights = Access::from_bits_truncate(access as u32);
    // SAFETY: the caller of ibv_reg_mr promises the range stays mapped until ibv_dereg_mr,
    // which is Pd::register's contract.
    let registered = match &rs.resilient {
        // SAFETY: as above.
        Some(r) => unsafe { r.register(addr.cast(), len, rights) }
            .map(|m| (m.lkey(), m.rkey(), None, Some(m))),
        // SAFETY: as above.
        None => unsafe { rs.pd.register(addr.cast(), len, rights) }
            .map(|m| (m.lkey(), m.rkey(), Some(m), None)),
    };
    match registered {
        Ok((lkey, rkey, mr, resilient)) => Box::into_raw(Box::new(RsMr {
            ibv: ibv_mr {
                context: rs.ibv.context,
                pd,
                addr,
                length: len,
                handle: lkey,
                lkey,
                rkey,
            },
            mr,
            resilient,
        }))
        .cast(),
        Err(e) => {
            invalid("ibv_reg_mr", &e.to_string(), libc::EINVAL);
            std::ptr::null_mut()
        }
    }
}

/// `ibv_reg_mr`.
///
/// # Safety
/// `pd` is a live PD; the range stays mapped until the MR is deregistered.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded from the caller.
    if unsafe { ours(pd) }.is_none() {
        return match system::ibv_reg_mr() {
            // SAFETY: not ours.
            Some(f) => unsafe { f(pd, addr, len, access) },
            None => null_with(libc::ENOSYS),
        };
    }
    // SAFETY: ours; the caller's range.
    unsafe { reg_mr(pd, addr, len, addr as u64, access) }
}

/// `ibv_reg_mr_iova`.
///
/// # Safety
/// As `ibv_reg_mr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded from the caller.
    if unsafe { ours(pd) }.is_none() {
        return match system::ibv_reg_mr_iova() {
            // SAFETY: not ours.
            Some(f) => unsafe { f(pd, addr, len, iova, access) },
            None => null_with(libc::ENOSYS),
        };
    }
    // SAFETY: ours; the caller's range.
    unsafe { reg_mr(pd, addr, len, iova, access) }
}

/// `ibv_reg_mr_iova2` (what the `ibv_reg_mr` macro calls when the access flags are not a
/// constant).
///
/// # Safety
/// As `ibv_reg_mr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    // SAFETY: forwarded from the caller.
    if unsafe { ours(pd) }.is_none() {
        return match system::ibv_reg_mr_iova2() {
            // SAFETY: not ours.
            Some(f) => unsafe { f(pd, addr, len, iova, access) },
            None => null_with(libc::ENOSYS),
        };
    }
    // SAFETY: ours; the caller's range.
    unsafe { reg_mr(pd, addr, len, iova, access as c_int) }
}

/// `ibv_dereg_mr`: the device's refusal comes back as `EBUSY`, the MR kept.
///
/// # Safety
/// `mr` is a live MR, deregistered once.
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    // SAFETY: forwarded from the caller.
    if unsafe { ours(mr) }.is_none() {
        return match system::ibv_dereg_mr() {
            // SAFETY: not ours.
            Some(f) => unsafe { f(mr) },
            None => libc::ENOSYS,
        };
    }
    // SAFETY: ours, made by reg_mr.
    let rs = unsafe { &mut *mr.cast::<RsMr>() };
    if let Some(m) = rs.mr.take() {
        if let Err(e) = m.deregister() {
            return invalid("ibv_dereg_mr", &e.to_string(), libc::EBUSY);
        }
    }
    if let Some(m) = rs.resilient.take() {
        if let Err(e) = m.deregister() {
            return invalid("ibv_dereg_mr", &e.to_string(), libc::EBUSY);
        }
    }
    // SAFETY: ours, freed once.
    drop(unsafe { Box::from_raw(mr.cast::<RsMr>()) });
    0
}

/// A completion channel: its fd is an epoll set of the event descriptors of its CQs, so it
/// is readable exactly when one of them has an event, as the kernel channel is.
#[repr(C)]
pub struct RsChannel {
    ibv: ibv_comp_channel,
}

/// `ibv_create_comp_channel`.
///
/// # Safety
/// `ctx` is an open context.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(ctx: *mut ibv_context) -> *mut ibv_comp_channel {
    // SAFETY: forwarded from the caller.
    if unsafe { our_context(ctx) }.is_none() {
        return match system::ibv_create_comp_channel() {
            // SAFETY: not ours.
            Some(f) => unsafe { f(ctx) },
            None => null_with(libc::ENOSYS),
        };
    }
    // SAFETY: plain syscall.
    let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if fd < 0 {
        return std::ptr::null_mut();
    }
    Box::into_raw(Box::new(RsChannel {
        ibv: ibv_comp_channel {
            context: ctx,
            fd,
            refcnt: 0,
        },
    }))
    .cast()
}

/// `ibv_destroy_comp_channel`: `EBUSY` while a CQ uses it.
///
/// # Safety
/// `ch` is a live channel, destroyed once.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    // SAFETY: forwarded from the caller.
    if unsafe { ours(ch) }.is_none() {
        return match system::ibv_destroy_comp_channel() {
            // SAFETY: not ours.
            Some(f) => unsafe { f(ch) },
            None => libc::ENOSYS,
        };
    }
    // SAFETY: ours.
    let rs = unsafe { Box::from_raw(ch.cast::<RsChannel>()) };
    if rs.ibv.refcnt > 0 {
        let n = rs.ibv.refcnt;
        std::mem::forget(rs);
        return invalid(
            "ibv_destroy_comp_channel",
            &format!("{n} CQs still use the channel"),
            libc::EBUSY,
        );
    }
    // SAFETY: the epoll descriptor this channel owns.
    unsafe { libc::close(rs.ibv.fd) };
    0
}

/// A completion queue.
#[repr(C)]
pub struct RsCq {
    ibv: ibv_cq,
    /// Locked by every `ibv_poll_cq`: a lock without std's poison flag (see [`Lock`]).
    cq: Lock<pmd::Cq>,
    /// The device's poll activity (the helper thread stays out while the application polls).
    activity: Arc<crate::device::PollActivity>,
    /// Whether the pmd CQ has completion events (it was given a channel).
    events: bool,
}

/// `ibv_create_cq`.
///
/// # Safety
/// `ctx` is an open context; `channel` is null or a live channel of it.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    // SAFETY: forwarded from the caller.
    let Some(c) = (unsafe { our_context(ctx) }) else {
        return match system::ibv_create_cq() {
            // SAFETY: not ours.
            Some(f) => unsafe { f(ctx, cqe, cq_context, channel, comp_vector) },
            None => null_with(libc::ENOSYS),
        };
    };
    if cqe < 1 {
        invalid("ibv_create_cq", &format!("cqe {cqe}"), libc::EINVAL);
        return std::ptr::null_mut();
    }
    if let Some(d) = crate::resilient::device_of(c) {
        // SAFETY: forwarded from the caller: `channel` is null or a live channel of ours.
        return unsafe { crate::resilient::create_cq(c, d, cqe, cq_context, channel) };
    }
    let events = !channel.is_null();
    let cq = match c.pmd.create_cq(cqe as u32, events) {
        Ok(cq) => cq,
        Err(e) => {
            invalid("ibv_create_cq", &e.to_string(), libc::EINVAL);
            return std::ptr::null_mut();
        }
    };
    let event_fd = cq.event_fd();
    let handle = cq.cqn();
    let rs = Box::into_raw(Box::new(RsCq {
        ibv: ibv_cq {
            context: ctx,
            channel,
            cq_context,
            handle,
            cqe,
            mutex: libc::PTHREAD_MUTEX_INITIALIZER,
            cond: libc::PTHREAD_COND_INITIALIZER,
            comp_events_completed: 0,
            async_events_completed: 0,
        },
        cq: Lock::new(cq),
        activity: c.activity.clone(),
        events,
    }));
    if let (true, Some(fd)) = (events, event_fd) {
        // SAFETY: `channel` is a live channel of ours (its context is `ctx`).
        let ch = unsafe { &mut *channel.cast::<RsChannel>() };
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: rs as u64,
        };
        // SAFETY: both descriptors are open; `ev` is valid.
        if unsafe { libc::epoll_ctl(ch.ibv.fd, libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
            let errno = std::io::Error::last_os_error();
            // SAFETY: made just above, not yet handed out.
            drop(unsafe { Box::from_raw(rs) });
            invalid(
                "ibv_create_cq",
                &format!("epoll_ctl: {errno}"),
                libc::EINVAL,
            );
            return std::ptr::null_mut();
        }
        ch.ibv.refcnt += 1;
    }
    rs.cast()
}

/// `ibv_destroy_cq`.
///
/// # Safety
/// `cq` is a live CQ no QP uses, destroyed once.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    // SAFETY: forwarded from the caller.
    let Some(c) = (unsafe { ours(cq) }) else {
        return match system::ibv_destroy_cq() {
            // SAFETY: not ours.
            Some(f) => unsafe { f(cq) },
            None => libc::ENOSYS,
        };
    };
    if crate::resilient::device_of(c).is_some() {
        // SAFETY: a live CQ of a resilient device, destroyed once.
        return unsafe { crate::resilient::destroy_cq(cq) };
    }
    // SAFETY: ours, freed once.
    let rs = unsafe { Box::from_raw(cq.cast::<RsCq>()) };
    if !rs.ibv.channel.is_null() {
        // SAFETY: the CQ's channel outlives it (destroying it is refused while we count).
        let ch = unsafe { &mut *rs.ibv.channel.cast::<RsChannel>() };
        if let Some(fd) = rs.cq.lock().event_fd() {
            // SAFETY: both descriptors are open.
            unsafe { libc::epoll_ctl(ch.ibv.fd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
        }
        ch.ibv.refcnt -= 1;
    }
    0
}

/// `ibv_get_cq_event`: waits on the channel's epoll set (or, on a channel the caller made
/// non-blocking, fails with `EAGAIN`), then consumes the CQ's event.
///
/// # Safety
/// `ch` is a live channel; `cq_out` and `ctx_out` are valid for writes.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    ch: *mut ibv_comp_channel,
    cq_out: *mut *mut ibv_cq,
    ctx_out: *mut *mut c_void,
) -> c_int {
    // SAFETY: forwarded from the caller.
    if unsafe { ours(ch) }.is_none() {
        return match system::ibv_get_cq_event() {
            // SAFETY: not ours.
            Some(f) => unsafe { f(ch, cq_out, ctx_out) },
            None => -1,
        };
    }
    // SAFETY: ours (checked above).
    let resilient = unsafe { ours(ch) }.is_some_and(|c| crate::resilient::device_of(c).is_some());
    // SAFETY: ours.
    let fd = unsafe { (*ch).fd };
    // SAFETY: plain syscall on our descriptor.
    let nonblocking = unsafe { libc::fcntl(fd, libc::F_GETFL) } & libc::O_NONBLOCK != 0;
    loop {
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: one valid event slot.
        let n = unsafe { libc::epoll_wait(fd, &mut ev, 1, if nonblocking { 0 } else { -1 }) };
        if n < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return -1;
        }
        if n == 0 {
            crate::util::set_errno(libc::EAGAIN);
            return -1;
        }
        if resilient {
            let cq = ev.u64 as *mut ibv_cq;
            // SAFETY: the epoll set holds only live CQs of this channel (destroy removes
            // them), and a resilient device's CQs are resilient ones.
            if unsafe { crate::resilient::take_event(cq) } {
                // SAFETY: the caller's slots; the CQ is live.
                unsafe {
                    cq_out.write(cq);
                    ctx_out.write((*cq).cq_context);
                }
                return 0;
            }
            continue;
        }
        let rs = ev.u64 as *mut RsCq;
        // SAFETY: the epoll set holds only live CQs of this channel (destroy removes them).
        let cq = unsafe { &*rs };
        let fired = cq
            .cq
            .lock()
            .wait_event(Some(std::time::Duration::ZERO))
            .unwrap_or(false);
        if fired {
            // SAFETY: the caller's slots.
            unsafe {
                cq_out.write(rs.cast());
                ctx_out.write(cq.ibv.cq_context);
            }
            return 0;
        }
    }
}

/// `ibv_ack_cq_events`.
///
/// # Safety
/// `cq` is a live CQ.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, n: u32) {
    // SAFETY: forwarded from the caller.
    if unsafe { ours(cq) }.is_none() {
        if let Some(f) = system::ibv_ack_cq_events() {
            // SAFETY: not ours.
            unsafe { f(cq, n) };
        }
        return;
    }
    // SAFETY: ours; acknowledgements come from the thread that got the events.
    unsafe { (*cq).comp_events_completed = (*cq).comp_events_completed.wrapping_add(n) };
}

/// The ops table's `req_notify_cq`: arms the CQ (a CQ without a channel has nothing to
/// signal and answers 0).
///
/// # Safety
/// `cq` is one of our live CQs (the ops table is only reachable through our contexts).
pub unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, _solicited_only: c_int) -> c_int {
    // SAFETY: the inline wrapper passes one of our CQs (the ops table is ours).
    let rs = unsafe { &*cq.cast::<RsCq>() };
    if !rs.events {
        return 0;
    }
    match rs.cq.lock().arm() {
        Ok(()) => 0,
        Err(e) => invalid("ibv_req_notify_cq", &e.to_string(), libc::EINVAL),
    }
}

pub(crate) fn to_ibv_wc(wc: &WorkCompletion) -> ibv_wc {
    let status: u8 = wc.status.into();
    ibv_wc {
        wr_id: wc.wr_id,
        status: u32::from(status),
        opcode: wc.opcode as u32,
        vendor_err: u32::from(wc.vendor_err),
        byte_len: wc.byte_len,
        imm_data: wc.imm.map_or(0, u32::to_be),
        qp_num: wc.qp_num,
        src_qp: 0,
        wc_flags: if wc.imm.is_some() { IBV_WC_WITH_IMM } else { 0 },
        pkey_index: 0,
        slid: 0,
        sl: 0,
        dlid_path_bits: 0,
    }
}

/// Two adjacent `u32` fields of an `ibv_wc`, `first` at the lower address, as the 8-byte
/// word that holds them in memory (whatever the byte order).
const fn u32_pair(first: u32, second: u32) -> u64 {
    let (a, b) = (first.to_ne_bytes(), second.to_ne_bytes());
    u64::from_ne_bytes([a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]])
}

/// `ibv_wc_status`'s `IBV_WC_SUCCESS`.
const IBV_WC_SUCCESS: u32 = 0;

/// Bytes 8..16 of a fast-path send's `ibv_wc` (`status`, `opcode`), by [`FastSend`] kind:
/// the poller's loop writes one load from this table (from its copy in [`SendWords`]), built
/// at compile time from [`FastSend::opcode`], instead of a compare and two stores.
const FAST_SEND_STATUS_OPCODE: [u64; 4] = {
    let mut words = [0; 4];
    let mut i = 0;
    while i < words.len() {
        // `WcOpcode`'s discriminants are `enum ibv_wc_opcode`'s values.
        words[i] = u32_pair(IBV_WC_SUCCESS, FastSend::ALL[i].opcode() as u32);
        i += 1;
    }
    words
};

// The fast path writes an `ibv_wc` as six 8-byte words: `wr_id`; `status`, `opcode`;
// `vendor_err`, `byte_len`; `imm_data`, `qp_num`; `src_qp`, `wc_flags`; the 16- and 8-bit
// fields and the tail padding. These are the offsets it assumes (abi.rs's layout test checks
// the same offsets against verbs.h).
const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<ibv_wc>() == 48 && align_of::<ibv_wc>() == 8);
    assert!(offset_of!(ibv_wc, status) == 8 && offset_of!(ibv_wc, opcode) == 12);
    assert!(offset_of!(ibv_wc, vendor_err) == 16 && offset_of!(ibv_wc, byte_len) == 20);
    assert!(offset_of!(ibv_wc, imm_data) == 24 && offset_of!(ibv_wc, qp_num) == 28);
    assert!(offset_of!(ibv_wc, src_qp) == 32 && offset_of!(ibv_wc, wc_flags) == 36);
    assert!(offset_of!(ibv_wc, pkey_index) == 40);
};

/// What the poller's loop writes a fast-path send's `ibv_wc` from, made once per poll.
///
/// The status-and-opcode table is copied here, onto the poller's stack, rather than read from
/// `FAST_SEND_STATUS_OPCODE` in place: the loop has no register to spare for the constant
/// table's address, so LLVM computed it again for every CQE (a `lea`), where a table on the
/// stack is one load off the stack pointer. Four stores per poll for one instruction per CQE
/// (datapath benchmark: 41.8 -> 40.9 instructions per CQE at 32 per poll).
#[derive(Clone, Copy)]
pub struct SendWords {
    /// Bytes 8..16 (`status`, `opcode`) by [`FastSend`] kind: `FAST_SEND_STATUS_OPCODE`.
    status_opcode: [u64; 4],
    /// Bytes 24..32: `imm_data` (none) and the QP's `qp_num`. Bytes 16..24 and 32..48 are
    /// zero for every fast-path send.
    imm_qp: u64,
}

/// The pmd's poller writes `ibv_wc`s straight into the application's array: no
/// `WorkCompletion` array between, no conversion pass after.
impl pmd::CompletionLayout for ibv_wc {
    /// The status-and-opcode words by kind and the QP's word: a successful send's completion
    /// is constant but for its id, opcode and QP (status success, no length, immediate, flags
    /// or vendor error, as libmlx5 reports a WRITE's or SEND's), so the loop writes six words,
    /// not twelve fields.
    type SendTemplate = SendWords;

    #[inline(always)]
    fn send_template(hot: &WorkCompletion) -> SendWords {
        debug_assert!(
            hot.is_ok() && hot.byte_len == 0 && hot.imm.is_none() && hot.vendor_err == 0,
            "a send template that is not a plain successful send: {hot:?}"
        );
        let [w0, w1, w2, w3] = FAST_SEND_STATUS_OPCODE;
        SendWords {
            status_opcode: [w0, w1, w2, w3],
            imm_qp: u32_pair(0, hot.qp_num),
        }
    }

    #[inline(always)]
    fn send(template: &SendWords, wr_id: u64, kind: FastSend) -> ibv_wc {
        let words: [u64; 6] = [
            wr_id,
            // `kind` is at most 3: the index needs no bounds check.
            template.status_opcode[kind as usize],
            // vendor_err, byte_len; imm_data, qp_num; src_qp, wc_flags; the small fields.
            0,
            template.imm_qp,
            0,
            0,
        ];
        // SAFETY: `ibv_wc` is `repr(C)`, 48 bytes (the compiler checks the sizes), and made
        // of integers only, so any bytes are a valid value; the words hold its fields at the
        // offsets asserted above (the last two bytes land in its tail padding).
        unsafe { std::mem::transmute::<[u64; 6], ibv_wc>(words) }
    }

    #[inline(always)]
    fn from_completion(wc: &WorkCompletion) -> ibv_wc {
        to_ibv_wc(wc)
    }
}

/// The ops table's `poll_cq`: polls, and when the CQ is empty on a manual-progress device,
/// runs the device once and polls again (run-to-completion).
///
/// # Safety
/// `cq` is one of our live CQs; `out` holds `n` entries.
pub unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, out: *mut ibv_wc) -> c_int {
    // SAFETY: the inline wrapper passes one of our CQs.
    let rs = unsafe { &*cq.cast::<RsCq>() };
    let _driving = rs.activity.driving();
    if n <= 0 || out.is_null() {
        return 0;
    }
    // SAFETY: the caller's array holds `n` entries (positive and not null, checked); the poll
    // only writes whole entries into it, which is what `MaybeUninit` slots allow.
    let slots =
        unsafe { std::slice::from_raw_parts_mut(out.cast::<MaybeUninit<ibv_wc>>(), n as usize) };
    rs.cq.lock().poll_with_progress_into(slots) as c_int
}

/// A queue pair.
#[repr(C)]
pub struct RsQp {
    ibv: ibv_qp,
    qp: Mutex<pmd::Qp>,
    sq_sig_all: bool,
    max_inline: u32,
}

/// The pmd QP behind one of our QPs on a plain device: the datapath benchmark's baseline
/// posts on the same rings directly (benches/src/bin/datapath.rs).
///
/// # Safety
/// `qp` is one of our live QPs on a plain (not resilient) device, and outlives `'a`.
#[doc(hidden)]
pub unsafe fn pmd_qp<'a>(qp: *mut ibv_qp) -> &'a Mutex<pmd::Qp> {
    // SAFETY: the caller's plain QP, which is an RsQp.
    unsafe { &(*qp.cast::<RsQp>()).qp }
}

/// The pmd CQ behind one of our CQs on a plain device (see [`pmd_qp`]).
///
/// # Safety
/// `cq` is one of our live CQs on a plain device, and outlives `'a`.
#[doc(hidden)]
pub unsafe fn pmd_cq<'a>(cq: *mut ibv_cq) -> &'a Lock<pmd::Cq> {
    // SAFETY: the caller's plain CQ, which is an RsCq.
    unsafe { &(*cq.cast::<RsCq>()).cq }
}

/// Moves `qp` through INIT, RTR and RTS towards the peer's `gid` (index 0's, RoCE v2) and
/// `qpn` with the attributes perftest uses (MTU 4096, timeout 14, 7 retries), as a program
/// does through `ibv_modify_qp`: for the benchmark and the tests that bring up QP pairs in
/// process. The first refusal is returned as `(state asked, errno)`.
///
/// # Safety
/// `qp` is a live QP.
#[doc(hidden)]
pub unsafe fn connect_rc(qp: *mut ibv_qp, gid: ibv_gid, qpn: u32) -> Result<(), (u32, c_int)> {
    let steps: [(ibv_qp_attr, c_int); 3] = [
        (
            ibv_qp_attr {
                qp_state: 1,
                port_num: 1,
                qp_access_flags: 1 | 2 | 4,
                ..ibv_qp_attr::default()
            },
            qp_mask::STATE | qp_mask::PKEY_INDEX | qp_mask::PORT | qp_mask::ACCESS_FLAGS,
        ),
        (
            ibv_qp_attr {
                qp_state: 2,
                path_mtu: 5,
                dest_qp_num: qpn,
                max_dest_rd_atomic: 1,
                min_rnr_timer: 12,
                ah_attr: ibv_ah_attr {
                    grh: ibv_global_route {
                        dgid: gid,
                        hop_limit: 64,
                        ..ibv_global_route::default()
                    },
                    is_global: 1,
                    port_num: 1,
                    ..ibv_ah_attr::default()
                },
                ..ibv_qp_attr::default()
            },
            qp_mask::STATE
                | qp_mask::AV
                | qp_mask::PATH_MTU
                | qp_mask::DEST_QPN
                | qp_mask::RQ_PSN
                | qp_mask::MAX_DEST_RD_ATOMIC
                | qp_mask::MIN_RNR_TIMER,
        ),
        (
            ibv_qp_attr {
                qp_state: 3,
                timeout: 14,
                retry_cnt: 7,
                rnr_retry: 7,
                max_rd_atomic: 1,
                ..ibv_qp_attr::default()
            },
            qp_mask::STATE
                | qp_mask::TIMEOUT
                | qp_mask::RETRY_CNT
                | qp_mask::RNR_RETRY
                | qp_mask::SQ_PSN
                | qp_mask::MAX_QP_RD_ATOMIC,
        ),
    ];
    for (mut attr, mask) in steps {
        // SAFETY: the caller's live QP and valid attributes.
        let rc = unsafe { ibv_modify_qp(qp, &mut attr, mask) };
        if rc != 0 {
            return Err((attr.qp_state, rc));
        }
    }
    Ok(())
}

pub(crate) fn caps_from(cap: &ibv_qp_cap) -> QpCaps {
    QpCaps {
        max_send_wr: cap.max_send_wr.max(1),
        max_recv_wr: cap.max_recv_wr.max(1),
        max_send_sge: cap.max_send_sge.max(1),
        max_recv_sge: cap.max_recv_sge.max(1),
        max_inline_data: cap.max_inline_data,
    }
}

/// `ibv_create_qp`: RC only; UD, UC, XRC, raw packet and driver QPs are refused with
/// `EOPNOTSUPP`. A QP on an SRQ takes its receives from it (plain devices: a device with a
/// backup has no SRQs).
///
/// # Safety
/// `pd` is a live PD; `attr` is valid for reads and writes.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    // SAFETY: forwarded from the caller.
    if unsafe { ours(pd) }.is_none() {
        return match system::ibv_create_qp() {
            // SAFETY: not ours.
            Some(f) => unsafe { f(pd, attr) },
            None => null_with(libc::ENOSYS),
        };
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &mut *attr };
    if a.qp_type != IBV_QPT_RC {
        let kind = match a.qp_type {
            3 => "UC",
            4 => "UD",
            8 => "raw packet",
            9 | 10 => "XRC",
            0xff => "driver (DC, SRD)",
            _ => "unknown",
        };
        refuse(
            "ibv_create_qp",
            &format!(
                "{kind} QPs (type {}): railshift devices run RC only",
                a.qp_type
            ),
            libc::EOPNOTSUPP,
        );
        return std::ptr::null_mut();
    }
    // SAFETY: the caller's SRQ, null or live.
    if !a.srq.is_null() && unsafe { ours(a.srq) }.is_none() {
        invalid("ibv_create_qp", "an SRQ of another device", libc::EINVAL);
        return std::ptr::null_mut();
    }
    // SAFETY: the caller's CQs.
    let (send_ours, recv_ours) = unsafe { (ours(a.send_cq).is_some(), ours(a.recv_cq).is_some()) };
    if !send_ours || !recv_ours {
        invalid("ibv_create_qp", "a CQ of another device", libc::EINVAL);
        return std::ptr::null_mut();
    }
    // SAFETY: ours (checked); the pointer is ours.
    let rpd = unsafe { &*pd.cast::<RsPd>() };
    if rpd.resilient.is_some() && !a.srq.is_null() {
        refuse(
            "ibv_create_qp",
            "a QP on a shared receive queue on a device with a backup (docs/failover.md)",
            libc::EOPNOTSUPP,
        );
        return std::ptr::null_mut();
    }
    if rpd.resilient.is_some() {
        // SAFETY: a PD of a resilient device; both CQs are ours (checked).
        return unsafe { crate::resilient::create_qp(pd, a) };
    }
    // SAFETY: ours (checked).
    let (scq, rcq) = unsafe { (&*a.send_cq.cast::<RsCq>(), &*a.recv_cq.cast::<RsCq>()) };
    let caps = caps_from(&a.cap);
    // SAFETY: ours (checked above), live for the call.
    let srq = (!a.srq.is_null()).then(|| unsafe { crate::srq::pmd_srq(a.srq) });
    let create = |s: &pmd::Cq, r: &pmd::Cq| match srq {
        Some(srq) => rpd.pd.create_qp_on_srq(s, r, caps, srq),
        None => rpd.pd.create_qp(s, r, caps),
    };
    let created = if std::ptr::eq(scq, rcq) {
        let g = scq.cq.lock();
        create(&g, &g)
    } else {
        let s = scq.cq.lock();
        let r = rcq.cq.lock();
        create(&s, &r)
    };
    let qp = match created {
        Ok(q) => q,
        Err(e) => {
            invalid("ibv_create_qp", &e.to_string(), libc::EINVAL);
            return std::ptr::null_mut();
        }
    };
    let granted = qp.caps();
    a.cap = ibv_qp_cap {
        max_send_wr: granted.max_send_wr,
        max_recv_wr: granted.max_recv_wr,
        max_send_sge: granted.max_send_sge,
        max_recv_sge: granted.max_recv_sge,
        max_inline_data: granted.max_inline_data,
    };
    let qpn = qp.qpn();
    Box::into_raw(Box::new(RsQp {
        ibv: ibv_qp {
            context: rpd.ibv.context,
            qp_context: a.qp_context,
            pd,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            handle: qpn,
            qp_num: qpn,
            state: QpState::Reset as u32,
            qp_type: IBV_QPT_RC,
            mutex: libc::PTHREAD_MUTEX_INITIALIZER,
            cond: libc::PTHREAD_COND_INITIALIZER,
            events_completed: 0,
        },
        qp: Mutex::new(qp),
        sq_sig_all: a.sq_sig_all != 0,
        max_inline: granted.max_inline_data,
    }))
    .cast()
}

fn mtu_from(v: u32) -> Option<Mtu> {
    Some(match v {
        1 => Mtu::Mtu256,
        2 => Mtu::Mtu512,
        3 => Mtu::Mtu1024,
        4 => Mtu::Mtu2048,
        5 => Mtu::Mtu4096,
        _ => return None,
    })
}

/// The pmd attributes for a verbs `ibv_modify_qp` call, or what was wrong.
pub(crate) fn qp_attr_from(a: &ibv_qp_attr, mask: c_int) -> Result<QpAttr, (String, c_int)> {
    use crate::abi::qp_mask as m;
    let unsupported = m::QKEY | m::ALT_PATH | m::PATH_MIG_STATE | m::CAP | (1 << 25);
    if mask & unsupported != 0 {
        return Err((
            format!(
                "attribute mask {:#x}: Q_Key, alternate path, migration state, capability and rate-limit changes are not supported on RC QPs here",
                mask & unsupported
            ),
            libc::EOPNOTSUPP,
        ));
    }
    let has = |bit: c_int| mask & bit != 0;
    let mut out = QpAttr::default();
    if has(m::ACCESS_FLAGS) {
        out.access = Some(Access::from_bits_truncate(a.qp_access_flags));
    }
    if has(m::PKEY_INDEX) {
        out.pkey_index = Some(a.pkey_index);
    }
    if has(m::PORT) {
        out.port = Some(a.port_num);
    }
    if has(m::AV) {
        if a.ah_attr.is_global == 0 {
            return Err((
                "the address vector has no GRH (is_global 0): RoCE needs the peer's GID (ibv_rc_pingpong: -g)".into(),
                libc::EINVAL,
            ));
        }
        out.av = Some(AddressVector {
            dgid: Gid(a.ah_attr.grh.dgid.raw),
            sgid_index: a.ah_attr.grh.sgid_index,
            hop_limit: a.ah_attr.grh.hop_limit,
            traffic_class: a.ah_attr.grh.traffic_class,
        });
    }
    if has(m::PATH_MTU) {
        out.path_mtu = Some(
            mtu_from(a.path_mtu)
                .ok_or_else(|| (format!("path MTU code {}", a.path_mtu), libc::EINVAL))?,
        );
    }
    if has(m::DEST_QPN) {
        out.dest_qpn = Some(a.dest_qp_num);
    }
    if has(m::RQ_PSN) {
        out.rq_psn = Some(a.rq_psn);
    }
    if has(m::MAX_DEST_RD_ATOMIC) {
        out.max_dest_rd_atomic = Some(a.max_dest_rd_atomic);
    }
    if has(m::MIN_RNR_TIMER) {
        out.min_rnr_timer = Some(a.min_rnr_timer);
    }
    if has(m::SQ_PSN) {
        out.sq_psn = Some(a.sq_psn);
    }
    if has(m::TIMEOUT) {
        out.timeout = Some(a.timeout);
    }
    if has(m::RETRY_CNT) {
        out.retry_cnt = Some(a.retry_cnt);
    }
    if has(m::RNR_RETRY) {
        out.rnr_retry = Some(a.rnr_retry);
    }
    if has(m::MAX_QP_RD_ATOMIC) {
        out.max_rd_atomic = Some(a.max_rd_atomic);
    }
    Ok(out)
}

/// `ibv_modify_qp`. Errors are logged with what the transition table found wrong; the
/// return value is the errno (`EINVAL`, or `EOPNOTSUPP` for attributes RC here lacks).
///
/// # Safety
/// `qp` is a live QP; `attr` is valid for reads.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    // SAFETY: forwarded from the caller.
    if unsafe { ours(qp) }.is_none() {
        return match system::ibv_modify_qp() {
            // SAFETY: not ours.
            Some(f) => unsafe { f(qp, attr, mask) },
            None => libc::ENOSYS,
        };
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &*attr };
    // SAFETY: ours (checked above).
    if unsafe { ours(qp) }.is_some_and(|c| crate::resilient::device_of(c).is_some()) {
        // SAFETY: a QP of a resilient device.
        return unsafe { crate::resilient::modify_qp(qp, a, mask) };
    }
    // SAFETY: ours.
    let rs = unsafe { &mut *qp.cast::<RsQp>() };
    let mut guard = lock(&rs.qp);
    let to = if mask & qp_mask::STATE != 0 {
        match u8::try_from(a.qp_state).ok().and_then(QpState::from_ibv) {
            Some(s) => s,
            None => {
                return invalid(
                    "ibv_modify_qp",
                    &format!(
                        "QP state {} (SQD, SQE and unknown states are not supported)",
                        a.qp_state
                    ),
                    libc::EINVAL,
                )
            }
        }
    } else {
        guard.state()
    };
    let pattr = match qp_attr_from(a, mask) {
        Ok(p) => p,
        Err((why, errno)) => return invalid("ibv_modify_qp", &why, errno),
    };
    match guard.modify(to, &pattr) {
        Ok(()) => {
            rs.ibv.state = guard.state() as u32;
            0
        }
        Err(e) => invalid("ibv_modify_qp", &e.to_string(), libc::EINVAL),
    }
}

/// `ibv_query_qp`: state, capabilities and the attributes the QP was brought up with.
///
/// # Safety
/// `qp` is a live QP; `attr` and `init` are valid for writes.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    // SAFETY: forwarded from the caller.
    if unsafe { ours(qp) }.is_none() {
        return match system::ibv_query_qp() {
            // SAFETY: not ours.
            Some(f) => unsafe { f(qp, attr, mask, init) },
            None => libc::ENOSYS,
        };
    }
    // SAFETY: ours (checked above).
    if unsafe { ours(qp) }.is_some_and(|c| crate::resilient::device_of(c).is_some()) {
        // SAFETY: a QP of a resilient device; the caller's buffers.
        return unsafe { crate::resilient::query_qp(qp, attr, init) };
    }
    // SAFETY: ours.
    let rs = unsafe { &*qp.cast::<RsQp>() };
    let guard = lock(&rs.qp);
    let saved = guard.saved_attributes();
    // SAFETY: the caller's buffers.
    unsafe {
        write_query(
            attr,
            init,
            &rs.ibv,
            guard.state(),
            &guard.caps(),
            &saved,
            rs.sq_sig_all,
        )
    }
}

/// Writes `ibv_query_qp`'s answer for a QP: its state and capabilities, the attributes it
/// was brought up with, and (when `init` is not null) what it was created with. Returns 0.
///
/// # Safety
/// `attr` is valid for writes; `init` is null or valid for writes.
pub(crate) unsafe fn write_query(
    attr: *mut ibv_qp_attr,
    init: *mut ibv_qp_init_attr,
    ibv: &ibv_qp,
    state: QpState,
    caps: &QpCaps,
    saved: &pmd::control::SavedAttrs,
    sig_all: bool,
) -> c_int {
    let cap = ibv_qp_cap {
        max_send_wr: caps.max_send_wr,
        max_recv_wr: caps.max_recv_wr,
        max_send_sge: caps.max_send_sge,
        max_recv_sge: caps.max_recv_sge,
        max_inline_data: caps.max_inline_data,
    };
    let mut out = ibv_qp_attr {
        qp_state: state as u32,
        cur_qp_state: state as u32,
        cap,
        ..ibv_qp_attr::default()
    };
    fill_qp_attr(&mut out, saved);
    // SAFETY: the caller's buffers.
    unsafe {
        attr.write(out);
        if !init.is_null() {
            (*init).qp_context = ibv.qp_context;
            (*init).send_cq = ibv.send_cq;
            (*init).recv_cq = ibv.recv_cq;
            (*init).srq = ibv.srq;
            (*init).cap = cap;
            (*init).qp_type = IBV_QPT_RC;
            (*init).sq_sig_all = c_int::from(sig_all);
        }
    }
    0
}

/// Fills `out` with the attributes a QP was brought up with.
pub(crate) fn fill_qp_attr(out: &mut ibv_qp_attr, saved: &pmd::control::SavedAttrs) {
    for a in [&saved.init, &saved.rtr, &saved.rts].into_iter().flatten() {
        if let Some(v) = a.access {
            out.qp_access_flags = v.bits();
        }
        if let Some(v) = a.pkey_index {
            out.pkey_index = v;
        }
        if let Some(v) = a.port {
            out.port_num = v;
            out.ah_attr.port_num = v;
        }
        if let Some(v) = a.av {
            out.ah_attr.is_global = 1;
            out.ah_attr.grh.dgid = ibv_gid { raw: v.dgid.0 };
            out.ah_attr.grh.sgid_index = v.sgid_index;
            out.ah_attr.grh.hop_limit = v.hop_limit;
            out.ah_attr.grh.traffic_class = v.traffic_class;
        }
        if let Some(v) = a.path_mtu {
            out.path_mtu = v as u32;
        }
        if let Some(v) = a.dest_qpn {
            out.dest_qp_num = v;
        }
        if let Some(v) = a.rq_psn {
            out.rq_psn = v;
        }
        if let Some(v) = a.sq_psn {
            out.sq_psn = v;
        }
        if let Some(v) = a.max_dest_rd_atomic {
            out.max_dest_rd_atomic = v;
        }
        if let Some(v) = a.max_rd_atomic {
            out.max_rd_atomic = v;
        }
        if let Some(v) = a.min_rnr_timer {
            out.min_rnr_timer = v;
        }
        if let Some(v) = a.timeout {
            out.timeout = v;
        }
        if let Some(v) = a.retry_cnt {
            out.retry_cnt = v;
        }
        if let Some(v) = a.rnr_retry {
            out.rnr_retry = v;
        }
    }
}

/// `ibv_destroy_qp`.
///
/// # Safety
/// `qp` is a live QP, destroyed once.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    // SAFETY: forwarded from the caller.
    let Some(c) = (unsafe { ours(qp) }) else {
        return match system::ibv_destroy_qp() {
            // SAFETY: not ours.
            Some(f) => unsafe { f(qp) },
            None => libc::ENOSYS,
        };
    };
    if crate::resilient::device_of(c).is_some() {
        // SAFETY: a QP of a resilient device, destroyed once.
        return unsafe { crate::resilient::destroy_qp(qp) };
    }
    // SAFETY: ours, freed once.
    let rs = unsafe { Box::from_raw(qp.cast::<RsQp>()) };
    let connected = matches!(lock(&rs.qp).state(), QpState::Rtr | QpState::Rts);
    if connected {
        // SAFETY: ours (checked above); the context outlives its QPs.
        if let Some(c) = unsafe { ours(qp) } {
            linger(c);
        }
    }
    drop(rs);
    0
}

/// Rounds a manual-progress device is driven, at most, before a connected QP goes.
const LINGER_ROUNDS: usize = 64;
/// How long a connected QP stays after `ibv_destroy_qp` on an auto-progress device.
const LINGER: std::time::Duration = std::time::Duration::from_millis(5);

/// Gives the device the chance to send what a connected QP still owes its peer before the
/// QP goes: the softnic defers an ACK by one round (hoping to piggyback it on a reply), and a
/// program that destroys its QP right after its last receive completed (ibv_rc_pingpong
/// does) would otherwise leave the peer's last message unacknowledged, and the peer would
/// fail it with a retry error. Hardware sends that ACK within microseconds; this is the
/// softnic's equivalent. A manual-progress device is driven until idle; an auto-progress
/// one, whose engine thread does it, is given [`LINGER`].
fn linger(c: &RsContext) {
    if c.pmd.progress_model() == pmd::provider::ProgressModel::Manual {
        let _driving = c.activity.driving();
        for _ in 0..LINGER_ROUNDS {
            if !c.pmd.step().busy {
                break;
            }
        }
    } else {
        std::thread::sleep(LINGER);
    }
}

/// Largest inline payload the shim gathers from several entries (the softnic's limit).
pub(crate) const INLINE_GATHER: usize = 512;

/// Converts one send work request; `Err` is the errno.
///
/// # Safety
/// `wr` is a valid work request whose gather list holds `num_sge` entries.
#[inline(always)]
pub(crate) unsafe fn send_wr<'a>(
    wr: &ibv_send_wr,
    sig_all: bool,
    max_inline: u32,
    inline_buf: &'a mut [u8; INLINE_GATHER],
) -> Result<SendWr<'a>, (String, c_int)> {
    let n = usize::try_from(wr.num_sge)
        .map_err(|_| (format!("num_sge {}", wr.num_sge), libc::EINVAL))?;
    let sges: &[ibv_sge] = if n == 0 || wr.sg_list.is_null() {
        &[]
    } else {
        // SAFETY: the caller's list of `num_sge` entries.
        unsafe { std::slice::from_raw_parts(wr.sg_list, n) }
    };
    let remote = Remote {
        addr: wr.wr.remote_addr,
        rkey: wr.wr.rdma_rkey_or_compare_add as u32,
    };
    let imm = u32::from_be(wr.imm_data);
    let op = match wr.opcode {
        IBV_WR_RDMA_WRITE => SendOp::Write { remote },
        IBV_WR_RDMA_WRITE_WITH_IMM => SendOp::WriteImm { remote, imm },
        IBV_WR_SEND => SendOp::Send,
        IBV_WR_SEND_WITH_IMM => SendOp::SendImm { imm },
        IBV_WR_RDMA_READ => SendOp::Read { remote },
        IBV_WR_ATOMIC_CMP_AND_SWP => SendOp::CompareSwap {
            remote: Remote {
                addr: wr.wr.remote_addr,
                rkey: wr.wr.atomic_rkey,
            },
            compare: wr.wr.rdma_rkey_or_compare_add,
            swap: wr.wr.swap,
        },
        IBV_WR_ATOMIC_FETCH_AND_ADD => SendOp::FetchAdd {
            remote: Remote {
                addr: wr.wr.remote_addr,
                rkey: wr.wr.atomic_rkey,
            },
            add: wr.wr.rdma_rkey_or_compare_add,
        },
        other => {
            return Err((
                format!("work request opcode {other} (send with invalidate, TSO, bind MW, local invalidate, atomic write and driver opcodes are not supported)"),
                libc::EOPNOTSUPP,
            ))
        }
    };
    let payload = if wr.send_flags & IBV_SEND_INLINE != 0 {
        let total: usize = sges.iter().map(|s| s.length as usize).sum();
        if total > max_inline as usize {
            return Err((
                format!("{total} inline bytes, the QP takes {max_inline}"),
                libc::EINVAL,
            ));
        }
        if sges.len() == 1 {
            // SAFETY: the caller's buffer of `length` bytes, read during this post only.
            Payload::Inline(unsafe {
                std::slice::from_raw_parts(sges[0].addr as *const u8, sges[0].length as usize)
            })
        } else {
            let mut at = 0;
            for s in sges {
                let len = s.length as usize;
                // SAFETY: the caller's buffer of `length` bytes; `total` fits the buffer.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        s.addr as *const u8,
                        inline_buf.as_mut_ptr().add(at),
                        len,
                    )
                };
                at += len;
            }
            Payload::Inline(&inline_buf[..at])
        }
    } else {
        let mut list = SgList::new();
        for s in sges {
            list.push(Sge::new(s.addr, s.length, s.lkey));
        }
        Payload::Gather(list)
    };
    Ok(SendWr {
        wr_id: wr.wr_id,
        op,
        payload,
        flags: send_flags(wr, sig_all),
    })
}

/// The request's signaled, fenced and solicited flags (signaled also by the QP's
/// `sq_sig_all`): one load from [`SEND_FLAGS`], for the fast path and the general one alike.
#[inline(always)]
fn send_flags(wr: &ibv_send_wr, sig_all: bool) -> SendFlags {
    SEND_FLAGS[(wr.send_flags & 7) as usize | usize::from(sig_all) << 3]
}

/// The pmd's send flags for each `ibv_send_flags & 7` (FENCE 1, SIGNALED 2, SOLICITED 4),
/// plus 8 for a QP whose every request is signaled (`sq_sig_all`): the flag conversion as
/// one load instead of three tests.
const SEND_FLAGS: [SendFlags; 16] = {
    let mut table = [SendFlags::NONE; 16];
    let mut i = 0;
    while i < 16 {
        let mut bits = 0;
        if i & 8 != 0 || i & IBV_SEND_SIGNALED as usize != 0 {
            bits |= SendFlags::SIGNALED.bits();
        }
        if i & IBV_SEND_FENCE as usize != 0 {
            bits |= SendFlags::FENCE.bits();
        }
        if i & IBV_SEND_SOLICITED as usize != 0 {
            bits |= SendFlags::SOLICITED.bits();
        }
        table[i] = SendFlags::from_bits_truncate(bits);
        i += 1;
    }
    table
};

/// A send queue the ops table's `post_send` posts on: a plain device's pmd QP, or a
/// resilient QP's state. A trait rather than closures so that its fast path inlines into
/// each opcode's arm of [`post_fast_parts`] (four call sites of a closure are past the
/// inliner's limit, and an outlined call cost more than the second match it saved).
pub(crate) trait SendPoster {
    /// The pmd's fast path alone for a one-entry WRITE, WRITE with immediate, SEND or SEND
    /// with immediate given by its parts; `false` (nothing written) sends the request to
    /// [`SendPoster::post_general`].
    fn post_fast(&mut self, wr: &impl FastRequest, op: SendOp, sge: &Sge) -> bool;
    /// The pmd's general post, which makes every check and gives every error.
    fn post_general(&mut self, wr: &SendWr<'_>) -> Result<(), pmd::PostError>;
    /// Publishes what was written with one doorbell.
    fn ring_doorbell(&mut self);
}

impl SendPoster for pmd::Qp {
    #[inline(always)]
    fn post_fast(&mut self, wr: &impl FastRequest, op: SendOp, sge: &Sge) -> bool {
        self.post_send_fast_parts(wr, op, sge).is_some()
    }
    #[inline]
    fn post_general(&mut self, wr: &SendWr<'_>) -> Result<(), pmd::PostError> {
        self.post_send(wr).map(|_| ())
    }
    #[inline]
    fn ring_doorbell(&mut self) {
        pmd::Qp::ring_doorbell(self)
    }
}

/// An `ibv_send_wr` as the pmd's fast path reads its id and flags: through the reference,
/// when the WQE is written, so neither is loaded and carried (spilled) across the room and
/// key checks before it.
struct VerbsRequest<'a> {
    wr: &'a ibv_send_wr,
    sig_all: bool,
}

impl FastRequest for VerbsRequest<'_> {
    #[inline(always)]
    fn wr_id(&self) -> u64 {
        self.wr.wr_id
    }
    #[inline(always)]
    fn flags(&self) -> SendFlags {
        send_flags(self.wr, self.sig_all)
    }
}

/// Offers `wr` to `qp`'s fast path by its parts when it is of the pmd's fast-path kind: a
/// WRITE, WRITE with immediate, SEND or SEND with immediate of one gather entry, not inline.
/// Whether it was posted; `false` (nothing posted) sends it to the general post, which checks
/// everything and gives every error. Each opcode's arm passes a constant [`SendOp`] variant,
/// so the pmd's own match on the variant folds away where the fast path inlines.
///
/// # Safety
/// `wr` is a valid work request whose gather list holds `num_sge` entries.
#[inline(always)]
unsafe fn post_fast_parts(qp: &mut impl SendPoster, wr: &ibv_send_wr, sig_all: bool) -> bool {
    // One entry and not inline: zero for exactly that (`num_sge ^ 1` is 0 for 1 entry alone).
    let not_one_plain_entry = (wr.num_sge as u32 ^ 1) | (wr.send_flags & IBV_SEND_INLINE);
    if wr.sg_list.is_null() {
        return false;
    }
    // SAFETY: the caller's list of one entry (when `not_one_plain_entry` is 0), an
    // `ibv_sge`, which is laid out as the pmd's `Sge` (checked below): read in place by the
    // fast path's checks, not copied first.
    let sge = unsafe { &*wr.sg_list.cast::<Sge>() };
    let request = VerbsRequest { wr, sig_all };
    // The remote address and immediate are read in the arms that use them.
    let remote = || Remote {
        addr: wr.wr.remote_addr,
        rkey: wr.wr.rdma_rkey_or_compare_add as u32,
    };
    let imm = || u32::from_be(wr.imm_data);
    // A WRITE of one plain entry in one test (its opcode is 0), as the pmd's own fast path
    // tests for a WRITE first: no jump table, which a match on the opcode compiles to.
    if not_one_plain_entry | wr.opcode == 0 {
        return qp.post_fast(&request, SendOp::Write { remote: remote() }, sge);
    }
    if not_one_plain_entry != 0 {
        return false;
    }
    match wr.opcode {
        IBV_WR_RDMA_WRITE_WITH_IMM => {
            let op = SendOp::WriteImm {
                remote: remote(),
                imm: imm(),
            };
            qp.post_fast(&request, op, sge)
        }
        IBV_WR_SEND => qp.post_fast(&request, SendOp::Send, sge),
        IBV_WR_SEND_WITH_IMM => qp.post_fast(&request, SendOp::SendImm { imm: imm() }, sge),
        _ => false,
    }
}

/// `ibv_sge` is the pmd's `Sge` in memory, and a WRITE's opcode is 0, which
/// [`post_fast_parts`] relies on.
const _: () = {
    assert!(IBV_WR_RDMA_WRITE == 0);
    assert!(std::mem::size_of::<ibv_sge>() == std::mem::size_of::<Sge>());
    assert!(std::mem::align_of::<ibv_sge>() == std::mem::align_of::<Sge>());
    assert!(std::mem::offset_of!(ibv_sge, addr) == std::mem::offset_of!(Sge, addr));
    assert!(std::mem::offset_of!(ibv_sge, length) == std::mem::offset_of!(Sge, len));
    assert!(std::mem::offset_of!(ibv_sge, lkey) == std::mem::offset_of!(Sge, lkey));
};

/// Posts `wr` whole through `qp`'s general post, which makes every check: a request the
/// fast path did not take. Out of line, with the inline-data buffer it needs, so
/// the fast path's loop neither carries nor zeroes that buffer. The errno of a refusal, its
/// reason logged.
///
/// # Safety
/// `wr` is a valid work request whose gather list holds `num_sge` entries.
#[inline(never)]
unsafe fn post_general(
    qp: &mut impl SendPoster,
    wr: &ibv_send_wr,
    sig_all: bool,
    max_inline: u32,
) -> Result<(), c_int> {
    let mut inline_buf = [0u8; INLINE_GATHER];
    // SAFETY: the caller's request.
    match unsafe { send_wr(wr, sig_all, max_inline, &mut inline_buf) } {
        Ok(swr) => qp.post_general(&swr).map_err(|e| {
            let errno = post_errno(&e);
            if errno == libc::ENOMEM {
                crate::util::set_errno(errno);
                errno
            } else {
                invalid("ibv_post_send", &e.to_string(), errno)
            }
        }),
        Err((why, errno)) => Err(invalid("ibv_post_send", &why, errno)),
    }
}

pub(crate) fn post_errno(e: &pmd::PostError) -> c_int {
    match e {
        pmd::PostError::QueueFull { .. } => libc::ENOMEM,
        _ => libc::EINVAL,
    }
}

/// Posts the list at `wr` in order on `qp`, then rings its doorbell once for all of it
/// (whatever was posted before a refusal goes out); on a refused request `bad_wr` names it
/// and its errno is returned. A request of the pmd's fast-path kind is first offered to the
/// fast path by its parts, without building a pmd request; the rest, and one the fast path
/// declines, go whole through the general post, which checks everything.
///
/// # Safety
/// `wr` is a valid list; `bad_wr` is null or writable.
#[inline(always)]
pub(crate) unsafe fn post_send_list(
    qp: &mut impl SendPoster,
    mut wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
    sig_all: bool,
    max_inline: u32,
) -> c_int {
    let mut result = 0;
    while !wr.is_null() {
        // SAFETY: the caller's list.
        let w = unsafe { &*wr };
        // SAFETY: the caller's request.
        if !unsafe { post_fast_parts(qp, w, sig_all) } {
            // SAFETY: the caller's request.
            if let Err(errno) = unsafe { post_general(qp, w, sig_all, max_inline) } {
                if !bad_wr.is_null() {
                    // SAFETY: the caller's slot.
                    unsafe { bad_wr.write(wr) };
                }
                result = errno;
                break;
            }
        }
        wr = w.next;
    }
    qp.ring_doorbell();
    result
}

/// The ops table's `post_send`: posts the list in order, rings the doorbell once for all
/// of it; on a refused request, `bad_wr` names it, those before it are posted.
///
/// # Safety
/// `qp` is one of our live QPs; `wr` is a valid list; `bad_wr` is null or writable.
pub unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: the inline wrapper passes one of our QPs.
    let rs = unsafe { &*qp.cast::<RsQp>() };
    let mut guard = lock(&rs.qp);
    // SAFETY: forwarded from the caller.
    unsafe { post_send_list(&mut *guard, wr, bad_wr, rs.sq_sig_all, rs.max_inline) }
}

/// Posts the receive list at `wr` in order through `post` (for a QP's receive queue or an
/// SRQ); on a refused request `bad_wr` names it, its errno is returned, and the log line names
/// `verb`.
///
/// # Safety
/// `wr` is a valid list; `bad_wr` is null or writable.
#[inline(always)]
pub(crate) unsafe fn post_recv_list(
    mut wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
    verb: &'static str,
    mut post: impl FnMut(&RecvWr) -> Result<(), pmd::PostError>,
) -> c_int {
    while !wr.is_null() {
        // SAFETY: the caller's list.
        let w = unsafe { &*wr };
        let sges: &[ibv_sge] = if w.num_sge <= 0 || w.sg_list.is_null() {
            &[]
        } else {
            // SAFETY: the caller's list of `num_sge` entries.
            unsafe { std::slice::from_raw_parts(w.sg_list, w.num_sge as usize) }
        };
        let list: SgList = sges
            .iter()
            .map(|s| Sge::new(s.addr, s.length, s.lkey))
            .collect();
        if let Err(e) = post(&RecvWr::new(w.wr_id, &list)) {
            let errno = post_errno(&e);
            if errno != libc::ENOMEM {
                invalid(verb, &e.to_string(), errno);
            }
            if !bad_wr.is_null() {
                // SAFETY: the caller's slot.
                unsafe { bad_wr.write(wr) };
            }
            return errno;
        }
        wr = w.next;
    }
    0
}

/// The ops table's `post_recv`.
///
/// # Safety
/// `qp` is one of our live QPs; `wr` is a valid list; `bad_wr` is null or writable.
pub unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: the inline wrapper passes one of our QPs.
    let rs = unsafe { &*qp.cast::<RsQp>() };
    let mut guard = lock(&rs.qp);
    // SAFETY: forwarded from the caller.
    unsafe { post_recv_list(wr, bad_wr, "ibv_post_recv", |rwr| guard.post_recv(rwr)) }
}

/// The opcode numbering the pmd shares with verbs, checked once here.
const _: () = assert!(WcOpcode::RecvRdmaWithImm as u32 == 129);

/// Defines an exported verb that takes one of our objects first and that our devices do not
/// offer: on ours it logs once, sets errno and returns `$fail`; on others it passes through.
macro_rules! refused_on_ours {
    ($(
        $(#[$doc:meta])*
        $name:ident @ $version:literal [$check:ident]
        ($first:ident : $fty:ty $(, $arg:ident : $ty:ty)*) -> $ret:ty,
        $why:literal, $errno:expr, $fail:expr;
    )*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        /// The arguments are what libibverbs' function of this name takes.
        #[no_mangle]
        pub unsafe extern "C" fn $name($first: $fty $(, $arg: $ty)*) -> $ret {
            static REAL: crate::real::RealFn = crate::real::RealFn::new(
                match std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                    Ok(s) => s,
                    Err(_) => panic!("symbol name"),
                },
                match std::ffi::CStr::from_bytes_with_nul(concat!($version, "\0").as_bytes()) {
                    Ok(s) => s,
                    Err(_) => panic!("symbol version"),
                },
            );
            // SAFETY: forwarded from the caller: the first argument is a live verbs object
            // (or context) that starts with its context pointer.
            if unsafe { $check($first) }.is_none() {
                return match REAL.address() {
                    // SAFETY: the system's definition of this function, same prototype.
                    Some(p) => unsafe {
                        std::mem::transmute::<*mut c_void, unsafe extern "C" fn($fty $(, $ty)*) -> $ret>(p)(
                            $first $(, $arg)*
                        )
                    },
                    None => {
                        crate::util::set_errno(libc::ENOSYS);
                        $fail
                    }
                };
            }
            refuse(stringify!($name), $why, $errno);
            $fail
        }
    )*};
}

refused_on_ours! {
    /// `ibv_create_ah_from_wc`: refused on our devices (`EOPNOTSUPP`: UD).
    ibv_create_ah_from_wc @ "IBVERBS_1.1" [ours]
        (pd: *mut ibv_pd, wc: *mut ibv_wc, grh: *mut c_void, port: u8) -> *mut c_void,
        "address handles (UD)", libc::EOPNOTSUPP, std::ptr::null_mut();
    /// `ibv_init_ah_from_wc`: refused on our devices (`EOPNOTSUPP`: UD).
    ibv_init_ah_from_wc @ "IBVERBS_1.1" [our_context]
        (ctx: *mut ibv_context, port: u8, wc: *mut ibv_wc, grh: *mut c_void, ah: *mut ibv_ah_attr) -> c_int,
        "address handles (UD)", libc::EOPNOTSUPP, -1;
    /// `ibv_query_ece`: refused on our devices (`EOPNOTSUPP`).
    ibv_query_ece @ "IBVERBS_1.10" [ours] (qp: *mut ibv_qp, ece: *mut c_void) -> c_int,
        "enhanced connection establishment", libc::EOPNOTSUPP, libc::EOPNOTSUPP;
    /// `ibv_set_ece`: refused on our devices (`EOPNOTSUPP`).
    ibv_set_ece @ "IBVERBS_1.10" [ours] (qp: *mut ibv_qp, ece: *mut c_void) -> c_int,
        "enhanced connection establishment", libc::EOPNOTSUPP, libc::EOPNOTSUPP;
    /// `_ibv_query_gid_table`: refused on our devices (`EOPNOTSUPP`; `ibv_query_gid_ex`
    /// answers per index).
    _ibv_query_gid_table @ "IBVERBS_1.11" [our_context]
        (ctx: *mut ibv_context, entries: *mut ibv_gid_entry, max: usize, flags: u32, size: usize) -> isize,
        "the GID table in one call", libc::EOPNOTSUPP, -(libc::EOPNOTSUPP as isize);
    /// `ibv_get_pkey_index`: refused on our devices (`EOPNOTSUPP`; the one P_Key is index 0).
    ibv_get_pkey_index @ "IBVERBS_1.5" [our_context] (ctx: *mut ibv_context, port: u8, pkey: u16) -> c_int,
        "P_Key lookup (index 0 holds the only one)", libc::EOPNOTSUPP, -1;
    /// `ibv_resolve_eth_l2_from_gid`: refused on our devices (`EOPNOTSUPP`: the softnic
    /// resolves its peers itself).
    ibv_resolve_eth_l2_from_gid @ "IBVERBS_1.1" [our_context]
        (ctx: *mut ibv_context, attr: *mut ibv_ah_attr, mac: *mut u8, vid: *mut u16) -> c_int,
        "L2 resolution", libc::EOPNOTSUPP, -1;
    /// `ibv_reg_dmabuf_mr`: refused on our devices (`EOPNOTSUPP`).
    ibv_reg_dmabuf_mr @ "IBVERBS_1.12" [ours]
        (pd: *mut ibv_pd, offset: u64, len: usize, iova: u64, fd: c_int, access: c_int) -> *mut ibv_mr,
        "dma-buf MRs", libc::EOPNOTSUPP, std::ptr::null_mut();
    /// `ibv_rereg_mr`: refused on our devices (`EOPNOTSUPP`; deregister and register again).
    ibv_rereg_mr @ "IBVERBS_1.1" [ours]
        (mr: *mut ibv_mr, flags: c_int, pd: *mut ibv_pd, addr: *mut c_void, len: usize, access: c_int) -> c_int,
        "re-registration", libc::EOPNOTSUPP, libc::EOPNOTSUPP;
    /// `ibv_resize_cq`: refused on our devices (`EOPNOTSUPP`).
    ibv_resize_cq @ "IBVERBS_1.1" [ours] (cq: *mut ibv_cq, cqe: c_int) -> c_int,
        "CQ resizing", libc::EOPNOTSUPP, libc::EOPNOTSUPP;
    /// `ibv_qp_to_qp_ex`: our QPs have no extended post API; `NULL` with `EOPNOTSUPP`, what a
    /// provider without it answers.
    ibv_qp_to_qp_ex @ "IBVERBS_1.6" [ours] (qp: *mut ibv_qp) -> *mut c_void,
        "the ibv_wr_* post API (use ibv_post_send)", libc::EOPNOTSUPP, std::ptr::null_mut();
    /// `ibv_create_ah`: refused on our devices (`EOPNOTSUPP`: address handles serve UD, which
    /// they do not run).
    ibv_create_ah @ "IBVERBS_1.1" [ours] (pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut c_void,
        "address handles (UD)", libc::EOPNOTSUPP, std::ptr::null_mut();
    /// `ibv_attach_mcast`: refused on our devices (`EOPNOTSUPP`: multicast is UD).
    ibv_attach_mcast @ "IBVERBS_1.1" [ours] (qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int,
        "multicast (UD)", libc::EOPNOTSUPP, libc::EOPNOTSUPP;
    /// `ibv_detach_mcast`: refused on our devices (`EOPNOTSUPP`).
    ibv_detach_mcast @ "IBVERBS_1.1" [ours] (qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int,
        "multicast (UD)", libc::EOPNOTSUPP, libc::EOPNOTSUPP;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A successful send's completion on QP 0x1234 with id 77, as the fields verbs.h names.
    fn plain_send_wc(opcode: u32) -> [u64; 13] {
        [77, 0, u64::from(opcode), 0, 0, 0, 0x1234, 0, 0, 0, 0, 0, 0]
    }

    /// An `ibv_wc`'s fields in declaration order, to compare whole completions.
    fn fields(wc: &ibv_wc) -> [u64; 13] {
        [
            wc.wr_id,
            wc.status.into(),
            wc.opcode.into(),
            wc.vendor_err.into(),
            wc.byte_len.into(),
            wc.imm_data.into(),
            wc.qp_num.into(),
            wc.src_qp.into(),
            wc.wc_flags.into(),
            wc.pkey_index.into(),
            wc.slid.into(),
            wc.sl.into(),
            wc.dlid_path_bits.into(),
        ]
    }

    /// The poll loop's `ibv_wc` for each fast-path kind, entry by entry: verbs.h's
    /// `IBV_WC_RDMA_WRITE` (1) for both WRITEs, `IBV_WC_SEND` (0) for both SENDs, status
    /// `IBV_WC_SUCCESS` (0), the QP, and nothing else; the same as the general conversion.
    /// Fails if the word table swaps two kinds or the words miss a field.
    #[test]
    fn the_fast_completion_table_writes_each_kind_as_verbs_h_numbers_it() {
        use pmd::CompletionLayout;
        let hot = WorkCompletion {
            qp_num: 0x1234,
            ..WorkCompletion::EMPTY
        };
        let tail = <ibv_wc as CompletionLayout>::send_template(&hot);
        for (kind, opcode) in [
            (FastSend::Write, 1),
            (FastSend::WriteImm, 1),
            (FastSend::Send, 0),
            (FastSend::SendImm, 0),
        ] {
            let wc = <ibv_wc as CompletionLayout>::send(&tail, 77, kind);
            assert_eq!(fields(&wc), plain_send_wc(opcode), "{kind:?}");
            let general = to_ibv_wc(&WorkCompletion {
                wr_id: 77,
                opcode: kind.opcode(),
                ..hot
            });
            assert_eq!(fields(&general), plain_send_wc(opcode), "{kind:?}");
        }
    }

    /// The general conversion gives every status verbs.h's number (`enum ibv_wc_status`,
    /// written out here, not taken from the pmd's enum) and every opcode its
    /// `enum ibv_wc_opcode` number; an immediate sets `IBV_WC_WITH_IMM` and travels in
    /// network order.
    #[test]
    fn the_general_conversion_numbers_statuses_and_opcodes_as_verbs_h() {
        use pmd::WcStatus as S;
        let statuses = [
            (S::Success, 0),
            (S::LocLenErr, 1),
            (S::LocQpOpErr, 2),
            (S::LocEecOpErr, 3),
            (S::LocProtErr, 4),
            (S::WrFlushErr, 5),
            (S::MwBindErr, 6),
            (S::BadRespErr, 7),
            (S::LocAccessErr, 8),
            (S::RemInvReqErr, 9),
            (S::RemAccessErr, 10),
            (S::RemOpErr, 11),
            (S::RetryExcErr, 12),
            (S::RnrRetryExcErr, 13),
            (S::LocRddViolErr, 14),
            (S::RemInvRdReqErr, 15),
            (S::RemAbortErr, 16),
            (S::InvEecnErr, 17),
            (S::InvEecStateErr, 18),
            (S::FatalErr, 19),
            (S::RespTimeoutErr, 20),
            (S::GeneralErr, 21),
            (S::TmErr, 22),
            (S::TmRndvIncomplete, 23),
        ];
        for (status, number) in statuses {
            let wc = to_ibv_wc(&WorkCompletion {
                status,
                vendor_err: 0x81,
                ..WorkCompletion::EMPTY
            });
            assert_eq!(wc.status, number, "{status:?}");
            assert_eq!(wc.vendor_err, 0x81, "{status:?}");
        }
        let opcodes = [
            (WcOpcode::Send, 0),
            (WcOpcode::RdmaWrite, 1),
            (WcOpcode::RdmaRead, 2),
            (WcOpcode::CompSwap, 3),
            (WcOpcode::FetchAdd, 4),
            (WcOpcode::Recv, 128),
            (WcOpcode::RecvRdmaWithImm, 129),
        ];
        for (opcode, number) in opcodes {
            let wc = to_ibv_wc(&WorkCompletion {
                opcode,
                ..WorkCompletion::EMPTY
            });
            assert_eq!(wc.opcode, number, "{opcode:?}");
            assert_eq!(wc.wc_flags, 0, "{opcode:?}");
        }
        let wc = to_ibv_wc(&WorkCompletion {
            opcode: WcOpcode::Recv,
            byte_len: 64,
            imm: Some(0x0102_0304),
            ..WorkCompletion::EMPTY
        });
        assert_eq!(wc.wc_flags, IBV_WC_WITH_IMM);
        assert_eq!(wc.imm_data.to_ne_bytes(), [1, 2, 3, 4]);
        assert_eq!(wc.byte_len, 64);
    }

    /// The flag table gives each verbs flag its pmd flag, for every combination of the
    /// three flags (and the inline bit, which the table ignores), with and without
    /// `sq_sig_all`: the rule written out flag by flag.
    #[test]
    fn the_flag_table_gives_each_verbs_flag_its_pmd_flag() {
        // SAFETY: ibv_send_wr is plain data; all zeroes is a valid value.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        for bits in 0..16 {
            for sig_all in [false, true] {
                wr.send_flags = bits;
                let mut expected = SendFlags::NONE;
                if sig_all || bits & IBV_SEND_SIGNALED != 0 {
                    expected = expected | SendFlags::SIGNALED;
                }
                if bits & IBV_SEND_FENCE != 0 {
                    expected = expected | SendFlags::FENCE;
                }
                if bits & IBV_SEND_SOLICITED != 0 {
                    expected = expected | SendFlags::SOLICITED;
                }
                assert_eq!(
                    send_flags(&wr, sig_all),
                    expected,
                    "send_flags {bits:#x}, sq_sig_all {sig_all}"
                );
            }
        }
    }
}
