//! The responder: PSN checking (one NAK per gap, then silence until it fills), duplicate
//! handling (re-ACK; READs and atomics replayed from the recorded resources, never from what
//! the duplicate asks), receive WQEs, RDMA WRITE/READ and atomics on registered memory with
//! rkey, bounds and access checks, and the matching NAKs. READ responses and atomic ACKs go
//! out from [`answer`], a budget per engine round, in PSN order; ACKs and NAKs that would
//! overtake them wait.

use crate::codec::{psn_add, psn_delta};
use crate::cqe::{CqeInfo, CqeKind};
use crate::dma::{self, AtomicOp};
use crate::events::AsyncEvent;
use crate::mr::{Access, MrTable};
use crate::packet::{AckKind, Header, Kind, NakCode, OutHeader};
use crate::qp::{push_cqe, syndrome, ErrorCtx, Qp};
use crate::qp_attr::QpState;
use crate::resources::{Answer, Resource};
use crate::srq;
use crate::tx::Tx;

/// The longest message the responder takes, as rxe (`RXE_MAX_MSG_SZ`): 2^31 bytes. A longer
/// SEND, WRITE or READ is an invalid request, and no offset into a message can overflow.
pub(crate) const MAX_MESSAGE: u64 = 1 << 31;

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
            nak_at_epsn(qp, tx, AckKind::Nak(NakCode::PsnSequence));
        } else {
            qp.counters.out_of_sequence_drops += 1;
        }
        return;
    }
    if d < 0 {
        qp.counters.duplicate_requests += 1;
        duplicate(qp, h);
        return;
    }
    qp.resp.nak_sent = false;
    qp.resp.owed_nak = None;
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
            // Longer than a message may be, or more READs and atomics outstanding than
            // max_dest_rd_atomic allows: an invalid request (as rxe's "too many RDMA READ or
            // atomic requests").
            if u64::from(reth.len) > MAX_MESSAGE || !qp.resp.resources.has_room() {
                return fatal(qp, tx, ectx, NakCode::InvalidRequest, None);
            }
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
            // What is acknowledged before the READ goes out before its responses.
            flush_ack(qp, tx);
            let packets = reth.len.div_ceil(mtu as u32).max(1);
            let msn = (qp.resp.msn + 1) & 0x00ff_ffff;
            let read = Resource {
                psn: h.psn,
                msn,
                answer: Answer::Read { reth, packets },
            };
            if qp.resp.resources.record(read).is_err() {
                return fatal(qp, tx, ectx, NakCode::InvalidRequest, None);
            }
            qp.resp.epsn = psn_add(qp.resp.epsn, packets);
            qp.resp.msn = msn;
        }
        Kind::CompareSwap | Kind::FetchAdd => {
            if qp.resp.in_send || qp.resp.in_write || !qp.resp.resources.has_room() {
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
            flush_ack(qp, tx);
            let orig = dma::atomic(a.va, op);
            let msn = (qp.resp.msn + 1) & 0x00ff_ffff;
            let atomic = Resource {
                psn: h.psn,
                msn,
                answer: Answer::Atomic { orig },
            };
            if qp.resp.resources.record(atomic).is_err() {
                // Room was checked before the atomic ran; nothing between took it.
                return fatal(qp, tx, ectx, NakCode::InvalidRequest, None);
            }
            qp.resp.epsn = psn_add(qp.resp.epsn, 1);
            qp.resp.msn = msn;
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
        let mut sges = std::mem::take(&mut qp.resp.recv_sges);
        let parsed = match &qp.srq {
            Some(s) => srq::lock(s).take(&mut sges).map(|t| {
                qp.resp.srq_wqe = t.index;
                if t.limit_reached {
                    ectx.events.push(AsyncEvent::SrqLimitReached { srq: t.srq });
                }
                t.parsed
            }),
            None if qp.rq.rwqe_ci == qp.rwqe_db_pi() => None,
            None => Some(qp.rq.read_next(&mut sges, &mut qp.rq_scratch)),
        };
        qp.resp.recv_sges = sges;
        let Some(parsed) = parsed else {
            return rnr(qp, h.psn, tx);
        };
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
    if u64::from(qp.resp.recv_offset) + payload.len() as u64 > MAX_MESSAGE {
        return fatal(
            qp,
            tx,
            ectx,
            NakCode::InvalidRequest,
            Some(syndrome::LOCAL_LENGTH),
        );
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
            wqe_counter: qp.recv_done(),
            byte_count: qp.resp.recv_offset,
            imm: h.imm,
        };
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
        if u64::from(reth.len) > MAX_MESSAGE {
            return fatal(qp, tx, ectx, NakCode::InvalidRequest, None);
        }
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
    if h.imm.is_some() && !qp.has_recv() {
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
            if let Some(s) = &qp.srq {
                // Checked above that one is posted; it takes no data, only the completion.
                let mut sges = std::mem::take(&mut qp.resp.recv_sges);
                let taken = srq::lock(s).take(&mut sges);
                qp.resp.recv_sges = sges;
                let Some(t) = taken else {
                    return rnr(qp, h.psn, tx);
                };
                qp.resp.srq_wqe = t.index;
                if t.limit_reached {
                    ectx.events.push(AsyncEvent::SrqLimitReached { srq: t.srq });
                }
                if t.parsed.is_err() {
                    return fatal(
                        qp,
                        tx,
                        ectx,
                        NakCode::RemoteOperational,
                        Some(syndrome::LOCAL_QP_OPERATION),
                    );
                }
            }
            let info = CqeInfo {
                kind: CqeKind::RecvWriteImm,
                qpn: qp.qpn,
                wqe_counter: qp.recv_done(),
                byte_count: qp.resp.write_len,
                imm: h.imm,
            };
            recv_cqe(qp, &info, ectx);
        }
    }
    if h.ack_req {
        qp.resp.ack_pending = true;
    }
}

