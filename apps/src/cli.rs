//! The command line every tool shares: perftest's flags where they mean the same, plus the
//! failover, polling and report flags (`docs/apps.md` lists them all).

use std::path::PathBuf;

use clap::{Args, CommandFactory, FromArgMatches, Parser, ValueEnum};

/// Most QPs a bandwidth run may use (`-q`): a training job's count per NIC (NCCL's channels
/// times peers), beyond the SHIFT paper's 1,000. The QPs share one buffer, so memory grows
/// with the queues only.
pub const MAX_QPS: u32 = 4096;

/// What a tool measures; decides defaults and the output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tool {
    /// `shift_write_bw`
    WriteBw,
    /// `shift_write_lat`
    WriteLat,
    /// `shift_send_bw`
    SendBw,
    /// `shift_send_lat`
    SendLat,
    /// `shift_read_bw`
    ReadBw,
    /// `shift_read_lat`
    ReadLat,
    /// `shift_atomic_bw`
    AtomicBw,
    /// `shift_allreduce`
    Allreduce,
}

impl Tool {
    /// The binary's name.
    pub fn name(self) -> &'static str {
        match self {
            Tool::WriteBw => "shift_write_bw",
            Tool::WriteLat => "shift_write_lat",
            Tool::SendBw => "shift_send_bw",
            Tool::SendLat => "shift_send_lat",
            Tool::ReadBw => "shift_read_bw",
            Tool::ReadLat => "shift_read_lat",
            Tool::AtomicBw => "shift_atomic_bw",
            Tool::Allreduce => "shift_allreduce",
        }
    }

    /// The tool with binary name `name`.
    pub fn from_name(name: &str) -> Option<Tool> {
        [
            Tool::WriteBw,
            Tool::WriteLat,
            Tool::SendBw,
            Tool::SendLat,
            Tool::ReadBw,
            Tool::ReadLat,
            Tool::AtomicBw,
            Tool::Allreduce,
        ]
        .into_iter()
        .find(|t| t.name() == name)
    }

    /// The `op` of the JSON report.
    pub fn op(self) -> &'static str {
        match self {
            Tool::WriteBw | Tool::WriteLat => "write",
            Tool::SendBw | Tool::SendLat => "send",
            Tool::ReadBw | Tool::ReadLat => "read",
            Tool::AtomicBw => "atomic",
            Tool::Allreduce => "allreduce",
        }
    }

    /// Whether the tool measures latency (ping-pong, HdrHistogram).
    pub fn is_latency(self) -> bool {
        matches!(self, Tool::WriteLat | Tool::SendLat | Tool::ReadLat)
    }

    /// Whether the tool streams work requests (`-t` in flight, one in `-Q` signaled).
    pub fn is_bandwidth(self) -> bool {
        matches!(
            self,
            Tool::WriteBw | Tool::SendBw | Tool::ReadBw | Tool::AtomicBw
        )
    }

    /// perftest's title line.
    pub fn title(self) -> &'static str {
        match self {
            Tool::WriteBw => "RDMA_Write BW Test",
            Tool::WriteLat => "RDMA_Write Latency Test",
            Tool::SendBw => "Send BW Test",
            Tool::SendLat => "Send Latency Test",
            Tool::ReadBw => "RDMA_Read BW Test",
            Tool::ReadLat => "RDMA_Read Latency Test",
            Tool::AtomicBw => "Atomic FETCH_AND_ADD BW Test",
            Tool::Allreduce => "Ring Allreduce (NCCL Simple) Test",
        }
    }

    fn default_size(self) -> usize {
        match self {
            Tool::WriteLat | Tool::SendLat | Tool::ReadLat => 2,
            Tool::AtomicBw => 8,
            Tool::Allreduce => 1 << 20,
            _ => 65536,
        }
    }

    fn default_iters(self) -> u64 {
        match self {
            Tool::WriteLat | Tool::SendLat | Tool::ReadLat => 1000,
            Tool::Allreduce => 100,
            _ => 5000,
        }
    }
}

/// The one figure `--output` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Figure {
    /// Average bandwidth, in the table's unit.
    #[value(name = "bandwidth")]
    Bandwidth,
    /// Message rate, Mpps.
    #[value(name = "message_rate")]
    MessageRate,
    /// Average latency, usec.
    #[value(name = "latency")]
    Latency,
}

/// How the polling lcore waits when there is nothing to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PollMode {
    /// Spin without ever sleeping (a dedicated core; latency runs).
    Busy,
    /// Spin, then yield, then park for up to a millisecond once idle for 200 us.
    Adaptive,
}

