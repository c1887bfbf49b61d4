//! Polling the CQ: by a receiving application thread when there is one,
//! by the connection's poller thread otherwise.
//!
//! The CQ is a [`Source`]: [`crate::rc::RcConnection`]'s `recv` polls it on
//! the calling thread, so a message is taken off the CQ by the thread that
//! will use it, with no hand-off (in busy-poll mode, the receiving thread
//! spins on the CQ the way `ib_send_lat` does). The poller thread polls
//! only while no application thread receives: send completions, credits,
//! goodbyes and rendezvous READs of a busy application still move.

use std::mem::MaybeUninit;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rdma_sys::ibv_wc;
use zerocast_core::ConnError;
use zerocast_link::{Driver, Pumped, Source, StepAside};

use super::completion::on_completion;
use super::{lock, Io, POLL_BATCH};
use crate::rc::rendezvous;
use crate::rc::RcError;

/// In event mode, how long a receiving thread spins on the CQ before it
/// sleeps on the completion channel.
const SPIN: Duration = Duration::from_micros(50);
/// The longest single sleep on the completion channel.
const WAIT_SLICE_MS: i32 = 20;
/// In busy-poll mode, how long the poller thread spins when idle before it
/// naps (and how long each nap is).
const BUSY_SPIN: Duration = Duration::from_micros(200);
const BUSY_NAP: Duration = Duration::from_micros(50);
/// How long the poller waits for flush completions after a close.
const FLUSH_PATIENCE: Duration = Duration::from_secs(10);

/// The CQ as a [`Source`].
pub(super) struct RcSource {
    io: Arc<Io>,
    wcs: [MaybeUninit<ibv_wc>; POLL_BATCH],
    /// A completion event was requested and has not been taken yet.
    armed: bool,
    done: bool,
    /// Receiving threads sleep on the completion channel after a spin
    /// (not busy-polling, and the CQ has a channel). Fixed at creation.
    event_mode: bool,
}

impl RcSource {
    pub(super) fn new(io: Arc<Io>) -> Self {
        let event_mode = !io.busy_poll && io.cq.has_channel();
        let wcs = std::array::from_fn(|_| MaybeUninit::uninit());
        Self { io, wcs, armed: false, done: false, event_mode }
    }

    /// Poll one batch of completions and act on each; how many there were.
    fn poll_once(&mut self, driver: &Driver) -> usize {
        let io = &*self.io;
        if io.rendezvous.is_starved() {
            // A rendezvous waits for a pool buffer: try again.
            if let Err(e) = rendezvous::retry(io, driver) {
                driver.fail(e);
                io.close();
            }
        }
        let n = match io.cq.poll(&mut self.wcs) {
            Ok(n) => n,
            Err(e) => {
                driver.fail(ConnError::transport(RcError::verbs("ibv_poll_cq", e)));
                io.close();
                0
            }
        };
        for wc in &self.wcs[..n] {
            // SAFETY: `ibv_poll_cq` initialised the first `n` entries.
            let wc = unsafe { wc.assume_init_ref() };
            on_completion(io, driver, wc);
        }
        n
    }

    /// In event mode, every pump returns with the CQ armed, so the poller
    /// thread, asleep on the channel with no timeout, wakes at the next
    /// completion. A pump that took the pending event (a receiving thread
    /// that slept on the channel) arms it again before it returns: `true`
    /// when it did, and the CQ must then be polled once more, for a
    /// completion that landed before the arming announces nothing. The
    /// next pump, finding the CQ armed, has nothing to arm itself.
    /// Inlined, with the arming out of line: a busy-polling receive
    /// checks it on every message.
    #[inline]
    fn arm_again(&mut self) -> bool {
        let due = self.event_mode && !self.armed;
        if due {
            self.arm();
        }
        due
    }

    /// Request a completion event.
    #[inline(never)]
    fn arm(&mut self) {
        if let Err(e) = self.io.cq.arm() {
            tracing::debug!(error = %e, "ibv_req_notify_cq failed");
        }
        self.armed = true;
    }

    /// Before reporting the CQ empty in event mode: the CQ is armed and no
    /// event is pending, so a sleep on the channel ends at the next
    /// completion. `false`: poll again first (a completion may have landed
    /// before the arming, or an old event was taken).
    /// Inlined, with the event mode's part out of line: a busy-polling
    /// `try_recv` checks it on every empty spin.
    #[inline]
    fn settled(&mut self) -> bool {
        !self.event_mode || self.settled_event()
    }

    #[inline(never)]
    fn settled_event(&mut self) -> bool {
        if !self.armed {
            self.arm();
            return false;
        }
        match self.io.cq.wait(0) {
            Ok(true) => {
                self.armed = false;
                false
            }
            _ => true,
        }
    }
}

// SAFETY: `ibv_wc` is plain data (integers and a union of integers); the
// array is scratch space, meaningful only during one `pump`.
unsafe impl Send for RcSource {}

