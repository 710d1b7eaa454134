//! Backup attributes and how the two ends of a resilient connection learn each other's.
//!
//! To fail over, each end needs the peer's backup QP (its GID and QPN), the peer's control
//! QP and the ring its control messages are written into, and for every rkey the application
//! uses towards the peer, the rkey of the same memory on the peer's backup device; and the
//! control QP on its default device with its ring, which repairs a lost backup side
//! (`docs/failover.md` 5d). [`PeerAttrs`] is all of that for one end, with a byte format
//! (big-endian, version 4; version 3 ended at byte 68 with the rkey list):
//!
//! ```text
//!  0       4     5          8                 24      28                44      48      52
//!  +-------+-----+----------+-----------------+-------+-----------------+-------+-------+
//!  | "RSBK"| ver | c PSN    |   default GID   | d QPN |   backup GID    | b QPN | c QPN |
//!  +-------+-----+----------+-----------------+-------+-----------------+-------+-------+
//!  52                  60            64      68       72       76                  84
//!  +-------------------+-------------+-------+--------+--------+-------------------+
//!  | control ring addr | c ring rkey |   n   | dc QPN | dc PSN | dc ring addr      |
//!  +-------------------+-------------+-------+--------+--------+-------------------+
//!  84            88
//!  +-------------+----
//!  | dc ring rkey| n x (default rkey, backup rkey)
//!  +-------------+----
//! ```
//!
//! (`dc`: the control QP on the default device; its PSN is 24 bits in a 32-bit word.)
//!
//! Version 5 (written when the end has a management endpoint, `docs/failover.md` 5f) puts 60
//! bytes between byte 88 and the rkey list: the end's management address (16 bytes, an IPv4
//! one mapped into IPv6), its UDP port (2), two zero bytes, its connection id (8) and its
//! key (32). Version 4 is still read (no management endpoint).
//!
//! Two ways to exchange it:
//! - **inline** (the default): the application sends [`crate::resilient::ResilientQp::rendezvous_blob`]
//!   with its own connection attributes (its TCP exchange) and hands the peer's blob to
//!   [`crate::resilient::ResilientQp::connect_backup`]. Nothing else runs.
//! - **a key-value store** ([`Rendezvous`]; [`RedisRendezvous`] for clusters, as the paper uses
//!   Redis over the management network): the service lcore publishes each end's attributes
//!   under its default `(GID, QPN)` when the backup QP exists, and looks the peer's up by the
//!   peer's default `(GID, QPN)` (known from the application's RTR attributes) before it
//!   brings the backup QP up; backup rkeys are published per MR with remote access and looked
//!   up on demand when a failover meets an rkey it has not seen. Every Redis entry is sealed
//!   with the job's secret and checked when read (`auth`); where the attributes
//!   also came inline, the store's are cross-checked against them
//!   ([`Rendezvous::cross_check`]).
//!
//! Only MRs registered with remote access have their keys published: the set is the PD's, as
//! any QP of a PD can reach any of its MRs by rkey; a local-only MR's keys stay in the process.

pub(super) mod auth;
pub(super) mod error;

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Mutex;
use std::time::Duration;

use crate::verbs::{Access, Gid};
use auth::{Kind, RefusalCounts, RendezvousKey, Sealer};
pub use error::RendezvousError;

/// What one end of a resilient connection tells the other about its backup side.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PeerAttrs {
    /// The end's default device GID (identifies the end with `default_qpn`).
    pub default_gid: Gid,
    /// The end's default QP number.
    pub default_qpn: u32,
    /// The backup device's GID.
    pub backup_gid: Gid,
    /// The backup QP number.
    pub backup_qpn: u32,
    /// The control QP number (on the backup device).
    pub control_qpn: u32,
    /// The first PSN the control QP sends (24 bits, drawn at random per channel, so a stale
    /// packet of an earlier process with the same QPN is out of sequence for this one).
    pub control_psn: u32,
    /// Where the peer writes its control messages to this end: the address of the control
    /// ring on the backup device...
    pub control_ring_addr: u64,
    /// ... and its rkey there.
    pub control_ring_rkey: u32,
    /// The control QP on the default device (it repairs a lost backup side).
    pub default_control_qpn: u32,
    /// The first PSN that control QP sends (24 bits, random per channel).
    pub default_control_psn: u32,
    /// Where the peer writes its messages on the default device's channel: the ring's
    /// address...
    pub default_control_ring_addr: u64,
    /// ... and its rkey there.
    pub default_control_ring_rkey: u32,
    /// For each MR of the end's PD registered with remote access (read, write or atomic):
    /// (default rkey, backup rkey). A local-only MR's keys are never published.
    pub rkeys: Vec<(u32, u32)>,
    /// Where the end takes control messages over the management network, when it has an
    /// endpoint there (`docs/failover.md` 5f; version 5).
    pub management: Option<ManagementEndpoint>,
}

