//! State shared by the application handles and the backend's threads.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender};
use zerocast_core::{ConnError, Credits, Endpoint};
use zerocast_mem::{Buf, Pool};

use crate::engine::Waker;
use crate::queue::Queue;
use crate::ready::Readiness;
use crate::repost::{Repost, Reposted};
use crate::source::SourceLock;
use crate::source::{SharedSource, SourceFd};
use crate::wire::WireLock;
use crate::{Driver, LinkSetup};

/// A work item for the backend's writer.
#[derive(Debug)]
pub(crate) enum Outgoing {
    /// A data frame whose credit is already reserved, with its backend tag
    /// (0: a plain send; see [`crate::Frame::tag`]).
    Data(Buf, zerocast_core::Reservation, u32),
    /// Credits are owed or state changed: look again.
    Wake,
}

/// A delivery to the application.
#[derive(Debug)]
pub(crate) enum Delivery {
    /// A message, with the immediate value it came with, if any.
    Msg(Buf, Option<u32>),
    /// No more messages will come. Re-queued by whoever takes it, so every
    /// receiver sees it.
    End,
}

/// [`Shared::scheduled`]: the writer's step is not due.
pub(crate) const IDLE: u8 = 0;
/// [`Shared::scheduled`]: the engine task is woken for its writer.
pub(crate) const DUE: u8 = 1;
/// [`Shared::scheduled`]: a lingering writer looks again soon.
pub(crate) const LINGERING: u8 = 2;

#[derive(Debug)]
pub(crate) struct State {
    pub(crate) credits: Credits,
    /// The application closed its sending side; a goodbye is due or sent.
    pub(crate) local_closed: bool,
    pub(crate) goodbye_sent: bool,
    /// The application will not receive any more: release arrivals at once.
    pub(crate) receiver_gone: bool,
    /// The peer said goodbye, or its stream ended.
    pub(crate) peer_closed: bool,
    /// The connection failed.
    pub(crate) failed: Option<ConnError>,
    /// Data items queued for the writer and not yet stamped. A sending
    /// thread writes its frame itself only when this is 0, so it never
    /// overtakes a frame sent before it.
    pub(crate) queued_data: u32,
    /// Threads waiting on `credit_cv`.
    pub(crate) cv_waiters: u32,
    /// Tasks waiting for what wakes `credit_cv` (see
    /// [`crate::Link::poll_credit`]), woken once each.
    pub(crate) task_waiters: crate::Wakers,
    /// Data frames the sending thread wrote itself.
    pub(crate) direct_sends: u64,
    /// Small data frames stamped by their senders for the writer, as bytes
    /// (see [`crate::staged`]).
    pub(crate) staged: crate::staged::Staged,
    /// A `Wake` is queued for the writer.
    pub(crate) wake_queued: bool,
    /// `End` was delivered to the application.
    pub(crate) ended: bool,
    /// The backend's writer is done: everything it was given, the goodbye
    /// included, is out (on RDMA, its completion polled).
    pub(crate) writer_done: bool,
    /// Heartbeats on: when the last frame came from the peer (or when the
    /// peer last stopped being starved of credit by us).
    pub(crate) last_rx: Instant,
    /// Heartbeats on: when the writer last took a batch.
    pub(crate) last_tx: Instant,
    /// When the last large frame was sent under load, on a wire that
    /// batches them, and the next sequence number expected from the peer
    /// then (see [`crate::wire::STREAM_GAP`]).
    pub(crate) last_large: Option<(Instant, u32)>,
    /// Once the application let go of the connection (closed both of its
    /// sides): when it did, or when the peer last returned credits since
    /// (it still takes what we sent). The goodbye exchange must end by
    /// then plus [`Shared::close_timeout`].
    pub(crate) close_clock: Option<Instant>,
}

impl State {
    /// The connection is over: it failed, or both goodbyes are out and in.
    pub(crate) fn is_over(&self) -> bool {
        self.failed.is_some() || (self.goodbye_sent && self.peer_closed)
    }
}

