//! Shared receive queues end to end: two QPs of one device take their receives from one SRQ,
//! in the order the driver linked its slots; an empty SRQ answers RNR; an armed limit raises
//! its event once; a QP's error leaves the SRQ's receives to the others.

mod common;

use std::time::Duration;

use common::{next, next_within, pattern};
use hw_defs::mlx5::CqeOpcode;
use hw_defs::verbs::WcStatus;
use softnic::harness::{
    connect, Buffer, ConnectOptions, Data, HarnessQp, HarnessSrq, Node, Op, QpSizes, Sim,
};
use softnic::{AsyncEvent, DeviceError, QpAttrs, QpState};

struct Setup {
    sim: Sim,
    a: Node,
    a2: HarnessQp,
    b: Node,
    srq: HarnessSrq,
    b1: HarnessQp,
    b2: HarnessQp,
}

/// `a` talks to `b` over two QP pairs; `b`'s two QPs share an SRQ of `wqes` slots.
fn setup(wqes: u32, limit: u32) -> Setup {
    let sizes = QpSizes::default();
    let sim = Sim::new(7, Duration::from_micros(2));
    let a = Node::new(sim.device("a", 1).unwrap(), 1 << 20, sizes).unwrap();
    let b = Node::new(sim.device("b", 2).unwrap(), 1 << 20, sizes).unwrap();
    let a2 = HarnessQp::new(&a.dev, a.pd, &a.scq, &a.rcq, sizes).unwrap();
    let srq = HarnessSrq::new(&b.dev, b.pd, wqes, 2, limit).unwrap();
    let b1 = HarnessQp::new_on_srq(&b.dev, b.pd, &b.scq, &b.rcq, sizes, &srq).unwrap();
    let b2 = HarnessQp::new_on_srq(&b.dev, b.pd, &b.scq, &b.rcq, sizes, &srq).unwrap();
    let o = ConnectOptions::default();
    connect(&a.dev, &a.qp, &b.dev, &b1, &o).unwrap();
    connect(&a.dev, &a2, &b.dev, &b2, &o).unwrap();
    Setup {
        sim,
        a,
        a2,
        b,
        srq,
        b1,
        b2,
    }
}

fn send(qp: &mut HarnessQp, buf: &Buffer, offset: usize, len: u32) {
    let sge = [buf.sge(offset, len)];
    qp.post(Op::Send, Data::Sges(&sge), true);
    qp.ring();
}

#[test]
fn two_qps_take_receives_from_one_srq_and_each_completion_names_its_qp() {
    let mut s = setup(8, 0);
    let data = pattern(3000, 3);
    s.a.buf.write(0, &data);
    // Slots 0, 1 and 2, each with its own buffer in b's memory.
    for i in 0..3 {
        let slot = s.srq.post(&[s.b.buf.sge(i * 4096, 4096)]).unwrap();
        assert_eq!(slot, i as u16);
    }
    send(&mut s.a.qp, &s.a.buf, 0, 1000);
    let devs = [&s.a.dev, &s.b.dev];
    let r = next(&s.sim, &devs, &mut s.b.rcq);
    assert_eq!(
        (r.opcode, r.status, r.qpn, r.wqe_counter, r.byte_count),
        (CqeOpcode::RespSend, WcStatus::Success, s.b1.qpn, 0, 1000)
    );
    send(&mut s.a2, &s.a.buf, 0, 3000);
    let r = next(&s.sim, &devs, &mut s.b.rcq);
    assert_eq!(
        (r.qpn, r.wqe_counter, r.byte_count),
        (s.b2.qpn, 1, 3000),
        "a 3-packet SEND into the SRQ's next slot"
    );
    let mut got = vec![0u8; 3000];
    s.b.buf.read(4096, &mut got);
    assert_eq!(got, data);
    send(&mut s.a.qp, &s.a.buf, 0, 8);
    let r = next(&s.sim, &devs, &mut s.b.rcq);
    assert_eq!((r.qpn, r.wqe_counter), (s.b1.qpn, 2));
    assert_eq!(s.b.dev.query_srq(s.srq.id).unwrap(), (0, 0));
}

#[test]
fn slots_freed_out_of_order_are_taken_along_the_links() {
    let mut s = setup(4, 0);
    let devs = [&s.a.dev, &s.b.dev];
    for _ in 0..3 {
        s.srq.post(&[s.b.buf.sge(0, 64)]).unwrap();
    }
    assert!(
        s.srq.post(&[s.b.buf.sge(0, 64)]).is_none(),
        "one slot stays free"
    );
    for _ in 0..3 {
        send(&mut s.a.qp, &s.a.buf, 0, 8);
        next(&s.sim, &devs, &mut s.b.rcq);
    }
    // Free 2, 0 then 1: the list runs 3 -> 2 -> 0 -> 1, and the device takes them in that
    // order.
    s.srq.free(2);
    s.srq.free(0);
    s.srq.free(1);
    for _ in 0..3 {
        s.srq.post(&[s.b.buf.sge(0, 64)]).unwrap();
    }
    let mut order = Vec::new();
    for _ in 0..3 {
        send(&mut s.a2, &s.a.buf, 0, 8);
        order.push(next(&s.sim, &devs, &mut s.b.rcq).wqe_counter);
    }
    assert_eq!(order, vec![3, 2, 0]);
}

