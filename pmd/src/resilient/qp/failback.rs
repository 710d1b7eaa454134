//! How the driver performs a failback round (`docs/failover.md` 5e): the backup died with
//! traffic on it, and its outstanding work goes back to the default QP, brought up in a new
//! epoch. The reverse of a failover round's ring work: the backup SQ's WQEs (and the WRs
//! withheld in the default ring behind them) are re-posted on the default SQ with their keys
//! mapped back to the default device, the receives likewise on the default RQ.

use hw_defs::mlx5::{SendOpcode, SEND_WQE_BB};

use crate::datapath::sq::raw::OutstandingWqe;
use crate::datapath::wr::WcStatus;
use crate::failover::{Epoch, Event, Path, Timestamp};

use crate::failover::plan::{plan_copy, sends_before_first_read};

use super::plan::skipped_completions;
use super::ResilientQp;
use crate::datapath::sq::raw::{mapped_peer_rkey, rewrite_recv_keys, rewrite_send_keys};

/// One WQE read out of a ring before the default QP's reset, keys already on the default
/// device.
struct Saved {
    wqe: OutstandingWqe,
    bytes: Vec<u8>,
}

impl ResilientQp {
    /// [`Action::DrainForFailback`](crate::failover::Action::DrainForFailback): both QPs are
    /// in ERR; poll both CQs until every WQE either was told about has completed or flushed.
    pub(super) fn drain_for_failback(&mut self, now: Timestamp) {
        self.slow.book.failback_draining = true;
        self.slow.book.drain_deadline = Some(now + self.slow.env.config.drain_timeout);
        self.collect(Path::Backup);
        self.collect(Path::Default);
        self.check_failback_drain();
    }

    /// The failback drain ends when both QPs' queues are flushed (or the drain deadline
    /// passed: a device that died without flushing, as 3.7); then it reports the counters
    /// and what was in flight.
    pub(super) fn check_failback_drain(&mut self) -> bool {
        if !self.slow.book.failback_draining {
            return false;
        }
        let sq = self.default.send_queue();
        let mut flushed = sq.completed() == sq.published();
        let rq = self.default.recv_queue();
        flushed &= rq.completed() == rq.published();
        if let Some(b) = self.slow.backup.as_mut() {
            let sq = b.qp.send_queue();
            flushed &= sq.completed() == sq.published();
            let rq = b.qp.recv_queue();
            flushed &= rq.completed() == rq.published();
        }
        if !flushed {
            let now = self.slow.env.clock.now();
            if self.slow.book.drain_deadline.is_none_or(|d| now < d) {
                return false;
            }
            tracing::warn!(qp = %self.shared.name, "failover: failing back, the flushes did not all come; the unfinished WQEs are unknown");
        }
        self.slow.book.failback_draining = false;
        let (list, _) = self.failback_send_list();
        let atomic_in_flight = list.iter().any(|w| {
            w.published && matches!(w.info.opcode, SendOpcode::AtomicCs | SendOpcode::AtomicFa)
        });
        let sends_before_first_read = sends_before_first_read(&list, self.sends_posted);
        let progress = self.progress_now();
        tracing::debug!(qp = %self.shared.name, ?progress, "failover: both QPs drained for the failback");
        self.enqueue(Event::FailbackDrained {
            progress,
            atomic_in_flight,
            sends_before_first_read,
        });
        true
    }

    /// The application's unfinished send WQEs, oldest first: the backup SQ's (everything on
    /// it was posted before anything the default ring holds now), then the default SQ's; and
    /// how many are the backup SQ's.
    fn failback_send_list(&mut self) -> (Vec<OutstandingWqe>, usize) {
        let mut list = Vec::new();
        let mut on_backup = 0;
        self.for_each_unfinished_send(|path, w| {
            on_backup += usize::from(path == Path::Backup);
            list.push(w);
        });
        (list, on_backup)
    }

