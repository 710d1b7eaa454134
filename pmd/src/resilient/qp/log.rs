//! The failover log of one resilient QP: its counters ([`FailoverStats`]), its event log
//! ([`FailoverEvent`]s, what the apps put in their JSON) and the round in progress, with the
//! `tracing` line of each event. The driver tells it what happened; it keeps the books.

use crate::failover::{FailReason, Timestamp};

use crate::resilient::clock::Clock;
use crate::resilient::stats::{Cause, EventKind, FailoverEvent, FailoverStats, EVENT_LOG_CAPACITY};

/// The round in progress.
#[derive(Debug, Clone, Copy)]
struct RoundRecord {
    detected: Timestamp,
    cause: Cause,
    epoch: u32,
}

/// Counters, the event log and the round in progress of one resilient QP.
#[derive(Debug)]
pub(super) struct FailoverLog {
    /// Counters since the QP was created.
    pub stats: FailoverStats,
    /// Failovers, switch-backs, refusals, errors, oldest first (at most
    /// [`EVENT_LOG_CAPACITY`]).
    pub events: Vec<FailoverEvent>,
    round: Option<RoundRecord>,
    /// The entry waiting for its first successful completion on the backup QP.
    awaiting_success: Option<usize>,
    /// When the send queue started switching back.
    switch_started: Option<Timestamp>,
    /// When the failback in progress started.
    failback_started: Option<Timestamp>,
    /// What the failback in progress moved: sends re-posted, sends skipped, receives.
    failback_moved: (u64, u64, u64),
    /// Receives moved by the round in progress, for its entry.
    round_recvs_copied: u64,
    clock: Clock,
    /// The default device: the one that fails and comes back.
    device: String,
    /// The QP, for `tracing`.
    qp: String,
}

impl FailoverLog {
    /// An empty log for QP `qp` on default device `device`, stamped from `clock`.
    pub fn new(clock: Clock, device: String, qp: String) -> FailoverLog {
        FailoverLog {
            stats: FailoverStats::default(),
            events: Vec::new(),
            round: None,
            awaiting_success: None,
            switch_started: None,
            failback_started: None,
            failback_moved: (0, 0, 0),
            round_recvs_copied: 0,
            clock,
            device,
            qp,
        }
    }

    /// A failover round started at `now` in `epoch` because of `cause`.
    pub fn round_started(&mut self, cause: Cause, now: Timestamp, epoch: u32) {
        tracing::info!(qp = %self.qp, device = %self.device, cause = cause.as_str(), epoch, "failover: round started");
        self.round = Some(RoundRecord {
            detected: now,
            cause,
            epoch,
        });
    }

    /// The round moved `n` receives to the backup QP.
    pub fn recvs_copied(&mut self, n: u64) {
        self.stats.wqes_copied += n;
        self.round_recvs_copied += n;
    }

    /// A switch-back moved `n` receives to the default QP.
    pub fn recvs_moved_back(&mut self, n: u64) {
        self.stats.wqes_copied += n;
    }

    /// The round ended at `now` with `retransmitted` sends on the backup QP and `skipped`
    /// completed without being sent again; `epoch` is the machine's, for a round whose start
    /// was not recorded.
    pub fn round_finished(&mut self, now: Timestamp, retransmitted: u64, skipped: u64, epoch: u32) {
        let recvs = std::mem::take(&mut self.round_recvs_copied);
        self.stats.failovers += 1;
        self.stats.wqes_retransmitted += retransmitted;
        self.stats.wqes_skipped += skipped;
        self.stats.wqes_copied += retransmitted;
        let round = self.round.take().unwrap_or(RoundRecord {
            detected: now,
            cause: Cause::Flushed,
            epoch,
        });
        let elapsed = now.saturating_since(round.detected);
        tracing::info!(
            qp = %self.qp,
            device = %self.device,
            cause = round.cause.as_str(),
            epoch = round.epoch,
            wqes_copied = retransmitted + recvs,
            wqes_retransmitted = retransmitted,
            wqes_skipped = skipped,
            elapsed_us = elapsed.as_secs_f64() * 1e6,
            "failover: traffic moved to the backup QP"
        );
        let event = FailoverEvent {
            wqes_copied: retransmitted + recvs,
            wqes_retransmitted: retransmitted,
            wqes_skipped: skipped,
            ..self.event(
                EventKind::Failover,
                round.cause,
                now,
                round.detected,
                round.epoch,
            )
        };
        self.awaiting_success = self.push(event);
    }

    /// The first successful completion on the backup QP since the last round: the round's
    /// fallback latency.
    pub fn first_success(&mut self) {
        let Some(i) = self.awaiting_success.take() else {
            return;
        };
        let at = self.clock.unix_ms(self.clock.now());
        if let Some(event) = self.events.get_mut(i) {
            let latency_ms = at - event.detected_unix_ms;
            event.first_success_unix_ms = Some(at);
            event.fallback_latency_us = Some(latency_ms * 1e3);
            self.stats.last_fallback_latency = Some(std::time::Duration::from_secs_f64(
                (latency_ms / 1e3).max(0.0),
            ));
            tracing::info!(qp = %self.qp, fallback_latency_us = latency_ms * 1e3, "failover: first completion on the backup QP");
        }
    }

