//! The paper's scenarios on the testbed: a failure injected under traffic between the two
//! hosts, with and without failover, measured against the medium in the same run.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::Serialize;

use crate::apprun::{self, AppRunError, PairOutcome, PairSpec};
use crate::baseline::{self, Baseline};
use crate::chaos::{self, ChaosReport};
use crate::fail::{self, LogEntry};
use crate::faults;
use crate::linkwatch::{LinkChange, LinkWatch};
use crate::paths;
use crate::plot;
use crate::report::{self, Figures};
use crate::schedule::{LinkAction, Schedule, TimeRange};
use crate::target::{FailTarget, TargetSet};
use crate::topology::{Role, TestbedInfo};

/// The scenarios `shift-testbed scenario` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScenarioName {
    /// The initiator's default NIC fails and recovers.
    InitiatorNic,
    /// The responder's default NIC fails and recovers.
    ResponderNic,
    /// The rail-0 switch port facing the initiator fails and recovers.
    SwitchPort,
    /// The initiator's default NIC flaps, with every byte checked.
    Flap,
    /// Random failures of all three kinds, with every byte and notification checked.
    Soak,
    /// The ring allreduce with a NIC failure mid-run, every result checked.
    Allreduce,
    /// The initiator's default device dies silently (no CQEs, no packets, the netdev stays
    /// up) through the client's fault channel, with every byte checked (issue 14).
    InitiatorDevDead,
    /// Both rails' links fail at random, independently and overlapping, under checked
    /// WRITE, SEND or READ traffic; losses are judged against the outage tolerance.
    Chaos,
}

impl FromStr for ScenarioName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "initiator-nic" => ScenarioName::InitiatorNic,
            "responder-nic" => ScenarioName::ResponderNic,
            "switch-port" => ScenarioName::SwitchPort,
            "flap" => ScenarioName::Flap,
            "soak" => ScenarioName::Soak,
            "allreduce" => ScenarioName::Allreduce,
            "initiator-dev-dead" => ScenarioName::InitiatorDevDead,
            "chaos" => ScenarioName::Chaos,
            other => {
                return Err(format!(
                "unknown scenario {other:?}: use initiator-nic, responder-nic, switch-port, flap, soak, allreduce, initiator-dev-dead or chaos"
            ))
            }
        })
    }
}

/// Traffic of the bandwidth scenarios.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// `shift_write_bw`
    Write,
    /// `shift_send_bw`
    Send,
    /// `shift_read_bw`
    Read,
}

impl FromStr for Op {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "write" => Ok(Op::Write),
            "send" => Ok(Op::Send),
            "read" => Ok(Op::Read),
            other => Err(format!("unknown --op {other:?}: use write, send or read")),
        }
    }
}

impl Op {
    fn tool(self) -> &'static str {
        match self {
            Op::Write => "shift_write_bw",
            Op::Send => "shift_send_bw",
            Op::Read => "shift_read_bw",
        }
    }
}

/// Which runs a scenario makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variants {
    /// With failover and the `--no-failover` baseline.
    Both,
    /// With failover only.
    Failover,
    /// The `--no-failover` baseline only.
    NoFailover,
}

/// How often a `soak` failure overlaps the previous one when the targets are not the
/// default set and `--overlap` is not given.
pub const DEFAULT_OVERLAP: f64 = 0.25;

/// The apps' `retry_cnt` (`QpAttr::rts`'s default; no flag changes it).
const APPS_RETRY_CNT: u8 = 7;
/// The apps' default `-u/--qp-timeout` (4.096 us x 2^14 = 67 ms).
const APPS_QP_TIMEOUT: u8 = 14;

/// Everything a scenario run is parameterised by.
#[derive(Debug, Clone)]
pub struct ScenarioOptions {
    /// Which scenario.
    pub name: ScenarioName,
    /// Traffic for the bandwidth scenarios.
    pub op: Op,
    /// Message size in bytes.
    pub size: usize,
    /// Run length of the bandwidth scenarios.
    pub duration: Duration,
    /// When the failure happens, from the client's start.
    pub fail_at: Duration,
    /// How long the failure lasts.
    pub down_for: Duration,
    /// Which runs.
    pub variants: Variants,
    /// Flaps in `flap`.
    pub flaps: u32,
    /// Failures in `soak`.
    pub soak_failures: u32,
    /// Range of down times for `flap` and `soak`.
    pub down_range: TimeRange,
    /// Ranges of up times between failures for `flap` and `soak`: each failure draws one,
    /// then a time in it.
    pub up_ranges: Vec<TimeRange>,
    /// What `flap` and `soak` fail.
    pub targets: TargetSet,
    /// Probability that a `soak` failure starts while the previous one is still down;
    /// `None`: 0 with `default-path`, [`DEFAULT_OVERLAP`] with any other set.
    pub overlap: Option<f64>,
    /// QPs per app (`-q`); `None` leaves the apps' default (1).
    pub qps: Option<u32>,
    /// Seed of the random schedules.
    pub seed: u64,
    /// Timeline interval of the apps.
    pub timeline_ms: u64,
    /// Measure the medium and the 8-byte write latency first, for ratios.
    pub with_baseline: bool,
    /// Where the apps' binaries are.
    pub apps_dir: PathBuf,
    /// Where reports, logs and the plot go.
    pub out_dir: PathBuf,
    /// Out-of-band TCP port.
    pub port: u16,
    /// Hold-down of the apps' resilient QPs before a switch-back (the apps' `--holddown`); `None`
    /// leaves the pmd's default (1 s).
    pub holddown: Option<Duration>,
    /// Extra arguments for both apps.
    pub extra_args: Vec<String>,
    /// `chaos`: the longest time both rails may be down together.
    pub max_both_down: Duration,
    /// `chaos`: how long no path may be up before a lost connection is excused.
    pub tolerance: Duration,
}

