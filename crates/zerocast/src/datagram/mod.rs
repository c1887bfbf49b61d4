//! Datagram endpoints: `ud://` and `mcast://`.
//!
//! One API over two backends, chosen when the endpoint is opened:
//!
//! - **RDMA UD** (feature `rdma`, a device with an active port, and an
//!   address of that device in the endpoint): unreliable datagrams on a UD
//!   queue pair, multicast through rdma_cm;
//! - **UDP** and UDP multicast otherwise.
//!
//! The order comes from the same list as `auto://` connections
//! (`ZEROCAST_TRANSPORTS`, default `rc,tcp`): an RDMA name (`rc`, `ud`,
//! `mcast`, …) stands for RDMA UD, `tcp` for UDP. `ZEROCAST_TRANSPORTS=tcp`
//! therefore runs datagram code over UDP on a machine with RDMA. An
//! endpoint whose address is not on the RDMA device (`127.0.0.1`, or an
//! `mcast://` without `iface=`) goes to UDP. [`DatagramSocket::backend`]
//! says which one was chosen, and the choice is logged through `tracing`.
//!
//! **Datagrams are unreliable and unordered**: any of them may be lost,
//! and they may arrive out of order; nothing retransmits. Each sender
//! numbers its datagrams per destination, and a receiver counts, per
//! source, what was received, lost (gaps) and reordered
//! ([`DatagramSocket::source_stats`]) for at most `max_sources` sources
//! (`?max_sources=N`, default 4096; a new source beyond them replaces an
//! idle one, counted in [`DatagramStats::sources_evicted`]). Every datagram carries a zerocast
//! header, so foreign or malformed traffic is dropped and counted, never
//! returned. A payload is at most [`DatagramSocket::max_datagram`] bytes
//! (over RDMA: the active MTU less the header); a larger send is refused
//! with the buffer handed back.
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
//!
//! Typed datagrams: [`DatagramSocket::typed`] gives a
//! [`DatagramSender<T>`] and a [`DatagramReceiver<T>`] on the same
//! [`Codec`](crate::Codec) as typed channels.

mod typed;

use std::fmt;
use std::net::SocketAddr;
use std::ops::Deref;
use std::time::{Duration, Instant};

use zerocast_core::{Datagram, Endpoint, RecvError, Scheme, SeqStats, TransportList};
use zerocast_mem::{Buf, Pool, PoolError};

pub use typed::{DatagramReceiver, DatagramSendError, DatagramSender, TypedDatagramError};
/// The RDMA UD backend.
#[cfg(feature = "rdma")]
pub use zerocast_rdma::ud;
#[cfg(feature = "rdma")]
pub use zerocast_rdma::ud::{UdConfig, UdError, UdSocket};
/// The UDP backend.
pub use zerocast_tcp::udp;
pub use zerocast_tcp::udp::{UdpConfig, UdpError, UdpSocket, MAX_DATAGRAM};

use crate::Zerocast;

/// Which backend a [`DatagramSocket`] runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Backend {
    /// UDP or UDP multicast.
    Udp,
    /// RDMA unreliable datagrams.
    RdmaUd,
}

