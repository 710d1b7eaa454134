//! Hostile input: random bytes and mutated packets (with and without a correct ICRC) pushed at
//! a responder are counted and dropped without a panic, and a valid QP keeps working.

mod common;

use std::net::IpAddr;
use std::time::Duration;

use common::{next, pair_with, pattern, seed, write_and_wait, WholeRead};
use hw_defs::roce::icrc;
use hw_defs::verbs::WcStatus;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use softnic::harness::{
    bring_up, ConnectOptions, Data, HarnessCq, HarnessQp, Node, Op, QpSizes, Sim,
};
use softnic::PathMtu;
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

/// The RC opcodes these tests forge (IBA table 38).
mod opcode {
    pub const SEND_FIRST: u8 = 0x00;
    pub const SEND_MIDDLE: u8 = 0x01;
    pub const SEND_LAST: u8 = 0x02;
    pub const SEND_ONLY: u8 = 0x04;
    pub const WRITE_FIRST: u8 = 0x06;
    pub const WRITE_ONLY: u8 = 0x0a;
    pub const READ_REQUEST: u8 = 0x0c;
}

/// A request packet as a (possibly hostile) peer would send it: BTH (default P_Key, AckReq),
/// a RETH when given, the payload (a multiple of 4 bytes), and a correct ICRC for `src` to
/// `dst` from the UDP source port of `src_qpn`.
#[allow(clippy::too_many_arguments)]
fn request(
    opcode: u8,
    dest_qpn: u32,
    psn: u32,
    reth: Option<(u64, u32, u32)>,
    payload: &[u8],
    src: IpAddr,
    dst: IpAddr,
    src_qpn: u32,
) -> Vec<u8> {
    assert_eq!(payload.len() % 4, 0, "no pad bytes in these packets");
    let mut p = vec![0u8; 12];
    p[0] = opcode;
    p[2..4].copy_from_slice(&[0xff, 0xff]);
    p[5..8].copy_from_slice(&dest_qpn.to_be_bytes()[1..]);
    p[8..12].copy_from_slice(&(0x8000_0000 | (psn & 0x00ff_ffff)).to_be_bytes());
    if let Some((va, rkey, len)) = reth {
        p.extend_from_slice(&va.to_be_bytes());
        p.extend_from_slice(&rkey.to_be_bytes());
        p.extend_from_slice(&len.to_be_bytes());
    }
    p.extend_from_slice(payload);
    p.extend_from_slice(&[0; 4]);
    with_icrc(p, src, dst, rxe_source_port(src_qpn))
}

/// The first PSN each side of `ConnectOptions::default()` sends.
const FIRST_PSN: u32 = 0x00ff_fff0;

#[test]
fn a_request_from_an_address_that_is_not_the_peer_is_dropped_unexecuted() {
    let (sim, mut a, b) = pair_with(
        seed(79),
        Duration::from_micros(2),
        QpSizes::default(),
        ConnectOptions::default(),
    );
    // A third host on the fabric forges a well-formed WRITE ONLY with the right QPN, PSN and
    // rkey: everything but the source address is what the peer would send.
    let intruder = IpAddr::V4(std::net::Ipv4Addr::new(198, 18, 0, 66));
    let port = sim.fabric.add_port(intruder);
    let payload = [0xeeu8; 64];
    let p = request(
        opcode::WRITE_ONLY,
        b.qp.qpn,
        FIRST_PSN,
        Some((b.buf.addr(0), b.buf.keys.rkey, 64)),
        &payload,
        intruder,
        b.dev.addr(),
        a.qp.qpn,
    );
    let before = b.dev.qp_counters(b.qp.qpn).unwrap();
    assert!(sim.fabric.inject(
        port,
        b.dev.addr(),
        rxe_source_port(a.qp.qpn),
        &p,
        sim.clock.now()
    ));
    sim.run_until(&[&a.dev, &b.dev], Duration::from_millis(1), || false);
    let after = b.dev.qp_counters(b.qp.qpn).unwrap();
    assert_eq!(
        after.malformed_drops,
        before.malformed_drops + 1,
        "{after:?}"
    );
    assert_eq!(after.rx_packets, before.rx_packets, "{after:?}");
    assert_eq!(
        after.tx_packets, before.tx_packets,
        "no ACK or NAK to anyone: {after:?}"
    );
    let mut got = [0u8; 64];
    b.buf.read(0, &mut got);
    assert_eq!(got, [0u8; 64], "the forged WRITE landed");
    // The PSN it used is still the one the real peer's next WRITE takes.
    assert_eq!(write_and_wait(&sim, &mut a, &b, 64), WcStatus::Success);
}

