//! What a scenario run is parameterised by: the scenario, its traffic, its failure schedule
//! and the apps' flags it sets, with the defaults of each scenario.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;

use crate::apprun;
use crate::chaos;
use crate::paths;
use crate::schedule::{Schedule, TimeRange};
use crate::target::{FailTarget, TargetSet};
use crate::topology::Role;

/// The apps' `-t` when not given: messages each QP keeps posted.
const APPS_TX_DEPTH: u32 = 128;

/// The slowest rate at which a client is expected to complete what it has posted (0.5 Gb/s,
/// below the 0.75 Gb/s 1,000 QPs at the tools' default traffic carried on the loaded 2-vCPU
/// VM).
const DRAIN_BYTES_PER_SEC: u64 = 62_500_000;

/// The `-t`/`--tx-depth` among the apps' extra arguments, if one is there and parses.
fn tx_depth(extra: &[String]) -> Option<u32> {
    let mut args = extra.iter();
    while let Some(a) = args.next() {
        let value = match a.as_str() {
            "-t" | "--tx-depth" => args.next().map(String::as_str),
            _ => a
                .strip_prefix("--tx-depth=")
                .or_else(|| a.strip_prefix("-t").filter(|v| !v.is_empty())),
        };
        if let Some(v) = value {
            return v.parse().ok();
        }
    }
    None
}

/// The scenarios `shift-testbed scenario` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScenarioName {
    /// The initiator's default NIC fails and recovers.
    InitiatorNic,
    /// The responder's default NIC fails and recovers.
    ResponderNic,
    /// The rail-0 switch port facing the initiator fails and recovers.
    SwitchPort,
    /// The initiator's default NIC flaps, with every byte checked.
    Flap,
    /// Random failures of all three kinds, with every byte and notification checked.
    Soak,
    /// The ring allreduce with a NIC failure mid-run, every result checked.
    Allreduce,
    /// The initiator's default device dies silently (no CQEs, no packets, the netdev stays
    /// up) through the client's fault channel, with every byte checked.
    InitiatorDevDead,
    /// Both rails' links fail at random, independently and overlapping, under checked
    /// WRITE, SEND or READ traffic; losses are judged against the outage tolerance.
    Chaos,
}

impl FromStr for ScenarioName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "initiator-nic" => ScenarioName::InitiatorNic,
            "responder-nic" => ScenarioName::ResponderNic,
            "switch-port" => ScenarioName::SwitchPort,
            "flap" => ScenarioName::Flap,
            "soak" => ScenarioName::Soak,
            "allreduce" => ScenarioName::Allreduce,
            "initiator-dev-dead" => ScenarioName::InitiatorDevDead,
            "chaos" => ScenarioName::Chaos,
            other => {
                return Err(format!(
                "unknown scenario {other:?}: use initiator-nic, responder-nic, switch-port, flap, soak, allreduce, initiator-dev-dead or chaos"
            ))
            }
        })
    }
}

/// Traffic of the bandwidth scenarios.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// `shift_write_bw`
    Write,
    /// `shift_send_bw`
    Send,
    /// `shift_read_bw`
    Read,
}

impl FromStr for Op {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "write" => Ok(Op::Write),
            "send" => Ok(Op::Send),
            "read" => Ok(Op::Read),
            other => Err(format!("unknown --op {other:?}: use write, send or read")),
        }
    }
}

impl Op {
    fn tool(self) -> &'static str {
        match self {
            Op::Write => "shift_write_bw",
            Op::Send => "shift_send_bw",
            Op::Read => "shift_read_bw",
        }
    }
}

/// Which runs a scenario makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variants {
    /// With failover and the `--no-failover` baseline.
    Both,
    /// With failover only.
    Failover,
    /// The `--no-failover` baseline only.
    NoFailover,
}

/// How often a `soak` failure overlaps the previous one when the targets are not the
/// default set and `--overlap` is not given.
pub const DEFAULT_OVERLAP: f64 = 0.25;

