//! The device context: one opened NIC, its provider, its key table and its memory pool.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::keys::KeyTable;
use crate::memory::{Block, HugepagePolicy, MemoryPool};
use crate::name::{DeviceName, NameError};
use crate::provider::{
    CqRequest, DeviceFault, DeviceStep, Handle, PortEvent, ProgressModel, Provider, VerbsError,
};
use crate::verbs::{DeviceAttr, Gid, PortAttr};

use super::{Cq, Pd};

/// How a device is opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextConfig {
    /// Where rings and buffers come from.
    pub hugepages: HugepagePolicy,
    /// Slots of the key table (a power of two; well above the number of MRs).
    pub key_table_slots: usize,
    /// How a softnic device makes progress (hardware ignores this).
    pub progress: ProgressModel,
}

impl Default for ContextConfig {
    fn default() -> ContextConfig {
        ContextConfig {
            hugepages: HugepagePolicy::Prefer,
            key_table_slots: 4096,
            progress: ProgressModel::Auto,
        }
    }
}

impl ContextConfig {
    /// Key-table slots for a device that will hold `qps` QPs: 8 a QP (a resilient QP
    /// registers its control channel's ring on both of its devices, beside the application's
    /// MRs), a power of two, never below the default.
    pub fn key_table_slots_for(qps: u32) -> usize {
        (qps as usize * 8)
            .next_power_of_two()
            .max(ContextConfig::default().key_table_slots)
    }
}

#[cfg(test)]
mod key_table_tests {
    use super::*;

    #[test]
    fn the_key_table_grows_with_the_qps_and_never_below_the_default() {
        assert_eq!(ContextConfig::key_table_slots_for(1), 4096);
        assert_eq!(ContextConfig::key_table_slots_for(4096), 32768);
        assert!(ContextConfig::key_table_slots_for(1000) >= 8000);
    }
}

/// Why a device could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// The name did not parse.
    #[error(transparent)]
    Name(#[from] NameError),
    /// The provider refused.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
}

/// Counters of the control path.
#[derive(Debug, Default)]
pub struct ControlStats {
    destroy_failures: AtomicU64,
    quarantined_blocks: AtomicU64,
    quarantined_bytes: AtomicU64,
}

impl ControlStats {
    /// Destroy, dealloc and dereg calls the device refused (each also logged).
    pub fn destroy_failures(&self) -> u64 {
        self.destroy_failures.load(Ordering::Relaxed)
    }

    /// Registered buffers whose deregistration the device refused: their memory is held
    /// until the device closes, never handed out again.
    pub fn quarantined_blocks(&self) -> u64 {
        self.quarantined_blocks.load(Ordering::Relaxed)
    }

    /// Bytes of those buffers.
    pub fn quarantined_bytes(&self) -> u64 {
        self.quarantined_bytes.load(Ordering::Relaxed)
    }
}

/// One opened device. Everything created from it holds it by `Arc`.
pub struct Context {
    // Field order matters: the device closes (and can reach no memory) before the quarantined
    // blocks go back to the pool.
    provider: Box<dyn Provider>,
    /// Memory a failed deregistration left registered: the device may still read or write
    /// it, so it is not reused while the device is open (fail closed).
    quarantine: Mutex<Vec<Block>>,
    device: Arc<str>,
    keys: Arc<KeyTable>,
    memory: MemoryPool,
    next_pd: AtomicU32,
    stats: ControlStats,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// Opens the device named `name` (see [`crate::name`] for the forms).
    pub fn open(name: &str, config: &ContextConfig) -> Result<Arc<Context>, OpenError> {
        let parsed: DeviceName = name.parse()?;
        let memory = MemoryPool::new(config.hugepages);
        let provider = crate::provider::open(&parsed, &memory, config)?;
        Ok(Context::with_provider(provider, memory, config))
    }

    /// A context over a provider opened elsewhere (a custom provider, or a test double).
    pub fn with_provider(
        provider: Box<dyn Provider>,
        memory: MemoryPool,
        config: &ContextConfig,
    ) -> Arc<Context> {
        let device: Arc<str> = provider.name().to_string().into();
        tracing::info!(device = %device, "device opened");
        Arc::new(Context {
            provider,
            quarantine: Mutex::new(Vec::new()),
            device,
            keys: Arc::new(KeyTable::new(config.key_table_slots)),
            memory,
            next_pd: AtomicU32::new(1),
            stats: ControlStats::default(),
        })
    }

