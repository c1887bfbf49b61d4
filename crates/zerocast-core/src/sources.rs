//! A bounded table of per-source state with CLOCK (second-chance) eviction.
//!
//! A datagram socket keeps state per source (a [`SeqTracker`](crate::SeqTracker),
//! over RDMA also an address handle). Sources are named by the network, so
//! a flood from many of them (spoofed UDP source ports, say) must not grow
//! that state without limit. A [`SourceTable`] holds at most
//! [`cap`](SourceTable::cap) entries; a new source arriving at a full table
//! takes the place of one chosen by the CLOCK algorithm:
//!
//! - every entry has a *referenced* bit, set when its source is seen again
//!   ([`touch`](SourceTable::touch) on a key already present). A new entry
//!   starts with the bit clear: a source seen once has not earned a second
//!   chance;
//! - a hand sweeps the slots in a ring. An entry under the hand with its
//!   bit set loses the bit and is passed over; the first one found with its
//!   bit clear is evicted and the newcomer takes its slot.
//!
//! So a source that keeps sending keeps its entry while a one-shot flood
//! passes through the table: once the table is full of one-shot sources
//! (all bits clear), every newcomer moves the hand by one slot, and a source
//! touched at least once per `cap - 1` newcomers is never evicted. Idle
//! entries go first. Each sweep step either evicts or clears a bit set by an
//! earlier touch, so insertion is amortised O(1).
//!
//! The last entry used is remembered, so a stream from one source finds it
//! with one comparison and no hashing. Evictions are counted
//! ([`evicted`](SourceTable::evicted)).
//!
//! Pure state, no I/O, no clock. Memory: one slot per entry and a hash
//! index, both sized by the entries present, never more than `cap`.

use std::collections::HashMap;
use std::hash::Hash;

/// The default most sources a datagram socket tracks (see
/// [`SourceTable`]): enough for any legitimate fan-in, a few hundred KiB
/// at most.
pub const DEFAULT_MAX_SOURCES: usize = 4096;

#[derive(Debug, Clone)]
struct Slot<K, V> {
    key: K,
    value: V,
    referenced: bool,
}

/// At most `cap` entries keyed by source, evicting by CLOCK (second chance).
/// See the [module docs](self).
#[derive(Debug, Clone)]
pub struct SourceTable<K, V> {
    cap: usize,
    /// The ring the hand sweeps; grows up to `cap`, then stays.
    slots: Vec<Slot<K, V>>,
    /// Key → its slot.
    index: HashMap<K, usize>,
    /// The next slot the hand looks at (< `slots.len()` once full).
    hand: usize,
    /// The slot used last, checked before the index.
    last: Option<usize>,
    evicted: u64,
}

impl<K: Hash + Eq + Copy, V> SourceTable<K, V> {
    /// A table of at most `cap` entries (at least one, whatever `cap` says).
    /// Nothing is allocated until entries arrive.
    pub fn new(cap: usize) -> Self {
        Self { cap: cap.max(1), slots: Vec::new(), index: HashMap::new(), hand: 0, last: None, evicted: 0 }
    }

