//! The Redis rendezvous against a real `redis-server`. `tools/test` starts a private one
//! (127.0.0.1, its own port, no persistence) and passes its URL in `RAILSHIFT_REDIS_URL`.
//! Without the variable (a plain `cargo test`) the tests that need a server print why they
//! skip and pass; with it set, a server that cannot be reached fails them.
//!
//! Keys go under a prefix unique to the run, so runs sharing a server never see each other.

mod sim;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pmd::resilient::{
    PeerAttrs, RedisRendezvous, Rendezvous, RendezvousError, RendezvousKey, ResilientState,
};
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

/// The job's secret both ends are given.
fn key() -> RendezvousKey {
    RendezvousKey::from_bytes(b"railshift test job secret 32 B!!").unwrap()
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
        default_control_qpn: qpn + 5,
        default_control_psn: qpn + 6,
        default_control_ring_addr: 0x7f00_0000_2000,
        default_control_ring_rkey: qpn + 7,
        rkeys: vec![(0x100, 0x200), (0x101, 0x2ff)],
        management: None,
    }
}

#[test]
fn attributes_published_to_redis_are_what_the_peer_looks_up() {
    let Some(url) = server() else { return };
    let store = RedisRendezvous::new(&url, &prefix("attrs"), key()).unwrap();
    let mine = attrs(0x11);
    let gid = mine.default_gid;
    // Nothing there yet: the shadow bring-up skips the RTR and retries.
    assert_eq!(store.lookup_qp(gid, 0x11).expect("reach the server"), None);
    store.publish_qp(&mine).unwrap();
    // Another connection (another host) finds exactly what was published.
    let peer = RedisRendezvous::new(&url, &prefix("attrs-other"), key()).unwrap();
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
    let store = RedisRendezvous::new("redis://127.0.0.1:1/", "nobody", key()).unwrap();
    let started = Instant::now();
    let err = store.lookup_qp(attrs(0x11).default_gid, 0x11).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(3), "{err}");
    assert!(err.to_string().contains("127.0.0.1:1"), "{err}");
}

