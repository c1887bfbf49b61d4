//! Opening endpoints by URI: the cold edge where a transport is chosen.

use std::sync::{Arc, Mutex, OnceLock};

use zerocast_core::{ConnectError, Endpoint, ErrorKind, LinkConfig, Scheme, TransportList};
use zerocast_mem::{Pool, PoolConfig};

use crate::conn::{Connection, Flavor, Listener, ListenerFlavor};

#[cfg(not(any(feature = "tcp", feature = "mem")))]
compile_error!("enable at least one connection transport of zerocast: tcp or mem");

/// Settings for every connection a [`Zerocast`] opens.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// Credits, payload limit and batching.
    pub link: LinkConfig,
    /// The buffer pool of the network transports (size classes up to
    /// `link.max_payload` are added when missing).
    pub pool: PoolConfig,
    /// TCP socket settings.
    #[cfg(feature = "tcp")]
    pub tcp: zerocast_tcp::TcpConfig,
    /// RDMA RC settings (`rc://`, `rc+oob://`); their `link` is replaced
    /// by [`Config::link`].
    #[cfg(feature = "rdma")]
    pub rc: zerocast_rdma::RcConfig,
    /// UDP datagram settings (`ud://` and `mcast://` over UDP).
    #[cfg(feature = "tcp")]
    pub udp: zerocast_tcp::udp::UdpConfig,
    /// RDMA UD datagram settings (`ud://` and `mcast://` over RDMA).
    #[cfg(feature = "rdma")]
    pub ud: zerocast_rdma::ud::UdConfig,
    /// Whether a typed [`Sender`](crate::Sender) announces its message
    /// type, so that a [`Receiver`](crate::Receiver) of another type fails
    /// with [`TypedRecvError::TypeMismatch`](crate::TypedRecvError::TypeMismatch)
    /// instead of misreading. On the wire: one extra message (and credit)
    /// per channel, before its first message. Receivers always understand
    /// announcements, checking on or off. Default: on in debug builds, off
    /// in release builds. [`Connection::with_typed_check`] overrides it per
    /// connection.
    ///
    /// [`Connection::with_typed_check`]: crate::Connection::with_typed_check
    pub typed_check: bool,
    /// Engine threads that drive the `tcp://` and `mem://` connections and
    /// listeners of this context (each connection runs on one, given out in
    /// turn). Default: 1. The number of threads does not grow with the
    /// number of connections.
    pub engines: usize,
}

impl Default for Config {
    fn default() -> Self {
        let link = LinkConfig::default();
        Self {
            link,
            pool: PoolConfig::default(),
            #[cfg(feature = "tcp")]
            tcp: zerocast_tcp::TcpConfig::default(),
            #[cfg(feature = "rdma")]
            rc: zerocast_rdma::RcConfig::default(),
            #[cfg(feature = "tcp")]
            udp: zerocast_tcp::udp::UdpConfig::default(),
            #[cfg(feature = "rdma")]
            ud: zerocast_rdma::ud::UdConfig::default(),
            typed_check: cfg!(debug_assertions),
            engines: 1,
        }
    }
}

impl Config {
    /// Set the number of engine threads (at least one; see [`Config::engines`]).
    pub fn with_engines(mut self, n: usize) -> Self {
        self.engines = n.max(1);
        self
    }

    /// Set the link settings.
    pub fn with_link(mut self, link: LinkConfig) -> Self {
        self.link = link;
        self
    }

    /// Set the pool settings.
    pub fn with_pool(mut self, pool: PoolConfig) -> Self {
        self.pool = pool;
        self
    }

    /// Turn the type check of typed channels on or off (see
    /// [`Config::typed_check`]).
    pub fn with_typed_check(mut self, on: bool) -> Self {
        self.typed_check = on;
        self
    }

    /// Set the RDMA UD datagram settings.
    #[cfg(feature = "rdma")]
    pub fn with_ud(mut self, ud: zerocast_rdma::ud::UdConfig) -> Self {
        self.ud = ud;
        self
    }

    /// Set the UDP datagram settings.
    #[cfg(feature = "tcp")]
    pub fn with_udp(mut self, udp: zerocast_tcp::udp::UdpConfig) -> Self {
        self.udp = udp;
        self
    }

    /// Set the RDMA RC settings.
    #[cfg(feature = "rdma")]
    pub fn with_rc(mut self, rc: zerocast_rdma::RcConfig) -> Self {
        self.rc = rc;
        self
    }
}

