//! The data path of a test: one message out, one message in, raw or typed,
//! spinning or blocking, on a connection shaped for the test.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::pin;
use std::rc::Rc;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll as TaskPoll, Wake, Waker};
use std::time::Duration;

use tokio::runtime::Runtime;

use anyhow::{anyhow, bail};
use serde::{Deserialize, Serialize, Serializer};
use zerocast::{
    Buf, Config, Connection, LinkConfig, PoolConfig, Receiver, RecvError, SendError, Sender, Zerocast,
};

use crate::spec::{Poll, Spec, MAX_SIZE};

/// What typed messages carry: zeros (the sequence number has its own field).
static ZEROS: [u8; MAX_SIZE] = [0; MAX_SIZE];

/// The typed message: a sequence number and the payload, as a byte string
/// (one `memcpy` to encode, borrowed on receive).
#[derive(Debug, Serialize, Deserialize, yoke::Yokeable)]
pub(crate) struct Chunk<'a> {
    seq: u64,
    #[serde(borrow, serialize_with = "as_bytes")]
    data: &'a [u8],
}

fn as_bytes<S: Serializer>(data: &&[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_bytes(data)
}

/// A zerocast context for one test: the window, payload limit, pool and
/// (RDMA) completion mode the spec asks for.
pub(crate) fn context_for(spec: &Spec) -> Zerocast {
    Zerocast::with_config(config_for(spec))
}

/// The settings of [`context_for`].
pub(crate) fn config_for(spec: &Spec) -> Config {
    let max_payload = spec.max_payload();
    let link = LinkConfig::default().with_recv_window(spec.window).with_max_payload(max_payload as u64);
    // The default classes stay: datagram sockets need one of 64 KiB.
    let mut classes = PoolConfig::default().classes;
    classes.push(max_payload);
    classes.sort_unstable();
    classes.dedup();
    // Receive buffers for the window, as many in flight the other way, and
    // slack for a batch being written; plus a region for each small class.
    let region = 4 << 20;
    let big = (2 * spec.window as usize + 8) * max_payload.next_multiple_of(4096);
    let pool = PoolConfig::default()
        .with_classes(classes)
        .with_region_size(region)
        .with_max_bytes(big.next_multiple_of(region) + 8 * region);
    #[allow(unused_mut)]
    let mut cfg = Config::default().with_link(link).with_pool(pool);
    #[cfg(feature = "rdma")]
    {
        use zerocast::rdma::{CompletionMode, RcConfig};
        let mode = match spec.poll {
            Poll::Busy => CompletionMode::BusyPoll,
            Poll::Event => CompletionMode::Channel,
        };
        cfg = cfg.with_rc(RcConfig::default().with_completion(mode));
    }
    cfg
}

/// Where a received message's sequence number is: the first up-to-8 bytes.
/// (Eight bytes, the usual case, are one store: no call to `memcpy`.)
fn stamp(payload: &mut [u8], seq: u64) {
    match payload.first_chunk_mut::<8>() {
        Some(head) => *head = seq.to_le_bytes(),
        None => {
            let n = payload.len();
            payload.copy_from_slice(&seq.to_le_bytes()[..n]);
        }
    }
}

fn stamp_of(payload: &[u8]) -> u64 {
    if let Some(head) = payload.first_chunk::<8>() {
        return u64::from_le_bytes(*head);
    }
    let mut b = [0u8; 8];
    b[..payload.len()].copy_from_slice(payload);
    u64::from_le_bytes(b)
}

/// The sequence numbers a message of `size` bytes can tell apart.
fn seq_mask(size: usize) -> u64 {
    match size {
        8.. => u64::MAX,
        n => (1u64 << (8 * n)) - 1,
    }
}

/// One end of a data connection, as the test uses it.
#[derive(Debug)]
pub(crate) enum Io {
    Raw(Connection),
    Typed(Sender<Chunk<'static>>, Receiver<Chunk<'static>>),
    /// The async API, each call run to its end on the runtime (a current
    /// thread one, which runs the engines while this thread waits in it).
    Async(Rc<Runtime>, zerocast::tokio::Connection),
}

/// A received message: its sequence number (masked to what its size holds)
/// and its payload length.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Got {
    pub(crate) seq: u64,
    pub(crate) len: usize,
}

