//! The raw, zero-copy connection API and the listener.

use std::time::{Duration, Instant};

use zerocast_core::{Caps, Connection as _, Endpoint, Listener as _, RecvError, Scheme, SendError};
use zerocast_link::{LinkStats, RecvBuf};
use zerocast_mem::{Buf, PoolError};

use crate::channel::{Receiver, Sender};
use crate::codec::{Bincode, Codec};
use crate::ConnectError;

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
/// Clones share the connection. It closes when the last clone drops;
/// messages already sent are still delivered.
#[derive(Debug, Clone)]
pub struct Connection {
    flavor: Flavor,
    /// Whether typed senders split from it announce their type.
    typed_check: bool,
}

impl Connection {
    pub(crate) fn new(flavor: Flavor, typed_check: bool) -> Self {
        Self { flavor, typed_check }
    }

    fn link(&self) -> &zerocast_link::Link {
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

    /// Close the sending side; the peer sees a disconnect after the
    /// messages already sent.
    pub fn close(&self) {
        each!(&self.flavor, c => c.close())
    }

    /// Close the sending side and wait, up to `timeout`, until the
    /// connection is over: both sides said goodbye and ours is out (on
    /// RDMA: its completion polled). Call it before a process exits, so the peer sees
    /// a clean disconnect rather than a vanished peer. `true` for a clean
    /// end; `false` if the connection failed or the peer did not close in
    /// time.
    pub fn close_and_wait(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        each!(&self.flavor, c => {
            c.close();
            c.link().wait_closed(Some(deadline))
        })
    }

    pub(crate) fn close_receiver(&self) {
        each!(&self.flavor, c => c.close_receiver())
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
    pub fn split_with<S, R, C: Codec>(self, codec: C) -> (Sender<S, C>, Receiver<R, C>) {
        let check = self.typed_check;
        (Sender::new(self.clone(), codec.clone(), check), Receiver::new(self, codec))
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
#[derive(Debug)]
pub struct Listener {
    pub(crate) flavor: ListenerFlavor,
    /// [`Config::typed_check`](crate::Config::typed_check) for the
    /// connections it accepts.
    pub(crate) typed_check: bool,
}

impl Listener {
    /// Wait for the next connection. A peer whose handshake fails is
    /// reported as an error; the listener keeps working.
    pub fn accept(&self) -> Result<Connection, ConnectError> {
        let flavor = match &self.flavor {
            #[cfg(feature = "mem")]
            ListenerFlavor::Mem(l) => Flavor::Mem(l.accept()?),
            #[cfg(feature = "tcp")]
            ListenerFlavor::Tcp(l) => Flavor::Tcp(l.accept()?),
            #[cfg(feature = "rdma")]
            ListenerFlavor::Rc(l) => Flavor::Rc(l.accept()?),
        };
        Ok(Connection::new(flavor, self.typed_check))
    }

    /// Where peers connect (the bound port when port 0 was asked for).
    pub fn local_endpoint(&self) -> &Endpoint {
        match &self.flavor {
            #[cfg(feature = "mem")]
            ListenerFlavor::Mem(l) => l.local_endpoint(),
            #[cfg(feature = "tcp")]
            ListenerFlavor::Tcp(l) => l.local_endpoint(),
            #[cfg(feature = "rdma")]
            ListenerFlavor::Rc(l) => l.local_endpoint(),
        }
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
