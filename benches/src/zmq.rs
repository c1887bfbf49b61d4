//! ZeroMQ baselines through the `zmq` crate (libzmq): PUSH/PULL for
//! throughput, REQ/REP for round trips, over `tcp://127.0.0.1`.
//!
//! ZeroMQ copies each message into its own buffer on send and hands the
//! receiver a message it owns; it batches small messages in its I/O thread.
//! High-water marks stay at libzmq's defaults (1000 messages).

use std::sync::mpsc::{sync_channel, Receiver};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::pingpong::PingPong;
use crate::{stamp, stamp_of, BoxError, Pipe};

/// The bound endpoint of a socket listening on an ephemeral loopback port.
fn bind_any(sock: &zmq::Socket) -> Result<String, BoxError> {
    sock.bind("tcp://127.0.0.1:*")?;
    sock.get_last_endpoint()?.map_err(|_| "zmq endpoint is not UTF-8".into())
}

/// PUSH (the calling thread) → PULL (a receiving thread).
pub struct ZmqPipe {
    _ctx: zmq::Context,
    push: zmq::Socket,
    payload: Vec<u8>,
    n: u64,
    seq: u64,
    done: Receiver<()>,
    receiver: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ZmqPipe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZmqPipe").field("size", &self.payload.len()).field("n", &self.n).finish()
    }
}

impl ZmqPipe {
    /// A pipe sending `n` messages of `size` bytes (at least 1) per batch.
    pub fn new(size: usize, n: u64) -> Result<Self, BoxError> {
        let ctx = zmq::Context::new();
        let pull = ctx.socket(zmq::PULL)?;
        let at = bind_any(&pull)?;
        let push = ctx.socket(zmq::PUSH)?;
        push.connect(&at)?;
        let (tx, done) = sync_channel(1);
        let receiver = thread::Builder::new().name("zmq-pull".into()).spawn(move || {
            let mut msg = zmq::Message::new();
            let mut expect = 0u64;
            loop {
                for _ in 0..n {
                    pull.recv(&mut msg, 0).expect("zmq recv");
                    if msg.is_empty() {
                        return;
                    }
                    assert_eq!(msg.len(), size, "zmq receiver: wrong size");
                    assert_eq!(stamp_of(&msg), expect & crate::mask(size), "zmq receiver: out of order");
                    expect += 1;
                }
                if tx.send(()).is_err() {
                    return;
                }
            }
        })?;
        Ok(Self {
            _ctx: ctx,
            push,
            payload: vec![0u8; size.max(1)],
            n,
            seq: 0,
            done,
            receiver: Some(receiver),
        })
    }
}

impl Pipe for ZmqPipe {
    fn batch(&mut self) -> Duration {
        let start = Instant::now();
        for _ in 0..self.n {
            stamp(&mut self.payload, self.seq);
            self.seq += 1;
            self.push.send(&self.payload[..], 0).expect("zmq send");
        }
        self.done.recv().expect("zmq receiver stopped");
        start.elapsed()
    }

    fn msgs(&self) -> u64 {
        self.n
    }

    fn bytes(&self) -> u64 {
        self.n * self.payload.len() as u64
    }
}

impl Drop for ZmqPipe {
    fn drop(&mut self) {
        // An empty message ends the receiver.
        let _ = self.push.send(&[][..], 0);
        if let Some(h) = self.receiver.take() {
            let _ = h.join();
        }
    }
}

/// REQ (the calling thread) ⇄ REP (an echo thread).
pub struct ZmqReqRep {
    _ctx: zmq::Context,
    req: zmq::Socket,
    payload: Vec<u8>,
    reply: zmq::Message,
    seq: u64,
    echo: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ZmqReqRep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZmqReqRep").field("size", &self.payload.len()).finish()
    }
}

impl ZmqReqRep {
    /// Round trips of `size` bytes (at least 1).
    pub fn new(size: usize) -> Result<Self, BoxError> {
        let ctx = zmq::Context::new();
        let rep = ctx.socket(zmq::REP)?;
        let at = bind_any(&rep)?;
        let req = ctx.socket(zmq::REQ)?;
        req.connect(&at)?;
        let echo = thread::Builder::new().name("zmq-rep".into()).spawn(move || {
            let mut msg = zmq::Message::new();
            loop {
                rep.recv(&mut msg, 0).expect("zmq recv");
                let last = msg.is_empty();
                rep.send(&msg[..], 0).expect("zmq reply");
                if last {
                    return;
                }
            }
        })?;
        Ok(Self {
            _ctx: ctx,
            req,
            payload: vec![0u8; size.max(1)],
            reply: zmq::Message::new(),
            seq: 0,
            echo: Some(echo),
        })
    }
}

impl PingPong for ZmqReqRep {
    fn round_trip(&mut self) -> Duration {
        let start = Instant::now();
        stamp(&mut self.payload, self.seq);
        self.req.send(&self.payload[..], 0).expect("zmq request");
        self.req.recv(&mut self.reply, 0).expect("zmq reply");
        let took = start.elapsed();
        assert_eq!(stamp_of(&self.reply), self.seq & crate::mask(self.payload.len()));
        self.seq += 1;
        took
    }
}

impl Drop for ZmqReqRep {
    fn drop(&mut self) {
        let _ = self.req.send(&[][..], 0);
        let _ = self.req.recv(&mut self.reply, 0);
        if let Some(h) = self.echo.take() {
            let _ = h.join();
        }
    }
}
