//! `shift_rc_ops`: every RC opcode against a peer on another RoCE stack, for `tools/interop`.
//! Its peer in the rxe VM is `tools/rxe-vm/rc_ops.c`; the two agree on what follows byte for
//! byte.
//!
//! **Exchange** (TCP 18516, text lines): the initiator connects and sends
//! `"QPN PSN RKEY ADDR GID\n"` (hex: 6, 6, 8, 16 and 32 digits); the target brings its QP up
//! and answers with its own; after the operations the initiator sends `"done\n"` and the target
//! answers `"target ok\n"` or `"target failed\n"`.
//!
//! **Plan**: each side registers 64 KiB. The initiator's bytes are `i * 7 + 1`, the target's
//! `i * 13 + 6` (mod 256; the two differ at every byte), except that the target zeroes its
//! receive area (40960..49152) and puts 10 at 32768 and 100 at 32776 (native u64). The initiator, one signaled operation at a
//! time, path MTU 1024:
//! 1. WRITE 8192 bytes from 0 to the target's 0 (eight packets);
//! 2. WRITE_WITH_IMM 100 bytes from 8192 to the target's 8192, immediate 0x12345678;
//! 3. SEND 3000 bytes from 0 (three packets) into the target's receive at 40960;
//! 4. SEND_WITH_IMM 200 bytes from 4096, immediate 0x0badcafe, into the receive at 45056;
//! 5. READ 8192 bytes of the target's 16384 into its own 49152 (eight response packets);
//! 6. CMP_AND_SWP on the target's 32768: compare 10, swap 20 (returns 10) into 57344;
//! 7. FETCH_AND_ADD 5 on the target's 32776 (returns 100) into 57352;
//! 8. two atomics outstanding at once, posted together and then both awaited: CMP_AND_SWP on
//!    32768, compare 20, swap 30 (returns 20) into 57360, and FETCH_AND_ADD 7 on 32776
//!    (returns 105) into 57368 (the case where rxe 6.1 was reported to return 0).
//!
//! The initiator checks every byte the READ brought and every atomic result; the target checks
//! its three receive completions (opcode, length, immediate), every byte written and sent,
//! and the atomics' effect (30 and 112).
//!
//! **RNR plan** (`--rnr-retry N` on the initiator, `--rnr-timer T` on the target): the target
//! posts no receive before the exchange and answers RNR NAKs with timer code T; with
//! `--rnr-post-ms MS` it posts its receive (at 40960) MS milliseconds after sending its line,
//! else never. The initiator, RNR retry count N, sends one SEND of 3000 bytes from 0 (three
//! packets): with N = 7 (retry for ever) it must complete successfully, and the target checks
//! its receive completion and every byte; with N < 7 against a target that never posts, it
//! must complete with RNR_RETRY_EXC_ERR after N retries, and the target checks that nothing
//! arrived. The exchange is the same.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use pmd::{
    Access, AddressVector, Context, ContextConfig, Cq, Gid, Mtu, QpAttr, QpCaps, QpState, RecvWr,
    RegisteredBuffer, Remote, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion,
};

use crate::error::AppError;

/// The exchange's TCP port.
pub const PORT: u16 = 18516;
const BUF: usize = 65536;
const WRITE_OFF: usize = 0;
const WRITE_LEN: usize = 8192;
const WIMM_OFF: usize = 8192;
const WIMM_LEN: usize = 100;
const SEND_LEN: usize = 3000;
const SIMM_SRC: usize = 4096;
const SIMM_LEN: usize = 200;
const READ_OFF: usize = 16384;
const READ_LEN: usize = 8192;
const CAS_OFF: usize = 32768;
const FADD_OFF: usize = 32776;
const RECV_OFF: usize = 40960;
const READ_DST: usize = 49152;
const ATOMIC_DST: usize = 57344;
const IMM_WIMM: u32 = 0x1234_5678;
const IMM_SIMM: u32 = 0x0bad_cafe;

