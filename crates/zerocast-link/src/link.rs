//! The application's side of a connection.

use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use zerocast_core::credit::CreditStats;
use zerocast_core::{ConnError, Endpoint, RecvError, SendError};
use zerocast_mem::{Buf, Pool, PoolError, Wait};

use crate::handoff::Handoff;
pub(crate) use crate::lend::Taken;
use crate::queue::PushError;
use crate::ready::{Notify, Readiness};
use crate::recv::RecvBuf;
use crate::shared::{Delivery, Outgoing, Shared, State};
use crate::source::{Awaited, Pumped};
use crate::Driver;

/// The application's handle to one connection. Cheap to clone; every clone
/// may send and receive from its own thread.
///
/// Dropping handles does not close anything: call [`Link::close`] (the
/// facade's `Sender` does so on drop) and [`Link::close_receiver`].
#[derive(Debug, Clone)]
pub struct Link {
    pub(crate) shared: Arc<Shared>,
    /// For reading the backend's [`crate::Source`] on the calling thread.
    reader: Driver,
}

/// A snapshot of a connection's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkStats {
    /// Credit machine counters.
    pub credits: CreditStats,
    /// Credits available for data now.
    pub available: u32,
    /// Credits of frames sent and not yet returned by the peer.
    pub outstanding: u32,
    /// Credits of received messages the application holds.
    pub held: u32,
    /// The peer's credit window, as its hello announced it.
    pub peer_window: u32,
    /// Bytes per credit the peer charges for a message (0: one credit per
    /// message; see [`zerocast_core::credit::cost`]).
    pub peer_credit_unit: u32,
    /// Messages delivered and not yet taken by `recv`.
    pub queued: usize,
    /// Data frames the sending thread wrote itself, with no hand-off to
    /// the engine (see [`crate::Wire`]).
    pub direct_sends: u64,
}

/// What a receiving thread's own pump of the source gave it.
enum OwnPump {
    /// The message the pump handed over ([`Handoff`]).
    HandedOver(Delivery),
    /// What the pump did, with nothing handed over (`None`: another thread
    /// holds the source).
    Pumped(Option<Pumped>),
}

impl Link {
    pub(crate) fn new(reader: Driver) -> Self {
        Self { shared: reader.shared.clone(), reader }
    }

    /// A send buffer for `len` bytes from the connection's pool.
    #[inline(always)]
    pub fn alloc(&self, len: usize, deadline: Option<Instant>) -> Result<Buf, PoolError> {
        if len > self.shared.max_message {
            return Err(PoolError::TooLarge { requested: len, max: self.shared.max_message });
        }
        let wait = match deadline {
            None => Wait::Forever,
            Some(d) => Wait::For(d.saturating_duration_since(Instant::now())),
        };
        self.shared.pool.alloc(len, wait)
    }

    /// The pool this connection's buffers come from.
    pub fn pool(&self) -> &Pool {
        &self.shared.pool
    }

    /// Largest message this connection can carry.
    pub fn max_message(&self) -> usize {
        self.shared.max_message
    }

    /// The peer's endpoint.
    pub fn peer(&self) -> &Endpoint {
        &self.shared.peer
    }

    /// Send `buf`, waiting for credit until `deadline` (`None`: forever).
    pub fn send(&self, buf: Buf, deadline: Option<Instant>) -> Result<(), SendError<Buf>> {
        self.send_inner(buf, Some(deadline), 0)
    }

    /// Send `buf` if credit is available now; [`SendError::Full`] otherwise.
    pub fn try_send(&self, buf: Buf) -> Result<(), SendError<Buf>> {
        self.send_inner(buf, None, 0)
    }

    /// Whether a send of a message of `len` bytes would find credit (or an
    /// error) now, for a task: `Ready` if the peer has room for it, or the
    /// connection is closed or failed (a send then says which); otherwise
    /// `Pending`, the task to be woken when credit comes or the connection
    /// ends. A task whose [`Link::try_send`] returned `Full` calls this,
    /// and tries again on `Ready`.
    pub fn poll_credit(&self, len: usize, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        let mut st = self.shared.lock();
        if !st.credits.is_blocked_for(len as u64) || st.failed.is_some() || st.local_closed {
            return std::task::Poll::Ready(());
        }
        self.shared.fold_releases(&mut st);
        st.task_waiters.add(cx.waker());
        std::task::Poll::Pending
    }

