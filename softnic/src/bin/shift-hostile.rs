//! `shift-hostile`: plays a hostile host on the wire against live RoCEv2 QPs. It forges RC
//! packets of every opcode (requests and responses) with valid ICRCs, spoofed source addresses
//! and random PSNs, MSNs, keys and lengths, and sends them through a raw IPv4 socket (root).
//!
//! It knows what an off-path host could learn or guess: the addresses, the QPNs (given on the
//! command line) and the UDP source port a peer's QPN implies (rxe's and softnic's hash); not
//! the PSNs. Each forged packet goes to one target QP as if from that QP's peer (from another
//! UDP port one time in ten).
//!
//! ```text
//! shift-hostile --target TO,QPN,FROM,PEER_QPN [--target ...] [--packets N] [--pps N] [--seed S]
//! ```

use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use hw_defs::roce::icrc;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use softnic::{rxe_source_port, ROCE_PORT};

/// One QP to attack: where it is, and the peer whose packets are forged.
#[derive(Clone, Copy, Debug)]
struct Target {
    to: Ipv4Addr,
    qpn: u32,
    from: Ipv4Addr,
    peer_qpn: u32,
}

#[derive(Debug)]
struct Args {
    targets: Vec<Target>,
    packets: u64,
    pps: u64,
    seed: u64,
}

const USAGE: &str = "usage: shift-hostile --target TO,QPN,FROM,PEER_QPN [--target ...] \
                     [--packets N (100000)] [--pps N (25000)] [--seed S (random)]";

fn parse_u32(s: &str, what: &str) -> Result<u32, String> {
    let v = match s.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    };
    v.map_err(|_| format!("{what} {s:?} is not a number"))
}

fn parse_target(s: &str) -> Result<Target, String> {
    let parts: Vec<&str> = s.split(',').collect();
    let [to, qpn, from, peer_qpn] = parts[..] else {
        return Err(format!("--target {s:?}: want TO,QPN,FROM,PEER_QPN"));
    };
    let addr = |a: &str| {
        a.parse::<Ipv4Addr>()
            .map_err(|_| format!("--target {s:?}: {a:?} is not an IPv4 address"))
    };
    let qpn_of = |q: &str| {
        let v = parse_u32(q, "QPN")?;
        if v > 0x00ff_ffff {
            return Err(format!("--target {s:?}: QPN {q} does not fit 24 bits"));
        }
        Ok(v)
    };
    Ok(Target {
        to: addr(to)?,
        qpn: qpn_of(qpn)?,
        from: addr(from)?,
        peer_qpn: qpn_of(peer_qpn)?,
    })
}

fn parse_args(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut args = Args {
        targets: Vec::new(),
        packets: 100_000,
        pps: 25_000,
        seed: rand::rng().random(),
    };
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--target" => args.targets.push(parse_target(&value()?)?),
            "--packets" => {
                let v = value()?;
                args.packets = v.parse().map_err(|_| format!("--packets {v:?}"))?;
            }
            "--pps" => {
                let v = value()?;
                args.pps = v
                    .parse()
                    .ok()
                    .filter(|&p| p > 0)
                    .ok_or(format!("--pps {v:?}: want a positive number"))?;
            }
            "--seed" => {
                let v = value()?;
                args.seed = v.parse().map_err(|_| format!("--seed {v:?}"))?;
            }
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    if args.targets.is_empty() {
        return Err(format!("no --target\n{USAGE}"));
    }
    Ok(args)
}

/// The RC opcodes (IBA table 38) and the extension headers each carries.
struct Opcode {
    code: u8,
    reth: bool,
    imm: bool,
    aeth: bool,
    atomic_eth: bool,
    atomic_ack_eth: bool,
    payload: bool,
}

const fn op(code: u8, reth: bool, imm: bool, aeth: bool, payload: bool) -> Opcode {
    Opcode {
        code,
        reth,
        imm,
        aeth,
        atomic_eth: false,
        atomic_ack_eth: false,
        payload,
    }
}

