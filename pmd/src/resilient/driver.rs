//! The driver half of a resilient QP: it feeds the failover machine its events and performs
//! the actions the machine returns, on the thread that owns the QP (the application's lcore,
//! or the service lcore for an adopted QP). Every action runs here, in the order given,
//! including the control verbs (moving a QP to ERR, bringing it up): the datapath is stalled
//! by the failover anyway, and doing them in place keeps their order with the ring work
//! around them (`docs/failover.md`, the pmd side).
//!
//! One event loop: `run` gathers events from their sources (mail, timers, the two CQs, the
//! end of a drain) into one queue, and `process_events` is the only place that hands them to
//! the machine. Everything that produces an event, a source or an action, only queues it
//! (`enqueue`): an action never calls the machine, so no call of the machine is nested in
//! another, and handling an event allocates nothing.

use hw_defs::mlx5::{DataSeg, SendOpcode, SEND_WQE_BB};

use crate::datapath::cq::{send_wc_opcode, ErrorMark};
use crate::datapath::sq::rewrite_keys;
use crate::datapath::wr::{Remote, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion};
use crate::failover::{
    Action, Epoch, Event, FailReason, Failover, Observation, Path, Progress, Role, RoundTrigger,
    SendPhase, Timestamp,
};
use crate::qp_state::QpState;
use crate::verbs::QpAttr;

use super::mailbox::Mail;
use super::qp::{
    internal_wr_id, is_recv, two_sided_opcode, Backup, Errored, ResilientQp, RoundRecord,
};
use super::stats::{Cause, EventKind, FailoverEvent, EVENT_LOG_CAPACITY};

/// Rounds of mail, timers and polling one `run` does at most before it returns (each round
/// that finds nothing ends it sooner).
const MAX_ROUNDS: usize = 64;

/// Where [`ResilientQp::run`] gathers events from, in the order one round visits them.
#[derive(Debug, Clone, Copy)]
enum Source {
    /// The service lcore's mail: control messages, link changes, protection.
    Mail,
    /// The machine's timer.
    Timer,
    /// The backup CQ.
    BackupCq,
    /// The default CQ.
    DefaultCq,
    /// The end of a drain of the default QP.
    Drain,
}

impl Source {
    const ROUND: [Source; 5] = [
        Source::Mail,
        Source::Timer,
        Source::BackupCq,
        Source::DefaultCq,
        Source::Drain,
    ];
}

fn path_index(path: Path) -> usize {
    match path {
        Path::Default => 0,
        Path::Backup => 1,
    }
}

impl ResilientQp {
    /// Everything failover-related that is due: mail, timers, completions of both QPs (into
    /// the WC buffer), a drain in progress, a fence. Then publishes what the service lcore
    /// needs to know. The event loop: each source's events are handled, with every event
    /// their actions cause, before the next source is looked at.
    pub(super) fn run(&mut self) {
        // Events a poll queued before calling here (an error completion it found) come first.
        self.process_events();
        for _ in 0..MAX_ROUNDS {
            let mut moved = false;
            for source in Source::ROUND {
                moved |= self.gather(source);
                self.process_events();
            }
            if !moved {
                break;
            }
        }
        self.publish();
    }

    /// Queues what `source` has for the machine; returns whether it had anything (completions
    /// for the application count).
    fn gather(&mut self, source: Source) -> bool {
        match source {
            Source::Mail => self.take_mail(),
            Source::Timer => self.tick(),
            Source::BackupCq => self.collect(Path::Backup),
            Source::DefaultCq => self.collect(Path::Default),
            Source::Drain => self.check_drain(),
        }
    }

    fn publish(&self) {
        let s = &self.slow;
        let deadline = if s.failed.is_some() {
            None
        } else {
            s.machine.as_ref().and_then(|m| m.poll_timeout())
        };
        let armed = s.failed.is_none()
            && s.machine.as_ref().is_some_and(|m| {
                matches!(
                    m.default_qp_phase(),
                    crate::failover::DefaultQpPhase::Live
                        | crate::failover::DefaultQpPhase::Unconfirmed
                ) && m.send_phase() != SendPhase::FailingOver
            });
        let busy = s.failed.is_none()
            && (s.draining || s.fence.is_some() || s.probe.is_some() || !s.events.is_empty());
        self.shared.publish(deadline, armed, busy);
    }

    /// Application receives completed successfully, on either QP, since the connection began.
    fn recvs_completed(&mut self) -> u64 {
        let rq = self.default.recv_queue().completed();
        let on_default = self.slow.errored[0].recv_start.unwrap_or(rq);
        self.slow.recvs_before_reset + u64::from(on_default) + self.slow.recvs_on_backup
    }

