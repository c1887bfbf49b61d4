//! The calling thread's own I/O on `tcp://`: a send writes its frame itself
//! when the link is quiet, a receive reads the socket itself, and neither
//! breaks order, deadlines or several threads sharing one connection.

use std::collections::HashMap;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use zerocast::{RecvError, SendError};
use zerocast_tests::Transport;

fn tcp() -> Transport {
    Transport::new("tcp://127.0.0.1:0", 64)
}

#[test]
fn ping_pong_is_written_by_the_caller_and_stays_in_order() {
    let t = tcp();
    let (client, server) = t.pair();
    let echo = thread::spawn(move || {
        while let Ok(m) = server.recv() {
            let mut reply = server.alloc(m.len()).expect("alloc");
            reply.copy_from_slice(&m);
            drop(m);
            server.send(reply).expect("echo");
        }
    });
    const ROUNDS: u64 = 2_000;
    for i in 0..ROUNDS {
        let mut b = client.alloc(8).expect("alloc");
        b.copy_from_slice(&i.to_le_bytes());
        client.send(b).expect("send");
        let r = client.recv().expect("reply");
        assert_eq!(u64::from_le_bytes(r[..8].try_into().unwrap()), i, "reply out of order");
    }
    let stats = client.stats();
    // One message in flight at a time: sends find the link quiet (a few may
    // meet the writer thread holding the socket for a moment, and queue).
    assert!(stats.direct_sends >= ROUNDS * 99 / 100, "{stats:?}");
    client.close();
    echo.join().expect("echo thread");
    t.assert_pool_drained(Duration::from_secs(5));
}

#[test]
fn a_burst_goes_through_the_writer_and_arrives_whole() {
    let t = tcp();
    let (client, server) = t.pair();
    const N: u64 = 50_000;
    let reader = thread::spawn(move || {
        let mut next = 0u64;
        while let Ok(m) = server.recv() {
            assert_eq!(u64::from_le_bytes(m[..8].try_into().unwrap()), next);
            next += 1;
        }
        next
    });
    for i in 0..N {
        let mut b = client.alloc(64).expect("alloc");
        b[..8].copy_from_slice(&i.to_le_bytes());
        client.send(b).expect("send");
    }
    let stats = client.stats();
    client.close();
    assert_eq!(reader.join().expect("reader"), N);
    // Once frames are in flight, sends queue for the writer's batches.
    assert!(stats.direct_sends < N / 2, "{stats:?}");
    t.assert_pool_drained(Duration::from_secs(5));
}

#[test]
fn senders_on_many_threads_keep_each_threads_order() {
    let t = tcp();
    let (client, server) = t.pair();
    const THREADS: u64 = 4;
    const PER: u64 = 20_000;
    let barrier = Arc::new(Barrier::new(THREADS as usize));
    let senders: Vec<_> = (0..THREADS)
        .map(|id| {
            let (c, barrier) = (client.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                for seq in 0..PER {
                    let mut b = c.alloc(16).expect("alloc");
                    b[..8].copy_from_slice(&id.to_le_bytes());
                    b[8..].copy_from_slice(&seq.to_le_bytes());
                    c.send(b).expect("send");
                    if seq % 97 == 96 {
                        // Let the link go quiet now and then, so direct
                        // writes and queued batches interleave.
                        thread::yield_now();
                    }
                }
            })
        })
        .collect();
    let reader = thread::spawn(move || {
        let mut next: HashMap<u64, u64> = HashMap::new();
        let mut total = 0;
        while let Ok(m) = server.recv() {
            let id = u64::from_le_bytes(m[..8].try_into().unwrap());
            let seq = u64::from_le_bytes(m[8..16].try_into().unwrap());
            let want = next.entry(id).or_insert(0);
            assert_eq!(seq, *want, "thread {id} out of order");
            *want += 1;
            total += 1;
        }
        total
    });
    for s in senders {
        s.join().expect("sender");
    }
    client.close();
    assert_eq!(reader.join().expect("reader"), THREADS * PER);
    t.assert_pool_drained(Duration::from_secs(5));
}

#[test]
fn reading_receivers_share_the_stream_and_honour_deadlines() {
    let t = tcp();
    let (client, server) = t.pair();
    // Nothing sent: a receive that reads the socket itself still times out.
    let start = Instant::now();
    assert!(matches!(server.recv_timeout(Duration::from_millis(150)), Err(RecvError::Timeout)));
    let waited = start.elapsed();
    assert!(waited >= Duration::from_millis(150) && waited < Duration::from_secs(3), "{waited:?}");
    // Two receiving threads split one stream; nothing is lost or doubled.
    const N: u64 = 20_000;
    let receivers: Vec<_> = (0..2)
        .map(|_| {
            let s = server.clone();
            thread::spawn(move || {
                let mut seen = Vec::new();
                loop {
                    match s.recv_timeout(Duration::from_secs(10)) {
                        Ok(m) => seen.push(u64::from_le_bytes(m[..8].try_into().unwrap())),
                        Err(RecvError::Disconnected) => return seen,
                        Err(e) => panic!("receive: {e:?}"),
                    }
                }
            })
        })
        .collect();
    for i in 0..N {
        let mut b = client.alloc(8).expect("alloc");
        b.copy_from_slice(&i.to_le_bytes());
        match client.send(b) {
            Ok(()) => {}
            Err(SendError::Failed(_, e)) => panic!("send failed: {e}"),
            Err(e) => panic!("send: {e:?}"),
        }
    }
    client.close();
    let mut all: Vec<u64> = receivers.into_iter().flat_map(|r| r.join().expect("receiver")).collect();
    all.sort_unstable();
    assert_eq!(all, (0..N).collect::<Vec<_>>());
    t.assert_pool_drained(Duration::from_secs(5));
}
