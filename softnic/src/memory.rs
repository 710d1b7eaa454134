//! Memory shared between the driver and the device: queue rings, doorbell records, and the
//! raw accessors the device uses on them and on registered memory.
//!
//! The driver owns this memory and writes it concurrently with the device, exactly as a driver
//! and a ConnectX share DMA memory. Ordering comes from the doorbell protocol: the device reads a
//! WQE only after an acquire load of the doorbell-record counter that the driver stored after
//! writing it, and writes a CQE's owner byte with a release store after every other byte.

use std::alloc::Layout;
use std::any::Any;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::Arc;

/// A range of process memory handed to the device for a ring or a doorbell record.
///
/// The `owner` keeps the mapping alive while the device uses it (a hugepage mapping, a `Vec`,
/// or [`QueueMemory::alloc`]'s own buffer).
#[derive(Clone)]
pub struct QueueMemory {
    ptr: NonNull<u8>,
    len: usize,
    _owner: Arc<dyn Any + Send + Sync>,
}

// SAFETY: QueueMemory is a pointer to memory kept alive by `_owner` (Send + Sync); every access
// through it goes through the raw accessors below, which are used under the doorbell protocol.
unsafe impl Send for QueueMemory {}
// SAFETY: as above; shared references only hand out the pointer.
unsafe impl Sync for QueueMemory {}

impl std::fmt::Debug for QueueMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QueueMemory({:p}+{:#x})", self.ptr, self.len)
    }
}

/// A zeroed, page-aligned heap allocation, freed when the last `QueueMemory` over it drops.
struct AlignedBuffer {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the buffer is plain memory owned by this value.
unsafe impl Send for AlignedBuffer {}
// SAFETY: the buffer is plain memory; concurrent access follows the doorbell protocol.
unsafe impl Sync for AlignedBuffer {}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        // SAFETY: ptr was returned by alloc_zeroed with this layout and is freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl QueueMemory {
    /// Wraps caller-owned memory.
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay mapped, readable and writable, and not be freed while `owner`
    /// (or any clone of the returned value) is alive.
    pub unsafe fn from_raw(
        ptr: NonNull<u8>,
        len: usize,
        owner: Arc<dyn Any + Send + Sync>,
    ) -> Self {
        QueueMemory {
            ptr,
            len,
            _owner: owner,
        }
    }

    /// A zeroed, 4096-byte aligned allocation of `len` bytes (at least one byte is allocated).
    pub fn alloc(len: usize) -> QueueMemory {
        let layout =
            Layout::from_size_align(len.max(1), 4096).expect("queue memory size overflows");
        // SAFETY: layout has non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        let owner = Arc::new(AlignedBuffer { ptr, layout });
        QueueMemory {
            ptr,
            len,
            _owner: owner,
        }
    }

    /// A sub-range of this memory, sharing its owner, or `None` when it does not fit.
    pub fn slice(&self, offset: usize, len: usize) -> Option<QueueMemory> {
        let end = offset.checked_add(len)?;
        if end > self.len {
            return None;
        }
        // SAFETY: offset <= len of a live allocation, so the result is in bounds and non-null.
        let ptr = unsafe { NonNull::new_unchecked(self.ptr.as_ptr().add(offset)) };
        Some(QueueMemory {
            ptr,
            len,
            _owner: self._owner.clone(),
        })
    }

    /// The first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `out.len()` bytes from `offset` into `out`. The caller checked the range.
    pub(crate) fn read(&self, offset: usize, out: &mut [u8]) {
        assert!(
            offset + out.len() <= self.len,
            "queue memory read out of range"
        );
        // SAFETY: in bounds (asserted); the driver does not write these bytes while the device
        // owns them (doorbell protocol), so a plain copy is sound.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                out.as_mut_ptr(),
                out.len(),
            )
        }
    }

    /// Copies `data` to `offset`. The caller checked the range.
    pub(crate) fn write(&self, offset: usize, data: &[u8]) {
        assert!(
            offset + data.len() <= self.len,
            "queue memory write out of range"
        );
        // SAFETY: in bounds (asserted); the driver does not read these bytes before the release
        // store that publishes them.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(offset), data.len())
        }
    }

    /// Loads a big-endian 32-bit counter at a 4-byte aligned offset with acquire ordering.
    pub fn load_be32(&self, offset: usize) -> u32 {
        u32::from_be(self.atomic_u32(offset).load(Ordering::Acquire))
    }

    /// Stores a big-endian 32-bit counter at a 4-byte aligned offset with release ordering.
    pub fn store_be32(&self, offset: usize, value: u32) {
        self.atomic_u32(offset)
            .store(value.to_be(), Ordering::Release)
    }

    /// Stores one byte with release ordering: every earlier write is visible before it.
    pub(crate) fn store_u8_release(&self, offset: usize, value: u8) {
        assert!(offset < self.len, "queue memory store out of range");
        // SAFETY: in bounds; AtomicU8 has alignment 1; the byte is shared with the driver, which
        // reads it with an acquire load or a volatile read followed by a barrier.
        unsafe { AtomicU8::from_ptr(self.ptr.as_ptr().add(offset)) }.store(value, Ordering::Release)
    }

    fn atomic_u32(&self, offset: usize) -> &AtomicU32 {
        assert!(offset + 4 <= self.len, "doorbell offset out of range");
        // SAFETY: in bounds (asserted) and alignment checked next; the word lives as long as
        // self; both sides access it only atomically.
        let p = unsafe { self.ptr.as_ptr().add(offset) };
        assert!(
            (p as usize) % 4 == 0,
            "doorbell counter is not 4-byte aligned"
        );
        // SAFETY: aligned, in bounds, valid for the lifetime of &self.
        unsafe { AtomicU32::from_ptr(p.cast()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_is_zeroed_and_page_aligned() {
        let m = QueueMemory::alloc(8192);
        assert_eq!(m.as_ptr() as usize % 4096, 0);
        let mut buf = [0xffu8; 64];
        m.read(8192 - 64, &mut buf);
        assert!(buf.iter().all(|&b| b == 0));
    }

    #[test]
    fn be32_counters_are_stored_big_endian() {
        let m = QueueMemory::alloc(8);
        m.store_be32(4, 0x0102_0304);
        let mut buf = [0u8; 4];
        m.read(4, &mut buf);
        assert_eq!(buf, [1, 2, 3, 4]);
        assert_eq!(m.load_be32(4), 0x0102_0304);
    }

    #[test]
    fn slice_outside_the_range_is_refused() {
        let m = QueueMemory::alloc(64);
        assert!(m.slice(32, 32).is_some());
        assert!(m.slice(33, 32).is_none());
        assert!(m.slice(usize::MAX, 2).is_none());
    }
}
