//! The soft provider: the softnic device behind the provider trait.
//!
//! The pmd allocates every ring and doorbell record from its own pool (hugepages when
//! available) and hands them to the softnic as `QueueMemory`, whose owner keeps the block
//! alive as long as the device holds it; so a device that refuses a destroy never writes into
//! freed memory. The doorbell register is the softnic's `DoorbellRegister`.
//!
//! Device names: `soft:<netdev>` and `soft:<netdev>@<addr>` open a softnic on a UDP socket
//! bound to the netdev; `fabric:<name>/<port>` opens one on a port of an in-process fabric
//! registered with [`register_fabric`].

use std::collections::HashMap;
use std::net::IpAddr;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use softnic::{
    Clock, CompletionChannel, CqConfig, CqHandle, CqId, Device, DeviceConfig, DeviceError, Fabric,
    PathMtu, PdId, ProgressMode, QpAttrs, QpConfig, QueueMemory, SrqConfig, SrqId, Wire,
};

use super::{
    CompletionEvents, CqRequest, DeviceFault, DeviceStep, Handle, PortEvent, ProgressModel,
    Provider, QpRequest, RawCq, RawMr, RawQp, RawSrq, RawWorkQueue, SrqRequest, VerbsError,
};
use crate::datapath::doorbell::Doorbell;
use crate::memory::{Block, MemoryPool};
use crate::name::DeviceName;
use crate::qp_state::QpState;
use crate::verbs::{Access, DeviceAttr, Gid, Mtu, PortAttr, PortState, QpAttr, QpCaps, QpType};

/// Largest gather list the soft provider grants.
const MAX_SGE: u32 = 16;
/// Largest inline payload the soft provider grants.
const MAX_INLINE: u32 = 512;
/// Largest queue in work requests.
const MAX_WR: u32 = 1 << 15;

fn fabrics() -> &'static Mutex<HashMap<String, Fabric>> {
    static FABRICS: OnceLock<Mutex<HashMap<String, Fabric>>> = OnceLock::new();
    FABRICS.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Makes `fabric` openable as `fabric:<name>/<port>`. Replaces a fabric of the same name.
pub fn register_fabric(name: &str, fabric: &Fabric) {
    fabrics()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(name.to_string(), fabric.clone());
}

/// Forgets the fabric registered under `name`; devices already open keep working.
pub fn unregister_fabric(name: &str) {
    fabrics()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(name);
}

/// A fabric registered under a name no other fabric of this process has, so that its ports
/// open as `fabric:<name>/<port>`; unregistered when dropped (devices already open keep
/// working). Tests and simulations build their hosts on one.
pub struct RegisteredFabric {
    name: String,
    fabric: Fabric,
}

impl RegisteredFabric {
    /// Registers `fabric` as `<prefix><pid>-<n>`, `n` counting the fabrics this process made.
    pub fn new(prefix: &str, fabric: Fabric) -> Self {
        static MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("{prefix}{}-{n}", std::process::id());
        register_fabric(&name, &fabric);
        RegisteredFabric { name, fabric }
    }

    /// Two hosts with two NICs each, as the testbed cables them: ports 0 and 1 are the first
    /// host's default and backup NICs (198.18.0.1, 198.18.1.1), ports 2 and 3 the second's
    /// (198.18.0.2, 198.18.1.2); 5 us of latency, one seed.
    pub fn two_hosts_two_rails(prefix: &str) -> Self {
        let fabric = Fabric::new(1, Duration::from_micros(5));
        for addr in ["198.18.0.1", "198.18.1.1", "198.18.0.2", "198.18.1.2"] {
            fabric.add_port(addr.parse().expect("a literal address"));
        }
        RegisteredFabric::new(prefix, fabric)
    }

    /// The name it is registered under.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device name of port `port`: `fabric:<name>/<port>`.
    pub fn device(&self, port: usize) -> String {
        format!("fabric:{}/{port}", self.name)
    }

    /// The fabric itself (links, fault rules, statistics).
    pub fn fabric(&self) -> &Fabric {
        &self.fabric
    }
}

impl Drop for RegisteredFabric {
    fn drop(&mut self) {
        unregister_fabric(&self.name);
    }
}

