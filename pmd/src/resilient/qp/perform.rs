//! How the driver performs each action of the failover machine: control verbs on the two QPs,
//! and the ring work that moves WQEs between them. What to move is planned by
//! [`super::plan`]; this posts the plan. An action never calls the machine: what it causes
//! (a completion, a result) is queued with `enqueue` for the event loop in [`super::driver`].

use hw_defs::mlx5::SEND_WQE_BB;

use crate::control::{ModifyError, Qp};
use crate::datapath::rq::RecvQueue;
use crate::datapath::sq::raw::{
    mapped_peer_rkey, rewrite_recv_keys, rewrite_send_keys, OutstandingWqe,
};
use crate::datapath::wr::{PostError, Remote, SendOp, SendWr, WcStatus};
use crate::failover::{
    Action, BackupEpoch, Epoch, Event, FailReason, Path, Side, SideEpoch, Timestamp,
};
use crate::qp_state::QpState;
use crate::verbs::QpAttr;

use crate::failover::plan::plan_copy;

use super::plan::{plan_error_completions, skipped_completions, Unfinished};
use super::work::internal_wr_id;
use super::ResilientQp;

/// The ACK timeout that covers the first transmission of the WQEs copied to the backup: a
/// copy lost there is resent after this, not after the QP's full timeout. Short enough for a
/// failover's tail, long enough that a busy 2-core machine's first ACK rarely misses it (a
/// miss costs one early resend of what is in flight, no retry).
const FIRST_RETRANSMIT_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(2);

/// Why a receive WQE could not be copied to another RQ.
enum RecvCopyError {
    /// Its lkey has no counterpart on the other device.
    NoKey(u32),
    /// The other RQ refused it (full).
    Post(PostError),
}

