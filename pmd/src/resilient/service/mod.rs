//! The failover service: the lcore that does a process's failover control work, so that
//! datapath lcores never block on it.
//!
//! It runs the shadow verbs (best-effort order), watches each device's link and moves a
//! protected default QP to ERR the moment its link goes down, polls every control QP and
//! puts the messages in the owning QP's mailbox, wakes owners whose timers are due, and runs
//! the QPs handed to it with [`FailoverService::adopt`] (an application that never polls its
//! QP, such as a WRITE-only responder). It sleeps in `poll(2)` on the control CQs' completion
//! channels, the devices' port-event descriptors, the netdev monitors and its own wake-up
//! eventfd, with the nearest timer as the timeout.
//!
//! [`FailoverService::start`] runs it on its own thread; [`FailoverService::manual`] makes one
//! that a deterministic simulation steps with [`FailoverService::run_once`] on its virtual
//! clock.

mod link;
pub(super) mod mailbox;
pub(super) mod shadow;

use std::any::Any;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::control::Context;
use crate::failover::{Event, Path, Timestamp};

use super::channel::cq::ControlCq;
use super::channel::{ChannelCqs, ControlChannel};
use super::clock::Clock;
use super::config::LinkSource;
use super::deadline::DeadlineBoard;
use link::{LinkChange, LinkWatch};
use mailbox::{Mail, QpShared};

/// How often verbs that wait (for a peer, for the application) are retried.
const VERB_RETRY: Duration = Duration::from_millis(5);
/// How often an adopted QP with work in progress (a drain, a switch-back) is run.
const BUSY_RETRY: Duration = Duration::from_micros(200);
/// How the service lcore runs its list of shadow verbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShadowOrder {
    /// Skip a verb that waits and try the next one (SHIFT appendix B.1). The default.
    #[default]
    BestEffort,
    /// Run the list strictly in order, stopping at the first verb that waits. Deadlocks when
    /// two hosts set up several QPs in different orders; for tests that show it.
    Strict,
}

