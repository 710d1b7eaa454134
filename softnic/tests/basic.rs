//! Each opcode and each WQE feature once, end to end on a fault-free fabric with manual
//! progress and a virtual clock.

mod common;

use std::time::Duration;

use common::{next, pattern};
use hw_defs::mlx5::CqeOpcode;
use hw_defs::verbs::WcStatus;
use softnic::harness::{ConnectOptions, Data, Node, Op, QpSizes, Sim};

fn pair_with(seed: u64, sizes: QpSizes, o: ConnectOptions) -> (Sim, Node, Node) {
    common::pair_with(seed, Duration::from_micros(2), sizes, o)
}

fn pair() -> (Sim, Node, Node) {
    pair_with(1, QpSizes::default(), ConnectOptions::default())
}

#[test]
fn a_write_lands_in_remote_memory_and_completes_signaled() {
    let (sim, mut a, b) = pair();
    let data = pattern(5000, 1);
    a.buf.write(0, &data);
    let sge = [a.buf.sge(0, data.len() as u32)];
    let idx = a.qp.post(
        Op::Write {
            raddr: b.buf.addr(100),
            rkey: b.buf.keys.rkey,
        },
        Data::Sges(&sge),
        true,
    );
    a.qp.ring();
    let c = next(&sim, &[&a.dev, &b.dev], &mut a.scq);
    assert_eq!(
        (c.opcode, c.status, c.wqe_counter),
        (CqeOpcode::Req, WcStatus::Success, idx)
    );
    let mut got = vec![0u8; data.len()];
    b.buf.read(100, &mut got);
    assert_eq!(got, data);
}

#[test]
fn a_send_fills_a_receive_wqe_across_its_scatter_list() {
    let (sim, mut a, mut b) = pair();
    let data = pattern(3000, 2);
    a.buf.write(0, &data);
    b.qp.post_recv(&[b.buf.sge(0, 1000), b.buf.sge(5000, 4000)]);
    let sge = [a.buf.sge(0, 3000)];
    a.qp.post(Op::SendImm { imm: 0xdead_beef }, Data::Sges(&sge), true);
    a.qp.ring();
    let r = next(&sim, &[&a.dev, &b.dev], &mut b.rcq);
    assert_eq!(
        (r.opcode, r.status, r.byte_count, r.imm, r.wqe_counter),
        (
            CqeOpcode::RespSendImm,
            WcStatus::Success,
            3000,
            0xdead_beef,
            0
        )
    );
    let mut got = vec![0u8; 3000];
    b.buf.read(0, &mut got[..1000]);
    b.buf.read(5000, &mut got[1000..]);
    assert_eq!(got, data);
    assert_eq!(
        next(&sim, &[&a.dev, &b.dev], &mut a.scq).status,
        WcStatus::Success
    );
}

#[test]
fn a_send_without_immediate_reports_resp_send() {
    let (sim, mut a, mut b) = pair();
    b.qp.post_recv(&[b.buf.sge(0, 64)]);
    a.qp.post(Op::Send, Data::Inline(b"hello"), true);
    a.qp.ring();
    let r = next(&sim, &[&a.dev, &b.dev], &mut b.rcq);
    assert_eq!((r.opcode, r.byte_count), (CqeOpcode::RespSend, 5));
    let mut got = [0u8; 5];
    b.buf.read(0, &mut got);
    assert_eq!(&got, b"hello");
}

#[test]
fn write_with_immediate_consumes_a_receive_wqe_and_reports_the_length() {
    let (sim, mut a, mut b) = pair();
    let data = pattern(2500, 3);
    a.buf.write(0, &data);
    b.qp.post_recv(&[b.buf.sge(0, 8)]);
    let sge = [a.buf.sge(0, 2500)];
    a.qp.post(
        Op::WriteImm {
            raddr: b.buf.addr(8192),
            rkey: b.buf.keys.rkey,
            imm: 42,
        },
        Data::Sges(&sge),
        true,
    );
    a.qp.ring();
    let r = next(&sim, &[&a.dev, &b.dev], &mut b.rcq);
    assert_eq!(
        (r.opcode, r.byte_count, r.imm),
        (CqeOpcode::RespWrImm, 2500, 42)
    );
    let mut got = vec![0u8; 2500];
    b.buf.read(8192, &mut got);
    assert_eq!(got, data);
}

