//! Polling a completion queue: the owner-bit check, the read barrier after it, decoding
//! success and error CQEs into work completions, and the consumer-index record.
//!
//! A CQ may serve several QPs. Each QP attaches its send and receive bookkeeping to the CQ
//! ([`Attachments`]); the poller keeps a private copy of that list and refreshes it only when
//! a generation counter says it changed, so a poll takes no lock and allocates nothing.

use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use hw_defs::mlx5::cqe::QPN_MASK;
use hw_defs::mlx5::{cqe, Cqe64, CqeOpcode, ErrCqe};

use super::barrier;
use super::srq::SharedRecvQueue;
use super::track::{RecvTrack, SendTrack};
use super::wr::{as_slots, CompletionLayout, FastSend, WcOpcode, WcStatus, WorkCompletion};

/// One QP's bookkeeping as a CQ sees it.
#[derive(Debug, Clone)]
pub(crate) struct Attachment {
    pub qpn: u32,
    pub send: Option<Arc<SendTrack>>,
    pub recv: Option<Arc<RecvTrack>>,
    /// The SRQ the QP takes its receives from (then `recv` is `None`).
    pub srq: Option<Arc<SharedRecvQueue>>,
    /// A UD QP: its receive completions name the sender (`WorkCompletion::src_qp`).
    pub ud: bool,
}

/// The QPs attached to a CQ. Written on the control path (QP create/destroy), read by the
/// poller through its private copy.
#[derive(Debug, Default)]
pub(crate) struct Attachments {
    generation: AtomicU64,
    list: Mutex<Vec<Attachment>>,
    /// QPs reset or destroyed since the poller last looked, and how far the device had
    /// written when they were (see [`CqRing::produced`]): their CQEs before that point are
    /// stale and must go before the poller decodes anything else.
    cleans: Mutex<Vec<PendingClean>>,
}

/// A request to drop one QP's CQEs from the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PendingClean {
    qpn: u32,
    /// The device's producer position (mod 2^24) when the QP stopped producing CQEs.
    until: u32,
}

impl Attachments {
    pub fn attach(&self, a: Attachment) {
        let mut list = self.list.lock().unwrap_or_else(|p| p.into_inner());
        match list.iter_mut().find(|x| x.qpn == a.qpn) {
            Some(x) => {
                if a.send.is_some() {
                    x.send = a.send;
                }
                if a.recv.is_some() {
                    x.recv = a.recv;
                }
                if a.srq.is_some() {
                    x.srq = a.srq;
                }
            }
            None => list.push(a),
        }
        // Release: a poller that sees the new generation sees the list it goes with (it takes
        // the lock anyway; this keeps the fast-path check honest).
        self.generation.fetch_add(1, Ordering::Release);
    }

    pub fn detach(&self, qpn: u32) {
        let mut list = self.list.lock().unwrap_or_else(|p| p.into_inner());
        list.retain(|x| x.qpn != qpn);
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Asks the poller to drop the CQEs of `qpn` that lie before `until` (libmlx5 cleans the
    /// CQ inside `ibv_modify_qp`/`ibv_destroy_qp`; for a CQ the driver polls, the driver must,
    /// and only the poller may move its consumer index). The poller does it at its next poll,
    /// before it reads a CQE.
    pub fn request_clean(&self, qpn: u32, until: u32) {
        let mut cleans = self.cleans.lock().unwrap_or_else(|p| p.into_inner());
        cleans.push(PendingClean { qpn, until });
        // Release: a poller that sees the new generation sees the request.
        self.generation.fetch_add(1, Ordering::Release);
    }

    fn take_cleans(&self, into: &mut Vec<PendingClean>) {
        let mut cleans = self.cleans.lock().unwrap_or_else(|p| p.into_inner());
        into.append(&mut cleans);
    }

    fn snapshot(&self, into: &mut Vec<Attachment>) -> u64 {
        let list = self.list.lock().unwrap_or_else(|p| p.into_inner());
        into.clear();
        into.extend(list.iter().cloned());
        self.generation.load(Ordering::Acquire)
    }
}

/// Counters of CQEs the poller could not turn into completions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PollStats {
    /// CQEs of a QP not attached to this CQ (one destroyed since, typically).
    pub unknown_qpn: u64,
    /// CQEs naming a WQE that is not outstanding (stale after a reset, or bogus).
    pub stale: u64,
    /// CQEs of reset or destroyed QPs removed from the ring before they were polled.
    pub cleaned: u64,
}

/// Where a QP's queues stood when the first error completions since the mark was last taken
/// retired their WQEs: the consumer counters just before. A flush retires WQEs from the
/// bookkeeping while their bytes stay in the ring, so the failover layer, which moves the
/// unfinished WQEs to another QP, needs to know where they began. Recorded on the (cold)
/// error path only.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ErrorMark {
    /// The send queue's consumer counter before its first error completion.
    pub send: Option<u32>,
    /// The receive queue's consumer counter before its first error completion.
    pub recv: Option<u32>,
}

