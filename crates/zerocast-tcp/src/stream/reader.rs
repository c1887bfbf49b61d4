//! The reader thread: decode frames from the socket into pool buffers.
//!
//! Small frames are read many at a time into a staging buffer and their
//! payloads copied into pool buffers. The rest of a large payload is read
//! straight into its pool buffer, with a little staging behind it in the
//! same `readv` to pick up the next header.

use std::io::{ErrorKind, IoSliceMut, Read};
use std::net::Shutdown;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::net::{recv, RecvFlags};
use socket2::Socket;
use zerocast_core::{ConnError, FrameKind, Header, HEADER_LEN};
use zerocast_link::{Driver, Pumped, Source, StepAside};
use zerocast_mem::{Buf, Wait};

/// Staging for headers and small frames.
const STAGING: usize = 16 * 1024;
/// Payloads at least this long are read straight into their pool buffer.
const DIRECT: usize = STAGING / 4;
/// Staging read behind a direct payload read.
const TAIL: usize = 4096;

/// Why reading stopped.
enum Stop {
    /// Nothing more has arrived, at a frame boundary.
    Idle,
    /// Clean end of stream at a frame boundary.
    Eof,
    /// The connection failed.
    Failed(ConnError),
}

/// How long a receiving application thread polls the socket before it
/// sleeps on it.
const SPIN: Duration = Duration::from_micros(20);

/// The reader thread: reads whenever no application thread does.
pub(super) fn run(sock: Arc<Socket>, driver: &Driver, frame_timeout: Duration) {
    driver.pool().prepare_thread();
    if let Err(e) = sock.set_read_timeout(Some(frame_timeout)) {
        driver.fail(e.into());
        let _ = sock.shutdown(Shutdown::Both);
        return;
    }
    driver.install_source(Box::new(Reader::new(sock.clone())));
    let mut aside = StepAside::new();
    loop {
        if aside.nap_if_app_reads(driver) {
            continue;
        }
        // Wait for data without holding the source, so an application
        // thread can take over the reading at any time. No timeout: an idle
        // connection costs no wake-ups. Whatever ends the connection
        // makes the socket readable: the peer's goodbye or end of stream,
        // or the shutdown every local failure and close does (see
        // `writer::run` and `ShutdownOnDrop`).
        if !readable(&sock, None) || driver.app_reading() {
            continue;
        }
        match driver.try_pump(None) {
            Some(Pumped::Done) => return,
            Some(_) => {}
            None => aside.nap(),
        }
    }
}

/// Whether `sock` has something to read (data, end of stream or an error)
/// within `wait` (`None`: however long that takes).
fn readable(sock: &Socket, wait: Option<Duration>) -> bool {
    let mut fds = [PollFd::new(sock, PollFlags::IN)];
    let ts = wait.map(|w| Timespec { tv_sec: w.as_secs() as i64, tv_nsec: i64::from(w.subsec_nanos()) });
    matches!(poll(&mut fds, ts.as_ref()), Ok(n) if n > 0)
        || fds[0].revents().intersects(PollFlags::ERR | PollFlags::HUP)
}

/// [`readable`] for a receiving application thread: ask without sleeping
/// (yielding the core in between) for up to [`SPIN`] first. A reply that comes within that time is taken
/// on the same core with no wake-up at all; a wake-up (on a virtual machine
/// often an inter-processor interrupt and a halted vCPU brought back) costs
/// more than the spin.
fn readable_soon(sock: &Socket, wait: Duration) -> bool {
    let start = Instant::now();
    let spin = SPIN.min(wait);
    loop {
        if readable(sock, Some(Duration::ZERO)) {
            return true;
        }
        let spent = start.elapsed();
        if spent >= spin {
            return wait > spent && readable(sock, Some(wait - spent));
        }
        // Stay runnable, but let a thread on this core that would send
        // (the peer, in the same process, say) go first.
        thread::yield_now();
    }
}

/// The socket's read half: staging and the decoder's place in the stream.
pub(super) struct Reader {
    sock: Arc<Socket>,
    staging: Vec<u8>,
    start: usize,
    end: usize,
    done: bool,
    /// The last read returned less than it had room for: the socket was
    /// empty then, so a pump that has handed frames over need not ask again.
    drained: bool,
}

impl Source for Reader {
    fn pump(&mut self, driver: &Driver, until: Option<Instant>) -> Pumped {
        if self.done {
            return Pumped::Done;
        }
        let wait = |sock: &Socket| {
            let left = until.and_then(|u| u.checked_duration_since(Instant::now()));
            matches!(left, Some(left) if !left.is_zero() && readable_soon(sock, left))
        };
        let mut frames = 0usize;
        loop {
            if self.drained && self.start == self.end {
                // The socket was empty at the last read: wait for it
                // rather than ask it again.
                if frames > 0 {
                    return Pumped::Frames;
                }
                if until.is_some() && !wait(&self.sock) {
                    return Pumped::Idle;
                }
                self.drained = false;
            }
            match self.frame(driver) {
                Ok(()) => frames += 1,
                Err(Stop::Idle) if frames > 0 => return Pumped::Frames,
                Err(Stop::Idle) => {
                    if !wait(&self.sock) {
                        return Pumped::Idle;
                    }
                }
                Err(stop) => {
                    self.done = true;
                    match stop {
                        Stop::Failed(e) => {
                            tracing::debug!(peer = %driver.peer(), error = %e, "tcp reader stops");
                            driver.fail(e);
                            let _ = self.sock.shutdown(Shutdown::Both);
                        }
                        _ => driver.on_end(),
                    }
                    return Pumped::Done;
                }
            }
        }
    }
}

impl Reader {
    fn new(sock: Arc<Socket>) -> Self {
        Self { sock, staging: vec![0u8; STAGING], start: 0, end: 0, done: false, drained: false }
    }

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
                let room = len - got + TAIL;
                let n = read_some(&self.sock, &mut iov).map_err(|s| truncated(s, got, len))?;
                self.drained = n < room;
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
            let got = if idle { self.sock_read_now() } else { self.sock_read() };
            match got {
                Ok(0) if idle => return Err(Stop::Eof),
                Ok(0) => {
                    let got = (self.end - self.start) as u64;
                    return Err(Stop::Failed(ConnError::Truncated { got, expected: n as u64 }));
                }
                Ok(k) => {
                    self.drained = k < self.staging.len() - self.end;
                    self.end += k;
                }
                Err(e) if is_timeout(&e) && idle => return Err(Stop::Idle),
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
        let mut s = &*self.sock;
        s.read(&mut self.staging[self.end..])
    }

    /// Read what is there without waiting (`WouldBlock` if nothing is).
    fn sock_read_now(&mut self) -> std::io::Result<usize> {
        let (n, _) = recv(&*self.sock, &mut self.staging[self.end..], RecvFlags::DONTWAIT)?;
        Ok(n)
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
        Stop::Failed(ConnError::Truncated { .. }) | Stop::Eof | Stop::Idle => {
            Stop::Failed(ConnError::Truncated { got: got as u64, expected: len as u64 })
        }
        other => other,
    }
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}
