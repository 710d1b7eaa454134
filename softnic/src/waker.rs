//! Waking the engine: an eventfd, and the flags that avoid a syscall when the engine is awake.
//!
//! A doorbell (or a fabric delivery) sets `pending`; only if the engine has announced that it is
//! going to sleep does the ringer also write the eventfd. The engine announces sleep, re-checks
//! `pending`, and only then blocks. Both sides use sequentially consistent operations on the two
//! flags, so at least one of them sees the other: a wake-up is never lost.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// A Linux eventfd (nonblocking, close-on-exec).
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// A new eventfd with counter zero.
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: plain syscall; the returned fd is checked and then owned.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(EventFd { fd })
    }

    /// Adds one to the counter, making the fd readable.
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to an fd we own. EAGAIN (counter saturated)
        // still leaves the fd readable, so the result is ignored.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Resets the counter; returns how many signals had accumulated (0 if none).
    pub fn drain(&self) -> u64 {
        let mut value: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from an fd we own; nonblocking.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), (&mut value as *mut u64).cast(), 8) };
        if n == 8 {
            value
        } else {
            0
        }
    }

    /// Blocks until signaled or `timeout_ms` passes (-1: forever); returns whether signaled.
    pub fn wait(&self, timeout_ms: i32) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        n > 0 && self.drain() > 0
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// The engine's doorbell: a pending flag, a sleeping flag, an eventfd for the sleeping case,
/// and the QP slots whose doorbell register was rung, so that a round visits those and not
/// every QP of the device.
#[derive(Debug)]
pub(crate) struct Waker {
    pending: AtomicBool,
    sleeping: AtomicBool,
    eventfd: Option<EventFd>,
    /// Slots queued by [`Waker::queue_rung`]: each at most once until the engine takes it
    /// (the bell's `queued` flag), so the lock is taken once per doorbell the engine sees, not
    /// per WQE.
    rung: Mutex<Vec<u32>>,
}

impl Waker {
    /// A waker for an engine thread (with an eventfd) or for manual progress (without).
    pub(crate) fn new(with_eventfd: bool) -> io::Result<Waker> {
        Ok(Waker {
            pending: AtomicBool::new(false),
            sleeping: AtomicBool::new(false),
            eventfd: if with_eventfd {
                Some(EventFd::new()?)
            } else {
                None
            },
            rung: Mutex::new(Vec::new()),
        })
    }

    /// Queues QP slot `slot` as rung (driver side; the caller then wakes the engine).
    pub(crate) fn queue_rung(&self, slot: u32) {
        self.rung
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(slot);
    }

    /// Moves the rung slots queued so far into `into` (engine side).
    pub(crate) fn take_rung(&self, into: &mut Vec<u32>) {
        let mut rung = self.rung.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::swap(&mut *rung, into);
    }

    /// Says there is work; writes the eventfd only if the engine is (about to be) asleep.
    #[inline]
    pub(crate) fn wake(&self) {
        self.pending.store(true, Ordering::SeqCst);
        if self.sleeping.load(Ordering::SeqCst) && self.sleeping.swap(false, Ordering::SeqCst) {
            if let Some(fd) = &self.eventfd {
                fd.signal();
            }
        }
    }

    /// Takes the pending flag (engine side).
    #[inline]
    pub(crate) fn take_pending(&self) -> bool {
        self.pending.load(Ordering::Relaxed) && self.pending.swap(false, Ordering::SeqCst)
    }

    /// Announces sleep; returns false (and stays awake) if work arrived meanwhile.
    pub(crate) fn prepare_sleep(&self) -> bool {
        self.sleeping.store(true, Ordering::SeqCst);
        if self.pending.load(Ordering::SeqCst) {
            self.sleeping.store(false, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Back from sleep: clears the flag and the eventfd counter.
    pub(crate) fn woke(&self) {
        self.sleeping.store(false, Ordering::SeqCst);
        if let Some(fd) = &self.eventfd {
            fd.drain();
        }
    }

    /// The eventfd, for the engine's epoll set.
    pub(crate) fn fd(&self) -> Option<RawFd> {
        self.eventfd.as_ref().map(|e| e.as_raw_fd())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wake_while_awake_writes_no_eventfd() {
        let w = Waker::new(true).unwrap();
        w.wake();
        assert!(w.take_pending());
        assert_eq!(w.eventfd.as_ref().unwrap().drain(), 0);
    }

    #[test]
    fn a_wake_while_asleep_signals_the_eventfd() {
        let w = Waker::new(true).unwrap();
        assert!(w.prepare_sleep());
        w.wake();
        assert_eq!(w.eventfd.as_ref().unwrap().drain(), 1);
    }

    #[test]
    fn work_arriving_before_sleep_cancels_it() {
        let w = Waker::new(true).unwrap();
        w.wake();
        assert!(!w.prepare_sleep());
    }
}
