//! The signal that a connection or listener is closing, for the threads
//! that sleep on its descriptors.
//!
//! A receiving thread sleeps on its connection's completion channel, an
//! accepting thread on its listener's event channel or socket. None of
//! them wakes on a timer to look around. The one thing that reaches them
//! otherwise is a close, and this is how: an `eventfd` that their waits
//! include ([`poll_either`]). It stays readable once rung.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

/// Rung once, when the connection starts closing; ready for ever after.
#[derive(Debug)]
pub(crate) struct Closing {
    fd: OwnedFd,
    rung: AtomicBool,
}

impl Closing {
    pub(crate) fn new() -> io::Result<Self> {
        Ok(Self { fd: eventfd()?, rung: AtomicBool::new(false) })
    }

    /// Wake every thread waiting on this signal, now and later.
    pub(crate) fn ring(&self) {
        if !self.rung.swap(true, Ordering::AcqRel) {
            signal(self.fd.as_raw_fd());
        }
    }

    /// Wake the threads waiting on this signal without closing: the wait
    /// that finds it readable clears it ([`Closing::clear_poke`]) and looks
    /// around (a pool buffer came back, say).
    pub(crate) fn poke(&self) {
        if !self.is_rung() {
            signal(self.fd.as_raw_fd());
        }
    }

    /// After a wait found the signal readable: make it unreadable again,
    /// unless it was rung (which stays).
    pub(crate) fn clear_poke(&self) {
        if !self.is_rung() {
            drain(self.fd.as_raw_fd());
            // A ring between the look and the drain is kept.
            if self.is_rung() {
                signal(self.fd.as_raw_fd());
            }
        }
    }

    /// Whether [`Closing::ring`] was called.
    pub(crate) fn is_rung(&self) -> bool {
        self.rung.load(Ordering::Acquire)
    }

    /// Readable once rung (never read: it stays readable).
    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// A fresh non-blocking eventfd, counting from 0 (not readable).
pub(crate) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain constructor with valid flags; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Make eventfd `fd` readable (until [`drain`]ed).
pub(crate) fn signal(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to an eventfd. It can only
    // fail if the counter would overflow, which leaves it readable.
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// Make eventfd `fd` unreadable again (nothing happens if it was).
pub(crate) fn drain(fd: RawFd) {
    let mut n: u64 = 0;
    // SAFETY: reads at most 8 bytes into a live u64 from a non-blocking
    // eventfd; with nothing signalled it fails with EAGAIN, which is fine.
    unsafe { libc::read(fd, (&mut n as *mut u64).cast(), 8) };
}

/// Wait until `fd` is readable or `other` is (a [`Closing::fd`], say), at
/// most `ms` milliseconds (negative: no limit). Returns whether `fd` is
/// readable.
pub(crate) fn poll_either(fd: RawFd, other: RawFd, ms: libc::c_int) -> io::Result<bool> {
    Ok(poll_any(fd, other, None, ms)?[0])
}

/// [`poll_either`], watching `extra` too when there is one (a waiting
/// thread's interrupt). Returns which are readable: `fd`, `other`,
/// `extra`.
pub(crate) fn poll_any(
    fd: RawFd,
    other: RawFd,
    extra: Option<RawFd>,
    ms: libc::c_int,
) -> io::Result<[bool; 3]> {
    let pollin = |fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    let mut fds = [pollin(fd), pollin(other), pollin(extra.unwrap_or(-1))];
    let n = if extra.is_some() { 3 } else { 2 };
    if !crate::cm::poll_in(&mut fds[..n], ms)? {
        return Ok([false; 3]);
    }
    Ok(fds.map(|f| f.revents != 0))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn a_rung_signal_wakes_fd_waiters_for_good() {
        let c = Closing::new().unwrap();
        // A pipe that never becomes readable stands for a quiet channel.
        let mut p = [0; 2];
        // SAFETY: valid out-array of two fds.
        assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
        // SAFETY: fresh descriptors, owned here from now on.
        let (r, _w) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
        assert!(!poll_either(r.as_raw_fd(), c.fd(), 0).unwrap());
        assert!(!c.is_rung());
        let waiter = std::thread::spawn({
            let fd = c.fd();
            move || {
                let start = Instant::now();
                let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
                // SAFETY: one valid pollfd.
                let rc = unsafe { libc::poll(&mut pfd, 1, 10_000) };
                (rc, start.elapsed())
            }
        });
        std::thread::sleep(Duration::from_millis(20));
        c.ring();
        let (rc, took) = waiter.join().unwrap();
        assert_eq!(rc, 1, "the waiter was woken by the ring, not its timeout");
        assert!(took < Duration::from_secs(5), "{took:?}");
        for _ in 0..2 {
            // Still ready: later waits return at once.
            let start = Instant::now();
            assert!(!poll_either(r.as_raw_fd(), c.fd(), 10_000).unwrap());
            assert!(start.elapsed() < Duration::from_secs(5));
            assert!(c.is_rung());
        }
        c.ring();
    }

    #[test]
    fn a_drained_eventfd_is_quiet_until_signalled_again() {
        let e = eventfd().unwrap();
        let fd = e.as_raw_fd();
        let readable = || {
            let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut pfd, 1, 0) == 1 }
        };
        assert!(!readable());
        drain(fd);
        signal(fd);
        signal(fd);
        assert!(readable());
        drain(fd);
        assert!(!readable(), "one drain takes every signal");
        signal(fd);
        assert!(readable());
    }
}
