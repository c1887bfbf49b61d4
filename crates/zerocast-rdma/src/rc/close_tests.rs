//! The close timeout on RC (guest only): a connection the application let
//! go of, whose peer holds on to its own end (it takes our goodbye, never
//! answers it and never disconnects), gives its QP and its receive memory
//! back at the close timeout; the peer's receivers see a clean end, and
//! its sending side ends as for a peer that went away.

use std::thread;
use std::time::{Duration, Instant};

use zerocast_core::{
    Connection as _, Endpoint, ErrorKind, LinkConfig, Listener as _, RecvError, Transport as _,
};
use zerocast_mem::PoolConfig;

use super::guest_test_util::addr;
use super::{RcConfig, RcTransport};

/// The listener's close timeout.
const TIMEOUT: Duration = Duration::from_millis(500);
/// Past the timeout: the flushes of the closed QP (at most 10 s) and slack.
const SLACK: Duration = Duration::from_secs(20);

fn let_go_while_the_peer_holds_on(scheme: &str) {
    let addr = addr();
    let link = LinkConfig::default().with_close_timeout(TIMEOUT);
    let ours =
        RcTransport::new(RcConfig::default().with_link(link), PoolConfig::default()).expect("RC transport");
    let theirs = RcTransport::new(RcConfig::default(), PoolConfig::default()).expect("RC transport");
    let ep = Endpoint::parse(&format!("{scheme}://{addr}:0")).expect("endpoint");
    let listener = ours.listen(&ep).expect("listen");
    let at = listener.local_endpoint().clone();
    let peer = thread::spawn(move || theirs.connect(&at).expect("connect"));
    let server = listener.accept().expect("accept");
    let peer = peer.join().expect("the connecting thread");
    let mut m = peer.alloc(8, None).expect("alloc");
    m.copy_from_slice(b"let go?!");
    peer.send(m, None).map_err(|e| e.to_string()).expect("send");
    assert_eq!(&*server.recv(Some(Instant::now() + SLACK)).expect("the message"), b"let go?!");
    assert!(ours.recv_memory().reserved > 0, "the connection reserved receive memory");

    let dropped = Instant::now();
    drop(server);
    // The peer's receivers see our goodbye: a clean end.
    match peer.recv(Some(dropped + SLACK)) {
        Err(RecvError::Disconnected) => {}
        other => panic!("{scheme}: the peer's receive after our goodbye: {other:?}"),
    }
    // The peer holds its end open. Ours goes at the close timeout.
    while ours.recv_memory().reserved > 0 {
        assert!(
            dropped.elapsed() < TIMEOUT + SLACK,
            "{scheme}: receive memory still reserved {:?} after the drop: {:?}",
            dropped.elapsed(),
            ours.recv_memory()
        );
        thread::sleep(Duration::from_millis(10));
    }
    let waited = dropped.elapsed();
    println!("{scheme}: receive memory back {waited:?} after the drop (close timeout {TIMEOUT:?})");
    assert!(waited >= TIMEOUT, "{scheme}: torn down after {waited:?}, before the close timeout");
    // Our teardown disconnected the peer, after our goodbye: its sending
    // side, which it kept open, ends as for a peer that went away.
    let kind = peer.link().error().map(|e| e.kind());
    assert!(
        matches!(kind, None | Some(ErrorKind::PeerGone)),
        "{scheme}: the peer's error: {:?}",
        peer.link().error()
    );
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn rc_a_peer_that_holds_on_after_our_goodbye_is_let_go_at_the_close_timeout() {
    let_go_while_the_peer_holds_on("rc");
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn rc_oob_a_peer_that_holds_on_after_our_goodbye_is_let_go_at_the_close_timeout() {
    let_go_while_the_peer_holds_on("rc+oob");
}
