//! Many clients against a small key-value service: a zerocast server and a
//! plain `std::net` server, each written the way a user of its blocking API
//! naturally would: with a thread per accepted connection doing receive →
//! handle → send, and for zerocast also with a few threads and a
//! [`zerocast::Poller`].
//!
//! - [`Server::Zerocast`]: `Listener::accept` in a loop, and for each
//!   connection a thread with `split::<Reply, Req>()` answering every request
//!   of `rx.iter()` with `tx.send(..)`. Default settings (`Zerocast::new()`).
//! - [`Server::Polled`]: the same channels, but [`POLLED_THREADS`] serving
//!   threads and a [`zerocast::Poller`]: each connection's receiver is
//!   registered as it is accepted, and a serving thread answers every
//!   request of each reported connection with `try_recv` until it is empty.
//! - [`Server::Std`]: `TcpListener::accept` in a loop, `TCP_NODELAY`, and for
//!   each connection a thread reading length-prefixed bincode 2 frames (the
//!   same serde types, the same bincode configuration as zerocast's codec)
//!   through a `BufReader` and writing each reply as one `write_all`.
//!
//! Both serve the same [`Store`], and both are driven by the same client
//! harness ([`run_round`]): `threads` client threads, each holding an equal
//! share of the `clients` connections (opened, and each answered once,
//! before the clock starts). For
//! each of the `requests` steps a client thread sends one request on each of
//! its connections, then takes the reply of each: every connection does its
//! requests one after another, each waiting for its reply, and all of them
//! are in flight at once. With `threads == clients` that is one thread per
//! client. The clients use the same library as their server: zerocast's
//! typed channels against the zerocast server, `TcpStream` against the std
//! one.

use std::collections::HashMap;
use std::io::{self, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Barrier, Mutex, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use zerocast::{Events, Poller, Receiver, RecvError, Sender, TypedRecvError, Zerocast};

use crate::BoxError;

/// The value of a key.
pub type Value = [u8; 32];

/// A request to the service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Req {
    /// The value stored at `key`, if any.
    Get {
        /// The key.
        key: u64,
    },
    /// Store `value` at `key`.
    Put {
        /// The key.
        key: u64,
        /// Its new value.
        value: Value,
    },
}

/// The service's answer to a [`Req`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// The answer to a `Get`.
    Value(Option<Value>),
    /// The answer to a `Put`: whether it replaced a value.
    Stored {
        /// A value was there before.
        replaced: bool,
    },
}

/// Shards of the store: enough that two cores seldom contend on one.
const SHARDS: usize = 64;

/// The service's state: a map sharded by key, each shard behind a mutex.
#[derive(Debug)]
pub struct Store {
    shards: Vec<Mutex<HashMap<u64, Value>>>,
}

impl Default for Store {
    fn default() -> Self {
        Self { shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect() }
    }
}

impl Store {
    /// Carry out one request.
    pub fn handle(&self, req: Req) -> Reply {
        let shard = |key: u64| self.shards[(key % SHARDS as u64) as usize].lock().expect("store poisoned");
        match req {
            Req::Get { key } => Reply::Value(shard(key).get(&key).copied()),
            Req::Put { key, value } => Reply::Stored { replaced: shard(key).insert(key, value).is_some() },
        }
    }
}

/// Keys each client cycles through (its own: no two clients share a key).
const KEYS_PER_CLIENT: u64 = 64;

/// Attempts beyond the first at a zerocast connect that failed in a way
/// worth retrying.
const CONNECT_TRIES: u32 = 5;

/// Keys from here down are never put: each client's untimed first request
/// gets one of them.
const UNUSED_KEY: u64 = u64::MAX;

/// Request `i` of client `c`: a `Put` at even steps, and at odd steps a
/// `Get` of the key just put.
pub fn request(c: u64, i: u64) -> Req {
    let key = c * KEYS_PER_CLIENT + (i / 2) % KEYS_PER_CLIENT;
    if i % 2 == 0 {
        Req::Put { key, value: value_of(c, i) }
    } else {
        Req::Get { key }
    }
}