/// Options of a softnic device beyond the name.
#[derive(Clone, Debug)]
pub struct SoftOptions {
    /// Engine thread (auto) or progress from the polling lcore (manual).
    pub progress: ProgressModel,
    /// Real time, or a virtual clock for deterministic simulations.
    pub clock: Clock,
    /// Write every packet to this pcap file.
    pub pcap: Option<std::path::PathBuf>,
}

impl Default for SoftOptions {
    fn default() -> SoftOptions {
        SoftOptions {
            progress: ProgressModel::Auto,
            clock: Clock::real(),
            pcap: None,
        }
    }
}

/// The first IPv4 address of `netdev`, else its first global IPv6 address.
fn netdev_addr(netdev: &str) -> Result<IpAddr, String> {
    let addrs = nix::ifaddrs::getifaddrs().map_err(|e| format!("getifaddrs: {e}"))?;
    let mut v6 = None;
    for ifa in addrs.filter(|a| a.interface_name == netdev) {
        let Some(addr) = ifa.address else { continue };
        if let Some(sin) = addr.as_sockaddr_in() {
            return Ok(IpAddr::V4(sin.ip()));
        }
        if let Some(sin6) = addr.as_sockaddr_in6() {
            let ip = sin6.ip();
            let link_local = ip.segments()[0] & 0xffc0 == 0xfe80;
            if v6.is_none() && !link_local {
                v6 = Some(IpAddr::V6(ip));
            }
        }
    }
    v6.ok_or_else(|| format!("netdev {netdev} has no IPv4 or global IPv6 address"))
}

struct CqMem {
    id: CqId,
}

/// A softnic device as a provider.
pub struct SoftProvider {
    name: DeviceName,
    device: Device,
    pool: MemoryPool,
    progress: ProgressModel,
    cqs: Mutex<HashMap<u64, CqMem>>,
    events: Mutex<SoftEventQueues>,
}

/// The device's async events, sorted for their two readers.
#[derive(Debug, Default)]
struct SoftEventQueues {
    port: std::collections::VecDeque<PortEvent>,
    srq: std::collections::VecDeque<Handle>,
}

impl std::fmt::Debug for SoftProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftProvider")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

fn verbs(device: &DeviceName, verb: &'static str, e: DeviceError) -> VerbsError {
    let device = device.to_string();
    match e {
        DeviceError::InvalidConfig(what) => VerbsError::InvalidArgument {
            device,
            verb,
            what: what.to_string(),
        },
        DeviceError::Register(e @ softnic::RegError::Wraps { .. }) => VerbsError::InvalidArgument {
            device,
            verb,
            what: e.to_string(),
        },
        DeviceError::Register(e @ softnic::RegError::OutOfKeys { .. }) => {
            VerbsError::OutOfResources {
                device,
                verb,
                what: e.to_string(),
            }
        }
        other => VerbsError::Failed {
            device,
            verb,
            reason: other.to_string(),
        },
    }
}

/// Queue memory for the softnic: the block stays alive while the device holds it.
fn queue_memory(block: Block) -> QueueMemory {
    let block = Arc::new(block);
    let ptr = NonNull::new(block.as_ptr()).expect("pool blocks are never null");
    let len = block.len();
    // SAFETY: the block is `len` bytes of mapped memory owned by `block`, which the
    // QueueMemory keeps alive as its owner; nothing else frees it.
    unsafe { QueueMemory::from_raw(ptr, len, block) }
}

impl SoftProvider {
    /// Opens a softnic for a `soft:` or `fabric:` name.
    pub fn open(
        name: &DeviceName,
        pool: &MemoryPool,
        options: SoftOptions,
    ) -> Result<SoftProvider, VerbsError> {
        let no_device = |reason: String| VerbsError::NoDevice {
            name: name.to_string(),
            reason,
        };
        let wire = match name {
            DeviceName::Soft { netdev, addr } => {
                let addr = match addr {
                    Some(a) => *a,
                    None => netdev_addr(netdev).map_err(no_device)?,
                };
                Wire::Udp {
                    netdev: netdev.clone(),
                    addr,
                }
            }
            DeviceName::Fabric { fabric, port } => {
                let f = fabrics()
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(fabric)
                    .cloned()
                    .ok_or_else(|| no_device(format!("no fabric is registered as {fabric:?}")))?;
                Wire::Fabric {
                    fabric: f,
                    port: *port as usize,
                }
            }
            DeviceName::Mlx5 { .. } => {
                return Err(no_device(
                    "the soft provider opens soft: and fabric: names".into(),
                ))
            }
        };
        let mut config = DeviceConfig::new(name.to_string(), wire);
        config.progress = match options.progress {
            ProgressModel::Auto => ProgressMode::Auto,
            ProgressModel::Manual => ProgressMode::Manual,
        };
        config.clock = options.clock;
        config.pcap = options.pcap;
        let device = Device::open(config).map_err(|e| no_device(e.to_string()))?;
        Ok(SoftProvider {
            name: name.clone(),
            device,
            pool: pool.clone(),
            progress: options.progress,
            cqs: Mutex::new(HashMap::new()),
            events: Mutex::new(SoftEventQueues::default()),
        })
    }

