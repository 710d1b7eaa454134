//! The send queue: building WQEs in the ring, and the doorbell that publishes them.
//!
//! Writing and publishing are separate steps. [`SendQueue::post`] validates a work request and
//! writes its WQE at the producer counter; nothing reaches the device until
//! [`SendQueue::ring_doorbell`] (everything written so far) or
//! [`SendQueue::ring_doorbell_through`] (up to and including one WQE) writes the doorbell
//! record and the doorbell register. A batch of posts shares one doorbell; the failover layer
//! withholds doorbells by simply not ringing, and copies outstanding WQEs between rings through
//! [`raw`], which only the failover layer uses.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use hw_defs::mlx5::{
    ctrl_seg, data_seg, datagram_seg, raddr_seg, wqe, DatagramSeg, DatagramSegRepr, FenceMode,
    InlineSeg, SendOpcode,
};

use super::doorbell::{Doorbell, LastWqe};
use super::gate::QpGate;
use super::track::{SendTrack, Slot};
use super::wr::{BatchPostError, Payload, PostError, Remote, SendFlags, SendOp, SendWr, Sge};
use crate::keys::{KeyTable, MrEntry};
use crate::qp_state::QpState;
use crate::verbs::{Access, UdAddress};

/// The 16-byte units of a UD SEND's datagram segment.
const DATAGRAM_UNITS: u32 = (datagram_seg::SIZE / UNIT) as u32;

pub mod raw;

const BB: usize = wqe::SEND_WQE_BB;
const UNIT: usize = wqe::SEND_WQE_DS;
const DS_PER_BB: u32 = wqe::DS_PER_BB as u32;
/// `ds` of a one-entry WRITE (control, remote address, data), as hw-defs sizes the segments.
const WRITE_ONE_SGE_DS: u8 =
    wqe::ds_for_bytes(ctrl_seg::SIZE + raddr_seg::SIZE + data_seg::SIZE) as u8;
/// `ds` of a one-entry SEND (control, data).
const SEND_ONE_SGE_DS: u8 = wqe::ds_for_bytes(ctrl_seg::SIZE + data_seg::SIZE) as u8;
/// RC messages are at most 2^31 bytes.
const MAX_MESSAGE: u64 = 1 << 31;

/// `fm_ce_se` for each combination of the SIGNALED, FENCE and SOLICITED bits of
/// [`SendFlags`], as hw-defs computes it (a test compares every entry): the reference the
/// computed [`ctrl_lo`] is tested against.
#[cfg(test)]
const FM_CE_SE: [u8; 8] = {
    let mut t = [0u8; 8];
    let mut f = 0;
    while f < 8 {
        let mut v = 0;
        if f & 1 != 0 {
            v |= ctrl_seg::CTRL_CQ_UPDATE;
        }
        if f & 2 != 0 {
            v |= ctrl_seg::CTRL_FENCE;
        }
        if f & 4 != 0 {
            v |= ctrl_seg::CTRL_SOLICITED;
        }
        t[f] = v;
        f += 1;
    }
    t
};

/// The fast path writes segments as native 8-byte stores of values laid out for a
/// little-endian CPU (x86-64, aarch64): the bytes hw-defs' `Repr`s emit (the tests compare).
const _: () = assert!(
    cfg!(target_endian = "little"),
    "the send fast path assumes a little-endian CPU"
);

/// The second 8 bytes of a control segment (signature 0, stream id 0, `fm_ce_se`, immediate
/// 0) as the fast path stores them, for each combination of SIGNALED, FENCE and SOLICITED:
/// what [`ctrl_lo`] computes, as a table to test it against.
#[cfg(test)]
const CTRL_LO: [u64; 8] = {
    let mut t = [0u64; 8];
    let mut f = 0;
    while f < 8 {
        // fm_ce_se is byte 11: bits 31..24 of the little-endian word of bytes 8..16.
        t[f] = (FM_CE_SE[f] as u64) << 24;
        f += 1;
    }
    t
};

/// [`CTRL_LO`] of `flags`, computed rather than looked up: one multiply spreads the three
/// flag bits to their `fm_ce_se` positions (bit 0 to 27, bit 1 to 31, bit 2 to 25 of the word)
/// without a table address in a register (a test compares every entry with the table).
#[inline(always)]
fn ctrl_lo(flags: SendFlags) -> u64 {
    const SPREAD: u64 = 1 << 27 | 1 << 30 | 1 << 23;
    const KEEP: u64 = 1 << 27 | 1 << 31 | 1 << 25;
    (u64::from(flags.bits() & 7) * SPREAD) & KEEP
}

/// The operations the fast path posts, in the order of [`SendQueue`]'s control templates.
const FAST_OPS: [SendOpcode; 4] = [
    SendOpcode::RdmaWrite,
    SendOpcode::RdmaWriteImm,
    SendOpcode::Send,
    SendOpcode::SendImm,
];

/// The first 8 bytes of a control segment with WQE index 0 (opmod 0, index, opcode, QPN,
/// `ds`), as a little-endian word: the fast path ORs the index in.
const fn ctrl_template(opcode: SendOpcode, qpn: u32, ds: u8) -> u64 {
    let op = match opcode {
        SendOpcode::RdmaWrite => 0x08,
        SendOpcode::RdmaWriteImm => 0x09,
        SendOpcode::Send => 0x0a,
        SendOpcode::SendImm => 0x0b,
        _ => panic!("not a fast-path opcode"),
    };
    u64::from_le_bytes([
        0,
        0,
        0,
        op,
        (qpn >> 16) as u8,
        (qpn >> 8) as u8,
        qpn as u8,
        ds,
    ])
}

/// Why a doorbell could not be rung up to a given WQE.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DoorbellError {
    /// The index is not the start of a written, unpublished WQE.
    #[error("WQE index {index:#x} is not the start of a written and unpublished WQE (published up to {published:#x}, written up to {written:#x})")]
    NotPending {
        /// The index given.
        index: u16,
        /// The published producer index.
        published: u16,
        /// The written producer index.
        written: u16,
    },
}

