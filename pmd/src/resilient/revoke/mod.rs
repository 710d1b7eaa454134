//! Revocation that failover never undoes: leases: the remote access an application
//! grants a peer (the resilient QP that carries it and the memory it names), revoked with
//! an outcome at once and destroyed after a grace period.
//!
//! A revoke has two phases. **Immediate** ([`Leases::revoke`]): both QPs
//! of the connection (default and backup) move to ERR and the failover machine is dropped
//! (no failover, switch-back, re-arm or repair brings either back), then every MR of the
//! lease is deregistered on the backup and the default device (its keys leave the
//! failover's mappings and the store first). When it returns, nothing the lease's rkeys
//! named is reachable through this process's QPs or either device: the peer's next packet
//! on either path is refused. Outcome: [`RevokeOutcome::TornDown`] if every step
//! succeeded, else [`RevokeOutcome::Fenced`] with what failed. **Deferred**
//! ([`Leases::sweep`], run by the application after the grace period): the QPs are
//! destroyed and the memory goes back to the pool; work still in flight when `revoke`
//! returned (a DMA engine's, a peer's packet being processed) thus never finds the memory
//! reused. A fenced lease (either phase) is never destroyed nor its memory reused while the
//! table lives; its failure context is kept ([`Leases::fenced`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::control::Context;

use super::clock::Clock;
use super::context::{ResilientBuffer, ResilientMr};
use super::dereg_error::DeregisterError;
use super::qp::ResilientQp;

/// The default grace period: how long a revoked lease's QPs and memory live on after
/// `revoke` returned, for work that may still be in flight.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(5);

/// Memory a lease grants the peer.
#[derive(Debug)]
pub enum Grant {
    /// A buffer from the pool, registered on both devices.
    Buffer(ResilientBuffer),
    /// Memory the application registered itself on both devices.
    Mr(ResilientMr),
}

impl Grant {
    fn deregister_now(&mut self) -> Result<(), DeregisterError> {
        match self {
            Grant::Buffer(b) => b.deregister_now(),
            Grant::Mr(m) => m.deregister_now(),
        }
    }

    /// The default rkey the peer was given.
    pub fn rkey(&self) -> u32 {
        match self {
            Grant::Buffer(b) => b.rkey(),
            Grant::Mr(m) => m.rkey(),
        }
    }
}

/// A lease's number in its table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId(pub u64);

/// What [`Leases::revoke`] says: torn down, fenced by a device that refused a step, or no
/// such lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RevokeOutcome {
    /// Both QPs are in ERR and every MR is deregistered on both devices; the lease is
    /// destroyed by the first sweep after the grace period.
    TornDown,
    /// Part of the teardown failed: the lease's QPs and memory are never destroyed nor
    /// reused (fail closed); what failed is kept.
    Fenced(Quarantine),
    /// No active lease with this id (never granted, or already revoked).
    NotFound,
}

/// Which phase fenced a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuarantinePhase {
    /// `revoke`'s immediate phase (a move to ERR or a deregistration refused).
    Revoke,
    /// The deferred phase (a destroy refused).
    Sweep,
}

/// A fenced lease's quarantine record: the lease is never destroyed nor its memory reused,
/// and this says why. (Not to be confused with a WR's fence or the switch-back's fence.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quarantine {
    /// The lease.
    pub lease: LeaseId,
    /// Which phase failed.
    pub phase: QuarantinePhase,
    /// Each step that failed.
    pub failures: Vec<StepFailure>,
}

/// One step of a revocation or its sweep that a device refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepFailure {
    /// What was being done (`dereg_mr of rkey 0x... on the backup device`).
    pub step: String,
    /// What the device answered.
    pub error: String,
}

struct Lease {
    qp: Option<ResilientQp>,
    memory: Vec<Grant>,
}

struct Draining {
    id: LeaseId,
    lease: Lease,
    /// Clock nanoseconds after which the sweep destroys it.
    until: u64,
}

/// A table of leases: what the application granted each peer, revocable by id.
///
/// The table owns each lease's QP and memory; the application reaches them through
/// [`Leases::qp`] and [`Leases::memory`] while the lease is active.
pub struct Leases {
    clock: Clock,
    grace: Duration,
    next: u64,
    active: HashMap<LeaseId, Lease>,
    draining: Vec<Draining>,
    fenced: Vec<(Quarantine, Lease)>,
}

impl std::fmt::Debug for Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases")
            .field("active", &self.active.len())
            .field("draining", &self.draining.len())
            .field("fenced", &self.fenced.len())
            .finish_non_exhaustive()
    }
}

impl Leases {
    /// An empty table on `clock` (the QPs' clock) whose revoked leases are destroyed
    /// `grace` after their revoke (usually [`DEFAULT_GRACE`]).
    pub fn new(clock: Clock, grace: Duration) -> Leases {
        Leases {
            clock,
            grace,
            next: 1,
            active: HashMap::new(),
            draining: Vec::new(),
            fenced: Vec::new(),
        }
    }

