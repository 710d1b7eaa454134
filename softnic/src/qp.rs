//! A QP as the device sees it: its rings, the WQEs fetched from the send ring, the requester,
//! completer and responder state, and what happens when it enters the error state.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hw_defs::mlx5::{data_seg, MAX_WQE_BYTES, SEND_WQE_BB, SEND_WQE_DS};

use crate::codec::{self, psn_delta, WqeError};
use crate::congestion::Window;
use crate::counters::Counters;
use crate::cq::{Cq, CqFull, CqId};
use crate::cqe::{CqeInfo, CqeKind};
use crate::dma::Sge;
use crate::events::{AsyncEvent, EventQueue};
use crate::memory::QueueMemory;
use crate::mr::{Access, PdId};
use crate::packet::AckKind;
use crate::path_budget::{PathBudgets, PathShare};
use crate::qp_attr::{QpAttrs, QpState, QpType};
use crate::resources::Resources;
use crate::srq::{self, SharedSrq};
use crate::waker::Waker;
use crate::wqe::SendWqe;

/// mlx5 CQE syndromes the device reports (`MLX5_CQE_SYNDROME_*`).
pub(crate) mod syndrome {
    pub const LOCAL_LENGTH: u8 = 0x01;
    pub const LOCAL_QP_OPERATION: u8 = 0x02;
    pub const LOCAL_PROTECTION: u8 = 0x04;
    pub const WR_FLUSH: u8 = 0x05;
    pub const REMOTE_INVALID_REQUEST: u8 = 0x12;
    pub const REMOTE_ACCESS: u8 = 0x13;
    pub const REMOTE_OPERATIONAL: u8 = 0x14;
    pub const TRANSPORT_RETRY_EXCEEDED: u8 = 0x15;
    pub const RNR_RETRY_EXCEEDED: u8 = 0x16;
}

/// What the driver gives `create_qp`.
#[derive(Debug)]
pub struct QpConfig {
    /// Protection domain.
    pub pd: PdId,
    /// CQ for send completions.
    pub send_cq: CqId,
    /// CQ for receive completions.
    pub recv_cq: CqId,
    /// Send ring: `sq_bbs * 64` bytes.
    pub sq: QueueMemory,
    /// Number of 64-byte basic blocks in the send ring, a power of two.
    pub sq_bbs: u32,
    /// Receive ring: `rq_wqes * rq_stride` bytes.
    pub rq: QueueMemory,
    /// Number of receive WQEs, a power of two.
    pub rq_wqes: u32,
    /// Bytes per receive WQE (16 x max receive SGEs, a power of two).
    pub rq_stride: u32,
    /// Doorbell record: 8 bytes, receive counter then send counter, big-endian.
    pub dbrec: QueueMemory,
    /// Largest inline payload the driver writes.
    pub max_inline: u32,
    /// Largest gather list of a send WQE.
    pub max_send_sge: u32,
    /// RC or UD: a UD QP's send WQEs carry a datagram segment, and it neither connects nor
    /// retransmits.
    pub qp_type: QpType,
}

/// The doorbell register of a QP (the UAR page of a ConnectX).
///
/// Writing it tells the device to read the doorbell record's send counter and fetch up to it.
/// It is a release store and, only when the engine sleeps, one eventfd write.
#[derive(Clone, Debug)]
pub struct DoorbellRegister {
    bell: Arc<Bell>,
    waker: Arc<Waker>,
}

/// What the doorbell register writes and the engine reads: whether it was rung, the last
/// value, and whether the QP's slot is queued in the waker's rung list.
#[derive(Debug)]
pub(crate) struct Bell {
    rung: AtomicBool,
    last: AtomicU64,
    queued: AtomicBool,
    /// The QP's slot in the device's table.
    slot: u32,
}

impl Bell {
    /// The QP's slot in the device's table.
    pub(crate) fn slot(&self) -> u32 {
        self.slot
    }

