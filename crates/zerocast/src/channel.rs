//! Typed channels: `Sender<T>` and `Receiver<T>` over any connection.

use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, TryLockError};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use yoke::{Yoke, Yokeable};
use zerocast_core::{RecvError, SendError};
use zerocast_link::RecvBuf;
use zerocast_mem::{Buf, PoolError};

use crate::borrow::Guard;
use crate::codec::{decode_limit, Bincode, Codec, CodecError};
use crate::conn::Connection;
use crate::error::TypedRecvError;
use crate::typecheck::{self, Verdict};

/// Smallest first guess at a message's encoded size.
const MIN_HINT: usize = 64;

struct SendSide<C> {
    conn: Connection,
    codec: C,
    /// The last encoded size: the first guess for the next message.
    hint: AtomicUsize,
    /// Whether the type announcement is out (set from the start when
    /// checking is off): one load per message.
    announced: AtomicBool,
    /// Held while the announcement goes out, so that no clone's message
    /// overtakes it.
    announcing: Mutex<()>,
}

/// The sending half of a typed channel. Clones share it. Sending closes
/// when the last handle that can send is gone: every clone of every
/// `Sender` split from the connection, and every [`Connection`] clone.
/// Then the peer's receiver sees a disconnect after the messages already
/// sent.
///
/// Messages are serialized straight into a pooled send buffer: no
/// intermediate `Vec`.
///
/// With the type check on ([`Config::typed_check`](crate::Config::typed_check),
/// [`Connection::with_typed_check`]), the first send of the channel (of any
/// clone) first sends an announcement of `T`'s name and fingerprint, which
/// the peer's [`Receiver`] checks against its own type and never shows.
pub struct Sender<T, C = Bincode> {
    side: Arc<SendSide<C>>,
    _t: PhantomData<fn(T)>,
}

impl<T, C> Clone for Sender<T, C> {
    fn clone(&self) -> Self {
        Self { side: self.side.clone(), _t: PhantomData }
    }
}

impl<T, C> fmt::Debug for Sender<T, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sender").field("conn", &self.side.conn).finish()
    }
}

enum Wait<'a> {
    Now,
    Until(Option<Instant>),
    /// For a task: never wait; `Full` once `waker` is set to be woken when
    /// it is worth trying again.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    Task(&'a std::task::Waker),
}

impl<T, C: Codec> Sender<T, C> {
    pub(crate) fn new(conn: Connection, codec: C, check: bool) -> Self {
        let side = SendSide {
            conn,
            codec,
            hint: AtomicUsize::new(MIN_HINT),
            announced: AtomicBool::new(!check),
            announcing: Mutex::new(()),
        };
        Self { side: Arc::new(side), _t: PhantomData }
    }

    /// The underlying connection. This handle (and its clones) holds only
    /// the sending side open, as the `Sender` does.
    pub fn connection(&self) -> &Connection {
        &self.side.conn
    }
}

impl<T: Serialize, C: Codec> Sender<T, C> {
    /// Send `msg`, waiting for credit. On error `msg` comes back.
    pub fn send(&self, msg: T) -> Result<(), SendError<T>> {
        self.send_inner(msg, Wait::Until(None))
    }

    /// Send `msg` if the peer has a free receive buffer (and the pool a
    /// buffer to encode it into) now; [`SendError::Full`] hands it back
    /// otherwise.
    pub fn try_send(&self, msg: T) -> Result<(), SendError<T>> {
        self.send_inner(msg, Wait::Now)
    }

    /// Send `msg`, waiting at most `timeout` for credit.
    pub fn send_timeout(&self, msg: T, timeout: Duration) -> Result<(), SendError<T>> {
        self.send_inner(msg, Wait::Until(Instant::now().checked_add(timeout)))
    }

    fn send_inner(&self, msg: T, wait: Wait<'_>) -> Result<(), SendError<T>> {
        send_encoded::<T, _, _>(&self.side, &msg, wait).map_err(|e| e.map(|()| msg))
    }

    /// Send a message by reference (it is only serialized, never moved).
    pub fn send_ref(&self, msg: &T) -> Result<(), SendError<()>> {
        send_encoded::<T, _, _>(&self.side, msg, Wait::Until(None))
    }