/// Where a CQ's entries are and how to tell which are software's. The poller reads CQEs
/// through it; the control path reads only owner bytes and the consumer-index record, to find
/// how far the device has written ([`CqRing::produced`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct CqRing {
    /// First byte of the CQE ring.
    ring: NonNull<u8>,
    /// log2 of the entries in the ring: a counter's lap parity is its bit `cqe_n`.
    cqe_n: u32,
    /// Mask of the ring (entries - 1): a counter's entry is `counter & cqe_m`.
    cqe_m: u32,
    /// Offset of the 64-byte CQE inside an entry (64 for 128-byte CQEs, else 0).
    cqe_offset: usize,
    /// log2 of the entry size.
    entry_shift: u32,
    /// The consumer-index record (set_ci, big-endian).
    dbrec: NonNull<AtomicU32>,
}

// SAFETY: the ring and record are owned by the CQ's provider object, alive while the CQ's
// control half (which holds every CqRing copy) lives. Shared reads are atomic loads of owner
// bytes and of the record; everything else goes through the poller's `&mut self`.
unsafe impl Send for CqRing {}
// SAFETY: as above.
unsafe impl Sync for CqRing {}

impl CqRing {
    /// A ring of `count` entries of `entry_size` bytes (64 or 128) at `ring`.
    pub(crate) fn new(
        ring: NonNull<u8>,
        count: u32,
        entry_size: u32,
        dbrec: NonNull<AtomicU32>,
    ) -> CqRing {
        CqRing {
            ring,
            cqe_n: count.trailing_zeros(),
            cqe_m: count - 1,
            cqe_offset: (entry_size as usize).saturating_sub(cqe::SIZE),
            entry_shift: entry_size.trailing_zeros(),
            dbrec,
        }
    }

    /// Entries in the ring.
    #[inline(always)]
    fn count(&self) -> u32 {
        1 << self.cqe_n
    }

    #[inline(always)]
    fn entry(&self, ci: u32) -> *mut u8 {
        let index = (ci & self.cqe_m) as usize;
        // SAFETY: index <= cqe_m: the entry lies inside the ring.
        unsafe {
            self.ring
                .as_ptr()
                .add((index << self.entry_shift) + self.cqe_offset)
        }
    }

    #[inline(always)]
    fn op_own(&self, cqe: *mut u8) -> &AtomicU8 {
        // SAFETY: op_own is the CQE's last byte, inside the entry; the device writes it with a
        // single store, so an atomic byte load sees either the old or the new value.
        unsafe { &*(cqe.add(cqe::OP_OWN_OFFSET) as *const AtomicU8) }
    }

    /// The CQE at `ci`, or `None` while the device owns it.
    #[inline(always)]
    fn owned(&self, ci: u32) -> Option<*mut u8> {
        let cqe = self.entry(ci);
        let op_own = self.op_own(cqe).load(Ordering::Relaxed);
        if !cqe::is_sw_owned(op_own, ci, self.count()) {
            return None;
        }
        // The owner byte said the CQE is ours: read its body only now. Without this the CPU (or
        // the compiler) may read body fields from before the device finished writing them
        // (libmlx5: udma_from_device_barrier in mlx5_get_next_cqe).
        barrier::from_device();
        Some(cqe)
    }

    /// Publishes the consumer index.
    #[inline(always)]
    fn publish(&self, ci: u32) {
        // Release: our reads of the consumed CQEs are done before the device may reuse
        // their slots (it reads this record to know how far it may write).
        // SAFETY: dbrec points into the CQ's doorbell record, alive as long as the CQ.
        let dbrec = unsafe { self.dbrec.as_ref() };
        dbrec.store((ci & CI_MASK).to_be(), Ordering::Release);
    }

    fn published(&self) -> u32 {
        // SAFETY: as in `publish`.
        u32::from_be(unsafe { self.dbrec.as_ref() }.load(Ordering::Acquire)) & CI_MASK
    }

    /// How far the device has written, mod 2^24: the first position from the poller's
    /// published consumer index on whose CQE is not software's yet. Called by the control path
    /// just after a QP stopped producing CQEs (reset or destroyed), it bounds that QP's stale
    /// CQEs: all lie before it (libmlx5's `__mlx5_cq_clean` scans for the same producer index).
    /// The poller may be consuming meanwhile on another thread: a slot it has passed may
    /// already hold the device's next lap and look unwritten, so a scan that stops behind the
    /// poller goes on from where the poller is.
    pub(crate) fn produced(&self) -> u32 {
        let mut ci = self.published();
        let mut end = ci;
        loop {
            while end.wrapping_sub(ci) & CI_MASK < self.count() && self.owned(end).is_some() {
                end = end.wrapping_add(1) & CI_MASK;
            }
            let now = self.published();
            if end.wrapping_sub(now) & CI_MASK <= self.count() {
                return end;
            }
            ci = now;
            end = now;
        }
    }
}

