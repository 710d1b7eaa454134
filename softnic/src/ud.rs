//! Unreliable datagram QPs: a UD QP's sends and receives, beside RC's requester and
//! responder, which a UD QP never enters.
//!
//! A UD SEND is one packet (UD SEND Only, with its immediate if it has one), addressed by its
//! WQE's datagram segment, its DETH naming the Q_Key the destination must have and this QP as
//! the sender. It is completed as soon as it is on the wire: nothing acknowledges it, nothing
//! resends it, and a message longer than the QP's MTU fails with a local length error. A
//! received UD SEND is taken only by a UD QP in RTR or RTS whose Q_Key it carries, into the
//! next posted receive, which gets the 40-byte GRH and then the payload; its CQE names the
//! sending QP. One that finds no receive posted is dropped and counted: UD has no RNR.

use std::net::IpAddr;

use hw_defs::roce::ipv4::{self, Ipv4Packet, Ipv4Repr};
use hw_defs::roce::ipv6::{Ipv6Packet, Ipv6Repr};
use hw_defs::roce::udp;

use crate::codec::{self, psn_add};
use crate::cqe::{CqeInfo, CqeKind};
use crate::dma;
use crate::events::AsyncEvent;
use crate::mr::MrTable;
use crate::packet::{Deth, Header, Kind, OutHeader};
use crate::qp::{push_cqe, syndrome, ErrorCtx, Qp};
use crate::qp_attr::QpState;
use crate::requester::{complete_head, ready_to_send, ReqOutcome};
use crate::tx::Tx;
use crate::wire::Ipv4Ident;
use crate::wqe::{UdDest, WqeOp};

/// Bytes of the Global Route Header a UD receive gets before the payload (for RoCEv2 over
/// IPv4: 20 zero bytes, then the IPv4 header, as rxe and ConnectX lay it out).
pub const GRH_LEN: usize = 40;

/// The TTL (hop limit) written in a received datagram's GRH: the wire does not report the
/// one the packet had, so it is the one softnic's senders write.
const GRH_HOP_LIMIT: u8 = 64;

/// Sends up to `budget` of a UD QP's fetched WQEs, one packet each, completing each at once.
pub(crate) fn run(
    qp: &mut Qp,
    mrs: &MrTable,
    tx: &mut Tx<'_>,
    ectx: &mut ErrorCtx<'_>,
    budget: usize,
) -> ReqOutcome {
    let mut out = ReqOutcome::default();
    if !ready_to_send(qp, tx) {
        return out;
    }
    let mtu = qp.mtu();
    while qp.state == QpState::Rts && qp.sq.slot_ci < qp.sq.slot_pi {
        if out.packets >= budget {
            out.more = true;
            break;
        }
        let w = qp.sq.slot(qp.sq.slot_ci);
        let sent = match (w.fault, w.op, w.ud) {
            (Some(s), ..) => Err(s),
            (None, WqeOp::Nop, _) => Ok(false),
            (None, WqeOp::Send | WqeOp::SendImm, Some(dest)) if w.length <= mtu => {
                send_datagram(qp, mrs, tx, dest).map(|()| true)
            }
            (None, WqeOp::Send | WqeOp::SendImm, Some(_)) => Err(syndrome::LOCAL_LENGTH),
            // `decode_send_wqe` lets only SENDs (with their datagram segment) and NOPs
            // through on a UD QP; anything else is the QP's own error, not a panic.
            (None, ..) => Err(syndrome::LOCAL_QP_OPERATION),
        };
        match sent {
            Ok(packet) => {
                out.packets += usize::from(packet);
                qp.sq.slot_req_ci = qp.sq.slot_ci + 1;
                complete_head(qp, ectx);
            }
            Err(s) => {
                // The WQE at the head fails with its syndrome, the rest are flushed.
                qp.enter_error(Some(s), ectx);
                break;
            }
        }
    }
    out
}

/// Puts one UD SEND on the wire: the WQE at the head, to `dest`.
fn send_datagram(qp: &mut Qp, mrs: &MrTable, tx: &mut Tx<'_>, dest: UdDest) -> Result<(), u8> {
    if dest.addr.is_ipv4() != tx.local_addr.is_ipv4() {
        // An address of the other family: no RoCEv2 packet between the two.
        return Err(syndrome::LOCAL_QP_OPERATION);
    }
    let psn = qp.req.psn;
    let pd = qp.pd;
    let w = qp.sq.slot(qp.sq.slot_ci);
    let mut hdr = OutHeader::new(Kind::UdSend, dest.qpn, psn);
    let deth = Deth {
        qkey: dest.qkey,
        src_qp: qp.qpn,
    };
    hdr.solicited = w.solicited;
    if w.op == WqeOp::SendImm {
        hdr.imm = Some(w.imm);
    }
    hdr.payload_len = w.length;
    let mut fault = None;
    let headers = |buf: &mut [u8]| codec::emit_ud_headers(buf, &hdr, deth);
    let (len, port) = (hdr.payload_len, qp.src_port);
    let ok = tx.emit_with(headers, len, dest.addr, port, &mut qp.counters, |buf| {
        if w.inline {
            match w.inline_data.get(..buf.len()) {
                Some(src) => {
                    buf.copy_from_slice(src);
                    true
                }
                None => {
                    fault = Some(syndrome::LOCAL_LENGTH);
                    false
                }
            }
        } else if dma::gather(mrs, pd, &w.sges, 0, buf).is_ok() {
            true
        } else {
            fault = Some(syndrome::LOCAL_PROTECTION);
            false
        }
    });
    if !ok {
        return Err(fault.unwrap_or(syndrome::LOCAL_LENGTH));
    }
    // Nothing waits for an acknowledgment: the PSN only counts the datagrams sent.
    let next = psn_add(psn, 1);
    qp.req.psn = next;
    qp.req.comp_psn = next;
    qp.req.high_psn = next;
    Ok(())
}

