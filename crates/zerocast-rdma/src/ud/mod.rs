//! `ud://` and `mcast://` over RDMA unreliable datagrams.
//!
//! A [`UdSocket`] is one UD queue pair with the Q_Key of rdma_cm's UDP
//! port space ([`RDMA_UDP_QKEY`]), receives pre-posted from a registered
//! pool, and an rdma_cm id bound at the socket's address and listening, so
//! that peers can resolve it.
//!
//! - **Unicast.** The first send to a peer `ip:port` resolves it through
//!   rdma_cm (address, route, then a UD "connect", answered by the peer's
//!   socket with its QPN and Q_Key) and caches the address handle per
//!   destination. A receiver learns the sender's address from the GRH (its
//!   IP) and the zerocast header (its port), and caches an address handle
//!   built from the work completion, so it can reply without resolving.
//! - **Multicast.** [`join`](UdSocket::join) joins a group with
//!   `rdma_join_multicast` on an id of its own, bound through the socket's
//!   interface; the MULTICAST_JOIN event carries the group's address-handle
//!   attributes, QPN and Q_Key; the socket's QP is attached to the group.
//!   [`leave`](UdSocket::leave), and dropping the socket, detach and
//!   leave. A group that fails later (MULTICAST_ERROR) makes sends to it
//!   fail with [`UdError::GroupFailed`] until it is joined again. Sending to
//!   a group needs no membership: a send-only join gives the route.
//!   RDMA multicast knows no ports: a group is its IP address.
//! - **MTU.** A datagram's payload is at most the port's active MTU less
//!   zerocast's 16-byte header ([`UdSocket::max_datagram`]); a larger send is
//!   refused before anything is posted ([`UdError::TooLarge`]), because a
//!   device may drop it silently (rxe does) and still report success.
//! - **Raw mode** ([`UdConfig::raw`]) sends and receives bare payloads, no
//!   header, to talk to other rdma_cm programs such as rdma-core's
//!   `mckey`. Raw datagrams carry no sequence number and no port: their
//!   source is `ip:0`, which cannot be replied to.
//!
//! # Semantics
//!
//! Unreliable and unordered, as UD is: a datagram may be lost (no receive
//! posted, the network) or, across paths, reordered. Each sender numbers
//! its datagrams per destination; the receiver keeps per-source counters
//! of received, lost and reordered datagrams ([`UdSocket::source_stats`],
//! through [`zerocast_core::SeqTracker`]). Nothing is retransmitted.
//!
//! Per-source state is bounded: at most [`UdConfig::max_sources`] sources
//! (`?max_sources=N`, default 4096) keep their counters and the reply
//! route (address handle) learned from them; a new source beyond that
//! replaces an idle one, and its learned route goes with it
//! ([`UdStats::sources_evicted`]). A send in flight keeps its own
//! reference to the address handle until its completion is polled.
//!
//! # Buffers
//!
//! On the wire a datagram is its payload, then zerocast's 16-byte header.
//! A send buffer from [`UdSocket::alloc`] has room for the header behind
//! the payload, so a send is one scatter entry, as `ib_send_bw`'s are; a
//! buffer without that room is sent with the header from a registered
//! slot, as a second entry. A receive takes a pool buffer of GRH + MTU
//! bytes; the received [`UdDatagram`] is that buffer, exposed as its
//! payload only, and dropping it posts it again. No payload byte is copied
//! either way.

mod cm;
mod datagram;
mod error;
mod io;
mod peers;
mod socket;

use std::sync::Arc;
use std::time::Duration;

use zerocast_core::DEFAULT_MAX_SOURCES;
use zerocast_link::engine::Engines;
use zerocast_mem::{Pool, PoolConfig};

pub use datagram::{grh_source, UdDatagram, GRH_LEN};
pub use error::UdError;
pub use socket::UdSocket;

use crate::cm::open_cm_device;
use crate::device::{Device, ProtectionDomain};
use crate::mr::VerbsRegistrar;

