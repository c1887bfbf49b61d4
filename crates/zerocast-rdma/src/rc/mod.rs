//! `rc://` and `rc+oob://`: reliable connected queue pairs.
//!
//! Both ways of connecting end in the same place: a QP in RTS whose
//! `recv_window` receives were posted before the peer could send, and a
//! [`zerocast_link`] engine on top (see `engine`). Only the handshake
//! differs:
//!
//! - `rc://` uses rdma_cm (`cm_path`): the [`zerocast_core::Hello`] travels
//!   as connect/accept private data, and rdma_cm moves the QP through its
//!   states;
//! - `rc+oob://` uses a TCP side channel (`oob`): hello, QP number, PSN,
//!   LID and GID are exchanged on it, and the QP is driven INIT → RTR → RTS
//!   by hand.
//!
//! Credits make RNR impossible: the sender's window is exactly the number
//! of receives the peer has posted, and a credit is returned only after its
//! buffer was posted again. A listener with a shared receive queue (`srq`)
//! keeps that true across its connections; see `srq` for the argument.

mod budget;
mod channel_watch;
#[cfg(test)]
mod close_tests;
mod cm_connect;
mod cm_hub;
mod cm_path;
mod comp_hub;
mod config;
#[cfg(test)]
mod direct_tests;
mod engine;
mod error;
#[cfg(test)]
mod fork_tests;
#[cfg(test)]
mod guest_test_util;
#[cfg(test)]
mod hostile_tests;
mod hub;
mod listen;
mod one_sided;
mod oob;
mod oob_connect;
mod oob_listen;
#[cfg(test)]
mod read_depth_tests;
mod rendezvous;
mod srq;
#[cfg(test)]
mod stalled_tests;
mod write_imm;

use std::fmt;
use std::sync::{Arc, Mutex};

use zerocast_core::{Caps, ConnError, ConnectError, Endpoint, Hello, LinkConfig, Scheme};
use zerocast_link::engine::{Engine, Engines};
use zerocast_link::{Flavor, LinkSetup};
use zerocast_mem::{Pool, PoolConfig};

pub use budget::RecvMemory;
pub use config::{pool_config_for, CompletionMode, RcConfig};
pub use error::{wc_status_name, RcError};
pub use listen::RcListener;
pub use one_sided::{Exposure, OneSided, OneSidedError, RemoteRegion};
pub use srq::SrqStats;

/// Receives each RC connection keeps posted beyond its credit window, for
/// the finishes of the rendezvous it has outstanding (see ARCHITECTURE.md).
/// With a shared receive queue, a connection's share is its window plus
/// these.
pub const RENDEZVOUS_RECEIVES: usize = rendezvous::MAX_PENDING;

use crate::cm::open_cm_device;
use crate::device::{Device, ProtectionDomain};
use crate::mr::VerbsRegistrar;
use crate::srq::{AsyncEvents, Srq};
use crate::verbs::{CompletionQueue, QpCaps};
use budget::{RecvBudget, Shape};
use cm_hub::CmHub;
use comp_hub::{CompHub, Notify};
use config::{check_srq, share};
use engine::{Io, Receives, Sizes};
use hub::Hub;
use srq::{Member, SharedRecv, SrqSizes};

/// The RC flavor of [`zerocast_link::Connection`].
#[derive(Debug)]
pub enum Rc {}

impl Flavor for Rc {
    const CAPS: Caps = Caps { reliable: true, ordered: true, multicast: false, one_sided: true };
    const SCHEME: &'static str = "rc";
}

/// An `rc://` or `rc+oob://` connection.
pub type RcConnection = zerocast_link::Connection<Rc>;

