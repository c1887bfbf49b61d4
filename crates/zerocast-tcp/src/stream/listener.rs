//! The `tcp://` listener: accepting and every handshake are engine tasks.
//!
//! The listening socket is a task that accepts whatever is pending, and
//! each accepted socket a task that exchanges hellos without waiting, by a
//! deadline on the whole handshake. A peer that stalls holds one small task
//! and a descriptor until its deadline; it never holds a thread and never
//! delays another peer. A handshaken socket becomes its connection's task
//! in place, and the connection goes to `accept`.

use std::net::{Shutdown, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver, Sender};
use rustix::io::Errno;
use socket2::Socket;
use zerocast_core::{AcceptError, ConnError, ConnectError, Endpoint, LinkConfig, ListenerStats};
use zerocast_link::engine::{Cx, Interest, Step, Task};
use zerocast_link::{Backlog, CloseSignal, ListenerCounters};

use super::handshake::HelloExchange;
use super::{TcpConnection, TcpTransport};

/// Handshaken connections `accept` has not taken yet, at most: past this
/// the listener stops accepting (the kernel's listen queue holds the rest)
/// until `accept` catches up.
const BACKLOG: usize = 1024;
/// Sockets accepted per run, so other tasks get their turn.
const ACCEPT_BURST: usize = 64;
/// How long accepting pauses when the process is short of descriptors or
/// memory. (While `accept` is behind, it waits for `accept` instead.)
const PAUSE: Duration = Duration::from_millis(10);

/// Accepts `tcp://` connections.
///
/// Accepting and handshakes run on the transport's engine, so a slow or
/// silent peer never delays the others; `accept` hands out connections in
/// the order their handshakes finish. A failed handshake is counted and
/// logged, never handed to `accept`.
#[derive(Debug)]
pub struct TcpListener {
    sock: Arc<Socket>,
    ready: Receiver<Result<TcpConnection, ConnectError>>,
    shared: Arc<Shared>,
    local: Endpoint,
}

/// What the listener and its tasks share.
#[derive(Debug)]
struct Shared {
    close: CloseSignal,
    counters: ListenerCounters,
    transport: TcpTransport,
    link: LinkConfig,
    local: Endpoint,
    /// Handshaken connections, or the error that ended the listener.
    tx: Sender<Result<TcpConnection, ConnectError>>,
    /// Holds the accepting task while `accept` is behind.
    backlog: Backlog,
}

impl TcpListener {
    pub(super) fn start(
        sock: Socket,
        transport: TcpTransport,
        local: Endpoint,
        link: LinkConfig,
    ) -> Result<Self, ConnectError> {
        sock.set_nonblocking(true)
            .map_err(|e| ConnectError::Io { endpoint: local.to_string(), source: e })?;
        let sock = Arc::new(sock);
        let (tx, ready) = unbounded();
        let engine = transport.engines.pick().clone();
        let shared = Arc::new(Shared {
            close: CloseSignal::default(),
            counters: ListenerCounters::default(),
            transport,
            link,
            local: local.clone(),
            tx,
            backlog: Backlog::default(),
        });
        let task = AcceptTask { sock: sock.clone(), shared: shared.clone(), paused: false };
        engine.register(Box::new(task));
        Ok(TcpListener { sock, ready, shared, local })
    }