    /// [`Link::wait_closed`] for a task: `Ready(true)` on a clean end,
    /// `Ready(false)` on a failure; otherwise the task is woken when the
    /// state moves.
    pub fn poll_closed(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<bool> {
        let mut st = self.shared.lock();
        if st.failed.is_some() {
            return std::task::Poll::Ready(false);
        }
        if st.writer_done && st.goodbye_sent && st.peer_closed {
            return std::task::Poll::Ready(true);
        }
        st.task_waiters.add(cx.waker());
        std::task::Poll::Pending
    }

    /// Send `buf` as a data frame the backend carries in its own way, told
    /// by `tag` (see [`crate::Frame::tag`]), under the same credits and
    /// ordering as [`Link::send`]. The frame returns no credits: it may
    /// have no header on the wire.
    pub fn send_tagged(
        &self,
        buf: Buf,
        tag: std::num::NonZeroU32,
        deadline: Option<Instant>,
    ) -> Result<(), SendError<Buf>> {
        self.send_inner(buf, Some(deadline), tag.get())
    }

    /// `wait`: `None` for try_send, `Some(deadline)` to block.
    #[inline]
    fn send_inner(&self, buf: Buf, wait: Option<Option<Instant>>, tag: u32) -> Result<(), SendError<Buf>> {
        if buf.len() > self.shared.max_message {
            let max = self.shared.max_message as u64;
            let err = ConnError::TooLarge { len: buf.len() as u64, max };
            return Err(SendError::Rejected(buf, std::sync::Arc::new(err)));
        }
        let mut st = self.shared.lock();
        let mut polled = false;
        let mut source_done = false;
        let reservation = loop {
            if let Some(e) = &st.failed {
                return Err(SendError::Failed(buf, e.clone()));
            }
            if st.local_closed {
                return Err(SendError::Disconnected(buf));
            }
            match st.credits.reserve_for(buf.len() as u64) {
                Ok(r) => break r,
                Err(_) => match wait {
                    // No credit: read the backend's source once on this
                    // thread, as `try_recv` does, for credits that have
                    // arrived (and send completions). A `try_send` loop
                    // then polls for itself.
                    None if !polled && self.shared.source.0.get().is_some() => {
                        polled = true;
                        drop(st);
                        // What this thread queued goes out now, from here,
                        // rather than waiting for the engine's thread.
                        let _ = self.reader.write_queued_here();
                        let _ = self.reader.pump_as(None, false, Awaited::Nothing);
                        st = self.shared.lock();
                    }
                    None => {
                        let due = self.shared.fold_releases_here(&mut st);
                        drop(st);
                        if due {
                            self.shared.kick();
                        }
                        return Err(SendError::Full(buf));
                    }
                    Some(deadline) => {
                        let now = Instant::now();
                        if deadline.is_some_and(|d| now >= d) {
                            return Err(SendError::Timeout(buf));
                        }
                        st = self.await_credit(st, buf.len(), now, deadline, &mut source_done);
                    }
                },
            }
        };
        if tag == 0 {
            if let Some(w) = self.shared.direct_wire(&mut st, buf.len()) {
                self.shared.write_direct(st, w, buf, reservation);
                return Ok(());
            }
            if self.shared.may_stage(&st, buf.len()) {
                let next = self.shared.stage(st, buf, reservation);
                self.after_staging(next);
                return Ok(());
            }
        }
        if let Some(e) = st.failed.clone() {
            st.credits.cancel(reservation);
            return Err(SendError::Failed(buf, e));
        }
        if st.goodbye_sent {
            // Closed from another thread while this frame was being placed.
            st.credits.cancel(reservation);
            return Err(SendError::Disconnected(buf));
        }
        match self.shared.tx.push(Outgoing::Data(buf, reservation, tag)) {
            Ok(()) => {
                st.queued_data += 1;
                // The state lock goes first: the engine's writer takes it
                // to stamp the batch, and the wake may be a system call.
                drop(st);
                // A ring's worth queued: the engine has not kept up (its
                // thread is busy, or it is a task on the runtime this
                // sender runs on, which runs only once the sender yields).
                // Write the batch from here rather than grow the queue's
                // spill list, one lock per frame.
                if self.shared.tx.len() >= crate::queue::FAST && self.reader.write_queued_here() {
                    return Ok(());
                }
                self.shared.kick();
                Ok(())
            }
            Err(PushError::Full(Outgoing::Data(buf, r, _)))
            | Err(PushError::Closed(Outgoing::Data(buf, r, _))) => {
                // The writer is gone (or, impossibly, its queue is full):
                // give the credit back and the buffer to the caller.
                st.credits.cancel(r);
                match &st.failed {
                    Some(e) => Err(SendError::Failed(buf, e.clone())),
                    None => Err(SendError::Disconnected(buf)),
                }
            }
            Err(_) => unreachable!("only Data is sent here"),
        }
    }

    /// A frame was staged (the state lock is let go): tell the writer, or
    /// write a ring's worth here.
    #[inline]
    fn after_staging(&self, next: crate::staged::Next) {
        use crate::staged::Next;
        match next {
            Next::Nothing => {}
            Next::Write if self.reader.write_queued_here() => {}
            Next::Kick | Next::Write => self.shared.kick(),
        }
    }

    /// Wait for the credits of a message of `len` bytes until `deadline`,
    /// with `st` locked at `now`.
    ///
    /// A connection whose backend lets any thread read it (see
    /// [`crate::Source`]) is read on this thread, as a receive would: the
    /// credits the peer returns then wake this very thread, not the
    /// engine, which would have to wake this one. When
    /// another thread reads, or the source is over, wait to be told.
    fn await_credit<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        len: usize,
        now: Instant,
        deadline: Option<Instant>,
        source_done: &mut bool,
    ) -> MutexGuard<'a, State> {
        if *source_done || self.shared.source.0.get().is_none() {
            return self.shared.wait_cv(st, deadline.map(|d| d - now));
        }
        // The peer may be waiting for these to send what frees our credit.
        self.shared.fold_releases(&mut st);
        drop(st);
        // A local close, which nothing on the socket announces, rings this
        // thread's eventfd, which the source's wait watches (see
        // `interrupt`); without one, the wait goes in slices.
        let slice = if self.shared.interrupt_watched.load(Ordering::Relaxed) && crate::interrupt::available()
        {
            now + self.shared.wait_slice()
        } else {
            now + Duration::from_millis(100)
        };
        let until = deadline.map_or(slice, |d| d.min(slice));
        let pumped = self.reader.pump_as(Some(until), false, Awaited::Credit(len as u64));
        if pumped.is_none() {
            self.shared.unclaim();
        }
        let st = self.shared.lock();
        match pumped {
            Some(Pumped::Frames | Pumped::Idle) => st,
            Some(Pumped::Done) => {
                *source_done = true;
                st
            }
            // Another thread reads: its frames wake this one (and should
            // it stop reading first, the engine reads on: the claim ended
            // above).
            None if st.credits.is_blocked_for(len as u64) && st.failed.is_none() && !st.local_closed => {
                self.shared.wait_cv(st, Some(until.saturating_duration_since(Instant::now())))
            }
            None => st,
        }
    }

    /// Receive the next message, waiting until `deadline` (`None`: forever).
    ///
    /// After the peer closes, every buffered message is received first, then
    /// [`RecvError::Disconnected`] (or [`RecvError::Failed`] if the
    /// connection broke).
    #[inline]
    pub fn recv(&self, deadline: Option<Instant>) -> Result<RecvBuf, RecvError> {
        self.take(deadline).map(|t| self.handle(t))
    }

    /// [`Link::recv`] up to the handle: the message's buffer and immediate.
    #[inline(always)]
    pub(crate) fn take(&self, deadline: Option<Instant>) -> Result<Taken, RecvError> {
        // A message the last pump delivered (most of a stream's) is taken
        // here, inlined into the caller, which builds its handle in place.
        match self.shared.delivered.try_pop() {
            Some(d) => self.deliver(d),
            None => self.recv_waiting(deadline),
        }
    }

    /// [`Link::recv`] with nothing delivered yet.
    fn recv_waiting(&self, deadline: Option<Instant>) -> Result<Taken, RecvError> {
        // A connection registered for readiness is read by its engine,
        // unless the registration reads directly.
        if self.shared.source.0.get().is_some() && self.shared.ready.0.get().is_none_or(Readiness::direct) {
            if let Some(r) = self.recv_reading(deadline) {
                return r;
            }
        }
        if let Some(d) = self.shared.delivered.try_pop() {
            return self.deliver(d);
        }
        // About to wait for the peer: it gets every credit released so far.
        self.shared.fold_pending();
        match self.shared.delivered.pop(deadline) {
            Some(d) => self.deliver(d),
            None => Err(RecvError::Timeout),
        }
    }

    /// Receive by reading the backend's source on this thread (see
    /// [`crate::Source`]). `None`: another thread is reading it; wait for
    /// its deliveries instead.
    fn recv_reading(&self, deadline: Option<Instant>) -> Option<Result<Taken, RecvError>> {
        self.shared.claim();
        let mut busy = 0;
        loop {
            if let Some(d) = self.shared.delivered.try_pop() {
                return Some(self.deliver(d));
            }
            self.return_credits();
            let until = self.shared.recv_until(deadline);
            let pumped = match self.pump_handing_over(Some(until)) {
                OwnPump::HandedOver(d) => return Some(self.deliver(d)),
                OwnPump::Pumped(Some(p)) => p,
                // The engine has the source for a moment: its pumps never
                // wait. (Or had it: the lock came free as the flag went
                // down.)
                OwnPump::Pumped(None) if self.shared.bg_pumping.load(Ordering::SeqCst) || busy < 3 => {
                    busy += 1;
                    std::thread::yield_now();
                    continue;
                }
                // Another application thread is reading: its deliveries
                // come through the queue, and once it stops, the engine's.
                OwnPump::Pumped(None) => {
                    return Some(self.recv_behind_another(deadline));
                }
            };
            match pumped {
                Pumped::Frames => {}
                // The source is over; what it delivered (and the end) is
                // in the queue, which honours the deadline.
                Pumped::Done => return None,
                Pumped::Idle => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Some(match self.shared.delivered.try_pop() {
                            Some(d) => self.deliver(d),
                            None => Err(RecvError::Timeout),
                        });
                    }
                }
            }
        }
    }

    /// Wait for a message delivered by whoever reads the source: another
    /// application thread holds it now. While this thread waits, no claim
    /// holds (see [`Shared::claim`]): when the other thread stops reading,
    /// the engine reads on.
    #[cold]
    fn recv_behind_another(&self, deadline: Option<Instant>) -> Result<Taken, RecvError> {
        self.shared.queue_waiters.fetch_add(1, Ordering::SeqCst);
        self.shared.unclaim();
        self.shared.fold_pending();
        let d = self.shared.delivered.pop(deadline);
        self.shared.queue_waiters.fetch_sub(1, Ordering::SeqCst);
        match d {
            Some(d) => self.deliver(d),
            None => Err(RecvError::Timeout),
        }
    }

    /// Receive a message if one has arrived, without waiting. With nothing
    /// delivered yet, this thread reads the backend's source once itself
    /// (see [`crate::Source`]): a loop of `try_recv` busy-polls the socket
    /// or CQ on the calling thread.
    pub fn try_recv(&self) -> Result<RecvBuf, RecvError> {
        self.try_take().map(|t| self.handle(t))
    }

    /// [`Link::try_recv`] up to the handle.
    #[inline(always)]
    pub(crate) fn try_take(&self) -> Result<Taken, RecvError> {
        if !self.shared.delivered.is_empty() {
            if let Some(d) = self.shared.delivered.try_pop() {
                return self.deliver(d);
            }
        }
        if let Some(ready) = self.shared.ready.0.get() {
            return self.try_recv_ready(ready);
        }
        if self.shared.source.0.get().is_some() {
            self.shared.claim();
            match self.pump_handing_over(None) {
                OwnPump::HandedOver(d) => return self.deliver(d),
                OwnPump::Pumped(Some(Pumped::Frames | Pumped::Done)) => {
                    if let Some(d) = self.shared.delivered.try_pop() {
                        return self.deliver(d);
                    }
                }
                OwnPump::Pumped(Some(Pumped::Idle) | None) => {}
            }
        }
        // A polling receiver waits too, in its way.
        self.return_credits();
        Err(RecvError::Empty)
    }

    /// [`Link::try_recv`] on a connection registered for readiness, with
    /// nothing queued: the engine reads for it, so arm the registration
    /// (see [`crate::ready`]), unless a delivery came meanwhile. One that
    /// reads directly pumps the source first if its descriptor was seen
    /// readable ([`Link::source_readable`]). Not cold: every async
    /// receive comes here.
    fn try_recv_ready(&self, ready: &Readiness) -> Result<Taken, RecvError> {
        if ready.direct() && self.shared.source_hint.load(Ordering::Relaxed) {
            if let Some(d) = self.pump_directly() {
                return self.deliver(d);
            }
        }
        self.return_credits();
        match ready.arm_or_take(|| self.shared.delivered.is_empty(), || self.shared.delivered.try_pop()) {
            Some(d) => self.deliver(d),
            None => Err(RecvError::Empty),
        }
    }

    /// Pump the source for a registration that reads directly: the first
    /// message it hands over, or the queue's first after it. `None` leaves
    /// the source ready to announce its next news: frames with no message
    /// in them (credit, completions of sends) from a source that asked to
    /// be read again ([`crate::Driver::read_again`]) are followed by
    /// another pump, which makes it ready.
    fn pump_directly(&self) -> Option<Delivery> {
        self.shared.claim();
        loop {
            match self.pump_handing_over(None) {
                OwnPump::HandedOver(d) => return Some(d),
                OwnPump::Pumped(Some(Pumped::Frames | Pumped::Done)) => match self.shared.delivered.try_pop()
                {
                    None if self.shared.source_hint.load(Ordering::Acquire) => continue,
                    d => return d,
                },
                OwnPump::Pumped(Some(Pumped::Idle)) => return None,
                // Another thread pumps (the engine at its timer): the hint
                // stays, its deliveries are reported, and it wakes the
                // tasks when it lets go; if it let go already, pump again.
                OwnPump::Pumped(None) => {
                    if self.reader.await_direct_handback() {
                        return None;
                    }
                }
            }
        }
    }

    /// For a registration that reads directly, when a task waits for
    /// credit and no receive may be reading: pump the source if its
    /// descriptor was seen readable. Its messages are queued (and
    /// reported); its credits wake the credit waiters. `false` if there
    /// was nothing to do.
    pub fn pump_for_credit(&self) -> bool {
        let direct = self.shared.ready.0.get().is_some_and(Readiness::direct);
        if !direct || !self.shared.source_hint.load(Ordering::Relaxed) {
            return false;
        }
        self.shared.claim();
        // Held by another thread: as in `pump_directly`.
        while self.reader.pump_as(None, false, Awaited::Nothing).is_none() {
            if self.reader.await_direct_handback() {
                break;
            }
        }
        self.return_credits();
        true
    }

    /// The descriptor that turns readable when this connection's source
    /// has something new, if its backend has one (see
    /// [`Link::read_directly`]).
    pub fn source_fd(&self) -> Option<crate::SourceFd> {
        self.shared.source_fd.0.get().cloned()
    }

    /// The descriptor this connection's source shares with other
    /// connections' sources, if its backend has one (see
    /// [`crate::Driver::set_shared_source`] and [`Link::read_directly`]).
    pub fn shared_source(&self) -> Option<Arc<dyn crate::SharedSource>> {
        self.shared.shared_source.0.get().cloned()
    }

    /// Tell a registration that reads directly that the source's
    /// descriptor was seen readable: the next `try_recv` (or
    /// [`Link::pump_for_credit`]) reads it. Who watches the descriptor
    /// must call this on every readiness it takes, or arrivals wait for
    /// the engine's timer.
    pub fn source_readable(&self) {
        self.shared.source_hint.store(true, Ordering::Release);
    }

    /// Whether a message (or the end) is queued for the application.
    #[inline]
    pub fn has_queued(&self) -> bool {
        !self.shared.delivered.is_empty()
    }

    /// Whether the connection is registered to read directly now.
    pub fn reads_directly(&self) -> bool {
        self.shared.ready.0.get().is_some_and(Readiness::direct)
    }

    /// Register as [`Link::notify_on_ready`] does, except that the
    /// application reads the source itself: it watches
    /// [`Link::source_fd`], reports each readiness with
    /// [`Link::source_readable`], and `try_recv` then pumps the source on
    /// the calling thread. Or, for a source with a shared descriptor
    /// ([`Link::shared_source`]), it watches that one and calls
    /// [`crate::SharedSource::dispatch`] on each readiness, which raises
    /// this connection's hint and tells `notify` when its source has news.
    /// A `try_recv` that returns a message may leave more read but not
    /// yet handed over (a batch, see [`crate::Driver::batch_done`]), which
    /// no readiness of the descriptor announces: call it until
    /// [`RecvError::Empty`] (or [`Link::pump_for_credit`] once, which
    /// reads it all) before waiting on the descriptor again, as
    /// edge-triggered readiness asks anyway. The engine stops reading,
    /// but for its timer (heartbeats, a stalled frame); `notify` is told
    /// of what others deliver (the engine, a failure, the end). For an
    /// async runtime, whose reactor then wakes the receiving task itself.
    /// `false` if the connection was registered before or has no source
    /// descriptor of either kind.
    pub fn read_directly(&self, notify: Arc<dyn Notify>, token: usize) -> bool {
        if self.shared.source_fd.0.get().is_none() && self.shared.shared_source.0.get().is_none() {
            return false;
        }
        self.register(Readiness::new(notify, token, true))
    }

    /// A registration that reads directly goes back to being read by its
    /// engine, for good (for a thread that will not watch the descriptor).
    pub fn stop_reading_directly(&self) {
        if let Some(ready) = self.shared.ready.0.get() {
            ready.stop_direct();
            self.shared.unclaim();
        }
    }

    /// Register this connection for readiness: from now on `notify` is
    /// told `token` whenever a message or the end is queued for the
    /// application while the registration is armed, and the engine reads
    /// the connection (no receiving thread claims it). Armed at once: what
    /// is queued already is reported now. `false` if the connection was
    /// registered before (a connection has one registration for its life).
    pub fn notify_on_ready(&self, notify: Arc<dyn Notify>, token: usize) -> bool {
        self.register(Readiness::new(notify, token, false))
    }

    fn register(&self, readiness: Readiness) -> bool {
        if self.shared.ready.0.set(readiness).is_err() {
            return false;
        }
        let ready = self.shared.ready.0.get().expect("just set");
        // A receiving thread's pump may have left messages staged behind
        // its batch (see `Driver::batch_done`), which no readiness of the
        // descriptor would announce: they are read now, without waiting,
        // and reported below.
        if self.shared.batch_left.swap(false, Ordering::SeqCst) {
            let _ = self.reader.pump_as(None, false, Awaited::Nothing);
        }
        if ready.direct() {
            // The engine stops reading.
            self.shared.claim();
        } else {
            // The engine reads from now on, even if a receiving thread
            // had claimed the connection.
            self.shared.unclaim();
        }
        if ready.arm(|| self.shared.delivered.is_empty()) {
            ready.delivered_now();
        }
        true
    }

    /// Before this receiving thread waits (or polls again): fold the
    /// credits released so far and, if that makes a credit frame due,
    /// write it from here when the wire is free, rather than wake the
    /// engine's thread for it (which a spinning receiver may keep from a
    /// core). Inlined: an empty `try_recv` calls it on every spin.
    #[inline(always)]
    fn return_credits(&self) {
        if self.shared.has_released() {
            self.shared.return_credits_here();
        }
    }

    /// Pump the source on this thread ([`Driver::pump_as`]) with a
    /// [`Handoff`] open. Inlined, as the calls below it: a busy-polling
    /// `try_recv` runs it on every spin, and under emulation (a TCG guest)
    /// each call and return costs as much as a few dozen instructions.
    #[inline(always)]
    fn pump_handing_over(&self, until: Option<Instant>) -> OwnPump {
        let handoff = Handoff::open(&self.shared);
        let pumped = self.reader.pump_as(until, false, Awaited::Message);
        match handoff.take() {
            Some(d) => OwnPump::HandedOver(d),
            None => OwnPump::Pumped(pumped),
        }
    }

    #[inline(always)]
    fn deliver(&self, d: Delivery) -> Result<Taken, RecvError> {
        match d {
            Delivery::Msg(buf, imm) => Ok((buf, imm)),
            Delivery::End => Err(self.ended()),
        }
    }

    /// The handle of a message taken: it holds the connection.
    #[inline(always)]
    fn handle(&self, (buf, imm): Taken) -> RecvBuf {
        RecvBuf::with_immediate(buf, self.shared.clone(), imm)
    }

    /// `End` was taken: put it back for any other receiver, and say why.
    /// Put back as it first came, through the readiness registration: a
    /// receiving task that looked while this one held it found the queue
    /// empty and armed, and is waiting for this report.
    #[cold]
    pub(crate) fn ended(&self) -> RecvError {
        let _ = self.shared.push_delivery(Delivery::End);
        match &self.shared.lock().failed {
            Some(e) => RecvError::Failed(e.clone()),
            None => RecvError::Disconnected,
        }
    }

    /// Close the sending side. Messages already sent are still delivered;
    /// then the peer's receivers see a disconnect. Receiving goes on.
    pub fn close(&self) {
        self.shared.unclaim();
        let mut st = self.shared.lock();
        if !st.local_closed {
            st.local_closed = true;
            // The writer's wake below runs the engine task, which sets the
            // close timeout's timer.
            self.shared.note_let_go(&mut st);
            self.shared.wake_credit_waiters(&mut st);
            self.shared.wake_writer(&mut st);
            drop(st);
            // A thread waiting for credit in the source, which a close
            // does not otherwise reach on a silent socket.
            crate::interrupt::ring_credit_sleeper(&self.shared);
        }
    }

    /// The application will receive no more: messages still queued, and any
    /// that arrive later, are released at once so the peer keeps its credit.
    pub fn close_receiver(&self) {
        self.shared.unclaim();
        let let_go = {
            let mut st = self.shared.lock();
            st.receiver_gone = true;
            self.shared.note_let_go(&mut st)
        };
        if let_go {
            self.shared.wake_engine();
        }
        while let Some(d) = self.shared.delivered.try_pop() {
            match d {
                Delivery::Msg(buf, _) => drop(RecvBuf::new(buf, self.shared.clone())),
                Delivery::End => {
                    let _ = self.shared.push_delivery(Delivery::End);
                    break;
                }
            }
        }
    }

    /// Wait until the connection is over: both sides said goodbye and this
    /// side's writer has put everything out (on RDMA: its completion
    /// polled; on a stream: the peer ended its stream, so it has read
    /// everything), or the connection failed. Call it after [`Link::close`] before a process
    /// exits, so the peer sees a clean goodbye rather than a vanished peer.
    /// `true` for a clean end; `false` on a failure or at `deadline`.
    pub fn wait_closed(&self, deadline: Option<Instant>) -> bool {
        self.shared.unclaim();
        let mut st = self.shared.lock();
        loop {
            if st.failed.is_some() {
                return false;
            }
            if st.writer_done && st.goodbye_sent && st.peer_closed {
                return true;
            }
            // Each of the conditions above is set with `credit_cv`
            // notified (the failure and the peer's goodbye by
            // `Shared::end`, the writer's end by `Driver::writer_done`,
            // which follows our goodbye): no slices.
            let wait = match deadline {
                None => None,
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return false,
                },
            };
            st = self.shared.wait_cv(st, wait);
        }
    }

    /// Whether the connection is still open for sending.
    pub fn is_open(&self) -> bool {
        let st = self.shared.lock();
        !st.local_closed && st.failed.is_none()
    }

    /// Why the connection failed, if it did.
    pub fn error(&self) -> Option<ConnError> {
        self.shared.lock().failed.clone()
    }

    /// Counters. Frames that have arrived are read first (without waiting),
    /// so `queued` counts every message there is to take, whichever thread
    /// reads the connection.
    pub fn stats(&self) -> LinkStats {
        if self.shared.source.0.get().is_some() {
            let _ = self.reader.pump_as(None, false, Awaited::Nothing);
        }
        let mut st = self.shared.lock();
        self.shared.fold_releases(&mut st);
        LinkStats {
            credits: st.credits.stats(),
            available: st.credits.available(),
            outstanding: st.credits.outstanding(),
            held: st.credits.held(),
            peer_window: st.credits.peer_window(),
            peer_credit_unit: st.credits.peer_unit(),
            queued: self.shared.delivered.len(),
            direct_sends: st.direct_sends,
        }
    }
}
