//! The responder's READ and atomic resources, `max_dest_rd_atomic` of them (the IBA's
//! "responder resources"; rxe keeps the same table): every READ and atomic the responder
//! executed, recorded so that a duplicate request is answered from what was recorded and never
//! from what the duplicate asks, and the responses still to send, which the engine sends a
//! budget per round in PSN order (a 1 GiB READ is answered over many rounds, never built whole
//! under the device lock).

use crate::codec::{psn_add, psn_delta};
use crate::packet::Reth;

/// What an executed READ or atomic answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// READ response packets over the recorded remote buffer.
    Read { reth: Reth, packets: u32 },
    /// One atomic ACK carrying the original value.
    Atomic { orig: u64 },
}

/// One executed READ or atomic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Resource {
    /// Its first PSN.
    pub psn: u32,
    /// The MSN after it executed (the AETH of its responses).
    pub msn: u32,
    pub answer: Answer,
}

impl Resource {
    /// Response packets it takes (at least one).
    pub fn packets(&self) -> u32 {
        match self.answer {
            Answer::Read { packets, .. } => packets,
            Answer::Atomic { .. } => 1,
        }
    }

    /// Its last PSN.
    pub fn last_psn(&self) -> u32 {
        psn_add(self.psn, self.packets() - 1)
    }

    /// Whether `psn` is one of its PSNs.
    pub fn covers(&self, psn: u32) -> bool {
        psn_delta(psn, self.psn) >= 0 && psn_delta(psn, self.last_psn()) <= 0
    }
}

/// The peer started more READs and atomics than `max_dest_rd_atomic` allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TooMany;

/// The table. Resources are numbered in the order they executed (absolute, 64-bit); number
/// `i` lives in slot `i % capacity`, so the table holds the last `capacity` of them.
#[derive(Debug, Default)]
pub(crate) struct Resources {
    slots: Vec<Resource>,
    capacity: usize,
    /// Resources recorded so far.
    pi: u64,
    /// The first resource with responses still to send (`pi`: none).
    send_ci: u64,
    /// The next PSN to send in resource `send_ci`.
    send_psn: u32,
    /// Resources before this one were sent whole at least once: what is pending before it
    /// is a replay, which may be given up (the peer asks again if it still needs it).
    sent_once: u64,
}

impl Resources {
    /// An empty table of `capacity` resources, allocated now, never per packet. With none
    /// (`max_dest_rd_atomic` 0) every READ and atomic is refused, as rxe refuses them.
    pub fn with_capacity(capacity: usize) -> Resources {
        Resources {
            slots: Vec::with_capacity(capacity),
            capacity,
            ..Default::default()
        }
    }

    fn slot(&self, i: u64) -> &Resource {
        &self.slots[(i % self.capacity as u64) as usize]
    }

    /// Whether responses are waiting to be sent.
    pub fn pending(&self) -> bool {
        self.send_ci < self.pi
    }

    /// Records a READ or atomic that just executed; its responses are sent after those
    /// pending. Refused when every resource still has responses to send for the first time
    /// (a peer that keeps no more than `max_dest_rd_atomic` outstanding never gets here).
    pub fn record(&mut self, r: Resource) -> Result<(), TooMany> {
        if !self.has_room() {
            return Err(TooMany);
        }
        if self.pi - self.send_ci >= self.capacity as u64 {
            // The oldest, about to be overwritten, is only being replayed: give it up.
            self.send_ci += 1;
            if self.send_ci < self.pi {
                self.send_psn = self.slot(self.send_ci).psn;
            }
        }
        let i = (self.pi % self.capacity as u64) as usize;
        if i == self.slots.len() {
            self.slots.push(r);
        } else {
            self.slots[i] = r;
        }
        if self.send_ci == self.pi {
            self.send_psn = r.psn;
        }
        self.pi += 1;
        Ok(())
    }

    /// Whether [`Resources::record`] would take one more (checked before an atomic executes).
    pub fn has_room(&self) -> bool {
        self.capacity > 0
            && (self.pi - self.send_ci < self.capacity as u64 || self.send_ci < self.sent_once)
    }