    /// The device's name, as opened.
    pub fn name(&self) -> &str {
        &self.device
    }

    pub(crate) fn device_arc(&self) -> Arc<str> {
        self.device.clone()
    }

    pub(crate) fn provider(&self) -> &dyn Provider {
        &*self.provider
    }

    pub(crate) fn next_pd_id(&self) -> u32 {
        // PD ids fit in the key table's 24 bits; wrapping after 16 M PDs is harmless because
        // ids only need to differ among live PDs of one device.
        self.next_pd.fetch_add(1, Ordering::Relaxed) & 0x00ff_ffff
    }

    /// The device's key table (lkey -> MR), which the datapath validates against.
    pub fn keys(&self) -> &Arc<KeyTable> {
        &self.keys
    }

    /// The pool rings and registered buffers come from.
    pub fn memory(&self) -> &MemoryPool {
        &self.memory
    }

    /// Control-path counters.
    pub fn stats(&self) -> &ControlStats {
        &self.stats
    }

    /// Device limits.
    pub fn query_device(&self) -> Result<DeviceAttr, VerbsError> {
        self.provider.query_device()
    }

    /// Port state and MTUs.
    pub fn query_port(&self) -> Result<PortAttr, VerbsError> {
        self.provider.query_port()
    }

    /// A GID of the port (index 0 is the device's address).
    pub fn query_gid(&self, index: u16) -> Result<Gid, VerbsError> {
        self.provider.query_gid(index)
    }

    /// The oldest unread SRQ limit event: the handle ([`crate::Srq::handle`]) of the SRQ
    /// whose receives dropped below its armed limit (which is now disarmed).
    pub fn poll_srq_event(&self) -> Option<Handle> {
        self.provider.poll_srq_event()
    }

    /// How the device makes progress.
    pub fn progress_model(&self) -> ProgressModel {
        self.provider.progress_model()
    }

    /// One round of device work under manual progress; a no-op otherwise. Returns whether
    /// anything happened.
    #[inline]
    pub fn progress(&self) -> bool {
        self.provider.progress()
    }

    /// One round of device work under manual progress, and when the device next needs one.
    pub fn step(&self) -> DeviceStep {
        self.provider.step()
    }

    /// The oldest unread port event (link up or down, device fatal), if any.
    pub fn poll_port_event(&self) -> Option<PortEvent> {
        self.provider.poll_port_event()
    }

    /// Injects `fault` into the device (softnic; hardware refuses with
    /// [`VerbsError::Unsupported`]).
    pub fn inject_fault(&self, fault: DeviceFault) -> Result<(), VerbsError> {
        self.provider.inject_fault(fault)
    }

    /// A descriptor that becomes readable when a port event may be waiting.
    pub fn port_event_fd(&self) -> Option<std::os::fd::RawFd> {
        self.provider.port_event_fd()
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(self: &Arc<Self>) -> Result<Arc<Pd>, VerbsError> {
        Pd::alloc(self)
    }

    /// Creates a CQ of at least `entries` CQEs, with completion events if `events`.
    pub fn create_cq(self: &Arc<Self>, entries: u32, events: bool) -> Result<Cq, VerbsError> {
        Cq::create(self, &CqRequest { entries, events })
    }

    /// Keeps `block` out of the pool until the device closes: a deregistration of the memory
    /// failed, so the device may still reach it.
    pub(crate) fn quarantine(&self, block: Block) {
        self.stats
            .quarantined_blocks
            .fetch_add(1, Ordering::Relaxed);
        self.stats
            .quarantined_bytes
            .fetch_add(block.len() as u64, Ordering::Relaxed);
        tracing::error!(
            device = %self.device,
            addr = block.as_ptr() as usize,
            len = block.len(),
            "memory quarantined until the device closes: its deregistration failed"
        );
        self.quarantine
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(block);
    }

    /// Logs and counts a failed release; used by every Drop of the control objects.
    pub(crate) fn released(&self, verb: &'static str, result: Result<(), VerbsError>) {
        if let Err(e) = result {
            self.stats.destroy_failures.fetch_add(1, Ordering::Relaxed);
            tracing::error!(device = %self.device, verb, error = %e, "release failed; resource leaked");
        }
    }
}
