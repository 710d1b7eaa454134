//! One end of a connection, on a plain QP or (with `--backup-dev`) on a resilient QP, behind
//! one small enum so every tool runs the same code on both.

use std::sync::Arc;
use std::time::Duration;

use pmd::provider::ProgressModel;
use pmd::resilient::{
    Clock, FailoverEvent, FailoverService, FailoverStats, ResilientBuffer, ResilientConfig,
    ResilientContext, ResilientPd, ResilientQp, ResilientState, ServiceConfig,
};
use pmd::{
    Access, AddressVector, Context, ContextConfig, Cq, Gid, Mtu, Pd, PostError, Qp, QpAttr, QpCaps,
    QpState, RecvWr, RegisteredBuffer, SendWr, WorkCompletion,
};

use crate::error::AppError;
use crate::exchange::{from_hex, to_hex, QpInfo};
use crate::service_pacer::ServicePacer;

/// How to open the devices.
#[derive(Debug, Clone)]
pub struct DeviceOptions {
    /// The default device.
    pub device: String,
    /// The backup device (resilient QPs), if any.
    pub backup: Option<String>,
    /// Fail over (off: `--no-failover`, the backup device is not used).
    pub failover: bool,
    /// How softnic devices progress.
    pub progress: ProgressModel,
    /// GID index.
    pub gid_index: u16,
    /// Hold-down before switching back (`--holddown`); `None`: the pmd's default.
    pub holddown: Option<std::time::Duration>,
    /// How long work is held while no path answers (`--outage-tolerance`); `None`: the pmd's
    /// default.
    pub outage_tolerance: Option<std::time::Duration>,
    /// This host's management address (`--management-addr`): the third channel (5f).
    pub management_addr: Option<std::net::IpAddr>,
    /// The polling lcore runs the failover service itself (no service thread); with
    /// [`ProgressModel::Manual`] it also drives the devices.
    pub run_to_completion: bool,
    /// QPs the tool makes on the device (`-q`, or the measured one and `--idle-qps`): the key
    /// table is sized for their MRs (a resilient QP registers some of its own).
    pub qps: u32,
}

enum HostKind {
    Plain {
        pd: Arc<Pd>,
        ctx: Arc<Context>,
    },
    // The service goes last: the context, PD and QPs made from it go first.
    Resilient {
        pd: ResilientPd,
        ctx: ResilientContext,
        service: Arc<FailoverService>,
    },
}

/// The devices of this process and their PD.
pub struct Host {
    kind: HostKind,
    gid: Gid,
    active_mtu: Mtu,
    /// Paces the failover service's rounds when the polling lcore runs them.
    pacer: Option<Arc<ServicePacer>>,
    /// The default device's limits, so a flag beyond them is named before a verb refuses it.
    limits: pmd::verbs::DeviceAttr,
    /// The default device's name.
    device: String,
}

/// Why a device did not open, with the fix where the cause is a usual one: a softnic on a
/// netdev that does not exist, or on an address another softnic (often the peer, given the
/// same `-d`) already has.
fn open_failure(name: &str, reason: &str) -> String {
    let Some(rest) = name.strip_prefix("soft:") else {
        return reason.to_owned();
    };
    let netdev = rest.split('@').next().unwrap_or(rest);
    if !std::path::Path::new("/sys/class/net").join(netdev).exists() {
        return format!("there is no netdev {netdev} (`ip link` lists them)");
    }
    if reason.contains("Address already in use") {
        return format!(
            "{reason}: another softnic has this address's RoCE port 4791, perhaps the peer \
             with the same -d; give each side its own address, e.g. -d soft:lo@127.0.0.2"
        );
    }
    reason.to_owned()
}