impl ScenarioOptions {
    /// The defaults of `name`: the paper's figure-5 timing (failure at 2 s, recovery at 4 s,
    /// 6 s run), 20 flaps of 50-300 ms, 200 soak failures, with up times of 1.2-1.6 s between
    /// them: longer than the pmd's 1 s hold-down, so every recovery ends in a switch-back and
    /// the next failure starts a new failover (with shorter up times the QP would stay on the
    /// backup through the whole schedule and test one failover only).
    /// `chaos` runs a minute by default, its links down 100 ms-2 s and up 300 ms-3 s at a
    /// time, both rails down together for at most 1 s, judged against a 4.3 s tolerance.
    pub fn new(name: ScenarioName) -> ScenarioOptions {
        let chaos = name == ScenarioName::Chaos;
        ScenarioOptions {
            name,
            op: Op::Write,
            size: 65536,
            duration: Duration::from_secs(if chaos { 60 } else { 6 }),
            fail_at: Duration::from_secs(2),
            down_for: Duration::from_secs(2),
            variants: match name {
                ScenarioName::InitiatorNic
                | ScenarioName::ResponderNic
                | ScenarioName::SwitchPort => Variants::Both,
                // Without failover a silently dead device leaves the client waiting for
                // completions that never come, until the testbed kills it.
                _ => Variants::Failover,
            },
            flaps: 20,
            soak_failures: 200,
            down_range: if chaos {
                (Duration::from_millis(100), Duration::from_secs(2))
            } else {
                (Duration::from_millis(50), Duration::from_millis(300))
            },
            up_ranges: if chaos {
                vec![(Duration::from_millis(300), Duration::from_secs(3))]
            } else {
                vec![(Duration::from_millis(1200), Duration::from_millis(1600))]
            },
            targets: TargetSet::Default,
            overlap: None,
            qps: None,
            seed: 1,
            timeline_ms: 100,
            with_baseline: matches!(
                name,
                ScenarioName::InitiatorNic | ScenarioName::ResponderNic | ScenarioName::SwitchPort
            ),
            apps_dir: apprun::default_apps_dir(),
            out_dir: PathBuf::from("out"),
            port: 18515,
            holddown: None,
            extra_args: Vec::new(),
            max_both_down: chaos::DEFAULT_MAX_BOTH_DOWN,
            tolerance: chaos::DEFAULT_TOLERANCE,
        }
    }

    fn tool(&self) -> &'static str {
        match self.name {
            ScenarioName::Allreduce => "shift_allreduce",
            // Soak and flap check every byte and notification: write data + write-with-imm.
            ScenarioName::Soak | ScenarioName::Flap => "shift_write_bw",
            _ => self.op.tool(),
        }
    }

    fn checks_data(&self) -> bool {
        matches!(
            self.name,
            ScenarioName::Flap
                | ScenarioName::Soak
                | ScenarioName::Allreduce
                | ScenarioName::InitiatorDevDead
                | ScenarioName::Chaos
        )
    }

    /// The targets `flap` and `soak` draw from when `--targets` is `default`: every kind
    /// ([`TargetSet::ALL`]) since the pmd survives them (issue 15).
    fn default_targets(&self) -> Vec<FailTarget> {
        match self.name {
            ScenarioName::Soak | ScenarioName::Flap => TargetSet::ALL.to_vec(),
            _ => self.default_path_targets(),
        }
    }

    /// The targets of `--targets default-path`: what `flap` and `soak` drew from before the
    /// backup rail could fail.
    fn default_path_targets(&self) -> Vec<FailTarget> {
        match self.name {
            ScenarioName::Soak => vec![
                FailTarget::InitiatorNic { rail: 0 },
                FailTarget::ResponderNic { rail: 0 },
                FailTarget::SwitchPort {
                    rail: 0,
                    host: Role::Initiator,
                },
            ],
            _ => vec![FailTarget::InitiatorNic { rail: 0 }],
        }
    }

    /// The overlap probability of `soak` (see [`ScenarioOptions::overlap`]).
    pub fn overlap(&self) -> f64 {
        self.overlap.unwrap_or(match self.targets {
            TargetSet::DefaultPath => 0.0,
            _ => DEFAULT_OVERLAP,
        })
    }

    /// The failure schedule, relative to the start of the client's traffic.
    pub fn schedule(&self) -> Schedule {
        let once = |target: FailTarget| Schedule::Once {
            target,
            at: self.fail_at,
            duration: Some(self.down_for),
        };
        let targets = self
            .targets
            .resolve(&self.default_targets(), &self.default_path_targets());
        match self.name {
            ScenarioName::InitiatorNic | ScenarioName::Allreduce => {
                once(FailTarget::InitiatorNic { rail: 0 })
            }
            ScenarioName::ResponderNic => once(FailTarget::ResponderNic { rail: 0 }),
            ScenarioName::SwitchPort => once(FailTarget::SwitchPort {
                rail: 0,
                host: Role::Initiator,
            }),
            ScenarioName::InitiatorDevDead => Schedule::Once {
                target: FailTarget::DeviceDead {
                    host: Role::Initiator,
                    rail: 0,
                },
                at: self.fail_at,
                duration: None,
            },
            // One target flaps as it always did; several are drawn from, in sequence.
            ScenarioName::Flap if targets.len() == 1 => Schedule::Flap {
                target: targets[0],
                start: self.fail_at,
                count: self.flaps,
                down: self.down_range,
                up: self.up_ranges.clone(),
                seed: self.seed,
            },
            ScenarioName::Flap => Schedule::Random {
                targets,
                start: self.fail_at,
                count: self.flaps,
                down: self.down_range,
                up: self.up_ranges.clone(),
                overlap: 0.0,
                seed: self.seed,
            },
            ScenarioName::Soak => Schedule::Random {
                targets,
                start: self.fail_at,
                count: self.soak_failures,
                down: self.down_range,
                up: self.up_ranges.clone(),
                overlap: self.overlap(),
                seed: self.seed,
            },
            // Failures stop starting two seconds before the run's end, for the last recovery.
            ScenarioName::Chaos => Schedule::Chaos {
                start: self.fail_at,
                until: self
                    .duration
                    .saturating_sub(Duration::from_secs(2))
                    .max(self.fail_at),
                down: self.down_range,
                up: self.up_ranges.clone(),
                max_both_down: self.max_both_down,
                seed: self.seed,
            },
        }
    }

    /// The last value the extra arguments give an app flag (`-u 12`, `--qp-timeout 12`,
    /// `--qp-timeout=12`).
    fn extra_arg<T: FromStr>(&self, short: &str, long: &str) -> Option<T> {
        let mut found = None;
        let mut args = self.extra_args.iter();
        while let Some(a) = args.next() {
            let value = if a == short || a == long {
                args.next().map(String::as_str)
            } else {
                a.strip_prefix(long).and_then(|rest| rest.strip_prefix('='))
            };
            if let Some(v) = value.and_then(|v| v.parse().ok()) {
                found = Some(v);
            }
        }
        found
    }

    /// The RC retry budget of the apps' QPs: their `-u/--qp-timeout` (from the extra
    /// arguments, else the apps' default 14) and their fixed `retry_cnt` of 7.
    pub fn rc_budget(&self) -> Duration {
        let timeout = self
            .extra_arg("-u", "--qp-timeout")
            .unwrap_or(APPS_QP_TIMEOUT);
        paths::rc_retry_budget(timeout, APPS_RETRY_CNT)
    }

    /// QPs per app: [`ScenarioOptions::qps`], or `-q` among the extra arguments.
    fn qps_asked(&self) -> u32 {
        self.qps
            .or_else(|| self.extra_arg("-q", "--qp"))
            .unwrap_or(1)
    }

    /// Hosts whose application must read a fault channel: those with a device that dies or
    /// fails its QPs.
    fn fault_hosts(&self) -> Vec<Role> {
        let mut hosts = Vec::new();
        for step in self.schedule().steps() {
            if let Some(host) = step.target.fault_host() {
                if !hosts.contains(&host) {
                    hosts.push(host);
                }
            }
        }
        hosts
    }

    /// How long the pair may take to set up before its traffic starts: many QPs take a
    /// while (rendezvous and shadow verbs for each).
    fn setup_allowance(&self) -> Duration {
        Duration::from_secs(20) + Duration::from_millis(50) * self.qps_asked()
    }

    /// How long the traffic runs: the configured duration, or long enough to outlast the
    /// schedule plus two seconds of recovery.
    pub fn run_length(&self) -> Duration {
        let last = self
            .schedule()
            .steps()
            .last()
            .map(|s| s.at)
            .unwrap_or_default();
        self.duration.max(last + Duration::from_secs(2))
    }
}