/// One end's endpoint on the management network: where to send, and what names and seals
/// each datagram for it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ManagementEndpoint {
    /// The end's UDP address on the management network.
    pub addr: SocketAddr,
    /// The end's connection id, named in each datagram for it.
    pub id: u64,
    /// The end's key, which seals each datagram for it (drawn at random per connection).
    pub key: [u8; MANAGEMENT_KEY_LEN],
}

/// The length of a management endpoint's key.
pub const MANAGEMENT_KEY_LEN: usize = 32;

impl std::fmt::Debug for ManagementEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key stays out of logs.
        f.debug_struct("ManagementEndpoint")
            .field("addr", &self.addr)
            .field("id", &format_args!("{:#x}", self.id))
            .finish_non_exhaustive()
    }
}

const MAGIC: u32 = 0x5253_424b; // "RSBK"
const VERSION: u8 = 4;
/// The version with a management endpoint.
const VERSION_MANAGEMENT: u8 = 5;
const HEADER: usize = 88;
/// The management endpoint's block of version 5.
const MANAGEMENT_BLOCK: usize = 60;

mod field {
    use core::ops::Range;
    pub const MAGIC: Range<usize> = 0..4;
    pub const VERSION: usize = 4;
    pub const CONTROL_PSN: Range<usize> = 5..8;
    pub const DEFAULT_GID: Range<usize> = 8..24;
    pub const DEFAULT_QPN: Range<usize> = 24..28;
    pub const BACKUP_GID: Range<usize> = 28..44;
    pub const BACKUP_QPN: Range<usize> = 44..48;
    pub const CONTROL_QPN: Range<usize> = 48..52;
    pub const CONTROL_RING_ADDR: Range<usize> = 52..60;
    pub const CONTROL_RING_RKEY: Range<usize> = 60..64;
    pub const COUNT: Range<usize> = 64..68;
    pub const DCONTROL_QPN: Range<usize> = 68..72;
    pub const DCONTROL_PSN: Range<usize> = 72..76;
    pub const DCONTROL_RING_ADDR: Range<usize> = 76..84;
    pub const DCONTROL_RING_RKEY: Range<usize> = 84..88;
    // Version 5's management block, from byte 88.
    pub const MGMT_ADDR: Range<usize> = 0..16;
    pub const MGMT_PORT: Range<usize> = 16..18;
    pub const MGMT_RESERVED: Range<usize> = 18..20;
    pub const MGMT_ID: Range<usize> = 20..28;
    pub const MGMT_KEY: Range<usize> = 28..60;
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn gid(b: &[u8]) -> Gid {
    let mut g = [0u8; 16];
    g.copy_from_slice(b);
    Gid(g)
}

impl PeerAttrs {
    /// The attributes as bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let block = if self.management.is_some() {
            MANAGEMENT_BLOCK
        } else {
            0
        };
        let rkeys_at = HEADER + block;
        let mut out = vec![0u8; rkeys_at + 8 * self.rkeys.len()];
        out[field::MAGIC].copy_from_slice(&MAGIC.to_be_bytes());
        out[field::VERSION] = VERSION;
        if let Some(m) = &self.management {
            out[field::VERSION] = VERSION_MANAGEMENT;
            let b = &mut out[HEADER..rkeys_at];
            let ip = match m.addr.ip() {
                IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                IpAddr::V6(v6) => v6,
            };
            b[field::MGMT_ADDR].copy_from_slice(&ip.octets());
            b[field::MGMT_PORT].copy_from_slice(&m.addr.port().to_be_bytes());
            b[field::MGMT_ID].copy_from_slice(&m.id.to_be_bytes());
            b[field::MGMT_KEY].copy_from_slice(&m.key);
        }
        out[field::CONTROL_PSN]
            .copy_from_slice(&(self.control_psn & 0x00ff_ffff).to_be_bytes()[1..]);
        out[field::DEFAULT_GID].copy_from_slice(&self.default_gid.0);
        out[field::DEFAULT_QPN].copy_from_slice(&self.default_qpn.to_be_bytes());
        out[field::BACKUP_GID].copy_from_slice(&self.backup_gid.0);
        out[field::BACKUP_QPN].copy_from_slice(&self.backup_qpn.to_be_bytes());
        out[field::CONTROL_QPN].copy_from_slice(&self.control_qpn.to_be_bytes());
        out[field::CONTROL_RING_ADDR].copy_from_slice(&self.control_ring_addr.to_be_bytes());
        out[field::CONTROL_RING_RKEY].copy_from_slice(&self.control_ring_rkey.to_be_bytes());
        out[field::COUNT].copy_from_slice(&(self.rkeys.len() as u32).to_be_bytes());
        out[field::DCONTROL_QPN].copy_from_slice(&self.default_control_qpn.to_be_bytes());
        out[field::DCONTROL_PSN]
            .copy_from_slice(&(self.default_control_psn & 0x00ff_ffff).to_be_bytes());
        out[field::DCONTROL_RING_ADDR]
            .copy_from_slice(&self.default_control_ring_addr.to_be_bytes());
        out[field::DCONTROL_RING_RKEY]
            .copy_from_slice(&self.default_control_ring_rkey.to_be_bytes());
        for (i, (default, backup)) in self.rkeys.iter().enumerate() {
            let at = rkeys_at + 8 * i;
            out[at..at + 4].copy_from_slice(&default.to_be_bytes());
            out[at + 4..at + 8].copy_from_slice(&backup.to_be_bytes());
        }
        out
    }

    /// Parses untrusted bytes (from the peer, or from the store).
    pub fn parse(bytes: &[u8]) -> Result<PeerAttrs, RendezvousError> {
        if bytes.len() < HEADER {
            return Err(RendezvousError::Truncated {
                len: bytes.len(),
                needed: HEADER,
            });
        }
        let magic = be32(&bytes[field::MAGIC]);
        if magic != MAGIC {
            return Err(RendezvousError::BadMagic(magic));
        }
        let rkeys_at = match bytes[field::VERSION] {
            VERSION => HEADER,
            VERSION_MANAGEMENT => HEADER + MANAGEMENT_BLOCK,
            other => return Err(RendezvousError::UnsupportedVersion(other)),
        };
        if bytes.len() < rkeys_at {
            return Err(RendezvousError::Truncated {
                len: bytes.len(),
                needed: rkeys_at,
            });
        }
        let management = if rkeys_at > HEADER {
            let b = &bytes[HEADER..rkeys_at];
            if b[field::MGMT_RESERVED] != [0, 0] {
                return Err(RendezvousError::BadField("management reserved bytes"));
            }
            let octets: [u8; 16] = b[field::MGMT_ADDR].try_into().expect("a 16-byte field");
            let v6 = Ipv6Addr::from(octets);
            let ip = v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4);
            let port =
                u16::from_be_bytes([b[field::MGMT_PORT.start], b[field::MGMT_PORT.start + 1]]);
            if port == 0 || ip.is_unspecified() {
                return Err(RendezvousError::BadField("management address"));
            }
            Some(ManagementEndpoint {
                addr: SocketAddr::new(ip, port),
                id: u64::from_be_bytes(b[field::MGMT_ID].try_into().expect("an 8-byte field")),
                key: b[field::MGMT_KEY].try_into().expect("a 32-byte field"),
            })
        } else {
            None
        };
        let psn = &bytes[field::CONTROL_PSN];
        let control_psn = u32::from_be_bytes([0, psn[0], psn[1], psn[2]]);
        let qpn = |r: core::ops::Range<usize>, name| {
            let v = be32(&bytes[r]);
            if v > 0x00ff_ffff {
                Err(RendezvousError::BadField(name))
            } else {
                Ok(v)
            }
        };
        let default_qpn = qpn(field::DEFAULT_QPN, "default QPN")?;
        let backup_qpn = qpn(field::BACKUP_QPN, "backup QPN")?;
        let control_qpn = qpn(field::CONTROL_QPN, "control QPN")?;
        let default_control_qpn = qpn(field::DCONTROL_QPN, "default control QPN")?;
        let default_control_psn = qpn(field::DCONTROL_PSN, "default control PSN")?;
        let count = be32(&bytes[field::COUNT]) as usize;
        let needed = count
            .checked_mul(8)
            .and_then(|n| n.checked_add(rkeys_at))
            .ok_or(RendezvousError::BadField("rkey count"))?;
        if bytes.len() != needed {
            return Err(if bytes.len() < needed {
                RendezvousError::Truncated {
                    len: bytes.len(),
                    needed,
                }
            } else {
                RendezvousError::BadField("trailing bytes after the rkey list")
            });
        }
        let rkeys = (0..count)
            .map(|i| {
                let at = rkeys_at + 8 * i;
                (be32(&bytes[at..at + 4]), be32(&bytes[at + 4..at + 8]))
            })
            .collect();
        Ok(PeerAttrs {
            default_gid: gid(&bytes[field::DEFAULT_GID]),
            default_qpn,
            backup_gid: gid(&bytes[field::BACKUP_GID]),
            backup_qpn,
            control_qpn,
            control_psn,
            control_ring_addr: u64::from_be_bytes(
                bytes[field::CONTROL_RING_ADDR]
                    .try_into()
                    .expect("an 8-byte field"),
            ),
            control_ring_rkey: be32(&bytes[field::CONTROL_RING_RKEY]),
            default_control_qpn,
            default_control_psn,
            default_control_ring_addr: u64::from_be_bytes(
                bytes[field::DCONTROL_RING_ADDR]
                    .try_into()
                    .expect("an 8-byte field"),
            ),
            default_control_ring_rkey: be32(&bytes[field::DCONTROL_RING_RKEY]),
            rkeys,
            management,
        })
    }
}

