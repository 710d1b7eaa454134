//! The one place where the transport meets bytes: hw-defs' layouts in, the transport's decoded
//! views out. Send and receive WQEs, CQEs, and RoCEv2 packets (headers, pad, ICRC).

use std::net::IpAddr;

use hw_defs::mlx5::{
    self, cqe::CqeOpcode, req_cqe, AtomicSegRepr, Cqe64, CqeRepr, CtrlSeg, ErrCqe, ErrCqeRepr,
    FenceMode, RecvWqe, SendOpcode, SendRing, SendWqeRepr, WqeData,
};
use hw_defs::roce::aeth::{
    self, Aeth, AethRepr, NakCode as WireNak, Syndrome as AethSyndrome, CREDITS_UNLIMITED,
};
use hw_defs::roce::atomic_ack_eth::{self, AtomicAckEth, AtomicAckEthRepr};
use hw_defs::roce::atomic_eth::{self, AtomicEth as AtomicEthView, AtomicEthRepr};
use hw_defs::roce::bth::{self, Bth, BthRepr, DEFAULT_PKEY};
use hw_defs::roce::deth::{self, Deth as DethView, DethRepr};
use hw_defs::roce::icrc;
use hw_defs::roce::immdt::{self, ImmDt, ImmDtRepr};
use hw_defs::roce::opcode::{Opcode, Operation, Position};
use hw_defs::roce::packet::{pad_for, HeaderOffsets, Packet, PacketRepr};
use hw_defs::roce::reth::{self, Reth as RethView, RethRepr};
use hw_defs::roce::Psn;

use crate::cqe::{CqeInfo, CqeKind};
use crate::dma::Sge;
use crate::packet::{AckKind, AtomicEth, Deth, Header, Kind, NakCode, OutHeader, Reth};
use crate::qp_attr::QpType;
use crate::wire::Ipv4Ident;
use crate::wqe::{SendWqe, UdDest, WqeOp};

/// The ICRC's CRC-32 register update ([`icrc::CrcRegister`]) by `crc32fast`, which folds
/// with a carry-less multiply where the CPU has one (PCLMULQDQ, PMULL) and falls back to
/// tables elsewhere. `crc32fast` keeps its state inverted (the standard CRC-32's), the ICRC
/// register is not: invert on the way in and out.
pub(crate) fn crc_register(register: u32, data: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new_with_initial(!register);
    hasher.update(data);
    !hasher.finalize()
}

/// `psn + n` mod 2^24.
#[inline]
pub(crate) fn psn_add(psn: u32, n: u32) -> u32 {
    Psn::new(psn).add(n).value()
}

/// `a - b` as a signed 24-bit distance (positive: `a` is after `b`).
#[inline]
pub(crate) fn psn_delta(a: u32, b: u32) -> i32 {
    Psn::new(a).delta(Psn::new(b))
}

/// Why a WQE could not be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WqeError {
    /// Unknown opcode, bad ds, segments that do not fit the opcode.
    Malformed,
    /// More SGEs or inline bytes than the QP was created for.
    TooLong,
}

/// The `ds` field of the control segment at the start of `first_bb`.
pub(crate) fn wqe_ds(first_bb: &[u8]) -> u8 {
    CtrlSeg::new_checked(first_bb).map(|c| c.ds()).unwrap_or(0)
}

/// The straightened copy a send WQE is decoded from: 16 basic blocks, room for the largest WQE
/// and a power of two, so it is parsed as a private ring of its own at index 0 and the parser
/// never sees the driver's live ring.
pub(crate) const WQE_SCRATCH: usize = mlx5::wqe::MAX_WQE_BBS * mlx5::SEND_WQE_BB;

