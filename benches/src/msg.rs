//! The messages of the typed and codec benchmarks.

use std::fmt;

use serde::de::{SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use zerocast::{Bincode, Codec};

/// A small record: 60 bytes with bincode's standard configuration when
/// `data` holds 24 bytes (two 9-byte varints, 1 + 16, 1 + 24).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Small {
    /// An id; large, so its varint takes the full 9 bytes.
    pub id: u64,
    /// A timestamp; large, for the same reason.
    pub ts: u64,
    /// A 16-byte name.
    pub name: String,
    /// Opaque data.
    pub data: Vec<u8>,
}

/// [`Small`] decoded without copying: `name` and `data` borrow the input.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmallRef<'a> {
    /// As in [`Small`].
    pub id: u64,
    /// As in [`Small`].
    pub ts: u64,
    /// As in [`Small`], borrowed.
    pub name: &'a str,
    /// As in [`Small`], borrowed.
    pub data: &'a [u8],
}

/// [`Small`] with `data` serialized as a byte string instead of a sequence of
/// `u8`: the same bytes on the wire, without a serde call per byte.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmallBytes {
    /// As in [`Small`].
    pub id: u64,
    /// As in [`Small`].
    pub ts: u64,
    /// As in [`Small`].
    pub name: String,
    /// As in [`Small`], as a byte string.
    pub data: Bytes,
}

impl Small {
    /// The id of the `seq`th message.
    pub fn id_of(seq: u64) -> u64 {
        0x0123_4567_89ab_cdef_u64.wrapping_add(seq)
    }

    /// The `seq`th sample message, with `data_len` bytes of data.
    pub fn sample(seq: u64, data_len: usize) -> Self {
        Self {
            id: Self::id_of(seq),
            ts: 0x1234_5678_9abc_def0,
            name: "abcdefghijklmnop".to_owned(),
            data: (0..data_len).map(|i| i as u8).collect(),
        }
    }

    /// The `data_len` that makes the encoded message exactly `encoded` bytes.
    ///
    /// # Panics
    ///
    /// If no `data_len` gives exactly that size.
    pub fn data_len_for(encoded: usize) -> usize {
        (0..encoded)
            .rev()
            .find(|&d| Self::sample(0, d).encoded_len() == encoded)
            .unwrap_or_else(|| panic!("no Small encodes to exactly {encoded} bytes"))
    }

    /// Its size with zerocast's default codec.
    pub fn encoded_len(&self) -> usize {
        Bincode.encoded_len(self).expect("Small always encodes")
    }

    /// The same message with a byte-string `data`.
    pub fn to_bytes_form(&self) -> SmallBytes {
        SmallBytes { id: self.id, ts: self.ts, name: self.name.clone(), data: Bytes(self.data.clone()) }
    }
}

/// A `Vec<u8>` that serde sees as a byte string (what the `serde_bytes`
/// crate does), so formats copy it in one go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bytes(pub Vec<u8>);

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Bytes;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a byte string")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Bytes, E> {
                Ok(Bytes(v.to_vec()))
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Bytes, E> {
                Ok(Bytes(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Bytes, A::Error> {
                let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
                while let Some(b) = seq.next_element()? {
                    v.push(b);
                }
                Ok(Bytes(v))
            }
        }
        d.deserialize_byte_buf(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_forms_agree() {
        let m = Small::sample(3, 24);
        assert_eq!(m.encoded_len(), 60);
        let mut a = [0u8; 64];
        let mut b = [0u8; 64];
        let na = Bincode.encode(&m, &mut a).unwrap();
        let nb = Bincode.encode(&m.to_bytes_form(), &mut b).unwrap();
        assert_eq!(a[..na], b[..nb], "byte-string form is the same wire format");
        let r: SmallRef<'_> = Bincode.decode(&a[..na]).unwrap();
        assert_eq!((r.id, r.name, r.data), (m.id, m.name.as_str(), m.data.as_slice()));
        let o: SmallBytes = Bincode.decode(&a[..na]).unwrap();
        assert_eq!(o, m.to_bytes_form());
        let d = Small::data_len_for(4096);
        assert_eq!(Small::sample(0, d).encoded_len(), 4096);
    }
}