    pub(crate) fn new(slot: u32) -> Bell {
        Bell {
            rung: AtomicBool::new(false),
            last: AtomicU64::new(0),
            queued: AtomicBool::new(false),
            slot,
        }
    }

    /// Engine side, for a slot taken from the rung list: whether the bell was rung since the
    /// last take. SeqCst on both flags, paired with [`DoorbellRegister::ring`]: a ring either
    /// sees `queued` cleared and queues the slot again, or its `rung` is seen here.
    pub(crate) fn take_queued(&self) -> bool {
        self.queued.store(false, Ordering::SeqCst);
        self.rung.swap(false, Ordering::SeqCst)
    }
}

impl DoorbellRegister {
    pub(crate) fn new(bell: Arc<Bell>, waker: Arc<Waker>) -> Self {
        DoorbellRegister { bell, waker }
    }

    /// Rings: `ctrl` is the first 8 bytes of the last control segment (as written to a UAR).
    /// The caller must have written the WQEs and the doorbell record before.
    #[inline]
    pub fn ring(&self, ctrl: u64) {
        self.bell.last.store(ctrl, Ordering::Release);
        self.bell.rung.store(true, Ordering::SeqCst);
        // The engine visits only queued slots; queue ours once until it is taken.
        if !self.bell.queued.swap(true, Ordering::SeqCst) {
            self.waker.queue_rung(self.bell.slot);
        }
        self.waker.wake();
    }

    /// The last value written (for tests and tracing).
    pub fn last_value(&self) -> u64 {
        self.bell.last.load(Ordering::Acquire)
    }
}

/// Decoded WQEs a send queue starts with. The ring of decoded WQEs grows (doubling) when a
/// fetch finds it full, up to one per basic block of the send ring: a QP's decoded copies
/// follow the most WQEs it ever had fetched and not completed, not its ring's capacity. An
/// idle QP (a backup QP before any failover, a control QP) keeps this many.
const FIRST_SLOTS: u32 = 16;

/// The send ring and the WQEs fetched from it, named as `docs/datapath.md`'s ring counters
/// (`_pi` producer, `_ci` consumer, `_m` mask, `db_` read from the doorbell record): `wqe_`
/// the driver's ring in basic blocks, `slot_` the ring of fetched WQEs, in WQEs, whose
/// counters run `slot_ci <= slot_req_ci <= slot_pi`.
pub(crate) struct SendQueue {
    pub mem: QueueMemory,
    /// Mask of the send ring in basic blocks (BBs - 1): a BB counter's block is `& wqe_m`.
    pub wqe_m: u32,
    /// The device's consumer index: BB counter (16-bit, wrapping) of the next WQE to fetch.
    pub wqe_ci: u16,
    /// Producer index read from the doorbell record (BBs, 16-bit, wrapping): rung up to here.
    pub wqe_db_pi: u16,
    /// Fetched WQEs (a power of two of them, [`FIRST_SLOTS`] at first, growing to at most
    /// one per BB of the ring).
    pub slots: Vec<SendWqe>,
    /// Mask of `slots` (slots - 1): an absolute WQE counter's slot is `& slot_m`.
    pub slot_m: u64,
    /// Completer's consumer index: the oldest fetched WQE not completed (WQEs, absolute 64-bit).
    pub slot_ci: u64,
    /// Requester's consumer index: the next WQE to transmit (WQEs, absolute 64-bit); moves back
    /// on a go-back-N.
    pub slot_req_ci: u64,
    /// Producer index: WQEs fetched so far, the next fetch fills its slot (absolute 64-bit).
    pub slot_pi: u64,
    /// The ring is a UD QP's: its WQEs are read with their datagram segment.
    pub qp_type: QpType,
    scratch: Vec<u8>,
}

impl SendQueue {
    pub fn slot(&self, abs: u64) -> &SendWqe {
        &self.slots[(abs & self.slot_m) as usize]
    }

    pub fn slot_mut(&mut self, abs: u64) -> &mut SendWqe {
        &mut self.slots[(abs & self.slot_m) as usize]
    }