/// The hot half of a QP's send side: ring pointer, counters, masks, and the pointers it needs
/// to validate and to ring. Owned by one lcore; `&mut self` everywhere. Counters follow the
/// project's ring vocabulary (`docs/datapath.md`): `wqe_pi`/`wqe_ci` free-running producer
/// and consumer counters in basic blocks, `wqe_db_pi` the one in the doorbell record,
/// `wqe_m` the mask.
#[derive(Debug)]
pub struct SendQueue {
    // ---- hot: what every fast post reads or writes ----
    /// First byte of the send ring (64-byte basic blocks).
    ring: NonNull<u8>,
    /// The track's slot table (one per basic block), which the fast path writes directly.
    slots: NonNull<Slot>,
    /// Mask of the ring in basic blocks (entries - 1): a counter's block is `counter & wqe_m`.
    wqe_m: u32,
    /// Producer counter (basic blocks): everything before it is written.
    wqe_pi: u32,
    /// Producer counter where the last WQE the general path wrote starts. The fast path,
    /// whose WQEs are one block, does not keep it: the last WQE is this one if it ends at
    /// `wqe_pi` (`wqe_last_end`), else the block before `wqe_pi` ([`SendQueue::last_wqe`]).
    wqe_last_pi: u32,
    /// The producer counter up to which one-block work requests fit without looking at the
    /// consumer counters again: `wqe_pi` + min(free basic blocks, free work requests) when
    /// last counted. Only the posting thread touches it, so the room check is one compare
    /// and no atomic.
    wqe_room_pi: u32,
    /// The `meta` word of the slot of the next one-block WQE ([`Slot::meta`]): 1 block, and
    /// `wqe_extra`.
    slot_meta: u64,
    /// The first 8 bytes of the control segment of each fast-path opcode ([`FAST_OPS`]),
    /// with this QP's number and the one-entry `ds`, WQE index 0.
    ctrl: [u64; 4],
    /// The MR the last entry validated against, trusted while the key table is unchanged.
    key_cache: KeyCache,
    /// The QP's gate: state, key epoch and hold in one word (see [`QpGate`]).
    gate: Arc<QpGate>,
    /// The device's registered MRs, read lock-free.
    keys: Arc<KeyTable>,
    // ---- warm: the general path, the doorbell and the failover layer ----
    /// Mask of the ring in 16-byte units (`ds`): a unit's slot is `unit counter & wqe_ds_m`.
    wqe_ds_m: u32,
    /// Producer counter published in the doorbell record: everything before it the device
    /// may fetch.
    wqe_db_pi: u32,
    /// Consumer counter as last read from the track (the CQ advances it).
    wqe_ci: u32,
    /// Producer counter just past the WQE at `wqe_last_pi`.
    wqe_last_end: u32,
    /// Basic blocks posted beyond one per work request: `wqe_pi - wqe_extra` is the
    /// work-request counter (only the general path writes WQEs of more than one block).
    wqe_extra: u32,
    /// The granted `max_send_wr`: work requests that may be outstanding at once.
    wr_max: u32,
    /// The QP number written into every control segment.
    qpn: u32,
    /// The QP's protection domain: every entry's MR must be in it.
    pd: u32,
    /// Largest inline payload the QP was granted.
    max_inline: u32,
    /// Largest gather list the QP was granted.
    max_sge: u32,
    /// The send counter of the doorbell record (big-endian `wqe_db_pi` mod 2^16).
    dbrec: NonNull<AtomicU32>,
    /// The doorbell register (UAR/BlueFlame or the softnic's).
    doorbell: Doorbell,
    /// Per-WQE bookkeeping shared with the CQ (`wr_id`, size; `wqe_ci`).
    track: Arc<SendTrack>,
    /// The device's name, for errors.
    device: Arc<str>,
    /// Whether a post in ERR is written (to be flushed, or moved by a failover) rather than
    /// refused: set by the failover layer on its default QPs, see
    /// [`SendQueue::take_work_in_error`].
    takes_work_in_error: bool,
    /// A UD QP's queue: its sends go through [`SendQueue::post_ud`] only, with their
    /// datagram segment, and never through the fast path (its key cache stays empty).
    ud: bool,
}

// SAFETY: the ring, the doorbell record and the register are owned by the QP's provider object
// (kept alive by the Qp that owns this queue) and are not tied to a thread; the queue is used
// through `&mut self` only, by one thread at a time.
unsafe impl Send for SendQueue {}

/// Everything a send queue is built from.
pub(crate) struct SendQueueParts {
    pub ring: NonNull<u8>,
    pub bbs: u32,
    /// The granted `max_send_wr`.
    pub max_wr: u32,
    pub qpn: u32,
    pub pd: u32,
    pub max_inline: u32,
    pub max_sge: u32,
    pub dbrec: NonNull<AtomicU32>,
    pub doorbell: Doorbell,
    pub track: Arc<SendTrack>,
    pub keys: Arc<KeyTable>,
    pub gate: Arc<QpGate>,
    pub device: Arc<str>,
    /// A UD QP's queue.
    pub ud: bool,
}

#[cold]
fn unknown_lkey(lkey: u32, device: &str) -> PostError {
    PostError::UnknownLkey {
        lkey,
        device: device.to_string(),
    }
}

/// Checks one entry against the key table: known, same PD, inside, writable if it must be.
#[inline]
pub(crate) fn check_sge(
    keys: &KeyTable,
    pd: u32,
    device: &str,
    sge: &Sge,
    needs: Access,
) -> Result<MrEntry, PostError> {
    let Some(mr) = keys.get(sge.lkey) else {
        return Err(unknown_lkey(sge.lkey, device));
    };
    if mr.pd != pd {
        return Err(PostError::ForeignLkey {
            lkey: sge.lkey,
            mr_pd: mr.pd,
            qp_pd: pd,
        });
    }
    if !mr.covers(sge.addr, u64::from(sge.len)) {
        return Err(PostError::OutsideMr {
            addr: sge.addr,
            len: sge.len,
            lkey: sge.lkey,
            start: mr.addr,
            end: mr.addr + mr.len,
        });
    }
    if !mr.access.contains(needs) {
        return Err(PostError::NoLocalWrite { lkey: sge.lkey });
    }
    Ok(mr)
}

/// The last MR a queue validated against, trusted while the key table's removal generation
/// is the one read before that lookup: the common case (every post naming the same buffer)
/// then costs two compares instead of a table lookup.
#[derive(Debug, Clone, Copy)]
struct KeyCache {
    /// The MR's lkey.
    lkey: u32,
    /// The data segment's second word: the lkey, big-endian, in the high half of the
    /// little-endian word the fast path stores.
    lkey_word: u64,
    /// The key table's removal generation read before the lookup (the general path's check).
    generation: u64,
    /// The gate word under which the fast path may trust this entry: RTS, no hold, the key
    /// epoch read before the lookup.
    gate_open: u64,
    /// The MR's first byte.
    start: u64,
    /// The MR's length.
    len: u64,
    /// Whether the MR has LOCAL_WRITE.
    writable: bool,
}

impl KeyCache {
    const EMPTY: KeyCache = KeyCache {
        lkey: 0,
        lkey_word: 0,
        generation: u64::MAX,
        // The hold bit is set: no gate word the fast path compares with is ever equal.
        gate_open: u64::MAX,
        start: 0,
        len: 0,
        writable: false,
    };

    /// Whether the fast path may take `sge` on this entry: a length of 1..2^31 - 1 bytes (as
    /// one signed compare: 0 would mean 2 GiB to the NIC, exactly 2^31, allowed, takes the
    /// general path), this lkey, inside the MR.
    #[inline(always)]
    fn takes(&self, sge: &Sge) -> bool {
        (sge.len as i32) > 0 && sge.lkey == self.lkey && self.covers(sge.addr, sge.len)
    }

