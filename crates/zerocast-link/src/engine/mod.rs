//! The progress engine: one thread that drives many connections.
//!
//! An [`Engine`] owns an epoll instance, an eventfd to be woken through,
//! and a timer heap. Work is given to it as [`Task`]s: a connection's read
//! and write paths, a listener, a handshake in progress. A task has at most
//! one file descriptor, which the engine watches with the interest the task
//! asks for; it runs on the engine's thread whenever its descriptor is
//! ready, its timer is due, or another thread wakes it through its
//! [`Waker`]. A task never blocks: it does what can be done now and says
//! what to wait for next.
//!
//! So the number of threads does not depend on the number of connections:
//! a transport runs one engine, and every connection, listener and
//! handshake of it is a task there. A stalled peer costs one small task and
//! a descriptor, never a thread, and never delays another task.
//!
//! Application threads still send and receive on their own threads when
//! they can (see [`crate::Wire`] and [`crate::Source`]); the engine is what
//! moves a connection forward when no application thread does.

mod run;
mod timers;
mod watch;

pub use watch::FdWatch;

#[cfg(test)]
pub(crate) use run::{allow_lingers, on_linger_yield};
pub(crate) use run::{linger_yield, may_linger};

use std::fmt;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rustix::event::{eventfd, EventfdFlags};

/// Work the engine drives. Runs only on the engine's thread, never blocks.
pub trait Task: Send {
    /// The descriptor the engine watches for this task, if any. It must
    /// stay the same for the task's life.
    fn fd(&self) -> Option<BorrowedFd<'_>>;

    /// Make progress: the descriptor is ready, the timer is due, or the
    /// task was woken (see [`Cx`] for which). Say what to wait for next
    /// through `cx` ([`Cx::set_interest`], [`Cx::set_timer`]).
    fn run(&mut self, cx: &mut Cx<'_>) -> Step;
}

/// What a task wants after a run.
pub enum Step {
    /// Keep it; wait for what it asked for.
    Continue,
    /// It is over: stop watching its descriptor and drop it.
    Done,
    /// Swap it for another task on the same descriptor (a handshake that
    /// became a connection, say). The new one runs at once.
    Replace(Box<dyn Task>),
}

impl fmt::Debug for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Step::Continue => "Continue",
            Step::Done => "Done",
            Step::Replace(_) => "Replace",
        })
    }
}

/// Which readiness a task waits for on its descriptor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Interest {
    /// Readable (or end of stream, or an error).
    pub read: bool,
    /// Writable.
    pub write: bool,
}

/// Why a task runs, and where it says what it waits for next.
pub struct Cx<'a> {
    pub(crate) ready: Interest,
    pub(crate) hangup: bool,
    pub(crate) woken: bool,
    pub(crate) timer_due: bool,
    pub(crate) interest: Interest,
    pub(crate) timer: Option<Instant>,
    pub(crate) now: Instant,
    pub(crate) waker: &'a Waker,
    pub(crate) spawned: &'a mut Vec<Box<dyn Task>>,
}

impl fmt::Debug for Cx<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cx")
            .field("ready", &self.ready)
            .field("hangup", &self.hangup)
            .field("woken", &self.woken)
            .field("timer_due", &self.timer_due)
            .finish_non_exhaustive()
    }
}

impl Cx<'_> {
    /// The descriptor is readable (or hung up, or in error).
    pub fn readable(&self) -> bool {
        self.ready.read || self.hangup
    }

    /// The descriptor is writable (or hung up, or in error).
    pub fn writable(&self) -> bool {
        self.ready.write || self.hangup
    }

    /// The task was woken through its [`Waker`].
    pub fn woken(&self) -> bool {
        self.woken
    }

    /// The task's timer is due.
    pub fn timer_due(&self) -> bool {
        self.timer_due
    }

    /// When this run started (one clock read per engine turn).
    pub fn now(&self) -> Instant {
        self.now
    }

    /// The interest the task is registered with now.
    pub fn interest(&self) -> Interest {
        self.interest
    }

    /// Wait for this readiness next (level-triggered: a descriptor that
    /// stays ready runs the task again).
    pub fn set_interest(&mut self, interest: Interest) {
        self.interest = interest;
    }

    /// Run the task at `at` (`None`: no timer). Replaces any earlier timer.
    pub fn set_timer(&mut self, at: Option<Instant>) {
        self.timer = at;
    }

    /// The handle other threads wake this task through.
    pub fn waker(&self) -> Waker {
        self.waker.clone()
    }

    /// Start another task on this engine (a handshake, say); it runs once
    /// this one returns.
    pub fn spawn(&mut self, task: Box<dyn Task>) {
        self.spawned.push(task);
    }
}

