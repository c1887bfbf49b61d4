//! The backend's side of a connection: what to write, what was read.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use zerocast_core::{ConnError, FrameKind, Header, HEARTBEAT_MISSES};
use zerocast_mem::{Buf, Pool};

use crate::handoff;
use crate::shared::{Delivery, Outgoing, Shared, State};

/// One frame for the writer: a stamped header and, for data, its payload.
///
/// Dropping the payload returns it to the pool: a stream backend drops it
/// once written; an RDMA backend keeps it in its in-flight table until the
/// send completes.
#[derive(Debug)]
pub struct Frame {
    /// The header to put in front of the payload.
    pub header: Header,
    /// The payload (data frames only).
    pub payload: Option<Buf>,
    /// 0 for a plain frame. Otherwise the tag the application gave
    /// [`crate::Link::send_tagged`]: the backend carries this data frame in
    /// its own way (an RDMA WRITE with immediate, say). The header then
    /// returns no credits.
    pub tag: u32,
}

/// What a writer writes at once: the staged small frames' bytes (see
/// [`crate::staged`]), then frames.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    pub(crate) bytes: Vec<u8>,
    pub(crate) frames: Vec<Frame>,
}

impl Batch {
    pub(crate) fn with_capacity(frames: usize) -> Self {
        Self { bytes: Vec::new(), frames: Vec::with_capacity(frames) }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.bytes.is_empty() && self.frames.is_empty()
    }

    pub(crate) fn clear(&mut self) {
        self.bytes.clear();
        self.frames.clear();
    }
}

/// What [`Driver::fill_from`] made of the queue.
pub(crate) enum Fill {
    /// Frames to write.
    Ready,
    /// Nothing to write this time; wait again.
    Empty,
    /// The writer should stop (the batch is empty).
    Stop,
}

/// The handle a backend's I/O threads use. Clone it for each thread.
#[derive(Clone)]
pub struct Driver {
    pub(crate) shared: Arc<Shared>,
    /// The writer's end of the queue, held only for its drop; `None` in
    /// the copy a [`crate::Link`] keeps for reading a [`crate::Source`],
    /// which never writes.
    _outgoing: Option<Arc<WriterEnd>>,
}

/// The consuming end of the writer's queue, shared by a backend's driver
/// clones. When the last goes, the queue refuses new frames, so a sender
/// learns that the writer is gone rather than queueing into the void.
struct WriterEnd(Arc<Shared>);

impl Drop for WriterEnd {
    fn drop(&mut self) {
        self.0.tx.close();
    }
}

impl fmt::Debug for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Driver").field("peer", &self.shared.peer).finish_non_exhaustive()
    }
}