    /// Grants the peer of `qp` remote access to `memory` through it; returns the lease's id.
    pub fn grant(&mut self, qp: ResilientQp, memory: Vec<Grant>) -> LeaseId {
        let id = LeaseId(self.next);
        self.next += 1;
        self.active.insert(
            id,
            Lease {
                qp: Some(qp),
                memory,
            },
        );
        id
    }

    /// The QP of an active lease.
    pub fn qp(&mut self, id: LeaseId) -> Option<&mut ResilientQp> {
        self.active.get_mut(&id).and_then(|l| l.qp.as_mut())
    }

    /// The memory of an active lease.
    pub fn memory(&self, id: LeaseId) -> Option<&[Grant]> {
        self.active.get(&id).map(|l| &l.memory[..])
    }

    /// Revokes lease `id` (the immediate phase; see the module documentation). When it
    /// returns `TornDown` or `Fenced`, neither device reaches the lease's memory through
    /// its rkeys and neither of its QPs carries anything again.
    pub fn revoke(&mut self, id: LeaseId) -> RevokeOutcome {
        let Some(mut lease) = self.active.remove(&id) else {
            return RevokeOutcome::NotFound;
        };
        let mut failures: Vec<StepFailure> = lease
            .qp
            .as_mut()
            .map(|qp| qp.revoke())
            .unwrap_or_default()
            .into_iter()
            .map(|(what, error)| StepFailure {
                step: what.to_string(),
                error,
            })
            .collect();
        for grant in &mut lease.memory {
            let rkey = grant.rkey();
            if let Err(e) = grant.deregister_now() {
                for (device, error) in [("default", e.default), ("backup", e.backup)] {
                    if let Some(error) = error {
                        failures.push(StepFailure {
                            step: format!("dereg_mr of rkey {rkey:#x} on the {device} device"),
                            error: error.to_string(),
                        });
                    }
                }
            }
        }
        if failures.is_empty() {
            let until = self
                .clock
                .now()
                .as_nanos()
                .saturating_add(u64::try_from(self.grace.as_nanos()).unwrap_or(u64::MAX));
            self.draining.push(Draining { id, lease, until });
            return RevokeOutcome::TornDown;
        }
        let quarantine = Quarantine {
            lease: id,
            phase: QuarantinePhase::Revoke,
            failures,
        };
        tracing::error!(lease = id.0, failures = ?quarantine.failures, "lease fenced: part of its revocation failed; its resources are never reused");
        self.fenced.push((quarantine.clone(), lease));
        RevokeOutcome::Fenced(quarantine)
    }

    /// The deferred phase: destroys every revoked lease whose grace period has passed (its
    /// QPs first, then its memory goes back to the pool). A QP destroy a device refused
    /// (counted in its [`crate::control::ControlStats::destroy_failures`]) fences the lease with
    /// origin `Sweep`: its memory is kept. Returns how many leases were destroyed.
    pub fn sweep(&mut self) -> usize {
        let now = self.clock.now().as_nanos();
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.draining)
            .into_iter()
            .partition(|d| d.until <= now);
        self.draining = later;
        let mut destroyed = 0;
        for Draining { id, mut lease, .. } in due {
            let devices: Vec<Arc<Context>> = lease
                .qp
                .as_ref()
                .map(|qp| {
                    std::iter::once(qp.context().clone())
                        .chain(qp.backup_context().cloned())
                        .collect()
                })
                .unwrap_or_default();
            let before: Vec<u64> = devices
                .iter()
                .map(|d| d.stats().destroy_failures())
                .collect();
            drop(lease.qp.take());
            let failures: Vec<StepFailure> = devices
                .iter()
                .zip(before)
                .filter(|(d, b)| d.stats().destroy_failures() > *b)
                .map(|(d, _)| StepFailure {
                    step: format!("destroying the QP's objects on {}", d.name()),
                    error: "refused by the device (see its log)".to_string(),
                })
                .collect();
            if failures.is_empty() {
                drop(lease);
                destroyed += 1;
            } else {
                let quarantine = Quarantine {
                    lease: id,
                    phase: QuarantinePhase::Sweep,
                    failures,
                };
                tracing::error!(lease = id.0, failures = ?quarantine.failures, "lease fenced in its sweep; its memory is never reused");
                self.fenced.push((quarantine, lease));
            }
        }
        destroyed
    }

    /// Revoked leases not yet destroyed.
    pub fn draining(&self) -> usize {
        self.draining.len()
    }

    /// The quarantine record of every fenced lease, oldest first.
    pub fn fenced(&self) -> impl Iterator<Item = &Quarantine> {
        self.fenced.iter().map(|(f, _)| f)
    }
}

#[cfg(test)]
mod tests;
