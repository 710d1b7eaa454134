//! Showing a scenario's result: the summary and the timeline on the terminal, and the plot.

use super::{scenario_slug, RunResult, ScenarioResult};
use crate::plot;
use crate::report;

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
    for e in f.events.iter().map(|e| &e.event) {
        let lat = e
            .fallback_latency_us
            .map_or(String::new(), |l| format!(", fallback latency {l:.0} us"));
        println!(
            "  {} ({}) on {}: {} WQEs copied, {} retransmitted, {} skipped{lat}",
            e.kind.as_str(),
            e.cause.as_str(),
            e.device,
            e.wqes_copied,
            e.wqes_retransmitted,
            e.wqes_skipped
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
    if f.fallback_settled_backup_us.samples != f.fallback_latency_us.samples {
        println!(
            "  fallback latency onto a settled backup path (no backup-rail event for {:.0} ms before): p50 {} p99 {} ({} events)",
            crate::report::BACKUP_SETTLED_MS,
            opt(f.fallback_settled_backup_us.p50, "us"),
            opt(f.fallback_settled_backup_us.p99, "us"),
            f.fallback_settled_backup_us.samples,
        );
    }
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
}