/// One side of a test's data path.
#[derive(Debug)]
pub(crate) struct DataPath {
    io: Io,
    size: usize,
    busy: bool,
    mask: u64,
    /// The next message's buffer, taken ahead (see [`DataPath::prepare`]).
    spare: RefCell<Option<Buf>>,
    closed: Cell<bool>,
}

impl DataPath {
    pub(crate) fn new(conn: Connection, spec: &Spec) -> Self {
        let io = if spec.typed {
            let (tx, rx) = conn.split();
            Io::Typed(tx, rx)
        } else {
            Io::Raw(conn)
        };
        Self {
            io,
            size: spec.size,
            busy: spec.poll == Poll::Busy,
            mask: seq_mask(spec.size),
            spare: RefCell::new(None),
            closed: Cell::new(false),
        }
    }

    /// A data path through the async API, on `rt`.
    pub(crate) fn new_async(rt: Rc<Runtime>, conn: zerocast::tokio::Connection, spec: &Spec) -> Self {
        Self {
            io: Io::Async(rt, conn),
            size: spec.size,
            busy: false,
            mask: seq_mask(spec.size),
            spare: RefCell::new(None),
            closed: Cell::new(false),
        }
    }

    /// Take the next raw message's buffer from the pool now, while a reply
    /// is on its way, so that the send after it does not wait for the
    /// pool: what a latency-bound application does with the raw API. A
    /// no-op for typed messages, which the sender encodes into a buffer of
    /// its own.
    pub(crate) async fn prepare(&self) -> anyhow::Result<()> {
        if self.spare.borrow().is_none() {
            let buf = match &self.io {
                Io::Raw(conn) => return self.prepare_raw(conn),
                Io::Async(_, conn) => conn.alloc(self.size).await?,
                Io::Typed(..) => return Ok(()),
            };
            *self.spare.borrow_mut() = Some(buf);
        }
        Ok(())
    }

    /// [`DataPath::prepare`] on a raw connection.
    pub(crate) fn prepare_raw(&self, conn: &Connection) -> anyhow::Result<()> {
        let mut spare = self.spare.borrow_mut();
        if spare.is_none() {
            *spare = Some(conn.alloc(self.size)?);
        }
        Ok(())
    }

    /// The connection of a raw data path on the blocking API, whose
    /// latency loops call it with no future in between.
    pub(crate) fn raw(&self) -> Option<&Connection> {
        match &self.io {
            Io::Raw(conn) => Some(conn),
            _ => None,
        }
    }

