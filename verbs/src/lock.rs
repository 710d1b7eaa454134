//! A mutex without a poison flag, for the CQ that `ibv_poll_cq` locks on every call.
//!
//! std's `Mutex` records, when it is locked and again when it is unlocked, whether the thread
//! is panicking (two reads of the process's panic count: with the flag kept in the guard, 18
//! of the ops-table poll's instructions per call). The shim has no use for the flag: a panic inside an `extern "C"`
//! verb aborts the process before anyone could see a poisoned lock, and every caller already
//! took a poisoned lock's value as it was. This lock is std's futex mutex on Linux without that
//! flag: an uncontended lock is one compare-and-swap, an unlock one swap, a contended one
//! sleeps on a futex.

use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU32, Ordering};

/// Nobody holds the lock.
const UNLOCKED: u32 = 0;
/// Held, and nobody sleeps on it: the unlock need not wake anyone.
const LOCKED: u32 = 1;
/// Held, and a thread may sleep on it: the unlock wakes one.
const CONTENDED: u32 = 2;
/// How many times a thread that finds the lock held looks again before it sleeps: a poll
/// holds it for a few hundred nanoseconds.
const SPINS: u32 = 100;

/// A mutual-exclusion lock without poisoning: a panic while it is held releases it (the
/// guard drops during the unwinding) and leaves the value as the panic left it.
///
/// `repr(C)`: the lock word comes first, on the cache line of the value's first fields, as
/// in std's `Mutex` (Rust's own layout put it after the value, a cache line away).
#[derive(Debug, Default)]
#[repr(C)]
pub struct Lock<T> {
    /// [`UNLOCKED`], [`LOCKED`] or [`CONTENDED`].
    state: AtomicU32,
    value: UnsafeCell<T>,
}

// SAFETY: the lock hands the value to one thread at a time, so sharing the lock only moves the
// value between threads, which `T: Send` allows (std's `Mutex` has the same bound).
unsafe impl<T: Send> Sync for Lock<T> {}

/// The lock held: the value, until the guard drops.
#[must_use = "the lock is released as soon as the guard drops"]
pub struct LockGuard<'a, T> {
    lock: &'a Lock<T>,
    /// Not `Send` (as std's guard): the thread that locked unlocks. Without the marker the
    /// guard would be `Sync` for any `T: Send`, sharing `&T` where `T` may not be `Sync`.
    _not_send: PhantomData<*const ()>,
}

// SAFETY: a shared guard hands out only `&T`, which other threads may hold when `T: Sync`.
unsafe impl<T: Sync> Sync for LockGuard<'_, T> {}

impl<T> Lock<T> {
    /// An unlocked lock holding `value`.
    pub const fn new(value: T) -> Self {
        Self {
            state: AtomicU32::new(UNLOCKED),
            value: UnsafeCell::new(value),
        }
    }

    /// Waits until the calling thread holds the lock.
    #[inline]
    pub fn lock(&self) -> LockGuard<'_, T> {
        if self
            .state
            .compare_exchange(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended();
        }
        LockGuard {
            lock: self,
            _not_send: PhantomData,
        }
    }

    /// The lock was held: spins a little, then sleeps until an unlock wakes this thread. A
    /// thread that sleeps leaves the state [`CONTENDED`], so that the holder's unlock wakes it.
    #[cold]
    fn lock_contended(&self) {
        let mut state = self.spin();
        if state == UNLOCKED {
            match self.state.compare_exchange(
                UNLOCKED,
                LOCKED,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(now) => state = now,
            }
        }
        loop {
            // Taking it marked CONTENDED may wake one thread more than needed at the unlock,
            // never one fewer: a sleeper this thread does not know of may be waiting.
            if state != CONTENDED && self.state.swap(CONTENDED, Ordering::Acquire) == UNLOCKED {
                return;
            }
            futex_wait(&self.state, CONTENDED);
            state = self.spin();
        }
    }

    /// Looks at the state until it is not plain [`LOCKED`] or [`SPINS`] looks have passed.
    fn spin(&self) -> u32 {
        let mut left = SPINS;
        loop {
            let state = self.state.load(Ordering::Relaxed);
            if state != LOCKED || left == 0 {
                return state;
            }
            std::hint::spin_loop();
            left -= 1;
        }
    }

    /// The value, through exclusive access to the lock (no locking needed).
    pub fn get_mut(&mut self) -> &mut T {
        self.value.get_mut()
    }
}

