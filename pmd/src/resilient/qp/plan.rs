//! The driver's side of the failover's planning: which WQEs a round completes or sends again
//! is [`crate::failover::plan`]'s (pure, and run by the model check too) over the WQEs read
//! from the rings; here are what those plans owe the application as completions, and which
//! error completions a failed connection hands it. Nothing here touches a device, so the
//! tests below call the planners directly.

use hw_defs::mlx5::SendOpcode;

use crate::datapath::cq::send_wc_opcode;
use crate::datapath::sq::raw::OutstandingWqe;
use crate::datapath::wr::{WcOpcode, WcStatus, WorkCompletion};
use crate::failover::plan::{CopyPlan, PlannedSend};
use crate::failover::Path;

use super::book::Book;
use super::work::{is_recv, two_sided_opcode};

impl PlannedSend for OutstandingWqe {
    fn two_sided(&self) -> bool {
        two_sided_opcode(self.info.opcode)
    }

    fn is_read(&self) -> bool {
        self.info.opcode == SendOpcode::RdmaRead
    }

    fn maybe_sent(&self) -> bool {
        self.published
    }
}

/// The successful completions the WQEs `plan` skips (of `list`) owe the application: the
/// signaled ones, naming QP `qpn`.
pub(super) fn skipped_completions<'a>(
    plan: &CopyPlan,
    list: &'a [OutstandingWqe],
    qpn: u32,
) -> impl Iterator<Item = WorkCompletion> + 'a {
    plan.skipped(list)
        .filter(|w| w.info.signaled)
        .map(move |w| WorkCompletion {
            wr_id: w.wr_id,
            status: WcStatus::Success,
            opcode: send_wc_opcode(u8::from(w.info.opcode)),
            byte_len: 0,
            imm: None,
            qp_num: qpn,
            vendor_err: 0,
            src_qp: 0,
        })
}

/// One QP's unfinished work when the connection fails, read from its rings: every send WQE
/// and every receive from where its error completions began (or its consumer counter).
#[derive(Debug, Clone, Copy)]
pub(super) struct Unfinished<'a> {
    /// Which QP.
    pub path: Path,
    /// Its send WQEs, oldest first, the failover's own included.
    pub sends: &'a [OutstandingWqe],
    /// Its receives `(counter, wr_id)`, oldest first, stale ones (the backup RQ's head after
    /// a switch-back) left out.
    pub recvs: &'a [(u32, u64)],
}

