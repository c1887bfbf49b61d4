//! How typed messages become bytes.
//!
//! [`Codec`] is deliberately small so the serialization format can be
//! swapped. The default, [`Bincode`], uses bincode 2 through its serde
//! support. bincode is marked unmaintained (RUSTSEC-2025-0141) and its 3.0.0
//! release is empty, which is why it sits behind this trait: another codec
//! (postcard, rkyv, a hand-written one) plugs in without touching channels.

use serde::{Deserialize, Serialize};

/// Why a message could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// The output buffer is too small; `needed` is the exact size when known.
    #[error("buffer of {capacity} bytes too small for the encoded message")]
    BufferTooSmall {
        /// The buffer size.
        capacity: usize,
    },
    /// Encoding failed.
    #[error("cannot encode message: {0}")]
    Encode(String),
    /// The bytes are not a valid message of the expected type.
    #[error("cannot decode message: {0}")]
    Decode(String),
    /// Bytes were left over after decoding a whole message.
    #[error("{trailing} trailing bytes after the message")]
    Trailing {
        /// Bytes left over.
        trailing: usize,
    },
    /// Decoding would claim more memory than the codec's decode limit.
    #[error(
        "the message claims more than {limit} bytes, the decode limit (8 x max_payload, at least 64 MiB, \
         for a typed channel); raise max_payload on both sides (`?max_payload=` or \
         LinkConfig::max_payload), or use a codec with a higher limit (BincodeLimit)"
    )]
    LimitExceeded {
        /// The limit, in bytes.
        limit: usize,
    },
}

/// A serialization format for typed channels.
pub trait Codec: Clone + Default + Send + Sync + 'static {
    /// Encode `msg` into the front of `out`; return the bytes written, or
    /// [`CodecError::BufferTooSmall`].
    fn encode<T: Serialize + ?Sized>(&self, msg: &T, out: &mut [u8]) -> Result<usize, CodecError>;
    /// The exact encoded size of `msg`.
    fn encoded_len<T: Serialize + ?Sized>(&self, msg: &T) -> Result<usize, CodecError>;
    /// Decode one whole message from `bytes`, borrowing from them where the
    /// type allows (`&str`, `&[u8]`).
    fn decode<'de, T: Deserialize<'de>>(&self, bytes: &'de [u8]) -> Result<T, CodecError>;

    /// [`Codec::decode`] with a bound, `limit` bytes, on the memory the
    /// message may claim. Typed channels pass [`decode_limit`] of the
    /// connection's `max_payload`. The default ignores the bound and
    /// decodes with the codec's own.
    fn decode_limited<'de, T: Deserialize<'de>>(
        &self,
        bytes: &'de [u8],
        limit: usize,
    ) -> Result<T, CodecError> {
        let _ = limit;
        self.decode(bytes)
    }
}

/// The decode limit a typed channel uses for messages of up to
/// `max_payload` bytes: eight times that (a small wire value, such as a
/// one-byte varint, can claim a larger in-memory one), and never less than
/// [`DEFAULT_DECODE_LIMIT`].
pub fn decode_limit(max_payload: usize) -> usize {
    max_payload.saturating_mul(8).max(DEFAULT_DECODE_LIMIT)
}

/// The decode limit of [`Bincode`]: 64 MiB.
pub const DEFAULT_DECODE_LIMIT: usize = 64 << 20;

/// bincode 2 with its standard configuration (little-endian, varints) and a
/// decode limit of [`DEFAULT_DECODE_LIMIT`], or, in a typed channel, of
/// [`decode_limit`] of the connection's `max_payload` (rounded up to a
/// power of two).
///
/// The limit bounds the memory one decoded message may claim (strings, byte
/// buffers and collections, counted at their in-memory size). A hostile
/// length prefix is then a [`CodecError::LimitExceeded`], never a huge
/// allocation. For a fixed limit, whatever the channel, use [`BincodeLimit`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Bincode;

/// [`Bincode`] with a decode limit of `LIMIT` bytes.
#[derive(Debug, Clone, Copy, Default)]
pub struct BincodeLimit<const LIMIT: usize>;

impl Codec for Bincode {
    fn encode<T: Serialize + ?Sized>(&self, msg: &T, out: &mut [u8]) -> Result<usize, CodecError> {
        BincodeLimit::<DEFAULT_DECODE_LIMIT>.encode(msg, out)
    }

    fn encoded_len<T: Serialize + ?Sized>(&self, msg: &T) -> Result<usize, CodecError> {
        BincodeLimit::<DEFAULT_DECODE_LIMIT>.encoded_len(msg)
    }

    fn decode<'de, T: Deserialize<'de>>(&self, bytes: &'de [u8]) -> Result<T, CodecError> {
        BincodeLimit::<DEFAULT_DECODE_LIMIT>.decode(bytes)
    }

