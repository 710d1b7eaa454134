//! Failback: the backup dies with traffic on it (`docs/failover.md` 5e).

use super::*;

pub(super) fn backup_error() -> Event {
    Event::ErrorCompletion {
        path: Path::Backup,
        status: WcStatus::RetryExcErr,
    }
}

pub(super) fn failback_drained(progress: Progress) -> Event {
    Event::FailbackDrained {
        progress,
        atomic_in_flight: false,
        sends_before_first_read: None,
    }
}

pub(super) fn peer_failback(epoch: u32, recvs_completed: u64) -> Event {
    peer_failback_waiting(epoch, recvs_completed, Duration::ZERO)
}

/// The peer's `Failback`, its own bound `wait` from passing.
pub(super) fn peer_failback_waiting(epoch: u32, recvs_completed: u64, wait: Duration) -> Event {
    Event::Control(ControlMessage::Failback {
        epoch: Epoch(epoch),
        recvs_completed,
        wait,
    })
}

fn failback_ready(epoch: u32) -> Event {
    Event::Control(ControlMessage::FailbackReady {
        epoch: Epoch(epoch),
    })
}

/// Drives a leader whose backup side was lost while idle into a failback round with the default
/// link down: the link went down at 100 ms, the default QP drained at 101 ms.
fn failing_back_with_the_default_link_down() -> Failover {
    let mut machine = backup_lost_while_idle(Role::Leader);
    step(&mut machine, link_down(Path::Default), at(100));
    step(&mut machine, failback_drained(progress(3, 2, 1)), at(101));
    machine
}

/// Ends a failback round whose drain is done once the peer's `Failback` for epoch 1 comes at
/// `now`, having consumed `peer_recvs`: traffic back on the default QP, the connection up.
fn finish_failback_in_epoch_1(machine: &mut Failover, peer_recvs: u64, now: Timestamp) {
    assert_eq!(
        step(machine, peer_failback(1, peer_recvs), now),
        [Action::Failback {
            epoch: Epoch(1),
            skip_through: peer_recvs
        }]
    );
    step(machine, qp_up(1, true), now);
    step(machine, failback_ready(1), now);
    assert_eq!(machine.send_route(), Route::Default);
    assert_eq!(machine.failed(), None);
}

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
        [Action::SendControl {
            via: Path::Default,
            message: ControlMessage::Failback {
                epoch: proposed,
                recvs_completed: mine.recvs_completed,
                wait: Duration::ZERO,
            }
        }]
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
        [Action::SendControl {
            via: Path::Default,
            message: ControlMessage::FailbackReady { epoch: agreed }
        }]
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
    step(&mut machine, link_down(Path::Default), at(12));
    step(&mut machine, link_up(Path::Default), at(300));
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
    assert_eq!(
        actions[0],
        Action::ResetSide { side: Side::Backup },
        "{actions:?}"
    );
}

#[test]
fn the_backup_dying_during_a_rearm_fails_back_above_the_attempts_epoch() {
    // Leader: its attempt reset the QP into epoch 1 and waits for the follower.
    let mut leader = failed_over(Role::Leader);
    let due = leader.poll_timeout().unwrap();
    step(&mut leader, Event::Tick, due);
    assert_eq!(leader.epoch(), Epoch(1));
    assert_eq!(
        step(&mut leader, control_failed(Path::Backup), due),
        FAILBACK_START
    );
    // The follower never heard of epoch 1 and proposes it; the leader's wins, above every
    // epoch either QP was in, and in epoch 1's PSN quarter: the attempt sent nothing there.
    // No wait: the attempt itself started no sooner than the backoff after the round.
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
    let mut machine = leader_sending_on_default_peer_on_backup();
    assert_eq!(machine.send_route(), Route::Default);
    assert_eq!(machine.recv_route(), Route::Backup);
    let actions = step(&mut machine, backup_error(), at(2_100));
    // The default QP carries our sends: it leaves epoch 1 too, and its work moves with
    // the backup's, no sooner than the backoff after it left RTS.
    assert_eq!(actions, FAILBACK_START);
    assert_eq!(
        complete_failback(&mut machine, progress(9, 4, 3), 2, 8, at(2_200)),
        Epoch(2)
    );
    // The SwitchBack of the peer's abandoned switch-back, late on the backup channel.
    assert_eq!(step(&mut machine, switch_back(1, 4), at(2_201)), []);
    assert_eq!(machine.failed(), None);
}

