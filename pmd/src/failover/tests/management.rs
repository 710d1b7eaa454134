//! The third channel (`docs/failover.md` 5f): a failback and the default devices' channel's
//! repair over the management network when both control channels are lost.

use super::failback::{backup_error, failback_drained};
use super::repair::backup_up;
use super::*;

/// An end that can reach its peer over the management network (and waits the RC budget
/// alone while no path answers, as [`end`]).
fn managed(role: Role) -> Failover {
    Failover::new(
        Config {
            management: true,
            ..rc_only(role)
        },
        at(0),
    )
}

fn over_management(message: ControlMessage) -> Event {
    Event::Management(message)
}

/// The all-targets soak's loss, at a leader: traffic on the backup since the default link went
/// down at 10 ms (the round finished at 11 ms); at 50 ms the backup device fails every QP
/// (a failback), at 60 ms the default device fails every QP too, taking the default devices'
/// channel; returns the machine after the failback's drain, and what the channel's failure
/// asked.
fn failing_back_when_both_channels_fail(
    mut machine: Failover,
    management: bool,
) -> (Failover, Vec<Action>) {
    step(&mut machine, retry_exhausted(), at(10));
    step(&mut machine, link_down(Path::Default), at(10));
    step(&mut machine, drained(progress(4, 4, 2)), at(10));
    step(&mut machine, peer_failover(0, 3, 0), at(11));
    assert_eq!(machine.send_phase(), SendPhase::Fallback);
    assert_eq!(step(&mut machine, backup_error(), at(50)), FAILBACK_START);
    let proposed = machine.next_epoch();
    let sent = step(&mut machine, failback_drained(progress(6, 4, 2)), at(51));
    // Our bound on the default QP's old packets (6): whatever is left of it.
    let wait = match sent.first() {
        Some(Action::SendControl {
            message: ControlMessage::Failback { wait, .. },
            ..
        }) => *wait,
        other => panic!("no Failback on the default devices' channel: {other:?}"),
    };
    let failback = ControlMessage::Failback {
        epoch: proposed,
        recvs_completed: 2,
        wait,
    };
    let mut expected = vec![Action::SendControl {
        via: Path::Default,
        message: failback,
    }];
    if management {
        expected.push(Action::SendManagement { message: failback });
    }
    assert_eq!(sent, expected, "the Failback goes on every channel left");
    let actions = step(&mut machine, control_failed(Path::Default), at(60));
    (machine, actions)
}

#[test]
fn without_the_management_network_both_channels_failing_during_a_failback_end_the_connection() {
    let (machine, actions) = failing_back_when_both_channels_fail(end(Role::Leader), false);
    assert_eq!(
        failure_reason(&actions),
        Some(FailReason::BackupUnavailable)
    );
    assert_eq!(machine.failed(), Some(FailReason::BackupUnavailable));
}

