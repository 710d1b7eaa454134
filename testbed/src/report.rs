//! Turning an application's JSON report and the failure log into a scenario's figures:
//! bandwidth before, during and after the failure, detection time, fallback latency,
//! switch-back time and data errors (see `docs/apps-json.md` for the input format).

use std::collections::BTreeMap;

use pmd::resilient::{EventKind, FailoverEvent};
use serde::{Deserialize, Serialize};

use crate::fail::LogEntry;
use crate::linkwatch::LinkChange;
use crate::paths::Availability;
use crate::schedule::LinkAction;
use crate::target::FailTarget;

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

/// One failover event of an application: the QP's record as the apps write it, and which of
/// the application's QPs it concerns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AppEvent {
    /// The event.
    #[serde(flatten)]
    pub event: FailoverEvent,
    /// Which of the application's QPs (0-based, in the order it made them) the event
    /// concerns. Not written by the apps yet (PROPOSED in `docs/apps-json.md`); without it,
    /// `all_on_backup_ms` counts events instead of QPs.
    #[serde(default)]
    pub qp: Option<u32>,
}

/// The failover section of an application report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FailoverSummary {
    /// Failovers completed.
    pub failovers: u64,
    /// Switch-backs completed.
    pub switch_backs: u64,
    /// Failbacks: traffic moved from a failing backup back to the recovered default path
    /// (a failback). 0 when absent: the apps write it once the pmd can fail back, and a
    /// build that cannot has made none.
    pub failbacks: u64,
    /// Backup paths brought back after they failed. Optional: the apps report it
    /// once the pmd counts it; `None` until then.
    pub backup_rearms: Option<u64>,
    /// Connection failures.
    pub errors: u64,
    /// WQEs sent again across all events.
    pub wqes_retransmitted: u64,
    /// WQEs skipped across all events.
    pub wqes_skipped: u64,
    /// Every event, in order.
    pub events: Vec<AppEvent>,
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

/// What an application did with one command of the fault channel (`faults[]` in
/// `docs/apps-json.md`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FaultAck {
    /// The command line as read, without the newline: `device-dead soft:nic0`.
    pub command: String,
    /// When the application read it.
    pub received_unix_ms: Option<f64>,
    /// When the fault took effect on the device; `None` when it was not applied.
    pub applied_unix_ms: Option<f64>,
    /// Why it was not applied (unknown command or device, a provider without the fault).
    pub error: Option<String>,
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
    /// QPs the tool ran (`-q`); `None` in reports written before the key existed.
    pub qps: Option<u64>,
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
    /// Commands the application read from its fault channel.
    pub faults: Vec<FaultAck>,
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
    /// The same, over the failovers onto a settled backup path only: no failure, recovery
    /// or device fault of the backup rail from [`BACKUP_SETTLED_MS`] before the failover's
    /// detection to its first success, and no backup link down then. The rest waited for a
    /// backup path that was down or not yet carrying packets (`docs/measurements.md`,
    /// "Where the soak's fallback tail comes from").
    pub fallback_settled_backup_us: Percentiles,
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
    /// Switch-backs (back to the default path after its hold-down) the application
    /// completed.
    pub switch_backs: u64,
    /// Failbacks: traffic moved back to the recovered default path because the backup
    /// failed under it (the apps' `failover.failbacks`, 0 when they do not write it).
    pub failbacks: u64,
    /// Backup paths brought back after they failed; `null` until the apps report it.
    pub backup_rearms: Option<u64>,
    /// QPs the client ran.
    pub qps: u64,
    /// Per failure that moved traffic, link-down to the moment every QP had a successful
    /// completion on the backup.
    pub all_on_backup_ms: Percentiles,
    /// How `all_on_backup_ms` told QPs apart: `qp` (the events' QP index) or `event-count`
    /// (every failover event counted as another QP: the apps do not write `qp` yet).
    pub all_on_backup_basis: Option<String>,
    /// Connections the client lost (its `error` events, or its run's error).
    pub connections_lost: u64,
    /// Of those, the ones lost although some rail's path was up within the RC retry budget
    /// of the failure that ended them: the driver's fault.
    pub connections_lost_with_path_up: u64,
    /// Each lost connection.
    pub losses: Vec<Loss>,
}

