//! [`crate::Pool::alloc_or_wake`]: a task that must not block is woken by
//! the release that gives it a buffer, however the buffer comes back.

use std::sync::{Arc, Condvar, Mutex};
use std::task::{Wake, Waker};
use std::thread;
use std::time::Duration;

use crate::cache::tests::{keeper, pool};
use crate::{Buf, PoolError, Wait};

/// Counts its wakes; a test waits for them without sleeping.
#[derive(Default)]
struct Counter {
    wakes: Mutex<usize>,
    cv: Condvar,
}

impl Wake for Counter {
    fn wake(self: Arc<Self>) {
        *self.wakes.lock().unwrap() += 1;
        self.cv.notify_all();
    }
}

impl Counter {
    fn count(&self) -> usize {
        *self.wakes.lock().unwrap()
    }

    /// Wait (at most 10 s) until woken `n` times in all.
    fn until(&self, n: usize) {
        let g = self.wakes.lock().unwrap();
        let (g, _) = self.cv.wait_timeout_while(g, Duration::from_secs(10), |w| *w < n).unwrap();
        assert!(*g >= n, "woken {} times, expected {n}", *g);
    }
}

fn at_cap() -> (crate::Pool, Vec<Buf>) {
    let p = pool();
    let all: Vec<Buf> = (0..1024).map(|_| p.alloc(64, Wait::No).unwrap()).collect();
    (p, all)
}

#[test]
fn a_release_on_this_thread_wakes_the_hook_once() {
    let (p, mut all) = at_cap();
    let c = Arc::new(Counter::default());
    let w = Waker::from(c.clone());
    assert!(matches!(p.alloc_or_wake(64, &w), Err(PoolError::Exhausted { .. })));
    // Registered twice, woken once.
    assert!(matches!(p.alloc_or_wake(64, &w), Err(PoolError::Exhausted { .. })));
    assert_eq!(c.count(), 0, "nothing released yet");
    drop(all.pop());
    c.until(1);
    drop(all.pop());
    assert_eq!(c.count(), 1, "a hook is woken once, then forgotten");
    let a = p.alloc_or_wake(64, &w).expect("the released buffer");
    let b = p.alloc_or_wake(64, &w).expect("the other one");
    assert!(matches!(p.alloc_or_wake(64, &w), Err(PoolError::Exhausted { .. })));
    drop((a, b, all));
    c.until(2);
    let s = p.stats();
    assert_eq!((s.buffers_in_use, s.buffers_free), (0, 1024), "{s:?}");
}

/// A buffer dropped into another thread's cache is announced too: the
/// hook makes such releases go to the shared list.
#[test]
fn a_release_into_another_threads_cache_wakes_the_hook() {
    let (p, mut all) = at_cap();
    let c = Arc::new(Counter::default());
    let w = Waker::from(c.clone());
    assert!(p.alloc_or_wake(64, &w).is_err());
    let (bufs, quit, h) = keeper();
    bufs.send(vec![all.pop().unwrap()]).unwrap();
    c.until(1);
    let got = p.alloc_or_wake(64, &w).expect("the buffer the keeper dropped");
    quit.send(()).unwrap();
    h.join().unwrap();
    drop((got, all));
}

/// Many hooks on one class, from many threads: each is woken by the
/// releases, and each buffer goes to exactly one of them.
#[test]
fn every_hook_is_woken_and_no_buffer_is_lost() {
    let (p, mut all) = at_cap();
    let hooks: Vec<Arc<Counter>> = (0..8).map(|_| Arc::new(Counter::default())).collect();
    let got = thread::scope(|s| {
        let tasks: Vec<_> = hooks
            .iter()
            .map(|c| {
                let p = p.clone();
                let w = Waker::from(c.clone());
                s.spawn(move || loop {
                    let seen = c.count();
                    match p.alloc_or_wake(64, &w) {
                        Ok(b) => return b,
                        Err(PoolError::Exhausted { .. }) => c.until(seen + 1),
                        Err(e) => panic!("{e}"),
                    }
                })
            })
            .collect();
        for _ in 0..8 {
            drop(all.pop());
        }
        tasks.into_iter().map(|t| t.join().unwrap()).collect::<Vec<_>>()
    });
    let mut addrs: Vec<_> = got.iter().map(|b| b.addr()).collect();
    addrs.sort_unstable();
    addrs.dedup();
    assert_eq!(addrs.len(), 8, "eight distinct buffers");
    drop((got, all));
    assert_eq!(p.stats().buffers_in_use, 0);
}
