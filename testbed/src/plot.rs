//! The bandwidth timeline of a scenario as a PNG, with the failure windows shaded and
//! failovers and switch-backs marked: the testbed's version of the paper's figure 5; and
//! times against the number of QPs, for the QP sweep.

use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::report::{AppReport, Window};

/// Fonts plotters can draw with, searched in this order.
const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// Why a plot could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// No usable font on the machine.
    #[error("no font to draw with (looked for {0}); install Debian's fonts-dejavu-core")]
    NoFont(String),
    /// Nothing to plot.
    #[error("the timeline is empty: nothing to plot")]
    Empty,
    /// plotters failed (writing the file, usually).
    #[error("drawing {path}: {detail}")]
    Draw {
        /// The output file.
        path: String,
        /// What plotters said.
        detail: String,
    },
}

/// Registers a system font under the family name "sans-serif", once per process.
fn ensure_font() -> Result<(), PlotError> {
    static FONT: OnceLock<Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        for path in FONT_PATHS {
            if let Ok(bytes) = std::fs::read(path) {
                // plotters keeps fonts for the life of the process; leaking one file is that.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return Ok(());
                }
            }
        }
        Err(FONT_PATHS.join(", "))
    })
    .clone()
    .map_err(PlotError::NoFont)
}

/// A second run drawn beside the main one: the `--no-failover` baseline of the same scenario.
#[derive(Debug, Clone, Copy)]
pub struct Baseline<'a> {
    /// The baseline client's report.
    pub report: &'a AppReport,
    /// Why it stopped, if it did: its line then drops to zero after its last sample and stays
    /// there (the application is gone), so the picture shows what standard RDMA does.
    pub stopped: Option<&'a str>,
}

/// A run's timeline as (seconds since its own start, Gb/s): runs started at different times
/// line up, their failures being scheduled relative to their start.
fn points(report: &AppReport) -> Vec<(f64, f64)> {
    let Some(first) = report.timeline.first() else {
        return Vec::new();
    };
    let zero = first.unix_ms - first.t_ms;
    report
        .timeline
        .iter()
        .map(|s| ((s.unix_ms - zero) / 1e3, s.bw_gbps))
        .collect()
}

/// Draws `report`'s bandwidth timeline to `path` (PNG), shading `windows` (failure times, in
/// Unix ms) and marking failover events, with `baseline`'s timeline beside it if given.
/// `title` goes on top.
pub fn timeline_png(
    report: &AppReport,
    baseline: Option<Baseline<'_>>,
    windows: &[Window],
    title: &str,
    path: &Path,
) -> Result<(), PlotError> {
    ensure_font()?;
    let samples = &report.timeline;
    let first = samples.first().ok_or(PlotError::Empty)?;
    // Time zero is the start of the first interval.
    let zero = first.unix_ms - first.t_ms;
    let secs = |unix_ms: f64| (unix_ms - zero) / 1e3;
    let main = points(report);
    let base = baseline.map(|b| points(b.report)).unwrap_or_default();
    let x_max = main.iter().chain(&base).map(|p| p.0).fold(1.0f64, f64::max);
    // Head room above the data for the legend.
    let y_max = main.iter().chain(&base).map(|p| p.1).fold(0.1f64, f64::max) * 1.4;
    let draw_err = |e: &dyn std::fmt::Display| PlotError::Draw {
        path: path.display().to_string(),
        detail: e.to_string(),
    };

    let root = BitMapBackend::new(path, (1000, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| draw_err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)
        .map_err(|e| draw_err(&e))?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc("bandwidth (Gb/s)")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| draw_err(&e))?;

    let shade = RGBColor(255, 200, 200).mix(0.6);
    for w in windows {
        let x0 = secs(w.down).max(0.0);
        let x1 = w.up.map_or(x_max, secs).min(x_max);
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(x0, 0.0), (x1, y_max)],
                shade.filled(),
            )))
            .map_err(|e| draw_err(&e))?;
    }
    chart
        .draw_series(LineSeries::new(main, BLUE.stroke_width(2)))
        .map_err(|e| draw_err(&e))?
        .label(format!("{} {} B, failover on", report.tool, report.size))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE.stroke_width(2)));
    if let Some(b) = baseline {
        let mut line = base;
        let label = match (b.stopped, line.last().copied()) {
            (Some(why), Some((t, _))) => {
                // Stopped: nothing moves from its last sample on.
                line.push((t, 0.0));
                line.push((x_max, 0.0));
                format!("--no-failover (standard RDMA): stopped, {why}")
            }
            _ => "--no-failover (standard RDMA)".to_owned(),
        };
        let orange = RGBColor(230, 120, 0);
        chart
            .draw_series(LineSeries::new(line, orange.stroke_width(2)))
            .map_err(|e| draw_err(&e))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], orange.stroke_width(2))
            });
    }
    // One series per kind of event, so each kind has one legend entry.
    let kinds = [
        ("failover", RGBColor(200, 0, 0)),
        ("switch-back", RGBColor(0, 140, 0)),
        ("failback", RGBColor(0, 60, 220)),
    ];
    let color_of = |kind: &str| {
        kinds
            .iter()
            .find(|(k, _)| *k == kind)
            .map_or(RGBColor(90, 90, 90), |(_, c)| *c)
    };
    let mut seen: Vec<&str> = Vec::new();
    for e in &report.failover.events {
        if !seen.contains(&e.event.kind.as_str()) {
            seen.push(e.event.kind.as_str());
        }
    }
    for kind in seen {
        let color = color_of(kind);
        let lines: Vec<PathElement<(f64, f64)>> = report
            .failover
            .events
            .iter()
            .filter(|e| e.event.kind.as_str() == kind)
            .map(|e| secs(e.event.unix_ms))
            .filter(|x| (0.0..=x_max).contains(x))
            .map(|x| PathElement::new(vec![(x, 0.0), (x, y_max)], color.stroke_width(1)))
            .collect();
        if lines.is_empty() {
            continue;
        }
        chart
            .draw_series(lines)
            .map_err(|e| draw_err(&e))?
            .label(kind.to_owned())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y - 6), (x, y + 6)], color.stroke_width(2))
            });
    }
    if !windows.is_empty() {
        // The shaded windows, for the legend only (a zero-width rectangle outside the data).
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(0.0, 0.0), (0.0, 0.0)],
                shade.filled(),
            )))
            .map_err(|e| draw_err(&e))?
            .label("failure injected")
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 20, y + 5)], shade.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(|e| draw_err(&e))?;
    root.present().map_err(|e| draw_err(&e))?;
    Ok(())
}

