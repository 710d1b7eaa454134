//! A testbed of network namespaces for failure testing: two hosts with two NICs each on two
//! rail switches, failure injection with `ip link`, and scenarios that reproduce the SHIFT
//! paper's evaluation with JSON results and plots.
//!
//! - [`topology`]: build and remove the namespaces, veths and bridges; the address plan.
//! - [`scenario`]: the paper's scenarios: an app pair under a failure schedule.
//! - [`chaos`]: both rails failing at random, overlapping; losses judged against the outage
//!   tolerance.
//! - [`sweep`]: one scenario at several QP counts, `all_on_backup_ms` against QPs.
//! - [`idle_lat`]: write latency beside 1,000 idle resilient QPs against alone.
//! - [`stock`]: stock verbs tools with the railshift shim across a NIC cut.
//! - [`apprun`]: running an app pair across the hosts.
//! - [`baseline`]: the medium measured between the hosts, for ratios.
//! - [`target`]: what can fail (NICs and switch ports of either rail, both default NICs at
//!   once, a device that dies silently), by name, and the sets schedules draw from.
//! - [`schedule`]: failure schedules (once, flapping, random with overlap), seeded.
//! - [`fail`]: executing a schedule against the clock, every action logged.
//! - [`faults`]: the fault channel through which an application injects a device fault.
//! - [`paths`]: which rails had a path between the hosts when, from the failure log.
//! - [`linkwatch`]: when the kernel reported each rail link running, during a run.
//! - [`report`]: scenario figures from an app report and the failure log.
//! - [`plot`]: the bandwidth timeline as a PNG with failure windows.
//! - [`netns`]: run code of this process inside one of the namespaces.
//! - [`medium`]: raw UDP ping-pong and stream between namespaces, the baselines.
//! - [`ip`]: the `ip` commands everything above is made of.

pub mod apprun;
pub mod baseline;
pub mod chaos;
pub mod fail;
pub mod faults;
pub mod idle_lat;
pub mod ip;
pub mod linkwatch;
pub mod medium;
pub mod netns;
pub mod paths;
pub mod phases;
pub mod plot;
pub mod report;
pub mod scenario;
pub mod schedule;
pub mod stock;
pub mod sweep;
pub mod target;
pub mod topology;

/// Prints this process's warnings and errors (the pmd's among them) on stderr, or what
/// `RUST_LOG` asks for: what the testbed's and the benches' binaries set up first.
pub fn log_to_stderr() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
}
