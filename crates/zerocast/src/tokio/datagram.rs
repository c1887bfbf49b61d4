//! Datagrams for tasks: [`DatagramSocket`] and its typed halves, the async
//! forms of [`crate::DatagramSocket`], over UDP (and UDP multicast) or RDMA
//! UD (`ud://`, `mcast://`), chosen as the blocking API chooses.
//!
//! A receive that finds nothing leaves the socket armed (a UD socket's
//! receive CQ, whose completion events already taken are consumed first)
//! and has the engine watch its descriptor — the UDP socket, or the CQ's
//! completion channel — until it is readable, then looks again.

use std::fmt;
use std::future::poll_fn;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use zerocast_core::RecvError;
use zerocast_link::engine::FdWatch;
use zerocast_mem::{Buf, Pool, PoolError};

use super::ready::RecvOutcome;
use crate::codec::{Bincode, Codec};
use crate::datagram::{
    Backend, DatagramError, DatagramSendError, DatagramStats, RecvDatagram, TypedDatagramError,
};

/// A datagram socket for tasks. Receives wait on the engine; sends are
/// handed to the OS or the device at once, as with the blocking socket.
///
/// Over RDMA UD, a destination is resolved through rdma_cm the first time
/// it is sent to, and a group joined through it: a round trip on the
/// fabric, which the task awaits, with no thread waiting
/// ([`DatagramSocket::resolve`], [`DatagramSocket::join`]).
pub struct DatagramSocket {
    sock: crate::DatagramSocket,
    watch: Arc<FdWatch>,
}

impl fmt::Debug for DatagramSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatagramSocket").field("socket", &self.sock).finish()
    }
}

impl RecvOutcome for TypedDatagramError {
    fn recv_error(&self) -> Option<&RecvError> {
        match self {
            TypedDatagramError::Recv(e) => Some(e),
            _ => None,
        }
    }
}

/// Take what `try_armed` finds; on nothing, register with `watch` and look
/// once more (what came between the looks is found, what comes after
/// makes the descriptor readable). Another receiver's turn (a thread's
/// blocking receive): wait until it passes the turn on.
/// No pool buffer to receive into (`sock`'s pool at its cap): wait for
/// one, as a blocking receive would.
fn poll_armed<T, E: RecvOutcome>(
    watch: &FdWatch,
    sock: &crate::DatagramSocket,
    cx: &mut Context<'_>,
    mut try_armed: impl FnMut() -> Result<T, E>,
) -> Poll<Result<T, E>> {
    let mut registered = false;
    loop {
        match try_armed() {
            Err(e) if e.pool_exhausted() => {
                let Some(len) = sock.recv_buffer_len() else { return Poll::Ready(Err(e)) };
                match sock.pool().alloc_or_wake(len, cx.waker()) {
                    // The pool wakes the task when a buffer comes back.
                    Err(PoolError::Exhausted { .. }) => return Poll::Pending,
                    // One came back meanwhile: look again.
                    Ok(_) => {}
                    Err(_) => return Poll::Ready(Err(e)),
                }
            }
            Err(e) if matches!(e.recv_error(), Some(RecvError::Timeout)) => {
                if sock.wake_when_free(cx.waker()) {
                    return Poll::Pending;
                }
            }
            Err(e) if e.is_empty() => {
                if registered {
                    return Poll::Pending;
                }
                watch.wake_when_readable(cx.waker());
                registered = true;
            }
            r => return Poll::Ready(r),
        }
    }
}

impl DatagramSocket {
    pub(crate) fn new(
        sock: crate::DatagramSocket,
        engine: &zerocast_link::engine::Engine,
    ) -> std::io::Result<Self> {
        let watch = Arc::new(FdWatch::new(engine, sock.readiness_fd()?));
        Ok(Self { sock, watch })
    }

    /// The blocking socket underneath, for what does not wait (stats,
    /// sources, multicast options).
    pub fn as_blocking(&self) -> &crate::DatagramSocket {
        &self.sock
    }

