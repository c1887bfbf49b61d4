//! The facade's errors.

pub use zerocast_core::{AcceptError, ConnError, ConnectError, RecvError, SendError};
pub use zerocast_mem::PoolError;

pub use crate::codec::CodecError;

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
}

impl TypedRecvError {
    /// Whether the connection is gone (as opposed to an empty or bad receive).
    pub fn is_disconnected(&self) -> bool {
        matches!(self, TypedRecvError::Recv(RecvError::Disconnected | RecvError::Failed(_)))
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
    /// A send failed (the message is dropped in this conversion).
    #[error("{0}")]
    Send(String),
}

impl<T> From<SendError<T>> for Error {
    fn from(e: SendError<T>) -> Self {
        Error::Send(e.to_string())
    }
}
