//! What the service lcore hands a resilient QP's owner: a mailbox it checks with one relaxed
//! load on every poll, and the few facts the owner publishes for the service.
//!
//! This is how the passive half of the protocol gets run without a lock on the datapath
//! (`docs/failover.md`, H4): the service lcore never touches a QP's rings; it puts events in
//! the mailbox, raises the flag and unparks the owner's poller if it registered one. The owner
//! takes the mail the next time it polls (or calls `progress`). An application that never
//! polls hands its QP to the service instead ([`crate::resilient::FailoverService::adopt`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_utils::sync::Unparker;

use crate::control::{Qp, QpHandle, SavedAttrs};
use crate::failover::{Event, Timestamp};

use crate::resilient::channel::{ChannelOwner, ControlChannel};
use crate::resilient::deadline::DeadlineBoard;
use crate::resilient::rendezvous::PeerAttrs;

/// The backup side of a resilient QP, handed to the owner once it is in RTS and connected.
pub(crate) struct BackupParts {
    pub qp: Qp,
    /// The backup QP's seat in a shared backup CQ of its context.
    pub cq: crate::resilient::backup_cq::BackupSeat,
    pub control: std::sync::Arc<ControlChannel>,
    /// The control channel on the default devices (repairs a lost backup side).
    pub default_control: std::sync::Arc<ControlChannel>,
    pub peer: PeerAttrs,
    /// The application's bring-up attributes of the default QP (PSN bases of every epoch).
    pub base: SavedAttrs,
    /// This end on the management network, when it has an endpoint there (5f).
    pub management: Option<Arc<crate::resilient::management::ManagementLink>>,
}

/// One piece of mail.
pub(crate) enum Mail {
    /// Something for the failover machine.
    Event(Event),
    /// The backup side is ready: the QP is protected from now on.
    Protected(Box<BackupParts>),
    /// Setting the backup side up failed; the QP stays unprotected.
    SetupFailed(String),
    /// The device of this path raised its device-fatal event: it completes nothing more.
    DeviceDead(crate::failover::Path),
}

/// Shared between a resilient QP's owner and the service lcore.
pub(crate) struct QpShared {
    pending: AtomicBool,
    mail: Mutex<VecDeque<Mail>>,
    waker: Mutex<Option<Unparker>>,
    /// When the owner next needs to run (`Timestamp` nanoseconds; `u64::MAX`: never).
    next_deadline: AtomicU64,
    /// The service's earliest deadline of all its QPs ([`DeadlineBoard`]), lowered by each
    /// deadline published here.
    board: DeadlineBoard,
    /// The default QP is in RTS in its current epoch and failover may act on it: the link
    /// watch may move it to ERR at once.
    watch_armed: AtomicBool,
    /// The owner is in a state that needs it to poll (a drain, a switch-back wait): a served
    /// QP gets run on the service's short timer.
    busy: AtomicBool,
    /// The default QP, for the link watch.
    pub default_handle: QpHandle,
    /// `qp <qpn> on <device>`, for logs.
    pub name: String,
}

impl ChannelOwner for QpShared {
    fn post_event(&self, event: Event) {
        self.post(Mail::Event(event));
    }
}

impl QpShared {
    pub fn new(default_handle: QpHandle, name: String, board: DeadlineBoard) -> QpShared {
        QpShared {
            pending: AtomicBool::new(false),
            mail: Mutex::new(VecDeque::new()),
            waker: Mutex::new(None),
            next_deadline: AtomicU64::new(u64::MAX),
            board,
            watch_armed: AtomicBool::new(false),
            busy: AtomicBool::new(false),
            default_handle,
            name,
        }
    }

    /// Whether mail is waiting: one relaxed load, the owner's per-poll check. A racing post is
    /// seen on the next poll; the mailbox lock orders the mail itself.
    #[inline(always)]
    pub fn pending(&self) -> bool {
        self.pending.load(Ordering::Relaxed)
    }

    /// Posts mail and wakes the owner.
    pub fn post(&self, mail: Mail) {
        self.mail
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(mail);
        self.pending.store(true, Ordering::Release);
        self.wake();
    }

    /// Unparks the owner's poller, if it registered one.
    pub fn wake(&self) {
        if let Some(u) = &*self.waker.lock().unwrap_or_else(|p| p.into_inner()) {
            u.unpark();
        }
    }

    /// Takes all mail.
    pub fn take(&self, into: &mut VecDeque<Mail>) {
        let mut mail = self.mail.lock().unwrap_or_else(|p| p.into_inner());
        self.pending.store(false, Ordering::Relaxed);
        into.append(&mut mail);
    }

    pub fn set_waker(&self, unparker: Option<Unparker>) {
        *self.waker.lock().unwrap_or_else(|p| p.into_inner()) = unparker;
    }

    pub fn publish(&self, deadline: Option<Timestamp>, watch_armed: bool, busy: bool) {
        let nanos = deadline.map_or(u64::MAX, |t| t.as_nanos());
        // SeqCst with the board's: a walk that read the old deadline (after clearing the
        // board) comes before this store, so the lowering below comes after the clear.
        self.next_deadline.store(nanos, Ordering::SeqCst);
        self.board.lower_to(nanos);
        self.watch_armed.store(watch_armed, Ordering::Relaxed);
        self.busy.store(busy, Ordering::Relaxed);
    }

    pub fn deadline(&self) -> Option<Timestamp> {
        match self.next_deadline.load(Ordering::SeqCst) {
            u64::MAX => None,
            n => Some(Timestamp::from_nanos(n)),
        }
    }

    pub fn watch_armed(&self) -> bool {
        self.watch_armed.load(Ordering::Relaxed)
    }

    pub fn busy(&self) -> bool {
        self.busy.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_board_keeps_the_earliest_deadline_until_cleared() {
        let board = DeadlineBoard::new();
        assert_eq!(board.earliest(), None);
        board.lower_to(u64::MAX);
        assert_eq!(board.earliest(), None, "no deadline changes nothing");
        board.lower_to(500);
        board.lower_to(900);
        assert_eq!(board.earliest(), Some(Timestamp::from_nanos(500)));
        board.clear();
        assert_eq!(board.earliest(), None);
        // Shared: a QP's copy lowers the service's.
        let qp_copy = board.clone();
        qp_copy.lower_to(700);
        assert_eq!(board.earliest(), Some(Timestamp::from_nanos(700)));
    }
}