    /// The backend in use.
    pub fn backend(&self) -> Backend {
        self.sock.backend()
    }

    /// A send buffer of `len` payload bytes, waiting while the pool is at
    /// its cap. Cancel-safe.
    pub async fn alloc(&self, len: usize) -> Result<Buf, PoolError> {
        let max = self.sock.max_datagram();
        if len > max {
            return Err(PoolError::TooLarge { requested: len, max });
        }
        poll_fn(|cx| match self.sock.pool().alloc_or_wake(len, cx.waker()) {
            Err(PoolError::Exhausted { .. }) => Poll::Pending,
            r => Poll::Ready(r),
        })
        .await
    }

    /// Send `buf` as one datagram to `to`, a peer or a group; the buffer
    /// comes back on error. Success means handed to the OS or the device.
    /// A destination sent to for the first time is resolved first (see
    /// [`DatagramSocket::resolve`]); the send itself does not wait.
    /// Cancel-safe: dropped before it returns, it sent nothing (and `buf`
    /// goes back to the pool).
    pub async fn send_to(&self, buf: Buf, to: &SocketAddr) -> Result<(), (Buf, DatagramError)> {
        if let Err(e) = self.sock.resolve_async(to).await {
            return Err((buf, e));
        }
        self.sock.send_to(buf, to)
    }

    /// Send the datagrams of `batch` in order (see
    /// [`crate::DatagramSocket::send_batch`]), its new destinations
    /// resolved first. Cancel-safe: dropped before it returns, it sent
    /// nothing, and `batch` is as it was.
    pub async fn send_batch(&self, batch: &mut Vec<(Buf, SocketAddr)>) -> Result<(), DatagramError> {
        for (_, to) in batch.iter() {
            self.sock.resolve_async(to).await?;
        }
        self.sock.send_batch(batch)
    }

    /// Resolve `to` (a peer, or a group to send to) now. Over RDMA UD this
    /// is an rdma_cm exchange, awaited with no thread waiting and bounded
    /// by the resolve timeout (`UdConfig::resolve_timeout`); over
    /// UDP there is nothing to do. Sends resolve their destinations
    /// themselves; this only moves the wait. Cancel-safe.
    pub async fn resolve(&self, to: &SocketAddr) -> Result<(), DatagramError> {
        self.sock.resolve_async(to).await
    }

    /// Receive one datagram and its source. Cancel-safe: a datagram is
    /// taken only by the poll that returns it.
    pub async fn recv_from(&self) -> Result<(RecvDatagram, SocketAddr), RecvError> {
        poll_fn(|cx| self.poll_recv_from(cx)).await
    }

    /// Receive, waiting at most `timeout`.
    pub async fn recv_timeout(&self, timeout: Duration) -> Result<(RecvDatagram, SocketAddr), RecvError> {
        ::tokio::time::timeout(timeout, self.recv_from()).await.unwrap_or(Err(RecvError::Timeout))
    }