/// The flags of every tool (`shift_* --help`).
#[derive(Debug, Clone, Args)]
pub struct Flags {
    /// Device: soft:<netdev>[@<addr>], fabric:<name>/<port> or mlx5:<ibdev>. Default:
    /// soft:lo@127.0.0.1 for a server, soft:lo@127.0.0.2 for a client, so a pair runs on one
    /// host without flags.
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    pub ib_dev: Option<String>,
    /// GID index.
    #[arg(short = 'x', long = "gid-index", default_value_t = 0)]
    pub gid_index: u16,
    /// Message size in bytes (allreduce: bytes of float32 per rank).
    #[arg(short = 's', long = "size")]
    pub size: Option<usize>,
    /// Iterations (per size with -a).
    #[arg(short = 'n', long = "iters")]
    pub iters: Option<u64>,
    /// Run for this many seconds instead of a number of iterations.
    #[arg(short = 'D', long = "duration", value_name = "SECONDS")]
    pub duration: Option<f64>,
    /// Run every size from 2 bytes to 8 MiB (powers of two; latency tools too).
    #[arg(short = 'a', long = "all")]
    pub all: bool,
    /// Work requests in flight.
    #[arg(short = 't', long = "tx-depth", default_value_t = 128)]
    pub tx_depth: u32,
    /// Signal one work request in N (bandwidth tools; default min(100, in flight / 2), as
    /// perftest; above the requests in flight it is lowered to that).
    #[arg(short = 'Q', long = "cq-mod", value_name = "N")]
    pub cq_mod: Option<u32>,
    /// Largest message sent inline (in the WQE).
    #[arg(short = 'I', long = "inline_size")]
    pub inline_size: Option<u32>,
    /// Path MTU in bytes (256, 512, 1024, 2048, 4096); default: the port's active MTU.
    #[arg(short = 'm', long = "mtu")]
    pub mtu: Option<u32>,
    /// TCP port of the out-of-band exchange.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    pub port: u16,
    /// Read fault commands (`device-dead <device>`) from this FIFO, made when missing
    /// (docs/apps-json.md, "Fault channel").
    #[arg(long = "fault-fifo", value_name = "PATH")]
    pub fault_fifo: Option<PathBuf>,
    /// Number of QPs, 1 to 4,096 (bandwidth tools; with --check only shift_write_bw;
    /// iterations go round-robin).
    #[arg(short = 'q', long = "qp", default_value_t = 1)]
    pub qps: u32,
    /// Latency tools: this many more QPs (resilient ones with --backup-dev), connected to
    /// the peer and carrying nothing, beside the measured one (the SHIFT paper's table 2, "w/
    /// 1000 QP"); both sides must give the same number.
    #[arg(long = "idle-qps", value_name = "N", default_value_t = 0)]
    pub idle_qps: u32,
    /// Traffic in both directions: the server sends too (bandwidth tools without --check).
    #[arg(short = 'b', long = "bidirectional")]
    pub bidirectional: bool,
    /// Report bandwidth in Gb/s instead of MiB/s.
    #[arg(long = "report_gbits")]
    pub report_gbits: bool,
    /// Local ACK timeout exponent (4.096 us * 2^N).
    #[arg(short = 'u', long = "qp-timeout", default_value_t = 14)]
    pub qp_timeout: u8,
    /// Repeat the measurement until interrupted (bandwidth tools; prints a row per period).
    #[arg(long = "run_infinitely")]
    pub run_infinitely: bool,
    /// Backup device: run on a resilient QP that fails over to it.
    #[arg(long = "backup-dev", value_name = "DEV")]
    pub backup_dev: Option<String>,
    /// Keep the backup device out of it: errors reach the application (the baseline).
    #[arg(long = "no-failover")]
    pub no_failover: bool,
    /// Failover: how long a recovered default path must stay up before the QP probes it and
    /// switches back: 100ms, 1.5s, or a number of milliseconds (default: the pmd's 1s). The
    /// testbed's spelling; --holddown-ms is the same flag.
    #[arg(long = "holddown", alias = "holddown-ms", value_name = "TIME", value_parser = parse_holddown)]
    pub holddown_ms: Option<u64>,
    /// Failover: how long a connection holds its work while no path answers before it fails
    /// (`outage-tolerance`): 4.3s, 500ms, 2h, or a number of milliseconds, up to a day
    /// (default: the pmd's 4.29 s, one try of a plain RC QP at NCCL's default timeout).
    #[arg(long = "outage-tolerance", value_name = "TIME", value_parser = parse_outage_tolerance)]
    pub outage_tolerance_ms: Option<u64>,
    /// Failover: this host's address on the management network (the one the TCP exchange
    /// uses): the two ends also agree over it when both control channels are lost
    /// (`docs/failover.md` 5f). Default: none (no third channel).
    #[arg(long = "management-addr", value_name = "IP")]
    pub management_addr: Option<std::net::IpAddr>,
    /// Pin the polling lcore to this core.
    #[arg(long = "cpu", value_name = "N")]
    pub cpu: Option<usize>,
    /// Polling: busy spins, adaptive parks when idle.
    #[arg(long = "poll", value_enum, default_value_t = PollMode::Adaptive)]
    pub poll: PollMode,
    /// Timeline interval in milliseconds (0: no timeline).
    #[arg(long = "timeline-ms", default_value_t = 100)]
    pub timeline_ms: u64,
    /// Write the JSON report here (`docs/apps-json.md`).
    #[arg(long = "json", value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write the latency histogram as an HdrHistogram `.hgrm` percentile file.
    #[arg(long = "hdr-out", value_name = "FILE")]
    pub hdr_out: Option<PathBuf>,
    /// Verify every byte and notification (write/send/read bandwidth tools; always on for allreduce).
    #[arg(long = "check")]
    pub check: bool,
    /// The peer is stock perftest (`ib_write_bw` and friends, 6.06): speak its out-of-band
    /// exchange, without failover (docs/interop.md).
    #[arg(long = "perftest-peer")]
    pub perftest_peer: bool,
    /// Ranks of the allreduce ring (rank 0, the server, hands out the ring).
    #[arg(long = "ranks", default_value_t = 2)]
    pub ranks: u32,
    /// perftest's CPU frequency check switch: accepted so perftest scripts run; railshift
    /// measures wall time and never checks the CPU frequency, so there is nothing to skip.
    #[arg(short = 'F', long = "CPU-freq")]
    pub cpu_freq: bool,
    /// Port of the device: every device here has one, port 1.
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    pub ib_port: u8,
    /// perftest's JSON switch: write the report (railshift's format, docs/apps-json.md) to
    /// --out_json_file, or perftest_out.json.
    #[arg(long = "out_json")]
    pub out_json: bool,
    /// perftest's JSON file: the same as --json FILE.
    #[arg(long = "out_json_file", value_name = "FILE")]
    pub out_json_file: Option<PathBuf>,
    /// With -b: also print each direction's row (the table's row is their sum).
    #[arg(long = "report-both")]
    pub report_both: bool,
    /// Connect with rdma_cm: not built; refused with the reason.
    #[arg(short = 'R', long = "rdma_cm", hide = true)]
    pub rdma_cm: bool,
    /// Service level: refused with the reason.
    #[arg(short = 'S', long = "sl", hide = true)]
    pub sl: Option<u8>,
    /// Type of service: refused with the reason.
    #[arg(short = 'T', long = "tos", hide = true)]
    pub tos: Option<u8>,
    /// Traffic class: refused with the reason.
    #[arg(long = "tclass", hide = true)]
    pub tclass: Option<u8>,
    /// Print only this figure of the last row, as perftest's --output: bandwidth (the
    /// average, in the table's unit) or message_rate (bandwidth tools), latency (the
    /// average, usec; latency tools).
    #[arg(long = "output", value_enum, value_name = "WHAT")]
    pub output: Option<Figure>,
    /// Server's address: run as the client. Without it, run as the server.
    #[arg(value_name = "HOST")]
    pub host: Option<String>,
}

