//! What stops a tool, as one line for the user.

use crate::exchange::ExchangeError;

/// Why a tool stopped.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// A device could not be opened.
    #[error("cannot open device {device}: {reason}")]
    Device {
        /// The name given.
        device: String,
        /// Why.
        reason: String,
    },
    /// A control verb failed.
    #[error("{0}")]
    Verbs(String),
    /// The resilient QP's backup side could not be set up.
    #[error("failover setup: {0}")]
    Failover(String),
    /// The out-of-band exchange failed.
    #[error(transparent)]
    Exchange(#[from] ExchangeError),
    /// The peer sent something unusable.
    #[error("peer: {0}")]
    Peer(String),
    /// A work request was refused at post time.
    #[error("post failed: {0}")]
    Post(#[from] pmd::PostError),
    /// A work request completed in error.
    #[error("work completion error: {status:?} (vendor syndrome {vendor:#x}) on {what}{detail}")]
    Completion {
        /// The status.
        status: pmd::WcStatus,
        /// The vendor syndrome.
        vendor: u8,
        /// Which operation.
        what: String,
        /// The failover's account of it (resilient QPs).
        detail: String,
    },
    /// A flag's value cannot be used (a fault channel that cannot be opened).
    #[error("{0}")]
    Usage(String),
    /// The data check found a difference (allreduce: a wrong sum).
    #[error("data check failed: {0}")]
    Check(String),
    /// The run made no progress.
    #[error("no completion for {0:?}: the peer or the path is gone")]
    Stalled(std::time::Duration),
    /// A report file could not be written.
    #[error("cannot write {path}: {reason}")]
    Output {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
}