/// The consumer index travels mod 2^24.
const CI_MASK: u32 = 0x00ff_ffff;

// The fast loop takes send opcodes RDMA_WRITE..RDMA_WRITE + 4 as one range, numbered as
// `FastSend` numbers them.
const _: () = assert!(
    raw::RDMA_WRITE_IMM == raw::RDMA_WRITE + FastSend::WriteImm as u8
        && raw::SEND == raw::RDMA_WRITE + FastSend::Send as u8
        && raw::SEND_IMM == raw::RDMA_WRITE + FastSend::SendImm as u8
        && FastSend::Write as u8 == 0
);

/// Why the fast loop stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// The next CQE is not written yet: nothing more to poll.
    Empty,
    /// Full, end of the lap, or a CQE for the general decoder.
    Other,
}

/// The hot half of a CQ: ring, consumer index, and the attached QPs' bookkeeping.
#[derive(Debug)]
pub struct CompletionQueue {
    // ---- hot: what the fast loop reads ----
    /// The ring, its geometry and its doorbell record.
    ring: CqRing,
    /// The send track of the QP of the last CQE (`local[hit]`), or `None`: the fast loop
    /// retires through it. Points into an `Arc` that `local` holds.
    hot_send: Option<NonNull<SendTrack>>,
    /// That QP's number, as the little-endian word of CQE bytes 56..60 has it with the
    /// opcode byte cleared: the fast loop's QP check is one compare.
    hot_qpn_word: u32,
    /// That QP's number.
    hot_qpn: u32,
    /// The completion the fast loop writes for that QP, but for its id and opcode: the
    /// layout's template is made from it once per poll (read from memory, values the
    /// compiler cannot see into, so a copy of it stays a few 16-byte moves instead of
    /// becoming one store per field).
    hot_wc: WorkCompletion,
    /// Entries in the ring (a power of two): `cqe_m + 1`.
    count: u32,
    /// Consumer counter: CQEs before it are consumed (free-running; its lap parity is the
    /// owner bit software expects). Published mod 2^24 in the doorbell record.
    cqe_ci: u32,
    /// The QPs attached, as the control path last changed them.
    attachments: Arc<Attachments>,
    /// Clean requests taken from `attachments`, kept to reuse the allocation.
    cleaning: Vec<PendingClean>,
    /// The attachments' generation `local` was copied at.
    generation: u64,
    /// The poller's private copy of the attachments.
    local: Vec<Attachment>,
    /// Index into `local` of the QP of the last CQE: the usual case is one QP per CQ.
    hit: usize,
    /// CQEs dropped, by reason.
    stats: PollStats,
    /// Where the queues stood at the first error completion since the last look.
    mark: ErrorMark,
}

// SAFETY: ring and record are owned by the CQ's provider object (kept alive by the Cq that
// owns this poller); used through `&mut self` by one thread at a time.
unsafe impl Send for CompletionQueue {}

impl CompletionQueue {
    pub(crate) fn new(ring: CqRing, attachments: Arc<Attachments>) -> CompletionQueue {
        CompletionQueue {
            ring,
            hot_send: None,
            hot_qpn_word: u32::MAX,
            hot_qpn: 0,
            hot_wc: WorkCompletion::EMPTY,
            count: ring.count(),
            cqe_ci: 0,
            attachments,
            cleaning: Vec::new(),
            generation: u64::MAX,
            local: Vec::new(),
            hit: 0,
            stats: PollStats::default(),
            mark: ErrorMark::default(),
        }
    }

    /// Entries in the ring.
    pub fn capacity(&self) -> u32 {
        self.count
    }

    /// The consumer counter (`cqe_ci`).
    pub fn consumer_index(&self) -> u32 {
        self.cqe_ci
    }

    /// CQEs the poller dropped, by reason.
    pub fn stats(&self) -> PollStats {
        self.stats
    }

    #[inline(always)]
    fn entry(&self, ci: u32) -> *mut u8 {
        self.ring.entry(ci)
    }

    /// The CQE at `ci`, or `None` while the device owns it (with the read barrier after the
    /// owner byte).
    #[inline(always)]
    fn owned(&self, ci: u32) -> Option<*mut u8> {
        self.ring.owned(ci)
    }

    /// How many CQEs the device has written that are not polled yet (without consuming any).
    pub fn ready(&self) -> u32 {
        let mut n = 0;
        while n < self.count && self.owned(self.cqe_ci.wrapping_add(n)).is_some() {
            n += 1;
        }
        n
    }

