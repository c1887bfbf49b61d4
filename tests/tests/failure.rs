//! Failure detection and cleanup over every connection transport: a peer
//! process killed mid-stream, a silent peer caught by heartbeats (a stopped
//! process, a raw socket that goes quiet, a veth link set down), and
//! reconnecting to a restarted peer, with RDMA resources back to baseline.
//!
//! `tcp://` runs on the host. The veth test and the `rc://` / `rc+oob://`
//! tests need the Soft-RoCE guest (root, network namespaces, rxe) and are
//! ignored on a plain `cargo test`; `scripts/test` runs them there.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use zerocast::core::handshake::HELLO_LEN;
use zerocast::core::{FrameKind, Header, Hello, HEADER_LEN};
use zerocast::{Config, ConnError, LinkConfig, RecvError, SendError, Zerocast};
use zerocast_tests::failure::{self, Peer};
use zerocast_tests::Transport;

const HB: Duration = Duration::from_millis(200);

fn tcp(heartbeat: Option<Duration>) -> Transport {
    let link = LinkConfig::default().with_recv_window(16).with_heartbeat(heartbeat);
    Transport {
        zc: Zerocast::with_config(Config::default().with_link(link)),
        listen_uri: "tcp://127.0.0.1:0",
    }
}

fn pool(t: &Transport) -> zerocast::Pool {
    t.zc.pool().expect("pool")
}

/// SIGKILL of a reading peer: a typed error in well under a second on the
/// host, the bystander connection unharmed, every buffer back.
#[test]
fn tcp_peer_killed_mid_stream() {
    if failure::child_main() {
        return;
    }
    let t = tcp(None);
    let r = failure::peer_killed(&t, &pool(&t), "tcp_peer_killed_mid_stream", Duration::from_secs(1));
    println!("tcp: peer killed, typed error after {:?}: {}", r.detected, r.error);
    println!("tcp: bystander verified {} messages after the kill", r.bystander_after);
    assert!(matches!(r.error, ConnError::Aborted | ConnError::Io(_)), "not a peer-gone error: {:?}", r.error);
}

/// A stopped peer process (its kernel still ACKs): heartbeats catch it.
#[test]
fn tcp_peer_stopped_detected_by_heartbeat() {
    if failure::child_main() {
        return;
    }
    let t = tcp(Some(HB));
    let took = failure::peer_stopped(&t, &pool(&t), "tcp_peer_stopped_detected_by_heartbeat", HB);
    println!("tcp: SIGSTOPped peer detected after {took:?} (heartbeat {HB:?})");
}

/// A raw socket peer completes the handshake (without heartbeats of its
/// own) and goes silent, reading nothing: our writer blocks on a full
/// socket, and the heartbeat check still fails the connection in time.
#[test]
fn tcp_silent_raw_peer_detected_by_heartbeat() {
    let t = tcp(Some(HB));
    let listener = t.zc.listen("tcp://127.0.0.1:0").expect("listen");
    let addr = listener.local_endpoint().authority();
    let mut raw = TcpStream::connect(&addr).expect("connect");
    let hello = Hello { window: 64, credit_unit: 0, max_payload: 1 << 20, recv_buf_size: 0, heartbeat_ms: 0 };
    raw.write_all(&Header::new(FrameKind::Control, 0, 0, HELLO_LEN as u64).encode()).expect("write");
    raw.write_all(&hello.encode()).expect("write");
    let conn = listener.accept().expect("accept");
    let mut back = [0u8; HEADER_LEN + HELLO_LEN];
    raw.read_exact(&mut back).expect("our hello");
    let ours = Hello::decode(&back[HEADER_LEN..]).expect("hello");
    assert_eq!(ours.heartbeat_ms, 200, "the hello asks for heartbeats");
    let silent_since = Instant::now();
    // Fill the peer's window with large messages it never reads.
    let err = loop {
        let buf = conn.alloc(256 * 1024).expect("alloc");
        match conn.send_timeout(buf, Duration::from_millis(50)) {
            Ok(()) | Err(SendError::Timeout(_)) => {}
            Err(SendError::Failed(_, e)) => break e,
            Err(e) => panic!("expected a failure, got {e:?}"),
        }
        assert!(silent_since.elapsed() < Duration::from_secs(10), "no failure");
    };
    let took = silent_since.elapsed();
    println!("tcp: silent raw peer detected after {took:?}: {err}");
    failure::check_silence_detected(took, &err, HB);
    assert!(matches!(conn.recv_timeout(Duration::from_secs(1)), Err(RecvError::Failed(_))));
    drop(conn);
    drop(raw);
    t.assert_pool_drained(Duration::from_secs(10));
}

