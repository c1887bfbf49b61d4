//! The transport traits every backend implements.
//!
//! The data path is monomorphized: buffers are associated types and what a
//! transport can do is a set of associated constants, so generic code can
//! branch on `T::CAPS` at compile time. `dyn` appears only at the cold edge
//! where a URI picks a backend (the facade's private flavor enum).

use std::ops::{Deref, DerefMut};
use std::time::Instant;

use crate::error::{AcceptError, ConnectError, RecvError, SendError};
use crate::uri::Endpoint;

/// What a transport guarantees and offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Messages are never lost while the connection is up.
    pub reliable: bool,
    /// Messages arrive in the order they were sent.
    pub ordered: bool,
    /// One send can reach a group of receivers.
    pub multicast: bool,
    /// RDMA READ/WRITE into exposed remote memory.
    pub one_sided: bool,
}

impl Caps {
    /// A reliable, ordered stream with no multicast or one-sided access.
    pub const STREAM: Caps = Caps { reliable: true, ordered: true, multicast: false, one_sided: false };
    /// Best-effort datagrams that may join multicast groups.
    pub const DATAGRAM: Caps = Caps { reliable: false, ordered: false, multicast: true, one_sided: false };
}

/// A buffer that a send takes by value. It stays out of the pool until the
/// transport reports the send complete.
pub trait TxBuffer: DerefMut<Target = [u8]> + Send + 'static {
    /// Bytes the buffer can hold.
    fn capacity(&self) -> usize;
    /// Set the message length (at most [`TxBuffer::capacity`]).
    fn set_len(&mut self, len: usize);
    /// The whole buffer, for writing in place before [`TxBuffer::set_len`].
    fn spare_capacity(&mut self) -> &mut [u8];
}

/// A reliable (or at least connected) two-party connection.
///
/// Every method takes `&self`: one thread may send while another receives.
/// Deadlines are passed in; `None` waits forever.
pub trait Connection: Send + Sync + 'static {
    /// What this transport guarantees.
    const CAPS: Caps;
    /// A pooled send buffer.
    type TxBuf: TxBuffer;
    /// A received message. Dropping it reposts the buffer and returns a
    /// credit to the peer.
    type RxBuf: Deref<Target = [u8]> + Send + 'static;
    /// Why a buffer could not be had.
    type AllocError: std::error::Error + Send + Sync + 'static;

    /// A send buffer for a message of `len` bytes (its length is set to `len`).
    fn alloc(&self, len: usize, deadline: Option<Instant>) -> Result<Self::TxBuf, Self::AllocError>;
    /// Send a buffer, waiting for credit until `deadline`.
    fn send(&self, buf: Self::TxBuf, deadline: Option<Instant>) -> Result<(), SendError<Self::TxBuf>>;
    /// Send a buffer if credit is available now.
    fn try_send(&self, buf: Self::TxBuf) -> Result<(), SendError<Self::TxBuf>>;
    /// Receive a message, waiting until `deadline`.
    fn recv(&self, deadline: Option<Instant>) -> Result<Self::RxBuf, RecvError>;
    /// Receive a message if one is buffered.
    fn try_recv(&self) -> Result<Self::RxBuf, RecvError>;
    /// Largest message this connection can send in one buffer.
    fn max_message(&self) -> usize;
    /// Close the sending side: queued messages are still delivered, then the
    /// peer sees a disconnect. Receiving goes on until the peer closes too.
    fn close(&self);
    /// The peer's endpoint, for logs.
    fn peer(&self) -> &Endpoint;
}