    #[inline]
    fn refresh(&mut self) {
        if self.attachments.generation.load(Ordering::Acquire) != self.generation {
            self.changed();
        }
    }

    /// A QP was attached, detached, reset or destroyed: take the new list, and drop the CQEs
    /// of reset or destroyed QPs before reading any CQE.
    #[cold]
    fn changed(&mut self) {
        self.generation = self.attachments.snapshot(&mut self.local);
        self.set_hit(0);
        self.attachments.take_cleans(&mut self.cleaning);
        let mut cleaning = std::mem::take(&mut self.cleaning);
        for c in cleaning.drain(..) {
            // Positions past `until` hold CQEs written after the QP stopped: none is its (the
            // device writes a reset QP's CQEs again only after it is brought up). `until`
            // behind our consumer index (a poll on another thread got there first) means
            // nothing is left.
            let ahead = c.until.wrapping_sub(self.cqe_ci) & CI_MASK;
            if ahead <= self.count {
                let end = self.cqe_ci.wrapping_add(ahead.min(self.ready()));
                self.discard_before(c.qpn, end);
            }
        }
        self.cleaning = cleaning;
    }

    #[inline(always)]
    fn find(&mut self, qpn: u32) -> Option<usize> {
        if let Some(a) = self.local.get(self.hit) {
            if a.qpn == qpn {
                return Some(self.hit);
            }
        }
        let i = self.local.iter().position(|a| a.qpn == qpn)?;
        self.set_hit(i);
        Some(i)
    }

    /// Makes `local[i]` (if there is one) the QP the fast loop expects.
    fn set_hit(&mut self, i: usize) {
        self.hit = i;
        match self.local.get(i) {
            Some(a) => {
                self.hot_send = a.send.as_deref().map(NonNull::from);
                self.hot_qpn = a.qpn;
                self.hot_qpn_word = (a.qpn & QPN_MASK).to_be();
                self.hot_wc = WorkCompletion {
                    qp_num: a.qpn,
                    ..WorkCompletion::EMPTY
                };
            }
            None => {
                self.hot_send = None;
                self.hot_qpn_word = u32::MAX;
            }
        }
    }

    /// Polls up to `wcs.len()` completions into `wcs`; returns how many were written.
    ///
    /// Successful requester CQEs of WRITEs and SENDs of the QP of the last CQE go through a
    /// tight loop ([`CompletionQueue::poll_fast`]); everything else, one CQE at a time,
    /// through the general decoder, after which the tight loop takes over again.
    #[inline]
    pub fn poll(&mut self, wcs: &mut [WorkCompletion]) -> usize {
        self.poll_into(as_slots(wcs))
    }

    /// [`CompletionQueue::poll`] into a caller's layout ([`CompletionLayout`]): writes the
    /// first `n` slots of `out`, each a whole completion, and returns `n`. The slots need not
    /// be initialised before.
    #[inline]
    pub fn poll_into<L: CompletionLayout>(&mut self, out: &mut [MaybeUninit<L>]) -> usize {
        self.refresh();
        let first = self.cqe_ci;
        let mut n = 0;
        loop {
            let (k, stop) = self.poll_fast(&mut out[n..]);
            n += k;
            if stop == Stop::Empty || n == out.len() {
                break;
            }
            let Some(ptr) = self.owned(self.cqe_ci) else {
                break;
            };
            // SAFETY: ptr is a whole 64-byte CQE inside the ring, owned by software (checked
            // above, with the barrier); the device does not write it until the consumer index
            // moves past it.
            let bytes = unsafe { &*(ptr as *const [u8; cqe::SIZE]) };
            self.cqe_ci = self.cqe_ci.wrapping_add(1);
            let mut wc = WorkCompletion::EMPTY;
            if self.decode(bytes, &mut wc) {
                out[n].write(L::from_completion(&wc));
                n += 1;
            }
        }
        if self.cqe_ci != first {
            self.ring.publish(self.cqe_ci);
        }
        n
    }

