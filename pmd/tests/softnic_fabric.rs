//! The pmd over softnic devices on the in-memory fabric: every opcode, the post-time errors, a
//! reset and reconnect, a looped-back pair on one device, completion events.

mod common;

use common::*;
use pmd::{PostError, Qp, QpState, RecvWr, Remote, SendOp, SendWr, Sge, WcOpcode, WcStatus};

#[test]
fn a_write_lands_in_the_peer_and_completes() {
    let (mut a, b) = two_devices();
    a.buf.write(0, b"hello, railshift");
    let wr = SendWr::new(
        7,
        SendOp::Write {
            remote: b.buf.remote(100),
        },
        &[a.buf.sge(0, 16)],
    )
    .signaled();
    a.qp.post_send(&wr).unwrap();
    a.qp.ring_doorbell();
    let wcs = wait(&[&a.ctx, &b.ctx], &mut a.cq, 1);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].status, wcs[0].opcode),
        (7, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    let mut got = [0u8; 16];
    b.buf.read(100, &mut got);
    assert_eq!(&got, b"hello, railshift");
}

#[test]
fn a_multi_packet_write_gathered_from_three_sges_arrives_whole() {
    let (mut a, b) = two_devices();
    let data: Vec<u8> = (0..9000u32).map(|i| (i * 7) as u8).collect();
    a.buf.write(0, &data);
    let sges = [
        a.buf.sge(0, 3000),
        a.buf.sge(3000, 3000),
        a.buf.sge(6000, 3000),
    ];
    a.qp.post_send(
        &SendWr::new(
            1,
            SendOp::Write {
                remote: b.buf.remote(0),
            },
            &sges,
        )
        .signaled(),
    )
    .unwrap();
    a.qp.ring_doorbell();
    let wcs = wait(&[&a.ctx, &b.ctx], &mut a.cq, 1);
    assert!(wcs[0].is_ok(), "{wcs:?}");
    let mut got = vec![0u8; 9000];
    b.buf.read(0, &mut got);
    assert_eq!(got, data);
}

#[test]
fn write_with_immediate_consumes_a_receive_and_delivers_the_immediate() {
    let (mut a, mut b) = two_devices();
    b.qp.post_recv(&RecvWr::new(55, &[])).unwrap();
    a.buf.write(0, &[9; 32]);
    let op = SendOp::WriteImm {
        remote: b.buf.remote(64),
        imm: 0xdead_beef,
    };
    a.qp.post_send(&SendWr::new(1, op, &[a.buf.sge(0, 32)]).signaled())
        .unwrap();
    a.qp.ring_doorbell();
    let sent = wait(&[&a.ctx, &b.ctx], &mut a.cq, 1);
    assert_eq!(sent[0].status, WcStatus::Success);
    let recv = wait(&[&a.ctx, &b.ctx], &mut b.cq, 1);
    assert_eq!(
        (recv[0].wr_id, recv[0].opcode, recv[0].imm, recv[0].byte_len),
        (55, WcOpcode::RecvRdmaWithImm, Some(0xdead_beef), 32)
    );
    let mut got = [0u8; 32];
    b.buf.read(64, &mut got);
    assert_eq!(got, [9; 32]);
}

