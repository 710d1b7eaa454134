//! Control objects: the device context, protection domains, memory regions, completion
//! queues, queue pairs and shared receive queues. Children hold their parents by `Arc`, so a parent outlives every
//! object made from it; each `Drop` releases its object and never panics: a device that
//! refuses (a dead NIC) gets its failure logged and counted in [`ControlStats`].

mod context;
mod cq;
mod pd;
mod qp;
mod srq;

pub use context::{Context, ContextConfig, ControlStats, OpenError};
pub use cq::Cq;
pub use pd::{Mr, Pd, RegisteredBuffer};
pub use qp::{ModifyError, Qp, QpHandle, SavedAttrs};
pub use srq::{Srq, SrqAttr};

#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;
