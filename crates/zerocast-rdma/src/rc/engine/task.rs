//! An RC connection as an engine task.
//!
//! The task is woken by the CQ's completion events (through the engine's
//! completion channel, see `comp_hub`). It polls the CQ whenever
//! no application thread does, posts what sending threads queued (and the
//! backlog a full send queue left), and reposts the receive buffers that
//! releasing threads could not post themselves. It runs when a completion
//! event comes, when the link wakes it (frames queued, a receiving thread
//! let go of the CQ, a buffer to repost), when a completion it waits for
//! comes in (room in the send queue), when the connection closes, or at its
//! timer: the heartbeat, or a retry of what waits for a pool buffer.
//!
//! Its end, in order: the writer finishes (both goodbyes, or a failure,
//! the close timeout's among them);
//! our last sends and the rendezvous payloads the peer still reads are
//! given up to 30 s ([`LINGER`]); the QP is closed, and every posted
//! request flushes; then every grant is revoked.

use std::os::fd::BorrowedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use zerocast_core::ConnError;
use zerocast_link::engine::{Cx, Step, Task};
use zerocast_link::{Driver, Pumped, Reposts, Writing};

use super::send::RcWire;
use super::{lock, Io};

/// How long our last sends may take to complete once the writer is done.
const LINGER: Duration = Duration::from_secs(30);
/// How long a closed connection waits for its flush completions.
const FLUSH_PATIENCE: Duration = Duration::from_secs(10);
/// How often a closed connection looks for flushes, which may complete
/// unannounced.
const FLUSH_SLICE: Duration = Duration::from_millis(20);
/// How long a receive waits for a pool buffer before the connection fails.
const POOL_PATIENCE: Duration = Duration::from_secs(5);

enum Phase {
    /// Writing what the link queues.
    Open,
    /// The writer is done; our last sends and lent payloads may complete
    /// until then.
    Lingering(Instant),
    /// The QP is closed: its posted requests flush, since then.
    Draining(Instant),
}

pub(super) struct RcTask {
    io: Arc<Io>,
    driver: Driver,
    reposts: Reposts,
    peer_window: usize,
    attached: bool,
    phase: Phase,
    /// An application thread holds the CQ; it wakes us when it lets go.
    awaiting_handback: bool,
    /// The heartbeat's next deadline.
    heartbeat: Option<Instant>,
    /// Receives owed to the receive queue for want of a pool buffer, and
    /// since when.
    owed: usize,
    owed_since: Option<Instant>,
}

impl RcTask {
    pub(super) fn new(io: Arc<Io>, driver: Driver, reposts: Reposts, peer_window: u32) -> Self {
        Self {
            io,
            driver,
            reposts,
            peer_window: peer_window as usize,
            attached: false,
            phase: Phase::Open,
            awaiting_handback: false,
            heartbeat: None,
            owed: 0,
            owed_since: None,
        }
    }

    /// Poll the CQ, unless an application thread holds it. `true`: the
    /// connection is over and every posted request completed.
    fn pump(&mut self) -> bool {
        loop {
            self.io.engine_pumping.store(true, Ordering::Relaxed);
            let pumped = self.driver.try_pump(None);
            self.io.engine_pumping.store(false, Ordering::Relaxed);
            match pumped {
                Some(Pumped::Done) => return true,
                Some(_) => self.awaiting_handback = false,
                // Taken by an application thread: it wakes us when done,
                // unless it let go meanwhile.
                None if !self.driver.await_handback() => continue,
                None => self.awaiting_handback = true,
            }
            return false;
        }
    }

    /// Repost what releasing threads handed on, and what is owed.
    fn repost(&mut self, now: Instant) {
        while let Ok(buf) = self.reposts.try_recv() {
            self.repost_one(buf, now);
        }
        while self.owed > 0 {
            if !self.repost_one(None, now) {
                break;
            }
            self.owed -= 1;
        }
        if self.owed == 0 {
            self.owed_since = None;
        } else if self.owed_since.is_some_and(|t| now.duration_since(t) >= POOL_PATIENCE) {
            let err = self.io.pool_exhausted();
            self.fail(ConnError::transport(err));
        }
    }

    /// Repost `buf` (or a fresh buffer): `false` if none could be had
    /// without waiting (it is then owed).
    fn repost_one(&mut self, buf: Option<zerocast_mem::Buf>, now: Instant) -> bool {
        match self.io.try_repost(&self.driver, buf) {
            Ok(true) => true,
            Ok(false) => {
                self.owed += 1;
                self.owed_since.get_or_insert(now);
                false
            }
            Err(e) => {
                self.fail(ConnError::transport(e));
                false
            }
        }
    }

    fn fail(&self, err: ConnError) {
        self.driver.fail(err);
        self.io.close();
    }

    /// The writer's step while open.
    fn write(&mut self, now: Instant, hb_due: bool) {
        match self.driver.drive_writer(hb_due) {
            Writing::Idle { next } => self.heartbeat = next,
            // The completion that makes room wakes us.
            Writing::Backlog => self.heartbeat = self.driver.heartbeat_deadline(),
            Writing::Finished => {
                self.heartbeat = None;
                self.phase = Phase::Lingering(now + LINGER);
            }
        }
    }

