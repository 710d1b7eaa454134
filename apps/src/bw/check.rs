//! What `--check` verifies: the server's checks of a checked WRITE or SEND stream and the
//! credits it hands back, its changes of the slots a checked READ stream reads, and the
//! client's account of those changes.

use pmd::{SendOp, SendWr, WorkCompletion};

use crate::error::AppError;
use crate::pattern;
use crate::report::CheckJson;
use crate::session::Session;

use super::Layout;

/// The client's account of the changes a `shift_read_bw --check` server makes to its slots.
#[derive(Debug, Default)]
pub(super) struct Changes {
    /// Change SENDs posted.
    pub(super) sent: u64,
    /// Per remote slot: changes sent (its generation once acknowledged), and the last
    /// change's number.
    pub(super) generation: Vec<u64>,
    pub(super) last: Vec<Option<u64>>,
    /// Per local slot: the pattern the READ in flight into it must bring.
    pub(super) expect: Vec<u64>,
    /// Change SENDs that may await the server's acknowledgement at once.
    pub(super) window: u64,
}

/// What the server's loop tracks under `--check`.
pub(super) struct Checker {
    pub(super) layout: Layout,
    /// Every iteration below it is checked (the credit the client waits for).
    pub(super) next: u64,
    /// `shift_write_bw --check` on several QPs (iteration `i` on QP `i mod QPs`): per QP,
    /// the iteration its next notification must name.
    pub(super) expected: Vec<u64>,
    /// Per slot: whether the iteration of `[next, next + slots)` in it is checked, so that
    /// `next` moves over iterations checked out of order across the QPs.
    pub(super) checked: Vec<bool>,
    pub(super) scratch: Vec<u8>,
    pub(super) json: CheckJson,
    pub(super) credit_at: u64,
    pub(super) credit_addr: u64,
    pub(super) credit_rkey: u32,
}

impl Checker {
    /// A checker for `qps` QPs.
    pub(super) fn new(layout: Layout, qps: usize, credit_addr: u64, credit_rkey: u32) -> Checker {
        Checker {
            layout,
            next: 0,
            expected: (0..qps as u64).collect(),
            checked: vec![false; layout.slots],
            scratch: Vec::new(),
            json: CheckJson {
                enabled: true,
                ..CheckJson::default()
            },
            credit_at: 0,
            credit_addr,
            credit_rkey,
        }
    }

    /// A `shift_write_bw --check` notification on QP `q`: the immediate is that QP's next
    /// iteration and its slot holds that iteration's pattern.
    pub(super) fn notification(
        &mut self,
        s: &mut Session,
        q: usize,
        imm: u32,
    ) -> Result<(), AppError> {
        let qps = self.expected.len() as u64;
        let slots = self.layout.slots as u64;
        let expected = self.expected[q];
        // The immediate carries the iteration's low 32 bits.
        let named = (expected & !0xffff_ffff) | u64::from(imm);
        // Another iteration of this QP inside the window the credits allow: the ones before
        // it never came (counted once, as one out-of-order notification); anything else is
        // taken as the expected one with a wrong immediate.
        let in_window = named >= expected && named < self.next + slots && named % qps == q as u64;
        let i = if in_window { named } else { expected };
        if named != expected {
            self.json.notification_errors += 1;
        }
        self.json.notifications_checked += 1;
        let slot = (i % slots) as usize;
        self.scratch.resize(self.layout.size, 0);
        s.mem.read(slot * self.layout.size, &mut self.scratch);
        self.json.errors += pattern::mismatches(&self.scratch, i);
        self.json.bytes_checked += self.layout.size as u64;
        let mut skipped = expected;
        while skipped <= i {
            self.checked[(skipped % slots) as usize] = true;
            skipped += qps;
        }
        self.expected[q] = i + qps;
        while self.checked[(self.next % slots) as usize] {
            self.checked[(self.next % slots) as usize] = false;
            self.next += 1;
        }
        self.credit(s)
    }

    /// A `shift_send_bw --check` receive: SEND `next` must have landed in receive `next`
    /// (RC consumes receives in order, one per SEND) with the whole message and its bytes.
    /// A receive out of order, or of another length, is a notification error; wrong bytes
    /// are counted against the pattern of `next`, so a SEND in the wrong receive shows too.
    pub(super) fn received_send(
        &mut self,
        s: &mut Session,
        wc: &WorkCompletion,
    ) -> Result<(), AppError> {
        let i = self.next;
        if wc.wr_id != i || wc.byte_len as usize != self.layout.size {
            self.json.notification_errors += 1;
        }
        self.json.notifications_checked += 1;
        let slot = (wc.wr_id % self.layout.slots as u64) as usize;
        self.scratch.resize(self.layout.size, 0);
        s.mem.read(slot * self.layout.size, &mut self.scratch);
        self.json.errors += pattern::mismatches(&self.scratch, i);
        self.json.bytes_checked += self.layout.size as u64;
        self.next = i + 1;
        self.credit(s)
    }

    /// Hands slots (or receives) back to the client every half window (at once for a short
    /// one): an inline WRITE of the checked count into the client's credit word.
    pub(super) fn credit(&mut self, s: &mut Session) -> Result<(), AppError> {
        let step = (self.layout.credit_window / 2).max(1);
        if self.next >= self.credit_at + step {
            self.credit_at = self.next;
            let word = self.next.to_ne_bytes();
            let op = SendOp::Write {
                remote: pmd::Remote {
                    addr: self.credit_addr,
                    rkey: self.credit_rkey,
                },
            };
            s.conns[0].post_send(&SendWr::inline(u64::MAX, op, &word).signaled())?;
            s.conns[0].ring();
        }
        Ok(())
    }
}

/// What a `shift_read_bw --check` server does with the client's change SENDs.
pub(super) struct Changer {
    pub(super) layout: Layout,
    /// Changes made so far.
    pub(super) next: u64,
    /// Per slot: its generation.
    pub(super) generation: Vec<u64>,
    pub(super) scratch: Vec<u8>,
    pub(super) ack_addr: u64,
    pub(super) ack_rkey: u32,
}

impl Changer {
    /// Change `next`: slot `next mod slots` gets its next generation's pattern, then the
    /// client learns (its credit word) that the change is made.
    pub(super) fn change(&mut self, s: &mut Session) -> Result<(), AppError> {
        let slots = self.layout.slots;
        let slot = (self.next % slots as u64) as usize;
        self.generation[slot] += 1;
        self.scratch.resize(self.layout.size, 0);
        pattern::fill(
            &mut self.scratch,
            self.generation[slot] * slots as u64 + slot as u64,
        );
        s.mem.write(slot * self.layout.size, &self.scratch);
        self.next += 1;
        let word = self.next.to_ne_bytes();
        let op = SendOp::Write {
            remote: pmd::Remote {
                addr: self.ack_addr,
                rkey: self.ack_rkey,
            },
        };
        s.conns[0].post_send(&SendWr::inline(u64::MAX, op, &word).signaled())?;
        s.conns[0].ring();
        Ok(())
    }
}
