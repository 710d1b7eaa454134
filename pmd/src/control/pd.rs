//! Protection domains, memory regions and registered buffers.

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::datapath::wr::{Remote, Sge};
use crate::keys::MrEntry;
use crate::memory::{load_shared, store_shared, Block, PageSize};
use crate::provider::{Handle, RawMr, VerbsError};
use crate::verbs::Access;

use super::Context;

/// A protection domain: MRs and QPs of one PD may work together, others may not.
#[derive(Debug)]
pub struct Pd {
    ctx: Arc<Context>,
    handle: Handle,
    id: u32,
}

impl Pd {
    pub(crate) fn alloc(ctx: &Arc<Context>) -> Result<Arc<Pd>, VerbsError> {
        let handle = ctx.provider().alloc_pd()?;
        Ok(Arc::new(Pd {
            ctx: ctx.clone(),
            handle,
            id: ctx.next_pd_id(),
        }))
    }

    /// The device.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    pub(crate) fn handle(&self) -> Handle {
        self.handle
    }

    /// The driver's id of this PD (what the key table records).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Registers `len` bytes at `addr`.
    ///
    /// # Safety
    /// The range must stay mapped until the returned [`Mr`] is deregistered, and the caller
    /// must not rely on exclusive access to it while work requests that name it are
    /// outstanding: the device reads and writes it as those requests say, as with
    /// `ibv_reg_mr`. A deregistration the device refuses ([`Mr::deregister`] returns the
    /// error; a drop logs and counts it) leaves the range registered: it must then stay
    /// mapped as long as the device is open.
    pub unsafe fn register(
        self: &Arc<Self>,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Mr, VerbsError> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.register_or_say_if_still_registered(addr, len, access) }
            .map_err(|failure| failure.error)
    }

    /// [`Pd::register`], and on failure whether the device still holds the range (a key
    /// table without room, then a deregistration the device refused).
    ///
    /// # Safety
    /// As [`Pd::register`].
    unsafe fn register_or_say_if_still_registered(
        self: &Arc<Self>,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Mr, RegisterFailure> {
        // SAFETY: forwarded from this function's contract.
        let raw = unsafe { self.ctx.provider().reg_mr(self.handle, addr, len, access) }.map_err(
            |error| RegisterFailure {
                error,
                still_registered: false,
            },
        )?;
        let entry = MrEntry {
            lkey: raw.lkey,
            rkey: raw.rkey,
            addr: addr as u64,
            len: len as u64,
            access,
            pd: self.id,
        };
        if let Err(e) = self.ctx.keys().insert(entry) {
            let dereg = self.ctx.provider().dereg_mr(raw.handle);
            let still_registered = dereg.is_err();
            self.ctx.released("dereg_mr", dereg);
            return Err(RegisterFailure {
                error: VerbsError::OutOfResources {
                    device: self.ctx.name().to_string(),
                    verb: "reg_mr",
                    what: e.to_string(),
                },
                still_registered,
            });
        }
        Ok(Mr {
            pd: self.clone(),
            raw,
            entry,
            registered: true,
        })
    }

    /// Allocates `len` bytes from the device's pool (hugepages when available) and registers
    /// them with `access`.
    pub fn alloc_buffer(
        self: &Arc<Self>,
        len: usize,
        access: Access,
    ) -> Result<RegisteredBuffer, VerbsError> {
        let block =
            self.ctx
                .memory()
                .alloc(len.max(1), 64)
                .map_err(|e| VerbsError::OutOfResources {
                    device: self.ctx.name().to_string(),
                    verb: "alloc_buffer",
                    what: e.to_string(),
                })?;
        // SAFETY: the block is ours and stays mapped until the RegisteredBuffer (which owns
        // it) drops; the buffer deregisters its MR first, and quarantines the block if that
        // fails. A failure here quarantines it too.
        match unsafe {
            self.register_or_say_if_still_registered(block.as_ptr(), len.max(1), access)
        } {
            Ok(mr) => Ok(RegisteredBuffer {
                mr,
                block: ManuallyDrop::new(block),
                refused: false,
                also_reached_by: None,
            }),
            Err(failure) => {
                if failure.still_registered {
                    self.ctx.quarantine(block);
                }
                Err(failure.error)
            }
        }
    }
}

