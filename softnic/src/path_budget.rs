//! What one device may have in flight to one peer address, over all its QPs together.
//!
//! Each QP's congestion window ([`crate::congestion::Window`]) backs off on its own losses, but
//! it cannot go below a floor of a few packets, and a thousand QPs at that floor still keep
//! thousands of packets in flight: more than a veth's backlog (1,000 packets on the testbed's
//! VM) or a receive ring holds, so every pass overruns the medium again and the QPs' ACK
//! timers fire until their retries run out. A ConnectX shares its link with DCQCN rates per QP;
//! softnic, whose media mark nothing, shares one budget per path instead: the QPs of a device
//! to one peer address together keep at most [`PATH_MAX_INFLIGHT`] PSNs in flight, and those
//! the budget turned away are visited first when it has room again, so that none starves.
//!
//! A QP's part is what it has in flight (sent, not acknowledged, within its window) while it
//! has no READ or atomic outstanding: a READ's response PSNs come the other way and may be
//! many (a 1 GiB READ is 262,144), and counting them would hold every other QP of the path
//! for the whole READ. The count is settled after each thing that moves it (a pass, an ACK,
//! a timer, a modify, a destroy), so the budget is exact at the end of each.

use std::net::IpAddr;

/// PSNs one device may have in flight to one peer address over all its QPs: under a veth's
/// backlog (1,000 packets) with room for the ACKs and READ responses coming the other way,
/// and above the bandwidth-delay product of one QP on softnic's media (a few hundred 4 KiB
/// packets at a few Gb/s and a millisecond), so one QP alone is not held back.
pub(crate) const PATH_MAX_INFLIGHT: u32 = 512;

/// The budgets of a device's paths, one per peer address its connected QPs name.
#[derive(Debug, Default)]
pub(crate) struct PathBudgets {
    paths: Vec<PathBudget>,
}

/// One peer address's budget.
#[derive(Debug)]
struct PathBudget {
    addr: IpAddr,
    /// QPs attached (the slot is reused once none is).
    qps: u32,
    /// PSNs in flight over all of them, as last settled.
    inflight: u32,
    /// QPs the budget turned away and not yet visited again.
    turned_away: u32,
}

/// A QP's place in its path's budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PathShare {
    slot: u32,
    /// PSNs of this QP in the path's count.
    counted: u32,
    /// The budget turned it away (it is on the device's turned-away list).
    turned_away: bool,
}

impl PathShare {
    /// Whether the budget turned the QP away and it waits for its turn.
    #[inline]
    pub fn waits(&self) -> bool {
        self.turned_away
    }
}

impl PathBudgets {
    /// A QP connected to `addr` joins its path's budget, counting nothing yet.
    pub fn attach(&mut self, addr: IpAddr) -> PathShare {
        let slot = match self.paths.iter().position(|p| p.qps > 0 && p.addr == addr) {
            Some(i) => i,
            None => match self.paths.iter().position(|p| p.qps == 0) {
                Some(i) => {
                    self.paths[i] = PathBudget::new(addr);
                    i
                }
                None => {
                    self.paths.push(PathBudget::new(addr));
                    self.paths.len() - 1
                }
            },
        };
        self.paths[slot].qps += 1;
        PathShare {
            slot: slot as u32,
            counted: 0,
            turned_away: false,
        }
    }

    /// A QP leaves its path (destroyed, or connected elsewhere): what it counted goes.
    pub fn detach(&mut self, mut share: PathShare) {
        self.settle(&mut share, 0);
        self.visited(&mut share);
        let p = &mut self.paths[share.slot as usize];
        p.qps -= 1;
    }

    /// PSNs the path may still take now.
    #[inline]
    pub fn room(&self, share: &PathShare) -> u32 {
        PATH_MAX_INFLIGHT.saturating_sub(self.paths[share.slot as usize].inflight)
    }

    /// Whether QPs turned away by this path wait for their turn: a QP that was not turned
    /// away lets them go first.
    #[inline]
    pub fn others_wait(&self, share: &PathShare) -> bool {
        !share.turned_away && self.paths[share.slot as usize].turned_away > 0
    }

    /// Whether the path is more than half full: its QPs then ask for an ACK on every packet,
    /// so that one whose next packet the budget holds back is not left waiting for its ACK
    /// timer for what it already sent.
    #[inline]
    pub fn crowded(&self, share: &PathShare) -> bool {
        self.paths[share.slot as usize].inflight >= PATH_MAX_INFLIGHT / 2
    }

    /// The QP now has `inflight` PSNs counted against the path.
    #[inline]
    pub fn settle(&mut self, share: &mut PathShare, inflight: u32) {
        if share.counted != inflight {
            let p = &mut self.paths[share.slot as usize];
            p.inflight = p.inflight - share.counted + inflight;
            share.counted = inflight;
        }
    }

    /// The budget turned the QP away: it waits for its turn.
    pub fn turned_away(&mut self, share: &mut PathShare) {
        if !share.turned_away {
            share.turned_away = true;
            self.paths[share.slot as usize].turned_away += 1;
        }
    }

    /// The QP had its turn (or left).
    #[inline]
    pub fn visited(&mut self, share: &mut PathShare) {
        if share.turned_away {
            share.turned_away = false;
            self.paths[share.slot as usize].turned_away -= 1;
        }
    }

    /// PSNs in flight counted for `addr` (tests).
    #[cfg(test)]
    fn inflight(&self, addr: IpAddr) -> u32 {
        self.paths
            .iter()
            .filter(|p| p.qps > 0 && p.addr == addr)
            .map(|p| p.inflight)
            .sum()
    }
}

impl PathBudget {
    fn new(addr: IpAddr) -> PathBudget {
        PathBudget {
            addr,
            qps: 0,
            inflight: 0,
            turned_away: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const A: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1));
    const B: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2));

    #[test]
    fn the_qps_of_one_path_share_its_room_and_other_paths_have_their_own() {
        let mut paths = PathBudgets::default();
        let mut x = paths.attach(A);
        let mut y = paths.attach(A);
        let z = paths.attach(B);
        paths.settle(&mut x, 300);
        paths.settle(&mut y, 200);
        assert_eq!(paths.room(&x), PATH_MAX_INFLIGHT - 500);
        assert_eq!(paths.room(&y), PATH_MAX_INFLIGHT - 500);
        assert_eq!(paths.room(&z), PATH_MAX_INFLIGHT);
        assert!(paths.crowded(&x) && !paths.crowded(&z));
        paths.settle(&mut x, 600);
        assert_eq!(paths.room(&y), 0);
        paths.settle(&mut x, 0);
        assert_eq!(paths.inflight(A), 200);
    }

    #[test]
    fn a_qp_that_leaves_takes_its_count_and_its_turn_with_it() {
        let mut paths = PathBudgets::default();
        let mut x = paths.attach(A);
        let mut y = paths.attach(A);
        paths.settle(&mut x, 100);
        paths.turned_away(&mut y);
        assert!(paths.others_wait(&x) && !paths.others_wait(&y));
        paths.detach(y);
        assert!(!paths.others_wait(&x));
        paths.detach(x);
        assert_eq!(paths.inflight(A), 0);
        // The slot is reused for the next address.
        let w = paths.attach(B);
        assert_eq!((w.slot, paths.paths.len()), (0, 1));
    }

    #[test]
    fn a_qp_turned_away_twice_waits_once() {
        let mut paths = PathBudgets::default();
        let x = paths.attach(A);
        let mut y = paths.attach(A);
        paths.turned_away(&mut y);
        paths.turned_away(&mut y);
        paths.visited(&mut y);
        assert!(!paths.others_wait(&x));
    }
}
