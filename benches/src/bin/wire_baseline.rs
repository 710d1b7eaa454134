//! `wire_baseline`: softnic over a veth between two namespaces, next to the raw medium,
//! measured in one run.
//!
//! - 8-byte RDMA WRITE ping-pong (as `ib_write_lat`: each side writes a sequence number into
//!   the other's memory when it sees the peer's), both devices in manual progress driven by a
//!   busy-polling thread each, against a raw UDP 8-byte ping-pong with busy-polling ends;
//! - 64 KiB RDMA WRITE bandwidth (the initiator in manual progress on its thread, the target in
//!   auto mode), against a raw UDP stream of full-size RoCE datagrams.
//!
//! With `--compare-send-paths`, both softnic measurements are made for each way softnic can
//! send (`SendPath::Frames`, its own headers through a packet socket, and
//! `SendPath::UdpSockets`, the kernel's UDP sockets), interleaved over `--rounds`, and the
//! ratios frames / UDP sockets are printed per round.
//!
//! Root only (namespaces). `cargo run --release -p benches --bin wire_baseline -- --mtu 1500 --mtu 9000`

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use hw_defs::verbs::WcStatus;
use softnic::harness::netns::{is_root, run_in, NetnsPair, Side};
use softnic::harness::{connect, ConnectOptions, Data, Node, Op, QpSizes};
use softnic::{Device, DeviceConfig, PathMtu, ProgressMode, SendPath, Wire};
use testbed::baseline::roce_datagram_for;
use testbed::medium::{self, Endpoint, Wait};

#[derive(Parser)]
#[command(about = "softnic vs raw UDP over a veth between two namespaces")]
struct Args {
    /// Link MTUs to measure (repeat for several).
    #[arg(long = "mtu", default_values_t = vec![1500u32, 9000])]
    mtus: Vec<u32>,
    /// Ping-pong round trips per measurement.
    #[arg(long, default_value_t = 20_000)]
    iters: usize,
    /// Seconds per bandwidth measurement.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Measure softnic sending frames against sending through UDP sockets instead of against
    /// the raw medium.
    #[arg(long)]
    compare_send_paths: bool,
    /// Rounds of the comparison (each measures both send paths, alternating which first).
    #[arg(long, default_value_t = 3)]
    rounds: u32,
}

const MSG: usize = 64 << 10;
const WINDOW: usize = 32;

fn open(side: &Side, name: &str, progress: ProgressMode, send_path: SendPath) -> Device {
    let mut cfg = DeviceConfig::new(
        name,
        Wire::Udp {
            netdev: side.netdev.clone(),
            addr: side.addr,
        },
    );
    cfg.progress = progress;
    cfg.send_path = send_path;
    run_in(&side.netns, || Device::open(cfg))
        .expect("enter the namespace")
        .expect("open the device")
}

fn endpoint(side: &Side) -> Endpoint {
    Endpoint {
        netns: Some(side.netns.clone()),
        addr: SocketAddr::new(side.addr, 47_901),
    }
}

fn pair_of_nodes(
    pair: &NetnsPair,
    mtu: PathMtu,
    b_mode: ProgressMode,
    send_path: SendPath,
) -> (Node, Node) {
    let sizes = QpSizes {
        sq_bbs: 1024,
        rq_wqes: 64,
        rq_sges: 1,
        max_inline: 64,
        max_send_sge: 1,
    };
    let a = Node::new(
        open(&pair.a, "a", ProgressMode::Manual, send_path),
        2 * MSG * WINDOW,
        sizes,
    )
    .expect("node a");
    let b = Node::new(
        open(&pair.b, "b", b_mode, send_path),
        2 * MSG * WINDOW,
        sizes,
    )
    .expect("node b");
    let o = ConnectOptions {
        mtu,
        timeout: 14,
        ..Default::default()
    };
    connect(&a.dev, &a.qp, &b.dev, &b.qp, &o).expect("connect");
    (a, b)
}

