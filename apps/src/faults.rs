//! The fault channel (`--fault-fifo`, `docs/apps-json.md` "Fault channel"): the pmd's
//! [`pmd::faults::FaultChannel`], with what each command did going into the JSON report
//! (`faults`).

use std::path::Path;
use std::sync::Arc;

use pmd::faults::FaultRecord;
use pmd::Context;
use serde::Serialize;

use crate::error::AppError;

/// What the tool did with one command of its fault channel.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct FaultJson {
    /// The line as read, without the newline.
    pub command: String,
    /// When the tool read it (Unix milliseconds).
    pub received_unix_ms: f64,
    /// When the fault was in place; `None` if it was not applied.
    pub applied_unix_ms: Option<f64>,
    /// Why it was not applied.
    pub error: Option<String>,
}

impl From<FaultRecord> for FaultJson {
    fn from(r: FaultRecord) -> FaultJson {
        FaultJson {
            command: r.command,
            received_unix_ms: r.received_unix_ms,
            applied_unix_ms: r.applied_unix_ms,
            error: r.error,
        }
    }
}

/// The open fault channel and its reader thread.
pub struct FaultChannel(pmd::faults::FaultChannel);

impl FaultChannel {
    /// Opens the FIFO at `path` (made with mode 0600 when nothing is there) and starts
    /// reading it.
    pub fn open(path: &Path) -> Result<FaultChannel, AppError> {
        pmd::faults::FaultChannel::open(path)
            .map(FaultChannel)
            .map_err(|e| AppError::Usage(format!("--fault-fifo {e}")))
    }

    /// Makes the device opened as `name` reachable by commands.
    pub fn register(&self, name: &str, ctx: &Arc<Context>) {
        self.0.register(name, ctx);
    }

    /// Stops reading; what every command read did, oldest first.
    pub fn finish(self) -> Vec<FaultJson> {
        self.0.finish().into_iter().map(FaultJson::from).collect()
    }
}
