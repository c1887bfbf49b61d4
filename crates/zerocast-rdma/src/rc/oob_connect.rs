//! `rc+oob://` connecting without a waiting thread, for the async API: the
//! connecting side of the side-channel handshake (see `oob`) as one engine
//! task, by one deadline on all of it. The TCP connect completes, our
//! record goes out and the listener's comes in (or its refusal), our QP
//! goes to RTR and RTS, then "R" each way; the task then becomes the
//! connection's side-channel watch in place. A stalled listener costs a
//! timer, not a thread.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::Instant;

use zerocast_core::{ConnError, ConnectError, Endpoint, HandshakeError, LinkConfig, Scheme};
use zerocast_link::engine::{Cx, Interest, Step, Task};
use zerocast_link::{Complete, Completion};

use super::oob::{is_refusal, nonblocking, watch, OobInfo, Ours, INFO_LEN};
use super::{no_room, transport_err, RcConnection, RcTransport};

/// What the caller awaits.
type Outcome = Complete<Result<RcConnection, ConnectError>>;

/// Start connecting to `ep` at `addr` on `t`'s engines; the future yields
/// the connection. Dropping it abandons the attempt.
pub(super) fn start(
    t: &RcTransport,
    ep: &Endpoint,
    addr: SocketAddr,
    link: LinkConfig,
) -> Result<Completion<Result<RcConnection, ConnectError>>, ConnectError> {
    let deadline = Instant::now() + t.inner.cfg.connect_timeout;
    let io_err = |source| ConnectError::Io { endpoint: ep.to_string(), source };
    let sock = connect(addr).map_err(io_err)?;
    let ours = Ours::open(t, ep, &link, t.shaped(&link, None).map_err(transport_err)?)?;
    let (done, result) = zerocast_link::completion();
    let engine = t.engine_of(&ours.io);
    let task = Connecting {
        sock: Arc::new(sock),
        t: t.clone(),
        ep: ep.clone(),
        link,
        deadline,
        stage: Stage::Connect,
        record: ours.info.encode(),
        ours: Box::new(ours),
        theirs: [0; INFO_LEN],
        got: 0,
        done: Some(done),
    };
    engine.register(Box::new(task));
    Ok(result)
}

impl RcTransport {
    /// [`RcTransport::connect_nonblocking`] to an `rc+oob://` endpoint
    /// whose side channel is at `addr` (`ep`'s host, looked up by the
    /// caller): the TCP connect, our record out, the listener's in, RTR and
    /// RTS, then the ready bytes, all as one engine task.
    pub fn connect_nonblocking_to(
        &self,
        ep: &Endpoint,
        addr: std::net::SocketAddr,
    ) -> Result<zerocast_link::Completion<Result<RcConnection, ConnectError>>, ConnectError> {
        if ep.scheme() != Scheme::RcOob {
            return Err(ConnectError::Unavailable {
                scheme: ep.scheme(),
                reason: "a side-channel address is for rc+oob:// only".into(),
            });
        }
        start(self, ep, addr, self.link_config(ep)?)
    }
}

