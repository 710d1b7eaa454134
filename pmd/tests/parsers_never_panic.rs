//! What the peer sends is untrusted: the rendezvous blob (inline, or read back from the store)
//! and the control messages written into our control ring. Their parsers refuse bad bytes with
//! an error and never panic, and what parses re-emits to the same bytes (proptest, seeded:
//! the seed is printed; `PROPTEST_RNG_SEED=<seed>` replays a failure).

use pmd::failover::{ControlPacket, ControlRepr, CONTROL_MESSAGE_LEN};
use pmd::resilient::PeerAttrs;
use pmd::Gid;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

fn seeded() -> Config {
    let mut config = Config {
        failure_persistence: None,
        ..Config::default()
    };
    if config.rng_seed == RngSeed::Random {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        config.rng_seed = RngSeed::Fixed(seed);
    }
    eprintln!(
        "proptest seed {:?} (replay with PROPTEST_RNG_SEED)",
        config.rng_seed
    );
    config
}

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..max)
}

fn peer_attrs() -> impl Strategy<Value = PeerAttrs> {
    (
        any::<[u8; 16]>(),
        0..=0x00ff_ffffu32,
        any::<[u8; 16]>(),
        0..=0x00ff_ffffu32,
        0..=0x00ff_ffffu32,
        0..=0x00ff_ffffu32,
        any::<u64>(),
        any::<u32>(),
        proptest::collection::vec(any::<(u32, u32)>(), 0..6),
        (
            0..=0x00ff_ffffu32,
            0..=0x00ff_ffffu32,
            any::<u64>(),
            any::<u32>(),
        ),
    )
        .prop_map(
            |(dg, dq, bg, bq, cq, psn, addr, rkey, rkeys, dc)| PeerAttrs {
                default_gid: Gid(dg),
                default_qpn: dq,
                backup_gid: Gid(bg),
                backup_qpn: bq,
                control_qpn: cq,
                control_psn: psn,
                control_ring_addr: addr,
                control_ring_rkey: rkey,
                default_control_qpn: dc.0,
                default_control_psn: dc.1,
                default_control_ring_addr: dc.2,
                default_control_ring_rkey: dc.3,
                rkeys,
                management: None,
            },
        )
}

/// Bytes that pass the magic and version checks more often than random ones: a message of
/// any kind (known and unknown) with values around the edges the kinds allow.
fn control_bytes() -> impl Strategy<Value = Vec<u8>> {
    (
        0u8..13,
        any::<u32>(),
        any::<u32>(),
        prop_oneof![Just(0u32), any::<u32>()],
        prop_oneof![Just(0u64), Just(1), Just(2), any::<u64>()],
        prop_oneof![Just(0u64), Just(1), Just(2), any::<u64>()],
    )
        .prop_map(|(kind, qpn, epoch, reserved, a, b)| {
            let mut buf = vec![0u8; CONTROL_MESSAGE_LEN];
            let mut p = ControlPacket::new_checked(&mut buf[..]).unwrap();
            p.set_magic(0x5253);
            p.set_version(1);
            p.set_kind(kind);
            p.set_dest_qpn(qpn >> (qpn & 8));
            p.set_epoch(epoch);
            p.set_reserved(reserved);
            p.set_a(a);
            p.set_b(b);
            buf
        })
}

proptest! {
    #![proptest_config(seeded())]

    #[test]
    fn peer_attrs_parse_survives_arbitrary_bytes(b in bytes(200)) {
        let _ = PeerAttrs::parse(&b);
    }

    #[test]
    fn peer_attrs_parse_survives_mutated_blobs(
        attrs in peer_attrs(), at in any::<prop::sample::Index>(), byte: u8, cut in 0usize..12,
    ) {
        let mut b = attrs.to_bytes();
        let i = at.index(b.len());
        b[i] = byte;
        b.truncate(b.len() - cut.min(b.len()));
        if let Ok(parsed) = PeerAttrs::parse(&b) {
            prop_assert_eq!(parsed.to_bytes(), b);
        }
    }

    #[test]
    fn peer_attrs_round_trip(attrs in peer_attrs()) {
        prop_assert_eq!(PeerAttrs::parse(&attrs.to_bytes()), Ok(attrs));
    }

    #[test]
    fn control_parse_survives_arbitrary_bytes(b in bytes(64)) {
        if let Ok(p) = ControlPacket::new_checked(&b[..]) {
            let _ = ControlRepr::parse(&p);
        }
    }

    #[test]
    fn control_messages_that_parse_re_emit_to_an_equal_message(b in control_bytes()) {
        let p = ControlPacket::new_checked(&b[..]).unwrap();
        if let Ok(repr) = ControlRepr::parse(&p) {
            let mut out = [0u8; CONTROL_MESSAGE_LEN];
            repr.emit(&mut ControlPacket::new_checked(&mut out[..]).unwrap());
            let again = ControlRepr::parse(&ControlPacket::new_checked(&out[..]).unwrap());
            prop_assert_eq!(again, Ok(repr));
        }
    }
}
