//! The outage tolerance (`docs/failover.md` 5c): work held while no path answers.

use super::failback::{awaiting_switch_back_ready, backup_error, failback_drained};
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
    // The backup link comes back 3 s after the failure: the peer's answer (to the message
    // sent at the drain) finishes the round.
    step(&mut machine, link_up(Path::Backup), at(3_010));
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
            wait: Duration::ZERO,
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

fn peer_failback(epoch: u32, recvs_completed: u64) -> Event {
    Event::Control(ControlMessage::Failback {
        epoch: Epoch(epoch),
        recvs_completed,
        wait: Duration::ZERO,
    })
}

#[test]
fn a_failback_whose_default_link_goes_down_during_its_handshake_holds_the_work_for_the_tolerance() {
    // The backup dies under traffic with the default link up: the failback's handshake has
    // the handshake timeout (2 s), until the default link goes down 1.9 s in. From then on
    // nothing answers, and the round waits the outage tolerance, not the 0.1 s left of the
    // handshake (before: `outage-tolerance` at 2.1 s, 0.2 s into the outage).
    let mut machine = tolerant_failed_over(Role::Leader);
    assert_eq!(step(&mut machine, backup_error(), at(100)), FAILBACK_START);
    step(&mut machine, failback_drained(progress(4, 4, 2)), at(101));
    let down = Event::LinkDown {
        path: Path::Default,
    };
    step(&mut machine, down, at(2_000));
    assert_eq!(
        machine.poll_timeout(),
        Some(at(2_000) + DEFAULT_OUTAGE_TOLERANCE)
    );
    let actions = step(&mut machine, Event::Tick, at(2_100));
    assert_eq!(surfaced(&actions), None, "{actions:?}");
    assert_eq!(machine.send_route(), Route::DefaultWithheld);
    // Back 3 s later: the peer's Failback arrives and the round goes on.
    let up = Event::LinkUp {
        path: Path::Default,
    };
    step(&mut machine, up, at(5_000));
    let actions = step(&mut machine, peer_failback(1, 3), at(5_010));
    assert!(
        actions.iter().any(|a| matches!(a, Action::Failback { .. })),
        "{actions:?}"
    );
    assert_eq!(machine.failed(), None);
}

#[test]
fn a_failback_whose_default_link_goes_down_during_its_handshake_fails_after_the_tolerance() {
    let mut machine = tolerant_failed_over(Role::Leader);
    step(&mut machine, backup_error(), at(100));
    step(&mut machine, failback_drained(progress(4, 4, 2)), at(101));
    let down = Event::LinkDown {
        path: Path::Default,
    };
    step(&mut machine, down, at(1_000));
    let deadline = at(1_000) + DEFAULT_OUTAGE_TOLERANCE;
    assert_eq!(step(&mut machine, Event::Tick, at(4_000)), []);
    let actions = step(&mut machine, Event::Tick, deadline);
    assert_eq!(
        surfaced(&actions),
        Some((WcStatus::RetryExcErr, FailReason::OutageTolerance))
    );
}

#[test]
fn a_round_whose_backup_link_goes_down_while_awaiting_the_peer_waits_the_tolerance_not_the_handshake(
) {
    // Our `Failover` left at 10 ms; the backup link goes down at 500 ms, so the peer's answer
    // cannot arrive. Before: `handshake-timeout` at 2.01 s, 1.5 s into the outage.
    let mut machine = tolerant(Role::Leader);
    step(&mut machine, retry_exhausted(), at(10));
    step(&mut machine, drained(progress(4, 4, 2)), at(10));
    let down = Event::LinkDown { path: Path::Backup };
    step(&mut machine, down, at(500));
    assert_eq!(
        machine.poll_timeout(),
        Some(at(500) + DEFAULT_OUTAGE_TOLERANCE)
    );
    let actions = step(&mut machine, Event::Tick, at(2_010));
    assert_eq!(surfaced(&actions), None, "{actions:?}");
    assert_eq!(machine.send_route(), Route::DefaultWithheld);
    // Back at 3 s: the handshake gets its whole wait from then.
    step(
        &mut machine,
        Event::LinkUp { path: Path::Backup },
        at(3_000),
    );
    assert_eq!(
        machine.poll_timeout(),
        Some(at(3_000) + DEFAULT_OUTAGE_TOLERANCE)
    );
    assert_eq!(step(&mut machine, Event::Tick, at(5_000)), []);
    step(&mut machine, peer_failover(0, 3, 0), at(4_100));
    assert_eq!(machine.send_phase(), SendPhase::Fallback);
    assert_eq!(machine.failed(), None);
}

