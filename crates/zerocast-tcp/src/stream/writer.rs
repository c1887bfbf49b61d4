//! The socket's write half: frames go out with `sendmsg` (or `send`, for a
//! run of small frames alone), from the engine or from a sending thread
//! (see [`zerocast_link::Wire`]), and never wait.
//!
//! Headers and small payloads are copied into one contiguous staging buffer
//! (a kernel copy of one long slice is far cheaper than of many short ones);
//! payloads above [`COPY_MAX`] go out from their pool buffer, zero-copy.
//! Under load the link stages frames up to that size itself, already in
//! wire format ([`Wire::write_staged`]); with nothing else waiting they go
//! out straight from its area, and only what the socket does not take is
//! copied here.
//! What the socket does not take at once stays here, in order, as the
//! backlog: the rest of the staging buffer and the payloads not yet sent.
//! The engine flushes it when the socket is writable again, and frames
//! written meanwhile queue behind it. Credits bound it: every data frame in
//! it holds one of the peer's credits.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::net::Shutdown;
use std::sync::Arc;

use rustix::io::Errno;
use rustix::net::{send, sendmsg, SendAncillaryBuffer, SendFlags};
use socket2::Socket;
use zerocast_core::ConnError;
use zerocast_link::{Frame, Wire, WireCtx};
use zerocast_mem::Buf;

/// Payloads up to this size are copied into the staging buffer.
const COPY_MAX: usize = 2048;
/// Staging reserved up front: a batch of small frames fits without growing.
const STAGE: usize = 128 * 1024;
/// Most slices of one `writev`; far below the kernel's `IOV_MAX` of 1024.
const PIECES: usize = 64;
/// The kernel builds a socket's packets up to this size (its largest
/// generic segmentation offload, `GSO_MAX_SIZE`), in whole segments.
const GSO_MAX: usize = 64 * 1024;

/// Part of the backlog, in wire order.
enum Piece {
    /// The next this many bytes of staging.
    Staged(usize),
    /// A frame's own payload.
    Payload(Buf),
}

/// The socket's write half, used by the engine and by sending threads.
pub(super) struct TcpWire {
    sock: Arc<Socket>,
    /// Headers and small payloads; bytes before `sent` are written.
    staging: Vec<u8>,
    sent: usize,
    pieces: VecDeque<Piece>,
    /// Bytes of the front payload piece already written.
    payload_sent: usize,
}

/// The size of the packets the kernel builds for `sock` now: the most
/// whole segments that fit in [`GSO_MAX`], and at least one. The segment
/// (`TCP_MAXSEG`) changes as the connection goes: the kernel holds it to
/// half the largest window the peer has offered, so it is asked each time.
///
/// A write's bytes past its last whole packet go out at once as a short
/// packet of their own (the socket has `TCP_NODELAY`), which costs both
/// sides about what a whole one does, and can wake the receiver for it
/// alone. On loopback, whose segment is 64 KiB less the headers, writes
/// of 32 frames of 4 KiB were two packets and one of 618 bytes each. So a
/// long backlog goes out in multiples of this, and only its end is short.
fn packet_size(sock: &Socket) -> usize {
    let mss = sock.mss().ok().map_or(0, |m| m as usize);
    if mss == 0 {
        return GSO_MAX;
    }
    (GSO_MAX / mss).max(1) * mss
}

/// Trim `slices` (of `total` bytes) to the whole packets of `packet`
/// bytes they hold; the count of slices left. Less than one packet stays.
fn whole_packets(slices: &mut [&[u8]], total: usize, packet: usize) -> usize {
    let mut n = slices.len();
    let mut past = total % packet;
    if past == total {
        return n;
    }
    while past > 0 {
        let last = slices[n - 1];
        if past >= last.len() {
            past -= last.len();
            n -= 1;
        } else {
            slices[n - 1] = &last[..last.len() - past];
            past = 0;
        }
    }
    n
}

impl TcpWire {
    /// `window`: the peer's credit window, which bounds the frames waiting.
    pub(super) fn new(sock: Arc<Socket>, window: usize) -> Self {
        Self {
            sock,
            staging: Vec::with_capacity(STAGE),
            sent: 0,
            // Data frames, and credit or control frames between them: room
            // for a window of 64 up front, more only for a backlog.
            pieces: VecDeque::with_capacity(2 * window.min(64) + 8),
            payload_sent: 0,
        }
    }