/// A hold-down as milliseconds: `100ms`, `1.5s`, or a bare number of milliseconds, up to
/// an hour.
fn parse_holddown(text: &str) -> Result<u64, String> {
    match parse_millis(text) {
        Some(ms) if ms.is_finite() && (0.0..=3_600_000.0).contains(&ms) => Ok(ms.round() as u64),
        Some(_) => Err("a hold-down is 0 to 1 hour".into()),
        None => Err("use 100ms, 1.5s or a number of milliseconds".into()),
    }
}

/// An outage tolerance as milliseconds: `500ms`, `4.3s`, `2h`, or a bare number of
/// milliseconds, up to a day.
fn parse_outage_tolerance(text: &str) -> Result<u64, String> {
    match parse_millis(text) {
        Some(ms) if ms.is_finite() && (0.0..=86_400_000.0).contains(&ms) => Ok(ms.round() as u64),
        Some(_) => Err("an outage tolerance is 0 to 24 hours".into()),
        None => Err("use 500ms, 4.3s, 2h or a number of milliseconds".into()),
    }
}

/// `100ms`, `1.5s`, `2h` or a bare number as milliseconds (the caller checks the range);
/// `None` when it does not parse.
fn parse_millis(text: &str) -> Option<f64> {
    let t = text.trim();
    let ms = if let Some(n) = t.strip_suffix("ms") {
        n.trim().parse::<f64>().ok()
    } else if let Some(n) = t.strip_suffix('s') {
        n.trim().parse::<f64>().ok().map(|s| s * 1e3)
    } else if let Some(n) = t.strip_suffix('h') {
        n.trim().parse::<f64>().ok().map(|h| h * 3.6e6)
    } else {
        t.parse::<f64>().ok()
    };
    ms
}

/// The tools a flag is for (by its clap id), or `None` for a flag every tool takes. A flag
/// given to a tool it is not for is refused, never ignored, and `--help` hides it.
fn scope(id: &str) -> Option<(&'static [Tool], &'static str)> {
    use Tool::*;
    const BW: &[Tool] = &[WriteBw, SendBw, ReadBw, AtomicBw];
    const STREAMS: &[Tool] = &[WriteBw, SendBw, ReadBw];
    const LAT: &[Tool] = &[WriteLat, SendLat, ReadLat];
    const CHECKED: &[Tool] = &[WriteBw, SendBw, ReadBw, Allreduce];
    const RATES: &[Tool] = &[WriteBw, SendBw, ReadBw, AtomicBw, Allreduce];
    const PAIRS: &[Tool] = &[
        WriteBw, SendBw, ReadBw, AtomicBw, WriteLat, SendLat, ReadLat,
    ];
    Some(match id {
        "tx_depth" | "cq_mod" | "run_infinitely" => (BW, "the bandwidth tools"),
        "qps" | "bidirectional" | "report_both" => {
            (STREAMS, "shift_write_bw, shift_send_bw and shift_read_bw")
        }
        "idle_qps" | "hdr_out" => (LAT, "the latency tools"),
        "check" => (
            CHECKED,
            "shift_write_bw, shift_send_bw, shift_read_bw and shift_allreduce",
        ),
        "report_gbits" => (RATES, "the bandwidth tools and shift_allreduce"),
        "ranks" => (&[Allreduce], "shift_allreduce"),
        "perftest_peer" | "fault_fifo" | "all" | "inline_size" | "output" => {
            (PAIRS, "the perftest-style tools, not shift_allreduce")
        }
        _ => return None,
    })
}

/// `-x/--gid-index` as `help` shows a flag: its short and long names.
fn flag_name(arg: &clap::Arg) -> String {
    match (arg.get_short(), arg.get_long()) {
        (Some(s), Some(l)) => format!("-{s}/--{l}"),
        (None, Some(l)) => format!("--{l}"),
        (Some(s), None) => format!("-{s}"),
        (None, None) => arg.get_id().to_string(),
    }
}

