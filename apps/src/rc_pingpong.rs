//! `shift_rc_pingpong`: rdma-core's `ibv_rc_pingpong` on railshift, speaking its out-of-band
//! format, so the stock tool on another RoCE stack (Linux rxe, a ConnectX) is its peer.
//!
//! The exchange, as `libibverbs/examples/pingpong.c` does it over TCP (port 18515): each side
//! sends `"%04x:%06x:%06x:%s"` (LID, QPN, PSN, the GID's 16 bytes as 32 hex digits) and its
//! NUL, 52 bytes; the client writes first, reads the server's, then writes `"done"` and its
//! NUL, which the server waits for. The ping-pong: both sides post `rx_depth` receives of the
//! whole buffer; the client sends first; a side sends its next message once its previous SEND
//! completed and a message arrived, `iters` times each way; every SEND is signaled and
//! carries the whole buffer (`-s`), and the same buffer receives.
//!
//! `-c` checks what arrives. The stock tool fills its buffer with 0x7b and writes 0 at every
//! page offset (`i / page_size % sizeof(char)`, which is 0), and checks those offsets on
//! receipt. This tool sends exactly that pattern and checks every byte of every message it
//! receives against it, so a byte the peer's stack (or ours) got wrong anywhere is reported,
//! not only at page offsets.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use pmd::{
    Access, AddressVector, Context, ContextConfig, Cq, Gid, QpAttr, QpCaps, QpState, RecvWr,
    RegisteredBuffer, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion,
};

use crate::endpoint::mtu_of;
use crate::error::AppError;

/// The message's length on the wire: 51 characters and the NUL.
pub const MSG_LEN: usize = 52;
/// `ibv_rc_pingpong`'s default port.
pub const DEFAULT_PORT: u16 = 18515;
/// The page size the stock tool's `-c` pattern is laid out by (4 KiB on x86-64 Linux).
const PAGE: usize = 4096;
const SEND_WRID: u64 = 2;
const RECV_WRID: u64 = 1;
/// How long the run may go without a completion before it is called stalled.
const STALL: Duration = Duration::from_secs(20);

/// Command-line options, named as `ibv_rc_pingpong` names them.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "shift_rc_pingpong",
    about = "ibv_rc_pingpong on railshift: SEND ping-pong with rdma-core's out-of-band format"
)]
pub struct Options {
    /// The railshift device (`soft:<netdev>[@addr]`, `mlx5:<ibdev>`).
    #[arg(short = 'd', long = "ib-dev")]
    pub device: String,
    /// TCP port of the out-of-band exchange.
    #[arg(short = 'p', long = "port", default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// Size of each message, bytes.
    #[arg(short = 's', long = "size", default_value_t = 4096)]
    pub size: u32,
    /// Path MTU: 256, 512, 1024, 2048 or 4096.
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    pub mtu: u32,
    /// Receives kept posted.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    pub rx_depth: u32,
    /// Messages each way.
    #[arg(short = 'n', long = "iters", default_value_t = 1000)]
    pub iters: u64,
    /// Our GID index.
    #[arg(short = 'g', long = "gid-idx", default_value_t = 0)]
    pub gid_index: u16,
    /// Check every byte of every received message against the stock tool's pattern.
    #[arg(short = 'c', long = "chk")]
    pub check: bool,
    /// The server to connect to; without it, this side is the server.
    pub server: Option<String>,
}

/// One side's attributes in the exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dest {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// QP number (24 bits).
    pub qpn: u32,
    /// Initial PSN (24 bits).
    pub psn: u32,
    /// GID.
    pub gid: Gid,
}

impl Dest {
    /// The 52 bytes `pingpong.c` sends.
    pub fn encode(&self) -> [u8; MSG_LEN] {
        let mut gid = String::with_capacity(32);
        for b in self.gid.0 {
            gid.push_str(&format!("{b:02x}"));
        }
        let text = format!(
            "{:04x}:{:06x}:{:06x}:{gid}",
            self.lid,
            self.qpn & 0xff_ffff,
            self.psn & 0xff_ffff
        );
        let mut out = [0u8; MSG_LEN];
        out[..text.len()].copy_from_slice(text.as_bytes());
        out
    }

