//! The engine driven by hand through `Progress`: readiness, wake-ups and
//! timers each run their task, and `arm` refuses while any is pending.

use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::*;

/// Reads its socket when readable; counts bytes, wake-ups and timers.
struct Echo {
    sock: UnixStream,
    seen: Arc<Counts>,
    timer: Option<Instant>,
    waker: Arc<Mutex<Option<Waker>>>,
}

#[derive(Default)]
struct Counts {
    bytes: AtomicUsize,
    woken: AtomicUsize,
    timers: AtomicUsize,
}

impl Task for Echo {
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.sock.as_fd())
    }

    fn run(&mut self, cx: &mut Cx<'_>) -> Step {
        self.waker.lock().unwrap().get_or_insert_with(|| cx.waker());
        if cx.readable() {
            let mut buf = [0u8; 64];
            match (&self.sock).read(&mut buf) {
                Ok(0) => return Step::Done,
                Ok(n) => {
                    self.seen.bytes.fetch_add(n, Ordering::SeqCst);
                }
                Err(_) => {}
            }
        }
        if cx.woken() {
            self.seen.woken.fetch_add(1, Ordering::SeqCst);
        }
        if cx.timer_due() {
            self.seen.timers.fetch_add(1, Ordering::SeqCst);
            self.timer = None;
        }
        cx.set_interest(Interest { read: true, write: false });
        cx.set_timer(self.timer);
        Step::Continue
    }
}

/// Progress until `arm` succeeds; how many rounds that took.
fn settle(p: &mut Progress) -> usize {
    for round in 1..100 {
        p.progress();
        if p.arm().is_ok() {
            return round;
        }
    }
    panic!("the engine never settled");
}

#[test]
fn progress_and_arm_follow_readiness_wakeups_and_timers() {
    let (engine, mut p) = Engine::detached("test").unwrap();
    let (ours, theirs) = UnixStream::pair().unwrap();
    ours.set_nonblocking(true).unwrap();
    let seen = Arc::new(Counts::default());
    let waker = Arc::new(Mutex::new(None));
    let timer = Some(Instant::now() + Duration::from_millis(30));
    engine.register(Box::new(Echo { sock: ours, seen: seen.clone(), timer, waker: waker.clone() }));
    assert_eq!(p.arm(), Err(Pending), "a registration is pending work");
    settle(&mut p);
    assert_eq!(seen.woken.load(Ordering::SeqCst), 1, "a new task runs once");
    // Armed with the timer's deadline: nothing else is pending.
    let due = p.arm().unwrap().expect("the task's timer");
    assert!(due > Instant::now() - Duration::from_secs(1));

    // Bytes make the descriptor readable: arming fails until they are read.
    (&theirs).write_all(b"hello").unwrap();
    assert_eq!(p.arm(), Err(Pending));
    settle(&mut p);
    assert_eq!(seen.bytes.load(Ordering::SeqCst), 5);

    // A wake-up from another thread, many times over: one run.
    let w = waker.lock().unwrap().clone().unwrap();
    let w2 = w.clone();
    std::thread::spawn(move || (0..10).for_each(|_| w2.wake())).join().unwrap();
    assert_eq!(p.arm(), Err(Pending));
    assert_eq!(w.inner.lock_woken().tokens.len(), 1, "the task is queued once");
    settle(&mut p);
    assert_eq!(seen.woken.load(Ordering::SeqCst), 2, "ten wake-ups, one run");
    // Woken again once it ran: a wake-up after the run is not lost.
    w.wake();
    settle(&mut p);
    assert_eq!(seen.woken.load(Ordering::SeqCst), 3, "a later wake-up, a later run");

    // The timer: arming fails once it is due.
    while Instant::now() < due {
        std::thread::sleep(due - Instant::now());
    }
    assert_eq!(p.arm(), Err(Pending), "a due timer is pending work");
    settle(&mut p);
    assert_eq!(seen.timers.load(Ordering::SeqCst), 1);
    assert_eq!(p.arm(), Ok(None), "no timer left");

    // The peer hangs up: the task ends; with the handle gone, so does the engine.
    drop(theirs);
    settle(&mut p);
    assert!(!p.is_finished(), "a handle is left");
    drop(engine);
    settle(&mut p);
    assert!(p.is_finished());
}

