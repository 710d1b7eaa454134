//! A testbed of network namespaces for failure testing: two hosts with two NICs each on two
//! rail switches, failure injection with `ip link`, and scenarios that reproduce the SHIFT
//! paper's evaluation with JSON results and plots.
//!
//! - [`topology`]: build and remove the namespaces, veths and bridges; the address plan.
//! - [`baseline`]: the medium measured between the hosts, for ratios.
//! - [`fail`]: failure schedules (once, flapping, random) and their execution, logged.
//! - [`report`]: scenario figures from an app report and the failure log.
//! - [`plot`]: the bandwidth timeline as a PNG with failure windows.
//! - [`netns`]: run code of this process inside one of the namespaces.
//! - [`medium`]: raw UDP ping-pong and stream between namespaces, the baselines.
//! - [`ip`]: the `ip` commands everything above is made of.

pub mod baseline;
pub mod fail;
pub mod ip;
pub mod medium;
pub mod netns;
pub mod plot;
pub mod report;
pub mod topology;
