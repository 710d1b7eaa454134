//! The memory barriers the datapath needs, named after libibverbs' `udma_barrier.h`, per
//! architecture as rdma-core has them.
//!
//! | here | rdma-core | x86-64 | aarch64 | why |
//! | --- | --- | --- | --- | --- |
//! | [`to_device`] | `udma_to_device_barrier` | compiler fence | `dmb oshst` | WQE bytes before the doorbell record |
//! | [`from_device`] | `udma_from_device_barrier` | compiler fence | `dmb oshld` | CQE owner byte before the CQE body |
//! | [`wc_flush`] | `mmio_flush_writes`, `mmio_wc_start` | `sfence` | `dsb st` | write-combining stores vs everything else |
//!
//! CPU fences and device fences differ. A Rust `Release`/`Acquire` fence orders memory for
//! other CPUs (the inner-shareable domain), which is all the softnic (a device that is just
//! another thread) needs; a device doing DMA sits in the outer-shareable domain, which on
//! aarch64 takes the `osh` forms rdma-core uses. x86 keeps stores in order with stores and
//! loads in order with loads (TSO), for devices too, so there the first two only stop the
//! compiler. Stores to write-combining memory (the BlueFlame register) are what TSO does not
//! cover: they may pass earlier stores and sit in a WC buffer, hence `sfence` (x86) or
//! `dsb st` (aarch64) on both sides.
//!
//! On aarch64 each barrier is an `asm!` block without `nomem`, which the compiler treats as
//! an opaque operation on memory: it is both the hardware barrier and a compiler fence, and
//! it is at least as strong as the Rust fence it stands for (`osh` covers the inner domain),
//! so the softnic stays correct there too. Other architectures get a sequentially consistent
//! fence, which is stronger than needed and untested against hardware.

/// Orders every store before it (WQE or receive-WQE bytes) before every store after it (the
/// doorbell record) as the device observes them.
#[inline(always)]
pub fn to_device() {
    #[cfg(target_arch = "aarch64")]
    {
        // SAFETY: a barrier instruction: no operands, no effect on memory safety.
        unsafe { core::arch::asm!("dmb oshst", options(nostack, preserves_flags)) }
    }
    #[cfg(target_arch = "x86_64")]
    {
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
    }
    #[cfg(not(any(target_arch = "aarch64", target_arch = "x86_64")))]
    {
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }
}

/// Orders the load that found a CQE owned by software before the loads of the CQE's body, so
/// no field is read from before the device finished writing it.
#[inline(always)]
pub fn from_device() {
    #[cfg(target_arch = "aarch64")]
    {
        // SAFETY: a barrier instruction: no operands, no effect on memory safety.
        unsafe { core::arch::asm!("dmb oshld", options(nostack, preserves_flags)) }
    }
    #[cfg(target_arch = "x86_64")]
    {
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
    }
    #[cfg(not(any(target_arch = "aarch64", target_arch = "x86_64")))]
    {
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }
}

/// Drains write-combining buffers: stores before it are visible to the device before stores
/// after it. Used before a doorbell-register (UAR/BlueFlame) write, so the doorbell record is
/// visible first, and after it, so the doorbell leaves the CPU now and does not merge with the
/// next one.
#[inline(always)]
pub fn wc_flush() {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        // SAFETY: sfence has no operands and no effect on memory safety.
        unsafe { core::arch::x86_64::_mm_sfence() }
    }
    #[cfg(all(target_arch = "aarch64", not(miri)))]
    {
        // SAFETY: a barrier instruction: no operands, no effect on memory safety.
        unsafe { core::arch::asm!("dsb st", options(nostack, preserves_flags)) }
    }
    // Miri runs no barrier instruction (docs/security.md: what runs under Miri).
    #[cfg(any(miri, not(any(target_arch = "aarch64", target_arch = "x86_64"))))]
    {
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }
}