#[test]
fn over_the_management_network_a_failback_finishes_after_both_channels_failed_and_the_channel_is_repaired(
) {
    let (mut machine, actions) = failing_back_when_both_channels_fail(managed(Role::Leader), true);
    assert_eq!(actions, []);
    assert_eq!(machine.failed(), None);
    // The peer's `Failback` comes over the management network only (its channel copy is
    // lost with our channel's QP); it proves nothing of the default path, whose link is down.
    let agreed = Epoch(2);
    assert_eq!(
        step(
            &mut machine,
            over_management(ControlMessage::Failback {
                epoch: agreed,
                recvs_completed: 3,
                wait: Duration::ZERO,
            }),
            at(70),
        ),
        []
    );
    let up = step(&mut machine, link_up(Path::Default), at(300));
    assert_eq!(
        up,
        [Action::Failback {
            epoch: agreed,
            skip_through: 3
        }]
    );
    // The channel is lost: `FailbackReady` goes over the management network alone.
    assert_eq!(
        step(&mut machine, qp_up(agreed.0, true), at(301)),
        [Action::SendManagement {
            message: ControlMessage::FailbackReady { epoch: agreed }
        }]
    );
    assert_eq!(
        step(
            &mut machine,
            over_management(ControlMessage::FailbackReady { epoch: agreed }),
            at(302)
        ),
        [Action::ReleaseDefaultDoorbell]
    );
    assert_eq!(machine.send_route(), Route::Default);
    assert_eq!(machine.recv_route(), Route::Default);
    assert_eq!(machine.failed(), None);
    // Both channels are lost. The backup side's repair goes over the management network
    // (it always does where there is one), once the backup link has been up for the
    // hold-down...
    let due = machine.poll_timeout().expect("a backup repair is due");
    assert_eq!(
        due,
        at(1_000),
        "the backup link's hold-down, from its last report"
    );
    assert_eq!(
        step(&mut machine, Event::Tick, due),
        [
            Action::ResetSide { side: Side::Backup },
            Action::SendManagement {
                message: ControlMessage::SideRearm { epoch: backup(1) }
            }
        ]
    );
    assert_eq!(
        step(
            &mut machine,
            over_management(ControlMessage::SideRearmDone {
                epoch: backup(1),
                ok: true
            }),
            due
        ),
        [Action::BringUpSide { epoch: backup(1) }]
    );
    assert_eq!(
        step(
            &mut machine,
            Event::SideUp {
                epoch: backup(1),
                ok: true,
            },
            due,
        ),
        []
    );
    // ... and then the default devices' channel over the repaired backup channel, in-band,
    // once the default link has been up for the hold-down.
    let channel_due = machine.poll_timeout().expect("a channel repair is due");
    assert!(
        channel_due >= at(300) + Config::new(Role::Leader).holddown,
        "{channel_due:?}"
    );
    assert_eq!(
        step(&mut machine, Event::Tick, channel_due),
        [
            Action::ResetSide {
                side: Side::DefaultChannel
            },
            Action::SendControl {
                via: Path::Backup,
                message: ControlMessage::SideRearm { epoch: channel(1) }
            }
        ]
    );
    assert_eq!(machine.failed(), None);
}

#[test]
fn a_follower_answers_a_channel_repair_over_the_management_network_it_came_on() {
    let mut machine = managed(Role::Follower);
    step(&mut machine, control_failed(Path::Default), at(5));
    step(&mut machine, control_failed(Path::Backup), at(6));
    // Its backup side is lost too: its `SideLost` for each goes over the management network
    // once the side's link has been up for the hold-down (the backup side's always goes
    // there where there is one).
    let due = machine
        .poll_timeout()
        .expect("the follower owes a SideLost");
    assert_eq!(
        step(&mut machine, Event::Tick, due),
        [
            Action::SendManagement {
                message: ControlMessage::SideLost { epoch: backup(0) }
            },
            Action::SendManagement {
                message: ControlMessage::SideLost { epoch: channel(0) }
            }
        ]
    );
    assert_eq!(
        step(
            &mut machine,
            over_management(ControlMessage::SideRearm { epoch: channel(1) }),
            due
        ),
        [
            Action::ResetSide {
                side: Side::DefaultChannel
            },
            Action::BringUpSide { epoch: channel(1) }
        ]
    );
    assert_eq!(
        step(
            &mut machine,
            Event::SideUp {
                epoch: channel(1),
                ok: true
            },
            due
        ),
        [Action::SendManagement {
            message: ControlMessage::SideRearmDone {
                epoch: channel(1),
                ok: true
            }
        }]
    );
    assert_eq!(machine.failed(), None);
}

