//! A descriptor shared by many connections' sources (an RDMA engine's
//! completion channel), watched once by the runtime's reactor.
//!
//! The reactor holds one registration per shared descriptor, whichever
//! connections and tasks use it. Its waker is the hub itself: when the
//! reactor reports the descriptor readable, the wake takes every pending
//! event there and then ([`SharedSource::dispatch`]), which wakes the
//! tasks of exactly the connections the events concern; then it forgets
//! the readiness and asks for the next. So a completion wakes the one task
//! that waits for it, with no task between, and no event is left behind an
//! edge: the readiness is forgotten only after everything before it was
//! taken, and an event after the take raises it anew.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::task::{Context, Poll, Wake, Waker};

use ::tokio::io::unix::AsyncFd;
use ::tokio::io::Interest;
use zerocast_link::SharedSource;

use super::ready::RecvWakers;

/// The shared descriptor, held (and so kept open) for the reactor.
struct Watched(Arc<dyn SharedSource>);

impl AsRawFd for Watched {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// One shared descriptor in the reactor.
pub(crate) struct HubFd {
    fd: AsyncFd<Watched>,
    /// The hub as the reactor's waker.
    waker: Waker,
    /// The reactor dropped the descriptor (its runtime shut down): the
    /// connections' engines read for them from now on.
    dead: AtomicBool,
    /// The waiters of the connections that use this hub, woken if it dies.
    users: Mutex<Vec<Weak<RecvWakers>>>,
}

impl std::fmt::Debug for HubFd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubFd").field("dead", &self.dead).finish_non_exhaustive()
    }
}

/// The reactor's wake of a hub.
struct HubWake(Weak<HubFd>);

impl Wake for HubWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if let Some(hub) = self.0.upgrade() {
            hub.serve();
        }
    }
}

