//! How long a receiving thread polls before it sleeps: a pure policy, fed
//! the thread's own clock readings (time is passed in).
//!
//! A receiving thread that finds nothing polls its source for a while
//! before it sleeps: a message that comes within the spin is taken on the
//! same core with no wake-up, and a wake-up (an event, a system call, on a
//! virtual machine often an interrupt to a halted vCPU) costs more than
//! the spin. A fixed spin of wall time fails in two ways:
//!
//! - **waits just longer than the spin.** Every message then pays the spin
//!   *and* the sleep and the wake. An emulated 4 KiB RC round trip, for
//!   one, outlasts a 50 µs spin.
//! - **time off the CPU.** On a loaded host the spinning thread is
//!   preempted; the wall clock runs on while it does not, and the spin ends
//!   though the thread hardly polled. Each message then sleeps, and its
//!   wake-up on that loaded host costs far more than a poll.
//!
//! So [`SpinPolicy`] sizes the spin from the waits that ended in a message
//! (twice their recent typical length, between a floor and a cap), and
//! [`SpinClock`] counts against it only the time between two close clock
//! readings: a gap longer than [`OFF_CPU_GAP`] is time the thread was not
//! running (or gave away by yielding). A spin still ends after
//! [`MAX_WALL`] of wall time (or its budget, if longer), so that a thread
//! that is never left running long does not poll an idle source for ever.

use std::time::{Duration, Instant};

/// Two clock readings of a spinning thread further apart than this: it was
/// off its CPU in between, and the gap does not count as spinning. Far
/// above the time a thread takes between two readings while it runs (a
/// batch of polls: microseconds, even under emulation).
pub const OFF_CPU_GAP: Duration = Duration::from_micros(100);

/// A spin ends after this much wall time (or its budget, if longer),
/// however little of it the thread ran: long enough to ride out the
/// preemptions of a loaded host, short enough that polling an idle source
/// on one costs little.
pub const MAX_WALL: Duration = Duration::from_millis(10);

/// The spin's length, learned from the waits that ended in a message.
///
/// In whole nanoseconds: a receiving thread learns from every message, and
/// `Duration`'s arithmetic carries between seconds and nanoseconds with
/// divisions, which an emulated CPU pays for in calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpinPolicy {
    floor: u64,
    cap: u64,
    /// A moving average of recent waits (those up to `cap`; a longer one
    /// halves it, as no spin would have caught it).
    typical: u64,
}

impl SpinPolicy {
    /// A policy that spins for at least `floor` and at most `cap`; it
    /// starts at `floor`.
    pub const fn new(floor: Duration, cap: Duration) -> Self {
        Self { floor: nanos(floor), cap: nanos(cap), typical: 0 }
    }

    /// How long the next spin polls (in time on the CPU, see [`SpinClock`]).
    pub fn budget(&self) -> Duration {
        Duration::from_nanos((self.typical * 2).clamp(self.floor, self.cap.max(self.floor)))
    }

    /// A wait, from the first empty poll to the message, spun or slept.
    pub fn waited(&mut self, wait: Duration) {
        let wait = nanos(wait);
        // `typical` and `wait` are at most the cap here (see `nanos`).
        self.typical = if wait <= self.cap { (self.typical * 3 + wait) / 4 } else { self.typical / 2 };
    }
}

/// `d` in nanoseconds, at most `u64::MAX / 8` (about 73 years): far beyond
/// any spin, and small enough that the policy's sums do not overflow.
const fn nanos(d: Duration) -> u64 {
    let n = d.as_nanos();
    let max = (u64::MAX / 8) as u128;
    (if n > max { max } else { n }) as u64
}

/// One spin in progress: the time it has polled, by the spinning thread's
/// own clock readings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpinClock {
    started: Instant,
    last: Instant,
    spun: Duration,
}

impl SpinClock {
    /// A spin whose first empty poll was at `now`.
    pub fn start(now: Instant) -> Self {
        Self { started: now, last: now, spun: Duration::ZERO }
    }

