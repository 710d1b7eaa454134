//! railshift's poll-mode driver.
//!
//! Providers (the softnic and, behind the `mlx5` feature, ConnectX NICs through rdma-sys and
//! mlx5dv) hand the driver raw queue memory; the driver writes work-queue entries, rings
//! doorbells and polls completions itself on pinned lcores. The SHIFT failover layer builds on
//! the same datapath to move in-flight work to a backup NIC when the default one fails.
//!
//! Module map (`docs/pmd.md` has the longer version):
//!
//! | module | job |
//! | --- | --- |
//! | [`name`] | device names: `soft:<netdev>[@<addr>]`, `fabric:<name>/<port>`, `mlx5:<ibdev>` |
//! | [`provider`] | the provider trait and the raw queue memory providers hand out |
//! | [`control`] | Context, PD, MR, CQ, QP; Drop that never panics |
//! | [`qp_state`] | the QP state transition table |
//! | [`verbs`] | access flags, GIDs, MTUs, QP attributes and capabilities |
//! | [`datapath`] | post, doorbell, post_recv, poll; barriers |
//! | [`keys`] | the lock-free lkey table the datapath validates against |
//! | [`memory`] | hugepage-backed pool for rings and registered buffers |
//! | [`lcore`] | pinned threads, the service lcore, the idle policy of a poll loop |
//! | [`netdev_watch`] | a netdev's link through rtnetlink (`netdev-link`): a ConnectX's link watch |
//! | [`faults`] | the fault channel: a FIFO of commands that make this process's devices fail |
//! | [`failover`] | the SHIFT failover protocol as a sans-IO state machine (`docs/failover.md`) |
//! | [`resilient`] | resilient QPs: the failover machine's driver, shadow verbs, rendezvous, the failover service |

pub mod control;
pub mod datapath;
pub mod failover;
pub mod faults;
pub mod keys;
pub mod lcore;
pub mod memory;
pub mod name;
pub mod netdev_watch;
pub mod provider;
pub mod qp_state;
pub mod resilient;
pub mod verbs;

pub use control::{
    Context, ContextConfig, Cq, ModifyError, Mr, OpenError, Pd, Qp, QpHandle, RegisteredBuffer,
    Srq, SrqAttr,
};
pub use datapath::wr::{
    BatchPostError, CompletionLayout, FastSend, Payload, PostError, RecvWr, Remote, SendFlags,
    SendOp, SendWr, SgList, Sge, WcOpcode, WcStatus, WorkCompletion,
};
pub use name::DeviceName;
pub use qp_state::QpState;
pub use verbs::{
    random_psn, Access, AddressVector, Gid, Mtu, QpAttr, QpCaps, QpType, UdAddress, UD_GRH_LEN,
};
