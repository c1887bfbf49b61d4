//! The hand-written baselines: length-prefixed messages on a plain socket2
//! TCP socket over loopback, `TCP_NODELAY` on both ends.

use std::io::{BufReader, IoSlice, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr};
use std::sync::mpsc::{sync_channel, Receiver};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::{stamp, stamp_of, BoxError, Pipe, RAW_PREFIX};

/// Bytes a batched baseline gathers into one write.
const WRITE_BATCH: usize = 64 * 1024;

/// Which hand-written sender and receiver to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Baseline {
    /// The strong baseline. Sender: frames (8-byte length + payload) built
    /// in place in a 64 KiB buffer and sent with one `write_all` per full
    /// buffer; a frame bigger than that is its own `write_all`. Receiver:
    /// `read_exact` of prefix and payload through a 64 KiB `BufReader` into
    /// one reused buffer.
    Batched,
    /// The naive baseline. Sender: one `write_all` of one frame per message
    /// (one `write` syscall). Receiver: two `read_exact` calls per message
    /// on the unbuffered socket.
    Naive,
    /// A diagnostic, not a goal: the wire shape of zerocast's TCP writer
    /// without the framework. Sender: one `writev` per 64 messages, each a
    /// 16-byte header and its own separately allocated payload (two iovecs
    /// per message). Receiver: as [`Baseline::Batched`], with a 16-byte
    /// prefix.
    Gathered,
}

/// Messages per `writev` of [`Baseline::Gathered`]: zerocast's writer chunk.
const GATHER: usize = 64;

impl Baseline {
    /// Bytes before each payload on the wire.
    pub fn prefix_len(self) -> usize {
        match self {
            Baseline::Batched | Baseline::Naive => RAW_PREFIX,
            Baseline::Gathered => 16,
        }
    }
}

/// A raw-socket [`Pipe`].
#[derive(Debug)]
pub struct RawPipe {
    sock: Socket,
    mode: Baseline,
    size: usize,
    n: u64,
    /// Frames per write, and the pre-built frames themselves.
    per_write: usize,
    frames: Vec<u8>,
    /// [`Baseline::Gathered`]: one payload buffer per message of a `writev`.
    payloads: Vec<Vec<u8>>,
    seq: u64,
    done: Receiver<()>,
    receiver: Option<JoinHandle<()>>,
}

/// A connected pair of loopback TCP sockets with `TCP_NODELAY`.
pub fn socket_pair() -> std::io::Result<(Socket, Socket)> {
    let listener = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
    listener.bind(&SockAddr::from(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))))?;
    listener.listen(1)?;
    let at = listener.local_addr()?;
    let client = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
    client.connect(&at)?;
    let (server, _) = listener.accept()?;
    for s in [&client, &server] {
        s.set_nodelay(true)?;
    }
    Ok((client, server))
}

impl RawPipe {
    /// A pipe sending `n` messages of `size` bytes per batch.
    pub fn new(mode: Baseline, size: usize, n: u64) -> Result<Self, BoxError> {
        let (sock, server) = socket_pair()?;
        let prefix = mode.prefix_len();
        let (per_write, frame, payloads) = match mode {
            Baseline::Batched => ((WRITE_BATCH / (prefix + size)).max(1), prefix + size, Vec::new()),
            Baseline::Naive => (1, prefix + size, Vec::new()),
            // `frames` holds only the headers; payloads live apart.
            Baseline::Gathered => (GATHER, prefix, (0..GATHER).map(|_| vec![0u8; size]).collect()),
        };
        let mut frames = vec![0u8; per_write * frame];
        for f in frames.chunks_mut(frame) {
            f[..RAW_PREFIX].copy_from_slice(&(size as u64).to_le_bytes());
        }
        let (tx, done) = sync_channel(1);
        let receiver = thread::Builder::new().name("raw-rx".into()).spawn(move || {
            let mut payload = vec![0u8; size];
            let mut expect = 0u64;
            let ok = match mode {
                Baseline::Batched | Baseline::Gathered => {
                    let mut r = BufReader::with_capacity(WRITE_BATCH, &server);
                    receive(&mut r, prefix, &mut payload, n, &mut expect, || tx.send(()).is_ok())
                }
                Baseline::Naive => {
                    receive(&mut &server, prefix, &mut payload, n, &mut expect, || tx.send(()).is_ok())
                }
            };
            debug_assert!(ok.is_ok(), "raw receiver: {ok:?}");
        })?;
        Ok(Self { sock, mode, size, n, per_write, frames, payloads, seq: 0, done, receiver: Some(receiver) })
    }

