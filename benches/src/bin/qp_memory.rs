//! `qp_memory`: the memory a resilient QP costs against a plain one, as the SHIFT paper counts
//! it (138 KB per backup QP, 33 KB per CQ, 171 MB for 1,000 QPs on a ConnectX), measured in
//! one run on softnic devices of an in-process fabric (no root, no network).
//!
//! Each kind of object is created `--qps` times in a child process of its own (so that memory
//! one measurement freed and the allocator kept cannot hide the next one's), on both hosts of
//! the fabric, and the child reports how much its resident set grew (`VmRSS`) from just
//! before the first object to just after the last one is ready:
//! - `cq`: a CQ of the size a resilient QP gives its own (one CQE for every WQE both queues
//!   can hold, flushes included);
//! - `plain_qp`: a plain QP with such a CQ, connected and in RTS;
//! - `resilient_qp`: a resilient QP in RTS and protected: its default QP and CQ, and the
//!   backup QP, its seat in a shared backup CQ, and the control QP pair's end with its CQ
//!   and ring, which the failover service created;
//!
//! and, to break `resilient_qp - plain_qp` down into its parts, plain objects of the shapes
//! the failover service gives the backup side (`docs/failover.md` 9):
//! - `backup_cq`: a CQ of the size the backup QP's CQ has (one CQE for every WQE the backup
//!   queues can hold: `pmd`'s `completions_bound`, which at these depths is what they ask for);
//! - `backup_qp`: a plain QP at the backup depths with such a CQ, connected and in RTS;
//! - `control_qp`: what one control channel holds: a PD of its own, a QP at the control depth
//!   (inline messages), its ring registered, and its share of a CQ (`2 x depth` entries, a CQ
//!   of its own here), connected and in RTS. A resilient QP has two (one per device);
//! - `backup_qp_shared_cq`: `backup_qp`, but the QPs of a host share CQs the way a resilient
//!   context's backup QPs do (`pmd/src/resilient/backup_cq.rs`: each member's seat of its
//!   worst case, a CQ of one member's worth first, each next one twice as many up to 64):
//!   the backup QP as a resilient QP has it.
//!
//! Per object, in KiB: the growth divided by the objects on both hosts. `backup_side_kib` is
//! `resilient_qp - plain_qp`, what failover adds per QP (the paper's "per backup QP" plus its
//! CQ); `rest_kib` is what the parts above leave of it (`backup_side - backup_qp_shared_cq -
//! 2 x control_qp`: the resilient QP's own bookkeeping, its shadow and the service's records);
//! `shared_backup_cq_saves_kib` is `backup_qp - backup_qp_shared_cq`;
//! `for_qps_mib` are the objects at `--qps` (one host). Prints one JSON object.
//!
//!     cargo run --release -p benches --bin qp_memory -- [--qps 1000] [--json OUT]

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use benches::fabric::{caps, rtr, Fabric, A_BACKUP, A_DEFAULT, B_BACKUP, B_DEFAULT};
use clap::{Parser, ValueEnum};
use pmd::failover::CONTROL_MESSAGE_LEN;
use pmd::resilient::{FailoverService, ResilientConfig, ResilientContext, ServiceConfig};
use pmd::{Access, Context, Cq, Gid, QpAttr, QpCaps, QpState};
use serde_json::json;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Kind {
    #[value(name = "cq")]
    Cq,
    #[value(name = "plain_qp")]
    PlainQp,
    #[value(name = "resilient_qp")]
    ResilientQp,
    #[value(name = "backup_cq")]
    BackupCq,
    #[value(name = "backup_qp")]
    BackupQp,
    #[value(name = "control_qp")]
    ControlQp,
    #[value(name = "backup_qp_shared_cq")]
    BackupQpSharedCq,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Cq => "cq",
            Kind::PlainQp => "plain_qp",
            Kind::ResilientQp => "resilient_qp",
            Kind::BackupCq => "backup_cq",
            Kind::BackupQp => "backup_qp",
            Kind::ControlQp => "control_qp",
            Kind::BackupQpSharedCq => "backup_qp_shared_cq",
        }
    }
}