/// Heartbeats never fail a live connection: idle, or starved of credit by
/// a peer application that holds every buffer for many intervals.
#[test]
fn tcp_heartbeats_keep_idle_and_starved_connections_alive() {
    // Longer than elsewhere: what is checked here is that nothing fails,
    // and a loaded machine can delay a thread by several hundred ms.
    let hb = Duration::from_millis(500);
    let t = tcp(Some(hb));
    let (client, server) = t.pair();
    thread::sleep(hb * 6);
    for c in [&client, &server] {
        let beats = c.stats().credits.heartbeats_sent;
        assert!(beats >= 3, "only {beats} heartbeats in 6 intervals");
    }
    // The server holds every message: the client runs out of credit and
    // cannot send even a heartbeat for 6 intervals.
    // (Credits owed for heartbeats come back within an interval or two, so
    // keep sending for a while.)
    let mut held = Vec::new();
    let until = Instant::now() + hb * 4;
    while Instant::now() < until {
        let mut buf = client.alloc(1).expect("alloc");
        buf[0] = held.len() as u8;
        match client.send_timeout(buf, hb / 5) {
            Ok(()) => held.push(server.recv_timeout(Duration::from_secs(5)).expect("recv")),
            Err(SendError::Timeout(_)) => {}
            Err(e) => panic!("{e:?}"),
        }
    }
    let window = zerocast_tests::suite::credit_window(&client.stats(), 16);
    assert_eq!(held.len() as u32, window - 1, "a window less the reserved credit");
    let quiet = client.stats().credits.heartbeats_sent;
    thread::sleep(hb * 6);
    assert_eq!(client.stats().credits.heartbeats_sent, quiet, "a starved sender sent heartbeats");
    assert!(server.try_recv().is_err_and(|e| matches!(e, RecvError::Empty)), "server still up");
    drop(held);
    // Both directions still work.
    for (a, b) in [(&client, &server), (&server, &client)] {
        let mut buf = a.alloc(4).expect("alloc");
        buf.copy_from_slice(b"ping");
        a.send_timeout(buf, Duration::from_secs(5)).expect("send after the starvation");
        assert_eq!(&*b.recv_timeout(Duration::from_secs(5)).expect("recv"), b"ping");
    }
    thread::sleep(hb * 3);
    assert!(client.stats().credits.heartbeats_sent > quiet, "heartbeats resumed");
    drop((client, server));
    t.assert_pool_drained(Duration::from_secs(10));
}

/// A new connection to a restarted peer works after the old one failed.
#[test]
fn tcp_reconnect_to_restarted_peer() {
    if failure::child_main() {
        return;
    }
    let t = tcp(None);
    let name = "tcp_reconnect_to_restarted_peer";
    failure::reconnect(&t, &pool(&t), name, "tcp://127.0.0.1:0", Duration::from_secs(1));
}

/// Inside the guest: a peer process in its own network namespace, joined
/// by a veth pair, streams to us over TCP; our end of the link is set down
/// (no FIN, no RST reaches anyone). Heartbeats report it within three
/// intervals and half a second.
#[test]
#[ignore = "needs the Soft-RoCE guest (root, network namespaces): scripts/test runs it there"]
fn tcp_veth_link_down_detected_by_heartbeat() {
    if failure::child_main() {
        return;
    }
    let _ = std::process::Command::new("ip").args(["link", "del", "zcv0"]).output();
    failure::ip(&["link", "add", "zcv0", "type", "veth", "peer", "name", "zcv1"]);
    failure::ip(&["addr", "add", "10.77.0.1/24", "dev", "zcv0"]);
    failure::ip(&["link", "set", "zcv0", "up"]);
    let t = tcp(Some(HB));
    let listener = t.zc.listen("tcp://10.77.0.1:0").expect("listen");
    let at = listener.local_endpoint().to_string();
    let name = "tcp_veth_link_down_detected_by_heartbeat";
    let peer = Peer::spawn(name, "netns-streamer", &at, &["unshare", "--net"]);
    // Move the other end only once `unshare` has entered its namespace.
    let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/net")).ok();
    let start = Instant::now();
    while ns(&peer.pid().to_string()) == ns("self") {
        assert!(start.elapsed() < Duration::from_secs(20), "the peer never entered its namespace");
        thread::sleep(Duration::from_millis(10));
    }
    failure::ip(&["link", "set", "zcv1", "netns", &peer.pid().to_string()]);
    let (tx, rx) = std::sync::mpsc::channel();
    thread::spawn(move || tx.send(listener.accept()));
    let conn = rx.recv_timeout(Duration::from_secs(60)).expect("the peer connected").expect("accept");
    let (took, err) = failure::receive_until_silent(&conn, || failure::ip(&["link", "set", "zcv0", "down"]));
    println!("tcp over veth: link down detected after {took:?} (heartbeat {HB:?}): {err}");
    failure::check_silence_detected(took, &err, HB);
    drop(peer);
    drop(conn);
    let _ = std::process::Command::new("ip").args(["link", "del", "zcv0"]).output();
    t.assert_pool_drained(Duration::from_secs(10));
}

#[cfg(feature = "rdma")]
#[path = "failure/rdma.rs"]
mod rdma;
