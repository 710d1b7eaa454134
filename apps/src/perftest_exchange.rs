//! Stock perftest's out-of-band exchange (`--perftest-peer`), so `shift_write_bw` and friends
//! pair with `ib_write_bw` and friends from linux-rdma/perftest, either side serving.
//!
//! What goes over TCP (perftest 6.06, Debian's `perftest` 4.5+0.17, `src/perftest_communication.c`
//! and the tools' `main`s), on the server's port (`-p`, 18515), one QP, RoCE (GIDs always):
//!
//! 1. Every message is an exchange in lockstep: the client writes its message, then reads the
//!    server's; the server reads, then writes. Each message is read whole in one `read`, so
//!    each is written in one piece.
//! 2. [`Version`]: 16 bytes, the version text ("6.06") padded with NULs. A peer below 5.70 is
//!    refused (as perftest does).
//! 3. System data: the cycle buffer (page size, 4096) and then the cache line size (64), each a
//!    4-byte big-endian int, exchanged one after the other ([`BeU32`]). Both sides use the
//!    larger of each.
//! 4. MTU: the `enum ibv_mtu` value as decimal text and a NUL, 2 bytes ([`MtuMsg`]); both use
//!    the smaller valid one.
//! 5. The QP's keys ([`Keys`]): 108 bytes of text, `LID:OUT_READS:QPN:PSN:RKEY:VADDR:GID:SRQN:`
//!    in hex, and a NUL. The same message is exchanged again each time the tools synchronise
//!    (perftest's `ctx_hand_shake`); how many times, and where, depends on the tool
//!    ([`Script`]).
//! 6. Bandwidth tools that only the client measures (WRITE, READ, atomics) then exchange the
//!    client's result ([`BwReport`]): size and iterations as big-endian u64, peak and average
//!    bandwidth and the message rate as big-endian IEEE doubles, each field its own exchange.
//!    The server prints the client's.
//! 7. Closing: one more key exchange, then each side writes "done" and its NUL (5 bytes) and
//!    closes; neither reads the other's (we do, briefly, so our close is clean).
//!
//! The peer's buffer is `vaddr .. vaddr + max(size, cycle buffer)`: perftest's requester walks
//! the cycle buffer in cache-line steps when the message is at most half of it.
//!
//! Our wording and layout; the formats are perftest's, derived from its C source.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Shutdown, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use pmd::{Gid, Mtu};

use crate::cli::Tool;
use crate::exchange::ExchangeError;

/// The perftest version we speak (and say we are).
pub const SPOKEN_VERSION: &str = "6.06";
/// The oldest version perftest 6.06 accepts as a peer.
const MIN_VERSION: f64 = 5.70;
/// The cycle buffer we announce: the page size.
pub const CYCLE_BUFFER: u32 = 4096;
/// The cache line size we announce.
pub const CACHE_LINE: u32 = 64;
/// perftest's closing word, with its NUL.
pub const DONE: &[u8; 5] = b"done\0";

fn malformed(what: String) -> ExchangeError {
    ExchangeError::Malformed(format!("perftest exchange: {what}"))
}

/// The version message: 16 bytes, text padded with NULs.
#[derive(Debug, Clone, PartialEq)]
pub struct Version {
    /// The text before the first NUL.
    pub text: String,
}

impl Version {
    /// Bytes on the wire.
    pub const LEN: usize = 16;

    /// The version this side speaks.
    pub fn ours() -> Version {
        Version {
            text: SPOKEN_VERSION.to_owned(),
        }
    }

    /// Emits the 16 bytes (text of at most 15 bytes).
    pub fn emit(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        let n = self.text.len().min(Self::LEN - 1);
        out[..n].copy_from_slice(&self.text.as_bytes()[..n]);
        out
    }

    /// Parses the peer's 16 bytes.
    pub fn parse(bytes: &[u8]) -> Result<Version, ExchangeError> {
        if bytes.len() != Self::LEN {
            return Err(malformed(format!("a version of {} bytes", bytes.len())));
        }
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(Self::LEN);
        let text = std::str::from_utf8(&bytes[..end])
            .map_err(|_| malformed(format!("version bytes {:02x?}", &bytes[..end])))?;
        Ok(Version {
            text: text.to_owned(),
        })
    }