    /// The softnic device itself (counters, async events, clock).
    pub fn device(&self) -> &Device {
        &self.device
    }

    fn block(&self, verb: &'static str, len: usize) -> Result<Block, VerbsError> {
        self.pool
            .alloc(len, 64)
            .map_err(|e| VerbsError::OutOfResources {
                device: self.name.to_string(),
                verb,
                what: e.to_string(),
            })
    }

    fn cq_id(&self, handle: Handle) -> Result<CqId, VerbsError> {
        self.cqs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&handle.0)
            .map(|c| c.id)
            .ok_or_else(|| VerbsError::InvalidArgument {
                device: self.name.to_string(),
                verb: "create_qp",
                what: format!("unknown CQ handle {}", handle.0),
            })
    }
}

fn to_soft_access(a: Access) -> softnic::Access {
    softnic::Access(a.bits())
}

fn to_soft_state(s: QpState) -> softnic::QpState {
    match s {
        QpState::Reset => softnic::QpState::Reset,
        QpState::Init => softnic::QpState::Init,
        QpState::Rtr => softnic::QpState::Rtr,
        QpState::Rts => softnic::QpState::Rts,
        QpState::Err => softnic::QpState::Err,
    }
}

fn from_soft_state(s: softnic::QpState) -> QpState {
    match s {
        softnic::QpState::Reset => QpState::Reset,
        softnic::QpState::Init => QpState::Init,
        softnic::QpState::Rtr => QpState::Rtr,
        softnic::QpState::Rts => QpState::Rts,
        softnic::QpState::Err => QpState::Err,
    }
}

fn to_soft_mtu(m: Mtu) -> PathMtu {
    match m {
        Mtu::Mtu256 => PathMtu::Mtu256,
        Mtu::Mtu512 => PathMtu::Mtu512,
        Mtu::Mtu1024 => PathMtu::Mtu1024,
        Mtu::Mtu2048 => PathMtu::Mtu2048,
        Mtu::Mtu4096 => PathMtu::Mtu4096,
    }
}

fn to_soft_attrs(a: &QpAttr) -> QpAttrs {
    QpAttrs {
        access: a.access.map(to_soft_access),
        path_mtu: a.path_mtu.map(to_soft_mtu),
        dest_qpn: a.dest_qpn,
        dest_addr: a.av.map(|av| av.dgid.to_ip()),
        rq_psn: a.rq_psn,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        sq_psn: a.sq_psn,
        max_rd_atomic: a.max_rd_atomic,
        qkey: a.qkey,
    }
}

struct SoftEvents {
    handle: CqHandle,
    channel: Arc<CompletionChannel>,
}

impl CompletionEvents for SoftEvents {
    fn arm(&self) -> Result<(), VerbsError> {
        self.handle.arm();
        Ok(())
    }

    fn wait(&self, timeout: Option<Duration>) -> Result<bool, VerbsError> {
        let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
        let fired = self.channel.wait(ms);
        if fired {
            self.channel.drain();
        }
        Ok(fired)
    }

    fn fd(&self) -> std::os::fd::RawFd {
        self.channel.fd()
    }
}

/// Basic blocks the largest WQE of a QP with `caps` takes.
fn max_wqe_bbs(caps: &QpCaps) -> u32 {
    let data = caps
        .max_send_sge
        .max(hw_defs::mlx5::wqe::inline_ds(caps.max_inline_data as usize) as u32);
    (3 + data).div_ceil(4)
}