#[test]
fn both_ends_detecting_the_backup_failure_agree_on_one_epoch() {
    let mut a = failed_over(Role::Leader);
    let mut b = failed_over(Role::Follower);
    // Past the backoff since both default QPs left RTS (10 ms): the bring-ups need not wait.
    assert_eq!(step(&mut a, backup_error(), at(120)), FAILBACK_START);
    assert_eq!(
        step(&mut b, control_failed(Path::Backup), at(120)),
        FAILBACK_START
    );
    // Each end's message arrives while the other is still draining: kept for later.
    let from_a = step(&mut a, failback_drained(progress(6, 5, 3)), at(121));
    for action in from_a {
        let Action::SendControl {
            via: Path::Default,
            message,
        } = action
        else {
            panic!("{action:?}")
        };
        assert_eq!(step(&mut b, Event::Control(message), at(121)), []);
    }
    let from_b = step(&mut b, failback_drained(progress(5, 6, 4)), at(122));
    assert!(
        from_b.contains(&Action::Failback {
            epoch: Epoch(1),
            skip_through: 3
        }),
        "{from_b:?}"
    );
    let Action::SendControl {
        via: Path::Default,
        message,
    } = from_b[0]
    else {
        panic!("{from_b:?}")
    };
    assert_eq!(
        step(&mut a, Event::Control(message), at(123)),
        [Action::Failback {
            epoch: Epoch(1),
            skip_through: 4
        }]
    );
    // The peer's FailbackReady may come before our QP is up: the ring waits for it.
    step(&mut b, qp_up(1, true), at(124));
    assert_eq!(step(&mut a, failback_ready(1), at(124)), []);
    assert_eq!(
        step(&mut a, qp_up(1, true), at(125)),
        [
            Action::SendControl {
                via: Path::Default,
                message: ControlMessage::FailbackReady { epoch: Epoch(1) }
            },
            Action::ReleaseDefaultDoorbell
        ]
    );
    assert_eq!(
        step(&mut b, failback_ready(1), at(126)),
        [Action::ReleaseDefaultDoorbell]
    );
    assert_eq!(observed_failback(&mut a), Some(Epoch(1)));
    assert_eq!(observed_failback(&mut b), Some(Epoch(1)));
}

#[test]
fn an_end_that_saw_nothing_learns_of_the_backup_failure_from_the_failback_message() {
    let mut machine = failed_over(Role::Follower);
    // Past the backoff since its default QP left RTS (10 ms): the bring-up need not wait.
    // Its backup QP is still in RTS (retrying); the peer's message starts its round.
    assert_eq!(
        step(&mut machine, peer_failback(1, 3), at(120)),
        FAILBACK_START
    );
    assert_eq!(machine.send_phase(), SendPhase::FailingBack);
    let actions = step(&mut machine, failback_drained(progress(4, 4, 2)), at(121));
    assert_eq!(
        actions,
        [
            Action::SendControl {
                via: Path::Default,
                message: ControlMessage::Failback {
                    epoch: Epoch(1),
                    recvs_completed: 2,
                    wait: Duration::ZERO,
                }
            },
            Action::Failback {
                epoch: Epoch(1),
                skip_through: 3
            }
        ]
    );
    // The backup QP's flushes that follow are the round's own.
    assert_eq!(step(&mut machine, backup_error(), at(121)), []);
    assert_eq!(step(&mut machine, link_down(Path::Backup), at(121)), []);
    step(&mut machine, qp_up(1, true), at(122));
    step(&mut machine, failback_ready(1), at(123));
    assert_eq!(machine.send_route(), Route::Default);
    assert_eq!(machine.failed(), None);
}

