//! Completion queues and completion channels.
//!
//! A channel is one descriptor that announces completion events of the
//! CQs created on it. A UD socket's receive CQ has a channel of its own;
//! the RC connections of an engine share one (see `rc::comp_hub`), each CQ
//! carrying a context that tells the channel's reader whose it is.

use std::any::Any;
use std::fmt;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::BorrowedFd;
use std::os::raw::{c_int, c_void};
use std::ptr::{self, NonNull};
use std::sync::Arc;

use rdma_sys::{
    ibv_ack_cq_events, ibv_comp_channel, ibv_cq, ibv_create_comp_channel, ibv_create_cq,
    ibv_destroy_comp_channel, ibv_destroy_cq, ibv_get_cq_event, ibv_poll_cq, ibv_req_notify_cq, ibv_wc,
};

use crate::cm::{poll_readable, set_nonblocking};
use crate::device::Context;
use crate::error::errno_from_rc;

/// A completion channel: its descriptor is readable while an event of one
/// of its CQs waits to be taken. Non-blocking.
pub(crate) struct CompChannel {
    raw: NonNull<ibv_comp_channel>,
    _ctx: Arc<Context>,
}

// SAFETY: a completion channel is a descriptor and the verbs that read it
// are thread-safe; every CQ on it holds an `Arc`, so it outlives them.
unsafe impl Send for CompChannel {}
// SAFETY: as above.
unsafe impl Sync for CompChannel {}

impl CompChannel {
    pub(crate) fn new(ctx: &Arc<Context>) -> io::Result<Arc<Self>> {
        // SAFETY: open context.
        let raw = unsafe { ibv_create_comp_channel(ctx.as_ptr()) };
        let raw = NonNull::new(raw).ok_or_else(io::Error::last_os_error)?;
        let ch = Arc::new(Self { raw, _ctx: ctx.clone() });
        set_nonblocking(ch.raw_fd())?;
        Ok(ch)
    }

    fn raw_fd(&self) -> c_int {
        // SAFETY: live channel.
        unsafe { (*self.raw.as_ptr()).fd }
    }

    /// The descriptor to wait on for reading.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the channel's descriptor stays open as long as `self`.
        unsafe { BorrowedFd::borrow_raw(self.raw_fd()) }
    }

    /// Take one pending event, if there is one, and hand its CQ's context
    /// (the pointer given to [`CompletionQueue::new`]) to `f`; the event is
    /// acknowledged after `f` returns. While it runs, the CQ cannot be
    /// destroyed: `ibv_destroy_cq` waits for every event it reported to be
    /// acknowledged.
    pub(crate) fn take_event<R>(&self, f: impl FnOnce(*mut c_void) -> R) -> Option<R> {
        let mut cq: *mut ibv_cq = ptr::null_mut();
        let mut ctx = ptr::null_mut();
        // SAFETY: live channel, valid out-pointers; the fd is non-blocking.
        let rc = unsafe { ibv_get_cq_event(self.raw.as_ptr(), &mut cq, &mut ctx) };
        if rc != 0 {
            return None;
        }
        let r = f(ctx);
        // SAFETY: `cq` is the live CQ the event came from (its destruction
        // waits for this); one event taken, one acknowledged.
        unsafe { ibv_ack_cq_events(cq, 1) };
        Some(r)
    }
}

impl Drop for CompChannel {
    fn drop(&mut self) {
        // SAFETY: every CQ on the channel held an `Arc` of it, so all are
        // destroyed; destroyed once.
        let rc = unsafe { ibv_destroy_comp_channel(self.raw.as_ptr()) };
        if rc != 0 {
            tracing::warn!(error = %errno_from_rc(rc), "ibv_destroy_comp_channel failed");
        }
    }
}

impl fmt::Debug for CompChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompChannel").field("fd", &self.raw_fd()).finish()
    }
}

/// A completion queue, optionally on a completion channel.
pub(crate) struct CompletionQueue {
    raw: NonNull<ibv_cq>,
    depth: usize,
    /// Kept until the CQ is destroyed: its events name it.
    context: Option<Arc<dyn Any + Send + Sync>>,
    /// Destroyed after the CQ (field order).
    channel: Option<Arc<CompChannel>>,
    _ctx: Arc<Context>,
}

// SAFETY: CQ verbs are thread-safe; a connection's CQ is polled, armed and
// waited on by one thread at a time (whichever holds its completion source).
unsafe impl Send for CompletionQueue {}
// SAFETY: as above.
unsafe impl Sync for CompletionQueue {}