/// Why a datagram socket could not be opened, or a send, join or leave failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DatagramError {
    /// From the UDP backend.
    #[error(transparent)]
    Udp(#[from] UdpError),
    /// From the RDMA UD backend.
    #[cfg(feature = "rdma")]
    #[error(transparent)]
    Ud(#[from] UdError),
    /// The endpoint cannot be a datagram endpoint, or no backend is usable.
    #[error("endpoint `{endpoint}` cannot be opened as a datagram socket: {reason}")]
    BadEndpoint {
        /// The endpoint as written.
        endpoint: String,
        /// Why, and what to write instead.
        reason: String,
    },
    /// This process ran short of something the socket needs besides its
    /// backend (a descriptor to wait on, say).
    #[error("cannot {what}")]
    LocalResource {
        /// What could not be done.
        what: &'static str,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
}

impl DatagramError {
    /// Whether the payload was longer than the socket's largest datagram.
    pub fn is_too_large(&self) -> bool {
        match self {
            DatagramError::Udp(UdpError::TooLarge { .. }) => true,
            #[cfg(feature = "rdma")]
            DatagramError::Ud(UdError::TooLarge { .. }) => true,
            _ => false,
        }
    }
}

/// A snapshot of the counters every backend keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct DatagramStats {
    /// Datagrams handed to the OS or posted to the device.
    pub sent: u64,
    /// Well-formed datagrams handed to the user.
    pub received: u64,
    /// Datagrams dropped because they were not zerocast datagrams.
    pub dropped_malformed: u64,
    /// Sources whose sequence accounting is kept now: at most the
    /// backend's `max_sources` (`?max_sources=N`, default 4096).
    pub sources_tracked: u64,
    /// Sources whose accounting was dropped to make room for new ones, so
    /// that a flood from many source addresses stays bounded.
    pub sources_evicted: u64,
}

// A socket is made once and lives long: its size does not matter, and
// boxing either variant would only add a pointer chase per datagram.
#[allow(clippy::large_enum_variant)]
enum Flavor {
    Udp(UdpSocket),
    #[cfg(feature = "rdma")]
    Ud(UdSocket),
}

/// A datagram socket over UDP or RDMA UD. **Unreliable and unordered.**
///
/// Every method takes `&self`: threads may send and receive at once.
pub struct DatagramSocket {
    flavor: Flavor,
}

enum RxFlavor {
    Udp(udp::RecvDatagram),
    #[cfg(feature = "rdma")]
    Ud(zerocast_rdma::ud::UdDatagram),
}

/// A received datagram: the receive buffer itself, exposed as its payload.
/// Dropping it gives the buffer back (to the pool, or over RDMA to the
/// receive queue).
pub struct RecvDatagram {
    flavor: RxFlavor,
}

impl RecvDatagram {
    /// The sender's sequence number for this datagram (counted per destination).
    pub fn seq(&self) -> u32 {
        match &self.flavor {
            RxFlavor::Udp(d) => d.seq(),
            #[cfg(feature = "rdma")]
            RxFlavor::Ud(d) => d.seq(),
        }
    }
}

impl Deref for RecvDatagram {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.flavor {
            RxFlavor::Udp(d) => d,
            #[cfg(feature = "rdma")]
            RxFlavor::Ud(d) => d,
        }
    }
}

impl AsRef<[u8]> for RecvDatagram {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl fmt::Debug for RecvDatagram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecvDatagram").field("seq", &self.seq()).field("len", &self.len()).finish()
    }
}

macro_rules! each {
    ($self:expr, $s:ident => $e:expr) => {
        match &$self.flavor {
            Flavor::Udp($s) => $e,
            #[cfg(feature = "rdma")]
            Flavor::Ud($s) => $e,
        }
    };
}

impl DatagramSocket {
    /// Wrap a UDP socket.
    pub fn from_udp(s: UdpSocket) -> Self {
        Self { flavor: Flavor::Udp(s) }
    }

    /// Wrap an RDMA UD socket.
    #[cfg(feature = "rdma")]
    pub fn from_ud(s: UdSocket) -> Self {
        Self { flavor: Flavor::Ud(s) }
    }

    /// The backend in use.
    pub fn backend(&self) -> Backend {
        match &self.flavor {
            Flavor::Udp(_) => Backend::Udp,
            #[cfg(feature = "rdma")]
            Flavor::Ud(_) => Backend::RdmaUd,
        }
    }

    /// The UDP socket, if that is the backend.
    pub fn as_udp(&self) -> Option<&UdpSocket> {
        match &self.flavor {
            Flavor::Udp(s) => Some(s),
            #[cfg(feature = "rdma")]
            Flavor::Ud(_) => None,
        }
    }

    /// The RDMA UD socket, if that is the backend.
    #[cfg(feature = "rdma")]
    pub fn as_ud(&self) -> Option<&UdSocket> {
        match &self.flavor {
            Flavor::Ud(s) => Some(s),
            Flavor::Udp(_) => None,
        }
    }

    /// A send buffer of `len` payload bytes from the socket's pool (waiting
    /// until `deadline` if the pool is at its cap).
    pub fn alloc(&self, len: usize, deadline: Option<Instant>) -> Result<Buf, PoolError> {
        each!(self, s => s.alloc(len, deadline))
    }

    /// Send `buf` as one datagram to `to`, a peer or a group. On error the
    /// buffer is handed back. Success means handed to the OS or the device,
    /// not delivered.
    pub fn send_to(&self, buf: Buf, to: &SocketAddr) -> Result<(), (Buf, DatagramError)> {
        each!(self, s => s.send_to(buf, to).map_err(|(b, e)| (b, e.into())))
    }

    /// Resolve the route to `to` now, so that the first send does not wait
    /// for it: over RDMA UD, an rdma_cm address and route resolution (or a
    /// send-only join of a group); over UDP there is nothing to do.
    pub fn resolve(&self, to: &SocketAddr) -> Result<(), DatagramError> {
        match &self.flavor {
            Flavor::Udp(_) => {
                let _ = to;
                Ok(())
            }
            #[cfg(feature = "rdma")]
            Flavor::Ud(s) => s.resolve(to).map_err(Into::into),
        }
    }