/// Plans the completions a failed connection hands the application, as a plain RC QP in ERR
/// completes its outstanding work: every send (oldest first: whatever is on the backup SQ was
/// posted before what is on the default SQ, which holds only withheld WRs while the backup is
/// used), then every receive, as `WR_FLUSH_ERR`; the failover's own WQEs (by `book`) are left
/// out. The first completion carries `status`, unless `refusing` (the completion that made
/// failover refuse, polled from its QP) comes first as it is, in place of its WQE. `queues`
/// lists the backup QP first; `book.unsent` (WQEs a round could not move) follow the backup
/// QP's sends, and `book.unsent_recvs` its receives. Appends to `out`, all naming QP `qpn`.
pub(super) fn plan_error_completions(
    queues: [Unfinished<'_>; 2],
    book: &Book,
    refusing: Option<(Path, WorkCompletion)>,
    status: WcStatus,
    qpn: u32,
    out: &mut Vec<WorkCompletion>,
) {
    let from = out.len();
    let flush = |wr_id, opcode| WorkCompletion {
        wr_id,
        status: WcStatus::WrFlushErr,
        opcode,
        byte_len: 0,
        imm: None,
        qp_num: qpn,
        vendor_err: 0,
        src_qp: 0,
    };
    if let Some((_, mut wc)) = refusing {
        wc.qp_num = qpn;
        out.push(wc);
    }
    let refused_here =
        |path: Path, recv: bool| refusing.is_some_and(|(p, wc)| p == path && is_recv(&wc) == recv);
    for q in &queues {
        let application = q.sends.iter().filter(|w| !book.is_internal(w));
        let skip = usize::from(refused_here(q.path, false));
        for w in application.skip(skip) {
            out.push(flush(w.wr_id, send_wc_opcode(u8::from(w.info.opcode))));
        }
        if q.path == Path::Backup {
            for w in &book.unsent {
                out.push(flush(w.wr_id, send_wc_opcode(u8::from(w.info.opcode))));
            }
        }
    }
    for q in &queues {
        let skip = usize::from(refused_here(q.path, true));
        for &(_, wr_id) in q.recvs.iter().skip(skip) {
            out.push(flush(wr_id, WcOpcode::Recv));
        }
        if q.path == Path::Backup {
            for &wr_id in &book.unsent_recvs {
                out.push(flush(wr_id, WcOpcode::Recv));
            }
        }
    }
    if refusing.is_none() {
        if let Some(first) = out.get_mut(from) {
            first.status = status;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::track::WqeInfo;
    use crate::failover::plan::{plan_copy, sends_before_first_read};
    use crate::resilient::qp::work::internal_wr_id;

    fn wqe(counter: u32, wr_id: u64, opcode: SendOpcode, signaled: bool) -> OutstandingWqe {
        OutstandingWqe {
            counter,
            wr_id,
            info: WqeInfo {
                bbs: 1,
                opcode,
                signaled,
            },
            published: true,
        }
    }

    fn ids<'a>(w: impl Iterator<Item = &'a OutstandingWqe>) -> Vec<u64> {
        w.map(|w| w.wr_id).collect()
    }

    /// WRITE, SEND (s), READ (s), WRITE_IMM, SEND (s): three two-sided sends.
    fn mixed() -> Vec<OutstandingWqe> {
        vec![
            wqe(0, 1, SendOpcode::RdmaWrite, false),
            wqe(1, 2, SendOpcode::Send, true),
            wqe(2, 3, SendOpcode::RdmaRead, true),
            wqe(3, 4, SendOpcode::RdmaWriteImm, false),
            wqe(4, 5, SendOpcode::Send, true),
        ]
    }

    #[test]
    fn nothing_consumed_means_everything_is_sent_again() {
        let list = mixed();
        let plan = plan_copy(&list, 10, 7);
        assert_eq!(plan.consumed, 0);
        assert_eq!(ids(plan.posts(&list)), [1, 2, 3, 4, 5]);
        assert_eq!(skipped_completions(&plan, &list, 9).count(), 0);
    }

    #[test]
    fn sends_up_to_the_last_consumed_two_sided_send_are_completed_not_sent() {
        let list = mixed();
        // 10 posted, the last 3 on this ring (ordinals 8, 9, 10); the peer consumed 8.
        let plan = plan_copy(&list, 10, 8);
        assert_eq!(plan.consumed, 2);
        assert!(!plan.overtaken_read);
        assert_eq!(ids(plan.skipped(&list)), [1, 2]);
        // The READ goes again, in its place, with what the peer has not consumed.
        assert_eq!(ids(plan.posts(&list)), [3, 4, 5]);
        let wcs: Vec<WorkCompletion> = skipped_completions(&plan, &list, 0x42).collect();
        assert_eq!(wcs.len(), 1, "only signaled skipped WQEs complete: {wcs:?}");
        assert_eq!(wcs[0].wr_id, 2);
        assert_eq!(wcs[0].status, WcStatus::Success);
        assert_eq!(wcs[0].opcode, WcOpcode::Send);
        assert_eq!(wcs[0].qp_num, 0x42);
    }

    #[test]
    fn a_consumed_send_behind_a_read_marks_the_read_overtaken() {
        let list = mixed();
        // The peer consumed the SEND behind the READ (ordinal 9): the READ may not go again.
        let plan = plan_copy(&list, 10, 9);
        assert_eq!(plan.consumed, 4);
        assert!(plan.overtaken_read);
        let plan = plan_copy(&list, 3, 3);
        assert_eq!(plan.consumed, list.len());
        assert!(plan.overtaken_read);
    }

    #[test]
    fn the_sends_before_the_first_rung_read_are_counted_from_the_connections_total() {
        let list = mixed();
        // 10 posted, 3 on this ring: ordinals 8 (SEND), 9 (WRITE_IMM), 10 (SEND); the READ
        // follows ordinal 8.
        assert_eq!(sends_before_first_read(&list, 10), Some(8));
        let mut withheld = list.clone();
        withheld[2].published = false;
        assert_eq!(sends_before_first_read(&withheld, 10), None);
        let writes = [wqe(0, 1, SendOpcode::RdmaWrite, true)];
        assert_eq!(sends_before_first_read(&writes, 4), None);
    }

    #[test]
    fn a_list_without_two_sided_sends_is_sent_again_whole() {
        let list = [
            wqe(0, 1, SendOpcode::RdmaWrite, true),
            wqe(1, 2, SendOpcode::RdmaRead, true),
        ];
        let plan = plan_copy(&list, 4, 4);
        assert_eq!(plan.consumed, 0);
        assert_eq!(ids(plan.posts(&list)), [1, 2]);
    }

    /// The backup QP's and the default QP's unfinished work, in the planner's order.
    fn queues<'a>(
        backup: (&'a [OutstandingWqe], &'a [(u32, u64)]),
        default: (&'a [OutstandingWqe], &'a [(u32, u64)]),
    ) -> [Unfinished<'a>; 2] {
        [(Path::Backup, backup), (Path::Default, default)]
            .map(|(path, (sends, recvs))| Unfinished { path, sends, recvs })
    }

    /// What the planner hands the application, naming QP 7.
    fn planned(
        queues: [Unfinished<'_>; 2],
        book: &Book,
        refusing: Option<(Path, WorkCompletion)>,
        status: WcStatus,
    ) -> Vec<WorkCompletion> {
        let mut out = Vec::new();
        plan_error_completions(queues, book, refusing, status, 7, &mut out);
        out
    }

    fn statuses(wcs: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
        wcs.iter().map(|w| (w.wr_id, w.status)).collect()
    }

    #[test]
    fn a_failed_connection_flushes_backup_sends_then_default_sends_then_receives() {
        let backup = [wqe(0, 1, SendOpcode::RdmaWrite, true)];
        let default = [wqe(5, 2, SendOpcode::Send, false)];
        let queues = queues((&backup, &[(0, 10)]), (&default, &[(3, 11)]));
        let out = planned(queues, &Book::default(), None, WcStatus::RetryExcErr);
        assert_eq!(
            statuses(&out),
            [
                (1, WcStatus::RetryExcErr),
                (2, WcStatus::WrFlushErr),
                (10, WcStatus::WrFlushErr),
                (11, WcStatus::WrFlushErr),
            ]
        );
        assert_eq!(out[1].opcode, WcOpcode::Send);
        assert_eq!(out[2].opcode, WcOpcode::Recv);
        assert!(out.iter().all(|w| w.qp_num == 7));
    }

    #[test]
    fn the_failovers_own_wqes_are_never_flushed_to_the_application() {
        let backup = [
            wqe(0, internal_wr_id(), SendOpcode::Send, false),
            wqe(1, 1, SendOpcode::RdmaWrite, true),
            wqe(2, internal_wr_id(), SendOpcode::RdmaWrite, true),
        ];
        let book = Book {
            burns: [(0, 1)].into(),
            fence: Some(3),
            ..Book::default()
        };
        let queues = queues((&backup, &[]), (&[], &[]));
        let out = planned(queues, &book, None, WcStatus::RetryExcErr);
        assert_eq!(statuses(&out), [(1, WcStatus::RetryExcErr)]);
    }

    #[test]
    fn a_refusing_completion_comes_first_as_it_is_in_place_of_its_wqe() {
        let default = [
            wqe(0, 1, SendOpcode::RdmaWrite, true),
            wqe(1, 2, SendOpcode::RdmaWrite, true),
        ];
        let refusing = WorkCompletion {
            wr_id: 1,
            status: WcStatus::RemAccessErr,
            opcode: WcOpcode::RdmaWrite,
            vendor_err: 0x22,
            ..WorkCompletion::EMPTY
        };
        let queues = queues((&[], &[]), (&default, &[(0, 10)]));
        let out = planned(
            queues,
            &Book::default(),
            Some((Path::Default, refusing)),
            WcStatus::RemAccessErr,
        );
        assert_eq!(
            statuses(&out),
            [
                (1, WcStatus::RemAccessErr),
                (2, WcStatus::WrFlushErr),
                (10, WcStatus::WrFlushErr),
            ]
        );
        assert_eq!(
            out[0].vendor_err, 0x22,
            "the refusing completion as it was polled"
        );
        assert_eq!(out[0].qp_num, 7);
    }

    #[test]
    fn a_refused_receive_replaces_the_first_receive_of_its_queue() {
        let refusing = WorkCompletion {
            wr_id: 10,
            status: WcStatus::LocLenErr,
            opcode: WcOpcode::Recv,
            ..WorkCompletion::EMPTY
        };
        let default = [wqe(0, 1, SendOpcode::Send, true)];
        let queues = queues((&[], &[(0, 10), (1, 11)]), (&default, &[]));
        let out = planned(
            queues,
            &Book::default(),
            Some((Path::Backup, refusing)),
            WcStatus::LocLenErr,
        );
        assert_eq!(
            statuses(&out),
            [
                (10, WcStatus::LocLenErr),
                (1, WcStatus::WrFlushErr),
                (11, WcStatus::WrFlushErr),
            ]
        );
    }
}
