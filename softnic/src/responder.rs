//! The responder: PSN checking (one NAK per gap, then silence until it fills), duplicate
//! handling (re-ACK, re-read, replay atomics from the cache), receive WQEs, RDMA WRITE/READ and
//! atomics on registered memory with rkey, bounds and access checks, and the matching NAKs.

use crate::codec::{psn_add, psn_delta};
use crate::cqe::{CqeInfo, CqeKind};
use crate::dma::{self, AtomicOp};
use crate::events::AsyncEvent;
use crate::mr::{Access, MrTable};
use crate::packet::{AckKind, Header, Kind, NakCode, OutHeader, Reth};
use crate::qp::{push_cqe, syndrome, ErrorCtx, Qp};
use crate::qp_attr::QpState;
use crate::tx::Tx;

/// Handles one request packet for `qp`.
pub(crate) fn handle(
    qp: &mut Qp,
    h: &Header,
    packet: &[u8],
    mrs: &MrTable,
    tx: &mut Tx<'_>,
    ectx: &mut ErrorCtx<'_>,
) {
    if !matches!(qp.state, QpState::Rtr | QpState::Rts) {
        return;
    }
    let d = psn_delta(h.psn, qp.resp.epsn);
    if d > 0 {
        if !qp.resp.nak_sent {
            qp.resp.nak_sent = true;
            qp.counters.naks_sent.psn_sequence += 1;
            let epsn = qp.resp.epsn;
            send_ack(qp, tx, AckKind::Nak(NakCode::PsnSequence), epsn);
        } else {
            qp.counters.out_of_sequence_drops += 1;
        }
        return;
    }
    if d < 0 {
        qp.counters.duplicate_requests += 1;
        duplicate(qp, h, mrs, tx);
        return;
    }
    qp.resp.nak_sent = false;
    let payload = packet.get(h.payload.clone()).unwrap_or(&[]);
    let mtu = qp.mtu() as usize;
    // Every packet but the last of a message carries exactly one MTU.
    if (h.kind == Kind::Send || h.kind == Kind::Write)
        && (!h.last && payload.len() != mtu || payload.len() > mtu)
    {
        return fatal(qp, tx, ectx, NakCode::InvalidRequest, None);
    }
    match h.kind {
        Kind::Send => send(qp, h, payload, mrs, tx, ectx),
        Kind::Write => write(qp, h, payload, mrs, tx, ectx),
        Kind::ReadRequest => {
            if qp.resp.in_send || qp.resp.in_write {
                return fatal(qp, tx, ectx, NakCode::InvalidRequest, None);
            }
            let Some(reth) = h.reth else {
                return fatal(qp, tx, ectx, NakCode::InvalidRequest, None);
            };
            if reth.len > 0
                && (!qp.allows(Access::REMOTE_READ)
                    || mrs
                        .check(
                            reth.rkey,
                            qp.pd,
                            reth.va,
                            reth.len as u64,
                            Access::REMOTE_READ,
                        )
                        .is_err())
            {
                return fatal(qp, tx, ectx, NakCode::RemoteAccess, None);
            }
            let packets = reth.len.div_ceil(mtu as u32).max(1);
            qp.resp.epsn = psn_add(qp.resp.epsn, packets);
            qp.resp.msn = (qp.resp.msn + 1) & 0x00ff_ffff;
            read_response(qp, h.psn, reth, mrs, tx);
        }
        Kind::CompareSwap | Kind::FetchAdd => {
            if qp.resp.in_send || qp.resp.in_write {
                return fatal(qp, tx, ectx, NakCode::InvalidRequest, None);
            }
            let Some(a) = h.atomic else {
                return fatal(qp, tx, ectx, NakCode::InvalidRequest, None);
            };
            if !qp.allows(Access::REMOTE_ATOMIC)
                || mrs
                    .check(a.rkey, qp.pd, a.va, 8, Access::REMOTE_ATOMIC)
                    .is_err()
            {
                return fatal(qp, tx, ectx, NakCode::RemoteAccess, None);
            }
            if a.va % 8 != 0 {
                return fatal(qp, tx, ectx, NakCode::InvalidRequest, None);
            }
            let op = if h.kind == Kind::CompareSwap {
                AtomicOp::CompareSwap {
                    compare: a.compare,
                    swap: a.swap_add,
                }
            } else {
                AtomicOp::FetchAdd { add: a.swap_add }
            };
            let orig = dma::atomic(a.va, op);
            let slot = qp.resp.atomic_next;
            if let Some(e) = qp.resp.atomic_cache.get_mut(slot) {
                *e = (h.psn, orig);
                qp.resp.atomic_next = (slot + 1) % qp.resp.atomic_cache.len();
            }
            qp.resp.epsn = psn_add(qp.resp.epsn, 1);
            qp.resp.msn = (qp.resp.msn + 1) & 0x00ff_ffff;
            atomic_ack(qp, h.psn, orig, tx);
        }
        _ => qp.counters.malformed_drops += 1,
    }
}

