//! Reading frames on the receiving thread itself.
//!
//! A backend whose read path any thread may drive (a TCP socket) installs
//! it with [`Driver::install_source`]. A thread in [`crate::Link::recv`]
//! with nothing delivered then reads the socket itself, when no other
//! thread is reading it, instead of waiting for the backend's reader thread
//! to hand a message over: one thread wake-up less per message, and the
//! kernel wakes the very thread that will use the data. The backend's
//! reader thread stays in charge whenever no application thread is
//! receiving (credits, goodbyes and data for a busy application still
//! arrive), and steps aside while one is ([`Driver::app_reading`]).

use std::sync::atomic::Ordering;
use std::sync::{Mutex, TryLockError};
use std::time::{Duration, Instant};

use crate::Driver;

/// What a thread that pumps the source, and would wait, waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Awaited {
    /// It does not wait.
    Nothing,
    /// A message for the application.
    Message,
    /// Credit to send.
    Credit,
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

/// A backend's read path, driven by its reader thread and by receiving
/// threads.
pub trait Source: Send {
    /// Hand every complete frame that has arrived to `driver`
    /// ([`Driver::on_frame`]), without waiting at a frame boundary once one
    /// was handed over. With nothing there, wait for the next frame until
    /// `until` (`None`: do not wait). A frame that has begun but not wholly
    /// arrived stays partial for the next call: no call waits past `until`
    /// for it. After [`Pumped::Done`], every later call returns `Done` at
    /// once.
    fn pump(&mut self, driver: &Driver, until: Option<Instant>) -> Pumped;
}

pub(crate) type SourceLock = Mutex<Box<dyn Source>>;

impl Driver {
    /// Let receiving threads read through `source` (see the module docs).
    /// The backend's reader thread (or engine task) then reads through
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

    /// Pump the installed source from the backend's reader thread, unless
    /// another thread is pumping it now (`None`) or no source is installed
    /// (`Some(Pumped::Done)`).
    pub fn try_pump(&self, until: Option<Instant>) -> Option<Pumped> {
        self.pump_as(until, true, Awaited::Nothing)
    }

    /// Pump the source; `background`: from the backend's reader thread,
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
        } else {
            // A count for `StepAside` to sample: a plain load and store, as
            // an increment lost to a race between two application threads
            // changes nothing there, and an atomic add costs more.
            let n = self.shared.app_pumps.load(Ordering::Relaxed);
            self.shared.app_pumps.store(n.wrapping_add(1), Ordering::Relaxed);
        }
        let locked = match src.try_lock() {
            Ok(s) => Some(s),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        };
        let r = locked.map(|mut s| {
            let until = if until.is_some() && self.already_there(awaited) { None } else { until };
            s.pump(self, until)
        });
        if background {
            self.shared.bg_pumping.store(false, Ordering::SeqCst);
        } else if self.shared.handback.load(Ordering::Relaxed)
            && self.shared.handback.swap(false, Ordering::SeqCst)
        {
            // The engine found the source taken by this thread: it reads
            // again now.
            self.shared.kick();
        }
        r
    }

    /// Whether what a waiting pump would wait for has come already.
    #[inline]
    fn already_there(&self, awaited: Awaited) -> bool {
        match awaited {
            Awaited::Nothing => false,
            Awaited::Message => !self.shared.delivered.is_empty(),
            Awaited::Credit => {
                let st = self.shared.lock();
                !st.credits.is_blocked() || st.failed.is_some() || st.local_closed
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
        let Some(src) = self.shared.source.0.get() else { return false };
        match src.try_lock() {
            // Free now: whoever held it may have missed the flag.
            Ok(_) | Err(TryLockError::Poisoned(_)) => !self.shared.handback.swap(false, Ordering::SeqCst),
            Err(TryLockError::WouldBlock) => true,
        }
    }

    /// Whether an application thread is reading the source now: the
    /// backend's reader thread should stay out of its way.
    pub fn app_reading(&self) -> bool {
        self.shared.app_readers.load(Ordering::Acquire) > 0
    }

    /// Whether the backend's reader thread is pumping while an application
    /// thread waits to read: a [`Source::pump`] that is waiting for data
    /// (spinning on a completion queue, say) should return
    /// [`Pumped::Idle`] now and let the application thread read.
    pub fn app_waiting(&self) -> bool {
        self.shared.bg_pumping.load(Ordering::Acquire) && self.app_reading()
    }
}

/// How a backend's reader thread stays out of the way of application
/// threads that read: while one is in [`crate::Link::recv`], or busy-polls
/// with `try_recv` (it pumped the source at least [`StepAside::POLLING`]
/// times in the last millisecond or more), the reader thread naps, 1 ms at
/// first and twice as long each time after, up to 16 ms, so it is back
/// within 16 ms once the application stops. An application that calls
/// `try_recv` only now and then does not count: the reader thread keeps
/// taking credits and messages off the wire for it.
#[derive(Debug)]
pub struct StepAside {
    nap: Duration,
    window_start: Instant,
    window_pumps: u64,
    polling: bool,
}

impl StepAside {
    const FIRST: Duration = Duration::from_millis(1);
    const MAX: Duration = Duration::from_millis(16);
    const WINDOW: Duration = Duration::from_millis(1);
    /// Application pumps per window that mean a `try_recv` loop.
    pub const POLLING: u64 = 16;

    /// Manners for one reader thread.
    pub fn new() -> Self {
        Self { nap: Self::FIRST, window_start: Instant::now(), window_pumps: 0, polling: false }
    }

    /// If an application thread reads, nap and return `true`; else return
    /// `false` at once: the reader thread may pump.
    pub fn nap_if_app_reads(&mut self, driver: &Driver) -> bool {
        let now = Instant::now();
        if now.duration_since(self.window_start) >= Self::WINDOW {
            let pumps = driver.shared.app_pumps.load(Ordering::Relaxed);
            self.polling = pumps.wrapping_sub(self.window_pumps) >= Self::POLLING;
            self.window_start = now;
            self.window_pumps = pumps;
        }
        if !(self.polling || driver.app_reading()) {
            self.nap = Self::FIRST;
            return false;
        }
        std::thread::sleep(self.nap);
        self.nap = (self.nap * 2).min(Self::MAX);
        true
    }

    /// Nap briefly: the source was busy.
    pub fn nap(&self) {
        std::thread::sleep(Self::FIRST);
    }
}

impl Default for StepAside {
    fn default() -> Self {
        Self::new()
    }
}

/// Marks an application thread as reading while it lives.
pub(crate) struct AppReading<'a>(pub(crate) &'a std::sync::atomic::AtomicUsize);

impl<'a> AppReading<'a> {
    pub(crate) fn enter(n: &'a std::sync::atomic::AtomicUsize) -> Self {
        n.fetch_add(1, Ordering::AcqRel);
        Self(n)
    }
}

impl Drop for AppReading<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
