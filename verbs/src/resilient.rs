//! Resilient devices: a `RAILSHIFT_DEVICES` entry with a backup (`rs1=soft:veth0+soft:veth1`).
//! Every RC QP on one is a pmd [`ResilientQp`] with the full failover machinery; its backup
//! side is set up through the Redis rendezvous, keyed by the default attributes the
//! application hands to `ibv_modify_qp` (its GID and QPN, the peer's GID and QPN): the pmd
//! publishes this end's entry when the backup QP exists and looks the peer's up at RTR, as
//! SHIFT does (the application's own exchange is not ours to extend). MRs get backup twins
//! whose rkeys the pmd publishes, so a retransmitted WRITE or READ maps.
//!
//! A verbs CQ is shared by the QPs bound to it; a resilient QP has one pmd CQ of its own for
//! both queues (where its failover puts the completions of both of its QPs in the order the
//! application depends on). A verbs CQ therefore gathers: `ibv_poll_cq` on it polls each QP
//! bound to it; a completion that belongs to the QP's other verbs CQ (a receive when this is
//! the send CQ, or the reverse) is queued on that CQ's pending list, returned by its next
//! poll before anything polled later. Every completion is taken from its QP exactly once and
//! put in exactly one place; a QP's completions reach a CQ's pending list only while that
//! QP's lock is held, and a poll drains the pending list under the lock of each QP before
//! polling it, so each QP's completions come out of each verbs CQ in the order the QP
//! produced them.
//!
//! A peer without railshift never publishes an entry: the QP runs on its default path,
//! unprotected, and after [`Resilience::protect_wait`] the shim says so once on stderr. A
//! QP that becomes protected logs it (`RAILSHIFT_LOG=info`), and so does its destruction,
//! with its failover counters.

use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use pmd::control::SavedAttrs;
use pmd::resilient::{
    FailoverService, RedisRendezvous, Rendezvous, RendezvousKey, ResilientConfig, ResilientContext,
    ResilientPd, ResilientQp, ServiceConfig,
};
use pmd::{QpAttr, QpState, SendOp, SendWr, Sge, WcOpcode, WorkCompletion};

use crate::abi::*;
use crate::config::{DeviceSpec, Progress, Resilience, MANAGEMENT_ADDR_VAR, RENDEZVOUS_VAR};
use crate::device::{open_pmd_context, PollActivity, RsContext};
use crate::objects::{
    caps_from, lock, post_recv_list, post_send_list, qp_attr_from, to_ibv_wc, write_query, RsPd,
    SendPoster,
};
use crate::util::invalid;

/// QPs a resilient device's two contexts size their key tables for: each resilient QP
/// registers its control channel's ring on both devices (one key each), and the pmd's default
/// of 4,096 slots fills before 4,096 QPs (`qp_memory --qps 4096` with it: "key table full"),
/// after which a QP's backup side cannot be set up. 32,768 slots, 1.25 MiB a context.
const RESILIENT_KEY_TABLE_QPS: u32 = 4096;

/// A resilient device, opened once per process and shared by every `ibv_open_device`.
pub struct ResilientDevice {
    /// The default and backup devices, paired, with the Redis rendezvous.
    pub ctx: ResilientContext,
    /// The settings it was opened with.
    pub settings: Resilience,
    /// The verbs name.
    pub name: String,
    /// The QPs made on it, for the helper thread.
    qps: Mutex<Vec<Weak<QpCell>>>,
}