/// A non-blocking socket whose connect to `addr` is under way.
fn connect(addr: SocketAddr) -> std::io::Result<TcpStream> {
    use socket2::{Domain, Socket, Type};
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    sock.set_nonblocking(true)?;
    sock.set_nodelay(true)?;
    match sock.connect(&addr.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    Ok(sock.into())
}

/// Where the handshake is.
#[derive(Debug, Clone, Copy)]
enum Stage {
    /// The TCP connect is under way.
    Connect,
    /// Our record going out (`sent` bytes so far).
    Record { sent: usize },
    /// Reading the listener's record.
    Theirs,
    /// Our "R" going out.
    Ready,
    /// Waiting for the listener's "R".
    Answer,
}

/// The connecting side's handshake.
struct Connecting {
    /// Shared with the watch that takes its place: the same descriptor.
    sock: Arc<TcpStream>,
    t: RcTransport,
    ep: Endpoint,
    link: LinkConfig,
    deadline: Instant,
    stage: Stage,
    ours: Box<Ours>,
    /// Our record.
    record: [u8; INFO_LEN],
    /// The listener's record, `got` bytes of it so far.
    theirs: [u8; INFO_LEN],
    got: usize,
    done: Option<Outcome>,
}

/// What one step of the handshake came to.
enum Next {
    /// Wait for the socket (readable, or writable).
    Wait { write: bool },
    /// Handshaken: the listener's record.
    Up(OobInfo),
}

impl Connecting {
    fn io_err(&self, e: std::io::Error) -> ConnectError {
        ConnectError::Io { endpoint: self.ep.to_string(), source: e }
    }

    fn handshake_err(&self, e: HandshakeError) -> ConnectError {
        ConnectError::Handshake { endpoint: self.ep.to_string(), source: ConnError::Handshake(e) }
    }

    fn eof(&self) -> ConnectError {
        self.io_err(ErrorKind::UnexpectedEof.into())
    }

    /// Go as far as the socket allows.
    fn step(&mut self, writable: bool) -> Result<Next, ConnectError> {
        let sock = Arc::clone(&self.sock);
        let mut sock = &*sock;
        loop {
            match self.stage {
                Stage::Connect => {
                    // Writable once the connect is over, either way; a
                    // first run, before any interest, asks the socket.
                    if let Some(e) = sock.take_error().map_err(|e| self.io_err(e))? {
                        return Err(self.io_err(e));
                    }
                    if !writable && sock.peer_addr().is_err() {
                        return Ok(Next::Wait { write: true });
                    }
                    self.stage = Stage::Record { sent: 0 };
                }
                Stage::Record { sent } => {
                    match nonblocking(|| sock.write(&self.record[sent..])).map_err(|e| self.io_err(e))? {
                        Some(n) if sent + n == INFO_LEN => self.stage = Stage::Theirs,
                        Some(n) => self.stage = Stage::Record { sent: sent + n },
                        None => return Ok(Next::Wait { write: true }),
                    }
                }
                Stage::Theirs => {
                    match nonblocking(|| sock.read(&mut self.theirs[self.got..]))
                        .map_err(|e| self.io_err(e))?
                    {
                        Some(0) => return Err(self.eof()),
                        Some(n) => self.got += n,
                        None => return Ok(Next::Wait { write: false }),
                    }
                    if self.got == INFO_LEN {
                        if is_refusal(&self.theirs) {
                            return Err(no_room(&self.ep));
                        }
                        let theirs = self.listener_record()?;
                        self.ours.connect_to(&self.t, &theirs)?;
                        self.stage = Stage::Ready;
                    }
                }
                Stage::Ready => match nonblocking(|| sock.write(b"R")).map_err(|e| self.io_err(e))? {
                    Some(0) => return Err(self.eof()),
                    Some(_) => self.stage = Stage::Answer,
                    None => return Ok(Next::Wait { write: true }),
                },
                Stage::Answer => {
                    let mut r = [0u8; 1];
                    match nonblocking(|| sock.read(&mut r)).map_err(|e| self.io_err(e))? {
                        Some(0) => return Err(self.eof()),
                        Some(_) if r == *b"R" => return Ok(Next::Up(self.listener_record()?)),
                        Some(_) => return Err(self.handshake_err(HandshakeError::NotHello)),
                        None => return Ok(Next::Wait { write: false }),
                    }
                }
            }
        }
    }

    /// The listener's record, whole.
    fn listener_record(&self) -> Result<OobInfo, ConnectError> {
        OobInfo::decode(&self.theirs)
            .map_err(|source| ConnectError::Handshake { endpoint: self.ep.to_string(), source })
    }

    fn fail(&mut self, err: ConnectError) -> Step {
        if let Some(done) = self.done.take() {
            let _ = done.complete(Err(err));
        }
        Step::Done
    }

    /// Both QPs can receive: hand the connection over, and watch the side
    /// channel in our place. A caller that gave up meanwhile drops it,
    /// which closes it.
    fn up(&mut self, theirs: OobInfo) -> Step {
        let io = Arc::clone(&self.ours.io);
        tracing::debug!(peer = %self.ep, qpn = self.ours.info.qpn, peer_qpn = theirs.qpn, "rc+oob QP in RTS");
        match self.t.finish(Arc::clone(&io), self.link, theirs.hello, self.ep.clone()) {
            Ok((conn, _)) => {
                if let Some(done) = self.done.take() {
                    let _ = done.complete(Ok(conn));
                }
                Step::Replace(Box::new(watch(Arc::clone(&self.sock), io)))
            }
            Err(e) => self.fail(e),
        }
    }
}

impl Task for Connecting {
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.sock.as_fd())
    }

    fn run(&mut self, cx: &mut Cx<'_>) -> Step {
        if self.done.as_ref().is_none_or(Complete::is_abandoned) {
            return Step::Done;
        }
        match self.step(cx.writable()) {
            Ok(Next::Up(theirs)) => self.up(theirs),
            Err(err) => self.fail(err),
            Ok(Next::Wait { .. }) if cx.now() >= self.deadline => self
                .fail(ConnectError::Timeout(format!("rc+oob: the side-channel handshake with {}", self.ep))),
            Ok(Next::Wait { write }) => {
                cx.set_interest(Interest { read: !write, write });
                cx.set_timer(Some(self.deadline));
                Step::Continue
            }
        }
    }
}
