//! Turning an application's JSON report and the failure log into a scenario's figures:
//! bandwidth before, during and after the failure, detection time, fallback latency,
//! switch-back time and data errors (see `docs/apps-json.md` for the input format).

use serde::{Deserialize, Serialize};

use crate::fail::{LinkAction, LogEntry};

/// One timeline sample of an application (`docs/apps-json.md`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Sample {
    /// Milliseconds since the tool started measuring, at the end of the interval.
    pub t_ms: f64,
    /// Unix time in milliseconds at the end of the interval.
    pub unix_ms: f64,
    /// Bandwidth over the interval.
    pub bw_gbps: f64,
    /// Message rate over the interval.
    pub msg_rate_mpps: f64,
    /// Successful completions in the interval.
    pub completions: u64,
    /// Error completions in the interval.
    pub errors: u64,
    /// Failover state at the end of the interval.
    pub state: String,
}

/// One failover event of an application.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FailoverEvent {
    /// `failover`, `switch-back`, `refused` or `error`.
    pub kind: String,
    /// When the event completed.
    pub unix_ms: f64,
    /// What caused it.
    pub cause: String,
    /// The device concerned.
    pub device: String,
    /// When the failure was noticed (first error CQE polled, or link-down handled).
    pub detected_unix_ms: Option<f64>,
    /// First successful completion on the new path.
    pub first_success_unix_ms: Option<f64>,
    /// First error polled to first success on the backup.
    pub fallback_latency_us: Option<f64>,
    /// WQEs copied to the other rings.
    pub wqes_copied: u64,
    /// WQEs sent again.
    pub wqes_retransmitted: u64,
    /// WQEs not sent again because the peer had consumed them.
    pub wqes_skipped: u64,
}

/// The failover section of an application report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FailoverSummary {
    /// Failovers completed.
    pub failovers: u64,
    /// Switch-backs completed.
    pub switch_backs: u64,
    /// WQEs sent again across all events.
    pub wqes_retransmitted: u64,
    /// WQEs skipped across all events.
    pub wqes_skipped: u64,
    /// Every event, in order.
    pub events: Vec<FailoverEvent>,
}

/// The data-check section of an application report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Check {
    /// Whether `--check` was on.
    pub enabled: bool,
    /// Bytes verified.
    pub bytes_checked: u64,
    /// Corrupted or missing bytes found.
    pub errors: u64,
    /// Notifications verified for order and content.
    pub notifications_checked: u64,
    /// Lost, duplicated or reordered notifications.
    pub notification_errors: u64,
}

/// The parts of an application's JSON report the testbed reads.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AppReport {
    /// Binary name.
    pub tool: String,
    /// `client` or `server`.
    pub role: String,
    /// Whether the run used a resilient QP with failover on.
    pub failover_enabled: bool,
    /// Message size.
    pub size: u64,
    /// Average bandwidth.
    pub bw_avg_gbps: f64,
    /// Median latency (latency tools).
    pub lat_p50_us: Option<f64>,
    /// The timeline.
    pub timeline: Vec<Sample>,
    /// Failover events and counters.
    pub failover: FailoverSummary,
    /// Data checking.
    pub check: Option<Check>,
    /// The error that stopped the run, if one did.
    pub error: Option<String>,
}

/// Percentiles of a set of samples.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// Largest sample.
    pub max: Option<f64>,
    /// Number of samples.
    pub samples: usize,
}

impl Percentiles {
    /// Nearest-rank percentiles of `values`.
    pub fn of(mut values: Vec<f64>) -> Percentiles {
        values.retain(|v| v.is_finite());
        values.sort_by(f64::total_cmp);
        let at = |p: f64| -> Option<f64> {
            if values.is_empty() {
                return None;
            }
            let rank = ((p / 100.0) * (values.len() - 1) as f64).round() as usize;
            Some(values[rank.min(values.len() - 1)])
        };
        Percentiles {
            p50: at(50.0),
            p99: at(99.0),
            max: values.last().copied(),
            samples: values.len(),
        }
    }
}

