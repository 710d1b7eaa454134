//! `engine_throughput`: what softnic's engine costs per packet moving one QP's bulk WRITEs, in
//! wall-clock time: two devices on an in-memory fabric, manual progress on one thread (the
//! requester's rounds, the responder's rounds and the fabric between them, all counted), one
//! QP pair at MTU 4096, `--writes` WRITEs of 64 KiB posted at once and run to completion per
//! sample. Prints the median and best nanoseconds per packet over `--samples` samples as one
//! JSON object; run two builds' binaries alternately and compare medians (the machine's load
//! moves single runs).
//!
//!     cargo bench -p softnic --bench engine_throughput -- [--samples 200] [--writes 128]

use std::time::{Duration, Instant};

use hw_defs::verbs::WcStatus;
use softnic::harness::{connect, ConnectOptions, Data, Node, Op, QpSizes, Sim};
use softnic::PathMtu;

/// Bytes per WRITE.
const WRITE_LEN: u32 = 64 * 1024;
/// Packets per WRITE at MTU 4096.
const PACKETS_PER_WRITE: u32 = WRITE_LEN / 4096;

/// The command line.
struct Args {
    /// Samples timed.
    samples: u32,
    /// WRITEs of 64 KiB posted at once per sample (at most the send queue's 256).
    writes: u32,
}

fn args() -> Result<Args, String> {
    let mut out = Args {
        samples: 200,
        writes: 128,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str, range: std::ops::RangeInclusive<u32>| {
            let v = it.next().ok_or(format!("{name} needs a number"))?;
            v.parse::<u32>()
                .ok()
                .filter(|n| range.contains(n))
                .ok_or(format!("{name}: {v:?} is not a number in {range:?}"))
        };
        match flag.as_str() {
            "--samples" => out.samples = value("--samples", 3..=1_000_000)?,
            "--writes" => out.writes = value("--writes", 1..=256)?,
            // `cargo bench` passes this to every bench target.
            "--bench" => {}
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(out)
}

fn main() {
    if let Err(e) = args().and_then(run) {
        eprintln!("engine_throughput: {e}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<(), String> {
    let sizes = QpSizes::default();
    let o = ConnectOptions {
        mtu: PathMtu::Mtu4096,
        ..Default::default()
    };
    let sim = Sim::new(1, Duration::from_micros(2));
    let open = |name: &str, n: u8| {
        let dev = sim
            .device(name, n)
            .map_err(|e| format!("open device {name}: {e}"))?;
        Node::new(dev, WRITE_LEN as usize, sizes)
            .map_err(|e| format!("create the QP and buffer of {name}: {e}"))
    };
    let (mut a, b) = (open("a", 1)?, open("b", 2)?);
    connect(&a.dev, &a.qp, &b.dev, &b.qp, &o).map_err(|e| format!("connect the QPs: {e}"))?;
    let sge = [a.buf.sge(0, WRITE_LEN)];
    let packets = args.writes * PACKETS_PER_WRITE;
    let mut per_packet = Vec::with_capacity(args.samples as usize);
    // One sample unmeasured: first touches of the buffers and rings.
    for sample in 0..=args.samples {
        let start = Instant::now();
        for _ in 0..args.writes {
            a.qp.post(
                Op::Write {
                    raddr: b.buf.addr(0),
                    rkey: b.buf.keys.rkey,
                },
                Data::Sges(&sge),
                true,
            );
        }
        a.qp.ring();
        let mut done = 0;
        let mut failed = None;
        let scq = &mut a.scq;
        let finished = sim.run_until(&[&a.dev, &b.dev], Duration::from_secs(10), || {
            while let Some(c) = scq.poll() {
                if c.status != WcStatus::Success {
                    failed = Some(c.status);
                }
                done += 1;
            }
            done == args.writes || failed.is_some()
        });
        if let Some(status) = failed {
            return Err(format!("a WRITE completed with {status:?}"));
        }
        if !finished {
            return Err(format!(
                "{done} of {} WRITEs completed in 10 s of virtual time",
                args.writes
            ));
        }
        if sample > 0 {
            per_packet.push(start.elapsed().as_nanos() as f64 / f64::from(packets));
        }
    }
    per_packet.sort_by(|x, y| x.total_cmp(y));
    println!(
        "{{\"ns_per_packet_median\": {:.1}, \"ns_per_packet_best\": {:.1}, \"samples\": {}, \
         \"packets_per_sample\": {packets}, \"retransmitted_packets\": {}}}",
        per_packet[per_packet.len() / 2],
        per_packet[0],
        per_packet.len(),
        a.dev.counters().retransmitted_packets,
    );
    Ok(())
}
