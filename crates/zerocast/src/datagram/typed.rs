//! Typed datagrams: [`DatagramSender<T>`] and [`DatagramReceiver<T>`].
//!
//! A message is serialized straight into a pool buffer with the same
//! [`Codec`] as typed channels, and sent as one datagram; a received
//! datagram is decoded from its receive buffer. Unreliable and unordered,
//! like every datagram: a message may be lost or overtaken.

use std::fmt;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;
use zerocast_core::RecvError;
use zerocast_mem::PoolError;

use super::{DatagramError, DatagramSocket};
use crate::codec::{Codec, CodecError};

/// Why a typed datagram was not sent.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DatagramSendError {
    /// The message did not encode.
    #[error("cannot encode the datagram")]
    Codec(#[source] CodecError),
    /// The encoded message is longer than the socket's largest datagram.
    #[error("the message encodes to {len} bytes, more than the {max}-byte datagram limit")]
    TooLarge {
        /// Encoded length.
        len: usize,
        /// The socket's largest payload.
        max: usize,
    },
    /// No send buffer.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// The socket refused the datagram.
    #[error(transparent)]
    Send(#[from] DatagramError),
}

/// Why a typed receive produced no message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TypedDatagramError {
    /// Nothing was received.
    #[error(transparent)]
    Recv(#[from] RecvError),
    /// A datagram arrived from `from` but is not a valid message; it was dropped.
    #[error("a datagram from {from} does not decode")]
    Decode {
        /// Its source.
        from: SocketAddr,
        /// The codec's complaint.
        #[source]
        source: CodecError,
    },
}

pub(super) fn split<S, R, C: Codec>(
    sock: DatagramSocket,
    codec: C,
) -> (DatagramSender<S, C>, DatagramReceiver<R, C>) {
    let sock = Arc::new(sock);
    (
        DatagramSender { sock: sock.clone(), codec: codec.clone(), _t: PhantomData },
        DatagramReceiver { sock, codec, _t: PhantomData },
    )
}

/// Sends typed messages as datagrams. Clones share the socket.
pub struct DatagramSender<T, C = crate::Bincode> {
    sock: Arc<DatagramSocket>,
    codec: C,
    _t: PhantomData<fn(T)>,
}

impl<T, C: Clone> Clone for DatagramSender<T, C> {
    fn clone(&self) -> Self {
        Self { sock: self.sock.clone(), codec: self.codec.clone(), _t: PhantomData }
    }
}

impl<T, C> fmt::Debug for DatagramSender<T, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatagramSender").field("socket", &self.sock).finish()
    }
}

impl<T: Serialize, C: Codec> DatagramSender<T, C> {
    /// Encode `msg` into a pool buffer and send it to `to`, a peer or a
    /// group. Success means handed to the OS or the device, not delivered.
    pub fn send_to(&self, msg: &T, to: &SocketAddr) -> Result<(), DatagramSendError> {
        self.send_with(msg, to, |sock, len| sock.alloc(len, None))
    }

    /// [`DatagramSender::send_to`] for a task: a pool at its cap is
    /// `Pool(Exhausted)`, with `waker` woken when a buffer comes back.
    #[cfg(feature = "tokio")]
    pub(crate) fn send_to_or_wake(
        &self,
        msg: &T,
        to: &SocketAddr,
        waker: &std::task::Waker,
    ) -> Result<(), DatagramSendError> {
        self.send_with(msg, to, |sock, len| sock.pool().alloc_or_wake(len, waker))
    }

    fn send_with(
        &self,
        msg: &T,
        to: &SocketAddr,
        alloc: impl FnOnce(&DatagramSocket, usize) -> Result<zerocast_mem::Buf, PoolError>,
    ) -> Result<(), DatagramSendError> {
        let len = self.codec.encoded_len(msg).map_err(DatagramSendError::Codec)?;
        let max = self.sock.max_datagram();
        if len > max {
            return Err(DatagramSendError::TooLarge { len, max });
        }
        let mut buf = alloc(&self.sock, len)?;
        let n = self.codec.encode(msg, &mut buf).map_err(DatagramSendError::Codec)?;
        buf.set_len(n);
        self.sock.send_to(buf, to).map_err(|(_, e)| DatagramSendError::Send(e))
    }

    /// The socket underneath.
    pub fn socket(&self) -> &DatagramSocket {
        &self.sock
    }
}

/// Receives typed messages from datagrams.
pub struct DatagramReceiver<T, C = crate::Bincode> {
    sock: Arc<DatagramSocket>,
    codec: C,
    _t: PhantomData<fn() -> T>,
}

impl<T, C> fmt::Debug for DatagramReceiver<T, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatagramReceiver").field("socket", &self.sock).finish()
    }
}

impl<T: DeserializeOwned, C: Codec> DatagramReceiver<T, C> {
    /// Receive and decode one message and its source, waiting forever.
    pub fn recv_from(&self) -> Result<(T, SocketAddr), TypedDatagramError> {
        self.recv_deadline(None)
    }

    /// As [`recv_from`](Self::recv_from), waiting at most `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<(T, SocketAddr), TypedDatagramError> {
        self.recv_deadline(Instant::now().checked_add(timeout))
    }

    /// A message if one is there now, else [`RecvError::Empty`].
    pub fn try_recv_from(&self) -> Result<(T, SocketAddr), TypedDatagramError> {
        let (d, from) = self.sock.try_recv_from()?;
        self.decode(&d, from)
    }

    /// [`DatagramSocket::try_recv_armed`], decoded.
    #[cfg(feature = "tokio")]
    pub(crate) fn try_recv_armed(&self) -> Result<(T, SocketAddr), TypedDatagramError> {
        let (d, from) = self.sock.try_recv_armed()?;
        self.decode(&d, from)
    }

    /// Receive until `deadline` (`None`: forever).
    pub fn recv_deadline(&self, deadline: Option<Instant>) -> Result<(T, SocketAddr), TypedDatagramError> {
        let (d, from) = self.sock.recv_from(deadline)?;
        self.decode(&d, from)
    }

    fn decode(&self, bytes: &[u8], from: SocketAddr) -> Result<(T, SocketAddr), TypedDatagramError> {
        let msg = self.codec.decode(bytes).map_err(|source| TypedDatagramError::Decode { from, source })?;
        Ok((msg, from))
    }

    /// The socket underneath.
    pub fn socket(&self) -> &DatagramSocket {
        &self.sock
    }
}
