//! A QP's congestion window: how many PSNs its requester may have in flight beyond the oldest
//! one not acknowledged. It starts small and doubles each window acknowledged (slow start)
//! until the first loss; each loss halves it; past the first loss it grows by one packet per
//! window acknowledged (AIMD). So many QPs sharing a medium that drops when overrun back off
//! instead of resending whole windows into it, and one QP on a clean path reaches the full
//! window within a few round trips.
//!
//! A ConnectX shares its link across QPs with DCQCN, a rate per QP cut on congestion
//! notifications; softnic's media (a veth, the in-memory fabric) mark nothing, so the loss
//! that go-back-N already reports (a PSN-sequence NAK, a missing READ response, a local ACK
//! timeout) is the signal, and a window stands in for the rate, as in TCP's Reno.

use crate::codec::psn_delta;
use crate::counters::Counters;

/// The requester asks for an ACK at least this often within a long message.
pub(crate) const ACK_REQ_EVERY: u32 = 32;

/// PSNs in flight (sent, not acknowledged) at most, whatever the window: the window of a QP
/// that has seen no loss grows to it, and a single QP on a clean path is not held back below.
pub(crate) const MAX_INFLIGHT_PSNS: u32 = 1024;

/// The window a QP starts with: many QPs starting at once must not put their whole windows
/// on the medium in one burst.
pub(crate) const INITIAL_WINDOW: u32 = 8;

/// The smallest window a loss leaves: a few packets, so that a QP keeps getting ACKs (it asks
/// for one every half window) and probes the path after a cut.
pub(crate) const MIN_WINDOW: u32 = 2;

/// One QP's window, in PSNs.
#[derive(Debug)]
pub(crate) struct Window {
    /// PSNs the requester may have in flight now.
    limit: u32,
    /// Below this the window doubles per window acknowledged, at or above it grows by one:
    /// half the window of the last loss (no loss yet: the ceiling).
    threshold: u32,
    /// PSNs acknowledged since the window last grew (growing by one).
    acked: u32,
}

impl Default for Window {
    fn default() -> Window {
        Window {
            limit: INITIAL_WINDOW,
            threshold: MAX_INFLIGHT_PSNS,
            acked: 0,
        }
    }
}

impl Window {
    /// Whether a packet at `psn` may be sent while `comp_psn` is the oldest not acknowledged.
    #[inline]
    pub fn allows(&self, psn: u32, comp_psn: u32) -> bool {
        psn_delta(psn, comp_psn) < self.limit as i32
    }

    /// PSNs the requester may have in flight now.
    #[inline]
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Packets between two AckReqs: [`ACK_REQ_EVERY`], or half the window when that is
    /// smaller, so that a small window still brings ACKs back before it closes (the responder
    /// ACKs only on AckReq), not only at a message's last packet or the ACK timeout.
    #[inline]
    pub fn ack_every(&self) -> u32 {
        (self.limit / 2).clamp(1, ACK_REQ_EVERY)
    }

    /// `psns` more PSNs were acknowledged: the window grows by as many below the threshold
    /// (doubling per window), by one per window's worth above it.
    #[inline]
    pub fn acknowledged(&mut self, psns: u32) {
        if self.limit >= MAX_INFLIGHT_PSNS {
            // The common case of a clean path: nothing to grow, nothing to count.
            return;
        }
        if self.limit < self.threshold {
            self.limit = (self.limit + psns).min(self.threshold);
            return;
        }
        self.acked = self.acked.saturating_add(psns);
        while self.acked >= self.limit && self.limit < MAX_INFLIGHT_PSNS {
            self.acked -= self.limit;
            self.limit += 1;
        }
    }

    /// A loss was seen and go-back-N resends from it: halve the window (not below the floor).
    /// Each go-back-N is one loss event: after the first gap the responder drops the rest of
    /// the window without another NAK, so one window's loss cuts once.
    pub fn lost(&mut self, counters: &mut Counters) {
        self.limit = (self.limit / 2).max(MIN_WINDOW);
        self.threshold = self.limit;
        self.acked = 0;
        counters.window_cuts += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cut(w: &mut Window, times: usize) {
        for _ in 0..times {
            w.lost(&mut Counters::default());
        }
    }

    #[test]
    fn a_clean_path_doubles_the_window_up_to_the_ceiling() {
        let mut w = Window::default();
        assert_eq!(w.limit, INITIAL_WINDOW);
        w.acknowledged(INITIAL_WINDOW);
        assert_eq!(w.limit, 2 * INITIAL_WINDOW);
        for _ in 0..20 {
            w.acknowledged(w.limit);
        }
        assert_eq!(w.limit, MAX_INFLIGHT_PSNS);
        assert!(w.allows(1023, 0));
        assert!(!w.allows(1024, 0));
    }

    #[test]
    fn each_loss_halves_down_to_the_floor() {
        let mut w = Window::default();
        w.acknowledged(MAX_INFLIGHT_PSNS);
        assert_eq!(w.limit, MAX_INFLIGHT_PSNS);
        cut(&mut w, 1);
        assert_eq!(w.limit, 512);
        cut(&mut w, 20);
        assert_eq!(w.limit, MIN_WINDOW);
    }

    #[test]
    fn after_a_loss_the_window_grows_by_one_packet_per_window_acknowledged() {
        let mut w = Window::default();
        cut(&mut w, 20);
        w.acknowledged(MIN_WINDOW - 1);
        assert_eq!(w.limit, MIN_WINDOW);
        w.acknowledged(1);
        assert_eq!(w.limit, MIN_WINDOW + 1);
        w.acknowledged(MIN_WINDOW + 1);
        assert_eq!(w.limit, MIN_WINDOW + 2);
    }

    #[test]
    fn the_window_never_grows_past_the_ceiling() {
        let mut w = Window::default();
        cut(&mut w, 1);
        w.acknowledged(u32::MAX / 2);
        w.acknowledged(u32::MAX / 2);
        assert!(w.limit <= MAX_INFLIGHT_PSNS);
        for _ in 0..10_000 {
            w.acknowledged(MAX_INFLIGHT_PSNS);
        }
        assert_eq!(w.limit, MAX_INFLIGHT_PSNS);
    }

    #[test]
    fn a_small_window_asks_for_acks_before_it_closes() {
        let mut w = Window::default();
        w.acknowledged(MAX_INFLIGHT_PSNS);
        assert_eq!(w.ack_every(), ACK_REQ_EVERY);
        cut(&mut w, 20);
        assert!(w.ack_every() < w.limit);
    }

    #[test]
    fn psns_wrap_around() {
        let mut w = Window::default();
        w.acknowledged(MAX_INFLIGHT_PSNS);
        assert!(w.allows(5, 0x00ff_fff0));
        assert!(!w.allows(0x3f0, 0x00ff_fff0));
    }
}