#[test]
fn a_failback_with_the_default_link_down_waits_the_rc_budget_then_fails() {
    let mut machine = failed_over(Role::Leader);
    step(&mut machine, link_down(Path::Default), at(12));
    assert_eq!(step(&mut machine, backup_error(), at(100)), FAILBACK_START);
    step(&mut machine, failback_drained(progress(4, 4, 2)), at(101));
    // Nothing comes over the default path while it is down.
    let deadline = machine.poll_timeout().unwrap();
    assert_eq!(deadline, at(100) + budget());
    assert_eq!(step(&mut machine, Event::Tick, at(400)), []);
    let actions = assert_fails_at(&mut machine, deadline, FailReason::BackupUnavailable);
    // The peer is told on the default devices' channel, if it still carries anything.
    assert!(
        actions.iter().any(|a| matches!(
            a,
            Action::SendControl {
                via: Path::Default,
                message: ControlMessage::Abort {
                    reason: FailReason::BackupUnavailable
                }
            }
        )),
        "{actions:?}"
    );
}

#[test]
fn a_failback_proceeds_when_the_default_link_returns_within_the_budget() {
    let mut machine = failed_over(Role::Leader);
    step(&mut machine, link_down(Path::Default), at(12));
    step(&mut machine, backup_error(), at(100));
    step(&mut machine, failback_drained(progress(4, 4, 2)), at(101));
    step(&mut machine, link_up(Path::Default), at(500));
    // The peer's message comes once the path is back.
    finish_failback_in_epoch_1(&mut machine, 3, at(502));
}

#[test]
fn the_backup_link_down_past_the_budget_fails_back_when_the_default_is_up() {
    let mut machine = failed_over(Role::Leader);
    step(&mut machine, link_down(Path::Backup), at(20));
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
        failure_reason(&step(&mut machine, event, at(21))),
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
        failure_reason(&step(&mut machine, peer_failback(1, 3), at(22))),
        Some(FailReason::ReadOvertaken)
    );
}

#[test]
fn a_failback_without_answer_times_out() {
    let mut machine = failed_over(Role::Leader);
    step(&mut machine, backup_error(), at(20));
    step(&mut machine, failback_drained(progress(4, 4, 2)), at(21));
    let actions = step(&mut machine, Event::Tick, at(20) + Duration::from_secs(2));
    assert_eq!(failure_reason(&actions), Some(FailReason::HandshakeTimeout));
}

#[test]
fn a_second_failback_message_in_one_round_is_a_protocol_violation() {
    let mut machine = failed_over(Role::Leader);
    step(&mut machine, peer_failback(1, 3), at(20));
    assert_eq!(
        failure_reason(&step(&mut machine, peer_failback(1, 3), at(21))),
        Some(FailReason::ProtocolViolation)
    );
}

// ---- A default failure waits for whichever path comes back first (5e) ----------------------

#[test]
fn a_default_failure_with_the_backup_lost_fails_back_when_the_default_returns_in_time() {
    // The backup side lost while idle, not yet repaired; then the default link goes down.
    let mut machine = backup_lost_while_idle(Role::Leader);
    let actions = step(&mut machine, link_down(Path::Default), at(100));
    // Before: backup-unavailable at once.
    assert_eq!(actions, FAILBACK_START);
    step(&mut machine, failback_drained(progress(3, 2, 1)), at(101));
    step(&mut machine, link_up(Path::Default), at(300));
    finish_failback_in_epoch_1(&mut machine, 2, at(301));
    assert_eq!(observed_failback(&mut machine), Some(Epoch(1)));
}

#[test]
fn a_default_link_back_late_in_the_budget_gives_the_peers_failback_the_handshakes_time() {
    // The testbed's seed-5 loss: the backup lost while idle, then the default path down;
    // its link comes back 30 ms before the RC budget ends, and the peer's `Failback` (posted
    // while a link was down) arrives at its control QP's next retransmission, after the
    // budget.
    let mut machine = backup_lost_while_idle(Role::Leader);
    let down = at(100);
    let actions = step(&mut machine, link_down(Path::Default), down);
    assert_eq!(actions, FAILBACK_START);
    step(&mut machine, failback_drained(progress(3, 2, 1)), at(101));
    let back = down + (budget() - Duration::from_millis(30));
    step(&mut machine, link_up(Path::Default), back);
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
    let mut machine = failing_back_with_the_default_link_down();
    let back = at(300);
    step(&mut machine, link_up(Path::Default), back);
    let deadline = back + Config::new(Role::Leader).handshake_timeout;
    assert_eq!(machine.poll_timeout(), Some(deadline));
    assert_fails_at(&mut machine, deadline, FailReason::BackupUnavailable);
}

