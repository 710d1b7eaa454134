//! Auto progress: engine threads on the fabric with the real clock, completion channels, and
//! the doorbell wake-up of a sleeping engine.

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use common::pattern;
use hw_defs::verbs::WcStatus;
use softnic::harness::{
    connect, Completion, ConnectOptions, Data, HarnessCq, HarnessQp, Node, Op, QpSizes,
};
use softnic::{CompletionChannel, Device, DeviceConfig, Fabric, Wire};

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
    assert_eq!(wait(&mut a.scq).status, WcStatus::Success);
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