impl CompletionQueue {
    /// A CQ of at least `depth` entries. On `channel`, its completion
    /// events are announced there, carrying `context`'s address, which the
    /// CQ keeps alive until it is destroyed.
    pub(crate) fn new<C: Any + Send + Sync>(
        ctx: &Arc<Context>,
        depth: usize,
        channel: Option<Arc<CompChannel>>,
        context: Option<Arc<C>>,
    ) -> io::Result<Arc<Self>> {
        let cqe = c_int::try_from(depth).unwrap_or(c_int::MAX);
        let chp = channel.as_ref().map_or(ptr::null_mut(), |c| c.raw.as_ptr());
        let cq_context = context.as_ref().map_or(ptr::null_mut(), |c| Arc::as_ptr(c) as *mut c_void);
        // SAFETY: open context; `chp` is null or a live channel of it; the
        // context pointer outlives the CQ (held below).
        let raw = unsafe { ibv_create_cq(ctx.as_ptr(), cqe, cq_context, chp, 0) };
        let raw = NonNull::new(raw).ok_or_else(io::Error::last_os_error)?;
        let context = context.map(|c| c as Arc<dyn Any + Send + Sync>);
        Ok(Arc::new(Self { raw, depth, context, channel, _ctx: ctx.clone() }))
    }

    /// A CQ with a completion channel of its own, for [`Self::wait`].
    pub(crate) fn with_own_channel(ctx: &Arc<Context>, depth: usize) -> io::Result<Arc<Self>> {
        Self::new::<()>(ctx, depth, Some(CompChannel::new(ctx)?), None)
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_cq {
        self.raw.as_ptr()
    }

    /// Poll up to `wcs.len()` completions; returns how many were written.
    pub(crate) fn poll(&self, wcs: &mut [MaybeUninit<ibv_wc>]) -> io::Result<usize> {
        let n = c_int::try_from(wcs.len()).unwrap_or(c_int::MAX);
        // SAFETY: live CQ; `wcs` has room for `n` entries.
        let rc = unsafe { ibv_poll_cq(self.as_ptr(), n, wcs.as_mut_ptr().cast()) };
        if rc < 0 {
            return Err(errno_from_rc(rc));
        }
        Ok(rc as usize)
    }

    /// Ask for an event on the next completion (channel mode).
    pub(crate) fn arm(&self) -> io::Result<()> {
        // SAFETY: live CQ.
        let rc = unsafe { ibv_req_notify_cq(self.as_ptr(), 0) };
        if rc != 0 {
            return Err(errno_from_rc(rc));
        }
        Ok(())
    }

    /// The descriptor of this CQ's own channel ([`Self::with_own_channel`]).
    pub(crate) fn channel_fd(&self) -> Option<BorrowedFd<'_>> {
        self.channel.as_deref().map(CompChannel::fd)
    }

    /// Take and acknowledge every event pending on this CQ's own channel,
    /// without waiting.
    pub(crate) fn take_events(&self) {
        if let Some(ch) = &self.channel {
            while ch.take_event(|_| ()).is_some() {}
        }
    }

    /// Wait up to `ms` for a completion event on a channel of this CQ's
    /// own ([`Self::with_own_channel`]) and acknowledge it. Returns whether
    /// one came. Without a channel, yields the CPU once instead.
    pub(crate) fn wait(&self, ms: c_int) -> io::Result<bool> {
        let Some(ch) = &self.channel else {
            std::thread::yield_now();
            return Ok(false);
        };
        if !poll_readable(ch.raw_fd(), ms)? {
            return Ok(false);
        }
        Ok(ch.take_event(|_| ()).is_some())
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: every QP on this CQ holds an `Arc` of it, so none is left;
        // the destruction waits for every event it reported to be
        // acknowledged (each is, right after it is taken).
        let rc = unsafe { ibv_destroy_cq(self.raw.as_ptr()) };
        if rc != 0 {
            tracing::warn!(error = %errno_from_rc(rc), "ibv_destroy_cq failed");
            // The CQ lives on, and its events may still name its context.
            std::mem::forget(self.context.take());
            std::mem::forget(self.channel.take());
        }
        // Then the context its events carried, then the channel.
        self.context.take();
    }
}

impl fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("depth", &self.depth)
            .field("channel", &self.channel.is_some())
            .finish()
    }
}
