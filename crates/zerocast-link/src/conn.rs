//! A ready-made [`zerocast_core::Connection`] over a [`Link`], shared by
//! every backend built on this crate.

use std::any::Any;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Instant;

use zerocast_core::{Caps, Endpoint, RecvError, SendError};
use zerocast_mem::{Buf, PoolError};

use crate::{Link, LinkStats, RecvBuf};

/// What distinguishes one backend's connections from another's.
pub trait Flavor: Send + Sync + 'static {
    /// The backend's guarantees.
    const CAPS: Caps;
    /// The URI scheme, for logs.
    const SCHEME: &'static str;
}

struct Inner {
    link: Link,
    /// Kept alive as long as the connection: the backend's I/O resources
    /// (threads' shutdown handles, a QP) that must outlive the handles.
    resources: Box<dyn Any + Send + Sync>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.link.close();
        self.link.close_receiver();
    }
}

/// A connection of backend `F`. Clones share the connection; when the last
/// clone drops, the connection closes (queued messages are still sent).
pub struct Connection<F: Flavor> {
    inner: Arc<Inner>,
    _flavor: PhantomData<fn() -> F>,
}

impl<F: Flavor> Clone for Connection<F> {
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone(), _flavor: PhantomData }
    }
}

impl<F: Flavor> fmt::Debug for Connection<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("scheme", &F::SCHEME)
            .field("peer", self.inner.link.peer())
            .finish()
    }
}

impl<F: Flavor> Connection<F> {
    /// Wrap a link; `resources` live as long as the connection.
    pub fn new(link: Link, resources: impl Send + Sync + 'static) -> Self {
        Self { inner: Arc::new(Inner { link, resources: Box::new(resources) }), _flavor: PhantomData }
    }

    /// The backend resources given to [`Connection::new`], if they are an
    /// `R`: how a backend reaches its own per-connection state (an RC
    /// connection's queue pair, for one-sided operations).
    pub fn resources<R: 'static>(&self) -> Option<&R> {
        self.inner.resources.downcast_ref::<R>()
    }

    /// The underlying link.
    pub fn link(&self) -> &Link {
        &self.inner.link
    }

    /// Counters.
    pub fn stats(&self) -> LinkStats {
        self.inner.link.stats()
    }

    /// Stop receiving: queued and later messages are released at once.
    pub fn close_receiver(&self) {
        self.inner.link.close_receiver();
    }
}

impl<F: Flavor> zerocast_core::Connection for Connection<F> {
    const CAPS: Caps = F::CAPS;
    type TxBuf = Buf;
    type RxBuf = RecvBuf;
    type AllocError = PoolError;

    #[inline(always)]
    fn alloc(&self, len: usize, deadline: Option<Instant>) -> Result<Buf, PoolError> {
        self.inner.link.alloc(len, deadline)
    }
    fn send(&self, buf: Buf, deadline: Option<Instant>) -> Result<(), SendError<Buf>> {
        self.inner.link.send(buf, deadline)
    }
    fn try_send(&self, buf: Buf) -> Result<(), SendError<Buf>> {
        self.inner.link.try_send(buf)
    }
    fn recv(&self, deadline: Option<Instant>) -> Result<RecvBuf, RecvError> {
        self.inner.link.recv(deadline)
    }
    fn try_recv(&self) -> Result<RecvBuf, RecvError> {
        self.inner.link.try_recv()
    }
    fn max_message(&self) -> usize {
        self.inner.link.max_message()
    }
    fn close(&self) {
        self.inner.link.close();
    }
    fn peer(&self) -> &Endpoint {
        self.inner.link.peer()
    }
}
