//! Shared receive queues as a program sees them through the C ABI: the exported `ibv_*`
//! functions and the ops table that `verbs.h`'s static inline `ibv_post_srq_recv` and
//! `ibv_post_recv` call through, with their return values and `errno`. In process, on two
//! plain softnic devices over loopback (`rs0` and `rs1`, 127.0.120.1 and .2), so no system
//! libibverbs is needed: every call lands on the shim's own definitions.
//!
//! The stock `ibv_srq_pingpong` runs (`tests/stock.rs`) show the good path; these show the
//! limit event and the refusals, which no stock tool exercises, and, on the same QP pair, what
//! a poll with no room for a completion does.

use std::ffi::{c_int, c_void, CStr};
use std::ptr::null_mut;
use std::sync::Once;
use std::time::{Duration, Instant};

use railshift_verbs::abi::*;
use railshift_verbs::device::{
    ibv_async_event, ibv_get_async_event, ibv_get_device_list, ibv_get_device_name,
    ibv_open_device, ibv_query_gid,
};
use railshift_verbs::objects::{
    connect_rc, ibv_alloc_pd, ibv_create_cq, ibv_create_qp, ibv_destroy_qp, ibv_reg_mr, pmd_cq,
};
use railshift_verbs::srq::{ibv_create_srq, ibv_destroy_srq, ibv_modify_srq, ibv_query_srq};

/// `IBV_EVENT_SRQ_LIMIT_REACHED`.
const SRQ_LIMIT_REACHED: c_int = 15;
/// Bytes registered per device.
const BUF: usize = 1 << 16;

/// Names the two devices; the shim reads its configuration once, at the first verb.
fn configure() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        std::env::set_var(
            "RAILSHIFT_DEVICES",
            "rs0=soft:lo@127.0.120.1,rs1=soft:lo@127.0.120.2",
        );
        std::env::remove_var("RAILSHIFT_PROGRESS");
    });
}

fn set_errno(v: c_int) {
    // SAFETY: this thread's errno slot.
    unsafe { *libc::__errno_location() = v };
}

