//! The hello exchange on a fresh socket, before the I/O threads start.

use std::io::{Read, Write};
use std::time::Duration;

use socket2::Socket;
use zerocast_core::handshake::HELLO_LEN;
use zerocast_core::{ConnError, FrameKind, HandshakeError, Header, Hello, HEADER_LEN};

/// Send our hello and read the peer's, both within `timeout`.
pub(super) fn exchange(sock: &Socket, hello: &Hello, timeout: Duration) -> Result<Hello, ConnError> {
    sock.set_write_timeout(Some(timeout))?;
    sock.set_read_timeout(Some(timeout))?;
    let mut out = [0u8; HEADER_LEN + HELLO_LEN];
    out[..HEADER_LEN].copy_from_slice(&Header::new(FrameKind::Control, 0, 0, HELLO_LEN as u64).encode());
    out[HEADER_LEN..].copy_from_slice(&hello.encode());
    let mut w = sock;
    w.write_all(&out).map_err(timed)?;

    let mut r = sock;
    let mut hdr = [0u8; HEADER_LEN];
    r.read_exact(&mut hdr).map_err(timed)?;
    let h = Header::decode(&hdr, HELLO_LEN as u64)?;
    if h.kind != FrameKind::Control || h.len != HELLO_LEN as u64 {
        return Err(
            HandshakeError::Frame(format!("expected a {HELLO_LEN}-byte control frame, got {h:?}")).into()
        );
    }
    let mut body = [0u8; HELLO_LEN];
    r.read_exact(&mut body).map_err(timed)?;
    let peer = Hello::decode(&body)?;
    sock.set_write_timeout(None)?;
    Ok(peer)
}

fn timed(e: std::io::Error) -> ConnError {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            ConnError::TimedOut("the peer did not complete the handshake")
        }
        std::io::ErrorKind::UnexpectedEof => HandshakeError::NotHello.into(),
        _ => e.into(),
    }
}
