//! Authenticated rendezvous entries: what [`super::RedisRendezvous`] writes to the store is
//! sealed with HMAC-SHA256 under a per-job secret both ends are given, so that whoever can
//! write the store but does not hold the secret cannot forge, alter, move or roll back an
//! entry unnoticed (`docs/security.md`).
//!
//! An entry (big-endian, version 1):
//!
//! ```text
//!  0       4     5      6       8             16              32      36      40
//!  +-------+-----+------+-------+-------------+---------------+-------+-------+------+-----------+
//!  | "RSRV"| ver | kind | 0   0 |    epoch    | publisher GID | ident |   n   | body | HMAC (32) |
//!  +-------+-----+------+-------+-------------+---------------+-------+-------+------+-----------+
//! ```
//!
//! - kind 1, an end's backup attributes: `ident` is its default QPN, the body its
//!   [`PeerAttrs`](super::PeerAttrs) bytes (version 4);
//! - kind 2, an rkey mapping: `ident` is the default rkey, the body the backup rkey (4 bytes);
//! - kind 3, an rkey withdrawn (its MR was deregistered): `ident` is the default rkey, no body.
//!
//! The MAC is HMAC-SHA256 over `"railshift rendezvous v1\0"`, the key prefix (its length as 4
//! bytes, then its bytes) and every byte of the entry before the MAC: the publisher's identity
//! (GID and QPN, or GID and rkey), the kind and the epoch are all covered. A reader checks, in
//! order: the magic (else the entry carries no MAC), the MAC in constant time (else forged,
//! altered, or sealed with another secret), the identity against the one it asked for (else
//! another connection's entry, moved), and the epoch against the newest it has seen for that
//! identity (else a replay of an older entry). Each refusal is an error naming the entry and is
//! counted ([`RefusalCounts`]).
//!
//! The epoch is the publisher's wall clock in nanoseconds, strictly increasing within a
//! process; a withdrawal is written as a kind-3 entry with a newer epoch instead of deleting the
//! field, so a reader that saw the withdrawal refuses the old mapping when it is written back.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::error::RendezvousError;
use crate::verbs::Gid;

/// The environment variable naming the file that holds the per-job rendezvous secret.
pub const KEY_FILE_VAR: &str = "RAILSHIFT_RENDEZVOUS_KEY_FILE";

/// The fewest bytes a secret may have (HMAC-SHA256 wants 32 random bytes; 16 is the floor).
pub const MIN_KEY_LEN: usize = 16;

const MAGIC: u32 = 0x5253_5256; // "RSRV"
const VERSION: u8 = 1;
const HEADER: usize = 40;
const MAC_LEN: usize = 32;
const DOMAIN: &[u8] = b"railshift rendezvous v1\0";

mod field {
    use core::ops::Range;
    pub const MAGIC: Range<usize> = 0..4;
    pub const VERSION: usize = 4;
    pub const KIND: usize = 5;
    pub const RESERVED: Range<usize> = 6..8;
    pub const EPOCH: Range<usize> = 8..16;
    pub const GID: Range<usize> = 16..32;
    pub const IDENT: Range<usize> = 32..36;
    pub const LEN: Range<usize> = 36..40;
}

/// The per-job secret entries are sealed with. Its bytes never appear in `Debug` output.
#[derive(Clone, PartialEq, Eq)]
pub struct RendezvousKey(Vec<u8>);

impl std::fmt::Debug for RendezvousKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RendezvousKey({} bytes)", self.0.len())
    }
}