/// The device's limits in one `tracing` debug line: active MTU, max
/// inline, max SRQ and max MR. `ibv_query_device` does not report an inline
/// limit, so `max_inline` is measured with probe QPs (bisection over
/// `ibv_create_qp`); `max_inline_granted` is what this transport's QPs get
/// for the configured `max_inline`.
fn log_device(device: &Device, pd: &Arc<ProtectionDomain>, want_inline: u32) {
    if !tracing::enabled!(tracing::Level::DEBUG) {
        return;
    }
    let attr = device.context().attr();
    let port = device.port_attr().ok();
    let inline = crate::verbs::probe_inline(pd, want_inline);
    if let Err(e) = &inline {
        tracing::debug!(error = %e, "probing the inline limit failed");
    }
    tracing::debug!(
        device = device.name(),
        port = device.port(),
        active_mtu = port.as_ref().map_or(0, |p| p.active_mtu),
        max_inline = inline.as_ref().map_or(0, |i| i.device_max),
        max_inline_granted = inline.as_ref().map_or(0, |i| i.granted),
        max_qp_wr = attr.max_qp_wr,
        max_srq = attr.max_srq,
        max_srq_wr = attr.max_srq_wr,
        max_mr = attr.max_mr,
        max_mr_size = attr.max_mr_size,
        "RC transport on device"
    );
}

struct Inner {
    /// The engines connections run on.
    engines: Engines,
    device: Device,
    pd: Arc<ProtectionDomain>,
    pool: Pool,
    cfg: RcConfig,
    /// The device's async events (SRQ limits), read while an SRQ exists.
    events: Arc<AsyncEvents>,
    /// Receive memory the connections have reserved, and its limit.
    recv_budget: Arc<RecvBudget>,
    /// The rdma_cm event channel of every `rc://` connection, made for
    /// the first.
    cm_hub: Mutex<Option<Arc<CmHub>>>,
    /// Per engine, the completion channel of its connections' CQs, made
    /// for the first.
    comp_hubs: Mutex<Vec<Option<Arc<CompHub>>>>,
    /// The RDMA READs this side says it serves, instead of what
    /// [`RcTransport::read_depths`] finds: a test's peer that serves fewer
    /// (`u8::MAX`: no override).
    #[cfg(test)]
    reads_served: std::sync::atomic::AtomicU8,
}

impl Inner {
    /// The rdma_cm event channel of `rc://` connections (see `cm_hub`).
    fn cm_hub(&self) -> Result<Arc<CmHub>, ConnectError> {
        let mut hub = self.cm_hub.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = &*hub {
            return Ok(h.clone());
        }
        let h = CmHub::start(self.engines.pick())
            .map_err(|e| ConnectError::Io { endpoint: "rdma_cm event channel".into(), source: e })?;
        *hub = Some(h.clone());
        Ok(h)
    }

    /// The completion channel of the next connection's engine (see
    /// `comp_hub`).
    fn comp_hub(&self) -> Result<Arc<CompHub>, RcError> {
        let i = self.engines.pick_index();
        let mut hubs = self.comp_hubs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(Some(h)) = hubs.get(i) {
            return Ok(h.clone());
        }
        let h = CompHub::start(self.pd.context(), self.engines.get(i), i)
            .map_err(|e| RcError::verbs("ibv_create_comp_channel", e))?;
        hubs.resize(self.engines.len(), None);
        hubs[i] = Some(h.clone());
        Ok(h)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(hub) = self.cm_hub.get_mut().unwrap_or_else(|p| p.into_inner()).take() {
            hub.retire();
        }
        for hub in self.comp_hubs.get_mut().unwrap_or_else(|p| p.into_inner()).drain(..).flatten() {
            hub.retire();
        }
    }
}

/// The RC transport: one device, one protection domain and a pool
/// registered in it, shared by every connection.
#[derive(Clone)]
pub struct RcTransport {
    inner: Arc<Inner>,
}

impl fmt::Debug for RcTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RcTransport").field("device", &self.inner.device.name()).finish_non_exhaustive()
    }
}

/// The error of a connect the listener refused for want of receives.
fn no_room(peer: &Endpoint) -> ConnectError {
    ConnectError::Refused(format!(
        "{peer}: the listener has no receives left for another connection (its shared receive queue \
         is full, or its receive memory is all reserved)"
    ))
}

fn transport_err(
    e: impl std::error::Error + zerocast_core::Classify + Send + Sync + 'static,
) -> ConnectError {
    ConnectError::transport(e)
}

impl RcTransport {
    /// Open the device (the one rdma_cm uses), allocate a protection domain
    /// and a pool registered in it, shaped by `pool` (classes up to
    /// `cfg.link.max_payload` are added). Connections run on an engine of
    /// this transport's own.
    pub fn new(cfg: RcConfig, pool: PoolConfig) -> Result<Self, ConnectError> {
        let engines = Engines::start("zerocast-rc", 1)
            .map_err(|e| ConnectError::Io { endpoint: "rc engine".into(), source: e })?;
        Self::with_engines(cfg, pool, engines)
    }

