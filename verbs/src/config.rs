//! What the shim presents, read from the environment once per process.
//!
//! `RAILSHIFT_DEVICES` lists the devices `ibv_get_device_list` returns in front of the
//! system's: comma-separated `<verbs name>=<pmd device>` entries, e.g.
//! `rs0=soft:lo@127.0.0.1,rs1=soft:veth0`. The verbs name is what a program's `-d`/`--ib-dev`
//! names; the pmd device is any name `pmd::Context::open` takes (`soft:<netdev>[@<addr>]`,
//! `fabric:<name>/<port>`, `mlx5:<ibdev>`).
//!
//! An entry may name a backup device after a `+` (`rs1=soft:veth0+soft:veth1`): the device is
//! then resilient, every RC QP on it a pmd resilient QP whose backup side is set up through
//! the Redis rendezvous (`RAILSHIFT_RENDEZVOUS`, `RAILSHIFT_RENDEZVOUS_KEY_FILE`,
//! [`Resilience`]).
//!
//! `RAILSHIFT_MANAGEMENT_ADDR` names this host's address on the management network: resilient
//! QPs then also agree over it when both in-band control channels are lost
//! (`docs/failover.md` 5f).
//!
//! `RAILSHIFT_PROGRESS` says how a softnic device makes progress: `poll` (default: the
//! application's `ibv_poll_cq` drives the device, run-to-completion, and a helper thread
//! drives it while the application does not poll) or `engine` (the softnic's own engine
//! thread, as `pmd`'s auto progress).

use std::net::IpAddr;
use std::str::FromStr;
use std::time::Duration;

use pmd::provider::ProgressModel;

/// The environment variable listing the devices.
pub const DEVICES_VAR: &str = "RAILSHIFT_DEVICES";
/// The environment variable choosing the progress model.
pub const PROGRESS_VAR: &str = "RAILSHIFT_PROGRESS";

/// The Redis rendezvous of resilient devices (`redis://host:port/`).
pub const RENDEZVOUS_VAR: &str = "RAILSHIFT_RENDEZVOUS";
/// The key prefix in the rendezvous store (several jobs can share a server).
pub const PREFIX_VAR: &str = "RAILSHIFT_RENDEZVOUS_PREFIX";
/// The failover hold-down in milliseconds.
pub const HOLDDOWN_VAR: &str = "RAILSHIFT_HOLDDOWN_MS";
/// How long a connection holds its work while no path answers, in milliseconds.
pub const OUTAGE_TOLERANCE_VAR: &str = "RAILSHIFT_OUTAGE_TOLERANCE_MS";
/// How long a QP waits for its peer's rendezvous entry before it says it runs unprotected.
pub const PROTECT_WAIT_VAR: &str = "RAILSHIFT_PROTECT_WAIT_MS";
/// This host's address on the management network (the third channel, `docs/failover.md` 5f).
pub const MANAGEMENT_ADDR_VAR: &str = "RAILSHIFT_MANAGEMENT_ADDR";
/// A FIFO of fault commands for this process's devices (`crate::faults`; tests).
pub const FAULT_FIFO_VAR: &str = "RAILSHIFT_FAULT_FIFO";
/// The prefix when [`PREFIX_VAR`] is unset.
pub const DEFAULT_PREFIX: &str = "railshift-verbs";
/// The wait when [`PROTECT_WAIT_VAR`] is unset.
pub const DEFAULT_PROTECT_WAIT: Duration = Duration::from_secs(5);

/// Longest verbs name: `ibv_device.name` is 64 bytes with its terminating NUL.
pub const MAX_NAME_LEN: usize = crate::abi::IBV_SYSFS_NAME_MAX - 1;

/// One device the shim presents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpec {
    /// The verbs name (`ibv_get_device_name`).
    pub name: String,
    /// The pmd device it opens.
    pub device: pmd::DeviceName,
    /// The pmd device as written (what `Context::open` is given).
    pub device_text: String,
    /// The backup device as written, if the entry names one (`<default>+<backup>`).
    pub backup_text: Option<String>,
}

/// How resilient devices find their peers' backup attributes and fail over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resilience {
    /// The Redis URL ([`RENDEZVOUS_VAR`]).
    pub rendezvous: String,
    /// The key prefix ([`PREFIX_VAR`]).
    pub prefix: String,
    /// The hold-down ([`HOLDDOWN_VAR`]); `None`: pmd's default.
    pub holddown: Option<Duration>,
    /// The outage tolerance ([`OUTAGE_TOLERANCE_VAR`]); `None`: pmd's default.
    pub outage_tolerance: Option<Duration>,
    /// The bounded wait for the peer's entry ([`PROTECT_WAIT_VAR`]).
    pub protect_wait: Duration,
    /// This host's address on the management network ([`MANAGEMENT_ADDR_VAR`]); `None`: no
    /// third channel (a connection whose two control channels are both lost then ends).
    pub management_addr: Option<IpAddr>,
}

