//! `mem://name`: an in-process transport.
//!
//! Two threads of one process talk as if over the network, with the same
//! handshake, frames, sequence numbers and credits as `tcp://` and `rc://`,
//! but a message is never copied: the pool buffer itself moves from the
//! sender to the receiver. It serves same-process pipelines and tests that
//! want real flow control without sockets.
//!
//! Connections run on the transport's engine (one thread for all of them),
//! and a sending thread on a quiet link hands its frame over itself.
//!
//! It does **not** cross process boundaries, and names live in one
//! process-wide registry: listening on a name that is taken fails. A name
//! that ends in `:0` asks for a fresh one, as port 0 does on the network:
//! `mem://:0` listens at `mem://anon-N` and `mem://jobs:0` at `mem://jobs-N`,
//! with `N` a number no listener of this process has used; the listener's
//! `local_endpoint` tells which.

//!
//! Two threads of one process, the buffer itself handed over:
//!
//! ```
//! use zerocast_core::{Connection, Endpoint, LinkConfig, Listener, Transport};
//! use zerocast_inproc::MemTransport;
//! use zerocast_mem::{Pool, PoolConfig};
//!
//! let mem = MemTransport::new(Pool::unregistered(PoolConfig::default())?, LinkConfig::default())?;
//! let listener = mem.listen(&Endpoint::parse("mem://jobs:0")?)?;
//! let at = listener.local_endpoint().clone();
//! let producer = std::thread::spawn(move || -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//!     let conn = mem.connect(&at)?;
//!     for n in 0u8..3 {
//!         let mut buf = conn.alloc(1, None)?;
//!         buf[0] = n;
//!         conn.send(buf, None).map_err(|e| e.to_string())?;
//!     }
//!     Ok(())
//! });
//! let conn = listener.accept()?;
//! for n in 0u8..3 {
//!     assert_eq!(conn.recv(None)?[0], n);
//! }
//! producer.join().expect("producer thread")?;
//! # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::collections::HashMap;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use crossbeam_channel::{bounded, Receiver, Sender};
use zerocast_core::{
    AcceptError, Caps, ConnError, ConnectError, Endpoint, ErrorKind, LinkConfig, ListenerStats, Scheme,
};
use zerocast_link::engine::{Cx, Engines, Step, Task};
use zerocast_link::{
    CloseSignal, Driver, Flavor, Frame, LinkSetup, ListenerCounters, Wire, WireCtx, Writing,
};
use zerocast_mem::Pool;

/// The in-process flavor of [`zerocast_link::Connection`].
#[derive(Debug)]
pub enum Inproc {}

impl Flavor for Inproc {
    const CAPS: Caps = Caps::STREAM;
    const SCHEME: &'static str = "mem";
}

/// A `mem://` connection.
pub type MemConnection = zerocast_link::Connection<Inproc>;

/// A connection request waiting in a listener's backlog: the connector's
/// half, already handshaken, and its writer to start.
type Pending = MemConnection;

/// A listening name: its backlog, settings and counters.
#[derive(Clone)]
struct Entry {
    backlog: Sender<Pending>,
    link: LinkConfig,
    shared: Arc<Shared>,
}

/// Listening names of this process.
type Registry = Mutex<HashMap<String, Entry>>;

/// What a listener shares with the connecting threads.
#[derive(Debug, Default)]
struct Shared {
    close: CloseSignal,
    counters: ListenerCounters,
}

/// The suffix a listening name asks a fresh name with.
const ANY: &str = ":0";

/// A name not in `reg`, for a listener that asked for `prefix:0`.
fn fresh_name(reg: &HashMap<String, Entry>, prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let prefix = if prefix.is_empty() { "anon" } else { prefix };
    loop {
        let name = format!("{prefix}-{}", NEXT.fetch_add(1, Ordering::Relaxed));
        if !reg.contains_key(&name) {
            return name;
        }
    }
}

fn registry() -> &'static Registry {
    static REG: OnceLock<Registry> = OnceLock::new();
    REG.get_or_init(Default::default)
}

/// The in-process transport.
///
/// A sending thread hands its frame to the receiving side itself when the
/// link is quiet; otherwise the transport's engine thread moves queued
/// frames, for every connection of the transport.
#[derive(Debug, Clone)]
pub struct MemTransport {
    pool: Pool,
    link: LinkConfig,
    engines: Engines,
}

impl MemTransport {
    /// A transport whose messages live in `pool`, on an engine of its own.
    pub fn new(pool: Pool, link: LinkConfig) -> Result<Self, ConnectError> {
        let engines = Engines::start("zerocast-mem", 1)
            .map_err(|e| ConnectError::Transport { kind: ErrorKind::LocalResource, source: e.into() })?;
        Self::with_engines(pool, link, engines)
    }

