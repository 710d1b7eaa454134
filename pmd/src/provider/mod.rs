//! Providers: the control verbs of one kind of device, and the raw queue memory they hand out.
//!
//! A provider does what needs the device's cooperation (create, modify and destroy objects,
//! register memory) and returns, for every CQ and QP, the memory the datapath then drives on
//! its own: rings, doorbell records and the doorbell register. The shapes follow what
//! `mlx5dv_init_obj` returns, so the mlx5 provider fills them straight from `struct mlx5dv_qp`
//! (`sq.buf`/`sq.wqe_cnt`/`sq.stride`, `rq.*`, `dbrec`, `bf.reg`/`bf.size`) and
//! `struct mlx5dv_cq` (`buf`, `cqe_cnt`, `cqe_size`, `dbrec`, `cq_uar`), and the soft provider
//! fills them with pool memory it hands to the softnic.
//!
//! The trait is object-safe and used through `Arc<dyn Provider>` by the control objects: the
//! control path may dispatch dynamically, the datapath never calls a provider.

use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use crate::datapath::doorbell::Doorbell;
use crate::name::DeviceName;
use crate::qp_state::QpState;
use crate::verbs::{Access, DeviceAttr, Gid, PortAttr, QpAttr, QpCaps, QpType};

/// An opaque provider-side object handle (an index, or a pointer value for rdma-sys objects).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Handle(pub u64);

/// How the device makes progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProgressModel {
    /// The device works on its own (hardware, or the softnic's engine thread).
    #[default]
    Auto,
    /// The device works only inside [`Provider::progress`], which the polling lcore calls.
    Manual,
}

/// A change of the port's link state or of the device's health, as an async event reports
/// it (`IBV_EVENT_PORT_ACTIVE`, `IBV_EVENT_PORT_ERR`, `IBV_EVENT_DEVICE_FATAL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortEvent {
    /// The link came up.
    Active,
    /// The link went down.
    Down,
    /// The device hit a fatal error: it completes nothing more, not even flushes, and does
    /// not come back (a ConnectX after a firmware assert or a surprise removal).
    DeviceFatal,
}

/// A fault a provider can inject into its own device, for tests (`--fault-fifo`,
/// `docs/apps-json.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceFault {
    /// The device dies silently: no completion (no flush either), no packet, its port state
    /// left alone; it raises its device-fatal event and never comes back.
    Dead,
    /// Every QP of the device goes to ERR, flushing what is posted on it, while the device and
    /// its link stay up (a NIC that recovered from an internal error by failing its QPs).
    QpsFailed,
    /// The device reports its link down, then up again, alive or dead: what a netdev watch
    /// reports when a device reset flaps the netdev of a device that died.
    LinkFlap,
    /// For this long the device refuses every move of a QP to RTR, and nothing else changes:
    /// a NIC that recovered from an error and is not ready to connect yet.
    RefuseRtr(std::time::Duration),
    /// For this long the device holds back every completion it writes, then writes them all
    /// in order, while its QPs go on executing: a NIC that is slow to complete but alive.
    SlowCompletions(std::time::Duration),
}

/// What one round of device work did, and when the device next needs one (a manual-progress
/// softnic; hardware reports nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceStep {
    /// Work was done: run another round before sleeping.
    pub busy: bool,
    /// The device's next timer, on its own clock (time since the clock's epoch).
    pub next_deadline: Option<Duration>,
}