#[test]
fn send_and_send_with_immediate_scatter_into_posted_receives() {
    let (mut a, mut b) = two_devices();
    b.qp.post_recv(&RecvWr::new(1, &[b.buf.sge(0, 8), b.buf.sge(1000, 100)]))
        .unwrap();
    b.qp.post_recv(&RecvWr::new(2, &[b.buf.sge(2000, 100)]))
        .unwrap();
    a.buf.write(0, b"0123456789abcdef");
    a.qp.post_send(&SendWr::new(10, SendOp::Send, &[a.buf.sge(0, 16)]))
        .unwrap();
    a.qp.post_send(&SendWr::new(11, SendOp::SendImm { imm: 42 }, &[a.buf.sge(0, 4)]).signaled())
        .unwrap();
    a.qp.ring_doorbell();
    let sent = wait(&[&a.ctx, &b.ctx], &mut a.cq, 1);
    assert_eq!((sent[0].wr_id, sent[0].opcode), (11, WcOpcode::Send));
    let recv = wait(&[&a.ctx, &b.ctx], &mut b.cq, 2);
    assert_eq!(
        (recv[0].wr_id, recv[0].opcode, recv[0].imm, recv[0].byte_len),
        (1, WcOpcode::Recv, None, 16)
    );
    assert_eq!(
        (recv[1].wr_id, recv[1].imm, recv[1].byte_len),
        (2, Some(42), 4)
    );
    let (mut head, mut tail) = ([0u8; 8], [0u8; 8]);
    b.buf.read(0, &mut head);
    b.buf.read(1000, &mut tail);
    assert_eq!((&head, &tail), (b"01234567", b"89abcdef"));
}

#[test]
fn inline_write_and_send_carry_their_bytes_in_the_wqe() {
    let (mut a, mut b) = two_devices();
    b.qp.post_recv(&RecvWr::new(3, &[b.buf.sge(500, 64)]))
        .unwrap();
    let payload = *b"inline bytes need no lkey at all";
    a.qp.post_send(&SendWr::inline(
        1,
        SendOp::Write {
            remote: b.buf.remote(0),
        },
        &payload,
    ))
    .unwrap();
    a.qp.post_send(&SendWr::inline(2, SendOp::Send, &payload).signaled())
        .unwrap();
    a.qp.ring_doorbell();
    wait(&[&a.ctx, &b.ctx], &mut a.cq, 1);
    let recv = wait(&[&a.ctx, &b.ctx], &mut b.cq, 1);
    assert_eq!(recv[0].byte_len, payload.len() as u32);
    let (mut w, mut s) = ([0u8; 32], [0u8; 32]);
    b.buf.read(0, &mut w);
    b.buf.read(500, &mut s);
    assert_eq!((w, s), (payload, payload));
}

#[test]
fn a_read_fetches_remote_bytes_into_the_local_buffer() {
    let (mut a, b) = two_devices();
    b.buf.write(4096, b"read me back");
    a.qp.post_send(
        &SendWr::new(
            5,
            SendOp::Read {
                remote: b.buf.remote(4096),
            },
            &[a.buf.sge(200, 12)],
        )
        .signaled(),
    )
    .unwrap();
    a.qp.ring_doorbell();
    let wcs = wait(&[&a.ctx, &b.ctx], &mut a.cq, 1);
    assert_eq!(
        (wcs[0].opcode, wcs[0].status),
        (WcOpcode::RdmaRead, WcStatus::Success)
    );
    let mut got = [0u8; 12];
    a.buf.read(200, &mut got);
    assert_eq!(&got, b"read me back");
}

#[test]
fn compare_swap_and_fetch_add_return_the_old_value_and_change_the_target() {
    let (mut a, b) = two_devices();
    b.buf.write_u64(8, 100);
    let target = b.buf.remote(8);
    a.qp.post_send(
        &SendWr::new(
            1,
            SendOp::CompareSwap {
                remote: target,
                compare: 100,
                swap: 7,
            },
            &[a.buf.sge(0, 8)],
        )
        .signaled(),
    )
    .unwrap();
    a.qp.post_send(
        &SendWr::new(
            2,
            SendOp::FetchAdd {
                remote: target,
                add: 5,
            },
            &[a.buf.sge(8, 8)],
        )
        .signaled(),
    )
    .unwrap();
    a.qp.post_send(
        &SendWr::new(
            3,
            SendOp::CompareSwap {
                remote: target,
                compare: 100,
                swap: 1,
            },
            &[a.buf.sge(16, 8)],
        )
        .signaled(),
    )
    .unwrap();
    a.qp.ring_doorbell();
    let wcs = wait(&[&a.ctx, &b.ctx], &mut a.cq, 3);
    let ops: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.opcode, w.status)).collect();
    assert_eq!(
        ops,
        vec![
            (1, WcOpcode::CompSwap, WcStatus::Success),
            (2, WcOpcode::FetchAdd, WcStatus::Success),
            (3, WcOpcode::CompSwap, WcStatus::Success),
        ]
    );
    assert_eq!(a.buf.read_u64(0), 100, "swap saw 100");
    assert_eq!(a.buf.read_u64(8), 7, "add saw the swapped 7");
    assert_eq!(
        a.buf.read_u64(16),
        12,
        "failed compare returns the current value"
    );
    assert_eq!(b.buf.read_u64(8), 12);
}