/// The command line of `tool`: its defaults in the help, and only its flags.
fn command_for(tool: Tool) -> clap::Command {
    let mut command = Cli::command()
        .name(tool.name())
        .about(tool.title())
        .version(env!("CARGO_PKG_VERSION"));
    let ids: Vec<String> = command
        .get_arguments()
        .map(|a| a.get_id().to_string())
        .collect();
    for id in ids {
        if let Some((tools, _)) = scope(&id) {
            if !tools.contains(&tool) {
                command = command.mut_arg(id, |a| a.hide(true));
            }
        }
    }
    let inline = if tool.is_latency() { 64 } else { 0 };
    command
        .mut_arg("size", |a| {
            a.help(format!(
                "Message size in bytes [default: {}]",
                tool.default_size()
            ))
        })
        .mut_arg("iters", |a| {
            a.help(format!(
                "Iterations (per size with -a) [default: {}]",
                tool.default_iters()
            ))
        })
        .mut_arg("inline_size", |a| {
            a.help(format!(
                "Largest message sent inline (in the WQE) [default: {inline}]"
            ))
        })
}

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    flags: Flags,
}

/// A command line that could not be used, or a request for help.
#[derive(Debug)]
pub enum CliOutcome {
    /// `--help` or `--version`: print this and exit 0.
    Help(String),
    /// A usage error: one line.
    Error(String),
}

/// Parses `args` (without the program name) for `tool`.
pub fn parse(tool: Tool, args: &[String]) -> Result<Options, CliOutcome> {
    let command = command_for(tool);
    let argv = std::iter::once(tool.name().to_owned()).chain(args.iter().cloned());
    let matches = command.try_get_matches_from(argv).map_err(|e| {
        use clap::error::ErrorKind;
        match e.kind() {
            ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                CliOutcome::Help(e.render().to_string())
            }
            _ => CliOutcome::Error(first_line(&e.render().to_string())),
        }
    })?;
    for arg in command_for(tool).get_arguments() {
        let given = matches.value_source(arg.get_id().as_str())
            == Some(clap::parser::ValueSource::CommandLine);
        if let Some((tools, who)) = scope(arg.get_id().as_str()) {
            if given && !tools.contains(&tool) {
                return Err(CliOutcome::Error(format!(
                    "{} is for {who}, not {}",
                    flag_name(arg),
                    tool.name()
                )));
            }
        }
    }
    let cli = Cli::from_arg_matches(&matches)
        .map_err(|e| CliOutcome::Error(first_line(&e.render().to_string())))?;
    Options::resolve(tool, cli.flags).map_err(CliOutcome::Error)
}

fn first_line(rendered: &str) -> String {
    let line = rendered.lines().next().unwrap_or("bad command line").trim();
    line.strip_prefix("error: ").unwrap_or(line).to_owned()
}

/// The flags with the tool's defaults filled in and checked.
#[derive(Debug, Clone)]
pub struct Options {
    /// Which tool.
    pub tool: Tool,
    /// Everything as given.
    pub flags: Flags,
    /// The device to open.
    pub device: String,
    /// Sizes to run, in order.
    pub sizes: Vec<usize>,
    /// Iterations per size (ignored with a duration).
    pub iters: u64,
    /// Inline threshold.
    pub inline_size: u32,
}