/// Opens connections and listeners by URI, sharing pools and settings.
///
/// ```no_run
/// let zc = zerocast::Zerocast::new();
/// let conn = zc.connect("tcp://127.0.0.1:7000")?;
/// let (tx, rx) = conn.split::<String, String>();
/// tx.send("hello".to_owned())?;
/// println!("{}", rx.recv()?);
/// # Ok::<(), zerocast::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Zerocast {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    cfg: Config,
    pool: Retry<Pool>,
    /// The engines of the TCP, in-process and RDMA transports (started on
    /// first use).
    #[cfg(any(feature = "tcp", feature = "mem", feature = "rdma"))]
    engines: Retry<zerocast_link::engine::Engines>,
    /// The RC transport, with its own registered pool (created on first use).
    #[cfg(feature = "rdma")]
    rc: Retry<zerocast_rdma::RcTransport>,
    /// The UD transport, with its own registered pool (created on first use).
    #[cfg(feature = "rdma")]
    ud: Retry<zerocast_rdma::ud::UdTransport>,
    /// The runtime whose tasks drive the engines, for the async API (else
    /// each engine has a thread).
    #[cfg(feature = "tokio")]
    runtime: Option<::tokio::runtime::Handle>,
    /// Pools for endpoints whose `?max_payload=` is over `cfg.link`'s.
    larger_pools: Mutex<Vec<(u64, Pool)>>,
    /// RC transports for such endpoints.
    #[cfg(feature = "rdma")]
    larger_rc: Mutex<Vec<(u64, zerocast_rdma::RcTransport)>>,
}

/// A value made on first success. A failure is returned with its kind and
/// source, and not kept: the next call tries again (the memlock limit may
/// have been raised, or the device come up, meanwhile).
#[derive(Debug)]
struct Retry<T> {
    cell: OnceLock<T>,
    /// Held while making the value, so only one caller makes it.
    making: Mutex<()>,
}

impl<T: Clone> Retry<T> {
    fn new() -> Self {
        Self { cell: OnceLock::new(), making: Mutex::new(()) }
    }

    fn get_or_try<E>(&self, make: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
        if let Some(v) = self.cell.get() {
            return Ok(v.clone());
        }
        let _one = self.making.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = self.cell.get() {
            return Ok(v.clone());
        }
        let v = make()?;
        Ok(self.cell.get_or_init(|| v).clone())
    }
}

impl Default for Zerocast {
    fn default() -> Self {
        Self::new()
    }
}

impl Zerocast {
    /// Default settings.
    pub fn new() -> Self {
        Self::with_config(Config::default())
    }

    /// The given settings.
    pub fn with_config(cfg: Config) -> Self {
        Self::make(
            cfg,
            #[cfg(feature = "tokio")]
            None,
        )
    }

    /// A context whose engines are tasks on `runtime` (the async API's).
    #[cfg(feature = "tokio")]
    pub(crate) fn on_runtime(cfg: Config, runtime: ::tokio::runtime::Handle) -> Self {
        Self::make(cfg, Some(runtime))
    }

