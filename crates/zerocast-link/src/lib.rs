//! The connection engine every reliable backend shares.
//!
//! A backend (TCP, in-process, RDMA RC) moves bytes; this crate does
//! everything else a connection needs, once, for all of them:
//!
//! - the application side, [`Link`]: take a pooled buffer, send it (waiting
//!   for credit with a deadline), receive delivered buffers, close;
//! - the backend side, [`Driver`]: hand the writer batches of stamped frames,
//!   take frames from the reader, report end of stream or failure;
//! - received messages as [`RecvBuf`] handles that return their credit (or
//!   hand the buffer back for reposting) when dropped.
//!
//! Credits themselves are the sans-IO [`zerocast_core::Credits`] machine; this
//! crate only puts it behind a mutex and wakes the right thread.
//!
//! Heartbeats live here too: with an interval negotiated in the hello, the
//! writer ([`Driver::drive_writer`] at its deadline) sends an empty credit
//! frame when nothing else went out for an interval, and fails the
//! connection with [`ConnError::HeartbeatTimeout`] when nothing came from
//! the peer for [`zerocast_core::HEARTBEAT_MISSES`] intervals.
//!
//! And the [`engine`]: one thread that drives many connections as
//! non-blocking tasks, so that a backend needs no thread per connection.
//! It does **not** open sockets or devices: the backend's tasks, wire and
//! source do.

//!
//! The two sides of one link, with a frame handed over by hand where a
//! backend's reader would: the driver takes a decoded data frame, the
//! application receives the buffer itself, and dropping it returns the
//! credit.
//!
//! ```
//! use zerocast_core::{Endpoint, FrameKind, Header, LinkConfig, RecvError};
//! use zerocast_link::{hello_for, LinkSetup};
//! use zerocast_mem::{Pool, PoolConfig, Wait};
//!
//! let pool = Pool::unregistered(PoolConfig::default())?;
//! let config = LinkConfig::default();
//! let setup = LinkSetup {
//!     config,
//!     peer_hello: hello_for(&config, 4096), // what the peer announced
//!     pool: pool.clone(),
//!     peer: Endpoint::parse("tcp://192.0.2.1:7000")?,
//!     repost: false,
//!     credit_unit: 0,
//! };
//! let (link, driver, _) = zerocast_link::new(setup)?;
//!
//! // The backend's reader decoded a frame into a pool buffer.
//! let mut payload = pool.alloc(5, Wait::No)?;
//! payload.copy_from_slice(b"hello");
//! driver.on_frame(Header::new(FrameKind::Data, 0, 0, 5), Some(payload))?;
//!
//! let msg = link.try_recv()?;
//! assert_eq!(&*msg, b"hello");
//! drop(msg); // the buffer goes back to the pool, its credit to the peer
//! assert!(matches!(link.try_recv(), Err(RecvError::Empty)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(test)]
mod batch_tests;
#[cfg(test)]
mod close_tests;
mod completion;
mod conn;
#[cfg(test)]
mod direct_tests;
mod driver;
pub mod engine;
mod frame_batch;
#[cfg(test)]
mod frame_batch_tests;
mod handoff;
mod interrupt;
mod lend;
#[cfg(test)]
mod linger_tests;
mod link;
mod listener;
mod queue;
mod ready;
mod recv;
mod repost;
mod shared;
mod source;
pub mod spin;
mod staged;
#[cfg(test)]
mod staged_tests;
#[cfg(test)]
mod tail_tests;
#[cfg(test)]
mod test_writer;
mod turn;
#[cfg(test)]
mod wake_tests;
mod wakers;
mod wire;

pub use completion::{completion, Complete, Completion};
pub use conn::{Connection, Flavor};
pub use driver::{Driver, Frame};
pub use frame_batch::FrameBatch;
pub use interrupt::Interrupt;
pub use link::{Link, LinkStats};
pub use listener::{chain as error_chain, Backlog, CloseSignal, ListenerCounters};
pub use ready::Notify;
pub use recv::{RecvBuf, ReleaseToken};
pub use repost::{Repost, Reposted};
pub use source::{Pumped, SharedSource, Source, SourceFd, SourceSignal, BATCH_BYTES, BATCH_FRAMES};
pub use turn::{TurnGuard, TurnLock};
pub use wakers::Wakers;
pub use wire::{Wire, WireCtx, Writing};

