//! The mlx5 provider through the pmd API. The first test runs everywhere (no device: a clear
//! error). The others need a ConnectX: they pick `RAILSHIFT_MLX5_DEVICE` (an ibdev name such
//! as `mlx5_0`) or else the first mlx5 device `ibv_get_device_list` reports, and skip with a
//! printed reason when there is none, which is always the case on machines without RDMA
//! hardware. Two QPs on one port talk to each other through the NIC's loopback.
#![cfg(feature = "mlx5")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use pmd::provider::mlx5::device_names;
use pmd::provider::VerbsError;
use pmd::{
    Access, AddressVector, Context, ContextConfig, Cq, Mtu, OpenError, Pd, Qp, QpAttr, QpCaps,
    QpState, RecvWr, RegisteredBuffer, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion,
};

#[test]
fn opening_an_absent_mlx5_device_is_a_clear_error_naming_what_exists() {
    let err = Context::open("mlx5:railshift_absent0", &ContextConfig::default()).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, OpenError::Verbs(VerbsError::NoDevice { .. })),
        "{text}"
    );
    assert!(text.contains("mlx5:railshift_absent0"), "{text}");
    assert!(
        text.contains("RDMA devices present:") || text.contains("no RDMA devices"),
        "{text}"
    );
}

/// The device the hardware tests use, or `None` (with the reason printed).
fn connectx(test: &str) -> Option<Arc<Context>> {
    let names = match std::env::var("RAILSHIFT_MLX5_DEVICE") {
        Ok(name) => vec![name],
        Err(_) => device_names(),
    };
    for ibdev in &names {
        match Context::open(&format!("mlx5:{ibdev}"), &ContextConfig::default()) {
            Ok(ctx) => return Some(ctx),
            Err(e) => println!("{test}: {ibdev} does not open: {e}"),
        }
    }
    println!("skipped {test}: ibv_get_device_list finds no ConnectX on this machine");
    None
}

const BUF: usize = 1 << 16;

struct Side {
    pd: Arc<Pd>,
    cq: Cq,
    qp: Qp,
    buf: RegisteredBuffer,
}

fn side(ctx: &Arc<Context>, events: bool) -> Side {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, events).unwrap();
    let caps = QpCaps {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
    };
    let qp = pd.create_qp(&cq, &cq, caps).unwrap();
    let buf = pd.alloc_buffer(BUF, Access::ALL).unwrap();
    Side { pd, cq, qp, buf }
}

fn connect(qp: &mut Qp, gid: pmd::Gid, dest_qpn: u32, mtu: Mtu) {
    qp.modify(QpState::Init, &QpAttr::init(Access::ALL))
        .unwrap();
    qp.modify(
        QpState::Rtr,
        &QpAttr::rtr(AddressVector::to_gid(gid), dest_qpn, 0, mtu),
    )
    .unwrap();
    qp.modify(QpState::Rts, &QpAttr::rts(0)).unwrap();
}

/// Two QPs on `ctx`, connected to each other.
fn looped_pair(ctx: &Arc<Context>, events: bool) -> (Side, Side) {
    let mut a = side(ctx, events);
    let mut b = side(ctx, false);
    let gid = ctx.query_gid(0).unwrap();
    let mtu = ctx.query_port().unwrap().active_mtu;
    let (qa, qb) = (a.qp.qpn(), b.qp.qpn());
    connect(&mut a.qp, gid, qb, mtu);
    connect(&mut b.qp, gid, qa, mtu);
    (a, b)
}

fn wait(cq: &mut Cq, n: usize) -> Vec<WorkCompletion> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut got = Vec::new();
    let mut wcs = [WorkCompletion::EMPTY; 16];
    while got.len() < n {
        let k = cq.poll(&mut wcs);
        got.extend_from_slice(&wcs[..k]);
        assert!(
            Instant::now() < deadline,
            "only {} of {n} completions after 5 s: {got:?}",
            got.len()
        );
        if k == 0 {
            std::thread::yield_now();
        }
    }
    got
}

fn ok(wc: &WorkCompletion, wr_id: u64, opcode: WcOpcode) {
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (wr_id, WcStatus::Success, opcode),
        "{wc:?}"
    );
}

