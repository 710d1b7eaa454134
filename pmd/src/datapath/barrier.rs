//! The three memory barriers the datapath needs, named after libibverbs' `udma_barrier.h`.
//!
//! | here | rdma-core | x86-64 | why |
//! | --- | --- | --- | --- |
//! | [`to_device`] | `udma_to_device_barrier` | compiler fence | WQE bytes before the doorbell record |
//! | [`from_device`] | `udma_from_device_barrier` | compiler fence | CQE owner byte before the CQE body |
//! | [`wc_flush`] | `mmio_flush_writes`, `mmio_wc_start` | `sfence` | write-combining stores vs everything else |
//!
//! x86 keeps stores in order with stores and loads in order with loads (TSO), so the first two
//! only have to stop the compiler; they are Rust `Release`/`Acquire` fences, which is also what
//! makes them correct against the softnic, a device that is just another thread. Stores to
//! write-combining memory (the BlueFlame register) are the exception TSO does not cover: they
//! may pass earlier stores and sit in a WC buffer, so they need `sfence` on both sides.

use std::sync::atomic::{fence, Ordering};

/// Orders every store before it (WQE or receive-WQE bytes) before every store after it (the
/// doorbell record) as the device observes them.
#[inline(always)]
pub fn to_device() {
    fence(Ordering::Release);
}

/// Orders the load that found a CQE owned by software before the loads of the CQE's body, so
/// no field is read from before the device finished writing it.
#[inline(always)]
pub fn from_device() {
    fence(Ordering::Acquire);
}

/// Drains write-combining buffers: stores before it are visible to the device before stores
/// after it. Used before a doorbell-register (UAR/BlueFlame) write, so the doorbell record is
/// visible first, and after it, so the doorbell leaves the CPU now and does not merge with the
/// next one.
#[inline(always)]
pub fn wc_flush() {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: sfence has no operands and no effect on memory safety.
        unsafe { core::arch::x86_64::_mm_sfence() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        // Elsewhere a full fence is the conservative stand-in (aarch64 would use `dsb st`).
        fence(Ordering::SeqCst);
    }
}
