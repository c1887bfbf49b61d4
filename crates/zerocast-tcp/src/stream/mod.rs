//! `tcp://`: reliable, ordered connections over TCP.

mod handshake;
mod reader;
mod writer;

use std::net::{Shutdown, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use zerocast_core::{
    AcceptError, Caps, ConnectError, Endpoint, ErrorKind, LinkConfig, ListenerStats, Scheme,
};
use zerocast_link::{CloseSignal, Flavor, LinkSetup, ListenerCounters};
use zerocast_mem::{Pool, PoolConfig};

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
    /// connection closed with [`ConnError::TimedOut`].
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

/// A pool configuration with size classes up to `link.max_payload`.
pub fn pool_config_for(link: &LinkConfig) -> PoolConfig {
    let max = link.max_payload as usize;
    let mut classes: Vec<usize> = [256usize, 4096, 65_536].into_iter().filter(|&c| c < max).collect();
    classes.push(max);
    PoolConfig { classes, ..PoolConfig::default() }
}

/// The TCP transport: a pool and settings shared by its connections.
#[derive(Debug, Clone)]
pub struct TcpTransport {
    pool: Pool,
    cfg: Arc<TcpConfig>,
}

impl TcpTransport {
    /// A transport whose connections take buffers from `pool`.
    pub fn new(pool: Pool, cfg: TcpConfig) -> Result<Self, ConnectError> {
        cfg.link.validate().map_err(ConnectError::transport)?;
        if pool.max_buf_size() < cfg.link.max_payload as usize {
            let msg = format!(
                "pool buffers hold at most {} bytes but max_payload is {}; add a pool size class",
                pool.max_buf_size(),
                cfg.link.max_payload
            );
            return Err(ConnectError::Transport { kind: ErrorKind::LocalResource, source: msg.into() });
        }
        Ok(Self { pool, cfg: Arc::new(cfg) })
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

    /// Set up a connected socket: handshake, then start its I/O threads.
    fn establish(
        &self,
        sock: Socket,
        peer: Endpoint,
        link_cfg: LinkConfig,
    ) -> Result<TcpConnection, ConnectError> {
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
        let buf_size = self.pool.class_for(link_cfg.max_payload as usize).unwrap_or(0);
        let hello = zerocast_link::hello_for(&link_cfg, buf_size);
        let peer_hello = handshake::exchange(&sock, &hello, self.cfg.handshake_timeout)
            .map_err(|source| ConnectError::Handshake { endpoint: peer.to_string(), source })?;
        let setup = LinkSetup {
            config: link_cfg,
            peer_hello,
            pool: self.pool.clone(),
            peer: peer.clone(),
            repost: false,
        };
        let (link, driver, _) = zerocast_link::new(setup)
            .map_err(|source| ConnectError::Handshake { endpoint: peer.to_string(), source })?;
        let sock = Arc::new(sock);
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            thread::Builder::new().name(format!("zerocast-tcp-{name}")).spawn(f).map_err(io_err)
        };
        let (d, s, frame_timeout) = (driver.clone(), sock.clone(), self.cfg.frame_timeout);
        spawn("rx", Box::new(move || reader::run(s, &d, frame_timeout)))?;
        let (d, s) = (driver, sock.clone());
        spawn("tx", Box::new(move || writer::run(s, &d)))?;
        tracing::debug!(%peer, window = link_cfg.recv_window, peer_window = peer_hello.window, "tcp connection up");
        Ok(TcpConnection::new(link, ShutdownOnDrop(sock)))
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
        sock.listen(1024).map_err(io_err)?;
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
            match sock.connect_timeout(&SockAddr::from(addr), self.cfg.handshake_timeout) {
                Ok(()) => return self.establish(sock, ep.clone(), link),
                Err(e) => last = Some(e),
            }
        }
        let source = last.unwrap_or_else(|| std::io::Error::other("no address to connect to"));
        Err(ConnectError::Io { endpoint: ep.to_string(), source })
    }
}

/// Handshakes run at the same time; past this the acceptor does them itself.
const MAX_PARALLEL_HANDSHAKES: usize = 64;

/// Accepts `tcp://` connections.
///
/// An acceptor thread takes connections and runs each handshake on a thread
/// of its own, so a slow or silent peer never delays the others; `accept`
/// hands out connections in the order their handshakes finish. A failed
/// handshake is counted and logged, never handed to `accept`.
#[derive(Debug)]
pub struct TcpListener {
    sock: Arc<Socket>,
    ready: Receiver<Result<TcpConnection, ConnectError>>,
    shared: Arc<Shared>,
    local: Endpoint,
}

/// What the listener and its acceptor share.
#[derive(Debug, Default)]
struct Shared {
    close: CloseSignal,
    counters: ListenerCounters,
}

impl TcpListener {
    fn start(
        sock: Socket,
        transport: TcpTransport,
        local: Endpoint,
        link: LinkConfig,
    ) -> Result<Self, ConnectError> {
        let sock = Arc::new(sock);
        let shared = Arc::new(Shared::default());
        let (tx, ready) = bounded(128);
        let acceptor = Acceptor {
            sock: sock.clone(),
            shared: shared.clone(),
            transport,
            link,
            tx,
            local: local.clone(),
        };
        let io_err = |e| ConnectError::Io { endpoint: local.to_string(), source: e };
        thread::Builder::new()
            .name("zerocast-tcp-accept".into())
            .spawn(move || acceptor.run())
            .map_err(io_err)?;
        Ok(TcpListener { sock, ready, shared, local })
    }

