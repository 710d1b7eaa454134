//! The mlx5 provider: a ConnectX through rdma-sys (the verbs control path) and mlx5dv (direct
//! access to the rings, the doorbell record and the BlueFlame register). Cargo feature `mlx5`.
//!
//! libibverbs creates, modifies and destroys the objects; `mlx5dv_init_obj` then describes
//! each QP and CQ, and the pmd's datapath drives that memory itself, exactly as it drives the
//! softnic's. What the provider arranges so that this is sound on hardware:
//!
//! - **A BlueFlame register per QP.** Each QP is created in a parent domain with its own
//!   thread domain, for which libmlx5 allocates a dedicated BlueFlame register (no lock, no
//!   other writer), so the datapath may copy WQEs into it and alternate its halves. Where a
//!   thread domain cannot be had (an old kernel), the QP gets plain 8-byte doorbells only.
//! - **No scatter-to-CQE.** QPs are made with `mlx5dv_create_qp` and
//!   `MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE`: by default a ConnectX writes received
//!   payloads of up to 32 bytes into the CQE instead of the buffer, which only libmlx5's own
//!   poller would copy out.
//! - **Arming the CQ ourselves** (see `events`), and **cleaning the CQ on QP reset ourselves**:
//!   `mlx5dv_init_obj` marks the CQ DV-owned and libmlx5 stops cleaning it; the pmd's
//!   control path asks the CQ's poller to drop the QP's stale CQEs (`Qp::modify`).
//! - **GID 0 is the device's RoCE v2 address** ([`GidMap`]); ports whose link layer is not
//!   Ethernet are refused at open (the pmd drives RoCE only).
//! - **WQEs sized for the pmd's operations.** QPs are created naming the operations the pmd
//!   posts (`IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`), so libmlx5 does not reserve room for UMR
//!   headers in every WQE; the granted `max_send_wr` counts work requests, and the datapath
//!   counts outstanding work requests against it.
//! - **libmlx5's environment followed**: `MLX5_SHUT_UP_BF` (no write-combining) turns
//!   BlueFlame copies off; `MLX5_QP_SIGNATURE` (WQE signatures the pmd does not compute) is
//!   refused at QP creation ([`env`]).
//! - **The inline size the device grants** is what `query_device` reports, found by creating
//!   QPs once per context (libmlx5's limit is its largest send WQE, which verbs do not show).
//!
//! Device names: `mlx5:<ibdev>` (`mlx5:mlx5_0`). Without RDMA hardware, or without the kernel
//! RDMA stack, opening fails with [`VerbsError::NoDevice`] saying so; [`device_names`] lists
//! what there is.

mod attr;
mod device;
mod dv;
mod env;
mod events;
mod shapes;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, OnceLock};

use rdma_sys::{
    ibv_alloc_parent_domain, ibv_alloc_pd, ibv_alloc_td, ibv_cq, ibv_create_cq, ibv_dealloc_pd,
    ibv_dealloc_td, ibv_dereg_mr, ibv_destroy_cq, ibv_destroy_qp, ibv_device_attr, ibv_modify_qp,
    ibv_mr, ibv_parent_domain_init_attr, ibv_pd, ibv_port_attr, ibv_qp, ibv_qp_attr,
    ibv_qp_attr_mask, ibv_qp_init_attr, ibv_query_device, ibv_query_qp, ibv_reg_mr, ibv_td,
    ibv_td_init_attr,
};

pub use device::{device_names, GidMap};

use self::attr::{rc_error, verbs_error};
use self::device::Device;
use self::events::{Channel, CqEvents};
use super::{
    CompletionEvents, CqRequest, Handle, PortEvent, Provider, QpRequest, RawCq, RawMr, RawQp,
    VerbsError,
};
use crate::name::DeviceName;
use crate::qp_state::QpState;
use crate::verbs::{Access, DeviceAttr, Gid, PortAttr, QpAttr, QpCaps, QpType};

/// A QP's own thread domain and the parent domain that carries it (see the module docs).
struct ThreadDomain {
    parent: NonNull<ibv_pd>,
    td: NonNull<ibv_td>,
}

struct QpObject {
    qp: NonNull<ibv_qp>,
    domain: Option<ThreadDomain>,
}

