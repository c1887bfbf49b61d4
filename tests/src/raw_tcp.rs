//! A raw TCP peer of a zerocast listener: a real handshake, then bytes
//! written and read by hand, so a test can misbehave on the wire or watch
//! it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

use zerocast::core::handshake::HELLO_LEN;
use zerocast::core::{FrameKind, Header, Hello, HEADER_LEN};
use zerocast::{Connection, Listener};

/// Connect to `listener` at `addr`, announcing a window of `window` and
/// payloads up to 1 MiB; returns the raw stream, past the listener's
/// hello, and the listener's side of the connection.
pub fn handshaken(listener: &Listener, addr: SocketAddr, window: u32) -> (TcpStream, Connection) {
    let (s, conn, _) = handshaken_hello(listener, addr, window);
    (s, conn)
}

/// [`handshaken`], and the listener's hello (its window in credits, say).
pub fn handshaken_hello(
    listener: &Listener,
    addr: SocketAddr,
    window: u32,
) -> (TcpStream, Connection, Hello) {
    let mut s = TcpStream::connect(addr).expect("connect");
    let hello = Hello { window, credit_unit: 0, max_payload: 1 << 20, recv_buf_size: 0, heartbeat_ms: 0 };
    s.write_all(&Header::new(FrameKind::Control, 0, 0, HELLO_LEN as u64).encode()).expect("write");
    s.write_all(&hello.encode()).expect("write");
    let conn = listener.accept().expect("accept");
    let mut back = [0u8; HEADER_LEN + HELLO_LEN];
    s.read_exact(&mut back).expect("the listener's hello");
    let theirs = Hello::decode(&back[HEADER_LEN..]).expect("the listener's hello decodes");
    (s, conn, theirs)
}
