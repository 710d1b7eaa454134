//! Memory the device shares: queue rings, doorbell records and registered buffers.
//!
//! Everything comes from anonymous mappings made with nix `mmap`. With hugepages configured
//! (the default policy, [`HugepagePolicy::Prefer`]) a mapping is backed by 2 MiB pages
//! (`MAP_HUGETLB`), which keeps the TLB out of the datapath's way; when the kernel has none to
//! give (`vm.nr_hugepages` is 0, or they are used up) the pool falls back to 4 KiB pages and
//! says so exactly once per process.
//!
//! Small allocations (rings, doorbell records) are carved out of 2 MiB chunks by a first-fit
//! free list; large ones (application buffers of 1 MiB and more) get a mapping of their own.
//! Allocation is a control-path operation: it takes a lock and may call `mmap`.

use std::ffi::c_void;
use std::num::NonZeroUsize;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use nix::sys::mman::{mmap_anonymous, munmap, MapFlags, ProtFlags};

/// Size of a huge page, and of the chunks small allocations are carved from.
pub const HUGEPAGE_SIZE: usize = 2 << 20;
/// Size of a base page.
pub const PAGE_SIZE: usize = 4096;
/// Allocations at least this large get a mapping of their own.
const DEDICATED_THRESHOLD: usize = 1 << 20;

/// Whether memory comes from 2 MiB hugepages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HugepagePolicy {
    /// Always 4 KiB pages, silently.
    Never,
    /// Hugepages when the kernel has them, else 4 KiB pages with one warning per process.
    #[default]
    Prefer,
    /// Hugepages or an error.
    Require,
}

/// The page size backing a mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageSize {
    /// 4 KiB base pages.
    Base,
    /// 2 MiB hugepages.
    Huge,
}

/// Why memory could not be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemoryError {
    /// `mmap` refused.
    #[error("mmap of {len} bytes ({page:?} pages) failed: {errno}")]
    Map {
        /// Bytes asked for.
        len: usize,
        /// Page size tried.
        page: PageSize,
        /// What the kernel said.
        errno: nix::errno::Errno,
    },
    /// Hugepages were required and the kernel has none to give.
    #[error("hugepages required but unavailable for {len} bytes ({errno}); reserve some with `sysctl vm.nr_hugepages=N`")]
    HugepagesUnavailable {
        /// Bytes asked for.
        len: usize,
        /// What the kernel said.
        errno: nix::errno::Errno,
    },
    /// A zero-length or absurdly aligned request.
    #[error("invalid allocation request: {len} bytes aligned to {align}")]
    InvalidRequest {
        /// Bytes asked for.
        len: usize,
        /// Alignment asked for.
        align: usize,
    },
}

static FALLBACK_WARNED: AtomicBool = AtomicBool::new(false);
static FALLBACKS: AtomicU64 = AtomicU64::new(0);

/// How many mappings wanted hugepages and got 4 KiB pages in this process (one warning was
/// logged for the first of them).
pub fn hugepage_fallbacks() -> u64 {
    FALLBACKS.load(Ordering::Relaxed)
}

/// Counts a fallback to base pages; true only for the first one in the process, the one that
/// gets the warning.
fn note_fallback() -> bool {
    FALLBACKS.fetch_add(1, Ordering::Relaxed);
    !FALLBACK_WARNED.swap(true, Ordering::Relaxed)
}

/// One anonymous mapping; unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    page: PageSize,
}

