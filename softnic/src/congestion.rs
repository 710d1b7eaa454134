//! Sharing the medium between QPs: a per-QP congestion window cut on loss and grown back
//! additively (TCP Reno's shape, what DCQCN does with rates), a bound on the packets a whole
//! device has in flight, and an equal share of that bound for every QP with data to send.
//!
//! Without it each QP kept up to 1,024 PSNs in flight on its own: 256 QPs with full windows
//! overran the peer's receive ring, go-back-N resent whole windows into the same overrun, and
//! RC timers fired. The window counts PSNs (a READ request counts its response packets).

use crate::codec::psn_delta;

/// PSNs one QP may have in flight at most (its window never grows past this).
pub(crate) const MAX_QP_WINDOW: u32 = 1024;
/// PSNs a whole device may have in flight at most, summed over its QPs: what one QP may have
/// (so one QP alone runs as it did before sharing), 4 MiB at RoCE MTU 4096, under the peer's
/// receive ring of 3,840 frames.
pub(crate) const MAX_DEVICE_INFLIGHT: u32 = 1024;
/// Request packets a device sends per round at most, summed over its QPs: one round's worth
/// of the peer's receive (4 batches of 64), and under a veth's backlog of 1,000 packets, which
/// drops what a burst puts beyond it. One QP sends at most 128 a round anyway; 256 QPs sent
/// up to 32,768.
pub(crate) const MAX_ROUND_PACKETS: u32 = 256;
/// PSNs one QP counts in the device's total at most: a long READ's request stands for up to a
/// million response PSNs, which the responder paces itself, and must not close the device to
/// every other QP.
const MAX_QP_COUNTED: u32 = MAX_DEVICE_INFLIGHT / 2;
/// The smallest window a cut leaves, and the smallest share of the device.
const MIN_WINDOW: u32 = 2;
/// Packets the window grows by per window's worth acknowledged (additive increase per round
/// trip): a halved window of 512 is whole again after 64 round trips.
const ADDITIVE_STEP: u32 = 8;

/// Why a QP goes back N.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Loss {
    /// A PSN-sequence NAK or a gap in READ responses: something was lost, later packets
    /// arrived.
    Gap,
    /// The local ACK timer fired: nothing came back for a whole timeout.
    Timeout,
    /// The short timer after a re-post fired: not a sign of congestion, no cut.
    ShortTimeout,
    /// An RNR NAK: the peer had no receive WQE, the medium is fine.
    Rnr,
}

/// One QP's congestion state.
#[derive(Debug)]
pub(crate) struct Window {
    /// PSNs this QP may have in flight.
    pub cwnd: u32,
    /// Below it the window doubles per round trip, above it grows by `ADDITIVE_STEP`.
    ssthresh: u32,
    /// PSNs acknowledged towards the next additive step.
    acked: u32,
    /// No cut until the PSNs in flight at the last cut are acknowledged (one cut per loss
    /// episode, as Reno's recovery point).
    recover: Option<u32>,
    /// The oldest unacknowledged PSN at the last look (to see how far ACKs moved).
    seen_comp_psn: u32,
    /// What this QP counts in the device's in-flight total.
    pub counted: u32,
}

impl Default for Window {
    fn default() -> Window {
        Window {
            cwnd: MAX_QP_WINDOW,
            ssthresh: MAX_QP_WINDOW,
            acked: 0,
            recover: None,
            seen_comp_psn: 0,
            counted: 0,
        }
    }
}

impl Window {
    /// Back to a fresh window (the QP went to RESET); what it counts in flight stays until
    /// the next round's sync takes it back.
    pub fn reset(&mut self) {
        *self = Window {
            counted: self.counted,
            ..Window::default()
        };
    }
}

/// The device's side: the PSNs all its QPs have in flight, and how many QPs share them.
#[derive(Debug)]
pub(crate) struct DeviceWindow {
    /// Off: every QP sends up to `MAX_QP_WINDOW` whatever the others do (for measuring what
    /// the sharing costs).
    pub enabled: bool,
    /// PSNs in flight, the sum of every QP's `Window::counted`.
    pub inflight: u32,
    /// QPs with data in flight or waiting, counted by the last service pass.
    pub senders: u32,
    /// The count being taken by the service pass under way.
    senders_now: u32,
    /// Rounds so far, to rotate where the service pass starts.
    pub rounds: u64,
    /// Request packets sent in the round under way.
    round_packets: u32,
}

impl DeviceWindow {
    /// A device's window, sharing on or off.
    pub fn new(enabled: bool) -> DeviceWindow {
        DeviceWindow {
            enabled,
            inflight: 0,
            senders: 0,
            senders_now: 0,
            rounds: 0,
            round_packets: 0,
        }
    }

    /// The PSNs a QP with window `w` may have in flight now: its window, and its equal share
    /// of the device.
    pub fn qp_limit(&self, w: &Window) -> u32 {
        if !self.enabled {
            return MAX_QP_WINDOW;
        }
        let share = (MAX_DEVICE_INFLIGHT / self.senders.max(1)).max(MIN_WINDOW);
        w.cwnd.min(share)
    }

    /// Whether the device has no room for another packet in flight.
    pub fn full(&self) -> bool {
        self.enabled && self.inflight >= MAX_DEVICE_INFLIGHT
    }

    /// Whether this round sent all the request packets a round may.
    pub fn round_full(&self) -> bool {
        self.enabled && self.round_packets >= MAX_ROUND_PACKETS
    }

    /// A round begins.
    pub fn round_begins(&mut self) {
        self.round_packets = 0;
    }

