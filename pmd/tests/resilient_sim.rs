//! Resilient QPs over softnic devices on the in-memory fabric, deterministic: two hosts with
//! two NICs each, manual progress, a virtual clock. Failover on link down and on retry
//! exhaustion, switch-back, refusals, both paths down; data and notification order checked.

mod sim;

use std::time::Duration;

use pmd::datapath::sq::RequestParts;
use pmd::provider::DeviceFault;
use pmd::resilient::{Cause, EventKind, ResilientQp, ResilientState};
use pmd::{RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus};
use sim::scenario::{assert_both_hosts, assert_ran, both_ways, Scenario};
use sim::traffic::{assert_clean, nccl, step, Dir, Traffic};
use sim::*;

#[test]
fn a_connected_pair_is_protected_and_carries_traffic_on_the_default_path() {
    let mut sim = Sim::new(1, config());
    assert_eq!(sim.a.qp.state(), ResilientState::Default);
    let mut t = nccl(&sim, 20);
    assert!(sim.run_until(Duration::from_secs(1), |s| step(&mut t, s)));
    assert_clean(&mut t, &mut sim);
    assert_eq!(sim.a.qp.stats().failovers, 0);
}

#[test]
fn link_down_of_the_default_nic_moves_traffic_to_the_backup_in_order() {
    let mut sim = Sim::new(2, config());
    let mut t = nccl(&sim, 60);
    let mut down = false;
    let done = sim.run_until(Duration::from_secs(5), |s| {
        if !down && t.dirs[0].completed >= 10 {
            s.link_down(A_DEFAULT, None);
            down = true;
        }
        step(&mut t, s)
    });
    assert!(
        done,
        "traffic stalled: {} of 60 completed, {} notified",
        t.dirs[0].completed, t.dirs[0].notified
    );
    assert_clean(&mut t, &mut sim);
    assert_eq!(sim.a.qp.state(), ResilientState::Fallback);
    let stats = sim.a.qp.stats();
    assert_eq!(stats.failovers, 1);
    let event = &sim.a.qp.events()[0];
    assert_eq!(
        (event.kind, event.cause),
        (EventKind::Failover, Cause::LinkDown)
    );
    assert!(event.fallback_latency_us.is_some(), "{event:?}");
}

#[test]
fn the_default_path_comes_back_and_sends_switch_back_in_order() {
    let mut sim = Sim::new(3, config());
    let mut t = nccl(&sim, 400);
    let mut down = false;
    let done = sim.run_until(Duration::from_secs(20), |s| {
        if !down && t.dirs[0].completed >= 10 {
            s.link_down(A_DEFAULT, Some(Duration::from_millis(30)));
            down = true;
        }
        step(&mut t, s)
            && s.a.qp.state() == ResilientState::Default
            && s.b.qp.state() == ResilientState::Default
    });
    assert!(
        done,
        "stalled: {} completed, {} notified, states {:?} {:?}",
        t.dirs[0].completed,
        t.dirs[0].notified,
        sim.a.qp.state(),
        sim.b.qp.state()
    );
    assert_clean(&mut t, &mut sim);
    assert_both_hosts(&sim, |s| (s.failovers, s.switch_backs), (1, 1));
    let back = &sim.a.qp.events()[1];
    assert_eq!(
        (back.kind, back.cause),
        (EventKind::SwitchBack, Cause::PathRecovered)
    );
}

#[test]
fn a_recovery_at_the_follower_switches_back_after_its_holddown_not_the_leaders_backoff() {
    // A leads (its default GID sorts lower). B's default link is down for 400 ms: the
    // leader's rearm attempts are refused and back off (10, 20, 40, ... ms); B tells it when
    // its hold-down (50 ms) is over, so the switch-back does not wait for the next attempt
    // (without that message it came 141 ms after link-up).
    let (mut sim, mut t) = Scenario::new(7).one_way(1000, Duration::from_millis(1));
    let outage = Duration::from_millis(400);
    let after_up = switch_back_after_outage(&mut sim, &mut t, B_DEFAULT, outage, |_| {}, "");
    let holddown = config().holddown;
    assert!(
        after_up >= holddown && after_up <= holddown + Duration::from_millis(10),
        "switched back {after_up:?} after link-up (hold-down {holddown:?})"
    );
    let stats = sim.b.qp.stats();
    assert_eq!((stats.failovers, stats.switch_backs), (1, 1), "{stats:?}");
}

/// Takes `port` down for `outage` once ten iterations completed (and calls `also` then),
/// runs until the traffic finished and both ends are back on their default QPs after the
/// link came up, checks the traffic, and returns how long after the link-up both were back.
fn switch_back_after_outage(
    sim: &mut Sim,
    t: &mut Traffic,
    port: usize,
    outage: Duration,
    mut also: impl FnMut(&mut Sim),
    what: &str,
) -> Duration {
    let mut up_at = None;
    let mut back_at = None;
    let done = sim.run_until(outage + Duration::from_secs(300), |s| {
        if up_at.is_none() && t.dirs[0].completed >= 10 {
            s.link_down(port, Some(outage));
            up_at = Some(s.now() + outage);
            also(s);
        }
        let both_default =
            s.a.qp.state() == ResilientState::Default && s.b.qp.state() == ResilientState::Default;
        if back_at.is_none() && up_at.is_some_and(|up| s.now() > up) && both_default {
            back_at = Some(s.now());
        }
        step(t, s) && back_at.is_some()
    });
    assert!(
        done,
        "{what}: stalled: {} completed, states {:?} {:?}, events A {:?} B {:?}",
        t.dirs[0].completed,
        sim.a.qp.state(),
        sim.b.qp.state(),
        sim.a.qp.events(),
        sim.b.qp.events()
    );
    assert_clean(t, sim);
    back_at.unwrap() - up_at.unwrap()
}

/// Both ends counted exactly one failover and one switch-back: the outage was ridden out in
/// one round each way, not in repeated attempts that each moved the traffic.
fn assert_one_failover_and_switch_back_each(sim: &Sim, what: &str) {
    for h in [&sim.a, &sim.b] {
        let stats = h.qp.stats();
        assert_eq!(
            (stats.failovers, stats.switch_backs),
            (1, 1),
            "{what}: {stats:?}"
        );
    }
}

/// A default link down for ten minutes, then back, ends in a switch-back (issue 29, long
/// outages): the traffic runs on the backup all the while, and the switch-back comes at most
/// one backoff (the default cap, 5 s) after the hold-down. The leader's default link, then the
/// follower's; each reported as it is, and reported up (wrongly) from a second into the
/// outage, so that the leader's rearm attempts fail for ten minutes: they go on at the capped
/// backoff with no cap on their number.
#[test]
fn a_default_link_down_for_ten_minutes_then_back_ends_in_a_switch_back() {
    let backoff_max = Duration::from_secs(5);
    let outage = Duration::from_secs(600);
    let cases = [A_DEFAULT, B_DEFAULT].map(|port| [(port, false), (port, true)]);
    for (port, reported_up) in cases.into_iter().flatten() {
        let (mut sim, mut t) = Scenario::new(11)
            .backoff_max(backoff_max)
            .one_way(700, Duration::from_secs(1));
        let what = format!("port {port}, reported up {reported_up}");
        let lie = |s: &mut Sim| {
            if reported_up {
                let from = s.now() + Duration::from_secs(1);
                s.fabric
                    .add_rule(softnic::FaultRule::link_report(port, true, from, None));
            }
        };
        let after_up = switch_back_after_outage(&mut sim, &mut t, port, outage, lie, &what);
        let holddown = config().holddown;
        assert!(
            after_up <= holddown + backoff_max + Duration::from_millis(100),
            "port {port}, reported up {reported_up}: switched back {after_up:?} after link-up"
        );
        assert_one_failover_and_switch_back_each(&sim, &what);
    }
}

/// A link report is a hint (issue 29 item 1): a default link that comes back while its
/// report stays down (a late netdev, a missed port event) is rearmed once the report has stood
/// for `link_down_trust`, and the traffic switches back; before, it stayed on the backup for as
/// long as the report stood. The leader's link, then the follower's.
#[test]
fn a_default_link_back_while_still_reported_down_is_found_by_a_rearm() {
    let outage = Duration::from_secs(2);
    for port in [A_DEFAULT, B_DEFAULT] {
        let (mut sim, mut t) = Scenario::new(12).one_way(30, Duration::from_secs(1));
        let what = format!("port {port}, reported down for ever");
        let stale = |s: &mut Sim| {
            let from = s.now() + outage;
            s.fabric
                .add_rule(softnic::FaultRule::link_report(port, false, from, None));
        };
        let after_up = switch_back_after_outage(&mut sim, &mut t, port, outage, stale, &what);
        let trust = config().link_down_trust;
        assert!(
            after_up <= trust - outage + Duration::from_millis(200),
            "{what}: switched back {after_up:?} after the link came back"
        );
        assert_one_failover_and_switch_back_each(&sim, &what);
    }
}

#[test]
fn retry_exhaustion_without_a_link_event_fails_over_too() {
    let mut sim = Sim::new(4, config());
    let mut t = nccl(&sim, 60);
    let mut cut = false;
    let done = sim.run_until(Duration::from_secs(5), |s| {
        if !cut && t.dirs[0].completed >= 10 {
            // A switch port between the default NICs: packets vanish, no link goes down.
            let now = s.now();
            for rule in softnic::FaultRule::partition(A_DEFAULT, B_DEFAULT, now, None) {
                s.fabric.add_rule(rule);
            }
            cut = true;
        }
        step(&mut t, s)
    });
    assert!(done, "stalled at {} of 60", t.dirs[0].completed);
    assert_clean(&mut t, &mut sim);
    let event = &sim.a.qp.events()[0];
    assert_eq!(
        (event.kind, event.cause),
        (EventKind::Failover, Cause::RetryExceeded)
    );
    assert_eq!(sim.b.qp.events()[0].cause, Cause::PeerFailover);
}

#[test]
fn the_receivers_link_going_down_fails_both_ends_over() {
    let mut sim = Sim::new(5, config());
    let mut t = nccl(&sim, 60);
    let mut down = false;
    let done = sim.run_until(Duration::from_secs(5), |s| {
        if !down && t.dirs[0].notified >= 10 {
            s.link_down(B_DEFAULT, None);
            down = true;
        }
        step(&mut t, s)
    });
    assert!(done, "stalled at {} of 60", t.dirs[0].completed);
    assert_clean(&mut t, &mut sim);
    assert_eq!(sim.b.qp.events()[0].cause, Cause::LinkDown);
    assert_eq!(sim.a.qp.stats().failovers, 1);
}

/// Runs until `n` completions came out of host `a`'s QP; returns them.
fn completions(sim: &mut Sim, a: bool, n: usize, limit: Duration) -> Vec<pmd::WorkCompletion> {
    let mut got = Vec::new();
    sim.run_until(limit, |s| {
        s.poll(a);
        got.append(&mut s.host(a).wcs);
        got.len() >= n
    });
    got
}