#[test]
fn a_deregistered_rkey_is_a_remote_access_error_and_its_memory_is_untouched() {
    for op in ["write", "read"] {
        let (sim, mut a, b) = pair_with(
            seed(80),
            Duration::from_micros(2),
            QpSizes::default(),
            ConnectOptions::default(),
        );
        let mut mem = vec![0x5au8; 4096];
        // SAFETY: `mem` outlives the registration (deregistered below, before the end).
        let keys = unsafe {
            b.dev
                .reg_mr(b.pd, mem.as_mut_ptr(), mem.len(), softnic::Access::ALL)
                .unwrap()
        };
        b.dev.dereg_mr(keys.lkey).unwrap();
        a.buf.write(0, &[0xa5; 4096]);
        let sge = [a.buf.sge(0, 4096)];
        let (raddr, rkey) = (mem.as_ptr() as u64, keys.rkey);
        let o = if op == "write" {
            Op::Write { raddr, rkey }
        } else {
            Op::Read { raddr, rkey }
        };
        let before = b.dev.qp_counters(b.qp.qpn).unwrap();
        a.qp.post(o, Data::Sges(&sge), true);
        a.qp.ring();
        let c = next(&sim, &[&a.dev, &b.dev], &mut a.scq);
        assert_eq!(c.status, WcStatus::RemAccessErr, "{op}");
        let after = b.dev.qp_counters(b.qp.qpn).unwrap();
        assert_eq!(
            after.naks_sent.remote_access,
            before.naks_sent.remote_access + 1,
            "{op}"
        );
        assert_eq!(b.dev.query_qp(b.qp.qpn).unwrap().0, softnic::QpState::Err);
        assert!(
            mem.iter().all(|&x| x == 0x5a),
            "{op}: deregistered memory was written"
        );
        let mut back = vec![0u8; 4096];
        a.buf.read(0, &mut back);
        assert!(
            back.iter().all(|&x| x == 0xa5),
            "{op}: deregistered memory was read"
        );
        let events: Vec<_> = std::iter::from_fn(|| b.dev.events().poll()).collect();
        assert!(
            events.contains(&softnic::AsyncEvent::QpAccessError { qpn: b.qp.qpn }),
            "{op}: {events:?}"
        );
    }
}