/// Command-line options.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "shift_rc_ops",
    about = "every RC opcode against rc_ops on another RoCE stack (tools/interop)"
)]
pub struct Options {
    /// The railshift device.
    #[arg(short = 'd', long = "ib-dev")]
    pub device: String,
    /// Our GID index.
    #[arg(short = 'g', long = "gid-idx", default_value_t = 0)]
    pub gid_index: u16,
    /// Run the seven operations against the target at this address.
    #[arg(long, conflicts_with = "target")]
    pub initiator: Option<IpAddr>,
    /// Wait for an initiator and check what it did.
    #[arg(long)]
    pub target: bool,
    /// Initiator: run the RNR plan (one SEND) with this RNR retry count (7 = for ever).
    #[arg(
        long,
        requires = "initiator",
        conflicts_with = "target",
        value_parser = clap::value_parser!(u8).range(0..=7)
    )]
    pub rnr_retry: Option<u8>,
    /// Target: run the RNR plan, answering RNR NAKs with this timer code.
    #[arg(
        long,
        requires = "target",
        conflicts_with = "initiator",
        value_parser = clap::value_parser!(u8).range(0..=31)
    )]
    pub rnr_timer: Option<u8>,
    /// Target of the RNR plan: post the receive this many milliseconds after the exchange
    /// (default: never).
    #[arg(long, requires = "rnr_timer")]
    pub rnr_post_ms: Option<u64>,
}

/// The initiator's byte at `i`.
pub fn initiator_byte(i: usize) -> u8 {
    (i.wrapping_mul(7) + 1) as u8
}

/// The target's byte at `i`.
pub fn target_byte(i: usize) -> u8 {
    (i.wrapping_mul(13) + 6) as u8
}

/// One side's attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dest {
    /// QP number.
    pub qpn: u32,
    /// Initial PSN.
    pub psn: u32,
    /// The buffer's rkey.
    pub rkey: u32,
    /// The buffer's address.
    pub addr: u64,
    /// GID.
    pub gid: Gid,
}

impl Dest {
    /// The exchange line.
    pub fn encode(&self) -> String {
        let gid: String = self.gid.0.iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "{:06x} {:06x} {:08x} {:016x} {gid}\n",
            self.qpn, self.psn, self.rkey, self.addr
        )
    }

    /// Parses an exchange line; a malformed one is an error naming the field.
    pub fn decode(line: &str) -> Result<Dest, AppError> {
        let bad = |what: &str| AppError::Peer(format!("rc_ops exchange: {what} in {line:?}"));
        let f: Vec<&str> = line.split_whitespace().collect();
        let [qpn, psn, rkey, addr, gid] = f[..] else {
            return Err(bad("not QPN PSN RKEY ADDR GID"));
        };
        let hex = |s: &str, what: &str| u64::from_str_radix(s, 16).map_err(|_| bad(what));
        if gid.len() != 32 || !gid.is_ascii() {
            return Err(bad("GID"));
        }
        let mut raw = [0u8; 16];
        for (i, b) in raw.iter_mut().enumerate() {
            *b = u8::from_str_radix(&gid[2 * i..2 * i + 2], 16).map_err(|_| bad("GID"))?;
        }
        Ok(Dest {
            qpn: hex(qpn, "QPN")? as u32 & 0xff_ffff,
            psn: hex(psn, "PSN")? as u32 & 0xff_ffff,
            rkey: hex(rkey, "RKEY")? as u32,
            addr: hex(addr, "ADDR")?,
            gid: Gid(raw),
        })
    }
}

struct Side {
    ctx: Arc<Context>,
    cq: Cq,
    qp: pmd::Qp,
    buf: RegisteredBuffer,
}

impl Side {
    fn wait(&mut self) -> Result<WorkCompletion, AppError> {
        let mut wcs = [WorkCompletion::EMPTY; 1];
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            if self.cq.poll(&mut wcs) == 1 {
                return Ok(wcs[0]);
            }
            self.ctx.progress();
            if Instant::now() > end {
                return Err(AppError::Stalled(Duration::from_secs(30)));
            }
        }
    }

    /// Reads one line of the exchange while driving the device: it is driven from this
    /// thread, so a blocking read would leave the peer's requests unanswered (and unACKed)
    /// until the peer gave up; that deadlock was the first run against rxe.
    fn read_line(&mut self, stream: &mut TcpStream) -> Result<String, AppError> {
        let io = |e: std::io::Error| AppError::Peer(format!("reading the exchange: {e}"));
        stream.set_nonblocking(true).map_err(io)?;
        let mut line = Vec::new();
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            let mut byte = [0u8; 1];
            match stream.read(&mut byte) {
                Ok(0) => break,
                Ok(_) if byte[0] == b'\n' => break,
                Ok(_) => line.push(byte[0]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    self.ctx.progress();
                    if Instant::now() > end {
                        return Err(AppError::Stalled(Duration::from_secs(60)));
                    }
                }
                Err(e) => return Err(io(e)),
            }
        }
        stream.set_nonblocking(false).map_err(io)?;
        Ok(String::from_utf8_lossy(&line).into_owned())
    }

    fn post_recv(&mut self, id: u64, off: usize) -> Result<(), AppError> {
        self.qp
            .post_recv(&RecvWr::new(id, &[self.buf.sge(off, 4096)]))
            .map_err(|e| AppError::Verbs(format!("posting a receive: {e}")))
    }

    /// Drives the device a little longer, so the ACKs of what just arrived leave before the QP
    /// goes (the device is driven from this thread).
    fn linger(&self) {
        let end = Instant::now() + Duration::from_millis(200);
        while Instant::now() < end {
            self.ctx.progress();
        }
    }
}

