//! Sharing the medium between QPs (the device's in-flight bound, equal shares, window cuts on
//! loss) and the short retransmit timer a driver arms after re-posting work. All on the fabric
//! with a virtual clock.

mod common;

use std::time::Duration;

use common::{next_within, pair_with, pattern};
use hw_defs::verbs::WcStatus;
use softnic::harness::{
    bring_up, Buffer, ConnectOptions, Data, HarnessCq, HarnessQp, Op, QpSizes, Sim,
};
use softnic::{Access, Device, DeviceError, Fault, FaultRule};

const MSG: u32 = 64 * 1024;

/// `n` QP pairs between two devices, sharing one CQ per side; `a`'s buffer holds one message,
/// `b`'s one slot per QP and message.
struct Many {
    sim: Sim,
    a: Device,
    b: Device,
    acq: HarnessCq,
    qps: Vec<HarnessQp>,
    abuf: Buffer,
    bbuf: Buffer,
}

fn many(n: usize, per_qp: usize, seed: u64) -> Many {
    let sim = Sim::new(seed, Duration::from_micros(2));
    let a = sim.device("a", 1).unwrap();
    let b = sim.device("b", 2).unwrap();
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let acq = HarnessCq::new(&a, 8192, None).unwrap();
    let bcq = HarnessCq::new(&b, 8192, None).unwrap();
    let sizes = QpSizes {
        sq_bbs: 64,
        ..QpSizes::default()
    };
    let o = ConnectOptions::default();
    let mut qps = Vec::new();
    for _ in 0..n {
        let qa = HarnessQp::new(&a, pa, &acq, &acq, sizes).unwrap();
        let qb = HarnessQp::new(&b, pb, &bcq, &bcq, sizes).unwrap();
        bring_up(&a, qa.qpn, b.addr(), qb.qpn, &o).unwrap();
        bring_up(&b, qb.qpn, a.addr(), qa.qpn, &o).unwrap();
        qps.push(qa);
    }
    let abuf = Buffer::new(&a, pa, MSG as usize, Access::ALL).unwrap();
    let bbuf = Buffer::new(&b, pb, n * per_qp * MSG as usize, Access::ALL).unwrap();
    abuf.write(0, &pattern(MSG as usize, seed));
    Many {
        sim,
        a,
        b,
        acq,
        qps,
        abuf,
        bbuf,
    }
}

impl Many {
    /// Posts `per_qp` signaled 64 KiB WRITEs on every QP and rings each.
    fn post_writes(&mut self, per_qp: usize) {
        let sge = [self.abuf.sge(0, MSG)];
        for (q, qp) in self.qps.iter_mut().enumerate() {
            for m in 0..per_qp {
                let slot = (q * per_qp + m) * MSG as usize;
                qp.post(
                    Op::Write {
                        raddr: self.bbuf.addr(slot),
                        rkey: self.bbuf.keys.rkey,
                    },
                    Data::Sges(&sge),
                    true,
                );
            }
            qp.ring();
        }
    }

    /// Runs both devices until `count` completions arrived; returns them all successful.
    fn complete(&mut self, count: usize) {
        let mut got = 0;
        while got < count {
            let c = next_within(
                &self.sim,
                &[&self.a, &self.b],
                &mut self.acq,
                Duration::from_secs(10),
            )
            .unwrap_or_else(|| panic!("only {got} of {count} WRITEs completed"));
            assert_eq!(c.status, WcStatus::Success, "completion {got}: {c:?}");
            got += 1;
        }
    }

    /// Every slot on `b` holds the message.
    fn check_bytes(&self, slots: usize) {
        let want = pattern(MSG as usize, 7);
        let mut got = vec![0u8; MSG as usize];
        for s in 0..slots {
            self.bbuf.read(s * MSG as usize, &mut got);
            assert!(got == want, "slot {s} differs");
        }
    }
}

#[test]
fn qps_rung_at_once_share_the_device_window_equally() {
    // 64 QPs x 2 x 64 KiB at MTU 1024 is 8,192 packets: without sharing, each QP would send
    // up to 128 a round; sharing, the device's 1,024 go 16 to each (over four rounds of 256).
    let mut m = many(64, 2, 7);
    m.post_writes(2);
    let now = m.sim.clock.now();
    // Only the sender runs: nothing is acknowledged, so what it sent is all in flight. A
    // round sends 256 request packets at most.
    m.a.progress(now);
    assert!(m.a.counters().tx_packets <= 256 + 64);
    for _ in 0..8 {
        m.a.progress(now);
    }
    let mut total = 0;
    for qp in &m.qps {
        let sent = m.a.qp_counters(qp.qpn).unwrap().tx_packets;
        assert!(
            (1..=17).contains(&sent),
            "QP {:#x} sent {sent} packets of its share of 16",
            qp.qpn
        );
        total += sent;
    }
    assert!(total <= 1024 + 64, "{total} packets in flight");
    m.complete(128);
    m.check_bytes(128);
}

#[test]
fn qps_that_lose_packets_cut_their_windows_and_every_write_completes() {
    let mut m = many(8, 8, 7);
    m.sim.fabric.add_rule(FaultRule::always(Fault::Drop(0.02)));
    m.post_writes(8);
    m.complete(64);
    m.check_bytes(64);
    let c = m.a.counters();
    assert!(c.window_cuts > 0, "no window cut under 2 % loss: {c:?}");
    assert!(c.retransmitted_packets > 0);
}

/// A pair whose WRITE's first transmission is lost (a partition for the first millisecond),
/// with the normal timer 67 ms (code 14) and no retry left.
fn lossy_start() -> (Sim, softnic::harness::Node, softnic::harness::Node) {
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

fn post_one_write(a: &mut softnic::harness::Node, b: &softnic::harness::Node) {
    let sge = [a.buf.sge(0, 64)];
    a.qp.post(
        Op::Write {
            raddr: b.buf.addr(0),
            rkey: b.buf.keys.rkey,
        },
        Data::Sges(&sge),
        true,
    );
    a.qp.ring();
}

#[test]
fn a_lost_first_transmission_under_a_short_timer_is_resent_in_its_time_without_spending_a_retry() {
    let (sim, mut a, b) = lossy_start();
    a.dev
        .arm_short_retransmit(a.qp.qpn, Duration::from_millis(2))
        .unwrap();
    let start = sim.clock.now();
    post_one_write(&mut a, &b);
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
    post_one_write(&mut a, &b);
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
    post_one_write(&mut a, &b);
    let c = next_within(&sim, &[&a.dev, &b.dev], &mut a.scq, Duration::from_secs(1)).unwrap();
    assert_eq!(c.status, WcStatus::Success);
    // A second loss, not covered: the normal timer, and with no retry left, the error.
    let now = sim.clock.now();
    for r in FaultRule::partition(0, 1, now, None) {
        sim.fabric.add_rule(r);
    }
    let start = sim.clock.now();
    post_one_write(&mut a, &b);
    let c = next_within(&sim, &[&a.dev, &b.dev], &mut a.scq, Duration::from_secs(1)).unwrap();
    assert_eq!(c.status, WcStatus::RetryExcErr);
    assert!(sim.clock.now() - start >= Duration::from_millis(67));
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
