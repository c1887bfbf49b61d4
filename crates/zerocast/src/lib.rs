//! zerocast: zero-copy message passing with pluggable transports.
//!
//! One API over several transports, chosen by URI: test on a laptop over
//! `tcp://` and deploy over RDMA with `rc://`, without changing code.
//!
//! ```
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Ping { n: u64 }
//!
//! // Port 0: the system picks one; the listener says which.
//! let listener = zerocast::listen("tcp://127.0.0.1:0")?;
//! let at = listener.local_endpoint().to_string();
//! let client = std::thread::spawn(move || -> Result<u64, zerocast::Error> {
//!     let (tx, rx) = zerocast::connect(&at)?.split::<Ping, Ping>();
//!     tx.send(Ping { n: 41 })?;
//!     Ok(rx.recv()?.n)
//! });
//! let (tx, rx) = listener.accept()?.split::<Ping, Ping>();
//! let ping = rx.recv()?;
//! tx.send(Ping { n: ping.n + 1 })?;
//! assert_eq!(client.join().expect("client thread")?, 42);
//! # Ok::<(), zerocast::Error>(())
//! ```
//!
//! The same code runs over `rc://10.0.2.15:7471` on an RDMA device, or
//! over `mem://name` inside one process: only the URI changes.
//!
//! Layers, top down:
//!
//! - typed channels, [`Sender`] and [`Receiver`], that serialize straight
//!   into pooled buffers through a swappable [`Codec`], and a borrowing
//!   receive ([`Receiver::recv_ref`], or [`Receiver::recv_with`] with a
//!   closure) whose `&str`/`&[u8]` fields point into the receive buffer;
//! - the raw API, [`Connection`]: take a buffer, write in place, send it;
//!   receive the buffer itself;
//! - readiness, [`Poller`]: a few threads serve thousands of connections,
//!   told which have something to receive, instead of a thread blocked on
//!   each;
//! - credit-based flow control: a sender never sends without a free
//!   receive buffer at the peer;
//! - a registered-memory pool: zero allocations per message in steady state.
//!
//! What zerocast does **not** do: encryption, reconnection, or message
//! routing between more than two parties on a connection. Datagram
//! transports ([`datagram`]: `ud://`, `mcast://`, over RDMA UD or UDP) are
//! unreliable and unordered.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod borrow;
mod channel;
pub mod codec;
mod conn;
mod context;
#[cfg(feature = "tcp")]
pub mod datagram;
mod error;
mod poller;
#[cfg(feature = "tokio")]
pub mod tokio;

/// The README's Rust examples, compiled (and the async one run) as doctests.
#[cfg(all(doctest, feature = "tokio"))]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;
mod typecheck;

pub use borrow::Guard;
pub use channel::{Receiver, Sender};
pub use codec::{decode_limit, Bincode, BincodeLimit, Codec, DEFAULT_DECODE_LIMIT};
pub use conn::{Connection, Listener};
pub use context::{connect, global, listen, Config, Zerocast};
#[cfg(feature = "tcp")]
pub use datagram::{DatagramReceiver, DatagramSender, DatagramSocket};
pub use error::{
    AcceptError, AnnouncementError, Classify, CodecError, ConnError, ConnectError, Error, ErrorKind,
    PoolError, RecvError, SendError, TypedRecvError,
};
pub use poller::{AlreadyRegistered, Events, Poller};

/// The `yoke` zerocast uses for [`Receiver::recv_ref`]. Deriving `Yokeable`
/// on a message type needs `yoke` (feature `derive`) as a direct dependency.
pub use yoke;
/// The layers beneath, for users who need them.
pub use zerocast_core as core;
pub use zerocast_core::{Caps, Endpoint, LinkConfig, ListenerStats, Scheme};
pub use zerocast_link::{LinkStats, RecvBuf};
pub use zerocast_mem::{Buf, Pool, PoolConfig, PoolStats, Wait};
/// RDMA device access (verbs device, protection domain, registered memory).
#[cfg(feature = "rdma")]
pub use zerocast_rdma as rdma;
#[cfg(feature = "tcp")]
pub use zerocast_tcp::TcpConfig;
