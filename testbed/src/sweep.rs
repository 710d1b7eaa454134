//! The QP-count sweep: one scenario run with failover at several `-q`, and how
//! long it takes until every QP has traffic on the backup (`all_on_backup_ms`), with the
//! fallback latency distribution over the QPs, against the number of QPs: JSON and a plot.
//!
//! A count the apps refuse (their `-q` has a ceiling) is recorded with the apps' own words
//! and the sweep goes on with the next.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::fail::LogEntry;
use crate::plot::{self, PlotError, QpSeries};
use crate::report::Percentiles;
use crate::scenario::{self, Op, ScenarioError, ScenarioName, ScenarioOptions, Variants};
use crate::topology::TestbedInfo;

/// The QP counts of the paper's scale figure.
pub const DEFAULT_QPS: [u32; 4] = [1, 16, 256, 1000];

/// One QP count of the sweep.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SweepPoint {
    /// The `-q` asked for.
    pub qps_asked: u32,
    /// The QPs the client reported running.
    pub qps: Option<u64>,
    /// Link-down to every QP on the backup, median over the failures (one failure: its value).
    pub all_on_backup_ms: Option<f64>,
    /// How QPs were told apart (`qp` or `event-count`, see `docs/testbed.md`).
    pub all_on_backup_basis: Option<String>,
    /// Per failover (one per QP and failure): first error to first success on the backup.
    pub fallback_latency_us: Percentiles,
    /// Per failure: link-down to the first success on the backup (of any QP).
    pub backup_traffic_ms: Percentiles,
    /// First link-down to the first error or failover action.
    pub detection_ms: Option<f64>,
    /// Per recovery: link-up to the completed switch-back.
    pub switchback_ms: Percentiles,
    /// Failovers the client's QPs completed.
    pub failovers: u64,
    /// One message on every QP at the message rate this run measured before the failure
    /// (QPs x size / bandwidth before): the medium's floor for moving every QP, since each
    /// one must at least complete a message on the backup. `None` without a bandwidth.
    pub floor_ms: Option<f64>,
    /// Why the apps did not run with this count (their refusal, or a failed start).
    pub refused: Option<String>,
    /// The error that stopped the run, if it ran and stopped.
    pub error: Option<String>,
    /// The whole scenario result of this count.
    pub result: Option<PathBuf>,
}

/// What `qp-sweep --json` writes.
#[derive(Debug, Clone, Serialize)]
pub struct SweepResult {
    /// The scenario run at each count.
    pub scenario: ScenarioName,
    /// Its traffic.
    pub op: Op,
    /// Each count, in the order asked.
    pub points: Vec<SweepPoint>,
    /// `all_on_backup_ms` at the largest count that ran, over the 1-QP figure.
    pub largest_over_one: Option<f64>,
    /// The goal: the largest count (1,000 QPs) all on the backup within 2x the 1-QP
    /// figure; `null` when either figure is missing.
    pub goal_within_2x: Option<bool>,
    /// Issue 30's goal for the largest count that ran: within 3x the 1-QP figure up to 1,000
    /// QPs, 6x above; `null` when either figure is missing.
    pub goal_issue30: Option<bool>,
}

/// Issue 30's bound on the largest count over 1 QP, for `qps` QPs.
pub fn issue30_factor(qps: u32) -> f64 {
    if qps > 1000 {
        6.0
    } else {
        3.0
    }
}

/// [`SweepPoint::floor_ms`]: `qps` messages of `size` bytes at `gbps`.
fn floor_ms(qps: u64, size: usize, gbps: f64) -> Option<f64> {
    (gbps > 0.0 && size > 0).then(|| qps as f64 * size as f64 * 8.0 / (gbps * 1e9) * 1e3)
}

/// Most QPs a count may ask for: what the apps take with `-q` (`apps::cli::MAX_QPS`).
pub const MAX_QPS: u32 = 4096;

