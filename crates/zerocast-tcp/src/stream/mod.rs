//! `tcp://`: reliable, ordered connections over TCP.

mod connect;
mod handshake;
mod listener;
mod reader;
mod staging;
mod task;
mod writer;

pub use listener::TcpListener;

use std::net::{Shutdown, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use zerocast_core::{Caps, ConnectError, Endpoint, ErrorKind, Hello, LinkConfig, Scheme};
use zerocast_link::engine::Engines;
use zerocast_link::{Completion, Flavor, LinkSetup};
use zerocast_mem::{Pool, PoolConfig};

use task::ConnTask;

/// The TCP flavor of [`zerocast_link::Connection`].
#[derive(Debug)]
pub enum Tcp {}

impl Flavor for Tcp {
    const CAPS: Caps = Caps::STREAM;
    const SCHEME: &'static str = "tcp";
}

/// A `tcp://` connection.
pub type TcpConnection = zerocast_link::Connection<Tcp>;

/// Settings of the TCP backend.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TcpConfig {
    /// Credits, payload limit and batching.
    pub link: LinkConfig,
    /// `SO_SNDBUF`, when set.
    pub send_buffer: Option<usize>,
    /// `SO_RCVBUF`, when set.
    pub recv_buffer: Option<usize>,
    /// Time allowed for connecting and for the handshake.
    pub handshake_timeout: Duration,
    /// A peer that stops in the middle of a frame for this long has its
    /// connection closed with [`ConnError::TimedOut`](zerocast_core::ConnError::TimedOut).
    pub frame_timeout: Duration,
}

impl Default for TcpConfig {
    fn default() -> Self {
        Self {
            link: LinkConfig::default(),
            send_buffer: None,
            recv_buffer: None,
            handshake_timeout: Duration::from_secs(5),
            frame_timeout: Duration::from_secs(10),
        }
    }
}

impl TcpConfig {
    /// Set the link settings.
    pub fn with_link(mut self, link: LinkConfig) -> Self {
        self.link = link;
        self
    }

    /// Set the socket buffer sizes.
    pub fn with_socket_buffers(mut self, send: Option<usize>, recv: Option<usize>) -> Self {
        self.send_buffer = send;
        self.recv_buffer = recv;
        self
    }

    /// Set the handshake and mid-frame timeouts.
    pub fn with_timeouts(mut self, handshake: Duration, frame: Duration) -> Self {
        self.handshake_timeout = handshake;
        self.frame_timeout = frame;
        self
    }

    /// A pool configuration whose buffers can hold this config's largest message.
    pub fn pool_config(&self) -> PoolConfig {
        pool_config_for(&self.link)
    }
}

/// Receive budget per slot of [`LinkConfig::recv_window`] on `tcp://`: the
/// window is counted in bytes, `recv_window` times this (4 MiB at the
/// default of 64, what an RDMA connection's 64 posted buffers of 64 KiB
/// hold).
pub const WINDOW_SLOT: u64 = 64 << 10;
/// The credit unit of `tcp://`: a message takes one credit per KiB begun
/// past its first, so a window of 64 slots lets 4,096 small messages fly
/// at once, or 63 of 64 KiB. The smallest unit the protocol allows
/// ([`zerocast_core::credit::MIN_UNIT`]): a small message's pool buffer
/// (256 bytes) is well inside it, so the byte bound holds, and a stream
/// of small messages waits for credit four times less often than with
/// 4 KiB credits (the sender that runs out sleeps until the peer's
/// credit frame wakes it).
pub const CREDIT_UNIT: u32 = zerocast_core::credit::MIN_UNIT;

