//! One behaviour per test, named for it.

use core::time::Duration;

use super::*;

mod failback;
mod management;
mod outage;
mod repair;

/// Incarnation `n` of the backup side.
const fn backup(n: u32) -> SideEpoch {
    SideEpoch::Backup(BackupEpoch(n))
}

/// Incarnation `n` of the default devices' channel.
const fn channel(n: u32) -> SideEpoch {
    SideEpoch::DefaultChannel(ChannelEpoch(n))
}

/// What an end does first when the backup dies under traffic: both QPs to ERR, then drain.
const FAILBACK_START: [Action; 3] = [
    Action::MoveQpToErr { path: Path::Backup },
    Action::MoveQpToErr {
        path: Path::Default,
    },
    Action::DrainForFailback,
];

fn at(millis: u64) -> Timestamp {
    Timestamp::from_nanos(millis * 1_000_000)
}

/// An end that waits the RC retry budget alone while no path answers (an outage tolerance of
/// zero, the behaviour of 5b): most tests check one step of the protocol, not the tolerance.
fn end(role: Role) -> Failover {
    Failover::new(rc_only(role), at(0))
}

fn rc_only(role: Role) -> Config {
    Config {
        outage_tolerance: Duration::ZERO,
        ..Config::new(role)
    }
}

/// An end with the default configuration, outage tolerance included.
fn tolerant(role: Role) -> Failover {
    Failover::new(Config::new(role), at(0))
}

fn step(machine: &mut Failover, event: Event, now: Timestamp) -> Vec<Action> {
    let out = machine.handle(event, now);
    assert!(
        out.len() <= MAX_ACTIONS_PER_EVENT,
        "{event:?} produced {out:?}"
    );
    out.to_vec()
}

fn progress(sends_posted: u64, recvs_posted: u64, recvs_completed: u64) -> Progress {
    Progress {
        sends_posted,
        sends_completed: 0,
        recvs_posted,
        recvs_completed,
    }
}

fn drained(progress: Progress) -> Event {
    Event::DefaultDrained {
        progress,
        first_error: None,
        atomic_in_flight: false,
        sends_before_first_read: None,
    }
}

fn peer_failover(epoch: u32, recvs_completed: u64, stale_recvs: u64) -> Event {
    Event::Control(ControlMessage::Failover {
        epoch: Epoch(epoch),
        recvs_completed,
        stale_recvs,
    })
}

fn rearm(epoch: u32) -> Event {
    Event::Control(ControlMessage::Rearm {
        epoch: Epoch(epoch),
    })
}

fn rearm_done(epoch: u32, ok: bool) -> Event {
    Event::Control(ControlMessage::RearmDone {
        epoch: Epoch(epoch),
        ok,
    })
}

fn qp_up(epoch: u32, ok: bool) -> Event {
    Event::DefaultQpUp {
        epoch: Epoch(epoch),
        ok,
    }
}

fn path_up(epoch: u32) -> Event {
    Event::Control(ControlMessage::PathUp {
        epoch: Epoch(epoch),
    })
}

fn switch_back(epoch: u32, sends_before: u64) -> Event {
    Event::Control(ControlMessage::SwitchBack {
        epoch: Epoch(epoch),
        sends_before,
    })
}

fn switch_back_ready(epoch: u32) -> Event {
    Event::Control(ControlMessage::SwitchBackReady {
        epoch: Epoch(epoch),
    })
}

fn link_down(path: Path) -> Event {
    Event::LinkDown { path }
}

fn link_up(path: Path) -> Event {
    Event::LinkUp { path }
}

fn control_failed(via: Path) -> Event {
    Event::ControlFailed { via }
}

fn retry_exhausted() -> Event {
    Event::ErrorCompletion {
        path: Path::Default,
        status: WcStatus::RetryExcErr,
    }
}

/// Drives an end from Default through a whole failover round into Fallback.
fn failed_over(role: Role) -> Failover {
    failed_over_at(role, at(10), at(11))
}

/// [`failed_over`], the default QP failing (and the round draining) at `failed` and the
/// peer's `Failover` arriving at `peer_arrives`.
fn failed_over_at(role: Role, failed: Timestamp, peer_arrives: Timestamp) -> Failover {
    let mut machine = end(role);
    step(&mut machine, retry_exhausted(), failed);
    step(&mut machine, drained(progress(4, 4, 2)), failed);
    step(&mut machine, peer_failover(0, 3, 0), peer_arrives);
    assert_eq!(machine.send_phase(), SendPhase::Fallback);
    machine
}

/// Drives a leader from Fallback through a successful rearm and probe into WaitSignaled.
fn leader_back_on_default_path() -> Failover {
    let mut machine = failed_over(Role::Leader);
    let due = machine.poll_timeout().unwrap();
    step(&mut machine, Event::Tick, due);
    step(&mut machine, rearm_done(1, true), due);
    step(&mut machine, qp_up(1, true), due);
    step(&mut machine, Event::ProbeCompleted { ok: true }, due);
    assert_eq!(machine.send_phase(), SendPhase::WaitSignaled);
    machine
}

/// [`leader_back_on_default_path`], then its sends switched back to the default QP while
/// the peer's still come on the backup (at 2_002).
fn leader_sending_on_default_peer_on_backup() -> Failover {
    let mut machine = leader_back_on_default_path();
    step(
        &mut machine,
        Event::SignaledPosted {
            progress: progress(7, 4, 3),
        },
        at(2_000),
    );
    step(&mut machine, Event::FenceCompleted, at(2_001));
    step(&mut machine, switch_back_ready(1), at(2_002));
    machine
}

/// Drives a follower from Fallback through the leader's rearm into WaitSignaled.
fn follower_back_on_default_path() -> Failover {
    let mut machine = failed_over(Role::Follower);
    step(&mut machine, rearm(1), at(5_000));
    step(&mut machine, qp_up(1, true), at(5_000));
    step(&mut machine, path_up(1), at(5_001));
    assert_eq!(machine.send_phase(), SendPhase::WaitSignaled);
    machine
}

/// Drives an end from Default into losing its backup side while idle (its control QP on the
/// backup devices failed at 5 ms).
fn backup_lost_while_idle(role: Role) -> Failover {
    let mut machine = end(role);
    step(&mut machine, control_failed(Path::Backup), at(5));
    machine
}

/// Ticks `machine` at `deadline` and asserts that the tick fails the connection for `reason`
/// (with the status of an exhausted retry, as a plain RC QP would end); returns what it asked.
fn assert_fails_at(machine: &mut Failover, deadline: Timestamp, reason: FailReason) -> Vec<Action> {
    let actions = step(machine, Event::Tick, deadline);
    assert_eq!(surfaced(&actions), Some((WcStatus::RetryExcErr, reason)));
    actions
}

/// The reason of the connection failure `actions` surface, if they surface one.
fn failure_reason(actions: &[Action]) -> Option<FailReason> {
    surfaced(actions).map(|(_, reason)| reason)
}

fn surfaced(actions: &[Action]) -> Option<(WcStatus, FailReason)> {
    actions.iter().find_map(|action| match action {
        Action::SurfaceError { status, reason } => Some((*status, *reason)),
        _ => None,
    })
}

// ---- State 1: Default ---------------------------------------------------------------------

#[test]
fn a_new_end_posts_everything_on_the_default_qp() {
    let machine = end(Role::Leader);
    assert_eq!(machine.send_route(), Route::Default);
    assert_eq!(machine.recv_route(), Route::Default);
    assert_eq!(machine.default_qp_phase(), DefaultQpPhase::Live);
    assert!(!machine.reports_signaled_posts());
}

#[test]
fn nothing_is_scheduled_while_everything_runs_on_the_default_qp() {
    assert_eq!(end(Role::Leader).poll_timeout(), None);
    assert_eq!(end(Role::Follower).poll_timeout(), None);
}

#[test]
fn a_tick_in_default_does_nothing() {
    let mut machine = end(Role::Leader);
    assert_eq!(step(&mut machine, Event::Tick, at(100_000)), []);
}

// ---- State 1 -> 2: failing over -------------------------------------------------------------

#[test]
fn retry_exhaustion_in_default_moves_the_default_qp_to_err_and_drains_it() {
    let mut machine = end(Role::Leader);
    let actions = step(&mut machine, retry_exhausted(), at(10));
    assert_eq!(
        actions,
        [
            Action::MoveQpToErr {
                path: Path::Default
            },
            Action::DrainDefault
        ]
    );
    assert_eq!(machine.send_phase(), SendPhase::FailingOver);
    assert_eq!(machine.default_qp_phase(), DefaultQpPhase::Dead);
}

