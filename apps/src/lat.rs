//! The latency tools: a WRITE or SEND ping-pong (one-way latency is half the round trip, as
//! perftest reports it) and READ round trips (reported whole, as perftest does). Every sample
//! goes into an HdrHistogram.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use pmd::{QpCaps, RecvWr, SendOp, SendWr, WcOpcode, WorkCompletion};

use crate::bw::completion_error;
use crate::cli::{Options, Tool};
use crate::error::AppError;
use crate::exchange::Msg;
use crate::report::{Latency, ResultRow, Timeline};
use crate::row::PeerRow;
use crate::session::{Idle, Length, PeerWatch, Session, PEER_TIMEOUT};

/// Receives each side keeps posted (SEND ping-pong).
const RECVS: u64 = 16;
/// A ping that is not answered for this long means the peer or the path is gone.
const STALL: Duration = Duration::from_secs(20);

/// Buffer length for messages up to `size`: the receive area, then the send area.
pub fn buffer_len(size: usize) -> usize {
    2 * size
}

/// The QP's queues.
pub fn caps(o: &Options) -> QpCaps {
    QpCaps {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: o.inline_size.max(16),
    }
}

/// One size's result.
#[derive(Debug)]
pub struct LatSize {
    /// Samples, nanoseconds.
    pub hist: Histogram<u64>,
    /// The row (bandwidth figures of the ping-pong).
    pub row: ResultRow,
}

/// A latency run's result: one entry per size (several with `-a`).
#[derive(Debug)]
pub struct LatOutcome {
    /// Per size, in order.
    pub sizes: Vec<LatSize>,
    /// The error that stopped the run.
    pub error: Option<AppError>,
}

/// The byte that marks ping `i`: never 0 (the value of memory nothing has written yet)
/// between railshift tools; with a stock perftest peer, its counter's low byte, `i + 1`
/// (`ib_write_lat` waits for exactly that, 0 after 255 included).
#[inline]
fn mark(i: u64, perftest: bool) -> u8 {
    if perftest {
        (i + 1) as u8
    } else {
        (i % 255 + 1) as u8
    }
}

/// A histogram of nanoseconds from 1 ns to a minute, 3 significant digits.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds")
}

/// The latency figures of `h` (nanoseconds) in microseconds.
pub fn latency_of(h: &Histogram<u64>) -> Latency {
    let us = |ns: u64| ns as f64 / 1e3;
    Latency {
        lat_min_us: us(h.min()),
        lat_max_us: us(h.max()),
        lat_typical_us: us(h.value_at_quantile(0.5)),
        lat_avg_us: h.mean() / 1e3,
        lat_stdev_us: h.stdev() / 1e3,
        lat_p50_us: us(h.value_at_quantile(0.5)),
        lat_p99_us: us(h.value_at_quantile(0.99)),
        lat_p999_us: us(h.value_at_quantile(0.999)),
    }
}

/// The buffer is the receive area, then the send area, each as long as the largest size.
fn area(s: &Session) -> usize {
    s.mem.len() / 2
}

/// Posts a receive for the largest message (with `-a`, SENDs of every size land in it).
fn post_recv(s: &mut Session, k: u64) -> Result<(), AppError> {
    let sge = s.mem.sge(0, area(s) as u32);
    s.conns[0].post_recv(&RecvWr::new(k, &[sge]))?;
    Ok(())
}

/// Sends the ping (or pong) numbered `v` in the last byte.
fn ping(
    s: &mut Session,
    tool: Tool,
    size: usize,
    v: u8,
    inline: u32,
    payload: &mut [u8],
) -> Result<(), AppError> {
    payload[size - 1] = v;
    let op = match tool {
        Tool::WriteLat => SendOp::Write {
            remote: pmd::Remote {
                addr: s.peer.addr,
                rkey: s.peer.rkey,
            },
        },
        Tool::SendLat => SendOp::Send,
        Tool::ReadLat => SendOp::Read {
            remote: pmd::Remote {
                addr: s.peer.addr,
                rkey: s.peer.rkey,
            },
        },
        other => unreachable!("{} is not a latency tool", other.name()),
    };
    if tool != Tool::ReadLat && size as u32 <= inline {
        s.conns[0].post_send(&SendWr::inline(u64::from(v), op, &payload[..size]).signaled())?;
    } else {
        let send_area = area(s);
        if tool != Tool::ReadLat {
            s.mem.write(send_area, &payload[..size]);
        }
        let sge = if tool == Tool::ReadLat {
            s.mem.sge(0, size as u32)
        } else {
            s.mem.sge(send_area, size as u32)
        };
        s.conns[0].post_send(&SendWr::new(u64::from(v), op, &[sge]).signaled())?;
    }
    s.conns[0].ring();
    Ok(())
}