/// The Q_Key of rdma_cm's UDP port space (`RDMA_UDP_QKEY`): every UD and
/// multicast peer resolved through rdma_cm uses it.
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// How UD sockets are set up.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UdConfig {
    /// Device name (default: `ZEROCAST_RDMA_DEV`, else the first device
    /// with an active port).
    pub device: Option<String>,
    /// Receives kept posted per socket (default 256). Datagrams that arrive
    /// while none is posted are dropped by the device.
    pub recv_depth: u32,
    /// Sends in flight per socket (default 128).
    pub send_depth: u32,
    /// Bare payloads, no zerocast header (interop with other programs).
    pub raw: bool,
    /// Time allowed to resolve a peer or join a group (default 20 s).
    pub resolve_timeout: Duration,
    /// Time a send waits for a free send slot (default 5 s).
    pub send_timeout: Duration,
    /// Most groups one socket may receive (default and upper bound: the
    /// device's `max_mcast_grp`).
    pub max_groups: Option<u32>,
    /// Most sources whose sequence accounting (and reply route, with its
    /// address handle) a socket keeps (default
    /// [`DEFAULT_MAX_SOURCES`] = 4096; at least 1); the `max_sources=`
    /// endpoint parameter overrides it. A new source beyond it replaces an
    /// idle one ([`SourceTable`](zerocast_core::SourceTable), CLOCK),
    /// counted in [`UdStats::sources_evicted`].
    pub max_sources: usize,
}

impl Default for UdConfig {
    fn default() -> Self {
        Self {
            device: std::env::var("ZEROCAST_RDMA_DEV").ok().filter(|s| !s.is_empty()),
            recv_depth: 256,
            send_depth: 128,
            raw: false,
            resolve_timeout: Duration::from_secs(20),
            send_timeout: Duration::from_secs(5),
            max_groups: None,
            max_sources: DEFAULT_MAX_SOURCES,
        }
    }
}

impl UdConfig {
    /// Set raw mode.
    #[must_use]
    pub fn with_raw(mut self, raw: bool) -> Self {
        self.raw = raw;
        self
    }

    /// Set the receive depth.
    #[must_use]
    pub fn with_recv_depth(mut self, n: u32) -> Self {
        self.recv_depth = n;
        self
    }

    /// Set the send depth: sends in flight at once. One in a quarter of
    /// it, rounded down to a power of two (at most one in 32), is
    /// signalled.
    #[must_use]
    pub fn with_send_depth(mut self, n: u32) -> Self {
        self.send_depth = n;
        self
    }

    /// Set the group limit (capped at the device's `max_mcast_grp`).
    #[must_use]
    pub fn with_max_groups(mut self, n: u32) -> Self {
        self.max_groups = Some(n);
        self
    }

    /// Set the most sources a socket tracks.
    #[must_use]
    pub fn with_max_sources(mut self, n: usize) -> Self {
        self.max_sources = n;
        self
    }

    /// Set the device.
    #[must_use]
    pub fn with_device(mut self, name: Option<String>) -> Self {
        self.device = name;
        self
    }

    /// Check the settings against the device.
    pub fn validate(&self, max_qp_wr: u32) -> Result<(), UdError> {
        for (name, v) in [("recv_depth", self.recv_depth), ("send_depth", self.send_depth)] {
            if v == 0 || v > max_qp_wr.max(1) {
                return Err(UdError::Config(format!(
                    "{name} {v} must be within 1..={} (the device's max_qp_wr)",
                    max_qp_wr.max(1)
                )));
            }
        }
        if self.max_sources == 0 {
            return Err(UdError::Config(
                "max_sources is 0; a socket must track at least one source".to_owned(),
            ));
        }
        Ok(())
    }
}