    fn make(cfg: Config, #[cfg(feature = "tokio")] runtime: Option<::tokio::runtime::Handle>) -> Self {
        Self {
            inner: Arc::new(Inner {
                cfg,
                #[cfg(feature = "tokio")]
                runtime,
                pool: Retry::new(),
                #[cfg(any(feature = "tcp", feature = "mem", feature = "rdma"))]
                engines: Retry::new(),
                #[cfg(feature = "rdma")]
                rc: Retry::new(),
                #[cfg(feature = "rdma")]
                ud: Retry::new(),
                larger_pools: Mutex::new(Vec::new()),
                #[cfg(feature = "rdma")]
                larger_rc: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        &self.inner.cfg
    }

    /// The pool that TCP and in-process connections use (created on first use).
    pub fn pool(&self) -> Result<Pool, ConnectError> {
        self.inner.pool.get_or_try(|| {
            let mut pc = self.inner.cfg.pool.clone();
            let max = self.inner.cfg.link.max_payload as usize;
            if pc.classes.last().is_none_or(|&c| c < max) {
                pc.classes.push(max);
            }
            Pool::unregistered(pc).map_err(ConnectError::transport)
        })
    }

    /// Connect to `uri` (see [`zerocast_core::uri`] for the forms).
    pub fn connect(&self, uri: &str) -> Result<Connection, ConnectError> {
        let ep = self.resolve(&Endpoint::parse(uri)?)?;
        let flavor = match ep.scheme() {
            #[cfg(feature = "tcp")]
            Scheme::Tcp => Flavor::Tcp(zerocast_core::Transport::connect(&self.tcp(&ep)?, &ep)?),
            #[cfg(feature = "mem")]
            Scheme::Mem => Flavor::Mem(zerocast_core::Transport::connect(&self.mem(&ep)?, &ep)?),
            #[cfg(feature = "rdma")]
            Scheme::Rc | Scheme::RcOob => {
                Flavor::Rc(zerocast_core::Transport::connect(&self.rc_for(&ep)?, &ep)?)
            }
            other => return Err(unavailable(other)),
        };
        Ok(Connection::new(flavor, self.inner.cfg.typed_check))
    }

    /// [`Zerocast::connect`] for a task, to a resolved endpoint: on
    /// `tcp://`, `rc://` and `rc+oob://` the connect and handshake are
    /// engine tasks (a name is looked up on the runtime's blocking pool);
    /// `mem://` connects without waiting anyway.
    #[cfg(feature = "tokio")]
    pub(crate) async fn connect_async(&self, ep: &Endpoint) -> Result<Connection, ConnectError> {
        #[cfg(any(feature = "tcp", feature = "rdma"))]
        let gone = || ConnectError::Transport {
            kind: ErrorKind::LocalResource,
            source: "the engine stopped before the connection was made".into(),
        };
        #[cfg(any(feature = "tcp", feature = "rdma"))]
        let made = |flavor| Ok(Connection::new(flavor, self.inner.cfg.typed_check));
        match ep.scheme() {
            #[cfg(feature = "tcp")]
            Scheme::Tcp => {
                let addrs = lookup(ep).await?;
                let started = self.tcp(ep)?.connect_nonblocking(ep, addrs)?;
                made(Flavor::Tcp(started.await.ok_or_else(gone)??))
            }
            #[cfg(feature = "rdma")]
            Scheme::Rc => {
                let started = self.rc_for(ep)?.connect_nonblocking(ep)?;
                made(Flavor::Rc(started.await.ok_or_else(gone)??))
            }
            #[cfg(feature = "rdma")]
            Scheme::RcOob => {
                let addr = lookup(ep).await?[0];
                let started = self.rc_for(ep)?.connect_nonblocking_to(ep, addr)?;
                made(Flavor::Rc(started.await.ok_or_else(gone)??))
            }
            _ => self.connect(&ep.to_string()),
        }
    }

    /// Listen at `uri`. Port 0 picks a free port: see [`Listener::local_endpoint`].
    pub fn listen(&self, uri: &str) -> Result<Listener, ConnectError> {
        let ep = self.resolve(&Endpoint::parse(uri)?)?;
        let flavor = match ep.scheme() {
            #[cfg(feature = "tcp")]
            Scheme::Tcp => ListenerFlavor::Tcp(zerocast_core::Transport::listen(&self.tcp(&ep)?, &ep)?),
            #[cfg(feature = "mem")]
            Scheme::Mem => ListenerFlavor::Mem(zerocast_core::Transport::listen(&self.mem(&ep)?, &ep)?),
            #[cfg(feature = "rdma")]
            Scheme::Rc | Scheme::RcOob => {
                ListenerFlavor::Rc(zerocast_core::Transport::listen(&self.rc_for(&ep)?, &ep)?)
            }
            other => return Err(unavailable(other)),
        };
        Ok(Listener { flavor, typed_check: self.inner.cfg.typed_check })
    }

    /// Resolve `auto://` (or a bare `host:port`) through the ordered list
    /// in `ZEROCAST_TRANSPORTS` (default: `rc,tcp` with RDMA built in,
    /// else `tcp`): the first transport built in and usable here wins.
    pub fn resolve(&self, ep: &Endpoint) -> Result<Endpoint, ConnectError> {
        if ep.scheme() != Scheme::Auto {
            return Ok(ep.clone());
        }
        let list = match std::env::var(TransportList::ENV) {
            Ok(s) => TransportList::parse(&s)?,
            Err(_) => TransportList::parse(DEFAULT_TRANSPORTS)?,
        };
        for &scheme in list.schemes() {
            if let Err(reason) = usable(scheme) {
                tracing::debug!(transport = %scheme, %reason, "transport skipped");
                continue;
            }
            let chosen = ep.with_scheme(scheme);
            tracing::info!(transport = %scheme, endpoint = %chosen, "transport chosen");
            return Ok(chosen);
        }
        Err(ConnectError::Unavailable {
            scheme: Scheme::Auto,
            reason: format!("none of {list:?} is built in and usable here"),
        })
    }

    #[cfg(feature = "tcp")]
    pub(crate) fn tcp(&self, ep: &Endpoint) -> Result<zerocast_tcp::TcpTransport, ConnectError> {
        let cfg = self.inner.cfg.tcp.clone().with_link(self.inner.cfg.link);
        zerocast_tcp::TcpTransport::with_engines(
            self.pool_for(self.max_payload_of(ep)?)?,
            cfg,
            self.engines()?,
        )
    }

    /// The engines connections run on.
    #[cfg(any(feature = "tcp", feature = "mem", feature = "rdma"))]
    pub(crate) fn engines(&self) -> Result<zerocast_link::engine::Engines, ConnectError> {
        let failed =
            |e: std::io::Error| ConnectError::Transport { kind: ErrorKind::LocalResource, source: e.into() };
        self.inner.engines.get_or_try(|| {
            #[cfg(feature = "tokio")]
            if let Some(rt) = &self.inner.runtime {
                let (engines, progress) =
                    zerocast_link::engine::Engines::detached("zerocast-engine", self.inner.cfg.engines)
                        .map_err(failed)?;
                for p in progress {
                    rt.spawn(crate::tokio::drive(p));
                }
                return Ok(engines);
            }
            zerocast_link::engine::Engines::start("zerocast-engine", self.inner.cfg.engines).map_err(failed)
        })
    }

    /// The largest message `ep` allows: its `?max_payload=`, or the
    /// configured one.
    fn max_payload_of(&self, ep: &Endpoint) -> Result<u64, ConnectError> {
        let mut link = self.inner.cfg.link;
        link.apply_params(ep)?;
        link.validate().map_err(ConnectError::transport)?;
        Ok(link.max_payload)
    }

    /// A pool for messages of up to `max_payload` bytes: [`Zerocast::pool`]
    /// when the configured payload limit covers it, else one with a class
    /// of that size and room for four such buffers (made once per size).
    fn pool_for(&self, max_payload: u64) -> Result<Pool, ConnectError> {
        if max_payload <= self.inner.cfg.link.max_payload {
            return self.pool();
        }
        let mut pools = self.inner.larger_pools.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, pool)) = pools.iter().find(|(max, _)| *max == max_payload) {
            return Ok(pool.clone());
        }
        let pool = Pool::unregistered(larger_pool(&self.inner.cfg.pool, max_payload))
            .map_err(ConnectError::transport)?;
        pools.push((max_payload, pool.clone()));
        Ok(pool)
    }

    /// The RC transport for `ep`: [`Zerocast::rc`], or, for a
    /// `?max_payload=` beyond the configured limit, one whose registered
    /// pool holds such messages (opened once per size).
    #[cfg(feature = "rdma")]
    fn rc_for(&self, ep: &Endpoint) -> Result<zerocast_rdma::RcTransport, ConnectError> {
        let max_payload = self.max_payload_of(ep)?;
        if max_payload <= self.inner.cfg.link.max_payload {
            return self.rc();
        }
        let mut larger = self.inner.larger_rc.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, t)) = larger.iter().find(|(max, _)| *max == max_payload) {
            return Ok(t.clone());
        }
        let link = self.inner.cfg.link.with_max_payload(max_payload);
        let cfg = self.inner.cfg.rc.clone().with_link(link);
        let pool = larger_pool(&self.inner.cfg.pool, max_payload);
        let t = zerocast_rdma::RcTransport::with_engines(cfg, pool, self.engines()?)?;
        larger.push((max_payload, t.clone()));
        Ok(t)
    }

    /// The RC transport (opened on first use: device, protection domain and
    /// a pool registered in it, shaped like [`Config::pool`]). A failure
    /// (no device yet, a memlock limit) is not kept: the next call tries
    /// again.
    #[cfg(feature = "rdma")]
    pub fn rc(&self) -> Result<zerocast_rdma::RcTransport, ConnectError> {
        self.inner.rc.get_or_try(|| {
            let cfg = self.inner.cfg.rc.clone().with_link(self.inner.cfg.link);
            zerocast_rdma::RcTransport::with_engines(cfg, self.inner.cfg.pool.clone(), self.engines()?)
        })
    }

    /// The UD transport (opened on first use: device, protection domain
    /// and a registered pool shaped like [`Config::pool`]; its sockets'
    /// rdma_cm events are read on the context's engines). A failure is
    /// not kept: the next call tries again.
    #[cfg(feature = "rdma")]
    pub fn ud(&self) -> Result<zerocast_rdma::ud::UdTransport, ConnectError> {
        self.inner.ud.get_or_try(|| {
            let (cfg, pool) = (self.inner.cfg.ud.clone(), self.inner.cfg.pool.clone());
            zerocast_rdma::ud::UdTransport::with_engines(cfg, pool, self.engines()?)
                .map_err(ConnectError::transport)
        })
    }

    #[cfg(feature = "mem")]
    fn mem(&self, ep: &Endpoint) -> Result<zerocast_inproc::MemTransport, ConnectError> {
        let pool = self.pool_for(self.max_payload_of(ep)?)?;
        zerocast_inproc::MemTransport::with_engines(pool, self.inner.cfg.link, self.engines()?)
    }
}