#[test]
fn a_batch_of_unsignaled_writes_completes_with_its_signaled_tail() {
    let (mut a, b) = two_devices();
    for i in 0..31u64 {
        a.qp.post_send(&SendWr::new(
            i,
            SendOp::Write {
                remote: b.buf.remote(i as usize * 8),
            },
            &[a.buf.sge(0, 8)],
        ))
        .unwrap();
    }
    a.qp.post_send(
        &SendWr::new(
            31,
            SendOp::Write {
                remote: b.buf.remote(248),
            },
            &[a.buf.sge(0, 8)],
        )
        .signaled(),
    )
    .unwrap();
    a.qp.ring_doorbell();
    let wcs = wait(&[&a.ctx, &b.ctx], &mut a.cq, 1);
    assert_eq!(wcs[0].wr_id, 31);
    assert_eq!(a.qp.send_queue().outstanding().count(), 0);
}

#[test]
fn post_time_errors_over_softnic_are_typed_and_write_nothing() {
    let (mut a, b) = two_devices();
    let remote = b.buf.remote(0);
    let unknown = SendWr::new(
        1,
        SendOp::Write { remote },
        &[Sge::new(a.buf.addr(), 8, 0x00ab_cdef)],
    );
    assert!(matches!(
        a.qp.post_send(&unknown),
        Err(PostError::UnknownLkey {
            lkey: 0x00ab_cdef,
            ..
        })
    ));
    let outside = SendWr::new(1, SendOp::Write { remote }, &[a.buf.sge(BUF - 4, 8)]);
    assert!(matches!(
        a.qp.post_send(&outside),
        Err(PostError::OutsideMr { .. })
    ));
    let long = vec![0u8; 129];
    let too_long = SendWr::inline(1, SendOp::Write { remote }, &long);
    assert_eq!(
        a.qp.post_send(&too_long),
        Err(PostError::InlineTooLong { len: 129, max: 128 })
    );
    assert_eq!(a.qp.send_queue().written(), 0);
    // Queue full: fill the ring with unsignaled work that is never rung.
    let mut posted = 0;
    let err = loop {
        match a.qp.post_send(&SendWr::new(
            posted,
            SendOp::Write { remote },
            &[a.buf.sge(0, 8)],
        )) {
            Ok(_) => posted += 1,
            Err(e) => break e,
        }
    };
    assert!(
        matches!(err, PostError::QueueFull { queue: "send", .. }),
        "{err}"
    );
    // Work requests count against the granted max_send_wr (here 85: the ring's 256 blocks
    // hold 85 WQEs of the largest size the caps allow), not the ring's blocks.
    assert_eq!(posted as u32, a.qp.caps().max_send_wr);
    assert!(a.qp.caps().max_send_wr < a.qp.send_queue().capacity());
}

