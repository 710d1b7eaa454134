//! The control CQs: completion queues shared by the control channels of one device, so that
//! the failover service polls a handful of CQs per device, not one per channel.
//!
//! Every resilient QP has two control channels (one on each device of its pair), and each
//! had a CQ of its own: a service round over 1,000 QPs polled 2,000 CQs, which put 94 to
//! 119 us in the p99 of an 8-byte latency loop beside 1,000 idle QPs (`docs/testbed.md`).
//! Now the channels of a device share CQs, and a round polls each shared CQ and
//! hands every completion to the channel its QPN names.
//!
//! A shared CQ is sized for the channels it takes: each needs `2 x depth` entries (its depth
//! of sends and receives in flight), so no CQ can overrun. A device's first CQ takes 16
//! channels' worth, each next one twice the last, up to 512 channels' worth
//! ([`MAX_CHANNELS_PER_CQ`]): one QP costs one small CQ per device (as before), 1,000 QPs six
//! per device (16 + 32 + ... + 512), and no CQ is larger than 2 MiB of entries at depth 32.
//!
//! Lock order: a shared CQ's lock, then a channel's. A channel's reset takes both, so a
//! completion polled before the reset is handed over before it, and one after it is cleaned
//! from the ring (a reset QP's CQEs are dropped at the next poll).

use std::sync::{Arc, Mutex, MutexGuard, Weak};

use crate::control::{Context, Cq};
use crate::datapath::wr::WorkCompletion;
use crate::failover::Event;
use crate::provider::VerbsError;
use crate::resilient::device_pool::DevicePool;

/// What a shared CQ hands a completion to: the control channel whose QP it names
/// (`crate::resilient::channel`). A trait here so that this module does not import the channel's, which
/// imports this one (the one-way imports of `pmd/tests/imports_run_one_way.rs`).
pub(crate) trait TakesCompletions {
    /// Takes one completion of the member's QP; the events it makes of it go to `out`.
    fn take_completion(&self, wc: &WorkCompletion, out: &mut Vec<Event>);
}

/// Channels a device's first shared CQ takes; each next CQ takes twice as many.
const FIRST_CHANNELS_PER_CQ: u32 = 16;
/// The most channels one shared CQ takes.
pub(crate) const MAX_CHANNELS_PER_CQ: u32 = 512;

/// A shared CQ's polling state, behind its lock.
pub(crate) struct Polling<C> {
    cq: Cq,
    /// The CQ was armed once: from then on it is either armed or its event is pending (its
    /// descriptor readable), so a service thread that sleeps on it need not touch it until
    /// the descriptor says so.
    armed: bool,
    wcs: [WorkCompletion; 32],
    /// The channels of this CQ by control QPN, sorted.
    members: Vec<(u32, Weak<C>)>,
}

/// A CQ shared by control channels of one device.
pub(crate) struct ControlCq<C> {
    polling: Mutex<Polling<C>>,
    /// Entries not yet promised to a channel.
    free: Mutex<u32>,
    event_fd: Option<std::os::fd::RawFd>,
    /// How many channels it was sized for: a device's first CQ takes
    /// [`FIRST_CHANNELS_PER_CQ`], each next one twice as many.
    channels: u32,
}

impl<C> std::fmt::Debug for ControlCq<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlCq").finish_non_exhaustive()
    }
}

/// A channel's place in a shared CQ: given back when the channel goes.
pub(crate) struct Reservation<C> {
    pub cq: Arc<ControlCq<C>>,
    entries: u32,
}

impl<C> Drop for Reservation<C> {
    fn drop(&mut self) {
        *self.cq.free.lock().unwrap_or_else(|p| p.into_inner()) += self.entries;
    }
}

impl<C: TakesCompletions> ControlCq<C> {
    /// The CQ, locked for polling; a channel's reset holds it too (the lock order above).
    pub(crate) fn polling(&self) -> MutexGuard<'_, Polling<C>> {
        self.polling.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The CQ itself, to create a channel's QP on.
    pub(crate) fn with_cq<R>(&self, f: impl FnOnce(&Cq) -> R) -> R {
        f(&self.polling().cq)
    }

    /// Lists `channel` (control QPN `qpn`) as a member: its completions go to it.
    pub(crate) fn attach(&self, qpn: u32, channel: &Arc<C>) {
        let mut p = self.polling();
        p.members.retain(|(_, w)| w.strong_count() > 0);
        let at = p.members.partition_point(|(q, _)| *q < qpn);
        if p.members.get(at).is_some_and(|(q, _)| *q == qpn) {
            p.members[at].1 = Arc::downgrade(channel);
        } else {
            p.members.insert(at, (qpn, Arc::downgrade(channel)));
        }
    }