/// Runs one side; returns the failed checks (empty: every check passed).
pub fn run(o: &Options) -> Result<Vec<String>, AppError> {
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
        .create_cq(64, false)
        .map_err(|e| verbs("creating the CQ", e))?;
    let caps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = pd
        .create_qp(&cq, &cq, caps)
        .map_err(|e| verbs("creating the QP", e))?;
    let buf = pd
        .alloc_buffer(BUF, Access::ALL)
        .map_err(|e| verbs("registering the buffer", e))?;
    let initiator = o.initiator.is_some();
    let pattern: Vec<u8> = (0..BUF)
        .map(|i| {
            if initiator {
                initiator_byte(i)
            } else {
                target_byte(i)
            }
        })
        .collect();
    buf.write(0, &pattern);
    if !initiator {
        buf.write(RECV_OFF, &[0u8; 8192]);
        buf.write_u64(CAS_OFF, 10);
        buf.write_u64(FADD_OFF, 100);
    }
    let mut s = Side { ctx, cq, qp, buf };
    let modify = |r: Result<(), pmd::ModifyError>, to: &str| {
        r.map_err(|e| AppError::Verbs(format!("moving the QP to {to}: {e}")))
    };
    modify(
        s.qp.modify(QpState::Init, &QpAttr::init(Access::ALL)),
        "INIT",
    )?;
    let rnr_plan = o.rnr_retry.is_some() || o.rnr_timer.is_some();
    if !initiator && !rnr_plan {
        s.post_recv(1, RECV_OFF)?;
        s.post_recv(2, RECV_OFF)?;
        s.post_recv(3, RECV_OFF + 4096)?;
    }
    let me = Dest {
        qpn: s.qp.qpn(),
        psn: pmd::random_psn(),
        rkey: s.buf.rkey(),
        addr: s.buf.addr(),
        gid,
    };
    let io = |what: &str, e: std::io::Error| AppError::Peer(format!("{what}: {e}"));
    let mut stream = match o.initiator {
        Some(ip) => {
            let addr = SocketAddr::new(ip, PORT);
            let t0 = Instant::now();
            loop {
                match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                    Ok(st) => break st,
                    Err(_) if t0.elapsed() < Duration::from_secs(60) => {
                        std::thread::sleep(Duration::from_millis(200))
                    }
                    Err(e) => return Err(io(&format!("connecting to {addr}"), e)),
                }
            }
        }
        None => {
            let l = TcpListener::bind(("0.0.0.0", PORT))
                .map_err(|e| io(&format!("listening on {PORT}"), e))?;
            l.accept().map_err(|e| io("accepting", e))?.0
        }
    };
    if initiator {
        stream
            .write_all(me.encode().as_bytes())
            .map_err(|e| io("sending our attributes", e))?;
    }
    let peer = Dest::decode(&s.read_line(&mut stream)?)?;
    let mut rtr = QpAttr::rtr(
        AddressVector::to_gid(peer.gid),
        peer.qpn,
        peer.psn,
        Mtu::Mtu1024,
    );
    if let Some(t) = o.rnr_timer {
        rtr.min_rnr_timer = Some(t);
    }
    modify(s.qp.modify(QpState::Rtr, &rtr), "RTR")?;
    let mut rts = QpAttr::rts(me.psn);
    rts.timeout = Some(14);
    rts.retry_cnt = Some(7);
    if let Some(n) = o.rnr_retry {
        rts.rnr_retry = Some(n);
    }
    modify(s.qp.modify(QpState::Rts, &rts), "RTS")?;
    if !initiator {
        stream
            .write_all(me.encode().as_bytes())
            .map_err(|e| io("sending our attributes", e))?;
    }

    let mut failed = Vec::new();
    if rnr_plan {
        match o.rnr_retry {
            Some(n) => rnr_initiator(&mut s, &mut stream, n, &mut failed)?,
            None => rnr_target(&mut s, &mut stream, o.rnr_post_ms, &mut failed)?,
        }
    } else if initiator {
        let remote = |off: usize| Remote {
            addr: peer.addr + off as u64,
            rkey: peer.rkey,
        };
        let ops: [(SendOp, usize, usize); 7] = [
            (
                SendOp::Write {
                    remote: remote(WRITE_OFF),
                },
                WRITE_OFF,
                WRITE_LEN,
            ),
            (
                SendOp::WriteImm {
                    remote: remote(WIMM_OFF),
                    imm: IMM_WIMM,
                },
                WIMM_OFF,
                WIMM_LEN,
            ),
            (SendOp::Send, 0, SEND_LEN),
            (SendOp::SendImm { imm: IMM_SIMM }, SIMM_SRC, SIMM_LEN),
            (
                SendOp::Read {
                    remote: remote(READ_OFF),
                },
                READ_DST,
                READ_LEN,
            ),
            (
                SendOp::CompareSwap {
                    remote: remote(CAS_OFF),
                    compare: 10,
                    swap: 20,
                },
                ATOMIC_DST,
                8,
            ),
            (
                SendOp::FetchAdd {
                    remote: remote(FADD_OFF),
                    add: 5,
                },
                ATOMIC_DST + 8,
                8,
            ),
        ];
        for (i, (op, off, len)) in ops.iter().enumerate() {
            let sge = s.buf.sge(*off, *len as u32);
            s.qp.post_send(&SendWr::new(i as u64, *op, &[sge]).signaled())
                .map_err(|e| AppError::Verbs(format!("posting {op:?}: {e}")))?;
            s.qp.ring_doorbell();
            let wc = s.wait()?;
            if wc.status != WcStatus::Success || wc.opcode != op.wc_opcode() {
                failed.push(format!("{op:?} completed as {wc:?}"));
            }
        }
        let mut got = vec![0u8; READ_LEN];
        s.buf.read(READ_DST, &mut got);
        if let Some(i) = (0..READ_LEN).find(|&i| got[i] != target_byte(READ_OFF + i)) {
            failed.push(format!(
                "READ byte {i} is {}, expected {}",
                got[i],
                target_byte(READ_OFF + i)
            ));
        }
        let (cas, fadd) = (s.buf.read_u64(ATOMIC_DST), s.buf.read_u64(ATOMIC_DST + 8));
        if (cas, fadd) != (10, 100) {
            failed.push(format!(
                "the atomics returned {cas} and {fadd}, expected 10 and 100"
            ));
        }
        // Two atomics outstanding at once.
        let pair = [
            (
                SendOp::CompareSwap {
                    remote: remote(CAS_OFF),
                    compare: 20,
                    swap: 30,
                },
                ATOMIC_DST + 16,
            ),
            (
                SendOp::FetchAdd {
                    remote: remote(FADD_OFF),
                    add: 7,
                },
                ATOMIC_DST + 24,
            ),
        ];
        for (i, (op, off)) in pair.iter().enumerate() {
            let sge = s.buf.sge(*off, 8);
            s.qp.post_send(&SendWr::new(100 + i as u64, *op, &[sge]).signaled())
                .map_err(|e| AppError::Verbs(format!("posting {op:?}: {e}")))?;
        }
        s.qp.ring_doorbell();
        for (op, _) in &pair {
            let wc = s.wait()?;
            if wc.status != WcStatus::Success || wc.opcode != op.wc_opcode() {
                failed.push(format!("{op:?} (two outstanding) completed as {wc:?}"));
            }
        }
        let (cas, fadd) = (
            s.buf.read_u64(ATOMIC_DST + 16),
            s.buf.read_u64(ATOMIC_DST + 24),
        );
        if (cas, fadd) != (20, 105) {
            failed.push(format!(
                "two atomics outstanding returned {cas} and {fadd}, expected 20 and 105"
            ));
        }
        stream
            .write_all(b"done\n")
            .map_err(|e| io("sending done", e))?;
        let line = s.read_line(&mut stream)?;
        if line.trim_end() != "target ok" {
            failed.push(format!("the target says {:?}", line.trim_end()));
        }
    } else {
        let mut wcs = Vec::new();
        for _ in 0..3 {
            wcs.push(s.wait()?);
        }
        let expect = [
            (WcOpcode::RecvRdmaWithImm, None, Some(IMM_WIMM)),
            (WcOpcode::Recv, Some(SEND_LEN as u32), None),
            (WcOpcode::Recv, Some(SIMM_LEN as u32), Some(IMM_SIMM)),
        ];
        for (wc, (opcode, len, imm)) in wcs.iter().zip(expect) {
            let len_ok = len.is_none_or(|l| wc.byte_len == l);
            if wc.status != WcStatus::Success || wc.opcode != opcode || wc.imm != imm || !len_ok {
                failed.push(format!(
                    "expected {opcode:?} (length {len:?}, immediate {imm:?}), got {wc:?}"
                ));
            }
        }
        let line = s.read_line(&mut stream)?;
        if line.trim_end() != "done" {
            failed.push(format!("the initiator says {:?}", line.trim_end()));
        }
        let mut check = |what: &str, at: usize, len: usize, src: usize| {
            let mut got = vec![0u8; len];
            s.buf.read(at, &mut got);
            if let Some(i) = (0..len).find(|&i| got[i] != initiator_byte(src + i)) {
                failed.push(format!("{what}: byte {i} is {}", got[i]));
            }
        };
        check("WRITE", WRITE_OFF, WRITE_LEN, WRITE_OFF);
        check("WRITE_WITH_IMM", WIMM_OFF, WIMM_LEN, WIMM_OFF);
        check("SEND", RECV_OFF, SEND_LEN, 0);
        check("SEND_WITH_IMM", RECV_OFF + 4096, SIMM_LEN, SIMM_SRC);
        let (cas, fadd) = (s.buf.read_u64(CAS_OFF), s.buf.read_u64(FADD_OFF));
        if (cas, fadd) != (30, 112) {
            failed.push(format!(
                "the atomics left {cas} and {fadd}, expected 30 and 112"
            ));
        }
        let verdict: &[u8] = if failed.is_empty() {
            b"target ok\n"
        } else {
            b"target failed\n"
        };
        stream
            .write_all(verdict)
            .map_err(|e| io("sending the verdict", e))?;
    }
    s.linger();
    Ok(failed)
}

