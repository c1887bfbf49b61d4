//! RDMA verbs backend for zerocast.
//!
//! What it does:
//! - finds and opens a verbs device ([`Device::open`], or
//!   [`open_cm_device`] for the context rdma_cm itself uses), by name or as
//!   the first device with an active port;
//! - owns the verbs objects with the right drop order: a [`MemoryRegion`]
//!   holds its [`ProtectionDomain`], which holds its [`Context`]; a queue
//!   pair holds its CQ, PD and (under rdma_cm) its CM id;
//! - registers memory, directly or through [`VerbsRegistrar`], the
//!   [`zerocast_mem::Registrar`] that makes a zerocast pool usable by the device;
//! - **`rc://`** ([`RcTransport`]): reliable connections set up with rdma_cm
//!   (the hello travels as connect/accept private data), and
//!   **`rc+oob://`**: the same connections set up over a TCP side channel
//!   (hello, QPN, PSN, LID, GID), the QP driven INIT → RTR → RTS by hand.
//!   Both run zerocast's shared link engine: zero-copy sends of the pool
//!   buffer itself, a data frame as a send with immediate of its payload
//!   alone (its credits and sequence bits in the immediate, its length in
//!   the completion: no header byte on the wire), receives of one scatter
//!   entry (the whole pool buffer), a ring of sends in flight with
//!   selective signalling (one send per quarter of the send queue, at most
//!   every 32nd, and the last of a batch when something waits for its
//!   completion), inline sends for small frames, credits equal
//!   to posted receives (so RNR cannot happen), typed work-completion errors
//!   ([`RcError`]), and caller-driven I/O: a sending thread posts its own
//!   work request when the link is quiet, a receiving thread polls the CQ
//!   itself (busy, or briefly and then asleep until a completion event:
//!   [`CompletionMode`]), and a released message's buffer is posted again
//!   by the thread that drops it; the engine covers the rest, its
//!   connections' CQs on one completion channel.
//!
//! - **one-sided** ([`OneSided`] on [`RcConnection`]): `expose` a pool
//!   buffer as a [`RemoteRegion`] (serde, so it travels in a typed message),
//!   RDMA READ and RDMA WRITE between a local pool buffer and a peer's
//!   region, each a signalled request routed back to its blocked caller;
//!   RDMA WRITE with immediate, which takes a credit like a send and reaches
//!   the peer as an in-order empty message carrying the immediate.
//!
//! - **rendezvous**: messages larger than the peer's receive buffers
//!   (`RcConfig::eager_limit`) are RDMA-READ by the receiver straight from
//!   the sender's pool buffer, in order, without a copy.
//!
//! - **`ud://` and `mcast://`** ([`ud::UdTransport`], [`ud::UdSocket`]):
//!   unreliable datagrams on a UD queue pair, peers resolved and groups
//!   joined through rdma_cm in the UDP port space, receives pre-posted from
//!   the registered pool, the GRH stripped, a typed error for datagrams
//!   above the active MTU, and a raw mode for interop with rdma-core tools.
//!
//! - **shared receive queue** (`?srq=N` on a listener, [`RcConfig::srq`]):
//!   one SRQ serves every accepted connection, each with a fixed share as
//!   its credit window, refilled on the SRQ limit event ([`SrqStats`]).
//!
//! A server over `rc://` (rdma_cm on the device's address): not run here,
//! as it needs a verbs device (`scripts/softroce-run` gives one).
//!
//! ```no_run
//! use zerocast_core::{Connection, Endpoint, Listener, Transport};
//! use zerocast_mem::PoolConfig;
//! use zerocast_rdma::{RcConfig, RcTransport};
//!
//! let rc = RcTransport::new(RcConfig::default(), PoolConfig::default())?;
//! let listener = rc.listen(&Endpoint::parse("rc://10.0.2.15:7471")?)?;
//! let conn = listener.accept()?;
//! let msg = conn.recv(None)?; // the registered receive buffer itself
//! let mut reply = conn.alloc(msg.len(), None)?; // a registered send buffer
//! reply.copy_from_slice(&msg);
//! drop(msg); // posted again, and its credit returned
//! conn.send(reply, None).map_err(|e| e.to_string())?;
//! # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
//! ```
//!
//! Testing: this crate's tests, and `tests/tests/conformance_rdma.rs`, need
//! a verbs device. They are `#[ignore]`d on a plain `cargo test`;
//! `scripts/test` runs them inside a QEMU guest with Soft-RoCE (`rdma_rxe`),
//! see `scripts/softroce-run`.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod cm;
mod cq;
mod device;
mod error;
mod eventfd;
mod mr;
mod rc;
mod send_ring;
mod srq;
pub mod ud;
mod verbs;

pub use cm::open_cm_device;
pub use device::{
    fork_protection, Context, Device, DeviceAttr, ForkProtection, PortAttr, PortState, ProtectionDomain,
};
pub use error::DeviceError;
pub use mr::{Access, MemoryRegion, VerbsRegistrar};
pub use rc::{
    pool_config_for, wc_status_name, CompletionMode, Exposure, OneSided, OneSidedError, Rc, RcConfig,
    RcConnection, RcError, RcListener, RcTransport, RecvMemory, RemoteRegion, SrqStats, RENDEZVOUS_RECEIVES,
};
