//! RoCEv2 on the wire: the IP, UDP and InfiniBand transport headers, whole packets and
//! datagrams, the ICRC, and PSN arithmetic.
//!
//! - network: [`ipv4`], [`ipv6`], [`udp`] (port 4791), and [`ethernet`] for captures;
//! - transport: [`bth`], [`reth`], [`aeth`], [`immdt`], [`atomic_eth`], [`atomic_ack_eth`],
//!   [`deth`] (UD), the RC and UD [`opcode`] table, and [`packet`] (BTH through ICRC);
//! - [`datagram`]: IP + UDP + packet with every length and checksum computed;
//! - [`frame`]: an Ethernet frame around a datagram, for packet traces;
//! - [`icrc`]: the invariant CRC as rxe computes it; [`psn`]: 24-bit sequence numbers.

pub mod aeth;
pub mod atomic_ack_eth;
pub mod atomic_eth;
pub mod bth;
mod checksum;
mod crc32;
pub mod datagram;
pub mod deth;
pub mod ethernet;
pub mod frame;
pub mod icrc;
pub mod immdt;
pub mod ipv4;
pub mod ipv6;
pub mod opcode;
pub mod packet;
pub mod psn;
pub mod reth;
pub mod udp;

pub use aeth::{AethRepr, NakCode, Syndrome as AethSyndrome};
pub use atomic_ack_eth::AtomicAckEthRepr;
pub use atomic_eth::AtomicEthRepr;
pub use bth::BthRepr;
pub use datagram::{DatagramRepr, IpRepr};
pub use deth::DethRepr;
pub use frame::FrameRepr;
pub use immdt::ImmDtRepr;
pub use opcode::{Opcode, Operation, Position};
pub use packet::{Packet, PacketRepr};
pub use psn::Psn;
pub use reth::RethRepr;
pub use udp::{UdpRepr, ROCEV2_PORT};
