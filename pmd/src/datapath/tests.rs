//! The datapath against the fake provider, through a connected QP of the control objects:
//! the test reads the WQEs the driver wrote and writes the CQEs it polls, byte for byte in
//! the mlx5 layouts.

use hw_defs::mlx5::{
    AtomicSeg, AtomicSegRepr, CqeOpcode, CqeRepr, DataSeg, DataSegRepr, FenceMode, InlineSeg,
    RaddrSeg, RaddrSegRepr, SendOpcode, Syndrome,
};

use crate::control::testing::{caps, connect, ctrl_of, remote, rig, Rig};
use crate::datapath::wr::*;
use crate::qp_state::QpState;
use crate::verbs::Access;

// ---- WQE building ----

#[test]
fn a_write_is_ctrl_raddr_and_one_data_segment_in_one_block() {
    let mut r = rig();
    let sge = r.buf.sge(128, 256);
    let wr = SendWr::new(7, SendOp::Write { remote: remote() }, &[sge]).signaled();
    let idx = r.qp.post_send(&wr).unwrap();
    assert_eq!(idx, 0);
    let bb = r.fake.qp(r.qp.qpn()).sq_bb(0);
    let ctrl = ctrl_of(&bb);
    assert_eq!(ctrl.opcode, SendOpcode::RdmaWrite);
    assert_eq!(ctrl.wqe_index, 0);
    assert_eq!(ctrl.qpn, r.qp.qpn());
    assert_eq!(ctrl.ds, 3);
    assert!(ctrl.signaled);
    assert_eq!(ctrl.fence, FenceMode::None);
    let raddr = RaddrSegRepr::parse(&RaddrSeg::new_checked(&bb[16..32]).unwrap()).unwrap();
    assert_eq!(
        raddr,
        RaddrSegRepr {
            raddr: 0x7000_0000,
            rkey: 0xabcd
        }
    );
    let data = DataSegRepr::parse(&DataSeg::new_checked(&bb[32..48]).unwrap()).unwrap();
    assert_eq!(
        data,
        DataSegRepr {
            byte_count: 256,
            lkey: r.buf.lkey(),
            addr: r.buf.addr() + 128
        }
    );
}

