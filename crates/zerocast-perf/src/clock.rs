//! What latency samples are timed with.
//!
//! perftest times `ib_send_lat` with the CPU's cycle counter, and so does
//! zerocast-perf by default: one read costs a few nanoseconds anywhere. The
//! operating system's clock costs a system call where it is not backed by
//! that counter, and there the read perturbs what it measures: in a TCG
//! guest whose clock source is the emulated HPET (the guest boots on its
//! TSC, and its kernel falls back to the HPET when it finds the TSC
//! unstable), one read takes about 1.6 µs, and reading it once per round
//! trip made `lat rc` read some 0.3-0.45 µs slower at 64 B
//! (docs/benchmark-history.md, the twelfth session). The counter's rate is
//! taken from the test itself: counter ticks against the monotonic clock
//! over the whole test, which a few microseconds of error in either end
//! cannot move.

use std::time::Instant;

/// Which clock times the samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ClockKind {
    /// The CPU's cycle counter (x86 TSC, Arm's virtual counter), as
    /// perftest; the monotonic clock on other CPUs.
    Cycles,
    /// The operating system's monotonic clock (`Instant`).
    Monotonic,
}

impl ClockKind {
    /// What this build would use, for headers and JSON.
    pub(crate) fn as_str(self) -> &'static str {
        match self.effective() {
            ClockKind::Cycles => "cycles",
            ClockKind::Monotonic => "monotonic",
        }
    }

    /// What this build would use, in words, for the table's header.
    pub(crate) fn describe(self) -> &'static str {
        match self.effective() {
            ClockKind::Cycles => "the CPU's cycle counter",
            ClockKind::Monotonic => "the monotonic clock",
        }
    }

    fn effective(self) -> Self {
        if HAS_COUNTER {
            self
        } else {
            ClockKind::Monotonic
        }
    }
}

const HAS_COUNTER: bool = cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn counter() -> u64 {
    tick_counter::x86_64_tick_counter()
}

#[cfg(target_arch = "aarch64")]
#[inline(always)]
fn counter() -> u64 {
    tick_counter::aarch64_tick_counter()
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
#[inline(always)]
fn counter() -> u64 {
    0
}

/// A running clock for one test: [`SampleClock::now`] in ticks, and at the
/// end how many nanoseconds a tick was.
#[derive(Debug)]
pub(crate) struct SampleClock {
    cycles: bool,
    start: Instant,
    start_ticks: u64,
    /// Samples in which the counter went backwards (a thread moved between
    /// CPUs whose counters disagree): recorded as zero.
    backwards: u64,
}

impl SampleClock {
    pub(crate) fn start(kind: ClockKind) -> Self {
        let cycles = kind.effective() == ClockKind::Cycles;
        let start = Instant::now();
        let start_ticks = if cycles { counter() } else { 0 };
        Self { cycles, start, start_ticks, backwards: 0 }
    }

    /// Now, in ticks of this clock.
    #[inline(always)]
    pub(crate) fn now(&self) -> u64 {
        if self.cycles {
            counter()
        } else {
            self.start.elapsed().as_nanos() as u64
        }
    }

    /// Ticks from `earlier` to `later`, counting a step backwards.
    #[inline]
    pub(crate) fn between(&mut self, earlier: u64, later: u64) -> u64 {
        if later < earlier {
            self.backwards += 1;
        }
        later.saturating_sub(earlier)
    }

    /// Stop: nanoseconds per tick over the whole test, and how many
    /// samples went backwards.
    pub(crate) fn finish(&self) -> Calibration {
        let ns_per_tick = if self.cycles {
            let ticks = counter().wrapping_sub(self.start_ticks);
            let ns = self.start.elapsed().as_nanos() as f64;
            if ticks == 0 || ticks > u64::MAX / 2 {
                f64::NAN
            } else {
                ns / ticks as f64
            }
        } else {
            1.0
        };
        Calibration { ns_per_tick, backwards: self.backwards }
    }
}

/// What a finished [`SampleClock`] measured of itself.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Calibration {
    pub(crate) ns_per_tick: f64,
    pub(crate) backwards: u64,
}

impl Calibration {
    /// Whether the samples can be trusted: a finite, plausible rate (a
    /// counter between 10 MHz and 100 GHz), and no sample that ran
    /// backwards.
    pub(crate) fn check(&self) -> Result<(), String> {
        if !(0.01..=100.0).contains(&self.ns_per_tick) {
            return Err(format!(
                "the cycle counter ran at an implausible rate ({:.3} ns per tick)",
                self.ns_per_tick
            ));
        }
        if self.backwards > 0 {
            return Err(format!("the cycle counter went backwards in {} samples", self.backwards));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_tick_is_calibrated_against_the_monotonic_clock() {
        for kind in [ClockKind::Cycles, ClockKind::Monotonic] {
            let mut c = SampleClock::start(kind);
            let t0 = c.now();
            std::thread::sleep(Duration::from_millis(30));
            let t1 = c.now();
            let cal = c.finish();
            cal.check().unwrap();
            let ns = c.between(t0, t1) as f64 * cal.ns_per_tick;
            assert!((29e6..200e6).contains(&ns), "{kind:?}: 30 ms measured as {ns} ns");
        }
    }

    #[test]
    fn a_step_backwards_is_counted_and_fails_the_check() {
        let mut c = SampleClock::start(ClockKind::Monotonic);
        assert_eq!(c.between(10, 4), 0);
        assert_eq!(c.between(4, 10), 6);
        let cal = c.finish();
        assert_eq!(cal.backwards, 1);
        assert!(cal.check().unwrap_err().contains("backwards"));
        let bad = Calibration { ns_per_tick: f64::NAN, backwards: 0 };
        assert!(bad.check().unwrap_err().contains("implausible"));
    }
}
