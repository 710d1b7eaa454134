//! Every `Repr` survives emit then parse unchanged, for arbitrary field values (proptest,
//! seeded: see `common::config`).

mod common;

use common::config;
use hw_defs::mlx5::atomic_seg::{AtomicSeg, AtomicSegRepr};
use hw_defs::mlx5::cqe::{Cqe64, CqeOpcode, CqeRepr};
use hw_defs::mlx5::ctrl_seg::{CtrlSeg, CtrlSegRepr, FenceMode, SendOpcode};
use hw_defs::mlx5::data_seg::{DataSegRepr, INVALID_LKEY};
use hw_defs::mlx5::dbrec::{CqDoorbellRecord, DoorbellRecord};
use hw_defs::mlx5::err_cqe::{ErrCqe, ErrCqeRepr, Syndrome};
use hw_defs::mlx5::inline_seg::InlineData;
use hw_defs::mlx5::raddr_seg::RaddrSegRepr;
use hw_defs::mlx5::recv_wqe::RecvWqe;
use hw_defs::mlx5::send_wqe::{SendRing, SendWqeRepr, Sges, WqeData};
use hw_defs::mlx5::wqe;
use hw_defs::pcap::{ByteOrder, FileHeaderRepr, RecordHeaderRepr, Resolution};
use hw_defs::roce::{icrc, DatagramRepr, FrameRepr, Packet, PacketRepr, Psn};
use hw_defs::Error;
use proptest::prelude::*;

const SEND_OPCODES: [SendOpcode; 8] = [
    SendOpcode::Nop,
    SendOpcode::RdmaWrite,
    SendOpcode::RdmaWriteImm,
    SendOpcode::Send,
    SendOpcode::SendImm,
    SendOpcode::RdmaRead,
    SendOpcode::AtomicCs,
    SendOpcode::AtomicFa,
];

prop_compose! {
    fn ctrl_seg(opcode: SendOpcode)(
        opmod: u8, wqe_index: u16, qpn in 0u32..1 << 24, ds in 0u8..64, signature: u8,
        fence in 0u8..8, signaled: bool, solicited: bool, imm: u32,
    ) -> CtrlSegRepr {
        CtrlSegRepr {
            opcode, opmod, wqe_index, qpn, ds, signature, fence: FenceMode::from(fence),
            signaled, solicited, imm,
        }
    }
}

prop_compose! {
    fn data_seg()(byte_count in 0u32..1 << 31, lkey: u32, addr: u64) -> DataSegRepr {
        DataSegRepr { byte_count, lkey, addr }
    }
}

/// A send WQE's parts: ring size in blocks, control segment, headers, and either SGEs or an
/// inline payload.
#[derive(Debug, Clone)]
struct WqeParts {
    ring_bbs: usize,
    ctrl: CtrlSegRepr,
    raddr: Option<RaddrSegRepr>,
    atomic: Option<AtomicSegRepr>,
    sges: Vec<DataSegRepr>,
    inline: Option<Vec<u8>>,
}

