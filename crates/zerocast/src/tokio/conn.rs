//! The raw async API: [`Connection`] and [`Listener`].

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use zerocast_core::{
    AcceptError, Caps, ConnectError, Endpoint, ErrorKind, ListenerStats, RecvError, Scheme, SendError,
};
use zerocast_link::{LinkStats, RecvBuf};
use zerocast_mem::{Buf, PoolError};

use super::channel::{Receiver, Sender};
use super::ready::Reading;
use crate::codec::{Bincode, Codec};
use crate::poller::AlreadyRegistered;

/// A connection for tasks: the async form of [`crate::Connection`], with
/// the same buffers, errors and close semantics. Its engine reads it and
/// wakes the task that waits to receive; a send is written by the sending
/// task itself when the link is quiet, as with the blocking API.
///
/// Clones share the connection (and hold it open, as
/// [`crate::Connection`]'s clones do). Any number of tasks may send and
/// receive at once; each message goes to one receiver.
///
/// **Cancellation.** Every `async` method is safe to cancel (drop) at an
/// `.await`, with what is said at each method: nothing is ever half sent,
/// no received message is lost, and credits and buffers are accounted
/// for.
#[derive(Debug, Clone)]
pub struct Connection {
    conn: crate::Connection,
    reading: Reading,
}

impl Connection {
    /// The async form of a connection opened with the blocking API. Its
    /// engine reads it from now on. It must be on a context whose engines
    /// run (any [`crate::Zerocast`]: an engine thread of its own, or
    /// tasks of a [`super::Zerocast`]'s runtime). Fails if the connection
    /// is registered with a [`crate::Poller`] (a connection has one
    /// registration for its life).
    pub fn from_blocking(conn: crate::Connection) -> Result<Self, AlreadyRegistered> {
        let reading = Reading::register(&conn)?;
        Ok(Self { conn, reading })
    }

    /// A connection just opened or accepted, which has no registration.
    pub(crate) fn fresh(conn: crate::Connection) -> Result<Self, ConnectError> {
        Self::from_blocking(conn)
            .map_err(|e| ConnectError::Transport { kind: ErrorKind::InvalidInput, source: e.into() })
    }

    /// The blocking form of this connection, for a thread outside the
    /// runtime. From now on its engine reads it (a `tcp://` connection
    /// stops being read directly by its tasks), so a blocking `recv` waits
    /// for the engine's deliveries, as on a connection registered with a
    /// [`crate::Poller`]. Never call blocking methods from a task: they
    /// would hold the runtime's thread, and the engine may need it.
    pub fn into_blocking(self) -> crate::Connection {
        self.reading.stop(self.conn.link());
        self.conn
    }

    /// The blocking form, borrowed, for what the async form lacks (see
    /// [`Connection::into_blocking`]). The connection stays as it is: on
    /// `tcp://` its tasks read it when the reactor says so, so a blocking
    /// `try_recv` here finds only what a task or the engine has read.
    pub fn as_blocking(&self) -> &crate::Connection {
        &self.conn
    }

    /// Which transport carries it.
    pub fn scheme(&self) -> Scheme {
        self.conn.scheme()
    }

    /// What the transport can do.
    pub fn caps(&self) -> Caps {
        self.conn.caps()
    }

    /// The peer's endpoint.
    pub fn peer(&self) -> &Endpoint {
        self.conn.peer()
    }

    /// The largest message it carries.
    pub fn max_message(&self) -> usize {
        self.conn.max_message()
    }

    /// Counters.
    pub fn stats(&self) -> LinkStats {
        self.conn.stats()
    }

    /// A send buffer of `len` bytes, waiting while the pool is at its cap.
    /// Cancel-safe: a dropped future holds no buffer.
    pub async fn alloc(&self, len: usize) -> Result<Buf, PoolError> {
        match self.try_alloc(len) {
            Err(PoolError::Exhausted { .. }) => {}
            r => return r,
        }
        poll_fn(|cx| match self.conn.alloc_or_wake(len, cx.waker()) {
            Err(PoolError::Exhausted { .. }) => Poll::Pending,
            r => Poll::Ready(r),
        })
        .await
    }