/// Why a control verb failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerbsError {
    /// No device by that name.
    #[error("no device {name}: {reason}")]
    NoDevice {
        /// The name asked for.
        name: String,
        /// What the provider found instead.
        reason: String,
    },
    /// The provider was not compiled in.
    #[error("device {name} needs the `{feature}` cargo feature of pmd, which this build lacks")]
    NotBuilt {
        /// The name asked for.
        name: String,
        /// The missing feature.
        feature: &'static str,
    },
    /// The device does not support what was asked.
    #[error("{verb} on {device}: unsupported: {what}")]
    Unsupported {
        /// The device.
        device: String,
        /// The verb.
        verb: &'static str,
        /// What is not supported.
        what: String,
    },
    /// An argument is out of the device's range.
    #[error("{verb} on {device}: invalid argument: {what}")]
    InvalidArgument {
        /// The device.
        device: String,
        /// The verb.
        verb: &'static str,
        /// What was wrong.
        what: String,
    },
    /// The device ran out of a resource (memory, keys, QPs).
    #[error("{verb} on {device}: out of resources: {what}")]
    OutOfResources {
        /// The device.
        device: String,
        /// The verb.
        verb: &'static str,
        /// Which resource.
        what: String,
    },
    /// The device refused or failed (an errno from the kernel, or a dead softnic).
    #[error("{verb} on {device} failed: {reason}")]
    Failed {
        /// The device.
        device: String,
        /// The verb.
        verb: &'static str,
        /// What the device said.
        reason: String,
    },
}

/// One work queue as `mlx5dv_qp` describes it: a ring of `wqe_cnt` entries of `stride` bytes.
#[derive(Debug, Clone, Copy)]
pub struct RawWorkQueue {
    /// First byte of the ring.
    pub buf: NonNull<u8>,
    /// Entries in the ring (a power of two; basic blocks for a send queue).
    pub wqe_cnt: u32,
    /// Bytes per entry (64 for a send queue; a power of two, at least 16, for a receive queue).
    pub stride: u32,
}

/// What the datapath needs to drive a QP, as `mlx5dv_init_obj` returns it.
#[derive(Debug)]
pub struct RawQp {
    /// The provider's handle for control verbs.
    pub handle: Handle,
    /// The QP number the peer addresses.
    pub qpn: u32,
    /// The send queue: 64-byte basic blocks.
    pub sq: RawWorkQueue,
    /// The receive queue.
    pub rq: RawWorkQueue,
    /// The doorbell record: two big-endian 32-bit counters, `[0]` receive, `[1]` send.
    pub dbrec: NonNull<u32>,
    /// The doorbell register.
    pub doorbell: Doorbell,
    /// The capabilities the provider granted (at least what was asked).
    pub caps: QpCaps,
}

// SAFETY: RawQp describes memory owned by the provider object behind `handle`, which stays
// mapped until `destroy_qp`; the pointers are not tied to the creating thread.
unsafe impl Send for RawQp {}

/// Completion notification for a CQ, as `ibv_req_notify_cq` and a completion channel give it.
pub trait CompletionEvents: Send + Sync {
    /// Arms the CQ: the next CQE written after this call signals the channel.
    fn arm(&self) -> Result<(), VerbsError>;
    /// Waits for a signal, at most `timeout` (forever with `None`); true if one came.
    fn wait(&self, timeout: Option<Duration>) -> Result<bool, VerbsError>;
    /// A file descriptor that becomes readable on a signal, for epoll users.
    fn fd(&self) -> std::os::fd::RawFd;
}

/// What the datapath needs to poll a CQ, as `mlx5dv_cq` describes it.
pub struct RawCq {
    /// The provider's handle.
    pub handle: Handle,
    /// The CQ number.
    pub cqn: u32,
    /// First byte of the CQE ring.
    pub buf: NonNull<u8>,
    /// CQEs in the ring (a power of two).
    pub cqe_cnt: u32,
    /// Bytes per CQE (64; the 128-byte format keeps the 64-byte CQE in its second half).
    pub cqe_size: u32,
    /// The consumer-index doorbell record: `[0]` set_ci (24 bits, big-endian), `[1]` arm.
    pub dbrec: NonNull<u32>,
    /// Completion events, when they were asked for.
    pub events: Option<Arc<dyn CompletionEvents>>,
}