impl Host {
    /// Opens the device (and the backup device with failover) and allocates a PD.
    pub fn open(o: &DeviceOptions) -> Result<Host, AppError> {
        let config = ContextConfig {
            progress: o.progress,
            key_table_slots: ContextConfig::key_table_slots_for(o.qps),
            ..ContextConfig::default()
        };
        let open = |name: &str| {
            Context::open(name, &config).map_err(|e| AppError::Device {
                device: name.to_owned(),
                reason: open_failure(name, &e.to_string()),
            })
        };
        let default = open(&o.device)?;
        let verbs = |e: pmd::provider::VerbsError| AppError::Verbs(e.to_string());
        let gid = default
            .query_gid(o.gid_index)
            .map_err(|e| AppError::Device {
                device: o.device.clone(),
                reason: format!("GID index {}: {e}", o.gid_index),
            })?;
        let active_mtu = default.query_port().map_err(verbs)?.active_mtu;
        let limits = default.query_device().map_err(verbs)?;
        let kind = match (&o.backup, o.failover) {
            (Some(backup), true) => {
                let backup_ctx = open(backup)?;
                let service = if o.run_to_completion {
                    FailoverService::manual(Clock::real())
                } else {
                    FailoverService::start(ServiceConfig::default())
                }
                .map(Arc::new)
                .map_err(|e| AppError::Verbs(format!("failover service: {e}")))?;
                let mut config = ResilientConfig::default();
                if let Some(holddown) = o.holddown {
                    config.holddown = holddown;
                }
                if let Some(tolerance) = o.outage_tolerance {
                    config.outage_tolerance = tolerance;
                }
                config.management_addr = o.management_addr;
                let ctx = ResilientContext::new(default, Some(backup_ctx), &service, config, None);
                let pd = ctx.alloc_pd().map_err(verbs)?;
                HostKind::Resilient { pd, ctx, service }
            }
            _ => {
                let pd = default.alloc_pd().map_err(verbs)?;
                HostKind::Plain { pd, ctx: default }
            }
        };
        let pacer = match &kind {
            HostKind::Resilient { service, .. } if service.is_manual() => {
                Some(Arc::new(ServicePacer::new(service.clone())))
            }
            _ => None,
        };
        Ok(Host {
            kind,
            gid,
            active_mtu,
            pacer,
            limits,
            device: o.device.clone(),
        })
    }

    /// This end's GID.
    pub fn gid(&self) -> Gid {
        self.gid
    }

    /// The default port's active MTU.
    pub fn active_mtu(&self) -> Mtu {
        self.active_mtu
    }

    /// One round of each of this host's devices that progress manually (default, then
    /// backup); a no-op for devices with engine threads. Returns whether anything happened.
    pub fn progress(&self) -> bool {
        let mut moved = self.context().progress();
        if let Some(backup) = self.backup_context() {
            moved |= backup.progress();
        }
        moved
    }

    /// The pacer of the failover service's rounds when the polling lcore runs them
    /// (run-to-completion).
    pub fn service_pacer(&self) -> Option<&Arc<ServicePacer>> {
        self.pacer.as_ref()
    }

    /// Whether QPs made here fail over.
    pub fn is_resilient(&self) -> bool {
        matches!(self.kind, HostKind::Resilient { .. })
    }

    /// The default device's context.
    pub fn context(&self) -> &Arc<Context> {
        match &self.kind {
            HostKind::Plain { ctx, .. } => ctx,
            HostKind::Resilient { ctx, .. } => ctx.default_context(),
        }
    }

    /// The backup device's context, if failover is on.
    pub fn backup_context(&self) -> Option<&Arc<Context>> {
        match &self.kind {
            HostKind::Plain { .. } => None,
            HostKind::Resilient { ctx, .. } => ctx.backup_context(),
        }
    }

    /// Allocates and registers `len` bytes (on both devices of a resilient host). Allocate
    /// every buffer before creating QPs: the rendezvous carries the backup keys of the MRs
    /// registered so far.
    pub fn alloc(&self, len: usize) -> Result<Memory, AppError> {
        let verbs = |e: pmd::provider::VerbsError| AppError::Verbs(e.to_string());
        Ok(match &self.kind {
            HostKind::Plain { pd, .. } => {
                Memory::Plain(pd.alloc_buffer(len, Access::ALL).map_err(verbs)?)
            }
            HostKind::Resilient { pd, .. } => {
                Memory::Resilient(pd.alloc_buffer(len, Access::ALL).map_err(verbs)?)
            }
        })
    }