/// Bad opcode sequences, each the next PSN the responder expects from its real peer: a NAK
/// invalid request (IBA 9.7.5.1.3, class C: rxe's "missing opcode FIRST" and "missing
/// opcode LAST"), the QP in error, and nothing written where it should not be.
#[test]
fn bad_opcode_sequences_are_naked_as_invalid_requests_never_executed() {
    let mtu_payload = vec![0x77u8; 1024];
    // (opcode, carries a RETH, payload bytes) per packet, in PSN order.
    type Packets = Vec<(u8, bool, usize)>;
    let cases: [(&str, Packets); 4] = [
        (
            "SEND MIDDLE without FIRST",
            vec![(opcode::SEND_MIDDLE, false, 1024)],
        ),
        (
            "SEND LAST after an ONLY",
            vec![
                (opcode::SEND_ONLY, false, 64),
                (opcode::SEND_LAST, false, 64),
            ],
        ),
        (
            "WRITE FIRST then SEND MIDDLE",
            vec![
                (opcode::WRITE_FIRST, true, 1024),
                (opcode::SEND_MIDDLE, false, 1024),
            ],
        ),
        (
            "READ inside a SEND",
            vec![
                (opcode::SEND_FIRST, false, 1024),
                (opcode::READ_REQUEST, true, 0),
            ],
        ),
    ];
    for (name, packets) in cases {
        let (sim, a, mut b) = pair_with(
            seed(81),
            Duration::from_micros(2),
            QpSizes::default(),
            ConnectOptions::default(),
        );
        // A receive WQE over the second half of the buffer; the WRITE aims at the first.
        b.qp.post_recv(&[b.buf.sge(8192, 8192)]);
        let before = b.dev.qp_counters(b.qp.qpn).unwrap();
        let n = packets.len();
        for (i, &(op, has_reth, len)) in packets.iter().enumerate() {
            let reth = has_reth.then(|| (b.buf.addr(0), b.buf.keys.rkey, 4096));
            let p = request(
                op,
                b.qp.qpn,
                FIRST_PSN.wrapping_add(i as u32) & 0x00ff_ffff,
                reth,
                &mtu_payload[..len],
                a.dev.addr(),
                b.dev.addr(),
                a.qp.qpn,
            );
            let sport = rxe_source_port(a.qp.qpn);
            assert!(sim
                .fabric
                .inject(0, b.dev.addr(), sport, &p, sim.clock.now()));
            sim.run_until(&[&a.dev, &b.dev], Duration::from_micros(100), || false);
        }
        let after = b.dev.qp_counters(b.qp.qpn).unwrap();
        assert_eq!(after.rx_packets, before.rx_packets + n as u64, "{name}");
        assert_eq!(
            after.naks_sent.invalid_request,
            before.naks_sent.invalid_request + 1,
            "{name}: {after:?}"
        );
        assert_eq!(
            b.dev.query_qp(b.qp.qpn).unwrap().0,
            softnic::QpState::Err,
            "{name}"
        );
        // Only what a valid first packet carried may have landed: a SEND ONLY's 64 bytes, a
        // SEND FIRST's or WRITE FIRST's MTU; never the packet out of sequence.
        let mut recv = vec![0u8; 8192];
        b.buf.read(8192, &mut recv);
        let landed = recv.iter().take_while(|&&x| x == 0x77).count();
        let expected = match packets[0].0 {
            opcode::SEND_ONLY => 64,
            opcode::SEND_FIRST => 1024,
            _ => 0,
        };
        assert_eq!(landed, expected, "{name}: receive buffer");
        assert!(recv[expected..].iter().all(|&x| x == 0), "{name}");
        let mut target = vec![0u8; 4096];
        b.buf.read(0, &mut target);
        let expected = if packets[0].0 == opcode::WRITE_FIRST {
            1024
        } else {
            0
        };
        assert_eq!(
            target.iter().take_while(|&&x| x == 0x77).count(),
            expected,
            "{name}: WRITE target"
        );
        assert!(target[expected..].iter().all(|&x| x == 0), "{name}");
        // The receive WQE the broken SEND held ends in an error completion, never a success.
        while let Some(c) = b.rcq.poll() {
            assert!(
                c.status != WcStatus::Success || name == "SEND LAST after an ONLY",
                "{name}: {c:?}"
            );
        }
    }
}

/// Injects `p` as the peer `a` would send it, and runs the simulation for 100 virtual us.
fn inject_from_peer(sim: &Sim, a: &Node, b: &Node, p: &[u8]) {
    let sport = rxe_source_port(a.qp.qpn);
    assert!(sim
        .fabric
        .inject(0, b.dev.addr(), sport, p, sim.clock.now()));
    sim.run_until(&[&a.dev, &b.dev], Duration::from_micros(100), || false);
}

/// A READ request from `a` to `b` at `psn` for `len` bytes at `b`'s buffer offset `offset`.
fn read_request(a: &Node, b: &Node, psn: u32, offset: usize, rkey: u32, len: u32) -> Vec<u8> {
    request(
        opcode::READ_REQUEST,
        b.qp.qpn,
        psn & 0x00ff_ffff,
        Some((b.buf.addr(offset), rkey, len)),
        &[],
        a.dev.addr(),
        b.dev.addr(),
        a.qp.qpn,
    )
}

