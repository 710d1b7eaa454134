//! The fault channel (`docs/apps-json.md` "Fault channel"): a named pipe a test or the testbed
//! writes commands into, one line each, to make this process's own devices fail in ways
//! `ip link` cannot (a NIC that dies silently, or fails its QPs). A thread of its own waits on
//! the pipe in `poll(2)`, so a command takes effect within a millisecond whatever the polling
//! lcore is doing, and the lcore makes no system call for it. The apps open it with
//! `--fault-fifo` (and report what each command did in their JSON), the verbs library with
//! `RAILSHIFT_FAULT_FIFO`.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use std::time::{SystemTime, UNIX_EPOCH};

use crate::provider::DeviceFault;
use crate::Context;

/// The longest command line, newline included.
const MAX_LINE: usize = 512;
/// How often the reader looks at its stop flag while nothing comes.
const POLL_MS: i32 = 20;

/// What the process did with one command of its fault channel.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultRecord {
    /// The line as read, without the newline.
    pub command: String,
    /// When the process read it (Unix milliseconds).
    pub received_unix_ms: f64,
    /// When the fault was in place; `None` if it was not applied.
    pub applied_unix_ms: Option<f64>,
    /// Why it was not applied.
    pub error: Option<String>,
}

/// A command the channel understands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Command {
    /// `device-dead <device>`.
    DeviceDead(String),
    /// `qps-failed <device>`: every QP of the device to ERR, the device and its link up.
    QpsFailed(String),
}

/// Parses one line (without its newline).
fn parse(line: &str) -> Result<Command, String> {
    let mut words = line.split_whitespace();
    match (words.next(), words.next(), words.next()) {
        (Some("device-dead"), Some(device), None) => Ok(Command::DeviceDead(device.to_owned())),
        (Some("qps-failed"), Some(device), None) => Ok(Command::QpsFailed(device.to_owned())),
        (Some(verb @ ("device-dead" | "qps-failed")), _, _) => {
            Err(format!("usage: {verb} <device>"))
        }
        (Some(other), _, _) => Err(format!(
            "unknown command {other:?} (known: device-dead, qps-failed)"
        )),
        (None, _, _) => Err("empty command".to_owned()),
    }
}

/// The devices commands may name, by the names they were opened with.
type Devices = Arc<Mutex<Vec<(String, Arc<Context>)>>>;

/// The open fault channel and its reader thread.
pub struct FaultChannel {
    devices: Devices,
    stop: Arc<AtomicBool>,
    reader: Option<JoinHandle<Vec<FaultRecord>>>,
}

impl FaultChannel {
    /// Opens the FIFO at `path` (made with mode 0600 when nothing is there) and starts
    /// reading it.
    /// The error names the path and says what went wrong.
    pub fn open(path: &Path) -> Result<FaultChannel, String> {
        let bad = |why: String| format!("{}: {why}", path.display());
        let c_path = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| bad("the path has a NUL byte".to_owned()))?;
        match std::fs::metadata(path) {
            Ok(m) => {
                use std::os::unix::fs::FileTypeExt;
                if !m.file_type().is_fifo() {
                    return Err(bad("exists and is not a FIFO".to_owned()));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // SAFETY: a valid NUL-terminated path; no other preconditions.
                if unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) } != 0 {
                    let e = std::io::Error::last_os_error();
                    return Err(bad(format!("cannot create the FIFO: {e}")));
                }
            }
            Err(e) => return Err(bad(e.to_string())),
        }
        // Read-write: the pipe then never reports end-of-file between writers, and opening
        // does not wait for one.
        // SAFETY: a valid NUL-terminated path; the descriptor is owned below.
        let fd = unsafe {
            libc::open(
                c_path.as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            return Err(bad(format!("cannot open: {e}")));
        }
        // SAFETY: `fd` was just opened and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let devices: Devices = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let (devices, stop) = (devices.clone(), stop.clone());
            let path = path.to_owned();
            std::thread::Builder::new()
                .name("fault-channel".into())
                .spawn(move || read_commands(fd, path, devices, stop))
                .map_err(|e| bad(format!("cannot start the reader thread: {e}")))?
        };
        Ok(FaultChannel {
            devices,
            stop,
            reader: Some(reader),
        })
    }

    /// Makes the device opened as `name` reachable by commands.
    pub fn register(&self, name: &str, ctx: &Arc<Context>) {
        self.devices
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((name.to_owned(), ctx.clone()));
    }

    /// Stops reading; what every command read did, oldest first.
    pub fn finish(mut self) -> Vec<FaultRecord> {
        self.stop.store(true, Ordering::Release);
        self.reader
            .take()
            .and_then(|r| r.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for FaultChannel {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

/// The wall clock in Unix milliseconds (the records' times, comparable across processes).
fn unix_ms_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1e3)
        .unwrap_or(0.0)
}

/// The reader thread: lines from the pipe, each applied as it comes.
fn read_commands(
    fd: OwnedFd,
    path: PathBuf,
    devices: Devices,
    stop: Arc<AtomicBool>,
) -> Vec<FaultRecord> {
    let mut done = Vec::new();
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = [0u8; 4096];
    while !stop.load(Ordering::Acquire) {
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, POLL_MS) };
        if n <= 0 {
            continue;
        }
        loop {
            // SAFETY: reads into a live buffer of its length from the owned descriptor.
            let got = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if got <= 0 {
                break;
            }
            pending.extend_from_slice(&buf[..got as usize]);
        }
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            done.push(apply(&line[..end], &devices));
        }
        if pending.len() >= MAX_LINE {
            let line: Vec<u8> = std::mem::take(&mut pending);
            let mut record = FaultRecord {
                command: String::from_utf8_lossy(&line[..64.min(line.len())]).into_owned(),
                received_unix_ms: unix_ms_now(),
                ..FaultRecord::default()
            };
            record.error = Some(format!("a line longer than {MAX_LINE} bytes"));
            eprintln!(
                "fault channel {}: {}",
                path.display(),
                record.error.as_deref().unwrap_or_default()
            );
            done.push(record);
        }
    }
    done
}