#[test]
fn a_reset_qp_pair_reconnects_from_saved_attributes_and_keeps_working() {
    let (mut a, mut b) = two_devices();
    let write = |a: &mut Side, id| {
        a.buf.write(0, &[id as u8; 8]);
        a.qp.post_send(
            &SendWr::new(
                id,
                SendOp::Write {
                    remote: Remote { ..b.buf.remote(0) },
                },
                &[a.buf.sge(0, 8)],
            )
            .signaled(),
        )
        .unwrap();
        a.qp.ring_doorbell();
    };
    write(&mut a, 1);
    wait(&[&a.ctx, &b.ctx], &mut a.cq, 1);
    // Both sides fail (as after a link loss) and come back without the application.
    a.qp.handle().set_error().unwrap();
    b.qp.handle().set_error().unwrap();
    assert_eq!(a.qp.state(), QpState::Err);
    a.qp.bring_up_again().unwrap();
    b.qp.bring_up_again().unwrap();
    a.cq.discard_qp(a.qp.qpn());
    assert_eq!(a.qp.state(), QpState::Rts);
    write(&mut a, 2);
    let wcs = wait(&[&a.ctx, &b.ctx], &mut a.cq, 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (2, WcStatus::Success));
    let mut got = [0u8; 8];
    b.buf.read(0, &mut got);
    assert_eq!(got, [2; 8]);
}

#[test]
fn two_qps_on_one_device_talk_through_loopback() {
    let (name, fabric) = fabric();
    fabric.add_port("198.18.0.9".parse().unwrap());
    let ctx = open(&format!("fabric:{name}/0"));
    let mut a = side(&ctx);
    let mut b = side(&ctx);
    pair(&mut a, &mut b);
    b.qp.post_recv(&RecvWr::new(9, &[b.buf.sge(0, 64)]))
        .unwrap();
    a.buf.write(0, b"looped");
    a.qp.post_send(&SendWr::new(1, SendOp::Send, &[a.buf.sge(0, 6)]).signaled())
        .unwrap();
    a.qp.ring_doorbell();
    wait(&[&ctx], &mut a.cq, 1);
    let recv = wait(&[&ctx], &mut b.cq, 1);
    assert_eq!((recv[0].wr_id, recv[0].byte_len), (9, 6));
}

#[test]
fn a_write_to_a_bad_rkey_completes_with_remote_access_error() {
    let (mut a, b) = two_devices();
    let bad = Remote {
        addr: b.buf.addr(),
        rkey: b.buf.rkey() ^ 0x00ff_0000,
    };
    a.qp.post_send(&SendWr::new(3, SendOp::Write { remote: bad }, &[a.buf.sge(0, 8)]).signaled())
        .unwrap();
    a.qp.ring_doorbell();
    let wcs = wait(&[&a.ctx, &b.ctx], &mut a.cq, 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (3, WcStatus::RemAccessErr));
}

#[test]
fn an_armed_cq_signals_its_completion_event() {
    let (name, fabric) = fabric();
    fabric.add_port("198.18.0.1".parse().unwrap());
    fabric.add_port("198.18.0.2".parse().unwrap());
    let ca = open(&format!("fabric:{name}/0"));
    let cb = open(&format!("fabric:{name}/1"));
    let pd = ca.alloc_pd().unwrap();
    let mut cq = ca.create_cq(16, true).unwrap();
    let mut qp = pd.create_qp(&cq, &cq, caps()).unwrap();
    let buf = pd.alloc_buffer(4096, pmd::Access::ALL).unwrap();
    let mut b = side(&cb);
    connect(&mut qp, cb.query_gid(0).unwrap(), b.qp.qpn());
    connect(&mut b.qp, ca.query_gid(0).unwrap(), qp.qpn());
    cq.arm().unwrap();
    assert!(
        !cq.wait_event(Some(std::time::Duration::ZERO)).unwrap(),
        "no event before a CQE"
    );
    qp.post_send(
        &SendWr::new(
            1,
            SendOp::Write {
                remote: b.buf.remote(0),
            },
            &[buf.sge(0, 8)],
        )
        .signaled(),
    )
    .unwrap();
    qp.ring_doorbell();
    let wcs = wait(&[&ca, &cb], &mut cq, 1);
    assert!(wcs[0].is_ok());
    assert!(cq
        .wait_event(Some(std::time::Duration::from_secs(1)))
        .unwrap());
}