    /// The send queue started switching back at `now`.
    pub fn switch_started(&mut self, now: Timestamp) {
        self.switch_started = Some(now);
    }

    /// A failback round started at `now` in `epoch`: the backup failed with traffic on it.
    pub fn failback_started(&mut self, now: Timestamp, epoch: u32) {
        tracing::warn!(qp = %self.qp, device = %self.device, epoch, "failover: the backup failed with traffic on it; failing back");
        self.failback_started = Some(now);
        // A switch-back under way is replaced by the failback.
        self.switch_started = None;
    }

    /// The failback moved `reposted` sends and `recvs` receives to the default QP and
    /// completed `skipped` sends the peer had consumed.
    pub fn failback_moved(
        &mut self,
        now: Timestamp,
        reposted: u64,
        skipped: u64,
        recvs: u64,
        epoch: u32,
    ) {
        self.stats.wqes_copied += reposted + recvs;
        self.stats.wqes_retransmitted += reposted;
        self.stats.wqes_skipped += skipped;
        self.failback_moved = (reposted, skipped, recvs);
        tracing::debug!(qp = %self.qp, epoch, reposted, skipped, recvs, elapsed_us = self.failback_started.map_or(0.0, |t| now.saturating_since(t).as_secs_f64() * 1e6), "failover: failback moved the work");
    }

    /// The failback ended at `now`: traffic is back on the default QP in `epoch`. Its entry
    /// in the event log: `failback`, detected when the round started.
    pub fn failed_back(&mut self, now: Timestamp, epoch: u32) {
        self.stats.failbacks += 1;
        let started = self.failback_started.take().unwrap_or(now);
        let (reposted, skipped, recvs) = std::mem::take(&mut self.failback_moved);
        let event = FailoverEvent {
            wqes_copied: reposted + recvs,
            wqes_retransmitted: reposted,
            wqes_skipped: skipped,
            ..self.event(
                EventKind::Failback,
                Cause::BackupFailed,
                now,
                started,
                epoch,
            )
        };
        self.push(event);
        tracing::info!(
            qp = %self.qp,
            device = %self.device,
            epoch,
            elapsed_us = now.saturating_since(started).as_secs_f64() * 1e6,
            "failover: traffic back on the default QP after the backup failed"
        );
    }

    /// The backup side, lost while idle, is back in backup epoch `backup_epoch`.
    pub fn backup_repaired(&mut self, backup_epoch: u32) {
        self.stats.backup_rearms += 1;
        tracing::info!(qp = %self.qp, backup_epoch, "failover: backup side repaired; protected again");
    }

    /// The default devices' control channel, lost, is back in channel epoch `channel_epoch`.
    pub fn default_control_repaired(&mut self, channel_epoch: u32) {
        self.stats.default_control_repairs += 1;
        tracing::info!(qp = %self.qp, channel_epoch, "failover: the default devices' control channel is repaired");
    }

    /// Sends are back on the default QP at `now`, in `epoch`.
    pub fn switched_back(&mut self, now: Timestamp, epoch: u32) {
        self.stats.switch_backs += 1;
        let started = self.switch_started.take().unwrap_or(now);
        tracing::info!(
            qp = %self.qp,
            device = %self.device,
            epoch,
            elapsed_us = now.saturating_since(started).as_secs_f64() * 1e6,
            "failover: sends back on the default QP"
        );
        let event = self.event(
            EventKind::SwitchBack,
            Cause::PathRecovered,
            now,
            started,
            epoch,
        );
        self.push(event);
    }

    /// The connection failed at `now` for `reason`, in `epoch`: the errors went to the
    /// application.
    pub fn connection_failed(&mut self, reason: FailReason, now: Timestamp, epoch: u32) {
        let refused = matches!(
            reason,
            FailReason::Refused { .. } | FailReason::AtomicInFlight | FailReason::ReadOvertaken
        );
        if refused {
            self.stats.refusals += 1;
        } else {
            self.stats.errors += 1;
        }
        let cause = Cause::of_failure(reason);
        let detected = self.round.take().map_or(now, |r| r.detected);
        tracing::warn!(qp = %self.qp, device = %self.device, cause = cause.as_str(), %reason, "failover: connection failed; errors go to the application");
        let kind = if refused {
            EventKind::Refused
        } else {
            EventKind::Error
        };
        let event = self.event(kind, cause, now, detected, epoch);
        self.push(event);
    }

    /// An entry that moved no WQEs.
    fn event(
        &self,
        kind: EventKind,
        cause: Cause,
        now: Timestamp,
        detected: Timestamp,
        epoch: u32,
    ) -> FailoverEvent {
        FailoverEvent {
            kind,
            cause,
            device: self.device.clone(),
            unix_ms: self.clock.unix_ms(now),
            detected_unix_ms: self.clock.unix_ms(detected),
            first_success_unix_ms: None,
            fallback_latency_us: None,
            wqes_copied: 0,
            wqes_retransmitted: 0,
            wqes_skipped: 0,
            epoch,
        }
    }

    /// Appends to the event log; returns the entry's index, or `None` when the log is full.
    fn push(&mut self, event: FailoverEvent) -> Option<usize> {
        if self.events.len() >= EVENT_LOG_CAPACITY {
            self.stats.events_dropped += 1;
            return None;
        }
        self.events.push(event);
        Some(self.events.len() - 1)
    }
}