    /// Calls `each` with the application's unfinished send WQEs, oldest first, and the ring
    /// each is on: the backup SQ's from its first error (or its consumer counter), then the
    /// default SQ's from where [`Book::default_unfinished`](super::book::Book::default_unfinished) puts the start; the failover's own
    /// WQEs left out (the backup's burns and fence, a rearm's probe on the default SQ). The
    /// one rule of which sends are the application's: a failback moves these, and the send
    /// admission counts them (`ResilientQp::sends_outstanding`).
    pub(super) fn for_each_unfinished_send(&mut self, mut each: impl FnMut(Path, OutstandingWqe)) {
        let completed = self.default_completed();
        let book = &self.slow.book;
        if let Some(b) = self.slow.backup.as_mut() {
            let sq = b.qp.send_queue();
            let start = book.errored[1].send_start.unwrap_or(sq.completed());
            sq.written_from(start)
                .filter(|w| !book.is_internal(w))
                .for_each(|w| each(Path::Backup, w));
        }
        let (start, _) = book.default_unfinished(completed);
        let probe = book.probe;
        self.default
            .send_queue()
            .written_from(start)
            .filter(|w| Some(w.counter) != probe)
            .for_each(|w| each(Path::Default, w));
    }

    /// Whether both rings' unfinished sends start at their consumer counters: no error or
    /// drain noted a start behind them, so their counters say what is outstanding.
    pub(super) fn unfinished_sends_start_at_completed(&mut self) -> bool {
        let completed = self.default_completed();
        self.slow.book.errored[1].send_start.is_none()
            && self.slow.book.default_unfinished(completed).0 == completed.0
    }

    /// The default rings' consumer counters, (send, receive).
    fn default_completed(&mut self) -> (u32, u32) {
        (
            self.default.send_queue().completed(),
            self.default.recv_queue().completed(),
        )
    }

    /// [`Action::Failback`](crate::failover::Action::Failback).
    pub(super) fn fail_back(&mut self, epoch: Epoch, skip_through: u64, now: Timestamp) {
        // 1. Read everything out before the reset takes the default rings back to index 0.
        let (list, on_backup) = self.failback_send_list();
        let (sends, recvs, unmapped) = self.save_for_failback(&list, on_backup);
        // 2. The default QP out of its epoch and up in the new one. From the reset on, the
        // saved copies are the only record of the work: the backup rings' is forgotten, so
        // a later failure completes each WR once, from the rings it was moved to or from
        // the book.
        self.reset_default();
        self.forget_backup_work();
        if let Some((status, why)) = unmapped {
            // Fail closed, as the failover direction does: a WQE whose keys name the backup
            // device must not be rung on the default one. Nothing is posted; the connection
            // fails and every saved WR completes in error.
            tracing::error!(qp = %self.shared.name, why, "failover: a WQE cannot be moved back to the default QP");
            self.keep_unposted(&sends, &recvs);
            self.slow.book.errored_mut(Path::Default).reported = true;
            self.enqueue(Event::ErrorCompletion {
                path: Path::Default,
                status,
            });
            return;
        }
        if let Err(e) = self.bring_up_default(epoch) {
            tracing::warn!(qp = %self.shared.name, %epoch, error = %e, "failover: failing back, the default QP did not come up");
            // The connection fails; the saved WRs complete in error then, once each.
            self.keep_unposted(&sends, &recvs);
            self.enqueue(Event::DefaultQpUp { epoch, ok: false });
            return;
        }
        // 3. Receives first, published: the peer sends only after our `FailbackReady`.
        let mut recvs_moved = 0u64;
        let mut failure = None;
        for (k, (bytes, wr_id)) in recvs.iter().enumerate() {
            if let Err(e) = self.default.recv_queue().write_raw(bytes, *wr_id) {
                failure.get_or_insert((WcStatus::LocQpOpErr, e.to_string()));
                self.slow.book.unsent_recvs = recvs[k..].iter().map(|r| r.1).collect();
                break;
            }
            recvs_moved += 1;
        }
        self.default.recv_queue().publish();
        // 4. Sends: the ones the peer consumed complete, the rest wait withheld for its
        // `FailbackReady`.
        let list: Vec<OutstandingWqe> = sends.iter().map(|s| s.wqe).collect();
        let plan = plan_copy(&list, self.sends_posted, skip_through);
        let qpn = self.slow.env.default_qpn;
        self.slow.wcs.extend(skipped_completions(&plan, &list, qpn));
        let skipped = plan.consumed as u64;
        let mut reposted = 0u64;
        for (k, s) in sends.iter().enumerate().skip(plan.consumed) {
            if failure.is_some() {
                // A receive did not go back: the connection fails, nothing more is posted.
                self.slow.book.unsent = list[k..].to_vec();
                break;
            }
            if let Err(e) = self.default.send_queue().post_raw(&s.bytes, s.wqe.wr_id) {
                failure.get_or_insert((WcStatus::LocQpOpErr, e.to_string()));
                self.slow.book.unsent = list[k..].to_vec();
                break;
            }
            reposted += 1;
        }
        self.slow.book.failing_back = true;
        self.slow
            .log
            .failback_moved(now, reposted, skipped, recvs_moved, epoch.0);
        tracing::info!(qp = %self.shared.name, %epoch, reposted, skipped, recvs_moved, from_backup = on_backup, "failover: work moved back to the default QP");
        let Some((status, why)) = failure else {
            self.enqueue(Event::DefaultQpUp { epoch, ok: true });
            return;
        };
        // A WQE that cannot go back is a local error of the default QP: the connection fails
        // (a refusal never fails over), and the machine never hears that the default QP is
        // up, so it tells the peer nothing that would let it send there.
        tracing::error!(qp = %self.shared.name, why, "failover: a WQE cannot be moved back to the default QP");
        self.slow.book.errored_mut(Path::Default).reported = true;
        self.enqueue(Event::ErrorCompletion {
            path: Path::Default,
            status,
        });
    }

