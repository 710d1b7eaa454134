//! Auto progress: engine threads on the fabric with the real clock, completion channels, and
//! the doorbell wake-up of a sleeping engine.

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use common::{pattern, post_write, WholeRead};
use hw_defs::verbs::WcStatus;
use softnic::harness::{
    connect, Completion, ConnectOptions, Data, HarnessCq, HarnessQp, Node, Op, QpSizes,
};
use softnic::{CompletionChannel, Device, DeviceConfig, Fabric, QpAttrs, QpState, Wire};

fn auto_pair() -> (Fabric, Node, Node) {
    let fabric = Fabric::new(1, Duration::from_micros(5));
    let open = |n: u8| {
        let port = fabric.add_port(IpAddr::V4(Ipv4Addr::new(198, 18, 0, n)));
        Device::open(DeviceConfig::new(
            format!("auto{n}"),
            Wire::Fabric {
                fabric: fabric.clone(),
                port,
            },
        ))
        .unwrap()
    };
    let a = Node::new(open(1), 1 << 20, QpSizes::default()).unwrap();
    let b = Node::new(open(2), 1 << 20, QpSizes::default()).unwrap();
    connect(&a.dev, &a.qp, &b.dev, &b.qp, &ConnectOptions::default()).unwrap();
    (fabric, a, b)
}

fn wait(cq: &mut HarnessCq) -> Completion {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(c) = cq.poll() {
            return c;
        }
        assert!(Instant::now() < end, "no completion within 10 s");
        std::thread::sleep(Duration::from_micros(100));
    }
}

#[test]
fn engine_threads_move_writes_and_reads_on_the_fabric_in_real_time() {
    let (_fabric, mut a, b) = auto_pair();
    let rkey = b.buf.keys.rkey;
    for i in 0..50u64 {
        let data = pattern(20_000, i);
        a.buf.write(0, &data);
        let sge = [a.buf.sge(0, 20_000)];
        a.qp.post(
            Op::Write {
                raddr: b.buf.addr(0),
                rkey,
            },
            Data::Sges(&sge),
            false,
        );
        let back = [a.buf.sge(100_000, 20_000)];
        a.qp.post(
            Op::Read {
                raddr: b.buf.addr(0),
                rkey,
            },
            Data::Sges(&back),
            true,
        );
        a.qp.ring();
        assert_eq!(wait(&mut a.scq).status, WcStatus::Success);
        let mut got = vec![0u8; 20_000];
        a.buf.read(100_000, &mut got);
        assert!(got == data, "round {i}");
    }
}

#[test]
fn an_armed_cq_signals_its_channel_on_the_next_completion() {
    let (_fabric, mut a, b) = auto_pair();
    let channel = CompletionChannel::new().unwrap();
    let mut cq = HarnessCq::new(&a.dev, 64, Some(channel.clone())).unwrap();
    let mut qp = HarnessQp::new(&a.dev, a.pd, &cq, &cq, QpSizes::default()).unwrap();
    let mut peer = HarnessQp::new(&b.dev, b.pd, &b.scq, &b.rcq, QpSizes::default()).unwrap();
    connect(&a.dev, &qp, &b.dev, &peer, &ConnectOptions::default()).unwrap();
    let sge = [a.buf.sge(0, 8)];
    // Not armed: no event.
    qp.post(
        Op::Write {
            raddr: b.buf.addr(0),
            rkey: b.buf.keys.rkey,
        },
        Data::Sges(&sge),
        true,
    );
    qp.ring();
    assert_eq!(wait(&mut cq).status, WcStatus::Success);
    assert_eq!(channel.drain(), 0);
    // Armed: one event, then disarmed.
    cq.handle.arm();
    qp.post(
        Op::Write {
            raddr: b.buf.addr(0),
            rkey: b.buf.keys.rkey,
        },
        Data::Sges(&sge),
        true,
    );
    qp.ring();
    assert!(channel.wait(10_000), "the channel fired");
    assert_eq!(cq.poll().map(|c| c.status), Some(WcStatus::Success));
    qp.post(
        Op::Write {
            raddr: b.buf.addr(0),
            rkey: b.buf.keys.rkey,
        },
        Data::Sges(&sge),
        true,
    );
    qp.ring();
    assert_eq!(wait(&mut cq).status, WcStatus::Success);
    assert_eq!(channel.drain(), 0);
    let _ = (&mut a, &mut peer);
}

