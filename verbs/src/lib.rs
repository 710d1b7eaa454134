//! The libibverbs ABI over railshift's pmd: `librailshift_verbs.so`.
//!
//! Loaded with `LD_PRELOAD` in front of the system libibverbs, it defines the exported verbs
//! functions a program calls. Devices named in `RAILSHIFT_DEVICES` (see [`config`]) come first
//! in `ibv_get_device_list`; every call on one of their objects runs on the pmd, every call on
//! another object goes to the system library untouched ([`real`]). The data-path verbs are
//! static inline functions in `verbs.h` that call through the context's ops table, which
//! [`objects`] fills. `docs/verbs.md` has the table of entry points.
//!
//! | module | job |
//! | --- | --- |
//! | [`abi`] | the `verbs.h` structs and constants, with the layouts `tests/layouts.rs` checks |
//! | [`config`] | `RAILSHIFT_DEVICES`, `RAILSHIFT_PROGRESS`, the rendezvous variables |
//! | [`device`] | the device list, open/close, the query verbs, async events |
//! | [`faults`] | `RAILSHIFT_FAULT_FIFO`: fault commands for this process's devices (tests) |
//! | [`lock`] | the CQ's mutex, without std's poison flag |
//! | [`objects`] | PD, MR, CQ, completion channel, QP; post, poll and notify for the ops table |
//! | [`real`] | the system's definitions by `dlvsym(RTLD_NEXT, ...)` |
//! | [`srq`] | shared receive queues on plain devices: create, modify, query, destroy, `post_srq_recv` |
//! | [`resilient`] | devices with a backup: resilient QPs, the rendezvous, CQs gathering their completions |
//! | [`util`] | errno, the once-per-verb refusal line, logging |

pub mod abi;
pub mod config;
pub mod device;
pub mod faults;
pub mod lock;
pub mod objects;
pub mod real;
pub mod resilient;
pub mod srq;
pub mod util;
