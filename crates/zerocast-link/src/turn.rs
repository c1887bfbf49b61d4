//! [`TurnLock`]: a lock whose waiters honour a deadline, for what one
//! thread at a time drives (a datagram socket's receive side, say):
//! `std`'s `Mutex` cannot be waited for with a timeout, and spinning on
//! `try_lock` with naps wakes the waiter for nothing. A task that finds
//! the turn taken has its waker kept ([`TurnLock::wake_when_free`]) and
//! woken when the turn is passed on.

use std::ops::{Deref, DerefMut};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::task::Waker;
use std::time::Instant;

use crate::Wakers;

/// A value that threads take turns at, waiting until a deadline.
#[derive(Debug, Default)]
pub struct TurnLock<T> {
    turn: Mutex<Turns>,
    freed: Condvar,
    /// Locked only by the holder of the turn, so never waited for.
    value: Mutex<T>,
}

#[derive(Debug, Default)]
struct Turns {
    busy: bool,
    /// Threads waiting for the turn: the holder notifies only if there are.
    waiting: u32,
    /// Tasks to wake when the turn is passed on.
    tasks: Wakers,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves its data consistent (single steps):
    // a poisoned lock is still usable.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<T> TurnLock<T> {
    /// A lock around `value`, its turn free.
    pub fn new(value: T) -> Self {
        Self { turn: Mutex::default(), freed: Condvar::new(), value: Mutex::new(value) }
    }

    /// Wait for the turn until `deadline` (`None`: however long). `None` if
    /// the deadline passed first (a past deadline does not wait).
    pub fn lock(&self, deadline: Option<Instant>) -> Option<TurnGuard<'_, T>> {
        let mut t = lock(&self.turn);
        while t.busy {
            let left = match deadline {
                None => None,
                Some(d) => Some(d.checked_duration_since(Instant::now()).filter(|l| !l.is_zero())?),
            };
            t.waiting += 1;
            t = match left {
                None => self.freed.wait(t).unwrap_or_else(PoisonError::into_inner),
                Some(l) => self.freed.wait_timeout(t, l).unwrap_or_else(PoisonError::into_inner).0,
            };
            t.waiting -= 1;
        }
        t.busy = true;
        drop(t);
        Some(TurnGuard { owner: self, value: Some(lock(&self.value)) })
    }

    /// For a task that found the turn taken ([`TurnLock::try_lock`]): have
    /// `waker` woken when the turn is passed on. `false` if it is free
    /// already (try again now). Registered under the turn's lock, which its
    /// holder takes to pass it on, so the wake cannot be missed.
    pub fn wake_when_free(&self, waker: &Waker) -> bool {
        let mut t = lock(&self.turn);
        if t.busy {
            t.tasks.add(waker);
        }
        t.busy
    }

    /// Take the turn if nobody holds it.
    pub fn try_lock(&self) -> Option<TurnGuard<'_, T>> {
        let mut t = lock(&self.turn);
        if t.busy {
            return None;
        }
        t.busy = true;
        drop(t);
        Some(TurnGuard { owner: self, value: Some(lock(&self.value)) })
    }
}

/// The turn at a [`TurnLock`]'s value; dropping it passes the turn on.
#[derive(Debug)]
pub struct TurnGuard<'a, T> {
    owner: &'a TurnLock<T>,
    value: Option<MutexGuard<'a, T>>,
}

impl<T> Deref for TurnGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.value.as_deref().expect("held until drop")
    }
}

impl<T> DerefMut for TurnGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.value.as_deref_mut().expect("held until drop")
    }
}

impl<T> Drop for TurnGuard<'_, T> {
    fn drop(&mut self) {
        // The value first: the next holder locks it at once.
        drop(self.value.take());
        let mut t = lock(&self.owner.turn);
        t.busy = false;
        let waiting = t.waiting > 0;
        // A wake only schedules a task: done under the lock, which keeps
        // the set's allocation.
        t.tasks.wake_all();
        drop(t);
        if waiting {
            self.owner.freed.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[test]
    fn one_turn_at_a_time_and_deadlines_are_kept() {
        let l = TurnLock::new(0u32);
        let mut t = l.lock(None).unwrap();
        *t += 1;
        assert!(l.try_lock().is_none());
        let start = Instant::now();
        assert!(l.lock(Some(start + Duration::from_millis(30))).is_none());
        assert!(start.elapsed() >= Duration::from_millis(30));
        assert!(l.lock(Some(start)).is_none(), "a past deadline does not wait");
        drop(t);
        assert_eq!(*l.try_lock().expect("free again"), 1, "the value is kept");
    }

    #[test]
    fn a_task_that_found_the_turn_taken_is_woken_when_it_is_passed_on() {
        let (woken, waker) = crate::WakeCount::new();
        let count = || woken.get();
        let l = TurnLock::new(());
        assert!(!l.wake_when_free(&waker), "free: try again now");
        let t = l.try_lock().expect("free");
        assert!(l.try_lock().is_none());
        assert!(l.wake_when_free(&waker), "taken: kept");
        assert_eq!(count(), 0);
        drop(t);
        assert_eq!(count(), 1, "woken when the turn was passed on");
        drop(l.try_lock().expect("free again"));
        assert_eq!(count(), 1, "woken once, for that turn only");
    }

    #[test]
    fn a_waiter_gets_the_turn_when_it_is_passed_on() {
        let l = Arc::new(TurnLock::new(Vec::new()));
        let mut t = l.lock(None).unwrap();
        let (entered_tx, entered) = std::sync::mpsc::channel();
        let waiters: Vec<_> = (0..4)
            .map(|i| {
                let l = Arc::clone(&l);
                let entered_tx = entered_tx.clone();
                std::thread::spawn(move || {
                    entered_tx.send(()).unwrap();
                    let mut t = l.lock(Some(Instant::now() + Duration::from_secs(10))).expect("the turn");
                    t.push(i);
                })
            })
            .collect();
        for _ in 0..4 {
            entered.recv().unwrap();
        }
        t.push(99);
        drop(t);
        for w in waiters {
            w.join().unwrap();
        }
        let mut v = l.try_lock().unwrap().clone();
        v.sort_unstable();
        assert_eq!(v, [0, 1, 2, 3, 99], "each waiter had its turn, once");
    }
}