    /// A send buffer if the pool has one now: [`PoolError::Exhausted`] if
    /// it is at its cap.
    pub fn try_alloc(&self, len: usize) -> Result<Buf, PoolError> {
        self.conn.alloc_now(len)
    }

    /// Send a buffer, waiting for credit. On error the buffer comes back.
    ///
    /// Cancel-safe in this sense: a dropped future either sent the buffer
    /// whole or not at all (then the buffer goes back to the pool, and no
    /// credit is taken). To keep the buffer on a deadline, use
    /// [`Connection::send_timeout`], which hands it back; to wait without
    /// giving up a buffer, [`Connection::ready`] then [`Connection::try_send`].
    pub async fn send(&self, buf: Buf) -> Result<(), SendError<Buf>> {
        // The first attempt outside any future: a send that finds credit
        // (the common case) moves its buffer once, not through each layer
        // of a poll.
        let buf = match self.conn.try_send(buf) {
            Err(SendError::Full(back)) => back,
            r => return r,
        };
        let mut slot = Some(buf);
        poll_fn(|cx| self.poll_send(&mut slot, cx)).await
    }

    /// Send a buffer, waiting at most `timeout` for credit:
    /// [`SendError::Timeout`] hands it back.
    pub async fn send_timeout(&self, buf: Buf, timeout: Duration) -> Result<(), SendError<Buf>> {
        let buf = match self.conn.try_send(buf) {
            Err(SendError::Full(back)) => back,
            r => return r,
        };
        let mut slot = Some(buf);
        let mut sleep = std::pin::pin!(::tokio::time::sleep(timeout));
        poll_fn(|cx| match self.poll_send(&mut slot, cx) {
            Poll::Pending if sleep.as_mut().poll(cx).is_ready() => match slot.take() {
                Some(buf) => Poll::Ready(Err(SendError::Timeout(buf))),
                None => Poll::Ready(Ok(())),
            },
            other => other,
        })
        .await
    }

    /// Send `slot`'s buffer now, or keep it there and wait for credit.
    fn poll_send(&self, slot: &mut Option<Buf>, cx: &mut Context<'_>) -> Poll<Result<(), SendError<Buf>>> {
        self.reading.poll_waiting(self.conn.link(), cx, |cx| {
            let Some(buf) = slot.take() else { return Poll::Ready(Ok(())) };
            match self.conn.send_or_wake(buf, cx.waker()) {
                Err(SendError::Full(back)) => {
                    *slot = Some(back);
                    Poll::Pending
                }
                r => Poll::Ready(r),
            }
        })
    }

    /// Send a buffer if the peer has a free receive buffer now;
    /// [`SendError::Full`] hands it back otherwise.
    pub fn try_send(&self, buf: Buf) -> Result<(), SendError<Buf>> {
        self.conn.try_send(buf)
    }

    /// Wait until a send of a small message (one credit: under 4 KiB on
    /// `tcp://`, any size on the other transports) would find credit, or
    /// the connection closed or failed (the send then says which).
    /// Cancel-safe. Another task may take the credit first, so follow it
    /// with [`Connection::try_send`] and wait again on `Full`.
    pub async fn ready(&self) {
        self.ready_for(0).await
    }

    /// [`Connection::ready`] for a message of `len` bytes, which on
    /// `tcp://` may take more than one credit (one per KiB begun past its
    /// first).
    pub async fn ready_for(&self, len: usize) {
        let link = self.conn.link();
        poll_fn(|cx| self.reading.poll_waiting(link, cx, |cx| link.poll_credit(len, cx))).await
    }

    /// Receive the next message. After the peer closes, buffered messages
    /// come first, then [`RecvError::Disconnected`].
    ///
    /// Cancel-safe: a message is taken only by the poll that returns it,
    /// so a dropped future (in a `select!` that another branch won, say)
    /// loses nothing.
    pub async fn recv(&self) -> Result<RecvBuf, RecvError> {
        poll_fn(|cx| self.poll_recv(cx)).await
    }

    /// Receive, waiting at most `timeout`: [`RecvError::Timeout`] if
    /// nothing came.
    pub async fn recv_timeout(&self, timeout: Duration) -> Result<RecvBuf, RecvError> {
        ::tokio::time::timeout(timeout, self.recv()).await.unwrap_or(Err(RecvError::Timeout))
    }

