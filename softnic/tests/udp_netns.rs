//! Root only (CI is root): two devices in two network namespaces joined by a veth, RoCEv2 over
//! real UDP sockets. Every opcode; link down ends in RETRY_EXC_ERR within timeout x
//! (retry_cnt + 1); the traffic captured on the veth decodes in Wireshark's RoCE dissector
//! without malformed packets, and every ICRC verifies with hw-defs.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::pattern;
use hw_defs::mlx5::CqeOpcode;
use hw_defs::pcap;
use hw_defs::roce::udp::UdpPacket;
use hw_defs::roce::FrameRepr;
use hw_defs::verbs::WcStatus;
use softnic::harness::netns::{is_root, run_in, NetnsPair, Side};
use softnic::harness::{connect, Completion, ConnectOptions, Data, HarnessCq, Node, Op, QpSizes};
use softnic::{AsyncEvent, Device, DeviceConfig, Wire};

fn open(side: &Side, name: &str) -> Device {
    let cfg = DeviceConfig::new(
        name,
        Wire::Udp {
            netdev: side.netdev.clone(),
            addr: side.addr,
        },
    );
    run_in(&side.netns, || Device::open(cfg))
        .expect("enter the namespace")
        .expect("open the device")
}

/// Polls `cq` until a completion arrives or `limit` passes (real time; the engines run on
/// their own threads).
fn wait(cq: &mut HarnessCq, limit: Duration) -> Option<Completion> {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if let Some(c) = cq.poll() {
            return Some(c);
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    None
}

fn skip_unless_root(test: &str) -> bool {
    if !is_root() {
        println!("{test}: skipped, needs root for network namespaces (CI runs as root)");
        return true;
    }
    false
}

/// tshark capturing on `side`'s veth into `path` (pcap format), if tshark is installed.
fn capture(side: &Side, path: &std::path::Path) -> Option<Child> {
    let child = Command::new("ip")
        .args([
            "netns",
            "exec",
            &side.netns,
            "tshark",
            "-q",
            "-i",
            &side.netdev,
            "-F",
            "pcap",
            "-w",
        ])
        .arg(path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    // tshark needs a moment before it captures; wait for the file to appear.
    let end = Instant::now() + Duration::from_secs(10);
    while !path.exists() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    Some(child)
}

fn stop(mut child: Child) {
    // Let the capture write out what it has seen before asking it to stop.
    std::thread::sleep(Duration::from_millis(1000));
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let _ = child.wait();
}

/// tshark's one-line summaries of the frames in `pcap` that match `filter`, with IPv4 header
/// checksums verified, and UDP checksums too when `check_udp` (IPv4 RoCE sends 0; over IPv6
/// the kernel leaves a partial, offloaded checksum that a veth never finishes, so a capture
/// cannot verify it: the ICRC check below covers those bytes).
fn tshark_lines(pcap: &std::path::Path, filter: &str, check_udp: bool) -> String {
    let udp = format!(
        "udp.check_checksum:{}",
        if check_udp { "TRUE" } else { "FALSE" }
    );
    let out = Command::new("tshark")
        .args(["-n", "-o", "ip.check_checksum:TRUE", "-o", &udp, "-r"])
        .arg(pcap)
        .args(["-Y", filter])
        .output()
        .expect("run tshark");
    assert!(
        out.status.success(),
        "tshark: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn root_only_every_opcode_runs_over_udp_between_namespaces_and_decodes_in_wireshark() {
    if skip_unless_root("root_only_every_opcode_runs_over_udp_between_namespaces") {
        return;
    }
    every_opcode_over(&NetnsPair::create(1500).expect("namespaces"), "v4");
}

#[test]
fn root_only_every_opcode_runs_over_udp_on_ipv6_and_decodes_in_wireshark() {
    if skip_unless_root("root_only_every_opcode_runs_over_udp_on_ipv6") {
        return;
    }
    let pair = NetnsPair::create_ipv6(1500).expect("namespaces");
    assert!(pair.a.addr.is_ipv6());
    every_opcode_over(&pair, "v6");
}

/// Every opcode between the pair's two devices, checked, with the traffic captured on the
/// veth: Wireshark must decode every frame as RoCE without warnings, and every ICRC must
/// verify with hw-defs.
fn every_opcode_over(pair: &NetnsPair, tag: &str) {
    let dir = std::env::temp_dir().join(format!("softnic-udp-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap_path = dir.join("veth.pcap");
    let tshark = capture(&pair.a, &pcap_path);
    let sizes = QpSizes::default();
    let mut a = Node::new(open(&pair.a, "a"), 1 << 20, sizes).unwrap();
    let mut b = Node::new(open(&pair.b, "b"), 1 << 20, sizes).unwrap();
    connect(&a.dev, &a.qp, &b.dev, &b.qp, &ConnectOptions::default()).unwrap();
    let rkey = b.buf.keys.rkey;
    let t = Duration::from_secs(5);

    let data = pattern(10_000, 1);
    a.buf.write(0, &data);
    let sge = [a.buf.sge(0, 10_000)];
    a.qp.post(
        Op::Write {
            raddr: b.buf.addr(0),
            rkey,
        },
        Data::Sges(&sge),
        true,
    );
    a.qp.ring();
    assert_eq!(
        wait(&mut a.scq, t).expect("WRITE completes").status,
        WcStatus::Success
    );
    let mut got = vec![0u8; 10_000];
    b.buf.read(0, &mut got);
    assert!(got == data, "WRITE payload");

    b.qp.post_recv(&[b.buf.sge(20_000, 10_000)]);
    b.qp.post_recv(&[b.buf.sge(40_000, 64)]);
    a.qp.post(Op::SendImm { imm: 7 }, Data::Sges(&sge), true);
    a.qp.post(
        Op::WriteImm {
            raddr: b.buf.addr(60_000),
            rkey,
            imm: 8,
        },
        Data::Inline(b"imm"),
        true,
    );
    a.qp.ring();
    for _ in 0..2 {
        assert_eq!(
            wait(&mut a.scq, t).expect("SEND/WRITE_IMM complete").status,
            WcStatus::Success
        );
    }
    let r = wait(&mut b.rcq, t).expect("receive completion");
    assert_eq!(
        (r.opcode, r.byte_count, r.imm),
        (CqeOpcode::RespSendImm, 10_000, 7)
    );
    b.buf.read(20_000, &mut got);
    assert!(got == data, "SEND payload");
    let r = wait(&mut b.rcq, t).expect("receive completion");
    assert_eq!(
        (r.opcode, r.byte_count, r.imm),
        (CqeOpcode::RespWrImm, 3, 8)
    );

    let remote = pattern(9000, 2);
    b.buf.write(100_000, &remote);
    let rsge = [a.buf.sge(200_000, 9000)];
    a.qp.post(
        Op::Read {
            raddr: b.buf.addr(100_000),
            rkey,
        },
        Data::Sges(&rsge),
        true,
    );
    b.buf.write(300_000, &5u64.to_ne_bytes());
    let s0 = [a.buf.sge(400_000, 8)];
    let s1 = [a.buf.sge(400_008, 8)];
    a.qp.post(
        Op::FetchAdd {
            raddr: b.buf.addr(300_000),
            rkey,
            add: 10,
        },
        Data::Sges(&s0),
        true,
    );
    a.qp.post(
        Op::CompareSwap {
            raddr: b.buf.addr(300_000),
            rkey,
            compare: 15,
            swap: 99,
        },
        Data::Sges(&s1),
        true,
    );
    a.qp.ring();
    for _ in 0..3 {
        assert_eq!(
            wait(&mut a.scq, t).expect("READ/atomics complete").status,
            WcStatus::Success
        );
    }
    let mut read = vec![0u8; 9000];
    a.buf.read(200_000, &mut read);
    assert!(read == remote, "READ payload");
    assert_eq!((a.buf.read_u64(400_000), a.buf.read_u64(400_008)), (5, 15));
    assert_eq!(b.buf.read_u64(300_000), 99);
    let (ca, cb) = (a.dev.counters(), b.dev.counters());
    assert_eq!(
        (
            ca.icrc_errors,
            cb.icrc_errors,
            ca.malformed_drops,
            cb.malformed_drops
        ),
        (0, 0, 0, 0)
    );

    drop(a);
    drop(b);
    let Some(child) = tshark else {
        println!("tshark not installed: capture check skipped (tools/test installs it)");
        return;
    };
    stop(child);
    let check_udp = pair.a.addr.is_ipv4();
    let roce = tshark_lines(&pcap_path, "udp.port == 4791", check_udp);
    assert!(roce.lines().count() >= 10, "captured RoCE frames:\n{roce}");
    let not_ib = tshark_lines(&pcap_path, "udp.port == 4791 && !infiniband", check_udp);
    assert!(not_ib.is_empty(), "not decoded as InfiniBand:\n{not_ib}");
    let bad = tshark_lines(
        &pcap_path,
        "_ws.malformed || _ws.expert.severity >= \"Warning\"",
        check_udp,
    );
    assert!(
        bad.is_empty(),
        "malformed frames or expert warnings:\n{bad}"
    );
    // Wireshark shows but does not verify the ICRC: verify every RoCE frame with hw-defs.
    let file = std::fs::read(&pcap_path).unwrap();
    let mut verified = 0;
    for rec in pcap::records(&file).unwrap() {
        let (_, frame) = rec.unwrap();
        // Ethernet, then IPv4 (protocol at 23, UDP from 34) or IPv6 (next header at 20, UDP
        // from 54); UDP destination port 4791.
        let udp_at = match frame.get(12..14) {
            Some([0x08, 0x00]) if frame.get(23) == Some(&17) => Some(34),
            Some([0x86, 0xdd]) if frame.get(20) == Some(&17) => Some(54),
            _ => None,
        };
        let is_roce =
            udp_at.is_some_and(|at| frame.get(at + 2..at + 4) == Some(&4791u16.to_be_bytes()[..]));
        if is_roce {
            let mut frame = frame.to_vec();
            if udp_at == Some(54) {
                // The capture holds the partial (offloaded) UDP checksum a veth never
                // finishes: finish it as a NIC would, then verify everything else.
                let src: [u8; 16] = frame[22..38].try_into().unwrap();
                let dst: [u8; 16] = frame[38..54].try_into().unwrap();
                UdpPacket::new_checked(&mut frame[54..])
                    .unwrap()
                    .fill_checksum(src.into(), dst.into());
            }
            FrameRepr::parse(&frame)
                .unwrap_or_else(|e| panic!("captured frame does not verify: {e}"));
            verified += 1;
        }
    }
    assert_eq!(verified, roce.lines().count());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn root_only_link_down_ends_in_retry_exceeded_within_timeout_times_retries_plus_one() {
    if skip_unless_root("root_only_link_down_ends_in_retry_exceeded") {
        return;
    }
    let pair = NetnsPair::create(1500).expect("namespaces");
    let mut a = Node::new(open(&pair.a, "a"), 1 << 16, QpSizes::default()).unwrap();
    let b = Node::new(open(&pair.b, "b"), 1 << 16, QpSizes::default()).unwrap();
    // timeout 14 = 67.1 ms; retry_cnt 3: four timeouts, 268 ms.
    let o = ConnectOptions {
        timeout: 14,
        retry_cnt: 3,
        ..Default::default()
    };
    connect(&a.dev, &a.qp, &b.dev, &b.qp, &o).unwrap();
    let sge = [a.buf.sge(0, 64)];
    let rkey = b.buf.keys.rkey;
    a.qp.post(
        Op::Write {
            raddr: b.buf.addr(0),
            rkey,
        },
        Data::Sges(&sge),
        true,
    );
    a.qp.ring();
    let c = wait(&mut a.scq, Duration::from_secs(5)).unwrap();
    assert_eq!(
        c.status,
        WcStatus::Success,
        "ports {:?} {:?} events {:?}, counters {:?} {:?}",
        a.dev.port_state(),
        b.dev.port_state(),
        std::iter::from_fn(|| b.dev.events().poll()).collect::<Vec<_>>(),
        a.dev.counters(),
        b.dev.counters()
    );

    pair.set_b_link(false).unwrap();
    assert_eq!(a.dev.events().wait(2000), Some(AsyncEvent::PortError));
    let timeouts_before = a.dev.counters().timeouts;
    let start = Instant::now();
    a.qp.post(
        Op::Write {
            raddr: b.buf.addr(0),
            rkey,
        },
        Data::Sges(&sge),
        true,
    );
    let flushed = a.qp.post(
        Op::Write {
            raddr: b.buf.addr(64),
            rkey,
        },
        Data::Sges(&sge),
        false,
    );
    a.qp.ring();
    let c = wait(&mut a.scq, Duration::from_secs(5)).expect("an error completion");
    let took = start.elapsed();
    println!("RETRY_EXC_ERR after {took:?} (timeout x (retry_cnt + 1) = 268.4 ms)");
    let bound = Duration::from_nanos(4096 << 14) * 4;
    assert_eq!(c.status, WcStatus::RetryExcErr);
    // Exactly retry_cnt + 1 timer expiries, and never sooner than they take. The upper
    // bound only catches a runaway: a loaded machine delays timer wake-ups, and the count
    // above already says no extra retry happened.
    assert_eq!(a.dev.counters().timeouts - timeouts_before, 4);
    assert!(
        took >= bound.mul_f64(0.95) && took <= bound + Duration::from_secs(2),
        "error after {took:?}, bound {bound:?}"
    );
    let f = wait(&mut a.scq, Duration::from_secs(1)).unwrap();
    assert_eq!((f.status, f.wqe_counter), (WcStatus::WrFlushErr, flushed));
    assert!(a.dev.counters().port_down_drops > 0);

    pair.set_b_link(true).unwrap();
    assert_eq!(a.dev.events().wait(2000), Some(AsyncEvent::PortActive));
}

/// `ip -n <side's namespace> ARGS`, which must succeed.
fn ip_in(side: &Side, args: &[&str]) -> String {
    let out = Command::new("ip")
        .args(["-n", &side.netns])
        .args(args)
        .output()
        .expect("ip runs");
    assert!(out.status.success(), "ip {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn root_only_after_a_link_flap_a_write_never_waits_for_arp() {
    if skip_unless_root("root_only_after_a_link_flap_a_write_never_waits_for_arp") {
        return;
    }
    let pair = NetnsPair::create(1500).expect("namespaces");
    let mut a = Node::new(open(&pair.a, "a"), 1 << 16, QpSizes::default()).unwrap();
    let b = Node::new(open(&pair.b, "b"), 1 << 16, QpSizes::default()).unwrap();
    // timeout 14 = 67.1 ms; retry_cnt 3: 268 ms before RETRY_EXC_ERR, well inside the three
    // unanswered ARP requests (a second apart) a kernel-resolved send would wait for.
    let o = ConnectOptions {
        timeout: 14,
        retry_cnt: 3,
        ..Default::default()
    };
    connect(&a.dev, &a.qp, &b.dev, &b.qp, &o).unwrap();
    let sge = [a.buf.sge(0, 64)];
    let rkey = b.buf.keys.rkey;
    let write = |a: &mut Node| {
        a.qp.post(
            Op::Write {
                raddr: b.buf.addr(0),
                rkey,
            },
            Data::Sges(&sge),
            true,
        );
        a.qp.ring();
        wait(&mut a.scq, Duration::from_secs(5)).expect("a completion")
    };
    assert_eq!(write(&mut a).status, WcStatus::Success);

    // The flap: taking the netdev down deletes every neighbour entry on it. Then host B stops
    // answering ARP, so nothing the kernel sends could resolve host A's entry again.
    pair.set_a_link(false).unwrap();
    assert_eq!(a.dev.events().wait(2000), Some(AsyncEvent::PortError));
    pair.set_a_link(true).unwrap();
    pair.a.wait_running(Duration::from_secs(5)).unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    while a.dev.port_state() != softnic::PortState::Active && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(a.dev.port_state(), softnic::PortState::Active);
    ip_in(
        &pair.b,
        &["link", "set", "dev", &pair.b.netdev, "arp", "off"],
    );
    let before = ip_in(&pair.a, &["neigh", "show", "dev", &pair.a.netdev]);
    assert!(
        !before.contains("lladdr"),
        "host A's kernel still has host B's address: {before}"
    );

    let c = write(&mut a);
    let after = ip_in(&pair.a, &["neigh", "show", "dev", &pair.a.netdev]);
    assert_eq!(
        c.status,
        WcStatus::Success,
        "the WRITE after the flap waited for ARP (host A's neighbours: {after:?}, counters {:?})",
        a.dev.counters()
    );
}

#[test]
fn root_only_a_link_flapping_ends_reported_in_its_last_state_within_the_kernels_linkwatch_delay() {
    if skip_unless_root("root_only_a_link_flapping_ends_reported_in_its_last_state") {
        return;
    }
    let pair = NetnsPair::create(1500).expect("namespaces");
    let a = open(&pair.a, "a");
    let flip = |up: bool| pair.set_a_link(up).expect("ip link set");
    // A schedule from the testbed's soak: down, up 40 ms later, down again 26 ms after that,
    // up 225 ms later. After `ip link set up` the kernel first reports the link UP with
    // carrier but not RUNNING (operstate still down: its linkwatch work, which also
    // activates the qdisc, is rate-limited to once a second after recent link events), and
    // RUNNING only when that work runs. The device must end up reporting the link active,
    // no later than that delay.
    flip(false);
    std::thread::sleep(Duration::from_millis(40));
    flip(true);
    std::thread::sleep(Duration::from_millis(26));
    flip(false);
    std::thread::sleep(Duration::from_millis(225));
    flip(true);
    let up_at = Instant::now();
    let mut events = Vec::new();
    let mut active_after = None;
    while up_at.elapsed() < Duration::from_secs(3) {
        if let Some(e) = a.events().wait(10) {
            if e == AsyncEvent::PortActive && active_after.is_none() {
                active_after = Some(up_at.elapsed());
            }
            events.push(e);
        }
    }
    println!("link reported active {active_after:?} after the last `ip link set up`");
    assert_eq!(
        a.port_state(),
        softnic::PortState::Active,
        "events {events:?}"
    );
    assert_eq!(
        events.last(),
        Some(&AsyncEvent::PortActive),
        "events {events:?}"
    );
    let after = active_after.expect("reported active");
    assert!(
        after <= Duration::from_millis(1500),
        "active only after {after:?}"
    );
}

/// CPU time (user + system, in clock ticks) of this process's thread named `comm`.
fn thread_cpu_ticks(comm: &str) -> u64 {
    for task in std::fs::read_dir("/proc/self/task").expect("tasks") {
        let dir = task.expect("task").path();
        let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if name.trim_end() != comm {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("stat")).expect("stat");
        // Fields after the parenthesised name: state is field 3, utime 14, stime 15.
        let rest = &stat[stat.rfind(')').expect("comm ends") + 2..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        return fields[11].parse::<u64>().expect("utime")
            + fields[12].parse::<u64>().expect("stime");
    }
    panic!("no thread named {comm}");
}

#[test]
fn root_only_an_idle_engine_sleeps_after_its_netdev_went_down_and_up() {
    if skip_unless_root("root_only_an_idle_engine_sleeps_after_its_netdev_went_down_and_up") {
        return;
    }
    // Taking a netdev down marks a packet socket bound to it with ENETDOWN, which epoll then
    // reports as an error until someone reads it: an engine that never did spun on its epoll
    // set from the first link-down on, a core's worth of CPU for an idle device.
    let pair = NetnsPair::create(1500).expect("namespaces");
    let a = open(&pair.a, "idledown");
    let flip = |up: bool| pair.set_a_link(up).expect("ip link set");
    flip(false);
    std::thread::sleep(Duration::from_millis(50));
    flip(true);
    let end = Instant::now() + Duration::from_secs(5);
    while a.port_state() != softnic::PortState::Active && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(a.port_state(), softnic::PortState::Active);
    // An idle engine wakes every 100 ms for a few microseconds: 0 or 1 tick in 2 s. One that
    // spins gets its share of the cores, well over 25 ticks (250 ms) even when two other
    // processes per core compete with it.
    let comm = "softnic-idledow"; // the thread's name, cut to 15 bytes by the kernel
    let before = thread_cpu_ticks(comm);
    std::thread::sleep(Duration::from_secs(2));
    let used = thread_cpu_ticks(comm) - before;
    println!("the idle engine used {used} ticks of CPU in 2 s after its link went down and up");
    assert!(used < 25, "the idle engine used {used} ticks of CPU in 2 s");
}
