//! The end of a `tcp://` connection, watched from a raw peer on the wire.
//!
//! A socket closed while bytes still arrive for it is reset by the kernel,
//! and a reset throws away whatever the kernel had not yet sent. So a
//! connection whose handles are gone keeps its socket until the peer has
//! read everything: both goodbyes, the write half shut, then the socket is
//! read (and its frames checked) until the peer's end of stream.

use std::io::{ErrorKind as IoKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use zerocast::core::{FrameKind, Header, HEADER_LEN};
use zerocast::{Config, Listener, RecvError, TcpConfig, Zerocast};
use zerocast_tests::raw_tcp::handshaken;

const WINDOW: u32 = 8;
const SIZE: usize = 256 * 1024;
const MESSAGES: u32 = WINDOW - 2;

/// A listener whose frame timeout (which bounds the wait for a peer's end
/// of stream) is `frame`.
fn listen(frame: Duration) -> (Listener, SocketAddr) {
    let mut cfg = Config::default();
    cfg.tcp = TcpConfig::default().with_timeouts(Duration::from_secs(5), frame);
    cfg.link = cfg.link.with_recv_window(WINDOW);
    let zc = Zerocast::with_config(cfg);
    let l = zc.listen("tcp://127.0.0.1:0").expect("listen");
    let addr = l.local_endpoint().authority().parse().expect("addr");
    (l, addr)
}

/// Read frames until the peer's goodbye: the data frames' payload sizes.
fn read_until_goodbye(s: &mut TcpStream) -> std::io::Result<Vec<usize>> {
    let mut sizes = Vec::new();
    let mut head = [0u8; HEADER_LEN];
    let mut payload = vec![0u8; 1 << 20];
    loop {
        s.read_exact(&mut head)?;
        let h = Header::decode(&head, 1 << 20).expect("a valid header");
        let len = h.len as usize;
        s.read_exact(&mut payload[..len])?;
        match h.kind {
            FrameKind::Data => {
                assert!(
                    payload[..len].iter().all(|&b| b == sizes.len() as u8),
                    "message {} corrupt",
                    sizes.len()
                );
                sizes.push(len);
            }
            FrameKind::Control => return Ok(sizes),
            _ => {}
        }
    }
}

/// A raw peer that said goodbye first (it will send nothing but credits),
/// and the zerocast side, which has sent what is left of the window (less
/// the credit kept for control frames, and the one its credit frame for
/// the goodbye took) in large messages: more than the peer's kernel takes
/// while the peer does not read.
fn sent_a_window(linger: Duration) -> (Listener, TcpStream, zerocast::Connection) {
    let (listener, addr) = listen(linger);
    let (mut peer, conn) = handshaken(&listener, addr, WINDOW);
    peer.write_all(&Header::new(FrameKind::Control, 0, 0, 0).encode()).expect("goodbye");
    assert!(matches!(conn.recv_timeout(Duration::from_secs(5)), Err(RecvError::Disconnected)));
    for i in 0..MESSAGES {
        let mut buf = conn.alloc(SIZE).expect("alloc");
        buf.fill(i as u8);
        conn.send(buf).expect("send");
    }
    (listener, peer, conn)
}

/// Read every message and the goodbye, checked.
fn read_everything(peer: &mut TcpStream) {
    let sizes = read_until_goodbye(peer).unwrap_or_else(|e| panic!("the sender's socket failed: {e}"));
    assert_eq!(sizes, vec![SIZE; MESSAGES as usize], "every message, whole, before the goodbye");
}

/// After the goodbye: a clean end of stream, not a reset.
fn expect_end_of_stream(peer: &mut TcpStream) {
    let mut rest = Vec::new();
    match peer.read_to_end(&mut rest) {
        Ok(_) => assert!(rest.is_empty(), "nothing after the goodbye: {} bytes", rest.len()),
        Err(e) if e.kind() == IoKind::ConnectionReset => panic!("the sender reset its socket"),
        Err(e) => panic!("after the goodbye: {e}"),
    }
}

/// The sender's handles are all gone while most of what it sent still
/// sits in its kernel (the peer has not read yet), and the peer then sends
/// a frame: nothing is lost, the goodbye follows the last message, and the
/// socket ends with a clean end of stream.
#[test]
fn a_dropped_sender_keeps_its_socket_until_the_peer_has_read_everything() {
    let (_listener, mut peer, conn) = sent_a_window(Duration::from_secs(10));
    drop(conn);
    // Give a sender that closes too early the time to do it; then a frame
    // arrives for its socket.
    thread::sleep(Duration::from_millis(200));
    peer.write_all(&Header::new(FrameKind::Credit, 1, 1, 0).encode()).expect("a credit frame");
    read_everything(&mut peer);
    peer.shutdown(Shutdown::Write).expect("our end of stream");
    expect_end_of_stream(&mut peer);
}

/// `close_and_wait` returns (true) only once the peer has read everything
/// and ended its stream.
#[test]
fn close_and_wait_returns_after_the_peers_end_of_stream() {
    let (_listener, mut peer, conn) = sent_a_window(Duration::from_secs(10));
    let (done_tx, done) = mpsc::channel();
    let waiter = thread::spawn(move || {
        let clean = conn.close_and_wait(Duration::from_secs(20));
        done_tx.send(()).expect("send");
        clean
    });
    read_everything(&mut peer);
    thread::sleep(Duration::from_millis(100));
    assert!(done.try_recv().is_err(), "close_and_wait returned before the peer's end of stream");
    peer.shutdown(Shutdown::Write).expect("our end of stream");
    assert!(waiter.join().expect("waiter"), "a clean end");
    expect_end_of_stream(&mut peer);
}

/// A peer that reads everything but never ends its stream holds the
/// socket for the frame timeout at most: then `close_and_wait` returns and
/// the socket is shut.
#[test]
fn a_peer_that_never_ends_its_stream_is_let_go_at_the_frame_timeout() {
    let (_listener, mut peer, conn) = sent_a_window(Duration::from_millis(300));
    let waiter = thread::spawn(move || conn.close_and_wait(Duration::from_secs(60)));
    read_everything(&mut peer);
    assert!(waiter.join().expect("waiter"), "both goodbyes went through");
    expect_end_of_stream(&mut peer);
}
