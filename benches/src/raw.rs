//! The hand-written baselines: length-prefixed messages on a plain socket2
//! TCP socket over loopback, `TCP_NODELAY` on both ends.

use std::io::{self, BufReader, IoSlice, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr};
use std::sync::mpsc::{sync_channel, Receiver};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::{stamp, stamp_of, BoxError, Pipe, RAW_PREFIX};

/// Bytes a batched baseline gathers into one write.
pub const WRITE_BATCH: usize = 64 * 1024;

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
    /// [`Baseline::Batched`] and [`Baseline::Naive`]: the sender.
    writer: FrameWriter,
    /// [`Baseline::Gathered`]: the headers of a `writev`, and one payload
    /// buffer per message.
    headers: Vec<u8>,
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
        let writer = match mode {
            Baseline::Naive => FrameWriter::naive(size),
            Baseline::Batched | Baseline::Gathered => FrameWriter::batched(size),
        };
        let (headers, payloads) = match mode {
            Baseline::Gathered => {
                let mut headers = vec![0u8; GATHER * prefix];
                for h in headers.chunks_mut(prefix) {
                    h[..RAW_PREFIX].copy_from_slice(&(size as u64).to_le_bytes());
                }
                (headers, (0..GATHER).map(|_| vec![0u8; size]).collect())
            }
            Baseline::Batched | Baseline::Naive => (Vec::new(), Vec::new()),
        };
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
        Ok(Self { sock, mode, size, n, writer, headers, payloads, seq: 0, done, receiver: Some(receiver) })
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
) -> io::Result<()> {
    let mut prefix = [0u8; 16];
    let prefix = &mut prefix[..prefix_len];
    loop {
        for i in 0..n {
            match read_frame(r, prefix, payload) {
                Err(e) if i == 0 && e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                other => other?,
            }
            assert_eq!(stamp_of(payload), *expect, "raw receiver: message out of order");
            *expect += 1;
        }
        if !done() {
            return Ok(());
        }
    }
}

/// Read one frame: its `prefix` (whose first 8 bytes are the payload's
/// length, little-endian), then its payload into `payload`, whose length
/// the prefix must name.
pub fn read_frame(r: &mut impl Read, prefix: &mut [u8], payload: &mut [u8]) -> io::Result<()> {
    r.read_exact(prefix)?;
    let mut len = [0u8; RAW_PREFIX];
    len.copy_from_slice(&prefix[..RAW_PREFIX]);
    let len = u64::from_le_bytes(len);
    if len != payload.len() as u64 {
        let e = format!("a frame of {len} bytes, not {}", payload.len());
        return Err(io::Error::new(io::ErrorKind::InvalidData, e));
    }
    r.read_exact(payload)
}

/// The batched and naive baselines' sender: `per_write` frames (the
/// 8-byte length, then the payload) built once in one buffer. Each send
/// stamps the next sequence numbers into them and writes as many as it
/// sends with one `write_all`.
#[derive(Debug)]
pub struct FrameWriter {
    frames: Vec<u8>,
    size: usize,
    per_write: usize,
    seq: u64,
}

impl FrameWriter {
    /// [`Baseline::Batched`]'s sender: as many frames per write as fit in
    /// [`WRITE_BATCH`] bytes, and at least one.
    pub fn batched(size: usize) -> Self {
        Self::new(size, (WRITE_BATCH / (RAW_PREFIX + size)).max(1))
    }

    /// [`Baseline::Naive`]'s sender: one frame per write.
    pub fn naive(size: usize) -> Self {
        Self::new(size, 1)
    }

    fn new(size: usize, per_write: usize) -> Self {
        let frame = RAW_PREFIX + size;
        let mut frames = vec![0u8; per_write * frame];
        for f in frames.chunks_mut(frame) {
            f[..RAW_PREFIX].copy_from_slice(&(size as u64).to_le_bytes());
        }
        Self { frames, size, per_write, seq: 0 }
    }

    /// Write `n` messages to `w`, numbered on from the last send's.
    pub fn send(&mut self, mut w: impl Write, n: u64) -> io::Result<()> {
        let frame = RAW_PREFIX + self.size;
        let mut left = n;
        while left > 0 {
            let k = left.min(self.per_write as u64) as usize;
            for f in self.frames[..k * frame].chunks_mut(frame) {
                stamp(&mut f[RAW_PREFIX..], self.seq);
                self.seq += 1;
            }
            w.write_all(&self.frames[..k * frame])?;
            left -= k as u64;
        }
        Ok(())
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
            for (i, (h, p)) in self.headers.chunks(prefix).zip(&self.payloads[..k]).enumerate() {
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
        self.writer.send(&self.sock, self.n).expect("raw send");
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