    /// Take a reading: `true` once the spin has used up `budget` of time
    /// on the CPU (or [`MAX_WALL`] of wall time).
    pub fn is_over(&mut self, now: Instant, budget: Duration) -> bool {
        let gap = now.saturating_duration_since(self.last);
        if gap <= OFF_CPU_GAP {
            self.spun += gap;
        }
        self.last = now;
        self.spun >= budget || self.waited(now) >= MAX_WALL.max(budget)
    }

    /// When the last reading was taken.
    pub fn last_reading(&self) -> Instant {
        self.last
    }

    /// Wall time since the spin's first empty poll.
    pub fn waited(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.started)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn the_budget_starts_at_the_floor_and_follows_the_waits_up_to_the_cap() {
        let mut p = SpinPolicy::new(50 * US, 500 * US);
        assert_eq!(p.budget(), 50 * US);
        for _ in 0..8 {
            p.waited(10 * US);
        }
        assert_eq!(p.budget(), 50 * US, "short waits keep the floor");
        for _ in 0..32 {
            p.waited(160 * US);
        }
        let b = p.budget();
        assert!(b > 300 * US && b <= 320 * US, "twice a steady 160 µs wait: {b:?}");
        for _ in 0..32 {
            p.waited(400 * US);
        }
        assert_eq!(p.budget(), 500 * US, "capped");
    }

    #[test]
    fn waits_no_spin_would_catch_shrink_the_budget() {
        let mut p = SpinPolicy::new(50 * US, 500 * US);
        for _ in 0..32 {
            p.waited(200 * US);
        }
        assert!(p.budget() > 350 * US);
        // An idle connection: waits of seconds.
        for _ in 0..4 {
            p.waited(Duration::from_secs(1));
        }
        assert_eq!(p.budget(), 50 * US);
    }

    #[test]
    fn time_off_the_cpu_does_not_count_against_the_spin() {
        let t0 = Instant::now();
        let mut c = SpinClock::start(t0);
        let budget = 50 * US;
        // Polling in steps of 10 µs, preempted for 2 ms after 30 µs.
        let mut now = t0;
        for _ in 0..3 {
            now += 10 * US;
            assert!(!c.is_over(now, budget));
        }
        now += 2000 * US;
        assert!(!c.is_over(now, budget), "the preemption is not spinning");
        now += 10 * US;
        assert!(!c.is_over(now, budget));
        now += 10 * US;
        assert!(c.is_over(now, budget), "50 µs polled");
        assert_eq!(c.waited(now), 2050 * US);
    }

    #[test]
    fn a_spin_that_never_runs_long_still_ends_by_the_wall_clock() {
        let t0 = Instant::now();
        let mut c = SpinClock::start(t0);
        let budget = 50 * US;
        let mut now = t0;
        let mut readings = 0;
        while !c.is_over(now, budget) {
            now += OFF_CPU_GAP + US;
            readings += 1;
            assert!(readings <= 100, "the spin did not end");
        }
        assert!(c.waited(now) >= MAX_WALL);
        assert!(c.waited(now) < MAX_WALL + OFF_CPU_GAP + US);
    }

    #[test]
    fn durations_beyond_any_spin_do_not_overflow() {
        let mut p = SpinPolicy::new(Duration::MAX, Duration::MAX);
        for _ in 0..4 {
            p.waited(Duration::MAX);
        }
        assert_eq!(p.budget(), Duration::from_nanos(u64::MAX / 8), "clamped, not wrapped");
        p.waited(Duration::ZERO);
        assert!(p.budget() >= Duration::from_nanos(u64::MAX / 8), "the floor holds");
    }

    #[test]
    fn a_floor_above_the_cap_wins() {
        let p = SpinPolicy::new(80 * US, 20 * US);
        assert_eq!(p.budget(), 80 * US);
    }
}