#[test]
fn a_read_brings_remote_bytes_into_the_local_scatter_list() {
    let (sim, mut a, b) = pair();
    let data = pattern(4100, 4);
    b.buf.write(300, &data);
    let sges = [a.buf.sge(0, 100), a.buf.sge(1000, 4000)];
    a.qp.post(
        Op::Read {
            raddr: b.buf.addr(300),
            rkey: b.buf.keys.rkey,
        },
        Data::Sges(&sges),
        true,
    );
    a.qp.ring();
    let c = next(&sim, &[&a.dev, &b.dev], &mut a.scq);
    assert_eq!((c.status, c.byte_count), (WcStatus::Success, 4100));
    let mut got = vec![0u8; 4100];
    a.buf.read(0, &mut got[..100]);
    a.buf.read(1000, &mut got[100..]);
    assert_eq!(got, data);
}

#[test]
fn atomics_return_the_original_value_and_update_remote_memory() {
    let (sim, mut a, b) = pair();
    b.buf.write(64, &10u64.to_ne_bytes());
    let s0 = [a.buf.sge(0, 8)];
    let s1 = [a.buf.sge(8, 8)];
    let s2 = [a.buf.sge(16, 8)];
    let rkey = b.buf.keys.rkey;
    a.qp.post(
        Op::FetchAdd {
            raddr: b.buf.addr(64),
            rkey,
            add: 5,
        },
        Data::Sges(&s0),
        true,
    );
    a.qp.post(
        Op::CompareSwap {
            raddr: b.buf.addr(64),
            rkey,
            compare: 15,
            swap: 100,
        },
        Data::Sges(&s1),
        true,
    );
    a.qp.post(
        Op::CompareSwap {
            raddr: b.buf.addr(64),
            rkey,
            compare: 15,
            swap: 7,
        },
        Data::Sges(&s2),
        true,
    );
    a.qp.ring();
    for _ in 0..3 {
        assert_eq!(
            next(&sim, &[&a.dev, &b.dev], &mut a.scq).status,
            WcStatus::Success
        );
    }
    assert_eq!(
        (a.buf.read_u64(0), a.buf.read_u64(8), a.buf.read_u64(16)),
        (10, 15, 100)
    );
    assert_eq!(b.buf.read_u64(64), 100);
}

#[test]
fn unsignaled_wqes_complete_silently_before_a_signaled_one() {
    let (sim, mut a, b) = pair();
    let sge = [a.buf.sge(0, 16)];
    let rkey = b.buf.keys.rkey;
    for i in 0..5 {
        a.qp.post(
            Op::Write {
                raddr: b.buf.addr(i * 16),
                rkey,
            },
            Data::Sges(&sge),
            false,
        );
    }
    let last = a.qp.post(
        Op::Write {
            raddr: b.buf.addr(80),
            rkey,
        },
        Data::Sges(&sge),
        true,
    );
    a.qp.ring();
    let c = next(&sim, &[&a.dev, &b.dev], &mut a.scq);
    assert_eq!(c.wqe_counter, last);
    assert!(a.scq.poll().is_none());
}

#[test]
fn inline_data_that_wraps_the_send_ring_arrives_intact() {
    let sizes = QpSizes {
        sq_bbs: 8,
        max_inline: 200,
        ..QpSizes::default()
    };
    let (sim, mut a, b) = pair_with(2, sizes, ConnectOptions::default());
    let rkey = b.buf.keys.rkey;
    // 200-byte inline WRITEs take 4 BBs each; the ring has 8, so every other one wraps.
    for round in 0..6u8 {
        let data = pattern(200, round as u64);
        a.qp.post(
            Op::Write {
                raddr: b.buf.addr(round as usize * 256),
                rkey,
            },
            Data::Inline(&data),
            true,
        );
        a.qp.ring();
        let c = next(&sim, &[&a.dev, &b.dev], &mut a.scq);
        assert_eq!(c.status, WcStatus::Success);
        let mut got = vec![0u8; 200];
        b.buf.read(round as usize * 256, &mut got);
        assert_eq!(got, data, "round {round}");
    }
}

