//! The tasks waiting for one thing: each held once, all woken together.

use std::task::Waker;

/// Wakers of the tasks waiting for one event. A task that asks again
/// before it is woken is held once (by [`Waker::will_wake`]). The owner
/// guards it (with the lock of what it waits for).
#[derive(Debug, Default)]
pub struct Wakers(Vec<Waker>);

impl Wakers {
    /// Hold `waker` until the next [`Wakers::take`].
    pub fn add(&mut self, waker: &Waker) {
        if !self.0.iter().any(|w| w.will_wake(waker)) {
            self.0.push(waker.clone());
        }
    }

    /// Whether no task waits.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every waiting task, to be woken (after the owner's lock is let go,
    /// or under it when waking is cheap).
    pub fn take(&mut self) -> impl Iterator<Item = Waker> {
        std::mem::take(&mut self.0).into_iter()
    }

    /// Wake every waiting task now, keeping the set's allocation for the
    /// next ones (under the owner's lock: for wakers that only schedule).
    pub fn wake_all(&mut self) {
        self.0.drain(..).for_each(Waker::wake);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::WakeCount;

    #[test]
    fn a_task_asking_twice_is_held_once_and_woken_once() {
        let (count, w) = WakeCount::new();
        let mut set = Wakers::default();
        set.add(&w);
        set.add(&w);
        set.take().for_each(Waker::wake);
        assert_eq!(count.get(), 1);
        assert!(set.is_empty());
    }
}
