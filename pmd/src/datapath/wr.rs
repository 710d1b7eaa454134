//! Work requests going in, work completions coming out, and the errors a post can give.

use std::mem::MaybeUninit;

use smallvec::SmallVec;

pub use hw_defs::verbs::WcStatus;

use crate::qp_state::QpState;

/// One gather or scatter entry: `len` bytes at `addr` in the MR of `lkey`. Laid out as
/// `struct ibv_sge` (`repr(C)`, the same fields in the same order), so that the verbs shim's
/// fast path reads the application's entry in place rather than copying it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct Sge {
    /// First byte (a virtual address in this process).
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// The local key of the MR the range lies in.
    pub lkey: u32,
}

impl Sge {
    /// An entry of `len` bytes at `addr` in the MR of `lkey`.
    pub fn new(addr: u64, len: u32, lkey: u32) -> Sge {
        Sge { addr, len, lkey }
    }
}

/// A gather or scatter list; four entries live inline, more spill to the heap.
pub type SgList = SmallVec<[Sge; 4]>;

/// A remote buffer: an address in the peer's MR and its rkey.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Remote {
    /// Address in the peer's address space.
    pub addr: u64,
    /// The peer MR's remote key.
    pub rkey: u32,
}

/// What a send work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// RDMA WRITE of the payload to `remote`.
    Write {
        /// Destination.
        remote: Remote,
    },
    /// RDMA WRITE with immediate: also consumes a receive at the peer, which sees `imm`.
    WriteImm {
        /// Destination.
        remote: Remote,
        /// The immediate (host order).
        imm: u32,
    },
    /// SEND of the payload into the peer's next receive.
    Send,
    /// SEND with immediate.
    SendImm {
        /// The immediate (host order).
        imm: u32,
    },
    /// RDMA READ of `remote` into the local scatter list (the payload's entries).
    Read {
        /// Source.
        remote: Remote,
    },
    /// 64-bit compare-and-swap at `remote`; the old value lands in the single 8-byte entry.
    CompareSwap {
        /// The 8-byte-aligned target.
        remote: Remote,
        /// Swap if the target holds this.
        compare: u64,
        /// The new value.
        swap: u64,
    },
    /// 64-bit fetch-and-add at `remote`; the old value lands in the single 8-byte entry.
    FetchAdd {
        /// The 8-byte-aligned target.
        remote: Remote,
        /// What to add.
        add: u64,
    },
}

impl SendOp {
    /// The mlx5 opcode.
    pub fn opcode(&self) -> hw_defs::mlx5::SendOpcode {
        use hw_defs::mlx5::SendOpcode as O;
        match self {
            SendOp::Write { .. } => O::RdmaWrite,
            SendOp::WriteImm { .. } => O::RdmaWriteImm,
            SendOp::Send => O::Send,
            SendOp::SendImm { .. } => O::SendImm,
            SendOp::Read { .. } => O::RdmaRead,
            SendOp::CompareSwap { .. } => O::AtomicCs,
            SendOp::FetchAdd { .. } => O::AtomicFa,
        }
    }

    /// The completion opcode a successful WQE of this kind reports.
    pub fn wc_opcode(&self) -> WcOpcode {
        match self {
            SendOp::Write { .. } | SendOp::WriteImm { .. } => WcOpcode::RdmaWrite,
            SendOp::Send | SendOp::SendImm { .. } => WcOpcode::Send,
            SendOp::Read { .. } => WcOpcode::RdmaRead,
            SendOp::CompareSwap { .. } => WcOpcode::CompSwap,
            SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
        }
    }

    /// Whether the device writes into the local entries (READ response, atomic result).
    pub fn writes_locally(&self) -> bool {
        matches!(
            self,
            SendOp::Read { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }
        )
    }

    /// Whether this is an atomic.
    pub fn is_atomic(&self) -> bool {
        matches!(self, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. })
    }
}