impl std::fmt::Debug for RawCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawCq")
            .field("handle", &self.handle)
            .field("cqn", &self.cqn)
            .field("buf", &self.buf)
            .field("cqe_cnt", &self.cqe_cnt)
            .field("cqe_size", &self.cqe_size)
            .field("events", &self.events.is_some())
            .finish()
    }
}

// SAFETY: as for RawQp: memory owned by the provider object until `destroy_cq`.
unsafe impl Send for RawCq {}

/// A registered memory region as the provider reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawMr {
    /// The provider's handle.
    pub handle: Handle,
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
}

/// What a CQ is created with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqRequest {
    /// Minimum number of CQEs (rounded up to a power of two by the provider).
    pub entries: u32,
    /// Whether to create completion events.
    pub events: bool,
}

/// What a QP is created with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpRequest {
    /// The PD.
    pub pd: Handle,
    /// The CQ for send completions.
    pub send_cq: Handle,
    /// The CQ for receive completions.
    pub recv_cq: Handle,
    /// Requested queue sizes.
    pub caps: QpCaps,
    /// RC or UD (UD only where [`Provider::supports_ud`]).
    pub qp_type: QpType,
}

/// What a shared receive queue is created with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqRequest {
    /// The PD.
    pub pd: Handle,
    /// Receives it must hold at once.
    pub max_wr: u32,
    /// Scatter entries per receive.
    pub max_sge: u32,
    /// The limit, armed when non-zero.
    pub limit: u32,
}

/// What the driver needs to post to a shared receive queue, as `mlx5dv_srq` describes it.
#[derive(Debug)]
pub struct RawSrq {
    /// The provider's handle.
    pub handle: Handle,
    /// First byte of the ring.
    pub buf: NonNull<u8>,
    /// Slots in the ring (a power of two; one stays free, so `wqe_cnt - 1` receives fit).
    pub wqe_cnt: u32,
    /// Bytes per slot: the 16-byte next segment and `stride / 16 - 1` data segments.
    pub stride: u32,
    /// The doorbell record: one big-endian 32-bit count of receives posted.
    pub dbrec: NonNull<u32>,
}

// SAFETY: as for RawQp: memory owned by the provider object until `destroy_srq`.
unsafe impl Send for RawSrq {}