#[test]
fn a_doorbell_wakes_an_engine_that_went_to_sleep() {
    let (_fabric, mut a, b) = auto_pair();
    // Long enough for both engines to have gone to sleep in epoll.
    std::thread::sleep(Duration::from_millis(300));
    post_write(&mut a, &b, 8);
    assert_eq!(wait(&mut a.scq).status, WcStatus::Success);
}

#[test]
fn a_receive_posted_in_error_is_flushed_before_the_engines_idle_wake() {
    let (_fabric, mut a, _b) = auto_pair();
    a.dev
        .modify_qp(a.qp.qpn, QpState::Err, &QpAttrs::default())
        .unwrap();
    // Long enough for the engine to have flushed, found nothing more and gone to sleep.
    std::thread::sleep(Duration::from_millis(20));
    let sge = [a.buf.sge(0, 64)];
    let posted = Instant::now();
    // A receive rings no doorbell: only a round of the engine sees it.
    a.qp.post_recv(&sge);
    assert_eq!(wait(&mut a.rcq).status, WcStatus::WrFlushErr);
    // An engine that slept until its idle wake (100 ms after it fell asleep) flushed it about
    // 80 ms after the post.
    let took = posted.elapsed();
    assert!(
        took < Duration::from_millis(40),
        "the flush came {took:?} after the post"
    );
}

#[test]
fn busy_poll_engines_complete_work_too() {
    let fabric = Fabric::new(2, Duration::from_micros(5));
    let open = |n: u8| {
        let port = fabric.add_port(IpAddr::V4(Ipv4Addr::new(198, 18, 0, n)));
        let mut cfg = DeviceConfig::new(
            format!("busy{n}"),
            Wire::Fabric {
                fabric: fabric.clone(),
                port,
            },
        );
        cfg.progress = softnic::ProgressMode::BusyPoll;
        Device::open(cfg).unwrap()
    };
    let mut a = Node::new(open(1), 1 << 16, QpSizes::default()).unwrap();
    let b = Node::new(open(2), 1 << 16, QpSizes::default()).unwrap();
    connect(&a.dev, &a.qp, &b.dev, &b.qp, &ConnectOptions::default()).unwrap();
    let sge = [a.buf.sge(0, 4000)];
    a.qp.post(
        Op::Write {
            raddr: b.buf.addr(0),
            rkey: b.buf.keys.rkey,
        },
        Data::Sges(&sge),
        true,
    );
    a.qp.ring();
    assert_eq!(wait(&mut a.scq).status, WcStatus::Success);
}

/// The packets `b`'s QP has sent: the READ responses, in the tests below.
fn responses_sent(b: &Node) -> u64 {
    b.dev.qp_counters(b.qp.qpn).unwrap().tx_packets
}

