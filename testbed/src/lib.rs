//! A testbed of network namespaces for failure testing: two hosts with two NICs each on two
//! rail switches, failure injection with `ip link`, and scenarios that reproduce the SHIFT
//! paper's evaluation with JSON results and plots.
