//! Running an application pair across the testbed's hosts: the server in the responder's
//! namespace, the client in the initiator's, as `docs/apps-json.md` describes.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::report::AppReport;
use crate::topology::{Role, TestbedInfo};

/// Why a pair could not be run.
#[derive(Debug, thiserror::Error)]
pub enum AppRunError {
    /// The binary is not where it should be.
    #[error(
        "{0} not found: build the apps first (`cargo build --release -p apps`) or pass --apps-dir"
    )]
    MissingBinary(PathBuf),
    /// A process could not be started.
    #[error("cannot start {what}: {source}")]
    Spawn {
        /// Which process.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// The server never started listening.
    #[error("the server did not listen on port {port} within {waited:?}{exit}")]
    ServerNotListening {
        /// The port.
        port: u16,
        /// How long we waited.
        waited: Duration,
        /// How the server exited, if it did.
        exit: String,
    },
    /// A report file was missing or malformed.
    #[error("report {path}: {detail}")]
    Report {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
}

/// One application pair to run.
#[derive(Debug, Clone)]
pub struct PairSpec {
    /// Binary name, e.g. `shift_write_bw`.
    pub tool: String,
    /// Directory holding the binaries.
    pub apps_dir: PathBuf,
    /// Arguments for both sides (size, duration, devices, ...).
    pub common_args: Vec<String>,
    /// Out-of-band TCP port.
    pub port: u16,
    /// Where the two JSON reports go.
    pub out_dir: PathBuf,
    /// Tag for the report file names.
    pub tag: String,
    /// How long the client may run before it is killed.
    pub client_timeout: Duration,
}

/// A started pair.
pub struct RunningPair {
    server: Child,
    client: Child,
    started: Instant,
    /// Path of the client's JSON report.
    pub client_json: PathBuf,
    /// Path of the server's JSON report.
    pub server_json: PathBuf,
    client_timeout: Duration,
}

/// What a finished pair left behind.
#[derive(Debug)]
pub struct PairOutcome {
    /// The client's report.
    pub client: AppReport,
    /// The client's report as raw JSON (kept whole in the scenario output).
    pub client_raw: serde_json::Value,
    /// The server's report, when it wrote one.
    pub server: Option<AppReport>,
    /// The server's report as raw JSON.
    pub server_raw: Option<serde_json::Value>,
    /// How the client exited (`None`: killed after its timeout).
    pub client_exit: Option<ExitStatus>,
}

fn binary(dir: &Path, tool: &str) -> Result<PathBuf, AppRunError> {
    let path = dir.join(tool);
    if path.is_file() {
        Ok(path)
    } else {
        Err(AppRunError::MissingBinary(path))
    }
}

/// The directory holding this executable, where cargo also puts the apps' binaries.
pub fn default_apps_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("."))
}

fn spawn_in(ns: &str, program: &Path, args: &[String], log: &Path) -> Result<Child, AppRunError> {
    let what = format!("{} in {ns}", program.display());
    let out = std::fs::File::create(log).map_err(|source| AppRunError::Spawn {
        what: what.clone(),
        source,
    })?;
    let err = out.try_clone().map_err(|source| AppRunError::Spawn {
        what: what.clone(),
        source,
    })?;
    Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|source| AppRunError::Spawn { what, source })
}

fn listening(ns: &str, port: u16) -> bool {
    Command::new("ip")
        .args(["netns", "exec", ns, "ss", "-Hltn"])
        .arg(format!("sport = :{port}"))
        .output()
        .map(|o| o.status.success() && !o.stdout.is_empty())
        .unwrap_or(false)
}

/// Starts the server, waits for it to listen, then starts the client.
pub fn start(info: &TestbedInfo, spec: &PairSpec) -> Result<RunningPair, AppRunError> {
    let program = binary(&spec.apps_dir, &spec.tool)?;
    std::fs::create_dir_all(&spec.out_dir).map_err(|source| AppRunError::Spawn {
        what: format!("output directory {}", spec.out_dir.display()),
        source,
    })?;
    let server_json = spec.out_dir.join(format!("{}-server.json", spec.tag));
    let client_json = spec.out_dir.join(format!("{}-client.json", spec.tag));
    for stale in [&server_json, &client_json] {
        let _ = std::fs::remove_file(stale);
    }
    let (a, b) = (info.host(Role::Initiator), info.host(Role::Responder));
    let mut server_args = spec.common_args.clone();
    server_args.extend([
        "-p".to_owned(),
        spec.port.to_string(),
        "--json".to_owned(),
        server_json.display().to_string(),
    ]);
    let server_log = spec.out_dir.join(format!("{}-server.log", spec.tag));
    let mut server = spawn_in(&b.netns, &program, &server_args, &server_log)?;
    let waited = Duration::from_secs(10);
    let t0 = Instant::now();
    while !listening(&b.netns, spec.port) {
        if let Ok(Some(status)) = server.try_wait() {
            return Err(AppRunError::ServerNotListening {
                port: spec.port,
                waited: t0.elapsed(),
                exit: format!(" (it exited with {status}; see {})", server_log.display()),
            });
        }
        if t0.elapsed() > waited {
            let _ = server.kill();
            let _ = server.wait();
            return Err(AppRunError::ServerNotListening {
                port: spec.port,
                waited,
                exit: String::new(),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut client_args = spec.common_args.clone();
    client_args.extend([
        "-p".to_owned(),
        spec.port.to_string(),
        "--json".to_owned(),
        client_json.display().to_string(),
        b.mgmt_addr.clone(),
    ]);
    let client_log = spec.out_dir.join(format!("{}-client.log", spec.tag));
    let client = match spawn_in(&a.netns, &program, &client_args, &client_log) {
        Ok(c) => c,
        Err(e) => {
            let _ = server.kill();
            let _ = server.wait();
            return Err(e);
        }
    };
    Ok(RunningPair {
        server,
        client,
        started: Instant::now(),
        client_json,
        server_json,
        client_timeout: spec.client_timeout,
    })
}

impl RunningPair {
    /// Whether the client has exited.
    pub fn client_exited(&mut self) -> bool {
        matches!(self.client.try_wait(), Ok(Some(_)))
    }

    /// Waits for both processes (killing what overstays) and reads their reports.
    pub fn finish(mut self) -> Result<PairOutcome, AppRunError> {
        let client_exit = wait_or_kill(&mut self.client, self.client_timeout, self.started);
        // The server exits when the client's connection closes; give it a moment.
        let _ = wait_or_kill(&mut self.server, Duration::from_secs(5), Instant::now());
        let (client, client_raw) = read_report(&self.client_json)?;
        let (server, server_raw) = match read_report(&self.server_json) {
            Ok((r, raw)) => (Some(r), Some(raw)),
            Err(e) => {
                tracing::warn!(error = %e, "server report unavailable");
                (None, None)
            }
        };
        Ok(PairOutcome {
            client,
            client_raw,
            server,
            server_raw,
            client_exit,
        })
    }
}

fn wait_or_kill(child: &mut Child, timeout: Duration, since: Instant) -> Option<ExitStatus> {
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if since.elapsed() < timeout => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

/// Reads and parses one JSON report.
pub fn read_report(path: &Path) -> Result<(AppReport, serde_json::Value), AppRunError> {
    let err = |detail: String| AppRunError::Report {
        path: path.to_owned(),
        detail,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    let raw: serde_json::Value = serde_json::from_str(&text).map_err(|e| err(e.to_string()))?;
    let report: AppReport = serde_json::from_value(raw.clone()).map_err(|e| err(e.to_string()))?;
    Ok((report, raw))
}