/// A scenario's figures, as its JSON holds them at the top level.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Figures {
    /// Mean bandwidth of the samples before the first failure.
    pub bw_before_gbps: f64,
    /// Mean bandwidth of the samples inside failure windows.
    pub bw_during_gbps: f64,
    /// Mean bandwidth of the samples after the last recovery (and the switch-back).
    pub bw_after_gbps: f64,
    /// First link-down to the first error or failover action, per failure: the first one.
    pub detection_ms: Option<f64>,
    /// Link-down to the first successful completion on the backup, per failover.
    pub backup_traffic_ms: Percentiles,
    /// First error CQE polled to first successful completion on the backup (paper, fig. 6b).
    pub fallback_latency_us: Percentiles,
    /// Link-up to the completed switch-back, per recovery.
    pub switchback_ms: Percentiles,
    /// Corrupted bytes plus lost, duplicated or reordered notifications.
    pub data_errors: u64,
    /// Bytes the data check verified (both sides).
    pub bytes_checked: u64,
    /// Notifications the data check verified (both sides).
    pub notifications_checked: u64,
    /// Failovers the application completed.
    pub failovers: u64,
    /// Switch-backs the application completed.
    pub switch_backs: u64,
}

/// A failure window: link down at `down`, back up at `up` (unix ms).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    /// When the link went down.
    pub down: f64,
    /// When it came back, if it did.
    pub up: Option<f64>,
}

/// The down/up windows in a failure log (several targets may overlap; each down opens a
/// window closed by the next up of the same target).
pub fn windows(log: &[LogEntry]) -> Vec<Window> {
    let mut open: Vec<(String, f64)> = Vec::new();
    let mut out = Vec::new();
    for e in log.iter().filter(|e| e.error.is_none()) {
        match e.action {
            LinkAction::Down => open.push((e.target.clone(), e.issued_unix_ms)),
            LinkAction::Up => {
                if let Some(i) = open.iter().position(|(t, _)| *t == e.target) {
                    let (_, down) = open.remove(i);
                    out.push(Window {
                        down,
                        up: Some(e.issued_unix_ms),
                    });
                }
            }
        }
    }
    out.extend(open.into_iter().map(|(_, down)| Window { down, up: None }));
    out.sort_by(|a, b| a.down.total_cmp(&b.down));
    out
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    if n == 0 {
        0.0
    } else {
        sum / n as f64
    }
}