/// WRITE ping-pong; returns sorted round-trip times in microseconds.
fn write_ping_pong(pair: &NetnsPair, mtu: PathMtu, iters: usize, send_path: SendPath) -> Vec<f64> {
    let (mut a, mut b) = pair_of_nodes(pair, mtu, ProgressMode::Manual, send_path);
    let (a_rkey, a_addr) = (a.buf.keys.rkey, a.buf.addr(0));
    let (b_rkey, b_addr) = (b.buf.keys.rkey, b.buf.addr(0));
    let warmup = iters / 10;
    let total = (warmup + iters) as u64;
    // B runs until A has seen its last echo (B is in manual progress: it must keep calling).
    let stop = Arc::new(AtomicBool::new(false));
    let stop_b = stop.clone();
    // B: whenever A's number n lands, write n back.
    let echo = std::thread::spawn(move || {
        let mut seen = 0u64;
        while !stop_b.load(Ordering::Relaxed) {
            let clock = b.dev.clock().clone();
            b.dev.progress(clock.now());
            let v = b.buf.read_u64(0);
            if v != seen {
                seen = v;
                let signaled = seen % 64 == 0;
                b.qp.post(
                    Op::Write {
                        raddr: a_addr,
                        rkey: a_rkey,
                    },
                    Data::Inline(&seen.to_ne_bytes()),
                    signaled,
                );
                b.qp.ring();
                while b.scq.poll().is_some() {}
            }
        }
        b
    });
    let clock = a.dev.clock().clone();
    let mut rtts = Vec::with_capacity(iters);
    for n in 1..=total {
        let start = Instant::now();
        let signaled = n % 64 == 0;
        a.qp.post(
            Op::Write {
                raddr: b_addr,
                rkey: b_rkey,
            },
            Data::Inline(&n.to_ne_bytes()),
            signaled,
        );
        a.qp.ring();
        let deadline = start + Duration::from_secs(2);
        while a.buf.read_u64(0) != n {
            a.dev.progress(clock.now());
            if Instant::now() > deadline {
                stop.store(true, Ordering::Relaxed);
                let b = echo.join().expect("echo thread");
                panic!(
                    "WRITE ping-pong stalled at {n}: initiator {:?}, target {:?}",
                    a.dev.counters(),
                    b.dev.counters()
                );
            }
        }
        while let Some(c) = a.scq.poll() {
            assert_eq!(c.status, WcStatus::Success);
        }
        if n > warmup as u64 {
            rtts.push(start.elapsed().as_secs_f64() * 1e6);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let _b = echo.join().expect("echo thread");
    rtts.sort_by(f64::total_cmp);
    rtts
}

/// 64 KiB WRITE stream for `seconds` after a warm-up; returns goodput in Gb/s.
fn write_bandwidth(pair: &NetnsPair, mtu: PathMtu, seconds: f64, send_path: SendPath) -> f64 {
    let (mut a, b) = pair_of_nodes(pair, mtu, ProgressMode::Auto, send_path);
    let rkey = b.buf.keys.rkey;
    let clock = a.dev.clock().clone();
    let mut outstanding: std::collections::VecDeque<(u16, bool)> = Default::default();
    let mut completed = 0u64;
    let mut posted = 0u64;
    let warmup = Duration::from_millis(300);
    let start = Instant::now();
    let mut measure_from: Option<(Instant, u64)> = None;
    let run = warmup + Duration::from_secs_f64(seconds);
    while start.elapsed() < run {
        while outstanding.len() < WINDOW {
            let slot = (posted as usize) % WINDOW;
            let signaled = posted % 4 == 3;
            let sge = [a.buf.sge(slot * MSG, MSG as u32)];
            let idx = a.qp.post(
                Op::Write {
                    raddr: b.buf.addr(slot * MSG),
                    rkey,
                },
                Data::Sges(&sge),
                signaled,
            );
            outstanding.push_back((idx, signaled));
            posted += 1;
            if outstanding.len() % 4 == 0 {
                a.qp.ring();
            }
        }
        a.qp.ring();
        a.dev.progress(clock.now());
        while let Some(c) = a.scq.poll() {
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            while let Some((idx, _)) = outstanding.pop_front() {
                completed += 1;
                if idx == c.wqe_counter {
                    break;
                }
            }
        }
        if measure_from.is_none() && start.elapsed() >= warmup {
            measure_from = Some((Instant::now(), completed));
        }
    }
    let (t0, c0) = measure_from.expect("warm-up ended");
    let secs = t0.elapsed().as_secs_f64();
    let gbps = (completed - c0) as f64 * MSG as f64 * 8.0 / secs / 1e9;
    drop(b);
    gbps
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[(((p / 100.0) * (sorted.len() - 1) as f64).round() as usize).min(sorted.len() - 1)]
}

fn main() {
    let args = Args::parse();
    if !is_root() {
        eprintln!("wire_baseline needs root (network namespaces)");
        std::process::exit(2);
    }
    for &mtu in &args.mtus {
        let pair = NetnsPair::create(mtu).expect("namespaces");
        let path_mtu = PathMtu::for_ethernet_mtu(mtu).expect("MTU too small for RoCE");
        if args.compare_send_paths {
            compare_send_paths(&pair, mtu, path_mtu, &args);
            continue;
        }
        let (ea, eb) = (endpoint(&pair.a), endpoint(&pair.b));
        println!(
            "wire_baseline: veth between two namespaces, link MTU {mtu}, RoCE path MTU {}",
            path_mtu.bytes()
        );
        let udp = medium::ping_pong(&ea, &eb, 8, args.iters, Wait::Busy).expect("UDP ping-pong");
        let rtts = write_ping_pong(&pair, path_mtu, args.iters, SendPath::Frames);
        let (p50, p99) = (pct(&rtts, 50.0), pct(&rtts, 99.0));
        println!("  raw UDP 8 B ping-pong (busy poll)        RTT p50 {:>7.2} us  p99 {:>7.2} us  one-way {:>6.2} us", udp.rtt_p50_us, udp.rtt_p99_us, udp.one_way_p50_us);
        println!("  softnic 8 B WRITE ping-pong (manual, busy) RTT p50 {p50:>7.2} us  p99 {p99:>7.2} us  one-way {:>6.2} us", p50 / 2.0);
        println!(
            "  latency ratio softnic/UDP (one-way p50): {:.2}  (goal <= 1.5)",
            (p50 / 2.0) / udp.one_way_p50_us
        );
        let datagram = roce_datagram_for(mtu);
        let stream = medium::stream(&ea, &eb, datagram, Duration::from_secs_f64(args.seconds))
            .expect("UDP stream");
        let gbps = write_bandwidth(&pair, path_mtu, args.seconds, SendPath::Frames);
        println!(
            "  raw UDP stream, {datagram} B datagrams          {:>6.2} Gb/s goodput",
            stream.goodput_gbps
        );
        println!("  softnic 64 KiB WRITE, window {WINDOW}             {gbps:>6.2} Gb/s goodput");
        println!(
            "  bandwidth ratio softnic/UDP: {:.2}  (goal >= 0.5)",
            gbps / stream.goodput_gbps
        );
    }
}

/// The send paths against each other, interleaved round by round (which goes first
/// alternates): 8-byte WRITE ping-pong and 64 KiB WRITE bandwidth, with their ratios.
fn compare_send_paths(pair: &NetnsPair, mtu: u32, path_mtu: PathMtu, args: &Args) {
    println!(
        "wire_baseline: softnic send paths over a veth, link MTU {mtu}, RoCE path MTU {}: \
         frames (own headers, packet socket) against UDP sockets",
        path_mtu.bytes()
    );
    let paths = [SendPath::Frames, SendPath::UdpSockets];
    for round in 0..args.rounds {
        let mut lat = [0.0; 2];
        let mut bw = [0.0; 2];
        for k in 0..2 {
            let i = (k + round as usize) % 2;
            let rtts = write_ping_pong(pair, path_mtu, args.iters, paths[i]);
            lat[i] = pct(&rtts, 50.0) / 2.0;
            bw[i] = write_bandwidth(pair, path_mtu, args.seconds, paths[i]);
        }
        println!(
            "  round {}: 8 B WRITE one-way p50 frames {:>6.2} us, UDP sockets {:>6.2} us, ratio {:.3}; \
             64 KiB WRITE frames {:>6.2} Gb/s, UDP sockets {:>6.2} Gb/s, ratio {:.3}",
            round + 1,
            lat[0],
            lat[1],
            lat[0] / lat[1],
            bw[0],
            bw[1],
            bw[0] / bw[1]
        );
    }
}