    /// The counters the machine reads.
    fn progress_now(&mut self) -> Progress {
        let mut outstanding = 0u64;
        let start = self.slow.errored[0]
            .send_start
            .unwrap_or_else(|| self.default.send_queue().completed());
        outstanding += self
            .default
            .send_queue()
            .written_from(start)
            .filter(|w| two_sided_opcode(w.info.opcode))
            .count() as u64;
        if let Some(b) = &mut self.slow.backup {
            let burns = &self.slow.burns;
            outstanding +=
                b.qp.send_queue()
                    .outstanding()
                    .filter(|w| {
                        two_sided_opcode(w.info.opcode)
                            && !burns.iter().any(|(s, e)| in_range(w.counter, *s, *e))
                    })
                    .count() as u64;
        }
        Progress {
            sends_posted: self.sends_posted,
            sends_completed: self.sends_posted.saturating_sub(outstanding),
            recvs_posted: self.recvs_posted,
            recvs_completed: self.recvs_completed(),
        }
    }

    // ---- mail ---------------------------------------------------------------------------

    fn take_mail(&mut self) -> bool {
        if !self.shared.pending() {
            return false;
        }
        let mut mail = std::mem::take(&mut self.slow.mail);
        self.shared.take(&mut mail);
        let any = !mail.is_empty();
        while let Some(m) = mail.pop_front() {
            match m {
                Mail::Event(e) => {
                    tracing::debug!(qp = %self.shared.name, event = ?e, "failover: mail");
                    self.enqueue(e)
                }
                Mail::Protected(parts) => self.install(*parts),
                Mail::SetupFailed(e) => self.slow.setup_error = Some(e),
            }
        }
        self.slow.mail = mail;
        any
    }

    /// The backup side is ready: arm failover.
    fn install(&mut self, parts: super::mailbox::BackupParts) {
        if self.slow.errored[0].reported
            || self.default.state() != QpState::Rts
            || self.slow.failed.is_some()
        {
            tracing::warn!(qp = %self.shared.name, state = %self.default.state(), "failover: the default QP failed before the backup side was ready; it stays unprotected");
            return;
        }
        let s = &mut *self.slow;
        let local = (
            s.default_ctx.query_gid(0).map(|g| g.0).unwrap_or_default(),
            s.default_qpn,
        );
        let peer = (parts.peer.default_gid.0, parts.peer.default_qpn);
        let role = if local < peer {
            Role::Leader
        } else {
            Role::Follower
        };
        s.peer_rkeys = parts.peer.rkeys.iter().copied().collect();
        s.base = parts.base;
        let now = s.clock.now();
        s.machine = Some(Failover::new(s.config.machine(role), now));
        s.backup = Some(Backup {
            qp: parts.qp,
            cq: parts.cq,
            control: parts.control,
            peer: parts.peer,
        });
        tracing::info!(qp = %self.shared.name, ?role, "failover: armed");
        let early = std::mem::take(&mut self.slow.early);
        for e in early {
            self.enqueue(e);
        }
    }

    fn tick(&mut self) -> bool {
        let Some(machine) = &self.slow.machine else {
            return false;
        };
        let now = self.slow.clock.now();
        match machine.poll_timeout() {
            Some(due) if now >= due && self.slow.failed.is_none() => {
                self.enqueue(Event::Tick);
                true
            }
            _ => false,
        }
    }

    // ---- the machine ----------------------------------------------------------------------

    /// The one way events enter: queued for `process_events` (kept aside
    /// until the QP is protected, and replayed then).
    pub(super) fn enqueue(&mut self, event: Event) {
        if self.slow.machine.is_some() {
            self.slow.events.push_back(event);
        } else {
            self.slow.early.push(event);
        }
    }

    /// Hands every queued event to the machine, in order, and performs its actions (which may
    /// queue more events, handled here too), until the queue is empty. Called only from the
    /// top of `run`: never from an action.
    fn process_events(&mut self) {
        while let Some(event) = self.slow.events.pop_front() {
            let Some(machine) = self.slow.machine.as_mut() else {
                return;
            };
            let now = self.slow.clock.now();
            let actions = machine.handle(event, now);
            while let Some(observed) = self
                .slow
                .machine
                .as_mut()
                .and_then(|m| m.poll_observation())
            {
                self.observe(observed, now);
            }
            for action in actions {
                self.perform(action, now);
            }
            self.maybe_fence();
        }
    }

    /// What the machine observed, into the log.
    fn observe(&mut self, observed: Observation, now: Timestamp) {
        match observed {
            Observation::RoundStarted { epoch, trigger } => self.round_started(trigger, now, epoch),
            Observation::SwitchBackStarted { .. } => self.slow.switch_started = Some(now),
        }
    }

    fn round_started(&mut self, trigger: RoundTrigger, now: Timestamp, epoch: Epoch) {
        let cause = match trigger {
            RoundTrigger::ErrorCompletion(status) => Cause::of_status(status),
            RoundTrigger::LinkDown => Cause::LinkDown,
            RoundTrigger::Peer => Cause::PeerFailover,
        };
        tracing::info!(qp = %self.shared.name, device = %self.slow.default_device, cause = cause.as_str(), epoch = epoch.0, "failover: round started");
        self.slow.round = Some(RoundRecord {
            detected: now,
            cause,
            epoch: epoch.0,
        });
    }

