//! What the testbed can fail: host NICs, switch ports, both hosts' NICs of a rail at once,
//! a device that dies silently, and a device that fails its QPs; their command-line names,
//! the links each one cuts, and the sets the `flap` and `soak` scenarios draw from.
//!
//! Names (`docs/testbed.md`, "Failure targets"):
//!
//! | name | what goes down |
//! | --- | --- |
//! | `initiator-nic0`, `initiator-nic1` | host A's NIC on rail 0 (default) or 1 (backup) |
//! | `responder-nic0`, `responder-nic1` | host B's NIC on rail 0 or 1 |
//! | `switch0-port`, `switch1-port` | the port of rail switch 0 or 1 that faces host A |
//! | `switch0-port-b`, `switch1-port-b` | the port of that switch that faces host B |
//! | `both-nic0`, `both-nic1` | host A's and host B's NIC of the rail, at once |
//! | `initiator-dev-dead`, `responder-dev-dead` | host A's or B's default device dies silently (no CQEs, no packets; the netdev stays up), through the application's fault channel (`docs/apps-json.md`); `...-dev1-dead` is the backup device |
//! | `initiator-dev1-qps-failed`, `responder-dev1-qps-failed` | every QP of host A's or B's backup device goes to ERR (flushing what is posted) while the device and its link stay up, through the fault channel; an instant, not a window: nothing is brought back, the driver repairs the QPs (`docs/failover.md` 5d); `...-dev-qps-failed` is the default device |
//!
//! The names without a rail (`initiator-nic`, `responder-nic`, `switch-port`) are the rail
//! given separately (`--rail`, default 0), as before rails were part of the name.

use std::fmt;

use serde::Serialize;

use crate::topology::{Role, RAILS};

/// Something a failure schedule can take down.
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
    /// Both hosts' NICs on `rail`, taken down (and up) together.
    BothNics {
        /// The rail.
        rail: u8,
    },
    /// `host`'s device on `rail` dies silently: the application injects the fault into its
    /// own device when the testbed asks it to (the fault channel); the netdev stays up and
    /// the device never comes back during the run.
    DeviceDead {
        /// The host whose device dies.
        host: Role,
        /// The rail of the device (0: the default device).
        rail: u8,
    },
    /// Every QP of `host`'s device on `rail` goes to ERR, flushing what is posted on it,
    /// while the device and its link stay up (a NIC that recovered from an internal error by
    /// failing its QPs): the application injects it through its fault channel. It happens
    /// at an instant; nothing is brought back by the testbed, the driver has to repair the
    /// QPs itself (the backup repair, `docs/failover.md` 5d).
    DeviceQpsFailed {
        /// The host whose device fails its QPs.
        host: Role,
        /// The rail of the device (1: the backup device).
        rail: u8,
    },
}

/// One end of a cable, or a device: the smallest thing whose state decides whether a rail's
/// path between the hosts is up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Link {
    /// A host's NIC (the host end of its cable).
    HostNic {
        /// The host.
        host: Role,
        /// The rail.
        rail: u8,
    },
    /// A switch port (the switch end of a host's cable).
    SwitchPort {
        /// The host the port faces.
        host: Role,
        /// The rail.
        rail: u8,
    },
    /// A host's RDMA device on top of its NIC.
    Device {
        /// The host.
        host: Role,
        /// The rail.
        rail: u8,
    },
}

impl Link {
    /// The rail this link belongs to.
    pub fn rail(self) -> u8 {
        match self {
            Link::HostNic { rail, .. }
            | Link::SwitchPort { rail, .. }
            | Link::Device { rail, .. } => rail,
        }
    }

    /// Every link the path of `rail` needs: both hosts' devices and NICs and both switch
    /// ports of the rail.
    pub fn path_of(rail: u8) -> [Link; 6] {
        let (a, b) = (Role::Initiator, Role::Responder);
        [
            Link::Device { host: a, rail },
            Link::HostNic { host: a, rail },
            Link::SwitchPort { host: a, rail },
            Link::SwitchPort { host: b, rail },
            Link::HostNic { host: b, rail },
            Link::Device { host: b, rail },
        ]
    }
}

