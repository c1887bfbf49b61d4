//! Reading frames on the receiving thread itself.
//!
//! A backend whose read path any thread may drive (a TCP socket, a CQ)
//! installs it with [`Driver::install_source`]. A thread in
//! [`crate::Link::recv`] with nothing delivered then reads it itself, when
//! no other thread is reading it, instead of waiting for the engine to
//! hand a message over: one thread wake-up less per message, and the
//! kernel wakes the very thread that will use the data. While it receives,
//! it claims the source ([`Driver::reader_claimed`]) and the engine leaves
//! the reading to it; otherwise the engine reads (credits, goodbyes and
//! data for a busy application still arrive).

use std::os::fd::AsFd;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, Mutex, TryLockError, Weak};
use std::time::Instant;

use crate::interrupt::{CreditWait, Interrupt};
use crate::ready::Readiness;
use crate::shared::Shared;
use crate::Driver;

/// What a thread that pumps the source, and would wait, waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Awaited {
    /// It does not wait.
    Nothing,
    /// A message for the application.
    Message,
    /// Credit to send a message of this many bytes.
    Credit(u64),
}

/// What one [`Source::pump`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pumped {
    /// At least one frame was handed to the driver.
    Frames,
    /// Nothing arrived before the deadline.
    Idle,
    /// The stream is over (the driver was told: end or failure).
    Done,
}

/// The frames a receiving thread's pump hands over at most (see
/// [`Driver::batch_done`]): the delivery queue's lock-free ring.
pub const BATCH_FRAMES: usize = crate::queue::FAST;

/// The bytes a receiving thread's pump hands over at most, give or take a
/// frame (see [`Driver::batch_done`]): a few KiB-sized messages, which stay
/// in cache until they are read.
pub const BATCH_BYTES: usize = 64 * 1024;

/// A backend's read path, driven by its engine task and by receiving
/// threads.
pub trait Source: Send {
    /// Hand every complete frame that has arrived to `driver`
    /// ([`Driver::on_frame`]), without waiting at a frame boundary once one
    /// was handed over; a source may stop early, keeping the rest for the
    /// next call, once [`Driver::batch_done`] says so. With nothing there,
    /// wait for the next frame until `until` (`None`: do not wait). A
    /// frame that has begun but not wholly arrived stays partial for the
    /// next call: no call waits past `until` for it. After
    /// [`Pumped::Done`], every later call returns `Done` at once.
    fn pump(&mut self, driver: &Driver, until: Option<Instant>) -> Pumped;

    /// The source's descriptor (see [`Driver::set_source_fd`]) was seen
    /// readable since the last pump: the next pump may read it without
    /// asking whether there is anything first.
    fn readable(&mut self) {}
}

pub(crate) type SourceLock = Mutex<Box<dyn Source>>;

/// A descriptor that turns readable whenever a source has something new
/// (data, its end, an error): what an application that reads the source
/// itself waits on (see [`crate::Link::read_directly`]).
pub type SourceFd = Arc<dyn AsFd + Send + Sync>;

/// One descriptor that announces news for the sources of many
/// connections (an RDMA engine's completion channel, shared by the CQs of
/// its connections): what an application that reads those sources itself
/// watches, once for all of them (see [`Driver::set_shared_source`]).
pub trait SharedSource: AsFd + Send + Sync {
    /// Without waiting, raise the [`SourceSignal`] of every source that
    /// the announcements pending on the descriptor concern. Whoever
    /// watches the descriptor calls this on every readiness it takes,
    /// before it forgets that readiness, so nothing that came before is
    /// left behind an edge. The watch is edge-triggered: each new
    /// announcement raises a new edge, whatever is still pending, so an
    /// implementation may leave an announcement on the descriptor that it
    /// has already acted on (its source's signal is raised) and take it
    /// later, off the path to the waiting task.
    fn dispatch(&self);
}