#[test]
fn link_down_in_default_moves_default_qp_to_err() {
    let mut machine = end(Role::Follower);
    let actions = step(&mut machine, link_down(Path::Default), at(10));
    assert_eq!(
        actions,
        [
            Action::MoveQpToErr {
                path: Path::Default
            },
            Action::DrainDefault
        ]
    );
    assert_eq!(machine.send_phase(), SendPhase::FailingOver);
}

#[test]
fn without_link_watch_link_down_waits_for_retry_exhaustion() {
    let mut config = rc_only(Role::Leader);
    config.link_watch = false;
    let mut machine = Failover::new(config, at(0));
    assert_eq!(step(&mut machine, link_down(Path::Default), at(10)), []);
    assert_eq!(machine.send_phase(), SendPhase::Default);
}

#[test]
fn a_flush_in_default_fails_over_and_lets_the_drain_find_the_cause() {
    let mut machine = end(Role::Leader);
    let flush = Event::ErrorCompletion {
        path: Path::Default,
        status: WcStatus::WrFlushErr,
    };
    assert_eq!(
        step(&mut machine, flush, at(10)),
        [
            Action::MoveQpToErr {
                path: Path::Default
            },
            Action::DrainDefault
        ]
    );
}

#[test]
fn sends_and_receives_are_withheld_on_the_default_qp_while_draining() {
    let mut machine = end(Role::Leader);
    step(&mut machine, retry_exhausted(), at(10));
    assert_eq!(machine.send_route(), Route::DefaultWithheld);
    assert_eq!(machine.recv_route(), Route::DefaultWithheld);
}

#[test]
fn after_draining_receives_move_to_backup_and_the_peer_learns_the_receive_counter() {
    let mut machine = end(Role::Leader);
    step(&mut machine, retry_exhausted(), at(10));
    let actions = step(&mut machine, drained(progress(4, 5, 2)), at(10));
    assert_eq!(
        actions,
        [
            Action::CopyRecvsToBackup,
            Action::SendControl {
                via: Path::Backup,
                message: ControlMessage::Failover {
                    epoch: Epoch(0),
                    recvs_completed: 2,
                    stale_recvs: 0
                }
            },
        ]
    );
    assert_eq!(machine.recv_route(), Route::Backup);
    assert_eq!(
        machine.send_route(),
        Route::DefaultWithheld,
        "sends wait for the peer's counter"
    );
}

#[test]
fn sends_the_peer_already_consumed_are_skipped_and_the_rest_copied() {
    let mut machine = end(Role::Leader);
    step(&mut machine, retry_exhausted(), at(10));
    step(&mut machine, drained(progress(4, 4, 2)), at(10));
    let actions = step(&mut machine, peer_failover(0, 3, 0), at(11));
    assert_eq!(
        actions,
        [
            Action::CopySendsToBackup {
                burn: 0,
                skip_through: 3
            },
            Action::ResetDefaultQp
        ]
    );
    assert_eq!(machine.send_phase(), SendPhase::Fallback);
    assert_eq!(machine.send_route(), Route::Backup);
}

#[test]
fn a_peers_failover_message_starts_a_round_in_default() {
    let mut machine = end(Role::Follower);
    let actions = step(&mut machine, peer_failover(0, 1, 0), at(10));
    assert_eq!(
        actions,
        [
            Action::MoveQpToErr {
                path: Path::Default
            },
            Action::DrainDefault
        ]
    );
    let actions = step(&mut machine, drained(progress(2, 2, 1)), at(10));
    assert_eq!(
        actions,
        [
            Action::CopyRecvsToBackup,
            Action::SendControl {
                via: Path::Backup,
                message: ControlMessage::Failover {
                    epoch: Epoch(0),
                    recvs_completed: 1,
                    stale_recvs: 0
                }
            },
            Action::CopySendsToBackup {
                burn: 0,
                skip_through: 1
            },
            Action::ResetDefaultQp,
        ]
    );
    assert_eq!(machine.send_phase(), SendPhase::Fallback);
}

#[test]
fn crossing_failover_messages_complete_both_rounds() {
    let mut machine = end(Role::Leader);
    step(&mut machine, retry_exhausted(), at(10));
    // The peer failed over on its own; its message arrives before our drain finished.
    assert_eq!(step(&mut machine, peer_failover(0, 0, 0), at(10)), []);
    let actions = step(&mut machine, drained(progress(1, 1, 0)), at(10));
    assert!(actions.contains(&Action::CopySendsToBackup {
        burn: 0,
        skip_through: 0
    }));
    assert_eq!(machine.send_phase(), SendPhase::Fallback);
}

#[test]
fn a_second_error_while_failing_over_changes_nothing() {
    let mut machine = end(Role::Leader);
    step(&mut machine, retry_exhausted(), at(10));
    assert_eq!(step(&mut machine, retry_exhausted(), at(10)), []);
    assert_eq!(step(&mut machine, link_down(Path::Default), at(10)), []);
}

#[test]
fn an_atomic_in_flight_surfaces_the_error_instead_of_failing_over() {
    let mut machine = end(Role::Leader);
    step(&mut machine, retry_exhausted(), at(10));
    let event = Event::DefaultDrained {
        progress: progress(0, 0, 0),
        first_error: None,
        atomic_in_flight: true,
        sends_before_first_read: None,
    };
    let actions = step(&mut machine, event, at(10));
    assert_eq!(
        surfaced(&actions),
        Some((WcStatus::RetryExcErr, FailReason::AtomicInFlight))
    );
    assert!(actions.contains(&Action::SendControl {
        via: Path::Backup,
        message: ControlMessage::Abort {
            reason: FailReason::AtomicInFlight
        }
    }));
    assert!(!actions.iter().any(|a| matches!(
        a,
        Action::CopySendsToBackup { .. } | Action::CopyRecvsToBackup
    )));
    assert_eq!(machine.send_route(), Route::Closed);
}

/// A READ rung before the peer's last consumed send would read what that
/// send (and what came before it) changed if executed again; the round refuses.
#[test]
fn a_read_overtaken_by_a_consumed_send_fails_the_connection_instead_of_going_again() {
    for (consumed, fails) in [(2, false), (3, true)] {
        let mut machine = end(Role::Leader);
        step(&mut machine, retry_exhausted(), at(10));
        let event = Event::DefaultDrained {
            progress: progress(4, 0, 0),
            first_error: None,
            atomic_in_flight: false,
            sends_before_first_read: Some(2),
        };
        step(&mut machine, event, at(10));
        let peer = Event::Control(ControlMessage::Failover {
            epoch: machine.epoch(),
            recvs_completed: consumed,
            stale_recvs: 0,
        });
        let actions = step(&mut machine, peer, at(11));
        if fails {
            assert_eq!(
                surfaced(&actions),
                Some((WcStatus::RetryExcErr, FailReason::ReadOvertaken))
            );
            assert!(actions.contains(&Action::SendControl {
                via: Path::Backup,
                message: ControlMessage::Abort {
                    reason: FailReason::ReadOvertaken
                }
            }));
            assert!(!actions
                .iter()
                .any(|a| matches!(a, Action::CopySendsToBackup { .. })));
        } else {
            assert!(
                actions.contains(&Action::CopySendsToBackup {
                    burn: 0,
                    skip_through: 2
                }),
                "{actions:?}"
            );
        }
    }
}

#[test]
fn protection_errors_never_fail_over() {
    for status in [
        WcStatus::RemAccessErr,
        WcStatus::LocProtErr,
        WcStatus::RemInvReqErr,
        WcStatus::LocLenErr,
    ] {
        let mut machine = end(Role::Leader);
        let actions = step(
            &mut machine,
            Event::ErrorCompletion {
                path: Path::Default,
                status,
            },
            at(10),
        );
        assert_eq!(
            surfaced(&actions),
            Some((status, FailReason::Refused { status }))
        );
        assert!(!actions.contains(&Action::DrainDefault));
        assert_eq!(machine.failed(), Some(FailReason::Refused { status }));
    }
}

