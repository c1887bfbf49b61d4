//! Errors of RC connections: work-completion statuses, setup steps, settings.

use std::io;

use rdma_sys::ibv_wc_status;
use zerocast_core::{Classify, ErrorKind};

/// Why an RC connection failed or could not be set up.
///
/// Connections report it inside [`zerocast_core::ConnError::Transport`];
/// connecting reports it inside [`zerocast_core::ConnectError::Transport`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RcError {
    /// `IBV_WC_RETRY_EXC_ERR`: the peer acknowledged nothing within the
    /// transport retries.
    #[error(
        "peer gone or unreachable: transport retries exhausted (IBV_WC_RETRY_EXC_ERR); check that the \
         peer process is alive and the link is up, or raise `retry_cnt`/`timeout`"
    )]
    RetryExceeded,
    /// `IBV_WC_RNR_RETRY_EXC_ERR`: the peer had no receive posted.
    #[error(
        "receiver not ready: RNR retries exhausted (IBV_WC_RNR_RETRY_EXC_ERR); the peer had no receive \
         buffer posted, which zerocast's credits rule out unless they were disabled"
    )]
    RnrRetryExceeded,
    /// `IBV_WC_WR_FLUSH_ERR`: the QP entered the error state.
    #[error(
        "work request flushed (IBV_WC_WR_FLUSH_ERR): the queue pair entered the error state after an \
         earlier failure or a disconnect"
    )]
    Flushed,
    /// `IBV_WC_REM_ACCESS_ERR`: bad rkey, bounds or access rights at the peer.
    #[error("remote access error (IBV_WC_REM_ACCESS_ERR): check the rkey, address range and access flags")]
    RemoteAccess,
    /// `IBV_WC_LOC_PROT_ERR`: an SGE outside registered memory.
    #[error(
        "local protection error (IBV_WC_LOC_PROT_ERR): a buffer is not registered in this connection's \
         protection domain"
    )]
    LocalProtection,
    /// Any other failed completion.
    #[error("work completion failed with status {status} ({name}), vendor error {vendor_err:#x}")]
    Completion {
        /// The `ibv_wc_status` value.
        status: u32,
        /// Its name.
        name: &'static str,
        /// The provider's error code.
        vendor_err: u32,
    },
    /// A one-sided transfer is longer than the remote region; nothing was posted.
    #[error("one-sided transfer of {local} bytes does not fit the {remote}-byte remote region; nothing was posted")]
    RemoteTooShort {
        /// Bytes of the local buffer.
        local: usize,
        /// Bytes of the remote region.
        remote: u64,
    },
    /// A range asked of an exposed buffer lies outside it.
    #[error("{len} bytes at offset {offset} are outside the {exposed} exposed bytes")]
    OutOfRange {
        /// Where the range starts.
        offset: usize,
        /// Its length.
        len: usize,
        /// Bytes exposed.
        exposed: usize,
    },
    /// The connection is closed (or failed): nothing more is posted or
    /// received on it (a one-sided request asked for now is not posted).
    #[error("the RC connection is closed; nothing more is posted on it")]
    Closed,
    /// The peer disconnected (rdma_cm DISCONNECTED) before saying goodbye.
    #[error("the peer disconnected without closing the connection")]
    PeerDisconnected,
    /// A received frame did not match its completion.
    #[error("received frame is malformed: {0}")]
    BadFrame(String),
    /// The peer serves no RDMA READs (0 responder resources in its rdma_cm
    /// answer or connect request), which leaves this side's QP no READ
    /// depth: its messages above our receive buffers, which we RDMA-READ,
    /// could never arrive.
    #[error(
        "the peer serves no RDMA READs (0 responder resources), so its messages above our receive \
         buffers could not be read"
    )]
    NoReads,
    /// A verbs or rdma_cm call failed.
    #[error("{what} failed")]
    Verbs {
        /// The call, such as `"ibv_post_send"`.
        what: &'static str,
        /// The errno.
        #[source]
        source: io::Error,
    },
    /// An rdma_cm step reported an error event.
    #[error(
        "{step}: {event} (status {status}); check that the peer listens and the address is on an RDMA device"
    )]
    Cm {
        /// The step, such as `"resolving the address"`.
        step: &'static str,
        /// The event name.
        event: String,
        /// The event status.
        status: i32,
    },
    /// The peer rejected the connection.
    #[error("connection rejected by the peer (status {status}); check that it runs zerocast with a compatible version")]
    Rejected {
        /// The rejection status.
        status: i32,
    },
    /// The listener's shared receive queue has no share left for another
    /// connection; the peer was refused.
    #[error(
        "shared receive queue full: {connections} connections hold its {capacity} receives in shares of \
         {share}; raise `srq` or lower the window"
    )]
    SrqFull {
        /// Connections admitted.
        connections: usize,
        /// Receives of the SRQ.
        capacity: usize,
        /// Receives (credits) each connection is given.
        share: usize,
    },
    /// The transport's receive-memory budget has no room for another
    /// connection's receives, even at the lean shape (see
    /// [`RcConfig::recv_memory`](super::RcConfig::recv_memory)).
    #[error(
        "no receive memory for another connection: {committed} of {limit} bytes are reserved and a \
         connection needs {needed}; close connections, or raise `recv_memory` and the pool's cap"
    )]
    ReceiveMemory {
        /// Bytes the lean shape needs.
        needed: usize,
        /// Bytes reserved by the open connections.
        committed: usize,
        /// The budget.
        limit: usize,
    },
    /// A setting is out of range.
    #[error("invalid RC setting: {0}")]
    Config(String),
    /// No pool buffer for a receive or a rendezvous read: the pool is at
    /// its cap, or growing it failed (a memlock limit, say: the source
    /// names it).
    #[error("no pool buffer of {len} bytes for {what}")]
    Pool {
        /// What the buffer was for.
        what: &'static str,
        /// Bytes asked for.
        len: usize,
        /// Why the pool refused.
        #[source]
        source: zerocast_mem::PoolError,
    },
    /// Registering memory for the peer's access (a rendezvous payload, an
    /// exposed buffer) failed: a memlock limit, say (the source names it).
    #[error("registering {what} for the peer's access failed")]
    Register {
        /// What was to be exposed.
        what: &'static str,
        /// Why the device refused.
        #[source]
        source: zerocast_mem::RegisterError,
    },
    /// The rdma_cm device differs from the transport's.
    #[error(
        "rdma_cm chose device `{cm}` for this address but the transport's pool is registered on `{pd}`; \
         pick the device with `?dev=` or ZEROCAST_RDMA_DEV"
    )]
    WrongDevice {
        /// The device rdma_cm bound.
        cm: String,
        /// The transport's device.
        pd: String,
    },
}