#[test]
fn on_a_connectx_every_opcode_loops_back_between_two_qps() {
    let Some(ctx) = connectx("every_opcode") else {
        return;
    };
    let (mut a, mut b) = looped_pair(&ctx, false);
    let _ = &a.pd;

    // WRITE, inline (one basic block: the BlueFlame path when the QP has its own register).
    a.qp.post_send(
        &SendWr::inline(
            1,
            SendOp::Write {
                remote: b.buf.remote(0),
            },
            b"inline write",
        )
        .signaled(),
    )
    .unwrap();
    a.qp.ring_doorbell();
    ok(&wait(&mut a.cq, 1)[0], 1, WcOpcode::RdmaWrite);
    let mut got = [0u8; 12];
    b.buf.read(0, &mut got);
    assert_eq!(&got, b"inline write");

    // WRITE of 3 pages gathered from two SGEs (the NIC fetches the WQE and the data).
    let data: Vec<u8> = (0..12288u32).map(|i| (i * 13) as u8).collect();
    a.buf.write(0, &data);
    let sges = [a.buf.sge(0, 6000), a.buf.sge(6000, 6288)];
    let write = SendOp::Write {
        remote: b.buf.remote(4096),
    };
    a.qp.post_send(&SendWr::new(2, write, &sges).signaled())
        .unwrap();
    a.qp.ring_doorbell();
    ok(&wait(&mut a.cq, 1)[0], 2, WcOpcode::RdmaWrite);
    let mut got = vec![0u8; data.len()];
    b.buf.read(4096, &mut got);
    assert_eq!(got, data);

    // SEND of 16 bytes into a posted receive (no scatter-to-CQE: the bytes reach the buffer).
    b.qp.post_recv(&RecvWr::new(30, &[b.buf.sge(32768, 64)]))
        .unwrap();
    a.buf.write(0, b"sixteen bytes!!!");
    a.qp.post_send(&SendWr::new(3, SendOp::Send, &[a.buf.sge(0, 16)]).signaled())
        .unwrap();
    a.qp.ring_doorbell();
    ok(&wait(&mut a.cq, 1)[0], 3, WcOpcode::Send);
    let recv = wait(&mut b.cq, 1);
    ok(&recv[0], 30, WcOpcode::Recv);
    assert_eq!(recv[0].byte_len, 16);
    let mut got = [0u8; 16];
    b.buf.read(32768, &mut got);
    assert_eq!(&got, b"sixteen bytes!!!");

    // WRITE_IMM consumes a receive and carries the immediate.
    b.qp.post_recv(&RecvWr::new(31, &[])).unwrap();
    let op = SendOp::WriteImm {
        remote: b.buf.remote(40000),
        imm: 0x5151_0a0a,
    };
    a.qp.post_send(&SendWr::new(4, op, &[a.buf.sge(0, 16)]).signaled())
        .unwrap();
    a.qp.ring_doorbell();
    ok(&wait(&mut a.cq, 1)[0], 4, WcOpcode::RdmaWrite);
    let recv = wait(&mut b.cq, 1);
    ok(&recv[0], 31, WcOpcode::RecvRdmaWithImm);
    assert_eq!(recv[0].imm, Some(0x5151_0a0a));

    // READ back what the first WRITE put there.
    let read = SendOp::Read {
        remote: b.buf.remote(0),
    };
    a.qp.post_send(&SendWr::new(5, read, &[a.buf.sge(50000, 12)]).signaled())
        .unwrap();
    a.qp.ring_doorbell();
    ok(&wait(&mut a.cq, 1)[0], 5, WcOpcode::RdmaRead);
    let mut got = [0u8; 12];
    a.buf.read(50000, &mut got);
    assert_eq!(&got, b"inline write");

    // Atomics, with byte-palindromic values so the check holds in either atomic endianness
    // mode of the device.
    let (x, y) = (0x0101_0101_0101_0101u64, 0x0202_0202_0202_0202u64);
    b.buf.write_u64(60000, 0);
    let fadd = SendOp::FetchAdd {
        remote: b.buf.remote(60000),
        add: x,
    };
    a.qp.post_send(&SendWr::new(6, fadd, &[a.buf.sge(60008, 8)]).signaled())
        .unwrap();
    a.qp.ring_doorbell();
    ok(&wait(&mut a.cq, 1)[0], 6, WcOpcode::FetchAdd);
    assert_eq!((a.buf.read_u64(60008), b.buf.read_u64(60000)), (0, x));
    let cas = SendOp::CompareSwap {
        remote: b.buf.remote(60000),
        compare: x,
        swap: y,
    };
    a.qp.post_send(&SendWr::new(7, cas, &[a.buf.sge(60016, 8)]).signaled())
        .unwrap();
    a.qp.ring_doorbell();
    ok(&wait(&mut a.cq, 1)[0], 7, WcOpcode::CompSwap);
    assert_eq!((a.buf.read_u64(60016), b.buf.read_u64(60000)), (x, y));

    // A batch of 32 unsignaled writes and a signaled one share one (plain) doorbell.
    for i in 0..32u64 {
        let w = SendOp::Write {
            remote: b.buf.remote(i as usize * 8),
        };
        a.qp.post_send(&SendWr::new(100 + i, w, &[a.buf.sge(0, 8)]))
            .unwrap();
    }
    a.qp.post_send(
        &SendWr::new(
            200,
            SendOp::Write {
                remote: b.buf.remote(0),
            },
            &[a.buf.sge(0, 8)],
        )
        .signaled(),
    )
    .unwrap();
    a.qp.ring_doorbell();
    ok(&wait(&mut a.cq, 1)[0], 200, WcOpcode::RdmaWrite);
}

