//! [`UdpError`]: why a UDP socket could not be made, or a datagram operation failed.

use std::io;
use std::net::{IpAddr, SocketAddr};

/// Why a UDP socket could not be set up, or a send, join or leave failed.
///
/// Receives report through [`zerocast_core::RecvError`] instead, as the
/// [`Datagram`](zerocast_core::Datagram) trait asks. Every message says what
/// to check or change.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UdpError {
    /// The endpoint does not fit the constructor (wrong scheme, a group that
    /// is not a multicast address, a malformed `iface`, …).
    #[error("endpoint `{endpoint}` cannot be used here: {reason}")]
    BadEndpoint {
        /// The endpoint as written.
        endpoint: String,
        /// What is wrong and what to write instead.
        reason: String,
    },
    /// The [`UdpConfig`](super::UdpConfig) does not fit (or does not fit the pool).
    #[error("invalid UdpConfig: {0}")]
    Config(String),
    /// The host name did not resolve to an address.
    #[error("cannot resolve `{endpoint}`; use an IP address or a name in /etc/hosts")]
    Resolve {
        /// The endpoint as written.
        endpoint: String,
        /// The resolver's error, if it gave one.
        #[source]
        source: Option<io::Error>,
    },
    /// The socket could not be created or bound.
    #[error("cannot bind a UDP socket to {addr}; is the address local to this host and the port free?")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A socket option was refused.
    #[error("cannot set {option} on the UDP socket at {addr}")]
    SocketOption {
        /// The option, e.g. `SO_RCVBUF`.
        option: &'static str,
        /// The socket's address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The multicast interface was refused: `iface=` is not an address (or
    /// index) of a local interface.
    #[error(
        "cannot send multicast from the socket at {addr} through interface {iface}; `iface=` must be \
         an address of a local interface (`ip addr`), or for IPv6 an interface index (`ip link`)"
    )]
    Interface {
        /// The interface asked for.
        iface: String,
        /// The socket's address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The OS refused the group membership.
    #[error(
        "cannot join multicast group {group} on interface {iface}: {source}; is multicast enabled \
         on that interface (`ip link`), and is the interface right (`iface=` in the endpoint)?"
    )]
    Join {
        /// The group.
        group: IpAddr,
        /// The interface: an IPv4 address or an IPv6 interface index.
        iface: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The OS refused to drop the group membership (usually: it was never joined).
    #[error(
        "cannot leave multicast group {group} on interface {iface}: {source}; was it joined on this socket?"
    )]
    Leave {
        /// The group.
        group: IpAddr,
        /// The interface: an IPv4 address or an IPv6 interface index.
        iface: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// [`join`](super::UdpSocket::join) or [`leave`](super::UdpSocket::leave)
    /// was given an address that is not a multicast group.
    #[error("{0} is not a multicast group; IPv4 groups are 224.0.0.0/4 (use 239.0.0.0/8 locally), IPv6 groups ff00::/8")]
    NotMulticast(IpAddr),
    /// An IPv4 address on an IPv6 socket, or the other way round.
    #[error("{addr} is not of the address family of this socket (bound at {local}); use a socket of the same IP version")]
    FamilyMismatch {
        /// The address given.
        addr: SocketAddr,
        /// The socket's own address.
        local: SocketAddr,
    },
    /// An IPv6 group membership needs an interface index, and the socket has none.
    #[error(
        "cannot use IPv6 multicast group {group} without an interface index; add `?iface=N` to the \
         endpoint (N from `ip link`; lo is usually 1)"
    )]
    NoInterface {
        /// The group.
        group: IpAddr,
    },
    /// The datagram is longer than [`UdpConfig::max_datagram`](super::UdpConfig::max_datagram).
    /// The buffer is handed back with this error.
    #[error(
        "datagram of {len} bytes exceeds max_datagram of {max} bytes; split the message, or raise \
         UdpConfig::max_datagram (at most {} bytes) on every socket of the group",
        super::MAX_DATAGRAM
    )]
    TooLarge {
        /// The payload length.
        len: usize,
        /// The socket's limit.
        max: usize,
    },
    /// The OS refused the datagram. The buffer is handed back with this error.
    #[error(
        "cannot send a {len}-byte datagram to {to}; if the OS says the message is too long, lower \
         UdpConfig::max_datagram below the path MTU"
    )]
    Send {
        /// The destination.
        to: SocketAddr,
        /// The payload length.
        len: usize,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn messages_say_what_to_do() {
        let e = UdpError::Join {
            group: "239.1.1.1".parse().unwrap(),
            iface: "127.0.0.1".into(),
            source: io::Error::from(io::ErrorKind::AddrNotAvailable),
        };
        let m = e.to_string();
        assert!(m.starts_with("cannot join multicast group 239.1.1.1 on interface 127.0.0.1: "), "{m}");
        assert!(m.contains("is multicast enabled"), "{m}");
        assert!(e.source().is_some());
        let m = UdpError::TooLarge { len: 70_000, max: 65_491 }.to_string();
        assert!(m.contains("UdpConfig::max_datagram") && m.contains("65491"), "{m}");
        let m = UdpError::NotMulticast("10.0.0.1".parse().unwrap()).to_string();
        assert!(m.contains("239.0.0.0/8"), "{m}");
        let m = UdpError::NoInterface { group: "ff15::1".parse().unwrap() }.to_string();
        assert!(m.contains("?iface="), "{m}");
    }
}
