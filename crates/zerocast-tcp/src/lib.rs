//! zerocast over the kernel's network stack.
//!
//! - [`stream`]: `tcp://` connections through socket2. Framing and credit
//!   flow control come from `zerocast-core` and `zerocast-link`; this crate
//!   only moves bytes: one writer thread gathering queued frames into one
//!   `writev` per batch, one reader thread decoding frames straight into
//!   pool buffers.
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
