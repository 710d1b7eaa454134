//! The short retransmit timer a driver arms after re-posting work on a QP (a failover onto a
//! backup QP): a first transmission lost there is resent in the short time, once, without
//! spending a retry. On the fabric with a virtual clock.

mod common;

use std::time::Duration;

use common::{next_within, pair_with, post_write};
use hw_defs::verbs::WcStatus;
use softnic::harness::{ConnectOptions, Node, QpSizes, Sim};
use softnic::{DeviceError, FaultRule};

/// A pair whose WRITE's first transmission is lost (a partition for the first millisecond),
/// with the normal timer 67 ms (code 14) and no retry left.
fn lossy_start() -> (Sim, Node, Node) {
    let o = ConnectOptions {
        timeout: 14,
        retry_cnt: 0,
        ..ConnectOptions::default()
    };
    let (sim, a, b) = pair_with(3, Duration::from_micros(2), QpSizes::default(), o);
    let now = sim.clock.now();
    for r in FaultRule::partition(0, 1, now, Some(now + Duration::from_millis(1))) {
        sim.fabric.add_rule(r);
    }
    (sim, a, b)
}

#[test]
fn a_lost_first_transmission_under_a_short_timer_is_resent_in_its_time_without_spending_a_retry() {
    let (sim, mut a, b) = lossy_start();
    a.dev
        .arm_short_retransmit(a.qp.qpn, Duration::from_millis(2))
        .unwrap();
    let start = sim.clock.now();
    post_write(&mut a, &b, 64);
    let c = next_within(&sim, &[&a.dev, &b.dev], &mut a.scq, Duration::from_secs(1)).unwrap();
    let took = sim.clock.now() - start;
    // retry_cnt 0: a normal timeout would have ended the QP in RETRY_EXC_ERR.
    assert_eq!(c.status, WcStatus::Success);
    assert!(took < Duration::from_millis(3), "completed after {took:?}");
    let qc = a.dev.qp_counters(a.qp.qpn).unwrap();
    assert_eq!((qc.short_timeouts, qc.timeouts), (1, 0));
}

#[test]
fn without_a_short_timer_a_lost_first_transmission_waits_for_the_full_ack_timeout() {
    let (sim, mut a, b) = lossy_start();
    let start = sim.clock.now();
    post_write(&mut a, &b, 64);
    let c = next_within(&sim, &[&a.dev, &b.dev], &mut a.scq, Duration::from_secs(1)).unwrap();
    let took = sim.clock.now() - start;
    assert_eq!(c.status, WcStatus::RetryExcErr);
    assert!(took >= Duration::from_millis(67), "failed after {took:?}");
}

#[test]
fn a_short_timer_is_used_once_then_the_normal_timeout_applies() {
    let (sim, mut a, b) = lossy_start();
    a.dev
        .arm_short_retransmit(a.qp.qpn, Duration::from_millis(2))
        .unwrap();
    post_write(&mut a, &b, 64);
    let c = next_within(&sim, &[&a.dev, &b.dev], &mut a.scq, Duration::from_secs(1)).unwrap();
    assert_eq!(c.status, WcStatus::Success);
    // A second loss, not covered: the normal timer, and with no retry left, the error.
    let now = sim.clock.now();
    for r in FaultRule::partition(0, 1, now, None) {
        sim.fabric.add_rule(r);
    }
    let start = sim.clock.now();
    post_write(&mut a, &b, 64);
    let c = next_within(&sim, &[&a.dev, &b.dev], &mut a.scq, Duration::from_secs(1)).unwrap();
    assert_eq!(c.status, WcStatus::RetryExcErr);
    assert!(sim.clock.now() - start >= Duration::from_millis(67));
    assert_eq!(a.dev.qp_counters(a.qp.qpn).unwrap().short_timeouts, 1);
}

#[test]
fn a_short_timer_armed_while_the_normal_one_runs_brings_the_resend_forward() {
    let (sim, mut a, b) = lossy_start();
    let start = sim.clock.now();
    post_write(&mut a, &b, 64);
    // The WRITE leaves (and is lost) under the 67 ms timer; the short one replaces it.
    a.dev.progress(sim.clock.now());
    a.dev
        .arm_short_retransmit(a.qp.qpn, Duration::from_millis(2))
        .unwrap();
    let c = next_within(&sim, &[&a.dev, &b.dev], &mut a.scq, Duration::from_secs(1)).unwrap();
    assert_eq!(c.status, WcStatus::Success);
    assert!(sim.clock.now() - start < Duration::from_millis(3));
    assert_eq!(a.dev.qp_counters(a.qp.qpn).unwrap().short_timeouts, 1);
}

#[test]
fn a_short_retransmit_of_zero_or_for_an_unknown_qp_is_refused_by_name() {
    let (_sim, a, _b) = lossy_start();
    let e = a
        .dev
        .arm_short_retransmit(a.qp.qpn, Duration::ZERO)
        .unwrap_err();
    assert!(e.to_string().contains("short retransmit timeout"), "{e}");
    assert!(matches!(
        a.dev
            .arm_short_retransmit(0x00ab_cdef, Duration::from_millis(1)),
        Err(DeviceError::UnknownQp(0x00ab_cdef))
    ));
}