fn send(
    qp: &mut Qp,
    h: &Header,
    payload: &[u8],
    mrs: &MrTable,
    tx: &mut Tx<'_>,
    ectx: &mut ErrorCtx<'_>,
) {
    if qp.resp.in_write || h.first == qp.resp.in_send {
        // FIRST/ONLY inside a message, or MIDDLE/LAST outside one.
        return fatal(qp, tx, ectx, NakCode::InvalidRequest, None);
    }
    if h.first {
        if qp.rq.rwqe_ci == qp.rwqe_db_pi() {
            return rnr(qp, h.psn, tx);
        }
        let mut sges = std::mem::take(&mut qp.resp.recv_sges);
        let parsed = qp.rq.read_next(&mut sges, &mut qp.rq_scratch);
        qp.resp.recv_sges = sges;
        if parsed.is_err() {
            return fatal(
                qp,
                tx,
                ectx,
                NakCode::RemoteOperational,
                Some(syndrome::LOCAL_QP_OPERATION),
            );
        }
        qp.resp.in_send = true;
        qp.resp.recv_offset = 0;
    }
    match dma::scatter(
        mrs,
        qp.pd,
        &qp.resp.recv_sges,
        qp.resp.recv_offset as u64,
        payload,
    ) {
        Ok(true) => {}
        Ok(false) => {
            return fatal(
                qp,
                tx,
                ectx,
                NakCode::InvalidRequest,
                Some(syndrome::LOCAL_LENGTH),
            )
        }
        Err(_) => {
            return fatal(
                qp,
                tx,
                ectx,
                NakCode::RemoteOperational,
                Some(syndrome::LOCAL_PROTECTION),
            )
        }
    }
    qp.resp.recv_offset += payload.len() as u32;
    qp.resp.epsn = psn_add(qp.resp.epsn, 1);
    if h.last {
        qp.resp.in_send = false;
        qp.resp.msn = (qp.resp.msn + 1) & 0x00ff_ffff;
        let info = CqeInfo {
            kind: CqeKind::RecvSend,
            qpn: qp.qpn,
            wqe_counter: qp.rq.rwqe_ci,
            byte_count: qp.resp.recv_offset,
            imm: h.imm,
        };
        qp.rq.rwqe_ci = qp.rq.rwqe_ci.wrapping_add(1);
        recv_cqe(qp, &info, ectx);
    }
    if h.ack_req {
        qp.resp.ack_pending = true;
    }
}

