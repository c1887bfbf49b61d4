//! The reader thread: decode frames from the socket into pool buffers.
//!
//! Small frames are read many at a time into a staging buffer and their
//! payloads copied into pool buffers. The rest of a large payload is read
//! straight into its pool buffer, with a little staging behind it in the
//! same `readv` to pick up the next header.

use std::io::{ErrorKind, IoSliceMut, Read};
use std::net::Shutdown;
use std::time::Duration;

use socket2::Socket;
use zerocast_core::{ConnError, FrameKind, Header, HEADER_LEN};
use zerocast_link::Driver;
use zerocast_mem::{Buf, Wait};

/// Staging for headers and small frames.
const STAGING: usize = 16 * 1024;
/// Payloads at least this long are read straight into their pool buffer.
const DIRECT: usize = STAGING / 4;
/// Staging read behind a direct payload read.
const TAIL: usize = 4096;

/// Why reading stopped.
enum Stop {
    /// Clean end of stream at a frame boundary.
    Eof,
    /// The connection failed.
    Failed(ConnError),
}

pub(super) fn run(sock: &Socket, driver: &Driver, frame_timeout: Duration) {
    let mut r = Reader { sock, staging: vec![0u8; STAGING], start: 0, end: 0 };
    if let Err(e) = sock.set_read_timeout(Some(frame_timeout)) {
        driver.fail(e.into());
        return;
    }
    let stop = loop {
        match r.frame(driver) {
            Ok(()) => {}
            Err(s) => break s,
        }
    };
    match stop {
        Stop::Eof => driver.on_end(),
        Stop::Failed(e) => {
            tracing::debug!(peer = %driver.peer(), error = %e, "tcp reader stops");
            driver.fail(e);
            let _ = sock.shutdown(Shutdown::Both);
        }
    }
}

struct Reader<'a> {
    sock: &'a Socket,
    staging: Vec<u8>,
    start: usize,
    end: usize,
}

impl Reader<'_> {
    fn frame(&mut self, driver: &Driver) -> Result<(), Stop> {
        self.fill(HEADER_LEN, true)?;
        let header = Header::decode(&self.staging[self.start..self.end], driver.max_payload())
            .map_err(|e| Stop::Failed(e.into()))?;
        self.start += HEADER_LEN;
        let payload = match header.kind {
            FrameKind::Data => Some(self.payload(driver, &header)?),
            _ if header.len == 0 => None,
            _ => return Err(Stop::Failed(ConnError::Unsupported("control frame with a payload"))),
        };
        driver.on_frame(header, payload).map_err(Stop::Failed)
    }

    fn payload(&mut self, driver: &Driver, header: &Header) -> Result<Buf, Stop> {
        let len = header.len as usize;
        let mut buf = driver
            .pool()
            .alloc(len, Wait::For(Duration::from_secs(30)))
            .map_err(|e| Stop::Failed(ConnError::transport(e)))?;
        let staged = (self.end - self.start).min(len);
        buf[..staged].copy_from_slice(&self.staging[self.start..self.start + staged]);
        self.start += staged;
        let mut got = staged;
        while got < len {
            if len < DIRECT {
                // Small frame: go through staging to pick up what follows too.
                let want = len - got;
                self.fill(want, false).map_err(|s| truncated(s, got, len))?;
                buf[got..len].copy_from_slice(&self.staging[self.start..self.start + want]);
                self.start += want;
                got = len;
            } else {
                // Staging is drained (the payload outlasted it): read the
                // payload in place and the start of what follows behind it.
                self.start = 0;
                self.end = 0;
                let mut iov =
                    [IoSliceMut::new(&mut buf[got..len]), IoSliceMut::new(&mut self.staging[..TAIL])];
                let n = read_some(self.sock, &mut iov).map_err(|s| truncated(s, got, len))?;
                driver.on_activity();
                let direct = n.min(len - got);
                got += direct;
                self.end = n - direct;
            }
        }
        Ok(buf)
    }

    /// Make at least `n` bytes available in staging. `at_boundary`: a clean
    /// end of stream (or an idle timeout) before any byte is not an error.
    fn fill(&mut self, n: usize, at_boundary: bool) -> Result<(), Stop> {
        if self.end - self.start >= n {
            return Ok(());
        }
        if self.start + n > self.staging.len() {
            self.staging.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        while self.end - self.start < n {
            let idle = at_boundary && self.end == self.start;
            match self.sock_read() {
                Ok(0) if idle => return Err(Stop::Eof),
                Ok(0) => {
                    let got = (self.end - self.start) as u64;
                    return Err(Stop::Failed(ConnError::Truncated { got, expected: n as u64 }));
                }
                Ok(k) => self.end += k,
                Err(e) if is_timeout(&e) && idle => continue,
                Err(e) if is_timeout(&e) => {
                    return Err(Stop::Failed(ConnError::TimedOut("peer stopped in the middle of a frame")))
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(Stop::Failed(e.into())),
            }
        }
        Ok(())
    }

    fn sock_read(&mut self) -> std::io::Result<usize> {
        let mut s = self.sock;
        s.read(&mut self.staging[self.end..])
    }
}

fn read_some(sock: &Socket, iov: &mut [IoSliceMut<'_>]) -> Result<usize, Stop> {
    let mut s = sock;
    loop {
        match s.read_vectored(iov) {
            Ok(0) => return Err(Stop::Failed(ConnError::Truncated { got: 0, expected: 1 })),
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if is_timeout(&e) => {
                return Err(Stop::Failed(ConnError::TimedOut("peer stopped in the middle of a frame")))
            }
            Err(e) => return Err(Stop::Failed(e.into())),
        }
    }
}

/// Report a truncation with the frame's real progress.
fn truncated(s: Stop, got: usize, len: usize) -> Stop {
    match s {
        Stop::Failed(ConnError::Truncated { .. }) | Stop::Eof => {
            Stop::Failed(ConnError::Truncated { got: got as u64, expected: len as u64 })
        }
        other => other,
    }
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}