#[test]
fn a_refusal_found_while_draining_is_surfaced_not_failed_over() {
    let mut machine = end(Role::Leader);
    step(
        &mut machine,
        Event::ErrorCompletion {
            path: Path::Default,
            status: WcStatus::WrFlushErr,
        },
        at(10),
    );
    let event = Event::DefaultDrained {
        progress: progress(0, 0, 0),
        first_error: Some(WcStatus::RemAccessErr),
        atomic_in_flight: false,
        sends_before_first_read: None,
    };
    let actions = step(&mut machine, event, at(10));
    assert_eq!(
        surfaced(&actions).map(|(s, _)| s),
        Some(WcStatus::RemAccessErr)
    );
}

#[test]
fn rnr_retry_exhaustion_is_the_applications_problem_not_the_paths() {
    let mut machine = end(Role::Leader);
    let status = WcStatus::RnrRetryExcErr;
    let actions = step(
        &mut machine,
        Event::ErrorCompletion {
            path: Path::Default,
            status,
        },
        at(10),
    );
    assert_eq!(surfaced(&actions).map(|(s, _)| s), Some(status));
}

/// The QP's RC budget at the default attributes (timeout 14, 7 retries): 8 x 67.1 ms.
fn budget() -> Duration {
    rc_retry_budget(14, 7)
}

#[test]
fn the_rc_budget_is_what_a_plain_qp_waits_before_retry_exceeded() {
    assert_eq!(budget(), Duration::from_nanos(8 * (4096 << 14)));
    assert_eq!(
        rc_retry_budget(12, 3),
        Duration::from_nanos(4 * (4096 << 12))
    );
    // No ACK timer (0) is taken as 14, so the wait stays bounded.
    assert_eq!(rc_retry_budget(0, 7), budget());
}

#[test]
fn a_default_failure_while_the_backup_link_is_down_waits_the_rc_budget_then_fails() {
    let mut machine = end(Role::Leader);
    assert_eq!(step(&mut machine, link_down(Path::Backup), at(5)), []);
    // The default is drained at once; the Failover message goes although the backup link
    // is reported down (a report is a hint), and the handshake waits for the link.
    let actions = step(&mut machine, retry_exhausted(), at(10));
    assert!(actions.contains(&Action::DrainDefault), "{actions:?}");
    assert_eq!(surfaced(&actions), None);
    let actions = step(&mut machine, drained(progress(2, 2, 0)), at(11));
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
    let deadline = machine.poll_timeout().unwrap();
    assert_eq!(deadline, at(10) + budget());
    assert_eq!(step(&mut machine, Event::Tick, at(400)), []);
    assert_fails_at(&mut machine, deadline, FailReason::BackupUnavailable);
}

#[test]
fn a_default_failure_fails_over_when_the_backup_link_returns_within_the_budget() {
    let mut machine = end(Role::Follower);
    step(&mut machine, link_down(Path::Backup), at(5));
    step(&mut machine, retry_exhausted(), at(10));
    let actions = step(&mut machine, drained(progress(4, 4, 2)), at(11));
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
    // Sent once: the link-up sends nothing again (the control QP retransmits).
    let actions = step(&mut machine, link_up(Path::Backup), at(300));
    assert!(
        !actions
            .iter()
            .any(|a| matches!(a, Action::SendControl { .. })),
        "{actions:?}"
    );
    // The handshake's own timeout runs from the link-up, not from the link-down.
    assert_eq!(
        machine.poll_timeout().unwrap(),
        at(300) + Duration::from_secs(2)
    );
    step(&mut machine, peer_failover(0, 3, 0), at(301));
    assert_eq!(machine.send_phase(), SendPhase::Fallback);
    assert_eq!(machine.failed(), None);
}

#[test]
fn a_peer_failover_message_while_waiting_for_the_backup_link_resumes_the_round() {
    let mut machine = end(Role::Leader);
    step(&mut machine, link_down(Path::Backup), at(5));
    step(&mut machine, retry_exhausted(), at(10));
    step(&mut machine, drained(progress(4, 4, 2)), at(11));
    // It came over the backup path, so that path works whatever the link event said: the
    // round finishes, and the outage tolerance no longer runs.
    step(&mut machine, peer_failover(0, 3, 0), at(50));
    assert_eq!(machine.send_phase(), SendPhase::Fallback);
    step(&mut machine, Event::Tick, at(10) + budget() * 20);
    assert_eq!(machine.failed(), None);
}

#[test]
fn with_no_backup_wait_a_default_failure_with_the_backup_link_down_fails_at_once() {
    let mut config = rc_only(Role::Leader);
    config.backup_wait = Duration::ZERO;
    let mut machine = Failover::new(config, at(0));
    step(&mut machine, link_down(Path::Backup), at(5));
    let actions = step(&mut machine, retry_exhausted(), at(10));
    assert_eq!(
        surfaced(&actions),
        Some((WcStatus::RetryExcErr, FailReason::BackupUnavailable))
    );
    assert!(!actions.contains(&Action::DrainDefault));
}

#[test]
fn a_backup_link_that_came_back_protects_again() {
    let mut machine = end(Role::Leader);
    step(&mut machine, link_down(Path::Backup), at(5));
    step(&mut machine, link_up(Path::Backup), at(6));
    assert!(step(&mut machine, retry_exhausted(), at(10)).contains(&Action::DrainDefault));
}

#[test]
fn a_handshake_without_answer_times_out() {
    let mut machine = end(Role::Leader);
    step(&mut machine, retry_exhausted(), at(10));
    step(&mut machine, drained(progress(1, 1, 0)), at(10));
    let deadline = machine.poll_timeout().unwrap();
    assert_eq!(deadline, at(10) + Duration::from_secs(2));
    assert_eq!(step(&mut machine, Event::Tick, at(1_000)), []);
    let actions = step(&mut machine, Event::Tick, deadline);
    assert_eq!(failure_reason(&actions), Some(FailReason::HandshakeTimeout));
}

#[test]
fn a_peer_claiming_more_receives_than_we_sent_is_a_protocol_violation() {
    let mut machine = end(Role::Leader);
    step(&mut machine, retry_exhausted(), at(10));
    step(&mut machine, drained(progress(2, 0, 0)), at(10));
    let actions = step(&mut machine, peer_failover(0, 3, 0), at(10));
    assert_eq!(
        failure_reason(&actions),
        Some(FailReason::ProtocolViolation)
    );
}

#[test]
fn a_failover_message_for_a_future_epoch_is_a_protocol_violation() {
    let mut machine = end(Role::Follower);
    let actions = step(&mut machine, peer_failover(3, 0, 0), at(10));
    assert_eq!(
        failure_reason(&actions),
        Some(FailReason::ProtocolViolation)
    );
}

// ---- The backup path ----------------------------------------------------------------------

#[test]
fn backup_link_down_in_fallback_fails_after_the_rc_budget_not_at_the_link_down() {
    let mut machine = failed_over(Role::Leader);
    // The default link is down too: no failback (5e) can take the traffic.
    step(&mut machine, link_down(Path::Default), at(15));
    // Not a failure at the link-down: a plain RC QP would have retried through a 0.37 s
    // outage.
    assert_eq!(step(&mut machine, link_down(Path::Backup), at(20)), []);
    let deadline = at(20) + budget();
    assert!(machine.poll_timeout().unwrap() <= deadline);
    let actions = assert_fails_at(&mut machine, deadline, FailReason::BackupUnavailable);
    assert!(
        !actions.iter().any(|a| matches!(
            a,
            Action::SendControl {
                via: Path::Backup,
                message: _
            }
        )),
        "no control path to tell the peer"
    );
}

#[test]
fn a_backup_link_back_within_the_budget_keeps_the_connection_on_the_backup() {
    let mut machine = failed_over(Role::Leader);
    step(&mut machine, link_down(Path::Backup), at(20));
    step(&mut machine, link_up(Path::Backup), at(390));
    assert_eq!(step(&mut machine, Event::Tick, at(20) + budget()), []);
    assert_eq!(machine.failed(), None);
    assert_eq!(machine.send_route(), Route::Backup);
}

#[test]
fn a_transport_error_on_the_backup_in_fallback_with_the_default_channel_gone_fails() {
    let mut machine = failed_over(Role::Follower);
    step(&mut machine, control_failed(Path::Default), at(15));
    let event = Event::ErrorCompletion {
        path: Path::Backup,
        status: WcStatus::RetryExcErr,
    };
    assert_eq!(
        failure_reason(&step(&mut machine, event, at(20))),
        Some(FailReason::BackupUnavailable)
    );
}

