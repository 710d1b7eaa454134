//! QPs handed to the service lcore to run: [`FailoverService::adopt`] and [`AdoptedQp`].
//!
//! An application that never polls its QP (a WRITE-only responder) still has to take part in
//! failovers and switch-backs; the service runs such a QP's failover work whenever mail comes,
//! a timer is due or a drain is in progress.

use crate::failover::Timestamp;

use super::ResilientQp;
use crate::resilient::service::{AdoptedWork, FailoverService, WeakServiceHandle};

impl AdoptedWork for ResilientQp {
    fn needs_progress(&self, now: Timestamp) -> bool {
        let due = self.next_deadline().is_some_and(|t| t <= now);
        self.shared.pending() || due || self.shared.busy()
    }

    fn progress(&mut self) {
        ResilientQp::progress(self);
    }

    fn busy(&self) -> bool {
        self.shared.busy()
    }

    fn next_deadline(&self) -> Option<Timestamp> {
        ResilientQp::next_deadline(self)
    }
}

/// A QP the service runs for an application that does not poll it.
#[derive(Debug)]
pub struct AdoptedQp {
    id: u64,
    service: WeakServiceHandle,
}

impl FailoverService {
    /// Takes `qp` over: the service runs its failover work whenever mail comes, a timer is
    /// due or a drain is in progress, so a QP whose application never polls (a WRITE-only
    /// responder) still takes part in failovers and switch-backs. Completions wait in its
    /// buffer until [`AdoptedQp::give_back`].
    pub fn adopt(&self, qp: ResilientQp) -> AdoptedQp {
        let handle = self.handle();
        AdoptedQp {
            id: handle.adopt(Box::new(qp)),
            service: handle.downgrade(),
        }
    }
}

impl AdoptedQp {
    /// Takes the QP back from the service (`None` if the service is gone).
    pub fn give_back(self) -> Option<ResilientQp> {
        let work: Box<dyn std::any::Any> = self.service.upgrade()?.give_back(self.id)?;
        work.downcast::<ResilientQp>().ok().map(|qp| *qp)
    }

    /// Runs `f` on the adopted QP (to read its state or statistics) under the service's lock.
    pub fn with<R>(&self, f: impl FnOnce(&ResilientQp) -> R) -> Option<R> {
        let service = self.service.upgrade()?;
        service
            .with_adopted(self.id, |work| {
                let any: &dyn std::any::Any = work;
                any.downcast_ref::<ResilientQp>().map(f)
            })
            .flatten()
    }
}