/// Every kind, in the order they are measured.
const KINDS: [Kind; 7] = [
    Kind::Cq,
    Kind::PlainQp,
    Kind::ResilientQp,
    Kind::BackupCq,
    Kind::BackupQp,
    Kind::ControlQp,
    Kind::BackupQpSharedCq,
];

/// Members a host's first shared CQ takes, and the most one takes: the rule of the backup CQs
/// a resilient context's backup QPs share (`pmd/src/resilient/backup_cq.rs`: one seat first,
/// each next CQ twice as many, up to 64).
const FIRST_MEMBERS_PER_CQ: u32 = 1;
const MAX_MEMBERS_PER_CQ: u32 = 64;

/// Where the QPs of [`plain_pairs`] complete.
#[derive(Clone, Copy)]
enum CqPlan {
    /// Each QP has a CQ of its own of this many entries.
    Own(u32),
    /// The QPs of a host share CQs, each member taking this many entries of one.
    Shared(u32),
}

/// One host's CQs under a [`CqPlan`]: the CQ the next QP completes in.
struct HostCqs {
    plan: CqPlan,
    /// The CQs made so far, and how many more members the last one takes.
    cqs: Vec<Cq>,
    room: u32,
}

impl HostCqs {
    fn new(plan: CqPlan) -> HostCqs {
        HostCqs {
            plan,
            cqs: Vec::new(),
            room: 0,
        }
    }

    /// The CQ for the next QP on `ctx`, creating one when the plan needs it.
    fn next(&mut self, ctx: &Arc<Context>) -> &Cq {
        match self.plan {
            CqPlan::Own(entries) => {
                self.cqs
                    .push(ctx.create_cq(entries, false).expect("create_cq"));
            }
            CqPlan::Shared(per_member) => {
                if self.room == 0 {
                    let shift = self.cqs.len().min(16) as u32;
                    let members = (FIRST_MEMBERS_PER_CQ << shift).min(MAX_MEMBERS_PER_CQ);
                    let cq = ctx.create_cq(members * per_member, false);
                    self.cqs.push(cq.expect("create_cq"));
                    self.room = members;
                }
                self.room -= 1;
            }
        }
        self.cqs.last().expect("one was made")
    }
}

#[derive(Parser)]
#[command(about = "memory per resilient QP against a plain QP and a CQ (SHIFT section 6)")]
struct Args {
    /// Objects of each kind per host.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=4096))]
    qps: u32,
    /// Also write the JSON here.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Internal: measure one kind in this process and print the growth in bytes.
    #[arg(long, hide = true)]
    child: Option<Kind>,
}

/// What the process holds, in bytes: resident (`VmRSS`, the pages touched) and reserved
/// (`VmData`, private data mappings whether touched or not: rings the NIC has not written yet
/// count here only).
#[derive(Debug, Clone, Copy)]
struct Footprint {
    resident: u64,
    reserved: u64,
}

impl Footprint {
    fn now() -> Footprint {
        let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
        let field = |name: &str| -> u64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .unwrap_or_else(|| panic!("{name} in /proc/self/status"))
                * 1024
        };
        Footprint {
            resident: field("VmRSS:"),
            reserved: field("VmData:"),
        }
    }

    /// How much each measure grew since `before`.
    fn since(self, before: Footprint) -> Footprint {
        Footprint {
            resident: self.resident.saturating_sub(before.resident),
            reserved: self.reserved.saturating_sub(before.reserved),
        }
    }
}

/// CQ entries of a resilient QP's own (default) CQ at the benches' caps (`pmd`'s rule: every
/// WQE both queues hold, twice).
fn cq_entries() -> u32 {
    let c = caps();
    2 * (c.max_send_wr + c.max_recv_wr).max(8)
}

