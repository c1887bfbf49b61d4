//! zerocast over the kernel's network stack.
//!
//! - [`stream`]: `tcp://` connections through socket2. Framing and credit
//!   flow control come from `zerocast-core` and `zerocast-link`; this crate
//!   only moves bytes. Every connection, listener and handshake is a task
//!   of the transport's engine (one thread for all of them): queued frames
//!   go out gathered into one `sendmsg` per batch, and frames are decoded
//!   straight into pool buffers, on the application's thread when it sends
//!   or receives, else on the engine's.
//! - [`udp`]: `ud://` and `mcast://` datagrams, the fallback for RDMA UD and
//!   multicast.
//!
//! It does **not** do RDMA, TLS, or reconnection: a broken connection is
//! reported with a typed error and stays broken.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod stream;
pub mod udp;

pub use stream::{TcpConfig, TcpConnection, TcpListener, TcpTransport};
