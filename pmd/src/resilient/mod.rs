//! Resilient QPs: SHIFT cross-NIC failover in the driver (`docs/failover.md`).
//!
//! A [`ResilientQp`] pairs a default QP on one device with a backup QP on another device in
//! the same host and moves the application's in-flight work to the backup when the default
//! path fails, and back when it recovers, without losing, duplicating or reordering what the
//! application depends on. The protocol is the sans-IO machine of [`crate::failover`]; this
//! module performs its actions.
//!
//! | piece | job |
//! | --- | --- |
//! | [`ResilientContext`], [`ResilientPd`], [`ResilientBuffer`], [`ResilientMr`] | the application's control verbs on the default device, recorded for the backup device |
//! | [`ResilientQp`] | post, doorbell, poll as on a plain QP; the failover driver behind it |
//! | [`FailoverService`] | the service lcore: shadow verbs, link watch, control messages, timers, adopted QPs |
//! | [`PeerAttrs`], [`Rendezvous`], [`RedisRendezvous`], [`RendezvousKey`] | backup attributes, how the two ends exchange them, the secret Redis entries are sealed with |
//! | [`FailoverStats`], [`FailoverEvent`] | per-QP counters and the event log the apps put in their JSON |
//! | [`Leases`], [`RevokeOutcome`] | remote access granted to a peer, revoked on both devices, never undone by a failover |
//! | [`Clock`] | real or virtual time |
//!
//! Setting up a resilient connection with the inline rendezvous:
//!
//! ```no_run
//! # use pmd::resilient::*;
//! # use pmd::*;
//! # fn exchange(_: &[u8]) -> Vec<u8> { unimplemented!() }
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let service = FailoverService::start(ServiceConfig::default())?;
//! let ctx = ResilientContext::open("soft:nic0", Some("soft:nic1"), &ContextConfig::default(),
//!                                  &service, ResilientConfig::default())?;
//! let pd = ctx.alloc_pd()?;
//! let buf = pd.alloc_buffer(1 << 20, Access::ALL)?;
//! let mut qp = pd.create_qp(QpCaps::default())?;
//! // Send the backup attributes with the application's own (QPN, GID, rkey, address)...
//! let blob = qp.rendezvous_blob(std::time::Duration::from_secs(5))?;
//! let peer_blob = exchange(&blob);
//! qp.connect_backup(&peer_blob)?;
//! // ... and bring the QP up as usual; the backup QP follows on the service lcore.
//! # let (peer_gid, peer_qpn) = (Gid::default(), 0);
//! qp.modify(QpState::Init, &QpAttr::init(Access::ALL))?;
//! qp.modify(QpState::Rtr, &QpAttr::rtr(AddressVector::to_gid(peer_gid), peer_qpn, 0, Mtu::Mtu1024))?;
//! qp.modify(QpState::Rts, &QpAttr::rts(0))?;
//! qp.wait_protected(std::time::Duration::from_secs(5))?;
//! # Ok(()) }
//! ```

mod backup_cq;
mod channel;
mod clock;
mod config;
mod context;
mod deadline;
mod dereg_error;
mod device_pool;
mod management;
mod qp;
mod rendezvous;
mod revoke;
mod service;
mod stats;
mod stream;

pub use channel::ControlError;
pub use clock::Clock;
pub use config::{LinkSource, ResilientConfig};
pub use context::{ResilientBuffer, ResilientContext, ResilientMr, ResilientPd};
pub use dereg_error::DeregisterError;
pub use qp::AdoptedQp;
pub use qp::{ConnectError, ResilientQp, ResilientState};
pub use rendezvous::auth::{RefusalCounts, RendezvousKey, KEY_FILE_VAR, MIN_KEY_LEN};
pub use rendezvous::error::RendezvousError;
pub use rendezvous::{
    ManagementEndpoint, PeerAttrs, RedisRendezvous, Rendezvous, MANAGEMENT_KEY_LEN,
};
pub use revoke::{
    Grant, LeaseId, Leases, Quarantine, QuarantinePhase, RevokeOutcome, StepFailure, DEFAULT_GRACE,
};
pub use service::{FailoverService, ServiceConfig, ShadowOrder};
pub use stats::{Cause, EventKind, FailoverEvent, FailoverStats, UnknownName, EVENT_LOG_CAPACITY};