    /// The number perftest compares (`atof`): the leading digits and one dot.
    pub fn number(&self) -> f64 {
        let mut seen_dot = false;
        let lead: String = self
            .text
            .chars()
            .take_while(|c| {
                c.is_ascii_digit()
                    || (*c == '.' && !seen_dot && {
                        seen_dot = true;
                        true
                    })
            })
            .collect();
        lead.parse().unwrap_or(0.0)
    }

    /// Refuses a peer perftest itself would refuse.
    pub fn check_compatible(&self) -> Result<(), ExchangeError> {
        if self.number() < MIN_VERSION {
            return Err(ExchangeError::Mismatch {
                what: "perftest version",
                ours: SPOKEN_VERSION.to_owned(),
                theirs: format!(
                    "{:?} (below {MIN_VERSION:.2}, which perftest refuses)",
                    self.text
                ),
            });
        }
        Ok(())
    }
}

/// A 4-byte big-endian int (the cycle buffer, the cache line size).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BeU32(pub u32);

impl BeU32 {
    /// Bytes on the wire.
    pub const LEN: usize = 4;

    /// The 4 bytes.
    pub fn emit(self) -> [u8; Self::LEN] {
        self.0.to_be_bytes()
    }

    /// Parses 4 bytes.
    pub fn parse(bytes: &[u8]) -> Result<BeU32, ExchangeError> {
        let b: [u8; 4] = bytes
            .try_into()
            .map_err(|_| malformed(format!("an int of {} bytes", bytes.len())))?;
        Ok(BeU32(u32::from_be_bytes(b)))
    }
}

/// The MTU message: the `enum ibv_mtu` value (1 = 256 .. 5 = 4096) as one decimal digit and
/// a NUL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MtuMsg(pub Mtu);

impl MtuMsg {
    /// Bytes on the wire (perftest sends 2 to peers of version 5.31 and later).
    pub const LEN: usize = 2;

    /// The 2 bytes.
    pub fn emit(self) -> [u8; Self::LEN] {
        [b'0' + self.0 as u8, 0]
    }

    /// Parses the peer's: `None` for a value that is not an MTU (perftest then keeps its own).
    pub fn parse(bytes: &[u8]) -> Option<MtuMsg> {
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        let v: u32 = std::str::from_utf8(&bytes[..end]).ok()?.parse().ok()?;
        mtu_of_enum(v).map(MtuMsg)
    }
}

/// The MTU of `enum ibv_mtu` value `v` (1 = 256 bytes .. 5 = 4096).
pub fn mtu_of_enum(v: u32) -> Option<Mtu> {
    (1..=5)
        .contains(&v)
        .then(|| crate::endpoint::mtu_of(128 << v))
        .flatten()
}

/// One QP's keys, perftest's `struct pingpong_dest` as text (`KEY_PRINT_FMT_GID`):
/// `%04x:%04x:%06x:%06x:%08x:%016llx:` then the GID's 16 bytes as `%02x:` each, then
/// `%08x:` and a NUL, 108 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keys {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// READs and atomics this side's responder takes outstanding (the peer's requester
    /// limit).
    pub out_reads: u16,
    /// QP number.
    pub qpn: u32,
    /// First PSN.
    pub psn: u32,
    /// rkey of the buffer.
    pub rkey: u32,
    /// Where the peer may WRITE, READ and do atomics.
    pub vaddr: u64,
    /// GID.
    pub gid: Gid,
    /// SRQ number (XRC, DC; 0 here).
    pub srqn: u32,
}

impl Keys {
    /// Bytes on the wire.
    pub const LEN: usize = 108;