/// How a source that shares its descriptor ([`SharedSource`]) tells its
/// connection that it has something new: the next receive pumps it, and
/// the tasks waiting on a connection that reads directly are woken. Holds
/// the connection weakly.
#[derive(Clone)]
pub struct SourceSignal(Weak<Shared>);

impl std::fmt::Debug for SourceSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SourceSignal")
    }
}

impl SourceSignal {
    /// The source has something new (see the type's docs). A connection
    /// that does not read directly is left to its engine.
    pub fn raise(&self) {
        let Some(shared) = self.0.upgrade() else { return };
        shared.source_hint.store(true, Ordering::Release);
        if let Some(ready) = shared.ready.0.get().filter(|r| r.direct()) {
            ready.delivered_now();
        }
    }
}

impl Driver {
    /// Let receiving threads read through `source` (see the module docs).
    /// The backend's engine task then reads through
    /// [`Driver::try_pump`]. A second call is ignored.
    ///
    /// A thread that waits in such a source's pump wakes every 100 ms to
    /// look around, for a backend whose waits are not woken by everything
    /// that concerns them; [`Driver::install_waking_source`] is for those
    /// that are.
    pub fn install_source(&self, source: Box<dyn Source>) {
        let _ = self.shared.source.0.set(Mutex::new(source));
    }

    /// [`Driver::install_source`] for a source whose pump, waiting until a
    /// deadline, is woken by everything that concerns it: a frame, the end
    /// of the stream, and the shutdown every local failure and close does.
    /// A receiving thread then waits in it for as long as it was asked to,
    /// with no timed wake-up.
    pub fn install_waking_source(&self, source: Box<dyn Source>) {
        self.shared.source_wakes.store(true, Ordering::Relaxed);
        self.install_source(source);
    }

    /// The installed source's wait also watches [`Driver::interrupt`]: a
    /// thread waiting in it for credit then sleeps until its deadline,
    /// woken by a local close; other sources' credit waits go in 100 ms
    /// slices.
    pub fn watches_interrupt(&self) {
        self.shared.interrupt_watched.store(true, Ordering::Relaxed);
    }

    /// The installed source has one descriptor that turns readable
    /// whenever it has something new, so that an application may watch it
    /// and read the source itself (see [`crate::Link::read_directly`]). A
    /// second call is ignored.
    pub fn set_source_fd(&self, fd: SourceFd) {
        let _ = self.shared.source_fd.0.set(fd);
    }

    /// [`Driver::set_source_fd`] for a source whose news many connections'
    /// sources announce on one descriptor: the application watches `fd`
    /// once for all of them, and the source raises [`Driver::signal`] for
    /// its own news. A second call is ignored.
    pub fn set_shared_source(&self, fd: Arc<dyn SharedSource>) {
        let _ = self.shared.shared_source.0.set(fd);
    }

    /// What the source raises when it has something new (see
    /// [`Driver::set_shared_source`]).
    pub fn signal(&self) -> SourceSignal {
        SourceSignal(Arc::downgrade(&self.shared))
    }

    /// Whether the application reads the source itself now (see
    /// [`crate::Link::read_directly`]): the source's pumps then leave it
    /// ready to announce its next news, whoever pumps.
    #[inline]
    pub fn reads_directly(&self) -> bool {
        self.shared.ready.0.get().is_some_and(Readiness::direct)
    }

    /// For a source that reads directly: its pump returned before leaving
    /// it ready to announce its next news (it took frames and did not
    /// re-arm, which would put a system call between them and their
    /// receiver). Whoever looks next pumps it again (the hint of
    /// [`crate::Link::source_readable`]), and that pump, finding it empty,
    /// makes it ready. Wakes no one.
    #[inline]
    pub fn read_again(&self) {
        self.shared.source_hint.store(true, Ordering::Release);
    }