#[test]
fn a_control_send_failure_in_fallback_with_the_default_channel_gone_fails() {
    let mut machine = failed_over(Role::Follower);
    step(&mut machine, control_failed(Path::Default), at(15));
    let actions = step(&mut machine, control_failed(Path::Backup), at(20));
    assert_eq!(
        failure_reason(&actions),
        Some(FailReason::BackupUnavailable)
    );
}

#[test]
fn losing_the_idle_backup_leaves_default_traffic_running() {
    let mut machine = end(Role::Leader);
    assert_eq!(step(&mut machine, control_failed(Path::Backup), at(5)), []);
    assert_eq!(machine.send_route(), Route::Default);
    // A later default failure can no longer fail over, even once the link is up: it waits
    // for the default path within the RC budget (a failback round, 5e), then fails.
    step(&mut machine, link_up(Path::Backup), at(6));
    let actions = step(&mut machine, retry_exhausted(), at(10));
    assert_eq!(actions, FAILBACK_START);
    assert_eq!(machine.poll_timeout(), Some(at(10) + budget()));
    let actions = step(&mut machine, Event::Tick, at(10) + budget());
    assert_eq!(
        failure_reason(&actions),
        Some(FailReason::BackupUnavailable)
    );
}

// ---- State 2: rearm the default pair and probe it -------------------------------------------

#[test]
fn leader_waits_for_backoff_and_holddown_before_rearming() {
    let mut machine = failed_over(Role::Leader);
    // Link up since t=0, hold-down 1 s: the first attempt is at t=1 s, not after the backoff.
    assert_eq!(machine.poll_timeout(), Some(at(1_000)));
    assert_eq!(step(&mut machine, Event::Tick, at(999)), []);
    assert_ne!(step(&mut machine, Event::Tick, at(1_000)), []);
}

#[test]
fn a_link_that_just_came_up_is_held_down() {
    let mut machine = failed_over(Role::Leader);
    step(&mut machine, link_down(Path::Default), at(3_000));
    assert_eq!(
        machine.poll_timeout(),
        Some(at(8_000)),
        "no attempts while the link-down report is believed (5 s)"
    );
    step(&mut machine, link_up(Path::Default), at(4_000));
    assert_eq!(machine.poll_timeout(), Some(at(5_000)));
}

/// Issue 29 item 1: a link report is a hint. A default link reported down for longer than
/// `Config::link_down_trust` (a late report, a missed port event) is rearmed anyway, and its
/// probe decides: here the path carries packets, and the traffic switches back although no
/// link-up was ever reported.
#[test]
fn a_default_link_reported_down_past_its_trust_is_rearmed_and_probed() {
    let mut machine = failed_over(Role::Leader);
    step(&mut machine, link_down(Path::Default), at(20));
    assert_eq!(machine.poll_timeout(), Some(at(5_020)));
    assert_eq!(step(&mut machine, Event::Tick, at(5_019)), []);
    assert_eq!(
        step(&mut machine, Event::Tick, at(5_020)),
        [
            Action::ResetDefaultQp,
            Action::SendControl {
                via: Path::Backup,
                message: ControlMessage::Rearm { epoch: Epoch(1) }
            }
        ]
    );
    assert_eq!(
        step(&mut machine, rearm_done(1, true), at(5_021)),
        [Action::BringUpDefaultQp { epoch: Epoch(1) }]
    );
    assert_eq!(
        step(&mut machine, qp_up(1, true), at(5_021)),
        [Action::PostProbe]
    );
    step(&mut machine, Event::ProbeCompleted { ok: true }, at(5_022));
    assert_eq!(machine.send_phase(), SendPhase::WaitSignaled);
    assert_eq!(machine.default_qp_phase(), DefaultQpPhase::Live);
}

#[test]
fn a_follower_whose_link_is_reported_down_past_its_trust_takes_part_in_a_rearm() {
    let mut machine = failed_over(Role::Follower);
    step(&mut machine, link_down(Path::Default), at(20));
    // Within the trust: refused, as before.
    let refused = step(&mut machine, rearm(1), at(3_000));
    assert!(
        refused.contains(&Action::SendControl {
            via: Path::Backup,
            message: ControlMessage::RearmDone {
                epoch: Epoch(1),
                ok: false
            }
        }),
        "{refused:?}"
    );
    // Past it: the follower brings its QP up and says so.
    assert_eq!(
        step(&mut machine, rearm(5), at(5_100)),
        [
            Action::ResetDefaultQp,
            Action::BringUpDefaultQp { epoch: Epoch(5) }
        ]
    );
    assert_eq!(
        step(&mut machine, qp_up(5, true), at(5_101)),
        [Action::SendControl {
            via: Path::Backup,
            message: ControlMessage::RearmDone {
                epoch: Epoch(5),
                ok: true
            }
        }]
    );
}

#[test]
fn an_attempt_on_a_link_reported_down_gives_way_to_the_holddown_when_it_is_reported_up() {
    let mut machine = failed_over(Role::Leader);
    step(&mut machine, link_down(Path::Default), at(20));
    step(&mut machine, Event::Tick, at(5_020));
    assert_eq!(machine.default_qp_phase(), DefaultQpPhase::Rearming);
    assert_eq!(
        step(&mut machine, link_up(Path::Default), at(5_300)),
        [Action::MoveQpToErr {
            path: Path::Default
        }]
    );
    assert_eq!(machine.default_qp_phase(), DefaultQpPhase::Dead);
    // The next attempt: after the hold-down, not after a backoff.
    assert_eq!(machine.poll_timeout(), Some(at(6_300)));
    // An attempt started on a link reported up is not abandoned by a later link-up.
    step(&mut machine, Event::Tick, at(6_300));
    assert_eq!(step(&mut machine, link_up(Path::Default), at(6_301)), []);
    assert_eq!(machine.default_qp_phase(), DefaultQpPhase::Rearming);
}

#[test]
fn link_down_reports_believed_for_ever_keep_the_old_behaviour() {
    let config = Config {
        link_down_trust: Duration::MAX,
        ..rc_only(Role::Leader)
    };
    let mut machine = Failover::new(config, at(0));
    step(&mut machine, retry_exhausted(), at(10));
    step(&mut machine, drained(progress(4, 4, 2)), at(10));
    step(&mut machine, peer_failover(0, 3, 0), at(11));
    step(&mut machine, link_down(Path::Default), at(20));
    assert_eq!(machine.poll_timeout(), None);
}

#[test]
fn leader_rearm_leaves_the_old_epoch_before_asking_the_follower() {
    let mut machine = failed_over(Role::Leader);
    let actions = step(&mut machine, Event::Tick, at(1_000));
    assert_eq!(
        actions,
        [
            Action::ResetDefaultQp,
            Action::SendControl {
                via: Path::Backup,
                message: ControlMessage::Rearm { epoch: Epoch(1) }
            }
        ]
    );
    assert_eq!(machine.epoch(), Epoch(1));
    assert_eq!(machine.default_qp_phase(), DefaultQpPhase::Rearming);
}

#[test]
fn leader_brings_its_qp_up_only_once_the_follower_is_in_the_new_epoch() {
    let mut machine = failed_over(Role::Leader);
    step(&mut machine, Event::Tick, at(1_000));
    let actions = step(&mut machine, rearm_done(1, true), at(1_001));
    assert_eq!(actions, [Action::BringUpDefaultQp { epoch: Epoch(1) }]);
    assert_eq!(
        step(&mut machine, qp_up(1, true), at(1_001)),
        [Action::PostProbe]
    );
}

#[test]
fn a_successful_probe_confirms_the_path_and_moves_fallback_to_wait_signaled() {
    let mut machine = failed_over(Role::Leader);
    step(&mut machine, Event::Tick, at(1_000));
    step(&mut machine, rearm_done(1, true), at(1_001));
    step(&mut machine, qp_up(1, true), at(1_001));
    let actions = step(&mut machine, Event::ProbeCompleted { ok: true }, at(1_002));
    assert_eq!(
        actions,
        [Action::SendControl {
            via: Path::Backup,
            message: ControlMessage::PathUp { epoch: Epoch(1) }
        }]
    );
    assert_eq!(machine.send_phase(), SendPhase::WaitSignaled);
    assert_eq!(machine.default_qp_phase(), DefaultQpPhase::Live);
    assert_eq!(
        machine.send_route(),
        Route::Backup,
        "still on backup until the fence"
    );
    assert!(machine.reports_signaled_posts());
}