/// CQ entries of the backup QP's CQ (`pmd`'s rule: every WQE the backup queues can hold,
/// once; the soft provider grants these power-of-two depths as asked).
fn backup_cq_entries() -> u32 {
    let b = backup_caps();
    b.max_send_wr + b.max_recv_wr
}

/// The depths the failover service gives the backup QP of a QP of the benches' caps (`pmd`'s
/// rule, `docs/failover.md` 3.5): the backup SQ holds the peer's burns (a default RQ's worth)
/// in front of a default SQ, the backup RQ two default RQs.
fn backup_caps() -> QpCaps {
    let c = caps();
    QpCaps {
        max_send_wr: c.max_send_wr + c.max_recv_wr,
        max_recv_wr: 2 * c.max_recv_wr,
        ..c
    }
}

/// The depths of a control channel's QP at the default control depth (inline messages).
fn control_caps() -> QpCaps {
    let depth = ResilientConfig::default()
        .control_depth
        .max(4)
        .next_power_of_two();
    QpCaps {
        max_send_wr: depth,
        max_recv_wr: depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: CONTROL_MESSAGE_LEN as u32,
    }
}

/// Creates `n` CQs of `entries` on the default device of each host and returns how much the
/// footprint grew.
fn cqs(f: &Fabric, n: u32, entries: u32) -> Footprint {
    let (a, b) = (f.open(A_DEFAULT), f.open(B_DEFAULT));
    let before = Footprint::now();
    let cqs: Vec<_> = (0..n)
        .flat_map(|_| [&a, &b])
        .map(|ctx| ctx.create_cq(entries, false).expect("create_cq"))
        .collect();
    let grown = Footprint::now().since(before);
    drop(cqs);
    grown
}

/// Creates `n` connected pairs of plain QPs of `caps` completing in CQs as `cqs` plans, on
/// the default devices of both hosts, and returns how much the footprint grew. With `ring_len`, each QP also gets a PD of its own and a registered ring of that
/// many bytes (a control channel's shape).
fn plain_pairs(
    f: &Fabric,
    n: u32,
    caps: QpCaps,
    cqs: CqPlan,
    ring_len: Option<usize>,
) -> Footprint {
    let (a, b) = (f.open_for(A_DEFAULT, n), f.open_for(B_DEFAULT, n));
    let (ga, gb) = (a.query_gid(0).unwrap(), b.query_gid(0).unwrap());
    let (shared_a, shared_b) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let before = Footprint::now();
    let (mut cqs_a, mut cqs_b) = (HostCqs::new(cqs), HostCqs::new(cqs));
    let mut pairs = Vec::new();
    for _ in 0..n {
        let (pd_a, pd_b, rings) = match ring_len {
            Some(len) => {
                let (pd_a, pd_b) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
                let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
                let rings = (
                    pd_a.alloc_buffer(len, access).expect("alloc_buffer"),
                    pd_b.alloc_buffer(len, access).expect("alloc_buffer"),
                );
                (pd_a, pd_b, Some(rings))
            }
            None => (shared_a.clone(), shared_b.clone(), None),
        };
        let cq_a = cqs_a.next(&a);
        let mut qa = pd_a.create_qp(cq_a, cq_a, caps).expect("create_qp");
        let cq_b = cqs_b.next(&b);
        let mut qb = pd_b.create_qp(cq_b, cq_b, caps).expect("create_qp");
        let (qpn_a, qpn_b) = (qa.qpn(), qb.qpn());
        connect_pair((ga, qpn_a), (gb, qpn_b), |end, state, attr| {
            let qp = if end == 0 { &mut qa } else { &mut qb };
            qp.modify(state, attr).map(drop).map_err(|e| e.to_string())
        });
        pairs.push((qa, qb, rings, pd_a, pd_b));
    }
    let grown = Footprint::now().since(before);
    drop(pairs);
    drop((cqs_a, cqs_b));
    grown
}