    /// Whether `[addr, addr + len)` lies in the cached MR.
    #[inline(always)]
    fn covers(&self, addr: u64, len: u32) -> bool {
        // Below the MR's start the offset wraps to a huge number: adding the length either
        // carries (the entry straddles the start) or stays above the MR's length.
        let (end, carried) = addr
            .wrapping_sub(self.start)
            .overflowing_add(u64::from(len));
        !carried && end <= self.len
    }
}

/// What a one-block WQE of one opcode is built from besides the work request: the control
/// template, the key cache's lkey word and the slot's meta word. A single post builds it where
/// it writes (each field loaded where it is used); a run of posts builds it once, so the run
/// keeps it in registers (the ring stores go through raw pointers, which the compiler must
/// assume may alias the queue's own fields, so it would load them again after every WQE).
#[derive(Clone, Copy)]
struct BlockTemplate {
    /// The first 8 bytes of the control segment with WQE index 0.
    ctrl: u64,
    /// The data segment's lkey word.
    lkey_word: u64,
    /// The track slot's meta word.
    slot_meta: u64,
}

impl BlockTemplate {
    /// For WQEs of opcode `FAST_OPS[T]` on `q`.
    #[inline(always)]
    fn of<const T: usize>(q: &SendQueue) -> BlockTemplate {
        BlockTemplate {
            ctrl: q.ctrl[T],
            lkey_word: q.key_cache.lkey_word,
            slot_meta: q.slot_meta,
        }
    }
}

/// What the fast path reads of a request besides its opcode and entry: read through the
/// reference when the WQE is written, not carried in registers across the room and key
/// checks before it.
pub trait FastRequest {
    /// Returned in the completion.
    fn wr_id(&self) -> u64;
    /// Signaled, fenced, solicited.
    fn flags(&self) -> SendFlags;
}

impl FastRequest for SendWr<'_> {
    #[inline(always)]
    fn wr_id(&self) -> u64 {
        self.wr_id
    }
    #[inline(always)]
    fn flags(&self) -> SendFlags {
        self.flags
    }
}

/// A request's id and flags, for [`SendQueue::post_fast_parts`].
#[derive(Debug, Clone, Copy)]
pub struct RequestParts {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Signaled, fenced, solicited.
    pub flags: SendFlags,
}

impl FastRequest for RequestParts {
    #[inline(always)]
    fn wr_id(&self) -> u64 {
        self.wr_id
    }
    #[inline(always)]
    fn flags(&self) -> SendFlags {
        self.flags
    }
}

/// Writes the one-block WQE of opcode `FAST_OPS[T]` (the one `t` is for) at producer counter
/// `at`, into ring block `bb`, and its track slot `slot`. The caller has checked the entry
/// (key cache), the gate and the room, and addressed `bb` and `slot` for `at`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn write_block_at<const T: usize>(
    t: BlockTemplate,
    bb: *mut u8,
    slot: *mut Slot,
    at: u32,
    wr: &impl FastRequest,
    sge: &Sge,
    remote: Remote,
    imm: u32,
) {
    // The control segment's first word with the WQE index (big-endian) in bytes 1..3.
    let index_bytes = ((at << 8) & 0x00ff_ff00).swap_bytes();
    let ctrl_hi = t.ctrl | u64::from(index_bytes);
    let ctrl_lo = ctrl_lo(wr.flags()) | (u64::from(imm.to_be()) << 32);
    let data_hi = u64::from(sge.len.to_be()) | t.lkey_word;
    let data_lo = sge.addr.to_be();
    // SAFETY: `bb` is the 64-byte block (8 words) of `at` inside the ring, 8-byte aligned (the
    // ring is page-aligned); it is free (the caller checked the room) and unpublished, and
    // the caller's `&mut SendQueue` keeps other writers out. A one-block WQE never wraps.
    unsafe {
        let bb = bb.cast::<u64>();
        if FAST_OPS[T].has_raddr_seg() {
            bb.add(2).write(remote.addr.to_be());
            bb.add(3).write(u64::from(remote.rkey.to_be()));
            bb.add(4).write(data_hi);
            bb.add(5).write(data_lo);
        } else {
            bb.add(2).write(data_hi);
            bb.add(3).write(data_lo);
        }
        bb.write(ctrl_hi);
        bb.add(1).write(ctrl_lo);
    }
    // SAFETY: `slot` is the track's slot of `at`, alive as long as the track the queue holds.
    let slot = unsafe { &*slot };
    slot.wr_id.store(wr.wr_id(), Ordering::Relaxed);
    slot.meta.store(t.slot_meta, Ordering::Relaxed);
}

/// The segments of a send WQE written as whole 8-byte big-endian stores: the bytes
/// `CtrlSegRepr`, `RaddrSegRepr`, `AtomicSegRepr` and `DataSegRepr` emit (the tests compare
/// them), in fewer instructions than field-by-field setters.
mod emit {
    #[inline(always)]
    fn put(unit: &mut [u8; 16], hi: u64, lo: u64) {
        unit[..8].copy_from_slice(&hi.to_be_bytes());
        unit[8..].copy_from_slice(&lo.to_be_bytes());
    }

    /// Control segment: opmod 0, WQE index, opcode | QPN, ds | signature 0, stream id 0,
    /// fm_ce_se | immediate.
    #[inline(always)]
    pub fn ctrl(
        unit: &mut [u8; 16],
        opcode: u8,
        index: u16,
        qpn: u32,
        ds: u8,
        fm_ce_se: u8,
        imm: u32,
    ) {
        let opmod_idx_opcode = (u32::from(index) << 8) | u32::from(opcode);
        let qpn_ds = ((qpn & 0x00ff_ffff) << 8) | u32::from(ds & 0x3f);
        put(
            unit,
            (u64::from(opmod_idx_opcode) << 32) | u64::from(qpn_ds),
            (u64::from(fm_ce_se) << 32) | u64::from(imm),
        );
    }

    /// Remote-address segment: raddr | rkey, reserved 0.
    #[inline(always)]
    pub fn raddr(unit: &mut [u8; 16], raddr: u64, rkey: u32) {
        put(unit, raddr, u64::from(rkey) << 32);
    }

    /// Atomic segment: swap or add | compare.
    #[inline(always)]
    pub fn atomic(unit: &mut [u8; 16], swap_add: u64, compare: u64) {
        put(unit, swap_add, compare);
    }

    /// Data segment: byte count, lkey | address.
    #[inline(always)]
    pub fn data(unit: &mut [u8; 16], byte_count: u32, lkey: u32, addr: u64) {
        put(unit, (u64::from(byte_count) << 32) | u64::from(lkey), addr);
    }
}

/// The entry of a work request that gathers from exactly one, kept inline in its list (an
/// inline list's length is the one word the test reads).
#[inline(always)]
fn one_entry<'a>(wr: &'a SendWr<'_>) -> Option<&'a Sge> {
    let Payload::Gather(sges) = &wr.payload else {
        return None;
    };
    if sges.len() != 1 || sges.spilled() {
        return None;
    }
    sges.first()
}

