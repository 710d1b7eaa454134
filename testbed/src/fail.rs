//! Failure injection: `ip link set dev X down/up` on a host NIC or a switch port, at a given
//! time, for a given duration, or on a flapping schedule, with every action logged.
//!
//! A plan is computed first (pure, seeded, printable) and then executed against the clock, so
//! the same flags and seed always give the same schedule.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::ip::ip_in;
use crate::topology::{Role, TestbedInfo};

/// What can be cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum FailTarget {
    /// The initiator's (host A's) NIC on `rail`.
    InitiatorNic {
        /// The rail (0 is the default NIC).
        rail: u8,
    },
    /// The responder's (host B's) NIC on `rail`.
    ResponderNic {
        /// The rail.
        rail: u8,
    },
    /// The port of rail switch `rail` that faces `host`.
    SwitchPort {
        /// The rail.
        rail: u8,
        /// The host whose cable ends at that port.
        host: Role,
    },
}

impl FailTarget {
    /// The three kinds the paper injects, on `rail`; the switch port is the initiator's.
    pub fn all_kinds(rail: u8) -> [FailTarget; 3] {
        [
            FailTarget::InitiatorNic { rail },
            FailTarget::ResponderNic { rail },
            FailTarget::SwitchPort {
                rail,
                host: Role::Initiator,
            },
        ]
    }

    /// The namespace and interface that `ip link set` acts on.
    pub fn interface(&self, info: &TestbedInfo) -> (String, String) {
        match *self {
            FailTarget::InitiatorNic { rail } | FailTarget::ResponderNic { rail } => {
                let role = if matches!(self, FailTarget::InitiatorNic { .. }) {
                    Role::Initiator
                } else {
                    Role::Responder
                };
                let host = info.host(role);
                let nic = &host.nics[usize::from(rail)];
                (host.netns.clone(), nic.name.clone())
            }
            FailTarget::SwitchPort { rail, host } => {
                let nic = &info.host(host).nics[usize::from(rail)];
                (nic.switch_netns.clone(), nic.switch_port.clone())
            }
        }
    }

    fn rail(&self) -> u8 {
        match *self {
            FailTarget::InitiatorNic { rail }
            | FailTarget::ResponderNic { rail }
            | FailTarget::SwitchPort { rail, .. } => rail,
        }
    }
}

impl fmt::Display for FailTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailTarget::InitiatorNic { rail } => write!(f, "initiator-nic{rail}"),
            FailTarget::ResponderNic { rail } => write!(f, "responder-nic{rail}"),
            FailTarget::SwitchPort { rail, host } => write!(f, "switch{rail}-port-{host}"),
        }
    }
}

/// The failure kinds as named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailKind {
    /// `initiator-nic`
    InitiatorNic,
    /// `responder-nic`
    ResponderNic,
    /// `switch-port`
    SwitchPort,
}

impl FailKind {
    /// The target of this kind on `rail` (switch ports: the initiator's port).
    pub fn on_rail(self, rail: u8) -> FailTarget {
        match self {
            FailKind::InitiatorNic => FailTarget::InitiatorNic { rail },
            FailKind::ResponderNic => FailTarget::ResponderNic { rail },
            FailKind::SwitchPort => FailTarget::SwitchPort {
                rail,
                host: Role::Initiator,
            },
        }
    }
}

impl FromStr for FailKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "initiator-nic" => Ok(FailKind::InitiatorNic),
            "responder-nic" => Ok(FailKind::ResponderNic),
            "switch-port" => Ok(FailKind::SwitchPort),
            other => Err(format!(
                "unknown failure target {other:?}: use initiator-nic, responder-nic or switch-port"
            )),
        }
    }
}

