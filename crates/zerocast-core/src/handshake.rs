//! The handshake: each side announces its receive window and limits.
//!
//! On a byte stream it travels as the payload of a [`FrameKind::Control`]
//! frame with sequence number 0, before any credit is counted. Over rdma_cm
//! it travels as connection private data (28 bytes fit the 56 that RC
//! allows).
//!
//! [`FrameKind::Control`]: crate::frame::FrameKind::Control

use crate::credit::{min_window, MAX_WINDOW, MIN_UNIT, MIN_WINDOW};
use crate::frame::VERSION;

/// Encoded size of a [`Hello`].
pub const HELLO_LEN: usize = 28;
const HELLO_MAGIC: [u8; 3] = *b"ZCH";

/// What one side tells the other before any data flows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// Receive buffers this side has posted: the peer's initial credits.
    pub window: u32,
    /// Bytes per credit this side charges for a data frame (see
    /// [`crate::credit::cost`]); 0: one credit per frame.
    pub credit_unit: u32,
    /// Largest payload this side accepts in one frame.
    pub max_payload: u64,
    /// Size of each posted receive buffer (RDMA: the largest send that fits).
    pub recv_buf_size: u32,
    /// The heartbeat interval this side asks for, in milliseconds (0: off).
    /// The connection uses the shorter of the two sides' nonzero values.
    pub heartbeat_ms: u32,
}

/// The peer's handshake is malformed or incompatible.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// Not a zerocast hello at all.
    #[error("peer did not send a zerocast hello (is it a zerocast endpoint?)")]
    NotHello,
    /// Speaks another protocol version.
    #[error("peer speaks protocol version {peer}, this build speaks {VERSION}")]
    Version {
        /// The peer's version.
        peer: u8,
    },
    /// A window outside the allowed range.
    #[error("peer announced a receive window of {0}, outside {MIN_WINDOW}..={MAX_WINDOW}")]
    Window(u32),
    /// A credit unit neither 0 nor at least [`MIN_UNIT`].
    #[error("peer announced a credit unit of {0} bytes: 0 or at least {MIN_UNIT} expected")]
    Unit(u32),
    /// A window too small for the largest frame the peer accepts: a sender
    /// could wait for credit forever.
    #[error("peer announced a window of {window} credits, but its largest frame needs {needed}")]
    WindowTooSmall {
        /// The window announced.
        window: u32,
        /// The least window its largest frame and credit unit need.
        needed: u32,
    },
    /// The frame carrying the hello was not a control frame of the right size.
    #[error("malformed handshake frame: {0}")]
    Frame(String),
}

impl Hello {
    /// Encode to [`HELLO_LEN`] bytes.
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[..3].copy_from_slice(&HELLO_MAGIC);
        b[3] = VERSION;
        b[4..8].copy_from_slice(&self.window.to_le_bytes());
        b[8..16].copy_from_slice(&self.max_payload.to_le_bytes());
        b[16..20].copy_from_slice(&self.recv_buf_size.to_le_bytes());
        b[20..24].copy_from_slice(&self.heartbeat_ms.to_le_bytes());
        b[24..28].copy_from_slice(&self.credit_unit.to_le_bytes());
        b
    }

    /// Decode and validate. Extra trailing bytes (rdma_cm pads private data)
    /// are ignored.
    pub fn decode(b: &[u8]) -> Result<Hello, HandshakeError> {
        let b: &[u8; HELLO_LEN] =
            b.get(..HELLO_LEN).and_then(|s| s.try_into().ok()).ok_or(HandshakeError::NotHello)?;
        if b[..3] != HELLO_MAGIC {
            return Err(HandshakeError::NotHello);
        }
        if b[3] != VERSION {
            return Err(HandshakeError::Version { peer: b[3] });
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let window = u32_at(4);
        if !(MIN_WINDOW..=MAX_WINDOW).contains(&window) {
            return Err(HandshakeError::Window(window));
        }
        let credit_unit = u32_at(24);
        if credit_unit != 0 && credit_unit < MIN_UNIT {
            return Err(HandshakeError::Unit(credit_unit));
        }
        let mut mp = [0u8; 8];
        mp.copy_from_slice(&b[8..16]);
        let max_payload = u64::from_le_bytes(mp);
        let needed = min_window(max_payload, credit_unit);
        if window < needed {
            return Err(HandshakeError::WindowTooSmall { window, needed });
        }
        Ok(Hello { window, credit_unit, max_payload, recv_buf_size: u32_at(16), heartbeat_ms: u32_at(20) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn roundtrip_and_errors() {
        let h = Hello {
            window: 64,
            credit_unit: 0,
            max_payload: 1 << 20,
            recv_buf_size: 4096,
            heartbeat_ms: 250,
        };
        assert_eq!(Hello::decode(&h.encode()), Ok(h));
        let mut b = h.encode();
        b[3] = 9;
        assert_eq!(Hello::decode(&b), Err(HandshakeError::Version { peer: 9 }));
        let bad = Hello { window: 1, ..h }.encode();
        assert_eq!(Hello::decode(&bad), Err(HandshakeError::Window(1)));
        assert_eq!(Hello::decode(b"GET / HTTP/1.1\r\n"), Err(HandshakeError::NotHello));
        // Weighted credits: a unit of at least 1 KiB, and a window that
        // holds the largest frame twice over (17 credits at 64 KiB).
        let w = Hello { window: 34, credit_unit: 64 << 10, ..h };
        assert_eq!(Hello::decode(&w.encode()), Ok(w));
        let small = Hello { window: 33, ..w };
        assert_eq!(
            Hello::decode(&small.encode()),
            Err(HandshakeError::WindowTooSmall { window: 33, needed: 34 })
        );
        assert_eq!(Hello::decode(&Hello { credit_unit: 100, ..w }.encode()), Err(HandshakeError::Unit(100)));
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Hello::decode(&b);
        }
    }
}
