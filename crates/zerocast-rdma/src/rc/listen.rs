//! What the `rc://` and `rc+oob://` listeners share: accepting and every
//! handshake are engine tasks (see `cm_path` and `oob`), and `accept`
//! takes the handshaken connections, in the order their handshakes
//! finish.
//!
//! A peer that stalls holds one small task until the deadline on its
//! whole handshake; it never holds a thread and never delays another
//! peer. A failed handshake, or a peer that a full shared receive queue
//! turns away, is counted and logged, never handed to `accept`.

use std::os::fd::BorrowedFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver, Sender};
use zerocast_core::{AcceptError, ConnectError, Endpoint, LinkConfig, ListenerStats};
use zerocast_link::engine::{Cx, Interest, Step, Task, Waker};
use zerocast_link::{Backlog, CloseSignal, ListenerCounters};

use super::srq::SharedRecv;
use super::{RcConnection, RcError, RcTransport, SrqStats};

/// Handshaken connections `accept` has not taken yet, at most: past this,
/// connect requests wait (in rdma_cm's queue, or the listen queue) until
/// `accept` catches up.
pub(super) const BACKLOG: usize = 1024;
/// Peers taken per run, so other tasks get their turn.
const ACCEPT_BURST: usize = 64;
/// How long accepting pauses while the process is short of descriptors
/// or memory. (While `accept` is behind, it waits for `accept` instead.)
const PAUSE: Duration = Duration::from_millis(10);

/// Where a listener's peers come in: the listening id's event channel, or
/// the listening socket.
pub(super) trait Intake: Send {
    /// The descriptor that is readable while a peer waits.
    fn fd(&self) -> BorrowedFd<'_>;

    /// Take the next peer and start its handshake, as a task spawned on
    /// `cx` (or count it as failed).
    fn take(&mut self, shared: &Arc<Shared>, cx: &mut Cx<'_>) -> Taken;
}

/// What [`Intake::take`] found.
pub(super) enum Taken {
    /// A peer (or an event that was not one): look for more.
    One,
    /// Nothing is waiting.
    Nothing,
    /// The process is short of something: pause, then try again.
    Pause,
    /// The listener is broken: `accept` reports this.
    Fatal(ConnectError),
}

/// A listener's accepting task: it takes what its intake has, a burst at
/// a time, is held while `accept` is behind (until an `accept` wakes it),
/// and ends (with its listening id or socket) once the listener closes.
pub(super) struct AcceptTask<I> {
    intake: I,
    shared: Arc<Shared>,
    registered: bool,
    /// Taking peers waits for the pause's timer, or for `accept`.
    paused: bool,
}

impl<I: Intake> AcceptTask<I> {
    pub(super) fn new(intake: I, shared: Arc<Shared>) -> Self {
        Self { intake, shared, registered: false, paused: false }
    }
}

impl<I: Intake> Task for AcceptTask<I> {
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.intake.fd())
    }

    fn run(&mut self, cx: &mut Cx<'_>) -> Step {
        if !self.registered {
            self.shared.set_accepting(cx.waker());
            self.shared.backlog.set_task(&cx.waker());
            self.registered = true;
        }
        if self.shared.close.is_closed() {
            return Step::Done;
        }
        if self.paused && !cx.timer_due() && !cx.woken() {
            return Step::Continue;
        }
        self.paused = false;
        cx.set_timer(None);
        for _ in 0..ACCEPT_BURST {
            if self.shared.backlog.hold(|| self.shared.behind()) {
                // The `accept` that makes room wakes us.
                self.paused = true;
                break;
            }
            match self.intake.take(&self.shared, cx) {
                Taken::One => {}
                Taken::Nothing => break,
                Taken::Pause => {
                    self.paused = true;
                    cx.set_timer(Some(cx.now() + PAUSE));
                    break;
                }
                Taken::Fatal(err) => {
                    self.shared.fatal(err);
                    return Step::Done;
                }
            }
        }
        cx.set_interest(Interest { read: !self.paused, write: false });
        Step::Continue
    }
}

/// What a listener and its tasks share.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) close: CloseSignal,
    pub(super) counters: ListenerCounters,
    pub(super) transport: RcTransport,
    pub(super) link: LinkConfig,
    pub(super) local: Endpoint,
    /// The shared receive queue of the accepted connections, if any.
    pub(super) srq: Option<Arc<SharedRecv>>,
    /// Handshaken connections, or the error that ended the listener.
    tx: Sender<Result<RcConnection, ConnectError>>,
    /// The accepting task, woken by a close.
    accepting: Mutex<Option<Waker>>,
    /// Holds the accepting task while `accept` is behind.
    backlog: Backlog,
}