impl SoftProvider {
    /// Moves the device's async events into the provider's two queues, so that the port
    /// watch and the SRQ event reader each find theirs whichever drained the device first.
    fn drain_events(&self) {
        let mut q = self.lock_events();
        while let Some(event) = self.device.events().poll() {
            match event {
                softnic::AsyncEvent::PortActive => q.port.push_back(PortEvent::Active),
                softnic::AsyncEvent::PortError => q.port.push_back(PortEvent::Down),
                softnic::AsyncEvent::DeviceFatal => q.port.push_back(PortEvent::DeviceFatal),
                softnic::AsyncEvent::SrqLimitReached { srq } => {
                    q.srq.push_back(Handle(u64::from(srq.0)))
                }
                other => {
                    tracing::warn!(device = %self.name, event = ?other, "async event")
                }
            }
        }
    }

    fn lock_events(&self) -> std::sync::MutexGuard<'_, SoftEventQueues> {
        self.events.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn create_qp_inner(&self, req: &QpRequest, srq: Option<SrqId>) -> Result<RawQp, VerbsError> {
        let mut caps = req.caps;
        if srq.is_some() {
            // Receives come from the SRQ: the QP's own ring is one slot nobody posts to.
            caps.max_recv_wr = 1;
            caps.max_recv_sge = 1;
        }
        if caps.max_send_sge > MAX_SGE
            || caps.max_recv_sge > MAX_SGE
            || caps.max_inline_data > MAX_INLINE
            || caps.max_send_wr > MAX_WR
            || caps.max_recv_wr > MAX_WR
        {
            return Err(VerbsError::InvalidArgument {
                device: self.name.to_string(),
                verb: "create_qp",
                what: format!("{caps:?} exceeds the device limits (sge {MAX_SGE}, inline {MAX_INLINE}, wr {MAX_WR})"),
            });
        }
        let wqe_bbs = max_wqe_bbs(&caps);
        let sq_bbs = (caps.max_send_wr.max(1) * wqe_bbs).next_power_of_two();
        let rq_wqes = caps.max_recv_wr.max(1).next_power_of_two();
        let rq_stride = (caps.max_recv_sge.max(1) * 16).next_power_of_two();
        let sq = self.block("create_qp", sq_bbs as usize * 64)?;
        let rq = self.block("create_qp", (rq_wqes * rq_stride) as usize)?;
        let dbrec = self.block("create_qp", hw_defs::mlx5::dbrec::SIZE)?;
        let sq_ptr = NonNull::new(sq.as_ptr()).expect("pool blocks are never null");
        let rq_ptr = NonNull::new(rq.as_ptr()).expect("pool blocks are never null");
        let dbrec_ptr =
            NonNull::new(dbrec.as_ptr().cast::<u32>()).expect("pool blocks are never null");
        let config = QpConfig {
            pd: PdId(req.pd.0 as u32),
            send_cq: self.cq_id(req.send_cq)?,
            recv_cq: self.cq_id(req.recv_cq)?,
            sq: queue_memory(sq),
            sq_bbs,
            rq: queue_memory(rq),
            rq_wqes,
            rq_stride,
            dbrec: queue_memory(dbrec),
            max_inline: caps.max_inline_data,
            max_send_sge: caps.max_send_sge,
            qp_type: match req.qp_type {
                QpType::Rc => softnic::QpType::Rc,
                QpType::Ud => softnic::QpType::Ud,
            },
        };
        let handle = match srq {
            Some(srq) => self.device.create_qp_with_srq(config, srq),
            None => self.device.create_qp(config),
        }
        .map_err(|e| verbs(&self.name, "create_qp", e))?;
        Ok(RawQp {
            handle: Handle(u64::from(handle.qpn)),
            qpn: handle.qpn,
            sq: RawWorkQueue {
                buf: sq_ptr,
                wqe_cnt: sq_bbs,
                stride: 64,
            },
            rq: RawWorkQueue {
                buf: rq_ptr,
                wqe_cnt: rq_wqes,
                stride: rq_stride,
            },
            dbrec: dbrec_ptr,
            doorbell: Doorbell::Soft(handle.doorbell),
            caps: QpCaps {
                max_send_wr: sq_bbs / wqe_bbs,
                max_recv_wr: rq_wqes,
                max_send_sge: caps.max_send_sge,
                max_recv_sge: rq_stride / 16,
                max_inline_data: caps.max_inline_data,
            },
        })
    }
}

