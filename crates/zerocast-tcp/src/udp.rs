//! UDP and UDP multicast datagrams: the `ud://` and `mcast://` fallback when
//! there is no RDMA.
//!
//! [`UdpSocket`] implements [`zerocast_core::Datagram`]. Send buffers come
//! from a [`Pool`]; each datagram is received straight into a pool buffer
//! and handed out as a [`RecvDatagram`], which puts the buffer back when
//! dropped. No payload byte is copied in user space either way: a send
//! gathers the 16-byte header and the buffer in one `sendmsg`.
//!
//! # On the wire
//!
//! Each datagram is a zerocast [`Header`](zerocast_core::Header) (kind
//! `Data`, `seq` = the sending socket's counter, `len` = payload length)
//! followed by the payload. Sequence numbers count per destination (a
//! peer or a group), so a receiver sees a gap only where a datagram to it
//! was lost. A receiver drops, counts
//! ([`UdpStats::dropped_malformed`]) and logs at `debug` anything that is not
//! exactly that: foreign traffic on the port never reaches the user.
//!
//! # What it does
//!
//! - `ud://host:port` ([`UdpSocket::bind`]): a unicast socket; port 0 picks one.
//! - `?max_sources=N` on either: the most sources tracked (see below).
//! - `mcast://group:port?iface=addr&ttl=N&loop=0|1` ([`UdpSocket::multicast`]):
//!   binds `group:port` with `SO_REUSEADDR` and `SO_REUSEPORT`, so several
//!   processes on one host can be members, and joins the group on `iface`.
//!   Any socket can also [`join`](UdpSocket::join) and
//!   [`leave`](UdpSocket::leave) groups. On Linux `IP_MULTICAST_ALL` is
//!   turned off, so a socket receives only the groups it joined itself.
//! - The interface defaults to **loopback** (`127.0.0.1`) when `iface` is
//!   not given (for `ud://`: the bound IPv4 address, or loopback if it is
//!   unspecified). Multicast then never leaves the host; to reach other
//!   hosts, name the NIC's address with `iface=`. IPv4 multicast over
//!   loopback works between processes on one machine, even when `lo` lacks
//!   the `MULTICAST` flag.
//! - IPv6 works for unicast and for group membership; an IPv6 group needs
//!   `iface=N`, an interface index. IPv6 multicast *delivery* over `lo` is
//!   not tested: Linux has no IPv6 multicast route on `lo` by default, so
//!   such sends fail with "network unreachable" there.
//! - The `dev` endpoint parameter names an RDMA device; UDP ignores it.
//!
//! # Threads and cost
//!
//! All methods take `&self`. Sends run concurrently; receivers take turns,
//! because a receive sets per-socket state: `recv_from` with a deadline
//! sets `SO_RCVTIMEO` (one extra syscall, skipped when unchanged), and
//! `try_recv_from` turns `O_NONBLOCK` on and off around its receive (two
//! extra syscalls). The data path allocates nothing on the heap: buffers
//! come from the pool, the header is on the stack.
//!
//! # What it does not do
//!
//! Datagram semantics, nothing more: no reliability, no retransmission, no
//! ordering, no credits or flow control, no fragmentation of large messages.
//! Datagrams can be lost (a full socket receive buffer, a full pool, the
//! network) and reordered: **unreliable and unordered**. The receiver
//! counts, per source, datagrams received, lost (gaps in the sequence) and
//! reordered ([`UdpSocket::source_stats`], through
//! [`zerocast_core::SeqTracker`]); nothing repairs them. That accounting is
//! kept for at most [`UdpConfig::max_sources`] sources (`?max_sources=N`,
//! default 4096): a new source beyond them replaces an idle one, so source
//! addresses from the network (spoofed ports, say) cannot grow the
//! socket's memory ([`UdpStats::sources_evicted`] counts them). A payload is at
//! most [`UdpConfig::max_datagram`] bytes.
//!
//! # Memory
//!
//! Every receive takes a buffer of `HEADER_LEN + max_datagram + 1` bytes (the
//! extra byte detects oversize datagrams) from the pool before the datagram
//! arrives, so a small `max_datagram` (e.g. 8175 with an 8192-byte class)
//! keeps small datagrams from holding 64 KiB buffers.

