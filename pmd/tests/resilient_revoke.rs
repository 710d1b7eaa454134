//! Revocation that failover never undoes, over softnic devices on the
//! in-memory fabric, deterministic: an access-flag cut reaches the backup QP at once and
//! survives a re-arm of the default QP.

mod sim;

use std::time::Duration;

use pmd::resilient::{Grant, LeaseId, Leases, ResilientState, RevokeOutcome};
use pmd::{Access, QpAttr, QpState, SendOp, SendWr, WcStatus, WorkCompletion};
use sim::*;

fn completions(sim: &mut Sim, a: bool, n: usize, limit: Duration) -> Vec<WorkCompletion> {
    let mut got = Vec::new();
    sim.run_until(limit, |s| {
        s.poll(a);
        got.append(&mut s.host(a).wcs);
        got.len() >= n
    });
    got
}

/// B's QP no longer takes RDMA WRITEs (RTS -> RTS, REMOTE_READ only).
fn cut_writes(sim: &mut Sim) {
    let cut = QpAttr {
        access: Some(Access::REMOTE_READ),
        ..QpAttr::default()
    };
    sim.b.qp.modify(QpState::Rts, &cut).unwrap();
}

/// A writes 64 bytes into B's buffer; returns the completion's status.
fn write_to_b(sim: &mut Sim, wr_id: u64) -> WcStatus {
    sim.a.buf.write(0, &[0xab; 64]);
    let wr = SendWr::new(
        wr_id,
        SendOp::Write {
            remote: sim.b.buf.remote(4096),
        },
        &[sim.a.buf.sge(0, 64)],
    )
    .signaled();
    sim.a.qp.post_send(&wr).unwrap();
    sim.a.qp.ring_doorbell();
    let wcs = completions(sim, true, 1, Duration::from_secs(2));
    assert_eq!(wcs.len(), 1, "no completion of the WRITE");
    wcs[0].status
}

fn b_got_the_bytes(sim: &Sim) -> bool {
    let mut got = [0u8; 64];
    sim.b.buf.read(4096, &mut got);
    got == [0xab; 64]
}

#[test]
fn an_access_cut_reaches_the_backup_qp_at_once() {
    let mut sim = Sim::new(21, config());
    cut_writes(&mut sim);
    sim.link_down(A_DEFAULT, None);
    assert!(
        sim.run_until(Duration::from_secs(2), |s| {
            s.poll(true);
            s.poll(false);
            s.a.qp.state() == ResilientState::Fallback && s.b.qp.state() == ResilientState::Fallback
        }),
        "no failover: {:?} {:?}",
        sim.a.qp.state(),
        sim.b.qp.state()
    );
    // On the backup path, B's backup QP must refuse the WRITE as its default QP would.
    assert_eq!(write_to_b(&mut sim, 1), WcStatus::RemAccessErr);
    assert!(
        !b_got_the_bytes(&sim),
        "the WRITE landed through the backup QP"
    );
}

#[test]
fn a_rearm_rebuilds_the_default_qp_with_the_cut_access() {
    let mut sim = Sim::new(22, config());
    cut_writes(&mut sim);
    sim.link_down(A_DEFAULT, Some(Duration::from_millis(30)));
    let back = sim.run_until(Duration::from_secs(5), |s| {
        s.poll(true);
        s.poll(false);
        s.a.qp.stats().switch_backs == 1
            && s.b.qp.stats().switch_backs == 1
            && s.a.qp.state() == ResilientState::Default
            && s.b.qp.state() == ResilientState::Default
    });
    assert!(
        back,
        "no failover and switch-back: {:?} {:?} {:?}",
        sim.a.qp.stats(),
        sim.b.qp.state(),
        sim.b.qp.stats()
    );
    // B's default QP was reset and brought up again: with the cut, not the first INIT's access.
    assert_eq!(write_to_b(&mut sim, 1), WcStatus::RemAccessErr);
    assert!(
        !b_got_the_bytes(&sim),
        "the WRITE landed through the re-armed default QP"
    );
}

/// Moves B's QP and buffer into a lease table (the sim drives a spare QP in their place) and
/// returns the table, the lease and the buffer's remote address.
fn lease_b(sim: &mut Sim) -> (Leases, LeaseId, pmd::Remote) {
    let spare_qp = sim.b.pd.create_qp(caps()).unwrap();
    let spare_buf = sim.b.pd.alloc_buffer(4096, Access::ALL).unwrap();
    let qp = std::mem::replace(&mut sim.b.qp, spare_qp);
    let buf = std::mem::replace(&mut sim.b.buf, spare_buf);
    let remote = buf.remote(4096);
    let mut leases = Leases::new(sim.b.service.clock().clone(), Duration::from_millis(100));
    let id = leases.grant(qp, vec![Grant::Buffer(buf)]);
    (leases, id, remote)
}

