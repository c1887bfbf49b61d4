//! One size class: its regions, its lock-free free list, and its waiters.
//!
//! Hot path: `pop`/`push` on an `ArrayQueue` sized for every buffer the class
//! could ever hold, plus one atomic counter; neither allocates nor locks.
//! Cold path: growing by a region, under `regions`' mutex, and waiting at the
//! cap, under `wait_lock` (a blocked thread) or as a [`Waker`] in `hooks`
//! (a task that must not block; see [`crate::Pool::alloc_or_wake`]).

use std::ptr::{self, NonNull};
use std::sync::atomic::{fence, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::task::Waker;
use std::time::Instant;

use crossbeam_queue::ArrayQueue;

use slab::Slab;

use crate::cache::Shard;
use crate::config::ClassLayout;
use crate::error::PoolError;
use crate::region::Region;
use crate::registrar::{Keys, Registrar};

/// A free-list entry: region key (slab key) in the high half, slot in the low half.
pub(crate) type Entry = u64;

pub(crate) fn encode(region: u32, slot: u32) -> Entry {
    (u64::from(region) << 32) | u64::from(slot)
}

pub(crate) fn decode(entry: Entry) -> (u32, u32) {
    ((entry >> 32) as u32, entry as u32)
}

/// What the hot path needs to know about a region, readable without a lock.
///
/// Written once, under the growth lock, before any of the region's slots is
/// pushed to the free list; the queue's release/acquire hand-off makes the
/// writes visible to whoever pops a slot.
#[derive(Debug)]
struct RegionInfo {
    base: AtomicPtr<u8>,
    /// `lkey << 32 | rkey`.
    keys: AtomicU64,
    /// Pool-wide region id.
    id: AtomicU32,
}

/// Pool-wide state a class needs to grow.
#[derive(Debug)]
pub(crate) struct Budget {
    /// `PoolConfig::max_bytes`.
    pub(crate) cap: usize,
    /// Bytes of all regions, including one being created right now.
    pub(crate) reserved: AtomicUsize,
    /// Next pool-wide region id.
    next_region_id: AtomicU32,
}

impl Budget {
    pub(crate) fn new(cap: usize) -> Self {
        Self { cap, reserved: AtomicUsize::new(0), next_region_id: AtomicU32::new(0) }
    }

    /// Claim `bytes` under the cap, or `false` if that would pass it.
    fn try_reserve(&self, bytes: usize) -> bool {
        self.reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                r.checked_add(bytes).filter(|&n| n <= self.cap)
            })
            .is_ok()
    }

    fn release(&self, bytes: usize) {
        self.reserved.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Would one more region of `bytes` fit under the cap right now?
    fn has_room(&self, bytes: usize) -> bool {
        self.reserved.load(Ordering::Acquire).saturating_add(bytes) <= self.cap
    }
}

/// Bytes claimed from a [`Budget`], given back on drop unless forgotten.
struct Reservation<'a> {
    budget: &'a Budget,
    bytes: usize,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.budget.release(self.bytes);
    }
}

/// Everything `grow` needs from the pool.
#[derive(Clone, Copy)]
pub(crate) struct GrowCtx<'a> {
    pub(crate) budget: &'a Budget,
    pub(crate) registrar: &'a dyn Registrar,
    pub(crate) prefault: bool,
}

/// Outcome of a growth attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Grow {
    /// Buffers are (or were just) on the free list: pop again.
    Ready,
    /// The pool is at its cap; this class cannot grow.
    AtCap,
}

#[derive(Debug)]
pub(crate) struct SizeClass {
    pub(crate) layout: ClassLayout,
    /// How many free buffers a thread cache keeps ([`crate::cache::capacity`]).
    pub(crate) cache_cap: usize,
    /// Whether threads cache this class (it can hold enough buffers).
    pub(crate) cached: bool,
    free: ArrayQueue<Entry>,
    /// Free buffers moved out of thread caches in batches of
    /// half a cache, and refilled into them the same way: one
    /// lock per batch instead of one contended update per buffer.
    /// Preallocated for every buffer the class can hold.
    depot: Mutex<Vec<Entry>>,
    /// Indexed by region key; `layout.max_regions` long.
    directory: Box<[RegionInfo]>,
    /// Owns the regions; slab key = region key. Its lock is the growth lock.
    regions: Mutex<Slab<Region>>,
    region_count: AtomicUsize,
    /// Buffers taken from (minus released to) the shared list directly;
    /// per-thread caches count their own share (see [`crate::cache`]).
    in_use: AtomicUsize,
    /// The shares of caches whose thread has gone.
    retired: AtomicI64,
    /// Every thread cache of this class.
    caches: Mutex<Vec<Arc<Shard>>>,
    /// Unique among all classes of all pools: names this class in thread caches.
    pub(crate) id: u64,
    /// Threads blocked in [`SizeClass::wait`] plus the wakers in `hooks`:
    /// while it is not zero, every release is announced.
    pub(crate) waiters: AtomicUsize,
    wait_lock: Mutex<()>,
    released: Condvar,
    /// Woken once, at the next release (see [`SizeClass::wake_on_release`]).
    hooks: Mutex<Vec<Waker>>,
}

