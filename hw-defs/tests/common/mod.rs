//! Shared by the proptest suites: a seeded configuration and strategies for every `Repr`.
#![allow(dead_code)] // each suite uses its own subset

use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::{SystemTime, UNIX_EPOCH};

use hw_defs::roce::aeth::{AethRepr, Syndrome};
use hw_defs::roce::atomic_ack_eth::AtomicAckEthRepr;
use hw_defs::roce::atomic_eth::AtomicEthRepr;
use hw_defs::roce::bth::BthRepr;
use hw_defs::roce::immdt::ImmDtRepr;
use hw_defs::roce::ipv4::Ipv4Repr;
use hw_defs::roce::ipv6::Ipv6Repr;
use hw_defs::roce::packet::pad_for;
use hw_defs::roce::reth::RethRepr;
use hw_defs::roce::{
    DatagramRepr, FrameRepr, IpRepr, Opcode, PacketRepr, Psn, UdpRepr, ROCEV2_PORT,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

/// The proptest configuration: the seed comes from `PROPTEST_RNG_SEED` if set, else from the
/// clock, and is printed (the harness shows it when a test fails) so a failure replays with
/// `PROPTEST_RNG_SEED=<seed>`.
pub fn config() -> Config {
    let mut config = Config {
        failure_persistence: None,
        ..Config::default()
    };
    let seed = match config.rng_seed {
        RngSeed::Fixed(seed) => seed,
        RngSeed::Random => {
            let seed = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            config.rng_seed = RngSeed::Fixed(seed);
            seed
        }
    };
    eprintln!("proptest seed {seed} (replay with PROPTEST_RNG_SEED={seed})");
    config
}

/// A transport packet that owns its payload.
#[derive(Debug, Clone)]
pub struct OwnedPacket {
    pub bth: BthRepr,
    pub reth: Option<RethRepr>,
    pub atomic_eth: Option<AtomicEthRepr>,
    pub aeth: Option<AethRepr>,
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    pub immdt: Option<ImmDtRepr>,
    pub payload: Vec<u8>,
}

impl OwnedPacket {
    pub fn repr(&self) -> PacketRepr<'_> {
        PacketRepr {
            deth: None,
            bth: self.bth,
            reth: self.reth,
            atomic_eth: self.atomic_eth,
            aeth: self.aeth,
            atomic_ack_eth: self.atomic_ack_eth,
            immdt: self.immdt,
            payload: &self.payload,
        }
    }
}

pub fn known_opcode() -> impl Strategy<Value = Opcode> {
    (0u8..=0x14).prop_map(Opcode::from)
}

prop_compose! {
    pub fn bth(opcode: Opcode)(
        solicited: bool, mig_req: bool, pkey: u16, fecn: bool, becn: bool,
        dest_qp in 0u32..1 << 24, ack_req: bool, psn: u32,
    ) -> BthRepr {
        BthRepr {
            opcode, solicited, mig_req, pad_count: 0, pkey, fecn, becn, dest_qp, ack_req,
            psn: Psn::new(psn),
        }
    }
}

prop_compose! {
    pub fn reth()(va: u64, rkey: u32, dma_length: u32) -> RethRepr {
        RethRepr { va, rkey, dma_length }
    }
}

prop_compose! {
    pub fn atomic_eth()(va: u64, rkey: u32, swap_add: u64, compare: u64) -> AtomicEthRepr {
        AtomicEthRepr { va, rkey, swap_add, compare }
    }
}

prop_compose! {
    pub fn aeth()(syndrome: u8, msn in 0u32..1 << 24) -> AethRepr {
        AethRepr { syndrome: Syndrome::from(syndrome), msn }
    }
}

fn maybe<T: std::fmt::Debug + Clone>(
    present: bool,
    s: impl Strategy<Value = T>,
) -> impl Strategy<Value = Option<T>> {
    s.prop_map(move |v| present.then_some(v))
}