#[test]
fn backup_qps_failing_while_a_round_waits_for_the_backup_link_fail_back_instead() {
    let mut machine = end(Role::Leader);
    step(&mut machine, link_down(Path::Backup), at(5));
    step(&mut machine, link_down(Path::Default), at(10));
    step(&mut machine, drained(progress(4, 4, 2)), at(11));
    assert_eq!(machine.send_phase(), SendPhase::FailingOver);
    // Before: backup-unavailable at once, although the default came back 159 ms later.
    assert_eq!(step(&mut machine, backup_error(), at(50)), FAILBACK_START);
    // The wait is the budget counted from the first failure that waits (the round's).
    assert_eq!(machine.poll_timeout(), Some(at(10) + budget()));
    step(&mut machine, failback_drained(progress(4, 4, 2)), at(51));
    step(&mut machine, link_up(Path::Default), at(169));
    step(&mut machine, peer_failback(1, 3), at(170));
    step(&mut machine, qp_up(1, true), at(170));
    step(&mut machine, failback_ready(1), at(171));
    assert_eq!(machine.send_route(), Route::Default);
    assert_eq!(machine.failed(), None);
}

#[test]
fn the_default_link_back_before_the_backup_link_turns_the_round_into_a_failback() {
    let mut machine = end(Role::Follower);
    step(&mut machine, link_down(Path::Backup), at(5));
    step(&mut machine, link_down(Path::Default), at(10));
    step(&mut machine, drained(progress(4, 4, 2)), at(11));
    // Our Failover never left; the default path is back first.
    assert_eq!(
        step(&mut machine, link_up(Path::Default), at(200)),
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
    // The bring-up waits the backoff since the default QP left RTS at 10 ms.
    assert_eq!(machine.poll_timeout(), Some(at(110)));
    assert_eq!(
        step(&mut machine, Event::Tick, at(110)),
        [Action::Failback {
            epoch: Epoch(1),
            skip_through: 3
        }]
    );
    step(&mut machine, qp_up(1, true), at(111));
    step(&mut machine, failback_ready(1), at(112));
    assert_eq!(machine.send_route(), Route::Default);
    assert_eq!(machine.failed(), None);
    // The peer's Failover of the abandoned round, late on the backup channel: ignored.
    assert_eq!(step(&mut machine, peer_failover(0, 3, 0), at(113)), []);
    assert_eq!(machine.failed(), None);
}

#[test]
fn the_peers_failback_over_the_default_path_proves_it_up_before_the_link_watch_does() {
    let mut machine = failing_back_with_the_default_link_down();
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
pub(super) fn awaiting_switch_back_ready(machine: &mut Failover) {
    let fence = Event::SignaledPosted {
        progress: progress(7, 4, 3),
    };
    step(machine, fence, at(6_000));
    let actions = step(machine, Event::FenceCompleted, at(6_001));
    assert!(
        actions.iter().any(|a| matches!(
            a,
            Action::SendControl {
                via: Path::Backup,
                message: ControlMessage::SwitchBack { .. }
            }
        )),
        "{actions:?}"
    );
}

#[test]
fn a_switch_back_whose_follower_lost_its_backup_fails_back_instead_of_timing_out() {
    // The follower moved its receives back and posted `SwitchBackReady` on the backup
    // channel; then its backup side failed, the message with it. Its receives are on the
    // default QP: it needs nothing of the backup and only says `SideLost`.
    let mut machine = leader_back_on_default_path();
    awaiting_switch_back_ready(&mut machine);
    let lost = Event::Control(ControlMessage::SideLost { epoch: backup(0) });
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
    let rearm = Event::Control(ControlMessage::SideRearm { epoch: backup(1) });
    let actions = step(&mut machine, rearm, at(6_010));
    assert!(
        actions.contains(&Action::DrainForFailback),
        "the follower waits for a SwitchBackReady that may never come: {actions:?}"
    );
    assert!(actions.contains(&Action::SendControl {
        via: Path::Default,
        message: ControlMessage::SideRearmDone {
            epoch: backup(1),
            ok: false
        }
    }));
    assert_eq!(machine.send_phase(), SendPhase::FailingBack);
}