impl Options {
    fn resolve(tool: Tool, mut flags: Flags) -> Result<Options, String> {
        let server = flags.host.is_none();
        refuse_unbuilt(&flags)?;
        if flags.ib_port != 1 {
            return Err(format!(
                "-i/--ib-port {}: the devices here have one port, port 1",
                flags.ib_port
            ));
        }
        if let Some(dev) = &flags.ib_dev {
            flags.ib_dev = Some(device_name("-d/--ib-dev", dev)?);
        }
        if let Some(dev) = &flags.backup_dev {
            flags.backup_dev = Some(device_name("--backup-dev", dev)?);
        }
        if flags.out_json || flags.out_json_file.is_some() {
            if flags.json.is_some() {
                return Err(
                    "--json and --out_json/--out_json_file name the same report: give one".into(),
                );
            }
            flags.json = Some(
                flags
                    .out_json_file
                    .clone()
                    .unwrap_or_else(|| PathBuf::from("perftest_out.json")),
            );
        }
        if let Some(path) = &flags.json {
            check_writable("--json", path)?;
        }
        if let Some(path) = &flags.hdr_out {
            if path.as_os_str() == "-" {
                if flags.all {
                    return Err("--hdr-out - prints one size's distribution: with -a/--all give a FILE (one per size)".into());
                }
            } else {
                check_writable("--hdr-out", path)?;
            }
        }
        match flags.output {
            Some(Figure::Latency) if !tool.is_latency() => {
                return Err(format!(
                    "--output latency is for the latency tools; {} prints bandwidth or message_rate",
                    tool.name()
                ))
            }
            Some(Figure::Bandwidth | Figure::MessageRate) if tool.is_latency() => {
                return Err(format!(
                    "--output bandwidth and message_rate are for the bandwidth tools; {} prints latency",
                    tool.name()
                ))
            }
            Some(_) if flags.run_infinitely => {
                return Err("--output prints the last row's figure: not with --run_infinitely, which has none".into())
            }
            _ => {}
        }
        if flags.report_both && !flags.bidirectional {
            return Err("--report-both splits the summed row of -b/--bidirectional: add -b".into());
        }
        let device = flags.ib_dev.clone().unwrap_or_else(|| {
            if server {
                "soft:lo@127.0.0.1".to_owned()
            } else {
                "soft:lo@127.0.0.2".to_owned()
            }
        });
        if flags.all && flags.duration.is_some() {
            return Err("-a/--all and -D/--duration do not go together".into());
        }
        if flags.all && flags.size.is_some() {
            return Err("-a/--all and -s/--size do not go together".into());
        }
        if let Some(d) = flags.duration {
            if !(d.is_finite() && d > 0.0) {
                return Err(format!(
                    "-D/--duration must be a positive number of seconds, not {d}"
                ));
            }
        }
        if flags.qps != 1 {
            let checked_other = flags.check && tool != Tool::WriteBw;
            if !matches!(tool, Tool::WriteBw | Tool::SendBw | Tool::ReadBw) || checked_other {
                return Err(format!(
                    "-q/--qp {}: several QPs are for shift_write_bw (with or without --check), shift_send_bw and shift_read_bw without --check",
                    flags.qps
                ));
            }
            if !(1..=MAX_QPS).contains(&flags.qps) {
                return Err(format!("-q/--qp {} is outside 1..={MAX_QPS}", flags.qps));
            }
        }
        if flags.idle_qps != 0 {
            if !tool.is_latency() {
                return Err(format!(
                    "--idle-qps {}: idle QPs are for shift_write_lat, shift_send_lat and shift_read_lat",
                    flags.idle_qps
                ));
            }
            if flags.idle_qps >= MAX_QPS {
                return Err(format!(
                    "--idle-qps {} is outside 0..={}",
                    flags.idle_qps,
                    MAX_QPS - 1
                ));
            }
        }
        if flags.bidirectional
            && (!matches!(tool, Tool::WriteBw | Tool::SendBw | Tool::ReadBw)
                || flags.check
                || flags.run_infinitely)
        {
            return Err(
                "-b/--bidirectional is for shift_write_bw, shift_send_bw and shift_read_bw, without --check and --run_infinitely"
                    .into(),
            );
        }
        if flags.tx_depth == 0 || flags.tx_depth > 4096 {
            return Err(format!(
                "-t/--tx-depth {} is outside 1..=4096",
                flags.tx_depth
            ));
        }
        if let Some(q) = flags.cq_mod {
            if !tool.is_bandwidth() {
                return Err(format!(
                    "-Q/--cq-mod is for the bandwidth tools, not {}",
                    tool.name()
                ));
            }
            if flags.check {
                return Err(
                    "-Q/--cq-mod: --check signals every iteration (its notification); drop one"
                        .into(),
                );
            }
            if !(1..=4096).contains(&q) {
                return Err(format!("-Q/--cq-mod {q} is outside 1..=4096"));
            }
        }
        if let Some(m) = flags.mtu {
            if ![256, 512, 1024, 2048, 4096].contains(&m) {
                return Err(format!("-m/--mtu {m}: use 256, 512, 1024, 2048 or 4096"));
            }
        }
        if flags.qp_timeout > 31 {
            return Err(format!(
                "-u/--qp-timeout {} is outside 0..=31",
                flags.qp_timeout
            ));
        }
        if flags.check
            && !matches!(
                tool,
                Tool::WriteBw | Tool::SendBw | Tool::ReadBw | Tool::Allreduce
            )
        {
            return Err(format!(
                "--check is for shift_write_bw, shift_send_bw and shift_read_bw, not {}",
                tool.name()
            ));
        }
        if tool != Tool::Allreduce && flags.ranks != 2 {
            return Err("--ranks is for shift_allreduce".into());
        }
        if tool == Tool::Allreduce {
            if flags.ranks < 2 || flags.ranks > 64 {
                return Err(format!("--ranks {}: a ring has 2..=64 ranks", flags.ranks));
            }
            if flags.ranks > 2 && flags.ib_dev.is_none() {
                return Err(
                    "with --ranks above 2, give each rank its own -d (on one host soft:lo@127.0.0.x)"
                        .into(),
                );
            }
        }
        if flags.fault_fifo.is_some() && tool == Tool::Allreduce {
            return Err("--fault-fifo is not supported by shift_allreduce yet".into());
        }
        if flags.all && tool == Tool::Allreduce {
            return Err("-a/--all is not for shift_allreduce".into());
        }
        if flags.all && flags.check {
            return Err("--check runs one size: drop -a/--all".into());
        }
        if flags.perftest_peer {
            check_perftest_peer(tool, &flags)?;
        }
        let iters = flags.iters.unwrap_or(tool.default_iters());
        if iters == 0 {
            return Err("-n/--iters must be at least 1".into());
        }
        let sizes = if flags.all {
            let min = if tool == Tool::AtomicBw { 8 } else { 2 };
            (1..=23)
                .map(|b| 1usize << b)
                .filter(|s| *s >= min)
                .collect()
        } else {
            vec![flags.size.unwrap_or(tool.default_size())]
        };
        for &s in &sizes {
            check_size(tool, s, flags.check)?;
        }
        let inline_size = flags
            .inline_size
            .unwrap_or(if tool.is_latency() { 64 } else { 0 });
        Ok(Options {
            tool,
            device,
            sizes,
            iters,
            inline_size,
            flags,
        })
    }

    /// A warning for perftest's `-x` habit on a ConnectX: railshift's index 0 is already
    /// the device's RoCE v2 IPv4 GID (its table entry swapped with entry 0), so on the usual
    /// table `-x 3` picks entry 0, a RoCE v1 GID.
    pub fn gid_index_warning(&self) -> Option<String> {
        let ibdev = self.device.strip_prefix("mlx5:")?;
        let x = self.flags.gid_index;
        (x != 0).then(|| {
            format!(
                "-x {x} is railshift's GID index, not {ibdev}'s table entry: 0 (the default) is already the device's first RoCE v2 IPv4 GID, and that GID's own table index stands for entry 0 (RoCE v1 on a usual ConnectX); drop -x unless that is meant (docs/apps.md)"
            )
        })
    }

    /// Whether this process is the server (no host argument).
    pub fn is_server(&self) -> bool {
        self.flags.host.is_none()
    }

    /// Whether to run on a resilient QP with failover (never with a stock perftest peer,
    /// which cannot take part in it).
    pub fn failover_enabled(&self) -> bool {
        self.flags.backup_dev.is_some() && !self.flags.no_failover && !self.flags.perftest_peer
    }
}