/// The apps' `retry_cnt` (`QpAttr::rts`'s default; no flag changes it).
const APPS_RETRY_CNT: u8 = 7;

/// The apps' default `-u/--qp-timeout` (4.096 us x 2^14 = 67 ms).
const APPS_QP_TIMEOUT: u8 = 14;

/// Everything a scenario run is parameterised by.
#[derive(Debug, Clone)]
pub struct ScenarioOptions {
    /// Which scenario.
    pub name: ScenarioName,
    /// Traffic for the bandwidth scenarios.
    pub op: Op,
    /// Message size in bytes.
    pub size: usize,
    /// Run length of the bandwidth scenarios.
    pub duration: Duration,
    /// When the failure happens, from the client's start.
    pub fail_at: Duration,
    /// How long the failure lasts.
    pub down_for: Duration,
    /// Which runs.
    pub variants: Variants,
    /// Flaps in `flap`.
    pub flaps: u32,
    /// Failures in `soak`.
    pub soak_failures: u32,
    /// Range of down times for `flap` and `soak`.
    pub down_range: TimeRange,
    /// Ranges of up times between failures for `flap` and `soak`: each failure draws one,
    /// then a time in it.
    pub up_ranges: Vec<TimeRange>,
    /// What `flap` and `soak` fail.
    pub targets: TargetSet,
    /// Probability that a `soak` failure starts while the previous one is still down;
    /// `None`: 0 with `default-path`, [`DEFAULT_OVERLAP`] with any other set.
    pub overlap: Option<f64>,
    /// QPs per app (the apps' `-q`); `None` leaves the apps' default (1).
    pub qps: Option<u32>,
    /// The ACK timeout exponent of the apps' QPs (their `-u`); `None` leaves the apps'
    /// default (14: 4.096 us x 2^14 = 67 ms).
    pub qp_timeout: Option<u8>,
    /// Seed of the random schedules.
    pub seed: u64,
    /// Timeline interval of the apps.
    pub timeline_ms: u64,
    /// Measure the medium and the 8-byte write latency first, for ratios.
    pub with_baseline: bool,
    /// Where the apps' binaries are.
    pub apps_dir: PathBuf,
    /// Where reports, logs and the plot go.
    pub out_dir: PathBuf,
    /// Out-of-band TCP port.
    pub port: u16,
    /// Hold-down of the apps' resilient QPs before a switch-back (the apps' `--holddown`); `None`
    /// leaves the pmd's default (1 s).
    pub holddown: Option<Duration>,
    /// Extra arguments for both apps; the flags the testbed reads itself (`-q`, `-u`) are
    /// the typed fields above, never among these ([`ScenarioOptions::set_extra_args`]).
    pub extra_args: Vec<String>,
    /// `chaos`: the longest time both rails may be down together.
    pub max_both_down: Duration,
    /// `chaos`: how long no path may be up before a lost connection is excused.
    pub tolerance: Duration,
}