    /// The saved WRs could not go to the default QP: they complete in error when the
    /// connection fails, in their order (the rings they came from are reset or forgotten).
    fn keep_unposted(&mut self, sends: &[Saved], recvs: &[(Vec<u8>, u64)]) {
        self.slow.book.unsent = sends.iter().map(|s| s.wqe).collect();
        self.slow.book.unsent_recvs = recvs.iter().map(|r| r.1).collect();
    }

    /// Copies the send WQEs `list` and every unfinished receive out of the rings, keys mapped
    /// to the default device (the backup's) or as they are (the default's); the first key
    /// without a mapping, as the local error it amounts to.
    #[allow(clippy::type_complexity)]
    fn save_for_failback(
        &mut self,
        list: &[OutstandingWqe],
        on_backup: usize,
    ) -> (Vec<Saved>, Vec<(Vec<u8>, u64)>, Option<(WcStatus, String)>) {
        let mut failure = None;
        let mut sends = Vec::with_capacity(list.len());
        for (i, &w) in list.iter().enumerate() {
            let on_backup = i < on_backup;
            let mut bytes = vec![0u8; usize::from(w.info.bbs.max(1)) * SEND_WQE_BB];
            if on_backup {
                let b = self.slow.backup.as_mut().expect("protected");
                let len = b.qp.send_queue().copy_wqe(w.counter, &mut bytes);
                bytes.truncate(len);
                if let Err(e) = self.map_back(&mut bytes) {
                    failure.get_or_insert(e);
                }
            } else {
                let len = self.default.send_queue().copy_wqe(w.counter, &mut bytes);
                bytes.truncate(len);
            }
            sends.push(Saved { wqe: w, bytes });
        }
        let mut recvs = Vec::new();
        let s = &mut *self.slow;
        let keys = s.env.shadow.as_ref().map(|s| &s.pd.keys);
        if let Some(b) = s.backup.as_mut() {
            let rq = b.qp.recv_queue();
            let start = s.book.errored[1].recv_start.unwrap_or(rq.completed());
            let stale = s.book.backup_stale as usize;
            let stride = rq.stride();
            for (at, wr_id) in rq.written_from(start).skip(stale) {
                let mut bytes = vec![0u8; stride];
                rq.copy_wqe(at, &mut bytes);
                if let Err(k) =
                    rewrite_recv_keys(&mut bytes, |k| keys.and_then(|m| m.default_lkey(k)))
                {
                    failure.get_or_insert((
                        WcStatus::LocProtErr,
                        format!("no default lkey for backup lkey {k:#x}"),
                    ));
                    break;
                }
                recvs.push((bytes, wr_id));
            }
        }
        // A failover round that became this failback copied the default RQ's receives up to
        // `copied` to the backup RQ (read above); only those posted since are the default's.
        let completed = (
            self.default.send_queue().completed(),
            self.default.recv_queue().completed(),
        );
        let start = match self.slow.book.default_recvs_copied {
            Some(copied) => copied,
            None => self.slow.book.default_unfinished(completed).1,
        };
        let rq = self.default.recv_queue();
        let stride = rq.stride();
        let on_default: Vec<(u32, u64)> = rq.written_from(start).collect();
        for (at, wr_id) in on_default {
            let mut bytes = vec![0u8; stride];
            self.default.recv_queue().copy_wqe(at, &mut bytes);
            recvs.push((bytes, wr_id));
        }
        (sends, recvs, failure)
    }

