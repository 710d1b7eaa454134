//! Error paths: RNR, retry exhaustion, protection faults, length errors, CQ overrun, flushes,
//! and reset. All on the fabric with a virtual clock.

mod common;

use std::time::Duration;

use common::{next, next_within, pair_with, post_write};
use hw_defs::mlx5::{CqeOpcode, Syndrome};
use hw_defs::verbs::WcStatus;
use softnic::harness::{bring_up, ConnectOptions, Data, HarnessCq, HarnessQp, Op, QpSizes};
use softnic::{AsyncEvent, FaultRule, PortState, QpAttrs, QpState};

fn pair() -> (
    softnic::harness::Sim,
    softnic::harness::Node,
    softnic::harness::Node,
) {
    pair_with(
        1,
        Duration::from_micros(2),
        QpSizes::default(),
        ConnectOptions::default(),
    )
}

#[test]
fn a_send_without_a_receive_wqe_is_rnr_nakd_and_recovers_when_one_is_posted() {
    let (sim, mut a, mut b) = pair();
    a.qp.post(Op::Send, Data::Inline(b"late"), true);
    a.qp.ring();
    // Let a few RNR rounds pass (timer code 1 = 10 us), then post the receive.
    assert!(next_within(
        &sim,
        &[&a.dev, &b.dev],
        &mut a.scq,
        Duration::from_millis(1)
    )
    .is_none());
    assert!(b.dev.qp_counters(b.qp.qpn).unwrap().naks_sent.rnr > 0);
    b.qp.post_recv(&[b.buf.sge(0, 64)]);
    assert_eq!(
        next(&sim, &[&a.dev, &b.dev], &mut a.scq).status,
        WcStatus::Success
    );
    assert_eq!(next(&sim, &[&a.dev, &b.dev], &mut b.rcq).byte_count, 4);
    assert!(a.dev.qp_counters(a.qp.qpn).unwrap().rnr_waits > 0);
}

#[test]
fn rnr_retry_exhaustion_reports_rnr_retry_exc_err() {
    let o = ConnectOptions {
        rnr_retry: 2,
        ..Default::default()
    };
    let (sim, mut a, b) = pair_with(1, Duration::from_micros(2), QpSizes::default(), o);
    a.qp.post(Op::Send, Data::Inline(b"never"), true);
    a.qp.ring();
    let c = next(&sim, &[&a.dev, &b.dev], &mut a.scq);
    assert_eq!(
        (c.status, c.syndrome),
        (WcStatus::RnrRetryExcErr, Some(Syndrome::RnrRetryExcErr))
    );
    assert_eq!(a.dev.qp_counters(a.qp.qpn).unwrap().naks_received.rnr, 3);
}

#[test]
fn retry_exhaustion_reports_retry_exc_err_then_flushes_every_other_wqe() {
    let o = ConnectOptions {
        timeout: 10,
        retry_cnt: 3,
        ..Default::default()
    };
    let (sim, mut a, b) = pair_with(1, Duration::from_micros(2), QpSizes::default(), o);
    for r in FaultRule::partition(0, 1, Duration::ZERO, None) {
        sim.fabric.add_rule(r);
    }
    let sge = [a.buf.sge(0, 64)];
    let rkey = b.buf.keys.rkey;
    let first = a.qp.post(
        Op::Write {
            raddr: b.buf.addr(0),
            rkey,
        },
        Data::Sges(&sge),
        false,
    );
    let mut rest = Vec::new();
    for i in 1..5 {
        rest.push(a.qp.post(
            Op::Write {
                raddr: b.buf.addr(i * 64),
                rkey,
            },
            Data::Sges(&sge),
            i % 2 == 0,
        ));
    }
    a.qp.ring();
    let start = sim.clock.now();
    let c = next_within(&sim, &[&a.dev, &b.dev], &mut a.scq, Duration::from_secs(5)).unwrap();
    let took = sim.clock.now() - start;
    assert_eq!(
        (c.status, c.wqe_counter, c.opcode),
        (WcStatus::RetryExcErr, first, CqeOpcode::ReqErr)
    );
    // timeout 10 = 4.19 ms; retry_cnt 3 = four timeouts in all.
    let t = Duration::from_nanos(4096 << 10);
    assert!(took >= t * 4 && took < t * 5, "error after {took:?}");
    for idx in rest {
        let f = next(&sim, &[&a.dev, &b.dev], &mut a.scq);
        assert_eq!((f.status, f.wqe_counter), (WcStatus::WrFlushErr, idx));
    }
    assert_eq!(a.dev.query_qp(a.qp.qpn).unwrap().0, QpState::Err);
    assert_eq!(a.dev.qp_counters(a.qp.qpn).unwrap().timeouts, 4);
    // Posted later, in ERR: flushed too.
    let late = a.qp.post(
        Op::Write {
            raddr: b.buf.addr(0),
            rkey,
        },
        Data::Sges(&sge),
        false,
    );
    a.qp.ring();
    let f = next(&sim, &[&a.dev, &b.dev], &mut a.scq);
    assert_eq!((f.status, f.wqe_counter), (WcStatus::WrFlushErr, late));
}

