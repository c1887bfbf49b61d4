//! Writing frames from the sending thread itself.
//!
//! A backend whose write path any thread may drive (a TCP socket, the
//! in-process queues, an RC send queue) hands it to [`Driver::attach`] as
//! a [`Wire`]. Its engine task then writes through it, and so may a sending
//! thread: when nothing is queued for the writer, few frames are in flight
//! (so batching would gain nothing) and no write is in progress,
//! [`crate::Link::send`] stamps its frame and writes it at once, without a
//! hand-off to the engine. That is one thread wake-up less on the latency
//! path; under load small frames queue up and go out in batches as before. Large frames
//! ([`DIRECT_LARGE`]) are written by their sender whenever the wire is free.
//! A sender that finds a ring's worth of frames queued (the engine has not
//! kept up) writes the whole batch itself when the wire is free
//! ([`Driver::write_queued_here`]), rather than spill the queue.
//!
//! Under load, a wire that asks for it ([`Wire::stages_up_to`]) gets small
//! frames already stamped, as bytes (see [`crate::staged`]), rather than
//! through the queue.
//!
//! Order: every frame is stamped and written while the wire's lock is held
//! (a staged one is stamped into the staging area, which every writer takes
//! before it stamps anything else), and a sending thread writes only when no
//! earlier data frame is queued or staged, so frames reach the wire in the
//! order they were stamped.

use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::Instant;

use zerocast_core::{ConnError, FrameKind, Reservation};
use zerocast_mem::Buf;

use crate::driver::Fill;
use crate::shared::{Shared, State, DUE, IDLE, LINGERING};
use crate::{Driver, Frame};

/// A sending thread writes its frame itself only while at most this many
/// credits are outstanding: beyond that, batching in the writer pays more.
/// Credits, not frames: a small frame takes one, but on a receiver that
/// weighs its credits (`tcp://`, a credit per KiB begun past the first) a
/// frame of a few KiB takes several, so fewer of those count as quiet.
pub(crate) const DIRECT_MAX_OUTSTANDING: u32 = 4;

/// A frame this large is written by its sending thread whenever the wire
/// is free, however many are in flight: it is one write of its own in any
/// batch, so a hand-off to the engine would only add a wake-up. Unless the
/// wire batches large frames ([`Wire::batches_large_frames`]) and the
/// frame is part of a stream ([`STREAM_GAP`]): then it queues.
pub(crate) const DIRECT_LARGE: usize = 16 * 1024;

/// A sender that pauses less than this between large frames (from the
/// end of the last one's write, or from its queueing, to the next send)
/// streams them, and a wire that batches them
/// ([`Wire::batches_large_frames`]) writes several at a time. One that
/// comes after a longer pause goes out from its sender at once, without
/// waiting for the engine: a slow stream keeps its latency.
pub(crate) const STREAM_GAP: std::time::Duration = std::time::Duration::from_micros(50);

/// Times the engine's writer gives its core away, at most, after it wrote
/// queued frames and drained the queue, and writes what came meanwhile.
const LINGER: usize = 2;

