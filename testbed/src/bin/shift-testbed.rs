//! `shift-testbed`: build the namespace testbed, inject failures, run the paper's scenarios.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use clap::{Parser, Subcommand};
use testbed::fail::{self, FailKind, LogEntry, Schedule};
use testbed::scenario::{self, Op, ScenarioName, ScenarioOptions, Variants};
use testbed::topology::{self, Role, TestbedInfo, TopologySpec};

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
        #[arg(long, default_value = "2s", value_parser = fail::parse_duration)]
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
        /// initiator-nic, responder-nic, switch-port, flap, soak or allreduce.
        name: ScenarioName,
        /// Traffic of the bandwidth scenarios: write, send or read.
        #[arg(long, default_value = "write")]
        op: Op,
        /// Write the result (figures, timeline, both runs, ratios) as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Draw the bandwidth timeline with the failure windows to this PNG.
        #[arg(long)]
        plot: Option<PathBuf>,
        /// Message size in bytes.
        #[arg(long, short = 's', default_value_t = 65536)]
        size: usize,
        /// Run length (at least the schedule plus two seconds).
        #[arg(long, default_value = "6s", value_parser = fail::parse_duration)]
        duration: std::time::Duration,
        /// When the failure happens, from the client's start.
        #[arg(long, default_value = "2s", value_parser = fail::parse_duration)]
        fail_at: std::time::Duration,
        /// How long the failure lasts.
        #[arg(long, default_value = "2s", value_parser = fail::parse_duration)]
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
        /// Range of down times in `flap` and `soak`.
        #[arg(long, default_value = "50ms..300ms", value_parser = fail::parse_range)]
        down: (std::time::Duration, std::time::Duration),
        /// Range of up times in `flap` and `soak`.
        #[arg(long, default_value = "1200ms..1600ms", value_parser = fail::parse_range)]
        up: (std::time::Duration, std::time::Duration),
        /// Seed of the `flap` and `soak` schedules.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Timeline interval of the apps, in milliseconds.
        #[arg(long, default_value_t = 100)]
        timeline_ms: u64,
        /// Skip measuring the medium and the 8-byte write latency.
        #[arg(long)]
        no_baseline: bool,
        /// Where the apps' binaries are (default: beside this binary).
        #[arg(long)]
        apps_dir: Option<PathBuf>,
        /// Where reports and logs of the runs go.
        #[arg(long, default_value = "out")]
        out_dir: PathBuf,
        /// Out-of-band TCP port of the apps.
        #[arg(long, default_value_t = 18515)]
        port: u16,
        /// Hold-down of the apps' QPs before a switch-back (default: the pmd's 1s).
        #[arg(long, value_parser = fail::parse_duration)]
        holddown: Option<std::time::Duration>,
        /// Print the failover run's timeline and failover events after the summary.
        #[arg(long)]
        print_timeline: bool,
        /// Extra arguments passed to both apps, after `--`.
        #[arg(last = true)]
        extra: Vec<String>,
    },
    /// Cut and restore links: once, for a while, or on a flapping schedule.
    Fail {
        /// initiator-nic, responder-nic or switch-port.
        #[arg(long)]
        target: FailKind,
        /// The rail (0 is every host's default NIC).
        #[arg(long, default_value_t = 0)]
        rail: u8,
        /// For switch-port: which host's port (a or b).
        #[arg(long, default_value = "a")]
        port: String,
        /// When the (first) failure happens, from now.
        #[arg(long, default_value = "0s", value_parser = fail::parse_duration)]
        at: std::time::Duration,
        /// How long the link stays down; without it (and without --flap) it stays down.
        #[arg(long, value_parser = fail::parse_duration)]
        duration: Option<std::time::Duration>,
        /// Flap this many times instead of failing once.
        #[arg(long)]
        flap: Option<u32>,
        /// Range of down times when flapping.
        #[arg(long, default_value = "50ms..300ms", value_parser = fail::parse_range)]
        down: (std::time::Duration, std::time::Duration),
        /// Range of up times between flaps.
        #[arg(long, default_value = "200ms..500ms", value_parser = fail::parse_range)]
        up: (std::time::Duration, std::time::Duration),
        /// Seed of the flapping schedule.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Append every action as a JSON line to this file.
        #[arg(long)]
        log: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
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
            op,
            json,
            plot,
            size,
            duration,
            fail_at,
            down_for,
            failover_only,
            no_failover,
            flaps,
            failures,
            down,
            up,
            seed,
            timeline_ms,
            no_baseline,
            apps_dir,
            out_dir,
            port,
            holddown,
            print_timeline,
            extra,
        } => {
            let info = TestbedInfo::load(&cli.prefix).map_err(|e| e.to_string())?;
            let mut o = ScenarioOptions::new(name);
            o.op = op;
            o.size = size;
            o.duration = duration;
            o.fail_at = fail_at;
            o.down_for = down_for;
            if failover_only {
                o.variants = Variants::Failover;
            } else if no_failover {
                o.variants = Variants::NoFailover;
            }
            o.flaps = flaps;
            o.soak_failures = failures;
            o.down_range = down;
            o.up_range = up;
            o.seed = seed;
            o.timeline_ms = timeline_ms;
            if no_baseline {
                o.with_baseline = false;
            }
            if let Some(dir) = apps_dir {
                o.apps_dir = dir;
            }
            o.out_dir = out_dir;
            o.port = port;
            o.extra_args = extra;
            if holddown.is_some() {
                o.holddown = holddown;
            }
            let mut on_log = |e: &LogEntry| {
                println!(
                    "  [fail] t={:>8.1} ms {} {} {}",
                    e.t_ms,
                    e.target,
                    e.action,
                    e.error.as_deref().unwrap_or("ok")
                );
            };
            let result = scenario::run(&info, &o, &mut on_log).map_err(|e| e.to_string())?;
            if print_timeline {
                scenario::print_timeline(&result);
            }
            scenario::print_summary(&result);
            if let Some(path) = json {
                let text = serde_json::to_string_pretty(&result).map_err(|e| e.to_string())?;
                std::fs::write(&path, text)
                    .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
                println!("  result: {}", path.display());
            }
            if let Some(path) = plot {
                scenario::plot(&result, &path).map_err(|e| e.to_string())?;
                println!("  plot: {}", path.display());
            }
            result.verdict()
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
            let info = TestbedInfo::load(&cli.prefix).map_err(|e| e.to_string())?;
            if usize::from(rail) >= info.hosts[0].nics.len() {
                return Err(format!(
                    "no rail {rail}: this testbed has rails 0..{}",
                    info.hosts[0].nics.len()
                ));
            }
            let mut target = target.on_rail(rail);
            if let fail::FailTarget::SwitchPort { host, .. } = &mut target {
                *host = match port.as_str() {
                    "a" => Role::Initiator,
                    "b" => Role::Responder,
                    other => return Err(format!("bad --port {other:?}: use a or b")),
                };
            }
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
            run_schedule(&info, &schedule, log)
        }
    }
}

fn run_schedule(
    info: &TestbedInfo,
    schedule: &Schedule,
    log: Option<PathBuf>,
) -> Result<(), String> {
    let steps = schedule.steps();
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
        &steps,
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
    println!(
        "  state: {}",
        TestbedInfo::state_path(&info.prefix).display()
    );
}

fn write_json(path: &PathBuf, info: &TestbedInfo) -> Result<(), String> {
    let text = serde_json::to_string_pretty(info).map_err(|e| e.to_string())?;
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}
