//! Shared receive queues (`ibv_srq`) and the device's asynchronous events,
//! through which an SRQ reports that it ran low.
//!
//! An [`Srq`] is a plain verbs object: create, post a receive, arm its
//! limit, destroy. [`AsyncEvents`] reads a context's async event queue on a
//! thread of its own (only while some SRQ is registered) and hands
//! `IBV_EVENT_SRQ_LIMIT_REACHED` to the handler registered for that SRQ.
//! Every event is acknowledged before its handler's last reference can go,
//! so `ibv_destroy_srq` (which waits for the acknowledgements) never blocks.
//!
//! This crate reads the async events of the contexts it uses: an
//! application sharing such a context must not read them itself.

use std::fmt;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::raw::c_int;
use std::ptr::{self, NonNull};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread;

use rdma_sys::{
    ibv_ack_async_event, ibv_async_event, ibv_create_srq, ibv_destroy_srq, ibv_event_type,
    ibv_get_async_event, ibv_modify_srq, ibv_recv_wr, ibv_srq, ibv_srq_attr, ibv_srq_attr_mask,
    ibv_srq_init_attr,
};

use crate::cm::set_nonblocking;
use crate::device::{Context, ProtectionDomain};
use crate::error::errno_from_rc;
use crate::eventfd::{drain, eventfd, poll_either, signal};

/// A shared receive queue: receives posted here serve every QP created
/// with it. Destroyed when the last `Arc` drops (each such QP holds one).
pub(crate) struct Srq {
    raw: NonNull<ibv_srq>,
    /// Kept alive: the SRQ is destroyed before its PD.
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: SRQ verbs (post, modify, destroy) are thread-safe; the provider
// locks the queue.
unsafe impl Send for Srq {}
// SAFETY: as above; every method takes `&self`.
unsafe impl Sync for Srq {}

impl Srq {
    /// An SRQ of at least `max_wr` receives of up to two SGEs each.
    pub(crate) fn new(pd: &Arc<ProtectionDomain>, max_wr: u32) -> io::Result<Arc<Self>> {
        let mut attr = ibv_srq_init_attr {
            srq_context: ptr::null_mut(),
            attr: ibv_srq_attr { max_wr, max_sge: 2, srq_limit: 0 },
        };
        // SAFETY: live PD (kept alive by the result); `attr` is valid.
        let raw = unsafe { ibv_create_srq(pd.as_ptr(), &mut attr) };
        let raw = NonNull::new(raw).ok_or_else(io::Error::last_os_error)?;
        Ok(Arc::new(Self { raw, _pd: pd.clone() }))
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_srq {
        self.raw.as_ptr()
    }

    /// Arm the low-watermark event: one `IBV_EVENT_SRQ_LIMIT_REACHED` once
    /// fewer than `limit` receives are posted. The event disarms it.
    pub(crate) fn arm(&self, limit: u32) -> io::Result<()> {
        let mut attr = ibv_srq_attr { max_wr: 0, max_sge: 0, srq_limit: limit };
        // SAFETY: live SRQ; `attr` is valid for the IBV_SRQ_LIMIT mask.
        let rc =
            unsafe { ibv_modify_srq(self.as_ptr(), &mut attr, ibv_srq_attr_mask::IBV_SRQ_LIMIT.0 as c_int) };
        if rc != 0 {
            return Err(errno_from_rc(rc));
        }
        Ok(())
    }

    /// Post one receive.
    ///
    /// # Safety
    /// `wr` is a valid receive WR whose SGEs point into memory registered
    /// in this SRQ's PD that stays valid until its completion is polled (or
    /// the SRQ is destroyed).
    pub(crate) unsafe fn post_recv(&self, wr: *mut ibv_recv_wr) -> io::Result<()> {
        let mut bad: *mut ibv_recv_wr = ptr::null_mut();
        // SAFETY: live SRQ; the caller vouches for the WR.
        let rc = unsafe { rdma_sys::ibv_post_srq_recv(self.as_ptr(), wr, &mut bad) };
        if rc != 0 {
            return Err(errno_from_rc(rc));
        }
        Ok(())
    }
}

impl Drop for Srq {
    fn drop(&mut self) {
        // SAFETY: live SRQ, destroyed once; every QP using it holds an `Arc`
        // of it, so none is left, and every event for it was acknowledged.
        let rc = unsafe { ibv_destroy_srq(self.raw.as_ptr()) };
        if rc != 0 {
            tracing::warn!(error = %errno_from_rc(rc), "ibv_destroy_srq failed");
        }
    }
}

impl fmt::Debug for Srq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Srq").finish_non_exhaustive()
    }
}