    fn stage(&mut self, bytes: &[u8]) {
        self.staging.extend_from_slice(bytes);
        match self.pieces.back_mut() {
            Some(Piece::Staged(n)) => *n += bytes.len(),
            _ => self.pieces.push_back(Piece::Staged(bytes.len())),
        }
    }

    /// Write from the front of the backlog until it is empty or the socket
    /// is full.
    fn write_out(&mut self) -> Result<(), ConnError> {
        let flags = SendFlags::DONTWAIT | SendFlags::NOSIGNAL;
        while let Some(front) = self.pieces.front() {
            let written = match front {
                // One run of staged bytes (small frames only): a plain
                // send, with no vector to build.
                Piece::Staged(len) if self.pieces.len() == 1 => {
                    send(&*self.sock, &self.staging[self.sent..self.sent + len], flags)
                }
                _ => self.send_pieces(flags),
            };
            match written {
                Ok(k) => self.advance(k),
                Err(Errno::INTR) => {}
                Err(Errno::AGAIN) => return Ok(()),
                Err(e) => return Err(std::io::Error::from(e).into()),
            }
        }
        self.staging.clear();
        self.sent = 0;
        Ok(())
    }

    /// Send `bytes` with an empty backlog; what the socket does not take
    /// becomes the backlog.
    fn send_or_keep(&mut self, bytes: &[u8]) -> Result<(), ConnError> {
        let flags = SendFlags::DONTWAIT | SendFlags::NOSIGNAL;
        let mut at = 0;
        while at < bytes.len() {
            match send(&*self.sock, &bytes[at..], flags) {
                Ok(k) => at += k,
                Err(Errno::INTR) => {}
                Err(Errno::AGAIN) => break,
                Err(e) => return Err(std::io::Error::from(e).into()),
            }
        }
        if at < bytes.len() {
            self.staging.clear();
            self.sent = 0;
            self.stage(&bytes[at..]);
        }
        Ok(())
    }

    /// One `sendmsg` of up to [`PIECES`] pieces from the front of the
    /// backlog; with more of it behind them, of whole packets only (see
    /// [`packet_size`]): the bytes past the last whole one lead the next.
    fn send_pieces(&self, flags: SendFlags) -> rustix::io::Result<usize> {
        let mut slices: [&[u8]; PIECES] = [&[]; PIECES];
        let mut n = 0;
        let mut at = self.sent;
        let mut total = 0;
        for piece in self.pieces.iter().take(PIECES) {
            slices[n] = match piece {
                Piece::Staged(len) => {
                    at += len;
                    &self.staging[at - len..at]
                }
                Piece::Payload(buf) if n == 0 => &buf[self.payload_sent..],
                Piece::Payload(buf) => buf,
            };
            total += slices[n].len();
            n += 1;
        }
        if self.pieces.len() > n {
            n = whole_packets(&mut slices[..n], total, packet_size(&self.sock));
        }
        let iov: [IoSlice<'_>; PIECES] = slices.map(IoSlice::new);
        sendmsg(&*self.sock, &iov[..n], &mut SendAncillaryBuffer::default(), flags)
    }

    /// `k` bytes from the front of the backlog were written.
    fn advance(&mut self, mut k: usize) {
        while k > 0 {
            let Some(front) = self.pieces.front_mut() else { return };
            match front {
                Piece::Staged(len) if k < *len => {
                    *len -= k;
                    self.sent += k;
                    return;
                }
                Piece::Staged(len) => {
                    k -= *len;
                    self.sent += *len;
                }
                Piece::Payload(buf) if k < buf.len() - self.payload_sent => {
                    self.payload_sent += k;
                    return;
                }
                Piece::Payload(buf) => {
                    k -= buf.len() - self.payload_sent;
                    self.payload_sent = 0;
                }
            }
            // Written whole: a payload goes back to the pool here.
            self.pieces.pop_front();
        }
    }

    fn failed(&self, ctx: &WireCtx<'_>, e: ConnError) -> ConnError {
        tracing::debug!(peer = %ctx.peer(), error = %e, "tcp write failed");
        let _ = self.sock.shutdown(Shutdown::Both);
        e
    }
}

impl Wire for TcpWire {
    fn write(&mut self, frames: &mut [Frame], ctx: &WireCtx<'_>) -> Result<(), ConnError> {
        self.write_staged(&[], frames, ctx)
    }

    /// The payloads it would copy into its staging anyway.
    fn stages_up_to(&self) -> usize {
        COPY_MAX
    }