    /// Parses the peer's message; a malformed one is an error that says what was wrong.
    pub fn decode(msg: &[u8]) -> Result<Dest, AppError> {
        let bad = |what: &str| AppError::Peer(format!("rc_pingpong exchange: {what}"));
        let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        let text = std::str::from_utf8(&msg[..end]).map_err(|_| bad("not ASCII"))?;
        let parts: Vec<&str> = text.split(':').collect();
        let [lid, qpn, psn, gid] = parts[..] else {
            return Err(bad(&format!("{text:?} is not LID:QPN:PSN:GID")));
        };
        let hex = |s: &str, digits: usize, what: &str| {
            if s.len() != digits || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad(&format!("{what} {s:?} is not {digits} hex digits")));
            }
            u32::from_str_radix(s, 16).map_err(|_| bad(what))
        };
        let (lid, qpn, psn) = (
            hex(lid, 4, "LID")?,
            hex(qpn, 6, "QPN")?,
            hex(psn, 6, "PSN")?,
        );
        if gid.len() != 32 || !gid.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad(&format!("GID {gid:?} is not 32 hex digits")));
        }
        let mut raw = [0u8; 16];
        for (i, b) in raw.iter_mut().enumerate() {
            *b = u8::from_str_radix(&gid[2 * i..2 * i + 2], 16).map_err(|_| bad("GID"))?;
        }
        Ok(Dest {
            lid: lid as u16,
            qpn,
            psn,
            gid: Gid(raw),
        })
    }
}

/// What the stock tool's buffer holds with `-c`: 0x7b, and 0 at every page offset.
pub fn stock_pattern(buf: &mut [u8]) {
    buf.fill(0x7b);
    for i in (0..buf.len()).step_by(PAGE) {
        buf[i] = 0;
    }
}

/// Bytes of `got` that differ from [`stock_pattern`].
pub fn pattern_mismatches(got: &[u8]) -> usize {
    got.iter()
        .enumerate()
        .filter(|(i, &b)| b != if i % PAGE == 0 { 0 } else { 0x7b })
        .count()
}

/// What a run did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// SENDs completed.
    pub sent: u64,
    /// Messages received.
    pub received: u64,
    /// Bytes of received messages that differed from the pattern (`-c`).
    pub bad_bytes: usize,
    /// Wall time of the ping-pong.
    pub elapsed: Duration,
}

/// The out-of-band TCP connection, in `pingpong.c`'s order: the client writes its attributes,
/// reads the server's and writes "done"; the server reads the client's, brings its QP up,
/// writes its own and waits for "done". `connect` brings our QP up towards the peer.
fn exchange(
    o: &Options,
    ours: &Dest,
    connect: impl FnOnce(&Dest) -> Result<(), AppError>,
) -> Result<Dest, AppError> {
    let io = |what: &str, e: std::io::Error| AppError::Peer(format!("{what}: {e}"));
    let mut msg = [0u8; MSG_LEN];
    match &o.server {
        Some(host) => {
            let ip: IpAddr = host
                .parse()
                .map_err(|_| AppError::Peer(format!("server {host:?} is not an IP address")))?;
            let addr = SocketAddr::new(ip, o.port);
            // The server may still be starting: retry for a while, as a user would.
            let t0 = Instant::now();
            let mut s = loop {
                match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                    Ok(s) => break s,
                    Err(e) if t0.elapsed() < Duration::from_secs(60) => {
                        tracing::debug!(%addr, error = %e, "server not there yet");
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    Err(e) => return Err(io(&format!("connecting to {addr}"), e)),
                }
            };
            s.write_all(&ours.encode())
                .map_err(|e| io("sending our attributes", e))?;
            s.read_exact(&mut msg)
                .map_err(|e| io("reading the server's attributes", e))?;
            let peer = Dest::decode(&msg)?;
            s.write_all(b"done\0").map_err(|e| io("sending done", e))?;
            connect(&peer)?;
            Ok(peer)
        }
        None => {
            let listener = TcpListener::bind(("0.0.0.0", o.port))
                .map_err(|e| io(&format!("listening on port {}", o.port), e))?;
            let (mut s, _) = listener.accept().map_err(|e| io("accepting", e))?;
            s.read_exact(&mut msg)
                .map_err(|e| io("reading the client's attributes", e))?;
            let peer = Dest::decode(&msg)?;
            connect(&peer)?;
            s.write_all(&ours.encode())
                .map_err(|e| io("sending our attributes", e))?;
            let mut done = [0u8; 5];
            s.read_exact(&mut done)
                .map_err(|e| io("reading the client's done", e))?;
            Ok(peer)
        }
    }
}

struct Ends {
    qp: pmd::Qp,
    cq: Cq,
    buf: RegisteredBuffer,
    ctx: Arc<Context>,
}

impl Ends {
    fn post_recv(&mut self, size: u32) -> Result<(), AppError> {
        self.qp
            .post_recv(&RecvWr::new(RECV_WRID, &[self.buf.sge(0, size)]))
            .map_err(|e| AppError::Verbs(format!("posting a receive: {e}")))
    }