#[test]
fn a_cq_without_events_says_so_when_armed() {
    let (mut a, _b) = two_devices();
    let err = a.cq.arm().unwrap_err();
    assert!(
        err.to_string()
            .contains("created without completion events"),
        "{err}"
    );
    let _ = &mut a;
}

#[test]
fn a_pinned_lcore_drives_manual_devices_from_its_poll_loop_and_parks_when_idle() {
    let (mut a, b) = two_devices();
    let core = pmd::lcore::cores().last().copied();
    let lcore = pmd::lcore::launch("test-poller", core, move || {
        let mut poller = pmd::lcore::Poller::default();
        let mut wcs = [pmd::WorkCompletion::EMPTY; 4];
        let mut done = Vec::new();
        for i in 0..50u64 {
            let wr = SendWr::new(
                i,
                SendOp::Write {
                    remote: b.buf.remote(0),
                },
                &[a.buf.sge(0, 8)],
            )
            .signaled();
            a.qp.post_send(&wr).unwrap();
            a.qp.ring_doorbell();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            loop {
                b.ctx.progress();
                let n = a.cq.poll_with_progress(&mut wcs);
                if n > 0 {
                    poller.busy();
                    done.extend(wcs[..n].iter().map(|w| w.wr_id));
                    break;
                }
                poller.idle();
                assert!(
                    std::time::Instant::now() < deadline,
                    "no completion for {i}"
                );
            }
        }
        done
    })
    .unwrap();
    assert_eq!(lcore.join().unwrap(), (0..50).collect::<Vec<u64>>());
}

#[test]
fn auto_progress_devices_complete_work_on_their_own_engine_threads() {
    let (name, fabric) = fabric();
    fabric.add_port("198.18.0.1".parse().unwrap());
    fabric.add_port("198.18.0.2".parse().unwrap());
    let auto = pmd::ContextConfig::default();
    let ca = pmd::Context::open(&format!("fabric:{name}/0"), &auto).unwrap();
    let cb = pmd::Context::open(&format!("fabric:{name}/1"), &auto).unwrap();
    assert_eq!(ca.progress_model(), pmd::provider::ProgressModel::Auto);
    let mut a = side(&ca);
    let mut b = side(&cb);
    pair(&mut a, &mut b);
    a.buf.write(0, b"engine");
    a.qp.post_send(
        &SendWr::new(
            1,
            SendOp::Write {
                remote: b.buf.remote(0),
            },
            &[a.buf.sge(0, 6)],
        )
        .signaled(),
    )
    .unwrap();
    a.qp.ring_doorbell();
    // Nobody calls progress: the engines do the work; the poller backs off and parks.
    let mut poller = pmd::lcore::Poller::default();
    let mut wcs = [pmd::WorkCompletion::EMPTY; 1];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while a.cq.poll(&mut wcs) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the engines did not complete the WRITE"
        );
        poller.idle();
    }
    assert!(wcs[0].is_ok());
    let mut got = [0u8; 6];
    b.buf.read(0, &mut got);
    assert_eq!(&got, b"engine");
}

#[test]
fn opening_what_is_not_there_says_what_is_missing() {
    let config = pmd::ContextConfig::default();
    let err = pmd::Context::open("fabric:never-registered/0", &config).unwrap_err();
    assert!(
        err.to_string()
            .contains("no fabric is registered as \"never-registered\""),
        "{err}"
    );
    let err = pmd::Context::open("mlx5:mlx5_0", &config).unwrap_err();
    assert!(
        err.to_string().contains("needs the `mlx5` cargo feature"),
        "{err}"
    );
    let err = pmd::Context::open("rxe0", &config).unwrap_err();
    assert!(err.to_string().contains("no provider prefix"), "{err}");
}