/// Link direction of one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkAction {
    /// `ip link set dev X down`
    Down,
    /// `ip link set dev X up`
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
    /// `count` down/up cycles starting at `start`, each down for a time drawn from `down`
    /// and then up for a time drawn from `up` (inclusive ranges), from `seed`.
    Flap {
        /// The target.
        target: FailTarget,
        /// When the first down happens.
        start: Duration,
        /// Number of down/up cycles.
        count: u32,
        /// Range of down times.
        down: (Duration, Duration),
        /// Range of up times between cycles.
        up: (Duration, Duration),
        /// Seed of the draws.
        seed: u64,
    },
    /// `count` failures, each of a random kind among `kinds` on `rail`, down for a time from
    /// `down`, then up for a time from `up`; the soak test's schedule.
    Random {
        /// The kinds to draw from.
        kinds: Vec<FailKind>,
        /// The rail to fail.
        rail: u8,
        /// When the first failure happens.
        start: Duration,
        /// Number of failures.
        count: u32,
        /// Range of down times.
        down: (Duration, Duration),
        /// Range of up times between failures.
        up: (Duration, Duration),
        /// Seed of the draws.
        seed: u64,
    },
}

fn draw(rng: &mut ChaCha8Rng, (lo, hi): (Duration, Duration)) -> Duration {
    if hi <= lo {
        return lo;
    }
    let lo_us = lo.as_micros() as u64;
    let hi_us = hi.as_micros() as u64;
    Duration::from_micros(rng.random_range(lo_us..=hi_us))
}

impl Schedule {
    /// The steps of this schedule, in time order.
    pub fn steps(&self) -> Vec<Step> {
        let mut steps = Vec::new();
        match self {
            Schedule::Once {
                target,
                at,
                duration,
            } => {
                steps.push(Step {
                    at: *at,
                    target: *target,
                    action: LinkAction::Down,
                });
                if let Some(d) = duration {
                    steps.push(Step {
                        at: *at + *d,
                        target: *target,
                        action: LinkAction::Up,
                    });
                }
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
                for _ in 0..*count {
                    steps.push(Step {
                        at: t,
                        target: *target,
                        action: LinkAction::Down,
                    });
                    t += draw(&mut rng, *down);
                    steps.push(Step {
                        at: t,
                        target: *target,
                        action: LinkAction::Up,
                    });
                    t += draw(&mut rng, *up);
                }
            }
            Schedule::Random {
                kinds,
                rail,
                start,
                count,
                down,
                up,
                seed,
            } => {
                let mut rng = ChaCha8Rng::seed_from_u64(*seed);
                let mut t = *start;
                for _ in 0..*count {
                    if kinds.is_empty() {
                        break;
                    }
                    let kind = kinds[rng.random_range(0..kinds.len())];
                    let target = kind.on_rail(*rail);
                    steps.push(Step {
                        at: t,
                        target,
                        action: LinkAction::Down,
                    });
                    t += draw(&mut rng, *down);
                    steps.push(Step {
                        at: t,
                        target,
                        action: LinkAction::Up,
                    });
                    t += draw(&mut rng, *up);
                }
            }
        }
        steps.sort_by_key(|s| s.at);
        steps
    }
}

/// What happened when a step ran.
#[derive(Debug, Clone, Serialize)]
pub struct LogEntry {
    /// Milliseconds since the plan started, when the command returned.
    pub t_ms: f64,
    /// When the command returned, in milliseconds since the Unix epoch (to line up with
    /// application timelines, which use the same clock).
    pub unix_ms: f64,
    /// When the step was planned, in milliseconds since the plan started.
    pub planned_ms: f64,
    /// What was cut or restored.
    pub target: String,
    /// The rail.
    pub rail: u8,
    /// Down or up.
    pub action: LinkAction,
    /// Namespace of the interface.
    pub netns: String,
    /// The interface.
    pub dev: String,
    /// The `ip` error, when the command failed.
    pub error: Option<String>,
    /// When the command was issued, in Unix milliseconds. The link changes somewhere between
    /// this and `unix_ms` (spawning `ip netns exec` takes a few milliseconds, and an
    /// application's link watch can see the change before the command returns), so failure
    /// windows and detection times are measured from here.
    pub issued_unix_ms: f64,
}

/// Milliseconds since the Unix epoch, now.
pub fn unix_ms_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1e3)
        .unwrap_or(0.0)
}

