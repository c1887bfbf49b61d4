//! Zero heap allocations per message in steady state, over every
//! connection transport: the raw API and typed channels, both directions,
//! with the background I/O threads counted too, and datagrams. `mem://`,
//! `tcp://` and UDP run on the host; `rc://`, `rc+oob://` and RDMA UD need a
//! verbs device, so that test is ignored on a plain `cargo test` and
//! `scripts/test` runs it inside the Soft-RoCE guest.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use zerocast::datagram::{Backend, DatagramSocket};
use zerocast::Zerocast;
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

/// Warm-up for the staging path: a stream socket's connection makes its
/// two staging areas once, when a sender first stages a small frame (see
/// `zerocast_link`'s `staged`), which happens only under load: when more
/// than a few frames are in flight. Whether the bursts of `raw_rounds`
/// ever get there depends on timing, so a burst of small messages with
/// none received in between takes each side there once, for sure.
///
/// The burst is what a sender can count on while its receiver takes
/// nothing: the window less the credit reserved for credit frames, less
/// the credits the receiver may still owe from earlier messages, which
/// wait for its next frame until they reach half its window (an RDMA
/// receive buffer that its engine reposted after the last reply). A
/// longer burst from this one thread would wait for them forever.
fn stage_once(client: &zerocast::Connection, server: &zerocast::Connection) {
    const BURST: u8 = (WINDOW - 1 - (WINDOW.div_ceil(2) - 1)) as u8;
    let t = Duration::from_secs(10);
    for (from, to) in [(client, server), (server, client)] {
        for i in 0..BURST {
            let mut b = from.alloc(64).expect("alloc");
            b[0] = i;
            from.send(b).expect("send");
        }
        for i in 0..BURST {
            assert_eq!(to.recv_timeout(t).expect("recv")[0], i);
        }
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

/// `rounds` bursts of 8 each way counted, after a fifth as many to warm up.
fn raw(t: &Transport, rounds: usize) {
    let (client, server) = t.pair();
    raw_rounds(&client, &server, rounds / 5, 8);
    stage_once(&client, &server);
    block_once(&client, &server);
    let ((), n) = CountingAlloc::count(|| raw_rounds(&client, &server, rounds, 8));
    assert_eq!(n, 0, "{n} heap allocations in {} messages over {}", rounds * 16, t.listen_uri);
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Tick {
    seq: u64,
    price: f64,
    qty: u32,
    symbol: [u8; 8],
}

/// `rounds` typed round trips counted, after a quarter as many to warm up.
fn typed(t: &Transport, rounds: u64) {
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
    run(rounds / 4);
    block_once(&probes.0, &probes.1);
    let ((), n) = CountingAlloc::count(|| run(rounds));
    assert_eq!(n, 0, "{n} heap allocations in {} typed messages over {}", rounds * 2, t.listen_uri);
}

/// Datagram ping-pong, one in flight: `a` sends a pool buffer to `b`,
/// which echoes it from a buffer of its own. One at a time, so an
/// unreliable transport on a loopback has nothing to drop.
fn datagram_rounds(a: &DatagramSocket, b: &DatagramSocket, rounds: usize) {
    let wait = Duration::from_secs(10);
    let to_b = b.local_addr();
    for r in 0..rounds {
        let mut d = a.alloc(64 + (r % 3) * 300, None).expect("alloc");
        d[0] = r as u8;
        a.send_to(d, &to_b).map_err(|(_, e)| e).expect("send");
        let (got, from) = b.recv_from(Some(Instant::now() + wait)).expect("recv");
        assert_eq!(got[0], r as u8);
        let mut back = b.alloc(got.len(), None).expect("alloc");
        back.copy_from_slice(&got);
        drop(got);
        b.send_to(back, &from).map_err(|(_, e)| e).expect("echo");
        let (echo, _) = a.recv_from(Some(Instant::now() + wait)).expect("recv echo");
        assert_eq!(echo[0], r as u8);
    }
}

/// `rounds` datagram round trips between two sockets bound at `uri`
/// counted, after a fifth as many to warm up (address handles, per-source
/// sequence tables).
fn datagrams(zc: &Zerocast, uri: &str, backend: Backend, rounds: usize) {
    let (a, b) = (zc.bind_datagram(uri).expect("bind"), zc.bind_datagram(uri).expect("bind"));
    assert_eq!(a.backend(), backend, "the datagram backend of {uri}");
    datagram_rounds(&a, &b, rounds / 5);
    let ((), n) = CountingAlloc::count(|| datagram_rounds(&a, &b, rounds));
    assert_eq!(n, 0, "{n} heap allocations in {} datagrams over {uri} ({backend:?})", rounds * 2);
}

/// One test, so no other test's set-up allocates while a count runs (the
/// counter sees every thread of the process).
#[test]
fn steady_state_messages_do_not_allocate() {
    raw(&Transport::new("mem://zero-alloc-raw-{n}", WINDOW), 10_000);
    raw(&Transport::new("tcp://127.0.0.1:0", WINDOW), 10_000);
    typed(&Transport::new("mem://zero-alloc-typed-{n}", WINDOW), 20_000);
    typed(&Transport::new("tcp://127.0.0.1:0", WINDOW), 20_000);
    datagrams(&Zerocast::new(), "ud://127.0.0.1:0", Backend::Udp, 20_000);
}

/// RC over rdma_cm and over the TCP side channel, with an eager limit of
/// 1 KiB so that the 64 B messages of a burst go as sends into receive
/// buffers and the 1,064 B and 2,064 B ones by rendezvous (an RDMA READ
/// from the sender's pool buffer and a finish): both paths are counted.
/// Both completion modes are counted: busy polling and channel events.
/// Then datagrams over RDMA UD.
#[cfg(feature = "rdma")]
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn rdma_steady_state_messages_do_not_allocate() {
    use zerocast::rdma::{CompletionMode, RcConfig};
    use zerocast::{Config, LinkConfig};

    let addr = std::env::var("ZEROCAST_RDMA_ADDR").unwrap_or_else(|_| "10.0.2.15".to_owned());
    for scheme in ["rc", "rc+oob"] {
        for mode in [CompletionMode::BusyPoll, CompletionMode::Channel] {
            println!("{scheme}:// with {mode:?} completions");
            let rc = RcConfig::default().with_eager_limit(1024).with_completion(mode);
            let link = LinkConfig::default().with_recv_window(WINDOW);
            let uri = Box::leak(format!("{scheme}://{addr}:0").into_boxed_str());
            let t = Transport {
                zc: Zerocast::with_config(Config::default().with_link(link).with_rc(rc)),
                listen_uri: uri,
            };
            // Fewer than on the host: the guest's CPU is emulated.
            raw(&t, 2_000);
            typed(&t, 4_000);
        }
    }
    // RDMA UD, bound on the device's address.
    datagrams(&Zerocast::new(), &format!("ud://{addr}:0"), Backend::RdmaUd, 4_000);
}