/// What a wait for the peer's answer saw.
enum Arrival {
    Answer,
    /// The client moves on to the next size (`-a`; server side).
    NextSize(usize),
    /// The peer said it is done (with its result rows) or went away (server side).
    PeerGone(Vec<PeerRow>),
}

/// Polls until the answer numbered `v` is there.
#[allow(clippy::too_many_arguments)]
fn wait_answer(
    s: &mut Session,
    tool: Tool,
    size: usize,
    v: u8,
    idle: &mut Idle,
    wcs: &mut [WorkCompletion],
    recvs_posted: &mut u64,
    watch: Option<&mut PeerWatch>,
) -> Result<Arrival, AppError> {
    let since = Instant::now();
    let mut spins = 0u32;
    let mut watch = watch;
    loop {
        let n = s.conns[0].poll(wcs);
        let mut answered = false;
        for wc in &wcs[..n] {
            if !wc.is_ok() {
                return Err(completion_error(&s.conns[0], wc, tool.op()));
            }
            match (tool, wc.opcode) {
                (Tool::SendLat, WcOpcode::Recv) => {
                    answered = true;
                    post_recv(s, *recvs_posted)?;
                    *recvs_posted += 1;
                }
                (Tool::ReadLat, WcOpcode::RdmaRead) => answered = true,
                _ => {}
            }
        }
        if tool == Tool::WriteLat {
            let mut last = [0u8; 1];
            s.mem.read(size - 1, &mut last);
            answered = last[0] == v;
        }
        if answered {
            idle.busy();
            return Ok(Arrival::Answer);
        }
        spins = spins.wrapping_add(1);
        if spins % 256 == 0 {
            let now = Instant::now();
            if let Some(w) = watch.as_deref_mut() {
                match w.check(now, &mut s.oob) {
                    Ok(None) | Ok(Some(Msg::Ready)) => {}
                    Ok(Some(Msg::NextSize { size })) => return Ok(Arrival::NextSize(size)),
                    Ok(Some(Msg::Done { rows, .. })) => return Ok(Arrival::PeerGone(rows)),
                    Ok(Some(_)) | Err(_) => return Ok(Arrival::PeerGone(Vec::new())),
                }
            } else if now.duration_since(since) > STALL {
                return Err(AppError::Stalled(STALL));
            }
        }
        if n == 0 {
            idle.idle();
        }
    }
}

/// The client: `iters` pings (or `-D` seconds of them) per size; with `-a` it tells the
/// server each new size and waits for its `ready` first.
pub fn client(o: &Options, s: &mut Session, timeline: &mut Timeline) -> LatOutcome {
    let max = *o.sizes.iter().max().expect("a size");
    let mut idle = Idle::new(o.flags.poll, &s.host);
    s.conns[0].set_waker(idle.unparker());
    let mut wcs = [WorkCompletion::EMPTY; 16];
    let mut payload = vec![0u8; max];
    let mut recvs_posted = 0u64;
    let mut out = LatOutcome {
        sizes: Vec::new(),
        error: None,
    };
    if o.tool == Tool::SendLat {
        while recvs_posted < RECVS {
            if let Err(e) = post_recv(s, recvs_posted) {
                out.error = Some(e);
                return out;
            }
            recvs_posted += 1;
        }
    }
    if let Err(e) = s.ready_to_run() {
        out.error = Some(e);
        return out;
    }
    let perftest = s.is_perftest();
    // With ib_write_lat the server writes first (perftest's client waits for it).
    let answers_first = perftest && o.tool == Tool::WriteLat;
    let mut last_write: Option<Instant> = None;
    let length = Length::of(o);
    // Ping marks run on across sizes, so the server's count stays in step.
    let mut i = 0u64;
    let (mut bytes_before, mut iters_before) = (0u64, 0u64);
    for (k, &size) in o.sizes.iter().enumerate() {
        if k > 0 {
            let sync = s.chan().and_then(|chan| {
                chan.send(&Msg::NextSize { size })?;
                Ok(chan.expect_ready(PEER_TIMEOUT)?)
            });
            if let Err(e) = sync {
                out.error = Some(e);
                break;
            }
        }
        let mut hist = new_histogram();
        let start = Instant::now();
        let mut now = start;
        let mut done = 0u64;
        while out.error.is_none() && length.wants(done, start, now) {
            let v = mark(i, perftest);
            let wait =
                |s: &mut Session, idle: &mut Idle, wcs: &mut [WorkCompletion], r: &mut u64| {
                    wait_answer(s, o.tool, size, v, idle, wcs, r, None)
                };
            let t0 = Instant::now();
            let r = if answers_first {
                // ib_write_lat's server writes first; its client answers each write: the
                // round trip runs from our previous write to the server's next one.
                wait(s, &mut idle, &mut wcs, &mut recvs_posted).and_then(|_| {
                    let back = Instant::now();
                    let rtt = last_write.map(|w| back.duration_since(w));
                    last_write = Some(back);
                    ping(s, o.tool, size, v, o.inline_size, &mut payload).map(|_| rtt)
                })
            } else {
                ping(s, o.tool, size, v, o.inline_size, &mut payload)
                    .and_then(|_| wait(s, &mut idle, &mut wcs, &mut recvs_posted))
                    .map(|_| Some(Instant::now().duration_since(t0)))
            };
            now = Instant::now();
            match r {
                Ok(rtt) => {
                    if let Some(rtt) = rtt {
                        let ns = rtt.as_nanos() as u64;
                        // Ping-pongs report half the round trip; READs the whole operation.
                        let sample = if o.tool == Tool::ReadLat { ns } else { ns / 2 };
                        hist.saturating_record(sample.max(1));
                    }
                    i += 1;
                    done += 1;
                }
                Err(e) => out.error = Some(e),
            }
            timeline.tick(
                now,
                bytes_before + done * size as u64,
                iters_before + done,
                u64::from(out.error.is_some()),
                || s.conns[0].state(out.error.is_some()),
            );
        }
        let secs = now.duration_since(start).as_secs_f64().max(1e-9);
        let avg = (done * size as u64) as f64 * 8.0 / secs / 1e9;
        bytes_before += done * size as u64;
        iters_before += done;
        out.sizes.push(LatSize {
            hist,
            row: ResultRow {
                size,
                iterations: done,
                bw_peak_gbps: avg,
                bw_avg_gbps: avg,
                msg_rate_mpps: done as f64 / secs / 1e6,
                duration_s: secs,
                latency: None,
            },
        });
        if out.error.is_some() {
            break;
        }
    }
    out
}

