//! [`UdError`]: why a UD socket could not be made, or a datagram operation failed.

use std::io;
use std::net::{IpAddr, SocketAddr};

/// Why an RDMA UD socket could not be set up, or a send, join or leave
/// failed. Receives report through [`zerocast_core::RecvError`], as the
/// [`Datagram`](zerocast_core::Datagram) trait asks.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UdError {
    /// The endpoint does not fit (wrong scheme, no concrete address, …).
    #[error("endpoint `{endpoint}` cannot be used here: {reason}")]
    BadEndpoint {
        /// The endpoint as written.
        endpoint: String,
        /// What is wrong and what to write instead.
        reason: String,
    },
    /// The [`UdConfig`](super::UdConfig) does not fit the device or the pool.
    #[error("invalid UdConfig: {0}")]
    Config(String),
    /// No usable verbs device.
    #[error("no RDMA device for UD datagrams")]
    Device(#[source] crate::DeviceError),
    /// Registering the pool or the header slots failed.
    #[error("cannot register memory for UD datagrams")]
    Register(#[source] zerocast_mem::RegisterError),
    /// A verbs or rdma_cm call failed.
    #[error("{call} failed")]
    Verbs {
        /// The call.
        call: &'static str,
        /// The errno.
        #[source]
        source: io::Error,
    },
    /// The local address could not be bound through rdma_cm.
    #[error(
        "cannot bind an rdma_cm id to {addr}; it must be the IP address of an RDMA device's network \
         interface (`rdma link show`), and the port free"
    )]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The errno.
        #[source]
        source: io::Error,
    },
    /// The address is bound to another device than the socket's, or to none.
    #[error("{addr} belongs to device `{found}`, not `{device}`; name the right device with `dev=` or bind an address of `{device}`")]
    WrongDevice {
        /// The address.
        addr: SocketAddr,
        /// The device the socket uses.
        device: String,
        /// The device rdma_cm bound the address to (`none`: not an RDMA address).
        found: String,
    },
    /// Resolving a peer (address, route, then its QPN and Q_Key) failed.
    #[error(
        "cannot resolve the UD peer {peer} while {step}: {reason}; is a zerocast UD socket bound at \
         that address and port?"
    )]
    Resolve {
        /// The peer.
        peer: SocketAddr,
        /// What was being done.
        step: &'static str,
        /// The event or error seen.
        reason: String,
    },
    /// Joining a multicast group failed (an rdma_cm MULTICAST_ERROR, or a
    /// verbs error attaching the queue pair).
    #[error(
        "cannot join multicast group {group}: {reason}; check `iface=` names the RDMA interface's address"
    )]
    Join {
        /// The group.
        group: IpAddr,
        /// What went wrong.
        reason: String,
    },
    /// rdma_cm reported MULTICAST_ERROR for a group after it was joined:
    /// the membership is gone. Call [`join`](super::UdSocket::join) again
    /// to rejoin.
    #[error("multicast group {group} failed after it was joined (rdma_cm MULTICAST_ERROR); join it again")]
    GroupFailed {
        /// The group.
        group: IpAddr,
    },
    /// [`leave`](super::UdSocket::leave) of a group this socket is not a member of.
    #[error("not a member of multicast group {group}")]
    NotMember {
        /// The group.
        group: IpAddr,
    },
    /// The address given is not a multicast group.
    #[error("{0} is not a multicast group; IPv4 groups are 224.0.0.0/4 (use 239.0.0.0/8 locally)")]
    NotMulticast(IpAddr),
    /// The device's multicast group limit is reached.
    #[error(
        "this socket is in {joined} multicast groups, the device's limit (max_mcast_grp = {max}); \
         leave one first"
    )]
    TooManyGroups {
        /// Groups joined.
        joined: usize,
        /// The device limit.
        max: u32,
    },
    /// The payload is longer than the largest datagram: the port's active
    /// MTU less zerocast's header. Nothing was posted; the buffer is handed
    /// back with this error.
    #[error(
        "datagram of {len} bytes exceeds the {max}-byte limit (active MTU {mtu} less the header); \
         split the message (rxe would drop it silently)"
    )]
    TooLarge {
        /// The payload length.
        len: usize,
        /// The largest payload.
        max: usize,
        /// The port's active MTU.
        mtu: u32,
    },
    /// The send queue stayed full until the send timeout.
    #[error("the UD send queue stayed full for {0:?}; the device is not completing sends")]
    SendQueueFull(std::time::Duration),
    /// The socket's queue pair failed; the socket is unusable.
    #[error("the UD queue pair failed: {0}")]
    Failed(String),
}

impl UdError {
    pub(crate) fn verbs(call: &'static str, source: io::Error) -> Self {
        UdError::Verbs { call, source }
    }
}

impl zerocast_core::Classify for UdError {
    fn kind(&self) -> zerocast_core::ErrorKind {
        use zerocast_core::ErrorKind as K;
        match self {
            UdError::BadEndpoint { .. }
            | UdError::NotMulticast(_)
            | UdError::NotMember { .. }
            | UdError::TooLarge { .. } => K::InvalidInput,
            // Nobody answered for that address, or the group refused us.
            UdError::Resolve { .. } | UdError::Join { .. } => K::Refused,
            UdError::Config(_)
            | UdError::Device(_)
            | UdError::Register(_)
            | UdError::Verbs { .. }
            | UdError::Bind { .. }
            | UdError::WrongDevice { .. }
            | UdError::GroupFailed { .. }
            | UdError::TooManyGroups { .. }
            | UdError::SendQueueFull(_)
            | UdError::Failed(_) => K::LocalResource,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_say_what_to_do() {
        let m = UdError::TooLarge { len: 2000, max: 1008, mtu: 1024 }.to_string();
        assert!(m.contains("1008") && m.contains("split"), "{m}");
        let m = UdError::GroupFailed { group: "239.1.1.1".parse().unwrap() }.to_string();
        assert!(m.contains("join it again"), "{m}");
        let m = UdError::TooManyGroups { joined: 4, max: 4 }.to_string();
        assert!(m.contains("max_mcast_grp"), "{m}");
    }
}