    /// The 108 bytes.
    pub fn emit(&self) -> [u8; Self::LEN] {
        let mut text = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid,
            self.out_reads,
            self.qpn & 0xff_ffff,
            self.psn & 0xff_ffff,
            self.rkey,
            self.vaddr
        );
        for b in self.gid.0 {
            text.push_str(&format!("{b:02x}:"));
        }
        text.push_str(&format!("{:08x}:", self.srqn));
        let mut out = [0u8; Self::LEN];
        out[..text.len()].copy_from_slice(text.as_bytes());
        out
    }

    /// Parses the peer's 108 bytes; a field that is not what the format says is an error
    /// naming it.
    pub fn parse(bytes: &[u8]) -> Result<Keys, ExchangeError> {
        if bytes.len() != Self::LEN {
            return Err(malformed(format!("keys of {} bytes", bytes.len())));
        }
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        let text = std::str::from_utf8(&bytes[..end])
            .map_err(|_| malformed("keys that are not ASCII".into()))?;
        let fields: Vec<&str> = text.split(':').collect();
        // 6 fields, 16 GID bytes, the SRQN, and the empty tail after the last colon.
        if fields.len() != 24 || !fields[23].is_empty() {
            return Err(malformed(format!(
                "keys {text:?}: not 23 colon-terminated fields"
            )));
        }
        let hex = |i: usize, what: &str, digits: usize| -> Result<u64, ExchangeError> {
            let f = fields[i];
            if f.len() != digits || !f.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(malformed(format!(
                    "{what} {f:?} is not {digits} hex digits"
                )));
            }
            u64::from_str_radix(f, 16).map_err(|_| malformed(what.into()))
        };
        let mut gid = [0u8; 16];
        for (k, b) in gid.iter_mut().enumerate() {
            *b = hex(6 + k, "a GID byte", 2)? as u8;
        }
        Ok(Keys {
            lid: hex(0, "the LID", 4)? as u16,
            out_reads: hex(1, "out_reads", 4)? as u16,
            qpn: hex(2, "the QPN", 6)? as u32,
            psn: hex(3, "the PSN", 6)? as u32,
            rkey: hex(4, "the rkey", 8)? as u32,
            vaddr: hex(5, "the address", 16)?,
            gid: Gid(gid),
            srqn: hex(22, "the SRQN", 8)? as u32,
        })
    }
}

/// A bandwidth result as perftest's `xchg_bw_reports` sends it; each field is its own 8-byte
/// big-endian exchange. Bandwidths are in the sender's unit (MB/s = MiB/s, or Gb/s with
/// `--report_gbits`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BwReport {
    /// Message size, bytes.
    pub size: u64,
    /// Iterations.
    pub iters: u64,
    /// Peak bandwidth.
    pub bw_peak: f64,
    /// Average bandwidth.
    pub bw_avg: f64,
    /// Message rate, Mpps.
    pub msg_rate: f64,
}

impl BwReport {
    /// The five fields' bytes, in the order they are exchanged.
    pub fn emit(&self) -> [[u8; 8]; 5] {
        [
            self.size.to_be_bytes(),
            self.iters.to_be_bytes(),
            self.bw_peak.to_bits().to_be_bytes(),
            self.bw_avg.to_bits().to_be_bytes(),
            self.msg_rate.to_bits().to_be_bytes(),
        ]
    }

    /// The report from its five fields.
    pub fn parse(fields: &[[u8; 8]; 5]) -> BwReport {
        let f = |i: usize| f64::from_bits(u64::from_be_bytes(fields[i]));
        BwReport {
            size: u64::from_be_bytes(fields[0]),
            iters: u64::from_be_bytes(fields[1]),
            bw_peak: f(2),
            bw_avg: f(3),
            msg_rate: f(4),
        }
    }
}

/// How one tool's exchange goes after the setup (version, system data, MTU), counted in key
/// exchanges, as each perftest tool's `main` does them (one QP, not bidirectional).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Script {
    /// Key exchanges before the traffic starts (the QPs come up after the first).
    pub before_run: u32,
    /// After the traffic: one key exchange, then the client's result (WRITE, READ, atomic
    /// bandwidth).
    pub reports: bool,
    /// A closing key exchange and "done" (all but `ib_write_lat`, which just exits).
    pub close: bool,
    /// The server closes at once after the last setup exchange, waiting there for the
    /// client's end (`ib_read_lat`).
    pub server_closes_early: bool,
}

impl Script {
    /// The script of `tool`.
    pub fn of(tool: Tool) -> Script {
        let base = Script {
            before_run: 4,
            reports: false,
            close: true,
            server_closes_early: false,
        };
        match tool {
            Tool::WriteBw | Tool::ReadBw | Tool::AtomicBw => Script {
                before_run: 3,
                reports: true,
                ..base
            },
            Tool::WriteLat => Script {
                close: false,
                ..base
            },
            Tool::ReadLat => Script {
                server_closes_early: true,
                ..base
            },
            _ => base,
        }
    }
}

/// The extent of a perftest peer's buffer from its `vaddr`: `max(size, cycle buffer)`.
pub fn peer_buffer_len(size: usize, cycle_buffer: u32) -> u64 {
    (size as u64).max(u64::from(cycle_buffer))
}