    fn perform(&mut self, action: Action, now: Timestamp) {
        match action {
            Action::MoveQpToErr { path } => self.move_to_err(path),
            Action::DrainDefault => {
                self.slow.draining = true;
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
            Action::SendControl(message) => {
                let Some(b) = &self.slow.backup else { return };
                if let Err(e) = b.control.send(message) {
                    tracing::warn!(qp = %self.shared.name, error = %e, ?message, "failover: control message not sent");
                    self.enqueue(Event::ControlSendFailed);
                }
            }
            Action::DrainBackup => {
                self.collect(Path::Backup);
                let progress = self.progress_now();
                self.enqueue(Event::BackupDrained { progress });
            }
            Action::MoveRecvsToDefault { consumed_through } => {
                self.move_recvs_to_default(consumed_through)
            }
            Action::ReleaseDefaultDoorbell => {
                self.default.ring_doorbell();
                self.switched_back(now);
            }
            Action::SurfaceError { status, reason } => self.surface(status, reason, now),
        }
    }

    // ---- collecting completions --------------------------------------------------------------

    /// Polls `path`'s CQ into the WC buffer, queuing the events the machine needs to know.
    /// Returns whether anything was polled.
    fn collect(&mut self, path: Path) -> bool {
        if self.slow.failed.is_some() {
            return false;
        }
        if path == Path::Backup && self.slow.backup.is_none() {
            return false;
        }
        let mut any = false;
        loop {
            let mut scratch = self.slow.scratch;
            let n = match path {
                Path::Default => self.default_cq.poll(&mut scratch),
                Path::Backup => {
                    let b = self.slow.backup.as_mut().expect("checked above");
                    b.cq.poll(&mut scratch)
                }
            };
            if n == 0 {
                break;
            }
            any = true;
            self.take_batch(path, &scratch[..n]);
        }
        any
    }

    /// Takes one batch of completions polled from `path`'s CQ, in order: the application's
    /// into the WC buffer, the failover's own swallowed, events queued.
    pub(super) fn take_batch(&mut self, path: Path, wcs: &[WorkCompletion]) {
        let mark = match path {
            Path::Default => self.default_cq.poller().take_error_mark(),
            Path::Backup => match self.slow.backup.as_mut() {
                Some(b) => b.cq.poller().take_error_mark(),
                None => return,
            },
        };
        // The fence is the last WQE on the backup SQ: if this batch retired it, its completion
        // is the batch's last send completion, and it is the failover's, not the application's.
        let fence_at = match (path, self.slow.fence) {
            (Path::Backup, Some(end)) if self.backup_sq_completed() == end => wcs
                .iter()
                .rposition(|w| !is_recv(w) && w.wr_id == internal_wr_id()),
            _ => None,
        };
        for (k, wc) in wcs.iter().enumerate() {
            // A successful fence is the failover's own; a failed one is the backup QP's error
            // like any other (it may be the first: the fence can be alone on the backup SQ).
            if Some(k) == fence_at && wc.is_ok() {
                continue;
            }
            if wc.is_ok() {
                self.on_success(path, *wc);
            } else {
                self.on_error_wc(path, *wc, mark);
            }
        }
        if let Some(k) = fence_at {
            self.slow.fence = None;
            self.prune_burns();
            if wcs[k].is_ok() {
                self.enqueue(Event::FenceCompleted);
            }
        }
    }

    fn on_success(&mut self, path: Path, mut wc: WorkCompletion) {
        let recv = is_recv(&wc);
        match path {
            Path::Default => {
                if !recv && self.slow.probe.is_some() {
                    self.slow.probe = None;
                    self.enqueue(Event::ProbeCompleted { ok: true });
                    return;
                }
            }
            Path::Backup => {
                if recv && self.slow.backup_stale > 0 {
                    self.slow.backup_stale -= 1;
                    return;
                }
                if recv {
                    self.slow.recvs_on_backup += 1;
                }
                self.first_success();
            }
        }
        wc.qp_num = self.slow.default_qpn;
        self.slow.wcs.push_back(wc);
    }

    /// Forgets burn ranges the backup SQ has completed past.
    fn prune_burns(&mut self) {
        let Some(b) = self.slow.backup.as_mut() else {
            return;
        };
        let done = b.qp.send_queue().completed();
        let written = b.qp.send_queue().written();
        while let Some(&(_, end)) = self.slow.burns.front() {
            // `end` is at or before the consumer counter: every burn of the range completed.
            if done.wrapping_sub(end) <= written.wrapping_sub(end)
                && done.wrapping_sub(end) < (1 << 31)
            {
                self.slow.burns.pop_front();
            } else {
                break;
            }
        }
    }

    fn first_success(&mut self) {
        let Some(i) = self.slow.awaiting_success.take() else {
            return;
        };
        let now = self.slow.clock.now();
        let at = self.slow.clock.unix_ms(now);
        if let Some(event) = self.slow.log.get_mut(i) {
            let latency_ms = at - event.detected_unix_ms;
            event.first_success_unix_ms = Some(at);
            event.fallback_latency_us = Some(latency_ms * 1e3);
            self.slow.stats.last_fallback_latency = Some(std::time::Duration::from_secs_f64(
                (latency_ms / 1e3).max(0.0),
            ));
            tracing::info!(qp = %self.shared.name, fallback_latency_us = latency_ms * 1e3, "failover: first completion on the backup QP");
        }
    }

    /// An error completion from `path`'s CQ: note where its queue's unfinished WQEs begin
    /// (`mark`, the consumer counter before the batch's first error of that queue), and tell
    /// the machine if it is the QP's first.
    fn on_error_wc(&mut self, path: Path, wc: WorkCompletion, mark: ErrorMark) {
        let recv = is_recv(&wc);
        if path == Path::Default && !recv && self.slow.probe.is_some() {
            self.slow.probe = None;
            self.enqueue(Event::ProbeCompleted { ok: false });
            return;
        }
        if self.slow.machine.is_none() {
            // Unprotected: a plain QP's error, as it is.
            let mut wc = wc;
            wc.qp_num = self.slow.default_qpn;
            self.slow.wcs.push_back(wc);
            return;
        }
        let e = &mut self.slow.errored[path_index(path)];
        match (recv, mark.recv, mark.send) {
            (true, Some(at), _) => {
                e.recv_start.get_or_insert(at);
            }
            (false, _, Some(at)) => {
                e.send_start.get_or_insert(at);
            }
            _ => {}
        }
        if wc.status != WcStatus::WrFlushErr && e.first_error.is_none() {
            e.first_error = Some(wc.status);
            e.error_wc = Some(wc);
        }
        if !e.reported {
            e.reported = true;
            tracing::debug!(qp = %self.shared.name, ?path, status = ?wc.status, wr_id = wc.wr_id, "failover: first error completion");
            self.enqueue(Event::ErrorCompletion {
                path,
                status: wc.status,
            });
        }
    }

    fn backup_sq_completed(&mut self) -> u32 {
        self.slow
            .backup
            .as_mut()
            .map_or(0, |b| b.qp.send_queue().completed())
    }

    /// The drain of the default QP ends when every WQE and receive the device was told about
    /// has completed (successfully or flushed).
    fn check_drain(&mut self) -> bool {
        if !self.slow.draining {
            return false;
        }
        let sq = self.default.send_queue();
        let (sq_done, sq_published) = (sq.completed(), sq.published());
        let rq = self.default.recv_queue();
        let (rq_done, rq_published) = (rq.completed(), rq.published());
        if sq_done != sq_published || rq_done != rq_published {
            return false;
        }
        self.slow.draining = false;
        let e = self.slow.errored[0];
        let send_start = e.send_start.unwrap_or(sq_done);
        let recv_start = e.recv_start.unwrap_or(rq_done);
        self.slow.moving = Some((send_start, recv_start));
        let probe = self.slow.probe;
        let atomic_in_flight = self.default.send_queue().written_from(send_start).any(|w| {
            w.published
                && matches!(w.info.opcode, SendOpcode::AtomicCs | SendOpcode::AtomicFa)
                && Some(w.counter) != probe
        });
        let progress = self.progress_now();
        tracing::debug!(qp = %self.shared.name, ?progress, send_start, recv_start, "failover: default QP drained");
        self.enqueue(Event::DefaultDrained {
            progress,
            first_error: e.first_error,
            atomic_in_flight,
        });
        true
    }

    // ---- actions ----------------------------------------------------------------------------

    fn move_to_err(&mut self, path: Path) {
        let handle = match path {
            Path::Default => self.default.handle(),
            Path::Backup => match &self.slow.backup {
                Some(b) => b.qp.handle(),
                None => return,
            },
        };
        if let Err(e) = handle.set_error() {
            tracing::debug!(qp = %self.shared.name, ?path, error = %e, "failover: QP not moved to ERR");
        }
    }

    /// The receive WQEs of the default RQ from where the drain found them, in order, to the
    /// backup RQ behind whatever is posted there, lkeys rewritten.
    fn copy_recvs_to_backup(&mut self) {
        let start = self
            .slow
            .moving
            .map_or_else(|| self.default.recv_queue().completed(), |(_, r)| r);
        let mut list = std::mem::take(&mut self.slow.recv_list);
        list.clear();
        list.extend(self.default.recv_queue().written_from(start));
        let stride = self.default.recv_queue().stride();
        let mut bytes = std::mem::take(&mut self.slow.wqe_bytes);
        bytes.resize(stride, 0);
        let mut moved = 0u64;
        let mut failure = None;
        for &(at, wr_id) in &list {
            self.default.recv_queue().copy_wqe(at, &mut bytes);
            let keys = self.slow.shadow.as_ref().map(|s| &s.pd.keys);
            if let Err(key) = rewrite_recv_keys(&mut bytes, |k| keys.and_then(|m| m.backup_lkey(k)))
            {
                failure = Some((WcStatus::LocProtErr, format!("no backup lkey for {key:#x}")));
                break;
            }
            let b = self.slow.backup.as_mut().expect("protected");
            if let Err(e) = b.qp.recv_queue().write_raw(&bytes, wr_id) {
                failure = Some((WcStatus::LocQpOpErr, e.to_string()));
                break;
            }
            moved += 1;
        }
        if let Some(b) = self.slow.backup.as_mut() {
            b.qp.recv_queue().publish();
        }
        self.slow.wqe_bytes = bytes;
        self.slow.recv_list = list;
        self.slow.stats.wqes_copied += moved;
        self.slow.pending_recvs_copied += moved;
        if let Some((status, why)) = failure {
            self.cannot_copy(status, &why);
        }
    }

    /// A WQE could not be moved (no backup key, no room): the backup QP cannot carry this
    /// connection, which the machine treats as a local error of the backup QP.
    fn cannot_copy(&mut self, status: WcStatus, why: &str) {
        tracing::error!(qp = %self.shared.name, why, "failover: a WQE cannot be moved to the backup QP");
        self.slow.errored[1].reported = true;
        self.enqueue(Event::ErrorCompletion {
            path: Path::Backup,
            status,
        });
    }

    /// Moves the default SQ's outstanding WQEs to the backup SQ: the ones the peer consumed
    /// complete (signaled ones with success; READs go again, since their responses may not
    /// have arrived), then `burn` zero-length SENDs, then the rest, keys, WQE index and QPN
    /// rewritten; rings the backup doorbell.
    fn copy_sends_to_backup(&mut self, burn: u64, skip_through: u64, now: Timestamp) {
        let start = self
            .slow
            .moving
            .map_or_else(|| self.default.send_queue().completed(), |(s, _)| s);
        let probe = self.slow.probe;
        let mut list = std::mem::take(&mut self.slow.wqe_list);
        list.clear();
        list.extend(
            self.default
                .send_queue()
                .written_from(start)
                .filter(|w| Some(w.counter) != probe),
        );
        // Two-sided ordinals: the WQEs on the default ring are the last ones posted.
        let on_default = list
            .iter()
            .filter(|w| two_sided_opcode(w.info.opcode))
            .count() as u64;
        let mut ordinal = self.sends_posted - on_default;
        let mut skip = 0;
        for (i, w) in list.iter().enumerate() {
            if two_sided_opcode(w.info.opcode) {
                ordinal += 1;
                if ordinal <= skip_through {
                    skip = i + 1;
                }
            }
        }
        // 1. Consumed by the peer: complete, do not send again.
        let mut skipped = 0u64;
        let mut again: Vec<usize> = Vec::new();
        for (i, w) in list[..skip].iter().enumerate() {
            if w.info.opcode == SendOpcode::RdmaRead {
                again.push(i);
                continue;
            }
            skipped += 1;
            if w.info.signaled {
                self.slow.wcs.push_back(WorkCompletion {
                    wr_id: w.wr_id,
                    status: WcStatus::Success,
                    opcode: send_wc_opcode(u8::from(w.info.opcode)),
                    byte_len: 0,
                    imm: None,
                    qp_num: self.slow.default_qpn,
                    vendor_err: 0,
                });
            }
        }
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
            self.slow.burns.push_back((from, to));
        }
        // 3. READs the peer executed but whose responses may be lost, then the rest.
        let mut copied = 0u64;
        let order: Vec<usize> = again.into_iter().chain(skip..list.len()).collect();
        let mut bytes = std::mem::take(&mut self.slow.wqe_bytes);
        for i in order {
            if failure.is_some() {
                break;
            }
            let w = list[i];
            bytes.resize(usize::from(w.info.bbs.max(1)) * SEND_WQE_BB, 0);
            let len = self.default.send_queue().copy_wqe(w.counter, &mut bytes);
            // The peer's rkey, mapped first (a lookup may ask the store); a WRITE without data
            // names no memory and needs no mapping.
            let rkey = match wqe_rkey(&bytes[..len]) {
                Some((rkey, true)) => match self.backup_rkey(rkey) {
                    Some(b) => Some(b),
                    None => {
                        failure = Some((
                            WcStatus::LocProtErr,
                            format!("no backup rkey for {rkey:#x}"),
                        ));
                        break;
                    }
                },
                Some((rkey, false)) => Some(rkey),
                None => None,
            };
            let keys = self.slow.shadow.clone();
            let mut lkey_missing = None;
            let rewritten = rewrite_keys(
                &mut bytes[..len],
                |k| match keys.as_ref().and_then(|s| s.pd.keys.backup_lkey(k)) {
                    Some(b) => b,
                    None => {
                        lkey_missing.get_or_insert(k);
                        k
                    }
                },
                |k| rkey.unwrap_or(k),
            );
            if rewritten.is_none() {
                failure = Some((
                    WcStatus::LocQpOpErr,
                    format!(
                        "WQE at {:#x} has an opcode the driver does not post",
                        w.counter
                    ),
                ));
                break;
            }
            if let Some(k) = lkey_missing {
                failure = Some((WcStatus::LocProtErr, format!("no backup lkey for {k:#x}")));
                break;
            }
            let b = self.slow.backup.as_mut().expect("protected");
            if let Err(e) = b.qp.send_queue().post_raw(&bytes[..len], w.wr_id) {
                failure = Some((WcStatus::LocQpOpErr, e.to_string()));
                break;
            }
            copied += 1;
        }
        if let Some(b) = self.slow.backup.as_mut() {
            b.qp.ring_doorbell();
        }
        self.slow.wqe_bytes = bytes;
        self.slow.wqe_list = list;
        self.round_finished(now, copied, skipped);
        if let Some((status, why)) = failure {
            self.cannot_copy(status, &why);
        }
    }