/// The initiator of the RNR plan: one SEND of 3000 bytes with RNR retry count `rnr_retry`;
/// it must succeed when that is 7 (for ever) and end in RNR_RETRY_EXC_ERR otherwise (the
/// target never posts its receive then).
fn rnr_initiator(
    s: &mut Side,
    stream: &mut TcpStream,
    rnr_retry: u8,
    failed: &mut Vec<String>,
) -> Result<(), AppError> {
    let sge = s.buf.sge(0, SEND_LEN as u32);
    s.qp.post_send(&SendWr::new(1, SendOp::Send, &[sge]).signaled())
        .map_err(|e| AppError::Verbs(format!("posting the SEND: {e}")))?;
    s.qp.ring_doorbell();
    let t0 = Instant::now();
    let wc = s.wait()?;
    let expected = if rnr_retry == 7 {
        WcStatus::Success
    } else {
        WcStatus::RnrRetryExcErr
    };
    if wc.status == expected {
        println!(
            "RCOPS rnr: SEND with rnr_retry {rnr_retry} completed with {:?} after {} ms",
            wc.status,
            t0.elapsed().as_millis()
        );
    } else {
        failed.push(format!(
            "SEND with rnr_retry {rnr_retry}: expected {expected:?}, got {wc:?}"
        ));
    }
    stream
        .write_all(b"done\n")
        .map_err(|e| AppError::Peer(format!("sending done: {e}")))?;
    let line = s.read_line(stream)?;
    if line.trim_end() != "target ok" {
        failed.push(format!("the target says {:?}", line.trim_end()));
    }
    Ok(())
}

