//! A value that one side produces once and a task awaits: how an engine
//! task that runs a handshake hands its connection to the `async` caller
//! that started it, with no thread waiting in between.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

struct Slot<T> {
    value: Option<T>,
    waker: Option<Waker>,
    /// The producing side is gone, with or without a value.
    closed: bool,
    /// The awaiting side is gone: a value would be dropped.
    abandoned: bool,
}

/// A new pair: the [`Complete`] end for the producer, the [`Completion`]
/// future for the task.
pub fn completion<T>() -> (Complete<T>, Completion<T>) {
    let slot = Arc::new(Mutex::new(Slot { value: None, waker: None, closed: false, abandoned: false }));
    (Complete(slot.clone()), Completion(slot))
}

fn lock<T>(slot: &Mutex<Slot<T>>) -> MutexGuard<'_, Slot<T>> {
    // Every update is a single field store: consistent after a panic.
    slot.lock().unwrap_or_else(|p| p.into_inner())
}

/// The producing end. Dropping it without [`Complete::complete`] ends the
/// [`Completion`] with `None`.
pub struct Complete<T>(Arc<Mutex<Slot<T>>>);

impl<T> std::fmt::Debug for Complete<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Complete")
    }
}

impl<T> Complete<T> {
    /// Hand `value` over. `Err(value)` when the awaiting side is gone (the
    /// caller's future was dropped), so the producer can undo its work.
    pub fn complete(self, value: T) -> Result<(), T> {
        let mut slot = lock(&self.0);
        if slot.abandoned {
            return Err(value);
        }
        slot.value = Some(value);
        Ok(())
        // `Drop` closes the slot and wakes the task.
    }

    /// Whether the awaiting side is gone.
    pub fn is_abandoned(&self) -> bool {
        lock(&self.0).abandoned
    }
}

impl<T> Drop for Complete<T> {
    fn drop(&mut self) {
        let waker = {
            let mut slot = lock(&self.0);
            slot.closed = true;
            slot.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// The awaiting end: `Some(value)`, or `None` if the producer went away
/// without one.
pub struct Completion<T>(Arc<Mutex<Slot<T>>>);

impl<T> std::fmt::Debug for Completion<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Completion")
    }
}

impl<T> Future for Completion<T> {
    type Output = Option<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut slot = lock(&self.0);
        if let Some(v) = slot.value.take() {
            return Poll::Ready(Some(v));
        }
        if slot.closed {
            return Poll::Ready(None);
        }
        if !slot.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            slot.waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

impl<T> Drop for Completion<T> {
    fn drop(&mut self) {
        // A value already handed over is dropped with the slot.
        let value = {
            let mut slot = lock(&self.0);
            slot.abandoned = true;
            slot.value.take()
        };
        drop(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::WakeCount;

    fn poll<T>(c: &mut Completion<T>, w: &Waker) -> Poll<Option<T>> {
        Pin::new(c).poll(&mut Context::from_waker(w))
    }

    #[test]
    fn a_value_wakes_the_task_once_and_is_taken() {
        let (count, w) = WakeCount::new();
        let (tx, mut rx) = completion();
        assert!(poll(&mut rx, &w).is_pending());
        assert!(tx.complete(5).is_ok());
        assert_eq!(count.get(), 1);
        assert_eq!(poll(&mut rx, &w), Poll::Ready(Some(5)));
    }

    #[test]
    fn a_dropped_producer_ends_with_none_and_a_dropped_future_refuses_the_value() {
        let (_, w) = WakeCount::new();
        let (tx, mut rx) = completion::<u8>();
        drop(tx);
        assert_eq!(poll(&mut rx, &w), Poll::Ready(None));
        let (tx, rx) = completion();
        drop(rx);
        assert!(tx.is_abandoned());
        assert_eq!(tx.complete(7), Err(7), "handed back to undo");
    }
}
