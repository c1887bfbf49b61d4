//! One completion channel for the RC connections of an engine.
//!
//! Every connection's CQ is created on its engine's channel with a
//! [`Notify`] as its context. One engine task reads the channel: it takes
//! every pending event (so none is left behind an edge), acknowledges each
//! at once, and hands it to the CQ's `Notify`, which marks the CQ as no
//! longer armed, rings the thread asleep on it, if one is, and wakes the
//! connection's engine task, if it listens.
//!
//! So a connection holds no descriptor of its own for completions, the
//! engine's poll set does not grow with connections, and a receiving
//! thread sleeps on its own eventfd ([`Interrupt`]), which the close and
//! the pool ring too. One sleeping thread at a time, the *leader*
//! ([`CompHub::lead`]), also watches the channel and hands its events on
//! itself, as the engine would: a completion then wakes a sleeping
//! receiver directly, not through the engine's thread (a wake-up more on
//! its way), and the others still sleep on their own eventfds only, so an
//! event wakes no herd. The engine's reader parks while no one else needs
//! the events (see `channel_watch`).
//!
//! Arming stays with whoever polls the CQ, under one rule: the CQ is marked
//! armed *before* `ibv_req_notify_cq`, so an event that follows the arming
//! at once always clears the mark afterwards.
//!
//! An async runtime watches the channel itself, for the connections its
//! tasks read directly ([`zerocast_link::SharedSource`]): its reactor
//! reports the channel readable, and the dispatch there raises each CQ's
//! [`SourceSignal`], which wakes the receiving task, which polls its CQ.
//! No engine task runs between a completion and the task that uses it.
//!
//! A reader of the channel takes events until none can be left: until
//! every CQ armed on it has had its event taken (the hub counts them), or
//! the channel is empty. An event stranded behind an edge the watcher
//! already spent could only be one of an armed CQ; an event of a CQ armed
//! after the count was read comes after that edge, and raises a new one.
//! So the usual wake (one connection, one event) costs one read, not a
//! second one that finds the channel empty.
//!
//! The runtime's reactor, whose watch is edge-triggered, does not even
//! read that one before the task runs, when the hub counts one armed CQ:
//! the event can only be that CQ's, so the dispatch wakes its task at once
//! and counts the event *owed* to the CQ ([`Notify::fire_ahead`]). The CQ
//! takes what it is owed before it is armed again ([`Notify::arm`]), after
//! its task used the completion (after the reply was posted, in a
//! ping-pong), so the read leaves the path from a completion to its
//! receiver. Nothing is lost by the wait: an owed event raises no edge
//! that anyone waits for, and wakes no one when it is taken (its task was
//! woken for it, and polls again after arming), and a new event raises a
//! new edge, whatever is still queued.

use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use zerocast_link::engine::{Cx, Engine, Interest, Step, Task, Waker};
use zerocast_link::{Interrupt, SharedSource, SourceSignal};

use super::channel_watch::ChannelWatch;
use super::hub::Hub;
use crate::cq::{CompChannel, CompletionQueue};
use crate::device::Context;

/// An engine's completion channel.
pub(crate) struct CompHub {
    channel: Arc<CompChannel>,
    /// The channel, for a runtime that watches it (one per hub: watchers
    /// tell hubs apart by it).
    shared: Arc<ChannelSource>,
    /// The engine's index among its transport's engines.
    engine: usize,
    /// The reading task's, once it ran.
    waker: OnceLock<Waker>,
    /// Who watches the channel: the reader, or a leader, or no one.
    watch: ChannelWatch,
}

/// The leadership of a sleeping thread over its hub's channel; released
/// on drop.
pub(crate) struct Lead<'a>(&'a CompHub);

impl Lead<'_> {
    /// The channel's descriptor, to watch beside the thread's own.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.0.channel.fd()
    }

    /// Take every pending event and hand each on (the leader's own
    /// included: its eventfd is rung like any sleeper's).
    pub(crate) fn dispatch(&self) {
        self.0.dispatch();
    }
}

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        if self.0.watch.unlead() {
            self.0.wake_reader();
        }
    }
}

