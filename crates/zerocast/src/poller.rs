//! Serving many connections from a few threads: readiness, not a thread
//! blocked on each connection.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use zerocast_link::Notify;

use crate::Connection;

/// Tells a few threads which of many connections have something to
/// receive, so that a server needs no thread per connection.
///
/// Register each connection (or a [`crate::Receiver`]'s, through
/// [`crate::Receiver::connection`]) with a token of your choice; then
/// [`Poller::wait`] hands out the tokens of connections with a message,
/// or their end, to receive. The connections' engine reads them, so
/// thousands of connections cost no thread of their own.
///
/// Readiness is edge-triggered, with one rule: **after a token is
/// reported, call `try_recv` on its connection until it returns
/// [`crate::RecvError::Empty`]** (or an error that ends the connection).
/// That arms the connection again; the next arrival is then reported
/// once more. Until then the token is not reported again, so it is
/// handed to one waiting thread at a time, and a connection's messages
/// are taken in order by one thread. Nothing that arrives goes untold: a
/// drained connection is always armed.
///
/// A connection stays registered for its life, with one poller; a
/// registered connection's blocking `recv` waits for the engine's
/// deliveries. Replies go out with the usual `send` (or `try_send`), from
/// any thread.
///
/// ```
/// use std::time::Duration;
/// use zerocast::{Events, Poller};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let zc = zerocast::Zerocast::new();
/// let listener = zc.listen("tcp://127.0.0.1:0")?;
/// let client = zc.connect(&listener.local_endpoint().to_string())?;
/// let server = listener.accept()?;
///
/// let poller = Poller::new();
/// poller.register(&server, 7)?;
/// let mut buf = client.alloc(5)?;
/// buf.copy_from_slice(b"hello");
/// client.send(buf)?;
///
/// let mut events = Events::with_capacity(64);
/// poller.wait(&mut events, Some(Duration::from_secs(5)));
/// for token in events.iter() {
///     assert_eq!(token, 7);
///     // Drain it: that arms it for the next arrival.
///     while let Ok(msg) = server.try_recv() {
///         assert_eq!(&*msg, b"hello");
///     }
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Default)]
pub struct Poller {
    inner: Arc<Inner>,
}

impl fmt::Debug for Poller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let q = self.inner.lock();
        f.debug_struct("Poller").field("ready", &q.ready.len()).field("waiting", &q.waiting).finish()
    }
}

#[derive(Default)]
struct Inner {
    queue: Mutex<Ready>,
    cv: Condvar,
}

#[derive(Default)]
struct Ready {
    ready: VecDeque<usize>,
    /// Threads in `wait`, so that a report notifies only when one waits
    /// (a condvar's notify is a system call even with nobody waiting).
    waiting: usize,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Ready> {
        // Every update is one push or one drain: consistent after a panic.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Notify for Inner {
    fn notify(&self, token: usize) {
        let mut q = self.lock();
        q.ready.push_back(token);
        let wake = q.waiting > 0;
        drop(q);
        if wake {
            self.cv.notify_one();
        }
    }
}

/// The tokens one [`Poller::wait`] handed out: at most the capacity it was
/// made with.
#[derive(Debug, Clone)]
pub struct Events {
    tokens: Vec<usize>,
    capacity: usize,
}

impl Events {
    /// Room for `capacity` tokens per wait (at least one).
    pub fn with_capacity(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self { tokens: Vec::with_capacity(capacity), capacity }
    }

    /// The tokens reported, in the order they became ready.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.tokens.iter().copied()
    }

    /// How many tokens were reported.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether none was.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

/// [`Poller::register`] was given a connection that already has a
/// registration (a connection has one for its life).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AlreadyRegistered;

impl fmt::Display for AlreadyRegistered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the connection is already registered with a poller (one registration per connection)")
    }
}

impl std::error::Error for AlreadyRegistered {}

impl Poller {
    /// A poller with no connections.
    pub fn new() -> Self {
        Self::default()
    }

    /// Report `conn` as `token` whenever it has something to receive (see
    /// the type's docs). What it holds already is reported at once.
    pub fn register(&self, conn: &Connection, token: usize) -> Result<(), AlreadyRegistered> {
        let notify: Arc<dyn Notify> = self.inner.clone();
        if conn.link().notify_on_ready(notify, token) {
            Ok(())
        } else {
            Err(AlreadyRegistered)
        }
    }

    /// Report `token` as if a connection registered with it were ready:
    /// for waking a thread in [`Poller::wait`] from elsewhere (to stop it,
    /// say, with a token no connection uses).
    pub fn wake(&self, token: usize) {
        self.inner.notify(token);
    }

    /// Wait until a token is ready or `timeout` passes (`None`: no limit),
    /// and put up to `events`' capacity of ready tokens in it (replacing
    /// what it held). Several threads may wait on one poller; each token
    /// goes to one of them. Returns how many tokens it got (0: the time
    /// ran out).
    pub fn wait(&self, events: &mut Events, timeout: Option<Duration>) -> usize {
        events.tokens.clear();
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let mut q = self.inner.lock();
        while q.ready.is_empty() {
            q.waiting += 1;
            q = match deadline {
                None => self.inner.cv.wait(q).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        q.waiting -= 1;
                        return 0;
                    }
                    self.inner.cv.wait_timeout(q, left).unwrap_or_else(|p| p.into_inner()).0
                }
            };
            q.waiting -= 1;
        }
        let take = q.ready.len().min(events.capacity);
        events.tokens.extend(q.ready.drain(..take));
        // Tokens left over go to another waiting thread.
        let more = !q.ready.is_empty() && q.waiting > 0;
        drop(q);
        if more {
            self.inner.cv.notify_one();
        }
        events.tokens.len()
    }
}