mod datagram;
mod error;
mod gate;
mod plan;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;
use std::io::{self, IoSlice};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use socket2::{Domain, Protocol, SockAddr, SockRef, Socket, Type};
use zerocast_core::{
    Caps, ConnError, Datagram, Endpoint, RecvError, SeqStats, SeqTracker, SourceTable, DEFAULT_MAX_SOURCES,
    HEADER_LEN,
};
use zerocast_mem::{Buf, Pool, PoolError, Wait};

pub use datagram::RecvDatagram;
pub use error::UdpError;

use gate::RecvGate;
use plan::{Iface, Plan};

/// The largest UDP payload over IPv4 (65,535 − 20 IP − 8 UDP header bytes).
pub const MAX_UDP_PAYLOAD: usize = 65_507;
/// The largest zerocast payload one datagram can carry: [`MAX_UDP_PAYLOAD`]
/// less the 16-byte header.
pub const MAX_DATAGRAM: usize = MAX_UDP_PAYLOAD - HEADER_LEN;

/// How a [`UdpSocket`] is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpConfig {
    /// Largest payload, header excluded (default and maximum
    /// [`MAX_DATAGRAM`] = 65,491). Sends above it fail with
    /// [`UdpError::TooLarge`]; received datagrams above it are dropped as
    /// malformed, so every socket of a group should use the same value. The
    /// pool must have a class of at least `max_datagram + 17` bytes (the
    /// default pool's 65,600-byte class holds the default).
    pub max_datagram: usize,
    /// `SO_RCVBUF` in bytes, if set (the kernel may cap it at
    /// `net.core.rmem_max`). A bigger buffer rides out longer receive stalls.
    pub recv_buffer: Option<usize>,
    /// `SO_SNDBUF` in bytes, if set (capped at `net.core.wmem_max`).
    pub send_buffer: Option<usize>,
    /// Multicast TTL / hop limit (default 1: the local network only); the
    /// `ttl=` endpoint parameter overrides it.
    pub multicast_ttl: u32,
    /// Whether this host's own members receive what this socket sends to a
    /// group (default `true`); the `loop=` endpoint parameter overrides it.
    pub multicast_loop: bool,
    /// Most sources whose sequence accounting the socket keeps (default
    /// [`DEFAULT_MAX_SOURCES`] = 4096; at least 1); the `max_sources=`
    /// endpoint parameter overrides it. A new source beyond it replaces an
    /// idle one (CLOCK, see [`SourceTable`]), counted in
    /// [`UdpStats::sources_evicted`]; a flood from many source addresses
    /// cannot grow the socket's memory.
    pub max_sources: usize,
}

impl Default for UdpConfig {
    fn default() -> Self {
        Self {
            max_datagram: MAX_DATAGRAM,
            recv_buffer: None,
            send_buffer: None,
            multicast_ttl: 1,
            multicast_loop: true,
            max_sources: DEFAULT_MAX_SOURCES,
        }
    }
}

impl UdpConfig {
    /// Replace [`max_datagram`](Self::max_datagram).
    #[must_use]
    pub fn with_max_datagram(mut self, max_datagram: usize) -> Self {
        self.max_datagram = max_datagram;
        self
    }

    /// Replace [`max_sources`](Self::max_sources).
    #[must_use]
    pub fn with_max_sources(mut self, max_sources: usize) -> Self {
        self.max_sources = max_sources;
        self
    }

    /// Check the configuration against the pool it will receive into.
    pub fn validate(&self, pool: &Pool) -> Result<(), UdpError> {
        let bad = |m: String| Err(UdpError::Config(m));
        if self.max_datagram == 0 || self.max_datagram > MAX_DATAGRAM {
            return bad(format!("max_datagram {} is outside 1..={MAX_DATAGRAM}", self.max_datagram));
        }
        if self.multicast_ttl > 255 {
            return bad(format!("multicast_ttl {} is outside 0..=255", self.multicast_ttl));
        }
        if self.max_sources == 0 {
            return bad("max_sources is 0; a socket must track at least one source".to_owned());
        }
        let need = rx_len(self.max_datagram);
        if pool.class_for(need).is_none() {
            return bad(format!(
                "receiving {}-byte datagrams needs pool buffers of {need} bytes but the largest class holds {}; \
                 add a class of at least {need} bytes to PoolConfig::classes, or lower max_datagram to {}",
                self.max_datagram,
                pool.max_buf_size(),
                pool.max_buf_size().saturating_sub(HEADER_LEN + 1)
            ));
        }
        Ok(())
    }
}

