//! Shadow control verbs: the application's control verbs on the default device, recorded and
//! replayed on the backup device by the service lcore (SHIFT section 4.2, appendix B.1).
//!
//! Each recorded object is a shadow: a PD, an MR (the same memory registered again), a QP
//! (the backup CQ and QP, and the control QP pair's local end) whose bring-up follows the
//! application's INIT, RTR and RTS. The service lcore keeps a list of pending verbs and runs
//! it in **best-effort order**: a verb that waits for something (an attribute of the remote
//! end, the application's next transition, its PD) is skipped and retried on a later scan
//! once its count of changes moved (or, for the rendezvous store, at the next retry), so one
//! QP waiting for its peer never holds up another QP's setup. That is what keeps two
//! hosts that set up many QPs from several threads out of the cyclic wait of appendix B.1
//! (each host's setup of QP 1 waiting for the other host's QP 1, which waits behind its QP 2,
//! which waits for ours). [`super::ShadowOrder::Strict`] runs the list strictly in order instead; it
//! exists to show that deadlock in a test.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::control::{Context, ModifyError, Mr, Pd, Qp, SavedAttrs};
use crate::failover::Path;
use crate::provider::VerbsError;
use crate::qp_state::QpState;
use crate::verbs::{Access, Gid, QpAttr, QpCaps};

use super::mailbox::{BackupParts, Mail, QpShared};
use super::{Outcome, PendingVerb, ServedQp, ServiceHandle};
use crate::resilient::backup_cq::{completions_bound, BackupCqs, BackupSeat};
use crate::resilient::channel::ControlChannel;
use crate::resilient::config::ResilientConfig;
use crate::resilient::rendezvous::{grants_remote_access, PeerAttrs, Rendezvous};

/// What a resilient context shares with everything made from it.
pub(crate) struct CtxInner {
    pub default: Arc<Context>,
    pub backup: Option<Arc<Context>>,
    pub service: ServiceHandle,
    pub config: ResilientConfig,
    pub store: Option<Arc<dyn Rendezvous>>,
    /// The CQs the backup data QPs of this context share, per backup device.
    pub backup_cqs: BackupCqs,
}

/// One shadow verb waiting in the service lcore's list. Weak: a verb whose object the
/// application dropped is forgotten.
pub(crate) enum Verb {
    AllocPd(Weak<PdShadow>),
    RegMr(Weak<MrShadow>),
    SetUpQp(Weak<QpShadow>),
}

impl PendingVerb for Verb {
    fn run(&self) -> Outcome {
        match self {
            Verb::AllocPd(pd) => pd.upgrade().map_or(Outcome::Done, |pd| pd.run()),
            Verb::RegMr(mr) => mr.upgrade().map_or(Outcome::Done, |mr| mr.run()),
            Verb::SetUpQp(qp) => qp.upgrade().map_or(Outcome::Done, |qp| qp.run()),
        }
    }

    fn changes(&self) -> u64 {
        // An object the application dropped reads as a change: the next run finds it gone.
        const GONE: u64 = u64::MAX;
        match self {
            Verb::AllocPd(_) => 0,
            Verb::RegMr(mr) => mr.upgrade().map_or(GONE, |mr| mr.pd.changes()),
            Verb::SetUpQp(qp) => qp.upgrade().map_or(GONE, |qp| qp.changes()),
        }
    }
}

/// Default keys to backup keys for one PD's MRs.
#[derive(Debug, Default)]
pub(crate) struct KeyMap {
    inner: Mutex<KeyMapInner>,
}

#[derive(Debug, Default)]
struct KeyMapInner {
    lkeys: HashMap<u32, u32>,
    lkeys_back: HashMap<u32, u32>,
    rkeys: Vec<(u32, u32)>,
}

impl KeyMap {
    fn lock(&self) -> std::sync::MutexGuard<'_, KeyMapInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `remote`: the MR grants remote access; only then does its rkey go to the peer.
    fn insert(&self, default_lkey: u32, default_rkey: u32, backup: &Mr, remote: bool) {
        let mut m = self.lock();
        m.lkeys.insert(default_lkey, backup.lkey());
        m.lkeys_back.insert(backup.lkey(), default_lkey);
        if remote {
            m.rkeys.push((default_rkey, backup.rkey()));
        }
    }

    fn remove(&self, default_lkey: u32, default_rkey: u32) {
        let mut m = self.lock();
        if let Some(b) = m.lkeys.remove(&default_lkey) {
            m.lkeys_back.remove(&b);
        }
        m.rkeys.retain(|(d, _)| *d != default_rkey);
    }

    /// The backup lkey of a default lkey.
    pub fn backup_lkey(&self, default: u32) -> Option<u32> {
        self.lock().lkeys.get(&default).copied()
    }

    /// The default lkey of a backup lkey.
    pub fn default_lkey(&self, backup: u32) -> Option<u32> {
        self.lock().lkeys_back.get(&backup).copied()
    }