/// Duplicate READs are answered from the last `max_dest_rd_atomic` READs recorded, as rxe
/// does, never from what the duplicate asks: a peer cannot read what no READ was granted, nor
/// make the responder send without bound with duplicates.
#[test]
fn a_duplicate_read_is_answered_only_from_the_recorded_reads() {
    let o = ConnectOptions {
        rd_atomic: 2,
        ..ConnectOptions::default()
    };
    let (sim, mut a, b) = pair_with(seed(83), Duration::from_micros(2), QpSizes::default(), o);
    // READ 1: 4 packets (PSNs +0..+3); READs 2 and 3: one packet each (+4, +5).
    for (offset, len) in [(0usize, 4096u32), (4096, 1024), (8192, 1024)] {
        let sge = [a.buf.sge(offset, len)];
        a.qp.post(
            Op::Read {
                raddr: b.buf.addr(offset),
                rkey: b.buf.keys.rkey,
            },
            Data::Sges(&sge),
            true,
        );
        a.qp.ring();
        assert_eq!(
            next(&sim, &[&a.dev, &b.dev], &mut a.scq).status,
            WcStatus::Success
        );
    }
    let rkey = b.buf.keys.rkey;
    let cases: [(&str, Vec<u8>, u64); 6] = [
        // The first READ is no longer recorded: only the last two are.
        (
            "the oldest READ, evicted",
            read_request(&a, &b, FIRST_PSN, 0, rkey, 4096),
            0,
        ),
        (
            "a recorded READ's PSN asking for 64 KiB",
            read_request(&a, &b, FIRST_PSN + 5, 8192, rkey, 65536),
            0,
        ),
        (
            "a recorded READ's PSN asking elsewhere",
            read_request(&a, &b, FIRST_PSN + 5, 0, rkey, 1024),
            0,
        ),
        (
            "a recorded READ's PSN with another rkey",
            read_request(&a, &b, FIRST_PSN + 5, 8192, rkey ^ 1, 1024),
            0,
        ),
        (
            "the newest READ as it was",
            read_request(&a, &b, FIRST_PSN + 5, 8192, rkey, 1024),
            1,
        ),
        // The one before: answered again, and the newest after it (PSN order).
        (
            "the READ before it",
            read_request(&a, &b, FIRST_PSN + 4, 4096, rkey, 1024),
            2,
        ),
    ];
    for (name, p, responses) in cases {
        let before = b.dev.qp_counters(b.qp.qpn).unwrap();
        inject_from_peer(&sim, &a, &b, &p);
        let after = b.dev.qp_counters(b.qp.qpn).unwrap();
        assert_eq!(
            after.duplicate_requests,
            before.duplicate_requests + 1,
            "{name}"
        );
        assert_eq!(
            after.tx_packets - before.tx_packets,
            responses,
            "{name}: {after:?}"
        );
        assert_eq!(
            after.unmatched_duplicates - before.unmatched_duplicates,
            u64::from(responses == 0),
            "{name}"
        );
    }
    // Nothing the peer did broke the connection.
    assert_eq!(write_and_wait(&sim, &mut a, &b, 1024), WcStatus::Success);
}

#[test]
fn more_reads_outstanding_than_max_dest_rd_atomic_are_an_invalid_request() {
    let o = ConnectOptions {
        rd_atomic: 2,
        ..ConnectOptions::default()
    };
    let (sim, a, b) = pair_with(seed(84), Duration::from_micros(2), QpSizes::default(), o);
    let sport = rxe_source_port(a.qp.qpn);
    for i in 0..3 {
        let p = read_request(&a, &b, FIRST_PSN + i, 0, b.buf.keys.rkey, 1024);
        assert!(sim
            .fabric
            .inject(0, b.dev.addr(), sport, &p, sim.clock.now()));
    }
    sim.run_until(&[&a.dev, &b.dev], Duration::from_micros(100), || false);
    let c = b.dev.qp_counters(b.qp.qpn).unwrap();
    assert_eq!(c.naks_sent.invalid_request, 1, "{c:?}");
    assert_eq!(b.dev.query_qp(b.qp.qpn).unwrap().0, softnic::QpState::Err);
}

/// A WRITE or READ longer than 2^31 bytes (the longest message, as rxe) is an invalid
/// request, named as such before any rkey is looked at.
#[test]
fn a_write_or_read_longer_than_2_gib_is_an_invalid_request() {
    for op in [opcode::WRITE_FIRST, opcode::READ_REQUEST] {
        let (sim, a, b) = pair_with(
            seed(85),
            Duration::from_micros(2),
            QpSizes::default(),
            ConnectOptions::default(),
        );
        let payload = if op == opcode::WRITE_FIRST { 1024 } else { 0 };
        let p = request(
            op,
            b.qp.qpn,
            FIRST_PSN,
            Some((b.buf.addr(0), b.buf.keys.rkey, (1 << 31) + 1)),
            &vec![0x11; payload],
            a.dev.addr(),
            b.dev.addr(),
            a.qp.qpn,
        );
        inject_from_peer(&sim, &a, &b, &p);
        let c = b.dev.qp_counters(b.qp.qpn).unwrap();
        assert_eq!(c.naks_sent.invalid_request, 1, "{op:#x}: {c:?}");
        assert_eq!(c.naks_sent.remote_access, 0, "{op:#x}: {c:?}");
        let mut got = [0u8; 1024];
        b.buf.read(0, &mut got);
        assert_eq!(got, [0u8; 1024], "{op:#x}");
    }
}

