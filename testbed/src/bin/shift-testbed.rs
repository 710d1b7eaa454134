//! `shift-testbed`: build the namespace testbed, inject failures, run the paper's scenarios.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use clap::{Args, Parser, Subcommand};
use testbed::fail::{self, LogEntry};
use testbed::faults;
use testbed::idle_lat;
use testbed::scenario::{self, Op, ScenarioName, ScenarioOptions, Variants};
use testbed::schedule::{self, Schedule};
use testbed::sweep;
use testbed::target::{FailTarget, TargetSet};
use testbed::topology::{self, Role, TestbedInfo, TopologySpec};

/// The stock tools of a run (one value, parsed whole: clap would take a `Vec` as repeated).
type StockTools = Vec<testbed::stock::Tool>;

#[derive(Parser)]
#[command(
    name = "shift-testbed",
    about = "Two hosts, two NICs each, two rail switches, in network namespaces; failure injection and the SHIFT paper's scenarios"
)]
struct Cli {
    /// Prefix of the namespace names (lets several testbeds coexist).
    #[arg(long, global = true, default_value = "rs")]
    prefix: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build the topology; prints it and writes it as JSON.
    Up {
        /// MTU of the rail links.
        #[arg(long, default_value_t = 9000)]
        mtu: u32,
        /// 2 MiB hugepages to make sure are reserved (0: leave the machine as it is).
        #[arg(long, default_value_t = 64)]
        hugepages: u32,
        /// Also write the topology JSON here (it is always written under /run/railshift).
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Remove everything `up` built, also after a crash.
    Down,
    /// Print the topology of a running testbed as JSON.
    Status,
    /// Measure the medium: raw UDP ping-pong and stream between the hosts over one rail.
    Baseline {
        /// The rail to measure.
        #[arg(long, default_value_t = 0)]
        rail: u8,
        /// Round trips per ping-pong run.
        #[arg(long, default_value_t = 20000)]
        iters: usize,
        /// Stream duration.
        #[arg(long, default_value = "2s", value_parser = schedule::parse_duration)]
        duration: std::time::Duration,
        /// UDP payload per stream datagram (default: what a full RoCE packet at the rail MTU needs).
        #[arg(long)]
        datagram: Option<usize>,
        /// Write the results as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Run one of the paper's scenarios: an app pair under a failure, with and without failover.
    Scenario {
        /// initiator-nic, responder-nic, switch-port, flap, soak, allreduce, initiator-dev-dead
        /// or chaos.
        name: ScenarioName,
        /// Write the result (figures, timeline, both runs, ratios) as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Draw the bandwidth timeline with the failure windows to this PNG.
        #[arg(long)]
        plot: Option<PathBuf>,
        /// Print the failover run's timeline and failover events after the summary.
        #[arg(long)]
        print_timeline: bool,
        #[command(flatten)]
        args: ScenarioArgs,
    },
    /// Run a scenario with failover at several QP counts (`-q`) and plot the time until every
    /// QP has traffic on the backup against the number of QPs.
    QpSweep {
        /// The scenario to run at each count (initiator-nic, responder-nic, switch-port, ...).
        #[arg(default_value = "initiator-nic")]
        name: ScenarioName,
        /// The QP counts, in order.
        #[arg(long, default_value = "1,16,256,1000", value_parser = sweep::parse_qps)]
        qps: QpCounts,
        /// Write the sweep's figures as JSON here (each count's whole result goes to --out-dir).
        #[arg(long)]
        json: Option<PathBuf>,
        /// Draw all_on_backup_ms and the fallback latencies against the QPs to this PNG.
        #[arg(long)]
        plot: Option<PathBuf>,
        #[command(flatten)]
        args: ScenarioArgs,
    },
    /// 8-byte WRITE latency of a resilient QP with idle resilient QPs beside it, against
    /// alone, interleaved in one run (SHIFT table 2, "w/ 1000 QP").
    IdleLat {
        /// Idle QPs beside the measured one.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=4095))]
        idle_qps: u32,
        /// Pairs of runs (alone, with), which first alternating.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
        rounds: u32,
        /// Round trips per run.
        #[arg(long, short = 'n', default_value_t = 20000)]
        iters: u64,
        /// Message size.
        #[arg(long, short = 's', default_value_t = 8)]
        size: u32,
        #[command(flatten)]
        apps: AppsArgs,
        /// Write the result as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Stock verbs tools (perftest's ib_write_bw, ib_send_bw, ib_read_bw, ib_atomic_bw,
    /// rdma-core's ibv_rc_pingpong), unmodified, with LD_PRELOAD=librailshift_verbs.so and a
    /// resilient device per host, across a NIC cut: each must exit 0 with failover and fail
    /// with its completion error without; ib_atomic_bw fails either way (docs/verbs.md).
    Stock {
        /// The tools, by binary name, comma-separated, or `all`.
        #[arg(long, default_value = "all", value_parser = testbed::stock::Tool::parse_list)]
        tools: StockTools,
        /// What fails (initiator-nic, responder-nic, switch-port, ... as `fail --target`).
        #[arg(long, default_value = "initiator-nic")]
        target: String,
        /// The rail of a target without one in its name.
        #[arg(long)]
        rail: Option<u8>,
        /// When the target fails, after the client started.
        #[arg(long, default_value = "4s", value_parser = schedule::parse_duration)]
        at: std::time::Duration,
        /// How long it stays down.
        #[arg(long, default_value = "2s", value_parser = schedule::parse_duration)]
        down: std::time::Duration,
        /// Instead of one cut, both rails' links fail at random, overlapping (the `chaos`
        /// scenario's draw, from this seed), from --at until 3 s before -D ends.
        #[arg(long, value_name = "SEED")]
        chaos: Option<u64>,
        /// With --chaos: the longest time both rails may be down together.
        #[arg(long, default_value = "1s", value_parser = schedule::parse_duration, requires = "chaos")]
        max_both_down: std::time::Duration,
        /// The perftest tools' -D (seconds).
        #[arg(long, short = 'D', default_value = "10s", value_parser = schedule::parse_duration)]
        duration: std::time::Duration,
        /// ibv_rc_pingpong's -n.
        #[arg(long, short = 'n', default_value_t = 200_000)]
        iters: u64,
        /// Only the runs with failover (default: with, then without).
        #[arg(long, conflicts_with = "no_failover")]
        failover_only: bool,
        /// Only the runs without failover (no backup device).
        #[arg(long)]
        no_failover: bool,
        /// librailshift_verbs.so (default: beside this binary).
        #[arg(long)]
        shim: Option<PathBuf>,
        /// How long the default link must be up before traffic goes back to it.
        #[arg(long, default_value = "1s", value_parser = schedule::parse_duration)]
        holddown: std::time::Duration,
        /// Where the tools' logs go.
        #[arg(long, default_value = "out")]
        out_dir: PathBuf,
        /// The redis-server's port on the management switch; the tools take the ports after it.
        #[arg(long, default_value_t = 18600)]
        port: u16,
        /// Do not give the shim each host's management address (RAILSHIFT_MANAGEMENT_ADDR):
        /// the tools' QPs then have no third channel when both control channels are lost.
        #[arg(long)]
        no_management: bool,
    },
    /// When each phase of a failover and of its switch-back ends for the first, median and
    /// last QP, from the apps' logs of a run with
    /// `RUST_LOG=warn,pmd::resilient=debug,pmd::failover=info` (`<out-dir>/*-client.log`,
    /// `*-server.log`).
    Phases {
        /// The client's log (its default link is the one that changed).
        #[arg(long)]
        client: PathBuf,
        /// The server's log.
        #[arg(long)]
        server: PathBuf,
        /// Write the breakdown as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Cut and restore links: once, for a while, or on a flapping schedule.
    Fail {
        /// What fails (docs/testbed.md, "Failure targets"): initiator-nic0|1,
        /// responder-nic0|1 (a host's NIC), switch0|1-port (the switch port facing host A),
        /// switch0|1-port-b (facing host B), both-nic0|1 (both hosts' NIC of the rail),
        /// initiator-dev-dead, responder-dev-dead, initiator-dev1-dead, responder-dev1-dead
        /// (a device dies silently), initiator-dev-qps-failed, responder-dev-qps-failed,
        /// initiator-dev1-qps-failed, responder-dev1-qps-failed (a device fails its QPs);
        /// or initiator-nic, responder-nic, switch-port with --rail and --port.
        #[arg(long)]
        target: String,
        /// The rail of a target named without one (0 is every host's default NIC).
        #[arg(long)]
        rail: Option<u8>,
        /// For switch-port: which host's port (a or b).
        #[arg(long)]
        port: Option<String>,
        /// When the (first) failure happens, from now.
        #[arg(long, default_value = "0s", value_parser = schedule::parse_duration)]
        at: std::time::Duration,
        /// How long the link stays down; without it (and without --flap) it stays down
        /// until `restore --target` brings it back.
        #[arg(long, value_parser = schedule::parse_duration)]
        duration: Option<std::time::Duration>,
        /// Flap this many times instead of failing once.
        #[arg(long)]
        flap: Option<u32>,
        /// Range of down times when flapping.
        #[arg(long, default_value = "50ms..300ms", value_parser = schedule::parse_range)]
        down: (std::time::Duration, std::time::Duration),
        /// Ranges of up times between flaps, comma-separated: each flap draws one.
        #[arg(long, default_value = "200ms..500ms", value_parser = schedule::parse_ranges)]
        up: TimeRanges,
        /// Seed of the flapping schedule.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Append every action as a JSON line to this file.
        #[arg(long)]
        log: Option<PathBuf>,
    },
    /// Bring back what `fail` left down (a target failed without --duration): its links up.
    Restore {
        /// The target as `fail` was given it (one whose failure is a link: a NIC, a switch
        /// port, both NICs of a rail).
        #[arg(long)]
        target: String,
        /// The rail of a target named without one.
        #[arg(long)]
        rail: Option<u8>,
        /// For switch-port: which host's port (a or b).
        #[arg(long)]
        port: Option<String>,
        /// Append the action as a JSON line to this file.
        #[arg(long)]
        log: Option<PathBuf>,
    },
}

/// The target of `fail` or `restore`, with `--port` applied; checked before the testbed is
/// read, so a misspelt name is the first thing said.
fn parse_target(name: &str, rail: Option<u8>, port: Option<&str>) -> Result<FailTarget, String> {
    let mut target = FailTarget::parse(name, rail)?;
    if let Some(port) = port {
        let FailTarget::SwitchPort { host, .. } = &mut target else {
            return Err(format!("--port is for switch ports, not {target}"));
        };
        *host = match port {
            "a" => Role::Initiator,
            "b" => Role::Responder,
            other => return Err(format!("bad --port {other:?}: use a or b")),
        };
    }
    Ok(target)
}

/// Up-time ranges as one clap value (clap would otherwise read a `Vec` as repeated flags).
type TimeRanges = Vec<(std::time::Duration, std::time::Duration)>;
/// QP counts as one clap value, for the same reason.
type QpCounts = Vec<u32>;

/// The flags every scenario run takes (`scenario` and `qp-sweep`).
#[derive(Args)]
struct ScenarioArgs {
    /// Traffic of the bandwidth scenarios: write, send or read.
    #[arg(long, default_value = "write")]
    op: Op,
    /// Message size in bytes.
    #[arg(long, short = 's', default_value_t = 65536)]
    size: usize,
    /// Run length (at least the schedule plus two seconds; default 6s, chaos 60s).
    #[arg(long, value_parser = schedule::parse_duration)]
    duration: Option<std::time::Duration>,
    /// When the failure happens, from the start of the client's traffic.
    #[arg(long, default_value = "2s", value_parser = schedule::parse_duration)]
    fail_at: std::time::Duration,
    /// How long the failure lasts.
    #[arg(long, default_value = "2s", value_parser = schedule::parse_duration)]
    down_for: std::time::Duration,
    /// Run only with failover (skip the --no-failover baseline run).
    #[arg(long, conflicts_with = "no_failover")]
    failover_only: bool,
    /// Run only the --no-failover baseline.
    #[arg(long)]
    no_failover: bool,
    /// Flaps in `flap`.
    #[arg(long, default_value_t = 20)]
    flaps: u32,
    /// Failures in `soak`.
    #[arg(long, default_value_t = 200)]
    failures: u32,
    /// Range of down times in `flap`, `soak` and `chaos` (default 50ms..300ms, chaos
    /// 100ms..2s).
    #[arg(long, value_parser = schedule::parse_range)]
    down: Option<(std::time::Duration, std::time::Duration)>,
    /// Ranges of up times in `flap`, `soak` and `chaos`, comma-separated
    /// (`300ms..600ms,1.2s..1.6s`): each failure draws one of them, then a time in it
    /// (default 1200ms..1600ms, chaos 300ms..3s).
    #[arg(long, value_parser = schedule::parse_ranges)]
    up: Option<TimeRanges>,
    /// `chaos`: the longest time both rails may be down together.
    #[arg(long, default_value = "1s", value_parser = schedule::parse_duration)]
    max_both_down: std::time::Duration,
    /// `chaos`: how long no path may be up before a lost connection is allowed.
    #[arg(long, default_value = "4.3s", value_parser = schedule::parse_duration)]
    tolerance: std::time::Duration,
    /// What `flap` and `soak` fail: `default` (= `all`: both rails, both default NICs at
    /// once, and each backup device failing its QPs), `default-path` (soak: the three kinds
    /// on rail 0; flap: initiator-nic0) or a list of names.
    #[arg(long, default_value = "default", value_parser = TargetSet::parse)]
    targets: TargetSet,
    /// Probability that a `soak` failure starts while the previous one is still down
    /// (default: 0 with --targets default-path, 0.25 otherwise).
    #[arg(long, value_parser = schedule::parse_probability)]
    overlap: Option<f64>,
    /// Seed of the `flap` and `soak` schedules.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Timeline interval of the apps, in milliseconds.
    #[arg(long, default_value_t = 100)]
    timeline_ms: u64,
    /// Skip measuring the medium and the 8-byte write latency.
    #[arg(long)]
    no_baseline: bool,
    #[command(flatten)]
    apps: AppsArgs,
    /// QPs per app (the apps' -q; default 1). `qp-sweep` sets its own counts instead.
    #[arg(long = "qp", short = 'q', value_parser = clap::value_parser!(u32).range(1..))]
    qp: Option<u32>,
    /// ACK timeout exponent of the apps' QPs, 4.096 us x 2^N (the apps' -u; default 14).
    #[arg(long, short = 'u', value_parser = clap::value_parser!(u8).range(0..=31))]
    qp_timeout: Option<u8>,
    /// Hold-down of the apps' QPs before a switch-back (default: the pmd's 1s).
    #[arg(long, value_parser = schedule::parse_duration)]
    holddown: Option<std::time::Duration>,
    /// Extra arguments passed to both apps, after `--` (not -q or -u: the flags above).
    #[arg(last = true)]
    extra: Vec<String>,
}

/// Where the apps are, where their reports go, and their out-of-band port.
#[derive(Args)]
struct AppsArgs {
    /// Where the apps' binaries are (default: beside this binary).
    #[arg(long)]
    apps_dir: Option<PathBuf>,
    /// Where reports and logs of the runs go.
    #[arg(long, default_value = "out")]
    out_dir: PathBuf,
    /// Out-of-band TCP port of the apps.
    #[arg(long, default_value_t = 18515)]
    port: u16,
}

impl ScenarioArgs {
    fn options(self, name: ScenarioName) -> Result<ScenarioOptions, String> {
        let mut o = ScenarioOptions::new(name);
        o.op = self.op;
        o.size = self.size;
        if let Some(d) = self.duration {
            o.duration = d;
        }
        o.fail_at = self.fail_at;
        o.down_for = self.down_for;
        if self.failover_only {
            o.variants = Variants::Failover;
        } else if self.no_failover {
            o.variants = Variants::NoFailover;
        }
        o.flaps = self.flaps;
        o.soak_failures = self.failures;
        if let Some(d) = self.down {
            o.down_range = d;
        }
        if let Some(u) = self.up {
            o.up_ranges = u;
        }
        o.max_both_down = self.max_both_down;
        o.tolerance = self.tolerance;
        o.targets = self.targets;
        o.overlap = self.overlap;
        o.seed = self.seed;
        o.timeline_ms = self.timeline_ms;
        if self.no_baseline {
            o.with_baseline = false;
        }
        if let Some(dir) = self.apps.apps_dir {
            o.apps_dir = dir;
        }
        o.out_dir = self.apps.out_dir;
        o.port = self.apps.port;
        o.set_extra_args(self.extra)?;
        o.qps = self.qp;
        o.qp_timeout = self.qp_timeout;
        if self.holddown.is_some() {
            o.holddown = self.holddown;
        }
        Ok(o)
    }
}

/// Prints each failure action of a scenario as it happens.
fn print_action(e: &LogEntry) {
    println!(
        "  [fail] t={:>8.1} ms {} {} {}",
        e.t_ms,
        e.target,
        e.action,
        e.error.as_deref().unwrap_or("ok")
    );
}

fn main() -> ExitCode {
    testbed::log_to_stderr();
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("shift-testbed: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Up {
            mtu,
            hugepages,
            json,
        } => {
            let spec = TopologySpec {
                prefix: cli.prefix,
                mtu,
                hugepages,
            };
            let info = topology::up(&spec).map_err(|e| e.to_string())?;
            print_topology(&info);
            if let Some(path) = json {
                write_json(&path, &info)?;
            }
            Ok(())
        }
        Command::Down => {
            let removed = topology::down(&cli.prefix).map_err(|e| e.to_string())?;
            if removed.is_empty() {
                println!("nothing to remove for prefix {:?}", cli.prefix);
            } else {
                println!("removed {}", removed.join(", "));
            }
            Ok(())
        }
        Command::Status => {
            let info = TestbedInfo::load(&cli.prefix).map_err(|e| e.to_string())?;
            println!(
                "{}",
                serde_json::to_string_pretty(&info).map_err(|e| e.to_string())?
            );
            Ok(())
        }
        Command::Baseline {
            rail,
            iters,
            duration,
            datagram,
            json,
        } => {
            let info = TestbedInfo::load(&cli.prefix).map_err(|e| e.to_string())?;
            let baseline = testbed::baseline::measure(&info, rail, iters, duration, datagram)
                .map_err(|e| e.to_string())?;
            baseline.print();
            if let Some(path) = json {
                let text = serde_json::to_string_pretty(&baseline).map_err(|e| e.to_string())?;
                std::fs::write(&path, text)
                    .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            }
            Ok(())
        }
        Command::Scenario {
            name,
            json,
            plot,
            print_timeline,
            args,
        } => {
            let o = args.options(name)?;
            let info = TestbedInfo::load(&cli.prefix).map_err(|e| e.to_string())?;
            let mut on_log = print_action;
            let result = scenario::run(&info, &o, &mut on_log).map_err(|e| e.to_string())?;
            if print_timeline {
                scenario::print_timeline(&result);
            }
            scenario::print_summary(&result);
            print_goals(&result);
            if let Some(path) = json {
                write_json(&path, &result)?;
                println!("  result: {}", path.display());
            }
            if let Some(path) = plot {
                scenario::plot(&result, &path).map_err(|e| e.to_string())?;
                println!("  plot: {}", path.display());
            }
            result.verdict()
        }
        Command::QpSweep {
            name,
            qps,
            json,
            plot,
            args,
        } => {
            let o = args.options(name)?;
            let info = TestbedInfo::load(&cli.prefix).map_err(|e| e.to_string())?;
            let mut on_log = print_action;
            let result = sweep::run(&info, &o, &qps, &mut on_log).map_err(|e| e.to_string())?;
            sweep::print(&result);
            if let Some(path) = json {
                write_json(&path, &result)?;
                println!("  result: {}", path.display());
            }
            if let Some(path) = plot {
                sweep::plot(&result, &path).map_err(|e| e.to_string())?;
                println!("  plot: {}", path.display());
            }
            Ok(())
        }
        Command::IdleLat {
            idle_qps,
            rounds,
            iters,
            size,
            apps,
            json,
        } => {
            let info = TestbedInfo::load(&cli.prefix).map_err(|e| e.to_string())?;
            let o = idle_lat::IdleLatOptions {
                idle_qps,
                rounds,
                iters,
                size,
                apps_dir: apps
                    .apps_dir
                    .unwrap_or_else(testbed::apprun::default_apps_dir),
                out_dir: apps.out_dir,
                port: apps.port,
            };
            let result = idle_lat::run(&info, &o, &mut |r| {
                println!(
                    "  idle QPs {:>4}: p50 {:.2} us, p99 {:.2} us, avg {:.2} us",
                    r.idle_qps, r.p50_us, r.p99_us, r.avg_us
                );
            })
            .map_err(|e| e.to_string())?;
            idle_lat::print(&result);
            if let Some(path) = json {
                write_json(&path, &result)?;
                println!("  result: {}", path.display());
            }
            Ok(())
        }
        Command::Stock {
            tools,
            target,
            rail,
            at,
            down,
            chaos,
            max_both_down,
            duration,
            iters,
            failover_only,
            no_failover,
            shim,
            holddown,
            out_dir,
            port,
            no_management,
        } => {
            let info = TestbedInfo::load(&cli.prefix).map_err(|e| e.to_string())?;
            let o = testbed::stock::StockOptions {
                tools,
                target: FailTarget::parse(&target, rail)?,
                at,
                down,
                chaos: chaos.map(|seed| testbed::stock::StockChaos {
                    seed,
                    max_both_down,
                }),
                duration,
                iters,
                modes: match (failover_only, no_failover) {
                    (true, _) => vec![true],
                    (_, true) => vec![false],
                    _ => vec![true, false],
                },
                shim: shim.unwrap_or_else(|| {
                    testbed::apprun::default_apps_dir().join("librailshift_verbs.so")
                }),
                out_dir,
                holddown,
                port,
                management: !no_management,
            };
            let outcomes = testbed::stock::run(&info, &o, &mut |line| println!("{line}"))?;
            println!("stock tools under {}:", o.cut_words());
            for outcome in &outcomes {
                println!("  {}", testbed::stock::summary(outcome));
            }
            let failed = outcomes.iter().filter(|o| !o.passed).count();
            if failed == 0 {
                Ok(())
            } else {
                Err(format!(
                    "{failed} of {} stock runs did not go as expected",
                    outcomes.len()
                ))
            }
        }
        Command::Phases {
            client,
            server,
            json,
        } => {
            let read = |p: &PathBuf| {
                std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))
            };
            let b = testbed::phases::breakdown(&read(&client)?, &read(&server)?)
                .map_err(|e| format!("{}: {e}", client.display()))?;
            testbed::phases::print(&b);
            if let Some(path) = json {
                write_json(&path, &b)?;
                println!("  result: {}", path.display());
            }
            Ok(())
        }
        Command::Fail {
            target,
            rail,
            port,
            at,
            duration,
            flap,
            down,
            up,
            seed,
            log,
        } => {
            let target = parse_target(&target, rail, port.as_deref())?;
            if !target.recovers() && (duration.is_some() || flap.is_some()) {
                return Err(format!(
                    "{target} does not come back: --duration and --flap do not apply"
                ));
            }
            if !target.has_up_step() && duration.is_some() {
                return Err(format!(
                    "{target} is an instant (the device stays up; the driver repairs its \
                     QPs): --duration does not apply (--flap repeats it)"
                ));
            }
            let info = TestbedInfo::load(&cli.prefix).map_err(|e| e.to_string())?;
            let schedule = match flap {
                Some(count) => Schedule::Flap {
                    target,
                    start: at,
                    count,
                    down,
                    up,
                    seed,
                },
                None => Schedule::Once {
                    target,
                    at,
                    duration,
                },
            };
            run_steps(&info, &schedule.steps(), log)
        }
        Command::Restore {
            target,
            rail,
            port,
            log,
        } => {
            let target = parse_target(&target, rail, port.as_deref())?;
            if !target.has_up_step() {
                return Err(format!(
                    "{target} is not a link: nothing to bring up (a dead device stays dead; \
                     QPs that failed are repaired by the driver)"
                ));
            }
            let info = TestbedInfo::load(&cli.prefix).map_err(|e| e.to_string())?;
            let up = schedule::Step {
                at: std::time::Duration::ZERO,
                target,
                action: schedule::LinkAction::Up,
            };
            run_steps(&info, &[up], log)
        }
    }
}

fn run_steps(
    info: &TestbedInfo,
    steps: &[schedule::Step],
    log: Option<PathBuf>,
) -> Result<(), String> {
    let mut log_file = match &log {
        Some(path) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| format!("cannot open log {}: {e}", path.display()))?,
        ),
        None => None,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let entries = fail::run(
        info,
        steps,
        Instant::now(),
        |e: &LogEntry| {
            let status = e.error.as_deref().unwrap_or("ok");
            println!(
                "t={:>9.1} ms  unix_ms={:.1}  {:<22} {}/{} {:<4} {}",
                e.t_ms, e.unix_ms, e.target, e.netns, e.dev, e.action, status
            );
            if let Some(f) = log_file.as_mut() {
                if let Ok(line) = serde_json::to_string(e) {
                    let _ = writeln!(f, "{line}");
                }
            }
        },
        || stop.load(Ordering::Relaxed),
    );
    let failed: Vec<&LogEntry> = entries.iter().filter(|e| e.error.is_some()).collect();
    if let Some(first) = failed.first() {
        return Err(format!(
            "{} of {} actions failed; first: {} {} on {}/{}: {}",
            failed.len(),
            entries.len(),
            first.action,
            first.target,
            first.netns,
            first.dev,
            first.error.as_deref().unwrap_or("")
        ));
    }
    Ok(())
}