/// Applies one command line.
fn apply(line: &[u8], devices: &Devices) -> FaultRecord {
    let received_unix_ms = unix_ms_now();
    let command = String::from_utf8_lossy(line)
        .trim_end_matches('\r')
        .to_owned();
    let result = parse(&command).and_then(|c| {
        let (name, fault) = match c {
            Command::DeviceDead(name) => (name, DeviceFault::Dead),
            Command::QpsFailed(name) => (name, DeviceFault::QpsFailed),
        };
        let ctx = devices
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, c)| c.clone())
            .ok_or_else(|| format!("no device {name} is open in this process"))?;
        ctx.inject_fault(fault).map_err(|e| e.to_string())
    });
    let (applied_unix_ms, error) = match result {
        Ok(()) => (Some(unix_ms_now()), None),
        Err(e) => {
            eprintln!("fault channel: {command:?}: {e}");
            (None, Some(e))
        }
    };
    FaultRecord {
        command,
        received_unix_ms,
        applied_unix_ms,
        error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_parse_and_bad_ones_say_why() {
        assert_eq!(
            parse("device-dead soft:nic0"),
            Ok(Command::DeviceDead("soft:nic0".into()))
        );
        assert_eq!(
            parse("qps-failed soft:nic1"),
            Ok(Command::QpsFailed("soft:nic1".into()))
        );
        assert!(parse("device-dead").unwrap_err().contains("usage"));
        assert!(parse("qps-failed")
            .unwrap_err()
            .contains("usage: qps-failed"));
        assert!(parse("device-dead a b").unwrap_err().contains("usage"));
        assert!(parse("reboot").unwrap_err().contains("unknown command"));
        assert!(parse("").unwrap_err().contains("empty"));
    }

    #[test]
    fn a_command_for_a_device_not_open_is_reported_not_applied() {
        let devices: Devices = Arc::default();
        let r = apply(b"device-dead soft:nic9", &devices);
        assert_eq!(r.command, "device-dead soft:nic9");
        assert!(r.applied_unix_ms.is_none());
        assert!(r.error.unwrap().contains("soft:nic9"));
    }

    #[test]
    fn lines_written_to_the_fifo_are_read_and_reported_in_order() {
        let path = std::env::temp_dir().join(format!("r14-faults-{}.fifo", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let ch = FaultChannel::open(&path).unwrap();
        {
            use std::io::Write;
            let mut w = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            w.write_all(b"device-dead soft:nope\nbogus\n").unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        let got = ch.finish();
        let _ = std::fs::remove_file(&path);
        let commands: Vec<_> = got.iter().map(|f| f.command.as_str()).collect();
        assert_eq!(commands, ["device-dead soft:nope", "bogus"]);
        assert!(got.iter().all(|f| f.error.is_some()));
    }
}