/// A key-value store the service lcore publishes backup attributes to and looks them up in.
/// Calls may block (a network round trip); only the service lcore makes them, except an
/// rkey lookup on a failover that meets an rkey no earlier lookup brought.
pub trait Rendezvous: Send + Sync {
    /// Publishes one end's attributes under its default `(GID, QPN)`.
    fn publish_qp(&self, attrs: &PeerAttrs) -> Result<(), RendezvousError>;
    /// The attributes of the end whose default QP is `(gid, qpn)`, if published yet.
    fn lookup_qp(&self, gid: Gid, qpn: u32) -> Result<Option<PeerAttrs>, RendezvousError>;
    /// Publishes that `default_rkey` of the device with default GID `gid` is `backup_rkey`
    /// on its backup device.
    fn publish_rkey(
        &self,
        gid: Gid,
        default_rkey: u32,
        backup_rkey: u32,
    ) -> Result<(), RendezvousError>;
    /// The backup rkey of `default_rkey` of the device with default GID `gid`, if published.
    fn lookup_rkey(&self, gid: Gid, default_rkey: u32) -> Result<Option<u32>, RendezvousError>;
    /// Withdraws the mapping of `default_rkey` (its MR was deregistered): later lookups find
    /// nothing, so a peer never maps a retransmission through it.
    fn withdraw_rkey(&self, gid: Gid, default_rkey: u32) -> Result<(), RendezvousError>;
    /// Entries this store refused so far, by reason (zero for a store that checks nothing).
    fn refusals(&self) -> RefusalCounts {
        RefusalCounts::default()
    }
    /// Counts a refusal found outside the store's own checks (the inline cross-check).
    fn note_refusal(&self, _error: &RendezvousError) {}
    /// Where the peer's attributes came inline and a store is configured too: checks what
    /// the store holds for the same end against them. A disagreement is refused (and
    /// counted); an entry not there, or a store that cannot answer, leaves the inline
    /// attributes in force (they are the application's own exchange).
    fn cross_check(&self, inline: &PeerAttrs) -> Result<(), RendezvousError> {
        let stored = match self.lookup_qp(inline.default_gid, inline.default_qpn) {
            Ok(Some(stored)) => stored,
            Ok(None) => return Ok(()),
            Err(e) => {
                tracing::warn!(error = %e, "rendezvous: the store's entry could not be cross-checked against the inline one; using the inline one");
                return Ok(());
            }
        };
        let mismatch =
            first_difference(inline, &stored).map(|field| RendezvousError::InlineMismatch {
                entry: format!("of QP {:#x} on {}", inline.default_qpn, inline.default_gid),
                field,
            });
        match mismatch {
            Some(e) => {
                self.note_refusal(&e);
                Err(e)
            }
            None => Ok(()),
        }
    }
}