impl ResilientQp {
    /// Performs one action at `now`.
    pub(super) fn perform(&mut self, action: Action, now: Timestamp) {
        match action {
            Action::MoveQpToErr { path } => self.move_to_err(path),
            Action::DrainDefault => {
                self.slow.book.draining = true;
                self.slow.book.drain_deadline = Some(now + self.slow.env.config.drain_timeout);
                self.slow.book.drain_watch = super::book::DrainWatch {
                    started: now,
                    ..Default::default()
                };
                self.collect(Path::Default);
                self.check_drain();
            }
            Action::CopyRecvsToBackup => self.copy_recvs_to_backup(),
            Action::CopySendsToBackup { burn, skip_through } => {
                self.copy_sends_to_backup(burn, skip_through, now)
            }
            Action::ResetDefaultQp => self.reset_default(),
            Action::BringUpDefaultQp { epoch } => {
                let ok = match self.bring_up_default(epoch) {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!(qp = %self.shared.name, %epoch, error = %e, "failover: default QP not brought up");
                        false
                    }
                };
                self.enqueue(Event::DefaultQpUp { epoch, ok });
            }
            Action::PostProbe => self.post_probe(),
            Action::SendControl { via, message } => {
                let Some(b) = &self.slow.backup else { return };
                let channel = match via {
                    Path::Backup => &b.control,
                    Path::Default => &b.default_control,
                };
                tracing::debug!(qp = %self.shared.name, ?message, "failover: control message sent");
                if let Err(e) = channel.send(message) {
                    tracing::warn!(qp = %self.shared.name, ?via, error = %e, ?message, "failover: control message not sent");
                    self.enqueue(Event::ControlFailed { via });
                }
            }
            Action::SendManagement { message } => {
                let Some(b) = &self.slow.backup else { return };
                // The machine asks for it only with `failover::Config::management`, set when
                // both ends have an endpoint (`docs/failover.md` 5f).
                let sent = match &b.management {
                    Some(link) => link.send(message, now),
                    None => Err("no management channel"),
                };
                tracing::debug!(qp = %self.shared.name, ?message, "failover: control message sent over the management network");
                if let Err(e) = sent {
                    tracing::warn!(qp = %self.shared.name, ?message, error = e, "failover: management message not sent");
                }
            }
            Action::ResetSide { side: Side::Backup } => self.reset_backup(),
            Action::ResetSide {
                side: Side::DefaultChannel,
            } => {
                let Some(b) = &self.slow.backup else { return };
                if let Err(e) = b.default_control.reset() {
                    tracing::warn!(qp = %self.shared.name, error = %e, "failover: control QP on the default devices not reset");
                }
            }
            Action::BringUpSide { epoch } => {
                let result = match epoch {
                    SideEpoch::Backup(backup) => self.bring_up_backup(backup),
                    SideEpoch::DefaultChannel(_) => match &self.slow.backup {
                        Some(b) => b.default_control.reconnect(epoch),
                        None => return,
                    },
                };
                let ok = match result {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!(qp = %self.shared.name, %epoch, error = %e, "failover: side not brought up");
                        false
                    }
                };
                self.enqueue(Event::SideUp { epoch, ok });
            }
            Action::DrainBackup => {
                self.collect(Path::Backup);
                let progress = self.progress_now();
                self.enqueue(Event::BackupDrained { progress });
            }
            Action::MoveRecvsToDefault { consumed_through } => {
                self.move_recvs_to_default(consumed_through)
            }
            Action::DrainForFailback => self.drain_for_failback(now),
            Action::Failback {
                epoch,
                skip_through,
            } => self.fail_back(epoch, skip_through, now),
            Action::ReleaseDefaultDoorbell => {
                self.default.ring_doorbell();
                let epoch = self.epoch();
                if std::mem::take(&mut self.slow.book.failing_back) {
                    // The end of a failback, counted by its observation, not a switch-back.
                    return;
                }
                self.slow.log.switched_back(now, epoch);
            }
            Action::SurfaceError { status, reason } => self.surface(status, reason, now),
        }
    }

    /// The machine's epoch, for the log (0 before protection).
    fn epoch(&self) -> u32 {
        self.slow.machine.as_ref().map_or(0, |m| m.epoch().0)
    }

    /// `path`'s QP, if it exists.
    fn qp_mut(&mut self, path: Path) -> Option<&mut Qp> {
        match path {
            Path::Default => Some(&mut self.default),
            Path::Backup => self.slow.backup.as_mut().map(|b| &mut b.qp),
        }
    }

    fn move_to_err(&mut self, path: Path) {
        let Some(qp) = self.qp_mut(path) else { return };
        if let Err(e) = qp.handle().set_error() {
            tracing::debug!(qp = %self.shared.name, ?path, error = %e, "failover: QP not moved to ERR");
        }
    }

    pub(super) fn reset_default(&mut self) {
        // Read before the reset takes the rings back to index 0.
        let rq_completed = self.default.recv_queue().completed();
        if let Err(e) = self.default.modify(QpState::Reset, &QpAttr::default()) {
            tracing::warn!(qp = %self.shared.name, error = %e, "failover: default QP not reset");
        }
        self.default_cq.discard_qp(self.slow.env.default_qpn);
        self.slow.book.default_reset(rq_completed);
    }

    /// RESET -> INIT -> RTR -> RTS with the application's attributes and the PSNs of `epoch`.
    pub(super) fn bring_up_default(&mut self, epoch: Epoch) -> Result<(), ModifyError> {
        let qpn = self.slow.env.default_qpn;
        let missing = |state| ModifyError::NotSaved { qpn, state };
        let base = &self
            .slow
            .backup
            .as_ref()
            .ok_or(missing(QpState::Init))?
            .base;
        let init = base.init.clone().ok_or(missing(QpState::Init))?;
        let mut rtr = base.rtr.clone().ok_or(missing(QpState::Rtr))?;
        let mut rts = base.rts.clone().ok_or(missing(QpState::Rts))?;
        rtr.rq_psn = Some(epoch.start_psn(rtr.rq_psn.unwrap_or(0)));
        rts.sq_psn = Some(epoch.start_psn(rts.sq_psn.unwrap_or(0)));
        if self.default.state() != QpState::Reset {
            self.reset_default();
        }
        self.default.modify(QpState::Init, &init)?;
        self.default.modify(QpState::Rtr, &rtr)?;
        self.default.modify(QpState::Rts, &rts)
    }

    /// The backup data QP and the backup control QP leave their backup epoch: RESET (the
    /// backup rings back to index 0, the old incarnation's completions discarded), the
    /// control QP back to INIT with its receives posted.
    fn reset_backup(&mut self) {
        let s = &mut *self.slow;
        let Some(b) = s.backup.as_mut() else { return };
        if let Err(e) = b.qp.modify(QpState::Reset, &QpAttr::default()) {
            tracing::warn!(qp = %self.shared.name, error = %e, "failover: backup QP not reset");
        }
        b.cq.discard();
        if let Err(e) = b.control.reset() {
            tracing::warn!(qp = %self.shared.name, error = %e, "failover: backup control QP not reset");
        }
        s.book.backup_reset();
    }

    /// The backup data QP RESET -> INIT -> RTR -> RTS towards the peer's backup QP, with the
    /// application's attributes and the PSNs of backup epoch `epoch`; the backup control QP
    /// INIT -> RTR -> RTS in the same epoch.
    fn bring_up_backup(&mut self, epoch: BackupEpoch) -> Result<(), ModifyError> {
        let b = self.slow.backup.as_mut().ok_or(ModifyError::NotSaved {
            qpn: self.slow.env.default_qpn,
            state: QpState::Init,
        })?;
        let qpn = b.qp.qpn();
        let missing = |state| ModifyError::NotSaved { qpn, state };
        let init = b.base.init.clone().ok_or(missing(QpState::Init))?;
        let mut rtr = b.base.rtr.clone().ok_or(missing(QpState::Rtr))?;
        let mut rts = b.base.rts.clone().ok_or(missing(QpState::Rts))?;
        // Towards the peer's backup QP, as the shadow verbs brought it up first.
        let av = rtr.av.ok_or(missing(QpState::Rtr))?;
        rtr.av = Some(crate::verbs::AddressVector {
            dgid: b.peer.backup_gid,
            ..av
        });
        rtr.dest_qpn = Some(b.peer.backup_qpn);
        rtr.rq_psn = Some(epoch.start_psn(rtr.rq_psn.unwrap_or(0)));
        rts.sq_psn = Some(epoch.start_psn(rts.sq_psn.unwrap_or(0)));
        if b.qp.state() != QpState::Reset {
            b.qp.modify(QpState::Reset, &QpAttr::default())?;
            // The old incarnation's CQEs go with its rings: its seat in the shared backup CQ
            // holds one incarnation's worth (`backup_cq::completions_bound`).
            b.cq.discard();
        }
        b.qp.modify(QpState::Init, &init)?;
        b.qp.modify(QpState::Rtr, &rtr)?;
        b.qp.modify(QpState::Rts, &rts)?;
        b.control.reconnect(SideEpoch::Backup(epoch))
    }

    fn post_probe(&mut self) {
        let wr = empty_write();
        let at = self.default.send_queue().written();
        match self.default.post_send(&wr) {
            Ok(_) => {
                self.default.ring_doorbell();
                self.slow.book.probe = Some(at);
            }
            Err(e) => {
                tracing::debug!(qp = %self.shared.name, error = %e, "failover: probe not posted");
                self.enqueue(Event::ProbeCompleted { ok: false });
            }
        }
    }

    /// State 3: post the fence ourselves, a zero-length signaled WRITE on the backup QP
    /// behind everything posted there, instead of waiting for the application's next
    /// signaled WR (an idle end, or one that rarely signals, then switches back too).
    pub(super) fn maybe_fence(&mut self) {
        let Some(machine) = &self.slow.machine else {
            return;
        };
        if !machine.reports_signaled_posts() || self.slow.book.fence.is_some() {
            return;
        }
        let wr = empty_write();
        let b = self.slow.backup.as_mut().expect("protected");
        match b.qp.post_send(&wr) {
            Ok(_) => {
                b.qp.ring_doorbell();
                self.slow.book.fence = Some(b.qp.send_queue().written());
                let progress = self.progress_now();
                self.enqueue(Event::SignaledPosted { progress });
            }
            Err(e) => {
                tracing::warn!(qp = %self.shared.name, error = %e, "failover: switch-back fence not posted; retrying later");
            }
        }
    }

    // ---- moving WQEs between the rings -----------------------------------------------------

    /// The receive WQEs of the default RQ from where the drain found them, in order, to the
    /// backup RQ behind whatever is posted there, lkeys rewritten.
    fn copy_recvs_to_backup(&mut self) {
        let start = self
            .slow
            .book
            .moving
            .map_or_else(|| self.default.recv_queue().completed(), |(_, r)| r);
        let mut list = std::mem::take(&mut self.slow.scratch.recv_list);
        list.clear();
        list.extend(self.default.recv_queue().written_from(start));
        let mut bytes = std::mem::take(&mut self.slow.scratch.wqe_bytes);
        let s = &mut *self.slow;
        let keys = s.env.shadow.as_ref().map(|s| &s.pd.keys);
        let b = s.backup.as_mut().expect("protected");
        let (moved, failure) = copy_recvs(
            self.default.recv_queue(),
            b.qp.recv_queue(),
            &list,
            &mut bytes,
            |k| keys.and_then(|m| m.backup_lkey(k)),
        );
        s.scratch.wqe_bytes = bytes;
        s.scratch.recv_list = list;
        s.log.recvs_copied(moved);
        s.book.default_recvs_copied = Some(start.wrapping_add(moved as u32));
        match failure {
            Some(RecvCopyError::NoKey(key)) => self.cannot_copy(
                WcStatus::LocProtErr,
                &format!("no backup lkey for {key:#x}"),
            ),
            Some(RecvCopyError::Post(e)) => self.cannot_copy(WcStatus::LocQpOpErr, &e.to_string()),
            None => {}
        }
    }

    /// A WQE could not be moved (no backup key, no room): the backup QP cannot carry this
    /// connection, which the machine treats as a local error of the backup QP.
    fn cannot_copy(&mut self, status: WcStatus, why: &str) {
        tracing::error!(qp = %self.shared.name, why, "failover: a WQE cannot be moved to the backup QP");
        self.slow.book.errored_mut(Path::Backup).reported = true;
        self.enqueue(Event::ErrorCompletion {
            path: Path::Backup,
            status,
        });
    }

    /// Moves the default SQ's outstanding WQEs to the backup SQ as [`plan_copy`] plans it:
    /// the ones the peer consumed complete (signaled ones with success), then `burn`
    /// zero-length SENDs, then the rest (READs among them), keys, WQE index and QPN
    /// rewritten; rings the backup doorbell. A READ among the consumed ones is never sent
    /// again nor completed as a success (the machine refuses that round first).
    fn copy_sends_to_backup(&mut self, burn: u64, skip_through: u64, now: Timestamp) {
        // A retransmission maps rkeys only through mappings the store confirms in this round
        // (with a store): the peer may have deregistered an MR since the cache learned it.
        if let Some(b) = self.slow.backup.as_mut() {
            b.rkeys_confirmed.clear();
        }
        let start = self
            .slow
            .book
            .moving
            .map_or_else(|| self.default.send_queue().completed(), |(s, _)| s);
        let probe = self.slow.book.probe;
        let mut list = std::mem::take(&mut self.slow.scratch.wqe_list);
        list.clear();
        list.extend(
            self.default
                .send_queue()
                .written_from(start)
                .filter(|w| Some(w.counter) != probe),
        );
        let plan = plan_copy(&list, self.sends_posted, skip_through);
        if plan.overtaken_read {
            // Nothing is moved or completed: the connection fails, and every WQE completes
            // in error then.
            self.slow.book.unsent = list.clone();
            self.slow.scratch.wqe_list = list;
            return self.cannot_copy(WcStatus::LocQpOpErr, "a READ the peer overtook");
        }
        // 1. Consumed by the peer: complete, do not send again.
        let skipped = plan.skipped(&list).count() as u64;
        let qpn = self.slow.env.default_qpn;
        self.slow.wcs.extend(skipped_completions(&plan, &list, qpn));
        // 2. Burns, first of all on the backup SQ.
        let mut failure = None;
        if burn > 0 {
            let b = self.slow.backup.as_mut().expect("protected");
            let from = b.qp.send_queue().written();
            for _ in 0..burn {
                let wr = SendWr::new(internal_wr_id(), SendOp::Send, &[]);
                if let Err(e) = b.qp.post_send(&wr) {
                    failure = Some((WcStatus::LocQpOpErr, e.to_string()));
                    break;
                }
            }
            let to = b.qp.send_queue().written();
            self.slow.book.burns.push_back((from, to));
        }
        // 3. Everything the peer has not consumed, in order.
        let mut copied = 0u64;
        let mut bytes = std::mem::take(&mut self.slow.scratch.wqe_bytes);
        if failure.is_some() {
            // The burns did not fit: nothing more goes to the backup SQ, and the default
            // ring is reset next, so the book keeps every WQE to move (they complete in
            // error when the connection fails).
            self.slow.book.unsent = plan.posts(&list).copied().collect();
        } else {
            for (k, &w) in plan.posts(&list).enumerate() {
                if let Err(e) = self.copy_send_to_backup(w, &mut bytes) {
                    failure = Some(e);
                    // They stay unsent; the connection fails, and they complete in error
                    // then (the default ring is reset below: keep what they were).
                    self.slow.book.unsent = plan.posts(&list).skip(k).copied().collect();
                    break;
                }
                copied += 1;
            }
        }
        if let Some(b) = self.slow.backup.as_mut() {
            if copied > 0 || burn > 0 {
                // Armed before the doorbell, so that it covers the first packet: a copy lost
                // on the backup is resent in a few milliseconds, not after the QP's RC ACK
                // timeout (67 ms at the tools' `-u 14`).
                if let Err(e) = b.qp.arm_short_retransmit(FIRST_RETRANSMIT_TIMEOUT) {
                    tracing::debug!(qp = %self.shared.name, error = %e, "failover: no short retransmit timer");
                }
            }
            b.qp.ring_doorbell();
        }
        self.slow.scratch.wqe_bytes = bytes;
        self.slow.scratch.wqe_list = list;
        let epoch = self.epoch();
        self.slow.log.round_finished(now, copied, skipped, epoch);
        if let Some((status, why)) = failure {
            self.cannot_copy(status, &why);
        }
    }

    /// Copies the default SQ's WQE `w` to the backup SQ, keys rewritten; on failure, the
    /// status of the local error it amounts to and why.
    fn copy_send_to_backup(
        &mut self,
        w: OutstandingWqe,
        bytes: &mut Vec<u8>,
    ) -> Result<(), (WcStatus, String)> {
        bytes.resize(usize::from(w.info.bbs.max(1)) * SEND_WQE_BB, 0);
        let len = self.default.send_queue().copy_wqe(w.counter, bytes);
        let wqe = &mut bytes[..len];
        // The peer's rkey, mapped first (a lookup may ask the store).
        let rkey = mapped_peer_rkey(wqe, |k| self.backup_rkey(k), "backup")?;
        let keys = self.slow.env.shadow.as_ref().map(|s| &s.pd.keys);
        rewrite_send_keys(wqe, rkey, |k| keys.and_then(|m| m.backup_lkey(k)), "backup")
            .map_err(|(status, why)| (status, format!("WQE at {:#x}: {why}", w.counter)))?;
        let b = self.slow.backup.as_mut().expect("protected");
        b.qp.send_queue()
            .post_raw(wqe, w.wr_id)
            .map(drop)
            .map_err(|e| (WcStatus::LocQpOpErr, e.to_string()))
    }

    /// Receiver side of a switch-back: the backup RQ's application receives (behind any
    /// stale ones) to the default RQ, lkeys rewritten; they become stale on the backup RQ.
    fn move_recvs_to_default(&mut self, consumed_through: u64) {
        debug_assert_eq!(self.recvs_completed(), consumed_through);
        let stale = self.slow.book.backup_stale;
        let mut list = std::mem::take(&mut self.slow.scratch.recv_list);
        list.clear();
        let mut bytes = std::mem::take(&mut self.slow.scratch.wqe_bytes);
        let s = &mut *self.slow;
        let keys = s.env.shadow.as_ref().map(|s| &s.pd.keys);
        let b = s.backup.as_mut().expect("protected");
        list.extend(b.qp.recv_queue().outstanding().skip(stale as usize));
        let (moved, failure) = copy_recvs(
            b.qp.recv_queue(),
            self.default.recv_queue(),
            &list,
            &mut bytes,
            |k| keys.and_then(|m| m.default_lkey(k)),
        );
        s.book.backup_stale += moved;
        s.log.recvs_moved_back(moved);
        s.scratch.wqe_bytes = bytes;
        s.scratch.recv_list = list;
        tracing::info!(qp = %self.shared.name, moved, stale = self.slow.book.backup_stale, "failover: receives back on the default QP");
        let why = match failure {
            None => return,
            Some(RecvCopyError::NoKey(key)) => {
                format!("no default lkey for backup lkey {key:#x}")
            }
            Some(RecvCopyError::Post(e)) => e.to_string(),
        };
        // The default QP is live: a receive that cannot go back fails the connection the way
        // a local error of the default QP would.
        tracing::error!(qp = %self.shared.name, why, "failover: a receive cannot be moved back");
        self.enqueue(Event::ErrorCompletion {
            path: Path::Default,
            status: WcStatus::LocQpOpErr,
        });
    }

    // ---- failing the connection -------------------------------------------------------------

    /// The connection failed: both QPs to ERR, the successes still in the CQs to the
    /// application, then every outstanding WR completes in error as
    /// [`plan_error_completions`] plans it (the first with `status`, or the refusing
    /// completion itself), as a plain RC QP in ERR fails.
    pub(super) fn surface(&mut self, status: WcStatus, reason: FailReason, now: Timestamp) {
        self.move_to_err(Path::Default);
        self.move_to_err(Path::Backup);
        self.collect(Path::Backup);
        self.collect(Path::Default);
        self.slow.failed = Some(reason);
        self.slow.book.draining = false;
        self.slow.book.failback_draining = false;
        self.slow.book.failing_back = false;
        let refusing = match reason {
            FailReason::Refused { .. } => [Path::Default, Path::Backup].into_iter().find_map(|p| {
                let wc = self.slow.book.errored(p).error_wc?;
                (wc.status == status).then_some((p, wc))
            }),
            _ => None,
        };
        // Oldest first: the backup QP's work was posted before the default QP's.
        let order = [Path::Backup, Path::Default];
        let mut sends: [Vec<_>; 2] = Default::default();
        let mut recvs: [Vec<_>; 2] = Default::default();
        let copied = self.slow.book.default_recvs_copied;
        for (i, path) in order.into_iter().enumerate() {
            let e = *self.slow.book.errored(path);
            let stale = match path {
                Path::Backup => self.slow.book.backup_stale as usize,
                Path::Default => 0,
            };
            let Some(qp) = self.qp_mut(path) else {
                continue;
            };
            let completed = (qp.send_queue().completed(), qp.recv_queue().completed());
            let (send_start, recv_start) = match path {
                Path::Default => self.slow.book.default_unfinished(completed),
                Path::Backup => (
                    e.send_start.unwrap_or(completed.0),
                    e.recv_start.unwrap_or(completed.1),
                ),
            };
            let qp = self.qp_mut(path).expect("checked above");
            let sq = qp.send_queue();
            sends[i].extend(sq.written_from(send_start));
            let rq = qp.recv_queue();
            let start = match (path, copied) {
                // A round copied these to the backup RQ, listed there: only the receives
                // posted behind the copies are the default RQ's own.
                (Path::Default, Some(copied)) => copied,
                _ => recv_start,
            };
            recvs[i].extend(rq.written_from(start).skip(stale));
        }
        let queues = [0, 1].map(|i| Unfinished {
            path: order[i],
            sends: &sends[i],
            recvs: &recvs[i],
        });
        let mut errors = Vec::new();
        let qpn = self.slow.env.default_qpn;
        plan_error_completions(queues, &self.slow.book, refusing, status, qpn, &mut errors);
        self.slow.wcs.extend(errors);
        self.slow.book.unsent.clear();
        self.slow.book.unsent_recvs.clear();
        self.slow.book.fence = None;
        self.slow.book.failed_fence = None;
        self.slow.book.probe = None;
        let epoch = self.epoch();
        self.slow.log.connection_failed(reason, now, epoch);
    }
}

