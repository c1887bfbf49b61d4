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
//!
//! Many consumers (tasks sharing a receiver): the flag one takes back may
//! be the arm of another, which found the same message after its own arm
//! and, losing the swap, waits for a report that no producer will make.
//! So a consumer that took the flag back arms it again once it has its
//! message ([`Readiness::arm_or_take`]), and reports at once if more is
//! queued by then.

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

    /// The consumer found nothing to take: arm, unless something came
    /// meanwhile, which `take` then takes. A consumer that took the report
    /// back arms again for the others (see the module docs).
    #[inline]
    pub(crate) fn arm_or_take<T>(
        &self,
        is_empty: impl Fn() -> bool,
        mut take: impl FnMut() -> Option<T>,
    ) -> Option<T> {
        while self.arm(&is_empty) {
            if let Some(taken) = take() {
                if self.arm(&is_empty) {
                    self.delivered_now();
                }
                return Some(taken);
            }
        }
        None
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

    /// Two receivers arm at once and find the same delivery (the end,
    /// whose report woke both before it came). The one that wins the flag
    /// takes it; the other, losing the swap, waits: it must be told of
    /// what comes next, though the winner never looks again (it took the
    /// end and is gone).
    #[test]
    fn a_receiver_that_loses_the_flag_to_another_is_told_of_what_comes_next() {
        let (link, driver, _pool) = crate::test_link();
        let told = Arc::new(Count::default());
        assert!(link.notify_on_ready(told.clone(), 0));
        let ready = driver.shared.ready.0.get().expect("registered");
        let queue = &driver.shared.delivered;
        driver.on_end();
        assert_eq!(told.0.load(Ordering::SeqCst), 1, "the end is reported");
        // The loser arms; between its arm and its look, the winner arms,
        // takes the end and puts it back.
        let loser = ready.arm_or_take(
            || {
                let won = ready.arm_or_take(|| queue.is_empty(), || queue.try_pop());
                assert!(matches!(won, Some(Delivery::End)));
                let _ = link.ended();
                queue.is_empty()
            },
            || -> Option<Delivery> { panic!("the loser lost the flag") },
        );
        assert!(loser.is_none(), "it waits");
        assert_eq!(told.0.load(Ordering::SeqCst), 2, "and is told of the end put back");
    }
}