/// A WRITEs 64 bytes of `byte` to `remote` and runs (B's leased QP progressing too) until it
/// completes; returns its status.
fn write_leased(
    sim: &mut Sim,
    leases: &mut Leases,
    id: LeaseId,
    remote: pmd::Remote,
    byte: u8,
) -> WcStatus {
    sim.a.buf.write(0, &[byte; 64]);
    let wr = SendWr::new(
        u64::from(byte),
        SendOp::Write { remote },
        &[sim.a.buf.sge(0, 64)],
    )
    .signaled();
    sim.a.qp.post_send(&wr).unwrap();
    sim.a.qp.ring_doorbell();
    let mut got = Vec::new();
    sim.run_until(Duration::from_secs(5), |s| {
        if let Some(qp) = leases.qp(id) {
            qp.progress();
        }
        s.poll(true);
        got.append(&mut s.a.wcs);
        !got.is_empty()
    });
    assert!(!got.is_empty(), "the WRITE never completed");
    got[0].status
}

fn leased_bytes(leases: &Leases, id: LeaseId) -> Option<[u8; 64]> {
    let Grant::Buffer(b) = &leases.memory(id)?[0] else {
        return None;
    };
    let mut got = [0u8; 64];
    b.read(4096, &mut got);
    Some(got)
}

#[test]
fn a_revoked_lease_is_torn_down_on_both_nics_and_a_failover_never_undoes_it() {
    let mut sim = Sim::new(23, config());
    let (mut leases, id, remote) = lease_b(&mut sim);
    assert_eq!(
        write_leased(&mut sim, &mut leases, id, remote, 1),
        WcStatus::Success
    );
    assert_eq!(leased_bytes(&leases, id), Some([1; 64]));
    let Some(Grant::Buffer(buf)) = leases.memory(id).map(|m| &m[0]) else {
        unreachable!()
    };
    let addr = buf.as_ptr();
    assert_eq!(leases.revoke(id), RevokeOutcome::TornDown);
    assert_eq!(leases.revoke(id), RevokeOutcome::NotFound);
    // A non-cooperating peer keeps writing: the default path refuses it, A fails over, and
    // the backup path must refuse it too (B never answers a handshake again).
    let status = write_leased(&mut sim, &mut leases, id, remote, 2);
    assert_ne!(status, WcStatus::Success);
    sim.run_for(Duration::from_millis(200));
    // SAFETY: the memory is held by the draining lease until the sweep; nothing writes it.
    let after = unsafe { std::slice::from_raw_parts(addr, 4096 + 64) };
    assert_eq!(&after[4096..], &[1; 64], "a WRITE landed after the revoke");
    assert_eq!(sim.a.qp.state(), ResilientState::Failed);
    assert_eq!(leases.draining(), 1);
    assert_eq!(leases.sweep(), 1, "the grace period has passed");
    assert_eq!(leases.fenced().count(), 0);
}

#[test]
fn a_lease_revoked_on_the_backup_path_is_refused_there() {
    let mut sim = Sim::new(24, config());
    let (mut leases, id, remote) = lease_b(&mut sim);
    sim.link_down(A_DEFAULT, None);
    let failed_over = sim.run_until(Duration::from_secs(2), |s| {
        if let Some(qp) = leases.qp(id) {
            qp.progress();
        }
        s.poll(true);
        s.a.qp.state() == ResilientState::Fallback
            && leases
                .qp(id)
                .is_some_and(|q| q.state() == ResilientState::Fallback)
    });
    assert!(failed_over, "no failover: {:?}", sim.a.qp.state());
    assert_eq!(
        write_leased(&mut sim, &mut leases, id, remote, 1),
        WcStatus::Success
    );
    let Some(Grant::Buffer(buf)) = leases.memory(id).map(|m| &m[0]) else {
        unreachable!()
    };
    let addr = buf.as_ptr();
    assert_eq!(leases.revoke(id), RevokeOutcome::TornDown);
    let status = write_leased(&mut sim, &mut leases, id, remote, 2);
    assert_ne!(status, WcStatus::Success);
    // SAFETY: as above.
    let after = unsafe { std::slice::from_raw_parts(addr, 4096 + 64) };
    assert_eq!(&after[4096..], &[1; 64], "a WRITE landed after the revoke");
}
