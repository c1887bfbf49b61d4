//! A `tcp://` connection as an engine task.
//!
//! The engine reads the socket whenever no application thread does, and
//! writes what sending threads queued (and the backlog a full socket left).
//! It runs when the socket is ready, when the link wakes it (frames queued,
//! a receiving thread let go of the socket), or at its timer: the
//! heartbeat's next deadline, or a part-way frame's stall deadline.

use std::net::Shutdown;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use socket2::Socket;
use zerocast_link::engine::{Cx, Interest, Step, Task};
use zerocast_link::{Driver, Pumped, Writing};

use super::reader::{Attention, Reader};
use super::writer::TcpWire;

pub(super) struct ConnTask {
    sock: Arc<Socket>,
    driver: Driver,
    attention: Arc<Attention>,
    /// The peer's window, which sizes the wire's backlog.
    peer_window: usize,
    attached: bool,
    /// The read side is not over.
    reading: bool,
    /// An application thread holds the source; it wakes us when it lets go.
    awaiting_handback: bool,
    /// The wire has a backlog: wait for the socket to be writable.
    backlog: bool,
    /// The heartbeat's next deadline.
    heartbeat: Option<Instant>,
}

impl ConnTask {
    /// A task for a handshaken socket; receiving threads may read it from
    /// now on.
    pub(super) fn new(sock: Arc<Socket>, driver: Driver, frame_timeout: Duration, peer_window: u32) -> Self {
        let attention = Arc::new(Attention::default());
        driver.install_waking_source(Box::new(Reader::new(sock.clone(), frame_timeout, attention.clone())));
        driver.watches_interrupt();
        Self {
            sock,
            driver,
            attention,
            peer_window: peer_window as usize,
            attached: false,
            reading: true,
            awaiting_handback: false,
            backlog: false,
            heartbeat: None,
        }
    }

    fn pump(&mut self) {
        loop {
            match self.driver.try_pump(None) {
                Some(Pumped::Done) => self.reading = false,
                Some(_) => self.awaiting_handback = false,
                // Taken by an application thread: it wakes us when done,
                // unless it let go meanwhile.
                None if !self.driver.await_handback() => continue,
                None => self.awaiting_handback = true,
            }
            return;
        }
    }

    /// The write side is over: shut the socket's write half (all of it
    /// after a failure, which also stops a peer blocked on us) and let
    /// `wait_closed` know.
    fn finish(&mut self) {
        let how = if self.driver.error().is_some() { Shutdown::Both } else { Shutdown::Write };
        let _ = self.sock.shutdown(how);
        self.driver.writer_done();
    }
}

impl Task for ConnTask {
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.sock.as_fd())
    }

    fn run(&mut self, cx: &mut Cx<'_>) -> Step {
        let first = !self.attached;
        if first {
            let wire = TcpWire::new(self.sock.clone(), self.peer_window);
            self.driver.attach(Box::new(wire), cx.waker());
            self.attached = true;
        }
        let tick = cx.timer_due();
        if self.reading {
            let handed_back = cx.woken() && self.awaiting_handback;
            // At a tick, read even for a receiving thread that holds the
            // socket but is not in it now: heartbeats and a stalled frame
            // are judged on what has arrived.
            if tick || ((cx.readable() || handed_back) && !self.driver.reader_claimed()) {
                self.pump();
            }
        }
        let hb_due = tick && self.heartbeat.is_some_and(|t| t <= cx.now());
        if first || cx.woken() || cx.writable() || hb_due || !self.reading {
            match self.driver.drive_writer(hb_due) {
                Writing::Idle { next } => {
                    self.backlog = false;
                    self.heartbeat = next;
                }
                Writing::Backlog => {
                    self.backlog = true;
                    self.heartbeat = self.driver.heartbeat_deadline();
                }
                Writing::Finished => {
                    // Both goodbyes are out and in (every frame before the
                    // peer's was read), or the connection failed: nothing
                    // more is read either.
                    self.finish();
                    return Step::Done;
                }
            }
        }
        let read = self.reading && !self.awaiting_handback && !self.driver.reader_claimed();
        cx.set_interest(Interest { read, write: self.backlog });
        let stall = if self.reading { self.attention.get() } else { None };
        let timer = match (stall, self.heartbeat) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        cx.set_timer(timer);
        Step::Continue
    }
}
