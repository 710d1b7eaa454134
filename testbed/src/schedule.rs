//! Failure schedules: once, flapping, or random failures drawn from a set of targets, with
//! up times from one or several ranges and, optionally, failures that overlap in time.
//!
//! A schedule is computed first (pure, seeded, printable) and then executed against the
//! clock ([`crate::fail::run`]), so the same flags and seed always give the same steps.

use std::fmt;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::target::FailTarget;

/// An inclusive range of durations a time is drawn from.
pub type TimeRange = (Duration, Duration);

/// Link direction of one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkAction {
    /// The target fails (`ip link set dev X down`, or the device dies).
    Down,
    /// The target recovers (`ip link set dev X up`).
    Up,
}

impl fmt::Display for LinkAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LinkAction::Down => "down",
            LinkAction::Up => "up",
        })
    }
}

/// One planned step: at `at` after the start, set `target` `action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Step {
    /// Offset from the start of the plan.
    #[serde(serialize_with = "ser_ms")]
    pub at: Duration,
    /// What to cut or restore.
    pub target: FailTarget,
    /// Down or up.
    pub action: LinkAction,
}

fn ser_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1e3)
}

/// A failure schedule, before it is turned into steps.
#[derive(Debug, Clone, PartialEq)]
pub enum Schedule {
    /// Down at `at`; up again `duration` later, or never when `duration` is `None`.
    Once {
        /// The target.
        target: FailTarget,
        /// When it goes down.
        at: Duration,
        /// How long it stays down.
        duration: Option<Duration>,
    },
    /// `count` down/up cycles of one target starting at `start`, each down for a time drawn
    /// from `down` and then up for a time drawn from `up` (see [`draw_up`]), from `seed`.
    Flap {
        /// The target.
        target: FailTarget,
        /// When the first down happens.
        start: Duration,
        /// Number of down/up cycles.
        count: u32,
        /// Range of down times.
        down: TimeRange,
        /// Ranges of up times between cycles.
        up: Vec<TimeRange>,
        /// Seed of the draws.
        seed: u64,
    },
    /// `count` failures, each of a target drawn from `targets`, down for a time from `down`;
    /// after it, the next failure either overlaps it (with probability `overlap`: it starts
    /// while this one is still down, on a target that shares no link with any failure still
    /// down) or follows an up time drawn from `up` after every failure so far has recovered.
    /// A failure without an up step that recovers (a device's QPs failing) is an instant:
    /// its drawn down time is the time left to the driver to repair it, a window later
    /// failures follow or overlap as they do a link's, but no step ends it.
    /// The soak test's schedule.
    Random {
        /// The targets to draw from.
        targets: Vec<FailTarget>,
        /// When the first failure happens.
        start: Duration,
        /// Number of failures.
        count: u32,
        /// Range of down times.
        down: TimeRange,
        /// Ranges of up times between failures.
        up: Vec<TimeRange>,
        /// Probability (0..=1) that a failure starts while the previous one is still down.
        overlap: f64,
        /// Seed of the draws.
        seed: u64,
    },
    /// Both rails' links failing at random, each rail on its own clock, failures starting
    /// from `start` until `until`, both rails down together for at most `max_both_down`
    /// (the `chaos` scenario, [`crate::chaos::draw_failures`]).
    Chaos {
        /// When the chaos starts.
        start: Duration,
        /// When failures stop starting.
        until: Duration,
        /// Range of down times.
        down: TimeRange,
        /// Ranges of up times between a rail's failures.
        up: Vec<TimeRange>,
        /// The longest time both rails may be down together.
        max_both_down: Duration,
        /// Seed of the draws.
        seed: u64,
    },
}

/// A time drawn uniformly from `lo..=hi` (microsecond resolution).
pub(crate) fn draw(rng: &mut ChaCha8Rng, (lo, hi): TimeRange) -> Duration {
    if hi <= lo {
        return lo;
    }
    let lo_us = lo.as_micros() as u64;
    let hi_us = hi.as_micros() as u64;
    Duration::from_micros(rng.random_range(lo_us..=hi_us))
}

/// An up time: one of `ranges` drawn uniformly, then a time in it. With a single range
/// nothing is drawn for the choice, so schedules made before several ranges existed are
/// drawn exactly as they were.
pub fn draw_up(rng: &mut ChaCha8Rng, ranges: &[TimeRange]) -> Duration {
    match ranges {
        [] => Duration::ZERO,
        [only] => draw(rng, *only),
        many => {
            let pick = many[rng.random_range(0..many.len())];
            draw(rng, pick)
        }
    }
}