impl Driver {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { _outgoing: Some(Arc::new(WriterEnd(shared.clone()))), shared }
    }

    /// A driver for reading only (see [`crate::Source`]).
    pub(crate) fn reader(&self) -> Self {
        Self::reading(self.shared.clone())
    }

    /// A driver that reads and may write what is queued on the calling
    /// thread, but does not own the queue's end.
    pub(crate) fn reading(shared: Arc<Shared>) -> Self {
        Self { shared, _outgoing: None }
    }

    /// Take what is staged into `batch`, then stamp `first` and, with
    /// `drain`, whatever else is queued into it, with the credit frame,
    /// goodbye or heartbeat that is due.
    pub(crate) fn fill_from(&self, first: Option<Outgoing>, batch: &mut Batch, drain: bool) -> Fill {
        let mut st = self.shared.lock();
        // Staged frames were stamped before anything stamped here.
        crate::staged::take(&self.shared, &mut st, &mut batch.bytes);
        self.shared.fold_releases(&mut st);
        let starved = st.credits.peer_may_be_starved();
        if let Some(first) = first {
            let frames = &mut batch.frames;
            self.stamp(&mut st, first, frames);
            while frames.len() < self.shared.max_batch && drain {
                match self.shared.tx.try_pop() {
                    Some(item) => self.stamp(&mut st, item, frames),
                    None => break,
                }
            }
        }
        if st.failed.is_some() {
            batch.clear();
            return Fill::Stop;
        }
        // After both goodbyes nothing is sent: the peer will not send
        // again, so returning its credits would only leave a frame
        // unacknowledged behind a peer that is going away.
        // Staged frames took their credits when they were stamped, so they
        // do not count here: a credit frame due since goes out behind them.
        if batch.frames.is_empty() && !(st.goodbye_sent && st.peer_closed) {
            if let Some(stamp) = st.credits.poll_credit_frame() {
                batch.frames.push(Frame {
                    header: stamp.header(FrameKind::Credit, 0),
                    payload: None,
                    tag: 0,
                });
            }
        }
        if st.local_closed && !st.goodbye_sent && st.queued_data == 0 {
            if let Some(stamp) = st.credits.poll_control_frame() {
                st.goodbye_sent = true;
                batch.frames.push(Frame {
                    header: stamp.header(FrameKind::Control, 0),
                    payload: None,
                    tag: 0,
                });
            }
        }
        if let Some(hb) = self.shared.heartbeat {
            let now = Instant::now();
            // Credits this batch returns may end the peer's starvation:
            // its silence counts from now.
            if starved {
                st.last_rx = st.last_rx.max(now);
            }
            if let Err(e) = Self::check_silence(&mut st, now, hb) {
                self.shared.fail(&mut st, e);
                batch.clear();
                return Fill::Stop;
            }
            if batch.is_empty() && now >= st.last_tx + hb {
                if let Some(stamp) = st.credits.poll_heartbeat_frame() {
                    let header = stamp.header(FrameKind::Credit, 0);
                    batch.frames.push(Frame { header, payload: None, tag: 0 });
                }
                // Sent, or blocked: the peer holds our credits, so it
                // does not count our silence; try again next interval.
                st.last_tx = now;
            }
            if !batch.is_empty() {
                st.last_tx = now;
            }
        }
        if !batch.is_empty() {
            return Fill::Ready;
        }
        if st.goodbye_sent && st.peer_closed {
            return Fill::Stop;
        }
        Fill::Empty
    }

    /// The heartbeat check: `Err` when the peer was silent for
    /// [`HEARTBEAT_MISSES`] intervals although it had the credit to talk.
    pub(crate) fn check_silence(st: &mut State, now: Instant, hb: Duration) -> Result<(), ConnError> {
        if st.credits.peer_may_be_starved() {
            // Our application holds (or we still owe) the peer's credits:
            // it may be unable to send even a heartbeat.
            st.last_rx = st.last_rx.max(now);
            return Ok(());
        }
        let silent = now.saturating_duration_since(st.last_rx);
        if silent >= hb * HEARTBEAT_MISSES {
            return Err(ConnError::HeartbeatTimeout {
                silent_ms: silent.as_millis() as u64,
                interval_ms: hb.as_millis() as u64,
            });
        }
        Ok(())
    }

    /// For a backend thread blocked in I/O (a write the peer does not
    /// drain): run the heartbeat check now. `Err` when the connection has
    /// failed, by this check or before.
    pub fn check_heartbeat(&self) -> Result<(), ConnError> {
        self.shared.check_heartbeat()
    }

    /// The heartbeat interval the two sides agreed on, if heartbeats are on.
    pub fn heartbeat(&self) -> Option<Duration> {
        self.shared.heartbeat
    }

    /// Bytes of a frame arrived (a long payload still being read): the peer
    /// is alive, whatever the frame turns out to be.
    pub fn on_activity(&self) {
        if self.shared.heartbeat.is_some() {
            self.shared.lock().last_rx = Instant::now();
        }
    }

    fn stamp(&self, st: &mut State, item: Outgoing, batch: &mut Vec<Frame>) {
        match item {
            Outgoing::Data(buf, r, tag) => {
                st.queued_data -= 1;
                let stamp = if tag == 0 { st.credits.commit(r) } else { st.credits.commit_bare(r) };
                let header = stamp.header(FrameKind::Data, buf.len() as u64);
                batch.push(Frame { header, payload: Some(buf), tag });
            }
            Outgoing::Wake => st.wake_queued = false,
        }
    }

    /// Account for a frame the reader decoded. Data payloads go to the
    /// application. An error means the peer broke the protocol; the
    /// connection is already marked failed when it is returned.
    #[inline]
    pub fn on_frame(&self, header: Header, payload: Option<Buf>) -> Result<(), ConnError> {
        self.on_frame_inner(Arrived::Header(header), payload, None)
    }

    /// Account for a data frame that arrived without a header, as the
    /// immediate value `imm` of an RDMA WRITE with immediate: it takes the
    /// next sequence number and returns no credits. `buf` is the receive
    /// buffer it consumed (empty); the application sees `imm` through
    /// [`crate::RecvBuf::immediate`].
    pub fn on_immediate(&self, imm: u32, buf: Buf) -> Result<(), ConnError> {
        self.on_frame_inner(Arrived::Next { credits: 0, seq_low: None }, Some(buf), Some(imm))
    }

    /// Account for a data frame whose header travelled in short form, as a
    /// backend carries it (RC: a send with immediate): the payload is
    /// `buf` (its length is the frame's), `credits` are returned with it,
    /// and `seq_low` must be the low 16 bits of the next sequence number.
    pub fn on_short(&self, credits: u16, seq_low: u16, buf: Buf) -> Result<(), ConnError> {
        self.on_frame_inner(Arrived::Next { credits, seq_low: Some(seq_low) }, Some(buf), None)
    }

    /// Inlined into each entry point: the receive path of every message.
    #[inline(always)]
    fn on_frame_inner(
        &self,
        arrived: Arrived,
        payload: Option<Buf>,
        imm: Option<u32>,
    ) -> Result<(), ConnError> {
        let mut st = self.shared.lock();
        self.note_rx(&mut st);
        match self.accept(&mut st, arrived, payload, imm, true) {
            Ok(credited) => {
                self.settle(st, credited);
                Ok(())
            }
            Err(e) => {
                drop(st);
                Err(self.fail(e))
            }
        }
    }

    /// Something came from the peer: its silence counts from now.
    #[inline(always)]
    pub(crate) fn note_rx(&self, st: &mut State) {
        if self.shared.heartbeat.is_some() {
            st.last_rx = Instant::now();
        }
    }

    /// One arrived frame, with the state locked: its credits, its
    /// sequence number, its delivery. `Ok(true)` if it returned credits.
    /// An error is the peer's breach, to fail the connection with once
    /// the lock is let go.
    #[inline(always)]
    pub(crate) fn accept(
        &self,
        st: &mut State,
        arrived: Arrived,
        payload: Option<Buf>,
        imm: Option<u32>,
        wake: bool,
    ) -> Result<bool, ConnError> {
        let header = match arrived {
            Arrived::Header(h) => h,
            Arrived::Next { credits, seq_low } => {
                let seq = st.credits.next_rx_seq();
                // A short sequence number that is not the next one is
                // reported whole: the expected number's high bits, its low.
                let seq = seq_low.map_or(seq, |low| (seq & !0xffff) | u32::from(low));
                let len = payload.as_ref().map_or(0, |b| b.len() as u64);
                Header::new(FrameKind::Data, credits, seq, len)
            }
        };
        st.credits.on_receive(&header)?;
        if header.credits > 0 {
            self.shared.wake_credit_waiters(st);
            // The peer still takes what we sent: a close timeout that runs
            // counts from now. (Credits are bounded by what we sent, so a
            // peer cannot keep it running by returning them forever.)
            if let Some(clock) = st.close_clock.as_mut() {
                *clock = Instant::now();
            }
        }
        match header.kind {
            FrameKind::Data => {
                let Some(buf) = payload else {
                    return Err(ConnError::Unsupported("payload-less data"));
                };
                if st.receiver_gone {
                    let _ = st.credits.release_many(self.shared.cost_of(buf.len()));
                    drop(buf);
                } else if handoff::wanted(&self.shared) {
                    handoff::keep(Delivery::Msg(buf, imm));
                } else if self.shared.push_delivery_woken(Delivery::Msg(buf, imm), wake).is_err() {
                    // Credits make this impossible; a full queue means
                    // the peer overran its window.
                    let window = st.credits.window();
                    return Err(zerocast_core::CreditError::Overrun { window }.into());
                }
            }
            FrameKind::Credit => {}
            FrameKind::Control => {
                st.peer_closed = true;
                self.shared.end(st);
            }
            FrameKind::Rendezvous => return Err(ConnError::Unsupported("rendezvous")),
        }
        Ok(header.credits > 0)
    }

    /// After one or more [`Driver::accept`]s: fold in the releases made
    /// meanwhile, ask for a credit frame (or a goodbye that waited for
    /// credit, if `credited`) when one is due, let go of the lock, and wake
    /// the writer if it has work. The writer is woken once the lock is let
    /// go: a wake from a receiving thread is a system call, and the writer
    /// takes the lock to stamp the credit frame.
    #[inline(always)]
    pub(crate) fn settle(&self, mut st: std::sync::MutexGuard<'_, State>, credited: bool) {
        let mut kick = self.shared.fold_releases_here(&mut st);
        let goodbye_due = st.local_closed && !st.goodbye_sent;
        if st.credits.wants_credit_frame() || (goodbye_due && credited) {
            kick |= self.shared.queue_writer_wake(&mut st);
        }
        drop(st);
        if kick {
            self.shared.kick();
        }
    }

    /// A released receive buffer was reposted (backends created with
    /// `repost`): return its credit to the peer.
    pub fn on_reposted(&self) {
        self.shared.release(1);
    }

    /// The peer's stream ended at a frame boundary. After the peer's
    /// goodbye that is the normal end; without one the peer vanished (its
    /// process died, say) and the connection fails with
    /// [`ConnError::Aborted`].
    pub fn on_end(&self) {
        self.on_end_or_fail(ConnError::Aborted);
    }

    /// Like [`Driver::on_end`], with the backend's own error for a peer that
    /// vanished without its goodbye (an RDMA disconnect, say). A backend
    /// whose read path is over calls this before reporting
    /// [`crate::Pumped::Done`], so receivers never wait for a stream that
    /// will not end by itself.
    pub fn on_end_or_fail(&self, vanished: ConnError) {
        let mut st = self.shared.lock();
        if !st.peer_closed {
            self.shared.fail(&mut st, vanished);
        }
        st.peer_closed = true;
        self.shared.end(&mut st);
    }

    /// The connection failed. Senders and receivers see `err` (receivers
    /// after the messages already delivered). Returns `err` for convenience.
    pub fn fail(&self, err: ConnError) -> ConnError {
        let mut st = self.shared.lock();
        self.shared.fail(&mut st, err.clone());
        err
    }

    /// Why the connection failed, if it did.
    pub fn error(&self) -> Option<ConnError> {
        self.shared.lock().failed.clone()
    }

    /// The writer stopped: what it was given is out (on RDMA: completed, or
    /// the peer went away after both goodbyes). Wakes
    /// [`crate::Link::wait_closed`].
    pub fn writer_done(&self) {
        let mut st = self.shared.lock();
        st.writer_done = true;
        self.shared.wake_credit_waiters(&mut st);
    }

    /// Largest payload this side accepts (for the reader's decoder).
    pub fn max_payload(&self) -> u64 {
        self.shared.max_payload
    }

    /// The pool receive buffers come from.
    pub fn pool(&self) -> &Pool {
        &self.shared.pool
    }

    /// The peer, for logs.
    pub fn peer(&self) -> &zerocast_core::Endpoint {
        &self.shared.peer
    }

    /// Wake the engine task that drives this connection (a backend whose
    /// device freed room for a backlog, or that has deferred work for it).
    pub fn wake(&self) {
        self.shared.wake_engine();
    }

    /// The close timeout ([`zerocast_core::LinkConfig::close_timeout`]) of
    /// a connection the application let go of, counted from the let-go or
    /// from the peer's latest return of credits since.
    /// `Ok(Some(deadline))`: its goodbye exchange may still end in time;
    /// look again at `deadline`. `Ok(None)`: no timeout runs (the
    /// application holds the connection, or the exchange ended, or the
    /// connection failed). `Err`: the deadline passed at `now`, and the
    /// connection has just failed with that error: the backend tears it
    /// down.
    pub fn close_deadline(&self, now: Instant) -> Result<Option<Instant>, ConnError> {
        // Set under the lock before the wake that runs the task.
        if !self.shared.let_go.load(Ordering::Acquire) {
            return Ok(None);
        }
        let mut st = self.shared.lock();
        let over = st.is_over();
        let Some(deadline) = st.close_clock.filter(|_| !over).map(|t| t + self.shared.close_timeout) else {
            return Ok(None);
        };
        if now < deadline {
            return Ok(Some(deadline));
        }
        let err = ConnError::TimedOut("the goodbye exchange did not end within the close timeout");
        self.shared.fail(&mut st, err.clone());
        Err(err)
    }

    /// Whether the connection failed or both sides said goodbye.
    pub fn is_finished(&self) -> bool {
        self.shared.lock().is_over()
    }
}

/// How a frame's header reached [`Driver::on_frame_inner`].
pub(crate) enum Arrived {
    /// Whole, from the wire.
    Header(Header),
    /// Not on the wire: a data frame taking the next sequence number
    /// (checked against `seq_low` when given), returning `credits`.
    Next { credits: u16, seq_low: Option<u16> },
}
