//! One behaviour per test, named for it.

use core::time::Duration;

use super::*;

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

fn retry_exhausted() -> Event {
    Event::ErrorCompletion {
        path: Path::Default,
        status: WcStatus::RetryExcErr,
    }
}

/// Drives an end from Default through a whole failover round into Fallback.
fn failed_over(role: Role) -> Failover {
    let mut machine = end(role);
    step(&mut machine, retry_exhausted(), at(10));
    step(&mut machine, drained(progress(4, 4, 2)), at(10));
    step(&mut machine, peer_failover(0, 3, 0), at(11));
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

/// Drives a follower from Fallback through the leader's rearm into WaitSignaled.
fn follower_back_on_default_path() -> Failover {
    let mut machine = failed_over(Role::Follower);
    step(&mut machine, rearm(1), at(5_000));
    step(&mut machine, qp_up(1, true), at(5_000));
    step(&mut machine, path_up(1), at(5_001));
    assert_eq!(machine.send_phase(), SendPhase::WaitSignaled);
    machine
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
    let actions = step(
        &mut machine,
        Event::LinkDown {
            path: Path::Default,
        },
        at(10),
    );
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
    assert_eq!(
        step(
            &mut machine,
            Event::LinkDown {
                path: Path::Default
            },
            at(10)
        ),
        []
    );
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
            Action::SendControl(ControlMessage::Failover {
                epoch: Epoch(0),
                recvs_completed: 2,
                stale_recvs: 0
            }),
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
            Action::SendControl(ControlMessage::Failover {
                epoch: Epoch(0),
                recvs_completed: 1,
                stale_recvs: 0
            }),
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
    assert_eq!(
        step(
            &mut machine,
            Event::LinkDown {
                path: Path::Default
            },
            at(10)
        ),
        []
    );
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
    assert!(
        actions.contains(&Action::SendControl(ControlMessage::Abort {
            reason: FailReason::AtomicInFlight
        }))
    );
    assert!(!actions.iter().any(|a| matches!(
        a,
        Action::CopySendsToBackup { .. } | Action::CopyRecvsToBackup
    )));
    assert_eq!(machine.send_route(), Route::Closed);
}

/// Issue 14, gap 2: a READ rung before the peer's last consumed send would read what that
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
            assert!(
                actions.contains(&Action::SendControl(ControlMessage::Abort {
                    reason: FailReason::ReadOvertaken
                }))
            );
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
    assert_eq!(
        step(&mut machine, Event::LinkDown { path: Path::Backup }, at(5)),
        []
    );
    // The default is drained at once; the Failover message waits for the backup link.
    let actions = step(&mut machine, retry_exhausted(), at(10));
    assert!(actions.contains(&Action::DrainDefault), "{actions:?}");
    assert_eq!(surfaced(&actions), None);
    let actions = step(&mut machine, drained(progress(2, 2, 0)), at(11));
    assert!(
        !actions.iter().any(|a| matches!(a, Action::SendControl(_))),
        "{actions:?}"
    );
    let deadline = machine.poll_timeout().unwrap();
    assert_eq!(deadline, at(10) + budget());
    assert_eq!(step(&mut machine, Event::Tick, at(400)), []);
    let actions = step(&mut machine, Event::Tick, deadline);
    assert_eq!(
        surfaced(&actions),
        Some((WcStatus::RetryExcErr, FailReason::BackupUnavailable))
    );
}

#[test]
fn a_default_failure_fails_over_when_the_backup_link_returns_within_the_budget() {
    let mut machine = end(Role::Follower);
    step(&mut machine, Event::LinkDown { path: Path::Backup }, at(5));
    step(&mut machine, retry_exhausted(), at(10));
    step(&mut machine, drained(progress(4, 4, 2)), at(11));
    let actions = step(&mut machine, Event::LinkUp { path: Path::Backup }, at(300));
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::SendControl(ControlMessage::Failover { .. }))),
        "{actions:?}"
    );
    // The handshake's own timeout runs from the message, not from the link-down.
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
    step(&mut machine, Event::LinkDown { path: Path::Backup }, at(5));
    step(&mut machine, retry_exhausted(), at(10));
    step(&mut machine, drained(progress(4, 4, 2)), at(11));
    // It came over the backup path, so that path works whatever the link event said.
    let actions = step(&mut machine, peer_failover(0, 3, 0), at(50));
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::SendControl(ControlMessage::Failover { .. }))),
        "{actions:?}"
    );
    assert_eq!(machine.send_phase(), SendPhase::Fallback);
}

#[test]
fn with_no_backup_wait_a_default_failure_with_the_backup_link_down_fails_at_once() {
    let mut config = rc_only(Role::Leader);
    config.backup_wait = Duration::ZERO;
    let mut machine = Failover::new(config, at(0));
    step(&mut machine, Event::LinkDown { path: Path::Backup }, at(5));
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
    step(&mut machine, Event::LinkDown { path: Path::Backup }, at(5));
    step(&mut machine, Event::LinkUp { path: Path::Backup }, at(6));
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
    assert_eq!(
        surfaced(&actions).map(|(_, r)| r),
        Some(FailReason::HandshakeTimeout)
    );
}

#[test]
fn a_peer_claiming_more_receives_than_we_sent_is_a_protocol_violation() {
    let mut machine = end(Role::Leader);
    step(&mut machine, retry_exhausted(), at(10));
    step(&mut machine, drained(progress(2, 0, 0)), at(10));
    let actions = step(&mut machine, peer_failover(0, 3, 0), at(10));
    assert_eq!(
        surfaced(&actions).map(|(_, r)| r),
        Some(FailReason::ProtocolViolation)
    );
}

#[test]
fn a_failover_message_for_a_future_epoch_is_a_protocol_violation() {
    let mut machine = end(Role::Follower);
    let actions = step(&mut machine, peer_failover(3, 0, 0), at(10));
    assert_eq!(
        surfaced(&actions).map(|(_, r)| r),
        Some(FailReason::ProtocolViolation)
    );
}

// ---- The backup path ----------------------------------------------------------------------

#[test]
fn backup_link_down_in_fallback_fails_after_the_rc_budget_not_at_the_link_down() {
    let mut machine = failed_over(Role::Leader);
    // The default link is down too: no failback (5e) can take the traffic.
    step(
        &mut machine,
        Event::LinkDown {
            path: Path::Default,
        },
        at(15),
    );
    // Issue 15: this failed the connection at the link-down although a plain RC QP would
    // have retried through a 0.37 s outage.
    assert_eq!(
        step(&mut machine, Event::LinkDown { path: Path::Backup }, at(20)),
        []
    );
    let deadline = at(20) + budget();
    assert!(machine.poll_timeout().unwrap() <= deadline);
    let actions = step(&mut machine, Event::Tick, deadline);
    assert_eq!(
        surfaced(&actions),
        Some((WcStatus::RetryExcErr, FailReason::BackupUnavailable))
    );
    assert!(
        !actions.iter().any(|a| matches!(a, Action::SendControl(_))),
        "no control path to tell the peer"
    );
}

#[test]
fn a_backup_link_back_within_the_budget_keeps_the_connection_on_the_backup() {
    let mut machine = failed_over(Role::Leader);
    step(&mut machine, Event::LinkDown { path: Path::Backup }, at(20));
    step(&mut machine, Event::LinkUp { path: Path::Backup }, at(390));
    assert_eq!(step(&mut machine, Event::Tick, at(20) + budget()), []);
    assert_eq!(machine.failed(), None);
    assert_eq!(machine.send_route(), Route::Backup);
}