    /// Every (default rkey, backup rkey) pair of an MR with remote access, for the peer.
    pub fn rkeys(&self) -> Vec<(u32, u32)> {
        self.lock().rkeys.clone()
    }
}

enum Slot<T> {
    Pending,
    Ready(T),
    Failed(String),
}

/// A PD and its backup twin.
pub(crate) struct PdShadow {
    pub ctx: Arc<CtxInner>,
    pub default: Arc<Pd>,
    backup: Mutex<Slot<Arc<Pd>>>,
    pub keys: KeyMap,
    /// MRs registered on the default device whose backup registration has not finished.
    pub mrs_pending: AtomicUsize,
    /// Moves after the backup PD is allocated (or fails) and after each MR's backup
    /// registration finishes: what the PD's waiting MRs and QPs wait for.
    changes: AtomicU64,
}

impl PdShadow {
    pub fn new(ctx: Arc<CtxInner>, default: Arc<Pd>) -> PdShadow {
        PdShadow {
            ctx,
            default,
            backup: Mutex::new(Slot::Pending),
            keys: KeyMap::default(),
            mrs_pending: AtomicUsize::new(0),
            changes: AtomicU64::new(0),
        }
    }

    /// How often the backup PD or a backup MR of this PD changed (see [`PendingVerb::changes`]).
    fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// Counts a change, after it is made.
    fn changed(&self) {
        self.changes.fetch_add(1, Ordering::AcqRel);
    }

    /// The backup PD, once the service lcore allocated it.
    pub fn backup(&self) -> Result<Option<Arc<Pd>>, String> {
        match &*self.backup.lock().unwrap_or_else(|p| p.into_inner()) {
            Slot::Pending => Ok(None),
            Slot::Ready(pd) => Ok(Some(pd.clone())),
            Slot::Failed(e) => Err(e.clone()),
        }
    }

    fn run(&self) -> Outcome {
        let Some(backup_ctx) = &self.ctx.backup else {
            return Outcome::Done;
        };
        let slot = match backup_ctx.alloc_pd() {
            Ok(pd) => Slot::Ready(pd),
            Err(e) => {
                tracing::error!(device = %backup_ctx.name(), error = %e, "failover: backup PD not allocated; QPs of this PD stay unprotected");
                Slot::Failed(e.to_string())
            }
        };
        *self.backup.lock().unwrap_or_else(|p| p.into_inner()) = slot;
        self.changed();
        Outcome::Done
    }
}

#[derive(Debug)]
struct MrState {
    backup: Option<Mr>,
    /// The application dropped its MR: never register the memory again.
    cancelled: bool,
    done: bool,
}

/// An MR and its backup twin on the same memory.
#[derive(Debug)]
pub(crate) struct MrShadow {
    pd: Arc<PdShadow>,
    addr: usize,
    len: usize,
    access: Access,
    default_lkey: u32,
    default_rkey: u32,
    default_gid: Gid,
    state: Mutex<MrState>,
}