/// Send flags, as `ibv_send_flags` has them (inline is a [`Payload`] variant instead).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SendFlags(u8);

impl SendFlags {
    /// No flags: unsignaled, unfenced.
    pub const NONE: SendFlags = SendFlags(0);
    /// Ask for a completion on success (`IBV_SEND_SIGNALED`).
    pub const SIGNALED: SendFlags = SendFlags(1);
    /// Wait for earlier READs and atomics before starting (`IBV_SEND_FENCE`).
    pub const FENCE: SendFlags = SendFlags(2);
    /// Set the solicited-event bit (`IBV_SEND_SOLICITED`).
    pub const SOLICITED: SendFlags = SendFlags(4);

    /// Whether every flag of `other` is set.
    pub fn contains(self, other: SendFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// The raw bits (SIGNALED 1, FENCE 2, SOLICITED 4).
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// The flags whose raw bits (as [`SendFlags::bits`] gives them) are set in `bits`; other
    /// bits are ignored. A `const fn`, so that a translation table can be built at compile
    /// time (the verbs shim's from `ibv_send_flags`).
    pub const fn from_bits_truncate(bits: u8) -> SendFlags {
        SendFlags(bits & 7)
    }
}

impl std::ops::BitOr for SendFlags {
    type Output = SendFlags;
    fn bitor(self, rhs: SendFlags) -> SendFlags {
        SendFlags(self.0 | rhs.0)
    }
}

/// Where a send's data comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload<'a> {
    /// Gathered by the device from registered memory (or, for READ and atomics, where the
    /// response lands).
    Gather(SgList),
    /// Copied into the WQE now (`IBV_SEND_INLINE`); no key needed, at most the QP's
    /// `max_inline_data` bytes; the buffer may be reused as soon as `post_send` returns.
    Inline(&'a [u8]),
}

/// A send work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: SendOp,
    /// The data.
    pub payload: Payload<'a>,
    /// Signaled, fenced, solicited.
    pub flags: SendFlags,
}

impl<'a> SendWr<'a> {
    /// A work request gathering from `sges`, unsignaled.
    pub fn new(wr_id: u64, op: SendOp, sges: &[Sge]) -> SendWr<'a> {
        SendWr {
            wr_id,
            op,
            payload: Payload::Gather(SgList::from_slice(sges)),
            flags: SendFlags::NONE,
        }
    }

    /// A work request carrying `data` inline, unsignaled.
    pub fn inline(wr_id: u64, op: SendOp, data: &'a [u8]) -> SendWr<'a> {
        SendWr {
            wr_id,
            op,
            payload: Payload::Inline(data),
            flags: SendFlags::NONE,
        }
    }

    /// The same request, signaled.
    pub fn signaled(mut self) -> SendWr<'a> {
        self.flags = self.flags | SendFlags::SIGNALED;
        self
    }

    /// The same request, fenced.
    pub fn fenced(mut self) -> SendWr<'a> {
        self.flags = self.flags | SendFlags::FENCE;
        self
    }
}

/// A receive work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where an incoming SEND's bytes land (WRITE_IMM consumes the receive but scatters
    /// nothing).
    pub sges: SgList,
}

impl RecvWr {
    /// A receive scattering into `sges`.
    pub fn new(wr_id: u64, sges: &[Sge]) -> RecvWr {
        RecvWr {
            wr_id,
            sges: SgList::from_slice(sges),
        }
    }
}

/// The opcode of a completion; values as in `enum ibv_wc_opcode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum WcOpcode {
    /// A SEND or SEND_IMM completed.
    #[default]
    Send = 0,
    /// An RDMA WRITE or WRITE_IMM completed.
    RdmaWrite = 1,
    /// An RDMA READ completed.
    RdmaRead = 2,
    /// A compare-and-swap completed.
    CompSwap = 3,
    /// A fetch-and-add completed.
    FetchAdd = 4,
    /// A receive consumed by a SEND.
    Recv = 128,
    /// A receive consumed by an RDMA WRITE with immediate.
    RecvRdmaWithImm = 129,
}

