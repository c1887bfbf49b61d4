//! Turning timestamps into perftest's figures.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

/// One bandwidth (or message-rate) result: a row of the bw table.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct BwRow {
    pub(crate) bytes: usize,
    pub(crate) iterations: u64,
    /// The best of the equal slices the run was cut into (timed at the
    /// sender once the first window was in flight), in Gb/s.
    pub(crate) bw_peak_gbps: f64,
    /// Payload bits delivered over the whole run, in Gb/s.
    pub(crate) bw_avg_gbps: f64,
    /// Messages delivered per second, in millions.
    pub(crate) msg_rate_mpps: f64,
    pub(crate) seconds: f64,
    /// Datagrams sent but not received (`ud://` only; 0 on connections).
    pub(crate) lost: u64,
}

/// One latency result: a row of the lat table, in microseconds, each
/// figure half a round trip (as `ib_send_lat`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct LatRow {
    pub(crate) bytes: usize,
    pub(crate) iterations: u64,
    pub(crate) t_min_us: f64,
    pub(crate) t_max_us: f64,
    /// The median.
    pub(crate) t_typical_us: f64,
    pub(crate) t_avg_us: f64,
    pub(crate) t_stdev_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) p999_us: f64,
    /// The spread of the samples: the half round trip at each of
    /// [`SPREAD_PERCENTILES`], in order.
    pub(crate) spread_us: Vec<f64>,
}

/// The percentiles of [`LatRow::spread_us`]: enough to tell a tight
/// distribution from one with a slow share, which the median alone hides.
pub(crate) const SPREAD_PERCENTILES: [f64; 7] = [5.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0];

/// Sender-side marks of a bandwidth run, one every `slice` messages once
/// the first `window` messages were sent. A slice spans at least four
/// windows: credits come back in bursts, so the sender's pace over less
/// than a window says nothing about delivery.
#[derive(Debug)]
pub(crate) struct Slices {
    window: u64,
    slice: u64,
    marks: Vec<Instant>,
}

/// At most this many marks are kept (a long `-D` run keeps the first ones).
const MAX_MARKS: usize = 1 << 16;

impl Slices {
    /// Marks for a run of `iters` messages (`None`: timed by duration).
    pub(crate) fn new(window: u32, iters: Option<u64>) -> Self {
        let window = u64::from(window);
        let slice = match iters {
            Some(n) => (n.saturating_sub(window) / 100).max(4 * window),
            None => 4 * window,
        };
        Self { window, slice, marks: Vec::with_capacity(128) }
    }

    /// Call after message `i` (0-based) was sent.
    #[inline]
    pub(crate) fn sent(&mut self, i: u64) {
        if i + 1 >= self.window && (i + 1 - self.window) % self.slice == 0 && self.marks.len() < MAX_MARKS {
            self.marks.push(Instant::now());
        }
    }

    /// The best slice's rate in Gb/s for `size`-byte messages, or `None`
    /// when the run had fewer than two marks.
    fn peak_gbps(&self, size: usize) -> Option<f64> {
        let bits = (self.slice * size as u64 * 8) as f64;
        self.marks
            .windows(2)
            .map(|w| w[1].duration_since(w[0]).as_secs_f64())
            .filter(|&dt| dt > 0.0)
            .map(|dt| bits / dt / 1e9)
            .reduce(f64::max)
    }
}

/// A bw row from `delivered` messages of `size` bytes over `elapsed`.
pub(crate) fn bw_row(size: usize, sent: u64, delivered: u64, elapsed: Duration, slices: &Slices) -> BwRow {
    let secs = elapsed.as_secs_f64().max(1e-9);
    let avg = (delivered * size as u64 * 8) as f64 / secs / 1e9;
    // The peak cannot be below the average (a short run has no slices).
    let peak = slices.peak_gbps(size).unwrap_or(avg).max(avg);
    BwRow {
        bytes: size,
        iterations: sent,
        bw_peak_gbps: peak,
        bw_avg_gbps: avg,
        msg_rate_mpps: delivered as f64 / secs / 1e6,
        seconds: secs,
        lost: sent - delivered.min(sent),
    }
}

/// Round-trip samples of a latency run, in ticks of the run's clock
/// (see [`crate::clock`]); [`LatSamples::row`] turns them into half round
/// trips in microseconds.
#[derive(Debug)]
pub(crate) struct LatSamples {
    hist: Histogram<u64>,
    n: u64,
    sum: f64,
    sum_sq: f64,
}

/// The longest round trip a [`LatSamples`] tells apart, in ticks: over an
/// hour at 3 GHz. Longer ones are counted as this.
const MAX_TICKS: u64 = 10_000_000_000_000;

impl LatSamples {
    pub(crate) fn new() -> Self {
        // 3 significant figures.
        let hist = Histogram::new_with_bounds(1, MAX_TICKS, 3).expect("valid histogram bounds");
        Self { hist, n: 0, sum: 0.0, sum_sq: 0.0 }
    }