#[test]
fn a_transport_error_on_the_backup_in_fallback_with_the_default_channel_gone_fails() {
    let mut machine = failed_over(Role::Follower);
    step(&mut machine, Event::DefaultControlFailed, at(15));
    let event = Event::ErrorCompletion {
        path: Path::Backup,
        status: WcStatus::RetryExcErr,
    };
    assert_eq!(
        surfaced(&step(&mut machine, event, at(20))).map(|(_, r)| r),
        Some(FailReason::BackupUnavailable)
    );
}

#[test]
fn a_control_send_failure_in_fallback_with_the_default_channel_gone_fails() {
    let mut machine = failed_over(Role::Follower);
    step(&mut machine, Event::DefaultControlFailed, at(15));
    let actions = step(&mut machine, Event::ControlSendFailed, at(20));
    assert_eq!(
        surfaced(&actions).map(|(_, r)| r),
        Some(FailReason::BackupUnavailable)
    );
}

#[test]
fn losing_the_idle_backup_leaves_default_traffic_running() {
    let mut machine = end(Role::Leader);
    assert_eq!(step(&mut machine, Event::ControlSendFailed, at(5)), []);
    assert_eq!(machine.send_route(), Route::Default);
    // A later default failure can no longer fail over, even once the link is up: it waits
    // for the default path within the RC budget (a failback round, 5e), then fails.
    step(&mut machine, Event::LinkUp { path: Path::Backup }, at(6));
    let actions = step(&mut machine, retry_exhausted(), at(10));
    assert_eq!(actions, FAILBACK_START);
    assert_eq!(machine.poll_timeout(), Some(at(10) + budget()));
    let actions = step(&mut machine, Event::Tick, at(10) + budget());
    assert_eq!(
        surfaced(&actions).map(|(_, r)| r),
        Some(FailReason::BackupUnavailable)
    );
}

// ---- Repairing a backup side lost while idle (docs/failover.md 5d) ---------------------------

fn backup_msg(message: ControlMessage) -> Event {
    Event::Control(message)
}

fn backup_up(epoch: u32, ok: bool) -> Event {
    Event::BackupUp {
        epoch: Epoch(epoch),
        ok,
    }
}

/// Takes every observation; whether one said the backup side was repaired.
fn observed_repair(machine: &mut Failover) -> bool {
    let mut repaired = false;
    while let Some(o) = machine.poll_observation() {
        repaired |= matches!(o, Observation::BackupRepaired { .. });
    }
    repaired
}

#[test]
fn a_leader_repairs_a_backup_lost_while_idle_and_is_protected_again() {
    let mut machine = end(Role::Leader);
    assert_eq!(step(&mut machine, Event::ControlSendFailed, at(5)), []);
    // The backup link has been up since the start: the hold-down is counted from there.
    let due = machine.poll_timeout().expect("a repair is scheduled");
    assert_eq!(due, at(1000));
    assert_eq!(
        step(&mut machine, Event::Tick, due),
        [
            Action::ResetBackup,
            Action::SendControlOnDefault(ControlMessage::BackupRearm { epoch: Epoch(1) })
        ]
    );
    assert_eq!(
        step(
            &mut machine,
            backup_msg(ControlMessage::BackupRearmDone {
                epoch: Epoch(1),
                ok: true
            }),
            at(1001)
        ),
        [Action::BringUpBackup { epoch: Epoch(1) }]
    );
    assert_eq!(step(&mut machine, backup_up(1, true), at(1001)), []);
    assert!(observed_repair(&mut machine));
    assert_eq!(machine.poll_timeout(), None);
    // The next default failure fails over instead of failing the connection.
    let actions = step(&mut machine, retry_exhausted(), at(2000));
    assert_eq!(surfaced(&actions), None, "{actions:?}");
    assert_eq!(machine.send_phase(), SendPhase::FailingOver);
}

#[test]
fn a_follower_that_lost_its_backup_asks_the_leader_then_follows_its_repair() {
    let mut machine = end(Role::Follower);
    assert_eq!(step(&mut machine, Event::ControlSendFailed, at(5)), []);
    let due = machine
        .poll_timeout()
        .expect("the follower tells the leader");
    assert_eq!(
        step(&mut machine, Event::Tick, due),
        [Action::SendControlOnDefault(ControlMessage::BackupLost {
            epoch: Epoch(0)
        })]
    );
    assert_eq!(machine.poll_timeout(), None, "told once");
    assert_eq!(
        step(
            &mut machine,
            backup_msg(ControlMessage::BackupRearm { epoch: Epoch(1) }),
            at(1500)
        ),
        [
            Action::ResetBackup,
            Action::BringUpBackup { epoch: Epoch(1) }
        ]
    );
    assert_eq!(
        step(&mut machine, backup_up(1, true), at(1500)),
        [Action::SendControlOnDefault(
            ControlMessage::BackupRearmDone {
                epoch: Epoch(1),
                ok: true
            }
        )]
    );
    assert!(observed_repair(&mut machine));
    let actions = step(&mut machine, retry_exhausted(), at(2000));
    assert_eq!(surfaced(&actions), None, "{actions:?}");
}

#[test]
fn a_leader_told_that_the_follower_lost_its_backup_repairs_both() {
    let mut machine = end(Role::Leader);
    let lost = backup_msg(ControlMessage::BackupLost { epoch: Epoch(0) });
    assert_eq!(step(&mut machine, lost, at(5)), []);
    let due = machine.poll_timeout().expect("a repair is scheduled");
    assert_eq!(
        step(&mut machine, Event::Tick, due),
        [
            Action::ResetBackup,
            Action::SendControlOnDefault(ControlMessage::BackupRearm { epoch: Epoch(1) })
        ]
    );
}

#[test]
fn a_follower_carrying_traffic_on_the_backup_refuses_a_backup_repair() {
    let mut machine = failed_over(Role::Follower);
    assert_eq!(
        step(
            &mut machine,
            backup_msg(ControlMessage::BackupRearm { epoch: Epoch(1) }),
            at(20)
        ),
        [Action::SendControlOnDefault(
            ControlMessage::BackupRearmDone {
                epoch: Epoch(1),
                ok: false
            }
        )]
    );
    assert_eq!(machine.send_phase(), SendPhase::Fallback);
}

#[test]
fn a_backup_repair_is_not_attempted_while_traffic_is_on_the_backup() {
    let mut machine = failed_over(Role::Leader);
    // The peer lost its backup side (its last message came): ours waits with it.
    step(
        &mut machine,
        backup_msg(ControlMessage::BackupLost { epoch: Epoch(0) }),
        at(20),
    );
    for t in [1000, 3000, 6000] {
        let actions = step(&mut machine, Event::Tick, at(t));
        assert!(
            !actions.contains(&Action::ResetBackup),
            "reset while on the backup: {actions:?}"
        );
    }
}

