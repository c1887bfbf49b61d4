//! Waking a connection's engine task: a wake for anything but the writer
//! is never merged into a pending writer's wake. The engine is driven by
//! hand (`Engine::detached`), so each interleaving is exact.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use zerocast_core::ConnError;

use crate::engine::{Cx, Engine, Pending, Progress, Step, Task};
use crate::{Driver, Frame, Wire, WireCtx};

/// A test double for a backend's send path: takes every frame, and
/// counts them.
struct Sink(Arc<AtomicUsize>);

impl Wire for Sink {
    fn write(&mut self, frames: &mut [Frame], _ctx: &WireCtx<'_>) -> Result<(), ConnError> {
        self.0.fetch_add(frames.len(), Ordering::SeqCst);
        Ok(())
    }
}

/// A test double for a backend's read path: nothing ever arrives.
struct Quiet;

impl crate::Source for Quiet {
    fn pump(&mut self, _driver: &Driver, _until: Option<std::time::Instant>) -> crate::Pumped {
        crate::Pumped::Idle
    }
}

/// What a thread does to the connection while the task runs, between its
/// look at the source (or reposts, or completions) and its writer's step:
/// the moment a real backend's task is most exposed.
type Meanwhile = Box<dyn FnMut(&Driver) + Send>;

/// An engine task shaped like a backend's: look around, then the writer.
struct Conn {
    driver: Driver,
    runs: Arc<AtomicUsize>,
    /// Frames its wire took, from the task or from a sending thread.
    written: Arc<AtomicUsize>,
    meanwhile: Option<Meanwhile>,
}

impl Task for Conn {
    fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }

    fn run(&mut self, cx: &mut Cx<'_>) -> Step {
        let run = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        if run == 1 {
            self.driver.attach(Box::new(Sink(self.written.clone())), cx.waker());
        } else if let Some(mut f) = self.meanwhile.take() {
            f(&self.driver);
        }
        let _ = self.driver.drive_writer(false);
        Step::Continue
    }
}

fn driver() -> (crate::Link, Driver) {
    crate::shared::tests::open(8)
}

/// Run until nothing is pending; how many runs the task had in all.
fn settle(progress: &mut Progress, runs: &AtomicUsize) -> usize {
    for _ in 0..100 {
        progress.progress();
        if progress.arm() != Err(Pending) {
            return runs.load(Ordering::SeqCst);
        }
    }
    panic!("the engine never settled");
}

/// A hand-driven engine running one task shaped like a backend's for
/// `d`, run once (attached); the task's run count and the frames its wire
/// took.
struct Attached {
    _engine: Engine,
    progress: Progress,
    runs: Arc<AtomicUsize>,
    written: Arc<AtomicUsize>,
}

fn attached(d: &Driver, meanwhile: Option<Meanwhile>) -> Attached {
    let (engine, mut progress) = Engine::detached("wake-test").unwrap();
    let (runs, written) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    engine.register(Box::new(Conn {
        driver: d.clone(),
        runs: runs.clone(),
        written: written.clone(),
        meanwhile,
    }));
    assert_eq!(settle(&mut progress, &runs), 1, "attached");
    Attached { _engine: engine, progress, runs, written }
}

/// The task runs for its writer (frames were queued), and while it runs,
/// past its look around and before its writer's step, `meanwhile` asks
/// for another run: it gets one.
fn a_wake_during_a_writers_run_is_kept(meanwhile: Meanwhile) {
    let (_link, d) = driver();
    let Attached { mut progress, runs, .. } = attached(&d, Some(meanwhile));
    // Work for the writer: the task is woken for it.
    d.shared.kick();
    assert_eq!(settle(&mut progress, &runs), 3, "the writer's run, then the one asked for during it");
}

#[test]
fn a_backend_wake_during_a_writers_run_is_kept() {
    a_wake_during_a_writers_run_is_kept(Box::new(|d: &Driver| d.wake()));
}

#[test]
fn a_handback_during_a_writers_run_is_kept() {
    a_wake_during_a_writers_run_is_kept(Box::new(|d: &Driver| {
        // The engine found the source taken; the thread that held it lets
        // go now.
        d.install_source(Box::new(Quiet));
        d.shared.handback.store(true, Ordering::SeqCst);
        let _ = d.pump_as(None, false, crate::source::Awaited::Nothing);
    }));
}

#[test]
fn an_unclaim_during_a_writers_run_is_kept() {
    a_wake_during_a_writers_run_is_kept(Box::new(|d: &Driver| {
        d.shared.claimed.store(true, Ordering::SeqCst);
        d.shared.unclaim();
    }));
}