#[test]
fn a_threaded_engine_runs_tasks_and_ends_with_its_last_handle() {
    let engine = Engine::start("zc-test-engine").unwrap();
    let (ours, theirs) = UnixStream::pair().unwrap();
    ours.set_nonblocking(true).unwrap();
    let seen = Arc::new(Counts::default());
    let waker = Arc::new(Mutex::new(None));
    engine.register(Box::new(Echo { sock: ours, seen: seen.clone(), timer: None, waker }));
    (&theirs).write_all(b"abc").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen.bytes.load(Ordering::SeqCst) < 3 {
        assert!(Instant::now() < deadline, "the engine's thread never read");
        std::thread::yield_now();
    }
    let name = |t: &std::fs::DirEntry| std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
    let engines = || {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .flatten()
            .filter(|t| name(t).trim() == "zc-test-engine")
            .count()
    };
    assert_eq!(engines(), 1);
    drop(engine);
    drop(theirs);
    while engines() > 0 {
        assert!(Instant::now() < deadline, "the engine's thread outlived its handles and tasks");
        std::thread::yield_now();
    }
}

/// Wakes the task behind `next` (if any) at each run, `left` times; counts
/// its runs.
struct Relay {
    next: Arc<Mutex<Option<Waker>>>,
    me: Arc<Mutex<Option<Waker>>>,
    runs: Arc<AtomicUsize>,
    left: usize,
}

impl Task for Relay {
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    fn run(&mut self, cx: &mut Cx<'_>) -> Step {
        self.me.lock().unwrap().get_or_insert_with(|| cx.waker());
        self.runs.fetch_add(1, Ordering::SeqCst);
        if self.left > 0 && cx.woken() {
            self.left -= 1;
            if let Some(w) = self.next.lock().unwrap().as_ref() {
                w.wake();
            }
        }
        Step::Continue
    }
}

#[test]
fn a_wake_from_inside_a_turn_runs_in_that_turn_and_a_turn_always_ends() {
    let (engine, mut p) = Engine::detached("test").unwrap();
    let (a_waker, b_waker) = (Arc::new(Mutex::new(None)), Arc::new(Mutex::new(None)));
    let (a_runs, b_runs) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    // Two tasks that wake each other without end.
    let relay =
        |next: &Arc<Mutex<Option<Waker>>>, me: &Arc<Mutex<Option<Waker>>>, runs: &Arc<AtomicUsize>| Relay {
            next: next.clone(),
            me: me.clone(),
            runs: runs.clone(),
            left: usize::MAX,
        };
    engine.register(Box::new(relay(&b_waker, &a_waker, &a_runs)));
    engine.register(Box::new(relay(&a_waker, &b_waker, &b_runs)));
    p.progress();
    let before = (a_runs.load(Ordering::SeqCst), b_runs.load(Ordering::SeqCst));
    // B wakes A from inside the turn: A runs in that same turn, and so on,
    // a bounded number of rounds; then the eventfd carries the rest.
    a_waker.lock().unwrap().clone().unwrap().wake();
    p.progress();
    let after = (a_runs.load(Ordering::SeqCst), b_runs.load(Ordering::SeqCst));
    let relayed = (after.0 - before.0) + (after.1 - before.1);
    assert!(relayed > 2, "wakes from inside the turn ran in it: {before:?} -> {after:?}");
    assert!(relayed <= 2 * (super::run::LOCAL_ROUNDS as usize + 2), "a turn ends: {relayed} runs");
    assert_eq!(p.arm(), Err(Pending), "the relay goes on in the next turn");

    // One wake from inside a turn, then quiet: armed after one progress,
    // with no eventfd write left behind.
    let (c_waker, d_waker) = (Arc::new(Mutex::new(None)), Arc::new(Mutex::new(None)));
    let (c_runs, d_runs) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut c = relay(&d_waker, &c_waker, &c_runs);
    // Its first run (a new task runs as woken) spends one.
    c.left = 2;
    let mut d = relay(&c_waker, &d_waker, &d_runs);
    d.left = 0;
    let (engine2, mut p2) = Engine::detached("test2").unwrap();
    engine2.register(Box::new(d));
    engine2.register(Box::new(c));
    settle(&mut p2);
    let d_before = d_runs.load(Ordering::SeqCst);
    c_waker.lock().unwrap().clone().unwrap().wake();
    p2.progress();
    assert_eq!(d_runs.load(Ordering::SeqCst), d_before + 1, "woken by C in the same turn");
    assert_eq!(p2.arm(), Ok(None), "nothing left pending");
    drop(engine);
}

