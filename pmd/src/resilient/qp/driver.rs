//! The event loop of a resilient QP: it gathers the failover machine's events, hands them to
//! it and has its actions performed ([`super::perform`]), on the thread that owns the QP (the
//! application's lcore, or the service lcore for an adopted QP). Every action runs here, in
//! the order given, including the control verbs (moving a QP to ERR, bringing it up): the
//! datapath is stalled by the failover anyway, and doing them in place keeps their order with
//! the ring work around them (`docs/failover.md`, the pmd side).
//!
//! One loop: `run` gathers events from their sources (mail, timers, the two CQs, the end of a
//! drain) into one queue, and `process_events` is the only place that hands them to the
//! machine. Everything that produces an event, a source or an action, only queues it
//! (`enqueue`): an action never calls the machine, so no call of the machine is nested in
//! another, and handling an event allocates nothing. Completions polled here go to the
//! application's WC buffer in order; the failover's own are swallowed.

use hw_defs::mlx5::SendOpcode;

use crate::datapath::cq::ErrorMark;
use crate::datapath::wr::{WcStatus, WorkCompletion};
use crate::failover::{
    DefaultQpPhase, Event, Failover, Observation, Path, Progress, Role, RoundTrigger, SendPhase,
    SideEpoch, Timestamp,
};
use crate::qp_state::QpState;
use crate::verbs::QpAttr;

use super::work::{internal_wr_id, is_recv, two_sided_opcode};
use super::{Backup, ResilientQp};
use crate::failover::plan::sends_before_first_read;
use crate::resilient::service::mailbox::{BackupParts, Mail};
use crate::resilient::stats::Cause;

/// Rounds of mail, timers and polling one `run` does at most before it returns (each round
/// that finds nothing ends it sooner).
const MAX_ROUNDS: usize = 64;

