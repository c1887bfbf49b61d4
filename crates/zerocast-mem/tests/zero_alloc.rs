//! Steady-state `alloc` + drop never touches the global allocator.
//!
//! A binary of its own, because it installs a counting `#[global_allocator]`.
//! Only allocations made on this test's thread while `COUNTING` is set count.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use zerocast_mem::{Pool, PoolConfig, PoolError, Wait};

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

fn note() {
    // `try_with`: the thread-local may already be gone while a thread exits.
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees hold; the counting itself neither
// allocates (a const-initialized thread-local `Cell` and an atomic) nor unwinds.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: forwarded from our caller, who upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: as in `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: `ptr` was allocated by `System` (all our allocations are),
        // with `layout`; the caller upholds the rest of `realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note();
        // SAFETY: `ptr` was allocated by `System` with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Run `f` and count the heap allocations it makes on this thread.
fn counted<R>(f: impl FnOnce() -> R) -> (R, usize) {
    // One counting window at a time, so the tests (run on parallel threads)
    // don't see each other's counts in the shared counter.
    static SERIAL: Mutex<()> = Mutex::new(());
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let before = ALLOCS.load(Ordering::Relaxed);
    COUNTING.with(|c| c.set(true));
    let r = f();
    COUNTING.with(|c| c.set(false));
    (r, ALLOCS.load(Ordering::Relaxed) - before)
}

#[test]
fn steady_state_alloc_and_free_do_not_touch_the_heap() {
    let cfg = PoolConfig::default()
        .with_classes([512, 8192, 65_536 + 64])
        .with_max_bytes(8 << 20)
        .with_region_size(1 << 20);
    let pool = Pool::unregistered(cfg).unwrap();

    // The counter works: a Vec allocates.
    let (_, n) = counted(|| drop(std::hint::black_box(vec![1u8; 10])));
    assert!(n > 0, "the counting allocator counts nothing");

    // Warm-up: create the regions the loop will need (up to 4 live per class).
    for size in [100, 4000, 60_000] {
        pool.reserve(size, 4).unwrap();
    }
    let warm = pool.stats();

    let sizes = [100usize, 512, 3000, 8192, 60_000, 65_600];
    let ((), n) = counted(|| {
        for i in 0..100_000usize {
            let size = sizes[i % sizes.len()];
            let mut a = pool.alloc(size, Wait::No).unwrap();
            let mut b = pool.alloc(sizes[(i + 1) % sizes.len()], Wait::Forever).unwrap();
            a[0] = i as u8;
            a[size - 1] = !(i as u8);
            b.spare_capacity()[7] = 1;
            b.set_len(8);
            assert_eq!(a[0], i as u8);
            assert_eq!(std::hint::black_box(&*b).len(), 8);
            drop(a);
            drop(b);
        }
    });
    assert_eq!(n, 0, "{n} heap allocations in 100_000 steady-state alloc/free cycles");
    assert_eq!(pool.stats().regions, warm.regions, "the loop should not have grown the pool");
    let s = pool.stats();
    assert_eq!((s.buffers_in_use, s.buffers_free), (0, s.buffers_total));
}

#[test]
fn failing_at_the_cap_does_not_touch_the_heap() {
    let cfg = PoolConfig::default().with_classes([1024]).with_region_size(4096).with_max_bytes(4096);
    let pool = Pool::unregistered(cfg).unwrap();
    let held: Vec<_> = (0..4).map(|_| pool.alloc(1, Wait::No).unwrap()).collect();
    let (exhausted, n1) = counted(|| matches!(pool.alloc(1, Wait::No), Err(PoolError::Exhausted { .. })));
    let (timed_out, n2) = counted(|| {
        matches!(pool.alloc(1, Wait::For(Duration::from_millis(1))), Err(PoolError::Timeout { .. }))
    });
    assert!(exhausted && timed_out);
    assert_eq!((n1, n2), (0, 0), "heap allocations on the Exhausted / Timeout paths");
    drop(held);
}
