//! The datapath: building WQEs, ringing doorbells, posting receives and polling completions,
//! over the mlx5 layouts of `hw-defs`. No locks, no allocation, no dynamic dispatch per
//! operation; every barrier says why it is there (`docs/datapath.md` walks one WRITE through).
//!
//! - [`wr`]: work requests, work completions and post errors;
//! - [`sq`]: the send queue (post, doorbell), and in [`sq::raw`] the raw WQE access and key
//!   rewriting only the failover layer uses;
//! - [`rq`]: the receive queue; [`srq`]: the shared receive queue, the one queue with a lock
//!   (posts and the completions of several QPs' CQs meet in it, as in libmlx5);
//! - [`cq`]: the CQ poller;
//! - [`doorbell`]: the doorbell register (mlx5 UAR/BlueFlame or softnic);
//! - [`barrier`]: the memory barriers, named after rdma-core's;
//! - [`gate`]: the one word a post reads for the QP's state, the key epoch and a hold;
//! - [`track`]: per-WQE bookkeeping shared by a queue and its CQ.

pub mod barrier;
pub mod cq;
pub mod doorbell;
pub mod gate;
pub mod rq;
pub mod sq;
pub mod srq;
pub mod track;
pub mod wr;

#[cfg(test)]
mod tests;
