//! The bandwidth tools: WRITE, SEND, READ and FETCH_ADD streams with `tx_depth` work
//! requests in flight, one signaled every `cq_mod`, and the server that answers them.
//!
//! `shift_write_bw --check` is NCCL-Simple-like traffic: each iteration writes its own
//! pattern into a slot of the server's buffer (one WRITE per 64 KiB) and then a zero-length
//! WRITE_WITH_IMM whose immediate is the iteration number. The server checks the order of the
//! immediates and the slot's bytes, and hands slots back with an 8-byte inline RDMA WRITE of
//! its checked count into the client's buffer (NCCL's receiver updates the sender's head the
//! same way), so the client never overwrites a slot the server has not checked.
//!
//! `shift_send_bw --check` sends iteration `i`'s pattern as SEND `i`. The server keeps one
//! receive per slot posted, so SEND `i` must land in receive `i` and slot `i mod slots`; it
//! checks the receive's number, the length and the bytes before it posts that slot's receive
//! again, and hands receives back with the same credit word, so the client never sends into
//! a receive the server has not posted (no RNR).
//!
//! `shift_read_bw --check` reads slots whose contents change under the client: after every
//! [`CHANGE_EVERY`] READs the client posts a fenced zero-length SEND, change `j`, and the
//! server answers it by rewriting slot `j mod slots` with that slot's next generation and
//! writing `j + 1` into the client's credit word. The client expects every READ to bring the
//! generation of the changes it had sent before the READ, so a READ that executed again after
//! a later change shows as wrong bytes. It reads a slot only once every
//! change of it is acknowledged, and the fence keeps a change behind every earlier READ, as
//! plain RC needs as well (a READ whose response is lost is executed again by the responder).

use std::time::Duration;

use pmd::{QpCaps, RecvWr, SendWr, WorkCompletion};

use crate::cli::{Options, Tool};
use crate::endpoint::{Conn, Memory};
use crate::error::AppError;
use crate::pattern;
use crate::report::{AtomicJson, CheckJson, ResultRow};
use crate::row::PeerRow;
use crate::session::Session;

mod check;
mod client;
mod server;

pub use client::{client, finish_client};
pub use server::server;

/// Largest WRITE of a `--check` iteration.
const CHUNK: usize = 64 * 1024;
/// Room at the end of the buffer for the credit word.
const CONTROL: usize = 64;
/// Buffers stay below this (slots shrink, down to two).
const MAX_BUFFER: usize = 64 << 20;
/// Receives the server keeps posted.
const RECV_DEPTH: u32 = 256;
/// A run that completes nothing for this long has lost its peer.
const STALL: Duration = Duration::from_secs(20);
/// `shift_read_bw --check`: READs between two changes of the server's buffer.
pub const CHANGE_EVERY: u64 = 8;

/// What a bandwidth run streams: the tool and `--check`, decided once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// `shift_write_bw`: WRITEs.
    Write,
    /// `shift_write_bw --check`: each iteration's pattern into a slot, then a zero-length
    /// WRITE_WITH_IMM the server checks it by; the client waits for the server's credits.
    CheckedWrite,
    /// `shift_send_bw`: SENDs into the server's receives.
    Send,
    /// `shift_send_bw --check`: SEND `i` brings iteration `i`'s pattern into receive `i`;
    /// the client waits for the server's credits.
    CheckedSend,
    /// `shift_read_bw`: READs.
    Read,
    /// `shift_read_bw --check`: READs of slots the server changes under the client, at the
    /// client's fenced change SENDs.
    ChangingRead,
    /// `shift_atomic_bw`: FETCH_ADDs on the server's first word.
    Atomic,
}

impl Stream {
    /// The stream of `tool` with or without `--check`; `None` for a tool that is not a
    /// bandwidth tool.
    pub fn of(tool: Tool, check: bool) -> Option<Stream> {
        Some(match (tool, check) {
            (Tool::WriteBw, false) => Stream::Write,
            (Tool::WriteBw, true) => Stream::CheckedWrite,
            (Tool::SendBw, false) => Stream::Send,
            (Tool::SendBw, true) => Stream::CheckedSend,
            (Tool::ReadBw, false) => Stream::Read,
            (Tool::ReadBw, true) => Stream::ChangingRead,
            // The options refuse --check for it.
            (Tool::AtomicBw, _) => Stream::Atomic,
            _ => return None,
        })
    }

