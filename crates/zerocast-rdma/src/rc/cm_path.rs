//! `rc://`: connecting and accepting through rdma_cm.
//!
//! Client: resolve address → resolve route (on an event channel of the
//! connect's own) → the id moves to the transport's event channel (see
//! `cm_hub`) → create QP → post receives → `rdma_connect` with our hello as
//! private data → ESTABLISHED carries the server's hello. Server:
//! CONNECT_REQUEST carries the client's hello → the new id moves to the
//! transport's event channel → create QP → post receives → `rdma_accept`
//! with our hello → ESTABLISHED. Either way the connection's rdma_cm watch
//! then takes the id's events from the transport's channel.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd};
use std::ptr::{self, NonNull};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_sys::{rdma_cm_event_type as ev, rdma_conn_param};
use zerocast_core::{ConnError, ConnectError, Endpoint, Hello, LinkConfig};
use zerocast_link::engine::{Cx, Step, Task};
use zerocast_link::Driver;

use super::cm_hub::RouteGuard;
use super::engine::{Io, Receives, Sizes};
use super::listen::{AcceptTask, Intake, RcListener, Shared, Taken};
use super::srq::SharedRecv;
use super::{no_room, resolve, transport_err, RcConnection, RcError, RcTransport};
use crate::cm::{context_name, CmEvent, CmId, EventChannel, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT};
use crate::error::errno_from_rc;
use crate::verbs::QueuePair;

fn verbs_err(what: &'static str, rc: i32) -> ConnectError {
    transport_err(RcError::verbs(what, errno_from_rc(rc)))
}

/// Wait for the next event on `ch`, or time out.
fn next_event(ch: &EventChannel, deadline: Instant, step: &'static str) -> Result<CmEvent, ConnectError> {
    let left = deadline.saturating_duration_since(Instant::now());
    match ch.get(Some(left)) {
        Ok(Some(e)) => Ok(e),
        Ok(None) => Err(ConnectError::Timeout(format!("rdma_cm: {step}"))),
        Err(e) => Err(transport_err(RcError::verbs("rdma_get_cm_event", e))),
    }
}

/// Wait for `want`; any other event is an error of `step`.
fn expect(
    ch: &EventChannel,
    want: ev::Type,
    deadline: Instant,
    step: &'static str,
) -> Result<CmEvent, ConnectError> {
    let e = next_event(ch, deadline, step)?;
    if e.kind() == want {
        return Ok(e);
    }
    if e.kind() == ev::RDMA_CM_EVENT_REJECTED {
        return Err(ConnectError::Refused(format!(
            "{} (status {})",
            RcError::Rejected { status: e.status() },
            e.status()
        )));
    }
    Err(transport_err(RcError::Cm { step, event: e.name(), status: e.status() }))
}

/// Connection parameters carrying `hello`, with the RDMA READ depths
/// `(responder resources, initiator depth)`.
fn conn_param(t: &RcTransport, hello: &[u8], (responder, initiator): (u8, u8)) -> rdma_conn_param {
    // SAFETY: all-zero is a valid `rdma_conn_param`.
    let mut p: rdma_conn_param = unsafe { std::mem::zeroed() };
    p.private_data = hello.as_ptr().cast();
    p.private_data_len = hello.len() as u8;
    p.responder_resources = responder;
    p.initiator_depth = initiator;
    p.retry_count = t.inner.cfg.retry_cnt;
    p.rnr_retry_count = t.inner.cfg.rnr_retry;
    p
}

fn set_ack_timeout(id: &CmId, timeout: u8) {
    let mut v = timeout;
    // SAFETY: live id; `v` is a readable u8 of the given length.
    let rc = unsafe {
        rdma_sys::rdma_set_option(
            id.as_ptr(),
            RDMA_OPTION_ID,
            RDMA_OPTION_ID_ACK_TIMEOUT,
            (&mut v as *mut u8).cast(),
            1,
        )
    };
    if rc != 0 {
        tracing::debug!(error = %errno_from_rc(rc), "rdma_set_option(ACK_TIMEOUT) failed; using rdma_cm's default");
    }
}