/// What running a shadow verb did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Finished (or failed, or its object is gone): drop it from the list.
    Done,
    /// Waiting for something of this process (the application's next transition, the peer's
    /// attributes handed over inline, the backup PD, backup MRs): run again only once the
    /// verb's [`PendingVerb::changes`] has moved.
    Waiting(&'static str),
    /// Waiting for something outside the process (the rendezvous store): run again at the
    /// next retry whether or not anything here changed.
    Retry(&'static str),
}

/// A verb the service runs for the backup device until it is done (the shadow module's
/// `Verb`). The service knows its verbs, QPs and adopted QPs only by these traits, so that it
/// imports neither the shadow objects nor the QP (one-way imports, `docs/architecture.md`).
pub(crate) trait PendingVerb: Send {
    /// Takes the verb one step further.
    fn run(&self) -> Outcome;
    /// A count that moves (after the change) whenever something the verb may wait for with
    /// [`Outcome::Waiting`] changes. The service reads it before each run and skips a verb
    /// whose count has not moved since the run that returned `Waiting`: with thousands of QPs
    /// in setup, each application transition wakes the service, and running every waiting
    /// verb again each time made setup quadratic in the QPs.
    fn changes(&self) -> u64;
}

/// A verb in the service's list, with the count of changes its last run saw if that run
/// waited for a change.
struct Queued {
    verb: Box<dyn PendingVerb>,
    parked_at: Option<u64>,
}

/// What the service needs of a registered resilient QP (the shadow module's `QpShadow`):
/// where its mail goes, which of its paths a device carries. (Its control channels' messages
/// reach it through the shared control CQs, [`super::channel::cq`].)
pub(crate) trait ServedQp: Send + Sync {
    /// The QP's mailbox.
    fn mailbox(&self) -> &QpShared;
    /// Which of the QP's paths `device` carries, if either.
    fn path_on(&self, device: &Arc<Context>) -> Option<Path>;
    /// Whether a link-down moves the default QP to ERR at once.
    fn link_watch(&self) -> bool;
    /// The application dropped the QP.
    fn is_cancelled(&self) -> bool;
}

/// A QP the service runs because its application does not poll it (a `ResilientQp`).
pub(crate) trait AdoptedWork: Any + Send {
    /// Whether it has something to do at `now` (mail, a due timer, work in progress).
    fn needs_progress(&self, now: Timestamp) -> bool;
    /// Runs its failover work.
    fn progress(&mut self);
    /// Whether it is in the middle of something that needs it run soon (a drain).
    fn busy(&self) -> bool;
    /// When it next needs to run if nothing wakes it.
    fn next_deadline(&self) -> Option<Timestamp>;
}

/// The longest the service thread sleeps without looking around.
const MAX_SLEEP: Duration = Duration::from_millis(100);

/// An eventfd that wakes the service thread.
struct WakeFd {
    fd: OwnedFd,
}

impl WakeFd {
    fn new() -> std::io::Result<WakeFd> {
        // SAFETY: plain syscall; the result is checked and then owned.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(WakeFd { fd })
    }

    fn signal(&self) {
        let one = 1u64;
        // SAFETY: an 8-byte write from a live u64 to our eventfd; EAGAIN (saturated) still
        // leaves it readable.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    fn drain(&self) {
        let mut v = 0u64;
        // SAFETY: an 8-byte read into a live u64 from our nonblocking eventfd.
        unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }
}

struct Adopted {
    id: u64,
    work: Box<dyn AdoptedWork>,
}

struct State {
    verbs: Vec<Queued>,
    order: ShadowOrder,
    links: Vec<LinkWatch>,
    qps: Vec<Weak<dyn ServedQp>>,
    /// The round's registered QPs that are still there (kept to reuse its allocation).
    live: Vec<Arc<dyn ServedQp>>,
    adopted: Vec<Adopted>,
    next_id: u64,
    changes: Vec<LinkChange>,
    events: Vec<Event>,
}

pub(crate) struct ServiceInner {
    clock: Clock,
    threaded: bool,
    state: Mutex<State>,
    wake: WakeFd,
    stop: AtomicBool,
    /// The descriptors the service thread's last `poll(2)` found readable (sorted), for the
    /// next round to take: which control CQs signalled.
    ready: Mutex<Vec<RawFd>>,
    /// The control CQs, shared by the control channels of each device.
    control_cqs: ChannelCqs,
    /// The earliest deadline the service's QPs published (see [`DeadlineBoard`]).
    deadlines: DeadlineBoard,
    /// The management network's sockets, one per local address (`docs/failover.md` 5f).
    management: Mutex<Vec<Arc<crate::resilient::management::ManagementSocket>>>,
    /// The round's list of live control CQs (taken under the state's lock).
    control_cq_scratch: Mutex<Vec<Arc<ControlCq<ControlChannel>>>>,
}

/// What contexts and QPs hold of the service.
#[derive(Clone)]
pub(crate) struct ServiceHandle {
    inner: Arc<ServiceInner>,
}

/// The failover service of a process (or of one simulated host). Stops when dropped; QPs
/// adopted by it are dropped with it.
pub struct FailoverService {
    handle: ServiceHandle,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for FailoverService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FailoverService")
            .field("threaded", &self.handle.inner.threaded)
            .finish_non_exhaustive()
    }
}

/// How the service is started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceConfig {
    /// The core to pin the service thread to (unpinned with `None`).
    pub core: Option<usize>,
    /// The shadow verbs' order (best effort unless a test asks otherwise).
    pub shadow_order: ShadowOrder,
}

impl Default for ServiceConfig {
    fn default() -> ServiceConfig {
        ServiceConfig {
            core: None,
            shadow_order: ShadowOrder::BestEffort,
        }
    }
}

