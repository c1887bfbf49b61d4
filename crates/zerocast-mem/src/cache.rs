//! Per-thread caches of free buffers, in front of each class's shared free
//! list.
//!
//! A thread that allocates or releases buffers of a class keeps up to
//! [`CACHE`] free ones of its own, LIFO, and moves [`SPILL`] at a time to or
//! from the shared list. The hot path then touches only the thread's own
//! cache (an uncontended lock on a line no other thread writes), instead of
//! the shared list's head and counters, which every thread would otherwise
//! bounce between cores for every message.
//!
//! Buffers in a cache are free, and must not be lost to a thread that waits
//! at the pool's cap: such a waiter empties every cache of its class into
//! the shared list before it sleeps ([`SizeClass::drain_caches`]), and a
//! release that finds a waiter moves its own cache to the shared list and
//! wakes it. Both sides meet under the cache's lock, so one of them always
//! sees the other. A thread that exits gives its caches back; classes with
//! fewer than [`MIN_CACHED`] buffers are not cached at all.

use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use crate::class::{Entry, SizeClass};
use crate::pool::PoolInner;

/// Free buffers a thread keeps per class.
pub(crate) const CACHE: usize = 64;
/// Buffers moved between a cache and the shared list at once.
pub(crate) const SPILL: usize = 32;
/// Classes that can hold fewer buffers than this are not cached.
pub(crate) const MIN_CACHED: usize = 1024;

/// One thread's cache for one class.
#[derive(Debug)]
pub(crate) struct Shard {
    state: Mutex<ShardState>,
}

#[derive(Debug)]
pub(crate) struct ShardState {
    /// Free-list indices, most recently released last.
    entries: Vec<u32>,
    /// Buffers taken through this cache minus buffers released into it:
    /// its share of the class's buffers in use.
    pub(crate) net_taken: i64,
}

fn lock(s: &Shard) -> MutexGuard<'_, ShardState> {
    s.state.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shard {
    fn new() -> Self {
        Self { state: Mutex::new(ShardState { entries: Vec::with_capacity(CACHE), net_taken: 0 }) }
    }

    /// Move every cached entry to `class`'s shared list.
    pub(crate) fn drain_into(&self, class: &SizeClass) {
        let mut st = lock(self);
        for i in st.entries.drain(..) {
            class.push_free(i);
        }
    }

    pub(crate) fn net_taken(&self) -> i64 {
        lock(self).net_taken
    }
}

/// A thread's handle on its cache of one class.
struct Local {
    class_id: u64,
    shard: Arc<Shard>,
    pool: Weak<PoolInner>,
    class: usize,
}

impl Drop for Local {
    fn drop(&mut self) {
        // The thread is gone (or the class is): give the buffers back.
        if let Some(pool) = self.pool.upgrade() {
            let class = &pool.classes[self.class];
            self.shard.drain_into(class);
            let mut st = lock(&self.shard);
            class.retire(st.net_taken);
            st.net_taken = 0;
        }
    }
}

thread_local! {
    static LOCAL: RefCell<Vec<Local>> = const { RefCell::new(Vec::new()) };
}

/// Run `f` on this thread's cache of class `idx`, creating it on first use.
/// `None` when the class is not cached or the thread is being torn down.
fn with_cache<R>(
    pool: &Arc<PoolInner>,
    idx: usize,
    f: impl FnOnce(&mut ShardState, &SizeClass) -> R,
) -> Option<R> {
    let class = &pool.classes[idx];
    if class.layout.max_buffers() < MIN_CACHED {
        return None;
    }
    LOCAL
        .try_with(|locals| {
            let mut locals = locals.try_borrow_mut().ok()?;
            let pos = match locals.iter().position(|l| l.class_id == class.id) {
                Some(p) => p,
                None => {
                    // Forget caches of classes that are gone.
                    locals.retain(|l| Arc::strong_count(&l.shard) > 1);
                    let shard = Arc::new(Shard::new());
                    class.register(shard.clone());
                    locals.push(Local { class_id: class.id, shard, pool: Arc::downgrade(pool), class: idx });
                    locals.len() - 1
                }
            };
            let mut st = lock(&locals[pos].shard);
            Some(f(&mut st, class))
        })
        .ok()
        .flatten()
}

/// Take a free buffer of class `idx`: from this thread's cache, refilled
/// from the shared list when empty.
pub(crate) fn take(pool: &Arc<PoolInner>, idx: usize) -> Option<Entry> {
    let cached = with_cache(pool, idx, |st, class| {
        if st.entries.is_empty() && class.depot_take(&mut st.entries, SPILL) == 0 {
            while st.entries.len() < SPILL {
                match class.pop_free() {
                    Some(i) => st.entries.push(i),
                    None => break,
                }
            }
        }
        let i = st.entries.pop()?;
        st.net_taken += 1;
        Some(class.entry_of(i))
    });
    match cached {
        Some(e) => e,
        None => pool.classes[idx].try_take(),
    }
}

/// Give a buffer of class `idx` back: into this thread's cache, spilling
/// to the shared list when full, and straight to a waiter if one waits.
pub(crate) fn put(pool: &Arc<PoolInner>, idx: usize, entry: Entry) {
    let class = &pool.classes[idx];
    let cached = with_cache(pool, idx, |st, class| {
        if st.entries.len() >= CACHE {
            // The oldest half goes; the warmest stay.
            class.depot_put(&st.entries[..SPILL]);
            st.entries.drain(..SPILL);
        }
        st.entries.push(class.index_of(entry));
        st.net_taken -= 1;
        // Read after this cache's lock was taken: a waiter that emptied
        // the cache before is seen here; one that comes later sees the
        // entry in the cache.
        if class.waiters.load(Ordering::Acquire) > 0 {
            for i in st.entries.drain(..) {
                class.push_free(i);
            }
            true
        } else {
            false
        }
    });
    match cached {
        Some(true) => class.wake_one(),
        Some(false) => {}
        None => class.put(entry),
    }
}

/// Create this thread's caches for every cached class of `pool` now, so
/// that its first buffers later do not allocate.
pub(crate) fn prepare(pool: &Arc<PoolInner>) {
    for idx in 0..pool.classes.len() {
        with_cache(pool, idx, |_, _| ());
    }
}
