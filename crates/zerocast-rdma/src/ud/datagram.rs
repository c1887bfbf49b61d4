//! What a UD receive holds, and [`UdDatagram`], the received-datagram handle.
//!
//! A UD receive buffer starts with the 40-byte GRH the device writes in
//! front of every datagram, then (unless the socket is raw) a zerocast
//! [`Header`], then the payload. The handle exposes the payload only; no
//! byte is copied. Parsing is pure: [`grh_source`] and [`check`] look only
//! at bytes.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use zerocast_core::{FrameKind, Header, HEADER_LEN};
use zerocast_mem::Buf;

use super::io::Io;

/// Bytes of the Global Routing Header in front of every UD receive.
pub const GRH_LEN: usize = 40;

/// A received UD datagram: the pool buffer it was received into, exposed
/// as its payload only (the GRH and the header stay in front, unseen).
///
/// Dropping it posts the buffer as a receive again (or, once the socket is
/// gone, returns it to the pool).
pub struct UdDatagram {
    buf: Option<Buf>,
    /// Where the payload starts in `buf`.
    start: usize,
    seq: u32,
    io: Arc<Io>,
}

impl UdDatagram {
    pub(super) fn new(buf: Buf, start: usize, seq: u32, io: Arc<Io>) -> Self {
        debug_assert!(buf.len() >= start);
        Self { buf: Some(buf), start, seq, io }
    }

    /// The sender's sequence number for this datagram (its count of
    /// datagrams to this destination: 0, 1, 2, …). Always 0 on a raw socket.
    pub fn seq(&self) -> u32 {
        self.seq
    }

    fn buf(&self) -> &Buf {
        self.buf.as_ref().expect("present until drop")
    }
}

impl Deref for UdDatagram {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf()[self.start..]
    }
}

impl DerefMut for UdDatagram {
    fn deref_mut(&mut self) -> &mut [u8] {
        let start = self.start;
        &mut self.buf.as_mut().expect("present until drop")[start..]
    }
}

impl AsRef<[u8]> for UdDatagram {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl Drop for UdDatagram {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            self.io.repost(buf);
        }
    }
}

impl fmt::Debug for UdDatagram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UdDatagram").field("seq", &self.seq).field("len", &self.len()).finish()
    }
}

/// The sender's IP address from a received GRH.
///
/// RoCE v2 over IPv4 (rxe, and NICs alike) leaves the first 20 bytes zero
/// and puts the IPv4 header in the last 20; otherwise the 40 bytes are an
/// IPv6-style GRH whose source GID is an IPv6 (or IPv4-mapped) address.
pub fn grh_source(grh: &[u8; GRH_LEN]) -> Option<IpAddr> {
    let ip4 = &grh[20..];
    if grh[..20].iter().all(|&b| b == 0) && ip4[0] >> 4 == 4 {
        return Some(IpAddr::V4(Ipv4Addr::new(ip4[12], ip4[13], ip4[14], ip4[15])));
    }
    if grh[0] >> 4 == 6 {
        let mut sgid = [0u8; 16];
        sgid.copy_from_slice(&grh[8..24]);
        let v6 = Ipv6Addr::from(sgid);
        return Some(match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        });
    }
    None
}

/// Check what follows the GRH: a payload, then the header of a well-formed
/// `Data` datagram (the header trails, see `Io::post`).
pub(super) use zerocast_core::check_datagram_trailer as check;

/// The header of a `len`-byte payload, sent behind it. Its credit field
/// carries the sender's rdma_cm port, so a receiver can name (and answer) it.
pub(super) fn header(seq: u32, len: usize, port: u16) -> [u8; HEADER_LEN] {
    Header::new(FrameKind::Data, port, seq, len as u64).encode()
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocast_core::{FrameError, MalformedDatagram as Malformed};

    fn roce_v2_ipv4(src: [u8; 4]) -> [u8; GRH_LEN] {
        let mut g = [0u8; GRH_LEN];
        g[20] = 0x45;
        g[32..36].copy_from_slice(&src);
        g
    }

    #[test]
    fn sources_from_grh() {
        assert_eq!(grh_source(&roce_v2_ipv4([10, 0, 2, 15])), Some("10.0.2.15".parse().unwrap()));
        let mut g = [0u8; GRH_LEN];
        g[0] = 0x60;
        g[8..24].copy_from_slice(&"::ffff:10.1.2.3".parse::<Ipv6Addr>().unwrap().octets());
        assert_eq!(grh_source(&g), Some("10.1.2.3".parse().unwrap()));
        g[8..24].copy_from_slice(&"fe80::1".parse::<Ipv6Addr>().unwrap().octets());
        assert_eq!(grh_source(&g), Some("fe80::1".parse().unwrap()));
        assert_eq!(grh_source(&[0u8; GRH_LEN]), None);
    }

    #[test]
    fn headers_trail_and_are_checked() {
        let mut d = b"abc".to_vec();
        d.extend_from_slice(&header(7, 3, 4791));
        let h = check(&d, 100).unwrap();
        assert_eq!((h.seq, h.len, h.credits), (7, 3, 4791));
        assert_eq!(check(&d, 2), Err(Malformed::Oversize { len: d.len() }));
        d.insert(0, 0);
        assert_eq!(check(&d, 100), Err(Malformed::LenMismatch { announced: 3, actual: 4 }));
        let mut leading = header(7, 3, 4791).to_vec();
        leading.extend_from_slice(b"abc");
        assert!(check(&leading, 100).is_err(), "a header in front is not a datagram of this wire");
        assert!(matches!(check(b"short", 100), Err(Malformed::Frame(FrameError::Truncated { .. }))));
        let c = Header::new(FrameKind::Control, 0, 0, 0).encode();
        assert_eq!(check(&c, 100), Err(Malformed::Kind(FrameKind::Control)));
    }
}