/// The credit window and unit a `tcp://` side announces for `link`: the
/// budget of `recv_window` × [`WINDOW_SLOT`] bytes in credits of
/// [`CREDIT_UNIT`], raised as far as the largest message needs (see
/// [`zerocast_core::credit::min_window`]), with the unit doubled while the
/// window would not fit a hello. The payload bytes a peer can make this
/// side hold are bounded by the window times the unit (each in a pool
/// buffer of the size class at or above its length).
pub fn credits_for(link: &LinkConfig) -> (u32, u32) {
    use zerocast_core::credit::{min_window, MAX_WINDOW};
    let mut unit = CREDIT_UNIT;
    // At most 1 GiB a credit: a `max_payload` past what `validate` allows
    // gets the largest window, not an endless doubling.
    while min_window(link.max_payload, unit) > MAX_WINDOW && unit < 1 << 30 {
        unit *= 2;
    }
    let budget = u64::from(link.recv_window) * WINDOW_SLOT / u64::from(unit);
    let least = min_window(link.max_payload, unit).min(MAX_WINDOW);
    (budget.clamp(u64::from(least), u64::from(MAX_WINDOW)) as u32, unit)
}

#[cfg(test)]
mod credit_tests {
    use super::*;

    #[test]
    fn a_tcp_window_is_a_byte_budget_that_fits_its_largest_message() {
        let at = |window: u32, max: u64| {
            credits_for(&LinkConfig::default().with_recv_window(window).with_max_payload(max))
        };
        // The default: 4 MiB in credits of 1 KiB.
        assert_eq!(at(64, 1 << 20), (4096, 1024));
        // A small window is raised to twice the largest message's credits.
        assert_eq!(at(8, 1 << 20), (2 * 1025, 1024));
        // A huge largest message doubles the unit until the window fits.
        let (w, unit) = at(64, 4 << 30);
        assert!(w <= zerocast_core::credit::MAX_WINDOW && unit > CREDIT_UNIT);
        assert!(w >= zerocast_core::credit::min_window(4 << 30, unit));
        // Past what `validate` allows: the largest window, no panic.
        assert_eq!(at(64, u64::MAX).0, zerocast_core::credit::MAX_WINDOW);
    }
}

/// A pool configuration with size classes up to `link.max_payload`.
pub fn pool_config_for(link: &LinkConfig) -> PoolConfig {
    let max = link.max_payload as usize;
    let mut classes: Vec<usize> = [256usize, 4096, 65_536].into_iter().filter(|&c| c < max).collect();
    classes.push(max);
    PoolConfig { classes, ..PoolConfig::default() }
}

/// The TCP transport: a pool, settings and an engine shared by its
/// connections.
///
/// The engine is one thread that drives every connection, listener and
/// handshake of the transport (see [`zerocast_link::engine`]): the number
/// of threads does not grow with the number of connections.
#[derive(Debug, Clone)]
pub struct TcpTransport {
    pool: Pool,
    cfg: Arc<TcpConfig>,
    engines: Engines,
}

impl TcpTransport {
    /// A transport whose connections take buffers from `pool`, on an
    /// engine of its own.
    pub fn new(pool: Pool, cfg: TcpConfig) -> Result<Self, ConnectError> {
        let engines = Engines::start("zerocast-tcp", 1)
            .map_err(|e| ConnectError::Transport { kind: ErrorKind::LocalResource, source: e.into() })?;
        Self::with_engines(pool, cfg, engines)
    }

    /// A transport whose connections take buffers from `pool` and run on
    /// `engines` (which other transports may share).
    pub fn with_engines(pool: Pool, cfg: TcpConfig, engines: Engines) -> Result<Self, ConnectError> {
        cfg.link.validate().map_err(ConnectError::transport)?;
        if pool.max_buf_size() < cfg.link.max_payload as usize {
            let msg = format!(
                "pool buffers hold at most {} bytes but max_payload is {}; add a pool size class",
                pool.max_buf_size(),
                cfg.link.max_payload
            );
            return Err(ConnectError::Transport { kind: ErrorKind::LocalResource, source: msg.into() });
        }
        Ok(Self { pool, cfg: Arc::new(cfg), engines })
    }