/// A 1 GiB READ is answered a budget of packets per engine round, never built whole under the
/// device lock: another QP's WRITE completes while it is answered, and a `dereg_mr` of its
/// MR in the middle ends it (remote access NAK) with no byte of the MR sent after.
#[test]
fn a_1_gib_read_is_answered_across_rounds_while_another_qp_and_dereg_mr_progress() {
    const LEN: usize = 1 << 30;
    let o = ConnectOptions {
        mtu: PathMtu::Mtu4096,
        ..ConnectOptions::default()
    };
    let (sim, mut a, b) = pair_with(seed(86), Duration::from_micros(2), QpSizes::default(), o);
    let (acq, bcq) = (
        HarnessCq::new(&a.dev, 1024, None).unwrap(),
        HarnessCq::new(&b.dev, 1024, None).unwrap(),
    );
    let mut acq = acq;
    let mut qa = HarnessQp::new(&a.dev, a.pd, &acq, &acq, QpSizes::default()).unwrap();
    let qb = HarnessQp::new(&b.dev, b.pd, &bcq, &bcq, QpSizes::default()).unwrap();
    bring_up(&a.dev, qa.qpn, b.dev.addr(), qb.qpn, &o).unwrap();
    bring_up(&b.dev, qb.qpn, a.dev.addr(), qa.qpn, &o).unwrap();
    // calloc'd: only the pages the READ reaches are ever touched.
    let mut src = vec![0u8; LEN];
    let mut dst = vec![0u8; LEN];
    src[..8].copy_from_slice(b"railshft");
    // SAFETY: both vectors outlive their registrations (deregistered below).
    let read = unsafe { WholeRead::register(&a, &b, &mut src, &mut dst) };
    read.post(&mut a.qp);
    a.qp.ring();
    let total_packets = (LEN / 4096) as u64;
    let read_tx = || b.dev.qp_counters(b.qp.qpn).unwrap().tx_packets;
    // One round of each device, then 1 us of virtual time; returns b's READ responses sent.
    let round = || {
        let now = sim.clock.now();
        a.dev.progress(now);
        let before = read_tx();
        b.dev.progress(now);
        sim.clock.advance_by(Duration::from_micros(1));
        read_tx() - before
    };
    let mut max_per_round = 0;
    while read_tx() < 2000 {
        max_per_round = round().max(max_per_round);
    }
    assert!(
        max_per_round <= 256,
        "{max_per_round} READ responses in one round: built under the lock"
    );
    // Another QP of the same devices moves a WRITE while the READ is answered.
    a.buf.write(0, &[0x42; 4096]);
    qa.post(
        Op::Write {
            raddr: b.buf.addr(0),
            rkey: b.buf.keys.rkey,
        },
        Data::Sges(&[a.buf.sge(0, 4096)]),
        true,
    );
    qa.ring();
    let mut write_done = None;
    for _ in 0..1000 {
        round();
        write_done = acq.poll();
        if write_done.is_some() {
            break;
        }
    }
    assert_eq!(write_done.map(|c| c.status), Some(WcStatus::Success));
    assert!(a.scq.poll().is_none(), "the READ completed first");
    let sent = read_tx();
    assert!(
        sent < total_packets,
        "{sent} of {total_packets} sent already"
    );
    let mut got = [0u8; 4096];
    b.buf.read(0, &mut got);
    assert_eq!(got, [0x42; 4096]);
    // dereg_mr in the middle: the next response is a remote access NAK, and nothing after.
    b.dev.dereg_mr(read.src.lkey).unwrap();
    let at_dereg = read_tx();
    let mut read_done = None;
    for _ in 0..1000 {
        round();
        read_done = a.scq.poll();
        if read_done.is_some() {
            break;
        }
    }
    assert_eq!(read_done.map(|c| c.status), Some(WcStatus::RemAccessErr));
    let c = b.dev.qp_counters(b.qp.qpn).unwrap();
    assert_eq!(
        c.tx_packets,
        at_dereg + 1,
        "only the NAK after dereg_mr: {c:?}"
    );
    assert_eq!(c.naks_sent.remote_access, 1, "{c:?}");
    let mut first = [0u8; 8];
    first.copy_from_slice(&dst[..8]);
    a.dev.dereg_mr(read.dst.lkey).unwrap();
    assert_eq!(&first, b"railshft");
    drop((src, dst));
}

/// Response opcodes and AETH syndromes these tests forge (IBA tables 38 and 43).
mod response {
    pub const READ_RESPONSE_ONLY: u8 = 0x10;
    pub const ACKNOWLEDGE: u8 = 0x11;
    pub const ATOMIC_ACKNOWLEDGE: u8 = 0x12;
    pub const ACK: u8 = 0x1f;
    pub const NAK_REMOTE_ACCESS: u8 = 0x62;
}

