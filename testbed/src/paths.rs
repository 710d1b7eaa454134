//! Whether a path between the hosts existed, from the failure log: a rail's path is up when
//! both hosts' devices and NICs on that rail and both of its switch ports are up. A lost
//! connection is the driver's fault when some rail's path was up, or came back, within the
//! RC retry budget of the failure that ended it.
//!
//! A device whose QPs failed (`initiator-dev1-qps-failed`) takes no cable down, but its
//! rail's path cannot carry anything until the driver repairs the QPs, and the repair's
//! handshake runs over the other rail (`docs/failover.md` 5d). So that rail counts down from
//! the fault until the other rail's path is up (at once, when it is up then); the repair's
//! own time (a handshake, milliseconds) counts as up, which judges the driver strictly.

use std::collections::BTreeMap;

use crate::fail::LogEntry;
use crate::linkwatch::LinkChange;
use crate::schedule::LinkAction;
use crate::target::{FailTarget, Link};
use crate::topology::RAILS;

/// How long a plain RC QP keeps trying before it gives up with `RETRY_EXC_ERR` (the same
/// arithmetic the driver plans with).
pub use hw_defs::verbs::rc_retry_budget;

/// The down intervals of each rail's path, in Unix milliseconds.
#[derive(Debug, Clone, Default)]
pub struct Availability {
    /// Per rail: merged, sorted `[down, up)` intervals (`up` infinite when it never came back).
    down: BTreeMap<u8, Vec<(f64, f64)>>,
}

impl Availability {
    /// Reads the log's successful actions (from when each was issued); entries whose target
    /// the testbed does not know are skipped with a warning.
    pub fn from_log(log: &[LogEntry]) -> Availability {
        Availability::from_log_and_reports(log, &[])
    }

    /// As [`Availability::from_log`], and a link is also down while the kernel reported it
    /// down (`reports`, [`crate::linkwatch`]): after `up` it counts from when the kernel
    /// reported it running, as the driver does.
    pub fn from_log_and_reports(log: &[LogEntry], reports: &[LinkChange]) -> Availability {
        let mut open: BTreeMap<Link, f64> = BTreeMap::new();
        let mut intervals: BTreeMap<u8, Vec<(f64, f64)>> = BTreeMap::new();
        // Devices whose QPs failed: (rail, when).
        let mut qps_failed: Vec<(u8, f64)> = Vec::new();
        for e in log.iter().filter(|e| e.error.is_none()) {
            let target = match FailTarget::parse(&e.target, None) {
                Ok(t) => t,
                Err(err) => {
                    tracing::warn!(target = %e.target, error = %err, "failure log entry skipped");
                    continue;
                }
            };
            if let FailTarget::DeviceQpsFailed { rail, .. } = target {
                if e.action == LinkAction::Down {
                    qps_failed.push((rail, e.issued_unix_ms));
                }
                continue;
            }
            for link in target.links() {
                match e.action {
                    LinkAction::Down => {
                        open.entry(link).or_insert(e.issued_unix_ms);
                    }
                    LinkAction::Up => {
                        if let Some(from) = open.remove(&link) {
                            intervals
                                .entry(link.rail())
                                .or_default()
                                .push((from, e.issued_unix_ms));
                        }
                    }
                }
            }
        }
        for (link, from) in open {
            intervals
                .entry(link.rail())
                .or_default()
                .push((from, f64::INFINITY));
        }
        let mut reported_down: BTreeMap<Link, f64> = BTreeMap::new();
        for r in reports {
            if r.up {
                if let Some(from) = reported_down.remove(&r.link) {
                    intervals.entry(r.rail).or_default().push((from, r.unix_ms));
                }
            } else {
                reported_down.entry(r.link).or_insert(r.unix_ms);
            }
        }
        for (link, from) in reported_down {
            intervals
                .entry(link.rail())
                .or_default()
                .push((from, f64::INFINITY));
        }
        let links = Availability {
            down: merge(intervals.clone()),
        };
        for (rail, at) in qps_failed {
            // Repairable once some other rail's path is up: the first such instant.
            let repairable = (0..RAILS)
                .filter(|&r| r != rail)
                .map(|r| links.next_up(r, at))
                .fold(f64::INFINITY, f64::min);
            if repairable > at {
                intervals.entry(rail).or_default().push((at, repairable));
            }
        }
        Availability {
            down: merge(intervals),
        }
    }

