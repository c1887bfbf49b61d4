//! How tasks learn that a connection has something for them.
//!
//! A connection whose backend has a source descriptor is read by its
//! tasks themselves ([`zerocast_link::Link::read_directly`]), and its
//! engine only at its timer:
//! - a `tcp://` socket is registered with the runtime's reactor, whose
//!   readiness wakes the waiting tasks directly, and the task that runs
//!   pumps the source;
//! - an RDMA connection's CQ announces its completions on its engine's
//!   completion channel, which the reactor watches once for all of that
//!   engine's connections (see `hub`): the reactor's wake takes the
//!   channel's events and wakes the tasks of the connections they
//!   concern, and the task that runs polls its CQ.
//!
//! Other connections (`mem://`) are read by their engine, which wakes the
//! waiting tasks through the connection's readiness registration.

use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use ::tokio::io::unix::AsyncFd;
use ::tokio::io::Interest;
use zerocast_core::RecvError;
use zerocast_link::{Link, Notify, SourceFd, Wakers};

use super::hub::HubFd;
use crate::poller::AlreadyRegistered;

/// The tasks waiting on one connection: to receive, or for what a pump
/// of its source brings (credit, the end). Woken together by a delivery
/// the engine queues, or by the reactor when the source's descriptor
/// turns readable; each then tries again.
///
/// It also counts its notifications, so that a task can register only if
/// none came since it started to look ([`RecvWakers::add_unless_notified`]):
/// one look per poll instead of a second one after registering.
#[derive(Debug, Default)]
pub(crate) struct RecvWakers {
    set: Mutex<Wakers>,
    /// Notifications so far, raised under `set`'s lock.
    notified: AtomicU64,
}

impl RecvWakers {
    pub(crate) fn add(&self, waker: &Waker) {
        self.set.lock().unwrap_or_else(|p| p.into_inner()).add(waker);
    }

    /// The notifications so far: read before a look at what the task
    /// waits for, and handed to [`RecvWakers::add_unless_notified`] after.
    pub(crate) fn seen(&self) -> u64 {
        self.notified.load(Ordering::SeqCst)
    }

    /// Hold `waker`, unless a notification came since `seen`: `false` then,
    /// and the task looks again. A notifier publishes what it reports
    /// before it counts it, and counts it under the lock it wakes under,
    /// so either this sees the count raised, or the notification comes
    /// after the registration and wakes `waker`; and whatever was reported
    /// before `seen` was read, the look after it found.
    pub(crate) fn add_unless_notified(&self, waker: &Waker, seen: u64) -> bool {
        let mut set = self.set.lock().unwrap_or_else(|p| p.into_inner());
        if self.notified.load(Ordering::SeqCst) != seen {
            return false;
        }
        set.add(waker);
        true
    }
}

impl Notify for RecvWakers {
    fn notify(&self, _token: usize) {
        // Woken under the lock, which keeps the set's allocation: a wake
        // only schedules a task.
        let mut set = self.set.lock().unwrap_or_else(|p| p.into_inner());
        self.notified.fetch_add(1, Ordering::SeqCst);
        set.wake_all();
    }
}

/// The reactor's wake for the source's descriptor.
impl Wake for RecvWakers {
    fn wake(self: Arc<Self>) {
        self.notify(0);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.notify(0);
    }
}

/// Reads of the source a waiting task makes in one poll, at most.
const WAITER_READS: usize = 4;

/// The source's descriptor, held (and so kept open) for the reactor.
struct Watched(SourceFd);

impl AsRawFd for Watched {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// What the reactor watches for a connection its tasks read themselves.
#[derive(Clone)]
enum Direct {
    /// Its source's own descriptor.
    Own(Arc<AsyncFd<Watched>>),
    /// The descriptor its source shares with others', which raises the
    /// link's hint and wakes the waiters itself.
    Shared(Arc<HubFd>),
}

/// A connection's registration for tasks: its waiters and, when its tasks
/// read it themselves, what the reactor watches for it.
#[derive(Clone)]
pub(crate) struct Reading {
    wakers: Arc<RecvWakers>,
    /// `wakers` as the reactor's waker.
    waker: Waker,
    direct: Option<Direct>,
}

impl std::fmt::Debug for Reading {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reading").field("direct", &self.direct.is_some()).finish()
    }
}

