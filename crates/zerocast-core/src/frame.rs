//! The frame header: 16 bytes in front of every message on a byte stream,
//! and at the start of every RDMA send.
//!
//! ```text
//!  0      1         2        4        8                16
//! +------+---------+--------+--------+----------------+
//! | 0x5A | ver|kind| credits|  seq   |   payload len  |
//! +------+---------+--------+--------+----------------+
//!   u8     u4 | u4   u16 LE   u32 LE       u64 LE
//! ```
//!
//! Decoding is strict: a wrong magic or version, an unknown kind, a length
//! above the configured maximum, or a non-empty credit frame is a typed
//! [`FrameError`], never an allocation or a panic.

/// Size of an encoded header in bytes.
pub const HEADER_LEN: usize = 16;
/// First byte of every header.
pub const MAGIC: u8 = 0x5A;
/// Wire protocol version carried in every header and in the handshake: a
/// peer of another version is refused at the handshake. 2: an RC data
/// frame carries its header in the send's immediate, not in front of the
/// payload. 3: the hello carries a credit unit (weighted credits).
pub const VERSION: u8 = 3;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameKind {
    /// An application message; consumes one credit.
    Data = 0,
    /// A credit update with no payload; sent from the reserved credit.
    Credit = 1,
    /// Connection control: the handshake and the goodbye.
    Control = 2,
    /// Large-message rendezvous (the payload describes remote buffers to read).
    Rendezvous = 3,
}

impl FrameKind {
    fn from_nibble(n: u8) -> Option<Self> {
        Some(match n {
            0 => FrameKind::Data,
            1 => FrameKind::Credit,
            2 => FrameKind::Control,
            3 => FrameKind::Rendezvous,
            _ => return None,
        })
    }

    /// Whether a frame of this kind consumes one of the peer's receive buffers
    /// that is returned only when the application releases it.
    pub fn holds_buffer(self) -> bool {
        matches!(self, FrameKind::Data | FrameKind::Rendezvous)
    }
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Header {
    /// Frame kind.
    pub kind: FrameKind,
    /// Credits returned to the receiver of this frame (piggybacked).
    pub credits: u16,
    /// Per-connection, per-direction sequence number (wrapping).
    pub seq: u32,
    /// Payload length in bytes.
    pub len: u64,
}

/// Why a header could not be decoded. The connection that sent it is broken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// Fewer than [`HEADER_LEN`] bytes.
    #[error("frame header truncated: {got} of {HEADER_LEN} bytes")]
    Truncated {
        /// Bytes available.
        got: usize,
    },
    /// The first byte is not [`MAGIC`]: the peer does not speak zerocast.
    #[error("bad frame magic {found:#04x}: the peer does not speak zerocast, or the stream is corrupt")]
    BadMagic {
        /// The byte found.
        found: u8,
    },
    /// A protocol version this build does not speak.
    #[error("unsupported protocol version {found} (this build speaks {VERSION})")]
    BadVersion {
        /// The version found.
        found: u8,
    },
    /// The kind nibble names no known kind.
    #[error("unknown frame kind {found}")]
    UnknownKind {
        /// The nibble found.
        found: u8,
    },
    /// The payload length exceeds the configured maximum.
    #[error("frame payload of {len} bytes exceeds the maximum of {max}")]
    TooLong {
        /// Length announced by the header.
        len: u64,
        /// The configured maximum.
        max: u64,
    },
    /// A credit frame announced a payload.
    #[error("credit frame with a {len}-byte payload")]
    CreditWithPayload {
        /// Length announced by the header.
        len: u64,
    },
}

impl Header {
    /// A header for `kind` with the given fields.
    pub fn new(kind: FrameKind, credits: u16, seq: u32, len: u64) -> Self {
        Self { kind, credits, seq, len }
    }

    /// Encode into exactly [`HEADER_LEN`] bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0] = MAGIC;
        out[1] = (VERSION << 4) | self.kind as u8;
        out[2..4].copy_from_slice(&self.credits.to_le_bytes());
        out[4..8].copy_from_slice(&self.seq.to_le_bytes());
        out[8..16].copy_from_slice(&self.len.to_le_bytes());
        out
    }

    /// Decode the first [`HEADER_LEN`] bytes of `bytes`, refusing payloads
    /// longer than `max_payload`.
    pub fn decode(bytes: &[u8], max_payload: u64) -> Result<Header, FrameError> {
        let b: &[u8; HEADER_LEN] = bytes
            .get(..HEADER_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(FrameError::Truncated { got: bytes.len() })?;
        if b[0] != MAGIC {
            return Err(FrameError::BadMagic { found: b[0] });
        }
        let version = b[1] >> 4;
        if version != VERSION {
            return Err(FrameError::BadVersion { found: version });
        }
        let kind =
            FrameKind::from_nibble(b[1] & 0x0f).ok_or(FrameError::UnknownKind { found: b[1] & 0x0f })?;
        let credits = u16::from_le_bytes([b[2], b[3]]);
        let seq = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        let len = u64::from_le_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]);
        if kind == FrameKind::Credit && len != 0 {
            return Err(FrameError::CreditWithPayload { len });
        }
        if len > max_payload {
            return Err(FrameError::TooLong { len, max: max_payload });
        }
        Ok(Header { kind, credits, seq, len })
    }
}