    /// A transport with its own unregistered pool sized for `cfg`.
    pub fn with_config(cfg: TcpConfig) -> Result<Self, ConnectError> {
        let pool = Pool::unregistered(cfg.pool_config()).map_err(ConnectError::transport)?;
        Self::new(pool, cfg)
    }

    /// The pool.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The settings.
    pub fn config(&self) -> &TcpConfig {
        &self.cfg
    }

    fn link_config(&self, ep: &Endpoint) -> Result<LinkConfig, ConnectError> {
        let mut link = self.cfg.link;
        link.apply_params(ep)?;
        link.validate().map_err(ConnectError::transport)?;
        Ok(link)
    }

    /// Socket options of every connection.
    fn configure(&self, sock: &Socket, peer: &Endpoint) -> Result<(), ConnectError> {
        let io_err = |e| ConnectError::Io { endpoint: peer.to_string(), source: e };
        sock.set_nodelay(true).map_err(io_err)?;
        // A peer whose host died is noticed even on an idle connection.
        let keepalive = socket2::TcpKeepalive::new()
            .with_time(Duration::from_secs(30))
            .with_interval(Duration::from_secs(5))
            .with_retries(4);
        sock.set_tcp_keepalive(&keepalive).map_err(io_err)?;
        if let Some(n) = self.cfg.send_buffer {
            sock.set_send_buffer_size(n).map_err(io_err)?;
        }
        if let Some(n) = self.cfg.recv_buffer {
            sock.set_recv_buffer_size(n).map_err(io_err)?;
        }
        Ok(())
    }

    /// The hello this side sends: its window in weighted credits (see
    /// [`credits_for`]).
    fn hello(&self, link: &LinkConfig) -> Hello {
        let buf_size = self.pool.class_for(link.max_payload as usize).unwrap_or(0);
        let (window, credit_unit) = credits_for(link);
        Hello { credit_unit, ..zerocast_link::hello_for(&link.with_recv_window(window), buf_size) }
    }

    /// Connect to `ep` at `addrs` (the caller resolved its name) without
    /// waiting: `connect(2)` and the hello exchange run as a task on the
    /// engine, by [`TcpConfig::handshake_timeout`] per address, trying
    /// each address in turn, and the returned future yields the
    /// connection. Dropping the future abandons the attempt. The `async`
    /// API connects this way.
    pub fn connect_nonblocking(
        &self,
        ep: &Endpoint,
        addrs: Vec<SocketAddr>,
    ) -> Result<Completion<Result<TcpConnection, ConnectError>>, ConnectError> {
        check_scheme(ep)?;
        let link = self.link_config(ep)?;
        let (done, result) = zerocast_link::completion();
        match connect::ConnectTask::start(self.clone(), ep.clone(), link, addrs, done, None) {
            Ok(task) => self.engines.pick().register(Box::new(task)),
            Err((done, e)) => {
                let _ = done.complete(Err(e));
            }
        }
        Ok(result)
    }

    /// A connected socket: the handshake on this thread, then the
    /// connection on the engine.
    fn establish(
        &self,
        sock: Socket,
        peer: Endpoint,
        link_cfg: LinkConfig,
        deadline: Instant,
    ) -> Result<TcpConnection, ConnectError> {
        self.configure(&sock, &peer)?;
        let peer_hello = handshake::exchange(&sock, &self.hello(&link_cfg), deadline)
            .map_err(|source| ConnectError::Handshake { endpoint: peer.to_string(), source })?;
        sock.set_nonblocking(true).map_err(|e| ConnectError::Io { endpoint: peer.to_string(), source: e })?;
        let (conn, task) = self.start(Arc::new(sock), peer, link_cfg, peer_hello)?;
        self.engines.pick().register(Box::new(task));
        Ok(conn)
    }