    /// [`RcTransport::new`], with connections on `engines` (which other
    /// transports may share).
    pub fn with_engines(cfg: RcConfig, pool: PoolConfig, engines: Engines) -> Result<Self, ConnectError> {
        cfg.validate().map_err(transport_err)?;
        let device = open_cm_device(cfg.device.as_deref()).map_err(transport_err)?;
        let pd = device.alloc_pd().map_err(transport_err)?;
        let registrar = Arc::new(VerbsRegistrar::with_access(pd.clone(), cfg.pool_access));
        let pool = Pool::new(pool_config_for(&pool, &cfg.link, cfg.eager_limit), registrar)
            .map_err(transport_err)?;
        log_device(&device, &pd, cfg.max_inline);
        let events =
            AsyncEvents::new(device.context()).map_err(|e| transport_err(RcError::verbs("eventfd", e)))?;
        let recv_budget = RecvBudget::new(cfg.recv_memory.unwrap_or(pool.config().max_bytes / 4 * 3));
        let (cm_hub, comp_hubs) = (Mutex::new(None), Mutex::new(Vec::new()));
        let inner = Inner {
            engines,
            device,
            pd,
            pool,
            cfg,
            events,
            recv_budget,
            cm_hub,
            comp_hubs,
            #[cfg(test)]
            reads_served: std::sync::atomic::AtomicU8::new(u8::MAX),
        };
        Ok(Self { inner: Arc::new(inner) })
    }

    /// The registered pool every connection of this transport uses.
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// The receive memory the connections reserved, and the budget (see
    /// [`RcConfig::recv_memory`]).
    pub fn recv_memory(&self) -> RecvMemory {
        self.inner.recv_budget.usage()
    }

    /// The settings.
    pub fn config(&self) -> &RcConfig {
        &self.inner.cfg
    }

    fn link_config(&self, ep: &Endpoint) -> Result<LinkConfig, ConnectError> {
        if !matches!(ep.scheme(), Scheme::Rc | Scheme::RcOob) {
            return Err(ConnectError::Unavailable {
                scheme: ep.scheme(),
                reason: "the RC transport takes rc:// and rc+oob:// endpoints".into(),
            });
        }
        if let Some(dev) = ep.param("dev") {
            if dev != self.inner.device.name() {
                let msg = format!(
                    "endpoint asks for device `{dev}` but this transport uses `{}`",
                    self.inner.device.name()
                );
                return Err(transport_err(RcError::Config(msg)));
            }
        }
        let mut link = self.inner.cfg.link;
        link.apply_params(ep)?;
        link.validate().map_err(transport_err)?;
        Ok(link)
    }

    fn sizes(&self, link: &LinkConfig) -> Result<Sizes, RcError> {
        // At least a frame with a header: a rendezvous request (header and
        // descriptor) lands whole in a receive buffer.
        let eager = (link.max_payload as usize).min(self.inner.cfg.eager_limit).max(rendezvous::REQUEST_LEN);
        let buf_size = self
            .inner
            .pool
            .class_for(eager)
            .ok_or_else(|| RcError::Config(format!("the pool has no buffer class of {eager} bytes")))?;
        let max_wr = self.inner.device.context().attr().max_qp_wr.max(1) as usize;
        Ok(Sizes {
            recv_window: link.recv_window as usize,
            send_depth: (self.inner.cfg.send_depth as usize).min(max_wr),
            buf_size,
        })
    }

