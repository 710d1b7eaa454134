//! Hostile input: random bytes and mutated packets (with and without a correct ICRC) pushed at
//! a responder are counted and dropped without a panic, and a valid QP keeps working.

mod common;

use std::net::IpAddr;
use std::time::Duration;

use common::{next, pair_with, pattern, seed};
use hw_defs::roce::icrc;
use hw_defs::verbs::WcStatus;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use softnic::harness::{bring_up, ConnectOptions, Data, HarnessCq, HarnessQp, Op, QpSizes};
use softnic::{rxe_source_port, ROCE_PORT};

/// A plausible RC packet: BTH with `opcode`, some header bytes, payload, zero ICRC.
fn template(rng: &mut ChaCha8Rng, dest_qpn: u32) -> Vec<u8> {
    let opcode: u8 = if rng.random_bool(0.8) {
        rng.random_range(0..=0x14)
    } else {
        rng.random()
    };
    let len = 12
        + rng.random_range(0..64)
        + rng.random_range(0..2048) * usize::from(rng.random_bool(0.3))
        + 4;
    let mut p: Vec<u8> = (0..len).map(|_| rng.random()).collect();
    p[0] = opcode;
    p[1] &= 0xf0; // pad 0, tver 0 mostly
    p[5..8].copy_from_slice(&dest_qpn.to_be_bytes()[1..]);
    if rng.random_bool(0.9) {
        // The default partition mostly, so that most reach the QPN and opcode checks.
        p[2..4].copy_from_slice(&[0xff, 0xff]);
    }
    p
}

fn with_icrc(mut p: Vec<u8>, src: IpAddr, dst: IpAddr, src_port: u16) -> Vec<u8> {
    if p.len() >= 16 {
        if let Ok(ip) = icrc::IpFields::rxe(src, dst) {
            if let Ok(crc) = icrc::compute_for_udp_payload(ip, src_port, ROCE_PORT, &p) {
                let n = p.len();
                p[n - 4..].copy_from_slice(&crc.to_le_bytes());
            }
        }
    }
    p
}

