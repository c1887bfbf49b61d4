//! A bounded queue between threads that costs one lock-free push and one
//! lock-free pop per item when nobody sleeps on it.
//!
//! A channel with built-in blocking (crossbeam's, std's) checks for
//! sleeping threads on both ends of every item. Here only the consumer
//! can sleep, and a producer looks for sleepers with one load after a
//! fence. The link's two hot queues, frames for the writer and messages
//! for the application, go through it.
//!
//! No wake-up is lost: a consumer counts itself in `sleepers` and then
//! looks at the queue once more before it sleeps (under `lock`); a
//! producer pushes, fences, then reads `sleepers`. With both orders
//! sequentially consistent, either the consumer's second look finds the
//! item or the producer sees the sleeper, and notifies it under the lock
//! the sleeper holds until it waits.

use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Instant;

use crossbeam_queue::ArrayQueue;
use crossbeam_utils::Backoff;

/// Why [`Queue::push`] handed the item back.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum PushError<T> {
    /// The queue holds its capacity.
    Full(T),
    /// The consuming side is gone ([`Queue::close`]).
    Closed(T),
}

/// A bounded multi-producer, multi-consumer queue whose consumers may wait.
#[derive(Debug)]
pub(crate) struct Queue<T> {
    items: ArrayQueue<T>,
    /// Consumers about to sleep, or sleeping, in [`Queue::pop`].
    sleepers: AtomicUsize,
    /// The consumers are gone: pushes fail.
    closed: AtomicBool,
    lock: Mutex<()>,
    cv: Condvar,
}

impl<T> Queue<T> {
    /// A queue of at most `cap` items (at least one).
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            items: ArrayQueue::new(cap.max(1)),
            sleepers: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            lock: Mutex::new(()),
            cv: Condvar::new(),
        }
    }

    /// Add `item` at the back, waking one sleeping consumer.
    pub(crate) fn push(&self, item: T) -> Result<(), PushError<T>> {
        if self.closed.load(Ordering::Acquire) {
            return Err(PushError::Closed(item));
        }
        self.items.push(item).map_err(PushError::Full)?;
        // Orders the push before the read of `sleepers` (see the module docs).
        fence(Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            // Once the lock was free, the sleeper waits (or is gone); the
            // notification goes out after it, so the woken thread does not
            // run into a held lock.
            drop(self.lock.lock().unwrap_or_else(PoisonError::into_inner));
            self.cv.notify_one();
        }
        Ok(())
    }

    /// The front item, if any, without waiting.
    pub(crate) fn try_pop(&self) -> Option<T> {
        self.items.pop()
    }

    /// The front item, waiting for one until `deadline` (`None`: forever).
    /// `None` when the deadline passed with the queue empty.
    pub(crate) fn pop(&self, deadline: Option<Instant>) -> Option<T> {
        // Spin, then yield, a little before sleeping, as crossbeam's
        // channels do: an item that comes within that time costs neither
        // side a system call.
        let backoff = Backoff::new();
        loop {
            if let Some(item) = self.items.pop() {
                return Some(item);
            }
            if backoff.is_completed() {
                break;
            }
            backoff.snooze();
        }
        let mut g = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let item = loop {
            if let Some(item) = self.items.pop() {
                break Some(item);
            }
            g = match deadline {
                None => self.cv.wait(g).unwrap_or_else(PoisonError::into_inner),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        break None;
                    }
                    self.cv.wait_timeout(g, d - now).unwrap_or_else(PoisonError::into_inner).0
                }
            };
        };
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        item
    }

    /// Items queued now.
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether no item is queued now.
    pub(crate) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The consumers are gone: later pushes fail with
    /// [`PushError::Closed`]. Items already queued stay until the queue drops.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::thread;
    use std::time::Duration;

    use super::*;

    #[test]
    fn fifo_bounded_and_closable() {
        let q = Queue::new(2);
        assert_eq!(q.push(1), Ok(()));
        assert_eq!(q.push(2), Ok(()));
        assert_eq!(q.push(3), Err(PushError::Full(3)));
        assert_eq!((q.len(), q.is_empty()), (2, false));
        assert_eq!(q.try_pop(), Some(1));
        assert_eq!(q.pop(None), Some(2));
        assert_eq!(q.try_pop(), None);
        q.close();
        assert_eq!(q.push(4), Err(PushError::Closed(4)));
    }

    #[test]
    fn pop_times_out_at_its_deadline() {
        let q: Queue<u32> = Queue::new(1);
        let t0 = Instant::now();
        assert_eq!(q.pop(Some(t0 + Duration::from_millis(30))), None);
        assert!(t0.elapsed() >= Duration::from_millis(30));
        assert_eq!(q.pop(Some(t0)), None, "a past deadline does not wait");
    }

    /// Two producers, two sleeping consumers, a queue much smaller than
    /// the traffic: every item arrives exactly once, none is stranded.
    #[test]
    fn no_item_is_lost_or_stranded() {
        const PER: u64 = 20_000;
        let q = Arc::new(Queue::new(4));
        let consumers: Vec<_> = (0..2)
            .map(|_| {
                let q = q.clone();
                thread::spawn(move || {
                    let mut got = Vec::new();
                    while let Some(x) = q.pop(Some(Instant::now() + Duration::from_secs(10))) {
                        if x == u64::MAX {
                            break;
                        }
                        got.push(x);
                    }
                    got
                })
            })
            .collect();
        let producers: Vec<_> = (0..2u64)
            .map(|p| {
                let q = q.clone();
                thread::spawn(move || {
                    for i in 0..PER {
                        let mut item = p * PER + i;
                        loop {
                            match q.push(item) {
                                Ok(()) => break,
                                Err(PushError::Full(back)) => {
                                    item = back;
                                    thread::yield_now();
                                }
                                Err(PushError::Closed(_)) => unreachable!("never closed"),
                            }
                        }
                    }
                })
            })
            .collect();
        for p in producers {
            p.join().unwrap();
        }
        for _ in 0..2 {
            while q.push(u64::MAX).is_err() {
                thread::yield_now();
            }
        }
        let mut all: Vec<u64> = consumers.into_iter().flat_map(|c| c.join().unwrap()).collect();
        all.sort_unstable();
        assert_eq!(all, (0..2 * PER).collect::<Vec<_>>());
    }
}