#[test]
fn an_empty_srq_answers_rnr_until_a_receive_is_posted() {
    let mut s = setup(8, 0);
    let devs = [&s.a.dev, &s.b.dev];
    send(&mut s.a.qp, &s.a.buf, 0, 100);
    assert!(next_within(&s.sim, &devs, &mut s.b.rcq, Duration::from_millis(5)).is_none());
    assert!(s.b.dev.counters().naks_sent.rnr > 0);
    s.srq.post(&[s.b.buf.sge(0, 128)]).unwrap();
    let r = next(&s.sim, &devs, &mut s.b.rcq);
    assert_eq!(
        (r.status, r.qpn, r.byte_count),
        (WcStatus::Success, s.b1.qpn, 100)
    );
    let c = next(&s.sim, &devs, &mut s.a.scq);
    assert_eq!(c.status, WcStatus::Success);
}

#[test]
fn an_armed_limit_raises_its_event_once_and_can_be_rearmed() {
    let mut s = setup(8, 2);
    let devs = [&s.a.dev, &s.b.dev];
    let limit_events = |b: &Node| {
        std::iter::from_fn(|| b.dev.events().poll())
            .filter(|e| matches!(e, AsyncEvent::SrqLimitReached { .. }))
            .count()
    };
    for _ in 0..4 {
        s.srq.post(&[s.b.buf.sge(0, 64)]).unwrap();
    }
    assert_eq!(s.b.dev.query_srq(s.srq.id).unwrap(), (2, 4));
    for _ in 0..2 {
        send(&mut s.a.qp, &s.a.buf, 0, 8);
        next(&s.sim, &devs, &mut s.b.rcq);
    }
    assert_eq!(limit_events(&s.b), 0, "2 left is not below the limit of 2");
    send(&mut s.a.qp, &s.a.buf, 0, 8);
    next(&s.sim, &devs, &mut s.b.rcq);
    assert_eq!(limit_events(&s.b), 1);
    assert_eq!(s.b.dev.query_srq(s.srq.id).unwrap(), (0, 1), "disarmed");
    s.b.dev.modify_srq(s.srq.id, 3).unwrap();
    send(&mut s.a2, &s.a.buf, 0, 8);
    next(&s.sim, &devs, &mut s.b.rcq);
    assert_eq!(limit_events(&s.b), 1, "re-armed, fires again");
    assert!(matches!(
        s.b.dev.modify_srq(s.srq.id, 8),
        Err(DeviceError::InvalidConfig(_))
    ));
}

#[test]
fn a_qp_in_error_leaves_the_srq_receives_to_the_others() {
    let mut s = setup(8, 0);
    let devs = [&s.a.dev, &s.b.dev];
    for _ in 0..2 {
        s.srq.post(&[s.b.buf.sge(0, 64)]).unwrap();
    }
    s.b.dev
        .modify_qp(s.b1.qpn, QpState::Err, &QpAttrs::default())
        .unwrap();
    assert!(
        next_within(&s.sim, &devs, &mut s.b.rcq, Duration::from_millis(1)).is_none(),
        "no flush of the SRQ's receives"
    );
    send(&mut s.a2, &s.a.buf, 0, 8);
    let r = next(&s.sim, &devs, &mut s.b.rcq);
    assert_eq!(
        (r.status, r.qpn, r.wqe_counter),
        (WcStatus::Success, s.b2.qpn, 0)
    );
    assert_eq!(s.b.dev.query_srq(s.srq.id).unwrap(), (0, 1));
}

#[test]
fn an_srq_in_use_cannot_be_destroyed_and_a_bad_one_is_refused() {
    let s = setup(8, 0);
    assert!(matches!(
        s.b.dev.destroy_srq(s.srq.id),
        Err(DeviceError::Busy("SRQ"))
    ));
    s.b.dev.destroy_qp(s.b1.qpn).unwrap();
    s.b.dev.destroy_qp(s.b2.qpn).unwrap();
    s.b.dev.destroy_srq(s.srq.id).unwrap();
    assert!(matches!(
        s.b.dev.query_srq(s.srq.id),
        Err(DeviceError::UnknownSrq(_))
    ));
    assert!(matches!(
        HarnessSrq::new(&s.b.dev, s.b.pd, 6, 1, 0),
        Err(DeviceError::InvalidConfig(_))
    ));
    assert!(matches!(
        HarnessSrq::new(&s.b.dev, s.b.pd, 8, 1, 8),
        Err(DeviceError::InvalidConfig(_))
    ));
}
