//! The eventfd helpers the SRQ's async event reader uses: a descriptor
//! another thread makes readable to wake a wait that includes it
//! ([`poll_either`]), with no timer.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

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

/// Wait until `fd` is readable or `other` is (the eventfd that `srq`'s
/// async event reader is signalled on when a handler goes, say), at most
/// `ms` milliseconds (negative: no limit). Returns whether `fd` is
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
    use std::os::fd::AsRawFd;
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn a_signal_on_the_other_descriptor_wakes_the_wait() {
        let other = eventfd().unwrap();
        // A pipe that never becomes readable stands for a quiet channel.
        let mut p = [0; 2];
        // SAFETY: valid out-array of two fds.
        assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
        // SAFETY: fresh descriptors, owned here from now on.
        let (r, _w) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
        assert!(!poll_either(r.as_raw_fd(), other.as_raw_fd(), 0).unwrap());
        let fd = other.as_raw_fd();
        let ringer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            signal(fd);
        });
        let start = Instant::now();
        assert!(
            !poll_either(r.as_raw_fd(), other.as_raw_fd(), 10_000).unwrap(),
            "only the other was readable"
        );
        assert!(start.elapsed() < Duration::from_secs(5), "woken by the signal, not the timeout");
        ringer.join().unwrap();
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
