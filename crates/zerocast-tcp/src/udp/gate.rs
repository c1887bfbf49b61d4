//! [`RecvGate`]: one receiver at a time owns the socket's receive options.
//!
//! A receive with a deadline sets `SO_RCVTIMEO`, and a try-receive turns on
//! `O_NONBLOCK`; both are per-socket state. Two threads receiving at once
//! would overwrite each other's setting (and one could block forever), so
//! receivers take turns here. Waiting for a turn honours the caller's
//! deadline, which a plain `Mutex` could not.

use std::io;
use std::net::UdpSocket;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

#[derive(Debug, Default)]
pub(super) struct RecvGate {
    state: Mutex<State>,
    turn: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// A receiver holds the socket.
    busy: bool,
    /// The `SO_RCVTIMEO` last set, if known (`Some(None)`: blocking).
    timeout: Option<Option<Duration>>,
}

impl RecvGate {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wait for the turn until `deadline` (`None`: forever). `None` if the
    /// deadline passed first.
    pub(super) fn enter(&self, deadline: Option<Instant>) -> Option<Turn<'_>> {
        let mut st = self.lock();
        while st.busy {
            st = match deadline {
                None => self.turn.wait(st).unwrap_or_else(PoisonError::into_inner),
                Some(d) => {
                    let left = d.checked_duration_since(Instant::now()).filter(|l| !l.is_zero())?;
                    self.turn.wait_timeout(st, left).unwrap_or_else(PoisonError::into_inner).0
                }
            };
        }
        st.busy = true;
        Some(Turn { gate: self, timeout: st.timeout })
    }

    /// Take the turn if nobody holds it.
    pub(super) fn try_enter(&self) -> Option<Turn<'_>> {
        let mut st = self.lock();
        if st.busy {
            return None;
        }
        st.busy = true;
        Some(Turn { gate: self, timeout: st.timeout })
    }
}

/// The right to change the socket's receive options and receive. Dropping
/// it passes the turn on.
#[derive(Debug)]
pub(super) struct Turn<'a> {
    gate: &'a RecvGate,
    timeout: Option<Option<Duration>>,
}

impl Turn<'_> {
    /// Set `SO_RCVTIMEO` (`None`: block) unless it already has that value.
    pub(super) fn set_timeout(&mut self, sock: &UdpSocket, timeout: Option<Duration>) -> io::Result<()> {
        if self.timeout != Some(timeout) {
            // Forget the old value first: if the call fails, it is unknown.
            self.timeout = None;
            sock.set_read_timeout(timeout)?;
            self.timeout = Some(timeout);
        }
        Ok(())
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut st = self.gate.lock();
        st.busy = false;
        st.timeout = self.timeout;
        drop(st);
        self.gate.turn.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn one_turn_at_a_time() {
        let gate = RecvGate::default();
        let t = gate.enter(None).unwrap();
        assert!(gate.try_enter().is_none());
        let start = Instant::now();
        assert!(gate.enter(Some(start + Duration::from_millis(30))).is_none());
        assert!(start.elapsed() >= Duration::from_millis(30));
        assert!(gate.enter(Some(start)).is_none(), "a past deadline does not wait");
        drop(t);
        assert!(gate.try_enter().is_some());
    }

    #[test]
    fn waiter_gets_the_turn_when_released() {
        let gate = Arc::new(RecvGate::default());
        let t = gate.enter(None).unwrap();
        let g2 = Arc::clone(&gate);
        let waiter =
            std::thread::spawn(move || g2.enter(Some(Instant::now() + Duration::from_secs(5))).is_some());
        std::thread::sleep(Duration::from_millis(20));
        drop(t);
        assert!(waiter.join().unwrap());
    }

    #[test]
    fn caches_the_socket_timeout() {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let gate = RecvGate::default();
        let mut t = gate.enter(None).unwrap();
        t.set_timeout(&sock, Some(Duration::from_millis(250))).unwrap();
        drop(t);
        let t = gate.try_enter().unwrap();
        assert_eq!(t.timeout, Some(Some(Duration::from_millis(250))));
        // The kernel keeps it in clock ticks, so it reads back rounded up.
        let back = sock.read_timeout().unwrap().unwrap();
        assert!(back >= Duration::from_millis(250) && back < Duration::from_millis(300), "{back:?}");
    }
}