/// Computes the figures of a run: `client` is the report of the side that posts the work,
/// `server` the other side's (its data check counts), `log` the failure actions.
/// `interval_ms` is the timeline interval; `settle_ms` how long after a recovery the
/// "after" bandwidth starts to count when the application reported no switch-back.
pub fn figures(
    client: &AppReport,
    server: Option<&AppReport>,
    log: &[LogEntry],
    interval_ms: f64,
) -> Figures {
    let wins = windows(log);
    let first_down = wins.first().map(|w| w.down);
    let last_up = wins
        .iter()
        .filter_map(|w| w.up)
        .fold(None, |acc: Option<f64>, u| {
            Some(acc.map_or(u, |a| a.max(u)))
        });
    let events = &client.failover.events;
    let switch_done_after = |t: f64| {
        events
            .iter()
            .filter(|e| e.kind == "switch-back" && e.unix_ms >= t)
            .map(|e| e.unix_ms)
            .next()
    };
    let starts = |s: &Sample| s.unix_ms - interval_ms;
    let inside_any = |s: &Sample| {
        wins.iter().any(|w| {
            let up = w.up.unwrap_or(f64::INFINITY);
            starts(s) >= w.down && s.unix_ms <= up
        })
    };
    let bw_before = mean(
        client
            .timeline
            .iter()
            .filter(|s| first_down.is_none_or(|d| s.unix_ms <= d))
            .map(|s| s.bw_gbps),
    );
    let bw_during = mean(
        client
            .timeline
            .iter()
            .filter(|s| inside_any(s))
            .map(|s| s.bw_gbps),
    );
    // "After" starts when traffic is back on the default path: at the switch-back that
    // followed the last recovery, or at the recovery itself without failover.
    let after_from = last_up.map(|u| switch_done_after(u).unwrap_or(u));
    let bw_after = match after_from {
        Some(from) => mean(
            client
                .timeline
                .iter()
                .filter(|s| starts(s) >= from)
                .map(|s| s.bw_gbps),
        ),
        None => 0.0,
    };
    let detection_ms = first_down.and_then(|down| {
        events
            .iter()
            .filter_map(|e| e.detected_unix_ms)
            .find(|&d| d >= down)
            .map(|d| d - down)
    });
    let backup_traffic_ms = Percentiles::of(
        wins.iter()
            .filter_map(|w| {
                events
                    .iter()
                    .filter(|e| e.kind == "failover")
                    .filter_map(|e| e.first_success_unix_ms)
                    .find(|&t| t >= w.down && w.up.is_none_or(|u| t <= u))
                    .map(|t| t - w.down)
            })
            .collect(),
    );
    let fallback_latency_us = Percentiles::of(
        events
            .iter()
            .filter(|e| e.kind == "failover")
            .filter_map(|e| e.fallback_latency_us)
            .collect(),
    );
    let switchback_ms = Percentiles::of(
        wins.iter()
            .filter_map(|w| w.up)
            .filter_map(|u| switch_done_after(u).map(|t| t - u))
            .collect(),
    );
    let checks = || {
        [Some(client), server]
            .into_iter()
            .flatten()
            .filter_map(|r| r.check.as_ref())
    };
    let data_errors = checks().map(|c| c.errors + c.notification_errors).sum();
    let bytes_checked = checks().map(|c| c.bytes_checked).sum();
    let notifications_checked = checks().map(|c| c.notifications_checked).sum();
    Figures {
        bw_before_gbps: bw_before,
        bw_during_gbps: bw_during,
        bw_after_gbps: bw_after,
        detection_ms,
        backup_traffic_ms,
        fallback_latency_us,
        switchback_ms,
        data_errors,
        bytes_checked,
        notifications_checked,
        failovers: client.failover.failovers,
        switch_backs: client.failover.switch_backs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(target: &str, action: LinkAction, unix_ms: f64) -> LogEntry {
        LogEntry {
            t_ms: 0.0,
            unix_ms,
            planned_ms: 0.0,
            target: target.to_owned(),
            rail: 0,
            action,
            netns: "rs-a".to_owned(),
            dev: "nic0".to_owned(),
            error: None,
            issued_unix_ms: unix_ms,
        }
    }

    fn sample(end_ms: f64, bw: f64) -> Sample {
        Sample {
            t_ms: end_ms,
            unix_ms: end_ms,
            bw_gbps: bw,
            ..Sample::default()
        }
    }

    /// 6 s run, failure 2 s..4 s; 4 Gb/s before, 2 Gb/s on the backup, 4 Gb/s after a
    /// switch-back at 4.05 s.
    fn story() -> (AppReport, Vec<LogEntry>) {
        let timeline = (1..=60)
            .map(|i| {
                let end = f64::from(i) * 100.0;
                let bw = if end <= 2000.0 || end > 4100.0 {
                    4.0
                } else {
                    2.0
                };
                sample(end, bw)
            })
            .collect();
        let app = AppReport {
            timeline,
            failover: FailoverSummary {
                failovers: 1,
                switch_backs: 1,
                events: vec![
                    FailoverEvent {
                        kind: "failover".into(),
                        unix_ms: 2004.0,
                        detected_unix_ms: Some(2001.5),
                        first_success_unix_ms: Some(2003.0),
                        fallback_latency_us: Some(1500.0),
                        ..FailoverEvent::default()
                    },
                    FailoverEvent {
                        kind: "switch-back".into(),
                        unix_ms: 4050.0,
                        ..FailoverEvent::default()
                    },
                ],
                ..FailoverSummary::default()
            },
            check: Some(Check {
                enabled: true,
                errors: 0,
                ..Check::default()
            }),
            ..AppReport::default()
        };
        let log = vec![
            entry("initiator-nic0", LinkAction::Down, 2000.0),
            entry("initiator-nic0", LinkAction::Up, 4000.0),
        ];
        (app, log)
    }

    #[test]
    fn bandwidth_is_split_around_the_failure_window() {
        let (app, log) = story();
        let f = figures(&app, None, &log, 100.0);
        assert_eq!(f.bw_before_gbps, 4.0);
        assert_eq!(f.bw_during_gbps, 2.0);
        assert_eq!(f.bw_after_gbps, 4.0);
    }

    #[test]
    fn detection_fallback_and_switchback_are_measured_from_the_log() {
        let (app, log) = story();
        let f = figures(&app, None, &log, 100.0);
        assert_eq!(f.detection_ms, Some(1.5));
        assert_eq!(f.backup_traffic_ms.p50, Some(3.0));
        assert_eq!(f.fallback_latency_us.p50, Some(1500.0));
        assert_eq!(f.switchback_ms.p50, Some(50.0));
    }

    #[test]
    fn a_link_watch_faster_than_the_ip_command_still_counts_as_detection() {
        let (app, mut log) = story();
        // `ip` returned 3 ms after it was issued; the app saw the link go at 2001.5.
        log[0].unix_ms = 2003.0;
        let f = figures(&app, None, &log, 100.0);
        assert_eq!(f.detection_ms, Some(1.5));
    }

    #[test]
    fn data_errors_add_both_sides_checks() {
        let (app, log) = story();
        let server = AppReport {
            check: Some(Check {
                enabled: true,
                errors: 3,
                notification_errors: 1,
                ..Check::default()
            }),
            ..AppReport::default()
        };
        assert_eq!(figures(&app, Some(&server), &log, 100.0).data_errors, 4);
    }

    #[test]
    fn a_run_that_stopped_at_the_failure_has_nothing_during_or_after() {
        let (mut app, log) = story();
        app.timeline.retain(|s| s.unix_ms <= 2000.0);
        app.failover = FailoverSummary::default();
        let f = figures(&app, None, &log, 100.0);
        assert_eq!(f.bw_before_gbps, 4.0);
        assert_eq!(f.bw_during_gbps, 0.0);
        assert_eq!(f.bw_after_gbps, 0.0);
        assert_eq!(f.detection_ms, None);
        assert_eq!(f.fallback_latency_us.samples, 0);
    }

    #[test]
    fn windows_pair_each_down_with_the_next_up_of_the_same_target() {
        let log = vec![
            entry("a", LinkAction::Down, 10.0),
            entry("b", LinkAction::Down, 15.0),
            entry("a", LinkAction::Up, 20.0),
            entry("b", LinkAction::Up, 30.0),
            entry("a", LinkAction::Down, 40.0),
        ];
        let w = windows(&log);
        assert_eq!(w.len(), 3);
        assert_eq!((w[0].down, w[0].up), (10.0, Some(20.0)));
        assert_eq!((w[1].down, w[1].up), (15.0, Some(30.0)));
        assert_eq!((w[2].down, w[2].up), (40.0, None));
    }

    #[test]
    fn percentiles_ignore_non_finite_values() {
        let p = Percentiles::of(vec![3.0, f64::NAN, 1.0, 2.0]);
        assert_eq!((p.p50, p.max, p.samples), (Some(2.0), Some(3.0), 3));
        assert_eq!(Percentiles::of(vec![]).p50, None);
    }

    #[test]
    fn app_reports_parse_with_unknown_and_missing_keys() {
        let text = r#"{"tool":"shift_write_bw","size":65536,"new_key":1,
            "timeline":[{"t_ms":100,"unix_ms":5.0,"bw_gbps":1.5,"state":"default"}]}"#;
        let r: AppReport = serde_json::from_str(text).unwrap();
        assert_eq!(r.size, 65536);
        assert_eq!(r.timeline[0].bw_gbps, 1.5);
        assert!(r.check.is_none());
    }
}