fn duplicate(qp: &mut Qp, h: &Header) {
    match h.kind {
        // Already executed: acknowledge again, do not execute again.
        Kind::Send | Kind::Write => qp.resp.ack_pending = true,
        // Answered again from the READ recorded at that PSN, from the duplicate's PSN on, if
        // the duplicate asks for just that (the recorded READ, or its tail: what a requester's
        // go-back-N asks); anything else is dropped and counted, so a duplicate never reads
        // what no READ was granted, nor makes the responder send more than recorded READs.
        Kind::ReadRequest => {
            let mtu = u64::from(qp.mtu());
            let found = qp.resp.resources.find(h.psn).filter(|(_, r)| {
                let (Answer::Read { reth: rec, .. }, Some(dup)) = (r.answer, h.reth) else {
                    return false;
                };
                let offset = psn_delta(h.psn, r.psn) as u64 * mtu;
                dup.rkey == rec.rkey
                    && Some(dup.va) == rec.va.checked_add(offset)
                    && Some(u64::from(dup.len)) == u64::from(rec.len).checked_sub(offset)
            });
            match found {
                Some((i, _)) => qp.resp.resources.replay(i, h.psn),
                None => qp.counters.unmatched_duplicates += 1,
            }
        }
        // Atomics must not run twice: answered again from the recorded result, or not at all.
        Kind::CompareSwap | Kind::FetchAdd => {
            let found = qp
                .resp
                .resources
                .find(h.psn)
                .filter(|(_, r)| r.psn == h.psn && matches!(r.answer, Answer::Atomic { .. }));
            match found {
                Some((i, _)) => qp.resp.resources.replay(i, h.psn),
                None => qp.counters.unmatched_duplicates += 1,
            }
        }
        _ => {}
    }
}