/// A registration that failed, and whether the device may still reach the memory.
struct RegisterFailure {
    error: VerbsError,
    still_registered: bool,
}

impl Drop for Pd {
    fn drop(&mut self) {
        self.ctx
            .released("dealloc_pd", self.ctx.provider().dealloc_pd(self.handle));
    }
}

/// A registered memory region. Deregistered on drop (or by [`Mr::deregister`], which says
/// whether the device agreed): its key leaves the key table first, so posts naming it fail
/// at once, then the device forgets it.
#[derive(Debug)]
pub struct Mr {
    pd: Arc<Pd>,
    raw: RawMr,
    entry: MrEntry,
    /// Until the first deregistration attempt (one attempt only: a refused one is final).
    registered: bool,
}

impl Mr {
    /// The local key.
    pub fn lkey(&self) -> u32 {
        self.raw.lkey
    }

    /// The remote key, for the peer.
    pub fn rkey(&self) -> u32 {
        self.raw.rkey
    }

    /// First byte.
    pub fn addr(&self) -> u64 {
        self.entry.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.entry.len as usize
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.entry.len == 0
    }

    /// Access rights.
    pub fn access(&self) -> Access {
        self.entry.access
    }

    /// The PD.
    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }

    /// A gather/scatter entry for `len` bytes at `offset`.
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        Sge::new(self.entry.addr + offset as u64, len, self.raw.lkey)
    }

    /// What a peer needs to reach `offset` of this region.
    pub fn remote(&self, offset: usize) -> Remote {
        Remote {
            addr: self.entry.addr + offset as u64,
            rkey: self.raw.rkey,
        }
    }
}

impl Mr {
    /// Deregisters the region now. An error means the device refused: it may still read
    /// and write the memory, which must then stay mapped while the device is open (the
    /// refusal is also logged and counted in [`super::ControlStats::destroy_failures`]).
    pub fn deregister(mut self) -> Result<(), VerbsError> {
        self.release()
    }

    /// Deregisters once (later calls return `Ok`): what `deregister`, a drop and the
    /// resilient layer's revocation share.
    pub(crate) fn release(&mut self) -> Result<(), VerbsError> {
        if !std::mem::replace(&mut self.registered, false) {
            return Ok(());
        }
        let ctx = self.pd.context();
        ctx.keys().remove(self.raw.lkey);
        let result = ctx.provider().dereg_mr(self.raw.handle);
        ctx.released("dereg_mr", result.clone());
        result
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // Logged and counted by `release`; a drop has no one to tell.
        let _ = self.release();
    }
}

/// Pool memory registered as one MR: what applications post from and into. Dropping it
/// deregisters the MR, then returns the memory to the pool, or, if the device refused the
/// deregistration, quarantines it until the device closes (fail closed: memory the device
/// may still reach is never handed out again).
#[derive(Debug)]
pub struct RegisteredBuffer {
    mr: Mr,
    /// Taken only in `drop`, after the MR's deregistration.
    block: ManuallyDrop<Block>,
    /// This device refused an early deregistration (`deregister_now`).
    refused: bool,
    /// Another device that may still reach the memory (a backup registration of the same
    /// memory whose deregistration that device refused): the memory is quarantined there.
    also_reached_by: Option<Arc<Context>>,
}

impl Drop for RegisteredBuffer {
    fn drop(&mut self) {
        let refused = self.mr.release().is_err() || self.refused;
        // SAFETY: the block is taken once, here, and `self` is not used after.
        let block = unsafe { ManuallyDrop::take(&mut self.block) };
        match (refused, self.also_reached_by.take()) {
            (false, None) => drop(block),
            (true, None) => self.mr.pd.context().quarantine(block),
            (false, Some(other)) => other.quarantine(block),
            (true, Some(other)) => {
                // Two devices may reach it and either may close first: held for good.
                tracing::error!(
                    device = %self.mr.pd.context().name(),
                    other = %other.name(),
                    addr = block.as_ptr() as usize,
                    len = block.len(),
                    "memory leaked: two devices refused its deregistration"
                );
                std::mem::forget(block);
            }
        }
    }
}