#[test]
fn an_atomic_in_flight_is_refused_and_surfaced_instead_of_retransmitted() {
    let mut sim = Sim::new(6, config());
    sim.b.buf.write_u64(64, 5);
    let target = sim.b.buf.remote(64);
    let write = SendWr::new(
        1,
        SendOp::Write {
            remote: sim.b.buf.remote(0),
        },
        &[sim.a.buf.sge(0, 64)],
    );
    let add = SendWr::new(
        2,
        SendOp::FetchAdd {
            remote: target,
            add: 1,
        },
        &[sim.a.buf.sge(128, 8)],
    )
    .signaled();
    sim.a.qp.post_send(&write).unwrap();
    sim.a.qp.post_send(&add).unwrap();
    sim.a.qp.ring_doorbell();
    // The link dies before the device has even sent the atomic: it is rung, so it might
    // have executed for all the failover layer can know.
    sim.link_down(A_DEFAULT, None);
    // As on a plain RC QP in ERR: every outstanding WR completes, the first with the error.
    let wcs = completions(&mut sim, true, 2, Duration::from_secs(2));
    let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        got,
        vec![(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(sim.a.qp.state(), ResilientState::Failed);
    let event = sim.a.qp.events().last().unwrap().clone();
    assert_eq!(
        (event.kind, event.cause),
        (EventKind::Refused, Cause::AtomicInFlight)
    );
    assert_eq!(sim.a.qp.stats().failovers, 0);
    // Later posts are refused, as on a QP in ERR.
    assert!(sim
        .a
        .qp
        .post_send(&SendWr::new(3, SendOp::Send, &[]))
        .is_err());
    // The peer was told and failed its end too.
    sim.run_for(Duration::from_millis(50));
    assert_eq!(sim.b.qp.state(), ResilientState::Failed);
}

#[test]
fn a_remote_access_error_goes_to_the_application_and_is_never_failed_over() {
    let mut sim = Sim::new(7, config());
    let mut bad = sim.b.buf.remote(0);
    bad.rkey ^= 0x5a5a;
    let ok = SendWr::new(
        1,
        SendOp::Write {
            remote: sim.b.buf.remote(0),
        },
        &[sim.a.buf.sge(0, 64)],
    )
    .signaled();
    let refused = SendWr::new(2, SendOp::Write { remote: bad }, &[sim.a.buf.sge(0, 64)]).signaled();
    let after = SendWr::new(
        3,
        SendOp::Write {
            remote: sim.b.buf.remote(64),
        },
        &[sim.a.buf.sge(0, 64)],
    )
    .signaled();
    for wr in [&ok, &refused, &after] {
        sim.a.qp.post_send(wr).unwrap();
    }
    sim.a.qp.ring_doorbell();
    let wcs = completions(&mut sim, true, 3, Duration::from_secs(2));
    let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        got,
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::RemAccessErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    let stats = sim.a.qp.stats();
    assert_eq!((stats.failovers, stats.refusals), (0, 1));
    let event = sim.a.qp.events().last().unwrap();
    assert_eq!(
        (event.kind, event.cause),
        (EventKind::Refused, Cause::Refused(WcStatus::RemAccessErr))
    );
    assert_eq!(event.cause.as_str(), "remote-access-error");
}

#[test]
fn with_both_paths_down_every_posted_work_request_fails_after_the_outage_tolerance() {
    let mut sim = Sim::new(8, config());
    let mut t = nccl(&sim, 1000);
    let mut down_at = None;
    let mut errors = 0;
    sim.run_until(Duration::from_secs(10), |s| {
        if down_at.is_none() && t.dirs[0].completed >= 10 {
            s.link_down(A_DEFAULT, None);
            s.link_down(A_BACKUP, None);
            down_at = Some(s.now());
        }
        if s.a.qp.state() == ResilientState::Failed {
            s.poll(true);
            errors += s.a.wcs.iter().filter(|w| !w.is_ok()).count();
            s.a.wcs.clear();
            return t.dirs[0].posted > 0;
        }
        step(&mut t, s);
        false
    });
    let down_at = down_at.expect("the links went down");
    assert_eq!(sim.a.qp.state(), ResilientState::Failed);
    let event = sim.a.qp.events().last().unwrap();
    assert_eq!(
        (event.kind, event.cause),
        (EventKind::Error, Cause::OutageTolerance)
    );
    // Work is held (not failed at the link-down, nor after a plain RC QP's retries) for the
    // outage tolerance, and fails promptly after it.
    let tolerance = config().outage_tolerance;
    let failed_at = Duration::from_secs_f64(event.unix_ms / 1e3);
    let took = failed_at - down_at;
    assert!(
        took >= tolerance && took < tolerance + Duration::from_millis(5),
        "failed {took:?} after both links went down; the tolerance is {tolerance:?}"
    );
    // Every iteration outstanding when it failed completed in error, three WRs each: seen
    // here after the failure, or by the traffic's own poll that ran the failing timer (it
    // counts one per iteration).
    let d = &t.dirs[0];
    assert!(
        errors % 3 == 0 && errors + d.send_errors as usize > 0,
        "{errors} {d:?}"
    );
    assert_eq!(
        d.posted,
        d.completed + d.send_errors + errors as u64 / 3,
        "{d:?}"
    );
}

#[test]
fn sends_both_ways_land_in_their_own_receives_across_a_failover() {
    let fast = sends_both_ways_across_a_failover(9, |qp, wr, _| {
        qp.post_send(wr).unwrap();
        false
    });
    assert_eq!(fast, 0);
}

/// The verbs shim posts a one-entry SEND by its parts (`post_send_fast_parts`), without a
/// `SendWr`: what it writes must be recorded for a failover exactly as `post_send` records
/// it (the WQE in the default QP's ring, the two-sided send counted), or the failover skips
/// or repeats the sends the peer had already received when the link went.
#[test]
fn sends_posted_by_their_parts_are_moved_by_a_failover_like_whole_posts() {
    let fast = sends_both_ways_across_a_failover(9, |qp, wr, sge| {
        let parts = RequestParts {
            wr_id: wr.wr_id,
            flags: wr.flags,
        };
        if qp.post_send_fast_parts(&parts, wr.op, sge).is_some() {
            return true;
        }
        // Declined (the route is not the default): the whole request, as the shim does.
        qp.post_send(wr).unwrap();
        false
    });
    // Both sides' sends before the failover, and the peer's after it, went the fast way.
    assert!(fast >= 40, "only {fast} sends took the fast path");
}

/// 100 SENDs each way, at most 8 outstanding per side, each posted by `post` (which says
/// whether its fast path took it); A's default link goes down after 20 of A's completed.
/// Every send lands once, in order, in the receive of its number, with its data. Returns how
/// many sends `post` put through its fast path.
fn sends_both_ways_across_a_failover(
    seed: u64,
    mut post: impl FnMut(&mut ResilientQp, &SendWr<'_>, &Sge) -> bool,
) -> u64 {
    let mut sim = Sim::new(seed, config());
    const N: u64 = 100;
    for h in [&mut sim.a, &mut sim.b] {
        for i in 0..N {
            let sge = h.buf.sge(4096 + i as usize * 16, 16);
            h.qp.post_recv(&RecvWr::new(i, &[sge])).unwrap();
        }
    }
    let mut sent = [0u64; 2];
    let mut done = [0u64; 2];
    let mut got = [0u64; 2];
    let mut fast = 0u64;
    let mut errors = Vec::new();
    let mut down = false;
    sim.run_until(Duration::from_secs(5), |s| {
        for (side, a) in [(0usize, true), (1usize, false)] {
            let h = s.host(a);
            while sent[side] < N && sent[side] < done[side] + 8 {
                let i = sent[side];
                h.buf
                    .write(i as usize * 16, &(i * 1000 + side as u64).to_le_bytes());
                let sge = h.buf.sge(i as usize * 16, 8);
                let wr = SendWr::new(i, SendOp::Send, &[sge]).signaled();
                fast += u64::from(post(&mut h.qp, &wr, &sge));
                sent[side] += 1;
            }
            h.qp.ring_doorbell();
        }
        if !down && done[0] >= 20 {
            s.link_down(A_DEFAULT, None);
            down = true;
        }
        for (side, a) in [(0usize, true), (1usize, false)] {
            s.poll(a);
            let wcs: Vec<_> = s.host(a).wcs.drain(..).collect();
            for wc in wcs {
                if !wc.is_ok() {
                    errors.push(format!("{side}: {wc:?}"));
                } else if wc.opcode == WcOpcode::Recv {
                    // Receive `wr_id` must hold the peer's send number `wr_id`.
                    let mut b = [0u8; 8];
                    s.host(a).buf.read(4096 + wc.wr_id as usize * 16, &mut b);
                    let want = wc.wr_id * 1000 + (1 - side) as u64;
                    if u64::from_le_bytes(b) != want || wc.wr_id != got[side] {
                        errors.push(format!(
                            "{side}: receive {} holds {}",
                            wc.wr_id,
                            u64::from_le_bytes(b)
                        ));
                    }
                    got[side] += 1;
                } else {
                    done[side] += 1;
                }
            }
        }
        !errors.is_empty() || (done == [N, N] && got == [N, N])
    });
    assert!(errors.is_empty(), "{errors:#?}");
    assert_eq!((done, got), ([N, N], [N, N]));
    assert_eq!(sim.a.qp.stats().failovers, 1);
    fast
}

#[test]
fn a_poll_array_longer_than_a_batch_takes_a_whole_failovers_flushes_in_one_call() {
    // More outstanding WRs than the driver's internal batch (32): the retry-exhaustion error
    // and all the flushes behind it arrive in one application poll of 128 slots, the QPs'
    // failover work running only in the application's polls.
    let mut sim = Sim::new(11, config());
    sim.qp_progress = false;
    sim.poll_slots = 128;
    const N: u64 = 48;
    for i in 0..N {
        let wr = SendWr::new(
            i,
            SendOp::Write {
                remote: sim.b.buf.remote(64 * i as usize),
            },
            &[sim.a.buf.sge(64 * i as usize, 64)],
        )
        .signaled();
        sim.a.qp.post_send(&wr).unwrap();
    }
    // A switch port between the default NICs: nothing arrives, no link goes down, so the
    // first error is the device's retry exhaustion, then one flush per WR behind it.
    let now = sim.now();
    for rule in softnic::FaultRule::partition(A_DEFAULT, B_DEFAULT, now, None) {
        sim.fabric.add_rule(rule);
    }
    sim.a.qp.ring_doorbell();
    let mut got = Vec::new();
    sim.run_until(Duration::from_secs(2), |s| {
        s.poll(true);
        s.poll(false);
        got.append(&mut s.a.wcs);
        got.len() as u64 >= N
    });
    let ids: Vec<_> = got.iter().map(|w| (w.wr_id, w.status)).collect();
    let want: Vec<_> = (0..N).map(|i| (i, WcStatus::Success)).collect();
    assert_eq!(ids, want);
    assert_eq!(sim.a.qp.stats().failovers, 1);
    assert_eq!(sim.a.qp.events()[0].cause, Cause::RetryExceeded);
}

#[test]
fn the_backup_dying_during_a_switch_back_moves_the_traffic_back_to_the_default() {
    let (mut sim, mut t) = Scenario::new(12).both_ways(1_000);
    let mut phase = 0;
    let mut partitioned = None;
    let done = sim.run_until(Duration::from_secs(10), |s| {
        if phase == 0 && t.dirs[0].completed >= 10 {
            // A's default link flaps: both fail over, then rearm once the hold-down passed.
            s.link_down(A_DEFAULT, Some(Duration::from_millis(5)));
            phase = 1;
        }
        if phase == 1
            && matches!(
                s.a.qp.state(),
                ResilientState::WaitSignaled | ResilientState::WaitDrained
            )
        {
            // The switch-back under way: the backup path vanishes under it (no link event,
            // the backup QPs exhaust their retries): the traffic goes back to the default path.
            let now = s.now();
            for rule in softnic::FaultRule::partition(A_BACKUP, B_BACKUP, now, None) {
                s.fabric.add_rule(rule);
            }
            partitioned = Some((now, t.dirs[0].completed, t.dirs[1].completed));
            phase = 2;
        }
        step(&mut t, s) && phase == 2
    });
    assert_ran(done, phase, &t, &sim);
    assert_clean(&mut t, &mut sim);
    // The traffic was running when the backup failed, and went on.
    let (_, done_a, done_b) = partitioned.expect("partitioned");
    assert!(done_a < 1_000 && done_b < 1_000, "{done_a} {done_b}");
    assert_both_hosts(&sim, |s| (s.failbacks, s.errors), (1, 0));
    assert_eq!(sim.a.qp.state(), ResilientState::Default);
}

#[test]
fn the_backup_device_failing_its_qps_during_the_holddown_moves_the_traffic_back() {
    let (mut sim, mut t) = Scenario::new(41).both_ways(1_000);
    let mut phase = 0;
    let done = sim.run_until(Duration::from_secs(10), |s| {
        if phase == 0 && t.dirs[0].completed >= 10 {
            // B's default link goes down for 20 ms: traffic fails over to the backup, and
            // stays there through the 50 ms hold-down after the link is back.
            s.link_down(B_DEFAULT, Some(Duration::from_millis(20)));
            phase = 1;
        }
        if phase == 1
            && s.a.qp.state() == ResilientState::Fallback
            && s.b.qp.state() == ResilientState::Fallback
            && t.dirs[1].completed >= 20
        {
            phase = 2;
        }
        if phase == 2 && !t.finished() {
            // Host A's backup device fails every QP (the data QP and the control QP) while
            // the traffic is on it, its link up.
            s.a.devices[1].inject_fault(DeviceFault::QpsFailed).unwrap();
            phase = 3;
        }
        step(&mut t, s) && phase == 3
    });
    assert_ran(done, phase, &t, &sim);
    assert_clean(&mut t, &mut sim);
    for h in [&sim.a, &sim.b] {
        let stats = h.qp.stats();
        assert_eq!(
            (stats.failovers, stats.failbacks, stats.errors),
            (1, 1, 0),
            "{stats:?} {:?}",
            h.qp.events()
        );
        // The event log has the failback after the failover (`failover.events[]`).
        let kinds: Vec<_> = h.qp.events().iter().map(|e| (e.kind, e.cause)).collect();
        assert_eq!(
            kinds.last(),
            Some(&(EventKind::Failback, Cause::BackupFailed)),
            "{kinds:?}"
        );
        let failback = h.qp.events().last().unwrap();
        assert!(
            failback.detected_unix_ms <= failback.unix_ms,
            "{failback:?}"
        );
    }
    // The backup side is repaired afterwards (5d): protected again.
    assert!(
        sim.run_until(Duration::from_secs(2), |s| {
            s.a.qp.stats().backup_rearms == 1 && s.b.qp.stats().backup_rearms == 1
        }),
        "no repair: {:?} {:?}",
        sim.a.qp.stats(),
        sim.b.qp.stats()
    );
}

#[test]
fn with_the_default_link_down_too_a_failback_fails_after_the_outage_tolerance() {
    let mut sim = Sim::new(12, config());
    let mut t = nccl(&sim, 200);
    let mut phase = 0;
    let mut failed_at = None;
    sim.run_until(Duration::from_secs(5), |s| {
        if phase == 0 && t.dirs[0].completed >= 10 {
            s.link_down(A_DEFAULT, None);
            phase = 1;
        }
        if phase == 1 && s.a.qp.state() == ResilientState::Fallback && t.dirs[0].completed >= 20 {
            s.a.devices[1].inject_fault(DeviceFault::QpsFailed).unwrap();
            failed_at = Some(s.now());
            phase = 2;
        }
        step(&mut t, s);
        phase == 2 && s.a.qp.state() == ResilientState::Failed
    });
    assert_eq!(
        sim.a.qp.state(),
        ResilientState::Failed,
        "{:?}",
        sim.a.qp.events()
    );
    let stats = sim.a.qp.stats();
    assert_eq!((stats.failbacks, stats.errors), (0, 1), "{stats:?}");
    // Not at the backup QPs' failure: after the outage tolerance (300 ms at these timers),
    // holding the work for the default link, and promptly then.
    let waited = sim.now() - failed_at.expect("the backup device failed");
    let tolerance = config().outage_tolerance;
    assert!(
        waited >= tolerance && waited < tolerance + Duration::from_millis(25),
        "{waited:?}"
    );
}

#[test]
fn with_the_link_watch_off_a_dead_link_is_found_by_retry_exhaustion() {
    let mut config = config();
    config.link_watch = false;
    let mut sim = Sim::new(13, config);
    let mut t = nccl(&sim, 60);
    let mut down = false;
    let done = sim.run_until(Duration::from_secs(5), |s| {
        if !down && t.dirs[0].completed >= 10 {
            s.link_down(A_DEFAULT, None);
            down = true;
        }
        step(&mut t, s)
    });
    assert!(done, "stalled at {} of 60", t.dirs[0].completed);
    assert_clean(&mut t, &mut sim);
    // The same schedule with the watch on fails over on the link event itself
    // (`link_down_of_the_default_nic_moves_traffic_to_the_backup_in_order`).
    let event = &sim.a.qp.events()[0];
    assert_eq!(
        (event.kind, event.cause),
        (EventKind::Failover, Cause::RetryExceeded)
    );
}

#[test]
fn a_connection_fails_over_again_after_switching_back_with_both_ends_sending_inline() {
    // As `shift_write_bw --check`: A writes and notifies, B keeps its whole receive ring
    // posted and answers every notification with an 8-byte INLINE WRITE (a credit), so both
    // ends post sends. A's default link fails, comes back (switch-back), and fails again: the
    // second round moves B's receives to a backup RQ that still holds the stale receives the
    // switch-back left there, and A burns them before anything else on its backup SQ.
    let mut sim = Sim::new(15, config());
    let mut dir = Dir::new(true, 600);
    dir.recv_window = u64::from(caps().max_recv_wr);
    dir.window = 16;
    dir.interval = Duration::from_micros(500);
    dir.credits = true;
    let mut t = Traffic::new(vec![dir], sim.now());
    let mut downs = 0;
    let done = sim.run_until(Duration::from_secs(20), |s| {
        let switched_back = |s: &Sim, n: u64| {
            [&s.a, &s.b]
                .iter()
                .all(|h| h.qp.stats().switch_backs >= n && h.qp.state() == ResilientState::Default)
        };
        if downs < 2 && t.dirs[0].completed >= 20 + 100 * downs && switched_back(s, downs) {
            s.link_down(A_DEFAULT, Some(Duration::from_millis(20)));
            downs += 1;
        }
        let over = step(&mut t, s);
        !t.violations.is_empty() || (over && downs == 2 && switched_back(s, 2))
    });
    assert!(
        done,
        "stalled: {:?}, states {:?} {:?}, events {:#?} {:#?}",
        t.dirs[0],
        sim.a.qp.state(),
        sim.b.qp.state(),
        sim.a.qp.events(),
        sim.b.qp.events()
    );
    assert_clean(&mut t, &mut sim);
    assert_both_hosts(&sim, |s| (s.failovers, s.switch_backs), (2, 2));
    assert_both_hosts(&sim, |s| (s.refusals, s.errors), (0, 0));
}

#[test]
fn repeated_failovers_of_every_kind_flush_no_phantom_receives_into_the_default_cq() {
    // The testbed's soak as a story: `shift_write_bw --check` traffic (B keeps its whole
    // receive ring posted and returns an INLINE credit per notification), and round after
    // round the responder's default link, the initiator's default link, or the switch between
    // the default NICs (no link event: retry exhaustion, and rearm attempts whose probes fail
    // while it lasts) fails and recovers. The switch fails after a long stretch on the default
    // path: B's default RQ has taken hundreds of receives since its last reset, and the
    // failed rearm attempts move B's freshly reset default QP to ERR before any receive is
    // posted there. Every round must fail over and switch back, and B's default CQ must see
    // only CQEs of WQEs that were posted: a doorbell record left at the last incarnation's
    // counter makes the device flush that many phantom receives into it (in the soak, more
    // than the CQ holds: an overrun).
    enum Fault {
        LinkDown(usize),
        Switch,
    }
    let schedule = [
        (20, Fault::LinkDown(B_DEFAULT)),
        (120, Fault::LinkDown(A_DEFAULT)),
        (800, Fault::Switch),
        (900, Fault::LinkDown(B_DEFAULT)),
    ];
    let rounds = schedule.len() as u64;
    let mut sim = Sim::new(16, config());
    let mut dir = Dir::new(true, 1000);
    dir.recv_window = u64::from(caps().max_recv_wr);
    dir.window = 16;
    dir.interval = Duration::from_micros(500);
    dir.credits = true;
    let mut t = Traffic::new(vec![dir], sim.now());
    let mut downs = 0;
    let done = sim.run_until(Duration::from_secs(30), |s| {
        let switched_back = |s: &Sim, n: u64| {
            [&s.a, &s.b]
                .iter()
                .all(|h| h.qp.stats().switch_backs >= n && h.qp.state() == ResilientState::Default)
        };
        if let Some((at, fault)) = schedule.get(downs as usize) {
            if t.dirs[0].completed >= *at && switched_back(s, downs) {
                match fault {
                    Fault::LinkDown(port) => s.link_down(*port, Some(Duration::from_millis(20))),
                    Fault::Switch => {
                        let now = s.now();
                        let end = Some(now + Duration::from_millis(80));
                        for rule in softnic::FaultRule::partition(A_DEFAULT, B_DEFAULT, now, end) {
                            s.fabric.add_rule(rule);
                        }
                    }
                }
                downs += 1;
            }
        }
        let over = step(&mut t, s);
        !t.violations.is_empty() || (over && downs == rounds && switched_back(s, rounds))
    });
    assert!(
        done,
        "stalled after {downs} faults: {:?}, states {:?} {:?}, events {:#?} {:#?}",
        t.dirs[0],
        sim.a.qp.state(),
        sim.b.qp.state(),
        sim.a.qp.events(),
        sim.b.qp.events()
    );
    assert_clean(&mut t, &mut sim);
    // Every CQE of B's default CQ named a WQE that was posted: no phantom receives after a
    // reset were flushed into it (they come out stale, or cleaned when a reset follows).
    let polled = sim.b.qp.bypass().1.poller().stats();
    assert_eq!((polled.stale, polled.cleaned), (0, 0), "{polled:?}");
    assert_both_hosts(&sim, |s| (s.failovers, s.switch_backs), (rounds, rounds));
    assert_both_hosts(&sim, |s| (s.refusals, s.errors), (0, 0));
}

#[test]
fn a_batch_goes_to_the_default_path_then_after_a_failover_to_the_backup() {
    let mut sim = Sim::new(11, config());
    let batch = |sim: &Sim, first: u64| -> Vec<SendWr<'static>> {
        (0..8u64)
            .map(|i| {
                let id = first + i;
                let wr = SendWr::new(
                    id,
                    SendOp::Write {
                        remote: sim.b.buf.remote((id % 64) as usize * 8),
                    },
                    &[sim.a.buf.sge(0, 8)],
                );
                if i == 7 {
                    wr.signaled()
                } else {
                    wr
                }
            })
            .collect()
    };
    // On the default path: the default QP's burst path takes the whole batch.
    let wrs = batch(&sim, 0);
    sim.a.qp.post_send_batch(&wrs).unwrap();
    sim.a.qp.ring_doorbell();
    let wcs = completions(&mut sim, true, 1, Duration::from_secs(2));
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(7, WcStatus::Success)]
    );
    // After a failover the default QP's fast path is held: the same call routes each work
    // request to the backup QP.
    sim.link_down(A_DEFAULT, None);
    assert!(sim.run_until(Duration::from_secs(5), |s| {
        s.poll(true);
        s.a.qp.state() == ResilientState::Fallback
    }));
    let wrs = batch(&sim, 100);
    sim.a.qp.post_send_batch(&wrs).unwrap();
    sim.a.qp.ring_doorbell();
    let wcs = completions(&mut sim, true, 1, Duration::from_secs(2));
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(107, WcStatus::Success)]
    );
    assert_eq!(sim.a.qp.stats().failovers, 1);
}

