//! How one end of a resilient connection is set up: its role, its timers, its epochs.

use core::time::Duration;

/// Which end brings the default path back after a failover.
///
/// Both ends fail over (either may start it), but bringing the default QP pair back into a new
/// epoch is led by one end so the two never race each other into different epochs. The
/// rendezvous decides (railshift: the end whose default `(GID, QPN)` sorts lower leads).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Schedules rearm attempts, probes the default path and announces it up.
    Leader,
    /// Follows the leader's rearm requests.
    Follower,
}

/// The configuration of one end's failover machine.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Config {
    /// This end's role in rearming the default path.
    pub role: Role,
    /// Treat link-down of the default device as a path failure at once (move the default QP to
    /// ERR and fail over) instead of waiting for retry exhaustion. On by default.
    pub link_watch: bool,
    /// How long the default link must have been up before the default QP is brought back
    /// (recovered NICs can refuse RTR for a while after link-up, and links flap).
    pub holddown: Duration,
    /// How long a link reported down is believed (`docs/failover.md` 5c). Reports come late,
    /// and a missed port event leaves one standing while the path carries packets again, so
    /// past this a rearm of the default pair is attempted at the backoff's pace as if the
    /// link were up: its probe finds out whether the path carries packets. A link reported
    /// up again is held down as before. `Duration::MAX` believes reports for ever.
    pub link_down_trust: Duration,
    /// Wait before the first rearm attempt after a failover, doubled after each failed attempt.
    pub backoff_initial: Duration,
    /// The longest wait between rearm attempts.
    pub backoff_max: Duration,
    /// How long a failover handshake may wait for the peer before the connection is failed,
    /// at least ([`Config::handshake_wait`] takes the outage tolerance where that is longer).
    pub handshake_timeout: Duration,
    /// How long the backup link may be down while something needs it (a failover round, or
    /// traffic on the backup) before the connection fails with `backup-unavailable`: the
    /// QP's own RC retry budget, so failover never fails faster than a plain RC QP would.
    /// Zero fails at once.
    pub backup_wait: Duration,
    /// How long the connection holds its work while no path answers (`docs/failover.md` 5c):
    /// a round waiting for the backup link, a failback waiting for the default path. Posted
    /// work is withheld meanwhile, not failed; past it the connection fails with
    /// `outage-tolerance`. Never shorter than `backup_wait` (the larger is used);
    /// zero keeps the RC retry budget alone.
    pub outage_tolerance: Duration,
    /// How soon to poll the backup CQ again while waiting for receive completions during a
    /// switch-back.
    pub redrain_interval: Duration,
    /// The two ends can also reach each other over the management network
    /// (`docs/failover.md` 5f): a failback's messages go there too, and the default devices'
    /// channel is repaired there when the backup devices' channel is lost as well. Off by
    /// default: the driver turns it on when both ends published a management endpoint.
    pub management: bool,
}

/// What a plain RC QP waits before `RETRY_EXC_ERR` on a dead path (the IBTA arithmetic is
/// `hw_defs`'s): the first transmission and `retry_cnt` retries, each waiting the local ACK
/// timeout 4.096 us x 2^`timeout`; a `timeout` of 0 (no timer) is taken as 14 (67 ms).
pub use hw_defs::verbs::rc_retry_budget;

/// The default outage tolerance: what one try of a plain RC QP waits with NCCL's default
/// `NCCL_IB_TIMEOUT` 20 (4.096 us x 2^20, 4.29 s), so a resilient connection rides out at
/// least the outage of its only path that NCCL's own QPs ride out per try.
pub const DEFAULT_OUTAGE_TOLERANCE: Duration = Duration::from_nanos(4096 << 20);

impl Config {
    /// The defaults for `role`: link watch on, 1 s hold-down, link-down reports believed for
    /// 5 s, backoff from 100 ms to 5 s, 2 s handshake timeout, 4.29 s outage tolerance.
    pub fn new(role: Role) -> Self {
        Config {
            role,
            link_watch: true,
            holddown: Duration::from_secs(1),
            link_down_trust: Duration::from_secs(5),
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            handshake_timeout: Duration::from_secs(2),
            backup_wait: rc_retry_budget(14, 7),
            outage_tolerance: DEFAULT_OUTAGE_TOLERANCE,
            redrain_interval: Duration::from_micros(50),
            management: false,
        }
    }