/// A failure placed on the timeline: `target` down from `down` to `up`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    /// What fails.
    pub target: FailTarget,
    /// When it goes down, from the start of the traffic.
    pub down: Duration,
    /// When it comes back (a target without an up step: when the window drawn for its repair
    /// ends).
    pub up: Duration,
}

/// A schedule drawn once: the failures as placed and the steps that carry them out. A run
/// executes the steps and its verdict judges against the same failures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Drawn {
    /// Each failure with its down and up times (`once` has its steps only: its target may
    /// stay down).
    pub failures: Vec<Placed>,
    /// The steps, in time order (a dead device has no up step).
    pub steps: Vec<Step>,
}

impl Schedule {
    /// The steps of this schedule, in time order (a dead device has no up step).
    pub fn steps(&self) -> Vec<Step> {
        self.draw().steps
    }

    /// Draws the schedule: the same schedule always draws the same failures and steps.
    pub fn draw(&self) -> Drawn {
        let placed = match self {
            Schedule::Once {
                target,
                at,
                duration,
            } => {
                let mut steps = vec![Step {
                    at: *at,
                    target: *target,
                    action: LinkAction::Down,
                }];
                if let Some(d) = duration.filter(|_| target.has_up_step()) {
                    steps.push(Step {
                        at: *at + d,
                        target: *target,
                        action: LinkAction::Up,
                    });
                }
                return Drawn {
                    failures: Vec::new(),
                    steps,
                };
            }
            Schedule::Flap {
                target,
                start,
                count,
                down,
                up,
                seed,
            } => {
                let mut rng = ChaCha8Rng::seed_from_u64(*seed);
                let mut t = *start;
                let mut placed = Vec::with_capacity(*count as usize);
                for _ in 0..*count {
                    let end = t + draw(&mut rng, *down);
                    placed.push(Placed {
                        target: *target,
                        down: t,
                        up: end,
                    });
                    t = end + draw_up(&mut rng, up);
                }
                placed
            }
            Schedule::Random {
                targets,
                start,
                count,
                down,
                up,
                overlap,
                seed,
            } => random(targets, *start, *count, *down, up, *overlap, *seed),
            Schedule::Chaos {
                start,
                until,
                down,
                up,
                max_both_down,
                seed,
            } => crate::chaos::draw_failures(*start, *until, *down, up, *max_both_down, *seed),
        };
        let mut steps = Vec::with_capacity(placed.len() * 2);
        for p in &placed {
            steps.push(Step {
                at: p.down,
                target: p.target,
                action: LinkAction::Down,
            });
            if p.target.has_up_step() {
                steps.push(Step {
                    at: p.up,
                    target: p.target,
                    action: LinkAction::Up,
                });
            }
        }
        // Stable: a recovery and a failure planned for the same instant keep their order.
        steps.sort_by_key(|s| s.at);
        Drawn {
            failures: placed,
            steps,
        }
    }
}

fn random(
    targets: &[FailTarget],
    start: Duration,
    count: u32,
    down: TimeRange,
    up: &[TimeRange],
    overlap: f64,
    seed: u64,
) -> Vec<Placed> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut placed: Vec<Placed> = Vec::with_capacity(count as usize);
    // When the next failure starts if it does not overlap: an up time after the last
    // recovery so far.
    let mut next_sequential = start;
    if targets.is_empty() {
        return placed;
    }
    let overlap = overlap.clamp(0.0, 1.0);
    for _ in 0..count {
        // The draw for overlap is made only when overlap is possible, so a schedule without
        // overlap draws exactly what it drew before overlap existed.
        let overlapping = match placed.last() {
            Some(_) if overlap > 0.0 => rng.random_bool(overlap),
            _ => false,
        };
        let mut at = next_sequential;
        let mut eligible: Vec<FailTarget> = targets.to_vec();
        if let (true, Some(prev)) = (overlapping, placed.last()) {
            // Strictly inside the previous failure's window.
            let inside = (prev.up - prev.down).saturating_sub(Duration::from_micros(1));
            let candidate = prev.down + draw(&mut rng, (Duration::ZERO, inside));
            let free: Vec<FailTarget> = targets
                .iter()
                .filter(|t| {
                    !placed.iter().any(|p| {
                        p.down <= candidate && candidate < p.up && p.target.conflicts_with(t)
                    })
                })
                .copied()
                .collect();
            // Nothing free to fail beside what is down: this failure follows instead.
            if !free.is_empty() {
                at = candidate;
                eligible = free;
            }
        }
        let target = eligible[rng.random_range(0..eligible.len())];
        let end = at + draw(&mut rng, down);
        let gap = draw_up(&mut rng, up);
        placed.push(Placed {
            target,
            down: at,
            up: end,
        });
        let last_recovery = placed.iter().map(|p| p.up).max().unwrap_or(end);
        next_sequential = last_recovery + gap;
    }
    placed
}