/// What one CQ's completion events reach.
pub(crate) struct Notify {
    /// An event was asked for (`ibv_req_notify_cq`) and has not come yet.
    armed: AtomicBool,
    /// An event came that the connection's task has not looked at.
    fired: AtomicBool,
    /// The connection's task wants to run at the next event.
    listening: AtomicBool,
    /// The connection's, told of every event (it wakes a task that reads
    /// the CQ directly).
    signal: OnceLock<SourceSignal>,
    task: Mutex<Option<Waker>>,
    /// The thread asleep until the next event, if one is.
    sleeper: Mutex<Option<Interrupt>>,
    /// Events of this CQ left in the channel after it was woken for them
    /// ([`Notify::fire_ahead`]): taken before it is armed again.
    owed: AtomicUsize,
    /// Itself, for the hub to name the CQ armed last.
    me: Weak<Notify>,
    /// Kept until the CQ is gone: the channel's reader lives as long.
    hub: Option<Arc<CompHub>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain data, consistent after every statement.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl CompHub {
    /// A channel of `ctx`, read by a task on `engine` (index `index`).
    pub(crate) fn start(ctx: &Arc<Context>, engine: &Engine, index: usize) -> io::Result<Arc<Self>> {
        let channel = CompChannel::new(ctx)?;
        let hub = Arc::new(Self {
            shared: Arc::new(ChannelSource {
                channel: channel.clone(),
                armed: AtomicUsize::new(0),
                last: Mutex::new(Weak::new()),
            }),
            channel,
            engine: index,
            waker: OnceLock::new(),
            watch: ChannelWatch::default(),
        });
        engine.register(Box::new(Reader(hub.clone())));
        Ok(hub)
    }

    /// A CQ of `depth` entries on this channel, and what its events reach.
    pub(crate) fn cq(
        self: &Arc<Self>,
        ctx: &Arc<Context>,
        depth: usize,
    ) -> io::Result<(Arc<CompletionQueue>, Arc<Notify>)> {
        let notify = Arc::new_cyclic(|me| Notify::new(Some(self.clone()), me.clone()));
        let cq = CompletionQueue::new(ctx, depth, Some(self.channel.clone()), Some(notify.clone()))?;
        Ok((cq, notify))
    }

    /// Take one pending event, if there is one (a test's count of what
    /// the channel holds).
    #[cfg(test)]
    pub(crate) fn take_one(&self) -> bool {
        self.channel.take_event(fire).is_some()
    }

    /// Lead the channel while the calling thread sleeps, unless another
    /// thread does.
    pub(crate) fn lead(&self) -> Option<Lead<'_>> {
        self.watch.lead().then_some(Lead(self))
    }

    /// The channel, for a runtime's reactor to watch.
    pub(crate) fn shared_source(&self) -> Arc<dyn SharedSource> {
        self.shared.clone()
    }

    fn wake_reader(&self) {
        if let Some(w) = self.waker.get() {
            w.wake();
        }
    }

    /// Take every pending event and hand each to its CQ's `Notify` (for
    /// a watcher whose readiness stays while an event is pending).
    fn dispatch(&self) {
        self.shared.take_all();
    }
}

/// An engine's completion channel as a [`SharedSource`].
struct ChannelSource {
    channel: Arc<CompChannel>,
    /// CQs on the channel armed and whose event was not taken yet.
    armed: AtomicUsize,
    /// The CQ read directly that was armed last: the only one armed, when
    /// `armed` is 1 and it is (a CQ not read directly is never named, so
    /// the dispatch then takes the events as any reader does).
    last: Mutex<Weak<Notify>>,
}

impl ChannelSource {
    /// Take every pending event and hand each to its CQ's `Notify`: until
    /// no armed CQ is left without its event, or none is pending (see the
    /// module docs).
    fn take_all(&self) {
        while self.channel.take_event(fire).is_some() && self.armed.load(Ordering::SeqCst) > 0 {}
    }

