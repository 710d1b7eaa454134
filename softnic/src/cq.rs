//! Completion queues: the CQE ring the device produces into, the consumer-index record the
//! driver writes, overrun detection, and completion events.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::codec;
use crate::cqe::CqeInfo;
use crate::memory::QueueMemory;
use crate::waker::EventFd;

/// Size of one CQE (hw-defs' mlx5 CQE64).
pub const CQE_SIZE: usize = hw_defs::mlx5::cqe::SIZE;

/// A CQ handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CqId(pub u32);

/// An eventfd the device signals when an armed CQ gets a CQE (`ibv_comp_channel`).
#[derive(Debug)]
pub struct CompletionChannel {
    fd: EventFd,
}

impl CompletionChannel {
    /// A new channel.
    pub fn new() -> std::io::Result<Arc<CompletionChannel>> {
        Ok(Arc::new(CompletionChannel {
            fd: EventFd::new()?,
        }))
    }

    /// Blocks until an event arrives or `timeout_ms` passes (-1: forever); returns whether
    /// one arrived. Consumes the events that had accumulated.
    pub fn wait(&self, timeout_ms: i32) -> bool {
        self.fd.wait(timeout_ms)
    }

    /// The eventfd, to put in the caller's own epoll set.
    pub fn fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.fd.as_raw_fd()
    }

    /// Consumes accumulated events without blocking; returns how many there were.
    pub fn drain(&self) -> u64 {
        self.fd.drain()
    }

    fn signal(&self) {
        self.fd.signal()
    }
}

/// What the driver gives `create_cq`.
#[derive(Debug)]
pub struct CqConfig {
    /// The CQE ring: `cqe_count * 64` bytes. The driver initialises every entry as libmlx5
    /// does (opcode invalid), so lap 0 entries are not mistaken for CQEs.
    pub ring: QueueMemory,
    /// Number of CQEs, a power of two.
    pub cqe_count: u32,
    /// The consumer-index record: 8 bytes, the first big-endian word is the consumer index
    /// (24 bits), written by the driver as it consumes CQEs.
    pub dbrec: QueueMemory,
    /// Where to signal completion events, if the driver wants them.
    pub channel: Option<Arc<CompletionChannel>>,
}

/// A handle the driver keeps to arm its CQ without taking the device lock.
#[derive(Clone, Debug)]
pub struct CqHandle {
    /// The CQ.
    pub id: CqId,
    armed: Arc<AtomicBool>,
}

impl CqHandle {
    /// Requests one event on the channel for the next CQE (`ibv_req_notify_cq`).
    pub fn arm(&self) {
        self.armed.store(true, Ordering::Release);
    }
}

/// Why a CQE could not be written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CqFull {
    /// The ring holds `cqe_count` entries the driver has not consumed.
    Overrun,
}

/// The device's side of a CQ.
pub(crate) struct Cq {
    ring: QueueMemory,
    dbrec: QueueMemory,
    /// log2 of the CQEs in the ring: a counter's owner bit (lap parity) is its bit `cqe_n`.
    cqe_n: u32,
    /// Mask of the ring (CQEs - 1): a counter's entry is `& cqe_m`.
    cqe_m: u32,
    /// Producer index: CQEs written (24-bit, wrapping, as the consumer-index record's).
    cqe_pi: u32,
    channel: Option<Arc<CompletionChannel>>,
    armed: Arc<AtomicBool>,
    /// Once overrun, a CQ takes no more CQEs (as a ConnectX moves it to error).
    pub broken: bool,
    /// While the device is slow to complete ([`crate::Device::slow_completions`]): the CQEs
    /// written meanwhile, in order, not yet in the ring.
    held: Option<Vec<CqeInfo>>,
    scratch: [u8; CQE_SIZE],
}

impl Cq {
    pub fn new(id: CqId, cfg: CqConfig) -> Result<(Cq, CqHandle), &'static str> {
        if !cfg.cqe_count.is_power_of_two() || cfg.cqe_count < 2 || cfg.cqe_count > 1 << 22 {
            return Err("cqe_count must be a power of two in 2..=2^22");
        }
        if cfg.ring.len() < cfg.cqe_count as usize * CQE_SIZE {
            return Err("CQ ring memory is smaller than cqe_count * 64");
        }
        if cfg.dbrec.len() < 8 || cfg.dbrec.as_ptr() as usize % 4 != 0 {
            return Err("CQ consumer-index record must be 8 bytes, 4-byte aligned");
        }
        let armed = Arc::new(AtomicBool::new(false));
        let cq = Cq {
            ring: cfg.ring,
            dbrec: cfg.dbrec,
            cqe_n: cfg.cqe_count.trailing_zeros(),
            cqe_m: cfg.cqe_count - 1,
            cqe_pi: 0,
            channel: cfg.channel,
            armed: armed.clone(),
            broken: false,
            held: None,
            scratch: [0; CQE_SIZE],
        };
        Ok((cq, CqHandle { id, armed }))
    }

    /// From now on CQEs are held back instead of written, until [`Cq::release_held`].
    pub fn hold(&mut self) {
        self.held.get_or_insert_with(Vec::new);
    }

    /// Forgets the held CQEs of QP `qpn`: a QP reset removes its CQEs from the CQ (as mlx5's
    /// reset cleans the CQ of them), so none reaches the driver after the reset.
    pub fn forget_held(&mut self, qpn: u32) {
        if let Some(held) = &mut self.held {
            held.retain(|c| c.qpn != qpn);
        }
    }

    /// Writes the held CQEs, in order, and writes the next ones at once again. Returns the
    /// first overrun, if the ring had no room for them.
    pub fn release_held(&mut self) -> Result<(), CqFull> {
        let Some(held) = self.held.take() else {
            return Ok(());
        };
        held.iter().try_for_each(|info| self.push(info))
    }

    /// Writes one CQE, owner byte last with release ordering, then signals an armed channel;
    /// while the device is slow, holds it back instead.
    pub fn push(&mut self, info: &CqeInfo) -> Result<(), CqFull> {
        if let Some(held) = &mut self.held {
            held.push(*info);
            return Ok(());
        }
        if self.broken {
            return Err(CqFull::Overrun);
        }
        let cqe_db_ci = self.dbrec.load_be32(0) & 0x00ff_ffff;
        let used = self.cqe_pi.wrapping_sub(cqe_db_ci) & 0x00ff_ffff;
        if used > self.cqe_m {
            self.broken = true;
            return Err(CqFull::Overrun);
        }
        let slot = (self.cqe_pi & self.cqe_m) as usize * CQE_SIZE;
        let owner = ((self.cqe_pi >> self.cqe_n) & 1) as u8;
        let op_own = codec::encode_cqe(&mut self.scratch, info, owner);
        // Every byte but the last first; the driver polls the op_own byte and must see a
        // complete CQE once it sees the new owner bit.
        self.ring.write(slot, &self.scratch[..CQE_SIZE - 1]);
        self.ring.store_u8_release(slot + CQE_SIZE - 1, op_own);
        self.cqe_pi = self.cqe_pi.wrapping_add(1) & 0x00ff_ffff;
        if self.armed.load(Ordering::Relaxed) && self.armed.swap(false, Ordering::AcqRel) {
            if let Some(ch) = &self.channel {
                ch.signal();
            }
        }
        Ok(())
    }
}
