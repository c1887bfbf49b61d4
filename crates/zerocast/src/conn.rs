//! The raw, zero-copy connection API and the listener.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use zerocast_core::{
    AcceptError, Caps, Connection as _, Endpoint, Listener as _, ListenerStats, RecvError, Scheme, SendError,
};
use zerocast_link::{LinkStats, RecvBuf};
use zerocast_mem::{Buf, PoolError};

use crate::channel::{Receiver, Sender};
use crate::codec::{Bincode, Codec};

/// The backends a connection can be. Private: users see one [`Connection`].
#[derive(Debug, Clone)]
pub(crate) enum Flavor {
    #[cfg(feature = "mem")]
    Mem(zerocast_inproc::MemConnection),
    #[cfg(feature = "tcp")]
    Tcp(zerocast_tcp::TcpConnection),
    #[cfg(feature = "rdma")]
    Rc(zerocast_rdma::RcConnection),
}

macro_rules! each {
    ($flavor:expr, $c:ident => $e:expr) => {
        match $flavor {
            #[cfg(feature = "mem")]
            Flavor::Mem($c) => $e,
            #[cfg(feature = "tcp")]
            Flavor::Tcp($c) => $e,
            #[cfg(feature = "rdma")]
            Flavor::Rc($c) => $e,
        }
    };
}

fn deadline(d: Duration) -> Option<Instant> {
    Instant::now().checked_add(d)
}

/// A connection to one peer, over whichever transport its URI named.
///
/// This is the raw API: take a pooled buffer with [`Connection::alloc`],
/// write into it in place, [`Connection::send`] it; [`Connection::recv`]
/// gives the receive buffer itself, reposted when dropped. For typed
/// messages, [`Connection::split`] it into a [`Sender`] and a [`Receiver`].
///
/// Clones share the connection. Each side of it stays open while a handle
/// that uses it lives: sending closes (the peer sees a disconnect after the
/// messages already sent) when the last `Connection` clone and the last
/// [`Sender`] are gone, and receiving closes (messages still arriving are
/// released at once) when the last `Connection` clone and the last
/// [`Receiver`] are gone. [`Connection::close`] closes sending for every
/// handle at once.
#[derive(Debug)]
pub struct Connection {
    flavor: Flavor,
    /// The sides this handle holds open, and the count of every handle's.
    role: Role,
    ends: Arc<Ends>,
    /// Whether typed senders split from it announce their type.
    typed_check: bool,
}

/// The sides of a connection a handle holds open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// A `Connection`: both.
    Both,
    /// A [`Sender`]'s connection: the sending side.
    Send,
    /// A [`Receiver`]'s connection: the receiving side.
    Recv,
}

impl Role {
    fn sends(self) -> bool {
        self != Role::Recv
    }
    fn receives(self) -> bool {
        self != Role::Send
    }
}

/// How many handles hold each side of one connection open.
#[derive(Debug)]
struct Ends {
    send: AtomicUsize,
    recv: AtomicUsize,
}

impl Clone for Connection {
    fn clone(&self) -> Self {
        self.with_role(self.role)
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // The last handle of a side closes it; `AcqRel` orders every use
        // of the side by other handles before the close.
        if self.role.sends() && self.ends.send.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.close();
        }
        if self.role.receives() && self.ends.recv.fetch_sub(1, Ordering::AcqRel) == 1 {
            each!(&self.flavor, c => c.close_receiver());
        }
    }
}

impl Connection {
    pub(crate) fn new(flavor: Flavor, typed_check: bool) -> Self {
        let ends = Arc::new(Ends { send: AtomicUsize::new(1), recv: AtomicUsize::new(1) });
        Self { flavor, role: Role::Both, ends, typed_check }
    }

    /// Another handle of this connection that holds `role`'s sides open.
    fn with_role(&self, role: Role) -> Self {
        if role.sends() {
            self.ends.send.fetch_add(1, Ordering::Relaxed);
        }
        if role.receives() {
            self.ends.recv.fetch_add(1, Ordering::Relaxed);
        }
        Self { flavor: self.flavor.clone(), role, ends: self.ends.clone(), typed_check: self.typed_check }
    }

    pub(crate) fn link(&self) -> &zerocast_link::Link {
        each!(&self.flavor, c => c.link())
    }