/// The goals of a scenario as lines: met, MISSED, or left out where one does not apply;
/// "zero data errors" says when nothing was checked.
fn print_goals(result: &scenario::ScenarioResult) {
    let g = &result.goals;
    let unchecked = result.figures.bytes_checked == 0 && result.figures.notifications_checked == 0;
    let goals = [
        ("fallback latency p50 <= 1 ms", g.fallback_p50_le_1ms),
        ("fallback latency p99 <= 5 ms", g.fallback_p99_le_5ms),
        (
            "traffic on the backup <= 20 ms after the failure (p50)",
            g.backup_traffic_le_20ms,
        ),
        ("zero data errors", g.zero_data_errors),
        ("the failover run ended without an error", g.run_survived),
        (
            "the --no-failover baseline stopped at the failure",
            g.baseline_stopped,
        ),
    ];
    for (what, met) in goals {
        match met {
            Some(true) if what == "zero data errors" && unchecked => {
                println!("  goal: {what}: not checked (the apps ran without --check)")
            }
            Some(met) => println!("  goal: {what}: {}", if met { "met" } else { "MISSED" }),
            None => {}
        }
    }
}

fn print_topology(info: &TestbedInfo) {
    println!("testbed {:?} up (rail MTU {})", info.prefix, info.mtu);
    for h in &info.hosts {
        println!(
            "  host {} ({}) netns {}  mgmt {} {}",
            h.name, h.role, h.netns, h.mgmt_if, h.mgmt_addr
        );
        for n in &h.nics {
            println!(
                "    {} {}/{}  rail {} -> {} port {}  device {}",
                n.name, n.addr, n.prefix_len, n.rail, n.switch_netns, n.switch_port, n.device
            );
        }
    }
    for s in &info.switches {
        println!(
            "  rail switch {} netns {} bridge {} ports {}",
            s.rail,
            s.netns,
            s.bridge,
            s.ports.join(",")
        );
    }
    println!(
        "  management netns {} bridge {} addr {}",
        info.mgmt.netns, info.mgmt.bridge, info.mgmt.addr
    );
    println!("  hugepages reserved: {}", info.hugepages_total);
    for h in &info.hosts {
        println!(
            "  fault channel of host {} (an app started with --fault-fifo reads it): {}",
            h.name,
            faults::channel_path(info, h.role).display()
        );
    }
    println!(
        "  state: {}",
        TestbedInfo::state_path(&info.prefix).display()
    );
}