    fn shut(&self) {
        if self.shared.close.close() {
            // Makes the listening socket readable, so its task runs, sees
            // the close and ends; connections in the listen queue are reset.
            let _ = self.sock.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for TcpListener {
    fn drop(&mut self) {
        self.shut();
    }
}

impl zerocast_core::Listener for TcpListener {
    type Conn = TcpConnection;

    fn accept_until(&self, deadline: Option<Instant>) -> Result<TcpConnection, AcceptError> {
        self.shared.backlog.took(&self.shared.counters, self.shared.close.wait(&self.ready, deadline))
    }

    fn poll_accept(
        &self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<TcpConnection, AcceptError>> {
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
        &self.local
    }
}

/// The listening socket's task.
struct AcceptTask {
    sock: Arc<Socket>,
    shared: Arc<Shared>,
    /// Accepting waits for the pause's timer, or for `accept`.
    paused: bool,
}

/// What an error of accept(2) means for the listener.
enum AcceptFailure {
    /// A peer left before it was accepted: no concern of the listener's.
    PeerGone,
    /// The process or the system ran short of something: pause and retry.
    Transient,
    /// The listening socket is broken.
    Fatal,
}

fn classify(e: &std::io::Error) -> AcceptFailure {
    use std::io::ErrorKind;
    // accept(2) on Linux passes a pending network error of the new
    // connection on as its own: retry, as for EAGAIN (see its man page).
    let peer = [
        Errno::PROTO,
        Errno::NOPROTOOPT,
        Errno::NETDOWN,
        Errno::NETUNREACH,
        Errno::HOSTDOWN,
        Errno::HOSTUNREACH,
        Errno::OPNOTSUPP,
        Errno::PERM,
    ];
    let errno = Errno::from_io_error(e);
    if matches!(e.kind(), ErrorKind::Interrupted | ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset)
        || errno.is_some_and(|n| peer.contains(&n))
    {
        return AcceptFailure::PeerGone;
    }
    let short = [Errno::MFILE, Errno::NFILE, Errno::NOBUFS, Errno::NOMEM];
    if errno.is_some_and(|n| short.contains(&n)) {
        AcceptFailure::Transient
    } else {
        AcceptFailure::Fatal
    }
}

impl AcceptTask {
    /// Accept what is pending; `false` when the listener is over.
    fn accept_burst(&mut self, cx: &mut Cx<'_>) -> bool {
        let shared = &self.shared;
        for _ in 0..ACCEPT_BURST {
            if shared.backlog.hold(|| shared.tx.len() >= BACKLOG) {
                // The `accept` that makes room wakes us.
                self.paused = true;
                return true;
            }
            // Non-blocking from the start, in one call: a flood of junk
            // connections costs as few system calls as can be.
            let flags = rustix::net::SocketFlags::NONBLOCK | rustix::net::SocketFlags::CLOEXEC;
            let (sock, addr) =
                match rustix::net::acceptfrom_with(&*self.sock, flags).map_err(std::io::Error::from) {
                    Ok((fd, addr)) => (Socket::from(fd), addr.and_then(|a| SocketAddr::try_from(a).ok())),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
                    Err(_) if shared.close.is_closed() => return false,
                    Err(e) => match classify(&e) {
                        AcceptFailure::PeerGone => {
                            if e.kind() != std::io::ErrorKind::Interrupted {
                                shared.counters.handshake_failed(&"a peer gone before accept", &e);
                            }
                            continue;
                        }
                        AcceptFailure::Transient => {
                            shared.counters.accept_error(&e);
                            self.pause(cx);
                            return true;
                        }
                        AcceptFailure::Fatal => {
                            let err = ConnectError::Io { endpoint: shared.local.to_string(), source: e };
                            let _ = shared.tx.send(Err(err));
                            shared.close.queued();
                            return false;
                        }
                    },
                };
            cx.spawn(Box::new(HelloTask::new(sock, addr, shared.clone(), cx.now())));
        }
        true
    }

    fn pause(&mut self, cx: &mut Cx<'_>) {
        self.paused = true;
        cx.set_timer(Some(cx.now() + PAUSE));
    }
}

impl Task for AcceptTask {
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.sock.as_fd())
    }

    fn run(&mut self, cx: &mut Cx<'_>) -> Step {
        self.shared.backlog.set_task(&cx.waker());
        if self.shared.close.is_closed() {
            return Step::Done;
        }
        if self.paused && !cx.timer_due() && !cx.woken() {
            return Step::Continue;
        }
        self.paused = false;
        cx.set_timer(None);
        if !self.accept_burst(cx) {
            return Step::Done;
        }
        cx.set_interest(Interest { read: !self.paused, write: false });
        Step::Continue
    }
}

fn peer_endpoint(addr: Option<SocketAddr>) -> Endpoint {
    addr.and_then(|a| Endpoint::parse(&format!("tcp://{a}")).ok())
        .unwrap_or_else(|| Endpoint::parse("tcp://unknown:0").expect("valid"))
}

/// An accepted socket exchanging hellos, by a deadline on the whole
/// exchange.
struct HelloTask {
    sock: Arc<Socket>,
    hs: HelloExchange,
    /// The peer's address; its endpoint is made once the handshake succeeds.
    addr: Option<SocketAddr>,
    shared: Arc<Shared>,
    deadline: Instant,
    link: LinkConfig,
}

impl HelloTask {
    fn new(sock: Socket, addr: Option<SocketAddr>, shared: Arc<Shared>, now: Instant) -> Self {
        let transport = &shared.transport;
        let link = shared.link;
        // Socket options wait for a peer that completes the handshake.
        let hello = transport.hello(&link);
        let deadline = now + transport.config().handshake_timeout;
        Self { sock: Arc::new(sock), hs: HelloExchange::new(&hello), addr, shared, deadline, link }
    }
}

impl Task for HelloTask {
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.sock.as_fd())
    }

    fn run(&mut self, cx: &mut Cx<'_>) -> Step {
        let failed = |task: &Self, e: &(dyn std::error::Error + 'static)| {
            task.shared.counters.handshake_failed(&Peer(task.addr), e);
            Step::Done
        };
        let hello = match self.hs.advance(&self.sock) {
            Ok(Some(hello)) => hello,
            Ok(None) if cx.now() >= self.deadline => {
                return failed(self, &ConnError::TimedOut("the peer did not complete the handshake"));
            }
            Ok(None) => {
                let write = !self.hs.to_send().is_empty();
                cx.set_interest(Interest { read: true, write });
                cx.set_timer(Some(self.deadline));
                return Step::Continue;
            }
            Err(e) => return failed(self, &e),
        };
        let peer = peer_endpoint(self.addr);
        let transport = &self.shared.transport;
        if let Err(e) = transport.configure(&self.sock, &peer) {
            return failed(self, &e);
        }
        match transport.start(self.sock.clone(), peer, self.link, hello) {
            Ok((conn, task)) => {
                if self.shared.tx.send(Ok(conn)).is_err() {
                    // The listener is gone: the connection closes.
                    return Step::Done;
                }
                self.shared.close.queued();
                Step::Replace(Box::new(task))
            }
            Err(e) => failed(self, &e),
        }
    }
}

/// A peer's address for logs, `unknown` if the system gave none.
struct Peer(Option<SocketAddr>);

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(a) => write!(f, "tcp://{a}"),
            None => f.write_str("tcp://unknown"),
        }
    }
}
