//! The RC backend's settings: [`RcConfig`], how receiving threads wait
//! ([`CompletionMode`]), their checks, and what they imply for the pool
//! (`pool_config_for`) and a shared receive queue's shares.

use std::time::Duration;

use zerocast_core::LinkConfig;
use zerocast_mem::PoolConfig;

use super::{RcError, RENDEZVOUS_RECEIVES};
use crate::mr::Access;

/// How a receiving thread waits for completions. The engine, which polls
/// while no application thread does, sleeps on its completion channel (one
/// for the CQs of all its connections) in either mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CompletionMode {
    /// Spin on the CQ (lowest latency: a receiving thread spins until its
    /// message or its deadline, the way `ib_send_lat` does).
    BusyPoll,
    /// Spin briefly, then sleep until the CQ's next completion event
    /// (`ibv_req_notify_cq`; the engine reads the channel and wakes the
    /// thread). The spin follows the connection's recent waits, 50 µs to
    /// 500 µs of the thread's time on the CPU (see
    /// [`zerocast_link::spin`]). On an oversubscribed host, where waking a
    /// thread costs more than that, [`CompletionMode::BusyPoll`] keeps
    /// perftest's latency.
    Channel,
}

/// Settings of the RC backend.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RcConfig {
    /// Credits, payload limit and batching. `recv_window` receives are
    /// posted per connection while the receive-memory budget allows it
    /// (see `recv_memory`).
    pub link: LinkConfig,
    /// Device name (default: `ZEROCAST_RDMA_DEV`, else the first device
    /// with an active port).
    pub device: Option<String>,
    /// GID index for `rc+oob://` (default: a RoCE v2 IPv4-mapped GID).
    pub gid_index: Option<u8>,
    /// Send queue depth (signalled sends in flight).
    pub send_depth: u32,
    /// Receive memory, in bytes, all connections of this transport may keep
    /// posted (default, `None`: three quarters of the pool's cap). Each
    /// connection reserves its receives against it: the full shape
    /// (`link.recv_window` buffers of `eager_limit` bytes, plus
    /// [`RENDEZVOUS_RECEIVES`]) while that keeps the reserved bytes within
    /// a quarter of the budget, else a lean shape (a window of 8 and
    /// buffers of 8 KiB, 128 KiB in all; larger messages go by rendezvous).
    /// A connection that finds no room even for that is refused with
    /// [`RcError::ReceiveMemory`]. Connections admitted to a listener's
    /// shared receive queue (`srq`) use its receives instead. So the default
    /// pool holds over a thousand connections.
    pub recv_memory: Option<usize>,
    /// Size of the posted receive buffers. Larger messages, up to
    /// `link.max_payload`, go by rendezvous: the receiver RDMA-READs them
    /// straight from the sender's buffer.
    pub eager_limit: usize,
    /// Frames up to this size (16-byte header included) are sent inline:
    /// copied at post time, their buffer back in the pool at once. 0
    /// disables; the device may grant less.
    pub max_inline: u32,
    /// RNR retries (0..=7, 7 = forever). Credits make RNR impossible, so
    /// tests run with 0.
    pub rnr_retry: u8,
    /// Transport retries before `IBV_WC_RETRY_EXC_ERR` (0..=7; default 6).
    /// A peer that stops acknowledging is reported after about
    /// `(retry_cnt + 1) × 4.096 µs × 2^timeout`. Beware 7 on Soft-RoCE:
    /// rdma_rxe never counts a retry count of 7 down, so it retransmits
    /// forever and only rdma_cm or a heartbeat notices the dead peer.
    pub retry_cnt: u8,
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout (1..=31). Zero,
    /// which means "wait forever" on rxe, is refused.
    pub timeout: u8,
    /// Minimum RNR NAK timer code (`rc+oob://`).
    pub min_rnr_timer: u8,
    /// How completions are waited for.
    pub completion: CompletionMode,
    /// Listeners: receives of one shared receive queue serving every
    /// accepted connection (0: each connection has its own receive queue).
    /// Each connection gets a share of them: its window (`link.recv_window`)
    /// as its credits, plus [`RENDEZVOUS_RECEIVES`] for rendezvous finishes.
    /// So a listener admits `srq / (recv_window + RENDEZVOUS_RECEIVES)`
    /// connections and refuses more with [`RcError::SrqFull`]. Per listener: `?srq=N`
    /// (connecting ignores it).
    pub srq: u32,
    /// The SRQ's low watermark: below this many posted receives the device
    /// raises `IBV_EVENT_SRQ_LIMIT_REACHED` and the SRQ is refilled from the
    /// pool (0: a quarter of `srq`). Per listener: `?srq_limit=N`.
    pub srq_limit: u32,
    /// Time allowed for address/route resolution and the handshake.
    pub connect_timeout: Duration,
    /// What the pool's regions allow ([`Access::Local`] by default: no
    /// peer can reach them, and rendezvous and [`OneSided::expose`](super::OneSided::expose) grant
    /// access to exactly the bytes they expose). Remote access here lets
    /// every peer that learns a region's rkey (`Buf::keys`) read, or write,
    /// every buffer of that region for the life of the pool: only for
    /// deployments whose peers are all trusted.
    pub pool_access: Access,
    /// Test only: return credits without reposting the receive buffer, so
    /// a sender can overrun the peer and RNR becomes observable.
    #[doc(hidden)]
    pub unsafe_ignore_credits_for_tests: bool,
}

