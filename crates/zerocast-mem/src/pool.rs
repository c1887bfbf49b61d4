//! [`Pool`]: size classes over registered regions, and the allocation paths.

use std::fmt;
use std::panic::{RefUnwindSafe, UnwindSafe};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::buf::Buf;
use crate::class::{decode, Budget, Entry, Grow, GrowCtx, SizeClass};
use crate::config::PoolConfig;
use crate::error::PoolError;
use crate::refs::Refs;
use crate::registrar::{NoopRegistrar, Registrar};
use crate::stats::PoolStats;

/// What [`Pool::alloc`] does when the class has no free buffer and the pool
/// is at its cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Fail at once with [`PoolError::Exhausted`].
    No,
    /// Wait up to this long for a buffer to be released, then fail with
    /// [`PoolError::Timeout`].
    For(Duration),
    /// Block until a buffer of the class is released.
    Forever,
}

/// A pool of registered buffers in fixed size classes.
///
/// Cheap to clone (an `Arc`); `Send + Sync`. The memory lives until the last
/// clone *and* the last [`Buf`] are gone; then every region is deregistered
/// and unmapped. (A `Buf` keeps the pool alive without an `Arc` of its own:
/// see `refs.rs`.)
pub struct Pool {
    pub(crate) inner: Arc<PoolInner>,
}

impl Clone for Pool {
    fn clone(&self) -> Self {
        self.inner.refs.add_handle();
        Pool { inner: Arc::clone(&self.inner) }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if self.inner.refs.drop_handle() {
            crate::refs::orphan(&self.inner);
        }
    }
}

/// Shared state of a pool. Field order matters: `classes` (and with them the
/// regions and their registrations) drop before `registrar`.
pub(crate) struct PoolInner {
    pub(crate) classes: Box<[SizeClass]>,
    pub(crate) budget: Budget,
    registrar: Arc<dyn Registrar>,
    cfg: PoolConfig,
    /// What keeps the pool alive while buffers are in use (see `refs.rs`).
    pub(crate) refs: Refs,
    /// This pool, for thread caches (which must not keep it alive).
    pub(crate) me: Weak<PoolInner>,
}

impl PoolInner {
    fn ctx(&self) -> GrowCtx<'_> {
        GrowCtx { budget: &self.budget, registrar: &*self.registrar, prefault: self.cfg.prefault }
    }

    /// Grow class `idx` by a region. A failed growth gave its reserved bytes
    /// back, so waiters of every class get a chance to use them.
    fn grow(&self, idx: usize, only_if_empty: bool) -> Result<Grow, PoolError> {
        self.classes[idx].grow(self.ctx(), only_if_empty).inspect_err(|_| self.wake_all())
    }

    fn wake_all(&self) {
        for c in self.classes.iter() {
            c.wake_all();
        }
    }
}

impl Pool {
    /// A pool whose regions are registered through `registrar`.
    ///
    /// Validates `cfg` and allocates each class's free list (see
    /// [`PoolConfig::max_bytes`]); maps no region yet. Regions are created on
    /// demand by [`alloc`](Self::alloc), or ahead of time by
    /// [`reserve`](Self::reserve).
    pub fn new(cfg: PoolConfig, registrar: Arc<dyn Registrar>) -> Result<Pool, PoolError> {
        let layouts = cfg.layouts()?;
        let classes = layouts.into_iter().map(SizeClass::new).collect();
        tracing::debug!(classes = ?cfg.classes, max_bytes = cfg.max_bytes, registrar = registrar.name(), "pool created");
        let inner = Arc::new_cyclic(|me| PoolInner {
            classes,
            budget: Budget::new(cfg.max_bytes),
            registrar,
            cfg,
            refs: Refs::new(),
            me: me.clone(),
        });
        inner.refs.keep(Arc::clone(&inner));
        Ok(Pool { inner })
    }

    /// A pool of plain host memory ([`NoopRegistrar`]), for TCP and in-process transports.
    pub fn unregistered(cfg: PoolConfig) -> Result<Pool, PoolError> {
        Self::new(cfg, Arc::new(NoopRegistrar))
    }

