//! [`RecvGate`]: one receiver at a time owns the socket's receive options.
//!
//! A receive with a deadline sets `SO_RCVTIMEO`, and a try-receive turns on
//! `O_NONBLOCK`; both are per-socket state. Two threads receiving at once
//! would overwrite each other's setting (and one could block forever), so
//! receivers take turns here ([`TurnLock`]: waiting for a turn honours the
//! caller's deadline).

use std::io;
use std::net::UdpSocket;
use std::time::{Duration, Instant};

use zerocast_link::{TurnGuard, TurnLock};

/// The turn at the socket, and the `SO_RCVTIMEO` last set, if known
/// (`Some(None)`: blocking).
#[derive(Debug, Default)]
pub(super) struct RecvGate(TurnLock<Option<Option<Duration>>>);

impl RecvGate {
    /// Wait for the turn until `deadline` (`None`: forever). `None` if the
    /// deadline passed first.
    pub(super) fn enter(&self, deadline: Option<Instant>) -> Option<Turn<'_>> {
        self.0.lock(deadline).map(Turn)
    }

    /// Take the turn if nobody holds it.
    pub(super) fn try_enter(&self) -> Option<Turn<'_>> {
        self.0.try_lock().map(Turn)
    }

    /// Have `waker` woken when the turn is passed on; `false` if it is
    /// free (see [`TurnLock::wake_when_free`]).
    pub(super) fn wake_when_free(&self, waker: &std::task::Waker) -> bool {
        self.0.wake_when_free(waker)
    }
}

/// The right to change the socket's receive options and receive. Dropping
/// it passes the turn on.
#[derive(Debug)]
pub(super) struct Turn<'a>(TurnGuard<'a, Option<Option<Duration>>>);

impl Turn<'_> {
    /// Set `SO_RCVTIMEO` (`None`: block) unless it already has that value.
    pub(super) fn set_timeout(&mut self, sock: &UdpSocket, timeout: Option<Duration>) -> io::Result<()> {
        if *self.0 != Some(timeout) {
            // Forget the old value first: if the call fails, it is unknown.
            *self.0 = None;
            sock.set_read_timeout(timeout)?;
            *self.0 = Some(timeout);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_turn_at_a_time() {
        let gate = RecvGate::default();
        let t = gate.enter(None).unwrap();
        assert!(gate.try_enter().is_none());
        assert!(gate.enter(Some(Instant::now())).is_none(), "a past deadline does not wait");
        drop(t);
        assert!(gate.try_enter().is_some());
    }

    #[test]
    fn caches_the_socket_timeout() {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let gate = RecvGate::default();
        let mut t = gate.enter(None).unwrap();
        t.set_timeout(&sock, Some(Duration::from_millis(250))).unwrap();
        drop(t);
        let t = gate.try_enter().unwrap();
        assert_eq!(*t.0, Some(Some(Duration::from_millis(250))));
        // The kernel keeps it in clock ticks, so it reads back rounded up.
        let back = sock.read_timeout().unwrap().unwrap();
        assert!(back >= Duration::from_millis(250) && back < Duration::from_millis(300), "{back:?}");
    }
}