#[test]
fn a_round_whose_peer_stays_silent_after_the_backup_link_returns_times_out() {
    let mut machine = tolerant(Role::Leader);
    step(&mut machine, retry_exhausted(), at(10));
    step(&mut machine, drained(progress(4, 4, 2)), at(10));
    step(
        &mut machine,
        Event::LinkDown { path: Path::Backup },
        at(500),
    );
    step(
        &mut machine,
        Event::LinkUp { path: Path::Backup },
        at(1_000),
    );
    // The whole wait from the link-up, not from the message.
    let from_message = at(10) + DEFAULT_OUTAGE_TOLERANCE;
    assert_eq!(step(&mut machine, Event::Tick, from_message), []);
    let actions = step(
        &mut machine,
        Event::Tick,
        at(1_000) + DEFAULT_OUTAGE_TOLERANCE,
    );
    assert_eq!(
        surfaced(&actions),
        Some((WcStatus::RetryExcErr, FailReason::HandshakeTimeout))
    );
}

#[test]
fn a_switch_back_whose_backup_link_flaps_gets_the_handshake_timeout_from_the_link_up() {
    // The `SwitchBack` left at 6.001 s; the backup link is down from 6.1 s to 6.5 s (within
    // the RC budget). Before: `handshake-timeout` at 8.001 s.
    let mut machine = leader_back_on_default_path();
    awaiting_switch_back_ready(&mut machine);
    step(
        &mut machine,
        Event::LinkDown { path: Path::Backup },
        at(6_100),
    );
    step(
        &mut machine,
        Event::LinkUp { path: Path::Backup },
        at(6_500),
    );
    let actions = step(&mut machine, Event::Tick, at(8_001));
    assert_eq!(surfaced(&actions), None, "{actions:?}");
    let epoch = machine.epoch().0;
    let actions = step(&mut machine, switch_back_ready(epoch), at(8_100));
    assert_eq!(actions, [Action::ReleaseDefaultDoorbell]);
    assert_eq!(machine.send_phase(), SendPhase::Default);
}

#[test]
fn a_failback_whose_peer_is_silent_while_this_ends_default_link_is_up_waits_the_tolerance() {
    // The backup dies under traffic; this end's default link is up, the peer's default NIC
    // is down (this end cannot see it), so the peer's `Failback` waits at its end. Before:
    // `handshake-timeout` 2 s after the start, with the peer's message still on its way.
    let mut machine = tolerant_failed_over(Role::Leader);
    assert_eq!(step(&mut machine, backup_error(), at(100)), FAILBACK_START);
    step(&mut machine, failback_drained(progress(4, 4, 2)), at(101));
    assert_eq!(
        machine.poll_timeout(),
        Some(at(100) + DEFAULT_OUTAGE_TOLERANCE)
    );
    let actions = step(&mut machine, Event::Tick, at(2_100));
    assert_eq!(surfaced(&actions), None, "{actions:?}");
    let actions = step(&mut machine, peer_failback(1, 3), at(3_500));
    assert!(
        actions.iter().any(|a| matches!(a, Action::Failback { .. })),
        "{actions:?}"
    );
    // A peer that never answers: the connection ends at the tolerance.
    let mut silent = tolerant_failed_over(Role::Leader);
    step(&mut silent, backup_error(), at(100));
    step(&mut silent, failback_drained(progress(4, 4, 2)), at(101));
    let actions = step(&mut silent, Event::Tick, at(100) + DEFAULT_OUTAGE_TOLERANCE);
    assert_eq!(
        surfaced(&actions),
        Some((WcStatus::RetryExcErr, FailReason::HandshakeTimeout))
    );
}

#[test]
fn a_round_whose_peer_cannot_answer_waits_the_tolerance_not_the_handshake_timeout() {
    // This end's links are up; the peer's backup NIC is down (this end cannot see it), so
    // the peer's `Failover` waits at its end. Before: `handshake-timeout` 2 s after our
    // message (the chaos scenario, write seed 3).
    let mut machine = tolerant(Role::Leader);
    step(&mut machine, retry_exhausted(), at(10));
    step(&mut machine, drained(progress(4, 4, 2)), at(10));
    assert_eq!(
        machine.poll_timeout(),
        Some(at(10) + DEFAULT_OUTAGE_TOLERANCE)
    );
    let actions = step(&mut machine, Event::Tick, at(2_010));
    assert_eq!(surfaced(&actions), None, "{actions:?}");
    step(&mut machine, peer_failover(0, 3, 0), at(3_000));
    assert_eq!(machine.send_phase(), SendPhase::Fallback);
    let config = Config::new(Role::Leader);
    assert_eq!(config.handshake_wait(), DEFAULT_OUTAGE_TOLERANCE);
    // Without a tolerance (the RC budget alone) the handshake timeout stays.
    assert_eq!(
        rc_only(Role::Leader).handshake_wait(),
        config.handshake_timeout
    );
}

