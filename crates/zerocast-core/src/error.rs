//! Errors shared by every transport. A failed send hands its buffer back.

use std::fmt;
use std::io;
use std::sync::Arc;

use crate::credit::CreditError;
use crate::frame::FrameError;
use crate::handshake::HandshakeError;

/// Why a connection ended abnormally. Cloneable, so every handle of the
/// connection can report it.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ConnError {
    /// The peer sent a malformed frame.
    #[error("peer sent a malformed frame")]
    Frame(#[from] FrameError),
    /// The peer broke the credit protocol.
    #[error("peer broke the credit protocol")]
    Credit(#[from] CreditError),
    /// The handshake failed.
    #[error("handshake failed")]
    Handshake(#[from] HandshakeError),
    /// The peer closed the stream in the middle of a frame.
    #[error("peer closed the connection in the middle of a frame ({got} of {expected} bytes)")]
    Truncated {
        /// Bytes of the frame received.
        got: u64,
        /// Bytes the frame should have had.
        expected: u64,
    },
    /// An operating-system I/O error.
    #[error("I/O error on the connection")]
    Io(#[source] Arc<io::Error>),
    /// A backend-specific failure (for example a verbs work completion error).
    #[error("transport failure")]
    Transport(#[source] Arc<dyn std::error::Error + Send + Sync>),
    /// The peer sent a message larger than this side can take.
    #[error("message of {len} bytes is larger than the {max}-byte buffers this side has; raise max_payload on both sides")]
    TooLarge {
        /// The message length.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// The peer used a feature this transport does not have.
    #[error("peer sent a {0} frame, which this transport does not support")]
    Unsupported(&'static str),
    /// No progress within the configured time (for example a peer that stopped mid-frame).
    #[error("connection timed out: {0}")]
    TimedOut(&'static str),
    /// The peer's stream ended without its goodbye: the peer process died or
    /// dropped the connection without closing it.
    #[error("the peer ended the connection without a goodbye (its process died or reset the connection)")]
    Aborted,
    /// Heartbeats were on and nothing at all came from the peer for
    /// [`HEARTBEAT_MISSES`](crate::HEARTBEAT_MISSES) intervals: the peer
    /// process hangs, or the path to it is down, without a FIN or RST.
    #[error(
        "no frame from the peer for {silent_ms} ms (heartbeat every {interval_ms} ms): \
         the peer stopped or the path to it is down"
    )]
    HeartbeatTimeout {
        /// Milliseconds since the last frame from the peer.
        silent_ms: u64,
        /// The connection's heartbeat interval, in milliseconds.
        interval_ms: u64,
    },
}

impl From<io::Error> for ConnError {
    fn from(e: io::Error) -> Self {
        ConnError::Io(Arc::new(e))
    }
}

impl ConnError {
    /// Wrap a backend error.
    pub fn transport(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        ConnError::Transport(Arc::new(e))
    }
}

/// A send that did not happen. Every variant hands the buffer (or message) back.
#[non_exhaustive]
pub enum SendError<T> {
    /// No credit right now (only from `try_send`): the peer has no free
    /// receive buffer.
    Full(T),
    /// No credit came within the deadline.
    Timeout(T),
    /// The connection is closed.
    Disconnected(T),
    /// The connection failed.
    Failed(T, ConnError),
    /// The message was refused before it was sent: it could not be encoded,
    /// or it is larger than the connection carries. The connection is fine.
    Rejected(T, Arc<dyn std::error::Error + Send + Sync>),
}

impl<T> SendError<T> {
    /// Take the buffer or message back.
    pub fn into_inner(self) -> T {
        match self {
            SendError::Full(t)
            | SendError::Timeout(t)
            | SendError::Disconnected(t)
            | SendError::Failed(t, _)
            | SendError::Rejected(t, _) => t,
        }
    }

    /// Keep the reason, change what is handed back.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> SendError<U> {
        match self {
            SendError::Full(t) => SendError::Full(f(t)),
            SendError::Timeout(t) => SendError::Timeout(f(t)),
            SendError::Disconnected(t) => SendError::Disconnected(f(t)),
            SendError::Failed(t, e) => SendError::Failed(f(t), e),
            SendError::Rejected(t, e) => SendError::Rejected(f(t), e),
        }
    }

    /// Whether the connection is gone for good.
    pub fn is_disconnected(&self) -> bool {
        matches!(self, SendError::Disconnected(_) | SendError::Failed(..))
    }
}

impl<T> fmt::Debug for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendError::Full(_) => f.write_str("Full(..)"),
            SendError::Timeout(_) => f.write_str("Timeout(..)"),
            SendError::Disconnected(_) => f.write_str("Disconnected(..)"),
            SendError::Failed(_, e) => write!(f, "Failed(.., {e:?})"),
            SendError::Rejected(_, e) => write!(f, "Rejected(.., {e:?})"),
        }
    }
}

impl<T> fmt::Display for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendError::Full(_) => f.write_str("send blocked: the peer has no free receive buffer"),
            SendError::Timeout(_) => f.write_str("send timed out waiting for credit"),
            SendError::Disconnected(_) => f.write_str("send on a closed connection"),
            SendError::Failed(_, e) => write!(f, "send on a failed connection: {e}"),
            SendError::Rejected(_, e) => write!(f, "message refused: {e}"),
        }
    }
}

