//! The lock-free table of a device's memory keys, read by the datapath at post time.
//!
//! Every gather or scatter entry a work request names is checked against the MR its lkey
//! belongs to before any byte of the WQE is written: an unknown lkey, an lkey of another PD, a
//! range outside the MR or a write into memory without `LOCAL_WRITE` is a typed error at post
//! time instead of an error completion later (or, on a NIC without those checks, corrupted
//! memory).
//!
//! Readers (datapath lcores) never lock and never allocate: each slot is a seqlock whose fields
//! are atomics, so a reader racing a registration on the service lcore either sees the whole
//! old entry or the whole new one and never blocks. Writers (MR registration and
//! deregistration, control path) take a mutex among themselves.
//!
//! Slots are found by hashing the key and probing a short window; registration fails with
//! [`KeyTableError::Full`] when the window is full, which a table sized well above the number
//! of MRs makes practically impossible.

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::datapath::gate::QpGate;
use crate::verbs::Access;

/// How many slots after the home slot a key may live in.
const PROBE: usize = 16;

/// What the table knows about one MR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrEntry {
    /// The local key.
    pub lkey: u32,
    /// The remote key.
    pub rkey: u32,
    /// First byte (a virtual address in this process).
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Access rights given at registration.
    pub access: Access,
    /// The PD the MR belongs to (the provider's PD handle).
    pub pd: u32,
}

impl MrEntry {
    /// Whether `[addr, addr + len)` lies inside this MR.
    #[inline]
    pub fn covers(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.addr + self.len)
    }
}

/// Why a key could not be added.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyTableError {
    /// No free slot in the key's probe window.
    #[error("key table full around lkey {lkey:#x} ({capacity} slots); raise ContextConfig::key_table_slots")]
    Full {
        /// The key that did not fit.
        lkey: u32,
        /// Slots in the table.
        capacity: usize,
    },
    /// The key is already present.
    #[error("lkey {lkey:#x} is already in the key table")]
    Duplicate {
        /// The key.
        lkey: u32,
    },
}

#[derive(Default)]
struct Slot {
    /// Even: stable; odd: a writer is changing the slot.
    seq: AtomicU32,
    /// bit 32: occupied; bits 31..0: lkey.
    key: AtomicU64,
    rkey: AtomicU32,
    /// bits 31..8: pd, bits 7..0: access.
    pd_access: AtomicU32,
    addr: AtomicU64,
    len: AtomicU64,
}

const OCCUPIED: u64 = 1 << 32;

/// A device's lkey -> MR table.
pub struct KeyTable {
    slots: Box<[Slot]>,
    mask: usize,
    writers: Mutex<()>,
    /// Moves on every removal, so a queue may cache an entry it looked up and trust it while
    /// the generation it read before the lookup is still current.
    generation: AtomicU64,
    /// The gates of the device's QPs; a removal moves the key epoch of those that watch the
    /// key (their send queues' fast paths read the gate instead of the generation).
    gates: Mutex<Gates>,
}

/// The gates a key table moves, held strongly so that a removal reads each without an
/// upgrade; a gate only the table holds (its QP is gone) is dropped by the next prune.
#[derive(Default)]
struct Gates {
    list: Vec<Arc<QpGate>>,
    /// The list's length after the last prune: the next registration that finds it twice as
    /// long prunes again, so registering N gates costs O(N) in all, not O(N^2).
    pruned_at: usize,
}

impl std::fmt::Debug for KeyTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyTable")
            .field("slots", &self.slots.len())
            .finish_non_exhaustive()
    }
}

#[inline]
fn home(lkey: u32, mask: usize) -> usize {
    // mlx5 keys are (index << 8 | variant); mix both halves so neighbouring indices and
    // variants spread out.
    let h = (lkey ^ (lkey >> 8)).wrapping_mul(0x9e37_79b1);
    (h >> 8) as usize & mask
}