/// Why a scenario failed to run (not: why the driver failed a check; that is in the result).
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The application pair could not be run.
    #[error(transparent)]
    App(#[from] AppRunError),
    /// The baseline could not be measured.
    #[error("baseline: {0}")]
    Baseline(#[from] crate::medium::MediumError),
    /// The testbed's links did not all come up.
    #[error("the testbed is not ready: {detail}")]
    Links {
        /// Which links stayed down.
        detail: String,
    },
    /// The output could not be written.
    #[error("writing {path}: {detail}")]
    Output {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
}

/// One run (with or without failover) of a scenario.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    /// Whether failover was on.
    pub failover: bool,
    /// The figures.
    #[serde(flatten)]
    pub figures: Figures,
    /// The error that stopped the client, if one did.
    pub error: Option<String>,
    /// Whether the client exited successfully.
    pub client_ok: bool,
    /// Every failure action taken.
    pub failures: Vec<LogEntry>,
    /// The schedule's steps not taken because the client had exited, at their planned
    /// times (lost connections are judged against the whole schedule).
    pub not_reached: Vec<LogEntry>,
    /// Every change of a rail link's state the kernel reported during the schedule.
    pub link_reports: Vec<LinkChange>,
    /// The client's whole report.
    pub client_report: serde_json::Value,
    /// The server's whole report, when it wrote one.
    pub server_report: Option<serde_json::Value>,
}

/// Ratios against the medium, measured in the same run.
#[derive(Debug, Clone, Serialize)]
pub struct Ratios {
    /// The medium.
    pub medium: Baseline,
    /// 8-byte WRITE latency p50 (one way, as `shift_write_lat` reports it).
    pub write_lat_p50_us: Option<f64>,
    /// `write_lat_p50_us` / raw UDP one-way p50 (busy-polled). Goal: <= 1.5.
    pub lat_ratio: Option<f64>,
    /// Bandwidth before the failure / raw UDP stream goodput. Goal: >= 0.5.
    pub bw_ratio: Option<f64>,
}

/// What `scenario --json` writes: the failover run's figures at the top level.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioResult {
    /// The scenario.
    pub scenario: ScenarioName,
    /// Traffic.
    pub op: Op,
    /// Binary used.
    pub tool: String,
    /// Message size.
    pub size: usize,
    /// Seed of the schedule.
    pub seed: u64,
    /// The failover run's figures, flattened to the top level.
    #[serde(flatten)]
    pub figures: Figures,
    /// The failover run's timeline (client side).
    pub timeline: serde_json::Value,
    /// The failover run, whole.
    pub with_failover: Option<RunResult>,
    /// The `--no-failover` run, whole.
    pub no_failover: Option<RunResult>,
    /// Ratios to the medium.
    pub baseline: Option<Ratios>,
    /// Whether every goal that applies was met.
    pub goals: Goals,
    /// `chaos`: the windows without any path and each loss judged against the tolerance.
    pub chaos: Option<ChaosReport>,
}

/// The goals for failover on this testbed, each `None` where it does not apply.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Goals {
    /// Fallback latency p50 <= 1 ms.
    pub fallback_p50_le_1ms: Option<bool>,
    /// Fallback latency p99 <= 5 ms.
    pub fallback_p99_le_5ms: Option<bool>,
    /// Traffic on the backup <= 20 ms after link-down (p50 over failures).
    pub backup_traffic_le_20ms: Option<bool>,
    /// Zero data errors.
    pub zero_data_errors: Option<bool>,
    /// The failover run completed without an error reaching the application.
    pub run_survived: Option<bool>,
    /// The no-failover baseline stopped at the failure, as standard RDMA does.
    pub baseline_stopped: Option<bool>,
}