    /// A buffer of `len() == size` from the smallest class that holds `size`
    /// bytes (`capacity()` is that class's size). Its contents are whatever
    /// the previous user left, not zeroed.
    ///
    /// Takes a free buffer lock-free and without touching the heap. If the
    /// class has none, maps and registers one more region (under the class's
    /// growth lock) unless that would pass [`PoolConfig::max_bytes`]; at the
    /// cap, does what `wait` says.
    ///
    /// # Errors
    ///
    /// [`PoolError::TooLarge`] if `size > max_buf_size()`;
    /// [`PoolError::Exhausted`] / [`PoolError::Timeout`] at the cap;
    /// [`PoolError::Register`] / [`PoolError::Alloc`] if a new region could
    /// not be made (the pool is unchanged and stays usable).
    #[inline]
    pub fn alloc(&self, size: usize, wait: Wait) -> Result<Buf, PoolError> {
        let idx = self.class_index(size)?;
        // Either way, the buffer's reference of the pool is taken with it.
        let entry = match crate::cache::take(&self.inner, idx) {
            Some(e) => e,
            None => self.alloc_slow(idx, wait)?,
        };
        let (region, slot) = decode(entry);
        // `idx < classes.len() <= u32::MAX` (validated).
        Ok(Buf::new(&self.inner, idx as u32, region, slot, size))
    }

    /// A buffer of `size` bytes now, without waiting; or, at the cap,
    /// [`PoolError::Exhausted`], and `waker` is woken once when a buffer of
    /// that class may have come free (one is released, or the class can
    /// grow again). For a task that must not block, such as an event
    /// loop's: it tries again when woken, and needs no timer to look.
    /// Wakes can be spurious (another thread may take the buffer first).
    ///
    /// # Errors
    ///
    /// As [`Pool::alloc`] with [`Wait::No`].
    #[inline]
    pub fn alloc_or_wake(&self, size: usize, waker: &std::task::Waker) -> Result<Buf, PoolError> {
        let got = self.alloc(size, Wait::No);
        if matches!(got, Err(PoolError::Exhausted { .. })) {
            return self.alloc_after_wake(size, waker);
        }
        got
    }

    /// [`Pool::alloc_or_wake`] at the cap: ask to be woken, then look once
    /// more.
    #[cold]
    fn alloc_after_wake(&self, size: usize, waker: &std::task::Waker) -> Result<Buf, PoolError> {
        let idx = self.class_index(size)?;
        self.inner.classes[idx].wake_on_release(waker);
        // Released before the hook was in: found now.
        self.alloc(size, Wait::No)
    }

    /// [`Pool::alloc`] when the thread's cache and the class's free list are
    /// empty. The entry comes with its reference of the pool.
    #[cold]
    fn alloc_slow(&self, idx: usize, wait: Wait) -> Result<Entry, PoolError> {
        let inner = &*self.inner;
        let referenced = |e: Entry| {
            inner.refs.acquire(1);
            e
        };
        let class = &inner.classes[idx];
        while inner.grow(idx, true)? == Grow::Ready {
            if let Some(e) = crate::cache::take(&self.inner, idx) {
                return Ok(e);
            }
        }
        let cap = inner.budget.cap;
        // Free buffers may sit in other threads' caches.
        class.drain_caches();
        if let Some(e) = class.try_take() {
            return Ok(referenced(e));
        }
        let (deadline, start) = match wait {
            Wait::No => return Err(PoolError::Exhausted { cap }),
            Wait::For(d) => {
                let start = Instant::now();
                // A deadline past `Instant`'s range is as good as forever.
                (start.checked_add(d), Some(start))
            }
            Wait::Forever => (None, None),
        };
        match class.wait(inner.ctx(), deadline) {
            Ok(Some(e)) => Ok(referenced(e)),
            Ok(None) => {
                Err(PoolError::Timeout { waited: start.map(|s| s.elapsed()).unwrap_or_default(), cap })
            }
            Err(e) => {
                inner.wake_all();
                Err(e)
            }
        }
    }

    #[inline(always)]
    fn class_index(&self, size: usize) -> Result<usize, PoolError> {
        self.inner
            .classes
            .iter()
            .position(|c| c.layout.size >= size)
            .ok_or_else(|| PoolError::TooLarge { requested: size, max: self.max_buf_size() })
    }

    /// Set up the calling thread's buffer caches (one per size class) now.
    ///
    /// Each thread that allocates or releases buffers keeps a few free ones
    /// of each class, so the hot path stays off the shared free lists. A
    /// cache is created on the thread's first use of its class, which
    /// allocates once; an I/O thread calls this when it starts, so that its
    /// first message does not.
    pub fn prepare_thread(&self) {
        crate::cache::prepare(&self.inner);
    }