#[test]
fn failed_probes_back_off_exponentially() {
    let mut machine = failed_over(Role::Leader);
    let mut now = at(1_000);
    let mut waits = Vec::new();
    for attempt in 1..=3 {
        step(&mut machine, Event::Tick, now);
        step(
            &mut machine,
            Event::Control(ControlMessage::RearmDone {
                epoch: Epoch(attempt),
                ok: true,
            }),
            now,
        );
        step(&mut machine, qp_up(attempt, true), now);
        step(&mut machine, Event::ProbeCompleted { ok: false }, now);
        let next = machine.poll_timeout().unwrap();
        waits.push(next.saturating_since(now));
        now = next;
    }
    assert_eq!(
        waits,
        [
            Duration::from_millis(200),
            Duration::from_millis(400),
            Duration::from_millis(800)
        ]
    );
    assert_eq!(machine.send_phase(), SendPhase::Fallback);
}

#[test]
fn a_refused_rearm_backs_off() {
    let mut machine = failed_over(Role::Leader);
    step(&mut machine, Event::Tick, at(1_000));
    let actions = step(&mut machine, rearm_done(1, false), at(1_001));
    assert_eq!(actions, []);
    assert_eq!(machine.default_qp_phase(), DefaultQpPhase::Dead);
    assert_eq!(machine.poll_timeout(), Some(at(1_201)));
}

/// The PSN quarter an epoch's PSNs start in (epochs four apart share one).
fn psn_quarter(epoch: Epoch) -> u32 {
    epoch.start_psn(0) / EPOCH_PSN_STRIDE
}

#[test]
fn refused_rearm_attempts_do_not_use_up_the_psn_space_of_the_epoch_left() {
    // A recovered NIC refusing RTR: four attempts refused at 100, 200, 400 ms of backoff.
    let mut machine = failed_over(Role::Leader);
    let failed = psn_quarter(machine.epoch());
    let mut now = machine.poll_timeout().unwrap();
    let first = now;
    let mut attempts = Vec::new();
    for _ in 0..5 {
        step(&mut machine, Event::Tick, now);
        attempts.push(machine.epoch());
        if attempts.len() == 4 {
            // The fourth attempt starts 1.4 s after the first (backoffs of 200, 400 and
            // 800 ms): packets of the failed epoch held in a PFC-paused switch may still live.
            assert_eq!(now.saturating_since(first), Duration::from_millis(1_400));
        }
        let refused = rearm_done(machine.epoch().0, false);
        step(&mut machine, refused, now);
        now = machine.poll_timeout().unwrap();
    }
    assert!(
        attempts.iter().all(|&e| psn_quarter(e) != failed),
        "attempts {attempts:?} re-enter the PSN quarter of the epoch that failed"
    );
    // Nothing was sent in them: they all share the next quarter.
    assert!(attempts.iter().all(|&e| psn_quarter(e) == failed + 1));
    assert!(attempts.windows(2).all(|w| w[0] < w[1]));
}

#[test]
fn an_attempt_that_came_up_moves_the_next_one_to_the_next_psn_quarter() {
    let mut machine = failed_over(Role::Leader);
    let now = machine.poll_timeout().unwrap();
    step(&mut machine, Event::Tick, now);
    step(&mut machine, rearm_done(1, false), now);
    let now = machine.poll_timeout().unwrap();
    step(&mut machine, Event::Tick, now);
    assert_eq!(machine.epoch(), Epoch(5));
    // Both QPs come up and the probe is sent: epoch 5 used its PSNs.
    step(&mut machine, rearm_done(5, true), now);
    step(&mut machine, qp_up(5, true), now);
    step(&mut machine, Event::ProbeCompleted { ok: false }, now);
    let now = machine.poll_timeout().unwrap();
    step(&mut machine, Event::Tick, now);
    assert_eq!(machine.epoch(), Epoch(6));
    assert_eq!(psn_quarter(Epoch(6)), psn_quarter(Epoch(5)) + 1);
}

#[test]
fn the_next_incarnation_comes_up_no_sooner_than_the_backoff_after_the_old_one_left_rts() {
    // The bound for an incarnation that sent more than 2^22 packets (docs/failover.md 6, "Old
    // packets"): its last PSNs may lie just above the next epoch's start, so a packet of it
    // executes in the next incarnation if it is still in the network when that one comes up.
    // A rearm keeps it out for at least the backoff after the round moved the old QP to ERR,
    // even with the default link up for long (the error was the QP's own).
    let mut machine = end(Role::Leader);
    let failed = at(60_000);
    let actions = step(&mut machine, retry_exhausted(), failed);
    assert!(actions.contains(&Action::MoveQpToErr {
        path: Path::Default
    }));
    step(&mut machine, drained(progress(4, 4, 2)), failed);
    step(&mut machine, peer_failover(0, 3, 0), failed);
    assert_eq!(machine.send_phase(), SendPhase::Fallback);
    let backoff = Config::new(Role::Leader).backoff_initial;
    assert_eq!(backoff, Duration::from_millis(100));
    let due = machine.poll_timeout().unwrap();
    assert_eq!(due, failed + backoff);
    assert_eq!(step(&mut machine, Event::Tick, at(60_099)), []);
    let actions = step(&mut machine, Event::Tick, due);
    assert_eq!(actions[0], Action::ResetDefaultQp);
    assert_eq!(machine.epoch(), Epoch(1));
}

#[test]
fn a_failback_brings_the_default_up_no_sooner_than_the_backoff_after_it_left_rts() {
    // The same bound for a failback (5e) as for a rearm, above: the backup dies 10 ms after
    // the default QP left RTS, both ends drain and their `Failback` messages cross at once.
    // Before, the default QP came up in the new epoch then, 10 ms after the old one left.
    let failed = at(60_000);
    let mut machine = failed_over_at(Role::Leader, failed, failed);
    let backup_died = at(60_010);
    assert_eq!(
        step(&mut machine, failback::backup_error(), backup_died),
        FAILBACK_START
    );
    step(
        &mut machine,
        failback::failback_drained(progress(4, 4, 2)),
        backup_died,
    );
    assert_eq!(
        step(&mut machine, failback::peer_failback(1, 3), backup_died),
        []
    );
    let due = failed + Config::new(Role::Leader).backoff_initial;
    assert_eq!(machine.poll_timeout(), Some(due));
    assert_eq!(step(&mut machine, Event::Tick, at(60_099)), []);
    assert_eq!(
        step(&mut machine, Event::Tick, due),
        [Action::Failback {
            epoch: Epoch(1),
            skip_through: 3
        }]
    );
    assert_eq!(machine.send_phase(), SendPhase::FailingBack);
}

#[test]
fn a_failback_brings_the_default_up_no_sooner_than_the_backoff_after_the_peers_qp_left_rts() {
    // The receiver's side of the bound: an old packet of the peer's whose PSN is the new start
    // PSN is in sequence as soon as our new QP is up, so our bring-up waits for the peer's
    // old QP too. Our sends are back on the default QP, the peer's still on the backup; the
    // backup dies at 2_100 and our default QP leaves RTS then. The peer's leaves only when
    // our `Failback` reached it, so its own bound runs 100 ms from its message (sent at once
    // after its drain) and arrives 50 ms after ours started. Before, our default QP came up
    // at 2_200, 50 ms after the peer's old one may have sent its last packet.
    let mut machine = leader_sending_on_default_peer_on_backup();
    let backoff = Config::new(Role::Leader).backoff_initial;
    assert_eq!(
        step(&mut machine, failback::backup_error(), at(2_100)),
        FAILBACK_START
    );
    // Our message carries what is left of our own bound: 99 ms of the 100.
    assert_eq!(
        step(
            &mut machine,
            failback::failback_drained(progress(9, 4, 3)),
            at(2_101)
        ),
        [Action::SendControl {
            via: Path::Default,
            message: ControlMessage::Failback {
                epoch: Epoch(2),
                recvs_completed: 3,
                wait: Duration::from_millis(99),
            },
        }]
    );
    let peers = failback::peer_failback_waiting(2, 8, backoff);
    assert_eq!(step(&mut machine, peers, at(2_150)), []);
    assert_eq!(machine.poll_timeout(), Some(at(2_150) + backoff));
    // Our own bound passed; the peer's did not.
    assert_eq!(step(&mut machine, Event::Tick, at(2_200)), []);
    assert_eq!(step(&mut machine, Event::Tick, at(2_249)), []);
    assert_eq!(
        step(&mut machine, Event::Tick, at(2_250)),
        [Action::Failback {
            epoch: Epoch(2),
            skip_through: 8
        }]
    );
}

