//! `mem://name`: an in-process transport.
//!
//! Two threads of one process talk as if over the network, with the same
//! handshake, frames, sequence numbers and credits as `tcp://` and `rc://`,
//! but a message is never copied: the pool buffer itself moves from the
//! sender to the receiver. It serves same-process pipelines and tests that
//! want real flow control without sockets.
//!
//! It does **not** cross process boundaries, and names live in one
//! process-wide registry: listening on a name that is taken fails.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::thread;

use crossbeam_channel::{bounded, Receiver, Sender};
use zerocast_core::{Caps, ConnectError, Endpoint, LinkConfig, Scheme};
use zerocast_link::{Driver, Flavor, LinkSetup};
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

/// Listening names of this process: each name's backlog and settings.
type Registry = Mutex<HashMap<String, (Sender<Pending>, LinkConfig)>>;

fn registry() -> &'static Registry {
    static REG: OnceLock<Registry> = OnceLock::new();
    REG.get_or_init(Default::default)
}

/// The in-process transport.
#[derive(Debug, Clone)]
pub struct MemTransport {
    pool: Pool,
    link: LinkConfig,
}

impl MemTransport {
    /// A transport whose messages live in `pool`.
    pub fn new(pool: Pool, link: LinkConfig) -> Result<Self, ConnectError> {
        link.validate().map_err(ConnectError::transport)?;
        Ok(Self { pool, link })
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
        if reg.contains_key(ep.host()) {
            return Err(ConnectError::InUse(ep.to_string()));
        }
        let (tx, rx) = bounded(128);
        reg.insert(ep.host().to_owned(), (tx, link));
        Ok(MemListener { rx, local: ep.clone() })
    }

    fn connect(&self, ep: &Endpoint) -> Result<MemConnection, ConnectError> {
        let link = self.link_config(ep)?;
        let (backlog, server_link) = registry()
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
        })
        .map_err(handshake)?;
        let (s_link, s_driver, _) = zerocast_link::new(LinkSetup {
            config: server_link,
            peer_hello: client_hello,
            pool: self.pool.clone(),
            peer: peer_of_server,
            repost: false,
        })
        .map_err(handshake)?;
        let io = |e| ConnectError::Io { endpoint: ep.to_string(), source: e };
        pump(c_driver.clone(), s_driver.clone(), "c2s").map_err(io)?;
        pump(s_driver, c_driver, "s2c").map_err(io)?;
        backlog
            .try_send(MemConnection::new(s_link, ()))
            .map_err(|_| ConnectError::Refused(ep.to_string()))?;
        Ok(MemConnection::new(c_link, ()))
    }
}

/// Move frames from one side's writer queue to the other side's reader.
fn pump(from: Driver, to: Driver, dir: &str) -> std::io::Result<()> {
    thread::Builder::new().name(format!("zerocast-mem-{dir}")).spawn(move || {
        let mut batch = Vec::with_capacity(64);
        while from.next_batch(&mut batch) {
            for f in batch.drain(..) {
                if let Err(e) = to.on_frame(f.header, f.payload) {
                    // Both sides see the failure; nothing more moves.
                    from.fail(e);
                    return;
                }
            }
        }
        from.writer_done();
        to.on_end();
    })?;
    Ok(())
}

/// Accepts `mem://` connections.
#[derive(Debug)]
pub struct MemListener {
    rx: Receiver<Pending>,
    local: Endpoint,
}

impl Drop for MemListener {
    fn drop(&mut self) {
        registry().lock().unwrap_or_else(|p| p.into_inner()).remove(self.local.host());
    }
}

impl zerocast_core::Listener for MemListener {
    type Conn = MemConnection;

    fn accept(&self) -> Result<MemConnection, ConnectError> {
        self.rx.recv().map_err(|_| ConnectError::Closed)
    }

    fn local_endpoint(&self) -> &Endpoint {
        &self.local
    }
}
