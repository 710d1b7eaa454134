//! The tools' failover logic under link failures on the in-memory fabric. A fabric exists
//! only inside one process, so client and server run as threads of this test through the
//! library (`apps::run::run`), each with a default and a backup port, exactly as the
//! binaries run them; the out-of-band exchange still goes over TCP on loopback.

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use apps::cli;
use apps::run::{self, RunOutcome};
use apps::Tool;
use pmd::provider::soft::RegisteredFabric;
use softnic::{Fault, FaultRule};

/// Ports 0 and 1: the client's default and backup NICs; 2 and 3: the server's.
struct Fabric(RegisteredFabric);

impl Fabric {
    /// Waits until the fabric has delivered `packets` in all, or a minute has passed (a pair
    /// that stopped early stops the traffic; its own assertions then say why). Returns
    /// whether the count was reached.
    fn wait_for_packets(&self, packets: u64) -> bool {
        let t0 = Instant::now();
        while self.0.fabric().stats().delivered < packets {
            if t0.elapsed() > Duration::from_secs(60) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }
}

fn fabric() -> Fabric {
    Fabric(RegisteredFabric::two_hosts_two_rails("apps"))
}

fn port(test: u16) -> u16 {
    21000 + (std::process::id() % 400) as u16 * 10 + test
}

fn start(tool: Tool, args: Vec<String>) -> JoinHandle<RunOutcome> {
    std::thread::spawn(move || {
        let o = cli::parse(tool, &args).unwrap_or_else(|e| panic!("{e:?}"));
        run::run(&o).unwrap_or_else(|e| panic!("{} failed to start: {e}", tool.name()))
    })
}

fn listening(port: u16) -> bool {
    let want = format!(":{port:04X}");
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap_or_default()
        .lines()
        .any(|l| {
            let c: Vec<&str> = l.split_whitespace().collect();
            c.len() > 3 && c[1].ends_with(&want) && c[3] == "0A"
        })
}

/// Packets on the fabric that mean the pair's traffic is flowing (setup sends far fewer).
const TRAFFIC_FLOWS: u64 = 2000;

/// Starts server and client of `tool` on the fabric with `args` on both sides; `during`
/// runs on the test thread while they do.
fn run_pair(
    f: &Fabric,
    tool: Tool,
    test: u16,
    args: &[&str],
    during: impl FnOnce(),
) -> (RunOutcome, RunOutcome) {
    run_pair_with(f, tool, test, args, &[], during)
}

/// As [`run_pair`], with `client_only` added to the client's arguments.
fn run_pair_with(
    f: &Fabric,
    tool: Tool,
    test: u16,
    args: &[&str],
    client_only: &[&str],
    during: impl FnOnce(),
) -> (RunOutcome, RunOutcome) {
    let p = port(test);
    let side = |default: usize, backup: usize| -> Vec<String> {
        let mut v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        v.extend([
            "-d".into(),
            f.0.device(default),
            "--backup-dev".into(),
            f.0.device(backup),
            "-p".into(),
            p.to_string(),
            "--timeline-ms".into(),
            "50".into(),
        ]);
        v
    };
    let server = start(tool, side(2, 3));
    let t0 = Instant::now();
    while !listening(p) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "server never listened"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut cargs = side(0, 1);
    cargs.extend(client_only.iter().map(|s| s.to_string()));
    cargs.push("127.0.0.1".into());
    let client = start(tool, cargs);
    // `during` counts from the first traffic, not from the spawn: `-D` starts after setup,
    // and on a slow machine setup could swallow a failure meant for mid-run.
    let _ = f.wait_for_packets(TRAFFIC_FLOWS);
    during();
    let c = client.join().expect("client thread");
    let s = server.join().expect("server thread");
    (c, s)
}

#[test]
fn write_bw_check_fails_over_and_back_with_every_byte_intact() {
    let f = fabric();
    let (c, s) = run_pair(
        &f,
        Tool::WriteBw,
        1,
        &["-s", "16384", "-D", "4", "--check", "--holddown-ms", "200"],
        || {
            std::thread::sleep(Duration::from_millis(700));
            f.0.fabric().set_link(0, false);
            std::thread::sleep(Duration::from_millis(800));
            f.0.fabric().set_link(0, true);
        },
    );
    assert!(c.error.is_none(), "client stopped: {:?}", c.error);
    assert!(s.error.is_none(), "server stopped: {:?}", s.error);
    assert_eq!(c.report.progress, "engines");
    let fo = &c.report.failover;
    assert_eq!(fo.failovers, 1, "{fo:?}");
    assert_eq!(fo.switch_backs, 1, "{fo:?}");
    let first = &fo.events[0].event;
    assert_eq!(first.kind.as_str(), "failover");
    assert!(
        ["link-down", "flushed", "retry-exceeded"].contains(&first.cause.as_str()),
        "{first:?}"
    );
    assert!(first.fallback_latency_us.is_some());
    assert!(c.report.timeline.iter().any(|t| t.state == "fallback"));
    assert!(c.report.timeline.iter().any(|t| t.state == "default"));
    let check = s.report.check.as_ref().unwrap();
    assert_eq!(check.errors, 0);
    assert_eq!(check.notification_errors, 0);
    assert_eq!(check.notifications_checked, c.report.iterations);
    assert!(c.report.iterations > 0);
}

#[test]
fn send_bw_check_fails_over_and_back_with_every_send_in_its_own_receive() {
    let f = fabric();
    let (c, s) = run_pair(
        &f,
        Tool::SendBw,
        7,
        &["-s", "16384", "-D", "4", "--check", "--holddown-ms", "200"],
        || {
            std::thread::sleep(Duration::from_millis(700));
            f.0.fabric().set_link(0, false);
            std::thread::sleep(Duration::from_millis(800));
            f.0.fabric().set_link(0, true);
        },
    );
    assert!(c.error.is_none(), "client stopped: {:?}", c.error);
    assert!(s.error.is_none(), "server stopped: {:?}", s.error);
    let fo = &c.report.failover;
    assert_eq!(fo.failovers, 1, "{fo:?}");
    assert_eq!(fo.switch_backs, 1, "{fo:?}");
    assert!(c.report.timeline.iter().any(|t| t.state == "fallback"));
    // Every SEND the client completed was received once, in order, with its own bytes.
    let check = s.report.check.as_ref().unwrap();
    assert!(check.enabled);
    assert_eq!(check.errors, 0);
    assert_eq!(check.notification_errors, 0);
    assert_eq!(check.notifications_checked, c.report.iterations);
    assert_eq!(check.bytes_checked, c.report.iterations * 16384);
    assert!(c.report.iterations > 0);
}

/// Run-to-completion (`--poll busy` with a backup device): each side's one polling thread
/// drives both of its devices, its QP's failover and the failover service's link watch,
/// control QP and timers; no engine or service thread. The same failover and switch-back,
/// every byte checked.
#[test]
fn write_bw_run_to_completion_fails_over_and_back_with_every_byte_intact() {
    let f = fabric();
    let (c, s) = run_pair(
        &f,
        Tool::WriteBw,
        8,
        &[
            "-s",
            "16384",
            "-D",
            "4",
            "--check",
            "--holddown-ms",
            "200",
            "--poll",
            "busy",
        ],
        || {
            std::thread::sleep(Duration::from_millis(700));
            f.0.fabric().set_link(0, false);
            std::thread::sleep(Duration::from_millis(800));
            f.0.fabric().set_link(0, true);
        },
    );
    assert!(c.error.is_none(), "client stopped: {:?}", c.error);
    assert!(s.error.is_none(), "server stopped: {:?}", s.error);
    assert_eq!(c.report.progress, "run-to-completion");
    assert_eq!(s.report.progress, "run-to-completion");
    let fo = &c.report.failover;
    assert_eq!(fo.failovers, 1, "{fo:?}");
    assert_eq!(fo.switch_backs, 1, "{fo:?}");
    assert!(fo.events[0].event.fallback_latency_us.is_some());
    let check = s.report.check.as_ref().unwrap();
    assert_eq!(check.errors, 0);
    assert_eq!(check.notification_errors, 0);
    assert_eq!(check.notifications_checked, c.report.iterations);
    assert!(c.report.iterations > 0);
}

/// Run-to-completion over more QPs than a polling loop visits between two device rounds
/// (`session::PROGRESS_EVERY_QPS`): the failover service runs inside the loop over the QPs,
/// and the QPs it delivered mail to run their failover work there and then, out of the
/// loop's order. Every QP fails over and back without an error, and the server checks every
/// byte and every notification of the 64 QPs' shared slots (`--check`).
#[test]
fn write_bw_run_to_completion_on_64_qps_fails_every_qp_over_and_back() {
    let f = fabric();
    let (c, s) = run_pair(
        &f,
        Tool::WriteBw,
        0,
        &[
            "-s",
            "8192",
            "-t",
            "1",
            "-q",
            "64",
            "-D",
            "4",
            "--holddown-ms",
            "200",
            "--poll",
            "busy",
            "--check",
        ],
        || {
            std::thread::sleep(Duration::from_millis(700));
            f.0.fabric().set_link(0, false);
            std::thread::sleep(Duration::from_millis(800));
            f.0.fabric().set_link(0, true);
        },
    );
    assert!(c.error.is_none(), "client stopped: {:?}", c.error);
    assert!(s.error.is_none(), "server stopped: {:?}", s.error);
    assert_eq!(c.report.progress, "run-to-completion");
    let fo = &c.report.failover;
    assert_eq!(fo.failovers, 64, "{fo:?}");
    assert_eq!(fo.switch_backs, 64, "{fo:?}");
    assert_eq!(fo.errors, 0, "{fo:?}");
    assert!(c.report.iterations > 0);
    let check = s.report.check.as_ref().unwrap();
    assert_eq!(check.errors, 0, "{check:?}");
    assert_eq!(check.notification_errors, 0, "{check:?}");
    assert_eq!(check.notifications_checked, c.report.iterations);
    assert_eq!(check.bytes_checked, c.report.iterations * 8192);
}

#[test]
fn read_bw_check_with_a_changing_server_buffer_reads_no_stale_or_newer_data_through_failover() {
    let f = fabric();
    let (c, s) = run_pair(
        &f,
        Tool::ReadBw,
        8,
        &["-s", "16384", "-D", "4", "--check", "--holddown-ms", "200"],
        || {
            std::thread::sleep(Duration::from_millis(700));
            f.0.fabric().set_link(0, false);
            std::thread::sleep(Duration::from_millis(800));
            f.0.fabric().set_link(0, true);
        },
    );
    assert!(c.error.is_none(), "client stopped: {:?}", c.error);
    assert!(s.error.is_none(), "server stopped: {:?}", s.error);
    let fo = &c.report.failover;
    assert_eq!(fo.failovers, 1, "{fo:?}");
    assert_eq!(fo.switch_backs, 1, "{fo:?}");
    let check = c.report.check.as_ref().unwrap();
    assert_eq!(check.errors, 0);
    assert_eq!(check.bytes_checked, c.report.iterations * 16384);
    // The server changed a slot after every 8 READs.
    assert_eq!(s.report.iterations, c.report.iterations / 8);
    assert!(c.report.iterations > 0);
}

/// The client's default device dies silently, asked for through its fault
/// channel as the testbed does: failover (cause `device-fatal`), not connection loss, and
/// every byte the server checks intact.
#[test]
fn write_bw_check_fails_over_when_the_default_device_dies_through_the_fault_channel() {
    let f = fabric();
    let fifo = std::env::temp_dir().join(format!("r14-apps-{}-9.fifo", std::process::id()));
    let _ = std::fs::remove_file(&fifo);
    let fifo_arg = fifo.display().to_string();
    let device = f.0.device(0);
    let (c, s) = run_pair_with(
        &f,
        Tool::WriteBw,
        9,
        &["-s", "16384", "-D", "3", "--check"],
        &["--fault-fifo", &fifo_arg],
        || {
            std::thread::sleep(Duration::from_millis(700));
            use std::io::Write;
            let mut w = std::fs::OpenOptions::new()
                .write(true)
                .open(&fifo)
                .expect("the client made its fault channel");
            w.write_all(format!("device-dead {device}\n").as_bytes())
                .unwrap();
        },
    );
    let _ = std::fs::remove_file(&fifo);
    assert!(c.error.is_none(), "client stopped: {:?}", c.error);
    assert!(s.error.is_none(), "server stopped: {:?}", s.error);
    let faults = c.report.faults.as_ref().expect("a fault channel was given");
    assert_eq!(faults.len(), 1, "{faults:?}");
    assert!(faults[0].applied_unix_ms.is_some(), "{faults:?}");
    assert!(s.report.faults.is_none());
    let fo = &c.report.failover;
    assert_eq!(fo.failovers, 1, "{fo:?}");
    assert_eq!(fo.events[0].event.cause.as_str(), "device-fatal", "{fo:?}");
    assert!(c.report.timeline.iter().any(|t| t.state == "fallback"));
    let check = s.report.check.as_ref().unwrap();
    assert_eq!(check.errors, 0);
    assert_eq!(check.notification_errors, 0);
    assert_eq!(check.notifications_checked, c.report.iterations);
    assert!(c.report.iterations > 0);
}

/// A backup side repaired, through the fault channel, as the testbed's `initiator-dev1-qps-failed`
/// does it: the client's backup device fails every QP while traffic runs on the default
/// path; the pair repairs its backup side (one re-arm on each end), nothing reaches the
/// application, and a default failure after the repair fails over through the repaired
/// backup with every byte intact.
#[test]
fn write_bw_check_repairs_a_backup_whose_qps_failed_through_the_fault_channel() {
    let f = fabric();
    let fifo = std::env::temp_dir().join(format!("r15-apps-{}-8.fifo", std::process::id()));
    let _ = std::fs::remove_file(&fifo);
    let fifo_arg = fifo.display().to_string();
    let backup = f.0.device(1);
    let (c, s) = run_pair_with(
        &f,
        Tool::WriteBw,
        8,
        &["-s", "16384", "-D", "4", "--check", "--holddown-ms", "100"],
        &["--fault-fifo", &fifo_arg],
        || {
            std::thread::sleep(Duration::from_millis(500));
            use std::io::Write;
            let mut w = std::fs::OpenOptions::new()
                .write(true)
                .open(&fifo)
                .expect("the client made its fault channel");
            w.write_all(format!("qps-failed {backup}\n").as_bytes())
                .unwrap();
            // The repair needs a handshake on the default devices' channel; then the default
            // link fails, for longer than the budget would forgive a missing backup.
            std::thread::sleep(Duration::from_millis(1200));
            f.0.fabric().set_link(0, false);
            std::thread::sleep(Duration::from_millis(600));
            f.0.fabric().set_link(0, true);
        },
    );
    let _ = std::fs::remove_file(&fifo);
    assert!(c.error.is_none(), "client stopped: {:?}", c.error);
    assert!(s.error.is_none(), "server stopped: {:?}", s.error);
    let faults = c.report.faults.as_ref().expect("a fault channel was given");
    assert_eq!(faults.len(), 1, "{faults:?}");
    assert!(faults[0].applied_unix_ms.is_some(), "{faults:?}");
    assert_eq!(
        c.report.failover.backup_rearms, 1,
        "{:?}",
        c.report.failover
    );
    assert_eq!(
        s.report.failover.backup_rearms, 1,
        "{:?}",
        s.report.failover
    );
    assert!(c.report.failover.failovers >= 1, "{:?}", c.report.failover);
    let check = s.report.check.as_ref().unwrap();
    assert_eq!(check.errors, 0);
    assert_eq!(check.notification_errors, 0);
    assert_eq!(check.notifications_checked, c.report.iterations);
    assert!(c.report.iterations > 0);
}

#[test]
fn write_bw_without_failover_stops_with_the_error() {
    let f = fabric();
    let (c, s) = run_pair(
        &f,
        Tool::WriteBw,
        2,
        &[
            "-s",
            "16384",
            "-D",
            "4",
            "--check",
            "--no-failover",
            "-u",
            "10",
        ],
        || {
            std::thread::sleep(Duration::from_millis(500));
            f.0.fabric().set_link(0, false);
        },
    );
    let e = c.error.expect("the client must stop on the failure");
    assert!(e.to_string().contains("work completion error"), "{e}");
    assert!(c.report.error.is_some());
    assert!(!c.report.failover_enabled);
    // The server's own credit WRITEs may fail on the dead path too; what it checked is
    // still intact.
    if let Some(e) = &s.error {
        assert!(e.to_string().contains("work completion error"), "{e}");
    }
    let check = s.report.check.as_ref().unwrap();
    assert_eq!(check.errors, 0);
    assert_eq!(check.notification_errors, 0);
}

/// Fabric packets after which the atomic stream is surely under way: far more than a
/// resilient pair's set-up sends, a few hundred atomics and their responses.
const ATOMIC_STREAM_PACKETS: u64 = 1000;

#[test]
fn atomic_bw_refuses_to_fail_over_with_an_atomic_in_flight_and_executes_nothing_twice() {
    let f = fabric();
    // An atomic must be on the wire, unanswered, when the round looks. The link failing at
    // some moment does not make sure of that: the responses already in flight may still
    // complete every atomic posted, and the next batch then waits unrung behind the round,
    // which moves it safely (that run failed over, rightly, about once in ten). So the
    // server's answers to the default port stop first, once atomics flow; the client keeps
    // up to 32 atomics posted that can never complete; then its default link fails.
    let (c, s) = run_pair(&f, Tool::AtomicBw, 3, &["-D", "4", "-t", "32"], || {
        let _ = f.wait_for_packets(ATOMIC_STREAM_PACKETS);
        f.0.fabric().add_rule(FaultRule {
            fault: Fault::Partition,
            from: Some(2),
            to: Some(0),
            start: Duration::ZERO,
            end: None,
        });
        // The requests still arrive until the window of 32 is full and unanswered: wait until
        // nothing more is delivered for 20 ms (the first RC retransmission comes after 67 ms).
        let mut delivered = f.0.fabric().stats().delivered;
        let t0 = Instant::now();
        loop {
            std::thread::sleep(Duration::from_millis(20));
            let now = f.0.fabric().stats().delivered;
            if now == delivered || t0.elapsed() > Duration::from_secs(10) {
                break;
            }
            delivered = now;
        }
        f.0.fabric().set_link(0, false);
    });
    let e = c.error.expect("the atomic stream must stop");
    assert!(e.to_string().contains("atomic-in-flight"), "{e}");
    let fo = &c.report.failover;
    assert_eq!(fo.failovers, 0, "{fo:?}");
    assert_eq!(fo.refusals, 1, "{fo:?}");
    assert_eq!(fo.events[0].event.kind.as_str(), "refused");
    assert_eq!(fo.events[0].event.cause.as_str(), "atomic-in-flight");
    let a = c.report.atomic.as_ref().unwrap();
    let counter = a.remote_counter.expect("the server reports its counter");
    assert!(a.fetched_in_sequence, "{a:?}");
    assert!(counter >= a.completed && counter <= a.posted, "{a:?}");
    assert_eq!(a.double_executions, 0);
    assert!(
        s.error.is_none()
            || s.report
                .failover
                .events
                .iter()
                .all(|e| e.event.kind.as_str() != "failover")
    );
}

/// Fabric packets one 64 KiB allreduce iteration of two ranks moves at least: each rank
/// sends two 32 KiB chunks (8 packets each at the fabric's 4096-byte MTU) and two
/// notifications and two credit WRITEs per iteration, not counting ACKs.
const ALLREDUCE_PACKETS_PER_ITER: u64 = 2 * (2 * 8 + 2 + 2);

#[test]
fn allreduce_keeps_every_result_correct_through_a_failover() {
    // The run is counted in iterations and the failure follows the traffic (packets
    // delivered), not the clock: a loaded machine that runs the ring slowly still sees the
    // link fail mid-run, and a fast one cannot finish before it does.
    const ITERS: u64 = 300;
    let f = fabric();
    let flows =
        |iters: u64| -> u64 { f.0.fabric().stats().delivered + iters * ALLREDUCE_PACKETS_PER_ITER };
    let (c, s) = run_pair(
        &f,
        Tool::Allreduce,
        4,
        &["-s", "65536", "-n", &ITERS.to_string()],
        || {
            let _ = f.wait_for_packets(flows(ITERS / 6));
            f.0.fabric().set_link(0, false);
            // Traffic flows again (on the backup ports) before the default comes back.
            let _ = f.wait_for_packets(flows(ITERS / 6));
            f.0.fabric().set_link(0, true);
        },
    );
    assert!(c.error.is_none(), "rank 1 stopped: {:?}", c.error);
    assert!(s.error.is_none(), "rank 0 stopped: {:?}", s.error);
    for r in [&c.report, &s.report] {
        assert!(r.failover.failovers >= 1, "{:?}", r.failover);
        let check = r.check.as_ref().unwrap();
        assert_eq!(check.errors, 0);
        assert_eq!(check.notification_errors, 0);
        assert_eq!(check.bytes_checked, r.iterations * 65536);
    }
    assert_eq!(c.report.iterations, ITERS);
    assert_eq!(s.report.iterations, ITERS);
    assert!(c.report.timeline.iter().any(|t| t.state == "fallback"));
}

#[test]
fn allreduce_without_failover_stops_with_the_error() {
    let f = fabric();
    let (c, s) = run_pair(
        &f,
        Tool::Allreduce,
        5,
        &["-s", "65536", "-D", "4", "--no-failover", "-u", "10"],
        || {
            std::thread::sleep(Duration::from_millis(500));
            f.0.fabric().set_link(0, false);
        },
    );
    // The client (rank 1) always stops with an error: its own completion error, or rank 0's
    // passed on.
    assert!(c.error.is_some(), "rank 1 must stop with an error");
    assert!(c.report.error.is_some());
    let stopped = [c.error.as_ref(), s.error.as_ref()];
    assert!(
        stopped
            .iter()
            .flatten()
            .any(|e| e.to_string().contains("work completion error")),
        "{stopped:?}"
    );
    for r in [&c.report, &s.report] {
        assert_eq!(r.check.as_ref().unwrap().errors, 0);
    }
}

#[test]
fn write_bw_on_two_resilient_qps_fails_both_over() {
    let f = fabric();
    let (c, s) = run_pair(
        &f,
        Tool::WriteBw,
        6,
        &["-s", "16384", "-D", "2", "-q", "2"],
        || {
            std::thread::sleep(Duration::from_millis(600));
            f.0.fabric().set_link(0, false);
        },
    );
    assert!(c.error.is_none(), "client stopped: {:?}", c.error);
    assert!(s.error.is_none(), "server stopped: {:?}", s.error);
    assert_eq!(c.report.failover.failovers, 2, "{:?}", c.report.failover);
    assert!(c.report.iterations > 0);
}
