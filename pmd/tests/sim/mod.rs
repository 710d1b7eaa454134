//! Two simulated hosts, each with a default and a backup softnic on one in-memory fabric
//! (rail-optimised: the default NICs on one rail, the backups on the other), manual progress
//! and one virtual clock: a resilient connection whose every run replays exactly from its
//! seed, and in which a 67 ms timeout costs no real time.
//!
//! Ports: 0 = host A default (198.18.0.1), 1 = A backup (198.18.1.1), 2 = B default
//! (198.18.0.2), 3 = B backup (198.18.1.2).

#![allow(dead_code)]

pub mod scenario;
pub mod traffic;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pmd::failover::Timestamp;
use pmd::provider::soft::{register_fabric, unregister_fabric, SoftOptions, SoftProvider};
use pmd::provider::ProgressModel;
use pmd::resilient::{
    Clock, FailoverService, Rendezvous, ResilientBuffer, ResilientConfig, ResilientContext,
    ResilientPd, ResilientQp,
};
use pmd::{
    Access, AddressVector, Context, ContextConfig, Mtu, QpAttr, QpCaps, QpState, WorkCompletion,
};

/// Port indices.
pub const A_DEFAULT: usize = 0;
pub const A_BACKUP: usize = 1;
pub const B_DEFAULT: usize = 2;
pub const B_BACKUP: usize = 3;

/// Bytes of registered memory per host.
pub const BUF: usize = 1 << 20;

/// One simulated host.
pub struct Host {
    pub service: FailoverService,
    pub ctx: ResilientContext,
    pub pd: ResilientPd,
    pub buf: ResilientBuffer,
    pub qp: ResilientQp,
    /// More resilient QPs on the same context and PD, each connected to the other host's of
    /// the same index ([`Sim::with_more_qps`]): their backup QPs share the backup CQs with
    /// `qp`'s. Each round runs their failover work too.
    pub more: Vec<ResilientQp>,
    pub devices: [Arc<Context>; 2],
    /// Completions polled by the helpers, oldest first.
    pub wcs: Vec<WorkCompletion>,
}

pub struct Sim {
    pub clock: softnic::Clock,
    pub fabric: softnic::Fabric,
    pub name: String,
    pub a: Host,
    pub b: Host,
    /// A moment the test's own logic wants to run at (a traffic schedule); `run_until`
    /// jumps no further than this when idle.
    pub wake_at: Option<Duration>,
    /// Whether each round runs both QPs' failover work (`ResilientQp::progress`). Off, only
    /// the application's own polls do it: errors then surface in the poll's fast path.
    pub qp_progress: bool,
    /// Completion slots of one application poll ([`Sim::poll`]).
    pub poll_slots: usize,
    /// Set by [`Sim::poll`] when it returned completions: the application made progress
    /// this round even if no device did, so [`Sim::run_until`] must not move the clock yet
    /// (the driver may hold many buffered completions, e.g. a failed connection's flushes,
    /// and a one-slot poll takes one per round).
    pub app_polled: bool,
}

/// A timeout of 4 ms (code 10) and 3 retries: retry exhaustion after about 16 ms.
pub fn rts() -> QpAttr {
    let mut rts = QpAttr::rts(0);
    rts.timeout = Some(10);
    rts.retry_cnt = Some(3);
    rts
}

/// The application's bring-up of a resilient QP towards the peer's default QP.
pub fn bring_up(qp: &mut ResilientQp, peer_gid: pmd::Gid, peer_qpn: u32, rts: &QpAttr) {
    qp.modify(QpState::Init, &QpAttr::init(Access::ALL))
        .unwrap();
    qp.modify(
        QpState::Rtr,
        &QpAttr::rtr(AddressVector::to_gid(peer_gid), peer_qpn, 0, Mtu::Mtu1024),
    )
    .unwrap();
    qp.modify(QpState::Rts, rts).unwrap();
}

pub fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 128,
        max_recv_wr: 128,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    }
}