impl FailTarget {
    /// The rail the target is on.
    pub fn rail(&self) -> u8 {
        match *self {
            FailTarget::InitiatorNic { rail }
            | FailTarget::ResponderNic { rail }
            | FailTarget::SwitchPort { rail, .. }
            | FailTarget::BothNics { rail }
            | FailTarget::DeviceDead { rail, .. }
            | FailTarget::DeviceQpsFailed { rail, .. } => rail,
        }
    }

    /// The links this target takes down. A device whose QPs failed takes its device's link
    /// down for as long as nothing can repair them: see [`crate::paths::Availability`].
    pub fn links(&self) -> Vec<Link> {
        match *self {
            FailTarget::InitiatorNic { rail } => vec![Link::HostNic {
                host: Role::Initiator,
                rail,
            }],
            FailTarget::ResponderNic { rail } => vec![Link::HostNic {
                host: Role::Responder,
                rail,
            }],
            FailTarget::SwitchPort { rail, host } => vec![Link::SwitchPort { host, rail }],
            FailTarget::BothNics { rail } => vec![
                Link::HostNic {
                    host: Role::Initiator,
                    rail,
                },
                Link::HostNic {
                    host: Role::Responder,
                    rail,
                },
            ],
            FailTarget::DeviceDead { host, rail } | FailTarget::DeviceQpsFailed { host, rail } => {
                vec![Link::Device { host, rail }]
            }
        }
    }

    /// Whether this target and `other` touch a common link, so that they cannot be down at
    /// the same time (the first one's recovery would bring up what the other still holds
    /// down).
    pub fn conflicts_with(&self, other: &FailTarget) -> bool {
        let mine = self.links();
        other.links().iter().any(|l| mine.contains(l))
    }

    /// Whether the failure ends when its schedule says so. A dead device does not come
    /// back: a ConnectX after a fatal error needs a driver reload, which a run never sees.
    /// A device whose QPs failed recovers too: the device stays up and the driver repairs
    /// the QPs, so it can be drawn again and again.
    pub fn recovers(&self) -> bool {
        !matches!(self, FailTarget::DeviceDead { .. })
    }

    /// Whether the failure is a window the testbed ends with an `up` step. A dead device has
    /// none (it never comes back); a device whose QPs failed has none either (the fault is an
    /// instant: the device and its link never went down, and what brings the QPs back is the
    /// driver's repair, not the testbed).
    pub fn has_up_step(&self) -> bool {
        !matches!(
            self,
            FailTarget::DeviceDead { .. } | FailTarget::DeviceQpsFailed { .. }
        )
    }

    /// The fault-channel command that injects this target's failure into the application
    /// that owns `device` (the device's name as the application opened it, `soft:nic1`);
    /// `None` for the targets `ip link` fails.
    pub fn fault_command(&self, device: &str) -> Option<crate::faults::FaultCommand> {
        use crate::faults::FaultCommand;
        let device = device.to_owned();
        match self {
            FailTarget::DeviceDead { .. } => Some(FaultCommand::DeviceDead { device }),
            FailTarget::DeviceQpsFailed { .. } => Some(FaultCommand::QpsFailed { device }),
            _ => None,
        }
    }

    /// The host whose application injects this target's failure through its fault channel;
    /// `None` for the targets `ip link` fails.
    pub fn fault_host(&self) -> Option<Role> {
        match *self {
            FailTarget::DeviceDead { host, .. } | FailTarget::DeviceQpsFailed { host, .. } => {
                Some(host)
            }
            _ => None,
        }
    }