impl RendezvousKey {
    /// A secret of at least [`MIN_KEY_LEN`] bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<RendezvousKey, RendezvousError> {
        if bytes.len() < MIN_KEY_LEN {
            return Err(RendezvousError::Secret(format!(
                "{} bytes, at least {MIN_KEY_LEN} needed (32 random bytes recommended)",
                bytes.len()
            )));
        }
        Ok(RendezvousKey(bytes.to_vec()))
    }

    /// The secret in the file at `path`: its bytes, trailing whitespace dropped (so a key
    /// written as one line of base64 or hex works). The file must not be readable by group or
    /// others, as ssh requires of a private key.
    pub fn from_file(path: &Path) -> Result<RendezvousKey, RendezvousError> {
        let named = |e: &dyn std::fmt::Display| {
            RendezvousError::Secret(format!("key file {}: {e}", path.display()))
        };
        let meta = std::fs::metadata(path).map_err(|e| named(&e))?;
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = meta.permissions().mode();
            if mode & 0o077 != 0 {
                return Err(named(&format_args!(
                    "mode {:o} lets group or others read it; chmod 600",
                    mode & 0o777
                )));
            }
        }
        let bytes = std::fs::read(path).map_err(|e| named(&e))?;
        let end = bytes
            .iter()
            .rposition(|b| !b.is_ascii_whitespace())
            .map_or(0, |i| i + 1);
        RendezvousKey::from_bytes(&bytes[..end]).map_err(|e| named(&e))
    }

    /// The secret in the file [`KEY_FILE_VAR`] names; `None` when the variable is unset.
    pub fn from_env() -> Result<Option<RendezvousKey>, RendezvousError> {
        match std::env::var_os(KEY_FILE_VAR) {
            Some(path) if !path.is_empty() => RendezvousKey::from_file(Path::new(&path)).map(Some),
            _ => Ok(None),
        }
    }

    fn mac(&self, prefix: &str) -> Hmac<Sha256> {
        let mut mac =
            <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(DOMAIN);
        mac.update(&(prefix.len() as u32).to_be_bytes());
        mac.update(prefix.as_bytes());
        mac
    }
}

/// What an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// An end's backup attributes; the identity is its default QPN.
    Attrs = 1,
    /// An rkey's backup rkey; the identity is the default rkey.
    Rkey = 2,
    /// An rkey withdrawn; the identity is the default rkey.
    Withdrawn = 3,
}

impl Kind {
    /// Mappings and withdrawals of one rkey share an epoch sequence.
    fn class(self) -> u8 {
        match self {
            Kind::Attrs => 1,
            Kind::Rkey | Kind::Withdrawn => 2,
        }
    }

    fn from_u8(v: u8) -> Option<Kind> {
        match v {
            1 => Some(Kind::Attrs),
            2 => Some(Kind::Rkey),
            3 => Some(Kind::Withdrawn),
            _ => None,
        }
    }

    fn describe(self, gid: Gid, ident: u32) -> String {
        match self {
            Kind::Attrs => format!("the backup attributes of QP {ident:#x} on {gid}"),
            Kind::Rkey => format!("the mapping of rkey {ident:#x} on {gid}"),
            Kind::Withdrawn => format!("the withdrawal of rkey {ident:#x} on {gid}"),
        }
    }
}

/// An entry that passed every check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Opened {
    pub kind: Kind,
    pub body: Vec<u8>,
}

/// How many store entries were refused, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RefusalCounts {
    /// Entries without a MAC (not in the sealed format).
    pub missing_mac: u64,
    /// Entries whose MAC did not verify: forged, altered, or sealed with another secret.
    pub bad_mac: u64,
    /// Authentic entries older than one already seen for the same identity: replays.
    pub stale_epoch: u64,
    /// Authentic entries of another connection or rkey than the one looked up: moved.
    pub wrong_entry: u64,
    /// Authentic entries that disagree with what the inline exchange said.
    pub inline_mismatch: u64,
}

impl RefusalCounts {
    /// Every refusal.
    pub fn total(&self) -> u64 {
        self.missing_mac + self.bad_mac + self.stale_epoch + self.wrong_entry + self.inline_mismatch
    }
}

/// The counters behind [`RefusalCounts`].
#[derive(Debug, Default)]
pub(crate) struct Refusals {
    missing_mac: AtomicU64,
    bad_mac: AtomicU64,
    stale_epoch: AtomicU64,
    wrong_entry: AtomicU64,
    inline_mismatch: AtomicU64,
}

impl Refusals {
    /// Counts `e` if it is a refusal, and logs it.
    pub fn count(&self, e: &RendezvousError) {
        let counter = match e {
            RendezvousError::MissingMac { .. } => &self.missing_mac,
            RendezvousError::BadMac { .. } => &self.bad_mac,
            RendezvousError::StaleEpoch { .. } => &self.stale_epoch,
            RendezvousError::WrongEntry { .. } => &self.wrong_entry,
            RendezvousError::InlineMismatch { .. } => &self.inline_mismatch,
            _ => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(error = %e, "rendezvous: store entry refused");
    }

    pub fn snapshot(&self) -> RefusalCounts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        RefusalCounts {
            missing_mac: get(&self.missing_mac),
            bad_mac: get(&self.bad_mac),
            stale_epoch: get(&self.stale_epoch),
            wrong_entry: get(&self.wrong_entry),
            inline_mismatch: get(&self.inline_mismatch),
        }
    }
}

