//! [`UdSocket`]: the datagram API over a UD queue pair.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdma_sys::ibv_gid;
use zerocast_core::{
    Caps, Datagram, Endpoint, RecvError, Scheme, SeqStats, SeqTracker, SourceTable, HEADER_LEN,
};
use zerocast_mem::{Buf, Pool, PoolError, Wait};

use super::cm::Cm;
use super::datagram::{self, UdDatagram, GRH_LEN};
use super::io::{lock, Io, Outgoing, Route, Sizes, CHAIN};
use super::peers::Peers;
use super::{UdConfig, UdError, UdStats, UdTransport, RDMA_UDP_QKEY};
use crate::cm::{context_name, CmId, EventChannel};
use crate::error::errno_from_rc;
use crate::verbs::AddressHandle;

mod groups;
mod recv;

/// Where datagrams to one destination go, and their next sequence number.
struct Dest {
    ah: Arc<AddressHandle>,
    qpn: u32,
    qkey: u32,
    seq: u32,
    /// Built from a received datagram (a reply route), not resolved: it
    /// leaves with its source when the source table evicts that.
    learned: bool,
}

impl Dest {
    /// Where a send to this destination goes.
    fn route(&self) -> Route {
        Route { ah: self.ah.clone(), qpn: self.qpn, qkey: self.qkey }
    }
}

/// A group this socket joined (or only sends to).
struct Group {
    id: CmId,
    addr: SocketAddr,
    mgid: ibv_gid,
    mlid: u16,
    /// The QP is attached: this socket receives the group.
    attached: bool,
    failed: Arc<AtomicBool>,
}

/// An RDMA UD socket: sends and receives datagrams in registered pool buffers.
///
/// Every method takes `&self`: threads may send and receive at once;
/// concurrent receivers take turns. **Datagrams are unreliable and
/// unordered**: see the [module docs](super).
pub struct UdSocket {
    io: Arc<Io>,
    cm: Arc<Cm>,
    local: SocketAddr,
    mtu: u32,
    max_datagram: usize,
    max_groups: u32,
    cfg: UdConfig,
    dests: Mutex<Peers<Dest>>,
    groups: Mutex<HashMap<IpAddr, Group>>,
    /// Sequence accounting per source, at most `cfg.max_sources` of them.
    sources: Mutex<SourceTable<SocketAddr, SeqTracker>>,
    _transport: UdTransport,
}

fn bad(ep: &Endpoint, reason: impl Into<String>) -> UdError {
    UdError::BadEndpoint { endpoint: ep.to_string(), reason: reason.into() }
}

/// The concrete IP of `host`.
fn host_ip(ep: &Endpoint, host: &str) -> Result<IpAddr, UdError> {
    let ip = match host.parse::<IpAddr>() {
        Ok(ip) => ip,
        Err(_) => (host, 0)
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .map(|a| a.ip())
            .ok_or_else(|| bad(ep, format!("cannot resolve `{host}`")))?,
    };
    if ip.is_unspecified() || ip.is_multicast() {
        return Err(bad(ep, format!("{ip} is not an interface address; name the RDMA interface's address")));
    }
    Ok(ip)
}

/// The config with the endpoint's `max_sources` parameter, if it has one.
fn with_params(ep: &Endpoint, cfg: UdConfig) -> Result<UdConfig, UdError> {
    match ep.param_as::<usize>("max_sources").map_err(|e| bad(ep, e.to_string()))? {
        Some(0) => Err(bad(ep, "max_sources=0 would track no source; use 1 or more (default 4096)")),
        Some(n) => Ok(cfg.with_max_sources(n)),
        None => Ok(cfg),
    }
}

fn check_dev(t: &UdTransport, ep: &Endpoint) -> Result<(), UdError> {
    match ep.param("dev") {
        Some(d) if d != t.device().name() => {
            Err(bad(ep, format!("asks for device `{d}` but this transport uses `{}`", t.device().name())))
        }
        _ => Ok(()),
    }
}

pub(super) fn bind(t: &UdTransport, ep: &Endpoint, cfg: UdConfig) -> Result<UdSocket, UdError> {
    if ep.scheme() != Scheme::Ud {
        return Err(bad(ep, format!("binds ud://host:port, not {}://", ep.scheme())));
    }
    check_dev(t, ep)?;
    let ip = match ep.param("iface") {
        Some(i) => host_ip(ep, i)?,
        None => host_ip(ep, ep.host())?,
    };
    let port = ep.port().ok_or_else(|| bad(ep, "no port; write ud://host:port (0 picks one)"))?;
    UdSocket::open(t, SocketAddr::new(ip, port), with_params(ep, cfg)?)
}