impl Provider for SoftProvider {
    fn name(&self) -> &DeviceName {
        &self.name
    }

    fn query_device(&self) -> Result<DeviceAttr, VerbsError> {
        Ok(DeviceAttr {
            fw_ver: concat!("softnic ", env!("CARGO_PKG_VERSION")).to_string(),
            max_qp_wr: MAX_WR,
            max_sge: MAX_SGE,
            max_cqe: 1 << 22,
            max_mr_size: 1 << 40,
            max_inline_data: MAX_INLINE,
            max_qp_rd_atom: 16,
            max_qp_init_rd_atom: 16,
            max_srq: 1 << 16,
            max_srq_wr: MAX_WR - 1,
            max_srq_sge: MAX_SGE,
        })
    }

    fn query_port(&self) -> Result<PortAttr, VerbsError> {
        let state = match self.device.port_state() {
            softnic::PortState::Active => PortState::Active,
            softnic::PortState::Down => PortState::Down,
        };
        Ok(PortAttr {
            state,
            max_mtu: Mtu::Mtu4096,
            active_mtu: Mtu::Mtu4096,
            gid_tbl_len: 1,
        })
    }

    fn query_gid(&self, index: u16) -> Result<Gid, VerbsError> {
        if index != 0 {
            return Err(VerbsError::InvalidArgument {
                device: self.name.to_string(),
                verb: "query_gid",
                what: format!("GID index {index} (softnic has one GID)"),
            });
        }
        Ok(Gid(self.device.gid()))
    }

    fn alloc_pd(&self) -> Result<Handle, VerbsError> {
        Ok(Handle(u64::from(self.device.alloc_pd().0)))
    }

    fn dealloc_pd(&self, pd: Handle) -> Result<(), VerbsError> {
        self.device
            .dealloc_pd(PdId(pd.0 as u32))
            .map_err(|e| verbs(&self.name, "dealloc_pd", e))
    }

    unsafe fn reg_mr(
        &self,
        pd: Handle,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<RawMr, VerbsError> {
        // SAFETY: forwarded from the trait's contract (the range stays mapped until dereg).
        let keys = unsafe {
            self.device
                .reg_mr(PdId(pd.0 as u32), addr, len, to_soft_access(access))
        }
        .map_err(|e| verbs(&self.name, "reg_mr", e))?;
        Ok(RawMr {
            handle: Handle(u64::from(keys.lkey)),
            lkey: keys.lkey,
            rkey: keys.rkey,
        })
    }

    fn dereg_mr(&self, mr: Handle) -> Result<(), VerbsError> {
        self.device
            .dereg_mr(mr.0 as u32)
            .map_err(|e| verbs(&self.name, "dereg_mr", e))
    }

    fn create_cq(&self, req: &CqRequest) -> Result<RawCq, VerbsError> {
        let count = req.entries.max(2).next_power_of_two();
        let ring = self.block("create_cq", count as usize * hw_defs::mlx5::cqe::SIZE)?;
        // Every CQE starts invalid (opcode 15, owner 0), as libmlx5 initialises its rings, so
        // lap-0 slots the device has not written are not taken for completions.
        for i in 0..count as usize {
            // SAFETY: the byte lies inside the ring block, which nobody else uses yet.
            unsafe {
                *ring
                    .as_ptr()
                    .add(i * 64 + hw_defs::mlx5::cqe::OP_OWN_OFFSET) = 0xf0
            };
        }
        let dbrec = self.block("create_cq", hw_defs::mlx5::dbrec::CQ_SIZE)?;
        let buf = NonNull::new(ring.as_ptr()).expect("pool blocks are never null");
        let dbrec_ptr =
            NonNull::new(dbrec.as_ptr().cast::<u32>()).expect("pool blocks are never null");
        let channel = if req.events {
            Some(CompletionChannel::new().map_err(|e| VerbsError::Failed {
                device: self.name.to_string(),
                verb: "create_cq",
                reason: format!("completion channel: {e}"),
            })?)
        } else {
            None
        };
        let handle = self
            .device
            .create_cq(CqConfig {
                ring: queue_memory(ring),
                cqe_count: count,
                dbrec: queue_memory(dbrec),
                channel: channel.clone(),
            })
            .map_err(|e| verbs(&self.name, "create_cq", e))?;
        let id = handle.id;
        self.cqs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(u64::from(id.0), CqMem { id });
        let events = channel
            .map(|channel| Arc::new(SoftEvents { handle, channel }) as Arc<dyn CompletionEvents>);
        Ok(RawCq {
            handle: Handle(u64::from(id.0)),
            cqn: id.0,
            buf,
            cqe_cnt: count,
            cqe_size: 64,
            dbrec: dbrec_ptr,
            events,
        })
    }

    fn destroy_cq(&self, cq: Handle) -> Result<(), VerbsError> {
        self.device
            .destroy_cq(CqId(cq.0 as u32))
            .map_err(|e| verbs(&self.name, "destroy_cq", e))?;
        self.cqs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&cq.0);
        Ok(())
    }