    /// A transport whose messages live in `pool`, on `engines` (which
    /// other transports may share).
    pub fn with_engines(pool: Pool, link: LinkConfig, engines: Engines) -> Result<Self, ConnectError> {
        link.validate().map_err(ConnectError::transport)?;
        Ok(Self { pool, link, engines })
    }

    /// The pool.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    fn link_config(&self, ep: &Endpoint) -> Result<LinkConfig, ConnectError> {
        if ep.scheme() != Scheme::Mem {
            return Err(ConnectError::Unavailable {
                scheme: ep.scheme(),
                reason: "the in-process transport takes mem:// endpoints".into(),
            });
        }
        let mut link = self.link;
        link.apply_params(ep)?;
        link.validate().map_err(ConnectError::transport)?;
        Ok(link)
    }
}

impl zerocast_core::Transport for MemTransport {
    type Conn = MemConnection;
    type Listener = MemListener;

    fn listen(&self, ep: &Endpoint) -> Result<MemListener, ConnectError> {
        let link = self.link_config(ep)?;
        let mut reg = registry().lock().unwrap_or_else(|p| p.into_inner());
        let local = match ep.host().strip_suffix(ANY) {
            Some(prefix) => ep.with_host(&fresh_name(&reg, prefix)),
            None if reg.contains_key(ep.host()) => return Err(ConnectError::InUse(ep.to_string())),
            None => ep.clone(),
        };
        let (tx, rx) = bounded(128);
        let shared = Arc::new(Shared::default());
        reg.insert(local.host().to_owned(), Entry { backlog: tx, link, shared: shared.clone() });
        Ok(MemListener { rx, local, shared })
    }

    fn connect(&self, ep: &Endpoint) -> Result<MemConnection, ConnectError> {
        let link = self.link_config(ep)?;
        let Entry { backlog, link: server_link, shared } = registry()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(ep.host())
            .cloned()
            .ok_or_else(|| ConnectError::Refused(ep.to_string()))?;
        let buf_size = |l: &LinkConfig| self.pool.class_for(l.max_payload as usize).unwrap_or(0);
        let client_hello = zerocast_link::hello_for(&link, buf_size(&link));
        let server_hello = zerocast_link::hello_for(&server_link, buf_size(&server_link));
        let handshake = |source| ConnectError::Handshake { endpoint: ep.to_string(), source };
        let peer_of_server = Endpoint::parse(&format!("mem://{}-client", ep.host()))?;
        let (c_link, c_driver, _) = zerocast_link::new(LinkSetup {
            config: link,
            peer_hello: server_hello,
            pool: self.pool.clone(),
            peer: ep.clone(),
            repost: false,
            credit_unit: 0,
        })
        .map_err(handshake)?;
        let (s_link, s_driver, _) = zerocast_link::new(LinkSetup {
            config: server_link,
            peer_hello: client_hello,
            pool: self.pool.clone(),
            peer: peer_of_server.clone(),
            repost: false,
            credit_unit: 0,
        })
        .map_err(|e| {
            // The listener's side refused the connector's hello.
            shared.counters.handshake_failed(&peer_of_server, &e);
            handshake(e)
        })?;
        let engine = self.engines.pick();
        engine.register(Box::new(Pump::new(c_driver.clone(), s_driver.clone())));
        engine.register(Box::new(Pump::new(s_driver, c_driver)));
        if shared.close.is_closed() {
            return Err(ConnectError::Refused(ep.to_string()));
        }
        backlog
            .try_send(MemConnection::new(s_link, ()))
            .map_err(|_| ConnectError::Refused(ep.to_string()))?;
        shared.close.queued();
        Ok(MemConnection::new(c_link, ()))
    }
}

/// One direction of a connection on the engine: frames queued on `from`
/// are handed to `to`.
struct Pump {
    from: Driver,
    to: Driver,
    attached: bool,
}

impl Pump {
    fn new(from: Driver, to: Driver) -> Self {
        Self { from, to, attached: false }
    }
}

impl Task for Pump {
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    fn run(&mut self, cx: &mut Cx<'_>) -> Step {
        if !self.attached {
            self.from.attach(Box::new(Handover(self.to.clone())), cx.waker());
            self.attached = true;
        }
        let tick = cx.timer_due();
        match self.from.drive_writer(tick) {
            Writing::Idle { next } => {
                cx.set_timer(next);
                Step::Continue
            }
            // A handover never leaves a backlog.
            Writing::Backlog => Step::Continue,
            Writing::Finished => {
                self.from.writer_done();
                self.to.on_end();
                Step::Done
            }
        }
    }
}