pub(super) fn multicast(t: &UdTransport, ep: &Endpoint, cfg: UdConfig) -> Result<UdSocket, UdError> {
    if ep.scheme() != Scheme::Mcast {
        return Err(bad(ep, format!("joins mcast://group:port?iface=addr, not {}://", ep.scheme())));
    }
    check_dev(t, ep)?;
    let group: IpAddr = ep.host().parse().map_err(|_| bad(ep, "the group must be an IP address"))?;
    if !group.is_multicast() {
        return Err(bad(ep, format!("{group} is not a multicast group; use 239.0.0.0/8 locally")));
    }
    let iface = ep
        .param("iface")
        .ok_or_else(|| bad(ep, "RDMA multicast needs `?iface=addr`, the RDMA interface's address"))?;
    let ip = host_ip(ep, iface)?;
    let sock = UdSocket::open(t, SocketAddr::new(ip, 0), with_params(ep, cfg)?)?;
    sock.join(&SocketAddr::new(group, ep.port().unwrap_or(0)))?;
    Ok(sock)
}

/// Destinations are keyed by address; a group by its IP alone.
fn dest_key(to: &SocketAddr) -> SocketAddr {
    if to.ip().is_multicast() {
        SocketAddr::new(to.ip(), 0)
    } else {
        *to
    }
}

impl UdSocket {
    fn open(t: &UdTransport, addr: SocketAddr, cfg: UdConfig) -> Result<UdSocket, UdError> {
        let device = t.device();
        cfg.validate(device.context().attr().max_qp_wr)?;
        let channel = EventChannel::new().map_err(|e| UdError::verbs("rdma_create_event_channel", e))?;
        let listen = CmId::new_udp(&channel).map_err(|e| UdError::verbs("rdma_create_id", e))?;
        let sa = CmId::sockaddr(addr);
        // SAFETY: live id; `sa` is valid for the call.
        let rc = unsafe { rdma_sys::rdma_bind_addr(listen.as_ptr(), sa.as_ptr() as *mut _) };
        if rc != 0 {
            return Err(UdError::Bind { addr, source: errno_from_rc(rc) });
        }
        let verbs = listen.verbs();
        if verbs != device.context().as_ptr() {
            let found = if verbs.is_null() {
                "none".to_owned()
            } else {
                // SAFETY: a bound id's context is open (owned by librdmacm).
                unsafe { context_name(verbs) }
            };
            return Err(UdError::WrongDevice { addr, device: device.name().to_owned(), found });
        }
        // SAFETY: bound id.
        let rc = unsafe { rdma_sys::rdma_listen(listen.as_ptr(), 64) };
        if rc != 0 {
            return Err(UdError::verbs("rdma_listen", errno_from_rc(rc)));
        }
        let local = SocketAddr::new(addr.ip(), listen.src_port());
        let port = device.port_attr().map_err(UdError::Device)?;
        let mtu = port.active_mtu;
        let header = if cfg.raw { 0 } else { HEADER_LEN };
        let max_datagram = (mtu as usize).saturating_sub(header);
        let sizes = Sizes {
            recv_depth: cfg.recv_depth as usize,
            send_depth: cfg.send_depth as usize,
            rx_len: GRH_LEN + mtu as usize,
        };
        let io = Io::new(&t.inner.pd, device.port(), RDMA_UDP_QKEY, t.pool().clone(), sizes)?;
        let cm = Cm::start(channel, listen, io.qp.qp_num(), t.engine());
        tracing::debug!(%local, device = device.name(), mtu, max_datagram, raw = cfg.raw, qpn = io.qp.qp_num(), "ud socket open");
        Ok(UdSocket {
            io,
            cm,
            local,
            mtu,
            max_datagram,
            max_groups: {
                let dev = device.context().attr().max_mcast_grp;
                cfg.max_groups.map_or(dev, |n| n.min(dev))
            },
            dests: Mutex::new(Peers::default()),
            groups: Mutex::new(HashMap::new()),
            sources: Mutex::new(SourceTable::new(cfg.max_sources)),
            cfg,
            _transport: t.clone(),
        })
    }

