//! Large messages over RC by rendezvous: the receiver RDMA-READs a message
//! larger than its receive buffers straight from the sender's pool buffer.
//! Raw and typed 16 MiB messages, order kept around them, the limit on
//! unfinished rendezvous, and every buffer back in the pool afterwards.
//!
//! Run inside the Soft-RoCE guest by `scripts/test`, serially.

#![cfg(feature = "rdma")]

use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use zerocast::rdma::RcConfig;
use zerocast::{Config, Connection, LinkConfig, PoolConfig, RecvError, Zerocast};
use zerocast_tests::{checksum, suite, Transport};

const MIB: usize = 1 << 20;
/// 16 MiB, plus room for a typed message's encoding.
const MAX_PAYLOAD: usize = 16 * MIB + 4096;

fn addr() -> String {
    std::env::var("ZEROCAST_RDMA_ADDR").unwrap_or_else(|_| "10.0.2.15".to_owned())
}

/// `scheme` with receive buffers of `eager` bytes; `rnr_retry = 0`, so an
/// RNR would be a hard error.
fn transport(scheme: &str, window: u32, eager: usize) -> Transport {
    let link = LinkConfig::default().with_recv_window(window).with_max_payload(MAX_PAYLOAD as u64);
    let rc = RcConfig::default().with_rnr_retry(0).with_eager_limit(eager);
    let pool = PoolConfig::default().with_max_bytes(768 * MIB);
    let cfg = Config::default().with_link(link).with_rc(rc).with_pool(pool);
    let uri = Box::leak(format!("{scheme}://{}:0", addr()).into_boxed_str());
    Transport { zc: Zerocast::with_config(cfg), listen_uri: uri }
}

fn drained(t: &Transport) {
    zerocast_tests::assert_pool_drained(t.zc.rc().expect("rc transport").pool(), Duration::from_secs(10));
}

/// Stream `n` checksummed messages of `size(seq)` bytes from `client` on a
/// thread, and check on `server` that each arrives intact, once and in
/// order, then the disconnect.
fn stream(client: Connection, server: &Connection, n: u64, size: fn(u64) -> usize) {
    let sender = thread::spawn(move || {
        for seq in 0..n {
            let mut buf = client.alloc(size(seq)).expect("alloc");
            checksum::write(seq, &mut buf);
            client.send(buf).expect("send");
        }
        client.close();
    });
    let mut next = 0;
    loop {
        match server.recv_timeout(Duration::from_secs(60)) {
            Ok(msg) => {
                let seq = checksum::verify(&msg).unwrap_or_else(|e| panic!("message {next}: {e}"));
                assert_eq!((seq, msg.len()), (next, size(next)), "lost, reordered or resized");
                next += 1;
            }
            Err(RecvError::Disconnected) => break,
            Err(e) => panic!("receive failed after {next} messages: {e:?}"),
        }
    }
    sender.join().expect("sender");
    assert_eq!(next, n);
}

/// Three raw 16 MiB messages, each between small ones: all arrive intact and
/// in order.
fn raw_16mib(scheme: &str) {
    let t = transport(scheme, 8, 64 << 10);
    let (client, server) = t.pair();
    assert!(client.max_message() >= 16 * MIB, "max message {}", client.max_message());
    let size = |seq: u64| if seq % 3 == 1 { 16 * MIB } else { 100 + seq as usize };
    const N: u64 = 9;
    let start = Instant::now();
    stream(client, &server, N, size);
    println!("{scheme}: {N} messages, 3 of 16 MiB, in {:?}", start.elapsed());
    drop(server);
    drained(&t);
}

/// A typed message with a large byte payload (`serde_bytes` encodes it as
/// one slice, not element by element).
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Blob {
    id: u32,
    #[serde(with = "serde_bytes")]
    data: Vec<u8>,
}

