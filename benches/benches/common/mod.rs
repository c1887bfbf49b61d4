//! Criterion settings shared by the bench targets.

use std::time::Duration;

use criterion::Criterion;

/// Ten samples after one second of warm-up, three seconds of measurement:
/// enough to read a rate on a noisy machine, short enough to run every
/// bench in a few minutes. Compare rates only within one run (`ratios`).
pub(crate) fn short() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}