    /// A send buffer of `len` payload bytes from the registered pool,
    /// waiting for one until `deadline` if the pool is at its cap. The
    /// length is checked against [`max_datagram`](Self::max_datagram) at the send.
    pub fn alloc(&self, len: usize, deadline: Option<Instant>) -> Result<Buf, PoolError> {
        // Room for the header behind the payload, so the send gathers one
        // scatter entry (see `Io::post`); the buffer's length is `len`. A
        // buffer too large to be sent gets none: it is refused at the send.
        let room = if self.cfg.raw || len > self.max_datagram { 0 } else { HEADER_LEN };
        let mut buf = self.io.pool.alloc(len + room, wait_until(deadline))?;
        buf.set_len(len);
        Ok(buf)
    }

    /// Send `buf` as one datagram to `to`, a peer socket (`ip:port`) or a
    /// group. The first send to a peer resolves it through rdma_cm (and may
    /// take as long as [`UdConfig::resolve_timeout`]); the first send to a
    /// group this socket has not joined makes a send-only join.
    ///
    /// On error the buffer is handed back and nothing was posted:
    /// [`UdError::TooLarge`] above [`max_datagram`](Self::max_datagram),
    /// [`UdError::Resolve`], [`UdError::GroupFailed`],
    /// [`UdError::SendQueueFull`], or a verbs error. Success means the
    /// datagram was posted, not that it arrives.
    pub fn send_to(&self, buf: Buf, to: &SocketAddr) -> Result<(), (Buf, UdError)> {
        let (header, route) = match self.route_to(buf.len(), to) {
            Ok(r) => r,
            Err(e) => return Err((buf, e)),
        };
        self.io.send(buf, header, route, self.cfg.send_timeout).map_err(|(b, e)| (b, self.timed(e)))
    }

