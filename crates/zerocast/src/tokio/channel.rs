//! Typed channels for tasks: [`Sender`] and [`Receiver`], the async forms
//! of [`crate::Sender`] and [`crate::Receiver`], with the same codec, type
//! check and errors.

use std::fmt;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use yoke::Yokeable;
use zerocast_core::{RecvError, SendError};

use super::ready::Reading;
use crate::borrow::Guard;
use crate::codec::{Bincode, Codec};
use crate::error::TypedRecvError;

/// The sending half of a typed channel, for tasks. Clones share it; the
/// sending side closes when the last handle that can send is gone, as
/// with [`crate::Sender`].
///
/// It is also a [`futures_sink::Sink`] of `T` (for `T: Unpin`), which
/// holds at most one message between `start_send` and the flush that
/// sends it.
pub struct Sender<T, C = Bincode> {
    inner: crate::Sender<T, C>,
    reading: Reading,
    /// The `Sink`'s message, accepted and not yet sent.
    queued: Option<T>,
}

impl<T, C> Clone for Sender<T, C> {
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone(), reading: self.reading.clone(), queued: None }
    }
}

impl<T, C: Codec> fmt::Debug for Sender<T, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sender").field("conn", self.inner.connection()).finish()
    }
}

impl<T, C: Codec> Sender<T, C> {
    pub(crate) fn new(inner: crate::Sender<T, C>, reading: Reading) -> Self {
        Self { inner, reading, queued: None }
    }

    /// The blocking form, for a thread outside the runtime.
    pub fn into_blocking(self) -> crate::Sender<T, C> {
        self.reading.stop(self.inner.connection().link());
        self.inner
    }

    /// Retry `send` while it finds no credit and a read of the source (see
    /// [`Reading::poll_waiting`]) may have brought some.
    fn poll_sending(
        &self,
        cx: &mut Context<'_>,
        mut send: impl FnMut(&Context<'_>) -> Result<(), SendError<()>>,
    ) -> Poll<Result<(), SendError<()>>> {
        self.reading.poll_waiting(self.inner.connection().link(), cx, |cx| match send(cx) {
            Err(SendError::Full(())) => Poll::Pending,
            r => Poll::Ready(r),
        })
    }
}

impl<T: Serialize, C: Codec> Sender<T, C> {
    /// Send `msg`, waiting for credit (and for a pool buffer). On error
    /// `msg` comes back.
    ///
    /// Cancel-safe in this sense: a dropped future sent the message whole
    /// or not at all (then `msg` is dropped with it, and no credit or
    /// buffer is taken). [`Sender::send_timeout`] hands `msg` back on its
    /// deadline instead.
    pub async fn send(&self, msg: T) -> Result<(), SendError<T>> {
        self.send_ref(&msg).await.map_err(|e| e.map(|()| msg))
    }

    /// Send by reference: `msg` is only serialized.
    pub async fn send_ref(&self, msg: &T) -> Result<(), SendError<()>> {
        // As at every send: the first attempt outside any future machinery.
        match self.inner.try_send_ref(msg) {
            Err(SendError::Full(())) => {}
            r => return r,
        }
        poll_fn(|cx| self.poll_send_ref(msg, cx)).await
    }

    /// Send `msg`, waiting at most `timeout`: [`SendError::Timeout`] hands
    /// it back.
    pub async fn send_timeout(&self, msg: T, timeout: Duration) -> Result<(), SendError<T>> {
        match self.inner.try_send_ref(&msg) {
            Err(SendError::Full(())) => {}
            r => return r.map_err(|e| e.map(|()| msg)),
        }
        let mut sleep = std::pin::pin!(::tokio::time::sleep(timeout));
        let r = poll_fn(|cx| match self.poll_send_ref(&msg, cx) {
            Poll::Pending if sleep.as_mut().poll(cx).is_ready() => Poll::Ready(Err(SendError::Timeout(()))),
            other => other,
        })
        .await;
        r.map_err(|e| e.map(|()| msg))
    }

    /// Send `msg` if the peer has a free receive buffer (and the pool a
    /// buffer) now; [`SendError::Full`] hands it back otherwise.
    pub fn try_send(&self, msg: T) -> Result<(), SendError<T>> {
        self.inner.try_send(msg)
    }

    /// One attempt for a task: `Pending` with the task set to be woken
    /// when credit or a buffer comes.
    fn poll_send_ref(&self, msg: &T, cx: &mut Context<'_>) -> Poll<Result<(), SendError<()>>> {
        self.poll_sending(cx, |cx| self.inner.send_or_wake(msg, cx.waker()))
    }

    /// Send the `Sink`'s queued message, if any.
    fn poll_queued(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), SendError<T>>> {
        let Some(msg) = self.queued.take() else { return Poll::Ready(Ok(())) };
        match self.poll_send_ref(&msg, cx) {
            Poll::Pending => {
                self.queued = Some(msg);
                Poll::Pending
            }
            Poll::Ready(r) => Poll::Ready(r.map_err(|e| e.map(|()| msg))),
        }
    }
}

impl<T, C: Codec> Sender<T, C>
where
    T: for<'a> Yokeable<'a>,
    for<'a> <T as Yokeable<'a>>::Output: Serialize,
{
    /// Send a borrowing message (see [`crate::Sender::send_borrowed`]),
    /// waiting for credit. Cancel-safe: sent whole or not at all.
    pub async fn send_borrowed<'a>(&self, msg: &<T as Yokeable<'a>>::Output) -> Result<(), SendError<()>> {
        match self.inner.try_send_borrowed(msg) {
            Err(SendError::Full(())) => {}
            r => return r,
        }
        poll_fn(|cx| self.poll_sending(cx, |cx| self.inner.send_borrowed_or_wake(msg, cx.waker()))).await
    }
}

