//! Typed channels: `Sender<T>` and `Receiver<T>` over any connection.

use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use yoke::{Yoke, Yokeable};
use zerocast_core::{RecvError, SendError};
use zerocast_mem::{Buf, PoolError};

use crate::borrow::Guard;
use crate::codec::{decode_limit, Bincode, Codec, CodecError};
use crate::conn::Connection;
use crate::error::TypedRecvError;

/// Smallest first guess at a message's encoded size.
const MIN_HINT: usize = 64;

struct SendSide<C> {
    conn: Connection,
    codec: C,
    /// The last encoded size: the first guess for the next message.
    hint: AtomicUsize,
}

/// The sending half of a typed channel. Clones share it. Sending closes
/// when the last handle that can send is gone: every clone of every
/// `Sender` split from the connection, and every [`Connection`] clone.
/// Then the peer's receiver sees a disconnect after the messages already
/// sent.
///
/// Messages are serialized straight into a pooled send buffer: no
/// intermediate `Vec`.
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

enum Wait {
    Now,
    Until(Option<Instant>),
}

impl<T, C: Codec> Sender<T, C> {
    pub(crate) fn new(conn: Connection, codec: C) -> Self {
        let side = SendSide { conn, codec, hint: AtomicUsize::new(MIN_HINT) };
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

    /// Send `msg` if the peer has a free receive buffer now;
    /// [`SendError::Full`] hands it back otherwise.
    pub fn try_send(&self, msg: T) -> Result<(), SendError<T>> {
        self.send_inner(msg, Wait::Now)
    }

    /// Send `msg`, waiting at most `timeout` for credit.
    pub fn send_timeout(&self, msg: T, timeout: Duration) -> Result<(), SendError<T>> {
        self.send_inner(msg, Wait::Until(Instant::now().checked_add(timeout)))
    }

    fn send_inner(&self, msg: T, wait: Wait) -> Result<(), SendError<T>> {
        send_encoded(&self.side, &msg, wait).map_err(|e| e.map(|()| msg))
    }

    /// Send a message by reference (it is only serialized, never moved).
    pub fn send_ref(&self, msg: &T) -> Result<(), SendError<()>> {
        send_encoded(&self.side, msg, Wait::Until(None))
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
        send_encoded(&self.side, msg, Wait::Until(None))
    }
}

fn send_encoded<M: Serialize + ?Sized, C: Codec>(
    side: &SendSide<C>,
    msg: &M,
    wait: Wait,
) -> Result<(), SendError<()>> {
    let buf = side.encode(msg, &wait)?;
    let conn = &side.conn;
    let r = match wait {
        Wait::Now => conn.try_send(buf),
        Wait::Until(None) => conn.send(buf),
        Wait::Until(Some(d)) => conn.send_timeout(buf, d.saturating_duration_since(Instant::now())),
    };
    // On failure the encoded copy goes back to the pool; the caller keeps
    // (or gets back) the message itself.
    r.map_err(|e| e.map(drop))
}

impl<C: Codec> SendSide<C> {
    /// Serialize into a pool buffer sized by the last message's size, and
    /// again into an exact-size buffer if that was too small.
    fn encode<M: Serialize + ?Sized>(&self, msg: &M, wait: &Wait) -> Result<Buf, SendError<()>> {
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

    fn alloc(&self, len: usize, wait: &Wait) -> Result<Buf, SendError<()>> {
        let conn = &self.conn;
        let r = match wait {
            Wait::Now => conn.alloc_timeout(len, Duration::ZERO),
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

fn rejected(e: CodecError) -> SendError<()> {
    SendError::Rejected((), Arc::new(e))
}

struct RecvSide<C> {
    conn: Connection,
    codec: C,
    /// The decode limit: [`decode_limit`] of the connection's `max_payload`.
    limit: usize,
}

/// The receiving half of a typed channel. Clones share it. Receiving
/// closes (messages still arriving are released at once, returning their
/// credits) when the last handle that can receive is gone: every clone of
/// every `Receiver` split from the connection, and every [`Connection`]
/// clone.
///
/// After the peer's sender closes, buffered messages are received first,
/// then [`RecvError::Disconnected`], as with crossbeam channels.
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
        Self { side: Arc::new(RecvSide { conn, codec, limit }), _t: PhantomData }
    }

    /// The underlying connection. This handle (and its clones) holds only
    /// the receiving side open, as the `Receiver` does.
    pub fn connection(&self) -> &Connection {
        &self.side.conn
    }
}

impl<T: DeserializeOwned, C: Codec> Receiver<T, C> {
    /// Receive the next message.
    pub fn recv(&self) -> Result<T, TypedRecvError> {
        self.decode(self.side.conn.recv())
    }

    /// Receive a message if one is buffered.
    pub fn try_recv(&self) -> Result<T, TypedRecvError> {
        self.decode(self.side.conn.try_recv())
    }

    /// Receive, waiting at most `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<T, TypedRecvError> {
        self.decode(self.side.conn.recv_timeout(timeout))
    }

    /// An iterator of messages that ends at the first error of any kind,
    /// **silently**: the peer's clean close, but also a connection failure
    /// or a message that does not decode. For a server that must tell those
    /// apart, use [`Receiver::iter_results`].
    pub fn iter(&self) -> impl Iterator<Item = T> + '_ {
        std::iter::from_fn(move || self.recv().ok())
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
                Err(e @ TypedRecvError::Decode(_)) => Some(Err(e)),
                Err(e) => {
                    // A failure (nothing else comes from a blocking receive).
                    done = true;
                    Some(Err(e))
                }
            }
        })
    }

    fn decode(&self, r: Result<zerocast_link::RecvBuf, RecvError>) -> Result<T, TypedRecvError> {
        let buf = r?;
        // The receive buffer is reposted when `buf` drops, right after decoding.
        self.side.codec.decode_limited::<T>(&buf, self.side.limit).map_err(TypedRecvError::Decode)
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
        self.attach(self.side.conn.recv())
    }

    /// [`Receiver::recv_ref`], waiting at most `timeout`.
    pub fn recv_ref_timeout(&self, timeout: Duration) -> Result<Guard<T>, TypedRecvError> {
        self.attach(self.side.conn.recv_timeout(timeout))
    }

    fn attach(&self, r: Result<zerocast_link::RecvBuf, RecvError>) -> Result<Guard<T>, TypedRecvError> {
        let (buf, token) = r?.into_parts();
        let (codec, limit) = (&self.side.codec, self.side.limit);
        let yoke = Yoke::<T, Buf>::try_attach_to_cart(buf, |bytes: &[u8]| codec.decode_limited(bytes, limit))
            .map_err(TypedRecvError::Decode)?;
        Ok(Guard::new(yoke, token))
    }
}
