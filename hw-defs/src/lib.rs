//! Hardware and wire layouts for railshift, and nothing else.
//!
//! This crate describes bytes: the mlx5 send and receive work-queue entries, completion-queue
//! entries and doorbell records that the driver and a ConnectX (or the softnic) exchange through
//! memory, and the RoCEv2 headers, ICRC and 24-bit PSN arithmetic that cross the wire. Each
//! layout is a typed view over a byte buffer in the style of smoltcp's `wire` module: a
//! `new_checked` constructor that validates the length once, getters and setters that cannot
//! panic afterwards, and a `Repr` that parses and emits. No I/O, no threads, no dependencies.
//!
//! - [`mlx5`]: send WQE segments, receive WQEs, CQEs, doorbell records, and the layout table
//!   that the `rdma-core-check` feature compares against `infiniband/mlx5dv.h`.
//! - [`verbs`]: libibverbs' work-completion status numbering.
//! - [`roce`]: IPv4, IPv6, UDP, the InfiniBand transport headers, the RC opcode table, whole
//!   packets after UDP, ICRC as Linux rxe computes it, and PSN arithmetic.
//! - [`pcap`]: a pcap file writer and an Ethernet frame builder for packet traces.
//!
//! `docs/hw-defs.md` records the decisions taken where the specs are silent.

#![forbid(unsafe_code)]

/// Declares a `u8`-like enum with an `Unknown` arm, convertible both ways.
///
/// `Unknown(v)` for a `v` that has a named variant converts to the same number as that variant;
/// parsers never produce it.
macro_rules! enum_with_unknown {
    (
        $(#[$attr:meta])*
        pub enum $name:ident($ty:ty) {
            $( $(#[$vattr:meta])* $variant:ident = $value:expr ),+ $(,)?
        }
    ) => {
        $(#[$attr])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vattr])* $variant, )+
            /// A value this crate does not name.
            Unknown($ty),
        }

        impl From<$ty> for $name {
            fn from(value: $ty) -> Self {
                match value {
                    $( $value => $name::$variant, )+
                    other => $name::Unknown(other),
                }
            }
        }

        impl From<$name> for $ty {
            fn from(value: $name) -> Self {
                match value {
                    $( $name::$variant => $value, )+
                    $name::Unknown(other) => other,
                }
            }
        }
    };
}

/// Declares a fixed-size view type: the struct, `new_unchecked`, `new_checked`, `check_len`
/// and `into_inner`. The accessors are written by hand beside it.
macro_rules! fixed_view {
    ($(#[$attr:meta])* $name:ident, $size:expr, $layout:expr) => {
        $(#[$attr])*
        #[derive(Debug, Clone)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Wraps `buffer` without checking its length; accessors panic if it is too short.
            pub const fn new_unchecked(buffer: T) -> Self {
                $name { buffer }
            }

            /// Wraps `buffer` after checking it holds the whole layout.
            pub fn new_checked(buffer: T) -> Result<Self, $crate::Error> {
                let view = Self::new_unchecked(buffer);
                view.check_len()?;
                Ok(view)
            }

            /// Checks the buffer holds the whole layout.
            pub fn check_len(&self) -> Result<(), $crate::Error> {
                $crate::error::check_len($layout, self.buffer.as_ref(), $size)
            }

            /// Returns the underlying buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }
        }
    };
}

mod bytes;
mod error;
pub mod mlx5;
pub mod pcap;
pub mod roce;
pub mod verbs;

pub use error::Error;