/// The failover service of the process (one service lcore for every resilient device).
fn service() -> Result<&'static FailoverService, String> {
    static SERVICE: OnceLock<Result<FailoverService, String>> = OnceLock::new();
    SERVICE
        .get_or_init(|| {
            FailoverService::start(ServiceConfig::default())
                .map_err(|e| format!("cannot start the failover service: {e}"))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// An opened resilient device: its default device (what the query verbs read), the poll
/// activity its helper thread watches, and the pair.
pub type Opened = (Arc<pmd::Context>, Arc<PollActivity>, Arc<ResilientDevice>);

/// Opens the default and backup devices of `spec`, pairs them with the Redis rendezvous and
/// starts the device's helper thread.
pub fn open(
    spec: &DeviceSpec,
    backup: &str,
    settings: &Resilience,
    progress: Progress,
) -> Result<Opened, String> {
    if let Some(addr) = settings.management_addr {
        // The pmd binds its socket lazily, at the first QP's backup setup, where a failure
        // costs each QP its third channel with a warning of its own. An address that is not
        // this host's is a configuration error: said once, here, and the device not opened.
        std::net::UdpSocket::bind((addr, 0)).map_err(|e| {
            format!("{MANAGEMENT_ADDR_VAR}={addr}: cannot bind a UDP socket on it ({e}); it must be this host's address on the management network")
        })?;
    }
    let config = pmd::ContextConfig {
        progress: progress.model(),
        key_table_slots: pmd::ContextConfig::key_table_slots_for(RESILIENT_KEY_TABLE_QPS),
        ..pmd::ContextConfig::default()
    };
    let default = open_pmd_context(&spec.device_text, &config).map_err(|e| e.to_string())?;
    let backup_ctx =
        open_pmd_context(backup, &config).map_err(|e| format!("backup device {backup}: {e}"))?;
    let key = RendezvousKey::from_env()
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{} is not set", pmd::resilient::KEY_FILE_VAR))?;
    let store: Arc<dyn Rendezvous> = Arc::new(
        RedisRendezvous::new(&settings.rendezvous, &settings.prefix, key)
            .map_err(|e| format!("{RENDEZVOUS_VAR}: {e}"))?,
    );
    let mut failover = ResilientConfig::default();
    if let Some(h) = settings.holddown {
        failover.holddown = h;
    }
    if let Some(t) = settings.outage_tolerance {
        failover.outage_tolerance = t;
    }
    failover.management_addr = settings.management_addr;
    let ctx = ResilientContext::new(
        default.clone(),
        Some(backup_ctx),
        service()?,
        failover,
        Some(store),
    );
    let dev = Arc::new(ResilientDevice {
        ctx,
        settings: settings.clone(),
        name: spec.name.clone(),
        qps: Mutex::new(Vec::new()),
    });
    let activity = Arc::new(PollActivity::default());
    let (weak, act) = (Arc::downgrade(&dev), activity.clone());
    std::thread::Builder::new()
        .name(format!("rs-failover-{}", spec.name))
        .spawn(move || helper(weak, act))
        .map_err(|e| format!("cannot start the progress helper thread: {e}"))?;
    Ok((default, activity, dev))
}

/// How long the helper waits between looks (as the plain devices' helper).
const IDLE_GAP: Duration = Duration::from_micros(50);
/// Rounds a device is run at most per look.
const HELPER_ROUNDS: usize = 64;

fn run_until_idle(c: &pmd::Context) {
    if c.progress_model() != pmd::provider::ProgressModel::Manual {
        return;
    }
    for _ in 0..HELPER_ROUNDS {
        if !c.step().busy {
            break;
        }
    }
}

/// The helper thread of a resilient device. While the application does not poll it runs the
/// default device; it always runs the backup device (the application's polls run it only
/// while work is on it, but the peer's control messages arrive there at any time); it runs
/// each QP's failover work when mail waits for it or the application does not poll (a
/// perftest bandwidth server never polls, yet its QPs must answer a failover), and it says
/// once per QP whether it became protected.
fn helper(dev: Weak<ResilientDevice>, activity: Arc<PollActivity>) {
    let mut seen = activity.count();
    loop {
        std::thread::sleep(IDLE_GAP);
        let Some(d) = dev.upgrade() else {
            return;
        };
        let now = activity.count();
        let polling = now != seen;
        seen = now;
        if !polling {
            run_until_idle(d.ctx.default_context());
        }
        if let Some(b) = d.ctx.backup_context() {
            run_until_idle(b);
        }
        let qps: Vec<Arc<QpCell>> = {
            let mut list = lock(&d.qps);
            list.retain(|w| w.strong_count() > 0);
            list.iter().filter_map(Weak::upgrade).collect()
        };
        for q in qps {
            let Ok(mut g) = q.inner.try_lock() else {
                continue;
            };
            if !polling || g.qp.has_mail() {
                g.qp.progress();
            }
            q.watch(&mut g, &d);
            for cq in [q.send_cq, q.recv_cq] {
                // SAFETY: a QP's CQs outlive it (see QpCell).
                let cq = unsafe { &*cq };
                if cq.armed.load(Ordering::Acquire) && cq.has_work(&mut g) {
                    cq.fire();
                }
            }
        }
    }
}

/// How long a QP may stay in RTR before the shim moves it to RTS itself. The pmd sets up a
/// backup side from the application's RTR and RTS attributes, and a receive-only QP (the
/// server of perftest's one-way bandwidth tests) never gets an RTS; programs that do move to
/// RTS do it right after RTR.
pub const RTS_GRACE: Duration = Duration::from_millis(500);
/// The send PSN of a QP the shim moved to RTS (it never sends: the application sees RTR).
const AUTO_SQ_PSN: u32 = 0;

/// Whether a QP's protection has been announced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Said {
    Nothing,
    Unprotected,
    Protected,
}

/// What a QP's lock guards.
struct QpInner {
    qp: ResilientQp,
    /// The state the application moved the QP to (failover changes the pmd QPs' states,
    /// not this).
    state: QpState,
    /// The application's bring-up attributes, for `ibv_query_qp`.
    saved: SavedAttrs,
    /// When the application moved the QP to RTR.
    rtr_at: Option<Instant>,
    /// When the QP reached RTS (the application's or the shim's move).
    rts_at: Option<Instant>,
    /// The shim moved the QP to RTS itself (the application left it in RTR).
    auto_rts: bool,
    said: Said,
}

/// A resilient QP and where its completions go.
pub struct QpCell {
    inner: Mutex<QpInner>,
    send_cq: *const RCq,
    recv_cq: *const RCq,
    sig_all: bool,
    max_inline: u32,
    qpn: u32,
}

// SAFETY: the CQ pointers are only dereferenced while the QP exists, and verbs forbids
// destroying a CQ a QP uses (`ibv_destroy_cq` answers `EBUSY` while one is bound); the CQs
// themselves are Sync (their state is behind mutexes).
unsafe impl Send for QpCell {}
// SAFETY: as above.
unsafe impl Sync for QpCell {}

impl QpCell {
    /// Brings a QP the application left in RTR to RTS (see [`RTS_GRACE`]), then announces,
    /// once, whether it became protected or ran past the wait without.
    fn watch(&self, g: &mut QpInner, d: &ResilientDevice) {
        if let (QpState::Rtr, Some(rtr_at), false) = (g.state, g.rtr_at, g.auto_rts) {
            if rtr_at.elapsed() >= RTS_GRACE {
                g.auto_rts = true;
                match g.qp.modify(QpState::Rts, &QpAttr::rts(AUTO_SQ_PSN)) {
                    Ok(()) => {
                        g.saved.record(QpState::Rtr, QpState::Rts, &QpAttr::rts(AUTO_SQ_PSN));
                        g.rts_at = Some(Instant::now());
                        tracing::info!(
                            "railshift verbs: {} QP {:#x}: left in RTR for {RTS_GRACE:?}, moved to RTS by the shim so that its backup side can be set up (the application still sees RTR)",
                            d.name,
                            self.qpn
                        );
                    }
                    Err(e) => tracing::warn!(
                        "railshift verbs: {} QP {:#x}: could not move the receive-only QP to RTS for its backup side: {e}",
                        d.name,
                        self.qpn
                    ),
                }
            }
        }
        let Some(rts_at) = g.rts_at else {
            return;
        };
        if g.said == Said::Protected {
            return;
        }
        if g.qp.is_protected() {
            g.said = Said::Protected;
            // Whether the third channel is on is decided by both ends' settings: say which.
            let management = match g.qp.management_peer() {
                Some(peer) => format!("management channel to {peer}"),
                None => "no management channel".to_string(),
            };
            tracing::info!(
                "railshift verbs: {} QP {:#x}: protected (backup on {}; {management})",
                d.name,
                self.qpn,
                d.ctx
                    .backup_context()
                    .map_or_else(String::new, |b| b.name().to_string())
            );
        } else if g.said == Said::Nothing && rts_at.elapsed() >= d.settings.protect_wait {
            self.say_unprotected(g, d, &format!("within {:?}", d.settings.protect_wait));
        }
    }

    /// Says once on stderr that the QP runs unprotected, and why.
    fn say_unprotected(&self, g: &mut QpInner, d: &ResilientDevice, when: &str) {
        g.said = Said::Unprotected;
        let rtr = g.saved.rtr.as_ref();
        let gid = rtr.and_then(|a| a.av).map(|av| av.dgid).unwrap_or_default();
        let qpn = rtr.and_then(|a| a.dest_qpn).unwrap_or(0);
        eprintln!(
            "railshift verbs: {} QP {:#x}: the peer ({gid}, QPN {qpn:#x}) published no backup attributes in the rendezvous ({RENDEZVOUS_VAR}) {when}: running unprotected (a NIC failure fails this QP; is the peer railshift with the same rendezvous and prefix?)",
            d.name, self.qpn
        );
    }

    /// The verbs CQ a completion of this QP belongs to.
    fn cq_of(&self, wc: &WorkCompletion) -> *const RCq {
        if matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
            self.recv_cq
        } else {
            self.send_cq
        }
    }
}