    /// The first instant at or after `at` when `rail`'s path is up (infinite if never).
    fn next_up(&self, rail: u8, at: f64) -> f64 {
        let mut cursor = at;
        for &(d, u) in self.down.get(&rail).map(Vec::as_slice).unwrap_or_default() {
            if u <= cursor {
                continue;
            }
            if d > cursor {
                break;
            }
            cursor = u;
        }
        cursor
    }

    /// Whether `rail`'s path was up at some instant of `[from, to]`.
    pub fn rail_up_during(&self, rail: u8, from: f64, to: f64) -> bool {
        let Some(intervals) = self.down.get(&rail) else {
            return true;
        };
        // Walk the down intervals from `from`: the first gap before `to` is an up instant.
        let mut cursor = from;
        for &(d, u) in intervals {
            if u <= cursor {
                continue;
            }
            if d > cursor {
                break;
            }
            cursor = u;
            if cursor > to {
                return false;
            }
        }
        cursor <= to
    }

    /// The windows `[down, up)` in which no rail's path was up, sorted (the intersection of
    /// every rail's down intervals; `up` infinite when no path came back).
    pub fn no_path_windows(&self) -> Vec<(f64, f64)> {
        let mut windows = vec![(f64::NEG_INFINITY, f64::INFINITY)];
        for rail in 0..RAILS {
            let down = self.down.get(&rail).map(Vec::as_slice).unwrap_or_default();
            let mut next = Vec::new();
            for &(a, b) in &windows {
                for &(d, u) in down {
                    let (from, to) = (a.max(d), b.min(u));
                    if from < to {
                        next.push((from, to));
                    }
                }
            }
            windows = next;
        }
        windows
    }

    /// The rails whose path was up at some instant of `[from, to]`.
    pub fn rails_up_during(&self, from: f64, to: f64) -> Vec<u8> {
        (0..RAILS)
            .filter(|&r| self.rail_up_during(r, from, to))
            .collect()
    }
}

