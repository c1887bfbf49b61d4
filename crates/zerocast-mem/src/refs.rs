//! What keeps a pool's memory alive: one count of references, with no
//! shared counter touched per buffer on the hot path.
//!
//! A [`Buf`](crate::Buf) points at its pool without an `Arc` of its own. A
//! per-buffer `Arc` would put every allocation and every release, on every
//! thread, on one shared cache line: with a sender allocating on one core
//! and a receiver releasing on another, that line moves between them for
//! each message.
//!
//! Instead the pool counts references in [`Refs::count`]:
//! - one for all [`Pool`](crate::Pool) handles together, while any exists;
//! - one for each buffer in use;
//! - the *credit* of each thread cache (see [`crate::cache`]). A cache takes
//!   references from the count [`BATCH`] at a time and spends one per buffer
//!   it hands out. A buffer released into a cache gives its reference back
//!   to that cache's credit, and a cache holding more than `2 × BATCH`
//!   returns `BATCH` of them.
//!
//! Buffers taken or released outside a cache (a class that is not cached, a
//! thread being torn down, the slow paths) move the count by one.
//!
//! When the last handle goes, the pool is *orphaned*. The credit of every
//! cache is taken back, and from then on a released buffer gives its
//! reference straight back to the count. When the count reaches zero, the
//! pool's own strong `Arc` (its keeper) is dropped, and with it the pool.
//! Until then the keeper keeps the pool alive: no handle, and nothing in
//! any cache, holds it then, only the buffers in use.
//!
//! **Invariant:** the count is the handles' one, plus the buffers in use,
//! plus the credit held by caches. Every path that hands a buffer out takes
//! a reference first, and every path that takes one back releases it last,
//! after the buffer's slot is back on a free list.

use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::pool::PoolInner;

/// References a thread cache takes from, or gives back to, the count at
/// once.
pub(crate) const BATCH: usize = 32;

/// A pool's reference count; see the module docs.
pub(crate) struct Refs {
    count: AtomicUsize,
    handles: AtomicUsize,
    orphaned: AtomicBool,
    /// The pool's own strong reference, dropped when `count` reaches zero.
    keeper: Mutex<Option<Arc<PoolInner>>>,
}

impl Refs {
    /// The count of a new pool with one handle.
    pub(crate) fn new() -> Self {
        Self {
            count: AtomicUsize::new(1),
            handles: AtomicUsize::new(1),
            orphaned: AtomicBool::new(false),
            keeper: Mutex::new(None),
        }
    }

    /// Give the pool its keeper, right after it was made.
    pub(crate) fn keep(&self, pool: Arc<PoolInner>) {
        *self.keeper.lock().unwrap_or_else(PoisonError::into_inner) = Some(pool);
    }

    /// Take `n` references. The caller holds one already (a handle, or a
    /// buffer), so the count is not zero.
    pub(crate) fn acquire(&self, n: usize) {
        self.count.fetch_add(n, Ordering::Relaxed);
    }

    /// Whether the last handle has gone: released buffers give their
    /// reference straight back.
    pub(crate) fn orphaned(&self) -> bool {
        self.orphaned.load(Ordering::Acquire)
    }

    /// One more handle (the caller holds one).
    pub(crate) fn add_handle(&self) {
        self.handles.fetch_add(1, Ordering::Relaxed);
    }

    /// A handle went. Returns `true` if it was the last one: the caller
    /// then calls [`orphan`].
    pub(crate) fn drop_handle(&self) -> bool {
        self.handles.fetch_sub(1, Ordering::AcqRel) == 1
    }
}

/// Release `n` references of the pool at `pool`; the last one drops the
/// pool's keeper (and so the pool, unless a thread is briefly upgrading a
/// weak reference to it).
///
/// # Safety
///
/// The caller holds `n` references of this pool (see the module docs), and
/// uses neither them nor `pool` after this call.
pub(crate) unsafe fn release(pool: NonNull<PoolInner>, n: usize) {
    if n == 0 {
        return;
    }
    // SAFETY: the caller's references keep the pool alive until the count
    // says otherwise; the reference made here lives for this statement only.
    let last = unsafe { pool.as_ref() }.refs.count.fetch_sub(n, Ordering::Release) == n;
    if last {
        // Pairs with the releases above: every use of the pool by other
        // holders happened before it goes.
        fence(Ordering::Acquire);
        // SAFETY: the count is zero, so nothing else releases the keeper;
        // the pool is alive until it is dropped, after this statement.
        let keeper =
            unsafe { pool.as_ref() }.refs.keeper.lock().unwrap_or_else(PoisonError::into_inner).take();
        drop(keeper);
    }
}