    /// Parses a target name (see the module documentation). `rail` is the rail of the names
    /// that carry none (`initiator-nic`, `responder-nic`, `switch-port`, `...-dev-dead`).
    pub fn parse(name: &str, rail: Option<u8>) -> Result<FailTarget, String> {
        let unknown = || {
            format!(
                "unknown failure target {name:?}: use initiator-nic0|1, responder-nic0|1, \
                 switch0|1-port[-b], both-nic0|1, initiator-dev-dead, responder-dev-dead, \
                 initiator-dev1-dead, responder-dev1-dead, initiator-dev-qps-failed, \
                 responder-dev-qps-failed, initiator-dev1-qps-failed, \
                 responder-dev1-qps-failed (or initiator-nic, responder-nic, switch-port \
                 with --rail)"
            )
        };
        // A rail in the name and a different one beside it is a mistake worth naming.
        let pick = |named: Option<u8>| -> Result<u8, String> {
            match (named, rail) {
                (Some(n), Some(r)) if n != r => Err(format!(
                    "failure target {name:?} is on rail {n}, but rail {r} was asked for"
                )),
                (Some(n), _) | (None, Some(n)) => Ok(n),
                (None, None) => Ok(0),
            }
        };
        let checked = |r: u8| -> Result<u8, String> {
            if r < RAILS {
                Ok(r)
            } else {
                Err(format!(
                    "failure target {name:?}: there is no rail {r} (rails 0..{RAILS})"
                ))
            }
        };
        // `<stem><digits>` -> (stem, Some(rail)); `<stem>` -> (stem, None).
        let split_rail = |s: &str| -> Result<(String, Option<u8>), String> {
            let stem = s.trim_end_matches(|c: char| c.is_ascii_digit());
            let digits = &s[stem.len()..];
            let named = if digits.is_empty() {
                None
            } else {
                Some(digits.parse::<u8>().map_err(|_| unknown())?)
            };
            Ok((stem.to_owned(), named))
        };
        // `initiator-dev1` -> (host A, rail 1).
        let device_of = |s: &str| -> Result<(Role, u8), String> {
            let (stem, named) = split_rail(s)?;
            let host = match stem.as_str() {
                "initiator-dev" => Role::Initiator,
                "responder-dev" => Role::Responder,
                _ => return Err(unknown()),
            };
            Ok((host, checked(pick(named)?)?))
        };
        let target = if let Some(rest) = name.strip_prefix("switch") {
            // switch-port, switch0-port, switch1-port-b, switch0-port-a
            let (digits, tail) = rest.split_at(rest.find('-').ok_or_else(unknown)?);
            let (_, named) = split_rail(digits)?;
            if !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(unknown());
            }
            let host = match tail {
                "-port" | "-port-a" => Role::Initiator,
                "-port-b" => Role::Responder,
                _ => return Err(unknown()),
            };
            FailTarget::SwitchPort {
                rail: checked(pick(named)?)?,
                host,
            }
        } else if let Some(host) = name.strip_suffix("-qps-failed") {
            // initiator-dev1-qps-failed, responder-dev-qps-failed
            let (host, rail) = device_of(host)?;
            FailTarget::DeviceQpsFailed { host, rail }
        } else if let Some(host) = name.strip_suffix("-dead") {
            // initiator-dev-dead, responder-dev1-dead
            let (host, rail) = device_of(host)?;
            FailTarget::DeviceDead { host, rail }
        } else {
            let (stem, named) = split_rail(name)?;
            let rail = checked(pick(named)?)?;
            match (stem.as_str(), named) {
                ("initiator-nic", _) => FailTarget::InitiatorNic { rail },
                ("responder-nic", _) => FailTarget::ResponderNic { rail },
                // "Both" without a rail would be ambiguous beside the rail-less legacy names.
                ("both-nic", Some(_)) => FailTarget::BothNics { rail },
                _ => return Err(unknown()),
            }
        };
        Ok(target)
    }
}

impl fmt::Display for FailTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            FailTarget::InitiatorNic { rail } => write!(f, "initiator-nic{rail}"),
            FailTarget::ResponderNic { rail } => write!(f, "responder-nic{rail}"),
            FailTarget::SwitchPort {
                rail,
                host: Role::Initiator,
            } => write!(f, "switch{rail}-port"),
            FailTarget::SwitchPort {
                rail,
                host: Role::Responder,
            } => write!(f, "switch{rail}-port-b"),
            FailTarget::BothNics { rail } => write!(f, "both-nic{rail}"),
            FailTarget::DeviceDead { host, rail: 0 } => write!(f, "{host}-dev-dead"),
            FailTarget::DeviceDead { host, rail } => write!(f, "{host}-dev{rail}-dead"),
            FailTarget::DeviceQpsFailed { host, rail: 0 } => write!(f, "{host}-dev-qps-failed"),
            FailTarget::DeviceQpsFailed { host, rail } => write!(f, "{host}-dev{rail}-qps-failed"),
        }
    }
}

