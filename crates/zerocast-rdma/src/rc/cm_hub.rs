//! One rdma_cm event channel for every `rc://` connection of a transport.
//!
//! A connection's id moves to the hub's channel before its `rdma_connect`
//! or `rdma_accept`, with a [`Route`] registered under the id's address
//! first, so that no event of it finds no route. One engine task reads the
//! channel: each event is copied (kind, status, private data),
//! acknowledged at once, and put in its route's inbox; then the route's
//! task is woken, or the connecting thread that waits on the route. An
//! event of an id without a route (its connection's watch is over) is
//! acknowledged and dropped.
//!
//! So an established connection costs no descriptor of its own for its
//! rdma_cm events, and the engine's poll set does not grow with
//! connections for them. Acknowledging at once also keeps
//! `rdma_destroy_id` (which waits for every event of the id handed out to
//! be acknowledged) from ever waiting on an event that sits in an inbox.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use libc::c_int;
use rdma_sys::rdma_cm_event_type as ev;
use zerocast_link::engine::{Cx, Engine, Interest, Step, Task, Waker};

use super::hub::Hub;
use crate::cm::{event_name, CmId, EventChannel};

/// An rdma_cm event, copied out of the channel (and acknowledged there).
#[derive(Debug)]
pub(crate) struct Event {
    pub(crate) kind: ev::Type,
    pub(crate) status: c_int,
    pub(crate) private_data: Vec<u8>,
}

impl Event {
    pub(crate) fn name(&self) -> String {
        event_name(self.kind)
    }
}

/// A transport's rdma_cm event channel and the routes of its ids.
pub(crate) struct CmHub {
    channel: Arc<EventChannel>,
    routes: Mutex<HashMap<usize, Arc<Route>>>,
    /// The reading task's, once it ran.
    waker: OnceLock<Waker>,
}

/// Where the events of one id go.
#[derive(Default)]
pub(crate) struct Route {
    inbox: Mutex<Inbox>,
    /// For a connecting thread waiting on the route.
    arrived: Condvar,
}

#[derive(Default)]
struct Inbox {
    events: VecDeque<Event>,
    /// The task the route's events are for, once it ran.
    waker: Option<Waker>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain data, consistent after every statement.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl CmHub {
    /// A channel, read by a task on `engine`.
    pub(crate) fn start(engine: &Engine) -> io::Result<Arc<Self>> {
        let hub = Arc::new(Self {
            channel: EventChannel::new()?,
            routes: Mutex::default(),
            waker: OnceLock::new(),
        });
        engine.register(Box::new(Reader(hub.clone())));
        Ok(hub)
    }

    /// The channel ids move to (after [`CmHub::route`]).
    pub(crate) fn channel(&self) -> &Arc<EventChannel> {
        &self.channel
    }

    /// Send the events of `id` to a route of its own, from now on until the
    /// guard drops. Call before moving the id to [`CmHub::channel`].
    pub(crate) fn route(self: &Arc<Self>, id: &CmId) -> RouteGuard {
        let key = id.as_ptr() as usize;
        let route = Arc::new(Route::default());
        lock(&self.routes).insert(key, route.clone());
        RouteGuard { hub: Some(self.clone()), key, route }
    }

    /// Read every pending event and hand each to its route.
    fn dispatch(&self) -> io::Result<()> {
        while let Some(e) = self.channel.get(Some(Duration::ZERO))? {
            let key = e.id() as usize;
            let event = Event { kind: e.kind(), status: e.status(), private_data: e.private_data() };
            drop(e);
            let route = lock(&self.routes).get(&key).cloned();
            let Some(route) = route else {
                tracing::debug!(event = %event.name(), "rdma_cm event of an id no longer watched");
                continue;
            };
            let waker = {
                let mut inbox = lock(&route.inbox);
                inbox.events.push_back(event);
                inbox.waker.clone()
            };
            route.arrived.notify_all();
            if let Some(w) = waker {
                w.wake();
            }
        }
        Ok(())
    }
}

/// A registered route; dropping it ends the routing of its id's events.
pub(crate) struct RouteGuard {
    /// Taken only by the drop.
    hub: Option<Arc<CmHub>>,
    key: usize,
    route: Arc<Route>,
}

impl RouteGuard {
    /// The next event, if one came; from now on, `waker`'s task is woken
    /// when one comes.
    pub(crate) fn take(&self, waker: &Waker) -> Option<Event> {
        let mut inbox = lock(&self.route.inbox);
        if inbox.waker.is_none() {
            inbox.waker = Some(waker.clone());
        }
        inbox.events.pop_front()
    }

    /// The next event, waiting for it until `deadline` (a connecting
    /// thread).
    pub(crate) fn wait(&self, deadline: Instant) -> Option<Event> {
        let mut inbox = lock(&self.route.inbox);
        loop {
            if let Some(e) = inbox.events.pop_front() {
                return Some(e);
            }
            let left = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero())?;
            inbox = self.route.arrived.wait_timeout(inbox, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

impl Drop for RouteGuard {
    fn drop(&mut self) {
        let Some(hub) = self.hub.take() else { return };
        let mut routes = lock(&hub.routes);
        // An id's address may be reused by a later id with a route of its own.
        if routes.get(&self.key).is_some_and(|r| Arc::ptr_eq(r, &self.route)) {
            routes.remove(&self.key);
        }
        let last = routes.is_empty();
        drop(routes);
        if last {
            // The last route: the reader of a hub the transport let go of
            // may end.
            hub.retire();
        }
    }
}

/// Retired (see [`Hub::retire`]) by the transport and by the last route.
impl Hub for CmHub {
    fn reader(&self) -> &OnceLock<Waker> {
        &self.waker
    }
}

/// The engine task that reads the hub's channel.
struct Reader(Arc<CmHub>);

impl Task for Reader {
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.0.channel.as_fd())
    }

    fn run(&mut self, cx: &mut Cx<'_>) -> Step {
        // Only this task holds the hub: its transport and every route
        // (which the ids on the channel outlive only briefly) are gone.
        if Hub::reader_alone(&self.0, cx) {
            return Step::Done;
        }
        if let Err(e) = self.0.dispatch() {
            tracing::warn!(error = %e, "rdma_cm event channel failed; connections miss their events");
            return Step::Done;
        }
        cx.set_interest(Interest { read: true, write: false });
        Step::Continue
    }
}
