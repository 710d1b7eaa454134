//! Benchmarks of the railshift datapath and of the wire, each printing a ratio against a
//! baseline measured in the same run.
//!
//! - `datapath` (`cargo run --release -p benches --bin datapath -- --json OUT.json`): ns per
//!   WQE posted (one at a time and in batches of 32), ns per CQE polled, and the floor of a
//!   64-byte copy into a ring slot, on the soft provider; and, counted by callgrind, the
//!   instructions per WQE and per CQE (`post_instr`, `poll_instr`).
//! - `control_verbs`: control-verb costs, plain against resilient (SHIFT figure 7).
//! - `qp_memory`: memory per CQ, plain QP and resilient QP, and for 1,000 (SHIFT section 6),
//!   with the backup side's parts (backup CQ, backup QP, control channel) beside them.
//! - `wire_baseline`: softnic over a veth next to the raw medium (UDP), in one run.
//! - `revoke`: revoke latency of a resilient lease against a plain QP's teardown, and how long
//!   a peer that ignores the revocation keeps succeeding, on the default and the backup path
//!   (`docs/failover.md` 9.9).

pub mod fabric;
pub mod instr;
pub mod report;
pub mod verbs_shim;