// SAFETY: a Mapping is plain process memory owned by this value; the pointer is not tied to a
// thread.
unsafe impl Send for Mapping {}
// SAFETY: shared references only hand out the pointer; accesses through it are the caller's
// (and the device's) business, synchronised by the datapath's barriers.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes (rounded up to the page size) under `policy`.
    pub fn new(len: usize, policy: HugepagePolicy) -> Result<Mapping, MemoryError> {
        if len == 0 {
            return Err(MemoryError::InvalidRequest { len, align: 1 });
        }
        if policy != HugepagePolicy::Never {
            match Mapping::map(len.next_multiple_of(HUGEPAGE_SIZE), PageSize::Huge) {
                Ok(m) => return Ok(m),
                Err(errno) if policy == HugepagePolicy::Require => {
                    return Err(MemoryError::HugepagesUnavailable { len, errno });
                }
                Err(errno) => {
                    if note_fallback() {
                        tracing::warn!(
                            %errno,
                            "2 MiB hugepages unavailable; using 4 KiB pages for rings and buffers \
                             (reserve hugepages with `sysctl vm.nr_hugepages=N`)"
                        );
                    }
                }
            }
        }
        let rounded = len.next_multiple_of(PAGE_SIZE);
        Mapping::map(rounded, PageSize::Base).map_err(|errno| MemoryError::Map {
            len: rounded,
            page: PageSize::Base,
            errno,
        })
    }

    fn map(len: usize, page: PageSize) -> Result<Mapping, nix::errno::Errno> {
        let mut flags = MapFlags::MAP_PRIVATE;
        // Pre-faulting is an optimisation; Miri (which checks the shared-memory copies, docs/
        // security.md) takes no mmap flags but MAP_PRIVATE|MAP_ANONYMOUS.
        if !cfg!(miri) {
            flags |= MapFlags::MAP_POPULATE;
        }
        if page == PageSize::Huge {
            flags |= MapFlags::MAP_HUGETLB;
        }
        let size = NonZeroUsize::new(len).ok_or(nix::errno::Errno::EINVAL)?;
        // SAFETY: an anonymous private mapping at an address of the kernel's choosing aliases
        // nothing that exists.
        let ptr = unsafe {
            mmap_anonymous(
                None,
                size,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                flags,
            )?
        };
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
            page,
        })
    }

    /// Start of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes (a multiple of the page size).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: mappings are never empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The page size backing the mapping.
    pub fn page_size(&self) -> PageSize {
        self.page
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `Mapping::map` with this pointer and length, and the
        // value owning it is being dropped, so nothing in this process uses it any more (the
        // objects that let a device use it hold the Mapping alive).
        let result = unsafe { munmap(self.ptr.cast::<c_void>(), self.len) };
        if let Err(errno) = result {
            tracing::error!(%errno, len = self.len, "munmap failed; leaking the mapping");
        }
    }
}

struct Chunk {
    mapping: Mapping,
    /// Free ranges as (offset, len), sorted by offset, never adjacent (coalesced on free).
    free: Vec<(usize, usize)>,
    /// The longest free range: an allocation skips a chunk that has none long enough without
    /// walking its ranges. With thousands of QPs the pool holds hundreds of full chunks, and
    /// walking each one's leftovers made every allocation cost as much as all the earlier
    /// ones (setting up 2,048 resilient QPs spent a fifth of its time in `take`).
    largest: usize,
}

impl Chunk {
    /// A chunk over `mapping`, all of it free.
    fn new(mapping: Mapping) -> Chunk {
        let len = mapping.len();
        Chunk {
            free: vec![(0, len)],
            largest: len,
            mapping,
        }
    }

    fn take(&mut self, len: usize, align: usize) -> Option<usize> {
        if len > self.largest {
            return None;
        }
        let start = self.take_first_fit(len, align)?;
        self.largest = self.free.iter().map(|&(_, l)| l).max().unwrap_or(0);
        Some(start)
    }

    fn take_first_fit(&mut self, len: usize, align: usize) -> Option<usize> {
        let base = self.mapping.as_ptr() as usize;
        for i in 0..self.free.len() {
            let (off, flen) = self.free[i];
            let start = (base + off).next_multiple_of(align) - base;
            let pad = start - off;
            if pad + len > flen {
                continue;
            }
            let tail = (start + len, flen - pad - len);
            match (pad > 0, tail.1 > 0) {
                (false, false) => {
                    self.free.remove(i);
                }
                (false, true) => self.free[i] = tail,
                (true, false) => self.free[i] = (off, pad),
                (true, true) => {
                    self.free[i] = (off, pad);
                    self.free.insert(i + 1, tail);
                }
            }
            return Some(start);
        }
        None
    }