/// Runs one step now.
pub fn apply(info: &TestbedInfo, target: FailTarget, action: LinkAction) -> Result<(), String> {
    let (ns, dev) = target.interface(info);
    let verb = action.to_string();
    ip_in(&ns, &["link", "set", "dev", &dev, &verb])
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Executes `steps` against the clock from `start`, calling `log` after each; returns the log.
/// Stops early (leaving later steps undone) when `stop` returns true between steps.
pub fn run(
    info: &TestbedInfo,
    steps: &[Step],
    start: Instant,
    mut log: impl FnMut(&LogEntry),
    stop: impl Fn() -> bool,
) -> Vec<LogEntry> {
    let mut entries = Vec::with_capacity(steps.len());
    for step in steps {
        // Sleep in short slices so a stop request is honoured promptly.
        loop {
            if stop() {
                return entries;
            }
            let now = start.elapsed();
            if now >= step.at {
                break;
            }
            std::thread::sleep((step.at - now).min(Duration::from_millis(20)));
        }
        let issued_unix_ms = unix_ms_now();
        let result = apply(info, step.target, step.action);
        let (netns, dev) = step.target.interface(info);
        let entry = LogEntry {
            t_ms: start.elapsed().as_secs_f64() * 1e3,
            unix_ms: unix_ms_now(),
            planned_ms: step.at.as_secs_f64() * 1e3,
            target: step.target.to_string(),
            rail: step.target.rail(),
            action: step.action,
            netns,
            dev,
            error: result.err(),
            issued_unix_ms,
        };
        log(&entry);
        entries.push(entry);
    }
    entries
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
pub fn parse_range(text: &str) -> Result<(Duration, Duration), String> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::TopologySpec;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
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
    fn flap_alternates_and_stays_within_its_ranges() {
        let steps = Schedule::Flap {
            target: FailTarget::ResponderNic { rail: 0 },
            start: ms(100),
            count: 20,
            down: (ms(50), ms(300)),
            up: (ms(100), ms(200)),
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
        let make = |seed| {
            Schedule::Random {
                kinds: vec![
                    FailKind::InitiatorNic,
                    FailKind::ResponderNic,
                    FailKind::SwitchPort,
                ],
                rail: 0,
                start: ms(0),
                count: 50,
                down: (ms(10), ms(100)),
                up: (ms(10), ms(100)),
                seed,
            }
            .steps()
        };
        assert_eq!(make(1), make(1));
        assert_ne!(make(1), make(2));
    }

    #[test]
    fn random_schedule_uses_every_kind_it_is_given() {
        let steps = Schedule::Random {
            kinds: vec![
                FailKind::InitiatorNic,
                FailKind::ResponderNic,
                FailKind::SwitchPort,
            ],
            rail: 0,
            start: ms(0),
            count: 60,
            down: (ms(1), ms(2)),
            up: (ms(1), ms(2)),
            seed: 3,
        }
        .steps();
        for kind in FailTarget::all_kinds(0) {
            assert!(steps.iter().any(|s| s.target == kind), "{kind} never drawn");
        }
    }

    #[test]
    fn targets_map_to_the_right_namespace_and_interface() {
        let info = TestbedInfo::plan(&TopologySpec::default());
        assert_eq!(
            FailTarget::InitiatorNic { rail: 0 }.interface(&info),
            ("rs-a".to_owned(), "nic0".to_owned())
        );
        assert_eq!(
            FailTarget::ResponderNic { rail: 1 }.interface(&info),
            ("rs-b".to_owned(), "nic1".to_owned())
        );
        assert_eq!(
            FailTarget::SwitchPort {
                rail: 0,
                host: Role::Initiator
            }
            .interface(&info),
            ("rs-sw0".to_owned(), "pa".to_owned())
        );
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
    fn unknown_kind_names_the_choices() {
        let err = "nic".parse::<FailKind>().unwrap_err();
        assert!(err.contains("initiator-nic"));
    }
}