#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    /// Senders waiting for credit (or for the writer queue to drain).
    pub(crate) credit_cv: Condvar,
    /// Frames for the backend's writer.
    pub(crate) tx: Queue<Outgoing>,
    /// Messages for the application.
    pub(crate) delivered: Queue<Delivery>,
    pub(crate) reposts: Option<Sender<Option<Buf>>>,
    pub(crate) pool: Pool,
    pub(crate) peer: Endpoint,
    pub(crate) max_message: usize,
    pub(crate) max_batch: usize,
    pub(crate) max_payload: u64,
    /// This side's credit unit (see [`zerocast_core::credit::cost`]): what
    /// a received message gives back when it is released.
    pub(crate) credit_unit: u32,
    /// The connection's heartbeat interval, if heartbeats are on.
    pub(crate) heartbeat: Option<Duration>,
    /// See [`zerocast_core::LinkConfig::close_timeout`].
    pub(crate) close_timeout: Duration,
    /// [`State::close_clock`] is set: read without the state lock by the
    /// engine task's every run, which has no close timeout to look at
    /// before the application lets go.
    pub(crate) let_go: AtomicBool,
    /// The backend's write path, when sending threads may drive it.
    pub(crate) wire: Hook<WireLock>,
    /// The backend's read path, when receiving threads may drive it.
    pub(crate) source: Hook<SourceLock>,
    /// The backend's repost path, when releasing threads may drive it.
    pub(crate) reposter: Hook<Box<dyn Repost>>,
    /// The engine is pumping the source now.
    pub(crate) bg_pumping: AtomicBool,
    /// The pump running now is a receiving thread's, which takes one
    /// batch unless the connection is read directly
    /// ([`crate::Driver::batch_done`]); written and read by the thread
    /// that holds the source.
    pub(crate) batch_pump: AtomicBool,
    /// A receiving thread's pump stopped at a batch (and may have left
    /// frames behind, staged): the next registration reads first.
    pub(crate) batch_left: AtomicBool,
    /// The engine task driving this connection, when an engine does.
    pub(crate) waker: Hook<Waker>,
    /// The thread that holds the source and waits in it for credit, to be
    /// rung by a local close (see [`crate::interrupt`]).
    pub(crate) credit_sleeper: Mutex<Option<Arc<crate::interrupt::Sleeper>>>,
    /// Told of deliveries, when the application registered the connection
    /// for readiness (see [`crate::ready`]); it then claims the source
    /// only if the registration reads directly.
    pub(crate) ready: Hook<Readiness>,
    /// The descriptor that turns readable when the source has something
    /// new (see [`crate::Driver::set_source_fd`]).
    pub(crate) source_fd: Hook<SourceFd>,
    /// The descriptor this connection's source shares with others' (see
    /// [`crate::Driver::set_shared_source`]).
    pub(crate) shared_source: Hook<Arc<dyn SharedSource>>,
    /// The application saw [`Shared::source_fd`] readable and has not
    /// pumped since: the next pump reads without asking first.
    pub(crate) source_hint: AtomicBool,
    /// The writer's step and its wake-ups: [`IDLE`], [`DUE`] (the engine
    /// task is woken for its writer, whose step has not yet begun: further
    /// wake-ups for the writer are merged into that run, see
    /// [`Shared::kick`]; the step clears it), or [`LINGERING`] (a writer
    /// that lingers looks again soon: a kick then makes it `DUE` without a
    /// wake, and the writer sees that it was kicked).
    pub(crate) scheduled: AtomicU8,
    /// The engine's writer found the wire held by a sending thread and
    /// left it to that thread, which wakes the writer when it lets go (see
    /// [`Shared::hand_writer_back`]).
    pub(crate) writer_wanted: AtomicBool,
    /// An application thread receives on this connection and reads the
    /// source itself: the engine leaves the reading to it (see
    /// [`crate::Driver::reader_claimed`]).
    pub(crate) claimed: AtomicBool,
    /// The engine found the source held by an application thread, which
    /// wakes it when it lets go.
    pub(crate) handback: AtomicBool,
    /// An application thread reading directly found the source held by
    /// another thread, which wakes the connection's tasks when it lets go
    /// (see [`crate::Driver::await_direct_handback`]).
    pub(crate) direct_handback: AtomicBool,
    /// The batch an engine's writer, or a sending thread writing for it
    /// ([`crate::Driver::write_queued_here`]), fills; locked only by the
    /// thread holding the wire.
    pub(crate) spare_batch: Mutex<crate::driver::Batch>,
    /// Payloads up to this size are staged as bytes (see
    /// [`crate::staged`]); 0 for a wire that takes only frames. Set once,
    /// as the wire is attached.
    pub(crate) stage_max: AtomicUsize,
    /// The wire batches large frames ([`crate::Wire::batches_large_frames`]).
    /// Set once, as the wire is attached.
    pub(crate) large_batched: AtomicBool,
    /// Frames may be staged: raised by the sender that stages into an
    /// empty area, lowered by the writer that takes it, both under the
    /// state lock.
    pub(crate) staged_hint: AtomicBool,
    /// Receiving threads waiting for deliveries while another reads the
    /// source (see [`Shared::claim`]).
    pub(crate) queue_waiters: AtomicUsize,
    /// The source's waits are woken by everything that concerns them (see
    /// [`crate::Driver::install_waking_source`]).
    pub(crate) source_wakes: AtomicBool,
    /// A time no wait reaches: what a waking source's receive with no
    /// deadline waits until (see [`Shared::recv_until`]).
    pub(crate) never: Instant,
    /// The source's wait watches a credit waiter's interrupt (see
    /// [`crate::Driver::watches_interrupt`]).
    pub(crate) interrupt_watched: AtomicBool,
    /// Credits of received buffers released and not yet told to the credit
    /// machine (see [`Shared::release`]).
    released: AtomicU32,
    /// Releases folded into the credit machine at once, at most.
    release_batch: u32,
}

