//! Polling the CQ: by a receiving application thread when there is one,
//! by the connection's engine task otherwise.
//!
//! The CQ is a [`Source`]: [`crate::rc::RcConnection`]'s `recv` polls it on
//! the calling thread, so a message is taken off the CQ by the thread that
//! will use it, with no hand-off (in busy-poll mode, the receiving thread
//! spins on the CQ the way `ib_send_lat` does). The engine task polls
//! while no application thread receives: send completions, credits,
//! goodbyes and rendezvous READs of a busy application still move.

use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rdma_sys::ibv_wc;
use zerocast_core::ConnError;
use zerocast_link::spin::{SpinClock, SpinPolicy};
use zerocast_link::{Driver, Interrupt, Pumped, Source};

use super::completion::on_completion;
use super::{Io, POLL_BATCH};
use crate::cm::poll_in;
use crate::rc::rendezvous;
use crate::rc::RcError;

/// In event mode, how long a receiving thread spins on the CQ before it
/// sleeps until the CQ's next completion event, at least and at most: the
/// spin follows the waits that ended in a completion (see
/// [`zerocast_link::spin`]), so that round trips longer than the floor (an
/// emulated 4 KiB one, for one) are caught by the spin rather than each
/// paying a sleep and a wake-up.
const SPIN: SpinPolicy = SpinPolicy::new(Duration::from_micros(50), Duration::from_micros(500));
/// A waiting thread polls the CQ this many times between two reads of the
/// clock, with no pause instruction in between, as `ib_send_lat` polls. A
/// completion that lands while the thread reads the clock waits for the
/// read, and where the clock is not the CPU's counter a read is a system
/// call: about 1.6 µs on an emulated HPET, the clock a TCG guest falls
/// back to when its kernel finds the TSC unstable. Under TCG a PAUSE, too,
/// leaves the translated code for about a microsecond.
const POLLS_PER_CLOCK: u32 = 16;
/// The longest sleep of a thread that could not make its eventfd (see
/// [`Interrupt::this_thread`]): nothing can wake it, so it looks again.
const NO_INTERRUPT_SLICE: Duration = Duration::from_millis(10);

/// The CQ as a [`Source`].
pub(super) struct RcSource {
    io: Arc<Io>,
    wcs: [MaybeUninit<ibv_wc>; POLL_BATCH],
    done: bool,
    /// Receiving threads arm the CQ and sleep until its next event after a
    /// spin (not busy-polling). Fixed at creation. The engine task's pumps
    /// arm the CQ in either mode.
    event_mode: bool,
    /// How long receiving threads spin, from the waits so far.
    spin: SpinPolicy,
    /// When the wait for the next completion began: the first empty poll
    /// of a pump that could wait, kept across its sleep and the pumps
    /// after it until a completion comes (and the wait is measured). Event
    /// mode only.
    waiting_since: Option<Instant>,
    /// A wait a completion ended, learned by the next pump (see
    /// [`RcSource::waited`]): its start and its end.
    unlearned: Option<(Instant, Instant)>,
}