    /// The largest size [`alloc`](Self::alloc) serves: the largest class.
    pub fn max_buf_size(&self) -> usize {
        self.inner.classes.last().map_or(0, |c| c.layout.size)
    }

    /// The capacity of the buffer that `alloc(size, _)` would return, or
    /// `None` if `size` is too large.
    pub fn class_for(&self, size: usize) -> Option<usize> {
        self.class_index(size).ok().map(|i| self.inner.classes[i].layout.size)
    }

    /// Grow ahead of time so that at least `count` buffers of the class that
    /// serves `size` are free, e.g. before pre-posting `count` receive
    /// buffers. Buffers already free count; buffers in use do not.
    ///
    /// # Errors
    ///
    /// [`PoolError::TooLarge`] as for `alloc`; [`PoolError::Exhausted`] if
    /// the cap cannot hold that many (checked first, so normally nothing is
    /// mapped then; if concurrent growth gets in the way, regions made so far
    /// stay); [`PoolError::Register`] / [`PoolError::Alloc`] if a region could
    /// not be made.
    pub fn reserve(&self, size: usize, count: usize) -> Result<(), PoolError> {
        let idx = self.class_index(size)?;
        let inner = &*self.inner;
        let class = &inner.classes[idx];
        let l = class.layout;
        let cap = inner.budget.cap;
        let free = class.buffers_free();
        if free >= count {
            return Ok(());
        }
        let regions = (count - free).div_ceil(l.slots_per_region);
        if class.regions().saturating_add(regions) > l.max_regions
            || inner
                .budget
                .reserved
                .load(std::sync::atomic::Ordering::Acquire)
                .saturating_add(regions.saturating_mul(l.region_bytes))
                > cap
        {
            return Err(PoolError::Exhausted { cap });
        }
        while class.buffers_free() < count {
            if inner.grow(idx, false)? == Grow::AtCap {
                return Err(PoolError::Exhausted { cap });
            }
        }
        Ok(())
    }

    /// A snapshot of the pool's counters.
    pub fn stats(&self) -> PoolStats {
        self.inner.classes.iter().fold(PoolStats::default(), |mut s, c| {
            // One reading of each counter, so that a class's free and in-use
            // figures add up to its total even while buffers move.
            let regions = c.regions();
            let total = regions * c.layout.slots_per_region;
            let in_use = c.buffers_in_use();
            s.regions += regions;
            s.bytes += regions * c.layout.region_bytes;
            s.buffers_total += total;
            s.buffers_free += total.saturating_sub(in_use);
            s.buffers_in_use += in_use;
            s
        })
    }

    /// The registrar's name, such as `"noop"` or `"rxe0"`.
    pub fn registrar_name(&self) -> &str {
        self.inner.registrar.name()
    }

    /// The configuration the pool was built with.
    pub fn config(&self) -> &PoolConfig {
        &self.inner.cfg
    }
}