    fn round_finished(&mut self, now: Timestamp, retransmitted: u64, skipped: u64) {
        let s = &mut *self.slow;
        let recvs = std::mem::take(&mut s.pending_recvs_copied);
        s.stats.failovers += 1;
        s.stats.wqes_retransmitted += retransmitted;
        s.stats.wqes_skipped += skipped;
        s.stats.wqes_copied += retransmitted;
        let round = s.round.take().unwrap_or(RoundRecord {
            detected: now,
            cause: Cause::Flushed,
            epoch: s.machine.as_ref().map_or(0, |m| m.epoch().0),
        });
        let elapsed = now.saturating_since(round.detected);
        tracing::info!(
            qp = %self.shared.name,
            device = %s.default_device,
            cause = round.cause.as_str(),
            epoch = round.epoch,
            wqes_copied = retransmitted + recvs,
            wqes_retransmitted = retransmitted,
            wqes_skipped = skipped,
            elapsed_us = elapsed.as_secs_f64() * 1e6,
            "failover: traffic moved to the backup QP"
        );
        let event = FailoverEvent {
            kind: EventKind::Failover,
            cause: round.cause,
            device: s.default_device.clone(),
            unix_ms: s.clock.unix_ms(now),
            detected_unix_ms: s.clock.unix_ms(round.detected),
            first_success_unix_ms: None,
            fallback_latency_us: None,
            wqes_copied: retransmitted + recvs,
            wqes_retransmitted: retransmitted,
            wqes_skipped: skipped,
            epoch: round.epoch,
        };
        self.slow.awaiting_success = self.log(event);
    }

