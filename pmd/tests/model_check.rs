//! Exhaustive model check of the SHIFT failover machine (`pmd::failover`).
//!
//! Two hosts, A and B, each with a default NIC and a backup NIC, connected by a default path
//! and a backup path. Each host runs the real [`Failover`] machine; the model plays everything
//! around it: the application (posting a small program of WRs at any moment), the driver
//! (performing the machine's actions on rings: drains, WQE copies, withheld doorbells, error
//! surfacing, its own switch-back fence, completions polled in batches), the NICs (RC per QP:
//! in-order execution, PSNs per incarnation with the production `Epoch::start_psn` (epochs
//! four apart share PSNs), go-back-N retransmission on timeout, duplicate detection, READs
//! executed again when duplicated, the fence flag, retry exhaustion, RNR stalls, QP states
//! RESET/RTS/ERR) and the network (loss of requests and ACKs, paths failing and recovering at
//! any point, with or without link-down notifications, packets surviving a flap for fewer
//! than three later incarnations that came up).
//!
//! Checked in every reachable state, within the bounds each scenario prints:
//! - a WRITE_WITH_IMM (or SEND) is never observed before the data WRITEs posted before it, and
//!   those WRITEs never execute again once it has been observed (producer/consumer);
//! - every SEND lands in its own receive WQE, once; no receive WQE is consumed twice;
//! - no atomic executes twice;
//! - a READ sees every request posted before it, and one completing with success never
//!   returns data a later request of its QP changed;
//! - application completions are neither duplicated nor reordered, none claims success for a
//!   WR the peer did not execute, and none is for a WR the application did not post;
//! - no reset discards posted work;
//! - when the system goes quiet, everything posted has completed or been reported as an error,
//!   and without a backup failure or an atomic, nothing was reported as an error at all.
//!
//! Broken policies run the same model and the checker must find a counterexample, which
//! shows the properties can fail: "retransmit everything outstanding" (the driver ignoring
//! the peer's receive counter and the atomic check), no epoch PSNs, stale receives ignored,
//! READs sent again first, the fence recognised only last in its batch, a failback that
//! drops the receives posted after a round's copy, a failback that resets the default ring
//! before its bring-up; and a READ without the fence flag returns
//! changed data on plain RC.
//!
//! Run: `cargo test -p pmd --test model_check -- --nocapture` (prints bounds, state counts
//! and times).

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use pmd::failover::plan::{plan_copy, sends_before_first_read, PlannedSend};
use pmd::failover::{
    Action, Config, ControlMessage, DefaultQpPhase, Epoch, Event, Failover, Observation, Path,
    Progress, Role, Route, SendPhase, Side, SideEpoch, Timestamp, WcStatus, EPOCH_PSN_STRIDE,
    MAX_ACTIONS_PER_EVENT,
};
use stateright::{Checker, HasDiscoveries, Model, Property};

// ---- The application ---------------------------------------------------------------------

/// What one application WR does at the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Op {
    /// RDMA WRITE of bulk data: idempotent until a later notification is observed.
    Write,
    /// WRITE_WITH_IMM: the notification that the WRITEs before it have landed.
    WriteImm,
    /// SEND: consumes the next receive WQE.
    Send,
    /// FETCH_ADD: never idempotent.
    FetchAdd,
    /// RDMA READ of the peer's memory: what it returns is what the peer's memory held when it
    /// executed, so it must not execute after a later request of its QP changed it.
    Read,
}

impl Op {
    fn two_sided(self) -> bool {
        matches!(self, Op::WriteImm | Op::Send)
    }

    /// Whether the request changes the responder's memory (or what its application does).
    fn changes(self) -> bool {
        self != Op::Read
    }

    /// Whether a fenced WR behind it waits for its completion (`IBV_SEND_FENCE`).
    fn fences(self) -> bool {
        matches!(self, Op::Read | Op::FetchAdd)
    }
}

#[derive(Debug, Clone, Copy)]
struct Wr {
    op: Op,
    signaled: bool,
    /// `IBV_SEND_FENCE`: the NIC starts the WR only once every earlier READ and atomic of its
    /// QP has completed.
    fenced: bool,
}

const fn wr(op: Op, signaled: bool) -> Wr {
    Wr {
        op,
        signaled,
        fenced: false,
    }
}

const fn fenced(op: Op, signaled: bool) -> Wr {
    Wr {
        op,
        signaled,
        fenced: true,
    }
}

/// NCCL-Simple-like: data WRITEs, then a WRITE_WITH_IMM; the second batch's first WRITE is
/// signaled.
const NCCL: &[Wr] = &[
    wr(Op::Write, false),
    wr(Op::WriteImm, true),
    wr(Op::Write, true),
    wr(Op::WriteImm, true),
];
const TWO_SENDS: &[Wr] = &[wr(Op::Send, true), wr(Op::Send, true)];
const ONE_SEND: &[Wr] = &[wr(Op::Send, true)];
const ONE_WRITE_IMM: &[Wr] = &[wr(Op::Write, false), wr(Op::WriteImm, true)];
const WRITE_THEN_ATOMIC: &[Wr] = &[wr(Op::Write, false), wr(Op::FetchAdd, true)];
/// `shift_read_bw --check`-like: a WRITE, a READ of what it wrote, and a SEND fenced behind
/// the READ that tells the peer it may change its memory again.
const WRITE_READ_SEND: &[Wr] = &[
    wr(Op::Write, false),
    wr(Op::Read, true),
    fenced(Op::Send, true),
];
/// The same without the fence flag on the SEND.
const WRITE_READ_SEND_UNFENCED: &[Wr] =
    &[wr(Op::Write, false), wr(Op::Read, true), wr(Op::Send, true)];
const NOTHING: &[Wr] = &[];

fn two_sided_ordinal(program: &[Wr], index: u8) -> u8 {
    program[..usize::from(index)]
        .iter()
        .filter(|w| w.op.two_sided())
        .count() as u8
}

// ---- Scenarios and bounds ----------------------------------------------------------------

/// How many faults and timer firings one run may contain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Budget {
    default_failures: u8,
    default_repairs: u8,
    backup_failures: u8,
    /// A backup device fails its QPs (backup data QP and control QP to ERR, link up).
    backup_qp_failures: u8,
    /// A default device fails its QPs (default data QP and the default devices' control QP
    /// to ERR, link up).
    default_qp_failures: u8,
    losses: u8,
    ticks: u8,
    waits: u8,
    /// The backup device fails its QPs only once the default pair is live at both ends and
    /// its path fails no more: whatever that failure hits (a switch-back, its last message
    /// on the backup channel), the traffic has a path and the connection must not fail.
    backup_qps_fail_with_the_default_live: bool,
    /// A default device refuses the next move of its QP to RTR (a NIC recovering), so a
    /// bring-up fails with the link up.
    rtr_refusals: u8,
    /// The hosts also reach each other over the management network (5f): a third channel,
    /// in order, that no RDMA device or path failure touches.
    management: bool,
    /// A default device may fail its QPs also while its data QP is out of RTS (after a
    /// failover: the all-targets soak's loss), taking the default devices' channel alone.
    default_qps_fail_out_of_rts: bool,
    /// Link reports are hints (issue 29 item 1): the machines believe a link-down report for
    /// no time at all (`Config::link_down_trust` zero: rearms go on while the link is
    /// reported down), and the default path may come back without its link-up being
    /// reported (`Step::PathUp { reported: false }`; the hosts told of the failure go on
    /// believing it). Otherwise reports are believed for ever and every recovery is reported,
    /// the model before.
    stale_link_reports: bool,
}

struct Scenario {
    name: &'static str,
    programs: [&'static [Wr]; 2],
    recvs: [u8; 2],
    /// Receives are all posted before anything else happens (NCCL pre-posts); otherwise the
    /// application posts them one at a time, at any moment.
    recvs_up_front: bool,
    roles: [Role; 2],
    budget: Budget,
    /// What the run must reach (`SEEN_*` bits).
    coverage: u32,
}

impl Scenario {
    /// No atomics and no backup failure: failover must hide every default failure.
    fn expects_success(&self) -> bool {
        self.budget.backup_failures == 0
            && self.budget.backup_qp_failures == 0
            && self.budget.default_qp_failures == 0
            && self.budget.rtr_refusals == 0
            && self
                .programs
                .iter()
                .all(|p| p.iter().all(|w| w.op != Op::FetchAdd))
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let program = |p: &[Wr]| {
            p.iter()
                .map(|w| {
                    format!(
                        "{:?}{}{}",
                        w.op,
                        if w.signaled { "(s)" } else { "" },
                        if w.fenced { "(f)" } else { "" }
                    )
                })
                .collect::<Vec<_>>()
                .join(" ")
        };
        let b = self.budget;
        write!(
            f,
            "{}: A posts [{}] and {} recvs ({:?}); B posts [{}] and {} recvs ({:?}); recvs {}; \
             default path fails <= {}x, repaired <= {}x, its QPs fail <= {}x, RTR refused <= {}x; \
             backup fails <= {}x, its QPs fail <= {}x; \
             packets lost <= {}; timer ticks <= {}; quiet-time timeouts <= {}; retry_cnt {}; \
             management network: {}",
            self.name,
            program(self.programs[A]),
            self.recvs[A],
            self.roles[A],
            program(self.programs[B]),
            self.recvs[B],
            self.roles[B],
            if self.recvs_up_front {
                "up front"
            } else {
                "at any time"
            },
            b.default_failures,
            b.default_repairs,
            b.default_qp_failures,
            b.rtr_refusals,
            b.backup_failures,
            b.backup_qp_failures,
            b.losses,
            b.ticks,
            b.waits,
            RETRY_CNT,
            if b.management { "yes" } else { "no" }
        )
    }
}

/// Transport retries of a QP before it reports RETRY_EXC_ERR (the model's `retry_cnt`).
const RETRY_CNT: u8 = 1;

/// What the model's driver does with the machine's retransmission decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Policy {
    /// Exactly what the machine asks.
    Shift,
    /// The naive policy: retransmit every outstanding WQE (ignore the peer's receive counter
    /// and the atomic check).
    RetransmitEverything,
    /// Ignore the stale receive WQEs the peer announces (send no zero-length SENDs).
    IgnoreStaleRecvs,
    /// Every incarnation of the default pair starts at the same PSN (no epoch-derived PSNs).
    SamePsnEveryEpoch,
    /// An earlier copy: READs in flight go again first, ahead of everything.
    ReadsFirst,
    /// An earlier driver: its fence is recognised only as the last signaled
    /// completion of a poll batch; otherwise it reaches the application and stays set.
    FenceOnlyLastInBatch,
    /// Shift, but a packet may outlive any number of incarnations (no lifetime bound).
    UnboundedPacketLifetime,
    /// The driver before the failback kept receives posted meanwhile: once a failover round
    /// copied the default RQ to the backup, a failback took the backup RQ's receives only and
    /// dropped those posted on the default RQ after the copy.
    FailbackDropsRecvsAfterCopy,
    /// The driver before the failback kept the rings until its bring-up succeeded: the
    /// default ring was reset before the bring-up, and when it failed every send (the backup
    /// ring's too) was kept for the error while the backup ring stayed.
    FailbackResetsBeforeBringUp,
}

const A: usize = 0;
const B: usize = 1;
const DEFAULT: usize = 0;
const BACKUP: usize = 1;

