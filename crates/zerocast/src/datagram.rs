//! Datagram endpoints: `ud://` and `mcast://`.
//!
//! Over UDP and UDP multicast today; the RDMA UD backend plugs in here too.
//! Best-effort: datagrams may be lost, duplicated or reordered, and no
//! credits apply. Every datagram carries a zerocast header, so foreign or
//! malformed traffic is dropped and counted, never returned.
//!
//! ```no_run
//! let group = zerocast::datagram::bind("mcast://239.1.2.3:5000?iface=127.0.0.1")?;
//! let mut buf = group.alloc(5, None)?;
//! buf.copy_from_slice(b"hello");
//! group.send_to(buf, &"239.1.2.3:5000".parse()?).map_err(|(_, e)| e)?;
//! let (msg, from) = group.recv_from(None)?;
//! println!("{} bytes from {from}", msg.len());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub use zerocast_tcp::udp::*;

use zerocast_core::{Endpoint, Scheme};

use crate::Zerocast;

/// Open a datagram endpoint with the process-wide defaults: `ud://host:port`
/// binds a unicast socket, `mcast://group:port?iface=addr` joins a group.
pub fn bind(uri: &str) -> Result<UdpSocket, UdpError> {
    crate::global().bind_datagram(uri)
}

impl Zerocast {
    /// Open a datagram endpoint (see [`bind`]), with buffers from this
    /// context's pool.
    pub fn bind_datagram(&self, uri: &str) -> Result<UdpSocket, UdpError> {
        let bad = |reason: String| UdpError::BadEndpoint { endpoint: uri.to_owned(), reason };
        let ep = Endpoint::parse(uri).map_err(|e| bad(e.to_string()))?;
        let pool = self.pool().map_err(|e| bad(e.to_string()))?;
        let cfg = UdpConfig::default();
        match ep.scheme() {
            Scheme::Ud => UdpSocket::bind(&ep, pool, cfg),
            Scheme::Mcast => UdpSocket::multicast(&ep, pool, cfg),
            other => Err(bad(format!("{other}:// is not a datagram transport; use ud:// or mcast://"))),
        }
    }
}