/// The control verbs of one opened device.
///
/// Every method may block; none is called from the datapath. Objects are destroyed in the
/// reverse order of creation by the control objects that own them; a provider may still be
/// asked to destroy an object after the device died, and then returns an error (which the
/// control object logs and counts) rather than panicking.
pub trait Provider: Send + Sync + 'static {
    /// The name the device was opened under.
    fn name(&self) -> &DeviceName;
    /// Device limits.
    fn query_device(&self) -> Result<DeviceAttr, VerbsError>;
    /// The port's state and MTUs (devices have one port, number 1).
    fn query_port(&self) -> Result<PortAttr, VerbsError>;
    /// A GID of the port.
    fn query_gid(&self, index: u16) -> Result<Gid, VerbsError>;
    /// Allocates a protection domain.
    fn alloc_pd(&self) -> Result<Handle, VerbsError>;
    /// Releases a protection domain.
    fn dealloc_pd(&self, pd: Handle) -> Result<(), VerbsError>;
    /// Registers `len` bytes at `addr` in `pd`.
    ///
    /// # Safety
    /// The range must stay mapped (and not be handed to anything else that assumes exclusive
    /// access) until `dereg_mr` returns, as with `ibv_reg_mr`: the device may read and write it
    /// at any time in between.
    unsafe fn reg_mr(
        &self,
        pd: Handle,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<RawMr, VerbsError>;
    /// Deregisters an MR; after this returns the device no longer touches its memory.
    fn dereg_mr(&self, mr: Handle) -> Result<(), VerbsError>;
    /// Creates a CQ and returns its ring.
    fn create_cq(&self, req: &CqRequest) -> Result<RawCq, VerbsError>;
    /// Destroys a CQ; its ring must not be read afterwards.
    fn destroy_cq(&self, cq: Handle) -> Result<(), VerbsError>;
    /// Creates a QP of `req.qp_type` in RESET and returns its rings. A provider without UD
    /// refuses a UD QP ([`Provider::supports_ud`]).
    fn create_qp(&self, req: &QpRequest) -> Result<RawQp, VerbsError>;
    /// Whether the device makes UD QPs (`QpType::Ud`): their send WQEs carry the mlx5
    /// datagram segment, their receives the GRH. The default: no.
    fn supports_ud(&self) -> bool {
        false
    }
    /// Moves a QP to `to` with `attr`. The caller has checked the transition against
    /// [`crate::qp_state::check_transition`]. A move to RESET returns the rings to index 0.
    fn modify_qp(&self, qp: Handle, to: QpState, attr: &QpAttr) -> Result<(), VerbsError>;
    /// Moves every QP of `qps` to ERR, one result per QP in order in `out` (cleared first):
    /// what a link-down does to every QP of a device at once. The caller has checked each
    /// transition. The default moves them one at a time; a provider whose modify takes a
    /// device-wide lock (softnic) takes it once.
    fn set_qps_error(&self, qps: &[Handle], out: &mut Vec<Result<(), VerbsError>>) {
        out.clear();
        out.extend(
            qps.iter()
                .map(|&qp| self.modify_qp(qp, QpState::Err, &QpAttr::default())),
        );
    }
    /// The QP's state as the device sees it (it may have moved to ERR on its own).
    fn query_qp(&self, qp: Handle) -> Result<QpState, VerbsError>;
    /// Destroys a QP; its rings must not be touched afterwards.
    fn destroy_qp(&self, qp: Handle) -> Result<(), VerbsError>;
    /// Creates a shared receive queue. Providers without them refuse (the default).
    fn create_srq(&self, req: &SrqRequest) -> Result<RawSrq, VerbsError> {
        let _ = req;
        Err(self.no_srq("create_srq"))
    }
    /// Creates an RC QP in RESET that takes its receives from `srq`; its own receive ring,
    /// which the driver never posts to, is the smallest the provider makes.
    fn create_qp_on_srq(&self, req: &QpRequest, srq: Handle) -> Result<RawQp, VerbsError> {
        let _ = (req, srq);
        Err(self.no_srq("create_qp"))
    }
    /// Sets an SRQ's limit: non-zero arms it, zero disarms it.
    fn modify_srq(&self, srq: Handle, limit: u32) -> Result<(), VerbsError> {
        let _ = (srq, limit);
        Err(self.no_srq("modify_srq"))
    }
    /// An SRQ's limit, zero when disarmed.
    fn query_srq(&self, srq: Handle) -> Result<u32, VerbsError> {
        let _ = srq;
        Err(self.no_srq("query_srq"))
    }
    /// Destroys an SRQ no QP uses; its ring must not be touched afterwards.
    fn destroy_srq(&self, srq: Handle) -> Result<(), VerbsError> {
        let _ = srq;
        Err(self.no_srq("destroy_srq"))
    }
    /// The oldest unread SRQ limit event: the SRQ whose receives dropped below its armed
    /// limit (which disarmed). Read by one consumer.
    fn poll_srq_event(&self) -> Option<Handle> {
        None
    }
    /// The refusal of a provider without shared receive queues.
    fn no_srq(&self, verb: &'static str) -> VerbsError {
        VerbsError::Unsupported {
            device: self.name().to_string(),
            verb,
            what: "shared receive queues (this provider has none)".into(),
        }
    }
    /// Covers the next transmission of `qp` with a short ACK timeout `timeout`, once, instead
    /// of the QP's full one: what the failover asks for after re-posting work on a backup QP,
    /// so that a first transmission lost there is resent soon. The default does nothing (a
    /// ConnectX has no such knob: its QPs keep their `timeout` attribute).
    fn arm_short_retransmit(&self, qp: Handle, timeout: Duration) -> Result<(), VerbsError> {
        let _ = (qp, timeout);
        Ok(())
    }
    /// Gives `qp` a retransmit probe: while it has packets unacknowledged they are resent
    /// `first` after the transmission that left them outstanding, then at twice the last wait
    /// up to `cap`, spending no retry and leaving the ACK timer (which still decides when the
    /// QP gives up) where it was. What the failover asks of its control QPs, so that a message
    /// sent while its path is down gets through soon after the path carries packets again.
    /// The default does nothing: a ConnectX resends only on its ACK timer (`timeout`).
    fn set_retransmit_probe(
        &self,
        qp: Handle,
        first: Duration,
        cap: Duration,
    ) -> Result<(), VerbsError> {
        let _ = (qp, first, cap);
        Ok(())
    }
    /// Resends what `qp` has unacknowledged now, spending no retry and leaving its ACK timer
    /// where it was: what the failover asks when a path may be back (its link reported up, a
    /// message from the peer over it). The default does nothing (a ConnectX has no such verb).
    fn retransmit_now(&self, qp: Handle) -> Result<(), VerbsError> {
        let _ = qp;
        Ok(())
    }
    /// How the device makes progress.
    fn progress_model(&self) -> ProgressModel {
        ProgressModel::Auto
    }
    /// Does one round of device work under [`ProgressModel::Manual`]; returns whether anything
    /// happened. A no-op for devices that progress on their own.
    fn progress(&self) -> bool {
        false
    }
    /// As [`Provider::progress`], also saying when the device next needs a round (what a
    /// simulation with a virtual clock jumps to when everything is idle).
    fn step(&self) -> DeviceStep {
        DeviceStep {
            busy: self.progress(),
            next_deadline: None,
        }
    }
    /// The oldest unread port event, if any. Port events are read by one consumer (the
    /// failover service's link watch).
    fn poll_port_event(&self) -> Option<PortEvent> {
        None
    }
    /// A descriptor that becomes readable when a port event may be waiting, for epoll.
    fn port_event_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
    /// Injects `fault` into the device; providers that cannot (hardware) refuse.
    fn inject_fault(&self, fault: DeviceFault) -> Result<(), VerbsError> {
        Err(VerbsError::Unsupported {
            device: self.name().to_string(),
            verb: "inject_fault",
            what: format!("{fault:?}: the provider cannot inject faults"),
        })
    }
}