    /// Creates a QP (in RESET) with its own CQ.
    pub fn create_qp(&self, caps: QpCaps) -> Result<Conn, AppError> {
        let verbs = |e: pmd::provider::VerbsError| AppError::Verbs(e.to_string());
        if caps.max_inline_data > self.limits.max_inline_data {
            return Err(AppError::Usage(format!(
                "-I/--inline_size {}: {} sends at most {} bytes inline",
                caps.max_inline_data, self.device, self.limits.max_inline_data
            )));
        }
        if caps.max_send_wr > self.limits.max_qp_wr {
            return Err(AppError::Usage(format!(
                "-t/--tx-depth: the send queue needs {} WQEs and {} takes at most {}",
                caps.max_send_wr, self.device, self.limits.max_qp_wr
            )));
        }
        match &self.kind {
            HostKind::Plain { pd, ctx } => {
                let entries = 2 * (caps.max_send_wr + caps.max_recv_wr).max(8);
                let cq = ctx.create_cq(entries, false).map_err(verbs)?;
                let qp = pd.create_qp(&cq, &cq, caps).map_err(verbs)?;
                Ok(Conn::Plain { qp, cq })
            }
            HostKind::Resilient { pd, .. } => {
                Ok(Conn::Resilient(pd.create_qp(caps).map_err(verbs)?))
            }
        }
    }
}

/// A registered buffer on a plain or a resilient host.
#[derive(Debug)]
pub enum Memory {
    /// Registered on one device.
    Plain(RegisteredBuffer),
    /// Registered on both devices.
    Resilient(ResilientBuffer),
}

impl std::ops::Deref for Memory {
    type Target = RegisteredBuffer;
    fn deref(&self) -> &RegisteredBuffer {
        match self {
            Memory::Plain(b) => b,
            Memory::Resilient(b) => b,
        }
    }
}

/// A connected QP: plain, or resilient (failover to the backup device).
pub enum Conn {
    /// A plain RC QP and its CQ.
    Plain {
        /// The QP.
        qp: Qp,
        /// Its CQ (both queues).
        cq: Cq,
    },
    /// A resilient QP.
    Resilient(ResilientQp),
}

impl Conn {
    /// The QP number the peer connects to.
    pub fn qpn(&self) -> u32 {
        match self {
            Conn::Plain { qp, .. } => qp.qpn(),
            Conn::Resilient(qp) => qp.qpn(),
        }
    }

    /// The granted capabilities.
    pub fn caps(&self) -> QpCaps {
        match self {
            Conn::Plain { qp, .. } => qp.caps(),
            Conn::Resilient(qp) => qp.caps(),
        }
    }

    /// Writes a send WQE (published by [`Conn::ring`]).
    #[inline]
    pub fn post_send(&mut self, wr: &SendWr<'_>) -> Result<(), PostError> {
        match self {
            Conn::Plain { qp, .. } => qp.post_send(wr).map(|_| ()),
            Conn::Resilient(qp) => qp.post_send(wr),
        }
    }

    /// Rings the doorbell for everything posted.
    #[inline]
    pub fn ring(&mut self) {
        match self {
            Conn::Plain { qp, .. } => qp.ring_doorbell(),
            Conn::Resilient(qp) => qp.ring_doorbell(),
        }
    }

    /// Posts a receive.
    #[inline]
    pub fn post_recv(&mut self, wr: &RecvWr) -> Result<(), PostError> {
        match self {
            Conn::Plain { qp, .. } => qp.post_recv(wr),
            Conn::Resilient(qp) => qp.post_recv(wr),
        }
    }

    /// Polls completions; when none came and the device progresses manually, drives it once
    /// and polls again (one thread per process polls). Also runs due failover work.
    #[inline]
    pub fn poll(&mut self, wcs: &mut [WorkCompletion]) -> usize {
        match self {
            Conn::Plain { cq, .. } => cq.poll_with_progress(wcs),
            Conn::Resilient(qp) => qp.poll_with_progress(wcs),
        }
    }

