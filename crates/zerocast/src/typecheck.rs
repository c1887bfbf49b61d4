//! Type announcements: how a typed channel checks that both ends agree on
//! the message type.
//!
//! A [`Sender<T>`](crate::Sender) with checking on sends, once per channel
//! and before its first message, an *announcement*:
//!
//! ```text
//!  0      16            24      28
//!  MAGIC  fingerprint   name    name
//!         (u64 LE)      length  (UTF-8, `type_name::<T>()`)
//!                       (u32 LE)
//! ```
//!
//! Every [`Receiver<T>`](crate::Receiver) recognises an announcement by its
//! magic, whether or not its own side checks: one whose fingerprint is its
//! own `T`'s is dropped unseen (its buffer and credit go back as usual); any
//! other fails the receive with [`TypedRecvError::TypeMismatch`]. A message
//! of the application whose encoding starts with the 16 magic bytes would be
//! taken for an announcement: a NUL, `zerocast:type`, a NUL and a version
//! byte, an unlikely start for an encoded message (a bincode string or
//! sequence starts with its length, so it would take, say, a raw byte
//! array of these very bytes).
//!
//! Does not: negotiate, allocate per message, or look at anything but the
//! first 16 bytes of a message that is not an announcement.
//!
//! [`TypedRecvError::TypeMismatch`]: crate::TypedRecvError::TypeMismatch

/// What an announcement starts with.
pub(crate) const MAGIC: [u8; 16] = *b"\0zerocast:type\0\x01";

/// Bytes before the name: magic, fingerprint, name length.
const HEADER: usize = 16 + 8 + 4;

/// Longest type name an announcement may carry: longer claims are hostile.
pub(crate) const MAX_NAME: usize = 4096;

/// A malformed announcement: the message starts with the magic but is not
/// an announcement zerocast could have sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AnnouncementError {
    /// Shorter than its fixed header or than the name it claims.
    #[error("type announcement of {len} bytes is truncated (it needs {needed})")]
    Truncated {
        /// The message's length.
        len: usize,
        /// The length its header calls for.
        needed: usize,
    },
    /// The name length is beyond the limit, 4096 bytes.
    #[error("type announcement claims a {claimed}-byte type name; at most {MAX_NAME} are allowed")]
    NameTooLong {
        /// The claimed length.
        claimed: u64,
    },
    /// Bytes follow the name.
    #[error("{trailing} trailing bytes after the type announcement")]
    Trailing {
        /// Bytes left over.
        trailing: usize,
    },
    /// The name is not UTF-8.
    #[error("type announcement's name is not UTF-8")]
    NameNotUtf8,
}

/// A decoded announcement, borrowing its name from the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Announcement<'a> {
    pub(crate) fingerprint: u64,
    pub(crate) name: &'a str,
}

/// FNV-1a, 64 bits: stable across builds and platforms, unlike `Hash`.
const fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    h
}

/// The fingerprint of a type named `name` of `size` bytes: FNV-1a over the
/// name, then over the size as a little-endian `u64`.
pub(crate) fn fingerprint_of(name: &str, size: usize) -> u64 {
    let h = fnv1a(0xcbf2_9ce4_8422_2325, name.as_bytes());
    fnv1a(h, &(size as u64).to_le_bytes())
}

/// `T`'s fingerprint: its `type_name` (full path, generics included) and
/// its size. Both ends must be built by the same compiler for names to
/// agree; `type_name` is not promised stable across Rust releases.
pub(crate) fn fingerprint<T>() -> u64 {
    fingerprint_of(std::any::type_name::<T>(), std::mem::size_of::<T>())
}

/// `T`'s announcement's length.
pub(crate) fn encoded_len<T>() -> usize {
    HEADER + name_of::<T>().len()
}

/// `T`'s name as announced: its `type_name`, capped.
fn name_of<T>() -> &'static str {
    cap_name(std::any::type_name::<T>())
}

/// `name` cut, at a character boundary, to at most [`MAX_NAME`] bytes.
fn cap_name(name: &str) -> &str {
    if name.len() <= MAX_NAME {
        return name;
    }
    let mut end = MAX_NAME;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

/// Write `T`'s announcement into the front of `out`, which holds at least
/// [`encoded_len::<T>()`](encoded_len) bytes; return its length.
pub(crate) fn encode<T>(out: &mut [u8]) -> usize {
    let name = name_of::<T>();
    let len = HEADER + name.len();
    let out = &mut out[..len];
    out[..16].copy_from_slice(&MAGIC);
    out[16..24].copy_from_slice(&fingerprint::<T>().to_le_bytes());
    out[24..28].copy_from_slice(&(name.len() as u32).to_le_bytes());
    out[HEADER..].copy_from_slice(name.as_bytes());
    len
}

/// Whether `msg` is an announcement (starts with the magic).
pub(crate) fn is_announcement(msg: &[u8]) -> bool {
    msg.len() >= MAGIC.len() && msg[..MAGIC.len()] == MAGIC
}

/// Decode an announcement (`msg` starts with the magic). Every malformed
/// input is an error, never a panic.
pub(crate) fn decode(msg: &[u8]) -> Result<Announcement<'_>, AnnouncementError> {
    debug_assert!(is_announcement(msg));
    let truncated = |needed| AnnouncementError::Truncated { len: msg.len(), needed };
    let header = msg.get(..HEADER).ok_or(truncated(HEADER))?;
    let fingerprint = u64::from_le_bytes(header[16..24].try_into().expect("8 bytes"));
    let claimed = u32::from_le_bytes(header[24..28].try_into().expect("4 bytes"));
    if claimed as usize > MAX_NAME {
        return Err(AnnouncementError::NameTooLong { claimed: u64::from(claimed) });
    }
    let needed = HEADER + claimed as usize;
    let name = msg.get(HEADER..needed).ok_or(truncated(needed))?;
    if msg.len() > needed {
        return Err(AnnouncementError::Trailing { trailing: msg.len() - needed });
    }
    let name = std::str::from_utf8(name).map_err(|_| AnnouncementError::NameNotUtf8)?;
    Ok(Announcement { fingerprint, name })
}

