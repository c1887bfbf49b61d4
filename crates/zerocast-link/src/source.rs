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
use std::sync::{Mutex, OnceLock, TryLockError};
use std::time::Instant;

use crate::Driver;

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
    /// `until` (`None`: do not wait). A frame that has begun is read to its
    /// end. After [`Pumped::Done`], every later call returns `Done` at once.
    fn pump(&mut self, driver: &Driver, until: Option<Instant>) -> Pumped;
}

pub(crate) type SourceLock = Mutex<Box<dyn Source>>;

/// Where a link keeps its source once the backend installs it.
#[derive(Default)]
pub(crate) struct SourceCell(pub(crate) OnceLock<SourceLock>);

impl std::fmt::Debug for SourceCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() { "SourceCell(installed)" } else { "SourceCell(none)" })
    }
}

impl Driver {
    /// Let receiving threads read through `source` (see the module docs).
    /// The backend's reader thread then reads through [`Driver::try_pump`].
    /// A second call is ignored.
    pub fn install_source(&self, source: Box<dyn Source>) {
        let _ = self.shared.source.0.set(Mutex::new(source));
    }

    /// Pump the installed source from the backend's reader thread, unless
    /// another thread is pumping it now (`None`) or no source is installed
    /// (`Some(Pumped::Done)`).
    pub fn try_pump(&self, until: Option<Instant>) -> Option<Pumped> {
        self.pump_as(until, true)
    }

    /// Pump the source; `background`: from the backend's reader thread,
    /// which an application thread that finds it pumping waits for.
    pub(crate) fn pump_as(&self, until: Option<Instant>, background: bool) -> Option<Pumped> {
        let Some(src) = self.shared.source.0.get() else { return Some(Pumped::Done) };
        // Raised before the lock is tried, so an application thread that
        // finds the lock taken by this thread also finds the flag up.
        if background {
            self.shared.bg_pumping.store(true, Ordering::SeqCst);
        }
        let r = match src.try_lock() {
            Ok(mut s) => Some(s.pump(self, until)),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner().pump(self, until)),
            Err(TryLockError::WouldBlock) => None,
        };
        if background {
            self.shared.bg_pumping.store(false, Ordering::SeqCst);
        }
        r
    }

    /// Whether an application thread is reading the source now: the
    /// backend's reader thread should stay out of its way.
    pub fn app_reading(&self) -> bool {
        self.shared.app_readers.load(Ordering::Acquire) > 0
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
