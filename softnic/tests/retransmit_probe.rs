//! The retransmit probe a driver gives a control QP (`Device::set_retransmit_probe`), and the
//! resend it asks for when a path may be back (`Device::retransmit_now`): what is
//! unacknowledged gets through soon after the path carries packets again, without spending a
//! retry and without postponing the ACK timer that decides when the QP gives up. On the
//! fabric with a virtual clock.

mod common;

use std::time::Duration;

use common::{next_within, pair_with, post_write};
use hw_defs::verbs::WcStatus;
use softnic::harness::{ConnectOptions, Node, QpSizes, Sim};
use softnic::{DeviceError, FaultRule, RetransmitProbe};

/// 2 ms doubling to 16 ms: resends at 2, 6, 14, 30, 46, 62, ... ms after a first
/// transmission that is never acknowledged.
const PROBE: RetransmitProbe = RetransmitProbe {
    first: Duration::from_millis(2),
    cap: Duration::from_millis(16),
};

/// A pair with the normal ACK timer at 67 ms (code 14) and `retry_cnt` retries, whose path
/// is partitioned for `down` from now (`None`: for good).
fn partitioned(retry_cnt: u8, down: Option<Duration>) -> (Sim, Node, Node) {
    let o = ConnectOptions {
        timeout: 14,
        retry_cnt,
        ..ConnectOptions::default()
    };
    let (sim, a, b) = pair_with(3, Duration::from_micros(2), QpSizes::default(), o);
    let now = sim.clock.now();
    for r in FaultRule::partition(0, 1, now, down.map(|d| now + d)) {
        sim.fabric.add_rule(r);
    }
    (sim, a, b)
}

#[test]
fn a_probe_resends_within_its_cap_of_the_path_coming_back_without_spending_a_retry() {
    // Down 40 ms, under the 67 ms ACK timer; no retry left, so a timeout would end the QP.
    let (sim, mut a, b) = partitioned(0, Some(Duration::from_millis(40)));
    a.dev.set_retransmit_probe(a.qp.qpn, PROBE).unwrap();
    let start = sim.clock.now();
    post_write(&mut a, &b, 64);
    let c = next_within(&sim, &[&a.dev, &b.dev], &mut a.scq, Duration::from_secs(1)).unwrap();
    let took = sim.clock.now() - start;
    assert_eq!(c.status, WcStatus::Success);
    // The resend at 46 ms: within the cap of the path's return, not at the 67 ms timer.
    assert!(
        took >= Duration::from_millis(40) && took < Duration::from_millis(40 + 16 + 1),
        "completed after {took:?}"
    );
    let qc = a.dev.qp_counters(a.qp.qpn).unwrap();
    assert_eq!(qc.timeouts, 0);
    assert_eq!(qc.probe_resends, 5, "resends at 2, 6, 14, 30 and 46 ms");
}

#[test]
fn without_a_probe_the_same_outage_waits_for_the_ack_timer_and_spends_its_retry() {
    let (sim, mut a, b) = partitioned(0, Some(Duration::from_millis(40)));
    let start = sim.clock.now();
    post_write(&mut a, &b, 64);
    let c = next_within(&sim, &[&a.dev, &b.dev], &mut a.scq, Duration::from_secs(1)).unwrap();
    assert_eq!(c.status, WcStatus::RetryExcErr);
    assert!(sim.clock.now() - start >= Duration::from_millis(67));
}

#[test]
fn probes_never_postpone_the_ack_timer_so_a_dead_path_ends_the_qp_at_its_retry_budget() {
    // Two tries of 67 ms: the error after 134 ms, probes or not.
    let (sim, mut a, b) = partitioned(1, None);
    a.dev.set_retransmit_probe(a.qp.qpn, PROBE).unwrap();
    let start = sim.clock.now();
    post_write(&mut a, &b, 64);
    let c = next_within(&sim, &[&a.dev, &b.dev], &mut a.scq, Duration::from_secs(2)).unwrap();
    let took = sim.clock.now() - start;
    assert_eq!(c.status, WcStatus::RetryExcErr);
    assert!(
        took >= Duration::from_millis(134) && took < Duration::from_millis(136),
        "failed after {took:?}"
    );
    let qc = a.dev.qp_counters(a.qp.qpn).unwrap();
    assert_eq!(qc.timeouts, 2);
    assert!(qc.probe_resends >= 8, "{} probe resends", qc.probe_resends);
}

#[test]
fn retransmit_now_resends_at_once_when_the_path_is_back() {
    let (sim, mut a, b) = partitioned(1, Some(Duration::from_millis(30)));
    let start = sim.clock.now();
    post_write(&mut a, &b, 64);
    // Sent into the partition and lost; the ACK timer would resend at 67 ms.
    a.dev.progress(sim.clock.now());
    sim.clock.advance_to(start + Duration::from_micros(30_500));
    a.dev.retransmit_now(a.qp.qpn).unwrap();
    let c = next_within(&sim, &[&a.dev, &b.dev], &mut a.scq, Duration::from_secs(1)).unwrap();
    let took = sim.clock.now() - start;
    assert_eq!(c.status, WcStatus::Success);
    assert!(took < Duration::from_millis(32), "completed after {took:?}");
    let qc = a.dev.qp_counters(a.qp.qpn).unwrap();
    assert_eq!((qc.probe_resends, qc.timeouts), (1, 0));
}

#[test]
fn a_probe_without_a_first_wait_or_with_a_cap_below_it_or_for_an_unknown_qp_is_refused() {
    let (_sim, a, _b) = partitioned(1, None);
    for probe in [
        RetransmitProbe {
            first: Duration::ZERO,
            cap: Duration::from_millis(1),
        },
        RetransmitProbe {
            first: Duration::from_millis(2),
            cap: Duration::from_millis(1),
        },
    ] {
        let e = a.dev.set_retransmit_probe(a.qp.qpn, probe).unwrap_err();
        assert!(e.to_string().contains("retransmit probe"), "{e}");
    }
    assert!(matches!(
        a.dev.set_retransmit_probe(0x00ab_cdef, PROBE),
        Err(DeviceError::UnknownQp(0x00ab_cdef))
    ));
    assert!(matches!(
        a.dev.retransmit_now(0x00ab_cdef),
        Err(DeviceError::UnknownQp(0x00ab_cdef))
    ));
}
