//! The verbs shim's data path in process, for the datapath benchmark: a QP pair on two plain
//! shim devices over an in-memory fabric, brought up through the exported verbs functions,
//! posted and polled through the `ibv_context_ops` function pointers as `verbs.h`'s static
//! inline `ibv_post_send` and `ibv_poll_cq` call them, and the same QP's pmd rings for the
//! direct baseline.

use std::ffi::{c_int, c_void, CStr};
use std::sync::{Arc, Mutex};

use railshift_verbs::abi::*;
use railshift_verbs::device::{
    ibv_get_device_list, ibv_get_device_name, ibv_open_device, ibv_query_gid, our_context,
    RsContext,
};
use railshift_verbs::lock::Lock;
use railshift_verbs::objects::{
    connect_rc, ibv_alloc_pd, ibv_create_cq, ibv_create_qp, ibv_reg_mr, pmd_cq, pmd_qp,
};

/// One side's verbs objects (leaked: they live as long as the benchmark process).
pub struct Side {
    /// The context the ops table hangs off.
    pub ctx: *mut ibv_context,
    /// The QP.
    pub qp: *mut ibv_qp,
    /// Its CQ (send and receive).
    pub cq: *mut ibv_cq,
    /// The registered buffer's MR.
    pub mr: *mut ibv_mr,
}

/// Sets the shim's device list to two ports of `fabric`; must run before any other verbs
/// call of this process (the shim reads its configuration once).
pub fn configure(fabric: &str) {
    std::env::set_var(
        "RAILSHIFT_DEVICES",
        format!("rsbench0=fabric:{fabric}/0,rsbench1=fabric:{fabric}/1"),
    );
    std::env::remove_var("RAILSHIFT_PROGRESS");
}

/// Opens device `name` and makes a PD, an MR of `buf_len` bytes, a CQ of `cqe` and an RC QP.
fn side(name: &str, buf_len: usize, cqe: c_int, max_send_wr: u32) -> Side {
    let mut n = 0;
    // SAFETY: a valid count slot; the list stays allocated for the process's life.
    let list = unsafe { ibv_get_device_list(&mut n) };
    assert!(!list.is_null(), "no verbs device");
    let dev = (0..n as usize)
        // SAFETY: the list holds `n` devices.
        .map(|i| unsafe { *list.add(i) })
        .find(|&d| {
            // SAFETY: a device of the list.
            let dn = unsafe { CStr::from_ptr(ibv_get_device_name(d)) };
            dn.to_str() == Ok(name)
        })
        .unwrap_or_else(|| panic!("no verbs device {name}"));
    // SAFETY: a device of the list; every object below is made on what the line before
    // returned, checked non-null.
    unsafe {
        let ctx = ibv_open_device(dev);
        assert!(!ctx.is_null(), "open {name}");
        let pd = ibv_alloc_pd(ctx);
        assert!(!pd.is_null(), "alloc_pd");
        let buf = Box::leak(vec![0u8; buf_len].into_boxed_slice());
        let mr = ibv_reg_mr(pd, buf.as_mut_ptr().cast::<c_void>(), buf_len, 1 | 2 | 4);
        assert!(!mr.is_null(), "reg_mr");
        let cq = ibv_create_cq(ctx, cqe, std::ptr::null_mut(), std::ptr::null_mut(), 0);
        assert!(!cq.is_null(), "create_cq");
        let mut init = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: cq,
            recv_cq: cq,
            srq: std::ptr::null_mut(),
            cap: ibv_qp_cap {
                max_send_wr,
                max_recv_wr: 16,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: IBV_QPT_RC,
            sq_sig_all: 0,
        };
        let qp = ibv_create_qp(pd, &mut init);
        assert!(!qp.is_null(), "create_qp");
        Side { ctx, qp, cq, mr }
    }
}

/// Moves `qp` to RTS towards the peer's `gid` and `qpn`.
fn connect(qp: *mut ibv_qp, gid: ibv_gid, qpn: u32) {
    // SAFETY: our live QP.
    let done = unsafe { connect_rc(qp, gid, qpn) };
    done.unwrap_or_else(|(state, rc)| panic!("modify to state {state} failed: {rc}"));
}

/// A connected QP pair on the shim's two devices (configure first).
pub struct Pair {
    /// The measured side.
    pub a: Side,
    /// The peer.
    pub b: Side,
}

impl Pair {
    /// Opens both devices and connects a QP on each to the other.
    pub fn new(buf_len: usize, cqe: c_int, max_send_wr: u32) -> Pair {
        let a = side("rsbench0", buf_len, cqe, max_send_wr);
        let b = side("rsbench1", buf_len, cqe, max_send_wr);
        let gid = |s: &Side| {
            let mut g = ibv_gid::default();
            // SAFETY: an open context of ours and a valid slot.
            let rc = unsafe { ibv_query_gid(s.ctx, 1, 0, &mut g) };
            assert_eq!(rc, 0, "query_gid");
            g
        };
        // SAFETY: our live QPs.
        let (qa, qb) = unsafe { ((*a.qp).qp_num, (*b.qp).qp_num) };
        connect(a.qp, gid(&b), qb);
        connect(b.qp, gid(&a), qa);
        Pair { a, b }
    }

    fn contexts(&self) -> [&RsContext; 2] {
        [self.a.ctx, self.b.ctx].map(|c| {
            // SAFETY: our open contexts, alive as long as `self`.
            let ours = unsafe { our_context(c) };
            ours.expect("a shim context")
        })
    }

    /// Both devices, for running them between timed regions.
    pub fn devices(&self) -> Vec<Arc<pmd::Context>> {
        self.contexts().iter().map(|c| c.pmd.clone()).collect()
    }

    /// The measured QP's pmd QP and CQ: the same rings, used directly.
    pub fn direct(&self) -> (&Mutex<pmd::Qp>, &Lock<pmd::Cq>) {
        // SAFETY: our live QP and CQ on a plain device, alive as long as `self`.
        unsafe { (pmd_qp(self.a.qp), pmd_cq(self.a.cq)) }
    }

    /// Keeps the devices' helper threads out for as long as the guards live: the benchmark
    /// runs the devices itself, between timed regions.
    pub fn hold_helpers(&self) -> Vec<railshift_verbs::device::Driving<'_>> {
        self.contexts()
            .into_iter()
            .map(|c| c.activity.driving())
            .collect()
    }
}

/// `ibv_post_send` as `verbs.h`'s static inline writes it: through the QP's context's ops.
///
/// # Safety
/// `qp` is a live QP; `wr` a valid list.
#[inline(always)]
pub unsafe fn post_send(qp: *mut ibv_qp, wr: *mut ibv_send_wr) -> c_int {
    let mut bad = std::ptr::null_mut();
    // SAFETY: the caller's live QP, whose context's ops table is set.
    unsafe {
        let f = (*(*qp).context).ops.post_send.unwrap_unchecked();
        f(qp, wr, &mut bad)
    }
}

/// `ibv_poll_cq` as `verbs.h`'s static inline writes it.
///
/// # Safety
/// `cq` is a live CQ; `wc` holds `n` entries.
#[inline(always)]
pub unsafe fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: the caller's live CQ, whose context's ops table is set.
    unsafe {
        let f = (*(*cq).context).ops.poll_cq.unwrap_unchecked();
        f(cq, n, wc)
    }
}
