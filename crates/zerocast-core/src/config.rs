//! Connection settings shared by every backend.

use std::time::Duration;

use crate::credit::{MAX_WINDOW, MIN_WINDOW};
use crate::uri::{Endpoint, UriError};

/// The shortest heartbeat interval: shorter ones are raised to it (a peer
/// asking for less in its hello included).
pub const MIN_HEARTBEAT: Duration = Duration::from_millis(10);
/// Silent heartbeat intervals after which the peer is declared gone.
pub const HEARTBEAT_MISSES: u32 = 3;

/// Settings for one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LinkConfig {
    /// Receive buffers posted per connection: the peer's credit window.
    ///
    /// On `tcp://`, whose receive buffers are sized to each message, the
    /// window is a byte budget instead: `recv_window` × 64 KiB (4 MiB at
    /// the default), in credits of 1 KiB. A message takes one credit per
    /// KiB begun past its first, so 4,096 small messages fly at once at
    /// the default, or 63 of 64 KiB; the budget is raised to twice the
    /// largest message when that is more (see `zerocast_tcp::credits_for`).
    ///
    /// Freed buffers go back to the peer on this side's next frame, or in
    /// a credit frame of their own once half the window is freed. So a
    /// receiver that sends nothing may keep up to half its window, less
    /// one, from its peer, which can count on the rest less one credit
    /// (kept for credit frames): a thread that sends a burst and only then
    /// receives it on the other end should send no more than that.
    pub recv_window: u32,
    /// Largest message payload, in bytes. Frames announcing more are refused.
    pub max_payload: u64,
    /// Frames the writer gathers into one batch: one `writev` on TCP (as
    /// many as fit its staging), one post on RDMA RC (in chains of at most
    /// half the send queue).
    pub max_batch: usize,
    /// Heartbeat interval, off (`None`) by default. When either side sets
    /// one, the connection uses the shorter of the two: each side sends a
    /// frame at least this often (an empty credit frame when it has nothing
    /// else to send), and fails the connection with
    /// [`ConnError::HeartbeatTimeout`](crate::ConnError::HeartbeatTimeout)
    /// once nothing came from the peer for [`HEARTBEAT_MISSES`] intervals.
    ///
    /// Off by default: it costs a wake-up per interval per connection, and
    /// the right interval depends on how long the deployment's threads can
    /// stall (a too-short one fails live connections). A dead peer process
    /// is detected without it; a silent one (stopped, or behind a cut link)
    /// only with it.
    pub heartbeat: Option<Duration>,
    /// How long a connection the application let go of (every handle
    /// dropped, or both `close` and `close_receiver` called) may go without
    /// progress in its goodbye exchange: its last frames and its goodbye
    /// out, the peer's goodbye in. The clock starts at the let-go and
    /// restarts whenever the peer returns credits (its application is
    /// still taking what we sent). A peer that holds on past it (it never
    /// answers and never disconnects: its application keeps the connection
    /// open, its host hung, or the disconnect was lost on the way) no
    /// longer holds the connection's memory: the connection fails with
    /// [`ConnError::TimedOut`](crate::ConnError::TimedOut) and is torn
    /// down. 30 s by default; `?close_timeout_ms=N` in a URI.
    pub close_timeout: Duration,
}

impl Default for LinkConfig {
    fn default() -> Self {
        Self {
            recv_window: 64,
            max_payload: 1 << 20,
            max_batch: 64,
            heartbeat: None,
            close_timeout: Duration::from_secs(30),
        }
    }
}

/// A setting out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid connection setting: {0}")]
pub struct ConfigError(pub String);

impl crate::error::Classify for ConfigError {
    /// A setting out of range is a local misconfiguration.
    fn kind(&self) -> crate::error::ErrorKind {
        crate::error::ErrorKind::LocalResource
    }
}

