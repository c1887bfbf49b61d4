//! A progress bar on stderr, shown only once a run has taken a while (and
//! only on a terminal: indicatif hides it otherwise).

use std::cell::Cell;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Runs shorter than this never show a bar.
const SHOW_AFTER: Duration = Duration::from_secs(1);

/// Steps per test on the bar.
const PER_TEST: u64 = 1000;

/// Progress over a list of tests.
#[derive(Debug)]
pub(crate) struct Progress {
    bar: ProgressBar,
    start: Instant,
    enabled: bool,
    shown: Cell<bool>,
    test: Cell<u64>,
}

impl Progress {
    pub(crate) fn new(tests: usize, enabled: bool) -> Self {
        let bar = ProgressBar::with_draw_target(Some(tests as u64 * PER_TEST), ProgressDrawTarget::hidden());
        bar.set_style(
            ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar} {percent:>3}% {msg}")
                .expect("valid template"),
        );
        Self { bar, start: Instant::now(), enabled, shown: Cell::new(false), test: Cell::new(0) }
    }

    /// A test starts; `what` names it on the bar.
    pub(crate) fn test_start(&self, index: usize, what: String) {
        self.test.set(index as u64);
        self.bar.set_message(what);
        self.test_at(0.0);
    }

    /// The current test is `fraction` done.
    pub(crate) fn test_at(&self, fraction: f64) {
        if self.enabled && !self.shown.get() && self.start.elapsed() >= SHOW_AFTER {
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
            self.shown.set(true);
        }
        let within = (fraction.clamp(0.0, 1.0) * PER_TEST as f64) as u64;
        self.bar.set_position(self.test.get() * PER_TEST + within);
    }

    /// Remove the bar; output written before this stays, since rows go to
    /// stdout and the bar to stderr.
    pub(crate) fn finish(&self) {
        self.bar.finish_and_clear();
    }

    /// Print a line without tearing the bar.
    pub(crate) fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        self.bar.suspend(f)
    }
}