    /// Send for a task: `Full` when it must wait, with `waker` set to be
    /// woken when credit or a pool buffer comes. Nothing of the message is
    /// sent then.
    #[cfg(feature = "tokio")]
    pub(crate) fn send_or_wake(&self, msg: &T, waker: &std::task::Waker) -> Result<(), SendError<()>> {
        send_encoded::<T, _, _>(&self.side, msg, Wait::Task(waker))
    }

    /// [`Sender::try_send`] by reference, for a task's first attempt.
    #[cfg(feature = "tokio")]
    pub(crate) fn try_send_ref(&self, msg: &T) -> Result<(), SendError<()>> {
        send_encoded::<T, _, _>(&self.side, msg, Wait::Now)
    }
}

impl<T, C: Codec> Sender<T, C>
where
    T: for<'a> Yokeable<'a>,
    for<'a> <T as Yokeable<'a>>::Output: Serialize,
{
    /// Send a borrowing message (`T` is its `'static` form, as for
    /// [`Receiver::recv_ref`]): `Sender<Record<'static>>` sends a
    /// `&Record<'a>` whose fields borrow from anywhere.
    pub fn send_borrowed<'a>(&self, msg: &<T as Yokeable<'a>>::Output) -> Result<(), SendError<()>> {
        send_encoded::<T, _, _>(&self.side, msg, Wait::Until(None))
    }

    /// [`Sender::send_borrowed`] without waiting, for a task's first
    /// attempt: `Full` if it would wait.
    #[cfg(feature = "tokio")]
    pub(crate) fn try_send_borrowed<'a>(
        &self,
        msg: &<T as Yokeable<'a>>::Output,
    ) -> Result<(), SendError<()>> {
        send_encoded::<T, _, _>(&self.side, msg, Wait::Now)
    }

    /// [`Sender::send_borrowed`] for a task: `Full` when it must wait, with
    /// `waker` set to be woken when credit or a pool buffer comes.
    #[cfg(feature = "tokio")]
    pub(crate) fn send_borrowed_or_wake<'a>(
        &self,
        msg: &<T as Yokeable<'a>>::Output,
        waker: &std::task::Waker,
    ) -> Result<(), SendError<()>> {
        send_encoded::<T, _, _>(&self.side, msg, Wait::Task(waker))
    }
}

/// Send `msg` on a channel of `T`s, after `T`'s announcement if it is due.
fn send_encoded<T, M: Serialize + ?Sized, C: Codec>(
    side: &SendSide<C>,
    msg: &M,
    wait: Wait<'_>,
) -> Result<(), SendError<()>> {
    if !side.announced.load(Ordering::Acquire) {
        side.announce::<T>(&wait)?;
    }
    let buf = side.encode(msg, &wait)?;
    send_buf(&side.conn, buf, &wait)
}

#[inline(always)]
fn send_buf(conn: &Connection, buf: Buf, wait: &Wait<'_>) -> Result<(), SendError<()>> {
    let r = match *wait {
        Wait::Now => conn.try_send(buf),
        Wait::Task(waker) => conn.send_or_wake(buf, waker),
        Wait::Until(None) => conn.send(buf),
        Wait::Until(Some(d)) => conn.send_timeout(buf, d.saturating_duration_since(Instant::now())),
    };
    // On failure the encoded copy goes back to the pool; the caller keeps
    // (or gets back) the message itself.
    r.map_err(|e| e.map(drop))
}

impl<C: Codec> SendSide<C> {
    /// Send `T`'s announcement unless a clone already has. The one that
    /// sends it holds the others back until it is out; a `try_send` that
    /// would wait for it reports the channel full.
    #[cold]
    fn announce<T>(&self, wait: &Wait<'_>) -> Result<(), SendError<()>> {
        let _one = match wait {
            Wait::Now | Wait::Task(_) => match self.announcing.try_lock() {
                Ok(g) => g,
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
                Err(TryLockError::WouldBlock) => {
                    // Another clone is sending it: a task tries again soon.
                    if let Wait::Task(waker) = wait {
                        waker.wake_by_ref();
                    }
                    return Err(SendError::Full(()));
                }
            },
            Wait::Until(_) => self.announcing.lock().unwrap_or_else(|p| p.into_inner()),
        };
        if self.announced.load(Ordering::Acquire) {
            return Ok(());
        }
        let len = typecheck::encoded_len::<T>();
        if len > self.conn.max_message() {
            // A type name longer than a message: nothing to announce it in.
            self.announced.store(true, Ordering::Release);
            return Ok(());
        }
        let mut buf = self.alloc(len, wait)?;
        let n = typecheck::encode::<T>(buf.spare_capacity());
        buf.set_len(n);
        send_buf(&self.conn, buf, wait)?;
        self.announced.store(true, Ordering::Release);
        Ok(())
    }

