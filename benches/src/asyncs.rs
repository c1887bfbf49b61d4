//! The async API (`zerocast::tokio`) against its baselines: round trips
//! against a tokio `TcpStream` ping-pong (`TCP_NODELAY`), and a message
//! stream against zerocast's own blocking [`crate::ZcPipe`]. Each side
//! owns a runtime of two worker threads; the pinging side is one task of
//! it that times a whole round of round trips, and the peer (echo or
//! receiver) another.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;
use zerocast::tokio::{Connection, Zerocast};
use zerocast::{Config, LinkConfig};

use crate::pingpong::PingPong;
use crate::{bench_link, link_for, mask, stamp, stamp_of, BoxError, Pipe, RAW_PREFIX};

const TCP: &str = "tcp://127.0.0.1:0";

/// The runtime both sides use: two worker threads, I/O and time on.
pub(crate) fn runtime() -> Result<Runtime, BoxError> {
    Ok(tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?)
}

/// A connected async pair on `rt`, with `link`'s settings.
async fn async_pair(link: LinkConfig) -> Result<(Connection, Connection), BoxError> {
    let zc = Zerocast::with_config(Config::default().with_link(link));
    let listener = zc.listen(TCP).await?;
    let at = listener.local_endpoint().to_string();
    let (client, server) = tokio::join!(zc.connect(&at), listener.accept());
    Ok((client?, server?))
}

/// zerocast's async raw API: the echo task receives a buffer, allocates a
/// reply, stamps it, sends it.
#[derive(Debug)]
pub struct AsyncZcPing {
    rt: Runtime,
    conn: Option<Connection>,
    size: usize,
    seq: u64,
    echo: Option<JoinHandle<()>>,
}

impl AsyncZcPing {
    /// Round trips of `size` bytes over `tcp://`.
    pub fn new(size: usize) -> Result<Self, BoxError> {
        let rt = runtime()?;
        let (conn, server) = rt.block_on(async_pair(link_for(size)))?;
        let echo = rt.spawn(async move {
            while let Ok(m) = server.recv().await {
                let mut reply = server.alloc(m.len()).await.expect("echo alloc");
                stamp(&mut reply, stamp_of(&m));
                drop(m);
                if server.send(reply).await.is_err() {
                    return;
                }
            }
        });
        Ok(Self { rt, conn: Some(conn), size, seq: 0, echo: Some(echo) })
    }
}

impl AsyncZcPing {
    /// One round trip, in the task.
    async fn once(conn: &Connection, size: usize, seq: u64) -> Duration {
        let start = Instant::now();
        let mut buf = conn.alloc(size).await.expect("zerocast alloc");
        stamp(&mut buf, seq);
        conn.send(buf).await.expect("zerocast send");
        let reply = conn.recv().await.expect("zerocast echo");
        let took = start.elapsed();
        assert_eq!(stamp_of(&reply), seq & mask(size), "zerocast echo out of order");
        took
    }
}

impl PingPong for AsyncZcPing {
    fn round_trip(&mut self) -> Duration {
        let (conn, size, seq) = (self.conn.clone().expect("open"), self.size, self.seq);
        self.seq += 1;
        self.rt.block_on(async move { Self::once(&conn, size, seq).await })
    }

    fn round_trips(&mut self, n: usize, out: &mut Vec<u64>) {
        let (conn, size, first) = (self.conn.clone().expect("open"), self.size, self.seq);
        self.seq += n as u64;
        let task = self.rt.spawn(async move {
            let mut v = Vec::with_capacity(n);
            for seq in first..first + n as u64 {
                v.push(Self::once(&conn, size, seq).await.as_nanos() as u64);
            }
            v
        });
        *out = self.rt.block_on(task).expect("ping task");
    }
}

impl Drop for AsyncZcPing {
    fn drop(&mut self) {
        if let Some(c) = self.conn.take() {
            c.close();
        }
        if let Some(h) = self.echo.take() {
            let _ = self.rt.block_on(h);
        }
    }
}

/// The baseline: a tokio `TcpStream` pair with `TCP_NODELAY`, one
/// `write_all` of an 8-byte length and the payload, `read_exact` of the
/// same (the raw ping-pong's framing); the echo is a task.
#[derive(Debug)]
pub struct TokioPing {
    rt: Runtime,
    stream: Option<tokio::net::TcpStream>,
    frame: Vec<u8>,
    seq: u64,
    echo: Option<JoinHandle<()>>,
}