/// The target of the RNR plan: no receive until `post_ms` after the exchange (never without
/// it); then the SEND must arrive whole, or, never posted, nothing at all.
fn rnr_target(
    s: &mut Side,
    stream: &mut TcpStream,
    post_ms: Option<u64>,
    failed: &mut Vec<String>,
) -> Result<(), AppError> {
    let mut wcs = [WorkCompletion::EMPTY; 1];
    if let Some(ms) = post_ms {
        let end = Instant::now() + Duration::from_millis(ms);
        while Instant::now() < end {
            s.ctx.progress();
        }
        s.post_recv(1, RECV_OFF)?;
        let wc = s.wait()?;
        if wc.status != WcStatus::Success
            || wc.opcode != WcOpcode::Recv
            || wc.byte_len != SEND_LEN as u32
        {
            failed.push(format!("expected the SEND's receive, got {wc:?}"));
        }
    }
    let line = s.read_line(stream)?;
    if line.trim_end() != "done" {
        failed.push(format!("the initiator says {:?}", line.trim_end()));
    }
    if post_ms.is_some() {
        let mut got = vec![0u8; SEND_LEN];
        s.buf.read(RECV_OFF, &mut got);
        match (0..SEND_LEN).find(|&i| got[i] != initiator_byte(i)) {
            Some(i) => failed.push(format!("SEND after RNR: byte {i} is {}", got[i])),
            None => println!("RCOPS rnr: receive posted late, {SEND_LEN} bytes checked"),
        }
    } else if s.cq.poll(&mut wcs) != 0 {
        failed.push(format!("no receive was posted, yet {:?}", wcs[0]));
    } else {
        println!("RCOPS rnr: no receive posted, none completed");
    }
    let verdict: &[u8] = if failed.is_empty() {
        b"target ok\n"
    } else {
        b"target failed\n"
    };
    stream
        .write_all(verdict)
        .map_err(|e| AppError::Peer(format!("sending the verdict: {e}")))
}

