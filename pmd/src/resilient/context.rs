//! The resilient context and what it makes: PDs, registered memory and resilient QPs whose
//! backup twins the service lcore creates with shadow verbs.

use std::ops::Deref;
use std::sync::Arc;

use crate::control::{Context, ContextConfig, Mr, OpenError, Pd, RegisteredBuffer};
use crate::provider::VerbsError;
use crate::verbs::{Access, QpCaps};

use super::config::ResilientConfig;
use super::dereg_error::DeregisterError;
use super::qp::ResilientQp;
use super::rendezvous::Rendezvous;
use super::service::mailbox::QpShared;
use super::service::shadow::{CtxInner, MrShadow, PdShadow, QpShadow, Verb};
use super::service::FailoverService;

/// A default device and (unless failover is off) a backup device in the same host, with the
/// failover service that runs their shadow verbs and watches their links.
#[derive(Clone)]
pub struct ResilientContext {
    inner: Arc<CtxInner>,
}

impl std::fmt::Debug for ResilientContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResilientContext")
            .field("default", &self.inner.default.name())
            .field(
                "backup",
                &self.inner.backup.as_ref().map(|b| b.name().to_string()),
            )
            .finish_non_exhaustive()
    }
}

impl ResilientContext {
    /// Pairs two opened devices. `backup` `None` (or `config.failover` off) gives plain QPs
    /// behind the resilient API. `store`: a key-value store for the rendezvous (Redis for
    /// clusters); `None` means inline (the application exchanges the blobs).
    pub fn new(
        default: Arc<Context>,
        backup: Option<Arc<Context>>,
        service: &FailoverService,
        config: ResilientConfig,
        store: Option<Arc<dyn Rendezvous>>,
    ) -> ResilientContext {
        let backup = backup.filter(|_| config.failover);
        let handle = service.handle().clone();
        if backup.is_some() && config.link_watch {
            handle.watch(&default, &config.link_sources[0]);
        }
        if let Some(b) = &backup {
            handle.watch(b, &config.link_sources[1]);
        }
        ResilientContext {
            inner: Arc::new(CtxInner {
                default,
                backup,
                service: handle,
                config,
                store,
                backup_cqs: Default::default(),
            }),
        }
    }

    /// Opens `default` and `backup` by name (see [`crate::name`]) and pairs them.
    pub fn open(
        default: &str,
        backup: Option<&str>,
        device_config: &ContextConfig,
        service: &FailoverService,
        config: ResilientConfig,
    ) -> Result<ResilientContext, OpenError> {
        let d = Context::open(default, device_config)?;
        let b = match backup {
            Some(name) if config.failover => Some(Context::open(name, device_config)?),
            _ => None,
        };
        Ok(ResilientContext::new(d, b, service, config, None))
    }

    /// The default device.
    pub fn default_context(&self) -> &Arc<Context> {
        &self.inner.default
    }

    /// The backup device, if failover is on.
    pub fn backup_context(&self) -> Option<&Arc<Context>> {
        self.inner.backup.as_ref()
    }

    /// The configuration.
    pub fn config(&self) -> &ResilientConfig {
        &self.inner.config
    }

    /// The CQs this context's backup data QPs share (`docs/failover.md` 3.5) that are alive,
    /// and their entries together: a device's first holds one QP's worth, each next one twice
    /// as many QPs' worth as the last.
    pub fn shared_backup_cqs(&self) -> (usize, u64) {
        self.inner.backup_cqs.census()
    }

    fn protects(&self) -> bool {
        self.inner.backup.is_some()
    }

    /// Allocates a PD on the default device; its backup twin follows on the service lcore.
    pub fn alloc_pd(&self) -> Result<ResilientPd, VerbsError> {
        let pd = self.inner.default.alloc_pd()?;
        let shadow = Arc::new(PdShadow::new(self.inner.clone(), pd));
        if self.protects() {
            self.inner
                .service
                .submit(Verb::AllocPd(Arc::downgrade(&shadow)));
        }
        Ok(ResilientPd { shadow })
    }
}

/// A protection domain on the default device and its backup twin.
pub struct ResilientPd {
    shadow: Arc<PdShadow>,
}

impl std::fmt::Debug for ResilientPd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResilientPd")
            .field("default", &self.shadow.default)
            .finish_non_exhaustive()
    }
}

impl ResilientPd {
    /// The default device's PD.
    pub fn pd(&self) -> &Arc<Pd> {
        &self.shadow.default
    }

    fn shadow_mr(&self, mr: &Mr) -> Result<Option<Arc<MrShadow>>, VerbsError> {
        let ctx = &self.shadow.ctx;
        if ctx.backup.is_none() {
            return Ok(None);
        }
        let gid = ctx.default.query_gid(0)?;
        let shadow = Arc::new(MrShadow::new(self.shadow.clone(), mr, gid));
        ctx.service.submit(Verb::RegMr(Arc::downgrade(&shadow)));
        Ok(Some(shadow))
    }