    /// Doubles the ring of decoded WQEs, keeping each fetched WQE at its counter's new slot;
    /// false when it already has one slot per basic block of the send ring (the most WQEs
    /// the ring can hold). Cold: a QP grows at most log2(BBs / [`FIRST_SLOTS`]) times.
    #[cold]
    fn grow_slots(&mut self, max_inline: u32, max_sge: u32) -> bool {
        let len = self.slots.len();
        if len > self.wqe_m as usize {
            return false;
        }
        let mut grown: Vec<SendWqe> = (0..2 * len)
            .map(|_| SendWqe::empty(max_sge as usize, max_inline as usize))
            .collect();
        let grown_m = (2 * len - 1) as u64;
        for abs in self.slot_ci..self.slot_pi {
            std::mem::swap(
                &mut grown[(abs & grown_m) as usize],
                &mut self.slots[(abs & self.slot_m) as usize],
            );
        }
        self.slots = grown;
        self.slot_m = grown_m;
        true
    }

    /// Fetches rung WQEs into free slots. Returns how many were fetched.
    pub fn fetch(&mut self, max_inline: u32, max_sge: u32) -> usize {
        let mut fetched = 0;
        while self.wqe_ci != self.wqe_db_pi {
            if self.slot_pi - self.slot_ci > self.slot_m && !self.grow_slots(max_inline, max_sge) {
                break;
            }
            let ring_bytes = (self.wqe_m as usize + 1) * SEND_WQE_BB;
            let first = (self.wqe_ci as u32 & self.wqe_m) as usize * SEND_WQE_BB;
            // The control segment's ds tells how many BBs the WQE spans; copy them out of the
            // ring, unwrapping at its end, and parse the straight copy.
            self.mem.read(first, &mut self.scratch[..SEND_WQE_BB]);
            let ds = codec::wqe_ds(&self.scratch[..SEND_WQE_BB]);
            let bytes = (ds as usize * SEND_WQE_DS).clamp(SEND_WQE_DS, MAX_WQE_BYTES);
            let bbs = bytes.div_ceil(SEND_WQE_BB);
            let span = bbs * SEND_WQE_BB;
            let end = first + span;
            // The driver rang `wqe_db_pi - wqe_ci` BBs; a WQE claiming more than that (or more
            // than the ring) is malformed, and everything rung up to `wqe_db_pi` goes with it.
            let rung = self.wqe_db_pi.wrapping_sub(self.wqe_ci) as usize;
            let fits = span <= ring_bytes && bbs <= rung;
            if !fits {
                // A WQE larger than the whole ring: nothing sensible to read.
            } else if end <= ring_bytes {
                self.mem.read(first, &mut self.scratch[..span]);
            } else {
                let head_part = ring_bytes - first;
                self.mem.read(first, &mut self.scratch[..head_part]);
                self.mem.read(0, &mut self.scratch[head_part..span]);
            }
            let slot = &mut self.slots[(self.slot_pi & self.slot_m) as usize];
            let index = self.wqe_ci;
            let result = if fits {
                codec::decode_send_wqe(&self.scratch[..], self.qp_type, max_inline, max_sge, slot)
            } else {
                Err(WqeError::Malformed)
            };
            reset_progress(slot);
            slot.index = index;
            slot.bbs = bbs as u16;
            if let Err(e) = result {
                tracing::debug!(index, error = ?e, "malformed send WQE");
                slot.fault = Some(match e {
                    WqeError::Malformed => syndrome::LOCAL_QP_OPERATION,
                    WqeError::TooLong => syndrome::LOCAL_LENGTH,
                });
            }
            self.wqe_ci = if fits {
                self.wqe_ci.wrapping_add(bbs as u16)
            } else {
                self.wqe_db_pi
            };
            self.slot_pi += 1;
            fetched += 1;
        }
        fetched
    }
}