/// A verbs CQ of a resilient device: the QPs bound to it and completions gathered for it.
#[repr(C)]
pub struct RCq {
    ibv: ibv_cq,
    /// Completions polled from a QP for this CQ by a poll of another CQ, oldest first.
    pending: Mutex<VecDeque<WorkCompletion>>,
    /// The QPs with this CQ as send or receive CQ.
    qps: Mutex<Vec<Arc<QpCell>>>,
    /// Where the next poll starts in `qps` (so one busy QP does not starve the others).
    cursor: AtomicUsize,
    activity: Arc<PollActivity>,
    dev: Arc<ResilientDevice>,
    /// With a completion channel: the event descriptor in the channel's epoll set.
    event_fd: Option<c_int>,
    /// Armed by `ibv_req_notify_cq`, until the event is raised.
    armed: AtomicBool,
}

/// A QP of a resilient device.
#[repr(C)]
pub struct RQp {
    ibv: ibv_qp,
    cell: Arc<QpCell>,
    dev: Arc<ResilientDevice>,
}

/// The resilient device of a context, if it is one.
pub fn device_of(c: &RsContext) -> Option<&Arc<ResilientDevice>> {
    c.resilient.as_ref()
}

/// `ibv_alloc_pd` on a resilient device: the backup twin follows on the service lcore.
pub fn alloc_pd(d: &ResilientDevice) -> Result<(Arc<pmd::Pd>, ResilientPd), String> {
    let pd = d.ctx.alloc_pd().map_err(|e| e.to_string())?;
    Ok((pd.pd().clone(), pd))
}

