//! What every binary's `main` calls: parse the flags, run the tool, print and write the
//! report, and turn the outcome into an exit code (0 done, 1 stopped by an error, 2 bad
//! command line). Errors are one line on stderr, never a panic.

use crate::bw::{self, Layout};
use crate::cli::{self, CliOutcome, Figure, Options, Tool};
use crate::error::AppError;
use crate::faults::FaultChannel;
use crate::lat;
use crate::report::{self, Report, ResultRow, Timeline, RULE};
use crate::session::{self, Session};
use std::process::ExitCode;

pub use crate::outcome::{base_report, RunOutcome};

/// Runs `tool` with `args` (without the program name) as a binary does, returning its exit
/// code. Tests call this from threads to run a pair inside one process.
pub fn main_with_args(tool: Tool, args: &[String]) -> ExitCode {
    let o = match cli::parse(tool, args) {
        Ok(o) => o,
        Err(CliOutcome::Help(text)) => {
            print!("{text}");
            return ExitCode::SUCCESS;
        }
        Err(CliOutcome::Error(line)) => {
            eprintln!("{}: error: {line}", tool.name());
            return ExitCode::from(2);
        }
    };
    crate::verbosity::set_quiet(o.flags.output.is_some());
    if let Some(w) = o.gid_index_warning() {
        eprintln!("{}: warning: {w}", tool.name());
    }
    match run(&o) {
        Ok(out) => match out.error {
            None => ExitCode::SUCCESS,
            Some(e) => {
                eprintln!("{}: error: {e}", tool.name());
                ExitCode::from(1)
            }
        },
        Err(e) => {
            eprintln!("{}: error: {e}", tool.name());
            ExitCode::from(1)
        }
    }
}

/// The binaries' `main`: logs to stderr (`RUST_LOG`, default warnings), then
/// [`main_with_args`] with the process's arguments.
pub fn main(tool: Tool) -> ExitCode {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    main_with_args(tool, &args)
}

/// Runs a parsed command line. `Err` is an error before the run started (no report);
/// an error during the run is in the outcome, with the report written.
pub fn run(o: &Options) -> Result<RunOutcome, AppError> {
    if o.tool == Tool::Allreduce {
        return crate::allreduce::run(o);
    }
    let mut report = base_report(o);
    // Read before the tool connects: a command may come at any time after the start.
    let faults = match &o.flags.fault_fifo {
        Some(path) => Some(FaultChannel::open(path)?),
        None => None,
    };
    let (out, s, table, figure) = if o.tool.is_latency() {
        run_latency(o, &mut report, faults.as_ref())?
    } else {
        run_bandwidth(o, &mut report, faults.as_ref())?
    };
    report.faults = faults.map(FaultChannel::finish);
    report.failover = s.failover_json(report_start(&report, &s));
    report.failover.print(s.host.is_resilient());
    // perftest's table comes last, so a script that reads the last rows finds the result.
    for line in table {
        say!("{line}");
    }
    if let Some(f) = figure {
        // perftest's --output: the figure alone, as its "%lf".
        println!("{f:.6}");
    }
    report.mtu = s.mtu.bytes();
    report.error = out.as_ref().map(|e| e.to_string());
    if let Some(path) = &o.flags.json {
        report.write(path)?;
    }
    drop(s);
    Ok(RunOutcome { report, error: out })
}

/// Pins this thread, the polling lcore, once setup is done: the softnic engines and the
/// failover service were started before and keep the process's whole CPU set.
fn pin_lcore(o: &Options) -> Result<(), AppError> {
    match o.flags.cpu {
        Some(core) => session::pin(core),
        None => Ok(()),
    }
}

fn report_start(r: &Report, s: &Session) -> f64 {
    r.timeline
        .first()
        .map(|f| f.unix_ms - f.t_ms)
        .unwrap_or(s.start_unix_ms)
}

/// Makes the session's devices reachable from the fault channel, by the names they were
/// opened with.
fn register_devices(o: &Options, s: &Session, faults: Option<&FaultChannel>) {
    let Some(f) = faults else {
        return;
    };
    f.register(&o.device, s.host.context());
    if let (Some(name), Some(ctx)) = (&o.flags.backup_dev, s.host.backup_context()) {
        f.register(name, ctx);
    }
}

/// What a run hands [`run`]: the error that stopped it, the session (for the failover
/// summary), the lines of perftest's table, printed last, and the figure `--output` asks
/// for (from the table's last row).
type Ran = (Option<AppError>, Session, Vec<String>, Option<f64>);