    fn create_qp(&self, req: &QpRequest) -> Result<RawQp, VerbsError> {
        self.create_qp_inner(req, None)
    }

    fn supports_ud(&self) -> bool {
        true
    }

    fn create_qp_on_srq(&self, req: &QpRequest, srq: Handle) -> Result<RawQp, VerbsError> {
        self.create_qp_inner(req, Some(SrqId(srq.0 as u32)))
    }

    fn create_srq(&self, req: &SrqRequest) -> Result<RawSrq, VerbsError> {
        if req.max_sge > MAX_SGE || req.max_wr == 0 || req.max_wr >= MAX_WR {
            return Err(VerbsError::InvalidArgument {
                device: self.name.to_string(),
                verb: "create_srq",
                what: format!(
                    "max_wr {} / max_sge {} outside the device limits (1..{MAX_WR} receives, sge {MAX_SGE})",
                    req.max_wr, req.max_sge
                ),
            });
        }
        if req.limit > req.max_wr {
            return Err(VerbsError::InvalidArgument {
                device: self.name.to_string(),
                verb: "create_srq",
                what: format!("limit {} exceeds max_wr {}", req.limit, req.max_wr),
            });
        }
        // One slot more than asked: the free list's tail is never posted to (libmlx5).
        let wqes = (req.max_wr + 1).next_power_of_two();
        let stride = ((req.max_sge.max(1) + 1) * 16).next_power_of_two().max(32);
        let ring = self.block("create_srq", (wqes * stride) as usize)?;
        let dbrec = self.block("create_srq", 4)?;
        let buf = NonNull::new(ring.as_ptr()).expect("pool blocks are never null");
        let dbrec_ptr =
            NonNull::new(dbrec.as_ptr().cast::<u32>()).expect("pool blocks are never null");
        let id = self
            .device
            .create_srq(SrqConfig {
                pd: PdId(req.pd.0 as u32),
                ring: queue_memory(ring),
                wqes,
                stride,
                dbrec: queue_memory(dbrec),
                limit: req.limit,
            })
            .map_err(|e| verbs(&self.name, "create_srq", e))?;
        Ok(RawSrq {
            handle: Handle(u64::from(id.0)),
            buf,
            wqe_cnt: wqes,
            stride,
            dbrec: dbrec_ptr,
        })
    }

    fn modify_srq(&self, srq: Handle, limit: u32) -> Result<(), VerbsError> {
        self.device
            .modify_srq(SrqId(srq.0 as u32), limit)
            .map_err(|e| verbs(&self.name, "modify_srq", e))
    }

    fn query_srq(&self, srq: Handle) -> Result<u32, VerbsError> {
        self.device
            .query_srq(SrqId(srq.0 as u32))
            .map(|(limit, _)| limit)
            .map_err(|e| verbs(&self.name, "query_srq", e))
    }

    fn destroy_srq(&self, srq: Handle) -> Result<(), VerbsError> {
        self.device
            .destroy_srq(SrqId(srq.0 as u32))
            .map_err(|e| verbs(&self.name, "destroy_srq", e))
    }