/// A backend's write path, driven by its engine task and by sending threads.
pub trait Wire: Send {
    /// Write `frames`, in order, now, on the calling thread. Called with the
    /// wire's lock held, so no other frame is written meanwhile. A wire
    /// whose device still reads a payload after `write` returns (RDMA) takes
    /// it out of its frame and keeps it until the device is done; payloads
    /// left in the frames go back to the pool once `write` returns. An error
    /// fails the connection; the wire should then stop its reader too (shut
    /// the socket down, say).
    fn write(&mut self, frames: &mut [Frame], ctx: &WireCtx<'_>) -> Result<(), ConnError>;

    /// Payloads up to this many bytes may come to [`Wire::write_staged`]
    /// already encoded, header then payload, as the frames' wire format
    /// (see the link's staging of small frames); 0, the default: the wire
    /// takes only [`Frame`]s. Asked once, when the wire is attached.
    fn stages_up_to(&self) -> usize {
        0
    }

    /// Whether a stream of large frames goes out faster several per write
    /// than one by one: a byte stream's does, whose every write ends in a
    /// short packet (see the TCP writer). Then such frames, under load and
    /// close together (their sender paused less than 50 µs, and nothing
    /// came from the peer between), queue for the writer's batches.
    /// `false`, the default: a sending thread writes each large frame
    /// itself whenever the wire is free (an RDMA send queue, where each is
    /// a work request of its own anyway). Asked once, when the wire is
    /// attached.
    fn batches_large_frames(&self) -> bool {
        false
    }

    /// [`Wire::write`], with `bytes` ahead of `frames`: stamped data frames
    /// already in wire format, never empty unless [`Wire::stages_up_to`]
    /// is above 0.
    fn write_staged(
        &mut self,
        bytes: &[u8],
        frames: &mut [Frame],
        ctx: &WireCtx<'_>,
    ) -> Result<(), ConnError> {
        debug_assert!(bytes.is_empty(), "bytes staged for a wire that takes only frames");
        self.write(frames, ctx)
    }

    /// Bytes taken by [`Wire::write`] that the device has not taken yet
    /// (a socket that was full). A wire that keeps such a backlog calls
    /// [`WireCtx::kick`], and the engine then waits for the device and
    /// calls [`Wire::flush`]. A later `write` goes behind the backlog.
    fn backlog(&self) -> bool {
        false
    }

    /// Write what the backlog can now; an error fails the connection.
    fn flush(&mut self, _ctx: &WireCtx<'_>) -> Result<(), ConnError> {
        Ok(())
    }

    /// Write what an earlier write kept back ([`WireCtx::may_keep_tail`]):
    /// the engine's writer found nothing queued to send it with. A wire
    /// that keeps nothing back need not implement it.
    fn flush_tail(&mut self, _ctx: &WireCtx<'_>) -> Result<(), ConnError> {
        Ok(())
    }
}

/// What a [`Wire`] may ask of its connection while it writes.
#[derive(Debug)]
pub struct WireCtx<'a> {
    shared: &'a Shared,
    /// See [`WireCtx::may_keep_tail`].
    keep_tail: bool,
}

impl<'a> WireCtx<'a> {
    fn new(shared: &'a Shared) -> Self {
        Self { shared, keep_tail: false }
    }
}

impl WireCtx<'_> {
    /// Whether this write may keep back its last bytes, short of a whole
    /// packet, for the engine's writer: a sending thread that writes a
    /// stream's ring of frames does (one that finds a ring's worth queued),
    /// whose next frames are on their way. A wire that keeps them does not
    /// report them as a backlog, kicks the engine ([`WireCtx::kick`]), and
    /// writes them with the next frames, or in [`Wire::flush_tail`].
    pub fn may_keep_tail(&self) -> bool {
        self.keep_tail
    }

    /// For a write the peer does not drain: run the heartbeat check now
    /// (see [`Driver::check_heartbeat`]).
    pub fn check_heartbeat(&self) -> Result<(), ConnError> {
        self.shared.check_heartbeat()
    }

    /// The heartbeat interval, if heartbeats are on.
    pub fn heartbeat(&self) -> Option<std::time::Duration> {
        self.shared.heartbeat
    }

    /// The peer, for logs.
    pub fn peer(&self) -> &zerocast_core::Endpoint {
        &self.shared.peer
    }

    /// Ask the engine driving the connection to run its writer: the wire
    /// has a backlog to flush.
    pub fn kick(&self) {
        self.shared.kick();
    }
}

/// Where [`Driver::drive_writer`] left the write side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writing {
    /// Nothing to write now. Run again when woken, or at `next` (the
    /// heartbeat's next tick or silence check), with `tick` set.
    Idle {
        /// The heartbeat's next deadline, if heartbeats are on.
        next: Option<Instant>,
    },
    /// The wire has a backlog: run again once the device takes more (or
    /// at [`Driver::heartbeat_deadline`], with `tick` set).
    Backlog,
    /// The writer is done: the connection failed, or both goodbyes are out
    /// and written. Shut the write side down and call
    /// [`Driver::writer_done`] once the peer has everything (a stream
    /// backend reads on until the peer's end of stream: closing a socket
    /// that still receives resets it, and the reset discards what the
    /// kernel had not yet sent).
    Finished,
}

/// Where [`Driver::write_queued`] stopped.
enum Written {
    /// Nothing is queued.
    Drained,
    /// The wire keeps a backlog.
    Backlog,
    /// The writer should stop: the connection failed, or both goodbyes
    /// are out.
    Stop,
}

