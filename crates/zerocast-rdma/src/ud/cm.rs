//! The rdma_cm side of a UD socket, in the UDP port space.
//!
//! One event channel per socket, read by a task on one of the transport's
//! engines (no thread of its own: a process's threads do not grow with its
//! sockets). It answers peers'
//! resolution requests (`RDMA_CM_EVENT_CONNECT_REQUEST`, a SIDR request
//! under the hood) with the socket's QPN, marks groups whose membership
//! failed (`RDMA_CM_EVENT_MULTICAST_ERROR`), and hands every other event
//! to the caller waiting for it: resolving a peer (address, route, then
//! `rdma_connect`, whose ESTABLISHED event carries the peer's QPN, Q_Key
//! and address-handle attributes) or joining a group (address, then
//! `rdma_join_multicast`, whose MULTICAST_JOIN event carries the same for
//! the group).
//!
//! A resolve and a join are futures over those events: a task awaits them
//! (each step's own rdma_cm timeout ends it with an error event, and the
//! caller's timer bounds the whole), and a blocking caller drives the same
//! future on its thread until the resolve timeout ([`crate::cm::wait_until`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Poll, Waker};
use std::time::Duration;

use rdma_sys::{rdma_cm_event_type as ev, rdma_conn_param};
use zerocast_link::engine::{self, Cx, Engine, Interest, Step, Task};

use super::io::lock;
use super::UdError;
use crate::cm::{event_name, CmId, EventChannel, UdParam};
use crate::error::errno_from_rc;

/// An event as handed to its waiter (the event itself is acked at once).
#[derive(Debug, Clone, Copy)]
struct Got {
    kind: ev::Type,
    status: i32,
    ud: UdParam,
}

/// The socket's rdma_cm state, shared with the task that reads its events.
pub(super) struct Cm {
    pub(super) channel: Arc<EventChannel>,
    /// Bound and listening: peers resolve the socket through it. Held so
    /// it lives as long as the socket.
    _listen: CmId,
    qpn: u32,
    waiters: Mutex<HashMap<usize, Slot>>,
    /// Groups' ids → their failed flag.
    watched: Mutex<HashMap<usize, Arc<AtomicBool>>>,
    /// Set by [`Cm::stop`]: the reading task ends.
    stopped: AtomicBool,
    /// The reading task's, once it ran.
    reader: OnceLock<engine::Waker>,
}

/// What an id's waiter has: the event that came for it, or the waker of
/// the task (or thread) waiting for one.
#[derive(Default)]
struct Slot {
    got: Option<Got>,
    waker: Option<Waker>,
}

/// Unregisters a waiter when the wait ends, however it ends.
struct Waiting<'a> {
    cm: &'a Cm,
    key: usize,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        lock(&self.cm.waiters).remove(&self.key);
    }
}

fn verbs(call: &'static str, rc: i32) -> UdError {
    UdError::verbs(call, errno_from_rc(rc))
}

impl Cm {
    /// The socket's rdma_cm state, its events read by a task on `engine`
    /// until [`Cm::stop`].
    pub(super) fn start(channel: Arc<EventChannel>, listen: CmId, qpn: u32, engine: &Engine) -> Arc<Self> {
        let cm = Arc::new(Self {
            channel,
            _listen: listen,
            qpn,
            waiters: Mutex::new(HashMap::new()),
            watched: Mutex::new(HashMap::new()),
            stopped: AtomicBool::new(false),
            reader: OnceLock::new(),
        });
        engine.register(Box::new(Reader(cm.clone())));
        cm
    }

    /// End the reading task (the socket closes).
    pub(super) fn stop(&self) {
        self.stopped.store(true, SeqCst);
        if let Some(w) = self.reader.get() {
            w.wake();
        }
    }

    /// Take every pending event and hand each on. `Err`: the channel
    /// failed.
    fn dispatch(&self) -> std::io::Result<()> {
        while let Some(e) = self.channel.get(Some(Duration::ZERO))? {
            let kind = e.kind();
            if kind == ev::RDMA_CM_EVENT_CONNECT_REQUEST {
                let raw = e.id();
                drop(e);
                if let Some(raw) = NonNull::new(raw) {
                    // SAFETY: the id of a connect request is ours to answer and destroy.
                    let id = unsafe { CmId::from_raw(raw, &self.channel) };
                    self.answer(&id);
                }
                continue;
            }
            let key = e.id() as usize;
            let got = Got { kind, status: e.status(), ud: e.ud_param() };
            drop(e);
            if kind == ev::RDMA_CM_EVENT_MULTICAST_ERROR {
                if let Some(flag) = lock(&self.watched).get(&key) {
                    tracing::warn!(status = got.status, "multicast group failed (MULTICAST_ERROR)");
                    flag.store(true, Relaxed);
                }
            }
            let mut w = lock(&self.waiters);
            match w.get_mut(&key) {
                Some(slot) => {
                    slot.got = Some(got);
                    if let Some(waker) = slot.waker.take() {
                        waker.wake();
                    }
                }
                None => tracing::debug!(event = %event_name(kind), "UD rdma_cm event with no waiter"),
            }
        }
        Ok(())
    }