// The pool stays consistent if a panic (say, in a `Registrar`) unwinds
// through it: its locks tolerate poisoning, a failed growth gives its bytes
// back, and the hot paths cannot panic between their steps.
impl UnwindSafe for Pool {}
impl RefUnwindSafe for Pool {}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("registrar", &self.registrar_name())
            .field("classes", &self.inner.cfg.classes)
            .field("max_bytes", &self.inner.cfg.max_bytes)
            .field("stats", &self.stats())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    fn tiny() -> PoolConfig {
        // 256-byte class: 16 per 4 KiB region; 2048-byte class: 2 per region.
        PoolConfig::default()
            .with_classes([256, 2048])
            .with_region_size(4096)
            .with_max_bytes(3 * 4096)
            .with_prefault(false)
    }

    #[test]
    fn picks_smallest_class() {
        let p = Pool::unregistered(tiny()).unwrap();
        assert_eq!(p.class_for(0), Some(256));
        assert_eq!(p.class_for(256), Some(256));
        assert_eq!(p.class_for(257), Some(2048));
        assert_eq!(p.class_for(2049), None);
        assert_eq!(p.max_buf_size(), 2048);
        let b = p.alloc(300, Wait::No).unwrap();
        assert_eq!((b.len(), b.capacity()), (300, 2048));
        match p.alloc(2049, Wait::No) {
            Err(PoolError::TooLarge { requested: 2049, max: 2048 }) => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(p.registrar_name(), "noop");
        assert!(format!("{p:?}").contains("noop"));
    }

    #[test]
    fn exhausted_at_cap_and_recovers() {
        let p = Pool::unregistered(tiny()).unwrap();
        let bufs: Vec<_> = (0..6).map(|_| p.alloc(2000, Wait::No).unwrap()).collect();
        let s = p.stats();
        assert_eq!(
            (s.regions, s.bytes, s.buffers_total, s.buffers_in_use, s.buffers_free),
            (3, 3 * 4096, 6, 6, 0)
        );
        let e = p.alloc(2000, Wait::No).unwrap_err();
        assert!(matches!(e, PoolError::Exhausted { cap: 12288 }), "{e:?}");
        // The other class cannot grow either: the cap is shared.
        assert!(matches!(p.alloc(1, Wait::No), Err(PoolError::Exhausted { .. })));
        drop(bufs);
        let s = p.stats();
        assert_eq!((s.buffers_free, s.buffers_in_use), (6, 0));
        p.alloc(2000, Wait::No).unwrap();
    }

    #[test]
    fn timeout_then_wakeup() {
        let p = Pool::unregistered(tiny().with_max_bytes(4096)).unwrap();
        let a = p.alloc(2000, Wait::No).unwrap();
        let _b = p.alloc(2000, Wait::No).unwrap();
        let t0 = Instant::now();
        match p.alloc(2000, Wait::For(Duration::from_millis(30))) {
            Err(PoolError::Timeout { waited, cap: 4096 }) => {
                assert!(waited >= Duration::from_millis(30))
            }
            other => panic!("{other:?}"),
        }
        assert!(t0.elapsed() >= Duration::from_millis(30));
        let (p2, a_addr) = (p.clone(), a.addr());
        let waiter = thread::spawn(move || p2.alloc(2000, Wait::Forever).map(|b| b.addr()));
        let timed = {
            let p3 = p.clone();
            thread::spawn(move || p3.alloc(1500, Wait::For(Duration::from_secs(30))).map(|b| b.addr()))
        };
        thread::sleep(Duration::from_millis(50));
        drop(a);
        // One release serves one waiter; its drop then serves the other.
        assert_eq!(waiter.join().unwrap().unwrap(), a_addr);
        assert_eq!(timed.join().unwrap().unwrap(), a_addr);
        assert_eq!(p.stats().buffers_in_use, 1);
    }

    #[test]
    fn reserve_grows_ahead() {
        let p = Pool::unregistered(tiny()).unwrap();
        p.reserve(100, 0).unwrap();
        assert_eq!(p.stats().regions, 0);
        p.reserve(100, 17).unwrap();
        let s = p.stats();
        assert_eq!((s.regions, s.buffers_total, s.buffers_free), (2, 32, 32));
        p.reserve(100, 32).unwrap();
        assert_eq!(p.stats().regions, 2);
        // 49 buffers would need a 4th region: refused up front, nothing mapped.
        assert!(matches!(p.reserve(100, 49), Err(PoolError::Exhausted { .. })));
        assert_eq!(p.stats().regions, 2);
        assert!(matches!(p.reserve(5000, 1), Err(PoolError::TooLarge { .. })));
        // In-use buffers do not count as reserved.
        let held: Vec<_> = (0..32).map(|_| p.alloc(1, Wait::No).unwrap()).collect();
        p.reserve(1, 1).unwrap();
        assert_eq!(p.stats().regions, 3);
        drop(held);
    }

    #[test]
    fn stats_add_up_while_buffers_move() {
        let p = Pool::unregistered(tiny()).unwrap();
        p.reserve(100, 48).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let churn = {
            let (p, stop) = (p.clone(), stop.clone());
            thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let held: Vec<_> = (0..40).map(|_| p.alloc(100, Wait::No).unwrap()).collect();
                    drop(held);
                }
            })
        };
        for _ in 0..20_000 {
            let s = p.stats();
            assert_eq!(s.buffers_free + s.buffers_in_use, s.buffers_total, "{s:?}");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        churn.join().unwrap();
        let s = p.stats();
        assert_eq!((s.buffers_free, s.buffers_in_use, s.buffers_total), (48, 0, 48));
    }

    #[test]
    fn wait_for_huge_duration_does_not_overflow() {
        let p = Pool::unregistered(tiny()).unwrap();
        let b = p.alloc(1, Wait::For(Duration::MAX)).unwrap();
        assert_eq!(b.len(), 1);
    }

    #[test]
    fn pool_is_send_sync() {
        fn assert_send_sync<T: Send + Sync + Clone + fmt::Debug>() {}
        assert_send_sync::<Pool>();
    }
}
