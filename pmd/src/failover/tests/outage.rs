//! The outage tolerance (`docs/failover.md` 5c): work held while no path answers.

use super::failback::{backup_error, failback_drained};
use super::*;

/// Drives a default-configured leader into Fallback.
fn tolerant_failed_over(role: Role) -> Failover {
    let mut machine = tolerant(role);
    step(&mut machine, retry_exhausted(), at(10));
    step(&mut machine, drained(progress(4, 4, 2)), at(10));
    step(&mut machine, peer_failover(0, 3, 0), at(11));
    assert_eq!(machine.send_phase(), SendPhase::Fallback);
    machine
}

#[test]
fn the_default_outage_tolerance_is_one_nccl_try_and_longer_than_the_rc_budget() {
    let config = Config::new(Role::Leader);
    assert_eq!(config.outage_tolerance, Duration::from_nanos(4096 << 20));
    assert_eq!(config.no_path_wait(), config.outage_tolerance);
    assert!(config.no_path_wait() > budget());
    // A tolerance below the RC budget never shortens what a plain RC QP would wait.
    assert_eq!(rc_only(Role::Leader).no_path_wait(), budget());
}

#[test]
fn a_default_failure_with_the_backup_link_down_holds_the_work_past_the_rc_budget() {
    let mut machine = tolerant(Role::Follower);
    step(&mut machine, link_down(Path::Backup), at(5));
    step(&mut machine, retry_exhausted(), at(10));
    step(&mut machine, drained(progress(4, 4, 2)), at(11));
    assert_eq!(
        machine.poll_timeout(),
        Some(at(10) + DEFAULT_OUTAGE_TOLERANCE)
    );
    // Past the RC budget nothing has failed: sends are withheld, not failed.
    let later = at(10) + budget() + Duration::from_millis(1);
    assert_eq!(step(&mut machine, Event::Tick, later), []);
    assert_eq!(machine.failed(), None);
    assert_eq!(machine.send_route(), Route::DefaultWithheld);
    // The backup link comes back 3 s after the failure: the round goes on.
    let actions = step(&mut machine, link_up(Path::Backup), at(3_010));
    assert!(
        actions.iter().any(|a| matches!(
            a,
            Action::SendControl {
                via: Path::Backup,
                message: ControlMessage::Failover { .. }
            }
        )),
        "{actions:?}"
    );
    step(&mut machine, peer_failover(0, 3, 0), at(3_020));
    assert_eq!(machine.send_phase(), SendPhase::Fallback);
    assert_eq!(machine.failed(), None);
}

#[test]
fn a_default_failure_with_the_backup_link_down_past_the_tolerance_fails_naming_it() {
    let mut machine = tolerant(Role::Leader);
    step(&mut machine, link_down(Path::Backup), at(5));
    step(&mut machine, retry_exhausted(), at(10));
    step(&mut machine, drained(progress(2, 2, 0)), at(11));
    let deadline = machine.poll_timeout().unwrap();
    assert_eq!(deadline, at(10) + DEFAULT_OUTAGE_TOLERANCE);
    assert_eq!(step(&mut machine, Event::Tick, at(4_000)), []);
    assert_fails_at(&mut machine, deadline, FailReason::OutageTolerance);
}

#[test]
fn a_failback_with_the_default_link_down_holds_the_work_for_the_tolerance() {
    let mut machine = tolerant_failed_over(Role::Leader);
    step(&mut machine, link_down(Path::Default), at(12));
    assert_eq!(step(&mut machine, backup_error(), at(100)), FAILBACK_START);
    step(&mut machine, failback_drained(progress(4, 4, 2)), at(101));
    assert_eq!(
        machine.poll_timeout(),
        Some(at(100) + DEFAULT_OUTAGE_TOLERANCE)
    );
    // Two seconds without a path: still held.
    assert_eq!(step(&mut machine, Event::Tick, at(2_100)), []);
    assert_eq!(machine.failed(), None);
    assert_eq!(machine.send_route(), Route::DefaultWithheld);
    // The default link is back: the peer's Failback and the bring-up go on as in 5e.
    step(&mut machine, link_up(Path::Default), at(2_200));
    let actions = step(
        &mut machine,
        Event::Control(ControlMessage::Failback {
            epoch: Epoch(1),
            recvs_completed: 3,
        }),
        at(2_210),
    );
    assert!(
        actions.iter().any(|a| matches!(a, Action::Failback { .. })),
        "{actions:?}"
    );
    assert_eq!(machine.failed(), None);
}

#[test]
fn a_failback_with_the_default_link_down_past_the_tolerance_fails_naming_it() {
    let mut machine = tolerant_failed_over(Role::Leader);
    step(&mut machine, link_down(Path::Default), at(12));
    step(&mut machine, backup_error(), at(100));
    step(&mut machine, failback_drained(progress(4, 4, 2)), at(101));
    let deadline = machine.poll_timeout().unwrap();
    assert_fails_at(&mut machine, deadline, FailReason::OutageTolerance);
    assert_eq!(
        FailReason::OutageTolerance.to_string(),
        "no path answered for the whole outage tolerance"
    );
}

#[test]
fn the_backup_link_down_in_fallback_holds_the_work_past_the_rc_budget() {
    let mut machine = tolerant_failed_over(Role::Leader);
    step(&mut machine, link_down(Path::Backup), at(100));
    assert_eq!(
        machine.poll_timeout(),
        Some(at(100) + DEFAULT_OUTAGE_TOLERANCE)
    );
    let later = at(100) + budget() + Duration::from_millis(1);
    assert_eq!(step(&mut machine, Event::Tick, later), []);
    assert_eq!(machine.failed(), None);
    step(&mut machine, link_up(Path::Backup), at(1_500));
    assert_eq!(machine.send_phase(), SendPhase::Fallback);
    assert_eq!(machine.failed(), None);
}