/// Two QPs of `b` on one SRQ, each connected to a new QP of `a`: `(a1, a2, srq, b1, b2)`.
fn srq_pair(a: &Side, b: &Side, max_wr: u32, limit: u32) -> (Qp, Qp, pmd::Srq, Qp, Qp) {
    let srq = b.pd.create_srq(max_wr, 2, limit).unwrap();
    let mut b1 = b.pd.create_qp_on_srq(&b.cq, &b.cq, caps(), &srq).unwrap();
    let mut b2 = b.pd.create_qp_on_srq(&b.cq, &b.cq, caps(), &srq).unwrap();
    let mut a1 = a.pd.create_qp(&a.cq, &a.cq, caps()).unwrap();
    let mut a2 = a.pd.create_qp(&a.cq, &a.cq, caps()).unwrap();
    let (ga, gb) = (a.ctx.query_gid(0).unwrap(), b.ctx.query_gid(0).unwrap());
    connect(&mut a1, gb, b1.qpn());
    connect(&mut b1, ga, a1.qpn());
    connect(&mut a2, gb, b2.qpn());
    connect(&mut b2, ga, a2.qpn());
    (a1, a2, srq, b1, b2)
}

fn send_one(qp: &mut Qp, side: &Side, len: u32) {
    qp.post_send(&SendWr::new(0, SendOp::Send, &[side.buf.sge(0, len)]))
        .unwrap();
    qp.ring_doorbell();
}

#[test]
fn two_qps_on_one_srq_each_receive_with_their_qp_number() {
    let (a, mut b) = two_devices();
    let (mut a1, mut a2, srq, b1, b2) = srq_pair(&a, &b, 8, 0);
    for i in 0..4u64 {
        srq.post_recv(&RecvWr::new(100 + i, &[b.buf.sge(i as usize * 1024, 1024)]))
            .unwrap();
    }
    assert_eq!(srq.outstanding(), 4);
    a.buf.write(0, b"shared receive queue");
    send_one(&mut a1, &a, 20);
    send_one(&mut a2, &a, 20);
    send_one(&mut a1, &a, 8);
    let wcs = wait(&[&a.ctx, &b.ctx], &mut b.cq, 3);
    // The SRQ's receives go in arrival order, which two QPs do not fix between them.
    let mut ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, vec![100, 101, 102], "{wcs:?}");
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    let mut on_b1: Vec<u32> = wcs
        .iter()
        .filter(|w| w.qp_num == b1.qpn())
        .map(|w| w.byte_len)
        .collect();
    on_b1.sort_unstable();
    assert_eq!(on_b1, vec![8, 20], "{wcs:?}");
    let on_b2: Vec<_> = wcs.iter().filter(|w| w.qp_num == b2.qpn()).collect();
    assert_eq!(on_b2.len(), 1, "{wcs:?}");
    assert_eq!(on_b2[0].byte_len, 20);
    let mut bytes = [0u8; 20];
    b.buf
        .read((on_b2[0].wr_id - 100) as usize * 1024, &mut bytes);
    assert_eq!(&bytes, b"shared receive queue");
    assert_eq!(srq.outstanding(), 1);
    // Completed slots go back to the free list: max_wr receives fit again, not one more.
    let max_wr = srq.query().unwrap().max_wr;
    assert!(max_wr >= 8);
    for i in 0..u64::from(max_wr) - 1 {
        srq.post_recv(&RecvWr::new(200 + i, &[b.buf.sge(0, 64)]))
            .unwrap();
    }
    assert!(matches!(
        srq.post_recv(&RecvWr::new(9, &[b.buf.sge(0, 64)])),
        Err(PostError::QueueFull { .. })
    ));
}

