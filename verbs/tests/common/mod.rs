//! What the stock-binary tests share: finding the shim and the binaries, starting one side
//! of a pair with its environment, waiting for a side with a deadline, and running a
//! server and a client that must both exit 0.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One pair at a time: the machine is small and the softnic devices are busy threads.
pub static SERIAL: Mutex<()> = Mutex::new(());

/// How long one side may run before the case fails.
pub const DEADLINE: Duration = Duration::from_secs(90);

/// The shim cargo built beside the test binary (target/<profile>/deps/<test>-<hash>).
pub fn shim() -> PathBuf {
    let lib = std::env::current_exe()
        .expect("test binary path")
        .with_file_name("librailshift_verbs.so");
    assert!(lib.exists(), "{} was not built", lib.display());
    lib
}

/// `/usr/bin/<name>`, if installed.
pub fn binary(name: &str) -> Option<PathBuf> {
    let path = Path::new("/usr/bin").join(name);
    path.exists().then_some(path)
}

/// Whether something listens on TCP `port` (read from /proc, so no connection is made: a
/// perftest server takes exactly one).
pub fn listening(port: u16) -> bool {
    let needle = format!(":{port:04X} 00000000:0000 0A");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f)
            .map(|s| s.lines().any(|l| l.contains(&needle)))
            .unwrap_or(false)
    })
}

/// Starts `bin -d rs0 -p <port> args [peer]` with the shim preloaded and `env` set.
pub fn side(
    bin: &Path,
    env: &[(&str, &dyn AsRef<std::ffi::OsStr>)],
    port: u16,
    args: &[&str],
    peer: Option<&str>,
) -> Child {
    let mut cmd = Command::new(bin);
    cmd.env("LD_PRELOAD", shim());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.args(["-d", "rs0", "-p", &port.to_string()])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(peer) = peer {
        cmd.arg(peer);
    }
    cmd.spawn().expect("spawn a stock binary")
}

/// Waits for `child`, killing it and failing the case after [`DEADLINE`].
pub fn finish(child: Child, what: &str) -> Output {
    let pid = child.id();
    let start = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(DEADLINE) {
        Ok(out) => out.expect("wait for a stock binary"),
        Err(_) => {
            // SAFETY: plain syscall on the child we spawned.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!("{what} did not finish in {:?}", start.elapsed());
        }
    }
}

/// A side's exit status and output, for a failure message.
pub fn show(o: &Output) -> String {
    format!(
        "status {}\n--- stdout\n{}\n--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Starts the server, waits (up to 20 s) for it to listen on `port`, starts the client,
/// waits for both. Returns (server, client) outputs; see [`assert_both_ok`].
pub fn run_pair(
    what: &str,
    port: u16,
    server: impl FnOnce() -> Child,
    client: impl FnOnce() -> Child,
) -> (Output, Output) {
    let server = server();
    let start = Instant::now();
    while !listening(port) && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let client = client();
    let c = finish(client, &format!("{what} client"));
    let s = finish(server, &format!("{what} server"));
    (s, c)
}

/// Fails the case unless both sides exited 0, showing both.
pub fn assert_both_ok(what: &str, server: &Output, client: &Output) {
    assert!(
        client.status.success() && server.status.success(),
        "{what}\n=== client {}\n=== server {}",
        show(client),
        show(server)
    );
}
