//! The fault channel of the process contract (`docs/apps-json.md`, "Fault channel"): how
//! the testbed asks an application to inject a device fault that `ip link`
//! cannot make, such as a NIC that dies silently.
//!
//! One named pipe (FIFO) per host, at [`channel_path`]; the application gets its path with
//! `--fault-fifo PATH`, reads it, and applies each command to its own device
//! (`Context::inject_fault`), then reports what it applied in its JSON (`faults`). A command
//! is one line of UTF-8, written with a single `write` (at most `PIPE_BUF` bytes, so lines
//! from several writers never interleave):
//!
//! ```text
//! device-dead soft:nic0
//! qps-failed soft:nic1
//! ```

use std::fmt;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sys::stat::Mode;

use crate::topology::{Role, TestbedInfo, STATE_DIR};

/// A command on the fault channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultCommand {
    /// The device named `device` (as the application opened it, e.g. `soft:nic0`) dies
    /// silently: no more completions, no packets, its netdev stays up; the application
    /// sees it as the provider's device-fatal event, if at all.
    DeviceDead {
        /// The device's name.
        device: String,
    },
    /// Every QP of the device named `device` goes to ERR, flushing what is posted on it;
    /// the device and its netdev stay up (`DeviceFault::QpsFailed`).
    QpsFailed {
        /// The device's name.
        device: String,
    },
}

impl fmt::Display for FaultCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FaultCommand::DeviceDead { device } => write!(f, "device-dead {device}"),
            FaultCommand::QpsFailed { device } => write!(f, "qps-failed {device}"),
        }
    }
}

/// Why a command could not be delivered.
#[derive(Debug, thiserror::Error)]
pub enum FaultError {
    /// Nothing was listening: the application was not started with `--fault-fifo`, or exited.
    #[error("no application reads the fault channel {0} (start it with --fault-fifo {0}; docs/apps-json.md)")]
    NoReader(PathBuf),
    /// The channel does not exist.
    #[error("the fault channel {0} does not exist: no application made it (start one with --fault-fifo {0}; docs/apps-json.md)")]
    Missing(PathBuf),
    /// Something else exists at the path.
    #[error("{0} exists and is not a FIFO")]
    NotAFifo(PathBuf),
    /// The pipe is full: the application stopped reading.
    #[error("the fault channel {0} is full: its reader stopped reading")]
    Full(PathBuf),
    /// Any other I/O error.
    #[error("fault channel {path}: {source}")]
    Io {
        /// The channel.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// The fault channel of the application running in `role`'s host of testbed `info`.
pub fn channel_path(info: &TestbedInfo, role: Role) -> PathBuf {
    PathBuf::from(STATE_DIR).join(format!("faults-{}.fifo", info.host(role).netns))
}

/// Creates the FIFO at `path` (mode 0600) unless one is there already.
pub fn create(path: &Path) -> Result<(), FaultError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| FaultError::Io {
            path: path.to_owned(),
            source,
        })?;
    }
    match nix::unistd::mkfifo(path, Mode::S_IRUSR | Mode::S_IWUSR) {
        Ok(()) => Ok(()),
        Err(Errno::EEXIST) => match std::fs::metadata(path) {
            Ok(m) if m.file_type().is_fifo() => Ok(()),
            Ok(_) => Err(FaultError::NotAFifo(path.to_owned())),
            Err(source) => Err(FaultError::Io {
                path: path.to_owned(),
                source,
            }),
        },
        Err(e) => Err(FaultError::Io {
            path: path.to_owned(),
            source: e.into(),
        }),
    }
}

/// Removes the FIFO at `path`, if it is one.
pub fn remove(path: &Path) {
    if std::fs::metadata(path).is_ok_and(|m| m.file_type().is_fifo()) {
        if let Err(e) = std::fs::remove_file(path) {
            tracing::warn!(path = %path.display(), error = %e, "could not remove the fault channel");
        }
    }
}

/// Sends `command` on the channel at `path`. Never blocks: without a reader, or with a full
/// pipe, it fails naming why.
pub fn send(path: &Path, command: &FaultCommand) -> Result<(), FaultError> {
    let io = |source: std::io::Error| FaultError::Io {
        path: path.to_owned(),
        source,
    };
    match std::fs::metadata(path) {
        Ok(m) if !m.file_type().is_fifo() => return Err(FaultError::NotAFifo(path.to_owned())),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(FaultError::Missing(path.to_owned()))
        }
        Err(e) => return Err(io(e)),
    }
    // O_NONBLOCK: opening a FIFO for writing with no reader fails with ENXIO instead of
    // waiting for one.
    let mut fifo = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(code) if code == Errno::ENXIO as i32 => FaultError::NoReader(path.to_owned()),
            _ => io(e),
        })?;
    let line = format!("{command}\n");
    // One write of less than PIPE_BUF bytes is atomic: it lands whole or not at all.
    match fifo.write(line.as_bytes()) {
        Ok(n) if n == line.len() => Ok(()),
        Ok(_) => Err(FaultError::Full(path.to_owned())),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
            Err(FaultError::Full(path.to_owned()))
        }
        Err(e) => Err(io(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};

    fn temp_fifo(tag: &str) -> PathBuf {
        let path = std::env::temp_dir().join(format!(
            "railshift-faults-{tag}-{}.fifo",
            std::process::id()
        ));
        remove(&path);
        path
    }

    #[test]
    fn a_reader_of_the_channel_gets_the_command_as_one_line() {
        let path = temp_fifo("line");
        create(&path).unwrap();
        // Created twice: the second is a no-op (the application may have made it first).
        create(&path).unwrap();
        // Read-write, as the contract asks of the application: it never sees end-of-file
        // between writers, and opening it does not wait for a writer.
        let reader = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let cmd = FaultCommand::DeviceDead {
            device: "soft:nic0".into(),
        };
        send(&path, &cmd).unwrap();
        let mut line = String::new();
        BufReader::new(reader).read_line(&mut line).unwrap();
        assert_eq!(line, "device-dead soft:nic0\n");
        remove(&path);
        assert!(!path.exists());
    }

    #[test]
    fn without_a_reader_the_send_fails_and_says_how_to_start_one() {
        let path = temp_fifo("noreader");
        create(&path).unwrap();
        let err = send(
            &path,
            &FaultCommand::DeviceDead {
                device: "soft:nic0".into(),
            },
        )
        .unwrap_err();
        assert!(matches!(err, FaultError::NoReader(_)), "{err}");
        assert!(err.to_string().contains("--fault-fifo"), "{err}");
        remove(&path);
    }

    #[test]
    fn a_missing_channel_or_a_plain_file_is_named() {
        let path = temp_fifo("missing");
        let cmd = FaultCommand::DeviceDead {
            device: "soft:nic0".into(),
        };
        assert!(matches!(send(&path, &cmd), Err(FaultError::Missing(_))));
        std::fs::write(&path, b"x").unwrap();
        assert!(matches!(send(&path, &cmd), Err(FaultError::NotAFifo(_))));
        assert!(matches!(create(&path), Err(FaultError::NotAFifo(_))));
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn channels_are_per_host_under_the_state_directory() {
        let info = TestbedInfo::plan(&crate::topology::TopologySpec::default());
        assert_eq!(
            channel_path(&info, Role::Initiator),
            PathBuf::from("/run/railshift/faults-rs-a.fifo")
        );
        assert_eq!(
            channel_path(&info, Role::Responder),
            PathBuf::from("/run/railshift/faults-rs-b.fifo")
        );
    }
}
