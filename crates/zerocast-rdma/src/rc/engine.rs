//! The data path of an RC connection: posted buffers, the CQ, the send
//! queue and the reposts, driving a [`zerocast_link::Driver`] from an
//! engine task (see `task`).
//!
//! Application threads drive it too: a send posts its own work request
//! when the link allows (the send queue is a [`zerocast_link::Wire`], see
//! `send`), a receive polls the CQ itself (a [`zerocast_link::Source`], see
//! `poll`), and dropping a received message posts its buffer again at once
//! ([`zerocast_link::Repost`]). The engine task covers whatever no
//! application thread is doing.
//!
//! Ownership: every posted buffer sits in an in-flight table keyed by its
//! `wr_id` slot until its completion is polled. A receive is one scatter
//! entry, the whole pool buffer. A data frame is sent with immediate: the
//! payload alone, straight from its pool buffer (or inline), with the
//! credits it returns and its sequence number's low 16 bits in the 32-bit
//! immediate. It lands at offset 0 of the receive buffer and is handed to
//! the application without a copy, and a message of a power-of-two size
//! fills whole packets. Any other frame (credits, goodbye, rendezvous
//! request or finish) is a plain send of its 16-byte header, from a slot of
//! a registered slab, and its small payload: it lands header first.

use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::Wake;
use std::time::Duration;

use rdma_sys::{ibv_recv_wr, ibv_sge};
use zerocast_core::ConnError;
use zerocast_link::engine::{Engine, Waker};
use zerocast_link::{Driver, Interrupt, Repost, Reposted, Reposts};
use zerocast_mem::{Buf, Pool, Wait};

use crate::rc::budget::Reservation;
use crate::rc::comp_hub::Notify;
use crate::rc::one_sided;
use crate::rc::rendezvous::{self, Rendezvous};
use crate::rc::srq;
use crate::rc::write_imm::ImmOps;
use crate::rc::RcError;
use crate::verbs::{CompletionQueue, HeaderSlab, QueuePair};

pub(crate) const RECV_BIT: u64 = 1 << 63;
/// Completions taken per `ibv_poll_cq` call.
const POLL_BATCH: usize = 32;

#[derive(Debug)]
struct RecvTable {
    slots: Vec<Option<Buf>>,
    free: Vec<u32>,
    posted: usize,
    /// No more receives may be posted: the connection is shutting down.
    closing: bool,
}

mod completion;
mod poll;
mod send;
mod task;

use send::SendTable;

/// Everything a connection's threads share. Field order is drop order: the
/// QP goes first, so no buffer in the tables is still in the device's hands
/// when the tables drop.
#[derive(Debug)]
pub(crate) struct Io {
    qp: QueuePair,
    cq: Arc<CompletionQueue>,
    /// What the CQ's completion events reach, on the engine's channel (see
    /// `comp_hub`): its armed mark, the engine task and a sleeping thread.
    notify: Arc<Notify>,
    /// Large messages in both directions (see `rendezvous`).
    rendezvous: Rendezvous,
    /// Per send slot: the header of a frame that is not data (data frames
    /// carry theirs in the immediate).
    send_hdr: HeaderSlab,
    /// Per send slot: the descriptor a rendezvous frame carries.
    send_desc: HeaderSlab,
    recv: Mutex<RecvTable>,
    send: Mutex<SendTable>,
    /// The engine task waits for a completion (a send's or a rendezvous
    /// finish's): room for its backlog, or the end of its lingering. The
    /// handler of such a completion clears it and wakes the task.
    wake_on_completion: AtomicBool,
    /// The send queue's backlog is not empty: the engine polls for the
    /// completions that make room, whoever claims the CQ.
    backlogged: AtomicBool,
    /// The engine task pumps the CQ now: the source arms the CQ and takes
    /// its events even in busy-poll mode (where receiving threads spin and
    /// leave the channel alone).
    engine_pumping: AtomicBool,
    /// The connection's engine tasks, woken by [`Io::close`].
    tasks: Mutex<Vec<Waker>>,
    /// One-sided requests in flight (see `one_sided`).
    one_sided: one_sided::Table,
    /// WRITEs with immediate queued on the link (see `write_imm`).
    imm_ops: ImmOps,
    pool: Pool,
    buf_size: usize,
    busy_poll: bool,
    ignore_credits: bool,
    peer_disconnected: AtomicBool,
    /// Mirror of `RecvTable::closing`, readable without the lock.
    closing: AtomicBool,
    /// The pool woke the connection: a buffer came back that a receive or
    /// a rendezvous waits for (see [`Io::pool_waker`]).
    pool_poked: AtomicBool,
    pool_waker: std::task::Waker,
    /// Buffers the device may still own after the connection gave up on
    /// its flushes (a one-sided request's local buffer): kept here, so they
    /// go back to the pool only after the QP is destroyed.
    abandoned: Mutex<Vec<Buf>>,
    /// The listener's shared receive queue, when receives come from one
    /// (then `recv` stays empty). Its share is released after the QP.
    srq: Option<srq::Member>,
    /// The credit window this side announced.
    recv_window: usize,
    /// The receive memory reserved for `recv` (none with an SRQ). Last:
    /// returned after the QP and the tables.
    _reservation: Option<Reservation>,
}