/// A pair (seed `seed`) whose host A failed over with nothing outstanding, posted a signaled
/// SEND (wr_id 1) that stalls on the backup QP because B has no receive posted, and, its
/// default path back, posted its switch-back fence behind the SEND: A waits in WaitDrained.
fn fence_behind_a_stalled_send(seed: u64) -> Sim {
    let mut sim = Sim::new(seed, config());
    sim.link_down(A_DEFAULT, Some(Duration::from_millis(5)));
    assert!(sim.run_until(Duration::from_secs(1), |s| {
        s.a.qp.state() == ResilientState::Fallback
    }));
    let send = SendWr::new(1, SendOp::Send, &[sim.a.buf.sge(0, 8)]).signaled();
    sim.a.qp.post_send(&send).unwrap();
    sim.a.qp.ring_doorbell();
    assert!(
        sim.run_until(Duration::from_secs(2), |s| {
            s.a.qp.state() == ResilientState::WaitDrained
        }),
        "A never posted its fence: {:?}",
        sim.a.qp.state()
    );
    sim
}

/// A's backup SQ holds, in order: a SEND that B has no receive for (RNR,
/// retried every 640 us), the switch-back fence behind it, and, after the default path failed
/// again during WaitDrained, the withheld signaled WRITE copied behind the fence. When B posts
/// its receive, one retry runs all three and one ACK retires them: A polls the fence and the
/// WRITE in one batch. The fence is the failover's own: it never reaches the application, and
/// it is cleared, so the next recovery can post a fence and switch back.
#[test]
fn a_fence_retired_in_one_batch_with_a_later_signaled_wqe_is_swallowed_and_cleared() {
    let mut sim = fence_behind_a_stalled_send(21);
    // A signaled WRITE, withheld on the default QP; then the default path fails again.
    let write = SendWr::new(
        3,
        SendOp::Write {
            remote: sim.b.buf.remote(0),
        },
        &[sim.a.buf.sge(64, 64)],
    )
    .signaled();
    sim.a.qp.post_send(&write).unwrap();
    sim.a.qp.ring_doorbell();
    sim.link_down(A_DEFAULT, None);
    assert!(
        sim.run_until(Duration::from_secs(1), |s| s.a.qp.stats().failovers == 2),
        "no second failover: {:?}",
        sim.a.qp.events()
    );
    assert!(sim.a.qp.poll(&mut [pmd::WorkCompletion::EMPTY; 4]) == 0);
    // Now B's receive: the SEND, the fence and the WRITE go in one retry.
    let recv = RecvWr::new(7, &[sim.b.buf.sge(512, 64)]);
    sim.b.qp.post_recv(&recv).unwrap();
    let wcs = completions(&mut sim, true, 2, Duration::from_secs(1));
    let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(got, vec![(1, WcStatus::Success), (3, WcStatus::Success)]);
    sim.run_for(Duration::from_millis(20));
    sim.poll(true);
    assert_eq!(sim.a.wcs, vec![], "nothing more, the fence least of all");
    // The default path comes back: A posts a new fence and switches back.
    sim.fabric.clear_rules();
    assert!(
        sim.run_until(Duration::from_secs(3), |s| {
            s.a.qp.state() == ResilientState::Default
        }),
        "A never switched back: {:?} {:?}",
        sim.a.qp.state(),
        sim.a.qp.events()
    );
}