    /// Answer a peer's resolution request with this socket's QPN (the Q_Key
    /// is the UDP port space's).
    fn answer(&self, id: &CmId) {
        // SAFETY: all-zero is a valid `rdma_conn_param`.
        let mut p: rdma_conn_param = unsafe { std::mem::zeroed() };
        p.qp_num = self.qpn;
        // SAFETY: live id of a pending request; `p` outlives the call.
        let rc = unsafe { rdma_sys::rdma_accept(id.as_ptr(), &mut p) };
        if rc != 0 {
            tracing::debug!(error = %errno_from_rc(rc), "answering a UD resolution request failed");
        }
    }

    fn register(&self, id: &CmId) -> Waiting<'_> {
        let key = id.as_ptr() as usize;
        lock(&self.waiters).insert(key, Slot::default());
        Waiting { cm: self, key }
    }

    /// The next event of `w`'s id; it must be `want` (else the error names
    /// the one that came).
    async fn event(&self, w: &Waiting<'_>, want: ev::Type) -> Result<Got, String> {
        std::future::poll_fn(|cx| {
            let mut map = lock(&self.waiters);
            let Some(slot) = map.get_mut(&w.key) else {
                return Poll::Ready(Err(format!("no {} (the wait was unregistered)", event_name(want))));
            };
            match slot.got.take() {
                Some(got) if got.kind == want => Poll::Ready(Ok(got)),
                Some(got) => Poll::Ready(Err(format!("{} (status {})", event_name(got.kind), got.status))),
                None => {
                    slot.waker = Some(cx.waker().clone());
                    Poll::Pending
                }
            }
        })
        .await
    }

    /// Resolve `peer` from `local`: its QPN, Q_Key and address-handle
    /// attributes. Each rdma_cm step is given `timeout`, at whose end
    /// rdma_cm reports an error event; `step` names the step under way.
    pub(super) async fn resolve(
        &self,
        local: SocketAddr,
        peer: SocketAddr,
        timeout: Duration,
        step: &Mutex<&'static str>,
    ) -> Result<UdParam, UdError> {
        let fail = |step, reason| UdError::Resolve { peer, step, reason };
        let at = |now: &'static str| *lock(step) = now;
        let id = CmId::new_udp(&self.channel).map_err(|e| UdError::verbs("rdma_create_id", e))?;
        let w = self.register(&id);
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        let src = CmId::sockaddr(SocketAddr::new(local.ip(), 0));
        let dst = CmId::sockaddr(peer);
        // SAFETY: live id; both sockaddrs are valid for the call.
        let rc = unsafe {
            rdma_sys::rdma_resolve_addr(id.as_ptr(), src.as_ptr() as *mut _, dst.as_ptr() as *mut _, ms)
        };
        if rc != 0 {
            return Err(verbs("rdma_resolve_addr", rc));
        }
        at("resolving the address");
        self.event(&w, ev::RDMA_CM_EVENT_ADDR_RESOLVED)
            .await
            .map_err(|r| fail("resolving the address", r))?;
        // SAFETY: live id with a resolved address.
        let rc = unsafe { rdma_sys::rdma_resolve_route(id.as_ptr(), ms) };
        if rc != 0 {
            return Err(verbs("rdma_resolve_route", rc));
        }
        at("resolving the route");
        self.event(&w, ev::RDMA_CM_EVENT_ROUTE_RESOLVED).await.map_err(|r| fail("resolving the route", r))?;
        // The parameters (raw pointers, which a task's future must not
        // hold) end with the call.
        let rc = {
            // SAFETY: all-zero is a valid `rdma_conn_param`.
            let mut p: rdma_conn_param = unsafe { std::mem::zeroed() };
            p.qp_num = self.qpn;
            // SAFETY: live id with a resolved route; `p` outlives the call.
            unsafe { rdma_sys::rdma_connect(id.as_ptr(), &mut p) }
        };
        if rc != 0 {
            return Err(verbs("rdma_connect", rc));
        }
        at("asking for its queue pair");
        let got = self
            .event(&w, ev::RDMA_CM_EVENT_ESTABLISHED)
            .await
            .map_err(|r| fail("asking for its queue pair", r))?;
        Ok(got.ud)
    }

    /// Join `group` from the interface at `local`, with an id of its own
    /// (no QP on it: the caller attaches its QP, or only sends). Returns
    /// the id, the group's parameters and its failed flag. The address's
    /// resolution is given `timeout`; a join that rdma_cm never answers is
    /// bounded by the caller. A join dropped part-way leaves the group
    /// (destroying the id does).
    pub(super) async fn join(
        &self,
        local: SocketAddr,
        group: SocketAddr,
        timeout: Duration,
    ) -> Result<(CmId, UdParam, Arc<AtomicBool>), UdError> {
        let fail = |reason: String| UdError::Join { group: group.ip(), reason };
        let id = CmId::new_udp(&self.channel).map_err(|e| UdError::verbs("rdma_create_id", e))?;
        let w = self.register(&id);
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        let src = CmId::sockaddr(SocketAddr::new(local.ip(), 0));
        let dst = CmId::sockaddr(group);
        // SAFETY: live id; both sockaddrs are valid for the call.
        let rc = unsafe {
            rdma_sys::rdma_resolve_addr(id.as_ptr(), src.as_ptr() as *mut _, dst.as_ptr() as *mut _, ms)
        };
        if rc != 0 {
            return Err(verbs("rdma_resolve_addr", rc));
        }
        self.event(&w, ev::RDMA_CM_EVENT_ADDR_RESOLVED).await.map_err(fail)?;
        let flag = Arc::new(AtomicBool::new(false));
        let watched = Watched::new(self, &id, flag.clone());
        // SAFETY: live id with a resolved address; `dst` is valid for the call.
        let rc =
            unsafe { rdma_sys::rdma_join_multicast(id.as_ptr(), dst.as_ptr() as *mut _, ptr::null_mut()) };
        if rc != 0 {
            return Err(verbs("rdma_join_multicast", rc));
        }
        match self.event(&w, ev::RDMA_CM_EVENT_MULTICAST_JOIN).await {
            Ok(got) => {
                watched.keep();
                Ok((id, got.ud, flag))
            }
            Err(reason) => {
                drop(watched);
                self.leave(&id, group);
                Err(fail(reason))
            }
        }
    }

    /// Leave `group` on the id that joined it (the id is destroyed by the caller).
    /// Not watched any more either.
    pub(super) fn leave(&self, id: &CmId, group: SocketAddr) {
        lock(&self.watched).remove(&(id.as_ptr() as usize));
        let dst = CmId::sockaddr(group);
        // SAFETY: live id that joined `group`; `dst` is valid for the call.
        let rc = unsafe { rdma_sys::rdma_leave_multicast(id.as_ptr(), dst.as_ptr() as *mut _) };
        if rc != 0 {
            tracing::debug!(%group, error = %errno_from_rc(rc), "rdma_leave_multicast failed");
        }
    }
}