/// Which targets a random schedule draws from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetSet {
    /// The scenario's own set: [`TargetSet::ALL`] for `flap` and `soak`, since the driver
    /// survives every kind.
    Default,
    /// Failures of the default path only, what `flap` and `soak` drew from before the backup
    /// rail could fail (`soak`: the three kinds on rail 0; `flap`: `initiator-nic0`).
    DefaultPath,
    /// Every link failure: [`TargetSet::ALL`].
    All,
    /// These targets.
    List(Vec<FailTarget>),
}

impl TargetSet {
    /// What `all` means: the three kinds the paper injects on each rail, both default NICs
    /// at once, and each host's backup and default device failing its QPs (the backup one
    /// is the failure the backup repair needs: a link failure leaves an
    /// idle backup QP out of ERR; the default one fails the default devices' control channel
    /// too, which the driver repairs, `docs/failover.md` 5d). A device whose
    /// QPs failed is in it because it recovers (the device stays up and the driver repairs
    /// the QPs), so drawing it again later is meaningful. Dead devices are not: they never
    /// come back, so one draw would end the rotation for the rest of the run.
    pub const ALL: [FailTarget; 11] = [
        FailTarget::InitiatorNic { rail: 0 },
        FailTarget::ResponderNic { rail: 0 },
        FailTarget::SwitchPort {
            rail: 0,
            host: Role::Initiator,
        },
        FailTarget::InitiatorNic { rail: 1 },
        FailTarget::ResponderNic { rail: 1 },
        FailTarget::SwitchPort {
            rail: 1,
            host: Role::Initiator,
        },
        FailTarget::BothNics { rail: 0 },
        FailTarget::DeviceQpsFailed {
            host: Role::Initiator,
            rail: 1,
        },
        FailTarget::DeviceQpsFailed {
            host: Role::Responder,
            rail: 1,
        },
        FailTarget::DeviceQpsFailed {
            host: Role::Initiator,
            rail: 0,
        },
        FailTarget::DeviceQpsFailed {
            host: Role::Responder,
            rail: 0,
        },
    ];

    /// The targets, with `default` standing for [`TargetSet::Default`] and `default_path`
    /// for [`TargetSet::DefaultPath`].
    pub fn resolve(&self, default: &[FailTarget], default_path: &[FailTarget]) -> Vec<FailTarget> {
        match self {
            TargetSet::Default => default.to_vec(),
            TargetSet::DefaultPath => default_path.to_vec(),
            TargetSet::All => TargetSet::ALL.to_vec(),
            TargetSet::List(list) => list.clone(),
        }
    }

