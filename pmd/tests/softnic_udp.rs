//! The pmd over two softnic devices speaking RoCEv2 over UDP, every opcode in one exchange:
//! on the loopback netdev (`soft:lo@127.0.0.x`), and over IPv6 between two network namespaces
//! (`soft:<veth>`, the veth holding only IPv6 addresses). Binding to a netdev needs root (as
//! CI runs); elsewhere the tests say why they skipped.

mod common;

use common::*;
use pmd::{RecvWr, SendOp, SendWr, WcOpcode, WcStatus};

fn open_udp(addr: &str) -> Option<std::sync::Arc<pmd::Context>> {
    open_named(&format!("soft:lo@{addr}"))
}

fn open_named(name: &str) -> Option<std::sync::Arc<pmd::Context>> {
    let config = pmd::ContextConfig {
        progress: pmd::provider::ProgressModel::Manual,
        ..pmd::ContextConfig::default()
    };
    match pmd::Context::open(name, &config) {
        Ok(ctx) => Some(ctx),
        // SAFETY: geteuid has no preconditions.
        Err(e) if unsafe { libc::geteuid() } != 0 => {
            eprintln!("skipping: {name} needs root to bind to a netdev: {e}");
            None
        }
        Err(e) => panic!("open {name}: {e}"),
    }
}

#[test]
fn every_opcode_crosses_udp_on_loopback_needs_root() {
    // Addresses no other test in the workspace uses.
    let (Some(ca), Some(cb)) = (open_udp("127.0.0.41"), open_udp("127.0.0.42")) else {
        return;
    };
    every_opcode(&ca, &cb);
}

#[test]
fn every_opcode_crosses_udp_over_ipv6_between_namespaces_needs_root() {
    use softnic::harness::netns::{is_root, run_in, NetnsPair};
    if !is_root() {
        eprintln!("skipping: network namespaces need root");
        return;
    }
    let pair = NetnsPair::create_ipv6(1500).expect("namespaces");
    // `soft:<netdev>` without an address: the veth has no IPv4 address, so its global IPv6
    // address is GID 0.
    let open = |side: &softnic::harness::netns::Side| {
        run_in(&side.netns, || open_named(&format!("soft:{}", side.netdev)))
            .expect("enter the namespace")
            .expect("root opens the device")
    };
    let (ca, cb) = (open(&pair.a), open(&pair.b));
    let gid = ca.query_gid(0).unwrap();
    assert_eq!(gid.to_ip(), pair.a.addr, "GID 0 is the veth's IPv6 address");
    every_opcode(&ca, &cb);
}

fn every_opcode(ca: &std::sync::Arc<pmd::Context>, cb: &std::sync::Arc<pmd::Context>) {
    let mut a = side(ca);
    let mut b = side(cb);
    pair(&mut a, &mut b);
    let ctxs = [ca, cb];

    b.qp.post_recv(&RecvWr::new(100, &[b.buf.sge(1024, 64)]))
        .unwrap();
    b.qp.post_recv(&RecvWr::new(101, &[b.buf.sge(2048, 64)]))
        .unwrap();
    b.qp.post_recv(&RecvWr::new(102, &[])).unwrap();
    b.buf.write(4096, b"remote bytes");
    b.buf.write_u64(8192, 10);
    a.buf.write(0, b"over the wire");

    let ops = [
        SendOp::Write {
            remote: b.buf.remote(0),
        },
        SendOp::Send,
        SendOp::SendImm { imm: 7 },
        SendOp::WriteImm {
            remote: b.buf.remote(512),
            imm: 8,
        },
        SendOp::Read {
            remote: b.buf.remote(4096),
        },
        SendOp::CompareSwap {
            remote: b.buf.remote(8192),
            compare: 10,
            swap: 20,
        },
        SendOp::FetchAdd {
            remote: b.buf.remote(8192),
            add: 1,
        },
    ];
    for (i, op) in ops.iter().enumerate() {
        let sge = match op {
            SendOp::Read { .. } => a.buf.sge(300, 12),
            SendOp::CompareSwap { .. } => a.buf.sge(400, 8),
            SendOp::FetchAdd { .. } => a.buf.sge(408, 8),
            _ => a.buf.sge(0, 13),
        };
        a.qp.post_send(&SendWr::new(i as u64, *op, &[sge]).signaled())
            .unwrap();
    }
    a.qp.ring_doorbell();
    let sent = wait(&ctxs, &mut a.cq, ops.len());
    for (wc, op) in sent.iter().zip(&ops) {
        assert_eq!(
            (wc.status, wc.opcode),
            (WcStatus::Success, op.wc_opcode()),
            "{op:?}"
        );
    }
    let recv = wait(&ctxs, &mut b.cq, 3);
    let r: Vec<_> = recv.iter().map(|w| (w.wr_id, w.opcode, w.imm)).collect();
    assert_eq!(
        r,
        vec![
            (100, WcOpcode::Recv, None),
            (101, WcOpcode::Recv, Some(7)),
            (102, WcOpcode::RecvRdmaWithImm, Some(8)),
        ]
    );
    let mut got = [0u8; 13];
    b.buf.read(0, &mut got);
    assert_eq!(&got, b"over the wire");
    b.buf.read(1024, &mut got);
    assert_eq!(&got, b"over the wire");
    let mut read = [0u8; 12];
    a.buf.read(300, &mut read);
    assert_eq!(&read, b"remote bytes");
    assert_eq!(
        (
            a.buf.read_u64(400),
            a.buf.read_u64(408),
            b.buf.read_u64(8192)
        ),
        (10, 20, 21)
    );
}