/// One line of a plot against the number of QPs: (QPs, milliseconds) points.
#[derive(Debug, Clone)]
pub struct QpSeries {
    /// The legend's text.
    pub label: String,
    /// The points, in QP order.
    pub points: Vec<(f64, f64)>,
}

/// Draws `series` (milliseconds) against the number of QPs on a log scale, to `path` (PNG).
pub fn against_qps_png(series: &[QpSeries], title: &str, path: &Path) -> Result<(), PlotError> {
    ensure_font()?;
    let all = || series.iter().flat_map(|s| s.points.iter().copied());
    if all().next().is_none() {
        return Err(PlotError::Empty);
    }
    let x_max = all().map(|p| p.0).fold(1.0f64, f64::max) * 1.5;
    // Head room above the data for the legend.
    let y_max = all().map(|p| p.1).fold(0.1f64, f64::max) * 1.5;
    let draw_err = |e: &dyn std::fmt::Display| PlotError::Draw {
        path: path.display().to_string(),
        detail: e.to_string(),
    };
    let root = BitMapBackend::new(path, (1000, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| draw_err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((0.7f64..x_max).log_scale(), 0f64..y_max)
        .map_err(|e| draw_err(&e))?;
    chart
        .configure_mesh()
        .x_desc("QPs (log scale)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc("milliseconds after the failure")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| draw_err(&e))?;
    let colors = [
        BLUE,
        RGBColor(200, 0, 0),
        RGBColor(230, 120, 0),
        RGBColor(0, 140, 0),
    ];
    for (s, &color) in series.iter().zip(colors.iter().cycle()) {
        chart
            .draw_series(LineSeries::new(s.points.clone(), color.stroke_width(2)))
            .map_err(|e| draw_err(&e))?
            .label(s.label.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(s.points.iter().map(|&p| Circle::new(p, 4, color.filled())))
            .map_err(|e| draw_err(&e))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(|e| draw_err(&e))?;
    root.present().map_err(|e| draw_err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{test_event, FailoverSummary, Sample};
    use pmd::resilient::EventKind;

    #[test]
    fn a_timeline_with_a_failure_window_becomes_a_png() {
        let timeline = (1..=30)
            .map(|i| Sample {
                t_ms: f64::from(i) * 100.0,
                unix_ms: 1_000_000.0 + f64::from(i) * 100.0,
                bw_gbps: if (10..20).contains(&i) { 1.0 } else { 3.0 },
                ..Sample::default()
            })
            .collect();
        let report = AppReport {
            tool: "shift_write_bw".into(),
            size: 65536,
            timeline,
            failover: FailoverSummary {
                events: vec![test_event(EventKind::Failover, 1_001_000.0)],
                ..FailoverSummary::default()
            },
            ..AppReport::default()
        };
        let dir = std::env::temp_dir().join(format!("railshift-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("timeline.png");
        let windows = [Window {
            down: 1_001_000.0,
            up: Some(1_002_000.0),
            rail: 0,
        }];
        let stopped = AppReport {
            timeline: report.timeline[..10].to_vec(),
            ..report.clone()
        };
        let baseline = Baseline {
            report: &stopped,
            stopped: Some("RetryExcErr"),
        };
        match timeline_png(&report, Some(baseline), &windows, "initiator-nic", &path) {
            Err(PlotError::NoFont(where_)) => {
                eprintln!("skipped: no font on this machine ({where_})");
                return;
            }
            other => other.expect("plot"),
        }
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert!(
            bytes.len() > 5_000,
            "suspiciously small PNG: {} bytes",
            bytes.len()
        );
        if std::env::var_os("RAILSHIFT_KEEP_PLOT").is_none() {
            std::fs::remove_dir_all(&dir).ok();
        }
    }

    #[test]
    fn an_empty_timeline_is_an_error_not_a_blank_picture() {
        let path = std::env::temp_dir().join("railshift-empty.png");
        let err = timeline_png(&AppReport::default(), None, &[], "x", &path).unwrap_err();
        assert!(
            matches!(err, PlotError::Empty | PlotError::NoFont(_)),
            "{err}"
        );
    }
}