/// Sorts and merges each rail's `[down, up)` intervals.
fn merge(intervals: BTreeMap<u8, Vec<(f64, f64)>>) -> BTreeMap<u8, Vec<(f64, f64)>> {
    intervals
        .into_iter()
        .map(|(rail, mut v)| {
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mut merged: Vec<(f64, f64)> = Vec::with_capacity(v.len());
            for (d, u) in v {
                match merged.last_mut() {
                    Some(last) if d <= last.1 => last.1 = last.1.max(u),
                    _ => merged.push((d, u)),
                }
            }
            (rail, merged)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(target: &str, action: LinkAction, at: f64) -> LogEntry {
        LogEntry {
            t_ms: 0.0,
            unix_ms: at,
            planned_ms: 0.0,
            target: target.to_owned(),
            rail: 0,
            action,
            netns: String::new(),
            dev: String::new(),
            error: None,
            issued_unix_ms: at,
        }
    }

    #[test]
    fn a_rail_is_down_while_any_of_its_links_is() {
        let log = vec![
            entry("initiator-nic0", LinkAction::Down, 100.0),
            entry("switch0-port", LinkAction::Down, 150.0),
            entry("initiator-nic0", LinkAction::Up, 200.0),
            entry("switch0-port", LinkAction::Up, 300.0),
        ];
        let a = Availability::from_log(&log);
        assert!(!a.rail_up_during(0, 120.0, 250.0));
        assert!(a.rail_up_during(0, 120.0, 300.0), "up again at 300");
        assert!(a.rail_up_during(0, 50.0, 110.0), "up before 100");
        assert!(a.rail_up_during(1, 120.0, 250.0), "rail 1 never failed");
        assert_eq!(a.rails_up_during(120.0, 250.0), vec![1]);
    }

    #[test]
    fn both_nics_and_a_dead_device_take_their_rail_down() {
        let log = vec![
            entry("both-nic0", LinkAction::Down, 100.0),
            entry("initiator-dev1-dead", LinkAction::Down, 120.0),
            entry("both-nic0", LinkAction::Up, 400.0),
        ];
        let a = Availability::from_log(&log);
        assert_eq!(a.rails_up_during(130.0, 399.0), Vec::<u8>::new());
        assert_eq!(a.rails_up_during(130.0, 400.0), vec![0]);
        assert!(
            !a.rail_up_during(1, 130.0, 1e12),
            "a dead device never comes back"
        );
    }

    #[test]
    fn failed_qps_take_their_rail_down_until_the_other_rail_can_carry_the_repair() {
        // Idle backup QPs failing while rail 0 is up: repairable at once, rail 1 never
        // counts down.
        let log = vec![entry("initiator-dev1-qps-failed", LinkAction::Down, 100.0)];
        let a = Availability::from_log(&log);
        assert_eq!(a.rails_up_during(100.0, 100.0), vec![0, 1]);
        // The same while rail 0 is down (traffic on the backup): nothing can carry the
        // repair until rail 0 is back at 400, so neither rail is up from 150 to 399.
        let log = vec![
            entry("initiator-nic0", LinkAction::Down, 100.0),
            entry("responder-dev1-qps-failed", LinkAction::Down, 150.0),
            entry("initiator-nic0", LinkAction::Up, 400.0),
        ];
        let a = Availability::from_log(&log);
        assert_eq!(a.rails_up_during(150.0, 399.0), Vec::<u8>::new());
        assert_eq!(a.rails_up_during(150.0, 400.0), vec![0, 1]);
        assert!(
            a.rail_up_during(1, 120.0, 149.0),
            "up before its QPs failed"
        );
        // Rail 0 never back: rail 1 stays down too.
        let a = Availability::from_log(&log[..2]);
        assert_eq!(a.rails_up_during(150.0, 1e12), Vec::<u8>::new());
    }

    #[test]
    fn a_link_counts_up_only_once_the_kernel_reported_it_running() {
        let log = vec![
            entry("initiator-nic0", LinkAction::Down, 100.0),
            entry("initiator-nic0", LinkAction::Up, 200.0),
        ];
        let report = |up: bool, at: f64| LinkChange {
            link: Link::HostNic {
                host: crate::topology::Role::Initiator,
                rail: 0,
            },
            netns: "rs-a".into(),
            dev: "nic0".into(),
            rail: 0,
            up,
            unix_ms: at,
        };
        // The kernel saw it go at 101 and reported it running only at 900.
        let reports = [report(false, 101.0), report(true, 900.0)];
        let a = Availability::from_log_and_reports(&log, &reports);
        assert!(!a.rail_up_during(0, 150.0, 899.0));
        assert!(a.rail_up_during(0, 150.0, 900.0));
        // By the log alone it was up at 200.
        assert!(Availability::from_log(&log).rail_up_during(0, 150.0, 250.0));
        // Never reported running again: down to the end.
        let a = Availability::from_log_and_reports(&log, &reports[..1]);
        assert!(!a.rail_up_during(0, 150.0, 1e12));
    }

    #[test]
    fn failed_actions_and_unknown_targets_change_nothing() {
        let mut failed = entry("initiator-nic0", LinkAction::Down, 100.0);
        failed.error = Some("ip failed".into());
        let log = vec![failed, entry("warp-core", LinkAction::Down, 100.0)];
        let a = Availability::from_log(&log);
        assert_eq!(a.rails_up_during(0.0, 1e12), vec![0, 1]);
    }
}