#[test]
fn a_failback_after_a_finished_round_does_not_wait_out_a_late_peer_messages_wait() {
    // Our own bound covers the peer's old QP when its `Failover` arrived (the round counted
    // the backoff from that): the wait the peer's `Failback` carries is counted from its
    // arrival, and a message a control QP retransmitted arrives hundreds of milliseconds late
    // (the testbed soak, seed 1: 536 ms, and the extra 84 ms wait lost the connection 3 runs
    // of 3, its other device failing before the failback was done).
    let mut machine = failed_over(Role::Leader);
    assert_eq!(
        step(&mut machine, failback::backup_error(), at(20)),
        FAILBACK_START
    );
    step(
        &mut machine,
        failback::failback_drained(progress(4, 4, 2)),
        at(21),
    );
    // Sent at 25 with 86 ms left of the peer's bound; arrives at 600.
    let late = failback::peer_failback_waiting(1, 3, Duration::from_millis(86));
    assert_eq!(
        step(&mut machine, late, at(600)),
        [Action::Failback {
            epoch: Epoch(1),
            skip_through: 3
        }]
    );
}

#[test]
fn a_rearm_comes_up_no_sooner_than_the_backoff_after_the_peers_failover() {
    // The rearm's side of the same bound: the leader's new QP comes up (on the follower's
    // `RearmDone`) after the attempt started, and an old packet of the follower's at the new
    // start PSN is in sequence there at once. The follower's default QP left RTS before its
    // `Failover` left, possibly long after the leader's (here it kept sending 95 ms), so the
    // attempt waits the backoff after that message arrived too. Before, it started at
    // 60_100, 5 ms after the follower's old QP may have sent its last packet. (The
    // follower's new QP comes up on the `Rearm`, no sooner than the backoff after the
    // leader's left RTS: no gap there.)
    let arrived = at(60_095);
    let mut machine = failed_over_at(Role::Leader, at(60_000), arrived);
    let due = arrived + Config::new(Role::Leader).backoff_initial;
    assert_eq!(machine.poll_timeout(), Some(due));
    assert_eq!(step(&mut machine, Event::Tick, at(60_100)), []);
    assert_eq!(step(&mut machine, Event::Tick, at(60_194)), []);
    let actions = step(&mut machine, Event::Tick, due);
    assert_eq!(actions[0], Action::ResetDefaultQp);
    assert_eq!(machine.epoch(), Epoch(1));
}

#[test]
fn a_rearm_attempt_without_answer_is_abandoned() {
    let mut machine = failed_over(Role::Leader);
    step(&mut machine, Event::Tick, at(1_000));
    step(&mut machine, Event::Tick, at(3_000));
    assert_eq!(machine.default_qp_phase(), DefaultQpPhase::Dead);
}

#[test]
fn a_stale_rearm_done_is_ignored() {
    let mut machine = failed_over(Role::Leader);
    step(&mut machine, Event::Tick, at(1_000));
    step(&mut machine, rearm_done(1, false), at(1_001));
    step(&mut machine, Event::Tick, at(2_000));
    // The refused attempt sent nothing: the next one stays in its PSN quarter.
    assert_eq!(machine.epoch(), Epoch(5));
    let late = rearm_done(1, true);
    assert_eq!(step(&mut machine, late, at(2_001)), []);
}

#[test]
fn rearm_is_abandoned_when_the_default_link_goes_down() {
    let mut machine = failed_over(Role::Leader);
    step(&mut machine, Event::Tick, at(1_000));
    let actions = step(&mut machine, link_down(Path::Default), at(1_001));
    assert_eq!(
        actions,
        [Action::MoveQpToErr {
            path: Path::Default
        }]
    );
    assert_eq!(machine.default_qp_phase(), DefaultQpPhase::Dead);
    // The next attempt once the link-down report has stood for its trust (5 s).
    assert_eq!(machine.poll_timeout(), Some(at(6_001)));
}

#[test]
fn follower_leaves_the_old_epoch_before_entering_the_new_one() {
    let mut machine = failed_over(Role::Follower);
    let actions = step(&mut machine, rearm(1), at(5_000));
    assert_eq!(
        actions,
        [
            Action::ResetDefaultQp,
            Action::BringUpDefaultQp { epoch: Epoch(1) }
        ]
    );
    let actions = step(&mut machine, qp_up(1, true), at(5_000));
    assert_eq!(
        actions,
        [Action::SendControl {
            via: Path::Backup,
            message: ControlMessage::RearmDone {
                epoch: Epoch(1),
                ok: true
            }
        }]
    );
    assert_eq!(machine.default_qp_phase(), DefaultQpPhase::Unconfirmed);
    assert_eq!(
        machine.send_phase(),
        SendPhase::Fallback,
        "not before the leader's probe"
    );
}

#[test]
fn follower_moves_an_unconfirmed_qp_to_err_before_a_newer_epoch() {
    let mut machine = failed_over(Role::Follower);
    step(&mut machine, rearm(1), at(5_000));
    step(&mut machine, qp_up(1, true), at(5_000));
    // The leader's probe failed; it tries again in epoch 2.
    let actions = step(&mut machine, rearm(2), at(6_000));
    assert_eq!(
        actions,
        [
            Action::MoveQpToErr {
                path: Path::Default
            },
            Action::ResetDefaultQp,
            Action::BringUpDefaultQp { epoch: Epoch(2) },
        ]
    );
}

#[test]
fn follower_refuses_rearm_while_its_link_is_down() {
    let mut machine = failed_over(Role::Follower);
    step(&mut machine, link_down(Path::Default), at(4_000));
    let actions = step(&mut machine, rearm(1), at(5_000));
    assert_eq!(
        actions,
        [Action::SendControl {
            via: Path::Backup,
            message: ControlMessage::RearmDone {
                epoch: Epoch(1),
                ok: false
            }
        }]
    );
}

#[test]
fn follower_refuses_rearm_within_its_holddown() {
    let mut machine = failed_over(Role::Follower);
    step(&mut machine, link_down(Path::Default), at(4_000));
    step(&mut machine, link_up(Path::Default), at(4_500));
    let refused = [Action::SendControl {
        via: Path::Backup,
        message: ControlMessage::RearmDone {
            epoch: Epoch(1),
            ok: false,
        },
    }];
    assert_eq!(step(&mut machine, rearm(1), at(5_000)), refused);
    assert_eq!(
        step(&mut machine, rearm(2), at(5_500)),
        [
            Action::ResetDefaultQp,
            Action::BringUpDefaultQp { epoch: Epoch(2) }
        ]
    );
}

fn rearm_ready(epoch: u32) -> Event {
    Event::Control(ControlMessage::RearmReady {
        epoch: Epoch(epoch),
    })
}

#[test]
fn a_follower_that_refused_tells_the_leader_when_its_holddown_ends() {
    let mut machine = failed_over(Role::Follower);
    let link = |up: bool| {
        if up {
            link_up(Path::Default)
        } else {
            link_down(Path::Default)
        }
    };
    step(&mut machine, link(false), at(4_000));
    step(&mut machine, rearm(1), at(4_100));
    // Nothing owed while the link-down report is believed (5 s).
    assert_eq!(machine.poll_timeout(), Some(at(9_000)));
    step(&mut machine, link(true), at(6_000));
    let due = machine.poll_timeout();
    assert_eq!(due, Some(at(7_000)), "link-up plus the 1 s hold-down");
    assert_eq!(step(&mut machine, Event::Tick, at(6_999)), []);
    assert_eq!(
        step(&mut machine, Event::Tick, at(7_000)),
        [Action::SendControl {
            via: Path::Backup,
            message: ControlMessage::RearmReady { epoch: Epoch(1) }
        }]
    );
    // Said once.
    assert_eq!(machine.poll_timeout(), None);
    assert_eq!(step(&mut machine, Event::Tick, at(7_500)), []);
}