#[test]
fn an_unanswered_or_refused_backup_repair_backs_off_and_tries_again() {
    let mut machine = end(Role::Leader);
    step(&mut machine, Event::ControlSendFailed, at(5));
    step(&mut machine, Event::Tick, at(1000));
    let deadline = machine.poll_timeout().unwrap();
    assert_eq!(deadline, at(3000), "the handshake timeout");
    assert_eq!(step(&mut machine, Event::Tick, deadline), []);
    assert_eq!(
        machine.poll_timeout(),
        Some(at(3200)),
        "backoff(1) = 200 ms"
    );
    let actions = step(&mut machine, Event::Tick, at(3200));
    assert_eq!(
        actions[1],
        Action::SendControlOnDefault(ControlMessage::BackupRearm { epoch: Epoch(2) })
    );
    let refused = backup_msg(ControlMessage::BackupRearmDone {
        epoch: Epoch(2),
        ok: false,
    });
    assert_eq!(step(&mut machine, refused, at(3201)), []);
    assert_eq!(
        machine.poll_timeout(),
        Some(at(3601)),
        "backoff(2) = 400 ms"
    );
    // A default failure meanwhile waits for the default path within the RC budget (a
    // failback round, 5e), then fails.
    let actions = step(&mut machine, retry_exhausted(), at(3300));
    assert_eq!(actions, FAILBACK_START);
    let actions = step(&mut machine, Event::Tick, at(3300) + budget());
    assert_eq!(
        surfaced(&actions).map(|(_, r)| r),
        Some(FailReason::BackupUnavailable)
    );
}

#[test]
fn without_the_default_devices_channel_no_backup_repair_is_attempted() {
    let mut machine = end(Role::Leader);
    step(&mut machine, Event::ControlSendFailed, at(5));
    step(&mut machine, Event::DefaultControlFailed, at(6));
    assert_eq!(machine.poll_timeout(), None);
}

// ---- Repairing the default devices' channel (docs/failover.md 5d) ------------------------

fn channel_up(epoch: u32, ok: bool) -> Event {
    Event::DefaultControlUp {
        epoch: Epoch(epoch),
        ok,
    }
}

/// Takes every observation; whether one said the default devices' channel was repaired.
fn observed_channel_repair(machine: &mut Failover) -> bool {
    let mut repaired = false;
    while let Some(o) = machine.poll_observation() {
        repaired |= matches!(o, Observation::DefaultControlRepaired { .. });
    }
    repaired
}

/// Leader: a default devices' channel lost at `lost` is repaired at its next tick.
fn leader_repairs_channel(machine: &mut Failover, epoch: u32) {
    let due = machine
        .poll_timeout()
        .expect("a channel repair is scheduled");
    assert_eq!(
        step(machine, Event::Tick, due),
        [
            Action::ResetDefaultControl,
            Action::SendControl(ControlMessage::DefaultControlRearm {
                epoch: Epoch(epoch)
            })
        ]
    );
    let done = Event::Control(ControlMessage::DefaultControlRearmDone {
        epoch: Epoch(epoch),
        ok: true,
    });
    assert_eq!(
        step(machine, done, due),
        [Action::BringUpDefaultControl {
            epoch: Epoch(epoch)
        }]
    );
    assert_eq!(step(machine, channel_up(epoch, true), due), []);
    assert!(observed_channel_repair(machine));
}

#[test]
fn a_leader_repairs_its_default_devices_channel_and_a_later_backup_loss_is_repaired() {
    let mut machine = end(Role::Leader);
    assert_eq!(step(&mut machine, Event::DefaultControlFailed, at(5)), []);
    // The default link has been up since the start: the hold-down is counted from there.
    assert_eq!(machine.poll_timeout(), Some(at(1000)));
    leader_repairs_channel(&mut machine, 1);
    assert_eq!(machine.poll_timeout(), None);
    // The backup side, lost later, is repaired over the repaired channel.
    step(&mut machine, Event::ControlSendFailed, at(2000));
    let due = machine
        .poll_timeout()
        .expect("a backup repair is scheduled");
    assert_eq!(
        step(&mut machine, Event::Tick, due),
        [
            Action::ResetBackup,
            Action::SendControlOnDefault(ControlMessage::BackupRearm { epoch: Epoch(1) })
        ]
    );
}

#[test]
fn a_follower_that_lost_its_default_devices_channel_asks_the_leader_then_follows() {
    let mut machine = end(Role::Follower);
    assert_eq!(step(&mut machine, Event::DefaultControlFailed, at(5)), []);
    let due = machine
        .poll_timeout()
        .expect("the follower tells the leader");
    assert_eq!(
        step(&mut machine, Event::Tick, due),
        [Action::SendControl(ControlMessage::DefaultControlLost {
            epoch: Epoch(0)
        })]
    );
    assert_eq!(machine.poll_timeout(), None, "told once");
    let rearm = Event::Control(ControlMessage::DefaultControlRearm { epoch: Epoch(1) });
    assert_eq!(
        step(&mut machine, rearm, at(1500)),
        [
            Action::ResetDefaultControl,
            Action::BringUpDefaultControl { epoch: Epoch(1) }
        ]
    );
    assert_eq!(
        step(&mut machine, channel_up(1, true), at(1500)),
        [Action::SendControl(
            ControlMessage::DefaultControlRearmDone {
                epoch: Epoch(1),
                ok: true
            }
        )]
    );
    assert!(observed_channel_repair(&mut machine));
    // The channel carries a backup repair again: the follower asks for one.
    step(&mut machine, Event::ControlSendFailed, at(2000));
    let due = machine
        .poll_timeout()
        .expect("the follower tells the leader");
    assert_eq!(
        step(&mut machine, Event::Tick, due),
        [Action::SendControlOnDefault(ControlMessage::BackupLost {
            epoch: Epoch(0)
        })]
    );
}

#[test]
fn a_follower_whose_channel_works_resets_it_when_the_leader_repairs_its_own() {
    // The leader's default device failed its QPs; the follower's channel QP, idle, is still
    // in RTS of channel epoch 0 and must leave it before entering epoch 1 (H1).
    let mut machine = end(Role::Follower);
    let rearm = Event::Control(ControlMessage::DefaultControlRearm { epoch: Epoch(1) });
    assert_eq!(
        step(&mut machine, rearm, at(1500)),
        [
            Action::ResetDefaultControl,
            Action::BringUpDefaultControl { epoch: Epoch(1) }
        ]
    );
    let stale = Event::Control(ControlMessage::DefaultControlRearm { epoch: Epoch(1) });
    let actions = step(&mut machine, channel_up(1, true), at(1500));
    assert_eq!(actions.len(), 1);
    assert!(observed_channel_repair(&mut machine));
    assert_eq!(
        surfaced(&step(&mut machine, stale, at(1600))).map(|(_, r)| r),
        Some(FailReason::ProtocolViolation),
        "a rearm for an epoch already entered"
    );
}

#[test]
fn a_leader_told_that_the_follower_lost_its_default_channel_repairs_both() {
    let mut machine = end(Role::Leader);
    let lost = Event::Control(ControlMessage::DefaultControlLost { epoch: Epoch(0) });
    assert_eq!(step(&mut machine, lost, at(5)), []);
    leader_repairs_channel(&mut machine, 1);
    // A late copy for the old channel epoch changes nothing.
    assert_eq!(step(&mut machine, lost, at(1500)), []);
    assert_eq!(machine.poll_timeout(), None);
}