    /// The recorded resource that covers `psn`, if the table still holds one.
    pub fn find(&self, psn: u32) -> Option<(u64, Resource)> {
        let oldest = self.pi.saturating_sub(self.capacity as u64);
        (oldest..self.pi)
            .map(|i| (i, *self.slot(i)))
            .find(|(_, r)| r.covers(psn))
    }

    /// Sends resource `i` again from `psn` (a duplicate asked for it), and everything after it,
    /// unless sending is already at or before that point.
    pub fn replay(&mut self, i: u64, psn: u32) {
        if self.send_ci == self.pi || psn_delta(psn, self.send_psn) < 0 {
            self.send_ci = i;
            self.send_psn = psn;
        }
    }

    /// The next response to send: the resource and the PSN within it.
    pub fn next(&self) -> Option<(Resource, u32)> {
        self.pending()
            .then(|| (*self.slot(self.send_ci), self.send_psn))
    }

    /// The response `next` gave was sent.
    pub fn sent(&mut self) {
        let r = *self.slot(self.send_ci);
        if self.send_psn == r.last_psn() {
            self.send_ci += 1;
            self.sent_once = self.sent_once.max(self.send_ci);
            if self.send_ci < self.pi {
                self.send_psn = self.slot(self.send_ci).psn;
            }
        } else {
            self.send_psn = psn_add(self.send_psn, 1);
        }
    }

    /// Gives up every pending response (the QP failed).
    pub fn abandon(&mut self) {
        self.send_ci = self.pi;
        self.sent_once = self.pi;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(psn: u32, packets: u32) -> Resource {
        Resource {
            psn,
            msn: 0,
            answer: Answer::Read {
                reth: Reth {
                    va: 0,
                    rkey: 0,
                    len: packets * 1024,
                },
                packets,
            },
        }
    }

    fn drain(t: &mut Resources) -> Vec<u32> {
        let mut psns = Vec::new();
        while let Some((_, psn)) = t.next() {
            psns.push(psn);
            t.sent();
        }
        psns
    }

    #[test]
    fn responses_go_out_in_psn_order_across_resources() {
        let mut t = Resources::with_capacity(2);
        t.record(read(0x00ff_fffe, 3)).unwrap();
        t.record(read(1, 1)).unwrap();
        assert_eq!(drain(&mut t), [0x00ff_fffe, 0x00ff_ffff, 0, 1]);
        assert!(!t.pending());
    }

    #[test]
    fn more_fresh_resources_than_the_capacity_are_refused() {
        let mut t = Resources::with_capacity(2);
        t.record(read(0, 1)).unwrap();
        t.record(read(1, 1)).unwrap();
        assert_eq!(t.record(read(2, 1)), Err(TooMany));
        // Once the oldest was sent, its slot may be reused.
        t.next().unwrap();
        t.sent();
        t.record(read(2, 1)).unwrap();
        assert_eq!(drain(&mut t), [1, 2]);
    }

    #[test]
    fn a_replay_in_the_way_of_a_new_request_is_given_up() {
        let mut t = Resources::with_capacity(2);
        t.record(read(0, 4)).unwrap();
        t.record(read(4, 1)).unwrap();
        drain(&mut t);
        let (i, _) = t.find(2).unwrap();
        t.replay(i, 2);
        assert_eq!(t.next().map(|(_, p)| p), Some(2));
        t.record(read(5, 1)).unwrap();
        assert_eq!(drain(&mut t), [4, 5]);
        assert!(t.find(2).is_none(), "overwritten");
    }

    #[test]
    fn a_replay_never_skips_what_is_still_to_send() {
        let mut t = Resources::with_capacity(4);
        t.record(read(0, 4)).unwrap();
        t.record(read(4, 2)).unwrap();
        t.next().unwrap();
        t.sent();
        // A duplicate for the second READ while the first is still being sent: no jump ahead.
        let (i, _) = t.find(5).unwrap();
        t.replay(i, 5);
        assert_eq!(drain(&mut t), [1, 2, 3, 4, 5]);
        // Behind: the replay starts where the duplicate asks.
        let (i, _) = t.find(2).unwrap();
        t.replay(i, 2);
        assert_eq!(drain(&mut t), [2, 3, 4, 5]);
    }
}
