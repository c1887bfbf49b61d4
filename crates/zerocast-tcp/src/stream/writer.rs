//! The writer thread: gather queued frames into one `writev` per batch.

use std::io::{ErrorKind, IoSlice, Write};
use std::net::Shutdown;

use socket2::Socket;
use zerocast_core::HEADER_LEN;
use zerocast_link::{Driver, Frame};

/// Frames per `writev` call (two iovecs each, well under `IOV_MAX`).
const CHUNK: usize = 64;

pub(super) fn run(sock: &Socket, driver: &Driver, max_batch: usize) {
    let mut batch: Vec<Frame> = Vec::with_capacity(max_batch + 2);
    while driver.next_batch(&mut batch) {
        for chunk in batch.chunks(CHUNK) {
            if let Err(e) = write_chunk(sock, chunk) {
                tracing::debug!(peer = %driver.peer(), error = %e, "tcp writer stops");
                driver.fail(e.into());
                let _ = sock.shutdown(Shutdown::Both);
                return;
            }
        }
        // Written: the payloads go back to the pool.
        batch.clear();
    }
    let _ = sock.shutdown(Shutdown::Write);
}

fn write_chunk(sock: &Socket, frames: &[Frame]) -> std::io::Result<()> {
    let mut headers = [[0u8; HEADER_LEN]; CHUNK];
    for (h, f) in headers.iter_mut().zip(frames) {
        *h = f.header.encode();
    }
    let mut iov = [IoSlice::new(&[]); 2 * CHUNK];
    let mut n = 0;
    for (h, f) in headers.iter().zip(frames) {
        iov[n] = IoSlice::new(h);
        n += 1;
        if let Some(p) = &f.payload {
            if !p.is_empty() {
                iov[n] = IoSlice::new(p);
                n += 1;
            }
        }
    }
    let mut slices = &mut iov[..n];
    let mut w = sock;
    while !slices.is_empty() {
        match w.write_vectored(slices) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(k) => IoSlice::advance_slices(&mut slices, k),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