/// The verbs objects the provider created, by handle.
#[derive(Default)]
struct Objects {
    next: u64,
    pds: HashMap<u64, NonNull<ibv_pd>>,
    mrs: HashMap<u64, NonNull<ibv_mr>>,
    cqs: HashMap<u64, NonNull<ibv_cq>>,
    qps: HashMap<u64, QpObject>,
}

// SAFETY: verbs objects are not tied to the thread that created them; libibverbs and libmlx5
// make their control verbs thread-safe. The table itself is behind a Mutex.
unsafe impl Send for Objects {}

impl Objects {
    fn handle(&mut self) -> Handle {
        self.next += 1;
        Handle(self.next)
    }
}

/// A ConnectX behind the provider trait.
pub struct Mlx5Provider {
    name: DeviceName,
    label: String,
    device: Arc<Device>,
    objects: Mutex<Objects>,
    /// Whether QPs may copy WQEs into their BlueFlame register (`MLX5_SHUT_UP_BF` unset),
    /// read at open as libmlx5 reads it.
    blueflame: bool,
    /// The inline size the device grants, found at the first `query_device`.
    granted_inline: OnceLock<u32>,
    /// The GID the pmd's index 0 resolved to first: the address peers know the device by,
    /// looked up by value at every later resolution (`GidMap::resolve`).
    held_gid: OnceLock<Gid>,
}