/// What a receiver of `T` makes of an announcement.
pub(crate) enum Verdict {
    /// `T` itself: skip it.
    Match,
    /// Another type, by this name.
    Mismatch(String),
}

/// Judge the announcement `msg` against the receiver's `T`.
pub(crate) fn check<T>(msg: &[u8]) -> Result<Verdict, AnnouncementError> {
    let a = decode(msg)?;
    Ok(if a.fingerprint == fingerprint::<T>() {
        Verdict::Match
    } else {
        Verdict::Mismatch(a.name.to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct SmallA {
        _user_id: u64,
    }
    struct SmallB {
        _temperature: u64,
    }

    fn announce<T>() -> Vec<u8> {
        let mut out = vec![0u8; encoded_len::<T>()];
        let n = encode::<T>(&mut out);
        assert_eq!(n, out.len());
        out
    }

    #[test]
    fn roundtrip_and_fingerprints() {
        let a = announce::<SmallA>();
        assert!(is_announcement(&a));
        let d = decode(&a).unwrap();
        assert_eq!(d.name, std::any::type_name::<SmallA>());
        assert!(d.name.ends_with("SmallA"));
        assert_eq!(d.fingerprint, fingerprint::<SmallA>());
        // Same size, different name; same name, different size.
        assert_ne!(fingerprint::<SmallA>(), fingerprint::<SmallB>());
        assert_ne!(fingerprint_of("x::T", 8), fingerprint_of("x::T", 16));
        assert!(matches!(check::<SmallA>(&a), Ok(Verdict::Match)));
        match check::<SmallB>(&a) {
            Ok(Verdict::Mismatch(name)) => assert!(name.ends_with("SmallA"), "{name}"),
            _ => panic!("a SmallA announcement must not match SmallB"),
        }
    }

    #[test]
    fn fingerprint_is_stable() {
        // FNV-1a test vectors: the empty input is the offset basis.
        assert_eq!(fnv1a(0xcbf2_9ce4_8422_2325, b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(0xcbf2_9ce4_8422_2325, b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(0xcbf2_9ce4_8422_2325, b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn ordinary_messages_are_not_announcements() {
        assert!(!is_announcement(b""));
        assert!(!is_announcement(&MAGIC[..15]));
        assert!(!is_announcement(b"\0zerocast:type\0\x02 and more"));
        let mut out = [0u8; 64];
        let n = crate::Codec::encode(&crate::Bincode, &(0u8, "zerocast:type"), &mut out).unwrap();
        assert!(!is_announcement(&out[..n]));
    }

    #[test]
    fn hostile_announcements_are_typed_errors() {
        let good = announce::<SmallA>();
        // Truncated: inside the header, and inside the name.
        for cut in [16, 20, HEADER - 1, HEADER, good.len() - 1] {
            let e = decode(&good[..cut]).unwrap_err();
            assert!(matches!(e, AnnouncementError::Truncated { len, .. } if len == cut), "{cut}: {e}");
        }
        // A huge name length, and the largest u32.
        for claimed in [MAX_NAME as u32 + 1, u32::MAX] {
            let mut m = good.clone();
            m[24..28].copy_from_slice(&claimed.to_le_bytes());
            assert_eq!(decode(&m), Err(AnnouncementError::NameTooLong { claimed: u64::from(claimed) }));
        }
        // A name that is not UTF-8.
        let mut m = good.clone();
        m[HEADER] = 0xff;
        assert_eq!(decode(&m), Err(AnnouncementError::NameNotUtf8));
        assert!(check::<SmallA>(&m).is_err());
        // Bytes after the name.
        let mut m = good.clone();
        m.push(0);
        assert_eq!(decode(&m), Err(AnnouncementError::Trailing { trailing: 1 }));
        // Garbage after the magic never panics.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for len in 0..200usize {
            let mut m = MAGIC.to_vec();
            for _ in 0..len {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                m.push(state as u8);
            }
            let _ = check::<SmallB>(&m);
        }
    }

    #[test]
    fn names_are_capped_at_a_char_boundary() {
        assert_eq!(cap_name("a::B"), "a::B");
        let long = format!("x{}", "é".repeat(MAX_NAME));
        let capped = cap_name(&long);
        assert_eq!(capped.len(), MAX_NAME - 1, "é is 2 bytes; the cut falls before a split one");
        assert!(long.starts_with(capped));
    }
}