const OPCODES: [Opcode; 21] = [
    op(0x00, false, false, false, true), // SEND FIRST
    op(0x01, false, false, false, true), // SEND MIDDLE
    op(0x02, false, false, false, true), // SEND LAST
    op(0x03, false, true, false, true),  // SEND LAST with immediate
    op(0x04, false, false, false, true), // SEND ONLY
    op(0x05, false, true, false, true),  // SEND ONLY with immediate
    op(0x06, true, false, false, true),  // WRITE FIRST
    op(0x07, false, false, false, true), // WRITE MIDDLE
    op(0x08, false, false, false, true), // WRITE LAST
    op(0x09, false, true, false, true),  // WRITE LAST with immediate
    op(0x0a, true, false, false, true),  // WRITE ONLY
    op(0x0b, true, true, false, true),   // WRITE ONLY with immediate
    op(0x0c, true, false, false, false), // READ REQUEST
    op(0x0d, false, false, true, true),  // READ RESPONSE FIRST
    op(0x0e, false, false, false, true), // READ RESPONSE MIDDLE
    op(0x0f, false, false, true, true),  // READ RESPONSE LAST
    op(0x10, false, false, true, true),  // READ RESPONSE ONLY
    op(0x11, false, false, true, false), // ACKNOWLEDGE
    Opcode {
        atomic_ack_eth: true,
        ..op(0x12, false, false, true, false) // ATOMIC ACKNOWLEDGE
    },
    Opcode {
        atomic_eth: true,
        ..op(0x13, false, false, false, false) // COMPARE SWAP
    },
    Opcode {
        atomic_eth: true,
        ..op(0x14, false, false, false, false) // FETCH ADD
    },
];

/// An AETH syndrome: ACK, RNR NAK or one of the four NAK codes, as the spec encodes them.
fn syndrome(rng: &mut ChaCha8Rng) -> u8 {
    match rng.random_range(0..4) {
        0 => 0x1f,
        1 => 0x20 | rng.random_range(0..32u8),
        _ => 0x60 | rng.random_range(0..4u8),
    }
}

