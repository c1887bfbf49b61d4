//! The calling thread's own I/O, for transports that have it (`tcp://`,
//! `rc://`): a send writes (posts) its frame itself when the link is quiet,
//! a receive reads the socket (polls the CQ) itself, and neither breaks
//! order, deadlines or several threads sharing one connection.

use std::collections::HashMap;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use zerocast::{RecvError, SendError};

use crate::{checksum, Transport};

/// Ping-pong, one message in flight: (nearly) every send is written by its
/// caller, and replies come back in order.
pub fn ping_pong_is_written_by_the_caller(t: &Transport, rounds: u64, drained: impl Fn(&Transport)) {
    let (client, server) = t.pair();
    let echo = thread::spawn(move || {
        while let Ok(m) = server.recv() {
            let mut reply = server.alloc(m.len()).expect("alloc");
            reply.copy_from_slice(&m);
            drop(m);
            server.send(reply).expect("echo");
        }
    });
    for i in 0..rounds {
        let mut b = client.alloc(8).expect("alloc");
        b.copy_from_slice(&i.to_le_bytes());
        client.send(b).expect("send");
        let r = client.recv().expect("reply");
        assert_eq!(u64::from_le_bytes(r[..8].try_into().unwrap()), i, "reply out of order");
        drop(r);
        // The release returned the credit before `drop` returned: on RDMA,
        // the dropping thread reposted the buffer itself.
        assert_eq!(client.stats().held, 0, "credit still held after the drop");
    }
    let stats = client.stats();
    // One message in flight at a time: sends find the link quiet (a few may
    // meet the writer (the engine, or RC's writer thread) holding the
    // socket for a moment, and queue).
    assert!(stats.direct_sends >= rounds * 99 / 100, "{stats:?}");
    client.close();
    echo.join().expect("echo thread");
    drained(t);
}

/// A burst of `n` small messages: once frames are in flight they queue for
/// the writer's batches (the engine's, or RC's writer thread's), and all
/// arrive in order.
pub fn a_burst_goes_through_the_writer(t: &Transport, n: u64, drained: impl Fn(&Transport)) {
    stream_through_the_writer(t, n, 64, drained);
}

/// `n` messages of `size` bytes sent back to back, the sequence number at
/// both ends of each (a message cut or spliced at a packet boundary
/// shows): all arrive in order, and past the first few they queue for the
/// writer's batches rather than go out one by one from the sender.
fn stream_through_the_writer(t: &Transport, n: u64, size: usize, drained: impl Fn(&Transport)) {
    let (client, server) = t.pair();
    let reader = thread::spawn(move || {
        let mut next = 0u64;
        while let Ok(m) = server.recv() {
            assert_eq!(stamp_of(&m), (next, next), "message {next} of {} bytes", m.len());
            assert_eq!(m.len(), size);
            next += 1;
        }
        next
    });
    for i in 0..n {
        send_stamped(&client, i, size);
    }
    let stats = client.stats();
    client.close();
    assert_eq!(reader.join().expect("reader"), n);
    assert!(stats.direct_sends < n / 2, "{stats:?}");
    drained(t);
}

/// Send message `i` of `size` bytes (at least 16), its number at both ends.
fn send_stamped(client: &zerocast::Connection, i: u64, size: usize) {
    let mut b = client.alloc(size).expect("alloc");
    b[..8].copy_from_slice(&i.to_le_bytes());
    b[size - 8..].copy_from_slice(&i.to_le_bytes());
    client.send(b).expect("send");
}

/// The numbers at the two ends of a message of [`send_stamped`].
fn stamp_of(m: &[u8]) -> (u64, u64) {
    let at = |r: std::ops::Range<usize>| u64::from_le_bytes(m[r].try_into().unwrap());
    (at(0..8), at(m.len() - 8..m.len()))
}

/// Ping-pong of `size`-byte messages, each held until its reply is out, so
/// every send finds the link under load: a large message that answers one
/// is still written by its caller, never held back for a batch.
pub fn large_replies_are_written_by_the_caller(
    t: &Transport,
    rounds: u64,
    size: usize,
    drained: impl Fn(&Transport),
) {
    let (client, server) = t.pair();
    let echo = thread::spawn(move || {
        while let Ok(m) = server.recv() {
            let mut reply = server.alloc(m.len()).expect("alloc");
            reply.copy_from_slice(&m);
            // Sent while the request is held: its credit is not back yet.
            server.send(reply).expect("echo");
            drop(m);
        }
    });
    for i in 0..rounds {
        let mut b = client.alloc(size).expect("alloc");
        b[..8].copy_from_slice(&i.to_le_bytes());
        client.send(b).expect("send");
        let r = client.recv().expect("reply");
        assert_eq!((u64::from_le_bytes(r[..8].try_into().unwrap()), r.len()), (i, size), "wrong reply");
    }
    let stats = client.stats();
    // A few may meet the engine holding the socket (flushing what the
    // socket did not take at once), and queue.
    assert!(stats.direct_sends >= rounds * 9 / 10, "{stats:?}");
    client.close();
    echo.join().expect("echo thread");
    drained(t);
}

/// A one-way stream of `n` large messages of `size` bytes: on a byte
/// stream they go out several per write (so writes end in whole packets),
/// not one by one from the sender (who does nothing else, so its messages
/// come close together: filling each one here would make a slow stream).
/// Past the first few, each comes close behind the last with nothing from
/// the peer between (but a credit frame now and then).
pub fn a_stream_of_large_messages_is_batched(
    t: &Transport,
    n: u64,
    size: usize,
    drained: impl Fn(&Transport),
) {
    stream_through_the_writer(t, n, size, drained);
}