    /// The transport in use.
    pub fn scheme(&self) -> Scheme {
        match &self.flavor {
            #[cfg(feature = "mem")]
            Flavor::Mem(_) => Scheme::Mem,
            #[cfg(feature = "tcp")]
            Flavor::Tcp(_) => Scheme::Tcp,
            // One connection type serves both ways of connecting; the peer
            // endpoint keeps the scheme it was reached or accepted on.
            #[cfg(feature = "rdma")]
            Flavor::Rc(c) => match c.peer().scheme() {
                Scheme::RcOob => Scheme::RcOob,
                _ => Scheme::Rc,
            },
        }
    }

    /// The RC connection underneath, for what only RDMA offers: one-sided
    /// READ and WRITE through [`zerocast_rdma::OneSided`]. `None` on other
    /// transports.
    #[cfg(feature = "rdma")]
    pub fn as_rc(&self) -> Option<&zerocast_rdma::RcConnection> {
        match &self.flavor {
            Flavor::Rc(c) => Some(c),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// What the transport guarantees.
    pub fn caps(&self) -> Caps {
        fn caps_of<C: zerocast_core::Connection>(_: &C) -> Caps {
            C::CAPS
        }
        each!(&self.flavor, c => caps_of(c))
    }

    /// The peer.
    pub fn peer(&self) -> &Endpoint {
        each!(&self.flavor, c => c.peer())
    }

    /// Largest message the connection carries.
    pub fn max_message(&self) -> usize {
        self.link().max_message()
    }

    /// Flow-control counters.
    pub fn stats(&self) -> LinkStats {
        self.link().stats()
    }

    /// A send buffer of `len` bytes, waiting while the pool is at its cap.
    #[inline(always)]
    pub fn alloc(&self, len: usize) -> Result<Buf, PoolError> {
        each!(&self.flavor, c => c.alloc(len, None))
    }

    /// A send buffer of `len` bytes, waiting at most `timeout`.
    pub fn alloc_timeout(&self, len: usize, timeout: Duration) -> Result<Buf, PoolError> {
        each!(&self.flavor, c => c.alloc(len, deadline(timeout)))
    }

    /// Send a buffer, waiting for credit. On error the buffer comes back.
    pub fn send(&self, buf: Buf) -> Result<(), SendError<Buf>> {
        each!(&self.flavor, c => c.send(buf, None))
    }

    /// Send a buffer if the peer has a free receive buffer now.
    pub fn try_send(&self, buf: Buf) -> Result<(), SendError<Buf>> {
        each!(&self.flavor, c => c.try_send(buf))
    }

    /// Send a buffer, waiting at most `timeout` for credit.
    pub fn send_timeout(&self, buf: Buf, timeout: Duration) -> Result<(), SendError<Buf>> {
        each!(&self.flavor, c => c.send(buf, deadline(timeout)))
    }

    /// A send buffer of `len` bytes if the pool has one now, without the
    /// clock a zero timeout reads.
    pub(crate) fn alloc_now(&self, len: usize) -> Result<Buf, PoolError> {
        self.check_len(len)?;
        self.link().pool().alloc(len, zerocast_mem::Wait::No)
    }

    /// A buffer of `len` bytes would be more than a message can carry.
    fn check_len(&self, len: usize) -> Result<(), PoolError> {
        let max = self.max_message();
        if len > max {
            return Err(PoolError::TooLarge { requested: len, max });
        }
        Ok(())
    }

    /// A send buffer of `len` bytes for a task: `Exhausted` while the pool
    /// is at its cap, with `waker` woken when a buffer of the size class is
    /// released.
    pub(crate) fn alloc_or_wake(&self, len: usize, waker: &std::task::Waker) -> Result<Buf, PoolError> {
        self.check_len(len)?;
        self.link().pool().alloc_or_wake(len, waker)
    }

    /// Send for a task: [`SendError::Full`] hands the buffer back with
    /// `waker` to be woken when credit comes (or the connection ends).
    pub(crate) fn send_or_wake(&self, mut buf: Buf, waker: &std::task::Waker) -> Result<(), SendError<Buf>> {
        let mut cx = std::task::Context::from_waker(waker);
        loop {
            match self.try_send(buf) {
                Err(SendError::Full(back)) if self.link().poll_credit(back.len(), &mut cx).is_ready() => {
                    buf = back
                }
                r => return r,
            }
        }
    }

    /// Receive the next message. After the peer closes, buffered messages
    /// come first, then [`RecvError::Disconnected`].
    pub fn recv(&self) -> Result<RecvBuf, RecvError> {
        each!(&self.flavor, c => c.recv(None))
    }

    /// Receive a message if one is buffered.
    pub fn try_recv(&self) -> Result<RecvBuf, RecvError> {
        each!(&self.flavor, c => c.try_recv())
    }

    /// Receive, waiting at most `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<RecvBuf, RecvError> {
        each!(&self.flavor, c => c.recv(deadline(timeout)))
    }

    /// Receive the next message and lend its bytes to `f`; the buffer (and
    /// its credit) goes back when `f` returns, as a dropped [`RecvBuf`]'s
    /// does. No handle is made, which saves a receive loop that does not
    /// keep its messages two atomic operations a message. `f` is not called
    /// when no message comes.
    pub fn recv_with<R>(&self, f: impl FnOnce(&[u8]) -> R) -> Result<R, RecvError> {
        self.link().recv_with(None, |bytes, _| f(bytes))
    }

    /// [`Connection::recv_with`] if a message is buffered.
    pub fn try_recv_with<R>(&self, f: impl FnOnce(&[u8]) -> R) -> Result<R, RecvError> {
        self.link().try_recv_with(|bytes, _| f(bytes))
    }

    /// [`Connection::recv_with`], waiting at most `timeout`.
    pub fn recv_with_timeout<R>(
        &self,
        timeout: Duration,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, RecvError> {
        self.link().recv_with(deadline(timeout), |bytes, _| f(bytes))
    }

    /// Close the sending side; the peer sees a disconnect after the
    /// messages already sent.
    pub fn close(&self) {
        each!(&self.flavor, c => c.close())
    }

    /// Close the sending side and wait, up to `timeout`, until the
    /// connection is over: both sides said goodbye and ours is out (on
    /// RDMA: its completion polled; on `tcp://`: the peer ended its stream,
    /// having read everything). Call it before a process exits, so the
    /// peer gets every message and sees a clean disconnect rather than a
    /// vanished peer. `true` for a clean
    /// end; `false` if the connection failed or the peer did not close in
    /// time.
    pub fn close_and_wait(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        each!(&self.flavor, c => {
            c.close();
            c.link().wait_closed(Some(deadline))
        })
    }

    /// This connection with the type check of the typed channels split
    /// from it turned on or off, whatever [`Config::typed_check`] says:
    /// with it on, the [`Sender`] announces its message type before its
    /// first message (one extra message on the wire), and a peer's
    /// [`Receiver`] of another type fails with
    /// [`TypedRecvError::TypeMismatch`]. Receivers understand announcements
    /// either way.
    ///
    /// [`Config::typed_check`]: crate::Config::typed_check
    /// [`TypedRecvError::TypeMismatch`]: crate::TypedRecvError::TypeMismatch
    pub fn with_typed_check(mut self, on: bool) -> Self {
        self.typed_check = on;
        self
    }

    /// Whether typed senders split from this connection announce their
    /// type (see [`Connection::with_typed_check`]).
    pub fn typed_check(&self) -> bool {
        self.typed_check
    }

    /// Typed halves with the default codec (bincode).
    pub fn split<S, R>(self) -> (Sender<S>, Receiver<R>) {
        self.split_with(Bincode)
    }

    /// Typed halves with a codec of your choice.
    ///
    /// The [`Sender`] holds the sending side open and the [`Receiver`] the
    /// receiving side: dropping the receiver while the sender lives stops
    /// receiving only. Other clones of this connection keep both sides open.
    pub fn split_with<S, R, C: Codec>(self, codec: C) -> (Sender<S, C>, Receiver<R, C>) {
        let check = self.typed_check;
        (
            Sender::new(self.with_role(Role::Send), codec.clone(), check),
            Receiver::new(self.with_role(Role::Recv), codec),
        )
    }
}

#[derive(Debug)]
pub(crate) enum ListenerFlavor {
    #[cfg(feature = "mem")]
    Mem(zerocast_inproc::MemListener),
    #[cfg(feature = "tcp")]
    Tcp(zerocast_tcp::TcpListener),
    #[cfg(feature = "rdma")]
    Rc(zerocast_rdma::RcListener),
}

/// Accepts connections at an endpoint.
///
/// [`Listener::accept`] fails only when the listener is done: a peer whose
/// handshake fails (a port scanner, garbage, a client that hangs up at
/// once) is counted in [`Listener::stats`], logged at `tracing` debug level,
/// and the accept goes on waiting. So a server's loop can be
///
/// ```no_run
/// let listener = zerocast::listen("tcp://0.0.0.0:7000")?;
/// loop {
///     let conn = listener.accept()?;
///     std::thread::spawn(move || {
///         let (tx, rx) = conn.split::<String, String>();
///         for msg in rx.iter() {
///             let _ = tx.send(msg);
///         }
///     });
/// }
/// # Ok::<(), zerocast::Error>(())
/// ```
///
/// [`Listener::close`], from any thread, releases an accept blocked in
/// another one with [`AcceptError::Closed`]; share the listener with an
/// `Arc` or a scoped thread.
#[derive(Debug)]
pub struct Listener {
    pub(crate) flavor: ListenerFlavor,
    /// [`Config::typed_check`](crate::Config::typed_check) for the
    /// connections it accepts.
    pub(crate) typed_check: bool,
}

macro_rules! each_listener {
    ($flavor:expr, $l:ident => $e:expr) => {
        match $flavor {
            #[cfg(feature = "mem")]
            ListenerFlavor::Mem($l) => $e,
            #[cfg(feature = "tcp")]
            ListenerFlavor::Tcp($l) => $e,
            #[cfg(feature = "rdma")]
            ListenerFlavor::Rc($l) => $e,
        }
    };
}

impl Listener {
    fn accept_until(&self, deadline: Option<Instant>) -> Result<Connection, AcceptError> {
        let flavor = match &self.flavor {
            #[cfg(feature = "mem")]
            ListenerFlavor::Mem(l) => Flavor::Mem(l.accept_until(deadline)?),
            #[cfg(feature = "tcp")]
            ListenerFlavor::Tcp(l) => Flavor::Tcp(l.accept_until(deadline)?),
            #[cfg(feature = "rdma")]
            ListenerFlavor::Rc(l) => Flavor::Rc(l.accept_until(deadline)?),
        };
        Ok(Connection::new(flavor, self.typed_check))
    }

    /// Wait for the next connection. Peers whose handshake fails are
    /// counted and skipped; the errors are the listener's own:
    /// [`AcceptError::Closed`] after [`Listener::close`], or
    /// [`AcceptError::Failed`] when its socket or event channel broke.
    pub fn accept(&self) -> Result<Connection, AcceptError> {
        self.accept_until(None)
    }

    /// A connection if one is ready now, `Ok(None)` if nobody waits. On
    /// `rc://`, a peer's connect request that is waiting is handshaken
    /// here, which takes a round trip.
    pub fn try_accept(&self) -> Result<Option<Connection>, AcceptError> {
        match self.accept_until(Some(Instant::now())) {
            Ok(c) => Ok(Some(c)),
            Err(AcceptError::Timeout) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Wait at most `timeout` for the next connection:
    /// [`AcceptError::Timeout`] if none came.
    pub fn accept_timeout(&self, timeout: Duration) -> Result<Connection, AcceptError> {
        self.accept_until(deadline(timeout))
    }

    /// Stop accepting, from any thread: an accept blocked in another thread
    /// returns [`AcceptError::Closed`], as does every later one. On `tcp://`
    /// and `mem://` peers connecting from now on are refused (on RDMA, once
    /// the listener drops). Connections already accepted are not affected.
    pub fn close(&self) {
        each_listener!(&self.flavor, l => l.close())
    }

    /// The accept of an async task: the next connection if one is queued,
    /// else `Pending` with the task woken when one is (or the listener
    /// closes). Never blocks.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn poll_accept(
        &self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<Connection, AcceptError>> {
        use zerocast_core::Listener as _;
        let flavor = match &self.flavor {
            #[cfg(feature = "mem")]
            ListenerFlavor::Mem(l) => l.poll_accept(cx).map(|r| r.map(Flavor::Mem)),
            #[cfg(feature = "tcp")]
            ListenerFlavor::Tcp(l) => l.poll_accept(cx).map(|r| r.map(Flavor::Tcp)),
            #[cfg(feature = "rdma")]
            ListenerFlavor::Rc(l) => l.poll_accept(cx).map(|r| r.map(Flavor::Rc)),
        };
        flavor.map(|r| r.map(|f| Connection::new(f, self.typed_check)))
    }

    /// Counters: connections accepted, handshakes failed, peers refused.
    pub fn stats(&self) -> ListenerStats {
        each_listener!(&self.flavor, l => l.stats())
    }

    /// Where peers connect: the bound port when port 0 was asked for, the
    /// chosen name for `mem://:0`.
    pub fn local_endpoint(&self) -> &Endpoint {
        each_listener!(&self.flavor, l => l.local_endpoint())
    }

    /// The RC listener underneath, for what only RDMA offers: the counters
    /// of its shared receive queue ([`zerocast_rdma::RcListener::srq_stats`]).
    /// `None` on other transports.
    #[cfg(feature = "rdma")]
    pub fn as_rc(&self) -> Option<&zerocast_rdma::RcListener> {
        match &self.flavor {
            ListenerFlavor::Rc(l) => Some(l),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }
}
