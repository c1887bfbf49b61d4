//! Readiness: being told when a connection has something to receive,
//! instead of a thread waiting on each connection.
//!
//! A connection registered with a [`Notify`] ([`crate::Link::notify_on_ready`])
//! is read by its engine only; no receiving thread claims it. One
//! registered to read directly ([`crate::Link::read_directly`]) is read by
//! the application instead, when its source's descriptor turns readable
//! (the application watches it, as an async runtime's reactor does), and
//! by the engine only at its timer. Each time
//! the engine (or whoever delivers) queues a message or the end for the
//! application while the registration is *armed*, it disarms it and calls
//! [`Notify::notify`] with the connection's token, once. The application
//! then takes what is there with `try_recv` until it reports
//! [`zerocast_core::RecvError::Empty`], which arms the registration again.
//! So a token is reported to one consumer at a time, and a drained
//! connection is always armed: no arrival goes untold.
//!
//! Lost wake-ups: the consumer arms, fences, then looks at the queue; the
//! producer pushes, fences, then looks at the flag. With both fences
//! sequentially consistent, one of them sees the other. The consumer that
//! finds a message after arming takes the flag back (`swap`) before it
//! takes the message, so a producer that swapped first has told the
//! notifier and the consumer leaves the message to that report.

use std::fmt;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;

/// What a registered connection tells when it has something to receive.
/// Called on the delivering thread (an engine's, or a sending thread's
/// over `mem://`) with the connection's state locked: do no more than
/// queue the token and wake a waiter, and never call back into the
/// connection.
pub trait Notify: Send + Sync + 'static {
    /// The connection registered with `token` has a message (or its end)
    /// to receive.
    fn notify(&self, token: usize);
}

/// A connection's registration.
pub(crate) struct Readiness {
    notify: Arc<dyn Notify>,
    token: usize,
    /// Report the next delivery.
    armed: AtomicBool,
    /// The application reads the source itself (see the module docs).
    direct: AtomicBool,
}

impl fmt::Debug for Readiness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Readiness")
            .field("token", &self.token)
            .field("armed", &self.armed)
            .field("direct", &self.direct)
            .finish()
    }
}

impl Readiness {
    pub(crate) fn new(notify: Arc<dyn Notify>, token: usize, direct: bool) -> Self {
        Self { notify, token, armed: AtomicBool::new(false), direct: AtomicBool::new(direct) }
    }

    /// Whether the application reads the source itself.
    #[inline]
    pub(crate) fn direct(&self) -> bool {
        self.direct.load(Ordering::SeqCst)
    }

    /// From now on the engine reads for the application.
    pub(crate) fn stop_direct(&self) {
        self.direct.store(false, Ordering::SeqCst);
    }

    /// A delivery was queued: report it if armed.
    #[inline]
    pub(crate) fn delivered(&self) {
        fence(Ordering::SeqCst);
        if self.armed.load(Ordering::Relaxed) && self.armed.swap(false, Ordering::SeqCst) {
            self.notify.notify(self.token);
        }
    }

    /// Report now, disarmed: the registration found something queued.
    pub(crate) fn delivered_now(&self) {
        self.notify.notify(self.token);
    }

    /// The consumer found nothing to take: arm, then look again with
    /// `is_empty`. `true`: something came meanwhile and this caller took
    /// the report back, so it should take it now; `false`: armed (or the
    /// report went to the notifier).
    pub(crate) fn arm(&self, is_empty: impl Fn() -> bool) -> bool {
        self.armed.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        !is_empty() && self.armed.swap(false, Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    use zerocast_core::RecvError;

    use crate::direct_tests::Count;
    use crate::shared::Delivery;

    /// The end stays for every receiver: the one that takes it puts it
    /// back. A receiver that looked while it was out found the queue
    /// empty and armed; putting it back reports it, or that receiver would
    /// wait forever.
    #[test]
    fn the_end_put_back_for_other_receivers_is_reported() {
        let (link, driver, _pool) = crate::test_link();
        let told = Arc::new(Count::default());
        assert!(link.notify_on_ready(told.clone(), 0));
        // The peer vanished: the connection fails, and its end is queued.
        driver.on_end();
        assert_eq!(told.0.load(Ordering::SeqCst), 1, "the end is reported");
        // One receiver has just taken the end, and not yet put it back.
        let taken = driver.shared.delivered.try_pop();
        assert!(matches!(taken, Some(Delivery::End)));
        // Another looks meanwhile: nothing there, so it arms and waits.
        assert!(matches!(link.try_recv(), Err(RecvError::Empty)));
        // The first puts it back.
        let why = link.ended();
        assert!(matches!(why, RecvError::Failed(_)), "{why}");
        assert_eq!(told.0.load(Ordering::SeqCst), 2, "the waiting receiver is told");
        for _ in 0..2 {
            let again = link.try_recv().expect_err("the end, for every receiver");
            assert_eq!(again.to_string(), why.to_string());
        }
    }
}