    /// Receive the next raw message (spinning on `try_recv_with` when
    /// busy) and run `then` on it while it is held: a reply sent from
    /// `then` goes out before the message's buffer goes back (see
    /// [`DataPath::recv_then`]). `None` once the peer closed.
    pub(crate) fn recv_raw_then<R>(
        &self,
        conn: &Connection,
        then: impl FnOnce(Got) -> anyhow::Result<R>,
    ) -> anyhow::Result<Option<R>> {
        let mut then = Some(then);
        loop {
            let mut run =
                |m: &[u8]| then.take().map(|f| f(Got { seq: stamp_of(m) & self.mask, len: m.len() }));
            let r = if self.busy { conn.try_recv_with(&mut run) } else { conn.recv_with(&mut run) };
            match r {
                Ok(Some(r)) => return r.map(Some),
                Ok(None) => unreachable!("a message runs `then` once"),
                Err(e) => {
                    if !again(e)? {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// Send raw message `seq`, in the buffer [`DataPath::prepare_raw`] took.
    pub(crate) fn send_raw(&self, conn: &Connection, seq: u64) -> anyhow::Result<()> {
        let mut buf = match self.spare.take() {
            Some(b) => b,
            None => conn.alloc(self.size)?,
        };
        stamp(&mut buf, seq);
        if self.busy {
            let mut buf = buf;
            loop {
                match conn.try_send(buf) {
                    Ok(()) => return Ok(()),
                    Err(SendError::Full(b)) => buf = b,
                    Err(e) => return Err(send_failed(e)),
                }
            }
        }
        conn.send(buf).map_err(send_failed)
    }

    /// Run `fut`, one of this data path's loops: on the runtime through
    /// the async API, with one `block_on` for the whole loop, as an async
    /// application runs it in one task; otherwise in one poll, since the
    /// blocking API's calls wait inside it.
    pub(crate) fn drive<R>(&self, fut: impl Future<Output = anyhow::Result<R>>) -> anyhow::Result<R> {
        match &self.io {
            Io::Async(rt, _) => rt.block_on(fut),
            _ => {
                // The blocking API's calls never leave a poll pending, so
                // nothing wakes this waker, made once rather than per
                // message.
                static NEVER: LazyLock<Waker> = LazyLock::new(|| Waker::from(Arc::new(NeverWoken)));
                match pin!(fut).poll(&mut Context::from_waker(&NEVER)) {
                    TaskPoll::Ready(r) => r,
                    TaskPoll::Pending => bail!("a blocking data path's call returned before its end"),
                }
            }
        }
    }

    /// Send message `seq` of the test's size, awaited inside a loop that
    /// [`DataPath::drive`] runs.
    pub(crate) async fn send_async(&self, seq: u64) -> anyhow::Result<()> {
        match &self.io {
            Io::Raw(conn) => self.send_raw(conn, seq),
            Io::Async(_, conn) => {
                let mut buf = match self.spare.take() {
                    Some(b) => b,
                    None => conn.alloc(self.size).await?,
                };
                stamp(&mut buf, seq);
                conn.send(buf).await.map_err(send_failed)
            }
            Io::Typed(tx, _) => {
                let mut msg = Chunk { seq, data: &ZEROS[..self.size] };
                if self.busy {
                    loop {
                        match tx.try_send(msg) {
                            Ok(()) => return Ok(()),
                            Err(SendError::Full(m)) => {
                                msg = m;
                            }
                            Err(e) => return Err(send_failed(e)),
                        }
                    }
                }
                tx.send(msg).map_err(send_failed)
            }
        }
    }

    /// Receive the next message and run `then` on it; `None` once the peer
    /// closed and every message before its goodbye was received.
    ///
    /// With `hold`, the message is still held while `then` runs: its buffer
    /// goes back (an RDMA receive is posted again, and its credit returns)
    /// only after `then`. A reply sent from `then` goes out first, so giving
    /// the buffer back is not on the round trip: that work is done while
    /// the reply travels. Without it, a message is read where it arrives
    /// ([`zerocast::Connection::recv_with`], [`zerocast::Receiver::recv_with`]:
    /// no handle, no guard) and let go before `then`, as a sink lets it go.
    pub(crate) async fn recv_then<R, T: Future<Output = anyhow::Result<R>>>(
        &self,
        hold: bool,
        then: impl FnOnce(Got) -> T,
    ) -> anyhow::Result<Option<R>> {
        let of_chunk = |c: &Chunk<'_>| Got { seq: c.seq & self.mask, len: c.data.len() };
        loop {
            let r = match &self.io {
                Io::Raw(conn) if hold => match if self.busy { conn.try_recv() } else { conn.recv() } {
                    Ok(m) => {
                        return then(Got { seq: stamp_of(&m) & self.mask, len: m.len() }).await.map(Some)
                    }
                    Err(e) => e,
                },
                Io::Raw(conn) => {
                    let got = |m: &[u8]| Got { seq: stamp_of(m) & self.mask, len: m.len() };
                    match if self.busy { conn.try_recv_with(got) } else { conn.recv_with(got) } {
                        Ok(got) => return then(got).await.map(Some),
                        Err(e) => e,
                    }
                }
                Io::Async(_, conn) => match conn.recv().await {
                    Ok(m) => {
                        return then(Got { seq: stamp_of(&m) & self.mask, len: m.len() }).await.map(Some)
                    }
                    Err(e) => e,
                },
                Io::Typed(_, rx) if hold => {
                    match if self.busy { rx.recv_ref_timeout(Duration::ZERO) } else { rx.recv_ref() } {
                        Ok(g) => return then(of_chunk(g.get())).await.map(Some),
                        Err(e) => typed_nothing(e)?,
                    }
                }
                Io::Typed(_, rx) => {
                    let r = if self.busy {
                        rx.recv_with_timeout(Duration::ZERO, of_chunk)
                    } else {
                        rx.recv_with(of_chunk)
                    };
                    match r {
                        Ok(got) => return then(got).await.map(Some),
                        Err(e) => typed_nothing(e)?,
                    }
                }
            };
            if !again(r)? {
                return Ok(None);
            }
        }
    }

    /// Receive message `expect`, failing on anything else.
    pub(crate) async fn recv_expect(&self, expect: u64) -> anyhow::Result<Got> {
        self.recv_expect_then(expect, |_| async { Ok(()) }).await
    }

    /// Receive message `expect`, failing on anything else, and run `then`
    /// while it is held (see [`DataPath::recv_then`]).
    pub(crate) async fn recv_expect_then<T: Future<Output = anyhow::Result<()>>>(
        &self,
        expect: u64,
        then: impl FnOnce(Got) -> T,
    ) -> anyhow::Result<Got> {
        let got = self
            .recv_then(true, |got| async move {
                self.check(got, expect)?;
                then(got).await?;
                Ok(got)
            })
            .await?;
        got.ok_or_else(|| early(expect))
    }

    /// Check a received message's number and length.
    pub(crate) fn check(&self, got: Got, expect: u64) -> anyhow::Result<()> {
        if got.seq != expect & self.mask {
            bail!("message {expect} arrived as {} (lost or out of order)", got.seq);
        }
        if got.len != self.size {
            bail!("message {expect} has {} bytes, not {}", got.len, self.size);
        }
        Ok(())
    }

    /// Send a goodbye after everything queued. Through the async API, wait
    /// (a while) for the connection to end too: the runtime runs the
    /// engines only while this thread is in it.
    pub(crate) fn close(&self) {
        if self.closed.replace(true) {
            return;
        }
        match &self.io {
            Io::Raw(c) => c.close(),
            Io::Typed(tx, _) => tx.connection().close(),
            Io::Async(rt, conn) => {
                let _ = rt.block_on(async { tokio::time::timeout(ASYNC_CLOSE, conn.close_and_wait()).await });
            }
        }
    }
}

/// The waker of a blocking data path's loop, whose calls never leave a
/// poll pending.
struct NeverWoken;

impl Wake for NeverWoken {
    fn wake(self: Arc<Self>) {}
}

/// How long an async data path's close waits for the peer's goodbye.
const ASYNC_CLOSE: Duration = Duration::from_secs(10);

impl Drop for DataPath {
    fn drop(&mut self) {
        if let Io::Async(..) = self.io {
            self.close();
        }
    }
}

/// A typed receive's error: the transport's, for [`again`], or a message
/// that did not decode.
fn typed_nothing(e: zerocast::TypedRecvError) -> anyhow::Result<RecvError> {
    match e {
        zerocast::TypedRecvError::Recv(e) => Ok(e),
        e => Err(anyhow!(e).context("a typed message did not decode")),
    }
}

/// What a receive that got no message says: poll again (`true`: nothing
/// yet), the peer is done (`false`), or the connection failed.
fn again(e: RecvError) -> anyhow::Result<bool> {
    match e {
        // Back to back, with no `spin_loop` hint, as perftest polls: under
        // TCG a PAUSE leaves the vCPU's translated code, about a
        // microsecond on every half round trip.
        RecvError::Empty | RecvError::Timeout => Ok(true),
        RecvError::Disconnected => Ok(false),
        e => Err(anyhow!(e).context("the data connection failed")),
    }
}

/// The peer closed while message `expect` was awaited.
pub(crate) fn early(expect: u64) -> anyhow::Error {
    anyhow!("the peer closed the data connection early (waiting for message {expect})")
}

fn send_failed<T>(e: SendError<T>) -> anyhow::Error {
    anyhow!("send failed: {}", e.map(drop))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_round_trip_within_the_size() {
        let mut p = [0u8; 3];
        stamp(&mut p, 0x0102_0304);
        assert_eq!(stamp_of(&p), 0x02_0304);
        assert_eq!(0x0102_0304 & seq_mask(3), 0x02_0304);
        assert_eq!(seq_mask(8), u64::MAX);
        assert_eq!(seq_mask(64), u64::MAX);
    }

    #[test]
    fn typed_chunks_encode_bytes_once() {
        use zerocast::Codec;
        let c = Chunk { seq: 7, data: &[1, 2, 3, 4] };
        let mut buf = [0u8; 64];
        let n = zerocast::Bincode.encode(&c, &mut buf).unwrap();
        let back: Chunk<'_> = zerocast::Bincode.decode(&buf[..n]).unwrap();
        assert_eq!((back.seq, back.data), (7, &[1u8, 2, 3, 4][..]));
        assert!(n <= 4 + 16, "{n} bytes: the payload must be one byte string");
    }
}