/// A response packet from `b` to `a` as a forger on `b`'s address would send it: BTH, AETH
/// (`syndrome`, `msn`), `tail` (atomic ACK ETH or READ payload), a correct ICRC, from
/// `src_port`.
fn response_packet(
    opcode: u8,
    a: &Node,
    b: &Node,
    psn: u32,
    (syndrome, msn): (u8, u32),
    tail: &[u8],
    src_port: u16,
) -> Vec<u8> {
    let mut p = vec![0u8; 12];
    p[0] = opcode;
    p[2..4].copy_from_slice(&[0xff, 0xff]);
    p[5..8].copy_from_slice(&a.qp.qpn.to_be_bytes()[1..]);
    p[8..12].copy_from_slice(&(psn & 0x00ff_ffff).to_be_bytes());
    p.extend_from_slice(&((u32::from(syndrome) << 24) | (msn & 0x00ff_ffff)).to_be_bytes());
    p.extend_from_slice(tail);
    p.extend_from_slice(&[0; 4]);
    with_icrc(p, b.dev.addr(), a.dev.addr(), src_port)
}

/// Injects `p` at `a` as if from `b`'s address and UDP port `src_port`, and runs 100 virtual us.
fn inject_at_requester(sim: &Sim, a: &Node, b: &Node, p: &[u8], src_port: u16) {
    assert!(sim
        .fabric
        .inject(1, a.dev.addr(), src_port, p, sim.clock.now()));
    sim.run_until(&[&a.dev, &b.dev], Duration::from_micros(100), || false);
}

/// Posts a signaled 64-byte WRITE from `a`'s buffer at `offset` to `b`'s, and rings.
fn post_write(a: &mut Node, b: &Node, offset: usize) {
    let sge = [a.buf.sge(offset, 64)];
    a.qp.post(
        Op::Write {
            raddr: b.buf.addr(offset),
            rkey: b.buf.keys.rkey,
        },
        Data::Sges(&sge),
        true,
    );
    a.qp.ring();
}

/// Nothing from `a` reaches `b` until `until` (virtual time).
fn cut_a_to_b(sim: &Sim, until: Duration) {
    let mut rule = softnic::fabric::FaultRule::always(softnic::fabric::Fault::Partition);
    rule.from = Some(0);
    rule.to = Some(1);
    rule.start = sim.clock.now();
    rule.end = Some(until);
    sim.fabric.add_rule(rule);
}

/// A fatal NAK whose PSN is not outstanding (behind the oldest unacknowledged PSN, or never
/// sent) is dropped and counted: it was acted on behind the window, and one such NAK from a
/// host that only knew the addresses and the QPN ended the connection.
#[test]
fn a_fatal_nak_whose_psn_is_not_outstanding_is_dropped_and_the_write_completes() {
    let (sim, mut a, b) = pair_with(
        seed(90),
        Duration::from_micros(2),
        QpSizes::default(),
        ConnectOptions::default(),
    );
    let bport = rxe_source_port(b.qp.qpn);
    cut_a_to_b(&sim, sim.clock.now() + Duration::from_millis(1));
    a.buf.write(0, &[0x5a; 64]);
    post_write(&mut a, &b, 0);
    let before = a.dev.qp_counters(a.qp.qpn).unwrap();
    for psn in [
        FIRST_PSN - 1,
        FIRST_PSN - 1000,
        FIRST_PSN + 1,
        FIRST_PSN ^ 0x80_0000,
    ] {
        let nak = response_packet(
            response::ACKNOWLEDGE,
            &a,
            &b,
            psn,
            (response::NAK_REMOTE_ACCESS, 0),
            &[],
            bport,
        );
        inject_at_requester(&sim, &a, &b, &nak, bport);
    }
    let after = a.dev.qp_counters(a.qp.qpn).unwrap();
    assert_eq!(
        after.response_psn_drops - before.response_psn_drops,
        4,
        "{after:?}"
    );
    assert_eq!(after.naks_received, before.naks_received, "{after:?}");
    // The WRITE is retransmitted after the cut and completes; its bytes land.
    let c = next(&sim, &[&a.dev, &b.dev], &mut a.scq);
    assert_eq!(c.status, WcStatus::Success);
    let mut got = [0u8; 64];
    b.buf.read(0, &mut got);
    assert_eq!(got, [0x5a; 64]);
}

