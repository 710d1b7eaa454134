//! Which QPs a round visits: those with something to do, not every QP of the device, so that
//! idle QPs beside a busy one cost it nothing (an 8-byte latency beside 1,000 idle QPs is
//! that of one QP alone). And what must still be visited without a doorbell.

mod common;

use std::time::Duration;

use common::next;
use hw_defs::verbs::WcStatus;
use softnic::harness::{connect, ConnectOptions, Data, HarnessQp, Op, QpSizes};
use softnic::{QpAttrs, QpState};

#[test]
fn rounds_visit_the_busy_qp_and_leave_connected_idle_qps_alone() {
    let (sim, mut a, b) = common::pair_with(
        3,
        Duration::from_micros(2),
        QpSizes::default(),
        ConnectOptions::default(),
    );
    // 200 idle QP pairs beside the busy one, connected (RTS), never posted to.
    let mut idle = Vec::new();
    for _ in 0..200 {
        let qa = HarnessQp::new(&a.dev, a.pd, &a.scq, &a.rcq, QpSizes::default()).unwrap();
        let qb = HarnessQp::new(&b.dev, b.pd, &b.scq, &b.rcq, QpSizes::default()).unwrap();
        connect(&a.dev, &qa, &b.dev, &qb, &ConnectOptions::default()).unwrap();
        idle.push((qa, qb));
    }
    for _ in 0..50 {
        assert_eq!(
            common::write_and_wait(&sim, &mut a, &b, 64),
            WcStatus::Success
        );
    }
    let busy = a.dev.qp_counters(a.qp.qpn).unwrap().round_visits;
    assert!(busy >= 50, "the busy QP was visited {busy} times");
    for (qa, qb) in &idle {
        for (dev, qpn) in [(&a.dev, qa.qpn), (&b.dev, qb.qpn)] {
            let visits = dev.qp_counters(qpn).unwrap().round_visits;
            // Once after its last modify (RTS), then never again.
            assert!(
                visits <= 1,
                "idle QP {qpn:#x} was visited {visits} times beside {busy} for the busy one"
            );
        }
    }
}

#[test]
fn receives_posted_to_a_qp_in_error_are_flushed_without_a_doorbell() {
    let (sim, mut a, b) = common::pair_with(
        4,
        Duration::from_micros(2),
        QpSizes::default(),
        ConnectOptions::default(),
    );
    a.dev
        .modify_qp(a.qp.qpn, QpState::Err, &QpAttrs::default())
        .unwrap();
    // Let rounds run with nothing to flush, then post: only the receive doorbell record
    // moves, as on a ConnectX, and the device still flushes it.
    sim.run_until(&[&a.dev, &b.dev], Duration::from_millis(5), || false);
    a.qp.post_recv(&[a.buf.sge(0, 64)]);
    let c = next(&sim, &[&a.dev, &b.dev], &mut a.rcq);
    assert_eq!(c.status, WcStatus::WrFlushErr);
}

#[test]
fn work_rung_in_rtr_goes_out_when_the_qp_reaches_rts() {
    let (sim, mut a, b) = common::pair_with(
        5,
        Duration::from_micros(2),
        QpSizes::default(),
        ConnectOptions::default(),
    );
    // A second pair, brought up by hand so that a WRITE is rung while the QP is in RTR.
    let mut qa = HarnessQp::new(&a.dev, a.pd, &a.scq, &a.rcq, QpSizes::default()).unwrap();
    let qb = HarnessQp::new(&b.dev, b.pd, &b.scq, &b.rcq, QpSizes::default()).unwrap();
    let o = ConnectOptions::default();
    softnic::harness::bring_up(&b.dev, qb.qpn, a.dev.addr(), qa.qpn, &o).unwrap();
    a.dev
        .modify_qp(qa.qpn, QpState::Init, &o.init_attrs())
        .unwrap();
    a.dev
        .modify_qp(qa.qpn, QpState::Rtr, &o.rtr_attrs(b.dev.addr(), qb.qpn))
        .unwrap();
    let sge = [a.buf.sge(0, 64)];
    qa.post(
        Op::Write {
            raddr: b.buf.addr(0),
            rkey: b.buf.keys.rkey,
        },
        Data::Sges(&sge),
        true,
    );
    qa.ring();
    sim.run_until(&[&a.dev, &b.dev], Duration::from_millis(5), || false);
    assert!(a.scq.poll().is_none(), "a WRITE went out of a QP in RTR");
    a.dev
        .modify_qp(qa.qpn, QpState::Rts, &o.rts_attrs())
        .unwrap();
    assert_eq!(
        next(&sim, &[&a.dev, &b.dev], &mut a.scq).status,
        WcStatus::Success
    );
}
