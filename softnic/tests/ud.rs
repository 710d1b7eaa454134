//! UD QPs end to end on a fault-free fabric with manual progress and a virtual clock:
//! datagrams each way with the GRH and the sender's QPN, the Q_Key check, no RNR, and the UD
//! WQEs the device must refuse with an error completion.

mod common;

use std::net::IpAddr;
use std::time::Duration;

use common::{next, next_within, pattern};
use hw_defs::mlx5::CqeOpcode;
use hw_defs::roce::ipv4::Ipv4Packet;
use hw_defs::verbs::WcStatus;
use softnic::harness::{
    bring_up_ud, ud_dest, Buffer, ConnectOptions, Data, HarnessCq, HarnessQp, Op, QpSizes, Sim,
};
use softnic::{Access, Device, PdId, QpState, QpType, GRH_LEN};

const QKEY: u32 = 0x1111_2222;

/// One side: a UD QP in RTS with [`QKEY`] on a device at `addr`, its CQs and a registered
/// buffer (the device itself apart, so that tests hold it while they post).
struct UdNode {
    addr: IpAddr,
    scq: HarnessCq,
    rcq: HarnessCq,
    qp: HarnessQp,
    buf: Buffer,
}

impl UdNode {
    fn new(sim: &Sim, name: &str, n: u8) -> (Device, UdNode) {
        let dev = sim.device(name, n).unwrap();
        let pd: PdId = dev.alloc_pd();
        let scq = HarnessCq::new(&dev, 4096, None).unwrap();
        let rcq = HarnessCq::new(&dev, 4096, None).unwrap();
        let sizes = QpSizes {
            sq_bbs: 512,
            ..QpSizes::default()
        };
        let qp = HarnessQp::new_of_type(&dev, pd, &scq, &rcq, sizes, QpType::Ud).unwrap();
        bring_up_ud(&dev, qp.qpn, QKEY).unwrap();
        let buf = Buffer::new(&dev, pd, 1 << 20, Access::ALL).unwrap();
        let node = UdNode {
            addr: dev.addr(),
            scq,
            rcq,
            qp,
            buf,
        };
        (dev, node)
    }

    /// Sends `len` bytes from `offset` of its buffer to `to`'s QP with `qkey`.
    fn send(&mut self, to: &UdNode, qkey: u32, offset: usize, len: u32, imm: Option<u32>) -> u16 {
        let sge = [self.buf.sge(offset, len)];
        let op = match imm {
            Some(imm) => Op::SendImm { imm },
            None => Op::Send,
        };
        let dest = ud_dest(to.addr, to.qp.qpn, qkey);
        let index = self.qp.post_ud(Some(dest), op, Data::Sges(&sge), true);
        self.qp.ring();
        index
    }
}

/// Two UD nodes on a fabric: the simulation, both devices, both nodes.
fn ud_pair() -> (Sim, [Device; 2], UdNode, UdNode) {
    let sim = Sim::new(7, Duration::from_micros(2));
    let (da, a) = UdNode::new(&sim, "a", 1);
    let (db, b) = UdNode::new(&sim, "b", 2);
    (sim, [da, db], a, b)
}

/// Receive slots of this many bytes: the GRH and the largest datagram at the default MTU.
const SLOT: usize = GRH_LEN + 1024;
/// Where in a node's buffer its receive slots start (its sends come from below).
const RECV_BASE: usize = 1 << 19;

fn post_recvs(n: &mut UdNode, count: usize) {
    for i in 0..count {
        let sge = n.buf.sge(RECV_BASE + i * SLOT, SLOT as u32);
        n.qp.post_recv(&[sge]);
    }
}

/// Checks the GRH at the start of receive slot `slot` of `to`: 20 zero bytes, then the IPv4
/// header of a datagram from `from` to `to` of `len` payload bytes (and an immediate if `imm`).
fn check_grh(to: &UdNode, slot: usize, from: IpAddr, len: usize, imm: bool) {
    let mut grh = [0u8; GRH_LEN];
    to.buf.read(RECV_BASE + slot * SLOT, &mut grh);
    assert_eq!(
        grh[..20],
        [0u8; 20],
        "the GRH's first 20 bytes are zero over IPv4"
    );
    // The header alone: its total length names the packet, which is not here.
    let ip = Ipv4Packet::new_unchecked(&grh[20..]);
    assert_eq!((ip.version(), ip.header_len()), (4, 20));
    assert!(ip.verify_checksum());
    assert_eq!(IpAddr::V4(ip.src_addr()), from);
    assert_eq!(IpAddr::V4(ip.dst_addr()), to.addr);
    assert_eq!(ip.protocol(), 17);
    // IPv4 20, UDP 8, BTH 12, DETH 8, ImmDt 4 if any, the payload padded to 4 bytes, ICRC 4.
    let immdt = if imm { 4 } else { 0 };
    assert_eq!(
        usize::from(ip.total_length()),
        20 + 8 + 12 + 8 + immdt + len.next_multiple_of(4) + 4
    );
}