fn value_of(c: u64, i: u64) -> Value {
    let mut v = [0u8; 32];
    v[..8].copy_from_slice(&c.to_le_bytes());
    v[8..16].copy_from_slice(&i.to_le_bytes());
    v
}

/// Whether `reply` is the right answer to [`request`]`(c, i)` (each client
/// owns its keys and waits for each reply, so the answer is known).
pub fn check(c: u64, i: u64, reply: &Reply) -> bool {
    match (request(c, i), reply) {
        (Req::Put { .. }, Reply::Stored { replaced }) => *replaced == (i >= 2 * KEYS_PER_CLIENT),
        (Req::Get { .. }, Reply::Value(Some(v))) => *v == value_of(c, i - 1),
        _ => false,
    }
}

/// Which server a round runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    /// zerocast typed channels over `tcp://127.0.0.1:0`, a thread per
    /// connection.
    Zerocast,
    /// The same, served by [`POLLED_THREADS`] threads through a
    /// [`zerocast::Poller`] instead of a thread per connection.
    Polled,
    /// `std::net` with length-prefixed bincode frames.
    Std,
}

impl Server {
    /// Its short name.
    pub fn name(self) -> &'static str {
        match self {
            Server::Zerocast => "zerocast",
            Server::Polled => "zc-poll",
            Server::Std => "std",
        }
    }
}

/// Serving threads of [`Server::Polled`]: one per core of the machine
/// these figures come from.
pub const POLLED_THREADS: usize = 2;

/// The size of a run.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Client connections, open at the same time.
    pub clients: usize,
    /// Requests each client makes, one after another.
    pub requests: u64,
    /// Client threads that drive them (each an equal share).
    pub threads: usize,
}

/// What one round measured.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    /// Requests answered per second, from the first request to the last reply.
    pub rate: f64,
    /// That time.
    pub elapsed: Duration,
    /// The time to open every connection and make one request on each
    /// (not counted in the rate).
    pub connect: Duration,
    /// The most threads this process ran while the requests went on.
    pub peak_threads: usize,
    /// zerocast connects tried again after a retryable failure.
    pub connect_retries: u64,
}

/// This process's threads (`/proc/self/task`).
pub fn threads_now() -> usize {
    std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0)
}

/// Raise the soft limit of open files to the hard limit; the limit now in
/// force.
pub fn raise_open_files() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let old = getrlimit(Resource::Nofile);
    if old.current != old.maximum {
        // Failing leaves the old limit, which the caller checks.
        let _ = setrlimit(Resource::Nofile, Rlimit { current: old.maximum, maximum: old.maximum });
    }
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// One side of a client connection, as the harness drives it.
trait Client: Send {
    fn send(&mut self, req: Req) -> Result<(), BoxError>;
    fn recv(&mut self) -> Result<Reply, BoxError>;
}

struct ZcClient {
    tx: Sender<Req>,
    rx: Receiver<Reply>,
}

impl Client for ZcClient {
    fn send(&mut self, req: Req) -> Result<(), BoxError> {
        self.tx.send(req).map_err(|e| format!("zerocast send: {e}").into())
    }

    fn recv(&mut self) -> Result<Reply, BoxError> {
        Ok(self.rx.recv()?)
    }
}

/// The length prefix of a std frame: a little-endian `u32`.
const PREFIX: usize = 4;

/// A framed std connection: writes whole frames, reads through a buffer.
/// One descriptor (no `try_clone`), so that a process can hold both ends of
/// nearly 10,000 connections within 20,000 open files.
struct Framed {
    stream: BufReader<TcpStream>,
    out: Vec<u8>,
    inb: Vec<u8>,
}