impl RegisteredBuffer {
    /// Deregisters the MR now, keeping the memory until the buffer drops; a refusal is
    /// returned and remembered, and the drop then quarantines the memory.
    pub(crate) fn deregister_now(&mut self) -> Result<(), VerbsError> {
        let result = self.mr.release();
        self.refused |= result.is_err();
        result
    }

    /// `other` (another device that registered the same memory) refused to deregister it:
    /// the drop quarantines the memory with `other` instead of returning it to the pool.
    pub(crate) fn also_reached_by(&mut self, other: Arc<Context>) {
        self.also_reached_by = Some(other);
    }

    /// The MR.
    pub fn mr(&self) -> &Mr {
        &self.mr
    }

    /// First byte's address.
    pub fn addr(&self) -> u64 {
        self.mr.addr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.mr.len()
    }

    /// Whether the buffer is empty (never: buffers have at least one byte).
    pub fn is_empty(&self) -> bool {
        self.mr.is_empty()
    }

    /// The local key.
    pub fn lkey(&self) -> u32 {
        self.mr.lkey()
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        self.mr.rkey()
    }

    /// The page size backing the buffer.
    pub fn page_size(&self) -> PageSize {
        self.block.page_size()
    }

    /// A gather/scatter entry for `len` bytes at `offset`.
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        self.mr.sge(offset, len)
    }

    /// What a peer needs to reach `offset`.
    pub fn remote(&self, offset: usize) -> Remote {
        self.mr.remote(offset)
    }

    /// Start of the buffer.
    pub fn as_ptr(&self) -> *mut u8 {
        self.block.as_ptr()
    }

    fn check_range(&self, offset: usize, len: usize) {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len()),
            "range {offset}+{len} outside a buffer of {} bytes",
            self.len()
        );
    }

    /// Copies `data` into the buffer at `offset`. Panics if the range is outside the buffer
    /// (a programming error, like slice indexing).
    ///
    /// Byte-wise atomic, as the device's own copies are: a peer may write these bytes at the
    /// same time (the application's ordering bug, or a hostile peer), and a plain copy racing
    /// it would be undefined behaviour (see [`crate::memory::load_shared`]).
    pub fn write(&self, offset: usize, data: &[u8]) {
        self.check_range(offset, data.len());
        // SAFETY: the range is inside the block (checked), which is mapped read-write.
        unsafe { store_shared(data, self.as_ptr().add(offset)) }
    }

    /// Copies bytes at `offset` out of the buffer. Panics if the range is outside the buffer.
    /// Byte-wise atomic, as `write`.
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        self.check_range(offset, out.len());
        // SAFETY: as in `write`.
        unsafe { load_shared(self.as_ptr().add(offset), out) }
    }

    /// Reads a native-endian u64 at `offset` (an atomic's target, or where its result lands):
    /// one 8-byte atomic load at an 8-byte aligned address, so it races with the device's
    /// atomics on the word at the same size; bytes otherwise.
    pub fn read_u64(&self, offset: usize) -> u64 {
        self.check_range(offset, 8);
        // SAFETY: in the block (checked); the pointer is used only if 8-byte aligned.
        let p = unsafe { self.as_ptr().add(offset) };
        if p.align_offset(8) == 0 {
            // SAFETY: aligned, inside the read-write block, which outlives the reference.
            return unsafe { AtomicU64::from_ptr(p.cast()) }.load(Ordering::Relaxed);
        }
        let mut b = [0u8; 8];
        self.read(offset, &mut b);
        u64::from_ne_bytes(b)
    }

    /// Writes a native-endian u64 at `offset` (an atomic's target), as `read_u64` reads it.
    pub fn write_u64(&self, offset: usize, value: u64) {
        self.check_range(offset, 8);
        // SAFETY: as in `read_u64`.
        let p = unsafe { self.as_ptr().add(offset) };
        if p.align_offset(8) == 0 {
            // SAFETY: as in `read_u64`.
            unsafe { AtomicU64::from_ptr(p.cast()) }.store(value, Ordering::Relaxed);
            return;
        }
        self.write(offset, &value.to_ne_bytes());
    }

    /// The buffer as a slice.
    ///
    /// # Safety
    /// No outstanding work request may write the buffer while the slice lives (RDMA WRITEs
    /// from a peer, receives, READ responses), as with any DMA memory.
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: the block is len bytes, mapped while self lives; the caller excludes writers.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len()) }
    }
}