/// Decodes a send WQE copied out of the ring (straightened, starting at offset 0 of `ring`,
/// which is [`WQE_SCRATCH`] bytes) into `out`. A UD QP's WQE has a datagram segment after its
/// control segment (a SEND without one is malformed), and only SENDs and NOPs.
pub(crate) fn decode_send_wqe(
    ring: &[u8],
    qp_type: QpType,
    max_inline: u32,
    max_sge: u32,
    out: &mut SendWqe,
) -> Result<(), WqeError> {
    let ring = SendRing::new_checked(ring).map_err(|_| WqeError::Malformed)?;
    let wqe = match qp_type {
        QpType::Rc => SendWqeRepr::parse(&ring, 0).map_err(|_| WqeError::Malformed)?,
        QpType::Ud => {
            let wqe = SendWqeRepr::parse_ud(&ring, 0).map_err(|_| WqeError::Malformed)?;
            // Written only in a UD QP's slots, the only ones that read it.
            out.ud = wqe.datagram.map(|d| UdDest {
                addr: gid_addr(d.rgid),
                qpn: d.dqp,
                qkey: d.qkey,
            });
            wqe
        }
    };
    out.op = match wqe.ctrl.opcode {
        SendOpcode::Nop => WqeOp::Nop,
        SendOpcode::RdmaWrite => WqeOp::Write,
        SendOpcode::RdmaWriteImm => WqeOp::WriteImm,
        SendOpcode::Send => WqeOp::Send,
        SendOpcode::SendImm => WqeOp::SendImm,
        SendOpcode::RdmaRead => WqeOp::Read,
        SendOpcode::AtomicCs => WqeOp::CompareSwap,
        SendOpcode::AtomicFa => WqeOp::FetchAdd,
        SendOpcode::Unknown(_) => return Err(WqeError::Malformed),
    };
    out.mlx5_opcode = wqe.ctrl.opcode.into();
    out.signaled = wqe.ctrl.signaled;
    out.solicited = wqe.ctrl.solicited;
    out.fence = !matches!(wqe.ctrl.fence, FenceMode::None);
    out.imm = wqe.ctrl.imm;
    out.raddr = wqe.raddr.map_or(0, |r| r.raddr);
    out.rkey = wqe.raddr.map_or(0, |r| r.rkey);
    let atomic = wqe.atomic.unwrap_or(AtomicSegRepr {
        swap_add: 0,
        compare: 0,
    });
    out.swap_add = atomic.swap_add;
    out.compare = atomic.compare;
    out.sges.clear();
    out.inline_data.clear();
    out.inline = false;
    match wqe.data {
        WqeData::Gather(sges) => {
            if sges.len() > max_sge as usize {
                return Err(WqeError::TooLong);
            }
            let mut total: u64 = 0;
            for s in sges.iter() {
                out.sges.push(Sge {
                    addr: s.addr,
                    len: s.byte_count,
                    lkey: s.lkey,
                });
                total += s.byte_count as u64;
            }
            out.length = u32::try_from(total).map_err(|_| WqeError::TooLong)?;
        }
        WqeData::Inline(data) => {
            if data.len() > max_inline as usize {
                return Err(WqeError::TooLong);
            }
            out.inline = true;
            out.inline_data.resize(data.len(), 0);
            data.copy_to(&mut out.inline_data);
            out.length = data.len() as u32;
        }
    }
    match out.op {
        // An atomic moves 8 bytes; its scatter list must hold them.
        WqeOp::CompareSwap | WqeOp::FetchAdd if out.length < 8 => return Err(WqeError::TooLong),
        WqeOp::CompareSwap | WqeOp::FetchAdd => out.length = 8,
        _ => {}
    }
    Ok(())
}