#[test]
fn retry_cnt_seven_means_seven_retries_not_infinite() {
    let o = ConnectOptions {
        timeout: 8,
        retry_cnt: 7,
        ..Default::default()
    };
    let (sim, mut a, b) = pair_with(1, Duration::from_micros(2), QpSizes::default(), o);
    for r in FaultRule::partition(0, 1, Duration::ZERO, None) {
        sim.fabric.add_rule(r);
    }
    let sge = [a.buf.sge(0, 8)];
    a.qp.post(
        Op::Write {
            raddr: b.buf.addr(0),
            rkey: b.buf.keys.rkey,
        },
        Data::Sges(&sge),
        true,
    );
    a.qp.ring();
    let c = next_within(&sim, &[&a.dev, &b.dev], &mut a.scq, Duration::from_secs(10)).unwrap();
    assert_eq!(c.status, WcStatus::RetryExcErr);
    assert_eq!(a.dev.qp_counters(a.qp.qpn).unwrap().timeouts, 8);
}

#[test]
fn a_write_with_a_bad_rkey_is_nakd_as_remote_access_error_and_errors_both_qps() {
    let (sim, mut a, mut b) = pair();
    b.qp.post_recv(&[b.buf.sge(0, 8)]);
    let sge = [a.buf.sge(0, 8)];
    a.qp.post(
        Op::Write {
            raddr: b.buf.addr(0),
            rkey: b.buf.keys.rkey ^ 0x100,
        },
        Data::Sges(&sge),
        true,
    );
    a.qp.post(
        Op::Write {
            raddr: b.buf.addr(0),
            rkey: b.buf.keys.rkey,
        },
        Data::Sges(&sge),
        true,
    );
    a.qp.ring();
    let c = next(&sim, &[&a.dev, &b.dev], &mut a.scq);
    assert_eq!(c.status, WcStatus::RemAccessErr);
    assert_eq!(
        next(&sim, &[&a.dev, &b.dev], &mut a.scq).status,
        WcStatus::WrFlushErr
    );
    assert_eq!(b.dev.query_qp(b.qp.qpn).unwrap().0, QpState::Err);
    assert_eq!(
        next(&sim, &[&a.dev, &b.dev], &mut b.rcq).status,
        WcStatus::WrFlushErr
    );
    assert_eq!(
        b.dev.events().poll(),
        Some(AsyncEvent::QpAccessError { qpn: b.qp.qpn })
    );
}

#[test]
fn a_write_outside_the_mr_bounds_is_a_remote_access_error() {
    let (sim, mut a, b) = pair();
    let sge = [a.buf.sge(0, 16)];
    a.qp.post(
        Op::Write {
            raddr: b.buf.addr((1 << 20) - 8),
            rkey: b.buf.keys.rkey,
        },
        Data::Sges(&sge),
        true,
    );
    a.qp.ring();
    assert_eq!(
        next(&sim, &[&a.dev, &b.dev], &mut a.scq).status,
        WcStatus::RemAccessErr
    );
}