fn reset_progress(w: &mut SendWqe) {
    w.fault = None;
    w.started = false;
    w.sent_all = false;
    w.done = false;
    w.first_psn = 0;
    w.last_psn = 0;
}

/// The receive ring (`rwqe_`, counted in receive WQEs; see [`SendQueue`] for the names).
pub(crate) struct RecvQueue {
    pub mem: QueueMemory,
    /// Mask of the ring in receive WQEs (WQEs - 1): a counter's slot is `& rwqe_m`.
    pub rwqe_m: u32,
    /// log2 of the bytes per receive WQE.
    pub stride_shift: u32,
    /// The device's consumer index: the next receive WQE to consume (WQEs, 16-bit, wrapping,
    /// as the doorbell record's producer index).
    pub rwqe_ci: u16,
}

impl RecvQueue {
    /// Reads the scatter list of the next receive WQE into `out`.
    pub fn read_next(&self, out: &mut Vec<Sge>, scratch: &mut [u8]) -> Result<(), WqeError> {
        let stride = 1usize << self.stride_shift;
        let off = ((self.rwqe_ci as u32 & self.rwqe_m) as usize) << self.stride_shift;
        self.mem.read(off, &mut scratch[..stride]);
        codec::decode_recv_wqe(&scratch[..stride], out)
    }
}

/// Requester and completer state.
#[derive(Debug, Default)]
pub(crate) struct Requester {
    /// Next PSN to send.
    pub psn: u32,
    /// Oldest PSN not acknowledged.
    pub comp_psn: u32,
    /// One past the highest PSN ever sent (to count retransmissions).
    pub high_psn: u32,
    /// Bytes of WQE `sq.slot_req_ci` already sent.
    pub offset: u32,
    /// READ/atomic WQEs started and not done.
    pub rd_atomic: u32,
    /// Local ACK timer.
    pub timer: Option<Duration>,
    /// Sending is paused by an RNR NAK until then.
    pub rnr_until: Option<Duration>,
    pub retry_left: u8,
    pub rnr_left: u8,
    /// A go-back-N to this PSN is under way; further implicit retries wait for progress.
    pub retrying_from: Option<u32>,
    /// Packets sent since the last AckReq.
    pub since_ack_req: u32,
    /// Messages started (24 bits): the next WQE's `msn`.
    pub msn: u32,
    /// A short ACK timeout asked for after a re-post (`Device::arm_short_retransmit`): used
    /// once, the next time the ACK timer starts.
    pub short_timeout: Option<Duration>,
    /// The deadline of the running ACK timer when that timer is the short one.
    pub short_deadline: Option<Duration>,
    /// Resends while anything is unacknowledged, at a capped backoff, beside the ACK timer
    /// (`Device::set_retransmit_probe`); none unless asked for. A reset clears it.
    pub probe: Option<RetransmitProbe>,
    /// When the next probe resend is due (only while something is unacknowledged).
    pub probe_at: Option<Duration>,
    /// The wait after that resend: doubles from the probe's `first` up to its `cap`.
    pub probe_next: Duration,
    /// The congestion window: PSNs in flight at most.
    pub window: Window,
    /// The QP's path budget is more than half used (`crate::path_budget`): a first
    /// transmission is not covered by the short timer. Set before each pass.
    pub crowded: bool,
    /// The packet being sent is the last its pass lets it send while it has more: it asks for
    /// an ACK, so that what it sent is acknowledged while it waits for its next turn.
    pub last_of_turn: bool,
}

/// A QP's retransmit probe (`Device::set_retransmit_probe`): while the QP has packets
/// unacknowledged it resends them (go-back-N from the oldest) `first` after the transmission
/// that left them outstanding, then at twice the last wait up to `cap`, starting over at
/// `first` on every acknowledgment. A probe resend spends no retry and leaves the ACK timer
/// where it was, so the QP's own `timeout` x `retry_cnt` still decides when it gives up.
///
/// What a driver asks of a QP whose few messages must get through as soon as the path
/// carries packets again (a failover's control QP): its ACK timer alone resends once per
/// timeout, and under a flapping link those resends can keep landing in the down windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetransmitProbe {
    /// The first wait.
    pub first: Duration,
    /// The longest wait.
    pub cap: Duration,
}