/// The binary: prints `RCOPS ok` and exits 0 when every check passed, else names each failure.
pub fn main() -> std::process::ExitCode {
    let o = Options::parse();
    if o.initiator.is_none() && !o.target {
        eprintln!("shift_rc_ops: --initiator HOST or --target");
        return std::process::ExitCode::from(2);
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();
    match run(&o) {
        Ok(failed) if failed.is_empty() => {
            println!("RCOPS ok");
            std::process::ExitCode::SUCCESS
        }
        Ok(failed) => {
            for f in &failed {
                println!("RCOPS FAIL: {f}");
            }
            std::process::ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("shift_rc_ops: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exchange_line_round_trips_and_a_bad_one_is_named() {
        let d = Dest {
            qpn: 0x11,
            psn: 0xabcdef,
            rkey: 0x1234_5601,
            addr: 0x7f00_dead_b000,
            gid: Gid::from_ip("198.18.9.1".parse().unwrap()),
        };
        let line = d.encode();
        assert_eq!(
            line,
            "000011 abcdef 12345601 00007f00deadb000 00000000000000000000ffffc6120901\n"
        );
        assert_eq!(Dest::decode(&line).unwrap(), d);
        for (bad, what) in [
            ("000011 abcdef 12345601", "not QPN"),
            (
                "00001g abcdef 12345601 0 00000000000000000000ffffc6120901",
                "QPN",
            ),
            (
                "000011 abcdef 12345601 0 0000000000000000000éffffc6120901",
                "GID",
            ),
        ] {
            let e = Dest::decode(bad).unwrap_err().to_string();
            assert!(e.contains(what), "{bad}: {e}");
        }
    }

    #[test]
    fn the_rnr_options_belong_to_their_side_and_range() {
        let parse = |args: &[&str]| {
            Options::try_parse_from([&["shift_rc_ops", "-d", "soft:lo"], args].concat())
        };
        let o = parse(&["--initiator", "198.18.9.2", "--rnr-retry", "3"]).unwrap();
        assert_eq!(o.rnr_retry, Some(3));
        let o = parse(&["--target", "--rnr-timer", "16", "--rnr-post-ms", "200"]).unwrap();
        assert_eq!((o.rnr_timer, o.rnr_post_ms), (Some(16), Some(200)));
        for bad in [
            &["--initiator", "198.18.9.2", "--rnr-retry", "8"][..],
            &["--target", "--rnr-retry", "3"],
            &["--initiator", "198.18.9.2", "--rnr-timer", "16"],
            &["--target", "--rnr-timer", "32"],
            &["--target", "--rnr-post-ms", "200"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn the_two_patterns_differ_everywhere_in_the_checked_ranges() {
        // A WRITE that did not happen would leave the target's own bytes: they must differ.
        for i in 0..BUF {
            assert_ne!(initiator_byte(i), target_byte(i), "byte {i}");
        }
    }
}