    /// Which baseline this is.
    pub fn mode(&self) -> Baseline {
        self.mode
    }
}

/// Receive batches of `n` frames until the sender shuts down; `done` after
/// each batch (stop when it returns false).
fn receive(
    r: &mut impl Read,
    prefix_len: usize,
    payload: &mut [u8],
    n: u64,
    expect: &mut u64,
    mut done: impl FnMut() -> bool,
) -> std::io::Result<()> {
    let mut prefix = [0u8; 16];
    let prefix = &mut prefix[..prefix_len];
    loop {
        for i in 0..n {
            match r.read_exact(prefix) {
                Err(e) if i == 0 && e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                other => other?,
            }
            let mut len = [0u8; RAW_PREFIX];
            len.copy_from_slice(&prefix[..RAW_PREFIX]);
            let len = u64::from_le_bytes(len) as usize;
            assert_eq!(len, payload.len(), "raw receiver: bad length prefix");
            r.read_exact(payload)?;
            assert_eq!(stamp_of(payload), *expect, "raw receiver: message out of order");
            *expect += 1;
        }
        if !done() {
            return Ok(());
        }
    }
}

impl RawPipe {
    fn batch_gathered(&mut self) -> Duration {
        let start = Instant::now();
        let prefix = self.mode.prefix_len();
        let mut w = &self.sock;
        let mut left = self.n;
        while left > 0 {
            let k = left.min(GATHER as u64) as usize;
            for p in &mut self.payloads[..k] {
                stamp(p, self.seq);
                self.seq += 1;
            }
            let mut iov = [IoSlice::new(&[]); 2 * GATHER];
            for (i, (h, p)) in self.frames.chunks(prefix).zip(&self.payloads[..k]).enumerate() {
                iov[2 * i] = IoSlice::new(h);
                iov[2 * i + 1] = IoSlice::new(p);
            }
            let mut slices = &mut iov[..2 * k];
            while !slices.is_empty() {
                let n = w.write_vectored(slices).expect("raw send");
                IoSlice::advance_slices(&mut slices, n);
            }
            left -= k as u64;
        }
        self.done.recv().expect("raw receiver stopped");
        start.elapsed()
    }
}

impl Pipe for RawPipe {
    fn batch(&mut self) -> Duration {
        if self.mode == Baseline::Gathered {
            return self.batch_gathered();
        }
        let start = Instant::now();
        let frame = self.mode.prefix_len() + self.size;
        let mut w = &self.sock;
        let mut left = self.n;
        while left > 0 {
            let k = left.min(self.per_write as u64) as usize;
            for f in self.frames[..k * frame].chunks_mut(frame) {
                stamp(&mut f[frame - self.size..], self.seq);
                self.seq += 1;
            }
            w.write_all(&self.frames[..k * frame]).expect("raw send");
            left -= k as u64;
        }
        self.done.recv().expect("raw receiver stopped");
        start.elapsed()
    }

    fn msgs(&self) -> u64 {
        self.n
    }

    fn bytes(&self) -> u64 {
        self.n * self.size as u64
    }
}

impl Drop for RawPipe {
    fn drop(&mut self) {
        let _ = self.sock.shutdown(Shutdown::Write);
        if let Some(h) = self.receiver.take() {
            let _ = h.join();
        }
    }
}