    fn poll_srq_event(&self) -> Option<Handle> {
        self.drain_events();
        self.lock_events().srq.pop_front()
    }
    fn modify_qp(&self, qp: Handle, to: QpState, attr: &QpAttr) -> Result<(), VerbsError> {
        self.device
            .modify_qp(qp.0 as u32, to_soft_state(to), &to_soft_attrs(attr))
            .map_err(|e| verbs(&self.name, "modify_qp", e))
    }

    fn set_qps_error(&self, qps: &[Handle], out: &mut Vec<Result<(), VerbsError>>) {
        let qpns: Vec<u32> = qps.iter().map(|qp| qp.0 as u32).collect();
        let mut done = Vec::with_capacity(qpns.len());
        self.device.set_qps_error(&qpns, &mut done);
        out.clear();
        out.extend(
            done.into_iter()
                .map(|r| r.map_err(|e| verbs(&self.name, "modify_qp (ERR, batched)", e))),
        );
    }

    fn arm_short_retransmit(&self, qp: Handle, timeout: Duration) -> Result<(), VerbsError> {
        self.device
            .arm_short_retransmit(qp.0 as u32, timeout)
            .map_err(|e| verbs(&self.name, "arm_short_retransmit", e))
    }

    fn set_retransmit_probe(
        &self,
        qp: Handle,
        first: Duration,
        cap: Duration,
    ) -> Result<(), VerbsError> {
        self.device
            .set_retransmit_probe(qp.0 as u32, softnic::RetransmitProbe { first, cap })
            .map_err(|e| verbs(&self.name, "set_retransmit_probe", e))
    }

    fn retransmit_now(&self, qp: Handle) -> Result<(), VerbsError> {
        self.device
            .retransmit_now(qp.0 as u32)
            .map_err(|e| verbs(&self.name, "retransmit_now", e))
    }

    fn query_qp(&self, qp: Handle) -> Result<QpState, VerbsError> {
        self.device
            .query_qp(qp.0 as u32)
            .map(|(state, _)| from_soft_state(state))
            .map_err(|e| verbs(&self.name, "query_qp", e))
    }

    fn destroy_qp(&self, qp: Handle) -> Result<(), VerbsError> {
        self.device
            .destroy_qp(qp.0 as u32)
            .map_err(|e| verbs(&self.name, "destroy_qp", e))
    }

    fn progress_model(&self) -> ProgressModel {
        self.progress
    }

    #[inline]
    fn progress(&self) -> bool {
        if self.progress != ProgressModel::Manual {
            return false;
        }
        self.device.progress(self.device.clock().now()).busy
    }

    fn step(&self) -> DeviceStep {
        if self.progress != ProgressModel::Manual {
            return DeviceStep::default();
        }
        let activity = self.device.progress(self.device.clock().now());
        DeviceStep {
            busy: activity.busy,
            next_deadline: activity.next_deadline,
        }
    }

    fn poll_port_event(&self) -> Option<PortEvent> {
        // Reset the eventfd before reading the queue: an event pushed after this signals it
        // again, so a poller that sleeps on the fd never misses one.
        let mut count = 0u64;
        // SAFETY: an 8-byte read into a live u64 from the queue's eventfd, which is
        // nonblocking (EAGAIN when nothing is pending).
        unsafe {
            libc::read(
                self.device.events().fd(),
                (&mut count as *mut u64).cast(),
                8,
            )
        };
        self.drain_events();
        self.lock_events().port.pop_front()
    }

    fn port_event_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(self.device.events().fd())
    }

    fn inject_fault(&self, fault: DeviceFault) -> Result<(), VerbsError> {
        match fault {
            DeviceFault::Dead => self.device.kill(),
            DeviceFault::QpsFailed => self.device.fail_qps(),
            DeviceFault::LinkFlap => self.device.flap_link(),
            DeviceFault::RefuseRtr(how_long) => self.device.refuse_rtr(how_long),
            DeviceFault::SlowCompletions(how_long) => self.device.slow_completions(how_long),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_netdev_name_binds_to_its_first_ipv4_address() {
        assert_eq!(netdev_addr("lo"), Ok(IpAddr::from([127, 0, 0, 1])));
    }

    #[test]
    fn a_netdev_that_does_not_exist_is_named_in_the_error() {
        let err = netdev_addr("nosuchdev0").unwrap_err();
        assert!(err.contains("nosuchdev0"), "{err}");
    }
}
