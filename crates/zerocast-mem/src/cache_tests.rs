//! Tests of the per-thread caches: buffers are never lost to a cache or
//! shared by two holders, and a thread's last cache is forgotten in time.

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
    let more: Vec<Buf> = (0..9).map(|_| p.alloc(64, Wait::For(Duration::from_secs(5))).unwrap()).collect();
    assert!(p.alloc(64, Wait::No).is_err());
    // A waiter is served by a release on a thread with a cache.
    let p2 = p.clone();
    let waiter = thread::spawn(move || p2.alloc(64, Wait::For(Duration::from_secs(10))).map(|b| b.addr()));
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
                    assert!(b.iter().all(|&x| x == mark), "a buffer the owner holds was written by another");
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

/// Two classes taken from and given back to in turn, on one thread:
/// each goes to its own cache (the thread's last one changes every
/// time), and the most recent buffer of each class comes back first.
#[test]
fn a_thread_that_alternates_between_classes_keeps_each_in_its_own_cache() {
    let cfg = PoolConfig::default()
        .with_classes([64, 4096])
        .with_region_size(4 << 20)
        .with_max_bytes(8 << 20)
        .with_prefault(false);
    let p = Pool::unregistered(cfg).unwrap();
    let (small, big) = (p.alloc(64, Wait::No).unwrap(), p.alloc(4096, Wait::No).unwrap());
    let (small_addr, big_addr) = (small.addr(), big.addr());
    drop(small);
    drop(big);
    for _ in 0..100 {
        let s = p.alloc(64, Wait::No).unwrap();
        let b = p.alloc(4096, Wait::No).unwrap();
        assert_eq!((s.capacity(), b.capacity()), (64, 4096));
        assert_eq!((s.addr(), b.addr()), (small_addr, big_addr));
        drop(s);
        drop(b);
    }
    let s = p.stats();
    assert_eq!(s.buffers_in_use, 0, "{s:?}");
}

/// A pool that goes while this thread's last cache is its class's: the
/// next pool's buffers find a cache of their own, and the first pool's
/// memory is not touched (its class is gone).
#[test]
fn a_pool_that_goes_leaves_the_threads_last_cache_behind() {
    let first = pool();
    drop(first.alloc(64, Wait::No).unwrap());
    drop(first);
    let second = pool();
    for _ in 0..10 {
        let held: Vec<Buf> = (0..40).map(|_| second.alloc(64, Wait::No).unwrap()).collect();
        drop(held);
    }
    let s = second.stats();
    assert_eq!((s.buffers_in_use, s.buffers_free), (0, 1024), "{s:?}");
}

thread_local! {
    /// Buffers a thread keeps until it ends: dropped by its thread-local
    /// teardown, before or after the pool's caches go.
    static KEPT: std::cell::RefCell<Vec<Buf>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Buffers dropped while their thread is torn down go back, whether the
/// thread's caches went before them or not.
#[test]
fn buffers_dropped_in_a_threads_teardown_go_back() {
    let p = pool();
    for kept_first in [false, true, false, true] {
        let p2 = p.clone();
        thread::spawn(move || {
            // The order of a thread's thread-local teardown follows the
            // order of their first use: try both, so that the kept
            // buffers go after the thread's caches in one of them.
            if kept_first {
                KEPT.with(|_| ());
            }
            drop(p2.alloc(64, Wait::No).unwrap());
            let mine: Vec<Buf> = (0..50).map(|_| p2.alloc(64, Wait::No).unwrap()).collect();
            KEPT.with(|k| k.borrow_mut().extend(mine));
        })
        .join()
        .unwrap();
        let s = p.stats();
        assert_eq!((s.buffers_in_use, s.buffers_free), (0, 1024), "kept first: {kept_first}, {s:?}");
    }
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