    /// Receive a message if one is buffered: [`RecvError::Empty`] if none.
    pub fn try_recv(&self) -> Result<RecvBuf, RecvError> {
        self.conn.try_recv()
    }

    /// The receive of a hand-written future: `Ready` with the next message
    /// (or the end), else `Pending` with the task woken when one comes.
    pub fn poll_recv(&self, cx: &mut Context<'_>) -> Poll<Result<RecvBuf, RecvError>> {
        self.reading.poll(self.conn.link(), cx, || self.conn.try_recv())
    }

    /// Close the sending side; the peer sees a disconnect after the
    /// messages already sent. Does not wait.
    pub fn close(&self) {
        self.conn.close()
    }

    /// Close the sending side and wait until the connection is over (see
    /// [`crate::Connection::close_and_wait`]): `true` for a clean end,
    /// `false` if it failed. Bound it with `tokio::time::timeout`; a
    /// dropped future leaves the connection closed for sending.
    pub async fn close_and_wait(&self) -> bool {
        self.conn.close();
        let link = self.conn.link();
        poll_fn(|cx| self.reading.poll_waiting(link, cx, |cx| link.poll_closed(cx))).await
    }

    /// Typed halves with the default codec (bincode).
    pub fn split<S, R>(self) -> (Sender<S>, Receiver<R>) {
        self.split_with(Bincode)
    }

    /// Typed halves with a codec of your choice (see
    /// [`crate::Connection::split_with`]).
    pub fn split_with<S, R, C: Codec>(self, codec: C) -> (Sender<S, C>, Receiver<R, C>) {
        let (tx, rx) = self.conn.split_with(codec);
        (Sender::new(tx, self.reading.clone()), Receiver::new(rx, self.reading))
    }
}

/// Accepts connections at an endpoint, for tasks: the async form of
/// [`crate::Listener`]. A peer whose handshake fails is counted and
/// skipped, as there; the handshakes run on the engine, so a stalled peer
/// holds no task.
#[derive(Debug)]
pub struct Listener {
    inner: crate::Listener,
}

impl Listener {
    pub(crate) fn new(inner: crate::Listener) -> Self {
        Self { inner }
    }

    /// The next connection. Cancel-safe: a connection is taken only by the
    /// poll that returns it.
    pub async fn accept(&self) -> Result<Connection, AcceptError> {
        poll_fn(|cx| self.poll_accept(cx)).await
    }

    /// The accept of a hand-written future.
    pub fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<Result<Connection, AcceptError>> {
        self.inner.poll_accept(cx).map(|r| Connection::fresh(r?).map_err(AcceptError::Failed))
    }

    /// A connection if one is ready now, `Ok(None)` if nobody waits.
    pub fn try_accept(&self) -> Result<Option<Connection>, AcceptError> {
        match self.inner.try_accept()? {
            Some(c) => Connection::fresh(c).map(Some).map_err(AcceptError::Failed),
            None => Ok(None),
        }
    }

    /// The accepted connections as a [`futures_core::Stream`], ending after
    /// the listener closes (or fails, with that error as its last item).
    pub fn incoming(&self) -> Incoming<'_> {
        Incoming { listener: self, done: false }
    }

    /// Stop accepting: a waiting accept returns [`AcceptError::Closed`].
    pub fn close(&self) {
        self.inner.close()
    }

    /// Counters: connections accepted, handshakes failed, peers refused.
    pub fn stats(&self) -> ListenerStats {
        self.inner.stats()
    }

    /// Where peers connect (the bound port when port 0 was asked for).
    pub fn local_endpoint(&self) -> &Endpoint {
        self.inner.local_endpoint()
    }
}

/// [`Listener::incoming`].
#[derive(Debug)]
pub struct Incoming<'a> {
    listener: &'a Listener,
    done: bool,
}

impl futures_core::Stream for Incoming<'_> {
    type Item = Result<Connection, AcceptError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        match self.listener.poll_accept(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(c)) => Poll::Ready(Some(Ok(c))),
            Poll::Ready(Err(AcceptError::Closed)) => {
                self.done = true;
                Poll::Ready(None)
            }
            Poll::Ready(Err(e)) => {
                self.done = true;
                Poll::Ready(Some(Err(e)))
            }
        }
    }
}
