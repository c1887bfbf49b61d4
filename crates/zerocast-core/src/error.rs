//! Errors shared by every transport. A failed send hands its buffer back.

use std::fmt;
use std::io;
use std::sync::Arc;

use crate::credit::CreditError;
use crate::frame::FrameError;
use crate::handshake::HandshakeError;

/// What kind of failure an error is: the same on every transport, for the
/// same event, so that code written against `tcp://` handles `rc://` too.
/// A reconnect loop needs only this (see [`ErrorKind::is_retryable`]); the
/// transport's own detail stays available as the error's `source()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The connection was closed in order: a goodbye, or `close()`.
    /// Nothing failed.
    Closed,
    /// The peer is gone or unreachable: its process died, it reset,
    /// aborted or disconnected the connection without a goodbye, or its
    /// transport stopped acknowledging (retries exhausted, host
    /// unreachable). A killed peer is this on every transport, whichever
    /// of these the timing shows first. Reconnecting may work once it is
    /// back.
    PeerGone,
    /// The peer fell silent while its transport stayed up: no heartbeat
    /// for three intervals, or a frame or handshake that stalled part-way.
    /// Its process hangs, or the path to it is down without a reset.
    /// Reconnecting may work, later or through another path.
    PeerSilent,
    /// The peer broke the protocol: a malformed or oversized frame, a
    /// credit violation, an incompatible handshake, a one-sided access
    /// outside what it was given. Retrying the same peer is unlikely to
    /// help: it is broken, hostile, or of another version.
    Protocol,
    /// Nobody took the connection: nothing listens there, or the listener
    /// is full or refused it. Retry later.
    Refused,
    /// This side's deadline passed (a receive, a send waiting for credit,
    /// connecting). Retry, or wait longer.
    Timeout,
    /// A local resource ran out or is misconfigured: the pool at its cap,
    /// the memlock limit, a device or system error, an invalid setting.
    /// Fix the configuration; retrying as is fails the same way.
    LocalResource,
    /// This side refused its own input: a message too large or that does
    /// not encode, a malformed endpoint. The connection, if any, is fine.
    InvalidInput,
}

impl ErrorKind {
    /// Whether trying again (reconnecting, or repeating the call) may
    /// succeed without changing anything here: the peer or the path may
    /// come back, or a deadline was only too short.
    pub fn is_retryable(self) -> bool {
        matches!(self, ErrorKind::PeerGone | ErrorKind::PeerSilent | ErrorKind::Refused | ErrorKind::Timeout)
    }

    /// The kind of an operating-system error on a connection.
    pub fn of_io(kind: io::ErrorKind) -> Self {
        use io::ErrorKind as K;
        match kind {
            K::ConnectionReset
            | K::ConnectionAborted
            | K::BrokenPipe
            | K::UnexpectedEof
            | K::NotConnected => ErrorKind::PeerGone,
            K::ConnectionRefused => ErrorKind::Refused,
            K::TimedOut | K::HostUnreachable | K::NetworkUnreachable | K::NetworkDown => {
                ErrorKind::PeerSilent
            }
            K::InvalidInput | K::InvalidData => ErrorKind::InvalidInput,
            _ => ErrorKind::LocalResource,
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorKind::Closed => "closed",
            ErrorKind::PeerGone => "peer gone",
            ErrorKind::PeerSilent => "peer silent",
            ErrorKind::Protocol => "protocol violation",
            ErrorKind::Refused => "refused",
            ErrorKind::Timeout => "timed out",
            ErrorKind::LocalResource => "local resource",
            ErrorKind::InvalidInput => "invalid input",
        })
    }
}

/// An error that knows its [`ErrorKind`]. Backends implement it for their
/// own error types, which travel as the `source()` of a
/// [`ConnError::Transport`] or [`ConnectError::Transport`].
pub trait Classify {
    /// What kind of failure this is.
    fn kind(&self) -> ErrorKind;
}