fn write(
    qp: &mut Qp,
    h: &Header,
    payload: &[u8],
    mrs: &MrTable,
    tx: &mut Tx<'_>,
    ectx: &mut ErrorCtx<'_>,
) {
    if qp.resp.in_send || h.first == qp.resp.in_write {
        return fatal(qp, tx, ectx, NakCode::InvalidRequest, None);
    }
    if h.first {
        let Some(reth) = h.reth else {
            return fatal(qp, tx, ectx, NakCode::InvalidRequest, None);
        };
        // A zero-length WRITE touches no memory and needs no valid rkey (IBA 9.4.4).
        if reth.len > 0
            && (!qp.allows(Access::REMOTE_WRITE)
                || mrs
                    .check(
                        reth.rkey,
                        qp.pd,
                        reth.va,
                        reth.len as u64,
                        Access::REMOTE_WRITE,
                    )
                    .is_err())
        {
            return fatal(qp, tx, ectx, NakCode::RemoteAccess, None);
        }
        qp.resp.write_va = reth.va;
        qp.resp.write_rkey = reth.rkey;
        qp.resp.write_left = reth.len as u64;
        qp.resp.write_len = reth.len;
    }
    let len = payload.len() as u64;
    if len > qp.resp.write_left || (h.last && len != qp.resp.write_left) {
        return fatal(qp, tx, ectx, NakCode::InvalidRequest, None);
    }
    if h.imm.is_some() && qp.rq.rwqe_ci == qp.rwqe_db_pi() {
        // WRITE_WITH_IMM needs a receive WQE; check before touching memory.
        if h.first {
            qp.resp.write_left = 0;
        }
        return rnr(qp, h.psn, tx);
    }
    if len > 0
        && dma::write_mem(
            mrs,
            qp.resp.write_rkey,
            qp.pd,
            qp.resp.write_va,
            payload,
            Access::REMOTE_WRITE,
        )
        .is_err()
    {
        return fatal(qp, tx, ectx, NakCode::RemoteAccess, None);
    }
    qp.resp.in_write = !h.last;
    qp.resp.write_va += len;
    qp.resp.write_left -= len;
    qp.resp.epsn = psn_add(qp.resp.epsn, 1);
    if h.last {
        qp.resp.msn = (qp.resp.msn + 1) & 0x00ff_ffff;
        if h.imm.is_some() {
            let info = CqeInfo {
                kind: CqeKind::RecvWriteImm,
                qpn: qp.qpn,
                wqe_counter: qp.rq.rwqe_ci,
                byte_count: qp.resp.write_len,
                imm: h.imm,
            };
            qp.rq.rwqe_ci = qp.rq.rwqe_ci.wrapping_add(1);
            recv_cqe(qp, &info, ectx);
        }
    }
    if h.ack_req {
        qp.resp.ack_pending = true;
    }
}

fn duplicate(qp: &mut Qp, h: &Header, mrs: &MrTable, tx: &mut Tx<'_>) {
    match h.kind {
        // Already executed: acknowledge again, do not execute again.
        Kind::Send | Kind::Write => qp.resp.ack_pending = true,
        // Reads have no side effects: execute again from the request's own parameters.
        Kind::ReadRequest => {
            if let Some(reth) = h.reth {
                let ok = reth.len == 0
                    || (qp.allows(Access::REMOTE_READ)
                        && mrs
                            .check(
                                reth.rkey,
                                qp.pd,
                                reth.va,
                                reth.len as u64,
                                Access::REMOTE_READ,
                            )
                            .is_ok());
                if ok {
                    flush_ack(qp, tx);
                    read_response(qp, h.psn, reth, mrs, tx);
                }
            }
        }
        // Atomics must not run twice: answer from the result cache, or not at all.
        Kind::CompareSwap | Kind::FetchAdd => {
            if let Some(&(_, orig)) = qp.resp.atomic_cache.iter().find(|(psn, _)| *psn == h.psn) {
                flush_ack(qp, tx);
                atomic_ack(qp, h.psn, orig, tx);
            }
        }
        _ => {}
    }
}

fn read_response(qp: &mut Qp, psn: u32, reth: Reth, mrs: &MrTable, tx: &mut Tx<'_>) {
    flush_ack(qp, tx);
    let Some((peer, dest_qpn)) = qp.peer() else {
        return;
    };
    let mtu = qp.mtu();
    let packets = reth.len.div_ceil(mtu).max(1);
    let msn = qp.resp.msn;
    for i in 0..packets {
        let offset = i as u64 * mtu as u64;
        let n = (reth.len as u64 - offset.min(reth.len as u64)).min(mtu as u64) as u32;
        let mut hdr = OutHeader::new(Kind::ReadResponse, dest_qpn, psn_add(psn, i));
        hdr.first = i == 0;
        hdr.last = i + 1 == packets;
        if hdr.first || hdr.last {
            hdr.aeth = Some((AckKind::Ack, msn));
        }
        hdr.payload_len = n;
        let (rkey, pd, va) = (reth.rkey, qp.pd, reth.va + offset);
        tx.emit(&hdr, peer, qp.src_port, &mut qp.counters, |buf| {
            n == 0 || dma::read_mem(mrs, rkey, pd, va, buf, Access::REMOTE_READ).is_ok()
        });
    }
}

