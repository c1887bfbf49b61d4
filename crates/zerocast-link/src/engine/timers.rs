//! The engine's timers: a min-heap of (time, task), cleaned lazily.
//!
//! A task has one timer. Setting an earlier one pushes an entry; setting a
//! later one pushes nothing, and the earlier entry, when it comes up, finds
//! the task's timer later and pushes that instead. So a task that moves its
//! timer often (a heartbeat deadline after every frame) keeps one or two
//! entries, not one per move.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

#[derive(Default)]
pub(super) struct Timers {
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
}

impl Timers {
    pub(super) fn push(&mut self, at: Instant, token: u64) {
        self.heap.push(Reverse((at, token)));
    }

    /// The earliest entry's time.
    pub(super) fn next(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((at, _))| *at)
    }

    /// The next entry due by `now` that `check` finds current: `check`
    /// sees every entry popped and says whether its task's timer is that
    /// one ([`Entry`]).
    pub(super) fn pop_due(
        &mut self,
        now: Instant,
        mut check: impl FnMut(u64, Instant) -> Entry,
    ) -> Option<u64> {
        while let Some(&Reverse((at, token))) = self.heap.peek() {
            if at > now {
                return None;
            }
            self.heap.pop();
            match check(token, at) {
                Entry::Due => return Some(token),
                Entry::Moved(later) => self.push(later, token),
                Entry::Stale => {}
            }
        }
        None
    }
}

/// What a popped entry is to its task.
pub(super) enum Entry {
    /// Its timer: run the task.
    Due,
    /// The timer moved to this later time.
    Moved(Instant),
    /// The task has no timer now, or is gone.
    Stale,
}