impl Reading {
    /// Register `conn`: read by its tasks if it has a source descriptor
    /// and this thread is in a runtime, else by its engine.
    pub(crate) fn register(conn: &crate::Connection) -> Result<Self, AlreadyRegistered> {
        let wakers = Arc::new(RecvWakers::default());
        let link = conn.link();
        let in_runtime = ::tokio::runtime::Handle::try_current().is_ok();
        let own = || {
            link.source_fd().and_then(|fd| {
                // The descriptor is the source's, which `Watched` holds
                // open (an `Arc` of the socket) for the `AsyncFd`'s whole
                // life: the I/O-safety condition of tokio's newer,
                // `unsafe` registration, which this crate does not call.
                #[allow(deprecated)]
                let registered = AsyncFd::with_interest(Watched(fd), Interest::READABLE);
                registered.ok().map(|fd| Direct::Own(Arc::new(fd)))
            })
        };
        let shared = || link.shared_source().and_then(|s| HubFd::watch(s, &wakers)).map(Direct::Shared);
        let direct = if in_runtime { own().or_else(shared) } else { None };
        let notify: Arc<dyn Notify> = wakers.clone();
        let registered = match direct {
            Some(_) => link.read_directly(notify, 0),
            None => link.notify_on_ready(notify, 0),
        };
        if !registered {
            return Err(AlreadyRegistered);
        }
        Ok(Self { waker: Waker::from(wakers.clone()), wakers, direct })
    }

    /// Take with `try_recv` what is there, reading the source first
    /// whenever the reactor says its descriptor is readable; otherwise
    /// register the task. A `try_recv` that finds nothing arms the
    /// registration (and the reactor's readiness, once taken, is asked
    /// again), so whatever comes after the look is reported. The task is
    /// registered at once if nothing was reported since the look began;
    /// if something was, it is registered anyway and looks once more, as
    /// before: the reactor may report on every look (a task out of its
    /// cooperative budget is woken at once, outside a worker), so looking
    /// until a quiet one might never end.
    pub(crate) fn poll<T, E: RecvOutcome>(
        &self,
        link: &Link,
        cx: &mut Context<'_>,
        mut try_recv: impl FnMut() -> Result<T, E>,
    ) -> Poll<Result<T, E>> {
        let mut registered = false;
        loop {
            let seen = self.wakers.seen();
            // What is queued comes first; the reactor is asked only when
            // the queue is empty.
            let read = !link.has_queued() && self.readable(link);
            match try_recv() {
                Err(e) if e.is_empty() => {}
                r => return Poll::Ready(r),
            }
            if read {
                continue;
            }
            if registered || self.wakers.add_unless_notified(cx.waker(), seen) {
                return Poll::Pending;
            }
            self.wakers.add(cx.waker());
            registered = true;
        }
    }