// ---- The world -----------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum QpState {
    Reset,
    Rts,
    Err,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Wqe {
    /// The application's WR number `n` of its program.
    App(u8),
    /// A zero-length WRITE probing the default path.
    Probe,
    /// A zero-length SEND consuming a stale receive WQE.
    Burn,
    /// The driver's switch-back fence: a zero-length signaled WRITE on the backup QP.
    Fence,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct SqEntry {
    wqe: Wqe,
    /// `None` while the doorbell is withheld or the WQE waits behind a fence.
    psn: Option<u8>,
    /// The doorbell was rung but the NIC holds the WQE: it is fenced behind an outstanding
    /// READ or atomic, or behind a WQE that is.
    stalled: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum RqEntry {
    /// The application's receive number `n`.
    App(u8),
    /// A copy of receive `n` left behind on the backup RQ by a receive switch-back.
    Stale(u8),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Qp {
    state: QpState,
    /// The epoch of this incarnation (backup QPs stay in 0). Packets tell incarnations apart
    /// only by their PSNs ([`same_psns`]): epoch 4 looks like epoch 0.
    epoch: u8,
    sq: Vec<SqEntry>,
    next_psn: u8,
    retries: u8,
    epsn: u8,
    rq: Vec<RqEntry>,
    /// The PSN of the last atomic executed (a one-entry responder atomic cache).
    atomic_cache: Option<u8>,
}

impl Qp {
    fn ready(epoch: u8) -> Qp {
        Qp {
            state: QpState::Rts,
            epoch,
            sq: Vec::new(),
            next_psn: 0,
            retries: RETRY_CNT,
            epsn: 0,
            rq: Vec::new(),
            atomic_cache: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Request {
    epoch: u8,
    psn: u8,
    wqe: Wqe,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Ack {
    epoch: u8,
    psn: u8,
    /// A READ response: `Some(changed)`, where `changed` says the READ executed after a later
    /// request of its QP had changed the responder's memory.
    read: Option<bool>,
}

/// Which hosts' links went down with a path (and come up with it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Notified {
    Nobody,
    Host(usize),
    Both,
}

impl Notified {
    /// The hosts told by either.
    fn union(self, other: Notified) -> Notified {
        match (self, other) {
            (Notified::Nobody, n) | (n, Notified::Nobody) => n,
            (Notified::Host(a), Notified::Host(b)) if a == b => Notified::Host(a),
            _ => Notified::Both,
        }
    }

    fn includes(self, host: usize) -> bool {
        match self {
            Notified::Nobody => false,
            Notified::Host(h) => h == host,
            Notified::Both => true,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct PathState {
    up: bool,
    notified: Notified,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Host {
    machine: Failover,
    /// Application send WRs posted so far (a prefix of the program).
    posted: u8,
    progress: Progress,
    qps: [Qp; 2],
    /// The last send WR the application saw a completion (success or error) for.
    last_send_wc: Option<u8>,
    /// Send WRs known resolved, as a prefix of the program.
    resolved: u8,
    /// Receives the application saw complete, in order.
    recv_wcs: u8,
    /// Some error completion reached the application.
    saw_error: bool,
    /// As a responder: the peer's WRs executed here at least once (bit per WR).
    executed: u16,
    /// As a responder: receive WQEs consumed (bit per receive).
    consumed: u16,
    /// One past the peer's latest WR whose two-sided completion the application observed.
    observed_through: u8,
    /// The driver's switch-back fence is on the backup SQ, not yet completed.
    fence: bool,
    first_default_error: Option<WcStatus>,
    control_dead: bool,
    /// The control QP on the default devices is in ERR or RESET: it receives nothing.
    default_control_dead: bool,
    /// The driver is draining the default CQ: it finishes once the default QP has left RTS
    /// (flushes appear only then).
    draining: bool,
    /// A failover round copied the default RQ to the backup and the default QP was not
    /// reset since (the driver's `Book::default_recvs_copied`).
    recvs_copied: bool,
    /// The default device refuses the next move of its QP to RTR.
    refuses_rtr: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct World {
    hosts: [Host; 2],
    /// `[path][sender]`: requests in flight, in order.
    requests: [[Vec<Request>; 2]; 2],
    /// `[path][responder]`: acknowledgments in flight, in order.
    acks: [[Vec<Ack>; 2]; 2],
    /// `[sender]`: control messages on the control QP pair, in order.
    control: [Vec<ControlMessage>; 2],
    /// `[sender]`: control messages on the default devices' control QP pair, in order.
    default_control: [Vec<ControlMessage>; 2],
    /// `[sender]`: control messages over the management network, in order.
    management: [Vec<ControlMessage>; 2],
    paths: [PathState; 2],
    budget: Budget,
    now: u64,
    violations: u16,
    seen: u32,
    /// A quiet-time wait moved the clock past a timer that was due but could not tick (the
    /// tick budget was spent): from here the run is cut by the bounds, not by the protocol.
    /// Tracked only where a property needs it.
    starved: bool,
}

// Violations, one bit each.
const NOTIFICATION_BEFORE_DATA: u16 = 1 << 0;
const DATA_AFTER_NOTIFICATION: u16 = 1 << 1;
const RECV_CONSUMED_TWICE: u16 = 1 << 2;
const SEND_IN_WRONG_RECV: u16 = 1 << 3;
const SEND_IN_STALE_RECV: u16 = 1 << 4;
const BURN_IN_APP_RECV: u16 = 1 << 5;
const ATOMIC_TWICE: u16 = 1 << 6;
const SEND_WC_OUT_OF_ORDER: u16 = 1 << 7;
const RECV_WC_OUT_OF_ORDER: u16 = 1 << 8;
const SUCCESS_WITHOUT_EXECUTION: u16 = 1 << 9;
const RESET_DISCARDED_WORK: u16 = 1 << 10;
const ILLEGAL_QP_TRANSITION: u16 = 1 << 11;
const TOO_MANY_ACTIONS: u16 = 1 << 12;
const READ_RETURNED_CHANGED_DATA: u16 = 1 << 13;
const READ_BEFORE_EARLIER: u16 = 1 << 14;
const FOREIGN_COMPLETION: u16 = 1 << 15;

// Coverage, one bit each.
const SEEN_FAILOVER: u32 = 1 << 0;
const SEEN_SWITCH_BACK: u32 = 1 << 1;
const SEEN_BURN: u32 = 1 << 2;
const SEEN_ATOMIC_REFUSED: u32 = 1 << 3;
const SEEN_SKIP: u32 = 1 << 4;
const SEEN_STALE_PACKET: u32 = 1 << 5;
/// Not recorded in `World::seen`: computed from the state.
const SEEN_QUIET_AFTER_FAILOVER: u32 = 1 << 6;
/// One poll batch retired the driver's fence and a later signaled WQE together.
const SEEN_FENCE_IN_BATCH: u32 = 1 << 7;
/// A READ executed again on the backup path.
const SEEN_READ_ON_BACKUP: u32 = 1 << 8;
/// A failback that replaced a failover round after its receive copy moved a receive the
/// application posted on the default RQ meanwhile.
const SEEN_RECV_DURING_FAILBACK: u32 = 1 << 15;
/// A failback's bring-up was refused (the default device refused RTR).
const SEEN_FAILBACK_REFUSED: u32 = 1 << 16;
/// A default QP came up in epoch 4 or later: refused attempts came before it (epochs four
/// apart share PSNs, and a refused attempt's successor is four epochs on).
const SEEN_EPOCH_4: u32 = 1 << 9;
/// A backup side lost while idle was repaired (both ends' backup QPs in a new backup epoch).
const SEEN_BACKUP_REPAIRED: u32 = 1 << 10;
/// A failover round completed after a backup repair (over the repaired backup pair).
const SEEN_FAILOVER_AFTER_REPAIR: u32 = 1 << 11;
/// Traffic moved back to the default pair after the backup failed under it (5e).
const SEEN_FAILBACK: u32 = 1 << 12;
/// The default devices' control channel, lost, was repaired over the backup devices' one.
const SEEN_DEFAULT_CONTROL_REPAIRED: u32 = 1 << 13;
/// A backup side was repaired over a repaired default devices' channel.
const SEEN_BACKUP_REPAIRED_AFTER_CHANNEL: u32 = 1 << 14;
/// A failback finished with a `FailbackReady` that came over the management network to a
/// host whose default devices' channel was dead (5f).
const SEEN_FAILBACK_OVER_MANAGEMENT: u32 = 1 << 17;
/// The default devices' channel was repaired over the management network (its
/// `SideRearmDone` came there), both control channels lost (5f).
const SEEN_CHANNEL_REPAIRED_OVER_MANAGEMENT: u32 = 1 << 18;

/// A default QP came up while its host's link was still reported down (a rearm that did not
/// wait for the report).
const SEEN_UP_UNREPORTED: u32 = 1 << 19;
/// A backup side was repaired at a host whose failover round waited for it (5c, "whichever
/// path answers first": the repair went over the management network).
const SEEN_BACKUP_REPAIRED_IN_ROUND: u32 = 1 << 20;
/// A failover round completed after [`SEEN_BACKUP_REPAIRED_IN_ROUND`].
const SEEN_FAILOVER_AFTER_REPAIR_IN_ROUND: u32 = 1 << 21;

/// One step of the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Step {
    /// The application of `host` posts its next send WR.
    Post { host: usize },
    /// The application of `host` posts its next receive WR.
    PostRecv { host: usize },
    /// The oldest request `from` sent on `path` arrives (or is dropped by a dead path or QP).
    DeliverRequest { path: usize, from: usize },
    /// The oldest acknowledgment `from` sent on `path` arrives.
    DeliverAck { path: usize, from: usize },
    /// The oldest request `from` sent on `path` is lost.
    LoseRequest { path: usize, from: usize },
    /// The oldest acknowledgment `from` sent on `path` is lost.
    LoseAck { path: usize, from: usize },
    /// `host`'s QP on `path` times out waiting for an acknowledgment.
    Timeout { host: usize, path: usize },
    /// The oldest control message from `from` arrives.
    DeliverControl { from: usize },
    /// `from`'s control QP exhausts its retries (the backup path is down). With
    /// `head_delivered`, the oldest message did reach the peer; only its ACK was lost.
    ControlTimeout { from: usize, head_delivered: bool },
    /// A path fails; `notified` hosts see their link go down.
    PathDown { path: usize, notified: Notified },
    /// A failed path recovers; unless `reported`, the hosts told of its failure are not told
    /// of its recovery and go on believing their link down.
    PathUp { path: usize, reported: bool },
    /// `host`'s backup device fails its QPs: the backup data QP and the control QP go to ERR
    /// (the link stays up).
    BackupQpsFail { host: usize },
    /// `host`'s default device fails its QPs: the default data QP and the default devices'
    /// control QP go to ERR (the link stays up).
    DefaultQpsFail { host: usize },
    /// `host`'s default device will refuse the next move of its QP to RTR.
    RefuseRtr { host: usize },
    /// The oldest message `from` sent on the control channel on the default devices arrives
    /// (it waits while the default path is down: the model does not exhaust its retries).
    DeliverDefaultControl { from: usize },
    /// The oldest message `from` sent over the management network arrives.
    DeliverManagement { from: usize },
    /// A due timer of `host` fires.
    Tick { host: usize },
    /// `host`'s driver finishes draining the default CQ.
    Drained { host: usize },
    /// Nothing else can happen: time passes until the next deadline.
    Wait,
}

// ---- The model ------------------------------------------------------------------------------

/// A property's condition.
type Condition = fn(&FailoverModel, &World) -> bool;

struct FailoverModel {
    scenario: Scenario,
    policy: Policy,
}

impl FailoverModel {
    fn config(&self, host: usize) -> Config {
        let mut config = Config::new(self.scenario.roles[host]);
        // Zero-length waits: hold-down and backoff timers may fire at any point.
        config.holddown = Duration::ZERO;
        config.backoff_initial = Duration::ZERO;
        config.backoff_max = Duration::ZERO;
        config.redrain_interval = Duration::ZERO;
        config.link_down_trust = if self.scenario.budget.stale_link_reports {
            Duration::ZERO
        } else {
            Duration::MAX
        };
        // Handshake timeouts fire only when nothing else can happen (`Step::Wait`).
        config.handshake_timeout = Duration::from_secs(2);
        config.management = self.scenario.budget.management;
        config
    }

    fn program(&self, host: usize) -> &'static [Wr] {
        self.scenario.programs[host]
    }

    fn wr(&self, host: usize, index: u8) -> Wr {
        self.program(host)[usize::from(index)]
    }

    /// `host`'s application WQEs among `entries`, as the real planners see them (the
    /// driver's lists leave its own WQEs out).
    fn planned(&self, host: usize, entries: &[SqEntry]) -> Vec<Planned> {
        entries
            .iter()
            .filter_map(|e| match e.wqe {
                Wqe::App(n) => Some(Planned {
                    op: self.wr(host, n).op,
                    sent: e.psn.is_some(),
                }),
                _ => None,
            })
            .collect()
    }
}

/// An application WQE of the model, for `pmd::failover::plan`'s planners.
struct Planned {
    op: Op,
    /// It has a PSN: the NIC may have sent it.
    sent: bool,
}

impl PlannedSend for Planned {
    fn two_sided(&self) -> bool {
        self.op.two_sided()
    }

    fn is_read(&self) -> bool {
        self.op == Op::Read
    }

    fn maybe_sent(&self) -> bool {
        self.sent
    }
}

impl World {
    fn host(&mut self, host: usize) -> &mut Host {
        &mut self.hosts[host]
    }

    fn violate(&mut self, what: u16) {
        self.violations |= what;
    }

    /// Hands `event` to `host`'s machine and performs the actions, and the actions the
    /// resulting events cause, until the machine is quiet.
    fn feed(&mut self, model: &FailoverModel, host: usize, event: Event) {
        let mut events = VecDeque::from([event]);
        while let Some(event) = events.pop_front() {
            let now = Timestamp::from_nanos(self.now);
            let actions = self.hosts[host].machine.handle(event, now);
            // What the machine observed is for the driver's log: the model has none, and
            // leaving it queued would split equal states.
            let mut failed_back = false;
            while let Some(observed) = self.hosts[host].machine.poll_observation() {
                match observed {
                    Observation::SideRepaired {
                        epoch: SideEpoch::Backup(_),
                    } => {
                        self.seen |= SEEN_BACKUP_REPAIRED;
                        if self.hosts[host].machine.send_phase() == SendPhase::FailingOver {
                            self.seen |= SEEN_BACKUP_REPAIRED_IN_ROUND;
                        }
                        if self.seen & SEEN_DEFAULT_CONTROL_REPAIRED != 0 {
                            self.seen |= SEEN_BACKUP_REPAIRED_AFTER_CHANNEL;
                        }
                    }
                    Observation::SideRepaired {
                        epoch: SideEpoch::DefaultChannel(_),
                    } => self.seen |= SEEN_DEFAULT_CONTROL_REPAIRED,
                    Observation::FailedBack { .. } => failed_back = true,
                    _ => {}
                }
            }
            if actions.len() > MAX_ACTIONS_PER_EVENT {
                self.violate(TOO_MANY_ACTIONS);
            }
            let switched_back = self.seen & SEEN_SWITCH_BACK;
            for action in actions {
                self.perform(model, host, action, &mut events);
            }
            if failed_back {
                // The doorbell it released ends the failback, not a switch-back.
                self.seen = (self.seen & !SEEN_SWITCH_BACK) | switched_back | SEEN_FAILBACK;
            }
            self.maybe_fence(model, host, &mut events);
        }
    }

    /// The driver, after every event: while the machine waits for a signaled WR on the
    /// backup QP, it posts its own fence there (a zero-length signaled WRITE) unless one is
    /// outstanding.
    fn maybe_fence(&mut self, model: &FailoverModel, host: usize, events: &mut VecDeque<Event>) {
        let h = &self.hosts[host];
        if !h.machine.reports_signaled_posts() || h.fence {
            return;
        }
        self.hosts[host].fence = true;
        self.post(model, host, BACKUP, Wqe::Fence, true);
        let progress = self.hosts[host].progress;
        events.push_back(Event::SignaledPosted { progress });
    }

    /// The driver: one action on `host`'s rings, QPs and CQs.
    fn perform(
        &mut self,
        model: &FailoverModel,
        host: usize,
        action: Action,
        events: &mut VecDeque<Event>,
    ) {
        match action {
            Action::MoveQpToErr { path } => {
                let qp = &mut self.host(host).qps[index(path)];
                qp.state = QpState::Err;
                // A probe in flight is flushed.
                if let Some(at) = qp.sq.iter().position(|e| e.wqe == Wqe::Probe) {
                    qp.sq.remove(at);
                    events.push_back(Event::ProbeCompleted { ok: false });
                }
            }
            Action::DrainDefault => self.hosts[host].draining = true,
            Action::CopyRecvsToBackup => {
                let h = self.host(host);
                let moved: Vec<RqEntry> = h.qps[DEFAULT].rq.drain(..).collect();
                h.qps[BACKUP].rq.extend(moved);
                h.recvs_copied = true;
            }
            Action::CopySendsToBackup { burn, skip_through } => {
                self.copy_sends(model, host, burn, skip_through)
            }
            Action::ResetDefaultQp => {
                self.hosts[host].recvs_copied = false;
                let qp = &mut self.hosts[host].qps[DEFAULT];
                let discards = qp.sq.iter().any(|e| matches!(e.wqe, Wqe::App(_)))
                    || qp.rq.iter().any(|e| matches!(e, RqEntry::App(_)));
                *qp = Qp {
                    state: QpState::Reset,
                    ..Qp::ready(qp.epoch)
                };
                self.hosts[host].first_default_error = None;
                if discards {
                    self.violate(RESET_DISCARDED_WORK);
                }
            }
            Action::BringUpDefaultQp { epoch } => {
                if self.hosts[host].qps[DEFAULT].state != QpState::Reset {
                    self.violate(ILLEGAL_QP_TRANSITION);
                }
                let link_down =
                    !self.paths[DEFAULT].up && self.paths[DEFAULT].notified.includes(host);
                let refused = std::mem::take(&mut self.hosts[host].refuses_rtr);
                let link_down = link_down || refused;
                if !link_down {
                    if self.paths[DEFAULT].notified.includes(host) {
                        // Up while this host's link is still reported down.
                        self.seen |= SEEN_UP_UNREPORTED;
                    }
                    let epoch = epoch.0 as u8;
                    self.hosts[host].qps[DEFAULT] = Qp::ready(epoch);
                    if epoch >= 4 {
                        self.seen |= SEEN_EPOCH_4;
                    }
                    if model.policy != Policy::UnboundedPacketLifetime {
                        self.expire_packets(epoch);
                    }
                }
                events.push_back(Event::DefaultQpUp {
                    epoch,
                    ok: !link_down,
                });
            }
            Action::PostProbe => {
                if self.hosts[host].qps[DEFAULT].state == QpState::Rts {
                    self.post(model, host, DEFAULT, Wqe::Probe, true);
                } else {
                    events.push_back(Event::ProbeCompleted { ok: false });
                }
            }
            Action::SendControl {
                via: Path::Backup,
                message,
            } => {
                if !self.hosts[host].control_dead {
                    self.control[host].push(message);
                }
            }
            Action::SendControl {
                via: Path::Default,
                message,
            } => {
                if self.hosts[host].default_control_dead {
                    // The driver's send on a broken channel fails at once.
                    events.push_back(Event::ControlFailed { via: Path::Default });
                } else {
                    self.default_control[host].push(message);
                }
            }
            Action::SendManagement { message } => {
                if !model.scenario.budget.management {
                    // The driver has no management path to send on.
                    self.violate(ILLEGAL_QP_TRANSITION);
                }
                self.management[host].push(message);
            }
            Action::ResetSide {
                side: Side::DefaultChannel,
            } => {
                // What it had not delivered is gone, and it receives nothing until the
                // bring-up.
                self.hosts[host].default_control_dead = true;
                self.default_control[host].clear();
            }
            Action::BringUpSide {
                epoch: epoch @ SideEpoch::DefaultChannel(_),
            } => {
                self.hosts[host].default_control_dead = false;
                events.push_back(Event::SideUp { epoch, ok: true });
            }
            Action::ResetSide { side: Side::Backup } => {
                let h = &mut self.hosts[host];
                let qp = &mut h.qps[BACKUP];
                let discards = qp.sq.iter().any(|e| matches!(e.wqe, Wqe::App(_)))
                    || qp.rq.iter().any(|e| matches!(e, RqEntry::App(_)));
                *qp = Qp {
                    state: QpState::Reset,
                    ..Qp::ready(qp.epoch)
                };
                // Its control QP is reset too: what it had not delivered is gone, and nothing
                // goes through it until the bring-up.
                h.control_dead = true;
                self.control[host].clear();
                if discards {
                    self.violate(RESET_DISCARDED_WORK);
                }
            }
            Action::BringUpSide {
                epoch: epoch @ SideEpoch::Backup(_),
            } => {
                if self.hosts[host].qps[BACKUP].state != QpState::Reset {
                    self.violate(ILLEGAL_QP_TRANSITION);
                }
                // Backup epochs tell incarnations apart by their PSNs, as the default pair's.
                self.hosts[host].qps[BACKUP] = Qp::ready(epoch.number() as u8);
                self.hosts[host].control_dead = false;
                events.push_back(Event::SideUp { epoch, ok: true });
            }
            Action::DrainBackup => events.push_back(Event::BackupDrained {
                progress: self.hosts[host].progress,
            }),
            Action::MoveRecvsToDefault { consumed_through } => {
                let h = self.host(host);
                // Consumed receive WQEs have left the ring; every App entry left is unconsumed.
                debug_assert!(h.progress.recvs_completed == consumed_through);
                let [default, backup] = &mut h.qps;
                for entry in backup.rq.iter_mut() {
                    if let RqEntry::App(n) = *entry {
                        default.rq.push(RqEntry::App(n));
                        *entry = RqEntry::Stale(n);
                    }
                }
            }
            Action::ReleaseDefaultDoorbell => {
                if self.hosts[host].qps[DEFAULT].state != QpState::Rts {
                    self.violate(ILLEGAL_QP_TRANSITION);
                }
                let withheld: Vec<usize> = self.hosts[host].qps[DEFAULT]
                    .sq
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| e.psn.is_none() && !e.stalled)
                    .map(|(i, _)| i)
                    .collect();
                for at in withheld {
                    self.ring(model, host, DEFAULT, at);
                }
                self.seen |= SEEN_SWITCH_BACK;
            }
            Action::DrainForFailback => {
                // Both QPs are in ERR (the machine moved them just before): what the model's
                // NIC completed is polled already.
                let event = self.failback_drained(model, host);
                events.push_back(event);
            }
            Action::Failback {
                epoch,
                skip_through,
            } => {
                let ok = self.fail_back(model, host, epoch, skip_through);
                events.push_back(Event::DefaultQpUp { epoch, ok });
            }
            Action::SurfaceError { .. } => self.surface_error(host),
        }
    }

    /// The failback drain: what was sent on either QP and has not completed.
    fn failback_drained(&mut self, model: &FailoverModel, host: usize) -> Event {
        let h = &self.hosts[host];
        let sent = || {
            h.qps[BACKUP]
                .sq
                .iter()
                .chain(h.qps[DEFAULT].sq.iter())
                .filter(|e| e.psn.is_some())
        };
        let atomic_in_flight =
            sent().any(|e| matches!(e.wqe, Wqe::App(n) if model.wr(host, n).op == Op::FetchAdd));
        let unfinished: Vec<SqEntry> = h.qps[BACKUP]
            .sq
            .iter()
            .chain(h.qps[DEFAULT].sq.iter())
            .copied()
            .collect();
        let sends_before_first_read =
            sends_before_first_read(&model.planned(host, &unfinished), h.progress.sends_posted);
        if atomic_in_flight {
            self.seen |= SEEN_ATOMIC_REFUSED;
        }
        Event::FailbackDrained {
            progress: h.progress,
            atomic_in_flight,
            sends_before_first_read,
        }
    }

    /// The failback's ring work: the default QP reset and up in `epoch`; the backup's receives
    /// then the default's on its RQ; the backup's application WQEs then the default's on its
    /// SQ, those through the peer's `skip_through`-th two-sided send completed, the rest
    /// withheld. Whether the QP came up (not while its link is known down).
    fn fail_back(
        &mut self,
        model: &FailoverModel,
        host: usize,
        epoch: Epoch,
        skip_through: u64,
    ) -> bool {
        let link_down = !self.paths[DEFAULT].up && self.paths[DEFAULT].notified.includes(host);
        if link_down {
            return false;
        }
        if std::mem::take(&mut self.hosts[host].refuses_rtr) {
            self.seen |= SEEN_FAILBACK_REFUSED;
            if model.policy == Policy::FailbackResetsBeforeBringUp {
                // The default ring was reset before the bring-up and every send kept for the
                // connection's error, the backup ring's too, while the backup ring stays:
                // its WQEs are listed twice. The default RQ's receives are gone.
                let h = &mut self.hosts[host];
                let [default, backup] = &mut h.qps;
                let backup_sends: Vec<SqEntry> = backup.sq.clone();
                default.sq.extend(backup_sends);
                default.rq.clear();
            }
            return false;
        }
        let h = &mut self.hosts[host];
        let [default, backup] = &mut h.qps;
        let mut outstanding: Vec<SqEntry> = backup.sq.drain(..).collect();
        outstanding.append(&mut default.sq);
        outstanding.retain(|e| matches!(e.wqe, Wqe::App(_)));
        let mut recvs: Vec<RqEntry> = backup
            .rq
            .drain(..)
            .filter(|e| matches!(e, RqEntry::App(_)))
            .collect();
        let default_recvs = default
            .rq
            .drain(..)
            .filter(|e| matches!(e, RqEntry::App(_)));
        if h.recvs_copied && model.policy == Policy::FailbackDropsRecvsAfterCopy {
            if default_recvs.count() > 0 {
                self.seen |= SEEN_RECV_DURING_FAILBACK;
            }
        } else {
            let before = recvs.len();
            recvs.extend(default_recvs);
            if h.recvs_copied && recvs.len() > before {
                self.seen |= SEEN_RECV_DURING_FAILBACK;
            }
        }
        h.recvs_copied = false;
        // The driver's fence was the backup SQ's: gone with it.
        h.fence = false;
        h.first_default_error = None;
        let e = epoch.0 as u8;
        h.qps[DEFAULT] = Qp::ready(e);
        h.qps[DEFAULT].rq = recvs;
        if e >= 4 {
            self.seen |= SEEN_EPOCH_4;
        }
        if model.policy != Policy::UnboundedPacketLifetime {
            self.expire_packets(e);
        }
        let sends_posted = self.hosts[host].progress.sends_posted;
        let skip = plan_copy(
            &model.planned(host, &outstanding),
            sends_posted,
            skip_through,
        )
        .consumed;
        for entry in &outstanding[..skip] {
            if let Wqe::App(n) = entry.wqe {
                self.complete(model, host, n);
            }
        }
        for entry in &outstanding[skip..] {
            self.post(model, host, DEFAULT, entry.wqe, false);
        }
        true
    }

    /// The drain finishes: every completion of the default QP has been polled.
    fn drained(&mut self, model: &FailoverModel, host: usize) {
        self.hosts[host].draining = false;
        let h = &self.hosts[host];
        let atomic_in_flight = h.qps[DEFAULT].sq.iter().any(|e| match e.wqe {
            Wqe::App(n) => e.psn.is_some() && model.wr(host, n).op == Op::FetchAdd,
            _ => false,
        });
        // The oldest READ that was sent and has not completed may have executed at the peer.
        let sends_before_first_read = sends_before_first_read(
            &model.planned(host, &h.qps[DEFAULT].sq),
            h.progress.sends_posted,
        );
        let event = Event::DefaultDrained {
            progress: h.progress,
            first_error: h.first_default_error,
            atomic_in_flight: atomic_in_flight && model.policy != Policy::RetransmitEverything,
            sends_before_first_read,
        };
        if atomic_in_flight && model.policy != Policy::RetransmitEverything {
            self.seen |= SEEN_ATOMIC_REFUSED;
        }
        self.feed(model, host, event);
    }

    fn copy_sends(&mut self, model: &FailoverModel, host: usize, burn: u64, skip_through: u64) {
        self.seen |= SEEN_FAILOVER;
        if self.seen & SEEN_BACKUP_REPAIRED != 0 {
            self.seen |= SEEN_FAILOVER_AFTER_REPAIR;
        }
        if self.seen & SEEN_BACKUP_REPAIRED_IN_ROUND != 0 {
            self.seen |= SEEN_FAILOVER_AFTER_REPAIR_IN_ROUND;
        }
        let mut outstanding: Vec<SqEntry> = self.host(host).qps[DEFAULT].sq.drain(..).collect();
        // The driver's list leaves its own WQEs (a probe) out.
        outstanding.retain(|e| matches!(e.wqe, Wqe::App(_)));
        // Everything up to the last send the peer consumed was executed (RC executes in order).
        let sends_posted = self.hosts[host].progress.sends_posted;
        let skip = match model.policy {
            Policy::RetransmitEverything => 0,
            _ => {
                plan_copy(
                    &model.planned(host, &outstanding),
                    sends_posted,
                    skip_through,
                )
                .consumed
            }
        };
        if skip > 0 {
            self.seen |= SEEN_SKIP;
        }
        for entry in &outstanding[..skip] {
            if let Wqe::App(n) = entry.wqe {
                self.complete(model, host, n);
            }
        }
        let burn = if model.policy == Policy::IgnoreStaleRecvs {
            0
        } else {
            burn
        };
        for _ in 0..burn {
            self.seen |= SEEN_BURN;
            self.post(model, host, BACKUP, Wqe::Burn, true);
        }
        if model.policy == Policy::ReadsFirst {
            let is_read =
                |e: &SqEntry| matches!(e.wqe, Wqe::App(n) if model.wr(host, n).op == Op::Read);
            outstanding[skip..].sort_by_key(|e| !is_read(e));
        }
        for entry in &outstanding[skip..] {
            if let Wqe::App(_) = entry.wqe {
                self.post(model, host, BACKUP, entry.wqe, true);
            }
        }
    }

    /// Puts a WQE on a send queue; rings it (assigns a PSN and transmits) unless withheld.
    fn post(&mut self, model: &FailoverModel, host: usize, path: usize, wqe: Wqe, ring: bool) {
        let qp = &mut self.hosts[host].qps[path];
        qp.sq.push(SqEntry {
            wqe,
            psn: None,
            stalled: false,
        });
        if ring {
            let at = qp.sq.len() - 1;
            self.ring(model, host, path, at);
        }
    }

    fn ring(&mut self, model: &FailoverModel, host: usize, path: usize, at: usize) {
        let blocked = self.fence_blocks(model, host, path, at);
        let qp = &mut self.hosts[host].qps[path];
        qp.sq[at].stalled = blocked;
        if blocked {
            return;
        }
        let psn = qp.next_psn;
        qp.next_psn += 1;
        qp.sq[at].psn = Some(psn);
        if qp.state == QpState::Rts {
            let request = Request {
                epoch: qp.epoch,
                psn,
                wqe: qp.sq[at].wqe,
            };
            self.requests[path][host].push(request);
        }
    }

    /// Whether the NIC must hold the WQE at `at`: it is fenced and an earlier READ or atomic
    /// has not completed, or a WQE before it is held (the send queue is processed in order).
    fn fence_blocks(&self, model: &FailoverModel, host: usize, path: usize, at: usize) -> bool {
        let sq = &self.hosts[host].qps[path].sq;
        let fenced = matches!(sq[at].wqe, Wqe::App(n) if model.wr(host, n).fenced);
        sq[..at].iter().any(|e| {
            e.stalled || (fenced && matches!(e.wqe, Wqe::App(n) if model.wr(host, n).op.fences()))
        })
    }

    /// Starts the WQEs held behind a fence whose READs and atomics have completed.
    fn release_fenced(&mut self, model: &FailoverModel, host: usize, path: usize) {
        for at in 0..self.hosts[host].qps[path].sq.len() {
            if self.hosts[host].qps[path].sq[at].stalled {
                self.ring(model, host, path, at);
                if self.hosts[host].qps[path].sq[at].stalled {
                    return;
                }
            }
        }
    }

    /// A packet lives less long than three incarnations that came up (section 8.2 of
    /// docs/failover.md): by the time a default QP comes up in `epoch`, the packets of the
    /// earlier epochs whose PSNs the new incarnation reuses have left the network.
    fn expire_packets(&mut self, epoch: u8) {
        let expired = |e: u8| e < epoch && same_psns(e, epoch);
        for queue in &mut self.requests[DEFAULT] {
            queue.retain(|r| !expired(r.epoch));
        }
        for queue in &mut self.acks[DEFAULT] {
            queue.retain(|a| !expired(a.epoch));
        }
    }

    /// A send WR completed successfully (acknowledged, or skipped as consumed by the peer).
    fn complete(&mut self, model: &FailoverModel, host: usize, n: u8) {
        let w = model.wr(host, n);
        let peer = 1 - host;
        if w.op.two_sided() {
            self.hosts[host].progress.sends_completed += 1;
        }
        if self.hosts[peer].executed & (1 << n) == 0 {
            self.violate(SUCCESS_WITHOUT_EXECUTION);
        }
        if w.signaled {
            self.send_wc(host, n);
            let h = self.host(host);
            h.resolved = h.resolved.max(n + 1);
        }
    }

    /// The application sees a send completion for WR `n`.
    fn send_wc(&mut self, host: usize, n: u8) {
        let h = self.host(host);
        let in_order = h.last_send_wc.is_none_or(|last| n > last);
        h.last_send_wc = Some(n);
        if !in_order {
            self.violate(SEND_WC_OUT_OF_ORDER);
        }
    }

    fn surface_error(&mut self, host: usize) {
        let h = self.host(host);
        let mut outstanding: Vec<u8> = h
            .qps
            .iter()
            .flat_map(|qp| qp.sq.iter())
            .filter_map(|e| match e.wqe {
                Wqe::App(n) => Some(n),
                _ => None,
            })
            .collect();
        outstanding.sort_unstable();
        for qp in h.qps.iter_mut() {
            qp.state = QpState::Err;
            qp.sq.clear();
            qp.rq.clear();
        }
        h.saw_error = true;
        h.resolved = h.posted;
        h.fence = false;
        h.draining = false;
        for n in outstanding {
            self.send_wc(host, n);
        }
    }

    fn deliver_request(&mut self, model: &FailoverModel, path: usize, from: usize) {
        let request = self.requests[path][from].remove(0);
        let responder = 1 - from;
        if !self.paths[path].up || self.hosts[responder].qps[path].state != QpState::Rts {
            return;
        }
        let qp = &self.hosts[responder].qps[path];
        let same_incarnation =
            same_psns(request.epoch, qp.epoch) || model.policy == Policy::SamePsnEveryEpoch;
        if !same_incarnation {
            // A packet of another incarnation: its PSN lies far outside the window, so it is
            // taken for a duplicate and acknowledged (with its own PSN), never executed.
            self.seen |= SEEN_STALE_PACKET;
            self.acks[path][responder].push(Ack {
                epoch: request.epoch,
                psn: request.psn,
                read: None,
            });
            return;
        }
        if request.epoch != qp.epoch {
            self.seen |= SEEN_STALE_PACKET;
        }
        let epoch = qp.epoch;
        if request.psn < qp.epsn {
            if let Wqe::App(n) = request.wqe {
                if model.wr(from, n).op == Op::Read {
                    // A duplicate READ executes again: RC responders read the memory anew.
                    let changed = self.read(model, path, from, n);
                    self.acks[path][responder].push(Ack {
                        epoch,
                        psn: request.psn,
                        read: Some(changed),
                    });
                    return;
                }
            }
            // A duplicate: acknowledged again, not executed (atomics replay from the cache).
            let psn = qp.epsn - 1;
            self.acks[path][responder].push(Ack {
                epoch,
                psn,
                read: None,
            });
            return;
        }
        if request.psn > qp.epsn {
            // Out of sequence after a loss: dropped; the requester times out and goes back.
            return;
        }
        let read = self.execute(model, path, from, request.wqe);
        let qp = &mut self.hosts[responder].qps[path];
        qp.epsn += 1;
        self.acks[path][responder].push(Ack {
            epoch,
            psn: request.psn,
            read,
        });
    }

    /// The responder executes a new request; a READ's response says whether it read changed
    /// memory.
    fn execute(
        &mut self,
        model: &FailoverModel,
        path: usize,
        from: usize,
        wqe: Wqe,
    ) -> Option<bool> {
        let responder = 1 - from;
        match wqe {
            Wqe::Probe | Wqe::Fence => {}
            Wqe::Burn => match self.hosts[responder].qps[path].rq.remove(0) {
                RqEntry::Stale(_) => {}
                RqEntry::App(_) => self.violate(BURN_IN_APP_RECV),
            },
            Wqe::App(n) if model.wr(from, n).op == Op::Read => {
                return Some(self.read(model, path, from, n));
            }
            Wqe::App(n) => {
                let w = model.wr(from, n);
                let h = &self.hosts[responder];
                let violation = match w.op {
                    Op::Write if n < h.observed_through => DATA_AFTER_NOTIFICATION,
                    Op::FetchAdd if h.executed & (1 << n) != 0 => ATOMIC_TWICE,
                    _ => 0,
                };
                self.violate(violation);
                if w.op.two_sided() {
                    self.receive(model, path, from, n);
                }
                self.hosts[responder].executed |= 1 << n;
            }
        }
        None
    }

    /// The responder executes the sender's READ `n`: it must see every earlier request of the
    /// QP; returns whether a later one already changed what it reads.
    fn read(&mut self, model: &FailoverModel, path: usize, from: usize, n: u8) -> bool {
        let program = model.program(from);
        let mask = |range: std::ops::Range<usize>| {
            range
                .filter(|&m| program[m].op.changes())
                .fold(0u16, |mask, m| mask | 1 << m)
        };
        let earlier = mask(0..usize::from(n));
        let later = mask(usize::from(n) + 1..program.len());
        let h = &mut self.hosts[1 - from];
        let missed_earlier = h.executed & earlier != earlier;
        let changed = h.executed & later != 0;
        h.executed |= 1 << n;
        if missed_earlier {
            self.violate(READ_BEFORE_EARLIER);
        }
        if path == BACKUP {
            self.seen |= SEEN_READ_ON_BACKUP;
        }
        changed
    }

    /// A two-sided request, the sender's WR `n`, consumes the responder's next receive WQE.
    fn receive(&mut self, model: &FailoverModel, path: usize, from: usize, n: u8) {
        let responder = 1 - from;
        let ordinal = two_sided_ordinal(model.program(from), n);
        let entry = self.hosts[responder].qps[path].rq.remove(0);
        let RqEntry::App(k) = entry else {
            // The driver takes a stale WQE's completion for a burn and swallows it: lost.
            return self.violate(SEND_IN_STALE_RECV);
        };
        let h = &mut self.hosts[responder];
        let mut violations = 0;
        if h.consumed & (1 << k) != 0 {
            violations |= RECV_CONSUMED_TWICE;
        }
        h.consumed |= 1 << k;
        if k != ordinal {
            violations |= SEND_IN_WRONG_RECV;
        }
        if k != h.recv_wcs {
            violations |= RECV_WC_OUT_OF_ORDER;
        }
        h.recv_wcs = h.recv_wcs.max(k + 1);
        h.progress.recvs_completed += 1;
        // The application observes the notification: the data before it must be there.
        let data_before: u16 = model.program(from)[..usize::from(n)]
            .iter()
            .enumerate()
            .filter(|(_, w)| w.op == Op::Write)
            .fold(0, |mask, (i, _)| mask | 1 << i);
        if h.executed & data_before != data_before {
            violations |= NOTIFICATION_BEFORE_DATA;
        }
        h.observed_through = h.observed_through.max(n + 1);
        self.violate(violations);
    }

    /// An acknowledgment (or READ response) arrives: the WQEs it retires complete, and the
    /// driver polls them as one batch, as `ResilientQp::take_batch` does: the completions
    /// first, then the events they cause. After a lost ACK, a cumulative one retires several.
    fn deliver_ack(&mut self, model: &FailoverModel, path: usize, from: usize) {
        let ack = self.acks[path][from].remove(0);
        let requester = 1 - from;
        let qp = &self.hosts[requester].qps[path];
        if !self.paths[path].up || qp.state != QpState::Rts || !same_psns(ack.epoch, qp.epoch) {
            return;
        }
        let acked: Vec<SqEntry> = {
            let qp = &mut self.hosts[requester].qps[path];
            let mut count = 0;
            for e in &qp.sq {
                let Some(psn) = e.psn.filter(|&p| p <= ack.psn) else {
                    break;
                };
                if matches!(e.wqe, Wqe::App(n) if model.wr(requester, n).op == Op::Read) {
                    // A READ completes only with its own response; an ACK past it means the
                    // response was lost, and the READ goes again on the timeout.
                    if psn == ack.psn && ack.read.is_some() {
                        count += 1;
                    }
                    break;
                }
                count += 1;
            }
            if count > 0 {
                qp.retries = RETRY_CNT;
            }
            qp.sq.drain(..count).collect()
        };
        let fence_at = acked.iter().position(|e| e.wqe == Wqe::Fence);
        let signaled_after_fence = fence_at.is_some_and(|at| {
            acked[at + 1..]
                .iter()
                .any(|e| matches!(e.wqe, Wqe::App(n) if model.wr(requester, n).signaled))
        });
        if signaled_after_fence {
            self.seen |= SEEN_FENCE_IN_BATCH;
        }
        let mut events = Vec::new();
        for entry in acked {
            match entry.wqe {
                Wqe::App(n) => {
                    if ack.read == Some(true) && model.wr(requester, n).op == Op::Read {
                        self.violate(READ_RETURNED_CHANGED_DATA);
                    }
                    self.complete(model, requester, n);
                }
                Wqe::Probe => events.push(Event::ProbeCompleted { ok: true }),
                Wqe::Burn => {}
                Wqe::Fence => {
                    if model.policy == Policy::FenceOnlyLastInBatch && signaled_after_fence {
                        // Taken for the application's: a completion it never posted, and the
                        // fence stays set for good.
                        self.violate(FOREIGN_COMPLETION);
                    } else {
                        self.hosts[requester].fence = false;
                        events.push(Event::FenceCompleted);
                    }
                }
            }
        }
        for event in events {
            self.feed(model, requester, event);
        }
        self.release_fenced(model, requester, path);
    }

    fn timeout(&mut self, model: &FailoverModel, host: usize, path: usize) {
        let qp = &mut self.hosts[host].qps[path];
        if qp.retries > 0 {
            // Go back N: retransmit everything unacknowledged.
            qp.retries -= 1;
            let epoch = qp.epoch;
            let again: Vec<Request> = qp
                .sq
                .iter()
                .filter_map(|e| {
                    e.psn.map(|psn| Request {
                        epoch,
                        psn,
                        wqe: e.wqe,
                    })
                })
                .collect();
            self.requests[path][host].extend(again);
            return;
        }
        // Retry exhaustion: error completion for the oldest WQE, QP to ERR, the rest flushed.
        qp.state = QpState::Err;
        let head = qp.sq.first().map(|e| e.wqe);
        let status = WcStatus::RetryExcErr;
        let event = match head {
            Some(Wqe::Probe) => {
                qp.sq.remove(0);
                Event::ProbeCompleted { ok: false }
            }
            _ => Event::ErrorCompletion {
                path: path_of(path),
                status,
            },
        };
        if path == DEFAULT && head != Some(Wqe::Probe) {
            self.hosts[host].first_default_error.get_or_insert(status);
        }
        self.feed(model, host, event);
    }

    fn post_app(&mut self, model: &FailoverModel, host: usize) {
        let n = self.hosts[host].posted;
        let w = model.wr(host, n);
        let h = self.host(host);
        h.posted += 1;
        if w.op.two_sided() {
            h.progress.sends_posted += 1;
        }
        match h.machine.send_route() {
            Route::Closed => {
                h.saw_error = true;
                h.resolved = h.posted;
                self.send_wc(host, n);
            }
            Route::Default => self.post(model, host, DEFAULT, Wqe::App(n), true),
            Route::DefaultWithheld => self.post(model, host, DEFAULT, Wqe::App(n), false),
            Route::Backup => self.post(model, host, BACKUP, Wqe::App(n), true),
        }
    }

    fn deliver_control(&mut self, model: &FailoverModel, from: usize) {
        let message = self.control[from].remove(0);
        let to = 1 - from;
        if self.hosts[to].control_dead {
            // An RC QP in ERR answers nothing: the sender's retries run out.
            self.hosts[from].control_dead = true;
            self.control[from].clear();
            return self.feed(model, from, Event::ControlFailed { via: Path::Backup });
        }
        self.feed(model, to, Event::Control(message));
    }

    fn path_down(&mut self, model: &FailoverModel, path: usize, notified: Notified) {
        // Hosts still believing an earlier failure whose recovery went unreported are told
        // of the recovery with this one's.
        let believed = self.paths[path].notified;
        self.paths[path] = PathState {
            up: false,
            notified: notified.union(believed),
        };
        for host in [A, B] {
            if notified.includes(host) {
                self.feed(
                    model,
                    host,
                    Event::LinkDown {
                        path: path_of(path),
                    },
                );
            }
        }
    }

    fn path_up(&mut self, model: &FailoverModel, path: usize) {
        let notified = self.paths[path].notified;
        self.paths[path] = PathState {
            up: true,
            notified: Notified::Nobody,
        };
        for host in [A, B] {
            if notified.includes(host) {
                self.feed(
                    model,
                    host,
                    Event::LinkUp {
                        path: path_of(path),
                    },
                );
            }
        }
    }

    fn due(&self, host: usize) -> bool {
        self.hosts[host]
            .machine
            .poll_timeout()
            .is_some_and(|t| t.as_nanos() <= self.now)
    }

    /// Whether the oldest request `from` sent on `path` can arrive now: a two-sided request
    /// waits while the responder has no receive WQE for it (RNR).
    fn request_deliverable(&self, model: &FailoverModel, path: usize, from: usize) -> bool {
        !self.requests[path][from].is_empty() && !self.rnr_stalled(model, path, from)
    }

    /// Whether the oldest request `from` sent on `path` would execute but finds no receive
    /// WQE. Every scenario posts all its receives up front, so this is always the protocol's
    /// fault: a receive WQE on the wrong QP.
    fn rnr_stalled(&self, model: &FailoverModel, path: usize, from: usize) -> bool {
        let Some(request) = self.requests[path][from].first() else {
            return false;
        };
        let qp = &self.hosts[1 - from].qps[path];
        let executes = self.paths[path].up
            && qp.state == QpState::Rts
            && (same_psns(request.epoch, qp.epoch) || model.policy == Policy::SamePsnEveryEpoch)
            && request.psn == qp.epsn;
        let needs_recv = match request.wqe {
            Wqe::Burn => true,
            Wqe::App(n) => model.wr(from, n).op.two_sided(),
            Wqe::Probe | Wqe::Fence => false,
        };
        executes && needs_recv && qp.rq.is_empty()
    }

    /// Whether a request waits for a receive WQE that the application has posted: it sits on
    /// the other QP, which is the protocol's fault (a burn's stale WQE always exists).
    fn rnr_on_posted_recv(&self, model: &FailoverModel, path: usize, from: usize) -> bool {
        if !self.rnr_stalled(model, path, from) {
            return false;
        }
        match self.requests[path][from][0].wqe {
            Wqe::App(n) => {
                let ordinal = two_sided_ordinal(model.program(from), n);
                self.hosts[1 - from].progress.recvs_posted > u64::from(ordinal)
            }
            _ => true,
        }
    }

    fn post_recv(&mut self, host: usize) {
        let h = self.host(host);
        let k = h.progress.recvs_posted as u8;
        h.progress.recvs_posted += 1;
        match h.machine.recv_route() {
            Route::Closed => {
                h.saw_error = true;
                h.recv_wcs = h.recv_wcs.max(k + 1);
            }
            Route::Default | Route::DefaultWithheld => h.qps[DEFAULT].rq.push(RqEntry::App(k)),
            Route::Backup => h.qps[BACKUP].rq.push(RqEntry::App(k)),
        }
    }

    fn can_time_out(&self, host: usize, path: usize) -> bool {
        let qp = &self.hosts[host].qps[path];
        qp.state == QpState::Rts
            && qp.sq.iter().any(|e| e.psn.is_some())
            && self.requests[path][host].is_empty()
            && self.acks[path][1 - host].is_empty()
    }
}

/// Whether packets of epochs `a` and `b` look alike: their PSNs start at the same place
/// (`Epoch::start_psn`, the production function), as for epochs four apart.
fn same_psns(a: u8, b: u8) -> bool {
    let start = |e: u8| Epoch(u32::from(e)).start_psn(0) / EPOCH_PSN_STRIDE;
    start(a) == start(b)
}

fn index(path: Path) -> usize {
    match path {
        Path::Default => DEFAULT,
        Path::Backup => BACKUP,
    }
}

fn path_of(index: usize) -> Path {
    if index == DEFAULT {
        Path::Default
    } else {
        Path::Backup
    }
}

impl Model for FailoverModel {
    type State = World;
    type Action = Step;

    fn init_states(&self) -> Vec<World> {
        let host = |h: usize| {
            let mut default = Qp::ready(0);
            let up_front = if self.scenario.recvs_up_front {
                self.scenario.recvs[h]
            } else {
                0
            };
            default.rq = (0..up_front).map(RqEntry::App).collect();
            Host {
                machine: Failover::new(self.config(h), Timestamp::ZERO),
                posted: 0,
                progress: Progress {
                    recvs_posted: u64::from(up_front),
                    ..Progress::default()
                },
                qps: [default, Qp::ready(0)],
                last_send_wc: None,
                resolved: 0,
                recv_wcs: 0,
                saw_error: false,
                executed: 0,
                consumed: 0,
                observed_through: 0,
                fence: false,
                first_default_error: None,
                control_dead: false,
                default_control_dead: false,
                draining: false,
                recvs_copied: false,
                refuses_rtr: false,
            }
        };
        let up = PathState {
            up: true,
            notified: Notified::Nobody,
        };
        vec![World {
            hosts: [host(A), host(B)],
            requests: Default::default(),
            acks: Default::default(),
            control: Default::default(),
            default_control: Default::default(),
            management: Default::default(),
            paths: [up, up],
            budget: self.scenario.budget,
            now: 0,
            violations: 0,
            seen: 0,
            starved: false,
        }]
    }

    fn actions(&self, world: &World, steps: &mut Vec<Step>) {
        let progress_before = steps.len();
        for path in [DEFAULT, BACKUP] {
            for from in [A, B] {
                if world.request_deliverable(self, path, from) {
                    steps.push(Step::DeliverRequest { path, from });
                }
                if !world.acks[path][from].is_empty() {
                    steps.push(Step::DeliverAck { path, from });
                }
            }
        }
        for host in [A, B] {
            for path in [DEFAULT, BACKUP] {
                if world.can_time_out(host, path) {
                    steps.push(Step::Timeout { host, path });
                }
            }
            if !world.default_control[host].is_empty() && world.paths[DEFAULT].up {
                steps.push(Step::DeliverDefaultControl { from: host });
            }
            if !world.management[host].is_empty() {
                steps.push(Step::DeliverManagement { from: host });
            }
            let default_live_for_good = world.budget.default_failures == 0
                && world.paths[DEFAULT].up
                && [A, B]
                    .iter()
                    .all(|&h| world.hosts[h].machine.default_qp_phase() == DefaultQpPhase::Live);
            if world.budget.backup_qp_failures > 0
                && world.hosts[host].qps[BACKUP].state == QpState::Rts
                && (!world.budget.backup_qps_fail_with_the_default_live || default_live_for_good)
            {
                steps.push(Step::BackupQpsFail { host });
            }
            let out_of_rts =
                world.budget.default_qps_fail_out_of_rts && !world.hosts[host].default_control_dead;
            if world.budget.default_qp_failures > 0
                && (world.hosts[host].qps[DEFAULT].state == QpState::Rts || out_of_rts)
            {
                steps.push(Step::DefaultQpsFail { host });
            }
            if !world.control[host].is_empty() {
                if world.paths[BACKUP].up {
                    steps.push(Step::DeliverControl { from: host });
                } else {
                    for head_delivered in [false, true] {
                        steps.push(Step::ControlTimeout {
                            from: host,
                            head_delivered,
                        });
                    }
                }
            }
            if world.hosts[host].draining && world.hosts[host].qps[DEFAULT].state != QpState::Rts {
                steps.push(Step::Drained { host });
            }
            if world.budget.ticks > 0 && world.due(host) {
                steps.push(Step::Tick { host });
            }
        }
        let quiet = steps.len() == progress_before;
        let later = [A, B].iter().any(|&h| {
            world.hosts[h]
                .machine
                .poll_timeout()
                .is_some_and(|t| t.as_nanos() > world.now)
        });
        if quiet && later && world.budget.waits > 0 {
            steps.push(Step::Wait);
        }
        // Not work in progress: a refusal waits for a bring-up, as a path failure does.
        for host in [A, B] {
            if world.budget.rtr_refusals > 0 && !world.hosts[host].refuses_rtr {
                steps.push(Step::RefuseRtr { host });
            }
        }
        // The application and the faults, at any moment.
        for host in [A, B] {
            if usize::from(world.hosts[host].posted) < self.program(host).len() {
                steps.push(Step::Post { host });
            }
            if world.hosts[host].progress.recvs_posted < u64::from(self.scenario.recvs[host]) {
                steps.push(Step::PostRecv { host });
            }
        }
        if world.budget.losses > 0 {
            for path in [DEFAULT, BACKUP] {
                for from in [A, B] {
                    if !world.requests[path][from].is_empty() {
                        steps.push(Step::LoseRequest { path, from });
                    }
                    if !world.acks[path][from].is_empty() {
                        steps.push(Step::LoseAck { path, from });
                    }
                }
            }
        }
        let down_budget = [world.budget.default_failures, world.budget.backup_failures];
        for path in [DEFAULT, BACKUP] {
            if world.paths[path].up && down_budget[path] > 0 {
                for notified in [
                    Notified::Nobody,
                    Notified::Host(A),
                    Notified::Host(B),
                    Notified::Both,
                ] {
                    steps.push(Step::PathDown { path, notified });
                }
            }
        }
        if !world.paths[DEFAULT].up && world.budget.default_repairs > 0 {
            steps.push(Step::PathUp {
                path: DEFAULT,
                reported: true,
            });
            if world.budget.stale_link_reports {
                steps.push(Step::PathUp {
                    path: DEFAULT,
                    reported: false,
                });
            }
        }
    }

    fn next_state(&self, world: &World, step: Step) -> Option<World> {
        let mut next = world.clone();
        match step {
            Step::Post { host } => next.post_app(self, host),
            Step::PostRecv { host } => next.post_recv(host),
            Step::DeliverRequest { path, from } => next.deliver_request(self, path, from),
            Step::DeliverAck { path, from } => next.deliver_ack(self, path, from),
            Step::LoseRequest { path, from } => {
                next.budget.losses -= 1;
                next.requests[path][from].remove(0);
            }
            Step::LoseAck { path, from } => {
                next.budget.losses -= 1;
                next.acks[path][from].remove(0);
            }
            Step::Timeout { host, path } => next.timeout(self, host, path),
            Step::DeliverControl { from } => next.deliver_control(self, from),
            Step::DeliverDefaultControl { from } => {
                let message = next.default_control[from].remove(0);
                if next.hosts[1 - from].default_control_dead {
                    // An RC QP in ERR or RESET answers nothing: the sender's retries run out.
                    next.hosts[from].default_control_dead = true;
                    next.default_control[from].clear();
                    next.feed(self, from, Event::ControlFailed { via: Path::Default });
                } else {
                    next.feed(self, 1 - from, Event::Control(message));
                }
            }
            Step::DefaultQpsFail { host } => {
                next.budget.default_qp_failures -= 1;
                let h = &mut next.hosts[host];
                let data_qp_in_rts = h.qps[DEFAULT].state == QpState::Rts;
                if data_qp_in_rts {
                    h.qps[DEFAULT].state = QpState::Err;
                }
                h.default_control_dead = true;
                next.default_control[host].clear();
                // The channel's posted receives flush; so does the data QP's work (an idle
                // one's next post would flush at once). A data QP out of RTS has nothing to
                // flush: the failover took its work.
                next.feed(self, host, Event::ControlFailed { via: Path::Default });
                if data_qp_in_rts {
                    next.feed(
                        self,
                        host,
                        Event::ErrorCompletion {
                            path: Path::Default,
                            status: WcStatus::WrFlushErr,
                        },
                    );
                }
            }
            Step::DeliverManagement { from } => {
                let message = next.management[from].remove(0);
                let to = 1 - from;
                match message {
                    ControlMessage::FailbackReady { .. } if next.hosts[to].default_control_dead => {
                        next.seen |= SEEN_FAILBACK_OVER_MANAGEMENT;
                    }
                    ControlMessage::SideRearmDone {
                        epoch: SideEpoch::DefaultChannel(_),
                        ok: true,
                    } => next.seen |= SEEN_CHANNEL_REPAIRED_OVER_MANAGEMENT,
                    _ => {}
                }
                next.feed(self, to, Event::Management(message));
            }
            Step::RefuseRtr { host } => {
                next.budget.rtr_refusals -= 1;
                next.hosts[host].refuses_rtr = true;
            }
            Step::BackupQpsFail { host } => {
                next.budget.backup_qp_failures -= 1;
                let h = &mut next.hosts[host];
                h.qps[BACKUP].state = QpState::Err;
                h.control_dead = true;
                next.control[host].clear();
                next.feed(self, host, Event::ControlFailed { via: Path::Backup });
            }
            Step::ControlTimeout {
                from,
                head_delivered,
            } => {
                let to = 1 - from;
                if head_delivered && !next.hosts[to].control_dead {
                    let message = next.control[from].remove(0);
                    next.feed(self, to, Event::Control(message));
                }
                next.hosts[from].control_dead = true;
                next.control[from].clear();
                next.feed(self, from, Event::ControlFailed { via: Path::Backup });
            }
            Step::PathDown { path, notified } => {
                match path {
                    DEFAULT => next.budget.default_failures -= 1,
                    _ => next.budget.backup_failures -= 1,
                }
                next.path_down(self, path, notified);
            }
            Step::PathUp { path, reported } => {
                next.budget.default_repairs -= 1;
                if reported {
                    next.path_up(self, path);
                } else {
                    next.paths[path].up = true;
                }
            }
            Step::Drained { host } => next.drained(self, host),
            Step::Tick { host } => {
                next.budget.ticks -= 1;
                next.feed(self, host, Event::Tick);
            }
            Step::Wait => {
                next.budget.waits -= 1;
                if self.scenario.budget.backup_qps_fail_with_the_default_live
                    && [A, B].iter().any(|&h| next.due(h))
                {
                    next.starved = true;
                }
                let deadline = [A, B]
                    .iter()
                    .filter_map(|&h| next.hosts[h].machine.poll_timeout())
                    .map(Timestamp::as_nanos)
                    .filter(|&t| t > next.now)
                    .min()?;
                next.now = deadline;
                for host in [A, B] {
                    if next.due(host) {
                        next.feed(self, host, Event::Tick);
                    }
                }
            }
        }
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always(
                "a notification is never observed before its data",
                |_: &FailoverModel, w: &World| w.violations & NOTIFICATION_BEFORE_DATA == 0,
            ),
            Property::always(
                "data is never rewritten once its notification was observed",
                |_: &FailoverModel, w: &World| w.violations & DATA_AFTER_NOTIFICATION == 0,
            ),
            Property::always(
                "every send lands in its own receive WQE, once",
                |_: &FailoverModel, w: &World| {
                    w.violations
                        & (RECV_CONSUMED_TWICE
                            | SEND_IN_WRONG_RECV
                            | SEND_IN_STALE_RECV
                            | BURN_IN_APP_RECV)
                        == 0
                },
            ),
            Property::always(
                "a send never waits for a receive posted on the other QP (no RNR)",
                |m: &FailoverModel, w: &World| {
                    [DEFAULT, BACKUP].iter().all(|&path| {
                        [A, B]
                            .iter()
                            .all(|&from| !w.rnr_on_posted_recv(m, path, from))
                    })
                },
            ),
            Property::always(
                "no atomic executes twice",
                |_: &FailoverModel, w: &World| w.violations & ATOMIC_TWICE == 0,
            ),
            Property::always(
                "application completions are neither duplicated nor reordered",
                |_: &FailoverModel, w: &World| {
                    w.violations & (SEND_WC_OUT_OF_ORDER | RECV_WC_OUT_OF_ORDER) == 0
                },
            ),
            Property::always(
                "no success completion for work the peer did not execute",
                |_: &FailoverModel, w: &World| w.violations & SUCCESS_WITHOUT_EXECUTION == 0,
            ),
            Property::always(
                "a READ completing with success never returns data a later request changed",
                |_: &FailoverModel, w: &World| w.violations & READ_RETURNED_CHANGED_DATA == 0,
            ),
            Property::always(
                "a READ sees every request posted before it",
                |_: &FailoverModel, w: &World| w.violations & READ_BEFORE_EARLIER == 0,
            ),
            Property::always(
                "the application sees completions of its own WRs only",
                |_: &FailoverModel, w: &World| w.violations & FOREIGN_COMPLETION == 0,
            ),
            Property::always(
                "no reset discards posted work",
                |_: &FailoverModel, w: &World| w.violations & RESET_DISCARDED_WORK == 0,
            ),
            Property::always(
                "the machine asks only for legal QP transitions",
                |_: &FailoverModel, w: &World| w.violations & ILLEGAL_QP_TRANSITION == 0,
            ),
            Property::always(
                "the machine stays within its action bound",
                |_: &FailoverModel, w: &World| w.violations & TOO_MANY_ACTIONS == 0,
            ),
            Property::always(
                "when the system is quiet, everything posted has completed or failed",
                |m: &FailoverModel, w: &World| {
                    !m.quiet_and_done(w)
                        || [A, B]
                            .iter()
                            .all(|&h| w.hosts[h].resolved == w.hosts[h].posted)
                },
            ),
            Property::always(
                "a backup failure with the default pair live never fails the connection",
                |m: &FailoverModel, w: &World| {
                    !m.scenario.budget.backup_qps_fail_with_the_default_live
                        || w.starved
                        || [A, B]
                            .iter()
                            .all(|&h| w.hosts[h].machine.failed().is_none())
                },
            ),
            Property::always(
                "without a backup failure or an atomic, failover hides every failure",
                |m: &FailoverModel, w: &World| {
                    !m.scenario.expects_success()
                        || !m.quiet_and_done(w)
                        || [A, B].iter().all(|&h| {
                            let host = &w.hosts[h];
                            let peer_sends =
                                m.program(1 - h).iter().filter(|w| w.op.two_sided()).count();
                            !host.saw_error
                                && host.machine.failed().is_none()
                                && usize::from(host.recv_wcs) == peer_sends
                        })
                },
            ),
        ];
        // What the scenario must reach, so that a pass cannot come from a model that never
        // gets there.
        let coverage: [(u32, &'static str, Condition); 21] = [
            (
                SEEN_FAILOVER_AFTER_REPAIR_IN_ROUND,
                "a failover round that waited for a lost backup side completes over it, repaired over the management network",
                |_, w| w.seen & SEEN_FAILOVER_AFTER_REPAIR_IN_ROUND != 0,
            ),
            (
                SEEN_UP_UNREPORTED,
                "a default QP comes up while its link is still reported down",
                |_, w| w.seen & SEEN_UP_UNREPORTED != 0,
            ),
            (SEEN_FAILOVER, "a failover completes", |_, w| {
                w.seen & SEEN_FAILOVER != 0
            }),
            (
                SEEN_SKIP,
                "sends already consumed by the peer are skipped",
                |_, w| w.seen & SEEN_SKIP != 0,
            ),
            (
                SEEN_SWITCH_BACK,
                "traffic switches back to the default path",
                |_, w| w.seen & SEEN_SWITCH_BACK != 0,
            ),
            (SEEN_BURN, "stale receive WQEs are burned", |_, w| {
                w.seen & SEEN_BURN != 0
            }),
            (
                SEEN_STALE_PACKET,
                "a packet of an old incarnation arrives",
                |_, w| w.seen & SEEN_STALE_PACKET != 0,
            ),
            (
                SEEN_ATOMIC_REFUSED,
                "an atomic in flight is refused, not retransmitted",
                |_, w| w.seen & SEEN_ATOMIC_REFUSED != 0,
            ),
            (
                SEEN_FENCE_IN_BATCH,
                "one poll batch retires the fence and a later signaled WQE",
                |_, w| w.seen & SEEN_FENCE_IN_BATCH != 0,
            ),
            (
                SEEN_READ_ON_BACKUP,
                "a READ executes on the backup path",
                |_, w| w.seen & SEEN_READ_ON_BACKUP != 0,
            ),
            (
                SEEN_BACKUP_REPAIRED,
                "a backup side lost while idle is repaired",
                |_, w| w.seen & SEEN_BACKUP_REPAIRED != 0,
            ),
            (
                SEEN_FAILOVER_AFTER_REPAIR,
                "a failover completes over a repaired backup pair",
                |_, w| w.seen & SEEN_FAILOVER_AFTER_REPAIR != 0,
            ),
            (
                SEEN_FAILBACK,
                "traffic fails back to the default pair when the backup dies under it",
                |_, w| w.seen & SEEN_FAILBACK != 0,
            ),
            (
                SEEN_DEFAULT_CONTROL_REPAIRED,
                "the default devices' channel is repaired over the backup devices' one",
                |_, w| w.seen & SEEN_DEFAULT_CONTROL_REPAIRED != 0,
            ),
            (
                SEEN_BACKUP_REPAIRED_AFTER_CHANNEL,
                "a backup side is repaired over a repaired default devices' channel",
                |_, w| w.seen & SEEN_BACKUP_REPAIRED_AFTER_CHANNEL != 0,
            ),
            (
                SEEN_FAILBACK_OVER_MANAGEMENT,
                FAILBACK_OVER_MANAGEMENT,
                |_, w| w.seen & SEEN_FAILBACK_OVER_MANAGEMENT != 0,
            ),
            (
                SEEN_CHANNEL_REPAIRED_OVER_MANAGEMENT,
                "the default devices' channel is repaired over the management network",
                |_, w| w.seen & SEEN_CHANNEL_REPAIRED_OVER_MANAGEMENT != 0,
            ),
            (
                SEEN_FAILBACK_REFUSED,
                "a failback's bring-up is refused",
                |_, w| w.seen & SEEN_FAILBACK_REFUSED != 0,
            ),
            (
                SEEN_RECV_DURING_FAILBACK,
                "a failback after a round's receive copy moves a receive posted meanwhile",
                |_, w| w.seen & SEEN_RECV_DURING_FAILBACK != 0,
            ),
            (
                SEEN_EPOCH_4,
                "a default QP comes up in epoch 4 or later, after refused attempts",
                |_, w| w.seen & SEEN_EPOCH_4 != 0,
            ),
            (
                SEEN_QUIET_AFTER_FAILOVER,
                "the system goes quiet after a failover with everything done",
                |m, w| {
                    w.seen & SEEN_FAILOVER != 0
                        && m.quiet_and_done(w)
                        && [A, B]
                            .iter()
                            .all(|&h| w.hosts[h].resolved == w.hosts[h].posted)
                },
            ),
        ];
        for (bit, name, condition) in coverage {
            if self.scenario.coverage & bit != 0 {
                properties.push(Property::sometimes(name, condition));
            }
        }
        properties
    }
}

impl FailoverModel {
    /// All posted, and nothing but faults could still happen (no delivery, timeout, due timer
    /// or deadline left to wait for).
    fn quiet_and_done(&self, world: &World) -> bool {
        let all_posted = [A, B].iter().all(|&h| {
            usize::from(world.hosts[h].posted) == self.program(h).len()
                && world.hosts[h].progress.recvs_posted == u64::from(self.scenario.recvs[h])
        });
        if !all_posted {
            return false;
        }
        let mut steps = Vec::new();
        self.actions(world, &mut steps);
        let busy = steps.iter().any(|s| {
            matches!(
                s,
                Step::DeliverRequest { .. }
                    | Step::DeliverAck { .. }
                    | Step::Timeout { .. }
                    | Step::DeliverControl { .. }
                    | Step::DeliverDefaultControl { .. }
                    | Step::DeliverManagement { .. }
                    | Step::ControlTimeout { .. }
                    | Step::Tick { .. }
                    | Step::Drained { .. }
                    | Step::Wait
            )
        });
        // A deadline left but no quiet-time timeout in the budget, or a timer due but no
        // tick in the budget: the bounds cut the run. (A due timer hides the later deadlines
        // behind it: `poll_timeout` is the earliest. Seen since a handshake waits the outage
        // tolerance: a repair attempt timed out at the 2 s quiet-time wait and is due again
        // at once, while the switch-back that would fail the connection waits until 4.29 s.)
        let cut = [A, B].iter().any(|&h| {
            world.hosts[h].machine.poll_timeout().is_some_and(|t| {
                if t.as_nanos() > world.now {
                    world.budget.waits == 0
                } else {
                    world.budget.ticks == 0
                }
            })
        });
        !busy && !cut
    }
}

// ---- Running the checks ----------------------------------------------------------------------

fn check(
    scenario: Scenario,
    policy: Policy,
    finish: HasDiscoveries,
) -> impl Checker<FailoverModel> {
    println!("{scenario}; policy {policy:?}");
    let started = Instant::now();
    let checker = FailoverModel { scenario, policy }
        .checker()
        .threads(2)
        .finish_when(finish)
        .spawn_bfs()
        .join();
    println!(
        "  {} states ({} unique), depth {}, {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    checker
}

/// Checks every property of `scenario` under SHIFT exhaustively.
fn verify(scenario: Scenario) {
    check(scenario, Policy::Shift, HasDiscoveries::AnyFailures).assert_properties();
}

/// Runs `scenario` under a broken `policy` until `property` fails; panics if it never does.
fn refute(scenario: Scenario, policy: Policy, property: &'static str) {
    let checker = check(scenario, policy, HasDiscoveries::AnyOf([property].into()));
    let path = checker.discovery(property);
    assert!(
        path.is_some(),
        "{policy:?} must violate \"{property}\", and the checker found no counterexample"
    );
    let steps = path.unwrap().into_actions();
    println!(
        "  counterexample to \"{property}\" in {} steps: {steps:?}",
        steps.len()
    );
}

const fn budget(
    default_failures: u8,
    default_repairs: u8,
    backup_failures: u8,
    losses: u8,
    ticks: u8,
) -> Budget {
    Budget {
        default_failures,
        default_repairs,
        backup_failures,
        backup_qp_failures: 0,
        default_qp_failures: 0,
        losses,
        ticks,
        waits: 1,
        backup_qps_fail_with_the_default_live: false,
        rtr_refusals: 0,
        management: false,
        default_qps_fail_out_of_rts: false,
        stale_link_reports: false,
    }
}

const PRODUCER_CONSUMER: &str = "data is never rewritten once its notification was observed";
const OWN_RECEIVE: &str = "every send lands in its own receive WQE, once";
const ATOMIC_ONCE: &str = "no atomic executes twice";
const READ_AFTER_EARLIER: &str = "a READ sees every request posted before it";
const READ_UNCHANGED: &str =
    "a READ completing with success never returns data a later request changed";
const OWN_COMPLETIONS: &str = "the application sees completions of its own WRs only";
const NOT_DUPLICATED: &str = "application completions are neither duplicated nor reordered";
const QUIET_DONE: &str = "when the system is quiet, everything posted has completed or failed";
const FAILBACK_OVER_MANAGEMENT: &str =
    "a failback finishes over the management network with both control channels lost";

/// NCCL-Simple traffic one way, the sender leading the rearm: failover, rearm, switch-back,
/// a second failure after (or during) the switch-back.
fn nccl_one_way() -> Scenario {
    Scenario {
        name: "NCCL-Simple writes A -> B",
        programs: [NCCL, NOTHING],
        recvs: [0, 2],
        recvs_up_front: true,
        roles: [Role::Leader, Role::Follower],
        budget: budget(2, 1, 0, 1, 2),
        coverage: SEEN_FAILOVER
            | SEEN_SKIP
            | SEEN_SWITCH_BACK
            | SEEN_BURN
            | SEEN_STALE_PACKET
            | SEEN_FENCE_IN_BATCH
            | SEEN_QUIET_AFTER_FAILOVER,
    }
}

/// The same traffic with the passive receiver leading the rearm (H4).
fn nccl_receiver_leads() -> Scenario {
    Scenario {
        name: "NCCL-Simple writes A -> B, B leads",
        roles: [Role::Follower, Role::Leader],
        budget: budget(2, 1, 0, 0, 1),
        coverage: SEEN_FAILOVER | SEEN_SWITCH_BACK | SEEN_BURN | SEEN_QUIET_AFTER_FAILOVER,
        ..nccl_one_way()
    }
}

/// The same traffic with a flapping default path and no packet loss: enough to reach a
/// second failure after a switch-back, cheap enough to search for deep counterexamples.
fn nccl_flapping() -> Scenario {
    Scenario {
        name: "NCCL-Simple writes A -> B, flapping default path",
        budget: budget(2, 1, 0, 0, 1),
        coverage: SEEN_FAILOVER | SEEN_SWITCH_BACK | SEEN_BURN | SEEN_STALE_PACKET,
        ..nccl_one_way()
    }
}

/// The flapping default path with link reports that are hints (issue 29 item 1): rearms go
/// on while a link is reported down, and the path may come back unreported. A rearm must find
/// such a path, and every property holds for attempts on a dead one.
fn nccl_flapping_stale_reports() -> Scenario {
    Scenario {
        name: "NCCL-Simple writes A -> B, flapping default path, stale link reports",
        budget: Budget {
            stale_link_reports: true,
            ..budget(2, 1, 0, 0, 1)
        },
        coverage: SEEN_FAILOVER | SEEN_SWITCH_BACK | SEEN_UP_UNREPORTED,
        ..nccl_one_way()
    }
}

/// SENDs in both directions: crossing handshakes, both receive queues moving.
fn sends_both_ways() -> Scenario {
    Scenario {
        name: "SENDs both ways",
        programs: [TWO_SENDS, ONE_SEND],
        recvs: [1, 2],
        recvs_up_front: false,
        roles: [Role::Leader, Role::Follower],
        budget: budget(1, 1, 0, 1, 2),
        coverage: SEEN_FAILOVER | SEEN_SKIP | SEEN_SWITCH_BACK | SEEN_QUIET_AFTER_FAILOVER,
    }
}

/// An atomic behind a WRITE: refused when in flight at a failure, never executed twice.
fn atomic() -> Scenario {
    Scenario {
        name: "WRITE then FETCH_ADD A -> B",
        programs: [WRITE_THEN_ATOMIC, NOTHING],
        recvs: [0, 0],
        recvs_up_front: true,
        roles: [Role::Leader, Role::Follower],
        budget: budget(1, 1, 0, 1, 1),
        coverage: SEEN_FAILOVER | SEEN_ATOMIC_REFUSED,
    }
}

/// A WRITE, a READ of it and a SEND fenced behind the READ: READs in flight go again on the
/// backup in their place, never ahead of what was posted before them, and never after what
/// was posted after them executed.
fn reads() -> Scenario {
    Scenario {
        name: "WRITE, READ, fenced SEND A -> B",
        programs: [WRITE_READ_SEND, NOTHING],
        recvs: [0, 1],
        recvs_up_front: true,
        roles: [Role::Leader, Role::Follower],
        budget: budget(1, 1, 0, 1, 2),
        coverage: SEEN_FAILOVER
            | SEEN_READ_ON_BACKUP
            | SEEN_SWITCH_BACK
            | SEEN_QUIET_AFTER_FAILOVER,
    }
}

/// Rearm attempts refused while the follower's link is down advance the epoch too: the
/// default pair comes up in epoch 4 or later. Before refused attempts stayed in one PSN
/// quarter, it came up where epoch 0's PSNs started.
fn psn_wrap() -> Scenario {
    Scenario {
        name: "one notification A -> B, the epoch passing 4",
        programs: [ONE_WRITE_IMM, NOTHING],
        recvs: [0, 1],
        recvs_up_front: true,
        roles: [Role::Leader, Role::Follower],
        budget: Budget {
            waits: 1,
            ..budget(2, 2, 0, 0, 7)
        },
        coverage: SEEN_FAILOVER | SEEN_EPOCH_4 | SEEN_QUIET_AFTER_FAILOVER,
    }
}

/// A backup device fails its QPs at any point (idle, carrying traffic, during a switch-back):
/// lost while idle, the backup side is repaired over the default devices' channel and the
/// next default failure fails over; lost under traffic, the traffic fails back to the
/// default pair (5e) when its path is up, otherwise the connection fails. Nothing may hang.
fn backup_qps_fail() -> Scenario {
    Scenario {
        name: "one notification A -> B, a backup device fails its QPs",
        programs: [ONE_WRITE_IMM, NOTHING],
        recvs: [0, 1],
        recvs_up_front: true,
        roles: [Role::Leader, Role::Follower],
        budget: Budget {
            backup_qp_failures: 1,
            ..budget(1, 1, 0, 0, 3)
        },
        coverage: SEEN_FAILOVER | SEEN_BACKUP_REPAIRED | SEEN_FAILOVER_AFTER_REPAIR | SEEN_FAILBACK,
    }
}

/// A backup device fails its QPs while idle and the default path fails for good, at any
/// point, with the management network (5c, "whichever path answers first"): the backup
/// side's repair goes over the management network, and a failover round that began before
/// it waits for it and completes over the repaired backup pair. Without the management
/// network that round was a failback waiting for a default path that never comes back.
fn backup_lost_then_default_fails() -> Scenario {
    Scenario {
        name:
            "one notification A -> B, a backup device fails its QPs, then the default path for good",
        budget: Budget {
            management: true,
            backup_qp_failures: 1,
            ..budget(1, 0, 0, 0, 3)
        },
        coverage: SEEN_FAILOVER | SEEN_FAILOVER_AFTER_REPAIR_IN_ROUND,
        ..backup_qps_fail()
    }
}

/// A default device fails its QPs (the default data QP and the default devices' control QP)
/// at any point: the traffic fails over, the default pair is re-armed, and the channel is
/// repaired over the backup devices' channel; then the backup device fails its QPs and is
/// repaired over the repaired channel. Nothing may hang.
fn default_qps_fail() -> Scenario {
    Scenario {
        name: "one notification A -> B, the default then the backup device fails its QPs",
        programs: [ONE_WRITE_IMM, NOTHING],
        recvs: [0, 1],
        recvs_up_front: true,
        roles: [Role::Leader, Role::Follower],
        budget: Budget {
            default_qp_failures: 1,
            backup_qp_failures: 1,
            ..budget(0, 0, 0, 0, 4)
        },
        coverage: SEEN_FAILOVER
            | SEEN_DEFAULT_CONTROL_REPAIRED
            | SEEN_BACKUP_REPAIRED_AFTER_CHANNEL,
    }
}

/// Both control channels lost (5f): one notification A -> B; a default device fails its QPs
/// (a failover, and the default devices' channel with it) and a backup device fails its QPs,
/// at any point, on either host: with traffic on the backup that is a failback with no
/// control channel left, whose messages go over the management network, and after it the
/// default devices' channel is repaired there. The bounds of
/// `shift_repairs_the_default_devices_channel_after_the_default_device_failed_its_qps`, with
/// the management network.
fn both_channels_lost() -> Scenario {
    Scenario {
        name: "one notification A -> B, the default then the backup device fails its QPs",
        budget: Budget {
            management: true,
            ticks: 2,
            ..default_qps_fail().budget
        },
        coverage: SEEN_FAILOVER
            | SEEN_FAILBACK_OVER_MANAGEMENT
            | SEEN_CHANNEL_REPAIRED_OVER_MANAGEMENT,
        ..default_qps_fail()
    }
}

/// The backup path fails too, at any point: nothing may hang; under traffic with the default
/// path back, the traffic fails back to it (5e). One notification rather than the NCCL
/// program: the failback's interleavings made that one four times larger (25.6 million
/// states, 104 s).
fn backup_fails_too() -> Scenario {
    Scenario {
        name: "one notification A -> B, backup path fails too",
        programs: [ONE_WRITE_IMM, NOTHING],
        recvs: [0, 1],
        budget: budget(1, 1, 1, 0, 1),
        coverage: SEEN_FAILOVER | SEEN_SWITCH_BACK | SEEN_FAILBACK,
        ..nccl_one_way()
    }
}

/// One SEND A -> B, B's one receive posted at any moment; the default path fails and comes
/// back once and a backup device fails its QPs once: a failback can replace B's failover
/// round after it copied its (empty) default RQ to the backup, with B's receive posted
/// meanwhile on the default RQ (unpublished). It must be moved to the default QP brought up,
/// and the SEND land in it.
fn recv_during_failback() -> Scenario {
    Scenario {
        name: "one SEND A -> B, B's receive posted during a failback",
        programs: [ONE_SEND, NOTHING],
        recvs: [0, 1],
        recvs_up_front: false,
        roles: [Role::Leader, Role::Follower],
        budget: Budget {
            backup_qp_failures: 1,
            ..budget(1, 1, 0, 0, 2)
        },
        coverage: SEEN_FAILOVER | SEEN_FAILBACK | SEEN_RECV_DURING_FAILBACK,
    }
}

/// Two SENDs A -> B, B's receives up front, over a failover; a backup device fails its QPs
/// (a failback) and a default device may refuse RTR: a failback whose bring-up fails fails
/// the connection, and every WR outstanding then completes once, in error.
fn failback_refused() -> Scenario {
    Scenario {
        name: "two SENDs A -> B, a failback whose bring-up is refused",
        programs: [TWO_SENDS, NOTHING],
        recvs: [0, 2],
        recvs_up_front: true,
        roles: [Role::Leader, Role::Follower],
        budget: Budget {
            backup_qp_failures: 1,
            rtr_refusals: 1,
            ..budget(1, 1, 0, 0, 2)
        },
        coverage: SEEN_FAILOVER | SEEN_FAILBACK_REFUSED,
    }
}

/// One notification A -> B through a failover and the switch-back; B's backup device fails
/// its QPs once the default pair is live again at both ends, at any point of the
/// switch-back: after B moved its receives back and posted `SwitchBackReady` on the backup
/// channel, that message is lost with the channel, B needs nothing of the backup, and A
/// waits for it in WaitDrained. The traffic has a path throughout: the connection must not
/// fail (before the fix, A's switch-back ended with `handshake-timeout`).
fn switch_back_ready_lost() -> Scenario {
    Scenario {
        name: "one notification A -> B, B's backup device fails its QPs with the default live",
        programs: [ONE_WRITE_IMM, NOTHING],
        recvs: [0, 1],
        recvs_up_front: true,
        roles: [Role::Leader, Role::Follower],
        budget: Budget {
            backup_qp_failures: 1,
            backup_qps_fail_with_the_default_live: true,
            ..budget(1, 1, 0, 0, 4)
        },
        coverage: SEEN_FAILOVER | SEEN_FAILBACK,
    }
}

#[test]
fn shift_fails_back_when_a_switch_back_message_is_lost_with_the_backup() {
    verify(switch_back_ready_lost());
}

#[test]
fn shift_keeps_nccl_writes_in_order_through_failover_and_switch_back() {
    verify(nccl_one_way());
}

#[test]
fn shift_survives_a_flapping_default_path() {
    verify(nccl_flapping());
}

#[test]
fn shift_finds_a_default_path_back_while_its_link_is_still_reported_down() {
    verify(nccl_flapping_stale_reports());
}

#[test]
fn shift_holds_when_the_passive_receiver_leads_the_rearm() {
    verify(nccl_receiver_leads());
}

#[test]
fn shift_lands_every_send_in_its_own_receive_both_ways() {
    verify(sends_both_ways());
}

#[test]
fn shift_never_retransmits_an_atomic() {
    verify(atomic());
}

#[test]
fn shift_never_returns_changed_data_from_a_read() {
    verify(reads());
}

#[test]
fn shift_holds_when_the_pair_comes_up_after_refused_rearm_attempts() {
    verify(psn_wrap());
}

#[test]
fn shift_reports_errors_and_never_hangs_when_both_paths_fail() {
    verify(backup_fails_too());
}

#[test]
fn shift_repairs_a_backup_whose_qps_failed_while_idle_and_fails_over_through_it() {
    verify(backup_qps_fail());
}

#[test]
fn shift_repairs_a_lost_backup_over_the_management_network_and_fails_over_while_the_default_is_down(
) {
    verify(backup_lost_then_default_fails());
}

#[test]
fn shift_repairs_the_default_devices_channel_after_the_default_device_failed_its_qps() {
    verify(default_qps_fail());
}

#[test]
fn shift_fails_back_and_repairs_over_the_management_network_when_both_channels_are_lost() {
    verify(both_channels_lost());
}

/// The same scenario with no management network: no failback finishes once both control
/// channels are lost (the machine before 5f ended the connection; without the third channel
/// it still must).
#[test]
fn without_the_management_network_no_failback_finishes_with_both_channels_lost() {
    let scenario = both_channels_lost();
    let checker = check(
        Scenario {
            budget: Budget {
                management: false,
                ..scenario.budget
            },
            ..scenario
        },
        Policy::Shift,
        HasDiscoveries::AnyOf([FAILBACK_OVER_MANAGEMENT].into()),
    );
    assert!(checker.discovery(FAILBACK_OVER_MANAGEMENT).is_none());
}

#[test]
fn shift_moves_receives_posted_during_a_failback() {
    verify(recv_during_failback());
}

#[test]
fn a_failback_that_drops_receives_posted_after_the_copy_loses_a_send() {
    refute(
        Scenario {
            coverage: 0,
            ..recv_during_failback()
        },
        Policy::FailbackDropsRecvsAfterCopy,
        QUIET_DONE,
    );
}

#[test]
fn shift_completes_each_wr_once_when_a_failbacks_bring_up_fails() {
    verify(failback_refused());
}

#[test]
fn a_failback_that_resets_the_ring_before_its_bring_up_flushes_sends_twice() {
    refute(
        Scenario {
            coverage: 0,
            ..failback_refused()
        },
        Policy::FailbackResetsBeforeBringUp,
        NOT_DUPLICATED,
    );
}

#[test]
fn naive_retransmission_rewrites_data_after_its_notification() {
    refute(
        nccl_one_way(),
        Policy::RetransmitEverything,
        PRODUCER_CONSUMER,
    );
}

#[test]
fn naive_retransmission_lands_a_send_in_the_wrong_receive() {
    refute(sends_both_ways(), Policy::RetransmitEverything, OWN_RECEIVE);
}

#[test]
fn naive_retransmission_executes_an_atomic_twice() {
    refute(atomic(), Policy::RetransmitEverything, ATOMIC_ONCE);
}

#[test]
fn without_epoch_psns_an_old_packet_executes_in_a_new_incarnation() {
    refute(
        nccl_flapping(),
        Policy::SamePsnEveryEpoch,
        PRODUCER_CONSUMER,
    );
}

#[test]
fn ignoring_stale_receive_wqes_lands_a_send_in_one() {
    refute(nccl_flapping(), Policy::IgnoreStaleRecvs, OWN_RECEIVE);
}

#[test]
fn reads_sent_again_first_miss_the_writes_before_them() {
    refute(reads(), Policy::ReadsFirst, READ_AFTER_EARLIER);
}

#[test]
fn a_fence_recognised_only_last_in_its_batch_reaches_the_application() {
    refute(
        nccl_one_way(),
        Policy::FenceOnlyLastInBatch,
        OWN_COMPLETIONS,
    );
}

#[test]
fn without_the_fence_flag_plain_rc_returns_changed_data_from_a_read() {
    // No path failure at all: one lost READ response, and go-back-N executes the READ again
    // after the SEND behind it. This is why the READ rule (docs/failover.md 3.6) is stated
    // for fenced programs.
    let scenario = Scenario {
        name: "WRITE, READ, unfenced SEND A -> B, no failures",
        programs: [WRITE_READ_SEND_UNFENCED, NOTHING],
        budget: budget(0, 0, 0, 1, 0),
        coverage: 0,
        ..reads()
    };
    refute(scenario, Policy::Shift, READ_UNCHANGED);
}

#[test]
fn refused_rearm_attempts_never_wrap_the_psns_even_for_packets_that_live_for_ever() {
    // Refused attempts send nothing and stay in one PSN quarter: a request of epoch 0 held
    // in a switch for ever is never taken for one of the epoch the pair comes up in. When
    // the epoch advanced by one per attempt, this found the request executing in epoch 4
    // (20 steps).
    check(
        psn_wrap(),
        Policy::UnboundedPacketLifetime,
        HasDiscoveries::AnyFailures,
    )
    .assert_properties();
}

/// Larger bounds than CI runs, for the figures in docs/failover.md 8.2: set
/// `RAILSHIFT_MODEL_LARGE=1` (minutes, several GiB).
#[test]
fn larger_bounds_when_asked() {
    if std::env::var_os("RAILSHIFT_MODEL_LARGE").is_none() {
        println!("RAILSHIFT_MODEL_LARGE not set: larger bounds skipped");
        return;
    }
    verify(Scenario {
        name: "WRITE, READ, fenced SEND A -> B, two default failures",
        budget: budget(2, 1, 0, 1, 2),
        ..reads()
    });
    verify(Scenario {
        name: "SENDs both ways, two default failures",
        budget: budget(2, 1, 0, 1, 2),
        ..sends_both_ways()
    });
    verify(Scenario {
        name: "one notification A -> B, the epoch passing 4, a loss",
        budget: Budget {
            losses: 1,
            ..psn_wrap().budget
        },
        ..psn_wrap()
    });
}