fn write_json(path: &PathBuf, value: &impl serde::Serialize) -> Result<(), String> {
    let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("shift-testbed").chain(args.iter().copied()))
    }

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn fail_help_names_every_target_the_docs_describe() {
        let mut cmd = Cli::command();
        let fail = cmd.find_subcommand_mut("fail").expect("fail");
        let help = fail.render_long_help().to_string();
        for name in [
            "initiator-nic0|1",
            "responder-nic0|1",
            "switch0|1-port",
            "switch0|1-port-b",
            "both-nic0|1",
            "initiator-dev-dead",
            "responder-dev-dead",
            "initiator-dev1-dead",
            "responder-dev1-dead",
            "initiator-dev-qps-failed",
            "responder-dev-qps-failed",
            "initiator-dev1-qps-failed",
            "responder-dev1-qps-failed",
        ] {
            assert!(help.contains(name), "{name} missing from:\n{help}");
        }
        // And each of them parses.
        for name in [
            "initiator-nic1",
            "switch1-port-b",
            "both-nic0",
            "initiator-dev1-dead",
            "responder-dev-qps-failed",
        ] {
            assert!(FailTarget::parse(name, None).is_ok(), "{name}");
        }
    }

    #[test]
    fn an_unknown_target_is_refused_before_the_testbed_is_read() {
        for command in ["fail", "restore"] {
            let cli =
                parse(&["--prefix", "no-such-testbed", command, "--target", "bogus"]).unwrap();
            let e = run(cli).unwrap_err();
            assert!(e.starts_with("unknown failure target \"bogus\""), "{e}");
        }
    }

    #[test]
    fn restore_is_for_links_only() {
        let cli = parse(&[
            "--prefix",
            "no-such-testbed",
            "restore",
            "--target",
            "initiator-dev-dead",
        ])
        .unwrap();
        let e = run(cli).unwrap_err();
        assert!(e.contains("is not a link"), "{e}");
    }

    #[test]
    fn soak_takes_target_sets_several_up_ranges_and_overlap() {
        let cli = parse(&[
            "scenario",
            "soak",
            "--targets",
            "all",
            "--up",
            "300ms..600ms,1.2s..1.6s",
            "--overlap",
            "0.3",
            "-u",
            "12",
            "-q",
            "8",
        ])
        .unwrap();
        let Command::Scenario { args, .. } = cli.command else {
            panic!("not a scenario");
        };
        let o = args.options(ScenarioName::Soak).unwrap();
        assert_eq!((o.qps, o.qp_timeout), (Some(8), Some(12)));
        assert_eq!(o.targets, TargetSet::All);
        assert_eq!(o.up_ranges.len(), 2);
        assert_eq!(o.overlap(), 0.3);
        assert_eq!(o.rc_budget(), testbed::paths::rc_retry_budget(12, 7));
        assert!(parse(&["scenario", "soak", "--targets", "nic9"]).is_err());
        assert!(parse(&["scenario", "soak", "--overlap", "2"]).is_err());
    }

    #[test]
    fn the_apps_q_and_u_after_the_dashes_are_refused_naming_the_testbed_flag() {
        for (extra, flag) in [
            (&["-u", "12"][..], "--qp-timeout"),
            (&["--qp-timeout=12"][..], "--qp-timeout"),
            (&["-q8"][..], "--qp"),
            (&["--check", "--qp", "8"][..], "--qp"),
        ] {
            let mut argv = vec!["scenario", "soak", "--"];
            argv.extend_from_slice(extra);
            let Command::Scenario { args, .. } = parse(&argv).unwrap().command else {
                panic!("not a scenario");
            };
            let e = args.options(ScenarioName::Soak).unwrap_err();
            assert!(e.contains(flag), "{extra:?}: {e}");
        }
        assert!(parse(&["scenario", "soak", "-u", "32"]).is_err());
        assert!(parse(&["scenario", "soak", "-q", "0"]).is_err());
    }

    #[test]
    fn chaos_has_its_own_defaults_and_takes_the_cap_and_the_tolerance() {
        let scenario_options = |cli: Cli| {
            let Command::Scenario { args, name, .. } = cli.command else {
                panic!("not a scenario");
            };
            args.options(name).unwrap()
        };
        let o = scenario_options(parse(&["scenario", "chaos"]).unwrap());
        assert_eq!(o.name, ScenarioName::Chaos);
        assert_eq!(o.duration, std::time::Duration::from_secs(60));
        assert_eq!(o.max_both_down, std::time::Duration::from_secs(1));
        assert_eq!(o.tolerance, std::time::Duration::from_millis(4300));
        let o = scenario_options(
            parse(&[
                "scenario",
                "chaos",
                "--op",
                "read",
                "--max-both-down",
                "3s",
                "--tolerance",
                "10s",
                "--duration",
                "600s",
                "--seed",
                "4",
            ])
            .unwrap(),
        );
        assert_eq!(o.max_both_down, std::time::Duration::from_secs(3));
        assert_eq!(o.tolerance, std::time::Duration::from_secs(10));
        assert_eq!(o.duration, std::time::Duration::from_secs(600));
        assert_eq!((o.op, o.seed), (Op::Read, 4));
        // Other scenarios keep their defaults.
        let o = scenario_options(parse(&["scenario", "soak"]).unwrap());
        assert_eq!(o.duration, std::time::Duration::from_secs(6));
        assert!(parse(&["scenario", "chaos", "--tolerance", "soon"]).is_err());
    }

    #[test]
    fn qp_sweep_takes_a_list_of_counts() {
        let cli = parse(&["qp-sweep", "--qps", "1,16"]).unwrap();
        let Command::QpSweep { qps, name, .. } = cli.command else {
            panic!("not a sweep");
        };
        assert_eq!((qps, name), (vec![1, 16], ScenarioName::InitiatorNic));
        let cli = parse(&["qp-sweep"]).unwrap();
        let Command::QpSweep { qps, .. } = cli.command else {
            panic!("not a sweep");
        };
        assert_eq!(qps, sweep::DEFAULT_QPS.to_vec());
    }

    #[test]
    fn idle_lat_defaults_to_a_thousand_idle_qps_and_refuses_more_than_the_apps_take() {
        let cli = parse(&["idle-lat"]).unwrap();
        let Command::IdleLat {
            idle_qps, rounds, ..
        } = cli.command
        else {
            panic!("not idle-lat");
        };
        assert_eq!((idle_qps, rounds), (1000, 3));
        assert!(parse(&["idle-lat", "--idle-qps", "4095"]).is_ok());
        assert!(parse(&["idle-lat", "--idle-qps", "4096"]).is_err());
        assert!(parse(&["idle-lat", "--idle-qps", "0"]).is_err());
    }

    #[test]
    fn fail_takes_the_new_target_names() {
        let cli = parse(&["fail", "--target", "both-nic0", "--duration", "300ms"]).unwrap();
        let Command::Fail { target, .. } = cli.command else {
            panic!("not fail");
        };
        assert_eq!(
            FailTarget::parse(&target, None),
            Ok(FailTarget::BothNics { rail: 0 })
        );
    }
}
