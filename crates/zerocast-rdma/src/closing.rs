//! The signal that a UD socket's rdma_cm side is closing, for the thread
//! that sleeps on its event channel, and the eventfd helpers the SRQ's
//! async event reader uses too.
//!
//! That thread does not wake on a timer to look around. The one thing
//! that reaches it otherwise is a close, and this is how: an `eventfd`
//! that its wait includes ([`poll_either`]). It stays readable once rung.
//! (A connection's receiving thread is woken through its own eventfd
//! instead: see `rc::engine::Io::sleeping`.)

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
    let mut fds = [
        libc::pollfd { fd, events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: other, events: libc::POLLIN, revents: 0 },
    ];
    Ok(crate::cm::poll_in(&mut fds, ms)? && fds[0].revents != 0)
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
