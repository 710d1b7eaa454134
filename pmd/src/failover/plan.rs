//! Which of the outstanding send WQEs a round completes and which it sends again, and which
//! sends went before the oldest READ: pure planning over a list of WQEs that says what each
//! one is ([`PlannedSend`]). The driver plans its ring copies with it, and the model check
//! runs the same functions on its model of the rings, as it runs the same machine.

/// What the planners need to know of one outstanding send WQE.
pub trait PlannedSend {
    /// It consumes a receive WQE at the peer: SEND, SEND_WITH_IMM, WRITE_WITH_IMM.
    fn two_sided(&self) -> bool;
    /// It is an RDMA READ.
    fn is_read(&self) -> bool;
    /// The NIC may have sent it (the driver: its doorbell was rung).
    fn maybe_sent(&self) -> bool;
}

/// What a round does with the outstanding send WQEs of a list (oldest first), from
/// [`plan_copy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyPlan {
    /// How many WQEs at the head of the list the peer has consumed, itself or through a later
    /// two-sided send that it consumed: they are not sent again.
    pub consumed: usize,
    /// Whether a READ is among them: its response never came, and it must not be executed
    /// again (the machine refuses such a round, [`FailReason::ReadOvertaken`], before it
    /// asks for the copy; the driver treats this as the backup QP's error rather than lose
    /// it).
    ///
    /// [`FailReason::ReadOvertaken`]: super::FailReason::ReadOvertaken
    pub overtaken_read: bool,
}

/// The two-sided sends posted before the oldest READ of the outstanding WQEs `list` (oldest
/// first, the last ones posted) that was rung, when `sends_posted` two-sided sends were
/// posted in all; `None` without such a READ. A READ never rung never executed and moves like
/// any WR.
pub fn sends_before_first_read<W: PlannedSend>(list: &[W], sends_posted: u64) -> Option<u64> {
    let mut before = sends_posted.saturating_sub(two_sided_count(list));
    for w in list {
        if w.is_read() && w.maybe_sent() {
            return Some(before);
        }
        if w.two_sided() {
            before += 1;
        }
    }
    None
}

/// Plans the move of the outstanding send WQEs `list` (oldest first; the last ones the
/// application posted) to another SQ, when `sends_posted` two-sided sends were posted in all
/// and the peer has consumed the first `skip_through` of them.
pub fn plan_copy<W: PlannedSend>(list: &[W], sends_posted: u64, skip_through: u64) -> CopyPlan {
    // Two-sided ordinals: the WQEs of the list are the last ones posted.
    let mut ordinal = sends_posted.saturating_sub(two_sided_count(list));
    let mut consumed = 0;
    for (i, w) in list.iter().enumerate() {
        if w.two_sided() {
            ordinal += 1;
            if ordinal <= skip_through {
                consumed = i + 1;
            }
        }
    }
    let overtaken_read = list[..consumed].iter().any(|w| w.is_read());
    CopyPlan {
        consumed,
        overtaken_read,
    }
}

fn two_sided_count<W: PlannedSend>(list: &[W]) -> u64 {
    list.iter().filter(|w| w.two_sided()).count() as u64
}

impl CopyPlan {
    /// The WQEs completed without being sent again, in order: the consumed ones (a plan
    /// with an [`overtaken_read`](Self::overtaken_read) is not to be carried out).
    pub fn skipped<'a, W>(&self, list: &'a [W]) -> impl Iterator<Item = &'a W> + 'a {
        list[..self.consumed].iter()
    }

    /// The WQEs to send again (behind the burns), in order: everything the peer has not
    /// consumed, READs among them (no later request executed at the peer as far as the
    /// peer's counter says, as for a plain RC retransmission).
    pub fn posts<'a, W>(&self, list: &'a [W]) -> impl Iterator<Item = &'a W> + 'a {
        list[self.consumed..].iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A WQE as the planners see it: `t` two-sided, `r` a READ, `w` anything else; upper
    /// case when it may have been sent.
    struct W(char);

    impl PlannedSend for W {
        fn two_sided(&self) -> bool {
            self.0.eq_ignore_ascii_case(&'t')
        }
        fn is_read(&self) -> bool {
            self.0.eq_ignore_ascii_case(&'r')
        }
        fn maybe_sent(&self) -> bool {
            self.0.is_ascii_uppercase()
        }
    }

    fn list(s: &str) -> Vec<W> {
        s.chars().map(W).collect()
    }

    #[test]
    fn the_peers_count_names_the_last_consumed_send_of_the_lists_tail() {
        // 5 two-sided posted, the last 2 on the list: ordinals 4 and 5.
        let l = list("WTWTW");
        assert_eq!(plan_copy(&l, 5, 3).consumed, 0);
        assert_eq!(plan_copy(&l, 5, 4).consumed, 2);
        assert_eq!(plan_copy(&l, 5, 5).consumed, 4);
    }

    #[test]
    fn only_a_read_that_may_have_been_sent_bounds_the_peers_count() {
        assert_eq!(sends_before_first_read(&list("TrTRT"), 7), Some(6));
        assert_eq!(sends_before_first_read(&list("TrT"), 7), None);
        assert!(plan_copy(&list("TRT"), 2, 2).overtaken_read);
        assert!(!plan_copy(&list("TRT"), 2, 1).overtaken_read);
    }
}