#[test]
fn a_zero_length_write_needs_no_valid_rkey() {
    let (sim, mut a, mut b) = pair();
    a.qp.post(
        Op::Write {
            raddr: 0,
            rkey: 0xdead,
        },
        Data::Sges(&[]),
        true,
    );
    a.qp.ring();
    assert_eq!(
        next(&sim, &[&a.dev, &b.dev], &mut a.scq).status,
        WcStatus::Success
    );
    b.qp.post_recv(&[b.buf.sge(0, 8)]);
    a.qp.post(
        Op::WriteImm {
            raddr: 0,
            rkey: 0xdead,
            imm: 9,
        },
        Data::Sges(&[]),
        true,
    );
    a.qp.ring();
    let r = next(&sim, &[&a.dev, &b.dev], &mut b.rcq);
    assert_eq!(
        (r.opcode, r.byte_count, r.imm),
        (CqeOpcode::RespWrImm, 0, 9)
    );
    assert_eq!(
        next(&sim, &[&a.dev, &b.dev], &mut a.scq).status,
        WcStatus::Success
    );
}

#[test]
fn a_nop_completes_after_the_work_before_it() {
    let (sim, mut a, b) = pair();
    let sge = [a.buf.sge(0, 16)];
    a.qp.post(
        Op::Write {
            raddr: b.buf.addr(0),
            rkey: b.buf.keys.rkey,
        },
        Data::Sges(&sge),
        false,
    );
    let nop = a.qp.post(Op::Nop, Data::Sges(&[]), true);
    a.qp.ring();
    let c = next(&sim, &[&a.dev, &b.dev], &mut a.scq);
    assert_eq!((c.wqe_counter, c.status), (nop, WcStatus::Success));
}

#[test]
fn nothing_is_fetched_before_the_doorbell() {
    let (sim, mut a, b) = pair();
    let sge = [a.buf.sge(0, 16)];
    a.buf.write(0, &[7u8; 16]);
    a.qp.post(
        Op::Write {
            raddr: b.buf.addr(0),
            rkey: b.buf.keys.rkey,
        },
        Data::Sges(&sge),
        true,
    );
    let mut polled = None;
    sim.run_until(&[&a.dev, &b.dev], Duration::from_millis(100), || {
        polled = polled.or_else(|| a.scq.poll());
        false
    });
    assert!(polled.is_none());
    assert_eq!(b.buf.read_u64(0), 0);
    a.qp.ring();
    assert_eq!(
        next(&sim, &[&a.dev, &b.dev], &mut a.scq).status,
        WcStatus::Success
    );
    assert_eq!(b.buf.read_u64(0), u64::from_ne_bytes([7; 8]));
}

#[test]
fn a_fenced_write_waits_for_the_read_before_it() {
    let (sim, mut a, b) = pair();
    let remote = pattern(2048, 9);
    b.buf.write(0, &remote);
    let rkey = b.buf.keys.rkey;
    let land = [a.buf.sge(4096, 2048)];
    a.qp.post(
        Op::Read {
            raddr: b.buf.addr(0),
            rkey,
        },
        Data::Sges(&land),
        false,
    );
    // Sends what the READ brought back: only right if it waited for the READ to complete.
    a.qp.post_with(
        Op::Write {
            raddr: b.buf.addr(8192),
            rkey,
        },
        Data::Sges(&land),
        true,
        hw_defs::mlx5::FenceMode::SmallAndFence,
    );
    a.qp.ring();
    assert_eq!(
        next(&sim, &[&a.dev, &b.dev], &mut a.scq).status,
        WcStatus::Success
    );
    let mut got = vec![0u8; 2048];
    b.buf.read(8192, &mut got);
    assert!(got == remote);
}

#[test]
fn reads_beyond_max_rd_atomic_wait_their_turn_and_all_complete() {
    let o = ConnectOptions {
        rd_atomic: 1,
        ..Default::default()
    };
    let (sim, mut a, b) = pair_with(4, QpSizes::default(), o);
    let rkey = b.buf.keys.rkey;
    for i in 0..8usize {
        b.buf.write(i * 4096, &pattern(3000, i as u64));
        let s = [a.buf.sge(i * 4096, 3000)];
        a.qp.post(
            Op::Read {
                raddr: b.buf.addr(i * 4096),
                rkey,
            },
            Data::Sges(&s),
            i == 7,
        );
    }
    a.qp.ring();
    assert_eq!(
        next(&sim, &[&a.dev, &b.dev], &mut a.scq).status,
        WcStatus::Success
    );
    for i in 0..8usize {
        let mut got = vec![0u8; 3000];
        a.buf.read(i * 4096, &mut got);
        assert!(got == pattern(3000, i as u64), "read {i}");
    }
}