fn errno() -> c_int {
    // SAFETY: this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// One open device with a PD, a registered buffer and a CQ.
#[derive(Clone, Copy)]
struct Device {
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    mr: *mut ibv_mr,
    cq: *mut ibv_cq,
}

fn open(name: &str) -> Device {
    configure();
    let mut n = 0;
    // SAFETY: a valid count slot; the list is never freed (the test process ends).
    let list = unsafe { ibv_get_device_list(&mut n) };
    assert!(!list.is_null(), "no verbs device");
    let dev = (0..n as usize)
        // SAFETY: the list holds `n` devices.
        .map(|i| unsafe { *list.add(i) })
        // SAFETY: a device of the list.
        .find(|&d| unsafe { CStr::from_ptr(ibv_get_device_name(d)) }.to_str() == Ok(name))
        .unwrap_or_else(|| panic!("no verbs device {name}"));
    // SAFETY: a device of the list; each object is made on the one before, checked non-null.
    unsafe {
        let ctx = ibv_open_device(dev);
        assert!(!ctx.is_null(), "open {name}");
        let pd = ibv_alloc_pd(ctx);
        assert!(!pd.is_null(), "alloc_pd");
        let buf = Box::leak(vec![0u8; BUF].into_boxed_slice());
        let mr = ibv_reg_mr(pd, buf.as_mut_ptr().cast::<c_void>(), BUF, 1 | 2 | 4);
        assert!(!mr.is_null(), "reg_mr");
        let cq = ibv_create_cq(ctx, 64, null_mut(), null_mut(), 0);
        assert!(!cq.is_null(), "create_cq");
        Device { ctx, pd, mr, cq }
    }
}

impl Device {
    /// An SGE of `len` bytes at `offset` of the registered buffer.
    fn sge(&self, offset: usize, len: u32) -> ibv_sge {
        // SAFETY: our live MR.
        let mr = unsafe { &*self.mr };
        ibv_sge {
            addr: mr.addr as u64 + offset as u64,
            length: len,
            lkey: mr.lkey,
        }
    }

    /// `ibv_create_srq`; null with `errno` on a refusal.
    fn create_srq(&self, max_wr: u32, max_sge: u32, srq_limit: u32) -> (*mut ibv_srq, c_int) {
        let mut attr = ibv_srq_init_attr {
            srq_context: null_mut(),
            attr: ibv_srq_attr {
                max_wr,
                max_sge,
                srq_limit,
            },
        };
        set_errno(0);
        // SAFETY: our live PD and valid attributes.
        let srq = unsafe { ibv_create_srq(self.pd, &mut attr) };
        (srq.cast(), errno())
    }

    /// An RC QP whose receives come from `srq` (or its own queue when null).
    fn create_qp(&self, srq: *mut ibv_srq) -> (*mut ibv_qp, c_int) {
        let mut init = ibv_qp_init_attr {
            qp_context: null_mut(),
            send_cq: self.cq,
            recv_cq: self.cq,
            srq: srq.cast(),
            cap: ibv_qp_cap {
                max_send_wr: 16,
                max_recv_wr: 16,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: IBV_QPT_RC,
            sq_sig_all: 0,
        };
        set_errno(0);
        // SAFETY: our live PD and valid attributes.
        let qp = unsafe { ibv_create_qp(self.pd, &mut init) };
        (qp, errno())
    }

    fn gid(&self) -> ibv_gid {
        let mut g = ibv_gid::default();
        // SAFETY: our open context and a valid slot.
        let rc = unsafe { ibv_query_gid(self.ctx, 1, 0, &mut g) };
        assert_eq!(rc, 0, "query_gid");
        g
    }

    /// Polls this device's CQ (which runs the device when it is empty) until `n` completions
    /// came, all successful; 10 s at most.
    fn completions(&self, n: usize) -> Vec<ibv_wc> {
        let mut out = Vec::new();
        // SAFETY: ibv_wc is plain data; all zeroes is a valid value.
        let mut wcs: [ibv_wc; 16] = unsafe { std::mem::zeroed() };
        let deadline = Instant::now() + Duration::from_secs(10);
        while out.len() < n {
            // SAFETY: our live CQ, whose context's ops table is set; 16 slots.
            let k = unsafe {
                let poll = (*(*self.cq).context).ops.poll_cq.expect("poll_cq");
                poll(self.cq, 16, wcs.as_mut_ptr())
            };
            assert!(k >= 0, "poll_cq failed: {k}");
            out.extend_from_slice(&wcs[..k as usize]);
            assert!(
                Instant::now() < deadline,
                "{} of {n} completions in 10 s",
                out.len()
            );
        }
        assert!(
            out.iter().all(|w| w.status == 0),
            "a completion failed: status {:?}",
            out.iter().map(|w| w.status).collect::<Vec<_>>()
        );
        out
    }
}

/// `ibv_post_srq_recv` as `verbs.h`'s static inline writes it; returns its result and the
/// `bad_wr` it set.
fn post_srq_recv(srq: *mut ibv_srq, wr: *mut ibv_recv_wr) -> (c_int, *mut ibv_recv_wr) {
    let mut bad = null_mut();
    // SAFETY: our live SRQ, whose context's ops table is set; the caller's valid list.
    let rc = unsafe {
        let post = (*(*srq).context).ops.post_srq_recv.expect("post_srq_recv");
        post(srq, wr, &mut bad)
    };
    (rc, bad)
}

/// `ibv_post_recv` as the static inline writes it.
fn post_recv(qp: *mut ibv_qp, wr: *mut ibv_recv_wr) -> (c_int, *mut ibv_recv_wr) {
    let mut bad = null_mut();
    // SAFETY: our live QP, whose context's ops table is set; the caller's valid list.
    let rc = unsafe {
        let post = (*(*qp).context).ops.post_recv.expect("post_recv");
        post(qp, wr, &mut bad)
    };
    (rc, bad)
}

/// `count` receives of one entry each, linked into a list (the SGEs live in `sges`).
fn recv_list(sges: &mut [ibv_sge]) -> Vec<ibv_recv_wr> {
    let mut wrs: Vec<ibv_recv_wr> = sges
        .iter_mut()
        .enumerate()
        .map(|(i, s)| ibv_recv_wr {
            wr_id: i as u64,
            next: null_mut(),
            sg_list: s,
            num_sge: 1,
        })
        .collect();
    for i in 1..wrs.len() {
        let next: *mut ibv_recv_wr = &mut wrs[i];
        wrs[i - 1].next = next;
    }
    wrs
}

fn query_srq(srq: *mut ibv_srq) -> ibv_srq_attr {
    let mut attr = ibv_srq_attr::default();
    // SAFETY: our live SRQ and a valid slot.
    assert_eq!(unsafe { ibv_query_srq(srq, &mut attr) }, 0, "query_srq");
    attr
}

fn modify_srq(srq: *mut ibv_srq, limit: u32, mask: c_int) -> c_int {
    let mut attr = ibv_srq_attr {
        srq_limit: limit,
        ..ibv_srq_attr::default()
    };
    // SAFETY: our live SRQ and valid attributes.
    unsafe { ibv_modify_srq(srq, &mut attr, mask) }
}

/// Moves `qp` to RTS towards the peer's `gid` and `qpn`.
fn connect(qp: *mut ibv_qp, gid: ibv_gid, qpn: u32) {
    // SAFETY: our live QP.
    let done = unsafe { connect_rc(qp, gid, qpn) };
    done.unwrap_or_else(|(state, rc)| panic!("modify_qp to state {state}: {rc}"));
}

#[test]
fn srq_bad_input_gets_the_errno_a_provider_gives() {
    let d = open("rs1");
    // Sizes out of range: null and EINVAL.
    for (max_wr, max_sge, limit, what) in [
        (0, 1, 0, "no receives"),
        (32768, 1, 0, "more receives than the device holds"),
        (8, 17, 0, "more entries than the device holds"),
        (8, 1, 9, "a limit above max_wr"),
    ] {
        let (srq, e) = d.create_srq(max_wr, max_sge, limit);
        assert!(srq.is_null(), "ibv_create_srq with {what} made an SRQ");
        assert_eq!(e, libc::EINVAL, "ibv_create_srq with {what}: errno");
    }
    let (srq, _) = d.create_srq(8, 1, 0);
    assert!(!srq.is_null(), "ibv_create_srq");
    let granted = query_srq(srq);
    assert!(granted.max_wr >= 8, "{} receives granted", granted.max_wr);

    // ibv_modify_srq returns the errno.
    assert_eq!(modify_srq(srq, 0, srq_mask::MAX_WR), libc::EINVAL, "resize");
    assert_eq!(
        modify_srq(srq, granted.max_wr + 1, srq_mask::LIMIT),
        libc::EINVAL,
        "a limit above max_wr"
    );
    assert_eq!(modify_srq(srq, 1, 4), libc::EINVAL, "an unknown mask bit");
    assert_eq!(query_srq(srq).srq_limit, 0, "a refused limit armed the SRQ");

    // A receive with more entries than max_sge, then one with a key no MR has: EINVAL, and
    // bad_wr names it.
    let mut two = [d.sge(0, 8), d.sge(8, 8)];
    let mut wr = ibv_recv_wr {
        wr_id: 1,
        next: null_mut(),
        sg_list: two.as_mut_ptr(),
        num_sge: 2,
    };
    let (rc, bad) = post_srq_recv(srq, &mut wr);
    assert_eq!((rc, bad), (libc::EINVAL, &mut wr as *mut _), "two entries");
    let mut foreign = d.sge(0, 8);
    foreign.lkey ^= 0x00ff_0000;
    wr.sg_list = &mut foreign;
    wr.num_sge = 1;
    let (rc, bad) = post_srq_recv(srq, &mut wr);
    assert_eq!(
        (rc, bad),
        (libc::EINVAL, &mut wr as *mut _),
        "an unknown lkey"
    );

    // One receive more than the SRQ holds, as one list: those before it are posted, the one
    // that does not fit is refused with ENOMEM and named.
    let n = granted.max_wr as usize + 1;
    let mut sges: Vec<ibv_sge> = (0..n).map(|i| d.sge(i * 16, 16)).collect();
    let mut list = recv_list(&mut sges);
    let (rc, bad) = post_srq_recv(srq, list.as_mut_ptr());
    assert_eq!(rc, libc::ENOMEM, "an overfull list");
    assert_eq!(
        bad,
        &mut list[n - 1] as *mut _,
        "bad_wr of an overfull list"
    );

    // A QP on the SRQ has no receive queue of its own.
    let (qp, _) = d.create_qp(srq);
    assert!(!qp.is_null(), "ibv_create_qp on the SRQ");
    let mut one = d.sge(0, 8);
    let mut rwr = ibv_recv_wr {
        wr_id: 7,
        next: null_mut(),
        sg_list: &mut one,
        num_sge: 1,
    };
    let (rc, bad) = post_recv(qp, &mut rwr);
    assert_eq!((rc, bad), (libc::EINVAL, &mut rwr as *mut _), "post_recv");

    // An SRQ of another PD.
    // SAFETY: our open context.
    let other_pd = unsafe { ibv_alloc_pd(d.ctx) };
    assert!(!other_pd.is_null());
    let other = Device { pd: other_pd, ..d };
    let (qp2, e) = other.create_qp(srq);
    assert!(
        qp2.is_null(),
        "ibv_create_qp with another PD's SRQ made a QP"
    );
    assert_eq!(
        e,
        libc::EINVAL,
        "ibv_create_qp with another PD's SRQ: errno"
    );

    // The SRQ outlives none of its QPs.
    // SAFETY: our live SRQ and QP, each destroyed once below.
    unsafe {
        assert_eq!(ibv_destroy_srq(srq), libc::EBUSY, "destroy with a QP on it");
        assert_eq!(ibv_destroy_qp(qp), 0);
        assert_eq!(ibv_destroy_srq(srq), 0);
    }
}

#[test]
fn an_srq_falling_below_its_limit_raises_srq_limit_reached() {
    let (tx, rx) = (open("rs0"), open("rs1"));
    let (srq, _) = rx.create_srq(16, 1, 0);
    assert!(!srq.is_null(), "ibv_create_srq");
    let mut sges: Vec<ibv_sge> = (0..8).map(|i| rx.sge(i * 64, 64)).collect();
    let mut list = recv_list(&mut sges);
    assert_eq!(
        post_srq_recv(srq, list.as_mut_ptr()).0,
        0,
        "post 8 receives"
    );
    assert_eq!(modify_srq(srq, 4, srq_mask::LIMIT), 0, "arm the limit at 4");
    assert_eq!(query_srq(srq).srq_limit, 4);

    let (rqp, _) = rx.create_qp(srq);
    let (sqp, _) = tx.create_qp(null_mut());
    assert!(!rqp.is_null() && !sqp.is_null(), "ibv_create_qp");
    // SAFETY: our live QPs.
    let (rqpn, sqpn) = unsafe { ((*rqp).qp_num, (*sqp).qp_num) };
    connect(rqp, tx.gid(), sqpn);
    connect(sqp, rx.gid(), rqpn);

    // Five SENDs consume five receives: three are left, below the limit of 4.
    let mut sge = tx.sge(0, 8);
    let mut wrs: Vec<ibv_send_wr> = (0..5u64)
        .map(|i| ibv_send_wr {
            wr_id: i,
            next: null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
            opcode: IBV_WR_SEND,
            send_flags: IBV_SEND_SIGNALED,
            imm_data: 0,
            wr: ibv_send_wr_wr {
                remote_addr: 0,
                rdma_rkey_or_compare_add: 0,
                swap: 0,
                atomic_rkey: 0,
            },
            _tail: [0; 7],
        })
        .collect();
    for i in 1..wrs.len() {
        let next: *mut ibv_send_wr = &mut wrs[i];
        wrs[i - 1].next = next;
    }
    let mut bad = null_mut();
    // SAFETY: our live QP, whose context's ops table is set; a valid list of 5.
    let rc = unsafe {
        let post = (*(*sqp).context).ops.post_send.expect("post_send");
        post(sqp, wrs.as_mut_ptr(), &mut bad)
    };
    assert_eq!(rc, 0, "post_send");
    // A poll with no room takes nothing and writes nothing: n 0, a negative n and a null array
    // return 0 with the five completions waiting (counted without polling), and the polls
    // after get all five.
    // SAFETY: our live CQ on a plain device, alive until the test ends.
    let tx_cq = unsafe { pmd_cq(tx.cq) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while tx_cq.lock().poller().ready() < 5 {
        tx_cq.lock().context().progress();
        assert!(
            Instant::now() < deadline,
            "the five CQEs not written in 10 s"
        );
    }
    // SAFETY: ibv_wc is plain data; all zeroes is a valid value.
    let mut untouched: [ibv_wc; 1] = unsafe { std::mem::zeroed() };
    untouched[0].wr_id = 99;
    for (n, out, what) in [
        (0, untouched.as_mut_ptr(), "n 0"),
        (-1, untouched.as_mut_ptr(), "n -1"),
        (16, null_mut(), "a null array"),
    ] {
        // SAFETY: our live CQ, whose context's ops table is set; `out` is null or 1 entry.
        let k = unsafe {
            let poll = (*(*tx.cq).context).ops.poll_cq.expect("poll_cq");
            poll(tx.cq, n, out)
        };
        assert_eq!(k, 0, "ibv_poll_cq with {what}");
    }
    assert_eq!(
        untouched[0].wr_id, 99,
        "a poll with no room wrote a completion"
    );
    assert_eq!(
        tx_cq.lock().poller().ready(),
        5,
        "a poll with no room took a CQE"
    );
    // The poller's fast loop writes these: each field as libibverbs defines it.
    let sent = tx.completions(5);
    let fields: Vec<_> = sent
        .iter()
        .map(|w| {
            (
                w.wr_id, w.opcode, w.qp_num, w.byte_len, w.wc_flags, w.imm_data,
            )
        })
        .collect();
    let want: Vec<_> = (0..5u64).map(|i| (i, 0, sqpn, 0, 0, 0)).collect();
    assert_eq!(
        fields, want,
        "(wr_id, opcode, qp_num, byte_len, wc_flags, imm_data)"
    );
    let received = rx.completions(5);
    assert!(received.iter().all(|w| w.qp_num == rqpn && w.opcode == 128));

    // ibv_get_async_event blocks until an event comes, as the real one does: wait for it on
    // another thread, so that a missing event fails the test instead of hanging it.
    let ctx = rx.ctx as usize;
    let (send, events) = std::sync::mpsc::channel();
    std::thread::spawn(move || loop {
        let mut event = ibv_async_event {
            element: 0,
            event_type: -1,
        };
        // SAFETY: our open context and a valid event slot.
        let rc = unsafe {
            ibv_get_async_event(
                ctx as *mut ibv_context,
                (&mut event as *mut ibv_async_event).cast(),
            )
        };
        if send.send((rc, event.event_type, event.element)).is_err() {
            return;
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let got = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let (rc, kind, element) = events
            .recv_timeout(left)
            .expect("no IBV_EVENT_SRQ_LIMIT_REACHED in 10 s");
        assert_eq!(rc, 0, "ibv_get_async_event");
        // Port events (the port coming up) may come first.
        if kind == SRQ_LIMIT_REACHED {
            break element;
        }
    };
    assert_eq!(got, srq as u64, "the event names the SRQ");
    assert_eq!(
        query_srq(srq).srq_limit,
        0,
        "the limit is disarmed once it fired"
    );
}