/// The next epoch of this process: its wall clock in nanoseconds, and always above the last.
fn next_epoch() -> u64 {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let prev = LAST
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |last| {
            Some(now.max(last + 1))
        })
        .expect("the closure always answers");
    now.max(prev + 1)
}

/// Seals and opens entries for one store (one key, one prefix), and remembers the newest
/// epoch seen per identity.
#[derive(Debug)]
pub(crate) struct Sealer {
    key: RendezvousKey,
    prefix: String,
    newest: Mutex<HashMap<(u8, Gid, u32), u64>>,
    pub refusals: Refusals,
}

impl Sealer {
    pub fn new(key: RendezvousKey, prefix: &str) -> Sealer {
        Sealer {
            key,
            prefix: prefix.to_string(),
            newest: Mutex::new(HashMap::new()),
            refusals: Refusals::default(),
        }
    }

    /// The sealed entry of `kind` for `(gid, ident)` holding `body`, at a new epoch.
    pub fn seal(&self, kind: Kind, gid: Gid, ident: u32, body: &[u8]) -> Vec<u8> {
        seal_at(
            &self.key,
            &self.prefix,
            next_epoch(),
            kind,
            gid,
            ident,
            body,
        )
    }

    /// Checks an entry read from the store at `entry` (its key, for errors) that should be
    /// `want`: a kind (or its class) and the identity `(gid, ident)`. A refusal is counted.
    pub fn open(
        &self,
        entry: &str,
        bytes: &[u8],
        want: (Kind, Gid, u32),
    ) -> Result<Opened, RendezvousError> {
        let opened = self.check(entry, bytes, want);
        if let Err(e) = &opened {
            self.refusals.count(e);
        }
        opened
    }

    fn check(
        &self,
        entry: &str,
        bytes: &[u8],
        (class_of, gid, ident): (Kind, Gid, u32),
    ) -> Result<Opened, RendezvousError> {
        let entry = entry.to_string();
        if bytes.len() < HEADER + MAC_LEN || bytes[field::MAGIC] != MAGIC.to_be_bytes() {
            return Err(RendezvousError::MissingMac { entry });
        }
        let (sealed, tag) = bytes.split_at(bytes.len() - MAC_LEN);
        let mut mac = self.key.mac(&self.prefix);
        mac.update(sealed);
        if mac.verify_slice(tag).is_err() {
            return Err(RendezvousError::BadMac { entry });
        }
        // Authentic from here on: written by a holder of the job's secret.
        let be32 = |r: core::ops::Range<usize>| {
            u32::from_be_bytes(sealed[r].try_into().expect("a 4-byte field"))
        };
        let kind = Kind::from_u8(sealed[field::KIND]);
        if sealed[field::VERSION] != VERSION
            || sealed[field::RESERVED] != [0, 0]
            || kind.is_none()
            || be32(field::LEN) as usize != sealed.len() - HEADER
        {
            return Err(RendezvousError::BadField("sealed entry header"));
        }
        let kind = kind.expect("checked above");
        let found_gid = Gid(sealed[field::GID].try_into().expect("a 16-byte field"));
        let found_ident = be32(field::IDENT);
        if kind.class() != class_of.class() || found_gid != gid || found_ident != ident {
            return Err(RendezvousError::WrongEntry {
                entry,
                found: kind.describe(found_gid, found_ident),
            });
        }
        let epoch = u64::from_be_bytes(sealed[field::EPOCH].try_into().expect("8 bytes"));
        let mut newest = self.newest.lock().unwrap_or_else(|p| p.into_inner());
        let seen = newest.entry((kind.class(), gid, ident)).or_insert(0);
        if epoch < *seen {
            return Err(RendezvousError::StaleEpoch {
                entry,
                epoch,
                seen: *seen,
            });
        }
        *seen = epoch;
        Ok(Opened {
            kind,
            body: sealed[HEADER..].to_vec(),
        })
    }
}