#[test]
fn an_srq_refuses_bad_posts_and_raises_its_limit_event() {
    let (a, mut b) = two_devices();
    let (mut a1, _a2, srq, mut b1, _b2) = srq_pair(&a, &b, 8, 0);
    assert!(matches!(
        b1.post_recv(&RecvWr::new(1, &[b.buf.sge(0, 8)])),
        Err(PostError::OnSharedReceiveQueue { .. })
    ));
    let three = [b.buf.sge(0, 8), b.buf.sge(8, 8), b.buf.sge(16, 8)];
    assert!(matches!(
        srq.post_recv(&RecvWr::new(1, &three)),
        Err(PostError::TooManySges { max: 2, .. })
    ));
    let attr = srq.query().unwrap();
    assert!(attr.max_wr >= 8);
    assert_eq!((attr.max_sge, attr.limit), (2, 0));
    assert!(
        srq.modify_limit(attr.max_wr + 1).is_err(),
        "a limit above max_wr"
    );
    for i in 0..3 {
        srq.post_recv(&RecvWr::new(i, &[b.buf.sge(0, 64)])).unwrap();
    }
    srq.modify_limit(2).unwrap();
    assert_eq!(srq.query().unwrap().limit, 2);
    send_one(&mut a1, &a, 8);
    wait(&[&a.ctx, &b.ctx], &mut b.cq, 1);
    assert_eq!(b.ctx.poll_srq_event(), None, "2 left is not below 2");
    send_one(&mut a1, &a, 8);
    wait(&[&a.ctx, &b.ctx], &mut b.cq, 1);
    assert_eq!(b.ctx.poll_srq_event(), Some(srq.handle()));
    assert_eq!(srq.query().unwrap().limit, 0, "disarmed");
    assert!(b.pd.create_srq(0, 1, 0).is_err());
    assert!(b.pd.create_srq(4, 1, 5).is_err());
}

/// A UD QP in RTS with queue key `qkey` on `s`'s device, sharing its CQ and buffer.
fn ud_qp(s: &common::Side, qkey: u32) -> Qp {
    let mut qp = s.pd.create_ud_qp(&s.cq, &s.cq, caps()).unwrap();
    assert_eq!(qp.qp_type(), pmd::QpType::Ud);
    qp.modify(QpState::Init, &pmd::QpAttr::init_ud(qkey))
        .unwrap();
    qp.modify(QpState::Rtr, &pmd::QpAttr::default()).unwrap();
    qp.modify(QpState::Rts, &pmd::QpAttr::rts_ud(0)).unwrap();
    qp
}