impl Classify for RcError {
    fn kind(&self) -> ErrorKind {
        match self {
            // The peer's QP is gone: a disconnect, a flush after one, or
            // nothing acknowledged within the transport's retries (what a
            // killed peer's destroyed QP looks like when no disconnect
            // came first).
            RcError::PeerDisconnected | RcError::Flushed | RcError::RetryExceeded => ErrorKind::PeerGone,
            // RNR is ruled out by credits; a peer that causes it, or
            // touches memory it was not given, broke the protocol.
            RcError::RnrRetryExceeded | RcError::RemoteAccess | RcError::BadFrame(_) | RcError::NoReads => {
                ErrorKind::Protocol
            }
            RcError::Completion { status, .. } => match *status {
                // The responder's QP failed: its process died or it
                // destroyed the connection under us.
                ibv_wc_status::IBV_WC_REM_OP_ERR | ibv_wc_status::IBV_WC_REM_ABORT_ERR => ErrorKind::PeerGone,
                ibv_wc_status::IBV_WC_REM_INV_REQ_ERR | ibv_wc_status::IBV_WC_BAD_RESP_ERR => {
                    ErrorKind::Protocol
                }
                _ => ErrorKind::LocalResource,
            },
            RcError::Closed => ErrorKind::Closed,
            RcError::Rejected { .. } | RcError::SrqFull { .. } => ErrorKind::Refused,
            RcError::Cm { event, .. } => match event.as_str() {
                "RDMA_CM_EVENT_REJECTED" | "RDMA_CM_EVENT_UNREACHABLE" | "RDMA_CM_EVENT_CONNECT_ERROR" => {
                    ErrorKind::Refused
                }
                "RDMA_CM_EVENT_DISCONNECTED" | "RDMA_CM_EVENT_TIMEWAIT_EXIT" => ErrorKind::PeerGone,
                "RDMA_CM_EVENT_ADDR_ERROR" | "RDMA_CM_EVENT_ROUTE_ERROR" => ErrorKind::Refused,
                _ => ErrorKind::LocalResource,
            },
            RcError::RemoteTooShort { .. } | RcError::OutOfRange { .. } => ErrorKind::InvalidInput,
            RcError::LocalProtection
            | RcError::Verbs { .. }
            | RcError::Config(_)
            | RcError::Pool { .. }
            | RcError::ReceiveMemory { .. }
            | RcError::Register { .. }
            | RcError::WrongDevice { .. } => ErrorKind::LocalResource,
        }
    }
}