use std::sync::Arc;

use zerocast_core::{ConnError, Credits, Endpoint, Hello, LinkConfig};
use zerocast_mem::{Buf, Pool};

/// Everything needed to create a connection after its handshake.
#[derive(Debug, Clone)]
pub struct LinkSetup {
    /// This side's settings (its `recv_window` was announced to the peer).
    pub config: LinkConfig,
    /// What the peer announced.
    pub peer_hello: Hello,
    /// The pool send buffers come from.
    pub pool: Pool,
    /// The peer, for logs and errors.
    pub peer: Endpoint,
    /// Received buffers go back to the backend for reposting (RDMA) instead
    /// of to the pool (stream transports).
    pub repost: bool,
    /// Bytes per credit this side charges for a data frame, as its hello
    /// announced (see [`zerocast_core::credit::cost`]); 0: one credit per
    /// frame, which a reposting backend must use.
    pub credit_unit: u32,
}

/// Released receive buffers on their way back to a reposting backend
/// (`None`: the buffer was lost; post a fresh one).
pub type Reposts = crossbeam_channel::Receiver<Option<Buf>>;

/// Create the two halves of a connection.
///
/// When `setup.repost` is set, the returned receiver yields every released
/// receive buffer (`None`: the buffer was lost, post a fresh one); the
/// backend reposts it and then calls [`Driver::on_reposted`], which is what
/// returns the credit.
pub fn new(setup: LinkSetup) -> Result<(Link, Driver, Option<Reposts>), ConnError> {
    if setup.repost && setup.credit_unit != 0 {
        return Err(ConnError::Unsupported("weighted credits on a backend that reposts its buffers"));
    }
    let credits = Credits::weighted(
        (setup.config.recv_window, setup.credit_unit),
        (setup.peer_hello.window, setup.peer_hello.credit_unit),
    )?;
    let max_message = setup.config.max_payload.min(setup.peer_hello.max_payload) as usize;
    let (shared, reposts) = shared::Shared::new(setup, credits, max_message);
    let driver = Driver::new(Arc::new(shared));
    Ok((Link::new(driver.reader()), driver, reposts))
}

/// The hello this side sends for `config`, with receive buffers of
/// `buf_size` and one credit per frame (a weighing backend sets
/// [`Hello::credit_unit`] on it).
pub fn hello_for(config: &LinkConfig, buf_size: usize) -> Hello {
    Hello {
        window: config.recv_window,
        credit_unit: 0,
        max_payload: config.max_payload,
        recv_buf_size: u32::try_from(buf_size).unwrap_or(u32::MAX),
        heartbeat_ms: config.heartbeat_ms(),
    }
}

/// For unit tests: a link of window 64 over an unregistered pool, with no
/// backend attached, and its driver and pool.
#[cfg(test)]
pub(crate) fn test_link() -> (Link, Driver, zerocast_mem::Pool) {
    test_link_of(64)
}

/// [`test_link`] with a window of `window` frames.
#[cfg(test)]
pub(crate) fn test_link_of(window: u32) -> (Link, Driver, zerocast_mem::Pool) {
    let config = LinkConfig::default().with_recv_window(window);
    let pool = zerocast_mem::Pool::unregistered(zerocast_mem::PoolConfig::default()).unwrap();
    let setup = LinkSetup {
        config,
        peer_hello: hello_for(&config, 4096),
        pool: pool.clone(),
        peer: zerocast_core::Endpoint::parse("tcp://127.0.0.1:1").unwrap(),
        repost: false,
        credit_unit: 0,
    };
    let (link, driver, _) = new(setup).unwrap();
    (link, driver, pool)
}

/// For unit tests: a waker that counts how often it was woken.
#[cfg(test)]
pub(crate) struct WakeCount(std::sync::atomic::AtomicUsize);

#[cfg(test)]
impl WakeCount {
    /// A fresh count and its waker.
    pub(crate) fn new() -> (std::sync::Arc<Self>, std::task::Waker) {
        let count = std::sync::Arc::new(Self(0.into()));
        let waker = std::task::Waker::from(count.clone());
        (count, waker)
    }

    /// Wakes so far.
    pub(crate) fn get(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[cfg(test)]
impl std::task::Wake for WakeCount {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}
