//! The `chaos` scenario: both rails' links fail at random, each rail on its own clock, so
//! failures overlap; a knob caps how long both rails may be down together. A lost connection
//! is judged against the longest window in which no rail's path was up (by the `ip` commands
//! the testbed issued) before it: a loss is the driver's failure unless such a window had
//! lasted the outage tolerance by the time of the loss.
//!
//! The schedule is drawn per rail: an up time, then a failure of one of the rail's four links
//! (either host's NIC, either switch port) for a down time, then an up time, and so on until
//! the end of the chaos. Rail 1 is drawn after rail 0 from the same seeded generator; where a
//! rail-1 failure is down together with a rail-0 failure for longer than the cap, the rail-1
//! failure ends early (at the start of that overlap plus the cap; one that would not last at
//! all is dropped). One link at a time per rail keeps "the rail's path is down" equal to "one
//! of its failures is down", so the cap holds for the paths, not only for single links.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::fail::LogEntry;
use crate::linkwatch::LinkChange;
use crate::paths::Availability;
use crate::report::Loss;
use crate::schedule::{draw, draw_up, Placed, TimeRange};
use crate::target::FailTarget;
use crate::topology::Role;

/// The default outage tolerance: NCCL's default per-try budget for a plain RC QP
/// (`IB_TIMEOUT` 20, `retry_cnt` 7: 8 x 4.096 us x 2^20 = 4.3 s).
pub const DEFAULT_TOLERANCE: Duration = Duration::from_millis(4300);
/// The default cap on both rails down together.
pub const DEFAULT_MAX_BOTH_DOWN: Duration = Duration::from_secs(1);
/// How long one failure keeps its link down, by default: 100 ms to 2 s.
pub const DEFAULT_DOWN: TimeRange = (Duration::from_millis(100), Duration::from_secs(2));
/// How long a rail stays up between its failures, by default: 300 ms to 3 s.
pub const DEFAULT_UP: TimeRange = (Duration::from_millis(300), Duration::from_secs(3));

/// The four links of `rail`: host A's NIC, host B's NIC, and the switch ports facing each.
pub fn rail_targets(rail: u8) -> [FailTarget; 4] {
    [
        FailTarget::InitiatorNic { rail },
        FailTarget::ResponderNic { rail },
        FailTarget::SwitchPort {
            rail,
            host: Role::Initiator,
        },
        FailTarget::SwitchPort {
            rail,
            host: Role::Responder,
        },
    ]
}

/// Failures of both rails, each rail on its own clock, from `start` until failures stop
/// starting at `until`; rail 1's are cut so that both rails are never down together for
/// longer than `max_both_down`. Sorted by their down time.
pub fn draw_failures(
    start: Duration,
    until: Duration,
    down: TimeRange,
    up: &[TimeRange],
    max_both_down: Duration,
    seed: u64,
) -> Vec<Placed> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut rails: Vec<Vec<Placed>> = Vec::with_capacity(2);
    for rail in 0..2u8 {
        let targets = rail_targets(rail);
        let mut placed = Vec::new();
        // Each rail starts with an up time of its own, so the rails do not fail in step.
        let mut t = start + draw_up(&mut rng, up);
        while t < until {
            let target = targets[rng.random_range(0..targets.len())];
            let end = t + draw(&mut rng, down).max(Duration::from_millis(1));
            placed.push(Placed {
                target,
                down: t,
                up: end,
            });
            t = end + draw_up(&mut rng, up).max(Duration::from_millis(1));
        }
        rails.push(placed);
    }
    let rail1 = std::mem::take(&mut rails[1]);
    let mut all = std::mem::take(&mut rails[0]);
    for mut b in rail1 {
        for a in &all {
            let from = a.down.max(b.down);
            let to = a.up.min(b.up);
            if to > from && to - from > max_both_down {
                b.up = from + max_both_down;
            }
        }
        if b.up > b.down {
            all.push(b);
        }
    }
    all.sort_by_key(|p| p.down);
    all
}