/// A group's id watched for MULTICAST_ERROR while its join is under way:
/// unwatched again unless the join is kept.
struct Watched<'a> {
    cm: &'a Cm,
    key: Option<usize>,
}

impl<'a> Watched<'a> {
    fn new(cm: &'a Cm, id: &CmId, flag: Arc<AtomicBool>) -> Self {
        let key = id.as_ptr() as usize;
        lock(&cm.watched).insert(key, flag);
        Self { cm, key: Some(key) }
    }

    fn keep(mut self) {
        self.key = None;
    }
}

impl Drop for Watched<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key {
            lock(&self.cm.watched).remove(&key);
        }
    }
}

/// The engine task that reads a socket's rdma_cm events.
struct Reader(Arc<Cm>);

impl Task for Reader {
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.0.channel.as_fd())
    }

    fn run(&mut self, cx: &mut Cx<'_>) -> Step {
        // Kept before the flag is read: a stop after the read wakes us.
        let _ = self.0.reader.set(cx.waker());
        if self.0.stopped.load(SeqCst) {
            return Step::Done;
        }
        if let Err(e) = self.0.dispatch() {
            tracing::warn!(error = %e, "UD rdma_cm event channel failed; no more peers can resolve this socket");
            return Step::Done;
        }
        cx.set_interest(Interest { read: true, write: false });
        Step::Continue
    }
}
