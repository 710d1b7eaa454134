//! `control_verbs`: what the control verbs cost on a resilient context against a plain one, as
//! the SHIFT paper's figure 7 measures them, in one run on softnic devices of an in-process
//! fabric (no root, no network).
//!
//! Each repetition opens fresh devices and walks one QP pair from `open` to RTS, plain and
//! resilient, which first alternating (so drift and leftovers on a shared machine fall on both
//! alike), and times each call the application makes:
//! - `open`: opening the device (resilient: both devices and pairing them);
//! - `alloc_pd`; `reg_mr` (allocating and registering 64 KiB; resilient: on both devices);
//! - `create_cq` + `create_qp` (a resilient QP creates its CQ itself, so the two are timed
//!   together on both sides: `create_qp`);
//! - `modify_init`, `modify_rtr`, `modify_rts` of host A's QP (host B's is brought up
//!   untimed);
//! - `shadow_done` (resilient only): from `create_qp`'s return until the backup QP exists
//!   (its rendezvous blob is ready), the shadow verbs the failover service runs meanwhile;
//! - `protected` (resilient only): from host A's `modify` to RTS until both hosts' QPs are
//!   protected (the backup pair connected, failover armed).
//!
//! Medians over `--reps` repetitions, in microseconds; `ratio` is resilient / plain. Prints
//! one JSON object: `{"control_verbs": {verb: {plain_us, resilient_us, ratio}}, ...}`.
//!
//!     cargo run --release -p benches --bin control_verbs -- [--reps 30] [--json OUT]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use benches::fabric::{caps, rtr, Fabric, A_BACKUP, A_DEFAULT, B_BACKUP, B_DEFAULT};
use clap::Parser;
use pmd::resilient::{FailoverService, ResilientConfig, ResilientContext, ServiceConfig};
use pmd::{Access, QpAttr, QpState};
use serde_json::json;

#[derive(Parser)]
#[command(about = "control-verb costs, plain against resilient (SHIFT figure 7)")]
struct Args {
    /// Repetitions of each walk.
    #[arg(long, default_value_t = 30)]
    reps: usize,
    /// Also write the JSON here.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

const MR_BYTES: usize = 64 << 10;

type Sample = BTreeMap<&'static str, Duration>;

fn timed<T>(sample: &mut Sample, verb: &'static str, f: impl FnOnce() -> T) -> T {
    let t0 = Instant::now();
    let out = f();
    sample.insert(verb, t0.elapsed());
    out
}

/// One plain walk: host A's verbs timed, host B's not.
fn plain_walk() -> Sample {
    let f = Fabric::new();
    let mut s = Sample::new();
    let ctx = timed(&mut s, "open", || f.open(A_DEFAULT));
    let pd = timed(&mut s, "alloc_pd", || ctx.alloc_pd().expect("alloc_pd"));
    let _buf = timed(&mut s, "reg_mr", || {
        pd.alloc_buffer(MR_BYTES, Access::ALL).expect("reg_mr")
    });
    let (_cq, mut qp) = timed(&mut s, "create_qp", || {
        let cq = ctx.create_cq(256, false).expect("create_cq");
        let qp = pd.create_qp(&cq, &cq, caps()).expect("create_qp");
        (cq, qp)
    });
    let ctx_b = f.open(B_DEFAULT);
    let pd_b = ctx_b.alloc_pd().expect("alloc_pd");
    let cq_b = ctx_b.create_cq(256, false).expect("create_cq");
    let mut qp_b = pd_b.create_qp(&cq_b, &cq_b, caps()).expect("create_qp");
    let (ga, gb) = (ctx.query_gid(0).unwrap(), ctx_b.query_gid(0).unwrap());
    timed(&mut s, "modify_init", || {
        qp.modify(QpState::Init, &QpAttr::init(Access::ALL))
            .expect("INIT")
    });
    timed(&mut s, "modify_rtr", || {
        qp.modify(QpState::Rtr, &rtr(gb, qp_b.qpn())).expect("RTR")
    });
    timed(&mut s, "modify_rts", || {
        qp.modify(QpState::Rts, &QpAttr::rts(0)).expect("RTS")
    });
    qp_b.modify(QpState::Init, &QpAttr::init(Access::ALL))
        .expect("INIT");
    qp_b.modify(QpState::Rtr, &rtr(ga, qp.qpn())).expect("RTR");
    qp_b.modify(QpState::Rts, &QpAttr::rts(0)).expect("RTS");
    s
}

/// One resilient walk, as [`plain_walk`], plus the shadow verbs' and the protection's times.
fn resilient_walk(service_a: &FailoverService, service_b: &FailoverService) -> Sample {
    let f = Fabric::new();
    let mut s = Sample::new();
    let ctx = timed(&mut s, "open", || {
        ResilientContext::new(
            f.open(A_DEFAULT),
            Some(f.open(A_BACKUP)),
            service_a,
            ResilientConfig::default(),
            None,
        )
    });
    let pd = timed(&mut s, "alloc_pd", || ctx.alloc_pd().expect("alloc_pd"));
    let _buf = timed(&mut s, "reg_mr", || {
        pd.alloc_buffer(MR_BYTES, Access::ALL).expect("reg_mr")
    });
    let mut qp = timed(&mut s, "create_qp", || {
        pd.create_qp(caps()).expect("create_qp")
    });
    let t_created = Instant::now();
    let blob = qp
        .rendezvous_blob(Duration::from_secs(10))
        .expect("the backup QP");
    s.insert("shadow_done", t_created.elapsed());

    let ctx_b = ResilientContext::new(
        f.open(B_DEFAULT),
        Some(f.open(B_BACKUP)),
        service_b,
        ResilientConfig::default(),
        None,
    );
    let pd_b = ctx_b.alloc_pd().expect("alloc_pd");
    let mut qp_b = pd_b.create_qp(caps()).expect("create_qp");
    let blob_b = qp_b
        .rendezvous_blob(Duration::from_secs(10))
        .expect("the backup QP");
    qp.connect_backup(&blob_b).expect("connect_backup");
    qp_b.connect_backup(&blob).expect("connect_backup");
    let ga = ctx.default_context().query_gid(0).unwrap();
    let gb = ctx_b.default_context().query_gid(0).unwrap();
    timed(&mut s, "modify_init", || {
        qp.modify(QpState::Init, &QpAttr::init(Access::ALL))
            .expect("INIT")
    });
    timed(&mut s, "modify_rtr", || {
        qp.modify(QpState::Rtr, &rtr(gb, qp_b.qpn())).expect("RTR")
    });
    timed(&mut s, "modify_rts", || {
        qp.modify(QpState::Rts, &QpAttr::rts(0)).expect("RTS")
    });
    let t_rts = Instant::now();
    qp_b.modify(QpState::Init, &QpAttr::init(Access::ALL))
        .expect("INIT");
    qp_b.modify(QpState::Rtr, &rtr(ga, qp.qpn())).expect("RTR");
    qp_b.modify(QpState::Rts, &QpAttr::rts(0)).expect("RTS");
    qp_b.wait_protected(Duration::from_secs(10))
        .expect("B protected");
    qp.wait_protected(Duration::from_secs(10))
        .expect("A protected");
    s.insert("protected", t_rts.elapsed());
    s
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    if v.is_empty() {
        return f64::NAN;
    }
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        us(v[m])
    } else {
        (us(v[m - 1]) + us(v[m])) / 2.0
    }
}

