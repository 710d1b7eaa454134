//! The link watch on a real netdev, through rtnetlink (root only: the test makes two network
//! namespaces with a veth between them, softnic's test harness, removed on drop, also on
//! failure). The resilient QPs run on the in-memory fabric as in `resilient_sim`; what changes
//! is where their services learn about the default devices' links: `LinkSource::Netdev` names
//! side a's veth end, so taking side b's end down is, to the failover service, the default
//! link going down (the fabric itself stays healthy, which is exactly what shows the failover
//! came from netlink).

mod sim;

use std::time::{Duration, Instant};

use pmd::resilient::{Cause, LinkSource, ResilientState};
use sim::traffic::{Dir, Traffic};
use sim::*;
use softnic::harness::netns::{run_in, NetnsPair};

fn skip_unless_root(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped {test}: it needs root (it makes a network namespace)");
        return true;
    }
    false
}

/// Runs the simulation a virtual millisecond at a time until `done`, for up to `limit` of
/// real time: rtnetlink delivers in real time, the fabric in virtual time.
fn until_real(sim: &mut Sim, limit: Duration, mut done: impl FnMut(&mut Sim) -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        sim.run_for(Duration::from_millis(1));
        if done(sim) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

#[test]
fn root_only_a_watched_netdev_going_down_fails_over_at_once_and_its_return_switches_back() {
    if skip_unless_root("the netlink link-watch test") {
        return;
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let pair = NetnsPair::create(1500).expect("two namespaces and a veth");
    let watched = pair.a.netdev.clone();
    run_in(&pair.a.netns, || {
        let mut config = config();
        config.link_sources = [LinkSource::Netdev(watched), LinkSource::Off];
        let mut sim = Sim::new(31, config);
        assert_eq!(sim.a.qp.state(), ResilientState::Default);

        pair.set_b_link(false).unwrap();
        let moved = until_real(&mut sim, Duration::from_secs(5), |s| {
            s.a.qp.stats().failovers == 1 && s.b.qp.stats().failovers == 1
        });
        assert!(moved, "no failover: {:?}", sim.a.qp.events());
        // Nothing failed on the fabric: only netlink can have started it.
        assert_eq!(sim.a.qp.events()[0].cause, Cause::LinkDown);

        // Traffic runs on the backup path meanwhile, checked byte for byte.
        let mut t = Traffic::new(vec![Dir::new(true, 20)], sim.now());
        assert!(sim.run_until(Duration::from_secs(1), |s| {
            t.step(s);
            !t.violations.is_empty() || t.finished()
        }));
        t.check_markers(&mut sim);
        assert!(t.violations.is_empty(), "{:#?}", t.violations);
        assert_eq!(sim.a.qp.state(), ResilientState::Fallback);

        pair.set_b_link(true).unwrap();
        pair.a.wait_running(Duration::from_secs(5)).unwrap();
        // Link-up (real time) starts the hold-down (virtual time): let both pass.
        let back = until_real(&mut sim, Duration::from_secs(5), |s| {
            s.a.qp.state() == ResilientState::Default && s.b.qp.state() == ResilientState::Default
        });
        assert!(back, "no switch-back: {:?}", sim.a.qp.events());
        assert_eq!(sim.a.qp.stats().switch_backs, 1);
    })
    .expect("a thread in the namespace");
}
