//! Who must watch an engine's completion channel, as pure state: the
//! engine's reader only while someone needs it.
//!
//! An event is needed by a connection's task that listens, and by a thread
//! asleep until its CQ's next event. The *leader* (one sleeping thread at a
//! time) watches the channel itself and hands on every event, its own and
//! the other sleepers'. So the engine's reader is needed while a task
//! listens, or while a thread sleeps and no leader watches; otherwise it
//! parks (stops watching), and the engine's thread is not woken for events
//! no one needs: a receiving thread that sleeps on its own connection, its
//! task not listening, is then the only thread an event wakes.
//!
//! Whoever makes the reader needed again unparks it: a task that starts
//! to listen, and a leader that leaves while other threads sleep. Every
//! change and every look is sequentially consistent, and the reader parks
//! before its last look, so of a parking reader and an unparking change
//! one always sees the other.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};

/// The watchers of one completion channel.
#[derive(Debug, Default)]
pub(crate) struct ChannelWatch {
    /// Connection tasks listening for their CQ's events.
    listeners: AtomicUsize,
    /// Threads registered asleep until their CQ's next event.
    sleepers: AtomicUsize,
    /// A sleeping thread watches the channel.
    led: AtomicBool,
    /// The engine's reader does not watch the channel.
    parked: AtomicBool,
}

impl ChannelWatch {
    fn reader_needed(&self) -> bool {
        self.listeners.load(SeqCst) > 0 || (self.sleepers.load(SeqCst) > 0 && !self.led.load(SeqCst))
    }

    /// The reader, after draining the channel: whether it keeps watching
    /// (`false`: it parks until [`ChannelWatch::unpark`] says to wake it).
    pub(crate) fn reader_keeps_watching(&self) -> bool {
        if self.reader_needed() {
            return true;
        }
        self.parked.store(true, SeqCst);
        if self.reader_needed() {
            self.parked.store(false, SeqCst);
            return true;
        }
        false
    }

    /// The reader is needed now: whether it was parked and must be woken.
    fn unpark(&self) -> bool {
        self.parked.load(SeqCst) && self.parked.swap(false, SeqCst)
    }

    /// A task stops or starts listening (`was` → `now`): whether to wake
    /// the reader.
    pub(crate) fn listening(&self, was: bool, now: bool) -> bool {
        match (was, now) {
            (false, true) => {
                self.listeners.fetch_add(1, SeqCst);
                self.unpark()
            }
            (true, false) => {
                self.listeners.fetch_sub(1, SeqCst);
                false
            }
            _ => false,
        }
    }

    /// A thread registers as asleep (`was` → `now`), before it tries to
    /// lead: a leader that watches already covers it, else it leads.
    pub(crate) fn sleeping(&self, was: bool, now: bool) {
        match (was, now) {
            (false, true) => self.sleepers.fetch_add(1, SeqCst),
            (true, false) => self.sleepers.fetch_sub(1, SeqCst),
            _ => 0,
        };
    }

    /// A sleeping thread asks to lead: whether it does.
    pub(crate) fn lead(&self) -> bool {
        !self.led.load(SeqCst) && !self.led.swap(true, SeqCst)
    }

    /// The leader wakes, still registered as asleep: whether to wake the
    /// reader, for the other threads that sleep.
    pub(crate) fn unlead(&self) -> bool {
        self.led.store(false, SeqCst);
        self.sleepers.load(SeqCst) > 1 && self.unpark()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reader_parks_while_a_leader_covers_the_only_sleeper() {
        let w = ChannelWatch::default();
        assert!(!w.reader_keeps_watching(), "no one needs events: parked");
        w.sleeping(false, true);
        assert!(w.lead(), "the first sleeper leads");
        assert!(!w.lead(), "one leader at a time");
        assert!(!w.reader_keeps_watching(), "the leader covers the sleepers");
        assert!(!w.unlead(), "the last sleeper leaving wakes no one");
        w.sleeping(true, false);
        assert!(!w.reader_keeps_watching());
    }

    #[test]
    fn a_listening_task_unparks_the_reader_once() {
        let w = ChannelWatch::default();
        assert!(!w.reader_keeps_watching());
        assert!(w.listening(false, true), "the parked reader is woken");
        assert!(!w.listening(true, true), "no change, no wake");
        assert!(w.reader_keeps_watching(), "a task listens");
        assert!(!w.listening(true, false));
        assert!(!w.reader_keeps_watching(), "parked again");
        assert!(w.listening(false, true));
    }

    #[test]
    fn a_leader_leaving_other_sleepers_unparks_the_reader() {
        let w = ChannelWatch::default();
        w.sleeping(false, true);
        assert!(w.lead());
        w.sleeping(false, true);
        assert!(!w.lead(), "the second sleeper follows");
        assert!(!w.reader_keeps_watching(), "the leader covers both");
        assert!(w.unlead(), "the follower is left without a watcher: wake the reader");
        assert!(w.reader_keeps_watching(), "a sleeper and no leader");
        assert!(!w.unlead(), "the reader was not parked: nothing to wake");
    }

    #[test]
    fn a_reader_that_parks_sees_a_listener_that_came_meanwhile() {
        let w = ChannelWatch::default();
        // The reader found no one, and parks; a task listens before its
        // last look: it sees the reader parked and wakes it, or the
        // reader sees the task; here, the task came after the park.
        w.parked.store(true, SeqCst);
        assert!(w.listening(false, true), "the park is seen");
        assert!(w.reader_keeps_watching());
    }
}