impl MrShadow {
    pub fn new(pd: Arc<PdShadow>, default: &Mr, default_gid: Gid) -> MrShadow {
        pd.mrs_pending.fetch_add(1, Ordering::AcqRel);
        MrShadow {
            pd,
            addr: default.addr() as usize,
            len: default.len(),
            access: default.access(),
            default_lkey: default.lkey(),
            default_rkey: default.rkey(),
            default_gid,
            state: Mutex::new(MrState {
                backup: None,
                cancelled: false,
                done: false,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MrState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn finish(&self, state: &mut MrState) {
        if !state.done {
            state.done = true;
            self.pd.mrs_pending.fetch_sub(1, Ordering::AcqRel);
            self.pd.changed();
        }
    }

    fn run(&self) -> Outcome {
        let backup_pd = match self.pd.backup() {
            Ok(Some(pd)) => pd,
            Ok(None) => return Outcome::Waiting("the backup PD"),
            Err(_) => {
                self.finish(&mut self.lock());
                return Outcome::Done;
            }
        };
        // The lock is held across the registration: the application's drop of the MR waits
        // for it, so the memory cannot go away underneath.
        let mut state = self.lock();
        if state.cancelled || state.done {
            self.finish(&mut state);
            return Outcome::Done;
        }
        // SAFETY: the range is the application's MR, registered on the default device; it
        // stays mapped until `cancel` runs (the application's MR drop), which takes this lock
        // and drops the backup MR before the memory can go.
        let registered = unsafe { backup_pd.register(self.addr as *mut u8, self.len, self.access) };
        match registered {
            Ok(mr) => {
                // The default MR is alive (not cancelled), so its keys are current.
                let remote = grants_remote_access(self.access);
                self.pd
                    .keys
                    .insert(self.default_lkey, self.default_rkey, &mr, remote);
                if let Some(store) = self.pd.ctx.store.as_ref().filter(|_| remote) {
                    if let Err(e) =
                        store.publish_rkey(self.default_gid, self.default_rkey, mr.rkey())
                    {
                        tracing::warn!(error = %e, "failover: backup rkey not published");
                    }
                }
                state.backup = Some(mr);
            }
            Err(e) => {
                tracing::error!(error = %e, lkey = self.default_lkey, "failover: backup MR not registered; work naming it cannot fail over")
            }
        }
        self.finish(&mut state);
        Outcome::Done
    }

    /// The application deregisters (or drops) its MR: first the backup keys leave the
    /// failover's mappings and the store (so no failover maps a WQE through them, and no
    /// peer learns them again), then the backup device deregisters its twin. Returns what
    /// the backup device said; a refusal is final (the keys are gone from the mappings
    /// either way: fail closed). Later calls return `Ok`.
    pub fn cancel(&self) -> Result<(), VerbsError> {
        let mut state = self.lock();
        state.cancelled = true;
        let mut result = Ok(());
        if let Some(mut backup) = state.backup.take() {
            self.pd.keys.remove(self.default_lkey, self.default_rkey);
            let remote = grants_remote_access(self.access);
            if let Some(store) = self.pd.ctx.store.as_ref().filter(|_| remote) {
                if let Err(e) = store.withdraw_rkey(self.default_gid, self.default_rkey) {
                    tracing::warn!(error = %e, rkey = self.default_rkey, "failover: backup rkey not withdrawn from the store");
                }
            }
            result = backup.release();
        }
        self.finish(&mut state);
        result
    }

    /// The backup device, which holds (or held) the twin.
    pub fn backup_context(&self) -> Option<&Arc<Context>> {
        self.pd.ctx.backup.as_ref()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Create,
    Created,
    Init,
    Rtr,
    Rts,
    HandedOver,
    Failed,
}

struct Setup {
    stage: Stage,
    qp: Option<Qp>,
    cq: Option<BackupSeat>,
    control: Option<Arc<ControlChannel>>,
    /// The control channel on the default device, which repairs a lost backup side.
    default_control: Option<Arc<ControlChannel>>,
    /// This end's attributes for the peer, once the backup objects exist.
    local: Option<PeerAttrs>,
    /// This end on the management network (`docs/failover.md` 5f), when configured.
    management: Option<Arc<crate::resilient::management::ManagementLink>>,
}

/// The backup QP's depths for an application QP of `caps` (`docs/failover.md`, 3.5). A
/// switch-back leaves the receives it moves back posted on the backup RQ (stale, at most a
/// default RQ's worth) until the next round's burns consume them, and that round copies the
/// default RQ's receives in behind them: the backup RQ holds two default RQs. The peer's
/// burns (one basic block each, at most its default RQ's worth; the peer is taken to have the
/// same depths) go on the backup SQ in front of a whole default SQ.
pub(crate) fn backup_caps(caps: QpCaps) -> QpCaps {
    QpCaps {
        max_send_wr: caps.max_send_wr + caps.max_recv_wr,
        max_recv_wr: 2 * caps.max_recv_wr,
        ..caps
    }
}

/// Entries of a CQ shared by both queues of a QP of `caps`: a completion of every WQE both
/// queues can hold, flushes included.
pub(crate) fn cq_entries(caps: QpCaps) -> u32 {
    2 * (caps.max_send_wr + caps.max_recv_wr).max(8)
}

/// Creates the backup QP for an application QP of `caps` on the backup `pd`, with a seat in
/// one of the context's shared backup CQs (`cqs`) that holds [`completions_bound`] of it. The
/// seat is first asked for the depths the backup queues are asked for; a provider that grants
/// deeper queues (rounding to a power of two, or a WQE of several basic blocks) gets the seat
/// grown to what it granted, or the QP made again in a CQ with room for it.
pub(crate) fn create_backup_qp(
    pd: &Arc<Pd>,
    caps: QpCaps,
    cqs: &BackupCqs,
) -> Result<(BackupSeat, Qp), VerbsError> {
    let ctx = pd.context();
    let caps = backup_caps(caps);
    let mut entries = caps.max_send_wr + caps.max_recv_wr;
    // The first try, and at most one more with what the first one was granted.
    for _ in 0..2 {
        let mut seat = cqs.reserve(ctx, entries)?;
        let mut qp = seat.with_cq(|cq| pd.create_qp(cq, cq, caps))?;
        let needed = completions_bound(&mut qp);
        if seat.grow_to(needed) {
            seat.attach(qp.qpn());
            return Ok((seat, qp));
        }
        entries = needed;
    }
    Err(VerbsError::Failed {
        device: ctx.name().to_string(),
        verb: "create_qp",
        reason: format!(
            "the backup QP's queues ({caps:?}) were granted more than a seat of {entries} CQ entries holds, twice"
        ),
    })
}

/// A QP and its backup side: the backup CQ and QP and the control channel, brought up after
/// the application's default QP.
pub(crate) struct QpShadow {
    pub pd: Arc<PdShadow>,
    pub caps: QpCaps,
    pub default_qpn: u32,
    pub default_gid: Gid,
    pub shared: Arc<QpShared>,
    /// The application's transitions of the default QP, as the shadow replays them.
    recorded: Mutex<SavedAttrs>,
    peer: Mutex<Option<PeerAttrs>>,
    setup: Mutex<Setup>,
    cancelled: AtomicBool,
    /// Moves after each recorded transition, the peer's attributes and a cancel: what the
    /// bring-up waits for besides its PD's changes.
    changes: AtomicU64,
}

impl QpShadow {
    pub fn new(
        pd: Arc<PdShadow>,
        caps: QpCaps,
        default_qpn: u32,
        default_gid: Gid,
        shared: Arc<QpShared>,
    ) -> QpShadow {
        QpShadow {
            pd,
            caps,
            default_qpn,
            default_gid,
            shared,
            recorded: Mutex::new(SavedAttrs::default()),
            peer: Mutex::new(None),
            setup: Mutex::new(Setup {
                stage: Stage::Create,
                qp: None,
                cq: None,
                control: None,
                default_control: None,
                local: None,
                management: None,
            }),
            cancelled: AtomicBool::new(false),
            changes: AtomicU64::new(0),
        }
    }

    /// Moves whenever something the bring-up may wait for changes (see
    /// [`PendingVerb::changes`]): the QP's own inputs plus its PD's (a sum of two counts that
    /// only grow moves when either does).
    fn changes(&self) -> u64 {
        self.changes
            .load(Ordering::Acquire)
            .wrapping_add(self.pd.changes())
    }

    /// Counts a change, after it is made.
    fn changed(&self) {
        self.changes.fetch_add(1, Ordering::AcqRel);
    }

    /// Records one of the application's transitions of the default QP (`from` -> `to`). An
    /// INIT -> INIT or RTS -> RTS change (an access-flag cut) also applies at once to a
    /// backup QP the bring-up has already taken to that state; one it has not reached
    /// gets the change with the transition that reaches it (the recorded attributes carry
    /// it). An error is the backup QP's refusal; the QP is then moved to ERR (fail closed:
    /// a backup QP that keeps access the application cut must never carry traffic) and
    /// the bring-up fails.
    pub fn record(&self, from: QpState, to: QpState, attr: &QpAttr) -> Result<(), ModifyError> {
        self.recorded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record(from, to, attr);
        self.changed();
        if from != to {
            return Ok(());
        }
        let mut setup = self.setup.lock().unwrap_or_else(|p| p.into_inner());
        let Some(qp) = setup.qp.as_mut().filter(|qp| qp.state() == to) else {
            return Ok(());
        };
        if let Err(e) = qp.modify(to, attr) {
            if let Err(err) = qp.modify(QpState::Err, &QpAttr::default()) {
                tracing::error!(qp = %self.shared.name, error = %err, "failover: backup QP not moved to ERR");
            }
            self.fail(&mut setup, "the application's change of the backup QP", &e);
            return Err(e);
        }
        Ok(())
    }

    /// The peer's attributes, from the application's exchange (inline rendezvous).
    pub fn set_peer(&self, peer: PeerAttrs) {
        *self.peer.lock().unwrap_or_else(|p| p.into_inner()) = Some(peer);
        self.changed();
    }

    /// This end's attributes for the peer, once the backup objects exist and every MR of the
    /// PD registered so far has its backup twin.
    pub fn local_attrs(&self) -> Result<Option<PeerAttrs>, String> {
        let setup = self.setup.lock().unwrap_or_else(|p| p.into_inner());
        if setup.stage == Stage::Failed {
            return Err("setting up the backup side failed (see the log)".into());
        }
        if self.pd.mrs_pending.load(Ordering::Acquire) > 0 {
            return Ok(None);
        }
        Ok(setup.local.clone().map(|mut local| {
            local.rkeys = self.pd.keys.rkeys();
            local
        }))
    }

    /// The application dropped the QP: stop setting it up.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
        self.changed();
    }

    /// The application revoked the QP: stop setting it up, and move a backup QP the
    /// bring-up holds (not yet handed over) to ERR.
    pub fn revoke(&self) -> Result<(), ModifyError> {
        self.cancel();
        let mut setup = self.setup.lock().unwrap_or_else(|p| p.into_inner());
        match setup.qp.as_mut() {
            Some(qp) => qp.modify(QpState::Err, &QpAttr::default()),
            None => Ok(()),
        }
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }

    fn fail(&self, setup: &mut Setup, what: &str, e: impl std::fmt::Display) -> Outcome {
        tracing::error!(qp = %self.shared.name, what, error = %e, "failover: backup side not set up; the QP stays unprotected");
        setup.stage = Stage::Failed;
        self.shared.post(Mail::SetupFailed(format!("{what}: {e}")));
        Outcome::Done
    }

    /// Advances the backup side as far as it can go now.
    fn run(&self) -> Outcome {
        if self.is_cancelled() {
            return Outcome::Done;
        }
        let mut setup = self.setup.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            match setup.stage {
                Stage::Create => {
                    let pd = match self.pd.backup() {
                        Ok(Some(pd)) => pd,
                        Ok(None) => return Outcome::Waiting("the backup PD"),
                        Err(e) => return self.fail(&mut setup, "backup PD", e),
                    };
                    let ctx = pd.context().clone();
                    let (cq, qp) = match create_backup_qp(&pd, self.caps, &self.pd.ctx.backup_cqs) {
                        Ok(made) => made,
                        Err(e) => return self.fail(&mut setup, "backup QP and CQ", e),
                    };
                    let depth = self.pd.ctx.config.control_depth;
                    let cqs = self.pd.ctx.service.control_cqs();
                    let control = match ControlChannel::create(&pd, depth, self.default_qpn, cqs) {
                        Ok(c) => c,
                        Err(e) => return self.fail(&mut setup, "control QP", e),
                    };
                    control.set_owner(&self.shared);
                    // A second channel on the default device: the backup side's repair
                    // cannot travel on the backup side (docs/failover.md 5d).
                    let default_control = match ControlChannel::create_on(
                        Path::Default,
                        &self.pd.default,
                        depth,
                        self.default_qpn,
                        cqs,
                    ) {
                        Ok(c) => c,
                        Err(e) => return self.fail(&mut setup, "default control QP", e),
                    };
                    default_control.set_owner(&self.shared);
                    let (default_control_ring_addr, default_control_ring_rkey) =
                        default_control.ring();
                    let backup_gid = match ctx.query_gid(0) {
                        Ok(g) => g,
                        Err(e) => return self.fail(&mut setup, "backup GID", e),
                    };
                    let (control_ring_addr, control_ring_rkey) = control.ring();
                    let local = PeerAttrs {
                        default_gid: self.default_gid,
                        default_qpn: self.default_qpn,
                        backup_gid,
                        backup_qpn: qp.qpn(),
                        control_qpn: control.qpn(),
                        control_psn: control.send_psn(),
                        control_ring_addr,
                        control_ring_rkey,
                        default_control_qpn: default_control.qpn(),
                        default_control_psn: default_control.send_psn(),
                        default_control_ring_addr,
                        default_control_ring_rkey,
                        rkeys: Vec::new(),
                        management: None,
                    };
                    let mut local = local;
                    if let Some(addr) = self.pd.ctx.config.management_addr {
                        let link = self
                            .pd
                            .ctx
                            .service
                            .management_socket(addr)
                            .and_then(|socket| socket.open_link())
                            .and_then(|link| Ok((link.endpoint()?, link)));
                        match link {
                            Ok((endpoint, link)) => {
                                link.set_owner(&self.shared);
                                local.management = Some(endpoint);
                                setup.management = Some(link);
                            }
                            // The connection runs without the third channel, as before it.
                            Err(e) => {
                                tracing::warn!(qp = %self.shared.name, %addr, error = %e, "failover: no management endpoint; both control channels lost will end the connection")
                            }
                        }
                    }
                    if let Some(store) = &self.pd.ctx.store {
                        let mut published = local.clone();
                        published.rkeys = self.pd.keys.rkeys();
                        if let Err(e) = store.publish_qp(&published) {
                            // Retried: the store may come back.
                            tracing::warn!(qp = %self.shared.name, error = %e, "failover: backup attributes not published yet");
                            return Outcome::Retry("the rendezvous store");
                        }
                    }
                    tracing::debug!(qp = %self.shared.name, backup_qpn = qp.qpn(), control_qpn = control.qpn(), "failover: backup QP created");
                    setup.qp = Some(qp);
                    setup.cq = Some(cq);
                    setup.control = Some(control);
                    setup.default_control = Some(default_control);
                    setup.local = Some(local);
                    setup.stage = Stage::Created;
                }
                Stage::Created => {
                    let Some(init) = self.recorded().init else {
                        return Outcome::Waiting("the application's INIT");
                    };
                    let qp = setup.qp.as_mut().expect("created");
                    if let Err(e) = qp.modify(QpState::Init, &init) {
                        return self.fail(&mut setup, "backup QP to INIT", e);
                    }
                    if let Err(e) = setup.control.as_ref().expect("created").init() {
                        return self.fail(&mut setup, "control QP to INIT", e);
                    }
                    if let Err(e) = setup.default_control.as_ref().expect("created").init() {
                        return self.fail(&mut setup, "default control QP to INIT", e);
                    }
                    setup.stage = Stage::Init;
                }
                Stage::Init => {
                    let Some(rtr) = self.recorded().rtr else {
                        return Outcome::Waiting("the application's RTR");
                    };
                    let (Some(av), Some(dest_qpn)) = (rtr.av, rtr.dest_qpn) else {
                        return self.fail(
                            &mut setup,
                            "application's RTR",
                            "no address vector or destination QPN",
                        );
                    };
                    let peer = match self.find_peer(av.dgid, dest_qpn) {
                        Ok(Some(peer)) => peer,
                        // Looked up in the store, they come from outside the process; handed
                        // over inline, `set_peer` counts them as a change.
                        Ok(None) if self.pd.ctx.store.is_some() => {
                            return Outcome::Retry("the peer's backup attributes")
                        }
                        Ok(None) => return Outcome::Waiting("the peer's backup attributes"),
                        Err(e) => return self.fail(&mut setup, "peer's backup attributes", e),
                    };
                    let mut backup_rtr = rtr.clone();
                    backup_rtr.av = Some(crate::verbs::AddressVector {
                        dgid: peer.backup_gid,
                        ..av
                    });
                    backup_rtr.dest_qpn = Some(peer.backup_qpn);
                    let qp = setup.qp.as_mut().expect("created");
                    if let Err(e) = qp.modify(QpState::Rtr, &backup_rtr) {
                        return self.fail(&mut setup, "backup QP to RTR", e);
                    }
                    setup.stage = Stage::Rtr;
                }
                Stage::Rtr => {
                    let recorded = self.recorded();
                    let (Some(rtr), Some(rts)) = (recorded.rtr, recorded.rts) else {
                        return Outcome::Waiting("the application's RTS");
                    };
                    let peer = self.found_peer();
                    let qp = setup.qp.as_mut().expect("created");
                    if let Err(e) = qp.modify(QpState::Rts, &rts) {
                        return self.fail(&mut setup, "backup QP to RTS", e);
                    }
                    let control = setup.control.as_ref().expect("created");
                    if let Err(e) = control.connect(
                        peer.backup_gid,
                        peer.control_qpn,
                        peer.control_psn,
                        peer.default_qpn,
                        (peer.control_ring_addr, peer.control_ring_rkey),
                        &rtr,
                        &rts,
                        self.pd.ctx.config.control_outlasts(),
                    ) {
                        return self.fail(&mut setup, "control QP to RTS", e);
                    }
                    let default_control = setup.default_control.as_ref().expect("created");
                    if let Err(e) = default_control.connect(
                        peer.default_gid,
                        peer.default_control_qpn,
                        peer.default_control_psn,
                        peer.default_qpn,
                        (
                            peer.default_control_ring_addr,
                            peer.default_control_ring_rkey,
                        ),
                        &rtr,
                        &rts,
                        self.pd.ctx.config.control_outlasts(),
                    ) {
                        return self.fail(&mut setup, "default control QP to RTS", e);
                    }
                    setup.stage = Stage::Rts;
                }
                Stage::Rts => {
                    if self.pd.mrs_pending.load(Ordering::Acquire) > 0 {
                        return Outcome::Waiting("backup MRs");
                    }
                    let recorded = self.recorded();
                    let peer = self.found_peer();
                    let parts = BackupParts {
                        qp: setup.qp.take().expect("created"),
                        cq: setup.cq.take().expect("created"),
                        control: setup.control.clone().expect("created"),
                        default_control: setup.default_control.clone().expect("created"),
                        peer,
                        base: recorded,
                        management: setup.management.clone(),
                    };
                    tracing::info!(qp = %self.shared.name, backup_qpn = parts.qp.qpn(), "failover: backup QP connected; the QP is protected");
                    self.shared.post(Mail::Protected(Box::new(parts)));
                    setup.stage = Stage::HandedOver;
                    return Outcome::Done;
                }
                Stage::HandedOver | Stage::Failed => return Outcome::Done,
            }
        }
    }

    /// The peer's attributes, found before RTR.
    fn found_peer(&self) -> PeerAttrs {
        self.peer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .expect("found at RTR")
    }

    pub fn recorded(&self) -> SavedAttrs {
        self.recorded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The peer's attributes: given inline, or looked up in the store by the peer's default
    /// `(GID, QPN)` from the application's RTR. Checked against that RTR either way.
    fn find_peer(&self, gid: Gid, qpn: u32) -> Result<Option<PeerAttrs>, String> {
        let mut slot = self.peer.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            if let Some(store) = &self.pd.ctx.store {
                match store.lookup_qp(gid, qpn) {
                    Ok(found) => *slot = found,
                    Err(e) => {
                        tracing::warn!(qp = %self.shared.name, error = %e, "failover: rendezvous lookup failed; retrying");
                        return Ok(None);
                    }
                }
            }
        } else if let (Some(store), Some(inline)) = (&self.pd.ctx.store, &*slot) {
            // Both an inline exchange and a store: they must agree.
            store.cross_check(inline).map_err(|e| e.to_string())?;
        }
        match &*slot {
            None => Ok(None),
            Some(peer) if peer.default_gid == gid && peer.default_qpn == qpn => {
                Ok(Some(peer.clone()))
            }
            Some(peer) => Err(format!(
                "the peer's backup attributes are for default QP {:#x} on {}, but the application connected to {qpn:#x} on {gid}",
                peer.default_qpn, peer.default_gid
            )),
        }
    }
}

impl ServedQp for QpShadow {
    fn mailbox(&self) -> &QpShared {
        &self.shared
    }

    fn path_on(&self, device: &Arc<Context>) -> Option<Path> {
        let ctx = &self.pd.ctx;
        if Arc::ptr_eq(&ctx.default, device) {
            Some(Path::Default)
        } else if ctx.backup.as_ref().is_some_and(|b| Arc::ptr_eq(b, device)) {
            Some(Path::Backup)
        } else {
            None
        }
    }

    fn link_watch(&self) -> bool {
        self.pd.ctx.config.link_watch
    }

    fn is_cancelled(&self) -> bool {
        QpShadow::is_cancelled(self)
    }
}

impl std::fmt::Debug for PdShadow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PdShadow")
            .field("default", &self.default)
            .finish_non_exhaustive()
    }
}

// They create backup QPs on softnic devices of the in-memory fabric.
#[cfg(all(test, feature = "soft"))]
mod tests {
    use super::*;
    use crate::datapath::wr::{RecvWr, SendOp, SendWr};
    use crate::datapath::wr::{WcOpcode, WcStatus, WorkCompletion};
    use crate::provider::soft::{register_fabric, unregister_fabric};
    use crate::provider::ProgressModel;
    use crate::verbs::{AddressVector, Mtu};
    use crate::ContextConfig;

