//! Every opcode, 1,000 operations each, under 10% drop plus reordering and duplication on the
//! fabric, with manual progress on a virtual clock: every byte checked, atomics exactly once.
//! Set SOFTNIC_SEED to replay a failing seed (it is printed on failure).

mod common;

use std::collections::VecDeque;
use std::time::Duration;

use common::{pair_with, pattern, seed, SeedGuard};
use hw_defs::mlx5::CqeOpcode;
use hw_defs::verbs::WcStatus;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use softnic::harness::{Completion, ConnectOptions, Data, Node, Op, QpSizes, Sim};
use softnic::{Counters, FabricStats, Fault, FaultRule};

const OPS: u64 = 1000;
const WINDOW: usize = 24;
const SLOTS: usize = 64;
const SLOT: usize = 8192;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Write,
    WriteImm,
    Send,
    SendImm,
    Read,
    CompareSwap,
    FetchAdd,
}

struct Posted {
    id: u64,
    index: u16,
    slot: usize,
    len: usize,
    offset: usize,
}

fn lossy_pair(seed: u64) -> (Sim, Node, Node) {
    let o = ConnectOptions {
        timeout: 8,
        retry_cnt: 7,
        rnr_retry: 7,
        ..Default::default()
    };
    let sizes = QpSizes {
        sq_bbs: 256,
        rq_wqes: 256,
        rq_sges: 1,
        max_inline: 64,
        max_send_sge: 2,
    };
    let (sim, a, b) = pair_with(seed, Duration::from_micros(2), sizes, o);
    sim.fabric.add_rule(FaultRule::always(Fault::Drop(0.10)));
    sim.fabric.add_rule(FaultRule::always(Fault::Reorder {
        probability: 0.10,
        max_delay: Duration::from_micros(20),
    }));
    sim.fabric
        .add_rule(FaultRule::always(Fault::Duplicate(0.05)));
    (sim, a, b)
}

/// Runs the workload; returns what a replay must reproduce exactly.
fn run(kind: Kind, default_seed: u64) -> (Counters, Counters, FabricStats, Duration) {
    let seed = seed(default_seed);
    let _guard = SeedGuard(seed);
    let (sim, mut a, mut b) = lossy_pair(seed);
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
    let rkey = b.buf.keys.rkey;
    // READ sources: every slot of b holds a known pattern.
    if kind == Kind::Read {
        for s in 0..SLOTS {
            b.buf.write(s * SLOT, &pattern(SLOT, 1_000_000 + s as u64));
        }
    }
    let atomic_target = b.buf.addr(SLOTS * SLOT);
    let mut outstanding: VecDeque<Posted> = VecDeque::new();
    let mut sends: VecDeque<(u64, usize)> = VecDeque::new();
    let mut next_id = 0u64;
    let mut done = 0u64;
    let mut originals = Vec::new();
    let mut recv_imms = Vec::new();
    let mut recv_posted = 0u64;
    let needs_recv = matches!(kind, Kind::Send | Kind::SendImm | Kind::WriteImm);
    let mut idle_rounds = 0;
    while done < OPS {
        // Keep the receive queue stocked (each receive WQE owns a slot of b).
        while needs_recv && recv_posted < OPS && recv_posted < done + 128 {
            let s = (recv_posted as usize) % SLOTS;
            b.qp.post_recv(&[b.buf.sge(s * SLOT, SLOT as u32)]);
            recv_posted += 1;
        }
        // Post a burst, the last of it signaled.
        let burst = rng.random_range(1..=8usize);
        let mut posted = 0;
        while outstanding.len() < WINDOW && next_id < OPS && posted < burst {
            let id = next_id;
            next_id += 1;
            posted += 1;
            let slot = (id as usize) % SLOTS;
            let len = rng.random_range(1..=SLOT);
            let offset = if kind == Kind::Read {
                rng.random_range(0..=SLOT - len)
            } else {
                0
            };
            let signaled = posted == burst
                || next_id == OPS
                || outstanding.len() + 1 == WINDOW
                || rng.random_bool(0.3);
            let local = a.buf.sge(slot * SLOT, len as u32);
            let op = match kind {
                Kind::Write => Op::Write {
                    raddr: b.buf.addr(slot * SLOT),
                    rkey,
                },
                Kind::WriteImm => Op::WriteImm {
                    raddr: b.buf.addr(slot * SLOT),
                    rkey,
                    imm: id as u32,
                },
                Kind::Send => Op::Send,
                Kind::SendImm => Op::SendImm { imm: id as u32 },
                Kind::Read => Op::Read {
                    raddr: b.buf.addr(slot * SLOT + offset),
                    rkey,
                },
                Kind::CompareSwap => Op::CompareSwap {
                    raddr: atomic_target,
                    rkey,
                    compare: id,
                    swap: id + 1,
                },
                Kind::FetchAdd => Op::FetchAdd {
                    raddr: atomic_target,
                    rkey,
                    add: 1,
                },
            };
            let len = if matches!(kind, Kind::CompareSwap | Kind::FetchAdd) {
                8
            } else {
                len
            };
            let local = if len == 8 && matches!(kind, Kind::CompareSwap | Kind::FetchAdd) {
                a.buf.sge(slot * SLOT, 8)
            } else {
                local
            };
            if matches!(
                kind,
                Kind::Write | Kind::WriteImm | Kind::Send | Kind::SendImm
            ) {
                a.buf.write(slot * SLOT, &pattern(len, id));
            } else {
                a.buf.write(slot * SLOT, &vec![0u8; len]);
            }
            let index = a.qp.post(op, Data::Sges(&[local]), signaled);
            if matches!(kind, Kind::Send | Kind::SendImm) {
                sends.push_back((id, len));
            }
            outstanding.push_back(Posted {
                id,
                index,
                slot,
                len,
                offset,
            });
        }
        a.qp.ring();
        // Progress until a completion shows up.
        let mut got: Vec<Completion> = Vec::new();
        let mut recvs: Vec<Completion> = Vec::new();
        let ok = sim.run_until(&[&a.dev, &b.dev], Duration::from_secs(2), || {
            while let Some(c) = a.scq.poll() {
                got.push(c);
            }
            while let Some(c) = b.rcq.poll() {
                recvs.push(c);
            }
            !got.is_empty()
        });
        if !ok {
            idle_rounds += 1;
            assert!(
                idle_rounds < 3,
                "no progress: {} of {OPS} done, counters a {:?} b {:?}",
                done,
                a.dev.counters(),
                b.dev.counters()
            );
            continue;
        }
        for r in recvs {
            assert_eq!(r.status, WcStatus::Success, "receive {r:?}");
            match kind {
                Kind::WriteImm => {
                    assert_eq!(r.opcode, CqeOpcode::RespWrImm);
                    recv_imms.push(r.imm as u64);
                }
                _ => {
                    let (id, len) = sends
                        .pop_front()
                        .expect("a receive completion for a send we made");
                    assert_eq!(r.byte_count as usize, len, "send {id}");
                    if kind == Kind::SendImm {
                        assert_eq!((r.opcode, r.imm as u64), (CqeOpcode::RespSendImm, id));
                    } else {
                        assert_eq!(r.opcode, CqeOpcode::RespSend);
                    }
                    let s = (r.wqe_counter as usize) % SLOTS;
                    let mut bytes = vec![0u8; len];
                    b.buf.read(s * SLOT, &mut bytes);
                    assert!(bytes == pattern(len, id), "send {id} payload differs");
                }
            }
        }
        for c in got {
            assert_eq!(
                c.status,
                WcStatus::Success,
                "completion {c:?} after {done} ops; a {:?} b {:?}",
                a.dev.counters(),
                b.dev.counters()
            );
            // The CQE completes its WQE and every unsignaled one before it.
            loop {
                let p = outstanding
                    .pop_front()
                    .expect("a completion for a WQE we posted");
                verify(kind, &a, &b, &p, &mut originals);
                done += 1;
                if p.index == c.wqe_counter {
                    break;
                }
            }
        }
    }
    match kind {
        Kind::FetchAdd | Kind::CompareSwap => {
            assert_eq!(
                b.buf.read_u64(SLOTS * SLOT),
                OPS,
                "each atomic executed exactly once"
            );
            originals.sort_unstable();
            assert_eq!(
                originals,
                (0..OPS).collect::<Vec<_>>(),
                "each atomic saw a distinct original value"
            );
        }
        Kind::WriteImm => {
            recv_imms.sort_unstable();
            // The last few receive CQEs may still be on their way; all that came are distinct.
            recv_imms.dedup();
            assert!(recv_imms.len() as u64 + 8 >= OPS);
        }
        _ => {}
    }
    let ca = a.dev.counters();
    let cb = b.dev.counters();
    let stats = sim.fabric.stats();
    assert!(
        stats.dropped > 0 && stats.duplicated > 0 && stats.reordered > 0,
        "{stats:?}"
    );
    assert!(ca.retransmitted_packets + cb.retransmitted_packets > 0);
    assert!(cb.duplicate_requests > 0 || ca.duplicate_requests > 0);
    (ca, cb, stats, sim.clock.now())
}