/// A connection the client lost.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Loss {
    /// When the error reached the application.
    pub unix_ms: f64,
    /// When the failure that ended it was detected.
    pub detected_unix_ms: f64,
    /// Why (the event's cause, or the run's error).
    pub cause: String,
    /// Rails whose path was up at some instant from the detection to the later of the loss
    /// and the detection plus the RC retry budget.
    pub rails_up_within_budget: Vec<u8>,
    /// Whether any was.
    pub path_up_within_budget: bool,
}

/// A failure window: link down at `down`, back up at `up` (unix ms), on `rail`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    /// When the link went down.
    pub down: f64,
    /// When it came back, if it did.
    pub up: Option<f64>,
    /// The rail of what failed (0: the default path).
    pub rail: u8,
}

/// How long the backup rail must have been left alone before a failover's detection for
/// [`Figures::fallback_settled_backup_us`] to count it: a veth carries nothing until the
/// kernel reports it running, up to a second after `ip link set up` (`docs/testbed.md`,
/// "Known problems").
pub const BACKUP_SETTLED_MS: f64 = 1000.0;

/// The down/up windows in a failure log (several targets may overlap; each down opens a
/// window closed by the next up of the same target). A device's QPs failing is an instant,
/// not a window (the device and its link stay up, the driver repairs the QPs): it opens
/// none, and counts only in the judgement of lost connections ([`Availability`]).
pub fn windows(log: &[LogEntry]) -> Vec<Window> {
    let mut open: Vec<(String, f64, u8)> = Vec::new();
    let mut out = Vec::new();
    let instant = |e: &LogEntry| {
        FailTarget::parse(&e.target, None).is_ok_and(|t| t.recovers() && !t.has_up_step())
    };
    for e in log.iter().filter(|e| e.error.is_none() && !instant(e)) {
        match e.action {
            LinkAction::Down => open.push((e.target.clone(), e.issued_unix_ms, e.rail)),
            LinkAction::Up => {
                if let Some(i) = open.iter().position(|(t, _, _)| *t == e.target) {
                    let (_, down, rail) = open.remove(i);
                    out.push(Window {
                        down,
                        up: Some(e.issued_unix_ms),
                        rail,
                    });
                }
            }
        }
    }
    out.extend(open.into_iter().map(|(_, down, rail)| Window {
        down,
        up: None,
        rail,
    }));
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
/// `not_reached` the steps the schedule did not get to because the client had exited, at
/// their planned times: lost connections are judged against the whole schedule, and against
/// `link_reports`, when the kernel reported each rail link down and running again
/// ([`crate::linkwatch`]).
/// `interval_ms` is the timeline interval; `rc_budget_ms` the RC retry budget of the apps'
/// QPs ([`crate::paths::rc_retry_budget`]), against which lost connections are judged.
///
/// Detection, traffic on the backup, all QPs on the backup and switch-back are measured
/// around failures of the default path (rail 0): a backup-rail failure moves no traffic.
pub fn figures(
    client: &AppReport,
    server: Option<&AppReport>,
    log: &[LogEntry],
    not_reached: &[LogEntry],
    link_reports: &[LinkChange],
    interval_ms: f64,
    rc_budget_ms: f64,
) -> Figures {
    let wins = windows(log);
    let default_wins: Vec<Window> = wins.iter().filter(|w| w.rail == 0).copied().collect();
    let first_down = wins.first().map(|w| w.down);
    let first_default_down = default_wins.first().map(|w| w.down);
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
            .map(|e| &e.event)
            .filter(|e| e.kind == EventKind::SwitchBack && e.unix_ms >= t)
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
    let detection_ms = first_default_down.and_then(|down| {
        events
            .iter()
            .map(|e| e.event.detected_unix_ms)
            .find(|&d| d >= down)
            .map(|d| d - down)
    });
    let backup_traffic_ms = Percentiles::of(
        default_wins
            .iter()
            .filter_map(|w| {
                events
                    .iter()
                    .map(|e| &e.event)
                    .filter(|e| e.kind == EventKind::Failover)
                    .filter_map(|e| e.first_success_unix_ms)
                    .find(|&t| t >= w.down && w.up.is_none_or(|u| t <= u))
                    .map(|t| t - w.down)
            })
            .collect(),
    );
    let fallback_latency_us = Percentiles::of(
        events
            .iter()
            .map(|e| &e.event)
            .filter(|e| e.kind == EventKind::Failover)
            .filter_map(|e| e.fallback_latency_us)
            .collect(),
    );
    // The backup rail left alone over `[from, to]`: no action of it then (a device fault is
    // an instant, so the log's entries are read, not only the windows), none of its links
    // down at `from`.
    let backup_alone = |from: f64, to: f64| {
        !log.iter().any(|l| {
            l.error.is_none() && l.rail != 0 && l.issued_unix_ms >= from && l.issued_unix_ms <= to
        }) && !wins
            .iter()
            .any(|w| w.rail != 0 && w.down < from && w.up.is_none_or(|u| u > from))
    };
    let fallback_settled_backup_us = Percentiles::of(
        events
            .iter()
            .map(|e| &e.event)
            .filter(|e| e.kind == EventKind::Failover)
            .filter(|e| {
                e.first_success_unix_ms.is_some_and(|first| {
                    backup_alone(e.detected_unix_ms - BACKUP_SETTLED_MS, first)
                })
            })
            .filter_map(|e| e.fallback_latency_us)
            .collect(),
    );
    let switchback_ms = Percentiles::of(
        default_wins
            .iter()
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
    let qps = client.qps.unwrap_or(1).max(1);
    let (all_on_backup_ms, all_on_backup_basis) = all_on_backup(events, &default_wins, qps);
    let whole_schedule: Vec<LogEntry> = log.iter().chain(not_reached).cloned().collect();
    let losses = losses(client, &whole_schedule, link_reports, rc_budget_ms);
    Figures {
        bw_before_gbps: bw_before,
        bw_during_gbps: bw_during,
        bw_after_gbps: bw_after,
        detection_ms,
        backup_traffic_ms,
        fallback_latency_us,
        fallback_settled_backup_us,
        switchback_ms,
        data_errors,
        bytes_checked,
        notifications_checked,
        failovers: client.failover.failovers,
        switch_backs: client.failover.switch_backs,
        failbacks: client.failover.failbacks,
        backup_rearms: client.failover.backup_rearms,
        qps,
        all_on_backup_ms,
        all_on_backup_basis,
        connections_lost: losses.len() as u64,
        connections_lost_with_path_up: losses.iter().filter(|l| l.path_up_within_budget).count()
            as u64,
        losses,
    }
}

/// Per failure window, link-down to the moment each of `qps` QPs had its first successful
/// completion on the backup (failover events whose first success falls in the window).
/// With the events' `qp` index, each QP's earliest; without it, the `qps`-th earliest event
/// (exact while each QP fails over once per window). Windows where fewer QPs got there
/// give no sample.
fn all_on_backup(events: &[AppEvent], wins: &[Window], qps: u64) -> (Percentiles, Option<String>) {
    let failovers: Vec<&AppEvent> = events
        .iter()
        .filter(|e| e.event.kind == EventKind::Failover)
        .collect();
    if failovers.is_empty() {
        return (Percentiles::default(), None);
    }
    let by_qp = failovers.iter().all(|e| e.qp.is_some());
    let samples = wins
        .iter()
        .filter_map(|w| {
            let within = |t: f64| t >= w.down && w.up.is_none_or(|u| t <= u);
            let mut firsts: Vec<f64> = if by_qp {
                let mut earliest: BTreeMap<u32, f64> = BTreeMap::new();
                for e in &failovers {
                    if let (Some(qp), Some(t)) = (e.qp, e.event.first_success_unix_ms) {
                        if within(t) {
                            let slot = earliest.entry(qp).or_insert(t);
                            *slot = slot.min(t);
                        }
                    }
                }
                earliest.into_values().collect()
            } else {
                failovers
                    .iter()
                    .filter_map(|e| e.event.first_success_unix_ms)
                    .filter(|&t| within(t))
                    .collect()
            };
            firsts.sort_by(f64::total_cmp);
            let last = *firsts.get(usize::try_from(qps).ok()? - 1)?;
            Some(last - w.down)
        })
        .collect();
    let basis = if by_qp { "qp" } else { "event-count" };
    (Percentiles::of(samples), Some(basis.to_owned()))
}

/// The client's lost connections, each judged against the paths up around it.
fn losses(
    client: &AppReport,
    log: &[LogEntry],
    link_reports: &[LinkChange],
    rc_budget_ms: f64,
) -> Vec<Loss> {
    let mut lost: Vec<(f64, f64, String)> = client
        .failover
        .events
        .iter()
        .map(|e| &e.event)
        .filter(|e| e.kind == EventKind::Error)
        .map(|e| (e.unix_ms, e.detected_unix_ms, e.cause.as_str().to_owned()))
        .collect();
    if lost.is_empty() {
        // A run stopped by an error the failover layer did not log (a plain QP, or a
        // failure outside it): the loss is when the timeline ends.
        if let Some(err) = &client.error {
            let end = client.timeline.last().map_or(0.0, |s| s.unix_ms);
            lost.push((end, end, err.clone()));
        }
    }
    let paths = Availability::from_log_and_reports(log, link_reports);
    lost.into_iter()
        .map(|(at, detected, cause)| {
            let until = at.max(detected + rc_budget_ms);
            let rails = paths.rails_up_during(detected, until);
            Loss {
                unix_ms: at,
                detected_unix_ms: detected,
                cause,
                path_up_within_budget: !rails.is_empty(),
                rails_up_within_budget: rails,
            }
        })
        .collect()
}

/// An event of `kind` completed at `unix_ms`, detected then, with nothing copied, for tests.
#[cfg(test)]
pub(crate) fn test_event(kind: EventKind, unix_ms: f64) -> AppEvent {
    let event = FailoverEvent {
        kind,
        unix_ms,
        cause: pmd::resilient::Cause::LinkDown,
        device: "soft:nic0".to_owned(),
        detected_unix_ms: unix_ms,
        first_success_unix_ms: None,
        fallback_latency_us: None,
        wqes_copied: 0,
        wqes_retransmitted: 0,
        wqes_skipped: 0,
        epoch: 0,
    };
    AppEvent { event, qp: None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pmd::resilient::Cause;

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
                    AppEvent {
                        event: FailoverEvent {
                            detected_unix_ms: 2001.5,
                            first_success_unix_ms: Some(2003.0),
                            fallback_latency_us: Some(1500.0),
                            ..test_event(EventKind::Failover, 2004.0).event
                        },
                        qp: None,
                    },
                    test_event(EventKind::SwitchBack, 4050.0),
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
        let f = figures(&app, None, &log, &[], &[], 100.0, 537.0);
        assert_eq!(f.bw_before_gbps, 4.0);
        assert_eq!(f.bw_during_gbps, 2.0);
        assert_eq!(f.bw_after_gbps, 4.0);
    }

    #[test]
    fn detection_fallback_and_switchback_are_measured_from_the_log() {
        let (app, log) = story();
        let f = figures(&app, None, &log, &[], &[], 100.0, 537.0);
        assert_eq!(f.detection_ms, Some(1.5));
        assert_eq!(f.backup_traffic_ms.p50, Some(3.0));
        assert_eq!(f.fallback_latency_us.p50, Some(1500.0));
        assert_eq!(f.switchback_ms.p50, Some(50.0));
    }

    #[test]
    fn a_failover_soon_after_a_backup_rail_event_is_left_out_of_the_settled_fallback() {
        let (mut app, mut log) = story();
        // A second failover at 5 s, 600 ms after the backup NIC came back: it waited for the
        // backup path and counts only in the whole distribution.
        let mut late = app.failover.events[0].clone();
        late.event.detected_unix_ms = 5001.5;
        late.event.first_success_unix_ms = Some(5300.0);
        late.event.fallback_latency_us = Some(298_500.0);
        app.failover.events.push(late);
        let backup = |action, at| LogEntry {
            rail: 1,
            ..entry("initiator-nic1", action, at)
        };
        log.push(backup(LinkAction::Down, 4200.0));
        log.push(backup(LinkAction::Up, 4400.0));
        let f = figures(&app, None, &log, &[], &[], 100.0, 537.0);
        assert_eq!(f.fallback_latency_us.samples, 2);
        assert_eq!(f.fallback_latency_us.max, Some(298_500.0));
        assert_eq!(f.fallback_settled_backup_us.samples, 1);
        assert_eq!(f.fallback_settled_backup_us.p99, Some(1500.0));
        // A backup device failing its QPs (an instant, no window) during the first failover
        // leaves it out too.
        log.push(LogEntry {
            rail: 1,
            ..entry("initiator-dev1-qps-failed", LinkAction::Down, 2002.0)
        });
        let f = figures(&app, None, &log, &[], &[], 100.0, 537.0);
        assert_eq!(f.fallback_settled_backup_us.samples, 0);
    }

    #[test]
    fn a_link_watch_faster_than_the_ip_command_still_counts_as_detection() {
        let (app, mut log) = story();
        // `ip` returned 3 ms after it was issued; the app saw the link go at 2001.5.
        log[0].unix_ms = 2003.0;
        let f = figures(&app, None, &log, &[], &[], 100.0, 537.0);
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
        assert_eq!(
            figures(&app, Some(&server), &log, &[], &[], 100.0, 537.0).data_errors,
            4
        );
    }

    #[test]
    fn a_run_that_stopped_at_the_failure_has_nothing_during_or_after() {
        let (mut app, log) = story();
        app.timeline.retain(|s| s.unix_ms <= 2000.0);
        app.failover = FailoverSummary::default();
        let f = figures(&app, None, &log, &[], &[], 100.0, 537.0);
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

    fn failover_at(first_success: f64, qp: Option<u32>) -> AppEvent {
        let event = FailoverEvent {
            detected_unix_ms: 2001.0,
            first_success_unix_ms: Some(first_success),
            ..test_event(EventKind::Failover, first_success).event
        };
        AppEvent { event, qp }
    }

    #[test]
    fn all_on_backup_waits_for_the_last_qp_by_its_index() {
        let (mut app, log) = story();
        app.qps = Some(3);
        // QP 1 succeeds twice; QP 2 last, 40 ms after the link went down at 2000.
        app.failover.events = vec![
            failover_at(2010.0, Some(0)),
            failover_at(2012.0, Some(1)),
            failover_at(2015.0, Some(1)),
            failover_at(2040.0, Some(2)),
        ];
        let f = figures(&app, None, &log, &[], &[], 100.0, 537.0);
        assert_eq!(f.qps, 3);
        assert_eq!(f.all_on_backup_ms.p50, Some(40.0));
        assert_eq!(f.all_on_backup_basis.as_deref(), Some("qp"));
    }

    #[test]
    fn all_on_backup_counts_events_when_the_apps_give_no_qp_index() {
        let (mut app, log) = story();
        app.qps = Some(2);
        app.failover.events = vec![failover_at(2030.0, None), failover_at(2010.0, None)];
        let f = figures(&app, None, &log, &[], &[], 100.0, 537.0);
        assert_eq!(f.all_on_backup_ms.p50, Some(30.0));
        assert_eq!(f.all_on_backup_basis.as_deref(), Some("event-count"));
    }

    #[test]
    fn all_on_backup_has_no_sample_when_a_qp_never_got_there() {
        let (mut app, log) = story();
        app.qps = Some(3);
        app.failover.events = vec![failover_at(2010.0, Some(0)), failover_at(2012.0, Some(1))];
        let f = figures(&app, None, &log, &[], &[], 100.0, 537.0);
        assert_eq!(f.all_on_backup_ms.samples, 0);
        // One QP, the single failover of the story: the same as traffic on the backup.
        let (app, log) = story();
        let f = figures(&app, None, &log, &[], &[], 100.0, 537.0);
        assert_eq!(f.all_on_backup_ms.p50, f.backup_traffic_ms.p50);
    }

    fn lost_at(detected: f64, at: f64) -> AppEvent {
        let event = FailoverEvent {
            cause: Cause::BackupUnavailable,
            detected_unix_ms: detected,
            ..test_event(EventKind::Error, at).event
        };
        AppEvent { event, qp: None }
    }

    #[test]
    fn a_loss_while_the_other_rail_was_up_is_the_drivers_fault() {
        let (mut app, _) = story();
        // Both default NICs down and back, then the initiator's
        // backup NIC down (for longer than the budget) while traffic is on the backup; the
        // default rail is up.
        let log = vec![
            entry("both-nic0", LinkAction::Down, 1000.0),
            entry("both-nic0", LinkAction::Up, 1350.0),
            entry("initiator-nic1", LinkAction::Down, 1780.0),
            entry("initiator-nic1", LinkAction::Up, 2400.0),
        ];
        app.failover.events = vec![lost_at(1781.0, 1781.5)];
        let f = figures(&app, None, &log, &[], &[], 100.0, 537.0);
        assert_eq!(
            (f.connections_lost, f.connections_lost_with_path_up),
            (1, 1)
        );
        assert_eq!(f.losses[0].rails_up_within_budget, vec![0]);
        assert_eq!(f.losses[0].cause, "backup-unavailable");
    }

    #[test]
    fn a_loss_with_every_rail_down_beyond_the_budget_is_not() {
        let (mut app, _) = story();
        let log = vec![
            entry("initiator-nic0", LinkAction::Down, 1000.0),
            entry("initiator-nic1", LinkAction::Down, 1010.0),
            entry("initiator-nic0", LinkAction::Up, 3000.0),
            entry("initiator-nic1", LinkAction::Up, 3000.0),
        ];
        app.failover.events = vec![lost_at(1010.0, 1560.0)];
        let f = figures(&app, None, &log, &[], &[], 100.0, 537.0);
        assert_eq!(
            (f.connections_lost, f.connections_lost_with_path_up),
            (1, 0)
        );
        // The same loss, but rail 0 is back 500 ms after the detection: within the budget.
        let mut log = log;
        log[2].issued_unix_ms = 1510.0;
        let f = figures(&app, None, &log, &[], &[], 100.0, 537.0);
        assert_eq!(f.connections_lost_with_path_up, 1);
    }

    #[test]
    fn a_run_error_without_an_error_event_is_one_loss_at_the_end_of_the_timeline() {
        let (mut app, log) = story();
        app.failover = FailoverSummary::default();
        app.error = Some("RetryExcErr on wr 7".into());
        app.timeline.retain(|s| s.unix_ms <= 2600.0);
        let f = figures(&app, None, &log, &[], &[], 100.0, 537.0);
        assert_eq!(f.connections_lost, 1);
        assert_eq!(f.losses[0].unix_ms, 2600.0);
        // Rail 1 never failed in the story.
        assert!(f.losses[0].path_up_within_budget);
    }

    #[test]
    fn backup_rearms_and_fault_acks_are_read_when_present() {
        let text = r#"{"failover":{"failovers":2,"backup_rearms":3,"events":[
            {"kind":"failover","unix_ms":5.0,"cause":"link-down","device":"soft:nic0",
             "detected_unix_ms":4.0,"first_success_unix_ms":null,"fallback_latency_us":null,
             "wqes_copied":0,"wqes_retransmitted":0,"wqes_skipped":0,"t_ms":1.0,"qp":5}]},
            "faults":[{"command":"device-dead soft:nic0","applied_unix_ms":12.5}]}"#;
        let r: AppReport = serde_json::from_str(text).unwrap();
        assert_eq!(r.failover.backup_rearms, Some(3));
        assert_eq!(r.failover.events[0].qp, Some(5));
        assert_eq!(r.faults[0].applied_unix_ms, Some(12.5));
        let f = figures(&r, None, &[], &[], &[], 100.0, 537.0);
        assert_eq!(f.backup_rearms, Some(3));
        let old: AppReport = serde_json::from_str(r#"{"failover":{"failovers":1}}"#).unwrap();
        assert_eq!(
            figures(&old, None, &[], &[], &[], 100.0, 537.0).backup_rearms,
            None
        );
    }

    #[test]
    fn failbacks_are_read_when_present_and_zero_when_absent() {
        let r: AppReport =
            serde_json::from_str(r#"{"failover":{"failovers":3,"switch_backs":1,"failbacks":2}}"#)
                .unwrap();
        let f = figures(&r, None, &[], &[], &[], 100.0, 537.0);
        assert_eq!((f.failovers, f.switch_backs, f.failbacks), (3, 1, 2));
        let old: AppReport = serde_json::from_str(r#"{"failover":{"failovers":1}}"#).unwrap();
        assert_eq!(
            figures(&old, None, &[], &[], &[], 100.0, 537.0).failbacks,
            0
        );
    }

    #[test]
    fn failed_qps_open_no_window_but_judge_the_loss_they_cause() {
        let (mut app, _) = story();
        // Host B's backup device fails its QPs while traffic is on the backup (host A's
        // default NIC down); the connection is lost at once; rail 0 is back 250 ms later.
        let mut qps = entry("responder-dev1-qps-failed", LinkAction::Down, 1100.0);
        qps.rail = 1;
        let log = vec![
            entry("initiator-nic0", LinkAction::Down, 1000.0),
            qps,
            entry("initiator-nic0", LinkAction::Up, 1350.0),
        ];
        let w = windows(&log);
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!((w[0].down, w[0].up), (1000.0, Some(1350.0)));
        app.failover.events = vec![lost_at(1100.0, 1100.5)];
        let f = figures(&app, None, &log, &[], &[], 100.0, 537.0);
        // Rail 0 back within the budget: the driver could have waited for it.
        assert_eq!(f.connections_lost_with_path_up, 1);
        assert_eq!(f.losses[0].rails_up_within_budget, vec![0, 1]);
        // Rail 0 back only after the budget: neither path could carry anything.
        let mut late = log.clone();
        late[2].issued_unix_ms = 1900.0;
        let f = figures(&app, None, &late, &[], &[], 100.0, 537.0);
        assert_eq!(f.connections_lost_with_path_up, 0);
        assert!(f.losses[0].rails_up_within_budget.is_empty());
    }

    #[test]
    fn detection_and_backup_traffic_count_from_default_path_failures_only() {
        let (app, mut log) = story();
        // The backup NIC failed first, a second before the default one: no failover for it.
        let mut backup_down = entry("initiator-nic1", LinkAction::Down, 1000.0);
        backup_down.rail = 1;
        let mut backup_up = entry("initiator-nic1", LinkAction::Up, 1500.0);
        backup_up.rail = 1;
        log.splice(0..0, [backup_down, backup_up]);
        let f = figures(&app, None, &log, &[], &[], 100.0, 537.0);
        assert_eq!(f.detection_ms, Some(1.5));
        assert_eq!(f.backup_traffic_ms.samples, 1);
        assert_eq!(f.switchback_ms.samples, 1);
    }

    #[test]
    fn a_loss_is_judged_against_the_steps_the_run_did_not_reach() {
        let (mut app, _) = story();
        let log = vec![
            entry("initiator-nic1", LinkAction::Down, 1000.0),
            entry("both-nic0", LinkAction::Down, 1100.0),
        ];
        app.failover.events = vec![lost_at(1100.0, 1101.0)];
        // The client exited at once; the plan had the default NICs back 300 ms later.
        let planned = vec![entry("both-nic0", LinkAction::Up, 1400.0)];
        assert_eq!(
            figures(&app, None, &log, &[], &[], 100.0, 537.0).connections_lost_with_path_up,
            0
        );
        let f = figures(&app, None, &log, &planned, &[], 100.0, 537.0);
        assert_eq!(f.connections_lost_with_path_up, 1);
        assert_eq!(f.losses[0].rails_up_within_budget, vec![0]);
    }
}