/// Parses `1,16,256,1000`; refuses a count above [`MAX_QPS`] before anything runs.
pub fn parse_qps(text: &str) -> Result<Vec<u32>, String> {
    text.split(',')
        .map(|part| match part.trim().parse::<u32>() {
            Ok(q) if q > MAX_QPS => Err(format!(
                "QP count {q} in {text:?} is above {MAX_QPS}, the most the apps take (-q)"
            )),
            Ok(q) if q > 0 => Ok(q),
            _ => Err(format!(
                "bad QP counts {text:?}: use positive numbers separated by commas, e.g. 1,16,256,1000"
            )),
        })
        .collect()
}

/// Runs `base` (with failover only, no medium baseline) once per count in `qps`; writes each
/// count's whole result to `<out-dir>/qp-sweep-<scenario>-q<N>.json`.
pub fn run(
    info: &TestbedInfo,
    base: &ScenarioOptions,
    qps: &[u32],
    on_log: &mut (dyn FnMut(&LogEntry) + Send),
) -> Result<SweepResult, ScenarioError> {
    let mut points = Vec::with_capacity(qps.len());
    for &q in qps {
        let mut o = base.clone();
        o.qps = Some(q);
        o.variants = Variants::Failover;
        o.with_baseline = false;
        println!("qp-sweep: {} with -q {q}", scenario::scenario_slug(o.name));
        let point = match scenario::run(info, &o, on_log) {
            Ok(r) => {
                let path = o.out_dir.join(format!(
                    "qp-sweep-{}-q{q}.json",
                    scenario::scenario_slug(o.name)
                ));
                let text = serde_json::to_string_pretty(&r).map_err(|e| ScenarioError::Output {
                    path: path.clone(),
                    detail: e.to_string(),
                })?;
                std::fs::write(&path, text).map_err(|e| ScenarioError::Output {
                    path: path.clone(),
                    detail: e.to_string(),
                })?;
                let f = &r.figures;
                SweepPoint {
                    qps_asked: q,
                    qps: Some(f.qps),
                    all_on_backup_ms: f.all_on_backup_ms.p50,
                    all_on_backup_basis: f.all_on_backup_basis.clone(),
                    fallback_latency_us: f.fallback_latency_us.clone(),
                    backup_traffic_ms: f.backup_traffic_ms.clone(),
                    detection_ms: f.detection_ms,
                    switchback_ms: f.switchback_ms.clone(),
                    failovers: f.failovers,
                    floor_ms: floor_ms(f.qps, r.size, f.bw_before_gbps),
                    refused: None,
                    error: r.with_failover.as_ref().and_then(|w| w.error.clone()),
                    result: Some(path),
                }
            }
            // The apps refused the count (or could not start with it): say so, go on.
            Err(ScenarioError::App(e)) => SweepPoint {
                qps_asked: q,
                refused: Some(e.to_string()),
                ..SweepPoint::default()
            },
            Err(e) => return Err(e),
        };
        points.push(point);
    }
    let largest_over_one = largest_over_one(&points);
    let goal_issue30 = largest_over_one
        .zip(largest_ran(&points))
        .map(|(r, p)| r <= issue30_factor(p.qps_asked));
    Ok(SweepResult {
        scenario: base.name,
        op: base.op,
        points,
        largest_over_one,
        goal_within_2x: largest_over_one.map(|r| r <= 2.0),
        goal_issue30,
    })
}

/// The largest count that has an `all_on_backup_ms`, above 1 QP.
fn largest_ran(points: &[SweepPoint]) -> Option<&SweepPoint> {
    points
        .iter()
        .filter(|p| p.qps_asked > 1 && p.all_on_backup_ms.is_some())
        .max_by_key(|p| p.qps_asked)
}

/// `all_on_backup_ms` at the largest count that has one over the 1-QP figure.
fn largest_over_one(points: &[SweepPoint]) -> Option<f64> {
    let one = points
        .iter()
        .find(|p| p.qps_asked == 1)
        .and_then(|p| p.all_on_backup_ms)?;
    Some(largest_ran(points)?.all_on_backup_ms? / one)
}