#[test]
fn every_opcode_is_encoded_with_its_segments() {
    let mut r = rig();
    let sge = r.buf.sge(0, 8);
    let cases: Vec<(SendOp, SendOpcode, u8, u32)> = vec![
        (SendOp::Send, SendOpcode::Send, 2, 0),
        (
            SendOp::SendImm { imm: 0x1234 },
            SendOpcode::SendImm,
            2,
            0x1234,
        ),
        (
            SendOp::Write { remote: remote() },
            SendOpcode::RdmaWrite,
            3,
            0,
        ),
        (
            SendOp::WriteImm {
                remote: remote(),
                imm: 0xfeed,
            },
            SendOpcode::RdmaWriteImm,
            3,
            0xfeed,
        ),
        (
            SendOp::Read { remote: remote() },
            SendOpcode::RdmaRead,
            3,
            0,
        ),
        (
            SendOp::CompareSwap {
                remote: remote(),
                compare: 5,
                swap: 9,
            },
            SendOpcode::AtomicCs,
            4,
            0,
        ),
        (
            SendOp::FetchAdd {
                remote: remote(),
                add: 3,
            },
            SendOpcode::AtomicFa,
            4,
            0,
        ),
    ];
    for (i, (op, opcode, ds, imm)) in cases.into_iter().enumerate() {
        let idx =
            r.qp.post_send(&SendWr::new(i as u64, op, &[sge]).signaled())
                .unwrap();
        let bb = r.fake.qp(r.qp.qpn()).sq_bb(u32::from(idx));
        let ctrl = ctrl_of(&bb);
        assert_eq!(
            (ctrl.opcode, ctrl.ds, ctrl.imm),
            (opcode, ds, imm),
            "{op:?}"
        );
        if opcode.has_atomic_seg() {
            let atomic =
                AtomicSegRepr::parse(&AtomicSeg::new_checked(&bb[32..48]).unwrap()).unwrap();
            let expected = match op {
                SendOp::CompareSwap { .. } => AtomicSegRepr {
                    swap_add: 9,
                    compare: 5,
                },
                _ => AtomicSegRepr {
                    swap_add: 3,
                    compare: 0,
                },
            };
            assert_eq!(atomic, expected);
        }
        // Publish and complete it so the next one has room.
        r.qp.ring_doorbell();
        r.fake.cq(0).req_op(r.qp.qpn(), idx, opcode, 8);
        let mut wcs = [WorkCompletion::EMPTY; 1];
        assert_eq!(r.cq.poll(&mut wcs), 1);
        assert_eq!(wcs[0].opcode, op.wc_opcode());
        // A byte count only for what brought data back (libmlx5's handle_good_req).
        let byte_len = match op {
            SendOp::Read { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => 8,
            _ => 0,
        };
        assert_eq!(wcs[0].byte_len, byte_len, "{op:?}");
    }
}

#[test]
fn fence_and_solicited_flags_reach_the_control_segment() {
    let mut r = rig();
    let sge = r.buf.sge(0, 8);
    let mut wr = SendWr::new(1, SendOp::Send, &[sge]).fenced();
    wr.flags = wr.flags | SendFlags::SOLICITED;
    r.qp.post_send(&wr).unwrap();
    let ctrl = ctrl_of(&r.fake.qp(r.qp.qpn()).sq_bb(0));
    assert_eq!(ctrl.fence, FenceMode::SmallAndFence);
    assert!(ctrl.solicited);
    assert!(!ctrl.signaled);
}

#[test]
fn inline_data_is_copied_into_the_wqe() {
    let mut r = rig();
    let payload: Vec<u8> = (0..40u8).collect();
    r.qp.post_send(&SendWr::inline(
        1,
        SendOp::Write { remote: remote() },
        &payload,
    ))
    .unwrap();
    let q = r.fake.qp(r.qp.qpn());
    let ring = q.sq_bytes();
    let ctrl = ctrl_of(&ring);
    assert_eq!(ctrl.ds, 2 + 3); // 4-byte header + 40 bytes = 3 units
    let seg = InlineSeg::new_checked(&ring[32..]).unwrap();
    assert!(seg.is_inline());
    assert_eq!(seg.payload_len(), 40);
    assert_eq!(&ring[36..76], payload.as_slice());
}

#[test]
fn a_wqe_that_reaches_the_end_of_the_ring_continues_at_its_start() {
    let mut r = rig();
    let bbs = r.qp.send_queue().capacity();
    let sge = r.buf.sge(0, 8);
    // Fill all but the last block, completing as we go.
    for i in 0..bbs - 1 {
        let idx =
            r.qp.post_send(
                &SendWr::new(u64::from(i), SendOp::Write { remote: remote() }, &[sge]).signaled(),
            )
            .unwrap();
        r.qp.ring_doorbell();
        r.fake.cq(0).req(r.qp.qpn(), idx, 8);
        let mut wcs = [WorkCompletion::EMPTY; 1];
        assert_eq!(r.cq.poll(&mut wcs), 1);
    }
    // A 60-byte inline WRITE takes 2 + 4 units: two blocks, the second at ring index 0.
    let payload = [0x5au8; 60];
    let idx =
        r.qp.post_send(&SendWr::inline(
            99,
            SendOp::Write { remote: remote() },
            &payload,
        ))
        .unwrap();
    assert_eq!(u32::from(idx), bbs - 1);
    let ring = r.fake.qp(r.qp.qpn()).sq_bytes();
    let last = (bbs as usize - 1) * 64;
    assert_eq!(ctrl_of(&ring[last..]).ds, 6);
    // Header at unit 2 of the last block; 28 payload bytes fit before the end.
    assert_eq!(&ring[last + 36..last + 64], &payload[..28]);
    assert_eq!(&ring[..32], &payload[28..]);
    let mut copy = [0u8; 128];
    assert_eq!(r.qp.send_queue().copy_wqe(bbs - 1, &mut copy), 128);
    assert_eq!(&copy[36..96], &payload[..]);
}

// ---- doorbells ----

#[test]
fn nothing_is_published_until_the_doorbell_rings() {
    let mut r = rig();
    let sge = r.buf.sge(0, 64);
    r.qp.post_send(&SendWr::new(1, SendOp::Write { remote: remote() }, &[sge]))
        .unwrap();
    let q = r.fake.qp(r.qp.qpn());
    assert_eq!(q.dbrec_send(), 0);
    assert_eq!(q.doorbell_bytes(), [0; 8]);
    r.qp.ring_doorbell();
    assert_eq!(q.dbrec_send(), 1);
    // The register got the first 8 bytes of the control segment.
    assert_eq!(q.doorbell_bytes(), q.sq_bb(0)[..8]);
}

#[test]
fn a_batch_shares_one_doorbell_naming_its_last_wqe() {
    let mut r = rig();
    let sge = r.buf.sge(0, 64);
    for i in 0..5 {
        r.qp.post_send(&SendWr::new(i, SendOp::Write { remote: remote() }, &[sge]))
            .unwrap();
    }
    let q = r.fake.qp(r.qp.qpn());
    assert_eq!(q.dbrec_send(), 0);
    r.qp.ring_doorbell();
    assert_eq!(q.dbrec_send(), 5);
    assert_eq!(q.doorbell_bytes(), q.sq_bb(4)[..8]);
    assert_eq!(r.qp.send_queue().published(), 5);
}

#[test]
fn ringing_through_an_index_publishes_up_to_it_and_withholds_the_rest() {
    let mut r = rig();
    let sge = r.buf.sge(0, 64);
    let mut idx = Vec::new();
    for i in 0..4 {
        idx.push(
            r.qp.post_send(&SendWr::new(i, SendOp::Write { remote: remote() }, &[sge]))
                .unwrap(),
        );
    }
    let q = r.fake.qp(r.qp.qpn());
    r.qp.ring_doorbell_through(idx[1]).unwrap();
    assert_eq!(q.dbrec_send(), 2);
    assert_eq!(q.doorbell_bytes(), q.sq_bb(1)[..8]);
    let withheld: Vec<bool> =
        r.qp.send_queue()
            .outstanding()
            .map(|w| w.published)
            .collect();
    assert_eq!(withheld, vec![true, true, false, false]);
    // Already published, or not written: refused and named.
    assert!(r.qp.ring_doorbell_through(idx[0]).is_err());
    assert!(r.qp.ring_doorbell_through(7).is_err());
    r.qp.ring_doorbell();
    assert_eq!(q.dbrec_send(), 4);
}

#[test]
fn ringing_through_the_middle_of_a_wqe_is_refused() {
    let mut r = rig();
    let payload = [1u8; 60]; // two blocks
    r.qp.post_send(&SendWr::inline(
        1,
        SendOp::Write { remote: remote() },
        &payload,
    ))
    .unwrap();
    let err = r.qp.ring_doorbell_through(1).unwrap_err();
    assert!(err.to_string().contains("not the start"), "{err}");
}

/// Block `i` of the send ring with the WQE index (bytes 1..3) cleared, for comparing WQEs
/// written at different places.
fn without_index(r: &Rig, i: u16) -> Vec<u8> {
    let mut bb = r.fake.qp(r.qp.qpn()).sq_bb(u32::from(i));
    bb[1] = 0;
    bb[2] = 0;
    bb.to_vec()
}

#[test]
fn the_fast_path_writes_the_bytes_the_general_path_writes() {
    let ops = [
        SendOp::Write { remote: remote() },
        SendOp::WriteImm {
            remote: remote(),
            imm: 0x0102_0304,
        },
        SendOp::Send,
        SendOp::SendImm { imm: 0xa0b0_c0d0 },
    ];
    let mut r = rig();
    let sge = r.buf.sge(24, 40);
    let mut wcs = [WorkCompletion::EMPTY; 4];
    for op in ops {
        for f in 0..8u8 {
            let mut wr = SendWr::new(u64::from(f), op, &[sge]);
            for (bit, flag) in [SendFlags::SIGNALED, SendFlags::FENCE, SendFlags::SOLICITED]
                .into_iter()
                .enumerate()
            {
                if f & (1 << bit) != 0 {
                    wr.flags = wr.flags | flag;
                }
            }
            // The general path (any state, every check), then the fast path, which must take
            // this one (the key cache is warm).
            let general = r.qp.send_queue().post_withheld(&wr).unwrap();
            let fast = r.qp.send_queue().post_fast(&wr);
            let fast = fast.unwrap_or_else(|| panic!("{op:?} flags {f:#b} left the fast path"));
            assert_eq!(fast, general.wrapping_add(1));
            assert_eq!(
                without_index(&r, fast),
                without_index(&r, general),
                "{op:?} flags {f:#b}"
            );
            assert_eq!(
                ctrl_of(&r.fake.qp(r.qp.qpn()).sq_bb(u32::from(fast))).wqe_index,
                fast
            );
            // Complete both so the ring never fills.
            r.qp.ring_doorbell();
            r.fake.cq(0).req_op(r.qp.qpn(), fast, op.opcode(), 0);
            r.cq.poll(&mut wcs);
        }
    }
}

#[test]
fn a_batch_posts_in_order_and_stops_at_the_refused_work_request() {
    let mut r = rig();
    let sge = r.buf.sge(0, 8);
    let bad = Sge {
        lkey: 0xdead,
        ..sge
    };
    let write = |id| SendWr::new(id, SendOp::Write { remote: remote() }, &[sge]);
    let wrs = [
        write(1),
        write(2),
        SendWr::inline(3, SendOp::Send, b"abc"),
        write(4),
        SendWr::new(5, SendOp::Write { remote: remote() }, &[bad]),
        write(6),
    ];
    let e = r.qp.post_send_batch(&wrs).unwrap_err();
    assert_eq!(e.posted, 4);
    assert!(
        matches!(e.error, PostError::UnknownLkey { lkey: 0xdead, .. }),
        "{e}"
    );
    assert_eq!(
        r.qp.send_queue().written(),
        4,
        "nothing after the refused one"
    );
    let ids: Vec<u64> = r.qp.send_queue().outstanding().map(|w| w.wr_id).collect();
    assert_eq!(ids, [1, 2, 3, 4]);
    let ops: Vec<SendOpcode> = (0..4)
        .map(|i| ctrl_of(&r.fake.qp(r.qp.qpn()).sq_bb(i)).opcode)
        .collect();
    assert_eq!(
        ops,
        [
            SendOpcode::RdmaWrite,
            SendOpcode::RdmaWrite,
            SendOpcode::Send,
            SendOpcode::RdmaWrite
        ]
    );
    // The batch's WRITEs are the bytes a single post writes.
    r.qp.post_send_batch(&[write(7)]).unwrap();
    r.qp.send_queue().post_withheld(&write(7)).unwrap();
    assert_eq!(without_index(&r, 4), without_index(&r, 5));
}

#[test]
fn a_held_gate_sends_every_post_down_the_general_path() {
    let mut r = rig();
    let sge = r.buf.sge(0, 8);
    let wr = SendWr::new(1, SendOp::Write { remote: remote() }, &[sge]);
    r.qp.post_send(&wr).unwrap(); // warms the key cache
    assert!(r.qp.send_queue().post_fast(&wr).is_some());
    r.qp.send_queue().hold_fast_path(true);
    assert_eq!(r.qp.send_queue().post_fast(&wr), None);
    assert_eq!(
        r.qp.send_queue().post_write_run(std::slice::from_ref(&wr)),
        0
    );
    // The general path still posts: the hold only routes.
    r.qp.post_send(&wr).unwrap();
    r.qp.post_send_batch(&[wr.clone(), wr.clone()]).unwrap();
    assert_eq!(r.qp.send_queue().written(), 5);
    r.qp.send_queue().hold_fast_path(false);
    assert!(r.qp.send_queue().post_fast(&wr).is_some());
}

#[test]
fn a_state_change_from_another_thread_closes_the_fast_path_at_once() {
    let mut r = rig();
    let sge = r.buf.sge(0, 8);
    let wr = SendWr::new(1, SendOp::Write { remote: remote() }, &[sge]);
    r.qp.post_send(&wr).unwrap();
    assert!(r.qp.send_queue().post_fast(&wr).is_some());
    let handle = r.qp.handle();
    std::thread::spawn(move || handle.set_error().unwrap())
        .join()
        .unwrap();
    assert_eq!(r.qp.send_queue().post_fast(&wr), None);
    let e = post_err(&mut r, wr);
    assert!(
        matches!(
            e,
            PostError::NotReadyToSend {
                state: QpState::Err,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn a_deregistration_closes_the_fast_path_of_every_qp_of_the_device() {
    let mut r = rig();
    let mut other = r.pd.create_qp(&r.cq, &r.cq, caps()).unwrap();
    connect(&mut other);
    let tmp = r.pd.alloc_buffer(64, Access::ALL).unwrap();
    let sge = tmp.sge(0, 8);
    let wr = SendWr::new(1, SendOp::Write { remote: remote() }, &[sge]);
    for qp in [&mut r.qp, &mut other] {
        qp.post_send(&wr).unwrap();
        assert!(qp.send_queue().post_fast(&wr).is_some(), "cache warm");
    }
    drop(tmp);
    for qp in [&mut r.qp, &mut other] {
        assert_eq!(qp.send_queue().post_fast(&wr), None);
        let e = qp.post_send(&wr).unwrap_err();
        assert!(matches!(e, PostError::UnknownLkey { .. }), "{e}");
    }
}

#[test]
fn the_doorbell_names_the_last_wqe_whichever_path_wrote_it() {
    let mut r = rig();
    let sge = r.buf.sge(0, 8);
    let write = SendWr::new(1, SendOp::Write { remote: remote() }, &[sge]);
    let big = SendWr::inline(2, SendOp::Send, &[7u8; 60]); // two blocks, general path
    let q = r.fake.qp(r.qp.qpn());
    // General, then fast: the fast one is last.
    r.qp.post_send(&big).unwrap();
    let last = r.qp.post_send(&write).unwrap();
    r.qp.ring_doorbell();
    assert_eq!(q.doorbell_bytes(), q.sq_bb(u32::from(last))[..8]);
    // Fast, then general: the two-block one is last.
    r.qp.post_send(&write).unwrap();
    let last = r.qp.post_send(&big).unwrap();
    r.qp.ring_doorbell();
    assert_eq!(q.doorbell_bytes(), q.sq_bb(u32::from(last))[..8]);
}

// ---- post-time validation ----

fn post_err(r: &mut Rig, wr: SendWr<'_>) -> PostError {
    let before = r.qp.send_queue().written();
    let e = r.qp.post_send(&wr).unwrap_err();
    assert_eq!(
        r.qp.send_queue().written(),
        before,
        "a refused post wrote nothing"
    );
    e
}

#[test]
fn an_unknown_lkey_is_refused_and_named() {
    let mut r = rig();
    let sge = Sge::new(r.buf.addr(), 8, 0xdead00);
    let e = post_err(&mut r, SendWr::new(1, SendOp::Send, &[sge]));
    assert_eq!(
        e.to_string(),
        "lkey 0xdead00 is not registered on device fabric:fake/0"
    );
}

#[test]
fn an_sge_outside_its_mr_is_refused_with_both_ranges() {
    let mut r = rig();
    let sge = r.buf.sge(8190, 4);
    let e = post_err(&mut r, SendWr::new(1, SendOp::Send, &[sge]));
    assert!(matches!(e, PostError::OutsideMr { len: 4, .. }), "{e}");
    assert!(e.to_string().contains("lies outside MR"), "{e}");
}

#[test]
fn inline_longer_than_max_inline_is_refused() {
    let mut r = rig();
    let e = post_err(&mut r, SendWr::inline(1, SendOp::Send, &[0u8; 65]));
    assert_eq!(e, PostError::InlineTooLong { len: 65, max: 64 });
}

#[test]
fn too_many_sges_are_refused() {
    let mut r = rig();
    let sge = r.buf.sge(0, 8);
    let e = post_err(&mut r, SendWr::new(1, SendOp::Send, &[sge; 5]));
    assert_eq!(
        e,
        PostError::TooManySges {
            count: 5,
            max: 4,
            queue: "send"
        }
    );
}

#[test]
fn a_full_send_queue_is_an_error_not_a_wrap() {
    let mut r = rig();
    let sge = r.buf.sge(0, 8);
    // Work requests count against the granted max_send_wr, not the ring's basic blocks
    // (this fake rings twice as many blocks as work requests).
    let capacity = r.qp.caps().max_send_wr;
    assert!(r.qp.send_queue().capacity() > capacity);
    for i in 0..capacity {
        r.qp.post_send(&SendWr::new(u64::from(i), SendOp::Send, &[sge]))
            .unwrap();
    }
    let e = post_err(&mut r, SendWr::new(99, SendOp::Send, &[sge]));
    assert_eq!(
        e,
        PostError::QueueFull {
            queue: "send",
            outstanding: capacity,
            capacity,
            needed: 1
        }
    );
    // One signaled completion of the last WQE frees everything before it.
    r.qp.ring_doorbell();
    r.fake.cq(0).req(r.qp.qpn(), (capacity - 1) as u16, 8);
    let mut wcs = [WorkCompletion::EMPTY; 4];
    assert_eq!(r.cq.poll(&mut wcs), 1);
    r.qp.post_send(&SendWr::new(100, SendOp::Send, &[sge]))
        .unwrap();
}

#[test]
fn posting_outside_rts_is_refused_with_the_state() {
    let r = rig();
    let mut qp = r.pd.create_qp(&r.cq, &r.cq, caps()).unwrap();
    let sge = r.buf.sge(0, 8);
    let e = qp
        .post_send(&SendWr::new(1, SendOp::Send, &[sge]))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("QP {:#x} is in RESET; posting sends needs RTS", qp.qpn())
    );
    let e = qp.post_recv(&RecvWr::new(1, &[sge])).unwrap_err();
    assert_eq!(e, PostError::NotReadyToReceive { qpn: qp.qpn() });
}

#[test]
fn an_lkey_of_another_pd_is_refused() {
    let mut r = rig();
    let other_pd = r.ctx.alloc_pd().unwrap();
    let other = other_pd.alloc_buffer(64, Access::ALL).unwrap();
    let e = post_err(&mut r, SendWr::new(1, SendOp::Send, &[other.sge(0, 8)]));
    assert!(matches!(e, PostError::ForeignLkey { .. }), "{e}");
}

#[test]
fn a_read_into_memory_without_local_write_is_refused() {
    let mut r = rig();
    let ro = r.pd.alloc_buffer(64, Access::REMOTE_READ).unwrap();
    let e = post_err(
        &mut r,
        SendWr::new(1, SendOp::Read { remote: remote() }, &[ro.sge(0, 8)]),
    );
    assert_eq!(e, PostError::NoLocalWrite { lkey: ro.lkey() });
}

#[test]
fn atomics_need_one_eight_byte_sge_and_an_aligned_target() {
    let mut r = rig();
    let op = SendOp::FetchAdd {
        remote: remote(),
        add: 1,
    };
    let (sge16, sge8) = (r.buf.sge(0, 16), r.buf.sge(0, 8));
    let e = post_err(&mut r, SendWr::new(1, op, &[sge16]));
    assert!(
        matches!(
            e,
            PostError::AtomicSge {
                count: 1,
                bytes: 16
            }
        ),
        "{e}"
    );
    let misaligned = SendOp::FetchAdd {
        remote: Remote {
            addr: 0x7000_0004,
            rkey: 1,
        },
        add: 1,
    };
    let e = post_err(&mut r, SendWr::new(1, misaligned, &[sge8]));
    assert_eq!(e, PostError::MisalignedAtomic { addr: 0x7000_0004 });
    let e = post_err(&mut r, SendWr::inline(1, op, &[0u8; 8]));
    assert!(matches!(e, PostError::InlineNotAllowed { .. }), "{e}");
}

#[test]
fn a_deregistered_mr_is_unknown_at_once() {
    let mut r = rig();
    let tmp = r.pd.alloc_buffer(64, Access::ALL).unwrap();
    let sge = tmp.sge(0, 8);
    drop(tmp);
    let e = post_err(&mut r, SendWr::new(1, SendOp::Send, &[sge]));
    assert!(matches!(e, PostError::UnknownLkey { .. }), "{e}");
}

// ---- polling ----

#[test]
fn unsignaled_wqes_complete_with_the_signaled_one_after_them() {
    let mut r = rig();
    let sge = r.buf.sge(0, 8);
    for i in 0..3 {
        r.qp.post_send(&SendWr::new(
            10 + i,
            SendOp::Write { remote: remote() },
            &[sge],
        ))
        .unwrap();
    }
    let last =
        r.qp.post_send(&SendWr::new(13, SendOp::Write { remote: remote() }, &[sge]).signaled())
            .unwrap();
    r.qp.ring_doorbell();
    r.fake.cq(0).req(r.qp.qpn(), last, 0);
    let mut wcs = [WorkCompletion::EMPTY; 8];
    assert_eq!(r.cq.poll(&mut wcs), 1);
    assert_eq!(wcs[0].wr_id, 13);
    assert_eq!(wcs[0].status, WcStatus::Success);
    assert_eq!(wcs[0].opcode, WcOpcode::RdmaWrite);
    assert_eq!(wcs[0].qp_num, r.qp.qpn());
    assert_eq!(r.qp.send_queue().completed(), 4);
    assert_eq!(r.qp.send_queue().outstanding().count(), 0);
    assert_eq!(r.fake.cq(0).dbrec_ci(), 1);
}

#[test]
fn an_error_cqe_is_decoded_to_its_wc_status_and_flushes_follow() {
    let mut r = rig();
    let sge = r.buf.sge(0, 8);
    let a =
        r.qp.post_send(&SendWr::new(1, SendOp::Write { remote: remote() }, &[sge]).signaled())
            .unwrap();
    let b =
        r.qp.post_send(&SendWr::new(2, SendOp::Write { remote: remote() }, &[sge]))
            .unwrap();
    r.qp.ring_doorbell();
    let cq = r.fake.cq(0);
    cq.req_err(r.qp.qpn(), a, Syndrome::TransportRetryExcErr);
    cq.req_err(r.qp.qpn(), b, Syndrome::WrFlushErr);
    let mut wcs = [WorkCompletion::EMPTY; 8];
    assert_eq!(r.cq.poll(&mut wcs), 2);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].status, wcs[0].vendor_err),
        (1, WcStatus::RetryExcErr, 0x81)
    );
    assert_eq!((wcs[1].wr_id, wcs[1].status), (2, WcStatus::WrFlushErr));
    assert!(!wcs[1].is_ok());
}

#[test]
fn receives_complete_in_order_with_their_immediates() {
    let mut r = rig();
    for i in 0..3 {
        r.qp.post_recv(&RecvWr::new(100 + i, &[r.buf.sge(i as usize * 64, 64)]))
            .unwrap();
    }
    let q = r.fake.qp(r.qp.qpn());
    assert_eq!(q.dbrec_recv(), 3);
    let cq = r.fake.cq(0);
    let resp = |opcode, imm| CqeRepr {
        opcode,
        wqe_counter: 0,
        byte_count: 17,
        imm,
        qpn: r.qp.qpn(),
        solicited: false,
        timestamp: 0,
    };
    cq.push(resp(CqeOpcode::RespSend, 0));
    cq.push(resp(CqeOpcode::RespSendImm, 0xaa));
    cq.push(resp(CqeOpcode::RespWrImm, 0xbb));
    let mut wcs = [WorkCompletion::EMPTY; 8];
    assert_eq!(r.cq.poll(&mut wcs), 3);
    let got: Vec<_> = wcs[..3]
        .iter()
        .map(|w| (w.wr_id, w.opcode, w.imm, w.byte_len))
        .collect();
    assert_eq!(
        got,
        vec![
            (100, WcOpcode::Recv, None, 17),
            (101, WcOpcode::Recv, Some(0xaa), 17),
            (102, WcOpcode::RecvRdmaWithImm, Some(0xbb), 17),
        ]
    );
}

#[test]
fn a_receive_wqe_is_its_scatter_list_then_the_terminator() {
    let mut r = rig();
    r.qp.post_recv(&RecvWr::new(1, &[r.buf.sge(0, 32)]))
        .unwrap();
    let slot = r.fake.qp(r.qp.qpn()).rq_slot(0);
    let first = DataSegRepr::parse(&DataSeg::new_checked(&slot[..16]).unwrap()).unwrap();
    assert_eq!(first.byte_count, 32);
    let second = DataSegRepr::parse(&DataSeg::new_checked(&slot[16..32]).unwrap()).unwrap();
    assert!(second.is_terminator());
}

#[test]
fn a_full_receive_queue_is_an_error() {
    let mut r = rig();
    let cap = r.qp.recv_queue().capacity();
    for i in 0..cap {
        r.qp.post_recv(&RecvWr::new(u64::from(i), &[r.buf.sge(0, 8)]))
            .unwrap();
    }
    let e =
        r.qp.post_recv(&RecvWr::new(9, &[r.buf.sge(0, 8)]))
            .unwrap_err();
    assert!(
        matches!(
            e,
            PostError::QueueFull {
                queue: "receive",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn the_owner_bit_flips_each_lap_of_the_cq() {
    let mut r = rig();
    let sge = r.buf.sge(0, 8);
    let cqes = r.cq.poller().capacity();
    let mut wcs = [WorkCompletion::EMPTY; 1];
    for i in 0..cqes * 3 {
        let idx =
            r.qp.post_send(&SendWr::new(u64::from(i), SendOp::Send, &[sge]).signaled())
                .unwrap();
        r.qp.ring_doorbell();
        assert_eq!(r.cq.poll(&mut wcs), 0, "nothing before the device writes");
        r.fake.cq(0).req(r.qp.qpn(), idx, 8);
        assert_eq!(r.cq.poll(&mut wcs), 1);
        assert_eq!(wcs[0].wr_id, u64::from(i));
    }
}

#[test]
fn a_cqe_for_a_wqe_never_rung_is_stale() {
    let mut r = rig();
    let sge = r.buf.sge(0, 8);
    let idx =
        r.qp.post_send(&SendWr::new(1, SendOp::Send, &[sge]).signaled())
            .unwrap();
    r.fake.cq(0).req(r.qp.qpn(), idx, 0);
    let mut wcs = [WorkCompletion::EMPTY; 4];
    assert_eq!(r.cq.poll(&mut wcs), 0);
    assert_eq!(r.cq.poller().stats().stale, 1);
}

#[test]
fn a_cached_key_stops_working_once_its_mr_is_deregistered() {
    let mut r = rig();
    let tmp = r.pd.alloc_buffer(64, Access::ALL).unwrap();
    let sge = tmp.sge(0, 8);
    r.qp.post_send(&SendWr::new(1, SendOp::Send, &[sge]))
        .unwrap();
    drop(tmp);
    let e = post_err(&mut r, SendWr::new(2, SendOp::Send, &[sge]));
    assert!(matches!(e, PostError::UnknownLkey { .. }), "{e}");
}

#[test]
fn a_cached_key_stops_working_once_its_mr_is_deregistered_after_a_failed_lookup_of_another() {
    let mut r = rig();
    let tmp = r.pd.alloc_buffer(64, Access::ALL).unwrap();
    let sge = tmp.sge(0, 8);
    r.qp.post_send(&SendWr::new(1, SendOp::Send, &[sge]))
        .unwrap();
    // The queue now watches another key, which it did not find: the entry it had cached is
    // no longer watched, so it must not be trusted either.
    let unknown = Sge {
        lkey: sge.lkey ^ 0x5a5a_0000,
        ..sge
    };
    let e = post_err(&mut r, SendWr::new(2, SendOp::Send, &[unknown]));
    assert!(matches!(e, PostError::UnknownLkey { .. }), "{e}");
    drop(tmp);
    let e = post_err(&mut r, SendWr::new(3, SendOp::Send, &[sge]));
    assert!(matches!(e, PostError::UnknownLkey { .. }), "{e}");
}

#[test]
fn stale_cqes_are_counted_and_skipped() {
    let mut r = rig();
    r.fake.cq(0).req(r.qp.qpn(), 5, 0); // nothing outstanding
    r.fake.cq(0).req(0xbad, 0, 0); // no such QP
    let mut wcs = [WorkCompletion::EMPTY; 4];
    assert_eq!(r.cq.poll(&mut wcs), 0);
    let stats = r.cq.poller().stats();
    assert_eq!((stats.stale, stats.unknown_qpn), (1, 1));
    assert_eq!(r.cq.poller().consumer_index(), 2);
}

#[test]
fn discarding_a_qps_cqes_keeps_the_others_in_order() {
    let mut r = rig();
    let mut other = r.pd.create_qp(&r.cq, &r.cq, caps()).unwrap();
    connect(&mut other);
    let sge = r.buf.sge(0, 8);
    let mut idx = Vec::new();
    for i in 0..3 {
        idx.push(
            r.qp.post_send(&SendWr::new(i, SendOp::Send, &[sge]).signaled())
                .unwrap(),
        );
        other
            .post_send(&SendWr::new(50 + i, SendOp::Send, &[sge]).signaled())
            .unwrap();
    }
    r.qp.ring_doorbell();
    other.ring_doorbell();
    let cq = r.fake.cq(0);
    for (i, &x) in idx.iter().enumerate() {
        cq.req(r.qp.qpn(), x, 0);
        cq.req(other.qpn(), i as u16, 0);
    }
    assert_eq!(r.cq.discard_qp(r.qp.qpn()), 3);
    let mut wcs = [WorkCompletion::EMPTY; 8];
    assert_eq!(r.cq.poll(&mut wcs), 3);
    let ids: Vec<u64> = wcs[..3].iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, vec![50, 51, 52]);
}

#[test]
fn resetting_a_qp_drops_its_stale_cqes_at_the_next_poll_and_keeps_the_others_in_order() {
    let mut r = rig();
    let mut other = r.pd.create_qp(&r.cq, &r.cq, caps()).unwrap();
    connect(&mut other);
    let sge = r.buf.sge(0, 8);
    let a0 =
        r.qp.post_send(&SendWr::new(1, SendOp::Send, &[sge]).signaled())
            .unwrap();
    let a1 =
        r.qp.post_send(&SendWr::new(2, SendOp::Send, &[sge]).signaled())
            .unwrap();
    let b0 = other
        .post_send(&SendWr::new(50, SendOp::Send, &[sge]).signaled())
        .unwrap();
    r.qp.ring_doorbell();
    other.ring_doorbell();
    let cq = r.fake.cq(0);
    cq.req(r.qp.qpn(), a0, 0);
    cq.req(other.qpn(), b0, 0);
    cq.req(r.qp.qpn(), a1, 0);
    // The QP is reset and brought up again before anyone polled, and takes new work at the
    // index its first stale CQE names.
    r.qp.bring_up_again().unwrap();
    let n0 =
        r.qp.post_send(&SendWr::new(3, SendOp::Send, &[sge]).signaled())
            .unwrap();
    assert_eq!(n0, a0);
    r.qp.ring_doorbell();
    cq.req(r.qp.qpn(), n0, 0);
    let mut wcs = [WorkCompletion::EMPTY; 8];
    let n = r.cq.poll(&mut wcs);
    let ids: Vec<u64> = wcs[..n].iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, vec![50, 3]);
    let stats = r.cq.poller().stats();
    assert_eq!((stats.cleaned, stats.stale), (2, 0));
}