impl ScenarioOptions {
    /// The defaults of `name`: the paper's figure-5 timing (failure at 2 s, recovery at 4 s,
    /// 6 s run), 20 flaps of 50-300 ms, 200 soak failures, with up times of 1.2-1.6 s between
    /// them: longer than the pmd's 1 s hold-down, so every recovery ends in a switch-back and
    /// the next failure starts a new failover (with shorter up times the QP would stay on the
    /// backup through the whole schedule and test one failover only).
    /// `chaos` runs a minute by default, its links down 100 ms-2 s and up 300 ms-3 s at a
    /// time, both rails down together for at most 1 s, judged against a 4.3 s tolerance.
    pub fn new(name: ScenarioName) -> ScenarioOptions {
        let chaos = name == ScenarioName::Chaos;
        ScenarioOptions {
            name,
            op: Op::Write,
            size: 65536,
            duration: Duration::from_secs(if chaos { 60 } else { 6 }),
            fail_at: Duration::from_secs(2),
            down_for: Duration::from_secs(2),
            variants: match name {
                ScenarioName::InitiatorNic
                | ScenarioName::ResponderNic
                | ScenarioName::SwitchPort => Variants::Both,
                // Without failover a silently dead device leaves the client waiting for
                // completions that never come, until the testbed kills it.
                _ => Variants::Failover,
            },
            flaps: 20,
            soak_failures: 200,
            down_range: if chaos {
                chaos::DEFAULT_DOWN
            } else {
                (Duration::from_millis(50), Duration::from_millis(300))
            },
            up_ranges: if chaos {
                vec![chaos::DEFAULT_UP]
            } else {
                vec![(Duration::from_millis(1200), Duration::from_millis(1600))]
            },
            targets: TargetSet::Default,
            overlap: None,
            qps: None,
            qp_timeout: None,
            seed: 1,
            timeline_ms: 100,
            with_baseline: matches!(
                name,
                ScenarioName::InitiatorNic | ScenarioName::ResponderNic | ScenarioName::SwitchPort
            ),
            apps_dir: apprun::default_apps_dir(),
            out_dir: PathBuf::from("out"),
            port: 18515,
            holddown: None,
            extra_args: Vec::new(),
            max_both_down: chaos::DEFAULT_MAX_BOTH_DOWN,
            tolerance: chaos::DEFAULT_TOLERANCE,
        }
    }

    /// Sets the extra arguments for both apps, refusing the app flags the testbed reads
    /// itself: their values decide the run's set-up allowance and the RC retry budget the
    /// verdict uses, so they are given as [`ScenarioOptions::qps`] and
    /// [`ScenarioOptions::qp_timeout`].
    pub fn set_extra_args(&mut self, args: Vec<String>) -> Result<(), String> {
        for a in &args {
            let flag = a.split('=').next().unwrap_or_default();
            // A short flag may carry its value (`-q8`).
            let short = a.strip_prefix('-').filter(|f| !f.starts_with('-'));
            let typed = match (flag, short.and_then(|f| f.chars().next())) {
                ("--qp", _) | (_, Some('q')) => Some("--qp"),
                ("--qp-timeout", _) | (_, Some('u')) => Some("--qp-timeout"),
                _ => None,
            };
            if let Some(typed) = typed {
                return Err(format!(
                    "{a} after `--`: give it to the testbed as {typed}, which passes it on to \
                     both apps"
                ));
            }
        }
        self.extra_args = args;
        Ok(())
    }