/// perftest's flags for what railshift has not built, each refused with the reason.
fn refuse_unbuilt(flags: &Flags) -> Result<(), String> {
    if flags.rdma_cm {
        return Err("-R/--rdma_cm: connecting through rdma_cm is not built; drop -R and the tools exchange QP attributes over TCP on -p, as perftest does without -R".into());
    }
    for (flag, given) in [
        ("-S/--sl", flags.sl.is_some()),
        ("-T/--tos", flags.tos.is_some()),
        ("--tclass", flags.tclass.is_some()),
    ] {
        if given {
            return Err(format!(
                "{flag}: not supported: softnic sends traffic class 0 and service level 0, and the tools set neither on a ConnectX yet"
            ));
        }
    }
    Ok(())
}

/// A device name as the pmd opens it: `provider:name`. A bare ConnectX name (`mlx5_0`,
/// perftest's habit) gets its provider; any other bare name is refused with the forms that
/// would open it.
fn device_name(flag: &str, dev: &str) -> Result<String, String> {
    if dev.contains(':') {
        return Ok(dev.to_owned());
    }
    if dev.starts_with("mlx5_") {
        return Ok(format!("mlx5:{dev}"));
    }
    let netdev = std::path::Path::new("/sys/class/net").join(dev).exists();
    let hint = if netdev {
        format!("did you mean soft:{dev} (softnic on netdev {dev})?")
    } else {
        format!("a device is soft:<netdev>[@<addr>], fabric:<name>/<port> or mlx5:<ibdev>, and there is no netdev {dev}")
    };
    Err(format!("{flag} {dev}: {hint}"))
}

/// Refuses an output path that cannot be written before anything runs, so a long run does
/// not end on it: its directory must exist, and an existing file must open for writing.
fn check_writable(flag: &str, path: &std::path::Path) -> Result<(), String> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    if !dir.is_dir() {
        return Err(format!(
            "{flag} {}: directory {} does not exist",
            path.display(),
            dir.display()
        ));
    }
    if path.is_dir() {
        return Err(format!("{flag} {}: is a directory", path.display()));
    }
    if path.exists() {
        std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(|e| format!("{flag} {}: {e}", path.display()))?;
    } else if std::fs::metadata(dir).is_ok_and(|m| m.permissions().readonly()) {
        return Err(format!(
            "{flag} {}: directory {} is read-only",
            path.display(),
            dir.display()
        ));
    }
    Ok(())
}

/// What a stock perftest peer can pair with: one QP, one size, a number of iterations, one
/// direction, nothing perftest does not do.
fn check_perftest_peer(tool: Tool, flags: &Flags) -> Result<(), String> {
    let refuse = |what: &str| {
        Err(format!(
            "--perftest-peer: {what} is not supported with a stock perftest peer"
        ))
    };
    if tool == Tool::Allreduce {
        return refuse("shift_allreduce");
    }
    if flags.all {
        return refuse("-a/--all");
    }
    if flags.duration.is_some() {
        return refuse("-D/--duration (use -n)");
    }
    if flags.qps != 1 {
        return refuse("-q/--qp above 1");
    }
    if flags.bidirectional {
        return refuse("-b/--bidirectional");
    }
    if flags.check {
        return refuse("--check");
    }
    if flags.run_infinitely {
        return refuse("--run_infinitely");
    }
    Ok(())
}

