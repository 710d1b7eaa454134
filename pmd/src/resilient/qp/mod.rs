//! The resilient QP: a default QP whose work moves to a backup QP on another device when the
//! default path fails, and back when it recovers (SHIFT). Applications post and poll through
//! it as through a plain [`Qp`]: the same [`SendWr`], [`RecvWr`] and [`WorkCompletion`].
//!
//! The hot half is the default QP, its CQ, two counters and two flags. While both queues run
//! on the default QP and nothing is pending, a post is the default QP's post plus one
//! predictable branch (and an add for a two-sided send); a poll is the default CQ's poll plus
//! one relaxed load of the mailbox flag and one compare of the poller's error mark (set on
//! the poller's cold error path: where the queues stood before the first error completion).
//! Receives are not counted per completion: the default receive queue's consumer counter is
//! read when an event needs the count. The failover
//! machine is consulted only on events: an error completion, mail from the service lcore (a
//! control message, a link change), a timer. Everything else lives behind `slow`.

mod adopted;
mod book;
mod driver;
mod failback;
mod log;
mod perform;
mod plan;
mod work;

pub use adopted::AdoptedQp;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use crossbeam_utils::sync::Unparker;

use crate::control::{Context, Cq, Qp, SavedAttrs};
use crate::datapath::sq::raw::OutstandingWqe;
use crate::datapath::sq::FastRequest;
use crate::datapath::wr::{
    BatchPostError, Payload, PostError, RecvWr, SendOp, SendWr, SgList, Sge, WcOpcode, WcStatus,
    WorkCompletion,
};
use crate::failover::{Event, FailReason, Failover, Route, SendPhase, Timestamp};
use crate::qp_state::QpState;
use crate::verbs::QpCaps;

use self::log::FailoverLog;
use super::backup_cq::BackupSeat;
use super::channel::ControlChannel;
use super::clock::Clock;
use super::config::ResilientConfig;
use super::rendezvous::{PeerAttrs, RendezvousError};
use super::service::mailbox::{BackupParts, Mail, QpShared};
use super::service::shadow::{CtxInner, QpShadow};
use super::stats::{FailoverEvent, FailoverStats};
use book::Book;

/// Where a resilient QP is, as the apps' JSON timeline names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResilientState {
    /// Not (yet) protected: the backup side is not set up (or failover is off). Work runs on
    /// the default QP and fails as on a plain QP.
    Unprotected,
    /// Everything on the default QP, backup ready.
    Default,
    /// A failover round is running.
    FailingOver,
    /// Sends on the backup QP.
    Fallback,
    /// The default path is back; waiting for the fence.
    WaitSignaled,
    /// The fence is on the backup QP; later sends wait on the default QP.
    WaitDrained,
    /// The backup failed with traffic on it; the traffic is moving to the default QP.
    FailingBack,
    /// The connection failed.
    Failed,
}

/// Why a resilient QP's backup side could not be connected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectError {
    /// Failover is off, or the context has no backup device.
    #[error("this resilient QP has no backup side (failover off, or no backup device)")]
    NoBackup,
    /// The backup side could not be set up.
    #[error("the backup side could not be set up: {0}")]
    Setup(String),
    /// The peer's attributes did not parse.
    #[error(transparent)]
    Rendezvous(#[from] RendezvousError),
    /// The wait ran out.
    #[error("the backup side was not ready after {0:?} (is the service lcore running?)")]
    Timeout(std::time::Duration),
}

/// Completions polled per batch in the slow path.
const BATCH: usize = 32;

/// The backup side, once protected.
struct Backup {
    qp: Qp,
    /// Its seat in a shared backup CQ (`resilient::backup_cq`).
    cq: BackupSeat,
    control: Arc<ControlChannel>,
    /// The control channel on the default devices (repairs a lost backup side).
    default_control: Arc<ControlChannel>,
    peer: PeerAttrs,
    /// The peer's backup rkey of each of its default rkeys: from its rendezvous, and from the
    /// store as lookups find them.
    peer_rkeys: HashMap<u32, u32>,
    /// With a store: the default rkeys whose mapping the store confirmed since the last
    /// failover round began (a round's retransmissions use only confirmed mappings).
    rkeys_confirmed: HashSet<u32>,
    /// The application's bring-up attributes of the default QP (PSN bases of every epoch).
    base: SavedAttrs,
    /// The management channel to the peer (`docs/failover.md` 5f), when both ends have an
    /// endpoint.
    management: Option<Arc<crate::resilient::management::ManagementLink>>,
}

