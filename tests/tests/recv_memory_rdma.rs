//! The RC receive-memory budget (`RcConfig::recv_memory`): a listener
//! whose budget holds one connection at the configured receive shape and
//! two at the lean one gives them exactly that, refuses a fourth with a
//! typed error the client sees as `Refused`, carries checksummed messages
//! (eager and, past the lean 8 KiB buffers, by rendezvous) on all three
//! with `rnr_retry = 0`, and takes a new connection once one closes and
//! its QP is gone. Over `rc://` and `rc+oob://`.
//!
//! They need a verbs device: ignored on a plain `cargo test`;
//! `scripts/test` runs them inside the Soft-RoCE guest.

#![cfg(feature = "rdma")]

use std::thread;
use std::time::{Duration, Instant};

use zerocast::rdma::{RcConfig, RENDEZVOUS_RECEIVES};
use zerocast::{Config, Connection, Listener, Zerocast};
use zerocast_tests::{assert_one_more_refused, checksum, rnr_counters};

/// The configured shape at defaults: a window of 64 buffers of 64 KiB.
const FULL: usize = (64 + RENDEZVOUS_RECEIVES) * (64 << 10);
/// The lean shape: a window of 8 buffers of 8 KiB.
const LEAN: usize = (8 + RENDEZVOUS_RECEIVES) * (8 << 10);

fn addr() -> String {
    std::env::var("ZEROCAST_RDMA_ADDR").unwrap_or_else(|_| "10.0.2.15".to_owned())
}

fn zerocast(recv_memory: Option<usize>) -> Zerocast {
    let rc = RcConfig::default().with_rnr_retry(0).with_recv_memory(recv_memory);
    Zerocast::with_config(Config::default().with_rc(rc))
}

fn reserved(zc: &Zerocast) -> usize {
    zc.rc().expect("rc transport").recv_memory().reserved
}

/// Connect a client of `clients` and accept it: (client, server).
fn pair(clients: &Zerocast, listener: &Listener) -> (Connection, Connection) {
    let (zc, at) = (clients.clone(), listener.local_endpoint().to_string());
    let client = thread::spawn(move || zc.connect(&at));
    let server = listener.accept_timeout(Duration::from_secs(30)).expect("accept");
    (client.join().expect("connect thread").expect("connect"), server)
}

/// Messages of 64 B to 60 KB each way, checked.
fn exchange(client: &Connection, server: &Connection) {
    for (seq, len) in [64usize, 2_000, 20_000, 60_000].into_iter().enumerate() {
        for (from, to) in [(client, server), (server, client)] {
            let mut msg = from.alloc(len).expect("alloc");
            checksum::write(seq as u64, &mut msg);
            from.send_timeout(msg, Duration::from_secs(30)).expect("send");
            let got = to.recv_timeout(Duration::from_secs(30)).expect("recv");
            assert_eq!(checksum::verify(&got), Ok(seq as u64));
            assert_eq!(got.len(), len);
        }
    }
}

fn budget_shapes_refuses_and_recovers(scheme: &str) {
    let rnr = rnr_counters();
    let server_zc = zerocast(Some(FULL + 2 * LEAN));
    let clients = zerocast(None);
    let listener = server_zc.listen(&format!("{scheme}://{}:0", addr())).expect("listen");

    let mut pairs = vec![pair(&clients, &listener)];
    assert_eq!(reserved(&server_zc), FULL, "the first connection gets the configured shape");
    pairs.push(pair(&clients, &listener));
    pairs.push(pair(&clients, &listener));
    assert_eq!(reserved(&server_zc), FULL + 2 * LEAN, "then lean ones");

    // A fourth: refused at the listener, `Refused` at the client.
    assert_one_more_refused(&clients, &listener, "receive memory");

    for (client, server) in &pairs {
        exchange(client, server);
    }

    // One lean connection closes: once its QP is gone, a new one fits.
    let (client, server) = pairs.pop().expect("a pair");
    client.close();
    drop(client);
    drop(server);
    let deadline = Instant::now() + Duration::from_secs(60);
    while reserved(&server_zc) > FULL + LEAN {
        assert!(Instant::now() < deadline, "the closed connection's receive memory was not returned");
        thread::sleep(Duration::from_millis(10));
    }
    let (client, server) = pair(&clients, &listener);
    assert_eq!(reserved(&server_zc), FULL + 2 * LEAN);
    exchange(&client, &server);
    assert_eq!(rnr_counters(), rnr, "RNR counters (received, sent) moved");
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn rc_receive_memory_budget_shapes_refuses_and_recovers() {
    budget_shapes_refuses_and_recovers("rc");
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn rc_oob_receive_memory_budget_shapes_refuses_and_recovers() {
    budget_shapes_refuses_and_recovers("rc+oob");
}