/// Parses `2s`, `150ms`, `2.5s`, `300us`; a bare number is seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else {
        (t, 1.0)
    };
    let value: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("bad duration {text:?}: use e.g. 2s, 150ms, 2.5s"))?;
    if !value.is_finite() || value < 0.0 {
        return Err(format!(
            "bad duration {text:?}: must be a non-negative time"
        ));
    }
    Ok(Duration::from_secs_f64(value * scale))
}

/// Parses a range `50ms..300ms` (or a single duration, meaning exactly that).
pub fn parse_range(text: &str) -> Result<TimeRange, String> {
    match text.split_once("..") {
        Some((lo, hi)) => {
            let (lo, hi) = (parse_duration(lo)?, parse_duration(hi)?);
            if hi < lo {
                return Err(format!("bad range {text:?}: the end is before the start"));
            }
            Ok((lo, hi))
        }
        None => {
            let d = parse_duration(text)?;
            Ok((d, d))
        }
    }
}

/// Parses one or more ranges separated by commas: `300ms..600ms,1.2s..1.6s`. Each failure
/// draws one of them (with equal odds), then a time in it.
pub fn parse_ranges(text: &str) -> Result<Vec<TimeRange>, String> {
    text.split(',')
        .map(|part| {
            if part.trim().is_empty() {
                Err(format!("bad ranges {text:?}: an empty range"))
            } else {
                parse_range(part)
            }
        })
        .collect()
}