impl TokioPing {
    /// Round trips of `size` payload bytes.
    pub fn new(size: usize) -> Result<Self, BoxError> {
        let rt = runtime()?;
        let (stream, echo) = rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let at = listener.local_addr()?;
            let (client, server) = tokio::join!(tokio::net::TcpStream::connect(at), listener.accept());
            let (client, (mut server, _)) = (client?, server?);
            client.set_nodelay(true)?;
            server.set_nodelay(true)?;
            let echo = tokio::spawn(async move {
                let mut frame = vec![0u8; RAW_PREFIX + size];
                while server.read_exact(&mut frame).await.is_ok() {
                    if server.write_all(&frame).await.is_err() {
                        return;
                    }
                }
            });
            Ok::<_, BoxError>((client, echo))
        })?;
        let mut frame = vec![0u8; RAW_PREFIX + size];
        frame[..RAW_PREFIX].copy_from_slice(&(size as u64).to_le_bytes());
        Ok(Self { rt, stream: Some(stream), frame, seq: 0, echo: Some(echo) })
    }
}

impl TokioPing {
    /// One round trip, in the task.
    async fn once(stream: &mut tokio::net::TcpStream, frame: &mut [u8], seq: u64) -> Duration {
        let start = Instant::now();
        stamp(&mut frame[RAW_PREFIX..], seq);
        stream.write_all(frame).await.expect("tokio send");
        stream.read_exact(frame).await.expect("tokio echo");
        let took = start.elapsed();
        assert_eq!(stamp_of(&frame[RAW_PREFIX..]), seq & mask(frame.len() - RAW_PREFIX));
        took
    }
}

impl PingPong for TokioPing {
    fn round_trip(&mut self) -> Duration {
        let mut v = Vec::new();
        self.round_trips(1, &mut v);
        Duration::from_nanos(v[0])
    }

    fn round_trips(&mut self, n: usize, out: &mut Vec<u64>) {
        let (mut stream, mut frame, first) =
            (self.stream.take().expect("open"), std::mem::take(&mut self.frame), self.seq);
        self.seq += n as u64;
        let task = self.rt.spawn(async move {
            let mut v = Vec::with_capacity(n);
            for seq in first..first + n as u64 {
                v.push(Self::once(&mut stream, &mut frame, seq).await.as_nanos() as u64);
            }
            (stream, frame, v)
        });
        let (stream, frame, v) = self.rt.block_on(task).expect("ping task");
        (self.stream, self.frame, *out) = (Some(stream), frame, v);
    }
}

impl Drop for TokioPing {
    fn drop(&mut self) {
        drop(self.stream.take());
        if let Some(h) = self.echo.take() {
            let _ = self.rt.block_on(h);
        }
    }
}

/// zerocast's async raw API as a stream: a sending task allocates, stamps
/// and sends `n` messages, and times them until a receiver task, which
/// takes each, checks its order and drops it, says the batch is in. Both
/// are tasks of the runtime, as an async application's are; the measuring
/// thread only waits for the sender's result.
#[derive(Debug)]
pub struct AsyncZcPipe {
    rt: Runtime,
    conn: Option<Connection>,
    size: usize,
    n: u64,
    seq: u64,
    done: Option<tokio::sync::mpsc::Receiver<()>>,
    receiver: Option<JoinHandle<()>>,
}

impl AsyncZcPipe {
    /// `n` messages of `size` bytes per batch over `tcp://`, with the
    /// blocking pipe's settings.
    pub fn new(size: usize, n: u64) -> Result<Self, BoxError> {
        let rt = runtime()?;
        let (conn, server) = rt.block_on(async_pair(bench_link()))?;
        let (tx, done) = tokio::sync::mpsc::channel(1);
        let receiver = rt.spawn(async move {
            let mut expect = 0u64;
            loop {
                for _ in 0..n {
                    match server.recv().await {
                        Ok(m) => assert_eq!(stamp_of(&m), expect, "zerocast receiver: out of order"),
                        Err(_) => return,
                    }
                    expect += 1;
                }
                if tx.send(()).await.is_err() {
                    return;
                }
            }
        });
        Ok(Self { rt, conn: Some(conn), size, n, seq: 0, done: Some(done), receiver: Some(receiver) })
    }
}

impl Pipe for AsyncZcPipe {
    fn batch(&mut self) -> Duration {
        let (conn, size, n) = (self.conn.clone().expect("open"), self.size, self.n);
        let mut done = self.done.take().expect("open");
        let mut seq = self.seq;
        let task = self.rt.spawn(async move {
            let start = Instant::now();
            for _ in 0..n {
                let mut buf = conn.alloc(size).await.expect("zerocast alloc");
                stamp(&mut buf, seq);
                seq += 1;
                conn.send(buf).await.expect("zerocast send");
            }
            done.recv().await.expect("zerocast receiver stopped");
            (start.elapsed(), seq, done)
        });
        let (took, seq, done) = self.rt.block_on(task).expect("sending task");
        (self.seq, self.done) = (seq, Some(done));
        took
    }

    fn msgs(&self) -> u64 {
        self.n
    }

    fn bytes(&self) -> u64 {
        self.n * self.size as u64
    }
}

impl Drop for AsyncZcPipe {
    fn drop(&mut self) {
        if let Some(c) = self.conn.take() {
            c.close();
        }
        if let Some(h) = self.receiver.take() {
            let _ = self.rt.block_on(h);
        }
    }
}