/// The longest time both rails are down together in `failures`, as planned.
pub fn longest_planned_both_down(failures: &[Placed]) -> Duration {
    let rail = |p: &Placed| p.target.rail();
    let mut longest = Duration::ZERO;
    for a in failures.iter().filter(|p| rail(p) == 0) {
        for b in failures.iter().filter(|p| rail(p) == 1) {
            let from = a.down.max(b.down);
            let to = a.up.min(b.up);
            if to > from {
                longest = longest.max(to - from);
            }
        }
    }
    longest
}

/// A lost connection, judged against the outage tolerance.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChaosLoss {
    /// When the error reached the application (Unix ms).
    pub unix_ms: f64,
    /// Why the connection was lost (the application's words).
    pub cause: String,
    /// The longest window before the loss in which no rail's path was up by `ip`, counted up
    /// to the loss (a window still open at the loss counts until then).
    pub longest_no_path_before_ms: f64,
    /// Whether that window reached the tolerance: a loss after that long without any path is
    /// what the tolerance allows; any other loss is the driver's failure.
    pub excused: bool,
}

/// What `chaos` reports beside the usual figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChaosReport {
    /// The outage tolerance losses are judged against.
    pub tolerance_ms: f64,
    /// The cap on both rails down together the schedule was drawn with.
    pub max_both_down_ms: f64,
    /// Link failures in the schedule (both rails, including steps not reached).
    pub failures_planned: usize,
    /// The longest time both rails are down together in the schedule as planned.
    pub longest_planned_both_down_ms: f64,
    /// The longest window in which no rail's path was up by `ip` (from when each command was
    /// issued), over the whole schedule, steps not reached at their planned times.
    pub longest_no_path_ms: f64,
    /// The same, where a link also counts down until the kernel reported it running again
    /// (it can report RUNNING up to a second after `ip link set up`): what the driver saw.
    pub longest_no_path_reported_ms: f64,
    /// Windows in which no rail's path was up by `ip`.
    pub no_path_windows: usize,
    /// Each lost connection, judged.
    pub losses: Vec<ChaosLoss>,
    /// Losses not excused by the tolerance: the driver's failures.
    pub lost_within_tolerance: u64,
}