#[cold]
fn not_ready(qpn: u32, state: u8) -> PostError {
    PostError::NotReadyToSend {
        qpn,
        state: QpState::from_ibv(state).unwrap_or(QpState::Err),
    }
}

impl SendQueue {
    pub(crate) fn new(p: SendQueueParts) -> SendQueue {
        let ds = [
            WRITE_ONE_SGE_DS,
            WRITE_ONE_SGE_DS,
            SEND_ONE_SGE_DS,
            SEND_ONE_SGE_DS,
        ];
        SendQueue {
            ring: p.ring,
            slots: p.track.slots_ptr(),
            wqe_m: p.bbs - 1,
            wqe_pi: 0,
            wqe_last_pi: 0,
            wqe_room_pi: 0,
            slot_meta: Slot::meta(1, 0),
            ctrl: std::array::from_fn(|i| ctrl_template(FAST_OPS[i], p.qpn, ds[i])),
            key_cache: KeyCache::EMPTY,
            wqe_ds_m: p.bbs * DS_PER_BB - 1,
            wqe_db_pi: 0,
            wqe_ci: 0,
            // Matches no counter until a WQE is written (`last_wqe`).
            wqe_last_end: u32::MAX,
            wqe_extra: 0,
            // A provider granting more work requests than the ring holds blocks would let the
            // ring overrun: the ring bounds them too.
            wr_max: p.max_wr.min(p.bbs),
            qpn: p.qpn,
            pd: p.pd,
            max_inline: p.max_inline,
            max_sge: p.max_sge,
            dbrec: p.dbrec,
            doorbell: p.doorbell,
            track: p.track,
            keys: p.keys,
            gate: p.gate,
            device: p.device,
            takes_work_in_error: false,
            ud: p.ud,
        }
    }

    /// From now on a post while the QP is in ERR is validated and written, as the IB spec has
    /// a QP in ERR take work requests (they complete with `WR_FLUSH_ERR` once rung), instead of
    /// refused with [`PostError::NotReadyToSend`]. For a resilient QP's default QP: the
    /// service lcore's link watch moves it to ERR from its own thread, and the owner may post
    /// before it has taken that news; the failover round then moves such WQEs to the backup
    /// with every WQE the watch caught in flight. Lives in the general path, so the fast path
    /// (RTS only) is unchanged.
    pub(crate) fn take_work_in_error(&mut self) {
        self.takes_work_in_error = true;
    }

    /// Work requests written and not yet completed (the consumer counter read afresh).
    pub fn outstanding_requests(&mut self) -> u32 {
        self.wr_max - self.free().1
    }

    /// The most work requests the queue holds at once (what the device granted, bounded by
    /// the ring's basic blocks): a post past it is refused with [`PostError::QueueFull`].
    pub fn max_requests(&self) -> u32 {
        self.wr_max
    }

    /// Basic blocks in the ring.
    pub fn capacity(&self) -> u32 {
        self.wqe_m + 1
    }

    /// The producer counter of written WQEs (`wqe_pi`, basic blocks).
    pub fn written(&self) -> u32 {
        self.wqe_pi
    }

    /// The producer counter the device has been told about (`wqe_db_pi`).
    pub fn published(&self) -> u32 {
        self.wqe_db_pi
    }

    /// The consumer counter (`wqe_ci`): everything before it has completed.
    pub fn completed(&self) -> u32 {
        self.track.wqe_ci()
    }

    /// The QP number written into every control segment.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// The 16 bytes of unit `u` of the WQE starting at counter `start`, wrapping.
    #[inline(always)]
    fn unit(&mut self, start: u32, u: u32) -> &mut [u8; UNIT] {
        let index = (start.wrapping_mul(DS_PER_BB).wrapping_add(u) & self.wqe_ds_m) as usize;
        // SAFETY: index <= wqe_ds_m, so the 16 bytes lie inside the ring; they belong to a
        // slot between the producer and consumer counters, which the device does not read
        // (it reads only what a doorbell published and has not completed), and `&mut self`
        // keeps other writers out.
        unsafe { &mut *(self.ring.as_ptr().add(index * UNIT) as *mut [u8; UNIT]) }
    }

    /// Basic blocks and work requests free now: the consumer counters read afresh.
    fn free(&mut self) -> (u32, u32) {
        let ci = self.track.wqe_ci();
        self.wqe_ci = ci;
        let blocks = (self.wqe_m + 1).saturating_sub(self.wqe_pi.wrapping_sub(ci));
        // The work requests before the oldest outstanding WQE's are done; with nothing
        // outstanding, all are.
        let wr_pi = self.wqe_pi.wrapping_sub(self.wqe_extra);
        let wr_ci = if ci == self.wqe_pi {
            wr_pi
        } else {
            ci.wrapping_sub(self.track.extra(ci))
        };
        let requests = self.wr_max.saturating_sub(wr_pi.wrapping_sub(wr_ci));
        (blocks, requests)
    }

    /// The fast path ran out of room: counts again. Whether there is room now.
    #[cold]
    #[inline(never)]
    fn refill_room(&mut self) -> bool {
        self.count_room();
        // Keep `wqe_last_end` within a ring of `wqe_pi`, so its test in `last_wqe` never
        // meets a counter that wrapped around.
        let last = self.last_wqe();
        if last != self.wqe_last_pi {
            self.wqe_last_pi = last;
            self.wqe_last_end = last.wrapping_add(1);
        }
        self.wqe_room_pi != self.wqe_pi
    }

    /// Where the last written WQE starts (when one was written).
    #[inline]
    fn last_wqe(&self) -> u32 {
        if self.wqe_last_end == self.wqe_pi {
            self.wqe_last_pi
        } else {
            // One-block WQEs of the fast path came after it.
            self.wqe_pi.wrapping_sub(1)
        }
    }

    /// Sets `wqe_room_pi` from the consumer counters.
    fn count_room(&mut self) {
        let (blocks, requests) = self.free();
        self.wqe_room_pi = self.wqe_pi.wrapping_add(blocks.min(requests));
    }

    /// Makes room for one work request of `bbs` basic blocks or says the queue is full.
    fn reserve(&mut self, bbs: u32) -> Result<(), PostError> {
        let (blocks, requests) = self.free();
        if requests == 0 {
            return Err(PostError::QueueFull {
                queue: "send",
                outstanding: self.wr_max,
                capacity: self.wr_max,
                needed: 1,
            });
        }
        if blocks < bbs {
            let capacity = self.wqe_m + 1;
            return Err(PostError::QueueFull {
                queue: "send ring (basic blocks)",
                outstanding: capacity - blocks,
                capacity,
                needed: bbs,
            });
        }
        Ok(())
    }

    /// Validates `wr` and writes its WQE; returns its WQE index. Nothing is published until a
    /// doorbell; on error nothing is written.
    #[inline]
    pub fn post(&mut self, wr: &SendWr<'_>) -> Result<u16, PostError> {
        match self.post_fast(wr) {
            Some(index) => Ok(index),
            None => self.post_general(wr, true),
        }
    }

