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
mod cm_connect;
mod cm_hub;
mod cm_path;
mod comp_hub;
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
use std::time::Duration;

use zerocast_core::{Caps, ConnError, ConnectError, Endpoint, Hello, LinkConfig, Scheme};
use zerocast_link::engine::{Engine, Engines};
use zerocast_link::{Flavor, LinkSetup};
use zerocast_mem::{Pool, PoolConfig};

pub use budget::RecvMemory;
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
use crate::mr::{Access, VerbsRegistrar};
use crate::srq::{AsyncEvents, Srq};
use crate::verbs::{CompletionQueue, QpCaps};
use budget::{RecvBudget, Shape};
use cm_hub::CmHub;
use comp_hub::{CompHub, Notify};
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

/// How a receiving thread waits for completions. The engine, which polls
/// while no application thread does, sleeps on its completion channel (one
/// for the CQs of all its connections) in either mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CompletionMode {
    /// Spin on the CQ (lowest latency: a receiving thread spins until its
    /// message or its deadline, the way `ib_send_lat` does).
    BusyPoll,
    /// Spin briefly, then sleep until the CQ's next completion event
    /// (`ibv_req_notify_cq`; the engine reads the channel and wakes the
    /// thread). The spin follows the connection's recent waits, 50 µs to
    /// 500 µs of the thread's time on the CPU (see
    /// [`zerocast_link::spin`]). On an oversubscribed host, where waking a
    /// thread costs more than that, [`CompletionMode::BusyPoll`] keeps
    /// perftest's latency.
    Channel,
}

/// Settings of the RC backend.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RcConfig {
    /// Credits, payload limit and batching. `recv_window` receives are
    /// posted per connection while the receive-memory budget allows it
    /// (see `recv_memory`).
    pub link: LinkConfig,
    /// Device name (default: `ZEROCAST_RDMA_DEV`, else the first device
    /// with an active port).
    pub device: Option<String>,
    /// GID index for `rc+oob://` (default: a RoCE v2 IPv4-mapped GID).
    pub gid_index: Option<u8>,
    /// Send queue depth (signalled sends in flight).
    pub send_depth: u32,
    /// Receive memory, in bytes, all connections of this transport may keep
    /// posted (default, `None`: three quarters of the pool's cap). Each
    /// connection reserves its receives against it: the full shape
    /// (`link.recv_window` buffers of `eager_limit` bytes, plus
    /// [`RENDEZVOUS_RECEIVES`]) while that keeps the reserved bytes within
    /// a quarter of the budget, else a lean shape (a window of 8 and
    /// buffers of 8 KiB, 128 KiB in all; larger messages go by rendezvous).
    /// A connection that finds no room even for that is refused with
    /// [`RcError::ReceiveMemory`]. Connections admitted to a listener's
    /// shared receive queue (`srq`) use its receives instead. So the default
    /// pool holds over a thousand connections.
    pub recv_memory: Option<usize>,
    /// Size of the posted receive buffers. Larger messages, up to
    /// `link.max_payload`, go by rendezvous: the receiver RDMA-READs them
    /// straight from the sender's buffer.
    pub eager_limit: usize,
    /// Frames up to this size (16-byte header included) are sent inline:
    /// copied at post time, their buffer back in the pool at once. 0
    /// disables; the device may grant less.
    pub max_inline: u32,
    /// RNR retries (0..=7, 7 = forever). Credits make RNR impossible, so
    /// tests run with 0.
    pub rnr_retry: u8,
    /// Transport retries before `IBV_WC_RETRY_EXC_ERR` (0..=7; default 6).
    /// A peer that stops acknowledging is reported after about
    /// `(retry_cnt + 1) × 4.096 µs × 2^timeout`. Beware 7 on Soft-RoCE:
    /// rdma_rxe never counts a retry count of 7 down, so it retransmits
    /// forever and only rdma_cm or a heartbeat notices the dead peer.
    pub retry_cnt: u8,
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout (1..=31). Zero,
    /// which means "wait forever" on rxe, is refused.
    pub timeout: u8,
    /// Minimum RNR NAK timer code (`rc+oob://`).
    pub min_rnr_timer: u8,
    /// How completions are waited for.
    pub completion: CompletionMode,
    /// Listeners: receives of one shared receive queue serving every
    /// accepted connection (0: each connection has its own receive queue).
    /// Each connection gets a share of them: its window (`link.recv_window`)
    /// as its credits, plus [`RENDEZVOUS_RECEIVES`] for rendezvous finishes.
    /// So a listener admits `srq / (recv_window + RENDEZVOUS_RECEIVES)`
    /// connections and refuses more with [`RcError::SrqFull`]. Per listener: `?srq=N`
    /// (connecting ignores it).
    pub srq: u32,
    /// The SRQ's low watermark: below this many posted receives the device
    /// raises `IBV_EVENT_SRQ_LIMIT_REACHED` and the SRQ is refilled from the
    /// pool (0: a quarter of `srq`). Per listener: `?srq_limit=N`.
    pub srq_limit: u32,
    /// Time allowed for address/route resolution and the handshake.
    pub connect_timeout: Duration,
    /// What the pool's regions allow ([`Access::Local`] by default: no
    /// peer can reach them, and rendezvous and [`OneSided::expose`] grant
    /// access to exactly the bytes they expose). Remote access here lets
    /// every peer that learns a region's rkey (`Buf::keys`) read, or write,
    /// every buffer of that region for the life of the pool: only for
    /// deployments whose peers are all trusted.
    pub pool_access: Access,
    /// Test only: return credits without reposting the receive buffer, so
    /// a sender can overrun the peer and RNR becomes observable.
    #[doc(hidden)]
    pub unsafe_ignore_credits_for_tests: bool,
}