fn check_device(t: &RcTransport, id: &CmId) -> Result<(), ConnectError> {
    let verbs = id.verbs();
    if verbs != t.inner.pd.context().as_ptr() {
        let cm = if verbs.is_null() {
            "none".to_owned()
        } else {
            // SAFETY: a bound id's context is open (owned by librdmacm).
            unsafe { context_name(verbs) }
        };
        return Err(transport_err(RcError::WrongDevice { cm, pd: t.inner.device.name().to_owned() }));
    }
    Ok(())
}

/// Create the QP on `id` with the receives `shaped` chose, and post them
/// (or, for a connection admitted to a listener's shared receive queue,
/// take them from it).
fn prepare(
    t: &RcTransport,
    id: &Arc<CmId>,
    (sizes, receives): (Sizes, Receives),
) -> Result<Arc<Io>, ConnectError> {
    let shared = receives.srq();
    let (cq, notify) = t.cq(&sizes).map_err(transport_err)?;
    let qp = QueuePair::create_cm(id, &t.inner.pd, &cq, t.caps(&sizes, shared.as_ref()))
        .map_err(|e| transport_err(RcError::verbs("rdma_create_qp", e)))?;
    t.new_io(qp, (cq, notify), sizes, receives).map_err(transport_err)
}

/// Private data of a rejection for want of receives: the listener's
/// shared receive queue is full, or its receive memory is all reserved.
const NO_ROOM: &[u8] = b"ZCSRQFULL";
/// Private data of a rejection of a peer that serves no RDMA READs (0
/// responder resources in its request), whose large messages the listener
/// could therefore never read.
const NO_READS: &[u8] = b"ZCNOREADS";

/// Reject the pending connect request of `id`, with `why` (at most 255
/// bytes) as the rejection's private data, none if empty.
fn reject(id: &CmId, why: &[u8]) {
    debug_assert!(why.len() <= usize::from(u8::MAX), "rejection data of {} bytes", why.len());
    let data = if why.is_empty() { ptr::null() } else { why.as_ptr().cast() };
    // SAFETY: `id` is the live id of a pending request; `data` is null or
    // `why`, which outlives the call, and its length fits the u8 (every
    // caller passes one of the short constants above).
    unsafe { rdma_sys::rdma_reject(id.as_ptr(), data, why.len() as u8) };
}

fn peer_hello(data: &[u8], peer: &Endpoint) -> Result<Hello, ConnectError> {
    Hello::decode(data)
        .map_err(|e| ConnectError::Handshake { endpoint: peer.to_string(), source: ConnError::Handshake(e) })
}

pub(super) fn connect(
    t: &RcTransport,
    ep: &Endpoint,
    link: LinkConfig,
) -> Result<RcConnection, ConnectError> {
    let deadline = Instant::now() + t.inner.cfg.connect_timeout;
    let (ch, id) = resolve_addr(t, ep)?;
    drop(expect(&ch, ev::RDMA_CM_EVENT_ADDR_RESOLVED, deadline, "resolving the address")?);
    resolve_route(t, &id)?;
    drop(expect(&ch, ev::RDMA_CM_EVENT_ROUTE_RESOLVED, deadline, "resolving the route")?);
    let (io, route) = connect_routed(t, ep, &link, ch, id)?;
    let e = route.wait(deadline).ok_or_else(|| ConnectError::Timeout("rdma_cm: connecting".into()))?;
    let (conn, driver) = established(t, ep, link, &io, e)?;
    t.engine_of(&io).register(Box::new(Watch::new(route, io, driver)));
    Ok(conn)
}

