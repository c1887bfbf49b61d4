//! The engine's thread: wait on epoll, run what is ready, then what was
//! woken, then what is due.

use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use rustix::event::epoll::{self, Event, EventData, EventFlags};
use rustix::event::Timespec;
use rustix::io::Errno;
use slab::Slab;

use super::timers::{Entry, Timers};
use super::{Cx, Inner, Interest, Step, Task, Waker};

/// The epoll token of the engine's own eventfd.
pub(super) const WAKE: u64 = u64::MAX;

/// Readiness reported per `epoll_wait`, at most.
const EVENTS: usize = 256;

/// Rounds of wake-ups from inside a turn that the turn runs itself; past
/// them (tasks that keep waking each other) the eventfd takes the rest to
/// the next turn, so a turn always ends.
pub(super) const LOCAL_ROUNDS: u32 = 16;

std::thread_local! {
    /// The engine whose turn this thread is running (its `Inner`'s
    /// address), if any.
    static TURN_OF: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// Yields left to this turn's writers ([`may_linger`]): refilled at
    /// each turn of an engine on its own thread, never elsewhere.
    static LINGERS: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
}

/// Yields per turn of an engine's own thread that its writers may make.
pub(super) const LINGERS_PER_TURN: u8 = 4;

/// Whether a writer of the turn running on this thread may yield the core
/// once and look at its queue again (each `true` spends one of the turn's
/// [`LINGERS_PER_TURN`]). Only on an engine's own thread: an engine driven
/// by a runtime's task shares its thread with the senders, which a yield
/// of the thread would not let run. A few times per turn: an engine drives
/// thousands of connections, and a turn of many streams should not yield
/// for each.
pub(crate) fn may_linger() -> bool {
    LINGERS.with(|l| match l.get() {
        0 => false,
        n => {
            l.set(n - 1);
            true
        }
    })
}

/// A lingering writer gives its core away, to a sender that shares it.
pub(crate) fn linger_yield() {
    #[cfg(test)]
    if let Some(step) = LINGER_HOOK.with(|h| h.borrow_mut().take()) {
        step();
        return;
    }
    std::thread::yield_now();
}

#[cfg(test)]
std::thread_local! {
    /// What a test runs in a lingering writer's yield, once.
    static LINGER_HOOK: std::cell::RefCell<Option<Box<dyn FnOnce()>>> = const { std::cell::RefCell::new(None) };
}

/// For tests: run `step` in the next lingering writer's yield on this
/// thread, in place of the yield: the moment another thread's sender meets
/// a writer that lingers.
#[cfg(test)]
pub(crate) fn on_linger_yield(step: Box<dyn FnOnce()>) {
    LINGER_HOOK.with(|h| *h.borrow_mut() = Some(step));
}

/// For tests: let this thread's writers linger `n` times, as a turn of an
/// engine's own thread does.
#[cfg(test)]
pub(crate) fn allow_lingers(n: u8) {
    LINGERS.with(|l| l.set(n));
}

/// Whether this thread is inside a turn of the engine `inner`.
pub(super) fn in_turn_of(inner: &Arc<Inner>) -> bool {
    TURN_OF.with(|t| t.get() == Arc::as_ptr(inner) as usize)
}

/// Marks this thread as running a turn of an engine until dropped.
struct InTurn(usize);

impl InTurn {
    fn enter(inner: &Arc<Inner>) -> InTurn {
        InTurn(TURN_OF.with(|t| t.replace(Arc::as_ptr(inner) as usize)))
    }
}

impl Drop for InTurn {
    fn drop(&mut self) {
        TURN_OF.with(|t| t.set(self.0));
    }
}

/// One task and what the engine knows of it.
struct Slot {
    task: Box<dyn Task>,
    token: u64,
    /// The interest its descriptor is registered with (none: not in epoll).
    registered: Interest,
    timer: Option<Instant>,
    /// The last turn it ran because it was woken: a task woken many times
    /// in one turn runs once.
    woken_turn: u64,
    waker: Waker,
}

/// Why a task runs this time.
#[derive(Clone, Copy, Default)]
struct Why {
    ready: Interest,
    hangup: bool,
    woken: bool,
    timer_due: bool,
}

/// The engine's side: its tasks, timers and the loop's state. Owned by
/// whichever thread drives the engine — its own, or another event loop's
/// through [`super::Progress`].
pub(super) struct Runner {
    inner: Arc<Inner>,
    slots: Slab<Slot>,
    timers: Timers,
    /// Generation of the next task, so a token of a task that is gone never
    /// reaches the one that took its slot.
    generation: u32,
    turn: u64,
    spawned: Vec<Box<dyn Task>>,
    /// Swapped with the shared wake-up list every turn, so neither grows
    /// again once warm.
    tokens: Vec<u64>,
}