    fn give_back(&mut self, off: usize, len: usize) {
        let i = self.free.partition_point(|&(o, _)| o < off);
        self.free.insert(i, (off, len));
        // Coalesce with the right neighbour, then with the left one.
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        let mut merged = i;
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
            merged = i - 1;
        }
        self.largest = self.largest.max(self.free[merged].1);
    }
}

struct PoolInner {
    policy: HugepagePolicy,
    chunks: Mutex<Vec<Chunk>>,
}

/// The allocator for everything a device shares: rings, doorbell records, registered buffers.
/// Cheap to clone (an `Arc`).
#[derive(Clone)]
pub struct MemoryPool {
    inner: Arc<PoolInner>,
}

impl std::fmt::Debug for MemoryPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryPool")
            .field("policy", &self.inner.policy)
            .finish_non_exhaustive()
    }
}

enum BlockSource {
    /// Unmapped when the block drops.
    Dedicated(#[allow(dead_code)] Mapping),
    Chunk {
        chunk_base: usize,
        offset: usize,
    },
}

/// A zeroed, aligned block of pool memory; returned to the pool on drop.
pub struct Block {
    ptr: NonNull<u8>,
    len: usize,
    page: PageSize,
    source: BlockSource,
    pool: Arc<PoolInner>,
}

// SAFETY: a Block exclusively owns its byte range of process memory.
unsafe impl Send for Block {}
// SAFETY: shared references only expose the pointer; see `Mapping`.
unsafe impl Sync for Block {}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Block")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("page", &self.page)
            .finish()
    }
}

impl Block {
    /// Start of the block.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes, as requested.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: blocks are never empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The page size backing the block.
    pub fn page_size(&self) -> PageSize {
        self.page
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if let BlockSource::Chunk { chunk_base, offset } = self.source {
            let mut chunks = match self.pool.chunks.lock() {
                Ok(c) => c,
                Err(poisoned) => poisoned.into_inner(),
            };
            if let Some(chunk) = chunks
                .iter_mut()
                .find(|c| c.mapping.as_ptr() as usize == chunk_base)
            {
                chunk.give_back(offset, self.len);
            }
        }
        // A dedicated mapping unmaps itself when `source` drops.
    }
}

