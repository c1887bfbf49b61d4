//! The socket's write half: one `writev` per batch of frames, from the
//! writer thread or from a sending thread (see [`zerocast_link::Wire`]).
//!
//! Headers and small payloads are copied into one contiguous staging buffer
//! (a kernel copy of one long slice is far cheaper than of many short ones);
//! payloads above [`COPY_MAX`] go out from their pool buffer, zero-copy.

use std::io::{ErrorKind, IoSlice, Write};
use std::net::Shutdown;
use std::sync::Arc;

use socket2::Socket;
use zerocast_core::{ConnError, HEADER_LEN};
use zerocast_link::{Driver, Frame, Wire, WireCtx};

/// Payloads up to this size are copied into the staging buffer.
const COPY_MAX: usize = 2048;
/// Most bytes staged for one `writev`: a batch of small frames goes out in
/// as few calls as this allows, whatever their number.
const STAGE_MAX: usize = 128 * 1024;
/// Most slices of one `writev` (staged runs and large payloads); far below
/// the kernel's `IOV_MAX` of 1024.
const PIECES: usize = 129;

/// A piece of one `writev`: a range of staging, or a frame's own payload.
#[derive(Clone, Copy)]
enum Piece {
    Staged(usize, usize),
    Payload(usize),
}

pub(super) fn run(sock: Arc<Socket>, driver: &Driver) {
    driver.pool().prepare_thread();
    // With heartbeats, a write the peer does not drain returns four times
    // per interval to run the heartbeat check.
    if let Err(e) = sock.set_write_timeout(driver.heartbeat().map(|hb| hb / 4)) {
        driver.fail(e.into());
    }
    let wire = TcpWire {
        sock: sock.clone(),
        // Sized once for the fullest call, so it never grows while running.
        staging: Vec::with_capacity(STAGE_MAX),
    };
    driver.run_writer(Box::new(wire));
    if driver.error().is_some() {
        // Failed here (a heartbeat timeout) or in the reader: wake the
        // reader too, which may be waiting on a silent peer.
        let _ = sock.shutdown(Shutdown::Both);
    } else {
        let _ = sock.shutdown(Shutdown::Write);
    }
    driver.writer_done();
}

/// The socket's write half, used by the writer thread and by sending threads.
struct TcpWire {
    sock: Arc<Socket>,
    staging: Vec<u8>,
}

impl Wire for TcpWire {
    fn write(&mut self, frames: &mut [Frame], ctx: &WireCtx<'_>) -> Result<(), ConnError> {
        let mut rest = &frames[..];
        while !rest.is_empty() {
            match write_chunk(&self.sock, ctx, rest, &mut self.staging) {
                Ok(taken) => rest = &rest[taken..],
                Err(e) => {
                    tracing::debug!(peer = %ctx.peer(), error = %e, "tcp write failed");
                    let _ = self.sock.shutdown(Shutdown::Both);
                    return Err(e);
                }
            }
        }
        Ok(())
    }
}

/// Write the longest run of `frames` from the front that fits one `writev`
/// (at least one frame); how many frames that was.
fn write_chunk(
    sock: &Socket,
    ctx: &WireCtx<'_>,
    frames: &[Frame],
    staging: &mut Vec<u8>,
) -> Result<usize, ConnError> {
    let mut pieces = [Piece::Staged(0, 0); PIECES];
    let mut n = 0;
    staging.clear();
    let mut run_start = 0;
    let mut taken = 0;
    for (i, f) in frames.iter().enumerate() {
        let len = f.payload.as_ref().map_or(0, |p| p.len());
        let staged = HEADER_LEN + if len > COPY_MAX { 0 } else { len };
        // A frame may close a run and add its payload (two slices), and
        // the last run needs one more.
        if i > 0 && (staging.len() + staged > STAGE_MAX || n + 3 > PIECES) {
            break;
        }
        taken = i + 1;
        staging.extend_from_slice(&f.header.encode());
        match &f.payload {
            Some(p) if p.len() > COPY_MAX => {
                pieces[n] = Piece::Staged(run_start, staging.len());
                pieces[n + 1] = Piece::Payload(i);
                n += 2;
                run_start = staging.len();
            }
            Some(p) => staging.extend_from_slice(p),
            None => {}
        }
    }
    if run_start < staging.len() {
        pieces[n] = Piece::Staged(run_start, staging.len());
        n += 1;
    }
    let mut iov = [IoSlice::new(&[]); PIECES];
    for (slot, piece) in iov.iter_mut().zip(&pieces[..n]) {
        *slot = match *piece {
            Piece::Staged(a, b) => IoSlice::new(&staging[a..b]),
            Piece::Payload(i) => IoSlice::new(frames[i].payload.as_deref().unwrap_or(&[])),
        };
    }
    let mut slices = &mut iov[..n];
    let mut w = sock;
    while !slices.is_empty() {
        match w.write_vectored(slices) {
            Ok(0) => return Err(std::io::Error::from(ErrorKind::WriteZero).into()),
            Ok(k) => IoSlice::advance_slices(&mut slices, k),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                ctx.check_heartbeat()?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(taken)
}
