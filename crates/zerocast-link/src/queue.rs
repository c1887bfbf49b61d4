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
//!
//! Memory follows use, not the bound: the first [`FAST`] items live in a
//! lock-free ring allocated up front; beyond that, items queue in a spill
//! list behind it, which grows only while a backlog lasts (and keeps its
//! allocation for the next one). A connection with a window of thousands
//! of small messages costs no more than one of 64 until it uses it. While
//! the spill holds items, every push goes there, so the ring's items are
//! always older than the spill's and each producer's items stay in order.

use std::collections::VecDeque;
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

/// Items held in the lock-free ring; more go to the spill list.
pub(crate) const FAST: usize = 64;

/// A bounded multi-producer, multi-consumer queue whose consumers may wait.
#[derive(Debug)]
pub(crate) struct Queue<T> {
    items: ArrayQueue<T>,
    /// Items behind the ring's, in order (see the module docs).
    spill: Mutex<VecDeque<T>>,
    /// Items in `spill`: while nonzero, pushes go there.
    spilled: AtomicUsize,
    /// Most items queued at once.
    cap: usize,
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
        let cap = cap.max(1);
        Self {
            items: ArrayQueue::new(cap.min(FAST)),
            spill: Mutex::new(VecDeque::new()),
            spilled: AtomicUsize::new(0),
            cap,
            sleepers: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            lock: Mutex::new(()),
            cv: Condvar::new(),
        }
    }

    /// Add `item` at the back, waking one sleeping consumer.
    #[inline(always)]
    pub(crate) fn push(&self, item: T) -> Result<(), PushError<T>> {
        self.push_unwoken(item)?;
        self.wake(false);
        Ok(())
    }

    /// Add `item` at the back and wake no one: for a producer that pushes
    /// several in a row, then calls [`Queue::wake`] once for them all.
    /// A consumer sleeping meanwhile sleeps until that call.
    #[inline(always)]
    pub(crate) fn push_unwoken(&self, item: T) -> Result<(), PushError<T>> {
        if self.closed.load(Ordering::Acquire) {
            return Err(PushError::Closed(item));
        }
        let item =
            if self.spilled.load(Ordering::Acquire) == 0 { self.items.push(item).err() } else { Some(item) };
        if let Some(item) = item {
            self.push_spill(item)?;
        }
        Ok(())
    }

    /// Wake one consumer sleeping on items pushed before (`all`: every
    /// one, for several items).
    #[inline(always)]
    pub(crate) fn wake(&self, all: bool) {
        // Orders the pushes before the read of `sleepers` (see the module docs).
        fence(Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            // Once the lock was free, the sleeper waits (or is gone); the
            // notification goes out after it, so the woken thread does not
            // run into a held lock.
            drop(self.lock.lock().unwrap_or_else(PoisonError::into_inner));
            if all {
                self.cv.notify_all();
            } else {
                self.cv.notify_one();
            }
        }
    }

    /// Queue `item` behind the ring (full, or already behind a spill).
    #[cold]
    fn push_spill(&self, item: T) -> Result<(), PushError<T>> {
        let mut spill = self.spill.lock().unwrap_or_else(PoisonError::into_inner);
        if self.items.len() + spill.len() >= self.cap {
            return Err(PushError::Full(item));
        }
        spill.push_back(item);
        self.spilled.store(spill.len(), Ordering::Release);
        Ok(())
    }

    /// The front item, if any, without waiting.
    #[inline]
    pub(crate) fn try_pop(&self) -> Option<T> {
        match self.items.pop() {
            Some(item) => Some(item),
            None if self.spilled.load(Ordering::Acquire) > 0 => self.pop_spill(),
            None => None,
        }
    }

    /// For a consumer that found the ring empty and then the spill holding
    /// items: the oldest item. That is the ring's, if a producer filled it
    /// between the two looks (and then spilled), else the spill's front.
    /// The items behind the spill's front move into the ring while it has
    /// room, so the next pops take no lock: they are older than what stays
    /// in the spill, and no producer adds to the ring while the spill
    /// holds items.
    #[cold]
    fn pop_spill(&self) -> Option<T> {
        let mut spill = self.spill.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(item) = self.items.pop() {
            return Some(item);
        }
        let item = spill.pop_front();
        while let Some(next) = spill.pop_front() {
            if let Err(back) = self.items.push(next) {
                spill.push_front(back);
                break;
            }
        }
        self.spilled.store(spill.len(), Ordering::Release);
        item
    }

    /// The front item, waiting for one until `deadline` (`None`: forever).
    /// `None` when the deadline passed with the queue empty.
    pub(crate) fn pop(&self, deadline: Option<Instant>) -> Option<T> {
        // Spin, then yield, a little before sleeping, as crossbeam's
        // channels do: an item that comes within that time costs neither
        // side a system call.
        let backoff = Backoff::new();
        loop {
            if let Some(item) = self.try_pop() {
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
            if let Some(item) = self.try_pop() {
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
        self.items.len() + self.spilled.load(Ordering::Acquire)
    }

    /// Whether no item is queued now.
    pub(crate) fn is_empty(&self) -> bool {
        self.items.is_empty() && self.spilled.load(Ordering::Acquire) == 0
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
    fn a_queue_past_its_ring_spills_in_order_up_to_its_bound() {
        let cap = FAST * 3 + 5;
        let q = Queue::new(cap);
        for round in 0..3 {
            for i in 0..cap {
                assert_eq!(q.push(i), Ok(()), "round {round}: item {i}");
            }
            assert_eq!(q.push(cap), Err(PushError::Full(cap)));
            assert_eq!(q.len(), cap);
            // Half out, then more in while the spill still holds items:
            // they queue behind it.
            let mut next = 0;
            for _ in 0..cap / 2 {
                assert_eq!(q.try_pop(), Some(next));
                next += 1;
            }
            for i in cap..cap + cap / 2 {
                assert_eq!(q.push(i), Ok(()));
            }
            while let Some(x) = q.try_pop() {
                assert_eq!(x, next, "round {round}: out of order");
                next += 1;
            }
            assert_eq!(next, cap + cap / 2);
            assert!(q.is_empty());
        }
    }

    /// The interleaving a consumer can meet: it finds the ring empty, and
    /// before it looks at the spill a producer fills the ring and spills.
    /// What it takes next is the ring's oldest item, not the spill's.
    #[test]
    fn a_consumer_overtaken_between_its_two_looks_takes_the_oldest() {
        let q = Queue::new(FAST * 2);
        // The consumer's first look: the ring is empty.
        assert_eq!(q.items.pop(), None);
        // The producer fills the ring and spills past it.
        for i in 0..FAST + 3 {
            assert_eq!(q.push(i), Ok(()));
        }
        assert!(q.spilled.load(Ordering::Acquire) > 0);
        // The consumer's second look, at the spill.
        assert_eq!(q.pop_spill(), Some(0), "the spill's front overtook the ring");
        let rest: Vec<usize> = std::iter::from_fn(|| q.try_pop()).collect();
        assert_eq!(rest, (1..FAST + 3).collect::<Vec<_>>());
    }

    #[test]
    fn pop_times_out_at_its_deadline() {
        let q: Queue<u32> = Queue::new(1);
        let t0 = Instant::now();
        assert_eq!(q.pop(Some(t0 + Duration::from_millis(30))), None);
        assert!(t0.elapsed() >= Duration::from_millis(30));
        assert_eq!(q.pop(Some(t0)), None, "a past deadline does not wait");
    }

    #[test]
    fn no_item_is_lost_or_stranded() {
        no_item_is_lost_or_stranded_at(4);
    }

    #[test]
    fn no_item_is_lost_or_stranded_past_the_ring() {
        no_item_is_lost_or_stranded_at(FAST + 3);
    }

    #[test]
    fn no_item_is_lost_or_stranded_when_pushed_in_runs_and_woken_once_a_run() {
        items_pushed_in_runs_of(FAST + 3, 7);
    }

    fn no_item_is_lost_or_stranded_at(cap: usize) {
        items_pushed_in_runs_of(cap, 1);
    }

    /// Two producers, two sleeping consumers, a queue of `cap` much smaller
    /// than the traffic: every item arrives exactly once, none is
    /// stranded, and each consumer sees each producer's items in order.
    /// Producers push in runs of `run` items and wake the consumers once a
    /// run (`Queue::push_unwoken`, `Queue::wake`), as a frame batch does.
    fn items_pushed_in_runs_of(cap: usize, run: u64) {
        const PER: u64 = 20_000;
        let q = Arc::new(Queue::new(cap));
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
                            let pushed = if run == 1 { q.push(item) } else { q.push_unwoken(item) };
                            match pushed {
                                Ok(()) => break,
                                Err(PushError::Full(back)) => {
                                    item = back;
                                    q.wake(true);
                                    thread::yield_now();
                                }
                                Err(PushError::Closed(_)) => unreachable!("never closed"),
                            }
                        }
                        if run > 1 && (i % run == run - 1 || i == PER - 1) {
                            q.wake(true);
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
        let got: Vec<Vec<u64>> = consumers.into_iter().map(|c| c.join().unwrap()).collect();
        for items in &got {
            for p in 0..2 {
                let mine: Vec<u64> = items.iter().copied().filter(|x| x / PER == p).collect();
                assert!(mine.windows(2).all(|w| w[0] < w[1]), "producer {p}'s items out of order");
            }
        }
        let mut all: Vec<u64> = got.into_iter().flatten().collect();
        all.sort_unstable();
        assert_eq!(all, (0..2 * PER).collect::<Vec<_>>());
    }
}
