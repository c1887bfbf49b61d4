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
    /// backlog.
    fn send_pieces(&self, flags: SendFlags) -> rustix::io::Result<usize> {
        let mut iov = [IoSlice::new(&[]); PIECES];
        let mut n = 0;
        let mut at = self.sent;
        for piece in self.pieces.iter().take(PIECES) {
            iov[n] = match piece {
                Piece::Staged(len) => {
                    at += len;
                    IoSlice::new(&self.staging[at - len..at])
                }
                Piece::Payload(buf) if n == 0 => IoSlice::new(&buf[self.payload_sent..]),
                Piece::Payload(buf) => IoSlice::new(buf),
            };
            n += 1;
        }
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
