//! `service_round`: what one round of a failover service without a thread costs (the round a
//! run-to-completion lcore runs between its polls: link watch, control CQs, timers) with one
//! protected resilient QP and with `--qps` of them, none carrying traffic, in one run on an
//! in-process softnic fabric (no root, no network); and the round that takes a link-down of
//! the default device to every one of the `--qps` QPs (moves their default QPs to ERR and
//! mails them).
//!
//! This is the cost that shows in the tail of an 8-byte latency loop beside 1,000 idle QPs
//! (`shift-testbed idle-lat`): the lcore runs this round every so often, and the
//! loop waits while it does. Host A's service is the measured one (manual); host B's runs on
//! its own thread. Prints one JSON object: per count, the round's p50, p99 and mean in
//! microseconds over `--rounds` rounds, the p50 ratio of `--qps` to one QP, and the
//! link-down round (the longest round in the 200 ms after the link went down).
//!
//!     cargo run --release -p benches --bin service_round -- [--qps 1000] [--rounds 5000] [--management] [--json OUT]

use std::time::{Duration, Instant};

use benches::fabric::{caps, rtr, Fabric, A_BACKUP, A_DEFAULT, B_BACKUP, B_DEFAULT};
use clap::Parser;
use pmd::resilient::{
    Clock, FailoverService, ResilientConfig, ResilientContext, ResilientPd, ResilientQp,
    ServiceConfig,
};
use pmd::{Access, Gid, QpAttr, QpState};
use serde_json::json;

#[derive(Parser, Debug)]
#[command(about = "The cost of a failover service round with 1 and with N idle resilient QPs")]
struct Args {
    /// Resilient QP pairs in the second measurement.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(2..=4096))]
    qps: u32,
    /// Rounds timed at each count.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u32).range(10..))]
    rounds: u32,
    /// Also write the JSON here.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Give every QP a management channel on loopback (`docs/failover.md` 5f), as the apps do
    /// with `--mgmt`: the round then also serves the management socket.
    #[arg(long)]
    management: bool,
}

/// Microsecond percentiles of `samples` (sorted here).
fn summary(samples: &mut [f64]) -> serde_json::Value {
    samples.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    json!({
        "p50": at(0.5),
        "p99": at(0.99),
        "mean": samples.iter().sum::<f64>() / samples.len() as f64,
        "rounds": samples.len(),
    })
}

/// Times `rounds` rounds of `service`, in microseconds.
fn time_rounds(service: &FailoverService, rounds: u32) -> Vec<f64> {
    (0..rounds)
        .map(|_| {
            let t = Instant::now();
            service.run_once();
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect()
}

/// Creates one protected pair: A's QP on `pd_a` (its service manual, driven by the waits),
/// B's on `pd_b`, both in RTS towards each other.
fn protected_pair(
    pd_a: &ResilientPd,
    pd_b: &ResilientPd,
    ga: Gid,
    gb: Gid,
) -> (ResilientQp, ResilientQp) {
    let wait = Duration::from_secs(30);
    let mut qa = pd_a.create_qp(caps()).expect("create_qp");
    let mut qb = pd_b.create_qp(caps()).expect("create_qp");
    let blob_a = qa.rendezvous_blob(wait).expect("A's backup side");
    let blob_b = qb.rendezvous_blob(wait).expect("B's backup side");
    qa.connect_backup(&blob_b).expect("connect_backup");
    qb.connect_backup(&blob_a).expect("connect_backup");
    let (qpn_a, qpn_b) = (qa.qpn(), qb.qpn());
    for state in [QpState::Init, QpState::Rtr, QpState::Rts] {
        for (qp, (gid, qpn)) in [(&mut qa, (gb, qpn_b)), (&mut qb, (ga, qpn_a))] {
            let attr = match state {
                QpState::Init => QpAttr::init(Access::ALL),
                QpState::Rtr => rtr(gid, qpn),
                _ => QpAttr::rts(0),
            };
            qp.modify(state, &attr).expect("bring the QP up");
        }
    }
    (qa, qb)
}

fn main() {
    let args = Args::parse();
    let f = Fabric::new();
    let service_a = FailoverService::manual(Clock::real()).expect("service");
    let service_b = FailoverService::start(ServiceConfig::default()).expect("service");
    let config = ResilientConfig {
        management_addr: args
            .management
            .then_some(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)),
        ..ResilientConfig::default()
    };
    let a = ResilientContext::new(
        f.open(A_DEFAULT),
        Some(f.open(A_BACKUP)),
        &service_a,
        config.clone(),
        None,
    );
    let b = ResilientContext::new(
        f.open(B_DEFAULT),
        Some(f.open(B_BACKUP)),
        &service_b,
        config,
        None,
    );
    let ga = a.default_context().query_gid(0).expect("GID");
    let gb = b.default_context().query_gid(0).expect("GID");
    let (pd_a, pd_b) = (a.alloc_pd().expect("PD"), b.alloc_pd().expect("PD"));
    let wait = Duration::from_secs(30);
    let protect = |pairs: &mut [(ResilientQp, ResilientQp)]| {
        for (qa, qb) in pairs {
            qa.wait_protected(wait).expect("A protected");
            qb.wait_protected(wait).expect("B protected");
        }
    };

    let mut pairs = vec![protected_pair(&pd_a, &pd_b, ga, gb)];
    protect(&mut pairs);
    time_rounds(&service_a, args.rounds / 10);
    let mut one = time_rounds(&service_a, args.rounds);

    while pairs.len() < args.qps as usize {
        pairs.push(protected_pair(&pd_a, &pd_b, ga, gb));
    }
    protect(&mut pairs);
    time_rounds(&service_a, args.rounds / 10);
    let mut many = time_rounds(&service_a, args.rounds);

    // The default link of host A goes down: the round that sees it moves every default QP
    // to ERR and mails every QP.
    f.set_link(A_DEFAULT, false);
    let until = Instant::now() + Duration::from_millis(200);
    let mut link_down_round = 0f64;
    while Instant::now() < until {
        let t = Instant::now();
        service_a.run_once();
        link_down_round = link_down_round.max(t.elapsed().as_secs_f64() * 1e6);
    }

    let (s_one, s_many) = (summary(&mut one), summary(&mut many));
    let ratio = s_many["p50"].as_f64().unwrap_or(0.0) / s_one["p50"].as_f64().unwrap_or(1.0);
    let out = json!({
        "service_round_us": {
            "qps_1": s_one,
            format!("qps_{}", args.qps): s_many,
            "p50_ratio": ratio,
        },
        "link_down_round_us": link_down_round,
        "qps": args.qps,
        "management": args.management,
    });
    let text = serde_json::to_string_pretty(&out).expect("JSON");
    println!("{text}");
    if let Some(path) = args.json {
        if let Err(e) = std::fs::write(&path, &text) {
            eprintln!("service_round: cannot write {}: {e}", path.display());
            std::process::exit(1);
        }
    }
    drop(pairs);
}