/// Posts `reads` READs of `read` on `a`'s QP, rings, and returns once `b` is answering them.
fn start_reads(a: &mut Node, b: &Node, read: &WholeRead, reads: usize) {
    for _ in 0..reads {
        read.post(&mut a.qp);
    }
    a.qp.ring();
    let end = Instant::now() + Duration::from_secs(10);
    while responses_sent(b) < 1000 {
        assert!(Instant::now() < end, "the READ did not start");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// With engine threads: while a 1 GiB READ is being answered, another QP's WRITE completes and
/// `dereg_mr` of the READ's MR returns promptly (the READ is answered a budget per round, the
/// device lock released between rounds), and the READ then fails with a remote access error.
#[test]
fn dereg_mr_and_another_qp_are_not_stalled_by_a_1_gib_read() {
    const LEN: usize = 1 << 30;
    // Several 1 GiB READs of the same MR back to back (within `rd_atomic`), so the responder
    // is still answering when `dereg_mr` runs however fast this machine is: one READ alone
    // finished before `dereg_mr` on a quiet machine, and the test then checked nothing.
    const READS: usize = 8;
    // Declared before the devices, so dropped after them: a failed assertion unwinds while
    // both MRs are registered, and the engines must stop before the memory goes (freed first,
    // an engine still answering the READs wrote into freed pages: SIGSEGV instead of the
    // assertion's message).
    let mut src = vec![0u8; LEN];
    let mut dst = vec![0u8; LEN];
    let (_fabric, mut a, b) = auto_pair();
    let (acq, bcq) = (
        HarnessCq::new(&a.dev, 64, None).unwrap(),
        HarnessCq::new(&b.dev, 64, None).unwrap(),
    );
    let mut acq = acq;
    let mut qa = HarnessQp::new(&a.dev, a.pd, &acq, &acq, QpSizes::default()).unwrap();
    let qb = HarnessQp::new(&b.dev, b.pd, &bcq, &bcq, QpSizes::default()).unwrap();
    connect(&a.dev, &qa, &b.dev, &qb, &ConnectOptions::default()).unwrap();
    // calloc'd: only the pages the READs reach are touched.
    // SAFETY: both vectors outlive their registrations (deregistered below, or the devices
    // dropped first when an assertion fails).
    let read = unsafe { WholeRead::register(&a, &b, &mut src, &mut dst) };
    start_reads(&mut a, &b, &read, READS);
    let read_tx = || responses_sent(&b);
    let t = Instant::now();
    qa.post(
        Op::Write {
            raddr: b.buf.addr(0),
            rkey: b.buf.keys.rkey,
        },
        Data::Sges(&[a.buf.sge(0, 4096)]),
        true,
    );
    qa.ring();
    assert_eq!(wait(&mut acq).status, WcStatus::Success);
    let write_time = t.elapsed();
    let t = Instant::now();
    b.dev.dereg_mr(read.src.lkey).unwrap();
    let dereg_time = t.elapsed();
    let at_dereg = read_tx();
    // READs execute in order: those answered whole before `dereg_mr` succeed, the one being
    // answered ends with the remote access NAK (and the QP with it).
    let mut whole = 0;
    let failed = loop {
        let c = wait(&mut a.scq);
        if c.status != WcStatus::Success {
            break c.status;
        }
        whole += 1;
    };
    assert_eq!(failed, WcStatus::RemAccessErr, "after {whole} whole READs");
    let after = b.dev.qp_counters(b.qp.qpn).unwrap();
    let total = (READS * LEN / 1024) as u64;
    eprintln!(
        "WRITE beside the READs {write_time:?}, dereg_mr {dereg_time:?}, READ responses sent \
         {at_dereg} of {total} ({whole} READs whole)"
    );
    // Built whole, a READ held the lock for its whole 1 GiB: `dereg_mr` returned only between
    // two READs, every response of the one before sent, which the count below catches whatever
    // the load (responses go out in order, so the READ that failed had sent some but not all
    // of its own). The times are generous bounds for a loaded 2-core machine (`dereg_mr`
    // measured 515 ms once at load ~2 with a build running beside it).
    assert!(write_time < Duration::from_secs(2), "{write_time:?}");
    assert!(dereg_time < Duration::from_secs(2), "{dereg_time:?}");
    let per_read = (LEN / 1024) as u64;
    assert!(
        whole < READS && at_dereg > whole as u64 * per_read && at_dereg < total,
        "dereg_mr returned between two READs, not within one"
    );
    // Read after dereg_mr returned: at most the NAK came after.
    assert!(after.tx_packets <= at_dereg + 1, "{after:?}");
    assert_eq!(after.naks_sent.remote_access, 1, "{after:?}");
    a.dev.dereg_mr(read.dst.lkey).unwrap();
    drop((src, dst));
}

/// With engine threads: while 1 GiB READs are answered, a control call on the answering device
/// waits for at most two of its engine's rounds (the one in progress, and one more when the
/// engine looked just before the call came), however often the engine, busy, releases the
/// device lock and takes it again. Counted in READ responses, not in time, so that the load
/// does not matter: the fabric's count of sent packets just before the call, against the
/// QP's count read inside it (the READs' requester sends nothing while they are answered).
#[test]
fn a_control_call_waits_for_at_most_two_rounds_of_an_engine_answering_reads() {
    const LEN: usize = 1 << 30;
    const READS: usize = 8;
    const CALLS: usize = 1000;
    // The responder answers 128 packets per round (engine.rs's ANSWER_BUDGET).
    const ROUND: u64 = 128;
    // Four times the two rounds: a call descheduled in the instant between reading the
    // fabric's count and saying that it waits leaves the engine free meanwhile, the
    // scheduler's doing (2 of some 18,000 calls waited 2.5 and 3 rounds so on the dev VM, and
    // 1 of 1,000 waited 6.5 rounds in a tools/test run beside three builds). Before the engine
    // gave way, the slowest of 1,000 calls waited 10.5 to 2,900 rounds (16 runs), so the
    // bound still fails every run measured before.
    const LIMIT: u64 = 8 * ROUND;
    // Declared before the devices, so dropped after them (as in the test above).
    let mut src = vec![0u8; LEN];
    let mut dst = vec![0u8; LEN];
    let (fabric, mut a, b) = auto_pair();
    // SAFETY: the buffers outlive the devices (declared before them).
    let read = unsafe { WholeRead::register(&a, &b, &mut src, &mut dst) };
    start_reads(&mut a, &b, &read, READS);
    // Packets the fabric carried that are not the answering QP's: the READ requests.
    let requests = a.dev.qp_counters(a.qp.qpn).unwrap().tx_packets;
    // The engine's rate alone, then beside the calls: printed (for docs/measurements.md), not
    // asserted.
    let rate = |from: (Instant, u64)| {
        (responses_sent(&b) - from.1) as f64 / from.0.elapsed().as_secs_f64()
    };
    let start = (Instant::now(), responses_sent(&b));
    std::thread::sleep(Duration::from_millis(300));
    let alone = rate(start);
    let start = (Instant::now(), responses_sent(&b));
    // Up to three tries of CALLS calls: a descheduled call is the scheduler's doing and rare
    // (1 in 1,000 on a loaded machine), an engine that starves control calls fails every try
    // (every one of the 16 runs before it gave way).
    let mut waits = Vec::with_capacity(CALLS);
    for _attempt in 0..3 {
        waits.clear();
        for _ in 0..CALLS {
            // At most the responses sent so far (the QP counts a packet when it batches it,
            // the fabric when the batch goes): a wait is counted long, never short.
            let before = fabric.stats().sent.saturating_sub(requests);
            let at_entry = responses_sent(&b);
            waits.push(at_entry.saturating_sub(before));
            // The engine's turn: calls back to back would find the lock free.
            std::thread::sleep(Duration::from_micros(500));
        }
        if waits.iter().all(|&w| w <= LIMIT) {
            break;
        }
    }
    let beside_calls = rate(start);
    let total = (READS * LEN / 1024) as u64;
    assert!(
        responses_sent(&b) < total,
        "the READs ended before the calls did: nothing was measured"
    );
    // Ends the READs (the one being answered fails, the QP with it).
    b.dev.dereg_mr(read.src.lkey).unwrap();
    waits.sort_unstable();
    eprintln!(
        "READ responses sent while a control call waited: median {}, slowest {}; READ \
         responses per second: {alone:.0} alone, {beside_calls:.0} beside the calls",
        waits[CALLS / 2],
        waits[CALLS - 1]
    );
    let long = waits.iter().filter(|&&w| w > 2 * ROUND).count();
    assert!(
        waits[CALLS - 1] <= LIMIT,
        "a control call waited while {} READ responses were sent ({long} of {CALLS} calls \
         waited past two rounds of {ROUND})",
        waits[CALLS - 1]
    );
    a.dev.dereg_mr(read.dst.lkey).unwrap();
    drop((src, dst));
}