/// Draws `all_on_backup_ms` and the fallback latency p50 and p99 (in ms) against the number
/// of QPs (log scale); refused counts are named in the title.
pub fn plot(result: &SweepResult, path: &Path) -> Result<(), PlotError> {
    let ran: Vec<&SweepPoint> = result
        .points
        .iter()
        .filter(|p| p.refused.is_none())
        .collect();
    let x = |p: &SweepPoint| p.qps.map_or(f64::from(p.qps_asked), |q| q as f64);
    let series = |f: &dyn Fn(&SweepPoint) -> Option<f64>| -> Vec<(f64, f64)> {
        ran.iter().filter_map(|p| f(p).map(|v| (x(p), v))).collect()
    };
    let all = [
        QpSeries {
            label: "all QPs on the backup (link-down to the last QP's first success)".into(),
            points: series(&|p| p.all_on_backup_ms),
        },
        QpSeries {
            label: "fallback latency p50 over the QPs".into(),
            points: series(&|p| p.fallback_latency_us.p50.map(|us| us / 1e3)),
        },
        QpSeries {
            label: "fallback latency p99 over the QPs".into(),
            points: series(&|p| p.fallback_latency_us.p99.map(|us| us / 1e3)),
        },
    ];
    let refused: Vec<String> = result
        .points
        .iter()
        .filter(|p| p.refused.is_some())
        .map(|p| p.qps_asked.to_string())
        .collect();
    let mut title = format!(
        "{} ({}): time to move every QP to the backup",
        scenario::scenario_slug(result.scenario),
        format!("{:?}", result.op).to_lowercase()
    );
    if !refused.is_empty() {
        title.push_str(&format!("; refused: -q {}", refused.join(", ")));
    }
    plot::against_qps_png(&all, &title, path)
}