    /// The tight loop: successful requester CQEs of RDMA WRITEs and SENDs of the hot QP, up
    /// to the end of the ring's current lap; stops (leaving the CQE where it is) at anything
    /// else. What makes it short: the owner bit expected is the same for the whole lap; the
    /// QP check and the opcode check are one XOR against the hot QP's number and one range
    /// compare (bytes 56..60 hold the send opcode, then the QPN); the CQE and completion
    /// pointers advance by strides; the send track's consumer counter stays in a register and
    /// is published once ([`SendTrack::retirer`]).
    #[inline(always)]
    fn poll_fast<L: CompletionLayout>(&mut self, out: &mut [MaybeUninit<L>]) -> (usize, Stop) {
        let Some(track) = self.hot_send else {
            return (0, Stop::Other);
        };
        // SAFETY: `hot_send` points into an Arc<SendTrack> held by `local`, which changes only
        // through `&mut self` (and resets `hot_send` when it does).
        let track = unsafe { track.as_ref() };
        let ci = self.cqe_ci;
        let ring = self.ring;
        let lap_left = (ring.cqe_m - (ci & ring.cqe_m) + 1) as usize;
        let max = out.len().min(lap_left);
        // Format 0, REQ (opcode 0), this lap's owner bit; the solicited bit (1) is ignored.
        let want = ((ci >> ring.cqe_n) & 1) as u8;
        let qpn_word = self.hot_qpn_word;
        let stride = 1usize << ring.entry_shift;
        let mut cqe = ring.entry(ci);
        let mut retirer = track.retirer();
        // The completion every CQE of the loop shares but for its id and opcode, in the
        // caller's layout, made once.
        let template = L::send_template(&self.hot_wc);
        let first = cqe;
        for slot in &mut out[..max] {
            let op_own = ring.op_own(cqe).load(Ordering::Relaxed);
            if op_own & !0x02 != want {
                break;
            }
            // The owner byte said the CQE is ours: read its body only now (libmlx5's
            // udma_from_device_barrier in mlx5_get_next_cqe).
            barrier::from_device();
            // SAFETY: the CQE is 64 bytes inside the ring, software's (checked above); bytes
            // 56..60 and 60..62 are aligned words of it.
            let (word, counter) = unsafe {
                (
                    cqe.add(cqe::SOP_DROP_QPN_OFFSET).cast::<u32>().read(),
                    cqe.add(cqe::WQE_COUNTER_OFFSET).cast::<u16>().read(),
                )
            };
            // The hot QP's CQE leaves the send opcode alone in the low byte; WRITE,
            // WRITE_IMM, SEND and SEND_IMM are 8..12 (anything else, another QP included,
            // falls outside).
            let Some(kind) =
                FastSend::from_index((word ^ qpn_word).wrapping_sub(u32::from(raw::RDMA_WRITE)))
            else {
                break;
            };
            let Some(wr_id) = retirer.retire(u16::from_be(counter)) else {
                break;
            };
            slot.write(L::send(&template, wr_id, kind));
            cqe = cqe.wrapping_add(stride);
        }
        // How many it took, from how far the CQE pointer moved (one counter less in the loop).
        let n = (cqe as usize - first as usize) >> ring.entry_shift;
        // Why it stopped, looked at once: an unwritten CQE ends the poll.
        let stop = if n < max
            && !cqe::is_sw_owned(
                ring.op_own(cqe).load(Ordering::Relaxed),
                ci.wrapping_add(n as u32),
                ring.count(),
            ) {
            Stop::Empty
        } else {
            Stop::Other
        };
        retirer.finish();
        self.cqe_ci = ci.wrapping_add(n as u32);
        (n, stop)
    }

    /// Whether an error completion was polled since the last [`CompletionQueue::take_error_mark`]:
    /// one compare, for a caller that checks after each poll.
    #[inline(always)]
    pub fn error_marked(&self) -> bool {
        self.mark.send.is_some() || self.mark.recv.is_some()
    }

    /// Where the queues stood when the first error completions since the last call retired
    /// their WQEs, and clears it.
    pub fn take_error_mark(&mut self) -> ErrorMark {
        std::mem::take(&mut self.mark)
    }