impl Framed {
    fn new(stream: TcpStream) -> io::Result<Self> {
        stream.set_nodelay(true)?;
        Ok(Self { stream: BufReader::new(stream), out: Vec::with_capacity(64), inb: Vec::with_capacity(64) })
    }

    fn write<T: Serialize>(&mut self, msg: &T) -> Result<(), BoxError> {
        self.out.clear();
        self.out.extend_from_slice(&[0; PREFIX]);
        bincode::serde::encode_into_std_write(msg, &mut self.out, bincode::config::standard())?;
        let len = u32::try_from(self.out.len() - PREFIX)?;
        self.out[..PREFIX].copy_from_slice(&len.to_le_bytes());
        self.stream.get_mut().write_all(&self.out)?;
        Ok(())
    }

    /// The next message, or `None` at a clean end of the stream.
    fn read<T: serde::de::DeserializeOwned>(&mut self) -> Result<Option<T>, BoxError> {
        let mut len = [0u8; PREFIX];
        match self.stream.read_exact(&mut len) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        let len = u32::from_le_bytes(len) as usize;
        if len > 1024 {
            return Err(format!("frame of {len} bytes").into());
        }
        self.inb.resize(len, 0);
        self.stream.read_exact(&mut self.inb)?;
        let (msg, _) = bincode::serde::decode_from_slice(&self.inb, bincode::config::standard())?;
        Ok(Some(msg))
    }
}

impl Client for Framed {
    fn send(&mut self, req: Req) -> Result<(), BoxError> {
        self.write(&req)
    }

    fn recv(&mut self) -> Result<Reply, BoxError> {
        self.read()?.ok_or_else(|| "the std server closed the connection".into())
    }
}

/// A running server: where clients connect, and the accepting thread,
/// which accepts `clients` connections and hands back their threads.
struct Running {
    at: String,
    acceptor: JoinHandle<Result<Vec<JoinHandle<()>>, BoxError>>,
}

fn zc_server(zc: &Zerocast, clients: usize, store: Arc<Store>) -> Result<Running, BoxError> {
    let listener = zc.listen("tcp://127.0.0.1:0")?;
    let at = listener.local_endpoint().to_string();
    let acceptor = thread::Builder::new().name("kv-zc-accept".into()).spawn(move || {
        let mut handlers = Vec::with_capacity(clients);
        for _ in 0..clients {
            let conn = listener.accept()?;
            let store = store.clone();
            handlers.push(thread::spawn(move || {
                let (tx, rx) = conn.split::<Reply, Req>();
                for req in rx.iter() {
                    if tx.send(store.handle(req)).is_err() {
                        return;
                    }
                }
            }));
        }
        Ok(handlers)
    })?;
    Ok(Running { at, acceptor })
}

/// A token no connection has: stop serving.
const STOP: usize = usize::MAX;

/// One connection of the polled server.
type Slot = OnceLock<(Sender<Reply>, Receiver<Req>)>;

fn zc_polled_server(zc: &Zerocast, clients: usize, store: Arc<Store>) -> Result<Running, BoxError> {
    let listener = zc.listen("tcp://127.0.0.1:0")?;
    let at = listener.local_endpoint().to_string();
    let acceptor = thread::Builder::new().name("kv-poll-accept".into()).spawn(move || {
        let poller = Poller::new();
        // Token `i` is the `i`th connection accepted.
        let slots: Arc<Vec<Slot>> = Arc::new((0..clients).map(|_| OnceLock::new()).collect());
        let ended = Arc::new(AtomicUsize::new(0));
        let workers = (0..POLLED_THREADS)
            .map(|_| {
                let (poller, slots, ended, store) =
                    (poller.clone(), slots.clone(), ended.clone(), store.clone());
                thread::spawn(move || serve_polled(&poller, &slots, &ended, &store))
            })
            .collect();
        for (token, slot) in slots.iter().enumerate() {
            let (tx, rx) = listener.accept()?.split::<Reply, Req>();
            // In its slot before it can be reported.
            let rx = &slot.get_or_init(|| (tx, rx)).1;
            poller.register(rx.connection(), token)?;
        }
        Ok(workers)
    })?;
    Ok(Running { at, acceptor })
}

