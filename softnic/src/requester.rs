//! The requester: turns fetched send WQEs into request packets (segmented at the path MTU),
//! keeps the max_rd_atomic and in-flight limits, arms the local ACK timer, and goes back N when
//! the completer says so.

use std::time::Duration;

use hw_defs::verbs::local_ack_timeout;

use crate::codec::{psn_add, psn_delta};
use crate::cqe::{CqeInfo, CqeKind};
use crate::dma;
use crate::mr::MrTable;
use crate::packet::{AtomicEth, Kind, OutHeader, Reth};
use crate::qp::{push_cqe, syndrome, ErrorCtx, Qp, RetransmitProbe};
use crate::qp_attr::QpState;
use crate::tx::Tx;
use crate::wqe::WqeOp;

/// What the requester did in one call.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct ReqOutcome {
    /// Packets put in the batch.
    pub packets: usize,
    /// It stopped because of the budget with more to send.
    pub more: bool,
}

/// Sends up to `budget` packets for `qp`.
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
    let Some((peer, dest_qpn)) = qp.peer() else {
        return out;
    };
    let mtu = qp.mtu();
    let max_rd_atomic = qp.attrs.max_rd_atomic.unwrap_or(1).max(1) as u32;
    while qp.sq.slot_req_ci < qp.sq.slot_pi {
        if out.packets >= budget {
            out.more = true;
            break;
        }
        let at_head = qp.sq.slot_req_ci == qp.sq.slot_ci;
        let w = qp.sq.slot(qp.sq.slot_req_ci);
        if let Some(s) = w.fault {
            // A WQE the device cannot execute fails once everything before it has completed.
            if at_head {
                qp.enter_error(Some(s), ectx);
            }
            break;
        }
        // The fence holds a WQE until the READs and atomics before it have completed: once
        // it was sent they had, and the READs counted now are later ones (a go-back-N that
        // resends it must not wait for them, or it never completes).
        if w.fence && !w.started && qp.req.rd_atomic > 0 {
            break;
        }
        if w.op.is_read_or_atomic() && !w.started && qp.req.rd_atomic >= max_rd_atomic {
            break;
        }
        if !qp.req.window.allows(qp.req.psn, qp.req.comp_psn) {
            // The window waits for ACKs of what is in flight, so the ACK timer must run: a
            // go-back-N stops it until its first resend, and the resend may lie past the
            // window (a NAK past an unanswered atomic rewinds only to the NAK's PSN).
            if qp.req.timer.is_none() {
                let timeout = qp.attrs.timeout.and_then(local_ack_timeout);
                qp.req.timer = timeout.map(|t| tx.now + t);
            }
            break;
        }
        if w.op == WqeOp::Nop {
            // No packet: completes once everything before it is acknowledged.
            let last = psn_add(qp.req.psn, u32::MAX >> 8);
            let w = qp.sq.slot_mut(qp.sq.slot_req_ci);
            w.started = true;
            w.sent_all = true;
            w.done = true;
            w.first_psn = qp.req.psn;
            w.last_psn = last & 0x00ff_ffff;
            qp.sq.slot_req_ci += 1;
            continue;
        }
        qp.req.last_of_turn = out.packets + 1 >= budget;
        match send_one(qp, mrs, tx, peer, dest_qpn, mtu) {
            Ok(()) => out.packets += 1,
            Err(s) => {
                let req = qp.sq.slot_req_ci;
                qp.sq.slot_mut(req).fault = Some(s);
            }
        }
    }
    out
}

