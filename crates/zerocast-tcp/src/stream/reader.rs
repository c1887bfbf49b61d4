//! The socket's read half: decode frames from the socket into pool buffers.
//!
//! Frames that fit in staging are read many at a time into it (see
//! [`super::staging`]): their payloads are copied into pool buffers at
//! first, and lent where they lie once the peer streams. The rest of a
//! larger payload is read straight into its pool buffer, with a little
//! staging behind it in the same `readv` to pick up the next header.

use std::io::IoSliceMut;
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::net::{recv, recvmsg, RecvAncillaryBuffer, RecvFlags};
use socket2::Socket;
use zerocast_core::{ConnError, FrameKind, Header, HEADER_LEN};
use zerocast_link::{Driver, Interrupt, Pumped, Source};
use zerocast_mem::{Buf, PoolError, Wait};

use super::staging::{Staging, STAGING, STAGING_MAX};

/// Payloads at least this long are read straight into their pool buffer:
/// those that do not fit in staging. A shorter one is read through staging
/// with the frames behind it, then lent where it lies (once staging is a
/// pool chunk) or copied. Read straight, a payload of a few KiB would cost
/// a system call per frame, and the staging tail of that read brings most
/// of the next payload anyway.
const DIRECT: usize = STAGING;
/// Staging read behind a direct payload read.
const TAIL: usize = 4096;

/// Why reading stopped.
enum Stop {
    /// Nothing more has arrived now: at a frame boundary, or part-way
    /// through a frame (see [`Reader::mid_frame`]), which stays partial.
    Idle,
    /// A data frame's payload has no pool buffer yet: the pool is at its cap.
    Starved,
    /// Clean end of stream at a frame boundary.
    Eof,
    /// The connection failed.
    Failed(ConnError),
}

/// How long a receiving application thread polls the socket before it
/// sleeps on it.
const SPIN: Duration = Duration::from_micros(20);
/// How long a frame's payload may wait for a pool buffer before the
/// connection fails.
const POOL_PATIENCE: Duration = Duration::from_secs(30);