/// The IP address a GID stands for, as text (railshift's `QpInfo` form).
pub fn gid_text(gid: Gid) -> String {
    let ip: IpAddr = gid.to_ip();
    ip.to_string()
}

/// The out-of-band TCP connection to a perftest peer, after version, system data and MTU.
#[derive(Debug)]
pub struct PerftestLink {
    stream: TcpStream,
    client: bool,
    /// Bytes read ahead by [`PerftestLink::poll`].
    pending: Vec<u8>,
    /// The peer's version.
    pub peer_version: Version,
    /// The cycle buffer both use.
    pub cycle_buffer: u32,
    /// The cache line size both use.
    pub cache_line: u32,
    /// The path MTU both use.
    pub mtu: Mtu,
    /// The exchange of this tool.
    pub script: Script,
    /// Our keys, once sent.
    pub ours: Option<Keys>,
}

/// How long a client keeps trying to reach a server that does not listen yet.
const CONNECT_RETRY: Duration = Duration::from_secs(60);

impl PerftestLink {
    /// Connects to a perftest server (retrying while it does not listen yet, as it may still
    /// be starting) or accepts one perftest client, then runs the setup: version, system data,
    /// MTU (`wanted`).
    pub fn open(
        tool: Tool,
        host: Option<&str>,
        port: u16,
        wanted: Mtu,
    ) -> Result<PerftestLink, ExchangeError> {
        let stream = match host {
            Some(h) => crate::exchange::connect_stream(h, port, CONNECT_RETRY)?,
            None => {
                let listener = TcpListener::bind(("0.0.0.0", port))
                    .map_err(|source| ExchangeError::Listen { port, source })?;
                crate::exchange::print_waiting();
                listener.accept()?.0
            }
        };
        stream.set_nodelay(true)?;
        let mut link = PerftestLink {
            stream,
            client: host.is_some(),
            pending: Vec::new(),
            peer_version: Version::ours(),
            cycle_buffer: CYCLE_BUFFER,
            cache_line: CACHE_LINE,
            mtu: wanted,
            script: Script::of(tool),
            ours: None,
        };
        let mut nothing = || {};
        let v = link.xchg(&Version::ours().emit(), Version::LEN, &mut nothing)?;
        link.peer_version = Version::parse(&v)?;
        link.peer_version.check_compatible()?;
        let c = link.xchg(&BeU32(CYCLE_BUFFER).emit(), BeU32::LEN, &mut nothing)?;
        link.cycle_buffer = BeU32::parse(&c)?.0.max(CYCLE_BUFFER);
        let l = link.xchg(&BeU32(CACHE_LINE).emit(), BeU32::LEN, &mut nothing)?;
        link.cache_line = BeU32::parse(&l)?.0.max(CACHE_LINE);
        let m = link.xchg(&MtuMsg(wanted).emit(), MtuMsg::LEN, &mut nothing)?;
        if let Some(MtuMsg(theirs)) = MtuMsg::parse(&m) {
            link.mtu = link.mtu.min(theirs);
        }
        Ok(link)
    }

    /// Sends our keys and reads the peer's (a synchronisation point of perftest's).
    pub fn keys(&mut self, ours: &Keys, tick: &mut dyn FnMut()) -> Result<Keys, ExchangeError> {
        self.ours = Some(*ours);
        let theirs = self.xchg(&ours.emit(), Keys::LEN, tick)?;
        Keys::parse(&theirs)
    }

    /// One more key exchange with the keys sent before.
    pub fn sync(&mut self, tick: &mut dyn FnMut()) -> Result<(), ExchangeError> {
        let ours = self
            .ours
            .ok_or_else(|| malformed("a synchronisation before our keys were sent".into()))?;
        self.keys(&ours, tick).map(|_| ())
    }

    /// Whether the peer's next key message has arrived (without waiting): a server learns
    /// so that the client finished its traffic. The message is kept for [`PerftestLink::sync`].
    pub fn peer_synced(&mut self) -> Result<bool, ExchangeError> {
        self.fill(false)?;
        Ok(self.pending.len() >= Keys::LEN)
    }