    /// The common case in few instructions: a WRITE or SEND (with or without immediate) of one
    /// entry in the MR of the key cache, on a QP in RTS with room. `None` means "not this
    /// case" (nothing written); the general path then decides, including every error.
    #[inline(always)]
    pub(crate) fn post_fast(&mut self, wr: &SendWr<'_>) -> Option<u16> {
        self.post_fast_counting(wr, &mut 0)
    }

    /// [`SendQueue::post_fast`] for a request given by its parts rather than a [`SendWr`]
    /// (the verbs shim, which holds an `ibv_send_wr`; its id and flags are read through `wr`
    /// only when the WQE is written, after the checks): the WRITE, WRITE with immediate, SEND or
    /// SEND with immediate `op` of the one gather entry `sge`. `None` means "not this case"
    /// (nothing written): the caller then posts the whole [`SendWr`] through
    /// [`SendQueue::post`], which makes every check and gives every error, so a request the
    /// fast path takes is one `post` would have taken the same way.
    #[inline(always)]
    pub fn post_fast_parts(&mut self, wr: &impl FastRequest, op: SendOp, sge: &Sge) -> Option<u16> {
        self.post_fast_parts_counting(wr, op, sge, &mut 0)
    }

    /// [`SendQueue::post_fast_parts`], adding one to `two_sided` for a work request that
    /// consumes a receive at the peer, as [`SendQueue::post_fast_counting`] does.
    #[inline(always)]
    pub(crate) fn post_fast_parts_counting(
        &mut self,
        wr: &impl FastRequest,
        op: SendOp,
        sge: &Sge,
        two_sided: &mut u64,
    ) -> Option<u16> {
        let index = match op {
            SendOp::Write { remote } => return self.fast_one::<0>(wr, sge, remote, 0),
            SendOp::WriteImm { remote, imm } => self.fast_one::<1>(wr, sge, remote, imm),
            SendOp::Send => self.fast_one::<2>(wr, sge, Remote::default(), 0),
            SendOp::SendImm { imm } => self.fast_one::<3>(wr, sge, Remote::default(), imm),
            _ => None,
        }?;
        *two_sided += 1;
        Some(index)
    }

    /// [`SendQueue::post_fast`], adding one to `two_sided` for a work request that consumes a
    /// receive at the peer (SEND, SEND with immediate, WRITE with immediate): the failover
    /// layer's count, kept where the opcode is known anyway, so a WRITE pays nothing for it.
    ///
    /// What makes it short: a WRITE is tested for first and gets its own copy of the path
    /// (the other three share an out-of-line one); the room check comes first, while nothing
    /// else is live; the control segment is a per-QP template with only the WQE index ORed
    /// in; every segment is two native 8-byte stores of values laid out in advance; state,
    /// key epoch and hold are one compare ([`QpGate`]); the lkey one compare against the key
    /// cache and the bounds one add-and-compare; the room one compare of this thread's own
    /// counters, so no atomic is read unless the queue looks full.
    #[inline(always)]
    pub(crate) fn post_fast_counting(
        &mut self,
        wr: &SendWr<'_>,
        two_sided: &mut u64,
    ) -> Option<u16> {
        let sge = one_entry(wr)?;
        if let SendOp::Write { remote } = wr.op {
            return self.fast_one::<0>(wr, sge, remote, 0);
        }
        let index = self.fast_two_sided(wr, sge)?;
        *two_sided += 1;
        Some(index)
    }

    /// The fast path of the opcodes that consume a receive at the peer.
    #[inline(never)]
    fn fast_two_sided(&mut self, wr: &SendWr<'_>, sge: &Sge) -> Option<u16> {
        match wr.op {
            SendOp::WriteImm { remote, imm } => self.fast_one::<1>(wr, sge, remote, imm),
            SendOp::Send => self.fast_one::<2>(wr, sge, Remote::default(), 0),
            SendOp::SendImm { imm } => self.fast_one::<3>(wr, sge, Remote::default(), imm),
            _ => None,
        }
    }

    /// The fast path for the opcode `FAST_OPS[T]`.
    #[inline(always)]
    fn fast_one<const T: usize>(
        &mut self,
        wr: &impl FastRequest,
        sge: &Sge,
        remote: Remote,
        imm: u32,
    ) -> Option<u16> {
        let start = self.wqe_pi;
        if start == self.wqe_room_pi && !self.refill_room() {
            return None;
        }
        let c = &self.key_cache;
        if !(c.takes(sge) && self.gate.word() == c.gate_open) {
            return None;
        }
        let i = (start & self.wqe_m) as usize;
        // SAFETY: i <= wqe_m: the block and the slot lie inside the ring and the track.
        let (bb, slot) = unsafe { (self.ring.as_ptr().add(i * BB), self.slots.as_ptr().add(i)) };
        write_block_at::<T>(
            BlockTemplate::of::<T>(self),
            bb,
            slot,
            start,
            wr,
            sge,
            remote,
            imm,
        );
        self.wqe_pi = start.wrapping_add(1);
        Some(start as u16)
    }

    /// Posts the run of one-entry RDMA WRITEs at the head of `wrs` that the fast path takes
    /// (stopping at anything else, at the first that needs the general path, or when the ring
    /// has no more room); returns how many. The checks one post makes about the QP (gate,
    /// room) are made once for the run, as DPDK's Tx burst does; each work request's own
    /// entry is checked against the key cache as one post checks it.
    #[inline(always)]
    pub(crate) fn post_write_run(&mut self, wrs: &[SendWr<'_>]) -> usize {
        if self.gate.word() != self.key_cache.gate_open {
            return 0;
        }
        let start = self.wqe_pi;
        if start == self.wqe_room_pi && !self.refill_room() {
            return 0;
        }
        let room = self.wqe_room_pi.wrapping_sub(start) as usize;
        let c = self.key_cache;
        let template = BlockTemplate::of::<0>(self);
        let wrs = &wrs[..wrs.len().min(room)];
        // Up to the ring's end, then from its start: within each part the block and slot
        // pointers just advance.
        let i = start & self.wqe_m;
        let (head, tail) = wrs.split_at(wrs.len().min((self.wqe_m - i + 1) as usize));
        let mut pi = start;
        'parts: for (part, from) in [(head, i), (tail, 0)] {
            // SAFETY: from <= wqe_m: inside the ring and the track.
            let (bb, slot) = unsafe {
                (
                    self.ring.as_ptr().add(from as usize * BB),
                    self.slots.as_ptr().add(from as usize),
                )
            };
            for (k, wr) in part.iter().enumerate() {
                let Some(sge) = one_entry(wr) else {
                    pi = pi.wrapping_add(k as u32);
                    break 'parts;
                };
                let (SendOp::Write { remote }, true) = (wr.op, c.takes(sge)) else {
                    pi = pi.wrapping_add(k as u32);
                    break 'parts;
                };
                let at = pi.wrapping_add(k as u32);
                write_block_at::<0>(
                    template,
                    bb.wrapping_add(k * BB),
                    slot.wrapping_add(k),
                    at,
                    wr,
                    sge,
                    remote,
                    0,
                );
            }
            pi = pi.wrapping_add(part.len() as u32);
        }
        self.wqe_pi = pi;
        pi.wrapping_sub(start) as usize
    }