/// The first field on which two ends' attributes disagree: every field but the rkey lists,
/// which may have been taken at different times; an rkey both lists carry must map alike.
fn first_difference(a: &PeerAttrs, b: &PeerAttrs) -> Option<&'static str> {
    let fields: [(&'static str, bool); 13] = [
        ("management endpoint", a.management == b.management),
        ("default GID", a.default_gid == b.default_gid),
        ("default QPN", a.default_qpn == b.default_qpn),
        ("backup GID", a.backup_gid == b.backup_gid),
        ("backup QPN", a.backup_qpn == b.backup_qpn),
        ("control QPN", a.control_qpn == b.control_qpn),
        ("control PSN", a.control_psn == b.control_psn),
        (
            "control ring address",
            a.control_ring_addr == b.control_ring_addr,
        ),
        (
            "control ring rkey",
            a.control_ring_rkey == b.control_ring_rkey,
        ),
        (
            "default control QPN",
            a.default_control_qpn == b.default_control_qpn,
        ),
        (
            "default control PSN",
            a.default_control_psn == b.default_control_psn,
        ),
        (
            "default control ring address",
            a.default_control_ring_addr == b.default_control_ring_addr,
        ),
        (
            "default control ring rkey",
            a.default_control_ring_rkey == b.default_control_ring_rkey,
        ),
    ];
    if let Some((name, _)) = fields.iter().find(|(_, same)| !same) {
        return Some(name);
    }
    let disagree = a
        .rkeys
        .iter()
        .any(|(d, backup)| b.rkeys.iter().any(|(d2, b2)| d == d2 && backup != b2));
    disagree.then_some("backup rkey of an MR")
}