/// Bytes a receive needs: header, largest payload, and one byte more to
/// tell an oversize datagram from one that just fits.
fn rx_len(max_datagram: usize) -> usize {
    HEADER_LEN + max_datagram + 1
}

/// A snapshot of a socket's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct UdpStats {
    /// Datagrams handed to the OS.
    pub sent: u64,
    /// Well-formed datagrams handed to the user.
    pub received: u64,
    /// Datagrams dropped because they were not zerocast datagrams (bad
    /// header, wrong length, too long).
    pub dropped_malformed: u64,
    /// Sources whose sequence accounting is kept now (at most
    /// [`UdpConfig::max_sources`]).
    pub sources_tracked: u64,
    /// Sources whose accounting was dropped to make room for a new one. An
    /// evicted source that sends again starts afresh.
    pub sources_evicted: u64,
}

#[derive(Debug, Default)]
struct Counters {
    sent: AtomicU64,
    received: AtomicU64,
    dropped_malformed: AtomicU64,
}

/// A UDP socket that sends and receives zerocast datagrams in pool buffers.
///
/// Every method takes `&self`: threads may send and receive at once.
/// Concurrent receivers take turns (each waits for its turn only until its
/// own deadline).
pub struct UdpSocket {
    sock: std::net::UdpSocket,
    pool: Pool,
    local: SocketAddr,
    iface: Iface,
    max_datagram: usize,
    /// The next sequence number per destination.
    seqs: Mutex<HashMap<SocketAddr, u32>>,
    /// Sequence accounting per source, at most `max_sources` of them.
    sources: Mutex<SourceTable<SocketAddr, SeqTracker>>,
    gate: RecvGate,
    counters: Counters,
}

/// How a receive waits.
#[derive(Clone, Copy)]
enum Mode {
    Block(Option<Instant>),
    Try,
    /// `Try`, for an event loop: another receiver's turn is `Timeout`.
    Arm,
}

impl UdpSocket {
    /// A unicast socket bound at `ud://host:port` (port 0: the OS picks; see
    /// [`local_addr`](Self::local_addr)). `?iface=` sets the interface used
    /// for multicast sends and joins (default: the bound IPv4 address, or
    /// loopback when it is unspecified).
    pub fn bind(ep: &Endpoint, pool: Pool, cfg: UdpConfig) -> Result<UdpSocket, UdpError> {
        cfg.validate(&pool)?;
        let plan = plan::unicast(ep, &cfg)?;
        let sock = Self::open(&plan, pool, &cfg, false)?;
        sock.set_multicast_options(&plan)?;
        Ok(sock)
    }

    /// A member of the group at `mcast://group:port?iface=addr&ttl=N&loop=0|1`.
    ///
    /// Binds `group:port` with address and port reuse (so other sockets and
    /// processes on this host can be members too), sets the multicast
    /// interface, loop and TTL, and joins the group on `iface` (default
    /// `127.0.0.1`; an IPv6 group needs `iface=` with an interface index).
    /// It sends like any socket; its sends to the group reach itself too
    /// while `loop` is on. The `dev` parameter names an RDMA device and is
    /// ignored here.
    pub fn multicast(ep: &Endpoint, pool: Pool, cfg: UdpConfig) -> Result<UdpSocket, UdpError> {
        cfg.validate(&pool)?;
        let plan = plan::multicast(ep, &cfg)?;
        let sock = Self::open(&plan, pool, &cfg, true)?;
        // Join first: a bad `iface` is best reported as a failed join.
        if let Some(group) = plan.group {
            sock.join(&SocketAddr::new(group, plan.bind.port()))?;
        }
        sock.set_multicast_options(&plan)?;
        Ok(sock)
    }