/// Wakes one task of an engine from any thread. Cheap to clone; waking a
/// task that is gone does nothing.
#[derive(Clone)]
pub struct Waker {
    inner: Arc<Inner>,
    token: u64,
    /// The task's token is in the engine's batch of wake-ups and it has
    /// not run for it yet: further wake-ups add nothing (so the batch
    /// holds each task once, and never grows past the number of tasks).
    queued: Arc<AtomicBool>,
}

impl fmt::Debug for Waker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Waker").field("engine", &self.inner.name).field("token", &self.token).finish()
    }
}

impl Waker {
    /// Run the task soon on its engine's thread. Wake-ups before it runs
    /// are merged into one run.
    pub fn wake(&self) {
        if self.queued.swap(true, Ordering::SeqCst) {
            return;
        }
        let mut woken = self.inner.lock_woken();
        woken.tokens.push(self.token);
        if run::in_turn_of(&self.inner) {
            // Woken by another task of the same turn: the turn runs it
            // before it ends, with no eventfd write and read.
            woken.local = true;
        } else if let Some(driver) = woken.driver.clone() {
            // A runtime's task drives the engine and waits: wake it as the
            // runtime wakes tasks (a task of the same worker runs it next
            // there), with no eventfd write and read.
            woken.quiet = true;
            drop(woken);
            driver.wake();
        } else {
            self.inner.signal(&mut woken);
        }
    }

    /// The same wake as a [`std::task::Waker`], for what wakes through
    /// one (the pool's [`zerocast_mem::Pool::alloc_or_wake`], say).
    pub fn to_std(&self) -> std::task::Waker {
        std::task::Waker::from(Arc::new(self.clone()))
    }
}

impl std::task::Wake for Waker {
    fn wake(self: Arc<Self>) {
        Waker::wake(&self);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        Waker::wake(self);
    }
}

/// A handle to an engine and its thread. Clones share the engine; its
/// thread ends once the last handle is gone and its last task is done.
#[derive(Clone)]
pub struct Engine {
    handle: Arc<Handle>,
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine").field("name", &self.handle.0.name).finish()
    }
}

/// The last handle's drop tells the thread it may end.
struct Handle(Arc<Inner>);

impl Drop for Handle {
    fn drop(&mut self) {
        self.0.closing.store(true, Ordering::SeqCst);
        let mut woken = self.0.lock_woken();
        self.0.signal(&mut woken);
    }
}

impl Engine {
    /// Start an engine on a thread of its own, named `name`.
    pub fn start(name: &str) -> io::Result<Engine> {
        let inner = Arc::new(Inner::new(name)?);
        let running = inner.clone();
        std::thread::Builder::new().name(name.to_owned()).spawn(move || run::run(running))?;
        Ok(Engine { handle: Arc::new(Handle(inner)) })
    }

    /// An engine with no thread of its own: the caller drives it through
    /// the [`Progress`] returned with it, from its own event loop. Its
    /// tasks run only inside [`Progress::progress`].
    pub fn detached(name: &str) -> io::Result<(Engine, Progress)> {
        let inner = Arc::new(Inner::new(name)?);
        let runner = run::Runner::new(inner.clone());
        Ok((Engine { handle: Arc::new(Handle(inner)) }, Progress { runner }))
    }

    /// Hand `task` to the engine. It runs once soon (so it can say what it
    /// waits for) and then as it asks.
    pub fn register(&self, task: Box<dyn Task>) {
        let inner = &self.handle.0;
        inner.incoming.lock().unwrap_or_else(|p| p.into_inner()).push(task);
        let mut woken = inner.lock_woken();
        inner.signal(&mut woken);
    }

    /// The engine's name (its thread's).
    pub fn name(&self) -> &str {
        &self.handle.0.name
    }
}

