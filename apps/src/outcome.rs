//! What a run hands back, and the report fields every tool fills the same way: the vocabulary
//! [`crate::run`] and [`crate::allreduce`] share, so neither imports the other for it.

use crate::cli::Options;
use crate::error::AppError;
use crate::report::Report;

/// How a run ended.
#[derive(Debug)]
pub struct RunOutcome {
    /// The report (also written with `--json`).
    pub report: Report,
    /// The error that stopped it, if any.
    pub error: Option<AppError>,
}

/// The report's fixed fields.
pub fn base_report(o: &Options) -> Report {
    Report {
        tool: o.tool.name().to_owned(),
        version: 1,
        role: if o.is_server() { "server" } else { "client" }.to_owned(),
        device: o.device.clone(),
        backup_device: o.flags.backup_dev.clone(),
        failover_enabled: o.failover_enabled(),
        progress: crate::session::progress_name(o).to_owned(),
        op: o.tool.op().to_owned(),
        qps: o.flags.qps,
        bidirectional: o.flags.bidirectional,
        idle_qps: o.flags.idle_qps,
        table_from: "self".to_owned(),
        ..Report::default()
    }
}