/// How the shim's softnic devices make progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// `ibv_poll_cq` runs the device (pmd's manual progress); a helper thread runs it while
    /// the application does not poll (a perftest bandwidth server never does).
    Poll,
    /// The softnic's engine thread runs the device (pmd's auto progress).
    Engine,
}

impl Progress {
    /// The pmd progress model a device is opened with.
    pub fn model(self) -> ProgressModel {
        match self {
            Progress::Poll => ProgressModel::Manual,
            Progress::Engine => ProgressModel::Auto,
        }
    }
}

/// The shim's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The devices, in the order given.
    pub devices: Vec<DeviceSpec>,
    /// How softnic devices progress.
    pub progress: Progress,
    /// The rendezvous and failover settings; `Some` when a device has a backup.
    pub resilience: Option<Resilience>,
}

/// What was wrong with the configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// An entry has no `=`.
    #[error("{DEVICES_VAR} entry `{entry}` is not <verbs name>=<pmd device>")]
    NoEquals {
        /// The entry.
        entry: String,
    },
    /// A verbs name is empty, too long, or has characters other than letters, digits, `_`,
    /// `-` and `.`.
    #[error(
        "{DEVICES_VAR}: verbs name `{name}` must be 1 to {MAX_NAME_LEN} letters, digits, `_`, `-` or `.`"
    )]
    BadName {
        /// The name.
        name: String,
    },
    /// The same verbs name twice.
    #[error("{DEVICES_VAR}: verbs name `{name}` is given twice")]
    Duplicate {
        /// The name.
        name: String,
    },
    /// The pmd device did not parse.
    #[error("{DEVICES_VAR}: device `{device}` of `{name}`: {error}")]
    Device {
        /// The verbs name.
        name: String,
        /// The device as written.
        device: String,
        /// Why it did not parse.
        error: pmd::name::NameError,
    },
    /// A device has a backup but the rendezvous is not configured.
    #[error(
        "{DEVICES_VAR}: `{name}` has a backup device, which needs {RENDEZVOUS_VAR}=redis://host:port/ and {key_var} (the job's secret)"
    )]
    NoRendezvous {
        /// The verbs name.
        name: String,
        /// The key file variable.
        key_var: &'static str,
    },
    /// A number variable did not parse.
    #[error("{var}=`{value}`: expected a number of milliseconds")]
    Millis {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// `RAILSHIFT_MANAGEMENT_ADDR` is not an address this host can be reached at.
    #[error("{MANAGEMENT_ADDR_VAR}=`{value}`: {why}")]
    ManagementAddr {
        /// The value.
        value: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// `RAILSHIFT_PROGRESS` is neither `poll` nor `engine`.
    #[error("{PROGRESS_VAR}=`{value}`: expected `poll` or `engine`")]
    Progress {
        /// The value.
        value: String,
    },
}

impl Config {
    /// Parses the two variables' values (`None`: unset).
    pub fn parse(devices: Option<&str>, progress: Option<&str>) -> Result<Config, ConfigError> {
        let progress = match progress.map(str::trim) {
            None | Some("") | Some("poll") => Progress::Poll,
            Some("engine") => Progress::Engine,
            Some(other) => {
                return Err(ConfigError::Progress {
                    value: other.to_string(),
                })
            }
        };
        let mut specs: Vec<DeviceSpec> = Vec::new();
        for entry in devices.unwrap_or("").split(',').map(str::trim) {
            if entry.is_empty() {
                continue;
            }
            let (name, device) = entry.split_once('=').ok_or_else(|| ConfigError::NoEquals {
                entry: entry.to_string(),
            })?;
            let (name, device) = (name.trim(), device.trim());
            let good_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
            if name.is_empty() || name.len() > MAX_NAME_LEN || !name.chars().all(good_char) {
                return Err(ConfigError::BadName {
                    name: name.to_string(),
                });
            }
            if specs.iter().any(|s| s.name == name) {
                return Err(ConfigError::Duplicate {
                    name: name.to_string(),
                });
            }
            let (device, backup) = match device.split_once('+') {
                Some((d, b)) => (d.trim(), Some(b.trim())),
                None => (device, None),
            };
            let parse = |text: &str| {
                pmd::DeviceName::from_str(text).map_err(|error| ConfigError::Device {
                    name: name.to_string(),
                    device: text.to_string(),
                    error,
                })
            };
            let parsed = parse(device)?;
            if let Some(b) = backup {
                parse(b)?;
            }
            specs.push(DeviceSpec {
                name: name.to_string(),
                device: parsed,
                device_text: device.to_string(),
                backup_text: backup.map(str::to_string),
            });
        }
        Ok(Config {
            devices: specs,
            progress,
            resilience: None,
        })
    }

    /// Reads the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::parse_with(|var| std::env::var(var).ok())
    }

    /// As [`Config::from_env`], reading variables through `var`.
    pub fn parse_with(var: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let mut config = Config::parse(var(DEVICES_VAR).as_deref(), var(PROGRESS_VAR).as_deref())?;
        let Some(first) = config.devices.iter().find(|d| d.backup_text.is_some()) else {
            return Ok(config);
        };
        let set = |name: &str| {
            var(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let (Some(rendezvous), Some(_)) = (set(RENDEZVOUS_VAR), set(pmd::resilient::KEY_FILE_VAR))
        else {
            return Err(ConfigError::NoRendezvous {
                name: first.name.clone(),
                key_var: pmd::resilient::KEY_FILE_VAR,
            });
        };
        let millis = |name: &'static str| -> Result<Option<Duration>, ConfigError> {
            set(name)
                .map(|v| {
                    v.parse::<u64>()
                        .map(Duration::from_millis)
                        .map_err(|_| ConfigError::Millis {
                            var: name,
                            value: v,
                        })
                })
                .transpose()
        };
        config.resilience = Some(Resilience {
            rendezvous,
            prefix: set(PREFIX_VAR).unwrap_or_else(|| DEFAULT_PREFIX.to_string()),
            holddown: millis(HOLDDOWN_VAR)?,
            outage_tolerance: millis(OUTAGE_TOLERANCE_VAR)?,
            protect_wait: millis(PROTECT_WAIT_VAR)?.unwrap_or(DEFAULT_PROTECT_WAIT),
            management_addr: set(MANAGEMENT_ADDR_VAR)
                .map(|v| management_addr(&v))
                .transpose()?,
        });
        Ok(config)
    }
}

/// Parses [`MANAGEMENT_ADDR_VAR`]'s value: one IP address the peer can send to. The address
/// is published to the peer in the rendezvous, so one that means "any" or "everyone" there
/// (unspecified, multicast, broadcast) would send the peer's datagrams somewhere else.
fn management_addr(value: &str) -> Result<IpAddr, ConfigError> {
    let bad = |why| ConfigError::ManagementAddr {
        value: value.to_string(),
        why,
    };
    let addr = IpAddr::from_str(value).map_err(|_| {
        bad("expected this host's IP address on the management network (e.g. 198.18.100.1)")
    })?;
    let broadcast = matches!(addr, IpAddr::V4(v4) if v4.is_broadcast());
    if addr.is_unspecified() || addr.is_multicast() || broadcast {
        return Err(bad(
            "an unspecified, multicast or broadcast address names no one host; give this host's own address on the management network",
        ));
    }
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_devices_parse_in_order() {
        let c = Config::parse(Some("rs0=soft:lo@127.0.0.1, rs1=soft:veth0"), None).unwrap();
        let names: Vec<&str> = c.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["rs0", "rs1"]);
        assert_eq!(c.devices[0].device_text, "soft:lo@127.0.0.1");
        assert_eq!(c.progress, Progress::Poll);
    }

    #[test]
    fn unset_means_no_devices() {
        assert!(Config::parse(None, None).unwrap().devices.is_empty());
    }

    #[test]
    fn an_entry_without_equals_is_named() {
        let e = Config::parse(Some("soft:lo"), None).unwrap_err();
        assert!(e.to_string().contains("`soft:lo`"), "{e}");
    }

    #[test]
    fn a_bad_or_repeated_name_is_refused() {
        assert!(matches!(
            Config::parse(Some("r s=soft:lo"), None),
            Err(ConfigError::BadName { .. })
        ));
        assert!(matches!(
            Config::parse(Some("rs0=soft:lo,rs0=soft:lo"), None),
            Err(ConfigError::Duplicate { .. })
        ));
    }

    #[test]
    fn a_bad_device_names_the_entry() {
        let e = Config::parse(Some("rs0=nonsense:x"), None).unwrap_err();
        assert!(e.to_string().contains("rs0"), "{e}");
    }

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn a_backup_device_parses_with_its_rendezvous() {
        let c = Config::parse_with(env(&[
            (
                DEVICES_VAR,
                "rs0=soft:lo@127.0.0.1,rs1=soft:veth0+soft:veth1",
            ),
            (RENDEZVOUS_VAR, "redis://127.0.0.1:6379/"),
            (pmd::resilient::KEY_FILE_VAR, "/tmp/key"),
            (HOLDDOWN_VAR, "250"),
            (OUTAGE_TOLERANCE_VAR, "60000"),
        ]))
        .unwrap();
        assert_eq!(c.devices[0].backup_text, None);
        assert_eq!(c.devices[1].device_text, "soft:veth0");
        assert_eq!(c.devices[1].backup_text.as_deref(), Some("soft:veth1"));
        let r = c.resilience.unwrap();
        assert_eq!(r.prefix, DEFAULT_PREFIX);
        assert_eq!(r.holddown, Some(Duration::from_millis(250)));
        assert_eq!(r.outage_tolerance, Some(Duration::from_secs(60)));
        assert_eq!(r.protect_wait, DEFAULT_PROTECT_WAIT);
    }

    #[test]
    fn a_backup_without_a_rendezvous_is_refused_by_name() {
        let e = Config::parse_with(env(&[(DEVICES_VAR, "rs1=soft:veth0+soft:veth1")])).unwrap_err();
        assert!(matches!(e, ConfigError::NoRendezvous { .. }), "{e}");
        assert!(e.to_string().contains("rs1"), "{e}");
        assert!(e.to_string().contains(RENDEZVOUS_VAR), "{e}");
    }

    #[test]
    fn a_bad_backup_or_number_is_named() {
        let e = Config::parse(Some("rs1=soft:veth0+bogus:x"), None).unwrap_err();
        assert!(e.to_string().contains("bogus:x"), "{e}");
        let e = Config::parse_with(env(&[
            (DEVICES_VAR, "rs1=soft:veth0+soft:veth1"),
            (RENDEZVOUS_VAR, "redis://127.0.0.1:6379/"),
            (pmd::resilient::KEY_FILE_VAR, "/tmp/key"),
            (PROTECT_WAIT_VAR, "5s"),
        ]))
        .unwrap_err();
        assert!(e.to_string().contains(PROTECT_WAIT_VAR), "{e}");
    }

    /// A resilient device's environment with `RAILSHIFT_MANAGEMENT_ADDR` set to `value`.
    fn with_management_addr(value: &str) -> Result<Config, ConfigError> {
        Config::parse_with(env(&[
            (DEVICES_VAR, "rs1=soft:veth0+soft:veth1"),
            (RENDEZVOUS_VAR, "redis://127.0.0.1:6379/"),
            (pmd::resilient::KEY_FILE_VAR, "/tmp/key"),
            (MANAGEMENT_ADDR_VAR, value),
        ]))
    }

    #[test]
    fn a_management_address_is_an_ip_address_and_none_unless_set() {
        let unset = Config::parse_with(env(&[
            (DEVICES_VAR, "rs1=soft:veth0+soft:veth1"),
            (RENDEZVOUS_VAR, "redis://127.0.0.1:6379/"),
            (pmd::resilient::KEY_FILE_VAR, "/tmp/key"),
        ]))
        .unwrap();
        assert_eq!(unset.resilience.unwrap().management_addr, None);
        assert_eq!(
            with_management_addr("")
                .unwrap()
                .resilience
                .unwrap()
                .management_addr,
            None
        );
        for (value, addr) in [
            (" 198.18.100.1 ", "198.18.100.1"),
            ("127.0.0.1", "127.0.0.1"),
            ("fd00::1", "fd00::1"),
        ] {
            let c = with_management_addr(value).unwrap();
            assert_eq!(
                c.resilience.unwrap().management_addr,
                Some(addr.parse().unwrap()),
                "{value}"
            );
        }
    }

    #[test]
    fn a_bad_management_address_names_the_variable_and_the_value() {
        for value in [
            "host-b",
            "198.18.100.1:5000",
            "198.18.100",
            "0.0.0.0",
            "::",
            "224.0.0.1",
            "255.255.255.255",
        ] {
            let e = with_management_addr(value).unwrap_err();
            assert!(
                matches!(e, ConfigError::ManagementAddr { .. }),
                "{value}: {e}"
            );
            let text = e.to_string();
            assert!(
                text.contains(&format!("{MANAGEMENT_ADDR_VAR}=`{value}`")),
                "{text}"
            );
        }
    }

    #[test]
    fn progress_is_poll_or_engine() {
        assert_eq!(
            Config::parse(None, Some("engine")).unwrap().progress,
            Progress::Engine
        );
        assert!(matches!(
            Config::parse(None, Some("fast")),
            Err(ConfigError::Progress { .. })
        ));
    }
}