    /// Send the datagrams of `batch` in order. Each one sent is taken out
    /// of `batch`, which keeps its capacity; on error, the datagram that
    /// failed and every one after it stay in `batch`, in order, with their
    /// buffers. Over RDMA UD they are posted as chains of work requests,
    /// one system call per chain of up to 32 datagrams; over UDP, one call
    /// each, as [`send_to`](Self::send_to).
    pub fn send_batch(&self, batch: &mut Vec<(Buf, SocketAddr)>) -> Result<(), DatagramError> {
        each!(self, s => Datagram::send_batch(s, batch).map_err(Into::into))
    }

    /// Receive one datagram and its source (which a reply can be sent to),
    /// waiting until `deadline` (`None`: forever).
    pub fn recv_from(&self, deadline: Option<Instant>) -> Result<(RecvDatagram, SocketAddr), RecvError> {
        match &self.flavor {
            Flavor::Udp(s) => {
                s.recv_from(deadline).map(|(d, a)| (RecvDatagram { flavor: RxFlavor::Udp(d) }, a))
            }
            #[cfg(feature = "rdma")]
            Flavor::Ud(s) => {
                s.recv_from(deadline).map(|(d, a)| (RecvDatagram { flavor: RxFlavor::Ud(d) }, a))
            }
        }
    }

    /// Receive a datagram if one is there now, else [`RecvError::Empty`].
    pub fn try_recv_from(&self) -> Result<(RecvDatagram, SocketAddr), RecvError> {
        match &self.flavor {
            Flavor::Udp(s) => s.try_recv_from().map(|(d, a)| (RecvDatagram { flavor: RxFlavor::Udp(d) }, a)),
            #[cfg(feature = "rdma")]
            Flavor::Ud(s) => s.try_recv_from().map(|(d, a)| (RecvDatagram { flavor: RxFlavor::Ud(d) }, a)),
        }
    }

    /// For an event loop: [`DatagramSocket::try_recv_from`], leaving the
    /// socket so that [`DatagramSocket::readiness_fd`] turns readable on the
    /// next arrival when it finds nothing (`Empty`); `Timeout` while
    /// another thread receives (nothing was looked at: see
    /// [`DatagramSocket::wake_when_free`]).
    #[cfg(feature = "tokio")]
    pub(crate) fn try_recv_armed(&self) -> Result<(RecvDatagram, SocketAddr), RecvError> {
        match &self.flavor {
            // A UDP socket is readable while a datagram is queued.
            Flavor::Udp(s) => s.try_recv_armed().map(|(d, a)| (RecvDatagram { flavor: RxFlavor::Udp(d) }, a)),
            #[cfg(feature = "rdma")]
            Flavor::Ud(s) => s.try_recv_armed().map(|(d, a)| (RecvDatagram { flavor: RxFlavor::Ud(d) }, a)),
        }
    }

    /// [`DatagramSocket::resolve`] for a task: over RDMA UD the rdma_cm
    /// exchange is awaited, by the resolve timeout on the whole.
    #[cfg(feature = "tokio")]
    pub(crate) async fn resolve_async(&self, to: &SocketAddr) -> Result<(), DatagramError> {
        match &self.flavor {
            // UDP has nothing to resolve.
            Flavor::Udp(_) => {
                let _ = to;
                Ok(())
            }
            #[cfg(feature = "rdma")]
            Flavor::Ud(s) if s.is_resolved(to) => Ok(()),
            #[cfg(feature = "rdma")]
            Flavor::Ud(s) => bounded(s, s.resolve_async(to), || zerocast_rdma::ud::UdError::Resolve {
                peer: *to,
                step: "resolving",
                reason: "no answer within the resolve timeout".into(),
            })
            .await
            .map_err(Into::into),
        }
    }

    /// [`DatagramSocket::join`] for a task: over RDMA UD the rdma_cm join
    /// is awaited, by the resolve timeout on the whole.
    #[cfg(feature = "tokio")]
    pub(crate) async fn join_async(&self, group: &SocketAddr) -> Result<(), DatagramError> {
        match &self.flavor {
            Flavor::Udp(s) => s.join(group).map_err(Into::into),
            #[cfg(feature = "rdma")]
            Flavor::Ud(s) => bounded(s, s.join_async(group), || zerocast_rdma::ud::UdError::Join {
                group: group.ip(),
                reason: "no answer within the resolve timeout".into(),
            })
            .await
            .map_err(Into::into),
        }
    }