    /// What one backup QP of [`fill_and_flush`] admitted and what its seat gave back: (sends
    /// admitted, receives admitted, flushes of sends, flushes of receives, anything else,
    /// completions of another QP's WRs).
    type Filled = (u32, u32, [u32; 4]);

    /// Creates `qps` backup QPs of a QP of `caps` in one context's shared backup CQs, fills
    /// each with every send and receive it admits (wr_ids carry the QP's index), moves them all
    /// to ERR without polling, then polls each one's seat, the last first.
    fn fill_and_flush(fabric: &str, caps: QpCaps, qps: usize) -> (Vec<Filled>, usize) {
        let f = softnic::Fabric::new(3, std::time::Duration::ZERO);
        f.add_port("198.18.2.1".parse().unwrap());
        f.add_port("198.18.2.2".parse().unwrap());
        register_fabric(fabric, &f);
        let config = ContextConfig {
            progress: ProgressModel::Manual,
            ..ContextConfig::default()
        };
        let ctx = Context::open(&format!("fabric:{fabric}/0"), &config).unwrap();
        let peer = Context::open(&format!("fabric:{fabric}/1"), &config).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cqs = BackupCqs::default();
        let mut made = Vec::new();
        for k in 0..qps as u64 {
            let (seat, mut qp) = create_backup_qp(&pd, caps, &cqs).unwrap();
            // Towards a QPN nobody has: nothing is acknowledged, so every send is still
            // outstanding when the QP enters ERR, and every WQE of both rings is flushed.
            let rtr = QpAttr::rtr(
                AddressVector::to_gid(peer.query_gid(0).unwrap()),
                0xdead,
                0,
                Mtu::Mtu1024,
            );
            qp.modify(QpState::Init, &QpAttr::init(Access::ALL))
                .unwrap();
            qp.modify(QpState::Rtr, &rtr).unwrap();
            qp.modify(QpState::Rts, &QpAttr::rts(0)).unwrap();
            let mut sends = 0u32;
            while qp
                .post_send(&SendWr::new(k << 32 | u64::from(sends), SendOp::Send, &[]).signaled())
                .is_ok()
            {
                sends += 1;
            }
            qp.ring_doorbell();
            let mut recvs = 0u32;
            while qp
                .post_recv(&RecvWr::new(k << 32 | u64::from(recvs), &[]))
                .is_ok()
            {
                recvs += 1;
            }
            made.push((seat, qp, sends, recvs));
        }
        // Some of the sends leave before the error (the device fetched and sent them).
        for _ in 0..4 {
            ctx.progress();
            peer.progress();
        }
        for (_, qp, _, _) in &made {
            qp.handle().set_error().unwrap();
        }
        for _ in 0..64 {
            ctx.progress();
        }
        let mut filled = vec![(0, 0, [0u32; 4]); qps];
        let mut wcs = [WorkCompletion::EMPTY; 64];
        for (k, (seat, _, sends, recvs)) in made.iter().enumerate().rev() {
            let mut got = [0u32; 4];
            let mut quiet = 0;
            while quiet < 16 {
                ctx.progress();
                let (n, _) = seat.poll(&mut wcs);
                quiet = if n == 0 { quiet + 1 } else { 0 };
                for wc in &wcs[..n] {
                    let slot = match (wc.status, wc.opcode == WcOpcode::Recv) {
                        _ if wc.wr_id >> 32 != k as u64 => 3,
                        (WcStatus::WrFlushErr, false) => 0,
                        (WcStatus::WrFlushErr, true) => 1,
                        _ => 2,
                    };
                    got[slot] += 1;
                }
            }
            filled[k] = (*sends, *recvs, got);
        }
        let shared_cqs = cqs.census().0;
        drop(made);
        unregister_fabric(fabric);
        (filled, shared_cqs)
    }