fn blob(id: u32, len: usize) -> Blob {
    let mut data = vec![0u8; len];
    for (k, chunk) in data.chunks_mut(8).enumerate() {
        let word = (k as u64 ^ u64::from(id) << 40).wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
    Blob { id, data }
}

/// Typed 16 MiB messages through `Sender<T>`, then a small one.
fn typed_16mib(scheme: &str) {
    let t = transport(scheme, 8, 64 << 10);
    let (client, server) = t.pair();
    let (tx, _) = client.split::<Blob, ()>();
    let (_, rx) = server.split::<(), Blob>();
    let sender = thread::spawn(move || {
        for id in 0..2 {
            tx.send(blob(id, 16 * MIB)).expect("send typed");
        }
        tx.send(blob(99, 10)).expect("send small");
    });
    for id in [0, 1, 99] {
        let got = rx.recv_timeout(Duration::from_secs(60)).expect("typed receive");
        let want = blob(id, if id == 99 { 10 } else { 16 * MIB });
        assert!(got == want, "message {id} differs (got id {}, {} bytes)", got.id, got.data.len());
    }
    sender.join().expect("sender");
    drop(rx);
    drained(&t);
}

/// Receive buffers of 4 KiB and every other message of 8 KiB: the sender
/// keeps hitting the limit on unfinished rendezvous and waits for finishes.
/// Then the conformance integrity run, whose larger messages go by
/// rendezvous.
fn many_small_rendezvous(scheme: &str) {
    let t = transport(scheme, 16, 4096);
    let (client, server) = t.pair();
    let size = |seq: u64| if seq & 1 == 0 { 8192 } else { 64 };
    stream(client, &server, 3000, size);
    drop(server);
    drained(&t);
    suite::integrity(&t, 20_000);
    drained(&t);
}

/// A rendezvous that finds the receiver's pool at its cap waits for a
/// buffer without blocking anyone: `try_recv` returns `Empty` at once while
/// it waits, and the message arrives intact once buffers come back.
fn starved_rendezvous_never_blocks(scheme: &str) {
    let link = LinkConfig::default().with_recv_window(16).with_max_payload(MIB as u64);
    let rc = RcConfig::default().with_eager_limit(4096);
    let pool = PoolConfig::default().with_max_bytes(16 * MIB);
    let cfg = Config::default().with_link(link).with_rc(rc).with_pool(pool);
    let uri = Box::leak(format!("{scheme}://{}:0", addr()).into_boxed_str());
    let t = Transport { zc: Zerocast::with_config(cfg), listen_uri: uri };
    let (client, server) = t.pair();
    let mut msg = client.alloc(MIB).expect("alloc the message");
    checksum::write(0, &mut msg);
    // Take every buffer the READ could land in.
    let pool = t.zc.rc().expect("rc transport").pool().clone();
    let mut held = Vec::new();
    while let Ok(b) = pool.alloc(MIB, zerocast::Wait::No) {
        held.push(b);
    }
    println!("{scheme}: holding {} buffers of 1 MiB; the pool is at its cap", held.len());
    client.send(msg).expect("send");
    let mut tries = Vec::new();
    let until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < until {
        let t0 = Instant::now();
        let r = server.try_recv();
        tries.push(t0.elapsed());
        assert!(matches!(r, Err(RecvError::Empty)), "{:?}", r.map(|m| m.len()));
    }
    tries.sort();
    let (median, max) = (tries[tries.len() / 2], tries[tries.len() - 1]);
    println!("{scheme}: {} try_recv while the rendezvous waits: median {median:?}, max {max:?}", tries.len());
    assert!(median < Duration::from_millis(1), "try_recv took {median:?} (median)");
    assert!(max < Duration::from_millis(500), "try_recv took {max:?}");
    drop(held);
    let got = server.recv_timeout(Duration::from_secs(10)).expect("the message, once buffers are back");
    assert_eq!((checksum::verify(&got), got.len()), (Ok(0), MIB));
    drop(got);
    drop((client, server));
    drained(&t);
}

macro_rules! rendezvous {
    ($name:ident, $scheme:expr) => {
        mod $name {
            use super::*;

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn raw_16mib_between_small_messages() {
                raw_16mib($scheme);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn typed_16mib_messages() {
                typed_16mib($scheme);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn rendezvous_limit_and_integrity() {
                many_small_rendezvous($scheme);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn starved_rendezvous_keeps_try_recv_from_waiting() {
                starved_rendezvous_never_blocks($scheme);
            }
        }
    };
}

rendezvous!(cm, "rc");
rendezvous!(oob, "rc+oob");