#[cfg(feature = "soft")]
pub mod soft;

#[cfg(feature = "mlx5")]
pub mod mlx5;

/// Opens the provider for `name`.
pub(crate) fn open(
    name: &DeviceName,
    memory: &crate::memory::MemoryPool,
    config: &crate::control::ContextConfig,
) -> Result<Box<dyn Provider>, VerbsError> {
    let _ = (memory, config);
    match name {
        #[cfg(feature = "mlx5")]
        DeviceName::Mlx5 { .. } => Ok(Box::new(mlx5::Mlx5Provider::open(name)?)),
        #[cfg(not(feature = "mlx5"))]
        DeviceName::Mlx5 { .. } => Err(VerbsError::NotBuilt {
            name: name.to_string(),
            feature: "mlx5",
        }),
        #[cfg(feature = "soft")]
        DeviceName::Soft { .. } | DeviceName::Fabric { .. } => {
            let options = soft::SoftOptions {
                progress: config.progress,
                ..soft::SoftOptions::default()
            };
            Ok(Box::new(soft::SoftProvider::open(name, memory, options)?))
        }
        #[cfg(not(feature = "soft"))]
        DeviceName::Soft { .. } | DeviceName::Fabric { .. } => Err(VerbsError::NotBuilt {
            name: name.to_string(),
            feature: "soft",
        }),
    }
}

#[cfg(test)]
pub(crate) mod testing;