#[test]
fn random_and_mutated_packets_are_counted_and_dropped_and_a_valid_qp_keeps_working() {
    let seed = seed(77);
    eprintln!("seed {seed} (set SOFTNIC_SEED to replay)");
    let (sim, mut a, mut b) = pair_with(
        seed,
        Duration::from_micros(2),
        QpSizes::default(),
        ConnectOptions::default(),
    );
    // A second QP pair on the same devices takes the well-formed abuse (it may end in ERR).
    let (acq, bcq) = (
        HarnessCq::new(&a.dev, 1024, None).unwrap(),
        HarnessCq::new(&b.dev, 1024, None).unwrap(),
    );
    let mut qa = HarnessQp::new(&a.dev, a.pd, &acq, &acq, QpSizes::default()).unwrap();
    let mut qb = HarnessQp::new(&b.dev, b.pd, &bcq, &bcq, QpSizes::default()).unwrap();
    let o = ConnectOptions::default();
    bring_up(&a.dev, qa.qpn, b.dev.addr(), qb.qpn, &o).unwrap();
    bring_up(&b.dev, qb.qpn, a.dev.addr(), qa.qpn, &o).unwrap();
    for _ in 0..16 {
        qb.post_recv(&[b.buf.sge(0, 4096)]);
        qa.post_recv(&[a.buf.sge(0, 4096)]);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (src, dst) = (a.dev.addr(), b.dev.addr());
    let sport = rxe_source_port(qa.qpn);
    let before = b.dev.counters();
    let mut injected = 0u64;
    for round in 0..400 {
        for _ in 0..50 {
            let p = match rng.random_range(0..4) {
                // Pure noise.
                0 => (0..rng.random_range(0..3000))
                    .map(|_| rng.random())
                    .collect(),
                // Plausible headers, wrong ICRC, aimed at the working QP.
                1 => template(&mut rng, b.qp.qpn),
                // Plausible headers with a correct ICRC, aimed at the abused QP or nowhere.
                2 => {
                    let qpn = if rng.random_bool(0.7) {
                        qb.qpn
                    } else {
                        rng.random_range(0..0x00ff_ffff)
                    };
                    with_icrc(template(&mut rng, qpn), src, dst, sport)
                }
                // A truncated or extended well-formed packet.
                _ => {
                    let mut p = with_icrc(template(&mut rng, qb.qpn), src, dst, sport);
                    if rng.random_bool(0.5) {
                        p.truncate(rng.random_range(0..p.len()));
                    } else {
                        p.extend((0..rng.random_range(1..9)).map(|_| 0u8));
                    }
                    p
                }
            };
            if sim.fabric.inject(0, dst, sport, &p, sim.clock.now()) {
                injected += 1;
            }
        }
        sim.run_until(&[&a.dev, &b.dev], Duration::from_micros(50 + round), || {
            false
        });
    }
    let after = b.dev.counters();
    let dropped = (after.icrc_errors - before.icrc_errors)
        + (after.malformed_drops - before.malformed_drops)
        + (after.unknown_qpn_drops - before.unknown_qpn_drops)
        + (after.pkey_drops - before.pkey_drops);
    assert!(injected > 15_000, "{injected}");
    assert!(after.icrc_errors > before.icrc_errors, "{after:?}");
    assert!(after.malformed_drops > before.malformed_drops, "{after:?}");
    assert!(
        after.unknown_qpn_drops > before.unknown_qpn_drops,
        "{after:?}"
    );
    assert!(
        dropped > injected / 2,
        "{dropped} of {injected} dropped: {after:?}"
    );
    // The working QP pair is untouched: 200 writes and sends, every byte checked.
    for i in 0..200u64 {
        let data = pattern(3000, i);
        a.buf.write(0, &data);
        let sge = [a.buf.sge(0, 3000)];
        a.qp.post(
            Op::Write {
                raddr: b.buf.addr(8192),
                rkey: b.buf.keys.rkey,
            },
            Data::Sges(&sge),
            true,
        );
        b.qp.post_recv(&[b.buf.sge(16384, 4096)]);
        a.qp.post(Op::Send, Data::Sges(&sge), true);
        a.qp.ring();
        for _ in 0..2 {
            assert_eq!(
                next(&sim, &[&a.dev, &b.dev], &mut a.scq).status,
                WcStatus::Success,
                "op {i}"
            );
        }
        let r = next(&sim, &[&a.dev, &b.dev], &mut b.rcq);
        assert_eq!((r.status, r.byte_count), (WcStatus::Success, 3000));
        let mut got = vec![0u8; 3000];
        b.buf.read(8192, &mut got);
        assert!(got == data);
        b.buf.read(16384, &mut got);
        assert!(got == data);
    }
    let _ = (&mut qa, &mut qb);
}

#[test]
fn garbage_in_the_driver_rings_ends_in_error_completions_never_a_panic_or_hang() {
    let seed = seed(5);
    eprintln!("seed {seed} (set SOFTNIC_SEED to replay)");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for round in 0..40 {
        let sizes = QpSizes {
            sq_bbs: 16,
            rq_wqes: 16,
            rq_sges: 2,
            max_inline: 64,
            max_send_sge: 2,
        };
        let (sim, mut a, mut b) = pair_with(
            seed + round,
            Duration::from_micros(2),
            sizes,
            ConnectOptions::default(),
        );
        let noise: Vec<u8> = (0..rng.random_range(8..2048))
            .map(|_| rng.random())
            .collect();
        a.qp.post_garbage(&noise, rng.random(), rng.random());
        b.qp.post_garbage(&noise, 0, rng.random());
        // Whatever the garbage says, the devices settle: bounded virtual time, no panic.
        sim.run_until(&[&a.dev, &b.dev], Duration::from_secs(2), || false);
        while a.scq.poll().is_some() {}
        while b.rcq.poll().is_some() {}
    }
}

#[test]
fn a_request_of_another_partition_never_reaches_the_qp() {
    let seed = seed(78);
    let (sim, a, b) = pair_with(
        seed,
        Duration::from_micros(2),
        QpSizes::default(),
        ConnectOptions::default(),
    );
    let (src, dst) = (a.dev.addr(), b.dev.addr());
    let sport = rxe_source_port(a.qp.qpn);
    let before = (b.dev.counters(), b.dev.qp_counters(b.qp.qpn).unwrap());
    // SEND ONLY to the working QP, P_Key 0x1234 (partition 0x1234, full member), good ICRC.
    let mut p = vec![0u8; 12 + 16 + 4];
    p[0] = 0x04;
    p[2..4].copy_from_slice(&0x1234u16.to_be_bytes());
    p[5..8].copy_from_slice(&b.qp.qpn.to_be_bytes()[1..]);
    let p = with_icrc(p, src, dst, sport);
    for _ in 0..10 {
        assert!(sim.fabric.inject(0, dst, sport, &p, sim.clock.now()));
    }
    sim.run_until(&[&a.dev, &b.dev], Duration::from_millis(1), || false);
    let after = (b.dev.counters(), b.dev.qp_counters(b.qp.qpn).unwrap());
    assert_eq!(
        after.0.pkey_drops - before.0.pkey_drops,
        10,
        "{:?}",
        after.0
    );
    assert_eq!(after.1.rx_packets, before.1.rx_packets, "{:?}", after.1);
}