/// Sends the next packet of WQE `sq.slot_req_ci`; advances the requester.
fn send_one(
    qp: &mut Qp,
    mrs: &MrTable,
    tx: &mut Tx<'_>,
    peer: std::net::IpAddr,
    dest_qpn: u32,
    mtu: u32,
) -> Result<(), u8> {
    let req = qp.sq.slot_req_ci;
    let psn = qp.req.psn;
    let offset = qp.req.offset;
    let pd = qp.pd;
    let timeout = qp.attrs.timeout.and_then(local_ack_timeout);
    let w = qp.sq.slot_mut(req);
    if offset == 0 {
        if !w.started && w.op.is_read_or_atomic() {
            qp.req.rd_atomic += 1;
        }
        if !w.started {
            w.msn = qp.req.msn;
            qp.req.msn = (qp.req.msn + 1) & 0x00ff_ffff;
        }
        w.started = true;
        w.first_psn = psn;
        w.last_psn = psn_add(psn, w.packets(mtu) - 1);
    }
    let w = qp.sq.slot(req);
    let mut hdr;
    let advance;
    let mut finished = false;
    match w.op {
        WqeOp::Write | WqeOp::WriteImm | WqeOp::Send | WqeOp::SendImm => {
            let is_write = matches!(w.op, WqeOp::Write | WqeOp::WriteImm);
            let n = mtu.min(w.length - offset);
            let first = offset == 0;
            let last = offset + n >= w.length;
            hdr = OutHeader::new(
                if is_write { Kind::Write } else { Kind::Send },
                dest_qpn,
                psn,
            );
            hdr.first = first;
            hdr.last = last;
            hdr.solicited = last && w.solicited;
            hdr.ack_req = last
                || qp.req.last_of_turn
                || qp.req.since_ack_req + 1 >= qp.req.window.ack_every();
            if is_write && first {
                hdr.reth = Some(Reth {
                    va: w.raddr,
                    rkey: w.rkey,
                    len: w.length,
                });
            }
            if last && matches!(w.op, WqeOp::WriteImm | WqeOp::SendImm) {
                hdr.imm = Some(w.imm);
            }
            hdr.payload_len = n;
            let mut fault = None;
            let ok = tx.emit(&hdr, peer, qp.src_port, &mut qp.counters, |buf| {
                if w.inline {
                    match w.inline_data.get(offset as usize..(offset + n) as usize) {
                        Some(src) => {
                            buf.copy_from_slice(src);
                            true
                        }
                        None => {
                            fault = Some(syndrome::LOCAL_LENGTH);
                            false
                        }
                    }
                } else {
                    match dma::gather(mrs, pd, &w.sges, offset as u64, buf) {
                        Ok(()) => true,
                        Err(_) => {
                            fault = Some(syndrome::LOCAL_PROTECTION);
                            false
                        }
                    }
                }
            });
            if let Some(f) = fault {
                return Err(f);
            }
            if !ok {
                return Err(syndrome::LOCAL_LENGTH);
            }
            advance = 1;
            if last {
                finished = true;
            } else {
                qp.req.offset += n;
            }
        }
        WqeOp::Read => {
            hdr = OutHeader::new(Kind::ReadRequest, dest_qpn, psn);
            hdr.ack_req = true;
            hdr.reth = Some(Reth {
                va: w.raddr + offset as u64,
                rkey: w.rkey,
                len: w.length - offset,
            });
            tx.emit(&hdr, peer, qp.src_port, &mut qp.counters, |_| true);
            advance = psn_delta(w.last_psn, psn) as u32 + 1;
            finished = true;
        }
        WqeOp::CompareSwap | WqeOp::FetchAdd => {
            let kind = if w.op == WqeOp::CompareSwap {
                Kind::CompareSwap
            } else {
                Kind::FetchAdd
            };
            hdr = OutHeader::new(kind, dest_qpn, psn);
            hdr.ack_req = true;
            hdr.atomic = Some(AtomicEth {
                va: w.raddr,
                rkey: w.rkey,
                swap_add: w.swap_add,
                compare: w.compare,
            });
            tx.emit(&hdr, peer, qp.src_port, &mut qp.counters, |_| true);
            advance = 1;
            finished = true;
        }
        WqeOp::Nop => unreachable!("NOPs are completed without packets"),
    }
    if psn_delta(psn, qp.req.high_psn) < 0 {
        qp.counters.retransmitted_packets += 1;
    }
    qp.req.psn = psn_add(psn, advance);
    if psn_delta(qp.req.psn, qp.req.high_psn) > 0 {
        qp.req.high_psn = qp.req.psn;
    }
    qp.req.since_ack_req = if hdr.ack_req {
        0
    } else {
        qp.req.since_ack_req + 1
    };
    if finished {
        qp.sq.slot_mut(req).sent_all = true;
        qp.sq.slot_req_ci += 1;
        qp.req.offset = 0;
    }
    if qp.req.timer.is_none() {
        // A short timer covers a first transmission on a path with room. Behind a crowded
        // path its ACK waits for the hundreds of packets queued ahead of it, longer than a
        // short timer: a thousand QPs moved onto a backup at once all fired theirs and resent
        // into the queue that held their first copies. The QP's own timer covers it there.
        let short = qp.req.short_timeout.take().filter(|_| !qp.req.crowded);
        qp.req.timer = short.or(timeout).map(|t| tx.now + t);
        qp.req.short_deadline = short.and(qp.req.timer);
    }
    if qp.req.probe_at.is_none() {
        if let Some(p) = qp.req.probe {
            start_probe(qp, p, tx.now);
        }
    }
    Ok(())
}