#[test]
fn the_default_channel_lost_with_the_default_qps_is_repaired_after_the_failover_and_a_failback_works(
) {
    // The default device failed its QPs: the channel's failure is seen first, the data QP's
    // flush starts a round just after the repair began. The repair goes on through the
    // round (its answer would otherwise leave the follower's channel up and ours reset).
    let mut config = rc_only(Role::Leader);
    config.holddown = Duration::ZERO;
    let mut machine = Failover::new(config, at(0));
    assert_eq!(step(&mut machine, Event::DefaultControlFailed, at(10)), []);
    assert_eq!(
        step(&mut machine, Event::Tick, at(10)),
        [
            Action::ResetDefaultControl,
            Action::SendControl(ControlMessage::DefaultControlRearm { epoch: Epoch(1) })
        ]
    );
    step(&mut machine, retry_exhausted(), at(10));
    assert_eq!(machine.send_phase(), SendPhase::FailingOver);
    let done = Event::Control(ControlMessage::DefaultControlRearmDone {
        epoch: Epoch(1),
        ok: true,
    });
    assert_eq!(
        step(&mut machine, done, at(11)),
        [Action::BringUpDefaultControl { epoch: Epoch(1) }]
    );
    assert_eq!(step(&mut machine, channel_up(1, true), at(11)), []);
    assert!(observed_channel_repair(&mut machine));
    step(&mut machine, drained(progress(4, 4, 2)), at(11));
    step(&mut machine, peer_failover(0, 3, 0), at(12));
    assert_eq!(machine.send_phase(), SendPhase::Fallback);
    // The backup dies with traffic on it: a failback, not `backup-unavailable`.
    let backup_error = Event::ErrorCompletion {
        path: Path::Backup,
        status: WcStatus::RetryExcErr,
    };
    assert_eq!(step(&mut machine, backup_error, at(1500)), FAILBACK_START);
}

#[test]
fn a_default_channel_repair_waits_for_the_backup_channel_and_backs_off_when_unanswered() {
    let mut machine = end(Role::Leader);
    step(&mut machine, Event::DefaultControlFailed, at(5));
    step(&mut machine, Event::LinkDown { path: Path::Backup }, at(6));
    assert_eq!(
        machine.poll_timeout(),
        None,
        "its messages need the backup link"
    );
    step(&mut machine, Event::LinkUp { path: Path::Backup }, at(700));
    let due = machine.poll_timeout().unwrap();
    assert_eq!(due, at(1000));
    step(&mut machine, Event::Tick, due);
    let deadline = machine.poll_timeout().unwrap();
    assert_eq!(deadline, at(3000), "the handshake timeout");
    assert_eq!(step(&mut machine, Event::Tick, deadline), []);
    assert_eq!(machine.poll_timeout(), Some(at(3200)), "backoff(1)");
    let actions = step(&mut machine, Event::Tick, at(3200));
    assert_eq!(
        actions,
        [
            Action::ResetDefaultControl,
            Action::SendControl(ControlMessage::DefaultControlRearm { epoch: Epoch(2) })
        ]
    );
    // The backup link going down abandons the attempt.
    step(
        &mut machine,
        Event::LinkDown { path: Path::Backup },
        at(3300),
    );
    let late = Event::Control(ControlMessage::DefaultControlRearmDone {
        epoch: Epoch(2),
        ok: true,
    });
    assert_eq!(step(&mut machine, late, at(3301)), []);
}

