//! The Redis rendezvous against a real `redis-server`. `tools/test` starts a private one
//! (127.0.0.1, its own port, no persistence) and passes its URL in `RAILSHIFT_REDIS_URL`.
//! Without the variable (a plain `cargo test`) the tests that need a server print why they
//! skip and pass; with it set, a server that cannot be reached fails them.
//!
//! Keys go under a prefix unique to the run, so runs sharing a server never see each other.

mod sim;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pmd::resilient::{PeerAttrs, RedisRendezvous, Rendezvous, ResilientState};
use pmd::{Access, Gid, SendOp, SendWr, WcStatus};
use sim::traffic::{Dir, Traffic};
use sim::*;

const URL_VAR: &str = "RAILSHIFT_REDIS_URL";

/// The server's URL, or `None` (with the reason printed) when none was provided.
fn server() -> Option<String> {
    match std::env::var(URL_VAR) {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            eprintln!(
                "skipped: {URL_VAR} is not set (tools/test starts a private redis-server and sets it)"
            );
            None
        }
    }
}

/// A key prefix no other run or test uses.
fn prefix(test: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("railshift-test:{}:{nanos}:{test}", std::process::id())
}

fn attrs(qpn: u32) -> PeerAttrs {
    PeerAttrs {
        default_gid: Gid::from(std::net::Ipv4Addr::new(198, 18, 0, 1)),
        default_qpn: qpn,
        backup_gid: Gid::from(std::net::Ipv4Addr::new(198, 18, 1, 1)),
        backup_qpn: qpn + 1,
        control_qpn: qpn + 2,
        control_psn: qpn + 4,
        control_ring_addr: 0x7f00_0000_1000,
        control_ring_rkey: qpn + 3,
        rkeys: vec![(0x100, 0x200), (0x101, 0x2ff)],
    }
}

#[test]
fn attributes_published_to_redis_are_what_the_peer_looks_up() {
    let Some(url) = server() else { return };
    let store = RedisRendezvous::new(&url, &prefix("attrs")).unwrap();
    let mine = attrs(0x11);
    let gid = mine.default_gid;
    // Nothing there yet: the shadow bring-up skips the RTR and retries.
    assert_eq!(store.lookup_qp(gid, 0x11).expect("reach the server"), None);
    store.publish_qp(&mine).unwrap();
    // Another connection (another host) finds exactly what was published.
    let peer = RedisRendezvous::new(&url, &prefix("attrs-other")).unwrap();
    assert_eq!(
        peer.lookup_qp(gid, 0x11).unwrap(),
        None,
        "prefixes are separate"
    );
    assert_eq!(store.lookup_qp(gid, 0x11).unwrap(), Some(mine));
    assert_eq!(store.lookup_qp(gid, 0x12).unwrap(), None);
    assert_eq!(store.lookup_rkey(gid, 0x300).unwrap(), None);
    store.publish_rkey(gid, 0x300, 0x4abc).unwrap();
    assert_eq!(store.lookup_rkey(gid, 0x300).unwrap(), Some(0x4abc));
}

#[test]
fn an_unreachable_store_is_an_error_at_once_not_a_hang() {
    // Port 1 of loopback: nothing listens, the connection is refused.
    let store = RedisRendezvous::new("redis://127.0.0.1:1/", "nobody").unwrap();
    let started = Instant::now();
    let err = store.lookup_qp(attrs(0x11).default_gid, 0x11).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(3), "{err}");
    assert!(err.to_string().contains("127.0.0.1:1"), "{err}");
}