impl<T> LockGuard<'_, T> {
    /// Releases the lock; wakes a sleeper if one may be waiting.
    #[inline]
    fn unlock(&self) {
        if self.lock.state.swap(UNLOCKED, Ordering::Release) == CONTENDED {
            futex_wake_one(&self.lock.state);
        }
    }
}

impl<T> Drop for LockGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.unlock();
    }
}

impl<T> Deref for LockGuard<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock, so no other reference to the value is live.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for LockGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard holds the lock, and `&mut self` makes this the only reference.
        unsafe { &mut *self.lock.value.get() }
    }
}

/// Sleeps while `state` holds `expected` (or until a wake or a signal: the caller looks again).
fn futex_wait(state: &AtomicU32, expected: u32) {
    // SAFETY: FUTEX_WAIT reads the aligned u32 at the address, which the atomic keeps alive for
    // the call; a null timeout waits without a limit.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            state.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            std::ptr::null::<libc::timespec>(),
        );
    }
}

/// Wakes one thread sleeping on `state`.
fn futex_wake_one(state: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only uses the address as a key; the atomic is alive for the call.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            state.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            1,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    #[test]
    fn threads_contending_lose_no_update() {
        const THREADS: u64 = 4;
        const EACH: u64 = 20_000;
        let counter = Arc::new(Lock::new(0u64));
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                let counter = counter.clone();
                std::thread::spawn(move || {
                    for i in 0..EACH {
                        let mut held = counter.lock();
                        // A read and a write apart, with a yield between now and then: two
                        // holders at once would lose updates.
                        let seen = *held;
                        if i % 64 == 0 {
                            std::thread::yield_now();
                        }
                        *held = std::hint::black_box(seen) + 1;
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().expect("worker");
        }
        assert_eq!(*counter.lock(), THREADS * EACH);
        assert_eq!(counter.state.load(Ordering::Relaxed), UNLOCKED);
    }

    #[test]
    fn a_sleeping_waiter_is_woken_by_the_unlock() {
        let lock = Arc::new(Lock::new(Vec::new()));
        let held = lock.lock();
        let got_it = Arc::new(AtomicBool::new(false));
        let waiter = {
            let (lock, got_it) = (lock.clone(), got_it.clone());
            std::thread::spawn(move || {
                lock.lock().push("waiter");
                got_it.store(true, Ordering::Release);
            })
        };
        // The waiter spins past its SPINS looks and marks the lock contended before it sleeps.
        let deadline = Instant::now() + Duration::from_secs(10);
        while lock.state.load(Ordering::Relaxed) != CONTENDED {
            assert!(
                Instant::now() < deadline,
                "the waiter never marked the lock"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(20));
        assert!(!got_it.load(Ordering::Acquire), "took a held lock");
        drop(held);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !got_it.load(Ordering::Acquire) {
            assert!(
                Instant::now() < deadline,
                "the unlock did not wake the waiter"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        waiter.join().expect("waiter");
        assert_eq!(*lock.lock(), ["waiter"]);
        assert_eq!(lock.state.load(Ordering::Relaxed), UNLOCKED);
    }

    #[test]
    fn a_panic_while_held_releases_the_lock_without_poisoning_it() {
        let lock = Lock::new(1);
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut held = lock.lock();
            *held = 2;
            panic!("while holding the lock");
        }));
        assert!(panicked.is_err());
        assert_eq!(lock.state.load(Ordering::Relaxed), UNLOCKED);
        assert_eq!(*lock.lock(), 2);
    }
}
