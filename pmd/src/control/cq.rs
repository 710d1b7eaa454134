//! Completion queues.

use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use std::time::Duration;

use crate::datapath::cq::{Attachments, CompletionQueue, CqRing};
use crate::datapath::wr::{as_slots, CompletionLayout, WorkCompletion};
use crate::provider::{CompletionEvents, CqRequest, Handle, VerbsError};

use super::Context;

/// The control half of a CQ, shared with the QPs that complete into it; destroys the CQ when
/// the last of them goes.
pub(crate) struct CqShared {
    pub ctx: Arc<Context>,
    pub handle: Handle,
    pub cqn: u32,
    pub events: Option<Arc<dyn CompletionEvents>>,
    pub attachments: Arc<Attachments>,
    /// The ring, read (owner bytes only) to bound a reset QP's stale CQEs.
    pub ring: CqRing,
}

impl CqShared {
    /// `qpn` stopped producing CQEs (reset or destroyed on the device): have the poller drop
    /// the ones still in the ring before it reads on. The driver polls this CQ itself, so no
    /// one else cleans it: libmlx5 skips DV-owned CQs, and the softnic never cleans.
    pub fn clean(&self, qpn: u32) {
        self.attachments.request_clean(qpn, self.ring.produced());
    }
}

impl Drop for CqShared {
    fn drop(&mut self) {
        self.ctx
            .released("destroy_cq", self.ctx.provider().destroy_cq(self.handle));
    }
}

/// A completion queue: the poller (hot) and its control half.
pub struct Cq {
    poller: CompletionQueue,
    shared: Arc<CqShared>,
}

impl std::fmt::Debug for Cq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cq")
            .field("device", &self.shared.ctx.name())
            .field("cqn", &self.shared.cqn)
            .field("poller", &self.poller)
            .finish()
    }
}

fn bad_geometry(ctx: &Context, what: String) -> VerbsError {
    VerbsError::InvalidArgument {
        device: ctx.name().to_string(),
        verb: "create_cq",
        what,
    }
}

impl Cq {
    pub(crate) fn create(ctx: &Arc<Context>, req: &CqRequest) -> Result<Cq, VerbsError> {
        let raw = ctx.provider().create_cq(req)?;
        let ring = CqRing::new(
            raw.buf,
            raw.cqe_cnt,
            raw.cqe_size,
            NonNull::cast::<AtomicU32>(raw.dbrec),
        );
        let shared = Arc::new(CqShared {
            ctx: ctx.clone(),
            handle: raw.handle,
            cqn: raw.cqn,
            events: raw.events.clone(),
            attachments: Arc::new(Attachments::default()),
            ring,
        });
        // A provider that hands out a ring we cannot poll safely is refused here (and the CQ
        // destroyed by `shared`'s drop), never trusted on the datapath.
        if !raw.cqe_cnt.is_power_of_two() || raw.cqe_cnt < req.entries {
            return Err(bad_geometry(
                ctx,
                format!(
                    "provider returned {} CQEs for {} asked",
                    raw.cqe_cnt, req.entries
                ),
            ));
        }
        if raw.cqe_size != 64 && raw.cqe_size != 128 {
            return Err(bad_geometry(
                ctx,
                format!("CQE size {} (expected 64 or 128)", raw.cqe_size),
            ));
        }
        let poller = CompletionQueue::new(ring, shared.attachments.clone());
        Ok(Cq { poller, shared })
    }

    /// Polls up to `wcs.len()` completions into `wcs`; returns how many.
    #[inline]
    pub fn poll(&mut self, wcs: &mut [WorkCompletion]) -> usize {
        self.poller.poll(wcs)
    }

    /// Polls; if nothing is there and the device progresses manually, runs one round of the
    /// device and polls again. This is how the polling lcore drives a manual-progress softnic
    /// from inside its poll loop (polling advances the device).
    #[inline]
    pub fn poll_with_progress(&mut self, wcs: &mut [WorkCompletion]) -> usize {
        self.poll_with_progress_into(as_slots(wcs))
    }

    /// [`Cq::poll`] into a caller's layout (the verbs shim's `ibv_wc`): writes the first `n`
    /// slots of `out`, which need not be initialised before, and returns `n`.
    #[inline]
    pub fn poll_into<L: CompletionLayout>(&mut self, out: &mut [MaybeUninit<L>]) -> usize {
        self.poller.poll_into(out)
    }

    /// [`Cq::poll_with_progress`] into a caller's layout ([`Cq::poll_into`]).
    #[inline]
    pub fn poll_with_progress_into<L: CompletionLayout>(
        &mut self,
        out: &mut [MaybeUninit<L>],
    ) -> usize {
        let n = self.poller.poll_into(out);
        if n > 0 || !self.shared.ctx.progress() {
            return n;
        }
        self.poller.poll_into(out)
    }

    /// Entries in the ring: at least what `create_cq` asked for (a provider may round up).
    pub fn capacity(&self) -> u32 {
        self.poller.capacity()
    }

    /// The CQ number.
    pub fn cqn(&self) -> u32 {
        self.shared.cqn
    }

    /// The device.
    pub fn context(&self) -> &Arc<Context> {
        &self.shared.ctx
    }

    /// The poller itself (ring, consumer index, statistics).
    pub fn poller(&mut self) -> &mut CompletionQueue {
        &mut self.poller
    }

    pub(crate) fn shared(&self) -> &Arc<CqShared> {
        &self.shared
    }

    /// Drops every CQE of `qpn` still in the ring now. Resetting or destroying a QP already
    /// has its CQEs dropped at the next poll; this is for callers that want it done at once.
    pub fn discard_qp(&mut self, qpn: u32) -> u32 {
        self.poller.discard_qp(qpn)
    }

    /// Arms completion events: the next CQE signals [`Cq::wait_event`]. An error if the CQ
    /// was created without events.
    pub fn arm(&self) -> Result<(), VerbsError> {
        self.events("arm_cq")?.arm()
    }

    /// Waits for a completion event, at most `timeout`; true if one came.
    pub fn wait_event(&self, timeout: Option<Duration>) -> Result<bool, VerbsError> {
        self.events("wait_event")?.wait(timeout)
    }

    /// The descriptor that becomes readable on a completion event (for epoll users), if the
    /// CQ was created with events.
    pub fn event_fd(&self) -> Option<std::os::fd::RawFd> {
        self.shared.events.as_ref().map(|e| e.fd())
    }

    fn events(&self, verb: &'static str) -> Result<&Arc<dyn CompletionEvents>, VerbsError> {
        self.shared
            .events
            .as_ref()
            .ok_or_else(|| VerbsError::InvalidArgument {
                device: self.shared.ctx.name().to_string(),
                verb,
                what: format!(
                    "CQ {:#x} was created without completion events",
                    self.shared.cqn
                ),
            })
    }
}