    /// Whether `--check` verifies it.
    pub fn checked(self) -> bool {
        matches!(
            self,
            Stream::CheckedWrite | Stream::CheckedSend | Stream::ChangingRead
        )
    }

    /// Whether it consumes the server's receives with SENDs, one per iteration, into the
    /// slots.
    fn sends(self) -> bool {
        matches!(self, Stream::Send | Stream::CheckedSend)
    }

    /// Whether the server keeps receives posted: for SENDs, notifications, change SENDs.
    fn server_receives(self) -> bool {
        !matches!(self, Stream::Write | Stream::Read | Stream::Atomic)
    }
}

/// The shape of a bandwidth run, the same on both sides.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    /// What is streamed.
    pub stream: Stream,
    /// Largest message.
    pub size: usize,
    /// Slots of `size` bytes in the buffer.
    pub slots: usize,
    /// WQEs per iteration.
    pub wqes_per_iter: u32,
    /// Iterations in flight at most.
    pub in_flight: u64,
    /// One signaled iteration every this many.
    pub cq_mod: u64,
    /// Receives the receiving side keeps posted per QP.
    pub recv_depth: u32,
    /// Under `--check` (WRITE, SEND): iterations the client may be ahead of the server's
    /// checked count (its credit word); 0 when the client does not wait for credits.
    pub credit_window: u64,
}

impl Layout {
    /// The layout `o` asks for; an error if `o`'s tool is not a bandwidth tool.
    pub fn of(o: &Options) -> Result<Layout, AppError> {
        let stream = Stream::of(o.tool, o.flags.check)
            .ok_or_else(|| AppError::Usage(format!("{} is not a bandwidth tool", o.tool.name())))?;
        let size = *o.sizes.iter().max().expect("at least one size");
        let wqes_per_iter = if stream == Stream::CheckedWrite {
            size.div_ceil(CHUNK) as u32 + 1
        } else {
            1
        };
        let tx = o.flags.tx_depth.max(wqes_per_iter);
        let in_flight = u64::from((tx / wqes_per_iter).max(1));
        // Under --check every QP's iterations share the slots (iteration i on QP i mod -q):
        // enough for each QP's window, as far as the buffer allows.
        let qps = if stream.checked() {
            o.flags.qps.max(1) as usize
        } else {
            1
        };
        let want = (2 * in_flight as usize * qps).max(8);
        let slots = (MAX_BUFFER / size).clamp(2, want.max(2));
        let in_flight = in_flight.min(slots as u64);
        // Every iteration is signaled under --check (its notification); otherwise -Q, or
        // perftest's 100, or less for a shallow queue. More than in flight would never signal.
        let cq_mod = if stream.checked() {
            1
        } else {
            o.flags
                .cq_mod
                .map_or((in_flight / 2).clamp(1, 100), u64::from)
                .min(in_flight)
        };
        // A checked SEND stream keeps one receive per slot posted, so a slot is reused only
        // after the server checked what its previous receive brought.
        let recv_depth = if stream == Stream::CheckedSend {
            RECV_DEPTH.min(slots as u32)
        } else {
            RECV_DEPTH
        };
        let credit_window = match stream {
            Stream::CheckedWrite => slots as u64,
            Stream::CheckedSend => u64::from(recv_depth),
            _ => 0,
        };
        Ok(Layout {
            stream,
            size,
            slots,
            wqes_per_iter,
            in_flight,
            cq_mod,
            recv_depth,
            credit_window,
        })
    }

    /// Buffer length: the slots and the control words.
    pub fn buffer_len(&self) -> usize {
        self.slots * self.size + CONTROL
    }

    /// Offset of the credit word (the server's checked count, in the client's buffer).
    pub fn credit_offset(&self) -> usize {
        self.slots * self.size
    }

    /// The QP's queues.
    pub fn caps(&self, o: &Options) -> QpCaps {
        // A checked READ stream adds one change SEND every CHANGE_EVERY iterations.
        let changes = if self.stream == Stream::ChangingRead {
            (self.in_flight / CHANGE_EVERY) as u32 + 1
        } else {
            0
        };
        let send = (self.in_flight as u32 * self.wqes_per_iter + changes + 16).next_power_of_two();
        QpCaps {
            max_send_wr: send,
            max_recv_wr: RECV_DEPTH,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: o.inline_size.max(16),
        }
    }
}

