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
    /// Arguments for the client only (after the common ones).
    pub client_args: Vec<String>,
    /// Arguments for the server only (after the common ones).
    pub server_args: Vec<String>,
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
    client_log: PathBuf,
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

/// How long a server given `args` may take to listen: 10 s, and 5 ms more for each QP it
/// sets up first (`-q`/`--qp`, `--idle-qps`): 4,096 resilient QPs took over 10 s on this 2-core
/// machine under load.
fn listen_wait(args: &[String]) -> Duration {
    let qps: u64 = args
        .windows(2)
        .filter(|w| matches!(w[0].as_str(), "-q" | "--qp" | "--idle-qps"))
        .filter_map(|w| w[1].parse::<u64>().ok())
        .sum();
    Duration::from_secs(10) + Duration::from_millis(5 * qps)
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
    server_args.extend(spec.server_args.iter().cloned());
    server_args.extend([
        "-p".to_owned(),
        spec.port.to_string(),
        "--json".to_owned(),
        server_json.display().to_string(),
        // The third channel (`docs/failover.md` 5f), on the address the exchange uses.
        "--management-addr".to_owned(),
        b.mgmt_addr.clone(),
    ]);
    let server_log = spec.out_dir.join(format!("{}-server.log", spec.tag));
    let mut server = spawn_in(&b.netns, &program, &server_args, &server_log)?;
    let waited = listen_wait(&server_args);
    let t0 = Instant::now();
    while !listening(&b.netns, spec.port) {
        if let Ok(Some(status)) = server.try_wait() {
            return Err(AppRunError::ServerNotListening {
                port: spec.port,
                waited: t0.elapsed(),
                exit: format!(
                    " (it exited with {status}{}; see {})",
                    last_words(&server_log),
                    server_log.display()
                ),
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
    client_args.extend(spec.client_args.iter().cloned());
    client_args.extend([
        "-p".to_owned(),
        spec.port.to_string(),
        "--json".to_owned(),
        client_json.display().to_string(),
        "--management-addr".to_owned(),
        a.mgmt_addr.clone(),
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
        client_log,
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

    /// Waits until the client's traffic has started, and returns when it started: the
    /// client prints its first timeline sample (` [timeline]   100.0 ms ...`, `t_ms` since
    /// its traffic started) once it is connected, so the start is that line's arrival
    /// minus its `t_ms`. Setting up many QPs takes seconds; a schedule timed from the
    /// process start would fail links before the traffic runs. Returns now when the
    /// client exits first, or after `timeout` (with a warning: a client that prints no
    /// timeline, `--timeline-ms 0`, is timed from then).
    pub fn wait_for_traffic(&mut self, timeout: Duration) -> Instant {
        let t0 = Instant::now();
        loop {
            let text = std::fs::read_to_string(&self.client_log).unwrap_or_default();
            if let Some(t_ms) = first_timeline_ms(&text) {
                let now = Instant::now();
                return now
                    .checked_sub(Duration::from_secs_f64(t_ms / 1e3))
                    .unwrap_or(now);
            }
            if self.client_exited() {
                return Instant::now();
            }
            if t0.elapsed() >= timeout {
                tracing::warn!(
                    log = %self.client_log.display(),
                    waited = ?timeout,
                    "the client printed no timeline sample; timing the schedule from now"
                );
                return Instant::now();
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits for both processes (killing what overstays) and reads their reports.
    pub fn finish(mut self) -> Result<PairOutcome, AppRunError> {
        let client_exit = wait_or_kill(&mut self.client, self.client_timeout, self.started);
        // The server exits when the client's connection closes; give it a moment.
        let _ = wait_or_kill(&mut self.server, Duration::from_secs(5), Instant::now());
        let (client, client_raw) = read_report(&self.client_json).map_err(|e| match e {
            // No report: say how the client ended and what it said last.
            AppRunError::Report { path, detail } => AppRunError::Report {
                path,
                detail: format!(
                    "{detail}; the client {}{} (see {})",
                    client_exit.map_or("was killed after its timeout".to_owned(), |s| format!(
                        "exited with {s}"
                    )),
                    last_words(&self.client_log),
                    self.client_log.display()
                ),
            },
            other => other,
        })?;
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

/// `t_ms` of the first timeline line in an application's output.
fn first_timeline_ms(output: &str) -> Option<f64> {
    output.lines().find_map(|line| {
        let rest = line.trim_start().strip_prefix("[timeline]")?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// The last line an application printed, as `: <line>`, for an error message.
fn last_words(log: &Path) -> String {
    std::fs::read_to_string(log)
        .ok()
        .and_then(|t| {
            t.lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map(|l| format!(": {}", l.trim()))
        })
        .unwrap_or_default()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_with_many_qps_is_given_longer_to_listen() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(listen_wait(&args(&["-s", "8192"])), Duration::from_secs(10));
        assert_eq!(
            listen_wait(&args(&["-q", "4096", "-t", "1"])),
            Duration::from_millis(10_000 + 5 * 4096)
        );
    }

    #[test]
    fn the_first_timeline_line_gives_the_traffic_start() {
        let out = " Number of qps   : 1\n [timeline]     100.3 ms      2.100 Gb/s  0.004 Mpps  completions 40  errors   0  state default\n [timeline]     200.1 ms ...\n";
        assert_eq!(first_timeline_ms(out), Some(100.3));
        assert_eq!(first_timeline_ms(" Waiting for the client\n"), None);
    }

    #[test]
    fn the_last_words_of_an_app_name_why_it_stopped() {
        let path =
            std::env::temp_dir().join(format!("railshift-lastwords-{}.log", std::process::id()));
        std::fs::write(
            &path,
            "usage ...\nshift_write_bw: -q/--qp 2000 is outside 1..=1024\n\n",
        )
        .unwrap();
        assert_eq!(
            last_words(&path),
            ": shift_write_bw: -q/--qp 2000 is outside 1..=1024"
        );
        std::fs::remove_file(&path).unwrap();
        assert_eq!(last_words(&path), "");
    }
}