    /// Polls the CQ until it is empty, handing each completion to the channel its QPN names;
    /// `deliver` gets the events each channel makes of them (messages, a failed channel).
    /// Completions of a QP that is no member (a channel dropped meanwhile) are dropped.
    pub(crate) fn poll(
        &self,
        events: &mut Vec<Event>,
        mut deliver: impl FnMut(&C, &mut Vec<Event>),
    ) -> bool {
        let mut guard = self.polling();
        let p = &mut *guard;
        let mut any = false;
        loop {
            let n = p.cq.poll(&mut p.wcs);
            if n == 0 {
                break;
            }
            any = true;
            for i in 0..n {
                let wc = p.wcs[i];
                let member = p
                    .members
                    .binary_search_by_key(&wc.qp_num, |(q, _)| *q)
                    .ok()
                    .and_then(|at| p.members[at].1.upgrade());
                let Some(channel) = member else {
                    tracing::debug!(
                        qpn = wc.qp_num,
                        "failover: completion of a control QP that is gone dropped"
                    );
                    continue;
                };
                events.clear();
                channel.take_completion(&wc, events);
                if !events.is_empty() {
                    deliver(&channel, events);
                }
            }
        }
        any
    }

    /// Arms the CQ's completion event: the next completion makes [`ControlCq::event_fd`]
    /// readable. Poll again after arming, or a completion written just before is missed.
    pub(crate) fn arm(&self) {
        let mut p = self.polling();
        match p.cq.arm() {
            Ok(()) => p.armed = true,
            Err(e) => tracing::warn!(error = %e, "failover: cannot arm a control CQ"),
        }
    }

    /// Whether a service thread sleeping on the CQ's descriptor must take its event, poll
    /// and re-arm it now: it was never armed, it has no descriptor, or the descriptor was
    /// readable at the last `poll(2)` (`ready`, sorted). An armed CQ whose descriptor was
    /// quiet has had no completion since it was armed and polled.
    pub(crate) fn needs_rearm(&self, ready: &[std::os::fd::RawFd]) -> bool {
        !self.polling().armed
            || self
                .event_fd
                .is_none_or(|fd| ready.binary_search(&fd).is_ok())
    }

    /// Consumes a pending completion event without waiting.
    pub(crate) fn clear_event(&self) {
        let _ = self
            .polling()
            .cq
            .wait_event(Some(std::time::Duration::ZERO));
    }

    /// How many times a device's first CQ's channels this CQ was sized for: 1 for the first
    /// 16 channels of a device, then 2, 4, ... 32 (a power of two).
    pub(crate) fn scale(&self) -> u32 {
        (self.channels / FIRST_CHANNELS_PER_CQ).max(1)
    }

    /// The descriptor that becomes readable on a completion event.
    pub(crate) fn event_fd(&self) -> Option<std::os::fd::RawFd> {
        self.event_fd
    }
}

/// The shared control CQs of every device a service's channels are on. Weak: a CQ goes with
/// its last channel, and with it the device it keeps open.
pub(crate) struct ControlCqs<C> {
    devices: Mutex<DevicePool<ControlCq<C>>>,
}

impl<C> Default for ControlCqs<C> {
    fn default() -> Self {
        ControlCqs {
            devices: Mutex::new(DevicePool::default()),
        }
    }
}

impl<C: TakesCompletions> ControlCqs<C> {
    /// A place for a channel of `depth` (`2 x depth` entries) in a shared CQ of `ctx`,
    /// creating a CQ when none has room.
    pub(crate) fn reserve(
        &self,
        ctx: &Arc<Context>,
        depth: u32,
    ) -> Result<Reservation<C>, VerbsError> {
        let entries = 2 * depth;
        let mut devices = self.devices.lock().unwrap_or_else(|p| p.into_inner());
        let cqs = devices.live_on(ctx);
        for cq in cqs.iter().filter_map(Weak::upgrade) {
            let mut free = cq.free.lock().unwrap_or_else(|p| p.into_inner());
            if *free >= entries {
                *free -= entries;
                drop(free);
                return Ok(Reservation { cq, entries });
            }
        }
        let channels = (FIRST_CHANNELS_PER_CQ << cqs.len().min(16)).min(MAX_CHANNELS_PER_CQ);
        let size = channels * entries;
        let cq = ctx.create_cq(size, true)?;
        let event_fd = cq.event_fd();
        let cq = Arc::new(ControlCq {
            polling: Mutex::new(Polling {
                cq,
                armed: false,
                wcs: [WorkCompletion::EMPTY; 32],
                members: Vec::new(),
            }),
            free: Mutex::new(size - entries),
            event_fd,
            channels,
        });
        tracing::debug!(device = %ctx.name(), channels, entries = size, "failover: shared control CQ created");
        cqs.push(Arc::downgrade(&cq));
        Ok(Reservation { cq, entries })
    }

    /// Hands every live channel of `ctx`'s shared CQs to `f` (no lock held while `f` runs).
    pub(crate) fn each_channel_on(&self, ctx: &Arc<Context>, mut f: impl FnMut(&C)) {
        let cqs: Vec<Arc<ControlCq<C>>> = {
            let devices = self.devices.lock().unwrap_or_else(|p| p.into_inner());
            devices.on(ctx).collect()
        };
        for cq in cqs {
            let members: Vec<Arc<C>> = cq
                .polling()
                .members
                .iter()
                .filter_map(|(_, w)| w.upgrade())
                .collect();
            for channel in &members {
                f(channel);
            }
        }
    }

    /// Every shared CQ that still has a channel.
    pub(crate) fn live(&self, out: &mut Vec<Arc<ControlCq<C>>>) {
        out.clear();
        let devices = self.devices.lock().unwrap_or_else(|p| p.into_inner());
        out.extend(devices.all());
    }
}