    /// Polls completions without driving the devices (also runs due failover work): for a
    /// loop over many QPs, which drives them itself (`Session::poll_qp` in `session`).
    #[inline]
    pub fn poll_only(&mut self, wcs: &mut [WorkCompletion]) -> usize {
        match self {
            Conn::Plain { cq, .. } => cq.poll(wcs),
            Conn::Resilient(qp) => qp.poll(wcs),
        }
    }

    /// Runs the failover work of a resilient QP that has mail waiting, without taking
    /// completions out (they wait for its next poll); returns whether it had any. A plain QP
    /// has none.
    #[inline]
    pub fn take_failover_mail(&mut self) -> bool {
        match self {
            Conn::Plain { .. } => false,
            Conn::Resilient(qp) => {
                if qp.has_mail() {
                    qp.progress();
                    true
                } else {
                    false
                }
            }
        }
    }

    /// The failover state as the JSON timeline names it (`default` for a plain QP that has
    /// not failed, `failed` once it has).
    pub fn state(&self, failed: bool) -> &'static str {
        match self {
            Conn::Plain { .. } if failed => "failed",
            Conn::Plain { .. } => "default",
            Conn::Resilient(qp) => timeline_state(qp.state()),
        }
    }

    /// Failover counters (resilient QPs).
    pub fn stats(&self) -> Option<FailoverStats> {
        match self {
            Conn::Plain { .. } => None,
            Conn::Resilient(qp) => Some(qp.stats()),
        }
    }

    /// The failover event log (resilient QPs).
    pub fn events(&self) -> &[FailoverEvent] {
        match self {
            Conn::Plain { .. } => &[],
            Conn::Resilient(qp) => qp.events(),
        }
    }

    /// Lets the failover service wake a parked poller when it has work for this QP.
    pub fn set_waker(&self, unparker: crossbeam_utils::sync::Unparker) {
        if let Conn::Resilient(qp) = self {
            qp.set_waker(Some(unparker));
        }
    }

    /// This end's attributes for the peer (the backup blob for a resilient QP; it waits
    /// until the service lcore has created the backup QP).
    pub fn local_info(
        &self,
        gid: Gid,
        psn: u32,
        mem: &Memory,
        mtu: Mtu,
    ) -> Result<QpInfo, AppError> {
        let backup = match self {
            Conn::Plain { .. } => None,
            Conn::Resilient(qp) => Some(to_hex(
                &qp.rendezvous_blob(SETUP_TIMEOUT)
                    .map_err(|e| AppError::Failover(e.to_string()))?,
            )),
        };
        Ok(QpInfo {
            qpn: self.qpn(),
            psn,
            gid: gid.to_string(),
            rkey: mem.rkey(),
            addr: mem.addr(),
            len: mem.len() as u64,
            mtu: mtu.bytes(),
            backup,
        })
    }

    /// Hands a resilient QP the peer's backup attributes, then moves the QP through INIT,
    /// RTR and RTS towards the peer.
    pub fn bring_up(
        &mut self,
        ours: &QpInfo,
        peer: &QpInfo,
        mtu: Mtu,
        timeout: u8,
    ) -> Result<(), AppError> {
        let rd_atomic = QpAttr::rts(0).max_rd_atomic.unwrap_or(1);
        self.bring_up_with(ours, peer, mtu, timeout, rd_atomic)
    }

    /// [`Conn::bring_up`], with at most `rd_atomic` READs and atomics outstanding (what the
    /// peer's responder takes).
    pub fn bring_up_with(
        &mut self,
        ours: &QpInfo,
        peer: &QpInfo,
        mtu: Mtu,
        timeout: u8,
        rd_atomic: u8,
    ) -> Result<(), AppError> {
        let peer_gid: std::net::IpAddr = peer.gid.parse().map_err(|_| {
            AppError::Peer(format!("the peer's GID {:?} is not an address", peer.gid))
        })?;
        let gid = Gid::from_ip(peer_gid);
        if let Conn::Resilient(qp) = self {
            let blob = peer
                .backup
                .as_deref()
                .ok_or_else(|| AppError::Peer("the peer sent no backup attributes".into()))?;
            qp.connect_backup(&from_hex(blob)?)
                .map_err(|e| AppError::Failover(e.to_string()))?;
        }
        let rtr = QpAttr::rtr(AddressVector::to_gid(gid), peer.qpn, peer.psn, mtu);
        let mut rts = QpAttr::rts(ours.psn);
        rts.timeout = Some(timeout);
        rts.max_rd_atomic = Some(rd_atomic);
        let modify = |r: Result<(), pmd::ModifyError>, to: &str| {
            r.map_err(|e| AppError::Verbs(format!("moving the QP to {to}: {e}")))
        };
        match self {
            Conn::Plain { qp, .. } => {
                modify(qp.modify(QpState::Init, &QpAttr::init(Access::ALL)), "INIT")?;
                modify(qp.modify(QpState::Rtr, &rtr), "RTR")?;
                modify(qp.modify(QpState::Rts, &rts), "RTS")?;
            }
            Conn::Resilient(qp) => {
                modify(qp.modify(QpState::Init, &QpAttr::init(Access::ALL)), "INIT")?;
                modify(qp.modify(QpState::Rtr, &rtr), "RTR")?;
                modify(qp.modify(QpState::Rts, &rts), "RTS")?;
            }
        }
        Ok(())
    }

    /// Waits until a resilient QP's backup side is connected (at once for a plain QP). Bring
    /// every QP of a process up before waiting on any: the peers' bring-ups may wait on ours.
    pub fn wait_protected(&mut self) -> Result<(), AppError> {
        if let Conn::Resilient(qp) = self {
            qp.wait_protected(SETUP_TIMEOUT)
                .map_err(|e| AppError::Failover(e.to_string()))?;
        }
        Ok(())
    }
}