/// `base` with a class of `max_payload` bytes and a cap that holds four
/// such buffers (a message in flight each way, and one being encoded or
/// decoded on each side).
fn larger_pool(base: &PoolConfig, max_payload: u64) -> PoolConfig {
    let max = usize::try_from(max_payload).unwrap_or(usize::MAX);
    let mut pc = base.clone();
    pc.classes.retain(|&c| c < max);
    pc.classes.push(max);
    pc.max_bytes = pc.max_bytes.max(max.saturating_mul(4));
    pc
}

/// `ep`'s addresses: parsed when it names an address, else looked up by
/// the runtime (on its blocking pool, as `getaddrinfo` blocks).
#[cfg(all(feature = "tokio", any(feature = "tcp", feature = "rdma")))]
async fn lookup(ep: &Endpoint) -> Result<Vec<std::net::SocketAddr>, ConnectError> {
    let authority = ep.authority();
    if let Ok(addr) = authority.parse() {
        return Ok(vec![addr]);
    }
    let io_err = |source| ConnectError::Io { endpoint: ep.to_string(), source };
    let addrs: Vec<_> = ::tokio::net::lookup_host(authority).await.map_err(io_err)?.collect();
    if addrs.is_empty() {
        return Err(io_err(std::io::Error::new(std::io::ErrorKind::NotFound, "no address")));
    }
    Ok(addrs)
}