/// Copies the receive WQEs `list` (`(counter, wr_id)`) of `from`, in order, to the tail of
/// `to` with each lkey mapped through `map`, then publishes `to`; returns how many were
/// copied, and why the next one was not.
fn copy_recvs(
    from: &RecvQueue,
    to: &mut RecvQueue,
    list: &[(u32, u64)],
    bytes: &mut Vec<u8>,
    map: impl Fn(u32) -> Option<u32>,
) -> (u64, Option<RecvCopyError>) {
    bytes.resize(from.stride(), 0);
    let mut moved = 0u64;
    let mut failure = None;
    for &(at, wr_id) in list {
        from.copy_wqe(at, bytes);
        if let Err(key) = rewrite_recv_keys(bytes, &map) {
            failure = Some(RecvCopyError::NoKey(key));
            break;
        }
        if let Err(e) = to.write_raw(bytes, wr_id) {
            failure = Some(RecvCopyError::Post(e));
            break;
        }
        moved += 1;
    }
    to.publish();
    (moved, failure)
}

/// The failover's own signaled zero-length RDMA WRITE (probes, fences): it names no memory,
/// so rkey 0 does.
fn empty_write() -> SendWr<'static> {
    let remote = Remote { addr: 0, rkey: 0 };
    SendWr::new(internal_wr_id(), SendOp::Write { remote }, &[]).signaled()
}