/// A fenced WQE that go-back-N sends again must not wait for the READs posted after it (the
/// ones before it had completed when it was first sent): it waited for a READ behind it
/// forever, until the retries ran out (found by the pmd's seeded simulation).
#[test]
fn a_fenced_write_sent_again_does_not_wait_for_a_later_read() {
    let (sim, mut a, b) = pair();
    let rkey = b.buf.keys.rkey;
    b.buf.write(0, &pattern(512, 3));
    let first = [a.buf.sge(0, 512)];
    a.qp.post(
        Op::Read {
            raddr: b.buf.addr(0),
            rkey,
        },
        Data::Sges(&first),
        true,
    );
    a.qp.ring();
    assert_eq!(
        next(&sim, &[&a.dev, &b.dev], &mut a.scq).status,
        WcStatus::Success
    );
    // Everything B answers for the next 10 ms is lost: the fenced WRITE's ACK and the later
    // READ's response. The ACK timer (67 ms) then sends both again.
    let now = sim.clock.now();
    sim.fabric.add_rule(softnic::FaultRule {
        fault: softnic::Fault::Partition,
        from: Some(1),
        to: Some(0),
        start: now,
        end: Some(now + Duration::from_millis(10)),
    });
    a.qp.post_with(
        Op::Write {
            raddr: b.buf.addr(8192),
            rkey,
        },
        Data::Sges(&first),
        true,
        hw_defs::mlx5::FenceMode::SmallAndFence,
    );
    let second = [a.buf.sge(4096, 512)];
    a.qp.post(
        Op::Read {
            raddr: b.buf.addr(0),
            rkey,
        },
        Data::Sges(&second),
        true,
    );
    a.qp.ring();
    for what in ["the fenced WRITE", "the later READ"] {
        let c = next(&sim, &[&a.dev, &b.dev], &mut a.scq);
        assert_eq!(c.status, WcStatus::Success, "{what}: {c:?}");
    }
}

/// The device keeps decoded copies only of the WQEs it has fetched and not completed: an idle
/// QP keeps 16, and a burst that leaves 100 outstanding grows them (doubling) to 128, while
/// the WQEs already fetched keep their places: every WRITE lands and completes in order.
#[test]
fn decoded_send_wqes_grow_with_the_wqes_outstanding_not_with_the_ring() {
    let (sim, mut a, b) = pair();
    let slots = |a: &Node| a.dev.decoded_send_slots(a.qp.qpn).unwrap();
    assert_eq!(slots(&a), 16, "an idle QP of a 256-block ring");
    let rkey = b.buf.keys.rkey;
    let data = pattern(110 * 8, 9);
    a.buf.write(0, &data);
    let post = |a: &mut Node, i: usize| {
        let sge = [a.buf.sge(i * 8, 8)];
        a.qp.post(
            Op::Write {
                raddr: b.buf.addr(i * 8),
                rkey,
            },
            Data::Sges(&sge),
            true,
        )
    };
    // Ten first, completed, so that the burst's window starts mid-ring and wraps it.
    for i in 0..10 {
        post(&mut a, i);
    }
    a.qp.ring();
    for _ in 0..10 {
        assert_eq!(
            next(&sim, &[&a.dev, &b.dev], &mut a.scq).status,
            WcStatus::Success
        );
    }
    let burst: Vec<u16> = (10..110).map(|i| post(&mut a, i)).collect();
    a.qp.ring();
    for (n, &index) in burst.iter().enumerate() {
        let c = next(&sim, &[&a.dev, &b.dev], &mut a.scq);
        assert_eq!(
            (c.status, c.wqe_counter),
            (WcStatus::Success, index),
            "completion {n} of the burst"
        );
    }
    assert_eq!(slots(&a), 128, "grown to hold 100 outstanding");
    let mut landed = vec![0u8; data.len()];
    b.buf.read(0, &mut landed);
    assert_eq!(landed, data);
}