    /// The receive of a hand-written future.
    pub fn poll_recv_from(
        &self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(RecvDatagram, SocketAddr), RecvError>> {
        poll_armed(&self.watch, &self.sock, cx, || self.sock.try_recv_armed())
    }

    /// A datagram if one is there now, else [`RecvError::Empty`].
    pub fn try_recv_from(&self) -> Result<(RecvDatagram, SocketAddr), RecvError> {
        self.sock.try_recv_from()
    }

    /// Join a multicast group. Over RDMA UD this is an rdma_cm join, a
    /// round trip awaited with no thread waiting and bounded by the resolve
    /// timeout. Cancel-safe: dropped part-way, the socket is not a member
    /// (a join that completed meanwhile is left again, or kept if another
    /// join of the group finished).
    pub async fn join(&self, group: &SocketAddr) -> Result<(), DatagramError> {
        self.sock.join_async(group).await
    }

    /// Leave a multicast group.
    pub fn leave(&self, group: &SocketAddr) -> Result<(), DatagramError> {
        self.sock.leave(group)
    }

    /// The largest payload one datagram carries.
    pub fn max_datagram(&self) -> usize {
        self.sock.max_datagram()
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.sock.local_addr()
    }

    /// The pool send buffers come from.
    pub fn pool(&self) -> &Pool {
        self.sock.pool()
    }

    /// Counters.
    pub fn stats(&self) -> DatagramStats {
        self.sock.stats()
    }

    /// Typed halves with the default codec.
    pub fn typed<S, R>(self) -> (DatagramSender<S>, DatagramReceiver<R>) {
        self.typed_with(Bincode)
    }

    /// Typed halves with a codec of your choice.
    pub fn typed_with<S, R, C: Codec>(self, codec: C) -> (DatagramSender<S, C>, DatagramReceiver<R, C>) {
        let (tx, rx) = self.sock.typed_with(codec);
        (DatagramSender { inner: tx }, DatagramReceiver { inner: rx, watch: self.watch })
    }
}

/// Sends typed messages as datagrams, for tasks. Clones share the socket.
pub struct DatagramSender<T, C = Bincode> {
    inner: crate::DatagramSender<T, C>,
}

impl<T, C: Clone> Clone for DatagramSender<T, C> {
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone() }
    }
}

impl<T, C> fmt::Debug for DatagramSender<T, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatagramSender").field("inner", &self.inner).finish()
    }
}

impl<T: Serialize, C: Codec> DatagramSender<T, C> {
    /// Encode `msg` and send it to `to`, waiting only while the pool is at
    /// its cap, and, the first time `to` is sent to, while it is resolved
    /// (see [`DatagramSocket::resolve`]). Cancel-safe: nothing is sent
    /// unless it returns `Ok`.
    pub async fn send_to(&self, msg: &T, to: &SocketAddr) -> Result<(), DatagramSendError> {
        self.inner.socket().resolve_async(to).await.map_err(DatagramSendError::Send)?;
        poll_fn(|cx| match self.inner.send_to_or_wake(msg, to, cx.waker()) {
            Err(DatagramSendError::Pool(PoolError::Exhausted { .. })) => Poll::Pending,
            r => Poll::Ready(r),
        })
        .await
    }

    /// The socket underneath.
    pub fn socket(&self) -> &crate::DatagramSocket {
        self.inner.socket()
    }
}

/// Receives typed messages from datagrams, for tasks.
pub struct DatagramReceiver<T, C = Bincode> {
    inner: crate::DatagramReceiver<T, C>,
    watch: Arc<FdWatch>,
}

impl<T, C> fmt::Debug for DatagramReceiver<T, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatagramReceiver").field("inner", &self.inner).finish()
    }
}

impl<T: DeserializeOwned, C: Codec> DatagramReceiver<T, C> {
    /// Receive and decode one message and its source. Cancel-safe. A
    /// datagram that does not decode is its own error (and dropped); the
    /// next receive goes on.
    pub async fn recv_from(&self) -> Result<(T, SocketAddr), TypedDatagramError> {
        poll_fn(|cx| poll_armed(&self.watch, self.inner.socket(), cx, || self.inner.try_recv_armed())).await
    }

    /// Receive, waiting at most `timeout`.
    pub async fn recv_timeout(&self, timeout: Duration) -> Result<(T, SocketAddr), TypedDatagramError> {
        ::tokio::time::timeout(timeout, self.recv_from())
            .await
            .unwrap_or(Err(TypedDatagramError::Recv(RecvError::Timeout)))
    }

    /// A message if one is there now.
    pub fn try_recv_from(&self) -> Result<(T, SocketAddr), TypedDatagramError> {
        self.inner.try_recv_from()
    }

    /// The socket underneath.
    pub fn socket(&self) -> &crate::DatagramSocket {
        self.inner.socket()
    }
}