/// The worst of several failover states (timeline names), for a run on several QPs.
pub fn worst_state<'a>(states: impl Iterator<Item = &'a str>) -> &'static str {
    const ORDER: [&str; 5] = [
        "default",
        "wait-drained",
        "wait-signaled",
        "fallback",
        "failed",
    ];
    states
        .map(|s| ORDER.iter().position(|o| *o == s).unwrap_or(0))
        .max()
        .map_or("default", |i| ORDER[i])
}

/// How long setup steps (backup QP creation, protection) may take.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(10);

/// The path MTU both ends use: the smaller of ours (from `-m` or the port) and the peer's.
pub fn agree_mtu(ours: Mtu, peer_bytes: u32) -> Mtu {
    [
        Mtu::Mtu4096,
        Mtu::Mtu2048,
        Mtu::Mtu1024,
        Mtu::Mtu512,
        Mtu::Mtu256,
    ]
    .into_iter()
    .find(|m| m.bytes() <= ours.bytes().min(peer_bytes))
    .unwrap_or(Mtu::Mtu256)
}

/// The MTU for `-m` bytes.
pub fn mtu_of(bytes: u32) -> Option<Mtu> {
    [
        Mtu::Mtu256,
        Mtu::Mtu512,
        Mtu::Mtu1024,
        Mtu::Mtu2048,
        Mtu::Mtu4096,
    ]
    .into_iter()
    .find(|m| m.bytes() == bytes)
}

/// A resilient QP's state as the JSON timeline names it (`default | fallback | wait-signaled |
/// wait-drained | failed`): a running round, failover or failback, counts as fallback, an
/// unprotected QP as default.
fn timeline_state(state: ResilientState) -> &'static str {
    match state {
        ResilientState::Unprotected | ResilientState::Default => "default",
        ResilientState::FailingOver | ResilientState::Fallback | ResilientState::FailingBack => {
            "fallback"
        }
        ResilientState::WaitSignaled => "wait-signaled",
        ResilientState::WaitDrained => "wait-drained",
        ResilientState::Failed => "failed",
    }
}
