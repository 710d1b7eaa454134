//! The backup CQs: completion queues shared by the backup data QPs of one backup device of a
//! resilient context (`docs/failover.md` 3.5), so that a thousand resilient QPs have ten CQs
//! on their backup device, not a thousand.
//!
//! **Sizing.** A backup QP can owe at most [`completions_bound`] unpolled CQEs (3.5): one per
//! WQE its two queues admit. A QP takes a [`BackupSeat`] of that many entries in a shared CQ
//! that still has them free, so the CQEs all the members of a CQ can owe together never exceed
//! its entries, whatever mix of successes, errors and flushes they produce at once. A device's
//! first CQ holds one QP's worth, each next one twice the last, up to
//! [`MAX_SEATS_PER_CQ`]: 1,000 QPs of the same depths take 21 CQs (1 + 2 + ... + 64, then
//! fourteen of 64). A CQ cannot grow, so the seats of the newest CQ may stand empty: up to
//! as many as all the older CQs hold while a device has fewer than 127 QPs (at 16 QPs, 15 of
//! 31 seats), at most 63 from then on.
//!
//! **Who polls.** Each member's owner, as it polled a CQ of its own: under the CQ's lock it
//! moves every CQE in the ring, undecoded, to the inbox of the QP its QPN names, then decodes
//! its own inbox, in order. A CQE is decoded (its WQE retired, its error mark set) only by its
//! own QP's owner, so a QP's consumer counters, its error mark and the fence it waits for move
//! only when its owner takes its completions, as with a CQ of its own; another owner's poll
//! only moves bytes. A CQE moved to an inbox stays one of the QP's unpolled CQEs: it is still
//! counted against the QP's seat, which is what keeps the ring from overrunning (the ring and
//! the inboxes together hold at most the members' outstanding WQEs).
//!
//! **Exactly once.** The ring is read only under the lock, each CQE moved once to the one
//! inbox its QPN names (a CQE of a QP with no seat, one destroyed since, is dropped, as a
//! poller drops a CQE of a detached QP), and an inbox is decoded only by its seat's holder.
//! [`BackupSeat::discard`] (a reset of the member's QP) drops the member's CQEs from the ring
//! and from its inbox and no other member's.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use hw_defs::mlx5::cqe;

use crate::control::{Context, Cq, Qp};
use crate::datapath::cq::ErrorMark;
use crate::datapath::wr::WorkCompletion;
use crate::provider::VerbsError;
use crate::resilient::device_pool::DevicePool;

/// The most QPs' worth of entries one shared backup CQ is sized for: at 512 entries a QP
/// (perftest's depths, 3.5), 32,768 entries, 2 MiB of CQEs. What bounds the seats a device
/// leaves empty (all but one of a new CQ's): at 512, a 1,024th QP would open a CQ of 16 MiB
/// for itself.
pub(crate) const MAX_SEATS_PER_CQ: u32 = 64;

/// The most CQEs a backup QP (`qp`, both queues on one CQ) can owe its CQ unpolled at once:
/// every send and every receive the queues admit, one CQE each. The QP's seat in a shared
/// backup CQ holds exactly this, and the CQ, sized for the sum of its seats, cannot overrun,
/// for these reasons together:
/// - the CQ's members are backup data QPs, each holding a seat: the control channels complete
///   into the control CQs, and the probe and the default side's flushes go to the default CQ;
/// - the device writes at most one CQE per WQE: a success (a signaled WQE; an unsignaled one
///   gets none unless it fails), an error, or a flush, never two (the error CQE retires its
///   WQE, and the flush starts after it; a QP flushes each WQE once on entering ERR, and a
///   QP in RESET flushes nothing);
/// - a WQE leaves the driver's books only when its owner decodes its CQE, or a later CQE of
///   the same queue (the consumer counters come from the CQEs decoded; another member's poll
///   only moves the CQE to the QP's inbox, where it is still the QP's), and the CQE left the
///   ring (its consumer counter published) before that; the one other way out is a reset,
///   which takes the rings back to index 0, and every reset of the backup QP discards its
///   CQEs from the ring and its inbox ([`BackupSeat::discard`]) before anything is posted
///   again;
/// - every WQE the backup queues hold was admitted against those same counters: the
///   application's posts on the backup path, the sends a failover moves (`post_raw`), the
///   zero-length SENDs that burn stale receives and the fence (ordinary posts), the receives
///   a failover copies (`write_raw`). So at most [`SendQueue::max_requests`] sends and the
///   receive ring's capacity are outstanding, whatever mix of successes, errors and flushes
///   (a failover, a failback, a repair) completes them.
///
/// A member's unpolled CQEs (in the ring or its inbox) are at most its outstanding WQEs, those
/// at most its seat, and the seats of a CQ at most its entries. (The CQ was twice this before,
/// for no reason anyone wrote down; the factor was slack.)
///
/// [`SendQueue::max_requests`]: crate::datapath::sq::SendQueue::max_requests
pub(crate) fn completions_bound(qp: &mut Qp) -> u32 {
    qp.send_queue().max_requests() + qp.recv_queue().capacity()
}

