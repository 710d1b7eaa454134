//! softnic: a user-space RoCEv2 reliable-connection NIC that plays the part of a ConnectX.
//!
//! The driver writes mlx5-format work-queue entries into rings in memory and rings a doorbell;
//! softnic fetches them, moves the data over the wire with the InfiniBand RC protocol (as Linux
//! rxe does), and writes mlx5-format completion-queue entries. It speaks real RoCEv2 over a UDP
//! socket bound to a Linux netdev, or over an in-memory fabric that is deterministic from a seed
//! and can drop, duplicate, reorder, delay and corrupt packets for tests.