/// Wakes for the writer alone are merged while its step is due.
#[test]
fn writer_wakes_are_merged_until_its_step() {
    let (_link, d) = driver();
    let Attached { mut progress, runs, .. } = attached(&d, None);
    for _ in 0..5 {
        d.shared.kick();
    }
    assert_eq!(settle(&mut progress, &runs), 2, "one run for five kicks");
}

/// A sender that finds a ring's worth of frames queued writes the batch
/// itself, so the queue never spills: with the engine never run again
/// (a task on the runtime this sender keeps busy), every frame but the
/// last few is written, and those few are queued for the engine.
#[test]
fn a_sender_writes_the_ring_it_queued() {
    let (link, d) = crate::shared::tests::open(1024);
    let Attached { mut progress, runs, written, .. } = attached(&d, None);
    let total = 10 * crate::queue::FAST;
    for i in 0..total {
        let buf = link.pool().alloc(8, zerocast_mem::Wait::No).unwrap();
        link.try_send(buf).unwrap();
        assert!(d.shared.tx.len() < crate::queue::FAST, "the queue reached a ring at send {i}");
    }
    let (written, queued) = (written.load(Ordering::SeqCst), d.shared.tx.len());
    assert_eq!(written + queued, total, "{written} written and {queued} queued");
    assert!(written > total - crate::queue::FAST, "only {written} of {total} written");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the engine never ran");
    assert_eq!(settle(&mut progress, &runs), 2, "the engine writes the rest");
    assert!(d.shared.tx.is_empty());
}

/// The engine's writer never waits for a wire a sending thread holds: it
/// leaves the queue to that thread, which wakes it when it lets go, and
/// the writer then writes what is queued.
#[test]
fn the_writer_leaves_a_held_wire_and_is_woken_when_it_is_let_go() {
    let (link, d) = driver();
    let Attached { mut progress, runs, written, .. } = attached(&d, None);
    // A sending thread holds the wire (this one, which the engine would
    // deadlock on if it waited).
    let held = d.shared.wire.0.get().unwrap().lock().unwrap();
    // Sends find the wire taken and queue their frames for the writer,
    // which is woken for them.
    for _ in 0..3 {
        link.try_send(link.pool().alloc(8, zerocast_mem::Wait::No).unwrap()).unwrap();
    }
    assert_eq!(settle(&mut progress, &runs), 2, "the writer ran, and returned");
    assert_eq!(
        (d.shared.tx.len(), written.load(Ordering::SeqCst)),
        (3, 0),
        "nothing written past the held wire"
    );
    drop(held);
    d.shared.hand_writer_back();
    assert_eq!(settle(&mut progress, &runs), 3, "woken when the wire was let go");
    assert_eq!((d.shared.tx.len(), written.load(Ordering::SeqCst)), (0, 3), "and it wrote the queue");
}

/// A writer that found the wire held by a sending thread writing its own
/// frame is woken when that thread lets go only if something is left for
/// it. After a write that left nothing it is not: it would only find the
/// next send holding the wire, ask again and be woken again, send after
/// send. After one that left a backlog, or with frames queued meanwhile,
/// it is.
#[test]
fn a_sender_that_leaves_the_writer_nothing_does_not_wake_it() {
    let (link, d) = driver();
    let Attached { mut progress, runs, written, .. } = attached(&d, None);
    let wire = d.shared.wire.0.get().unwrap();
    // The task runs for the backend, finds the wire held and asks for it.
    let held = wire.lock().unwrap();
    d.wake();
    assert_eq!(settle(&mut progress, &runs), 2, "the backend's run");
    assert!(d.shared.writer_wanted.load(Ordering::SeqCst), "the writer asked for the wire");
    drop(held);
    d.shared.hand_writer_back_after_write(false);
    assert_eq!(settle(&mut progress, &runs), 2, "not woken: the write left nothing");
    assert!(!d.shared.writer_wanted.load(Ordering::SeqCst), "the request was taken back");

    // The same, the write leaving a backlog: woken to flush it.
    let held = wire.lock().unwrap();
    d.wake();
    assert_eq!(settle(&mut progress, &runs), 3);
    drop(held);
    d.shared.hand_writer_back_after_write(true);
    assert_eq!(settle(&mut progress, &runs), 4, "woken for the backlog");

    // The same, a frame queued while the wire was held: woken to write it.
    let held = wire.lock().unwrap();
    link.try_send(link.pool().alloc(8, zerocast_mem::Wait::No).unwrap()).unwrap();
    assert_eq!(settle(&mut progress, &runs), 5, "the run for the queued frame");
    assert_eq!(written.load(Ordering::SeqCst), 0, "nothing written past the held wire");
    drop(held);
    d.shared.hand_writer_back_after_write(false);
    assert_eq!(settle(&mut progress, &runs), 6, "woken for the queued frame");
    assert_eq!((d.shared.tx.len(), written.load(Ordering::SeqCst)), (0, 1), "and it wrote it");
}