    /// Serialize into a pool buffer sized by the last message's size, and
    /// again into an exact-size buffer if that was too small.
    #[inline(always)]
    fn encode<M: Serialize + ?Sized>(&self, msg: &M, wait: &Wait<'_>) -> Result<Buf, SendError<()>> {
        let max = self.conn.max_message();
        let hint = self.hint.load(Ordering::Relaxed).clamp(MIN_HINT, max.max(MIN_HINT)).min(max);
        let mut buf = self.alloc(hint, wait)?;
        let written = match self.codec.encode(msg, buf.spare_capacity()) {
            Ok(n) => n,
            Err(CodecError::BufferTooSmall { .. }) => {
                let need = self.codec.encoded_len(msg).map_err(rejected)?;
                if need > max {
                    let e = zerocast_core::ConnError::TooLarge { len: need as u64, max: max as u64 };
                    return Err(SendError::Rejected((), Arc::new(e)));
                }
                drop(buf);
                buf = self.alloc(need, wait)?;
                self.codec.encode(msg, buf.spare_capacity()).map_err(rejected)?
            }
            Err(e) => return Err(rejected(e)),
        };
        buf.set_len(written);
        self.hint.store(written, Ordering::Relaxed);
        Ok(buf)
    }

    #[inline(always)]
    fn alloc(&self, len: usize, wait: &Wait<'_>) -> Result<Buf, SendError<()>> {
        let conn = &self.conn;
        let r = match wait {
            Wait::Now => conn.alloc_now(len),
            Wait::Task(waker) => conn.alloc_or_wake(len, waker),
            Wait::Until(None) => conn.alloc(len),
            Wait::Until(Some(d)) => conn.alloc_timeout(len, d.saturating_duration_since(Instant::now())),
        };
        r.map_err(|e| match e {
            PoolError::Exhausted { .. } => SendError::Full(()),
            PoolError::Timeout { .. } => SendError::Timeout(()),
            other => SendError::Rejected((), Arc::new(other)),
        })
    }
}

/// A message that does not decode as `T`: the error names `T`, so a
/// receiver of the wrong type says what it expected even when the sender
/// announced nothing.
#[cold]
fn decode_error<T>(e: CodecError) -> TypedRecvError {
    TypedRecvError::Decode(match e {
        CodecError::Decode(why) => CodecError::Decode(format!("as {}: {why}", std::any::type_name::<T>())),
        other => other,
    })
}

fn rejected(e: CodecError) -> SendError<()> {
    SendError::Rejected((), Arc::new(e))
}

struct RecvSide<C> {
    conn: Connection,
    codec: C,
    /// The decode limit: [`decode_limit`] of the connection's `max_payload`.
    limit: usize,
    /// The type the peer announced, once it turned out not to be ours:
    /// every receive fails from then on.
    mismatch: OnceLock<String>,
}

/// The receiving half of a typed channel. Clones share it. Receiving
/// closes (messages still arriving are released at once, returning their
/// credits) when the last handle that can receive is gone: every clone of
/// every `Receiver` split from the connection, and every [`Connection`]
/// clone.
///
/// After the peer's sender closes, buffered messages are received first,
/// then [`RecvError::Disconnected`], as with crossbeam channels.
///
/// A type announcement from the peer's [`Sender`] is checked and never
/// shown: if it names `T` it is skipped (its buffer and credit go back), and
/// otherwise this receive and every later one fail with
/// [`TypedRecvError::TypeMismatch`].
pub struct Receiver<T, C = Bincode> {
    side: Arc<RecvSide<C>>,
    _t: PhantomData<fn() -> T>,
}