    /// After [`DatagramSocket::try_recv_armed`] found another thread
    /// receiving (`Timeout`): have `waker` woken when that receive is
    /// over. `false` if it is over already (try again now).
    #[cfg(feature = "tokio")]
    pub(crate) fn wake_when_free(&self, waker: &std::task::Waker) -> bool {
        each!(self, s => s.wake_when_free(waker))
    }

    /// A descriptor (the caller's own duplicate) readable when a datagram
    /// may be there: the UDP socket's, or the UD receive CQ's channel.
    #[cfg(feature = "tokio")]
    pub(crate) fn readiness_fd(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        each!(self, s => s.readiness_fd())
    }

    /// Join a multicast group.
    pub fn join(&self, group: &SocketAddr) -> Result<(), DatagramError> {
        each!(self, s => s.join(group).map_err(Into::into))
    }

    /// Leave a multicast group.
    pub fn leave(&self, group: &SocketAddr) -> Result<(), DatagramError> {
        each!(self, s => s.leave(group).map_err(Into::into))
    }

    /// The largest payload a datagram may carry.
    pub fn max_datagram(&self) -> usize {
        each!(self, s => s.max_datagram())
    }

    /// The pool buffer a receive takes before it looks (UDP), or `None`
    /// where the buffers are posted ahead (UD).
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn recv_buffer_len(&self) -> Option<usize> {
        match &self.flavor {
            Flavor::Udp(s) => Some(s.recv_buffer_len()),
            #[cfg(feature = "rdma")]
            Flavor::Ud(_) => None,
        }
    }

    /// The bound address: where peers send to reach this socket.
    pub fn local_addr(&self) -> SocketAddr {
        each!(self, s => s.local_addr())
    }

    /// The pool send buffers come from.
    pub fn pool(&self) -> &Pool {
        each!(self, s => s.pool())
    }

    /// Received, lost and reordered counts of datagrams from `from`.
    pub fn source_stats(&self, from: &SocketAddr) -> Option<SeqStats> {
        each!(self, s => s.source_stats(from))
    }

    /// Every source tracked, with its counts (at most `max_sources`).
    pub fn sources(&self) -> Vec<(SocketAddr, SeqStats)> {
        each!(self, s => s.sources())
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> DatagramStats {
        match &self.flavor {
            Flavor::Udp(s) => {
                let st = s.stats();
                DatagramStats {
                    sent: st.sent,
                    received: st.received,
                    dropped_malformed: st.dropped_malformed,
                    sources_tracked: st.sources_tracked,
                    sources_evicted: st.sources_evicted,
                }
            }
            #[cfg(feature = "rdma")]
            Flavor::Ud(s) => {
                let st = s.stats();
                DatagramStats {
                    sent: st.sent,
                    received: st.received,
                    dropped_malformed: st.dropped_malformed,
                    sources_tracked: st.sources_tracked,
                    sources_evicted: st.sources_evicted,
                }
            }
        }
    }

    /// Wait until sends posted so far have left this socket (their
    /// buffers back in the pool), at most `timeout`. UDP sends leave at
    /// once; RDMA sends when their completion is polled.
    pub fn flush(&self, timeout: Duration) -> bool {
        match &self.flavor {
            Flavor::Udp(_) => {
                let _ = timeout;
                true
            }
            #[cfg(feature = "rdma")]
            Flavor::Ud(s) => s.flush(timeout),
        }
    }

    /// Typed halves on this socket with the default codec: a
    /// [`DatagramSender<S>`] and a [`DatagramReceiver<R>`].
    pub fn typed<S, R>(self) -> (DatagramSender<S>, DatagramReceiver<R>) {
        self.typed_with(crate::Bincode)
    }

    /// Typed halves with a codec of your choice.
    pub fn typed_with<S, R, C: crate::Codec>(
        self,
        codec: C,
    ) -> (DatagramSender<S, C>, DatagramReceiver<R, C>) {
        typed::split(self, codec)
    }
}

impl fmt::Debug for DatagramSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        each!(self, s => fmt::Debug::fmt(s, f))
    }
}

/// Open a datagram endpoint with the process-wide defaults: `ud://host:port`
/// binds a unicast socket, `mcast://group:port?iface=addr` joins a group.
pub fn bind(uri: &str) -> Result<DatagramSocket, DatagramError> {
    crate::global().bind_datagram(uri)
}

