//! Stock verbs tools across a NIC cut: Debian's unmodified `ib_write_bw`, `ib_send_bw`,
//! `ib_read_bw` and `ibv_rc_pingpong` with `LD_PRELOAD=librailshift_verbs.so`, the server in
//! host B and the client in host A, each on a resilient device `rs0=soft:nic0+soft:nic1`
//! whose backup sides meet through a `redis-server` on the management switch. A target fails
//! mid-run and comes back. With failover each tool must exit 0 on both sides, and the QPs
//! must have failed over (the shim's `destroyed: ..., N failovers` lines); without it
//! (`rs0=soft:nic0`, no backup) the same tool must fail with its completion error, as on
//! hardware. `ib_atomic_bw` is the exception: atomics in flight are not retransmitted, so
//! with failover too it must fail with its completion error, after the pmd's refusal.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::chaos;
use crate::fail;
use crate::faults;
use crate::schedule::{LinkAction, Schedule, Step};
use crate::target::FailTarget;
use crate::topology::{HostInfo, Role, TestbedInfo};

/// A stock tool the run knows how to drive and judge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    /// perftest's `ib_write_bw -D <secs>`.
    WriteBw,
    /// perftest's `ib_send_bw -D <secs>`.
    SendBw,
    /// perftest's `ib_read_bw -D <secs>`.
    ReadBw,
    /// rdma-core's `ibv_rc_pingpong -g 0 --chk -n <iters>`.
    RcPingpong,
    /// perftest's `ib_atomic_bw -D <secs>`: must fail across a cut, failover or not.
    AtomicBw,
}

impl Tool {
    /// Every tool, in the order a run takes them.
    pub const ALL: [Tool; 5] = [
        Tool::WriteBw,
        Tool::SendBw,
        Tool::ReadBw,
        Tool::RcPingpong,
        Tool::AtomicBw,
    ];

    /// The binary's name.
    pub fn binary(self) -> &'static str {
        match self {
            Tool::WriteBw => "ib_write_bw",
            Tool::SendBw => "ib_send_bw",
            Tool::ReadBw => "ib_read_bw",
            Tool::RcPingpong => "ibv_rc_pingpong",
            Tool::AtomicBw => "ib_atomic_bw",
        }
    }

    /// Parses a binary's name, or a comma-separated list of them (`all`: every tool).
    pub fn parse_list(text: &str) -> Result<Vec<Tool>, String> {
        if text == "all" {
            return Ok(Tool::ALL.to_vec());
        }
        text.split(',')
            .map(|name| {
                Tool::ALL
                    .into_iter()
                    .find(|t| t.binary() == name.trim())
                    .ok_or_else(|| {
                        format!(
                            "unknown stock tool {name:?}: use ib_write_bw, ib_send_bw, ib_read_bw, ibv_rc_pingpong, ib_atomic_bw or all"
                        )
                    })
            })
            .collect()
    }

    fn args(self, o: &StockOptions) -> Vec<String> {
        let mut args = vec!["-d".to_owned(), "rs0".to_owned()];
        match self {
            Tool::RcPingpong => args.extend([
                "-g".to_owned(),
                "0".to_owned(),
                "--chk".to_owned(),
                "-n".to_owned(),
                o.iters.to_string(),
            ]),
            _ => args.extend(["-D".to_owned(), o.duration.as_secs().max(1).to_string()]),
        }
        args
    }

    /// What the tool prints when a completion fails (perftest: "Completion with error";
    /// ibv_rc_pingpong: "Failed status <status> (<n>) for wr_id <id>").
    fn completion_error(self, log: &str) -> bool {
        match self {
            Tool::RcPingpong => log.contains("Failed status"),
            _ => log.contains("Completion with error") || log.contains("Failed status"),
        }
    }
}

/// Both rails failing at random under a stock tool, as the `chaos` scenario draws them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StockChaos {
    /// The seed of the draw.
    pub seed: u64,
    /// The longest time both rails may be down together.
    pub max_both_down: Duration,
}