pub(crate) type WireLock = Mutex<Box<dyn Wire>>;

/// Whether a frame of `len` bytes on `shared` is timed for [`STREAM_GAP`]:
/// it is large and the wire batches large frames (see
/// [`Shared::large_alone`], and the end of [`Shared::write_direct`]).
fn large_timed(shared: &Shared, len: usize) -> bool {
    len >= DIRECT_LARGE && shared.large_batched.load(Ordering::Relaxed)
}

/// Whether a large frame sent at `now`, with `rx` the next sequence number
/// expected from the peer, continues a stream whose last large frame was
/// sent at `last` (when `rx` was as given there): nothing came in between,
/// and it is within [`STREAM_GAP`] of that one (of the end of its write,
/// if its sender wrote it).
fn in_stream(last: Option<(Instant, u32)>, now: Instant, rx: u32) -> bool {
    last.is_some_and(|(t, seen)| seen == rx && now.saturating_duration_since(t) < STREAM_GAP)
}

/// The wire, if no other thread holds it now (a poisoned lock is taken
/// anyway). Every writer, the engine's included, only tries it.
fn try_wire(w: &WireLock) -> Option<MutexGuard<'_, Box<dyn Wire>>> {
    match w.try_lock() {
        Ok(w) => Some(w),
        Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

impl Driver {
    /// Drive the writer from an engine: use `wire` from now on (sending
    /// threads may too), and tell the engine task through `waker` when
    /// there is work (call once, before the first [`Driver::drive_writer`]).
    pub fn attach(&self, wire: Box<dyn Wire>, waker: crate::engine::Waker) {
        self.shared.stage_max.store(wire.stages_up_to(), Ordering::Relaxed);
        self.shared.large_batched.store(wire.batches_large_frames(), Ordering::Relaxed);
        let _ = self.shared.wire.0.set(std::sync::Mutex::new(wire));
        let _ = self.shared.waker.0.set(waker);
    }

    /// The engine's writer step: flush the wire's backlog, then stamp and
    /// write everything queued, without waiting. `tick`: the heartbeat
    /// deadline [`Writing::Idle`] gave has come.
    pub fn drive_writer(&self, tick: bool) -> Writing {
        let shared = &*self.shared;
        // Cleared before looking, so work queued from here on wakes the
        // task again.
        shared.scheduled.store(IDLE, Ordering::SeqCst);
        let Some(wire) = shared.wire.0.get() else { return Writing::Finished };
        let ctx = WireCtx::new(shared);
        let Some(mut w) = self.take_wire_for_engine(wire) else {
            return Writing::Idle { next: self.heartbeat_deadline() };
        };
        if let Err(e) = w.flush(&ctx) {
            self.fail(e);
            return Writing::Finished;
        }
        // A peer that reads nothing keeps the backlog from draining, and
        // nothing new is stamped: its silence is judged here.
        if tick && shared.check_heartbeat().is_err() {
            return Writing::Finished;
        }
        let mut written = 0;
        let res = self.write_queued(&mut **w, &ctx, tick, &mut written);
        let Some(res) = self.linger(wire, w, &ctx, res, written) else {
            return Writing::Idle { next: self.heartbeat_deadline() };
        };
        match res {
            Written::Backlog => Writing::Backlog,
            Written::Stop => Writing::Finished,
            Written::Drained => {
                if shared.lock().is_over() {
                    return Writing::Finished;
                }
                Writing::Idle { next: self.heartbeat_deadline() }
            }
        }
    }

    /// After a writer step that wrote `written` queued frames and stopped
    /// at `res`, holding `w`: linger, and write what comes meanwhile.
    ///
    /// Frames were queued, so the link is under load (a quiet one's sender
    /// writes its own), most often a stream whose sender queues frames
    /// about as fast as they go out. Each one it queues after the writer
    /// went idle wakes the engine again (an eventfd write, a thread woken)
    /// for a batch of a few frames, with the sender and the engine taking
    /// turns at the connection's locks. So the writer keeps the task
    /// scheduled (frames queued meanwhile wake no one), lets go of the wire
    /// (a sender that fills a ring writes it itself), yields its core (to
    /// that sender, when they share one), and writes what came. Only on an
    /// engine's own thread, a few times per turn ([`crate::engine::may_linger`]).
    ///
    /// Where the writer stopped; `None` if a sending thread holds the wire
    /// now (it wakes the writer when it lets go).
    fn linger<'w>(
        &self,
        wire: &'w WireLock,
        mut w: MutexGuard<'w, Box<dyn Wire>>,
        ctx: &WireCtx<'_>,
        mut res: Written,
        mut written: usize,
    ) -> Option<Written> {
        let shared = &*self.shared;
        for _ in 0..LINGER {
            if written == 0 || !matches!(res, Written::Drained) || !crate::engine::may_linger() {
                break;
            }
            shared.scheduled.store(LINGERING, Ordering::SeqCst);
            drop(w);
            crate::engine::linger_yield();
            // Cleared before looking, as at the step's start.
            let kicked = shared.scheduled.swap(IDLE, Ordering::SeqCst) == DUE;
            // A kick the flag swallowed meanwhile is looked into here,
            // whatever it was for: frames queued or staged, or a backlog
            // that a sending thread's own write left on the wire (a large
            // frame the socket did not take whole), which only the engine
            // flushes, once the step says so. Without one, only frames
            // already on their way (queued before their kick) can be new.
            if !kicked && shared.nothing_to_write() {
                break;
            }
            w = self.take_wire_for_engine(wire)?;
            if w.backlog() {
                return Some(Written::Backlog);
            }
            if shared.nothing_to_write() {
                // A sending thread wrote meanwhile, and may have kept a
                // tail back for this writer.
                return Some(self.drained(&mut **w, ctx));
            }
            written = 0;
            res = self.write_queued(&mut **w, ctx, false, &mut written);
        }
        Some(res)
    }

    /// The wire, for the engine's writer, which drives every connection of
    /// its thread and so does not wait for a sending thread that holds it
    /// (writing a quiet link's frame, or the queue): it asks to be woken
    /// when the wire is let go, then tries once more, so either the second
    /// try finds the wire free or the holder sees the request.
    fn take_wire_for_engine<'w>(&self, wire: &'w WireLock) -> Option<MutexGuard<'w, Box<dyn Wire>>> {
        let shared = &*self.shared;
        let w = try_wire(wire).or_else(|| {
            shared.writer_wanted.store(true, Ordering::SeqCst);
            try_wire(wire)
        })?;
        shared.writer_wanted.store(false, Ordering::Relaxed);
        Some(w)
    }

    /// Write what is queued on the calling thread, if an engine drives
    /// this connection (its wire never waits) and no other thread is
    /// writing: for a sender that polls (`try_send` finding no credit), so
    /// that its queued frames go out without waiting for the engine's
    /// thread, which a spinning thread may keep from a core; for a sender
    /// that finds a ring's worth queued; for a credit frame a release made
    /// due.
    /// `false`: not written here (no engine drives it, or another thread
    /// holds the wire), so whoever queued must wake the engine.
    pub(crate) fn write_queued_here(&self) -> bool {
        let shared = &*self.shared;
        if shared.waker.0.get().is_none() {
            return false;
        }
        if shared.nothing_to_write() {
            return true;
        }
        let Some(wire) = shared.wire.0.get() else { return false };
        let Some(mut w) = try_wire(wire) else { return false };
        // What is left (a backlog, the end) is the engine's to act on: the
        // wire wakes it for a backlog, a failure or the end does too.
        // A stream's ring: the bytes past its last whole packet may wait
        // for the next frames (the wire kicks the engine for them).
        let ctx = WireCtx { keep_tail: true, ..WireCtx::new(shared) };
        let _ = self.write_queued(&mut **w, &ctx, false, &mut 0);
        drop(w);
        shared.hand_writer_back();
        true
    }

    /// Nothing more is queued: the engine's writer sends what a sending
    /// thread's write kept back (see [`WireCtx::may_keep_tail`]).
    fn drained(&self, w: &mut dyn Wire, ctx: &WireCtx<'_>) -> Written {
        if !ctx.keep_tail {
            if let Err(e) = w.flush_tail(ctx) {
                self.fail(e);
                return Written::Stop;
            }
            if w.backlog() {
                return Written::Backlog;
            }
        }
        Written::Drained
    }

    /// Stamp and write, through `w` (whose lock the caller holds), what is
    /// queued, and with `tick` the heartbeat's frame, until the queue is
    /// empty or the wire keeps a backlog. For writers that never wait (an
    /// engine's, or a sending thread's for it), counting the frames into
    /// `written`. A write error fails the connection.
    fn write_queued(&self, w: &mut dyn Wire, ctx: &WireCtx<'_>, tick: bool, written: &mut usize) -> Written {
        let shared = &*self.shared;
        // The connection's one batch: only the thread holding the wire
        // locks it.
        let mut batch = shared.spare_batch.lock().unwrap_or_else(|p| p.into_inner());
        let mut tick = tick;
        loop {
            if w.backlog() {
                return Written::Backlog;
            }
            let first = shared.tx.try_pop();
            if first.is_none() && !tick && !shared.maybe_staged() {
                return self.drained(w, ctx);
            }
            tick = false;
            // A driver that does not own the queue's end (a sending
            // thread's) drains it too, holding the wire.
            match self.fill_from(first, &mut batch, true) {
                Fill::Ready => {}
                Fill::Empty => continue,
                // A tail kept back goes out before the writer stops: it
                // may hold the last frames, the goodbye among them.
                Fill::Stop => {
                    return match self.drained(w, ctx) {
                        Written::Backlog => Written::Backlog,
                        _ => Written::Stop,
                    };
                }
            }
            *written += batch.frames.len() + usize::from(!batch.bytes.is_empty());
            let crate::driver::Batch { bytes, frames } = &mut *batch;
            let res = w.write_staged(bytes, frames, ctx);
            batch.clear();
            if let Err(e) = res {
                self.fail(e);
                return Written::Stop;
            }
        }
    }

    /// When the heartbeat next needs the writer: to send one, or to find
    /// the peer silent (`None`: heartbeats are off).
    pub fn heartbeat_deadline(&self) -> Option<Instant> {
        let hb = self.shared.heartbeat?;
        let st = self.shared.lock();
        Some((st.last_tx + hb).min(st.last_rx + hb * zerocast_core::HEARTBEAT_MISSES))
    }
}

