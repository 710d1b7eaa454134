//! SHIFT failover of one resilient connection end, as a sans-IO state machine.
//!
//! A resilient connection pairs a default QP on the default device with a backup QP on a
//! backup device at each end, plus a control QP on the backup devices. [`Failover`] decides;
//! the driver acts. The driver reports [`Event`]s (an error completion, a link change, a
//! control message from the peer, the result of an action, a timer tick) with the current
//! time, and performs the [`Action`]s the machine returns (drain completions, copy WQEs
//! between rings, send a control message, move a QP to ERR, bring it up, release a withheld
//! doorbell, surface an error). Between events the driver routes application WRs by
//! [`Failover::send_route`] and [`Failover::recv_route`].
//!
//! The send queue has the paper's four states (Default, Fallback, WaitSignaled,
//! WaitDrained) plus the failover round between Default and Fallback; the receive queue has
//! Default and Fallback plus the switch back. The protocol, its message formats and what it
//! does and does not guarantee are in `docs/failover.md`; `tests/model_check.rs` checks it
//! exhaustively within stated bounds against a model of two hosts with two NICs each.

mod action;
mod config;
mod event;
mod machine;
mod message;
mod observation;
pub mod plan;
mod status;
mod time;
mod vocab;

#[cfg(test)]
mod tests;

pub use action::{Action, Route};
pub use config::{
    rc_retry_budget, BackupEpoch, ChannelEpoch, Config, Epoch, Role, DEFAULT_OUTAGE_TOLERANCE,
    EPOCH_PSN_STRIDE,
};
pub use event::{Event, Progress};
pub use machine::{Actions, DefaultQpPhase, Failover, RecvPhase, SendPhase, MAX_ACTIONS_PER_EVENT};
pub use message::{
    ControlMessage, ControlPacket, ControlRepr, MessageError, CONTROL_MESSAGE_LEN,
    MAX_FAILBACK_WAIT,
};
pub use observation::{Observation, RoundTrigger};
pub use status::{ErrorClass, WcStatus};
pub use time::Timestamp;
pub use vocab::{FailReason, Path, Side, SideEpoch};