impl<T> std::error::Error for SendError<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SendError::Failed(_, e) => Some(e),
            SendError::Rejected(_, e) => Some(&**e),
            _ => None,
        }
    }
}

/// A receive that produced no message.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RecvError {
    /// Nothing buffered right now (only from `try_recv`).
    #[error("no message ready")]
    Empty,
    /// Nothing arrived within the deadline.
    #[error("receive timed out")]
    Timeout,
    /// The peer closed the connection and every buffered message was received.
    #[error("connection closed by the peer")]
    Disconnected,
    /// The connection failed; buffered messages were received first.
    #[error("connection failed")]
    Failed(#[source] ConnError),
}

/// Connecting, listening or accepting failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The endpoint is malformed or names an unusable transport.
    #[error("bad endpoint")]
    Uri(#[from] crate::uri::UriError),
    /// The transport is not compiled in or not usable here.
    #[error("transport `{scheme}` is not available: {reason}")]
    Unavailable {
        /// The scheme asked for.
        scheme: crate::uri::Scheme,
        /// Why.
        reason: String,
    },
    /// Address resolution or socket setup failed.
    #[error("I/O error while connecting to {endpoint}")]
    Io {
        /// The endpoint.
        endpoint: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The handshake failed.
    #[error("handshake with {endpoint} failed")]
    Handshake {
        /// The endpoint.
        endpoint: String,
        /// Why.
        #[source]
        source: ConnError,
    },
    /// No peer listens at a `mem://` name, or the listener was closed.
    #[error("nothing listens at {0}")]
    Refused(String),
    /// The name or port is taken.
    #[error("{0} is already in use")]
    InUse(String),
    /// The operation did not finish in time.
    #[error("timed out connecting to {0}")]
    Timeout(String),
    /// Backend-specific failure.
    #[error("transport error")]
    Transport(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The listener was closed.
    #[error("listener closed")]
    Closed,
}

/// Why a listener handed out no connection.
///
/// A peer whose handshake fails is never reported here: the listener counts
/// it ([`ListenerStats::handshakes_failed`](crate::ListenerStats)), logs it
/// at `debug` and waits for the next peer. So every variant but
/// [`AcceptError::Timeout`] means the listener is done, and an accept loop
/// may end on any error:
///
/// ```ignore
/// loop {
///     let conn = listener.accept()?;
///     // ...
/// }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AcceptError {
    /// The listener was closed, before or while waiting.
    #[error("the listener was closed")]
    Closed,
    /// No connection came within the time given (timed and non-blocking
    /// accepts only). The listener keeps working.
    #[error("no connection arrived in time")]
    Timeout,
    /// The listener itself failed (its socket or event channel broke); it
    /// will accept nothing more. Listen again.
    #[error("the listener failed; listen again")]
    Failed(#[source] ConnectError),
}

impl AcceptError {
    /// Whether the listener is done for good (anything but a timeout).
    pub fn is_fatal(&self) -> bool {
        !matches!(self, AcceptError::Timeout)
    }
}
