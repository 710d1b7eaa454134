//! The control objects against the fake provider: lifetimes, deregistration, the QP's state
//! table and its saved attributes.

use super::testing::{caps, remote, rig, Rig};
use super::*;
use crate::datapath::wr::*;
use crate::qp_state::{QpState, TransitionError};
use crate::verbs::{Access, QpAttr};

#[test]
fn a_provider_without_ud_refuses_a_ud_qp_with_a_clear_error() {
    // The fake provider, as mlx5 today, makes RC QPs only.
    let r = rig();
    let refused = r.pd.create_ud_qp(&r.cq, &r.cq, caps()).map(|_| ());
    match refused {
        Err(crate::provider::VerbsError::Unsupported { verb, what, .. }) => {
            assert_eq!(verb, "create_qp");
            assert!(what.contains("UD"), "{what}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn objects_keep_their_parents_alive_and_release_everything_on_drop() {
    let r = rig();
    let fake = r.fake.clone();
    assert!(fake.live_objects() > 0);
    let Rig {
        ctx,
        pd,
        cq,
        qp,
        buf,
        ..
    } = r;
    // Dropping the application's handles to the parents first is fine: children hold them.
    drop(ctx);
    drop(pd);
    drop(cq);
    assert_eq!(qp.state(), QpState::Rts);
    drop(qp);
    drop(buf);
    assert_eq!(fake.live_objects(), 0);
}

#[test]
fn a_device_that_refuses_to_destroy_is_logged_and_counted_not_a_panic() {
    let r = rig();
    let ctx = r.ctx.clone();
    r.fake
        .fail_destroy
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let Rig {
        pd, cq, qp, buf, ..
    } = r;
    drop(buf); // dereg_mr fails
    drop(qp); // destroy_qp fails
    drop(cq); // destroy_cq fails
    drop(pd); // dealloc_pd fails
    assert_eq!(ctx.stats().destroy_failures(), 4);
}

#[test]
fn a_buffer_whose_dereg_the_device_refuses_is_never_handed_out_again() {
    let r = rig();
    let addr = r.buf.addr();
    let again = r.pd.alloc_buffer(8192, Access::ALL).unwrap();
    let next = again.addr();
    // The pool hands freed memory out again (first fit): that is what must not happen to
    // memory the device may still write.
    drop(again);
    assert_eq!(r.pd.alloc_buffer(8192, Access::ALL).unwrap().addr(), next);
    r.fake
        .fail_destroy
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let Rig {
        ctx, pd, fake, buf, ..
    } = r;
    drop(buf);
    fake.fail_destroy
        .store(false, std::sync::atomic::Ordering::Relaxed);
    let bufs: Vec<_> = (0..4)
        .map(|_| pd.alloc_buffer(8192, Access::ALL).unwrap())
        .collect();
    for b in &bufs {
        let (start, end) = (b.addr(), b.addr() + b.len() as u64);
        assert!(
            end <= addr || start >= addr + 8192,
            "{start:#x}..{end:#x} reuses the quarantined {addr:#x}"
        );
    }
    assert_eq!(ctx.stats().quarantined_blocks(), 1);
    assert_eq!(ctx.stats().quarantined_bytes(), 8192);
}

#[test]
fn an_explicit_deregister_says_whether_the_device_agreed() {
    let r = rig();
    // SAFETY: the buffer outlives both MRs (the refused one stays registered with the fake
    // device, which never touches memory).
    let (ok, refused) = unsafe {
        (
            r.pd.register(r.buf.as_ptr(), 64, Access::LOCAL_WRITE)
                .unwrap(),
            r.pd.register(r.buf.as_ptr(), 64, Access::LOCAL_WRITE)
                .unwrap(),
        )
    };
    let refused_lkey = refused.lkey();
    assert!(ok.deregister().is_ok());
    r.fake
        .fail_destroy
        .store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(refused.deregister().is_err());
    r.fake
        .fail_destroy
        .store(false, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(r.ctx.stats().destroy_failures(), 1);
    // Its key is gone from the table all the same: nothing posts with it.
    assert!(r.ctx.keys().get(refused_lkey).is_none());
}

/// A device writing a buffer while the application reads it (a peer's WRITE or atomic racing
/// the application: a bug or a hostile peer) is not a data race. Under Miri (`cargo +nightly
/// miri test -p pmd --lib racing`) plain copies on either side are reported as one, and so is
/// a byte-wise read of a word the device updates with a 64-bit atomic.
#[test]
fn reads_racing_a_device_s_writes_and_atomics_are_not_data_races() {
    let r = rig();
    let rounds = if cfg!(miri) { 3 } else { 1000 };
    let (buf, addr) = (&r.buf, r.buf.addr());
    std::thread::scope(|s| {
        s.spawn(move || {
            for round in 0..rounds {
                // What softnic's engine does for a peer's WRITE (byte-wise atomic stores) and
                // FETCH_ADD (a 64-bit atomic read-modify-write on the aligned word).
                // SAFETY: inside the registered buffer, which outlives the scope.
                unsafe { crate::memory::store_shared(&[round as u8 | 1; 64], addr as *mut u8) };
                // SAFETY: as above; offset 64 of a 64-byte aligned block is 8-byte aligned.
                unsafe { std::sync::atomic::AtomicU64::from_ptr((addr + 64) as *mut u64) }
                    .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            }
        });
        let mut seen = [0u8; 64];
        let mut last = 0;
        for _ in 0..rounds {
            buf.read(0, &mut seen);
            assert!(seen.iter().all(|b| *b == 0 || b % 2 == 1), "{seen:?}");
            let count = buf.read_u64(64);
            assert!(count >= last && count <= rounds);
            last = count;
        }
    });
}

#[test]
fn qp_brings_up_through_the_table_and_saves_its_attributes() {
    let r = rig();
    assert_eq!(r.qp.state(), QpState::Rts);
    assert_eq!(r.fake.qp(r.qp.qpn()).state, QpState::Rts);
    let saved = r.qp.saved_attributes();
    assert_eq!(saved.rtr.unwrap().dest_qpn, Some(0x99));
    assert_eq!(saved.rts.unwrap().sq_psn, Some(200));
}

#[test]
fn illegal_transitions_and_missing_attributes_are_refused_before_the_device() {
    let r = rig();
    let mut qp = r.pd.create_qp(&r.cq, &r.cq, caps()).unwrap();
    let err = qp.modify(QpState::Rts, &QpAttr::rts(0)).unwrap_err();
    assert_eq!(
        err,
        ModifyError::Transition(TransitionError::Illegal {
            from: QpState::Reset,
            to: QpState::Rts
        })
    );
    let mut attr = QpAttr::init(Access::ALL);
    attr.port = None;
    let err = qp.modify(QpState::Init, &attr).unwrap_err();
    assert_eq!(
        err.to_string(),
        "QP transition RESET -> INIT is missing required attributes: port"
    );
    assert_eq!(qp.state(), QpState::Reset);
    assert_eq!(r.fake.qp(qp.qpn()).state, QpState::Reset);
}

#[test]
fn a_device_refusing_a_transition_leaves_the_state_unchanged() {
    let r = rig();
    let mut qp = r.pd.create_qp(&r.cq, &r.cq, caps()).unwrap();
    r.fake
        .fail_modify
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let err = qp
        .modify(QpState::Init, &QpAttr::init(Access::ALL))
        .unwrap_err();
    assert!(matches!(err, ModifyError::Verbs(_)), "{err}");
    assert_eq!(qp.state(), QpState::Reset);
}

#[test]
fn a_reset_qp_comes_back_from_saved_attributes_with_empty_rings() {
    let mut r = rig();
    let sge = r.buf.sge(0, 64);
    r.qp.post_send(&SendWr::new(1, SendOp::Write { remote: remote() }, &[sge]))
        .unwrap();
    r.qp.ring_doorbell();
    r.qp.handle().set_error().unwrap();
    assert_eq!(r.qp.state(), QpState::Err);
    r.qp.bring_up_again().unwrap();
    assert_eq!(r.qp.state(), QpState::Rts);
    assert_eq!(r.fake.qp(r.qp.qpn()).state, QpState::Rts);
    assert_eq!(r.qp.send_queue().written(), 0);
    // And it works: the next WQE is index 0 again.
    let idx =
        r.qp.post_send(&SendWr::new(2, SendOp::Write { remote: remote() }, &[sge]))
            .unwrap();
    assert_eq!(idx, 0);
}

#[test]
fn bring_up_again_without_a_first_bring_up_says_what_is_missing() {
    let r = rig();
    let mut qp = r.pd.create_qp(&r.cq, &r.cq, caps()).unwrap();
    let err = qp.bring_up_again().unwrap_err();
    assert_eq!(
        err,
        ModifyError::NotSaved {
            qpn: qp.qpn(),
            state: QpState::Init
        }
    );
}

#[test]
fn saved_attributes_can_be_updated_for_a_new_peer() {
    let mut r = rig();
    r.qp.update_saved_attributes(|s| s.rtr.as_mut().unwrap().dest_qpn = Some(0x77));
    r.qp.bring_up_again().unwrap();
    assert_eq!(r.qp.saved_attributes().rtr.unwrap().dest_qpn, Some(0x77));
}
