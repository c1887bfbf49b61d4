//! Per-thread caches of free buffers, in front of each class's shared free
//! list.
//!
//! A thread that allocates or releases buffers of a class keeps up to
//! [`CACHE`] free ones of its own (fewer for big buffers, see [`capacity`]),
//! LIFO, and moves half of them at a time to or from the class's depot. The
//! hot path then touches only the thread's own cache, with no locked
//! instruction (see [`Shard`]), instead of the shared list's head and
//! counters, which every thread would otherwise bounce between cores for
//! every message.
//!
//! Buffers in a cache are free, and must not be lost to a thread that waits
//! at the pool's cap: such a waiter empties every cache of its class into
//! the shared list before it sleeps ([`SizeClass::drain_caches`]), and a
//! release that finds a waiter moves its own cache to the shared list and
//! wakes it. Both sides meet inside the cache, which excludes them from
//! each other, so one of them always sees the other. A thread that exits
//! gives its caches back; classes with fewer than [`MIN_CACHED`] buffers
//! are not cached at all.

use std::cell::{RefCell, UnsafeCell};
use std::ptr::NonNull;
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
}

/// Run `f` on this thread's cache of class `idx`, creating it on first use.
/// `None` when the class is not cached or the thread is being torn down.
fn with_cache<R>(
    pool: &PoolInner,
    idx: usize,
    f: impl FnOnce(&mut ShardState, &Shard, &SizeClass) -> R,
) -> Option<R> {
    let class = &pool.classes[idx];
    if !class.cached {
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
                    locals.push(Local { class_id: class.id, shard, pool: pool.me.clone(), class: idx });
                    locals.len() - 1
                }
            };
            let shard = &locals[pos].shard;
            Some(shard.owned(|st| f(st, shard, class)))
        })
        .ok()
        .flatten()
}

