//! The paper's scenarios on the testbed: a failure injected under traffic between the two
//! hosts, with and without failover, measured against the medium in the same run.
//!
//! - [`options`]: what a run is parameterised by ([`ScenarioOptions`]) and each scenario's
//!   defaults and failure schedule;
//! - [`run`](mod@run): the app pair under the schedule, and the medium for ratios;
//! - [`verdict`]: the correctness verdict and the goals;
//! - [`print`]: the summary, the timeline and the plot.

pub mod options;
pub mod print;
pub mod run;
pub mod verdict;

pub use options::{scenario_slug, Op, ScenarioName, ScenarioOptions, Variants, DEFAULT_OVERLAP};
pub use print::{plot, print_summary, print_timeline};
pub use run::{Ratios, RunResult, ScenarioError};
pub use verdict::{Goals, ScenarioResult};

use crate::fail::LogEntry;
use crate::topology::TestbedInfo;

/// Runs scenario `o` on the testbed `info` and judges its runs; `on_log` sees every failure
/// action as it is taken.
pub fn run(
    info: &TestbedInfo,
    o: &ScenarioOptions,
    on_log: &mut (dyn FnMut(&LogEntry) + Send),
) -> Result<ScenarioResult, ScenarioError> {
    let runs = run::run_variants(info, o, on_log)?;
    Ok(ScenarioResult::of_runs(o, runs))
}