impl RcError {
    /// The error of a failed work completion.
    pub fn from_wc_status(status: u32, vendor_err: u32) -> Self {
        match status {
            ibv_wc_status::IBV_WC_RETRY_EXC_ERR => Self::RetryExceeded,
            ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR => Self::RnrRetryExceeded,
            ibv_wc_status::IBV_WC_WR_FLUSH_ERR => Self::Flushed,
            ibv_wc_status::IBV_WC_REM_ACCESS_ERR => Self::RemoteAccess,
            ibv_wc_status::IBV_WC_LOC_PROT_ERR => Self::LocalProtection,
            other => Self::Completion { status: other, name: wc_status_name(other), vendor_err },
        }
    }

    pub(crate) fn verbs(what: &'static str, source: io::Error) -> Self {
        Self::Verbs { what, source }
    }
}

/// The name of an `ibv_wc_status`.
pub fn wc_status_name(status: u32) -> &'static str {
    match status {
        ibv_wc_status::IBV_WC_SUCCESS => "IBV_WC_SUCCESS",
        ibv_wc_status::IBV_WC_LOC_LEN_ERR => "IBV_WC_LOC_LEN_ERR",
        ibv_wc_status::IBV_WC_LOC_QP_OP_ERR => "IBV_WC_LOC_QP_OP_ERR",
        ibv_wc_status::IBV_WC_LOC_PROT_ERR => "IBV_WC_LOC_PROT_ERR",
        ibv_wc_status::IBV_WC_WR_FLUSH_ERR => "IBV_WC_WR_FLUSH_ERR",
        ibv_wc_status::IBV_WC_BAD_RESP_ERR => "IBV_WC_BAD_RESP_ERR",
        ibv_wc_status::IBV_WC_LOC_ACCESS_ERR => "IBV_WC_LOC_ACCESS_ERR",
        ibv_wc_status::IBV_WC_REM_INV_REQ_ERR => "IBV_WC_REM_INV_REQ_ERR",
        ibv_wc_status::IBV_WC_REM_ACCESS_ERR => "IBV_WC_REM_ACCESS_ERR",
        ibv_wc_status::IBV_WC_REM_OP_ERR => "IBV_WC_REM_OP_ERR",
        ibv_wc_status::IBV_WC_RETRY_EXC_ERR => "IBV_WC_RETRY_EXC_ERR",
        ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR => "IBV_WC_RNR_RETRY_EXC_ERR",
        ibv_wc_status::IBV_WC_REM_ABORT_ERR => "IBV_WC_REM_ABORT_ERR",
        ibv_wc_status::IBV_WC_FATAL_ERR => "IBV_WC_FATAL_ERR",
        ibv_wc_status::IBV_WC_RESP_TIMEOUT_ERR => "IBV_WC_RESP_TIMEOUT_ERR",
        ibv_wc_status::IBV_WC_GENERAL_ERR => "IBV_WC_GENERAL_ERR",
        _ => "unknown status",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_typed_errors() {
        assert!(matches!(RcError::from_wc_status(12, 0), RcError::RetryExceeded));
        assert!(matches!(RcError::from_wc_status(13, 0), RcError::RnrRetryExceeded));
        assert!(matches!(RcError::from_wc_status(5, 0), RcError::Flushed));
        assert!(matches!(RcError::from_wc_status(10, 0), RcError::RemoteAccess));
        assert!(matches!(RcError::from_wc_status(4, 0), RcError::LocalProtection));
        assert!(RcError::from_wc_status(12, 0).to_string().contains("peer gone or unreachable"));
        let other = RcError::from_wc_status(21, 7);
        assert!(other.to_string().contains("IBV_WC_GENERAL_ERR"), "{other}");
    }
}
