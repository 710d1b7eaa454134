//! How resilient QPs are set up: failover on or off, the link watch, the protocol's timers.

use std::time::Duration;

use crate::failover::{self, Role};

/// Where the link watch reads a device's link state from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum LinkSource {
    /// Softnic devices: the provider's port events (the softnic's own netlink monitor raises
    /// them). `mlx5:<ibdev>` devices: rtnetlink on the ibdev's netdev, found in sysfs.
    #[default]
    Auto,
    /// rtnetlink on this netdev, whatever the device.
    Netdev(String),
    /// Do not watch this device's link.
    Off,
}

/// The configuration of a resilient context and the QPs made from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResilientConfig {
    /// Fail over at all. Off: a resilient QP is the default QP and nothing else (no backup
    /// resources are created), which is what `--no-failover` runs measure against.
    pub failover: bool,
    /// Move the default QP to ERR as soon as its device's link goes down, instead of waiting
    /// for retry exhaustion. On by default.
    pub link_watch: bool,
    /// Where each device's link state comes from: `[default, backup]`.
    pub link_sources: [LinkSource; 2],
    /// How long the default link must have been up before the default QP is brought back.
    pub holddown: Duration,
    /// How long a default link reported down is believed before rearms are attempted anyway
    /// (`failover::Config::link_down_trust`). Default 5 s.
    pub link_down_trust: Duration,
    /// Wait before the first rearm attempt, doubled after each failed one.
    pub backoff_initial: Duration,
    /// The longest wait between rearm attempts.
    pub backoff_max: Duration,
    /// How long a failover, failback or switch-back handshake waits for the peer before the
    /// connection fails, at least: the machine waits the outage tolerance where that is
    /// longer (`failover::Config::handshake_wait`), since the peer's side of the path can be
    /// down where this end cannot see it.
    pub handshake_timeout: Duration,
    /// How long a connection holds its work while no path answers before it fails
    /// (`docs/failover.md` 5c); the control QPs' retries outlast it too. Default 4.29 s.
    pub outage_tolerance: Duration,
    /// How soon the backup CQ is polled again while a receive switch-back waits for
    /// completions.
    pub redrain_interval: Duration,
    /// Receive WQEs posted on the control QP (control messages in flight at most).
    pub control_depth: u32,
    /// How long a failover round waits for the default QP's flush completions. A device
    /// that died without flushing (a firmware assert, a surprise removal) writes none; after
    /// this the WQEs without a completion count as unknown and the round goes on from the
    /// peer's counters. A device known to be dead (its device-fatal event) is not waited for.
    pub drain_timeout: Duration,
    /// The local address of the management network (the one the application's own exchange
    /// used): with one, each QP takes control messages there too, and where the peer has one
    /// as well the two ends agree over it when both control channels are lost
    /// (`docs/failover.md` 5f). `None` (the default): no management channel.
    pub management_addr: Option<std::net::IpAddr>,
}

impl Default for ResilientConfig {
    fn default() -> ResilientConfig {
        let machine = failover::Config::new(Role::Leader);
        ResilientConfig {
            failover: true,
            link_watch: machine.link_watch,
            link_sources: [LinkSource::Auto, LinkSource::Auto],
            holddown: machine.holddown,
            link_down_trust: machine.link_down_trust,
            backoff_initial: machine.backoff_initial,
            backoff_max: machine.backoff_max,
            handshake_timeout: machine.handshake_timeout,
            outage_tolerance: machine.outage_tolerance,
            redrain_interval: machine.redrain_interval,
            control_depth: 32,
            drain_timeout: Duration::from_millis(100),
            management_addr: None,
        }
    }
}

impl ResilientConfig {
    /// A configuration without failover: resilient QPs behave as plain QPs.
    pub fn without_failover() -> ResilientConfig {
        ResilientConfig {
            failover: false,
            ..ResilientConfig::default()
        }
    }

    /// The failover machine's configuration for an end with `role`.
    pub(crate) fn machine(&self, role: Role) -> failover::Config {
        failover::Config {
            role,
            link_watch: self.link_watch,
            holddown: self.holddown,
            link_down_trust: self.link_down_trust,
            backoff_initial: self.backoff_initial,
            backoff_max: self.backoff_max,
            handshake_timeout: self.handshake_timeout,
            redrain_interval: self.redrain_interval,
            // Set from the QP's own RTS attributes when it is armed (the driver's install).
            backup_wait: failover::Config::new(role).backup_wait,
            outage_tolerance: self.outage_tolerance,
            // Set when both ends published a management endpoint (the driver's install).
            management: false,
        }
    }

    /// What a control QP's retries must outlast: a handshake, and an outage the connection
    /// rides out (a message posted while no path answers is still delivered when one does).
    pub(crate) fn control_outlasts(&self) -> Duration {
        self.handshake_timeout.max(self.outage_tolerance)
    }
}