impl std::fmt::Debug for Mlx5Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mlx5Provider")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Mlx5Provider {
    /// Opens `mlx5:<ibdev>`.
    pub fn open(name: &DeviceName) -> Result<Mlx5Provider, VerbsError> {
        let DeviceName::Mlx5 { ibdev } = name else {
            return Err(VerbsError::InvalidArgument {
                device: name.to_string(),
                verb: "open_device",
                what: "the mlx5 provider opens only mlx5:<ibdev> names".into(),
            });
        };
        let label = name.to_string();
        let device = Arc::new(Device::open(&label, ibdev)?);
        let blueflame = env::blueflame_allowed(std::env::var_os("MLX5_SHUT_UP_BF").as_deref());
        let provider = Mlx5Provider {
            name: name.clone(),
            label,
            device,
            objects: Mutex::new(Objects::default()),
            blueflame,
            granted_inline: OnceLock::new(),
            held_gid: OnceLock::new(),
        };
        attr::check_link_layer(&provider.label, provider.port_attr()?.link_layer)?;
        if !blueflame {
            tracing::info!(device = %provider.label, "MLX5_SHUT_UP_BF is set: plain doorbells only, no BlueFlame");
        }
        tracing::info!(device = %provider.label, "ConnectX opened");
        Ok(provider)
    }

    /// Port 1 as libibverbs reports it.
    fn port_attr(&self) -> Result<ibv_port_attr, VerbsError> {
        // SAFETY: all-zero is a valid ibv_port_attr (integers only).
        let mut p: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open; `p` is a valid out-pointer of the size the call passes.
        let rc = unsafe { rdma_sys::___ibv_query_port(self.device.ctx(), 1, &mut p) };
        if rc != 0 {
            return Err(rc_error(&self.label, "ibv_query_port", rc));
        }
        Ok(p)
    }

    /// The inline size the device grants QPs created as `create_qp` creates them, found by
    /// creating (and destroying) QPs of one send entry on a scratch PD and CQ
    /// ([`attr::largest_granted_inline`]): about ten creations, once per context.
    fn probe_inline(&self) -> Result<u32, VerbsError> {
        // SAFETY: the context is open.
        let pd = NonNull::new(unsafe { ibv_alloc_pd(self.device.ctx()) })
            .ok_or_else(|| self.errno("ibv_alloc_pd"))?;
        // SAFETY: the context is open; no channel, no context pointer.
        let cq = unsafe {
            ibv_create_cq(
                self.device.ctx(),
                1,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        let granted = match NonNull::new(cq) {
            None => Err(self.errno("ibv_create_cq")),
            Some(cq) => {
                let granted = attr::largest_granted_inline(attr::MAX_INLINE_DATA, |inline| {
                    let caps = QpCaps {
                        max_send_wr: 1,
                        max_recv_wr: 1,
                        max_send_sge: 1,
                        max_recv_sge: 1,
                        max_inline_data: inline,
                    };
                    let mut init = attr::qp_init_attr(caps, cq.as_ptr(), cq.as_ptr(), pd.as_ptr());
                    // SAFETY: all-zero is a valid mlx5dv_qp_init_attr (no vendor options).
                    let mut vendor: dv::mlx5dv_qp_init_attr = unsafe { std::mem::zeroed() };
                    // SAFETY: the context, PD and CQ are live; both structs are valid.
                    let qp =
                        unsafe { dv::mlx5dv_create_qp(self.device.ctx(), &mut init, &mut vendor) };
                    let qp = NonNull::new(qp)?;
                    // SAFETY: the QP we just created, never handed out.
                    unsafe { ibv_destroy_qp(qp.as_ptr()) };
                    Some(init.cap.max_inline_data)
                });
                // SAFETY: our scratch CQ, its QPs destroyed.
                unsafe { ibv_destroy_cq(cq.as_ptr()) };
                Ok(granted)
            }
        };
        // SAFETY: our scratch PD, its QPs destroyed.
        unsafe { ibv_dealloc_pd(pd.as_ptr()) };
        granted
    }

    fn objects(&self) -> std::sync::MutexGuard<'_, Objects> {
        self.objects.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn unknown(&self, verb: &'static str, what: &str, h: Handle) -> VerbsError {
        VerbsError::InvalidArgument {
            device: self.label.clone(),
            verb,
            what: format!("no {what} with handle {}", h.0),
        }
    }

    fn errno(&self, verb: &'static str) -> VerbsError {
        verbs_error(&self.label, verb, std::io::Error::last_os_error())
    }

    fn gid_map(&self) -> Result<GidMap, VerbsError> {
        let table_len = self.query_port()?.gid_tbl_len;
        let (map, gid) = self
            .device
            .gid_map(table_len, self.held_gid.get().copied())
            .map_err(|reason| VerbsError::Failed {
                device: self.label.clone(),
                verb: "ibv_query_gid",
                reason,
            })?;
        if let Some(gid) = gid {
            self.held_gid.get_or_init(|| gid);
        }
        Ok(map)
    }

    /// A thread domain and a parent domain over `pd`, or `None` (logged once) where the
    /// device cannot give the QP a BlueFlame register of its own.
    fn thread_domain(&self, pd: NonNull<ibv_pd>) -> Option<ThreadDomain> {
        let mut td_attr = ibv_td_init_attr { comp_mask: 0 };
        // SAFETY: the context is open; the attribute struct is valid for the call.
        let td = unsafe { ibv_alloc_td(self.device.ctx(), &mut td_attr) }.and_then(NonNull::new);
        let Some(td) = td else {
            static WARNED: std::sync::Once = std::sync::Once::new();
            let e = std::io::Error::last_os_error();
            WARNED.call_once(|| {
                tracing::warn!(device = %self.label, error = %e, "no thread domain: QPs get plain doorbells, no BlueFlame");
            });
            return None;
        };
        // SAFETY: all-zero is a valid ibv_parent_domain_init_attr (null pointers, no
        // allocators, comp_mask 0); we then set the two members it needs.
        let mut pd_attr: ibv_parent_domain_init_attr = unsafe { std::mem::zeroed() };
        pd_attr.pd = pd.as_ptr();
        pd_attr.td = td.as_ptr();
        // SAFETY: the context, the PD and the TD are live.
        let parent = unsafe { ibv_alloc_parent_domain(self.device.ctx(), &mut pd_attr) }
            .and_then(NonNull::new);
        match parent {
            Some(parent) => Some(ThreadDomain { parent, td }),
            None => {
                tracing::warn!(device = %self.label, error = %std::io::Error::last_os_error(), "no parent domain: this QP gets plain doorbells");
                // SAFETY: the TD is ours and unused.
                unsafe { ibv_dealloc_td(td.as_ptr()) };
                None
            }
        }
    }

    /// Releases a QP's thread domain after the QP is gone; failures are logged.
    fn release_domain(&self, domain: ThreadDomain) -> Result<(), VerbsError> {
        // SAFETY: the parent domain and TD are ours; the QP that used them is destroyed.
        let rc = unsafe { ibv_dealloc_pd(domain.parent.as_ptr()) };
        if rc != 0 {
            return Err(rc_error(&self.label, "ibv_dealloc_pd(parent domain)", rc));
        }
        // SAFETY: as above; the parent domain that referenced the TD is gone.
        let rc = unsafe { ibv_dealloc_td(domain.td.as_ptr()) };
        if rc != 0 {
            return Err(rc_error(&self.label, "ibv_dealloc_td", rc));
        }
        Ok(())
    }

    fn qp_ptr(&self, verb: &'static str, qp: Handle) -> Result<NonNull<ibv_qp>, VerbsError> {
        self.objects()
            .qps
            .get(&qp.0)
            .map(|o| o.qp)
            .ok_or_else(|| self.unknown(verb, "QP", qp))
    }
}

impl Provider for Mlx5Provider {
    fn name(&self) -> &DeviceName {
        &self.name
    }

    fn poll_port_event(&self) -> Option<PortEvent> {
        // Numbers of `enum ibv_event_type` (verbs.h).
        const IBV_EVENT_DEVICE_FATAL: u32 = 8;
        const IBV_EVENT_PORT_ACTIVE: u32 = 9;
        const IBV_EVENT_PORT_ERR: u32 = 10;
        while let Some(kind) = self.device.next_async_event() {
            match kind {
                IBV_EVENT_DEVICE_FATAL => return Some(PortEvent::DeviceFatal),
                IBV_EVENT_PORT_ACTIVE => return Some(PortEvent::Active),
                IBV_EVENT_PORT_ERR => return Some(PortEvent::Down),
                other => tracing::debug!(device = %self.label, event = other, "mlx5: async event"),
            }
        }
        None
    }

    fn port_event_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(self.device.async_fd())
    }

    fn query_device(&self) -> Result<DeviceAttr, VerbsError> {
        // SAFETY: all-zero is a valid ibv_device_attr (integers and a char array).
        let mut a: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open; `a` is a valid out-pointer.
        let rc = unsafe { ibv_query_device(self.device.ctx(), &mut a) };
        if rc != 0 {
            return Err(rc_error(&self.label, "ibv_query_device", rc));
        }
        let inline = match self.granted_inline.get() {
            Some(&n) => n,
            None => *self.granted_inline.get_or_init(|| {
                self.probe_inline().unwrap_or_else(|e| {
                    tracing::warn!(device = %self.label, error = %e, "cannot find the granted inline size; reporting 0");
                    0
                })
            }),
        };
        Ok(attr::device_attr_from_ibv(&a, inline))
    }

    fn query_port(&self) -> Result<PortAttr, VerbsError> {
        let p = self.port_attr()?;
        attr::port_attr_from_ibv(&p).map_err(|reason| VerbsError::Failed {
            device: self.label.clone(),
            verb: "ibv_query_port",
            reason,
        })
    }

    fn query_gid(&self, index: u16) -> Result<Gid, VerbsError> {
        let hw = self.gid_map()?.to_device(index);
        self.device
            .hw_gid(hw)
            .map_err(|e| verbs_error(&self.label, "ibv_query_gid", e))
    }

    fn alloc_pd(&self) -> Result<Handle, VerbsError> {
        // SAFETY: the context is open.
        let pd = unsafe { ibv_alloc_pd(self.device.ctx()) };
        let pd = NonNull::new(pd).ok_or_else(|| self.errno("ibv_alloc_pd"))?;
        let mut o = self.objects();
        let h = o.handle();
        o.pds.insert(h.0, pd);
        Ok(h)
    }

    fn dealloc_pd(&self, pd: Handle) -> Result<(), VerbsError> {
        let ptr = self
            .objects()
            .pds
            .remove(&pd.0)
            .ok_or_else(|| self.unknown("ibv_dealloc_pd", "PD", pd))?;
        // SAFETY: a PD we allocated, removed from the table so it is deallocated once.
        let rc = unsafe { ibv_dealloc_pd(ptr.as_ptr()) };
        if rc != 0 {
            self.objects().pds.insert(pd.0, ptr);
            return Err(rc_error(&self.label, "ibv_dealloc_pd", rc));
        }
        Ok(())
    }

    unsafe fn reg_mr(
        &self,
        pd: Handle,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<RawMr, VerbsError> {
        let pd_ptr = *self
            .objects()
            .pds
            .get(&pd.0)
            .ok_or_else(|| self.unknown("ibv_reg_mr", "PD", pd))?;
        let flags = attr::access_to_ibv(access) as i32;
        // SAFETY: the PD is live; the caller promises the range stays mapped until dereg_mr.
        let mr = unsafe { ibv_reg_mr(pd_ptr.as_ptr(), addr.cast(), len, flags) };
        let mr = NonNull::new(mr).ok_or_else(|| self.errno("ibv_reg_mr"))?;
        // SAFETY: a live MR that ibv_reg_mr just returned.
        let (lkey, rkey) = unsafe { ((*mr.as_ptr()).lkey, (*mr.as_ptr()).rkey) };
        let mut o = self.objects();
        let handle = o.handle();
        o.mrs.insert(handle.0, mr);
        Ok(RawMr { handle, lkey, rkey })
    }

    fn dereg_mr(&self, mr: Handle) -> Result<(), VerbsError> {
        let ptr = self
            .objects()
            .mrs
            .remove(&mr.0)
            .ok_or_else(|| self.unknown("ibv_dereg_mr", "MR", mr))?;
        // SAFETY: an MR we registered, removed from the table so it is deregistered once.
        let rc = unsafe { ibv_dereg_mr(ptr.as_ptr()) };
        if rc != 0 {
            self.objects().mrs.insert(mr.0, ptr);
            return Err(rc_error(&self.label, "ibv_dereg_mr", rc));
        }
        Ok(())
    }

    fn create_cq(&self, req: &CqRequest) -> Result<RawCq, VerbsError> {
        let channel = if req.events {
            Some(Channel::create(&self.device, &self.label)?)
        } else {
            None
        };
        let entries = i32::try_from(req.entries).map_err(|_| VerbsError::InvalidArgument {
            device: self.label.clone(),
            verb: "ibv_create_cq",
            what: format!("{} CQEs", req.entries),
        })?;
        let chan_ptr = channel
            .as_ref()
            .map_or(std::ptr::null_mut(), Channel::as_ptr);
        // SAFETY: the context is open; the channel (if any) is live and outlives the CQ (the
        // CQ's events own it and drop after destroy_cq).
        let cq = unsafe {
            ibv_create_cq(
                self.device.ctx(),
                entries,
                std::ptr::null_mut(),
                chan_ptr,
                0,
            )
        };
        let cq = NonNull::new(cq).ok_or_else(|| self.errno("ibv_create_cq"))?;
        let destroy = |e: VerbsError| {
            // SAFETY: the CQ we just created, not yet handed out.
            unsafe { ibv_destroy_cq(cq.as_ptr()) };
            e
        };
        // SAFETY: mlx5dv_cq is integers and pointers; all-zero is valid (comp_mask 0).
        let mut out: dv::mlx5dv_cq = unsafe { std::mem::zeroed() };
        let mut obj = dv::mlx5dv_obj::default();
        obj.cq.in_ = cq.as_ptr();
        obj.cq.out = &mut out;
        // SAFETY: `obj` names a live mlx5 CQ (the device passed mlx5dv_is_supported) and a
        // valid out struct.
        let rc = unsafe { dv::mlx5dv_init_obj(&mut obj, dv::MLX5DV_OBJ_CQ) };
        if rc != 0 {
            return Err(destroy(rc_error(&self.label, "mlx5dv_init_obj(CQ)", rc)));
        }
        let shape = shapes::cq_shape(&out).map_err(|reason| {
            destroy(VerbsError::Failed {
                device: self.label.clone(),
                verb: "mlx5dv_init_obj(CQ)",
                reason,
            })
        })?;
        let events = channel.map(|channel| {
            Arc::new(CqEvents::new(
                channel,
                cq,
                shape.cqn,
                shape.dbrec,
                shape.uar,
                &self.label,
            )) as Arc<dyn CompletionEvents>
        });
        let mut o = self.objects();
        let handle = o.handle();
        o.cqs.insert(handle.0, cq);
        Ok(RawCq {
            handle,
            cqn: shape.cqn,
            buf: shape.buf,
            cqe_cnt: shape.cqe_cnt,
            cqe_size: shape.cqe_size,
            dbrec: shape.dbrec,
            events,
        })
    }

    fn destroy_cq(&self, cq: Handle) -> Result<(), VerbsError> {
        let ptr = self
            .objects()
            .cqs
            .remove(&cq.0)
            .ok_or_else(|| self.unknown("ibv_destroy_cq", "CQ", cq))?;
        // SAFETY: a CQ we created, removed from the table so it is destroyed once; its QPs
        // are gone (the control objects destroy them first).
        let rc = unsafe { ibv_destroy_cq(ptr.as_ptr()) };
        if rc != 0 {
            self.objects().cqs.insert(cq.0, ptr);
            return Err(rc_error(&self.label, "ibv_destroy_cq", rc));
        }
        Ok(())
    }

    fn create_qp(&self, req: &QpRequest) -> Result<RawQp, VerbsError> {
        if req.qp_type != QpType::Rc {
            // The datagram segment and the address handles are not built for ConnectX yet
            // (`docs/datapath.md`, "UD QPs").
            return Err(VerbsError::Unsupported {
                device: self.label.clone(),
                verb: "create_qp",
                what: "UD QPs (the mlx5 provider makes RC QPs only)".into(),
            });
        }
        let (pd, send_cq, recv_cq) = {
            let o = self.objects();
            (
                *o.pds
                    .get(&req.pd.0)
                    .ok_or_else(|| self.unknown("create_qp", "PD", req.pd))?,
                *o.cqs
                    .get(&req.send_cq.0)
                    .ok_or_else(|| self.unknown("create_qp", "CQ", req.send_cq))?,
                *o.cqs
                    .get(&req.recv_cq.0)
                    .ok_or_else(|| self.unknown("create_qp", "CQ", req.recv_cq))?,
            )
        };
        env::check_qp_signature(
            &self.label,
            std::env::var_os("MLX5_QP_SIGNATURE").as_deref(),
        )?;
        let domain = self.thread_domain(pd);
        let mut init = attr::qp_init_attr(
            req.caps,
            send_cq.as_ptr(),
            recv_cq.as_ptr(),
            domain.as_ref().map_or(pd, |d| d.parent).as_ptr(),
        );
        // SAFETY: all-zero is a valid mlx5dv_qp_init_attr; we ask for one create flag.
        let mut vendor: dv::mlx5dv_qp_init_attr = unsafe { std::mem::zeroed() };
        vendor.comp_mask = dv::MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS;
        vendor.create_flags = dv::MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE;
        // SAFETY: the context, PD (or parent domain) and CQs are live; both attribute
        // structs are valid for the call.
        let qp = unsafe { dv::mlx5dv_create_qp(self.device.ctx(), &mut init, &mut vendor) };
        let Some(qp) = NonNull::new(qp) else {
            let e = self.errno("mlx5dv_create_qp");
            if let Some(d) = domain {
                self.release_domain(d).ok();
            }
            return Err(e);
        };
        let dedicated = domain.is_some();
        let object = QpObject { qp, domain };
        let fail = |reason: String| -> VerbsError {
            // SAFETY: the QP we just created, not yet handed out.
            unsafe { ibv_destroy_qp(qp.as_ptr()) };
            VerbsError::Failed {
                device: self.label.clone(),
                verb: "mlx5dv_init_obj(QP)",
                reason,
            }
        };
        // SAFETY: mlx5dv_qp is integers and pointers; all-zero is valid, and comp_mask 0 asks
        // for no optional fields.
        let mut out: dv::mlx5dv_qp = unsafe { std::mem::zeroed() };
        let mut obj = dv::mlx5dv_obj::default();
        obj.qp.in_ = qp.as_ptr();
        obj.qp.out = &mut out;
        // SAFETY: `obj` names a live mlx5 QP and a valid out struct.
        let rc = unsafe { dv::mlx5dv_init_obj(&mut obj, dv::MLX5DV_OBJ_QP) };
        let shape = if rc != 0 {
            Err(fail(format!(
                "{}",
                std::io::Error::from_raw_os_error(rc.abs())
            )))
        } else {
            let register = shapes::RegisterUse {
                dedicated,
                blueflame: self.blueflame,
            };
            // SAFETY: `out` describes the live QP; its memory stays mapped until destroy_qp,
            // which the control objects call only after the datapath queues are gone; with a
            // thread domain the register is the QP's alone.
            unsafe { shapes::qp_shape(&out, register) }.map_err(fail)
        };
        let shape = match shape {
            Ok(shape) => shape,
            Err(e) => {
                if let Some(d) = object.domain {
                    self.release_domain(d).ok();
                }
                return Err(e);
            }
        };
        // SAFETY: the QP is live.
        let qpn = unsafe { (*qp.as_ptr()).qp_num };
        let caps = QpCaps {
            max_send_wr: init.cap.max_send_wr,
            max_recv_wr: init.cap.max_recv_wr,
            max_send_sge: init.cap.max_send_sge,
            max_recv_sge: init.cap.max_recv_sge,
            max_inline_data: init.cap.max_inline_data,
        };
        tracing::debug!(device = %self.label, qpn, sq_bbs = shape.sq.wqe_cnt, rq = shape.rq.wqe_cnt, doorbell = ?shape.doorbell, granted = ?caps, "QP created");
        let mut o = self.objects();
        let handle = o.handle();
        o.qps.insert(handle.0, object);
        Ok(RawQp {
            handle,
            qpn,
            sq: shape.sq,
            rq: shape.rq,
            dbrec: shape.dbrec,
            doorbell: shape.doorbell,
            caps,
        })
    }

    fn modify_qp(&self, qp: Handle, to: QpState, attr: &QpAttr) -> Result<(), VerbsError> {
        let ptr = self.qp_ptr("ibv_modify_qp", qp)?;
        let map = if attr.av.is_some() {
            self.gid_map()?
        } else {
            GidMap::IDENTITY
        };
        let (mut a, mask) = attr::qp_attr_to_ibv(to, attr, |i| {
            u8::try_from(map.to_device(u16::from(i))).unwrap_or(i)
        });
        // SAFETY: a live QP of ours; `a` is a valid attribute struct for `mask`.
        let rc = unsafe { ibv_modify_qp(ptr.as_ptr(), &mut a, mask) };
        if rc != 0 {
            return Err(rc_error(&self.label, "ibv_modify_qp", rc));
        }
        Ok(())
    }

    fn query_qp(&self, qp: Handle) -> Result<QpState, VerbsError> {
        let ptr = self.qp_ptr("ibv_query_qp", qp)?;
        // SAFETY: all-zero is valid for both plain C structs.
        let (mut a, mut init): (ibv_qp_attr, ibv_qp_init_attr) =
            unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        // SAFETY: a live QP; valid out-pointers.
        let rc = unsafe {
            ibv_query_qp(
                ptr.as_ptr(),
                &mut a,
                ibv_qp_attr_mask::IBV_QP_STATE.0 as i32,
                &mut init,
            )
        };
        if rc != 0 {
            return Err(rc_error(&self.label, "ibv_query_qp", rc));
        }
        attr::state_from_ibv(a.qp_state).map_err(|reason| VerbsError::Failed {
            device: self.label.clone(),
            verb: "ibv_query_qp",
            reason,
        })
    }

    fn destroy_qp(&self, qp: Handle) -> Result<(), VerbsError> {
        let object = self
            .objects()
            .qps
            .remove(&qp.0)
            .ok_or_else(|| self.unknown("ibv_destroy_qp", "QP", qp))?;
        // SAFETY: a QP we created, removed from the table so it is destroyed once; the
        // datapath queues that wrote its rings and register are gone.
        let rc = unsafe { ibv_destroy_qp(object.qp.as_ptr()) };
        if rc != 0 {
            self.objects().qps.insert(qp.0, object);
            return Err(rc_error(&self.label, "ibv_destroy_qp", rc));
        }
        match object.domain {
            Some(d) => self.release_domain(d),
            None => Ok(()),
        }
    }
}

impl Drop for Mlx5Provider {
    fn drop(&mut self) {
        // The control objects release everything before the provider goes; what is left
        // here is what the device refused to release then. Try once more, children first.
        let mut o = std::mem::take(&mut *self.objects());
        let left = o.qps.len() + o.cqs.len() + o.mrs.len() + o.pds.len();
        if left == 0 {
            return;
        }
        let mut failed = 0;
        for (_, q) in o.qps.drain() {
            // SAFETY: ours, destroyed once (drained from the table).
            if unsafe { ibv_destroy_qp(q.qp.as_ptr()) } != 0 {
                failed += 1;
            } else if let Some(d) = q.domain {
                failed += usize::from(self.release_domain(d).is_err());
            }
        }
        for (_, cq) in o.cqs.drain() {
            // SAFETY: as above.
            failed += usize::from(unsafe { ibv_destroy_cq(cq.as_ptr()) } != 0);
        }
        for (_, mr) in o.mrs.drain() {
            // SAFETY: as above.
            failed += usize::from(unsafe { ibv_dereg_mr(mr.as_ptr()) } != 0);
        }
        for (_, pd) in o.pds.drain() {
            // SAFETY: as above.
            failed += usize::from(unsafe { ibv_dealloc_pd(pd.as_ptr()) } != 0);
        }
        tracing::warn!(device = %self.label, left, failed, "objects left at close; closing the device releases the rest");
    }
}
