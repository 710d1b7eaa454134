//! A simulated pair and its traffic, built for one test, and what every such test asserts at
//! its end: that the traffic ran to its last phase, and what both hosts counted.

use std::fmt::Debug;
use std::time::Duration;

use pmd::resilient::{FailoverStats, ResilientConfig};
use pmd::QpCaps;

use super::traffic::{Dir, Traffic};
use super::{caps, config, Sim};

/// The pair before it runs: its seed, its timers and its QPs' capacities.
/// `Scenario::new(119).holddown(ms(100)).one_way(1000, us(100))` gives the connected pair and
/// A's traffic to B.
pub struct Scenario {
    seed: u64,
    config: ResilientConfig,
    caps: [QpCaps; 2],
}

impl Scenario {
    /// Seed `seed` (it drives the fabric's faults), the simulation's timers
    /// ([`super::config`]), the default capacities.
    pub fn new(seed: u64) -> Scenario {
        Scenario {
            seed,
            config: config(),
            caps: [caps(), caps()],
        }
    }

    /// How long a recovered link must stay up before the traffic goes back to it.
    pub fn holddown(mut self, holddown: Duration) -> Scenario {
        self.config.holddown = holddown;
        self
    }

    /// The longest wait between rearm attempts.
    pub fn backoff_max(mut self, backoff_max: Duration) -> Scenario {
        self.config.backoff_max = backoff_max;
        self
    }

    /// How long an end waits for its peer's answer in a handshake.
    pub fn handshake_timeout(mut self, timeout: Duration) -> Scenario {
        self.config.handshake_timeout = timeout;
        self
    }

    /// Both hosts take control messages over the management network too, on the loopback
    /// address (`docs/failover.md` 5f).
    pub fn management(mut self) -> Scenario {
        self.config.management_addr = Some(std::net::Ipv4Addr::LOCALHOST.into());
        self
    }

    /// Host A's QP capacities (host B's stay the default).
    pub fn a_caps(mut self, a: QpCaps) -> Scenario {
        self.caps[0] = a;
        self
    }

    /// The pair connected, protected and idle.
    pub fn pair(self) -> Sim {
        Sim::with_caps(self.seed, self.config, self.caps)
    }

    /// The pair and NCCL-like traffic from A to B: `total` iterations, one every `interval`
    /// (so that it still runs when the failures come).
    pub fn one_way(self, total: u64, interval: Duration) -> (Sim, Traffic) {
        let sim = self.pair();
        let mut d = Dir::new(true, total);
        d.interval = interval;
        let t = Traffic::new(vec![d], sim.now());
        (sim, t)
    }

    /// The pair and [`both_ways`] traffic of `total` iterations each way.
    pub fn both_ways(self, total: u64) -> (Sim, Traffic) {
        let sim = self.pair();
        let t = both_ways(&sim, total);
        (sim, t)
    }
}

/// NCCL-like traffic both ways, checked by their receivers, `total` iterations each, one
/// every 500 us (so that it still runs when the failures come).
pub fn both_ways(sim: &Sim, total: u64) -> Traffic {
    let paced = |from_a| {
        let mut d = Dir::new(from_a, total);
        d.interval = Duration::from_micros(500);
        d
    };
    Traffic::new(vec![paced(true), paced(false)], sim.now())
}

/// Fails the test unless the run got `done`: it stalled in `phase`. The message says where
/// each direction of the traffic and each host's QP stood.
pub fn assert_ran(done: bool, phase: u32, t: &Traffic, sim: &Sim) {
    assert!(
        done,
        "stalled in phase {phase}: {:?} completed, states {:?} {:?}, stats {:?} {:?}, events {:?} {:?}",
        t.dirs.iter().map(|d| d.completed).collect::<Vec<_>>(),
        sim.a.qp.state(),
        sim.b.qp.state(),
        sim.a.qp.stats(),
        sim.b.qp.stats(),
        sim.a.qp.events(),
        sim.b.qp.events()
    );
}

/// Asserts that both hosts' counters, as `figures` reads them, are `expected`; the message
/// shows the host's counters and events.
pub fn assert_both_hosts<T: PartialEq + Debug>(
    sim: &Sim,
    figures: impl Fn(&FailoverStats) -> T,
    expected: T,
) {
    for h in [&sim.a, &sim.b] {
        let stats = h.qp.stats();
        assert_eq!(figures(&stats), expected, "{stats:?} {:?}", h.qp.events());
    }
}