    /// A backup QP's seat is `completions_bound` of it, not twice it: every WQE the backup
    /// rings of three QPs admit (the second and third share a CQ sized for two seats),
    /// completing at once and unpolled, fits, and each QP's seat gives it exactly its own
    /// completions, for the benches' shape, for depths the provider rounds up, and for WQEs
    /// of several basic blocks (a provider that grants more sends than asked: small WQEs fit
    /// more of them).
    #[test]
    fn shared_backup_cqs_hold_a_completion_of_every_wqe_their_members_admit() {
        let shapes = [
            (128, 128, 1, 0),
            (100, 100, 4, 128),
            (1, 1, 1, 0),
            (24, 40, 2, 64),
        ];
        for (i, (send, recv, sge, inline)) in shapes.into_iter().enumerate() {
            let caps = QpCaps {
                max_send_wr: send,
                max_recv_wr: recv,
                max_send_sge: sge,
                max_recv_sge: sge,
                max_inline_data: inline,
            };
            let fabric = format!("shadow-cq-{}-{i}", std::process::id());
            let (filled, shared_cqs) = fill_and_flush(&fabric, caps, 3);
            assert_eq!(shared_cqs, 2, "{caps:?}: a CQ of one seat, then one of two");
            let backup = backup_caps(caps);
            for (k, (sends, recvs, got)) in filled.into_iter().enumerate() {
                assert!(
                    sends >= backup.max_send_wr && recvs >= backup.max_recv_wr,
                    "{caps:?}: backup QP {k}'s rings admitted {sends} sends and {recvs} receives"
                );
                assert_eq!(
                    got,
                    [sends, recvs, 0, 0],
                    "{caps:?}: backup QP {k}: one flush per WQE of both rings (sends, receives, \
                     other, another QP's)"
                );
            }
        }
    }

