//! The link watch on a real netdev, through rtnetlink (root only: the test makes a network
//! namespace with a veth pair in it, and removes it when done, also on failure). The
//! resilient QPs run on the in-memory fabric as in `resilient_sim`; what changes is where
//! their services learn about the default devices' links: `LinkSource::Netdev` names the veth,
//! so taking its peer down is, to the failover service, the default link going down (the
//! fabric itself stays healthy, which is exactly what shows the failover came from netlink).

mod sim;

use std::io;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use pmd::resilient::{Cause, LinkSource, ResilientState};
use sim::traffic::{Dir, Traffic};
use sim::*;

/// The watched veth end, and its peer (both inside the namespace).
const WATCHED: &str = "rsva";
const PEER: &str = "rsvb";

/// A network namespace of this test's own with a veth pair, deleted on drop.
struct Netns {
    name: String,
}

fn ip(args: &[&str]) -> io::Result<()> {
    let out = Command::new("ip").args(args).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

impl Netns {
    fn create() -> io::Result<Netns> {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "rslw{}n{}",
            std::process::id() % 100_000,
            N.fetch_add(1, Ordering::Relaxed)
        );
        ip(&["netns", "add", &name])?;
        let ns = Netns { name };
        ip(&[
            "-n", &ns.name, "link", "add", WATCHED, "type", "veth", "peer", "name", PEER,
        ])?;
        for dev in [WATCHED, PEER] {
            ip(&["-n", &ns.name, "link", "set", "dev", dev, "up"])?;
        }
        ns.wait_running(true)?;
        Ok(ns)
    }

    /// Waits until the watched end's carrier is `up` (or not), as `ip` reports it.
    fn wait_running(&self, up: bool) -> io::Result<()> {
        let end = Instant::now() + Duration::from_secs(5);
        loop {
            let out = Command::new("ip")
                .args(["-n", &self.name, "-o", "link", "show", "dev", WATCHED])
                .output()?;
            if String::from_utf8_lossy(&out.stdout).contains("state UP") == up {
                return Ok(());
            }
            if Instant::now() > end {
                return Err(io::Error::other(format!("{WATCHED} never went up={up}")));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Takes the peer end down or up, and with it the watched end's carrier.
    fn set_peer(&self, up: bool) -> io::Result<()> {
        let state = if up { "up" } else { "down" };
        ip(&["-n", &self.name, "link", "set", "dev", PEER, state])?;
        self.wait_running(up)
    }

    /// Runs `f` on a thread inside the namespace (the netlink sockets it opens watch there).
    fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> io::Result<T> {
        let file = std::fs::File::open(format!("/var/run/netns/{}", self.name))?;
        let joined = std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: setns on a namespace descriptor we hold open; it moves only this
                // thread, which the scope joins before the descriptor closes.
                if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(f())
            })
            .join()
        });
        joined.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = ip(&["netns", "del", &self.name]) {
            eprintln!("cleanup: {e}");
        }
    }
}

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
    let ns = Netns::create().expect("a namespace with a veth pair");
    ns.run(|| {
        let mut config = config();
        config.link_sources = [LinkSource::Netdev(WATCHED.into()), LinkSource::Off];
        let mut sim = Sim::new(31, config);
        assert_eq!(sim.a.qp.state(), ResilientState::Default);

        ns.set_peer(false).unwrap();
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

        ns.set_peer(true).unwrap();
        // Link-up (real time) starts the hold-down (virtual time): let both pass.
        let back = until_real(&mut sim, Duration::from_secs(5), |s| {
            s.a.qp.state() == ResilientState::Default && s.b.qp.state() == ResilientState::Default
        });
        assert!(back, "no switch-back: {:?}", sim.a.qp.events());
        assert_eq!(sim.a.qp.stats().switch_backs, 1);
    })
    .expect("a thread in the namespace");
}