impl FailoverService {
    /// Starts the service on its own thread, on the real clock.
    pub fn start(config: ServiceConfig) -> std::io::Result<FailoverService> {
        let handle = ServiceHandle::new(Clock::real(), true, config.shadow_order)?;
        let inner = handle.inner.clone();
        let core = config.core;
        let thread = std::thread::Builder::new()
            .name("railshift-failover".into())
            .spawn(move || {
                if let Some(id) = core {
                    if !core_affinity::set_for_current(core_affinity::CoreId { id }) {
                        tracing::warn!(
                            core = id,
                            "failover service: could not pin; running unpinned"
                        );
                    }
                }
                service_loop(inner)
            })?;
        Ok(FailoverService {
            handle,
            thread: Some(thread),
        })
    }

    /// A service without a thread, stepped by [`FailoverService::run_once`] on `clock` (a
    /// virtual clock in deterministic simulations).
    pub fn manual(clock: Clock) -> std::io::Result<FailoverService> {
        Ok(FailoverService {
            handle: ServiceHandle::new(clock, false, ShadowOrder::BestEffort)?,
            thread: None,
        })
    }

    /// Whether the service has no thread of its own: whoever made it runs
    /// [`FailoverService::run_once`] (a simulation, or a run-to-completion lcore).
    pub fn is_manual(&self) -> bool {
        !self.handle.inner.threaded
    }

    /// Runs one round of everything the service does (see the module documentation) and
    /// returns when it next needs to run if nothing wakes it.
    pub fn run_once(&self) -> Option<Timestamp> {
        self.handle.run_once()
    }

    /// The clock the service and its QPs run on.
    pub fn clock(&self) -> &Clock {
        &self.handle.inner.clock
    }

    pub(crate) fn handle(&self) -> &ServiceHandle {
        &self.handle
    }
}

impl Drop for FailoverService {
    fn drop(&mut self) {
        self.handle.inner.stop.store(true, Ordering::Release);
        self.handle.inner.wake.signal();
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("failover service thread panicked");
            }
        }
        // Adopted QPs hold the service (through their context): drop them here, or they and
        // it would keep each other alive.
        let adopted = std::mem::take(&mut self.handle.lock().adopted);
        drop(adopted);
        let mut st = self.handle.lock();
        st.verbs.clear();
        st.links.clear();
    }
}

/// A [`ServiceHandle`] that does not keep the service alive (an adopted QP's).
#[derive(Debug, Clone)]
pub(crate) struct WeakServiceHandle {
    inner: Weak<ServiceInner>,
}

impl WeakServiceHandle {
    /// The service, if it still runs.
    pub fn upgrade(&self) -> Option<ServiceHandle> {
        self.inner.upgrade().map(|inner| ServiceHandle { inner })
    }
}

