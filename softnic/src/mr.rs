//! Protection domains and the memory-region table: lkeys, rkeys, bounds and access checks.

use std::collections::VecDeque;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
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

/// Why an MR could not be registered.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum RegError {
    /// `addr + len` lies beyond the end of the address space.
    #[error("range {addr:#x}+{len} wraps the address space")]
    Wraps {
        /// Start of the range.
        addr: u64,
        /// Length of the range.
        len: u64,
    },
    /// Every key index is in use or retired.
    #[error("out of memory keys: {slots} slots in use or retired")]
    OutOfKeys {
        /// Slots in the table.
        slots: usize,
    },
}

/// Variants a key slot can carry: 1..=255 (0 is never handed out, so key 0x100, mlx5's
/// invalid lkey, is never a key).
const VARIANTS: u32 = 255;
/// Key indices: a key is `index << 8 | variant` in 32 bits.
const MAX_SLOTS: usize = 1 << 24;

/// One key index and every variant it has handed out.
#[derive(Debug)]
struct Slot {
    mr: Option<Mr>,
    /// Bit v set: variant v was handed out (bit 0 set from the start).
    used: [u64; 4],
    /// Variants not handed out yet.
    left: u32,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            mr: None,
            used: [1, 0, 0, 0],
            left: VARIANTS,
        }
    }

    /// Takes the `nth` variant not handed out yet (0-based, below `left`).
    fn take_variant(&mut self, nth: u32) -> u8 {
        let mut seen = 0;
        for v in 1..=VARIANTS {
            let (word, bit) = ((v / 64) as usize, v % 64);
            if self.used[word] & (1 << bit) == 0 {
                if seen == nth {
                    self.used[word] |= 1 << bit;
                    self.left -= 1;
                    return v as u8;
                }
                seen += 1;
            }
        }
        unreachable!("nth {nth} below left {}", self.left + 1)
    }
}

/// The MR table. A key is `index << 8 | variant`, as mlx5 mkeys are.
///
/// Keys are not predictable and never name new memory once deregistered: each registration
/// draws its variant at random from the variants its index has not handed out yet, so a key
/// that was valid once is never valid again; an index whose 255 variants are used up is
/// retired for good (its keys are burnt) instead of returning to the free list. Freed indices
/// are reused oldest first, so a just-deregistered index waits behind every other free one.
#[derive(Debug)]
pub(crate) struct MrTable {
    slots: Vec<Slot>,
    /// Indices with no MR and variants left, oldest freed first.
    free: VecDeque<u32>,
    /// Indices with every variant used: never reused.
    retired: usize,
    /// Draws variants; seeded from the OS unless a test asks for a seed.
    rng: ChaCha20Rng,
}

impl MrTable {
    /// A table drawing its variants from `seed`, or from the OS's entropy.
    pub fn new(seed: Option<u64>) -> MrTable {
        MrTable {
            slots: Vec::new(),
            free: VecDeque::new(),
            retired: 0,
            rng: match seed {
                Some(seed) => ChaCha20Rng::seed_from_u64(seed),
                None => ChaCha20Rng::from_os_rng(),
            },
        }
    }