fn main() {
    let args = Args::parse();
    let service_a = FailoverService::start(ServiceConfig::default()).expect("service A");
    let service_b = FailoverService::start(ServiceConfig::default()).expect("service B");
    let mut plain: BTreeMap<&str, Vec<Duration>> = BTreeMap::new();
    let mut resilient: BTreeMap<&str, Vec<Duration>> = BTreeMap::new();
    // One untimed walk of each warms the allocator and the code.
    plain_walk();
    resilient_walk(&service_a, &service_b);
    // Which walk goes first alternates: whatever the one before leaves behind (threads still
    // exiting, memory to reclaim) falls on both alike.
    for rep in 0..args.reps.max(1) {
        for plain_now in [rep % 2 == 0, rep % 2 == 1] {
            if plain_now {
                for (verb, d) in plain_walk() {
                    plain.entry(verb).or_default().push(d);
                }
            } else {
                for (verb, d) in resilient_walk(&service_a, &service_b) {
                    resilient.entry(verb).or_default().push(d);
                }
            }
        }
    }
    let mut verbs = serde_json::Map::new();
    for verb in [
        "open",
        "alloc_pd",
        "reg_mr",
        "create_qp",
        "modify_init",
        "modify_rtr",
        "modify_rts",
    ] {
        let p = median(plain.remove(verb).unwrap_or_default());
        let r = median(resilient.remove(verb).unwrap_or_default());
        verbs.insert(
            verb.to_owned(),
            json!({"plain_us": p, "resilient_us": r, "ratio": r / p}),
        );
    }
    let out = json!({
        "control_verbs": verbs,
        "shadow_done_us": median(resilient.remove("shadow_done").unwrap_or_default()),
        "protected_us": median(resilient.remove("protected").unwrap_or_default()),
        "reps": args.reps.max(1),
        "device": "softnic on an in-process fabric (engine threads)",
    });
    let text = serde_json::to_string_pretty(&out).expect("JSON");
    println!("{text}");
    if let Some(path) = &args.json {
        if let Err(e) = std::fs::write(path, &text) {
            eprintln!("control_verbs: writing {}: {e}", path.display());
            std::process::exit(1);
        }
    }
}
