//! The conformance suite over `rc://` (rdma_cm) and `rc+oob://` (TCP side
//! channel), plus the RC backend's own promises: no RNR under a slow
//! receiver with `rnr_retry = 0`, typed work-completion errors, and the
//! completion modes.
//!
//! Every test needs a verbs device: they are ignored on a plain `cargo
//! test`; `scripts/test` runs them inside the Soft-RoCE guest, serially
//! (`--test-threads=1`: rxe drops completions under many concurrent QPs).

#![cfg(feature = "rdma")]

use std::thread;
use std::time::{Duration, Instant};

use zerocast::rdma::{CompletionMode, RcConfig, RcError};
use zerocast::{Config, ConnError, ErrorKind, LinkConfig, RecvError, Scheme, SendError, Zerocast};
use zerocast_tests::{readiness, rnr_counters, suite, Transport};

/// The address rxe0 is bound to in the guest.
fn addr() -> String {
    std::env::var("ZEROCAST_RDMA_ADDR").unwrap_or_else(|_| "10.0.2.15".to_owned())
}

fn uri(scheme: &str) -> &'static str {
    Box::leak(format!("{scheme}://{}:0", addr()).into_boxed_str())
}

fn transport_with(scheme: &str, window: u32, rc: RcConfig) -> Transport {
    let cfg = Config::default().with_link(LinkConfig::default().with_recv_window(window)).with_rc(rc);
    Transport { zc: Zerocast::with_config(cfg), listen_uri: uri(scheme) }
}

/// Every registered RC buffer is back in its pool.
fn assert_rc_pool_drained(t: &Transport) {
    zerocast_tests::assert_pool_drained(t.zc.rc().expect("rc transport").pool(), Duration::from_secs(10));
}