/// Parses a probability `0..=1` (`--overlap`).
pub fn parse_probability(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => Err(format!(
            "bad probability {text:?}: use a number from 0 to 1"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::TargetSet;
    use crate::topology::Role;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn default_three() -> Vec<FailTarget> {
        vec![
            FailTarget::InitiatorNic { rail: 0 },
            FailTarget::ResponderNic { rail: 0 },
            FailTarget::SwitchPort {
                rail: 0,
                host: Role::Initiator,
            },
        ]
    }

    fn random_schedule(
        targets: Vec<FailTarget>,
        up: Vec<TimeRange>,
        overlap: f64,
        seed: u64,
    ) -> Schedule {
        Schedule::Random {
            targets,
            start: ms(0),
            count: 200,
            down: (ms(50), ms(300)),
            up,
            overlap,
            seed,
        }
    }

    /// Down windows `(target, down, up)` of a schedule's steps.
    fn windows(steps: &[Step]) -> Vec<(FailTarget, Duration, Duration)> {
        let mut open: Vec<(FailTarget, Duration)> = Vec::new();
        let mut out = Vec::new();
        for s in steps {
            match s.action {
                // An instant (a device's QPs failing) opens no window.
                LinkAction::Down if !s.target.has_up_step() => {}
                LinkAction::Down => open.push((s.target, s.at)),
                LinkAction::Up => {
                    let i = open
                        .iter()
                        .position(|(t, _)| *t == s.target)
                        .expect("up without down");
                    let (t, d) = open.remove(i);
                    out.push((t, d, s.at));
                }
            }
        }
        assert!(open.is_empty(), "never recovered: {open:?}");
        out
    }

    #[test]
    fn a_chaos_schedule_draws_the_failures_its_verdict_judges_and_steps_from_them() {
        let schedule = Schedule::Chaos {
            start: ms(2000),
            until: ms(30_000),
            down: (ms(100), ms(2000)),
            up: vec![(ms(300), ms(3000))],
            max_both_down: ms(1000),
            seed: 3,
        };
        let drawn = schedule.draw();
        let failures = crate::chaos::draw_failures(
            ms(2000),
            ms(30_000),
            (ms(100), ms(2000)),
            &[(ms(300), ms(3000))],
            ms(1000),
            3,
        );
        assert_eq!(drawn.failures, failures);
        assert_eq!(drawn.steps, schedule.steps());
        assert_eq!(drawn.steps.len(), 2 * failures.len());
        for f in &failures {
            for (at, action) in [(f.down, LinkAction::Down), (f.up, LinkAction::Up)] {
                let step = Step {
                    at,
                    target: f.target,
                    action,
                };
                assert!(drawn.steps.contains(&step), "{step:?} not drawn");
            }
        }
    }

    #[test]
    fn once_with_duration_goes_down_then_up() {
        let target = FailTarget::InitiatorNic { rail: 0 };
        let steps = Schedule::Once {
            target,
            at: ms(2000),
            duration: Some(ms(2000)),
        }
        .steps();
        assert_eq!(steps.len(), 2);
        assert_eq!((steps[0].at, steps[0].action), (ms(2000), LinkAction::Down));
        assert_eq!((steps[1].at, steps[1].action), (ms(4000), LinkAction::Up));
    }

    #[test]
    fn a_dead_device_has_no_up_step() {
        let steps = Schedule::Once {
            target: FailTarget::DeviceDead {
                host: Role::Initiator,
                rail: 0,
            },
            at: ms(2000),
            duration: Some(ms(2000)),
        }
        .steps();
        assert_eq!(steps.len(), 1);
        assert_eq!(steps[0].action, LinkAction::Down);
    }

    #[test]
    fn flap_alternates_and_stays_within_its_ranges() {
        let steps = Schedule::Flap {
            target: FailTarget::ResponderNic { rail: 0 },
            start: ms(100),
            count: 20,
            down: (ms(50), ms(300)),
            up: vec![(ms(100), ms(200))],
            seed: 7,
        }
        .steps();
        assert_eq!(steps.len(), 40);
        for pair in steps.chunks(2) {
            assert_eq!(pair[0].action, LinkAction::Down);
            assert_eq!(pair[1].action, LinkAction::Up);
            let down_for = pair[1].at - pair[0].at;
            assert!((ms(50)..=ms(300)).contains(&down_for), "{down_for:?}");
        }
        for w in steps.windows(2) {
            assert!(w[0].at <= w[1].at);
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_schedule_and_another_seed_does_not() {
        for overlap in [0.0, 0.5] {
            let make = |seed| {
                random_schedule(
                    TargetSet::ALL.to_vec(),
                    vec![(ms(10), ms(100)), (ms(1200), ms(1600))],
                    overlap,
                    seed,
                )
                .steps()
            };
            assert_eq!(make(1), make(1), "overlap {overlap}");
            assert_ne!(make(1), make(2), "overlap {overlap}");
        }
    }

    /// The default soak (three kinds on rail 0, one up range, no overlap) is drawn exactly as
    /// before targets, up-range lists and overlap existed: the first failures of seed 1, as the
    /// code of commit 631a422 drew them.
    #[test]
    fn the_default_soak_schedule_is_unchanged() {
        let steps = Schedule::Random {
            targets: default_three(),
            start: ms(2000),
            count: 200,
            down: (ms(50), ms(300)),
            up: vec![(ms(1200), ms(1600))],
            overlap: 0.0,
            seed: 1,
        }
        .steps();
        let old = old_random(
            &default_three(),
            ms(2000),
            200,
            (ms(50), ms(300)),
            (ms(1200), ms(1600)),
            1,
        );
        assert_eq!(steps, old);
    }

    /// The random schedule as it was drawn before this module existed (kind, down, up).
    fn old_random(
        kinds: &[FailTarget],
        start: Duration,
        count: u32,
        down: TimeRange,
        up: TimeRange,
        seed: u64,
    ) -> Vec<Step> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut t = start;
        let mut steps = Vec::new();
        for _ in 0..count {
            let target = kinds[rng.random_range(0..kinds.len())];
            steps.push(Step {
                at: t,
                target,
                action: LinkAction::Down,
            });
            t += draw(&mut rng, down);
            steps.push(Step {
                at: t,
                target,
                action: LinkAction::Up,
            });
            t += draw(&mut rng, up);
        }
        steps.sort_by_key(|s| s.at);
        steps
    }

    #[test]
    fn random_schedule_uses_every_target_it_is_given() {
        let steps = random_schedule(TargetSet::ALL.to_vec(), vec![(ms(1), ms(2))], 0.3, 3).steps();
        for t in TargetSet::ALL {
            assert!(steps.iter().any(|s| s.target == t), "{t} never drawn");
        }
    }

    /// `all` without the instants (a device's QPs failing): the targets whose failures are
    /// windows.
    fn link_targets() -> Vec<FailTarget> {
        TargetSet::ALL
            .into_iter()
            .filter(FailTarget::has_up_step)
            .collect()
    }

    #[test]
    fn a_device_whose_qps_failed_is_an_instant_the_next_failure_follows() {
        let qps_failed = FailTarget::DeviceQpsFailed {
            host: Role::Initiator,
            rail: 1,
        };
        let nic = FailTarget::InitiatorNic { rail: 0 };
        let steps =
            random_schedule(vec![qps_failed, nic], vec![(ms(100), ms(200))], 0.0, 4).steps();
        let faults: Vec<&Step> = steps.iter().filter(|s| s.target == qps_failed).collect();
        assert!(faults.len() > 50, "{} drawn", faults.len());
        assert!(faults.iter().all(|s| s.action == LinkAction::Down));
        // Without overlap nothing else fails within its down time (the driver's time to
        // repair it) and the up time after that.
        for f in faults {
            let next = steps.iter().find(|s| s.at > f.at).map(|s| s.at);
            if let Some(next) = next {
                assert!(next - f.at >= ms(150), "{:?} after {:?}", next, f.at);
            }
        }
        assert_eq!(
            windows(&steps).len(),
            200 - steps.iter().filter(|s| s.target == qps_failed).count()
        );
    }

    #[test]
    fn without_overlap_failures_follow_one_another() {
        let steps = random_schedule(link_targets(), vec![(ms(100), ms(200))], 0.0, 5).steps();
        let w = windows(&steps);
        for pair in w.windows(2) {
            let gap = pair[1].1 - pair[0].2;
            assert!((ms(100)..=ms(200)).contains(&gap), "{gap:?}");
        }
    }

    #[test]
    fn overlap_starts_a_failure_inside_the_previous_one_on_a_target_free_to_fail() {
        let seed = 11;
        let steps = random_schedule(link_targets(), vec![(ms(100), ms(200))], 0.5, seed).steps();
        let w = windows(&steps);
        assert_eq!(w.len(), 200, "seed {seed}");
        let mut overlapping = 0;
        for (i, a) in w.iter().enumerate() {
            for b in &w[i + 1..] {
                if b.1 < a.2 && a.1 < b.2 {
                    overlapping += 1;
                    assert!(
                        !a.0.conflicts_with(&b.0),
                        "seed {seed}: {} and {} overlap",
                        a.0,
                        b.0
                    );
                }
            }
        }
        // About half of 199 chances; far from none and from all.
        assert!(
            (50..=150).contains(&overlapping),
            "seed {seed}: {overlapping} overlaps"
        );
    }

    #[test]
    fn up_times_come_from_every_range_given() {
        let ranges = vec![(ms(300), ms(600)), (ms(1200), ms(1600))];
        let steps = Schedule::Flap {
            target: FailTarget::InitiatorNic { rail: 0 },
            start: ms(0),
            count: 100,
            down: (ms(50), ms(50)),
            up: ranges.clone(),
            seed: 9,
        }
        .steps();
        let gaps: Vec<Duration> = steps
            .windows(2)
            .filter(|w| w[1].action == LinkAction::Down)
            .map(|w| w[1].at - w[0].at)
            .collect();
        assert_eq!(gaps.len(), 99);
        let short = gaps
            .iter()
            .filter(|g| (ms(300)..=ms(600)).contains(g))
            .count();
        let long = gaps
            .iter()
            .filter(|g| (ms(1200)..=ms(1600)).contains(g))
            .count();
        assert_eq!(short + long, gaps.len(), "a gap outside both ranges");
        assert!(short >= 20 && long >= 20, "{short} short, {long} long");
    }

    #[test]
    fn durations_parse_with_units_and_reject_nonsense() {
        assert_eq!(parse_duration("2s").unwrap(), ms(2000));
        assert_eq!(parse_duration("150ms").unwrap(), ms(150));
        assert_eq!(parse_duration("2.5").unwrap(), ms(2500));
        assert_eq!(parse_duration("300us").unwrap(), Duration::from_micros(300));
        assert!(parse_duration("fast").unwrap_err().contains("bad duration"));
        assert!(parse_duration("-1s").is_err());
        assert_eq!(parse_range("50ms..300ms").unwrap(), (ms(50), ms(300)));
        assert!(parse_range("300ms..50ms")
            .unwrap_err()
            .contains("before the start"));
    }

    #[test]
    fn several_up_ranges_parse_and_bad_ones_are_named() {
        assert_eq!(
            parse_ranges("300ms..600ms,1.2s..1.6s").unwrap(),
            vec![(ms(300), ms(600)), (ms(1200), ms(1600))]
        );
        assert_eq!(parse_ranges("1s").unwrap(), vec![(ms(1000), ms(1000))]);
        assert!(parse_ranges("300ms..600ms,")
            .unwrap_err()
            .contains("empty range"));
        assert!(parse_ranges("1s..2s,3s..1s")
            .unwrap_err()
            .contains("before the start"));
        assert_eq!(parse_probability("0.25"), Ok(0.25));
        assert!(parse_probability("1.5").unwrap_err().contains("0 to 1"));
        assert!(parse_probability("often").is_err());
    }
}