    fn shut(&self) {
        if self.shared.close.close() {
            // Wakes the acceptor blocked in accept(2); connections in the
            // listen queue are reset.
            let _ = self.sock.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for TcpListener {
    fn drop(&mut self) {
        self.shut();
    }
}

struct Acceptor {
    sock: Arc<Socket>,
    shared: Arc<Shared>,
    transport: TcpTransport,
    link: LinkConfig,
    /// Handshaken connections, or the error that ended the listener.
    tx: Sender<Result<TcpConnection, ConnectError>>,
    local: Endpoint,
}

/// What an error of accept(2) means for the listener.
enum AcceptFailure {
    /// A peer left before it was accepted: no concern of the listener's.
    PeerGone,
    /// The process or the system ran short of something: pause and retry.
    Transient,
    /// The listening socket is broken.
    Fatal,
}

fn classify(e: &std::io::Error) -> AcceptFailure {
    use rustix::io::Errno;
    use std::io::ErrorKind;
    // accept(2) on Linux passes a pending network error of the new
    // connection on as its own: retry, as for EAGAIN (see its man page).
    let peer = [
        Errno::PROTO,
        Errno::NOPROTOOPT,
        Errno::NETDOWN,
        Errno::NETUNREACH,
        Errno::HOSTDOWN,
        Errno::HOSTUNREACH,
        Errno::OPNOTSUPP,
        Errno::PERM,
    ];
    let errno = Errno::from_io_error(e);
    if matches!(
        e.kind(),
        ErrorKind::Interrupted
            | ErrorKind::WouldBlock
            | ErrorKind::ConnectionAborted
            | ErrorKind::ConnectionReset
    ) || errno.is_some_and(|n| peer.contains(&n))
    {
        return AcceptFailure::PeerGone;
    }
    let short = [Errno::MFILE, Errno::NFILE, Errno::NOBUFS, Errno::NOMEM];
    if errno.is_some_and(|n| short.contains(&n)) {
        AcceptFailure::Transient
    } else {
        AcceptFailure::Fatal
    }
}

impl Acceptor {
    fn run(self) {
        let in_flight = Arc::new(AtomicUsize::new(0));
        loop {
            let (sock, addr) = match self.sock.accept() {
                Ok(a) => a,
                Err(_) if self.shared.close.is_closed() => return,
                Err(e) => match classify(&e) {
                    AcceptFailure::PeerGone => {
                        if !matches!(
                            e.kind(),
                            std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock
                        ) {
                            self.shared.counters.handshake_failed(&"a peer gone before accept", &e);
                        }
                        continue;
                    }
                    AcceptFailure::Transient => {
                        self.shared.counters.accept_error(&e);
                        // Out of descriptors and the like: do not spin.
                        thread::sleep(Duration::from_millis(50));
                        continue;
                    }
                    AcceptFailure::Fatal => {
                        let err = ConnectError::Io { endpoint: self.local.to_string(), source: e };
                        let _ = self.tx.send(Err(err));
                        return;
                    }
                },
            };
            let peer = addr
                .as_socket()
                .and_then(|a| Endpoint::parse(&format!("tcp://{a}")).ok())
                .unwrap_or_else(|| Endpoint::parse("tcp://unknown:0").expect("valid"));
            let (transport, link, tx, shared) =
                (self.transport.clone(), self.link, self.tx.clone(), self.shared.clone());
            let handshake = move || match transport.establish(sock, peer.clone(), link) {
                Ok(conn) => {
                    let _ = tx.send(Ok(conn));
                }
                Err(e) => shared.counters.handshake_failed(&peer, &e),
            };
            if in_flight.fetch_add(1, Ordering::SeqCst) < MAX_PARALLEL_HANDSHAKES {
                let count = in_flight.clone();
                let spawned = thread::Builder::new().name("zerocast-tcp-hello".into()).spawn(move || {
                    handshake();
                    count.fetch_sub(1, Ordering::SeqCst);
                });
                if spawned.is_err() {
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    tracing::warn!("cannot spawn a handshake thread; dropping one connection");
                }
            } else {
                in_flight.fetch_sub(1, Ordering::SeqCst);
                handshake();
            }
        }
    }
}

impl zerocast_core::Listener for TcpListener {
    type Conn = TcpConnection;

    fn accept_until(&self, deadline: Option<Instant>) -> Result<TcpConnection, AcceptError> {
        let conn = self.shared.close.wait(&self.ready, deadline)?.map_err(AcceptError::Failed)?;
        self.shared.counters.accepted();
        Ok(conn)
    }

    fn close(&self) {
        self.shut();
    }

    fn stats(&self) -> ListenerStats {
        self.shared.counters.stats()
    }

    fn local_endpoint(&self) -> &Endpoint {
        &self.local
    }
}
