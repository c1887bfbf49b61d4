//! The sans-IO core of zerocast.
//!
//! It holds what every transport shares and can be tested without one:
//!
//! - [`frame`]: the 16-byte frame header and its strict decoder;
//! - [`credit`]: credit-based flow control as a pure state machine
//!   (reserve, commit, piggybacked returns, explicit credit frames);
//! - [`handshake`]: the hello each side sends before data flows;
//! - [`uri`]: endpoint URIs and the ordered transport fallback list;
//! - [`seq`]: per-sender datagram accounting (received, lost, reordered);
//! - [`sources`]: the bounded per-source table datagram sockets keep it in;
//! - [`transport`]: the traits backends implement;
//! - [`error`]: errors shared by every transport; failed sends hand the buffer back.
//!
//! It does **not** open sockets, touch devices, spawn threads, allocate
//! registered memory or read the clock. Time, when needed, is passed in.

//!
//! Two peers' credit machines and one data frame between them, with no
//! I/O: the sender reserves a credit and stamps the header when the frame
//! is written; the receiver decodes the header strictly and accounts for
//! the frame; the credit comes back when the application releases the
//! buffer, piggybacked on the next frame the other way.
//!
//! ```
//! use zerocast_core::{Credits, FrameKind, Header};
//!
//! // Each side posted 4 receive buffers: the windows the hellos announce.
//! let (mut a, mut b) = (Credits::new(4, 4)?, Credits::new(4, 4)?);
//! let before = a.available();
//! let credit = a.reserve().expect("a has credit");
//! let stamp = a.commit(credit);
//! let wire = stamp.header(FrameKind::Data, 5).encode();
//!
//! let header = Header::decode(&wire, 1 << 20).expect("a well-formed header");
//! b.on_receive(&header)?;
//! assert_eq!(a.available(), before - 1);
//!
//! b.release()?; // b's application dropped the buffer
//! let credit = b.reserve().expect("b has credit");
//! let back = b.commit(credit);
//! a.on_receive(&back.header(FrameKind::Data, 0))?;
//! assert_eq!(a.available(), before, "the credit came back on b's frame");
//! # Ok::<(), zerocast_core::CreditError>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod config;
pub mod credit;
pub mod error;
pub mod frame;
#[doc(hidden)]
pub mod fuzzing;
pub mod handshake;
pub mod seq;
pub mod sources;
pub mod transport;
pub mod uri;

pub use config::{negotiated_heartbeat, ConfigError, LinkConfig, HEARTBEAT_MISSES, MIN_HEARTBEAT};
pub use credit::{Blocked, CreditError, Credits, Reservation, Stamp};
pub use error::{AcceptError, Classify, ConnError, ConnectError, ErrorKind, RecvError, SendError};
pub use frame::{
    check_datagram, check_datagram_trailer, FrameError, FrameKind, Header, MalformedDatagram, HEADER_LEN,
};
pub use handshake::{HandshakeError, Hello};
pub use seq::{Arrival, SeqStats, SeqTracker};
pub use sources::{SourceTable, DEFAULT_MAX_SOURCES};
pub use transport::{Caps, Connection, Datagram, Listener, ListenerStats, Transport, TxBuffer};
pub use uri::{Endpoint, Scheme, TransportList, UriError};