/// `ibv_create_cq` on a resilient device (`ctx` is ours).
///
/// # Safety
/// `channel` is null or a live completion channel of the same context.
pub unsafe fn create_cq(
    c: &RsContext,
    d: &Arc<ResilientDevice>,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
) -> *mut ibv_cq {
    let event_fd = if channel.is_null() {
        None
    } else {
        // SAFETY: plain syscall.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            invalid("ibv_create_cq", &format!("eventfd: {e}"), libc::ENOMEM);
            return std::ptr::null_mut();
        }
        Some(fd)
    };
    let rs = Box::into_raw(Box::new(RCq {
        ibv: ibv_cq {
            context: c.ibv(),
            channel,
            cq_context,
            handle: 0,
            cqe,
            mutex: libc::PTHREAD_MUTEX_INITIALIZER,
            cond: libc::PTHREAD_COND_INITIALIZER,
            comp_events_completed: 0,
            async_events_completed: 0,
        },
        pending: Mutex::new(VecDeque::new()),
        qps: Mutex::new(Vec::new()),
        cursor: AtomicUsize::new(0),
        activity: c.activity.clone(),
        dev: d.clone(),
        event_fd,
        armed: AtomicBool::new(false),
    }));
    if let Some(fd) = event_fd {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: rs as u64,
        };
        // SAFETY: `channel` is a live channel of this context (the caller's); both
        // descriptors are open; `ev` is valid.
        if unsafe { libc::epoll_ctl((*channel).fd, libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
            let e = std::io::Error::last_os_error();
            // SAFETY: made just above, not handed out; the descriptor is ours.
            unsafe {
                drop(Box::from_raw(rs));
                libc::close(fd);
            }
            invalid("ibv_create_cq", &format!("epoll_ctl: {e}"), libc::EINVAL);
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's channel; its users are counted so that it is not destroyed
        // under them.
        unsafe { (*channel).refcnt += 1 };
    }
    rs.cast()
}