#[test]
fn a_connection_set_up_through_redis_fails_over_and_finds_later_rkeys_there() {
    let Some(url) = server() else { return };
    let prefix = prefix("sim");
    let check = RedisRendezvous::new(&url, &prefix).unwrap();
    let nobody = attrs(0x11).default_gid;
    assert_eq!(check.lookup_qp(nobody, 1).expect("reach the server"), None);
    let store = || -> Option<Arc<dyn Rendezvous>> {
        Some(Arc::new(RedisRendezvous::new(&url, &prefix).unwrap()))
    };
    // No blob is exchanged: each end's service publishes its attributes, and the peer's
    // backup RTR finds them by the default (GID, QPN) the application connected to.
    let mut sim = Sim::with_stores(21, config(), [store(), store()]);
    assert_eq!(sim.a.qp.state(), ResilientState::Default);

    // A buffer B registers after the rendezvous: its backup rkey is only in the store.
    let late = sim.b.pd.alloc_buffer(4096, Access::ALL).unwrap();
    let gid_b = sim.b.devices[0].query_gid(0).unwrap();
    let rkey = late.remote(0).rkey;
    let published = sim.run_until(Duration::from_secs(1), |_| {
        check.lookup_rkey(gid_b, rkey).unwrap().is_some()
    });
    assert!(
        published,
        "B's service did not publish the late MR's backup rkey"
    );

    // NCCL-like traffic across a failover, checked byte for byte by B.
    let mut t = Traffic::new(vec![Dir::new(true, 40)], sim.now());
    let mut down = false;
    let done = sim.run_until(Duration::from_secs(5), |s| {
        if !down && t.dirs[0].completed >= 10 {
            s.link_down(A_DEFAULT, None);
            down = true;
        }
        t.step(s);
        !t.violations.is_empty() || t.finished()
    });
    t.check_markers(&mut sim);
    assert!(t.violations.is_empty(), "{:#?}", t.violations);
    assert!(done && t.finished(), "{:?}", t.dirs);
    assert_eq!(sim.a.qp.state(), ResilientState::Fallback);

    // On the backup path, a WRITE to the late buffer needs its backup rkey: looked up.
    sim.a.buf.write(0, b"found through redis");
    let wr = SendWr::new(
        7,
        SendOp::Write {
            remote: late.remote(0),
        },
        &[sim.a.buf.sge(0, 19)],
    )
    .signaled();
    sim.a
        .qp
        .post_send(&wr)
        .expect("the backup rkey is in the store");
    sim.a.qp.ring_doorbell();
    let mut got = Vec::new();
    sim.run_until(Duration::from_secs(1), |s| {
        s.poll(true);
        got.append(&mut s.a.wcs);
        !got.is_empty()
    });
    let got: Vec<_> = got.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(got, vec![(7, WcStatus::Success)]);
    let mut bytes = [0u8; 19];
    late.read(0, &mut bytes);
    assert_eq!(&bytes, b"found through redis");
}

/// Issue 14, gap 4. B deregisters an MR whose backup mapping A cached on an earlier failover:
/// B's shadow withdraws the mapping from the store, and A's next round finds it gone when it
/// would retransmit a WRITE naming the old rkey. The WRITE fails closed (`LOC_PROT_ERR`, never
/// sent on the backup path) instead of going out through the stale backup rkey.
#[test]
fn a_retransmission_through_a_withdrawn_rkey_mapping_fails_closed() {
    let Some(url) = server() else { return };
    let prefix = prefix("withdraw");
    let check = RedisRendezvous::new(&url, &prefix).unwrap();
    let store = || -> Option<Arc<dyn Rendezvous>> {
        Some(Arc::new(RedisRendezvous::new(&url, &prefix).unwrap()))
    };
    let mut sim = Sim::with_stores(22, config(), [store(), store()]);
    let late = sim.b.pd.alloc_buffer(4096, Access::ALL).unwrap();
    let gid_b = sim.b.devices[0].query_gid(0).unwrap();
    let remote = late.remote(0);
    assert!(sim.run_until(Duration::from_secs(1), |_| {
        check.lookup_rkey(gid_b, remote.rkey).unwrap().is_some()
    }));
    let write =
        |wr_id| SendWr::new(wr_id, SendOp::Write { remote }, &[sim.a.buf.sge(0, 64)]).signaled();
    let (first, second) = (write(1), write(2));
    // A fails over with a WRITE to the late buffer outstanding: its mapping is looked up and
    // cached. The link comes back and A switches back.
    sim.a.qp.post_send(&first).unwrap();
    sim.a.qp.ring_doorbell();
    sim.link_down(A_DEFAULT, Some(Duration::from_millis(5)));
    let mut got = Vec::new();
    let back = sim.run_until(Duration::from_secs(3), |s| {
        s.poll(true);
        got.append(&mut s.a.wcs);
        s.a.qp.state() == ResilientState::Default && !got.is_empty()
    });
    assert!(back, "{:?} {:?}", sim.a.qp.state(), sim.a.qp.events());
    assert_eq!(
        got.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::Success)]
    );
    // B deregisters the buffer: the store forgets its mapping.
    drop(late);
    assert_eq!(check.lookup_rkey(gid_b, remote.rkey).unwrap(), None);
    // A WRITE naming the old rkey, rung but not yet sent when the default link dies: the
    // round would retransmit it on the backup path, through a mapping that is gone.
    sim.a.qp.post_send(&second).unwrap();
    sim.a.qp.ring_doorbell();
    sim.link_down(A_DEFAULT, None);
    let mut got = Vec::new();
    sim.run_until(Duration::from_secs(2), |s| {
        s.poll(true);
        got.append(&mut s.a.wcs);
        !got.is_empty()
    });
    assert_eq!(
        got.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(2, WcStatus::LocProtErr)],
        "{:?}",
        sim.a.qp.events()
    );
    assert_eq!(sim.a.qp.state(), ResilientState::Failed);
}