/// Whether an MR registered with `access` is reachable by a peer, and so has a backup rkey
/// worth publishing. A local-only MR's keys never leave the process.
pub(crate) fn grants_remote_access(access: Access) -> bool {
    [
        Access::REMOTE_READ,
        Access::REMOTE_WRITE,
        Access::REMOTE_ATOMIC,
    ]
    .iter()
    .any(|a| access.contains(*a))
}

/// [`Rendezvous`] over Redis (the `redis` crate, synchronous, default features off).
///
/// Keys: `<prefix>:qp:<gid>:<qpn>` holds an end's [`PeerAttrs`] bytes; the hash
/// `<prefix>:rkey:<gid>` maps default rkeys (decimal) to backup rkeys, or to a withdrawal.
/// Every value is sealed with the job's secret (`auth`: HMAC-SHA256 over the
/// whole entry, its identity and its epoch), and every value read is checked before use: a
/// forged, altered, moved or replayed entry is an error naming it, counted in
/// [`Rendezvous::refusals`]. The URL may carry an ACL user and password
/// (`redis://user:password@host:port/`); errors and `Debug` show it with the password
/// redacted. Connections time out after `timeout`, so a store that went away makes a lookup
/// fail instead of hanging the service lcore.
pub struct RedisRendezvous {
    client: redis::Client,
    url: String,
    prefix: String,
    timeout: Duration,
    conn: Mutex<Option<redis::Connection>>,
    sealer: Sealer,
}

impl std::fmt::Debug for RedisRendezvous {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisRendezvous")
            .field("url", &self.url)
            .field("prefix", &self.prefix)
            .finish()
    }
}

/// `url` with the password of its user info, if any, replaced by `***`.
fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_string();
    };
    let userinfo = &rest[..at];
    let user = userinfo.split(':').next().unwrap_or("");
    let redacted = if userinfo.contains(':') {
        format!("{user}:***")
    } else {
        userinfo.to_string()
    };
    format!("{}{redacted}{}", &url[..scheme_end], &rest[at..])
}

impl RedisRendezvous {
    /// A store at `url` (`redis://[user:password@]host:port/`), keys under `prefix` (several
    /// jobs can share a server with different prefixes), entries sealed and checked with
    /// `key`, the job's secret both ends are given. Connects lazily.
    pub fn new(
        url: &str,
        prefix: &str,
        key: RendezvousKey,
    ) -> Result<RedisRendezvous, RendezvousError> {
        RedisRendezvous::build(url, prefix, key, redis::Client::open(url))
    }