/// Responder state.
#[derive(Debug, Default)]
pub(crate) struct Responder {
    /// Expected PSN.
    pub epsn: u32,
    /// Message sequence number (24 bits).
    pub msn: u32,
    /// A PSN-sequence NAK was sent for the current gap.
    pub nak_sent: bool,
    /// An ACK for epsn-1 is owed at the end of this receive batch.
    pub ack_pending: bool,
    /// The pending ACK already waited one round for company.
    pub ack_deferred: bool,
    /// A multi-packet SEND is in progress into receive WQE `rq.rwqe_ci`, or with an SRQ into
    /// its slot `srq_wqe`.
    pub in_send: bool,
    /// The SRQ slot the SEND in progress was taken from.
    pub srq_wqe: u16,
    pub recv_offset: u32,
    pub recv_sges: Vec<Sge>,
    /// A multi-packet WRITE is in progress.
    pub in_write: bool,
    pub write_va: u64,
    pub write_rkey: u32,
    pub write_left: u64,
    pub write_len: u32,
    /// The READs and atomics executed (max_dest_rd_atomic of them), for replay, and the
    /// responses still to send.
    pub resources: Resources,
    /// A PSN-sequence or RNR NAK held back until the pending responses are sent (a NAK
    /// overtaking them would tell the requester they were lost).
    pub owed_nak: Option<AckKind>,
}

/// A QP.
pub(crate) struct Qp {
    pub qpn: u32,
    /// RC or UD (`crate::ud` runs a UD QP's sends and receives).
    pub qp_type: QpType,
    pub pd: PdId,
    pub send_cq: CqId,
    pub recv_cq: CqId,
    pub state: QpState,
    pub attrs: QpAttrs,
    pub sq: SendQueue,
    pub rq: RecvQueue,
    /// The SRQ this QP takes its receive WQEs from instead of `rq`.
    pub srq: Option<SharedSrq>,
    pub dbrec: QueueMemory,
    pub bell: Arc<Bell>,
    pub max_inline: u32,
    pub max_send_sge: u32,
    pub src_port: u16,
    /// The UDP source port the peer sends from, learnt from its first packet at a PSN this QP
    /// expected; packets from its address but another port are dropped after that.
    pub peer_port: Option<u16>,
    pub req: Requester,
    pub resp: Responder,
    pub counters: Counters,
    pub rq_scratch: Vec<u8>,
    /// In the engine's active list (`engine::ActiveQps`): visited by the next round.
    pub listed: bool,
    /// Its place in the budget of the path to its peer (`crate::path_budget`), from the move
    /// to RTR that named the peer until it is destroyed or names another.
    pub path: Option<PathShare>,
}