/// Prints one line per count.
pub fn print(result: &SweepResult) {
    let ms = |v: Option<f64>| v.map_or("n/a".to_owned(), |v| format!("{v:.1} ms"));
    println!(
        "qp-sweep {} ({}):",
        scenario::scenario_slug(result.scenario),
        format!("{:?}", result.op).to_lowercase()
    );
    for p in &result.points {
        if let Some(why) = &p.refused {
            println!("  -q {:>5}: refused: {why}", p.qps_asked);
            continue;
        }
        println!(
            "  -q {:>5}: all on backup {}, fallback p50 {} p99 {} ({} failovers), traffic on backup {}, detection {}{}",
            p.qps_asked,
            ms(p.all_on_backup_ms),
            ms(p.fallback_latency_us.p50.map(|u| u / 1e3)),
            ms(p.fallback_latency_us.p99.map(|u| u / 1e3)),
            p.fallback_latency_us.samples,
            ms(p.backup_traffic_ms.p50),
            ms(p.detection_ms),
            p.error.as_ref().map_or(String::new(), |e| format!("; stopped: {e}")),
        );
    }
    let verdict = |met: bool| if met { "met" } else { "missed" };
    let one = result
        .points
        .iter()
        .find(|o| o.qps_asked == 1)
        .and_then(|o| o.all_on_backup_ms);
    if let (Some(r), Some(largest)) = (result.largest_over_one, largest_ran(&result.points)) {
        let factor = issue30_factor(largest.qps_asked);
        println!(
            "  largest count over 1 QP: {r:.2}x (issue 17's goal <= 2x: {}; issue 30's <= {factor}x at -q {}: {})",
            verdict(r <= 2.0),
            largest.qps_asked,
            verdict(r <= factor),
        );
    }
    for p in result.points.iter().filter(|p| p.qps_asked > 1) {
        let (Some(floor), Some(all)) = (p.floor_ms, p.all_on_backup_ms) else {
            continue;
        };
        println!(
            "  -q {:>5}: floor {floor:.1} ms (one message on every QP at the rate before the failure): all on backup {:.1}x the floor",
            p.qps_asked,
            all / floor,
        );
        if let Some(one) = one {
            let budget = issue30_factor(p.qps_asked) * one;
            if budget < floor {
                println!(
                    "           issue 30's budget ({}x 1 QP = {budget:.1} ms) is below this medium's floor",
                    issue30_factor(p.qps_asked)
                );
            }
            // Issue 30's goal for QPs that each carry a message in flight: the time to push
            // one message a QP through the path, plus 3x the 1-QP time.
            let goal = floor + 3.0 * one;
            println!(
                "           floor + 3x 1 QP = {goal:.1} ms: {}",
                verdict(all <= goal)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qp_counts_parse_and_nonsense_is_named() {
        assert_eq!(parse_qps("1,16,256,1000"), Ok(DEFAULT_QPS.to_vec()));
        assert_eq!(parse_qps(" 4 "), Ok(vec![4]));
        assert_eq!(parse_qps("1,4096"), Ok(vec![1, 4096]));
        assert!(parse_qps("1,4097")
            .unwrap_err()
            .contains("QP count 4097 in \"1,4097\" is above 4096"));
        for bad in ["", "1,,2", "0", "-1", "many"] {
            assert!(
                parse_qps(bad).unwrap_err().contains("bad QP counts"),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_goal_compares_the_largest_count_that_ran_with_one_qp() {
        let point = |q: u32, aob: Option<f64>| SweepPoint {
            qps_asked: q,
            all_on_backup_ms: aob,
            ..SweepPoint::default()
        };
        let points = [
            point(1, Some(20.0)),
            point(16, Some(30.0)),
            point(256, Some(50.0)),
            point(1000, None),
        ];
        assert_eq!(largest_over_one(&points), Some(2.5));
        assert_eq!(largest_over_one(&points[1..]), None, "no 1-QP figure");
        assert_eq!(largest_over_one(&points[..1]), None, "nothing but 1 QP");
    }

    #[test]
    fn the_floor_is_one_message_a_qp_at_the_rate_before_and_issue_30s_factor_grows_past_1000() {
        // 1,000 QPs of 64 bytes at 0.256 Gb/s: 512,000 bits at 256 Mb/s, 2 ms.
        let floor = floor_ms(1000, 64, 0.256).unwrap();
        assert!((floor - 2.0).abs() < 1e-9, "{floor}");
        assert_eq!(
            floor_ms(1000, 64, 0.0),
            None,
            "no bandwidth measured: no floor"
        );
        assert_eq!(floor_ms(1000, 0, 1.0), None);
        assert_eq!(issue30_factor(1000), 3.0);
        assert_eq!(issue30_factor(4096), 6.0);
    }

    #[test]
    fn a_sweep_plot_names_the_refused_counts() {
        let point = |q: u32, aob: f64| SweepPoint {
            qps_asked: q,
            qps: Some(u64::from(q)),
            all_on_backup_ms: Some(aob),
            fallback_latency_us: Percentiles::of(vec![aob * 500.0, aob * 900.0]),
            ..SweepPoint::default()
        };
        let result = SweepResult {
            scenario: ScenarioName::InitiatorNic,
            op: Op::Write,
            points: vec![
                point(1, 20.0),
                point(16, 200.0),
                SweepPoint {
                    qps_asked: 2000,
                    refused: Some("-q/--qp 2000 is outside 1..=1024".into()),
                    ..SweepPoint::default()
                },
            ],
            largest_over_one: Some(10.0),
            goal_within_2x: Some(false),
            goal_issue30: Some(false),
        };
        let path = std::env::temp_dir().join(format!("railshift-sweep-{}.png", std::process::id()));
        match plot(&result, &path) {
            Err(PlotError::NoFont(where_)) => {
                eprintln!("skipped: no font on this machine ({where_})");
                return;
            }
            other => other.expect("plot"),
        }
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        std::fs::remove_file(&path).ok();
    }
}
