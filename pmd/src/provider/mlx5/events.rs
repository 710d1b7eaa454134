//! Completion events of a DV-owned CQ: a completion channel to wait on, and the arm doorbell
//! written by the driver itself.
//!
//! `ibv_req_notify_cq` cannot be used: libmlx5 arms with its own consumer index, which stays
//! at 0 for a CQ the driver polls, so the device would see "unconsumed" CQEs at every arm and
//! signal at once, forever. Like UCX, we write the arm word with the consumer index the
//! poller publishes in the CQ's doorbell record, then ring the UAR's CQ doorbell.

use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hw_defs::mlx5::dbrec::{CqDoorbellRecord, CQ_DOORBELL_UAR_OFFSET, CQ_SIZE};
use rdma_sys::{
    ibv_ack_cq_events, ibv_comp_channel, ibv_cq, ibv_destroy_comp_channel, ibv_get_cq_event,
};

use super::attr::verbs_error;
use super::device::Device;
use crate::datapath::barrier;
use crate::provider::{CompletionEvents, VerbsError};

/// A completion channel that belongs to one CQ.
pub(super) struct Channel {
    channel: NonNull<ibv_comp_channel>,
    /// Keeps the context open until the channel is destroyed (fields drop after `drop`).
    _device: Arc<Device>,
}

// SAFETY: a completion channel is a file descriptor and a refcount libibverbs manages; it may
// be used and destroyed from any thread.
unsafe impl Send for Channel {}
// SAFETY: as above.
unsafe impl Sync for Channel {}

impl Channel {
    /// A new channel on `device`, its descriptor non-blocking (so a wait never blocks in
    /// `ibv_get_cq_event` once `poll` has said it is readable, even if someone else read it).
    pub fn create(device: &Arc<Device>, name: &str) -> Result<Channel, VerbsError> {
        // SAFETY: the context is open (the Device is alive).
        let channel = unsafe { rdma_sys::ibv_create_comp_channel(device.ctx()) };
        let channel = NonNull::new(channel).ok_or_else(|| {
            verbs_error(
                name,
                "ibv_create_comp_channel",
                std::io::Error::last_os_error(),
            )
        })?;
        let channel = Channel {
            channel,
            _device: device.clone(),
        };
        let fd = channel.fd();
        // SAFETY: fcntl on a descriptor we own; no memory is involved.
        let ok = unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
        };
        if !ok {
            return Err(verbs_error(
                name,
                "fcntl(O_NONBLOCK)",
                std::io::Error::last_os_error(),
            ));
        }
        Ok(channel)
    }

    /// The channel, for `ibv_create_cq`.
    pub fn as_ptr(&self) -> *mut ibv_comp_channel {
        self.channel.as_ptr()
    }

    fn fd(&self) -> RawFd {
        // SAFETY: the channel is live until our Drop.
        unsafe { (*self.channel.as_ptr()).fd }
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_comp_channel and destroyed once, after its CQ (the
        // CQ's events hold the channel; the CQ is destroyed before they drop), while the
        // context is still open (we hold the Device).
        let rc = unsafe { ibv_destroy_comp_channel(self.channel.as_ptr()) };
        if rc != 0 {
            tracing::error!(error = %std::io::Error::from_raw_os_error(rc.abs()), "ibv_destroy_comp_channel failed; descriptor leaked");
        }
    }
}

/// Completion events of one CQ: arm through the CQ doorbell, wait on the channel.
pub(super) struct CqEvents {
    channel: Channel,
    cq: NonNull<ibv_cq>,
    cqn: u32,
    /// The CQ's doorbell record: `[0]` set_ci (the poller's), `[1]` the arm word (ours).
    dbrec: NonNull<AtomicU32>,
    /// The UAR page whose `MLX5_CQ_DOORBELL` register takes the arm command.
    uar: NonNull<u8>,
    /// Events received, mod 4: the arm sequence number the device expects next.
    arm_sn: AtomicU32,
    name: String,
}

// SAFETY: the pointers are the CQ's (alive while the Cq that owns these events lives: the
// CompletionEvents API is reached only through it) and its mapped UAR page; every access below
// is an atomic, a volatile MMIO store, or a verbs call that is thread-safe.
unsafe impl Send for CqEvents {}
// SAFETY: as above; `arm` and `wait` may race only on atomics.
unsafe impl Sync for CqEvents {}

impl CqEvents {
    /// Events for the CQ `cq` (number `cqn`, record `dbrec`, arm page `uar`) on `channel`.
    pub fn new(
        channel: Channel,
        cq: NonNull<ibv_cq>,
        cqn: u32,
        dbrec: NonNull<u32>,
        uar: NonNull<u8>,
        name: &str,
    ) -> CqEvents {
        CqEvents {
            channel,
            cq,
            cqn,
            dbrec: dbrec.cast(),
            uar,
            arm_sn: AtomicU32::new(0),
            name: name.to_string(),
        }
    }
}

/// The arm word (`sn << 28 | command | ci`, as `mlx5_arm_cq` builds it), as the big-endian
/// bytes the record and the doorbell carry.
fn arm_word(sn: u32, ci: u32) -> [u8; 4] {
    let mut rec = [0u8; CQ_SIZE];
    CqDoorbellRecord::new_unchecked(&mut rec[..]).set_arm((sn & 3) as u8, false, ci);
    [rec[4], rec[5], rec[6], rec[7]]
}

