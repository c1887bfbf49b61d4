//! Zero heap allocations per message in steady state, over every host
//! transport: the raw API and typed channels, both directions, with the
//! background I/O threads counted too.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use zerocast_mem::CountingAlloc;
use zerocast_tests::Transport;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

const WINDOW: u32 = 16;

/// Warm-up for the waiting path: the first time a thread blocks on a
/// channel, crossbeam creates that thread's waiting context once (one
/// allocation per thread, not per message). Make sure that happened.
fn block_once(client: &zerocast::Connection, server: &zerocast::Connection) {
    for c in [client, server] {
        assert!(matches!(c.recv_timeout(Duration::from_millis(5)), Err(zerocast::RecvError::Timeout)));
    }
}

/// Ping-pong in bursts: `burst` messages one way, the same back.
fn raw_rounds(client: &zerocast::Connection, server: &zerocast::Connection, rounds: usize, burst: usize) {
    let t = Duration::from_secs(10);
    for r in 0..rounds {
        for i in 0..burst {
            let mut b = client.alloc(64 + (i % 3) * 1000).expect("alloc");
            b[0] = r as u8;
            client.send(b).expect("send");
        }
        for _ in 0..burst {
            let m = server.recv_timeout(t).expect("recv");
            assert_eq!(m[0], r as u8);
            let mut b = server.alloc(m.len()).expect("alloc");
            b.copy_from_slice(&m);
            drop(m);
            server.send(b).expect("send back");
        }
        for _ in 0..burst {
            assert_eq!(client.recv_timeout(t).expect("recv back")[0], r as u8);
        }
    }
}

fn raw(t: &Transport) {
    let (client, server) = t.pair();
    raw_rounds(&client, &server, 2_000, 8);
    block_once(&client, &server);
    let ((), n) = CountingAlloc::count(|| raw_rounds(&client, &server, 10_000, 8));
    assert_eq!(n, 0, "{n} heap allocations in 160 000 messages over {}", t.listen_uri);
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Tick {
    seq: u64,
    price: f64,
    qty: u32,
    symbol: [u8; 8],
}

fn typed(t: &Transport) {
    let (client, server) = t.pair();
    let probes = (client.clone(), server.clone());
    let (tx, rx_back) = client.split::<Tick, Tick>();
    let (tx_back, rx) = server.split::<Tick, Tick>();
    let timeout = Duration::from_secs(10);
    let run = |rounds: u64| {
        for seq in 0..rounds {
            let tick = Tick { seq, price: seq as f64 * 0.5, qty: 7, symbol: *b"ZCAST   " };
            tx.send(tick).expect("send");
            let got = rx.recv_timeout(timeout).expect("recv");
            tx_back.send(got).expect("echo");
            assert_eq!(rx_back.recv_timeout(timeout).expect("recv echo").seq, seq);
        }
    };
    run(5_000);
    block_once(&probes.0, &probes.1);
    let ((), n) = CountingAlloc::count(|| run(20_000));
    assert_eq!(n, 0, "{n} heap allocations in 40 000 typed messages over {}", t.listen_uri);
}

/// One test, so no other test's set-up allocates while a count runs (the
/// counter sees every thread of the process).
#[test]
fn steady_state_messages_do_not_allocate() {
    raw(&Transport::new("mem://zero-alloc-raw-{n}", WINDOW));
    raw(&Transport::new("tcp://127.0.0.1:0", WINDOW));
    typed(&Transport::new("mem://zero-alloc-typed-{n}", WINDOW));
    typed(&Transport::new("tcp://127.0.0.1:0", WINDOW));
}
