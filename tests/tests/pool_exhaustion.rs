//! A tiny pool: senders wait for buffers or time out as asked, the pool
//! recovers when buffers come back, and a long stream through far fewer
//! buffers than messages never deadlocks. Over `tcp://` and `mem://`.

use std::thread;
use std::time::{Duration, Instant};

use zerocast::{Config, LinkConfig, PoolConfig, PoolError, RecvError, SendError, Zerocast};
use zerocast_tests::{checksum, Transport};

/// Buffers in the pool: 16 of 512 bytes, shared by both ends of a pair.
const BUFFERS: usize = 16;
const SIZE: usize = 512;

fn transport(uri: &'static str) -> Transport {
    let pool = PoolConfig::default()
        .with_classes([SIZE])
        .with_region_size(BUFFERS * SIZE)
        .with_max_bytes(BUFFERS * SIZE);
    let link = LinkConfig::default().with_recv_window(4).with_max_payload(SIZE as u64);
    Transport {
        zc: Zerocast::with_config(Config::default().with_pool(pool).with_link(link)),
        listen_uri: uri,
    }
}

/// 20 000 checksummed messages through 16 buffers; the receiver releases
/// each at once. A stall of 10 s counts as a deadlock.
fn stream(t: &Transport) {
    const N: u64 = 20_000;
    let (client, server) = t.pair();
    let sender = thread::spawn(move || {
        for seq in 0..N {
            let mut buf =
                client.alloc_timeout(checksum::size_for(seq, SIZE), Duration::from_secs(10)).expect("alloc");
            checksum::write(seq, &mut buf);
            client.send(buf).expect("send");
        }
    });
    for next in 0..N {
        let msg = server
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("stalled at {next}: {e:?}"));
        assert_eq!(checksum::verify(&msg), Ok(next));
    }
    sender.join().expect("sender");
    drop(server);
    t.assert_pool_drained(Duration::from_secs(10));
}

/// Holding every buffer makes the next allocation time out (not hang); a
/// send still works once buffers are back.
fn exhaust(t: &Transport) {
    let (client, server) = t.pair();
    let held: Vec<_> = (0..BUFFERS).map(|_| client.alloc(SIZE).expect("alloc")).collect();
    let start = Instant::now();
    match client.alloc_timeout(SIZE, Duration::from_millis(200)) {
        Err(PoolError::Timeout { .. }) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(start.elapsed() >= Duration::from_millis(200));
    assert_eq!(t.zc.pool().expect("pool").stats().buffers_in_use, BUFFERS);
    // A typed `try_send` that finds no buffer hands the message back as
    // `Full`, as a send that finds no credit does: it never waits.
    let (tx, _rx) = client.clone().split::<u64, ()>();
    match tx.try_send(7) {
        Err(SendError::Full(7)) => {}
        other => panic!("expected the message back as Full, got {other:?}"),
    }
    drop(held);
    let mut buf = client.alloc_timeout(SIZE, Duration::from_secs(5)).expect("alloc after release");
    buf[..4].copy_from_slice(b"back");
    client.send(buf).expect("send");
    assert_eq!(&server.recv_timeout(Duration::from_secs(5)).expect("recv")[..4], b"back");
    client.close();
    assert!(matches!(server.recv_timeout(Duration::from_secs(5)), Err(RecvError::Disconnected)));
    drop((client, server, tx));
    t.assert_pool_drained(Duration::from_secs(10));
}

#[test]
fn tcp_tiny_pool_streams_without_deadlock() {
    stream(&transport("tcp://127.0.0.1:0"));
}

#[test]
fn tcp_exhausted_pool_times_out_and_recovers() {
    exhaust(&transport("tcp://127.0.0.1:0"));
}

#[test]
fn mem_tiny_pool_streams_without_deadlock() {
    stream(&transport("mem://tiny-pool-stream-{n}"));
}

#[test]
fn mem_exhausted_pool_times_out_and_recovers() {
    exhaust(&transport("mem://tiny-pool-exhaust-{n}"));
}
