//! The zerocast side of every comparison: raw buffer sends and typed sends.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use zerocast::{Config, Connection, LinkConfig, LinkStats, Sender, Zerocast};

use crate::{stamp, stamp_of, BoxError, Pipe, Small, WINDOW};

/// The link settings every pipe uses unless told otherwise: a receive
/// window of [`WINDOW`], the rest default.
pub fn bench_link() -> LinkConfig {
    LinkConfig::default().with_recv_window(WINDOW)
}

/// A connected client/server pair at `uri` (`tcp://127.0.0.1:0`, or
/// `mem://name`, made unique per call), with [`bench_link`] settings.
pub fn zc_pair(uri: &str) -> Result<(Connection, Connection), BoxError> {
    zc_pair_with(uri, bench_link())
}

/// [`zc_pair`] with other link settings.
pub fn zc_pair_with(uri: &str, link: LinkConfig) -> Result<(Connection, Connection), BoxError> {
    static UNIQUE: AtomicU64 = AtomicU64::new(0);
    let uri = match uri.strip_prefix("mem://") {
        Some(name) => format!("mem://{name}-{}", UNIQUE.fetch_add(1, Ordering::Relaxed)),
        None => uri.to_owned(),
    };
    let cfg = Config::default().with_link(link);
    let zc = Zerocast::with_config(cfg);
    let listener = zc.listen(&uri)?;
    let at = listener.local_endpoint().to_string();
    thread::scope(|s| {
        let client = s.spawn(|| zc.connect(&at));
        let server = listener.accept()?;
        let client = client.join().map_err(|_| "connect thread panicked")??;
        Ok((client, server))
    })
}

/// Spawn a receiver that takes `n` messages at a time with `recv_one`
/// (which returns false at the end of the stream) and reports each batch.
pub(crate) fn spawn_receiver(
    n: u64,
    mut recv_one: impl FnMut(u64) -> bool + Send + 'static,
) -> Result<(Receiver<()>, JoinHandle<()>), BoxError> {
    let (tx, done): (SyncSender<()>, _) = sync_channel(1);
    let h = thread::Builder::new().name("zc-bench-rx".into()).spawn(move || {
        let mut expect = 0u64;
        loop {
            for _ in 0..n {
                if !recv_one(expect) {
                    return;
                }
                expect += 1;
            }
            if tx.send(()).is_err() {
                return;
            }
        }
    })?;
    Ok((done, h))
}

/// zerocast's raw buffer API: `alloc`, write the payload in place, `send`;
/// the receiver takes each [`zerocast::RecvBuf`], reads it, drops it.
#[derive(Debug)]
pub struct ZcPipe {
    conn: Connection,
    size: usize,
    n: u64,
    seq: u64,
    done: Receiver<()>,
    receiver: Option<JoinHandle<()>>,
}

impl ZcPipe {
    /// A pipe at `uri` sending `n` messages of `size` bytes per batch.
    pub fn new(uri: &str, size: usize, n: u64) -> Result<Self, BoxError> {
        Self::with_link(uri, size, n, bench_link())
    }

    /// [`ZcPipe::new`] with other link settings.
    pub fn with_link(uri: &str, size: usize, n: u64, link: LinkConfig) -> Result<Self, BoxError> {
        let (conn, server) = zc_pair_with(uri, link)?;
        let (done, h) = spawn_receiver(n, move |expect| match server.recv() {
            Ok(m) => {
                assert_eq!(stamp_of(&m), expect, "zerocast receiver: message out of order");
                true
            }
            Err(_) => false,
        })?;
        Ok(Self { conn, size, n, seq: 0, done, receiver: Some(h) })
    }

    /// The sending connection's counters (credit frames, times blocked).
    pub fn stats(&self) -> LinkStats {
        self.conn.stats()
    }
}

impl Pipe for ZcPipe {
    fn batch(&mut self) -> Duration {
        let start = Instant::now();
        for _ in 0..self.n {
            let mut buf = self.conn.alloc(self.size).expect("zerocast alloc");
            stamp(&mut buf, self.seq);
            self.seq += 1;
            self.conn.send(buf).expect("zerocast send");
        }
        self.done.recv().expect("zerocast receiver stopped");
        start.elapsed()
    }

    fn msgs(&self) -> u64 {
        self.n
    }

    fn bytes(&self) -> u64 {
        self.n * self.size as u64
    }
}

impl Drop for ZcPipe {
    fn drop(&mut self) {
        self.conn.close();
        if let Some(h) = self.receiver.take() {
            let _ = h.join();
        }
    }
}

/// zerocast's typed API: `Sender<Small>::send` of a fresh (cloned) message,
/// `Receiver<Small>::recv` of an owned one.
#[derive(Debug)]
pub struct TypedPipe {
    tx: Sender<Small>,
    template: Small,
    encoded: usize,
    n: u64,
    seq: u64,
    done: Receiver<()>,
    receiver: Option<JoinHandle<()>>,
}

impl TypedPipe {
    /// A pipe at `uri` sending `n` copies of `template` per batch.
    pub fn new(uri: &str, template: Small, n: u64) -> Result<Self, BoxError> {
        let (conn, server) = zc_pair(uri)?;
        let (tx, _) = conn.split::<Small, ()>();
        let (_, rx) = server.split::<(), Small>();
        let (done, h) = spawn_receiver(n, move |expect| match rx.recv() {
            Ok(m) => {
                assert_eq!(m.id, Small::id_of(expect), "typed receiver: message out of order");
                true
            }
            Err(_) => false,
        })?;
        let encoded = template.encoded_len();
        Ok(Self { tx, template, encoded, n, seq: 0, done, receiver: Some(h) })
    }

    /// Encoded size of one message: the payload a raw send of the same
    /// message would carry.
    pub fn encoded_len(&self) -> usize {
        self.encoded
    }
}

impl Pipe for TypedPipe {
    fn batch(&mut self) -> Duration {
        let start = Instant::now();
        for _ in 0..self.n {
            let mut m = self.template.clone();
            m.id = Small::id_of(self.seq);
            self.seq += 1;
            self.tx.send(m).expect("typed send");
        }
        self.done.recv().expect("typed receiver stopped");
        start.elapsed()
    }

    fn msgs(&self) -> u64 {
        self.n
    }

    fn bytes(&self) -> u64 {
        self.n * self.encoded as u64
    }
}

impl Drop for TypedPipe {
    fn drop(&mut self) {
        self.tx.connection().close();
        if let Some(h) = self.receiver.take() {
            let _ = h.join();
        }
    }
}