impl ServiceHandle {
    fn new(clock: Clock, threaded: bool, order: ShadowOrder) -> std::io::Result<ServiceHandle> {
        Ok(ServiceHandle {
            inner: Arc::new(ServiceInner {
                clock,
                threaded,
                state: Mutex::new(State {
                    verbs: Vec::new(),
                    order,
                    links: Vec::new(),
                    qps: Vec::new(),
                    live: Vec::new(),
                    adopted: Vec::new(),
                    next_id: 0,
                    changes: Vec::new(),
                    events: Vec::new(),
                }),
                wake: WakeFd::new()?,
                stop: AtomicBool::new(false),
                ready: Mutex::new(Vec::new()),
                control_cqs: ChannelCqs::default(),
                management: Mutex::new(Vec::new()),
                deadlines: DeadlineBoard::new(),
                control_cq_scratch: Mutex::new(Vec::new()),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn clock(&self) -> &Clock {
        &self.inner.clock
    }

    /// The control CQs new control channels take their place in.
    pub fn control_cqs(&self) -> &ChannelCqs {
        &self.inner.control_cqs
    }

    /// The service's management socket on `addr`, bound on first use.
    pub(crate) fn management_socket(
        &self,
        addr: std::net::IpAddr,
    ) -> std::io::Result<Arc<crate::resilient::management::ManagementSocket>> {
        let mut sockets = self
            .inner
            .management
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(s) = sockets
            .iter()
            .find(|s| s.local_addr().is_ok_and(|a| a.ip() == addr))
        {
            return Ok(s.clone());
        }
        let socket = Arc::new(crate::resilient::management::ManagementSocket::bind(addr)?);
        sockets.push(socket.clone());
        drop(sockets);
        // The thread sleeps on the new descriptor from its next round.
        self.inner.wake.signal();
        Ok(socket)
    }

    /// The board each QP of this service publishes its deadlines to.
    pub(crate) fn deadline_board(&self) -> DeadlineBoard {
        self.inner.deadlines.clone()
    }

    /// Queues a shadow verb.
    pub fn submit(&self, verb: impl PendingVerb + 'static) {
        self.lock().verbs.push(Queued {
            verb: Box::new(verb),
            parked_at: None,
        });
        self.nudge();
    }

    /// Registers a resilient QP: its control channel is polled and link changes of its
    /// devices go to its mailbox.
    pub fn register_qp<Q: ServedQp + 'static>(&self, qp: &Arc<Q>) {
        let qp: Weak<dyn ServedQp> = Arc::downgrade(qp) as Weak<Q>;
        self.lock().qps.push(qp);
    }

    /// Takes `work` over (see `resilient::qp::adopted`); the id gives it back.
    pub fn adopt(&self, work: Box<dyn AdoptedWork>) -> u64 {
        let mut st = self.lock();
        let id = st.next_id;
        st.next_id += 1;
        st.adopted.push(Adopted { id, work });
        drop(st);
        self.nudge();
        id
    }

    /// Gives back the work adopted as `id` (`None` if it is not there any more).
    pub fn give_back(&self, id: u64) -> Option<Box<dyn AdoptedWork>> {
        let mut st = self.lock();
        let at = st.adopted.iter().position(|a| a.id == id)?;
        Some(st.adopted.swap_remove(at).work)
    }

    /// Runs `f` on the work adopted as `id`, under the service's lock.
    pub fn with_adopted<R>(&self, id: u64, f: impl FnOnce(&dyn AdoptedWork) -> R) -> Option<R> {
        let st = self.lock();
        st.adopted
            .iter()
            .find(|a| a.id == id)
            .map(|a| f(a.work.as_ref()))
    }

    /// A handle that does not keep the service alive.
    pub fn downgrade(&self) -> WeakServiceHandle {
        WeakServiceHandle {
            inner: Arc::downgrade(&self.inner),
        }
    }

    /// Watches `ctx`'s link (once per device).
    pub fn watch(&self, ctx: &Arc<Context>, source: &LinkSource) {
        let mut st = self.lock();
        if st.links.iter().any(|l| Arc::ptr_eq(&l.ctx, ctx)) {
            return;
        }
        st.links.push(LinkWatch::new(ctx, source));
    }

    /// Gets the service to run soon: wakes the thread, or (without one) runs a round now if
    /// nobody else is.
    pub fn nudge(&self) {
        if self.inner.threaded {
            self.inner.wake.signal();
        } else if let Ok(st) = self.inner.state.try_lock() {
            drop(st);
            self.run_once();
        }
    }

    /// Between two looks at what a caller waits for (a rendezvous blob, the backup side's
    /// bring-up): 500 us of sleep while the service's own thread does the work; nothing for a
    /// manual service, which the caller's own loop runs.
    pub fn pause_for_service_thread(&self) {
        if self.inner.threaded {
            std::thread::sleep(Duration::from_micros(500));
        }
    }

    fn run_once(&self) -> Option<Timestamp> {
        let clock = &self.inner.clock;
        let mut guard = self.lock();
        let st = &mut *guard;
        let mut next: Option<Timestamp> = None;
        let mut soon = |t: Timestamp| next = Some(next.map_or(t, |n: Timestamp| n.min(t)));

        // 1. Shadow verbs, best effort (or strictly in order). A verb that waits for a change
        //    of this process is not run again until its count of changes moved.
        let mut waiting = false;
        let mut i = 0;
        while i < st.verbs.len() {
            let queued = &mut st.verbs[i];
            // Read before the run: a change during the run moves it after, and is not lost.
            let changes = queued.verb.changes();
            let outcome = if queued.parked_at == Some(changes) {
                None
            } else {
                Some(queued.verb.run())
            };
            match outcome {
                Some(Outcome::Done) => {
                    st.verbs.remove(i);
                    continue;
                }
                Some(Outcome::Waiting(what)) => {
                    tracing::trace!(what, "failover service: shadow verb waits");
                    queued.parked_at = Some(changes);
                }
                Some(Outcome::Retry(what)) => {
                    tracing::trace!(what, "failover service: shadow verb retries");
                    queued.parked_at = None;
                }
                None => {}
            }
            waiting = true;
            if st.order == ShadowOrder::Strict {
                break;
            }
            i += 1;
        }
        if waiting {
            soon(clock.now() + VERB_RETRY);
        }

        // 2. The registered QPs, upgraded (and those gone dropped) only when a link change or
        //    a due deadline needs them: one upgrade per QP, and none in a round that has
        //    neither, so an idle round's cost does not grow with the QPs.
        let mut live: Option<Vec<Arc<dyn ServedQp>>> = None;
        let upgrade = |qps: &mut Vec<Weak<dyn ServedQp>>, spare: &mut Vec<Arc<dyn ServedQp>>| {
            let mut out = std::mem::take(spare);
            qps.retain(|w| match w.upgrade() {
                Some(q) if !q.is_cancelled() => {
                    out.push(q);
                    true
                }
                _ => false,
            });
            out
        };

        // 3. Link changes.
        for li in 0..st.links.len() {
            st.changes.clear();
            let mut changes = std::mem::take(&mut st.changes);
            st.links[li].poll(&mut changes);
            let ctx = st.links[li].ctx.clone();
            if !changes.is_empty() && live.is_none() {
                live = Some(upgrade(&mut st.qps, &mut st.live));
            }
            let qps = live.as_deref().unwrap_or_default();
            for &change in &changes {
                let up = change == LinkChange::Up;
                tracing::info!(device = %ctx.name(), ?change, "failover service: link changed");
                let started = std::time::Instant::now();
                let mut told = 0usize;
                if !up {
                    // At once, not at each owner's next poll: the NIC stops working on the QPs
                    // and flushes them, so nothing waits for retry exhaustion. Every default
                    // QP of the device in one call: one device lock, not one per QP.
                    let to_err: Vec<&Arc<dyn ServedQp>> = qps
                        .iter()
                        .filter(|qp| {
                            qp.path_on(&ctx) == Some(Path::Default)
                                && qp.link_watch()
                                && qp.mailbox().watch_armed()
                        })
                        .collect();
                    let handles: Vec<&crate::control::QpHandle> = to_err
                        .iter()
                        .map(|qp| &qp.mailbox().default_handle)
                        .collect();
                    let mut results = Vec::with_capacity(handles.len());
                    crate::control::QpHandle::set_error_all(&handles, &mut results);
                    for (qp, result) in to_err.iter().zip(results) {
                        if let Err(e) = result {
                            tracing::debug!(qp = %qp.mailbox().name, error = %e, "link watch: default QP not moved to ERR");
                        }
                    }
                }
                for qp in qps {
                    let Some(path) = qp.path_on(&ctx) else {
                        continue;
                    };
                    let mailbox = qp.mailbox();
                    if change == LinkChange::DeviceFatal {
                        // Before the link-down: the round it starts must not wait for flushes.
                        mailbox.post(Mail::DeviceDead(path));
                    }
                    let event = if up {
                        Event::LinkUp { path }
                    } else {
                        Event::LinkDown { path }
                    };
                    mailbox.post(Mail::Event(event));
                    told += 1;
                }
                if up {
                    // A control message stuck on this device's path goes again now, not at
                    // its probe's next resend: the link is only a hint, but a cheap one.
                    self.inner
                        .control_cqs
                        .each_channel_on(&ctx, ControlChannel::path_may_be_back);
                }
                tracing::info!(device = %ctx.name(), ?change, qps = told, elapsed_us = started.elapsed().as_micros() as u64, "failover service: link change handed to every QP");
            }
            st.changes = changes;
        }

        // 4. Control messages: a poll of each shared control CQ (a few per device), each
        //    completion handed to its channel and what it brings to the channel's QP.
        let mut events = std::mem::take(&mut st.events);
        let ready =
            std::mem::take(&mut *self.inner.ready.lock().unwrap_or_else(|p| p.into_inner()));
        let mut cqs = std::mem::take(
            &mut *self
                .inner
                .control_cq_scratch
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        self.inner.control_cqs.live(&mut cqs);
        let deliver = |channel: &super::channel::ControlChannel, events: &mut Vec<Event>| {
            if let Some(owner) = channel.owner() {
                for e in events.drain(..) {
                    owner.post_event(e);
                }
            }
        };
        for cq in &cqs {
            if self.inner.threaded {
                if !cq.needs_rearm(&ready) {
                    // Armed, and its descriptor was quiet: nothing came since the last poll.
                    // Only the CQs that signalled cost system calls.
                    continue;
                }
                // The thread sleeps on the CQ: take its event, poll, arm, and poll again for
                // what came before the arm.
                cq.clear_event();
                cq.poll(&mut events, deliver);
                cq.arm();
                cq.poll(&mut events, deliver);
            } else {
                // Nobody sleeps on it (a simulation or a run-to-completion lcore): a poll of
                // the CQ is all, without system calls.
                cq.poll(&mut events, deliver);
            }
        }
        cqs.clear();
        *self
            .inner
            .control_cq_scratch
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = cqs;
        events.clear();
        st.events = events;

        // 4b. The management network (`docs/failover.md` 5f): what arrived, and resends.
        let sockets = self
            .inner
            .management
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for socket in &sockets {
            if let Some(due) = socket.poll(clock.now()) {
                soon(due);
            }
        }

        // 5. Owners whose timers are due: walked only once the earliest deadline published
        //    has come. The board is cleared before the walk reads the deadlines and lowered
        //    again by each one read, overdue ones included (their owners are woken each
        //    round until they publish a later one, as before the board).
        let now = clock.now();
        let board = &self.inner.deadlines;
        match board.earliest() {
            Some(earliest) if earliest <= now => {
                board.clear();
                let qps = live.get_or_insert_with(|| upgrade(&mut st.qps, &mut st.live));
                for qp in qps.iter() {
                    if let Some(due) = qp.mailbox().deadline() {
                        board.lower_to(due.as_nanos());
                        if due <= now {
                            qp.mailbox().wake();
                        } else {
                            soon(due);
                        }
                    }
                }
            }
            Some(earliest) => soon(earliest),
            None => {}
        }

        // 6. Adopted QPs.
        for a in st.adopted.iter_mut() {
            if a.work.needs_progress(now) {
                a.work.progress();
            }
            if a.work.busy() {
                soon(now + BUSY_RETRY);
            }
            if let Some(t) = a.work.next_deadline() {
                soon(t);
            }
        }
        if let Some(mut qps) = live {
            qps.clear();
            st.live = qps;
        }
        next
    }

    /// The descriptors the service thread sleeps on.
    fn fds(&self, out: &mut Vec<RawFd>) {
        out.clear();
        out.push(self.inner.wake.fd.as_raw_fd());
        let st = self.lock();
        for l in &st.links {
            l.fds(out);
        }
        drop(st);
        let mut cqs = Vec::new();
        self.inner.control_cqs.live(&mut cqs);
        out.extend(cqs.iter().filter_map(|cq| cq.event_fd()));
        out.extend(
            self.inner
                .management
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .map(|s| s.fd()),
        );
    }
}

fn service_loop(inner: Arc<ServiceInner>) {
    let handle = ServiceHandle { inner };
    let mut fds = Vec::new();
    let mut pollfds: Vec<libc::pollfd> = Vec::new();
    while !handle.inner.stop.load(Ordering::Acquire) {
        let next = handle.run_once();
        let timeout = next
            .map_or(MAX_SLEEP, |t| handle.inner.clock.until(t))
            .min(MAX_SLEEP);
        if timeout.is_zero() {
            continue;
        }
        handle.fds(&mut fds);
        pollfds.clear();
        pollfds.extend(fds.iter().map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        }));
        let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        // SAFETY: a live array of pollfds of the given length.
        unsafe { libc::poll(pollfds.as_mut_ptr(), pollfds.len() as libc::nfds_t, ms) };
        handle.inner.wake.drain();
        let mut ready = handle.inner.ready.lock().unwrap_or_else(|p| p.into_inner());
        ready.extend(pollfds.iter().filter(|p| p.revents != 0).map(|p| p.fd));
        ready.sort_unstable();
        ready.dedup();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, AtomicUsize};

    /// A verb that waits until `ready`, counting its runs; `changes` is its count of changes.
    struct CountedVerb {
        runs: Arc<AtomicUsize>,
        changes: Arc<AtomicU64>,
        ready: Arc<AtomicBool>,
        /// Waits for something outside the process ([`Outcome::Retry`]).
        outside: bool,
    }

    impl PendingVerb for CountedVerb {
        fn run(&self) -> Outcome {
            self.runs.fetch_add(1, Ordering::Relaxed);
            if self.ready.load(Ordering::Relaxed) {
                Outcome::Done
            } else if self.outside {
                Outcome::Retry("the test's store")
            } else {
                Outcome::Waiting("the test's flag")
            }
        }

        fn changes(&self) -> u64 {
            self.changes.load(Ordering::Relaxed)
        }
    }

    struct Fixture {
        service: FailoverService,
        runs: Arc<AtomicUsize>,
        changes: Arc<AtomicU64>,
        ready: Arc<AtomicBool>,
    }

    /// A manual service with one counted verb submitted (the submit's nudge runs it once).
    fn one_waiting_verb(outside: bool) -> Fixture {
        let service = FailoverService::manual(Clock::virtual_nanos(Arc::default())).unwrap();
        let fixture = Fixture {
            service,
            runs: Arc::default(),
            changes: Arc::default(),
            ready: Arc::default(),
        };
        fixture.service.handle().submit(CountedVerb {
            runs: fixture.runs.clone(),
            changes: fixture.changes.clone(),
            ready: fixture.ready.clone(),
            outside,
        });
        assert_eq!(fixture.runs.load(Ordering::Relaxed), 1);
        fixture
    }

    impl Fixture {
        fn rounds(&self, n: usize) -> Option<Timestamp> {
            let mut next = None;
            for _ in 0..n {
                next = self.service.run_once();
            }
            next
        }

        fn runs(&self) -> usize {
            self.runs.load(Ordering::Relaxed)
        }

        fn queued(&self) -> usize {
            self.service.handle().lock().verbs.len()
        }
    }

    #[test]
    fn a_waiting_verb_runs_again_only_once_its_count_of_changes_moved() {
        let f = one_waiting_verb(false);
        // Before the count of changes, each of these rounds ran the verb again (101 runs).
        let next = f.rounds(100);
        assert_eq!(f.runs(), 1, "no change: not run again");
        assert!(
            next.is_some(),
            "a waiting verb still asks for a retry round"
        );
        f.changes.fetch_add(1, Ordering::Relaxed);
        f.rounds(10);
        assert_eq!(f.runs(), 2, "one change: run once more, then parked again");
        f.ready.store(true, Ordering::Relaxed);
        f.changes.fetch_add(1, Ordering::Relaxed);
        f.rounds(10);
        assert_eq!((f.runs(), f.queued()), (3, 0), "ready: done and dropped");
    }

    #[test]
    fn a_verb_waiting_outside_the_process_runs_every_round() {
        let f = one_waiting_verb(true);
        f.rounds(10);
        assert_eq!(f.runs(), 11);
        f.ready.store(true, Ordering::Relaxed);
        f.rounds(1);
        assert_eq!((f.runs(), f.queued()), (12, 0));
    }
}