/// Forges one RoCEv2 IPv4 datagram (IP, UDP, BTH and what follows, ICRC) for `t`.
fn forge(rng: &mut ChaCha8Rng, t: &Target) -> (Vec<u8>, u8) {
    let o = &OPCODES[rng.random_range(0..OPCODES.len())];
    let mut bth = vec![0u8; 12];
    bth[0] = o.code;
    let pad = if o.payload {
        rng.random_range(0..4u8)
    } else {
        0
    };
    bth[1] = pad << 4;
    bth[2..4].copy_from_slice(&[0xff, 0xff]);
    bth[5..8].copy_from_slice(&t.qpn.to_be_bytes()[1..]);
    let psn: u32 = rng.random_range(0..1 << 24);
    let ack_req = u32::from(rng.random_bool(0.5)) << 31;
    bth[8..12].copy_from_slice(&(ack_req | psn).to_be_bytes());
    if o.reth {
        bth.extend_from_slice(&rng.random::<u64>().to_be_bytes());
        bth.extend_from_slice(&rng.random::<u32>().to_be_bytes());
        bth.extend_from_slice(&rng.random_range(0..1u32 << 20).to_be_bytes());
    }
    if o.atomic_eth {
        bth.extend_from_slice(&(rng.random::<u64>() & !7).to_be_bytes());
        for _ in 0..5 {
            bth.extend_from_slice(&rng.random::<u32>().to_be_bytes());
        }
    }
    if o.aeth {
        let msn = rng.random_range(0..1u32 << 24);
        bth.extend_from_slice(&((u32::from(syndrome(rng)) << 24) | msn).to_be_bytes());
    }
    if o.atomic_ack_eth {
        bth.extend_from_slice(&rng.random::<u64>().to_be_bytes());
    }
    if o.imm {
        bth.extend_from_slice(&rng.random::<u32>().to_be_bytes());
    }
    if o.payload {
        let len = if rng.random_bool(0.5) {
            1024
        } else {
            rng.random_range(0..=1024)
        };
        bth.extend((0..len).map(|_| rng.random::<u8>()));
        bth.extend(std::iter::repeat_n(0u8, usize::from(pad)));
    }
    bth.extend_from_slice(&[0; 4]);
    let src_port = if rng.random_bool(0.9) {
        rxe_source_port(t.peer_qpn)
    } else {
        rng.random_range(1024..=u16::MAX)
    };
    let udp_len = 8 + bth.len();
    let total = 20 + udp_len;
    let mut d = Vec::with_capacity(total);
    d.extend_from_slice(&[0x45, 0x00]);
    d.extend_from_slice(&(total as u16).to_be_bytes());
    // A nonzero identification, so the kernel keeps it (the ICRC covers it).
    d.extend_from_slice(&rng.random_range(1..=u16::MAX).to_be_bytes());
    d.extend_from_slice(&[0x40, 0x00, 64, 17, 0, 0]);
    d.extend_from_slice(&t.from.octets());
    d.extend_from_slice(&t.to.octets());
    d.extend_from_slice(&src_port.to_be_bytes());
    d.extend_from_slice(&ROCE_PORT.to_be_bytes());
    d.extend_from_slice(&(udp_len as u16).to_be_bytes());
    d.extend_from_slice(&[0, 0]);
    d.extend_from_slice(&bth);
    // The datagram is well formed by construction, so the ICRC always fits.
    let _ = icrc::fill(&mut d);
    (d, o.code)
}

/// A raw IPv4 socket that sends whole datagrams (IP header included).
struct RawSocket(std::os::fd::OwnedFd);

impl RawSocket {
    fn open() -> std::io::Result<RawSocket> {
        use std::os::fd::FromRawFd;
        // SAFETY: plain socket(2); the descriptor is owned from here on.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd was just returned by socket(2) and is not owned elsewhere.
        Ok(RawSocket(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }))
    }

    fn send(&self, datagram: &[u8], to: Ipv4Addr) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        let addr = SocketAddrV4::new(to, 0);
        let sin = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from(*addr.ip()).to_be(),
            },
            sin_zero: [0; 8],
        };
        // SAFETY: the buffer and the address live across the call; lengths are theirs.
        let rc = unsafe {
            libc::sendto(
                self.0.as_raw_fd(),
                datagram.as_ptr().cast(),
                datagram.len(),
                0,
                (&sin as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("shift-hostile: {e}");
            return ExitCode::from(2);
        }
    };
    let sock = match RawSocket::open() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("shift-hostile: cannot open a raw IPv4 socket (needs root): {e}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!(
        "shift-hostile: {} forged packets at {} per second to {} QP(s), seed {}",
        args.packets,
        args.pps,
        args.targets.len(),
        args.seed
    );
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    let mut by_opcode = [0u64; 0x15];
    let mut errors = 0u64;
    let start = Instant::now();
    for i in 0..args.packets {
        let due = start + Duration::from_secs_f64(i as f64 / args.pps as f64);
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        let t = args.targets[rng.random_range(0..args.targets.len())];
        let (d, code) = forge(&mut rng, &t);
        match sock.send(&d, t.to) {
            Ok(()) => by_opcode[usize::from(code)] += 1,
            Err(_) => errors += 1,
        }
    }
    let sent: u64 = by_opcode.iter().sum();
    println!(
        "shift-hostile: sent {sent} forged packets in {:.2} s ({errors} send errors); by opcode: {}",
        start.elapsed().as_secs_f64(),
        by_opcode
            .iter()
            .enumerate()
            .map(|(c, n)| format!("{c:#04x}={n}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    if errors > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