/// The first step of a connect: an id on an event channel of its own,
/// whose address resolution is started (ADDR_RESOLVED comes on it).
pub(super) fn resolve_addr(
    t: &RcTransport,
    ep: &Endpoint,
) -> Result<(Arc<EventChannel>, CmId), ConnectError> {
    let addr = resolve(ep)?;
    let io_err = |e| ConnectError::Io { endpoint: ep.to_string(), source: e };
    let ch = EventChannel::new().map_err(io_err)?;
    let id = CmId::new(&ch).map_err(io_err)?;
    let dst = CmId::sockaddr(addr);
    // SAFETY: live id; `dst` is a valid sockaddr for the call's duration.
    let rc = unsafe {
        rdma_sys::rdma_resolve_addr(id.as_ptr(), ptr::null_mut(), dst.as_ptr() as *mut _, cm_ms(t))
    };
    if rc != 0 {
        return Err(verbs_err("rdma_resolve_addr", rc));
    }
    Ok((ch, id))
}

/// rdma_cm's own timeout for each resolution: the connect's.
fn cm_ms(t: &RcTransport) -> i32 {
    t.inner.cfg.connect_timeout.as_millis().min(i32::MAX as u128) as i32
}

/// Start resolving the route of an id whose address is resolved
/// (ROUTE_RESOLVED comes on its channel).
pub(super) fn resolve_route(t: &RcTransport, id: &CmId) -> Result<(), ConnectError> {
    // SAFETY: live id with a resolved address.
    let rc = unsafe { rdma_sys::rdma_resolve_route(id.as_ptr(), cm_ms(t)) };
    if rc != 0 {
        return Err(verbs_err("rdma_resolve_route", rc));
    }
    Ok(())
}

/// A routed id: move it to the transport's channel (the resolving one,
/// `ch`, is dropped), create its QP and receives, and send the connect
/// request with our hello. The answer comes through the returned route.
pub(super) fn connect_routed(
    t: &RcTransport,
    ep: &Endpoint,
    link: &LinkConfig,
    ch: Arc<EventChannel>,
    mut id: CmId,
) -> Result<(Arc<Io>, RouteGuard), ConnectError> {
    check_device(t, &id)?;
    set_ack_timeout(&id, t.inner.cfg.timeout);
    let hub = t.inner.cm_hub()?;
    let route = hub.route(&id);
    id.migrate(hub.channel()).map_err(|e| ConnectError::Io { endpoint: ep.to_string(), source: e })?;
    drop(ch);
    let id = Arc::new(id);
    let io = prepare(t, &id, t.shaped(link, None).map_err(transport_err)?)?;
    let hello = t.hello(link, &io).encode();
    let mut param = conn_param(t, &hello, t.read_depths());
    // SAFETY: live id with a QP and a resolved route; `param` and `hello`
    // outlive the call (librdmacm copies the private data).
    let rc = unsafe { rdma_sys::rdma_connect(id.as_ptr(), &mut param) };
    if rc != 0 {
        return Err(verbs_err("rdma_connect", rc));
    }
    Ok((io, route))
}

/// The listener's answer to our connect request: the connection, and the
/// driver its rdma_cm watch takes, if it accepted.
pub(super) fn established(
    t: &RcTransport,
    ep: &Endpoint,
    link: LinkConfig,
    io: &Arc<Io>,
    e: super::cm_hub::Event,
) -> Result<(RcConnection, Driver), ConnectError> {
    match e.kind {
        ev::RDMA_CM_EVENT_ESTABLISHED => {}
        ev::RDMA_CM_EVENT_REJECTED if e.private_data.starts_with(NO_ROOM) => return Err(no_room(ep)),
        ev::RDMA_CM_EVENT_REJECTED if e.private_data.starts_with(NO_READS) => {
            return Err(ConnectError::Refused(format!(
                "{ep}: the listener reads large messages by RDMA READ, and this side serves none (0 \
                 responder resources)"
            )))
        }
        ev::RDMA_CM_EVENT_REJECTED => {
            return Err(ConnectError::Refused(format!("{ep}: {}", RcError::Rejected { status: e.status })))
        }
        _ => {
            return Err(transport_err(RcError::Cm { step: "connecting", event: e.name(), status: e.status }))
        }
    }
    let hello = peer_hello(&e.private_data, ep)?;
    t.finish(io.clone(), link, hello, ep.clone())
}