impl MemoryPool {
    /// A pool under `policy`. Maps nothing until the first allocation.
    pub fn new(policy: HugepagePolicy) -> MemoryPool {
        MemoryPool {
            inner: Arc::new(PoolInner {
                policy,
                chunks: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The pool's hugepage policy.
    pub fn policy(&self) -> HugepagePolicy {
        self.inner.policy
    }

    /// A zeroed block of `len` bytes aligned to `align` (a power of two, at most 4096).
    pub fn alloc(&self, len: usize, align: usize) -> Result<Block, MemoryError> {
        if len == 0 || !align.is_power_of_two() || align > PAGE_SIZE {
            return Err(MemoryError::InvalidRequest { len, align });
        }
        if len >= DEDICATED_THRESHOLD {
            let mapping = Mapping::new(len, self.inner.policy)?;
            return Ok(Block {
                ptr: mapping.ptr,
                len,
                page: mapping.page,
                source: BlockSource::Dedicated(mapping),
                pool: self.inner.clone(),
            });
        }
        let mut chunks = match self.inner.chunks.lock() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        };
        let found = chunks.iter_mut().find_map(|c| {
            c.take(len, align)
                .map(|off| (c.mapping.as_ptr(), c.mapping.page, off))
        });
        let (base, page, offset) = match found {
            Some(hit) => hit,
            None => {
                let mapping = Mapping::new(HUGEPAGE_SIZE, self.inner.policy)?;
                let mut chunk = Chunk::new(mapping);
                let offset = chunk
                    .take(len, align)
                    .ok_or(MemoryError::InvalidRequest { len, align })?;
                let hit = (chunk.mapping.as_ptr(), chunk.mapping.page, offset);
                chunks.push(chunk);
                hit
            }
        };
        // SAFETY: `offset + len` lies within the chunk (first-fit only hands out free ranges
        // inside it), and the range is ours alone until the Block gives it back; previous
        // users may have left bytes in it, so clear them.
        let ptr = unsafe {
            let p = base.add(offset);
            std::ptr::write_bytes(p, 0, len);
            NonNull::new_unchecked(p)
        };
        Ok(Block {
            ptr,
            len,
            page,
            source: BlockSource::Chunk {
                chunk_base: base as usize,
                offset,
            },
            pool: self.inner.clone(),
        })
    }
}

impl Default for MemoryPool {
    fn default() -> MemoryPool {
        MemoryPool::new(HugepagePolicy::default())
    }
}

/// Copies `out.len()` bytes from memory a device shares with this process (a registered
/// buffer) at `src`, one relaxed atomic load per byte.
///
/// Why atomic: a peer decides when the device writes registered memory, so its WRITE may land
/// while the application reads the same bytes (an ordering bug, or a hostile peer). A plain or
/// volatile copy racing that write is a data race, undefined behaviour in Rust's memory model;
/// byte-wise atomics racing the device's byte-wise atomic copies (softnic's `dma` module) are
/// not. Why bytes: racing atomics of different sizes that partially overlap are undefined as
/// well, and a byte is the size every copy can agree on at any alignment. (A ConnectX writes
/// by DMA, outside the language's model; the same discipline costs nothing in correctness.)
///
/// # Safety
/// `src..src + out.len()` must be mapped and readable for the whole call.
pub(crate) unsafe fn load_shared(src: *const u8, out: &mut [u8]) {
    for (i, byte) in out.iter_mut().enumerate() {
        // SAFETY: inside the range the caller vouched for; AtomicU8 has alignment 1. A relaxed
        // one-byte load is allowed even on read-only memory (`core::sync::atomic`, "Atomic
        // accesses to read-only memory"); nothing is written through the reference.
        *byte = unsafe { &*src.add(i).cast::<AtomicU8>() }.load(Ordering::Relaxed);
    }
}

/// Copies `data` into shared memory at `dst`, one relaxed atomic store per byte (see
/// [`load_shared`] for why).
///
/// # Safety
/// `dst..dst + data.len()` must be mapped and writable for the whole call.
pub(crate) unsafe fn store_shared(data: &[u8], dst: *mut u8) {
    for (i, byte) in data.iter().enumerate() {
        // SAFETY: inside the writable range the caller vouched for; AtomicU8 has alignment 1.
        unsafe { AtomicU8::from_ptr(dst.add(i)) }.store(*byte, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_aligned_zeroed_and_disjoint() {
        let pool = MemoryPool::new(HugepagePolicy::Never);
        let a = pool.alloc(100, 64).unwrap();
        let b = pool.alloc(4096, 4096).unwrap();
        assert_eq!(a.as_ptr() as usize % 64, 0);
        assert_eq!(b.as_ptr() as usize % 4096, 0);
        let (a0, a1) = (a.as_ptr() as usize, a.as_ptr() as usize + a.len());
        let (b0, b1) = (b.as_ptr() as usize, b.as_ptr() as usize + b.len());
        assert!(a1 <= b0 || b1 <= a0);
        // SAFETY: the block is ours and `len` bytes long.
        let bytes = unsafe { std::slice::from_raw_parts(b.as_ptr(), b.len()) };
        assert!(bytes.iter().all(|&x| x == 0));
    }

    #[test]
    fn freed_blocks_are_reused_and_cleared() {
        let pool = MemoryPool::new(HugepagePolicy::Never);
        let first = pool.alloc(256, 64).unwrap();
        let addr = first.as_ptr();
        // SAFETY: the block is ours and 256 bytes long.
        unsafe { std::ptr::write_bytes(addr, 0xab, 256) };
        drop(first);
        let again = pool.alloc(256, 64).unwrap();
        assert_eq!(again.as_ptr(), addr);
        // SAFETY: as above.
        let bytes = unsafe { std::slice::from_raw_parts(again.as_ptr(), 256) };
        assert!(bytes.iter().all(|&x| x == 0));
    }

    #[test]
    fn free_ranges_coalesce_back_into_one_chunk() {
        let pool = MemoryPool::new(HugepagePolicy::Never);
        let blocks: Vec<Block> = (0..8)
            .map(|_| pool.alloc(64 << 10, 4096).unwrap())
            .collect();
        drop(blocks);
        let chunks = pool.inner.chunks.lock().unwrap();
        assert_eq!(chunks.len(), 1);
        assert_eq!(chunks[0].free, vec![(0, HUGEPAGE_SIZE)]);
    }

    /// Each chunk's `largest` is the longest of its free ranges after every allocation and
    /// free, so skipping a chunk by it never misses room: blocks of mixed sizes and
    /// alignments, freed in a scrambled order, and a block that fits only in a hole freed in
    /// the first chunk still lands there (first fit).
    #[test]
    fn each_chunks_longest_free_range_is_kept_exact_and_skipping_by_it_misses_no_room() {
        let pool = MemoryPool::new(HugepagePolicy::Never);
        let check = |pool: &MemoryPool| {
            for c in pool.inner.chunks.lock().unwrap().iter() {
                let longest = c.free.iter().map(|&(_, l)| l).max().unwrap_or(0);
                assert_eq!(c.largest, longest, "free ranges {:?}", c.free);
            }
        };
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut blocks: Vec<Option<Block>> = Vec::new();
        for _ in 0..600 {
            let len = [64, 4096, 32 << 10, 200 << 10][next() as usize % 4] + next() as usize % 512;
            let align = [8, 64, 4096][next() as usize % 3];
            blocks.push(Some(pool.alloc(len, align).unwrap()));
            check(&pool);
            if next() % 3 == 0 {
                let at = next() as usize % blocks.len();
                blocks[at] = None;
                check(&pool);
            }
        }
        assert!(pool.inner.chunks.lock().unwrap().len() > 3);
        // Free a 200 KiB block of the first chunk: the same size lands in its hole.
        let first = pool.inner.chunks.lock().unwrap()[0].mapping.as_ptr() as usize;
        let in_first = blocks.iter().position(|b| {
            b.as_ref().is_some_and(|b| {
                b.len >= 200 << 10 && (b.ptr.as_ptr() as usize).wrapping_sub(first) < HUGEPAGE_SIZE
            })
        });
        let at = in_first.expect("a 200 KiB block still in the first chunk");
        let len = blocks[at].as_ref().unwrap().len;
        let freed = blocks[at].take().unwrap().ptr.as_ptr() as usize;
        check(&pool);
        let again = pool.alloc(len, 8).unwrap();
        assert_eq!(again.ptr.as_ptr() as usize, freed);
    }

    #[test]
    fn large_blocks_get_their_own_mapping() {
        let pool = MemoryPool::new(HugepagePolicy::Never);
        let big = pool.alloc(3 << 20, 4096).unwrap();
        assert!(matches!(big.source, BlockSource::Dedicated(_)));
        assert!(pool.inner.chunks.lock().unwrap().is_empty());
    }

    #[test]
    fn prefer_falls_back_to_base_pages_when_the_kernel_has_no_hugepages() {
        // Whatever this machine has reserved, Prefer never fails for a small request.
        let m = Mapping::new(8192, HugepagePolicy::Prefer).unwrap();
        assert!(m.len() >= 8192);
    }

    #[test]
    fn require_gives_hugepages_or_a_clear_error() {
        match Mapping::new(4096, HugepagePolicy::Require) {
            Ok(m) => assert_eq!(m.page_size(), PageSize::Huge),
            Err(e) => {
                assert!(matches!(e, MemoryError::HugepagesUnavailable { .. }), "{e}");
                assert!(e.to_string().contains("vm.nr_hugepages"), "{e}");
            }
        }
    }

    #[test]
    fn only_the_first_fallback_of_the_process_warns() {
        let warned: usize = (0..100).map(|_| usize::from(note_fallback())).sum();
        assert!(warned <= 1, "{warned} warnings");
        assert!(hugepage_fallbacks() >= 100);
        assert!(!note_fallback());
    }

    #[test]
    fn invalid_requests_are_refused() {
        let pool = MemoryPool::new(HugepagePolicy::Never);
        assert!(matches!(
            pool.alloc(0, 64),
            Err(MemoryError::InvalidRequest { .. })
        ));
        assert!(matches!(
            pool.alloc(64, 3),
            Err(MemoryError::InvalidRequest { .. })
        ));
    }
}