impl<T, C> Clone for Receiver<T, C> {
    fn clone(&self) -> Self {
        Self { side: self.side.clone(), _t: PhantomData }
    }
}

impl<T, C> fmt::Debug for Receiver<T, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receiver").field("conn", &self.side.conn).finish()
    }
}

impl<T, C: Codec> Receiver<T, C> {
    pub(crate) fn new(conn: Connection, codec: C) -> Self {
        let limit = decode_limit(conn.max_message());
        Self { side: Arc::new(RecvSide { conn, codec, limit, mismatch: OnceLock::new() }), _t: PhantomData }
    }

    /// The underlying connection. This handle (and its clones) holds only
    /// the receiving side open, as the `Receiver` does.
    pub fn connection(&self) -> &Connection {
        &self.side.conn
    }

    /// The next message that is not a type announcement, from `recv`;
    /// `recv` is called again after an announcement of `T`, so one that
    /// hides a message already queued does not make a `try_recv` empty.
    fn next(&self, mut recv: impl FnMut() -> Result<RecvBuf, RecvError>) -> Result<RecvBuf, TypedRecvError> {
        loop {
            if let Some(sent) = self.side.mismatch.get() {
                return Err(self.mismatch(sent.clone()));
            }
            let buf = recv()?;
            if !typecheck::is_announcement(&buf) {
                return Ok(buf);
            }
            match typecheck::check::<T>(&buf) {
                // Dropping the announcement returns its credit.
                Ok(Verdict::Match) => continue,
                Ok(Verdict::Mismatch(sent)) => {
                    let _ = self.side.mismatch.set(sent.clone());
                    return Err(self.mismatch(sent));
                }
                Err(e) => return Err(TypedRecvError::Announcement(e)),
            }
        }
    }

    fn mismatch(&self, sent: String) -> TypedRecvError {
        TypedRecvError::TypeMismatch { sent, expected: std::any::type_name::<T>() }
    }

    fn recv_buf(&self) -> Result<RecvBuf, TypedRecvError> {
        self.next(|| self.side.conn.recv())
    }

    fn try_recv_buf(&self) -> Result<RecvBuf, TypedRecvError> {
        self.next(|| self.side.conn.try_recv())
    }

    fn recv_buf_timeout(&self, timeout: Duration) -> Result<RecvBuf, TypedRecvError> {
        let deadline = Instant::now().checked_add(timeout);
        self.next(|| match deadline {
            Some(d) => self.side.conn.recv_timeout(d.saturating_duration_since(Instant::now())),
            None => self.side.conn.recv(),
        })
    }
}

impl<T: DeserializeOwned, C: Codec> Receiver<T, C> {
    /// Receive the next message.
    pub fn recv(&self) -> Result<T, TypedRecvError> {
        self.decode(self.recv_buf())
    }

    /// Receive a message if one is buffered.
    pub fn try_recv(&self) -> Result<T, TypedRecvError> {
        self.decode(self.try_recv_buf())
    }