/// Timers scaled to the simulation's short transport timeouts.
pub fn config() -> ResilientConfig {
    ResilientConfig {
        holddown: Duration::from_millis(50),
        backoff_initial: Duration::from_millis(10),
        backoff_max: Duration::from_millis(200),
        handshake_timeout: Duration::from_millis(500),
        // About 18 of the simulation's RC budgets (16.8 ms), as 4.29 s is 8 of the apps'.
        outage_tolerance: Duration::from_millis(300),
        ..ResilientConfig::default()
    }
}

fn open(fabric: &str, port: usize, clock: &softnic::Clock) -> Arc<Context> {
    let pool = pmd::memory::MemoryPool::new(pmd::memory::HugepagePolicy::Never);
    let name = format!("fabric:{fabric}/{port}");
    let options = SoftOptions {
        progress: ProgressModel::Manual,
        clock: clock.clone(),
        pcap: None,
    };
    let provider = SoftProvider::open(&name.parse().unwrap(), &pool, options)
        .unwrap_or_else(|e| panic!("open {name}: {e}"));
    let config = ContextConfig {
        progress: ProgressModel::Manual,
        ..ContextConfig::default()
    };
    Context::with_provider(Box::new(provider), pool, &config)
}

fn host(
    fabric: &str,
    ports: [usize; 2],
    clock: &softnic::Clock,
    config: &ResilientConfig,
    store: Option<Arc<dyn Rendezvous>>,
    caps: QpCaps,
) -> Host {
    let service = FailoverService::manual(Clock::from_softnic(clock)).unwrap();
    let devices = [open(fabric, ports[0], clock), open(fabric, ports[1], clock)];
    let ctx = ResilientContext::new(
        devices[0].clone(),
        Some(devices[1].clone()),
        &service,
        config.clone(),
        store,
    );
    let pd = ctx.alloc_pd().unwrap();
    let buf = pd.alloc_buffer(BUF, Access::ALL).unwrap();
    let qp = pd.create_qp(caps).unwrap();
    Host {
        service,
        ctx,
        pd,
        buf,
        qp,
        more: Vec::new(),
        devices,
        wcs: Vec::new(),
    }
}

impl Sim {
    /// Two hosts, connected and protected. `seed` drives the fabric's faults.
    pub fn new(seed: u64, config: ResilientConfig) -> Sim {
        Sim::with_latency(seed, config, Duration::from_micros(2))
    }

    pub fn with_latency(seed: u64, config: ResilientConfig, latency: Duration) -> Sim {
        Sim::build(seed, config, latency, [None, None], [caps(), caps()], rts())
    }

    /// Two hosts with `1 + more` connected, protected QP pairs on one context each: `qp` and
    /// [`Host::more`].
    pub fn with_more_qps(seed: u64, config: ResilientConfig, more: usize) -> Sim {
        let mut sim = Sim::new(seed, config);
        for _ in 0..more {
            let mut qa = sim.a.pd.create_qp(caps()).unwrap();
            let mut qb = sim.b.pd.create_qp(caps()).unwrap();
            let blob = |sim: &mut Sim, qp: &ResilientQp| {
                for _ in 0..1000 {
                    if let Some(blob) = qp.try_rendezvous_blob().unwrap() {
                        return blob;
                    }
                    sim.round();
                }
                panic!("no rendezvous blob");
            };
            let (blob_a, blob_b) = (blob(&mut sim, &qa), blob(&mut sim, &qb));
            qa.connect_backup(&blob_b).unwrap();
            qb.connect_backup(&blob_a).unwrap();
            let gid = |h: &Host| h.devices[0].query_gid(0).unwrap();
            let (ga, gb) = (gid(&sim.a), gid(&sim.b));
            let (na, nb) = (qa.qpn(), qb.qpn());
            bring_up(&mut qa, gb, nb, &rts());
            bring_up(&mut qb, ga, na, &rts());
            sim.a.more.push(qa);
            sim.b.more.push(qb);
        }
        let ok = sim.run_until(Duration::from_secs(1), |s| {
            [&s.a, &s.b]
                .iter()
                .all(|h| h.more.iter().all(ResilientQp::is_protected))
        });
        assert!(
            ok,
            "the extra QPs were not protected within a virtual second"
        );
        sim
    }

