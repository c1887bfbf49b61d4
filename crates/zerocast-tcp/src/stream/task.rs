//! A `tcp://` connection as an engine task.
//!
//! The engine reads the socket whenever no application thread does, and
//! writes what sending threads queued (and the backlog a full socket left).
//! It runs when the socket is ready, when the link wakes it (frames queued,
//! a receiving thread let go of the socket), or at its timer: the
//! heartbeat's next deadline, a part-way frame's stall deadline, or the
//! close timeout of a connection the application let go of.
//!
//! After both goodbyes the write half is shut, but the socket stays open
//! and is read (its frames checked) until the peer's end of stream: a
//! socket closed while bytes still arrive for it (the peer's credits, say)
//! is reset by the kernel, and a reset discards whatever the kernel had
//! not yet sent, so the peer would lose the tail of the stream.

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
    /// Bounds the wait for the peer's end of stream once both goodbyes
    /// are out and in.
    linger: Duration,
    /// Both goodbyes are out and in and the write half is shut: reading
    /// on until the peer's end of stream, or this deadline.
    lingering: Option<Instant>,
}

impl ConnTask {
    /// A task for a handshaken socket; receiving threads may read it from
    /// now on. A peer that has not ended its stream `frame_timeout` after
    /// both goodbyes has its socket closed anyway.
    pub(super) fn new(sock: Arc<Socket>, driver: Driver, frame_timeout: Duration, peer_window: u32) -> Self {
        let attention = Arc::new(Attention::default());
        driver.install_waking_source(Box::new(Reader::new(sock.clone(), frame_timeout, attention.clone())));
        driver.set_source_fd(sock.clone());
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
            linger: frame_timeout,
            lingering: None,
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

    /// Whether the engine reads when the socket turns readable: while no
    /// receiver holds the socket, and while lingering, when it reads to
    /// the peer's end of stream though one does (no receiver waits for it).
    fn reads_on_readiness(&self) -> bool {
        !self.driver.reader_claimed() || self.lingering.is_some()
    }

    /// The connection failed: shut all of the socket (which also stops a
    /// peer blocked on us); nothing more is read.
    fn end_failed(&mut self) -> Step {
        let _ = self.sock.shutdown(Shutdown::Both);
        self.reading = false;
        self.end()
    }

    /// The connection is over: let `wait_closed` know. A peer that never
    /// ended its stream has the rest of the socket shut too.
    fn end(&mut self) -> Step {
        if self.reading {
            let _ = self.sock.shutdown(Shutdown::Both);
        }
        self.driver.writer_done();
        Step::Done
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
            self.attention.set_waker(cx.waker().to_std());
            self.attached = true;
        }
        let tick = cx.timer_due();
        if self.reading {
            let handed_back = cx.woken() && self.awaiting_handback;
            // At a tick, read even for a receiving thread that holds the
            // socket but is not in it now: heartbeats and a stalled frame
            // are judged on what has arrived. So when the pool wakes us
            // for a payload waiting for a buffer.
            let buffer_back = cx.woken() && self.attention.starved();
            if tick || buffer_back || ((cx.readable() || handed_back) && self.reads_on_readiness()) {
                if cx.readable() {
                    self.attention.readable();
                }
                self.pump();
            }
        }
        // The application let go, and the peer did not end the goodbye
        // exchange within the close timeout: the connection has failed.
        let close_due = match self.lingering {
            None => match self.driver.close_deadline(cx.now()) {
                Ok(due) => due,
                Err(_) => return self.end_failed(),
            },
            Some(_) => None,
        };
        let hb_due = tick && self.heartbeat.is_some_and(|t| t <= cx.now());
        let write = first || cx.woken() || cx.writable() || hb_due || !self.reading;
        if self.lingering.is_none() && write {
            match self.driver.drive_writer(hb_due) {
                Writing::Idle { next } => {
                    self.backlog = false;
                    self.heartbeat = next;
                }
                Writing::Backlog => {
                    self.backlog = true;
                    self.heartbeat = self.driver.heartbeat_deadline();
                }
                Writing::Finished if self.driver.error().is_some() => return self.end_failed(),
                // Both goodbyes are out and in (every frame before the
                // peer's was read): shut the write half and linger, reading
                // on until the peer's end of stream.
                Writing::Finished => {
                    self.backlog = false;
                    self.heartbeat = None;
                    let _ = self.sock.shutdown(Shutdown::Write);
                    self.lingering = Some(cx.now() + self.linger);
                    if self.reading {
                        self.pump();
                    }
                }
            }
        }
        if self.lingering.is_some_and(|deadline| !self.reading || cx.now() >= deadline) {
            return self.end();
        }
        let read = self.reading && !self.awaiting_handback && self.reads_on_readiness();
        cx.set_interest(Interest { read, write: self.backlog });
        let stall = if self.reading { self.attention.get() } else { None };
        let timer = [stall, self.heartbeat, self.lingering, close_due].into_iter().flatten().min();
        cx.set_timer(timer);
        Step::Continue
    }
}