    /// Receive, waiting at most `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<T, TypedRecvError> {
        self.decode(self.recv_buf_timeout(timeout))
    }

    /// An iterator of messages that ends at the first error of any kind:
    /// silently at the peer's clean close, and with a `warn` log at a
    /// connection failure, a message that does not decode or a
    /// [`TypedRecvError::TypeMismatch`]. For a server that must see those,
    /// use [`Receiver::iter_results`].
    pub fn iter(&self) -> impl Iterator<Item = T> + '_ {
        std::iter::from_fn(move || match self.recv() {
            Ok(m) => Some(m),
            Err(e) if e.is_disconnected() => None,
            Err(e) => {
                tracing::warn!(error = %e, "typed receive failed; iteration ends");
                None
            }
        })
    }

    /// An iterator of every receive's outcome, errors included, for servers
    /// that must see them. It yields each message as `Ok`, and each one
    /// that does not decode as `Err(TypedRecvError::Decode)` and goes on
    /// (the connection is fine). It ends after the peer's clean close
    /// ([`RecvError::Disconnected`], which it does not yield), or after
    /// yielding the error that failed the connection
    /// (`TypedRecvError::Recv(RecvError::Failed(_))`), the last item.
    ///
    /// ```no_run
    /// # let rx: zerocast::Receiver<String> = zerocast::connect("tcp://127.0.0.1:7000")?.split::<(), String>().1;
    /// for msg in rx.iter_results() {
    ///     match msg {
    ///         Ok(msg) => println!("{msg}"),
    ///         Err(e) => eprintln!("{e}"),
    ///     }
    /// }
    /// # Ok::<(), zerocast::Error>(())
    /// ```
    pub fn iter_results(&self) -> impl Iterator<Item = Result<T, TypedRecvError>> + '_ {
        let mut done = false;
        std::iter::from_fn(move || {
            if done {
                return None;
            }
            match self.recv() {
                Ok(msg) => Some(Ok(msg)),
                Err(TypedRecvError::Recv(RecvError::Disconnected)) => {
                    done = true;
                    None
                }
                Err(e @ (TypedRecvError::Decode(_) | TypedRecvError::Announcement(_))) => Some(Err(e)),
                Err(e) => {
                    // A failure (nothing else comes from a blocking receive).
                    done = true;
                    Some(Err(e))
                }
            }
        })
    }

    fn decode(&self, r: Result<RecvBuf, TypedRecvError>) -> Result<T, TypedRecvError> {
        let buf = r?;
        // The receive buffer is reposted when `buf` drops, right after decoding.
        self.side.codec.decode_limited::<T>(&buf, self.side.limit).map_err(decode_error::<T>)
    }
}