/// Whether the QP has sent something not yet acknowledged.
pub(crate) fn unacknowledged(qp: &Qp) -> bool {
    psn_delta(qp.req.high_psn, qp.req.comp_psn) > 0 || qp.sq.slot_ci < qp.sq.slot_req_ci
}

/// Starts a probe's backoff over: the next resend `first` from `now`.
pub(crate) fn start_probe(qp: &mut Qp, probe: RetransmitProbe, now: Duration) {
    qp.req.probe_at = Some(now + probe.first);
    qp.req.probe_next = (probe.first * 2).min(probe.cap);
}

/// Go-back-N: the next packet sent is `from` again, and everything after it.
pub(crate) fn go_back(qp: &mut Qp, from: u32) {
    // Only ever backwards: a PSN at or after the next one to send needs no resending (an
    // earlier go-back-N may already have rewound further).
    if psn_delta(from, qp.req.psn) >= 0 {
        return;
    }
    let mtu = qp.mtu();
    let mut i = qp.sq.slot_ci;
    while i < qp.sq.slot_req_ci {
        let w = qp.sq.slot(i);
        if w.started && w.op != WqeOp::Nop && psn_delta(w.last_psn, from) >= 0 {
            break;
        }
        i += 1;
    }
    if i == qp.sq.slot_req_ci && qp.req.offset == 0 {
        // Nothing sent at or after `from` is outstanding.
        return;
    }
    let w = qp.sq.slot(i);
    let into = psn_delta(from, w.first_psn).max(0) as u32;
    let offset = match w.op {
        WqeOp::Write | WqeOp::WriteImm | WqeOp::Send | WqeOp::SendImm | WqeOp::Read => into * mtu,
        _ => 0,
    };
    let from = if offset == 0 { w.first_psn } else { from };
    for j in i..qp.sq.slot_req_ci.max(i + 1) {
        if j < qp.sq.slot_pi {
            qp.sq.slot_mut(j).sent_all = false;
        }
    }
    qp.sq.slot_req_ci = i;
    qp.req.offset = offset;
    qp.req.psn = from;
    qp.req.since_ack_req = 0;
    // The timer restarts with the first retransmitted packet.
    qp.req.timer = None;
}

/// Resends what is unacknowledged if the probe (or `Device::retransmit_now`) is due: go back
/// N from the oldest unacknowledged PSN, spending no retry and leaving the ACK timer's
/// deadline where it was, so that probes never postpone the RC retry budget.
fn check_probe(qp: &mut Qp, now: Duration) {
    let Some(due) = qp.req.probe_at else { return };
    if qp.state != QpState::Rts {
        qp.req.probe_at = None;
        return;
    }
    if now < due {
        return;
    }
    if !unacknowledged(qp) {
        // Everything was acknowledged: the next transmission starts the probe again.
        qp.req.probe_at = None;
        return;
    }
    qp.req.probe_at = qp.req.probe.map(|p| {
        let wait = qp.req.probe_next;
        qp.req.probe_next = (wait * 2).min(p.cap);
        now + wait
    });
    qp.counters.probe_resends += 1;
    let ack_timer = qp.req.timer;
    qp.req.retrying_from = Some(qp.req.comp_psn);
    let from = qp.req.comp_psn;
    go_back(qp, from);
    qp.req.timer = ack_timer;
}