impl LinkConfig {
    /// Check the settings.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(MIN_WINDOW..=MAX_WINDOW).contains(&self.recv_window) {
            return Err(ConfigError(format!(
                "recv_window {} must be within {MIN_WINDOW}..={MAX_WINDOW}",
                self.recv_window
            )));
        }
        if self.max_payload == 0 || self.max_payload > u64::from(u32::MAX) {
            return Err(ConfigError(format!("max_payload {} must be within 1..=4 GiB", self.max_payload)));
        }
        if self.max_batch == 0 || self.max_batch > 1024 {
            return Err(ConfigError(format!("max_batch {} must be within 1..=1024", self.max_batch)));
        }
        if let Some(hb) = self.heartbeat {
            if hb < MIN_HEARTBEAT || hb.as_millis() > u128::from(u32::MAX) {
                return Err(ConfigError(format!(
                    "heartbeat {hb:?} must be within {MIN_HEARTBEAT:?}..={}ms",
                    u32::MAX
                )));
            }
        }
        if self.close_timeout.is_zero() || self.close_timeout.as_millis() > u128::from(u32::MAX) {
            return Err(ConfigError(format!(
                "close_timeout {:?} must be within 1ms..={}ms",
                self.close_timeout,
                u32::MAX
            )));
        }
        Ok(())
    }

    /// Apply an endpoint's connection parameters: `window=N` (the receive
    /// window), `max_payload=SIZE` (the largest message, `128M` say; both
    /// sides must allow a message for it to pass), `heartbeat_ms=N` (the
    /// heartbeat interval; 0 turns it off) and `close_timeout_ms=N` (the
    /// close timeout).
    pub fn apply_params(&mut self, ep: &Endpoint) -> Result<(), UriError> {
        if let Some(w) = ep.param_as::<u32>("window")? {
            self.recv_window = w;
        }
        if let Some(n) = ep.param_size("max_payload")? {
            self.max_payload = n;
        }
        if let Some(ms) = ep.param_as::<u32>("heartbeat_ms")? {
            self.heartbeat = (ms > 0).then(|| Duration::from_millis(u64::from(ms)));
        }
        if let Some(ms) = ep.param_as::<u32>("close_timeout_ms")? {
            self.close_timeout = Duration::from_millis(u64::from(ms));
        }
        Ok(())
    }

    /// The heartbeat interval in whole milliseconds, as announced in the
    /// hello (0: off).
    pub fn heartbeat_ms(&self) -> u32 {
        self.heartbeat.map_or(0, |d| u32::try_from(d.as_millis()).unwrap_or(u32::MAX).max(1))
    }

    /// Set the receive window.
    pub fn with_recv_window(mut self, w: u32) -> Self {
        self.recv_window = w;
        self
    }

    /// Set the largest payload.
    pub fn with_max_payload(mut self, n: u64) -> Self {
        self.max_payload = n;
        self
    }

    /// Set the write batch size.
    pub fn with_max_batch(mut self, n: usize) -> Self {
        self.max_batch = n;
        self
    }

    /// Set the heartbeat interval (`None`: off).
    pub fn with_heartbeat(mut self, interval: Option<Duration>) -> Self {
        self.heartbeat = interval;
        self
    }

    /// Set the close timeout.
    pub fn with_close_timeout(mut self, timeout: Duration) -> Self {
        self.close_timeout = timeout;
        self
    }
}

/// The heartbeat interval a connection uses: the shorter of the two sides'
/// (in milliseconds, 0 meaning off), raised to [`MIN_HEARTBEAT`]; `None`
/// when both are off.
pub fn negotiated_heartbeat(local_ms: u32, peer_ms: u32) -> Option<Duration> {
    let ms = match (local_ms, peer_ms) {
        (0, 0) => return None,
        (0, x) | (x, 0) => x,
        (a, b) => a.min(b),
    };
    Some(Duration::from_millis(u64::from(ms)).max(MIN_HEARTBEAT))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeat_settings() {
        assert_eq!(negotiated_heartbeat(0, 0), None);
        assert_eq!(negotiated_heartbeat(0, 250), Some(Duration::from_millis(250)));
        assert_eq!(negotiated_heartbeat(100, 250), Some(Duration::from_millis(100)));
        assert_eq!(negotiated_heartbeat(1, 0), Some(MIN_HEARTBEAT));
        let mut c = LinkConfig::default();
        assert_eq!(c.heartbeat_ms(), 0);
        c.apply_params(&Endpoint::parse("tcp://h:1?heartbeat_ms=200&window=8").unwrap()).unwrap();
        assert_eq!((c.heartbeat, c.recv_window), (Some(Duration::from_millis(200)), 8));
        assert_eq!(c.heartbeat_ms(), 200);
        c.validate().unwrap();
        c.apply_params(&Endpoint::parse("tcp://h:1?heartbeat_ms=0").unwrap()).unwrap();
        assert_eq!(c.heartbeat, None);
        assert!(c.with_heartbeat(Some(Duration::from_millis(1))).validate().is_err());
    }

    #[test]
    fn max_payload_from_the_uri() {
        let mut c = LinkConfig::default();
        for (q, n) in [("128M", 128u64 << 20), ("64KiB", 64 << 10), ("1g", 1 << 30), ("1000", 1000)] {
            c.apply_params(&Endpoint::parse(&format!("tcp://h:1?max_payload={q}")).unwrap()).unwrap();
            assert_eq!(c.max_payload, n, "{q}");
        }
        for bad in ["12Q", "M", "-1", "99999999999G"] {
            let ep = Endpoint::parse(&format!("tcp://h:1?max_payload={bad}")).unwrap();
            assert!(c.apply_params(&ep).is_err(), "{bad}");
        }
        c.apply_params(&Endpoint::parse("tcp://h:1?max_payload=5G").unwrap()).unwrap();
        assert!(c.validate().is_err(), "over 4 GiB");
    }

    #[test]
    fn close_timeout_bounds() {
        let c = LinkConfig::default();
        assert_eq!(c.close_timeout, Duration::from_secs(30));
        assert!(c.with_close_timeout(Duration::from_millis(1)).validate().is_ok());
        assert!(c.with_close_timeout(Duration::ZERO).validate().is_err(), "zero");
        let too_long = Duration::from_millis(u64::from(u32::MAX) + 1);
        assert!(c.with_close_timeout(too_long).validate().is_err(), "over u32::MAX ms");
        let mut c = c;
        c.apply_params(&Endpoint::parse("rc://h:1?close_timeout_ms=250").unwrap()).unwrap();
        assert_eq!(c.close_timeout, Duration::from_millis(250));
        c.apply_params(&Endpoint::parse("tcp://h:1?close_timeout_ms=0").unwrap()).unwrap();
        assert!(c.validate().is_err(), "zero from the URI is refused by the check");
        assert!(Endpoint::parse("mem://x?close_timeout_ms=5").is_err(), "mem:// has no close timeout");
    }
}
