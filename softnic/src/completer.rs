//! The completer: acts on ACKs, NAKs, READ responses and atomic ACKs. Cumulative ACKs
//! complete WQEs in order; READ data and atomic results are scattered into local memory; NAKs
//! and lost responses start go-back-N; RNR NAKs pause the requester; fatal NAKs error the QP.

use std::time::Duration;

use hw_defs::verbs::local_ack_timeout;

use crate::codec::{psn_add, psn_delta};
use crate::dma;
use crate::mr::MrTable;
use crate::packet::{rnr_timer, AckKind, Header, Kind, NakCode};
use crate::qp::{syndrome, ErrorCtx, Qp};
use crate::qp_attr::QpState;
use crate::requester::{complete_head, go_back, start_probe};
use crate::wqe::WqeOp;

/// Handles one response packet for `qp`.
pub(crate) fn handle(
    qp: &mut Qp,
    h: &Header,
    packet: &[u8],
    mrs: &MrTable,
    now: Duration,
    ectx: &mut ErrorCtx<'_>,
) {
    if qp.state != QpState::Rts {
        return;
    }
    // A response is acted on only if it answers a PSN outstanding and fits the request sent
    // at that PSN; anything else (a late duplicate, or a packet forged by a host that does not
    // know the window) is counted and dropped before it can complete, retry or end anything.
    if psn_delta(h.psn, qp.req.comp_psn) < 0 || psn_delta(h.psn, qp.req.high_psn) >= 0 {
        qp.counters.response_psn_drops += 1;
        return;
    }
    let at = wqe_at(qp, h.psn).map(|i| qp.sq.slot(i));
    let fits_opcode = match h.kind {
        Kind::ReadResponse => at.is_some_and(|w| w.op == WqeOp::Read),
        Kind::AtomicAck => at.is_some_and(|w| {
            w.op.is_read_or_atomic() && w.op != WqeOp::Read && w.first_psn == h.psn
        }),
        _ => true,
    };
    if !fits_opcode {
        qp.counters.response_opcode_drops += 1;
        return;
    }
    if let (Kind::Ack, Some((AckKind::Nak(code), msn))) = (h.kind, h.aeth) {
        // The responder NAKs the request it could not execute and says how many messages it
        // took before it: the messages this QP started before that request. A READ counts
        // when it is received, and requests after it may be taken while its responses go
        // out, so a NAK in a READ's responses says that many or more (up to every message
        // started). A host that guessed a PSN in the window must guess this too.
        let fits = at.is_some_and(|w| {
            let over = msn.wrapping_sub(w.msn) & 0x00ff_ffff;
            over == 0 || w.op == WqeOp::Read && over <= qp.req.msn.wrapping_sub(w.msn) & 0x00ff_ffff
        });
        if code.is_fatal() && !fits {
            qp.counters.nak_msn_drops += 1;
            return;
        }
    }
    let before = qp.req.comp_psn;
    match h.kind {
        Kind::Ack => {
            let Some((ack, _msn)) = h.aeth else {
                qp.counters.malformed_drops += 1;
                return;
            };
            match ack {
                AckKind::Ack => acknowledge_through(qp, h.psn, ectx),
                AckKind::Rnr(code) => {
                    qp.counters.naks_received.rnr += 1;
                    acknowledge_through(qp, psn_add(h.psn, 0x00ff_ffff), ectx);
                    if qp.state != QpState::Rts {
                        return;
                    }
                    if qp.req.comp_psn != before {
                        progressed(qp, before, now);
                    }
                    if qp.req.rnr_left == 0 {
                        qp.enter_error(Some(syndrome::RNR_RETRY_EXCEEDED), ectx);
                        return;
                    }
                    if qp.req.rnr_left != 7 {
                        qp.req.rnr_left -= 1;
                    }
                    qp.counters.rnr_waits += 1;
                    qp.req.rnr_until = Some(now + rnr_timer(code));
                    qp.req.timer = None;
                    go_back(qp, h.psn);
                    return;
                }
                AckKind::Nak(code) => {
                    acknowledge_through(qp, psn_add(h.psn, 0x00ff_ffff), ectx);
                    if qp.state != QpState::Rts {
                        return;
                    }
                    // What the NAK implicitly acknowledged is progress like any other.
                    if qp.req.comp_psn != before {
                        progressed(qp, before, now);
                    }
                    match code {
                        NakCode::PsnSequence => {
                            qp.counters.naks_received.psn_sequence += 1;
                            if qp.req.retrying_from == Some(h.psn) {
                                return;
                            }
                            if qp.req.retry_left == 0 {
                                qp.enter_error(Some(syndrome::TRANSPORT_RETRY_EXCEEDED), ectx);
                                return;
                            }
                            qp.req.retry_left -= 1;
                            qp.req.retrying_from = Some(h.psn);
                            // The peer saw a gap: the medium dropped a packet of the window.
                            qp.req.window.lost(&mut qp.counters);
                            go_back(qp, h.psn);
                        }
                        NakCode::InvalidRequest => {
                            qp.counters.naks_received.invalid_request += 1;
                            qp.enter_error(Some(syndrome::REMOTE_INVALID_REQUEST), ectx);
                        }
                        NakCode::RemoteAccess => {
                            qp.counters.naks_received.remote_access += 1;
                            qp.enter_error(Some(syndrome::REMOTE_ACCESS), ectx);
                        }
                        NakCode::RemoteOperational | NakCode::Other(_) => {
                            qp.counters.naks_received.remote_operational += 1;
                            qp.enter_error(Some(syndrome::REMOTE_OPERATIONAL), ectx);
                        }
                    }
                    return;
                }
            }
        }
        Kind::AtomicAck => {
            acknowledge_through(qp, psn_add(h.psn, 0x00ff_ffff), ectx);
            if qp.state != QpState::Rts || qp.sq.slot_ci >= qp.sq.slot_req_ci {
                return;
            }
            let pd = qp.pd;
            let w = qp.sq.slot_mut(qp.sq.slot_ci);
            if !w.op.is_read_or_atomic() || w.op == WqeOp::Read || w.first_psn != h.psn || w.done {
                return;
            }
            let Some(orig) = h.atomic_ack else {
                qp.counters.malformed_drops += 1;
                return;
            };
            if dma::scatter(mrs, pd, &w.sges, 0, &orig.to_ne_bytes()).is_err() {
                qp.enter_error(Some(syndrome::LOCAL_PROTECTION), ectx);
                return;
            }
            w.done = true;
            qp.req.comp_psn = psn_add(h.psn, 1);
            complete_head(qp, ectx);
            acknowledge_through(qp, h.psn, ectx);
        }
        Kind::ReadResponse => {
            acknowledge_through(qp, psn_add(h.psn, 0x00ff_ffff), ectx);
            if qp.state != QpState::Rts || qp.sq.slot_ci >= qp.sq.slot_req_ci {
                return;
            }
            // Behind the window was dropped above: a late duplicate, already placed.
            if psn_delta(h.psn, qp.req.comp_psn) > 0 {
                // Responses were lost in front of this one: go back to the first missing PSN once.
                if qp.req.retrying_from != Some(qp.req.comp_psn) {
                    qp.req.retrying_from = Some(qp.req.comp_psn);
                    // The READ's responses count against this QP's window: they were lost.
                    qp.req.window.lost(&mut qp.counters);
                    let from = qp.req.comp_psn;
                    go_back(qp, from);
                }
                return;
            }
            let mtu = qp.mtu();
            let pd = qp.pd;
            let w = qp.sq.slot_mut(qp.sq.slot_ci);
            if w.op != WqeOp::Read
                || w.done
                || psn_delta(h.psn, w.first_psn) < 0
                || psn_delta(h.psn, w.last_psn) > 0
            {
                qp.counters.malformed_drops += 1;
                return;
            }
            let offset = psn_delta(h.psn, w.first_psn) as u64 * mtu as u64;
            let data = packet.get(h.payload.clone()).unwrap_or(&[]);
            let is_last = h.psn == w.last_psn;
            let expected = if is_last {
                (w.length as u64).saturating_sub(offset)
            } else {
                mtu as u64
            };
            if data.len() as u64 != expected || h.last != is_last {
                qp.counters.malformed_drops += 1;
                return;
            }
            match dma::scatter(mrs, pd, &w.sges, offset, data) {
                Ok(true) => {}
                Ok(false) => {
                    qp.enter_error(Some(syndrome::LOCAL_LENGTH), ectx);
                    return;
                }
                Err(_) => {
                    qp.enter_error(Some(syndrome::LOCAL_PROTECTION), ectx);
                    return;
                }
            }
            qp.req.comp_psn = psn_add(h.psn, 1);
            if is_last {
                w.done = true;
                complete_head(qp, ectx);
                acknowledge_through(qp, h.psn, ectx);
            }
        }
        _ => {
            qp.counters.malformed_drops += 1;
            return;
        }
    }
    if qp.req.comp_psn != before {
        progressed(qp, before, now);
    }
}