    fn switched_back(&mut self, now: Timestamp) {
        let s = &mut *self.slow;
        s.stats.switch_backs += 1;
        let started = s.switch_started.take().unwrap_or(now);
        let epoch = s.machine.as_ref().map_or(0, |m| m.epoch().0);
        tracing::info!(
            qp = %self.shared.name,
            device = %s.default_device,
            epoch,
            elapsed_us = now.saturating_since(started).as_secs_f64() * 1e6,
            "failover: sends back on the default QP"
        );
        let event = FailoverEvent {
            kind: EventKind::SwitchBack,
            cause: Cause::PathRecovered,
            device: s.default_device.clone(),
            unix_ms: s.clock.unix_ms(now),
            detected_unix_ms: s.clock.unix_ms(started),
            first_success_unix_ms: None,
            fallback_latency_us: None,
            wqes_copied: 0,
            wqes_retransmitted: 0,
            wqes_skipped: 0,
            epoch,
        };
        self.log(event);
    }

    /// Appends to the event log; returns the entry's index, or `None` when the log is full.
    fn log(&mut self, event: FailoverEvent) -> Option<usize> {
        if self.slow.log.len() >= EVENT_LOG_CAPACITY {
            self.slow.stats.events_dropped += 1;
            return None;
        }
        self.slow.log.push(event);
        Some(self.slow.log.len() - 1)
    }