/// Brings QP 0 (at `a`: GID, QPN) and QP 1 (at `b`) to RTS towards each other through
/// `modify(end, state, attributes)`: INIT both, RTR both, RTS both.
fn connect_pair(
    a: (Gid, u32),
    b: (Gid, u32),
    mut modify: impl FnMut(usize, QpState, &QpAttr) -> Result<(), String>,
) {
    let peers = [b, a];
    for (state, what) in [
        (QpState::Init, "INIT"),
        (QpState::Rtr, "RTR"),
        (QpState::Rts, "RTS"),
    ] {
        for (end, (gid, qpn)) in peers.iter().enumerate() {
            let attr = match state {
                QpState::Init => QpAttr::init(Access::ALL),
                QpState::Rtr => rtr(*gid, *qpn),
                _ => QpAttr::rts(0),
            };
            if let Err(e) = modify(end, state, &attr) {
                panic!("modify QP {end} to {what}: {e}");
            }
        }
    }
}

/// Creates `n` objects of `kind` on each host and returns how much the resident set grew.
fn measure(kind: Kind, n: u32) -> Footprint {
    let f = Fabric::new();
    match kind {
        Kind::Cq => cqs(&f, n, cq_entries()),
        Kind::PlainQp => plain_pairs(&f, n, caps(), CqPlan::Own(cq_entries()), None),
        Kind::BackupCq => cqs(&f, n, backup_cq_entries()),
        Kind::BackupQp => {
            let entries = backup_cq_entries();
            plain_pairs(&f, n, backup_caps(), CqPlan::Own(entries), None)
        }
        Kind::BackupQpSharedCq => {
            let entries = backup_cq_entries();
            plain_pairs(&f, n, backup_caps(), CqPlan::Shared(entries), None)
        }
        Kind::ControlQp => {
            let c = control_caps();
            let ring = 2 * c.max_send_wr as usize * CONTROL_MESSAGE_LEN;
            plain_pairs(&f, n, c, CqPlan::Own(2 * c.max_send_wr), Some(ring))
        }
        Kind::ResilientQp => {
            let service_a = FailoverService::start(ServiceConfig::default()).expect("service");
            let service_b = FailoverService::start(ServiceConfig::default()).expect("service");
            let a = ResilientContext::new(
                f.open_for(A_DEFAULT, n),
                Some(f.open_for(A_BACKUP, n)),
                &service_a,
                ResilientConfig::default(),
                None,
            );
            let b = ResilientContext::new(
                f.open_for(B_DEFAULT, n),
                Some(f.open_for(B_BACKUP, n)),
                &service_b,
                ResilientConfig::default(),
                None,
            );
            let ga = a.default_context().query_gid(0).unwrap();
            let gb = b.default_context().query_gid(0).unwrap();
            let (pd_a, pd_b) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
            let wait = Duration::from_secs(30);
            let before = Footprint::now();
            let mut pairs = Vec::new();
            for _ in 0..n {
                let mut qa = pd_a.create_qp(caps()).expect("create_qp");
                let mut qb = pd_b.create_qp(caps()).expect("create_qp");
                let blob_a = qa.rendezvous_blob(wait).expect("A's backup side");
                let blob_b = qb.rendezvous_blob(wait).expect("B's backup side");
                qa.connect_backup(&blob_b).expect("connect_backup");
                qb.connect_backup(&blob_a).expect("connect_backup");
                let (qpn_a, qpn_b) = (qa.qpn(), qb.qpn());
                connect_pair((ga, qpn_a), (gb, qpn_b), |end, state, attr| {
                    let qp = if end == 0 { &mut qa } else { &mut qb };
                    qp.modify(state, attr).map(drop).map_err(|e| e.to_string())
                });
                pairs.push((qa, qb));
            }
            for (qa, qb) in &mut pairs {
                qa.wait_protected(wait).expect("A protected");
                qb.wait_protected(wait).expect("B protected");
            }
            let grown = Footprint::now().since(before);
            drop(pairs);
            grown
        }
    }
}