    /// As [`RedisRendezvous::new`] over TLS (a `rediss://` URL), trusting the CA certificate
    /// `root_pem` (PEM) instead of the system's roots: a cluster's own CA. Needs pmd's
    /// `redis-tls` feature (rustls with ring; a plain `new` with a `rediss://` URL then trusts
    /// the system's roots).
    #[cfg(feature = "redis-tls")]
    pub fn new_tls(
        url: &str,
        prefix: &str,
        key: RendezvousKey,
        root_pem: &[u8],
    ) -> Result<RedisRendezvous, RendezvousError> {
        let certs = redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(root_pem.to_vec()),
        };
        RedisRendezvous::build(url, prefix, key, redis::Client::build_with_tls(url, certs))
    }

    fn build(
        url: &str,
        prefix: &str,
        key: RendezvousKey,
        client: redis::RedisResult<redis::Client>,
    ) -> Result<RedisRendezvous, RendezvousError> {
        let store_error = |reason: String| RendezvousError::Store {
            store: redact(url),
            reason,
        };
        if cfg!(not(feature = "redis-tls")) && url.starts_with("rediss://") {
            return Err(store_error(
                "TLS (rediss://) needs pmd built with its redis-tls feature".into(),
            ));
        }
        #[cfg(feature = "redis-tls")]
        {
            // One crypto provider for the process (ring); an earlier install stays.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let client = client.map_err(|e| store_error(e.to_string()))?;
        Ok(RedisRendezvous {
            client,
            url: redact(url),
            prefix: prefix.to_string(),
            timeout: Duration::from_secs(1),
            conn: Mutex::new(None),
            sealer: Sealer::new(key, prefix),
        })
    }

    /// As [`RedisRendezvous::new`] with the secret in the file `RAILSHIFT_RENDEZVOUS_KEY_FILE`
    /// names. Without the variable: [`RendezvousError::NoSecret`]. There is no unauthenticated
    /// Redis rendezvous: whoever can write the store could redirect a connection's failover.
    pub fn from_env(url: &str, prefix: &str) -> Result<RedisRendezvous, RendezvousError> {
        let key = RendezvousKey::from_env()?.ok_or(RendezvousError::NoSecret)?;
        RedisRendezvous::new(url, prefix, key)
    }

    fn store_error(&self, e: redis::RedisError) -> RendezvousError {
        let reason = if e.kind() == redis::ErrorKind::AuthenticationFailed {
            format!("authentication failed (AUTH/ACL user and password in the URL): {e}")
        } else {
            e.to_string()
        };
        RendezvousError::Store {
            store: self.url.clone(),
            reason,
        }
    }

    /// Runs `cmd` on the (re)connected connection; a failed command drops the connection so
    /// the next call reconnects.
    fn run<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, RendezvousError> {
        let mut guard = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            let conn = self
                .client
                .get_connection_with_timeout(self.timeout)
                .map_err(|e| self.store_error(e))?;
            conn.set_read_timeout(Some(self.timeout))
                .and_then(|_| conn.set_write_timeout(Some(self.timeout)))
                .map_err(|e| self.store_error(e))?;
            *guard = Some(conn);
        }
        let conn = guard.as_mut().expect("connected above");
        let result = cmd.query::<T>(conn);
        if result.is_err() {
            *guard = None;
        }
        result.map_err(|e| self.store_error(e))
    }

    fn qp_key(&self, gid: Gid, qpn: u32) -> String {
        format!("{}:qp:{gid}:{qpn}", self.prefix)
    }

    fn rkey_key(&self, gid: Gid) -> String {
        format!("{}:rkey:{gid}", self.prefix)
    }

    fn set_rkey_entry(
        &self,
        gid: Gid,
        default_rkey: u32,
        entry: Vec<u8>,
    ) -> Result<(), RendezvousError> {
        let mut cmd = redis::cmd("HSET");
        cmd.arg(self.rkey_key(gid)).arg(default_rkey).arg(entry);
        self.run::<()>(&cmd)
    }
}