    pub(super) fn tool(&self) -> &'static str {
        match self.name {
            ScenarioName::Allreduce => "shift_allreduce",
            // Soak and flap check every byte and notification: write data + write-with-imm.
            ScenarioName::Soak | ScenarioName::Flap => "shift_write_bw",
            _ => self.op.tool(),
        }
    }

    pub(super) fn checks_data(&self) -> bool {
        matches!(
            self.name,
            ScenarioName::Flap
                | ScenarioName::Soak
                | ScenarioName::Allreduce
                | ScenarioName::InitiatorDevDead
                | ScenarioName::Chaos
        )
    }

    /// The targets `flap` and `soak` draw from when `--targets` is `default`: every kind
    /// ([`TargetSet::ALL`]) since the pmd survives them.
    fn default_targets(&self) -> Vec<FailTarget> {
        match self.name {
            ScenarioName::Soak | ScenarioName::Flap => TargetSet::ALL.to_vec(),
            _ => self.default_path_targets(),
        }
    }

    /// The targets of `--targets default-path`: what `flap` and `soak` drew from before the
    /// backup rail could fail.
    fn default_path_targets(&self) -> Vec<FailTarget> {
        match self.name {
            ScenarioName::Soak => vec![
                FailTarget::InitiatorNic { rail: 0 },
                FailTarget::ResponderNic { rail: 0 },
                FailTarget::SwitchPort {
                    rail: 0,
                    host: Role::Initiator,
                },
            ],
            _ => vec![FailTarget::InitiatorNic { rail: 0 }],
        }
    }

    /// The overlap probability of `soak` (see [`ScenarioOptions::overlap`]).
    pub fn overlap(&self) -> f64 {
        self.overlap.unwrap_or(match self.targets {
            TargetSet::DefaultPath => 0.0,
            _ => DEFAULT_OVERLAP,
        })
    }

    /// The failure schedule, relative to the start of the client's traffic.
    pub fn schedule(&self) -> Schedule {
        let once = |target: FailTarget| Schedule::Once {
            target,
            at: self.fail_at,
            duration: Some(self.down_for),
        };
        let targets = self
            .targets
            .resolve(&self.default_targets(), &self.default_path_targets());
        match self.name {
            ScenarioName::InitiatorNic | ScenarioName::Allreduce => {
                once(FailTarget::InitiatorNic { rail: 0 })
            }
            ScenarioName::ResponderNic => once(FailTarget::ResponderNic { rail: 0 }),
            ScenarioName::SwitchPort => once(FailTarget::SwitchPort {
                rail: 0,
                host: Role::Initiator,
            }),
            ScenarioName::InitiatorDevDead => Schedule::Once {
                target: FailTarget::DeviceDead {
                    host: Role::Initiator,
                    rail: 0,
                },
                at: self.fail_at,
                duration: None,
            },
            // One target flaps as it always did; several are drawn from, in sequence.
            ScenarioName::Flap if targets.len() == 1 => Schedule::Flap {
                target: targets[0],
                start: self.fail_at,
                count: self.flaps,
                down: self.down_range,
                up: self.up_ranges.clone(),
                seed: self.seed,
            },
            ScenarioName::Flap => Schedule::Random {
                targets,
                start: self.fail_at,
                count: self.flaps,
                down: self.down_range,
                up: self.up_ranges.clone(),
                overlap: 0.0,
                seed: self.seed,
            },
            ScenarioName::Soak => Schedule::Random {
                targets,
                start: self.fail_at,
                count: self.soak_failures,
                down: self.down_range,
                up: self.up_ranges.clone(),
                overlap: self.overlap(),
                seed: self.seed,
            },
            // Failures stop starting two seconds before the run's end, for the last recovery.
            ScenarioName::Chaos => Schedule::Chaos {
                start: self.fail_at,
                until: self
                    .duration
                    .saturating_sub(Duration::from_secs(2))
                    .max(self.fail_at),
                down: self.down_range,
                up: self.up_ranges.clone(),
                max_both_down: self.max_both_down,
                seed: self.seed,
            },
        }
    }

    /// The RC retry budget of the apps' QPs: their `-u/--qp-timeout` ([`ScenarioOptions::
    /// qp_timeout`], else the apps' default 14) and their fixed `retry_cnt` of 7.
    pub fn rc_budget(&self) -> Duration {
        let timeout = self.qp_timeout.unwrap_or(APPS_QP_TIMEOUT);
        paths::rc_retry_budget(timeout, APPS_RETRY_CNT)
    }

    /// QPs per app: [`ScenarioOptions::qps`], else the apps' default 1.
    fn qps_asked(&self) -> u32 {
        self.qps.unwrap_or(1)
    }

    /// Hosts whose application must read a fault channel: those with a device that dies or
    /// fails its QPs.
    pub(super) fn fault_hosts(&self) -> Vec<Role> {
        let mut hosts = Vec::new();
        for step in self.schedule().steps() {
            if let Some(host) = step.target.fault_host() {
                if !hosts.contains(&host) {
                    hosts.push(host);
                }
            }
        }
        hosts
    }

    /// How long the pair may take to set up before its traffic starts: many QPs take a
    /// while (rendezvous and shadow verbs for each).
    pub(super) fn setup_allowance(&self) -> Duration {
        Duration::from_secs(20) + Duration::from_millis(50) * self.qps_asked()
    }

    /// How long the client may take after its run to complete what it still has posted: a
    /// `-D` run ends only when every QP's `-t` messages of `-s` bytes have completed (128 of
    /// 64 KiB: 8 MiB a QP, 8.4 GB at 1,000 QPs, which took 90 s on this VM), counted at
    /// [`DRAIN_BYTES_PER_SEC`].
    pub(super) fn drain_allowance(&self) -> Duration {
        let depth = tx_depth(&self.extra_args).unwrap_or(APPS_TX_DEPTH);
        let posted = u64::from(self.qps_asked()) * u64::from(depth) * self.size as u64;
        Duration::from_secs_f64(posted as f64 / DRAIN_BYTES_PER_SEC as f64)
    }

    /// How long the traffic runs: the configured duration, or long enough to outlast the
    /// schedule plus two seconds of recovery.
    pub fn run_length(&self) -> Duration {
        let last = self
            .schedule()
            .steps()
            .last()
            .map(|s| s.at)
            .unwrap_or_default();
        self.duration.max(last + Duration::from_secs(2))
    }
}