    /// Turns one CQE into a completion; false if it names nothing outstanding.
    #[inline(always)]
    fn decode(&mut self, bytes: &[u8; cqe::SIZE], wc: &mut WorkCompletion) -> bool {
        let view = Cqe64::new_unchecked(&bytes[..]);
        // The opcode nibble as a number: converting to `CqeOpcode` is a chain of compares.
        let opcode = view.op_own() >> 4;
        let qpn = view.qpn();
        let Some(at) = self.find(qpn) else {
            self.stats.unknown_qpn += 1;
            return false;
        };
        match opcode {
            raw::REQ => {
                let Some(send) = &self.local[at].send else {
                    self.stats.unknown_qpn += 1;
                    return false;
                };
                let Some(done) = send.retire(view.wqe_counter()) else {
                    self.stats.stale += 1;
                    return false;
                };
                // The completed WQE's opcode, byte 56 (`sop_drop_qpn >> 24`), as libmlx5 reads
                // it; a byte count only for what brought data back, as libmlx5 reports it:
                // READ its bytes, atomics their 8.
                let send_opcode = bytes[cqe::SOP_DROP_QPN_OFFSET];
                let byte_len = match send_opcode {
                    raw::RDMA_READ => view.byte_cnt(),
                    raw::ATOMIC_CS | raw::ATOMIC_FA => 8,
                    _ => 0,
                };
                *wc = WorkCompletion {
                    wr_id: done.wr_id,
                    status: WcStatus::Success,
                    opcode: send_wc_opcode(send_opcode),
                    byte_len,
                    imm: None,
                    qp_num: qpn,
                    vendor_err: 0,
                    src_qp: 0,
                };
                true
            }
            raw::RESP_SEND | raw::RESP_SEND_IMM | raw::RESP_SEND_INV | raw::RESP_WR_IMM => {
                let retired = match (&self.local[at].recv, &self.local[at].srq) {
                    (Some(recv), _) => recv.retire(),
                    // An SRQ's CQE names the slot it consumed.
                    (None, Some(srq)) => srq.complete(view.wqe_counter()),
                    (None, None) => {
                        self.stats.unknown_qpn += 1;
                        return false;
                    }
                };
                let Some(wr_id) = retired else {
                    self.stats.stale += 1;
                    return false;
                };
                *wc = WorkCompletion {
                    wr_id,
                    status: WcStatus::Success,
                    opcode: if opcode == raw::RESP_WR_IMM {
                        WcOpcode::RecvRdmaWithImm
                    } else {
                        WcOpcode::Recv
                    },
                    byte_len: view.byte_cnt(),
                    // SEND_INV carries the invalidated rkey there, not an immediate.
                    imm: matches!(opcode, raw::RESP_SEND_IMM | raw::RESP_WR_IMM)
                        .then(|| view.imm()),
                    qp_num: qpn,
                    vendor_err: 0,
                    // `flags_rqpn`, as libmlx5 reads it for a UD QP only.
                    src_qp: if self.local[at].ud {
                        view.remote_qpn()
                    } else {
                        0
                    },
                };
                true
            }
            raw::REQ_ERR | raw::RESP_ERR => self.decode_error(bytes, at, qpn, wc),
            _ => {
                // Resize, compressed or unknown formats are never asked for; count and skip.
                self.stats.stale += 1;
                false
            }
        }
    }

    #[cold]
    fn decode_error(
        &mut self,
        bytes: &[u8; cqe::SIZE],
        at: usize,
        qpn: u32,
        wc: &mut WorkCompletion,
    ) -> bool {
        let err = ErrCqe::new_unchecked(&bytes[..]);
        let status = err.syndrome().wc_status();
        let (wr_id, opcode) = if err.opcode() == CqeOpcode::ReqErr {
            let Some(send) = &self.local[at].send else {
                self.stats.unknown_qpn += 1;
                return false;
            };
            let before = send.wqe_ci();
            match send.retire(err.wqe_counter()) {
                Some(done) => {
                    self.mark.send.get_or_insert(before);
                    (done.wr_id, send_wc_opcode(err.wqe_opcode()))
                }
                None => {
                    self.stats.stale += 1;
                    return false;
                }
            }
        } else if let (None, Some(srq)) = (&self.local[at].recv, &self.local[at].srq) {
            // No mark: QPs on an SRQ are not moved to a backup (`docs/failover.md`).
            match srq.complete(err.wqe_counter()) {
                Some(wr_id) => (wr_id, WcOpcode::Recv),
                None => {
                    self.stats.stale += 1;
                    return false;
                }
            }
        } else {
            let Some(recv) = &self.local[at].recv else {
                self.stats.unknown_qpn += 1;
                return false;
            };
            let before = recv.rwqe_ci();
            match recv.retire() {
                Some(wr_id) => {
                    self.mark.recv.get_or_insert(before);
                    (wr_id, WcOpcode::Recv)
                }
                None => {
                    self.stats.stale += 1;
                    return false;
                }
            }
        };
        *wc = WorkCompletion {
            wr_id,
            status,
            opcode,
            byte_len: 0,
            imm: None,
            qp_num: qpn,
            vendor_err: err.vendor_err_synd(),
            src_qp: 0,
        };
        true
    }

    /// Moves every CQE the device has written out of the ring, in order, handing each to
    /// `take` with its QPN, without decoding it: no WQE is retired and no error mark set.
    /// Publishes the consumer index; returns how many it moved. For a CQ several QPs share
    /// whose owners each decode their own CQEs later ([`CompletionQueue::decode_moved`]), so
    /// that a QP's queues advance only when its owner takes its completions (the failover
    /// layer's shared backup CQs, `pmd::resilient::backup_cq`).
    pub(crate) fn drain_moved(&mut self, mut take: impl FnMut(u32, &[u8; cqe::SIZE])) -> u32 {
        self.refresh();
        let first = self.cqe_ci;
        while let Some(ptr) = self.owned(self.cqe_ci) {
            // SAFETY: as in `poll_into`: a whole 64-byte CQE inside the ring, owned by
            // software (checked, with the barrier) until the consumer index moves past it.
            let bytes = unsafe { &*(ptr as *const [u8; cqe::SIZE]) };
            take(Cqe64::new_unchecked(&bytes[..]).qpn(), bytes);
            self.cqe_ci = self.cqe_ci.wrapping_add(1);
        }
        let moved = self.cqe_ci.wrapping_sub(first);
        if moved != 0 {
            self.ring.publish(self.cqe_ci);
        }
        moved
    }