/// A READ whose response was lost, followed by a WRITE to the same bytes and
/// a SEND that the peer executed, must not be executed again on the backup: it would read
/// what the later WRITE wrote and report it as a `Success`. The connection fails instead, the
/// READ's completion first, as when an atomic is in flight.
#[test]
fn a_read_overtaken_by_a_later_executed_write_is_never_returned_as_success() {
    let mut sim = Sim::new(31, config());
    sim.b.buf.write(0, &[0xaa; 64]);
    sim.a.buf.write(1024, &[0xbb; 64]);
    let recv = RecvWr::new(9, &[sim.b.buf.sge(512, 64)]);
    sim.b.qp.post_recv(&recv).unwrap();
    // From now on nothing B's default NIC sends reaches A: READ responses and ACKs are lost.
    sim.fabric.add_rule(softnic::FaultRule {
        fault: softnic::Fault::Partition,
        from: Some(B_DEFAULT),
        to: Some(A_DEFAULT),
        start: sim.now(),
        end: None,
    });
    let remote = sim.b.buf.remote(0);
    let read = SendWr::new(1, SendOp::Read { remote }, &[sim.a.buf.sge(0, 64)]).signaled();
    let write = SendWr::new(2, SendOp::Write { remote }, &[sim.a.buf.sge(1024, 64)]);
    let send = SendWr::new(3, SendOp::Send, &[sim.a.buf.sge(2048, 8)]).signaled();
    for wr in [&read, &write, &send] {
        sim.a.qp.post_send(wr).unwrap();
    }
    sim.a.qp.ring_doorbell();
    // B executes all three: the READ (its response is lost), the WRITE, the SEND.
    assert!(
        sim.run_until(Duration::from_millis(20), |s| {
            s.poll(false);
            s.b.wcs.iter().any(|w| w.wr_id == 9)
        }),
        "B never received the SEND"
    );
    let mut x = [0u8; 64];
    sim.b.buf.read(0, &mut x);
    assert_eq!(x, [0xbb; 64], "the WRITE executed at B");
    sim.link_down(A_DEFAULT, None);
    let mut wcs = Vec::new();
    sim.run_until(Duration::from_secs(2), |s| {
        s.poll(true);
        wcs.append(&mut s.a.wcs);
        s.a.qp.state() == ResilientState::Failed && wcs.len() >= 3
    });
    let read_wc = wcs
        .iter()
        .find(|w| w.wr_id == 1)
        .unwrap_or_else(|| panic!("no completion for the READ: {wcs:?}"));
    let mut got = [0u8; 64];
    sim.a.buf.read(0, &mut got);
    assert!(
        read_wc.status != WcStatus::Success,
        "the READ completed with Success after the later WRITE executed (it read {:#x}s): {wcs:?}",
        got[0]
    );
    // As a plain RC QP in ERR: every WR completes, the READ first, with the error.
    let statuses: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        statuses,
        vec![
            (1, WcStatus::RetryExcErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    let event = sim.a.qp.events().last().unwrap().clone();
    assert_eq!(
        (event.kind, event.cause),
        (EventKind::Refused, Cause::ReadOvertaken)
    );
    assert_eq!(event.cause.as_str(), "read-overtaken");
    sim.run_for(Duration::from_millis(50));
    assert_eq!(sim.b.qp.state(), ResilientState::Failed, "B was told");
}

/// The default device of the sender dies without flushing anything (its
/// device-fatal event is all the driver learns; its link stays up). The round must not wait
/// for flushes that never come: traffic goes on on the backup, checked byte by byte.
#[test]
fn a_default_device_that_dies_without_flushing_fails_over_on_its_fatal_event() {
    let mut sim = Sim::new(32, config());
    let mut t = nccl(&sim, 60);
    let mut killed = false;
    let done = sim.run_until(Duration::from_secs(5), |s| {
        if !killed && t.dirs[0].completed >= 10 {
            s.a.devices[0].inject_fault(DeviceFault::Dead).unwrap();
            killed = true;
        }
        step(&mut t, s)
    });
    assert!(
        done,
        "traffic stalled: {} of 60 completed, {} notified; A {:?} {:?}",
        t.dirs[0].completed,
        t.dirs[0].notified,
        sim.a.qp.state(),
        sim.a.qp.events()
    );
    assert_clean(&mut t, &mut sim);
    assert_eq!(sim.a.qp.state(), ResilientState::Fallback);
    let event = &sim.a.qp.events()[0];
    assert_eq!(
        (event.kind, event.cause),
        (EventKind::Failover, Cause::DeviceFatal)
    );
    assert_eq!(event.cause.as_str(), "device-fatal");
    assert_eq!(sim.b.qp.stats().failovers, 1);
}

/// The receiver's default device dies silently and its fatal event is lost
/// (read by someone else): nothing tells its driver. The sender's retries run out, its
/// `Failover` starts the receiver's round, and the receiver's drain gives up waiting for
/// flushes after `drain_timeout`: the receives and WQEs without a completion are unknown,
/// and the peer's counters decide.
#[test]
fn a_receiver_whose_device_died_unannounced_drains_until_the_deadline_and_fails_over() {
    let mut sim = Sim::new(33, config());
    let mut t = nccl(&sim, 60);
    let mut killed = false;
    let done = sim.run_until(Duration::from_secs(5), |s| {
        if !killed && t.dirs[0].completed >= 10 {
            s.b.devices[0].inject_fault(DeviceFault::Dead).unwrap();
            // The event goes nowhere: the service never hears of it.
            assert_eq!(
                s.b.devices[0].poll_port_event(),
                Some(pmd::provider::PortEvent::DeviceFatal)
            );
            killed = true;
        }
        step(&mut t, s)
    });
    assert!(
        done,
        "traffic stalled: {} of 60 completed, {} notified; B {:?} {:?}",
        t.dirs[0].completed,
        t.dirs[0].notified,
        sim.b.qp.state(),
        sim.b.qp.events()
    );
    assert_clean(&mut t, &mut sim);
    assert_both_hosts(&sim, |s| s.failovers, 1);
    assert_eq!(sim.b.qp.events()[0].cause, Cause::PeerFailover);
}

/// The switch-back fence flushed when the backup path fails under it (the connection fails)
/// is still the failover's own: the application never gets a completion of it (found by the
/// seeded simulation, seed 3676 of 10,000: a flush with the internal wr_id reached it).
#[test]
fn a_fence_flushed_by_a_failing_backup_never_reaches_the_application() {
    let mut sim = fence_behind_a_stalled_send(34);
    // Both paths die under the fence (the default alone back would take the traffic, 5e):
    // the connection fails.
    sim.link_down(A_DEFAULT, None);
    sim.link_down(A_BACKUP, None);
    let mut wcs = Vec::new();
    sim.run_until(Duration::from_secs(2), |s| {
        s.poll(true);
        wcs.append(&mut s.a.wcs);
        s.a.qp.state() == ResilientState::Failed && !wcs.is_empty()
    });
    sim.run_for(Duration::from_millis(20));
    sim.poll(true);
    wcs.append(&mut sim.a.wcs);
    assert_eq!(sim.a.qp.state(), ResilientState::Failed);
    let got: Vec<_> = wcs.iter().map(|w| w.wr_id).collect();
    assert_eq!(got, vec![1], "only the application's SEND: {wcs:?}");
}

#[test]
fn a_backup_side_whose_qps_failed_while_idle_is_repaired_and_the_next_failover_works() {
    let mut sim = Sim::new(31, config());
    let mut t = nccl(&sim, 300);
    let mut phase = 0;
    let done = sim.run_until(Duration::from_secs(20), |s| {
        if phase == 0 && t.dirs[0].completed >= 10 {
            // Host A's backup device fails its QPs (the backup data QP and the control QP)
            // while everything runs on the default path; its link stays up.
            s.a.devices[1].inject_fault(DeviceFault::QpsFailed).unwrap();
            phase = 1;
        }
        if phase == 1 && s.a.qp.stats().backup_rearms == 1 && s.b.qp.stats().backup_rearms == 1 {
            s.link_down(A_DEFAULT, None);
            phase = 2;
        }
        // Traffic done, and the failover after the repair completed at both ends.
        step(&mut t, s)
            && phase == 2
            && s.a.qp.state() == ResilientState::Fallback
            && s.b.qp.state() == ResilientState::Fallback
    });
    assert_ran(done, phase, &t, &sim);
    assert_clean(&mut t, &mut sim);
    assert_eq!(sim.a.qp.state(), ResilientState::Fallback);
    assert_both_hosts(&sim, |s| (s.backup_rearms, s.failovers), (1, 1));
    assert_both_hosts(&sim, |s| s.errors, 0);
}

/// Traffic on the backup since B's default link went down; then both backup links go down,
/// A's for 7 ms, B's for 12.7 ms, within the 16.8 ms budget. A's backup QP exhausts its
/// retries anyway (its last retry, at 12.6 ms, fell inside B's outage: RC tolerates outages
/// shorter than `retry_cnt` timeouts, not the whole budget) and A fails back; B's round was
/// still waiting for A's `Failover` (lost with the backup links) and follows A's
/// `Failback`. The second loss shape of docs/failover.md 5c, scaled to the simulation.
#[test]
fn a_round_waiting_for_the_peers_failover_follows_its_failback() {
    let (mut sim, mut t) = Scenario::new(119)
        .holddown(Duration::from_millis(100))
        .handshake_timeout(Duration::from_secs(2))
        .one_way(1000, Duration::from_micros(100));
    let mut phase = 0;
    let done = sim.run_until(Duration::from_secs(2), |s| {
        if phase == 0 && t.dirs[0].completed >= 10 {
            s.link_down(B_DEFAULT, Some(Duration::from_millis(7)));
            phase = 1;
        }
        if phase == 1 && s.a.qp.state() == ResilientState::Fallback {
            s.link_down(A_BACKUP, Some(Duration::from_millis(7)));
            s.link_down(B_BACKUP, Some(Duration::from_micros(12_700)));
            phase = 2;
        }
        step(&mut t, s) && phase == 2
    });
    assert_ran(done, phase, &t, &sim);
    assert_clean(&mut t, &mut sim);
    assert_both_hosts(&sim, |s| (s.failbacks, s.errors), (1, 0));
    // B's round never completed: the failback took its place.
    assert_eq!(sim.b.qp.stats().failovers, 0);
}

/// Host A's default device fails every QP (the default data QP and the control QP on the
/// default devices) while traffic runs: the traffic fails over, the default pair is re-armed
/// and switched back, and the default devices' channel is repaired over the backup devices'
/// one. It is then needed: host A's backup device fails its QPs and the backup side is
/// repaired over the repaired channel (5d), and a default link failure fails over again.
#[test]
fn a_default_device_failing_its_qps_has_its_control_channel_repaired_and_later_repairs_work() {
    let (mut sim, mut t) = Scenario::new(53).one_way(1_000, Duration::from_micros(500));
    let mut phase = 0;
    let mut failed_at = Duration::ZERO;
    let mut completed_at_link_down = 0;
    let done = sim.run_until(Duration::from_secs(20), |s| {
        if phase == 0 && t.dirs[0].completed >= 10 {
            s.a.devices[0].inject_fault(DeviceFault::QpsFailed).unwrap();
            failed_at = s.now();
            phase = 1;
        }
        if phase == 1
            && s.a.qp.state() == ResilientState::Default
            && s.b.qp.state() == ResilientState::Default
            && s.now() >= failed_at + Duration::from_millis(200)
        {
            // Back on the re-armed default pair for a while: the backup side fails. Its
            // repair needs the default devices' channel (before, never repaired: the backup
            // stayed lost).
            s.a.devices[1].inject_fault(DeviceFault::QpsFailed).unwrap();
            phase = 2;
        }
        if phase == 2 && s.a.qp.stats().backup_rearms == 1 && s.b.qp.stats().backup_rearms == 1 {
            s.link_down(A_DEFAULT, None);
            completed_at_link_down = t.dirs[0].completed;
            phase = 3;
        }
        step(&mut t, s)
            && phase == 3
            && s.a.qp.state() == ResilientState::Fallback
            && s.b.qp.state() == ResilientState::Fallback
    });
    assert_ran(done, phase, &t, &sim);
    assert_clean(&mut t, &mut sim);
    // The traffic was still running at the last failure, and completed through it.
    assert!(completed_at_link_down < 1_000, "{completed_at_link_down}");
    assert_both_hosts(
        &sim,
        |s| {
            (
                s.failovers,
                s.switch_backs,
                s.default_control_repairs,
                s.backup_rearms,
                s.errors,
            )
        },
        (2, 1, 1, 1, 0),
    );
}

/// B's default link goes down and B fails over, but A's `Failover` never reaches B (A's
/// backup path to B drops everything): B's round waits, with its receives copied to the
/// backup RQ. Then B's backup device fails its QPs and B fails back, and while it waits for
/// A's `Failback` its application posts 8 more receives: they go to the default ring,
/// unpublished. The failback must move them with the others; before, it wiped them with the
/// ring (the later notifications landed in the wrong receives).
#[test]
fn receives_posted_during_a_failback_that_replaced_a_waiting_round_are_kept() {
    let (mut sim, mut t) = Scenario::new(119)
        .holddown(Duration::from_millis(100))
        .handshake_timeout(Duration::from_secs(2))
        .one_way(200, Duration::from_micros(100));
    let mut phase = 0;
    let mut down_at = Duration::ZERO;
    let done = sim.run_until(Duration::from_secs(2), |s| {
        if phase == 0 && t.dirs[0].completed >= 10 {
            down_at = s.now();
            s.link_down(B_DEFAULT, Some(Duration::from_millis(7)));
            s.fabric.add_rule(softnic::FaultRule {
                fault: softnic::Fault::Drop(1.0),
                from: Some(A_BACKUP),
                to: Some(B_BACKUP),
                start: down_at,
                end: Some(down_at + Duration::from_millis(50)),
            });
            phase = 1;
        }
        if phase == 1
            && s.b.qp.state() == ResilientState::FailingOver
            && s.now() >= down_at + Duration::from_millis(8)
        {
            s.b.devices[1].inject_fault(DeviceFault::QpsFailed).unwrap();
            phase = 2;
        }
        if phase == 2 && s.b.qp.state() == ResilientState::FailingBack {
            t.dirs[0].recv_window += 8;
            phase = 3;
        }
        step(&mut t, s) && phase == 3
    });
    assert_ran(done, phase, &t, &sim);
    assert_clean(&mut t, &mut sim);
    assert_both_hosts(&sim, |s| (s.failbacks, s.errors), (1, 0));
}

/// B's default link goes down for good and A's backup path to B drops everything: B's round
/// copies its receives to the backup RQ and waits for A's `Failover`, which never comes; the
/// connection fails. Each receive must complete once, in error: before, the copies on the
/// backup RQ and the originals on the default RQ were both flushed.
#[test]
fn a_round_failing_after_copying_its_receives_flushes_each_receive_once() {
    let (mut sim, mut t) = Scenario::new(7).one_way(200, Duration::from_micros(100));
    let mut phase = 0;
    let done = sim.run_until(Duration::from_secs(5), |s| {
        if phase == 0 && t.dirs[0].completed >= 10 {
            let now = s.now();
            s.link_down(B_DEFAULT, None);
            s.fabric.add_rule(softnic::FaultRule {
                fault: softnic::Fault::Drop(1.0),
                from: Some(A_BACKUP),
                to: Some(B_BACKUP),
                start: now,
                end: None,
            });
            phase = 1;
        }
        step(&mut t, s);
        phase == 1
            && s.a.qp.state() == ResilientState::Failed
            && s.b.qp.state() == ResilientState::Failed
    });
    assert!(
        done,
        "stalled: states {:?} {:?}, events {:?} {:?}",
        sim.a.qp.state(),
        sim.b.qp.state(),
        sim.a.qp.events(),
        sim.b.qp.events()
    );
    t.check_markers(&mut sim);
    t.check_exactly_once(&mut sim, Duration::from_secs(1));
    assert!(t.violations.is_empty(), "{:#?}", t.violations);
    // B's receives were copied to the backup RQ before its round failed.
    assert!(t.dirs[0].recvs_posted > t.dirs[0].notified);
}

/// Host A's default device dies while A (the leader) re-arms the default pair after a link
/// flap, its probe possibly outstanding: the probe never completes (a dead device flushes
/// nothing), so the driver must stop waiting for it, or the QP stays busy for good (no fast
/// poll; an adopted QP polled every retry interval).
#[test]
fn a_default_device_dying_during_a_rearm_leaves_nothing_outstanding() {
    let (mut sim, mut t) = Scenario::new(41).one_way(60, Duration::from_millis(1));
    let mut phase = 0;
    let done = sim.run_until(Duration::from_secs(5), |s| {
        if phase == 0 && t.dirs[0].completed >= 10 {
            s.link_down(A_DEFAULT, Some(Duration::from_millis(5)));
            phase = 1;
        }
        let rearming = s.a.qp.machine().map(|m| m.default_qp_phase())
            == Some(pmd::failover::DefaultQpPhase::Rearming);
        if phase == 1 && rearming && s.a.qp.is_busy() {
            s.a.devices[0].inject_fault(DeviceFault::Dead).unwrap();
            phase = 2;
        }
        step(&mut t, s) && phase == 2
    });
    assert_ran(done, phase, &t, &sim);
    assert_clean(&mut t, &mut sim);
    sim.run_for(Duration::from_secs(1));
    assert!(
        !sim.a.qp.is_busy(),
        "A still busy a second after the traffic ended: {:?}",
        sim.a.qp.events()
    );
}

/// Host A's default device dies (its device-fatal event moves the traffic to the backup),
/// then reports its link down and up again, as a netdev watch does when a device reset flaps
/// the netdev of a NIC that died: the connection stays on the backup path, and A's default
/// QP is never brought up again (no rearm, no failback toward a device that executes nothing).
#[test]
fn a_dead_default_device_whose_link_flaps_stays_down_for_failover() {
    let (mut sim, mut t) = Scenario::new(43).one_way(200, Duration::from_millis(2));
    let mut phase = 0;
    let mut flapped_at = Duration::ZERO;
    let mut left_dead = Vec::new();
    let done = sim.run_until(Duration::from_secs(5), |s| {
        if phase == 0 && t.dirs[0].completed >= 10 {
            s.a.devices[0].inject_fault(DeviceFault::Dead).unwrap();
            phase = 1;
        }
        if phase == 1 && s.a.qp.state() == ResilientState::Fallback {
            s.a.devices[0].inject_fault(DeviceFault::LinkFlap).unwrap();
            flapped_at = s.now();
            phase = 2;
        }
        if phase == 2 {
            let p = s.a.qp.machine().map(|m| m.default_qp_phase());
            if p != Some(pmd::failover::DefaultQpPhase::Dead) {
                left_dead.push((s.now() - flapped_at, p));
            }
        }
        step(&mut t, s) && phase == 2 && s.now() >= flapped_at + Duration::from_millis(300)
    });
    assert_ran(done, phase, &t, &sim);
    assert_clean(&mut t, &mut sim);
    assert!(
        left_dead.is_empty(),
        "A's default QP left the dead phase after the flap: {:?}",
        &left_dead[..left_dead.len().min(4)]
    );
    assert_eq!(sim.a.qp.state(), ResilientState::Fallback);
    let stats = sim.a.qp.stats();
    assert_eq!((stats.failbacks, stats.errors), (0, 0), "{stats:?}");
}

/// Both default devices are slow to complete but alive: they hold back every completion
/// they write (A's for 155 ms, B's for 300 ms), and 5 ms in A's default link goes down for a
/// second. A's drain waits for flushes its device holds back and gives up at its deadline
/// (100 ms); its `Failover` starts B's round, whose drain waits out its own deadline too, so
/// A's round is still waiting for B's message when A's device writes the successes and
/// flushes it held, with A's QP in ERR and not yet reset. They must be discarded: each of
/// those WRs is completed by the round (the peer consumed it) or sent again on the backup,
/// and the checker counts every completion.
#[test]
fn completions_a_slow_nic_writes_after_the_drain_deadline_are_discarded() {
    let (mut sim, mut t) = Scenario::new(47).one_way(200, Duration::from_millis(1));
    let mut phase = 0;
    let mut slowed_at = Duration::ZERO;
    let done = sim.run_until(Duration::from_secs(5), |s| {
        if phase == 0 && t.dirs[0].completed >= 10 {
            s.a.devices[0]
                .inject_fault(DeviceFault::SlowCompletions(Duration::from_millis(155)))
                .unwrap();
            s.b.devices[0]
                .inject_fault(DeviceFault::SlowCompletions(Duration::from_millis(300)))
                .unwrap();
            slowed_at = s.now();
            phase = 1;
        }
        if phase == 1 && s.now() >= slowed_at + Duration::from_millis(5) {
            s.link_down(A_DEFAULT, Some(Duration::from_secs(1)));
            phase = 2;
        }
        step(&mut t, s) && phase == 2 && s.now() >= slowed_at + Duration::from_millis(400)
    });
    assert_ran(done, phase, &t, &sim);
    assert_clean(&mut t, &mut sim);
    // A's round ended after its device wrote what it held (the window this test is about).
    let event = &sim.a.qp.events()[0];
    assert_eq!(event.kind, EventKind::Failover, "{:?}", sim.a.qp.events());
    assert!(
        event.duration_ms() > 150.0,
        "A's round took {} ms: it ended before the held completions came",
        event.duration_ms()
    );
    assert_eq!(sim.a.qp.stats().errors, 0, "{:?}", sim.a.qp.stats());
}

/// Host B keeps 100 receives posted; A's QP is 24 sends and 8 receives deep, so its backup
/// SQ (a default SQ and a default RQ's worth of burns, the peer taken to be as deep) has 32. A first failover copies
/// B's receives to its backup RQ and the switch-back moves them back, leaving them stale
/// there; the second failover must burn them with zero-length SENDs on A's backup SQ, where
/// they do not fit. The connection fails, and every WR A had to move still completes once,
/// in error: before, the default ring's reset lost them (no completion at all).
#[test]
fn burns_that_do_not_fit_the_backup_send_queue_keep_the_sends_to_move() {
    let small_sq = pmd::QpCaps {
        max_send_wr: 24,
        max_recv_wr: 8,
        ..caps()
    };
    let (mut sim, mut t) = Scenario::new(11)
        .a_caps(small_sq)
        .one_way(800, Duration::from_micros(200));
    t.dirs[0].recv_window = 100;
    let mut phase = 0;
    let done = sim.run_until(Duration::from_secs(10), |s| {
        if phase == 0 && t.dirs[0].completed >= 10 {
            s.link_down(A_DEFAULT, Some(Duration::from_millis(10)));
            phase = 1;
        }
        step(&mut t, s);
        // Right after A posted: its sends are in flight when the link goes.
        if phase == 1
            && s.a.qp.stats().switch_backs == 1
            && s.b.qp.stats().switch_backs == 1
            && s.a.qp.state() == ResilientState::Default
            && t.dirs[0].posted > t.dirs[0].completed
        {
            s.link_down(A_DEFAULT, None);
            phase = 2;
        }
        phase == 2
            && s.a.qp.state() == ResilientState::Failed
            && s.b.qp.state() == ResilientState::Failed
    });
    assert_ran(done, phase, &t, &sim);
    t.check_markers(&mut sim);
    t.check_exactly_once(&mut sim, Duration::from_secs(1));
    assert!(t.violations.is_empty(), "{:#?}", t.violations);
    let events = sim.a.qp.events();
    let last = events.last().expect("events");
    assert_eq!(
        (last.kind, last.cause),
        (EventKind::Refused, Cause::Refused(WcStatus::LocQpOpErr)),
        "{events:?}"
    );
    // The sends to move were in the book when the burns failed.
    assert!(t.dirs[0].send_errors > 0, "{:?}", t.dirs);
}

/// Traffic both ways runs on the backup after B's default link flapped. Then A's backup
/// device fails its QPs and A's default device refuses RTR (a NIC not ready after its own
/// recovery): the failback's bring-up of A's default QP fails, and the connection fails.
/// Every WR completes once, in error, from the book that kept the saved WRs: before, the
/// sends A had on the backup SQ were flushed twice (from the book and from the backup rings
/// it had not forgotten), and the receives A posted during the failback (on the default
/// ring, reset by the failback) never completed.
#[test]
fn a_failback_whose_default_qp_does_not_come_up_completes_each_wr_once() {
    let (mut sim, mut t) = Scenario::new(41).both_ways(1_000);
    let mut phase = 0;
    let done = sim.run_until(Duration::from_secs(10), |s| {
        if phase == 0 && t.dirs[0].completed >= 10 {
            s.link_down(B_DEFAULT, Some(Duration::from_millis(20)));
            phase = 1;
        }
        step(&mut t, s);
        // Right after A posted: its sends are on the backup SQ when the backup fails.
        if phase == 1
            && s.a.qp.state() == ResilientState::Fallback
            && s.b.qp.state() == ResilientState::Fallback
            && t.dirs[1].completed >= 20
            && t.dirs[0].posted > t.dirs[0].completed
        {
            s.a.devices[0]
                .inject_fault(DeviceFault::RefuseRtr(Duration::from_secs(10)))
                .unwrap();
            s.a.devices[1].inject_fault(DeviceFault::QpsFailed).unwrap();
            phase = 2;
        }
        if phase == 2 && s.a.qp.state() == ResilientState::FailingBack {
            // Receives posted during the failback go to the default ring, unpublished.
            t.dirs[1].recv_window += 8;
            phase = 3;
        }
        phase == 3
            && s.a.qp.state() == ResilientState::Failed
            && s.b.qp.state() == ResilientState::Failed
    });
    assert_ran(done, phase, &t, &sim);
    t.check_markers(&mut sim);
    t.check_exactly_once(&mut sim, Duration::from_secs(1));
    assert!(t.violations.is_empty(), "{:#?}", t.violations);
    // A had work on the backup and receives posted when its failback failed.
    assert!(t.dirs[0].send_errors > 0, "{:?}", t.dirs);
    assert!(t.dirs[1].recvs_posted > t.dirs[1].notified, "{:?}", t.dirs);
    let stats = sim.a.qp.stats();
    assert_eq!((stats.failovers, stats.failbacks), (1, 0), "{stats:?}");
}

/// Traffic runs on the backup after B's default link flapped. A posts a WRITE from a second
/// buffer and deregisters that buffer at once (its backup twin's keys leave the key map);
/// then A's backup device fails its QPs. The failback meets a WQE whose lkey has no default
/// counterpart and must fail closed: nothing is moved to the default QP, A never reports
/// its default QP up (so B never hears `FailbackReady` and never completes a failback), and
/// the connection fails with every WR completed once.
#[test]
fn a_failback_meeting_a_key_without_a_default_counterpart_moves_nothing() {
    let mut sim = Sim::new(41, config());
    let mut extra = sim.a.pd.alloc_buffer(4096, pmd::Access::ALL).unwrap();
    let mut t = both_ways(&sim, 1_000);
    let mut phase = 0;
    let mut copied_before = 0;
    let done = sim.run_until(Duration::from_secs(10), |s| {
        if phase == 0 && t.dirs[0].completed >= 10 {
            s.link_down(B_DEFAULT, Some(Duration::from_millis(20)));
            phase = 1;
        }
        step(&mut t, s);
        if phase == 1
            && s.a.qp.state() == ResilientState::Fallback
            && s.b.qp.state() == ResilientState::Fallback
            && t.dirs[1].completed >= 20
        {
            // Past the slots the traffic writes at B (a quarter of the buffer each way).
            let remote = s.b.buf.remote(BUF / 2);
            let wr_id = 1 << 40;
            let write =
                SendWr::new(wr_id, SendOp::Write { remote }, &[extra.sge(0, 64)]).signaled();
            s.a.qp.post_send(&write).unwrap();
            t.track(true, false, wr_id, true);
            extra.deregister_now().unwrap();
            copied_before = s.a.qp.stats().wqes_copied;
            s.a.devices[1].inject_fault(DeviceFault::QpsFailed).unwrap();
            phase = 2;
        }
        phase == 2
            && s.a.qp.state() == ResilientState::Failed
            && s.b.qp.state() == ResilientState::Failed
    });
    assert_ran(done, phase, &t, &sim);
    t.check_markers(&mut sim);
    t.check_exactly_once(&mut sim, Duration::from_secs(1));
    assert!(t.violations.is_empty(), "{:#?}", t.violations);
    assert_eq!(
        sim.a.qp.stats().wqes_copied,
        copied_before,
        "the failback moved work: {:?}",
        sim.a.qp.events()
    );
    assert_both_hosts(&sim, |s| s.failbacks, 0);
}

#[test]
fn both_paths_down_past_the_rc_budget_but_within_the_tolerance_loses_nothing() {
    // Both links of host A down together for 120 ms (seven of the simulation's RC budgets,
    // 16.8 ms; the tolerance is 300 ms), then back: every posted WR completes, checked.
    for seed in [21, 22, 23] {
        let mut sim = Sim::new(seed, config());
        let mut t = nccl(&sim, 300);
        let mut down = false;
        let done = sim.run_until(Duration::from_secs(20), |s| {
            if !down && t.dirs[0].completed >= 10 {
                s.link_down(A_DEFAULT, Some(Duration::from_millis(120)));
                s.link_down(A_BACKUP, Some(Duration::from_millis(120)));
                down = true;
            }
            step(&mut t, s) && s.a.qp.state() != ResilientState::Failed
        });
        assert!(
            done,
            "seed {seed}: stalled or failed: {} completed, {} notified, states {:?} {:?}, events {:?}",
            t.dirs[0].completed,
            t.dirs[0].notified,
            sim.a.qp.state(),
            sim.b.qp.state(),
            sim.a.qp.events()
        );
        assert_clean(&mut t, &mut sim);
        assert_ne!(sim.a.qp.state(), ResilientState::Failed, "seed {seed}");
        assert_ne!(sim.b.qp.state(), ResilientState::Failed, "seed {seed}");
    }
}

#[test]
fn a_first_transmission_lost_on_the_backup_is_resent_long_before_the_ack_timeout() {
    // The tools' ACK timeout (code 14, 67 ms) on every QP, default and backup.
    let mut sim = Sim::with_ack_timeout(41, config(), 14);
    let mut t = nccl(&sim, 60);
    let (mut down, mut lost) = (false, false);
    let done = sim.run_until(Duration::from_secs(5), |s| {
        if !down && t.dirs[0].completed >= 10 {
            s.link_down(A_DEFAULT, None);
            down = true;
        }
        if down && !lost && s.a.qp.state() == ResilientState::Fallback {
            // A's round has just put its outstanding WRITEs on the backup SQ and rung it; the
            // devices send them in the next round, into a millisecond's partition.
            let now = s.now();
            let end = Some(now + Duration::from_millis(1));
            for rule in softnic::FaultRule::partition(A_BACKUP, B_BACKUP, now, end) {
                s.fabric.add_rule(rule);
            }
            lost = true;
        }
        step(&mut t, s)
    });
    assert!(done && lost, "down {down}, lost {lost}: {:?}", t.dirs);
    assert_clean(&mut t, &mut sim);
    let event = &sim.a.qp.events()[0];
    assert_eq!(event.kind, EventKind::Failover);
    assert!(event.wqes_retransmitted > 0, "{event:?}");
    // Resent on the failover's short timer (2 ms), not after the 67 ms ACK timeout.
    let latency = event.fallback_latency_us.expect("a success on the backup");
    assert!(
        latency < 20_000.0,
        "first success on the backup after {latency} us"
    );
}

/// The backup SQ is deeper than the default one (it also takes the peer's burns), but a
/// failback moves everything outstanding back to the default SQ: the application may have no
/// more sends outstanding on the backup than its own send queue holds. Before, the backup
/// route took up to the backup SQ's depth, and a failback then met a default SQ too small for
/// the work (seed 226 of the chaos schedules: "send queue full: 128 of 128", the connection
/// failed with a local QP operation error).
#[test]
fn on_the_backup_the_application_has_no_more_sends_outstanding_than_its_send_queue_holds() {
    let mut sim = Sim::new(7, config());
    sim.link_down(A_DEFAULT, None);
    sim.run_until(Duration::from_secs(2), |s| {
        s.a.qp.state() == ResilientState::Fallback
    });
    assert_eq!(sim.a.qp.state(), ResilientState::Fallback);
    let capacity = the_whole_send_queue_is_taken_and_completes(&mut sim);
    // Then there is room again.
    let (again, _) = post_writes_until_refused(&mut sim, 0);
    assert_eq!(again, capacity);
}

/// A failover round owns every WQE of the default SQ from its first error, those its flushes
/// retired too, and moves them all to the backup: sends withheld during the round must fit
/// beside them. Before, the round's flushes made the default SQ look empty, the application
/// could post a second ring's worth, and the backup then held more than the default SQ could
/// take back (seed 226 of the chaos schedules).
#[test]
fn during_a_round_the_sends_it_will_move_and_those_withheld_fit_one_send_queue() {
    let mut sim = Sim::new(8, config());
    // The backup link down first, so the round waits for it with the default QP drained.
    sim.link_down(A_BACKUP, Some(Duration::from_millis(200)));
    sim.link_down(B_DEFAULT, None);
    let capacity = sim.a.qp.caps().max_send_wr;
    let remote = sim.b.buf.remote(0);
    let sge = [sim.a.buf.sge(0, 8)];
    let mut accepted = 0u32;
    for _ in 0..capacity / 2 {
        let wr = SendWr::new(u64::from(accepted), SendOp::Write { remote }, &sge).signaled();
        sim.a.qp.post_send(&wr).unwrap();
        accepted += 1;
    }
    sim.a.qp.ring_doorbell();
    // Retry exhaustion, the round, the drain: every WQE flushed, none completed.
    sim.run_until(Duration::from_millis(150), |s| {
        s.a.qp.progress();
        s.a.qp.state() == ResilientState::FailingOver && s.a.qp.completions_waiting() == 0
    });
    sim.run_for(Duration::from_millis(20));
    assert_eq!(sim.a.qp.state(), ResilientState::FailingOver);
    let (accepted, refusal) = post_writes_until_refused(&mut sim, accepted);
    assert_eq!(accepted, capacity, "{refusal}");
    // The backup link returns: everything moves to the backup and completes there.
    sim.a.qp.ring_doorbell();
    let wcs = completions(&mut sim, true, capacity as usize, Duration::from_secs(2));
    assert_eq!(wcs.len(), capacity as usize);
    assert!(
        wcs.iter().all(|wc| wc.status == WcStatus::Success),
        "{wcs:?}"
    );
}

/// A rearm's probe on the default SQ is the failover's own: while it is out, the application
/// still has its whole send queue on the backup route. `ibv_rc_pingpong` has a one-entry send
/// queue; when the admission counted the probe, its next send was refused for as long as the
/// probe was out, and tools/test's stock cut failed (de88db1).
#[test]
fn a_rearms_probe_leaves_the_application_its_whole_send_queue() {
    let mut sim = Sim::new(9, config());
    let down = Duration::from_millis(200);
    let up = sim.clock.now() + down;
    sim.link_down(A_DEFAULT, Some(down));
    sim.run_until(Duration::from_secs(2), |s| {
        s.a.qp.state() == ResilientState::Fallback
    });
    assert_eq!(sim.a.qp.state(), ResilientState::Fallback);
    // The link comes back but carries nothing between the default devices for a while: the
    // rearm goes through (its messages take the backup path) and its probe waits on the
    // default QP's retransmissions.
    let blocked = Duration::from_millis(300);
    for rule in softnic::FaultRule::partition(A_DEFAULT, B_DEFAULT, up, Some(up + blocked)) {
        sim.fabric.add_rule(rule);
    }
    let holddown = config().holddown;
    let probing = up + holddown + Duration::from_millis(100);
    sim.run_until(probing - sim.clock.now(), |_| false);
    assert_eq!(sim.a.qp.state(), ResilientState::Fallback, "still probing");
    // The probe gets through once the default path carries packets, and the sends switch
    // back: it was out while the posts were taken.
    the_whole_send_queue_is_taken_and_completes(&mut sim);
    sim.run_until(Duration::from_secs(3), |s| {
        s.a.qp.state() == ResilientState::Default
    });
    assert_eq!(sim.a.qp.state(), ResilientState::Default);
    assert!(
        sim.clock.now() >= up + blocked,
        "switched back at {:?}",
        sim.clock.now()
    );
}

/// Posts WRITEs from A until one is refused, checks that A's send queue took exactly its
/// capacity, rings, and checks that every one completes successfully; returns the capacity.
fn the_whole_send_queue_is_taken_and_completes(sim: &mut Sim) -> u32 {
    let capacity = sim.a.qp.caps().max_send_wr;
    let (accepted, refusal) = post_writes_until_refused(sim, 0);
    assert_eq!(accepted, capacity, "{refusal}");
    sim.a.qp.ring_doorbell();
    let wcs = completions(sim, true, capacity as usize, Duration::from_secs(2));
    assert!(
        wcs.iter().all(|wc| wc.status == WcStatus::Success),
        "{wcs:?}"
    );
    capacity
}

/// Posts signaled 8-byte WRITEs from A to B, numbered from `posted` on, until one is refused;
/// returns how many were taken in all and the refusal, which must be a full queue.
fn post_writes_until_refused(sim: &mut Sim, mut posted: u32) -> (u32, pmd::PostError) {
    let remote = sim.b.buf.remote(0);
    let sge = [sim.a.buf.sge(0, 8)];
    let limit = 3 * sim.a.qp.caps().max_send_wr;
    let refusal = loop {
        let wr = SendWr::new(u64::from(posted), SendOp::Write { remote }, &sge).signaled();
        match sim.a.qp.post_send(&wr) {
            Ok(()) => posted += 1,
            Err(e) => break e,
        }
        assert!(posted <= limit, "no refusal after {posted} posts");
    };
    assert!(
        matches!(refusal, pmd::PostError::QueueFull { .. }),
        "{refusal}"
    );
    (posted, refusal)
}

/// Fails A's default link while the backup path is dead for 80 ms (`reported`: A's backup
/// link down and reported so, coming back with a link-up; otherwise B's backup link, dead
/// and reported up throughout, so that nothing ever reports the path back); returns when the
/// path came back and A's first success on the backup, both in virtual ms.
fn failover_into_a_dead_backup(seed: u64, reported: bool) -> (f64, f64) {
    let mut sim = Sim::new(seed, config());
    let mut t = nccl(&sim, 200);
    let mut back_at = None;
    let done = sim.run_until(Duration::from_secs(5), |s| {
        if back_at.is_none() && t.dirs[0].completed >= 10 {
            let now = s.now();
            let back = now + Duration::from_millis(80);
            if reported {
                s.link_down(A_BACKUP, Some(Duration::from_millis(80)));
            } else {
                s.fabric
                    .add_rule(softnic::FaultRule::link_down(B_BACKUP, now, Some(back)));
                s.fabric.add_rule(softnic::FaultRule::link_report(
                    B_BACKUP,
                    true,
                    now,
                    Some(back),
                ));
            }
            s.link_down(A_DEFAULT, None);
            back_at = Some(back);
        }
        step(&mut t, s) && s.a.qp.state() != ResilientState::Failed
    });
    assert!(done, "stalled or failed: {:?}", sim.a.qp.events());
    assert_clean(&mut t, &mut sim);
    let event = &sim.a.qp.events()[0];
    assert_eq!(event.kind, EventKind::Failover, "{event:?}");
    let back = back_at.expect("the fault was injected").as_secs_f64() * 1e3;
    let success = event
        .first_success_unix_ms
        .expect("a success on the backup");
    assert!(
        success >= back,
        "a success at {success} ms before the path was back at {back} ms"
    );
    (back, success)
}

/// The round's `Failover` messages, sent while the backup path was dead, are resent by the
/// control QPs' retransmit probe (2 ms doubling to 16 ms) once it carries packets, although
/// no link is ever reported back. Before, only the control QP's 67 ms ACK timer resent them:
/// the first success came 54 ms after the path's return (at the resend 134 ms after the
/// failure).
#[test]
fn a_control_message_sent_into_a_dead_path_gets_through_within_the_probe_cap_of_its_return() {
    let (back, success) = failover_into_a_dead_backup(61, false);
    assert!(
        success - back < 16.0 + 3.0,
        "first success {:.1} ms after the path came back",
        success - back
    );
}

/// A backup link reported back up resends the stuck `Failover` at once, and the peer, whose
/// own `Failover` is stuck too, resends it when ours arrives: the round finishes within a
/// couple of milliseconds of the link-up, not at the probe's next resend (14 ms later here)
/// nor at the ACK timer's.
#[test]
fn a_control_message_sent_into_a_path_reported_down_goes_again_at_its_link_up() {
    let (back, success) = failover_into_a_dead_backup(62, true);
    assert!(
        success - back < 3.0,
        "first success {:.1} ms after the link came back",
        success - back
    );
}

/// The all-targets soak's loss (`docs/failover.md` 5f): host B's default link goes down (the
/// traffic fails over), 70 ms later B's backup device fails every QP (traffic on the backup:
/// a failback, waiting for the default path), 100 ms after that B's default device fails
/// every QP too, taking the default devices' control channel; the default link comes back
/// 250 ms after it went (within the simulation's outage tolerance, 300 ms). Runs until the traffic completed or 20 s; returns whether it
/// completed, the phase reached and the simulation.
fn both_devices_of_one_host_fail_their_qps(scenario: Scenario) -> (bool, u32, Sim, Traffic) {
    let (mut sim, mut t) = scenario.one_way(1_000, Duration::from_micros(500));
    let mut phase = 0;
    let mut down_at = Duration::ZERO;
    let done = sim.run_until(Duration::from_secs(20), |s| {
        if phase == 0 && t.dirs[0].completed >= 10 {
            down_at = s.now();
            s.link_down(B_DEFAULT, Some(Duration::from_millis(250)));
            phase = 1;
        }
        if phase == 1 && s.now() >= down_at + Duration::from_millis(70) {
            s.b.devices[1].inject_fault(DeviceFault::QpsFailed).unwrap();
            phase = 2;
        }
        if phase == 2 && s.now() >= down_at + Duration::from_millis(170) {
            s.b.devices[0].inject_fault(DeviceFault::QpsFailed).unwrap();
            phase = 3;
        }
        step(&mut t, s)
            && phase == 3
            && s.a.qp.state() == ResilientState::Default
            && s.b.qp.state() == ResilientState::Default
            && s.a.qp.stats().backup_rearms >= 1
            && s.b.qp.stats().backup_rearms >= 1
    });
    (done, phase, sim, t)
}

#[test]
fn without_the_management_network_both_devices_of_one_host_failing_their_qps_end_the_connection() {
    let (done, phase, sim, _t) = both_devices_of_one_host_fail_their_qps(Scenario::new(131));
    assert!(!done);
    assert_eq!(phase, 3);
    assert_eq!(sim.b.qp.state(), ResilientState::Failed);
    // As in the soak: the channel's failure ends the failback at B.
    assert!(
        sim.b
            .qp
            .events()
            .iter()
            .any(|e| e.kind == EventKind::Error && e.cause == Cause::BackupUnavailable),
        "{:?}",
        sim.b.qp.events()
    );
}

#[test]
fn over_the_management_network_both_devices_of_one_host_failing_their_qps_keep_the_connection() {
    let (done, phase, mut sim, mut t) =
        both_devices_of_one_host_fail_their_qps(Scenario::new(131).management());
    assert_ran(done, phase, &t, &sim);
    assert_clean(&mut t, &mut sim);
    // Every byte and notification checked; the failback, then the default devices' channel
    // repaired over the management network and the backup side over that channel.
    assert_both_hosts(
        &sim,
        |s| {
            (
                s.failbacks,
                s.default_control_repairs >= 1,
                s.backup_rearms >= 1,
                s.errors,
                s.management_forged,
            )
        },
        (1, true, true, 0, 0),
    );
}

/// A QP pair's index on a host with [`Sim::with_more_qps`]: 0 is `qp`, k is `more[k - 1]`.
fn pair_qp(h: &mut Host, k: usize) -> &mut ResilientQp {
    if k == 0 {
        &mut h.qp
    } else {
        &mut h.more[k - 1]
    }
}

/// What one QP's application took from its polls.
#[derive(Debug, Default, Clone)]
struct Taken {
    /// wr_ids of successful send completions, in the order polled.
    sends: Vec<u64>,
    /// wr_ids of successful receive completions, in the order polled.
    recvs: Vec<u64>,
    /// Completions that were not a success of this QP's own WRs (another pair's wr_id,
    /// another QP's number, an error).
    wrong: Vec<pmd::WorkCompletion>,
}

/// Three QP pairs on one context per host (their backup QPs share the backup CQs: one of one
/// seat, one of two) carry SENDs both ways; host A's default link goes down (all three fail
/// over together), comes back, and during the hold-down A's backup device fails every QP (all
/// three fail back, their flushes together in the shared CQs). A's third QP is not run from
/// just before that failure until the second has failed back and reset its backup QP for the
/// repair (its application does not poll, and the rounds run only what the applications' polls
/// run): its receives' completions and its flushes wait in its inbox, moved there by the
/// second QP's polls, across the second's reset. Every QP completes each of its own WRs once,
/// in order, and nothing of another's.
#[test]
fn qps_sharing_backup_cqs_fail_over_and_back_together_and_each_completes_its_own_wrs_once() {
    const PAIRS: usize = 3;
    const SENDS: u64 = 100;
    const WINDOW: usize = 8;
    let tag = |k: usize, i: u64| (k as u64) << 32 | i;
    let mut sim = Sim::with_more_qps(51, config(), PAIRS - 1);
    sim.qp_progress = false;
    // Host A's last QP, which shares its CQ with the second, is not run while this is set.
    let mut parked_until = None;
    for h in [&sim.a, &sim.b] {
        assert_eq!(
            h.ctx.shared_backup_cqs().0,
            2,
            "one CQ of one seat, one of two"
        );
    }
    // A receive for every SEND the peer will post, up front.
    for a in [true, false] {
        for k in 0..PAIRS {
            let qp = pair_qp(sim.host(a), k);
            for i in 0..SENDS {
                qp.post_recv(&RecvWr::new(tag(k, i), &[])).unwrap();
            }
        }
    }
    let mut posted = [[0u64; PAIRS]; 2];
    let mut taken = vec![vec![Taken::default(); PAIRS]; 2];
    let mut phase = 0;
    let mut wcs = [pmd::WorkCompletion::EMPTY; 16];
    let done = sim.run_until(Duration::from_secs(10), |s| {
        for (h, a) in [(0, true), (1, false)] {
            for k in 0..PAIRS {
                if a && k == PAIRS - 1 && parked_until.is_some_and(|t| s.now() < t) {
                    continue;
                }
                let qp = pair_qp(s.host(a), k);
                let qpn = qp.qpn();
                let n = qp.poll(&mut wcs);
                let t = &mut taken[h][k];
                for wc in &wcs[..n] {
                    let own = wc.wr_id >> 32 == k as u64 && wc.qp_num == qpn;
                    match (own && wc.status == WcStatus::Success, wc.opcode) {
                        (true, WcOpcode::Recv) => t.recvs.push(wc.wr_id),
                        (true, WcOpcode::Send) => t.sends.push(wc.wr_id),
                        _ => t.wrong.push(*wc),
                    }
                }
                let mut rang = false;
                while posted[h][k] < SENDS
                    && (posted[h][k] as usize) < t.sends.len() + t.wrong.len() + WINDOW
                {
                    let wr = SendWr::new(tag(k, posted[h][k]), SendOp::Send, &[]).signaled();
                    if qp.post_send(&wr).is_err() {
                        break;
                    }
                    posted[h][k] += 1;
                    rang = true;
                }
                if rang {
                    qp.ring_doorbell();
                }
                s.app_polled |= n > 0;
            }
        }
        let all_a = |s: &mut Sim, state: ResilientState| {
            (0..PAIRS).all(|k| pair_qp(&mut s.a, k).state() == state)
        };
        if phase == 0 && taken[0][0].sends.len() >= 10 {
            s.link_down(A_DEFAULT, Some(Duration::from_millis(20)));
            phase = 1;
        }
        if phase == 1
            && all_a(s, ResilientState::Fallback)
            && taken.iter().flatten().all(|t| t.sends.len() >= 40)
        {
            // A's third QP stops running; its peer's SENDs land in its receives, their
            // CQEs in the CQ it shares with the second QP, whose polls move them to its inbox.
            parked_until = Some(s.now() + Duration::from_millis(200));
            s.wake_at = Some(s.now() + Duration::from_millis(2));
            phase = 2;
        }
        if phase == 2 && s.wake_at.is_some_and(|t| s.now() >= t) {
            // Still on the backup (the 50 ms hold-down): the backup device fails every QP.
            s.a.devices[1].inject_fault(DeviceFault::QpsFailed).unwrap();
            phase = 3;
        }
        if phase == 3 && s.a.more[0].stats().backup_rearms >= 1 {
            // The second QP reset its backup QP (its repair): the third runs again.
            parked_until = Some(s.now());
            phase = 4;
        }
        phase == 4
            && taken.iter().flatten().all(|t| {
                t.sends.len() as u64 + t.wrong.len() as u64 >= SENDS
                    && t.recvs.len() as u64 + t.wrong.len() as u64 >= SENDS
            })
    });
    let counts: Vec<Vec<_>> = taken
        .iter()
        .map(|h| {
            h.iter()
                .map(|t| (t.sends.len(), t.recvs.len(), t.wrong.len()))
                .collect()
        })
        .collect();
    assert!(
        done,
        "phase {phase}: (sends, receives, wrong) per host and pair {counts:?}"
    );
    for (h, host) in ["A", "B"].into_iter().enumerate() {
        for (k, t) in taken[h].iter().enumerate() {
            let want: Vec<u64> = (0..SENDS).map(|i| tag(k, i)).collect();
            assert!(t.wrong.is_empty(), "host {host} pair {k}: {:?}", t.wrong);
            assert_eq!(t.sends, want, "host {host} pair {k}: sends");
            assert_eq!(t.recvs, want, "host {host} pair {k}: receives");
            let qp = pair_qp(sim.host(h == 0), k);
            let stats = qp.stats();
            assert_eq!(
                (stats.failovers, stats.failbacks, stats.errors),
                (1, 1, 0),
                "host {host} pair {k}: {stats:?} {:?}",
                qp.events()
            );
        }
    }
}

/// The ten-minute chaos runs' loss (SEND seeds 2 and 5, `docs/failover.md` 5c, "whichever
/// path answers first"), at the simulation's scale: A's backup device fails every QP while
/// its link is down for 150 ms (the backup side lost, idle), and 20 ms in A's default link
/// goes down for 1 s, past the outage tolerance (300 ms), while the backup path is back after
/// 150 ms. Runs until the traffic completed and both ends are back on the default pair, or
/// 20 s; returns whether it completed, the phase reached and the simulation.
fn default_down_past_the_tolerance_with_the_backup_lost(
    scenario: Scenario,
) -> (bool, u32, Sim, Traffic) {
    let (mut sim, mut t) = scenario.one_way(1_000, Duration::from_micros(500));
    let mut phase = 0;
    let mut lost_at = Duration::ZERO;
    let done = sim.run_until(Duration::from_secs(20), |s| {
        if phase == 0 && t.dirs[0].completed >= 10 {
            lost_at = s.now();
            s.link_down(A_BACKUP, Some(Duration::from_millis(150)));
            s.a.devices[1].inject_fault(DeviceFault::QpsFailed).unwrap();
            phase = 1;
        }
        if phase == 1 && s.now() >= lost_at + Duration::from_millis(20) {
            s.link_down(A_DEFAULT, Some(Duration::from_secs(1)));
            phase = 2;
        }
        step(&mut t, s)
            && phase == 2
            && s.a.qp.state() == ResilientState::Default
            && s.b.qp.state() == ResilientState::Default
    });
    (done, phase, sim, t)
}

#[test]
fn without_the_management_network_a_default_down_past_the_tolerance_with_the_backup_lost_ends_the_connection(
) {
    let (done, phase, sim, _t) =
        default_down_past_the_tolerance_with_the_backup_lost(Scenario::new(141));
    assert!(!done);
    assert_eq!(phase, 2);
    // The failback waited for the default path alone.
    assert_eq!(sim.a.qp.state(), ResilientState::Failed);
    assert!(
        sim.a
            .qp
            .events()
            .iter()
            .any(|e| e.kind == EventKind::Error && e.cause == Cause::OutageTolerance),
        "{:?}",
        sim.a.qp.events()
    );
}

#[test]
fn over_the_management_network_a_backup_lost_while_idle_is_repaired_and_takes_the_traffic_while_the_default_is_down(
) {
    let (done, phase, mut sim, mut t) =
        default_down_past_the_tolerance_with_the_backup_lost(Scenario::new(141).management());
    assert_ran(done, phase, &t, &sim);
    assert_clean(&mut t, &mut sim);
    // Every byte and notification checked: the backup side repaired over the management
    // network, the traffic failed over to it while the default path was down, and switched
    // back once it was up; no failback, no error.
    assert_both_hosts(
        &sim,
        |s| {
            (
                s.failovers >= 1,
                s.backup_rearms >= 1,
                s.failbacks,
                s.errors,
                s.management_forged,
            )
        },
        (true, true, 0, 0, 0),
    );
}
