//! Steady-state `alloc` + drop never touches the global allocator.
//!
//! A binary of its own, because it installs a counting `#[global_allocator]`.
//! It counts every thread of the process, so the checks run in one test.

use std::time::Duration;

use zerocast_mem::{CountingAlloc, Pool, PoolConfig, PoolError, Wait};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// Run `f` and count the heap allocations the process makes meanwhile.
fn counted<R>(f: impl FnOnce() -> R) -> (R, usize) {
    CountingAlloc::count(f)
}

#[test]
fn steady_state_alloc_and_free_do_not_touch_the_heap() {
    failing_at_the_cap_does_not_touch_the_heap();
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
    // This thread's buffer caches are made on first use.
    pool.prepare_thread();
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

/// Part of the one test above: the counter sees every thread, so the
/// checks run one after another, not as parallel tests.
fn failing_at_the_cap_does_not_touch_the_heap() {
    let cfg = PoolConfig::default().with_classes([1024]).with_region_size(4096).with_max_bytes(4096);
    let pool = Pool::unregistered(cfg).unwrap();
    let held: Vec<_> = (0..4).map(|_| pool.alloc(1, Wait::No).unwrap()).collect();
    // The counter sees every thread of the process, and a timed wait gives
    // the test harness's own threads time to allocate: an allocation on
    // these paths shows up on every try, a stray one not, so the fewest
    // of a few tries is what the paths cost.
    let fewest = |f: &dyn Fn() -> bool| {
        (0..5).map(|_| counted(f)).fold((true, usize::MAX), |(ok, n), (r, k)| (ok && r, n.min(k)))
    };
    let (exhausted, n1) = fewest(&|| matches!(pool.alloc(1, Wait::No), Err(PoolError::Exhausted { .. })));
    let (timed_out, n2) = fewest(&|| {
        matches!(pool.alloc(1, Wait::For(Duration::from_millis(1))), Err(PoolError::Timeout { .. }))
    });
    assert!(exhausted && timed_out);
    assert_eq!((n1, n2), (0, 0), "heap allocations on the Exhausted / Timeout paths");
    drop(held);
}