impl KeyTable {
    /// A table of `slots` entries (rounded up to a power of two, at least `PROBE`).
    pub fn new(slots: usize) -> KeyTable {
        let n = slots.max(PROBE).next_power_of_two();
        KeyTable {
            slots: (0..n).map(|_| Slot::default()).collect(),
            mask: n - 1,
            writers: Mutex::new(()),
            generation: AtomicU64::new(0),
            gates: Mutex::new(Gates::default()),
        }
    }

    /// Has `gate`'s key epoch move with every removal of the key it watches from now on (until
    /// its QP drops the gate).
    pub fn register_gate(&self, gate: &Arc<QpGate>) {
        let mut gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
        if gates.list.len() >= 2 * gates.pruned_at.max(PROBE) {
            gates.list.retain(|g| Arc::strong_count(g) > 1);
            gates.pruned_at = gates.list.len();
        }
        gates.list.push(gate.clone());
    }

    /// The removal generation: unchanged since a lookup means the entry found is still valid.
    #[inline]
    pub fn generation(&self) -> u64 {
        // Acquire pairs with the release increment in `remove`: a reader that still sees the
        // old generation has not missed a removal that happened before its lookup.
        self.generation.load(Ordering::Acquire)
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Looks up `lkey`. Lock-free and allocation-free; safe to call while another thread
    /// inserts or removes.
    #[inline]
    pub fn get(&self, lkey: u32) -> Option<MrEntry> {
        let h = home(lkey, self.mask);
        for i in 0..PROBE {
            let slot = &self.slots[(h + i) & self.mask];
            loop {
                // Acquire pairs with the writer's release of the even sequence number: fields
                // read below are at least as new as that write.
                let s1 = slot.seq.load(Ordering::Acquire);
                if s1 & 1 == 1 {
                    std::hint::spin_loop();
                    continue;
                }
                let key = slot.key.load(Ordering::Relaxed);
                if key != OCCUPIED | lkey as u64 {
                    // Not ours (or empty). An empty slot does not end the probe: removal does
                    // not move later entries back, so keep looking through the window.
                    // A torn view here can only make us skip a slot mid-rewrite; re-check it.
                    fence(Ordering::Acquire);
                    if slot.seq.load(Ordering::Relaxed) != s1 {
                        continue;
                    }
                    break;
                }
                let entry = MrEntry {
                    lkey,
                    rkey: slot.rkey.load(Ordering::Relaxed),
                    addr: slot.addr.load(Ordering::Relaxed),
                    len: slot.len.load(Ordering::Relaxed),
                    access: Access::from_bits_truncate(
                        slot.pd_access.load(Ordering::Relaxed) & 0xff,
                    ),
                    pd: slot.pd_access.load(Ordering::Relaxed) >> 8,
                };
                // The acquire fence keeps the field loads above before the re-check of the
                // sequence number; an unchanged number means no writer touched the slot.
                fence(Ordering::Acquire);
                if slot.seq.load(Ordering::Relaxed) == s1 {
                    return Some(entry);
                }
            }
        }
        None
    }

    /// Adds an MR. Control path: takes the writers' lock.
    pub fn insert(&self, entry: MrEntry) -> Result<(), KeyTableError> {
        let _guard = self.writers.lock().unwrap_or_else(|p| p.into_inner());
        let h = home(entry.lkey, self.mask);
        let mut free = None;
        for i in 0..PROBE {
            let idx = (h + i) & self.mask;
            let key = self.slots[idx].key.load(Ordering::Relaxed);
            if key == OCCUPIED | entry.lkey as u64 {
                return Err(KeyTableError::Duplicate { lkey: entry.lkey });
            }
            if key & OCCUPIED == 0 && free.is_none() {
                free = Some(idx);
            }
        }
        let Some(idx) = free else {
            return Err(KeyTableError::Full {
                lkey: entry.lkey,
                capacity: self.capacity(),
            });
        };
        self.write(idx, |slot| {
            slot.rkey.store(entry.rkey, Ordering::Relaxed);
            slot.addr.store(entry.addr, Ordering::Relaxed);
            slot.len.store(entry.len, Ordering::Relaxed);
            slot.pd_access.store(
                (entry.pd << 8) | (entry.access.bits() & 0xff),
                Ordering::Relaxed,
            );
            slot.key
                .store(OCCUPIED | entry.lkey as u64, Ordering::Relaxed);
        });
        Ok(())
    }

    /// Removes an MR; returns whether it was there. Control path.
    pub fn remove(&self, lkey: u32) -> bool {
        let _guard = self.writers.lock().unwrap_or_else(|p| p.into_inner());
        let h = home(lkey, self.mask);
        for i in 0..PROBE {
            let idx = (h + i) & self.mask;
            if self.slots[idx].key.load(Ordering::Relaxed) == OCCUPIED | lkey as u64 {
                // Invalidate cached copies first: a post racing this removal either sees the
                // new generation and looks up again, or completes as if it came just before.
                self.generation.fetch_add(1, Ordering::AcqRel);
                self.write(idx, |slot| slot.key.store(0, Ordering::Relaxed));
                // Then the key epochs of the gates whose send queues cached this key (or are
                // about to look it up), after the slot is cleared: a queue that starts
                // watching the key after this fence finds it gone (`QpGate::watch_key`). Only
                // those: a teardown of N QPs with an MR each used to bump N gates N times.
                // Gates whose QPs are gone leave the list on the way: at a teardown the list
                // shrinks with the QPs instead of being walked whole for every MR.
                fence(Ordering::SeqCst);
                let mut gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
                gates.list.retain(|gate| {
                    if gate.watches(lkey) {
                        gate.bump_epoch();
                    }
                    Arc::strong_count(gate) > 1
                });
                gates.pruned_at = gates.pruned_at.min(gates.list.len());
                return true;
            }
        }
        false
    }

    fn write(&self, idx: usize, change: impl FnOnce(&Slot)) {
        let slot = &self.slots[idx];
        let s = slot.seq.load(Ordering::Relaxed);
        slot.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        // The odd sequence number must be visible before any field changes, so a reader that
        // sees a changed field also sees (on its re-check) that the sequence moved.
        fence(Ordering::Release);
        change(slot);
        // Release: readers that acquire the even number see every field written above.
        slot.seq.store(s.wrapping_add(2), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn entry(lkey: u32, addr: u64) -> MrEntry {
        MrEntry {
            lkey,
            rkey: lkey ^ 0xffff,
            addr,
            len: 4096,
            access: Access::LOCAL_WRITE,
            pd: 7,
        }
    }

    #[test]
    fn inserted_keys_are_found_and_removed_keys_are_not() {
        let table = KeyTable::new(64);
        table.insert(entry(0x1234, 0x10000)).unwrap();
        assert_eq!(table.get(0x1234), Some(entry(0x1234, 0x10000)));
        assert_eq!(table.get(0x1235), None);
        assert!(table.remove(0x1234));
        assert_eq!(table.get(0x1234), None);
        assert!(!table.remove(0x1234));
    }

    #[test]
    fn removal_moves_the_generation_and_insertion_does_not() {
        let table = KeyTable::new(64);
        let g0 = table.generation();
        table.insert(entry(9, 0)).unwrap();
        assert_eq!(table.generation(), g0);
        table.remove(9);
        assert_ne!(table.generation(), g0);
    }

    #[test]
    fn duplicate_keys_are_refused() {
        let table = KeyTable::new(64);
        table.insert(entry(5, 0)).unwrap();
        assert_eq!(
            table.insert(entry(5, 0)),
            Err(KeyTableError::Duplicate { lkey: 5 })
        );
    }

    #[test]
    fn keys_behind_a_removed_neighbour_stay_reachable() {
        let table = KeyTable::new(16);
        // With 16 slots every key shares one probe window.
        for k in 0..10 {
            table.insert(entry(k << 8, k as u64)).unwrap();
        }
        assert!(table.remove(3 << 8));
        for k in (0..10).filter(|&k| k != 3) {
            assert_eq!(table.get(k << 8).map(|e| e.addr), Some(k as u64));
        }
    }

    #[test]
    fn a_full_probe_window_is_an_error_naming_the_key() {
        let table = KeyTable::new(16);
        for k in 0..16 {
            table.insert(entry(k, 0)).unwrap();
        }
        let err = table.insert(entry(99, 0)).unwrap_err();
        assert_eq!(
            err,
            KeyTableError::Full {
                lkey: 99,
                capacity: 16
            }
        );
    }

    #[test]
    fn covers_checks_both_ends_and_overflow() {
        let e = entry(1, 1000);
        assert!(e.covers(1000, 4096));
        assert!(e.covers(5095, 1));
        assert!(!e.covers(999, 1));
        assert!(!e.covers(1000, 4097));
        assert!(!e.covers(u64::MAX, 2));
    }

    #[test]
    fn readers_never_see_a_torn_entry_while_a_writer_churns() {
        let table = Arc::new(KeyTable::new(64));
        let writer = {
            let table = table.clone();
            std::thread::spawn(move || {
                for round in 0..2000u64 {
                    // addr and len always satisfy len == addr * 2 in a whole entry.
                    let e = MrEntry {
                        len: round * 2,
                        addr: round,
                        ..entry(42, 0)
                    };
                    table.insert(e).unwrap();
                    table.remove(42);
                }
            })
        };
        let mut seen = 0;
        while !writer.is_finished() {
            if let Some(e) = table.get(42) {
                assert_eq!(e.len, e.addr * 2, "torn entry {e:?}");
                seen += 1;
            }
        }
        writer.join().unwrap();
        let _ = seen;
    }

    #[test]
    fn a_removal_moves_the_epoch_only_of_the_gates_that_watch_its_key() {
        use crate::qp_state::QpState;
        let table = KeyTable::new(64);
        table.insert(entry(1 << 8, 0)).unwrap();
        table.insert(entry(2 << 8, 0)).unwrap();
        let gates: Vec<Arc<QpGate>> = (0..3)
            .map(|_| Arc::new(QpGate::new(QpState::Rts)))
            .collect();
        for g in &gates {
            table.register_gate(g);
        }
        gates[0].watch_key(1 << 8);
        gates[1].watch_key(2 << 8);
        let before: Vec<u64> = gates.iter().map(|g| g.word()).collect();
        assert!(table.remove(1 << 8));
        let after: Vec<u64> = gates.iter().map(|g| g.word()).collect();
        // Before, every gate of the device moved with every removal.
        assert_ne!(after[0], before[0], "the gate caching the key moves");
        assert_eq!(
            after[1..],
            before[1..],
            "a gate caching another key, or none, does not"
        );
    }

    #[test]
    fn gates_whose_qps_are_gone_are_pruned_as_the_list_grows() {
        use crate::qp_state::QpState;
        let table = KeyTable::new(64);
        let kept = Arc::new(QpGate::new(QpState::Rts));
        table.register_gate(&kept);
        for _ in 0..1000 {
            table.register_gate(&Arc::new(QpGate::new(QpState::Rts)));
        }
        let listed = |table: &KeyTable| table.gates.lock().unwrap().list.len();
        assert!(listed(&table) <= 2 * PROBE + 1, "{} listed", listed(&table));
        table.insert(entry(1 << 8, 0)).unwrap();
        table.remove(1 << 8);
        assert_eq!(listed(&table), 1, "a removal drops the gone");
        let gates = table.gates.lock().unwrap();
        assert!(Arc::ptr_eq(&gates.list[0], &kept));
    }
}