#[test]
fn ud_datagrams_go_both_ways_with_the_grh_and_the_senders_qpn() {
    const QKEY: u32 = 0x0bad_cafe;
    let (mut a, mut b) = two_devices();
    let (mut ua, mut ub) = (ud_qp(&a, QKEY), ud_qp(&b, QKEY));
    let (ga, gb) = (a.ctx.query_gid(0).unwrap(), b.ctx.query_gid(0).unwrap());
    let grh = pmd::UD_GRH_LEN;
    // Ten each way, each into its own receive of GRH + 100 bytes at 8192 + 256 i.
    for i in 0..10u32 {
        let at = 8192 + 256 * i as usize;
        ua.post_recv(&RecvWr::new(
            100 + u64::from(i),
            &[a.buf.sge(at, grh + 100)],
        ))
        .unwrap();
        ub.post_recv(&RecvWr::new(
            200 + u64::from(i),
            &[b.buf.sge(at, grh + 100)],
        ))
        .unwrap();
    }
    for i in 0..10u32 {
        let at = 64 * i as usize;
        a.buf.write(at, &[i as u8; 40]);
        b.buf.write(at, &[0x80 | i as u8; 40]);
        let to_b = pmd::UdAddress {
            gid: gb,
            qpn: ub.qpn(),
            qkey: QKEY,
        };
        let to_a = pmd::UdAddress {
            gid: ga,
            qpn: ua.qpn(),
            qkey: QKEY,
        };
        let op = SendOp::SendImm { imm: i };
        ua.post_send_ud(
            &SendWr::new(u64::from(i), op, &[a.buf.sge(at, 10 + i)]).signaled(),
            &to_b,
        )
        .unwrap();
        ub.post_send_ud(
            &SendWr::new(u64::from(i), op, &[b.buf.sge(at, 10 + i)]).signaled(),
            &to_a,
        )
        .unwrap();
    }
    ua.ring_doorbell();
    ub.ring_doorbell();
    let ctxs = [a.ctx.clone(), b.ctx.clone()];
    // Each CQ gets its QP's ten send completions and ten receives, in some order.
    for (side, ud, peer, fill, wr_base) in [
        (&mut a, &ua, ub.qpn(), 0x80u8, 100u64),
        (&mut b, &ub, ua.qpn(), 0, 200),
    ] {
        let wcs = wait(&[&ctxs[0], &ctxs[1]], &mut side.cq, 20);
        let sends: Vec<_> = wcs.iter().filter(|w| w.opcode == WcOpcode::Send).collect();
        let recvs: Vec<_> = wcs.iter().filter(|w| w.opcode == WcOpcode::Recv).collect();
        assert_eq!((sends.len(), recvs.len()), (10, 10), "{wcs:?}");
        assert!(sends.iter().all(|w| w.is_ok() && w.src_qp == 0));
        for (i, w) in recvs.iter().enumerate() {
            let i = i as u32;
            assert_eq!(
                (w.wr_id, w.status, w.byte_len, w.imm, w.src_qp, w.qp_num),
                (
                    wr_base + u64::from(i),
                    WcStatus::Success,
                    grh + 10 + i,
                    Some(i),
                    peer,
                    ud.qpn()
                )
            );
            let at = 8192 + 256 * i as usize;
            let mut payload = vec![0u8; 10 + i as usize];
            side.buf.read(at + grh as usize, &mut payload);
            assert_eq!(payload, vec![fill | i as u8; 10 + i as usize]);
            // The GRH's IPv4 header (its last 20 bytes) names the sender's address.
            let mut ip = [0u8; 20];
            side.buf.read(at + 20, &mut ip);
            let from = if fill == 0 { ga } else { gb };
            assert_eq!(ip[12..16], from.0[12..16]);
        }
    }
}

#[test]
fn ud_posts_are_checked_and_an_rc_qp_is_not_a_ud_one() {
    let (mut a, b) = two_devices();
    let mut ud = ud_qp(&a, 7);
    let dest = pmd::UdAddress {
        gid: b.ctx.query_gid(0).unwrap(),
        qpn: 0x12,
        qkey: 7,
    };
    let sge = [a.buf.sge(0, 8)];
    // A UD QP's sends name their destination; it has no RDMA.
    assert_eq!(
        ud.post_send(&SendWr::new(1, SendOp::Send, &sge)),
        Err(PostError::UdNeedsAddress { qpn: ud.qpn() })
    );
    let write = SendOp::Write {
        remote: Remote { addr: 0, rkey: 1 },
    };
    assert!(matches!(
        ud.post_send_ud(&SendWr::new(1, write, &sge), &dest),
        Err(PostError::NotUdOperation { .. })
    ));
    // An RC QP has no UD sends.
    assert_eq!(
        a.qp.post_send_ud(&SendWr::new(1, SendOp::Send, &sge), &dest),
        Err(PostError::NotUd { qpn: a.qp.qpn() })
    );
    // RC's attributes are not UD's: a UD QP takes no peer.
    let mut fresh = a.pd.create_ud_qp(&a.cq, &a.cq, caps()).unwrap();
    assert!(fresh
        .modify(QpState::Init, &pmd::QpAttr::init(pmd::Access::ALL))
        .is_err());
    // A UD send longer than the MTU (1024 until set) fails at the device, with its CQE.
    a.buf.write(0, &[1; 2000]);
    ud.post_send_ud(
        &SendWr::new(9, SendOp::Send, &[a.buf.sge(0, 2000)]).signaled(),
        &dest,
    )
    .unwrap();
    ud.ring_doorbell();
    let wcs = wait(&[&a.ctx, &b.ctx], &mut a.cq, 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (9, WcStatus::LocLenErr));
}