    fn decode_limited<'de, T: Deserialize<'de>>(
        &self,
        bytes: &'de [u8],
        limit: usize,
    ) -> Result<T, CodecError> {
        // bincode takes its limit as a constant: pick the power of two at
        // or above `limit`, from 64 MiB (2^26) to 1 TiB (2^40).
        macro_rules! by_power {
            ($($k:literal)*) => {
                match limit.max(DEFAULT_DECODE_LIMIT).next_power_of_two().trailing_zeros() {
                    $($k => BincodeLimit::<{ 1usize << $k }>.decode(bytes),)*
                    _ => BincodeLimit::<{ 1usize << 40 }>.decode(bytes),
                }
            };
        }
        by_power!(26 27 28 29 30 31 32 33 34 35 36 37 38 39)
    }
}

impl<const LIMIT: usize> Codec for BincodeLimit<LIMIT> {
    fn encode<T: Serialize + ?Sized>(&self, msg: &T, out: &mut [u8]) -> Result<usize, CodecError> {
        let capacity = out.len();
        bincode::serde::encode_into_slice(msg, out, bincode::config::standard()).map_err(|e| match e {
            bincode::error::EncodeError::UnexpectedEnd => CodecError::BufferTooSmall { capacity },
            other => CodecError::Encode(other.to_string()),
        })
    }

    fn encoded_len<T: Serialize + ?Sized>(&self, msg: &T) -> Result<usize, CodecError> {
        let mut w = bincode::enc::write::SizeWriter::default();
        bincode::serde::encode_into_writer(msg, &mut w, bincode::config::standard())
            .map_err(|e| CodecError::Encode(e.to_string()))?;
        Ok(w.bytes_written)
    }

    fn decode<'de, T: Deserialize<'de>>(&self, bytes: &'de [u8]) -> Result<T, CodecError> {
        let config = bincode::config::standard().with_limit::<LIMIT>();
        let (v, used) = bincode::serde::borrow_decode_from_slice(bytes, config).map_err(|e| match e {
            bincode::error::DecodeError::LimitExceeded => CodecError::LimitExceeded { limit: LIMIT },
            other => CodecError::Decode(other.to_string()),
        })?;
        if used != bytes.len() {
            return Err(CodecError::Trailing { trailing: bytes.len() - used });
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Msg<'a> {
        id: u64,
        name: &'a str,
        tags: Vec<String>,
    }

    #[test]
    fn roundtrip_borrows_and_is_strict() {
        let m = Msg { id: 7, name: "seven", tags: vec!["a".into()] };
        let mut out = [0u8; 64];
        let n = Bincode.encode(&m, &mut out).unwrap();
        assert_eq!(n, Bincode.encoded_len(&m).unwrap());
        let back: Msg<'_> = Bincode.decode(&out[..n]).unwrap();
        assert_eq!(back, m);
        assert!(std::ptr::eq(back.name.as_bytes().as_ptr(), out[..n].as_ptr().wrapping_add(2)));
        assert!(matches!(
            Bincode.decode::<Msg<'_>>(&out[..n + 1]),
            Err(CodecError::Trailing { trailing: 1 })
        ));
        assert!(matches!(Bincode.encode(&m, &mut out[..3]), Err(CodecError::BufferTooSmall { capacity: 3 })));
        // A huge claimed length is an error, not an allocation.
        let evil = [0xfdu8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0f];
        assert!(Bincode.decode::<Vec<u64>>(&evil).is_err());
        assert!(Bincode.decode::<String>(&evil).is_err());
        assert!(Bincode.decode::<Vec<u8>>(&evil).is_err());
    }

    #[test]
    fn the_limit_follows_max_payload_and_says_which_knob() {
        assert_eq!(decode_limit(1 << 20), DEFAULT_DECODE_LIMIT);
        assert_eq!(decode_limit(100 << 20), 800 << 20);
        // A 100 MiB string passes the limit of a 100 MiB max_payload, not
        // the default one (borrowed, so the test copies nothing).
        let big = "z".repeat(100 << 20);
        let len = Bincode.encoded_len(&big).unwrap();
        let mut out = vec![0u8; len];
        Bincode.encode(&big, &mut out).unwrap();
        match Bincode.decode::<&str>(&out) {
            Err(e @ CodecError::LimitExceeded { limit: DEFAULT_DECODE_LIMIT }) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("max_payload") && msg.contains(&DEFAULT_DECODE_LIMIT.to_string()),
                    "{msg}"
                );
            }
            other => panic!("expected LimitExceeded, got {:?}", other.map(str::len)),
        }
        let back: &str = Bincode.decode_limited(&out, decode_limit(100 << 20)).unwrap();
        assert_eq!(back.len(), 100 << 20);
        // A fixed limit stays fixed.
        assert!(matches!(
            BincodeLimit::<1024>.decode_limited::<&str>(&out, usize::MAX),
            Err(CodecError::LimitExceeded { limit: 1024 })
        ));
    }
}
