//! RC listeners with a shared receive queue (`?srq=N`): many connections
//! drawing on one SRQ, each with a fixed share of it as its credit window.
//!
//! Every test runs with `rnr_retry = 0`, so a single receive missing when a
//! message arrives would be a hard error, and checks rxe's RNR counters.
//! They need a verbs device: ignored on a plain `cargo test`;
//! `scripts/test` runs them inside the Soft-RoCE guest.

#![cfg(feature = "rdma")]

use std::thread;
use std::time::{Duration, Instant};

use zerocast::rdma::{RcConfig, SrqStats, RENDEZVOUS_RECEIVES};
use zerocast::{Config, Connection, LinkConfig, Listener, RecvError, Zerocast};
use zerocast_tests::{checksum, rnr_counters};

/// Largest message: small receive buffers keep 64 connections' memory low.
const MAX_PAYLOAD: u64 = 16 << 10;

fn addr() -> String {
    std::env::var("ZEROCAST_RDMA_ADDR").unwrap_or_else(|_| "10.0.2.15".to_owned())
}

fn zerocast(window: u32) -> Zerocast {
    let link = LinkConfig::default().with_recv_window(window).with_max_payload(MAX_PAYLOAD);
    Zerocast::with_config(Config::default().with_link(link).with_rc(RcConfig::default().with_rnr_retry(0)))
}

fn stats(l: &Listener) -> SrqStats {
    l.as_rc().and_then(|rc| rc.srq_stats()).expect("the listener has an SRQ")
}

/// Connect `n` clients to `listener`: (client, server) pairs.
fn connect_all(zc: &Zerocast, listener: &Listener, n: usize) -> Vec<(Connection, Connection)> {
    let at = listener.local_endpoint().to_string();
    (0..n)
        .map(|i| {
            let (zc, at) = (zc.clone(), at.clone());
            let client = thread::spawn(move || zc.connect(&at));
            let server = listener.accept().unwrap_or_else(|e| panic!("accept #{i}: {e:?}"));
            let client =
                client.join().expect("connect thread").unwrap_or_else(|e| panic!("connect #{i}: {e:?}"));
            (client, server)
        })
        .collect()
}

/// Stream `n` checksummed messages from every client to its server
/// connection at once; every one is verified, in order.
fn stream(pairs: &[(Connection, Connection)], n: u64) {
    thread::scope(|s| {
        for (i, (client, server)) in pairs.iter().enumerate() {
            s.spawn(move || {
                for seq in 0..n {
                    let size = checksum::size_for(seq ^ ((i as u64) << 32), MAX_PAYLOAD as usize);
                    let mut buf = client.alloc(size).expect("alloc");
                    checksum::write(seq, &mut buf);
                    client
                        .send_timeout(buf, Duration::from_secs(60))
                        .unwrap_or_else(|e| panic!("connection {i}: send {seq}: {e}"));
                }
            });
            s.spawn(move || {
                for seq in 0..n {
                    let msg = server
                        .recv_timeout(Duration::from_secs(60))
                        .unwrap_or_else(|e| panic!("connection {i}: receive {seq}: {e:?}"));
                    let got = checksum::verify(&msg).unwrap_or_else(|e| panic!("connection {i}: {e}"));
                    assert_eq!(got, seq, "connection {i}: out of order");
                }
            });
        }
    });
}

/// Close every pair and wait for both ends to see the end.
fn close_all(pairs: Vec<(Connection, Connection)>) {
    for (client, server) in pairs {
        client.close();
        match server.recv_timeout(Duration::from_secs(30)) {
            Err(RecvError::Disconnected) => {}
            other => panic!("expected the client's goodbye, got {other:?}"),
        }
        drop(server);
        match client.recv_timeout(Duration::from_secs(30)) {
            Err(RecvError::Disconnected) => {}
            other => panic!("expected the server's goodbye, got {other:?}"),
        }
    }
}