impl Shared {
    pub(crate) fn new(
        setup: LinkSetup,
        credits: Credits,
        max_message: usize,
    ) -> (Shared, Option<Receiver<Option<Buf>>>) {
        // Data items are bounded by reserved credits (at most the peer's
        // window); one Wake at a time; one End. So `try_send` never finds
        // these channels full.
        let tx = Queue::new(setup.peer_hello.window as usize + 2);
        let delivered = Queue::new(setup.config.recv_window as usize + 1);
        let (reposts, reposts_rx) = if setup.repost {
            let (t, r) = bounded(setup.config.recv_window as usize);
            (Some(t), Some(r))
        } else {
            (None, None)
        };
        let state = State {
            credits,
            local_closed: false,
            goodbye_sent: false,
            receiver_gone: false,
            peer_closed: false,
            failed: None,
            queued_data: 0,
            direct_sends: 0,
            staged: Default::default(),
            cv_waiters: 0,
            task_waiters: crate::Wakers::default(),
            wake_queued: false,
            ended: false,
            writer_done: false,
            last_rx: Instant::now(),
            last_tx: Instant::now(),
            last_large: None,
            close_clock: None,
        };
        let heartbeat =
            zerocast_core::negotiated_heartbeat(setup.config.heartbeat_ms(), setup.peer_hello.heartbeat_ms);
        let shared = Shared {
            state: Mutex::new(state),
            credit_cv: Condvar::new(),
            tx,
            delivered,
            reposts,
            pool: setup.pool,
            peer: setup.peer,
            max_message,
            max_batch: setup.config.max_batch,
            max_payload: setup.config.max_payload,
            credit_unit: setup.credit_unit,
            heartbeat,
            close_timeout: setup.config.close_timeout,
            let_go: AtomicBool::new(false),
            wire: Hook::default(),
            source: Hook::default(),
            reposter: Hook::default(),
            bg_pumping: AtomicBool::new(false),
            batch_pump: AtomicBool::new(false),
            batch_left: AtomicBool::new(false),
            waker: Hook::default(),
            ready: Hook::default(),
            source_fd: Hook::default(),
            shared_source: Hook::default(),
            source_hint: AtomicBool::new(true),
            credit_sleeper: Mutex::new(None),
            scheduled: AtomicU8::new(IDLE),
            writer_wanted: AtomicBool::new(false),
            claimed: AtomicBool::new(false),
            handback: AtomicBool::new(false),
            direct_handback: AtomicBool::new(false),
            source_wakes: AtomicBool::new(false),
            never: far_future(),
            interrupt_watched: AtomicBool::new(false),
            queue_waiters: AtomicUsize::new(0),
            spare_batch: Mutex::new(crate::driver::Batch::with_capacity(setup.config.max_batch + 2)),
            stage_max: AtomicUsize::new(0),
            large_batched: AtomicBool::new(false),
            staged_hint: AtomicBool::new(false),
            released: AtomicU32::new(0),
            release_batch: (setup.config.recv_window / 8).clamp(1, 32),
        };
        (shared, reposts_rx)
    }