/// Where a resilient QP lives: fixed when it is created.
struct Env {
    clock: Clock,
    config: ResilientConfig,
    ctx: Option<Arc<CtxInner>>,
    default_ctx: Arc<Context>,
    shadow: Option<Arc<QpShadow>>,
    default_qpn: u32,
}

/// Buffers the slow path reuses, so that it allocates only while they grow.
struct Scratch {
    /// One batch of completions polled from a CQ.
    polled: [WorkCompletion; BATCH],
    /// One WQE's bytes.
    wqe_bytes: Vec<u8>,
    /// Send WQEs read from a ring.
    wqe_list: Vec<OutstandingWqe>,
    /// Receives `(counter, wr_id)` read from a ring.
    recv_list: Vec<(u32, u64)>,
    /// Mail taken from the service lcore.
    mail: VecDeque<Mail>,
}

/// Everything off the hot path, in named parts.
struct Slow {
    /// Where the QP lives.
    env: Env,
    /// The failover machine, once the QP is protected.
    machine: Option<Failover>,
    /// The backup side, once protected.
    backup: Option<Backup>,
    /// Why the connection failed, once it has.
    failed: Option<FailReason>,
    /// Why the backup side could not be set up, if it could not.
    setup_error: Option<String>,
    /// The event loop's queue: events for the machine, oldest first.
    events: VecDeque<Event>,
    /// Events that came before protection, replayed after it.
    early: Vec<Event>,
    /// A backup side handed over after a revoke, moved to ERR by it: kept (not installed)
    /// until this QP is destroyed, as the rest of a revoked lease is.
    revoked_backup: Option<Box<BackupParts>>,
    /// Completions for the application, returned before anything polled later.
    wcs: VecDeque<WorkCompletion>,
    /// Where unfinished work and the failover's own WQEs stand in the rings.
    book: Book,
    /// Counters, the event log and the round in progress.
    log: FailoverLog,
    /// Buffers reused by the slow path.
    scratch: Scratch,
}

/// A resilient RC queue pair. See the module documentation; created by
/// [`crate::resilient::ResilientPd::create_qp`].
///
/// Completions of both QPs come out of [`ResilientQp::poll`] in the order the application
/// depends on (successes drained before a failover first, then the backup QP's, then the
/// default QP's again after a switch-back), all naming the default QP's number. The
/// failover's own WQEs (probes, fences, zero-length SENDs that burn stale receives, control
/// messages) never reach the application.
#[repr(C)] // the hot fields first, in declaration order
pub struct ResilientQp {
    // ---- hot: the default path ----
    fast_send: bool,
    fast_recv: bool,
    fast_poll: bool,
    /// Two-sided application sends posted (SEND, SEND_IMM, WRITE_IMM).
    sends_posted: u64,
    /// Application receives posted.
    recvs_posted: u64,
    default: Qp,
    default_cq: Cq,
    shared: Arc<QpShared>,
    // ---- everything else ----
    slow: Box<Slow>,
}

impl std::fmt::Debug for ResilientQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResilientQp")
            .field("qp", &self.shared.name)
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

#[inline(always)]
fn two_sided(op: &SendOp) -> bool {
    matches!(
        op,
        SendOp::WriteImm { .. } | SendOp::Send | SendOp::SendImm { .. }
    )
}