fn run_bandwidth(
    o: &Options,
    report: &mut Report,
    faults: Option<&FaultChannel>,
) -> Result<Ran, AppError> {
    let layout = Layout::of(o)?;
    let mut s = Session::establish(o, layout.buffer_len(), layout.caps(o), |mem| {
        bw::prepare_buffer(o, mem, layout)
    })?;
    register_devices(o, &s, faults);
    pin_lcore(o)?;
    let tx_depth = layout.in_flight as u32 * layout.wqes_per_iter;
    s.print_header(o, tx_depth, layout.cq_mod as u32);
    let gbits = o.flags.report_gbits;
    // The client prints the timeline; the server's samples go to its JSON only, so no line
    // on a terminal leaves unclear which side measured it.
    let mut timeline = Timeline::new(o.flags.timeline_ms, !o.is_server());
    let mut out = if o.flags.bidirectional {
        // Both sides send (and serve the other's traffic until it is done too).
        bw::client(o, &mut s, layout, &mut timeline)
    } else if o.is_server() {
        bw::server(o, &mut s, layout, &mut timeline)
    } else if o.flags.run_infinitely {
        // perftest's --run_infinitely: a row per round until something stops it.
        say!("{}", report::bw_header(gbits));
        loop {
            let out = bw::client(o, &mut s, layout, &mut timeline);
            for r in &out.rows {
                say!("{}", report::bw_row(r, gbits));
            }
            if out.error.is_some() {
                break out;
            }
        }
    } else {
        bw::client(o, &mut s, layout, &mut timeline)
    };
    if s.is_perftest() {
        // perftest's end: the client's result goes to the server, which prints it as its own
        // (WRITE, READ, atomics: the server measures nothing).
        let ours = out
            .rows
            .last()
            .map(|r| report::perftest_bw_report(r, gbits));
        match s.finish_perftest(ours) {
            Ok(Some(theirs)) if o.is_server() => {
                out.rows = vec![report::row_of_perftest_report(&theirs, gbits)];
                report.table_from = "peer".to_owned();
            }
            Ok(_) => {}
            Err(e) => {
                out.error.get_or_insert(e);
            }
        }
    } else if !o.is_server() && !o.flags.bidirectional {
        bw::finish_client(
            &mut s,
            out.rows.last().map_or(0, |r| r.iterations),
            &out.rows,
            out.atomic.as_mut(),
        );
    }
    let own = out.rows.clone();
    let peer: Vec<report::ResultRow> = out.peer_rows.iter().map(ResultRow::of_peer).collect();
    if o.flags.bidirectional && !peer.is_empty() {
        // perftest's bidirectional row: both directions added up.
        out.rows = own
            .iter()
            .zip(&out.peer_rows)
            .map(|(mine, theirs)| mine.plus(theirs))
            .collect();
        report.table_from = "sum".to_owned();
    } else if o.is_server() && o.tool != Tool::SendBw && !peer.is_empty() {
        // A WRITE, READ or atomic server sees no completions for the client's traffic: it
        // prints the client's result as its own, as perftest's server does.
        out.rows = peer.clone();
        report.table_from = "peer".to_owned();
    }
    let mut table = vec![RULE.to_owned(), report::bw_header(gbits)];
    table.extend(out.rows.iter().map(|r| report::bw_row(r, gbits)));
    table.push(RULE.to_owned());
    if o.flags.report_both && report.table_from == "sum" {
        for (what, rows) in [("Local", &own), ("Remote", &peer)] {
            table.push(format!(" {what} results:"));
            table.push(RULE.to_owned());
            table.push(report::bw_header(gbits));
            table.extend(rows.iter().map(|r| report::bw_row(r, gbits)));
            table.push(RULE.to_owned());
        }
    }
    let figure = out.rows.last().and_then(|r| match o.flags.output? {
        Figure::Bandwidth if gbits => Some(r.bw_avg_gbps),
        Figure::Bandwidth => Some(report::gbps_to_mibps(r.bw_avg_gbps)),
        Figure::MessageRate => Some(r.msg_rate_mpps),
        Figure::Latency => None,
    });
    report.peer_results = peer;
    if let Some(c) = &out.check {
        if o.tool == Tool::ReadBw {
            say!(
                " Data check: {} bytes read and checked, {} bad bytes",
                c.bytes_checked,
                c.errors
            );
        } else {
            say!(
                " Data check: {} bytes and {} notifications checked, {} bad bytes, {} notification errors",
                c.bytes_checked, c.notifications_checked, c.errors, c.notification_errors
            );
        }
    }
    if let Some(a) = &out.atomic {
        if o.is_server() {
            say!(
                " Atomic counter at the end: {} (every executed FETCH_ADD added one)",
                a.remote_counter.map_or("?".into(), |c| c.to_string())
            );
        } else {
            say!(
                " Atomic counters: {} posted, {} completed, server counter {}, fetched values in sequence: {}, double executions: {}",
                a.posted,
                a.completed,
                a.remote_counter.map_or("?".into(), |c| c.to_string()),
                a.fetched_in_sequence,
                a.double_executions
            );
        }
    }
    report.set_results(own);
    report.timeline = timeline.samples;
    report.check = out.check.or_else(|| {
        o.flags.check.then(|| report::CheckJson {
            enabled: true,
            ..Default::default()
        })
    });
    report.atomic = out.atomic;
    Ok((out.error, s, table, figure))
}