    /// Take events until `n` is owed none, or none is pending. An empty
    /// channel holds none of `n`'s, whatever it was owed: another reader
    /// took them, or the wake ahead was for an edge whose event another
    /// reader had taken before.
    fn settle(&self, n: &Notify) {
        while n.owed.load(Ordering::SeqCst) > 0 {
            if self.channel.take_event(fire).is_none() {
                n.owed.store(0, Ordering::SeqCst);
            }
        }
    }

    /// The only CQ armed on the channel, if one alone is.
    fn sole_armed(&self) -> Option<Arc<Notify>> {
        if self.armed.load(Ordering::SeqCst) != 1 {
            return None;
        }
        lock(&self.last).upgrade().filter(|n| n.is_armed())
    }
}

/// Hand a taken event to its CQ's `Notify` (`ctx`, the CQ's context).
fn fire(ctx: *mut std::os::raw::c_void) {
    // SAFETY: every CQ on this channel was made by `CompHub::cq` with a
    // `Notify` as its context, which the CQ holds until it is destroyed,
    // and its destruction waits for this event to be acknowledged, after
    // this call.
    let notify = unsafe { &*(ctx as *const Notify) };
    notify.fire();
}

impl std::os::fd::AsFd for ChannelSource {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.channel.fd()
    }
}

impl SharedSource for ChannelSource {
    /// For the runtime's edge-triggered watch: wake the only CQ armed, if
    /// one alone is, and owe it its event; else take every pending event
    /// and hand each to its CQ's `Notify` (see the module docs).
    fn dispatch(&self) {
        if self.sole_armed().is_some_and(|n| n.fire_ahead()) {
            return;
        }
        self.take_all();
    }
}

impl Notify {
    fn new(hub: Option<Arc<CompHub>>, me: Weak<Notify>) -> Self {
        Self {
            owed: AtomicUsize::new(0),
            me,
            armed: AtomicBool::new(false),
            fired: AtomicBool::new(false),
            listening: AtomicBool::new(false),
            signal: OnceLock::new(),
            task: Mutex::new(None),
            sleeper: Mutex::new(None),
            hub,
        }
    }

    /// The index of the engine whose channel announces this CQ.
    pub(crate) fn engine(&self) -> usize {
        self.hub.as_ref().map_or(0, |h| h.engine)
    }

    /// The channel's hub (`None` only in tests).
    pub(crate) fn hub(&self) -> Option<&CompHub> {
        self.hub.as_deref()
    }

    /// Ask for an event at the next completion of `cq` (this `Notify`'s);
    /// `direct`: its connection is read directly (see the module docs).
    pub(crate) fn arm(&self, cq: &CompletionQueue, direct: bool) {
        if let Some(hub) = &self.hub {
            // What the channel still holds for this CQ goes first: an
            // event of the last arming must not pass for this one's.
            if self.owed.load(Ordering::Relaxed) > 0 {
                hub.shared.settle(self);
            }
            // Only a CQ read directly (by a runtime's tasks) is ever woken
            // ahead: the others take no lock shared with the engine's
            // other connections on every arming.
            if direct {
                let mut last = lock(&hub.shared.last);
                if !Weak::ptr_eq(&last, &self.me) {
                    *last = self.me.clone();
                }
            }
        }
        // Marked (and counted) first: the event this arming brings clears
        // the mark after.
        if !self.armed.swap(true, Ordering::SeqCst) {
            self.count_armed(true);
        }
        if let Err(e) = cq.arm() {
            tracing::debug!(error = %e, "ibv_req_notify_cq failed");
        }
    }

    /// Whether an event was asked for and has not come yet: a wait for it
    /// is woken.
    pub(crate) fn is_armed(&self) -> bool {
        self.armed.load(Ordering::SeqCst)
    }

