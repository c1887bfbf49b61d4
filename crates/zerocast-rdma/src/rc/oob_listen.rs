//! The `rc+oob://` listener: the listening socket and every side-channel
//! handshake are engine tasks (see `listen`).
//!
//! The accepting side reads the peer's record first, so a peer that sends
//! nothing, or junk, costs no QP. Then it admits the peer to the shared
//! receive queue (or sends its refusal), creates the QP, brings it to RTS
//! and sends its own record and "R" together: it sends no data before the
//! peer's "R" says the peer's QP can receive. The peer's "R" ends the
//! handshake, and the socket becomes the connection's side-channel watch
//! in place.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::Instant;

use zerocast_core::{ConnError, ConnectError, Endpoint, HandshakeError, LinkConfig};
use zerocast_link::engine::{Cx, Interest, Step, Task};

use super::listen::{AcceptTask, Intake, RcListener, Shared, Taken};
use super::oob::{is_refusal, nonblocking, refusal, watch, OobInfo, Ours, INFO_LEN};
use super::srq::SharedRecv;
use super::{resolve, transport_err, RcTransport};

/// Connections the kernel queues for the listener.
const LISTEN_BACKLOG: i32 = 1024;

/// Bind `ep`; the listener's accepting task runs on an engine.
pub(super) fn listen(
    t: &RcTransport,
    ep: &Endpoint,
    link: LinkConfig,
    srq: Option<Arc<SharedRecv>>,
) -> Result<RcListener, ConnectError> {
    let addr = resolve(ep)?;
    let io_err = |e: std::io::Error| match e.kind() {
        ErrorKind::AddrInUse => ConnectError::InUse(ep.to_string()),
        _ => ConnectError::Io { endpoint: ep.to_string(), source: e },
    };
    let sock = bind(addr).map_err(io_err)?;
    let port = sock.local_addr().map(|a| a.port()).unwrap_or(0);
    Ok(RcListener::start(t, ep.with_port(port), link, srq, |shared, engine| {
        engine.register(Box::new(AcceptTask::new(Connections { sock }, shared)));
    }))
}

/// A non-blocking listening socket on `addr`, with room in its listen
/// queue for a burst of peers.
fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Socket, Type};
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    sock.set_reuse_address(true)?;
    sock.bind(&addr.into())?;
    sock.listen(LISTEN_BACKLOG)?;
    sock.set_nonblocking(true)?;
    Ok(sock.into())
}

/// The listening socket: each connection starts a handshake task.
struct Connections {
    sock: TcpListener,
}

impl Intake for Connections {
    fn fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    fn take(&mut self, shared: &Arc<Shared>, cx: &mut Cx<'_>) -> Taken {
        let (sock, addr) = match self.sock.accept() {
            Ok(a) => a,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Taken::Nothing,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::Interrupted | ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset
                ) =>
            {
                return Taken::One
            }
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                ) =>
            {
                shared.counters.accept_error(&e);
                return Taken::Pause;
            }
            Err(e) => {
                return Taken::Fatal(ConnectError::Io { endpoint: shared.local.to_string(), source: e })
            }
        };
        let peer = peer_endpoint(addr, &shared.local);
        match Handshake::new(sock, peer.clone(), shared.clone(), cx.now()) {
            Ok(task) => cx.spawn(Box::new(task)),
            Err(err) => shared.failed(&peer, &err),
        }
        Taken::One
    }
}

fn peer_endpoint(addr: SocketAddr, local: &Endpoint) -> Endpoint {
    Endpoint::parse(&format!("rc+oob://{addr}")).unwrap_or_else(|_| local.clone())
}

/// Where a side-channel handshake is.
enum Stage {
    /// Reading the peer's record.
    Record,
    /// Our record and "R" going out (`sent` bytes so far).
    Answer { ours: Box<Ours>, theirs: OobInfo, sent: usize },
    /// Waiting for the peer's "R".
    Ready { ours: Box<Ours>, theirs: OobInfo },
}

/// An accepted side channel's handshake, by a deadline on all of it.
struct Handshake {
    /// Shared with the watch that takes its place: the same descriptor.
    sock: Arc<TcpStream>,
    peer: Endpoint,
    shared: Arc<Shared>,
    deadline: Instant,
    stage: Stage,
    record: [u8; INFO_LEN],
    got: usize,
    /// Our record and "R".
    answer: [u8; INFO_LEN + 1],
}

/// What one step of the handshake came to.
enum Next {
    /// Wait for the socket (readable, or writable).
    Wait { write: bool },
    /// Handshaken: the connection's watch takes the socket.
    Up(Box<dyn Task>),
}

impl Handshake {
    fn new(sock: TcpStream, peer: Endpoint, shared: Arc<Shared>, now: Instant) -> Result<Self, ConnectError> {
        let io_err = |e| ConnectError::Io { endpoint: peer.to_string(), source: e };
        sock.set_nonblocking(true).map_err(io_err)?;
        sock.set_nodelay(true).map_err(io_err)?;
        let deadline = now + shared.transport.inner.cfg.connect_timeout;
        Ok(Self {
            sock: Arc::new(sock),
            peer,
            shared,
            deadline,
            stage: Stage::Record,
            record: [0; INFO_LEN],
            got: 0,
            answer: [0; INFO_LEN + 1],
        })
    }