/// Bind and listen on `ep`; the listener's accepting task runs on an
/// engine (see `listen`).
pub(super) fn listen(
    t: &RcTransport,
    ep: &Endpoint,
    link: LinkConfig,
    srq: Option<Arc<SharedRecv>>,
) -> Result<RcListener, ConnectError> {
    let addr = resolve(ep)?;
    let io_err = |e| ConnectError::Io { endpoint: ep.to_string(), source: e };
    let ch = EventChannel::new().map_err(io_err)?;
    let id = CmId::new(&ch).map_err(io_err)?;
    let sa = CmId::sockaddr(addr);
    // SAFETY: live id; `sa` is valid for the call.
    let rc = unsafe { rdma_sys::rdma_bind_addr(id.as_ptr(), sa.as_ptr() as *mut _) };
    if rc != 0 {
        let e = errno_from_rc(rc);
        if e.raw_os_error() == Some(libc::EADDRINUSE) {
            return Err(ConnectError::InUse(ep.to_string()));
        }
        return Err(io_err(e));
    }
    // SAFETY: bound id.
    let rc = unsafe { rdma_sys::rdma_listen(id.as_ptr(), LISTEN_BACKLOG) };
    if rc != 0 {
        return Err(io_err(errno_from_rc(rc)));
    }
    let local = ep.with_port(id.src_port());
    tracing::debug!(%local, "rc listening");
    Ok(RcListener::start(t, local, link, srq, |shared, engine| {
        engine.register(Box::new(AcceptTask::new(Requests { id }, shared)));
    }))
}

/// Connect requests rdma_cm queues for the listener.
const LISTEN_BACKLOG: i32 = 1024;

/// The listening id: each connect request starts a handshake task.
struct Requests {
    id: CmId,
}

impl Requests {
    /// A connect request: answer it (or refuse it) and leave the rest of
    /// the handshake to a task of its own.
    fn request(&self, shared: &Arc<Shared>, e: CmEvent, cx: &mut Cx<'_>) {
        let Some(raw) = NonNull::new(e.id()) else { return };
        let data = e.private_data();
        let asked = e.read_depths();
        drop(e);
        // SAFETY: the id of a connect request is ours to accept or destroy.
        let id = unsafe { CmId::from_raw(raw, self.id.channel()) };
        let peer = peer_endpoint(&id, &shared.local);
        match Handshake::start(shared, id, (&data, asked), peer.clone(), cx.now()) {
            Ok(task) => cx.spawn(Box::new(task)),
            Err(err) => shared.failed(&peer, &err),
        }
    }
}

impl Intake for Requests {
    fn fd(&self) -> BorrowedFd<'_> {
        self.id.channel().as_fd()
    }

    fn take(&mut self, shared: &Arc<Shared>, cx: &mut Cx<'_>) -> Taken {
        match self.id.channel().get(Some(Duration::ZERO)) {
            Ok(Some(e)) if e.kind() == ev::RDMA_CM_EVENT_CONNECT_REQUEST => self.request(shared, e, cx),
            Ok(Some(e)) => tracing::debug!(event = %e.name(), "rc listener: ignoring event"),
            Ok(None) => return Taken::Nothing,
            Err(e) => {
                return Taken::Fatal(ConnectError::Io { endpoint: shared.local.to_string(), source: e })
            }
        }
        Taken::One
    }
}

