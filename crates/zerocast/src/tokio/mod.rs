//! The async API, for tokio applications (feature `tokio`).
//!
//! The same URIs, transports, buffers and errors as the blocking API, for
//! tasks: a [`Zerocast`] made inside a runtime runs its engines as tasks
//! of that runtime, with no thread of their own. Each engine's epoll
//! descriptor is watched through the runtime's reactor, and the task that
//! drives it progresses until nothing is pending, arms, and only then
//! waits, so no event is lost and nothing polls on a timer. A `tcp://`
//! socket and an RDMA engine's completion channel are also watched by the
//! reactor itself, so the task waiting on a connection is woken by its own
//! data and reads its socket or polls its CQ itself, with no engine task
//! between; the engine reads those connections only at its timer, and
//! reads `mem://` ones and rdma_cm event channels for their tasks. A
//! sending task writes its frame (or posts its work request) itself when
//! the link is quiet.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let zc = zerocast::tokio::Zerocast::new();
//! let listener = zc.listen("tcp://127.0.0.1:0").await?;
//! let uri = listener.local_endpoint().to_string();
//!
//! let server = tokio::spawn(async move {
//!     let conn = listener.accept().await?;
//!     let (tx, rx) = conn.split::<String, String>();
//!     while let Ok(msg) = rx.recv().await {
//!         tx.send(msg.to_uppercase()).await.map_err(|e| e.to_string())?;
//!     }
//!     Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
//! });
//!
//! let (tx, rx) = zc.connect(&uri).await?.split::<String, String>();
//! tx.send("hello".to_owned()).await?;
//! assert_eq!(rx.recv().await?, "HELLO");
//! drop((tx, rx));
//! server.await?.map_err(|e| e.to_string())?;
//! # Ok(())
//! # }
//! ```
//!
//! **Cancellation.** Every `async` method may be dropped at an `.await`:
//! a receive takes a message only in the poll that returns it, and a send
//! either sent its message whole or not at all. Each method says what
//! happens to what it was given.
//!
//! **Datagrams.** [`Zerocast::bind_datagram`] opens `ud://` and `mcast://`
//! endpoints (RDMA UD or UDP, chosen as the blocking API chooses) whose
//! receives wait on the engine.
//!
//! **Blocking and async.** A connection moves between the two APIs with
//! [`Connection::from_blocking`] and [`Connection::into_blocking`]. Never
//! call a blocking method from a task: it holds the runtime's thread,
//! which the engines may need. [`Zerocast::blocking`] gives the blocking
//! context on the same engines, for threads outside the runtime.
//!
//! The runtime needs I/O and time enabled (`enable_all`, or
//! `#[tokio::main]`), and must outlive the connections: its tasks drive
//! them.

mod channel;
mod conn;
#[cfg(feature = "tcp")]
mod datagram;
mod driver;
mod hub;
mod ready;

pub use channel::{Receiver, Sender};
pub use conn::{Connection, Incoming, Listener};
#[cfg(feature = "tcp")]
pub use datagram::{DatagramReceiver, DatagramSender, DatagramSocket};
pub(crate) use driver::drive;

use zerocast_core::{ConnectError, Endpoint};

use crate::Config;

/// An async context: settings, the shared pool and the engines, which run
/// as tasks of the runtime it was made in. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Zerocast {
    inner: crate::Zerocast,
}

impl Zerocast {
    /// Default settings, on the current runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime, as `tokio::spawn` does.
    pub fn new() -> Self {
        Self::with_config(Config::default())
    }

    /// The given settings, on the current runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn with_config(cfg: Config) -> Self {
        Self::with_runtime(cfg, ::tokio::runtime::Handle::current())
    }

    /// The given settings, with the engines on `runtime`.
    pub fn with_runtime(cfg: Config, runtime: ::tokio::runtime::Handle) -> Self {
        Self { inner: crate::Zerocast::on_runtime(cfg, runtime) }
    }

    /// The blocking context on the same engines and pool, for threads
    /// outside the runtime.
    pub fn blocking(&self) -> &crate::Zerocast {
        &self.inner
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        self.inner.config()
    }

    /// Connect to `uri`: the same URIs (and `auto://` resolution through
    /// `ZEROCAST_TRANSPORTS`) as [`crate::Zerocast::connect`].
    ///
    /// On `tcp://` (the connect and the hello exchange), `rc://` (the
    /// address and route resolution, the connect request and its answer)
    /// and `rc+oob://` (the side channel's connect and the exchange of
    /// records) the handshake runs on the engine with no thread waiting; a
    /// `tcp://` or `rc+oob://` name is resolved through
    /// `tokio::net::lookup_host`.
    /// Cancel-safe: a dropped future abandons the attempt, and a
    /// connection it made meanwhile is closed.
    pub async fn connect(&self, uri: &str) -> Result<Connection, ConnectError> {
        let ep = self.inner.resolve(&Endpoint::parse(uri)?)?;
        let conn = self.inner.connect_async(&ep).await?;
        Connection::fresh(conn)
    }

    /// Listen at `uri` (see [`crate::Zerocast::listen`]).
    pub async fn listen(&self, uri: &str) -> Result<Listener, ConnectError> {
        Ok(Listener::new(self.inner.listen(uri)?))
    }

    /// Open a datagram endpoint, `ud://` or `mcast://` (see
    /// [`crate::Zerocast::bind_datagram`]); its receives wait on one of
    /// this context's engines.
    #[cfg(feature = "tcp")]
    pub async fn bind_datagram(&self, uri: &str) -> Result<DatagramSocket, crate::datagram::DatagramError> {
        use crate::datagram::DatagramError::LocalResource;
        let sock = self.inner.bind_datagram(uri)?;
        let engines = self.inner.engines().map_err(|e| LocalResource {
            what: "start an engine to wait on the socket",
            source: std::io::Error::other(e),
        })?;
        DatagramSocket::new(sock, engines.pick())
            .map_err(|source| LocalResource { what: "watch the socket's descriptor", source })
    }
}

impl Default for Zerocast {
    fn default() -> Self {
        Self::new()
    }
}