/// `ibv_destroy_cq` on a resilient device: `EBUSY` while a QP uses it.
///
/// # Safety
/// `cq` is a live CQ of a resilient device, destroyed once.
pub unsafe fn destroy_cq(cq: *mut ibv_cq) -> c_int {
    // SAFETY: the caller's CQ, made by create_cq.
    let rs = unsafe { &*cq.cast::<RCq>() };
    if !lock(&rs.qps).is_empty() {
        return invalid("ibv_destroy_cq", "a QP still uses the CQ", libc::EBUSY);
    }
    // SAFETY: made by create_cq, freed once.
    let rs = unsafe { Box::from_raw(cq.cast::<RCq>()) };
    if let Some(fd) = rs.event_fd {
        let channel = rs.ibv.channel;
        // SAFETY: the CQ's channel outlives it (destroying it is refused while we count);
        // the descriptors are open, and ours is closed once.
        unsafe {
            libc::epoll_ctl((*channel).fd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut());
            (*channel).refcnt -= 1;
            libc::close(fd);
        }
    }
    0
}

impl RCq {
    /// Raises the CQ's completion event if it is armed (and disarms it).
    fn fire(&self) {
        if let Some(fd) = self.event_fd {
            if self.armed.swap(false, Ordering::AcqRel) {
                let one: u64 = 1;
                // SAFETY: our eventfd; eight bytes from a live u64. A full counter cannot
                // happen (each event is read before the next arm).
                unsafe { libc::write(fd, std::ptr::from_ref(&one).cast(), 8) };
            }
        }
    }

    /// Whether completions wait for this CQ: pending ones, or any a bound QP holds (which
    /// may belong to its other CQ: an event then finds nothing, which verbs allows).
    fn has_work(&self, qp: &mut QpInner) -> bool {
        !lock(&self.pending).is_empty() || qp.qp.completions_waiting() > 0
    }
}

/// Consumes the completion event of a resilient CQ that the channel's epoll set reported;
/// false when another thread took it first.
///
/// # Safety
/// `cq` is a live CQ of a resilient device with a completion channel.
pub unsafe fn take_event(cq: *mut ibv_cq) -> bool {
    // SAFETY: the caller's CQ.
    let rs = unsafe { &*cq.cast::<RCq>() };
    let Some(fd) = rs.event_fd else {
        return false;
    };
    let mut count: u64 = 0;
    // SAFETY: our non-blocking eventfd; eight bytes into a live u64.
    let n = unsafe { libc::read(fd, std::ptr::from_mut(&mut count).cast(), 8) };
    n == 8 && count > 0
}

/// The ops table's `req_notify_cq` on a resilient device: arms the CQ (a CQ without a
/// channel has nothing to signal and answers 0). The helper thread raises the event when a
/// bound QP has completions waiting, as a NIC raises it for a new CQE after the arm; one
/// already waiting raises it at once (as mlx5 does when CQEs are past the armed index).
///
/// # Safety
/// `cq` is one of our live CQs of a resilient device.
pub unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, _solicited_only: c_int) -> c_int {
    // SAFETY: the inline wrapper passes one of our CQs.
    let rs = unsafe { &*cq.cast::<RCq>() };
    if rs.event_fd.is_some() {
        rs.armed.store(true, Ordering::Release);
    }
    0
}

/// Completions taken from a QP per round.
const BATCH: usize = 16;

impl RCq {
    /// Moves pending completions to `out[done..want]`; returns the new `done`.
    ///
    /// # Safety
    /// `out` holds `want` entries.
    unsafe fn drain(&self, out: *mut ibv_wc, mut done: usize, want: usize) -> usize {
        let mut pending = lock(&self.pending);
        while done < want {
            let Some(wc) = pending.pop_front() else {
                break;
            };
            // SAFETY: `done < want`, the caller's array's length.
            unsafe { out.add(done).write(to_ibv_wc(&wc)) };
            done += 1;
        }
        done
    }