/// The engine's own thread: turns until no handle and no task is left.
pub(super) fn run(inner: Arc<Inner>) {
    let mut r = Runner::new(inner);
    while !r.finished() {
        LINGERS.with(|l| l.set(LINGERS_PER_TURN));
        let timeout = r.timers.next().map(|at| at.saturating_duration_since(Instant::now()));
        if let Err(e) = r.turn(timeout) {
            tracing::error!(engine = %r.inner.name, error = %e, "epoll_wait failed; the engine stops");
            return;
        }
    }
}

impl Runner {
    pub(super) fn new(inner: Arc<Inner>) -> Runner {
        Runner {
            inner,
            slots: Slab::new(),
            timers: Timers::default(),
            generation: 0,
            turn: 0,
            spawned: Vec::new(),
            tokens: Vec::new(),
        }
    }

    pub(super) fn inner(&self) -> &Inner {
        &self.inner
    }

    /// No handle is left and no task: the engine is over.
    pub(super) fn finished(&self) -> bool {
        self.inner.closing.load(std::sync::atomic::Ordering::SeqCst)
            && self.slots.is_empty()
            && self.no_incoming()
    }

    /// When the earliest timer is due.
    pub(super) fn next_timer(&self) -> Option<Instant> {
        self.timers.next()
    }

    /// Wait for readiness up to `timeout` (`None`: however long), then run
    /// what is ready, what was woken and what is due. How many events the
    /// wait returned (0: it timed out, or was interrupted).
    pub(super) fn turn(&mut self, timeout: Option<std::time::Duration>) -> std::io::Result<usize> {
        let timeout =
            timeout.map(|d| Timespec { tv_sec: d.as_secs() as i64, tv_nsec: i64::from(d.subsec_nanos()) });
        // On the stack, uninitialised (free to make): an event record
        // holds a pointer-sized union, which would keep a runner that held
        // them from moving to another thread, as a detached engine's does.
        let mut events = [std::mem::MaybeUninit::<Event>::uninit(); EVENTS];
        let events: &[Event] = match epoll::wait(&self.inner.epoll, &mut events[..], timeout.as_ref()) {
            Ok((ready, _)) => ready,
            Err(Errno::INTR) => &[],
            Err(e) => return Err(e.into()),
        };
        let n = events.len();
        self.turn += 1;
        let _in_turn = InTurn::enter(&self.inner);
        let now = Instant::now();
        let mut woke = false;
        for &ev in events {
            let token = ev.data.u64();
            if token == WAKE {
                woke = true;
                continue;
            }
            let flags = ev.flags;
            let why = Why {
                ready: Interest {
                    read: flags.contains(EventFlags::IN),
                    write: flags.contains(EventFlags::OUT),
                },
                hangup: flags.intersects(EventFlags::HUP | EventFlags::ERR),
                ..Why::default()
            };
            self.dispatch(token, why, now);
        }
        if woke || self.inner.lock_woken().quiet {
            self.take_wakeups(now);
        }
        while let Some(token) = self.timers.pop_due(now, |token, at| timer_check(&mut self.slots, token, at))
        {
            self.dispatch(token, Why { timer_due: true, ..Why::default() }, now);
        }
        // Tasks woken by the tasks above, as later turns would run them.
        for round in 0..=LOCAL_ROUNDS {
            let mut woken = self.inner.lock_woken();
            if !std::mem::take(&mut woken.local) {
                break;
            }
            if round == LOCAL_ROUNDS {
                // Still waking each other: the next turn goes on.
                self.inner.signal(&mut woken);
                break;
            }
            drop(woken);
            self.turn += 1;
            self.take_wakeups(now);
        }
        Ok(n)
    }
}

fn slot_mut(slots: &mut Slab<Slot>, token: u64) -> Option<&mut Slot> {
    let key = (token & 0xffff_ffff) as usize;
    slots.get_mut(key).filter(|s| s.token == token)
}

/// Whether the heap entry (`token`, `at`) is the task's timer now.
fn timer_check(slots: &mut Slab<Slot>, token: u64, at: Instant) -> Entry {
    let Some(slot) = slot_mut(slots, token) else { return Entry::Stale };
    match slot.timer {
        Some(t) if t <= at => {
            slot.timer = None;
            Entry::Due
        }
        Some(t) => Entry::Moved(t),
        None => Entry::Stale,
    }
}

impl Runner {
    fn no_incoming(&self) -> bool {
        self.inner.incoming.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
    }