/// Arms a CQ as `mlx5_arm_cq` does, at the consumer index the poller published in `dbrec[0]`
/// (the one the device compares against: a CQE after it raises the event): the arm word goes
/// to `dbrec[1]`, then the word and the CQ number to the UAR's CQ doorbell.
///
/// # Safety
/// `dbrec` must be the CQ's live doorbell record (two aligned 32-bit words) and `uar` a
/// mapping with an 8-byte register at `MLX5_CQ_DOORBELL`, both alive for the call.
pub(super) unsafe fn arm_cq(dbrec: NonNull<AtomicU32>, uar: NonNull<u8>, cqn: u32, sn: u32) {
    // SAFETY: the record is two aligned words (the caller's promise).
    let (set_ci, arm) = unsafe { (&*dbrec.as_ptr(), &*dbrec.as_ptr().add(1)) };
    let ci = u32::from_be(set_ci.load(Ordering::Acquire)) & 0x00ff_ffff;
    let word = arm_word(sn, ci);
    // Release: the arm word is an ordinary store the device reads by DMA.
    arm.store(u32::from_ne_bytes(word), Ordering::Release);
    // mmio_wc_start: the record store must reach memory before the write-combining UAR store
    // tells the device to look at it.
    barrier::wc_flush();
    let mut doorbell = [0u8; 8];
    doorbell[..4].copy_from_slice(&word);
    doorbell[4..].copy_from_slice(&cqn.to_be_bytes());
    // SAFETY: MLX5_CQ_DOORBELL is an 8-byte aligned register inside the mapping (the caller's
    // promise); one volatile 8-byte store is one MMIO write, which the device takes whole even
    // when other threads arm other CQs through the same page.
    unsafe {
        (uar.as_ptr().add(CQ_DOORBELL_UAR_OFFSET) as *mut u64)
            .write_volatile(u64::from_ne_bytes(doorbell));
    }
    // mmio_flush_writes: push the doorbell out of the write-combining buffer now.
    barrier::wc_flush();
}

impl CompletionEvents for CqEvents {
    fn arm(&self) -> Result<(), VerbsError> {
        let sn = self.arm_sn.load(Ordering::Acquire);
        // SAFETY: the CQ's record and UAR page, alive while the CQ is (see the Send impl).
        unsafe { arm_cq(self.dbrec, self.uar, self.cqn, sn) };
        Ok(())
    }

    fn wait(&self, timeout: Option<Duration>) -> Result<bool, VerbsError> {
        let ms = timeout.map_or(-1, |t| {
            i32::try_from(t.as_nanos().div_ceil(1_000_000)).unwrap_or(i32::MAX)
        });
        let mut pfd = libc::pollfd {
            fd: self.channel.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                return Ok(false);
            }
            return Err(verbs_error(&self.name, "poll(completion channel)", e));
        }
        if n == 0 {
            return Ok(false);
        }
        let mut cq: *mut ibv_cq = std::ptr::null_mut();
        let mut ctx = std::ptr::null_mut();
        // SAFETY: the channel is live; the out-pointers are valid. The descriptor is
        // non-blocking, so this returns at once.
        let rc = unsafe { ibv_get_cq_event(self.channel.as_ptr(), &mut cq, &mut ctx) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::WouldBlock {
                return Ok(false);
            }
            return Err(verbs_error(&self.name, "ibv_get_cq_event", e));
        }
        debug_assert_eq!(cq, self.cq.as_ptr(), "one channel per CQ");
        // Acknowledge at once: ibv_destroy_cq waits for every event to be acknowledged.
        // SAFETY: `cq` is the CQ the event was for, alive (see the Send impl).
        unsafe { ibv_ack_cq_events(cq, 1) };
        // The device moves to the next arm sequence number with each event.
        self.arm_sn.fetch_add(1, Ordering::AcqRel);
        Ok(true)
    }

    fn fd(&self) -> RawFd {
        self.channel.fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arm_word_carries_sequence_command_and_consumer_index_big_endian() {
        let w = arm_word(6, 0x0123_4567);
        // sequence 6 & 3 = 2 at bits 29:28, REQ_NOT (0) at bit 24, ci mod 2^24.
        assert_eq!(u32::from_be_bytes(w), (2 << 28) | 0x23_4567);
    }

    #[test]
    fn arming_writes_the_record_then_the_uar_doorbell_at_the_published_consumer_index() {
        // The poller has consumed 0x1_0005 CQEs and published it, big-endian.
        let record = [AtomicU32::new(0x1_0005u32.to_be()), AtomicU32::new(0)];
        let mut uar = [0u64; 8];
        // SAFETY: a two-word record and a 64-byte page with the register at 0x20, both alive.
        unsafe {
            arm_cq(
                NonNull::from(&record[0]),
                NonNull::from(&mut uar).cast(),
                0xab,
                1,
            )
        };
        let word = (1u32 << 28) | 0x1_0005;
        assert_eq!(record[1].load(Ordering::Relaxed), word.to_be());
        let doorbell = uar[CQ_DOORBELL_UAR_OFFSET / 8].to_ne_bytes();
        assert_eq!(doorbell[..4], word.to_be_bytes());
        assert_eq!(doorbell[4..], 0xabu32.to_be_bytes());
        assert_eq!(
            uar.iter().filter(|&&w| w != 0).count(),
            1,
            "one register written"
        );
    }
}