fn common_args(o: &ScenarioOptions, failover: bool) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "-d".into(),
        "soft:nic0".into(),
        "--backup-dev".into(),
        "soft:nic1".into(),
        "-s".into(),
        o.size.to_string(),
        "-D".into(),
        format!("{}", o.run_length().as_secs_f64().ceil() as u64),
        "--timeline-ms".into(),
        o.timeline_ms.to_string(),
    ];
    if o.checks_data() {
        args.push("--check".into());
    }
    if !failover {
        args.push("--no-failover".into());
    }
    if let Some(h) = o.holddown {
        args.push("--holddown".into());
        args.push(format!("{}ms", h.as_millis()));
    }
    if let Some(q) = o.qps {
        args.push("-q".into());
        args.push(q.to_string());
    }
    args.extend(o.extra_args.iter().cloned());
    args
}

/// The fault channels of a run: created before the apps start, removed when it ends.
struct FaultChannels(Vec<(Role, PathBuf)>);

impl FaultChannels {
    fn create(info: &TestbedInfo, hosts: &[Role]) -> Result<FaultChannels, ScenarioError> {
        let mut made = FaultChannels(Vec::new());
        for &host in hosts {
            let path = faults::channel_path(info, host);
            faults::create(&path).map_err(|e| ScenarioError::Output {
                path: path.clone(),
                detail: e.to_string(),
            })?;
            made.0.push((host, path));
        }
        Ok(made)
    }

    /// `--fault-fifo PATH` for the application on `host`, if it has a channel.
    fn args_for(&self, host: Role) -> Vec<String> {
        self.0
            .iter()
            .filter(|(h, _)| *h == host)
            .flat_map(|(_, p)| ["--fault-fifo".to_owned(), p.display().to_string()])
            .collect()
    }
}

impl Drop for FaultChannels {
    fn drop(&mut self) {
        for (_, path) in &self.0 {
            faults::remove(path);
        }
    }
}

/// Runs the pair once with the failure schedule alongside, timed from the client's first
/// traffic.
fn run_once(
    info: &TestbedInfo,
    o: &ScenarioOptions,
    failover: bool,
    on_log: &mut (dyn FnMut(&LogEntry) + Send),
) -> Result<RunResult, ScenarioError> {
    let tag = if failover { "failover" } else { "no-failover" };
    // Each run starts on a settled testbed: nothing a previous run's processes queued, and
    // every link operationally up (a link brought up reports it up to a second later, the
    // kernel's link watch, and a device opened before then starts with its port down).
    fail::forget_neighbours(info).map_err(|detail| ScenarioError::Links { detail })?;
    fail::wait_all_up(info, Duration::from_secs(5))
        .map_err(|detail| ScenarioError::Links { detail })?;
    let channels = FaultChannels::create(info, &o.fault_hosts())?;
    let spec = PairSpec {
        tool: o.tool().to_owned(),
        apps_dir: o.apps_dir.clone(),
        common_args: common_args(o, failover),
        client_args: channels.args_for(Role::Initiator),
        server_args: channels.args_for(Role::Responder),
        port: o.port,
        out_dir: o.out_dir.clone(),
        tag: format!("{}-{tag}", scenario_slug(o.name)),
        client_timeout: o.run_length() + o.setup_allowance() + Duration::from_secs(30),
    };
    let steps = o.schedule().steps();
    // From here every rail link is up; what the kernel reports from now on judges the
    // losses (a link set up counts from when it is reported running).
    let watch = LinkWatch::start(info).map_err(|detail| ScenarioError::Links { detail })?;
    let mut pair = apprun::start(info, &spec)?;
    let start = pair.wait_for_traffic(o.setup_allowance());
    let start_unix_ms = fail::unix_ms_now() - start.elapsed().as_secs_f64() * 1e3;
    let stop = AtomicBool::new(false);
    let log = std::thread::scope(|scope| {
        let runner = scope.spawn(|| {
            fail::run(
                info,
                &steps,
                start,
                |e| on_log(e),
                || stop.load(Ordering::Relaxed),
            )
        });
        // Without failover the client stops at the first failure; the schedule can stop too.
        while !runner.is_finished() {
            if pair.client_exited() {
                stop.store(true, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        runner.join().unwrap_or_default()
    });
    let link_reports = watch.finish();
    fail::restore_all(info);
    let PairOutcome {
        client,
        client_raw,
        server,
        server_raw,
        client_exit,
    } = pair.finish()?;
    drop(channels);
    let not_reached = fail::not_reached(info, &steps[log.len().min(steps.len())..], start_unix_ms);
    let figures = report::figures(
        &client,
        server.as_ref(),
        &log,
        &not_reached,
        &link_reports,
        o.timeline_ms as f64,
        o.rc_budget().as_secs_f64() * 1e3,
    );
    Ok(RunResult {
        failover,
        figures,
        error: client.error.clone(),
        client_ok: client_exit.is_some_and(|s| s.success()),
        failures: log,
        not_reached,
        link_reports,
        client_report: client_raw,
        server_report: server_raw,
    })
}

/// The scenario's name as the command line spells it.
pub fn scenario_slug(name: ScenarioName) -> &'static str {
    match name {
        ScenarioName::InitiatorNic => "initiator-nic",
        ScenarioName::ResponderNic => "responder-nic",
        ScenarioName::SwitchPort => "switch-port",
        ScenarioName::Flap => "flap",
        ScenarioName::Soak => "soak",
        ScenarioName::Allreduce => "allreduce",
        ScenarioName::InitiatorDevDead => "initiator-dev-dead",
        ScenarioName::Chaos => "chaos",
    }
}

fn measure_ratios(
    info: &TestbedInfo,
    o: &ScenarioOptions,
) -> Result<(Baseline, Option<f64>), ScenarioError> {
    let medium = baseline::measure(info, 0, 20_000, Duration::from_secs(2), None)?;
    let spec = PairSpec {
        tool: "shift_write_lat".to_owned(),
        apps_dir: o.apps_dir.clone(),
        common_args: vec![
            "-d".into(),
            "soft:nic0".into(),
            "-s".into(),
            "8".into(),
            "-n".into(),
            "20000".into(),
            "--poll".into(),
            "busy".into(),
        ],
        port: o.port,
        out_dir: o.out_dir.clone(),
        client_args: Vec::new(),
        server_args: Vec::new(),
        tag: "write-lat-8".into(),
        client_timeout: Duration::from_secs(60),
    };
    let lat = apprun::start(info, &spec)?
        .finish()
        .map(|out| out.client.lat_p50_us)
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "8-byte write latency run failed");
            None
        });
    Ok((medium, lat))
}