/// Take a free buffer of class `idx`: from this thread's cache, refilled
/// from the shared list when empty. The buffer's reference of the pool is
/// taken too: from the cache's credit, refilled [`BATCH`] at a time (see
/// [`crate::refs`]), or from the pool's count when there is no cache.
pub(crate) fn take(pool: &PoolInner, idx: usize) -> Option<Entry> {
    let cached = with_cache(pool, idx, |st, shard, class| {
        let half = class.cache_cap / 2;
        if st.entries.is_empty() && class.depot_take(&mut st.entries, half) == 0 {
            while st.entries.len() < half {
                match class.pop_free() {
                    Some(i) => st.entries.push(i),
                    None => break,
                }
            }
        }
        let e = st.entries.pop()?;
        shard.count(1);
        if st.credit == 0 {
            pool.refs.acquire(BATCH);
            st.credit = BATCH;
        }
        st.credit -= 1;
        Some(e)
    });
    match cached {
        Some(e) => e,
        None => pool.classes[idx].try_take().inspect(|_| pool.refs.acquire(1)),
    }
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
pub(crate) unsafe fn put(pool: NonNull<PoolInner>, idx: usize, entry: Entry) {
    // SAFETY: the buffer's reference keeps the pool alive until `release`;
    // `inner` is not used after it.
    let inner = unsafe { pool.as_ref() };
    let class = &inner.classes[idx];
    let cached = with_cache(inner, idx, |st, shard, class| {
        let cap = class.cache_cap;
        if st.entries.len() >= cap {
            // The oldest half goes; the warmest stay.
            class.depot_put(&st.entries[..cap / 2]);
            st.entries.drain(..cap / 2);
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
        let woke = if class.waiters.load(Ordering::Acquire) > 0 {
            st.drain_into(class);
            true
        } else {
            false
        };
        (woke, give_back)
    });
    let give_back = match cached {
        Some((true, n)) => {
            class.wake_one();
            n
        }
        Some((false, n)) => n,
        None => {
            class.put(entry);
            1
        }
    };
    // SAFETY: the buffer's reference (with surplus credit) is given up here,
    // and neither `inner` nor `pool` is used after.
    unsafe { crate::refs::release(pool, give_back) };
}

/// Create this thread's caches for every cached class of `pool` now, so
/// that its first buffers later do not allocate.
pub(crate) fn prepare(pool: &PoolInner) {
    for idx in 0..pool.classes.len() {
        with_cache(pool, idx, |_, _, _| ());
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::mpsc;
    use std::thread;
    use std::time::{Duration, Instant};

    use crate::{Buf, Pool, PoolConfig, Wait};

    /// One class of 64-byte buffers, 1,024 of them: cached.
    pub(crate) fn pool() -> Pool {
        let cfg = PoolConfig::default()
            .with_classes([64])
            .with_region_size(64 << 10)
            .with_max_bytes(64 << 10)
            .with_prefault(false);
        Pool::unregistered(cfg).unwrap()
    }

    /// A thread that drops what it is sent into its own cache, then waits.
    pub(crate) fn keeper() -> (mpsc::Sender<Vec<Buf>>, mpsc::Sender<()>, thread::JoinHandle<()>) {
        let (bufs_tx, bufs_rx) = mpsc::channel::<Vec<Buf>>();
        let (quit_tx, quit_rx) = mpsc::channel::<()>();
        let h = thread::spawn(move || {
            drop(bufs_rx.recv().unwrap());
            let _ = quit_rx.recv();
        });
        (bufs_tx, quit_tx, h)
    }

    #[test]
    fn buffers_in_another_threads_cache_are_not_lost_at_the_cap() {
        let p = pool();
        let mut all: Vec<Buf> = (0..1024).map(|_| p.alloc(64, Wait::No).unwrap()).collect();
        assert!(p.alloc(64, Wait::No).is_err(), "the cap holds 1,024");
        let (bufs, quit, h) = keeper();
        bufs.send(all.split_off(1014)).unwrap();
        // The keeper has dropped ten: they sit in its cache, and it lives on.
        let t0 = Instant::now();
        while p.stats().buffers_in_use != 1014 {
            assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", p.stats());
            thread::yield_now();
        }
        // Without waiting, and with waiting: both find them.
        let a = p.alloc(64, Wait::No).expect("a cached buffer is free");
        let more: Vec<Buf> =
            (0..9).map(|_| p.alloc(64, Wait::For(Duration::from_secs(5))).unwrap()).collect();
        assert!(p.alloc(64, Wait::No).is_err());
        // A waiter is served by a release on a thread with a cache.
        let p2 = p.clone();
        let waiter =
            thread::spawn(move || p2.alloc(64, Wait::For(Duration::from_secs(10))).map(|b| b.addr()));
        thread::sleep(Duration::from_millis(50));
        let (bufs2, quit2, h2) = keeper();
        bufs2.send(vec![a]).unwrap();
        assert!(waiter.join().unwrap().is_ok());
        drop((more, all));
        for (q, h) in [(quit, h), (quit2, h2)] {
            q.send(()).unwrap();
            h.join().unwrap();
        }
        let s = p.stats();
        assert_eq!((s.buffers_in_use, s.buffers_free), (0, 1024), "{s:?}");
    }

    #[test]
    fn a_thread_that_exits_gives_its_cache_back() {
        let p = pool();
        let held: Vec<Buf> = (0..1000).map(|_| p.alloc(64, Wait::No).unwrap()).collect();
        let p2 = p.clone();
        thread::spawn(move || {
            // Allocates (and caches) on its own, then exits.
            let mine: Vec<Buf> = (0..24).map(|_| p2.alloc(64, Wait::No).unwrap()).collect();
            drop(mine);
        })
        .join()
        .unwrap();
        assert_eq!(p.stats().buffers_in_use, 1000);
        let rest: Vec<Buf> = (0..24).map(|_| p.alloc(64, Wait::No).unwrap()).collect();
        assert!(p.alloc(64, Wait::No).is_err());
        drop((held, rest));
        let s = p.stats();
        assert_eq!((s.buffers_in_use, s.buffers_free, s.buffers_total), (0, 1024, 1024));
    }

    /// An owner that takes and gives back buffers through its cache while
    /// another thread keeps emptying the caches (it allocates at the cap):
    /// no buffer is ever held by both (each holder stamps what it holds
    /// and checks the stamp before it lets go), and none is lost.
    #[test]
    fn an_owner_and_a_visitor_never_share_a_buffer() {
        let p = pool();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stamped = |b: &mut Buf, mark: u8| {
            b.fill(mark);
        };
        let owner = {
            let (p, stop) = (p.clone(), stop.clone());
            thread::spawn(move || {
                let mut rounds = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) || rounds < 2_000 {
                    let mark = 1 + (rounds % 100) as u8;
                    let mut held: Vec<Buf> = Vec::new();
                    for _ in 0..8 {
                        if let Ok(mut b) = p.alloc(64, Wait::For(Duration::from_secs(5))) {
                            stamped(&mut b, mark);
                            held.push(b);
                        }
                    }
                    for b in &held {
                        assert!(
                            b.iter().all(|&x| x == mark),
                            "a buffer the owner holds was written by another"
                        );
                    }
                    rounds += 1;
                }
                rounds
            })
        };
        let t0 = Instant::now();
        let mut visits = 0;
        while t0.elapsed() < Duration::from_millis(500) {
            // Everything there is, down to the cap: empties the owner's cache.
            let mut all = Vec::new();
            while let Ok(mut b) = p.alloc(64, Wait::No) {
                stamped(&mut b, 200);
                all.push(b);
            }
            thread::yield_now();
            for b in &all {
                assert!(b.iter().all(|&x| x == 200), "a buffer the visitor holds was written by another");
            }
            visits += 1;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let rounds = owner.join().unwrap();
        assert!(rounds >= 2_000 && visits > 10, "rounds {rounds}, visits {visits}");
        let s = p.stats();
        assert_eq!((s.buffers_in_use, s.buffers_total), (0, 1024), "{s:?}");
    }

    #[test]
    fn the_most_recently_released_buffer_comes_back_first() {
        let p = pool();
        let a = p.alloc(64, Wait::No).unwrap();
        let b = p.alloc(64, Wait::No).unwrap();
        let (a_addr, b_addr) = (a.addr(), b.addr());
        drop(a);
        drop(b);
        assert_eq!(p.alloc(64, Wait::No).unwrap().addr(), b_addr);
        let x = p.alloc(64, Wait::No).unwrap();
        assert_eq!(x.addr(), b_addr);
        assert_eq!(p.alloc(64, Wait::No).unwrap().addr(), a_addr);
    }
}