#[test]
fn a_follower_whose_qp_failed_to_come_up_waits_for_the_leaders_backoff() {
    let mut machine = failed_over(Role::Follower);
    step(&mut machine, rearm(1), at(5_000));
    step(&mut machine, qp_up(1, false), at(5_000));
    // The NIC refused RTR: announcing readiness at once would retry in a tight loop.
    assert_eq!(machine.poll_timeout(), None);
}

#[test]
fn rearm_ready_lets_the_leader_try_again_without_its_backoff() {
    let mut machine = failed_over(Role::Leader);
    // Three refused attempts: the next one would wait 800 ms.
    let mut now = 1_000;
    // Refused attempts sent nothing: each stays in the PSN quarter of the first.
    for epoch in [1, 5, 9] {
        step(&mut machine, Event::Tick, at(now));
        step(&mut machine, rearm_done(epoch, false), at(now + 1));
        now = machine.poll_timeout().unwrap().as_nanos() / 1_000_000;
    }
    assert_eq!(machine.poll_timeout(), Some(at(2_403)));
    assert_eq!(step(&mut machine, rearm_ready(9), at(1_900)), []);
    assert_eq!(machine.poll_timeout(), Some(at(1_900)));
    assert_eq!(
        step(&mut machine, Event::Tick, at(1_900)),
        [
            Action::ResetDefaultQp,
            Action::SendControl {
                via: Path::Backup,
                message: ControlMessage::Rearm { epoch: Epoch(13) }
            }
        ]
    );
    // A later refusal backs off from the start again.
    step(&mut machine, rearm_done(13, false), at(1_901));
    assert_eq!(machine.poll_timeout(), Some(at(2_101)));
}

#[test]
fn a_stale_rearm_ready_is_ignored() {
    let mut machine = failed_over(Role::Leader);
    step(&mut machine, Event::Tick, at(1_000));
    step(&mut machine, rearm_done(1, false), at(1_001));
    step(&mut machine, Event::Tick, at(1_201));
    step(&mut machine, rearm_done(2, false), at(1_202));
    let due = machine.poll_timeout();
    assert_eq!(step(&mut machine, rearm_ready(1), at(1_300)), []);
    assert_eq!(machine.poll_timeout(), due);
}

#[test]
fn rearm_ready_sent_to_a_follower_is_a_protocol_violation() {
    let mut machine = failed_over(Role::Follower);
    let actions = step(&mut machine, rearm_ready(1), at(5_000));
    assert!(surfaced(&actions).is_some(), "{actions:?}");
}

#[test]
fn a_follower_qp_that_fails_to_come_up_is_reported() {
    let mut machine = failed_over(Role::Follower);
    step(&mut machine, rearm(1), at(5_000));
    let actions = step(&mut machine, qp_up(1, false), at(5_000));
    assert_eq!(
        actions,
        [
            Action::MoveQpToErr {
                path: Path::Default
            },
            Action::SendControl {
                via: Path::Backup,
                message: ControlMessage::RearmDone {
                    epoch: Epoch(1),
                    ok: false
                }
            },
        ]
    );
}

#[test]
fn follower_moves_to_wait_signaled_on_path_up() {
    let machine = follower_back_on_default_path();
    assert_eq!(machine.default_qp_phase(), DefaultQpPhase::Live);
    assert_eq!(machine.send_route(), Route::Backup);
}

#[test]
fn a_rearm_sent_to_a_leader_is_a_protocol_violation() {
    let mut machine = failed_over(Role::Leader);
    let actions = step(&mut machine, rearm(1), at(5_000));
    assert_eq!(
        failure_reason(&actions),
        Some(FailReason::ProtocolViolation)
    );
}

#[test]
fn a_rearm_for_an_old_epoch_is_a_protocol_violation() {
    let mut machine = follower_back_on_default_path();
    let actions = step(&mut machine, rearm(1), at(6_000));
    assert_eq!(
        failure_reason(&actions),
        Some(FailReason::ProtocolViolation)
    );
}

#[test]
fn a_failover_for_a_past_epoch_is_joined_by_a_leader_that_moved_on() {
    let mut machine = failed_over(Role::Leader);
    step(&mut machine, Event::Tick, at(1_000));
    step(&mut machine, rearm_done(1, true), at(1_000));
    step(&mut machine, qp_up(1, true), at(1_000));
    step(&mut machine, Event::ProbeCompleted { ok: false }, at(1_001));
    step(&mut machine, Event::Tick, at(2_000));
    assert_eq!(machine.epoch(), Epoch(2));
    // Meanwhile the follower lost its link with its QP still in epoch 1.
    let actions = step(&mut machine, peer_failover(1, 3, 0), at(2_001));
    assert_eq!(
        actions,
        [
            Action::MoveQpToErr {
                path: Path::Default
            },
            Action::DrainDefault
        ]
    );
    step(&mut machine, drained(progress(4, 4, 3)), at(2_001));
    assert_eq!(machine.send_phase(), SendPhase::Fallback);
    assert_eq!(machine.default_qp_phase(), DefaultQpPhase::Dead);
}

// ---- States 3 -> 4 -> 1: switch back ---------------------------------------------------------

#[test]
fn a_signaled_post_in_wait_signaled_becomes_the_fence() {
    let mut machine = leader_back_on_default_path();
    assert_eq!(
        step(
            &mut machine,
            Event::SignaledPosted {
                progress: progress(7, 4, 3)
            },
            at(2_000)
        ),
        []
    );
    assert_eq!(machine.send_phase(), SendPhase::WaitDrained);
    assert_eq!(machine.send_route(), Route::DefaultWithheld);
    assert!(!machine.reports_signaled_posts());
}

#[test]
fn fence_completion_tells_the_peer_how_many_sends_precede_the_switch() {
    let mut machine = leader_back_on_default_path();
    step(
        &mut machine,
        Event::SignaledPosted {
            progress: progress(7, 4, 3),
        },
        at(2_000),
    );
    let actions = step(&mut machine, Event::FenceCompleted, at(2_001));
    assert_eq!(
        actions,
        [Action::SendControl {
            via: Path::Backup,
            message: ControlMessage::SwitchBack {
                epoch: Epoch(1),
                sends_before: 7
            }
        }]
    );
    assert_eq!(
        machine.send_route(),
        Route::DefaultWithheld,
        "withheld until the peer follows"
    );
}

#[test]
fn switch_back_ready_releases_the_withheld_doorbell() {
    let mut machine = leader_back_on_default_path();
    step(
        &mut machine,
        Event::SignaledPosted {
            progress: progress(7, 4, 3),
        },
        at(2_000),
    );
    step(&mut machine, Event::FenceCompleted, at(2_001));
    let actions = step(&mut machine, switch_back_ready(1), at(2_002));
    assert_eq!(actions, [Action::ReleaseDefaultDoorbell]);
    assert_eq!(machine.send_phase(), SendPhase::Default);
    assert_eq!(machine.send_route(), Route::Default);
}

#[test]
fn a_switch_back_that_gets_no_answer_times_out() {
    let mut machine = leader_back_on_default_path();
    step(
        &mut machine,
        Event::SignaledPosted {
            progress: progress(7, 4, 3),
        },
        at(2_000),
    );
    step(&mut machine, Event::FenceCompleted, at(2_001));
    let actions = step(&mut machine, Event::Tick, at(4_001));
    assert_eq!(failure_reason(&actions), Some(FailReason::HandshakeTimeout));
}

#[test]
fn receiver_drains_its_backup_cq_before_moving_receives_back() {
    let mut machine = follower_back_on_default_path();
    let switch = switch_back(1, 5);
    assert_eq!(step(&mut machine, switch, at(6_000)), [Action::DrainBackup]);
    assert_eq!(machine.recv_phase(), RecvPhase::SwitchingBack);
    assert_eq!(machine.recv_route(), Route::Backup);
    let actions = step(
        &mut machine,
        Event::BackupDrained {
            progress: progress(3, 7, 5),
        },
        at(6_000),
    );
    assert_eq!(
        actions,
        [
            Action::MoveRecvsToDefault {
                consumed_through: 5
            },
            Action::SendControl {
                via: Path::Backup,
                message: ControlMessage::SwitchBackReady { epoch: Epoch(1) }
            },
        ]
    );
    assert_eq!(machine.recv_route(), Route::Default);
}

