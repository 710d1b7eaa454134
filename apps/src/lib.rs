//! railshift's perftest-style tools and collective workload (`docs/apps.md`).
//!
//! Each binary (`shift_write_bw`, `shift_write_lat`, ...) is a thin `main` over
//! [`run::main`]; everything else is here, shared:
//!
//! | module | job |
//! | --- | --- |
//! | [`allreduce`] | `shift_allreduce`: the ring, NCCL-Simple-like steps, verification |
//! | [`cli`] | the flags (perftest's names where they mean the same) and their defaults |
//! | [`exchange`] | the versioned out-of-band TCP exchange and the run's control messages |
//! | [`endpoint`] | devices, buffers and QPs: plain, or resilient with `--backup-dev` |
//! | [`session`] | setting up one connection; the idle policy; perftest's header block |
//! | [`bw`] | bandwidth tools (WRITE, SEND, READ, FETCH_ADD) and their server; `--check` |
//! | [`lat`] | latency tools, HdrHistogram, the `.hgrm` file |
//! | [`perftest_exchange`] | stock perftest's out-of-band exchange (`--perftest-peer`) |
//! | [`pattern`] | the data patterns `--check` writes and verifies |
//! | [`faults`] | the fault channel (`--fault-fifo`): device faults the testbed asks for |
//! | [`report`] | the JSON report (`docs/apps-json.md`), timeline, failover summary, tables |
//! | [`outcome`] | what a run hands back; the report fields every tool fills |
//! | [`row`] | a result row's figures as they travel to the peer and print |
//! | [`run`] | parse, run, report, exit code |
//! | [`wall_clock`] | wall-clock milliseconds since the epoch, for reports and the fault log |
//! | [`verbosity`] | everything on stdout, or one figure (`--output`) |
//! | [`error`] | what stops a tool, as one line |

/// `println!`, unless the tool prints one figure only (perftest's `--output`).
macro_rules! say {
    ($($arg:tt)*) => {
        if !$crate::verbosity::quiet() {
            println!($($arg)*)
        }
    };
}

pub mod allreduce;
pub mod bw;
pub mod cli;
pub mod endpoint;
pub mod error;
pub mod exchange;
pub mod faults;
pub mod lat;
pub mod outcome;
pub mod pattern;
pub mod perftest_exchange;
pub mod rc_ops;
pub mod rc_pingpong;
pub mod report;
pub mod row;
pub mod run;
pub mod service_pacer;
pub mod session;
pub mod verbosity;
pub mod wall_clock;

pub use cli::Tool;
pub use error::AppError;
