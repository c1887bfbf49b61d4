//! A registration that reads directly ([`crate::Link::read_directly`]):
//! the application pumps the source only when told its descriptor is
//! readable, the engine leaves the reading to it, and what others deliver
//! is reported. The source is a test double that hands over scripted
//! batches and counts its pumps and readiness hints.

use std::collections::VecDeque;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use zerocast_core::{FrameKind, Header, RecvError};
use zerocast_mem::{Pool, Wait};

use crate::{Driver, Link, Notify, Pumped, Source};

/// A scripted pump: data frames numbered in order, and whether the
/// source then asks to be read again before it announces anything
/// ([`Driver::read_again`], as an RDMA source that left its CQ unarmed).
type Batch = (std::ops::Range<u32>, bool);

/// Where the next pump stops, once, after it has looked at its script: it
/// says so on the first and waits on the second to let go, as a pump that
/// looked before news came and still holds the source.
type Hold = Arc<Mutex<Option<(Sender<()>, Receiver<()>)>>>;

/// A test double for a backend's read path: each pump hands the driver
/// the next scripted batch of data frames, numbered in order.
struct Scripted {
    pool: Pool,
    batches: Arc<Mutex<VecDeque<Batch>>>,
    pumps: Arc<AtomicUsize>,
    hints: Arc<AtomicUsize>,
    hold: Hold,
}

impl Source for Scripted {
    fn pump(&mut self, driver: &Driver, _until: Option<Instant>) -> Pumped {
        self.pumps.fetch_add(1, Ordering::SeqCst);
        let next = self.batches.lock().unwrap().pop_front();
        if let Some((entered, release)) = self.hold.lock().unwrap().take() {
            entered.send(()).unwrap();
            release.recv().unwrap();
        }
        let Some((batch, again)) = next else { return Pumped::Idle };
        if again {
            driver.read_again();
        }
        for seq in batch {
            let mut buf = self.pool.alloc(4, Wait::No).unwrap();
            buf.copy_from_slice(&seq.to_le_bytes());
            driver.on_frame(Header::new(FrameKind::Data, 0, seq, 4), Some(buf)).unwrap();
        }
        Pumped::Frames
    }

    fn readable(&mut self) {
        self.hints.fetch_add(1, Ordering::SeqCst);
    }
}

/// A notifier that counts its reports (the batch tests use it too).
#[derive(Default)]
pub(crate) struct Count(pub(crate) AtomicUsize);

impl Notify for Count {
    fn notify(&self, _token: usize) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

struct Fixture {
    link: Link,
    driver: Driver,
    batches: Arc<Mutex<VecDeque<Batch>>>,
    pumps: Arc<AtomicUsize>,
    hints: Arc<AtomicUsize>,
    hold: Hold,
    notified: Arc<Count>,
}

impl Fixture {
    /// A link whose source has a descriptor (`with_fd`), not yet registered.
    fn new(with_fd: bool) -> Self {
        let (link, driver, pool) = crate::test_link();
        let (batches, pumps, hints, hold) = (Arc::default(), Arc::default(), Arc::default(), Hold::default());
        let source = Scripted {
            pool,
            batches: Arc::clone(&batches),
            pumps: Arc::clone(&pumps),
            hints: Arc::clone(&hints),
            hold: Arc::clone(&hold),
        };
        driver.install_source(Box::new(source));
        if with_fd {
            let (a, _b) = UnixStream::pair().unwrap();
            driver.set_source_fd(Arc::new(a));
        }
        Self { link, driver, batches, pumps, hints, hold, notified: Arc::default() }
    }

    /// The engine's pump (at its timer), on another thread, stopped while
    /// it holds the source, having found nothing: `let_go` lets it return.
    fn engine_pump_held(&self) -> impl FnOnce() {
        let ((entered, at_hold), (let_go, release)) = (channel(), channel());
        *self.hold.lock().unwrap() = Some((entered, release));
        let driver = self.driver.clone();
        let engine = std::thread::spawn(move || driver.try_pump(None));
        at_hold.recv().unwrap();
        move || {
            let_go.send(()).unwrap();
            assert_eq!(engine.join().unwrap(), Some(Pumped::Idle));
        }
    }

    fn notified(&self) -> usize {
        self.notified.0.load(Ordering::SeqCst)
    }

    fn direct() -> Self {
        let f = Self::new(true);
        assert!(f.link.read_directly(f.notified.clone(), 7));
        f
    }

    fn script(&self, batch: std::ops::Range<u32>) {
        self.batches.lock().unwrap().push_back((batch, false));
    }

    /// A batch after which the source asks to be read again.
    fn script_again(&self, batch: std::ops::Range<u32>) {
        self.batches.lock().unwrap().push_back((batch, true));
    }

    fn seq(&self) -> u32 {
        let m = self.link.try_recv().expect("a message");
        u32::from_le_bytes(m[..4].try_into().unwrap())
    }

