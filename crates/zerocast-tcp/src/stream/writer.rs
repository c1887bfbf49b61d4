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
    /// Bytes in the backlog not yet written.
    left: usize,
    /// The backlog is a tail kept back on purpose (see
    /// [`WireCtx::may_keep_tail`]), not what a full socket refused.
    kept: bool,
}

/// The size of the packets the kernel builds for `sock` now: the most
/// whole segments that fit in [`GSO_MAX`], and at least one. The segment
/// (`TCP_MAXSEG`) changes as the connection goes: the kernel holds it to
/// half the largest window the peer has offered, so it is asked at each
/// write that may cut its bytes.
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
            left: 0,
            kept: false,
        }
    }

    fn stage(&mut self, bytes: &[u8]) {
        self.left += bytes.len();
        self.staging.extend_from_slice(bytes);
        match self.pieces.back_mut() {
            Some(Piece::Staged(n)) => *n += bytes.len(),
            _ => self.pieces.push_back(Piece::Staged(bytes.len())),
        }
    }

    fn push_payload(&mut self, p: Buf) {
        self.left += p.len();
        self.pieces.push_back(Piece::Payload(p));
    }

    /// Write from the front of the backlog until it is empty or the socket
    /// is full; with `keep_tail`, once a packet or more went out, until
    /// less than a packet is left, which stays, kept back (see
    /// [`WireCtx::may_keep_tail`]). A write shorter than a packet keeps
    /// nothing: it would hand all of it to the engine.
    fn write_out(&mut self, keep_tail: bool) -> Result<(), ConnError> {
        let flags = SendFlags::DONTWAIT | SendFlags::NOSIGNAL;
        self.kept = false;
        // Asked once a call, and only when a cut may come: a tail to keep,
        // or more pieces than one `sendmsg` takes (the count only falls).
        let packet = (!self.pieces.is_empty() && (keep_tail || self.pieces.len() > PIECES))
            .then(|| packet_size(&self.sock));
        let tail = if keep_tail { packet.unwrap_or(0) } else { 0 };
        let keep_tail = keep_tail && self.left >= tail;
        while let Some(front) = self.pieces.front() {
            if keep_tail && self.left < tail {
                self.kept = true;
                return Ok(());
            }
            let written = match front {
                // One run of staged bytes (small frames only): a plain
                // send, with no vector to build.
                Piece::Staged(len) if self.pieces.len() == 1 && !keep_tail => {
                    send(&*self.sock, &self.staging[self.sent..self.sent + len], flags)
                }
                _ => self.send_pieces(flags, keep_tail, packet),
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
    /// backlog; with more of it behind them, or with `keep_tail`, of whole
    /// `packet`s only (see [`packet_size`], asked whenever either may
    /// come): the bytes past the last whole one lead the next.
    fn send_pieces(
        &self,
        flags: SendFlags,
        keep_tail: bool,
        packet: Option<usize>,
    ) -> rustix::io::Result<usize> {
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
        if let Some(packet) = packet.filter(|_| self.pieces.len() > n || keep_tail) {
            n = whole_packets(&mut slices[..n], total, packet);
        }
        let iov: [IoSlice<'_>; PIECES] = slices.map(IoSlice::new);
        sendmsg(&*self.sock, &iov[..n], &mut SendAncillaryBuffer::default(), flags)
    }

    /// `k` bytes from the front of the backlog were written.
    fn advance(&mut self, mut k: usize) {
        self.left -= k;
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
                    Some(p) if p.len() > COPY_MAX => self.push_payload(p),
                    Some(p) => self.stage(&p),
                    None => {}
                }
            }
            self.write_out(ctx.may_keep_tail())
        };
        if let Err(e) = res {
            return Err(self.failed(ctx, e));
        }
        if self.kept || (was_empty && !self.pieces.is_empty()) {
            // The socket is full, or a tail is kept back: the engine
            // writes the rest.
            ctx.kick();
        }
        Ok(())
    }

    fn backlog(&self) -> bool {
        !self.pieces.is_empty() && !self.kept
    }

    /// A tail kept back stays for the frames the writer sends next, or for
    /// [`Wire::flush_tail`].
    fn flush(&mut self, ctx: &WireCtx<'_>) -> Result<(), ConnError> {
        if self.kept {
            return Ok(());
        }
        self.write_out(false).map_err(|e| self.failed(ctx, e))
    }

    fn flush_tail(&mut self, ctx: &WireCtx<'_>) -> Result<(), ConnError> {
        if !self.kept {
            return Ok(());
        }
        self.write_out(false).map_err(|e| self.failed(ctx, e))
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
    fn a_kept_tail_is_short_of_a_packet_and_goes_out_only_when_flushed() {
        let (mut wire, reader, expected) = backlogged(100);
        while wire.backlog() {
            wire.write_out(true).unwrap();
        }
        // All but a tail short of a packet went out; the tail is no backlog.
        assert!(wire.left < packet_size(&wire.sock), "kept {} bytes", wire.left);
        assert_eq!(wire.kept, wire.left > 0);
        assert!(!wire.backlog());
        wire.write_out(false).unwrap();
        assert!(!wire.kept && wire.left == 0 && wire.pieces.is_empty());
        wire.sock.shutdown(Shutdown::Write).unwrap();
        assert!(reader.join().unwrap() == expected, "the bytes arrived changed or out of order");
    }

    /// A wire on a loopback connection with `n` frames in its backlog, a
    /// thread reading the other end to its end of stream, and the bytes
    /// it should read.
    fn backlogged(n: u32) -> (TcpWire, std::thread::JoinHandle<Vec<u8>>, Vec<u8>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let sock = Socket::from(TcpStream::connect(listener.local_addr().unwrap()).unwrap());
        sock.set_nodelay(true).unwrap();
        let (peer, _) = listener.accept().unwrap();
        let mut wire = TcpWire::new(Arc::new(sock), 64);
        let pool = Pool::unregistered(PoolConfig::default()).unwrap();
        let expected = (0..n).flat_map(|i| frame(&mut wire, &pool, i)).collect();
        (wire, drain(peer), expected)
    }

    /// Put frame `i` (a 16-byte header, a numbered 4 KiB payload) in the
    /// backlog; its bytes.
    fn frame(wire: &mut TcpWire, pool: &Pool, i: u32) -> Vec<u8> {
        let header = [i as u8; 16];
        let mut buf = pool.alloc(4096, Wait::No).unwrap();
        buf.spare_capacity()[..4096].fill((i % 251) as u8);
        buf.spare_capacity()[..4].copy_from_slice(&i.to_le_bytes());
        buf.set_len(4096);
        let bytes = [&header[..], &buf[..]].concat();
        wire.stage(&header);
        wire.push_payload(buf);
        bytes
    }

    /// Everything `peer` reads until the end of the stream.
    fn drain(mut peer: TcpStream) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut got = Vec::new();
            peer.read_to_end(&mut got).unwrap();
            got
        })
    }

    #[test]
    fn a_long_backlog_cut_at_packets_arrives_whole_and_in_order() {
        // 300 frames: many calls, each cut inside a payload or a header.
        let (mut wire, reader, expected) = backlogged(300);
        while wire.backlog() {
            wire.write_out(false).unwrap();
        }
        wire.sock.shutdown(Shutdown::Write).unwrap();
        let got = reader.join().unwrap();
        assert_eq!(got.len(), expected.len());
        assert!(got == expected, "the bytes arrived changed or out of order");
    }
}