    /// The most entries the table holds.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether the table holds nothing.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Entries evicted to make room for new ones, since the table was made.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    fn find(&self, key: &K) -> Option<usize> {
        if let Some(i) = self.last {
            if self.slots[i].key == *key {
                return Some(i);
            }
        }
        self.index.get(key).copied()
    }

    /// The entry for `key`, if held. Looking does not count as activity.
    pub fn get(&self, key: &K) -> Option<&V> {
        self.find(key).map(|i| &self.slots[i].value)
    }

    /// The entry for `key`, made with `make` if there is none: the source
    /// was seen. An entry already held earns its second chance; a new one
    /// in a full table takes the slot of the entry the hand evicts, which
    /// is returned with its key.
    pub fn touch(&mut self, key: K, make: impl FnOnce() -> V) -> (&mut V, Option<(K, V)>) {
        if let Some(i) = self.find(&key) {
            self.last = Some(i);
            let slot = &mut self.slots[i];
            slot.referenced = true;
            return (&mut slot.value, None);
        }
        let fresh = Slot { key, value: make(), referenced: false };
        if self.slots.len() < self.cap {
            let i = self.slots.len();
            self.slots.push(fresh);
            self.index.insert(key, i);
            self.last = Some(i);
            return (&mut self.slots[i].value, None);
        }
        let i = self.victim();
        let old = std::mem::replace(&mut self.slots[i], fresh);
        self.index.remove(&old.key);
        self.index.insert(key, i);
        self.evicted += 1;
        self.last = Some(i);
        (&mut self.slots[i].value, Some((old.key, old.value)))
    }

    /// Sweep the hand to the first entry without its referenced bit,
    /// clearing the bits it passes; the hand stops just past it. Ends
    /// within `len + 1` steps: after one lap every bit is clear.
    fn victim(&mut self) -> usize {
        let n = self.slots.len();
        loop {
            let i = self.hand;
            self.hand = if i + 1 == n { 0 } else { i + 1 };
            let slot = &mut self.slots[i];
            if !slot.referenced {
                return i;
            }
            slot.referenced = false;
        }
    }

    /// Remove the entry for `key` (not counted as an eviction).
    pub fn remove(&mut self, key: &K) -> Option<V> {
        let i = self.find(key)?;
        self.index.remove(key);
        let gone = self.slots.swap_remove(i);
        let n = self.slots.len();
        if i < n {
            // The last slot moved into `i`.
            self.index.insert(self.slots[i].key, i);
        }
        if self.hand >= n {
            self.hand = 0;
        }
        self.last = None;
        Some(gone.value)
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.slots.iter().map(|s| (&s.key, &s.value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    /// Index and slots agree, and the table is within its cap.
    fn check<V>(t: &SourceTable<u32, V>) {
        assert!(t.len() <= t.cap());
        assert_eq!(t.index.len(), t.slots.len());
        for (i, s) in t.slots.iter().enumerate() {
            assert_eq!(t.index.get(&s.key), Some(&i));
        }
        assert!(t.slots.is_empty() || t.hand < t.slots.len());
    }

    #[test]
    fn holds_up_to_its_cap_then_evicts_idle_entries_first() {
        let mut t = SourceTable::new(3);
        for k in 0..3u32 {
            assert!(t.touch(k, || k * 10).1.is_none());
        }
        assert_eq!((t.len(), t.evicted()), (3, 0));
        // 1 is seen again: its second chance. 3 evicts 0, the first idle one.
        t.touch(1, || unreachable!());
        assert_eq!(t.touch(3, || 30).1, Some((0, 0)));
        // The hand passes 1, clearing its bit: 4 evicts 2. The hand wraps:
        // 5 evicts 3, a newcomer seen once; then 6 evicts 1, whose chance
        // is used up.
        assert_eq!(t.touch(4, || 40).1, Some((2, 20)));
        assert_eq!(t.touch(5, || 50).1, Some((3, 30)));
        assert_eq!(t.touch(6, || 60).1, Some((1, 10)));
        assert_eq!(t.evicted(), 4);
        let mut keys: Vec<u32> = t.iter().map(|(k, _)| *k).collect();
        keys.sort_unstable();
        assert_eq!(keys, [4, 5, 6]);
        assert_eq!((t.get(&4), t.get(&0)), (Some(&40), None));
        check(&t);
    }

    #[test]
    fn all_referenced_still_finds_a_victim() {
        let mut t = SourceTable::new(4);
        for k in 0..4u32 {
            t.touch(k, || ());
            t.touch(k, || ());
        }
        let (_, out) = t.touch(9, || ());
        assert!(out.is_some());
        assert_eq!((t.len(), t.evicted()), (4, 1));
        check(&t);
    }

    #[test]
    fn remove_keeps_the_ring_consistent() {
        let mut t = SourceTable::new(3);
        for k in 0..3u32 {
            t.touch(k, || k);
        }
        assert_eq!(t.remove(&0), Some(0));
        assert_eq!(t.remove(&0), None);
        check(&t);
        assert_eq!(t.get(&2), Some(&2));
        assert!(t.touch(7, || 7).1.is_none(), "room again after a removal");
        assert_eq!(t.evicted(), 0);
        check(&t);
    }

    #[test]
    fn zero_cap_means_one() {
        let mut t = SourceTable::new(0);
        t.touch(1u32, || ());
        assert_eq!(t.touch(2, || ()).1, Some((1, ())));
        assert_eq!((t.cap(), t.len()), (1, 1));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Touch(u32),
        Remove(u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![8 => (0u32..48).prop_map(Op::Touch), 1 => (0u32..48).prop_map(Op::Remove)]
    }

    proptest! {
        /// Against a model map: the table never exceeds its cap, holds
        /// exactly what the model holds once the evicted entries it reports
        /// are taken out, keeps each entry's value, and counts each
        /// eviction.
        #[test]
        fn matches_a_model_and_never_exceeds_its_cap(
            cap in 1usize..12,
            ops in proptest::collection::vec(op(), 0..400),
        ) {
            let mut t = SourceTable::new(cap);
            let mut model: HashMap<u32, u64> = HashMap::new();
            let mut made = 0u64;
            let mut evictions = 0u64;
            for o in ops {
                match o {
                    Op::Touch(k) => {
                        let had = model.contains_key(&k);
                        let (v, out) = t.touch(k, || { made += 1; made });
                        let v = *v;
                        if had {
                            prop_assert_eq!(Some(&v), model.get(&k));
                            prop_assert!(out.is_none());
                        } else {
                            model.insert(k, v);
                            if let Some((ok, ov)) = out {
                                prop_assert_ne!(ok, k);
                                prop_assert_eq!(model.remove(&ok), Some(ov));
                                evictions += 1;
                            } else {
                                prop_assert!(model.len() <= cap);
                            }
                        }
                    }
                    Op::Remove(k) => prop_assert_eq!(t.remove(&k), model.remove(&k)),
                }
                check(&t);
                prop_assert_eq!(t.len(), model.len());
                prop_assert!(t.len() <= cap);
                prop_assert_eq!(t.evicted(), evictions);
                for (k, v) in &model {
                    prop_assert_eq!(t.get(k), Some(v));
                }
            }
        }

        /// A source seen at least once per `period < cap` newcomers survives
        /// a flood of one-shot sources of any length; every newcomer past
        /// the cap evicts exactly one of them.
        #[test]
        fn an_active_source_survives_a_one_shot_flood(
            cap in 2usize..64,
            period_pick in 0usize..64,
            flood in 0u32..3000,
            phase in 0usize..64,
        ) {
            let period = 1 + period_pick % (cap - 1);
            let mut t = SourceTable::new(cap);
            let active = u32::MAX;
            t.touch(active, || 0u32);
            t.touch(active, || unreachable!());
            let mut seen = HashSet::new();
            for k in 0..flood {
                if (k as usize + phase) % period == 0 {
                    let (_, out) = t.touch(active, || unreachable!("the active source was evicted"));
                    prop_assert!(out.is_none());
                }
                let (_, out) = t.touch(k, || 1);
                if let Some((ok, _)) = out {
                    prop_assert_ne!(ok, active);
                    prop_assert!(seen.insert(ok), "evicted twice");
                }
                prop_assert!(t.len() <= cap);
            }
            prop_assert!(t.get(&active).is_some());
            let distinct = u64::from(flood) + 1;
            prop_assert_eq!(t.evicted(), distinct.saturating_sub(cap as u64));
        }
    }
}