/// Runs scenario `o` on the testbed `info`; `on_log` sees every failure action as it happens.
pub fn run(
    info: &TestbedInfo,
    o: &ScenarioOptions,
    on_log: &mut (dyn FnMut(&LogEntry) + Send),
) -> Result<ScenarioResult, ScenarioError> {
    let ratios_input = if o.with_baseline {
        Some(measure_ratios(info, o)?)
    } else {
        None
    };
    let with_failover = match o.variants {
        Variants::Both | Variants::Failover => Some(run_once(info, o, true, on_log)?),
        Variants::NoFailover => None,
    };
    let no_failover = match o.variants {
        Variants::Both | Variants::NoFailover => Some(run_once(info, o, false, on_log)?),
        Variants::Failover => None,
    };
    let main = with_failover.as_ref().or(no_failover.as_ref());
    let figures = main.map(|r| r.figures.clone()).unwrap_or_default();
    let timeline = main
        .and_then(|r| r.client_report.get("timeline").cloned())
        .unwrap_or(serde_json::Value::Null);
    let baseline = ratios_input.map(|(medium, write_lat)| {
        let lat_ratio = write_lat.map(|l| l / medium.ping_pong_busy.one_way_p50_us);
        let bw_ratio = main
            .filter(|_| medium.stream.goodput_gbps > 0.0)
            .map(|r| r.figures.bw_before_gbps / medium.stream.goodput_gbps);
        Ratios {
            medium,
            write_lat_p50_us: write_lat,
            lat_ratio,
            bw_ratio,
        }
    });
    let goals = goals(with_failover.as_ref(), no_failover.as_ref());
    let chaos = main
        .filter(|_| o.name == ScenarioName::Chaos)
        .map(|r| chaos_report(o, r));
    Ok(ScenarioResult {
        scenario: o.name,
        op: o.op,
        tool: o.tool().to_owned(),
        size: o.size,
        seed: o.seed,
        figures,
        timeline,
        with_failover,
        no_failover,
        baseline,
        goals,
        chaos,
    })
}

/// Judges a `chaos` run's losses against the windows without any path.
fn chaos_report(o: &ScenarioOptions, r: &RunResult) -> ChaosReport {
    let whole: Vec<LogEntry> = r.failures.iter().chain(&r.not_reached).cloned().collect();
    let planned = match o.schedule() {
        Schedule::Chaos {
            start,
            until,
            down,
            up,
            max_both_down,
            seed,
        } => chaos::draw_failures(start, until, down, &up, max_both_down, seed),
        _ => Vec::new(),
    };
    chaos::judge(
        &whole,
        &r.link_reports,
        &r.figures.losses,
        o.tolerance,
        o.max_both_down,
        &planned,
    )
}

impl ScenarioResult {
    /// The correctness verdict: `Err` naming what went wrong when a run that checks data
    /// found an error, checked nothing, or stopped on an error although failover was on.
    /// Timing goals are measurements and only reported (see `goals`); correctness is not
    /// negotiable, so `shift-testbed scenario` exits non-zero on `Err` and prints the seed.
    pub fn verdict(&self) -> Result<(), String> {
        let mut wrong = Vec::new();
        if let Some(r) = &self.with_failover {
            if let Some(c) = &self.chaos {
                // A loss after no path had been up for the tolerance is allowed; any other
                // is the driver's.
                for l in c.losses.iter().filter(|l| !l.excused) {
                    wrong.push(format!(
                        "a connection was lost ({}) although no window without a path had \
                         lasted the {:.0} ms tolerance (longest before it {:.0} ms)",
                        l.cause, c.tolerance_ms, l.longest_no_path_before_ms
                    ));
                }
                if r.error.is_none() && !r.client_ok {
                    wrong.push("the failover run's client did not exit successfully".to_owned());
                }
            } else if let Some(e) = &r.error {
                wrong.push(format!("the failover run stopped on an error: {e}"));
            } else if !r.client_ok {
                wrong.push("the failover run's client did not exit successfully".to_owned());
            }
            if r.figures.data_errors > 0 {
                wrong.push(format!("{} data errors", r.figures.data_errors));
            }
            let checks = matches!(
                self.scenario,
                ScenarioName::Flap
                    | ScenarioName::Soak
                    | ScenarioName::Allreduce
                    | ScenarioName::InitiatorDevDead
                    | ScenarioName::Chaos
            );
            // READs have no notifications: what the client read is what it checked.
            let verified = match self.op {
                Op::Read
                    if matches!(
                        self.scenario,
                        ScenarioName::InitiatorDevDead | ScenarioName::Chaos
                    ) =>
                {
                    r.figures.bytes_checked
                }
                _ => r.figures.notifications_checked,
            };
            if checks && verified == 0 {
                wrong.push("the data check verified nothing".to_owned());
            }
            for e in r.failures.iter().filter(|e| e.error.is_some()) {
                wrong.push(format!(
                    "failure action {} {} failed: {}",
                    e.target,
                    e.action,
                    e.error.as_deref().unwrap_or_default()
                ));
            }
            wrong.extend(unapplied_faults(r));
        }
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "scenario {} (seed {}): {}",
                scenario_slug(self.scenario),
                self.seed,
                wrong.join("; ")
            ))
        }
    }
}