    /// The result exchange of the bandwidth tools: ours out, the peer's in, field by field.
    pub fn reports(
        &mut self,
        ours: &BwReport,
        tick: &mut dyn FnMut(),
    ) -> Result<BwReport, ExchangeError> {
        let mut theirs = [[0u8; 8]; 5];
        for (field, out) in ours.emit().iter().zip(theirs.iter_mut()) {
            let got = self.xchg(field, 8, tick)?;
            out.copy_from_slice(&got);
        }
        Ok(BwReport::parse(&theirs))
    }

    /// perftest's close: a key exchange, "done" each way, then the connection closes.
    pub fn close(&mut self, tick: &mut dyn FnMut()) -> Result<(), ExchangeError> {
        self.sync(tick)?;
        self.write(DONE)?;
        // The peer writes its "done" and closes without reading ours; reading it lets ours
        // close without a reset. Whatever comes (or not) within a second is fine.
        let deadline = Instant::now() + Duration::from_secs(1);
        let _ = self.read_exact(DONE.len(), tick, Some(deadline));
        let _ = self.stream.shutdown(Shutdown::Both);
        Ok(())
    }

    /// Waits (driving the device with `tick`) until the peer closes the connection, at most
    /// `limit`: a tool that ends without a closing exchange (`ib_write_lat`) may still need
    /// our ACKs until it has its last completion.
    pub fn linger(&mut self, tick: &mut dyn FnMut(), limit: Duration) {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            match self.fill(true) {
                Err(_) => return,
                Ok(()) => tick(),
            }
        }
    }

    /// The lockstep exchange: the client writes, then reads; the server reads, then writes.
    fn xchg(
        &mut self,
        ours: &[u8],
        theirs_len: usize,
        tick: &mut dyn FnMut(),
    ) -> Result<Vec<u8>, ExchangeError> {
        // No deadline: a perftest server waits for the client's end of the traffic as long as
        // it lasts, and so do we; a peer that goes away ends the wait (end of stream).
        if self.client {
            self.write(ours)?;
            self.read_exact(theirs_len, tick, None)
        } else {
            let theirs = self.read_exact(theirs_len, tick, None)?;
            self.write(ours)?;
            Ok(theirs)
        }
    }

    /// Writes one message in one piece.
    fn write(&mut self, bytes: &[u8]) -> Result<(), ExchangeError> {
        self.stream.set_nonblocking(false)?;
        self.stream.write_all(bytes)?;
        Ok(())
    }

    /// Reads `n` bytes, calling `tick` while none come (the device must keep being driven:
    /// the peer may wait for our ACKs); an end of stream is [`ExchangeError::Closed`].
    fn read_exact(
        &mut self,
        n: usize,
        tick: &mut dyn FnMut(),
        deadline: Option<Instant>,
    ) -> Result<Vec<u8>, ExchangeError> {
        while self.pending.len() < n {
            if let Some(d) = deadline {
                if Instant::now() > d {
                    return Err(ExchangeError::Timeout(Duration::ZERO));
                }
            }
            self.fill(true)?;
            tick();
        }
        Ok(self.pending.drain(..n).collect())
    }

    /// Reads what has arrived; `wait` waits up to a millisecond for something.
    fn fill(&mut self, wait: bool) -> Result<(), ExchangeError> {
        let mut buf = [0u8; 512];
        if wait {
            self.stream.set_nonblocking(false)?;
            self.stream
                .set_read_timeout(Some(Duration::from_millis(1)))?;
        } else {
            self.stream.set_nonblocking(true)?;
        }
        match self.stream.read(&mut buf) {
            Ok(0) => Err(ExchangeError::Closed(" (perftest peer)".into())),
            Ok(k) => {
                self.pending.extend_from_slice(&buf[..k]);
                Ok(())
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `sprintf(msg, KEY_PRINT_FMT_GID, ...)` for LID 0, out_reads 16, QPN 0x11, PSN
    /// 0xabcdef, rkey 0x1234, vaddr 0x7f0000001000, GID ::ffff:198.18.9.1, SRQN 0, written out
    /// by hand from the format.
    const GOLDEN_KEYS: &[u8; 108] = b"0000:0010:000011:abcdef:00001234:00007f0000001000:\
00:00:00:00:00:00:00:00:00:00:ff:ff:c6:12:09:01:00000000:\0";

    fn keys() -> Keys {
        Keys {
            lid: 0,
            out_reads: 16,
            qpn: 0x11,
            psn: 0xabcdef,
            rkey: 0x1234,
            vaddr: 0x7f00_0000_1000,
            gid: Gid::from(std::net::Ipv4Addr::new(198, 18, 9, 1)),
            srqn: 0,
        }
    }

    #[test]
    fn keys_are_perftests_108_bytes() {
        assert_eq!(&keys().emit(), GOLDEN_KEYS);
        assert_eq!(Keys::parse(GOLDEN_KEYS).unwrap(), keys());
    }

    #[test]
    fn keys_with_a_bad_field_are_refused_by_name() {
        let mut bad = *GOLDEN_KEYS;
        bad[12] = b'x'; // inside the QPN
        let err = Keys::parse(&bad).unwrap_err().to_string();
        assert!(err.contains("the QPN"), "{err}");
        assert!(Keys::parse(&GOLDEN_KEYS[..59]).is_err());
        let mut short = [0u8; 108];
        short[..10].copy_from_slice(b"0000:0010:");
        assert!(Keys::parse(&short).is_err());
    }

    #[test]
    fn the_version_is_16_bytes_of_text_and_nuls() {
        let golden = *b"6.06\0\0\0\0\0\0\0\0\0\0\0\0";
        assert_eq!(Version::ours().emit(), golden);
        let v = Version::parse(&golden).unwrap();
        assert_eq!(v.number(), 6.06);
        assert!(v.check_compatible().is_ok());
        let old = Version::parse(b"5.60\0\0\0\0\0\0\0\0\0\0\0\0").unwrap();
        assert!(old.check_compatible().is_err());
        // atof reads "6.5.1" as 6.5.
        assert_eq!(
            Version {
                text: "6.5.1".into()
            }
            .number(),
            6.5
        );
    }

    #[test]
    fn system_data_and_mtu_are_perftests_bytes() {
        assert_eq!(BeU32(4096).emit(), [0, 0, 0x10, 0]);
        assert_eq!(BeU32::parse(&[0, 0, 0, 64]).unwrap(), BeU32(64));
        // sprintf("%d", IBV_MTU_1024) into a 2-byte message.
        assert_eq!(MtuMsg(Mtu::Mtu1024).emit(), *b"3\0");
        assert_eq!(MtuMsg::parse(b"5\0"), Some(MtuMsg(Mtu::Mtu4096)));
        assert_eq!(MtuMsg::parse(b"9\0"), None);
    }

    #[test]
    fn a_bandwidth_report_is_five_big_endian_fields() {
        let r = BwReport {
            size: 65536,
            iters: 1000,
            bw_peak: 1.5,
            bw_avg: 1.0,
            msg_rate: 0.25,
        };
        let f = r.emit();
        assert_eq!(f[0], [0, 0, 0, 0, 0, 1, 0, 0]);
        assert_eq!(f[1], [0, 0, 0, 0, 0, 0, 0x03, 0xe8]);
        // 1.5 = 0x3ff8000000000000, sent big-endian (perftest's bswap_double).
        assert_eq!(f[2], [0x3f, 0xf8, 0, 0, 0, 0, 0, 0]);
        assert_eq!(BwReport::parse(&f), r);
    }

    #[test]
    fn each_tool_synchronises_as_its_perftest_twin() {
        assert_eq!(Script::of(Tool::WriteBw).before_run, 3);
        assert!(Script::of(Tool::AtomicBw).reports);
        assert_eq!(Script::of(Tool::SendBw).before_run, 4);
        assert!(!Script::of(Tool::SendBw).reports);
        assert!(!Script::of(Tool::WriteLat).close);
        assert!(Script::of(Tool::ReadLat).server_closes_early);
        assert_eq!(peer_buffer_len(8, 4096), 4096);
        assert_eq!(peer_buffer_len(65536, 4096), 65536);
    }

    #[test]
    fn a_client_and_a_server_link_agree_on_the_setup() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let server = std::thread::spawn(move || {
            PerftestLink::open(Tool::WriteBw, None, port, Mtu::Mtu4096).unwrap()
        });
        let client =
            PerftestLink::open(Tool::WriteBw, Some("127.0.0.1"), port, Mtu::Mtu1024).unwrap();
        let server = server.join().unwrap();
        assert_eq!((client.mtu, server.mtu), (Mtu::Mtu1024, Mtu::Mtu1024));
        assert_eq!(client.peer_version.text, "6.06");
        assert_eq!(server.cycle_buffer, CYCLE_BUFFER);
    }
}