    /// Posts `wrs` in order, as `ibv_post_send` posts a list: runs of one-entry WRITEs through
    /// [`SendQueue::post_write_run`], the rest one by one. Stops at the first work request
    /// refused: those before it are written, it and those after are not.
    pub fn post_batch(&mut self, wrs: &[SendWr<'_>]) -> Result<(), BatchPostError> {
        post_in_order(self, wrs)
    }

    /// Holds the fast path (every post takes the general path) or releases it: for a layer
    /// above the QP whose posts must go elsewhere meanwhile (see [`QpGate`]).
    pub fn hold_fast_path(&self, hold: bool) {
        if self.gate.held() != hold {
            self.gate.set_hold(hold);
        }
    }

    /// Validates `wr` and writes its WQE whatever the QP's state, for a WQE whose doorbell is
    /// withheld: the failover layer writes the application's WRs into the ring of a default
    /// QP in ERR while a failover round runs, and moves them to the backup QP before any
    /// doorbell. Every other check is made.
    pub fn post_withheld(&mut self, wr: &SendWr<'_>) -> Result<u16, PostError> {
        self.post_general(wr, false)
    }

    /// Every work request, with every check and every error.
    fn post_general(&mut self, wr: &SendWr<'_>, check_state: bool) -> Result<u16, PostError> {
        if self.ud {
            return Err(PostError::UdNeedsAddress { qpn: self.qpn });
        }
        self.write_checked(wr, check_state, None)
    }

    /// Validates a UD SEND (SEND or SEND with immediate) to `dest` and writes its WQE: the
    /// control segment, the datagram segment (the extended address vector: `dest`'s GID, QPN
    /// and Q_Key; the MAC left zero, which softnic does not read), then the data. Only on a UD
    /// QP's queue. Cold next to RC's paths: a UD QP carries control traffic.
    pub fn post_ud(&mut self, wr: &SendWr<'_>, dest: &UdAddress) -> Result<u16, PostError> {
        if !self.ud {
            return Err(PostError::NotUd { qpn: self.qpn });
        }
        if !matches!(wr.op, SendOp::Send | SendOp::SendImm { .. }) {
            return Err(PostError::NotUdOperation {
                op: op_name(&wr.op),
            });
        }
        self.write_checked(wr, true, Some(dest))
    }

    /// Checks `wr` and writes its WQE, with a datagram segment to `dest` when given.
    fn write_checked(
        &mut self,
        wr: &SendWr<'_>,
        check_state: bool,
        dest: Option<&UdAddress>,
    ) -> Result<u16, PostError> {
        let state = self.gate.state();
        let taken_in_error = self.takes_work_in_error && state == QpState::Err as u8;
        if check_state && state != QpState::Rts as u8 && !taken_in_error {
            return Err(not_ready(self.qpn, state));
        }
        let opcode = wr.op.opcode();
        let datagram_units = if dest.is_some() { DATAGRAM_UNITS } else { 0 };
        let header_units = wqe::header_ds(opcode) as u32 + datagram_units;
        let data_units = match &wr.payload {
            Payload::Gather(sges) => self.check_gather(&wr.op, sges)?,
            Payload::Inline(data) => {
                if wr.op.writes_locally() {
                    return Err(PostError::InlineNotAllowed {
                        op: op_name(&wr.op),
                    });
                }
                if data.len() > self.max_inline as usize {
                    return Err(PostError::InlineTooLong {
                        len: data.len(),
                        max: self.max_inline,
                    });
                }
                if data.is_empty() {
                    0
                } else {
                    wqe::inline_ds(data.len()) as u32
                }
            }
        };
        let ds = header_units + data_units;
        let bbs = ds.div_ceil(DS_PER_BB);
        self.reserve(bbs)?;

        let start = self.wqe_pi;
        let signaled = wr.flags.contains(SendFlags::SIGNALED);
        let imm = match wr.op {
            SendOp::WriteImm { imm, .. } | SendOp::SendImm { imm } => imm,
            _ => 0,
        };
        let fence = if wr.flags.contains(SendFlags::FENCE) {
            FenceMode::SmallAndFence
        } else {
            FenceMode::None
        };
        let fm_ce_se = ctrl_seg::fm_ce_se(fence, signaled, wr.flags.contains(SendFlags::SOLICITED));
        let (qpn, ds8) = (self.qpn, ds as u8);
        emit::ctrl(
            self.unit(start, 0),
            u8::from(opcode),
            start as u16,
            qpn,
            ds8,
            fm_ce_se,
            imm,
        );
        match wr.op {
            SendOp::Write { remote }
            | SendOp::WriteImm { remote, .. }
            | SendOp::Read { remote } => {
                emit::raddr(self.unit(start, 1), remote.addr, remote.rkey);
            }
            SendOp::CompareSwap {
                remote,
                compare,
                swap,
            } => {
                self.write_atomic(start, remote.addr, remote.rkey, swap, compare);
            }
            SendOp::FetchAdd { remote, add } => {
                self.write_atomic(start, remote.addr, remote.rkey, add, 0);
            }
            SendOp::Send | SendOp::SendImm { .. } => {}
        }
        if let Some(dest) = dest {
            self.write_datagram(start, dest);
        }
        // The data follows the header segments.
        let mut u = header_units;
        match &wr.payload {
            Payload::Gather(sges) => {
                for sge in sges.iter().filter(|s| s.len != 0) {
                    emit::data(self.unit(start, u), sge.len, sge.lkey, sge.addr);
                    u += 1;
                }
            }
            Payload::Inline(data) if !data.is_empty() => self.write_inline(start, u, data),
            Payload::Inline(_) => {}
        }
        Ok(self.commit(start, wr.wr_id, bbs))
    }

    /// Records a WQE written at `start` and moves the producer counters past it.
    fn commit(&mut self, start: u32, wr_id: u64, bbs: u32) -> u16 {
        self.track.record(start, wr_id, bbs, self.wqe_extra);
        self.wqe_extra = self.wqe_extra.wrapping_add(bbs - 1);
        self.slot_meta = Slot::meta(1, self.wqe_extra);
        self.wqe_last_pi = start;
        self.wqe_last_end = start.wrapping_add(bbs);
        self.wqe_pi = start.wrapping_add(bbs);
        // What the fast path may post now, counted afresh.
        self.count_room();
        start as u16
    }

    /// Validates a gather (or, for READ and atomics, scatter) list; returns its data units.
    #[inline]
    fn check_gather(&mut self, op: &SendOp, sges: &[Sge]) -> Result<u32, PostError> {
        if sges.len() > self.max_sge as usize {
            return Err(PostError::TooManySges {
                count: sges.len(),
                max: self.max_sge,
                queue: "send",
            });
        }
        let needs = if op.writes_locally() {
            Access::LOCAL_WRITE
        } else {
            Access::NONE
        };
        let mut units = 0;
        let mut bytes = 0u64;
        for sge in sges {
            // Zero-length entries are skipped, as libmlx5 does: a data segment with byte count
            // 0 would mean 2 GiB to the NIC.
            if sge.len == 0 {
                continue;
            }
            self.check_sge_cached(sge, needs)?;
            units += 1;
            bytes += u64::from(sge.len);
        }
        if op.is_atomic() {
            let remote = match op {
                SendOp::CompareSwap { remote, .. } | SendOp::FetchAdd { remote, .. } => remote.addr,
                _ => 0,
            };
            if units != 1 || bytes != 8 {
                return Err(PostError::AtomicSge {
                    count: sges.len(),
                    bytes,
                });
            }
            if remote % 8 != 0 {
                return Err(PostError::MisalignedAtomic { addr: remote });
            }
        }
        if bytes > MAX_MESSAGE {
            return Err(PostError::MessageTooLong { bytes });
        }
        Ok(units)
    }

    /// Validates one entry, through the key cache when it can.
    #[inline(always)]
    fn check_sge_cached(&mut self, sge: &Sge, needs: Access) -> Result<(), PostError> {
        let c = self.key_cache;
        let writable = c.writable || needs == Access::NONE;
        if sge.lkey == c.lkey
            && self.keys.generation() == c.generation
            && c.covers(sge.addr, sge.len)
            && writable
        {
            return Ok(());
        }
        self.check_sge_slow(sge, needs)
    }

    /// The full check (which names what is wrong), refilling the key cache on success.
    #[inline(never)]
    fn check_sge_slow(&mut self, sge: &Sge, needs: Access) -> Result<(), PostError> {
        // The old entry's key is no longer watched from here on: it may not be trusted even if
        // this lookup fails.
        self.key_cache = KeyCache::EMPTY;
        self.gate.watch_key(sge.lkey);
        // Both read before the lookup (and after the watch): a removal after this moves them,
        // and the cache goes stale; one before it, and the lookup does not find the MR.
        let generation = self.keys.generation();
        let gate = self.gate.word();
        let mr = check_sge(&self.keys, self.pd, &self.device, sge, needs)?;
        if self.ud {
            // No fast path on a UD QP: it would write an RC WQE, without a destination.
            return Ok(());
        }
        self.key_cache = KeyCache {
            lkey: mr.lkey,
            lkey_word: u64::from(mr.lkey.to_be()) << 32,
            generation,
            gate_open: QpGate::open_word(gate),
            start: mr.addr,
            len: mr.len,
            writable: mr.access.contains(Access::LOCAL_WRITE),
        };
        Ok(())
    }

    /// Writes a UD SEND's datagram segment at units 1 to 3 (in the WQE's first block, so no
    /// wrap inside it).
    fn write_datagram(&mut self, start: u32, dest: &UdAddress) {
        let mut seg = [0u8; datagram_seg::SIZE];
        DatagramSegRepr {
            qkey: dest.qkey,
            dqp: dest.qpn,
            rmac: [0; 6],
            tclass: 0,
            hop_limit: 64,
            rgid: dest.gid.0,
        }
        .emit(&mut DatagramSeg::new_unchecked(&mut seg[..]));
        for (i, unit) in seg.chunks_exact(UNIT).enumerate() {
            self.unit(start, 1 + i as u32).copy_from_slice(unit);
        }
    }

    #[inline]
    fn write_atomic(&mut self, start: u32, raddr: u64, rkey: u32, swap_add: u64, compare: u64) {
        emit::raddr(self.unit(start, 1), raddr, rkey);
        emit::atomic(self.unit(start, 2), swap_add, compare);
    }

    /// Writes an inline segment at unit `u`: the 4-byte header, then the payload, continuing
    /// at the ring's start when it reaches the end.
    fn write_inline(&mut self, start: u32, u: u32, data: &[u8]) {
        InlineSeg::new_unchecked(&mut self.unit(start, u)[..]).set_payload_len(data.len() as u32);
        let ring_len = (self.wqe_ds_m as usize + 1) * UNIT;
        let first = (start.wrapping_mul(DS_PER_BB).wrapping_add(u) & self.wqe_ds_m) as usize * UNIT;
        let mut at = first + hw_defs::mlx5::inline_seg::HEADER_SIZE;
        let mut rest = data;
        while !rest.is_empty() {
            if at == ring_len {
                at = 0;
            }
            let n = rest.len().min(ring_len - at);
            // SAFETY: [at, at + n) lies inside the ring (n <= ring_len - at); the bytes belong
            // to this unpublished WQE (max_inline keeps the WQE within its reserved blocks).
            unsafe {
                std::ptr::copy_nonoverlapping(rest.as_ptr(), self.ring.as_ptr().add(at), n);
            }
            at += n;
            rest = &rest[n..];
        }
    }

    /// Publishes every WQE written so far: the doorbell record, then the doorbell register.
    /// Does nothing when nothing is pending.
    #[inline]
    pub fn ring_doorbell(&mut self) {
        if self.wqe_pi == self.wqe_db_pi {
            return;
        }
        let (wqe_pi, last_pi) = (self.wqe_pi, self.last_wqe());
        self.publish(wqe_pi, last_pi);
    }

    /// Publishes the written WQEs up to and including the one at WQE index `index`, which
    /// must start a written WQE that has not been published; later WQEs stay withheld.
    pub fn ring_doorbell_through(&mut self, index: u16) -> Result<(), DoorbellError> {
        let pending = self.wqe_pi.wrapping_sub(self.wqe_db_pi);
        let distance = u32::from(index.wrapping_sub(self.wqe_db_pi as u16));
        let refuse = || DoorbellError::NotPending {
            index,
            published: self.wqe_db_pi as u16,
            written: self.wqe_pi as u16,
        };
        if distance >= pending {
            return Err(refuse());
        }
        // Walk the WQEs from the published counter so an index inside a WQE is refused.
        let target = self.wqe_db_pi.wrapping_add(distance);
        let mut at = self.wqe_db_pi;
        while at != target {
            at = at.wrapping_add(self.track.bbs(at).max(1));
            if at.wrapping_sub(self.wqe_db_pi) > distance {
                return Err(refuse());
            }
        }
        self.publish(target.wrapping_add(self.track.bbs(target)), target);
        Ok(())
    }

    /// Publishes the WQEs before `wqe_db_pi`, the last of which starts at `last_pi`.
    #[inline]
    fn publish(&mut self, wqe_db_pi: u32, last_pi: u32) {
        // Release: every WQE byte written before this store is visible to the device before it
        // can see the new counter (libmlx5's udma_to_device_barrier in post_send_db). The
        // record holds the counter mod 2^16, big-endian.
        // The CQ checks completions against the published counter (a CQE can only name a
        // published WQE); the release store below carries this store to the poller too.
        self.track.set_wqe_db_pi(wqe_db_pi);
        // The device may be outside the CPUs' shareability domain (aarch64: `dmb oshst`).
        super::barrier::to_device();
        // SAFETY: dbrec points into the QP's doorbell record, alive as long as the QP.
        let dbrec = unsafe { self.dbrec.as_ref() };
        dbrec.store(u32::from(wqe_db_pi as u16).to_be(), Ordering::Release);
        let single = last_pi == self.wqe_db_pi;
        self.doorbell.ring(LastWqe {
            ring: self.ring,
            wqe_m: self.wqe_m,
            start: last_pi,
            bbs: self.track.bbs(last_pi),
            blueflame_ok: single,
        });
        self.wqe_db_pi = wqe_db_pi;
    }

    /// Back to index 0 (the QP went to RESET).
    pub(crate) fn reset(&mut self) {
        self.wqe_pi = 0;
        self.wqe_db_pi = 0;
        self.wqe_last_pi = 0;
        self.wqe_last_end = u32::MAX;
        self.wqe_ci = 0;
        self.wqe_extra = 0;
        self.slot_meta = Slot::meta(1, 0);
        // The fast path counts afresh at its next post.
        self.wqe_room_pi = 0;
        self.key_cache = KeyCache::EMPTY;
        self.track.reset();
        // As the receive queue's: the record restarts at 0 with the device's counter.
        // SAFETY: dbrec points into the QP's doorbell record, alive as long as the QP; the
        // QP is in RESET, where the device does not read it.
        unsafe { self.dbrec.as_ref() }.store(0, Ordering::Release);
    }

    /// The key table this queue validates against.
    pub fn keys(&self) -> &Arc<KeyTable> {
        &self.keys
    }
}

/// What posts a list of work requests: a send queue's burst path for runs of one-entry RDMA
/// WRITEs, and a way to post any one work request.
pub(crate) trait BatchPost {
    /// The send queue whose burst path ([`SendQueue::post_write_run`]) takes runs of WRITEs.
    fn burst_queue(&mut self) -> &mut SendQueue;
    /// Posts one work request the burst path did not take.
    fn post_one(&mut self, wr: &SendWr<'_>) -> Result<(), PostError>;
}

impl BatchPost for SendQueue {
    #[inline(always)]
    fn burst_queue(&mut self) -> &mut SendQueue {
        self
    }
    #[inline(always)]
    fn post_one(&mut self, wr: &SendWr<'_>) -> Result<(), PostError> {
        self.post(wr).map(|_| ())
    }
}

/// Posts `wrs` in order, as `ibv_post_send` posts a list: runs of one-entry WRITEs through
/// the burst path, the rest one by one. Stops at the first work request refused: those before
/// it are written, it and those after are not.
#[inline(always)]
pub(crate) fn post_in_order(
    p: &mut impl BatchPost,
    wrs: &[SendWr<'_>],
) -> Result<(), BatchPostError> {
    let mut posted = 0;
    while posted < wrs.len() {
        posted += p.burst_queue().post_write_run(&wrs[posted..]);
        let Some(wr) = wrs.get(posted) else {
            break;
        };
        p.post_one(wr)
            .map_err(|error| BatchPostError { posted, error })?;
        posted += 1;
    }
    Ok(())
}

fn op_name(op: &SendOp) -> &'static str {
    match op {
        SendOp::Write { .. } => "RDMA WRITE",
        SendOp::WriteImm { .. } => "RDMA WRITE with immediate",
        SendOp::Send => "SEND",
        SendOp::SendImm { .. } => "SEND with immediate",
        SendOp::Read { .. } => "RDMA READ",
        SendOp::CompareSwap { .. } => "compare-and-swap",
        SendOp::FetchAdd { .. } => "fetch-and-add",
    }
}

#[cfg(test)]
mod tests {
    use super::emit;
    use hw_defs::mlx5::{
        ctrl_seg, AtomicSeg, AtomicSegRepr, CtrlSeg, CtrlSegRepr, DataSeg, DataSegRepr, FenceMode,
        RaddrSeg, RaddrSegRepr, SendOpcode,
    };

