//! Each opcode once, end to end on a fault-free fabric with manual progress and a virtual clock.

use std::time::Duration;

use hw_defs::mlx5::CqeOpcode;
use hw_defs::verbs::WcStatus;
use softnic::harness::{connect, ConnectOptions, Data, Node, Op, QpSizes, Sim};

fn pair(seed: u64) -> (Sim, Node, Node) {
    let sim = Sim::new(seed, Duration::from_micros(2));
    let a = Node::new(sim.device("a", 1).unwrap(), 1 << 20, QpSizes::default()).unwrap();
    let b = Node::new(sim.device("b", 2).unwrap(), 1 << 20, QpSizes::default()).unwrap();
    connect(&a.dev, &a.qp, &b.dev, &b.qp, &ConnectOptions::default()).unwrap();
    (sim, a, b)
}

#[test]
fn a_write_lands_in_remote_memory_and_completes_signaled() {
    let (sim, mut a, b) = pair(1);
    let data: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
    a.buf.write(0, &data);
    let sge = [a.buf.sge(0, data.len() as u32)];
    let idx = a.qp.post(Op::Write { raddr: b.buf.addr(100), rkey: b.buf.keys.rkey }, Data::Sges(&sge), true);
    a.qp.ring();
    let mut done = None;
    assert!(sim.run_until(&[&a.dev, &b.dev], Duration::from_secs(1), || {
        done = done.or(a.scq.poll());
        done.is_some()
    }));
    let c = done.unwrap();
    assert_eq!((c.opcode, c.status, c.wqe_counter), (CqeOpcode::Req, WcStatus::Success, idx));
    let mut got = vec![0u8; data.len()];
    b.buf.read(100, &mut got);
    assert_eq!(got, data);
}