    /// A reset of one member (`BackupSeat::discard`) drops its CQEs, those still in the ring
    /// and those another member's poll already moved to its inbox, and none of the other
    /// member's: each of the other's WRs completes once, and the reset one's none.
    #[test]
    fn a_members_reset_drops_its_completions_and_no_other_members() {
        let fabric = format!("shadow-discard-{}", std::process::id());
        let f = softnic::Fabric::new(3, std::time::Duration::ZERO);
        f.add_port("198.18.2.1".parse().unwrap());
        f.add_port("198.18.2.2".parse().unwrap());
        register_fabric(&fabric, &f);
        let config = ContextConfig {
            progress: ProgressModel::Manual,
            ..ContextConfig::default()
        };
        let ctx = Context::open(&format!("fabric:{fabric}/0"), &config).unwrap();
        let peer = Context::open(&format!("fabric:{fabric}/1"), &config).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cqs = BackupCqs::default();
        let caps = QpCaps {
            max_send_wr: 8,
            max_recv_wr: 8,
            ..QpCaps::default()
        };
        // The first QP has a CQ of its own; the next two share the second CQ.
        let first = create_backup_qp(&pd, caps, &cqs).unwrap();
        let (keep, mut kept) = create_backup_qp(&pd, caps, &cqs).unwrap();
        let (reset, mut reset_qp) = create_backup_qp(&pd, caps, &cqs).unwrap();
        assert_eq!(cqs.census().0, 2);
        let rtr = QpAttr::rtr(
            AddressVector::to_gid(peer.query_gid(0).unwrap()),
            0xdead,
            0,
            Mtu::Mtu1024,
        );
        for qp in [&mut kept, &mut reset_qp] {
            qp.modify(QpState::Init, &QpAttr::init(Access::ALL))
                .unwrap();
            qp.modify(QpState::Rtr, &rtr).unwrap();
            qp.modify(QpState::Rts, &QpAttr::rts(0)).unwrap();
        }
        // Receives of both QPs, interleaved, then both to ERR: their flushes share the ring.
        for i in 0..8u64 {
            kept.post_recv(&RecvWr::new(i, &[])).unwrap();
            reset_qp.post_recv(&RecvWr::new(100 + i, &[])).unwrap();
        }
        kept.handle().set_error().unwrap();
        reset_qp.handle().set_error().unwrap();
        for _ in 0..64 {
            ctx.progress();
        }
        let mut wcs = [WorkCompletion::EMPTY; 3];
        // The kept QP's first poll moves every CQE of both to their inboxes.
        let (n, _) = keep.poll(&mut wcs);
        let mut got: Vec<u64> = wcs[..n].iter().map(|wc| wc.wr_id).collect();
        // The other QP takes one of its own, then is reset: the rest go.
        let (n, _) = reset.poll(&mut wcs[..1]);
        assert_eq!((n, wcs[0].wr_id), (1, 100));
        reset_qp.modify(QpState::Reset, &QpAttr::default()).unwrap();
        assert_eq!(reset.discard(), 7, "the reset QP's CQEs left in its inbox");
        assert_eq!(reset.poll(&mut wcs).0, 0);
        loop {
            let (n, _) = keep.poll(&mut wcs);
            if n == 0 {
                break;
            }
            got.extend(wcs[..n].iter().map(|wc| wc.wr_id));
        }
        assert_eq!(
            got,
            (0..8).collect::<Vec<u64>>(),
            "each of the kept QP's WRs, once, in order"
        );
        drop((first, keep, kept, reset, reset_qp));
        unregister_fabric(&fabric);
    }
}