    /// Send the datagrams of `batch` in order, posted as chains of work
    /// requests: one system call per chain of up to 32 datagrams, where
    /// [`send_to`](Self::send_to) makes one per datagram.
    ///
    /// Each datagram sent is taken out of `batch`, which keeps its
    /// capacity for the next batch. On error, the datagram that failed and
    /// every one after it stay in `batch`, in order, with their buffers;
    /// the errors are those of `send_to`.
    pub fn send_batch(&self, batch: &mut Vec<(Buf, SocketAddr)>) -> Result<(), UdError> {
        while !batch.is_empty() {
            let mut routes: [Option<(Option<[u8; HEADER_LEN]>, Route)>; CHAIN] =
                std::array::from_fn(|_| None);
            let mut refused = None;
            let mut n = 0;
            for (buf, to) in batch.iter().take(CHAIN) {
                match self.route_to(buf.len(), to) {
                    Ok(r) => routes[n] = Some(r),
                    Err(e) => {
                        refused = Some(e);
                        break;
                    }
                }
                n += 1;
            }
            let mut chain: [Option<Outgoing>; CHAIN] = std::array::from_fn(|_| None);
            let mut dests: [Option<SocketAddr>; CHAIN] = [None; CHAIN];
            for (((buf, to), route), (slot, dest)) in
                batch.drain(..n).zip(routes.iter_mut()).zip(chain.iter_mut().zip(dests.iter_mut()))
            {
                if let Some((header, route)) = route.take() {
                    *slot = Some(Outgoing { buf, header, route });
                    *dest = Some(to);
                }
            }
            let sent = self.io.send_chain(&mut chain[..n], self.cfg.send_timeout);
            // What was not posted goes back to the front, in order (within
            // the capacity it had, so without allocating).
            let unsent = chain[..n].iter_mut().zip(dests).filter_map(|(o, to)| Some((o.take()?.buf, to?)));
            batch.splice(0..0, unsent);
            sent.map_err(|e| self.timed(e))?;
            if let Some(e) = refused {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Check a datagram of `len` bytes to `to`, and take its header (with
    /// the destination's next sequence number; none on a raw socket) and
    /// its route, resolving `to` the first time.
    fn route_to(&self, len: usize, to: &SocketAddr) -> Result<(Option<[u8; HEADER_LEN]>, Route), UdError> {
        if len > self.max_datagram {
            return Err(UdError::TooLarge { len, max: self.max_datagram, mtu: self.mtu });
        }
        if to.ip().is_multicast() {
            if let Some(g) = lock(&self.groups).get(&to.ip()) {
                if g.failed.load(Relaxed) {
                    return Err(UdError::GroupFailed { group: to.ip() });
                }
            }
        }
        let key = dest_key(to);
        let mut dests = lock(&self.dests);
        if dests.get_mut(&key).is_none() {
            drop(dests);
            self.add_route(to)?;
            dests = lock(&self.dests);
        }
        let Some(d) = dests.get_mut(&key) else {
            return Err(UdError::Failed(format!("the route to {to} vanished")));
        };
        let seq = d.seq;
        d.seq = d.seq.wrapping_add(1);
        let route = d.route();
        drop(dests);
        Ok(((!self.cfg.raw).then(|| datagram::header(seq, len, self.local.port())), route))
    }

    /// A full send queue is reported with the configured wait.
    fn timed(&self, e: UdError) -> UdError {
        match e {
            UdError::SendQueueFull(_) => UdError::SendQueueFull(self.cfg.send_timeout),
            e => e,
        }
    }

    /// Resolve the route to `to` (a peer, or a group: a send-only join)
    /// now, so that the first send to it does not wait for rdma_cm. Sends
    /// resolve on their own; this only moves the wait. Resolving a known
    /// destination does nothing.
    ///
    /// # Errors
    ///
    /// As [`send_to`](Self::send_to): [`UdError::Resolve`],
    /// [`UdError::GroupFailed`] and the like.
    pub fn resolve(&self, to: &SocketAddr) -> Result<(), UdError> {
        if self.is_resolved(to) {
            return Ok(());
        }
        self.add_route(to)
    }

    /// [`UdSocket::resolve`] for a task: the same rdma_cm exchange, awaited
    /// rather than waited for (each of its steps ends at
    /// [`UdConfig::resolve_timeout`] at the latest, which rdma_cm
    /// enforces). Dropping it abandons the attempt.
    ///
    /// # Errors
    ///
    /// As [`UdSocket::resolve`].
    pub async fn resolve_async(&self, to: &SocketAddr) -> Result<(), UdError> {
        if self.is_resolved(to) {
            return Ok(());
        }
        self.route(to, &Mutex::new("resolving")).await
    }

    /// How long a resolve or a join may take (see [`UdConfig::resolve_timeout`]).
    pub fn resolve_timeout(&self) -> Duration {
        self.cfg.resolve_timeout
    }

    /// Whether a send to `to` goes out without resolving it first.
    pub fn is_resolved(&self, to: &SocketAddr) -> bool {
        lock(&self.dests).get(&dest_key(to)).is_some()
    }

    /// Resolve `to` and cache its route, on the calling thread, by the
    /// resolve timeout.
    fn add_route(&self, to: &SocketAddr) -> Result<(), UdError> {
        let step = Mutex::new("resolving");
        let deadline = Instant::now() + self.cfg.resolve_timeout;
        crate::cm::wait_until(self.route(to, &step), deadline).unwrap_or_else(|| {
            let reason = "no answer within the resolve timeout".to_owned();
            Err(match to.ip() {
                group if group.is_multicast() => UdError::Join { group, reason },
                _ => UdError::Resolve { peer: *to, step: *lock(&step), reason },
            })
        })
    }

    /// Resolve `to` and cache its route (`step`: the step under way).
    async fn route(&self, to: &SocketAddr, step: &Mutex<&'static str>) -> Result<(), UdError> {
        if to.ip().is_multicast() {
            return self.membership(to, false).await;
        }
        let p = self.cm.resolve(self.local, *to, self.cfg.resolve_timeout, step).await?;
        let ah =
            AddressHandle::new(&self.io.pd, &p.ah_attr).map_err(|e| UdError::verbs("ibv_create_ah", e))?;
        tracing::debug!(peer = %to, qpn = p.qpn, "ud peer resolved");
        lock(&self.dests).get_or_insert_with(*to, || Dest {
            ah: Arc::new(ah),
            qpn: p.qpn,
            qkey: p.qkey,
            seq: 0,
            learned: false,
        });
        Ok(())
    }

    /// Wait until every datagram posted so far has completed at this end
    /// (its buffer back in the pool), or until `timeout`. Returns whether
    /// they all did.
    ///
    /// Sends are signalled selectively, so when the newest ones were not,
    /// the flush posts a fence behind them: an empty send to this socket
    /// itself, which its receivers skip. The first such flush resolves the
    /// socket's own address through rdma_cm (within
    /// [`UdConfig::resolve_timeout`]).
    pub fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        self.io.flush(deadline, &|| self.own_route())
    }

    /// A route to this socket itself, for send fences.
    fn own_route(&self) -> Option<Route> {
        if self.local.ip().is_multicast() {
            // Never the case (sockets bind to an interface), and a fence
            // must not reach other members of a group.
            return None;
        }
        if let Err(e) = self.resolve(&self.local) {
            tracing::warn!(error = %e, "cannot resolve this UD socket's own address for a send fence");
            return None;
        }
        lock(&self.dests).get(&dest_key(&self.local)).map(Dest::route)
    }

    /// Largest payload a datagram may carry: the active MTU less the
    /// 16-byte header (the whole MTU in raw mode).
    pub fn max_datagram(&self) -> usize {
        self.max_datagram
    }

    /// The port's active MTU in bytes.
    pub fn mtu(&self) -> u32 {
        self.mtu
    }

    /// The bound address: the interface's IP and the rdma_cm port peers
    /// resolve this socket at.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The queue pair number.
    pub fn qp_num(&self) -> u32 {
        self.io.qp.qp_num()
    }

    /// The registered pool buffers come from.
    pub fn pool(&self) -> &Pool {
        &self.io.pool
    }

    /// Whether the socket sends and receives bare payloads.
    pub fn is_raw(&self) -> bool {
        self.cfg.raw
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> UdStats {
        let c = &self.io.counters;
        let (sources_tracked, sources_evicted) = {
            let t = lock(&self.sources);
            (t.len() as u64, t.evicted())
        };
        UdStats {
            sent: c.sent.load(Relaxed),
            send_errors: c.send_errors.load(Relaxed),
            received: c.received.load(Relaxed),
            dropped_malformed: c.dropped_malformed.load(Relaxed),
            recv_errors: c.recv_errors.load(Relaxed),
            sources_tracked,
            sources_evicted,
            address_handles: lock(&self.dests).len() as u64,
        }
    }

    /// Received, lost and reordered counts of datagrams from `from`.
    pub fn source_stats(&self, from: &SocketAddr) -> Option<SeqStats> {
        lock(&self.sources).get(from).map(SeqTracker::stats)
    }

    /// Every source tracked, with its counts: at most
    /// [`UdConfig::max_sources`], the recently active ones.
    pub fn sources(&self) -> Vec<(SocketAddr, SeqStats)> {
        lock(&self.sources).iter().map(|(a, t)| (*a, t.stats())).collect()
    }
}

impl Drop for UdSocket {
    fn drop(&mut self) {
        self.io.close();
        self.cm.stop();
        let groups: Vec<Group> = lock(&self.groups).drain().map(|(_, g)| g).collect();
        for g in groups {
            self.drop_group(g);
        }
        tracing::debug!(local = %self.local, stats = ?self.stats(), "ud socket closed");
    }
}

fn wait_until(deadline: Option<Instant>) -> Wait {
    match deadline {
        None => Wait::Forever,
        Some(d) => Wait::For(d.saturating_duration_since(Instant::now())),
    }
}

impl fmt::Debug for UdSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UdSocket")
            .field("local", &self.local)
            .field("qpn", &self.qp_num())
            .field("max_datagram", &self.max_datagram)
            .field("raw", &self.cfg.raw)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Datagram for UdSocket {
    const CAPS: Caps = Caps::DATAGRAM;
    type TxBuf = Buf;
    type RxBuf = UdDatagram;
    type Addr = SocketAddr;
    type AllocError = PoolError;
    type Error = UdError;

    fn alloc(&self, len: usize, deadline: Option<Instant>) -> Result<Buf, PoolError> {
        UdSocket::alloc(self, len, deadline)
    }

    fn send_to(&self, buf: Buf, to: &SocketAddr) -> Result<(), (Buf, UdError)> {
        UdSocket::send_to(self, buf, to)
    }

    fn send_batch(&self, batch: &mut Vec<(Buf, SocketAddr)>) -> Result<(), UdError> {
        UdSocket::send_batch(self, batch)
    }

    fn recv_from(&self, deadline: Option<Instant>) -> Result<(UdDatagram, SocketAddr), RecvError> {
        UdSocket::recv_from(self, deadline)
    }

    fn join(&self, group: &SocketAddr) -> Result<(), UdError> {
        UdSocket::join(self, group)
    }

    fn leave(&self, group: &SocketAddr) -> Result<(), UdError> {
        UdSocket::leave(self, group)
    }

    fn max_datagram(&self) -> usize {
        self.max_datagram
    }

    fn local_addr(&self) -> SocketAddr {
        self.local
    }
}
