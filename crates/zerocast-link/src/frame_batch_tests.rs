//! [`crate::FrameBatch`]: frames accounted under one lock arrive as those
//! handed over one by one do, and a breach in the middle of a batch fails
//! the connection as it would alone.

use std::time::Instant;

use zerocast_core::{FrameKind, Header, RecvError};
use zerocast_mem::{Pool, Wait};

use crate::{Driver, Link, Pumped, Source};

/// A test double for a socket holding frames numbered `seqs`, each with
/// its number as payload: one pump hands them all to the driver, in one
/// batch or one by one.
struct Held {
    pool: Pool,
    seqs: Vec<u32>,
    batched: bool,
}

impl Source for Held {
    fn pump(&mut self, driver: &Driver, _until: Option<Instant>) -> Pumped {
        if self.seqs.is_empty() {
            return Pumped::Idle;
        }
        let mut batch = driver.batch();
        for seq in self.seqs.drain(..) {
            let mut buf = self.pool.alloc(4, Wait::No).unwrap();
            buf.copy_from_slice(&seq.to_le_bytes());
            let header = Header::new(FrameKind::Data, 0, seq, 4);
            let took =
                if self.batched { batch.on_data(header, buf) } else { driver.on_frame(header, Some(buf)) };
            if took.is_err() {
                break;
            }
        }
        batch.finish();
        Pumped::Frames
    }
}

fn held(seqs: Vec<u32>, batched: bool) -> (Link, Driver) {
    let (link, driver, pool) = crate::test_link_of(256);
    driver.install_source(Box::new(Held { pool, seqs, batched }));
    (link, driver)
}

/// What a receiver sees: every message's number, then how it ended (the
/// source hands every frame over in its first pump, so a short wait for
/// more is enough).
fn received(link: &Link) -> (Vec<u32>, RecvError) {
    let mut got = Vec::new();
    loop {
        match link.recv(Some(Instant::now() + std::time::Duration::from_millis(100))) {
            Ok(m) => got.push(u32::from_le_bytes(m[..4].try_into().unwrap())),
            Err(e) => return (got, e),
        }
    }
}

#[test]
fn a_batch_delivers_what_frames_one_by_one_deliver() {
    for batched in [false, true] {
        let (link, _driver) = held((0..200).collect(), batched);
        let (got, end) = received(&link);
        assert_eq!(got, (0..200).collect::<Vec<_>>(), "batched: {batched}");
        // Nothing more came: the source is idle, the link alive.
        assert!(matches!(end, RecvError::Timeout), "batched: {batched}: {end:?}");
        // The state lock was let go with the batch: a send goes through.
        let buf = link.alloc(8, None).unwrap();
        assert!(link.try_send(buf).is_ok(), "batched: {batched}");
    }
}

#[test]
fn a_breach_in_a_batch_fails_the_connection_as_it_does_alone() {
    // Frame 7 comes where 5 was due.
    let seqs: Vec<u32> = (0..5).chain(7..20).collect();
    let (alone, alone_end) = received(&held(seqs.clone(), false).0);
    let (batched, batched_end) = received(&held(seqs, true).0);
    assert_eq!(alone, (0..5).collect::<Vec<_>>());
    assert_eq!(batched, alone, "the frames before the breach arrive, none after");
    let (RecvError::Failed(a), RecvError::Failed(b)) = (&alone_end, &batched_end) else {
        panic!("both fail: {alone_end:?} / {batched_end:?}");
    };
    assert_eq!(a.to_string(), b.to_string());
}
