//! The datagram format and [`RecvDatagram`], the received-datagram handle.
//!
//! On the wire a datagram is a [`Header`] (kind `Data`, `seq` = the sending
//! socket's counter, `len` = payload length, `credits` = 0) followed by the
//! payload, nothing else. Checking a received datagram is pure: [`check`]
//! looks only at its bytes.

use std::fmt;
use std::ops::{Deref, DerefMut};

use zerocast_core::{FrameKind, Header, HEADER_LEN};
use zerocast_mem::Buf;

/// A received datagram: the pool buffer it was received into, header and
/// all, exposed as its payload only. No copy was made.
///
/// Dropping it puts the buffer back in the pool.
pub struct RecvDatagram {
    /// Holds `HEADER_LEN + payload` bytes; `len() >= HEADER_LEN` always.
    buf: Buf,
    seq: u32,
}

impl RecvDatagram {
    /// Wrap a buffer whose first `HEADER_LEN` bytes passed [`check`].
    pub(super) fn new(buf: Buf, seq: u32) -> Self {
        debug_assert!(buf.len() >= HEADER_LEN);
        Self { buf, seq }
    }

    /// The sender's sequence number for this datagram. Each socket numbers
    /// its sends to each destination 0, 1, 2, … (wrapping), so a gap from
    /// one sender to one receiver means loss.
    pub fn seq(&self) -> u32 {
        self.seq
    }

    /// The whole pool buffer, header included: the payload is
    /// `buf[HEADER_LEN..]`.
    pub fn buf(&self) -> &Buf {
        &self.buf
    }

    /// Take the pool buffer back, header included: the payload is
    /// `buf[HEADER_LEN..]`.
    pub fn into_buf(self) -> Buf {
        self.buf
    }
}

impl Deref for RecvDatagram {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[HEADER_LEN..]
    }
}

impl DerefMut for RecvDatagram {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf[HEADER_LEN..]
    }
}

impl AsRef<[u8]> for RecvDatagram {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl fmt::Debug for RecvDatagram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecvDatagram").field("seq", &self.seq).field("len", &self.len()).finish()
    }
}

pub(super) use zerocast_core::check_datagram as check;

/// The header to put in front of a `len`-byte payload.
pub(super) fn header(seq: u32, len: usize) -> [u8; HEADER_LEN] {
    Header::new(FrameKind::Data, 0, seq, len as u64).encode()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use zerocast_core::{FrameError, MalformedDatagram as Malformed};
    use zerocast_mem::{Pool, PoolConfig, Wait};

    fn datagram(seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut v = header(seq, payload.len()).to_vec();
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn accepts_well_formed() {
        let h = check(&datagram(7, b"hello"), 100).unwrap();
        assert_eq!((h.seq, h.len, h.kind), (7, 5, FrameKind::Data));
        assert_eq!(check(&datagram(0, b""), 0).unwrap().len, 0);
        assert_eq!(check(&datagram(1, &[9; 100]), 100).unwrap().len, 100);
    }

    #[test]
    fn rejects_malformed() {
        assert_eq!(check(&datagram(1, &[9; 101]), 100), Err(Malformed::Oversize { len: 117 }));
        assert_eq!(check(b"", 100), Err(Malformed::Frame(FrameError::Truncated { got: 0 })));
        assert_eq!(
            check(&datagram(1, b"x")[..10], 100),
            Err(Malformed::Frame(FrameError::Truncated { got: 10 }))
        );
        let mut d = datagram(1, b"abc");
        d[0] = b'G';
        assert!(matches!(check(&d, 100), Err(Malformed::Frame(FrameError::BadMagic { .. }))));
        // A header announcing more or fewer bytes than arrived.
        let mut d = datagram(1, b"abc");
        d.push(0);
        assert_eq!(check(&d, 100), Err(Malformed::LenMismatch { announced: 3, actual: 4 }));
        d.truncate(HEADER_LEN + 2);
        assert_eq!(check(&d, 100), Err(Malformed::LenMismatch { announced: 3, actual: 2 }));
        // A valid frame of another kind.
        let c = Header::new(FrameKind::Control, 0, 0, 0).encode();
        assert_eq!(check(&c, 100), Err(Malformed::Kind(FrameKind::Control)));
        // A header claiming a huge payload is an error, not an allocation.
        let big = Header::new(FrameKind::Data, 0, 0, u64::MAX).encode();
        assert!(matches!(check(&big, 100), Err(Malformed::Frame(FrameError::TooLong { .. }))));
    }

    #[test]
    fn handle_exposes_payload_only() {
        let pool = Pool::unregistered(
            PoolConfig::default().with_classes([256]).with_region_size(4096).with_max_bytes(1 << 20),
        )
        .unwrap();
        let mut buf = pool.alloc(HEADER_LEN + 3, Wait::No).unwrap();
        buf.copy_from_slice(&datagram(42, b"abc"));
        let mut d = RecvDatagram::new(buf, 42);
        assert_eq!((&*d, d.seq(), d.len()), (&b"abc"[..], 42, 3));
        d[0] = b'x';
        assert_eq!(d.as_ref(), b"xbc");
        assert!(format!("{d:?}").contains("seq: 42"));
        let buf = d.into_buf();
        assert_eq!(&buf[HEADER_LEN..], b"xbc");
        drop(buf);
        assert_eq!(pool.stats().buffers_in_use, 0);
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64), max in 0usize..64) {
            if let Ok(h) = check(&bytes, max) {
                prop_assert_eq!(h.len as usize, bytes.len() - HEADER_LEN);
                prop_assert!(bytes.len() - HEADER_LEN <= max);
            }
        }

        #[test]
        fn roundtrip(seq: u32, payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            let h = check(&datagram(seq, &payload), 64).unwrap();
            prop_assert_eq!((h.seq, h.len as usize), (seq, payload.len()));
        }
    }
}
