//! Revocation that failover never undoes (issue 16 item 1), over softnic devices on the
//! in-memory fabric, deterministic: an access-flag cut reaches the backup QP at once and
//! survives a re-arm of the default QP.

mod sim;

use std::time::Duration;

use pmd::resilient::ResilientState;
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
