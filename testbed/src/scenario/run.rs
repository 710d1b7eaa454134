//! Running a scenario: the app pair under its failure schedule, with and without failover,
//! and the medium measured in the same run for ratios.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::Serialize;

use super::{scenario_slug, ScenarioOptions, Variants};
use crate::apprun::{self, AppRunError, PairOutcome, PairSpec};
use crate::baseline::{self, Baseline};
use crate::fail::{self, LogEntry};
use crate::faults;
use crate::linkwatch::{LinkChange, LinkWatch};
use crate::report::{self, Figures};
use crate::schedule::{Drawn, Placed};
use crate::topology::{Role, TestbedInfo};

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
    /// The failures the schedule placed, as drawn for this run (a `chaos` verdict judges
    /// against them).
    #[serde(skip)]
    pub planned: Vec<Placed>,
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
        if q > 1 && !o.checks_data() && !names_cq_mod(&o.extra_args) {
            // Every message signaled: at the apps' moderation (64 at `-t 128`) a QP's first
            // completion comes after 64 of its messages, and QPs sharing a path fairly all get
            // there together, after q x 64 messages over all (4 GB at 1,000 QPs of 64 KiB,
            // half a minute on the testbed): the 20 s watchdog stopped such runs while data
            // moved, and neither the timeline nor a failover's first success saw progress.
            args.push("-Q".into());
            args.push("1".into());
        }
    }
    if let Some(u) = o.qp_timeout {
        args.push("-u".into());
        args.push(u.to_string());
    }
    args.extend(o.extra_args.iter().cloned());
    args
}

/// Whether the apps' extra arguments set the completion moderation (`-Q N`, `-QN`,
/// `--cq-mod N`, `--cq-mod=N`).
fn names_cq_mod(extra: &[String]) -> bool {
    extra
        .iter()
        .any(|a| a.starts_with("-Q") || a == "--cq-mod" || a.starts_with("--cq-mod="))
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
        client_timeout: o.run_length()
            + o.setup_allowance()
            + o.drain_allowance()
            + Duration::from_secs(30),
    };
    let Drawn {
        failures: planned,
        steps,
    } = o.schedule().draw();
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
        planned,
        client_report: client_raw,
        server_report: server_raw,
    })
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

/// The runs `o` asks for, and the medium when it asks for ratios: what the verdict is
/// taken from.
pub struct Runs {
    /// The run with failover.
    pub with_failover: Option<RunResult>,
    /// The `--no-failover` run.
    pub no_failover: Option<RunResult>,
    /// The medium and the 8-byte write latency p50, measured first.
    pub medium: Option<(Baseline, Option<f64>)>,
}

/// Measures the medium when `o` asks for ratios, then makes the runs it asks for.
pub fn run_variants(
    info: &TestbedInfo,
    o: &ScenarioOptions,
    on_log: &mut (dyn FnMut(&LogEntry) + Send),
) -> Result<Runs, ScenarioError> {
    let medium = if o.with_baseline {
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
    Ok(Runs {
        with_failover,
        no_failover,
        medium,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::ScenarioName;
    use crate::target::TargetSet;

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
    fn the_typed_app_flags_reach_both_apps_and_the_retry_budget() {
        let mut o = ScenarioOptions::new(ScenarioName::Soak);
        let default_budget = o.rc_budget();
        o.qps = Some(8);
        o.qp_timeout = Some(12);
        let args = common_args(&o, true);
        let after = |flag: &str| {
            let at = args.iter().position(|a| a == flag).expect(flag);
            args[at + 1].clone()
        };
        assert_eq!(
            (after("-q"), after("-u")),
            ("8".to_owned(), "12".to_owned())
        );
        assert_eq!(o.rc_budget(), crate::paths::rc_retry_budget(12, 7));
        assert!(o.rc_budget() < default_budget);
    }

    #[test]
    fn many_qps_signal_every_message_unless_the_extra_arguments_say_otherwise() {
        let mut o = ScenarioOptions::new(ScenarioName::InitiatorNic);
        let moderation = |o: &ScenarioOptions| {
            let args = common_args(o, true);
            let at = args.iter().position(|a| a == "-Q")?;
            Some(args[at + 1].clone())
        };
        assert_eq!(moderation(&o), None, "one QP keeps the apps' moderation");
        o.qps = Some(1000);
        assert_eq!(moderation(&o).as_deref(), Some("1"));
        for given in [
            &["-Q", "16"][..],
            &["-Q16"],
            &["--cq-mod", "16"],
            &["--cq-mod=16"],
        ] {
            o.extra_args = given.iter().map(|a| a.to_string()).collect();
            let args = common_args(&o, true);
            assert!(
                !args.windows(2).any(|w| w == ["-Q", "1"]),
                "{given:?} overridden: {args:?}"
            );
        }
        // A run that checks data signals every message already.
        let mut soak = ScenarioOptions::new(ScenarioName::Soak);
        soak.qps = Some(8);
        assert_eq!(moderation(&soak), None);
    }

    #[test]
    fn the_baseline_variant_asks_for_no_failover() {
        let o = ScenarioOptions::new(ScenarioName::SwitchPort);
        assert!(common_args(&o, false).contains(&"--no-failover".to_owned()));
    }
}