fn run_latency(
    o: &Options,
    report: &mut Report,
    faults: Option<&FaultChannel>,
) -> Result<Ran, AppError> {
    let max = *o.sizes.iter().max().expect("a size");
    let mut s = Session::establish(o, lat::buffer_len(max), lat::caps(o), |_| {})?;
    register_devices(o, &s, faults);
    pin_lcore(o)?;
    s.print_header(o, 1, 1);
    let mut timeline = Timeline::new(o.flags.timeline_ms, !o.is_server());
    if o.is_server() {
        let mut out = lat::server(o, &mut s, &mut timeline);
        if out.error.is_none() {
            out.error = s.finish_perftest(None).err();
        }
        report.size = max;
        report.timeline = timeline.samples;
        // The server times nothing itself: it prints the client's rows, as perftest's
        // latency server prints a result table (none from a perftest client, which sends
        // no rows).
        let peer: Vec<ResultRow> = out.peer_rows.iter().map(ResultRow::of_peer).collect();
        let mut table = Vec::new();
        if !peer.is_empty() {
            table = lat_table(&peer);
            report.table_from = "peer".to_owned();
        }
        let figure = latency_figure(o, &peer);
        report.peer_results = peer;
        return Ok((out.error, s, table, figure));
    }
    let mut out = lat::client(o, &mut s, &mut timeline);
    let mut rows = Vec::new();
    for l in &out.sizes {
        let mut row = l.row.clone();
        if row.iterations > 0 {
            row.latency = Some(lat::latency_of(&l.hist));
        }
        rows.push(row);
    }
    let total = out.sizes.iter().map(|l| l.row.iterations).sum();
    if s.is_perftest() {
        if let Err(e) = s.finish_perftest(None) {
            out.error.get_or_insert(e);
        }
    } else {
        bw::finish_client(&mut s, total, &rows, None);
    }
    let table = lat_table(&rows);
    let figure = latency_figure(o, &rows);
    let what = if o.tool == Tool::ReadLat {
        "READ round trip"
    } else {
        "one-way = half the round trip"
    };
    match (&o.flags.hdr_out, out.sizes.as_slice()) {
        // `--hdr-out -`: the distribution on stdout, before the table.
        (Some(path), [only]) if path.as_os_str() == "-" => {
            say!(" Latency percentile distribution ({what}, usec):");
            lat::print_distribution(&only.hist);
            say!("{RULE}");
        }
        _ => {}
    }
    if let Some(path) = o.flags.hdr_out.as_ref().filter(|p| p.as_os_str() != "-") {
        for l in &out.sizes {
            // With -a, one file per size: FILE.<size>.
            let file = if out.sizes.len() == 1 {
                path.clone()
            } else {
                let mut name = path.as_os_str().to_owned();
                name.push(format!(".{}", l.row.size));
                name.into()
            };
            write_hgrm_file(&file, &l.hist)?;
        }
    }
    report.latency = rows.last().and_then(|r| r.latency);
    report.set_results(rows);
    report.timeline = timeline.samples;
    Ok((out.error, s, table, figure))
}

/// perftest's latency table: a row for each size that completed iterations.
fn lat_table(rows: &[ResultRow]) -> Vec<String> {
    let mut table = vec![RULE.to_owned(), report::lat_header()];
    for r in rows {
        if let Some(lat) = &r.latency {
            table.push(report::lat_row(r.size, r.iterations, lat));
        }
    }
    table.push(RULE.to_owned());
    table
}

/// `--output latency`: the last row's average.
fn latency_figure(o: &Options, rows: &[ResultRow]) -> Option<f64> {
    rows.last()
        .and_then(|r| r.latency.as_ref())
        .filter(|_| o.flags.output == Some(Figure::Latency))
        .map(|l| l.lat_avg_us)
}

fn write_hgrm_file(
    path: &std::path::Path,
    h: &hdrhistogram::Histogram<u64>,
) -> Result<(), AppError> {
    let err = |e: std::io::Error| AppError::Output {
        path: path.display().to_string(),
        reason: e.to_string(),
    };
    let mut f = std::fs::File::create(path).map_err(err)?;
    lat::write_hgrm(h, &mut f).map_err(err)
}