impl Default for RcConfig {
    fn default() -> Self {
        Self {
            link: LinkConfig::default(),
            device: std::env::var("ZEROCAST_RDMA_DEV").ok().filter(|s| !s.is_empty()),
            gid_index: None,
            send_depth: 128,
            recv_memory: None,
            eager_limit: 64 << 10,
            max_inline: 256,
            rnr_retry: 7,
            retry_cnt: 6,
            timeout: 14,
            min_rnr_timer: 12,
            completion: CompletionMode::Channel,
            srq: 0,
            srq_limit: 0,
            connect_timeout: Duration::from_secs(10),
            pool_access: Access::Local,
            unsafe_ignore_credits_for_tests: false,
        }
    }
}

impl RcConfig {
    /// Set the link settings.
    pub fn with_link(mut self, link: LinkConfig) -> Self {
        self.link = link;
        self
    }

    /// Set the RNR retry count (0..=7).
    pub fn with_rnr_retry(mut self, n: u8) -> Self {
        self.rnr_retry = n;
        self
    }

    /// Set the ACK timeout exponent (1..=31) and the retry count (0..=7).
    pub fn with_timeout(mut self, timeout: u8, retry_cnt: u8) -> Self {
        self.timeout = timeout;
        self.retry_cnt = retry_cnt;
        self
    }

    /// Set the completion mode.
    pub fn with_completion(mut self, mode: CompletionMode) -> Self {
        self.completion = mode;
        self
    }

    /// Set the send queue depth (4..=16384, capped by the device).
    pub fn with_send_depth(mut self, depth: u32) -> Self {
        self.send_depth = depth;
        self
    }

    /// Set what the pool's regions allow (see [`RcConfig::pool_access`]).
    pub fn with_pool_access(mut self, access: Access) -> Self {
        self.pool_access = access;
        self
    }

    /// Set the size of the receive buffers; larger messages go by rendezvous.
    pub fn with_eager_limit(mut self, bytes: usize) -> Self {
        self.eager_limit = bytes;
        self
    }

    /// Set the receive-memory budget in bytes (`None`: three quarters of
    /// the pool's cap); see [`RcConfig::recv_memory`].
    pub fn with_recv_memory(mut self, bytes: Option<usize>) -> Self {
        self.recv_memory = bytes;
        self
    }

    /// Give listeners a shared receive queue of `receives` (0: none), with
    /// the default limit.
    pub fn with_srq(mut self, receives: u32) -> Self {
        self.srq = receives;
        self
    }

    /// Set the device.
    pub fn with_device(mut self, name: Option<String>) -> Self {
        self.device = name;
        self
    }

