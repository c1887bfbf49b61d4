//! The hello exchange on a fresh socket: a sans-IO state machine, driven
//! without waiting by the listener's engine and with a deadline by a
//! connecting thread.

use std::io::{Read, Write};
use std::time::Instant;

use rustix::io::Errno;
use rustix::net::{recv, send, RecvFlags, SendFlags};
use socket2::Socket;
use zerocast_core::handshake::HELLO_LEN;
use zerocast_core::{ConnError, FrameKind, HandshakeError, Header, Hello, HEADER_LEN};

const LEN: usize = HEADER_LEN + HELLO_LEN;

/// Our hello going out and the peer's coming in, as far as each got.
pub(super) struct HelloExchange {
    out: [u8; LEN],
    sent: usize,
    inp: [u8; LEN],
    got: usize,
}

impl HelloExchange {
    pub(super) fn new(hello: &Hello) -> Self {
        let mut out = [0u8; LEN];
        out[..HEADER_LEN].copy_from_slice(&Header::new(FrameKind::Control, 0, 0, HELLO_LEN as u64).encode());
        out[HEADER_LEN..].copy_from_slice(&hello.encode());
        Self { out, sent: 0, inp: [0u8; LEN], got: 0 }
    }

    /// What is left to send of our hello.
    pub(super) fn to_send(&self) -> &[u8] {
        &self.out[self.sent..]
    }

    pub(super) fn sent(&mut self, n: usize) {
        self.sent = (self.sent + n).min(LEN);
    }

    /// Where the next bytes of the peer's hello go: never past its end, so
    /// no byte of the frames behind it is taken.
    pub(super) fn recv_buf(&mut self) -> &mut [u8] {
        &mut self.inp[self.got..]
    }

    /// `n` bytes arrived (0: the peer closed). `Some` once the peer's hello
    /// is whole and ours is sent. A header that is not a hello's fails at
    /// once, before the rest arrives.
    pub(super) fn received(&mut self, n: usize) -> Result<Option<Hello>, ConnError> {
        if n == 0 {
            return Err(HandshakeError::NotHello.into());
        }
        let before = self.got;
        self.got = (self.got + n).min(LEN);
        if before < HEADER_LEN && self.got >= HEADER_LEN {
            let h = Header::decode(&self.inp[..HEADER_LEN], HELLO_LEN as u64)?;
            if h.kind != FrameKind::Control || h.len != HELLO_LEN as u64 {
                let msg = format!("expected a {HELLO_LEN}-byte control frame, got {h:?}");
                return Err(HandshakeError::Frame(msg).into());
            }
        }
        self.result()
    }

    /// Move the exchange on over a non-blocking socket, without waiting;
    /// `Some` once the peer's hello is in. What the peer sent is read
    /// first, so junk fails before anything is sent.
    pub(super) fn advance(&mut self, sock: &Socket) -> Result<Option<Hello>, ConnError> {
        while !self.recv_buf().is_empty() {
            match recv(sock, self.recv_buf(), RecvFlags::DONTWAIT) {
                Ok((n, _)) => {
                    self.received(n)?;
                }
                Err(Errno::INTR) => {}
                Err(Errno::AGAIN) => break,
                Err(e) => return Err(std::io::Error::from(e).into()),
            }
        }
        while !self.to_send().is_empty() {
            match send(sock, self.to_send(), SendFlags::DONTWAIT | SendFlags::NOSIGNAL) {
                Ok(n) => self.sent(n),
                Err(Errno::INTR) => {}
                Err(Errno::AGAIN) => break,
                Err(e) => return Err(std::io::Error::from(e).into()),
            }
        }
        self.result()
    }

    /// The peer's hello, once it is whole and ours is sent.
    pub(super) fn result(&self) -> Result<Option<Hello>, ConnError> {
        if self.got < LEN || self.sent < LEN {
            return Ok(None);
        }
        Ok(Some(Hello::decode(&self.inp[HEADER_LEN..])?))
    }
}

/// Send our hello and read the peer's on a blocking socket, both by
/// `deadline`.
pub(super) fn exchange(sock: &Socket, hello: &Hello, deadline: Instant) -> Result<Hello, ConnError> {
    let left = || match deadline.checked_duration_since(Instant::now()) {
        Some(d) if !d.is_zero() => Ok(d),
        _ => Err(ConnError::TimedOut("the peer did not complete the handshake")),
    };
    let mut hs = HelloExchange::new(hello);
    sock.set_write_timeout(Some(left()?))?;
    let mut w = sock;
    w.write_all(hs.to_send()).map_err(timed)?;
    hs.sent(LEN);
    let mut r = sock;
    loop {
        sock.set_read_timeout(Some(left()?))?;
        let n = r.read(hs.recv_buf()).map_err(timed)?;
        if let Some(peer) = hs.received(n)? {
            sock.set_read_timeout(None)?;
            sock.set_write_timeout(None)?;
            return Ok(peer);
        }
    }
}

pub(super) fn timed(e: std::io::Error) -> ConnError {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            ConnError::TimedOut("the peer did not complete the handshake")
        }
        std::io::ErrorKind::UnexpectedEof => HandshakeError::NotHello.into(),
        _ => e.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(window: u32) -> Hello {
        Hello { window, credit_unit: 0, max_payload: 1 << 20, recv_buf_size: 4096, heartbeat_ms: 0 }
    }

    #[test]
    fn a_hello_in_pieces_completes_once_whole_and_ours_sent() {
        let peer = HelloExchange::new(&hello(7));
        let wire = peer.to_send().to_vec();
        let mut hs = HelloExchange::new(&hello(3));
        for b in &wire[..LEN - 1] {
            hs.recv_buf()[0] = *b;
            assert!(hs.received(1).unwrap().is_none());
        }
        hs.recv_buf()[0] = wire[LEN - 1];
        assert!(hs.received(1).unwrap().is_none(), "ours is not sent yet");
        hs.sent(LEN);
        assert_eq!(hs.result().unwrap().unwrap().window, 7);
        assert!(hs.recv_buf().is_empty(), "nothing past the hello is read");
    }

    #[test]
    fn junk_fails_at_the_header() {
        let mut hs = HelloExchange::new(&hello(3));
        hs.recv_buf()[..HEADER_LEN].fill(0xab);
        assert!(hs.received(HEADER_LEN).is_err());
        let mut hs = HelloExchange::new(&hello(3));
        assert!(matches!(hs.received(0), Err(ConnError::Handshake(HandshakeError::NotHello))));
    }
}
