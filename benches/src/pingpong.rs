//! Round trips: one message out, the same size back, from an echo thread.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use socket2::Socket;
use zerocast::Connection;

use crate::raw::socket_pair;
use crate::zc::zc_pair_with;
use crate::{link_for, mask, stamp, stamp_of, BoxError, RAW_PREFIX};

/// Something that can time one round trip.
pub trait PingPong {
    /// Send one message, wait for its echo; the time that took.
    fn round_trip(&mut self) -> Duration;

    /// Time `n` round trips; their durations, in nanoseconds, in `out`.
    /// An async side runs them all in one task of its runtime, as an
    /// async application would.
    fn round_trips(&mut self, n: usize, out: &mut Vec<u64>) {
        out.clear();
        out.extend((0..n).map(|_| self.round_trip().as_nanos() as u64));
    }
}

/// Time `n` round trips; their durations, in nanoseconds, in `out`.
pub fn round_trips(p: &mut dyn PingPong, n: usize, out: &mut Vec<u64>) {
    p.round_trips(n, out);
}

/// zerocast's raw buffer API: the echo thread receives a buffer, allocates
/// a reply, writes the sequence number, sends it.
#[derive(Debug)]
pub struct ZcPing {
    conn: Connection,
    size: usize,
    seq: u64,
    echo: Option<JoinHandle<()>>,
}

impl ZcPing {
    /// Round trips of `size` bytes at `uri` (`tcp://127.0.0.1:0`, `mem://name`).
    pub fn new(uri: &str, size: usize) -> Result<Self, BoxError> {
        let (conn, server) = zc_pair_with(uri, link_for(size))?;
        let echo = thread::Builder::new().name("zc-echo".into()).spawn(move || {
            while let Ok(m) = server.recv() {
                let mut reply = server.alloc(m.len()).expect("echo alloc");
                stamp(&mut reply, stamp_of(&m));
                drop(m);
                if server.send(reply).is_err() {
                    return;
                }
            }
        })?;
        Ok(Self { conn, size, seq: 0, echo: Some(echo) })
    }
}

impl PingPong for ZcPing {
    fn round_trip(&mut self) -> Duration {
        let start = Instant::now();
        let mut buf = self.conn.alloc(self.size).expect("zerocast alloc");
        stamp(&mut buf, self.seq);
        self.conn.send(buf).expect("zerocast send");
        let reply = self.conn.recv().expect("zerocast echo");
        let took = start.elapsed();
        assert_eq!(stamp_of(&reply), self.seq & mask(self.size), "zerocast echo out of order");
        self.seq += 1;
        took
    }
}

impl Drop for ZcPing {
    fn drop(&mut self) {
        self.conn.close();
        if let Some(h) = self.echo.take() {
            let _ = h.join();
        }
    }
}

/// The raw ping-pong baseline on a socket2 TCP pair (`TCP_NODELAY`): one
/// `write` of an 8-byte length and the payload, `read_exact` of the same.
#[derive(Debug)]
pub struct RawPing {
    sock: Socket,
    frame: Vec<u8>,
    seq: u64,
    echo: Option<JoinHandle<()>>,
}

impl RawPing {
    /// Round trips of `size` payload bytes.
    pub fn new(size: usize) -> Result<Self, BoxError> {
        let (sock, server) = socket_pair()?;
        let echo = thread::Builder::new().name("raw-echo".into()).spawn(move || {
            let mut frame = vec![0u8; RAW_PREFIX + size];
            while (&server).read_exact(&mut frame).is_ok() {
                if (&server).write_all(&frame).is_err() {
                    return;
                }
            }
        })?;
        let mut frame = vec![0u8; RAW_PREFIX + size];
        frame[..RAW_PREFIX].copy_from_slice(&(size as u64).to_le_bytes());
        Ok(Self { sock, frame, seq: 0, echo: Some(echo) })
    }
}

impl PingPong for RawPing {
    fn round_trip(&mut self) -> Duration {
        let start = Instant::now();
        stamp(&mut self.frame[RAW_PREFIX..], self.seq);
        (&self.sock).write_all(&self.frame).expect("raw send");
        (&self.sock).read_exact(&mut self.frame).expect("raw echo");
        let took = start.elapsed();
        assert_eq!(stamp_of(&self.frame[RAW_PREFIX..]), self.seq & mask(self.frame.len() - RAW_PREFIX));
        self.seq += 1;
        took
    }
}

impl Drop for RawPing {
    fn drop(&mut self) {
        let _ = self.sock.shutdown(Shutdown::Write);
        if let Some(h) = self.echo.take() {
            let _ = h.join();
        }
    }
}