#[test]
fn each_failback_message_is_taken_once_though_it_comes_on_both_channels() {
    // Traffic on the backup; the default link down, then the backup failing: a failback.
    let mut machine = managed(Role::Follower);
    step(&mut machine, retry_exhausted(), at(10));
    step(&mut machine, drained(progress(4, 4, 2)), at(10));
    step(&mut machine, peer_failover(0, 3, 0), at(11));
    assert_eq!(machine.send_phase(), SendPhase::Fallback);
    step(&mut machine, link_down(Path::Default), at(100));
    assert_eq!(step(&mut machine, backup_error(), at(100)), FAILBACK_START);
    let proposed = machine.next_epoch();
    step(&mut machine, failback_drained(progress(6, 4, 1)), at(101));
    let failback = ControlMessage::Failback {
        epoch: Epoch(5),
        recvs_completed: 1,
        wait: Duration::ZERO,
    };
    assert_eq!(step(&mut machine, Event::Control(failback), at(110)), []);
    // The copy on the channel proved the default path up: the bring-up is under way.
    assert_eq!(machine.send_phase(), SendPhase::FailingBack);
    assert_eq!(step(&mut machine, over_management(failback), at(111)), []);
    let agreed = proposed.max(Epoch(5));
    let ready = ControlMessage::FailbackReady { epoch: agreed };
    let due = machine
        .poll_timeout()
        .expect("the bring-up waits for the backoff");
    assert_eq!(
        step(&mut machine, Event::Tick, due),
        [Action::Failback {
            epoch: agreed,
            skip_through: 1
        }]
    );
    step(&mut machine, qp_up(agreed.0, true), due);
    assert_eq!(
        step(&mut machine, over_management(ready), due),
        [Action::ReleaseDefaultDoorbell]
    );
    assert_eq!(step(&mut machine, Event::Control(ready), due), []);
    assert_eq!(step(&mut machine, Event::Control(failback), due), []);
    assert_eq!(machine.failed(), None);
    assert_eq!(machine.send_route(), Route::Default);
}

#[test]
fn an_end_without_the_management_network_takes_a_message_from_it_as_a_protocol_violation() {
    let mut machine = end(Role::Leader);
    let actions = step(
        &mut machine,
        over_management(ControlMessage::SideRearm { epoch: channel(1) }),
        at(5),
    );
    assert_eq!(
        failure_reason(&actions),
        Some(FailReason::ProtocolViolation)
    );
}

#[test]
fn the_management_network_carries_no_message_of_the_default_pairs_rearm() {
    let mut machine = managed(Role::Follower);
    let actions = step(
        &mut machine,
        over_management(ControlMessage::Rearm { epoch: Epoch(1) }),
        at(5),
    );
    assert_eq!(
        failure_reason(&actions),
        Some(FailReason::ProtocolViolation)
    );
}

/// The `Abort`s among `actions`, wherever they go.
fn aborts(actions: &[Action]) -> Vec<Action> {
    actions
        .iter()
        .filter(|a| {
            matches!(
                a,
                Action::SendControl {
                    message: ControlMessage::Abort { .. },
                    ..
                } | Action::SendManagement {
                    message: ControlMessage::Abort { .. }
                }
            )
        })
        .copied()
        .collect()
}

#[test]
fn without_the_management_network_an_end_failing_with_both_channels_lost_tells_the_peer_nothing() {
    // Nothing in-band is left to carry an `Abort`: the peer waits out its handshake.
    let (_, actions) = failing_back_when_both_channels_fail(end(Role::Leader), false);
    assert_eq!(
        failure_reason(&actions),
        Some(FailReason::BackupUnavailable)
    );
    assert_eq!(aborts(&actions), []);
}

#[test]
fn over_the_management_network_an_end_failing_with_both_channels_lost_sends_its_abort_there() {
    let (mut machine, _) = failing_back_when_both_channels_fail(managed(Role::Leader), true);
    // The default path never comes back: the failback's wait for it runs out.
    let deadline = machine
        .poll_timeout()
        .expect("the failback waits for the default path");
    let actions = step(&mut machine, Event::Tick, deadline);
    let reason = failure_reason(&actions).expect("the wait ends the connection");
    assert_eq!(
        aborts(&actions),
        [Action::SendManagement {
            message: ControlMessage::Abort { reason }
        }],
        "the management network is the one channel left to tell the peer"
    );
}