/// Asks, at each run, how many of its writers' yields the turn allows
/// ([`may_linger`]), and sends the count.
struct Lingers(std::sync::mpsc::Sender<usize>);

impl Task for Lingers {
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    fn run(&mut self, cx: &mut Cx<'_>) -> Step {
        let allowed = (0..2 * usize::from(run::LINGERS_PER_TURN)).take_while(|_| may_linger()).count();
        let _ = self.0.send(allowed);
        if cx.woken() {
            Step::Continue
        } else {
            Step::Done
        }
    }
}

/// Writers yield their core only on an engine's own thread, and a turn
/// allows a few yields in all, however many its writers ask for: an engine
/// driven by a runtime's task shares its thread with the senders, and one
/// thread drives thousands of connections.
#[test]
fn writers_linger_only_on_an_engines_own_thread_and_a_few_times_per_turn() {
    assert!(!may_linger(), "outside any engine");
    let (tx, rx) = std::sync::mpsc::channel();
    let engine = Engine::start("zc-test-linger").unwrap();
    engine.register(Box::new(Lingers(tx.clone())));
    let allowed = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(allowed, usize::from(run::LINGERS_PER_TURN), "asked for twice the turn's allowance");
    let (detached, mut p) = Engine::detached("zc-test-linger-detached").unwrap();
    detached.register(Box::new(Lingers(tx)));
    settle(&mut p);
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 0, "a detached engine's turn");
}

/// While a driving task's waker is set, a task woken from outside the
/// engine's turns wakes that waker, not the engine's descriptor, and the
/// next turn runs the task; without it, the descriptor is rung again.
#[test]
fn a_wake_from_another_thread_reaches_the_driving_tasks_waker_and_no_wake_is_lost() {
    let (engine, mut p) = Engine::detached("test").unwrap();
    let (runs, me) = (Arc::new(AtomicUsize::new(0)), Arc::new(Mutex::new(None)));
    let relay = Relay { next: Arc::new(Mutex::new(None)), me: me.clone(), runs: runs.clone(), left: 0 };
    engine.register(Box::new(relay));
    settle(&mut p);
    let task = me.lock().unwrap().clone().expect("the task ran");
    let (count, driver) = crate::WakeCount::new();
    p.wake_with(Some(&driver));
    assert_eq!(p.arm(), Ok(None));
    let readable = |p: &Progress| {
        let fd = p.fd();
        let mut fds = [rustix::event::PollFd::new(&fd, rustix::event::PollFlags::IN)];
        rustix::event::poll(&mut fds, Some(&rustix::event::Timespec { tv_sec: 0, tv_nsec: 0 })).unwrap() > 0
    };
    let wake = |w: &Waker| {
        let w = w.clone();
        std::thread::spawn(move || w.wake()).join().unwrap();
    };
    wake(&task);
    assert_eq!(count.get(), 1, "the driving task's waker");
    assert!(!readable(&p), "the eventfd was not rung");
    assert!(p.has_quiet_wakeups());
    assert_eq!(p.arm(), Err(Pending), "arm reports the wake-up");
    let before = runs.load(Ordering::SeqCst);
    p.progress();
    assert_eq!(runs.load(Ordering::SeqCst), before + 1, "the next turn runs the task");
    assert!(!p.has_quiet_wakeups());
    assert_eq!(p.arm(), Ok(None));
    p.wake_with(None);
    wake(&task);
    assert_eq!(count.get(), 1, "no waker once unset");
    assert!(readable(&p), "the eventfd rung instead");
    settle(&mut p);
    assert_eq!(runs.load(Ordering::SeqCst), before + 2);
}