/// Issue 29, "whichever path answers first": a round whose peer cannot answer over the
/// backup path (its side of it down, where this end cannot see it) while the default link
/// came back fails back over the default pair once the round has waited the handshake
/// timeout (2 s), instead of waiting out the whole handshake wait (the outage tolerance) (the chaos scenario's loss, seed 3: the default path
/// up for 1.6 s of such a wait, then `handshake-timeout` here and `outage-tolerance` at the
/// peer). Both roles.
#[test]
fn a_round_whose_peer_is_silent_fails_back_once_the_default_link_is_back() {
    for role in [Role::Leader, Role::Follower] {
        let mut machine = tolerant(role);
        step(&mut machine, link_down(Path::Default), at(10));
        step(&mut machine, drained(progress(4, 4, 2)), at(11));
        assert_eq!(machine.send_phase(), SendPhase::FailingOver);
        assert_eq!(step(&mut machine, link_up(Path::Default), at(2_500)), []);
        assert_eq!(machine.poll_timeout(), Some(at(2_500)), "{role:?}");
        assert_eq!(step(&mut machine, Event::Tick, at(2_500)), FAILBACK_START);
        assert_eq!(machine.send_phase(), SendPhase::FailingBack);
        step(&mut machine, failback_drained(progress(4, 4, 2)), at(2_501));
        // The peer follows our `Failback` (its round has not finished either) and the
        // default pair comes up in a new epoch.
        let actions = step(&mut machine, peer_failback(1, 3), at(2_510));
        assert!(
            actions.iter().any(|a| matches!(a, Action::Failback { .. })),
            "{role:?}: {actions:?}"
        );
        assert_eq!(machine.failed(), None);
    }
}

#[test]
fn a_default_link_back_early_in_a_round_leaves_the_peer_the_handshake_timeout_to_answer() {
    let mut machine = tolerant(Role::Leader);
    step(&mut machine, link_down(Path::Default), at(10));
    step(&mut machine, drained(progress(4, 4, 2)), at(11));
    step(&mut machine, link_up(Path::Default), at(300));
    assert_eq!(machine.poll_timeout(), Some(at(2_010)));
    assert_eq!(step(&mut machine, Event::Tick, at(2_009)), []);
    // The peer's answer within the handshake timeout finishes the round as usual.
    step(&mut machine, peer_failover(0, 3, 0), at(2_009));
    assert_eq!(machine.send_phase(), SendPhase::Fallback);
}

#[test]
fn a_round_begun_by_an_error_on_a_link_reported_up_waits_for_the_peer() {
    let mut machine = tolerant(Role::Leader);
    step(&mut machine, retry_exhausted(), at(10));
    step(&mut machine, drained(progress(4, 4, 2)), at(11));
    // The default link never went down: nothing says the default path is back.
    assert_eq!(
        machine.poll_timeout(),
        Some(at(10) + Config::new(Role::Leader).handshake_wait())
    );
    assert_eq!(step(&mut machine, Event::Tick, at(3_000)), []);
    assert_eq!(machine.send_phase(), SendPhase::FailingOver);
}

/// A leader whose default link was reported down at 100 ms and up at 1,000 ms, with no round:
/// the flap came and went while the default QP carried nothing the link watch acts on (in the
/// chaos run: during a failback); here the reports alone, without the link watch.
fn default_link_flapped_at_100_to_1_000() -> Failover {
    let mut machine = Failover::new(
        Config {
            link_watch: false,
            ..Config::new(Role::Leader)
        },
        at(0),
    );
    step(&mut machine, link_down(Path::Default), at(100));
    step(&mut machine, link_up(Path::Default), at(1_000));
    machine
}

/// The ten-minute chaos run's loss (READ, seed 2): the default link down and back (the far
/// switch port, 0.9 s), then, 1.2 s after it came back, the QP's retries run out (the netdev
/// carried nothing until the kernel reported it running): a round begun by an RC error on a
/// link reported up, which is the tail of that outage. Its peer silent (its answer goes over
/// a backup path down at one end) for the handshake timeout, it fails back, as a round during
/// which the link came back does. Before, it waited out the handshake wait and the
/// connection was lost with the default path up.
#[test]
fn a_round_begun_by_an_error_soon_after_the_default_link_came_back_fails_back_after_the_handshake_timeout(
) {
    let mut machine = default_link_flapped_at_100_to_1_000();
    step(&mut machine, retry_exhausted(), at(2_200));
    step(&mut machine, drained(progress(4, 4, 2)), at(2_200));
    let due = at(2_200) + Config::new(Role::Leader).handshake_timeout;
    assert_eq!(machine.poll_timeout(), Some(due));
    assert_eq!(step(&mut machine, Event::Tick, due), FAILBACK_START);
}

/// An RC error long after the last flap (past the outage tolerance) is not taken as its tail:
/// the round waits for the peer as before.
#[test]
fn a_round_begun_by_an_error_long_after_the_default_link_came_back_waits_for_the_peer() {
    let mut machine = default_link_flapped_at_100_to_1_000();
    let late = at(1_000) + Config::new(Role::Leader).no_path_wait() + Duration::from_millis(1);
    step(&mut machine, retry_exhausted(), late);
    step(&mut machine, drained(progress(4, 4, 2)), late);
    assert_eq!(
        machine.poll_timeout(),
        Some(late + Config::new(Role::Leader).handshake_wait())
    );
}