/// Where a connection's receives come from.
#[derive(Debug)]
pub(crate) enum Receives {
    /// Its own receive queue, its memory reserved against the budget.
    Own(Reservation),
    /// A listener's shared receive queue.
    Shared(srq::Member),
}

impl Receives {
    /// The shared receive queue the QP is created on, if any.
    pub(crate) fn srq(&self) -> Option<Arc<crate::srq::Srq>> {
        match self {
            Receives::Shared(member) => Some(member.shared().srq().clone()),
            Receives::Own(_) => None,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Sizes of one connection's queues.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sizes {
    pub(crate) recv_window: usize,
    pub(crate) send_depth: usize,
    pub(crate) buf_size: usize,
}

impl Sizes {
    /// Receives posted per connection: the credit window, plus those kept
    /// for rendezvous finishes.
    pub(crate) fn posted_receives(&self) -> usize {
        self.recv_window + rendezvous::MAX_PENDING
    }
}

impl Io {
    /// Wrap a fresh QP (at least in INIT) and pre-post `recv_window`
    /// receives, plus [`rendezvous::MAX_PENDING`] for rendezvous finishes,
    /// before connecting.
    pub(crate) fn new(
        qp: QueuePair,
        (cq, notify): (Arc<CompletionQueue>, Arc<Notify>),
        pool: Pool,
        sizes: Sizes,
        busy_poll: bool,
        ignore_credits: bool,
        receives: Receives,
    ) -> Result<Arc<Self>, RcError> {
        let (srq, reservation) = match receives {
            Receives::Own(r) => (None, Some(r)),
            Receives::Shared(m) => (Some(m), None),
        };
        let reg = |e: zerocast_mem::RegisterError| RcError::Config(format!("registering header slots: {e}"));
        let posted = sizes.posted_receives();
        let send_hdr = HeaderSlab::new(qp.pd(), sizes.send_depth).map_err(reg)?;
        let send_desc = HeaderSlab::new(qp.pd(), sizes.send_depth).map_err(reg)?;
        let rendezvous = Rendezvous::new(HeaderSlab::new(qp.pd(), 1).map_err(reg)?, posted);
        let io = Arc::new_cyclic(|me| Self {
            qp,
            cq,
            notify,
            rendezvous,
            send_hdr,
            send_desc,
            recv: Mutex::new(RecvTable {
                slots: (0..posted).map(|_| None).collect(),
                free: (0..posted as u32).rev().collect(),
                posted: 0,
                closing: false,
            }),
            send: Mutex::new(SendTable::new(sizes.send_depth)),
            wake_on_completion: AtomicBool::new(false),
            backlogged: AtomicBool::new(false),
            engine_pumping: AtomicBool::new(false),
            tasks: Mutex::new(Vec::new()),
            one_sided: one_sided::Table::new(),
            imm_ops: ImmOps::new(sizes.send_depth),
            pool,
            buf_size: sizes.buf_size,
            busy_poll,
            ignore_credits,
            peer_disconnected: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            pool_poked: AtomicBool::new(false),
            pool_waker: std::task::Waker::from(Arc::new(PoolWake(me.clone()))),
            abandoned: Mutex::new(Vec::new()),
            srq,
            recv_window: sizes.recv_window,
            _reservation: reservation,
        });
        // With a shared receive queue, the listener posted this
        // connection's share when it admitted it.
        let own_receives = if io.srq.is_some() { 0 } else { posted };
        for _ in 0..own_receives {
            let buf = io.fresh_buf()?;
            let mut t = lock(&io.recv);
            io.post_recv_locked(&mut t, buf)?;
        }
        Ok(io)
    }

    pub(crate) fn qp(&self) -> &QueuePair {
        &self.qp
    }

    pub(crate) fn notify(&self) -> &Notify {
        &self.notify
    }

    /// The credit window this side announced.
    pub(crate) fn recv_window(&self) -> usize {
        self.recv_window
    }

    /// The size of this connection's receive buffers.
    pub(crate) fn buf_size(&self) -> usize {
        self.buf_size
    }

    pub(crate) fn one_sided(&self) -> &one_sided::Table {
        &self.one_sided
    }

    pub(crate) fn imm_ops(&self) -> &ImmOps {
        &self.imm_ops
    }

    pub(crate) fn rendezvous(&self) -> &Rendezvous {
        &self.rendezvous
    }

    pub(crate) fn pool(&self) -> &Pool {
        &self.pool
    }

    fn fresh_buf(&self) -> Result<Buf, RcError> {
        self.pool.alloc(self.buf_size, Wait::For(Duration::from_secs(5))).map_err(|source| RcError::Pool {
            what: "a receive",
            len: self.buf_size,
            source,
        })
    }

    /// Post `buf` as a receive, in a free slot. The table lock is held, so
    /// no poll sees the completion before the slot is filled.
    fn post_recv_locked(&self, t: &mut RecvTable, buf: Buf) -> Result<(), RcError> {
        if let Some(m) = &self.srq {
            return m.shared().repost(buf);
        }
        let Some(slot) = t.free.pop() else {
            return Err(RcError::Config("more receives posted than the window".into()));
        };
        let cap = u32::try_from(buf.capacity()).unwrap_or(u32::MAX);
        let mut sge = ibv_sge { addr: buf.addr(), length: cap, lkey: buf.keys().lkey };
        let mut wr = ibv_recv_wr {
            wr_id: RECV_BIT | u64::from(slot),
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        t.slots[slot as usize] = Some(buf);
        // SAFETY: the SGE covers a pool buffer registered in the QP's PD;
        // the buffer stays in the table until the completion is polled.
        match unsafe { self.qp.post_recv(&mut wr) } {
            Ok(()) => {
                t.posted += 1;
                Ok(())
            }
            Err(e) => {
                t.slots[slot as usize] = None;
                t.free.push(slot);
                Err(RcError::verbs("ibv_post_recv", e))
            }
        }
    }

    /// Repost a released buffer (or a fresh one) and return its credit,
    /// without waiting. A rendezvous message's buffer is of another size:
    /// it goes back to the pool, and a receive buffer takes its place.
    /// `false`: the pool had none to spare now (nothing was posted).
    fn try_repost(&self, driver: &Driver, buf: Option<Buf>) -> Result<bool, RcError> {
        let buf = match buf {
            Some(b) if b.capacity() == self.buf_size => b,
            _ => match self.pool.alloc_or_wake(self.buf_size, &self.pool_waker) {
                Ok(b) => b,
                Err(zerocast_mem::PoolError::Exhausted { .. }) => return Ok(false),
                Err(source) => return Err(RcError::Pool { what: "a receive", len: self.buf_size, source }),
            },
        };
        {
            let mut t = lock(&self.recv);
            if t.closing {
                return Ok(true);
            }
            if self.ignore_credits {
                // Test-only: return the credit without a receive behind it.
                drop(buf);
            } else {
                self.post_recv_locked(&mut t, buf)?;
            }
        }
        driver.on_reposted();
        Ok(true)
    }

    /// What to hand [`Pool::alloc_or_wake`] for a buffer this connection
    /// waits for: the pool wakes the engine task and a thread sleeping on
    /// the CQ (either tries again), so no timer looks.
    pub(crate) fn pool_waker(&self) -> &std::task::Waker {
        &self.pool_waker
    }

    /// The error of a receive that found no pool buffer for too long.
    fn pool_exhausted(&self) -> RcError {
        let source = self
            .pool
            .alloc(self.buf_size, Wait::No)
            .err()
            .unwrap_or(zerocast_mem::PoolError::Exhausted { cap: self.pool.config().max_bytes });
        RcError::Pool { what: "a receive", len: self.buf_size, source }
    }

    /// Stop posting receives and put the QP into the error state, so every
    /// posted work request completes (flushed) and its buffer comes back.
    pub(crate) fn close(&self) {
        // The flag first: whoever sees `RecvTable::closing` (the engine task,
        // deciding it is drained) also sees this, so a one-sided request
        // checking it under its table's lock is either refused or counted
        // as outstanding, never posted after the engine task stopped.
        self.closing.store(true, Ordering::Release);
        lock(&self.recv).closing = true;
        if let Some(id) = self.qp.cm() {
            // SAFETY: live id (held by the QP).
            unsafe { rdma_sys::rdma_disconnect(id.as_ptr()) };
        }
        if let Err(e) = self.qp.to_error() {
            tracing::debug!(error = %e, "moving the QP to the error state failed");
        }
        self.one_sided.wake();
        self.ring_sleeper();
        self.wake_tasks();
    }

    /// Keep `buf`, which the device may still own, until this connection's
    /// QP is destroyed (the field order of `Io`), and count it.
    pub(crate) fn keep_until_destroyed(&self, buf: Buf) {
        let mut kept = lock(&self.abandoned);
        kept.push(buf);
        tracing::warn!(
            buffers = kept.len(),
            "RC connection: a buffer the device may still own is held until the QP is destroyed"
        );
    }

    pub(crate) fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// The calling thread is about to sleep on `me` until the CQ's next
    /// completion event: the channel's reader, [`Io::close`] and the
    /// pool's wake ring it until the guard drops. `None`: look again
    /// instead of sleeping (an event came since the CQ was armed, the
    /// connection is closing, or the pool woke it since the last look).
    /// Registered before the look, under the lock the ringers take, so
    /// either the look sees what they did or they see the sleeper.
    pub(crate) fn sleeping(&self, me: &Interrupt) -> Option<Sleeping<'_>> {
        self.notify.set_sleeper(Some(me.clone()));
        let guard = Sleeping(self);
        if !self.notify.is_armed() || self.is_closing() || self.pool_poked.swap(false, Ordering::SeqCst) {
            return None;
        }
        Some(guard)
    }

    /// Wake the thread asleep until the next completion event, if one is.
    fn ring_sleeper(&self) {
        self.notify.ring_sleeper();
    }

    /// Wake the engine task at the next completion of a send or of a
    /// rendezvous finish (see [`Io::completed`]).
    pub(crate) fn wait_for_completion(&self) {
        self.wake_on_completion.store(true, Ordering::SeqCst);
    }

    /// A send or a rendezvous finish completed, its table updated under
    /// its lock: wake the engine task if it waits for that.
    pub(crate) fn completed(&self, driver: &Driver) {
        if self.wake_on_completion.load(Ordering::Relaxed)
            && self.wake_on_completion.swap(false, Ordering::SeqCst)
        {
            driver.wake();
        }
    }

    /// The send queue's backlog became non-empty (`true`) or empty: while
    /// it has frames, the engine polls for the completions that make room,
    /// even if a receiving thread claims the CQ and is elsewhere.
    pub(crate) fn set_backlogged(&self, backlogged: bool) {
        if self.backlogged.swap(backlogged, Ordering::SeqCst) != backlogged && backlogged {
            self.wake_tasks();
        }
    }

    /// Whether the send queue's backlog has frames.
    pub(crate) fn is_backlogged(&self) -> bool {
        self.backlogged.load(Ordering::SeqCst)
    }

    /// Wake `task` when the connection closes.
    pub(crate) fn wake_on_close(&self, task: Waker) {
        lock(&self.tasks).push(task);
    }

    /// Wake the connection's engine tasks: something they watch changed
    /// (the connection closes, or a one-sided request awaits its
    /// completion, which the engine then polls for, claim or not).
    pub(crate) fn wake_tasks(&self) {
        for task in lock(&self.tasks).iter() {
            task.wake();
        }
    }

    pub(crate) fn mark_peer_disconnected(&self) {
        self.peer_disconnected.store(true, Ordering::Release);
    }

    fn drained(&self) -> bool {
        let recv_done = {
            let r = lock(&self.recv);
            r.closing && r.posted == 0
        };
        // The send side is done once no signalled send is outstanding: the
        // unsignalled ones after the newest signalled send hold no payload
        // (the last send of a batch that leaves one in the ring is
        // signalled), and those that completed report nothing, so waiting
        // for them could last forever.
        recv_done
            && !lock(&self.send).ring.awaits_completion()
            && self.one_sided.outstanding() == 0
            && self.rendezvous.is_idle()
    }
}

/// A thread asleep until the next completion event (see [`Io::sleeping`]).
pub(crate) struct Sleeping<'a>(&'a Io);

impl Drop for Sleeping<'_> {
    fn drop(&mut self) {
        self.0.notify.set_sleeper(None);
    }
}

