//! A counting global allocator, for tests that prove a loop allocates
//! nothing (feature `counting-alloc`).
//!
//! Install it in a test binary of its own:
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: zerocast_mem::CountingAlloc = zerocast_mem::CountingAlloc;
//! let (_, n) = zerocast_mem::CountingAlloc::count(|| hot_loop());
//! assert_eq!(n, 0);
//! ```
//!
//! It counts allocations on **every** thread while a count is running, so
//! background I/O threads are included.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting allocations while [`CountingAlloc::count`] runs.
#[derive(Debug, Clone, Copy, Default)]
pub struct CountingAlloc;

impl CountingAlloc {
    /// Run `f` and return how many heap allocations (and reallocations)
    /// the whole process made meanwhile. Counts run one at a time.
    pub fn count<R>(f: impl FnOnce() -> R) -> (R, usize) {
        static SERIAL: Mutex<()> = Mutex::new(());
        let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
        let before = ALLOCS.load(Ordering::SeqCst);
        COUNTING.store(true, Ordering::SeqCst);
        let r = f();
        COUNTING.store(false, Ordering::SeqCst);
        (r, ALLOCS.load(Ordering::SeqCst) - before)
    }
}

fn note() {
    if COUNTING.load(Ordering::Relaxed) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees hold; counting touches only atomics,
// which neither allocate nor unwind.
unsafe impl GlobalAlloc for CountingAlloc {
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
        // SAFETY: `ptr` came from `System` with `layout` (every allocation
        // here does); the caller upholds the rest of `realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
}