    /// A large frame written alone ends in a short packet (see
    /// [`packet_size`]); several in one backlog share one.
    fn batches_large_frames(&self) -> bool {
        true
    }

    fn write_staged(
        &mut self,
        bytes: &[u8],
        frames: &mut [Frame],
        ctx: &WireCtx<'_>,
    ) -> Result<(), ConnError> {
        if self.sent > 0 && self.sent >= self.staging.len() / 2 {
            // Written bytes at the front of a long backlog: move the rest
            // down rather than let staging grow.
            self.staging.drain(..self.sent);
            self.sent = 0;
        }
        let was_empty = self.pieces.is_empty();
        let res = if was_empty && frames.is_empty() {
            // Staged frames alone: straight from the link's bytes, and
            // only what the socket does not take is copied.
            self.send_or_keep(bytes)
        } else {
            if !bytes.is_empty() {
                self.stage(bytes);
            }
            for f in frames.iter_mut() {
                self.stage(&f.header.encode());
                match f.payload.take() {
                    Some(p) if p.len() > COPY_MAX => self.pieces.push_back(Piece::Payload(p)),
                    Some(p) => self.stage(&p),
                    None => {}
                }
            }
            self.write_out()
        };
        if let Err(e) = res {
            return Err(self.failed(ctx, e));
        }
        if was_empty && !self.pieces.is_empty() {
            // The socket is full: the engine flushes the rest.
            ctx.kick();
        }
        Ok(())
    }

    fn backlog(&self) -> bool {
        !self.pieces.is_empty()
    }

    fn flush(&mut self, ctx: &WireCtx<'_>) -> Result<(), ConnError> {
        self.write_out().map_err(|e| self.failed(ctx, e))
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};

    use zerocast_mem::{Pool, PoolConfig, Wait};

    use super::*;

    #[test]
    fn a_call_with_more_behind_it_writes_whole_packets_only() {
        let (a, b, c) = ([1u8; 300], [2u8; 5000], [3u8; 700]);
        let mut slices: [&[u8]; 3] = [&a, &b, &c];
        // 6000 bytes in packets of 2048: two, and the 1904 past them stay.
        let n = whole_packets(&mut slices, 6000, 2048);
        assert_eq!(n, 2);
        assert_eq!(slices[0].len() + slices[1].len(), 4096);
        assert_eq!(slices[1], &b[..3796]);
        // The cut falls between two slices: the second is left whole.
        let mut slices: [&[u8]; 3] = [&a, &b, &c];
        assert_eq!(whole_packets(&mut slices, 6000, 5300), 2);
        assert_eq!(slices[1].len(), 5000);
        // Less than a packet, or an exact multiple: all of it goes.
        let mut slices: [&[u8]; 3] = [&a, &b, &c];
        assert_eq!(whole_packets(&mut slices, 6000, 8192), 3);
        assert_eq!(whole_packets(&mut slices, 6000, 3000), 3);
        assert_eq!(slices[2].len(), 700);
    }

    #[test]
    fn a_long_backlog_cut_at_packets_arrives_whole_and_in_order() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let sock = Socket::from(TcpStream::connect(listener.local_addr().unwrap()).unwrap());
        sock.set_nodelay(true).unwrap();
        let (mut peer, _) = listener.accept().unwrap();
        let pool = Pool::unregistered(PoolConfig::default()).unwrap();
        let mut wire = TcpWire::new(Arc::new(sock), 64);
        // 300 frames of a 16-byte header and 4 KiB numbered payloads:
        // many calls, each cut inside a payload or a header.
        let mut expected = Vec::new();
        for i in 0..300u32 {
            let header = [i as u8; 16];
            let mut buf = pool.alloc(4096, Wait::No).unwrap();
            buf.spare_capacity()[..4096].fill((i % 251) as u8);
            buf.spare_capacity()[..4].copy_from_slice(&i.to_le_bytes());
            buf.set_len(4096);
            expected.extend_from_slice(&header);
            expected.extend_from_slice(&buf);
            wire.stage(&header);
            wire.pieces.push_back(Piece::Payload(buf));
        }
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            peer.read_to_end(&mut got).unwrap();
            got
        });
        while wire.backlog() {
            wire.write_out().unwrap();
        }
        wire.sock.shutdown(Shutdown::Write).unwrap();
        let got = reader.join().unwrap();
        assert_eq!(got.len(), expected.len());
        assert!(got == expected, "the bytes arrived changed or out of order");
    }
}
