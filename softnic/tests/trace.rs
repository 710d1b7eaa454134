//! The pcap trace: every packet sent and received, as whole Ethernet/IP/UDP frames whose
//! checksums and ICRC verify with hw-defs' independent datagram parser.

mod common;

use std::time::Duration;

use common::next;
use hw_defs::pcap;
use hw_defs::roce::{FrameRepr, Opcode};
use hw_defs::verbs::WcStatus;
use softnic::harness::{connect, ConnectOptions, Data, Node, Op, QpSizes, Sim};

#[test]
fn the_trace_holds_every_packet_with_valid_checksums_and_icrc() {
    let dir = std::env::temp_dir().join(format!("softnic-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("a.pcap");
    let sim = Sim::new(3, Duration::from_micros(2));
    {
        let mut a = Node::new(
            sim.device_traced("a", 1, Some(path.clone())).unwrap(),
            1 << 16,
            QpSizes::default(),
        )
        .unwrap();
        let mut b = Node::new(sim.device("b", 2).unwrap(), 1 << 16, QpSizes::default()).unwrap();
        connect(&a.dev, &a.qp, &b.dev, &b.qp, &ConnectOptions::default()).unwrap();
        let rkey = b.buf.keys.rkey;
        b.qp.post_recv(&[b.buf.sge(0, 4096)]);
        b.qp.post_recv(&[b.buf.sge(0, 4096)]);
        let s3k = [a.buf.sge(0, 3000)];
        let s8 = [a.buf.sge(4096, 8)];
        a.qp.post(
            Op::Write {
                raddr: b.buf.addr(0),
                rkey,
            },
            Data::Sges(&s3k),
            true,
        );
        a.qp.post(
            Op::WriteImm {
                raddr: b.buf.addr(0),
                rkey,
                imm: 1,
            },
            Data::Inline(b"abc"),
            true,
        );
        a.qp.post(Op::SendImm { imm: 2 }, Data::Sges(&s3k), true);
        a.qp.post(
            Op::Read {
                raddr: b.buf.addr(0),
                rkey,
            },
            Data::Sges(&s3k),
            true,
        );
        a.qp.post(
            Op::CompareSwap {
                raddr: b.buf.addr(64),
                rkey,
                compare: 0,
                swap: 1,
            },
            Data::Sges(&s8),
            true,
        );
        a.qp.post(
            Op::FetchAdd {
                raddr: b.buf.addr(64),
                rkey,
                add: 1,
            },
            Data::Sges(&s8),
            true,
        );
        a.qp.ring();
        for _ in 0..6 {
            assert_eq!(
                next(&sim, &[&a.dev, &b.dev], &mut a.scq).status,
                WcStatus::Success
            );
        }
        let _ = &mut b;
    }
    let file = std::fs::read(&path).unwrap();
    let mut opcodes = Vec::new();
    for rec in pcap::records(&file).unwrap() {
        let (_, frame) = rec.unwrap();
        let f = FrameRepr::parse(frame).unwrap_or_else(|e| panic!("frame does not verify: {e}"));
        opcodes.push(f.datagram.packet.bth.opcode);
    }
    std::fs::remove_dir_all(&dir).ok();
    for want in [
        Opcode::RdmaWriteFirst,
        Opcode::RdmaWriteLast,
        Opcode::RdmaWriteOnlyWithImmediate,
        Opcode::SendLastWithImmediate,
        Opcode::RdmaReadRequest,
        Opcode::RdmaReadResponseFirst,
        Opcode::RdmaReadResponseLast,
        Opcode::CompareSwap,
        Opcode::FetchAdd,
        Opcode::AtomicAcknowledge,
        Opcode::Acknowledge,
    ] {
        assert!(opcodes.contains(&want), "{want:?} missing from {opcodes:?}");
    }
}