/// Runs `kind`'s measurement in a child process and returns its growth.
fn measure_in_child(kind: Kind, n: u32) -> Result<Footprint, String> {
    let exe = std::env::current_exe().map_err(|e| format!("finding this program: {e}"))?;
    let out = Command::new(exe)
        .args(["--qps", &n.to_string(), "--child", kind.name()])
        .output()
        .map_err(|e| format!("running the {} child: {e}", kind.name()))?;
    if !out.status.success() {
        return Err(format!(
            "the {} child failed ({}): {}",
            kind.name(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut numbers = text.split_whitespace().map(str::parse::<u64>);
    match (numbers.next(), numbers.next()) {
        (Some(Ok(resident)), Some(Ok(reserved))) => Ok(Footprint { resident, reserved }),
        _ => Err(format!(
            "the {} child printed {:?}, not two byte counts",
            kind.name(),
            text.trim()
        )),
    }
}

fn main() {
    let args = Args::parse();
    // The driver's warnings and errors (a backup side that cannot be set up says why there),
    // on stderr; `RUST_LOG` for more.
    testbed::log_to_stderr();
    if let Some(kind) = args.child {
        let grown = measure(kind, args.qps);
        println!("{} {}", grown.resident, grown.reserved);
        return;
    }
    let n = args.qps;
    let mut resident = std::collections::BTreeMap::new();
    let mut reserved = std::collections::BTreeMap::new();
    for kind in KINDS {
        let grown = match measure_in_child(kind, n) {
            Ok(grown) => grown,
            Err(e) => {
                eprintln!("qp_memory: {e}");
                std::process::exit(1);
            }
        };
        // Both hosts made `n` each.
        let per_kib = |bytes: u64| bytes as f64 / 1024.0 / (2.0 * f64::from(n));
        resident.insert(kind.name(), per_kib(grown.resident));
        reserved.insert(kind.name(), per_kib(grown.reserved));
    }
    let summary = |per: &std::collections::BTreeMap<&str, f64>| {
        json!({
            "per_object_kib": per,
            "backup_side_kib": per["resilient_qp"] - per["plain_qp"],
            "rest_kib": per["resilient_qp"] - per["plain_qp"] - per["backup_qp_shared_cq"] - 2.0 * per["control_qp"],
            "shared_backup_cq_saves_kib": per["backup_qp"] - per["backup_qp_shared_cq"],
            "ratio": per["resilient_qp"] / per["plain_qp"],
            "for_qps_mib": per
                .iter()
                .map(|(k, v)| (k.to_string(), json!(v * f64::from(n) / 1024.0)))
                .collect::<serde_json::Map<_, _>>(),
        })
    };
    let (c, b, k) = (caps(), backup_caps(), control_caps());
    let out = json!({
        "qp_memory": {
            "resident": summary(&resident),
            "reserved": summary(&reserved),
        },
        "qps": n,
        "caps": {"max_send_wr": c.max_send_wr, "max_recv_wr": c.max_recv_wr, "cq_entries": cq_entries()},
        "backup_caps": {"max_send_wr": b.max_send_wr, "max_recv_wr": b.max_recv_wr, "cq_entries": backup_cq_entries()},
        "control_caps": {"max_send_wr": k.max_send_wr, "max_recv_wr": k.max_recv_wr, "max_inline_data": k.max_inline_data, "cq_entries": 2 * k.max_send_wr},
        "measure": "growth of VmRSS (resident) and VmData (reserved) of a child process per kind, divided by the objects on both hosts",
        "device": "softnic on an in-process fabric (engine threads)",
    });
    let text = serde_json::to_string_pretty(&out).expect("JSON");
    println!("{text}");
    if let Some(path) = &args.json {
        if let Err(e) = std::fs::write(path, &text) {
            eprintln!("qp_memory: writing {}: {e}", path.display());
            std::process::exit(1);
        }
    }
}