/// Why a received datagram was dropped (see [`check_datagram`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MalformedDatagram {
    /// Longer than a header plus the largest payload the socket takes (the
    /// receive may also have been cut short by its buffer).
    #[error("{len} bytes is longer than a header plus the largest datagram")]
    Oversize {
        /// Bytes received.
        len: usize,
    },
    /// The header did not decode.
    #[error("bad header: {0}")]
    Frame(#[from] FrameError),
    /// A valid header of a kind other than `Data`.
    #[error("frame kind {0:?} is not a datagram")]
    Kind(FrameKind),
    /// The header's length does not match the datagram's.
    #[error("header announces {announced} payload bytes but {actual} arrived")]
    LenMismatch {
        /// Payload bytes the header announced.
        announced: u64,
        /// Payload bytes that arrived.
        actual: usize,
    },
}

/// Check one received datagram, header included, against a payload limit:
/// the header of a well-formed `Data` datagram whose length matches what
/// arrived. Every datagram backend (UDP, RDMA UD) drops what this refuses.
pub fn check_datagram(datagram: &[u8], max_payload: usize) -> Result<Header, MalformedDatagram> {
    check_parts(datagram, datagram.len(), max_payload)
}

/// [`check_datagram`] for a datagram whose header follows its payload: RDMA
/// UD puts it there, in the spare room of the payload's own buffer, so a
/// send gathers one scatter entry instead of two.
pub fn check_datagram_trailer(datagram: &[u8], max_payload: usize) -> Result<Header, MalformedDatagram> {
    let (_, trailer) = datagram.split_at(datagram.len().saturating_sub(HEADER_LEN));
    check_parts(trailer, datagram.len(), max_payload)
}

/// The checks on `header` (its bytes, perhaps more) of a datagram of `len`
/// bytes in all.
fn check_parts(header: &[u8], len: usize, max_payload: usize) -> Result<Header, MalformedDatagram> {
    if len > HEADER_LEN + max_payload {
        return Err(MalformedDatagram::Oversize { len });
    }
    let h = Header::decode(header, max_payload as u64)?;
    if h.kind != FrameKind::Data {
        return Err(MalformedDatagram::Kind(h.kind));
    }
    let actual = len - HEADER_LEN;
    if h.len != actual as u64 {
        return Err(MalformedDatagram::LenMismatch { announced: h.len, actual });
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn kind() -> impl Strategy<Value = FrameKind> {
        prop_oneof![
            Just(FrameKind::Data),
            Just(FrameKind::Credit),
            Just(FrameKind::Control),
            Just(FrameKind::Rendezvous)
        ]
    }

    proptest! {
        #[test]
        fn roundtrip(kind in kind(), credits: u16, seq: u32, len in 0u64..=1 << 20) {
            let len = if kind == FrameKind::Credit { 0 } else { len };
            let h = Header::new(kind, credits, seq, len);
            prop_assert_eq!(Header::decode(&h.encode(), 1 << 20), Ok(h));
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Ok(h) = Header::decode(&bytes, 4096) {
                prop_assert!(h.len <= 4096);
                prop_assert_eq!(&h.encode()[..], &bytes[..HEADER_LEN]);
            }
        }
    }

    #[test]
    fn huge_length_is_an_error_not_an_allocation() {
        let h = Header::new(FrameKind::Data, 0, 0, 1 << 60);
        assert_eq!(
            Header::decode(&h.encode(), 1 << 20),
            Err(FrameError::TooLong { len: 1 << 60, max: 1 << 20 })
        );
    }

    #[test]
    fn strict_fields() {
        let mut b = Header::new(FrameKind::Data, 1, 2, 3).encode();
        b[1] = (VERSION << 4) | 9;
        assert_eq!(Header::decode(&b, 10), Err(FrameError::UnknownKind { found: 9 }));
        b[1] = 7 << 4;
        assert_eq!(Header::decode(&b, 10), Err(FrameError::BadVersion { found: 7 }));
        b[0] = b'G';
        assert_eq!(Header::decode(&b, 10), Err(FrameError::BadMagic { found: b'G' }));
        assert_eq!(Header::decode(&b[..5], 10), Err(FrameError::Truncated { got: 5 }));
        let c = Header::new(FrameKind::Credit, 4, 0, 1).encode();
        assert_eq!(Header::decode(&c, 10), Err(FrameError::CreditWithPayload { len: 1 }));
    }
}