/// A serving thread of [`Server::Polled`]: answer every request of each
/// reported connection until it has none, until every connection ended.
fn serve_polled(poller: &Poller, slots: &[Slot], ended: &AtomicUsize, store: &Store) {
    let mut events = Events::with_capacity(64);
    loop {
        poller.wait(&mut events, None);
        for token in events.iter() {
            if token == STOP {
                // For the other serving threads.
                poller.wake(STOP);
                return;
            }
            let Some((tx, rx)) = slots.get(token).and_then(OnceLock::get) else { continue };
            loop {
                match rx.try_recv() {
                    Ok(req) => {
                        if tx.send(store.handle(req)).is_err() {
                            break;
                        }
                    }
                    Err(TypedRecvError::Recv(RecvError::Empty)) => break,
                    Err(_) => {
                        if ended.fetch_add(1, Ordering::Relaxed) + 1 == slots.len() {
                            poller.wake(STOP);
                        }
                        break;
                    }
                }
            }
        }
    }
}

fn std_server(clients: usize, store: Arc<Store>) -> Result<Running, BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let at = listener.local_addr()?.to_string();
    let acceptor = thread::Builder::new().name("kv-std-accept".into()).spawn(move || {
        let mut handlers = Vec::with_capacity(clients);
        for _ in 0..clients {
            let (stream, _) = listener.accept()?;
            let store = store.clone();
            handlers.push(thread::spawn(move || {
                let Ok(mut conn) = Framed::new(stream) else { return };
                while let Ok(Some(req)) = conn.read::<Req>() {
                    if conn.write(&store.handle(req)).is_err() {
                        return;
                    }
                }
            }));
        }
        Ok(handlers)
    })?;
    Ok(Running { at, acceptor })
}

/// The zerocast contexts of the two sides, kept for the whole run: one for
/// the server, one for the clients, as two processes would have.
#[derive(Debug, Default)]
pub struct Contexts {
    server: Zerocast,
    client: Zerocast,
}