/// A batch post stopped at one work request: those before it were written, it and those after
/// it were not (as `ibv_post_send` reports a list's `bad_wr`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "work request {posted} of the batch was refused (the {posted} before it were posted): {error}"
)]
pub struct BatchPostError {
    /// How many work requests were posted: the refused one's index.
    pub posted: usize,
    /// Why it was refused.
    pub error: PostError,
}

/// One work completion, as `struct ibv_wc` has the fields the driver reports.
///
/// Laid out in a fixed order (`repr(C)`) so that the poller's stores of the fields it sets
/// together land side by side: the length and QP number as one word, the three one-byte
/// fields next to each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct WorkCompletion {
    /// The completed work request's id.
    pub wr_id: u64,
    /// Bytes received (receives) or transferred (READ, atomics: 8).
    pub byte_len: u32,
    /// The local QP the work request was posted on.
    pub qp_num: u32,
    /// The immediate of a SEND_IMM or WRITE_IMM, host order.
    pub imm: Option<u32>,
    /// Success or the error.
    pub status: WcStatus,
    /// What completed. For errors the opcode of the failed WQE when the driver knows it.
    pub opcode: WcOpcode,
    /// The vendor syndrome of an error CQE (0 on success).
    pub vendor_err: u8,
    /// A UD receive's sending QP (`ibv_wc.src_qp`; 0 for everything else).
    pub src_qp: u32,
}

impl WorkCompletion {
    /// A blank completion to fill arrays with.
    pub const EMPTY: WorkCompletion = WorkCompletion {
        wr_id: 0,
        status: WcStatus::Success,
        opcode: WcOpcode::Send,
        byte_len: 0,
        imm: None,
        qp_num: 0,
        vendor_err: 0,
        src_qp: 0,
    };

    /// Whether the work request succeeded.
    pub fn is_ok(&self) -> bool {
        self.status == WcStatus::Success
    }
}

impl Default for WorkCompletion {
    fn default() -> WorkCompletion {
        WorkCompletion::EMPTY
    }
}

/// A successful requester completion the poller's tight loop takes, numbered as the CQE
/// numbers the completed WQE's opcode (byte 56) less RDMA WRITE's: a layout indexes a
/// four-entry table with it ([`CompletionLayout::send`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FastSend {
    /// An RDMA WRITE.
    Write = 0,
    /// An RDMA WRITE with immediate.
    WriteImm = 1,
    /// A SEND.
    Send = 2,
    /// A SEND with immediate.
    SendImm = 3,
}

impl FastSend {
    /// Every kind, in discriminant order: `ALL[k as usize] == k`.
    pub const ALL: [FastSend; 4] = [
        FastSend::Write,
        FastSend::WriteImm,
        FastSend::Send,
        FastSend::SendImm,
    ];

    /// The kind numbered `index` (the CQE's send opcode less RDMA WRITE's), none past 3.
    #[inline(always)]
    pub const fn from_index(index: u32) -> Option<FastSend> {
        if index <= FastSend::SendImm as u32 {
            // SAFETY: `FastSend` is `repr(u8)` with the discriminants 0..=3 (checked below),
            // and `index` is one of them. Not a match: LLVM turned a four-way match and the
            // opcode's compare after it into a shifted bit table, two instructions more per
            // CQE in the pmd's own poll loop (callgrind, `datapath --count
            // shim-direct-poll`: 40.9 instructions per CQE against 38.9).
            Some(unsafe { std::mem::transmute::<u8, FastSend>(index as u8) })
        } else {
            None
        }
    }

    /// The completion's opcode, as libmlx5 reports a requester's: a WRITE with immediate
    /// completes as a WRITE, a SEND with immediate as a SEND.
    #[inline(always)]
    pub const fn opcode(self) -> WcOpcode {
        match self {
            FastSend::Write | FastSend::WriteImm => WcOpcode::RdmaWrite,
            FastSend::Send | FastSend::SendImm => WcOpcode::Send,
        }
    }
}

