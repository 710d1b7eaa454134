//! The device object and its control verbs: open, PD, MR, CQ, QP, modify/query/destroy,
//! counters, events, and manual progress.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use thiserror::Error;

use crate::clock::Clock;
use crate::counters::Counters;
use crate::cq::{Cq, CqConfig, CqHandle, CqId};
use crate::engine::{ActiveQps, Activity, Core, CoreLock, QpNumbers, Shared};
use crate::events::EventQueue;
use crate::fabric::Fabric;
use crate::medium::WireImpl;
use crate::mr::{Access, MrTable, PdId, RegError};
use crate::path_budget::PathBudgets;
use crate::qp::{Bell, DoorbellRegister, ErrorCtx, Qp, QpConfig, RetransmitProbe};
use crate::qp_attr::{check_transition, ModifyError, QpAttrs, QpState, QpType};
use crate::requester;
use crate::srq::{self, SrqConfig, SrqId, SrqRing};
use crate::trace::Trace;
use crate::tx::BATCH;
pub use crate::udp::SendPath;
use crate::udp::{rxe_source_port, UdpWire};
use crate::waker::Waker;
use crate::wire::{Batch, PortState};

/// Where a device sends and receives.
#[derive(Clone, Debug)]
pub enum Wire {
    /// RoCEv2 over UDP on a netdev: a socket on `addr:4791` bound to `netdev`.
    Udp {
        /// The netdev (SO_BINDTODEVICE).
        netdev: String,
        /// The local address; GID 0.
        addr: IpAddr,
    },
    /// A port of an in-memory fabric.
    Fabric {
        /// The fabric.
        fabric: Fabric,
        /// The port index (from `Fabric::add_port`).
        port: usize,
    },
}

/// Who drives the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProgressMode {
    /// An engine thread that sleeps when idle (the default).
    #[default]
    Auto,
    /// An engine thread that never sleeps (opt-in; costs a core).
    BusyPoll,
    /// No thread: the caller calls [`Device::progress`].
    Manual,
}

/// How to open a device.
#[derive(Clone, Debug)]
pub struct DeviceConfig {
    /// A name for logs.
    pub name: String,
    /// The wire.
    pub wire: Wire,
    /// Who drives it.
    pub progress: ProgressMode,
    /// Where time comes from. A real clock on a fabric wire is replaced by the fabric's
    /// ([`crate::Fabric::clock`]): its devices share one time base.
    pub clock: Clock,
    /// Write every packet sent and received to this pcap file.
    pub pcap: Option<PathBuf>,
    /// Draw memory-key variants from this seed (a replayable simulation) instead of from the
    /// OS's entropy (the default: a peer cannot predict the next rkey).
    pub key_seed: Option<u64>,
    /// How a UDP wire sends (the fabric ignores it).
    pub send_path: SendPath,
}

impl DeviceConfig {
    /// A config with the defaults: auto progress, real clock, no trace.
    pub fn new(name: impl Into<String>, wire: Wire) -> DeviceConfig {
        DeviceConfig {
            name: name.into(),
            wire,
            progress: ProgressMode::Auto,
            clock: Clock::real(),
            pcap: None,
            key_seed: None,
            send_path: SendPath::Frames,
        }
    }
}

/// Keys of a registered MR (equal on softnic, as on a ConnectX).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MrKeys {
    /// For local gather/scatter lists.
    pub lkey: u32,
    /// For a peer's RDMA operations.
    pub rkey: u32,
}

/// What `create_qp` returns.
#[derive(Clone, Debug)]
pub struct QpHandle {
    /// The QP number.
    pub qpn: u32,
    /// The doorbell register to write after the doorbell record.
    pub doorbell: DoorbellRegister,
}