    fn open(plan: &Plan, pool: Pool, cfg: &UdpConfig, reuse: bool) -> Result<UdpSocket, UdpError> {
        let addr = plan.bind;
        let opt = |option| move |source| UdpError::SocketOption { option, addr, source };
        let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))
            .map_err(|source| UdpError::Bind { addr, source })?;
        if reuse {
            s.set_reuse_address(true).map_err(opt("SO_REUSEADDR"))?;
            #[cfg(all(unix, not(any(target_os = "solaris", target_os = "illumos", target_os = "cygwin"))))]
            s.set_reuse_port(true).map_err(opt("SO_REUSEPORT"))?;
        }
        if let Some(n) = cfg.recv_buffer {
            s.set_recv_buffer_size(n).map_err(opt("SO_RCVBUF"))?;
        }
        if let Some(n) = cfg.send_buffer {
            s.set_send_buffer_size(n).map_err(opt("SO_SNDBUF"))?;
        }
        s.bind(&SockAddr::from(addr)).map_err(|source| UdpError::Bind { addr, source })?;
        let sock: std::net::UdpSocket = s.into();
        let local = sock.local_addr().map_err(|source| UdpError::Bind { addr, source })?;
        tracing::debug!(%local, iface = %plan.iface, max_datagram = cfg.max_datagram, "udp socket open");
        Ok(UdpSocket {
            sock,
            pool,
            local,
            iface: plan.iface,
            max_datagram: cfg.max_datagram,
            seqs: Mutex::new(HashMap::new()),
            sources: Mutex::new(SourceTable::new(plan.max_sources)),
            gate: RecvGate::default(),
            counters: Counters::default(),
        })
    }

    /// Interface, loop, TTL and (on Linux) `IP_MULTICAST_ALL` off.
    fn set_multicast_options(&self, plan: &Plan) -> Result<(), UdpError> {
        let s = SockRef::from(&self.sock);
        let addr = self.local;
        let opt = |option| move |source| UdpError::SocketOption { option, addr, source };
        match plan.iface {
            Iface::V4(a) => {
                s.set_multicast_if_v4(&a).map_err(|source| UdpError::Interface {
                    iface: plan.iface.to_string(),
                    addr,
                    source,
                })?;
                s.set_multicast_loop_v4(plan.mcast_loop).map_err(opt("IP_MULTICAST_LOOP"))?;
                s.set_multicast_ttl_v4(plan.ttl).map_err(opt("IP_MULTICAST_TTL"))?;
                #[cfg(target_os = "linux")]
                s.set_multicast_all_v4(false).map_err(opt("IP_MULTICAST_ALL"))?;
            }
            Iface::V6(index) => {
                if let Some(i) = index {
                    s.set_multicast_if_v6(i).map_err(|source| UdpError::Interface {
                        iface: plan.iface.to_string(),
                        addr,
                        source,
                    })?;
                }
                s.set_multicast_loop_v6(plan.mcast_loop).map_err(opt("IPV6_MULTICAST_LOOP"))?;
                s.set_multicast_hops_v6(plan.ttl).map_err(opt("IPV6_MULTICAST_HOPS"))?;
                #[cfg(target_os = "linux")]
                s.set_multicast_all_v6(false).map_err(opt("IPV6_MULTICAST_ALL"))?;
            }
        }
        Ok(())
    }

    /// A send buffer of `len` payload bytes from the pool, waiting for one
    /// until `deadline` if the pool is at its cap. The length is not checked
    /// against [`max_datagram`](Self::max_datagram) here, but at the send.
    pub fn alloc(&self, len: usize, deadline: Option<Instant>) -> Result<Buf, PoolError> {
        self.pool.alloc(len, wait_until(deadline))
    }

    /// Send `buf` (its `len()` bytes) as one datagram to `to`, a peer or a
    /// group. The buffer goes back to the pool once the OS has taken it.
    ///
    /// Blocks only while the socket's send buffer is full. On error the
    /// buffer is handed back, unchanged: [`UdpError::TooLarge`] above
    /// [`max_datagram`](Self::max_datagram), [`UdpError::Send`] if the OS
    /// refused. A refused send still uses up its sequence number.
    ///
    /// The first send to a destination adds it to the socket's table of
    /// sequence counters (one allocation); later sends allocate nothing.
    pub fn send_to(&self, buf: Buf, to: &SocketAddr) -> Result<(), (Buf, UdpError)> {
        let len = buf.len();
        if len > self.max_datagram {
            return Err((buf, UdpError::TooLarge { len, max: self.max_datagram }));
        }
        let seq = {
            let mut seqs = lock(&self.seqs);
            let next = seqs.entry(*to).or_insert(0);
            let seq = *next;
            *next = next.wrapping_add(1);
            seq
        };
        let hdr = datagram::header(seq, len);
        let dest = SockAddr::from(*to);
        let iov = [IoSlice::new(&hdr), IoSlice::new(&buf)];
        let sock = SockRef::from(&self.sock);
        let sent = loop {
            match sock.send_to_vectored(&iov, &dest) {
                Ok(n) if n == HEADER_LEN + len => break Ok(()),
                Ok(n) => {
                    break Err(io::Error::other(format!("the OS sent {n} of {} bytes", HEADER_LEN + len)))
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // Only while a `try_recv_from` has the socket nonblocking.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => break Err(e),
            }
        };
        if let Err(source) = sent {
            return Err((buf, UdpError::Send { to: *to, len, source }));
        }
        self.counters.sent.fetch_add(1, Relaxed);
        Ok(())
    }

    /// Receive one datagram and its source, waiting until `deadline`
    /// (`None`: forever). Malformed datagrams are dropped and counted on the
    /// way, without ending the wait.
    ///
    /// # Errors
    ///
    /// [`RecvError::Timeout`] when the deadline passes (also while waiting
    /// for a pool buffer or for another receiving thread);
    /// [`RecvError::Failed`] on a socket error or a pool error other than a
    /// timeout.
    pub fn recv_from(&self, deadline: Option<Instant>) -> Result<(RecvDatagram, SocketAddr), RecvError> {
        self.recv(Mode::Block(deadline))
    }

    /// Receive a datagram if one is queued now, else [`RecvError::Empty`]
    /// (also while another thread is receiving). Malformed datagrams queued
    /// ahead are dropped and counted. A full pool is
    /// [`RecvError::Failed`], not a wait.
    pub fn try_recv_from(&self) -> Result<(RecvDatagram, SocketAddr), RecvError> {
        self.recv(Mode::Try)
    }

    /// For an event loop: [`UdpSocket::try_recv_from`], except that while
    /// another thread is receiving it is [`RecvError::Timeout`] (nothing
    /// was looked at: ask [`UdpSocket::wake_when_free`] to be told when
    /// that receive is over). `Empty` means nothing is queued, and the
    /// socket turns readable on the next datagram.
    pub fn try_recv_armed(&self) -> Result<(RecvDatagram, SocketAddr), RecvError> {
        self.recv(Mode::Arm)
    }

    /// After [`UdpSocket::try_recv_armed`] found another thread receiving:
    /// have `waker` woken when that receive is over. `false` if it is
    /// over already (try again now).
    pub fn wake_when_free(&self, waker: &std::task::Waker) -> bool {
        self.gate.wake_when_free(waker)
    }

    /// The size of the pool buffer each receive takes (the largest
    /// datagram, its header and one byte to tell an oversized one): what a
    /// receive that found the pool at its cap waits for.
    pub fn recv_buffer_len(&self) -> usize {
        rx_len(self.max_datagram)
    }

    /// A duplicate of the socket's descriptor, which is readable while a
    /// datagram is queued: for an event loop that waits for one and then
    /// calls [`UdpSocket::try_recv_from`].
    pub fn readiness_fd(&self) -> io::Result<std::os::fd::OwnedFd> {
        std::os::fd::AsFd::as_fd(&self.sock).try_clone_to_owned()
    }

    fn recv(&self, mode: Mode) -> Result<(RecvDatagram, SocketAddr), RecvError> {
        let rx_len = rx_len(self.max_datagram);
        let wait = match mode {
            Mode::Block(deadline) => wait_until(deadline),
            Mode::Try | Mode::Arm => Wait::No,
        };
        let mut buf = self.pool.alloc(rx_len, wait).map_err(|e| match e {
            PoolError::Timeout { .. } => RecvError::Timeout,
            e => RecvError::Failed(ConnError::transport(e)),
        })?;
        let mut turn = match mode {
            Mode::Block(deadline) => self.gate.enter(deadline).ok_or(RecvError::Timeout)?,
            Mode::Try => self.gate.try_enter().ok_or(RecvError::Empty)?,
            Mode::Arm => self.gate.try_enter().ok_or(RecvError::Timeout)?,
        };
        // Declared after `turn`, so blocking mode is back before the turn passes on.
        let _nonblocking = match mode {
            Mode::Try | Mode::Arm => Some(NonBlocking::new(&self.sock)?),
            Mode::Block(_) => None,
        };
        loop {
            if let Mode::Block(deadline) = mode {
                let timeout = match deadline {
                    None => None,
                    Some(d) => Some(
                        d.checked_duration_since(Instant::now())
                            .filter(|t| !t.is_zero())
                            .ok_or(RecvError::Timeout)?,
                    ),
                };
                turn.set_timeout(&self.sock, timeout).map_err(|e| RecvError::Failed(e.into()))?;
            }
            let (n, from) = match self.sock.recv_from(&mut buf.spare_capacity()[..rx_len]) {
                Ok(r) => r,
                Err(e) => match e.kind() {
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => match mode {
                        Mode::Try | Mode::Arm => return Err(RecvError::Empty),
                        // Checked against the deadline at the top.
                        Mode::Block(_) => continue,
                    },
                    io::ErrorKind::Interrupted => continue,
                    // An ICMP error for an earlier send; nothing to receive.
                    io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset => {
                        tracing::debug!(local = %self.local, error = %e, "ignored ICMP error on udp socket");
                        continue;
                    }
                    _ => return Err(RecvError::Failed(e.into())),
                },
            };
            match datagram::check(&buf.spare_capacity()[..n], self.max_datagram) {
                Ok(h) => {
                    buf.set_len(n);
                    lock(&self.sources).touch(from, SeqTracker::default).0.on_arrival(h.seq);
                    self.counters.received.fetch_add(1, Relaxed);
                    return Ok((RecvDatagram::new(buf, h.seq), from));
                }
                Err(why) => {
                    self.counters.dropped_malformed.fetch_add(1, Relaxed);
                    tracing::debug!(local = %self.local, %from, len = n, %why, "dropped malformed datagram");
                }
            }
        }
    }

    /// Join `group` (its port is ignored) on this socket's interface. The
    /// socket receives the group's datagrams sent to its own port.
    pub fn join(&self, group: &SocketAddr) -> Result<(), UdpError> {
        let (ip, iface) = self.membership(group)?;
        let r = match (ip, iface) {
            (IpAddr::V4(g), Iface::V4(i)) => self.sock.join_multicast_v4(&g, &i),
            (IpAddr::V6(g), Iface::V6(Some(i))) => self.sock.join_multicast_v6(&g, i),
            _ => unreachable!("checked by membership()"),
        };
        r.map_err(|source| UdpError::Join { group: ip, iface: iface.to_string(), source })?;
        tracing::debug!(local = %self.local, group = %ip, %iface, "joined multicast group");
        Ok(())
    }

    /// Leave `group` (its port is ignored). Datagrams to it stop arriving;
    /// some already queued may still be received.
    pub fn leave(&self, group: &SocketAddr) -> Result<(), UdpError> {
        let (ip, iface) = self.membership(group)?;
        let r = match (ip, iface) {
            (IpAddr::V4(g), Iface::V4(i)) => self.sock.leave_multicast_v4(&g, &i),
            (IpAddr::V6(g), Iface::V6(Some(i))) => self.sock.leave_multicast_v6(&g, i),
            _ => unreachable!("checked by membership()"),
        };
        r.map_err(|source| UdpError::Leave { group: ip, iface: iface.to_string(), source })?;
        tracing::debug!(local = %self.local, group = %ip, %iface, "left multicast group");
        Ok(())
    }

    fn membership(&self, group: &SocketAddr) -> Result<(IpAddr, Iface), UdpError> {
        let ip = group.ip();
        if !ip.is_multicast() {
            return Err(UdpError::NotMulticast(ip));
        }
        match (ip, self.iface) {
            (IpAddr::V4(_), Iface::V4(_)) | (IpAddr::V6(_), Iface::V6(Some(_))) => Ok((ip, self.iface)),
            (IpAddr::V6(_), Iface::V6(None)) => Err(UdpError::NoInterface { group: ip }),
            _ => Err(UdpError::FamilyMismatch { addr: *group, local: self.local }),
        }
    }

    /// Largest payload a datagram may carry.
    pub fn max_datagram(&self) -> usize {
        self.max_datagram
    }

    /// The bound address (with the port the OS picked, if 0 was asked for;
    /// for a group member, `group:port`).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The pool buffers come from.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Received, lost and reordered counts of datagrams from `from`.
    pub fn source_stats(&self, from: &SocketAddr) -> Option<SeqStats> {
        lock(&self.sources).get(from).map(SeqTracker::stats)
    }

    /// Every source tracked, with its counts: at most
    /// [`UdpConfig::max_sources`], the recently active ones.
    pub fn sources(&self) -> Vec<(SocketAddr, SeqStats)> {
        lock(&self.sources).iter().map(|(a, t)| (*a, t.stats())).collect()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> UdpStats {
        let (sources_tracked, sources_evicted) = {
            let t = lock(&self.sources);
            (t.len() as u64, t.evicted())
        };
        UdpStats {
            sent: self.counters.sent.load(Relaxed),
            received: self.counters.received.load(Relaxed),
            dropped_malformed: self.counters.dropped_malformed.load(Relaxed),
            sources_tracked,
            sources_evicted,
        }
    }
}

/// Turns `O_NONBLOCK` on for one try-receive, and off again when dropped.
struct NonBlocking<'a>(&'a std::net::UdpSocket);