impl Qp {
    pub fn new(
        qpn: u32,
        cfg: QpConfig,
        bell: Arc<Bell>,
        src_port: u16,
    ) -> Result<Qp, &'static str> {
        if !cfg.sq_bbs.is_power_of_two() || cfg.sq_bbs == 0 || cfg.sq_bbs > 1 << 15 {
            return Err("sq_bbs must be a power of two up to 32768");
        }
        if cfg.sq.len() < cfg.sq_bbs as usize * SEND_WQE_BB {
            return Err("send ring memory is smaller than sq_bbs * 64");
        }
        if !cfg.rq_wqes.is_power_of_two() || cfg.rq_wqes == 0 || cfg.rq_wqes > 1 << 15 {
            return Err("rq_wqes must be a power of two up to 32768");
        }
        if !cfg.rq_stride.is_power_of_two() || cfg.rq_stride < 16 || cfg.rq_stride > 1024 {
            return Err("rq_stride must be a power of two in 16..=1024");
        }
        if cfg.rq.len() < cfg.rq_wqes as usize * cfg.rq_stride as usize {
            return Err("receive ring memory is smaller than rq_wqes * rq_stride");
        }
        if cfg.dbrec.len() < 8 || cfg.dbrec.as_ptr() as usize % 4 != 0 {
            return Err("doorbell record must be 8 bytes, 4-byte aligned");
        }
        if cfg.max_inline as usize > MAX_WQE_BYTES
            || cfg.max_send_sge as usize > MAX_WQE_BYTES / data_seg::SIZE
        {
            return Err("max_inline or max_send_sge exceed what a send WQE can hold");
        }
        let first_slots = cfg.sq_bbs.min(FIRST_SLOTS);
        let slots = (0..first_slots)
            .map(|_| SendWqe::empty(cfg.max_send_sge as usize, cfg.max_inline as usize))
            .collect();
        Ok(Qp {
            qpn,
            qp_type: cfg.qp_type,
            pd: cfg.pd,
            send_cq: cfg.send_cq,
            recv_cq: cfg.recv_cq,
            state: QpState::Reset,
            attrs: QpAttrs::default(),
            sq: SendQueue {
                mem: cfg.sq,
                wqe_m: cfg.sq_bbs - 1,
                wqe_ci: 0,
                wqe_db_pi: 0,
                slots,
                slot_m: u64::from(first_slots) - 1,
                slot_ci: 0,
                slot_req_ci: 0,
                slot_pi: 0,
                qp_type: cfg.qp_type,
                scratch: vec![0u8; codec::WQE_SCRATCH],
            },
            rq: RecvQueue {
                mem: cfg.rq,
                rwqe_m: cfg.rq_wqes - 1,
                stride_shift: cfg.rq_stride.trailing_zeros(),
                rwqe_ci: 0,
            },
            srq: None,
            dbrec: cfg.dbrec,
            bell,
            max_inline: cfg.max_inline,
            max_send_sge: cfg.max_send_sge,
            src_port,
            peer_port: None,
            path: None,
            req: Requester::default(),
            resp: Responder {
                recv_sges: Vec::with_capacity((cfg.rq_stride / 16) as usize),
                ..Default::default()
            },
            counters: Counters::default(),
            rq_scratch: vec![0u8; cfg.rq_stride as usize],
            listed: false,
        })
    }

    /// Path MTU in bytes (1024 until set).
    pub fn mtu(&self) -> u32 {
        self.attrs.path_mtu.map_or(1024, |m| m.bytes())
    }

    pub fn peer(&self) -> Option<(IpAddr, u32)> {
        Some((self.attrs.dest_addr?, self.attrs.dest_qpn?))
    }

    /// The PSNs this QP counts against its path's budget now: those sent and not acknowledged,
    /// within its window, while it sends and has no READ or atomic outstanding (their
    /// responses come the other way; `crate::path_budget`).
    #[inline]
    pub fn path_inflight(&self) -> u32 {
        if self.state != QpState::Rts || self.req.rd_atomic > 0 {
            return 0;
        }
        let sent = psn_delta(self.req.psn, self.req.comp_psn).max(0) as u32;
        sent.min(self.req.window.limit())
    }

    /// Settles this QP's count in its path's budget (after anything that moved it). A QP that
    /// no longer sends (reset, in error) no longer waits for a turn either.
    #[inline]
    pub fn settle_path(&mut self, paths: &mut PathBudgets) {
        let now = self.path_inflight();
        let sending = self.state == QpState::Rts;
        if let Some(share) = self.path.as_mut() {
            paths.settle(share, now);
            if !sending {
                paths.visited(share);
            }
        }
    }

    /// Joins the budget of the path to the peer the move to RTR named (leaving another's).
    pub fn attach_path(&mut self, paths: &mut PathBudgets) {
        let Some(addr) = self.attrs.dest_addr else {
            return;
        };
        if let Some(share) = self.path.take() {
            paths.detach(share);
        }
        self.path = Some(paths.attach(addr));
    }

    /// Leaves its path's budget (destroyed).
    pub fn detach_path(&mut self, paths: &mut PathBudgets) {
        if let Some(share) = self.path.take() {
            paths.detach(share);
        }
    }

    /// The driver's receive producer index, read from the doorbell record (receive WQEs,
    /// 16-bit, wrapping).
    pub fn rwqe_db_pi(&self) -> u16 {
        self.dbrec.load_be32(0) as u16
    }

    /// Reads the doorbell record's send counter (`sq.wqe_db_pi`) after a doorbell.
    pub fn read_send_doorbell(&mut self) {
        self.sq.wqe_db_pi = self.dbrec.load_be32(4) as u16;
    }

    /// Returns rings and transport state to their initial values (RESET), as libmlx5 expects.
    pub fn reset(&mut self) {
        self.sq.wqe_ci = 0;
        self.sq.wqe_db_pi = 0;
        self.sq.slot_ci = 0;
        self.sq.slot_req_ci = 0;
        self.sq.slot_pi = 0;
        self.rq.rwqe_ci = 0;
        self.req = Requester::default();
        self.peer_port = None;
        let sges = std::mem::take(&mut self.resp.recv_sges);
        self.resp = Responder {
            recv_sges: sges,
            ..Default::default()
        };
        self.resp.recv_sges.clear();
        self.attrs = QpAttrs::default();
    }

    /// Applies attributes that take effect on entering `to`.
    pub fn apply(&mut self, to: QpState, given: &QpAttrs) {
        self.attrs.merge(given);
        if given.dest_addr.is_some() || given.dest_qpn.is_some() {
            // Another peer, or the same one again: learn its port anew.
            self.peer_port = None;
        }
        if let Some(p) = given.rq_psn {
            self.resp.epsn = p;
        }
        if let Some(p) = given.sq_psn {
            self.req.psn = p;
            self.req.comp_psn = p;
            self.req.high_psn = p;
        }
        if let Some(n) = given.max_dest_rd_atomic {
            self.resp.resources = Resources::with_capacity(n as usize);
        }
        if let Some(r) = given.retry_cnt {
            self.req.retry_left = r;
        }
        if let Some(r) = given.rnr_retry {
            self.req.rnr_left = r;
        }
        if to == QpState::Rts && self.state == QpState::Rtr {
            self.req.retry_left = self.attrs.retry_cnt.unwrap_or(7);
            self.req.rnr_left = self.attrs.rnr_retry.unwrap_or(7);
        }
        self.state = to;
    }

    /// Whether a receive WQE is posted for the next message (on the SRQ when it has one).
    pub fn has_recv(&self) -> bool {
        match &self.srq {
            Some(s) => srq::lock(s).available() > 0,
            None => self.rq.rwqe_ci != self.rwqe_db_pi(),
        }
    }

    /// The counter a receive CQE names for the receive WQE in use (the RQ's consumer index,
    /// which moves on, or the SRQ slot taken).
    pub fn recv_done(&mut self) -> u16 {
        if self.srq.is_some() {
            return self.resp.srq_wqe;
        }
        let index = self.rq.rwqe_ci;
        self.rq.rwqe_ci = index.wrapping_add(1);
        index
    }

    /// Whether the QP allows the remote access.
    pub fn allows(&self, need: Access) -> bool {
        self.attrs.access.unwrap_or(Access::NONE).contains(need)
    }
}