/// The device faults the testbed sent that the application did not report applying: a
/// fault that never happened tests nothing.
fn unapplied_faults(r: &RunResult) -> Vec<String> {
    let reports = [Some(&r.client_report), r.server_report.as_ref()];
    r.failures
        .iter()
        .filter(|e| e.error.is_none() && e.action == LinkAction::Down)
        .filter_map(|e| {
            let target = FailTarget::parse(&e.target, None).ok()?;
            let command = target.fault_command(&e.dev)?.to_string();
            let role = match target.fault_host()? {
                Role::Initiator => 0,
                Role::Responder => 1,
            };
            let acks: Vec<report::FaultAck> = reports[role]
                .and_then(|v| v.get("faults").cloned())
                .and_then(|v| serde_json::from_value(v).ok())
                .unwrap_or_default();
            // The same command may be sent several times (a device failing its QPs again):
            // each one sent needs an acknowledgement of its own.
            let sent_before = r
                .failures
                .iter()
                .take_while(|other| !std::ptr::eq(*other, e))
                .filter(|o| o.error.is_none() && o.action == LinkAction::Down)
                .filter(|o| o.target == e.target && o.dev == e.dev)
                .count();
            match acks
                .iter()
                .filter(|a| a.command == command)
                .nth(sent_before)
            {
                Some(a) if a.applied_unix_ms.is_some() => None,
                Some(a) => Some(format!(
                    "the application did not apply `{command}`: {}",
                    a.error.as_deref().unwrap_or("no reason given")
                )),
                None => Some(format!(
                    "the application did not report applying `{command}` (its JSON has no \
                     `faults` entry for it; docs/apps-json.md, fault channel)"
                )),
            }
        })
        .collect()
}

fn goals(with: Option<&RunResult>, without: Option<&RunResult>) -> Goals {
    let mut g = Goals::default();
    if let Some(r) = with {
        let f = &r.figures;
        g.fallback_p50_le_1ms = f.fallback_latency_us.p50.map(|v| v <= 1000.0);
        g.fallback_p99_le_5ms = f.fallback_latency_us.p99.map(|v| v <= 5000.0);
        g.backup_traffic_le_20ms = f.backup_traffic_ms.p50.map(|v| v <= 20.0);
        g.zero_data_errors = Some(f.data_errors == 0);
        g.run_survived = Some(r.client_ok && r.error.is_none());
    }
    if let Some(r) = without {
        g.baseline_stopped = Some(r.error.is_some());
    }
    g
}

/// Draws the failover run's timeline beside the `--no-failover` baseline's (or the one run
/// there is).
pub fn plot(result: &ScenarioResult, path: &std::path::Path) -> Result<(), plot::PlotError> {
    let run = result
        .with_failover
        .as_ref()
        .or(result.no_failover.as_ref())
        .ok_or(plot::PlotError::Empty)?;
    let client = |run: &RunResult| -> report::AppReport {
        serde_json::from_value(run.client_report.clone()).unwrap_or_default()
    };
    let report = client(run);
    let windows = report::windows(&run.failures);
    let baseline_run = result.no_failover.as_ref().filter(|_| run.failover);
    let baseline_report = baseline_run.map(client);
    let baseline = baseline_run
        .zip(baseline_report.as_ref())
        .map(|(b, report)| plot::Baseline {
            report,
            stopped: b.error.as_deref().map(stop_reason),
        });
    let what = match (run.failover, &baseline) {
        (true, Some(_)) => "): failover vs standard RDMA",
        (true, None) => ", failover on)",
        (false, _) => ", failover off)",
    };
    let title = format!(
        "{} ({} {} B{what}",
        scenario_slug(result.scenario),
        result.tool,
        result.size
    );
    plot::timeline_png(&report, baseline, &windows, &title, path)
}

/// The short form of a run's error for a legend: its work-completion status if it names one.
fn stop_reason(error: &str) -> &str {
    error
        .split(|c: char| !c.is_ascii_alphanumeric())
        .find(|w| w.ends_with("Err"))
        .unwrap_or(error)
}

/// Prints the failover run's timeline (one line per sample, with a bar for the bandwidth and
/// the failure windows marked) and its failover events.
pub fn print_timeline(result: &ScenarioResult) {
    let Some(run) = result
        .with_failover
        .as_ref()
        .or(result.no_failover.as_ref())
    else {
        return;
    };
    let report: report::AppReport =
        serde_json::from_value(run.client_report.clone()).unwrap_or_default();
    let windows = report::windows(&run.failures);
    let peak = report
        .timeline
        .iter()
        .map(|s| s.bw_gbps)
        .fold(0.0_f64, f64::max);
    println!(
        "timeline of the {} run (client, {} ms per line; `!` = link down):",
        if run.failover {
            "failover"
        } else {
            "no-failover"
        },
        result_timeline_ms(&report)
    );
    for s in &report.timeline {
        let down = windows
            .iter()
            .any(|w| s.unix_ms >= w.down && w.up.is_none_or(|u| s.unix_ms < u));
        let width = if peak > 0.0 {
            (s.bw_gbps / peak * 40.0).round() as usize
        } else {
            0
        };
        println!(
            "  {:>7.0} ms {:>7.2} Gb/s {} {:<13} {}",
            s.t_ms,
            s.bw_gbps,
            if down { '!' } else { ' ' },
            s.state,
            "#".repeat(width)
        );
    }
    let f = &report.failover;
    println!(
        "failover summary: {} failovers, {} switch-backs, {} WQEs retransmitted, {} skipped as delivered",
        f.failovers, f.switch_backs, f.wqes_retransmitted, f.wqes_skipped
    );
    for e in &f.events {
        let lat = e
            .fallback_latency_us
            .map_or(String::new(), |l| format!(", fallback latency {l:.0} us"));
        println!(
            "  {} ({}) on {}: {} WQEs copied, {} retransmitted, {} skipped{lat}",
            e.kind, e.cause, e.device, e.wqes_copied, e.wqes_retransmitted, e.wqes_skipped
        );
    }
}