/// An accepted connect request waiting for ESTABLISHED, by a deadline on
/// the whole handshake, woken by the transport's event channel the
/// request's id moved to. Established, it becomes the connection's rdma_cm
/// watch in place, and the connection goes to `accept`.
struct Handshake {
    /// The id's events; taken by the watch the handshake becomes.
    route: Option<RouteGuard>,
    io: Arc<Io>,
    hello: Hello,
    peer: Endpoint,
    deadline: Instant,
    shared: Arc<Shared>,
}

impl Handshake {
    /// Check the peer's hello, admit it to the shared receive queue, move
    /// its id to the transport's event channel, create its QP and accept.
    /// `asked`: the READ depths of the request from our side (the
    /// responder resources and initiator depth it allows us, see
    /// `CmEvent::read_depths`), which ours may not exceed.
    fn start(
        shared: &Arc<Shared>,
        mut id: CmId,
        (data, asked): (&[u8], (u8, u8)),
        peer: Endpoint,
        now: Instant,
    ) -> Result<Self, ConnectError> {
        let t = &shared.transport;
        let hello = match peer_hello(data, &peer) {
            Ok(h) => h,
            Err(err) => {
                reject(&id, &[]);
                return Err(err);
            }
        };
        if asked.1 == 0 {
            // The peer serves no READs: our QP could never read its large
            // messages. Refuse it now, and say why, rather than accept a
            // connection whose first rendezvous fails.
            reject(&id, NO_READS);
            let source = ConnError::transport(RcError::NoReads);
            return Err(ConnectError::Handshake { endpoint: peer.to_string(), source });
        }
        let member = shared.srq.as_ref().map(SharedRecv::admit).transpose();
        let shaped = match member.and_then(|m| t.shaped(&shared.link, m)) {
            Ok(s) => s,
            Err(err) => {
                tracing::debug!(%peer, error = %err, "rc listener: refusing a connection");
                // Say why when there is no room; other failures reject plainly.
                let no_room = matches!(err, RcError::SrqFull { .. } | RcError::ReceiveMemory { .. });
                reject(&id, if no_room { NO_ROOM } else { &[] });
                return Err(transport_err(err));
            }
        };
        let io_err = |e| ConnectError::Io { endpoint: peer.to_string(), source: e };
        let hub = t.inner.cm_hub()?;
        let route = hub.route(&id);
        id.migrate(hub.channel()).map_err(io_err)?;
        check_device(t, &id)?;
        set_ack_timeout(&id, t.inner.cfg.timeout);
        let id = Arc::new(id);
        let io = prepare(t, &id, shaped)?;
        let ours = t.hello(&shared.link, &io).encode();
        // We serve at most the READs the peer issues, and issue at most
        // those it serves (at least one: a peer that serves none was
        // refused above). `asked` is already from our side (see
        // `CmEvent::read_depths`).
        let (responder, initiator) = t.read_depths();
        let depths = (responder.min(asked.0), initiator.min(asked.1));
        let mut param = conn_param(t, &ours, depths);
        // SAFETY: live id with a QP; `param` and `ours` outlive the call.
        let rc = unsafe { rdma_sys::rdma_accept(id.as_ptr(), &mut param) };
        if rc != 0 {
            return Err(verbs_err("rdma_accept", rc));
        }
        let deadline = now + t.inner.cfg.connect_timeout;
        Ok(Self { route: Some(route), io, hello, peer, deadline, shared: shared.clone() })
    }

    fn established(&mut self, route: RouteGuard) -> Step {
        let t = &self.shared.transport;
        match t.finish(self.io.clone(), self.shared.link, self.hello, self.peer.clone()) {
            Ok((conn, driver)) => {
                self.shared.deliver(conn);
                Step::Replace(Box::new(Watch::new(route, self.io.clone(), driver)))
            }
            Err(err) => {
                self.shared.failed(&self.peer, &err);
                Step::Done
            }
        }
    }
}