#[test]
fn over_the_management_network_an_abort_also_goes_where_the_backup_channel_carries_one() {
    // A handshake the peer never answers, with the backup channel working: the `Abort` goes
    // in-band as before, and over the management network too.
    let mut machine = managed(Role::Leader);
    step(&mut machine, retry_exhausted(), at(10));
    step(&mut machine, drained(progress(4, 4, 2)), at(10));
    let deadline = machine
        .poll_timeout()
        .expect("the round waits for the peer");
    let actions = step(&mut machine, Event::Tick, deadline);
    let reason = failure_reason(&actions).expect("the round times out");
    assert_eq!(
        aborts(&actions),
        [
            Action::SendControl {
                via: Path::Backup,
                message: ControlMessage::Abort { reason }
            },
            Action::SendManagement {
                message: ControlMessage::Abort { reason }
            }
        ]
    );
}

#[test]
fn a_peers_abort_over_the_management_network_ends_the_connection_and_its_second_copy_is_ignored() {
    let mut machine = managed(Role::Follower);
    let abort = ControlMessage::Abort {
        reason: FailReason::BackupUnavailable,
    };
    let actions = step(&mut machine, over_management(abort), at(5));
    assert_eq!(failure_reason(&actions), Some(FailReason::PeerAborted));
    assert_eq!(aborts(&actions), [], "an end told to abort tells no one");
    assert_eq!(machine.failed(), Some(FailReason::PeerAborted));
    // The in-band copy, late: a failed end ignores it.
    assert_eq!(step(&mut machine, Event::Control(abort), at(6)), []);
    assert_eq!(machine.failed(), Some(FailReason::PeerAborted));
}

// ---- Whichever path answers first: the backup side repaired over the management network ---

/// An end with the default outage tolerance that can reach its peer over the management
/// network.
fn managed_tolerant(role: Role) -> Failover {
    Failover::new(
        Config {
            management: true,
            ..Config::new(role)
        },
        at(0),
    )
}

/// The chaos scenario's loss (seeds 2 and 5, SEND, `docs/measurements.md`): the backup side
/// lost (here its control QP failed while idle, its link down at 5 ms and back at 600 ms),
/// then the default link down at 1,000 ms, for longer than the tolerance. Returns the leader
/// with its round drained and waiting.
fn round_waiting_for_the_backup_side(role: Role) -> Failover {
    let mut machine = managed_tolerant(role);
    step(&mut machine, link_down(Path::Backup), at(5));
    step(&mut machine, control_failed(Path::Backup), at(5));
    step(&mut machine, link_up(Path::Backup), at(600));
    assert_eq!(
        step(&mut machine, link_down(Path::Default), at(1_000)),
        [
            Action::MoveQpToErr {
                path: Path::Default
            },
            Action::DrainDefault
        ],
        "a failover round, not a failback that would wait for the default path alone"
    );
    assert_eq!(
        step(&mut machine, drained(progress(4, 4, 2)), at(1_000)),
        [],
        "the Failover waits for the backup side"
    );
    assert_eq!(machine.send_phase(), SendPhase::FailingOver);
    machine
}

/// What an end sends once the backup side is back and its round goes on over it.
fn failover_goes(recvs_completed: u64) -> [Action; 2] {
    [
        Action::CopyRecvsToBackup,
        Action::SendControl {
            via: Path::Backup,
            message: ControlMessage::Failover {
                epoch: Epoch(0),
                recvs_completed,
                stale_recvs: 0,
            },
        },
    ]
}

#[test]
fn a_default_failure_with_the_backup_side_lost_repairs_it_over_the_management_network_and_fails_over(
) {
    let mut machine = round_waiting_for_the_backup_side(Role::Leader);
    // The backup link's hold-down passes at 1,600 ms: the leader repairs the backup side over
    // the management network, while the default path is still down.
    assert_eq!(machine.poll_timeout(), Some(at(1_600)));
    assert_eq!(
        step(&mut machine, Event::Tick, at(1_600)),
        [
            Action::ResetSide { side: Side::Backup },
            Action::SendManagement {
                message: ControlMessage::SideRearm { epoch: backup(1) }
            }
        ]
    );
    let done = over_management(ControlMessage::SideRearmDone {
        epoch: backup(1),
        ok: true,
    });
    assert_eq!(
        step(&mut machine, done, at(1_601)),
        [Action::BringUpSide { epoch: backup(1) }]
    );
    // Repaired: the round's `Failover` goes over the backup side at once.
    assert_eq!(
        step(&mut machine, backup_up(1, true), at(1_602)),
        failover_goes(2)
    );
    assert_eq!(
        step(&mut machine, peer_failover(0, 3, 0), at(1_603)),
        [
            Action::CopySendsToBackup {
                burn: 0,
                skip_through: 3
            },
            Action::ResetDefaultQp
        ]
    );
    assert_eq!(machine.send_phase(), SendPhase::Fallback);
    assert_eq!(machine.failed(), None);
}