/// Wait until `f(stats)` holds, or fail with the last stats.
fn wait_for(l: &Listener, what: &str, f: impl Fn(&SrqStats) -> bool) -> SrqStats {
    let start = Instant::now();
    loop {
        let s = stats(l);
        if f(&s) {
            return s;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{what}: {s:?}");
        thread::sleep(Duration::from_millis(20));
    }
}

/// 64 connections on one SRQ of 64 shares of 4 + 8 receives (`rc://`, rdma_cm), all
/// streaming checksummed messages at once with `rnr_retry = 0`: every
/// message arrives intact and in order, rxe counts no RNR, a 65th
/// connection is refused, and every buffer is back after the close.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn sixty_four_connections_share_one_srq() {
    const CONNS: usize = 64;
    const WINDOW: u32 = 4;
    const SHARE: u32 = WINDOW + RENDEZVOUS_RECEIVES as u32;
    const MESSAGES: u64 = 200;
    let zc = zerocast(WINDOW);
    let listener =
        zc.listen(&format!("rc://{}:0?srq={}", addr(), CONNS as u32 * SHARE)).expect("listen with an SRQ");
    let before = rnr_counters();
    let start = Instant::now();
    let pairs = connect_all(&zc, &listener, CONNS);
    let s = stats(&listener);
    println!("{CONNS} connections in {:?}: {s:?}", start.elapsed());
    assert_eq!(
        (s.capacity, s.share, s.max_connections, s.connections),
        (CONNS * SHARE as usize, SHARE as usize, CONNS, CONNS)
    );
    zerocast_tests::assert_one_more_refused(&zc, &listener, "shared receive queue");

    let start = Instant::now();
    stream(&pairs, MESSAGES);
    let s = stats(&listener);
    println!("{} messages over {CONNS} connections in {:?}: {s:?}", MESSAGES * CONNS as u64, start.elapsed());
    assert_eq!(rnr_counters(), before, "RNR happened: (rcvd_rnr_err, send_rnr_err) changed");

    close_all(pairs);
    let s = wait_for(&listener, "connections leave the SRQ", |s| s.connections == 0);
    println!("after close: {s:?}");
    drop(listener);
    zerocast_tests::assert_pool_drained(zc.rc().expect("rc").pool(), Duration::from_secs(20));
}

/// The SRQ limit event refills the queue (`rc+oob://`): four connections
/// of window 8 on an SRQ of four shares, its limit just above what is left
/// posted once the server holds every message. The server holds every
/// message its peers can send (seven each: one credit stays reserved), so
/// fewer than 8 receives stay posted; the device raises
/// `IBV_EVENT_SRQ_LIMIT_REACHED` and the handler posts fresh buffers.
/// Released messages then find the SRQ full and go back to the pool. A
/// stream afterwards is intact, with no RNR, and the pool drains.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn srq_limit_event_refills() {
    const CONNS: usize = 4;
    const WINDOW: u32 = 8;
    // Room for four shares; the limit sits above what four held windows
    // leave posted, so holding them raises the event.
    const CAPACITY: usize = CONNS * (WINDOW as usize + RENDEZVOUS_RECEIVES);
    const LIMIT: usize = CAPACITY - CONNS * (WINDOW as usize - 1) + 4;
    let zc = zerocast(WINDOW);
    let listener = zc
        .listen(&format!("rc+oob://{}:0?srq={CAPACITY}&srq_limit={LIMIT}", addr()))
        .expect("listen with an SRQ");
    let before = rnr_counters();
    let pairs = connect_all(&zc, &listener, CONNS);
    let s = stats(&listener);
    assert_eq!(
        (s.capacity, s.posted, s.limit as usize, s.limit_events),
        (CAPACITY, CAPACITY, LIMIT, 0),
        "{s:?}"
    );
    zerocast_tests::assert_one_more_refused(&zc, &listener, "shared receive queue");

    // Each peer spends its whole window; the server holds the messages.
    let mut held = Vec::new();
    for (i, (client, server)) in pairs.iter().enumerate() {
        for seq in 0..u64::from(WINDOW) - 1 {
            let mut buf = client.alloc(64).expect("alloc");
            checksum::write(seq, &mut buf);
            client
                .send_timeout(buf, Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("{i}: send {seq}: {e}"));
        }
        for seq in 0..u64::from(WINDOW) - 1 {
            let msg = server.recv_timeout(Duration::from_secs(10)).expect("receive");
            assert_eq!(checksum::verify(&msg), Ok(seq));
            held.push(msg);
        }
    }
    let s =
        wait_for(&listener, "the limit event refills the SRQ", |s| s.limit_events > 0 && s.event_refills > 0);
    println!("holding {} messages: {s:?}", held.len());
    assert!(s.posted >= s.limit as usize, "refilled above the limit: {s:?}");

    // Released buffers find the SRQ (nearly) full: back to the pool.
    drop(held);
    let s = wait_for(&listener, "released buffers are reposted or dropped", |s| s.dropped_when_full > 0);
    println!("after release: {s:?}");

    stream(&pairs, 2_000);
    assert_eq!(rnr_counters(), before, "RNR happened: (rcvd_rnr_err, send_rnr_err) changed");
    close_all(pairs);
    wait_for(&listener, "connections leave the SRQ", |s| s.connections == 0);
    drop(listener);
    zerocast_tests::assert_pool_drained(zc.rc().expect("rc").pool(), Duration::from_secs(20));
}