/// Writes a CQE to `cq`; on overrun, counts it, raises the async events, and reports it.
pub(crate) fn push_cqe(
    cqs: &mut [Option<Cq>],
    id: CqId,
    info: &CqeInfo,
    counters: &mut Counters,
    events: &EventQueue,
) -> bool {
    let Some(Some(cq)) = cqs.get_mut(id.0 as usize) else {
        return false;
    };
    let was_broken = cq.broken;
    match cq.push(info) {
        Ok(()) => true,
        Err(CqFull::Overrun) => {
            if !was_broken {
                counters.cq_overruns += 1;
                events.push(AsyncEvent::CqError { cq: id });
            }
            false
        }
    }
}

/// Everything a QP touches outside itself while it moves to the error state.
pub(crate) struct ErrorCtx<'a> {
    pub cqs: &'a mut [Option<Cq>],
    pub events: &'a EventQueue,
}

impl Qp {
    /// Moves to ERR: an error CQE for the WQE at `sq.slot_ci` (when `failed` names a
    /// syndrome), then WR_FLUSH_ERR for every other fetched or rung send WQE and every posted
    /// receive WQE.
    pub fn enter_error(&mut self, failed: Option<u8>, ctx: &mut ErrorCtx<'_>) {
        if self.state == QpState::Err {
            return;
        }
        tracing::debug!(qpn = self.qpn, syndrome = ?failed, "QP enters the error state");
        self.state = QpState::Err;
        self.req.timer = None;
        self.req.probe_at = None;
        self.req.rnr_until = None;
        if let Some(s) = failed {
            if self.sq.slot_ci < self.sq.slot_pi {
                let w = self.sq.slot(self.sq.slot_ci);
                let info = CqeInfo {
                    kind: CqeKind::RequesterError {
                        wqe_opcode: w.mlx5_opcode,
                        syndrome: s,
                    },
                    qpn: self.qpn,
                    wqe_counter: w.index,
                    byte_count: 0,
                    imm: None,
                };
                self.sq.slot_ci += 1;
                push_cqe(ctx.cqs, self.send_cq, &info, &mut self.counters, ctx.events);
            }
        }
        self.flush(ctx);
    }