#[test]
fn a_follower_whose_round_waits_for_the_backup_side_takes_part_in_its_repair_then_fails_over() {
    let mut machine = round_waiting_for_the_backup_side(Role::Follower);
    let rearm = over_management(ControlMessage::SideRearm { epoch: backup(1) });
    assert_eq!(
        step(&mut machine, rearm, at(1_200)),
        [
            Action::ResetSide { side: Side::Backup },
            Action::BringUpSide { epoch: backup(1) }
        ]
    );
    let mut expected = vec![Action::SendManagement {
        message: ControlMessage::SideRearmDone {
            epoch: backup(1),
            ok: true,
        },
    }];
    expected.extend(failover_goes(2));
    assert_eq!(step(&mut machine, backup_up(1, true), at(1_201)), expected);
    assert_eq!(machine.failed(), None);
}

#[test]
fn a_round_waiting_for_the_backup_side_fails_back_when_the_default_link_is_back_first() {
    let mut machine = round_waiting_for_the_backup_side(Role::Leader);
    assert_eq!(
        step(&mut machine, link_up(Path::Default), at(1_300)),
        FAILBACK_START
    );
    assert_eq!(machine.send_phase(), SendPhase::FailingBack);
}

/// A round begun by an RC error on a default link reported up all along (the failure at the
/// far end), the backup side lost and its link down: after the handshake timeout without a
/// repair it fails back anyway, so the failback's own messages find out whether the default
/// path carries packets (what a failback round did at once before).
#[test]
fn a_round_on_a_link_reported_up_waiting_for_the_backup_side_fails_back_after_the_handshake_timeout(
) {
    let mut machine = managed_tolerant(Role::Leader);
    step(&mut machine, link_down(Path::Backup), at(5));
    step(&mut machine, control_failed(Path::Backup), at(5));
    step(&mut machine, retry_exhausted(), at(1_000));
    assert_eq!(
        step(&mut machine, drained(progress(4, 4, 2)), at(1_000)),
        []
    );
    let handshake_timeout = Config::new(Role::Leader).handshake_timeout;
    let due = at(1_000) + handshake_timeout;
    assert_eq!(machine.poll_timeout(), Some(due));
    assert_eq!(step(&mut machine, Event::Tick, due), FAILBACK_START);
}

/// Neither path back within the tolerance: the round ends naming the outage, not the
/// handshake (it never sent anything the peer could have answered).
#[test]
fn a_round_waiting_for_the_backup_side_past_the_tolerance_fails_naming_the_outage() {
    let mut machine = managed_tolerant(Role::Leader);
    step(&mut machine, link_down(Path::Backup), at(5));
    step(&mut machine, control_failed(Path::Backup), at(5));
    step(&mut machine, link_down(Path::Default), at(1_000));
    step(&mut machine, drained(progress(4, 4, 2)), at(1_000));
    let tolerance = Config::new(Role::Leader).outage_tolerance;
    let end_at = at(1_000) + tolerance;
    let mut last = Vec::new();
    let mut now = at(1_000);
    while machine.failed().is_none() {
        let due = machine.poll_timeout().expect("something is due");
        assert!(due <= end_at, "{due:?}");
        now = due;
        last = step(&mut machine, Event::Tick, due);
    }
    assert_eq!(now, end_at);
    assert_eq!(
        failure_reason(&last),
        Some(FailReason::OutageTolerance),
        "{last:?}"
    );
}
