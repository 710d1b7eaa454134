//! Helpers shared by softnic's integration tests.
#![allow(dead_code)]

use std::time::Duration;

use hw_defs::verbs::WcStatus;
use softnic::harness::{
    connect, Completion, ConnectOptions, Data, HarnessCq, HarnessQp, Node, Op, QpSizes, Sim,
};
use softnic::{Device, MrKeys};

/// Two nodes on a fabric, connected.
pub fn pair_with(
    seed: u64,
    latency: Duration,
    sizes: QpSizes,
    o: ConnectOptions,
) -> (Sim, Node, Node) {
    let sim = Sim::new(seed, latency);
    let a = Node::new(sim.device("a", 1).unwrap(), 1 << 20, sizes).unwrap();
    let b = Node::new(sim.device("b", 2).unwrap(), 1 << 20, sizes).unwrap();
    connect(&a.dev, &a.qp, &b.dev, &b.qp, &o).unwrap();
    (sim, a, b)
}

/// Runs until `cq` yields a completion (at most `limit` of virtual time).
pub fn next_within(
    sim: &Sim,
    devs: &[&Device],
    cq: &mut HarnessCq,
    limit: Duration,
) -> Option<Completion> {
    let mut got = None;
    sim.run_until(devs, limit, || {
        got = got.or_else(|| cq.poll());
        got.is_some()
    });
    got
}

/// Runs until `cq` yields a completion (at most one virtual second).
pub fn next(sim: &Sim, devs: &[&Device], cq: &mut HarnessCq) -> Completion {
    next_within(sim, devs, cq, Duration::from_secs(1))
        .expect("no completion within a virtual second")
}

/// Prints the seed it holds if the test fails (drop it at the test's end: keep it bound).
pub struct SeedGuard(pub u64);

impl Drop for SeedGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("failing seed: SOFTNIC_SEED={}", self.0);
        }
    }
}

/// The seed from SOFTNIC_SEED, or `default`.
pub fn seed(default: u64) -> u64 {
    std::env::var("SOFTNIC_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Bytes that differ with `seed`.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Posts a signaled WRITE of `len` bytes from the start of `a`'s buffer to the start of `b`'s,
/// and rings; returns the WQE's index.
pub fn post_write(a: &mut Node, b: &Node, len: u32) -> u16 {
    let sge = [a.buf.sge(0, len)];
    let idx = a.qp.post(
        Op::Write {
            raddr: b.buf.addr(0),
            rkey: b.buf.keys.rkey,
        },
        Data::Sges(&sge),
        true,
    );
    a.qp.ring();
    idx
}

/// [`post_write`], then waits for its completion and returns its status.
pub fn write_and_wait(sim: &Sim, a: &mut Node, b: &Node, len: u32) -> WcStatus {
    post_write(a, b, len);
    next(sim, &[&a.dev, &b.dev], &mut a.scq).status
}

/// READs of the whole of a buffer at one node into the whole of a buffer at another: the two
/// registrations and the READ's one scatter entry.
pub struct WholeRead {
    /// The source's keys, at the responder (remote READ).
    pub src: MrKeys,
    /// The destination's keys, at the requester (local write).
    pub dst: MrKeys,
    raddr: u64,
    sge: [hw_defs::mlx5::DataSegRepr; 1],
}

impl WholeRead {
    /// Registers `src` at `responder` for remote READ and `dst` at `requester` for local
    /// write.
    ///
    /// # Safety
    /// Both buffers outlive their registrations (and the devices' engines, where a failed
    /// assertion can unwind before the deregistration).
    pub unsafe fn register(
        requester: &Node,
        responder: &Node,
        src: &mut [u8],
        dst: &mut [u8],
    ) -> WholeRead {
        assert_eq!(src.len(), dst.len());
        // SAFETY: the caller's promise.
        let (src_keys, dst_keys) = unsafe {
            (
                responder
                    .dev
                    .reg_mr(
                        responder.pd,
                        src.as_mut_ptr(),
                        src.len(),
                        softnic::Access::REMOTE_READ,
                    )
                    .unwrap(),
                requester
                    .dev
                    .reg_mr(
                        requester.pd,
                        dst.as_mut_ptr(),
                        dst.len(),
                        softnic::Access::LOCAL_WRITE,
                    )
                    .unwrap(),
            )
        };
        WholeRead {
            src: src_keys,
            dst: dst_keys,
            raddr: src.as_ptr() as u64,
            sge: [hw_defs::mlx5::DataSegRepr {
                byte_count: dst.len() as u32,
                lkey: dst_keys.lkey,
                addr: dst.as_ptr() as u64,
            }],
        }
    }

    /// Posts one signaled READ of the whole source into the whole destination on `qp`
    /// (without ringing).
    pub fn post(&self, qp: &mut HarnessQp) {
        qp.post(
            Op::Read {
                raddr: self.raddr,
                rkey: self.src.rkey,
            },
            Data::Sges(&self.sge),
            true,
        );
    }
}
