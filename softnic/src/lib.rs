//! softnic: a user-space RoCEv2 reliable-connection NIC that plays the part of a ConnectX.
//!
//! The driver writes mlx5-format work-queue entries into rings in memory and rings a doorbell;
//! softnic fetches them, moves the data over the wire with the InfiniBand RC protocol (as Linux
//! rxe does), and writes mlx5-format completion-queue entries. It speaks real RoCEv2 over a UDP
//! socket bound to a Linux netdev, or over an in-memory fabric that is deterministic from a seed
//! and can drop, duplicate, reorder, delay and corrupt packets for tests.
//!
//! Module map (see `docs/softnic.md`; the imports between these modules run one way, mapped in
//! `docs/architecture.md`):
//! - the device and its control verbs: [`device`], [`qp_attr`] (QP states and attributes),
//!   [`mr`] (PDs, MR table), [`cq`] (CQ ring and events), [`qp`] (rings, doorbell register),
//!   [`srq`] (shared receive queues), [`memory`] (caller-supplied queue memory), [`events`] (async events), [`counters`];
//! - time and progress: [`clock`], the engine (`engine`, one round of work and the auto-mode
//!   thread), the wake-up path (`waker`);
//! - the RC transport: `requester`, `completer`, `responder` (with `congestion`, each QP's
//!   window), over the decoded packet view in
//!   `packet`, the fetched send WQE in `wqe`, a CQE's contents in `cqe`, and the hw-defs
//!   layouts behind `codec`; `dma` moves bytes to and from registered memory; `tx` batches a
//!   round's sends;
//! - wires: `wire` (packet buffers, batches, link state: what every wire speaks), `medium` (the
//!   device's wire as one type), [`fabric`] (in-memory, seeded faults), `udp` (sockets on a
//!   netdev), [`netlink`] (link state), `trace` (pcap);
//! - `harness` (feature `harness`): a small mlx5 driver for tests and benchmarks.

pub mod clock;
mod codec;
mod completer;
mod congestion;
pub mod counters;
pub mod cq;
mod cqe;
pub mod device;
mod dma;
mod engine;
mod eth_tx;
pub mod events;
pub mod fabric;
mod medium;
pub mod memory;
pub mod mr;
pub mod netlink;
mod packet;
mod path_budget;
pub mod qp;
pub mod qp_attr;
mod requester;
mod resources;
mod responder;
mod rx_ring;
mod send_batch;
pub mod srq;
mod trace;
mod tx;
mod ud;
mod udp;
mod waker;
mod wire;
mod wqe;

#[cfg(feature = "harness")]
pub mod harness;

pub use clock::Clock;
pub use counters::{Counters, NakCounts};
pub use cq::{CompletionChannel, CqConfig, CqHandle, CqId};
pub use device::{
    Device, DeviceConfig, DeviceError, MrKeys, ProgressMode, QpHandle, SendPath, Wire,
};
pub use engine::Activity;
pub use events::{AsyncEvent, EventQueue};
pub use fabric::{Fabric, FabricStats, Fault, FaultRule};
pub use memory::QueueMemory;
pub use mr::{Access, PdId, RegError};
pub use qp::{DoorbellRegister, QpConfig, RetransmitProbe};
pub use qp_attr::{ModifyError, PathMtu, QpAttrs, QpState, QpType};
pub use srq::{SrqConfig, SrqId};
pub use ud::GRH_LEN;
pub use udp::rxe_source_port;
pub use waker::EventFd;
pub use wire::{PortState, ROCE_PORT};