    /// Tell `signal` of every event from now on (see the module docs).
    pub(crate) fn signal_to(&self, signal: SourceSignal) {
        let _ = self.signal.set(signal);
    }

    /// Whether the connection's task wants to run at the next event.
    pub(crate) fn is_listening(&self) -> bool {
        self.listening.load(Ordering::SeqCst)
    }

    /// Whether an event came since the last call (the connection's task).
    pub(crate) fn take_fired(&self) -> bool {
        self.fired.load(Ordering::Relaxed) && self.fired.swap(false, Ordering::SeqCst)
    }

    /// Whether the connection's task (`task`) runs at the next event. A
    /// listening task for which an event came meanwhile is woken at once.
    pub(crate) fn listen(&self, task: &Waker, on: bool) {
        {
            let mut t = lock(&self.task);
            if t.is_none() {
                *t = Some(task.clone());
            }
        }
        let was = self.listening.swap(on, Ordering::SeqCst);
        if let Some(hub) = self.hub.as_ref().filter(|h| h.watch.listening(was, on)) {
            hub.wake_reader();
        }
        if on && self.fired.load(Ordering::SeqCst) {
            task.wake();
        }
    }

    /// `me` sleeps until the next event (`Some`), or no longer (`None`).
    /// A thread that sleeps then tries to lead ([`CompHub::lead`]).
    pub(crate) fn set_sleeper(&self, me: Option<Interrupt>) {
        let mut s = lock(&self.sleeper);
        let was = s.is_some();
        *s = me;
        if let Some(hub) = &self.hub {
            hub.watch.sleeping(was, s.is_some());
        }
    }

    /// Wake the thread asleep until the next event, if one is.
    pub(crate) fn ring_sleeper(&self) {
        if let Some(s) = lock(&self.sleeper).as_ref() {
            s.ring();
        }
    }

    /// An event came (the channel's reader). One this CQ was owed (it was
    /// woken for it before) is only taken.
    fn fire(&self) {
        if self.armed.swap(false, Ordering::SeqCst) {
            self.count_armed(false);
        } else if self.owed.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |o| o.checked_sub(1)).is_ok() {
            return;
        }
        self.woken();
    }

    /// The CQ's event is in the channel, as the only armed CQ's (the
    /// runtime's dispatch, see the module docs): wake whoever waits for
    /// it now, and owe the CQ the event, to take later. `false` if the
    /// event was taken meanwhile (by another reader of the channel).
    fn fire_ahead(&self) -> bool {
        // Owed before the mark goes: a reader that takes the event after
        // finds it owed.
        self.owed.fetch_add(1, Ordering::SeqCst);
        if !self.armed.swap(false, Ordering::SeqCst) {
            let _ = self.owed.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |o| o.checked_sub(1));
            return false;
        }
        self.count_armed(false);
        self.woken();
        true
    }

    /// Tell everyone who waits for this CQ's next event that it came.
    fn woken(&self) {
        self.fired.store(true, Ordering::SeqCst);
        if let Some(signal) = self.signal.get() {
            signal.raise();
        }
        self.ring_sleeper();
        if self.listening.load(Ordering::SeqCst) {
            if let Some(w) = lock(&self.task).as_ref() {
                w.wake();
            }
        }
    }
}

impl Notify {
    /// This CQ is armed (`true`) or its event was taken, in the hub's count.
    fn count_armed(&self, armed: bool) {
        if let Some(hub) = &self.hub {
            match armed {
                true => hub.shared.armed.fetch_add(1, Ordering::SeqCst),
                false => hub.shared.armed.fetch_sub(1, Ordering::SeqCst),
            };
        }
    }
}

impl Drop for Notify {
    fn drop(&mut self) {
        // After the CQ was destroyed, with any event of it that was not
        // taken: it is no longer armed.
        if *self.armed.get_mut() {
            self.count_armed(false);
        }
        // The reader may end if it was the last.
        if let Some(hub) = self.hub.take() {
            hub.watch.listening(*self.listening.get_mut(), false);
            hub.watch.sleeping(self.sleeper.get_mut().is_ok_and(|s| s.is_some()), false);
            hub.retire();
        }
    }
}