/// The fetched WQE (absolute slot counter) whose PSNs include `psn`, among those sent.
fn wqe_at(qp: &Qp, psn: u32) -> Option<u64> {
    (qp.sq.slot_ci..qp.sq.slot_pi).find(|&i| {
        let w = qp.sq.slot(i);
        w.started
            && w.op != WqeOp::Nop
            && psn_delta(psn, w.first_psn) >= 0
            && psn_delta(psn, w.last_psn) <= 0
    })
}

/// The peer acknowledged every PSN up to and including `psn`: complete what that finishes.
fn acknowledge_through(qp: &mut Qp, psn: u32, ectx: &mut ErrorCtx<'_>) {
    while qp.state == QpState::Rts && qp.sq.slot_ci < qp.sq.slot_pi {
        let w = qp.sq.slot(qp.sq.slot_ci);
        if !w.started {
            break;
        }
        if w.op == WqeOp::Nop {
            if psn_delta(qp.req.comp_psn, w.first_psn) >= 0 || psn_delta(psn, w.last_psn) >= 0 {
                complete_head(qp, ectx);
                continue;
            }
            break;
        }
        if psn_delta(psn, w.first_psn) < 0 {
            break;
        }
        if psn_delta(psn, w.last_psn) >= 0 {
            if w.op.is_read_or_atomic() && !w.done {
                // Acknowledged past a READ or atomic whose response never came: ask again.
                let from = w.first_psn;
                let from = if psn_delta(qp.req.comp_psn, from) > 0 {
                    qp.req.comp_psn
                } else {
                    from
                };
                if qp.req.retrying_from != Some(from) {
                    qp.req.retrying_from = Some(from);
                    go_back(qp, from);
                }
                break;
            }
            if psn_delta(psn_add(w.last_psn, 1), qp.req.comp_psn) > 0 {
                qp.req.comp_psn = psn_add(w.last_psn, 1);
            }
            complete_head(qp, ectx);
            continue;
        }
        // Partly acknowledged multi-packet WRITE or SEND.
        if !w.op.is_read_or_atomic() && psn_delta(psn_add(psn, 1), qp.req.comp_psn) > 0 {
            qp.req.comp_psn = psn_add(psn, 1);
        }
        break;
    }
}

/// Forward progress from `before` (the oldest PSN not acknowledged until now): fresh retry
/// budgets, a restarted (or stopped) ACK timer, and the acknowledged PSNs grow the window.
fn progressed(qp: &mut Qp, before: u32, now: Duration) {
    qp.req
        .window
        .acknowledged(psn_delta(qp.req.comp_psn, before).max(0) as u32);
    qp.req.retry_left = qp.attrs.retry_cnt.unwrap_or(7);
    qp.req.rnr_left = qp.attrs.rnr_retry.unwrap_or(7);
    qp.req.retrying_from = None;
    // What follows runs on the QP's own timer, never on a short one armed before.
    qp.req.short_deadline = None;
    let outstanding =
        psn_delta(qp.req.high_psn, qp.req.comp_psn) > 0 || qp.sq.slot_ci < qp.sq.slot_req_ci;
    qp.req.timer = if outstanding {
        qp.attrs
            .timeout
            .and_then(local_ack_timeout)
            .map(|t| now + t)
    } else {
        None
    };
    // The path carries packets: a probe's backoff starts over.
    qp.req.probe_at = None;
    if let (true, Some(p)) = (outstanding, qp.req.probe) {
        start_probe(qp, p, now);
    }
}
