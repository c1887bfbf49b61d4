//! Integrity of a stream: every message arrives whole, once, in order,
//! and keeps its bytes while the receiver holds it.

use std::collections::VecDeque;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use zerocast::{Connection, RecvError};

use crate::checksum;
use crate::Transport;

/// The largest message of a mixed-size stream on `c`.
fn stream_max(c: &Connection) -> usize {
    c.max_message().min(64 * 1024)
}

/// Send `n` checksummed messages of mixed sizes (up to [`stream_max`]) on
/// a thread of their own, then close.
fn send_checksummed(client: Connection, n: u64) -> JoinHandle<()> {
    let max = stream_max(&client);
    thread::spawn(move || {
        for seq in 0..n {
            let mut buf = client.alloc(checksum::size_for(seq, max)).expect("alloc");
            checksum::write(seq, &mut buf);
            client.send(buf).expect("send");
        }
        client.close();
    })
}

/// `n` checksummed messages of mixed sizes arrive intact, once each, in
/// order, while the sender and receiver run on their own threads.
pub fn integrity(t: &Transport, n: u64) {
    let (client, server) = t.pair();
    let max = stream_max(&client);
    let sender = send_checksummed(client, n);
    let mut next = 0u64;
    loop {
        match server.recv() {
            Ok(msg) => {
                let seq = checksum::verify(&msg).unwrap_or_else(|e| panic!("corrupt message: {e}"));
                assert_eq!(seq, next, "lost, duplicated or reordered");
                assert_eq!(msg.len(), checksum::size_for(seq, max));
                next += 1;
            }
            Err(RecvError::Disconnected) => break,
            Err(e) => panic!("receive failed after {next} messages: {e}"),
        }
    }
    sender.join().expect("sender");
    assert_eq!(next, n);
    drop(server);
    t.assert_pool_drained(Duration::from_secs(10));
}

/// A receiver that keeps some messages while the stream goes on: every
/// `every`-th of `n` mixed-size messages is held, the last `hold` of them
/// at a time, and each still has its own bytes when it is let go. On a
/// byte stream, small messages are lent from the reader's staging where
/// they lie: a held one keeps its part of staging out of the reader's
/// reach, staging moves on to other memory, and with all of that held it
/// copies until some is free.
pub fn held_messages_keep_their_bytes(t: &Transport, n: u64, every: u64, hold: usize) {
    let (client, server) = t.pair();
    let sender = send_checksummed(client, n);
    let check = |m: &[u8], seq: u64| {
        let got = checksum::verify(m).unwrap_or_else(|e| panic!("message {seq} corrupt: {e}"));
        assert_eq!(got, seq, "held message {seq} changed");
    };
    let mut held = VecDeque::new();
    let mut next = 0u64;
    loop {
        match server.recv_timeout(Duration::from_secs(30)) {
            Ok(msg) => {
                check(&msg, next);
                if next % every == 0 {
                    held.push_back((next, msg));
                    if held.len() > hold {
                        let (seq, old) = held.pop_front().expect("held");
                        check(&old, seq);
                    }
                }
                next += 1;
            }
            Err(RecvError::Disconnected) => break,
            Err(e) => panic!("receive failed after {next} messages: {e}"),
        }
    }
    sender.join().expect("sender");
    assert_eq!(next, n);
    for (seq, m) in &held {
        check(m, *seq);
    }
    drop((held, server));
    t.assert_pool_drained(Duration::from_secs(10));
}