impl Shared {
    /// A sending thread let go of the wire: if the engine's writer found it
    /// held meanwhile and left its work to this thread, wake the writer.
    #[inline]
    pub(crate) fn hand_writer_back(&self) {
        if self.take_writer_request() {
            self.kick();
        }
    }

    /// Whether the engine's writer asked for the wire while it was held
    /// (see [`Driver::take_wire_for_engine`]); the request is taken back.
    #[inline]
    fn take_writer_request(&self) -> bool {
        self.writer_wanted.load(Ordering::SeqCst) && self.writer_wanted.swap(false, Ordering::SeqCst)
    }

    /// [`Shared::hand_writer_back`] for a sending thread that wrote its own
    /// frame ([`Shared::write_direct`]), leaving a backlog on the wire or
    /// not: the writer is woken only if something is left for it. Its step
    /// may have come for anything (an engine task runs its writer whenever
    /// it runs), and without work of its own it would only find the wire
    /// held by the next send, ask again, and be woken again, send after
    /// send, racing the sending thread for the wire and for a core.
    #[inline]
    pub(crate) fn hand_writer_back_after_write(&self, backlog: bool) {
        if self.take_writer_request() && (backlog || self.writer_has_work()) {
            self.kick();
        }
    }

    /// Whether the writer has work besides a backlog: frames queued or
    /// staged, a heartbeat to keep, or an end to act on (a goodbye to
    /// send or sent, the peer's, a failure), which its step turns into
    /// the connection's next phase.
    #[cold]
    fn writer_has_work(&self) -> bool {
        if self.heartbeat.is_some() || !self.nothing_to_write() {
            return true;
        }
        let st = self.lock();
        st.failed.is_some() || st.local_closed || st.goodbye_sent || st.peer_closed
    }