    fn pumps(&self) -> usize {
        self.pumps.load(Ordering::SeqCst)
    }
}

#[test]
fn only_a_source_with_a_descriptor_reads_directly_and_only_once_registered() {
    let f = Fixture::new(false);
    assert!(f.link.source_fd().is_none());
    assert!(!f.link.read_directly(f.notified.clone(), 0), "no descriptor to watch");
    assert!(!f.link.reads_directly());
    let f = Fixture::new(true);
    assert!(f.link.source_fd().is_some());
    assert!(f.link.read_directly(f.notified.clone(), 0));
    assert!(f.link.reads_directly());
    assert!(f.driver.reader_claimed(), "the engine leaves the reading to the application");
    assert!(!f.link.read_directly(f.notified.clone(), 0), "one registration per connection");
    assert!(!f.link.notify_on_ready(f.notified.clone(), 0), "one registration per connection");
}

#[test]
fn the_source_is_pumped_only_after_its_descriptor_was_seen_readable() {
    let f = Fixture::direct();
    f.script(0..3);
    // A fresh registration looks once: something may be there already.
    assert_eq!(f.seq(), 0);
    assert_eq!((f.pumps(), f.hints.load(Ordering::SeqCst)), (1, 1));
    assert_eq!((f.seq(), f.seq()), (1, 2), "the rest of the pump, queued in order");
    f.script(3..4);
    for _ in 0..3 {
        assert!(matches!(f.link.try_recv(), Err(RecvError::Empty)));
    }
    assert_eq!(f.pumps(), 1, "no readiness, no pump: the reactor is asked instead");
    f.link.source_readable();
    assert_eq!(f.seq(), 3);
    assert_eq!((f.pumps(), f.hints.load(Ordering::SeqCst)), (2, 2), "one pump per readiness, told so");
    assert!(matches!(f.link.try_recv(), Err(RecvError::Empty)));
    assert_eq!(f.pumps(), 2);
}

#[test]
fn a_source_that_asks_to_be_read_again_is_pumped_until_it_is_ready_to_announce() {
    let f = Fixture::direct();
    // Frames with no message (credit, say) from a source left unarmed:
    // the look pumps once more, which finds nothing and leaves it armed.
    f.script_again(0..0);
    assert!(matches!(f.link.try_recv(), Err(RecvError::Empty)));
    assert_eq!(f.pumps(), 2, "a look that found no message after such frames pumps again");
    // A message from a source left unarmed: handed over, and the next look
    // pumps with no readiness, for the source announces nothing meanwhile.
    f.link.source_readable();
    f.script_again(0..1);
    assert_eq!(f.seq(), 0);
    assert_eq!(f.pumps(), 3);
    f.script(1..2);
    assert_eq!(f.seq(), 1, "the next look read the source with no readiness reported");
    assert_eq!(f.pumps(), 4);
    assert!(matches!(f.link.try_recv(), Err(RecvError::Empty)));
    assert_eq!(f.pumps(), 4, "a source left ready waits for its readiness again");
}

#[test]
fn what_others_deliver_is_reported_once_to_an_armed_registration() {
    let f = Fixture::direct();
    assert!(matches!(f.link.try_recv(), Err(RecvError::Empty)), "armed now");
    assert_eq!(f.notified.0.load(Ordering::SeqCst), 0);
    // The engine at its timer (or a pump for credit) reads two frames.
    f.script(0..2);
    assert_eq!(f.driver.try_pump(None), Some(Pumped::Frames));
    assert_eq!(f.notified.0.load(Ordering::SeqCst), 1, "one report for both");
    assert_eq!((f.seq(), f.seq()), (0, 1));
}

#[test]
fn a_credit_waiter_pumps_only_on_readiness_and_queues_what_it_reads() {
    let f = Fixture::direct();
    assert!(matches!(f.link.try_recv(), Err(RecvError::Empty)), "armed now");
    f.script(0..2);
    assert!(!f.link.pump_for_credit(), "no readiness");
    assert_eq!(f.pumps(), 1);
    f.link.source_readable();
    assert!(f.link.pump_for_credit());
    assert_eq!(f.pumps(), 2);
    assert_eq!(f.notified.0.load(Ordering::SeqCst), 1, "the receiver is told");
    assert_eq!((f.seq(), f.seq()), (0, 1));
}

#[test]
fn a_registration_that_stops_reading_directly_hands_the_reading_back_to_the_engine() {
    let f = Fixture::direct();
    assert!(f.driver.reader_claimed());
    f.link.stop_reading_directly();
    assert!(!f.link.reads_directly());
    assert!(!f.driver.reader_claimed(), "the engine reads again");
    f.script(0..1);
    f.link.source_readable();
    assert!(matches!(f.link.try_recv(), Err(RecvError::Empty)));
    assert_eq!(f.pumps(), 0, "the application no longer pumps");
    assert!(!f.link.pump_for_credit());
    assert_eq!(f.driver.try_pump(None), Some(Pumped::Frames));
    assert_eq!(f.notified.0.load(Ordering::SeqCst), 1);
    assert_eq!(f.seq(), 0);
}

/// A test double for a descriptor shared by several connections' sources:
/// its dispatch raises the signals it holds, as a completion channel's
/// events raise their CQs'.
struct Channel {
    fd: UnixStream,
    raised: Mutex<Vec<crate::SourceSignal>>,
}

impl std::os::fd::AsFd for Channel {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl crate::SharedSource for Channel {
    fn dispatch(&self) {
        for signal in self.raised.lock().unwrap().drain(..) {
            signal.raise();
        }
    }
}

/// Two links on one shared source, the first registered to read directly.
fn shared_pair() -> (Fixture, Fixture, Arc<Channel>) {
    let channel = Arc::new(Channel { fd: UnixStream::pair().unwrap().0, raised: Mutex::default() });
    let (a, b) = (Fixture::new(false), Fixture::new(false));
    for f in [&a, &b] {
        f.driver.set_shared_source(channel.clone());
    }
    assert!(a.link.read_directly(a.notified.clone(), 0), "a shared descriptor is one to watch");
    assert!(b.link.notify_on_ready(b.notified.clone(), 0));
    (a, b, channel)
}

#[test]
fn a_shared_source_reads_directly_and_its_signal_wakes_only_its_own_connection() {
    let (a, b, channel) = shared_pair();
    assert!(a.link.source_fd().is_none() && a.link.shared_source().is_some());
    assert!(a.driver.reads_directly() && !b.driver.reads_directly());
    let same = |x: &Arc<dyn crate::SharedSource>, y: &Arc<dyn crate::SharedSource>| {
        std::ptr::addr_eq(Arc::as_ptr(x), Arc::as_ptr(y))
    };
    assert!(same(&a.link.shared_source().unwrap(), &b.link.shared_source().unwrap()));
    // The fresh registration looks once, finds nothing and arms.
    assert!(matches!(a.link.try_recv(), Err(RecvError::Empty)));
    assert_eq!(a.pumps(), 1);
    a.script(0..2);
    assert!(matches!(a.link.try_recv(), Err(RecvError::Empty)));
    assert_eq!(a.pumps(), 1, "no signal, no pump");
    // The channel announces `a`'s news: its waiters are told at once (the
    // signal is the readiness), whether or not the registration is armed.
    channel.raised.lock().unwrap().push(a.driver.signal());
    crate::SharedSource::dispatch(&*channel);
    assert_eq!(a.notified.0.load(Ordering::SeqCst), 1, "the waiting task is woken");
    assert_eq!(b.notified.0.load(Ordering::SeqCst), 0, "another connection's task is not");
    assert_eq!((a.seq(), a.seq()), (0, 1));
    assert_eq!(a.pumps(), 2, "one pump per signal");
    // A signal for a connection its engine reads wakes no task (its
    // engine's own wake-up covers it) and leaves its reading to the engine.
    b.script(0..1);
    b.driver.signal().raise();
    assert_eq!(b.notified.0.load(Ordering::SeqCst), 0);
    assert!(matches!(b.link.try_recv(), Err(RecvError::Empty)));
    assert_eq!(b.pumps(), 0);
}

#[test]
fn a_signal_outliving_its_connection_does_nothing() {
    let (a, _b, _channel) = shared_pair();
    let signal = a.driver.signal();
    let notified = a.notified.clone();
    drop(a);
    signal.raise();
    assert_eq!(notified.0.load(Ordering::SeqCst), 0);
}

#[test]
fn a_credit_waiter_on_a_shared_source_pumps_on_its_signal() {
    let (a, _b, _channel) = shared_pair();
    assert!(matches!(a.link.try_recv(), Err(RecvError::Empty)), "armed now");
    a.script(0..1);
    assert!(!a.link.pump_for_credit(), "no signal");
    a.driver.signal().raise();
    assert!(a.link.pump_for_credit());
    assert_eq!(a.seq(), 0);
}

#[test]
fn news_that_finds_the_engine_pumping_wakes_the_task_once_the_engine_lets_go() {
    let (a, _b, _channel) = shared_pair();
    assert!(matches!(a.link.try_recv(), Err(RecvError::Empty)), "armed now");
    // The engine pumps at its timer and looks before news comes; the news
    // (the completion channel's event, spent) wakes the task, whose look
    // finds the source held.
    let let_go = a.engine_pump_held();
    a.script(0..1);
    a.driver.signal().raise();
    assert_eq!(a.notified(), 1);
    assert!(matches!(a.link.try_recv(), Err(RecvError::Empty)), "the source is held");
    let_go();
    assert_eq!(a.notified(), 2, "the task is woken again once the engine lets go");
    assert_eq!(a.seq(), 0, "and its look reads the news");
}

#[test]
fn a_credit_waiter_that_finds_the_engine_pumping_is_woken_once_it_lets_go() {
    let (a, _b, _channel) = shared_pair();
    assert!(matches!(a.link.try_recv(), Err(RecvError::Empty)), "armed now");
    let let_go = a.engine_pump_held();
    a.script(0..1);
    a.driver.signal().raise();
    assert!(a.link.pump_for_credit(), "it tried");
    let before = a.notified();
    let_go();
    assert_eq!(a.notified(), before + 1, "the waiters are woken once the engine lets go");
    assert!(a.link.pump_for_credit(), "the hint stayed up for their next look");
    assert_eq!(a.seq(), 0);
}