// `FastSend::from_index` relies on the discriminants being exactly 0..=3.
const _: () = {
    let mut i = 0;
    while i < FastSend::ALL.len() {
        assert!(FastSend::ALL[i] as usize == i);
        i += 1;
    }
};

/// The layout a CQ poll writes its completions in: the pmd's own [`WorkCompletion`], or a
/// caller's (the verbs shim writes libibverbs' `struct ibv_wc`), written straight from the
/// CQE into the caller's array with no `WorkCompletion` array and no conversion pass after
/// the poll. The poller is generic over it, so each layout gets its own monomorphised loop
/// and a layout's constructors inline into it.
pub trait CompletionLayout: Sized {
    /// What the poller's tight loop copies for each successful WRITE or SEND of the QP it
    /// expects before setting the two fields that differ; made once per poll.
    type SendTemplate: Copy;

    /// The template for the successful sends of the QP `hot` is a completion of (`hot`'s
    /// `wr_id` and `opcode` are placeholders).
    fn send_template(hot: &WorkCompletion) -> Self::SendTemplate;

    /// A successful send completion: `template` with `wr_id` and the opcode of `kind` set.
    /// `kind` is the CQE's own number for the operation, so a layout can map it with a
    /// four-entry table instead of a compare ([`FastSend::opcode`] is the mapping).
    fn send(template: &Self::SendTemplate, wr_id: u64, kind: FastSend) -> Self;

    /// Any other completion, in this layout.
    fn from_completion(wc: &WorkCompletion) -> Self;
}

/// An initialised completion array as slots a poll writes ([`CompletionLayout`]).
#[inline(always)]
pub(crate) fn as_slots(wcs: &mut [WorkCompletion]) -> &mut [MaybeUninit<WorkCompletion>] {
    // SAFETY: `MaybeUninit<T>` has `T`'s layout, and a poll writes only whole, initialised
    // completions into its slots, so `wcs` stays initialised.
    unsafe { &mut *(wcs as *mut [WorkCompletion] as *mut [MaybeUninit<WorkCompletion>]) }
}

impl CompletionLayout for WorkCompletion {
    type SendTemplate = WorkCompletion;

    #[inline(always)]
    fn send_template(hot: &WorkCompletion) -> WorkCompletion {
        *hot
    }

    #[inline(always)]
    fn send(template: &WorkCompletion, wr_id: u64, kind: FastSend) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            opcode: kind.opcode(),
            ..*template
        }
    }

    #[inline(always)]
    fn from_completion(wc: &WorkCompletion) -> WorkCompletion {
        *wc
    }
}

