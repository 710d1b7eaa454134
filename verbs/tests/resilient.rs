//! Stock verbs binaries over resilient devices (`rs0=soft:lo@<a>+soft:lo@<b>`): every RC QP
//! is a pmd resilient QP whose backup side is set up through a real `redis-server` (the one
//! `tools/test` starts, named by `RAILSHIFT_REDIS_URL`, or a private one this test starts).
//! Each pair must exit 0, and each QP must say it became protected
//! (`RAILSHIFT_LOG=warn,railshift_verbs=info`); against a peer without a backup the QP must
//! still work and say once that it runs unprotected.
//!
//! Skips with a printed reason when `redis-server` or a stock binary is missing.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{assert_both_ok, binary, run_pair, shim, show, SERIAL};

/// The line a QP logs when its backup side is connected.
const PROTECTED: &str = ": protected (backup on soft:lo@";
/// The line a QP prints when its peer published no backup attributes.
const UNPROTECTED: &str = "running unprotected";

/// A redis-server for the rendezvous: `tools/test`'s, or one of this test's own (stopped
/// when this drops).
struct Redis {
    url: String,
    child: Option<Child>,
}

impl Drop for Redis {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn ping(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let mut buf = [0u8; 16];
    s.write_all(b"PING\r\n").is_ok()
        && s.read(&mut buf)
            .is_ok_and(|n| buf[..n].starts_with(b"+PONG"))
}

fn redis() -> Option<Redis> {
    if let Ok(url) = std::env::var("RAILSHIFT_REDIS_URL") {
        if !url.is_empty() {
            return Some(Redis { url, child: None });
        }
    }
    let Some(bin) = binary("redis-server") else {
        eprintln!("skipped: /usr/bin/redis-server is missing and RAILSHIFT_REDIS_URL is not set");
        return None;
    };
    for _ in 0..8 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut child = Command::new(&bin)
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--dir", "/tmp"])
            .args(["--logfile", "", "--loglevel", "warning"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            if ping(port) {
                return Some(Redis {
                    url: format!("redis://127.0.0.1:{port}/"),
                    child: Some(child),
                });
            }
            if child.try_wait().ok().flatten().is_some() {
                break; // the port was taken: another one
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("could not start a private redis-server");
}

/// The job's secret, in a file of mode 600 (as `RAILSHIFT_RENDEZVOUS_KEY_FILE` wants).
fn key_file(test: &str) -> PathBuf {
    use std::os::unix::fs::OpenOptionsExt;
    let path =
        std::env::temp_dir().join(format!("railshift-verbs-{}-{test}.key", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .expect("write the key file");
    f.write_all(b"railshift verbs test job secret!").unwrap();
    path
}

struct Job<'a> {
    redis: &'a Redis,
    key: PathBuf,
    prefix: String,
    /// `RAILSHIFT_MANAGEMENT_ADDR` of the server and of the client (`None`: unset).
    management: [Option<&'a str>; 2],
    /// The server's `RAILSHIFT_FAULT_FIFO` (`None`: unset).
    fault_fifo: Option<PathBuf>,
}

impl Job<'_> {
    fn side(
        &self,
        bin: &Path,
        device: &str,
        port: u16,
        args: &[&str],
        peer: Option<&str>,
    ) -> Child {
        let devices = format!("rs0={device}");
        // The server is the side without a peer to connect to.
        let management = self.management[usize::from(peer.is_some())].unwrap_or("");
        let fault_fifo = match (&self.fault_fifo, peer) {
            (Some(path), None) => path.clone(),
            _ => PathBuf::new(),
        };
        common::side(
            bin,
            &[
                ("RAILSHIFT_DEVICES", &devices),
                ("RAILSHIFT_RENDEZVOUS", &self.redis.url),
                ("RAILSHIFT_RENDEZVOUS_KEY_FILE", &self.key),
                ("RAILSHIFT_RENDEZVOUS_PREFIX", &self.prefix),
                ("RAILSHIFT_PROTECT_WAIT_MS", &"1000"),
                ("RAILSHIFT_LOG", &"warn,railshift_verbs=info"),
                ("RAILSHIFT_MANAGEMENT_ADDR", &management),
                ("RAILSHIFT_FAULT_FIFO", &fault_fifo),
            ],
            port,
            args,
            peer,
        )
    }
}

/// Runs `tool args` with the server on `server_dev` and the client on `client_dev`; both
/// must exit 0. Returns (server, client) outputs, or `None` when something is missing.
fn pair(
    tool: &str,
    args: &[&str],
    net: u8,
    server_dev: &str,
    client_dev: &str,
) -> Option<(Output, Output)> {
    pair_with(tool, args, net, server_dev, client_dev, [None, None])
}

/// As [`pair`], the server's and the client's `RAILSHIFT_MANAGEMENT_ADDR` set as given.
fn pair_with(
    tool: &str,
    args: &[&str],
    net: u8,
    server_dev: &str,
    client_dev: &str,
    management: [Option<&str>; 2],
) -> Option<(Output, Output)> {
    let Some(bin) = binary(tool) else {
        eprintln!("skipped: /usr/bin/{tool} is missing (install perftest and ibverbs-utils)");
        return None;
    };
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let redis = redis()?;
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let job = Job {
        redis: &redis,
        key: key_file(&format!("{tool}-{net}")),
        prefix: format!("railshift-verbs-test:{}:{nanos}", std::process::id()),
        management,
        fault_fifo: None,
    };
    let port = 19100 + u16::from(net);
    let what = format!("{tool} {args:?}");
    let (s, c) = run_pair(
        &what,
        port,
        || job.side(&bin, server_dev, port, args, None),
        || job.side(&bin, client_dev, port, args, Some("127.0.0.1")),
    );
    let _ = std::fs::remove_file(&job.key);
    assert_both_ok(&what, &s, &c);
    Some((s, c))
}

fn resilient(net: u8, host: u8) -> String {
    format!("soft:lo@127.0.{net}.{host}+soft:lo@127.1.{net}.{host}")
}

/// Both sides resilient: exit 0, and every QP of each side says it became protected.
fn protected_pair(tool: &str, args: &[&str], net: u8, qps: usize) {
    let Some((s, c)) = pair(tool, args, net, &resilient(net, 1), &resilient(net, 2)) else {
        return;
    };
    for (side, o) in [("server", &s), ("client", &c)] {
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(
            err.matches(PROTECTED).count(),
            qps,
            "{tool} {args:?}: the {side}'s QPs did not all become protected\n{}",
            show(o)
        );
        assert!(!err.contains(UNPROTECTED), "{}", show(o));
    }
}

#[test]
fn ib_write_bw_runs_protected() {
    protected_pair("ib_write_bw", &["-D", "3"], 50, 1);
}

#[test]
fn ib_send_bw_on_two_qps_runs_protected() {
    // perftest's SEND test gives each QP separate send and receive CQs.
    protected_pair("ib_send_bw", &["-D", "3", "-q", "2"], 51, 2);
}

#[test]
fn ibv_rc_pingpong_checks_its_data_protected() {
    protected_pair(
        "ibv_rc_pingpong",
        &["-g", "0", "-n", "5000", "--chk"],
        52,
        1,
    );
}

#[test]
fn ibv_rc_pingpong_with_completion_events_protected() {
    protected_pair(
        "ibv_rc_pingpong",
        &["-g", "0", "-n", "3000", "-e", "--chk"],
        55,
        1,
    );
}

/// The protected lines of a side's stderr.
fn protected_lines(o: &Output) -> Vec<String> {
    String::from_utf8_lossy(&o.stderr)
        .lines()
        .filter(|l| l.contains(PROTECTED))
        .map(str::to_owned)
        .collect()
}

#[test]
fn with_a_management_address_on_both_sides_each_qp_has_the_management_channel() {
    let Some((s, c)) = pair_with(
        "ibv_rc_pingpong",
        &["-g", "0", "-n", "2000", "--chk"],
        58,
        &resilient(58, 1),
        &resilient(58, 2),
        [Some("127.0.58.1"), Some("127.0.58.2")],
    ) else {
        return;
    };
    // Each side's channel goes to the other side's address: the endpoint each published.
    for (side, o, peer) in [("server", &s, "127.0.58.2:"), ("client", &c, "127.0.58.1:")] {
        let lines = protected_lines(o);
        assert_eq!(lines.len(), 1, "the {side}\n{}", show(o));
        assert!(
            lines[0].contains(&format!("; management channel to {peer}")),
            "the {side}: {}\n{}",
            lines[0],
            show(o)
        );
    }
}

#[test]
fn with_a_management_address_on_one_side_only_no_qp_has_the_management_channel() {
    let Some((s, c)) = pair_with(
        "ibv_rc_pingpong",
        &["-g", "0", "-n", "2000", "--chk"],
        59,
        &resilient(59, 1),
        &resilient(59, 2),
        [Some("127.0.59.1"), None],
    ) else {
        return;
    };
    for (side, o) in [("server", &s), ("client", &c)] {
        let lines = protected_lines(o);
        assert_eq!(lines.len(), 1, "the {side}\n{}", show(o));
        assert!(
            lines[0].contains("; no management channel)"),
            "the {side}: {}",
            lines[0]
        );
    }
}

#[test]
fn a_management_address_not_of_this_host_is_an_error_naming_it() {
    let Some(bin) = binary("ibv_devinfo") else {
        eprintln!("skipped: /usr/bin/ibv_devinfo is missing (install ibverbs-utils)");
        return;
    };
    let key = key_file("mgmt-bad");
    for (value, says) in [
        // Not an address: the configuration is refused, no railshift device presented.
        (
            "host-b",
            "RAILSHIFT_MANAGEMENT_ADDR=`host-b`: expected this host's IP address",
        ),
        // An address, but not this host's (TEST-NET-3): the device does not open.
        (
            "203.0.113.7",
            "RAILSHIFT_MANAGEMENT_ADDR=203.0.113.7: cannot bind a UDP socket on it",
        ),
    ] {
        let out = Command::new(&bin)
            .args(["-d", "rs0"])
            .env("LD_PRELOAD", shim())
            .env(
                "RAILSHIFT_DEVICES",
                "rs0=soft:lo@127.0.56.1+soft:lo@127.1.56.1",
            )
            .env("RAILSHIFT_RENDEZVOUS", "redis://127.0.0.1:1/")
            .env("RAILSHIFT_RENDEZVOUS_KEY_FILE", &key)
            .env("RAILSHIFT_MANAGEMENT_ADDR", value)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{value}: {}", show(&out));
        assert_eq!(err.matches(says).count(), 1, "{value}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let _ = std::fs::remove_file(&key);
}

#[test]
fn a_peer_without_railshift_failover_runs_unprotected_and_says_so_once() {
    let Some((s, c)) = pair(
        "ibv_rc_pingpong",
        &["-g", "0", "-n", "2000", "--chk"],
        53,
        "soft:lo@127.0.53.1",
        &resilient(53, 2),
    ) else {
        return;
    };
    let err = String::from_utf8_lossy(&c.stderr);
    assert_eq!(err.matches(UNPROTECTED).count(), 1, "{}", show(&c));
    assert!(!err.contains(PROTECTED), "{}", show(&c));
    assert!(
        !String::from_utf8_lossy(&s.stderr).contains(UNPROTECTED),
        "{}",
        show(&s)
    );
}

#[test]
fn a_backup_without_a_rendezvous_is_an_error_naming_it() {
    let Some(bin) = binary("ibv_devinfo") else {
        eprintln!("skipped: /usr/bin/ibv_devinfo is missing (install ibverbs-utils)");
        return;
    };
    let out = Command::new(bin)
        .env("LD_PRELOAD", shim())
        .env(
            "RAILSHIFT_DEVICES",
            "rs0=soft:lo@127.0.54.1+soft:lo@127.1.54.1",
        )
        .env_remove("RAILSHIFT_RENDEZVOUS")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`rs0` has a backup device, which needs RAILSHIFT_RENDEZVOUS"),
        "{err}"
    );
}

#[test]
fn ibv_srq_pingpong_is_refused_on_a_device_with_a_backup() {
    let Some(bin) = binary("ibv_srq_pingpong") else {
        eprintln!("skipped: /usr/bin/ibv_srq_pingpong is missing (install ibverbs-utils)");
        return;
    };
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(redis) = redis() else {
        return;
    };
    let job = Job {
        redis: &redis,
        key: key_file("srq-57"),
        prefix: format!("railshift-verbs-test:{}:srq", std::process::id()),
        management: [None, None],
        fault_fifo: None,
    };
    // The server alone: it fails at ibv_create_srq, before it listens.
    let server = job.side(&bin, &resilient(57, 1), 19157, &["-g", "0"], None);
    let out = common::finish(server, "ibv_srq_pingpong server on a resilient device");
    let _ = std::fs::remove_file(&job.key);
    assert!(!out.status.success(), "{}", show(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ibv_create_srq refused: shared receive queues on a device with a backup")
            && err.contains("Couldn't create SRQ"),
        "{}",
        show(&out)
    );
}

/// How long a side may go on after its peer exited.
const PEER_GONE_GRACE: Duration = Duration::from_secs(15);

/// Waits up to `grace` for `child`, then kills it (its status then says so: killed by a
/// signal). Its output is read meanwhile, so a chatty child never blocks on a full pipe.
fn finish_within(child: Child, grace: Duration) -> Output {
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = rx.recv_timeout(grace).or_else(|_| {
        // SAFETY: plain syscall on the child we spawned, which has not been reaped yet.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        rx.recv()
    });
    out.expect("the waiting thread")
        .expect("wait for a stock binary")
}

/// Once `protected` says the server's QP became protected, lets the run go on for `after`,
/// then writes `commands` into the FIFO at `path` (the server made it at its device open) in
/// one write. Nothing is written if the server never says so.
fn inject_when_protected(
    protected: std::sync::mpsc::Receiver<()>,
    path: PathBuf,
    after: Duration,
    commands: String,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        if protected.recv_timeout(Duration::from_secs(60)).is_err() {
            return;
        }
        std::thread::sleep(after);
        use std::os::unix::fs::OpenOptionsExt;
        // Non-blocking: a server gone by now fails the case instead of hanging it.
        let mut fifo = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .expect("open the fault FIFO");
        fifo.write_all(commands.as_bytes())
            .expect("write the fault commands");
    })
}

/// Reads `child`'s stderr as it comes, telling `protected` when a line says its QP became
/// protected; returns the whole stderr when the child closes it.
fn watch_stderr(
    child: &mut Child,
    protected: std::sync::mpsc::Sender<()>,
) -> std::thread::JoinHandle<Vec<u8>> {
    let stderr = child.stderr.take().expect("a piped stderr");
    std::thread::spawn(move || {
        use std::io::BufRead;
        let mut all = Vec::new();
        for line in std::io::BufReader::new(stderr).split(b'\n') {
            let Ok(line) = line else { break };
            if String::from_utf8_lossy(&line).contains(PROTECTED) {
                let _ = protected.send(());
            }
            all.extend_from_slice(&line);
            all.push(b'\n');
        }
        all
    })
}

/// `ibv_rc_pingpong -n 60000 --chk` between two resilient devices; 200 ms after the server's
/// QP became protected, both devices of the server's host fail every QP, the backup first and
/// the default right after, through the shim's fault channel (`RAILSHIFT_FAULT_FIFO`): the case the
/// management channel exists for (`docs/failover.md` 5c, 5f), both control channels lost
/// before either is repaired, the devices and their links up again at once. Returns
/// (server, client) outputs; `None` when something is missing.
fn both_devices_of_the_servers_host_fail(net: u8, management: bool) -> Option<(Output, Output)> {
    both_devices_of_the_servers_host(net, management, "qps-failed")
}

/// As [`both_devices_of_the_servers_host_fail`], each device taking the fault command `fault`
/// (`qps-failed`, `device-dead`).
fn both_devices_of_the_servers_host(
    net: u8,
    management: bool,
    fault: &str,
) -> Option<(Output, Output)> {
    let tool = "ibv_rc_pingpong";
    let Some(bin) = binary(tool) else {
        eprintln!("skipped: /usr/bin/{tool} is missing (install ibverbs-utils)");
        return None;
    };
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let redis = redis()?;
    let fifo = std::env::temp_dir().join(format!(
        "railshift-verbs-{}-faults-{net}.fifo",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&fifo);
    let (server_mgmt, client_mgmt) = (format!("127.0.{net}.1"), format!("127.0.{net}.2"));
    let job = Job {
        redis: &redis,
        key: key_file(&format!("faults-{net}")),
        prefix: format!("railshift-verbs-test:{}:faults-{net}", std::process::id()),
        management: if management {
            [Some(server_mgmt.as_str()), Some(client_mgmt.as_str())]
        } else {
            [None, None]
        },
        fault_fifo: Some(fifo.clone()),
    };
    let args = ["-g", "0", "-n", "60000", "--chk"];
    let port = 19100 + u16::from(net);
    let what = format!("{tool} {args:?}, both devices of the server's host: {fault}");
    let mut server = job.side(&bin, &resilient(net, 1), port, &args, None);
    // The faults 200 ms after the server's QP became protected: however fast the run goes,
    // they hit a protected connection with traffic on it.
    let (protected_tx, protected_rx) = std::sync::mpsc::channel();
    let server_stderr = watch_stderr(&mut server, protected_tx);
    let injector = inject_when_protected(
        protected_rx,
        fifo.clone(),
        Duration::from_millis(200),
        format!("{fault} soft:lo@127.1.{net}.1\n{fault} soft:lo@127.0.{net}.1\n"),
    );
    let start = Instant::now();
    while !common::listening(port) && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let client = job.side(&bin, &resilient(net, 2), port, &args, Some("127.0.0.1"));
    let mut s = common::finish(server, &format!("{what}: server"));
    s.stderr = server_stderr.join().expect("the server's stderr");
    // A client whose server ended waits for its next message for ever (nothing it posted
    // is outstanding, so its QP never learns): it gets a while, then is killed.
    let c = finish_within(client, PEER_GONE_GRACE);
    injector.join().expect("the fault injector");
    let _ = std::fs::remove_file(&job.key);
    let _ = std::fs::remove_file(&fifo);
    // The faults must have hit a protected connection, or the case is another one.
    for (side, o) in [("server", &s), ("client", &c)] {
        assert_eq!(protected_lines(o).len(), 1, "the {side}\n{}", show(o));
    }
    // Both commands applied (an error would name the command on stderr).
    assert!(
        !String::from_utf8_lossy(&s.stderr).contains("fault channel"),
        "{}",
        show(&s)
    );
    Some((s, c))
}

#[test]
fn over_the_management_channel_both_devices_of_one_host_failing_keep_the_connection() {
    let Some((s, c)) = both_devices_of_the_servers_host_fail(60, true) else {
        return;
    };
    assert_eq!(
        String::from_utf8_lossy(&s.stderr)
            .matches("every QP moved to ERR (injected)")
            .count(),
        2,
        "both devices' faults applied\n{}",
        show(&s)
    );
    assert_both_ok(
        "both devices of the server's host failing, with the management channel",
        &s,
        &c,
    );
    for o in [&s, &c] {
        assert!(
            !String::from_utf8_lossy(&o.stderr).contains("connection failed"),
            "{}",
            show(o)
        );
    }
}

#[test]
fn without_the_management_channel_both_devices_of_one_host_failing_end_the_connection() {
    let Some((s, c)) = both_devices_of_the_servers_host_fail(61, false) else {
        return;
    };
    assert!(
        !(s.status.success() && c.status.success()),
        "both sides exited 0 without the management channel\n=== client {}\n=== server {}",
        show(&c),
        show(&s)
    );
    // As the all-targets soak lost it: no channel left to agree on a failback.
    assert!(
        String::from_utf8_lossy(&s.stderr).contains("cause=\"backup-unavailable\""),
        "{}",
        show(&s)
    );
}

/// The line a side's pmd logs when its connection fails, and its cause.
fn connection_failed(o: &Output) -> Option<String> {
    String::from_utf8_lossy(&o.stderr)
        .lines()
        .find(|l| l.contains("failover: connection failed; errors go to the application"))
        .map(str::to_owned)
}

/// Both devices of the server's host die 200 ms after its QP became protected: the server's connection ends once no path
/// answered for the outage tolerance (exit 1, the tool's completion error). Returns the
/// server's `connection failed` line and the client (its line printed, for the measurement in
/// `docs/measurements.md`).
fn the_servers_devices_die(net: u8, management: bool) -> Option<(String, Output)> {
    let (s, c) = both_devices_of_the_servers_host(net, management, "device-dead")?;
    let server = connection_failed(&s).unwrap_or_else(|| panic!("{}", show(&s)));
    assert!(server.contains("cause=\"outage-tolerance\""), "{server}");
    assert_eq!(s.status.code(), Some(1), "{}", show(&s));
    eprintln!(
        "management {management}\n  server: {server}\n  client: {:?}",
        connection_failed(&c)
    );
    Some((server, c))
}

#[test]
fn over_the_management_channel_the_peer_of_an_end_that_failed_ends_with_peer_aborted() {
    let Some((_, c)) = the_servers_devices_die(62, true) else {
        return;
    };
    // The server's Abort came over the management network: the client ends at once, told,
    // whether or not it had work outstanding, and fails its work (exit 1, not killed).
    let client = connection_failed(&c).unwrap_or_else(|| panic!("{}", show(&c)));
    assert!(client.contains("cause=\"peer-aborted\""), "{client}");
    assert_eq!(c.status.code(), Some(1), "{}", show(&c));
}

#[test]
fn without_the_management_channel_the_peer_of_an_end_that_failed_is_not_told() {
    let Some((_, c)) = the_servers_devices_die(63, false) else {
        return;
    };
    // Nothing could carry the server's Abort: a client with a message outstanding finds the
    // failure itself (mostly its round's handshake timing out, `handshake-timeout`; or its
    // own wait for a path); one waiting for the server's next message waits for ever (killed
    // after the grace). Never told.
    match connection_failed(&c) {
        Some(client) => assert!(!client.contains("peer-aborted"), "{client}"),
        None => assert_eq!(c.status.code(), None, "killed\n{}", show(&c)),
    }
}