/// Where a received datagram came from, as the wire saw it.
pub(crate) struct Arrival {
    /// The sender's address.
    pub src: IpAddr,
    /// This device's address.
    pub dst: IpAddr,
    /// The IPv4 header's identification and DF flag, when the wire saw the header.
    pub ipv4: Option<Ipv4Ident>,
}

/// Takes one received packet for a UD QP: a UD SEND carrying the QP's Q_Key goes into the
/// next posted receive after its GRH; anything else is dropped and counted.
pub(crate) fn receive(
    qp: &mut Qp,
    h: &Header,
    packet: &[u8],
    from: &Arrival,
    mrs: &MrTable,
    ectx: &mut ErrorCtx<'_>,
) {
    let deth = match h.kind {
        Kind::UdSend => codec::deth_of(packet),
        // An RC packet: a UD QP has no connection to take it on.
        _ => None,
    };
    let Some(deth) = deth else {
        qp.counters.malformed_drops += 1;
        return;
    };
    if !matches!(qp.state, QpState::Rtr | QpState::Rts) {
        return;
    }
    if qp.attrs.qkey != Some(deth.qkey) {
        qp.counters.qkey_drops += 1;
        return;
    }
    qp.counters.rx_packets += 1;
    qp.counters.rx_bytes += packet.len() as u64;
    if qp.rq.rwqe_ci == qp.rwqe_db_pi() {
        qp.counters.no_receive_drops += 1;
        return;
    }
    let mut sges = std::mem::take(&mut qp.resp.recv_sges);
    let parsed = qp.rq.read_next(&mut sges, &mut qp.rq_scratch);
    qp.resp.recv_sges = sges;
    if parsed.is_err() {
        return fail(qp, ectx, syndrome::LOCAL_QP_OPERATION);
    }
    let payload = packet.get(h.payload.clone()).unwrap_or(&[]);
    let grh = grh(from, udp::HEADER_LEN + packet.len());
    let placed = dma::scatter(mrs, qp.pd, &qp.resp.recv_sges, 0, &grh).and_then(|fit| {
        Ok(fit && dma::scatter(mrs, qp.pd, &qp.resp.recv_sges, GRH_LEN as u64, payload)?)
    });
    match placed {
        Ok(true) => {}
        Ok(false) => return fail(qp, ectx, syndrome::LOCAL_LENGTH),
        Err(_) => return fail(qp, ectx, syndrome::LOCAL_PROTECTION),
    }
    let info = CqeInfo {
        kind: CqeKind::RecvUd {
            src_qp: deth.src_qp,
        },
        qpn: qp.qpn,
        wqe_counter: qp.recv_done(),
        byte_count: (GRH_LEN + payload.len()) as u32,
        imm: h.imm,
    };
    if !push_cqe(ectx.cqs, qp.recv_cq, &info, &mut qp.counters, ectx.events) {
        ectx.events.push(AsyncEvent::QpFatal { qpn: qp.qpn });
        qp.enter_error(None, ectx);
    }
}

/// A receive the device cannot complete (a malformed receive WQE, a buffer too short or not
/// registered): its error CQE, and the QP moves to ERR, as a ConnectX's UD QP does.
fn fail(qp: &mut Qp, ectx: &mut ErrorCtx<'_>, s: u8) {
    let info = CqeInfo {
        kind: CqeKind::ResponderError { syndrome: s },
        qpn: qp.qpn,
        wqe_counter: qp.recv_done(),
        byte_count: 0,
        imm: None,
    };
    push_cqe(ectx.cqs, qp.recv_cq, &info, &mut qp.counters, ectx.events);
    qp.enter_error(None, ectx);
}

/// The GRH of a datagram that came `from` with `udp_len` bytes of UDP header and payload:
/// for IPv4, 20 zero bytes and then the IPv4 header rebuilt from what the wire saw; for IPv6,
/// the IPv6 header.
fn grh(from: &Arrival, udp_len: usize) -> [u8; GRH_LEN] {
    let mut grh = [0u8; GRH_LEN];
    match (from.src, from.dst) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => {
            let seen = from.ipv4.unwrap_or(Ipv4Ident {
                ident: 0,
                dont_frag: true,
            });
            let ip = Ipv4Repr {
                src_addr: src,
                dst_addr: dst,
                protocol: ipv4::PROTOCOL_UDP,
                payload_len: udp_len,
                ttl: GRH_HOP_LIMIT,
                dscp_ecn: 0,
                ident: seen.ident,
                dont_frag: seen.dont_frag,
            };
            // 20 bytes fit, and a UDP payload is never longer than an IPv4 packet may be.
            let _ = ip.emit(&mut Ipv4Packet::new_unchecked(&mut grh[GRH_LEN - 20..]));
        }
        (src, dst) => {
            let ip = Ipv6Repr {
                src_addr: v6(src),
                dst_addr: v6(dst),
                next_header: ipv4::PROTOCOL_UDP,
                payload_len: udp_len,
                hop_limit: GRH_HOP_LIMIT,
                traffic_class: 0,
                flow_label: 0,
            };
            let _ = ip.emit(&mut Ipv6Packet::new_unchecked(&mut grh[..]));
        }
    }
    grh
}

/// An address as IPv6 (an IPv4 one mapped).
fn v6(a: IpAddr) -> std::net::Ipv6Addr {
    match a {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}