    /// Whether a pump that has handed over `frames` frames of `bytes`
    /// bytes in all (headers and payloads) should return now and leave the
    /// rest (staged, or on the socket) for the next one: a receiving
    /// thread's pump stops once its frames fill the delivery queue's
    /// lock-free ring ([`BATCH_FRAMES`]) or hold [`BATCH_BYTES`], which
    /// that thread takes before it pumps again. A window of thousands of
    /// small messages flows through the ring and never its spill list, and
    /// a window of megabytes of larger ones waits in the kernel's receive
    /// buffer, not in pool buffers: the few a batch fills are still in
    /// cache when the receiver reads them, and go back to the pool for the
    /// next batch. A task that reads directly does the same; what its
    /// batch leaves, no readiness of the descriptor would announce, so the
    /// hint of [`Driver::read_again`] has its next look (a receive, or a
    /// wait for credit) read it. Every other pump takes everything: the
    /// engine's (nobody else may read for the application), a sender's
    /// looking for credit, and a look at the counters.
    #[inline]
    pub fn batch_done(&self, frames: usize, bytes: usize) -> bool {
        let full = frames >= BATCH_FRAMES || bytes >= BATCH_BYTES;
        let done = full && self.shared.batch_pump.load(Ordering::Relaxed);
        if done {
            if self.reads_directly() {
                self.read_again();
            } else {
                // What it leaves is read when the connection is registered
                // for readiness (see `Link::register`).
                self.shared.batch_left.store(true, Ordering::SeqCst);
            }
        }
        done
    }

    /// Pump the installed source from the backend's engine task, unless
    /// another thread is pumping it now (`None`) or no source is installed
    /// (`Some(Pumped::Done)`).
    pub fn try_pump(&self, until: Option<Instant>) -> Option<Pumped> {
        self.pump_as(until, true, Awaited::Nothing)
    }

    /// Pump the source; `background`: from the backend's engine task,
    /// which an application thread that finds it pumping waits for.
    /// `awaited`: what a caller that would wait (`until` set) waits for.
    /// Once the source is locked, what another pump delivered meanwhile is
    /// looked for, and if it is there, the pump does not wait: whoever held
    /// the source may have delivered it between the caller's last look and
    /// this lock, and nothing would then wake the wait.
    /// Inlined into both callers (see [`crate::Link::try_recv`]).
    #[inline(always)]
    pub(crate) fn pump_as(
        &self,
        until: Option<Instant>,
        background: bool,
        awaited: Awaited,
    ) -> Option<Pumped> {
        let Some(src) = self.shared.source.0.get() else { return Some(Pumped::Done) };
        // Raised before the lock is tried, so an application thread that
        // finds the lock taken by this thread also finds the flag up.
        if background {
            self.shared.bg_pumping.store(true, Ordering::SeqCst);
        }
        let locked = match src.try_lock() {
            Ok(s) => Some(s),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        };
        let r = locked.map(|mut s| {
            // A thread about to wait for credit is registered first, then
            // looks: a close after the look rings it (see `interrupt`).
            let _waiting = match awaited {
                Awaited::Credit(_)
                    if until.is_some() && self.shared.interrupt_watched.load(Ordering::Relaxed) =>
                {
                    CreditWait::enter(&self.shared)
                }
                _ => None,
            };
            let until = if until.is_some() && self.already_there(awaited) { None } else { until };
            let batch = !background && awaited == Awaited::Message;
            self.shared.batch_pump.store(batch, Ordering::Relaxed);
            if self.shared.source_hint.load(Ordering::Relaxed)
                && self.shared.source_hint.swap(false, Ordering::AcqRel)
            {
                s.readable();
            }
            s.pump(self, until)
        });
        if background {
            self.shared.bg_pumping.store(false, Ordering::SeqCst);
        } else {
            self.hand_back_engine();
        }
        if r.is_some() && self.reads_directly() {
            self.hand_back_direct();
        }
        r
    }

