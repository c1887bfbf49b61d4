//! Datagram endpoints: `ud://` and `mcast://`.
//!
//! Over UDP today (the RDMA UD backend plugs in here too). Best-effort:
//! datagrams may be lost, duplicated or reordered.

pub use zerocast_tcp::udp::*;