    /// `poll` (a send, a wait for credit or for the end) again while it is
    /// pending and a read of the source ([`Reading::pump_for_waiter`]) may
    /// have brought what it waits for: no task but the waiting ones reads
    /// a connection its tasks read. A few reads per poll at most (a read
    /// that finds the source held by another thread's pump keeps the hint,
    /// and that pump wakes the tasks as it lets go; a read may leave more
    /// staged): past them the task yields (woken at once) rather than spin
    /// on a worker.
    pub(crate) fn poll_waiting<T>(
        &self,
        link: &Link,
        cx: &mut Context<'_>,
        mut poll: impl FnMut(&mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        for _ in 0..WAITER_READS {
            match poll(cx) {
                Poll::Pending if self.pump_for_waiter(link, cx) => {}
                r => return r,
            }
        }
        match poll(cx) {
            Poll::Pending => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            r => r,
        }
    }

    /// For a task that waits for what the source brings other than a
    /// message (credit, the end): when its tasks read the connection, read
    /// it now if the reactor says there is something, and have the task
    /// woken when there is more. `true`: it read, so look again.
    fn pump_for_waiter(&self, link: &Link, cx: &mut Context<'_>) -> bool {
        if self.direct.is_none() || !link.reads_directly() {
            return false;
        }
        self.wakers.add(cx.waker());
        // The reactor's readiness raises the link's hint (a shared
        // descriptor's wake raises it itself), and so does a receive's
        // batch that left frames staged, which no readiness announces (see
        // `Driver::batch_done`): the pump reads whenever the hint is up.
        let readable = self.readable(link);
        readable | link.pump_for_credit()
    }

    /// Whether the reactor saw the source's own descriptor readable since
    /// the last look (the link is told, so its next pump reads); if not,
    /// the waiters are woken when it is. A shared descriptor's wake tells
    /// the link itself: `false`, unless the reactor dropped it, which hands
    /// the connection to its engine (`true`: look again).
    fn readable(&self, link: &Link) -> bool {
        let fd = match self.direct.as_ref().filter(|_| link.reads_directly()) {
            Some(Direct::Own(fd)) => fd,
            Some(Direct::Shared(hub)) if hub.is_dead() => {
                link.stop_reading_directly();
                return true;
            }
            _ => return false,
        };
        match fd.poll_read_ready(&mut Context::from_waker(&self.waker)) {
            Poll::Ready(Ok(mut ready)) => {
                // Forget what the reactor saw before this pump: whatever
                // comes after it raises readiness anew.
                ready.clear_ready();
                link.source_readable();
                true
            }
            Poll::Ready(Err(e)) => {
                // The reactor is going away: its engine reads for it.
                tracing::debug!(error = %e, "zerocast: the reactor dropped a connection's descriptor");
                link.stop_reading_directly();
                false
            }
            Poll::Pending => false,
        }
    }

    /// Its engine reads the connection from now on (for a thread that will
    /// not watch the descriptor).
    pub(crate) fn stop(&self, link: &Link) {
        if self.direct.is_some() {
            link.stop_reading_directly();
        }
    }
}

/// A receive's error, as a task's poll reads it: "nothing yet", "another
/// receiver's turn", "no pool buffer", or a result to return.
pub(crate) trait RecvOutcome {
    /// The receive error inside, if it is one.
    fn recv_error(&self) -> Option<&RecvError>;

    /// Nothing to receive yet.
    fn is_empty(&self) -> bool {
        matches!(self.recv_error(), Some(RecvError::Empty))
    }

    /// The receive found the pool at its cap before it looked (a UDP
    /// datagram socket's; none other takes a buffer before it looks).
    #[cfg_attr(not(feature = "tcp"), allow(dead_code))]
    fn pool_exhausted(&self) -> bool {
        matches!(self.recv_error(), Some(RecvError::Failed(e))
            if matches!(e.transport_error::<zerocast_mem::PoolError>(), Some(zerocast_mem::PoolError::Exhausted { .. })))
    }
}

impl RecvOutcome for RecvError {
    fn recv_error(&self) -> Option<&RecvError> {
        Some(self)
    }
}

impl RecvOutcome for crate::TypedRecvError {
    fn recv_error(&self) -> Option<&RecvError> {
        match self {
            crate::TypedRecvError::Recv(e) => Some(e),
            _ => None,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// A waker that counts its wakes (the hub's tests use it too).
    pub(crate) struct Count(pub(crate) AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A notification that comes between a task's look and its
    /// registration sends it back to look; one after the registration
    /// wakes it, once.
    #[test]
    fn a_notification_during_a_look_is_not_lost() {
        let wakers = RecvWakers::default();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let seen = wakers.seen();
        wakers.notify(0);
        assert!(!wakers.add_unless_notified(&waker, seen), "registered past a notification");
        let seen = wakers.seen();
        assert!(wakers.add_unless_notified(&waker, seen));
        assert!(wakers.add_unless_notified(&waker, seen), "held once");
        wakers.notify(0);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        wakers.notify(0);
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "woken only while registered");
    }
}