/// Open every connection to `server`, run `shape.requests` requests on each
/// from `shape.threads` client threads, check every reply, close them all
/// and wait for the server's threads to end.
pub fn run_round(server: Server, shape: Shape, zc: &Contexts) -> Result<Outcome, BoxError> {
    let Shape { clients, requests, threads } = shape;
    let threads = threads.clamp(1, clients.max(1));
    let store = Arc::new(Store::default());
    let running = match server {
        Server::Zerocast => zc_server(&zc.server, clients, store)?,
        Server::Polled => zc_polled_server(&zc.server, clients, store)?,
        Server::Std => std_server(clients, store)?,
    };
    let at = running.at.as_str();
    let retries = AtomicU64::new(0);
    let connect = |_c: u64| -> Result<Box<dyn Client>, BoxError> {
        Ok(match server {
            Server::Zerocast | Server::Polled => {
                // A handshake that times out on a loaded machine (a SYN
                // dropped at a full accept queue is resent after 1 s, then
                // 3 s) is tried again, as README's reconnect loop does.
                let mut tries = 0;
                let conn = loop {
                    match zc.client.connect(at) {
                        Ok(conn) => break conn,
                        Err(e) if e.kind().is_retryable() && tries < CONNECT_TRIES => {
                            tries += 1;
                            retries.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => return Err(e.into()),
                    }
                };
                let (tx, rx) = conn.split::<Req, Reply>();
                Box::new(ZcClient { tx, rx })
            }
            Server::Std => Box::new(Framed::new(TcpStream::connect(at.parse::<SocketAddr>()?)?)?),
        })
    };
    let opened = Barrier::new(threads + 1);
    let (done_tx, done) = mpsc::channel::<Result<(), BoxError>>();
    let connecting = Instant::now();
    let measured = thread::scope(|s| -> Result<(Duration, Duration, usize), BoxError> {
        for t in 0..threads {
            let (opened, done_tx, connect) = (&opened, done_tx.clone(), &connect);
            // Client `c` belongs to thread `c % threads`.
            let mine: Vec<u64> = (t as u64..clients as u64).step_by(threads).collect();
            thread::Builder::new().name("kv-client".into()).spawn_scoped(s, move || {
                let mut conns: Vec<Box<dyn Client>> = Vec::with_capacity(mine.len());
                let opening: Result<(), BoxError> = mine.iter().try_for_each(|&c| {
                    conns.push(connect(c)?);
                    Ok(())
                });
                // One untimed request on each, so that every connection is
                // accepted and served before the clock starts (a std
                // connect completes before the server accepts it).
                let opening = opening.and_then(|()| {
                    for (&c, conn) in mine.iter().zip(conns.iter_mut()) {
                        conn.send(Req::Get { key: UNUSED_KEY - c })?;
                    }
                    for conn in &mut conns {
                        if conn.recv()? != Reply::Value(None) {
                            return Err("a wrong reply to the first request".into());
                        }
                    }
                    Ok(())
                });
                opened.wait();
                let result = opening.and_then(|()| {
                    for i in 0..requests {
                        for (&c, conn) in mine.iter().zip(conns.iter_mut()) {
                            conn.send(request(c, i))?;
                        }
                        for (&c, conn) in mine.iter().zip(conns.iter_mut()) {
                            let reply = conn.recv()?;
                            if !check(c, i, &reply) {
                                return Err(format!("client {c}, request {i}: wrong reply {reply:?}").into());
                            }
                        }
                    }
                    Ok(())
                });
                // Report, then close the connections.
                let _ = done_tx.send(result);
                drop(conns);
            })?;
        }
        drop(done_tx);
        opened.wait();
        let start = Instant::now();
        let connect_time = start - connecting;
        let mut peak = threads_now();
        let mut finished = 0;
        while finished < threads {
            match done.recv_timeout(Duration::from_millis(200)) {
                Ok(r) => {
                    r?;
                    finished += 1;
                    peak = peak.max(threads_now());
                }
                Err(mpsc::RecvTimeoutError::Timeout) => peak = peak.max(threads_now()),
                Err(mpsc::RecvTimeoutError::Disconnected) => return Err("a client thread died".into()),
            }
        }
        Ok((start.elapsed(), connect_time, peak))
    })?;
    let (elapsed, connect_time, peak_threads) = measured;
    let handlers = running.acceptor.join().map_err(|_| "the accepting thread panicked")??;
    for h in handlers {
        h.join().map_err(|_| "a server thread panicked")?;
    }
    Ok(Outcome {
        rate: (clients as u64 * requests) as f64 / elapsed.as_secs_f64(),
        elapsed,
        connect: connect_time,
        peak_threads,
        connect_retries: retries.into_inner(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_servers_answer_every_client() {
        let zc = Contexts::default();
        for server in [Server::Zerocast, Server::Polled, Server::Std] {
            for threads in [2, 12] {
                let shape = Shape { clients: 12, requests: 2 * KEYS_PER_CLIENT + 6, threads };
                let out = run_round(server, shape, &zc).unwrap();
                assert!(out.rate > 0.0 && out.peak_threads > 0, "{server:?}: {out:?}");
            }
        }
    }

    #[test]
    fn requests_and_their_answers() {
        let store = Store::default();
        for i in 0..3 * KEYS_PER_CLIENT {
            assert!(check(5, i, &store.handle(request(5, i))), "request {i}");
        }
        assert!(!check(5, 1, &Reply::Value(None)));
    }
}