    /// Registers `[addr, addr + len)`; returns its key.
    pub fn insert(
        &mut self,
        pd: PdId,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<u32, RegError> {
        if addr.checked_add(len).is_none() {
            return Err(RegError::Wraps { addr, len });
        }
        let index = match self.free.pop_front() {
            Some(i) => i as usize,
            None if self.slots.len() < MAX_SLOTS => {
                self.slots.push(Slot::new());
                self.slots.len() - 1
            }
            None => {
                return Err(RegError::OutOfKeys {
                    slots: self.slots.len(),
                })
            }
        };
        let nth = self.rng.random_range(0..self.slots[index].left);
        let slot = &mut self.slots[index];
        let key = ((index as u32) << 8) | u32::from(slot.take_variant(nth));
        slot.mr = Some(Mr {
            pd,
            addr,
            len,
            access,
            key,
        });
        Ok(key)
    }

    /// Indices retired with every variant used.
    #[cfg(test)]
    pub fn retired(&self) -> usize {
        self.retired
    }

    /// Deregisters the MR of `key`; its index goes to the back of the free list, or is
    /// retired if it has no variant left.
    pub fn remove(&mut self, key: u32) -> Option<Mr> {
        let index = key >> 8;
        let slot = self.slots.get_mut(index as usize)?;
        let mr = slot.mr.take_if(|m| m.key == key)?;
        if slot.left == 0 {
            self.retired += 1;
        } else {
            self.free.push_back(index);
        }
        Some(mr)
    }

    pub fn get(&self, key: u32) -> Option<&Mr> {
        self.slots
            .get((key >> 8) as usize)?
            .mr
            .as_ref()
            .filter(|m| m.key == key)
    }

    pub fn any_in_pd(&self, pd: PdId) -> bool {
        self.slots
            .iter()
            .filter_map(|s| s.mr.as_ref())
            .any(|m| m.pd == pd)
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
        // mr.addr + mr.len cannot wrap: `insert` refuses such a range.
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
    use std::collections::HashSet;

    fn table() -> MrTable {
        MrTable::new(Some(7))
    }

    #[test]
    fn keys_are_never_the_invalid_lkey_and_change_on_reuse() {
        let mut t = table();
        let mut keys = Vec::new();
        for _ in 0..3 {
            keys.push(t.insert(PdId(1), 0x1000, 0x1000, Access::ALL).unwrap());
        }
        assert!(!keys.contains(&0x100));
        t.remove(keys[1]).unwrap();
        let again = t.insert(PdId(1), 0x1000, 0x1000, Access::ALL).unwrap();
        assert_eq!(again >> 8, keys[1] >> 8);
        assert_ne!(again, keys[1]);
        assert_eq!(
            t.check(keys[1], PdId(1), 0x1000, 8, Access::NONE).err(),
            Some(KeyError::Unknown(keys[1]))
        );
    }

    #[test]
    fn a_deregistered_key_never_names_new_memory_even_after_255_reregistrations() {
        let mut t = table();
        let mut seen = HashSet::new();
        for round in 0..1000u64 {
            let k = t
                .insert(PdId(1), round * 0x1000, 0x1000, Access::ALL)
                .unwrap();
            assert!(
                seen.insert(k),
                "key {k:#x} handed out twice (round {round})"
            );
            t.remove(k).unwrap();
        }
        // One index at a time was live: each gave its 255 variants, then retired.
        assert_eq!(t.retired(), 1000 / 255);
        assert_eq!(t.slots.len(), 1000 / 255 + 1);
    }

    #[test]
    fn a_freed_index_waits_behind_older_free_ones() {
        let mut t = table();
        let a = t.insert(PdId(1), 0, 8, Access::ALL).unwrap();
        let b = t.insert(PdId(1), 8, 8, Access::ALL).unwrap();
        t.remove(a).unwrap();
        t.remove(b).unwrap();
        let c = t.insert(PdId(1), 16, 8, Access::ALL).unwrap();
        assert_eq!(c >> 8, a >> 8, "the oldest freed index first");
        t.remove(c).unwrap();
        let d = t.insert(PdId(1), 24, 8, Access::ALL).unwrap();
        assert_eq!(
            d >> 8,
            b >> 8,
            "then the next oldest, not the one just freed"
        );
    }

    #[test]
    fn the_next_variant_cannot_be_told_from_the_last() {
        let mut t = table();
        let mut variants = Vec::new();
        for _ in 0..255 {
            let k = t.insert(PdId(1), 0, 8, Access::ALL).unwrap();
            variants.push(k & 0xff);
            t.remove(k).unwrap();
        }
        // Every variant once, in no order a peer could follow: a counter (the old scheme, and
        // the kernel's mlx5 variant) would make all 254 steps +1.
        let mut sorted = variants.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (1..=255).collect::<Vec<u32>>());
        let plus_one = variants.windows(2).filter(|w| w[1] == w[0] + 1).count();
        assert!(
            plus_one < 16,
            "{plus_one} of 254 steps were +1: {variants:?}"
        );
        // Another seed, another order.
        let mut other = MrTable::new(Some(8));
        let first: Vec<u32> = (0..8)
            .map(|i| other.insert(PdId(1), i * 8, 8, Access::ALL).unwrap() & 0xff)
            .collect();
        let mut t = table();
        let first_same_seed: Vec<u32> = (0..8)
            .map(|i| t.insert(PdId(1), i * 8, 8, Access::ALL).unwrap() & 0xff)
            .collect();
        assert_ne!(first, first_same_seed);
    }

    #[test]
    fn a_range_that_wraps_the_address_space_is_refused() {
        let mut t = table();
        assert_eq!(
            t.insert(PdId(1), u64::MAX - 7, 9, Access::ALL),
            Err(RegError::Wraps {
                addr: u64::MAX - 7,
                len: 9
            })
        );
        assert!(t.insert(PdId(1), u64::MAX - 8, 8, Access::ALL).is_ok());
    }

    #[test]
    fn checks_name_the_fault() {
        let mut t = table();
        let k = t
            .insert(PdId(1), 0x1000, 0x100, Access::REMOTE_READ)
            .unwrap();
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