static NEXT_CLASS_ID: AtomicU64 = AtomicU64::new(0);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves its data consistent before anything that
    // can panic, so a poisoned lock is still safe to use.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl SizeClass {
    pub(crate) fn new(layout: ClassLayout) -> Self {
        let directory = (0..layout.max_regions)
            .map(|_| RegionInfo {
                base: AtomicPtr::new(ptr::null_mut()),
                keys: AtomicU64::new(0),
                id: AtomicU32::new(0),
            })
            .collect();
        Self {
            layout,
            free: ArrayQueue::new(layout.max_buffers()),
            cache_cap: crate::cache::capacity(layout.size),
            cached: layout.max_buffers() >= crate::cache::MIN_CACHED,
            depot: Mutex::new(if layout.max_buffers() >= crate::cache::MIN_CACHED {
                Vec::with_capacity(layout.max_buffers())
            } else {
                Vec::new()
            }),
            directory,
            regions: Mutex::new(Slab::with_capacity(layout.max_regions.min(64))),
            region_count: AtomicUsize::new(0),
            in_use: AtomicUsize::new(0),
            retired: AtomicI64::new(0),
            caches: Mutex::new(Vec::new()),
            id: NEXT_CLASS_ID.fetch_add(1, Ordering::Relaxed),
            waiters: AtomicUsize::new(0),
            wait_lock: Mutex::new(()),
            released: Condvar::new(),
            hooks: Mutex::new(Vec::new()),
        }
    }

    /// Hot path: take a free slot, if any. Lock-free, allocation-free.
    pub(crate) fn try_take(&self) -> Option<Entry> {
        let e = match self.free.pop() {
            Some(e) => e,
            None => lock(&self.depot).pop()?,
        };
        self.in_use.fetch_add(1, Ordering::Relaxed);
        Some(e)
    }

    /// Pop the shared free list (for a thread cache, which counts the
    /// buffer as taken itself).
    pub(crate) fn pop_free(&self) -> Option<Entry> {
        self.free.pop().or_else(|| lock(&self.depot).pop())
    }

    /// Move a batch from a thread cache to the depot.
    pub(crate) fn depot_put(&self, batch: &[Entry]) {
        lock(&self.depot).extend_from_slice(batch);
    }

    /// Move up to `n` free buffers from the depot into `into`; how many.
    pub(crate) fn depot_take(&self, into: &mut Vec<Entry>, n: usize) -> usize {
        let mut d = lock(&self.depot);
        let k = n.min(d.len());
        let from = d.len() - k;
        into.extend_from_slice(&d[from..]);
        d.truncate(from);
        k
    }

    /// Push onto the shared free list (from a thread cache).
    pub(crate) fn push_free(&self, e: Entry) {
        let pushed = self.free.push(e);
        // The queue holds every slot the class can ever have, so it is never full.
        debug_assert!(pushed.is_ok(), "free list overflow");
    }

    /// Keep `shard` so that waiters can empty it and stats can count it.
    /// Caches of threads that are gone are dropped here.
    pub(crate) fn register(&self, shard: Arc<Shard>) {
        let mut caches = lock(&self.caches);
        caches.retain(|c| Arc::strong_count(c) > 1);
        caches.push(shard);
    }

    /// Fold the share of a cache whose thread has gone into the class.
    pub(crate) fn retire(&self, net_taken: i64) {
        self.retired.fetch_add(net_taken, Ordering::AcqRel);
    }

    /// Take back the reference credit of every thread cache (see
    /// [`crate::refs`]); the total.
    pub(crate) fn take_credit(&self) -> usize {
        lock(&self.caches).iter().map(|c| c.take_credit()).sum()
    }

    /// Move every thread cache's buffers to the shared list.
    pub(crate) fn drain_caches(&self) {
        for c in lock(&self.caches).iter() {
            c.drain_into(self);
        }
    }

    /// Wake one waiter (after a thread cache moved buffers to the shared list).
    pub(crate) fn wake_one(&self) {
        drop(lock(&self.wait_lock));
        self.released.notify_one();
        self.fire_hooks();
    }

    /// Wake `waker` once, at the next release of a buffer of this class
    /// (or growth). The caller looks for a buffer again after this: one
    /// released before it is found then, one released after wakes it.
    /// A waker already waiting (by [`Waker::will_wake`]) is not added
    /// twice.
    pub(crate) fn wake_on_release(&self, waker: &Waker) {
        let mut hooks = lock(&self.hooks);
        if !hooks.iter().any(|h| h.will_wake(waker)) {
            hooks.push(waker.clone());
            self.waiters.fetch_add(1, Ordering::Relaxed);
        }
        drop(hooks);
        // Pairs with the fence in `put`, as `wait`'s does.
        fence(Ordering::SeqCst);
    }

    /// Wake (and forget) every waiting hook, outside the lock.
    fn fire_hooks(&self) {
        let hooks = std::mem::take(&mut *lock(&self.hooks));
        if hooks.is_empty() {
            return;
        }
        self.waiters.fetch_sub(hooks.len(), Ordering::Relaxed);
        for h in hooks {
            h.wake();
        }
    }

    /// Hot path: give a slot back and wake one waiter if anyone waits.
    /// Takes a lock only when somebody is waiting.
    pub(crate) fn put(&self, entry: Entry) {
        let pushed = self.free.push(entry);
        // The queue holds every slot the class can ever have, so it is never full.
        debug_assert!(pushed.is_ok(), "free list overflow");
        self.in_use.fetch_sub(1, Ordering::Relaxed);
        // Pairs with the fence in `wait`: either we see the waiter's
        // increment, or the waiter's pop sees our push.
        fence(Ordering::SeqCst);
        if self.waiters.load(Ordering::Relaxed) > 0 {
            drop(lock(&self.wait_lock));
            self.released.notify_one();
            self.fire_hooks();
        }
    }

    /// Wake every waiter (after growth, or after a failed growth gave its
    /// reserved bytes back), so they look again.
    pub(crate) fn wake_all(&self) {
        fence(Ordering::SeqCst);
        if self.waiters.load(Ordering::Relaxed) > 0 {
            drop(lock(&self.wait_lock));
            self.released.notify_all();
            self.fire_hooks();
        }
    }

    /// Cold path: add one region.
    ///
    /// With `only_if_empty`, first re-check the free list under the lock:
    /// another thread may have grown the class (or freed a buffer) while this
    /// one waited for the lock, and then there is nothing to do.
    pub(crate) fn grow(&self, ctx: GrowCtx<'_>, only_if_empty: bool) -> Result<Grow, PoolError> {
        let l = self.layout;
        let mut regions = lock(&self.regions);
        if only_if_empty && !(self.free.is_empty() && lock(&self.depot).is_empty()) {
            return Ok(Grow::Ready);
        }
        if regions.len() >= l.max_regions || !ctx.budget.try_reserve(l.region_bytes) {
            return Ok(Grow::AtCap);
        }
        // Give the bytes back if making the region fails, or if the
        // registrar panics.
        let reservation = Reservation { budget: ctx.budget, bytes: l.region_bytes };
        let region = Region::new(l.region_bytes, ctx.prefault, ctx.registrar)?;
        std::mem::forget(reservation);
        let key = regions.vacant_key();
        let id = ctx.budget.next_region_id.fetch_add(1, Ordering::Relaxed);
        let keys = region.keys();
        let info = &self.directory[key];
        info.base.store(region.base().as_ptr(), Ordering::Release);
        info.keys.store((u64::from(keys.lkey) << 32) | u64::from(keys.rkey), Ordering::Release);
        info.id.store(id, Ordering::Release);
        regions.insert(region);
        self.region_count.fetch_add(1, Ordering::Release);
        tracing::debug!(
            class = l.size,
            region = id,
            bytes = l.region_bytes,
            buffers = l.slots_per_region,
            registrar = ctx.registrar.name(),
            "pool grew by a region"
        );
        // `key < max_regions` (checked above) and `slots_per_region` fit u32 (validated).
        for slot in 0..l.slots_per_region {
            let pushed = self.free.push(encode(key as u32, slot as u32));
            debug_assert!(pushed.is_ok(), "free list overflow");
        }
        drop(regions);
        self.wake_all();
        Ok(Grow::Ready)
    }

    /// Block until a slot is free or `deadline` passes (`None`: forever).
    /// `Ok(None)` means the deadline passed.
    pub(crate) fn wait(
        &self,
        ctx: GrowCtx<'_>,
        deadline: Option<Instant>,
    ) -> Result<Option<Entry>, PoolError> {
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::Relaxed);
            }
        }
        self.waiters.fetch_add(1, Ordering::Relaxed);
        let _waiting = Waiting(&self.waiters);
        // Pairs with the fence in `put`.
        fence(Ordering::SeqCst);
        let mut guard = lock(&self.wait_lock);
        loop {
            self.drain_caches();
            if let Some(e) = self.try_take() {
                return Ok(Some(e));
            }
            // Room can reappear only when another region's creation failed
            // and gave its reservation back; grow rather than sleep then.
            if self.layout.max_regions > self.region_count.load(Ordering::Acquire)
                && ctx.budget.has_room(self.layout.region_bytes)
            {
                drop(guard);
                self.grow(ctx, true)?;
                guard = lock(&self.wait_lock);
                continue;
            }
            guard = match deadline {
                None => self.released.wait(guard).unwrap_or_else(PoisonError::into_inner),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Ok(None);
                    }
                    self.released.wait_timeout(guard, d - now).unwrap_or_else(PoisonError::into_inner).0
                }
            };
        }
    }

    /// Address of a slot taken from this class's free list.
    #[inline(always)]
    pub(crate) fn slot_ptr(&self, region: u32, slot: u32) -> NonNull<u8> {
        let base = self.directory[region as usize].base.load(Ordering::Acquire);
        debug_assert!(!base.is_null() && (slot as usize) < self.layout.slots_per_region);
        // SAFETY: the entry came off the free list, so its region was created
        // (base stored before the push, seen through the queue's acquire) and
        // `slot < slots_per_region`, so the offset stays inside the region's
        // `region_bytes >= slots_per_region * stride` bytes.
        let p = unsafe { base.add(slot as usize * self.layout.stride) };
        // SAFETY: offset from a non-null mmap base, inside the mapping, so non-null.
        unsafe { NonNull::new_unchecked(p) }
    }

    pub(crate) fn keys(&self, region: u32) -> Keys {
        let k = self.directory[region as usize].keys.load(Ordering::Acquire);
        Keys { lkey: (k >> 32) as u32, rkey: k as u32 }
    }

    pub(crate) fn region_id(&self, region: u32) -> u32 {
        self.directory[region as usize].id.load(Ordering::Acquire)
    }

    /// Buffers not in use right now. Exact when nothing runs concurrently.
    pub(crate) fn buffers_free(&self) -> usize {
        (self.regions() * self.layout.slots_per_region).saturating_sub(self.buffers_in_use())
    }

    pub(crate) fn buffers_in_use(&self) -> usize {
        let cached: i64 = lock(&self.caches).iter().map(|c| c.net_taken()).sum();
        let total =
            self.in_use.load(Ordering::Relaxed) as i64 + self.retired.load(Ordering::Acquire) + cached;
        total.max(0) as usize
    }

    pub(crate) fn regions(&self) -> usize {
        self.region_count.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registrar::NoopRegistrar;

    #[test]
    fn entry_round_trips() {
        for (r, s) in [(0, 0), (1, 2), (u32::MAX, u32::MAX), (7, u32::MAX - 1)] {
            assert_eq!(decode(encode(r, s)), (r, s));
        }
    }

    #[test]
    fn budget_never_passes_cap() {
        let b = Budget::new(10);
        assert!(b.try_reserve(6));
        assert!(!b.try_reserve(6));
        assert!(b.has_room(4) && !b.has_room(5));
        b.release(6);
        assert!(b.try_reserve(10));
        assert!(!b.try_reserve(usize::MAX));
    }

    #[test]
    fn grows_to_cap_then_stops() {
        let layout = ClassLayout::new(1000, 4096, 3 * 4096).unwrap();
        assert_eq!((layout.stride, layout.slots_per_region, layout.max_regions), (1024, 4, 3));
        let class = SizeClass::new(layout);
        let budget = Budget::new(3 * 4096);
        let ctx = GrowCtx { budget: &budget, registrar: &NoopRegistrar, prefault: false };
        assert!(class.try_take().is_none());
        let mut taken = Vec::new();
        loop {
            match class.try_take() {
                Some(e) => taken.push(e),
                None => {
                    if class.grow(ctx, true).unwrap() == Grow::AtCap {
                        break;
                    }
                }
            }
        }
        assert_eq!(taken.len(), 12);
        assert_eq!(class.regions(), 3);
        assert_eq!(class.buffers_in_use(), 12);
        let mut addrs: Vec<usize> = taken
            .iter()
            .map(|&e| {
                let (r, s) = decode(e);
                class.slot_ptr(r, s).as_ptr() as usize
            })
            .collect();
        addrs.sort_unstable();
        addrs.dedup();
        assert_eq!(addrs.len(), 12);
        for e in taken {
            class.put(e);
        }
        assert_eq!((class.buffers_free(), class.buffers_in_use()), (12, 0));
        assert_eq!(class.wait(ctx, Some(Instant::now())).unwrap().map(|_| ()), Some(()));
    }
}