    /// Turns a CQE [`CompletionQueue::drain_moved`] moved out of this CQ into a completion,
    /// as a poll would have: retires its WQE and, for an error, sets the error mark. False if
    /// it names nothing outstanding (a QP reset or destroyed since: its WQEs are gone).
    pub(crate) fn decode_moved(
        &mut self,
        bytes: &[u8; cqe::SIZE],
        wc: &mut WorkCompletion,
    ) -> bool {
        self.refresh();
        self.decode(bytes, wc)
    }

    /// Drops every CQE of `qpn` still in the ring, keeping the others in order (libmlx5's
    /// `__mlx5_cq_clean`). The driver does this by itself when a QP attached to this CQ is
    /// reset or destroyed (at the next poll); this is for doing it now. Returns how many
    /// were dropped.
    pub fn discard_qp(&mut self, qpn: u32) -> u32 {
        let end = self.cqe_ci.wrapping_add(self.ready());
        self.discard_before(qpn, end)
    }

    /// Drops the CQEs of `qpn` in `[ci, end)`, all software-owned, sliding the others towards
    /// `end` so their order is kept, then moves the consumer index past the freed slots.
    fn discard_before(&mut self, qpn: u32, end: u32) -> u32 {
        let mut dropped = 0u32;
        let mut i = end;
        while i != self.cqe_ci {
            i = i.wrapping_sub(1);
            let src = self.entry(i);
            // SAFETY: the entry is software-owned (the caller's range) and inside the ring.
            let bytes = unsafe { &*(src as *const [u8; cqe::SIZE]) };
            let view = Cqe64::new_unchecked(&bytes[..]);
            if view.qpn() == qpn {
                dropped += 1;
            } else if dropped > 0 {
                let dst_ci = i.wrapping_add(dropped);
                let dst = self.entry(dst_ci);
                // The destination keeps the owner bit its own lap expects.
                let owner = u8::from(cqe::sw_owner_bit(dst_ci, self.count));
                let op_own = (view.op_own() & !cqe::OWNER_MASK) | owner;
                // SAFETY: both entries are software-owned CQEs inside the ring, 64 bytes each,
                // distinct (dropped > 0); the device does not touch them until the consumer
                // index passes them.
                unsafe { std::ptr::copy_nonoverlapping(src, dst, cqe::OP_OWN_OFFSET) };
                // The owner byte through an atomic: the control path may be reading owner
                // bytes at the same time (`CqRing::produced`).
                self.ring.op_own(dst).store(op_own, Ordering::Relaxed);
            }
        }
        if dropped > 0 {
            self.cqe_ci = self.cqe_ci.wrapping_add(dropped);
            // The moved CQEs are written before the device may reuse the freed slots
            // (libmlx5's __mlx5_cq_clean: udma_to_device_barrier, then update_cons_index).
            barrier::to_device();
            self.ring.publish(self.cqe_ci);
            self.stats.cleaned += u64::from(dropped);
        }
        dropped
    }
}

/// The mlx5 CQE and send opcodes the poller matches on, as plain numbers (hw-defs' enums
/// convert through a chain of compares; a test checks these equal the enums' values).
mod raw {
    pub const REQ: u8 = 0;
    pub const RESP_WR_IMM: u8 = 1;
    pub const RESP_SEND: u8 = 2;
    pub const RESP_SEND_IMM: u8 = 3;
    pub const RESP_SEND_INV: u8 = 4;
    pub const REQ_ERR: u8 = 13;
    pub const RESP_ERR: u8 = 14;
    pub const RDMA_WRITE: u8 = 0x08;
    pub const RDMA_WRITE_IMM: u8 = 0x09;
    pub const SEND: u8 = 0x0a;
    pub const SEND_IMM: u8 = 0x0b;
    pub const RDMA_READ: u8 = 0x10;
    pub const ATOMIC_CS: u8 = 0x11;
    pub const ATOMIC_FA: u8 = 0x12;
}