#[test]
fn a_follower_refuses_a_default_channel_repair_while_failing_back() {
    let mut machine = failed_over(Role::Follower);
    let backup_error = Event::ErrorCompletion {
        path: Path::Backup,
        status: WcStatus::RetryExcErr,
    };
    assert_eq!(step(&mut machine, backup_error, at(20)), FAILBACK_START);
    let rearm = Event::Control(ControlMessage::DefaultControlRearm { epoch: Epoch(1) });
    assert_eq!(
        step(&mut machine, rearm, at(11)),
        [Action::SendControl(
            ControlMessage::DefaultControlRearmDone {
                epoch: Epoch(1),
                ok: false
            }
        )]
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
    step(
        &mut machine,
        Event::LinkDown {
            path: Path::Default,
        },
        at(3_000),
    );
    assert_eq!(
        machine.poll_timeout(),
        None,
        "no attempts while the link is down"
    );
    step(
        &mut machine,
        Event::LinkUp {
            path: Path::Default,
        },
        at(4_000),
    );
    assert_eq!(machine.poll_timeout(), Some(at(5_000)));
}

#[test]
fn leader_rearm_leaves_the_old_epoch_before_asking_the_follower() {
    let mut machine = failed_over(Role::Leader);
    let actions = step(&mut machine, Event::Tick, at(1_000));
    assert_eq!(
        actions,
        [
            Action::ResetDefaultQp,
            Action::SendControl(ControlMessage::Rearm { epoch: Epoch(1) })
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
        [Action::SendControl(ControlMessage::PathUp {
            epoch: Epoch(1)
        })]
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
    let actions = step(
        &mut machine,
        Event::LinkDown {
            path: Path::Default,
        },
        at(1_001),
    );
    assert_eq!(
        actions,
        [Action::MoveQpToErr {
            path: Path::Default
        }]
    );
    assert_eq!(machine.default_qp_phase(), DefaultQpPhase::Dead);
    assert_eq!(machine.poll_timeout(), None);
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
        [Action::SendControl(ControlMessage::RearmDone {
            epoch: Epoch(1),
            ok: true
        })]
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
    step(
        &mut machine,
        Event::LinkDown {
            path: Path::Default,
        },
        at(4_000),
    );
    let actions = step(&mut machine, rearm(1), at(5_000));
    assert_eq!(
        actions,
        [Action::SendControl(ControlMessage::RearmDone {
            epoch: Epoch(1),
            ok: false
        })]
    );
}

#[test]
fn follower_refuses_rearm_within_its_holddown() {
    let mut machine = failed_over(Role::Follower);
    step(
        &mut machine,
        Event::LinkDown {
            path: Path::Default,
        },
        at(4_000),
    );
    step(
        &mut machine,
        Event::LinkUp {
            path: Path::Default,
        },
        at(4_500),
    );
    let refused = [Action::SendControl(ControlMessage::RearmDone {
        epoch: Epoch(1),
        ok: false,
    })];
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
            Event::LinkUp {
                path: Path::Default,
            }
        } else {
            Event::LinkDown {
                path: Path::Default,
            }
        }
    };
    step(&mut machine, link(false), at(4_000));
    step(&mut machine, rearm(1), at(4_100));
    // Nothing owed while the link is down.
    assert_eq!(machine.poll_timeout(), None);
    step(&mut machine, link(true), at(6_000));
    let due = machine.poll_timeout();
    assert_eq!(due, Some(at(7_000)), "link-up plus the 1 s hold-down");
    assert_eq!(step(&mut machine, Event::Tick, at(6_999)), []);
    assert_eq!(
        step(&mut machine, Event::Tick, at(7_000)),
        [Action::SendControl(ControlMessage::RearmReady {
            epoch: Epoch(1)
        })]
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
            Action::SendControl(ControlMessage::Rearm { epoch: Epoch(13) })
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
            Action::SendControl(ControlMessage::RearmDone {
                epoch: Epoch(1),
                ok: false
            }),
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
        surfaced(&actions).map(|(_, r)| r),
        Some(FailReason::ProtocolViolation)
    );
}

#[test]
fn a_rearm_for_an_old_epoch_is_a_protocol_violation() {
    let mut machine = follower_back_on_default_path();
    let actions = step(&mut machine, rearm(1), at(6_000));
    assert_eq!(
        surfaced(&actions).map(|(_, r)| r),
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
        [Action::SendControl(ControlMessage::SwitchBack {
            epoch: Epoch(1),
            sends_before: 7
        })]
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
    assert_eq!(
        surfaced(&actions).map(|(_, r)| r),
        Some(FailReason::HandshakeTimeout)
    );
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
            Action::SendControl(ControlMessage::SwitchBackReady { epoch: Epoch(1) }),
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
    assert!(
        actions.contains(&Action::SendControl(ControlMessage::Failover {
            epoch: Epoch(1),
            recvs_completed: 6,
            stale_recvs: 2,
        }))
    );
    assert!(actions.contains(&Action::CopyRecvsToBackup));
}

#[test]
fn the_peers_stale_receives_are_burned_before_the_copies() {
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
    step(
        &mut machine,
        Event::LinkDown {
            path: Path::Default,
        },
        at(6_000),
    );
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
    step(
        &mut machine,
        Event::LinkDown {
            path: Path::Default,
        },
        at(2_001),
    );
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
        surfaced(&actions).map(|(_, r)| r),
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
        Event::LinkDown {
            path: Path::Default,
        },
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
    let link_down = Event::LinkDown {
        path: Path::Default,
    };
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
    step(&mut machine, Event::DefaultControlFailed, at(4));
    step(&mut machine, Event::ControlSendFailed, at(5));
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

// ---- Failback: the backup dies with traffic on it (docs/failover.md 5e) ----------------------

fn backup_error() -> Event {
    Event::ErrorCompletion {
        path: Path::Backup,
        status: WcStatus::RetryExcErr,
    }
}

fn failback_drained(progress: Progress) -> Event {
    Event::FailbackDrained {
        progress,
        atomic_in_flight: false,
        sends_before_first_read: None,
    }
}

fn peer_failback(epoch: u32, recvs_completed: u64) -> Event {
    Event::Control(ControlMessage::Failback {
        epoch: Epoch(epoch),
        recvs_completed,
    })
}

fn failback_ready(epoch: u32) -> Event {
    Event::Control(ControlMessage::FailbackReady {
        epoch: Epoch(epoch),
    })
}

const FAILBACK_START: [Action; 3] = [
    Action::MoveQpToErr { path: Path::Backup },
    Action::MoveQpToErr {
        path: Path::Default,
    },
    Action::DrainForFailback,
];

/// Takes every observation; the epoch a failback ended in, if one did.
fn observed_failback(machine: &mut Failover) -> Option<Epoch> {
    let mut back = None;
    while let Some(o) = machine.poll_observation() {
        if let Observation::FailedBack { epoch } = o {
            back = Some(epoch);
        }
    }
    back
}

/// Runs a failback round from its drain on: this end drained `mine`, the peer proposes
/// `peer_epoch` and consumed `peer_recvs`; returns the agreed epoch.
fn complete_failback(
    machine: &mut Failover,
    mine: Progress,
    peer_epoch: u32,
    peer_recvs: u64,
    now: Timestamp,
) -> Epoch {
    let proposed = machine.next_epoch();
    assert_eq!(
        step(machine, failback_drained(mine), now),
        [Action::SendControlOnDefault(ControlMessage::Failback {
            epoch: proposed,
            recvs_completed: mine.recvs_completed,
        })]
    );
    let agreed = proposed.max(Epoch(peer_epoch));
    assert_eq!(
        step(machine, peer_failback(peer_epoch, peer_recvs), now),
        [Action::Failback {
            epoch: agreed,
            skip_through: peer_recvs
        }]
    );
    assert_eq!(machine.send_route(), Route::DefaultWithheld);
    assert_eq!(machine.recv_route(), Route::DefaultWithheld);
    assert_eq!(
        step(machine, qp_up(agreed.0, true), now),
        [Action::SendControlOnDefault(
            ControlMessage::FailbackReady { epoch: agreed }
        )]
    );
    // Our receives are on the default QP; our sends wait for the peer's.
    assert_eq!(machine.recv_route(), Route::Default);
    assert_eq!(machine.send_route(), Route::DefaultWithheld);
    assert_eq!(
        step(machine, failback_ready(agreed.0), now),
        [Action::ReleaseDefaultDoorbell]
    );
    assert_eq!(machine.send_route(), Route::Default);
    assert_eq!(machine.default_qp_phase(), DefaultQpPhase::Live);
    assert_eq!(machine.failed(), None);
    assert_eq!(observed_failback(machine), Some(agreed));
    agreed
}

#[test]
fn the_backup_dying_during_the_holddown_moves_traffic_back_to_the_default() {
    let mut machine = failed_over(Role::Leader);
    step(
        &mut machine,
        Event::LinkDown {
            path: Path::Default,
        },
        at(12),
    );
    step(
        &mut machine,
        Event::LinkUp {
            path: Path::Default,
        },
        at(300),
    );
    // Hold-down running (until 1.3 s): a backup error here must repair, not end the
    // connection.
    let actions = step(&mut machine, backup_error(), at(400));
    assert_eq!(actions, FAILBACK_START);
    assert_eq!(machine.send_phase(), SendPhase::FailingBack);
    // Both QPs are in ERR: it left epoch 0, it proposes 1.
    let agreed = complete_failback(&mut machine, progress(9, 8, 5), 1, 6, at(401));
    assert_eq!(agreed, Epoch(1));
    // The backup side is lost; it is repaired later, once nothing needs it (5d).
    let due = machine.poll_timeout().expect("a repair is scheduled");
    let actions = step(&mut machine, Event::Tick, due);
    assert_eq!(actions[0], Action::ResetBackup, "{actions:?}");
}

#[test]
fn the_backup_dying_during_a_rearm_fails_back_above_the_attempts_epoch() {
    // Leader: its attempt reset the QP into epoch 1 and waits for the follower.
    let mut leader = failed_over(Role::Leader);
    let due = leader.poll_timeout().unwrap();
    step(&mut leader, Event::Tick, due);
    assert_eq!(leader.epoch(), Epoch(1));
    assert_eq!(
        step(&mut leader, Event::ControlSendFailed, due),
        FAILBACK_START
    );
    // The follower never heard of epoch 1 and proposes it; the leader's wins, above every
    // epoch either QP was in, and in epoch 1's PSN quarter: the attempt sent nothing there.
    assert_eq!(
        complete_failback(&mut leader, progress(4, 4, 2), 1, 3, due),
        Epoch(5)
    );
    // A stale RearmDone of the abandoned attempt changes nothing.
    assert_eq!(step(&mut leader, rearm_done(1, true), due), []);
    assert_eq!(leader.send_route(), Route::Default);

    // Follower: in RTS in epoch 1, not yet confirmed.
    let mut follower = failed_over(Role::Follower);
    step(&mut follower, rearm(1), at(5_000));
    step(&mut follower, qp_up(1, true), at(5_000));
    assert_eq!(
        step(&mut follower, backup_error(), at(5_001)),
        FAILBACK_START
    );
    assert_eq!(
        complete_failback(&mut follower, progress(4, 4, 2), 2, 3, at(5_002)),
        Epoch(2)
    );
    // A late Rearm of the leader's, from before the failback, is ignored, not a violation.
    assert_eq!(step(&mut follower, rearm(2), at(5_003)), []);
    assert_eq!(follower.failed(), None);
}

#[test]
fn the_backup_dying_with_one_direction_switched_back_moves_the_other_back_too() {
    // Our sends are back on the default QP; the peer's still come on the backup.
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
    assert_eq!(machine.send_route(), Route::Default);
    assert_eq!(machine.recv_route(), Route::Backup);
    let actions = step(&mut machine, backup_error(), at(2_100));
    // The default QP carries our sends: it leaves epoch 1 too, and its work moves with
    // the backup's.
    assert_eq!(actions, FAILBACK_START);
    assert_eq!(
        complete_failback(&mut machine, progress(9, 4, 3), 2, 8, at(2_101)),
        Epoch(2)
    );
    // The SwitchBack of the peer's abandoned switch-back, late on the backup channel.
    assert_eq!(step(&mut machine, switch_back(1, 4), at(2_102)), []);
    assert_eq!(machine.failed(), None);
}

#[test]
fn both_ends_detecting_the_backup_failure_agree_on_one_epoch() {
    let mut a = failed_over(Role::Leader);
    let mut b = failed_over(Role::Follower);
    assert_eq!(step(&mut a, backup_error(), at(20)), FAILBACK_START);
    assert_eq!(
        step(&mut b, Event::ControlSendFailed, at(20)),
        FAILBACK_START
    );
    // Each end's message arrives while the other is still draining: kept for later.
    let from_a = step(&mut a, failback_drained(progress(6, 5, 3)), at(21));
    for action in from_a {
        let Action::SendControlOnDefault(message) = action else {
            panic!("{action:?}")
        };
        assert_eq!(step(&mut b, Event::Control(message), at(21)), []);
    }
    let from_b = step(&mut b, failback_drained(progress(5, 6, 4)), at(22));
    assert!(
        from_b.contains(&Action::Failback {
            epoch: Epoch(1),
            skip_through: 3
        }),
        "{from_b:?}"
    );
    let Action::SendControlOnDefault(message) = from_b[0] else {
        panic!("{from_b:?}")
    };
    assert_eq!(
        step(&mut a, Event::Control(message), at(23)),
        [Action::Failback {
            epoch: Epoch(1),
            skip_through: 4
        }]
    );
    // The peer's FailbackReady may come before our QP is up: the ring waits for it.
    step(&mut b, qp_up(1, true), at(24));
    assert_eq!(step(&mut a, failback_ready(1), at(24)), []);
    assert_eq!(
        step(&mut a, qp_up(1, true), at(25)),
        [
            Action::SendControlOnDefault(ControlMessage::FailbackReady { epoch: Epoch(1) }),
            Action::ReleaseDefaultDoorbell
        ]
    );
    assert_eq!(
        step(&mut b, failback_ready(1), at(26)),
        [Action::ReleaseDefaultDoorbell]
    );
    assert_eq!(observed_failback(&mut a), Some(Epoch(1)));
    assert_eq!(observed_failback(&mut b), Some(Epoch(1)));
}

#[test]
fn an_end_that_saw_nothing_learns_of_the_backup_failure_from_the_failback_message() {
    let mut machine = failed_over(Role::Follower);
    // Its backup QP is still in RTS (retrying); the peer's message starts its round.
    assert_eq!(
        step(&mut machine, peer_failback(1, 3), at(20)),
        FAILBACK_START
    );
    assert_eq!(machine.send_phase(), SendPhase::FailingBack);
    let actions = step(&mut machine, failback_drained(progress(4, 4, 2)), at(21));
    assert_eq!(
        actions,
        [
            Action::SendControlOnDefault(ControlMessage::Failback {
                epoch: Epoch(1),
                recvs_completed: 2
            }),
            Action::Failback {
                epoch: Epoch(1),
                skip_through: 3
            }
        ]
    );
    // The backup QP's flushes that follow are the round's own.
    assert_eq!(step(&mut machine, backup_error(), at(21)), []);
    assert_eq!(
        step(&mut machine, Event::LinkDown { path: Path::Backup }, at(21)),
        []
    );
    step(&mut machine, qp_up(1, true), at(22));
    step(&mut machine, failback_ready(1), at(23));
    assert_eq!(machine.send_route(), Route::Default);
    assert_eq!(machine.failed(), None);
}

#[test]
fn a_failback_with_the_default_link_down_waits_the_rc_budget_then_fails() {
    let mut machine = failed_over(Role::Leader);
    step(
        &mut machine,
        Event::LinkDown {
            path: Path::Default,
        },
        at(12),
    );
    assert_eq!(step(&mut machine, backup_error(), at(100)), FAILBACK_START);
    step(&mut machine, failback_drained(progress(4, 4, 2)), at(101));
    // Nothing comes over the default path while it is down.
    let deadline = machine.poll_timeout().unwrap();
    assert_eq!(deadline, at(100) + budget());
    assert_eq!(step(&mut machine, Event::Tick, at(400)), []);
    let actions = step(&mut machine, Event::Tick, deadline);
    assert_eq!(
        surfaced(&actions),
        Some((WcStatus::RetryExcErr, FailReason::BackupUnavailable))
    );
    // The peer is told on the default devices' channel, if it still carries anything.
    assert!(
        actions.iter().any(|a| matches!(
            a,
            Action::SendControlOnDefault(ControlMessage::Abort {
                reason: FailReason::BackupUnavailable
            })
        )),
        "{actions:?}"
    );
}

#[test]
fn a_failback_proceeds_when_the_default_link_returns_within_the_budget() {
    let mut machine = failed_over(Role::Leader);
    step(
        &mut machine,
        Event::LinkDown {
            path: Path::Default,
        },
        at(12),
    );
    step(&mut machine, backup_error(), at(100));
    step(&mut machine, failback_drained(progress(4, 4, 2)), at(101));
    step(
        &mut machine,
        Event::LinkUp {
            path: Path::Default,
        },
        at(500),
    );
    // The peer's message comes once the path is back.
    assert_eq!(
        step(&mut machine, peer_failback(1, 3), at(502)),
        [Action::Failback {
            epoch: Epoch(1),
            skip_through: 3
        }]
    );
    step(&mut machine, qp_up(1, true), at(501));
    step(&mut machine, failback_ready(1), at(502));
    assert_eq!(machine.send_route(), Route::Default);
    assert_eq!(machine.failed(), None);
}

#[test]
fn the_backup_link_down_past_the_budget_fails_back_when_the_default_is_up() {
    let mut machine = failed_over(Role::Leader);
    step(&mut machine, Event::LinkDown { path: Path::Backup }, at(20));
    let deadline = at(20) + budget();
    assert_eq!(machine.poll_timeout(), Some(deadline));
    assert_eq!(step(&mut machine, Event::Tick, deadline), FAILBACK_START);
}

#[test]
fn an_atomic_in_flight_on_the_backup_fails_the_failback() {
    let mut machine = failed_over(Role::Leader);
    step(&mut machine, backup_error(), at(20));
    let event = Event::FailbackDrained {
        progress: progress(4, 4, 2),
        atomic_in_flight: true,
        sends_before_first_read: None,
    };
    assert_eq!(
        surfaced(&step(&mut machine, event, at(21))).map(|(_, r)| r),
        Some(FailReason::AtomicInFlight)
    );
}

#[test]
fn a_read_overtaken_on_the_backup_fails_the_failback() {
    let mut machine = failed_over(Role::Leader);
    step(&mut machine, backup_error(), at(20));
    let event = Event::FailbackDrained {
        progress: progress(4, 4, 2),
        atomic_in_flight: false,
        sends_before_first_read: Some(2),
    };
    step(&mut machine, event, at(21));
    assert_eq!(
        surfaced(&step(&mut machine, peer_failback(1, 3), at(22))).map(|(_, r)| r),
        Some(FailReason::ReadOvertaken)
    );
}

#[test]
fn a_failback_without_answer_times_out() {
    let mut machine = failed_over(Role::Leader);
    step(&mut machine, backup_error(), at(20));
    step(&mut machine, failback_drained(progress(4, 4, 2)), at(21));
    let actions = step(&mut machine, Event::Tick, at(20) + Duration::from_secs(2));
    assert_eq!(
        surfaced(&actions).map(|(_, r)| r),
        Some(FailReason::HandshakeTimeout)
    );
}

#[test]
fn a_second_failback_message_in_one_round_is_a_protocol_violation() {
    let mut machine = failed_over(Role::Leader);
    step(&mut machine, peer_failback(1, 3), at(20));
    assert_eq!(
        surfaced(&step(&mut machine, peer_failback(1, 3), at(21))).map(|(_, r)| r),
        Some(FailReason::ProtocolViolation)
    );
}

// ---- A default failure waits for whichever path comes back first (5e) ----------------------

#[test]
fn a_default_failure_with_the_backup_lost_fails_back_when_the_default_returns_in_time() {
    // The backup side lost while idle, not yet repaired; then the default link goes down.
    let mut machine = end(Role::Leader);
    step(&mut machine, Event::ControlSendFailed, at(5));
    let actions = step(
        &mut machine,
        Event::LinkDown {
            path: Path::Default,
        },
        at(100),
    );
    // Before: backup-unavailable at once.
    assert_eq!(actions, FAILBACK_START);
    step(&mut machine, failback_drained(progress(3, 2, 1)), at(101));
    step(
        &mut machine,
        Event::LinkUp {
            path: Path::Default,
        },
        at(300),
    );
    assert_eq!(
        step(&mut machine, peer_failback(1, 2), at(301)),
        [Action::Failback {
            epoch: Epoch(1),
            skip_through: 2
        }]
    );
    step(&mut machine, qp_up(1, true), at(301));
    step(&mut machine, failback_ready(1), at(302));
    assert_eq!(machine.send_route(), Route::Default);
    assert_eq!(machine.failed(), None);
    assert_eq!(observed_failback(&mut machine), Some(Epoch(1)));
}

#[test]
fn a_default_link_back_late_in_the_budget_gives_the_peers_failback_the_handshakes_time() {
    // The testbed's seed-5 loss: the backup lost while idle, then the default path down;
    // its link comes back 30 ms before the RC budget ends, and the peer's `Failback` (posted
    // while a link was down) arrives at its control QP's next retransmission, after the
    // budget.
    let mut machine = end(Role::Leader);
    step(&mut machine, Event::ControlSendFailed, at(5));
    let down = at(100);
    let actions = step(
        &mut machine,
        Event::LinkDown {
            path: Path::Default,
        },
        down,
    );
    assert_eq!(actions, FAILBACK_START);
    step(&mut machine, failback_drained(progress(3, 2, 1)), at(101));
    let back = down + (budget() - Duration::from_millis(30));
    step(
        &mut machine,
        Event::LinkUp {
            path: Path::Default,
        },
        back,
    );
    // Before: backup-unavailable here, the path up for 30 ms.
    assert_eq!(step(&mut machine, Event::Tick, down + budget()), []);
    assert_eq!(machine.failed(), None);
    let late = down + budget() + Duration::from_millis(240);
    assert_eq!(
        step(&mut machine, peer_failback(1, 2), late),
        [Action::Failback {
            epoch: Epoch(1),
            skip_through: 2
        }]
    );
    step(&mut machine, qp_up(1, true), late);
    step(&mut machine, failback_ready(1), late);
    assert_eq!(machine.send_route(), Route::Default);
    assert_eq!(machine.failed(), None);
}

#[test]
fn a_failback_whose_default_link_returns_but_whose_peer_stays_silent_fails_after_the_handshake_timeout(
) {
    let mut machine = end(Role::Leader);
    step(&mut machine, Event::ControlSendFailed, at(5));
    step(
        &mut machine,
        Event::LinkDown {
            path: Path::Default,
        },
        at(100),
    );
    step(&mut machine, failback_drained(progress(3, 2, 1)), at(101));
    let back = at(300);
    step(
        &mut machine,
        Event::LinkUp {
            path: Path::Default,
        },
        back,
    );
    let deadline = back + Config::new(Role::Leader).handshake_timeout;
    assert_eq!(machine.poll_timeout(), Some(deadline));
    let actions = step(&mut machine, Event::Tick, deadline);
    assert_eq!(
        surfaced(&actions),
        Some((WcStatus::RetryExcErr, FailReason::BackupUnavailable))
    );
}

#[test]
fn backup_qps_failing_while_a_round_waits_for_the_backup_link_fail_back_instead() {
    let mut machine = end(Role::Leader);
    step(&mut machine, Event::LinkDown { path: Path::Backup }, at(5));
    step(
        &mut machine,
        Event::LinkDown {
            path: Path::Default,
        },
        at(10),
    );
    step(&mut machine, drained(progress(4, 4, 2)), at(11));
    assert_eq!(machine.send_phase(), SendPhase::FailingOver);
    // Before: backup-unavailable at once, although the default came back 159 ms later.
    assert_eq!(step(&mut machine, backup_error(), at(50)), FAILBACK_START);
    // The wait is the budget counted from the first failure that waits (the round's).
    assert_eq!(machine.poll_timeout(), Some(at(10) + budget()));
    step(&mut machine, failback_drained(progress(4, 4, 2)), at(51));
    step(
        &mut machine,
        Event::LinkUp {
            path: Path::Default,
        },
        at(169),
    );
    step(&mut machine, peer_failback(1, 3), at(170));
    step(&mut machine, qp_up(1, true), at(170));
    step(&mut machine, failback_ready(1), at(171));
    assert_eq!(machine.send_route(), Route::Default);
    assert_eq!(machine.failed(), None);
}

#[test]
fn the_default_link_back_before_the_backup_link_turns_the_round_into_a_failback() {
    let mut machine = end(Role::Follower);
    step(&mut machine, Event::LinkDown { path: Path::Backup }, at(5));
    step(
        &mut machine,
        Event::LinkDown {
            path: Path::Default,
        },
        at(10),
    );
    step(&mut machine, drained(progress(4, 4, 2)), at(11));
    // Our Failover never left; the default path is back first.
    assert_eq!(
        step(
            &mut machine,
            Event::LinkUp {
                path: Path::Default
            },
            at(200)
        ),
        FAILBACK_START
    );
    assert_eq!(machine.send_phase(), SendPhase::FailingBack);
    // Still within the budget of the round's wait for the backup link.
    assert_eq!(machine.poll_timeout(), Some(at(10) + budget()));
}

#[test]
fn a_round_waiting_for_the_peers_failover_follows_its_failback() {
    // Our Failover left, the peer's did not come (its backup died): its Failback does.
    let mut machine = end(Role::Follower);
    step(&mut machine, retry_exhausted(), at(10));
    let actions = step(&mut machine, drained(progress(4, 4, 2)), at(11));
    assert!(actions.contains(&Action::CopyRecvsToBackup), "{actions:?}");
    assert_eq!(
        step(&mut machine, peer_failback(1, 3), at(20)),
        FAILBACK_START
    );
    step(&mut machine, failback_drained(progress(4, 4, 2)), at(21));
    step(&mut machine, qp_up(1, true), at(22));
    step(&mut machine, failback_ready(1), at(23));
    assert_eq!(machine.send_route(), Route::Default);
    assert_eq!(machine.failed(), None);
    // The peer's Failover of the abandoned round, late on the backup channel: ignored.
    assert_eq!(step(&mut machine, peer_failover(0, 3, 0), at(24)), []);
    assert_eq!(machine.failed(), None);
}

#[test]
fn the_peers_failback_over_the_default_path_proves_it_up_before_the_link_watch_does() {
    let mut machine = end(Role::Leader);
    step(&mut machine, Event::ControlSendFailed, at(5));
    step(
        &mut machine,
        Event::LinkDown {
            path: Path::Default,
        },
        at(100),
    );
    step(&mut machine, failback_drained(progress(3, 2, 1)), at(101));
    // The link is up again but not yet reported; the peer's message came over it.
    assert_eq!(
        step(&mut machine, peer_failback(1, 2), at(300)),
        [Action::Failback {
            epoch: Epoch(1),
            skip_through: 2
        }]
    );
    step(&mut machine, qp_up(1, true), at(301));
    step(&mut machine, failback_ready(1), at(302));
    assert_eq!(machine.send_route(), Route::Default);
    assert_eq!(machine.failed(), None);
}

/// Drives `machine` (back on the default path, WaitSignaled) through the fence: its
/// `SwitchBack` has left and it waits for the peer's `SwitchBackReady`.
fn awaiting_switch_back_ready(machine: &mut Failover) {
    let fence = Event::SignaledPosted {
        progress: progress(7, 4, 3),
    };
    step(machine, fence, at(6_000));
    let actions = step(machine, Event::FenceCompleted, at(6_001));
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::SendControl(ControlMessage::SwitchBack { .. }))),
        "{actions:?}"
    );
}