    /// Rewrites a backup SQ WQE's keys to the default device's: lkeys through the shadow
    /// PD's key map, the peer's backup rkey to the default rkey it stands for.
    fn map_back(&mut self, wqe: &mut [u8]) -> Result<(), (WcStatus, String)> {
        let rkey = mapped_peer_rkey(wqe, |k| self.default_rkey(k), "default")?;
        let keys = self.slow.env.shadow.as_ref().map(|s| &s.pd.keys);
        rewrite_send_keys(
            wqe,
            rkey,
            |k| keys.and_then(|m| m.default_lkey(k)),
            "default",
        )
    }

    /// The peer's default rkey whose backup rkey is `backup`: the reverse of the mapping a
    /// failover round used (`peer_rkeys` holds every mapping this end has translated with);
    /// `None` when no default rkey, or more than one, maps to it.
    fn default_rkey(&self, backup: u32) -> Option<u32> {
        only_key_of(&self.slow.backup.as_ref()?.peer_rkeys, backup)
    }

    /// The backup rings' unfinished work is on the default QP now: from here on the backup QP
    /// (in ERR until the repair resets it) owes the application nothing.
    fn forget_backup_work(&mut self) {
        let book = &mut self.slow.book;
        if let Some(b) = self.slow.backup.as_mut() {
            let e = &mut book.errored[1];
            e.send_start = Some(b.qp.send_queue().written());
            e.recv_start = Some(b.qp.recv_queue().written());
            e.reported = true;
        }
        book.backup_stale = 0;
        book.burns.clear();
        book.fence = None;
        book.failed_fence = None;
    }
}

/// The one key of `map` whose value is `value`; `None` when there is none or several. Two
/// default rkeys mapped to one backup rkey (a stale mapping beside a live one) leave unknown
/// which MR a WQE meant, so a failback fails closed instead of writing through a guess.
fn only_key_of(map: &std::collections::HashMap<u32, u32>, value: u32) -> Option<u32> {
    let mut keys = map.iter().filter(|&(_, &v)| v == value).map(|(&k, _)| k);
    let first = keys.next()?;
    keys.next().is_none().then_some(first)
}

#[cfg(test)]
mod reverse_key_tests {
    use super::only_key_of;

    #[test]
    fn a_backup_rkey_two_default_rkeys_map_to_maps_back_to_neither() {
        let map = [(0x10, 0xb1), (0x20, 0xb2), (0x30, 0xb2)]
            .into_iter()
            .collect();
        assert_eq!(only_key_of(&map, 0xb1), Some(0x10));
        assert_eq!(only_key_of(&map, 0xb2), None, "ambiguous: fail closed");
        assert_eq!(only_key_of(&map, 0xb3), None, "unknown");
    }
}