#[inline(always)]
pub(crate) fn send_wc_opcode(opcode: u8) -> WcOpcode {
    match opcode {
        raw::RDMA_WRITE | raw::RDMA_WRITE_IMM => WcOpcode::RdmaWrite,
        raw::RDMA_READ => WcOpcode::RdmaRead,
        raw::ATOMIC_CS => WcOpcode::CompSwap,
        raw::ATOMIC_FA => WcOpcode::FetchAdd,
        _ => WcOpcode::Send,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hw_defs::mlx5::SendOpcode;

    #[test]
    fn raw_opcodes_are_the_hw_defs_values() {
        let cqe = [
            (raw::REQ, CqeOpcode::Req),
            (raw::RESP_WR_IMM, CqeOpcode::RespWrImm),
            (raw::RESP_SEND, CqeOpcode::RespSend),
            (raw::RESP_SEND_IMM, CqeOpcode::RespSendImm),
            (raw::RESP_SEND_INV, CqeOpcode::RespSendInv),
            (raw::REQ_ERR, CqeOpcode::ReqErr),
            (raw::RESP_ERR, CqeOpcode::RespErr),
        ];
        for (n, op) in cqe {
            assert_eq!(n, u8::from(op), "{op:?}");
        }
        let send = [
            (raw::RDMA_WRITE, SendOpcode::RdmaWrite),
            (raw::RDMA_WRITE_IMM, SendOpcode::RdmaWriteImm),
            (raw::SEND, SendOpcode::Send),
            (raw::SEND_IMM, SendOpcode::SendImm),
            (raw::RDMA_READ, SendOpcode::RdmaRead),
            (raw::ATOMIC_CS, SendOpcode::AtomicCs),
            (raw::ATOMIC_FA, SendOpcode::AtomicFa),
        ];
        for (n, op) in send {
            assert_eq!(n, u8::from(op), "{op:?}");
        }
        assert_eq!(send_wc_opcode(u8::from(SendOpcode::Send)), WcOpcode::Send);
        assert_eq!(
            send_wc_opcode(u8::from(SendOpcode::SendImm)),
            WcOpcode::Send
        );
    }

    /// The fast loop's numbering of the four send opcodes, and each one's completion opcode,
    /// written out entry by entry and checked against the general decoder's mapping.
    #[test]
    fn fast_send_kinds_are_the_cqe_send_opcodes_and_complete_as_libmlx5_reports() {
        let expected = [
            (raw::RDMA_WRITE, FastSend::Write, WcOpcode::RdmaWrite),
            (raw::RDMA_WRITE_IMM, FastSend::WriteImm, WcOpcode::RdmaWrite),
            (raw::SEND, FastSend::Send, WcOpcode::Send),
            (raw::SEND_IMM, FastSend::SendImm, WcOpcode::Send),
        ];
        for (send_opcode, kind, opcode) in expected {
            let index = u32::from(send_opcode - raw::RDMA_WRITE);
            assert_eq!(FastSend::from_index(index), Some(kind), "{send_opcode:#x}");
            assert_eq!(FastSend::ALL[index as usize], kind);
            assert_eq!(kind.opcode(), opcode, "{kind:?}");
            assert_eq!(send_wc_opcode(send_opcode), opcode, "{kind:?}");
        }
        // What the loop's range check leaves to the general decoder.
        for index in [4, 8, 0xff, u32::MAX] {
            assert_eq!(FastSend::from_index(index), None, "{index}");
        }
    }

    /// A ring of `count` 64-byte CQEs whose first `written` positions (from 0) the device has
    /// written, with the consumer index `ci` published.
    fn ring(count: u32, written: u32, ci: u32) -> (Vec<[u8; 64]>, AtomicU32) {
        let mut entries = vec![[0u8; 64]; count as usize];
        for e in &mut entries {
            e[cqe::OP_OWN_OFFSET] = 0xf0;
        }
        for pos in 0..written {
            let owner = u8::from(cqe::sw_owner_bit(pos, count));
            entries[(pos % count) as usize][cqe::OP_OWN_OFFSET] = owner; // REQ, lap's owner bit
        }
        (entries, AtomicU32::new(ci.to_be()))
    }

    fn view(entries: &mut [[u8; 64]], dbrec: &AtomicU32) -> CqRing {
        CqRing::new(
            NonNull::from(&mut entries[0]).cast(),
            entries.len() as u32,
            64,
            NonNull::from(dbrec),
        )
    }

    #[test]
    fn the_producer_position_is_the_first_unwritten_slot_after_the_published_consumer_index() {
        // 4 slots; the device wrote positions 0..7 (its second lap up to slot 2), the poller
        // published 5: positions 5 and 6 are software's, 7 is not written yet.
        let (mut entries, dbrec) = ring(4, 7, 5);
        assert_eq!(view(&mut entries, &dbrec).produced(), 7);
        // Nothing unpolled: the producer is the consumer index.
        let (mut entries, dbrec) = ring(4, 3, 3);
        assert_eq!(view(&mut entries, &dbrec).produced(), 3);
        // A full ring stops after one lap.
        let (mut entries, dbrec) = ring(4, 6, 2);
        assert_eq!(view(&mut entries, &dbrec).produced(), 6);
    }
}