#[test]
fn a_switch_back_whose_follower_lost_its_backup_fails_back_instead_of_timing_out() {
    // The follower moved its receives back and posted `SwitchBackReady` on the backup
    // channel; then its backup side failed, the message with it. Its receives are on the
    // default QP: it needs nothing of the backup and only says `BackupLost`.
    let mut machine = leader_back_on_default_path();
    awaiting_switch_back_ready(&mut machine);
    let lost = backup_msg(ControlMessage::BackupLost { epoch: Epoch(0) });
    let actions = step(&mut machine, lost, at(6_010));
    assert!(
        actions.contains(&Action::DrainForFailback),
        "the leader waits for a SwitchBackReady that may never come: {actions:?}"
    );
    assert_eq!(machine.send_phase(), SendPhase::FailingBack);
    let actions = step(&mut machine, Event::Tick, at(8_002));
    assert_eq!(surfaced(&actions), None, "{actions:?}");
}

#[test]
fn a_switch_back_whose_leader_reset_its_backup_for_a_repair_fails_back_instead_of_timing_out() {
    // The leader moved its receives back and posted `SwitchBackReady`; its backup data QP
    // then failed, and with nothing depending on its backup it reset both backup QPs for a
    // repair, discarding the message if it had not left.
    let mut machine = follower_back_on_default_path();
    awaiting_switch_back_ready(&mut machine);
    let rearm = backup_msg(ControlMessage::BackupRearm { epoch: Epoch(1) });
    let actions = step(&mut machine, rearm, at(6_010));
    assert!(
        actions.contains(&Action::DrainForFailback),
        "the follower waits for a SwitchBackReady that may never come: {actions:?}"
    );
    assert!(actions.contains(&Action::SendControlOnDefault(
        ControlMessage::BackupRearmDone {
            epoch: Epoch(1),
            ok: false
        }
    )));
    assert_eq!(machine.send_phase(), SendPhase::FailingBack);
}