/// Where `run` gathers events from, in the order one round visits them.
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
            Source::Drain => self.check_drain() | self.check_failback_drain(),
        }
    }

    fn publish(&self) {
        let s = &self.slow;
        let deadline = if s.failed.is_some() {
            None
        } else {
            let machine = s.machine.as_ref().and_then(|m| m.poll_timeout());
            let drain = s
                .book
                .drain_deadline
                .filter(|_| s.book.draining || s.book.failback_draining);
            match (machine, drain) {
                (Some(m), Some(d)) => Some(m.min(d)),
                (m, d) => m.or(d),
            }
        };
        let armed = s.failed.is_none()
            && s.machine.as_ref().is_some_and(|m| {
                matches!(
                    m.default_qp_phase(),
                    DefaultQpPhase::Live | DefaultQpPhase::Unconfirmed
                ) && !matches!(
                    m.send_phase(),
                    SendPhase::FailingOver | SendPhase::FailingBack
                )
            });
        let b = &s.book;
        // A probe on a dead default device is never answered (the link-down that follows
        // abandons the attempt): nothing waits for it. It stays in the book, so a completion
        // the device wrote before it died is still swallowed.
        let probe_pending = b.probe.is_some() && !b.default_dead;
        let busy = s.failed.is_none()
            && (b.draining
                || b.failback_draining
                || b.fence.is_some()
                || probe_pending
                || !s.events.is_empty());
        self.shared.publish(deadline, armed, busy);
    }

    /// Application receives completed successfully, on either QP, since the connection began.
    pub(super) fn recvs_completed(&mut self) -> u64 {
        let rq = self.default.recv_queue().completed();
        self.slow.book.recvs_completed(rq)
    }

    /// The counters the machine reads.
    pub(super) fn progress_now(&mut self) -> Progress {
        let mut outstanding = 0u64;
        let start = self.slow.book.errored[0]
            .send_start
            .unwrap_or_else(|| self.default.send_queue().completed());
        outstanding += self
            .default
            .send_queue()
            .written_from(start)
            .filter(|w| two_sided_opcode(w.info.opcode))
            .count() as u64;
        if let Some(b) = &mut self.slow.backup {
            let book = &self.slow.book;
            outstanding +=
                b.qp.send_queue()
                    .outstanding()
                    .filter(|w| two_sided_opcode(w.info.opcode) && !book.is_burn(w.counter))
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
        let mut mail = std::mem::take(&mut self.slow.scratch.mail);
        self.shared.take(&mut mail);
        let any = !mail.is_empty();
        while let Some(m) = mail.pop_front() {
            match m {
                Mail::Event(Event::LinkUp {
                    path: Path::Default,
                }) if self.slow.book.default_dead => {
                    // A device that raised its device-fatal event never comes back: a netdev
                    // that comes up again (a device reset flaps it) is not a path.
                    tracing::warn!(qp = %self.shared.name, "failover: the dead default device's link came up; it stays down for failover");
                }
                Mail::Event(e) => {
                    tracing::debug!(qp = %self.shared.name, event = ?e, "failover: mail");
                    self.enqueue(e)
                }
                Mail::Protected(parts) => self.install(*parts),
                Mail::SetupFailed(e) => self.slow.setup_error = Some(e),
                Mail::DeviceDead(path) => {
                    tracing::warn!(qp = %self.shared.name, ?path, "failover: the device is dead (device-fatal event)");
                    if path == Path::Default {
                        self.slow.book.default_dead = true;
                    }
                }
            }
        }
        self.slow.scratch.mail = mail;
        any
    }

    /// The backup side is ready: arm failover.
    fn install(&mut self, mut parts: BackupParts) {
        if self.slow.book.errored[0].reported
            || self.default.state() != QpState::Rts
            || self.slow.failed.is_some()
        {
            tracing::warn!(qp = %self.shared.name, state = %self.default.state(), "failover: the default QP failed before the backup side was ready; it stays unprotected");
            return;
        }
        // The application may have changed the QP after the shadow handed the backup side
        // over (an access-flag cut): the backup QP takes the access it has now.
        if let Some(shadow) = &self.slow.env.shadow {
            let latest = shadow.recorded();
            if latest.access() != parts.base.access() {
                let cut = QpAttr {
                    access: latest.access(),
                    ..QpAttr::default()
                };
                if let Err(e) = parts.qp.modify(QpState::Rts, &cut) {
                    tracing::error!(qp = %self.shared.name, error = %e, "failover: the backup QP refused the application's access change; the QP stays unprotected");
                    return;
                }
            }
            parts.base = latest;
        }
        let s = &mut *self.slow;
        let local = (
            s.env
                .default_ctx
                .query_gid(0)
                .map(|g| g.0)
                .unwrap_or_default(),
            s.env.default_qpn,
        );
        let peer = (parts.peer.default_gid.0, parts.peer.default_qpn);
        let role = if local < peer {
            Role::Leader
        } else {
            Role::Follower
        };
        let now = s.env.clock.now();
        let mut config = s.env.config.machine(role);
        // A backup link down waits no longer than this QP's own retries would.
        if let Some(rts) = &parts.base.rts {
            config.backup_wait = crate::failover::rc_retry_budget(
                rts.timeout.unwrap_or(14),
                rts.retry_cnt.unwrap_or(7),
            );
        }
        // The third channel, where both ends have an endpoint (5f).
        let management = match (parts.management.take(), &parts.peer.management) {
            (Some(link), Some(peer)) => {
                link.connect(peer, s.env.default_qpn, parts.peer.default_qpn);
                config.management = true;
                Some(link)
            }
            _ => None,
        };
        s.machine = Some(Failover::new(config, now));
        s.backup = Some(Backup {
            qp: parts.qp,
            cq: parts.cq,
            control: parts.control,
            default_control: parts.default_control,
            peer_rkeys: parts.peer.rkeys.iter().copied().collect(),
            rkeys_confirmed: Default::default(),
            peer: parts.peer,
            base: parts.base,
            management,
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
        let now = self.slow.env.clock.now();
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
            let now = self.slow.env.clock.now();
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
                // An action that waits (a control verb behind a busy device's lock) delays
                // every later one of the round: the debug log names it.
                let began = self.slow.env.clock.now();
                self.perform(action, now);
                let took = self.slow.env.clock.now().saturating_since(began);
                if took > std::time::Duration::from_millis(1) {
                    tracing::debug!(qp = %self.shared.name, ?action, took_us = took.as_micros() as u64, "failover: a slow action");
                }
            }
            self.maybe_fence();
        }
    }

    /// What the machine observed, into the log.
    fn observe(&mut self, observed: Observation, now: Timestamp) {
        let log = &mut self.slow.log;
        match observed {
            Observation::RoundStarted { epoch, trigger } => {
                let cause = match trigger {
                    RoundTrigger::ErrorCompletion(status) => Cause::of_status(status),
                    RoundTrigger::LinkDown if self.slow.book.default_dead => Cause::DeviceFatal,
                    RoundTrigger::LinkDown => Cause::LinkDown,
                    RoundTrigger::Peer => Cause::PeerFailover,
                };
                log.round_started(cause, now, epoch.0)
            }
            Observation::SwitchBackStarted { .. } => log.switch_started(now),
            Observation::SideRepaired {
                epoch: SideEpoch::Backup(epoch),
            } => log.backup_repaired(epoch.0),
            Observation::SideRepaired {
                epoch: SideEpoch::DefaultChannel(epoch),
            } => log.default_control_repaired(epoch.0),
            Observation::FailbackStarted { epoch } => log.failback_started(now, epoch.0),
            Observation::FailedBack { epoch } => log.failed_back(now, epoch.0),
        }
    }

    // ---- collecting completions --------------------------------------------------------------

    /// Polls `path`'s CQ into the WC buffer, queuing the events the machine needs to know.
    /// Returns whether anything was polled.
    pub(super) fn collect(&mut self, path: Path) -> bool {
        if self.slow.failed.is_some() {
            return false;
        }
        if path == Path::Backup && self.slow.backup.is_none() {
            return false;
        }
        let mut any = false;
        loop {
            let mut polled = self.slow.scratch.polled;
            let (n, backup_mark) = match path {
                Path::Default => (self.default_cq.poll(&mut polled), None),
                Path::Backup => {
                    let b = self.slow.backup.as_mut().expect("checked above");
                    let (n, mark) = b.cq.poll(&mut polled);
                    (n, Some(mark))
                }
            };
            if n == 0 {
                break;
            }
            any = true;
            if path == Path::Default && self.slow.book.moving.is_some() {
                // The drain ended (at its deadline, on a slow NIC): the round owns the
                // unfinished work from the counters it noted, and completes or moves each
                // WQE from there. A completion the NIC writes later would be a second one.
                self.default_cq.poller().take_error_mark();
                tracing::debug!(qp = %self.shared.name, n, "failover: completions after the drain discarded");
                continue;
            }
            self.take_batch(path, &polled[..n], backup_mark);
        }
        any
    }

    /// Takes one batch of completions polled from `path`'s CQ, in order: the application's
    /// into the WC buffer, the failover's own swallowed, events queued. `backup_mark` is the
    /// error mark a backup seat's poll gave with the batch (the default CQ's is taken here).
    pub(super) fn take_batch(
        &mut self,
        path: Path,
        wcs: &[WorkCompletion],
        backup_mark: Option<ErrorMark>,
    ) {
        let mark = match (path, backup_mark) {
            (Path::Default, _) => self.default_cq.poller().take_error_mark(),
            (Path::Backup, Some(mark)) if self.slow.backup.is_some() => mark,
            (Path::Backup, _) => return,
        };
        // The switch-back fence is recognised by what it is, wherever it sits in the batch: the
        // backup SQ's only signaled WQE with the internal wr_id (probes go on the default QP,
        // burns are unsignaled). Copies of withheld WRs may follow it on the backup SQ (the
        // default path failed again in WaitDrained), so one batch can retire the fence and
        // later signaled WQEs together: once the consumer counter has passed the fence, it
        // completed in this batch, and it is cleared whatever its status.
        let fence_retired = match (path, self.slow.book.fence) {
            (Path::Backup, Some(end)) => self.backup_sq_retired_through(end),
            _ => false,
        };
        let mut fence_ok = None;
        for wc in wcs {
            if fence_retired && fence_ok.is_none() && !is_recv(wc) && wc.wr_id == internal_wr_id() {
                fence_ok = Some(wc.is_ok());
                // A successful fence is the failover's own; a failed one is the backup QP's
                // error like any other (it may be the first: the fence can be alone there).
                if wc.is_ok() {
                    continue;
                }
            }
            if wc.is_ok() {
                self.on_success(path, *wc);
            } else {
                self.on_error_wc(path, *wc, mark);
            }
        }
        if fence_retired && fence_ok == Some(false) {
            // The backup QP failed under the fence: the connection fails, and its error
            // completions must still leave the fence and the burns out (they are flushed
            // WQEs of the backup SQ now, not pruned).
            self.slow.book.failed_fence = self.slow.book.fence.take();
        } else if fence_retired {
            self.slow.book.fence = None;
            if let Some(b) = self.slow.backup.as_mut() {
                let sq = b.qp.send_queue();
                self.slow.book.prune_burns(sq.completed(), sq.written());
            }
            if fence_ok == Some(true) {
                self.enqueue(Event::FenceCompleted);
            }
        }
    }

    fn on_success(&mut self, path: Path, mut wc: WorkCompletion) {
        let recv = is_recv(&wc);
        let book = &mut self.slow.book;
        match path {
            Path::Default => {
                if !recv && book.probe.is_some() {
                    book.probe = None;
                    self.enqueue(Event::ProbeCompleted { ok: true });
                    return;
                }
            }
            Path::Backup => {
                if recv && book.backup_stale > 0 {
                    book.backup_stale -= 1;
                    return;
                }
                if recv {
                    book.recvs_on_backup += 1;
                }
                self.slow.log.first_success();
            }
        }
        wc.qp_num = self.slow.env.default_qpn;
        self.slow.wcs.push_back(wc);
    }

    /// An error completion from `path`'s CQ: note where its queue's unfinished WQEs begin
    /// (`mark`, the consumer counter before the batch's first error of that queue), and tell
    /// the machine if it is the QP's first.
    fn on_error_wc(&mut self, path: Path, wc: WorkCompletion, mark: ErrorMark) {
        let recv = is_recv(&wc);
        if path == Path::Default && !recv && self.slow.book.probe.is_some() {
            self.slow.book.probe = None;
            self.enqueue(Event::ProbeCompleted { ok: false });
            return;
        }
        if self.slow.machine.is_none() {
            // Unprotected: a plain QP's error, as it is.
            let mut wc = wc;
            wc.qp_num = self.slow.env.default_qpn;
            self.slow.wcs.push_back(wc);
            return;
        }
        let e = self.slow.book.errored_mut(path);
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

    /// Whether the backup SQ's consumer counter is at or past `end` (a producer counter of
    /// that SQ, at most the written one): everything before `end` has completed.
    fn backup_sq_retired_through(&mut self, end: u32) -> bool {
        self.slow.backup.as_mut().is_some_and(|b| {
            let sq = b.qp.send_queue();
            let written = sq.written();
            written.wrapping_sub(sq.completed()) <= written.wrapping_sub(end)
        })
    }

    /// The drain of the default QP ends when every WQE and receive the device was told about
    /// has completed (successfully or flushed).
    pub(super) fn check_drain(&mut self) -> bool {
        if !self.slow.book.draining {
            return false;
        }
        let sq = self.default.send_queue();
        let (sq_done, sq_published) = (sq.completed(), sq.published());
        let rq = self.default.recv_queue();
        let (rq_done, rq_published) = (rq.completed(), rq.published());
        let now = self.slow.env.clock.now();
        let watch = &mut self.slow.book.drain_watch;
        watch.checks += 1;
        let shortfall = (
            sq_published.wrapping_sub(sq_done),
            rq_published.wrapping_sub(rq_done),
        );
        if shortfall != watch.shortfall {
            watch.shortfall = shortfall;
            tracing::debug!(
                qp = %self.shared.name,
                sends_short = shortfall.0,
                recvs_short = shortfall.1,
                after_us = now.saturating_since(watch.started).as_micros() as u64,
                checks = watch.checks,
                "failover: the drain's completions short"
            );
        }
        if sq_done != sq_published || rq_done != rq_published {
            // A device that died writes no flush: past the deadline (at once when it said it
            // is dead) the WQEs without a completion are unknown, and the round goes on from
            // the peer's counters, which say what of them executed (docs/failover.md 3.7).
            let book = &self.slow.book;
            if !book.default_dead && book.drain_deadline.is_none_or(|d| now < d) {
                return false;
            }
            tracing::warn!(
                qp = %self.shared.name,
                device_dead = book.default_dead,
                sends_unflushed = sq_published.wrapping_sub(sq_done),
                recvs_unflushed = rq_published.wrapping_sub(rq_done),
                "failover: the default QP's flushes did not come; its unfinished WQEs are unknown"
            );
        }
        let book = &mut self.slow.book;
        book.draining = false;
        let e = book.errored[0];
        let send_start = e.send_start.unwrap_or(sq_done);
        let recv_start = e.recv_start.unwrap_or(rq_done);
        book.moving = Some((send_start, recv_start));
        let probe = book.probe;
        let mut list = std::mem::take(&mut self.slow.scratch.wqe_list);
        list.clear();
        list.extend(
            self.default
                .send_queue()
                .written_from(send_start)
                .filter(|w| Some(w.counter) != probe),
        );
        let atomic_in_flight = list.iter().any(|w| {
            w.published && matches!(w.info.opcode, SendOpcode::AtomicCs | SendOpcode::AtomicFa)
        });
        let sends_before_first_read = sends_before_first_read(&list, self.sends_posted);
        self.slow.scratch.wqe_list = list;
        let progress = self.progress_now();
        let watch = &self.slow.book.drain_watch;
        tracing::debug!(
            qp = %self.shared.name,
            ?progress,
            send_start,
            recv_start,
            after_us = now.saturating_since(watch.started).as_micros() as u64,
            checks = watch.checks,
            "failover: default QP drained"
        );
        self.enqueue(Event::DefaultDrained {
            progress,
            first_error: e.first_error,
            atomic_in_flight,
            sends_before_first_read,
        });
        true
    }
}