impl Task for Handshake {
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    fn run(&mut self, cx: &mut Cx<'_>) -> Step {
        let Some(route) = &self.route else { return Step::Done };
        // One event settles it: ESTABLISHED, or anything else (a
        // rejection, an error, the peer gone) fails the handshake.
        let failed = match route.take(&cx.waker()) {
            Some(e) if e.kind == ev::RDMA_CM_EVENT_ESTABLISHED => {
                let Some(route) = self.route.take() else { return Step::Done };
                return self.established(route);
            }
            Some(e) => {
                Some(transport_err(RcError::Cm { step: "accepting", event: e.name(), status: e.status }))
            }
            None => None,
        };
        if let Some(err) = failed {
            self.shared.failed(&self.peer, &err);
            return Step::Done;
        }
        // The listener closed: nobody takes the connection.
        if self.shared.close.is_closed() {
            return Step::Done;
        }
        if cx.now() >= self.deadline {
            let err = ConnectError::Timeout("rdma_cm: accepting".into());
            self.shared.failed(&self.peer, &err);
            return Step::Done;
        }
        cx.set_timer(Some(self.deadline));
        Step::Continue
    }
}

/// The peer's address as an endpoint (the listener's own when unknown).
fn peer_endpoint(id: &CmId, local: &Endpoint) -> Endpoint {
    // SAFETY: live id; for an IPv4 connection the destination is a sockaddr_in.
    let sin = unsafe { (*id.as_ptr()).route.addr.dst_addr_union.dst_sin };
    if i32::from(sin.sin_family) != libc::AF_INET {
        return local.clone();
    }
    let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
    let sa = SocketAddr::new(IpAddr::V4(ip), u16::from_be(sin.sin_port));
    Endpoint::parse(&format!("{}://{sa}", local.scheme())).unwrap_or_else(|_| local.clone())
}

/// The connection's rdma_cm events after setup, as an engine task woken
/// by the transport's channel (see `cm_hub`): a DISCONNECTED from the peer
/// ends the connection (its receives flush; if the peer never said
/// goodbye, that is a [`RcError::PeerDisconnected`]). It runs when an
/// event comes or the connection closes; once closing, it waits at most
/// ten seconds more for the DISCONNECTED.
pub(super) struct Watch {
    route: RouteGuard,
    io: Arc<Io>,
    driver: Driver,
    registered: bool,
    closing_since: Option<Instant>,
}

/// How long, after our close, the DISCONNECTED may take.
const CLOSE_PATIENCE: Duration = Duration::from_secs(10);

impl Watch {
    pub(super) fn new(route: RouteGuard, io: Arc<Io>, driver: Driver) -> Self {
        Self { route, io, driver, registered: false, closing_since: None }
    }
}

impl Task for Watch {
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    fn run(&mut self, cx: &mut Cx<'_>) -> Step {
        let io = &self.io;
        if !self.registered {
            io.wake_on_close(cx.waker());
            self.registered = true;
        }
        let waker = cx.waker();
        while let Some(e) = self.route.take(&waker) {
            match e.kind {
                ev::RDMA_CM_EVENT_DISCONNECTED => {
                    io.mark_peer_disconnected();
                    if !io.is_closing() {
                        io.close();
                    }
                    return Step::Done;
                }
                ev::RDMA_CM_EVENT_DEVICE_REMOVAL => {
                    self.driver.fail(ConnError::transport(RcError::Cm {
                        step: "connected",
                        event: e.name(),
                        status: 0,
                    }));
                    io.close();
                    return Step::Done;
                }
                _ => tracing::debug!(event = %e.name(), "rc connection: event"),
            }
        }
        if io.is_closing() {
            let since = *self.closing_since.get_or_insert(cx.now());
            if cx.now().duration_since(since) > CLOSE_PATIENCE {
                return Step::Done;
            }
            cx.set_timer(Some(since + CLOSE_PATIENCE));
        }
        Step::Continue
    }
}