#[test]
fn a_read_of_memory_without_remote_read_is_refused() {
    let (sim, mut a, b) = pair();
    let ro =
        softnic::harness::Buffer::new(&b.dev, b.pd, 64, softnic::Access::REMOTE_WRITE).unwrap();
    let sge = [a.buf.sge(0, 16)];
    a.qp.post(
        Op::Read {
            raddr: ro.addr(0),
            rkey: ro.keys.rkey,
        },
        Data::Sges(&sge),
        true,
    );
    a.qp.ring();
    assert_eq!(
        next(&sim, &[&a.dev, &b.dev], &mut a.scq).status,
        WcStatus::RemAccessErr
    );
}

#[test]
fn a_misaligned_atomic_is_an_invalid_request() {
    let (sim, mut a, b) = pair();
    let sge = [a.buf.sge(0, 8)];
    a.qp.post(
        Op::FetchAdd {
            raddr: b.buf.addr(4),
            rkey: b.buf.keys.rkey,
            add: 1,
        },
        Data::Sges(&sge),
        true,
    );
    a.qp.ring();
    assert_eq!(
        next(&sim, &[&a.dev, &b.dev], &mut a.scq).status,
        WcStatus::RemInvReqErr
    );
}

#[test]
fn a_send_larger_than_the_receive_wqe_is_a_local_length_error_at_the_receiver() {
    let (sim, mut a, mut b) = pair();
    b.qp.post_recv(&[b.buf.sge(0, 100)]);
    let sge = [a.buf.sge(0, 200)];
    a.qp.post(Op::Send, Data::Sges(&sge), true);
    a.qp.ring();
    let r = next(&sim, &[&a.dev, &b.dev], &mut b.rcq);
    assert_eq!(
        (r.status, r.opcode),
        (WcStatus::LocLenErr, CqeOpcode::RespErr)
    );
    assert_eq!(
        next(&sim, &[&a.dev, &b.dev], &mut a.scq).status,
        WcStatus::RemInvReqErr
    );
}

#[test]
fn a_gather_list_with_an_unknown_lkey_fails_with_a_local_protection_error() {
    let (sim, mut a, b) = pair();
    let mut sge = a.buf.sge(0, 8);
    sge.lkey ^= 0x100;
    a.qp.post(
        Op::Write {
            raddr: b.buf.addr(0),
            rkey: b.buf.keys.rkey,
        },
        Data::Sges(&[sge]),
        false,
    );
    a.qp.ring();
    let c = next(&sim, &[&a.dev, &b.dev], &mut a.scq);
    assert_eq!(c.status, WcStatus::LocProtErr);
}

#[test]
fn a_full_cq_is_an_overrun_event_and_errors_the_qp() {
    let (sim, mut a, mut b) = pair();
    let mut tiny = HarnessCq::new(&b.dev, 2, None).unwrap();
    let mut q = HarnessQp::new(&b.dev, b.pd, &b.scq, &tiny, QpSizes::default()).unwrap();
    let mut qa = HarnessQp::new(&a.dev, a.pd, &a.scq, &a.rcq, QpSizes::default()).unwrap();
    let o = ConnectOptions::default();
    bring_up(&a.dev, qa.qpn, b.dev.addr(), q.qpn, &o).unwrap();
    bring_up(&b.dev, q.qpn, a.dev.addr(), qa.qpn, &o).unwrap();
    for _ in 0..4 {
        q.post_recv(&[b.buf.sge(0, 8)]);
    }
    for _ in 0..3 {
        qa.post(Op::Send, Data::Inline(b"x"), false);
    }
    qa.ring();
    sim.run_until(&[&a.dev, &b.dev], Duration::from_millis(10), || false);
    assert_eq!(b.dev.query_qp(q.qpn).unwrap().0, QpState::Err);
    let events: Vec<_> = std::iter::from_fn(|| b.dev.events().poll()).collect();
    assert!(
        events.contains(&AsyncEvent::CqError { cq: tiny.handle.id }),
        "{events:?}"
    );
    assert!(
        events.contains(&AsyncEvent::QpFatal { qpn: q.qpn }),
        "{events:?}"
    );
    assert!(b.dev.counters().cq_overruns >= 1);
    // The two CQEs that fit are intact.
    assert_eq!(tiny.poll().unwrap().opcode, CqeOpcode::RespSend);
    assert_eq!(tiny.poll().unwrap().opcode, CqeOpcode::RespSend);
    let _ = (&mut a, &mut b);
}