/// One member's CQEs, moved out of the ring and not yet decoded by its owner.
struct Inbox {
    qpn: u32,
    cqes: VecDeque<[u8; cqe::SIZE]>,
}

/// A shared CQ's ring and its members' inboxes, behind its lock.
struct Polling {
    cq: Cq,
    /// Sorted by QPN.
    inboxes: Vec<Inbox>,
}

impl Polling {
    fn inbox(&mut self, qpn: u32) -> Option<&mut Inbox> {
        let at = self.inboxes.binary_search_by_key(&qpn, |i| i.qpn).ok()?;
        Some(&mut self.inboxes[at])
    }

    /// Moves every CQE in the ring to its member's inbox.
    fn drain_ring(&mut self) {
        let Polling { cq, inboxes } = self;
        cq.poller().drain_moved(
            |qpn, bytes| match inboxes.binary_search_by_key(&qpn, |i| i.qpn) {
                Ok(at) => inboxes[at].cqes.push_back(*bytes),
                Err(_) => {
                    tracing::debug!(qpn, "failover: backup CQE of a QP that is gone dropped")
                }
            },
        );
    }
}

/// A CQ shared by backup data QPs of one device.
pub(crate) struct SharedBackupCq {
    polling: Mutex<Polling>,
    /// Entries not held by a seat.
    free: Mutex<u32>,
    /// The entries of its ring, all of them for seats.
    entries: u32,
}

impl SharedBackupCq {
    fn polling(&self) -> MutexGuard<'_, Polling> {
        self.polling.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn free(&self) -> MutexGuard<'_, u32> {
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes `entries` of the free ones, if there are that many.
    fn take(&self, entries: u32) -> bool {
        let mut free = self.free();
        if *free < entries {
            return false;
        }
        *free -= entries;
        true
    }
}

/// A backup QP's place in a shared CQ: `entries` of it held for the QP's unpolled CQEs, and
/// the QP's inbox once it is [`BackupSeat::attach`]ed. Dropping it gives both back.
pub(crate) struct BackupSeat {
    cq: Arc<SharedBackupCq>,
    entries: u32,
    qpn: Option<u32>,
}

impl std::fmt::Debug for BackupSeat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackupSeat")
            .field("entries", &self.entries)
            .field("qpn", &self.qpn)
            .finish_non_exhaustive()
    }
}

impl Drop for BackupSeat {
    fn drop(&mut self) {
        if let Some(qpn) = self.qpn {
            let mut p = self.cq.polling();
            if let Ok(at) = p.inboxes.binary_search_by_key(&qpn, |i| i.qpn) {
                p.inboxes.remove(at);
            }
        }
        *self.cq.free() += self.entries;
    }
}

impl BackupSeat {
    /// The shared CQ itself, to create the member's QP on.
    pub(crate) fn with_cq<R>(&self, f: impl FnOnce(&Cq) -> R) -> R {
        f(&self.cq.polling().cq)
    }

    /// Holds `entries` in all, taking the difference from the CQ's free entries; false (and
    /// nothing taken) if it has not that many free.
    pub(crate) fn grow_to(&mut self, entries: u32) -> bool {
        if entries <= self.entries {
            return true;
        }
        if !self.cq.take(entries - self.entries) {
            return false;
        }
        self.entries = entries;
        true
    }

    /// Gives the member's QP (number `qpn`, created on [`BackupSeat::with_cq`]) its inbox:
    /// from now on the CQ's CQEs naming it are its.
    pub(crate) fn attach(&mut self, qpn: u32) {
        let mut p = self.cq.polling();
        if let Some(old) = self.qpn.replace(qpn) {
            if let Ok(at) = p.inboxes.binary_search_by_key(&old, |i| i.qpn) {
                p.inboxes.remove(at);
            }
        }
        if let Err(at) = p.inboxes.binary_search_by_key(&qpn, |i| i.qpn) {
            p.inboxes.insert(
                at,
                Inbox {
                    qpn,
                    cqes: VecDeque::new(),
                },
            );
        }
    }