fn wqe_parts() -> impl Strategy<Value = WqeParts> {
    (0usize..8, prop::sample::select(SEND_OPCODES.to_vec())).prop_flat_map(|(log_bbs, opcode)| {
        let inline_allowed = !opcode.scatters_response();
        (
            ctrl_seg(opcode),
            (any::<u64>(), any::<u32>()).prop_map(|(raddr, rkey)| RaddrSegRepr { raddr, rkey }),
            (any::<u64>(), any::<u64>())
                .prop_map(|(swap_add, compare)| AtomicSegRepr { swap_add, compare }),
            proptest::collection::vec(data_seg(), 0..70),
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..1100)),
        )
            .prop_map(move |(ctrl, raddr, atomic, sges, inline)| WqeParts {
                ring_bbs: 1 << log_bbs,
                raddr: opcode.has_raddr_seg().then_some(raddr),
                atomic: opcode.has_atomic_seg().then_some(atomic),
                ctrl,
                sges,
                inline: inline.filter(|_| inline_allowed),
            })
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn packets_round_trip(p in common::packet()) {
        let repr = p.repr();
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&mut buf).unwrap();
        let packet = Packet::new_checked(&buf[..]).unwrap();
        prop_assert_eq!(PacketRepr::parse(&packet).unwrap(), repr);
        prop_assert_eq!(packet.payload(), &p.payload[..]);
    }

    #[test]
    fn datagrams_round_trip_with_a_valid_icrc((ip, port, p) in common::datagram_parts()) {
        let repr = common::datagram(ip, port, &p);
        let bytes = repr.to_vec().unwrap();
        prop_assert_eq!(icrc::verify(&bytes), Ok(()));
        prop_assert_eq!(DatagramRepr::parse(&bytes).unwrap(), repr);
    }

    #[test]
    fn frames_round_trip((ip, port, p) in common::datagram_parts()) {
        let repr = common::frame(common::datagram(ip, port, &p));
        let bytes = repr.to_vec().unwrap();
        prop_assert_eq!(FrameRepr::parse(&bytes).unwrap(), repr);
    }

    #[test]
    fn control_segments_round_trip(opcode: u8, fields in ctrl_seg(SendOpcode::Nop)) {
        let repr = CtrlSegRepr { opcode: SendOpcode::from(opcode), ..fields };
        let mut buf = [0u8; 16];
        repr.emit(&mut CtrlSeg::new_unchecked(&mut buf[..]));
        prop_assert_eq!(CtrlSegRepr::parse(&CtrlSeg::new_checked(&buf[..]).unwrap()).unwrap(), repr);
    }

    #[test]
    fn atomic_segments_round_trip(swap_add: u64, compare: u64) {
        let repr = AtomicSegRepr { swap_add, compare };
        let mut buf = [0u8; 16];
        repr.emit(&mut AtomicSeg::new_unchecked(&mut buf[..]));
        prop_assert_eq!(AtomicSegRepr::parse(&AtomicSeg::new_checked(&buf[..]).unwrap()), Ok(repr));
    }

    #[test]
    fn send_wqes_round_trip_anywhere_in_the_ring(parts in wqe_parts()) {
        let mut ring = SendRing::new_checked(vec![0x5au8; parts.ring_bbs * 64]).unwrap();
        let data = match &parts.inline {
            Some(payload) => WqeData::Inline(InlineData::new(payload)),
            None => WqeData::Gather(Sges::from_slice(&parts.sges)),
        };
        let repr = SendWqeRepr { ctrl: parts.ctrl, raddr: parts.raddr, atomic: parts.atomic, datagram: None, data };
        let ds = repr.ds();
        match repr.emit(&mut ring) {
            Err(e) => {
                prop_assert!(ds > wqe::MAX_DS || ds * 16 > parts.ring_bbs * 64, "{}", e);
                let is_length_error = matches!(e, Error::LengthMismatch { .. });
                prop_assert!(is_length_error, "unexpected error {}", e);
            }
            Ok(bbs) => {
                prop_assert_eq!(bbs, wqe::bbs_for_ds(ds));
                let parsed = SendWqeRepr::parse(&ring, parts.ctrl.wqe_index).unwrap();
                // An empty inline payload writes no inline segment: it reads back as no SGEs.
                let data = match repr.data {
                    WqeData::Inline(d) if d.is_empty() => WqeData::Gather(Sges::from_slice(&[])),
                    other => other,
                };
                let ctrl = CtrlSegRepr { ds: ds as u8, ..repr.ctrl };
                prop_assert_eq!(parsed, SendWqeRepr { ctrl, data, ..repr });
            }
        }
    }

    #[test]
    fn receive_wqes_round_trip(
        capacity in 1usize..9,
        sges in proptest::collection::vec(
            data_seg().prop_filter("not the terminator", |s| s.lkey != INVALID_LKEY), 0..9),
    ) {
        let mut slot = RecvWqe::new_checked(vec![0xffu8; capacity * 16]).unwrap();
        let result = slot.write(&sges);
        prop_assert_eq!(result.is_ok(), sges.len() <= capacity);
        if result.is_ok() {
            prop_assert_eq!(slot.sges().collect::<Vec<_>>(), sges);
        }
    }

    #[test]
    fn cqes_round_trip(
        opcode in prop::sample::select(vec![
            CqeOpcode::Req, CqeOpcode::RespWrImm, CqeOpcode::RespSend, CqeOpcode::RespSendImm,
            CqeOpcode::RespSendInv]),
        wqe_counter: u16, byte_count: u32, imm: u32, qpn in 0u32..1 << 24, solicited: bool,
        timestamp: u64, owner: bool,
    ) {
        let repr = CqeRepr { opcode, wqe_counter, byte_count, imm, qpn, solicited, timestamp };
        let mut buf = [0xffu8; 64];
        repr.emit(&mut Cqe64::new_unchecked(&mut buf[..]), owner);
        let cqe = Cqe64::new_checked(&buf[..]).unwrap();
        prop_assert_eq!(cqe.owner(), owner);
        prop_assert_eq!(CqeRepr::parse(&cqe), Ok(repr));
    }

    #[test]
    fn error_cqes_round_trip(
        opcode in prop::sample::select(vec![CqeOpcode::ReqErr, CqeOpcode::RespErr]),
        syndrome: u8, vendor_syndrome: u8, wqe_opcode: u8, qpn in 0u32..1 << 24,
        wqe_counter: u16, owner: bool,
    ) {
        let repr = ErrCqeRepr {
            opcode, syndrome: Syndrome::from(syndrome), vendor_syndrome, wqe_opcode, qpn,
            wqe_counter,
        };
        let mut buf = [0u8; 64];
        repr.emit(&mut ErrCqe::new_unchecked(&mut buf[..]), owner);
        prop_assert_eq!(ErrCqeRepr::parse(&ErrCqe::new_checked(&buf[..]).unwrap()), Ok(repr));
    }

    #[test]
    fn doorbell_records_keep_what_is_written(recv: u16, send: u16, ci: u32, sn in 0u8..4, sol: bool) {
        let mut buf = [0u8; 8];
        let mut rec = DoorbellRecord::new_checked(&mut buf[..]).unwrap();
        rec.set_recv_counter(recv);
        rec.set_send_counter(send);
        prop_assert_eq!((rec.recv_counter(), rec.send_counter()), (recv, send));
        let mut cq = CqDoorbellRecord::new_checked(&mut buf[..]).unwrap();
        cq.set_consumer_index(ci);
        cq.set_arm(sn, sol, ci);
        prop_assert_eq!(cq.consumer_index(), ci & 0xff_ffff);
        prop_assert_eq!((cq.arm_sequence(), cq.arm_solicited_only(), cq.arm_consumer_index()),
            (sn, sol, ci & 0xff_ffff));
    }

    #[test]
    fn pcap_headers_round_trip(
        big: bool, nanos: bool, snaplen: u32, linktype: u32,
        ts_sec: u32, ts_frac: u32, incl_len: u32, orig_len: u32,
    ) {
        let header = FileHeaderRepr {
            byte_order: if big { ByteOrder::Big } else { ByteOrder::Little },
            resolution: if nanos { Resolution::Nanos } else { Resolution::Micros },
            version: (2, 4),
            snaplen,
            linktype,
        };
        prop_assert_eq!(FileHeaderRepr::parse(&header.to_bytes()), Ok(header));
        let record = RecordHeaderRepr { ts_sec, ts_frac, incl_len, orig_len };
        prop_assert_eq!(RecordHeaderRepr::parse(&record.to_bytes(), ByteOrder::Little), Ok(record));
    }

    #[test]
    fn psn_distance_counts_the_steps_added(start: u32, steps in 0u32..1 << 24) {
        let a = Psn::new(start);
        prop_assert_eq!(a.distance_to(a.add(steps)), steps);
        prop_assert_eq!(a.add(steps).sub(steps), a);
    }

    #[test]
    fn psns_within_half_the_ring_order_both_ways(start: u32, steps in 1u32..1 << 23) {
        let a = Psn::new(start);
        let b = a.add(steps);
        prop_assert!(b.is_after(a) && a.is_before(b));
        prop_assert_eq!(b.delta(a), steps as i32);
        prop_assert_eq!(a.delta(b), -(steps as i32));
        prop_assert!(b.sub(1).is_in(a, b) && !b.is_in(a, b));
    }
}