#[test]
fn on_a_connectx_a_reset_pair_reconnects_from_saved_attributes_and_keeps_working() {
    let Some(ctx) = connectx("reset_and_reconnect") else {
        return;
    };
    let (mut a, mut b) = looped_pair(&ctx, false);
    let write = |a: &mut Side, b: &Side, id: u64| {
        a.buf.write(0, &[id as u8; 8]);
        let op = SendOp::Write {
            remote: b.buf.remote(0),
        };
        a.qp.post_send(&SendWr::new(id, op, &[a.buf.sge(0, 8)]).signaled())
            .unwrap();
        a.qp.ring_doorbell();
    };
    // A completion is left unpolled in the ring across the reset: the driver must clean it.
    write(&mut a, &b, 1);
    std::thread::sleep(Duration::from_millis(100));
    a.qp.handle().set_error().unwrap();
    b.qp.handle().set_error().unwrap();
    a.qp.bring_up_again().unwrap();
    b.qp.bring_up_again().unwrap();
    assert_eq!(a.qp.handle().query_device_state().unwrap(), QpState::Rts);
    write(&mut a, &b, 2);
    let wcs = wait(&mut a.cq, 1);
    ok(&wcs[0], 2, WcOpcode::RdmaWrite);
    let mut got = [0u8; 8];
    b.buf.read(0, &mut got);
    assert_eq!(got, [2; 8]);
    let mut more = [WorkCompletion::EMPTY; 4];
    assert_eq!(a.cq.poll(&mut more), 0, "the stale completion was cleaned");
}

#[test]
fn on_a_connectx_a_completion_event_wakes_the_waiter() {
    let Some(ctx) = connectx("completion_event") else {
        return;
    };
    let (mut a, b) = looped_pair(&ctx, true);
    a.cq.arm().unwrap();
    assert!(!a.cq.wait_event(Some(Duration::from_millis(50))).unwrap());
    let op = SendOp::Write {
        remote: b.buf.remote(0),
    };
    a.qp.post_send(&SendWr::new(9, op, &[a.buf.sge(0, 8)]).signaled())
        .unwrap();
    a.qp.ring_doorbell();
    assert!(a.cq.wait_event(Some(Duration::from_secs(5))).unwrap());
    ok(&wait(&mut a.cq, 1)[0], 9, WcOpcode::RdmaWrite);
    // Armed again at the new consumer index: quiet until the next completion.
    a.cq.arm().unwrap();
    assert!(!a.cq.wait_event(Some(Duration::from_millis(50))).unwrap());
}