/// The last handle of `pool` went: take back the credit of every thread
/// cache, so the pool goes with its last buffer, then release the handles'
/// reference. `pool` is the last handle's `Arc`, dropped by the caller after.
pub(crate) fn orphan(pool: &Arc<PoolInner>) {
    // Before the caches are visited: a release into a cache that is visited
    // later, or is being visited, either banks its reference (taken back
    // below) or sees the flag under the cache's lock and gives it back.
    pool.refs.orphaned.store(true, Ordering::SeqCst);
    let credit: usize = pool.classes.iter().map(|c| c.take_credit()).sum();
    // The handles' reference is still held: the count stays above zero here.
    pool.refs.count.fetch_sub(credit, Ordering::Release);
    // SAFETY: the handles' reference is held by the caller (the last handle)
    // and not used after; `pool` itself stays alive through the caller's `Arc`.
    unsafe { release(NonNull::from(&**pool), 1) };
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::thread;

    use crate::cache::tests::pool;
    use crate::{Pool, Wait};

    /// The count of `p`'s pool, less the handles' one.
    fn refs(p: &Pool) -> usize {
        p.inner.refs.count.load(std::sync::atomic::Ordering::Acquire) - 1
    }

    #[test]
    fn a_cache_takes_references_in_batches_and_returns_the_surplus() {
        let p = pool();
        let held: Vec<_> = (0..super::BATCH + 1).map(|_| p.alloc(8, Wait::No).unwrap()).collect();
        // Two batches taken; one batch less one reference spent on buffers,
        // so BATCH - 1 sit in this thread's credit.
        assert_eq!(refs(&p), 2 * super::BATCH);
        drop(held);
        // Every reference is back in the credit: 2 × BATCH is its limit.
        assert_eq!(refs(&p), 2 * super::BATCH);
        for _ in 0..3 {
            let b: Vec<_> = (0..super::BATCH).map(|_| p.alloc(8, Wait::No).unwrap()).collect();
            drop(b);
        }
        assert!(refs(&p) <= 2 * super::BATCH, "the credit stays bounded: {}", refs(&p));
    }

    #[test]
    fn buffers_released_on_other_threads_keep_the_count_exact() {
        let p = pool();
        let before = refs(&p);
        let bufs: Vec<_> = (0..200).map(|_| p.alloc(8, Wait::No).unwrap()).collect();
        // Release on four threads that then exit: their credit goes back.
        let mut it = bufs.into_iter();
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let chunk: Vec<_> = it.by_ref().take(50).collect();
                thread::spawn(move || drop(chunk))
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        // Only this thread's credit is left.
        assert!(refs(&p) <= 2 * super::BATCH, "{} references left", refs(&p));
        assert!(refs(&p) >= before);
        assert_eq!(p.stats().buffers_in_use, 0);
    }

    #[test]
    fn the_pool_goes_with_its_last_buffer_after_the_last_handle() {
        let p = pool();
        let weak = Arc::downgrade(&p.inner);
        let keep = p.alloc(8, Wait::No).unwrap();
        // A second thread's cache banks credit that the orphaning takes back.
        let p2 = p.clone();
        thread::spawn(move || drop(p2.alloc(8, Wait::No).unwrap())).join().unwrap();
        let cached: Vec<_> = (0..10).map(|_| p.alloc(8, Wait::No).unwrap()).collect();
        drop(cached);
        drop(p);
        assert!(weak.upgrade().is_some(), "a buffer in use keeps the pool");
        drop(keep);
        assert!(weak.upgrade().is_none(), "the last buffer took the pool down");
    }

    #[test]
    fn a_live_thread_gives_back_the_last_reference_after_its_credit_was_taken() {
        let p = pool();
        let weak = Arc::downgrade(&p.inner);
        let (to_worker, rx) = std::sync::mpsc::channel::<crate::Buf>();
        let (done_tx, done) = std::sync::mpsc::channel();
        let worker = thread::spawn(move || {
            while let Ok(b) = rx.recv() {
                drop(b);
                done_tx.send(()).unwrap();
            }
        });
        // The worker's cache banks the references of what it releases.
        for _ in 0..5 {
            to_worker.send(p.alloc(8, Wait::No).unwrap()).unwrap();
            done.recv().unwrap();
        }
        let last = p.alloc(8, Wait::No).unwrap();
        drop(p);
        assert!(weak.upgrade().is_some(), "a buffer in use keeps the pool");
        to_worker.send(last).unwrap();
        done.recv().unwrap();
        assert!(weak.upgrade().is_none(), "the last buffer, released into a cache, took the pool down");
        drop(to_worker);
        worker.join().unwrap();
    }
}