/// Fires the local ACK timer if due: retry (go back N) or, with no retries left, error. A
/// retransmit probe due first resends without spending a retry.
pub(crate) fn check_timer(qp: &mut Qp, now: Duration, ectx: &mut ErrorCtx<'_>) {
    check_probe(qp, now);
    let Some(deadline) = qp.req.timer else { return };
    if now < deadline || qp.state != QpState::Rts {
        return;
    }
    qp.req.timer = None;
    let short = qp.req.short_deadline.take() == Some(deadline);
    if psn_delta(qp.req.high_psn, qp.req.comp_psn) <= 0 && qp.sq.slot_ci == qp.sq.slot_req_ci {
        return;
    }
    if short {
        // The short timer after a re-post: resend early, spending no retry (the normal timer
        // covers the resend, with every retry left).
        qp.counters.short_timeouts += 1;
        qp.req.retrying_from = Some(qp.req.comp_psn);
        let from = qp.req.comp_psn;
        go_back(qp, from);
        return;
    }
    qp.counters.timeouts += 1;
    if qp.req.retry_left == 0 {
        qp.enter_error(Some(syndrome::TRANSPORT_RETRY_EXCEEDED), ectx);
        return;
    }
    qp.req.retry_left -= 1;
    qp.req.retrying_from = Some(qp.req.comp_psn);
    // Nothing came back for a whole timeout: the medium lost the window's tail (or all of it).
    qp.req.window.lost(&mut qp.counters);
    let from = qp.req.comp_psn;
    go_back(qp, from);
}

/// What a turn of either transport's requester begins with: whether `qp` may send now (in
/// RTS, its RNR wait over), with the WQEs rung since its last turn fetched.
pub(crate) fn ready_to_send(qp: &mut Qp, tx: &Tx<'_>) -> bool {
    if qp.state != QpState::Rts {
        return false;
    }
    if let Some(until) = qp.req.rnr_until {
        if tx.now < until {
            return false;
        }
        qp.req.rnr_until = None;
    }
    if qp.sq.wqe_ci != qp.sq.wqe_db_pi {
        qp.sq.fetch(qp.max_inline, qp.max_send_sge);
    }
    true
}

/// Completes the WQE at the head of the send queue (CQE only when signaled).
pub(crate) fn complete_head(qp: &mut Qp, ectx: &mut ErrorCtx<'_>) {
    let w = qp.sq.slot(qp.sq.slot_ci);
    if w.op.is_read_or_atomic() {
        qp.req.rd_atomic = qp.req.rd_atomic.saturating_sub(1);
    }
    let signaled = w.signaled;
    let info = CqeInfo {
        kind: CqeKind::Requester {
            wqe_opcode: w.mlx5_opcode,
        },
        qpn: qp.qpn,
        wqe_counter: w.index,
        byte_count: match w.op {
            WqeOp::CompareSwap | WqeOp::FetchAdd => 8,
            _ => w.length,
        },
        imm: None,
    };
    qp.sq.slot_ci += 1;
    if qp.sq.slot_req_ci < qp.sq.slot_ci {
        // An ACK overtook a go-back-N in progress and completed the WQE being resent. Resume
        // at the next WQE with the PSNs after it, so no PSN ever names two different packets.
        qp.sq.slot_req_ci = qp.sq.slot_ci;
        qp.req.offset = 0;
        if psn_delta(qp.req.comp_psn, qp.req.psn) > 0 {
            qp.req.psn = qp.req.comp_psn;
        }
    }
    if signaled && !push_cqe(ectx.cqs, qp.send_cq, &info, &mut qp.counters, ectx.events) {
        ectx.events
            .push(crate::events::AsyncEvent::QpFatal { qpn: qp.qpn });
        qp.enter_error(None, ectx);
    }
}
