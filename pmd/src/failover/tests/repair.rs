//! Repairing a side lost while the connection runs on (`docs/failover.md` 5d).

use super::*;

// ---- The backup side ------------------------------------------------------------------------

/// The bring-up of incarnation `epoch` of `side` finished (`ok`: its QPs are up).
fn side_up(side: Side, epoch: u32, ok: bool) -> Event {
    Event::SideUp {
        epoch: SideEpoch::new(side, epoch),
        ok,
    }
}

pub(super) fn backup_up(epoch: u32, ok: bool) -> Event {
    side_up(Side::Backup, epoch, ok)
}

/// Drives a follower whose control QP on `side` failed at 5 ms until it has told the leader, once,
/// over the other side's channel.
fn follower_that_told_the_leader_it_lost(side: Side) -> Failover {
    let (lost, via) = match side {
        Side::Backup => (Path::Backup, Path::Default),
        Side::DefaultChannel => (Path::Default, Path::Backup),
    };
    let mut machine = end(Role::Follower);
    assert_eq!(step(&mut machine, control_failed(lost), at(5)), []);
    tells_the_leader_it_lost(&mut machine, via, SideEpoch::new(side, 0));
    assert_eq!(machine.poll_timeout(), None, "told once");
    machine
}

/// A follower that lost a side: at its next tick it tells the leader, over `via`, that it lost
/// incarnation `epoch`.
fn tells_the_leader_it_lost(machine: &mut Failover, via: Path, epoch: SideEpoch) {
    let due = machine
        .poll_timeout()
        .expect("the follower tells the leader");
    assert_eq!(
        step(machine, Event::Tick, due),
        [Action::SendControl {
            via,
            message: ControlMessage::SideLost { epoch }
        }]
    );
}

/// Takes every observation; whether one said `side` was repaired.
fn observed_repair_of(machine: &mut Failover, side: Side) -> bool {
    let mut repaired = false;
    while let Some(o) = machine.poll_observation() {
        repaired |= matches!(o, Observation::SideRepaired { epoch } if epoch.side() == side);
    }
    repaired
}

/// Takes every observation; whether one said the backup side was repaired.
fn observed_repair(machine: &mut Failover) -> bool {
    observed_repair_of(machine, Side::Backup)
}