#[test]
fn reset_returns_the_rings_to_index_zero_and_the_qp_works_again() {
    let o = ConnectOptions {
        timeout: 8,
        retry_cnt: 0,
        ..Default::default()
    };
    let (sim, mut a, mut b) = pair_with(1, Duration::from_micros(2), QpSizes::default(), o);
    sim.fabric.set_link(1, false);
    let sge = [a.buf.sge(0, 8)];
    a.qp.post(
        Op::Write {
            raddr: b.buf.addr(0),
            rkey: b.buf.keys.rkey,
        },
        Data::Sges(&sge),
        true,
    );
    a.qp.ring();
    assert_eq!(
        next(&sim, &[&a.dev, &b.dev], &mut a.scq).status,
        WcStatus::RetryExcErr
    );
    sim.fabric.set_link(1, true);
    a.dev
        .modify_qp(a.qp.qpn, QpState::Reset, &QpAttrs::default())
        .unwrap();
    a.qp.reset_counters();
    b.dev
        .modify_qp(b.qp.qpn, QpState::Reset, &QpAttrs::default())
        .unwrap();
    b.qp.reset_counters();
    let o2 = ConnectOptions { psn: 100, ..o };
    softnic::harness::connect(&a.dev, &a.qp, &b.dev, &b.qp, &o2).unwrap();
    a.buf.write(0, &[9u8; 8]);
    let idx = a.qp.post(
        Op::Write {
            raddr: b.buf.addr(0),
            rkey: b.buf.keys.rkey,
        },
        Data::Sges(&sge),
        true,
    );
    assert_eq!(idx, 0);
    a.qp.ring();
    let c = next(&sim, &[&a.dev, &b.dev], &mut a.scq);
    assert_eq!((c.status, c.wqe_counter), (WcStatus::Success, 0));
    assert_eq!(b.buf.read_u64(0), u64::from_ne_bytes([9; 8]));
}

#[test]
fn link_down_and_up_raise_port_events() {
    let (sim, a, b) = pair();
    sim.fabric.add_rule(FaultRule::link_down(
        0,
        Duration::from_millis(1),
        Some(Duration::from_millis(2)),
    ));
    sim.run_until(&[&a.dev, &b.dev], Duration::from_millis(3), || false);
    assert_eq!(a.dev.events().poll(), Some(AsyncEvent::PortError));
    assert_eq!(a.dev.events().poll(), Some(AsyncEvent::PortActive));
    assert_eq!(a.dev.events().poll(), None);
}

#[test]
fn a_late_link_report_moves_the_events_but_not_the_packets() {
    let (sim, mut a, b) = pair();
    // Physically down 1-2 ms; reported down 1.5-4 ms (noticed late, back late).
    let ms = Duration::from_millis;
    sim.fabric
        .add_rule(FaultRule::link_down(0, ms(1), Some(ms(2))));
    sim.fabric.add_rule(FaultRule::link_report(
        0,
        true,
        ms(1),
        Some(ms(1) + ms(1) / 2),
    ));
    sim.fabric.add_rule(FaultRule::link_report(
        0,
        false,
        ms(1) + ms(1) / 2,
        Some(ms(4)),
    ));
    // `run_until` runs for a span of virtual time: to 1.25 ms, then to 3 ms.
    sim.run_until(&[&a.dev, &b.dev], ms(1) + ms(1) / 4, || false);
    assert_eq!(a.dev.events().poll(), None, "the down is not reported yet");
    sim.run_until(&[&a.dev, &b.dev], ms(3) - sim.clock.now(), || false);
    assert_eq!(a.dev.events().poll(), Some(AsyncEvent::PortError));
    assert_eq!(a.dev.events().poll(), None, "the up is not reported yet");
    assert_eq!(a.dev.port_state(), PortState::Down);
    // Reported down, physically up: a WRITE goes through.
    a.buf.write(0, &[7; 8]);
    let idx = post_write(&mut a, &b, 8);
    let c = next(&sim, &[&a.dev, &b.dev], &mut a.scq);
    assert_eq!((c.status, c.wqe_counter), (WcStatus::Success, idx));
    assert_eq!(b.buf.read_u64(0), u64::from_ne_bytes([7; 8]));
    assert!(
        sim.clock.now() < ms(4),
        "the WRITE took until {:?}",
        sim.clock.now()
    );
    sim.run_until(&[&a.dev, &b.dev], ms(5) - sim.clock.now(), || false);
    assert_eq!(a.dev.events().poll(), Some(AsyncEvent::PortActive));
    assert_eq!(a.dev.port_state(), PortState::Active);
}