    /// Polls the bound QPs into `out[done..want]`; returns the new `done`.
    ///
    /// # Safety
    /// `out` holds `want` entries.
    unsafe fn poll_qps(
        &self,
        qps: &[Arc<QpCell>],
        out: *mut ibv_wc,
        mut done: usize,
        want: usize,
    ) -> usize {
        let me: *const RCq = self;
        let start = self.cursor.fetch_add(1, Ordering::Relaxed);
        let mut buf = [WorkCompletion::EMPTY; BATCH];
        for i in 0..qps.len() {
            let q = &qps[(start + i) % qps.len()];
            let mut g = lock(&q.inner);
            // Under the QP's lock: whatever of this QP another CQ's poll queued here comes
            // out before what this poll takes from it.
            // SAFETY: forwarded.
            done = unsafe { self.drain(out, done, want) };
            if done == want {
                break;
            }
            let room = (want - done).min(BATCH);
            let got = g.qp.poll(&mut buf[..room]);
            for wc in &buf[..got] {
                let to = q.cq_of(wc);
                if std::ptr::eq(to, me) {
                    // SAFETY: at most `room` land here, and `done + room <= want`.
                    unsafe { out.add(done).write(to_ibv_wc(wc)) };
                    done += 1;
                } else {
                    // SAFETY: a QP's CQs outlive it (see QpCell).
                    lock(&unsafe { &*to }.pending).push_back(*wc);
                }
            }
        }
        done
    }
}

/// The ops table's `poll_cq` on a resilient device: pending completions first, then each
/// bound QP; when nothing came on a manual-progress device, one round of the default and
/// backup devices and another look.
///
/// # Safety
/// `cq` is one of our live CQs of a resilient device; `out` holds `n` entries.
pub unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, out: *mut ibv_wc) -> c_int {
    // SAFETY: the inline wrapper passes one of our CQs; resilient contexts' ops make RCqs.
    let rs = unsafe { &*cq.cast::<RCq>() };
    rs.activity.polled();
    let want = n.max(0) as usize;
    // SAFETY: the caller's array holds `n` entries.
    let mut done = unsafe { rs.drain(out, 0, want) };
    if done == want {
        return done as c_int;
    }
    let qps: Vec<Arc<QpCell>> = lock(&rs.qps).clone();
    // SAFETY: as above.
    done = unsafe { rs.poll_qps(&qps, out, done, want) };
    if done == 0 {
        let mut moved = rs.dev.ctx.default_context().progress();
        if let Some(b) = rs.dev.ctx.backup_context() {
            moved |= b.progress();
        }
        if moved {
            // SAFETY: as above.
            done = unsafe { rs.poll_qps(&qps, out, done, want) };
        }
    }
    done as c_int
}

/// `ibv_create_qp` on a resilient device, once the common checks passed (RC, no SRQ: a
/// device with a backup refuses SRQs, both CQs ours).
///
/// # Safety
/// `pd` is one of our PDs on a resilient device; `a`'s CQs are ours.
pub unsafe fn create_qp(pd: *mut ibv_pd, a: &mut ibv_qp_init_attr) -> *mut ibv_qp {
    // SAFETY: the caller's PD.
    let rpd = unsafe { &*pd.cast::<RsPd>() };
    let Some(res_pd) = rpd.resilient.as_ref() else {
        return crate::device::null_with(libc::EINVAL);
    };
    // SAFETY: the caller's CQs, ours on a resilient device.
    let (scq, rcq) = unsafe { (&*a.send_cq.cast::<RCq>(), &*a.recv_cq.cast::<RCq>()) };
    let qp = match res_pd.create_qp(caps_from(&a.cap)) {
        Ok(q) => q,
        Err(e) => {
            invalid("ibv_create_qp", &e.to_string(), libc::EINVAL);
            return std::ptr::null_mut();
        }
    };
    let granted = qp.caps();
    a.cap = ibv_qp_cap {
        max_send_wr: granted.max_send_wr,
        max_recv_wr: granted.max_recv_wr,
        max_send_sge: granted.max_send_sge,
        max_recv_sge: granted.max_recv_sge,
        max_inline_data: granted.max_inline_data,
    };
    let qpn = qp.qpn();
    let cell = Arc::new(QpCell {
        inner: Mutex::new(QpInner {
            qp,
            state: QpState::Reset,
            saved: SavedAttrs::default(),
            rtr_at: None,
            rts_at: None,
            auto_rts: false,
            said: Said::Nothing,
        }),
        send_cq: scq,
        recv_cq: rcq,
        sig_all: a.sq_sig_all != 0,
        max_inline: granted.max_inline_data,
        qpn,
    });
    lock(&scq.qps).push(cell.clone());
    if !std::ptr::eq(scq, rcq) {
        lock(&rcq.qps).push(cell.clone());
    }
    let dev = scq.dev.clone();
    lock(&dev.qps).push(Arc::downgrade(&cell));
    Box::into_raw(Box::new(RQp {
        ibv: ibv_qp {
            context: rpd.context(),
            qp_context: a.qp_context,
            pd,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: std::ptr::null_mut(),
            handle: qpn,
            qp_num: qpn,
            state: QpState::Reset as u32,
            qp_type: IBV_QPT_RC,
            mutex: libc::PTHREAD_MUTEX_INITIALIZER,
            cond: libc::PTHREAD_COND_INITIALIZER,
            events_completed: 0,
        },
        cell,
        dev,
    }))
    .cast()
}

