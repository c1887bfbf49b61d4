//! Per-thread caches of free buffers, in front of each class's shared free
//! list.
//!
//! A thread that allocates or releases buffers of a class keeps up to
//! [`CACHE`] free ones of its own (fewer for big buffers, see [`capacity`]),
//! LIFO, and moves half of them at a time to or from the class's depot. The
//! hot path then touches only the thread's own cache, with no locked
//! instruction (see [`Shard`]), instead of the shared list's head and
//! counters, which every thread would otherwise bounce between cores for
//! every message. A thread remembers the cache it used last ([`LAST`]), so
//! that a run of buffers of one class, the common case, finds it with no
//! borrow of the thread's list of caches and no search; only the first
//! buffer of another class looks it up.
//!
//! Buffers in a cache are free, and must not be lost to a thread that waits
//! at the pool's cap: such a waiter empties every cache of its class into
//! the shared list before it sleeps ([`SizeClass::drain_caches`]), and a
//! release that finds a waiter moves its own cache to the shared list and
//! wakes it. Both sides meet inside the cache, which excludes them from
//! each other, so one of them always sees the other. A thread that exits
//! gives its caches back; classes with fewer than [`MIN_CACHED`] buffers
//! are not cached at all.

use std::cell::{Cell, RefCell, UnsafeCell};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use crate::class::{Entry, SizeClass};
use crate::pool::PoolInner;
use crate::refs::BATCH;

/// Most free buffers a thread keeps per class.
pub(crate) const CACHE: usize = 64;
/// Bytes a thread keeps per class, at most: big classes cache fewer buffers.
const CACHE_BYTES: usize = 256 << 10;

/// How many free buffers of `size` bytes a thread keeps (at least 4); half
/// of them move to or from the depot at once.
pub(crate) fn capacity(size: usize) -> usize {
    (CACHE_BYTES / size.max(1)).clamp(4, CACHE)
}
/// Classes that can hold fewer buffers than this are not cached.
pub(crate) const MIN_CACHED: usize = 1024;

/// One thread's cache for one class.
///
/// Its owner enters it with no locked instruction ([`Shard::owned`]);
/// another thread ([`Shard::visit`]) raises `visit`, puts a heavy barrier
/// on every thread ([`crate::barrier::heavy`]), and waits for `busy` to
/// drop before it goes in. The owner raises `busy`, puts a light barrier,
/// and goes in only if `visit` is down; otherwise it drops `busy` and
/// takes `gate`, which a visitor holds for its whole visit. Dekker's
/// pattern: the two barriers make it impossible for each side to miss the
/// other's flag, so at most one side is inside at a time.
#[derive(Debug)]
pub(crate) struct Shard {
    /// The owner is inside (stored by the owner's thread only).
    busy: AtomicBool,
    /// A visitor wants in, or is in: the owner goes through `gate`.
    visit: AtomicBool,
    /// Held by a visitor for its whole visit, and by an owner that found
    /// `visit` raised.
    gate: Mutex<()>,
    state: UnsafeCell<ShardState>,
    /// Buffers taken through this cache minus buffers released into it:
    /// its share of the class's buffers in use. Written by the owner's
    /// thread only (a load and a store, no locked instruction), read by
    /// anyone for stats.
    net_taken: AtomicI64,
}

// SAFETY: `state` is reached only inside `Shard::owned` (on the owner's
// thread, with `busy` raised and `visit` seen down, or with `gate` held)
// and inside `Shard::visit` (with `gate` held, `visit` raised and `busy`
// seen down after a heavy barrier); the module docs and `Shard`'s say why
// those exclude each other. `ShardState` is `Send`.
unsafe impl Sync for Shard {}

#[derive(Debug)]
pub(crate) struct ShardState {
    /// Free-list entries, most recently released last.
    entries: Vec<Entry>,
    /// References of the pool this cache holds for buffers it will hand
    /// out (see [`crate::refs`]).
    credit: usize,
}