fn verify(kind: Kind, a: &Node, b: &Node, p: &Posted, originals: &mut Vec<u64>) {
    let mut bytes = vec![0u8; p.len];
    match kind {
        Kind::Write | Kind::WriteImm => {
            b.buf.read(p.slot * SLOT, &mut bytes);
            assert!(
                bytes == pattern(p.len, p.id),
                "write {} differs at the responder",
                p.id
            );
        }
        Kind::Read => {
            a.buf.read(p.slot * SLOT, &mut bytes);
            let src = pattern(SLOT, 1_000_000 + p.slot as u64);
            assert!(
                bytes[..] == src[p.offset..p.offset + p.len],
                "read {} brought the wrong bytes",
                p.id
            );
        }
        Kind::CompareSwap => {
            let orig = a.buf.read_u64(p.slot * SLOT);
            assert_eq!(orig, p.id, "compare-and-swap {} saw {orig}", p.id);
            originals.push(orig);
        }
        Kind::FetchAdd => originals.push(a.buf.read_u64(p.slot * SLOT)),
        Kind::Send | Kind::SendImm => {}
    }
}

#[test]
fn writes_survive_drop_reorder_and_duplication() {
    run(Kind::Write, 11);
}

#[test]
fn writes_with_immediate_survive_drop_reorder_and_duplication() {
    run(Kind::WriteImm, 12);
}

#[test]
fn sends_survive_drop_reorder_and_duplication() {
    run(Kind::Send, 13);
}

#[test]
fn sends_with_immediate_survive_drop_reorder_and_duplication() {
    run(Kind::SendImm, 14);
}

#[test]
fn reads_survive_drop_reorder_and_duplication() {
    run(Kind::Read, 15);
}

#[test]
fn compare_and_swap_executes_exactly_once_under_faults() {
    run(Kind::CompareSwap, 16);
}

#[test]
fn fetch_and_add_executes_exactly_once_under_faults() {
    run(Kind::FetchAdd, 17);
}

#[test]
fn the_same_seed_replays_the_same_run_packet_for_packet() {
    let first = run(Kind::SendImm, 21);
    let second = run(Kind::SendImm, 21);
    assert_eq!(first, second);
}