#[test]
fn a_link_reported_up_while_down_carries_nothing() {
    let (sim, mut a, b) = pair();
    let ms = Duration::from_millis;
    sim.fabric.add_rule(FaultRule::link_down(0, ms(1), None));
    sim.fabric
        .add_rule(FaultRule::link_report(0, true, ms(1), None));
    sim.run_until(&[&a.dev, &b.dev], ms(2), || false);
    assert_eq!(a.dev.events().poll(), None);
    assert_eq!(a.dev.port_state(), PortState::Active);
    let idx = post_write(&mut a, &b, 8);
    let c = next(&sim, &[&a.dev, &b.dev], &mut a.scq);
    assert_eq!((c.status, c.wqe_counter), (WcStatus::RetryExcErr, idx));
}

#[test]
fn illegal_transitions_are_refused_with_names() {
    let (_sim, a, _b) = pair();
    let err = a
        .dev
        .modify_qp(a.qp.qpn, QpState::Init, &QpAttrs::default())
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("illegal QP transition Rts -> Init"),
        "{err}"
    );
}

#[test]
fn a_wqe_claiming_more_than_the_ring_holds_is_a_local_qp_operation_error() {
    let sizes = QpSizes {
        sq_bbs: 4,
        ..QpSizes::default()
    };
    let (sim, mut a, b) = pair_with(
        1,
        Duration::from_micros(2),
        sizes,
        ConnectOptions::default(),
    );
    // A WRITE whose 8-byte inline payload fits, then a control segment claiming 63 units.
    let idx = a.qp.post(
        Op::Write {
            raddr: b.buf.addr(0),
            rkey: b.buf.keys.rkey,
        },
        Data::Inline(b"12345678"),
        true,
    );
    a.qp.corrupt_ds(idx, 63);
    a.qp.ring();
    let c = next(&sim, &[&a.dev, &b.dev], &mut a.scq);
    assert_eq!((c.status, c.wqe_counter), (WcStatus::LocQpOpErr, idx));
}

/// A completion the device holds back (a NIC slow to complete) is forgotten when its QP is
/// reset, as mlx5's reset cleans the CQ of the QP's CQEs; one not reset arrives once the
/// device completes again.
#[test]
fn a_reset_forgets_the_qps_held_completions_and_only_those() {
    for reset in [false, true] {
        let (sim, mut a, b) = pair();
        // Another CQ on the device, created after the QP's: a reset must find the QP's own.
        let _other = HarnessCq::new(&a.dev, 64, None).unwrap();
        a.dev.slow_completions(Duration::from_millis(20));
        b.buf.write(0, &[0u8; 8]);
        a.buf.write(0, &[7u8; 8]);
        post_write(&mut a, &b, 8);
        let written = sim.run_until(&[&a.dev, &b.dev], Duration::from_millis(5), || {
            b.buf.read_u64(0) == u64::from_ne_bytes([7; 8])
        });
        assert!(written, "the WRITE executed at the responder");
        // The ACK comes back; the requester's CQE is held.
        sim.run_until(&[&a.dev, &b.dev], Duration::from_millis(2), || false);
        assert!(a.scq.poll().is_none(), "held while the device is slow");
        if reset {
            a.dev
                .modify_qp(a.qp.qpn, QpState::Reset, &QpAttrs::default())
                .unwrap();
        }
        let got = next_within(
            &sim,
            &[&a.dev, &b.dev],
            &mut a.scq,
            Duration::from_millis(50),
        );
        match reset {
            true => assert!(got.is_none(), "a reset QP's held CQE came: {got:?}"),
            false => assert_eq!(got.map(|c| c.status), Some(WcStatus::Success)),
        }
    }
}