/// `ibv_modify_qp` on a resilient QP: the pmd records the bring-up for the backup QP's
/// shadow bring-up, which looks the peer up in the rendezvous by the RTR's GID and QPN.
///
/// # Safety
/// `qp` is one of our QPs on a resilient device.
pub unsafe fn modify_qp(qp: *mut ibv_qp, a: &ibv_qp_attr, mask: c_int) -> c_int {
    // SAFETY: the caller's QP.
    let rs = unsafe { &mut *qp.cast::<RQp>() };
    let mut g = lock(&rs.cell.inner);
    let from = g.state;
    let to = if mask & qp_mask::STATE != 0 {
        match u8::try_from(a.qp_state).ok().and_then(QpState::from_ibv) {
            Some(s) => s,
            None => {
                return invalid(
                    "ibv_modify_qp",
                    &format!(
                        "QP state {} (SQD, SQE and unknown states are not supported)",
                        a.qp_state
                    ),
                    libc::EINVAL,
                )
            }
        }
    } else {
        from
    };
    let mut attr = match qp_attr_from(a, mask) {
        Ok(p) => p,
        Err((why, errno)) => return invalid("ibv_modify_qp", &why, errno),
    };
    let mut record_from = from;
    if g.auto_rts && from == QpState::Rtr && to == QpState::Rts {
        // The shim already moved it: the application's RTS is an RTS -> RTS change, which
        // cannot change the send PSN the peer was told.
        if attr.sq_psn.is_some_and(|p| p != AUTO_SQ_PSN) {
            return invalid(
                "ibv_modify_qp",
                &format!(
                    "RTR -> RTS more than {RTS_GRACE:?} after RTR on a resilient device: the shim moved the QP to RTS with send PSN {AUTO_SQ_PSN} to set up its backup side, and cannot change it now"
                ),
                libc::EINVAL,
            );
        }
        attr.sq_psn = None;
        record_from = QpState::Rts;
    }
    match g.qp.modify(to, &attr) {
        Ok(()) => {
            g.saved.record(record_from, to, &attr);
            g.state = to;
            if to == QpState::Rtr {
                g.rtr_at = Some(Instant::now());
            }
            if record_from == QpState::Rtr && to == QpState::Rts {
                g.rts_at = Some(Instant::now());
            }
            rs.ibv.state = to as u32;
            0
        }
        Err(e) => invalid("ibv_modify_qp", &e.to_string(), libc::EINVAL),
    }
}

/// `ibv_query_qp` on a resilient QP: the state the application moved it to and the
/// attributes it gave.
///
/// # Safety
/// `qp` is one of our QPs on a resilient device; `attr` and `init` as `ibv_query_qp`'s.
pub unsafe fn query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    // SAFETY: the caller's QP.
    let rs = unsafe { &*qp.cast::<RQp>() };
    let g = lock(&rs.cell.inner);
    // SAFETY: the caller's buffers.
    unsafe {
        write_query(
            attr,
            init,
            &rs.ibv,
            g.state,
            &g.qp.caps(),
            &g.saved,
            rs.cell.sig_all,
        )
    }
}

/// How long a connected QP stays after `ibv_destroy_qp` (as the plain devices' linger: the
/// softnic's deferred ACK must go out, on whichever device carries the traffic).
const LINGER: Duration = Duration::from_millis(5);