    /// Record one round trip of `ticks`.
    #[inline]
    pub(crate) fn record(&mut self, ticks: u64) {
        let t = ticks.clamp(1, MAX_TICKS);
        self.hist.saturating_record(t);
        let x = t as f64;
        self.n += 1;
        self.sum += x;
        self.sum_sq += x * x;
    }

    /// The row, with each tick `ns_per_tick` nanoseconds long.
    pub(crate) fn row(&self, size: usize, ns_per_tick: f64) -> LatRow {
        // Half a round trip, in microseconds.
        let us = |ticks: f64| ticks * ns_per_tick / 2e3;
        let at = |q: f64| us(self.hist.value_at_quantile(q) as f64);
        let n = self.n.max(1) as f64;
        let mean = self.sum / n;
        let var = (self.sum_sq / n - mean * mean).max(0.0);
        LatRow {
            bytes: size,
            iterations: self.n,
            t_min_us: us(self.hist.min() as f64),
            t_max_us: us(self.hist.max() as f64),
            t_typical_us: at(0.5),
            t_avg_us: us(mean),
            t_stdev_us: us(var.sqrt()),
            p99_us: at(0.99),
            p999_us: at(0.999),
            spread_us: SPREAD_PERCENTILES.iter().map(|p| at(p / 100.0)).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_figures_are_half_round_trips_in_order() {
        let mut s = LatSamples::new();
        for us in 1..=1000u64 {
            s.record(2_000 * us);
        }
        let r = s.row(64, 1.0);
        assert_eq!(r.iterations, 1000);
        assert!((r.t_min_us - 1.0).abs() < 0.01, "{r:?}");
        assert!((r.t_max_us - 1000.0).abs() < 1.0, "{r:?}");
        assert!((r.t_typical_us - 500.0).abs() < 1.0, "{r:?}");
        assert!((r.t_avg_us - 500.5).abs() < 0.01, "{r:?}");
        assert!((r.t_stdev_us - 288.67).abs() < 0.1, "{r:?}");
        assert!((r.p99_us - 990.0).abs() < 1.0, "{r:?}");
        assert!(r.t_typical_us <= r.p99_us && r.p99_us <= r.p999_us && r.p999_us <= r.t_max_us);
        let expect = SPREAD_PERCENTILES.map(|p| p * 10.0);
        for (got, want) in r.spread_us.iter().zip(expect) {
            assert!((got - want).abs() < 1.0, "{:?} against {expect:?}", r.spread_us);
        }
        assert_eq!(r.spread_us[3], r.t_typical_us, "the middle one is the median");
    }

    #[test]
    fn the_spread_shows_a_slow_share_the_median_hides() {
        // 70% of round trips at 14 µs (half), 30% at 30 µs.
        let mut s = LatSamples::new();
        for i in 0..1000 {
            s.record(if i % 10 < 7 { 28_000 } else { 60_000 });
        }
        let r = s.row(64, 1.0);
        assert!((r.t_typical_us - 14.0).abs() < 0.05, "{r:?}");
        assert!((r.spread_us[4] - 30.0).abs() < 0.05, "p75 in the slow share: {r:?}");
        assert!((r.spread_us[2] - 14.0).abs() < 0.05, "p25 in the fast one: {r:?}");
    }

    #[test]
    fn ticks_become_microseconds_at_the_calibrated_rate() {
        // A 2.5 GHz counter: 0.4 ns per tick; round trips of 70,000 ticks
        // are 28 µs, half of it 14 µs.
        let mut s = LatSamples::new();
        for _ in 0..100 {
            s.record(70_000);
        }
        let r = s.row(64, 0.4);
        for v in [r.t_min_us, r.t_typical_us, r.t_avg_us, r.p99_us, r.t_max_us] {
            assert!((v - 14.0).abs() < 0.02, "{r:?}");
        }
        assert!(r.t_stdev_us.abs() < 1e-9, "{r:?}");
    }

    #[test]
    fn bandwidth_is_payload_bits_over_time() {
        let slices = Slices::new(4, Some(1000));
        let r = bw_row(1000, 1000, 1000, Duration::from_secs(1), &slices);
        assert!((r.bw_avg_gbps - 8e-3).abs() < 1e-12);
        assert!((r.msg_rate_mpps - 1e-3).abs() < 1e-12);
        assert_eq!(r.bw_peak_gbps, r.bw_avg_gbps);
        let lossy = bw_row(1000, 1000, 900, Duration::from_secs(1), &slices);
        assert_eq!(lossy.lost, 100);
    }

    #[test]
    fn slices_mark_after_the_first_window() {
        let mut s = Slices::new(10, Some(10_010));
        assert_eq!(s.slice, 100);
        for i in 0..10_010 {
            s.sent(i);
        }
        assert_eq!(s.marks.len(), 101);
        let mut short = Slices::new(10, Some(210));
        assert_eq!(short.slice, 40, "at least four windows");
        for i in 0..210 {
            short.sent(i);
        }
        assert_eq!(short.marks.len(), 6);
    }
}