    /// For an application thread that reads directly, after its pump
    /// found the source held by another thread (the engine at its timer,
    /// another task's pump): the hint stays up for the next look, and that
    /// thread wakes the connection's tasks when it lets go. It may have
    /// looked before the news that sent this one here came, and that news
    /// (an edge, a completion channel's event) is spent: nothing else
    /// would announce it. `false` if it let go meanwhile (pump again).
    pub(crate) fn await_direct_handback(&self) -> bool {
        self.shared.source_hint.store(true, Ordering::Release);
        self.shared.direct_handback.store(true, Ordering::SeqCst);
        self.held_after_raising(&self.shared.direct_handback)
    }

    /// `mine` (a hand-back flag) is raised: whether the source is still
    /// held, by a thread that will see the flag as it lets go. A look that
    /// finds it free takes the flag back (`false`: pump again), and, having
    /// held the source for that look, hands it back as every pump does, to
    /// whoever found it held by the look.
    fn held_after_raising(&self, mine: &AtomicBool) -> bool {
        // Against the holder's fence in `hand_back_direct`: either it sees
        // the flag, or this lock finds the source free.
        fence(Ordering::SeqCst);
        let Some(src) = self.shared.source.0.get() else { return false };
        if matches!(src.try_lock(), Err(TryLockError::WouldBlock)) {
            return true;
        }
        let taken_back = mine.swap(false, Ordering::SeqCst);
        self.hand_back_engine();
        if self.reads_directly() {
            self.hand_back_direct();
        }
        !taken_back
    }

    /// An application thread let go of the source: if the engine found it
    /// taken meanwhile ([`Driver::await_handback`]), it reads again now.
    #[inline]
    fn hand_back_engine(&self) {
        if self.shared.handback.load(Ordering::Relaxed) && self.shared.handback.swap(false, Ordering::SeqCst)
        {
            self.shared.wake_engine();
        }
    }

    /// A pump of a source read directly let go of it: if a reader found it
    /// held meanwhile ([`Driver::await_direct_handback`]), wake the tasks.
    #[inline]
    fn hand_back_direct(&self) {
        fence(Ordering::SeqCst);
        if self.shared.direct_handback.load(Ordering::Relaxed)
            && self.shared.direct_handback.swap(false, Ordering::SeqCst)
        {
            if let Some(ready) = self.shared.ready.0.get() {
                ready.delivered_now();
            }
        }
    }

    /// For a source's wait: what to watch beside its own descriptors, on a
    /// thread that waits for credit (a local close rings it; see
    /// [`Interrupt`]). `None` on other waits.
    pub fn interrupt(&self) -> Option<Interrupt> {
        Interrupt::current()
    }

    /// Whether what a waiting pump would wait for has come already.
    #[inline]
    fn already_there(&self, awaited: Awaited) -> bool {
        match awaited {
            Awaited::Nothing => false,
            Awaited::Message => !self.shared.delivered.is_empty(),
            Awaited::Credit(len) => {
                let st = self.shared.lock();
                !st.credits.is_blocked_for(len) || st.failed.is_some() || st.local_closed
            }
        }
    }

    /// For the engine: whether an application thread receives on this
    /// connection and reads the source itself. The engine then leaves the
    /// reading to it (a receiving thread woken by its own socket needs no
    /// second thread woken beside it) until the application closes, waits
    /// for the end, or stops receiving. What then arrives for it waits in
    /// the socket or CQ; a sender short of credit reads for itself.
    pub fn reader_claimed(&self) -> bool {
        self.shared.claimed.load(Ordering::SeqCst)
    }

    /// For the engine, after [`Driver::try_pump`] found the source taken:
    /// the thread holding it wakes the engine task when it lets go.
    /// `false` if it let go meanwhile (pump again).
    pub fn await_handback(&self) -> bool {
        self.shared.handback.store(true, Ordering::SeqCst);
        self.held_after_raising(&self.shared.handback)
    }
}