#[test]
fn receiver_polls_again_until_the_backup_completions_show() {
    let mut machine = follower_back_on_default_path();
    let switch = switch_back(1, 5);
    step(&mut machine, switch, at(6_000));
    assert_eq!(
        step(
            &mut machine,
            Event::BackupDrained {
                progress: progress(3, 7, 4)
            },
            at(6_000)
        ),
        []
    );
    let due = machine.poll_timeout().unwrap();
    assert_eq!(step(&mut machine, Event::Tick, due), [Action::DrainBackup]);
    let actions = step(
        &mut machine,
        Event::BackupDrained {
            progress: progress(3, 7, 5),
        },
        due,
    );
    assert_eq!(
        actions.first(),
        Some(&Action::MoveRecvsToDefault {
            consumed_through: 5
        })
    );
}

#[test]
fn stale_receives_left_on_the_backup_are_announced_at_the_next_failover() {
    let mut machine = follower_back_on_default_path();
    let switch = switch_back(1, 5);
    step(&mut machine, switch, at(6_000));
    // Seven receives posted, five consumed: two stay posted on the backup RQ.
    step(
        &mut machine,
        Event::BackupDrained {
            progress: progress(3, 7, 5),
        },
        at(6_000),
    );
    step(&mut machine, retry_exhausted(), at(7_000));
    let actions = step(&mut machine, drained(progress(3, 8, 6)), at(7_000));
    assert!(actions.contains(&Action::SendControl {
        via: Path::Backup,
        message: ControlMessage::Failover {
            epoch: Epoch(1),
            recvs_completed: 6,
            stale_recvs: 2,
        }
    }));
    assert!(actions.contains(&Action::CopyRecvsToBackup));
}

#[test]
fn the_peers_stale_receives_are_burned_before_the_copies() {
    let mut machine = leader_sending_on_default_peer_on_backup();
    step(&mut machine, retry_exhausted(), at(3_000));
    step(&mut machine, drained(progress(9, 4, 4)), at(3_000));
    let actions = step(&mut machine, peer_failover(1, 8, 2), at(3_001));
    assert_eq!(
        actions,
        [
            Action::CopySendsToBackup {
                burn: 2,
                skip_through: 8
            },
            Action::ResetDefaultQp
        ]
    );
}

#[test]
fn a_switch_back_after_the_pair_failed_again_is_ignored() {
    let mut machine = follower_back_on_default_path();
    step(&mut machine, link_down(Path::Default), at(6_000));
    let switch = switch_back(1, 5);
    assert_eq!(step(&mut machine, switch, at(6_001)), []);
    assert_eq!(machine.recv_phase(), RecvPhase::Fallback);
}

#[test]
fn a_failure_while_switching_receives_back_keeps_them_on_the_backup() {
    let mut machine = follower_back_on_default_path();
    let switch = switch_back(1, 5);
    step(&mut machine, switch, at(6_000));
    step(&mut machine, retry_exhausted(), at(6_001));
    assert_eq!(machine.recv_phase(), RecvPhase::Fallback);
    let actions = step(&mut machine, drained(progress(3, 7, 4)), at(6_001));
    assert!(
        !actions.contains(&Action::CopyRecvsToBackup),
        "nothing of ours is on the default RQ"
    );
}

#[test]
fn the_default_dying_during_wait_drained_moves_withheld_sends_to_the_backup() {
    let mut machine = leader_back_on_default_path();
    step(
        &mut machine,
        Event::SignaledPosted {
            progress: progress(7, 4, 3),
        },
        at(2_000),
    );
    step(&mut machine, link_down(Path::Default), at(2_001));
    assert_eq!(machine.send_route(), Route::DefaultWithheld);
    step(&mut machine, drained(progress(9, 4, 3)), at(2_001));
    let actions = step(&mut machine, peer_failover(1, 5, 0), at(2_002));
    assert_eq!(
        actions[0],
        Action::CopySendsToBackup {
            burn: 0,
            skip_through: 5
        }
    );
    assert_eq!(machine.send_phase(), SendPhase::Fallback);
    // A late answer to the abandoned switch-back changes nothing.
    let late = switch_back_ready(1);
    assert_eq!(step(&mut machine, late, at(2_003)), []);
    assert_eq!(step(&mut machine, Event::FenceCompleted, at(2_003)), []);
}

#[test]
fn a_switch_back_while_receives_are_on_the_default_qp_is_a_protocol_violation() {
    let mut machine = end(Role::Leader);
    let switch = switch_back(0, 1);
    let actions = step(&mut machine, switch, at(10));
    assert_eq!(
        failure_reason(&actions),
        Some(FailReason::ProtocolViolation)
    );
}

// ---- Giving up -------------------------------------------------------------------------------

#[test]
fn an_abort_from_the_peer_fails_this_end_without_an_echo() {
    let mut machine = failed_over(Role::Follower);
    let actions = step(
        &mut machine,
        Event::Control(ControlMessage::Abort {
            reason: FailReason::AtomicInFlight,
        }),
        at(20),
    );
    assert_eq!(
        actions,
        [Action::SurfaceError {
            status: WcStatus::RetryExcErr,
            reason: FailReason::PeerAborted
        }]
    );
}

#[test]
fn a_failed_end_ignores_everything() {
    let mut machine = end(Role::Leader);
    step(
        &mut machine,
        Event::ErrorCompletion {
            path: Path::Default,
            status: WcStatus::RemAccessErr,
        },
        at(10),
    );
    for event in [
        retry_exhausted(),
        peer_failover(0, 0, 0),
        Event::Tick,
        link_down(Path::Default),
    ] {
        assert_eq!(step(&mut machine, event, at(20)), []);
    }
    assert_eq!(machine.send_route(), Route::Closed);
    assert_eq!(machine.recv_route(), Route::Closed);
    assert_eq!(machine.poll_timeout(), None);
}

// ---- What the machine observed --------------------------------------------------------------

fn observed(machine: &mut Failover) -> Vec<Observation> {
    std::iter::from_fn(|| machine.poll_observation()).collect()
}

#[test]
fn a_round_started_by_an_error_completion_is_observed_with_its_status() {
    let mut machine = end(Role::Leader);
    step(&mut machine, retry_exhausted(), at(10));
    assert_eq!(
        observed(&mut machine),
        [Observation::RoundStarted {
            epoch: Epoch(0),
            trigger: RoundTrigger::ErrorCompletion(WcStatus::RetryExcErr),
        }]
    );
    // Taken once: the drain that follows starts nothing new.
    step(&mut machine, drained(progress(4, 4, 2)), at(10));
    assert_eq!(observed(&mut machine), []);
}

#[test]
fn rounds_started_by_link_down_and_by_the_peer_are_observed_as_such() {
    let mut machine = end(Role::Follower);
    let link_down = link_down(Path::Default);
    step(&mut machine, link_down, at(10));
    assert!(matches!(
        observed(&mut machine)[..],
        [Observation::RoundStarted {
            trigger: RoundTrigger::LinkDown,
            ..
        }]
    ));
    let mut machine = end(Role::Follower);
    step(&mut machine, peer_failover(0, 0, 0), at(10));
    assert!(matches!(
        observed(&mut machine)[..],
        [Observation::RoundStarted {
            trigger: RoundTrigger::Peer,
            ..
        }]
    ));
}

#[test]
fn a_round_that_cannot_start_is_not_observed() {
    let mut machine = end(Role::Leader);
    // The control QP went to ERR: the backup pair cannot come back without the peer, and
    // with the default devices' channel gone no failback can wait for the default either.
    step(&mut machine, control_failed(Path::Default), at(4));
    step(&mut machine, control_failed(Path::Backup), at(5));
    let actions = step(&mut machine, retry_exhausted(), at(10));
    assert!(surfaced(&actions).is_some());
    assert_eq!(observed(&mut machine), []);
}

#[test]
fn the_switch_back_is_observed_when_the_probe_confirms_the_path() {
    let mut machine = failed_over(Role::Leader);
    observed(&mut machine);
    let due = machine.poll_timeout().unwrap();
    step(&mut machine, Event::Tick, due);
    step(&mut machine, rearm_done(1, true), due);
    step(&mut machine, qp_up(1, true), due);
    assert_eq!(observed(&mut machine), []);
    step(&mut machine, Event::ProbeCompleted { ok: true }, due);
    assert_eq!(
        observed(&mut machine),
        [Observation::SwitchBackStarted { epoch: Epoch(1) }]
    );
}