    /// The receives of a new connection: the configured shape while the
    /// receive-memory budget allows it, else the lean one, reserved (see
    /// `budget.rs`). A connection admitted to a shared receive queue takes
    /// its receives from there and keeps the configured shape.
    fn shaped(&self, link: &LinkConfig, srq: Option<Member>) -> Result<(Sizes, Receives), RcError> {
        let sizes = self.sizes(link)?;
        if let Some(member) = srq {
            return Ok((sizes, Receives::Shared(member)));
        }
        let full = Shape { window: sizes.recv_window, buf_size: sizes.buf_size };
        let lean_buf = self.inner.pool.class_for(budget::LEAN_BUF.max(rendezvous::REQUEST_LEN));
        let lean = Shape {
            window: full.window.min(budget::LEAN_WINDOW),
            buf_size: lean_buf.map_or(full.buf_size, |b| b.min(full.buf_size)),
        };
        let (shape, reservation) = self.inner.recv_budget.reserve(full, lean)?;
        let sizes = Sizes { recv_window: shape.window, buf_size: shape.buf_size, ..sizes };
        Ok((sizes, Receives::Own(reservation)))
    }

    /// The RDMA READ depths this side offers, `(responder resources,
    /// initiator depth)`: [`rendezvous::READ_DEPTH`] each, within the
    /// device's limits.
    fn read_depths(&self) -> (u8, u8) {
        let attr = self.inner.device.context().attr();
        let clamp = |max: u32| max.clamp(1, rendezvous::READ_DEPTH as u32) as u8;
        #[cfg(test)]
        {
            let served = self.inner.reads_served.load(std::sync::atomic::Ordering::Relaxed);
            if served != u8::MAX {
                return (served, clamp(attr.max_qp_init_rd_atom));
            }
        }
        (clamp(attr.max_qp_rd_atom), clamp(attr.max_qp_init_rd_atom))
    }

    /// Our hello for a connection on `io`: its own window and buffer size.
    fn hello(&self, link: &LinkConfig, io: &Io) -> Hello {
        zerocast_link::hello_for(&link.with_recv_window(io.recv_window() as u32), io.buf_size())
    }

    /// A connection's CQ, on the completion channel of the engine it will
    /// run on, and what its events reach.
    fn cq(&self, sizes: &Sizes) -> Result<(Arc<CompletionQueue>, Arc<Notify>), RcError> {
        // Every slot of both tables is at most one completion: no overrun.
        let depth = sizes.posted_receives()
            + sizes.send_depth
            + one_sided::ONE_SIDED_SLOTS
            + rendezvous::SQ_EXTRA
            + 1;
        // On a channel in either mode: the engine sleeps on it.
        self.inner
            .comp_hub()?
            .cq(self.inner.pd.context(), depth)
            .map_err(|e| RcError::verbs("ibv_create_cq", e))
    }

    /// A listener's shared receive queue, when `ep` or the settings ask for one.
    fn shared_recv(&self, ep: &Endpoint, link: &LinkConfig) -> Result<Option<Arc<SharedRecv>>, ConnectError> {
        let cfg = &self.inner.cfg;
        let capacity = ep.param_as::<u32>("srq")?.unwrap_or(cfg.srq);
        let limit = ep.param_as::<u32>("srq_limit")?.unwrap_or(cfg.srq_limit);
        if capacity == 0 {
            return Ok(None);
        }
        check_srq(capacity, limit, share(link.recv_window)).map_err(transport_err)?;
        let limit = if limit == 0 { (capacity / 4).max(1) } else { limit };
        let buf_size = self.sizes(link).map_err(transport_err)?.buf_size;
        let sizes = SrqSizes {
            capacity: capacity as usize,
            share: share(link.recv_window) as usize,
            limit,
            buf_size,
        };
        SharedRecv::new(&self.inner.pd, self.inner.pool.clone(), sizes, &self.inner.events)
            .map(Some)
            .map_err(transport_err)
    }

