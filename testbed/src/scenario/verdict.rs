//! Judging a scenario's runs: the correctness verdict, and the goals, which are only
//! reported.

use serde::Serialize;

use super::run::Runs;
use super::{scenario_slug, Op, Ratios, RunResult, ScenarioName, ScenarioOptions};
use crate::chaos::{self, ChaosReport};
use crate::fail::LogEntry;
use crate::report::{self, Figures};
use crate::schedule::LinkAction;
use crate::target::FailTarget;
use crate::topology::Role;

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

/// Judges a `chaos` run's losses against the windows without any path and the failures the
/// run drew.
fn chaos_report(o: &ScenarioOptions, r: &RunResult) -> ChaosReport {
    let whole: Vec<LogEntry> = r.failures.iter().chain(&r.not_reached).cloned().collect();
    chaos::judge(
        &whole,
        &r.link_reports,
        &r.figures.losses,
        o.tolerance,
        o.max_both_down,
        &r.planned,
    )
}

impl ScenarioResult {
    /// The result of `runs`: the main run's figures and timeline (the failover run's, else
    /// the baseline's), the ratios to the medium, the goals and, for `chaos`, each loss
    /// judged against the tolerance.
    pub fn of_runs(o: &ScenarioOptions, runs: Runs) -> ScenarioResult {
        let Runs {
            with_failover,
            no_failover,
            medium,
        } = runs;
        let main = with_failover.as_ref().or(no_failover.as_ref());
        let figures = main.map(|r| r.figures.clone()).unwrap_or_default();
        let timeline = main
            .and_then(|r| r.client_report.get("timeline").cloned())
            .unwrap_or(serde_json::Value::Null);
        let baseline = medium.map(|(medium, write_lat)| {
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
        ScenarioResult {
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
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

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
            planned: Vec::new(),
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