/// A packet of any known opcode with exactly the headers it calls for; the BTH pad count is
/// the one emit will write.
pub fn packet() -> impl Strategy<Value = OwnedPacket> {
    known_opcode().prop_flat_map(|opcode| {
        let payload_len = if opcode.has_payload() {
            0..300usize
        } else {
            0..1
        };
        (
            bth(opcode),
            maybe(opcode.has_reth(), reth()),
            maybe(opcode.has_atomic_eth(), atomic_eth()),
            maybe(opcode.has_aeth(), aeth()),
            maybe(
                opcode.has_atomic_ack_eth(),
                any::<u64>().prop_map(|orig_rem_dt| AtomicAckEthRepr { orig_rem_dt }),
            ),
            maybe(
                opcode.has_immediate(),
                any::<u32>().prop_map(|imm| ImmDtRepr { imm }),
            ),
            proptest::collection::vec(any::<u8>(), payload_len),
        )
            .prop_map(
                |(bth, reth, atomic_eth, aeth, atomic_ack_eth, immdt, payload)| OwnedPacket {
                    bth: BthRepr {
                        pad_count: pad_for(payload.len()),
                        ..bth
                    },
                    reth,
                    atomic_eth,
                    aeth,
                    atomic_ack_eth,
                    immdt,
                    payload,
                },
            )
    })
}

prop_compose! {
    pub fn ipv4()(
        src: [u8; 4], dst: [u8; 4], ttl: u8, dscp_ecn: u8, ident: u16, dont_frag: bool,
    ) -> IpRepr {
        IpRepr::Ipv4(Ipv4Repr {
            src_addr: Ipv4Addr::from(src), dst_addr: Ipv4Addr::from(dst), protocol: 17,
            payload_len: 0, ttl, dscp_ecn, ident, dont_frag,
        })
    }
}

prop_compose! {
    pub fn ipv6()(
        src: [u8; 16], dst: [u8; 16], hop_limit: u8, traffic_class: u8,
        flow_label in 0u32..1 << 20,
    ) -> IpRepr {
        IpRepr::Ipv6(Ipv6Repr {
            src_addr: Ipv6Addr::from(src), dst_addr: Ipv6Addr::from(dst), next_header: 17,
            payload_len: 0, hop_limit, traffic_class, flow_label,
        })
    }
}

/// An IP header of either family, a source port, and a packet.
pub fn datagram_parts() -> impl Strategy<Value = (IpRepr, u16, OwnedPacket)> {
    (prop_oneof![ipv4(), ipv6()], any::<u16>(), packet())
}

/// The datagram the parts describe, with the IP payload length a parse will report.
pub fn datagram(ip: IpRepr, src_port: u16, packet: &OwnedPacket) -> DatagramRepr<'_> {
    let packet = packet.repr();
    let payload_len = 8 + packet.buffer_len();
    let ip = match ip {
        IpRepr::Ipv4(r) => IpRepr::Ipv4(Ipv4Repr { payload_len, ..r }),
        IpRepr::Ipv6(r) => IpRepr::Ipv6(Ipv6Repr { payload_len, ..r }),
    };
    DatagramRepr {
        ip,
        udp: UdpRepr {
            src_port,
            dst_port: ROCEV2_PORT,
        },
        packet,
    }
}

/// An Ethernet frame around the datagram.
pub fn frame(datagram: DatagramRepr<'_>) -> FrameRepr<'_> {
    FrameRepr {
        src_mac: [2, 0, 0, 0, 0, 1],
        dst_mac: [2, 0, 0, 0, 0, 2],
        datagram,
    }
}

/// Edits to apply to valid bytes: flip bits at positions, then cut or extend.
#[derive(Debug, Clone)]
pub struct Mutation {
    pub flips: Vec<(usize, u8)>,
    pub resize: Option<usize>,
}

pub fn mutation() -> impl Strategy<Value = Mutation> {
    (
        proptest::collection::vec((any::<usize>(), 1u8..=255), 0..4),
        proptest::option::of(0usize..400),
    )
        .prop_map(|(flips, resize)| Mutation { flips, resize })
}

impl Mutation {
    pub fn apply(&self, bytes: &[u8]) -> Vec<u8> {
        let mut out = bytes.to_vec();
        if !out.is_empty() {
            for &(at, xor) in &self.flips {
                let len = out.len();
                out[at % len] ^= xor;
            }
        }
        if let Some(len) = self.resize {
            out.resize(len, 0xa5);
        }
        out
    }
}