    #[test]
    fn the_fm_ce_se_table_matches_hw_defs_for_every_flag_combination() {
        use crate::datapath::wr::SendFlags;
        for f in 0..8u8 {
            let has = |b: SendFlags| f & b.bits() != 0;
            let fence = if has(SendFlags::FENCE) {
                FenceMode::SmallAndFence
            } else {
                FenceMode::None
            };
            let want =
                ctrl_seg::fm_ce_se(fence, has(SendFlags::SIGNALED), has(SendFlags::SOLICITED));
            assert_eq!(super::FM_CE_SE[usize::from(f)], want, "flags {f:#b}");
        }
    }

    #[test]
    fn the_computed_second_control_word_is_the_table_for_every_flag_combination() {
        use crate::datapath::wr::SendFlags;
        let flags = [SendFlags::SIGNALED, SendFlags::FENCE, SendFlags::SOLICITED];
        for f in 0..8usize {
            let set = flags
                .iter()
                .enumerate()
                .filter(|(i, _)| f & (1 << i) != 0)
                .fold(SendFlags::NONE, |acc, (_, &b)| acc | b);
            assert_eq!(super::ctrl_lo(set), super::CTRL_LO[f], "flags {f:#b}");
        }
    }

    #[test]
    fn fast_segments_are_the_bytes_hw_defs_emits() {
        let repr = CtrlSegRepr {
            opcode: SendOpcode::RdmaWriteImm,
            opmod: 0,
            wqe_index: 0xbeef,
            qpn: 0x12_3456,
            ds: 5,
            signature: 0,
            fence: FenceMode::SmallAndFence,
            signaled: true,
            solicited: true,
            imm: 0xcafe_f00d,
        };
        let mut want = [0xaa; 16];
        repr.emit(&mut CtrlSeg::new_unchecked(&mut want[..]));
        let mut got = [0x55; 16];
        let fm = ctrl_seg::fm_ce_se(FenceMode::SmallAndFence, true, true);
        emit::ctrl(&mut got, 0x09, 0xbeef, 0x12_3456, 5, fm, 0xcafe_f00d);
        assert_eq!(got, want);

        RaddrSegRepr {
            raddr: 0x0102_0304_0506_0708,
            rkey: 0x0a0b_0c0d,
        }
        .emit(&mut RaddrSeg::new_unchecked(&mut want[..]));
        emit::raddr(&mut got, 0x0102_0304_0506_0708, 0x0a0b_0c0d);
        assert_eq!(got, want);

        AtomicSegRepr {
            swap_add: 7,
            compare: 9,
        }
        .emit(&mut AtomicSeg::new_unchecked(&mut want[..]));
        emit::atomic(&mut got, 7, 9);
        assert_eq!(got, want);

        DataSegRepr {
            byte_count: 300,
            lkey: 0x1122,
            addr: 0x7fff_0000_1000,
        }
        .emit(&mut DataSeg::new_unchecked(&mut want[..]));
        emit::data(&mut got, 300, 0x1122, 0x7fff_0000_1000);
        assert_eq!(got, want);
    }
}