/// How a stock run goes.
#[derive(Debug, Clone)]
pub struct StockOptions {
    /// The tools, one pair after the other.
    pub tools: Vec<Tool>,
    /// What fails (one cut; ignored under `chaos`).
    pub target: FailTarget,
    /// When it fails, after the client started (under `chaos`: when failures start).
    pub at: Duration,
    /// How long it stays down (one cut).
    pub down: Duration,
    /// Instead of one cut, both rails fail at random from `at` until 3 s before the
    /// perftest tools' `-D` ends (`ibv_rc_pingpong`: until `-D` too, or until it exits).
    pub chaos: Option<StockChaos>,
    /// The perftest tools' `-D`.
    pub duration: Duration,
    /// `ibv_rc_pingpong`'s `-n`.
    pub iters: u64,
    /// Run each tool with failover (a backup device), without (no backup), or both.
    pub modes: Vec<bool>,
    /// `librailshift_verbs.so`.
    pub shim: PathBuf,
    /// Logs go here: `stock-<tool>-<failover|no-failover>-{client,server}.log`.
    pub out_dir: PathBuf,
    /// The failover hold-down.
    pub holddown: Duration,
    /// The first TCP port (each pair takes the next).
    pub port: u16,
    /// Give each side its host's management address (`RAILSHIFT_MANAGEMENT_ADDR`), so that
    /// its QPs agree over the management network when both control channels are lost.
    pub management: bool,
}

/// The outcome of one tool in one mode.
#[derive(Debug, Clone)]
pub struct StockOutcome {
    /// The tool.
    pub tool: Tool,
    /// With failover.
    pub failover: bool,
    /// The client's and server's exit codes (`None`: killed by a signal or the deadline).
    pub exits: [Option<i32>; 2],
    /// Failovers the client's and server's QPs counted (the shim's destroy lines).
    pub failovers: [u64; 2],
    /// Whether either side printed the tool's completion error.
    pub completion_error: bool,
    /// Link failures applied while the client ran.
    pub failures: usize,
    /// The client's log.
    pub client_log: PathBuf,
    /// Whether the outcome is what the mode expects.
    pub passed: bool,
    /// Why not, when it did not.
    pub why: String,
}

/// What the shim's `protected` line says of a QP without the third channel (one end had no
/// management address, or could not open an endpoint on it).
const NO_MANAGEMENT: &str = "; no management channel)";

/// What the pmd logs when a failover meets an atomic in flight (and fails the connection).
const ATOMIC_REFUSAL: &str = "an atomic was in flight";

/// How long one side may go on after the other exited (a stock tool whose peer failed may
/// wait for it for ever).
const PEER_GONE_GRACE: Duration = Duration::from_secs(10);