/// The pool's wake of a connection waiting for a buffer (see
/// [`Io::pool_waker`]).
struct PoolWake(Weak<Io>);

impl Wake for PoolWake {
    fn wake(self: Arc<Self>) {
        if let Some(io) = self.0.upgrade() {
            io.pool_poked.store(true, Ordering::SeqCst);
            io.ring_sleeper();
            io.wake_tasks();
        }
    }
}

/// Put an established connection on `engine`, and let application
/// threads post sends, poll the CQ and repost receives themselves (see
/// ARCHITECTURE.md, "caller-driven I/O").
pub(crate) fn register(engine: &Engine, io: &Arc<Io>, driver: Driver, reposts: Reposts, peer_window: u32) {
    // Its waits end at a completion (a frame, a credit, the goodbye's own
    // send) or at `Io::close`'s signal, which every failure and end of the
    // connection reaches through the engine task; a thread waiting for
    // credit also at a local close, which rings its interrupt.
    driver.install_waking_source(Box::new(poll::RcSource::new(io.clone())));
    driver.watches_interrupt();
    if let Some(hub) = io.notify().hub() {
        io.notify().signal_to(driver.signal());
        driver.set_shared_source(hub.shared_source());
    }
    driver.install_reposter(Box::new(Reposter(io.clone())));
    engine.register(Box::new(task::RcTask::new(io.clone(), driver, reposts, peer_window)));
}

/// Reposts a released receive buffer on the thread that released it, when
/// it is a receive buffer (a rendezvous message's buffer, of another size,
/// goes to the engine task, which gets a fresh one without waiting, or
/// tries again shortly).
struct Reposter(Arc<Io>);

impl Repost for Reposter {
    fn repost(&self, buf: Buf) -> Reposted {
        let io = &*self.0;
        if buf.capacity() != io.buf_size || io.ignore_credits {
            return Reposted::Later(buf);
        }
        let mut t = lock(&io.recv);
        if t.closing {
            return Reposted::Closing;
        }
        match io.post_recv_locked(&mut t, buf) {
            Ok(()) => Reposted::Posted,
            Err(e) => {
                drop(t);
                io.close();
                Reposted::Failed(ConnError::transport(e))
            }
        }
    }
}
