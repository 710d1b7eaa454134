//! Asynchronous events (`ibv_get_async_event`): a queue the driver reads, with an eventfd to
//! wait on.

use std::collections::VecDeque;
use std::sync::Mutex;

use crate::cq::CqId;
use crate::srq::SrqId;
use crate::waker::EventFd;

/// An asynchronous event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AsyncEvent {
    /// The port's link came up (`IBV_EVENT_PORT_ACTIVE`).
    PortActive,
    /// The port's link went down (`IBV_EVENT_PORT_ERR`).
    PortError,
    /// A QP hit an error no CQE can report, e.g. its CQ overran (`IBV_EVENT_QP_FATAL`).
    QpFatal {
        /// The QP.
        qpn: u32,
    },
    /// A responder QP met a request that violated access rules (`IBV_EVENT_QP_ACCESS_ERR`).
    QpAccessError {
        /// The QP.
        qpn: u32,
    },
    /// A CQ overran (`IBV_EVENT_CQ_ERR`).
    CqError {
        /// The CQ.
        cq: CqId,
    },
    /// The receives left on an SRQ dropped below its armed limit; the limit is disarmed
    /// (`IBV_EVENT_SRQ_LIMIT_REACHED`).
    SrqLimitReached {
        /// The SRQ.
        srq: SrqId,
    },
    /// The device hit a fatal error and does nothing more (`IBV_EVENT_DEVICE_FATAL`): see
    /// [`Device::kill`](crate::Device::kill).
    DeviceFatal,
}

/// The queue of async events of one device.
#[derive(Debug)]
pub struct EventQueue {
    queue: Mutex<VecDeque<AsyncEvent>>,
    fd: EventFd,
}

impl EventQueue {
    pub(crate) fn new() -> std::io::Result<EventQueue> {
        Ok(EventQueue {
            queue: Mutex::new(VecDeque::new()),
            fd: EventFd::new()?,
        })
    }

    pub(crate) fn push(&self, event: AsyncEvent) {
        tracing::debug!(?event, "async event");
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(event);
        self.fd.signal();
    }

    /// The oldest unread event, if any.
    pub fn poll(&self) -> Option<AsyncEvent> {
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
    }

    /// Waits up to `timeout_ms` (-1: forever) for an event and returns it.
    pub fn wait(&self, timeout_ms: i32) -> Option<AsyncEvent> {
        if let Some(e) = self.poll() {
            return Some(e);
        }
        self.fd.wait(timeout_ms);
        self.poll()
    }

    /// The eventfd, readable while events may be queued.
    pub fn fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.fd.as_raw_fd()
    }
}