    /// Wait on `credit_cv` (at most `timeout`), counted in `cv_waiters` so
    /// that hot paths notify only when somebody waits.
    pub(crate) fn wait_cv<'a>(
        &self,
        mut st: MutexGuard<'a, State>,
        timeout: Option<Duration>,
    ) -> MutexGuard<'a, State> {
        self.fold_releases(&mut st);
        st.cv_waiters += 1;
        let mut st = match timeout {
            None => self.credit_cv.wait(st).unwrap_or_else(|p| p.into_inner()),
            Some(t) => self.credit_cv.wait_timeout(st, t).unwrap_or_else(|p| p.into_inner()).0,
        };
        st.cv_waiters -= 1;
        st
    }

    /// Credit came, or the connection's state moved towards its end: wake
    /// the threads on `credit_cv` and the tasks waiting for the same.
    pub(crate) fn wake_credit_waiters(&self, st: &mut State) {
        if st.cv_waiters > 0 {
            self.credit_cv.notify_all();
        }
        // Looked at first: credit comes with most frames, waiters rarely.
        if !st.task_waiters.is_empty() {
            st.task_waiters.wake_all();
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock leaves counters that are still
        // consistent (every update is a single step), so poisoning is ignored.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queue a wake-up for the writer unless one is already queued.
    pub(crate) fn wake_writer(&self, st: &mut State) {
        if self.queue_writer_wake(st) {
            self.kick();
        }
    }

    /// [`Shared::wake_writer`] for a caller that lets go of the state lock
    /// before it wakes anyone: `true` if it must [`Shared::kick`] then.
    pub(crate) fn queue_writer_wake(&self, st: &mut State) -> bool {
        if st.wake_queued {
            return false;
        }
        st.wake_queued = true;
        let _ = self.tx.push(Outgoing::Wake);
        true
    }

    /// Until when a receiving thread's pump may wait: `deadline`, or the
    /// end of a slice for a source that is not woken by everything that
    /// concerns it (see [`crate::Driver::install_source`]). A waking
    /// source's receive with no deadline reads no clock: the clock may be
    /// a system call (an emulated guest's), and it would be read once per
    /// message.
    #[inline]
    pub(crate) fn recv_until(&self, deadline: Option<Instant>) -> Instant {
        if self.source_wakes.load(Ordering::Relaxed) {
            return deadline.unwrap_or(self.never);
        }
        let slice = Instant::now() + self.wait_slice();
        deadline.map_or(slice, |d| d.min(slice))
    }

    /// How long a thread waits in the source's pump before it looks around
    /// (see [`crate::Driver::install_source`]).
    pub(crate) fn wait_slice(&self) -> Duration {
        if self.source_wakes.load(Ordering::Relaxed) {
            // As good as no limit: an hour.
            Duration::from_secs(3600)
        } else {
            Duration::from_millis(100)
        }
    }

    /// Wake the engine task that drives this connection for its writer
    /// (frames queued, a credit frame due), if an engine does and its
    /// writer's step is not due already: until that step begins, it
    /// takes whatever is queued meanwhile.
    #[inline]
    pub(crate) fn kick(&self) {
        if let Some(waker) = self.waker.0.get() {
            if self.scheduled.swap(DUE, Ordering::SeqCst) == IDLE {
                waker.wake();
            }
        }
    }

    /// Start the close timeout once the application closed both sides of
    /// the connection: `true` if it started now (the engine task must then
    /// look, to set its timer).
    pub(crate) fn note_let_go(&self, st: &mut State) -> bool {
        let start = st.local_closed && st.receiver_gone && st.close_clock.is_none();
        if start {
            st.close_clock = Some(Instant::now());
            self.let_go.store(true, Ordering::Release);
        }
        start
    }

    /// Wake the engine task that drives this connection for anything but
    /// its writer: to read (the source came free), to repost, to look at
    /// completions. Never merged into a pending writer's wake: the task
    /// may be past the point where it looks at those in the run that
    /// wake is for, and the writer's step comes after it (it would clear
    /// the flag and this wake would be lost). The engine merges wake-ups
    /// that come before the task runs.
    pub(crate) fn wake_engine(&self) {
        if let Some(waker) = self.waker.0.get() {
            waker.wake();
        }
    }

    /// An application thread receives here: the engine stops reading.
    /// Not while another receiving thread waits for deliveries behind the
    /// one that reads: the engine must read for it once that one stops.
    /// (Raised, then the waiters read; a waiter counts itself, then lowers
    /// it: with both orders sequentially consistent, one of them sees the
    /// other.) Nor on a connection its engine reads for a readiness
    /// registration, checked again after the claim, as a registration
    /// that stops reading directly lowers the flag after it changes mode.
    #[inline(always)]
    pub(crate) fn claim(&self) {
        let mine = || self.ready.0.get().is_none_or(Readiness::direct);
        if !self.claimed.load(Ordering::Relaxed) && mine() {
            self.claimed.store(true, Ordering::SeqCst);
            if self.queue_waiters.load(Ordering::SeqCst) > 0 || !mine() {
                self.unclaim();
            }
        }
    }

    /// The application stops receiving for now (it closes, or waits for
    /// the connection to end): the engine reads again.
    pub(crate) fn unclaim(&self) {
        if self.claimed.swap(false, Ordering::SeqCst) {
            self.wake_engine();
        }
    }

    /// The credits a received message of `len` bytes holds until it is
    /// released.
    #[inline]
    pub(crate) fn cost_of(&self, len: usize) -> u32 {
        zerocast_core::credit::cost(len as u64, self.credit_unit)
    }

    /// A received buffer that held `cost` credits was released: repost it
    /// (a reposting backend, whose buffers hold one credit each) or return
    /// it to the pool, and return its credits.
    pub(crate) fn give_back(self: &Arc<Self>, buf: Buf, cost: u32) {
        let Some(tx) = &self.reposts else {
            drop(buf);
            self.release(cost);
            return;
        };
        let buf = match self.reposter.0.get() {
            None => buf,
            Some(hook) => match hook.repost(buf) {
                Reposted::Later(buf) => buf,
                Reposted::Posted => return self.release(1),
                Reposted::Closing => return,
                Reposted::Failed(e) => return self.fail(&mut self.lock(), e),
            },
        };
        // The backend's engine task, woken here, posts it and returns
        // the credit. If the backend is gone, the
        // buffer simply returns to the pool.
        let _ = tx.try_send(Some(buf));
        self.wake_engine();
    }

    /// A received buffer was released (or reposted): return its `n`
    /// credits (one, unless this side weighs them).
    ///
    /// Counted in `released`, and folded into the credit machine (under the
    /// state lock) a batch at a time: when [`Shared::release_batch`] credits are
    /// pending, or nothing more is queued for the application, which then
    /// may wait for the peer. Every thread that stamps frames or waits
    /// folds first ([`Shared::fold_releases`]), so a pending credit never
    /// holds up the peer while this side waits, and rides on the next frame.
    ///
    /// A credit frame that the fold makes due is written by the releasing
    /// thread itself when the wire is free: a system call on this thread
    /// rather than a wake-up of the engine's, which a busy-polling
    /// receiver may keep from a core.
    pub(crate) fn release(self: &Arc<Self>, n: u32) {
        let pending = self.released.fetch_add(n, Ordering::AcqRel) + n;
        if pending >= self.release_batch || self.delivered.is_empty() {
            self.return_credits_here();
        }
    }

    /// Fold the pending releases; a credit frame that makes due is
    /// written from the calling thread when the wire is free, else the
    /// engine is woken for it.
    #[inline(never)]
    pub(crate) fn return_credits_here(self: &Arc<Self>) {
        let due = self.fold_releases_here(&mut self.lock());
        if due && !Driver::reading(self.clone()).write_queued_here() {
            self.kick();
        }
    }

    /// Tell the credit machine of the pending releases, and wake the writer
    /// if a credit frame is now due.
    pub(crate) fn fold_releases(&self, st: &mut State) {
        if self.fold_releases_here(st) {
            self.kick();
        }
    }

    /// [`Shared::fold_releases`], taking the lock only if any is pending.
    /// Inlined: an empty `try_recv` calls it on every spin.
    #[inline(always)]
    pub(crate) fn fold_pending(&self) {
        // The lock is let go before the kick: the wake may be a system
        // call, and the writer takes the lock to stamp its batch.
        if self.released.load(Ordering::Acquire) > 0 && self.fold_releases_here(&mut self.lock()) {
            self.kick();
        }
    }

    /// Whether released buffers wait to be folded into the credits.
    #[inline(always)]
    pub(crate) fn has_released(&self) -> bool {
        self.released.load(Ordering::Acquire) > 0
    }

    /// [`Shared::fold_releases`] for a thread that writes the credit frame
    /// it makes due itself: the writer's `Wake` is queued but the engine
    /// is not woken. `true`: a `Wake` was queued, and the caller must
    /// write it or wake the engine.
    pub(crate) fn fold_releases_here(&self, st: &mut State) -> bool {
        if self.released.load(Ordering::Acquire) == 0 {
            return false;
        }
        let n = self.released.swap(0, Ordering::AcqRel);
        if st.credits.release_many(n).unwrap_or(false) && !st.wake_queued {
            st.wake_queued = true;
            let _ = self.tx.push(Outgoing::Wake);
            return true;
        }
        false
    }

    /// The connection failed (the first error is kept): wake everyone.
    pub(crate) fn fail(&self, st: &mut State, err: ConnError) {
        if st.failed.is_none() {
            tracing::debug!(peer = %self.peer, error = %err, "connection failed");
            st.failed = Some(err);
        }
        self.end(st);
    }

    /// Queue `d` for the application, and tell a readiness registration.
    #[inline(always)]
    pub(crate) fn push_delivery(&self, d: Delivery) -> Result<(), Delivery> {
        self.push_delivery_woken(d, true)
    }

    /// [`Shared::push_delivery`]; without `wake`, a receiver asleep on the
    /// queue sleeps on until a `delivered.wake` (see [`crate::FrameBatch`]).
    #[inline(always)]
    pub(crate) fn push_delivery_woken(&self, d: Delivery, wake: bool) -> Result<(), Delivery> {
        let pushed = if wake { self.delivered.push(d) } else { self.delivered.push_unwoken(d) };
        pushed.map_err(|e| match e {
            crate::queue::PushError::Full(d) | crate::queue::PushError::Closed(d) => d,
        })?;
        if let Some(r) = self.ready.0.get() {
            r.delivered();
        }
        Ok(())
    }

    /// Mark the stream ended for the application and wake everyone.
    pub(crate) fn end(&self, st: &mut State) {
        if !st.ended {
            st.ended = true;
            let _ = self.push_delivery(Delivery::End);
        }
        self.wake_credit_waiters(st);
        self.wake_writer(st);
    }
}

/// A backend hook, installed at most once.
pub(crate) struct Hook<T>(pub(crate) OnceLock<T>);

/// About a century from now: later than any deadline a wait is given.
fn far_future() -> Instant {
    let now = Instant::now();
    now.checked_add(Duration::from_secs(100 * 365 * 24 * 3600)).unwrap_or(now + Duration::from_secs(3600))
}

impl<T> Default for Hook<T> {
    fn default() -> Self {
        Self(OnceLock::new())
    }
}

impl<T> std::fmt::Debug for Hook<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() { "Hook(installed)" } else { "Hook(none)" })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Instant;

    use zerocast_core::{ConnError, CreditError, Endpoint, FrameKind, Header, LinkConfig, RecvError};
    use zerocast_mem::{Pool, PoolConfig, Wait};

    use crate::{hello_for, Driver, Link, LinkSetup};

    /// A stream link of `window` receive buffers, driven by hand: the
    /// test is its backend.
    pub(crate) fn open(window: u32) -> (Link, Driver) {
        let config = LinkConfig::default().with_recv_window(window);
        let setup = LinkSetup {
            config,
            peer_hello: hello_for(&config, 4096),
            pool: Pool::unregistered(PoolConfig::default()).unwrap(),
            peer: Endpoint::parse("tcp://127.0.0.1:1").unwrap(),
            repost: false,
            credit_unit: 0,
        };
        let (link, driver, _) = crate::new(setup).unwrap();
        (link, driver)
    }

    fn arrive(link: &Link, driver: &Driver, seqs: std::ops::Range<u32>) {
        for seq in seqs {
            let buf = link.pool().alloc(10, Wait::No).unwrap();
            driver.on_frame(Header::new(FrameKind::Data, 0, seq, 10), Some(buf)).unwrap();
        }
    }

    /// (owed to the peer, held by the application) in the credit machine.
    fn credits(driver: &Driver) -> (u32, u32) {
        let st = driver.shared.lock();
        (st.credits.owed(), st.credits.held())
    }

    #[test]
    fn releases_fold_a_batch_at_a_time_while_messages_are_queued() {
        // A window of 64: batches of 8.
        let (link, driver) = open(64);
        arrive(&link, &driver, 0..20);
        let mut taken: Vec<_> = (0..9).map(|_| link.recv(None).unwrap()).collect();
        let last = taken.pop().unwrap();
        let eighth = taken.pop().unwrap();
        drop(taken);
        assert_eq!(credits(&driver), (0, 20), "seven pending while eleven are queued");
        drop(eighth);
        assert_eq!(credits(&driver), (8, 12), "the eighth folds the batch");
        drop(last);
        assert_eq!(credits(&driver), (8, 12));
        // Once nothing is queued, each release folds at once.
        let rest: Vec<_> = (0..11).map(|_| link.recv(None).unwrap()).collect();
        drop(rest);
        assert_eq!(credits(&driver), (20, 0));
    }

    #[test]
    fn a_receiver_about_to_wait_returns_every_pending_credit() {
        let (link, driver) = open(64);
        arrive(&link, &driver, 0..3);
        drop(link.recv(None).unwrap());
        let (b, c) = (link.recv(None).unwrap(), link.recv(None).unwrap());
        assert_eq!(credits(&driver), (0, 3), "released while two were queued: pending");
        assert!(matches!(link.recv(Some(Instant::now())), Err(RecvError::Timeout)));
        assert_eq!(credits(&driver), (1, 2), "folded before the receive waited");
        drop(b);
        assert_eq!(credits(&driver), (2, 1), "nothing queued: folded at once");
        arrive(&link, &driver, 3..5);
        drop(c);
        assert_eq!(credits(&driver), (2, 3), "pending again");
        assert!(matches!(link.stats(), s if s.held == 2), "stats fold too");
        assert_eq!(credits(&driver), (3, 2));
    }

    #[test]
    fn a_short_header_takes_the_next_sequence_number_and_is_checked() {
        let (link, driver) = open(64);
        arrive(&link, &driver, 0..2);
        let buf = |n: usize| {
            let mut b = link.pool().alloc(n, Wait::No).unwrap();
            b.try_set_len(n).unwrap();
            b
        };
        driver.on_short(0, 2, buf(7)).unwrap();
        let got: Vec<_> = (0..3).map(|_| link.recv(None).unwrap().len()).collect();
        assert_eq!(got, [10, 10, 7], "in order, with the payload's length");
        assert_eq!(driver.shared.lock().credits.next_rx_seq(), 3);
        // Credits returned with it are counted: none are outstanding here,
        // so returning one breaks the protocol.
        let err = driver.on_short(1, 3, buf(1)).unwrap_err();
        assert!(matches!(err, ConnError::Credit(CreditError::Duplicated { returned: 1, .. })), "{err:?}");
        let (link, driver) = open(64);
        arrive(&link, &driver, 0..1);
        let err = driver.on_short(0, 5, buf(1)).unwrap_err();
        assert!(matches!(err, ConnError::Credit(CreditError::Sequence { expected: 1, got: 5 })), "{err:?}");
        assert!(link.recv(None).is_ok(), "the frame before it was delivered");
        assert!(link.recv(None).is_err(), "the connection failed");
    }
}