/// The error hands the failed message back.
impl<T: Serialize + Unpin, C: Codec> futures_sink::Sink<T> for Sender<T, C> {
    type Error = SendError<T>;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.get_mut().poll_queued(cx)
    }

    fn start_send(self: Pin<&mut Self>, item: T) -> Result<(), Self::Error> {
        let this = self.get_mut();
        if this.queued.is_some() {
            // `start_send` without `poll_ready` first: refuse, keep order.
            return Err(SendError::Full(item));
        }
        this.queued = Some(item);
        Ok(())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.get_mut().poll_queued(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        let this = self.get_mut();
        let r = std::task::ready!(this.poll_queued(cx));
        this.inner.connection().close();
        Poll::Ready(r)
    }
}

/// The receiving half of a typed channel, for tasks. Clones share it; the
/// receiving side closes when the last handle that can receive is gone,
/// as with [`crate::Receiver`].
///
/// It is also a [`futures_core::Stream`] of `Result<T, TypedRecvError>`
/// that ends at the peer's clean close.
pub struct Receiver<T, C = Bincode> {
    inner: crate::Receiver<T, C>,
    reading: Reading,
}

impl<T, C> Clone for Receiver<T, C> {
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone(), reading: self.reading.clone() }
    }
}

impl<T, C: Codec> fmt::Debug for Receiver<T, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receiver").field("conn", self.inner.connection()).finish()
    }
}

impl<T, C: Codec> Receiver<T, C> {
    pub(crate) fn new(inner: crate::Receiver<T, C>, reading: Reading) -> Self {
        Self { inner, reading }
    }

    /// The blocking form, for a thread outside the runtime (see
    /// [`super::Connection::into_blocking`]).
    pub fn into_blocking(self) -> crate::Receiver<T, C> {
        self.reading.stop(self.inner.connection().link());
        self.inner
    }
}

impl<T: DeserializeOwned, C: Codec> Receiver<T, C> {
    /// Receive the next message. Cancel-safe: a message is taken only by
    /// the poll that returns it.
    pub async fn recv(&self) -> Result<T, TypedRecvError> {
        poll_fn(|cx| self.poll_recv(cx)).await
    }

    /// Receive, waiting at most `timeout`.
    pub async fn recv_timeout(&self, timeout: Duration) -> Result<T, TypedRecvError> {
        ::tokio::time::timeout(timeout, self.recv())
            .await
            .unwrap_or(Err(TypedRecvError::Recv(RecvError::Timeout)))
    }

    /// Receive a message if one is buffered.
    pub fn try_recv(&self) -> Result<T, TypedRecvError> {
        self.inner.try_recv()
    }

    /// The receive of a hand-written future.
    pub fn poll_recv(&self, cx: &mut Context<'_>) -> Poll<Result<T, TypedRecvError>> {
        self.reading.poll(self.inner.connection().link(), cx, || self.inner.try_recv())
    }
}

impl<T, C: Codec> Receiver<T, C>
where
    T: for<'a> Yokeable<'a>,
    for<'a> <T as Yokeable<'a>>::Output: Deserialize<'a>,
{
    /// Receive without copying out of the receive buffer (see
    /// [`crate::Receiver::recv_ref`]). Cancel-safe.
    pub async fn recv_ref(&self) -> Result<Guard<T>, TypedRecvError> {
        let link = self.inner.connection().link();
        poll_fn(|cx| self.reading.poll(link, cx, || self.inner.try_recv_ref())).await
    }

    /// [`Receiver::recv_ref`] if a message is buffered.
    pub fn try_recv_ref(&self) -> Result<Guard<T>, TypedRecvError> {
        self.inner.try_recv_ref()
    }

    /// Receive the next message and run `f` on it, borrowed from the
    /// receive buffer, which is reposted once `f` returns (see
    /// [`crate::Receiver::recv_with`]). Cancel-safe: `f` runs in the poll
    /// that takes the message, and a message is taken only by that poll.
    pub async fn recv_with<R>(
        &self,
        f: impl for<'a> FnOnce(&<T as Yokeable<'a>>::Output) -> R,
    ) -> Result<R, TypedRecvError> {
        let link = self.inner.connection().link();
        let mut f = Some(f);
        poll_fn(|cx| self.reading.poll(link, cx, || self.inner.try_recv_with_slot(&mut f))).await
    }

    /// [`Receiver::recv_with`] if a message is buffered.
    pub fn try_recv_with<R>(
        &self,
        f: impl for<'a> FnOnce(&<T as Yokeable<'a>>::Output) -> R,
    ) -> Result<R, TypedRecvError> {
        self.inner.try_recv_with(f)
    }
}

impl<T: DeserializeOwned, C: Codec> futures_core::Stream for Receiver<T, C> {
    type Item = Result<T, TypedRecvError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match std::task::ready!(self.poll_recv(cx)) {
            Err(TypedRecvError::Recv(RecvError::Disconnected)) => Poll::Ready(None),
            r => Poll::Ready(Some(r)),
        }
    }
}
