//! What the shim presents, read from the environment once per process.
//!
//! `RAILSHIFT_DEVICES` lists the devices `ibv_get_device_list` returns in front of the
//! system's: comma-separated `<verbs name>=<pmd device>` entries, e.g.
//! `rs0=soft:lo@127.0.0.1,rs1=soft:veth0`. The verbs name is what a program's `-d`/`--ib-dev`
//! names; the pmd device is any name `pmd::Context::open` takes (`soft:<netdev>[@<addr>]`,
//! `fabric:<name>/<port>`, `mlx5:<ibdev>`).
//!
//! `RAILSHIFT_PROGRESS` says how a softnic device makes progress: `poll` (default: the
//! application's `ibv_poll_cq` drives the device, run-to-completion, and a helper thread
//! drives it while the application does not poll) or `engine` (the softnic's own engine
//! thread, as `pmd`'s auto progress).

use std::str::FromStr;

use pmd::provider::ProgressModel;

/// The environment variable listing the devices.
pub const DEVICES_VAR: &str = "RAILSHIFT_DEVICES";
/// The environment variable choosing the progress model.
pub const PROGRESS_VAR: &str = "RAILSHIFT_PROGRESS";

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
    /// A device with a backup (`<default>+<backup>`): resilient devices are not built yet.
    #[error(
        "{DEVICES_VAR}: `{name}` names a backup device (`{device}`): resilient devices are not supported by librailshift_verbs.so yet"
    )]
    Backup {
        /// The verbs name.
        name: String,
        /// The devices as written.
        device: String,
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
            if device.contains('+') {
                return Err(ConfigError::Backup {
                    name: name.to_string(),
                    device: device.to_string(),
                });
            }
            let parsed =
                pmd::DeviceName::from_str(device).map_err(|error| ConfigError::Device {
                    name: name.to_string(),
                    device: device.to_string(),
                    error,
                })?;
            specs.push(DeviceSpec {
                name: name.to_string(),
                device: parsed,
                device_text: device.to_string(),
            });
        }
        Ok(Config {
            devices: specs,
            progress,
        })
    }

    /// Reads the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        let devices = std::env::var(DEVICES_VAR).ok();
        let progress = std::env::var(PROGRESS_VAR).ok();
        Config::parse(devices.as_deref(), progress.as_deref())
    }
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

    #[test]
    fn a_backup_device_is_refused_by_name() {
        let e = Config::parse(Some("rs1=soft:veth0+soft:veth1"), None).unwrap_err();
        assert!(matches!(e, ConfigError::Backup { .. }), "{e}");
        assert!(e.to_string().contains("rs1"), "{e}");
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
