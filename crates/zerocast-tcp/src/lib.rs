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

//!
//! A connection over loopback, raw buffers each way:
//!
//! ```
//! use zerocast_core::{Connection, Endpoint, LinkConfig, Listener, Transport};
//! use zerocast_mem::{Pool, PoolConfig};
//! use zerocast_tcp::{TcpConfig, TcpTransport};
//!
//! // Messages up to 64 KiB: the default pool's largest class holds them.
//! let cfg = TcpConfig::default().with_link(LinkConfig::default().with_max_payload(64 << 10));
//! let tcp = TcpTransport::new(Pool::unregistered(PoolConfig::default())?, cfg)?;
//! let listener = tcp.listen(&Endpoint::parse("tcp://127.0.0.1:0")?)?;
//! let at = listener.local_endpoint().clone();
//! let client = std::thread::spawn(move || -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//!     let conn = tcp.connect(&at)?;
//!     let mut buf = conn.alloc(4, None)?;
//!     buf.copy_from_slice(b"ping");
//!     conn.send(buf, None).map_err(|e| e.to_string())?;
//!     assert_eq!(&*conn.recv(None)?, b"pong");
//!     Ok(())
//! });
//! let conn = listener.accept()?;
//! assert_eq!(&*conn.recv(None)?, b"ping");
//! let mut reply = conn.alloc(4, None)?;
//! reply.copy_from_slice(b"pong");
//! conn.send(reply, None).map_err(|e| e.to_string())?;
//! client.join().expect("client thread")?;
//! # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod stream;
pub mod udp;

pub use stream::{TcpConfig, TcpConnection, TcpListener, TcpTransport};