/// A stream of `n` messages of `size` bytes that then stops, the
/// connection left open: every message arrives, the last ones too (a
/// sender that writes its ring itself may keep the bytes past its last
/// whole packet for the engine's writer, which sends them when nothing
/// follows).
pub fn a_stream_that_stops_arrives_whole_before_the_close(
    t: &Transport,
    n: u64,
    size: usize,
    drained: impl Fn(&Transport),
) {
    let (client, server) = t.pair();
    for i in 0..n {
        send_stamped(&client, i, size);
    }
    for i in 0..n {
        let m = server
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("message {i} of {n}: {e}"));
        assert_eq!(stamp_of(&m), (i, i), "message {i}");
    }
    client.close();
    assert!(matches!(server.recv_timeout(Duration::from_secs(10)), Err(RecvError::Disconnected)));
    drained(t);
}

/// `threads` threads send `per` messages each on one connection: each
/// thread's messages arrive in its order, direct writes and batches mixed.
pub fn senders_on_many_threads_keep_order(
    t: &Transport,
    threads: u64,
    per: u64,
    drained: impl Fn(&Transport),
) {
    let (client, server) = t.pair();
    let barrier = Arc::new(Barrier::new(threads as usize));
    let senders: Vec<_> = (0..threads)
        .map(|id| {
            let (c, barrier) = (client.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                for seq in 0..per {
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
    assert_eq!(reader.join().expect("reader"), threads * per);
    drained(t);
}

/// A receive that reads the transport itself honours its deadline, and two
/// receiving threads split one stream of `n` with nothing lost or doubled.
pub fn reading_receivers_share_the_stream(t: &Transport, n: u64, drained: impl Fn(&Transport)) {
    let (client, server) = t.pair();
    // Nothing sent: a receive that reads the socket itself still times out.
    let start = Instant::now();
    assert!(matches!(server.recv_timeout(Duration::from_millis(150)), Err(RecvError::Timeout)));
    let waited = start.elapsed();
    assert!(waited >= Duration::from_millis(150) && waited < Duration::from_secs(3), "{waited:?}");
    // Two receiving threads split one stream; nothing is lost or doubled.
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
    for i in 0..n {
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
    assert_eq!(all, (0..n).collect::<Vec<_>>());
    // Both ends closed: on RDMA, the receives posted for this connection
    // come back only then.
    drop((client, server));
    drained(t);
}

/// A receiver that busy-polls with `try_recv` reads the transport itself
/// (it claims the socket from the engine; RC's reader thread steps aside):
/// `n` messages arrive whole and in order,
/// and then the disconnect.
pub fn a_try_recv_loop_reads_the_stream(t: &Transport, n: u64, drained: impl Fn(&Transport)) {
    let (client, server) = t.pair();
    let reader = thread::spawn(move || {
        let mut next = 0u64;
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            match server.try_recv() {
                Ok(m) => {
                    let seq = checksum::verify(&m).unwrap_or_else(|e| panic!("message {next}: {e}"));
                    assert_eq!(seq, next, "out of order");
                    next += 1;
                }
                Err(RecvError::Empty) => {
                    assert!(Instant::now() < deadline, "stalled after {next} messages");
                    std::hint::spin_loop();
                }
                Err(RecvError::Disconnected) => return next,
                Err(e) => panic!("try_recv: {e:?}"),
            }
        }
    });
    for i in 0..n {
        let len = checksum::HEADER + (i as usize * 37) % 3000;
        let mut b = client.alloc(len).expect("alloc");
        checksum::write(i, &mut b);
        client.send(b).expect("send");
    }
    client.close();
    assert_eq!(reader.join().expect("reader"), n);
    drained(t);
}

/// A sender that spins on `try_send` through a window far smaller than
/// the stream (no blocking send, so no thread parks waiting for credit)
/// gets its credits back: a `try_send` that finds none reads the
/// transport once itself. `n` messages arrive whole and in order.
pub fn a_try_send_loop_gets_its_credit_back(t: &Transport, n: u64, drained: impl Fn(&Transport)) {
    let (client, server) = t.pair();
    let reader = thread::spawn(move || {
        let mut next = 0u64;
        loop {
            match server.recv_timeout(Duration::from_secs(60)) {
                Ok(m) => {
                    let seq = checksum::verify(&m).unwrap_or_else(|e| panic!("message {next}: {e}"));
                    assert_eq!(seq, next, "out of order");
                    next += 1;
                }
                Err(RecvError::Disconnected) => return next,
                Err(e) => panic!("recv after {next} messages: {e:?}"),
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut full = 0u64;
    for i in 0..n {
        let len = checksum::HEADER + (i as usize * 53) % 2000;
        let mut b = client.alloc(len).expect("alloc");
        checksum::write(i, &mut b);
        loop {
            match client.try_send(b) {
                Ok(()) => break,
                Err(SendError::Full(back)) => {
                    full += 1;
                    assert!(Instant::now() < deadline, "try_send stalled at message {i}");
                    b = back;
                    std::hint::spin_loop();
                }
                Err(e) => panic!("try_send of {i}: {e}"),
            }
        }
    }
    client.close();
    assert_eq!(reader.join().expect("reader"), n);
    println!("{n} messages, try_send found no credit {full} times");
    drained(t);
}