impl Default for RcConfig {
    fn default() -> Self {
        Self {
            link: LinkConfig::default(),
            device: std::env::var("ZEROCAST_RDMA_DEV").ok().filter(|s| !s.is_empty()),
            gid_index: None,
            send_depth: 128,
            recv_memory: None,
            eager_limit: 64 << 10,
            max_inline: 256,
            rnr_retry: 7,
            retry_cnt: 6,
            timeout: 14,
            min_rnr_timer: 12,
            completion: CompletionMode::Channel,
            srq: 0,
            srq_limit: 0,
            connect_timeout: Duration::from_secs(10),
            pool_access: Access::Local,
            unsafe_ignore_credits_for_tests: false,
        }
    }
}

impl RcConfig {
    /// Set the link settings.
    pub fn with_link(mut self, link: LinkConfig) -> Self {
        self.link = link;
        self
    }

    /// Set the RNR retry count (0..=7).
    pub fn with_rnr_retry(mut self, n: u8) -> Self {
        self.rnr_retry = n;
        self
    }

    /// Set the ACK timeout exponent (1..=31) and the retry count (0..=7).
    pub fn with_timeout(mut self, timeout: u8, retry_cnt: u8) -> Self {
        self.timeout = timeout;
        self.retry_cnt = retry_cnt;
        self
    }

    /// Set the completion mode.
    pub fn with_completion(mut self, mode: CompletionMode) -> Self {
        self.completion = mode;
        self
    }

    /// Set the send queue depth (4..=16384, capped by the device).
    pub fn with_send_depth(mut self, depth: u32) -> Self {
        self.send_depth = depth;
        self
    }

    /// Set what the pool's regions allow (see [`RcConfig::pool_access`]).
    pub fn with_pool_access(mut self, access: Access) -> Self {
        self.pool_access = access;
        self
    }

    /// Set the size of the receive buffers; larger messages go by rendezvous.
    pub fn with_eager_limit(mut self, bytes: usize) -> Self {
        self.eager_limit = bytes;
        self
    }

    /// Set the receive-memory budget in bytes (`None`: three quarters of
    /// the pool's cap); see [`RcConfig::recv_memory`].
    pub fn with_recv_memory(mut self, bytes: Option<usize>) -> Self {
        self.recv_memory = bytes;
        self
    }

    /// Give listeners a shared receive queue of `receives` (0: none), with
    /// the default limit.
    pub fn with_srq(mut self, receives: u32) -> Self {
        self.srq = receives;
        self
    }

    /// Set the device.
    pub fn with_device(mut self, name: Option<String>) -> Self {
        self.device = name;
        self
    }

    /// Check the settings.
    pub fn validate(&self) -> Result<(), RcError> {
        self.link.validate().map_err(|e| RcError::Config(e.to_string()))?;
        if self.timeout == 0 {
            return Err(RcError::Config(
                "timeout 0 waits forever for a dead peer on rxe; use 1..=31 (14 ≈ 67 ms)".into(),
            ));
        }
        if self.timeout > 31 {
            return Err(RcError::Config(format!("timeout {} must be within 1..=31", self.timeout)));
        }
        if self.retry_cnt > 7 || self.rnr_retry > 7 {
            return Err(RcError::Config("retry_cnt and rnr_retry must be within 0..=7".into()));
        }
        if self.min_rnr_timer > 31 {
            return Err(RcError::Config("min_rnr_timer must be within 0..=31".into()));
        }
        if self.eager_limit < 64 {
            return Err(RcError::Config(format!(
                "eager_limit {} must be at least 64 bytes",
                self.eager_limit
            )));
        }
        check_srq(self.srq, self.srq_limit, share(self.link.recv_window))?;
        if !(4..=16_384).contains(&self.send_depth) {
            return Err(RcError::Config(format!("send_depth {} must be within 4..=16384", self.send_depth)));
        }
        Ok(())
    }
}