/// The write path of one direction: each frame goes straight to the other
/// side's reader, from the engine or from the sending thread.
struct Handover(Driver);

impl Wire for Handover {
    fn write(&mut self, frames: &mut [Frame], _ctx: &WireCtx<'_>) -> Result<(), ConnError> {
        for f in frames {
            // An error fails both sides: the receiver here, the sender
            // when this returns.
            self.0.on_frame(f.header, f.payload.take())?;
        }
        Ok(())
    }
}

/// Accepts `mem://` connections.
#[derive(Debug)]
pub struct MemListener {
    rx: Receiver<Pending>,
    local: Endpoint,
    shared: Arc<Shared>,
}

impl MemListener {
    fn shut(&self) {
        if self.shared.close.close() {
            let mut reg = registry().lock().unwrap_or_else(|p| p.into_inner());
            // The name may be another listener's by now only if this one
            // was removed before; remove only our own entry.
            if reg.get(self.local.host()).is_some_and(|e| Arc::ptr_eq(&e.shared, &self.shared)) {
                reg.remove(self.local.host());
            }
        }
    }
}

impl Drop for MemListener {
    fn drop(&mut self) {
        self.shut();
    }
}

impl zerocast_core::Listener for MemListener {
    type Conn = MemConnection;

    fn accept_until(&self, deadline: Option<Instant>) -> Result<MemConnection, AcceptError> {
        let conn = self.shared.close.wait(&self.rx, deadline)?;
        self.shared.counters.accepted();
        Ok(conn)
    }

    fn poll_accept(
        &self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<MemConnection, AcceptError>> {
        self.shared.close.poll_wait(&self.rx, cx).map(|r| {
            let conn = r?;
            self.shared.counters.accepted();
            Ok(conn)
        })
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use zerocast_core::{Connection as _, Listener as _, Transport as _};
    use zerocast_mem::PoolConfig;

    use super::*;

    fn transport() -> MemTransport {
        let pool = Pool::unregistered(PoolConfig::default()).expect("pool");
        MemTransport::new(pool, LinkConfig::default().with_max_payload(4096)).expect("transport")
    }

    fn ep(s: &str) -> Endpoint {
        Endpoint::parse(s).expect("endpoint")
    }

    #[test]
    fn a_name_ending_in_colon_zero_is_a_fresh_one() {
        let t = transport();
        let a = t.listen(&ep("mem://:0?window=8")).expect("listen");
        let b = t.listen(&ep("mem://:0")).expect("a second anonymous listener");
        let named = t.listen(&ep("mem://jobs:0")).expect("listen with a prefix");
        let (na, nb) = (a.local_endpoint().host(), b.local_endpoint().host());
        assert_ne!(na, nb);
        assert!(na.starts_with("anon-") && nb.starts_with("anon-"), "{na} {nb}");
        assert!(named.local_endpoint().host().starts_with("jobs-"), "{}", named.local_endpoint());
        assert_eq!(a.local_endpoint().param("window"), Some("8"), "parameters are kept");
        assert!(!a.local_endpoint().to_string().contains(":0"), "{}", a.local_endpoint());

        // Peers reach each listener at the endpoint it reports.
        let client = t.connect(a.local_endpoint()).expect("connect");
        let server = a.accept_until(None).expect("accept");
        let mut buf = client.alloc(2, None).expect("alloc");
        buf.copy_from_slice(b"hi");
        client.send(buf, None).expect("send");
        let got = server.recv(None).expect("recv");
        assert_eq!(&*got, b"hi");
        assert!(matches!(b.accept_until(Some(std::time::Instant::now())), Err(AcceptError::Timeout)));
        assert_eq!((a.stats().accepted, b.stats().accepted), (1, 0));
    }

    #[test]
    fn a_closed_listener_refuses_and_frees_its_name() {
        let t = transport();
        let l = t.listen(&ep("mem://closing-test")).expect("listen");
        assert!(matches!(t.listen(&ep("mem://closing-test")), Err(ConnectError::InUse(_))));
        l.close();
        assert!(matches!(t.connect(&ep("mem://closing-test")), Err(ConnectError::Refused(_))));
        assert!(matches!(
            l.accept_until(Some(std::time::Instant::now() + Duration::from_secs(5))),
            Err(AcceptError::Closed)
        ));
        let again = t.listen(&ep("mem://closing-test")).expect("the name is free again");
        drop(l);
        // Dropping the closed listener leaves the new one's name alone.
        t.connect(again.local_endpoint()).expect("the new listener still listens");
        assert_eq!(again.stats().accepted, 0);
    }
}
