//! Shared receive queues: one receive ring many QPs of a PD take their receives from. The
//! datapath half ([`SharedRecvQueue`]) is shared by the control object, the QPs created on it
//! and the CQs they complete into; the SRQ is destroyed on the device when the last of them
//! goes, so a QP never outlives the ring it receives into.

use std::sync::atomic::AtomicU32;
use std::sync::Arc;

use crate::datapath::srq::{SharedRecvQueue, SrqParts};
use crate::datapath::wr::{PostError, RecvWr};
use crate::provider::{Handle, SrqRequest, VerbsError};

use super::Pd;

/// The control half of an SRQ.
pub(crate) struct SrqShared {
    pub pd: Arc<Pd>,
    pub handle: Handle,
    pub queue: Arc<SharedRecvQueue>,
}

impl Drop for SrqShared {
    fn drop(&mut self) {
        let ctx = self.pd.context();
        ctx.released("destroy_srq", ctx.provider().destroy_srq(self.handle));
    }
}

/// What an SRQ holds, as `ibv_query_srq` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqAttr {
    /// Receives it holds at once.
    pub max_wr: u32,
    /// Scatter entries per receive.
    pub max_sge: u32,
    /// The armed limit; zero when disarmed.
    pub limit: u32,
}

/// A shared receive queue.
#[derive(Clone)]
pub struct Srq {
    shared: Arc<SrqShared>,
}

impl std::fmt::Debug for Srq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Srq")
            .field("device", &self.shared.pd.context().name())
            .field("handle", &self.shared.handle)
            .finish_non_exhaustive()
    }
}

impl Srq {
    pub(crate) fn create(
        pd: &Arc<Pd>,
        max_wr: u32,
        max_sge: u32,
        limit: u32,
    ) -> Result<Srq, VerbsError> {
        let ctx = pd.context();
        let invalid = |what: String| VerbsError::InvalidArgument {
            device: ctx.name().to_string(),
            verb: "create_srq",
            what,
        };
        if max_wr == 0 {
            return Err(invalid(
                "max_wr 0: an SRQ holds at least one receive".into(),
            ));
        }
        if limit > max_wr {
            return Err(invalid(format!("limit {limit} exceeds max_wr {max_wr}")));
        }
        let raw = ctx.provider().create_srq(&SrqRequest {
            pd: pd.handle(),
            max_wr,
            max_sge,
            limit,
        })?;
        if !raw.wqe_cnt.is_power_of_two()
            || raw.wqe_cnt < 2
            || raw.wqe_cnt > 1 << 16
            || !raw.stride.is_power_of_two()
            || raw.stride < 32
        {
            ctx.released("destroy_srq", ctx.provider().destroy_srq(raw.handle));
            return Err(invalid(format!(
                "SRQ ring of {} x {} bytes",
                raw.wqe_cnt, raw.stride
            )));
        }
        let queue = Arc::new(SharedRecvQueue::new(SrqParts {
            ring: raw.buf,
            slots: raw.wqe_cnt,
            stride: raw.stride,
            dbrec: raw.dbrec.cast::<AtomicU32>(),
            max_sge: max_sge.max(1),
            pd: pd.id(),
            keys: ctx.keys().clone(),
            device: ctx.device_arc(),
        }));
        Ok(Srq {
            shared: Arc::new(SrqShared {
                pd: pd.clone(),
                handle: raw.handle,
                queue,
            }),
        })
    }

    pub(crate) fn shared(&self) -> &Arc<SrqShared> {
        &self.shared
    }

    /// The provider's handle (what its limit events name).
    pub fn handle(&self) -> Handle {
        self.shared.handle
    }

    /// The PD.
    pub fn pd(&self) -> &Arc<Pd> {
        &self.shared.pd
    }

    /// Validates and posts one receive (thread-safe: the SRQ takes its own lock).
    pub fn post_recv(&self, wr: &RecvWr) -> Result<(), PostError> {
        self.shared.queue.post(wr)
    }

    /// Receives posted and not completed.
    pub fn outstanding(&self) -> u32 {
        self.shared.queue.outstanding()
    }

    /// Sets the limit: non-zero arms it (an event when the receives left drop below it),
    /// zero disarms it. It must not exceed the receives the SRQ holds.
    pub fn modify_limit(&self, limit: u32) -> Result<(), VerbsError> {
        let max_wr = self.shared.queue.capacity();
        if limit > max_wr {
            return Err(VerbsError::InvalidArgument {
                device: self.shared.pd.context().name().to_string(),
                verb: "modify_srq",
                what: format!("limit {limit} exceeds max_wr {max_wr}"),
            });
        }
        let ctx = self.shared.pd.context();
        ctx.provider().modify_srq(self.shared.handle, limit)
    }

    /// What it holds and its limit.
    pub fn query(&self) -> Result<SrqAttr, VerbsError> {
        let ctx = self.shared.pd.context();
        Ok(SrqAttr {
            max_wr: self.shared.queue.capacity(),
            max_sge: self.shared.queue.max_sge(),
            limit: ctx.provider().query_srq(self.shared.handle)?,
        })
    }

    /// How many QPs (and this handle's clones) still hold it: an SRQ with QPs on it is busy.
    pub fn users(&self) -> usize {
        Arc::strong_count(&self.shared)
    }
}

impl Pd {
    /// Creates a shared receive queue holding `max_wr` receives of `max_sge` entries, its
    /// limit armed at `limit` when non-zero.
    pub fn create_srq(
        self: &Arc<Self>,
        max_wr: u32,
        max_sge: u32,
        limit: u32,
    ) -> Result<Srq, VerbsError> {
        Srq::create(self, max_wr, max_sge, limit)
    }
}
