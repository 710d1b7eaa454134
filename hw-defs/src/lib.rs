//! Hardware and wire layouts for railshift, and nothing else.
//!
//! This crate describes bytes: the mlx5 send and receive work-queue entries, completion-queue
//! entries and doorbell records that the driver and a ConnectX (or the softnic) exchange through
//! memory, and the RoCEv2 headers, ICRC and 24-bit PSN arithmetic that cross the wire. Each
//! layout is a typed view over a byte buffer in the style of smoltcp's `wire` module: a
//! `new_checked` constructor that validates the length once, getters and setters that cannot
//! panic afterwards, and a `Repr` that parses and emits. No I/O, no threads, no dependencies.
