//! Connecting without a waiting thread: a non-blocking `connect(2)` and the
//! hello exchange as an engine task, by one deadline per address, whose
//! connection is handed to the caller through a [`Completion`](zerocast_link::Completion). The
//! `async` API connects this way; the blocking `connect` does the same
//! steps on its own thread.

use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::Instant;

use rustix::io::Errno;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use zerocast_core::{ConnError, ConnectError, Endpoint, LinkConfig};
use zerocast_link::engine::{Cx, Interest, Step, Task};
use zerocast_link::Complete;

use super::handshake::HelloExchange;
use super::{TcpConnection, TcpTransport};

/// What the caller awaits.
pub(super) type Outcome = Complete<Result<TcpConnection, ConnectError>>;

/// One address being tried: connecting, then exchanging hellos.
pub(super) struct ConnectTask {
    transport: TcpTransport,
    peer: Endpoint,
    link: LinkConfig,
    /// The addresses left to try after this one.
    rest: Vec<SocketAddr>,
    sock: Arc<Socket>,
    /// `None` while `connect(2)` is in progress.
    hello: Option<HelloExchange>,
    deadline: Instant,
    /// Taken when the caller is told.
    done: Option<Outcome>,
}

impl ConnectTask {
    /// The task for the first address of `addrs` that a socket could be
    /// opened for; `Err` with the outcome when none is left.
    pub(super) fn start(
        transport: TcpTransport,
        peer: Endpoint,
        link: LinkConfig,
        mut addrs: Vec<SocketAddr>,
        done: Outcome,
        mut last: Option<std::io::Error>,
    ) -> Result<Self, (Outcome, ConnectError)> {
        while !addrs.is_empty() {
            match open(addrs.remove(0)) {
                Ok(sock) => {
                    let deadline = Instant::now() + transport.config().handshake_timeout;
                    let sock = Arc::new(sock);
                    let done = Some(done);
                    return Ok(Self {
                        transport,
                        peer,
                        link,
                        rest: addrs,
                        sock,
                        hello: None,
                        deadline,
                        done,
                    });
                }
                Err(e) => last = Some(e),
            }
        }
        let source = last.unwrap_or_else(|| std::io::Error::other("no address to connect to"));
        Err((done, ConnectError::Io { endpoint: peer.to_string(), source }))
    }

    /// Tell the caller (once); `false` if it is gone.
    fn finish(&mut self, r: Result<TcpConnection, ConnectError>) -> bool {
        self.done.take().is_some_and(|done| done.complete(r).is_ok())
    }

    /// This address failed: on to the next one, or tell the caller.
    fn next_address(&mut self, cx: &mut Cx<'_>, error: std::io::Error) -> Step {
        let Some(done) = self.done.take() else { return Step::Done };
        let rest = std::mem::take(&mut self.rest);
        match Self::start(self.transport.clone(), self.peer.clone(), self.link, rest, done, Some(error)) {
            Ok(next) => cx.spawn(Box::new(next)),
            Err((done, e)) => {
                let _ = done.complete(Err(e));
            }
        }
        Step::Done
    }

    fn handshake_failed(&mut self, source: ConnError) -> Step {
        let endpoint = self.peer.to_string();
        self.finish(Err(ConnectError::Handshake { endpoint, source }));
        Step::Done
    }

    /// Wait for `connect(2)` to end; `Some` with the step to take unless
    /// it ended well.
    fn connecting(&mut self, cx: &mut Cx<'_>, timed_out: bool) -> Option<Step> {
        match self.sock.take_error() {
            Ok(None) if cx.writable() || self.sock.peer_addr().is_ok() => {
                if let Err(e) = self.transport.configure(&self.sock, &self.peer) {
                    self.finish(Err(e));
                    return Some(Step::Done);
                }
                self.hello = Some(HelloExchange::new(&self.transport.hello(&self.link)));
                None
            }
            Ok(None) if !timed_out => {
                cx.set_interest(Interest { read: false, write: true });
                cx.set_timer(Some(self.deadline));
                Some(Step::Continue)
            }
            Ok(None) => {
                let e = std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out");
                Some(self.next_address(cx, e))
            }
            Ok(Some(e)) | Err(e) => Some(self.next_address(cx, e)),
        }
    }
}

/// A non-blocking socket with `connect(2)` started.
fn open(addr: SocketAddr) -> std::io::Result<Socket> {
    let sock =
        Socket::new(Domain::for_address(addr), Type::STREAM.nonblocking().cloexec(), Some(Protocol::TCP))?;
    match sock.connect(&SockAddr::from(addr)) {
        Ok(()) => Ok(sock),
        Err(e) if Errno::from_io_error(&e) == Some(Errno::INPROGRESS) => Ok(sock),
        Err(e) => Err(e),
    }
}

impl Task for ConnectTask {
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.sock.as_fd())
    }

    fn run(&mut self, cx: &mut Cx<'_>) -> Step {
        if self.done.as_ref().is_none_or(Complete::is_abandoned) {
            // The caller's future was dropped: nobody wants the connection.
            return Step::Done;
        }
        let timed_out = cx.now() >= self.deadline;
        if self.hello.is_none() {
            if let Some(step) = self.connecting(cx, timed_out) {
                return step;
            }
        }
        let Some(hs) = self.hello.as_mut() else { return Step::Done };
        let peer_hello = match hs.advance(&self.sock) {
            Ok(Some(h)) => h,
            Ok(None) if timed_out => {
                return self.handshake_failed(ConnError::TimedOut("the peer did not complete the handshake"))
            }
            Ok(None) => {
                cx.set_interest(Interest { read: true, write: !hs.to_send().is_empty() });
                cx.set_timer(Some(self.deadline));
                return Step::Continue;
            }
            Err(e) => return self.handshake_failed(e),
        };
        let (conn, conn_task) =
            match self.transport.start(self.sock.clone(), self.peer.clone(), self.link, peer_hello) {
                Ok(started) => started,
                Err(e) => {
                    self.finish(Err(e));
                    return Step::Done;
                }
            };
        if self.finish(Ok(conn)) {
            Step::Replace(Box::new(conn_task))
        } else {
            // Abandoned meanwhile: the connection closes.
            Step::Done
        }
    }
}