/// A READ response or an atomic ACK at the PSN of an outstanding WRITE does not fit the
/// request sent there: dropped and counted. Before, either one acknowledged every PSN before
/// it, so a WRITE that never reached the peer completed successfully.
#[test]
fn a_read_response_or_atomic_ack_for_a_write_is_dropped_and_acknowledges_nothing() {
    let (sim, mut a, b) = pair_with(
        seed(91),
        Duration::from_micros(2),
        QpSizes::default(),
        ConnectOptions::default(),
    );
    let bport = rxe_source_port(b.qp.qpn);
    cut_a_to_b(&sim, sim.clock.now() + Duration::from_millis(1));
    a.buf.write(0, &[0x11; 64]);
    a.buf.write(64, &[0x22; 64]);
    post_write(&mut a, &b, 0);
    post_write(&mut a, &b, 64);
    sim.run_until(&[&a.dev, &b.dev], Duration::from_micros(50), || false);
    let before = a.dev.qp_counters(a.qp.qpn).unwrap();
    let forged = [
        response_packet(
            response::READ_RESPONSE_ONLY,
            &a,
            &b,
            FIRST_PSN + 1,
            (response::ACK, 1),
            &[0xee; 64],
            bport,
        ),
        response_packet(
            response::ATOMIC_ACKNOWLEDGE,
            &a,
            &b,
            FIRST_PSN + 1,
            (response::ACK, 1),
            &[0xee; 8],
            bport,
        ),
    ];
    for p in &forged {
        inject_at_requester(&sim, &a, &b, p, bport);
    }
    let after = a.dev.qp_counters(a.qp.qpn).unwrap();
    assert_eq!(
        after.response_opcode_drops - before.response_opcode_drops,
        2,
        "{after:?}"
    );
    assert!(
        a.scq.poll().is_none(),
        "a WRITE completed that never reached the peer"
    );
    for _ in 0..2 {
        assert_eq!(
            next(&sim, &[&a.dev, &b.dev], &mut a.scq).status,
            WcStatus::Success
        );
    }
    let mut got = [0u8; 128];
    b.buf.read(0, &mut got);
    assert_eq!(&got[..64], &[0x11; 64]);
    assert_eq!(&got[64..], &[0x22; 64]);
}

/// A fatal NAK at an outstanding PSN must also carry the MSN the responder would: the count
/// of messages before that PSN. A forged one with another MSN is dropped and counted (it
/// ended the connection); the right MSN at the right PSN is acted on, as the peer's own.
#[test]
fn a_fatal_nak_with_the_wrong_msn_is_dropped_and_the_right_one_is_acted_on() {
    let (sim, mut a, b) = pair_with(
        seed(92),
        Duration::from_micros(2),
        QpSizes::default(),
        ConnectOptions::default(),
    );
    let bport = rxe_source_port(b.qp.qpn);
    assert_eq!(write_and_wait(&sim, &mut a, &b, 64), WcStatus::Success);
    // One message done: the next WRITE (at FIRST_PSN + 1) is message 1.
    cut_a_to_b(&sim, sim.clock.now() + Duration::from_millis(1));
    post_write(&mut a, &b, 0);
    let before = a.dev.qp_counters(a.qp.qpn).unwrap();
    for msn in [0, 2, 0x00ff_ffff, 0x12_3456] {
        let nak = response_packet(
            response::ACKNOWLEDGE,
            &a,
            &b,
            FIRST_PSN + 1,
            (response::NAK_REMOTE_ACCESS, msn),
            &[],
            bport,
        );
        inject_at_requester(&sim, &a, &b, &nak, bport);
    }
    let after = a.dev.qp_counters(a.qp.qpn).unwrap();
    assert_eq!(after.nak_msn_drops - before.nak_msn_drops, 4, "{after:?}");
    assert_eq!(
        next(&sim, &[&a.dev, &b.dev], &mut a.scq).status,
        WcStatus::Success
    );
    // Message 2 at FIRST_PSN + 2: a NAK with MSN 2 is what the peer would send.
    cut_a_to_b(&sim, sim.clock.now() + Duration::from_millis(1));
    post_write(&mut a, &b, 0);
    let nak = response_packet(
        response::ACKNOWLEDGE,
        &a,
        &b,
        FIRST_PSN + 2,
        (response::NAK_REMOTE_ACCESS, 2),
        &[],
        bport,
    );
    inject_at_requester(&sim, &a, &b, &nak, bport);
    assert_eq!(
        next(&sim, &[&a.dev, &b.dev], &mut a.scq).status,
        WcStatus::RemAccessErr
    );
}