    fn io_err(&self, e: std::io::Error) -> ConnectError {
        ConnectError::Io { endpoint: self.peer.to_string(), source: e }
    }

    fn handshake_err(&self, e: HandshakeError) -> ConnectError {
        ConnectError::Handshake { endpoint: self.peer.to_string(), source: ConnError::Handshake(e) }
    }

    /// Go as far as the socket allows.
    fn step(&mut self) -> Result<Next, ConnectError> {
        loop {
            match std::mem::replace(&mut self.stage, Stage::Record) {
                Stage::Record => {
                    if !self.read_record()? {
                        return Ok(Next::Wait { write: false });
                    }
                    self.stage = self.answer()?;
                }
                Stage::Answer { ours, theirs, sent } => {
                    let sent = sent + self.write_some(sent)?;
                    if sent < self.answer.len() {
                        self.stage = Stage::Answer { ours, theirs, sent };
                        return Ok(Next::Wait { write: true });
                    }
                    self.stage = Stage::Ready { ours, theirs };
                }
                Stage::Ready { ours, theirs } => {
                    let mut r = [0u8; 1];
                    match nonblocking(|| (&*self.sock).read(&mut r)).map_err(|e| self.io_err(e))? {
                        Some(0) => return Err(self.io_err(ErrorKind::UnexpectedEof.into())),
                        Some(_) if r == *b"R" => return self.up(*ours, theirs),
                        Some(_) => return Err(self.handshake_err(HandshakeError::NotHello)),
                        None => {
                            self.stage = Stage::Ready { ours, theirs };
                            return Ok(Next::Wait { write: false });
                        }
                    }
                }
            }
        }
    }

    /// Read what has come of the peer's record; `true` once it is whole.
    fn read_record(&mut self) -> Result<bool, ConnectError> {
        while self.got < INFO_LEN {
            let read = nonblocking(|| (&*self.sock).read(&mut self.record[self.got..]));
            match read.map_err(|e| self.io_err(e))? {
                Some(0) => return Err(self.io_err(ErrorKind::UnexpectedEof.into())),
                Some(n) => self.got += n,
                None => return Ok(false),
            }
        }
        Ok(true)
    }

    /// The peer's record is in: admit it, open our QP, bring it to RTS.
    fn answer(&mut self) -> Result<Stage, ConnectError> {
        if is_refusal(&self.record) {
            return Err(self.handshake_err(HandshakeError::NotHello));
        }
        let theirs = OobInfo::decode(&self.record)
            .map_err(|source| ConnectError::Handshake { endpoint: self.peer.to_string(), source })?;
        let t = &self.shared.transport;
        let member = self.shared.srq.as_ref().map(SharedRecv::admit).transpose();
        let shaped = match member.and_then(|m| t.shaped(&self.shared.link, m)) {
            Ok(s) => s,
            Err(err) => {
                tracing::debug!(peer = %self.peer, error = %err, "rc+oob listener: refusing a connection");
                // Small enough for any socket buffer; best effort.
                let _ = (&*self.sock).write_all(&refusal());
                let _ = self.sock.shutdown(Shutdown::Both);
                return Err(transport_err(err));
            }
        };
        let ours = Ours::open(t, &self.shared.local, &self.shared.link, shaped)?;
        ours.connect_to(t, &theirs)?;
        self.answer[..INFO_LEN].copy_from_slice(&ours.info.encode());
        self.answer[INFO_LEN] = b'R';
        Ok(Stage::Answer { ours: Box::new(ours), theirs, sent: 0 })
    }

    /// Write what the socket takes of the answer from `from`.
    fn write_some(&self, from: usize) -> Result<usize, ConnectError> {
        let wrote = nonblocking(|| (&*self.sock).write(&self.answer[from..]));
        Ok(wrote.map_err(|e| self.io_err(e))?.unwrap_or(0))
    }

    /// Both QPs can receive: the connection, and its watch in our place.
    fn up(&mut self, ours: Ours, theirs: OobInfo) -> Result<Next, ConnectError> {
        let t = &self.shared.transport;
        tracing::debug!(peer = %self.peer, qpn = ours.info.qpn, peer_qpn = theirs.qpn, "rc+oob QP in RTS");
        let (conn, _) = t.finish(ours.io.clone(), self.shared.link, theirs.hello, self.peer.clone())?;
        self.shared.deliver(conn);
        Ok(Next::Up(Box::new(watch(self.sock.clone(), ours.io))))
    }
}

impl Task for Handshake {
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.sock.as_fd())
    }

    fn run(&mut self, cx: &mut Cx<'_>) -> Step {
        let failed = |me: &Self, err: ConnectError| {
            me.shared.failed(&me.peer, &err);
            Step::Done
        };
        if self.shared.close.is_closed() {
            return Step::Done;
        }
        match self.step() {
            Ok(Next::Up(watch)) => Step::Replace(watch),
            Err(err) => failed(self, err),
            Ok(Next::Wait { .. }) if cx.now() >= self.deadline => {
                failed(self, ConnectError::Timeout("rc+oob: the side-channel handshake".into()))
            }
            Ok(Next::Wait { write }) => {
                cx.set_interest(Interest { read: !write, write });
                cx.set_timer(Some(self.deadline));
                Step::Continue
            }
        }
    }
}