/// A snapshot of a socket's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct UdStats {
    /// Datagrams posted.
    pub sent: u64,
    /// Sends the device completed with an error.
    pub send_errors: u64,
    /// Well-formed datagrams handed to the user.
    pub received: u64,
    /// Datagrams dropped because they were not zerocast datagrams.
    pub dropped_malformed: u64,
    /// Receives the device completed with an error.
    pub recv_errors: u64,
    /// Sources whose sequence accounting is kept now (at most
    /// [`UdConfig::max_sources`]).
    pub sources_tracked: u64,
    /// Sources whose accounting, and reply route learned from them, were
    /// dropped to make room for a new source. An evicted source that sends
    /// again starts afresh.
    pub sources_evicted: u64,
    /// Address handles in the socket's route table: routes to peers it
    /// sent to, groups, and reply routes learned from tracked sources
    /// (never more of those than sources tracked).
    pub address_handles: u64,
}

struct Inner {
    device: Device,
    pd: Arc<ProtectionDomain>,
    pool: Pool,
    cfg: UdConfig,
    /// Where each socket's rdma_cm events are read.
    engines: Engines,
}

/// The UD transport: one device, one protection domain and a pool
/// registered in it, shared by every socket it opens.
#[derive(Clone)]
pub struct UdTransport {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for UdTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdTransport").field("device", &self.inner.device.name()).finish_non_exhaustive()
    }
}

impl UdTransport {
    /// Open the device (the one rdma_cm uses) and register a pool shaped
    /// by `pool`, with a class that holds a GRH and an active MTU added.
    /// Sockets' rdma_cm events are read on an engine of this transport's
    /// own (one thread, however many sockets).
    pub fn new(cfg: UdConfig, pool: PoolConfig) -> Result<Self, UdError> {
        let engines =
            Engines::start("zerocast-ud", 1).map_err(|e| UdError::verbs("starting the UD engine", e))?;
        Self::with_engines(cfg, pool, engines)
    }

    /// [`UdTransport::new`], with sockets' rdma_cm events read on
    /// `engines` (which other transports may share).
    pub fn with_engines(cfg: UdConfig, pool: PoolConfig, engines: Engines) -> Result<Self, UdError> {
        let device = open_cm_device(cfg.device.as_deref()).map_err(UdError::Device)?;
        cfg.validate(device.context().attr().max_qp_wr)?;
        let mtu = device.port_attr().map_err(UdError::Device)?.active_mtu as usize;
        let pd = device.alloc_pd().map_err(UdError::Device)?;
        let mut pc = pool;
        let rx = GRH_LEN + mtu;
        if !pc.classes.contains(&rx) {
            pc.classes.push(rx);
            pc.classes.sort_unstable();
        }
        let registrar = Arc::new(VerbsRegistrar::new(pd.clone()));
        let pool = Pool::new(pc, registrar).map_err(|e| UdError::Config(format!("the UD pool: {e}")))?;
        Ok(Self { inner: Arc::new(Inner { device, pd, pool, cfg, engines }) })
    }

    /// The registered pool of every socket of this transport.
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// The settings.
    pub fn config(&self) -> &UdConfig {
        &self.inner.cfg
    }

    /// The engine the next socket's rdma_cm events are read on.
    pub(crate) fn engine(&self) -> &zerocast_link::engine::Engine {
        self.inner.engines.pick()
    }

    /// A socket bound at `ud://ip:port` (port 0 picks one). The address
    /// must be the RDMA interface's.
    pub fn bind(&self, ep: &zerocast_core::Endpoint) -> Result<UdSocket, UdError> {
        self.bind_with(ep, self.inner.cfg.clone())
    }

    /// [`bind`](Self::bind) with other settings (say, raw mode).
    pub fn bind_with(&self, ep: &zerocast_core::Endpoint, cfg: UdConfig) -> Result<UdSocket, UdError> {
        socket::bind(self, ep, cfg)
    }

    /// A member of `mcast://group:port?iface=addr`: a socket bound at
    /// `iface` (port picked) that joined the group.
    pub fn multicast(&self, ep: &zerocast_core::Endpoint) -> Result<UdSocket, UdError> {
        self.multicast_with(ep, self.inner.cfg.clone())
    }

    /// [`multicast`](Self::multicast) with other settings (say, raw mode).
    pub fn multicast_with(&self, ep: &zerocast_core::Endpoint, cfg: UdConfig) -> Result<UdSocket, UdError> {
        socket::multicast(self, ep, cfg)
    }
}