impl RcSource {
    pub(super) fn new(io: Arc<Io>) -> Self {
        let event_mode = !io.busy_poll;
        let wcs = std::array::from_fn(|_| MaybeUninit::uninit());
        Self { io, wcs, done: false, event_mode, spin: SPIN, waiting_since: None, unlearned: None }
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

    /// In event mode, every pump the engine may rely on returns with the
    /// CQ armed, so the engine's channel announces the next completion. A
    /// pump after an event came (the CQ is no longer armed) arms it again
    /// before it returns: `true` when it did, and the CQ must then be
    /// polled once more, for a completion that landed before the arming
    /// announces nothing. The next pump, finding the CQ armed, has nothing
    /// to arm itself.
    ///
    /// Not while an application thread receives here (the claim) and the
    /// engine task does not listen: nothing then needs the events, and
    /// each would wake the engine's thread, which reads the channel, for
    /// nothing (a thread that sleeps arms first, see [`Self::settled`];
    /// an engine task that listens again pumps an unarmed CQ first).
    /// Inlined, with the arming out of line: a busy-polling receive
    /// checks it on every message.
    ///
    /// A task that reads the CQ directly is not kept waiting for the
    /// arming either: its pump raises the link's hint instead
    /// ([`Driver::read_again`]), so whoever looks next pumps once more,
    /// and that pump, finding the CQ empty, arms it before it reports
    /// nothing ([`Self::settled`]). The arming then comes after the
    /// receiver used its frames (after its reply was posted, in a ping-pong),
    /// not between.
    #[inline]
    fn arm_again(&mut self, driver: &Driver) -> bool {
        if !self.uses_channel(driver) || self.io.notify().is_armed() {
            return false;
        }
        if self.events_wanted(driver) {
            self.arm(driver);
            return true;
        }
        if driver.reads_directly() {
            driver.read_again();
        }
        false
    }

    /// Whether the engine wants the CQ's events: its own pump, or no
    /// application thread receives here, or the engine task listens.
    #[inline]
    fn events_wanted(&self, driver: &Driver) -> bool {
        self.io.engine_pumping.load(Ordering::Relaxed)
            || !driver.reader_claimed()
            || self.io.notify().is_listening()
    }

    /// Request a completion event.
    #[inline(never)]
    fn arm(&mut self, driver: &Driver) {
        self.io.notify().arm(&self.io.cq, driver.reads_directly());
    }

    /// Before reporting the CQ empty in event mode: the CQ is armed and no
    /// event came since, so the next completion is announced. `false`:
    /// poll again first (a completion may have landed before the arming,
    /// or an event came).
    /// Inlined, with the event mode's part out of line: a busy-polling
    /// `try_recv` checks it on every empty spin.
    #[inline]
    fn settled(&mut self, driver: &Driver) -> bool {
        !self.uses_channel(driver) || self.settled_event(driver)
    }

    /// Whether this pump keeps the CQ armed: in event mode, and in either
    /// mode in the engine's pumps and on a connection an async runtime's
    /// tasks read directly, which wait for the next event (a busy-polling
    /// receiving thread spins and leaves it alone).
    #[inline]
    fn uses_channel(&self, driver: &Driver) -> bool {
        self.event_mode || self.io.engine_pumping.load(Ordering::Relaxed) || driver.reads_directly()
    }

    /// A completion ended the wait that began `since`. It ended at the
    /// spin's last clock reading when this pump spun (at most
    /// [`POLLS_PER_CLOCK`] polls before the completion), so that a message
    /// caught by the spin pays no clock read before its reply; at a clock
    /// read after a sleep, which costs far more. The spin learns its
    /// length at the next pump ([`RcSource::learn`]), not between the
    /// completion and its caller, who may be about to reply.
    #[inline]
    fn waited(&mut self, since: Instant, spin: Option<&SpinClock>) {
        self.unlearned = Some((since, spin.map_or_else(Instant::now, SpinClock::last_reading)));
    }

    /// Learn the wait the last pump's completion ended, if it has not been.
    #[inline]
    fn learn(&mut self) {
        if let Some((since, end)) = self.unlearned.take() {
            self.spin.waited(end.saturating_duration_since(since));
        }
    }

    #[inline(never)]
    fn settled_event(&mut self, driver: &Driver) -> bool {
        if !self.io.notify().is_armed() {
            self.arm(driver);
            return false;
        }
        true
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
        self.learn();
        // Read the clock only once this call has to wait: a busy-polling
        // `try_recv` pumps with no deadline on every spin, and a clock
        // read is a system call on some machines (a TCG guest's HPET).
        let mut spin: Option<SpinClock> = None;
        let mut handled = false;
        let mut spins = 0u32;
        loop {
            let n = self.poll_once(driver);
            if n == POLL_BATCH {
                handled = true;
                continue;
            }
            if n > 0 || handled {
                if self.arm_again(driver) {
                    handled = true;
                    continue;
                }
                if let Some(since) = self.waiting_since.take() {
                    self.waited(since, spin.as_ref());
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
                if self.settled(driver) {
                    return Pumped::Idle;
                }
                continue;
            };
            spins = spins.wrapping_add(1);
            if spin.is_some() && spins % POLLS_PER_CLOCK != 0 {
                continue;
            }
            let now = Instant::now();
            if now >= until {
                if self.arm_again(driver) {
                    continue;
                }
                return Pumped::Idle;
            }
            let clock = spin.get_or_insert_with(|| SpinClock::start(now));
            if self.event_mode {
                // Only a spin that ends learns from the waits: busy
                // polling keeps no account of them.
                self.waiting_since.get_or_insert(now);
            }
            if !self.event_mode || !clock.is_over(now, self.spin.budget()) {
                // Stay on the CPU, but let a thread on this core that would
                // send (the peer, in the same process) go now and then.
                if spins % (4 * POLLS_PER_CLOCK) == 0 {
                    thread::yield_now();
                }
                continue;
            }
            if !self.settled(driver) {
                continue;
            }
            // A sleep on the thread's interrupt lasts until its deadline.
            // Whoever reads the completion channel (the engine, or the
            // sleeping thread that leads it) rings it at the CQ's next
            // completion event; so do the close that every failure and end
            // of the connection comes to, the pool when a buffer a
            // rendezvous waits for comes back, and a local close while the
            // thread waits for credit (`Driver::interrupt`). A starved
            // rendezvous gives up at its own deadline.
            let until = self.io.rendezvous.starved_until().map_or(until, |t| t.min(until));
            let Some(me) = Interrupt::this_thread() else {
                // No eventfd for this thread: look around now and then.
                thread::sleep(until.saturating_duration_since(now).min(NO_INTERRUPT_SLICE));
                continue;
            };
            let Some(_asleep) = self.io.sleeping(&me) else { continue };
            let left = until.saturating_duration_since(now).as_millis().clamp(1, i32::MAX as u128) as i32;
            // Watch the channel too, if no other sleeping thread does.
            let lead = self.io.notify().hub().and_then(|h| h.lead());
            let pollin =
                |fd: BorrowedFd<'_>| libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            let mut fds = [pollin(me.fd()), pollin(me.fd())];
            let n = match &lead {
                Some(l) => {
                    fds[1] = pollin(l.fd());
                    2
                }
                None => 1,
            };
            match poll_in(&mut fds[..n], left) {
                Ok(true) => {
                    if let Some(l) = lead.filter(|_| fds[1].revents != 0) {
                        // Our event, if it came, rings our own eventfd.
                        l.dispatch();
                    }
                    me.clear();
                    // A completion event: poll. Else, if something rang us,
                    // it changed what this pump looks at: the caller looks
                    // again; and if only others' events came, sleep again.
                    if self.io.notify().is_armed() && fds[0].revents != 0 {
                        return Pumped::Idle;
                    }
                }
                Ok(false) => {}
                Err(e) => tracing::debug!(error = %e, "waiting for a completion event failed"),
            }
        }
    }
}