impl Shared {
    /// A handshaken connection, for `accept` (dropped if the listener
    /// closed meanwhile).
    pub(super) fn deliver(&self, conn: RcConnection) {
        if !self.close.is_closed() {
            let _ = self.tx.send(Ok(conn));
            self.close.queued();
        }
    }

    /// The listener itself failed: `accept` reports it.
    pub(super) fn fatal(&self, err: ConnectError) {
        let _ = self.tx.send(Err(err));
        self.close.queued();
    }

    /// Whether `accept` is behind by [`BACKLOG`] connections.
    pub(super) fn behind(&self) -> bool {
        self.tx.len() >= BACKLOG
    }

    /// Count a peer the listener could not accept: a refusal for want of
    /// receives (the shared receive queue is full, or the receive memory
    /// is all reserved), or a failed handshake.
    pub(super) fn failed(&self, peer: &Endpoint, err: &ConnectError) {
        let no_room = match err {
            ConnectError::Transport { source, .. } => matches!(
                source.downcast_ref::<RcError>(),
                Some(RcError::SrqFull { .. } | RcError::ReceiveMemory { .. })
            ),
            _ => false,
        };
        if no_room {
            self.counters.refused(peer, err);
        } else {
            self.counters.handshake_failed(peer, err);
        }
    }

    /// The accepting task: a close wakes it, and it ends.
    pub(super) fn set_accepting(&self, waker: Waker) {
        *self.accepting.lock().unwrap_or_else(|p| p.into_inner()) = Some(waker);
        // Closed before the waker was known: wake it now.
        if self.close.is_closed() {
            self.wake_accepting();
        }
    }

    fn wake_accepting(&self) {
        if let Some(w) = self.accepting.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            w.wake();
        }
    }
}

/// Accepts `rc://` or `rc+oob://` connections.
///
/// Accepting and handshakes run on the transport's engine, by a deadline
/// on each whole handshake (`RcConfig::connect_timeout`), so a slow or
/// silent peer never delays the others; `accept` hands out connections in
/// the order their handshakes finish. A peer whose handshake fails, or
/// that a full shared receive queue turns away, is counted in
/// [`zerocast_core::Listener::stats`] and logged at `debug`.
#[derive(Debug)]
pub struct RcListener {
    ready: Receiver<Result<RcConnection, ConnectError>>,
    shared: Arc<Shared>,
}

impl RcListener {
    /// A listener whose accepting task `start` registers on an engine of
    /// `transport`, given what the tasks share.
    pub(super) fn start(
        transport: &RcTransport,
        local: Endpoint,
        link: LinkConfig,
        srq: Option<Arc<SharedRecv>>,
        start: impl FnOnce(Arc<Shared>, &zerocast_link::engine::Engine),
    ) -> Self {
        let (tx, ready) = unbounded();
        let shared = Arc::new(Shared {
            close: CloseSignal::default(),
            counters: ListenerCounters::default(),
            transport: transport.clone(),
            link,
            local,
            srq,
            tx,
            accepting: Mutex::new(None),
            backlog: Backlog::default(),
        });
        start(shared.clone(), transport.inner.engines.pick());
        Self { ready, shared }
    }

    /// The counters of this listener's shared receive queue (`None`
    /// without one).
    pub fn srq_stats(&self) -> Option<SrqStats> {
        self.shared.srq.as_ref().map(|s| s.stats())
    }

    fn shut(&self) {
        if self.shared.close.close() {
            self.shared.wake_accepting();
        }
    }
}

impl Drop for RcListener {
    fn drop(&mut self) {
        self.shut();
    }
}

impl zerocast_core::Listener for RcListener {
    type Conn = RcConnection;

    fn accept_until(&self, deadline: Option<Instant>) -> Result<RcConnection, AcceptError> {
        self.shared.backlog.took(&self.shared.counters, self.shared.close.wait(&self.ready, deadline))
    }

    fn poll_accept(
        &self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<RcConnection, AcceptError>> {
        self.shared
            .close
            .poll_wait(&self.ready, cx)
            .map(|r| self.shared.backlog.took(&self.shared.counters, r))
    }

    fn close(&self) {
        self.shut();
    }

    fn stats(&self) -> ListenerStats {
        self.shared.counters.stats()
    }

    fn local_endpoint(&self) -> &Endpoint {
        &self.shared.local
    }
}