impl ShardState {
    fn drain_into(&mut self, class: &SizeClass) {
        for i in self.entries.drain(..) {
            class.push_free(i);
        }
    }
}

fn lock_gate(s: &Shard) -> MutexGuard<'_, ()> {
    s.gate.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shard {
    fn new() -> Self {
        crate::barrier::init();
        Self {
            busy: AtomicBool::new(false),
            visit: AtomicBool::new(false),
            gate: Mutex::new(()),
            state: UnsafeCell::new(ShardState { entries: Vec::with_capacity(CACHE), credit: 0 }),
            net_taken: AtomicI64::new(0),
        }
    }

    /// Run `f` on the cache, from its owner's thread (and only from
    /// there: [`with_cache`] is the one caller). `f` must not enter this
    /// shard again.
    #[inline(always)]
    fn owned<R>(&self, f: impl FnOnce(&mut ShardState) -> R) -> R {
        self.busy.store(true, Ordering::Relaxed);
        crate::barrier::light();
        if self.visit.load(Ordering::Acquire) {
            return self.owned_through_gate(f);
        }
        // SAFETY: on the owner's thread, so no other `owned` runs; `busy`
        // was raised and, after the light barrier, `visit` was down, so a
        // visitor that comes now sees `busy` and waits for it to drop
        // (`Shard`'s docs), and one that left dropped `visit` with release
        // ordering, which the acquire load saw.
        let r = f(unsafe { &mut *self.state.get() });
        self.busy.store(false, Ordering::Release);
        r
    }

    /// [`Shard::owned`] while a visitor wants in: wait for it behind the gate.
    #[cold]
    #[inline(never)]
    fn owned_through_gate<R>(&self, f: impl FnOnce(&mut ShardState) -> R) -> R {
        self.busy.store(false, Ordering::Release);
        let _gate = lock_gate(self);
        // SAFETY: on the owner's thread, so no other `owned` runs, and the
        // gate keeps visitors out until it is dropped; the visitor before
        // released the gate, which this lock acquired.
        f(unsafe { &mut *self.state.get() })
    }

    /// Run `f` on the cache from any thread (its owner's too, when not
    /// inside [`Shard::owned`]): empty it, or take its credit. Costs a
    /// heavy barrier: for cold paths only.
    fn visit<R>(&self, f: impl FnOnce(&mut ShardState) -> R) -> R {
        let _gate = lock_gate(self);
        self.visit.store(true, Ordering::Relaxed);
        crate::barrier::heavy();
        let mut spins = 0u32;
        while self.busy.load(Ordering::Acquire) {
            // The owner's sections are short; it may have been switched out
            // inside one.
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        // SAFETY: the gate excludes other visitors and an owner that saw
        // `visit`; after the heavy barrier `busy` was seen down, so the
        // owner is outside and will see `visit` when it comes back (and
        // take the gate); its last section's writes were released by the
        // store that dropped `busy`, which the acquire load saw.
        let r = f(unsafe { &mut *self.state.get() });
        self.visit.store(false, Ordering::Release);
        r
    }

    /// Count buffers taken (`d > 0`) or released (`d < 0`) through this
    /// cache: the owner's thread only.
    #[inline(always)]
    fn count(&self, d: i64) {
        self.net_taken.store(self.net_taken.load(Ordering::Relaxed) + d, Ordering::Relaxed);
    }

    /// Take this cache's reference credit (the pool is being orphaned).
    pub(crate) fn take_credit(&self) -> usize {
        self.visit(|st| std::mem::take(&mut st.credit))
    }

    /// Move every cached entry to `class`'s shared list.
    pub(crate) fn drain_into(&self, class: &SizeClass) {
        self.visit(|st| st.drain_into(class))
    }

    pub(crate) fn net_taken(&self) -> i64 {
        self.net_taken.load(Ordering::Relaxed)
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
        // No use of this cache through the thread's last one from now on.
        if LAST.get().0 == self.class_id {
            LAST.set(NO_LAST);
        }
        // The thread is gone (or the class is): give the buffers back, and
        // the references. A pool that is gone had no references left.
        if let Some(pool) = self.pool.upgrade() {
            let class = &pool.classes[self.class];
            // On the owner's thread, outside `owned`: one visit.
            let credit = self.shard.visit(|st| {
                st.drain_into(class);
                std::mem::take(&mut st.credit)
            });
            class.retire(self.shard.net_taken.swap(0, Ordering::Relaxed));
            // SAFETY: this cache held `credit` references, given up here;
            // the upgraded `Arc` keeps the pool alive to the end of `drop`.
            unsafe { crate::refs::release(NonNull::from(&*pool), credit) };
        }
    }
}

thread_local! {
    static LOCAL: RefCell<Vec<Local>> = const { RefCell::new(Vec::new()) };
    /// The cache this thread used last: its class's id and its shard, one
    /// of `LOCAL`'s. A thread moves buffers of one class at a time, most of
    /// the time, and finds that cache here with no borrow and no search.
    /// Set only while `LOCAL` holds the shard, and reset before `LOCAL`
    /// lets go of it ([`Local`]'s drop). Const and without a destructor, so
    /// it is there to the thread's very end, `LOCAL`'s own teardown too.
    static LAST: Cell<(u64, *const Shard)> = const { Cell::new(NO_LAST) };
}

/// [`LAST`] naming no cache (class ids count up from 0 and never reach it).
const NO_LAST: (u64, *const Shard) = (u64::MAX, ptr::null());

/// Run `f` on this thread's cache of class `idx`, creating it on first use.
/// `None` when the class is not cached or the thread is being torn down.
#[inline(always)]
fn with_cache<R>(
    pool: &PoolInner,
    idx: usize,
    f: impl FnOnce(&mut ShardState, &Shard, &SizeClass) -> R,
) -> Option<R> {
    let class = &pool.classes[idx];
    if !class.cached {
        return None;
    }
    let (id, last) = LAST.get();
    if id == class.id {
        // SAFETY: `LAST` names a shard that this thread's `LOCAL` holds an
        // `Arc` of (it is reset before that `Arc` goes), so it is alive;
        // `f` does not enter this shard again (`Shard::owned`).
        let shard = unsafe { &*last };
        return Some(shard.owned(|st| f(st, shard, class)));
    }
    with_cache_found(pool, idx, f)
}

/// [`with_cache`] for a class other than the thread's last: find its cache
/// (or make it) among the thread's, and remember it as the last.
#[inline(never)]
fn with_cache_found<R>(
    pool: &PoolInner,
    idx: usize,
    f: impl FnOnce(&mut ShardState, &Shard, &SizeClass) -> R,
) -> Option<R> {
    let class = &pool.classes[idx];
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
                    locals.push(Local { class_id: class.id, shard, pool: pool.me.clone(), class: idx });
                    locals.len() - 1
                }
            };
            let shard = &locals[pos].shard;
            LAST.set((class.id, Arc::as_ptr(shard)));
            Some(shard.owned(|st| f(st, shard, class)))
        })
        .ok()
        .flatten()
}