macro_rules! conformance {
    ($name:ident, $scheme:expr, $expected:expr) => {
        mod $name {
            use super::*;

            const WINDOW: u32 = 16;

            fn transport() -> Transport {
                transport_with($scheme, WINDOW, RcConfig::default())
            }

            fn run(f: impl FnOnce(&Transport)) {
                let t = transport();
                let start = Instant::now();
                f(&t);
                assert_rc_pool_drained(&t);
                println!("{} took {:?}", $scheme, start.elapsed());
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn integrity_100k_mixed_sizes() {
                run(|t| suite::integrity(t, 100_000));
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn poller_two_threads_serve_many() {
                run(|t| readiness::two_threads_serve_many(t, 50, 10));
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn poller_no_arrival_untold() {
                run(|t| readiness::no_arrival_untold(t, 5_000));
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn poller_end_and_registration() {
                run(readiness::end_and_registration);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn backpressure() {
                run(|t| suite::backpressure(t, WINDOW));
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn disconnect() {
                run(suite::disconnect);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn close_and_wait() {
                run(suite::close_and_wait);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn drop_right_after_sending() {
                run(suite::drop_right_after_sending);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn typed_disconnect() {
                run(suite::typed_disconnect);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn typed_roundtrip() {
                run(suite::typed_roundtrip);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn borrowed_receive() {
                run(|t| suite::borrowed_receive(t, WINDOW));
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn bad_message_is_typed_error() {
                run(suite::bad_message_is_typed_error);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn oversize_is_rejected() {
                run(suite::oversize_is_rejected);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn listener_close_releases_accept() {
                run(suite::listener_close_releases_accept);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn typed_check_mismatch() {
                run(suite::typed_check_mismatch);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn try_accept_and_accept_timeout() {
                run(suite::try_accept_and_accept_timeout);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn typed_check_match() {
                run(|t| suite::typed_check_match(t, WINDOW));
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn handles_close_their_own_side() {
                run(suite::handles_close_their_own_side);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn receivers_take_turns() {
                run(suite::receivers_take_turns);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn iter_results() {
                run(suite::iter_results);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn typed_check_off() {
                run(suite::typed_check_off);
            }

            /// Both ends report the scheme they connected with.
            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn scheme_is_reported() {
                run(|t| {
                    let (client, server) = t.pair();
                    assert_eq!(client.scheme(), $expected, "client of {}", $scheme);
                    assert_eq!(server.scheme(), $expected, "server of {}", $scheme);
                    assert_eq!(client.peer().scheme(), $expected);
                });
            }
        }
    };
}

conformance!(rc, "rc", Scheme::Rc);
conformance!(rc_oob, "rc+oob", Scheme::RcOob);

/// Integrity with a busy-polling completion thread instead of the channel.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn busy_poll_mode_integrity() {
    let t = transport_with("rc", 16, RcConfig::default().with_completion(CompletionMode::BusyPoll));
    suite::integrity(&t, 20_000);
    assert_rc_pool_drained(&t);
}

/// Integrity with receiving threads sleeping until a completion event
/// (`ibv_req_notify_cq`, the engine's channel read with
/// `ibv_get_cq_event`), the default, named here.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn completion_channel_mode_integrity() {
    let t = transport_with("rc", 16, RcConfig::default().with_completion(CompletionMode::Channel));
    suite::integrity(&t, 20_000);
    assert_rc_pool_drained(&t);
}

/// `timeout = 0` (wait forever on rxe) is refused with a message.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn zero_timeout_is_refused() {
    let t = transport_with("rc", 16, RcConfig::default().with_timeout(0, 7));
    let err = t.zc.rc().expect_err("timeout 0 must be refused");
    assert!(format!("{err:?}").contains("timeout 0"), "{err:?}");
}

/// Messages in the no-RNR test (about 110 s under TCG).
const RNR_MESSAGES: u64 = 200_000;

/// With `rnr_retry = 0`, any RNR is a hard error. A receiver that sleeps
/// between receives still sees every message, and the device's RNR
/// counters do not move: credits never let a send overtake a receive.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn no_rnr_under_slow_receiver() {
    let t = transport_with("rc", 16, RcConfig::default().with_rnr_retry(0));
    let before = rnr_counters();
    let (client, server) = t.pair();
    let start = Instant::now();
    let sender = thread::spawn(move || {
        for i in 0..RNR_MESSAGES {
            let mut buf = client.alloc(64).expect("alloc");
            buf[..8].copy_from_slice(&i.to_le_bytes());
            client.send(buf).expect("send");
        }
        client.close();
    });
    let mut n = 0u64;
    loop {
        match server.recv_timeout(Duration::from_secs(30)) {
            Ok(msg) => {
                assert_eq!(u64::from_le_bytes(msg[..8].try_into().expect("8 bytes")), n);
                n += 1;
                if n & 15 == 0 {
                    thread::sleep(Duration::from_millis(1));
                }
            }
            Err(RecvError::Disconnected) => break,
            Err(e) => panic!("receive failed after {n}: {e:?}"),
        }
    }
    sender.join().expect("sender");
    assert_eq!(n, RNR_MESSAGES);
    let after = rnr_counters();
    println!(
        "{RNR_MESSAGES} messages in {:?}; rnr counters before {before:?} after {after:?}",
        start.elapsed()
    );
    assert_eq!(before, after, "RNR happened: (rcvd_rnr_err, send_rnr_err) changed");
    drop(server);
    assert_rc_pool_drained(&t);
}

fn rc_error(e: &ConnError) -> Option<&RcError> {
    match e {
        ConnError::Transport { source, .. } => source.downcast_ref::<RcError>(),
        _ => None,
    }
}

/// The control run: with credits disabled (buffers are not reposted, but
/// their credit is returned), the sender overruns the receiver and sees a
/// typed RNR error within a second. This proves the test above can fail.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn rnr_without_credits_is_a_typed_error() {
    let mut rc = RcConfig::default().with_rnr_retry(0);
    rc.unsafe_ignore_credits_for_tests = true;
    let t = transport_with("rc", 16, rc);
    let (client, server) = t.pair();
    let (ended_tx, ended) = std::sync::mpsc::channel();
    let reader = thread::spawn(move || {
        // Read (and so release) whatever arrives, until the end.
        let end = loop {
            if let Err(e) = server.recv_timeout(Duration::from_secs(5)) {
                break e;
            }
        };
        let _ = ended_tx.send(end);
    });
    let start = Instant::now();
    let err = loop {
        let buf = client.alloc(64).expect("alloc");
        match client.send_timeout(buf, Duration::from_secs(1)) {
            Ok(()) => {}
            Err(SendError::Failed(_, e)) => break e,
            Err(e) => panic!("expected a failure, got {e}"),
        }
        assert!(start.elapsed() < Duration::from_secs(5), "no RNR error without credits");
    };
    let took = start.elapsed();
    println!("RNR error after {took:?}: {err}: {:?}", rc_error(&err).map(ToString::to_string));
    assert!(matches!(rc_error(&err), Some(RcError::RnrRetryExceeded)), "not an RNR error: {err:?}");
    assert!(took < Duration::from_secs(1), "RNR took {took:?}");
    drop(client);
    // The server posted no receive (credits were ignored), so no flush
    // completion tells it the peer left: its receiver must still see the
    // end, as a typed error, well within its own 5 s deadline.
    let end = ended.recv_timeout(Duration::from_secs(10)).expect("server's receiver never saw the end");
    println!("server's receiver ended with: {end}");
    assert!(
        matches!(end, RecvError::Failed(_) | RecvError::Disconnected),
        "server's receiver timed out instead of seeing the peer leave: {end:?}"
    );
    reader.join().expect("reader");
}

/// Set in the child process of [`peer_killed_mid_stream`]: the URI to connect to.
const PEER_CHILD_ENV: &str = "ZEROCAST_RC_PEER_CHILD";

/// The child: connect and read forever (until killed).
fn peer_child(uri: &str) {
    let conn = Zerocast::new().connect(uri).expect("child connect");
    while conn.recv_timeout(Duration::from_secs(60)).is_ok() {}
}

fn peer_killed(scheme: &str, test_name: &str) {
    if let Ok(uri) = std::env::var(PEER_CHILD_ENV) {
        peer_child(&uri);
        return;
    }
    let t = transport_with(scheme, 16, RcConfig::default());
    let listener = t.zc.listen(t.listen_uri).expect("listen");
    let at = listener.local_endpoint().to_string();
    let mut child = std::process::Command::new(std::env::current_exe().expect("current exe"))
        .args(["--ignored", "--exact", test_name, "--nocapture", "--test-threads=1"])
        .env(PEER_CHILD_ENV, &at)
        .spawn()
        .expect("spawn child");
    let conn = listener.accept().expect("accept");
    for i in 0..200u32 {
        let mut buf = conn.alloc(1024).expect("alloc");
        buf[..4].copy_from_slice(&i.to_le_bytes());
        conn.send(buf).expect("send before the kill");
    }
    child.kill().expect("kill child");
    let killed = Instant::now();
    let _ = child.wait();
    let err = loop {
        let buf = conn.alloc(1024).expect("alloc");
        match conn.send_timeout(buf, Duration::from_millis(100)) {
            Ok(()) | Err(SendError::Timeout(_)) => {}
            Err(SendError::Failed(_, e)) => break e,
            Err(e) => panic!("expected a failure, got {e:?}"),
        }
        assert!(killed.elapsed() < Duration::from_secs(5), "no error within 5 s of the peer's death");
    };
    let took = killed.elapsed();
    println!(
        "{scheme}: peer killed, typed error after {took:?}: {err}: {:?}",
        rc_error(&err).map(ToString::to_string)
    );
    // The kind is what every transport shares. Which RC error carries it
    // depends on what reaches this side first: the peer's DISCONNECTED, the
    // retries running out, or a send completing against the dead peer's
    // QP (`IBV_WC_REM_OP_ERR`).
    assert_eq!(err.kind(), ErrorKind::PeerGone, "{err:?}");
    assert!(
        matches!(
            rc_error(&err),
            Some(
                RcError::PeerDisconnected
                    | RcError::RetryExceeded
                    | RcError::Completion { name: "IBV_WC_REM_OP_ERR", .. }
            )
        ),
        "not a peer-gone error: {err:?}"
    );
    drop(conn);
    drop(listener);
    assert_rc_pool_drained(&t);
}

/// A peer process killed mid-stream: the sender sees a typed error within
/// 5 s (TCG is slow) and every buffer returns to the pool.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn peer_killed_mid_stream() {
    peer_killed("rc", "peer_killed_mid_stream");
}

/// As [`peer_killed_mid_stream`], over the TCP side channel.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn peer_killed_mid_stream_oob() {
    peer_killed("rc+oob", "peer_killed_mid_stream_oob");
}

/// `rc+oob://`: peers that send garbage on the side channel or hang up at
/// once are counted as failed handshakes, never returned by the accept
/// that waits meanwhile; it hands out the good client that comes next.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn oob_failed_handshakes_are_counted_not_returned() {
    use std::io::Write;
    const BAD: u64 = 20;
    let t = transport_with("rc+oob", 16, RcConfig::default());
    let listener = t.listen();
    let addr: std::net::SocketAddr = listener.local_endpoint().authority().parse().expect("address");
    thread::scope(|s| {
        let acceptor = s.spawn(|| listener.accept());
        for i in 0..BAD {
            let mut c = std::net::TcpStream::connect(addr).expect("connect");
            if i % 2 == 0 {
                let _ = c.write_all(&[0x5a; 100]);
            }
        }
        let start = Instant::now();
        while listener.stats().handshakes_failed < BAD {
            assert!(start.elapsed() < Duration::from_secs(60), "not counted: {:?}", listener.stats());
            thread::sleep(Duration::from_millis(5));
        }
        assert!(!acceptor.is_finished(), "accept returned for a bad peer");
        let client = t.zc.connect(&listener.local_endpoint().to_string()).expect("a good client connects");
        let server = acceptor.join().expect("accept thread").expect("the good client is accepted");
        let mut buf = client.alloc(2).expect("alloc");
        buf.copy_from_slice(b"ok");
        client.send(buf).expect("send");
        assert_eq!(&*server.recv_timeout(Duration::from_secs(10)).expect("recv"), b"ok");
    });
    let stats = listener.stats();
    assert_eq!((stats.accepted, stats.handshakes_failed), (1, BAD), "{stats:?}");
    drop(listener);
    assert_rc_pool_drained(&t);
}