/// The scenario's name as the command line spells it.
pub fn scenario_slug(name: ScenarioName) -> &'static str {
    match name {
        ScenarioName::InitiatorNic => "initiator-nic",
        ScenarioName::ResponderNic => "responder-nic",
        ScenarioName::SwitchPort => "switch-port",
        ScenarioName::Flap => "flap",
        ScenarioName::Soak => "soak",
        ScenarioName::Allreduce => "allreduce",
        ScenarioName::InitiatorDevDead => "initiator-dev-dead",
        ScenarioName::Chaos => "chaos",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_has_time_to_complete_what_a_thousand_qps_keep_posted() {
        let mut o = ScenarioOptions::new(ScenarioName::InitiatorNic);
        // One QP: 128 x 64 KiB, a fraction of a second.
        assert!(o.drain_allowance() < Duration::from_secs(1));
        o.qps = Some(1000);
        // 8.4 GB at 0.5 Gb/s: over two minutes (the run that took 90 s had 106 s in all).
        assert!(o.drain_allowance() > Duration::from_secs(120));
        for given in [
            &["-t", "1"][..],
            &["-t1"],
            &["--tx-depth", "1"],
            &["--tx-depth=1"],
        ] {
            o.extra_args = given.iter().map(|a| a.to_string()).collect();
            assert!(o.drain_allowance() < Duration::from_secs(2), "{given:?}");
        }
    }

    #[test]
    fn figure_five_defaults_fail_at_two_and_recover_at_four() {
        let o = ScenarioOptions::new(ScenarioName::InitiatorNic);
        let steps = o.schedule().steps();
        assert_eq!(steps.len(), 2);
        assert_eq!(steps[0].at, Duration::from_secs(2));
        assert_eq!(steps[1].at, Duration::from_secs(4));
        assert_eq!(o.run_length(), Duration::from_secs(6));
        assert_eq!(o.variants, Variants::Both);
    }

    #[test]
    fn soak_and_flap_draw_from_every_kind_by_default() {
        for name in [ScenarioName::Soak, ScenarioName::Flap] {
            match ScenarioOptions::new(name).schedule() {
                Schedule::Random { targets, .. } => {
                    assert_eq!(targets, TargetSet::ALL.to_vec(), "{name:?}")
                }
                other => panic!("{name:?}: {other:?}"),
            }
        }
        let mut o = ScenarioOptions::new(ScenarioName::Soak);
        assert_eq!(o.overlap(), DEFAULT_OVERLAP);
        o.targets = TargetSet::DefaultPath;
        assert_eq!(o.overlap(), 0.0);
        assert!(o.schedule().steps().iter().all(|s| s.target.rail() == 0));
    }

    #[test]
    fn scenario_and_op_names_round_trip_and_unknown_ones_name_the_choices() {
        for name in [
            "initiator-nic",
            "responder-nic",
            "switch-port",
            "flap",
            "soak",
            "allreduce",
        ] {
            let parsed: ScenarioName = name.parse().unwrap();
            assert_eq!(scenario_slug(parsed), name);
        }
        assert!("nic".parse::<ScenarioName>().unwrap_err().contains("soak"));
        assert!("atomic".parse::<Op>().unwrap_err().contains("write"));
    }
}