impl Classify for io::Error {
    fn kind(&self) -> ErrorKind {
        ErrorKind::of_io(io::Error::kind(self))
    }
}

/// Why a connection ended abnormally. Cloneable, so every handle of the
/// connection can report it. [`ConnError::kind`] classifies it the same
/// way on every transport.
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
    /// A backend-specific failure (for example a verbs work completion
    /// error), classified by the backend; the detail is the `source()`.
    #[error("transport failure ({kind})")]
    Transport {
        /// What kind of failure it is.
        kind: ErrorKind,
        /// The backend's error.
        #[source]
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
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
    /// Wrap a backend error, classified by its [`Classify`] impl.
    pub fn transport(e: impl std::error::Error + Classify + Send + Sync + 'static) -> Self {
        ConnError::Transport { kind: e.kind(), source: Arc::new(e) }
    }

    /// What kind of failure this is: the same for the same event on every
    /// transport.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ConnError::Frame(_)
            | ConnError::Credit(_)
            | ConnError::Handshake(_)
            | ConnError::TooLarge { .. }
            | ConnError::Unsupported(_) => ErrorKind::Protocol,
            ConnError::Truncated { .. } | ConnError::Aborted => ErrorKind::PeerGone,
            ConnError::Io(e) => ErrorKind::of_io(e.kind()),
            ConnError::Transport { kind, .. } => *kind,
            ConnError::TimedOut(_) | ConnError::HeartbeatTimeout { .. } => ErrorKind::PeerSilent,
        }
    }

    /// The backend's error, when it is of type `E` (an `RcError`, say).
    pub fn transport_error<E: std::error::Error + 'static>(&self) -> Option<&E> {
        match self {
            ConnError::Transport { source, .. } => source.downcast_ref::<E>(),
            _ => None,
        }
    }
}

impl Classify for ConnError {
    fn kind(&self) -> ErrorKind {
        ConnError::kind(self)
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

    /// What kind of failure this is; `None` for [`SendError::Full`], which
    /// is no failure (try again once the peer returns credit).
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            SendError::Full(_) => None,
            SendError::Timeout(_) => Some(ErrorKind::Timeout),
            SendError::Disconnected(_) => Some(ErrorKind::Closed),
            SendError::Failed(_, e) => Some(e.kind()),
            SendError::Rejected(..) => Some(ErrorKind::InvalidInput),
        }
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
    #[error("connection failed ({})", .0.kind())]
    Failed(#[source] ConnError),
}

impl RecvError {
    /// What kind of failure this is; `None` for [`RecvError::Empty`],
    /// which is no failure.
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            RecvError::Empty => None,
            RecvError::Timeout => Some(ErrorKind::Timeout),
            RecvError::Disconnected => Some(ErrorKind::Closed),
            RecvError::Failed(e) => Some(e.kind()),
        }
    }
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
    /// Backend-specific failure, classified by the backend; the detail is
    /// the `source()`.
    #[error("transport error ({kind})")]
    Transport {
        /// What kind of failure it is.
        kind: ErrorKind,
        /// The backend's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The listener was closed.
    #[error("listener closed")]
    Closed,
}

impl ConnectError {
    /// Wrap a backend error, classified by its [`Classify`] impl.
    pub fn transport(e: impl std::error::Error + Classify + Send + Sync + 'static) -> Self {
        ConnectError::Transport { kind: e.kind(), source: Box::new(e) }
    }

    /// What kind of failure this is: the same for the same event on every
    /// transport. A peer that is down is [`ErrorKind::Refused`] (nothing
    /// listens) or [`ErrorKind::PeerGone`] (it went away mid-handshake).
    pub fn kind(&self) -> ErrorKind {
        match self {
            ConnectError::Uri(_) => ErrorKind::InvalidInput,
            ConnectError::Unavailable { .. } | ConnectError::InUse(_) => ErrorKind::LocalResource,
            ConnectError::Io { source, .. } => ErrorKind::of_io(source.kind()),
            ConnectError::Handshake { source, .. } => source.kind(),
            ConnectError::Refused(_) => ErrorKind::Refused,
            ConnectError::Timeout(_) => ErrorKind::Timeout,
            ConnectError::Transport { kind, .. } => *kind,
            ConnectError::Closed => ErrorKind::Closed,
        }
    }