fn atomic_ack(qp: &mut Qp, psn: u32, orig: u64, tx: &mut Tx<'_>) {
    flush_ack(qp, tx);
    let Some((peer, dest_qpn)) = qp.peer() else {
        return;
    };
    let mut hdr = OutHeader::new(Kind::AtomicAck, dest_qpn, psn);
    hdr.aeth = Some((AckKind::Ack, qp.resp.msn));
    hdr.atomic_ack = Some(orig);
    tx.emit(&hdr, peer, qp.src_port, &mut qp.counters, |_| true);
}

fn rnr(qp: &mut Qp, psn: u32, tx: &mut Tx<'_>) {
    qp.counters.naks_sent.rnr += 1;
    let timer = qp.attrs.min_rnr_timer.unwrap_or(0);
    send_ack(qp, tx, AckKind::Rnr(timer), psn);
}

/// Sends an ACK or NAK now (after any pending ACK, to keep PSN order on the wire).
fn send_ack(qp: &mut Qp, tx: &mut Tx<'_>, ack: AckKind, psn: u32) {
    flush_ack(qp, tx);
    let Some((peer, dest_qpn)) = qp.peer() else {
        return;
    };
    let mut hdr = OutHeader::new(Kind::Ack, dest_qpn, psn);
    hdr.aeth = Some((ack, qp.resp.msn));
    tx.emit(&hdr, peer, qp.src_port, &mut qp.counters, |_| true);
}

/// Sends the coalesced ACK for everything received so far, if one is owed.
pub(crate) fn flush_ack(qp: &mut Qp, tx: &mut Tx<'_>) {
    if !qp.resp.ack_pending {
        return;
    }
    qp.resp.ack_pending = false;
    let Some((peer, dest_qpn)) = qp.peer() else {
        return;
    };
    let mut hdr = OutHeader::new(Kind::Ack, dest_qpn, psn_add(qp.resp.epsn, 0x00ff_ffff));
    hdr.aeth = Some((AckKind::Ack, qp.resp.msn));
    tx.emit(&hdr, peer, qp.src_port, &mut qp.counters, |_| true);
}

fn recv_cqe(qp: &mut Qp, info: &CqeInfo, ectx: &mut ErrorCtx<'_>) {
    if !push_cqe(ectx.cqs, qp.recv_cq, info, &mut qp.counters, ectx.events) {
        ectx.events.push(AsyncEvent::QpFatal { qpn: qp.qpn });
        qp.enter_error(None, ectx);
    }
}

/// A request the responder cannot execute: NAK it, report a receive error if a receive WQE
/// was involved, and move the QP to the error state.
fn fatal(
    qp: &mut Qp,
    tx: &mut Tx<'_>,
    ectx: &mut ErrorCtx<'_>,
    nak: NakCode,
    recv_syndrome: Option<u8>,
) {
    match nak {
        NakCode::InvalidRequest => qp.counters.naks_sent.invalid_request += 1,
        NakCode::RemoteAccess => qp.counters.naks_sent.remote_access += 1,
        _ => qp.counters.naks_sent.remote_operational += 1,
    }
    let epsn = qp.resp.epsn;
    send_ack(qp, tx, AckKind::Nak(nak), epsn);
    if let Some(s) = recv_syndrome {
        let info = CqeInfo {
            kind: CqeKind::ResponderError { syndrome: s },
            qpn: qp.qpn,
            wqe_counter: qp.rq.rwqe_ci,
            byte_count: 0,
            imm: None,
        };
        qp.rq.rwqe_ci = qp.rq.rwqe_ci.wrapping_add(1);
        push_cqe(ectx.cqs, qp.recv_cq, &info, &mut qp.counters, ectx.events);
    }
    if nak == NakCode::RemoteAccess {
        ectx.events.push(AsyncEvent::QpAccessError { qpn: qp.qpn });
    }
    qp.enter_error(None, ectx);
}