impl Rendezvous for RedisRendezvous {
    fn publish_qp(&self, attrs: &PeerAttrs) -> Result<(), RendezvousError> {
        let entry = self.sealer.seal(
            Kind::Attrs,
            attrs.default_gid,
            attrs.default_qpn,
            &attrs.to_bytes(),
        );
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.qp_key(attrs.default_gid, attrs.default_qpn))
            .arg(entry);
        self.run::<()>(&cmd)
    }

    fn lookup_qp(&self, gid: Gid, qpn: u32) -> Result<Option<PeerAttrs>, RendezvousError> {
        let key = self.qp_key(gid, qpn);
        let mut cmd = redis::cmd("GET");
        cmd.arg(&key);
        let Some(bytes) = self.run::<Option<Vec<u8>>>(&cmd)? else {
            return Ok(None);
        };
        let opened = self.sealer.open(&key, &bytes, (Kind::Attrs, gid, qpn))?;
        let attrs = PeerAttrs::parse(&opened.body)?;
        if (attrs.default_gid, attrs.default_qpn) != (gid, qpn) {
            // Sealed for (gid, qpn) but holding another end's attributes: a publisher bug or
            // a secret holder lying; either way not this connection's.
            let e = RendezvousError::WrongEntry {
                entry: key,
                found: format!(
                    "the attributes of QP {:#x} on {}",
                    attrs.default_qpn, attrs.default_gid
                ),
            };
            self.sealer.refusals.count(&e);
            return Err(e);
        }
        Ok(Some(attrs))
    }

    fn publish_rkey(
        &self,
        gid: Gid,
        default_rkey: u32,
        backup_rkey: u32,
    ) -> Result<(), RendezvousError> {
        let entry = self
            .sealer
            .seal(Kind::Rkey, gid, default_rkey, &backup_rkey.to_be_bytes());
        self.set_rkey_entry(gid, default_rkey, entry)
    }

    fn lookup_rkey(&self, gid: Gid, default_rkey: u32) -> Result<Option<u32>, RendezvousError> {
        let key = self.rkey_key(gid);
        let mut cmd = redis::cmd("HGET");
        cmd.arg(&key).arg(default_rkey);
        let Some(bytes) = self.run::<Option<Vec<u8>>>(&cmd)? else {
            return Ok(None);
        };
        let entry = format!("{key} field {default_rkey}");
        let opened = self
            .sealer
            .open(&entry, &bytes, (Kind::Rkey, gid, default_rkey))?;
        match (opened.kind, opened.body.as_slice()) {
            (Kind::Withdrawn, []) => Ok(None),
            (Kind::Rkey, [a, b, c, d]) => Ok(Some(u32::from_be_bytes([*a, *b, *c, *d]))),
            _ => Err(RendezvousError::BadField("rkey entry body")),
        }
    }

    /// Writes a withdrawal (sealed, at a newer epoch) over the mapping rather than deleting
    /// it: a reader that saw the withdrawal refuses the old mapping if it is written back.
    fn withdraw_rkey(&self, gid: Gid, default_rkey: u32) -> Result<(), RendezvousError> {
        let entry = self.sealer.seal(Kind::Withdrawn, gid, default_rkey, &[]);
        self.set_rkey_entry(gid, default_rkey, entry)
    }

    fn refusals(&self) -> RefusalCounts {
        self.sealer.refusals.snapshot()
    }

    fn note_refusal(&self, error: &RendezvousError) {
        self.sealer.refusals.count(error);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn sample() -> PeerAttrs {
        PeerAttrs {
            default_gid: Gid::from(Ipv4Addr::new(198, 18, 0, 1)),
            default_qpn: 0x11,
            backup_gid: Gid::from(Ipv4Addr::new(198, 18, 1, 1)),
            backup_qpn: 0x12,
            control_qpn: 0x13,
            control_psn: 0xab_cdef,
            control_ring_addr: 0x7f00_1234_5000,
            control_ring_rkey: 0x77,
            default_control_qpn: 0x14,
            default_control_psn: 0x12_3456,
            default_control_ring_addr: 0x7f00_1234_6000,
            default_control_ring_rkey: 0x78,
            rkeys: vec![(0x100, 0x200), (0x101, 0x2ff)],
            management: None,
        }
    }

    #[test]
    fn a_management_endpoint_is_written_as_version_5_and_read_back() {
        for addr in ["198.18.100.1:40123", "[fd00::1]:7"] {
            let attrs = PeerAttrs {
                management: Some(ManagementEndpoint {
                    addr: addr.parse().unwrap(),
                    id: 0x0123_4567_89ab_cdef,
                    key: [0x5a; MANAGEMENT_KEY_LEN],
                }),
                ..sample()
            };
            let bytes = attrs.to_bytes();
            assert_eq!(bytes.len(), 88 + 60 + 16);
            assert_eq!(bytes[4], 5);
            assert_eq!(PeerAttrs::parse(&bytes).unwrap(), attrs);
            // The rkeys follow the block.
            assert_eq!(&bytes[148..156], &[0, 0, 1, 0, 0, 0, 2, 0]);
            // A truncated block is refused, not read past.
            assert!(PeerAttrs::parse(&bytes[..100]).is_err());
        }
        // Version 4 is still written without one, and read.
        let old = sample().to_bytes();
        assert_eq!(old[4], 4);
        assert_eq!(PeerAttrs::parse(&old).unwrap(), sample());
    }

    #[test]
    fn a_management_endpoint_without_an_address_is_refused() {
        let attrs = PeerAttrs {
            management: Some(ManagementEndpoint {
                addr: "0.0.0.0:0".parse().unwrap(),
                id: 1,
                key: [1; MANAGEMENT_KEY_LEN],
            }),
            ..sample()
        };
        assert!(matches!(
            PeerAttrs::parse(&attrs.to_bytes()),
            Err(RendezvousError::BadField("management address"))
        ));
    }

    #[test]
    fn attributes_are_written_as_the_format_says() {
        let bytes = sample().to_bytes();
        assert_eq!(bytes.len(), 88 + 16);
        assert_eq!(&bytes[0..8], b"RSBK\x04\xab\xcd\xef");
        assert_eq!(
            &bytes[8..24],
            &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 18, 0, 1]
        );
        assert_eq!(&bytes[24..28], &[0, 0, 0, 0x11]);
        assert_eq!(&bytes[44..52], &[0, 0, 0, 0x12, 0, 0, 0, 0x13]);
        assert_eq!(&bytes[52..60], &[0, 0, 0x7f, 0, 0x12, 0x34, 0x50, 0]);
        assert_eq!(&bytes[60..68], &[0, 0, 0, 0x77, 0, 0, 0, 2]);
        assert_eq!(&bytes[68..76], &[0, 0, 0, 0x14, 0, 0x12, 0x34, 0x56]);
        assert_eq!(&bytes[76..84], &[0, 0, 0x7f, 0, 0x12, 0x34, 0x60, 0]);
        assert_eq!(&bytes[84..88], &[0, 0, 0, 0x78]);
        assert_eq!(&bytes[88..96], &[0, 0, 1, 0, 0, 0, 2, 0]);
    }

    #[test]
    fn attributes_round_trip() {
        assert_eq!(PeerAttrs::parse(&sample().to_bytes()), Ok(sample()));
    }

    #[test]
    fn bad_bytes_are_refused_by_name() {
        let good = sample().to_bytes();
        assert!(matches!(
            PeerAttrs::parse(&good[..40]),
            Err(RendezvousError::Truncated { len: 40, .. })
        ));
        assert!(matches!(
            PeerAttrs::parse(&good[..92]),
            Err(RendezvousError::Truncated { needed: 104, .. })
        ));
        let mut bad = good.clone();
        bad[0] = b'X';
        assert!(matches!(
            PeerAttrs::parse(&bad),
            Err(RendezvousError::BadMagic(_))
        ));
        let mut bad = good.clone();
        bad[4] = 1;
        assert_eq!(
            PeerAttrs::parse(&bad),
            Err(RendezvousError::UnsupportedVersion(1))
        );
        let mut bad = good.clone();
        bad[44] = 1;
        assert_eq!(
            PeerAttrs::parse(&bad),
            Err(RendezvousError::BadField("backup QPN"))
        );
        let mut bad = good.clone();
        bad.push(0);
        assert!(matches!(
            PeerAttrs::parse(&bad),
            Err(RendezvousError::BadField(_))
        ));
        let mut bad = good;
        bad[64..68].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(PeerAttrs::parse(&bad).is_err());
    }
}