    /// The connection of a handshaken, non-blocking socket, and the engine
    /// task that drives it.
    fn start(
        &self,
        sock: Arc<Socket>,
        peer: Endpoint,
        link_cfg: LinkConfig,
        peer_hello: Hello,
    ) -> Result<(TcpConnection, ConnTask), ConnectError> {
        let (window, credit_unit) = credits_for(&link_cfg);
        let setup = LinkSetup {
            config: link_cfg.with_recv_window(window),
            peer_hello,
            pool: self.pool.clone(),
            peer: peer.clone(),
            repost: false,
            credit_unit,
        };
        let (link, driver, _) = zerocast_link::new(setup)
            .map_err(|source| ConnectError::Handshake { endpoint: peer.to_string(), source })?;
        let task = ConnTask::new(sock.clone(), driver, self.cfg.frame_timeout, peer_hello.window);
        tracing::debug!(%peer, window, peer_window = peer_hello.window, "tcp connection up");
        Ok((TcpConnection::new(link, ShutdownOnDrop(sock)), task))
    }
}

/// Closes the socket for good when the last handle of a failed or finished
/// connection goes away; a live connection is closed by its goodbye instead.
struct ShutdownOnDrop(Arc<Socket>);

impl Drop for ShutdownOnDrop {
    fn drop(&mut self) {
        // The I/O threads hold their own references; they end on the
        // goodbye exchange. Nothing to do unless they already ended.
        if Arc::strong_count(&self.0) == 1 {
            let _ = self.0.shutdown(Shutdown::Both);
        }
    }
}

fn resolve(ep: &Endpoint) -> Result<Vec<SocketAddr>, ConnectError> {
    let io_err = |e| ConnectError::Io { endpoint: ep.to_string(), source: e };
    let addrs: Vec<SocketAddr> = ep.authority().to_socket_addrs().map_err(io_err)?.collect();
    if addrs.is_empty() {
        return Err(io_err(std::io::Error::new(std::io::ErrorKind::NotFound, "no address")));
    }
    Ok(addrs)
}

fn check_scheme(ep: &Endpoint) -> Result<(), ConnectError> {
    if ep.scheme() != Scheme::Tcp {
        return Err(ConnectError::Unavailable {
            scheme: ep.scheme(),
            reason: "the TCP transport takes tcp:// endpoints".into(),
        });
    }
    Ok(())
}

impl zerocast_core::Transport for TcpTransport {
    type Conn = TcpConnection;
    type Listener = TcpListener;

    fn listen(&self, ep: &Endpoint) -> Result<TcpListener, ConnectError> {
        check_scheme(ep)?;
        let link = self.link_config(ep)?;
        let addr = resolve(ep)?[0];
        let io_err = |e| ConnectError::Io { endpoint: ep.to_string(), source: e };
        let sock =
            Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP)).map_err(io_err)?;
        sock.set_reuse_address(true).map_err(io_err)?;
        sock.bind(&SockAddr::from(addr)).map_err(|e| match e.kind() {
            std::io::ErrorKind::AddrInUse => ConnectError::InUse(ep.to_string()),
            _ => io_err(e),
        })?;
        sock.listen(4096).map_err(io_err)?;
        let bound = sock.local_addr().map_err(io_err)?.as_socket().map(|a| a.port()).unwrap_or(0);
        let local = ep.with_port(bound);
        tracing::debug!(%local, "tcp listening");
        TcpListener::start(sock, self.clone(), local, link)
    }

    fn connect(&self, ep: &Endpoint) -> Result<TcpConnection, ConnectError> {
        check_scheme(ep)?;
        let link = self.link_config(ep)?;
        let mut last = None;
        for addr in resolve(ep)? {
            let sock = match Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP)) {
                Ok(s) => s,
                Err(e) => {
                    last = Some(e);
                    continue;
                }
            };
            let deadline = Instant::now() + self.cfg.handshake_timeout;
            match sock.connect_timeout(&SockAddr::from(addr), self.cfg.handshake_timeout) {
                Ok(()) => return self.establish(sock, ep.clone(), link, deadline),
                Err(e) => last = Some(e),
            }
        }
        let source = last.unwrap_or_else(|| std::io::Error::other("no address to connect to"));
        Err(ConnectError::Io { endpoint: ep.to_string(), source })
    }
}