/// Checks the 100 datagrams `to` received from `from`: in order, each with its GRH, its
/// sender's QPN, its immediate (every other one) and its bytes (`pattern(len, seed + i)`).
fn check_received(
    sim: &Sim,
    devs: &[&Device],
    from: &UdNode,
    to: &mut UdNode,
    lens: &[u32],
    seed: u64,
) {
    for (i, &len) in lens.iter().enumerate() {
        let r = next(sim, devs, &mut to.rcq);
        let imm = i % 2 == 0;
        let opcode = if imm {
            CqeOpcode::RespSendImm
        } else {
            CqeOpcode::RespSend
        };
        assert_eq!(
            (r.status, r.opcode, r.wqe_counter, r.byte_count),
            (WcStatus::Success, opcode, i as u16, GRH_LEN as u32 + len),
            "datagram {i}"
        );
        assert_eq!((r.src_qp, r.grh, r.qpn), (from.qp.qpn, true, to.qp.qpn));
        if imm {
            assert_eq!(r.imm, i as u32);
        }
        check_grh(to, i, from.addr, len as usize, imm);
        let mut got = vec![0u8; len as usize];
        to.buf.read(RECV_BASE + i * SLOT + GRH_LEN, &mut got);
        assert_eq!(got, pattern(len as usize, seed + i as u64), "datagram {i}");
    }
}

#[test]
fn a_hundred_datagrams_each_way_arrive_with_the_grh_and_the_source_qpn() {
    let (sim, [da, db], mut a, mut b) = ud_pair();
    let devs = [&da, &db];
    post_recvs(&mut a, 100);
    post_recvs(&mut b, 100);
    let lens: Vec<u32> = (0..100u32).map(|i| 1 + (i * 97) % 1024).collect();
    for (i, &len) in lens.iter().enumerate() {
        let at = i * 1024;
        a.buf.write(at, &pattern(len as usize, i as u64));
        b.buf.write(at, &pattern(len as usize, 1000 + i as u64));
        let imm = (i % 2 == 0).then_some(i as u32);
        a.send(&b, QKEY, at, len, imm);
        b.send(&a, QKEY, at, len, imm);
    }
    check_received(&sim, &devs, &a, &mut b, &lens, 0);
    check_received(&sim, &devs, &b, &mut a, &lens, 1000);
    for n in [&mut a, &mut b] {
        for i in 0..100u16 {
            let c = next(&sim, &devs, &mut n.scq);
            assert_eq!((c.status, c.opcode), (WcStatus::Success, CqeOpcode::Req));
            // Each WQE takes two basic blocks: control, datagram segment, one data segment.
            assert_eq!(c.wqe_counter, 2 * i);
        }
    }
    let counters = da.qp_counters(a.qp.qpn).unwrap();
    assert_eq!((counters.tx_packets, counters.rx_packets), (100, 100));
    assert_eq!(counters.retransmitted_packets + counters.timeouts, 0);
}

#[test]
fn a_datagram_with_another_q_key_is_dropped_and_counted() {
    let (sim, [da, db], mut a, mut b) = ud_pair();
    let devs = [&da, &db];
    post_recvs(&mut b, 1);
    a.buf.write(0, b"wrong key");
    a.buf.write(64, b"right key");
    a.send(&b, QKEY ^ 1, 0, 9, None);
    // Sent and completed: UD never learns what became of a datagram.
    assert_eq!(next(&sim, &devs, &mut a.scq).status, WcStatus::Success);
    assert!(next_within(&sim, &devs, &mut b.rcq, Duration::from_millis(10)).is_none());
    assert_eq!(db.qp_counters(b.qp.qpn).unwrap().qkey_drops, 1);
    // The receive it did not take is the next datagram's.
    a.send(&b, QKEY, 64, 9, None);
    let r = next(&sim, &devs, &mut b.rcq);
    assert_eq!((r.status, r.wqe_counter), (WcStatus::Success, 0));
    let mut got = [0u8; 9];
    b.buf.read(RECV_BASE + GRH_LEN, &mut got);
    assert_eq!(&got, b"right key");
}

