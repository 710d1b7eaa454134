//! Why backup attributes could not be parsed, published or looked up: the words
//! `rendezvous` (the format and the stores) and `rendezvous::auth` (sealed store entries) share.

/// Why attributes could not be parsed, published or looked up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RendezvousError {
    /// Fewer bytes than the format needs.
    #[error("backup attributes truncated: {len} bytes, {needed} needed")]
    Truncated {
        /// Bytes given.
        len: usize,
        /// Bytes the header (or the header and its rkey list) needs.
        needed: usize,
    },
    /// Not backup attributes.
    #[error("not railshift backup attributes (magic {0:#010x})")]
    BadMagic(u32),
    /// A version this build does not read.
    #[error("backup attributes version {0} is not supported (this build reads 3)")]
    UnsupportedVersion(u8),
    /// A field holds a value the format does not allow.
    #[error("backup attributes: bad {0}")]
    BadField(&'static str),
    /// The key-value store failed.
    #[error("rendezvous store {store}: {reason}")]
    Store {
        /// Which store (its address, password redacted).
        store: String,
        /// What went wrong.
        reason: String,
    },
    /// A Redis rendezvous was asked for without the per-job secret.
    #[error("the Redis rendezvous needs the job's secret: set RAILSHIFT_RENDEZVOUS_KEY_FILE to a file holding it (docs/security.md); refusing to publish or trust unauthenticated entries")]
    NoSecret,
    /// The per-job secret could not be used.
    #[error("rendezvous secret: {0}")]
    Secret(String),
    /// A store entry not in the sealed format: no MAC to check.
    #[error("rendezvous entry {entry} carries no MAC (written without the job's secret, or by an older build): refused")]
    MissingMac {
        /// The entry (its store key).
        entry: String,
    },
    /// A store entry whose MAC does not verify.
    #[error("rendezvous entry {entry}: bad MAC (forged, altered, or sealed with another job's secret): refused")]
    BadMac {
        /// The entry (its store key).
        entry: String,
    },
    /// An authentic entry older than one already seen for the same identity.
    #[error("rendezvous entry {entry}: stale epoch {epoch}, older than {seen} already seen (a replay): refused")]
    StaleEpoch {
        /// The entry (its store key).
        entry: String,
        /// The entry's epoch.
        epoch: u64,
        /// The newest epoch seen for it.
        seen: u64,
    },
    /// An authentic entry of another connection or rkey than the one looked up.
    #[error("rendezvous entry {entry} holds {found}: another connection's entry, refused")]
    WrongEntry {
        /// The entry (its store key).
        entry: String,
        /// Whose entry it is.
        found: String,
    },
    /// What the store holds disagrees with what the inline exchange said.
    #[error("rendezvous entry {entry} disagrees with the inline exchange on the {field}: refused")]
    InlineMismatch {
        /// The entry.
        entry: String,
        /// The first field that differs.
        field: &'static str,
    },
}

impl RendezvousError {
    /// Whether this is an entry refused by the checks of `auth` (or the inline
    /// cross-check), as opposed to a store that could not be reached: a refused entry is
    /// never used, and no cached value stands in for it.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            RendezvousError::MissingMac { .. }
                | RendezvousError::BadMac { .. }
                | RendezvousError::StaleEpoch { .. }
                | RendezvousError::WrongEntry { .. }
                | RendezvousError::InlineMismatch { .. }
        )
    }
}