    /// Whether our last sends completed and the peer read what we lent
    /// (else we are woken at the next completion).
    fn sends_done(&self) -> bool {
        let io = &*self.io;
        io.wait_for_completion();
        lock(&io.send).outstanding() == 0 && !io.rendezvous.has_outbound()
    }

    /// The connection is over: revoke every grant of ours. With the QP
    /// flushed, no READ of ours can reach a buffer any more either;
    /// without, a READ's target stays held until the QP is destroyed.
    fn end(&self, flushed: bool) -> Step {
        self.io.rendezvous.clear(flushed);
        Step::Done
    }
}

impl Task for RcTask {
    /// None: the CQ's events come through the engine's completion channel,
    /// whose reader wakes this task while it listens.
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    fn run(&mut self, cx: &mut Cx<'_>) -> Step {
        let now = cx.now();
        let first = !self.attached;
        if first {
            let wire = RcWire::new(self.io.clone(), self.peer_window);
            self.driver.attach(Box::new(wire), cx.waker());
            self.io.wake_on_close(cx.waker());
            self.attached = true;
        }
        self.repost(now);
        // The application let go, and the peer did not end the goodbye
        // exchange within the close timeout: the connection has failed
        // (the writer finishes), and its QP is closed now.
        let close_due = match self.phase {
            Phase::Open => self.driver.close_deadline(now).unwrap_or_else(|_| {
                self.io.close();
                None
            }),
            _ => None,
        };
        let tick = cx.timer_due();
        let open = matches!(self.phase, Phase::Open) && !self.io.is_closing();
        let handed_back = cx.woken() && self.awaiting_handback;
        let event = self.io.notify().take_fired();
        // A one-sided request's caller waits for its completion without
        // polling, and frames in the send queue's backlog wait for the
        // completions that make room: the engine polls for them, whoever
        // claims the CQ (a receiving thread may be elsewhere for a while).
        // So does a rendezvous waiting for a pool buffer, when the pool
        // wakes us.
        let waited_on = self.io.one_sided().outstanding() > 0
            || self.io.is_backlogged()
            || self.io.rendezvous().is_starved();
        let claimed = self.driver.reader_claimed() && !waited_on;
        // The first pump arms the CQ: events come from then on.
        // A CQ left unarmed (by a receiving thread that held it; see
        // `RcSource::arm_again`) is pumped, which arms it, before the task
        // listens to it.
        let unarmed = !self.io.notify().is_armed();
        let look = first
            || !open
            || tick
            || (waited_on && cx.woken())
            || ((event || handed_back || unarmed) && !claimed);
        if look && self.pump() {
            // Over: every posted request completed.
            self.driver.writer_done();
            return self.end(true);
        }
        if matches!(self.phase, Phase::Open) {
            let hb_due = tick && self.heartbeat.is_some_and(|t| t <= now);
            if first || cx.woken() || hb_due || self.io.is_closing() {
                self.write(now, hb_due);
            }
        }
        if let Phase::Lingering(until) = self.phase {
            // A failed connection has nothing to wait for.
            let failed = self.driver.error().is_some();
            if failed || self.io.is_closing() || now >= until || self.sends_done() {
                // Done: the goodbye completed, or the peer, having both
                // goodbyes, went away before acknowledging it.
                self.driver.writer_done();
                self.io.close();
                self.phase = Phase::Draining(now);
                if self.pump() {
                    return self.end(true);
                }
            }
        }
        if let Phase::Draining(since) = self.phase {
            if now.duration_since(since) > FLUSH_PATIENCE {
                tracing::warn!(
                    recv_posted = lock(&self.io.recv).posted,
                    send_outstanding = lock(&self.io.send).outstanding(),
                    "RC connection: flush completions missing after close; giving up on them"
                );
                self.io.one_sided().abandon();
                return self.end(false);
            }
        }
        // Run at the next completion event, unless a receiving thread
        // polls the CQ.
        let listen = !self.awaiting_handback && (!open || !claimed);
        self.io.notify().listen(&cx.waker(), listen);
        let mut timer = match self.phase {
            Phase::Open => self.heartbeat,
            Phase::Lingering(until) => Some(until),
            Phase::Draining(_) => Some(now + FLUSH_SLICE),
        };
        // A receive or a rendezvous waiting for a pool buffer is woken by
        // the pool when one comes back; at its deadline, it fails. So does
        // a connection let go of, at its close timeout.
        let patience = self
            .owed_since
            .map(|t| t + POOL_PATIENCE)
            .into_iter()
            .chain(self.io.rendezvous().starved_until())
            .chain(close_due);
        if let Some(due) = patience.min() {
            timer = Some(timer.map_or(due, |t| t.min(due)));
        }
        cx.set_timer(timer);
        Step::Continue
    }
}