    /// A packet of the QP with window `w` went on the wire, moving its next PSN on by
    /// `advance`.
    pub fn sent(&mut self, w: &mut Window, advance: u32) {
        self.round_packets += 1;
        let counted = (w.counted + advance).min(MAX_QP_COUNTED);
        self.inflight += counted - w.counted;
        w.counted = counted;
    }

    /// Brings a QP's count in line with its PSNs in flight, from `comp_psn` (the oldest not
    /// acknowledged) to `psn` (the next to send), none unless it is `live` (in RTS): after
    /// ACKs, a go-back-N, an error or a reset. Grows its window by what was acknowledged
    /// since the last look.
    pub fn sync(&mut self, w: &mut Window, live: bool, psn: u32, comp_psn: u32) {
        if live {
            let acked = psn_delta(comp_psn, w.seen_comp_psn);
            if acked > 0 && acked <= MAX_QP_WINDOW as i32 * 2 {
                grow(w, acked as u32);
            }
        }
        w.seen_comp_psn = comp_psn;
        let now = if live {
            (psn_delta(psn, comp_psn).max(0) as u32).min(MAX_QP_COUNTED)
        } else {
            0
        };
        // Saturating: a miscount must slow the device, never panic it.
        self.inflight = self.inflight.saturating_sub(w.counted) + now;
        w.counted = now;
    }

    /// A QP is destroyed: what it counted is no longer in flight.
    pub fn forget(&mut self, w: &Window) {
        self.inflight = self.inflight.saturating_sub(w.counted);
    }

    /// Counts a QP as a sender in the pass under way if it has anything in flight or
    /// `unsent` work.
    pub fn count_sender(&mut self, w: &Window, unsent: bool) {
        if w.counted > 0 || unsent {
            self.senders_now += 1;
        }
    }

    /// The service pass is over: its count of senders is the one the next round shares by.
    pub fn pass_done(&mut self) {
        self.senders = self.senders_now;
        self.senders_now = 0;
        self.rounds += 1;
    }
}

/// Grows the window by `acked` PSNs' worth: doubling below `ssthresh`, additive above.
fn grow(w: &mut Window, acked: u32) {
    if w.cwnd < w.ssthresh {
        w.cwnd = (w.cwnd + acked).min(w.ssthresh);
        return;
    }
    w.acked += acked * ADDITIVE_STEP;
    if w.acked >= w.cwnd {
        w.cwnd = (w.cwnd + w.acked / w.cwnd).min(MAX_QP_WINDOW);
        w.acked %= w.cwnd.max(1);
    }
}

impl Window {
    /// The QP goes back N for `why`, with `comp_psn` the oldest PSN not acknowledged and
    /// `high_psn` one past the highest sent: a gap halves the window, a timeout leaves the
    /// smallest one and grows back by doubling to half the old one; once per loss episode.
    /// Returns whether it cut.
    pub fn on_loss(&mut self, why: Loss, comp_psn: u32, high_psn: u32) -> bool {
        if matches!(why, Loss::Rnr | Loss::ShortTimeout) {
            return false;
        }
        if self.recover.is_some_and(|r| psn_delta(comp_psn, r) < 0) {
            return false;
        }
        self.recover = Some(high_psn);
        self.ssthresh = (self.cwnd / 2).max(MIN_WINDOW);
        self.cwnd = match why {
            Loss::Timeout => MIN_WINDOW,
            _ => self.ssthresh,
        };
        self.acked = 0;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn above_the_threshold_a_window_grows_by_the_additive_step_per_window_acknowledged() {
        let mut w = Window {
            cwnd: 100,
            ssthresh: 100,
            ..Window::default()
        };
        grow(&mut w, 100);
        assert_eq!(w.cwnd, 100 + ADDITIVE_STEP);
    }

    #[test]
    fn below_the_threshold_a_window_grows_by_what_was_acknowledged() {
        let mut w = Window {
            cwnd: 2,
            ssthresh: 64,
            ..Window::default()
        };
        grow(&mut w, 10);
        assert_eq!(w.cwnd, 12);
        grow(&mut w, 100);
        assert_eq!(w.cwnd, 64);
    }

    #[test]
    fn a_gap_halves_the_window_a_timeout_leaves_the_smallest_and_an_rnr_nothing() {
        let mut w = Window::default();
        assert!(!w.on_loss(Loss::Rnr, 0, 100));
        assert!(!w.on_loss(Loss::ShortTimeout, 0, 100));
        assert!(w.on_loss(Loss::Gap, 0, 100));
        assert_eq!(w.cwnd, MAX_QP_WINDOW / 2);
        let mut w = Window::default();
        assert!(w.on_loss(Loss::Timeout, 0, 100));
        assert_eq!((w.cwnd, w.ssthresh), (MIN_WINDOW, MAX_QP_WINDOW / 2));
    }

    #[test]
    fn one_loss_episode_cuts_once() {
        let mut w = Window::default();
        assert!(w.on_loss(Loss::Gap, 0, 100));
        // Still recovering what was in flight at the cut (PSNs before 100).
        assert!(!w.on_loss(Loss::Gap, 50, 120));
        assert!(w.on_loss(Loss::Gap, 100, 140));
        assert_eq!(w.cwnd, MAX_QP_WINDOW / 4);
    }

    #[test]
    fn a_window_never_grows_past_the_largest() {
        let mut w = Window::default();
        grow(&mut w, 1024);
        assert_eq!(w.cwnd, MAX_QP_WINDOW);
    }
}