/// Sends up to `budget` pending READ response packets and atomic ACKs, in PSN order, then a
/// NAK that waited for them. Returns whether more responses are pending.
///
/// Each READ response is read from registered memory when it is sent, the rkey, bounds and
/// access checked again: an MR deregistered while its READ is answered yields no more bytes;
/// a remote access NAK with the PSN of the response it replaces ends the READ and the QP.
pub(crate) fn answer(
    qp: &mut Qp,
    mrs: &MrTable,
    tx: &mut Tx<'_>,
    ectx: &mut ErrorCtx<'_>,
    budget: usize,
) -> bool {
    if !qp.resp.resources.pending() {
        return false;
    }
    if !matches!(qp.state, QpState::Rtr | QpState::Rts) {
        qp.resp.resources.abandon();
        return false;
    }
    let Some((peer, dest_qpn)) = qp.peer() else {
        return false;
    };
    let mtu = qp.mtu();
    for _ in 0..budget {
        let Some((r, psn)) = qp.resp.resources.next() else {
            break;
        };
        match r.answer {
            Answer::Atomic { orig } => {
                let mut hdr = OutHeader::new(Kind::AtomicAck, dest_qpn, psn);
                hdr.aeth = Some((AckKind::Ack, r.msn));
                hdr.atomic_ack = Some(orig);
                tx.emit(&hdr, peer, qp.src_port, &mut qp.counters, |_| true);
            }
            Answer::Read { reth, packets } => {
                let i = psn_delta(psn, r.psn) as u32;
                let offset = u64::from(i) * u64::from(mtu);
                let n = u64::from(reth.len)
                    .saturating_sub(offset)
                    .min(u64::from(mtu)) as u32;
                let mut hdr = OutHeader::new(Kind::ReadResponse, dest_qpn, psn);
                hdr.first = i == 0;
                hdr.last = i + 1 == packets;
                if hdr.first || hdr.last {
                    hdr.aeth = Some((AckKind::Ack, r.msn));
                }
                hdr.payload_len = n;
                let (rkey, pd, va) = (reth.rkey, qp.pd, reth.va + offset);
                // The QP's own access may have been cut since (RTS->RTS) as well.
                let mut readable = qp.allows(Access::REMOTE_READ) || n == 0;
                if readable {
                    tx.emit(&hdr, peer, qp.src_port, &mut qp.counters, |buf| {
                        readable = n == 0
                            || dma::read_mem(mrs, rkey, pd, va, buf, Access::REMOTE_READ).is_ok();
                        readable
                    });
                }
                if !readable {
                    qp.counters.naks_sent.remote_access += 1;
                    qp.resp.resources.abandon();
                    // Nothing acknowledged past the failed response goes before its NAK.
                    qp.resp.ack_pending = false;
                    send_ack(qp, tx, AckKind::Nak(NakCode::RemoteAccess), psn);
                    ectx.events.push(AsyncEvent::QpAccessError { qpn: qp.qpn });
                    qp.enter_error(None, ectx);
                    return false;
                }
            }
        }
        qp.resp.resources.sent();
    }
    if qp.resp.resources.pending() {
        return true;
    }
    if let Some(nak) = qp.resp.owed_nak.take() {
        let epsn = qp.resp.epsn;
        send_ack(qp, tx, nak, epsn);
    }
    false
}

/// An RNR NAK for `psn` (the expected PSN: the request it refuses was not executed).
fn rnr(qp: &mut Qp, psn: u32, tx: &mut Tx<'_>) {
    debug_assert_eq!(psn, qp.resp.epsn);
    qp.counters.naks_sent.rnr += 1;
    let timer = qp.attrs.min_rnr_timer.unwrap_or(0);
    nak_at_epsn(qp, tx, AckKind::Rnr(timer));
}

/// A PSN-sequence or RNR NAK for the expected PSN: now, or once the pending responses (which
/// come before it in PSN order) are sent.
fn nak_at_epsn(qp: &mut Qp, tx: &mut Tx<'_>, nak: AckKind) {
    if qp.resp.resources.pending() {
        qp.resp.owed_nak.get_or_insert(nak);
    } else {
        let epsn = qp.resp.epsn;
        send_ack(qp, tx, nak, epsn);
    }
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

/// Sends the coalesced ACK for everything received so far, if one is owed and no response
/// before it is still to be sent.
pub(crate) fn flush_ack(qp: &mut Qp, tx: &mut Tx<'_>) {
    if !qp.resp.ack_pending || qp.resp.resources.pending() {
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
    // The QP fails: responses not yet sent never will be, and the NAK goes now.
    qp.resp.resources.abandon();
    let epsn = qp.resp.epsn;
    send_ack(qp, tx, AckKind::Nak(nak), epsn);
    if let Some(s) = recv_syndrome {
        let info = CqeInfo {
            kind: CqeKind::ResponderError { syndrome: s },
            qpn: qp.qpn,
            wqe_counter: qp.recv_done(),
            byte_count: 0,
            imm: None,
        };
        // Reported here: the flush that follows must not report it again.
        qp.resp.in_send = false;
        push_cqe(ectx.cqs, qp.recv_cq, &info, &mut qp.counters, ectx.events);
    }
    if nak == NakCode::RemoteAccess {
        ectx.events.push(AsyncEvent::QpAccessError { qpn: qp.qpn });
    }
    qp.enter_error(None, ectx);
}
