//! Stock perftest through the shim against railshift's own tools, side by side in one run, on
//! the same loopback device pair: 8-byte `ib_write_lat` against `shift_write_lat` (typical
//! latency), 64 KiB `ib_write_bw` against `shift_write_bw` (average bandwidth). Prints each
//! round and the ratio of the medians.
//!
//! ```text
//! cargo build --release -p apps --bin shift_write_lat --bin shift_write_bw
//! cargo bench -p verbs --bench stock_vs_shift
//! ```
//!
//! Like for like: both tools get the same flags (size, iterations, inline size; for the
//! bandwidth, the same 128 requests in flight and a completion every 64), and both run their
//! devices with manual progress: the shim in its default `poll` progress (the program's
//! `ibv_poll_cq` runs the device, the helper thread while it does not poll), the shift tools
//! with `--poll busy` (and `--no-failover` for `shift_write_bw`, which otherwise runs softnic
//! engine threads). Needs perftest
//! (`/usr/bin/ib_write_lat`, `/usr/bin/ib_write_bw`) and the release `shift_*` binaries in
//! target/release; says what is missing otherwise.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Alternating rounds of each side.
const ROUNDS: usize = 3;

struct Case {
    what: &'static str,
    stock: &'static str,
    shift: &'static str,
    /// Given to both tools.
    args: &'static [&'static str],
    /// Given to the shift tool only: how it runs its device.
    shift_progress: &'static [&'static str],
    /// Which column of the last table row is the figure (0-based), and whether higher is
    /// better.
    column: usize,
    higher_is_better: bool,
    unit: &'static str,
}

const CASES: &[Case] = &[
    Case {
        what: "8-byte RDMA WRITE latency, typical",
        stock: "ib_write_lat",
        shift: "shift_write_lat",
        args: &["-s", "8", "-n", "5000", "-I", "64"],
        shift_progress: &["--poll", "busy"],
        column: 4,
        higher_is_better: false,
        unit: "us",
    },
    Case {
        what: "64 KiB RDMA WRITE bandwidth, average",
        stock: "ib_write_bw",
        shift: "shift_write_bw",
        args: &[
            "-s", "65536", "-n", "5000", "-t", "128", "-Q", "64", "-I", "0",
        ],
        shift_progress: &["--poll", "busy", "--no-failover"],
        column: 3,
        higher_is_better: true,
        unit: "MB/s",
    },
];

fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("bench binary path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf()
}

fn listening(port: u16) -> bool {
    let needle = format!(":{port:04X} 00000000:0000 0A");
    std::fs::read_to_string("/proc/net/tcp")
        .map(|s| s.lines().any(|l| l.contains(&needle)))
        .unwrap_or(false)
}

/// The figure from the last row of a perftest-style table.
fn figure(stdout: &str, column: usize) -> Option<f64> {
    stdout
        .lines()
        .rfind(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|w| w.parse::<u64>().is_ok())
        })?
        .split_whitespace()
        .nth(column)?
        .parse()
        .ok()
}

/// One server/client pair; the client's figure.
fn run_pair(
    bin: &Path,
    shim: Option<&Path>,
    args: &[&str],
    shift_progress: &[&str],
    port: u16,
    column: usize,
) -> f64 {
    let side = |addr: &str, peer: Option<&str>| {
        let mut cmd = Command::new(bin);
        match shim {
            Some(lib) => {
                cmd.env("LD_PRELOAD", lib)
                    .env("RAILSHIFT_DEVICES", format!("rs0=soft:lo@{addr}"))
                    .args(["-d", "rs0"]);
            }
            None => {
                cmd.args(["-d", &format!("soft:lo@{addr}")])
                    .args(shift_progress);
            }
        }
        cmd.args(["-p", &port.to_string()])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(p) = peer {
            cmd.arg(p);
        }
        cmd.spawn().expect("spawn")
    };
    let server = side("127.0.60.1", None);
    let start = Instant::now();
    while !listening(port) && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let client = side("127.0.60.2", Some("127.0.0.1"));
    let c = client.wait_with_output().expect("client");
    let s = server.wait_with_output().expect("server");
    let out = String::from_utf8_lossy(&c.stdout).into_owned();
    assert!(
        c.status.success() && s.status.success(),
        "{} failed:\n{out}\n{}\n{}",
        bin.display(),
        String::from_utf8_lossy(&c.stderr),
        String::from_utf8_lossy(&s.stderr)
    );
    figure(&out, column).unwrap_or_else(|| panic!("no figure in:\n{out}"))
}

/// The one-minute load average, printed beside every figure (a loaded machine's figures
/// are not an idle one's).
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let dir = profile_dir();
    // The library cargo built with this benchmark lies beside it in deps/ (cargo does not
    // copy a bench build's cdylib up to target/release/).
    let shim = std::env::current_exe()
        .expect("bench binary path")
        .with_file_name("librailshift_verbs.so");
    let mut missing = Vec::new();
    if !shim.exists() {
        missing.push(shim.display().to_string());
    }
    for case in CASES {
        for p in [Path::new("/usr/bin").join(case.stock), dir.join(case.shift)] {
            if !p.exists() {
                missing.push(p.display().to_string());
            }
        }
    }
    if !missing.is_empty() {
        eprintln!(
            "skipped: missing {} (cargo build --release -p apps --bin shift_write_lat --bin shift_write_bw; apt install perftest)",
            missing.join(", ")
        );
        return;
    }
    let mut port = 19500u16;
    for case in CASES {
        let (mut stock, mut shift) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            port += 1;
            let a = run_pair(
                &Path::new("/usr/bin").join(case.stock),
                Some(&shim),
                case.args,
                &[],
                port,
                case.column,
            );
            port += 1;
            let b = run_pair(
                &dir.join(case.shift),
                None,
                case.args,
                case.shift_progress,
                port,
                case.column,
            );
            println!(
                "{}: round {round}: {} via shim {a:.2} {u}, {} {b:.2} {u} (load {})",
                case.what,
                case.stock,
                case.shift,
                load(),
                u = case.unit
            );
            stock.push(a);
            shift.push(b);
        }
        let (a, b) = (median(&mut stock), median(&mut shift));
        let ratio = a / b;
        println!(
            "{}: median {} via shim {a:.2} {u}, {} {b:.2} {u}, ratio shim/shift {ratio:.3} ({}, load {})",
            case.what,
            case.stock,
            case.shift,
            if case.higher_is_better {
                "higher is better"
            } else {
                "lower is better"
            },
            load(),
            u = case.unit
        );
    }
}