/// What a bandwidth side reports besides its rows.
#[derive(Debug, Default)]
pub struct BwOutcome {
    /// One row per size.
    pub rows: Vec<ResultRow>,
    /// What `--check` verified.
    pub check: Option<CheckJson>,
    /// Atomic counters.
    pub atomic: Option<AtomicJson>,
    /// The error that stopped the run.
    pub error: Option<AppError>,
    /// The peer's rows from its `done`: the client's for a server, the other direction's
    /// for `-b`.
    pub peer_rows: Vec<PeerRow>,
}

/// Describes a failed completion, with the failover's account of it.
pub fn completion_error(conn: &Conn, wc: &WorkCompletion, what: &str) -> AppError {
    let detail = conn
        .events()
        .last()
        .map(|e| format!(" (failover: {} {})", e.kind.as_str(), e.cause.as_str()))
        .unwrap_or_default();
    AppError::Completion {
        status: wc.status,
        vendor: wc.vendor_err,
        what: what.to_owned(),
        detail,
    }
}

fn signed(wr: SendWr<'_>, signal: bool) -> SendWr<'_> {
    if signal {
        wr.signaled()
    } else {
        wr
    }
}

/// The receives a side keeps posted on every QP: into the slots for SENDs, zero-length for
/// `--check` notifications (WRITE_WITH_IMM).
struct Receiver {
    layout: Layout,
    into_slots: bool,
    posted: Vec<u64>,
}

impl Receiver {
    fn new(layout: Layout, into_slots: bool, qps: usize) -> Receiver {
        Receiver {
            layout,
            into_slots,
            posted: vec![0; qps],
        }
    }

    /// Posts one more receive on QP `q`.
    fn post(&mut self, s: &mut Session, q: usize) -> Result<(), AppError> {
        let k = self.posted[q];
        let slot = (k % self.layout.slots as u64) as usize;
        let wr = if self.into_slots {
            let len = self.layout.size as u32;
            RecvWr::new(k, &[s.mem.sge(slot * self.layout.size, len)])
        } else {
            RecvWr::new(k, &[])
        };
        s.conns[q].post_recv(&wr)?;
        self.posted[q] += 1;
        Ok(())
    }

    /// Fills every QP's receive queue.
    fn fill(&mut self, s: &mut Session) -> Result<(), AppError> {
        for q in 0..self.posted.len() {
            while self.posted[q] < u64::from(self.layout.recv_depth) {
                self.post(s, q)?;
            }
        }
        Ok(())
    }
}

/// Fills the buffer before the peer can reach it: a `shift_read_bw --check` server's slots
/// hold the patterns the client's READs verify. (Filled after the exchange, a fast client
/// read slots the server had not written yet.)
pub fn prepare_buffer(o: &Options, mem: &Memory, layout: Layout) {
    if o.is_server() && layout.stream == Stream::ChangingRead {
        let mut slot = vec![0u8; layout.size];
        for k in 0..layout.slots {
            pattern::fill(&mut slot, k as u64);
            mem.write(k * layout.size, &slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{parse, Tool};

    fn layout(tool: Tool, args: &[&str]) -> Layout {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        Layout::of(&parse(tool, &args).unwrap()).unwrap()
    }

    #[test]
    fn cq_moderation_is_perftests_unless_given_and_never_above_what_is_in_flight() {
        assert_eq!(layout(Tool::WriteBw, &[]).cq_mod, 64, "min(100, 128 / 2)");
        assert_eq!(layout(Tool::WriteBw, &["-t", "512"]).cq_mod, 100);
        assert_eq!(layout(Tool::WriteBw, &["-Q", "1"]).cq_mod, 1);
        assert_eq!(layout(Tool::SendBw, &["-Q", "16"]).cq_mod, 16);
        let deep = layout(Tool::WriteBw, &["-Q", "1000"]);
        assert_eq!(deep.cq_mod, deep.in_flight);
        assert_eq!(layout(Tool::WriteBw, &["--check"]).cq_mod, 1);
    }

    #[test]
    fn the_stream_is_the_tool_and_its_check() {
        assert_eq!(
            layout(Tool::WriteBw, &["--check"]).stream,
            Stream::CheckedWrite
        );
        assert_eq!(layout(Tool::SendBw, &[]).stream, Stream::Send);
        assert_eq!(
            layout(Tool::ReadBw, &["--check"]).stream,
            Stream::ChangingRead
        );
        assert_eq!(layout(Tool::AtomicBw, &[]).stream, Stream::Atomic);
        assert_eq!(Stream::of(Tool::WriteLat, false), None);
    }
}