fn result_timeline_ms(report: &report::AppReport) -> f64 {
    match report.timeline.as_slice() {
        [a, b, ..] => (b.t_ms - a.t_ms).round(),
        _ => 0.0,
    }
}

/// Prints the headline figures of a result.
pub fn print_summary(r: &ScenarioResult) {
    let f = &r.figures;
    let opt = |v: Option<f64>, unit: &str| v.map_or("n/a".to_owned(), |v| format!("{v:.2} {unit}"));
    println!(
        "scenario {} ({} {} B)",
        scenario_slug(r.scenario),
        r.tool,
        r.size
    );
    println!(
        "  bandwidth: before {:.2} Gb/s, during {:.2} Gb/s, after {:.2} Gb/s",
        f.bw_before_gbps, f.bw_during_gbps, f.bw_after_gbps
    );
    println!(
        "  detection {}, traffic on backup p50 {}, fallback latency p50 {} p99 {} ({} events), switch-back p50 {}",
        opt(f.detection_ms, "ms"),
        opt(f.backup_traffic_ms.p50, "ms"),
        opt(f.fallback_latency_us.p50, "us"),
        opt(f.fallback_latency_us.p99, "us"),
        f.fallback_latency_us.samples,
        opt(f.switchback_ms.p50, "ms"),
    );
    println!(
        "  failovers {}, switch-backs {}, failbacks to the default {}, backup re-arms {}, data errors {} ({} bytes and {} notifications checked)",
        f.failovers,
        f.switch_backs,
        f.failbacks,
        f.backup_rearms
            .map_or("n/a (not reported by the apps)".to_owned(), |n| n.to_string()),
        f.data_errors,
        f.bytes_checked,
        f.notifications_checked
    );
    println!(
        "  {} QP(s): all on the backup p50 {} ({} failures); connections lost {}, of which {} while a path was up within the RC retry budget",
        f.qps,
        opt(f.all_on_backup_ms.p50, "ms"),
        f.all_on_backup_ms.samples,
        f.connections_lost,
        f.connections_lost_with_path_up
    );
    if let Some(c) = &r.chaos {
        println!(
            "  chaos (seed {}): {} link failures, both rails down together at most {:.0} ms as planned (cap {:.0} ms); no path up by ip: {} windows, longest {:.0} ms ({:.0} ms counting links until the kernel reported them running)",
            r.seed,
            c.failures_planned,
            c.longest_planned_both_down_ms,
            c.max_both_down_ms,
            c.no_path_windows,
            c.longest_no_path_ms,
            c.longest_no_path_reported_ms
        );
        for l in &c.losses {
            println!(
                "  lost ({}) after a longest window without a path of {:.0} ms: {}",
                l.cause,
                l.longest_no_path_before_ms,
                if l.excused {
                    "excused, past the tolerance"
                } else {
                    "a failure, inside the tolerance"
                }
            );
        }
        println!(
            "  connections lost inside the {:.0} ms tolerance: {}",
            c.tolerance_ms, c.lost_within_tolerance
        );
    }
    if let Some(nf) = &r.no_failover {
        println!(
            "  --no-failover baseline: before {:.2} Gb/s, during {:.2} Gb/s, stopped with: {}",
            nf.figures.bw_before_gbps,
            nf.figures.bw_during_gbps,
            nf.error.as_deref().unwrap_or("(no error)")
        );
    }
    if let Some(b) = &r.baseline {
        println!(
            "  medium: UDP one-way p50 {:.2} us (busy), stream {:.2} Gb/s; write 8 B p50 {} (ratio {}), bandwidth ratio {}",
            b.medium.ping_pong_busy.one_way_p50_us,
            b.medium.stream.goodput_gbps,
            opt(b.write_lat_p50_us, "us"),
            b.lat_ratio.map_or("n/a".into(), |v| format!("{v:.2}")),
            b.bw_ratio.map_or("n/a".into(), |v| format!("{v:.2}")),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_runs_legend_names_its_completion_status() {
        let error = "work completion error: RetryExcErr (vendor syndrome 0x0) on write";
        assert_eq!(stop_reason(error), "RetryExcErr");
        assert_eq!(stop_reason("the server went away"), "the server went away");
    }

    #[test]
    fn figure_five_defaults_fail_at_two_and_recover_at_four() {
        let o = ScenarioOptions::new(ScenarioName::InitiatorNic);
        let steps = o.schedule().steps();
        assert_eq!(steps.len(), 2);
        assert_eq!(steps[0].at, Duration::from_secs(2));
        assert_eq!(steps[1].at, Duration::from_secs(4));
        assert_eq!(o.run_length(), Duration::from_secs(6));
        assert_eq!(o.variants, Variants::Both);
    }

    #[test]
    fn soak_and_flap_draw_from_every_kind_by_default() {
        for name in [ScenarioName::Soak, ScenarioName::Flap] {
            match ScenarioOptions::new(name).schedule() {
                Schedule::Random { targets, .. } => {
                    assert_eq!(targets, TargetSet::ALL.to_vec(), "{name:?}")
                }
                other => panic!("{name:?}: {other:?}"),
            }
        }
        let mut o = ScenarioOptions::new(ScenarioName::Soak);
        assert_eq!(o.overlap(), DEFAULT_OVERLAP);
        o.targets = TargetSet::DefaultPath;
        assert_eq!(o.overlap(), 0.0);
        assert!(o.schedule().steps().iter().all(|s| s.target.rail() == 0));
    }

    #[test]
    fn soak_runs_long_enough_for_all_its_failures_and_checks_data() {
        let mut o = ScenarioOptions::new(ScenarioName::Soak);
        o.targets = TargetSet::DefaultPath;
        let steps = o.schedule().steps();
        assert_eq!(steps.len(), 400);
        assert!(o.run_length() > steps.last().unwrap().at);
        let args = common_args(&o, true);
        assert!(args.contains(&"--check".to_owned()));
        // Up times outlast the pmd's 1 s hold-down: every recovery switches back.
        assert!(o.holddown.is_none() && o.up_ranges.iter().all(|r| r.0 > Duration::from_secs(1)));
        assert!(!args.contains(&"--no-failover".to_owned()));
    }

    #[test]
    fn the_baseline_variant_asks_for_no_failover() {
        let o = ScenarioOptions::new(ScenarioName::SwitchPort);
        assert!(common_args(&o, false).contains(&"--no-failover".to_owned()));
    }

    #[test]
    fn scenario_and_op_names_round_trip_and_unknown_ones_name_the_choices() {
        for name in [
            "initiator-nic",
            "responder-nic",
            "switch-port",
            "flap",
            "soak",
            "allreduce",
        ] {
            let parsed: ScenarioName = name.parse().unwrap();
            assert_eq!(scenario_slug(parsed), name);
        }
        assert!("nic".parse::<ScenarioName>().unwrap_err().contains("soak"));
        assert!("atomic".parse::<Op>().unwrap_err().contains("write"));
    }

    fn result_of(name: ScenarioName, run: RunResult) -> ScenarioResult {
        ScenarioResult {
            scenario: name,
            op: Op::Write,
            tool: "shift_write_bw".into(),
            size: 65536,
            seed: 7,
            figures: run.figures.clone(),
            timeline: serde_json::Value::Null,
            with_failover: Some(run),
            no_failover: None,
            baseline: None,
            goals: Goals::default(),
            chaos: None,
        }
    }

    fn clean_run() -> RunResult {
        RunResult {
            failover: true,
            figures: Figures {
                bytes_checked: 1 << 20,
                notifications_checked: 16,
                ..Figures::default()
            },
            error: None,
            client_ok: true,
            failures: Vec::new(),
            not_reached: Vec::new(),
            link_reports: Vec::new(),
            client_report: serde_json::Value::Null,
            server_report: None,
        }
    }

    #[test]
    fn a_clean_checked_run_passes_the_verdict() {
        assert_eq!(result_of(ScenarioName::Flap, clean_run()).verdict(), Ok(()));
    }

    #[test]
    fn data_errors_fail_the_verdict_and_name_the_seed() {
        let mut run = clean_run();
        run.figures.data_errors = 3;
        let err = result_of(ScenarioName::Soak, run).verdict().unwrap_err();
        assert!(
            err.contains("seed 7") && err.contains("3 data errors"),
            "{err}"
        );
    }

    #[test]
    fn a_check_that_verified_nothing_fails_the_verdict() {
        let mut run = clean_run();
        run.figures.notifications_checked = 0;
        let err = result_of(ScenarioName::Flap, run).verdict().unwrap_err();
        assert!(err.contains("verified nothing"), "{err}");
    }

    #[test]
    fn each_device_fault_sent_needs_its_own_applied_acknowledgement() {
        let fault = |at: f64| LogEntry {
            t_ms: at,
            unix_ms: at,
            planned_ms: at,
            target: "initiator-dev1-qps-failed".into(),
            rail: 1,
            action: LinkAction::Down,
            netns: "rs-a".into(),
            dev: "soft:nic1".into(),
            error: None,
            issued_unix_ms: at,
        };
        let ack = serde_json::json!({"command": "qps-failed soft:nic1", "applied_unix_ms": 5.0});
        let mut run = clean_run();
        run.failures = vec![fault(1.0), fault(2.0)];
        run.client_report = serde_json::json!({ "faults": [ack.clone(), ack.clone()] });
        assert_eq!(result_of(ScenarioName::Soak, run.clone()).verdict(), Ok(()));
        // Sent twice, applied once: the second fault never happened.
        run.client_report = serde_json::json!({ "faults": [ack] });
        let err = result_of(ScenarioName::Soak, run.clone())
            .verdict()
            .unwrap_err();
        assert!(err.contains("qps-failed soft:nic1"), "{err}");
        // Reported by the wrong host's application: not applied where it was meant to be.
        run.server_report = Some(run.client_report.clone());
        run.client_report = serde_json::json!({ "faults": [] });
        assert!(result_of(ScenarioName::Soak, run).verdict().is_err());
    }

    #[test]
    fn an_error_under_failover_fails_the_verdict() {
        let mut run = clean_run();
        run.error = Some("RETRY_EXC_ERR on wr 12".into());
        run.client_ok = false;
        let err = result_of(ScenarioName::InitiatorNic, run)
            .verdict()
            .unwrap_err();
        assert!(err.contains("RETRY_EXC_ERR"), "{err}");
    }

    fn chaos_result(excused: bool) -> ScenarioResult {
        let mut run = clean_run();
        run.error = Some("backup-unavailable".into());
        run.client_ok = false;
        let mut r = result_of(ScenarioName::Chaos, run);
        r.chaos = Some(ChaosReport {
            tolerance_ms: 4300.0,
            max_both_down_ms: 1000.0,
            failures_planned: 40,
            longest_planned_both_down_ms: 1000.0,
            longest_no_path_ms: 5000.0,
            longest_no_path_reported_ms: 5100.0,
            no_path_windows: 3,
            losses: vec![chaos::ChaosLoss {
                unix_ms: 1.0,
                cause: "backup-unavailable".into(),
                longest_no_path_before_ms: if excused { 4400.0 } else { 640.0 },
                excused,
            }],
            lost_within_tolerance: u64::from(!excused),
        });
        r
    }

    #[test]
    fn chaos_fails_a_loss_inside_the_tolerance_and_names_the_seed() {
        let err = chaos_result(false).verdict().unwrap_err();
        assert!(err.contains("seed 7") && err.contains("640 ms"), "{err}");
    }

    #[test]
    fn chaos_allows_a_loss_after_no_path_for_the_tolerance() {
        assert_eq!(chaos_result(true).verdict(), Ok(()));
        // Data errors fail it all the same.
        let mut r = chaos_result(true);
        r.with_failover.as_mut().unwrap().figures.data_errors = 1;
        assert!(r.verdict().is_err());
    }
}