fn seal_at(
    key: &RendezvousKey,
    prefix: &str,
    epoch: u64,
    kind: Kind,
    gid: Gid,
    ident: u32,
    body: &[u8],
) -> Vec<u8> {
    let mut out = vec![0u8; HEADER];
    out[field::MAGIC].copy_from_slice(&MAGIC.to_be_bytes());
    out[field::VERSION] = VERSION;
    out[field::KIND] = kind as u8;
    out[field::EPOCH].copy_from_slice(&epoch.to_be_bytes());
    out[field::GID].copy_from_slice(&gid.0);
    out[field::IDENT].copy_from_slice(&ident.to_be_bytes());
    out[field::LEN].copy_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
    let mut mac = key.mac(prefix);
    mac.update(&out);
    out.extend_from_slice(&mac.finalize().into_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn key(b: u8) -> RendezvousKey {
        RendezvousKey::from_bytes(&[b; 32]).unwrap()
    }

    fn gid() -> Gid {
        Gid::from(Ipv4Addr::new(198, 18, 0, 1))
    }

    #[test]
    fn an_entry_is_written_as_the_format_says() {
        let bytes = seal_at(
            &key(7),
            "job",
            0x0102,
            Kind::Rkey,
            gid(),
            0x300,
            &[0, 0, 0x4a, 0xbc],
        );
        assert_eq!(bytes.len(), 40 + 4 + 32);
        assert_eq!(&bytes[0..8], b"RSRV\x01\x02\0\0");
        assert_eq!(&bytes[8..16], &[0, 0, 0, 0, 0, 0, 1, 2]);
        assert_eq!(&bytes[16..32], &gid().0);
        assert_eq!(&bytes[32..44], &[0, 0, 3, 0, 0, 0, 0, 4, 0, 0, 0x4a, 0xbc]);
        // The MAC, recomputed from its definition.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&[7; 32]).unwrap();
        mac.update(b"railshift rendezvous v1\0\0\0\0\x03job");
        mac.update(&bytes[..44]);
        assert_eq!(&bytes[44..], &mac.finalize().into_bytes()[..]);
    }

    #[test]
    fn each_tampering_is_refused_by_name_and_counted() {
        let s = Sealer::new(key(7), "job");
        let good = s.seal(Kind::Attrs, gid(), 0x11, b"attributes");
        let open = |bytes: &[u8], ident| s.open("e", bytes, (Kind::Attrs, gid(), ident));
        assert_eq!(open(&good, 0x11).unwrap().body, b"attributes");
        assert!(matches!(
            open(b"RSBK\x03", 0x11),
            Err(RendezvousError::MissingMac { .. })
        ));
        for at in [5, 9, 20, 33, 41, good.len() - 1] {
            let mut bad = good.clone();
            bad[at] ^= 1;
            assert!(
                matches!(open(&bad, 0x11), Err(RendezvousError::BadMac { .. })),
                "{at}"
            );
        }
        let forged = seal_at(&key(8), "job", u64::MAX, Kind::Attrs, gid(), 0x11, b"x");
        assert!(matches!(
            open(&forged, 0x11),
            Err(RendezvousError::BadMac { .. })
        ));
        let other_prefix = Sealer::new(key(7), "job2").seal(Kind::Attrs, gid(), 0x11, b"x");
        assert!(matches!(
            open(&other_prefix, 0x11),
            Err(RendezvousError::BadMac { .. })
        ));
        assert!(matches!(
            open(&good, 0x12),
            Err(RendezvousError::WrongEntry { .. })
        ));
        let newer = s.seal(Kind::Attrs, gid(), 0x11, b"attributes again");
        assert!(open(&newer, 0x11).is_ok());
        assert!(matches!(
            open(&good, 0x11),
            Err(RendezvousError::StaleEpoch { .. })
        ));
        assert_eq!(
            s.refusals.snapshot(),
            RefusalCounts {
                missing_mac: 1,
                bad_mac: 8,
                stale_epoch: 1,
                wrong_entry: 1,
                inline_mismatch: 0,
            }
        );
    }

    #[test]
    fn a_secret_too_short_or_in_a_readable_file_is_refused() {
        assert!(RendezvousKey::from_bytes(&[1; 15]).is_err());
        let path = std::env::temp_dir().join(format!("railshift-key-{}", std::process::id()));
        std::fs::write(&path, b"0123456789abcdef0123456789abcdef\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = RendezvousKey::from_file(&path).unwrap_err().to_string();
        assert!(err.contains("chmod 600"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let got = RendezvousKey::from_file(&path).unwrap();
        assert_eq!(
            got,
            RendezvousKey::from_bytes(b"0123456789abcdef0123456789abcdef").unwrap()
        );
        assert_eq!(format!("{got:?}"), "RendezvousKey(32 bytes)");
        std::fs::remove_file(&path).unwrap();
    }
}
