//! Waking a thread that waits in a source's pump for credit, when what
//! ends its wait is nothing the source announces: a local close of the
//! sending side while the peer stalls (a TCP socket stays silent).
//!
//! Each thread that ever waits for credit in a pump gets one eventfd of
//! its own, made the first time. While it holds a connection's source and
//! waits for credit, that connection knows it ([`Shared::credit_sleeper`]);
//! [`crate::Link::close`] rings it. The source's wait watches it beside its
//! own descriptors ([`crate::Driver::interrupt`]). Registration comes
//! before the pump looks at the state for the last time, and the close
//! sets the state before it looks for a sleeper, both under locks, so one
//! of them sees the other. A ring that comes after the wait ended leaves
//! the thread's next wait to return early once, which every caller of a
//! pump handles (it looks again and pumps again).
//!
//! A backend may use the same eventfd for its own waits
//! ([`Interrupt::this_thread`]): an RC connection registers the thread
//! asleep until its CQ's next completion event, which its engine's
//! completion channel reader rings, as do the connection's close and the
//! pool when a buffer it waits for comes back, so the connection needs no
//! descriptor of its own.

use std::cell::{Cell, OnceCell};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, MutexGuard};

use rustix::event::{eventfd, EventfdFlags};

use crate::shared::Shared;

/// One thread's eventfd.
#[derive(Debug)]
pub(crate) struct Sleeper {
    fd: OwnedFd,
}

impl Sleeper {
    /// Wake the thread's wait.
    pub(crate) fn ring(&self) {
        // A full counter (after 2^64 - 2 rings) still reads as readable.
        let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
    }
}

thread_local! {
    /// This thread's sleeper, once it needed one (`None` inside: eventfd
    /// failed, and waits keep their slices).
    static SLEEPER: OnceCell<Option<Arc<Sleeper>>> = const { OnceCell::new() };
    /// This thread holds a source and waits in it for credit.
    static WAITING: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread has (or now made) its eventfd: its credit waits
/// can then be woken by a close.
pub(crate) fn available() -> bool {
    with_sleeper(|s| s.is_some())
}

/// Look at this thread's sleeper, made the first time.
fn with_sleeper<R>(f: impl FnOnce(Option<&Arc<Sleeper>>) -> R) -> R {
    SLEEPER.with(|s| {
        f(s.get_or_init(|| {
            let fd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).ok()?;
            Some(Arc::new(Sleeper { fd }))
        })
        .as_ref())
    })
}

/// This thread waits for credit in `shared`'s source while it lives.
pub(crate) struct CreditWait<'a> {
    shared: &'a Shared,
}

impl<'a> CreditWait<'a> {
    /// Register this thread (the holder of `shared`'s source). `None`: it
    /// has no eventfd, and the wait must keep its slices.
    pub(crate) fn enter(shared: &'a Shared) -> Option<Self> {
        let sleeper = with_sleeper(|s| s.cloned())?;
        *lock(shared) = Some(sleeper);
        WAITING.set(true);
        Some(Self { shared })
    }
}

impl Drop for CreditWait<'_> {
    fn drop(&mut self) {
        WAITING.set(false);
        *lock(self.shared) = None;
    }
}

fn lock(shared: &Shared) -> MutexGuard<'_, Option<Arc<Sleeper>>> {
    // One assignment at a time: consistent after a panic.
    shared.credit_sleeper.lock().unwrap_or_else(|p| p.into_inner())
}

/// Ring the thread waiting for credit in `shared`'s source, if one does.
pub(crate) fn ring_credit_sleeper(shared: &Shared) {
    if let Some(s) = lock(shared).as_ref() {
        s.ring();
    }
}

/// What a source's wait watches beside its own descriptors, on a thread
/// that waits for credit (see the module docs). A backend may also ring
/// it itself, for what it knows ends a wait (see
/// [`Interrupt::this_thread`]).
#[derive(Debug, Clone)]
pub struct Interrupt(Arc<Sleeper>);

impl Interrupt {
    /// This thread's interrupt, if it waits for credit in a source now.
    pub(crate) fn current() -> Option<Self> {
        if !WAITING.get() {
            return None;
        }
        SLEEPER.with(|s| s.get().cloned().flatten()).map(Interrupt)
    }

    /// The calling thread's interrupt, made the first time (`None`: it
    /// cannot have one; its waits must then look around on a timer). A
    /// backend whose waiting thread must be woken by something its
    /// descriptors do not announce (its connection closing, a pool
    /// buffer coming back) registers it where that happens and rings it
    /// ([`Interrupt::ring`]). The same descriptor serves a credit wait's
    /// local close: a wait woken by a ring meant for an earlier one
    /// returns early once, which every pump's caller handles.
    pub fn this_thread() -> Option<Self> {
        with_sleeper(|s| s.cloned()).map(Interrupt)
    }

    /// Wake the thread's wait on [`Interrupt::fd`] (or its next one).
    pub fn ring(&self) {
        self.0.ring();
    }

    /// The descriptor to watch for reading.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.0.fd.as_fd()
    }

    /// After the descriptor was found readable: reset it, so that the next
    /// wait sleeps.
    pub fn clear(&self) {
        let mut b = [0u8; 8];
        let _ = rustix::io::read(&self.0.fd, &mut b);
    }
}