// ---- The outage tolerance (5c): work held while no path answers -------------------------

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
    step(&mut machine, Event::LinkDown { path: Path::Backup }, at(5));
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
    let actions = step(
        &mut machine,
        Event::LinkUp { path: Path::Backup },
        at(3_010),
    );
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::SendControl(ControlMessage::Failover { .. }))),
        "{actions:?}"
    );
    step(&mut machine, peer_failover(0, 3, 0), at(3_020));
    assert_eq!(machine.send_phase(), SendPhase::Fallback);
    assert_eq!(machine.failed(), None);
}

#[test]
fn a_default_failure_with_the_backup_link_down_past_the_tolerance_fails_naming_it() {
    let mut machine = tolerant(Role::Leader);
    step(&mut machine, Event::LinkDown { path: Path::Backup }, at(5));
    step(&mut machine, retry_exhausted(), at(10));
    step(&mut machine, drained(progress(2, 2, 0)), at(11));
    let deadline = machine.poll_timeout().unwrap();
    assert_eq!(deadline, at(10) + DEFAULT_OUTAGE_TOLERANCE);
    assert_eq!(step(&mut machine, Event::Tick, at(4_000)), []);
    let actions = step(&mut machine, Event::Tick, deadline);
    assert_eq!(
        surfaced(&actions),
        Some((WcStatus::RetryExcErr, FailReason::OutageTolerance))
    );
}