    /// In ERR: flushes every send WQE fetched or rung and every receive WQE posted.
    pub fn flush(&mut self, ctx: &mut ErrorCtx<'_>) {
        loop {
            while self.sq.slot_ci < self.sq.slot_pi {
                let w = self.sq.slot(self.sq.slot_ci);
                let info = CqeInfo {
                    kind: CqeKind::RequesterError {
                        wqe_opcode: w.mlx5_opcode,
                        syndrome: syndrome::WR_FLUSH,
                    },
                    qpn: self.qpn,
                    wqe_counter: w.index,
                    byte_count: 0,
                    imm: None,
                };
                self.sq.slot_ci += 1;
                push_cqe(ctx.cqs, self.send_cq, &info, &mut self.counters, ctx.events);
            }
            self.sq.slot_req_ci = self.sq.slot_ci;
            if self.sq.wqe_ci == self.sq.wqe_db_pi
                || self.sq.fetch(self.max_inline, self.max_send_sge) == 0
            {
                break;
            }
        }
        if self.resp.in_send && self.srq.is_some() {
            // The SRQ slot a SEND was arriving into is consumed: flush it, naming its slot so
            // the driver frees it. The SRQ's other receives stay for the other QPs.
            let info = CqeInfo {
                kind: CqeKind::ResponderError {
                    syndrome: syndrome::WR_FLUSH,
                },
                qpn: self.qpn,
                wqe_counter: self.resp.srq_wqe,
                byte_count: 0,
                imm: None,
            };
            push_cqe(ctx.cqs, self.recv_cq, &info, &mut self.counters, ctx.events);
        }
        self.resp.in_send = false;
        self.resp.in_write = false;
        self.resp.resources.abandon();
        self.resp.owed_nak = None;
        let posted = self.rwqe_db_pi();
        while self.rq.rwqe_ci != posted {
            let info = CqeInfo {
                kind: CqeKind::ResponderError {
                    syndrome: syndrome::WR_FLUSH,
                },
                qpn: self.qpn,
                wqe_counter: self.rq.rwqe_ci,
                byte_count: 0,
                imm: None,
            };
            self.rq.rwqe_ci = self.rq.rwqe_ci.wrapping_add(1);
            push_cqe(ctx.cqs, self.recv_cq, &info, &mut self.counters, ctx.events);
        }
    }
}