/// Why a work request was refused at post time. Nothing was written to the ring.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    /// The queue has no room for the WQE.
    #[error(
        "{queue} queue full: {outstanding} of {capacity} slots outstanding, {needed} more needed"
    )]
    QueueFull {
        /// "send" or "receive".
        queue: &'static str,
        /// Slots (basic blocks for the send queue) in use.
        outstanding: u32,
        /// Slots in the ring.
        capacity: u32,
        /// Slots the WQE needs.
        needed: u32,
    },
    /// The QP cannot take this kind of work in its state.
    #[error("QP {qpn:#x} is in {state}; posting sends needs RTS")]
    NotReadyToSend {
        /// The QP.
        qpn: u32,
        /// Its state.
        state: QpState,
    },
    /// A plain post on a UD QP: a UD SEND names its destination.
    #[error("QP {qpn:#x} is a UD QP: each send names its destination (post_send_ud)")]
    UdNeedsAddress {
        /// The QP.
        qpn: u32,
    },
    /// A UD post on an RC QP.
    #[error("QP {qpn:#x} is an RC QP: it sends to its connected peer, not to a UD address")]
    NotUd {
        /// The QP.
        qpn: u32,
    },
    /// A UD post of an operation UD does not have.
    #[error("{op} is not a UD operation: a UD QP sends SENDs, with or without immediate")]
    NotUdOperation {
        /// The operation.
        op: &'static str,
    },
    /// The QP cannot take receives in its state.
    #[error("QP {qpn:#x} is in RESET; receives can be posted from INIT on")]
    NotReadyToReceive {
        /// The QP.
        qpn: u32,
    },
    /// A receive posted to a QP that takes its receives from a shared receive queue.
    #[error("QP {qpn:#x} takes its receives from a shared receive queue: post them there")]
    OnSharedReceiveQueue {
        /// The QP.
        qpn: u32,
    },
    /// An lkey that no MR of the device has.
    #[error("lkey {lkey:#x} is not registered on device {device}")]
    UnknownLkey {
        /// The key.
        lkey: u32,
        /// The device's name.
        device: String,
    },
    /// An lkey of an MR in another protection domain.
    #[error("lkey {lkey:#x} belongs to PD {mr_pd}, not to the QP's PD {qp_pd}")]
    ForeignLkey {
        /// The key.
        lkey: u32,
        /// The MR's PD.
        mr_pd: u32,
        /// The QP's PD.
        qp_pd: u32,
    },
    /// An entry that does not lie inside its MR.
    #[error("SGE {addr:#x}+{len} lies outside MR {lkey:#x} [{start:#x}, {end:#x})")]
    OutsideMr {
        /// Entry start.
        addr: u64,
        /// Entry length.
        len: u32,
        /// The MR's key.
        lkey: u32,
        /// MR start.
        start: u64,
        /// MR end.
        end: u64,
    },
    /// The device would write into an MR registered without `LOCAL_WRITE`.
    #[error(
        "MR {lkey:#x} is not registered with LOCAL_WRITE, but this work request writes into it"
    )]
    NoLocalWrite {
        /// The MR's key.
        lkey: u32,
    },
    /// More entries than the queue takes.
    #[error("{count} SGEs given; this QP takes at most {max} per {queue} work request")]
    TooManySges {
        /// Entries given.
        count: usize,
        /// The limit.
        max: u32,
        /// "send" or "receive".
        queue: &'static str,
    },
    /// More inline bytes than the QP takes.
    #[error("inline payload of {len} bytes exceeds this QP's max_inline_data of {max}")]
    InlineTooLong {
        /// Bytes given.
        len: usize,
        /// The limit.
        max: u32,
    },
    /// Inline data for an operation whose payload is a local destination.
    #[error("{op} cannot carry inline data: its local entries are where the response lands")]
    InlineNotAllowed {
        /// The operation.
        op: &'static str,
    },
    /// An atomic's local entry must be exactly one 8-byte SGE.
    #[error("atomics need exactly one 8-byte SGE for the old value; got {count} entries totalling {bytes} bytes")]
    AtomicSge {
        /// Entries given.
        count: usize,
        /// Their total length.
        bytes: u64,
    },
    /// An atomic's remote address must be 8-byte aligned.
    #[error("atomic target {addr:#x} is not 8-byte aligned")]
    MisalignedAtomic {
        /// The remote address.
        addr: u64,
    },
    /// A work request routed to the backup QP names a key that has no backup counterpart
    /// (an MR whose backup registration has not happened, or a peer rkey the peer's
    /// rendezvous did not announce).
    #[error("no backup {kind} for {key:#x}: its MR has no registration on the backup device that this end knows of")]
    NoBackupKey {
        /// "lkey" or "rkey".
        kind: &'static str,
        /// The default key.
        key: u32,
    },
    /// A message larger than RC allows.
    #[error("message of {bytes} bytes exceeds the 2 GiB RC limit")]
    MessageTooLong {
        /// Total bytes.
        bytes: u64,
    },
}