/// The list used when `ZEROCAST_TRANSPORTS` is unset. `rc` comes first so
/// that an RDMA build prefers it once the RC backend is built in.
pub(crate) const DEFAULT_TRANSPORTS: &str = "rc,tcp";

/// Whether a connection-oriented transport is built in and usable here.
fn usable(scheme: Scheme) -> Result<(), String> {
    match scheme {
        #[cfg(feature = "tcp")]
        Scheme::Tcp => Ok(()),
        #[cfg(feature = "mem")]
        Scheme::Mem => Ok(()),
        #[cfg(feature = "rdma")]
        Scheme::Rc | Scheme::RcOob => {
            zerocast_rdma::open_cm_device(None).map(drop).map_err(|e| format!("no usable RDMA device: {e}"))
        }
        Scheme::Ud | Scheme::Mcast => Err("a datagram transport; use zerocast::datagram".into()),
        other => Err(format!("{other} is not built into this zerocast")),
    }
}

fn unavailable(scheme: Scheme) -> ConnectError {
    let reason = match scheme {
        Scheme::Rc | Scheme::RcOob => {
            "the RDMA RC backend is not built into this zerocast; enable its `rdma` feature".to_owned()
        }
        Scheme::Ud | Scheme::Mcast => "datagram endpoints open with zerocast::datagram::bind".to_owned(),
        other => format!("{other} is not built into this zerocast; enable its feature"),
    };
    ConnectError::Unavailable { scheme, reason }
}

static DEFAULT: OnceLock<Zerocast> = OnceLock::new();

/// The process-wide [`Zerocast`] with default settings.
pub fn global() -> &'static Zerocast {
    DEFAULT.get_or_init(Zerocast::new)
}

/// Connect with the process-wide defaults.
pub fn connect(uri: &str) -> Result<Connection, ConnectError> {
    global().connect(uri)
}

/// Listen with the process-wide defaults.
pub fn listen(uri: &str) -> Result<Listener, ConnectError> {
    global().listen(uri)
}
