//! A testbed of network namespaces for failure testing: two hosts with two NICs each on two
//! rail switches, failure injection with `ip link`, and scenarios that reproduce the SHIFT
//! paper's evaluation with JSON results and plots.
//!
//! - [`topology`]: build and remove the namespaces, veths and bridges; the address plan.
//! - [`scenario`]: the paper's scenarios: an app pair under a failure schedule.
//! - [`apprun`]: running an app pair across the hosts.
//! - [`baseline`]: the medium measured between the hosts, for ratios.
//! - [`fail`]: failure schedules (once, flapping, random) and their execution, logged.
//! - [`report`]: scenario figures from an app report and the failure log.
//! - [`plot`]: the bandwidth timeline as a PNG with failure windows.
//! - [`netns`]: run code of this process inside one of the namespaces.
//! - [`medium`]: raw UDP ping-pong and stream between namespaces, the baselines.
//! - [`ip`]: the `ip` commands everything above is made of.

pub mod apprun;
pub mod baseline;
pub mod fail;
pub mod ip;
pub mod medium;
pub mod netns;
pub mod plot;
pub mod report;
pub mod scenario;
pub mod topology;