    fn post_send(&mut self, size: u32) -> Result<(), AppError> {
        self.qp
            .post_send(&SendWr::new(SEND_WRID, SendOp::Send, &[self.buf.sge(0, size)]).signaled())
            .map_err(|e| AppError::Verbs(format!("posting a send: {e}")))?;
        self.qp.ring_doorbell();
        Ok(())
    }

    fn poll(&mut self, wcs: &mut [WorkCompletion]) -> usize {
        let n = self.cq.poll(wcs);
        if n == 0 && self.ctx.progress() {
            return self.cq.poll(wcs);
        }
        n
    }
}

/// Runs one side; returns what it did.
pub fn run(o: &Options) -> Result<Summary, AppError> {
    let mtu = mtu_of(o.mtu).ok_or_else(|| {
        AppError::Verbs(format!("-m {}: not 256, 512, 1024, 2048 or 4096", o.mtu))
    })?;
    if o.size == 0 || o.rx_depth < 2 || o.iters == 0 {
        return Err(AppError::Verbs(
            "-s, -n must be at least 1 and -r at least 2".into(),
        ));
    }
    let config = ContextConfig {
        progress: pmd::provider::ProgressModel::Manual,
        ..ContextConfig::default()
    };
    let ctx = Context::open(&o.device, &config).map_err(|e| AppError::Device {
        device: o.device.clone(),
        reason: e.to_string(),
    })?;
    let verbs = |what: &str, e: pmd::provider::VerbsError| AppError::Verbs(format!("{what}: {e}"));
    let gid = ctx
        .query_gid(o.gid_index)
        .map_err(|e| verbs(&format!("GID index {}", o.gid_index), e))?;
    let pd = ctx.alloc_pd().map_err(|e| verbs("allocating a PD", e))?;
    let cq = ctx
        .create_cq(o.rx_depth + 1, false)
        .map_err(|e| verbs("creating the CQ", e))?;
    let caps = QpCaps {
        max_send_wr: 1,
        max_recv_wr: o.rx_depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = pd
        .create_qp(&cq, &cq, caps)
        .map_err(|e| verbs("creating the QP", e))?;
    let buf = pd
        .alloc_buffer(o.size as usize, Access::ALL)
        .map_err(|e| verbs("registering the buffer", e))?;
    let mut pattern = vec![0u8; o.size as usize];
    stock_pattern(&mut pattern);
    buf.write(0, &pattern);
    let mut e = Ends { qp, cq, buf, ctx };
    // As pingpong.c: INIT at once, so the receives can be posted before the exchange.
    e.qp.modify(QpState::Init, &QpAttr::init(Access::ALL))
        .map_err(|err| AppError::Verbs(format!("moving the QP to INIT: {err}")))?;
    let mut routs = 0u32;
    while routs < o.rx_depth {
        e.post_recv(o.size)?;
        routs += 1;
    }
    let ours = Dest {
        lid: 0,
        qpn: e.qp.qpn(),
        psn: pmd::random_psn(),
        gid,
    };
    println!(
        "  local address:  LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        ours.lid,
        ours.qpn,
        ours.psn,
        gid.to_ip()
    );
    let qp = &mut e.qp;
    let peer = exchange(o, &ours, |peer| {
        let modify = |r: Result<(), pmd::ModifyError>, to: &str| {
            r.map_err(|e| AppError::Verbs(format!("moving the QP to {to}: {e}")))
        };
        let rtr = QpAttr::rtr(AddressVector::to_gid(peer.gid), peer.qpn, peer.psn, mtu);
        modify(qp.modify(QpState::Rtr, &rtr), "RTR")?;
        // pingpong.c's: ACK timeout 14 (67 ms), 7 retries, RNR retried for ever.
        let mut rts = QpAttr::rts(ours.psn);
        rts.timeout = Some(14);
        rts.retry_cnt = Some(7);
        modify(qp.modify(QpState::Rts, &rts), "RTS")
    })?;
    println!(
        "  remote address: LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        peer.lid,
        peer.qpn,
        peer.psn,
        peer.gid.to_ip()
    );

    let t0 = Instant::now();
    let mut pending = RECV_WRID;
    if o.server.is_some() {
        e.post_send(o.size)?;
        pending |= SEND_WRID;
    }
    let mut s = Summary::default();
    let mut wcs = [WorkCompletion::EMPTY; 16];
    let mut got = vec![0u8; o.size as usize];
    let mut last = Instant::now();
    while s.received < o.iters || s.sent < o.iters {
        let n = e.poll(&mut wcs);
        if n == 0 {
            if last.elapsed() > STALL {
                return Err(AppError::Stalled(STALL));
            }
            continue;
        }
        last = Instant::now();
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success {
                return Err(AppError::Verbs(format!(
                    "completion {wc:?} after {} sends and {} receives",
                    s.sent, s.received
                )));
            }
            match (wc.wr_id, wc.opcode) {
                (SEND_WRID, WcOpcode::Send) => s.sent += 1,
                (RECV_WRID, WcOpcode::Recv) => {
                    if wc.byte_len != o.size {
                        return Err(AppError::Peer(format!(
                            "a message of {} bytes, expected {}",
                            wc.byte_len, o.size
                        )));
                    }
                    if o.check {
                        e.buf.read(0, &mut got);
                        s.bad_bytes += pattern_mismatches(&got);
                    }
                    s.received += 1;
                    routs -= 1;
                    if routs <= 1 {
                        while routs < o.rx_depth {
                            e.post_recv(o.size)?;
                            routs += 1;
                        }
                    }
                }
                other => {
                    return Err(AppError::Verbs(format!("unexpected completion {other:?}")));
                }
            }
            pending &= !wc.wr_id;
            if s.sent < o.iters && pending == 0 {
                e.post_send(o.size)?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    s.elapsed = t0.elapsed();
    // The device is driven from this loop: keep driving it a little, so the ACK of the
    // peer's last message leaves before the QP goes (a NIC would have sent it on its own;
    // without it the peer's last SEND ends in RETRY_EXC_ERR).
    let mut quiet_since = Instant::now();
    let linger = Instant::now();
    while quiet_since.elapsed() < Duration::from_millis(20)
        && linger.elapsed() < Duration::from_millis(500)
    {
        if e.ctx.progress() {
            quiet_since = Instant::now();
        }
    }
    Ok(s)
}

/// The binary: runs, prints as `ibv_rc_pingpong` does, exits 1 on any error or bad byte.
pub fn main() -> std::process::ExitCode {
    let o = Options::parse();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();
    match run(&o) {
        Ok(s) => {
            let bytes = s.sent.max(s.received) * u64::from(o.size) * 2;
            let usec = s.elapsed.as_micros().max(1) as f64;
            println!(
                "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
                usec / 1e6,
                bytes as f64 * 8.0 / usec
            );
            println!(
                "{} iters in {:.2} seconds = {:.2} usec/iter",
                o.iters,
                usec / 1e6,
                usec / o.iters as f64
            );
            if o.check {
                println!("checked {} messages: {} bad bytes", s.received, s.bad_bytes);
                if s.bad_bytes > 0 {
                    return std::process::ExitCode::FAILURE;
                }
            }
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("shift_rc_pingpong: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_is_pingpong_c_s_fifty_two_bytes() {
        let d = Dest {
            lid: 0,
            qpn: 0x11,
            psn: 0xabcdef,
            gid: Gid::from_ip("198.18.9.1".parse().unwrap()),
        };
        let m = d.encode();
        assert_eq!(
            std::str::from_utf8(&m[..51]).unwrap(),
            "0000:000011:abcdef:00000000000000000000ffffc6120901"
        );
        assert_eq!(m[51], 0);
        assert_eq!(Dest::decode(&m).unwrap(), d);
    }

    #[test]
    fn a_malformed_message_is_an_error_naming_the_field() {
        let good = "0000:000011:abcdef:00000000000000000000ffffc6120901";
        for (bad, what) in [
            ("0000:000011:abcdef", "LID:QPN:PSN:GID"),
            ("0000:00001:abcdef:00000000000000000000ffffc6120901", "QPN"),
            ("0000:000011:abcdeg:00000000000000000000ffffc6120901", "PSN"),
            ("0000:000011:abcdef:00000000000000000000ffffc612090", "GID"),
            ("0000:000011:abcdef:0000000000000000000éffffc6120901", "GID"),
        ] {
            let err = Dest::decode(bad.as_bytes()).unwrap_err().to_string();
            assert!(err.contains(what), "{bad}: {err}");
        }
        assert!(Dest::decode(good.as_bytes()).is_ok());
        assert!(Dest::decode(&[0xff, 0xfe, 0]).is_err());
    }

    #[test]
    fn the_pattern_is_the_stock_tool_s_and_every_wrong_byte_counts() {
        let mut b = vec![0u8; 2 * PAGE + 10];
        stock_pattern(&mut b);
        assert_eq!((b[0], b[1], b[PAGE], b[PAGE + 1]), (0, 0x7b, 0, 0x7b));
        assert_eq!(pattern_mismatches(&b), 0);
        b[5] = 0;
        b[2 * PAGE] = 1;
        assert_eq!(pattern_mismatches(&b), 2);
    }
}