    /// Polls up to `wcs.len()` of the member's completions into `wcs`, oldest first: moves the
    /// ring's CQEs to their members' inboxes, then decodes the member's own. Returns how many,
    /// and where the member's queues stood at the first error among them (the error mark of a
    /// CQ of its own, taken after the same completions).
    pub(crate) fn poll(&self, wcs: &mut [WorkCompletion]) -> (usize, ErrorMark) {
        let Some(qpn) = self.qpn else {
            return (0, ErrorMark::default());
        };
        let mut guard = self.cq.polling();
        let p = &mut *guard;
        p.drain_ring();
        let Ok(at) = p.inboxes.binary_search_by_key(&qpn, |i| i.qpn) else {
            return (0, ErrorMark::default());
        };
        // A mark left by a decode of this CQ is this member's: only its holder decodes, and
        // it takes the mark with the completions it decoded, under the lock.
        let mut n = 0;
        while n < wcs.len() {
            let Some(bytes) = p.inboxes[at].cqes.pop_front() else {
                break;
            };
            if p.cq.poller().decode_moved(&bytes, &mut wcs[n]) {
                n += 1;
            }
        }
        let mark = p.cq.poller().take_error_mark();
        (n, mark)
    }

    /// Drops every CQE of the member still in the ring or in its inbox, and no other member's:
    /// for a reset of the member's QP (its rings back to index 0, so an old CQE would name a
    /// WQE of the next incarnation). Returns how many were dropped.
    pub(crate) fn discard(&self) -> u32 {
        let Some(qpn) = self.qpn else { return 0 };
        let mut p = self.cq.polling();
        let from_ring = p.cq.discard_qp(qpn);
        let from_inbox = p.inbox(qpn).map_or(0, |i| {
            let n = i.cqes.len() as u32;
            i.cqes.clear();
            n
        });
        from_ring + from_inbox
    }
}

/// The shared backup CQs of a resilient context, per backup device. Weak: a CQ goes with its
/// last seat.
#[derive(Default)]
pub(crate) struct BackupCqs {
    devices: Mutex<DevicePool<SharedBackupCq>>,
}

impl std::fmt::Debug for BackupCqs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackupCqs").finish_non_exhaustive()
    }
}

impl BackupCqs {
    /// A seat of `entries` in a shared CQ of `ctx` with that many free, creating a CQ when
    /// none has: a device's first CQ is sized for one seat of `entries`, each next one for
    /// twice as many seats as the last, at most [`MAX_SEATS_PER_CQ`].
    pub(crate) fn reserve(
        &self,
        ctx: &Arc<Context>,
        entries: u32,
    ) -> Result<BackupSeat, VerbsError> {
        let mut devices = self.devices.lock().unwrap_or_else(|p| p.into_inner());
        let cqs = devices.live_on(ctx);
        for cq in cqs.iter().filter_map(Weak::upgrade) {
            if cq.take(entries) {
                return Ok(BackupSeat {
                    cq,
                    entries,
                    qpn: None,
                });
            }
        }
        let seats = (1u32 << cqs.len().min(6)).min(MAX_SEATS_PER_CQ);
        let size = seats
            .checked_mul(entries)
            .ok_or_else(|| VerbsError::InvalidArgument {
                device: ctx.name().to_string(),
                verb: "create_cq",
                what: format!("a shared backup CQ of {seats} x {entries} entries"),
            })?;
        let cq = ctx.create_cq(size, false)?;
        // A provider may round the ring up (a power of two): the seats may use all of it.
        let size = cq.capacity().max(size);
        let cq = Arc::new(SharedBackupCq {
            polling: Mutex::new(Polling {
                cq,
                inboxes: Vec::new(),
            }),
            free: Mutex::new(size - entries),
            entries: size,
        });
        tracing::debug!(device = %ctx.name(), seats, entries = size, "failover: shared backup CQ created");
        cqs.push(Arc::downgrade(&cq));
        Ok(BackupSeat {
            cq,
            entries,
            qpn: None,
        })
    }

    /// How many shared backup CQs are alive, and the entries they were sized for together.
    pub(crate) fn census(&self) -> (usize, u64) {
        let devices = self.devices.lock().unwrap_or_else(|p| p.into_inner());
        devices
            .all()
            .fold((0, 0), |(n, e), cq| (n + 1, e + u64::from(cq.entries)))
    }
}