    /// Parses `default`, `default-path`, `all` or a comma-separated list of target names.
    pub fn parse(text: &str) -> Result<TargetSet, String> {
        match text.trim() {
            "default" => Ok(TargetSet::Default),
            "default-path" => Ok(TargetSet::DefaultPath),
            "all" => Ok(TargetSet::All),
            list => {
                let mut targets = Vec::new();
                for name in list.split(',').map(str::trim) {
                    if name.is_empty() {
                        return Err(format!("bad target list {text:?}: an empty name"));
                    }
                    let t = FailTarget::parse(name, None)?;
                    if !t.recovers() {
                        return Err(format!(
                            "bad target list {text:?}: {t} never recovers, so it cannot be \
                             drawn repeatedly (use the scenario initiator-dev-dead)"
                        ));
                    }
                    if targets.contains(&t) {
                        return Err(format!("bad target list {text:?}: {t} twice"));
                    }
                    targets.push(t);
                }
                Ok(TargetSet::List(targets))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_target_name_round_trips() {
        let mut all: Vec<FailTarget> = TargetSet::ALL.to_vec();
        all.extend([
            FailTarget::SwitchPort {
                rail: 1,
                host: Role::Responder,
            },
            FailTarget::BothNics { rail: 1 },
            FailTarget::DeviceDead {
                host: Role::Initiator,
                rail: 0,
            },
            FailTarget::DeviceDead {
                host: Role::Responder,
                rail: 1,
            },
        ]);
        for t in all {
            assert_eq!(FailTarget::parse(&t.to_string(), None), Ok(t), "{t}");
        }
    }

    #[test]
    fn the_backup_rails_targets_parse_by_name() {
        assert_eq!(
            FailTarget::parse("initiator-nic1", None),
            Ok(FailTarget::InitiatorNic { rail: 1 })
        );
        assert_eq!(
            FailTarget::parse("responder-nic1", None),
            Ok(FailTarget::ResponderNic { rail: 1 })
        );
        assert_eq!(
            FailTarget::parse("switch1-port", None),
            Ok(FailTarget::SwitchPort {
                rail: 1,
                host: Role::Initiator
            })
        );
        assert_eq!(
            FailTarget::parse("both-nic0", None),
            Ok(FailTarget::BothNics { rail: 0 })
        );
        assert_eq!(
            FailTarget::parse("initiator-dev-dead", None),
            Ok(FailTarget::DeviceDead {
                host: Role::Initiator,
                rail: 0
            })
        );
    }

    #[test]
    fn a_device_failing_its_qps_parses_by_name_and_recovers_without_an_up_step() {
        let backup = FailTarget::parse("initiator-dev1-qps-failed", None).unwrap();
        assert_eq!(
            backup,
            FailTarget::DeviceQpsFailed {
                host: Role::Initiator,
                rail: 1
            }
        );
        assert_eq!(
            FailTarget::parse("responder-dev1-qps-failed", None),
            Ok(FailTarget::DeviceQpsFailed {
                host: Role::Responder,
                rail: 1
            })
        );
        // Without a rail in the name: the default device, or the rail given beside it.
        assert_eq!(
            FailTarget::parse("responder-dev-qps-failed", None),
            Ok(FailTarget::DeviceQpsFailed {
                host: Role::Responder,
                rail: 0
            })
        );
        assert_eq!(
            FailTarget::parse("initiator-dev-qps-failed", Some(1)),
            Ok(backup)
        );
        assert!(backup.recovers() && !backup.has_up_step());
        assert_eq!(backup.fault_host(), Some(Role::Initiator));
        assert_eq!(
            backup.fault_command("soft:nic1").map(|c| c.to_string()),
            Some("qps-failed soft:nic1".to_owned())
        );
        // Drawn repeatedly: a list may name it, unlike a dead device.
        assert_eq!(
            TargetSet::parse("initiator-dev1-qps-failed,initiator-nic0"),
            Ok(TargetSet::List(vec![
                backup,
                FailTarget::InitiatorNic { rail: 0 }
            ]))
        );
        for bad in [
            "initiator-dev2-qps-failed",
            "initiator-nic1-qps-failed",
            "dev1-qps-failed",
            "initiator-dev1-qps-fail",
            "qps-failed",
        ] {
            assert!(FailTarget::parse(bad, None).is_err(), "{bad}");
        }
        let err = FailTarget::parse("initiator-dev1-qps-failed", Some(0)).unwrap_err();
        assert!(err.contains("rail 1") && err.contains("rail 0"), "{err}");
        let err = FailTarget::parse("bogus", None).unwrap_err();
        assert!(err.contains("initiator-dev1-qps-failed"), "{err}");
    }

    #[test]
    fn names_without_a_rail_take_the_rail_given_beside_them() {
        assert_eq!(
            FailTarget::parse("initiator-nic", Some(1)),
            Ok(FailTarget::InitiatorNic { rail: 1 })
        );
        assert_eq!(
            FailTarget::parse("switch-port", None),
            Ok(FailTarget::SwitchPort {
                rail: 0,
                host: Role::Initiator
            })
        );
        assert_eq!(
            FailTarget::parse("initiator-nic1", Some(1)),
            Ok(FailTarget::InitiatorNic { rail: 1 })
        );
    }

    #[test]
    fn bad_target_names_say_what_is_wrong() {
        let err = FailTarget::parse("nic", None).unwrap_err();
        assert!(
            err.contains("initiator-nic0|1") && err.contains("both-nic0"),
            "{err}"
        );
        let err = FailTarget::parse("initiator-nic1", Some(0)).unwrap_err();
        assert!(err.contains("rail 1") && err.contains("rail 0"), "{err}");
        let err = FailTarget::parse("initiator-nic2", None).unwrap_err();
        assert!(err.contains("no rail 2"), "{err}");
        for bad in [
            "both-nic",
            "switch0-port-c",
            "switchx-port",
            "initiator-nicx",
            "dev-dead",
        ] {
            assert!(FailTarget::parse(bad, None).is_err(), "{bad}");
        }
    }

    #[test]
    fn target_sets_parse_and_name_what_is_wrong() {
        assert_eq!(TargetSet::parse("default"), Ok(TargetSet::Default));
        assert_eq!(TargetSet::parse("all"), Ok(TargetSet::All));
        assert_eq!(
            TargetSet::parse("initiator-nic1, switch1-port"),
            Ok(TargetSet::List(vec![
                FailTarget::InitiatorNic { rail: 1 },
                FailTarget::SwitchPort {
                    rail: 1,
                    host: Role::Initiator
                }
            ]))
        );
        assert!(TargetSet::parse("initiator-nic0,,responder-nic0")
            .unwrap_err()
            .contains("empty name"));
        assert!(TargetSet::parse("initiator-nic0,initiator-nic0")
            .unwrap_err()
            .contains("twice"));
        assert!(TargetSet::parse("initiator-dev-dead")
            .unwrap_err()
            .contains("never recovers"));
        assert_eq!(TargetSet::parse("default-path"), Ok(TargetSet::DefaultPath));
        let default = [FailTarget::InitiatorNic { rail: 0 }];
        let path = [FailTarget::ResponderNic { rail: 0 }];
        assert_eq!(
            TargetSet::Default.resolve(&default, &path),
            default.to_vec()
        );
        assert_eq!(
            TargetSet::DefaultPath.resolve(&default, &path),
            path.to_vec()
        );
        assert_eq!(TargetSet::All.resolve(&default, &path).len(), 11);
    }

    #[test]
    fn all_has_every_kind_on_both_rails_and_both_default_nics() {
        for rail in 0..RAILS {
            for t in [
                FailTarget::InitiatorNic { rail },
                FailTarget::ResponderNic { rail },
                FailTarget::SwitchPort {
                    rail,
                    host: Role::Initiator,
                },
            ] {
                assert!(TargetSet::ALL.contains(&t), "{t}");
            }
        }
        assert!(TargetSet::ALL.contains(&FailTarget::BothNics { rail: 0 }));
        for host in [Role::Initiator, Role::Responder] {
            for rail in 0..RAILS {
                let t = FailTarget::DeviceQpsFailed { host, rail };
                assert!(TargetSet::ALL.contains(&t), "{t}");
            }
        }
        assert!(TargetSet::ALL.iter().all(FailTarget::recovers));
    }

    #[test]
    fn targets_sharing_a_link_conflict() {
        let both = FailTarget::BothNics { rail: 0 };
        assert!(both.conflicts_with(&FailTarget::InitiatorNic { rail: 0 }));
        assert!(both.conflicts_with(&FailTarget::ResponderNic { rail: 0 }));
        assert!(!both.conflicts_with(&FailTarget::InitiatorNic { rail: 1 }));
        let port = FailTarget::SwitchPort {
            rail: 0,
            host: Role::Initiator,
        };
        // A NIC and the switch port at the other end of its cable are two links.
        assert!(!port.conflicts_with(&FailTarget::InitiatorNic { rail: 0 }));
        assert!(port.conflicts_with(&port));
    }
}