impl<T, C: Codec> Receiver<T, C>
where
    T: for<'a> Yokeable<'a>,
    for<'a> <T as Yokeable<'a>>::Output: Deserialize<'a>,
{
    /// Receive the next message without copying it out of the receive
    /// buffer: `&str` and `&[u8]` fields of the returned guard borrow the
    /// registered buffer itself, which is reposted when the guard drops.
    ///
    /// `T` is the `'static` form of a borrowing type that derives
    /// `yoke::Yokeable`, for example `Receiver<Record<'static>>`.
    pub fn recv_ref(&self) -> Result<Guard<T>, TypedRecvError> {
        self.attach(self.recv_buf())
    }

    /// [`Receiver::recv_ref`], waiting at most `timeout`.
    pub fn recv_ref_timeout(&self, timeout: Duration) -> Result<Guard<T>, TypedRecvError> {
        self.attach(self.recv_buf_timeout(timeout))
    }

    /// [`Receiver::recv_ref`] if a message is buffered.
    pub fn try_recv_ref(&self) -> Result<Guard<T>, TypedRecvError> {
        self.attach(self.try_recv_buf())
    }

    /// Receive the next message and run `f` on it, borrowed from the
    /// receive buffer, which is reposted once `f` returns; `f`'s result.
    ///
    /// [`Receiver::recv_ref`] for a message handled where it is received:
    /// there is no guard to build, move or drop, so it costs little more
    /// than a raw receive and the decode. A message that does not decode is
    /// [`TypedRecvError::Decode`], and `f` is not called.
    ///
    /// ```no_run
    /// use zerocast::yoke::Yokeable;
    ///
    /// #[derive(serde::Deserialize, Yokeable)]
    /// struct Record<'a> {
    ///     id: u64,
    ///     #[serde(borrow)]
    ///     name: &'a str,
    /// }
    ///
    /// fn name_len(rx: &zerocast::Receiver<Record<'static>>) -> Result<usize, zerocast::TypedRecvError> {
    ///     // `r.name` points into the receive buffer while the closure runs.
    ///     rx.recv_with(|r| r.name.len())
    /// }
    /// ```
    pub fn recv_with<R>(
        &self,
        f: impl for<'a> FnOnce(&<T as Yokeable<'a>>::Output) -> R,
    ) -> Result<R, TypedRecvError> {
        self.lent(Some(None), f)
    }

    /// [`Receiver::recv_with`], waiting at most `timeout`.
    pub fn recv_with_timeout<R>(
        &self,
        timeout: Duration,
        f: impl for<'a> FnOnce(&<T as Yokeable<'a>>::Output) -> R,
    ) -> Result<R, TypedRecvError> {
        self.lent(Some(Instant::now().checked_add(timeout)), f)
    }

    /// [`Receiver::recv_with`] if a message is buffered.
    pub fn try_recv_with<R>(
        &self,
        f: impl for<'a> FnOnce(&<T as Yokeable<'a>>::Output) -> R,
    ) -> Result<R, TypedRecvError> {
        self.lent(None, f)
    }

    /// [`Receiver::try_recv_with`] with `f` in a slot, taken only when a
    /// message is there (for a task's polls, which may find none).
    #[cfg(feature = "tokio")]
    pub(crate) fn try_recv_with_slot<R, F>(&self, f: &mut Option<F>) -> Result<R, TypedRecvError>
    where
        F: for<'a> FnOnce(&<T as Yokeable<'a>>::Output) -> R,
    {
        let Some(g) = f.take() else { return Err(TypedRecvError::Recv(RecvError::Empty)) };
        match self.try_recv_buf() {
            Ok(buf) => self.with(Ok(buf), g),
            Err(e) => {
                *f = Some(g);
                Err(e)
            }
        }
    }

    /// The `recv_with` family: the next message that is not an
    /// announcement (as [`Receiver::next`] finds it), decoded on the
    /// receive buffer the link lends ([`zerocast_link::Link::recv_with`]),
    /// which goes back when `f` returns; no [`RecvBuf`] is made. `wait`:
    /// `None` to try once, `Some(deadline)` to wait (`Some(None)`:
    /// forever).
    #[inline(always)]
    fn lent<R>(
        &self,
        wait: Option<Option<Instant>>,
        f: impl for<'a> FnOnce(&<T as Yokeable<'a>>::Output) -> R,
    ) -> Result<R, TypedRecvError> {
        /// What one lent message came to.
        enum Step<R> {
            Done(R),
            /// An announcement of `T`: receive again.
            Again,
            Failed(TypedRecvError),
        }
        let mut f = Some(f);
        let link = self.side.conn.link();
        loop {
            if let Some(sent) = self.side.mismatch.get() {
                return Err(self.mismatch(sent.clone()));
            }
            let step = |bytes: &[u8], _: Option<u32>| {
                if typecheck::is_announcement(bytes) {
                    return match typecheck::check::<T>(bytes) {
                        Ok(Verdict::Match) => Step::Again,
                        Ok(Verdict::Mismatch(sent)) => {
                            let _ = self.side.mismatch.set(sent.clone());
                            Step::Failed(self.mismatch(sent))
                        }
                        Err(e) => Step::Failed(TypedRecvError::Announcement(e)),
                    };
                }
                match self.side.codec.decode_limited(bytes, self.side.limit) {
                    Ok(msg) => Step::Done(f.take().map(|f| f(&msg))),
                    Err(e) => Step::Failed(decode_error::<T>(e)),
                }
            };
            let step = match wait {
                Some(deadline) => link.recv_with(deadline, step),
                None => link.try_recv_with(step),
            };
            match step? {
                Step::Done(Some(r)) => return Ok(r),
                // `f` is taken once, by the step that returns.
                Step::Done(None) => unreachable!("a lent receive after the one that returned"),
                Step::Again => continue,
                Step::Failed(e) => return Err(e),
            }
        }
    }

    /// Decode a received handle's message and lend it to `f` (the async
    /// API's polls, which take the handle first).
    #[cfg(feature = "tokio")]
    #[inline(always)]
    fn with<R>(
        &self,
        r: Result<RecvBuf, TypedRecvError>,
        f: impl for<'a> FnOnce(&<T as Yokeable<'a>>::Output) -> R,
    ) -> Result<R, TypedRecvError> {
        let buf = r?;
        let msg: <T as Yokeable<'_>>::Output =
            self.side.codec.decode_limited(&buf, self.side.limit).map_err(decode_error::<T>)?;
        Ok(f(&msg))
    }

    #[inline(always)]
    fn attach(&self, r: Result<RecvBuf, TypedRecvError>) -> Result<Guard<T>, TypedRecvError> {
        let (buf, token) = r?.into_parts();
        let (codec, limit) = (&self.side.codec, self.side.limit);
        let yoke = Yoke::<T, Buf>::try_attach_to_cart(buf, |bytes: &[u8]| codec.decode_limited(bytes, limit))
            .map_err(decode_error::<T>)?;
        Ok(Guard::new(yoke, token))
    }
}