/// Accepts connections.
///
/// Only what ends the listener is an error of [`Listener::accept`]: a peer
/// whose handshake fails (a port scanner, a peer speaking another protocol,
/// a client that gives up) is counted in [`Listener::stats`] and logged at
/// `debug`, and the accept goes on waiting for the next peer.
pub trait Listener: Send + Sync + 'static {
    /// The connections it yields.
    type Conn: Connection;
    /// Wait until `deadline` (`None`: for as long as it takes) for the next
    /// connection. [`AcceptError::Timeout`] once the deadline passed (a
    /// deadline already past makes it a non-blocking poll),
    /// [`AcceptError::Closed`] once [`Listener::close`] was called.
    fn accept_until(&self, deadline: Option<Instant>) -> Result<Self::Conn, AcceptError>;
    /// Wait for the next connection.
    fn accept(&self) -> Result<Self::Conn, AcceptError> {
        self.accept_until(None)
    }
    /// The accept of an async task: `Ready` with the next connection (or
    /// the listener's end) if there is one, else `Pending`, the task to be
    /// woken when a connection is queued or the listener closes. Never
    /// blocks.
    fn poll_accept(
        &self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<Self::Conn, AcceptError>>;
    /// Stop accepting: a thread blocked in an accept returns
    /// [`AcceptError::Closed`], and so does every later accept. Peers
    /// connecting from now on are refused. Connections already handed out
    /// are not affected.
    fn close(&self);
    /// Counters: connections accepted, handshakes failed.
    fn stats(&self) -> ListenerStats;
    /// Where peers can connect (with the bound port when 0 was asked for).
    fn local_endpoint(&self) -> &Endpoint;
}

/// A listener's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListenerStats {
    /// Connections handed out by an accept.
    pub accepted: u64,
    /// Peers whose handshake failed: garbage, silence past the handshake
    /// timeout, a peer that hung up, an incompatible hello.
    pub handshakes_failed: u64,
    /// Peers turned away by the listener's own limits (an RDMA listener
    /// whose shared receive queue has no share left).
    pub refused: u64,
    /// Transient errors from the operating system while accepting (out of
    /// file descriptors, say); the listener paused briefly and went on.
    pub accept_errors: u64,
}

/// A connection-oriented transport: listen and connect.
pub trait Transport: Send + Sync + 'static {
    /// Its connections.
    type Conn: Connection;
    /// Its listener.
    type Listener: Listener<Conn = Self::Conn>;
    /// Listen at `ep`.
    fn listen(&self, ep: &Endpoint) -> Result<Self::Listener, ConnectError>;
    /// Connect to `ep`.
    fn connect(&self, ep: &Endpoint) -> Result<Self::Conn, ConnectError>;
}

/// An unreliable datagram endpoint that may join multicast groups.
pub trait Datagram: Send + Sync + 'static {
    /// What this transport guarantees.
    const CAPS: Caps;
    /// A pooled send buffer.
    type TxBuf: TxBuffer;
    /// A received datagram.
    type RxBuf: Deref<Target = [u8]> + Send + 'static;
    /// A peer or group address.
    type Addr: Clone + Send + Sync + std::fmt::Debug + 'static;
    /// Why a buffer could not be had.
    type AllocError: std::error::Error + Send + Sync + 'static;
    /// Why a datagram operation failed.
    type Error: std::error::Error + Send + Sync + 'static;

    /// A send buffer of `len` bytes.
    fn alloc(&self, len: usize, deadline: Option<Instant>) -> Result<Self::TxBuf, Self::AllocError>;
    /// Send one datagram; the buffer comes back on error.
    fn send_to(&self, buf: Self::TxBuf, to: &Self::Addr) -> Result<(), (Self::TxBuf, Self::Error)>;
    /// Send the datagrams of `batch` in order, taking each one sent out of
    /// `batch` (which keeps its capacity). On error, the datagram that
    /// failed and every one after it stay in `batch`, in order. Backends
    /// that can hand the device several datagrams at once do; this default
    /// calls [`send_to`](Self::send_to) for each.
    fn send_batch(&self, batch: &mut Vec<(Self::TxBuf, Self::Addr)>) -> Result<(), Self::Error> {
        // Popped from the back of the reversed batch: in order, and with
        // no shifting or allocation.
        batch.reverse();
        while let Some((buf, to)) = batch.pop() {
            if let Err((buf, e)) = self.send_to(buf, &to) {
                batch.push((buf, to));
                batch.reverse();
                return Err(e);
            }
        }
        Ok(())
    }
    /// Receive one datagram and its source.
    fn recv_from(&self, deadline: Option<Instant>) -> Result<(Self::RxBuf, Self::Addr), RecvError>;
    /// Join a multicast group.
    fn join(&self, group: &Self::Addr) -> Result<(), Self::Error>;
    /// Leave a multicast group.
    fn leave(&self, group: &Self::Addr) -> Result<(), Self::Error>;
    /// Largest datagram payload.
    fn max_datagram(&self) -> usize;
    /// The local address.
    fn local_addr(&self) -> Self::Addr;
}