impl std::fmt::Debug for Notify {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notify")
            .field("armed", &self.armed)
            .field("fired", &self.fired)
            .field("listening", &self.listening)
            .finish_non_exhaustive()
    }
}

/// Retired (see [`Hub::retire`]) by the transport and by each CQ's
/// `Notify`, after the CQ is destroyed.
impl Hub for CompHub {
    fn reader(&self) -> &OnceLock<Waker> {
        &self.waker
    }
}

/// The engine task that reads the hub's channel.
struct Reader(Arc<CompHub>);

impl Task for Reader {
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.0.channel.fd())
    }

    fn run(&mut self, cx: &mut Cx<'_>) -> Step {
        // Only this task holds the hub: its transport and every CQ on the
        // channel are gone.
        if Hub::reader_alone(&self.0, cx) {
            return Step::Done;
        }
        self.0.dispatch();
        // Parked while no one needs the events; whoever needs them again
        // wakes us.
        let read = self.0.watch.reader_keeps_watching();
        cx.set_interest(Interest { read, write: false });
        Step::Continue
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;
    use std::sync::atomic::AtomicUsize;

    use zerocast_link::engine::Progress;

    use super::*;

    /// A task that counts its runs and hands out its waker.
    struct Counting(Arc<AtomicUsize>, Arc<OnceLock<Waker>>);

    impl Task for Counting {
        fn fd(&self) -> Option<BorrowedFd<'_>> {
            None
        }

        fn run(&mut self, cx: &mut Cx<'_>) -> Step {
            let _ = self.1.set(cx.waker());
            self.0.fetch_add(1, Ordering::SeqCst);
            Step::Continue
        }
    }

    fn runs_after(progress: &mut Progress, runs: &AtomicUsize) -> usize {
        progress.progress();
        runs.load(Ordering::SeqCst)
    }

    #[test]
    fn an_event_reaches_the_task_only_while_it_listens_and_is_never_lost() {
        let (engine, mut progress) = Engine::detached("notify-test").expect("engine");
        let (runs, waker) = (Arc::new(AtomicUsize::new(0)), Arc::new(OnceLock::new()));
        engine.register(Box::new(Counting(runs.clone(), waker.clone())));
        assert_eq!(runs_after(&mut progress, &runs), 1);
        let task = waker.get().expect("the task ran").clone();
        let n = Notify::new(None, Weak::new());

        n.listen(&task, false);
        n.fire();
        assert_eq!(runs_after(&mut progress, &runs), 1, "a task that does not listen is not woken");
        // The event is kept: the task runs as soon as it listens.
        n.listen(&task, true);
        assert_eq!(runs_after(&mut progress, &runs), 2, "an event that came before listening is lost");
        assert!(n.take_fired() && !n.take_fired(), "taken once");

        n.fire();
        assert_eq!(runs_after(&mut progress, &runs), 3, "a listening task is woken by an event");
        assert!(n.take_fired());
        n.listen(&task, true);
        assert_eq!(runs_after(&mut progress, &runs), 3, "no event, no run");
    }

    #[test]
    fn an_event_clears_the_armed_mark_and_rings_the_sleeper() {
        let me = Interrupt::this_thread().expect("an eventfd for this thread");
        let readable = |me: &Interrupt| crate::cm::poll_readable(me.fd().as_raw_fd(), 0).expect("poll");
        let n = Notify::new(None, Weak::new());
        n.armed.store(true, Ordering::SeqCst);
        n.set_sleeper(Some(me.clone()));
        assert!(n.is_armed() && !readable(&me));
        n.fire();
        assert!(!n.is_armed(), "the mark outlived the event");
        assert!(readable(&me), "the sleeper was not rung");
        me.clear();
        n.set_sleeper(None);
        n.fire();
        assert!(!readable(&me), "a thread no longer asleep was rung");
    }
}