    fn caps<'a>(&self, sizes: &Sizes, srq: Option<&'a Arc<Srq>>) -> QpCaps<'a> {
        QpCaps {
            // The send table's ring, the one-sided slots, rendezvous.
            send_wr: (sizes.send_depth + one_sided::ONE_SIDED_SLOTS + rendezvous::SQ_EXTRA) as u32,
            recv_wr: sizes.posted_receives() as u32,
            max_inline: self.inner.cfg.max_inline,
            srq,
        }
    }

    fn new_io(
        &self,
        qp: crate::verbs::QueuePair,
        (cq, notify): (Arc<CompletionQueue>, Arc<Notify>),
        sizes: Sizes,
        receives: Receives,
    ) -> Result<Arc<Io>, RcError> {
        let cfg = &self.inner.cfg;
        let receives = match receives {
            Receives::Shared(m) => Receives::Shared(m.with_cq(&cq)),
            own => own,
        };
        Io::new(
            qp,
            (cq, notify),
            self.inner.pool.clone(),
            sizes,
            cfg.completion == CompletionMode::BusyPoll,
            cfg.unsafe_ignore_credits_for_tests,
            receives,
        )
    }

    /// The engine `io`'s connection runs on: the one whose completion
    /// channel announces its CQ.
    fn engine_of(&self, io: &Io) -> &Engine {
        self.inner.engines.get(io.notify().engine())
    }

    /// Build the connection on an established QP: the link, driven from
    /// its engine by the connection's task. Its driver is for the watch
    /// the caller starts on the rdma_cm events or the side channel.
    fn finish(
        &self,
        io: Arc<Io>,
        link: LinkConfig,
        peer_hello: Hello,
        peer: Endpoint,
    ) -> Result<(RcConnection, zerocast_link::Driver), ConnectError> {
        let handshake = |source: ConnError| ConnectError::Handshake { endpoint: peer.to_string(), source };
        if (peer_hello.recv_buf_size as usize) < rendezvous::DESC_LEN {
            let msg = format!("peer receive buffers of {} bytes are too small", peer_hello.recv_buf_size);
            return Err(handshake(ConnError::transport(RcError::Config(msg))));
        }
        io.rendezvous().set_peer_eager(peer_hello.recv_buf_size as usize);
        // A peer that serves no READs (rdma_cm then gives a connecting QP
        // no READ depth) could never have its large messages read: a QP
        // with no READ depth may not issue the READs that bring them.
        // Refuse it now, rather than stall its first rendezvous.
        let depth = io.qp().read_depth();
        if depth == 0 {
            return Err(handshake(ConnError::transport(RcError::NoReads)));
        }
        io.rendezvous().set_read_depth(depth as usize);
        // The window this side announced: its shape's.
        let link = link.with_recv_window(io.recv_window() as u32);
        let setup = LinkSetup {
            config: link,
            peer_hello,
            pool: self.inner.pool.clone(),
            peer: peer.clone(),
            repost: true,
            credit_unit: 0,
        };
        let (link_half, driver, reposts) = zerocast_link::new(setup).map_err(handshake)?;
        let Some(reposts) = reposts else {
            return Err(handshake(ConnError::Unsupported("link without reposts")));
        };
        engine::register(self.engine_of(&io), &io, driver.clone(), reposts, peer_hello.window);
        tracing::debug!(%peer, window = link.recv_window, peer_window = peer_hello.window, "rc connection up");
        Ok((RcConnection::new(link_half, Resources(io)), driver))
    }
}

/// Keeps the QP and its tables alive as long as the connection handles.
struct Resources(Arc<Io>);

impl zerocast_core::Transport for RcTransport {
    type Conn = RcConnection;
    type Listener = RcListener;

    fn listen(&self, ep: &Endpoint) -> Result<RcListener, ConnectError> {
        let link = self.link_config(ep)?;
        let srq = self.shared_recv(ep, &link)?;
        match ep.scheme() {
            Scheme::RcOob => oob_listen::listen(self, ep, link, srq),
            _ => cm_path::listen(self, ep, link, srq),
        }
    }

    fn connect(&self, ep: &Endpoint) -> Result<RcConnection, ConnectError> {
        // `srq` and `srq_limit` shape the listener's side only; a
        // listener's endpoint (with them) is also where its peers connect.
        let link = self.link_config(ep)?;
        match ep.scheme() {
            Scheme::RcOob => oob::connect(self, ep, link),
            _ => cm_path::connect(self, ep, link),
        }
    }
}

/// Resolve an endpoint's host and port to one socket address.
fn resolve(ep: &Endpoint) -> Result<std::net::SocketAddr, ConnectError> {
    use std::net::ToSocketAddrs;
    let io_err = |e| ConnectError::Io { endpoint: ep.to_string(), source: e };
    let mut addrs = ep.authority().to_socket_addrs().map_err(io_err)?;
    addrs.next().ok_or_else(|| io_err(std::io::Error::new(std::io::ErrorKind::NotFound, "no address")))
}