#[test]
fn a_failback_with_the_default_link_down_holds_the_work_for_the_tolerance() {
    let mut machine = tolerant_failed_over(Role::Leader);
    step(
        &mut machine,
        Event::LinkDown {
            path: Path::Default,
        },
        at(12),
    );
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
    step(
        &mut machine,
        Event::LinkUp {
            path: Path::Default,
        },
        at(2_200),
    );
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
    step(
        &mut machine,
        Event::LinkDown {
            path: Path::Default,
        },
        at(12),
    );
    step(&mut machine, backup_error(), at(100));
    step(&mut machine, failback_drained(progress(4, 4, 2)), at(101));
    let deadline = machine.poll_timeout().unwrap();
    let actions = step(&mut machine, Event::Tick, deadline);
    assert_eq!(
        surfaced(&actions),
        Some((WcStatus::RetryExcErr, FailReason::OutageTolerance))
    );
    assert_eq!(
        FailReason::OutageTolerance.to_string(),
        "no path answered for the whole outage tolerance"
    );
}

#[test]
fn the_backup_link_down_in_fallback_holds_the_work_past_the_rc_budget() {
    let mut machine = tolerant_failed_over(Role::Leader);
    step(
        &mut machine,
        Event::LinkDown { path: Path::Backup },
        at(100),
    );
    assert_eq!(
        machine.poll_timeout(),
        Some(at(100) + DEFAULT_OUTAGE_TOLERANCE)
    );
    let later = at(100) + budget() + Duration::from_millis(1);
    assert_eq!(step(&mut machine, Event::Tick, later), []);
    assert_eq!(machine.failed(), None);
    step(
        &mut machine,
        Event::LinkUp { path: Path::Backup },
        at(1_500),
    );
    assert_eq!(machine.send_phase(), SendPhase::Fallback);
    assert_eq!(machine.failed(), None);
}
