//! Running a tool pair as real processes on loopback: each side's softnic bound to its own
//! 127.77.x.y address, the out-of-band exchange on a port of its own, JSON reports in a
//! temporary directory.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A directory removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("railshift-apps-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A port and a pair of addresses that no other test of this process uses.
pub fn slot(test: u16) -> (u16, String, String) {
    let pid = (std::process::id() % 200) as u16;
    let port = 20000 + pid * 50 + test;
    let net = format!("127.77.{}", test);
    (port, format!("{net}.1"), format!("{net}.2"))
}

pub fn bin(tool: &str) -> PathBuf {
    match tool {
        "shift_write_bw" => env!("CARGO_BIN_EXE_shift_write_bw").into(),
        "shift_write_lat" => env!("CARGO_BIN_EXE_shift_write_lat").into(),
        "shift_send_bw" => env!("CARGO_BIN_EXE_shift_send_bw").into(),
        "shift_send_lat" => env!("CARGO_BIN_EXE_shift_send_lat").into(),
        "shift_read_bw" => env!("CARGO_BIN_EXE_shift_read_bw").into(),
        "shift_read_lat" => env!("CARGO_BIN_EXE_shift_read_lat").into(),
        "shift_atomic_bw" => env!("CARGO_BIN_EXE_shift_atomic_bw").into(),
        "shift_allreduce" => env!("CARGO_BIN_EXE_shift_allreduce").into(),
        "shift_rc_pingpong" => env!("CARGO_BIN_EXE_shift_rc_pingpong").into(),
        "shift_rc_ops" => env!("CARGO_BIN_EXE_shift_rc_ops").into(),
        other => panic!("unknown tool {other}"),
    }
}

/// Whether something listens on TCP `port` (from /proc/net/tcp, without connecting).
pub fn listening(port: u16) -> bool {
    let want = format!(":{port:04X}");
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .any(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            cols.len() > 3 && cols[1].ends_with(&want) && cols[3] == "0A"
        })
}

pub fn spawn(tool: &str, args: &[String]) -> Child {
    Command::new(bin(tool))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for `child` up to `limit`, killing it after.
pub fn wait(mut child: Child, limit: Duration) -> Output {
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > limit {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Takes `child`'s stdout and returns once a line containing `needle` was printed (or the
/// output ended, or `limit` passed: the caller's assertions say what was missing). A thread
/// keeps draining the pipe so the child never blocks on it; the lines read so far come back.
pub fn wait_for_line(child: &mut Child, needle: &str, limit: Duration) -> Vec<String> {
    wait_for_line_where(child, |line| line.contains(needle), limit)
}

/// As [`wait_for_line`], for the first line `found` accepts.
pub fn wait_for_line_where(
    child: &mut Child,
    found: impl Fn(&str) -> bool,
    limit: Duration,
) -> Vec<String> {
    use std::io::BufRead;
    let out = child.stdout.take().expect("stdout piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    let t0 = Instant::now();
    let mut seen = Vec::new();
    while let Some(left) = limit.checked_sub(t0.elapsed()) {
        match rx.recv_timeout(left) {
            Ok(line) => {
                let hit = found(&line);
                seen.push(line);
                if hit {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    seen
}

/// The outcome of a pair.
pub struct PairRun {
    pub server: Output,
    pub client: Output,
    pub server_json: serde_json::Value,
    pub client_json: serde_json::Value,
}

pub fn text(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs `tool` as a server and a client with `args` on both sides.
pub fn pair(tool: &str, test: u16, args: &[&str]) -> PairRun {
    let dir = TempDir::new(&format!("{tool}-{test}"));
    let (port, a_server, a_client) = slot(test);
    let common: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let mut sargs = common.clone();
    sargs.extend([
        "-d".into(),
        format!("soft:lo@{a_server}"),
        "-p".into(),
        port.to_string(),
        "--json".into(),
        dir.file("server.json").display().to_string(),
    ]);
    let server = spawn(tool, &sargs);
    let t0 = Instant::now();
    while !listening(port) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the server never listened"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut cargs = common;
    cargs.extend([
        "-d".into(),
        format!("soft:lo@{a_client}"),
        "-p".into(),
        port.to_string(),
        "--json".into(),
        dir.file("client.json").display().to_string(),
        "127.0.0.1".into(),
    ]);
    let client = wait(spawn(tool, &cargs), Duration::from_secs(60));
    let server = wait(server, Duration::from_secs(10));
    let read = |name: &str, o: &Output| -> serde_json::Value {
        let t = std::fs::read_to_string(dir.file(name))
            .unwrap_or_else(|e| panic!("{name}: {e}\n{}", text(o)));
        serde_json::from_str(&t).unwrap()
    };
    PairRun {
        server_json: read("server.json", &server),
        client_json: read("client.json", &client),
        server,
        client,
    }
}