/// The backends in the order `ZEROCAST_TRANSPORTS` (or `default`) names them.
fn backends(default: &str) -> Result<Vec<Backend>, String> {
    let list = match std::env::var(TransportList::ENV) {
        Ok(s) => TransportList::parse(&s).map_err(|e| e.to_string())?,
        Err(_) => TransportList::parse(default).map_err(|e| e.to_string())?,
    };
    let mut out = Vec::new();
    for s in list.schemes() {
        let b = match s {
            Scheme::Tcp => Backend::Udp,
            Scheme::Rc | Scheme::RcOob | Scheme::Ud | Scheme::Mcast => Backend::RdmaUd,
            _ => continue,
        };
        if !out.contains(&b) {
            out.push(b);
        }
    }
    Ok(out)
}

impl Zerocast {
    /// Open a datagram endpoint (see [`bind`]), with buffers from this
    /// context's pool (UDP) or its registered UD pool (RDMA).
    pub fn bind_datagram(&self, uri: &str) -> Result<DatagramSocket, DatagramError> {
        let bad = |reason: String| DatagramError::BadEndpoint { endpoint: uri.to_owned(), reason };
        let ep = Endpoint::parse(uri).map_err(|e| bad(e.to_string()))?;
        if !matches!(ep.scheme(), Scheme::Ud | Scheme::Mcast) {
            return Err(bad(format!(
                "{}:// is not a datagram transport; use ud:// or mcast://",
                ep.scheme()
            )));
        }
        let mut skipped = Vec::new();
        for b in backends(crate::context::DEFAULT_TRANSPORTS).map_err(bad)? {
            match b {
                Backend::Udp => {
                    let s = self.bind_udp(&ep)?;
                    tracing::info!(endpoint = %ep, backend = "udp", local = %s.local_addr(), "datagram backend chosen");
                    return Ok(s);
                }
                Backend::RdmaUd => match self.bind_ud(&ep) {
                    Ok(s) => {
                        tracing::info!(endpoint = %ep, backend = "rdma-ud", local = %s.local_addr(), "datagram backend chosen");
                        return Ok(s);
                    }
                    Err(Skip(reason)) => {
                        tracing::debug!(endpoint = %ep, %reason, "rdma-ud skipped");
                        skipped.push(reason);
                    }
                    Err(Fail(e)) => return Err(e),
                },
            }
        }
        Err(bad(format!("no datagram backend is usable ({})", skipped.join("; "))))
    }

    fn bind_udp(&self, ep: &Endpoint) -> Result<DatagramSocket, DatagramError> {
        let pool = self
            .pool()
            .map_err(|e| DatagramError::BadEndpoint { endpoint: ep.to_string(), reason: e.to_string() })?;
        let cfg = self.config().udp.clone();
        let s = match ep.scheme() {
            Scheme::Mcast => UdpSocket::multicast(ep, pool, cfg)?,
            _ => UdpSocket::bind(ep, pool, cfg)?,
        };
        Ok(DatagramSocket::from_udp(s))
    }

    #[cfg(feature = "rdma")]
    fn bind_ud(&self, ep: &Endpoint) -> Result<DatagramSocket, BindUd> {
        let t = self.ud().map_err(|e| Skip(format!("no usable RDMA device: {e}")))?;
        let r = match ep.scheme() {
            Scheme::Mcast => t.multicast(ep),
            _ => t.bind(ep),
        };
        match r {
            Ok(s) => Ok(DatagramSocket::from_ud(s)),
            Err(e @ (UdError::BadEndpoint { .. } | UdError::Bind { .. } | UdError::WrongDevice { .. })) => {
                Err(Skip(zerocast_link::error_chain(&e)))
            }
            Err(e) => Err(Fail(e.into())),
        }
    }

    #[cfg(not(feature = "rdma"))]
    fn bind_ud(&self, _ep: &Endpoint) -> Result<DatagramSocket, BindUd> {
        Err(Skip("the RDMA backend is not built in (feature `rdma`)".into()))
    }
}

/// Why RDMA UD was not used for an endpoint.
enum BindUd {
    /// Not usable for it: try the next backend.
    Skip(String),
    /// Usable, but failed.
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    Fail(DatagramError),
}
use BindUd::{Fail, Skip};

/// `fut`, an rdma_cm exchange of `s`, by `s`'s resolve timeout on the whole
/// (`late`: the error at its end).
#[cfg(all(feature = "tokio", feature = "rdma"))]
async fn bounded(
    s: &zerocast_rdma::ud::UdSocket,
    fut: impl std::future::Future<Output = Result<(), zerocast_rdma::ud::UdError>>,
    late: impl FnOnce() -> zerocast_rdma::ud::UdError,
) -> Result<(), zerocast_rdma::ud::UdError> {
    ::tokio::time::timeout(s.resolve_timeout(), fut).await.unwrap_or_else(|_| Err(late()))
}
