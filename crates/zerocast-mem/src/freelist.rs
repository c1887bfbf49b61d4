//! A class's free list: a lock-free LIFO stack of buffer indices.
//!
//! Last in, first out, so the buffer taken next is the one released most
//! recently, still warm in the cache. (A FIFO hands out the coldest buffer
//! instead: with hundreds of 64 KiB buffers in flight that is the
//! difference between copying from cache and copying from memory.)
//!
//! A Treiber stack over indices: `next[i]` links entry `i` to the one below
//! it, and the head word packs a 32-bit tag with the top index, so a head
//! popped and pushed back between a reader's load and its compare-exchange
//! (ABA) fails that compare-exchange. Everything is plain atomics: a stale
//! `next` read is harmless because the tagged head check then fails.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// The "no entry" index.
const NIL: u32 = u32::MAX;

#[derive(Debug)]
pub(crate) struct FreeList {
    /// `tag << 32 | top index` (`NIL`: empty).
    head: AtomicU64,
    next: Box<[AtomicU32]>,
}

fn pack(tag: u32, idx: u32) -> u64 {
    (u64::from(tag) << 32) | u64::from(idx)
}

fn unpack(word: u64) -> (u32, u32) {
    ((word >> 32) as u32, word as u32)
}

impl FreeList {
    /// An empty list for indices `0..capacity` (`capacity < u32::MAX`,
    /// checked by the pool's config validation).
    pub(crate) fn new(capacity: usize) -> Self {
        debug_assert!(capacity < NIL as usize);
        Self {
            head: AtomicU64::new(pack(0, NIL)),
            next: (0..capacity).map(|_| AtomicU32::new(NIL)).collect(),
        }
    }

    /// Take the most recently pushed index.
    pub(crate) fn pop(&self) -> Option<u32> {
        let mut head = self.head.load(Ordering::Acquire);
        loop {
            let (tag, top) = unpack(head);
            if top == NIL {
                return None;
            }
            let below = self.next[top as usize].load(Ordering::Relaxed);
            match self.head.compare_exchange_weak(
                head,
                pack(tag.wrapping_add(1), below),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(top),
                Err(now) => head = now,
            }
        }
    }

    /// Put `idx` (not on the list) on top.
    pub(crate) fn push(&self, idx: u32) {
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            let (tag, top) = unpack(head);
            self.next[idx as usize].store(top, Ordering::Relaxed);
            match self.head.compare_exchange_weak(
                head,
                pack(tag.wrapping_add(1), idx),
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(now) => head = now,
            }
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        unpack(self.head.load(Ordering::Acquire)).1 == NIL
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::Arc;

    #[test]
    fn last_in_first_out() {
        let l = FreeList::new(8);
        assert!(l.is_empty() && l.pop().is_none());
        for i in [3, 1, 7] {
            l.push(i);
        }
        assert_eq!((l.pop(), l.pop()), (Some(7), Some(1)));
        l.push(5);
        assert_eq!((l.pop(), l.pop(), l.pop()), (Some(5), Some(3), None));
        assert!(l.is_empty());
    }

    #[test]
    fn threads_never_lose_or_duplicate_an_index() {
        const N: u32 = 512;
        let l = Arc::new(FreeList::new(N as usize));
        for i in 0..N {
            l.push(i);
        }
        let workers: Vec<_> = (0..4)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || {
                    let mut held = Vec::new();
                    for round in 0..20_000u32 {
                        if round & 1 == 0 || held.is_empty() {
                            if let Some(i) = l.pop() {
                                held.push(i);
                            }
                        } else if let Some(i) = held.pop() {
                            l.push(i);
                        }
                    }
                    for i in held {
                        l.push(i);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        let mut seen = HashSet::new();
        while let Some(i) = l.pop() {
            assert!(seen.insert(i), "index {i} twice");
        }
        assert_eq!(seen.len(), N as usize);
    }
}