/// Why a control verb failed.
#[derive(Debug, Error)]
pub enum DeviceError {
    /// Opening the wire failed.
    #[error("cannot open the wire: {0}")]
    Io(#[from] std::io::Error),
    /// The fabric has no such port.
    #[error("the fabric has no port {0}")]
    NoSuchPort(usize),
    /// A queue configuration is unusable.
    #[error("invalid configuration: {0}")]
    InvalidConfig(&'static str),
    /// No such protection domain.
    #[error("unknown protection domain {0:?}")]
    UnknownPd(PdId),
    /// No such CQ.
    #[error("unknown CQ {0:?}")]
    UnknownCq(CqId),
    /// No such QP.
    #[error("unknown QP {0:#x}")]
    UnknownQp(u32),
    /// No such SRQ.
    #[error("unknown SRQ {0:?}")]
    UnknownSrq(SrqId),
    /// No MR has this key.
    #[error("no MR has key {0:#x}")]
    UnknownKey(u32),
    /// The object is still used by others.
    #[error("{0} is still in use")]
    Busy(&'static str),
    /// The device refuses the move to RTR for now ([`Device::refuse_rtr`]).
    #[error("QP {0:#x} cannot enter RTR yet: the device is recovering")]
    NotReady(u32),
    /// A memory registration was refused.
    #[error(transparent)]
    Register(#[from] RegError),
    /// A QP transition was refused.
    #[error(transparent)]
    Modify(#[from] ModifyError),
    /// The pcap trace could not be opened.
    #[error("cannot open the pcap trace: {0}")]
    Trace(std::io::Error),
}

/// A softnic device: one port, its wire, its objects, and (in auto mode) its engine thread.
pub struct Device {
    shared: Arc<Shared>,
    engine: Option<JoinHandle<()>>,
    mode: ProgressMode,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Device({}, {})",
            self.shared.name, self.shared.local_addr
        )
    }
}

impl Device {
    /// Opens a device on its wire; in auto mode starts its engine thread.
    pub fn open(mut cfg: DeviceConfig) -> Result<Device, DeviceError> {
        if let (Wire::Fabric { fabric, .. }, Clock::Real(_)) = (&cfg.wire, &cfg.clock) {
            // Arrival times on a fabric are compared across its devices: one time base.
            cfg.clock = fabric.clock();
        }
        let waker = Arc::new(Waker::new(cfg.progress != ProgressMode::Manual)?);
        let mut wire = match &cfg.wire {
            Wire::Udp { netdev, addr } => {
                WireImpl::Udp(Box::new(UdpWire::open(netdev, *addr, cfg.send_path)?))
            }
            Wire::Fabric { fabric, port } => {
                WireImpl::Fabric(fabric.port(*port).ok_or(DeviceError::NoSuchPort(*port))?)
            }
        };
        wire.attach_waker(waker.clone());
        let local_addr = wire.local_addr();
        let port = wire.port_state(cfg.clock.now());
        let reported_port = wire.reported_port_state(cfg.clock.now());
        let trace = match &cfg.pcap {
            Some(path) => Some(Trace::create(path, cfg.clock.now()).map_err(DeviceError::Trace)?),
            None => None,
        };
        let fds = wire.poll_fds();
        let error_notice_fds = wire.error_notice_fds();
        let core = Core {
            wire,
            local_addr,
            port,
            reported_port,
            mrs: MrTable::new(cfg.key_seed),
            qpns: QpNumbers::new(cfg.key_seed),
            pds: Vec::new(),
            cqs: Vec::new(),
            qps: Vec::new(),
            srqs: Vec::new(),
            counters: Counters::default(),
            retired: Counters::default(),
            rx: Batch::new(BATCH),
            tx: Batch::new(BATCH),
            trace,
            dead: false,
            refuse_rtr_until: None,
            slow_completions_until: None,
            active: ActiveQps::default(),
            paths: PathBudgets::default(),
            unread_rounds: 0,
        };
        let shared = Arc::new(Shared {
            name: cfg.name.clone(),
            core: CoreLock::new(core),
            waker: waker.clone(),
            clock: cfg.clock.clone(),
            events: Arc::new(EventQueue::new()?),
            stop: AtomicBool::new(false),
            local_addr,
        });
        let engine = match cfg.progress {
            ProgressMode::Manual => None,
            mode => {
                let s = shared.clone();
                let mut fds = fds;
                fds.extend(waker.fd());
                let busy = mode == ProgressMode::BusyPoll;
                Some(
                    std::thread::Builder::new()
                        .name(format!("softnic-{}", cfg.name))
                        .spawn(move || {
                            crate::engine::run_engine(s, fds, &error_notice_fds, busy)
                        })?,
                )
            }
        };
        tracing::info!(name = %cfg.name, addr = %local_addr, mode = ?cfg.progress, "softnic device open");
        Ok(Device {
            shared,
            engine,
            mode: cfg.progress,
        })
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The local address (GID 0 in address form).
    pub fn addr(&self) -> IpAddr {
        self.shared.local_addr
    }

    /// GID 0: the address, IPv4-mapped for IPv4 as RoCEv2 does.
    pub fn gid(&self) -> [u8; 16] {
        match self.shared.local_addr {
            IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
            IpAddr::V6(a) => a.octets(),
        }
    }

    /// The progress mode.
    pub fn mode(&self) -> ProgressMode {
        self.mode
    }

    /// The device's clock.
    pub fn clock(&self) -> &Clock {
        &self.shared.clock
    }

    /// The port's link state as reported to the driver, as of the last round (a fabric's
    /// report rule can make it late or wrong; packets follow the physical state).
    pub fn port_state(&self) -> PortState {
        self.shared.lock_core().reported_port
    }

    /// Async events (port active/error, QP fatal, CQ error, device fatal).
    pub fn events(&self) -> &EventQueue {
        &self.shared.events
    }

    /// The device dies silently, as a ConnectX does after a firmware assert or a PCIe
    /// surprise removal: from now on it writes no completion (no flush either), sends and
    /// receives no packet and runs no timer, and its port state stays as it was (the netdev is
    /// up). Control verbs still change the objects (as the kernel's software cleanup does) but
    /// a QP moved to ERR flushes nothing. The device raises [`AsyncEvent::DeviceFatal`] once.
    /// It never comes back. Killing a dead device does nothing.
    ///
    /// [`AsyncEvent::DeviceFatal`]: crate::AsyncEvent::DeviceFatal
    pub fn kill(&self) {
        let mut core = self.shared.lock_core();
        if core.dead {
            return;
        }
        core.dead = true;
        drop(core);
        tracing::warn!(device = %self.shared.name, "softnic device killed: it does nothing more");
        self.shared.events.push(crate::AsyncEvent::DeviceFatal);
    }

    /// Every QP that is not in RESET or ERR enters ERR, flushing what is posted on it, while
    /// the device and its link stay up: a NIC that recovered from an internal error by
    /// failing its QPs. For failure injection.
    pub fn fail_qps(&self) {
        let mut guard = self.shared.lock_core();
        let core = &mut *guard;
        let mut ectx = ErrorCtx {
            cqs: &mut core.cqs,
            events: &self.shared.events,
        };
        let mut failed = 0usize;
        for qp in core.qps.iter_mut().flatten() {
            if matches!(qp.state, QpState::Reset | QpState::Err) {
                continue;
            }
            qp.enter_error(None, &mut ectx);
            // Rounds flush what is posted.
            core.active.mark(qp);
            failed += 1;
        }
        drop(guard);
        tracing::warn!(device = %self.shared.name, qps = failed, "softnic: every QP moved to ERR (injected)");
        self.shared.waker.wake();
    }

    /// The port reports its link down, then up again (two async events), whether or not the
    /// device is dead, and nothing else changes: what a netdev watch reports when a device
    /// reset flaps the netdev of a NIC that died. For failure injection.
    pub fn flap_link(&self) {
        tracing::warn!(device = %self.shared.name, "softnic: link reported down and up (injected)");
        self.shared.events.push(crate::AsyncEvent::PortError);
        self.shared.events.push(crate::AsyncEvent::PortActive);
        self.shared.waker.wake();
    }

    /// For `for_how_long` from now the device refuses every move to RTR (and nothing else
    /// changes): a NIC that recovered from an error and is not ready to connect yet.
    /// For failure injection.
    pub fn refuse_rtr(&self, for_how_long: Duration) {
        let until = self.shared.clock.now() + for_how_long;
        self.shared.lock_core().refuse_rtr_until = Some(until);
        tracing::warn!(device = %self.shared.name, ?for_how_long, "softnic: moves to RTR refused (injected)");
    }

    /// For `for_how_long` from now the device holds back every CQE it writes, then writes them
    /// all, in order (the QPs go on executing and acknowledging meanwhile): a NIC that is slow
    /// to complete but alive. A QP reset forgets its held CQEs. For failure injection.
    pub fn slow_completions(&self, for_how_long: Duration) {
        let until = self.shared.clock.now() + for_how_long;
        let mut core = self.shared.lock_core();
        core.slow_completions_until = Some(until);
        for cq in core.cqs.iter_mut().flatten() {
            cq.hold();
        }
        drop(core);
        tracing::warn!(device = %self.shared.name, ?for_how_long, "softnic: completions held back (injected)");
        self.shared.waker.wake();
    }

    /// Whether [`Device::kill`] was called.
    pub fn is_dead(&self) -> bool {
        self.shared.lock_core().dead
    }

    /// Manual progress: one round of work at `now` (the device clock's time). Harmless in auto
    /// mode (it runs a round on the caller's thread).
    pub fn progress(&self, now: Duration) -> Activity {
        self.shared.lock_core().round(
            now,
            &self.shared.clock,
            &self.shared.waker,
            &self.shared.events,
        )
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> PdId {
        let mut core = self.shared.lock_core();
        let i = match core.pds.iter().position(|used| !used) {
            Some(i) => i,
            None => {
                core.pds.push(false);
                core.pds.len() - 1
            }
        };
        core.pds[i] = true;
        PdId(i as u32 + 1)
    }

    /// Frees a protection domain that no MR or QP uses.
    pub fn dealloc_pd(&self, pd: PdId) -> Result<(), DeviceError> {
        let mut core = self.shared.lock_core();
        check_pd(&core, pd)?;
        if core.mrs.any_in_pd(pd)
            || core.qps.iter().flatten().any(|q| q.pd == pd)
            || core.srqs.iter().flatten().any(|s| srq::lock(s).pd == pd)
        {
            return Err(DeviceError::Busy("protection domain"));
        }
        core.pds[pd.0 as usize - 1] = false;
        Ok(())
    }

    /// Registers `len` bytes at `addr` with `access`.
    ///
    /// # Safety
    /// The range must stay mapped (readable, and writable if any write access is granted)
    /// until [`Device::dereg_mr`], as with `ibv_reg_mr`: the device reads and writes it from
    /// its engine at any time, concurrently with the caller.
    pub unsafe fn reg_mr(
        &self,
        pd: PdId,
        addr: *const u8,
        len: usize,
        access: Access,
    ) -> Result<MrKeys, DeviceError> {
        let mut core = self.shared.lock_core();
        check_pd(&core, pd)?;
        let key = core.mrs.insert(pd, addr as u64, len as u64, access)?;
        Ok(MrKeys {
            lkey: key,
            rkey: key,
        })
    }

    /// Deregisters an MR; its keys stop working at once.
    pub fn dereg_mr(&self, lkey: u32) -> Result<(), DeviceError> {
        let mut core = self.shared.lock_core();
        core.mrs
            .remove(lkey)
            .map(|_| ())
            .ok_or(DeviceError::UnknownKey(lkey))
    }

    /// Creates a CQ over the caller's ring and consumer-index record.
    pub fn create_cq(&self, cfg: CqConfig) -> Result<CqHandle, DeviceError> {
        let mut core = self.shared.lock_core();
        let i = core
            .cqs
            .iter()
            .position(|c| c.is_none())
            .unwrap_or(core.cqs.len());
        let (cq, handle) = Cq::new(CqId(i as u32), cfg).map_err(DeviceError::InvalidConfig)?;
        if i == core.cqs.len() {
            core.cqs.push(Some(cq));
        } else {
            core.cqs[i] = Some(cq);
        }
        Ok(handle)
    }

    /// Destroys a CQ no QP uses.
    pub fn destroy_cq(&self, cq: CqId) -> Result<(), DeviceError> {
        let mut core = self.shared.lock_core();
        if core.cqs.get(cq.0 as usize).is_none_or(|c| c.is_none()) {
            return Err(DeviceError::UnknownCq(cq));
        }
        if core
            .qps
            .iter()
            .flatten()
            .any(|q| q.send_cq == cq || q.recv_cq == cq)
        {
            return Err(DeviceError::Busy("CQ"));
        }
        core.cqs[cq.0 as usize] = None;
        Ok(())
    }

    /// Creates a QP (RC or UD, as `cfg.qp_type` says) in RESET over the caller's rings and
    /// doorbell record.
    pub fn create_qp(&self, cfg: QpConfig) -> Result<QpHandle, DeviceError> {
        let mut core = self.shared.lock_core();
        check_pd(&core, cfg.pd)?;
        for cq in [cfg.send_cq, cfg.recv_cq] {
            if core.cqs.get(cq.0 as usize).is_none_or(|c| c.is_none()) {
                return Err(DeviceError::UnknownCq(cq));
            }
        }
        let i = core
            .qps
            .iter()
            .position(|q| q.is_none())
            .unwrap_or(core.qps.len());
        if i >= 1 << 20 {
            // A QPN is drawn among those no live QP has; keep that space mostly free.
            return Err(DeviceError::InvalidConfig("out of QP numbers"));
        }
        let qpn = core.qpns.allocate(i as u32);
        let bell = Arc::new(Bell::new(i as u32));
        let qp = match Qp::new(qpn, cfg, bell.clone(), rxe_source_port(qpn)) {
            Ok(qp) => qp,
            Err(e) => {
                core.qpns.release(qpn);
                return Err(DeviceError::InvalidConfig(e));
            }
        };
        if i == core.qps.len() {
            core.qps.push(Some(qp));
        } else {
            core.qps[i] = Some(qp);
        }
        Ok(QpHandle {
            qpn,
            doorbell: DoorbellRegister::new(bell, self.shared.waker.clone()),
        })
    }

    /// Creates an RC QP in RESET that takes its receive WQEs from `srq` instead of its own
    /// receive ring (which the driver leaves empty; `cfg.rq` may be the smallest ring).
    pub fn create_qp_with_srq(&self, cfg: QpConfig, srq: SrqId) -> Result<QpHandle, DeviceError> {
        if cfg.qp_type != QpType::Rc {
            return Err(DeviceError::InvalidConfig(
                "only RC QPs take their receives from an SRQ",
            ));
        }
        let shared = {
            let core = self.shared.lock_core();
            let s = core
                .srqs
                .get(srq.0 as usize)
                .and_then(|s| s.clone())
                .ok_or(DeviceError::UnknownSrq(srq))?;
            if srq::lock(&s).pd != cfg.pd {
                return Err(DeviceError::InvalidConfig(
                    "the QP and its SRQ are in different protection domains",
                ));
            }
            s
        };
        let handle = self.create_qp(cfg)?;
        let mut core = self.shared.lock_core();
        let qp = core
            .qp_mut(handle.qpn)
            .ok_or(DeviceError::UnknownQp(handle.qpn))?;
        // In RESET until the driver modifies it, so no packet has met it without its SRQ.
        qp.srq = Some(shared);
        Ok(handle)
    }

    /// Creates a shared receive queue over the caller's ring and doorbell record.
    pub fn create_srq(&self, cfg: SrqConfig) -> Result<SrqId, DeviceError> {
        let mut core = self.shared.lock_core();
        check_pd(&core, cfg.pd)?;
        let i = core
            .srqs
            .iter()
            .position(|s| s.is_none())
            .unwrap_or(core.srqs.len());
        let id = SrqId(i as u32);
        let ring = SrqRing::new(id, cfg).map_err(DeviceError::InvalidConfig)?;
        if i == core.srqs.len() {
            core.srqs.push(Some(ring.into_shared()));
        } else {
            core.srqs[i] = Some(ring.into_shared());
        }
        Ok(id)
    }

    fn srq(&self, id: SrqId) -> Result<srq::SharedSrq, DeviceError> {
        self.shared
            .lock_core()
            .srqs
            .get(id.0 as usize)
            .and_then(|s| s.clone())
            .ok_or(DeviceError::UnknownSrq(id))
    }

    /// Sets an SRQ's limit (`ibv_modify_srq`): non-zero arms it, zero disarms it. It must be
    /// below the SRQ's number of WQEs.
    pub fn modify_srq(&self, id: SrqId, limit: u32) -> Result<(), DeviceError> {
        let s = self.srq(id)?;
        let r = srq::lock(&s).set_limit(limit);
        r.map_err(DeviceError::InvalidConfig)
    }

    /// An SRQ's limit (zero when disarmed, as `ibv_query_srq` reports it) and the receives
    /// posted and not consumed.
    pub fn query_srq(&self, id: SrqId) -> Result<(u32, u32), DeviceError> {
        let s = self.srq(id)?;
        let r = srq::lock(&s);
        let (limit, armed) = r.limit();
        Ok((if armed { limit } else { 0 }, r.available()))
    }

    /// Destroys an SRQ no QP uses.
    pub fn destroy_srq(&self, id: SrqId) -> Result<(), DeviceError> {
        let mut core = self.shared.lock_core();
        let Some(Some(s)) = core.srqs.get(id.0 as usize) else {
            return Err(DeviceError::UnknownSrq(id));
        };
        let s = s.clone();
        if core
            .qps
            .iter()
            .flatten()
            .any(|q| q.srq.as_ref().is_some_and(|q| Arc::ptr_eq(q, &s)))
        {
            return Err(DeviceError::Busy("SRQ"));
        }
        core.srqs[id.0 as usize] = None;
        Ok(())
    }

    /// Covers the next transmission of QP `qpn` with a short ACK timeout, once: the next time
    /// its ACK timer starts (or now, if a timer running would fire later) it runs for
    /// `timeout` instead of the QP's `timeout` attribute. When it fires the QP goes back N
    /// without spending a retry; any acknowledgment first puts the normal timer back. What a
    /// driver asks for after it re-posts work on a QP (a failover onto a backup), so that a
    /// first transmission lost there is resent in `timeout`, not after the full RC timeout.
    pub fn arm_short_retransmit(&self, qpn: u32, timeout: Duration) -> Result<(), DeviceError> {
        if timeout.is_zero() {
            return Err(DeviceError::InvalidConfig(
                "a short retransmit timeout must be longer than zero",
            ));
        }
        let now = self.shared.clock.now();
        self.with_qp_marked(qpn, |qp| match qp.req.timer {
            Some(t) if now + timeout < t => {
                qp.req.timer = Some(now + timeout);
                qp.req.short_deadline = qp.req.timer;
                qp.req.short_timeout = None;
            }
            // A timer already due sooner covers it.
            Some(_) => qp.req.short_timeout = None,
            None => qp.req.short_timeout = Some(timeout),
        })
    }

    /// Gives QP `qpn` a retransmit probe ([`RetransmitProbe`]): while it has packets
    /// unacknowledged it resends them at a backoff from `probe.first` doubling to `probe.cap`,
    /// spending no retry and leaving its ACK timer's deadline where it was. Kept until the QP
    /// is reset. What a driver asks of a control QP whose messages must get through as soon
    /// as a flapping path carries packets, not at the next full ACK timeout.
    pub fn set_retransmit_probe(
        &self,
        qpn: u32,
        probe: RetransmitProbe,
    ) -> Result<(), DeviceError> {
        if probe.first.is_zero() || probe.cap < probe.first {
            return Err(DeviceError::InvalidConfig(
                "a retransmit probe needs a first wait above zero and a cap not below it",
            ));
        }
        let now = self.shared.clock.now();
        self.with_qp_marked(qpn, |qp| {
            qp.req.probe = Some(probe);
            if qp.req.probe_at.is_none() && requester::unacknowledged(qp) {
                requester::start_probe(qp, probe, now);
            }
        })
    }

    /// Resends what QP `qpn` has unacknowledged now (go-back-N from the oldest), spending no
    /// retry and leaving its ACK timer where it was; a probe's backoff starts over. Nothing
    /// happens if everything was acknowledged. What a driver asks for when it learns that the
    /// path may carry packets again (its link reported up, a message from the peer).
    pub fn retransmit_now(&self, qpn: u32) -> Result<(), DeviceError> {
        let now = self.shared.clock.now();
        self.with_qp_marked(qpn, |qp| {
            qp.req.probe_at = Some(now);
            if let Some(p) = qp.req.probe {
                qp.req.probe_next = p.first;
            }
        })
    }

    /// Runs `f` on QP `qpn` under the device's lock, then puts the QP on the active list and
    /// wakes the engine, so that a timer `f` set is watched.
    fn with_qp_marked(&self, qpn: u32, f: impl FnOnce(&mut Qp)) -> Result<(), DeviceError> {
        let mut guard = self.shared.lock_core();
        let core = &mut *guard;
        let qp = core
            .qp_index(qpn)
            .and_then(|i| core.qps.get_mut(i))
            .and_then(|q| q.as_mut())
            .ok_or(DeviceError::UnknownQp(qpn))?;
        f(qp);
        core.active.mark(qp);
        drop(guard);
        self.shared.waker.wake();
        Ok(())
    }

    /// Moves a QP to `state` with `attrs` (`ibv_modify_qp`).
    pub fn modify_qp(&self, qpn: u32, state: QpState, attrs: &QpAttrs) -> Result<(), DeviceError> {
        let mut guard = self.shared.lock_core();
        let core = &mut *guard;
        let qp = core
            .qp_index(qpn)
            .and_then(|i| core.qps.get_mut(i))
            .and_then(|q| q.as_mut())
            .ok_or(DeviceError::UnknownQp(qpn))?;
        check_transition(qp.qp_type, qp.state, state, attrs)?;
        let now = self.shared.clock.now();
        if state == QpState::Rtr && core.refuse_rtr_until.is_some_and(|until| now < until) {
            return Err(DeviceError::NotReady(qpn));
        }
        match state {
            QpState::Reset => {
                qp.reset();
                qp.settle_path(&mut core.paths);
                // Its CQEs are only ever in its own two CQs: not a walk of every CQ of the
                // device, which made a reset of each of 1,000 QPs cost 1,000 CQ visits.
                for id in [qp.send_cq, qp.recv_cq] {
                    if let Some(Some(cq)) = core.cqs.get_mut(id.0 as usize) {
                        cq.forget_held(qpn);
                    }
                }
            }
            QpState::Err if core.dead => {
                // A dead device flushes nothing.
                qp.attrs.merge(attrs);
                qp.state = QpState::Err;
                qp.settle_path(&mut core.paths);
                return Ok(());
            }
            QpState::Err => {
                let mut ectx = ErrorCtx {
                    cqs: &mut core.cqs,
                    events: &self.shared.events,
                };
                qp.attrs.merge(attrs);
                qp.enter_error(None, &mut ectx);
                qp.settle_path(&mut core.paths);
                // Rounds flush what is posted from now on.
                core.active.mark(qp);
                return Ok(());
            }
            _ => {}
        }
        qp.apply(state, attrs);
        if state == QpState::Rtr && attrs.dest_addr.is_some() && qp.qp_type == QpType::Rc {
            qp.attach_path(&mut core.paths);
        }
        qp.settle_path(&mut core.paths);
        core.active.mark(qp);
        if state == QpState::Rtr {
            // Connected: its first packet must not open a socket on the datapath, and the
            // peer's MAC address is resolved now, once, as a RoCE NIC's address vector is.
            let src_port = qp.src_port;
            let peer = qp.peer().map(|(addr, _)| addr);
            core.wire.prepare_source_port(src_port);
            if let Some(peer) = peer {
                core.wire.prepare_peer(peer);
            }
        }
        drop(guard);
        // The engine may have work now (e.g. WQEs rung while in RTR).
        self.shared.waker.wake();
        Ok(())
    }

    /// Moves every QP of `qpns` to ERR (as [`Device::modify_qp`] to ERR does, flushing what
    /// is posted), under one lock of the device: what a link-down does to every QP of the
    /// device at once. One result per QP, in order, in `out` (cleared first).
    pub fn set_qps_error(&self, qpns: &[u32], out: &mut Vec<Result<(), DeviceError>>) {
        out.clear();
        let attrs = QpAttrs::default();
        let mut guard = self.shared.lock_core();
        let core = &mut *guard;
        for &qpn in qpns {
            let Some(qp) = core
                .qp_index(qpn)
                .and_then(|i| core.qps.get_mut(i))
                .and_then(|q| q.as_mut())
            else {
                out.push(Err(DeviceError::UnknownQp(qpn)));
                continue;
            };
            if let Err(e) = check_transition(qp.qp_type, qp.state, QpState::Err, &attrs) {
                out.push(Err(e.into()));
                continue;
            }
            if core.dead {
                // A dead device flushes nothing.
                qp.state = QpState::Err;
            } else {
                let mut ectx = ErrorCtx {
                    cqs: &mut core.cqs,
                    events: &self.shared.events,
                };
                qp.enter_error(None, &mut ectx);
                // Rounds flush what is posted from now on.
                core.active.mark(qp);
            }
            qp.settle_path(&mut core.paths);
            out.push(Ok(()));
        }
    }

    /// The QP's state and attributes (`ibv_query_qp`).
    pub fn query_qp(&self, qpn: u32) -> Result<(QpState, QpAttrs), DeviceError> {
        let mut core = self.shared.lock_core();
        let qp = core.qp_mut(qpn).ok_or(DeviceError::UnknownQp(qpn))?;
        Ok((qp.state, qp.attrs.clone()))
    }

    /// Destroys a QP; its counters stay in the device totals.
    pub fn destroy_qp(&self, qpn: u32) -> Result<(), DeviceError> {
        let mut core = self.shared.lock_core();
        let i = core
            .qp_index(qpn)
            .filter(|&i| core.qps.get(i).is_some_and(|q| q.is_some()))
            .ok_or(DeviceError::UnknownQp(qpn))?;
        let mut qp = core.qps[i].take().expect("checked above");
        qp.detach_path(&mut core.paths);
        core.qpns.release(qpn);
        core.retired.add(&qp.counters);
        Ok(())
    }

    /// Device totals: device-level drops plus every QP's counters, live or destroyed.
    pub fn counters(&self) -> Counters {
        let core = self.shared.lock_core();
        let mut c = core.counters;
        c.add(&core.retired);
        for qp in core.qps.iter().flatten() {
            c.add(&qp.counters);
        }
        c
    }

    /// How many decoded send WQEs the QP keeps: what its send queue costs the device beyond
    /// the ring itself, which grows with the most WQEs it had fetched and not completed.
    #[cfg(feature = "harness")]
    pub fn decoded_send_slots(&self, qpn: u32) -> Result<usize, DeviceError> {
        let mut core = self.shared.lock_core();
        Ok(core
            .qp_mut(qpn)
            .ok_or(DeviceError::UnknownQp(qpn))?
            .sq
            .slots
            .len())
    }

    /// One QP's counters.
    pub fn qp_counters(&self, qpn: u32) -> Result<Counters, DeviceError> {
        let mut core = self.shared.lock_core();
        Ok(core
            .qp_mut(qpn)
            .ok_or(DeviceError::UnknownQp(qpn))?
            .counters)
    }
}

fn check_pd(core: &Core, pd: PdId) -> Result<(), DeviceError> {
    let ok = pd.0 >= 1 && core.pds.get(pd.0 as usize - 1).copied().unwrap_or(false);
    if ok {
        Ok(())
    } else {
        Err(DeviceError::UnknownPd(pd))
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.shared
            .stop
            .store(true, std::sync::atomic::Ordering::Release);
        self.shared.waker.wake();
        if let Some(h) = self.engine.take() {
            if h.join().is_err() {
                tracing::error!(name = %self.shared.name, "softnic engine thread panicked");
            }
        }
        if let Some(t) = self.shared.lock_core().trace.as_mut() {
            t.flush();
        }
        if let Some(path) = std::env::var_os(COUNTERS_FILE_ENV) {
            // For tools that run a process on a device and want its drop counters after it.
            let addr = self.shared.lock_core().local_addr;
            let line = format!(
                "softnic {} {addr}: {:?}\n",
                self.shared.name,
                self.counters()
            );
            let written = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
            if let Err(e) = written {
                tracing::warn!(path = ?path, error = %e, "cannot append the device counters");
            }
        }
    }
}

/// The environment variable naming a file each device appends its counters to when it is
/// dropped (one line: name, address, `Counters` in debug form).
pub const COUNTERS_FILE_ENV: &str = "SOFTNIC_COUNTERS_FILE";