/// The driving end of a [`detached`](Engine::detached) engine, for another
/// event loop: one descriptor to wait on, and a `progress`/`arm` pair with
/// the rule of UCX's workers: progress until nothing is left, then arm,
/// and wait on the descriptor only if arming succeeded.
///
/// ```no_run
/// # fn main() -> std::io::Result<()> {
/// use std::time::Instant;
/// let (engine, mut progress) = zerocast_link::engine::Engine::detached("my-loop")?;
/// // … register tasks through `engine` …
/// loop {
///     progress.progress();
///     match progress.arm() {
///         // Nothing pending: wait until the descriptor is readable or the
///         // timer is due (here with poll(2); an async runtime uses its
///         // reactor).
///         Ok(timer) => {
///             let ms = timer.map_or(-1, |t| t.saturating_duration_since(Instant::now()).as_millis() as i32);
///             let fd = progress.fd();
///             let mut fds = [rustix::event::PollFd::new(&fd, rustix::event::PollFlags::IN)];
///             let timeout = (ms >= 0).then(|| rustix::event::Timespec { tv_sec: 0, tv_nsec: i64::from(ms) * 1_000_000 });
///             let _ = rustix::event::poll(&mut fds, timeout.as_ref());
///         }
///         // Work arrived meanwhile: progress again.
///         Err(zerocast_link::engine::Pending) => {}
///     }
///     # break;
/// }
/// # Ok(()) }
/// ```
pub struct Progress {
    runner: run::Runner,
}

/// [`Progress::arm`] failed: work is pending, progress again before waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pending;

impl fmt::Debug for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Progress").field("engine", &self.runner.inner().name).finish_non_exhaustive()
    }
}

impl Progress {
    /// The descriptor to wait on: readable whenever the engine has work
    /// (a task's descriptor is ready or a task was woken). Timers are not
    /// on it: [`Progress::arm`] says when the next is due.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.runner.inner().epoll.as_fd()
    }

    /// Run what is ready now, without waiting: ready descriptors, woken
    /// tasks, due timers. How many readiness events it handled (a busy
    /// loop may call this alone, and never arm).
    pub fn progress(&mut self) -> usize {
        match self.runner.turn(Some(std::time::Duration::ZERO)) {
            Ok(n) => n,
            Err(e) => {
                tracing::error!(engine = %self.runner.inner().name, error = %e, "epoll_wait failed");
                0
            }
        }
    }

    /// Prepare to wait. `Ok` with the time the next timer is due (`None`:
    /// no timer) when nothing is pending: wait on [`Progress::fd`] until
    /// then. `Err(Pending)` while anything is: progress first. So no event
    /// that came before the wait is lost: the descriptor stays readable
    /// while work is pending (every registration is level-triggered).
    pub fn arm(&mut self) -> Result<Option<Instant>, Pending> {
        if self.has_quiet_wakeups() {
            return Err(Pending);
        }
        let next = self.runner.next_timer();
        if next.is_some_and(|t| t <= Instant::now()) {
            return Err(Pending);
        }
        let fd = self.fd();
        let mut fds = [rustix::event::PollFd::new(&fd, rustix::event::PollFlags::IN)];
        let zero = rustix::event::Timespec { tv_sec: 0, tv_nsec: 0 };
        match rustix::event::poll(&mut fds, Some(&zero)) {
            Ok(0) => Ok(next),
            _ => Err(Pending),
        }
    }

    /// Have `waker` (a runtime's task that drives this engine) woken,
    /// instead of the engine's descriptor, when a task of the engine is
    /// woken from outside its turns; `None` to stop. For a task that
    /// waits for the engine: set it before [`Progress::arm`], and look at
    /// [`Progress::has_quiet_wakeups`] whenever woken. A wake-up through a
    /// runtime's waker costs no system call, and a runtime runs the woken
    /// task on the waker's worker, next (tokio does), rather than on another
    /// worker beside the task that woke it.
    pub fn wake_with(&self, waker: Option<&std::task::Waker>) {
        let mut woken = self.runner.inner().lock_woken();
        match (&mut woken.driver, waker) {
            (Some(old), Some(new)) if old.will_wake(new) => {}
            (slot, new) => *slot = new.cloned(),
        }
    }

    /// Whether a task was woken through the waker of
    /// [`Progress::wake_with`] since the last turn: progress.
    pub fn has_quiet_wakeups(&self) -> bool {
        self.runner.inner().lock_woken().quiet
    }

    /// Whether every handle of the engine and every task is gone.
    pub fn is_finished(&self) -> bool {
        self.runner.finished()
    }
}