    /// Two hosts whose QPs (default and backup) have the local ACK timeout `code` instead of
    /// [`rts`]'s 4 ms.
    pub fn with_ack_timeout(seed: u64, config: ResilientConfig, code: u8) -> Sim {
        let mut attrs = rts();
        attrs.timeout = Some(code);
        let latency = Duration::from_micros(2);
        Sim::build(seed, config, latency, [None, None], [caps(), caps()], attrs)
    }

    /// Two hosts whose QPs have the given capacities (host A's, host B's).
    pub fn with_caps(seed: u64, config: ResilientConfig, qp_caps: [QpCaps; 2]) -> Sim {
        Sim::build(
            seed,
            config,
            Duration::from_micros(2),
            [None, None],
            qp_caps,
            rts(),
        )
    }

    /// Two hosts whose backup attributes go through the given stores (one per host) instead
    /// of the inline rendezvous: no blob is exchanged.
    pub fn with_stores(
        seed: u64,
        config: ResilientConfig,
        stores: [Option<Arc<dyn Rendezvous>>; 2],
    ) -> Sim {
        Sim::build(
            seed,
            config,
            Duration::from_micros(2),
            stores,
            [caps(), caps()],
            rts(),
        )
    }

    fn build(
        seed: u64,
        config: ResilientConfig,
        latency: Duration,
        stores: [Option<Arc<dyn Rendezvous>>; 2],
        qp_caps: [QpCaps; 2],
        rts: QpAttr,
    ) -> Sim {
        let inline = stores.iter().all(Option::is_none);
        let [store_a, store_b] = stores;
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "sim{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let clock = softnic::Clock::new_virtual();
        let fabric = softnic::Fabric::new(seed, latency);
        for addr in ["198.18.0.1", "198.18.1.1", "198.18.0.2", "198.18.1.2"] {
            fabric.add_port(addr.parse().unwrap());
        }
        register_fabric(&name, &fabric);
        let [caps_a, caps_b] = qp_caps;
        let a = host(
            &name,
            [A_DEFAULT, A_BACKUP],
            &clock,
            &config,
            store_a,
            caps_a,
        );
        let b = host(
            &name,
            [B_DEFAULT, B_BACKUP],
            &clock,
            &config,
            store_b,
            caps_b,
        );
        let mut sim = Sim {
            clock,
            fabric,
            name,
            a,
            b,
            wake_at: None,
            qp_progress: true,
            poll_slots: 32,
            app_polled: false,
        };
        sim.connect(inline, &rts);
        sim
    }

    /// The inline rendezvous (unless the hosts use a store) and the application's bring-up,
    /// then waits for protection.
    fn connect(&mut self, inline: bool, rts: &QpAttr) {
        if inline {
            let blob_a = self.until_blob(true);
            let blob_b = self.until_blob(false);
            self.a.qp.connect_backup(&blob_b).unwrap();
            self.b.qp.connect_backup(&blob_a).unwrap();
        }
        let gid = |h: &Host| h.devices[0].query_gid(0).unwrap();
        let (ga, gb) = (gid(&self.a), gid(&self.b));
        let (qa, qb) = (self.a.qp.qpn(), self.b.qp.qpn());
        bring_up(&mut self.a.qp, gb, qb, rts);
        bring_up(&mut self.b.qp, ga, qa, rts);
        let ok = self.run_until(Duration::from_secs(1), |s| {
            s.a.qp.is_protected() && s.b.qp.is_protected()
        });
        assert!(ok, "the QPs were not protected within a virtual second");
    }

    fn until_blob(&mut self, a: bool) -> Vec<u8> {
        for _ in 0..1000 {
            let host = if a { &self.a } else { &self.b };
            if let Some(blob) = host.qp.try_rendezvous_blob().unwrap() {
                return blob;
            }
            self.round();
        }
        panic!("no rendezvous blob");
    }

    pub fn now(&self) -> Duration {
        self.clock.now()
    }