impl<'a> NonBlocking<'a> {
    fn new(sock: &'a std::net::UdpSocket) -> Result<Self, RecvError> {
        sock.set_nonblocking(true).map_err(|e| RecvError::Failed(e.into()))?;
        Ok(Self(sock))
    }
}

impl Drop for NonBlocking<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.0.set_nonblocking(false) {
            tracing::warn!(error = %e, "cannot make the udp socket blocking again");
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn wait_until(deadline: Option<Instant>) -> Wait {
    match deadline {
        None => Wait::Forever,
        Some(d) => Wait::For(d.saturating_duration_since(Instant::now())),
    }
}

impl fmt::Debug for UdpSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UdpSocket")
            .field("local", &self.local)
            .field("iface", &format_args!("{}", self.iface))
            .field("max_datagram", &self.max_datagram)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Datagram for UdpSocket {
    const CAPS: Caps = Caps::DATAGRAM;
    type TxBuf = Buf;
    type RxBuf = RecvDatagram;
    type Addr = SocketAddr;
    type AllocError = PoolError;
    type Error = UdpError;

    fn alloc(&self, len: usize, deadline: Option<Instant>) -> Result<Buf, PoolError> {
        UdpSocket::alloc(self, len, deadline)
    }

    fn send_to(&self, buf: Buf, to: &SocketAddr) -> Result<(), (Buf, UdpError)> {
        UdpSocket::send_to(self, buf, to)
    }

    fn recv_from(&self, deadline: Option<Instant>) -> Result<(RecvDatagram, SocketAddr), RecvError> {
        UdpSocket::recv_from(self, deadline)
    }

    fn join(&self, group: &SocketAddr) -> Result<(), UdpError> {
        UdpSocket::join(self, group)
    }

    fn leave(&self, group: &SocketAddr) -> Result<(), UdpError> {
        UdpSocket::leave(self, group)
    }

    fn max_datagram(&self) -> usize {
        self.max_datagram
    }

    fn local_addr(&self) -> SocketAddr {
        self.local
    }
}