/// The hubs in the reactor, by their source (weakly: a hub goes when its
/// last connection's registration does).
fn hubs() -> &'static Mutex<HashMap<usize, Weak<HubFd>>> {
    static HUBS: OnceLock<Mutex<HashMap<usize, Weak<HubFd>>>> = OnceLock::new();
    HUBS.get_or_init(Mutex::default)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Plain data, consistent after every statement.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl HubFd {
    /// The reactor's registration of `source`, made on first use (on the
    /// current runtime) and shared from then on; `waiters`' connection
    /// uses it. `None` if the reactor refuses the descriptor.
    pub(crate) fn watch(source: Arc<dyn SharedSource>, waiters: &Arc<RecvWakers>) -> Option<Arc<Self>> {
        // The source's address names the hub: each hub hands out one
        // `Arc` of its source, which the registration holds.
        let key = Arc::as_ptr(&source) as *const () as usize;
        let mut hubs = lock(hubs());
        hubs.retain(|_, hub| hub.strong_count() > 0);
        let hub = match hubs.get(&key).and_then(Weak::upgrade).filter(|h| !h.is_dead()) {
            Some(hub) => hub,
            None => {
                // The descriptor is the source's, which `Watched` holds
                // open for the `AsyncFd`'s whole life: the I/O-safety
                // condition of tokio's newer, `unsafe` registration, which
                // this crate does not call.
                #[allow(deprecated)]
                let fd = AsyncFd::with_interest(Watched(source), Interest::READABLE).ok()?;
                let hub = Arc::new_cyclic(|me| Self {
                    fd,
                    waker: Waker::from(Arc::new(HubWake(me.clone()))),
                    dead: AtomicBool::new(false),
                    users: Mutex::default(),
                });
                hubs.insert(key, Arc::downgrade(&hub));
                hub
            }
        };
        drop(hubs);
        {
            let mut users = lock(&hub.users);
            users.retain(|w| w.strong_count() > 0);
            users.push(Arc::downgrade(waiters));
        }
        // Take what is pending, and ask the reactor for what comes next.
        hub.serve();
        Some(hub)
    }

    /// Whether the reactor dropped the descriptor.
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }

    /// While the reactor reports the descriptor readable: take every
    /// pending event, then forget that readiness (an event after the take
    /// raises it anew). Returns once the reactor holds the hub's waker for
    /// the next. Any thread may serve at any time: each event is taken
    /// once, whoever takes it.
    fn serve(&self) {
        let mut cx = Context::from_waker(&self.waker);
        loop {
            match self.fd.poll_read_ready(&mut cx) {
                Poll::Ready(Ok(mut ready)) => {
                    ready.get_inner().0.dispatch();
                    ready.clear_ready();
                }
                Poll::Ready(Err(e)) => {
                    tracing::debug!(error = %e, "zerocast: the reactor dropped a completion channel");
                    self.dead.store(true, Ordering::SeqCst);
                    // Each waiting task finds the hub dead and hands its
                    // connection back to the engine.
                    for waiters in lock(&self.users).iter().filter_map(Weak::upgrade) {
                        zerocast_link::Notify::notify(&*waiters, 0);
                    }
                    return;
                }
                Poll::Pending => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// A test double for a shared descriptor: one end of a socket pair,
    /// whose dispatch takes every byte there and tells the test how many
    /// it has taken in all.
    struct Bytes {
        sock: UnixStream,
        taken: AtomicUsize,
        told: ::tokio::sync::mpsc::UnboundedSender<usize>,
    }

    impl AsFd for Bytes {
        fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
            self.sock.as_fd()
        }
    }

    impl SharedSource for Bytes {
        fn dispatch(&self) {
            let mut buf = [0u8; 64];
            let mut n = 0;
            while let Ok(k @ 1..) = (&self.sock).read(&mut buf) {
                n += k;
            }
            if n > 0 {
                let all = self.taken.fetch_add(n, Ordering::SeqCst) + n;
                let _ = self.told.send(all);
            }
        }
    }

    fn bytes() -> (Arc<Bytes>, UnixStream, ::tokio::sync::mpsc::UnboundedReceiver<usize>) {
        let (ours, theirs) = UnixStream::pair().expect("a socket pair");
        ours.set_nonblocking(true).expect("non-blocking");
        let (told, rx) = ::tokio::sync::mpsc::unbounded_channel();
        (Arc::new(Bytes { sock: ours, taken: AtomicUsize::new(0), told }), theirs, rx)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_reactor_dispatches_every_burst_with_no_task_polling() {
        let (src, mut peer, mut told) = bytes();
        let waiters = Arc::new(RecvWakers::default());
        let shared: Arc<dyn SharedSource> = src.clone();
        let hub = HubFd::watch(shared.clone(), &waiters).expect("registered");
        let again = HubFd::watch(shared, &waiters).expect("registered");
        assert!(Arc::ptr_eq(&hub, &again), "one registration per shared descriptor");
        // Each burst lands while the hub may be re-arming after the last:
        // one lost edge would leave its bytes untaken, and the wait below
        // would time out.
        let mut sent = 0;
        for round in 0..10_000usize {
            let burst = 1 + round % 3;
            peer.write_all(&vec![7u8; burst]).expect("write");
            sent += burst;
            let deadline = std::time::Duration::from_secs(10);
            loop {
                let all = ::tokio::time::timeout(deadline, told.recv())
                    .await
                    .unwrap_or_else(|_| panic!("burst {round} was never dispatched"))
                    .expect("the double is alive");
                if all == sent {
                    break;
                }
            }
        }
        assert!(!hub.is_dead());
    }

    #[test]
    fn a_hub_whose_runtime_shuts_down_is_dead_and_wakes_its_users() {
        let (src, _peer, _told) = bytes();
        let waiters = Arc::new(RecvWakers::default());
        let rt = ::tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let hub = rt.block_on(async { HubFd::watch(src.clone(), &waiters).expect("registered") });
        let woken = Arc::new(super::super::ready::tests::Count(AtomicUsize::new(0)));
        waiters.add(&Waker::from(woken.clone()));
        assert!(!hub.is_dead());
        drop(rt);
        assert!(hub.is_dead(), "the reactor's shutdown was not seen");
        assert_eq!(woken.0.load(Ordering::SeqCst), 1, "the waiting task was not told");
        // A new runtime gets a new registration.
        let rt = ::tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let fresh = rt.block_on(async { HubFd::watch(src, &waiters).expect("registered") });
        assert!(!fresh.is_dead() && !Arc::ptr_eq(&hub, &fresh));
    }
}