    /// Read the eventfd (if it was written), start new tasks, and run
    /// every woken one.
    fn take_wakeups(&mut self, now: Instant) {
        {
            let mut woken = self.inner.lock_woken();
            woken.quiet = false;
            if std::mem::take(&mut woken.signalled) {
                let mut counter = [0u8; 8];
                let _ = rustix::io::read(self.inner.eventfd.as_fd(), &mut counter);
            }
            woken.local = false;
            std::mem::swap(&mut woken.tokens, &mut self.tokens);
        }
        let incoming = std::mem::take(&mut *self.inner.incoming.lock().unwrap_or_else(|p| p.into_inner()));
        for task in incoming {
            self.insert(task, now);
        }
        let mut tokens = std::mem::take(&mut self.tokens);
        for &token in &tokens {
            let turn = self.turn;
            let Some(slot) = self.slot_mut(token) else { continue };
            // Before it runs: a wake-up from here on queues it again.
            slot.waker.queued.store(false, Ordering::SeqCst);
            if slot.woken_turn == turn {
                continue;
            }
            slot.woken_turn = turn;
            self.dispatch(token, Why { woken: true, ..Why::default() }, now);
        }
        tokens.clear();
        self.tokens = tokens;
    }

    fn slot_mut(&mut self, token: u64) -> Option<&mut Slot> {
        slot_mut(&mut self.slots, token)
    }

    /// Add a task and run it once.
    fn insert(&mut self, task: Box<dyn Task>, now: Instant) {
        self.generation = self.generation.wrapping_add(1);
        let entry = self.slots.vacant_entry();
        let token = (u64::from(self.generation) << 32) | entry.key() as u64;
        let waker = Waker { inner: self.inner.clone(), token, queued: Arc::default() };
        entry.insert(Slot {
            task,
            token,
            registered: Interest::default(),
            timer: None,
            woken_turn: 0,
            waker,
        });
        self.dispatch(token, Why { woken: true, ..Why::default() }, now);
    }

    /// Run the task of `token`, then apply what it asked for.
    fn dispatch(&mut self, token: u64, why: Why, now: Instant) {
        let mut why = why;
        loop {
            let Some(slot) = slot_mut(&mut self.slots, token) else { return };
            let Slot { task, registered, timer, waker, .. } = slot;
            let mut cx = Cx {
                ready: why.ready,
                hangup: why.hangup,
                woken: why.woken,
                timer_due: why.timer_due,
                interest: *registered,
                timer: *timer,
                now,
                waker,
                spawned: &mut self.spawned,
            };
            let step = task.run(&mut cx);
            let (interest, new_timer) = (cx.interest, cx.timer);
            match step {
                Step::Continue => {
                    self.apply(token, interest, new_timer);
                    break;
                }
                Step::Done => {
                    self.apply(token, Interest::default(), None);
                    self.slots.remove((token & 0xffff_ffff) as usize);
                    break;
                }
                Step::Replace(next) => {
                    self.apply(token, Interest::default(), None);
                    if let Some(slot) = self.slot_mut(token) {
                        slot.task = next;
                    }
                    why = Why { woken: true, ..Why::default() };
                }
            }
        }
        for task in std::mem::take(&mut self.spawned) {
            self.insert(task, now);
        }
    }

    /// Register the task's descriptor with `interest`, and its timer.
    fn apply(&mut self, token: u64, interest: Interest, timer: Option<Instant>) {
        let epoll = &self.inner.epoll;
        let Some(slot) = slot_mut(&mut self.slots, token) else { return };
        if slot.timer != timer {
            let earlier = matches!((timer, slot.timer), (Some(t), Some(old)) if t < old);
            if let Some(t) = timer.filter(|_| slot.timer.is_none() || earlier) {
                self.timers.push(t, token);
            }
            slot.timer = timer;
        }
        if interest == slot.registered {
            return;
        }
        let Some(fd) = slot.task.fd() else { return };
        let mut flags = EventFlags::RDHUP;
        if interest.read {
            flags |= EventFlags::IN;
        }
        if interest.write {
            flags |= EventFlags::OUT;
        }
        let data = EventData::new_u64(token);
        let none = Interest::default();
        let res = if slot.registered == none {
            epoll::add(epoll, fd, data, flags)
        } else if interest == none {
            epoll::delete(epoll, fd)
        } else {
            epoll::modify(epoll, fd, data, flags)
        };
        match res {
            Ok(()) => slot.registered = interest,
            Err(e) => tracing::warn!(engine = %self.inner.name, error = %e, "epoll_ctl failed"),
        }
    }
}