    /// How long the machine waits while no path answers before it fails the connection: the
    /// outage tolerance, or the RC retry budget where that is longer.
    pub fn no_path_wait(&self) -> Duration {
        self.outage_tolerance.max(self.backup_wait)
    }

    /// How long a handshake that holds the application's work (a failover round, a
    /// failback, a switch-back's fence) waits for the peer before the connection fails: the
    /// handshake timeout, or the outage tolerance where that is longer. The peer's side of
    /// the path its answer travels on can be down where this end cannot see it (its NIC, the
    /// switch port facing it), and then nothing answers: that is an outage, which the
    /// tolerance bounds, not a silent peer.
    pub fn handshake_wait(&self) -> Duration {
        self.handshake_timeout.max(self.no_path_wait())
    }

    /// The wait after `failures` consecutive failed rearm attempts.
    pub fn backoff(&self, failures: u32) -> Duration {
        let factor = 1u32.checked_shl(failures.min(31)).unwrap_or(u32::MAX);
        self.backoff_initial
            .saturating_mul(factor)
            .min(self.backoff_max)
    }
}

/// One incarnation of the default QP pair.
///
/// Every time the default pair is torn down and brought back, both ends move to a new epoch.
/// A QP enters RTR in epoch `e` only after the peer's QP is known to have left every earlier
/// epoch, and its PSNs start where [`Epoch::start_psn`] says, so packets of an older
/// incarnation can never be taken for packets of the new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Epoch(pub u32);

/// How far apart consecutive epochs' starting PSNs lie: a quarter of the 24-bit PSN space.
pub const EPOCH_PSN_STRIDE: u32 = 1 << 22;

impl Epoch {
    /// The epoch after this one.
    pub fn next(self) -> Epoch {
        Epoch(self.0.saturating_add(1))
    }

    /// The first PSN of this epoch, for a QP whose saved starting PSN is `base`: RQ PSN of one
    /// end and SQ PSN of the other are derived the same way from the same `base`.
    pub fn start_psn(self, base: u32) -> u32 {
        base.wrapping_add(self.0.wrapping_mul(EPOCH_PSN_STRIDE)) & 0x00FF_FFFF
    }
}

impl core::fmt::Display for Epoch {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "epoch {}", self.0)
    }
}

/// One incarnation of an end's backup side: its backup data QP and its control QP on the
/// backup devices, reset and brought up together by a backup repair (`docs/failover.md` 5d).
/// Counted apart from the default pair's [`Epoch`]; its PSNs are laid out the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct BackupEpoch(pub u32);

/// One incarnation of the control channel on the default devices, reset and brought up by a
/// channel repair (`docs/failover.md` 5d). Counted apart from the default pair's [`Epoch`];
/// its PSNs are laid out the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ChannelEpoch(pub u32);

impl BackupEpoch {
    /// The first PSN of this incarnation, for a QP whose saved starting PSN is `base`.
    pub fn start_psn(self, base: u32) -> u32 {
        Epoch(self.0).start_psn(base)
    }
}

impl ChannelEpoch {
    /// The first PSN of this incarnation, for a QP whose published starting PSN is `base`.
    pub fn start_psn(self, base: u32) -> u32 {
        Epoch(self.0).start_psn(base)
    }
}

impl core::fmt::Display for BackupEpoch {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "backup epoch {}", self.0)
    }
}

impl core::fmt::Display for ChannelEpoch {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "channel epoch {}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_maximum() {
        let config = Config::new(Role::Leader);
        assert_eq!(config.backoff(0), Duration::from_millis(100));
        assert_eq!(config.backoff(1), Duration::from_millis(200));
        assert_eq!(config.backoff(3), Duration::from_millis(800));
        assert_eq!(config.backoff(10), Duration::from_secs(5));
        assert_eq!(config.backoff(u32::MAX), Duration::from_secs(5));
    }

    #[test]
    fn consecutive_epochs_start_a_quarter_of_the_psn_space_apart() {
        let base = 0x12_3456;
        assert_eq!(Epoch(0).start_psn(base), base);
        assert_eq!(Epoch(1).start_psn(base), base + (1 << 22));
        let e3 = Epoch(3).start_psn(base);
        let e4 = Epoch(4).start_psn(base);
        assert_eq!(e4.wrapping_sub(e3) & 0xFF_FFFF, 1 << 22);
        assert!(e4 <= 0xFF_FFFF);
    }
}