/// `ibv_destroy_qp` on a resilient QP: unbinds it from its CQs (their pending completions
/// of it stay to be polled), lets a connected QP's devices send what they owe, logs its
/// failover counters and destroys both sides.
///
/// # Safety
/// `qp` is one of our QPs on a resilient device, destroyed once.
pub unsafe fn destroy_qp(qp: *mut ibv_qp) -> c_int {
    // SAFETY: made by create_qp, freed once.
    let rs = unsafe { Box::from_raw(qp.cast::<RQp>()) };
    for cq in [rs.cell.send_cq, rs.cell.recv_cq] {
        // SAFETY: the QP's CQs outlive it.
        lock(&unsafe { &*cq }.qps).retain(|q| !Arc::ptr_eq(q, &rs.cell));
    }
    let (connected, stats, state) = {
        let mut g = lock(&rs.cell.inner);
        if g.said == Said::Nothing && g.rts_at.is_some() && !g.qp.is_protected() {
            rs.cell
                .say_unprotected(&mut g, &rs.dev, "before the QP was destroyed");
        }
        (
            matches!(g.state, QpState::Rtr | QpState::Rts),
            g.qp.stats(),
            g.qp.state(),
        )
    };
    if connected {
        let devices = [
            Some(rs.dev.ctx.default_context()),
            rs.dev.ctx.backup_context(),
        ];
        let deadline = Instant::now() + LINGER;
        for c in devices.into_iter().flatten() {
            run_until_idle(c);
        }
        if rs.dev.ctx.default_context().progress_model() != pmd::provider::ProgressModel::Manual {
            std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
        }
    }
    tracing::info!(
        "railshift verbs: {} QP {:#x} destroyed: {state:?}, {} failovers, {} switch-backs, {} WQEs retransmitted",
        rs.dev.name,
        rs.cell.qpn,
        stats.failovers,
        stats.switch_backs,
        stats.wqes_retransmitted
    );
    drop(rs);
    0
}

/// A resilient QP's posts: the default QP's fast path, which records the request for a
/// failover as the general post does (it counts the two-sided ones), declined while the route
/// is not the default; then the whole request takes the failover layer's post.
impl SendPoster for QpInner {
    #[inline(always)]
    fn post_fast(
        &mut self,
        wr: &impl pmd::datapath::sq::FastRequest,
        op: SendOp,
        sge: &Sge,
    ) -> bool {
        self.qp.post_send_fast_parts(wr, op, sge).is_some()
    }
    #[inline]
    fn post_general(&mut self, wr: &SendWr<'_>) -> Result<(), pmd::PostError> {
        self.qp.post_send(wr)
    }
    #[inline]
    fn ring_doorbell(&mut self) {
        self.qp.ring_doorbell()
    }
}

/// The ops table's `post_send` on a resilient device.
///
/// # Safety
/// `qp` is one of our live QPs of a resilient device; `wr` is a valid list; `bad_wr` is null
/// or writable.
pub unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: the inline wrapper passes one of our QPs.
    let rs = unsafe { &*qp.cast::<RQp>() };
    let cell = &rs.cell;
    let mut g = lock(&cell.inner);
    if g.auto_rts && g.state == QpState::Rtr {
        // The pmd QP is in RTS (the shim's move); the application's is not.
        if !bad_wr.is_null() {
            // SAFETY: the caller's slot.
            unsafe { bad_wr.write(wr) };
        }
        return invalid("ibv_post_send", "the QP is in RTR", libc::EINVAL);
    }
    // SAFETY: forwarded from the caller.
    unsafe { post_send_list(&mut *g, wr, bad_wr, cell.sig_all, cell.max_inline) }
}

/// The ops table's `post_recv` on a resilient device.
///
/// # Safety
/// `qp` is one of our live QPs of a resilient device; `wr` is a valid list; `bad_wr` is null
/// or writable.
pub unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: the inline wrapper passes one of our QPs.
    let rs = unsafe { &*qp.cast::<RQp>() };
    let mut g = lock(&rs.cell.inner);
    // SAFETY: forwarded from the caller.
    unsafe { post_recv_list(wr, bad_wr, "ibv_post_recv", |rwr| g.qp.post_recv(rwr)) }
}