impl ResilientQp {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        mut default: Qp,
        default_cq: Cq,
        shared: Arc<QpShared>,
        shadow: Option<Arc<QpShadow>>,
        ctx: Option<Arc<CtxInner>>,
        clock: Clock,
        config: ResilientConfig,
    ) -> ResilientQp {
        let default_ctx = default.pd().context().clone();
        let log = FailoverLog::new(
            clock.clone(),
            default_ctx.name().to_string(),
            shared.name.clone(),
        );
        let slow = Box::new(Slow {
            env: Env {
                clock,
                config,
                ctx,
                default_ctx,
                shadow,
                default_qpn: default.qpn(),
            },
            machine: None,
            backup: None,
            failed: None,
            setup_error: None,
            events: VecDeque::new(),
            early: Vec::new(),
            revoked_backup: None,
            wcs: VecDeque::new(),
            book: Book::default(),
            log,
            scratch: Scratch {
                polled: [WorkCompletion::EMPTY; BATCH],
                wqe_bytes: Vec::new(),
                wqe_list: Vec::new(),
                recv_list: Vec::new(),
                mail: VecDeque::new(),
            },
        });
        // The link watch may move this QP to ERR before the owner hears of it: its posts are
        // then taken, not refused (docs/failover.md §9.5).
        default.send_queue().take_work_in_error();
        ResilientQp {
            fast_send: true,
            fast_recv: true,
            fast_poll: true,
            sends_posted: 0,
            recvs_posted: 0,
            default,
            default_cq,
            shared,
            slow,
        }
    }

    // ---- the datapath ------------------------------------------------------------------

    /// Validates `wr` and writes its WQE on the QP its route names (the default QP while
    /// nothing has failed). Nothing reaches a device until [`ResilientQp::ring_doorbell`].
    #[inline(always)]
    pub fn post_send(&mut self, wr: &SendWr<'_>) -> Result<(), PostError> {
        // The default QP's own fast path, which counts two-sided sends where it knows the
        // opcode anyway: while posts must go elsewhere (`fast_send` false) its gate is held
        // (`refresh_fast`), so this needs no branch of its own. Everything else, errors
        // included, takes the route.
        if self
            .default
            .send_queue()
            .post_fast_counting(wr, &mut self.sends_posted)
            .is_some()
        {
            return Ok(());
        }
        self.post_send_slow(wr)
    }

    /// [`ResilientQp::post_send`]'s fast path alone, for a one-entry WRITE, WRITE with
    /// immediate, SEND or SEND with immediate given by its parts (the verbs shim, which holds
    /// an `ibv_send_wr`): the default QP's own fast path writes it and the two-sided ones are
    /// counted, exactly as `post_send` records them for a failover. `None` (nothing written:
    /// the route is not the default, or the request needs the general checks) sends the
    /// caller to `post_send` with the whole request.
    #[inline(always)]
    pub fn post_send_fast_parts(
        &mut self,
        wr: &impl FastRequest,
        op: SendOp,
        sge: &Sge,
    ) -> Option<u16> {
        self.default
            .send_queue()
            .post_fast_parts_counting(wr, op, sge, &mut self.sends_posted)
    }

    /// Posts `wrs` in order as one batch: runs of one-entry RDMA WRITEs on the default QP's
    /// burst path (held, like its single-post fast path, while posts must go elsewhere), the
    /// rest through [`ResilientQp::post_send`]. Stops at the first refused work request.
    #[inline(always)]
    pub fn post_send_batch(&mut self, wrs: &[SendWr<'_>]) -> Result<(), BatchPostError> {
        crate::datapath::sq::post_in_order(self, wrs)
    }

    /// Publishes every WQE posted so far whose doorbell is not withheld by the failover.
    #[inline(always)]
    pub fn ring_doorbell(&mut self) {
        if self.fast_send {
            self.default.ring_doorbell();
            return;
        }
        self.ring_slow();
    }

    /// Writes and publishes a receive on the QP its route names.
    #[inline(always)]
    pub fn post_recv(&mut self, wr: &RecvWr) -> Result<(), PostError> {
        if self.fast_recv {
            self.default.post_recv(wr)?;
            self.recvs_posted += 1;
            return Ok(());
        }
        self.post_recv_slow(wr)
    }

    /// Polls up to `wcs.len()` completions of both QPs into `wcs`; returns how many. Also
    /// runs whatever failover work is due (mail, timers, a drain in progress).
    #[inline(always)]
    pub fn poll(&mut self, wcs: &mut [WorkCompletion]) -> usize {
        if self.fast_poll && !self.shared.pending() {
            let n = self.default_cq.poll(wcs);
            if !self.default_cq.poller().error_marked() {
                return n;
            }
            return self.poll_after_error(wcs, n);
        }
        self.poll_slow(wcs)
    }

    /// Polls; when nothing came and a device progresses manually, runs one round of the
    /// devices (default, and backup too unless everything runs on the default path) and
    /// polls again: how a polling lcore drives manual-progress softnic devices.
    pub fn poll_with_progress(&mut self, wcs: &mut [WorkCompletion]) -> usize {
        let n = self.poll(wcs);
        if n > 0 {
            return n;
        }
        let mut moved = self.slow.env.default_ctx.progress();
        if let Some(b) = &self.slow.backup {
            moved |= b.qp.pd().context().progress();
        }
        if moved {
            self.poll(wcs)
        } else {
            0
        }
    }

    /// Runs whatever failover work is due without taking completions out (they wait for the
    /// next poll): for an application that does not poll for a while.
    pub fn progress(&mut self) {
        self.run();
        self.refresh_fast();
    }

    // ---- control ------------------------------------------------------------------------

    /// The default QP's number: what the peer connects to and every completion names.
    pub fn qpn(&self) -> u32 {
        self.slow.env.default_qpn
    }

    /// The default QP and its CQ themselves, bypassing the failover layer: for a benchmark
    /// that measures what the resilient layer costs by posting to and polling the same rings
    /// with and without it. Work posted here is invisible to failover; nothing else should
    /// use this.
    #[doc(hidden)]
    pub fn bypass(&mut self) -> (&mut Qp, &mut Cq) {
        (&mut self.default, &mut self.default_cq)
    }

    /// The capabilities the default device granted.
    pub fn caps(&self) -> QpCaps {
        self.default.caps()
    }

    /// The default device's context.
    pub fn context(&self) -> &Arc<Context> {
        &self.slow.env.default_ctx
    }

    /// Moves the default QP through the application's bring-up (RESET -> INIT -> RTR -> RTS),
    /// recording each transition for the backup QP's shadow bring-up on the service lcore.
    /// Once the QP is protected only RTS -> RTS is taken (failover owns the QPs' states).
    ///
    /// An INIT -> INIT or RTS -> RTS change (an access-flag cut) covers both paths: it
    /// applies at once to the default QP and to the backup QP (whichever of them is in that
    /// state; one a failover took out of RTS gets it when brought up again), and every
    /// later bring-up of either QP (a re-arm of the default QP, a repair of the backup
    /// side) uses the merged attributes, never the first ones. If the backup QP refuses the
    /// change it is moved to ERR (fail closed: it must not carry traffic with the access
    /// the application cut) and the error is returned.
    pub fn modify(
        &mut self,
        to: QpState,
        attr: &crate::verbs::QpAttr,
    ) -> Result<(), crate::control::ModifyError> {
        let from = self.default.state();
        if self.slow.machine.is_some() {
            if to != QpState::Rts {
                return Err(crate::control::ModifyError::Transition(
                    crate::qp_state::TransitionError::Illegal { from, to },
                ));
            }
            return self.change_protected(attr);
        }
        self.default.modify(to, attr)?;
        if let Some(shadow) = &self.slow.env.shadow {
            let recorded = shadow.record(from, to, attr);
            if let Some(ctx) = &self.slow.env.ctx {
                ctx.service.nudge();
            }
            recorded?;
        }
        Ok(())
    }

    /// RTS -> RTS on a protected QP: the default QP if it is in RTS, the recorded attributes
    /// of every later bring-up, the backup QP if it is in RTS.
    fn change_protected(
        &mut self,
        attr: &crate::verbs::QpAttr,
    ) -> Result<(), crate::control::ModifyError> {
        crate::qp_state::check_transition(QpState::Rts, QpState::Rts, attr.mask())?;
        if self.default.state() == QpState::Rts {
            self.default.modify(QpState::Rts, attr)?;
        }
        let Some(b) = self.slow.backup.as_mut() else {
            return Ok(());
        };
        b.base.record(QpState::Rts, QpState::Rts, attr);
        if b.qp.state() != QpState::Rts {
            return Ok(());
        }
        if let Err(e) = b.qp.modify(QpState::Rts, attr) {
            tracing::error!(qp = %self.shared.name, error = %e, "failover: the backup QP refused the application's RTS -> RTS; moving it to ERR");
            if let Err(err) = b.qp.modify(QpState::Err, &crate::verbs::QpAttr::default()) {
                tracing::error!(qp = %self.shared.name, error = %err, "failover: backup QP not moved to ERR");
            }
            return Err(e);
        }
        Ok(())
    }

    /// Revokes the connection for good (the QP half of [`super::Leases::revoke`]): the
    /// default and the backup QP (and a backup QP still being brought up) move to ERR, the
    /// failover machine is dropped, so no failover, switch-back, re-arm or repair ever
    /// brings either QP back, and every outstanding work request completes with
    /// `WR_FLUSH_ERR` (later posts are refused). Returns each move to ERR a device refused,
    /// as (what, error); the connection is closed either way.
    pub fn revoke(&mut self) -> Vec<(&'static str, String)> {
        let mut refused = Vec::new();
        if let Some(shadow) = &self.slow.env.shadow {
            if let Err(e) = shadow.revoke() {
                refused.push(("backup QP (bring-up) to ERR", e.to_string()));
            }
        }
        let err = crate::verbs::QpAttr::default();
        if let Err(e) = self.default.handle().modify(QpState::Err, &err) {
            refused.push(("default QP to ERR", e.to_string()));
        }
        if let Some(b) = &mut self.slow.backup {
            if let Err(e) = b.qp.handle().modify(QpState::Err, &err) {
                refused.push(("backup QP to ERR", e.to_string()));
            }
        }
        // A backup side the service handed over but this owner has not taken yet: it is
        // connected to the peer's backup QP, in the backup PD, until the mail is read.
        let mut mail = std::mem::take(&mut self.slow.scratch.mail);
        self.shared.take(&mut mail);
        for m in mail.drain(..) {
            if let Mail::Protected(parts) = m {
                if let Err(e) = parts.qp.handle().modify(QpState::Err, &err) {
                    refused.push(("backup QP (handed over) to ERR", e.to_string()));
                }
                self.slow.revoked_backup = Some(parts);
            }
        }
        self.slow.scratch.mail = mail;
        if self.slow.failed.is_none() {
            let now = self.slow.env.clock.now();
            self.surface(WcStatus::WrFlushErr, FailReason::Revoked, now);
        }
        self.slow.machine = None;
        self.slow.events.clear();
        self.slow.early.clear();
        self.refresh_fast();
        refused
    }

    /// The backup device, once the QP is protected.
    pub(crate) fn backup_context(&self) -> Option<&Arc<Context>> {
        self.slow.backup.as_ref().map(|b| b.qp.pd().context())
    }

    /// The shadow of this QP's backup side, if it has one.
    fn shadow(&self) -> Result<&Arc<QpShadow>, ConnectError> {
        self.slow.env.shadow.as_ref().ok_or(ConnectError::NoBackup)
    }

    /// This end's backup attributes, for the application to send to the peer beside its own
    /// connection attributes (inline rendezvous), once the backup QP exists. `None` while the
    /// service lcore is still creating it. The application registers its MRs first: the
    /// bytes carry the backup rkeys of every MR of the PD with remote access registered so far.
    pub fn try_rendezvous_blob(&self) -> Result<Option<Vec<u8>>, ConnectError> {
        Ok(self
            .shadow()?
            .local_attrs()
            .map_err(ConnectError::Setup)?
            .map(|a| a.to_bytes()))
    }

    /// As [`ResilientQp::try_rendezvous_blob`], waiting up to `timeout` for the backup QP.
    pub fn rendezvous_blob(&self, timeout: std::time::Duration) -> Result<Vec<u8>, ConnectError> {
        let ctx = self.slow.env.ctx.as_ref().ok_or(ConnectError::NoBackup)?;
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(blob) = self.try_rendezvous_blob()? {
                return Ok(blob);
            }
            if std::time::Instant::now() >= deadline {
                return Err(ConnectError::Timeout(timeout));
            }
            ctx.service.nudge();
            ctx.service.pause_for_service_thread();
        }
    }

    /// Hands the peer's backup attributes (its [`ResilientQp::rendezvous_blob`]) to the
    /// shadow bring-up. Call before or after [`ResilientQp::modify`] to RTR: the backup QP is
    /// brought up when both are known.
    pub fn connect_backup(&mut self, peer_blob: &[u8]) -> Result<(), ConnectError> {
        self.shadow()?.set_peer(PeerAttrs::parse(peer_blob)?);
        if let Some(ctx) = &self.slow.env.ctx {
            ctx.service.nudge();
        }
        Ok(())
    }

    /// Whether the backup side is connected and failover armed.
    pub fn is_protected(&self) -> bool {
        self.slow.machine.is_some()
    }

    /// The peer's address on the management network, where this QP and its peer agree over
    /// it when both control channels are lost (`docs/failover.md` 5f): both ends published an
    /// endpoint. `None` before the QP is protected, or where either end has none.
    pub fn management_peer(&self) -> Option<std::net::SocketAddr> {
        let b = self.slow.backup.as_ref()?;
        b.management.as_ref()?;
        b.peer.management.as_ref().map(|m| m.addr)
    }

    /// Polls (taking mail) until the QP is protected or `timeout` passes; completions polled
    /// meanwhile wait for the next poll. Returns whether it is protected.
    pub fn wait_protected(&mut self, timeout: std::time::Duration) -> Result<(), ConnectError> {
        let deadline = std::time::Instant::now() + timeout;
        let Some(ctx) = self.slow.env.ctx.clone() else {
            return Err(ConnectError::NoBackup);
        };
        while self.slow.machine.is_none() {
            if let Some(e) = &self.slow.setup_error {
                return Err(ConnectError::Setup(e.clone()));
            }
            if std::time::Instant::now() >= deadline {
                return Err(ConnectError::Timeout(timeout));
            }
            ctx.service.nudge();
            self.progress();
            if self.slow.machine.is_none() {
                ctx.service.pause_for_service_thread();
            }
        }
        Ok(())
    }

    /// Where the QP is.
    pub fn state(&self) -> ResilientState {
        if self.slow.failed.is_some() {
            return ResilientState::Failed;
        }
        match &self.slow.machine {
            None => ResilientState::Unprotected,
            Some(m) => match m.send_phase() {
                SendPhase::Default => ResilientState::Default,
                SendPhase::FailingOver => ResilientState::FailingOver,
                SendPhase::Fallback => ResilientState::Fallback,
                SendPhase::WaitSignaled => ResilientState::WaitSignaled,
                SendPhase::WaitDrained => ResilientState::WaitDrained,
                SendPhase::FailingBack => ResilientState::FailingBack,
                SendPhase::Failed => ResilientState::Failed,
            },
        }
    }

    /// Why the connection failed, if it did.
    pub fn failure(&self) -> Option<FailReason> {
        self.slow.failed
    }

    /// The failover machine, for logs and tests.
    pub fn machine(&self) -> Option<&Failover> {
        self.slow.machine.as_ref()
    }

    /// Counters since the QP was created.
    pub fn stats(&self) -> FailoverStats {
        let mut stats = self.slow.log.stats;
        if let Some(b) = &self.slow.backup {
            stats.control_messages_dropped = b.control.dropped();
            if let Some(link) = &b.management {
                let drops = link.drops();
                stats.management_forged = drops.forged;
                stats.management_out_of_sequence = drops.out_of_sequence;
            }
        }
        stats
    }

    /// The event log: failovers, switch-backs, refusals, errors, oldest first.
    pub fn events(&self) -> &[FailoverEvent] {
        &self.slow.log.events
    }

    /// A poller to unpark when mail comes for this QP (the service lcore calls it), so an
    /// owner lcore that parks when idle takes failover work at once.
    pub fn set_waker(&self, unparker: Option<Unparker>) {
        self.shared.set_waker(unparker);
    }

    /// Whether mail (a control message, a link change) waits for this QP: one relaxed load.
    /// A loop over many QPs uses it to run their failover work ([`ResilientQp::progress`]) as
    /// soon as the service delivers it, instead of when its poll comes round.
    #[inline]
    pub fn has_mail(&self) -> bool {
        self.shared.pending()
    }

    /// When failover work is next due if nothing else happens (a timer of the machine).
    pub fn next_deadline(&self) -> Option<Timestamp> {
        self.shared.deadline()
    }

    /// Completions waiting to be polled: buffered ones plus CQEs the default device has written
    /// and nobody polled yet. Consumes nothing (for a benchmark that keeps the device's work
    /// out of a timed poll).
    pub fn completions_waiting(&mut self) -> u32 {
        self.slow.wcs.len() as u32 + self.default_cq.poller().ready()
    }

    /// Whether the QP has failover work in progress that needs polling (a drain, a
    /// switch-back) or completions waiting to be returned.
    pub fn is_busy(&self) -> bool {
        self.shared.busy() || !self.slow.wcs.is_empty()
    }

    // ---- slow datapath --------------------------------------------------------------------

    fn send_route(&self) -> Route {
        if self.slow.failed.is_some() {
            return Route::Closed;
        }
        self.slow
            .machine
            .as_ref()
            .map_or(Route::Default, |m| m.send_route())
    }

    fn recv_route(&self) -> Route {
        if self.slow.failed.is_some() {
            return Route::Closed;
        }
        self.slow
            .machine
            .as_ref()
            .map_or(Route::Default, |m| m.recv_route())
    }

    /// The application's send WRs outstanding on both rings, while posts take a slow route:
    /// exactly the WQEs a failback would move to the default SQ
    /// ([`ResilientQp::for_each_unfinished_send`]). While both rings' unfinished work starts
    /// at their consumer counters (no error noted), the counters say it in O(1): what each SQ
    /// holds, less the failover's own WQEs on it; otherwise (after an error, whose flushes
    /// retired WQEs that are still to move) they are walked.
    fn sends_outstanding(&mut self) -> u32 {
        if !self.unfinished_sends_start_at_completed() {
            let mut walked = 0;
            self.for_each_unfinished_send(|_, _| walked += 1);
            return walked;
        }
        let book = &self.slow.book;
        let on_backup = self.slow.backup.as_mut().map_or(0, |b| {
            let sq = b.qp.send_queue();
            let done = sq.completed();
            sq.outstanding_requests()
                .saturating_sub(book.internal_on_backup(done))
        });
        let sq = self.default.send_queue();
        let ci = sq.completed();
        let probing = book
            .probe
            .is_some_and(|p| p.wrapping_sub(ci) < sq.written().wrapping_sub(ci));
        let counted = on_backup + sq.outstanding_requests().saturating_sub(u32::from(probing));
        if cfg!(debug_assertions) {
            // The shortcut must agree with the walk a failback makes.
            let mut walked = 0;
            self.for_each_unfinished_send(|_, _| walked += 1);
            debug_assert_eq!(
                counted, walked,
                "send admission's count against the failback's list"
            );
        }
        counted
    }

    /// Refuses a send the application's send queue has no room for: the backup SQ is deeper
    /// than the default one (it also takes the peer's burns), and a round may leave work on
    /// both rings at once, but everything outstanding must fit the default SQ, where a
    /// failback moves it all (`docs/failover.md` 5e).
    fn admit_send(&mut self) -> Result<(), PostError> {
        let capacity = self.caps().max_send_wr;
        let outstanding = self.sends_outstanding();
        if outstanding >= capacity {
            return Err(PostError::QueueFull {
                queue: "send",
                outstanding,
                capacity,
                needed: 1,
            });
        }
        Ok(())
    }

    #[cold]
    #[inline(never)]
    fn post_send_slow(&mut self, wr: &SendWr<'_>) -> Result<(), PostError> {
        match self.send_route() {
            Route::Default => {
                self.default.post_send(wr)?;
            }
            Route::DefaultWithheld => {
                self.admit_send()?;
                self.default.send_queue().post_withheld(wr)?;
            }
            Route::Backup => {
                self.admit_send()?;
                let translated = self.translate_send(wr)?;
                let backup = self.slow.backup.as_mut().expect("routed to backup");
                backup.qp.post_send(&translated)?;
            }
            Route::Closed => {
                return Err(PostError::NotReadyToSend {
                    qpn: self.slow.env.default_qpn,
                    state: QpState::Err,
                })
            }
        }
        self.sends_posted += u64::from(two_sided(&wr.op));
        Ok(())
    }

    #[cold]
    #[inline(never)]
    fn ring_slow(&mut self) {
        if self.send_route() == Route::Default {
            self.default.ring_doorbell();
        }
        if let Some(b) = &mut self.slow.backup {
            b.qp.ring_doorbell();
        }
    }

    #[cold]
    #[inline(never)]
    fn post_recv_slow(&mut self, wr: &RecvWr) -> Result<(), PostError> {
        match self.recv_route() {
            Route::Default => self.default.post_recv(wr)?,
            Route::DefaultWithheld => self.default.recv_queue().write(wr)?,
            Route::Backup => {
                let translated = self.translate_recv(wr)?;
                // The backup RQ is deeper than the default one (it also holds stale receives,
                // `shadow::backup_caps`), but the application's receives on it must fit the
                // default RQ, where a switch-back moves them.
                let capacity = self.default.recv_queue().capacity();
                let stale = self.slow.book.backup_stale;
                let backup = self.slow.backup.as_mut().expect("routed to backup");
                let rq = backup.qp.recv_queue();
                let in_ring = u64::from(rq.written().wrapping_sub(rq.completed()));
                let outstanding = in_ring.saturating_sub(stale);
                if outstanding >= u64::from(capacity) {
                    return Err(PostError::QueueFull {
                        queue: "receive",
                        outstanding: outstanding as u32,
                        capacity,
                        needed: 1,
                    });
                }
                backup.qp.post_recv(&translated)?;
            }
            Route::Closed => {
                // As on a QP in ERR: taken, and flushed at once.
                self.slow.wcs.push_back(WorkCompletion {
                    wr_id: wr.wr_id,
                    status: WcStatus::WrFlushErr,
                    opcode: WcOpcode::Recv,
                    qp_num: self.slow.env.default_qpn,
                    ..WorkCompletion::EMPTY
                });
                self.fast_poll = false;
            }
        }
        self.recvs_posted += 1;
        Ok(())
    }

    /// The backup lkey of a default lkey.
    fn backup_lkey(&self, lkey: u32) -> Result<u32, PostError> {
        self.slow
            .env
            .shadow
            .as_ref()
            .and_then(|s| s.pd.keys.backup_lkey(lkey))
            .ok_or(PostError::NoBackupKey {
                kind: "lkey",
                key: lkey,
            })
    }

    /// The peer's backup rkey of one of its default rkeys. Without a store: from its
    /// rendezvous. With one: from the cache, confirmed by the store once per failover round
    /// (`docs/failover.md`, stale rkey mappings): a mapping the peer withdrew (it
    /// deregistered the MR) is forgotten and the caller fails closed; an unreachable store
    /// leaves the cached mapping in use.
    pub(super) fn backup_rkey(&mut self, rkey: u32) -> Option<u32> {
        let backup = self.slow.backup.as_mut()?;
        let cached = backup.peer_rkeys.get(&rkey).copied();
        let Some(store) = self.slow.env.ctx.as_ref().and_then(|c| c.store.clone()) else {
            return cached;
        };
        if cached.is_some() && backup.rkeys_confirmed.contains(&rkey) {
            return cached;
        }
        match store.lookup_rkey(backup.peer.default_gid, rkey) {
            Ok(Some(found)) => {
                backup.peer_rkeys.insert(rkey, found);
                backup.rkeys_confirmed.insert(rkey);
                Some(found)
            }
            Ok(None) => {
                if cached.is_some() {
                    tracing::info!(qp = %self.shared.name, rkey, "failover: the peer withdrew this rkey's mapping; forgotten");
                }
                backup.peer_rkeys.remove(&rkey);
                None
            }
            Err(e) if e.is_refusal() => {
                // The store holds a refused entry (forged, replayed...): fail closed.
                backup.peer_rkeys.remove(&rkey);
                None
            }
            Err(e) => {
                tracing::warn!(qp = %self.shared.name, error = %e, "failover: rkey lookup failed; using the cached mapping if any");
                cached
            }
        }
    }

    fn translate_send<'a>(&mut self, wr: &SendWr<'a>) -> Result<SendWr<'a>, PostError> {
        let mut out = wr.clone();
        let mut total = 0u64;
        if let Payload::Gather(sges) = &mut out.payload {
            for sge in sges.iter_mut().filter(|s| s.len != 0) {
                sge.lkey = self.backup_lkey(sge.lkey)?;
                total += u64::from(sge.len);
            }
        }
        if let Payload::Inline(data) = &out.payload {
            total += data.len() as u64;
        }
        let remote = match &mut out.op {
            SendOp::Write { remote }
            | SendOp::WriteImm { remote, .. }
            | SendOp::Read { remote }
            | SendOp::CompareSwap { remote, .. }
            | SendOp::FetchAdd { remote, .. } => Some(remote),
            SendOp::Send | SendOp::SendImm { .. } => None,
        };
        if let Some(remote) = remote {
            // A zero-length WRITE needs no rkey.
            if total > 0 || wr.op.is_atomic() {
                let key = remote.rkey;
                remote.rkey = self
                    .backup_rkey(key)
                    .ok_or(PostError::NoBackupKey { kind: "rkey", key })?;
            }
        }
        Ok(out)
    }

    fn translate_recv(&self, wr: &RecvWr) -> Result<RecvWr, PostError> {
        let mut sges = SgList::new();
        for sge in &wr.sges {
            let mut s = *sge;
            if s.len != 0 {
                s.lkey = self.backup_lkey(s.lkey)?;
            }
            sges.push(s);
        }
        Ok(RecvWr {
            wr_id: wr.wr_id,
            sges,
        })
    }

    /// The fast poll brought an error: the successes before it are the application's as they
    /// are; the error and what follows go through the failover driver.
    #[cold]
    #[inline(never)]
    fn poll_after_error(&mut self, wcs: &mut [WorkCompletion], n: usize) -> usize {
        let first_bad = wcs[..n].iter().position(|w| !w.is_ok()).unwrap_or(n);
        // The caller's slice, not a copy: it may be longer than any buffer of ours.
        self.take_batch(crate::failover::Path::Default, &wcs[first_bad..n], None);
        first_bad + self.poll_slow(&mut wcs[first_bad..])
    }

    #[cold]
    #[inline(never)]
    fn poll_slow(&mut self, wcs: &mut [WorkCompletion]) -> usize {
        self.run();
        let n = self.slow.wcs.len().min(wcs.len());
        for (dst, src) in wcs.iter_mut().zip(self.slow.wcs.drain(..n)) {
            *dst = src;
        }
        self.refresh_fast();
        n
    }

    /// Recomputes the hot flags from the machine and the driver's state.
    pub(super) fn refresh_fast(&mut self) {
        let s = &self.slow;
        let open = s.failed.is_none();
        let (send, recv, quiet) = match &s.machine {
            None => (true, true, true),
            Some(m) => (
                m.send_route() == Route::Default,
                m.recv_route() == Route::Default,
                m.poll_timeout().is_none(),
            ),
        };
        self.fast_send = open && send;
        // The default QP's fast path posts for this QP only while its route is the default.
        self.default.send_queue().hold_fast_path(!self.fast_send);
        self.fast_recv = open && recv;
        self.fast_poll = open
            && send
            && recv
            && quiet
            && s.wcs.is_empty()
            && s.events.is_empty()
            && !s.book.draining
            && !s.book.failback_draining
            && s.book.fence.is_none()
            && s.book.probe.is_none();
    }
}

impl crate::datapath::sq::BatchPost for ResilientQp {
    #[inline(always)]
    fn burst_queue(&mut self) -> &mut crate::datapath::sq::SendQueue {
        self.default.send_queue()
    }
    #[inline(always)]
    fn post_one(&mut self, wr: &SendWr<'_>) -> Result<(), PostError> {
        self.post_send(wr)
    }
}

impl Drop for ResilientQp {
    fn drop(&mut self) {
        if let Some(shadow) = &self.slow.env.shadow {
            shadow.cancel();
        }
    }
}