    /// Check the settings.
    pub fn validate(&self) -> Result<(), RcError> {
        self.link.validate().map_err(|e| RcError::Config(e.to_string()))?;
        if self.timeout == 0 {
            return Err(RcError::Config(
                "timeout 0 waits forever for a dead peer on rxe; use 1..=31 (14 ≈ 67 ms)".into(),
            ));
        }
        if self.timeout > 31 {
            return Err(RcError::Config(format!("timeout {} must be within 1..=31", self.timeout)));
        }
        if self.retry_cnt > 7 || self.rnr_retry > 7 {
            return Err(RcError::Config("retry_cnt and rnr_retry must be within 0..=7".into()));
        }
        if self.min_rnr_timer > 31 {
            return Err(RcError::Config("min_rnr_timer must be within 0..=31".into()));
        }
        if self.eager_limit < 64 {
            return Err(RcError::Config(format!(
                "eager_limit {} must be at least 64 bytes",
                self.eager_limit
            )));
        }
        check_srq(self.srq, self.srq_limit, share(self.link.recv_window))?;
        if !(4..=16_384).contains(&self.send_depth) {
            return Err(RcError::Config(format!("send_depth {} must be within 4..=16384", self.send_depth)));
        }
        Ok(())
    }
}

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

/// A connection's share of a shared receive queue: its credit window, plus
/// the receives kept for rendezvous finishes.
fn share(window: u32) -> u32 {
    window + RENDEZVOUS_RECEIVES as u32
}

/// Check SRQ settings: `srq` holds at least one share, the limit is below it.
fn check_srq(srq: u32, limit: u32, share: u32) -> Result<(), RcError> {
    if srq == 0 {
        return Ok(());
    }
    if srq > 1 << 20 {
        return Err(RcError::Config(format!("srq {srq} is above 1048576 receives")));
    }
    if srq < share {
        return Err(RcError::Config(format!(
            "srq {srq} cannot give one connection its share of {share} receives (its window, plus \
             {RENDEZVOUS_RECEIVES} for rendezvous)"
        )));
    }
    if limit >= srq {
        return Err(RcError::Config(format!("srq_limit {limit} must be below srq {srq}")));
    }
    Ok(())
}

/// A pool configuration whose classes reach `link.max_payload`, with a
/// class of exactly the receive-buffer size (`eager_limit`, or the payload
/// limit if smaller).
pub fn pool_config_for(base: &PoolConfig, link: &LinkConfig, eager_limit: usize) -> PoolConfig {
    let mut pc = base.clone();
    let max = link.max_payload as usize;
    let eager = eager_limit.min(max);
    pc.classes.retain(|&c| c < max && c != eager);
    pc.classes.push(max);
    if eager < max {
        pc.classes.push(eager);
    }
    pc.classes.sort_unstable();
    pc
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_checked() {
        assert!(RcConfig::default().validate().is_ok());
        let err = RcConfig::default().with_timeout(0, 7).validate().expect_err("timeout 0");
        assert!(err.to_string().contains("timeout 0 waits forever"), "{err}");
        assert!(RcConfig::default().with_timeout(32, 7).validate().is_err());
        assert!(RcConfig::default().with_timeout(14, 8).validate().is_err());
        assert!(RcConfig::default().with_rnr_retry(8).validate().is_err());
        assert!(RcConfig::default().with_rnr_retry(0).validate().is_ok());
    }

    #[test]
    fn srq_settings_are_checked() {
        assert!(check_srq(0, 0, 64).is_ok(), "no SRQ");
        assert!(check_srq(256, 0, 4).is_ok());
        assert!(check_srq(256, 255, 4).is_ok());
        let err = check_srq(32, 0, 64).expect_err("smaller than a share");
        assert!(err.to_string().contains("share of 64"), "{err}");
        assert!(check_srq(32, 32, 8).is_err(), "limit not below the SRQ");
        assert!(check_srq((1 << 20) + 1, 0, 8).is_err(), "too large");
        let cfg = RcConfig::default().with_srq(16);
        assert!(cfg.validate().is_err(), "16 receives cannot hold the default window of 64");
        assert!(RcConfig::default().with_srq(128).validate().is_ok());
    }

    #[test]
    fn pool_classes_reach_max_payload() {
        let link = LinkConfig::default().with_max_payload(100_000);
        let pc = pool_config_for(&PoolConfig::default(), &link, 4096);
        assert_eq!(pc.classes.last(), Some(&100_000));
        assert!(pc.classes.contains(&4096), "{:?}", pc.classes);
        assert!(pc.classes.windows(2).all(|w| w[0] < w[1]));
        // An eager limit above the payload limit: receive buffers hold the largest message.
        let pc = pool_config_for(&PoolConfig::default(), &link, 1 << 20);
        assert_eq!(pc.classes.last(), Some(&100_000));
        assert!(pc.classes.windows(2).all(|w| w[0] < w[1]));
        assert!(RcConfig::default().with_eager_limit(16).validate().is_err());
    }
}