/// What a latency server's run ends with.
#[derive(Debug, Default)]
pub struct ServerOutcome {
    /// The error that stopped it.
    pub error: Option<AppError>,
    /// The client's result rows from its `done` (none from a perftest client).
    pub peer_rows: Vec<PeerRow>,
}

/// The server: answers pings until the client is done or gone (READ: just stays up).
pub fn server(o: &Options, s: &mut Session, timeline: &mut Timeline) -> ServerOutcome {
    let fail = |e: AppError| ServerOutcome {
        error: Some(e),
        peer_rows: Vec::new(),
    };
    let gone = |rows: Vec<PeerRow>| ServerOutcome {
        error: None,
        peer_rows: rows,
    };
    let max = *o.sizes.iter().max().expect("a size");
    let mut size = o.sizes[0];
    let mut idle = Idle::new(o.flags.poll, &s.host);
    s.conns[0].set_waker(idle.unparker());
    let mut wcs = [WorkCompletion::EMPTY; 16];
    let mut payload = vec![0u8; max];
    let mut recvs_posted = 0u64;
    if o.tool == Tool::SendLat {
        while recvs_posted < RECVS {
            if let Err(e) = post_recv(s, recvs_posted) {
                return fail(e);
            }
            recvs_posted += 1;
        }
    }
    if let Err(e) = s.ready_to_run() {
        return fail(e);
    }
    // A stock perftest client says nothing when it is done: the server answers -n pings,
    // as perftest's own server does.
    let perftest = s.is_perftest();
    let mut watch = PeerWatch::new(Duration::from_millis(2));
    let mut i = 0u64;
    // READ latency: the server's CPU takes no part; it waits for the end.
    let answer_tool = if o.tool == Tool::ReadLat {
        None
    } else {
        Some(o.tool)
    };
    loop {
        let Some(tool) = answer_tool else {
            let n = s.conns[0].poll(&mut wcs);
            if let Some(wc) = wcs[..n].iter().find(|wc| !wc.is_ok()) {
                return fail(completion_error(&s.conns[0], wc, "the server's queue"));
            }
            match watch.check(Instant::now(), &mut s.oob) {
                Ok(None) => {}
                Ok(Some(Msg::Done { rows, .. })) => {
                    send_summary(s);
                    return gone(rows);
                }
                Ok(Some(Msg::NextSize { .. })) => {
                    if let Err(e) = s.chan().and_then(|c| Ok(c.send(&Msg::Ready)?)) {
                        return fail(e);
                    }
                }
                Ok(Some(_)) | Err(_) => return ServerOutcome::default(),
            }
            if n == 0 {
                idle.idle();
            }
            continue;
        };
        if perftest && i == o.iters {
            return ServerOutcome::default();
        }
        let v = mark(i, perftest);
        // ib_write_lat's server writes first; its client answers each write.
        let writes_first = perftest && tool == Tool::WriteLat;
        if writes_first {
            if let Err(e) = ping(s, tool, size, v, o.inline_size, &mut payload) {
                return fail(e);
            }
        }
        match wait_answer(
            s,
            tool,
            size,
            v,
            &mut idle,
            &mut wcs,
            &mut recvs_posted,
            Some(&mut watch),
        ) {
            Ok(Arrival::Answer) => {}
            Ok(Arrival::NextSize(next)) => {
                if next > max {
                    return fail(AppError::Peer(format!(
                        "the client asked for size {next}, above this side's {max}"
                    )));
                }
                size = next;
                if let Err(e) = s.chan().and_then(|c| Ok(c.send(&Msg::Ready)?)) {
                    return fail(e);
                }
                continue;
            }
            Ok(Arrival::PeerGone(rows)) => {
                send_summary(s);
                return gone(rows);
            }
            Err(e) => return fail(e),
        }
        if !writes_first {
            if let Err(e) = ping(s, tool, size, v, o.inline_size, &mut payload) {
                return fail(e);
            }
        }
        i += 1;
        timeline.tick(Instant::now(), i * size as u64, i, 0, || {
            s.conns[0].state(false)
        });
    }
}