/// What the [`Reader`] (on whichever thread pumps it) tells the
/// connection's engine task beside the socket's readiness.
#[derive(Debug, Default)]
pub(super) struct Attention {
    /// When the engine must pump again though the socket has nothing new:
    /// a stalled frame's deadline, or the end of the wait for a pool
    /// buffer. Nanoseconds since [`epoch`]; 0 for never.
    due: AtomicU64,
    /// A payload waits for a pool buffer: the pool wakes the task (through
    /// `waker`) when one comes back, and the task pumps then.
    starved: AtomicBool,
    /// The engine task's wake, for the pool.
    waker: OnceLock<std::task::Waker>,
    /// The engine's epoll just said the socket is readable: the next pump
    /// reads at once instead of asking poll(2) first.
    readable: AtomicBool,
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl Attention {
    fn set(&self, at: Option<Instant>) {
        let nanos = at.map_or(0, |t| t.saturating_duration_since(epoch()).as_nanos().max(1) as u64);
        self.due.store(nanos, Ordering::Relaxed);
    }

    pub(super) fn get(&self) -> Option<Instant> {
        match self.due.load(Ordering::Relaxed) {
            0 => None,
            n => Some(epoch() + Duration::from_nanos(n)),
        }
    }

    /// Whether a payload waits for a pool buffer.
    pub(super) fn starved(&self) -> bool {
        self.starved.load(Ordering::Relaxed)
    }

    /// The engine saw the socket readable; its pump follows.
    pub(super) fn readable(&self) {
        self.readable.store(true, Ordering::Relaxed);
    }

    fn take_readable(&self) -> bool {
        self.readable.load(Ordering::Relaxed) && self.readable.swap(false, Ordering::Relaxed)
    }

    /// The engine task's wake (set once, at its first run).
    pub(super) fn set_waker(&self, waker: std::task::Waker) {
        let _ = self.waker.set(waker);
    }
}

/// Whether `sock` has something to read (data, end of stream or an error)
/// within `wait` (`None`: however long that takes). With `interrupt`, the
/// wait also ends when it rings (a local close while this thread waits for
/// credit): the ring is reset, and the answer is still the socket's.
fn readable(sock: &Socket, wait: Option<Duration>, interrupt: Option<&Interrupt>) -> bool {
    let mut fds = [PollFd::new(sock, PollFlags::IN), PollFd::new(sock, PollFlags::IN)];
    let n = match interrupt {
        Some(intr) => {
            fds[1] = PollFd::from_borrowed_fd(intr.fd(), PollFlags::IN);
            2
        }
        None => 1,
    };
    let ts = wait.map(|w| Timespec { tv_sec: w.as_secs() as i64, tv_nsec: i64::from(w.subsec_nanos()) });
    if !matches!(poll(&mut fds[..n], ts.as_ref()), Ok(k) if k > 0) {
        return false;
    }
    if let Some(intr) = interrupt.filter(|_| !fds[1].revents().is_empty()) {
        intr.clear();
    }
    !fds[0].revents().is_empty()
}

/// [`readable`] for a receiving application thread: ask without sleeping
/// (yielding the core in between) for up to [`SPIN`] first. A reply that comes within that time is taken
/// on the same core with no wake-up at all; a wake-up (on a virtual machine
/// often an inter-processor interrupt and a halted vCPU brought back) costs
/// more than the spin.
fn readable_soon(sock: &Socket, wait: Duration, interrupt: Option<&Interrupt>) -> bool {
    // At most one spinning thread per core but one: a thousand receiving
    // threads that all spin fill the run queue and starve the threads
    // that would answer them.
    let _spinning = match Spinner::enter() {
        Some(s) => s,
        None => return readable(sock, Some(wait), interrupt),
    };
    let start = Instant::now();
    let spin = SPIN.min(wait);
    loop {
        if readable(sock, Some(Duration::ZERO), None) {
            return true;
        }
        let spent = start.elapsed();
        if spent >= spin {
            return wait > spent && readable(sock, Some(wait - spent), interrupt);
        }
        // Stay runnable, but let a thread on this core that would send
        // (the peer, in the same process, say) go first.
        thread::yield_now();
    }
}

/// A receiving thread spinning in [`readable_soon`], counted process-wide.
struct Spinner;

static SPINNERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl Spinner {
    fn enter() -> Option<Spinner> {
        static MAX: OnceLock<usize> = OnceLock::new();
        let max = *MAX
            .get_or_init(|| thread::available_parallelism().map_or(1, |n| n.get().saturating_sub(1).max(1)));
        if SPINNERS.fetch_add(1, Ordering::Relaxed) < max {
            Some(Spinner)
        } else {
            SPINNERS.fetch_sub(1, Ordering::Relaxed);
            None
        }
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        SPINNERS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A data frame whose header is read and whose payload is not yet whole.
struct Pending {
    header: Header,
    /// `None` until the pool gives a buffer for the payload.
    buf: Option<Buf>,
    /// Payload bytes in `buf` so far.
    got: usize,
}

/// The socket's read half: staging and the decoder's place in the stream.
///
/// Every read asks the socket without waiting (`MSG_DONTWAIT`): a frame
/// that has not wholly arrived stays partial here (its header bytes in
/// staging, or its payload in `pending`) and the pump returns, so a
/// `try_recv` never waits and a `recv_timeout` keeps its deadline. A frame
/// that makes no progress for `frame_timeout` fails the connection.
pub(super) struct Reader {
    sock: Arc<Socket>,
    staging: Staging,
    start: usize,
    end: usize,
    done: bool,
    /// The last read returned less than it had room for: the socket was
    /// empty then, so a pump that has handed frames over need not ask again.
    drained: bool,
    pending: Option<Pending>,
    /// Bytes of the data frames the current pump has handed over.
    pump_bytes: usize,
    /// When a frame in progress first found nothing more to read (reset by
    /// every byte that arrives).
    stalled_since: Option<Instant>,
    /// When `pending` started waiting for a pool buffer.
    starved_since: Option<Instant>,
    frame_timeout: Duration,
    attention: Arc<Attention>,
}

impl Source for Reader {
    fn pump(&mut self, driver: &Driver, until: Option<Instant>) -> Pumped {
        if self.done {
            return Pumped::Done;
        }
        let mut frames = 0usize;
        self.pump_bytes = 0;
        loop {
            if self.drained && self.start == self.end && !self.starved() {
                // The socket was empty at the last read: wait for it
                // rather than ask it again.
                if frames > 0 {
                    return Pumped::Frames;
                }
                // Without a deadline (a `try_recv`, or a `try_send` short
                // of credit, often in a loop), ask whether anything came
                // with poll(2) rather than a read: poll does not take the
                // socket's lock, which the peer's arriving segments need
                // (spinning on reads slows the stream it waits for). It
                // costs a round trip one system call when something came.
                let ready = match until {
                    None if self.attention.take_readable() => true,
                    Some(_) => {
                        self.note_stall();
                        self.wait(driver, until)
                    }
                    None => readable(&self.sock, Some(Duration::ZERO), None),
                };
                if !ready {
                    return self.idle(driver);
                }
                self.drained = false;
            }
            let before = frames;
            match self.whole_frames(driver, &mut frames) {
                Ok(true) => return Pumped::Frames,
                Ok(false) if frames > before => continue,
                Ok(false) => {}
                Err(stop) => return self.stop(driver, stop),
            }
            // Once frames are out, wait for nothing more, a pool buffer
            // included: the buffers it would wait for may be the very
            // messages this pump just queued, which its caller must take.
            match self.frame(driver, if frames > 0 { None } else { until }) {
                Ok(()) => {
                    frames += 1;
                    // A receiving thread's pump stops at a batch (the
                    // rest waits, staged or on the socket, for its next
                    // pump): a ring of frames, or 64 KiB of them.
                    if self.batch_over(driver, frames) {
                        return Pumped::Frames;
                    }
                }
                Err(Stop::Idle | Stop::Starved) if frames > 0 => return self.idle_after(Pumped::Frames),
                Err(Stop::Idle) => {
                    self.note_stall();
                    if !self.wait(driver, until) {
                        return self.idle(driver);
                    }
                }
                Err(Stop::Starved) => {
                    // `frame` waited for a buffer as long as `until` allows.
                    if until.is_none_or(|u| Instant::now() >= u) {
                        return self.idle(driver);
                    }
                }
                Err(stop) => return self.stop(driver, stop),
            }
        }
    }

    fn readable(&mut self) {
        self.attention.readable();
        // Whatever the last read left, the socket has more now: a pump
        // that ends on staged frames reads it too (its readiness was
        // taken, so nothing would announce it again).
        self.drained = false;
    }
}

impl Reader {
    pub(super) fn new(sock: Arc<Socket>, frame_timeout: Duration, attention: Arc<Attention>) -> Self {
        Self {
            sock,
            staging: Staging::new(),
            start: 0,
            end: 0,
            done: false,
            drained: false,
            pending: None,
            pump_bytes: 0,
            stalled_since: None,
            starved_since: None,
            frame_timeout,
            attention,
        }
    }

    /// Part-way through a frame: some of its header in staging, or its
    /// header read and its payload not whole.
    fn mid_frame(&self) -> bool {
        self.pending.is_some() || self.end > self.start
    }

    fn starved(&self) -> bool {
        self.pending.as_ref().is_some_and(|p| p.buf.is_none())
    }

    /// When a stalled frame fails.
    fn stall_deadline(&self) -> Option<Instant> {
        self.stalled_since.map(|t| t + self.frame_timeout)
    }

    /// Wait until the socket is readable, `until` passes or a stalled
    /// frame's deadline comes, whichever is first; whether it is readable.
    fn wait(&self, driver: &Driver, until: Option<Instant>) -> bool {
        let Some(until) = until else { return false };
        let limit = self.stall_deadline().map_or(until, |d| d.min(until));
        let left = limit.checked_duration_since(Instant::now());
        matches!(left, Some(left) if !left.is_zero() && readable_soon(&self.sock, left, driver.interrupt().as_ref()))
    }

    /// A frame is part-way and the socket has nothing more: start its
    /// stall clock, if not running (a payload waiting for a pool buffer is
    /// not the peer's stall).
    fn note_stall(&mut self) {
        if self.stalled_since.is_none() && self.mid_frame() && !self.starved() {
            self.stalled_since = Some(Instant::now());
        }
    }

    /// Nothing more now. A frame left part-way is timed: past its deadline
    /// the connection fails; before it, the engine is told when to
    /// look again.
    fn idle(&mut self, driver: &Driver) -> Pumped {
        self.note_stall();
        if let Some(since) = self.stalled_since {
            if since.elapsed() >= self.frame_timeout {
                let e = ConnError::TimedOut("peer stopped in the middle of a frame");
                return self.stop(driver, Stop::Failed(e));
            }
        }
        self.idle_after(Pumped::Idle)
    }

    /// Return `pumped`, telling the engine when to pump again if a
    /// frame is part-way.
    fn idle_after(&mut self, pumped: Pumped) -> Pumped {
        let starved = self.starved();
        self.attention.starved.store(starved, Ordering::Relaxed);
        let due = if starved {
            // The pool wakes the engine when a buffer comes back; this is
            // when the wait fails.
            self.starved_since.map(|t| t + POOL_PATIENCE)
        } else if self.mid_frame() {
            Some(self.stall_deadline().unwrap_or_else(|| Instant::now() + self.frame_timeout))
        } else {
            self.stalled_since = None;
            None
        };
        self.attention.set(due);
        pumped
    }

    fn stop(&mut self, driver: &Driver, stop: Stop) -> Pumped {
        self.done = true;
        self.staging.release();
        self.attention.set(None);
        self.attention.starved.store(false, Ordering::Relaxed);
        match stop {
            Stop::Failed(e) => {
                tracing::debug!(peer = %driver.peer(), error = %e, "tcp reader stops");
                driver.fail(e);
                let _ = self.sock.shutdown(Shutdown::Both);
            }
            _ => driver.on_end(),
        }
        Pumped::Done
    }

    /// Read bytes arrived: the frame in progress is not stalled.
    fn progressed(&mut self) {
        self.stalled_since = None;
    }

    fn frame(&mut self, driver: &Driver, until: Option<Instant>) -> Result<(), Stop> {
        if self.pending.is_none() {
            let at_boundary = self.end == self.start;
            self.fill(driver, HEADER_LEN, at_boundary)?;
            let header = Header::decode(self.staging.get(self.start..self.end), driver.max_payload())
                .map_err(|e| Stop::Failed(e.into()))?;
            self.start += HEADER_LEN;
            return match header.kind {
                // Straight on, not through `self.pending`: a frame that is
                // already whole in staging (most small ones) is never
                // stored there, only a partial one is.
                FrameKind::Data => match self.whole(driver, &header) {
                    Some(buf) => {
                        self.pump_bytes += HEADER_LEN + buf.len();
                        driver.on_frame(header, Some(buf)).map_err(Stop::Failed)
                    }
                    None => self.finish(driver, until, Pending { header, buf: None, got: 0 }),
                },
                FrameKind::Control if header.len == 0 => {
                    // The peer's goodbye: no data follows, so staging lets
                    // go of its chunks while the connection lingers (unless
                    // bytes follow it, which the link refuses).
                    if self.start == self.end {
                        self.staging.release();
                    }
                    driver.on_frame(header, None).map_err(Stop::Failed)
                }
                _ if header.len == 0 => driver.on_frame(header, None).map_err(Stop::Failed),
                _ => Err(Stop::Failed(ConnError::Unsupported("control frame with a payload"))),
            };
        }
        let Some(p) = self.pending.take() else { return Err(Stop::Idle) };
        self.finish(driver, until, p)
    }

    /// Every data frame already whole in staging, up to the end of the
    /// pump's batch, handed over under one lock of the connection's state
    /// ([`zerocast_link::FrameBatch`]); `frames` counts them. `Ok(true)`
    /// when the batch is done. It stops, with the lock let go, at a frame
    /// that is not whole, is not data, or has no pool buffer now: the
    /// general path ([`Reader::frame`]) takes that one.
    #[inline(always)]
    fn whole_frames(&mut self, driver: &Driver, frames: &mut usize) -> Result<bool, Stop> {
        if self.pending.is_some() {
            return Ok(false);
        }
        let mut batch = driver.batch();
        while self.end - self.start >= HEADER_LEN {
            let at = self.start;
            let header = Header::decode(self.staging.get(at..at + HEADER_LEN), driver.max_payload())
                .map_err(|e| Stop::Failed(e.into()))?;
            let len = header.len as usize;
            if header.kind != FrameKind::Data {
                break;
            }
            self.start = at + HEADER_LEN;
            let Some(buf) = self.whole(driver, &header) else {
                // Left for the general path, header and all.
                self.start = at;
                break;
            };
            self.pump_bytes += HEADER_LEN + len;
            batch.on_data(header, buf).map_err(Stop::Failed)?;
            *frames += 1;
            if self.batch_over(driver, *frames) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Whether a pump that has handed over `frames` frames returns now (see
    /// [`Reader::pump`]): at the end of a receiving thread's batch.
    #[inline(always)]
    fn batch_over(&self, driver: &Driver, frames: usize) -> bool {
        driver.batch_done(frames, self.pump_bytes)
    }

    /// The payload of `header`'s data frame, if all of it is in staging and
    /// staging can hand it over now (lent where it lies, or copied into a
    /// pool buffer the pool has now). Most small frames take this path,
    /// which keeps the buffer out of `Pending`; `None` (more to read, or
    /// the pool at its cap) takes the general one.
    #[inline(always)]
    fn whole(&mut self, driver: &Driver, header: &Header) -> Option<Buf> {
        let len = header.len as usize;
        if self.end - self.start < len {
            return None;
        }
        // No frame waits for a buffer (only a pending one does).
        debug_assert!(self.starved_since.is_none());
        let buf = self.staging.take(self.start..self.start + len, driver.pool())?;
        self.start += len;
        Some(buf)
    }

    /// Read the rest of `p`'s payload and hand the frame over once whole;
    /// a frame still partial waits in `self.pending`.
    #[inline(always)]
    fn finish(&mut self, driver: &Driver, until: Option<Instant>, mut p: Pending) -> Result<(), Stop> {
        match self.payload(driver, until, &mut p) {
            Ok(()) => {
                self.pump_bytes += HEADER_LEN + p.header.len as usize;
                driver.on_frame(p.header, p.buf).map_err(Stop::Failed)
            }
            Err(stop @ (Stop::Idle | Stop::Starved)) => {
                self.pending = Some(p);
                Err(stop)
            }
            Err(stop) => Err(stop),
        }
    }

    /// Read as much of `p`'s payload as is there; `Ok` once it is whole.
    fn payload(&mut self, driver: &Driver, until: Option<Instant>, p: &mut Pending) -> Result<(), Stop> {
        let len = p.header.len as usize;
        if p.buf.is_none() {
            // Wait for a buffer only as long as the caller may; a caller
            // that may not (the engine) is woken by the pool instead.
            let got = match (until, self.attention.waker.get()) {
                (Some(u), _) => {
                    driver.pool().alloc(len, Wait::For(u.saturating_duration_since(Instant::now())))
                }
                (None, Some(waker)) => driver.pool().alloc_or_wake(len, waker),
                (None, None) => driver.pool().alloc(len, Wait::No),
            };
            match got {
                Ok(b) => {
                    p.buf = Some(b);
                    self.starved_since = None;
                    self.attention.starved.store(false, Ordering::Relaxed);
                }
                Err(e @ (PoolError::Exhausted { .. } | PoolError::Timeout { .. })) => {
                    let since = *self.starved_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= POOL_PATIENCE {
                        return Err(Stop::Failed(ConnError::transport(e)));
                    }
                    return Err(Stop::Starved);
                }
                Err(e) => return Err(Stop::Failed(ConnError::transport(e))),
            }
        }
        let Some(buf) = p.buf.as_mut() else { return Err(Stop::Starved) };
        let staged = (self.end - self.start).min(len - p.got);
        buf[p.got..p.got + staged].copy_from_slice(self.staging.get(self.start..self.start + staged));
        self.start += staged;
        p.got += staged;
        while p.got < len {
            if len < DIRECT {
                // Small frame: go through staging to pick up what follows too.
                let want = len - p.got;
                self.fill(driver, want, false).map_err(|s| truncated(s, p.got, len))?;
                buf[p.got..len].copy_from_slice(self.staging.get(self.start..self.start + want));
                self.start += want;
                p.got = len;
            } else {
                // Staging is drained (the payload outlasted it): read the
                // payload in place and the start of what follows behind it.
                debug_assert_eq!(self.start, self.end);
                if self.end + TAIL > self.staging.len() {
                    self.staging.rebase(self.start, self.end, driver.pool());
                    self.start = 0;
                    self.end = 0;
                }
                let tail = self.staging.get_mut(self.end..self.end + TAIL);
                let mut iov = [IoSliceMut::new(&mut buf[p.got..len]), IoSliceMut::new(tail)];
                let room = len - p.got + TAIL;
                let n = read_now(&self.sock, &mut iov).map_err(|s| truncated(s, p.got, len))?;
                self.progressed();
                self.drained = n < room;
                driver.on_activity();
                let direct = n.min(len - p.got);
                p.got += direct;
                self.end += n - direct;
            }
        }
        Ok(())
    }

    /// Make at least `n` bytes available in staging, from what the socket
    /// has now. `at_boundary`: a clean end of stream before any byte is
    /// not an error. Short of `n`, what arrived stays staged and this is
    /// [`Stop::Idle`].
    fn fill(&mut self, driver: &Driver, n: usize, at_boundary: bool) -> Result<(), Stop> {
        if self.end - self.start >= n {
            return Ok(());
        }
        if self.start == self.end && self.start > 0 && self.staging.restart() {
            // Nothing staged: read into the start of the area, which is
            // likelier in cache.
            self.start = 0;
            self.end = 0;
        }
        if self.start + n > self.staging.len() {
            self.staging.rebase(self.start, self.end, driver.pool());
            self.end -= self.start;
            self.start = 0;
        }
        while self.end - self.start < n {
            let room = self.staging.len();
            match recv(&*self.sock, self.staging.get_mut(self.end..room), RecvFlags::DONTWAIT) {
                Ok((0, _)) if at_boundary && self.end == self.start => return Err(Stop::Eof),
                Ok((0, _)) => {
                    let got = (self.end - self.start) as u64;
                    return Err(Stop::Failed(ConnError::Truncated { got, expected: n as u64 }));
                }
                Ok((k, _)) => {
                    self.progressed();
                    self.drained = k < room - self.end;
                    self.end += k;
                    if !self.drained && room < STAGING_MAX && k >= STAGING / 2 {
                        // Once per connection at most: a read of half the
                        // first area or more filled it.
                        let start = self.staging.grow(self.start, self.end, driver.pool());
                        self.end -= self.start - start;
                        self.start = start;
                    }
                }
                Err(e) if e == Errno::AGAIN => return Err(Stop::Idle),
                Err(e) if e == Errno::INTR => continue,
                Err(e) => return Err(Stop::Failed(std::io::Error::from(e).into())),
            }
        }
        Ok(())
    }
}

/// Read what the socket has now into `iov`, without waiting.
fn read_now(sock: &Socket, iov: &mut [IoSliceMut<'_>]) -> Result<usize, Stop> {
    let mut control = RecvAncillaryBuffer::new(&mut []);
    loop {
        match recvmsg(sock, iov, &mut control, RecvFlags::DONTWAIT) {
            Ok(m) if m.bytes == 0 => return Err(Stop::Failed(ConnError::Truncated { got: 0, expected: 1 })),
            Ok(m) => return Ok(m.bytes),
            Err(e) if e == Errno::AGAIN => return Err(Stop::Idle),
            Err(e) if e == Errno::INTR => continue,
            Err(e) => return Err(Stop::Failed(std::io::Error::from(e).into())),
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