/// The address a GID names: an IPv4-mapped GID is the IPv4 address (RoCEv2 over IPv4).
pub(crate) fn gid_addr(gid: [u8; 16]) -> IpAddr {
    let v6 = std::net::Ipv6Addr::from(gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// Decodes a receive WQE's scatter list.
pub(crate) fn decode_recv_wqe(bytes: &[u8], out: &mut Vec<Sge>) -> Result<(), WqeError> {
    let wqe = RecvWqe::new_checked(bytes).map_err(|_| WqeError::Malformed)?;
    out.clear();
    for s in wqe.sges() {
        out.push(Sge {
            addr: s.addr,
            len: s.byte_count,
            lkey: s.lkey,
        });
    }
    Ok(())
}

/// Lays out a CQE in `buf` (64 bytes) except its `op_own` byte, which it returns.
pub(crate) fn encode_cqe(buf: &mut [u8; 64], info: &CqeInfo, owner: u8) -> u8 {
    let owner = owner != 0;
    let error = |opcode, wqe_opcode, syndrome: u8| ErrCqeRepr {
        opcode,
        syndrome: mlx5::Syndrome::from(syndrome),
        vendor_syndrome: 0,
        wqe_opcode,
        qpn: info.qpn,
        wqe_counter: info.wqe_counter,
    };
    let ok = |opcode| CqeRepr {
        opcode,
        wqe_counter: info.wqe_counter,
        byte_count: info.byte_count,
        imm: info.imm.unwrap_or(0),
        qpn: info.qpn,
        solicited: false,
        timestamp: 0,
    };
    match info.kind {
        CqeKind::RequesterError {
            wqe_opcode,
            syndrome,
        } => {
            let r = error(CqeOpcode::ReqErr, wqe_opcode, syndrome);
            r.emit_body(&mut ErrCqe::new_unchecked(&mut buf[..]));
            r.op_own(owner)
        }
        CqeKind::ResponderError { syndrome } => {
            let r = error(CqeOpcode::RespErr, 0, syndrome);
            r.emit_body(&mut ErrCqe::new_unchecked(&mut buf[..]));
            r.op_own(owner)
        }
        CqeKind::Requester { wqe_opcode } => {
            let r = ok(CqeOpcode::Req);
            r.emit_body(&mut Cqe64::new_unchecked(&mut buf[..]));
            // libmlx5 reads the completed WQE's opcode from here to fill ibv_wc.opcode.
            let _ = req_cqe::set_req_wqe_opcode(&mut buf[..], SendOpcode::from(wqe_opcode));
            r.op_own(owner)
        }
        CqeKind::RecvSend => {
            let r = ok(if info.imm.is_some() {
                CqeOpcode::RespSendImm
            } else {
                CqeOpcode::RespSend
            });
            r.emit_body(&mut Cqe64::new_unchecked(&mut buf[..]));
            r.op_own(owner)
        }
        CqeKind::RecvUd { src_qp } => {
            let r = ok(if info.imm.is_some() {
                CqeOpcode::RespSendImm
            } else {
                CqeOpcode::RespSend
            });
            let mut cqe = Cqe64::new_unchecked(&mut buf[..]);
            r.emit_body(&mut cqe);
            cqe.set_remote_qpn(src_qp, true);
            r.op_own(owner)
        }
        CqeKind::RecvWriteImm => {
            let r = ok(CqeOpcode::RespWrImm);
            r.emit_body(&mut Cqe64::new_unchecked(&mut buf[..]));
            r.op_own(owner)
        }
    }
}

/// Why a received packet was dropped before reaching a QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ParseError {
    /// Not a well-formed packet of a known RC or UD opcode.
    Malformed,
    /// Well-formed, but the ICRC does not match.
    Icrc,
    /// Well-formed with a good ICRC, but of another partition: its P_Key does not match the
    /// default one (0xFFFF, the only partition softnic has), as an IB port checks it.
    PKey,
}

/// Whether a packet's P_Key matches the default partition's full-membership key 0xFFFF: the
/// same 15-bit key, not the invalid key 0 (IBA 10.9.3; rxe's `pkey_match`).
pub(crate) fn pkey_matches_default(pkey: u16) -> bool {
    pkey & 0x7fff == DEFAULT_PKEY & 0x7fff
}

fn kind_of(op: Operation) -> Kind {
    match op {
        Operation::Send => Kind::Send,
        Operation::RdmaWrite => Kind::Write,
        Operation::RdmaReadRequest => Kind::ReadRequest,
        Operation::RdmaReadResponse => Kind::ReadResponse,
        Operation::Acknowledge => Kind::Ack,
        Operation::AtomicAcknowledge => Kind::AtomicAck,
        Operation::CompareSwap => Kind::CompareSwap,
        Operation::FetchAdd => Kind::FetchAdd,
    }
}

fn ack_of(s: AethSyndrome) -> AckKind {
    match s {
        AethSyndrome::Ack { .. } => AckKind::Ack,
        AethSyndrome::RnrNak { timer_code } => AckKind::Rnr(timer_code),
        AethSyndrome::Nak(WireNak::PsnSequenceError) => AckKind::Nak(NakCode::PsnSequence),
        AethSyndrome::Nak(WireNak::InvalidRequest) => AckKind::Nak(NakCode::InvalidRequest),
        AethSyndrome::Nak(WireNak::RemoteAccessError) => AckKind::Nak(NakCode::RemoteAccess),
        AethSyndrome::Nak(WireNak::RemoteOperationalError) => {
            AckKind::Nak(NakCode::RemoteOperational)
        }
        AethSyndrome::Nak(other) => AckKind::Nak(NakCode::Other(other.into())),
        AethSyndrome::Reserved(b) => AckKind::Nak(NakCode::Other(b)),
    }
}

fn syndrome_of(a: AckKind) -> AethSyndrome {
    match a {
        AckKind::Ack => AethSyndrome::Ack {
            credit_code: CREDITS_UNLIMITED,
        },
        AckKind::Rnr(code) => AethSyndrome::RnrNak { timer_code: code },
        AckKind::Nak(NakCode::PsnSequence) => AethSyndrome::Nak(WireNak::PsnSequenceError),
        AckKind::Nak(NakCode::InvalidRequest) => AethSyndrome::Nak(WireNak::InvalidRequest),
        AckKind::Nak(NakCode::RemoteAccess) => AethSyndrome::Nak(WireNak::RemoteAccessError),
        AckKind::Nak(NakCode::RemoteOperational) => {
            AethSyndrome::Nak(WireNak::RemoteOperationalError)
        }
        AckKind::Nak(NakCode::Other(c)) => AethSyndrome::Nak(WireNak::from(c)),
    }
}

/// Parses and ICRC-checks a received UDP payload from `src:src_port` to `dst:4791`; `ipv4`
/// is the received IPv4 header's identification and DF flag when the wire saw the header
/// (else the header is rebuilt as rxe and our senders write it: ID 0, DF).
pub(crate) fn parse_packet(
    bytes: &[u8],
    src: IpAddr,
    src_port: u16,
    dst: IpAddr,
    ipv4: Option<Ipv4Ident>,
) -> Result<Header, ParseError> {
    let packet = Packet::new_checked(bytes).map_err(|_| ParseError::Malformed)?;
    let repr = PacketRepr::parse(&packet).map_err(|_| ParseError::Malformed)?;
    let Some(info) = repr.bth.opcode.info() else {
        return Err(ParseError::Malformed);
    };
    let mut ip = icrc::IpFields::rxe(src, dst).map_err(|_| ParseError::Malformed)?;
    if let (
        icrc::IpFields::V4 {
            ident, dont_frag, ..
        },
        Some(seen),
    ) = (&mut ip, ipv4)
    {
        *ident = seen.ident;
        *dont_frag = seen.dont_frag;
    }
    if icrc::verify_udp_payload_with(crc_register, ip, src_port, crate::wire::ROCE_PORT, bytes)
        .is_err()
    {
        return Err(ParseError::Icrc);
    }
    if !pkey_matches_default(repr.bth.pkey) {
        return Err(ParseError::PKey);
    }
    let payload_start = repr.bth.opcode.header_len();
    let payload = payload_start..payload_start + repr.payload.len();
    Ok(Header {
        kind: if info.deth {
            Kind::UdSend
        } else {
            kind_of(info.operation)
        },
        first: matches!(info.position, Position::First | Position::Only),
        last: matches!(info.position, Position::Last | Position::Only),
        solicited: repr.bth.solicited,
        ack_req: repr.bth.ack_req,
        dest_qpn: repr.bth.dest_qp,
        psn: repr.bth.psn.value(),
        reth: repr.reth.map(|r| Reth {
            va: r.va,
            rkey: r.rkey,
            len: r.dma_length,
        }),
        atomic: repr.atomic_eth.map(|a| AtomicEth {
            va: a.va,
            rkey: a.rkey,
            swap_add: a.swap_add,
            compare: a.compare,
        }),
        aeth: repr.aeth.map(|a| (ack_of(a.syndrome), a.msn)),
        atomic_ack: repr.atomic_ack_eth.map(|a| a.orig_rem_dt),
        imm: repr.immdt.map(|i| i.imm),
        payload,
    })
}

fn opcode_for(h: &OutHeader) -> Opcode {
    let imm = h.imm.is_some();
    match (h.kind, h.first, h.last) {
        (Kind::Send, true, false) => Opcode::SendFirst,
        (Kind::Send, false, false) => Opcode::SendMiddle,
        (Kind::Send, false, true) if imm => Opcode::SendLastWithImmediate,
        (Kind::Send, false, true) => Opcode::SendLast,
        (Kind::Send, true, true) if imm => Opcode::SendOnlyWithImmediate,
        (Kind::Send, true, true) => Opcode::SendOnly,
        (Kind::Write, true, false) => Opcode::RdmaWriteFirst,
        (Kind::Write, false, false) => Opcode::RdmaWriteMiddle,
        (Kind::Write, false, true) if imm => Opcode::RdmaWriteLastWithImmediate,
        (Kind::Write, false, true) => Opcode::RdmaWriteLast,
        (Kind::Write, true, true) if imm => Opcode::RdmaWriteOnlyWithImmediate,
        (Kind::Write, true, true) => Opcode::RdmaWriteOnly,
        (Kind::ReadRequest, _, _) => Opcode::RdmaReadRequest,
        (Kind::ReadResponse, true, false) => Opcode::RdmaReadResponseFirst,
        (Kind::ReadResponse, false, false) => Opcode::RdmaReadResponseMiddle,
        (Kind::ReadResponse, false, true) => Opcode::RdmaReadResponseLast,
        (Kind::ReadResponse, true, true) => Opcode::RdmaReadResponseOnly,
        (Kind::Ack, _, _) => Opcode::Acknowledge,
        (Kind::AtomicAck, _, _) => Opcode::AtomicAcknowledge,
        (Kind::CompareSwap, _, _) => Opcode::CompareSwap,
        (Kind::FetchAdd, _, _) => Opcode::FetchAdd,
        // UD has one SEND opcode (and its immediate form): a datagram is one packet.
        (Kind::UdSend, _, _) if imm => Opcode::UdSendOnlyWithImmediate,
        (Kind::UdSend, _, _) => Opcode::UdSendOnly,
    }
}

/// Writes a UD SEND's headers (`h.kind` is [`Kind::UdSend`]): BTH, the DETH naming `deth`'s
/// Q_Key and sending QP, and the immediate if any; returns where the payload goes.
pub(crate) fn emit_ud_headers(buf: &mut [u8], h: &OutHeader, deth: Deth) -> Option<usize> {
    let at = emit_headers(buf, h)?;
    // The DETH follows the BTH (`emit_headers` left its bytes to this).
    let o = bth::HEADER_LEN;
    DethRepr {
        qkey: deth.qkey,
        src_qp: deth.src_qp,
    }
    .emit(&mut DethView::new_unchecked(
        &mut buf[o..o + deth::HEADER_LEN],
    ));
    Some(at)
}

/// The DETH of a received UD SEND (its bytes right after the BTH).
pub(crate) fn deth_of(packet: &[u8]) -> Option<Deth> {
    let bytes = packet.get(bth::HEADER_LEN..bth::HEADER_LEN + deth::HEADER_LEN)?;
    let d = DethRepr::parse(&DethView::new_checked(bytes).ok()?).ok()?;
    Some(Deth {
        qkey: d.qkey,
        src_qp: d.src_qp,
    })
}

/// Writes BTH and extension headers for `h` at the start of `buf`, with the pad count for its
/// payload; returns where the payload goes. None if `h` does not fit its opcode.
pub(crate) fn emit_headers(buf: &mut [u8], h: &OutHeader) -> Option<usize> {
    let opcode = opcode_for(h);
    let at = HeaderOffsets::for_opcode(opcode)?;
    // Each header is emitted by its own hw-defs Repr at the offset the opcode table gives, and
    // the payload is written in place by the caller straight from registered memory.
    // (`PacketRepr::emit` would want the payload as a slice, and refuses an empty payload on a
    // payload opcode, which zero-length WRITEs need.)
    let present = [
        (at.reth.is_some(), h.reth.is_some()),
        (at.atomic_eth.is_some(), h.atomic.is_some()),
        (at.aeth.is_some(), h.aeth.is_some()),
        (at.atomic_ack_eth.is_some(), h.atomic_ack.is_some()),
        (at.immdt.is_some(), h.imm.is_some()),
    ];
    if present.iter().any(|(want, have)| want != have) || buf.len() < at.payload {
        return None;
    }
    BthRepr {
        opcode,
        solicited: h.solicited,
        mig_req: false,
        pad_count: pad_for(h.payload_len as usize),
        pkey: DEFAULT_PKEY,
        fecn: false,
        becn: false,
        dest_qp: h.dest_qpn,
        ack_req: h.ack_req,
        psn: Psn::new(h.psn),
    }
    .emit(&mut Bth::new_unchecked(&mut buf[..bth::HEADER_LEN]));
    if let (Some(o), Some(r)) = (at.reth, h.reth) {
        RethRepr {
            va: r.va,
            rkey: r.rkey,
            dma_length: r.len,
        }
        .emit(&mut RethView::new_unchecked(
            &mut buf[o..o + reth::HEADER_LEN],
        ));
    }
    if let (Some(o), Some(a)) = (at.atomic_eth, h.atomic) {
        AtomicEthRepr {
            va: a.va,
            rkey: a.rkey,
            swap_add: a.swap_add,
            compare: a.compare,
        }
        .emit(&mut AtomicEthView::new_unchecked(
            &mut buf[o..o + atomic_eth::HEADER_LEN],
        ));
    }
    if let (Some(o), Some((ack, msn))) = (at.aeth, h.aeth) {
        AethRepr {
            syndrome: syndrome_of(ack),
            msn,
        }
        .emit(&mut Aeth::new_unchecked(&mut buf[o..o + aeth::HEADER_LEN]));
    }
    if let (Some(o), Some(v)) = (at.atomic_ack_eth, h.atomic_ack) {
        AtomicAckEthRepr { orig_rem_dt: v }.emit(&mut AtomicAckEth::new_unchecked(
            &mut buf[o..o + atomic_ack_eth::HEADER_LEN],
        ));
    }
    if let (Some(o), Some(imm)) = (at.immdt, h.imm) {
        ImmDtRepr { imm }.emit(&mut ImmDt::new_unchecked(
            &mut buf[o..o + immdt::HEADER_LEN],
        ));
    }
    Some(at.payload)
}

/// Zeroes the pad after `len` bytes of headers and payload, appends the ICRC for the datagram
/// from `src:src_port` to `dst:4791`, and returns the packet length.
pub(crate) fn seal(
    buf: &mut [u8],
    len: usize,
    src: IpAddr,
    src_port: u16,
    dst: IpAddr,
) -> Option<usize> {
    let pad = pad_for(len) as usize;
    let total = len + pad + icrc::ICRC_LEN;
    let b = buf.get_mut(..total)?;
    b[len..].fill(0);
    let ip = icrc::IpFields::rxe(src, dst).ok()?;
    let crc =
        icrc::compute_for_udp_payload_with(crc_register, ip, src_port, crate::wire::ROCE_PORT, b)
            .ok()?;
    Packet::new_unchecked(&mut b[..]).set_icrc(crc);
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn addrs() -> (IpAddr, IpAddr) {
        (
            IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)),
            IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2)),
        )
    }

    #[test]
    fn a_requester_cqe_carries_its_wqe_opcode_for_libmlx5() {
        let mut buf = [0u8; 64];
        let info = CqeInfo {
            kind: CqeKind::Requester {
                wqe_opcode: u8::from(SendOpcode::RdmaRead),
            },
            qpn: 0x11,
            wqe_counter: 9,
            byte_count: 4096,
            imm: None,
        };
        let op_own = encode_cqe(&mut buf, &info, 1);
        buf[63] = op_own;
        assert_eq!(req_cqe::req_wqe_opcode(&buf).unwrap(), SendOpcode::RdmaRead);
        let c = CqeRepr::parse(&Cqe64::new_checked(&buf[..]).unwrap()).unwrap();
        assert_eq!(
            (c.opcode, c.qpn, c.wqe_counter, c.byte_count),
            (CqeOpcode::Req, 0x11, 9, 4096)
        );
    }

    #[test]
    fn an_emitted_write_first_parses_back_with_a_valid_icrc() {
        let (a, b) = addrs();
        let mut buf = vec![0u8; 2048];
        let mut h = OutHeader::new(Kind::Write, 0x12, 77);
        h.last = false;
        h.reth = Some(Reth {
            va: 0x1000,
            rkey: 0x201,
            len: 5000,
        });
        h.payload_len = 1022;
        let hl = emit_headers(&mut buf, &h).expect("headers");
        for (i, x) in buf[hl..hl + 1022].iter_mut().enumerate() {
            *x = i as u8;
        }
        let n = seal(&mut buf, hl + 1022, a, 0xc123, b).expect("seal");
        let p = parse_packet(&buf[..n], a, 0xc123, b, None).expect("parse");
        assert_eq!(
            (p.kind, p.first, p.last, p.psn, p.dest_qpn),
            (Kind::Write, true, false, 77, 0x12)
        );
        assert_eq!(p.reth, h.reth);
        assert_eq!(p.payload.len(), 1022);
        assert_eq!(&buf[p.payload.clone()][..4], &[0, 1, 2, 3]);
        assert_eq!(
            parse_packet(&buf[..n], a, 0xc124, b, None),
            Err(ParseError::Icrc)
        );
    }

    #[test]
    fn a_packet_of_another_partition_is_dropped_with_a_good_icrc() {
        let (a, b) = addrs();
        let mut buf = vec![0u8; 256];
        let mut h = OutHeader::new(Kind::Send, 0x12, 5);
        h.payload_len = 16;
        let hl = emit_headers(&mut buf, &h).expect("headers");
        let seal_with = |buf: &mut Vec<u8>, pkey: u16| {
            Bth::new_unchecked(&mut buf[..bth::HEADER_LEN]).set_pkey(pkey);
            seal(buf, hl + 16, a, 0xc123, b).expect("seal")
        };
        // The default key, and the same partition as a limited member, are accepted.
        for pkey in [0xffff, 0x7fff] {
            let n = seal_with(&mut buf, pkey);
            assert!(
                parse_packet(&buf[..n], a, 0xc123, b, None).is_ok(),
                "{pkey:#x}"
            );
        }
        // Another partition, and the invalid key 0, are not.
        for pkey in [0x8001, 0x1234, 0x0000, 0x8000] {
            let n = seal_with(&mut buf, pkey);
            assert_eq!(
                parse_packet(&buf[..n], a, 0xc123, b, None),
                Err(ParseError::PKey),
                "{pkey:#x}"
            );
        }
    }

    #[test]
    fn a_ud_send_carries_its_deth_both_ways() {
        // Emitted as the requester of a UD QP emits it, parsed as the engine parses it: the
        // DETH (which the engine uses to keep UD SENDs from RC QPs and to check the Q_Key)
        // comes back, and the opcode is UD's, never an RC SEND's.
        let (a, b) = addrs();
        let mut hdr = OutHeader::new(Kind::UdSend, 0x12, 5);
        let deth = Deth {
            qkey: 0x1111_2222,
            src_qp: 0x34,
        };
        hdr.imm = Some(0xfeed);
        hdr.payload_len = 16;
        let mut buf = vec![0xeeu8; 256];
        let at = emit_ud_headers(&mut buf, &hdr, deth).expect("a UD SEND's headers");
        assert_eq!(at, 12 + 8 + 4, "BTH, DETH, ImmDt");
        assert_eq!(
            Bth::new_checked(&buf[..12]).unwrap().opcode(),
            Opcode::UdSendOnlyWithImmediate
        );
        buf[at..at + 16].fill(7);
        let n = seal(&mut buf, at + 16, a, 0xc123, b).expect("seal");
        let h = parse_packet(&buf[..n], a, 0xc123, b, None).expect("parses");
        assert_eq!(h.kind, Kind::UdSend);
        assert_eq!(deth_of(&buf[..n]), Some(deth));
        assert_eq!(h.imm, Some(0xfeed));
        assert_eq!(&buf[h.payload], &[7; 16]);
        // An RC SEND has none.
        let mut rc = OutHeader::new(Kind::Send, 0x12, 5);
        rc.payload_len = 16;
        let at = emit_headers(&mut buf, &rc).expect("an RC SEND's headers");
        let n = seal(&mut buf, at + 16, a, 0xc123, b).expect("seal");
        assert_eq!(
            parse_packet(&buf[..n], a, 0xc123, b, None).map(|h| h.kind),
            Ok(Kind::Send)
        );
    }

    #[test]
    fn the_fast_crc_register_agrees_with_hw_defs_tables_at_every_length_and_seed() {
        let data: Vec<u8> = (0..5000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for seed in [0u32, !0, 0xdebb_20e3, 0x1234_5678] {
            for len in (0..70).chain([1024, 4095, 4096, 4097, 5000]) {
                assert_eq!(
                    crc_register(seed, &data[..len]),
                    icrc::crc32_register(seed, &data[..len]),
                    "seed {seed:#x}, length {len}"
                );
            }
        }
    }
}