    pub fn host(&mut self, a: bool) -> &mut Host {
        if a {
            &mut self.a
        } else {
            &mut self.b
        }
    }

    /// One round: every device, both services, both QPs' failover work. Returns whether
    /// anything happened (and so whether the clock must wait).
    pub fn round(&mut self) -> (bool, Option<Duration>) {
        let mut busy = false;
        let now = self.clock.now();
        let mut next: Option<Duration> = self.fabric.next_event(now);
        if let Some(t) = self.wake_at.filter(|t| *t > now) {
            next = Some(next.map_or(t, |n| n.min(t)));
        }
        let soon = |t: Duration, next: &mut Option<Duration>| {
            *next = Some(next.map_or(t, |n| n.min(t)));
        };
        for d in self.a.devices.iter().chain(self.b.devices.iter()) {
            let s = d.step();
            busy |= s.busy;
            if let Some(t) = s.next_deadline {
                soon(t, &mut next);
            }
        }
        for h in [&mut self.a, &mut self.b] {
            if let Some(t) = h.service.run_once() {
                soon(Duration::from_nanos(t.as_nanos()), &mut next);
            }
            for qp in std::iter::once(&mut h.qp).chain(h.more.iter_mut()) {
                if self.qp_progress {
                    qp.progress();
                }
                if let Some(t) = qp.next_deadline() {
                    soon(Duration::from_nanos(t.as_nanos()), &mut next);
                }
            }
        }
        (busy, next)
    }

    /// Runs rounds until `done` says so or `limit` of virtual time passes; jumps the clock to
    /// the next deadline whenever a round was idle. Returns `done`'s last answer.
    pub fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&mut Sim) -> bool) -> bool {
        let end = self.clock.now() + limit;
        let mut idle_rounds = 0;
        let mut stuck = 0;
        loop {
            if done(self) {
                return true;
            }
            let app_polled = std::mem::take(&mut self.app_polled);
            let (busy, next) = self.round();
            if busy || app_polled {
                idle_rounds = 0;
                continue;
            }
            // Give `done` (which may post and poll) a few idle rounds before moving time.
            idle_rounds += 1;
            if idle_rounds < 3 {
                continue;
            }
            idle_rounds = 0;
            let now = self.clock.now();
            // A deadline in the past that idle rounds did not serve (nobody runs that QP's
            // failover work) would move the clock a nanosecond at a time forever: give up.
            stuck = if next.is_some_and(|t| t <= now) {
                stuck + 1
            } else {
                0
            };
            if stuck > 1000 {
                eprintln!("sim: a deadline at {next:?} stays unserved at {now:?}; giving up");
                return done(self);
            }
            match next {
                Some(t) if t <= end => self.clock.advance_to(t.max(now + Duration::from_nanos(1))),
                _ => {
                    if now >= end {
                        return done(self);
                    }
                    self.clock.advance_to(end);
                }
            }
        }
    }

    /// Runs for `d` of virtual time.
    pub fn run_for(&mut self, d: Duration) {
        let end = self.clock.now() + d;
        self.run_until(d, |s| s.clock.now() >= end);
    }

    /// Polls host `a`'s QP into its `wcs`.
    pub fn poll(&mut self, a: bool) -> usize {
        let mut wcs = vec![WorkCompletion::EMPTY; self.poll_slots];
        let h = self.host(a);
        let n = h.qp.poll(&mut wcs);
        h.wcs.extend_from_slice(&wcs[..n]);
        self.app_polled |= n > 0;
        n
    }

    /// A link-down rule on `port` from now, until `up_after` from now (None: stays down).
    pub fn link_down(&self, port: usize, up_after: Option<Duration>) {
        let now = self.clock.now();
        self.fabric.add_rule(softnic::FaultRule::link_down(
            port,
            now,
            up_after.map(|d| now + d),
        ));
    }

    pub fn virtual_now(&self) -> Timestamp {
        Timestamp::from_nanos(self.clock.now().as_nanos() as u64)
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        unregister_fabric(&self.name);
    }
}