/// A `redis-server` on the management switch, stopped when this drops.
struct Redis {
    child: Child,
    url: String,
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn ping(ns: &str, addr: &str, port: u16, password: &str) -> bool {
    Command::new("ip")
        .args(["netns", "exec", ns, "redis-cli", "--no-auth-warning"])
        .args(["-h", addr, "-p", &port.to_string(), "-a", password, "ping"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("PONG"))
        .unwrap_or(false)
}

/// Starts a `redis-server` on the management switch. It listens on the management network,
/// not loopback, so (Redis's protected mode) it needs a password: a random one, in the URL.
fn start_redis(info: &TestbedInfo, port: u16) -> Result<Redis, String> {
    let (ns, addr) = (&info.mgmt.netns, &info.mgmt.addr);
    let password: String = random_bytes::<16>()?
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let child = Command::new("ip")
        .args(["netns", "exec", ns, "redis-server", "--bind", addr])
        .args(["--port", &port.to_string(), "--requirepass", &password])
        .args(["--save", "", "--appendonly", "no", "--dir", "/tmp"])
        .args(["--logfile", "", "--loglevel", "warning"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start redis-server in {ns}: {e} (install redis-server)"))?;
    let redis = Redis {
        child,
        url: format!("redis://:{password}@{addr}:{port}/"),
    };
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        if ping(ns, addr, port, &password) {
            return Ok(redis);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!(
        "redis-server in {ns} did not answer on {addr}:{port} within 10 s"
    ))
}

fn random_bytes<const N: usize>() -> Result<[u8; N], String> {
    let mut bytes = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .map_err(|e| format!("cannot read /dev/urandom: {e}"))?;
    Ok(bytes)
}

fn listening(ns: &str, port: u16) -> bool {
    Command::new("ip")
        .args(["netns", "exec", ns, "ss", "-Hltn"])
        .arg(format!("sport = :{port}"))
        .output()
        .map(|o| o.status.success() && !o.stdout.is_empty())
        .unwrap_or(false)
}

/// The environment of one side.
struct Side<'a> {
    o: &'a StockOptions,
    /// The rendezvous URL (`RAILSHIFT_RENDEZVOUS`).
    rendezvous: &'a str,
    key: &'a Path,
    prefix: String,
    failover: bool,
    /// The host whose devices the cut fails through its fault channel, and the channel's
    /// FIFO (`RAILSHIFT_FAULT_FIFO` of the side there; device targets only).
    fault_fifo: Option<(Role, PathBuf)>,
}

impl Side<'_> {
    /// The shim's environment for a side in `host`, as `VAR=value` words for `env`.
    fn env(&self, host: &HostInfo) -> Vec<String> {
        let mgmt_addr = &host.mgmt_addr;
        let device = if self.failover {
            "rs0=soft:nic0+soft:nic1"
        } else {
            "rs0=soft:nic0"
        };
        let mut env = vec![
            format!("LD_PRELOAD={}", self.o.shim.display()),
            format!("RAILSHIFT_DEVICES={device}"),
            format!("RAILSHIFT_RENDEZVOUS={}", self.rendezvous),
            format!("RAILSHIFT_RENDEZVOUS_KEY_FILE={}", self.key.display()),
            format!("RAILSHIFT_RENDEZVOUS_PREFIX={}", self.prefix),
            format!("RAILSHIFT_HOLDDOWN_MS={}", self.o.holddown.as_millis()),
            "RAILSHIFT_LOG=warn,railshift_verbs=info".to_string(),
        ];
        // The third channel (docs/failover.md 5f): the host's address on the management
        // network, the one the tools' own exchange and the rendezvous use.
        if self.failover && self.o.management {
            env.push(format!("RAILSHIFT_MANAGEMENT_ADDR={mgmt_addr}"));
        }
        // A device target (`responder-dev-qps-failed`, ...) is injected by the process that
        // owns the device: the shim reads the testbed's fault channel of its host.
        if let Some((_, fifo)) = self.fault_fifo.as_ref().filter(|(r, _)| *r == host.role) {
            env.push(format!("RAILSHIFT_FAULT_FIFO={}", fifo.display()));
        }
        env
    }

    fn spawn(
        &self,
        host: &HostInfo,
        tool: Tool,
        port: u16,
        peer: Option<&str>,
        log: &Path,
    ) -> Result<Child, String> {
        let ns = &host.netns;
        let out = std::fs::File::create(log)
            .map_err(|e| format!("cannot create {}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = Command::new("ip");
        // `env` sets the preload for the tool only, not for `ip`.
        cmd.args(["netns", "exec", ns, "env"])
            .args(self.env(host))
            .arg(format!("/usr/bin/{}", tool.binary()))
            .args(tool.args(self.o))
            .args(["-p", &port.to_string()]);
        if let Some(peer) = peer {
            cmd.arg(peer);
        }
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start {} in {ns}: {e}", tool.binary()))
    }
}

/// Failovers the QPs of a side counted, from the shim's `destroyed: <state>, N failovers`
/// lines.
fn failovers(log: &str) -> u64 {
    log.lines()
        .filter(|l| l.contains("railshift verbs:") && l.contains(" destroyed: "))
        .filter_map(|l| {
            let (_, rest) = l.split_once(" destroyed: ")?;
            let (_, rest) = rest.split_once(", ")?;
            rest.split_once(" failovers")?.0.parse::<u64>().ok()
        })
        .sum()
}

fn wait(child: &mut Child, until: Instant) -> Option<i32> {
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return status.code(),
            Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(50)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

fn key_file(out_dir: &Path) -> Result<PathBuf, String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = out_dir.join("stock-rendezvous.key");
    let _ = std::fs::remove_file(&path);
    let secret = random_bytes::<32>()?;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .and_then(|mut f| f.write_all(&secret))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(path)
}

/// How long before the end of `-D` a chaos schedule stops starting failures, so that the
/// tools' last seconds (and their final exchange of results) run on a steady path.
const CHAOS_QUIET_END: Duration = Duration::from_secs(3);

impl StockOptions {
    /// The link steps of one run, from the client's start: one cut, or a chaos schedule
    /// (the `chaos` scenario's default failure and up ranges).
    fn steps(&self) -> Vec<Step> {
        match self.chaos {
            None => Schedule::Once {
                target: self.target,
                at: self.at,
                duration: Some(self.down),
            }
            .steps(),
            Some(c) => Schedule::Chaos {
                start: self.at,
                until: self.duration.saturating_sub(CHAOS_QUIET_END).max(self.at),
                down: chaos::DEFAULT_DOWN,
                up: vec![chaos::DEFAULT_UP],
                max_both_down: c.max_both_down,
                seed: c.seed,
            }
            .steps(),
        }
    }

    /// What fails, in words.
    pub fn cut_words(&self) -> String {
        match self.chaos {
            None => format!("{} cut", self.target),
            Some(c) => format!(
                "both rails failing at random (seed {}, both down together at most {:?})",
                c.seed, c.max_both_down
            ),
        }
    }
}

/// Runs every tool of `o` in every mode, one pair at a time; `say` gets a line per event.
pub fn run(
    info: &TestbedInfo,
    o: &StockOptions,
    say: &mut dyn FnMut(&str),
) -> Result<Vec<StockOutcome>, String> {
    if !o.shim.is_file() {
        return Err(format!(
            "{} is missing (cargo build -p verbs)",
            o.shim.display()
        ));
    }
    for tool in &o.tools {
        let bin = Path::new("/usr/bin").join(tool.binary());
        if !bin.is_file() {
            return Err(format!(
                "{} is missing (install perftest and ibverbs-utils)",
                bin.display()
            ));
        }
    }
    std::fs::create_dir_all(&o.out_dir)
        .map_err(|e| format!("cannot create {}: {e}", o.out_dir.display()))?;
    let redis = start_redis(info, o.port)?;
    let key = key_file(&o.out_dir)?;
    let (a, b) = (info.host(Role::Initiator), info.host(Role::Responder));
    let mut outcomes = Vec::new();
    let mut port = o.port + 1;
    for &tool in &o.tools {
        for &failover in &o.modes {
            port += 1;
            let mode = if failover { "failover" } else { "no-failover" };
            let tag = format!("stock-{}-{mode}", tool.binary());
            let fault_fifo = match (o.chaos, o.target.fault_host()) {
                (None, Some(host)) => {
                    let path = faults::channel_path(info, host);
                    faults::create(&path).map_err(|e| e.to_string())?;
                    Some((host, path))
                }
                _ => None,
            };
            let side = Side {
                o,
                rendezvous: &redis.url,
                key: &key,
                prefix: format!("{}:{tag}:{}", info.prefix, fail::unix_ms_now() as u64),
                failover,
                fault_fifo,
            };
            let server_log = o.out_dir.join(format!("{tag}-server.log"));
            let client_log = o.out_dir.join(format!("{tag}-client.log"));
            let mut server = side.spawn(b, tool, port, None, &server_log)?;
            let t0 = Instant::now();
            while !listening(&b.netns, port) && t0.elapsed() < Duration::from_secs(20) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let mut client = side.spawn(a, tool, port, Some(&b.mgmt_addr), &client_log)?;
            let started = Instant::now();
            let steps = o.steps();
            let last_step = steps.last().map_or(Duration::ZERO, |s| s.at);
            say(&format!(
                "{} ({mode}): started; {}: {} link steps from {:?} to {:?}",
                tool.binary(),
                o.cut_words(),
                steps.len(),
                o.at,
                last_step
            ));
            // Steps run in order; once the client exited, only the recoveries still run, and
            // every link down is brought up before the next tool starts.
            let mut next = 0;
            let mut down: Vec<FailTarget> = Vec::new();
            let mut cut = false;
            let mut failures = 0;
            let deadline = started + last_step + Duration::from_secs(300);
            let mut client_exit = None;
            let mut server_exit: Option<(Option<i32>, Instant)> = None;
            loop {
                if let Ok(Some(status)) = client.try_wait() {
                    client_exit = Some(status.code());
                }
                if server_exit.is_none() {
                    if let Ok(Some(status)) = server.try_wait() {
                        server_exit = Some((status.code(), Instant::now()));
                    }
                }
                let now = started.elapsed();
                while let Some(step) = steps.get(next).filter(|s| s.at <= now) {
                    next += 1;
                    if step.action == LinkAction::Down && client_exit.is_some() {
                        continue;
                    }
                    if step.action == LinkAction::Up && !down.contains(&step.target) {
                        continue;
                    }
                    fail::apply(info, step.target, step.action)?;
                    match step.action {
                        LinkAction::Down => {
                            // A device fault has no up step: the driver repairs the QPs,
                            // and a dead device stays dead.
                            if step.target.has_up_step() {
                                down.push(step.target);
                            }
                            cut = true;
                            failures += 1;
                        }
                        LinkAction::Up => down.retain(|t| *t != step.target),
                    }
                    say(&format!(
                        "  t={:.1} s: {} {}",
                        now.as_secs_f64(),
                        step.target,
                        step.action
                    ));
                }
                let settled = down.is_empty();
                if client_exit.is_some() && settled {
                    break;
                }
                // A client whose server failed may wait for it for ever (ibv_rc_pingpong's
                // client polls for a reply that never comes): it gets 10 s.
                if let Some((_, at)) = server_exit {
                    if settled && at.elapsed() > PEER_GONE_GRACE {
                        break;
                    }
                }
                if Instant::now() > deadline {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            for target in down.drain(..) {
                fail::apply(info, target, LinkAction::Up)?;
            }
            let client_code = match client_exit {
                Some(code) => code,
                None => wait(&mut client, Instant::now()),
            };
            // Likewise a server whose client failed.
            let server_code = match server_exit {
                Some((code, _)) => code,
                None if client_code == Some(0) => {
                    wait(&mut server, Instant::now() + Duration::from_secs(60))
                }
                None => wait(&mut server, Instant::now() + PEER_GONE_GRACE),
            };
            let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
            let (clog, slog) = (read(&client_log), read(&server_log));
            let failed_over = [failovers(&clog), failovers(&slog)];
            let completion_error = tool.completion_error(&clog) || tool.completion_error(&slog);
            let exits = [client_code, server_code];
            let (passed, why) = if !cut {
                (
                    false,
                    format!("the client ended before {:?}: lengthen the run", o.at),
                )
            } else if failover && tool == Tool::AtomicBw {
                if exits == [Some(0), Some(0)] || !completion_error {
                    (
                        false,
                        format!("exits {exits:?}, completion error {completion_error}: expected the tool's completion error"),
                    )
                } else if !(clog.contains(ATOMIC_REFUSAL) || slog.contains(ATOMIC_REFUSAL)) {
                    (false, format!("no `{ATOMIC_REFUSAL}` in the logs"))
                } else {
                    (true, String::new())
                }
            } else if failover {
                if exits != [Some(0), Some(0)] {
                    (false, format!("exits {exits:?}, expected both 0"))
                } else if failed_over == [0, 0] {
                    (false, "no QP failed over".to_owned())
                } else if o.management
                    && (clog.contains(NO_MANAGEMENT) || slog.contains(NO_MANAGEMENT))
                {
                    (
                        false,
                        "a QP was protected without the management channel".to_owned(),
                    )
                } else {
                    (true, String::new())
                }
            } else if exits == [Some(0), Some(0)] {
                (false, "both exited 0 without failover".to_owned())
            } else if !completion_error {
                (
                    false,
                    format!("exits {exits:?} without the tool's completion error"),
                )
            } else {
                (true, String::new())
            };
            let outcome = StockOutcome {
                tool,
                failover,
                exits,
                failovers: failed_over,
                completion_error,
                failures,
                client_log: client_log.clone(),
                passed,
                why,
            };
            say(&summary(&outcome));
            outcomes.push(outcome);
            if let Some((_, fifo)) = &side.fault_fifo {
                faults::remove(fifo);
            }
            fail::wait_all_up(info, Duration::from_secs(10))?;
        }
    }
    let _ = std::fs::remove_file(&key);
    Ok(outcomes)
}

/// One line per outcome.
pub fn summary(o: &StockOutcome) -> String {
    format!(
        "{:<16} {:<11} link failures {:<3} client exit {:<4} server exit {:<4} failovers {}/{} completion error {:<3} {}",
        o.tool.binary(),
        if o.failover { "failover" } else { "no-failover" },
        o.failures,
        o.exits[0].map_or("-".to_owned(), |c| c.to_string()),
        o.exits[1].map_or("-".to_owned(), |c| c.to_string()),
        o.failovers[0],
        o.failovers[1],
        if o.completion_error { "yes" } else { "no" },
        if o.passed {
            "ok".to_owned()
        } else {
            format!("FAILED: {} (see {})", o.why, o.client_log.display())
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::TopologySpec;

    #[test]
    fn failovers_are_summed_from_the_destroy_lines() {
        let log = "x\n2026-11-27T23:28:38Z  INFO railshift verbs: rs0 QP 0x1 destroyed: Default, 2 failovers, 1 switch-backs, 9 WQEs retransmitted\n\
                   railshift verbs: rs0 QP 0x2 destroyed: Fallback, 1 failovers, 0 switch-backs, 0 WQEs retransmitted\n";
        assert_eq!(failovers(log), 3);
        assert_eq!(failovers("nothing"), 0);
    }

    fn options(chaos: Option<StockChaos>) -> StockOptions {
        StockOptions {
            tools: vec![Tool::RcPingpong],
            target: FailTarget::InitiatorNic { rail: 0 },
            at: Duration::from_secs(1),
            down: Duration::from_secs(2),
            chaos,
            duration: Duration::from_secs(20),
            iters: 1000,
            modes: vec![true],
            shim: PathBuf::new(),
            out_dir: PathBuf::new(),
            holddown: Duration::from_millis(100),
            port: 18600,
            management: true,
        }
    }

    #[test]
    fn each_side_gets_its_hosts_management_address_with_failover_unless_turned_off() {
        let mut o = options(None);
        let key = PathBuf::from("/tmp/job.key");
        let info = TestbedInfo::plan(&TopologySpec::default());
        let side = |o: &StockOptions, failover| {
            Side {
                o,
                rendezvous: "redis://:pw@198.18.100.254:18600/",
                key: &key,
                prefix: "p".to_string(),
                failover,
                fault_fifo: None,
            }
            .env(info.host(Role::Responder))
        };
        let mgmt = "RAILSHIFT_MANAGEMENT_ADDR=198.18.100.2".to_string();
        let on = side(&o, true);
        assert!(on.contains(&mgmt), "{on:?}");
        assert!(on.contains(&"RAILSHIFT_DEVICES=rs0=soft:nic0+soft:nic1".to_string()));
        // Without a backup the shim has no failover to agree on.
        let plain = side(&o, false);
        assert!(
            !plain
                .iter()
                .any(|v| v.starts_with("RAILSHIFT_MANAGEMENT_ADDR=")),
            "{plain:?}"
        );
        o.management = false;
        let off = side(&o, true);
        assert!(
            !off.iter()
                .any(|v| v.starts_with("RAILSHIFT_MANAGEMENT_ADDR=")),
            "{off:?}"
        );
    }

    #[test]
    fn a_device_target_gives_the_shim_of_its_host_the_fault_channel() {
        let o = options(None);
        let key = PathBuf::from("/tmp/job.key");
        let info = TestbedInfo::plan(&TopologySpec::default());
        let fifo = faults::channel_path(&info, Role::Responder);
        let side = Side {
            o: &o,
            rendezvous: "redis://:pw@198.18.100.254:18600/",
            key: &key,
            prefix: "p".to_string(),
            failover: true,
            fault_fifo: Some((Role::Responder, fifo.clone())),
        };
        let var = format!("RAILSHIFT_FAULT_FIFO={}", fifo.display());
        assert!(side.env(info.host(Role::Responder)).contains(&var));
        assert!(!side
            .env(info.host(Role::Initiator))
            .iter()
            .any(|v| v.starts_with("RAILSHIFT_FAULT_FIFO=")));
        // A device fault is one step: the driver repairs the QPs, a dead device stays dead.
        let qps_failed = StockOptions {
            target: FailTarget::DeviceQpsFailed {
                host: Role::Responder,
                rail: 0,
            },
            ..options(None)
        };
        assert_eq!(qps_failed.steps().len(), 1);
    }

    #[test]
    fn one_cut_is_two_steps_and_chaos_fails_both_rails_inside_its_window() {
        let once = options(None).steps();
        assert_eq!(once.len(), 2);
        assert_eq!(
            (once[0].at, once[0].action),
            (Duration::from_secs(1), LinkAction::Down)
        );
        assert_eq!(
            (once[1].at, once[1].action),
            (Duration::from_secs(3), LinkAction::Up)
        );
        let chaos = options(Some(StockChaos {
            seed: 1,
            max_both_down: Duration::from_secs(1),
        }))
        .steps();
        let downs: Vec<&Step> = chaos
            .iter()
            .filter(|s| s.action == LinkAction::Down)
            .collect();
        assert!(downs.len() >= 4, "{chaos:?}");
        assert_eq!(downs.len() * 2, chaos.len());
        for d in &downs {
            assert!(d.at >= Duration::from_secs(1) && d.at < Duration::from_secs(17));
        }
        for rail in 0..2 {
            assert!(downs.iter().any(|d| d.target.rail() == rail), "{chaos:?}");
        }
    }

    #[test]
    fn tools_parse_by_binary_name() {
        assert_eq!(
            Tool::parse_list("ib_write_bw,ibv_rc_pingpong").unwrap(),
            [Tool::WriteBw, Tool::RcPingpong]
        );
        assert_eq!(Tool::parse_list("all").unwrap().len(), 5);
        assert!(Tool::parse_list("ib_atomic_lat")
            .unwrap_err()
            .contains("ib_atomic_lat"));
    }
}
