//! Two softnic devices (or one, looped back) driven through the pmd API, with manual progress:
//! the test thread runs the devices from inside its poll loop, so nothing else spins.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pmd::provider::soft::{register_fabric, SoftOptions, SoftProvider};
use pmd::provider::ProgressModel;
use pmd::{
    Access, AddressVector, Context, ContextConfig, Cq, Mtu, Pd, Qp, QpAttr, QpCaps, QpState,
    RegisteredBuffer, WorkCompletion,
};

pub const BUF: usize = 1 << 16;

pub struct Side {
    pub ctx: Arc<Context>,
    pub pd: Arc<Pd>,
    pub cq: Cq,
    pub qp: Qp,
    pub buf: RegisteredBuffer,
}

fn manual() -> ContextConfig {
    ContextConfig {
        progress: ProgressModel::Manual,
        ..ContextConfig::default()
    }
}

/// A fabric registered under a name no other test uses; returns the name.
pub fn fabric() -> (String, softnic::Fabric) {
    static N: AtomicU32 = AtomicU32::new(0);
    let name = format!(
        "t{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    let f = softnic::Fabric::new(1, Duration::ZERO);
    register_fabric(&name, &f);
    (name, f)
}

pub fn open(name: &str) -> Arc<Context> {
    Context::open(name, &manual()).unwrap_or_else(|e| panic!("open {name}: {e}"))
}

pub fn open_with_clock(name: &str, clock: softnic::Clock) -> Arc<Context> {
    let pool = pmd::memory::MemoryPool::default();
    let options = SoftOptions {
        progress: ProgressModel::Manual,
        clock,
        pcap: None,
    };
    let provider = SoftProvider::open(&name.parse().unwrap(), &pool, options).unwrap();
    Context::with_provider(Box::new(provider), pool, &manual())
}

pub fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 128,
    }
}

pub fn side(ctx: &Arc<Context>) -> Side {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, false).unwrap();
    let qp = pd.create_qp(&cq, &cq, caps()).unwrap();
    let buf = pd.alloc_buffer(BUF, Access::ALL).unwrap();
    Side {
        ctx: ctx.clone(),
        pd,
        cq,
        qp,
        buf,
    }
}

/// Brings `qp` up towards the QP `dest_qpn` on the device with GID `dest`.
pub fn connect(qp: &mut Qp, dest: pmd::Gid, dest_qpn: u32) {
    qp.modify(QpState::Init, &QpAttr::init(Access::ALL))
        .unwrap();
    qp.modify(
        QpState::Rtr,
        &QpAttr::rtr(AddressVector::to_gid(dest), dest_qpn, 0, Mtu::Mtu1024),
    )
    .unwrap();
    qp.modify(QpState::Rts, &QpAttr::rts(0)).unwrap();
}

pub fn pair(a: &mut Side, b: &mut Side) {
    let (ga, gb) = (a.ctx.query_gid(0).unwrap(), b.ctx.query_gid(0).unwrap());
    let (qa, qb) = (a.qp.qpn(), b.qp.qpn());
    connect(&mut a.qp, gb, qb);
    connect(&mut b.qp, ga, qa);
}

/// Two devices on a fresh fabric, connected.
pub fn two_devices() -> (Side, Side) {
    let (name, fabric) = fabric();
    fabric.add_port("198.18.0.1".parse().unwrap());
    fabric.add_port("198.18.0.2".parse().unwrap());
    let mut a = side(&open(&format!("fabric:{name}/0")));
    let mut b = side(&open(&format!("fabric:{name}/1")));
    pair(&mut a, &mut b);
    (a, b)
}

/// Drives every device in `ctxs` and polls `cq` until `n` completions came (at most 5 s).
pub fn wait(ctxs: &[&Arc<Context>], cq: &mut Cq, n: usize) -> Vec<WorkCompletion> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut got = Vec::new();
    let mut wcs = [WorkCompletion::EMPTY; 16];
    while got.len() < n {
        for c in ctxs {
            c.progress();
        }
        let k = cq.poll(&mut wcs);
        got.extend_from_slice(&wcs[..k]);
        if Instant::now() > deadline {
            panic!("only {} of {n} completions after 5 s: {got:?}", got.len());
        }
        if k == 0 {
            std::thread::yield_now();
        }
    }
    got
}