#[test]
fn a_connection_set_up_through_redis_fails_over_and_finds_later_rkeys_there() {
    let Some(url) = server() else { return };
    let prefix = prefix("sim");
    let check = RedisRendezvous::new(&url, &prefix, key()).unwrap();
    let nobody = attrs(0x11).default_gid;
    assert_eq!(check.lookup_qp(nobody, 1).expect("reach the server"), None);
    let store = || -> Option<Arc<dyn Rendezvous>> {
        Some(Arc::new(
            RedisRendezvous::new(&url, &prefix, key()).unwrap(),
        ))
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

/// B deregisters an MR whose backup mapping A cached on an earlier failover:
/// B's shadow withdraws the mapping from the store, and A's next round finds it gone when it
/// would retransmit a WRITE naming the old rkey. The WRITE fails closed (`LOC_PROT_ERR`, never
/// sent on the backup path) instead of going out through the stale backup rkey.
#[test]
fn a_retransmission_through_a_withdrawn_rkey_mapping_fails_closed() {
    retransmit_after_withdrawal(22, "withdraw", |_, _, _, _| {});
}

/// As above, but whoever can write the store hides the withdrawal under an
/// entry they forged: A's next round refuses it and fails closed rather than falling back on
/// the mapping it cached (which names memory B deregistered).
#[test]
fn a_forged_entry_over_a_withdrawn_mapping_fails_closed_not_open() {
    retransmit_after_withdrawal(25, "withdraw-forged", |url, prefix, gid, rkey| {
        let other = RendezvousKey::from_bytes(b"not the job's secret, 32 bytes!!").unwrap();
        let forger = RedisRendezvous::new(url, prefix, other).unwrap();
        forger.publish_rkey(gid, rkey, 0x4242).unwrap();
        let check = RedisRendezvous::new(url, prefix, key()).unwrap();
        assert!(check.lookup_rkey(gid, rkey).is_err());
    });
}

/// A's WRITE through B's MR fails over and back; B deregisters the MR (its mapping is
/// withdrawn), `meddle(url, prefix, gid_b, rkey)` plays with the store, and A's next failover
/// must fail the WRITE naming the old rkey closed.
fn retransmit_after_withdrawal(seed: u64, name: &str, meddle: impl FnOnce(&str, &str, Gid, u32)) {
    let Some(url) = server() else { return };
    let prefix = prefix(name);
    let check = RedisRendezvous::new(&url, &prefix, key()).unwrap();
    let store = || -> Option<Arc<dyn Rendezvous>> {
        Some(Arc::new(
            RedisRendezvous::new(&url, &prefix, key()).unwrap(),
        ))
    };
    let mut sim = Sim::with_stores(seed, config(), [store(), store()]);
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
    meddle(&url, &prefix, gid_b, remote.rkey);
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

/// A plain connection to the server, to play whoever can write the store.
fn raw(url: &str) -> redis::Connection {
    redis::Client::open(url)
        .unwrap()
        .get_connection()
        .expect("reach the server")
}

fn get(conn: &mut redis::Connection, key: &str) -> Vec<u8> {
    redis::cmd("GET").arg(key).query(conn).unwrap()
}

fn set(conn: &mut redis::Connection, key: &str, value: &[u8]) {
    redis::cmd("SET")
        .arg(key)
        .arg(value)
        .query::<()>(conn)
        .unwrap()
}

fn hget(conn: &mut redis::Connection, hash: &str, field: u32) -> Vec<u8> {
    redis::cmd("HGET").arg(hash).arg(field).query(conn).unwrap()
}

fn hset(conn: &mut redis::Connection, hash: &str, field: u32, value: &[u8]) {
    redis::cmd("HSET")
        .arg(hash)
        .arg(field)
        .arg(value)
        .query::<()>(conn)
        .unwrap()
}

fn qp_key(prefix: &str, a: &PeerAttrs) -> String {
    format!("{prefix}:qp:{}:{}", a.default_gid, a.default_qpn)
}

/// An entry written by someone without the job's secret, one with a byte
/// changed, and one without a MAC at all are refused by name, counted, and never used.
#[test]
fn a_forged_altered_or_unsealed_entry_is_refused_and_counted() {
    let Some(url) = server() else { return };
    let prefix = prefix("forged");
    let reader = RedisRendezvous::new(&url, &prefix, key()).unwrap();
    let mut conn = raw(&url);
    // Forged: sealed with another secret.
    let other = RendezvousKey::from_bytes(b"another job's secret, 32 bytes!!").unwrap();
    let forger = RedisRendezvous::new(&url, &prefix, other).unwrap();
    let mine = attrs(0x11);
    forger.publish_qp(&mine).unwrap();
    let err = reader.lookup_qp(mine.default_gid, 0x11).unwrap_err();
    assert!(matches!(err, RendezvousError::BadMac { .. }), "{err}");
    assert!(err.to_string().contains(&qp_key(&prefix, &mine)), "{err}");
    // Altered: the genuine entry with the backup QPN changed (40 bytes of seal header, then
    // the attributes, whose backup QPN ends at byte 48).
    let genuine = RedisRendezvous::new(&url, &prefix, key()).unwrap();
    genuine.publish_qp(&mine).unwrap();
    assert_eq!(
        reader.lookup_qp(mine.default_gid, 0x11).unwrap(),
        Some(mine.clone())
    );
    let mut bytes = get(&mut conn, &qp_key(&prefix, &mine));
    bytes[40 + 47] ^= 0x40;
    set(&mut conn, &qp_key(&prefix, &mine), &bytes);
    let err = reader.lookup_qp(mine.default_gid, 0x11).unwrap_err();
    assert!(matches!(err, RendezvousError::BadMac { .. }), "{err}");
    // Unsealed: bare attributes, as a build without the MAC wrote them.
    set(&mut conn, &qp_key(&prefix, &mine), &mine.to_bytes());
    let err = reader.lookup_qp(mine.default_gid, 0x11).unwrap_err();
    assert!(matches!(err, RendezvousError::MissingMac { .. }), "{err}");
    // The rkey hash likewise: a decimal backup rkey, as written before.
    let hash = format!("{prefix}:rkey:{}", mine.default_gid);
    hset(&mut conn, &hash, 0x300, b"19132");
    let err = reader.lookup_rkey(mine.default_gid, 0x300).unwrap_err();
    assert!(matches!(err, RendezvousError::MissingMac { .. }), "{err}");
    let counts = reader.refusals();
    assert_eq!(
        (counts.bad_mac, counts.missing_mac, counts.total()),
        (2, 2, 4)
    );
}

/// A genuine entry written back after a newer one (the attributes of an
/// earlier QP with the same number; a mapping its publisher withdrew since) is a replay.
#[test]
fn a_replayed_older_entry_is_refused_as_stale() {
    let Some(url) = server() else { return };
    let prefix = prefix("replay");
    let publisher = RedisRendezvous::new(&url, &prefix, key()).unwrap();
    let reader = RedisRendezvous::new(&url, &prefix, key()).unwrap();
    let mut conn = raw(&url);
    let old = attrs(0x11);
    publisher.publish_qp(&old).unwrap();
    let old_bytes = get(&mut conn, &qp_key(&prefix, &old));
    let new = PeerAttrs {
        backup_qpn: 0x99,
        ..old.clone()
    };
    publisher.publish_qp(&new).unwrap();
    assert_eq!(reader.lookup_qp(old.default_gid, 0x11).unwrap(), Some(new));
    set(&mut conn, &qp_key(&prefix, &old), &old_bytes);
    let err = reader.lookup_qp(old.default_gid, 0x11).unwrap_err();
    assert!(matches!(err, RendezvousError::StaleEpoch { .. }), "{err}");

    // The rkey B withdrew (its MR deregistered), its old mapping written back.
    let gid = old.default_gid;
    let hash = format!("{prefix}:rkey:{gid}");
    publisher.publish_rkey(gid, 0x300, 0x4abc).unwrap();
    assert_eq!(reader.lookup_rkey(gid, 0x300).unwrap(), Some(0x4abc));
    let mapping = hget(&mut conn, &hash, 0x300);
    publisher.withdraw_rkey(gid, 0x300).unwrap();
    assert_eq!(reader.lookup_rkey(gid, 0x300).unwrap(), None);
    hset(&mut conn, &hash, 0x300, &mapping);
    let err = reader.lookup_rkey(gid, 0x300).unwrap_err();
    assert!(matches!(err, RendezvousError::StaleEpoch { .. }), "{err}");
    assert_eq!(reader.refusals().stale_epoch, 2);
}

/// A genuine entry moved to another connection's key (or another rkey's
/// field) is refused as that connection's, not used as this one's.
#[test]
fn an_entry_of_another_connection_is_refused() {
    let Some(url) = server() else { return };
    let prefix = prefix("moved");
    let publisher = RedisRendezvous::new(&url, &prefix, key()).unwrap();
    let reader = RedisRendezvous::new(&url, &prefix, key()).unwrap();
    let mut conn = raw(&url);
    let theirs = attrs(0x21);
    publisher.publish_qp(&theirs).unwrap();
    let bytes = get(&mut conn, &qp_key(&prefix, &theirs));
    let mine = attrs(0x11);
    set(&mut conn, &qp_key(&prefix, &mine), &bytes);
    let err = reader.lookup_qp(mine.default_gid, 0x11).unwrap_err();
    assert!(matches!(err, RendezvousError::WrongEntry { .. }), "{err}");
    assert!(err.to_string().contains("QP 0x21"), "{err}");

    let gid = mine.default_gid;
    let hash = format!("{prefix}:rkey:{gid}");
    publisher.publish_rkey(gid, 0x300, 0x4abc).unwrap();
    let mapping = hget(&mut conn, &hash, 0x300);
    hset(&mut conn, &hash, 0x301, &mapping);
    let err = reader.lookup_rkey(gid, 0x301).unwrap_err();
    assert!(matches!(err, RendezvousError::WrongEntry { .. }), "{err}");
    assert_eq!(reader.refusals().wrong_entry, 2);
}

/// Where the attributes came inline and the store holds the same end's
/// too, a disagreement is refused by name and counted.
#[test]
fn the_store_is_cross_checked_against_the_inline_exchange() {
    let Some(url) = server() else { return };
    let prefix = prefix("cross");
    let store = RedisRendezvous::new(&url, &prefix, key()).unwrap();
    let inline = attrs(0x11);
    store
        .cross_check(&inline)
        .expect("nothing in the store yet");
    store.publish_qp(&inline).unwrap();
    store.cross_check(&inline).expect("the same attributes");
    let other = PeerAttrs {
        rkeys: vec![(0x100, 0x200), (0x102, 0x202)],
        ..inline.clone()
    };
    store
        .cross_check(&other)
        .expect("rkeys taken at different times");
    let lying = PeerAttrs {
        control_ring_rkey: 0x4242,
        ..inline.clone()
    };
    let err = store.cross_check(&lying).unwrap_err();
    assert!(
        matches!(
            err,
            RendezvousError::InlineMismatch {
                field: "control ring rkey",
                ..
            }
        ),
        "{err}"
    );
    let remapped = PeerAttrs {
        rkeys: vec![(0x101, 0x2fe)],
        ..inline
    };
    assert!(store.cross_check(&remapped).is_err());
    assert_eq!(store.refusals().inline_mismatch, 2);
}

/// Only MRs with remote access have their keys published: a local-only
/// MR's keys go neither into the inline blob nor into the store.
#[test]
fn a_local_only_mr_is_never_published() {
    let mut sim = Sim::new(23, config());
    let local = sim.b.pd.alloc_buffer(4096, Access::LOCAL_WRITE).unwrap();
    let remote = sim
        .b
        .pd
        .alloc_buffer(4096, Access::LOCAL_WRITE | Access::REMOTE_READ)
        .unwrap();
    sim.run_until(Duration::from_millis(100), |_| false);
    let blob = sim.b.qp.try_rendezvous_blob().unwrap().expect("set up");
    let published = PeerAttrs::parse(&blob).unwrap().rkeys;
    assert!(
        published.iter().any(|(d, _)| *d == remote.rkey()),
        "{published:x?}"
    );
    let named = |k: u32| published.iter().any(|(d, _)| *d == k);
    assert!(
        !named(local.rkey()) && !named(local.lkey()),
        "{published:x?}"
    );
}

#[test]
fn a_local_only_mr_is_never_published_to_redis() {
    let Some(url) = server() else { return };
    let prefix = prefix("local-only");
    let check = RedisRendezvous::new(&url, &prefix, key()).unwrap();
    let store = || -> Option<Arc<dyn Rendezvous>> {
        Some(Arc::new(
            RedisRendezvous::new(&url, &prefix, key()).unwrap(),
        ))
    };
    let mut sim = Sim::with_stores(24, config(), [store(), store()]);
    let local = sim.b.pd.alloc_buffer(4096, Access::LOCAL_WRITE).unwrap();
    let remote = sim
        .b
        .pd
        .alloc_buffer(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let gid_b = sim.b.devices[0].query_gid(0).unwrap();
    assert!(sim.run_until(Duration::from_secs(1), |_| {
        check.lookup_rkey(gid_b, remote.rkey()).unwrap().is_some()
    }));
    let hash: std::collections::HashMap<u32, Vec<u8>> = redis::cmd("HGETALL")
        .arg(format!("{prefix}:rkey:{gid_b}"))
        .query(&mut raw(&url))
        .unwrap();
    assert!(!hash.contains_key(&local.rkey()) && !hash.contains_key(&local.lkey()));
    let qpn_b = sim.b.qp.qpn();
    let b = check.lookup_qp(gid_b, qpn_b).unwrap().expect("published");
    assert!(!b
        .rkeys
        .iter()
        .any(|(d, _)| *d == local.rkey() || *d == local.lkey()));
    drop(local);
    assert_eq!(check.refusals().total(), 0);
}

/// A Redis ACL user in the URL: it works with its password, and a wrong
/// one is an error that says authentication failed, without the password in it.
#[test]
fn an_acl_user_works_and_a_wrong_password_is_named() {
    let Some(url) = server() else { return };
    let prefix = prefix("acl");
    let user = format!("railshift-{}", std::process::id());
    let mut admin = raw(&url);
    // Allowed only the job's keys.
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg(&user)
        .arg("reset")
        .arg("on")
        .arg(">right-pass-7f3a")
        .arg(format!("~{prefix}:*"))
        .arg("+@all")
        .query::<()>(&mut admin)
        .unwrap();
    let with = |password: &str| url.replacen("redis://", &format!("redis://{user}:{password}@"), 1);
    let store = RedisRendezvous::new(&with("right-pass-7f3a"), &prefix, key()).unwrap();
    let mine = attrs(0x11);
    store
        .publish_qp(&mine)
        .expect("the ACL user may write the job's keys");
    assert_eq!(
        store.lookup_qp(mine.default_gid, 0x11).unwrap(),
        Some(mine.clone())
    );
    assert!(
        !format!("{store:?}").contains("right-pass-7f3a"),
        "{store:?}"
    );

    let wrong = RedisRendezvous::new(&with("wrong-pass-0b1d"), &prefix, key()).unwrap();
    let err = wrong.lookup_qp(mine.default_gid, 0x11).unwrap_err();
    let text = err.to_string();
    redis::cmd("ACL")
        .arg("DELUSER")
        .arg(&user)
        .query::<()>(&mut admin)
        .unwrap();
    assert!(text.contains("authentication failed"), "{text}");
    assert!(
        text.contains(&user) && !text.contains("wrong-pass-0b1d"),
        "{text}"
    );
}

#[test]
fn redis_without_the_jobs_secret_is_refused() {
    if std::env::var_os(pmd::resilient::KEY_FILE_VAR).is_some() {
        eprintln!("skipped: {} is set", pmd::resilient::KEY_FILE_VAR);
        return;
    }
    let err = RedisRendezvous::from_env("redis://127.0.0.1:1/", "nobody").unwrap_err();
    assert_eq!(err, RendezvousError::NoSecret);
    assert!(err.to_string().contains("RAILSHIFT_RENDEZVOUS_KEY_FILE"));
}

/// A private `redis-server` speaking only TLS, with a CA and a server certificate for
/// 127.0.0.1 made by `openssl` in a directory of its own; killed and removed on drop.
#[cfg(feature = "redis-tls")]
struct TlsServer {
    child: std::process::Child,
    dir: std::path::PathBuf,
    port: u16,
}

#[cfg(feature = "redis-tls")]
impl TlsServer {
    fn start(name: &str) -> TlsServer {
        use std::process::{Command, Stdio};
        let dir = std::env::temp_dir().join(format!("railshift-tls-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let openssl = |args: &str| {
            let out = Command::new("openssl")
                .args(args.split_whitespace())
                .current_dir(&dir)
                .output()
                .expect("openssl (tools/test installs it)");
            assert!(out.status.success(), "openssl {args}: {out:?}");
        };
        let (rsa, days) = ("-newkey rsa:2048 -nodes", "-days 1");
        openssl(&format!(
            "req -x509 {rsa} {days} -subj /CN=railshift-test-CA -keyout ca.key -out ca.crt"
        ));
        openssl(&format!(
            "req {rsa} -subj /CN=127.0.0.1 -keyout server.key -out server.csr"
        ));
        std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
        openssl(&format!(
            "x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial {days} \
             -extfile san.ext -out server.crt"
        ));
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        for attempt in 0..8u32 {
            // 30000-32699, as tools/test's plain server; a taken port makes the server exit.
            let port = 30000 + ((nanos / 7 + attempt * 331) % 2700) as u16;
            let mut child = Command::new("redis-server")
                .args([
                    "--port",
                    "0",
                    "--tls-port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                ])
                .args([
                    "--tls-cert-file",
                    "server.crt",
                    "--tls-key-file",
                    "server.key",
                ])
                .args(["--tls-ca-cert-file", "ca.crt", "--tls-auth-clients", "no"])
                .args(["--save", "", "--appendonly", "no", "--dir", "."])
                .args(["--logfile", "", "--loglevel", "warning"])
                .current_dir(&dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server (tools/test installs it)");
            for _ in 0..50 {
                if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return TlsServer { child, dir, port };
                }
                if child.try_wait().unwrap().is_some() {
                    break; // the port was taken: try another
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("could not start a TLS redis-server");
    }

    fn ca(&self) -> Vec<u8> {
        std::fs::read(self.dir.join("ca.crt")).unwrap()
    }
}

#[cfg(feature = "redis-tls")]
impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The store over TLS (`rediss://`, pmd's `redis-tls` feature): with the
/// cluster's CA the rendezvous works; trusting only the system's roots, the server's
/// certificate is refused.
#[cfg(feature = "redis-tls")]
#[test]
fn the_store_over_tls_works_with_its_ca_and_refuses_an_unknown_one() {
    if server().is_none() {
        return;
    }
    let tls = TlsServer::start("rendezvous");
    let url = format!("rediss://127.0.0.1:{}/", tls.port);
    let prefix = prefix("tls");
    let store = RedisRendezvous::new_tls(&url, &prefix, key(), &tls.ca()).unwrap();
    let mine = attrs(0x11);
    store.publish_qp(&mine).expect("publish over TLS");
    assert_eq!(
        store.lookup_qp(mine.default_gid, 0x11).unwrap(),
        Some(mine.clone())
    );
    let system_roots = RedisRendezvous::new(&url, &prefix, key()).unwrap();
    let err = system_roots.lookup_qp(mine.default_gid, 0x11).unwrap_err();
    assert!(matches!(err, RendezvousError::Store { .. }), "{err}");
    assert!(
        err.to_string().to_lowercase().contains("certificate"),
        "{err}"
    );
}

#[cfg(not(feature = "redis-tls"))]
#[test]
fn tls_without_the_feature_is_named() {
    let err = RedisRendezvous::new("rediss://127.0.0.1:1/", "nobody", key()).unwrap_err();
    assert!(err.to_string().contains("redis-tls"), "{err}");
}