fn check_size(tool: Tool, size: usize, check: bool) -> Result<(), String> {
    const MAX: usize = 1 << 30;
    match tool {
        Tool::AtomicBw if size != 8 => Err(format!("-s/--size {size}: atomics are 8 bytes")),
        Tool::Allreduce if size < 4 || size % 4 != 0 => Err(format!(
            "-s/--size {size}: the allreduce buffer is float32, a multiple of 4 bytes"
        )),
        _ if tool.is_latency() && size < 2 => Err(format!(
            "-s/--size {size}: latency tools need at least 2 bytes"
        )),
        Tool::WriteBw | Tool::SendBw | Tool::ReadBw if check && size < 8 => {
            Err(format!("-s/--size {size}: --check needs at least 8 bytes"))
        }
        _ if size == 0 || size > MAX => Err(format!("-s/--size {size} is outside 1..={MAX}")),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(tool: Tool, args: &[&str]) -> String {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        match parse(tool, &args) {
            Err(CliOutcome::Error(line)) => line,
            other => panic!("{args:?} accepted: {other:?}"),
        }
    }

    #[test]
    fn flags_that_do_not_go_together_are_refused_by_name() {
        assert!(refused(Tool::Allreduce, &["-a"]).contains("-a/--all"));
        assert!(refused(Tool::SendLat, &["--check"]).contains("--check"));
        assert!(refused(Tool::SendBw, &["--check", "-s", "4"]).contains("8 bytes"));
        assert!(refused(Tool::SendBw, &["--check", "-q", "2"]).contains("-q/--qp 2"));
        assert!(refused(Tool::ReadBw, &["--check", "-q", "2"]).contains("-q/--qp 2"));
        assert!(
            parse(Tool::WriteBw, &["--check".into(), "-q".into(), "2".into()]).is_ok(),
            "a checked WRITE stream runs on several QPs"
        );
        assert!(
            refused(Tool::WriteBw, &["-q", "4097"]).contains("-q/--qp 4097 is outside 1..=4096")
        );
        assert!(refused(Tool::ReadBw, &["-q", "0"]).contains("-q/--qp 0"));
        assert!(refused(Tool::AtomicBw, &["-b"]).contains("-b/--bidirectional"));
        assert!(refused(Tool::Allreduce, &["--ranks", "3"]).contains("its own -d"));
        assert!(refused(Tool::WriteBw, &["-D", "1", "-a"]).contains("-D/--duration"));
        assert!(refused(Tool::WriteLat, &["-Q", "4"]).contains("-Q/--cq-mod"));
        assert!(refused(Tool::WriteBw, &["-Q", "4", "--check"]).contains("-Q/--cq-mod"));
        assert!(refused(Tool::SendBw, &["-Q", "0"]).contains("-Q/--cq-mod 0"));
        assert!(refused(Tool::WriteBw, &["--idle-qps", "5"])
            .contains("--idle-qps is for the latency tools, not shift_write_bw"));
        assert!(refused(Tool::WriteLat, &["--idle-qps", "4096"])
            .contains("--idle-qps 4096 is outside 0..=4095"));
        let args = ["--idle-qps".to_owned(), "1000".to_owned()];
        assert_eq!(parse(Tool::ReadLat, &args).unwrap().flags.idle_qps, 1000);
    }

    fn accepted(tool: Tool, args: &[&str]) -> Options {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        match parse(tool, &args) {
            Ok(o) => o,
            other => panic!("{args:?} refused: {other:?}"),
        }
    }

    #[test]
    fn perftests_habitual_flags_are_accepted() {
        let o = accepted(
            Tool::WriteBw,
            &["-F", "-i", "1", "-d", "mlx5_0", "127.0.0.1"],
        );
        assert_eq!(o.device, "mlx5:mlx5_0");
        let o = accepted(Tool::SendBw, &["--out_json"]);
        assert_eq!(o.flags.json, Some(PathBuf::from("perftest_out.json")));
        let file = std::env::temp_dir().join("railshift-cli-out.json");
        let o = accepted(
            Tool::ReadLat,
            &["--out_json", "--out_json_file", file.to_str().unwrap()],
        );
        assert_eq!(o.flags.json, Some(file));
        let o = accepted(Tool::SendBw, &["-b", "--report-both"]);
        assert!(o.flags.report_both);
        let o = accepted(Tool::WriteBw, &["--backup-dev", "mlx5_1"]);
        assert_eq!(o.flags.backup_dev.as_deref(), Some("mlx5:mlx5_1"));
    }

    #[test]
    fn perftest_flags_for_what_is_not_built_are_refused_with_the_reason() {
        assert!(refused(Tool::WriteBw, &["-R"]).contains("rdma_cm is not built"));
        assert!(refused(Tool::WriteBw, &["-S", "1"]).starts_with("-S/--sl: not supported"));
        assert!(refused(Tool::WriteLat, &["-T", "96"]).starts_with("-T/--tos: not supported"));
        assert!(refused(Tool::SendBw, &["--tclass", "96"]).starts_with("--tclass"));
        assert!(refused(Tool::SendBw, &["--output", "latency"]).contains("latency tools"));
        assert!(refused(Tool::WriteLat, &["--output", "bandwidth"]).contains("prints latency"));
        assert!(refused(Tool::WriteBw, &["--output", "bw"]).contains("--output"));
        assert_eq!(
            accepted(Tool::ReadBw, &["--output", "message_rate"])
                .flags
                .output,
            Some(Figure::MessageRate)
        );
        assert!(refused(Tool::WriteBw, &["-i", "2"]).contains("one port"));
        assert!(refused(Tool::WriteBw, &["--report-both"]).contains("add -b"));
    }

    #[test]
    fn a_flag_the_tool_does_not_use_is_refused_not_ignored() {
        assert_eq!(
            refused(Tool::WriteBw, &["--hdr-out", "x.hgrm"]),
            "--hdr-out is for the latency tools, not shift_write_bw"
        );
        assert_eq!(
            refused(Tool::SendLat, &["--run_infinitely"]),
            "--run_infinitely is for the bandwidth tools, not shift_send_lat"
        );
        assert!(refused(Tool::ReadLat, &["-t", "16"]).starts_with("-t/--tx-depth is for"));
        assert!(refused(Tool::Allreduce, &["-I", "64"]).starts_with("-I/--inline_size is for"));
        assert!(refused(Tool::WriteLat, &["--report_gbits"]).starts_with("--report_gbits is for"));
        assert!(refused(Tool::WriteBw, &["--ranks", "2"]).starts_with("--ranks is for"));
    }

    #[test]
    fn perftests_gid_index_habit_on_a_connectx_is_warned_about() {
        let o = accepted(Tool::WriteBw, &["-d", "mlx5_0", "-x", "3"]);
        let w = o.gid_index_warning().expect("a warning");
        assert!(
            w.starts_with("-x 3 is railshift's GID index, not mlx5_0's"),
            "{w}"
        );
        assert!(accepted(Tool::WriteBw, &["-d", "mlx5_0"])
            .gid_index_warning()
            .is_none());
        let soft = accepted(Tool::WriteBw, &["-d", "soft:lo", "-x", "1"]);
        assert!(soft.gid_index_warning().is_none());
    }

    #[test]
    fn a_bare_device_name_is_mapped_or_refused_with_the_forms() {
        assert!(refused(Tool::WriteBw, &["-d", "lo"]).contains("did you mean soft:lo"));
        let line = refused(Tool::WriteBw, &["-d", "nosuchdev0"]);
        assert!(line.contains("soft:<netdev>[@<addr>]") && line.contains("no netdev nosuchdev0"));
    }

    #[test]
    fn an_output_file_that_cannot_be_written_is_refused_before_the_run() {
        assert_eq!(
            refused(Tool::WriteBw, &["--json", "/nonexistent-dir/r.json"]),
            "--json /nonexistent-dir/r.json: directory /nonexistent-dir does not exist"
        );
        assert!(refused(Tool::WriteLat, &["--hdr-out", "/"]).contains("is a directory"));
        assert!(refused(Tool::WriteLat, &["--hdr-out", "-", "-a"]).contains("one size"));
    }

    #[test]
    fn each_tools_help_shows_its_defaults_and_only_its_flags() {
        let help = |tool: Tool| match parse(tool, &["--help".to_owned()]) {
            Err(CliOutcome::Help(text)) => text,
            other => panic!("{other:?}"),
        };
        let bw = help(Tool::WriteBw);
        assert!(
            bw.contains("[default: 65536]") && bw.contains("[default: 5000]"),
            "{bw}"
        );
        assert!(
            bw.contains("--run_infinitely") && !bw.contains("--hdr-out"),
            "{bw}"
        );
        assert!(
            !bw.contains("--ranks") && !bw.contains("--idle-qps"),
            "{bw}"
        );
        let lat = help(Tool::WriteLat);
        assert!(
            lat.contains("[default: 2]") && lat.contains("[default: 1000]"),
            "{lat}"
        );
        assert!(
            lat.contains("--hdr-out") && !lat.contains("--run_infinitely"),
            "{lat}"
        );
        assert!(
            !lat.contains("--tx-depth") && !lat.contains("--cq-mod"),
            "{lat}"
        );
        let ar = help(Tool::Allreduce);
        assert!(
            ar.contains("--ranks") && !ar.contains("--perftest-peer"),
            "{ar}"
        );
    }

    #[test]
    fn a_perftest_peer_refuses_what_perftest_cannot_pair_with() {
        for bad in [
            &["-a"][..],
            &["-D", "1"],
            &["-q", "2"],
            &["-b"],
            &["--check"],
            &["--run_infinitely"],
        ] {
            let mut args = vec!["--perftest-peer"];
            args.extend_from_slice(bad);
            let line = refused(Tool::WriteBw, &args);
            assert!(line.starts_with("--perftest-peer: "), "{line}");
        }
        let args = [
            "--perftest-peer".to_owned(),
            "--backup-dev".to_owned(),
            "soft:lo".to_owned(),
        ];
        assert!(!parse(Tool::WriteBw, &args).unwrap().failover_enabled());
    }

    #[test]
    fn a_management_address_is_an_ip_address_and_none_unless_given() {
        assert_eq!(
            parse(Tool::WriteBw, &[]).unwrap().flags.management_addr,
            None
        );
        let o = accepted(Tool::WriteBw, &["--management-addr", "198.18.100.2"]);
        assert_eq!(
            o.flags.management_addr,
            Some(std::net::Ipv4Addr::new(198, 18, 100, 2).into())
        );
        assert!(
            refused(Tool::WriteBw, &["--management-addr", "host-b"]).contains("--management-addr")
        );
    }

    #[test]
    fn outage_tolerance_is_the_pmds_unless_given_and_refused_when_absurd() {
        assert_eq!(
            parse(Tool::WriteBw, &[]).unwrap().flags.outage_tolerance_ms,
            None
        );
        for (given, ms) in [("4.3s", 4_300), ("500ms", 500), ("2h", 7_200_000), ("0", 0)] {
            let o = accepted(Tool::WriteBw, &["--outage-tolerance", given]);
            assert_eq!(o.flags.outage_tolerance_ms, Some(ms), "{given}");
        }
        assert!(
            refused(Tool::WriteBw, &["--outage-tolerance", "soon"]).contains("--outage-tolerance")
        );
        assert!(refused(Tool::WriteBw, &["--outage-tolerance", "25h"]).contains("0 to 24 hours"));
        assert!(refused(Tool::WriteBw, &["--outage-tolerance=-1s"]).contains("0 to 24 hours"));
    }

    #[test]
    fn holddown_is_the_pmds_unless_given_and_refused_when_absurd() {
        assert_eq!(parse(Tool::WriteBw, &[]).unwrap().flags.holddown_ms, None);
        let args = ["--holddown-ms".to_owned(), "100".to_owned()];
        let o = parse(Tool::WriteBw, &args).unwrap();
        assert_eq!(o.flags.holddown_ms, Some(100));
        // The testbed's spelling, with its units.
        for (given, ms) in [("250ms", 250), ("1.5s", 1500), ("0", 0)] {
            let o = accepted(Tool::WriteBw, &["--holddown", given]);
            assert_eq!(o.flags.holddown_ms, Some(ms), "{given}");
        }
        assert!(refused(Tool::WriteBw, &["--holddown-ms", "soon"]).contains("--holddown"));
        assert!(refused(Tool::WriteBw, &["--holddown", "2h"]).contains("--holddown"));
        assert!(refused(Tool::WriteBw, &["--holddown", "7200s"]).contains("0 to 1 hour"));
    }

    #[test]
    fn each_tool_gets_perftests_defaults() {
        let o = parse(Tool::WriteBw, &[]).unwrap();
        assert_eq!(
            (o.sizes.clone(), o.iters, o.flags.port),
            (vec![65536], 5000, 18515)
        );
        assert!(o.is_server());
        assert_eq!(o.device, "soft:lo@127.0.0.1");
        let o = parse(Tool::WriteLat, &["127.0.0.1".into()]).unwrap();
        assert_eq!((o.sizes.clone(), o.iters), (vec![2], 1000));
        assert_eq!(o.device, "soft:lo@127.0.0.2");
        let o = parse(Tool::WriteBw, &["-a".into()]).unwrap();
        assert_eq!(o.sizes.len(), 23);
    }
}