/// The server's answer to a railshift client's `done` (nothing for a perftest peer).
fn send_summary(s: &mut Session) {
    if let Ok(chan) = s.chan() {
        let _ = chan.send(&Msg::Summary {
            atomic_counter: None,
        });
    }
}

/// Writes `h` (nanoseconds) as an HdrHistogram percentile distribution in microseconds, the
/// `.hgrm` text that HdrHistogram's `outputPercentileDistribution` writes and its plotters
/// read (5 ticks per half distance).
pub fn write_hgrm(h: &Histogram<u64>, out: &mut impl std::io::Write) -> std::io::Result<()> {
    let scale = 1e3;
    writeln!(
        out,
        "{:>12} {:>14} {:>10} {:>14}\n",
        "Value", "Percentile", "TotalCount", "1/(1-Percentile)"
    )?;
    let mut total = 0u64;
    for v in h.iter_quantiles(5) {
        total += v.count_since_last_iteration();
        let q = v.quantile_iterated_to();
        let value = v.value_iterated_to() as f64 / scale;
        if q < 1.0 {
            writeln!(
                out,
                "{value:>12.3} {q:>2.12} {total:>10} {:>14.2}",
                1.0 / (1.0 - q)
            )?;
        } else {
            writeln!(out, "{value:>12.3} {q:>2.12} {total:>10}")?;
        }
    }
    let sub_buckets = (2.0 * 10f64.powi(i32::from(h.sigfig())))
        .log2()
        .ceil()
        .exp2() as u64;
    writeln!(
        out,
        "#[Mean    = {:>12.3}, StdDeviation   = {:>12.3}]",
        h.mean() / scale,
        h.stdev() / scale
    )?;
    writeln!(
        out,
        "#[Max     = {:>12.3}, Total count    = {:>12}]",
        h.max() as f64 / scale,
        h.len()
    )?;
    writeln!(
        out,
        "#[Buckets = {:>12}, SubBuckets     = {:>12}]",
        h.buckets(),
        sub_buckets
    )?;
    Ok(())
}

/// Prints the percentile distribution to stdout (the `.hgrm` body).
pub fn print_distribution(h: &Histogram<u64>) {
    let mut text = Vec::new();
    if write_hgrm(h, &mut text).is_ok() {
        print!("{}", String::from_utf8_lossy(&text));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hgrm_file_ends_at_the_largest_sample_with_the_total_count() {
        let mut h = new_histogram();
        for ns in 1000..2000u64 {
            h.record(ns).unwrap();
        }
        let mut out = Vec::new();
        write_hgrm(&h, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("       Value     Percentile TotalCount 1/(1-Percentile)\n\n"));
        let last_row = text
            .lines()
            .rfind(|l| !l.starts_with('#') && !l.is_empty())
            .unwrap();
        let cols: Vec<&str> = last_row.split_whitespace().collect();
        assert_eq!(cols[1], "1.000000000000", "{last_row}");
        assert_eq!(cols[2], "1000", "{last_row}");
        assert!(text.contains("Total count    =         1000]"), "{text}");
    }
}
