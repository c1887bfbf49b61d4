//! What every backend's listener shares: its counters, its close signal,
//! and the wait for the next handshaken connection.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use zerocast_core::{AcceptError, ListenerStats};

use crate::engine::Waker;

/// A listener's counters, bumped by whichever thread runs a handshake.
#[derive(Debug, Default)]
pub struct ListenerCounters {
    accepted: AtomicU64,
    handshakes_failed: AtomicU64,
    refused: AtomicU64,
    accept_errors: AtomicU64,
}

impl ListenerCounters {
    /// A connection was handed out.
    pub fn accepted(&self) {
        self.accepted.fetch_add(1, Ordering::Relaxed);
    }

    /// A peer's handshake failed: counted and logged at `debug`, never
    /// reported to the accepting application.
    pub fn handshake_failed(&self, peer: &dyn fmt::Display, error: &(dyn std::error::Error + 'static)) {
        self.handshakes_failed.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(%peer, error = %chain(error), "listener: handshake failed; waiting for the next peer");
    }

    /// A peer was turned away by the listener's own limits.
    pub fn refused(&self, peer: &dyn fmt::Display, error: &(dyn std::error::Error + 'static)) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(%peer, error = %chain(error), "listener: refused a peer");
    }

    /// A transient error of the operating system while accepting.
    pub fn accept_error(&self, error: &std::io::Error) {
        self.accept_errors.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(%error, "listener: accepting failed; retrying");
    }

    /// A snapshot.
    pub fn stats(&self) -> ListenerStats {
        let mut s = ListenerStats::default();
        s.accepted = self.accepted.load(Ordering::Relaxed);
        s.handshakes_failed = self.handshakes_failed.load(Ordering::Relaxed);
        s.refused = self.refused.load(Ordering::Relaxed);
        s.accept_errors = self.accept_errors.load(Ordering::Relaxed);
        s
    }
}

/// Holds a listener's accepting task while `accept` is behind: the task
/// stops taking peers (the kernel's queue, or rdma_cm's, holds them) and
/// waits, with no timer, for the `accept` that makes room to wake it.
#[derive(Debug, Default)]
pub struct Backlog {
    held: AtomicBool,
    /// The accepting task, from its first run.
    task: OnceLock<Waker>,
}

impl Backlog {
    /// What an accept took from a listener's ready channel (`r`): room is
    /// made in the backlog, a connection is counted, and the listener's own
    /// error ends it. The accept of `tcp://` and `rc://` listeners.
    pub fn took<C>(
        &self,
        counters: &ListenerCounters,
        r: Result<Result<C, zerocast_core::ConnectError>, AcceptError>,
    ) -> Result<C, AcceptError> {
        self.taken();
        let conn = r?.map_err(AcceptError::Failed)?;
        counters.accepted();
        Ok(conn)
    }

    /// The accepting task (its waker), for [`Backlog::taken`] to wake.
    pub fn set_task(&self, task: &Waker) {
        self.task.get_or_init(|| task.clone());
    }

    /// The accepting task asks whether to stop taking peers: `behind`
    /// says whether `accept` is behind. When it is, the task is held, and
    /// the next [`Backlog::taken`] says to wake it. Marked before the
    /// look, so an `accept` in between either is seen or sees the mark.
    pub fn hold(&self, behind: impl FnOnce() -> bool) -> bool {
        self.held.store(true, Ordering::SeqCst);
        if behind() {
            return true;
        }
        self.held.store(false, Ordering::SeqCst);
        false
    }

    /// `accept` took a connection: wake the accepting task if it is held.
    pub fn taken(&self) {
        if self.release() {
            if let Some(task) = self.task.get() {
                task.wake();
            }
        }
    }

    /// Whether the accepting task was held (it is not any more).
    fn release(&self) -> bool {
        self.held.load(Ordering::SeqCst) && self.held.swap(false, Ordering::SeqCst)
    }
}

/// An error and its sources on one line.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}

/// The close signal of a listener: a flag, and a channel that disconnects
/// when the listener closes, so a wait can select on it.
#[derive(Debug)]
pub struct CloseSignal {
    closed: AtomicBool,
    /// Dropped on close, which disconnects `rx`.
    tx: Mutex<Option<Sender<()>>>,
    rx: Receiver<()>,
    /// Tasks waiting in [`CloseSignal::poll_wait`].
    acceptors: Mutex<crate::Wakers>,
}

impl Default for CloseSignal {
    fn default() -> Self {
        let (tx, rx) = crossbeam_channel::bounded(1);
        Self { closed: AtomicBool::new(false), tx: Mutex::new(Some(tx)), rx, acceptors: Mutex::default() }
    }
}

impl CloseSignal {
    /// Close; `true` the first time.
    pub fn close(&self) -> bool {
        let first = !self.closed.swap(true, Ordering::SeqCst);
        drop(self.tx.lock().unwrap_or_else(|p| p.into_inner()).take());
        self.queued();
        first
    }

    /// A connection (or a listener's error) was queued for accept: wake
    /// the tasks waiting in [`CloseSignal::poll_wait`]. The listener calls
    /// it after each send to its ready channel.
    pub fn queued(&self) {
        let waiting: Vec<_> = self.acceptors.lock().unwrap_or_else(|p| p.into_inner()).take().collect();
        waiting.into_iter().for_each(std::task::Waker::wake);
    }

    /// [`CloseSignal::wait`] for a task: the next item of `ready` if there
    /// is one, `Closed` once closed, else `Pending` with the task to be
    /// woken by [`CloseSignal::queued`].
    pub fn poll_wait<T>(
        &self,
        ready: &Receiver<T>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<T, AcceptError>> {
        let take = || {
            if self.is_closed() {
                return Some(Err(AcceptError::Closed));
            }
            match ready.try_recv() {
                Ok(t) => Some(Ok(t)),
                Err(TryRecvError::Disconnected) => Some(Err(AcceptError::Closed)),
                Err(TryRecvError::Empty) => None,
            }
        };
        if let Some(r) = take() {
            return std::task::Poll::Ready(r);
        }
        self.acceptors.lock().unwrap_or_else(|p| p.into_inner()).add(cx.waker());
        // Queued before the waker was in: found now.
        match take() {
            Some(r) => std::task::Poll::Ready(r),
            None => std::task::Poll::Pending,
        }
    }

    /// Whether [`CloseSignal::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Disconnected once closed.
    pub fn channel(&self) -> &Receiver<()> {
        &self.rx
    }

    /// The next item of `ready`, waiting until `deadline` (`None`: no
    /// limit) unless the listener closes first. A disconnected `ready` (its
    /// producers gone) is a closed listener too.
    pub fn wait<T>(&self, ready: &Receiver<T>, deadline: Option<Instant>) -> Result<T, AcceptError> {
        if self.is_closed() {
            return Err(AcceptError::Closed);
        }
        // An item already there needs no wait (and a deadline already past
        // still takes it).
        match ready.try_recv() {
            Ok(t) => return Ok(t),
            Err(TryRecvError::Disconnected) => return Err(AcceptError::Closed),
            Err(TryRecvError::Empty) => {}
        }
        let mut sel = crossbeam_channel::Select::new();
        let on_ready = sel.recv(ready);
        let on_close = sel.recv(&self.rx);
        let op = match deadline {
            None => sel.select(),
            Some(d) => sel.select_deadline(d).map_err(|_| AcceptError::Timeout)?,
        };
        match op.index() {
            i if i == on_ready => match op.recv(ready) {
                Ok(t) if !self.is_closed() => Ok(t),
                _ => Err(AcceptError::Closed),
            },
            i => {
                debug_assert_eq!(i, on_close);
                let _ = op.recv(&self.rx);
                Err(AcceptError::Closed)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_held_backlog_is_released_by_the_next_accept_only() {
        let b = Backlog::default();
        assert!(!b.hold(|| false), "not behind: not held");
        assert!(!b.release(), "nothing held, nothing to wake");
        assert!(b.hold(|| true));
        assert!(b.release(), "the accept that makes room wakes the held task");
        assert!(!b.release(), "once");
    }

    #[test]
    fn wait_takes_an_item_times_out_and_ends_on_close() {
        let sig = CloseSignal::default();
        let (tx, rx) = crossbeam_channel::bounded(4);
        tx.send(7).unwrap();
        assert_eq!(sig.wait(&rx, Some(Instant::now())).unwrap(), 7, "an item waiting is taken at once");
        assert!(matches!(sig.wait(&rx, Some(Instant::now())), Err(AcceptError::Timeout)));
        let later = Instant::now() + Duration::from_millis(20);
        assert!(matches!(sig.wait(&rx, Some(later)), Err(AcceptError::Timeout)));
        assert!(Instant::now() >= later);
        let (entered_tx, entered) = crossbeam_channel::bounded(1);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                entered_tx.send(()).unwrap();
                sig.wait(&rx, None)
            });
            entered.recv().unwrap();
            assert!(sig.close());
            assert!(matches!(waiter.join().unwrap(), Err(AcceptError::Closed)));
        });
        tx.send(8).unwrap();
        assert!(matches!(sig.wait(&rx, None), Err(AcceptError::Closed)), "closed for good");
        assert!(!sig.close(), "closing twice is harmless");
    }

    #[test]
    fn counters_count() {
        let c = ListenerCounters::default();
        c.accepted();
        c.handshake_failed(&"peer", &std::io::Error::other("garbage"));
        c.handshake_failed(&"peer", &std::io::Error::other("garbage"));
        c.refused(&"peer", &std::io::Error::other("full"));
        c.accept_error(&std::io::Error::other("EMFILE"));
        let s = c.stats();
        assert_eq!((s.accepted, s.handshakes_failed, s.refused, s.accept_errors), (1, 2, 1, 1));
    }
}