    /// The backend's error, when it is of type `E` (an `RcError`, say).
    pub fn transport_error<E: std::error::Error + 'static>(&self) -> Option<&E> {
        match self {
            ConnectError::Transport { source, .. } => source.downcast_ref::<E>(),
            _ => None,
        }
    }
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

    /// What kind of failure this is: [`ErrorKind::Closed`], [`ErrorKind::Timeout`],
    /// or the kind of the listener's own failure.
    pub fn kind(&self) -> ErrorKind {
        match self {
            AcceptError::Closed => ErrorKind::Closed,
            AcceptError::Timeout => ErrorKind::Timeout,
            AcceptError::Failed(e) => e.kind(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("backend detail")]
    struct Detail;

    impl Classify for Detail {
        fn kind(&self) -> ErrorKind {
            ErrorKind::PeerGone
        }
    }

    #[test]
    fn the_same_event_is_the_same_kind_whatever_its_form() {
        // A vanished peer, as each transport reports it.
        let reset = ConnError::from(io::Error::from(io::ErrorKind::ConnectionReset));
        let pipe = ConnError::from(io::Error::from(io::ErrorKind::BrokenPipe));
        let backend = ConnError::transport(Detail);
        for e in [ConnError::Aborted, ConnError::Truncated { got: 1, expected: 2 }, reset, pipe, backend] {
            assert_eq!(e.kind(), ErrorKind::PeerGone, "{e:?}");
            assert!(e.kind().is_retryable());
        }
        let silent = ConnError::HeartbeatTimeout { silent_ms: 600, interval_ms: 200 };
        assert_eq!(silent.kind(), ErrorKind::PeerSilent);
        assert_eq!(ConnError::Unsupported("x").kind(), ErrorKind::Protocol);
        assert!(!ErrorKind::Protocol.is_retryable());
        assert!(!ErrorKind::LocalResource.is_retryable());
    }

    #[test]
    fn the_backend_detail_stays_the_source() {
        let e = ConnError::transport(Detail);
        let src = std::error::Error::source(&e).expect("a source");
        assert_eq!(src.to_string(), "backend detail");
        assert!(e.transport_error::<Detail>().is_some());
        assert!(e.to_string().contains("peer gone"), "{e}");
        let c = ConnectError::transport(Detail);
        assert_eq!(c.kind(), ErrorKind::PeerGone);
        assert!(c.transport_error::<Detail>().is_some());
    }

    #[test]
    fn receive_send_and_connect_errors_have_kinds() {
        assert_eq!(RecvError::Empty.kind(), None);
        assert_eq!(RecvError::Timeout.kind(), Some(ErrorKind::Timeout));
        assert_eq!(RecvError::Disconnected.kind(), Some(ErrorKind::Closed));
        assert_eq!(RecvError::Failed(ConnError::Aborted).kind(), Some(ErrorKind::PeerGone));
        assert_eq!(SendError::Full(()).kind(), None);
        assert_eq!(SendError::Disconnected(()).kind(), Some(ErrorKind::Closed));
        assert_eq!(SendError::Failed((), ConnError::Aborted).kind(), Some(ErrorKind::PeerGone));
        let refused = ConnectError::Io {
            endpoint: "tcp://127.0.0.1:1".into(),
            source: io::Error::from(io::ErrorKind::ConnectionRefused),
        };
        assert_eq!(refused.kind(), ErrorKind::Refused);
        assert!(refused.kind().is_retryable());
        assert_eq!(ConnectError::Refused("mem://x".into()).kind(), ErrorKind::Refused);
        assert_eq!(ConnectError::InUse("tcp://:1".into()).kind(), ErrorKind::LocalResource);
    }
}