    pub(crate) fn check_heartbeat(&self) -> Result<(), ConnError> {
        let mut st = self.lock();
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        let Some(hb) = self.heartbeat else { return Ok(()) };
        if let Err(e) = Driver::check_silence(&mut st, Instant::now(), hb) {
            self.fail(&mut st, e.clone());
            return Err(e);
        }
        Ok(())
    }

    /// The wire, if a data frame of `len` bytes may be written on the
    /// calling thread now (see the module docs), for
    /// [`Shared::write_direct`]; `None`: the caller stages or queues it.
    ///
    /// Asks before it takes: the buffer moves only into the path that
    /// sends it, not out through an error and into the next attempt.
    #[inline]
    pub(crate) fn direct_wire(&self, st: &mut State, len: usize) -> Option<MutexGuard<'_, Box<dyn Wire>>> {
        let wire = self.wire.0.get()?;
        // Every large frame under load is timed, queued or not.
        let alone = st.credits.outstanding() <= DIRECT_MAX_OUTSTANDING || self.large_alone(st, len);
        if st.queued_data > 0 || !st.staged.is_empty() || st.goodbye_sent || !alone {
            return None;
        }
        // The state stays locked: the wire is only tried, never waited
        // for, against the usual order (the wire first), so no thread
        // holding the wire and waiting for the state is waited on.
        try_wire(wire)
    }

    /// Whether a frame of `len` bytes on a link under load is written
    /// alone by its sender (see [`DIRECT_LARGE`]): it is large, and the
    /// wire does not batch large frames, or this one is no part of a
    /// stream: the last came longer ago than [`STREAM_GAP`], or a frame
    /// arrived since (an answer: the sender is waiting for replies, each
    /// a round trip from the last, and batching would only delay them).
    #[inline]
    fn large_alone(&self, st: &mut State, len: usize) -> bool {
        if !large_timed(self, len) {
            return len >= DIRECT_LARGE;
        }
        let (now, rx) = (Instant::now(), st.credits.next_rx_seq());
        let stream = in_stream(st.last_large, now, rx);
        st.last_large = Some((now, rx));
        !stream
    }

    /// Write a data frame through `w` (from [`Shared::direct_wire`]) on
    /// the calling thread. A write that fails fails the connection; later
    /// calls report it.
    pub(crate) fn write_direct(
        &self,
        mut st: MutexGuard<'_, State>,
        mut w: MutexGuard<'_, Box<dyn Wire>>,
        buf: Buf,
        r: Reservation,
    ) {
        self.fold_releases(&mut st);
        let starved = st.credits.peer_may_be_starved();
        let stamp = st.credits.commit(r);
        st.direct_sends += 1;
        if self.heartbeat.is_some() {
            let now = Instant::now();
            st.last_tx = now;
            if starved {
                st.last_rx = st.last_rx.max(now);
            }
        }
        drop(st);
        let timed = large_timed(self, buf.len());
        let mut frame =
            Frame { header: stamp.header(FrameKind::Data, buf.len() as u64), payload: Some(buf), tag: 0 };
        let res = w.write(std::slice::from_mut(&mut frame), &WireCtx::new(self));
        let backlog = w.backlog();
        drop(w);
        self.hand_writer_back_after_write(backlog);
        drop(frame);
        if let Err(e) = res {
            self.fail(&mut self.lock(), e);
        } else if timed {
            // A stream's gap is the sender's pause between frames, which
            // begins once this one is written (a large write takes long).
            if let Some((at, _)) = &mut self.lock().last_large {
                *at = Instant::now();
            }
        }
    }
}

#[cfg(test)]
mod stream_tests {
    use std::time::{Duration, Instant};

    use super::{in_stream, STREAM_GAP};

    #[test]
    fn a_large_frame_continues_a_stream_only_close_behind_the_last_with_nothing_between() {
        let t = Instant::now();
        let soon = t + STREAM_GAP / 2;
        // The first of all, and one close behind the last.
        assert!(!in_stream(None, t, 7));
        assert!(in_stream(Some((t, 7)), soon, 7));
        // After a pause: a slow stream's frames go out one by one.
        assert!(!in_stream(Some((t, 7)), t + STREAM_GAP, 7));
        assert!(!in_stream(Some((t, 7)), t + Duration::from_secs(1), 7));
        // A frame from the peer came in between: an answer, not a stream.
        assert!(!in_stream(Some((t, 7)), soon, 8));
        // A clock that went back (another thread's reading) is no pause.
        assert!(in_stream(Some((soon, 7)), t, 7));
    }
}