/// Take a free buffer of class `idx`: from this thread's cache, refilled
/// from the shared list when empty. The buffer's reference of the pool is
/// taken too: from the cache's credit, refilled [`BATCH`] at a time (see
/// [`crate::refs`]), or from the pool's count when there is no cache.
#[inline(always)]
pub(crate) fn take(pool: &PoolInner, idx: usize) -> Option<Entry> {
    let cached = with_cache(pool, idx, |st, shard, class| {
        let e = match st.entries.pop() {
            Some(e) => e,
            None => refill(st, class)?,
        };
        shard.count(1);
        if st.credit == 0 {
            take_credit(pool, st);
        }
        st.credit -= 1;
        Some(e)
    });
    match cached {
        Some(e) => e,
        None => take_uncached(pool, idx),
    }
}

/// An empty cache takes half its capacity from the class's depot, or from
/// its shared list, and hands out one of them.
#[cold]
#[inline(never)]
fn refill(st: &mut ShardState, class: &SizeClass) -> Option<Entry> {
    let half = class.cache_cap / 2;
    if class.depot_take(&mut st.entries, half) == 0 {
        while st.entries.len() < half {
            match class.pop_free() {
                Some(i) => st.entries.push(i),
                None => break,
            }
        }
    }
    st.entries.pop()
}