#[test]
fn a_datagram_with_no_receive_posted_is_dropped_and_counted_without_rnr() {
    let (sim, [da, db], mut a, mut b) = ud_pair();
    let devs = [&da, &db];
    a.buf.write(0, b"nobody listens");
    a.buf.write(64, b"now one does");
    a.send(&b, QKEY, 0, 14, None);
    assert_eq!(next(&sim, &devs, &mut a.scq).status, WcStatus::Success);
    sim.run_until(&devs, Duration::from_millis(10), || false);
    let (sent, got) = (
        da.qp_counters(a.qp.qpn).unwrap(),
        db.qp_counters(b.qp.qpn).unwrap(),
    );
    assert_eq!(got.no_receive_drops, 1);
    assert_eq!(
        (got.naks_sent.rnr, sent.naks_received.rnr, sent.rnr_waits),
        (0, 0, 0)
    );
    assert_eq!(sent.tx_packets, 1, "nothing resent");
    // Dropped, not held: a receive posted now gets only the next datagram.
    post_recvs(&mut b, 1);
    a.send(&b, QKEY, 64, 12, None);
    let r = next(&sim, &devs, &mut b.rcq);
    assert_eq!(
        (r.status, r.byte_count),
        (WcStatus::Success, GRH_LEN as u32 + 12)
    );
    let mut got = [0u8; 12];
    b.buf.read(RECV_BASE + GRH_LEN, &mut got);
    assert_eq!(&got, b"now one does");
    assert!(next_within(&sim, &devs, &mut b.rcq, Duration::from_millis(10)).is_none());
}

#[test]
fn a_ud_send_longer_than_the_mtu_fails_with_a_local_length_error() {
    let (sim, [da, db], mut a, b) = ud_pair();
    // No path MTU given: 1024 bytes, as an RC QP's until set.
    a.send(&b, QKEY, 0, 1025, None);
    let c = next(&sim, &[&da, &db], &mut a.scq);
    assert_eq!((c.status, c.wqe_counter), (WcStatus::LocLenErr, 0));
    assert_eq!(da.query_qp(a.qp.qpn).unwrap().0, QpState::Err);
    assert_eq!(da.qp_counters(a.qp.qpn).unwrap().tx_packets, 0);
}

#[test]
fn a_ud_wqe_without_its_datagram_segment_fails_with_a_local_qp_operation_error() {
    let (sim, [da, db], mut a, _b) = ud_pair();
    let sge = [a.buf.sge(0, 16)];
    a.qp.post_ud(None, Op::Send, Data::Sges(&sge), true);
    a.qp.ring();
    let c = next(&sim, &[&da, &db], &mut a.scq);
    assert_eq!((c.status, c.wqe_counter), (WcStatus::LocQpOpErr, 0));
    assert_eq!(da.query_qp(a.qp.qpn).unwrap().0, QpState::Err);
    // Nor does a UD QP take an RDMA WRITE (written as an RC QP's, since a UD one has none).
    let (sim, [da, db], mut a, b) = ud_pair();
    let write = Op::Write {
        raddr: b.buf.addr(0),
        rkey: b.buf.keys.rkey,
    };
    a.qp.post_ud(None, write, Data::Sges(&sge), true);
    a.qp.ring();
    let c = next(&sim, &[&da, &db], &mut a.scq);
    assert_eq!(c.status, WcStatus::LocQpOpErr);
}

#[test]
fn a_ud_send_reaches_only_a_ud_qp() {
    let (sim, mut a, mut b) = common::pair_with(
        3,
        Duration::from_micros(2),
        QpSizes::default(),
        ConnectOptions::default(),
    );
    let mut ud =
        HarnessQp::new_of_type(&a.dev, a.pd, &a.scq, &a.rcq, QpSizes::default(), QpType::Ud)
            .unwrap();
    bring_up_ud(&a.dev, ud.qpn, QKEY).unwrap();
    b.qp.post_recv(&[b.buf.sge(0, 64)]);
    // A UD SEND to the RC QP's number: the RC QP must not take it as its peer's SEND, even
    // from its peer's address.
    let dest = ud_dest(b.dev.addr(), b.qp.qpn, QKEY);
    ud.post_ud(Some(dest), Op::Send, Data::Inline(b"not yours"), false);
    ud.ring();
    let devs = [&a.dev, &b.dev];
    assert!(next_within(&sim, &devs, &mut b.rcq, Duration::from_millis(10)).is_none());
    assert_eq!(b.dev.qp_counters(b.qp.qpn).unwrap().malformed_drops, 1);
    // The receive is still the RC peer's.
    a.qp.post(Op::Send, Data::Inline(b"yours"), false);
    a.qp.ring();
    let r = next(&sim, &[&a.dev, &b.dev], &mut b.rcq);
    assert_eq!(
        (r.status, r.byte_count, r.wqe_counter, r.grh),
        (WcStatus::Success, 5, 0, false)
    );
}