impl Source for RcSource {
    fn pump(&mut self, driver: &Driver, until: Option<Instant>) -> Pumped {
        if self.done {
            return Pumped::Done;
        }
        // Read the clock only once this call has to wait: a busy-polling
        // `try_recv` pumps with no deadline on every spin, and a clock
        // read is a system call on some machines (a TCG guest's HPET).
        let mut start: Option<Instant> = None;
        let mut handled = false;
        let mut spins = 0u32;
        loop {
            let n = self.poll_once(driver);
            if n == POLL_BATCH {
                handled = true;
                continue;
            }
            if n > 0 || handled {
                if self.arm_again() {
                    handled = true;
                    continue;
                }
                return Pumped::Frames;
            }
            if self.io.is_closing() && self.io.drained() {
                self.done = true;
                // Nothing more will come off this CQ. Make sure the link
                // knows: a connection closed with no receive posted (so no
                // flush completion told it) still ends for its receivers.
                let vanished = if self.io.peer_disconnected.load(Ordering::Acquire) {
                    RcError::PeerDisconnected
                } else {
                    RcError::Closed
                };
                driver.on_end_or_fail(ConnError::transport(vanished));
                return Pumped::Done;
            }
            let Some(until) = until else {
                if self.settled() {
                    return Pumped::Idle;
                }
                continue;
            };
            let now = Instant::now();
            if now >= until || driver.app_waiting() {
                if self.arm_again() {
                    continue;
                }
                return Pumped::Idle;
            }
            let start = *start.get_or_insert(now);
            spins = spins.wrapping_add(1);
            if !self.event_mode || now - start < SPIN {
                // Stay on the CPU, but let a thread on this core that would
                // send (the peer, in the same process) go now and then.
                if spins & 63 == 63 {
                    thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
                continue;
            }
            if !self.settled() {
                continue;
            }
            let left = (until - now).as_millis().clamp(1, WAIT_SLICE_MS as u128) as i32;
            match self.io.cq.wait(left) {
                Ok(true) => self.armed = false,
                Ok(false) => {}
                Err(e) => tracing::debug!(error = %e, "waiting for a completion event failed"),
            }
        }
    }
}

/// The poller thread: polls whenever no application thread does, until
/// the connection is closed and every posted request has completed.
pub(super) fn poller(io: &Io, driver: &Driver) {
    let flushed = poll_until_drained(io, driver);
    // Revoke every grant of ours. With the QP flushed, no READ of ours
    // can reach a buffer any more either; without, a READ's target stays
    // held until the QP is destroyed.
    io.rendezvous.clear(flushed);
}

/// Poll until the connection is over and every posted request has
/// completed (`true`), or until the flushes of a closed connection failed
/// to come (`false`).
fn poll_until_drained(io: &Io, driver: &Driver) -> bool {
    let mut aside = StepAside::new();
    let mut idle_since: Option<Instant> = None;
    loop {
        if aside.nap_if_app_reads(driver) {
            continue;
        }
        match driver.try_pump(None) {
            Some(Pumped::Done) => return true,
            Some(Pumped::Frames) => {
                idle_since = None;
                continue;
            }
            Some(Pumped::Idle) => {}
            None => {
                aside.nap();
                continue;
            }
        }
        let idle = *idle_since.get_or_insert_with(Instant::now);
        if io.is_closing() && idle.elapsed() > FLUSH_PATIENCE {
            tracing::warn!(
                recv_posted = lock(&io.recv).posted,
                send_outstanding = lock(&io.send).outstanding(),
                "RC connection: flush completions missing after close; giving up on them"
            );
            io.one_sided.abandon();
            return false;
        }
        if io.busy_poll || !io.cq.has_channel() {
            if idle.elapsed() > BUSY_SPIN {
                thread::sleep(BUSY_NAP);
            } else {
                std::hint::spin_loop();
            }
            continue;
        }
        // The source left the CQ armed with no event pending, and every
        // pump leaves it armed (`RcSource::arm_again`): sleep until the
        // next completion, without taking its event (the next pump does),
        // so an application thread can take over at any time. With no
        // timeout, unless closing: an idle connection costs no wake-ups,
        // and a close rings the signal. Once closing, the slices pace the
        // wait for flushes, which may complete unannounced.
        let waited = if io.is_closing() {
            io.cq.readable(WAIT_SLICE_MS)
        } else if io.rendezvous.is_starved() {
            // A buffer coming back to the pool announces nothing here:
            // look again in a slice.
            io.cq.readable_or_closing(io.close_signal(), WAIT_SLICE_MS)
        } else {
            io.cq.readable_or_closing(io.close_signal(), -1)
        };
        if let Err(e) = waited {
            tracing::debug!(error = %e, "waiting for a completion event failed");
            aside.nap();
        }
    }
}