/// A cache out of reference credit takes [`BATCH`] references at once.
#[cold]
#[inline(never)]
fn take_credit(pool: &PoolInner, st: &mut ShardState) {
    pool.refs.acquire(BATCH);
    st.credit = BATCH;
}

/// [`take`] with no cache: straight from the class's shared list.
#[cold]
#[inline(never)]
fn take_uncached(pool: &PoolInner, idx: usize) -> Option<Entry> {
    pool.classes[idx].try_take().inspect(|_| pool.refs.acquire(1))
}

/// Give a buffer of class `idx` of `pool` back: into this thread's cache,
/// spilling to the shared list when full, and straight to a waiter if one
/// waits. Its reference of the pool goes to the cache's credit, or back to
/// the pool's count (no cache, an orphaned pool, or a cache over its
/// limit), last: this may drop the pool.
///
/// # Safety
///
/// The buffer held one reference of `pool`, given up here.
#[inline(always)]
pub(crate) unsafe fn put(pool: NonNull<PoolInner>, idx: usize, entry: Entry) {
    // SAFETY: the buffer's reference keeps the pool alive until `release`;
    // `inner` is not used after it.
    let inner = unsafe { pool.as_ref() };
    let cached = with_cache(inner, idx, |st, shard, class| {
        if st.entries.len() >= class.cache_cap {
            spill_half(st, class);
        }
        st.entries.push(entry);
        shard.count(-1);
        // Read inside the cache: see `refs::orphan`.
        let give_back = if inner.refs.orphaned() {
            1
        } else if st.credit >= 2 * BATCH {
            st.credit -= BATCH - 1;
            BATCH
        } else {
            st.credit += 1;
            0
        };
        // Read inside the cache: a waiter that emptied it before (it counts
        // itself in `waiters` first) is seen here; one that comes later
        // sees the entry in the cache.
        let woke = class.waiters.load(Ordering::Acquire) > 0 && drain_for_waiter(st, class);
        (woke, give_back)
    });
    let give_back = match cached {
        Some((false, 0)) => return,
        Some((woke, n)) => {
            if woke {
                inner.classes[idx].wake_one();
            }
            n
        }
        None => {
            inner.classes[idx].put(entry);
            1
        }
    };
    // SAFETY: the buffer's reference (with surplus credit) is given up here,
    // and neither `inner` nor `pool` is used after.
    unsafe { crate::refs::release(pool, give_back) };
}

/// A full cache: the oldest half goes to the class's depot; the warmest stay.
#[cold]
#[inline(never)]
fn spill_half(st: &mut ShardState, class: &SizeClass) {
    let cap = class.cache_cap;
    class.depot_put(&st.entries[..cap / 2]);
    st.entries.drain(..cap / 2);
}

/// A thread waits at the class's cap: everything cached goes to the shared
/// list, where it looks. `true`: it is to be woken.
#[cold]
#[inline(never)]
fn drain_for_waiter(st: &mut ShardState, class: &SizeClass) -> bool {
    st.drain_into(class);
    true
}

/// Create this thread's caches for every cached class of `pool` now, so
/// that its first buffers later do not allocate.
pub(crate) fn prepare(pool: &PoolInner) {
    for idx in 0..pool.classes.len() {
        with_cache(pool, idx, |_, _, _| ());
    }
}

#[cfg(test)]
#[path = "cache_tests.rs"]
pub(crate) mod tests;