/// Judges the run's losses: `log` is what the testbed did and did not reach (at planned
/// times), `reports` what the kernel said about the links.
pub fn judge(
    log: &[LogEntry],
    reports: &[LinkChange],
    losses: &[Loss],
    tolerance: Duration,
    max_both_down: Duration,
    planned: &[Placed],
) -> ChaosReport {
    let by_ip = Availability::from_log(log).no_path_windows();
    let reported = Availability::from_log_and_reports(log, reports).no_path_windows();
    let longest = |w: &[(f64, f64)]| w.iter().map(|(d, u)| u - d).fold(0.0, f64::max);
    let tolerance_ms = tolerance.as_secs_f64() * 1e3;
    let judged: Vec<ChaosLoss> = losses
        .iter()
        .map(|l| {
            let before = by_ip
                .iter()
                .filter(|(d, _)| *d < l.unix_ms)
                .map(|(d, u)| u.min(l.unix_ms) - d)
                .fold(0.0, f64::max);
            ChaosLoss {
                unix_ms: l.unix_ms,
                cause: l.cause.clone(),
                longest_no_path_before_ms: before,
                excused: before >= tolerance_ms,
            }
        })
        .collect();
    ChaosReport {
        tolerance_ms,
        max_both_down_ms: max_both_down.as_secs_f64() * 1e3,
        failures_planned: planned.len(),
        longest_planned_both_down_ms: longest_planned_both_down(planned).as_secs_f64() * 1e3,
        longest_no_path_ms: longest(&by_ip),
        longest_no_path_reported_ms: longest(&reported),
        no_path_windows: by_ip.len(),
        lost_within_tolerance: judged.iter().filter(|l| !l.excused).count() as u64,
        losses: judged,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::LinkAction;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn plan(max_both_down: Duration, seed: u64) -> Vec<Placed> {
        draw_failures(
            ms(2000),
            ms(60_000),
            (ms(100), ms(2000)),
            &[(ms(300), ms(3000))],
            max_both_down,
            seed,
        )
    }

    #[test]
    fn both_rails_fail_and_their_failures_overlap() {
        for seed in 1..=5 {
            let p = plan(ms(1000), seed);
            for rail in 0..2 {
                assert!(
                    p.iter().filter(|f| f.target.rail() == rail).count() >= 5,
                    "seed {seed}: rail {rail} hardly fails"
                );
            }
            assert!(
                longest_planned_both_down(&p) > Duration::ZERO,
                "seed {seed}: the rails never overlap"
            );
        }
    }

    #[test]
    fn both_rails_are_never_down_together_longer_than_the_cap() {
        for (cap, seed) in [(0, 1), (200, 2), (1000, 3), (3000, 4)] {
            let p = plan(ms(cap), seed);
            let longest = longest_planned_both_down(&p);
            assert!(longest <= ms(cap), "seed {seed}: {longest:?} over {cap} ms");
        }
        // Without the cap the same draws overlap for longer: the cap did the cutting.
        assert!(longest_planned_both_down(&plan(ms(3_600_000), 3)) > ms(1000));
    }

    #[test]
    fn one_link_at_a_time_per_rail_and_every_failure_recovers() {
        let p = plan(ms(1000), 7);
        for rail in 0..2 {
            let mine: Vec<&Placed> = p.iter().filter(|f| f.target.rail() == rail).collect();
            for w in mine.windows(2) {
                assert!(
                    w[0].up <= w[1].down,
                    "rail {rail}: {:?} overlaps {:?}",
                    w[0],
                    w[1]
                );
            }
            assert!(mine.iter().all(|f| f.up > f.down));
        }
    }

    #[test]
    fn the_same_seed_draws_the_same_schedule() {
        assert_eq!(plan(ms(1000), 9), plan(ms(1000), 9));
        assert_ne!(plan(ms(1000), 9), plan(ms(1000), 10));
    }

    fn entry(target: &str, action: LinkAction, at: f64) -> LogEntry {
        LogEntry {
            t_ms: 0.0,
            unix_ms: at,
            planned_ms: 0.0,
            target: target.to_owned(),
            rail: 0,
            action,
            netns: String::new(),
            dev: String::new(),
            error: None,
            issued_unix_ms: at,
        }
    }

    fn loss(at: f64) -> Loss {
        Loss {
            unix_ms: at,
            detected_unix_ms: at,
            cause: "backup-unavailable".into(),
            ..Loss::default()
        }
    }

    /// Rail 0 down 1000..6000, rail 1 down 2000..3000 and 4000..9000: no path 2000..3000
    /// (1 s) and 4000..6000 (2 s).
    fn log() -> Vec<LogEntry> {
        vec![
            entry("initiator-nic0", LinkAction::Down, 1000.0),
            entry("switch1-port-b", LinkAction::Down, 2000.0),
            entry("switch1-port-b", LinkAction::Up, 3000.0),
            entry("responder-nic1", LinkAction::Down, 4000.0),
            entry("initiator-nic0", LinkAction::Up, 6000.0),
            entry("responder-nic1", LinkAction::Up, 9000.0),
        ]
    }

    #[test]
    fn the_longest_window_without_any_path_is_where_both_rails_are_down() {
        let r = judge(&log(), &[], &[], ms(4300), ms(3000), &[]);
        assert_eq!(r.no_path_windows, 2);
        assert_eq!(r.longest_no_path_ms, 2000.0);
        assert_eq!(r.lost_within_tolerance, 0);
    }

    #[test]
    fn a_loss_before_any_window_reached_the_tolerance_is_a_failure() {
        // Lost 500 ms into the second window: the longest before it is the first, 1 s.
        let r = judge(&log(), &[], &[loss(4500.0)], ms(4300), ms(3000), &[]);
        assert_eq!(r.losses[0].longest_no_path_before_ms, 1000.0);
        assert!(!r.losses[0].excused);
        assert_eq!(r.lost_within_tolerance, 1);
        // With a tolerance of 1.5 s, the second window had lasted it by 5600 ms.
        let r = judge(&log(), &[], &[loss(5600.0)], ms(1500), ms(3000), &[]);
        assert!(r.losses[0].excused, "{r:?}");
        assert_eq!(r.lost_within_tolerance, 0);
        // But not by 5400 ms: the driver gave up before the tolerance ran out.
        let r = judge(&log(), &[], &[loss(5400.0)], ms(1500), ms(3000), &[]);
        assert!(!r.losses[0].excused, "{r:?}");
    }
}
