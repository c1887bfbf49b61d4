//! The facade's errors.

pub use zerocast_core::{AcceptError, Classify, ConnError, ConnectError, ErrorKind, RecvError, SendError};
pub use zerocast_mem::PoolError;

pub use crate::codec::CodecError;
pub use crate::typecheck::AnnouncementError;

/// A typed receive that produced no message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TypedRecvError {
    /// The transport produced no message.
    #[error(transparent)]
    Recv(#[from] RecvError),
    /// A message arrived but is not a valid `T`. The connection stays up;
    /// the bad message is dropped.
    #[error("received a message that does not decode")]
    Decode(#[source] CodecError),
    /// The peer's sender announced a message type other than this
    /// receiver's `T`. Every later receive on this receiver fails the same
    /// way: what follows would be misread.
    #[error(
        "the peer sends `{sent}` but this receiver expects `{expected}`; split the connection \
         with the same message type on both ends"
    )]
    TypeMismatch {
        /// The type the peer's `Sender` announced.
        sent: String,
        /// This receiver's type.
        expected: &'static str,
    },
    /// A message starts like a type announcement but is not one. The
    /// connection stays up; the message is dropped.
    #[error("received a malformed type announcement")]
    Announcement(#[source] AnnouncementError),
}

impl TypedRecvError {
    /// Whether the connection is gone (as opposed to an empty or bad receive).
    pub fn is_disconnected(&self) -> bool {
        matches!(self, TypedRecvError::Recv(RecvError::Disconnected | RecvError::Failed(_)))
    }

    /// What kind of failure this is: a message that does not decode, a
    /// type mismatch or a malformed announcement is the peer's
    /// [`ErrorKind::Protocol`]; `None` for an empty `try_recv`.
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            TypedRecvError::Recv(e) => e.kind(),
            TypedRecvError::Decode(_)
            | TypedRecvError::TypeMismatch { .. }
            | TypedRecvError::Announcement(_) => Some(ErrorKind::Protocol),
        }
    }
}

impl Classify for CodecError {
    /// A message of ours that does not encode is our input; bytes of the
    /// peer's that do not decode break the protocol.
    fn kind(&self) -> ErrorKind {
        match self {
            CodecError::BufferTooSmall { .. } | CodecError::Encode(_) => ErrorKind::InvalidInput,
            CodecError::Decode(_) | CodecError::Trailing { .. } => ErrorKind::Protocol,
            // Our own limit, set by our configuration.
            CodecError::LimitExceeded { .. } => ErrorKind::LocalResource,
        }
    }
}

/// Anything the facade can fail with, for applications that want one type.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Connecting or listening failed.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// A listener is closed or broken.
    #[error(transparent)]
    Accept(#[from] AcceptError),
    /// The pool could not provide a buffer.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// A receive failed.
    #[error(transparent)]
    Recv(#[from] TypedRecvError),
    /// A send failed. The message is dropped in this conversion; the
    /// reason, its kind and its source are kept.
    #[error(transparent)]
    Send(SendError<()>),
}

impl<T> From<SendError<T>> for Error {
    fn from(e: SendError<T>) -> Self {
        Error::Send(e.map(drop))
    }
}

impl Error {
    /// What kind of failure this is, the same on every transport. Nothing
    /// ready (an empty `try_recv`, a `try_send` without credit) counts as
    /// [`ErrorKind::Timeout`]: a deadline of zero that passed.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Connect(e) => e.kind(),
            Error::Accept(e) => e.kind(),
            Error::Pool(e) => e.kind(),
            Error::Recv(e) => e.kind().unwrap_or(ErrorKind::Timeout),
            Error::Send(e) => e.kind().unwrap_or(ErrorKind::Timeout),
        }
    }

    /// Whether trying again may succeed without changing anything here
    /// (see [`ErrorKind::is_retryable`]).
    pub fn is_retryable(&self) -> bool {
        self.kind().is_retryable()
    }
}
