//! What a deregistration on both devices of a protected PD reports (a leaf: the context
//! and the lease table both use it).

use crate::provider::VerbsError;

/// A deregistration on a protected PD that a device refused. Each refusing device may still
/// reach the memory; the keys left the failover's mappings either way.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("deregistration refused: {}", self.describe())]
pub struct DeregisterError {
    /// What the default device said, if it refused.
    pub default: Option<Box<VerbsError>>,
    /// What the backup device said, if it refused.
    pub backup: Option<Box<VerbsError>>,
}

impl DeregisterError {
    /// `Ok` when both devices agreed, else which refused.
    pub(crate) fn check(
        default: Result<(), VerbsError>,
        backup: Result<(), VerbsError>,
    ) -> Result<(), DeregisterError> {
        match (default, backup) {
            (Ok(()), Ok(())) => Ok(()),
            (d, b) => Err(DeregisterError {
                default: d.err().map(Box::new),
                backup: b.err().map(Box::new),
            }),
        }
    }

    fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(e) = &self.default {
            parts.push(format!("default device: {e}"));
        }
        if let Some(e) = &self.backup {
            parts.push(format!("backup device: {e}"));
        }
        parts.join("; ")
    }
}