/// Once a QP has heard its peer, packets from the peer's address but another UDP port are
/// dropped and counted, requests and responses alike: a forged NAK with the right PSN and
/// MSN ended the connection, and a forged WRITE at the expected PSN landed.
#[test]
fn packets_from_the_peer_address_but_another_port_are_dropped() {
    let (sim, mut a, b) = pair_with(
        seed(93),
        Duration::from_micros(2),
        QpSizes::default(),
        ConnectOptions::default(),
    );
    let (aport, bport) = (rxe_source_port(a.qp.qpn), rxe_source_port(b.qp.qpn));
    assert_eq!(write_and_wait(&sim, &mut a, &b, 64), WcStatus::Success);
    let write = request(
        opcode::WRITE_ONLY,
        b.qp.qpn,
        FIRST_PSN + 1,
        Some((b.buf.addr(4096), b.buf.keys.rkey, 64)),
        &[0xee; 64],
        a.dev.addr(),
        b.dev.addr(),
        a.qp.qpn,
    );
    // `request` computed the ICRC for `aport`; this one is sent from another port.
    let write = with_icrc(write, a.dev.addr(), b.dev.addr(), aport ^ 1);
    assert!(sim
        .fabric
        .inject(0, b.dev.addr(), aport ^ 1, &write, sim.clock.now()));
    sim.run_until(&[&a.dev, &b.dev], Duration::from_micros(100), || false);
    cut_a_to_b(&sim, sim.clock.now() + Duration::from_millis(1));
    a.buf.write(0, &[0x33; 64]);
    post_write(&mut a, &b, 0);
    let nak = response_packet(
        response::ACKNOWLEDGE,
        &a,
        &b,
        FIRST_PSN + 1,
        (response::NAK_REMOTE_ACCESS, 1),
        &[],
        bport ^ 1,
    );
    inject_at_requester(&sim, &a, &b, &nak, bport ^ 1);
    let (ca, cb) = (
        a.dev.qp_counters(a.qp.qpn).unwrap(),
        b.dev.qp_counters(b.qp.qpn).unwrap(),
    );
    assert_eq!(ca.source_port_drops, 1, "{ca:?}");
    assert_eq!(cb.source_port_drops, 1, "{cb:?}");
    let mut got = [0u8; 64];
    b.buf.read(4096, &mut got);
    assert_eq!(got, [0u8; 64], "the forged WRITE landed");
    assert_eq!(
        next(&sim, &[&a.dev, &b.dev], &mut a.scq).status,
        WcStatus::Success
    );
    b.buf.read(0, &mut got);
    assert_eq!(got, [0x33; 64]);
}

/// QPNs are drawn at random over the 24-bit space: an off-path host cannot take a QP's number
/// from its creation order (every device's first QP was 0x11, the next 0x12, ...).
#[test]
fn qpns_are_random_24_bit_numbers_not_a_sequence() {
    let sim = Sim::new(seed(94), Duration::from_micros(2));
    let mut firsts = Vec::new();
    for n in 1..=4u8 {
        let node = Node::new(
            sim.device(&format!("d{n}"), n).unwrap(),
            4096,
            QpSizes::default(),
        )
        .unwrap();
        let cq = HarnessCq::new(&node.dev, 16, None).unwrap();
        let qps: Vec<HarnessQp> = (0..64)
            .map(|_| HarnessQp::new(&node.dev, node.pd, &cq, &cq, QpSizes::default()).unwrap())
            .collect();
        let mut qpns: Vec<u32> = qps.iter().map(|q| q.qpn).collect();
        qpns.push(node.qp.qpn);
        firsts.push(node.qp.qpn);
        assert!(
            qpns.iter().all(|&q| (2..0x00ff_ffff).contains(&q)),
            "{qpns:x?}"
        );
        let sequential = qpns.windows(2).filter(|w| w[1] == w[0] + 1).count();
        assert!(sequential < 2, "{sequential} consecutive pairs: {qpns:x?}");
        qpns.sort_unstable();
        qpns.dedup();
        assert_eq!(qpns.len(), 65, "a QPN given twice");
        // 65 draws over 2^24: the spread covers most of the space.
        assert!(qpns[64] - qpns[0] > 1 << 23, "{qpns:x?}");
    }
    firsts.sort_unstable();
    firsts.dedup();
    assert_eq!(firsts.len(), 4, "devices' first QPNs agree: {firsts:x?}");
}