    fn reset_default(&mut self) {
        let rq = self.default.recv_queue().completed();
        let done = self.slow.errored[0].recv_start.unwrap_or(rq);
        self.slow.recvs_before_reset += u64::from(done);
        if let Err(e) = self.default.modify(QpState::Reset, &QpAttr::default()) {
            tracing::warn!(qp = %self.shared.name, error = %e, "failover: default QP not reset");
        }
        self.default_cq.discard_qp(self.slow.default_qpn);
        self.slow.errored[0] = Errored::default();
        self.slow.probe = None;
        self.slow.moving = None;
        self.slow.draining = false;
    }

    /// RESET -> INIT -> RTR -> RTS with the application's attributes and the PSNs of `epoch`.
    fn bring_up_default(&mut self, epoch: Epoch) -> Result<(), crate::control::ModifyError> {
        let base = &self.slow.base;
        let qpn = self.slow.default_qpn;
        let missing = |state| crate::control::ModifyError::NotSaved { qpn, state };
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

    fn post_probe(&mut self) {
        let wr = empty_write();
        let at = self.default.send_queue().written();
        match self.default.post_send(&wr) {
            Ok(_) => {
                self.default.ring_doorbell();
                self.slow.probe = Some(at);
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
    fn maybe_fence(&mut self) {
        let Some(machine) = &self.slow.machine else {
            return;
        };
        if !machine.reports_signaled_posts() || self.slow.fence.is_some() {
            return;
        }
        let wr = empty_write();
        let b = self.slow.backup.as_mut().expect("protected");
        match b.qp.post_send(&wr) {
            Ok(_) => {
                b.qp.ring_doorbell();
                self.slow.fence = Some(b.qp.send_queue().written());
                let progress = self.progress_now();
                self.enqueue(Event::SignaledPosted { progress });
            }
            Err(e) => {
                tracing::warn!(qp = %self.shared.name, error = %e, "failover: switch-back fence not posted; retrying later");
            }
        }
    }

    /// Receiver side of a switch-back: the backup RQ's application receives (behind any
    /// stale ones) to the default RQ, lkeys rewritten; they become stale on the backup RQ.
    fn move_recvs_to_default(&mut self, consumed_through: u64) {
        debug_assert_eq!(self.recvs_completed(), consumed_through);
        let stale = self.slow.backup_stale;
        let mut list = std::mem::take(&mut self.slow.recv_list);
        list.clear();
        let b = self.slow.backup.as_mut().expect("protected");
        list.extend(b.qp.recv_queue().outstanding().skip(stale as usize));
        let stride = b.qp.recv_queue().stride();
        let mut bytes = std::mem::take(&mut self.slow.wqe_bytes);
        bytes.resize(stride, 0);
        let mut moved = 0u64;
        let mut failure = None;
        for &(at, wr_id) in &list {
            let b = self.slow.backup.as_mut().expect("protected");
            b.qp.recv_queue().copy_wqe(at, &mut bytes);
            let keys = self.slow.shadow.as_ref().map(|s| &s.pd.keys);
            if let Err(key) =
                rewrite_recv_keys(&mut bytes, |k| keys.and_then(|m| m.default_lkey(k)))
            {
                failure = Some(format!("no default lkey for backup lkey {key:#x}"));
                break;
            }
            if let Err(e) = self.default.recv_queue().write_raw(&bytes, wr_id) {
                failure = Some(e.to_string());
                break;
            }
            moved += 1;
        }
        self.default.recv_queue().publish();
        self.slow.backup_stale += moved;
        self.slow.stats.wqes_copied += moved;
        self.slow.wqe_bytes = bytes;
        self.slow.recv_list = list;
        tracing::info!(qp = %self.shared.name, moved, stale = self.slow.backup_stale, "failover: receives back on the default QP");
        if let Some(why) = failure {
            // The default QP is live: a receive that cannot go back fails the connection
            // the way a local error of the default QP would.
            tracing::error!(qp = %self.shared.name, why, "failover: a receive cannot be moved back");
            self.enqueue(Event::ErrorCompletion {
                path: Path::Default,
                status: WcStatus::LocQpOpErr,
            });
        }
    }

    /// The connection failed: both QPs to ERR, the successes still in the CQs to the
    /// application, then every outstanding WR completes in error (the first with `status`,
    /// or the refusing completion itself), as a plain RC QP in ERR fails.
    fn surface(&mut self, status: WcStatus, reason: FailReason, now: Timestamp) {
        self.move_to_err(Path::Default);
        self.move_to_err(Path::Backup);
        self.collect(Path::Backup);
        self.collect(Path::Default);
        self.slow.failed = Some(reason);
        self.slow.draining = false;
        let refusing = match reason {
            FailReason::Refused { .. } => self.slow.errored[0]
                .error_wc
                .filter(|wc| wc.status == status)
                .map(|wc| (Path::Default, wc))
                .or_else(|| {
                    self.slow.errored[1]
                        .error_wc
                        .filter(|wc| wc.status == status)
                        .map(|wc| (Path::Backup, wc))
                }),
            _ => None,
        };
        let mut errors: Vec<WorkCompletion> = Vec::new();
        let qpn = self.slow.default_qpn;
        let flush = |wr_id, opcode| WorkCompletion {
            wr_id,
            status: WcStatus::WrFlushErr,
            opcode,
            byte_len: 0,
            imm: None,
            qp_num: qpn,
            vendor_err: 0,
        };
        // Sends, oldest first: whatever is on the backup SQ was posted before what is on
        // the default SQ (the default ring holds only withheld WRs while the backup is used).
        for path in [Path::Backup, Path::Default] {
            let skip_first = refusing.is_some_and(|(p, wc)| p == path && !is_recv(&wc));
            let start = self.slow.errored[path_index(path)].send_start;
            let burns = self.slow.burns.clone();
            let (fence, probe) = (self.slow.fence, self.slow.probe);
            let sq = match path {
                Path::Default => self.default.send_queue(),
                Path::Backup => match self.slow.backup.as_mut() {
                    Some(b) => b.qp.send_queue(),
                    None => continue,
                },
            };
            let start = start.unwrap_or(sq.completed());
            let mut first = true;
            for w in sq.written_from(start) {
                let internal = w.wr_id == internal_wr_id()
                    && (burns.iter().any(|(s, e)| in_range(w.counter, *s, *e))
                        || fence
                            .is_some_and(|f| w.counter.wrapping_add(u32::from(w.info.bbs)) == f)
                        || probe == Some(w.counter));
                if internal {
                    continue;
                }
                if std::mem::take(&mut first) && skip_first {
                    continue;
                }
                errors.push(flush(w.wr_id, send_wc_opcode(u8::from(w.info.opcode))));
            }
        }
        for path in [Path::Backup, Path::Default] {
            let skip_first = refusing.is_some_and(|(p, wc)| p == path && is_recv(&wc));
            let start = self.slow.errored[path_index(path)].recv_start;
            let stale = if path == Path::Backup {
                self.slow.backup_stale as usize
            } else {
                0
            };
            let rq = match path {
                Path::Default => self.default.recv_queue(),
                Path::Backup => match self.slow.backup.as_mut() {
                    Some(b) => b.qp.recv_queue(),
                    None => continue,
                },
            };
            let start = start.unwrap_or(rq.completed());
            let skip = stale + usize::from(skip_first);
            for (_, wr_id) in rq.written_from(start).skip(skip) {
                errors.push(flush(wr_id, WcOpcode::Recv));
            }
        }
        match refusing {
            Some((_, mut wc)) => {
                wc.qp_num = qpn;
                self.slow.wcs.push_back(wc);
            }
            None => {
                if let Some(first) = errors.first_mut() {
                    first.status = status;
                }
            }
        }
        self.slow.wcs.extend(errors);
        self.slow.fence = None;
        self.slow.probe = None;
        // The event log.
        let refused = matches!(
            reason,
            FailReason::Refused { .. } | FailReason::AtomicInFlight
        );
        let s = &mut *self.slow;
        if refused {
            s.stats.refusals += 1;
        } else {
            s.stats.errors += 1;
        }
        let cause = Cause::of_failure(reason);
        let detected = s.round.take().map_or(now, |r| r.detected);
        tracing::warn!(qp = %self.shared.name, device = %s.default_device, cause = cause.as_str(), %reason, "failover: connection failed; errors go to the application");
        let event = FailoverEvent {
            kind: if refused {
                EventKind::Refused
            } else {
                EventKind::Error
            },
            cause,
            device: s.default_device.clone(),
            unix_ms: s.clock.unix_ms(now),
            detected_unix_ms: s.clock.unix_ms(detected),
            first_success_unix_ms: None,
            fallback_latency_us: None,
            wqes_copied: 0,
            wqes_retransmitted: 0,
            wqes_skipped: 0,
            epoch: s.machine.as_ref().map_or(0, |m| m.epoch().0),
        };
        self.log(event);
    }
}

/// The failover's own signaled zero-length RDMA WRITE (probes, fences): it names no memory,
/// so rkey 0 does.
fn empty_write() -> SendWr<'static> {
    let remote = Remote { addr: 0, rkey: 0 };
    SendWr::new(internal_wr_id(), SendOp::Write { remote }, &[]).signaled()
}

/// Whether counter `c` lies in `[start, end)` (wrapping).
fn in_range(c: u32, start: u32, end: u32) -> bool {
    c.wrapping_sub(start) < end.wrapping_sub(start)
}

/// Rewrites the lkeys of a receive WQE's data segments (up to the terminator) through `map`;
/// the first lkey without a mapping is the error.
fn rewrite_recv_keys(bytes: &mut [u8], map: impl Fn(u32) -> Option<u32>) -> Result<(), u32> {
    for seg in bytes.chunks_exact_mut(hw_defs::mlx5::data_seg::SIZE) {
        let mut seg = DataSeg::new_unchecked(seg);
        if seg.is_terminator() {
            break;
        }
        if seg.byte_count() == 0 {
            continue;
        }
        let k = seg.lkey();
        seg.set_lkey(map(k).ok_or(k)?);
    }
    Ok(())
}

/// The rkey of a raw send WQE that has a remote-address segment, and whether the WQE names
/// remote memory (it carries data, or is an atomic): a zero-length WRITE does not.
fn wqe_rkey(wqe: &[u8]) -> Option<(u32, bool)> {
    use hw_defs::mlx5::{ctrl_seg, raddr_seg, wqe, CtrlSeg, RaddrSeg};
    let ctrl = CtrlSeg::new_checked(wqe).ok()?;
    let opcode = ctrl.opcode();
    if !opcode.has_raddr_seg() {
        return None;
    }
    // The remote-address segment follows the control segment.
    let raddr = wqe.get(ctrl_seg::SIZE..ctrl_seg::SIZE + raddr_seg::SIZE)?;
    let raddr = RaddrSeg::new_checked(raddr).ok()?;
    let names_memory = opcode.has_atomic_seg() || usize::from(ctrl.ds()) > wqe::header_ds(opcode);
    Some((raddr.rkey(), names_memory))
}