#[test]
fn a_leader_repairs_a_backup_lost_while_idle_and_is_protected_again() {
    let mut machine = end(Role::Leader);
    assert_eq!(step(&mut machine, control_failed(Path::Backup), at(5)), []);
    // The backup link has been up since the start: the hold-down is counted from there.
    let due = machine.poll_timeout().expect("a repair is scheduled");
    assert_eq!(due, at(1000));
    assert_eq!(
        step(&mut machine, Event::Tick, due),
        [
            Action::ResetSide { side: Side::Backup },
            Action::SendControl {
                via: Path::Default,
                message: ControlMessage::SideRearm { epoch: backup(1) }
            }
        ]
    );
    assert_eq!(
        step(
            &mut machine,
            Event::Control(ControlMessage::SideRearmDone {
                epoch: backup(1),
                ok: true
            }),
            at(1001)
        ),
        [Action::BringUpSide { epoch: backup(1) }]
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
    let mut machine = follower_that_told_the_leader_it_lost(Side::Backup);
    assert_eq!(
        step(
            &mut machine,
            Event::Control(ControlMessage::SideRearm { epoch: backup(1) }),
            at(1500)
        ),
        [
            Action::ResetSide { side: Side::Backup },
            Action::BringUpSide { epoch: backup(1) }
        ]
    );
    assert_eq!(
        step(&mut machine, backup_up(1, true), at(1500)),
        [Action::SendControl {
            via: Path::Default,
            message: ControlMessage::SideRearmDone {
                epoch: backup(1),
                ok: true
            }
        }]
    );
    assert!(observed_repair(&mut machine));
    let actions = step(&mut machine, retry_exhausted(), at(2000));
    assert_eq!(surfaced(&actions), None, "{actions:?}");
}

#[test]
fn a_leader_told_that_the_follower_lost_its_backup_repairs_both() {
    let mut machine = end(Role::Leader);
    let lost = Event::Control(ControlMessage::SideLost { epoch: backup(0) });
    assert_eq!(step(&mut machine, lost, at(5)), []);
    let due = machine.poll_timeout().expect("a repair is scheduled");
    assert_eq!(
        step(&mut machine, Event::Tick, due),
        [
            Action::ResetSide { side: Side::Backup },
            Action::SendControl {
                via: Path::Default,
                message: ControlMessage::SideRearm { epoch: backup(1) }
            }
        ]
    );
}

#[test]
fn a_follower_carrying_traffic_on_the_backup_refuses_a_backup_repair() {
    let mut machine = failed_over(Role::Follower);
    assert_eq!(
        step(
            &mut machine,
            Event::Control(ControlMessage::SideRearm { epoch: backup(1) }),
            at(20)
        ),
        [Action::SendControl {
            via: Path::Default,
            message: ControlMessage::SideRearmDone {
                epoch: backup(1),
                ok: false
            }
        }]
    );
    assert_eq!(machine.send_phase(), SendPhase::Fallback);
}

#[test]
fn a_backup_repair_is_not_attempted_while_traffic_is_on_the_backup() {
    let mut machine = failed_over(Role::Leader);
    // The peer lost its backup side (its last message came): ours waits with it.
    step(
        &mut machine,
        Event::Control(ControlMessage::SideLost { epoch: backup(0) }),
        at(20),
    );
    for t in [1000, 3000, 6000] {
        let actions = step(&mut machine, Event::Tick, at(t));
        assert!(
            !actions.contains(&Action::ResetSide { side: Side::Backup }),
            "reset while on the backup: {actions:?}"
        );
    }
}

#[test]
fn an_unanswered_or_refused_backup_repair_backs_off_and_tries_again() {
    let mut machine = backup_lost_while_idle(Role::Leader);
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
        Action::SendControl {
            via: Path::Default,
            message: ControlMessage::SideRearm { epoch: backup(2) }
        }
    );
    let refused = Event::Control(ControlMessage::SideRearmDone {
        epoch: backup(2),
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
        failure_reason(&actions),
        Some(FailReason::BackupUnavailable)
    );
}

/// The backup epoch a leader's repair attempt asks for, from the actions of the tick that
/// started it.
fn side_rearm_epoch(actions: &[Action]) -> SideEpoch {
    actions
        .iter()
        .find_map(|a| match a {
            Action::SendControl {
                message: ControlMessage::SideRearm { epoch },
                ..
            } => Some(*epoch),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no repair attempt in {actions:?}"))
}

#[test]
fn refused_backup_repair_attempts_do_not_use_up_the_psn_space_of_the_incarnation_lost() {
    // The follower refuses five attempts (traffic on its backup, or its backup link not yet
    // up for the hold-down), 200, 400 and 800 ms of backoff apart: the fourth starts 1.4 s
    // after the first, and packets of the lost incarnation held in a PFC-paused switch may
    // still live. Before, the fourth attempt was backup epoch 4, whose PSNs are epoch 0's.
    let quarter = |epoch: SideEpoch| epoch.start_psn(0) / EPOCH_PSN_STRIDE;
    let mut machine = end(Role::Leader);
    let lost = quarter(backup(0));
    step(
        &mut machine,
        Event::ControlFailed { via: Path::Backup },
        at(5),
    );
    let mut attempts = Vec::new();
    for _ in 0..5 {
        let due = machine.poll_timeout().expect("an attempt is scheduled");
        let epoch = side_rearm_epoch(&step(&mut machine, Event::Tick, due));
        attempts.push(epoch);
        let refused = Event::Control(ControlMessage::SideRearmDone { epoch, ok: false });
        assert_eq!(step(&mut machine, refused, due), []);
    }
    assert!(
        attempts.iter().all(|&e| quarter(e) != lost),
        "attempts {attempts:?} re-enter the PSN quarter of the incarnation lost"
    );
    // Nothing was sent in them: they all share the next quarter.
    assert!(attempts.iter().all(|&e| quarter(e) == lost + 1));
    assert!(attempts.windows(2).all(|w| w[0].number() < w[1].number()));

    // An attempt the follower accepts may send (its side is up even if ours then fails to
    // come up): the next one moves one quarter on.
    let due = machine.poll_timeout().unwrap();
    let accepted = side_rearm_epoch(&step(&mut machine, Event::Tick, due));
    assert_eq!(accepted, backup(21));
    let done = Event::Control(ControlMessage::SideRearmDone {
        epoch: accepted,
        ok: true,
    });
    assert_eq!(
        step(&mut machine, done, due),
        [Action::BringUpSide { epoch: accepted }]
    );
    assert_eq!(step(&mut machine, backup_up(21, false), due), []);
    let due = machine.poll_timeout().unwrap();
    let next = side_rearm_epoch(&step(&mut machine, Event::Tick, due));
    assert_eq!(next, backup(22));
    assert_eq!(quarter(next), quarter(accepted) + 1);
}

#[test]
fn an_unanswered_backup_repair_attempt_moves_the_next_one_to_the_next_psn_quarter() {
    // No answer within the handshake timeout: the follower may have brought its side up and
    // sent, its answer lost.
    let mut machine = end(Role::Leader);
    step(
        &mut machine,
        Event::ControlFailed { via: Path::Backup },
        at(5),
    );
    let first = side_rearm_epoch(&step(&mut machine, Event::Tick, at(1000)));
    assert_eq!(first, backup(1));
    let deadline = machine.poll_timeout().unwrap();
    assert_eq!(step(&mut machine, Event::Tick, deadline), []);
    let due = machine.poll_timeout().unwrap();
    assert_eq!(
        side_rearm_epoch(&step(&mut machine, Event::Tick, due)),
        backup(2)
    );
}

#[test]
fn without_the_default_devices_channel_no_backup_repair_is_attempted() {
    let mut machine = backup_lost_while_idle(Role::Leader);
    step(&mut machine, control_failed(Path::Default), at(6));
    assert_eq!(machine.poll_timeout(), None);
}

// ---- Repairing the default devices' channel (docs/failover.md 5d) ------------------------

fn channel_up(epoch: u32, ok: bool) -> Event {
    side_up(Side::DefaultChannel, epoch, ok)
}

/// Takes every observation; whether one said the default devices' channel was repaired.
fn observed_channel_repair(machine: &mut Failover) -> bool {
    observed_repair_of(machine, Side::DefaultChannel)
}

/// Leader: a default devices' channel lost at `lost` is repaired at its next tick.
fn leader_repairs_channel(machine: &mut Failover, epoch: u32) {
    let due = machine
        .poll_timeout()
        .expect("a channel repair is scheduled");
    assert_eq!(
        step(machine, Event::Tick, due),
        [
            Action::ResetSide {
                side: Side::DefaultChannel
            },
            Action::SendControl {
                via: Path::Backup,
                message: ControlMessage::SideRearm {
                    epoch: channel(epoch)
                }
            }
        ]
    );
    let done = Event::Control(ControlMessage::SideRearmDone {
        epoch: channel(epoch),
        ok: true,
    });
    assert_eq!(
        step(machine, done, due),
        [Action::BringUpSide {
            epoch: channel(epoch)
        }]
    );
    assert_eq!(step(machine, channel_up(epoch, true), due), []);
    assert!(observed_channel_repair(machine));
}

#[test]
fn a_leader_repairs_its_default_devices_channel_and_a_later_backup_loss_is_repaired() {
    let mut machine = end(Role::Leader);
    assert_eq!(step(&mut machine, control_failed(Path::Default), at(5)), []);
    // The default link has been up since the start: the hold-down is counted from there.
    assert_eq!(machine.poll_timeout(), Some(at(1000)));
    leader_repairs_channel(&mut machine, 1);
    assert_eq!(machine.poll_timeout(), None);
    // The backup side, lost later, is repaired over the repaired channel.
    step(&mut machine, control_failed(Path::Backup), at(2000));
    let due = machine
        .poll_timeout()
        .expect("a backup repair is scheduled");
    assert_eq!(
        step(&mut machine, Event::Tick, due),
        [
            Action::ResetSide { side: Side::Backup },
            Action::SendControl {
                via: Path::Default,
                message: ControlMessage::SideRearm { epoch: backup(1) }
            }
        ]
    );
}

#[test]
fn a_follower_that_lost_its_default_devices_channel_asks_the_leader_then_follows() {
    let mut machine = follower_that_told_the_leader_it_lost(Side::DefaultChannel);
    let rearm = Event::Control(ControlMessage::SideRearm { epoch: channel(1) });
    assert_eq!(
        step(&mut machine, rearm, at(1500)),
        [
            Action::ResetSide {
                side: Side::DefaultChannel
            },
            Action::BringUpSide { epoch: channel(1) }
        ]
    );
    assert_eq!(
        step(&mut machine, channel_up(1, true), at(1500)),
        [Action::SendControl {
            via: Path::Backup,
            message: ControlMessage::SideRearmDone {
                epoch: channel(1),
                ok: true
            }
        }]
    );
    assert!(observed_channel_repair(&mut machine));
    // The channel carries a backup repair again: the follower asks for one.
    step(&mut machine, control_failed(Path::Backup), at(2000));
    tells_the_leader_it_lost(&mut machine, Path::Default, backup(0));
}

#[test]
fn a_follower_whose_channel_works_resets_it_when_the_leader_repairs_its_own() {
    // The leader's default device failed its QPs; the follower's channel QP, idle, is still
    // in RTS of channel epoch 0 and must leave it before entering epoch 1 (H1).
    let mut machine = end(Role::Follower);
    let rearm = Event::Control(ControlMessage::SideRearm { epoch: channel(1) });
    assert_eq!(
        step(&mut machine, rearm, at(1500)),
        [
            Action::ResetSide {
                side: Side::DefaultChannel
            },
            Action::BringUpSide { epoch: channel(1) }
        ]
    );
    let stale = Event::Control(ControlMessage::SideRearm { epoch: channel(1) });
    let actions = step(&mut machine, channel_up(1, true), at(1500));
    assert_eq!(actions.len(), 1);
    assert!(observed_channel_repair(&mut machine));
    assert_eq!(
        failure_reason(&step(&mut machine, stale, at(1600))),
        Some(FailReason::ProtocolViolation),
        "a rearm for an epoch already entered"
    );
}

#[test]
fn a_leader_told_that_the_follower_lost_its_default_channel_repairs_both() {
    let mut machine = end(Role::Leader);
    let lost = Event::Control(ControlMessage::SideLost { epoch: channel(0) });
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
    assert_eq!(
        step(&mut machine, control_failed(Path::Default), at(10)),
        []
    );
    assert_eq!(
        step(&mut machine, Event::Tick, at(10)),
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
    step(&mut machine, retry_exhausted(), at(10));
    assert_eq!(machine.send_phase(), SendPhase::FailingOver);
    let done = Event::Control(ControlMessage::SideRearmDone {
        epoch: channel(1),
        ok: true,
    });
    assert_eq!(
        step(&mut machine, done, at(11)),
        [Action::BringUpSide { epoch: channel(1) }]
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
    step(&mut machine, control_failed(Path::Default), at(5));
    step(&mut machine, link_down(Path::Backup), at(6));
    assert_eq!(
        machine.poll_timeout(),
        Some(at(5_006)),
        "its messages need the backup link, or its link-down report to have stood for the trust"
    );
    step(&mut machine, link_up(Path::Backup), at(700));
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
            Action::ResetSide {
                side: Side::DefaultChannel
            },
            Action::SendControl {
                via: Path::Backup,
                message: ControlMessage::SideRearm { epoch: channel(2) }
            }
        ]
    );
    // The backup link going down abandons the attempt.
    step(&mut machine, link_down(Path::Backup), at(3300));
    let late = Event::Control(ControlMessage::SideRearmDone {
        epoch: channel(2),
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
    let rearm = Event::Control(ControlMessage::SideRearm { epoch: channel(1) });
    assert_eq!(
        step(&mut machine, rearm, at(11)),
        [Action::SendControl {
            via: Path::Backup,
            message: ControlMessage::SideRearmDone {
                epoch: channel(1),
                ok: false
            }
        }]
    );
}

// ---- Links reported down (issue 29 item 1: a report is a hint) -----------------------------

/// A backup side lost while its link is reported down, and the report never withdrawn (a late
/// or missed port event): once the report has stood for `Config::link_down_trust` the leader
/// tries the repair anyway and the handshake decides; here the path carries packets and the
/// side is repaired. Before, the repair waited for a link-up report for ever.
#[test]
fn a_backup_side_lost_with_its_link_reported_down_past_the_trust_is_repaired() {
    let mut machine = end(Role::Leader);
    step(&mut machine, link_down(Path::Backup), at(5));
    step(&mut machine, control_failed(Path::Backup), at(6));
    assert_eq!(machine.poll_timeout(), Some(at(5_005)), "the trust");
    assert_eq!(step(&mut machine, Event::Tick, at(5_004)), []);
    assert_eq!(
        step(&mut machine, Event::Tick, at(5_005)),
        [
            Action::ResetSide { side: Side::Backup },
            Action::SendControl {
                via: Path::Default,
                message: ControlMessage::SideRearm { epoch: backup(1) }
            }
        ]
    );
    let done = Event::Control(ControlMessage::SideRearmDone {
        epoch: backup(1),
        ok: true,
    });
    assert_eq!(
        step(&mut machine, done, at(5_006)),
        [Action::BringUpSide { epoch: backup(1) }]
    );
    assert_eq!(step(&mut machine, backup_up(1, true), at(5_007)), []);
    assert!(observed_repair(&mut machine));
    // Protected again: the next default failure fails over.
    let actions = step(&mut machine, retry_exhausted(), at(6_000));
    assert_eq!(surfaced(&actions), None, "{actions:?}");
    assert_eq!(machine.send_phase(), SendPhase::FailingOver);
}

/// The follower's half: within the trust a link reported down refuses the leader's repair
/// (and the leader backs off); past it the follower brings its side up and says so.
#[test]
fn a_follower_whose_backup_link_is_reported_down_past_the_trust_takes_part_in_a_repair() {
    let mut machine = end(Role::Follower);
    step(&mut machine, link_down(Path::Backup), at(5));
    let rearm = |epoch| {
        Event::Control(ControlMessage::SideRearm {
            epoch: backup(epoch),
        })
    };
    assert_eq!(
        step(&mut machine, rearm(1), at(3_000)),
        [Action::SendControl {
            via: Path::Default,
            message: ControlMessage::SideRearmDone {
                epoch: backup(1),
                ok: false
            }
        }]
    );
    assert_eq!(
        step(&mut machine, rearm(5), at(5_100)),
        [
            Action::ResetSide { side: Side::Backup },
            Action::BringUpSide { epoch: backup(5) }
        ]
    );
    assert_eq!(
        step(&mut machine, backup_up(5, true), at(5_101)),
        [Action::SendControl {
            via: Path::Default,
            message: ControlMessage::SideRearmDone {
                epoch: backup(5),
                ok: true
            }
        }]
    );
    assert!(observed_repair(&mut machine));
}

/// Link-down reports believed for ever (`link_down_trust` `Duration::MAX`) keep the repair
/// waiting for a link-up, as before.
#[test]
fn a_repair_waits_for_the_link_up_when_link_down_reports_are_believed_for_ever() {
    let config = Config {
        link_down_trust: Duration::MAX,
        ..rc_only(Role::Leader)
    };
    let mut machine = Failover::new(config, at(0));
    step(&mut machine, link_down(Path::Backup), at(5));
    step(&mut machine, control_failed(Path::Backup), at(6));
    assert_eq!(machine.poll_timeout(), None);
    step(&mut machine, link_up(Path::Backup), at(100));
    assert_eq!(machine.poll_timeout(), Some(at(1_100)), "the hold-down");
}