    /// Registers `len` bytes at `addr` on the default device; the service lcore registers the
    /// same memory on the backup device.
    ///
    /// # Safety
    /// As [`Pd::register`]: the range stays mapped until the returned MR is dropped.
    pub unsafe fn register(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<ResilientMr, VerbsError> {
        // SAFETY: forwarded from this function's contract.
        let mr = unsafe { self.shadow.default.register(addr, len, access)? };
        let shadow = self.shadow_mr(&mr)?;
        Ok(ResilientMr { shadow, mr })
    }

    /// Allocates and registers `len` bytes (see [`Pd::alloc_buffer`]), on both devices.
    pub fn alloc_buffer(&self, len: usize, access: Access) -> Result<ResilientBuffer, VerbsError> {
        let buffer = self.shadow.default.alloc_buffer(len, access)?;
        let shadow = self.shadow_mr(buffer.mr())?;
        Ok(ResilientBuffer { shadow, buffer })
    }

    /// Creates a resilient RC QP (in RESET) with its own CQ on the default device; the backup
    /// CQ and QP and the control QP follow on the service lcore.
    pub fn create_qp(&self, caps: QpCaps) -> Result<ResilientQp, VerbsError> {
        let ctx = &self.shadow.ctx;
        let cq = ctx
            .default
            .create_cq(super::service::shadow::cq_entries(caps), false)?;
        let qp = self.shadow.default.create_qp(&cq, &cq, caps)?;
        let name = format!("qp {:#x} on {}", qp.qpn(), ctx.default.name());
        let shared = Arc::new(QpShared::new(
            qp.handle(),
            name,
            ctx.service.deadline_board(),
        ));
        let shadow = if self.shadow.ctx.backup.is_some() {
            let gid = ctx.default.query_gid(0)?;
            let shadow = Arc::new(QpShadow::new(
                self.shadow.clone(),
                caps,
                qp.qpn(),
                gid,
                shared.clone(),
            ));
            ctx.service.register_qp(&shadow);
            ctx.service.submit(Verb::SetUpQp(Arc::downgrade(&shadow)));
            Some(shadow)
        } else {
            None
        };
        Ok(ResilientQp::new(
            qp,
            cq,
            shared,
            shadow,
            Some(ctx.clone()),
            ctx.service.clock().clone(),
            ctx.config.clone(),
        ))
    }
}

/// An MR on the default device and its backup twin on the same memory.
#[derive(Debug)]
pub struct ResilientMr {
    shadow: Option<Arc<MrShadow>>,
    mr: Mr,
}

impl Deref for ResilientMr {
    type Target = Mr;
    fn deref(&self) -> &Mr {
        &self.mr
    }
}

impl ResilientMr {
    /// Deregisters the MR on both devices now (`dereg_mr` on a protected PD): the backup
    /// twin first (its keys leave the failover's key mappings and, with a store, the
    /// store, then the backup device forgets it), then the default MR. When this returns,
    /// no retransmission, failover or re-arm of this process maps a WQE through either
    /// key, and neither device reaches the memory through them (unless one refused).
    /// An error names each device that refused: it may still reach the memory, which must
    /// then stay mapped while that device is open (as [`Mr::deregister`]).
    pub fn deregister(mut self) -> Result<(), DeregisterError> {
        self.release()
    }

    /// As [`ResilientMr::deregister`], keeping the (already deregistered) object: what a
    /// revocation does to memory the application registered itself.
    pub fn deregister_now(&mut self) -> Result<(), DeregisterError> {
        self.release()
    }

    fn release(&mut self) -> Result<(), DeregisterError> {
        let backup = self.shadow.as_ref().map_or(Ok(()), |s| s.cancel());
        let default = self.mr.release();
        DeregisterError::check(default, backup)
    }
}

impl Drop for ResilientMr {
    fn drop(&mut self) {
        // The backup twin goes first: the memory must outlive every registration. Refusals
        // are logged and counted by each device.
        let _ = self.release();
    }
}

/// A [`RegisteredBuffer`] registered on both devices. Derefs to the default registration:
/// `sge`, `remote`, `write` and `read` work as on a plain buffer.
///
/// Dropping it deregisters the backup twin, then the default MR, then returns the memory to
/// the pool; if either device refused its deregistration the memory is quarantined instead
/// (never handed out again while that device is open): fail closed on both NICs.
#[derive(Debug)]
pub struct ResilientBuffer {
    shadow: Option<Arc<MrShadow>>,
    buffer: RegisteredBuffer,
}

impl Deref for ResilientBuffer {
    type Target = RegisteredBuffer;
    fn deref(&self) -> &RegisteredBuffer {
        &self.buffer
    }
}

impl ResilientBuffer {
    /// Deregisters the buffer's MR on both devices now, as [`ResilientMr::deregister`]; the
    /// memory stays with the buffer (returned to the pool, or quarantined after a refusal,
    /// when it drops), so work still in flight never finds it reused.
    pub fn deregister_now(&mut self) -> Result<(), DeregisterError> {
        let backup = self.cancel_backup();
        let default = self.buffer.deregister_now();
        DeregisterError::check(default, backup)
    }

    fn cancel_backup(&mut self) -> Result<(), VerbsError> {
        let Some(shadow) = &self.shadow else {
            return Ok(());
        };
        let result = shadow.cancel();
        if result.is_err() {
            if let Some(backup) = shadow.backup_context() {
                self.buffer.also_reached_by(backup.clone());
            }
        }
        result
    }
}

impl Drop for ResilientBuffer {
    fn drop(&mut self) {
        // The backup twin first; the buffer's own drop deregisters the default MR and
        // quarantines the memory if either refused.
        let _ = self.cancel_backup();
    }
}