/// What an SRQ's owner does when the SRQ ran low.
pub(crate) trait LimitHandler: Send + Sync {
    /// `IBV_EVENT_SRQ_LIMIT_REACHED` arrived (the limit is disarmed now).
    fn limit_reached(&self);
}

#[derive(Default)]
struct Registry {
    /// SRQ address → its handler.
    handlers: Vec<(usize, Weak<dyn LimitHandler>)>,
    /// Whether the reader thread runs.
    running: bool,
}

/// The async event reader of one context.
pub(crate) struct AsyncEvents {
    ctx: Arc<Context>,
    registry: Mutex<Registry>,
    /// Signalled when a handler goes ([`AsyncEvents::handler_gone`]): the
    /// reader, asleep on the event queue with no timeout, looks whether
    /// any is left.
    gone: OwnedFd,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl fmt::Debug for AsyncEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncEvents").field("device", &self.ctx.name()).finish_non_exhaustive()
    }
}

impl AsyncEvents {
    pub(crate) fn new(ctx: &Arc<Context>) -> io::Result<Arc<Self>> {
        Ok(Arc::new(Self { ctx: ctx.clone(), registry: Mutex::new(Registry::default()), gone: eventfd()? }))
    }

    /// A registered handler was dropped: the reader ends if it was the last.
    pub(crate) fn handler_gone(&self) {
        signal(self.gone.as_raw_fd());
    }

    /// Send `srq`'s limit events to `handler` (until it is dropped),
    /// starting the reader thread if it is not running.
    pub(crate) fn register(self: &Arc<Self>, srq: &Srq, handler: Weak<dyn LimitHandler>) -> io::Result<()> {
        let mut r = lock(&self.registry);
        r.handlers.retain(|(_, h)| h.strong_count() > 0);
        r.handlers.push((srq.as_ptr() as usize, handler));
        if !r.running {
            // SAFETY: open context.
            set_nonblocking(unsafe { (*self.ctx.as_ptr()).async_fd })?;
            let me = self.clone();
            thread::Builder::new().name("zerocast-rdma-async".into()).spawn(move || me.run())?;
            r.running = true;
        }
        Ok(())
    }

    /// The reader: ends once no handler is left. Asleep until an event
    /// comes or a handler goes.
    fn run(&self) {
        // SAFETY: open context (held by `self`).
        let fd = unsafe { (*self.ctx.as_ptr()).async_fd };
        loop {
            {
                // Drained before the look, so a handler that goes after
                // it signals a fresh wake-up.
                drain(self.gone.as_raw_fd());
                let mut r = lock(&self.registry);
                r.handlers.retain(|(_, h)| h.strong_count() > 0);
                if r.handlers.is_empty() {
                    r.running = false;
                    return;
                }
            }
            match poll_either(fd, self.gone.as_raw_fd(), -1) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "polling the async event queue failed");
                    thread::sleep(std::time::Duration::from_millis(100));
                    continue;
                }
            }
            let mut ev = MaybeUninit::<ibv_async_event>::zeroed();
            // SAFETY: open context; `ev` is a writable event; the fd is
            // non-blocking, so this returns at once when none is queued.
            if unsafe { ibv_get_async_event(self.ctx.as_ptr(), ev.as_mut_ptr()) } != 0 {
                continue;
            }
            let p = ev.as_mut_ptr();
            // SAFETY: filled in by the call; the type is read as its
            // underlying `u32`, so an event type this crate does not know is
            // no invalid enum value.
            let kind = unsafe { ptr::addr_of!((*p).event_type).cast::<u32>().read() };
            let handler = if kind == ibv_event_type::IBV_EVENT_SRQ_LIMIT_REACHED as u32 {
                // SAFETY: for an SRQ event the element is the SRQ.
                let srq = unsafe { (*p).element.srq } as usize;
                let r = lock(&self.registry);
                r.handlers.iter().find(|(s, _)| *s == srq).and_then(|(_, h)| h.upgrade())
            } else {
                tracing::debug!(kind, "RDMA async event");
                None
            };
            // Acknowledge before the handler can be the last reference to
            // its SRQ: destroying an SRQ waits for its events' acks.
            // SAFETY: an event from `ibv_get_async_event`, acknowledged once.
            unsafe { ibv_ack_async_event(p) };
            if let Some(h) = handler {
                h.limit_reached();
            }
        }
    }
}
