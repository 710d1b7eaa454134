//! Protection domains and the memory-region table: lkeys, rkeys, bounds and access checks.

use thiserror::Error;

/// Access flags of an MR or a QP, with the values of `ibv_access_flags`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Access(pub u32);

impl Access {
    /// No access beyond local read.
    pub const NONE: Access = Access(0);
    /// The device may write the memory for local operations (receives, READ responses).
    pub const LOCAL_WRITE: Access = Access(1);
    /// A peer may RDMA WRITE it.
    pub const REMOTE_WRITE: Access = Access(2);
    /// A peer may RDMA READ it.
    pub const REMOTE_READ: Access = Access(4);
    /// A peer may run atomics on it.
    pub const REMOTE_ATOMIC: Access = Access(8);
    /// Everything.
    pub const ALL: Access = Access(15);

    /// Whether every flag of `other` is set here.
    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

/// A protection domain handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PdId(pub u32);

/// A registered memory region.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mr {
    pub pd: PdId,
    pub addr: u64,
    pub len: u64,
    pub access: Access,
    pub key: u32,
}

/// Why a key did not give access to a range.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum KeyError {
    /// No MR has this key (never registered, deregistered, or a stale variant).
    #[error("key {0:#x} is not registered")]
    Unknown(u32),
    /// The MR belongs to another protection domain.
    #[error("key {0:#x} belongs to another protection domain")]
    OtherPd(u32),
    /// The range lies outside the MR.
    #[error("range {addr:#x}+{len} lies outside MR {key:#x}")]
    OutOfBounds {
        /// The key.
        key: u32,
        /// Start of the range.
        addr: u64,
        /// Length of the range.
        len: u64,
    },
    /// The MR lacks an access flag the operation needs.
    #[error("MR {key:#x} does not allow {needed:?}")]
    NoAccess {
        /// The key.
        key: u32,
        /// What was needed.
        needed: Access,
    },
}

/// The MR table. A key is `index << 8 | variant`, the variant never 0, so key 0x100 (mlx5's
/// invalid lkey that terminates receive scatter lists) is never handed out.
#[derive(Debug, Default)]
pub(crate) struct MrTable {
    slots: Vec<Option<Mr>>,
    variants: Vec<u8>,
}

impl MrTable {
    pub fn insert(&mut self, pd: PdId, addr: u64, len: u64, access: Access) -> u32 {
        let index = match self.slots.iter().position(|s| s.is_none()) {
            Some(i) => i,
            None => {
                self.slots.push(None);
                self.variants.push(0);
                self.slots.len() - 1
            }
        };
        let v = &mut self.variants[index];
        *v = if *v == 0xff { 1 } else { *v + 1 };
        let key = ((index as u32) << 8) | *v as u32;
        self.slots[index] = Some(Mr {
            pd,
            addr,
            len,
            access,
            key,
        });
        key
    }

    pub fn remove(&mut self, key: u32) -> Option<Mr> {
        let slot = self.slots.get_mut((key >> 8) as usize)?;
        if slot.is_some_and(|m| m.key == key) {
            slot.take()
        } else {
            None
        }
    }

    pub fn get(&self, key: u32) -> Option<&Mr> {
        self.slots
            .get((key >> 8) as usize)?
            .as_ref()
            .filter(|m| m.key == key)
    }

    pub fn any_in_pd(&self, pd: PdId) -> bool {
        self.slots.iter().flatten().any(|m| m.pd == pd)
    }

    /// Checks `key` grants `needed` on `addr..addr+len` in `pd`; returns the MR.
    pub fn check(
        &self,
        key: u32,
        pd: PdId,
        addr: u64,
        len: u64,
        needed: Access,
    ) -> Result<&Mr, KeyError> {
        let mr = self.get(key).ok_or(KeyError::Unknown(key))?;
        if mr.pd != pd {
            return Err(KeyError::OtherPd(key));
        }
        let end = addr
            .checked_add(len)
            .ok_or(KeyError::OutOfBounds { key, addr, len })?;
        if addr < mr.addr || end > mr.addr + mr.len {
            return Err(KeyError::OutOfBounds { key, addr, len });
        }
        if !mr.access.contains(needed) {
            return Err(KeyError::NoAccess { key, needed });
        }
        Ok(mr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_never_the_invalid_lkey_and_change_on_reuse() {
        let mut t = MrTable::default();
        let mut keys = Vec::new();
        for _ in 0..3 {
            let k = t.insert(PdId(1), 0x1000, 0x1000, Access::ALL);
            keys.push(k);
        }
        assert!(!keys.contains(&0x100));
        t.remove(keys[1]).unwrap();
        let again = t.insert(PdId(1), 0x1000, 0x1000, Access::ALL);
        assert_eq!(again >> 8, keys[1] >> 8);
        assert_ne!(again, keys[1]);
        assert_eq!(
            t.check(keys[1], PdId(1), 0x1000, 8, Access::NONE).err(),
            Some(KeyError::Unknown(keys[1]))
        );
    }

    #[test]
    fn checks_name_the_fault() {
        let mut t = MrTable::default();
        let k = t.insert(PdId(1), 0x1000, 0x100, Access::REMOTE_READ);
        assert!(t
            .check(k, PdId(1), 0x1000, 0x100, Access::REMOTE_READ)
            .is_ok());
        assert_eq!(
            t.check(k, PdId(2), 0x1000, 1, Access::NONE).err(),
            Some(KeyError::OtherPd(k))
        );
        assert!(matches!(
            t.check(k, PdId(1), 0x10ff, 2, Access::NONE),
            Err(KeyError::OutOfBounds { .. })
        ));
        assert!(matches!(
            t.check(k, PdId(1), u64::MAX, 2, Access::NONE),
            Err(KeyError::OutOfBounds { .. })
        ));
        assert!(matches!(
            t.check(k, PdId(1), 0x1000, 8, Access::REMOTE_WRITE),
            Err(KeyError::NoAccess { .. })
        ));
    }
}