/// A fixed set of engines that share out the work: each new connection or
/// listener goes to the next, in turn. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Engines {
    all: Arc<[Engine]>,
    next: Arc<std::sync::atomic::AtomicUsize>,
}

impl Engines {
    /// Start `n` engines (at least one), their threads named `name-0`, ….
    pub fn start(name: &str, n: usize) -> io::Result<Engines> {
        let all =
            (0..n.max(1)).map(|i| Engine::start(&format!("{name}-{i}"))).collect::<io::Result<Vec<_>>>()?;
        Ok(Engines { all: all.into(), next: Arc::default() })
    }

    /// `n` engines (at least one) with no threads of their own, and the
    /// [`Progress`] of each, for another event loop to drive (an async
    /// runtime's task per engine, say).
    pub fn detached(name: &str, n: usize) -> io::Result<(Engines, Vec<Progress>)> {
        let (all, progress): (Vec<_>, Vec<_>) = (0..n.max(1))
            .map(|i| Engine::detached(&format!("{name}-{i}")))
            .collect::<io::Result<Vec<_>>>()?
            .into_iter()
            .unzip();
        Ok((Engines { all: all.into(), next: Arc::default() }, progress))
    }

    /// The engine the next piece of work goes to.
    pub fn pick(&self) -> &Engine {
        self.get(self.pick_index())
    }

    /// The index of the engine the next piece of work goes to, for work
    /// that must know which engine it is on (see [`Engines::get`]).
    pub fn pick_index(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % self.all.len()
    }

    /// The engine of index `i` (modulo their number).
    pub fn get(&self, i: usize) -> &Engine {
        &self.all[i % self.all.len()]
    }

    /// How many engines there are (threads they run).
    pub fn len(&self) -> usize {
        self.all.len()
    }

    /// Never: there is at least one engine.
    pub fn is_empty(&self) -> bool {
        self.all.is_empty()
    }
}

/// Wake-ups from other threads, taken by the engine a batch at a time.
#[derive(Default)]
struct Woken {
    tokens: Vec<u64>,
    /// The eventfd was written and the engine has not yet taken the batch.
    signalled: bool,
    /// Tokens were added from inside a turn, without the eventfd: the turn
    /// takes them before it ends.
    local: bool,
    /// Tokens were added from outside a turn through the waiting driver's
    /// waker (see [`Progress::wake_with`]), without the eventfd: the next
    /// turn takes them, and `arm` reports them.
    quiet: bool,
    /// The waker of the runtime's task that drives the engine, once it
    /// handed it over ([`Progress::wake_with`]).
    driver: Option<std::task::Waker>,
}

/// What the engine's thread and its handles share.
struct Inner {
    name: String,
    epoll: OwnedFd,
    eventfd: OwnedFd,
    woken: Mutex<Woken>,
    incoming: Mutex<Vec<Box<dyn Task>>>,
    /// No handle is left: end once no task is.
    closing: AtomicBool,
}

impl Inner {
    fn new(name: &str) -> io::Result<Inner> {
        use rustix::event::epoll;
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        let eventfd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        epoll::add(&epoll, &eventfd, epoll::EventData::new_u64(run::WAKE), epoll::EventFlags::IN)?;
        Ok(Inner {
            name: name.to_owned(),
            epoll,
            eventfd,
            woken: Mutex::new(Woken::default()),
            incoming: Mutex::new(Vec::new()),
            closing: AtomicBool::new(false),
        })
    }

    fn lock_woken(&self) -> std::sync::MutexGuard<'_, Woken> {
        self.woken.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Make the engine's thread look at its wake-ups, unless it was told
    /// already and has not looked yet: one eventfd write per batch.
    fn signal(&self, woken: &mut Woken) {
        if !woken.signalled {
            woken.signalled = true;
            // The counter cannot overflow: the engine reads it to zero
            // before `signalled` goes down again.
            let _ = rustix::io::write(self.eventfd.as_fd(), &1u64.to_ne_bytes());
        }
    }
}

#[cfg(test)]
mod tests;
