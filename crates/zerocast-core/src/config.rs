//! Connection settings shared by every backend.

use crate::credit::{MAX_WINDOW, MIN_WINDOW};

/// Settings for one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LinkConfig {
    /// Receive buffers posted per connection: the peer's credit window.
    pub recv_window: u32,
    /// Largest message payload, in bytes. Frames announcing more are refused.
    pub max_payload: u64,
    /// Frames gathered into one write (stream transports).
    pub max_batch: usize,
}

impl Default for LinkConfig {
    fn default() -> Self {
        Self { recv_window: 64, max_payload: 1 << 20, max_batch: 64 }
    }
}

/// A setting out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid connection setting: {0}")]
pub struct ConfigError(pub String);

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
        Ok(())
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
}
