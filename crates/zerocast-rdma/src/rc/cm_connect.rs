//! `rc://` connecting without a waiting thread, for the async API: the
//! steps of `cm_path::connect` as engine tasks. The first watches the
//! id's own event channel while the address and the route resolve; the
//! second waits, on the connection's engine, for the listener's answer
//! through the transport's channel, then becomes the connection's
//! rdma_cm watch in place (so the route keeps the waker it was given).
//! One deadline covers the whole connect, as on the blocking path.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_sys::rdma_cm_event_type as ev;
use zerocast_core::{ConnectError, Endpoint, LinkConfig, Scheme};
use zerocast_link::engine::{Cx, Interest, Step, Task};
use zerocast_link::{Complete, Completion};

use super::cm_hub::RouteGuard;
use super::cm_path::{connect_routed, established, resolve_addr, resolve_route, Watch};
use super::engine::Io;
use super::{transport_err, RcConnection, RcError, RcTransport};
use crate::cm::{CmId, EventChannel};

/// What the caller awaits.
type Outcome = Complete<Result<RcConnection, ConnectError>>;

/// Start connecting to `ep` on `t`'s engines; the future yields the
/// connection. Dropping it abandons the attempt.
pub(super) fn start(
    t: &RcTransport,
    ep: &Endpoint,
    link: LinkConfig,
) -> Result<Completion<Result<RcConnection, ConnectError>>, ConnectError> {
    let deadline = Instant::now() + t.inner.cfg.connect_timeout;
    let (ch, id) = resolve_addr(t, ep)?;
    let (done, result) = zerocast_link::completion();
    let task = Resolve { id: Some(id), ch, t: t.clone(), ep: ep.clone(), link, deadline, done: Some(done) };
    t.inner.engines.pick().register(Box::new(task));
    Ok(result)
}

impl RcTransport {
    /// Connect without waiting: the handshake runs as engine tasks, by
    /// [`RcConfig::connect_timeout`](super::RcConfig::connect_timeout) on the whole of it, and the returned
    /// future yields the connection. Dropping it abandons the attempt. On
    /// `rc://` the tasks resolve the address and the route, send the
    /// connect request and wait for its answer; on `rc+oob://` they connect
    /// the side channel and exchange the records (see
    /// [`RcTransport::connect_nonblocking_to`]; here `ep`'s host, unless it
    /// is an address, is looked up on the calling thread).
    pub fn connect_nonblocking(
        &self,
        ep: &Endpoint,
    ) -> Result<zerocast_link::Completion<Result<RcConnection, ConnectError>>, ConnectError> {
        match ep.scheme() {
            Scheme::Rc => start(self, ep, self.link_config(ep)?),
            Scheme::RcOob => self.connect_nonblocking_to(ep, super::resolve(ep)?),
            other => Err(ConnectError::Unavailable {
                scheme: other,
                reason: "the RC transport connects rc:// and rc+oob://".into(),
            }),
        }
    }
}

/// Resolving the address, then the route, on the id's own channel.
struct Resolve {
    /// Before `ch`: an id is destroyed before its channel.
    id: Option<CmId>,
    ch: Arc<EventChannel>,
    t: RcTransport,
    ep: Endpoint,
    link: LinkConfig,
    deadline: Instant,
    done: Option<Outcome>,
}

impl Resolve {
    fn fail(&mut self, e: ConnectError) -> Step {
        if let Some(done) = self.done.take() {
            let _ = done.complete(Err(e));
        }
        Step::Done
    }

    /// The route is resolved: send the connect request and wait for the
    /// answer on the connection's engine.
    fn routed(&mut self) -> Step {
        let Some(id) = self.id.take() else { return Step::Done };
        match connect_routed(&self.t, &self.ep, &self.link, self.ch.clone(), id) {
            Ok((io, route)) => {
                let task = Establish {
                    route: Some(route),
                    io: io.clone(),
                    t: self.t.clone(),
                    ep: self.ep.clone(),
                    link: self.link,
                    deadline: self.deadline,
                    done: self.done.take(),
                };
                self.t.engine_of(&io).register(Box::new(task));
                Step::Done
            }
            Err(e) => self.fail(e),
        }
    }
}

impl Task for Resolve {
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.ch.as_fd())
    }

    fn run(&mut self, cx: &mut Cx<'_>) -> Step {
        if self.done.as_ref().is_none_or(Complete::is_abandoned) {
            return Step::Done;
        }
        loop {
            let e = match self.ch.get(Some(Duration::ZERO)) {
                Ok(Some(e)) => e,
                Ok(None) if cx.now() >= self.deadline => {
                    return self
                        .fail(ConnectError::Timeout("rdma_cm: resolving the address and route".into()))
                }
                Ok(None) => {
                    cx.set_interest(Interest { read: true, write: false });
                    cx.set_timer(Some(self.deadline));
                    return Step::Continue;
                }
                Err(e) => return self.fail(transport_err(RcError::verbs("rdma_get_cm_event", e))),
            };
            let (kind, status, name) = (e.kind(), e.status(), e.name());
            // Acknowledged before the next step on the id.
            drop(e);
            match kind {
                ev::RDMA_CM_EVENT_ADDR_RESOLVED => {
                    let Some(id) = &self.id else { return Step::Done };
                    if let Err(err) = resolve_route(&self.t, id) {
                        return self.fail(err);
                    }
                }
                ev::RDMA_CM_EVENT_ROUTE_RESOLVED => return self.routed(),
                _ => return self.fail(transport_err(RcError::Cm { step: "resolving", event: name, status })),
            }
        }
    }
}

/// Waiting for the listener's answer to our connect request.
struct Establish {
    route: Option<RouteGuard>,
    io: Arc<Io>,
    t: RcTransport,
    ep: Endpoint,
    link: LinkConfig,
    deadline: Instant,
    done: Option<Outcome>,
}

impl Task for Establish {
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    fn run(&mut self, cx: &mut Cx<'_>) -> Step {
        let Some(route) = &self.route else { return Step::Done };
        let Some(done) = self.done.take_if(|d| !d.is_abandoned()) else {
            // Nobody waits: the QP and the id go with this task.
            return Step::Done;
        };
        let Some(e) = route.take(&cx.waker()) else {
            if cx.now() >= self.deadline {
                let _ = done.complete(Err(ConnectError::Timeout("rdma_cm: connecting".into())));
                return Step::Done;
            }
            self.done = Some(done);
            cx.set_timer(Some(self.deadline));
            return Step::Continue;
        };
        match established(&self.t, &self.ep, self.link, &self.io, e) {
            Ok((conn, driver)) => {
                // Abandoned meanwhile: the connection closes, through its
                // watch like any other.
                let _ = done.complete(Ok(conn));
                let Some(route) = self.route.take() else { return Step::Done };
                Step::Replace(Box::new(Watch::new(route, self.io.clone(), driver)))
            }
            Err(err) => {
                let _ = done.complete(Err(err));
                Step::Done
            }
        }
    }
}