/// A connection's share of a shared receive queue: its credit window, plus
/// the receives kept for rendezvous finishes.
pub(super) fn share(window: u32) -> u32 {
    window + RENDEZVOUS_RECEIVES as u32
}

/// Check SRQ settings: `srq` holds at least one share, the limit is below it.
pub(super) fn check_srq(srq: u32, limit: u32, share: u32) -> Result<(), RcError> {
    if srq == 0 {
        return Ok(());
    }
    if srq > 1 << 20 {
        return Err(RcError::Config(format!("srq {srq} is above 1048576 receives")));
    }
    if srq < share {
        return Err(RcError::Config(format!(
            "srq {srq} cannot give one connection its share of {share} receives (its window, plus \
             {RENDEZVOUS_RECEIVES} for rendezvous)"
        )));
    }
    if limit >= srq {
        return Err(RcError::Config(format!("srq_limit {limit} must be below srq {srq}")));
    }
    Ok(())
}

/// A pool configuration whose classes reach `link.max_payload`, with a
/// class of exactly the receive-buffer size (`eager_limit`, or the payload
/// limit if smaller).
pub fn pool_config_for(base: &PoolConfig, link: &LinkConfig, eager_limit: usize) -> PoolConfig {
    let mut pc = base.clone();
    let max = link.max_payload as usize;
    let eager = eager_limit.min(max);
    pc.classes.retain(|&c| c < max && c != eager);
    pc.classes.push(max);
    if eager < max {
        pc.classes.push(eager);
    }
    pc.classes.sort_unstable();
    pc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_checked() {
        assert!(RcConfig::default().validate().is_ok());
        let err = RcConfig::default().with_timeout(0, 7).validate().expect_err("timeout 0");
        assert!(err.to_string().contains("timeout 0 waits forever"), "{err}");
        assert!(RcConfig::default().with_timeout(32, 7).validate().is_err());
        assert!(RcConfig::default().with_timeout(14, 8).validate().is_err());
        assert!(RcConfig::default().with_rnr_retry(8).validate().is_err());
        assert!(RcConfig::default().with_rnr_retry(0).validate().is_ok());
    }

    #[test]
    fn srq_settings_are_checked() {
        assert!(check_srq(0, 0, 64).is_ok(), "no SRQ");
        assert!(check_srq(256, 0, 4).is_ok());
        assert!(check_srq(256, 255, 4).is_ok());
        let err = check_srq(32, 0, 64).expect_err("smaller than a share");
        assert!(err.to_string().contains("share of 64"), "{err}");
        assert!(check_srq(32, 32, 8).is_err(), "limit not below the SRQ");
        assert!(check_srq((1 << 20) + 1, 0, 8).is_err(), "too large");
        let cfg = RcConfig::default().with_srq(16);
        assert!(cfg.validate().is_err(), "16 receives cannot hold the default window of 64");
        assert!(RcConfig::default().with_srq(128).validate().is_ok());
    }

    #[test]
    fn pool_classes_reach_max_payload() {
        let link = LinkConfig::default().with_max_payload(100_000);
        let pc = pool_config_for(&PoolConfig::default(), &link, 4096);
        assert_eq!(pc.classes.last(), Some(&100_000));
        assert!(pc.classes.contains(&4096), "{:?}", pc.classes);
        assert!(pc.classes.windows(2).all(|w| w[0] < w[1]));
        // An eager limit above the payload limit: receive buffers hold the largest message.
        let pc = pool_config_for(&PoolConfig::default(), &link, 1 << 20);
        assert_eq!(pc.classes.last(), Some(&100_000));
        assert!(pc.classes.windows(2).all(|w| w[0] < w[1]));
        assert!(RcConfig::default().with_eager_limit(16).validate().is_err());
    }
}
