use zerocast_mem::{Buf, Pool, PoolConfig, Wait};

use super::{Staging, CHUNKS, STAGING, STAGING_MAX};

fn pool() -> Pool {
    Pool::unregistered(PoolConfig::default().with_max_bytes(16 << 20)).unwrap()
}

/// Write `bytes` at `at` in staging, as a read would.
fn land(s: &mut Staging, at: usize, bytes: &[u8]) {
    s.get_mut(at..at + bytes.len()).copy_from_slice(bytes);
}

/// Staging filled by a read, then grown into a chunk: `n` frames of
/// `len` bytes, frame `i` made of byte `i`, staged from 0.
fn streaming(pool: &Pool) -> Staging {
    let mut s = Staging::new();
    let at = s.grow(0, 0, pool);
    assert_eq!(at, 0);
    assert!(s.lends(), "a filled read makes staging lend");
    s
}

/// Land and take `n` frames of `len` bytes from `from`, frame `i` made
/// of byte `i`.
fn frames(s: &mut Staging, pool: &Pool, from: usize, n: usize, len: usize) -> Vec<Buf> {
    (0..n)
        .map(|i| {
            let at = from + i * len;
            land(s, at, &vec![i as u8; len]);
            s.take(at..at + len, pool).expect("take")
        })
        .collect()
}

#[test]
fn a_connection_that_never_streams_copies_and_pins_no_pool_memory() {
    let pool = pool();
    let mut s = Staging::new();
    assert!(!s.lends());
    assert_eq!(s.len(), STAGING);
    land(&mut s, 100, b"hello");
    let buf = s.take(100..105, &pool).expect("a pool buffer");
    assert_eq!(&*buf, b"hello");
    // The copy is a buffer of its own: staging may be written again.
    land(&mut s, 100, b"world");
    assert_eq!(&*buf, b"hello");
    drop(buf);
    assert_eq!(pool.stats().buffers_in_use, 0);
}

#[test]
fn a_streaming_connection_lends_payloads_where_they_lie() {
    let pool = pool();
    let mut s = Staging::new();
    land(&mut s, 10, b"abcdefgh");
    // A read filled the area with [10..18] still to decode.
    let at = s.grow(10, 18, &pool);
    assert_eq!(at, 0);
    assert!(s.lends());
    assert!(s.len() >= STAGING_MAX);
    assert_eq!(s.get(0..8), b"abcdefgh", "the staged bytes moved to the chunk");
    let before = pool.stats().buffers_in_use;
    let a = s.take(0..4, &pool).unwrap();
    let b = s.take(4..8, &pool).unwrap();
    assert_eq!((&*a, &*b), (&b"abcd"[..], &b"efgh"[..]));
    assert_eq!(pool.stats().buffers_in_use, before, "parts are no new pool buffers");
    assert_eq!((a.len(), a.capacity()), (4, 4));
}

#[test]
fn a_chunk_whose_parts_are_gone_takes_its_own_tail() {
    let pool = pool();
    let mut s = streaming(&pool);
    let parts = frames(&mut s, &pool, 0, 100, 600);
    land(&mut s, 60_000, b"tail");
    let in_use = pool.stats().buffers_in_use;
    drop(parts);
    s.rebase(60_000, 60_004, &pool);
    assert_eq!(s.get(0..4), b"tail");
    assert_eq!(pool.stats().buffers_in_use, in_use, "no other chunk");
}

#[test]
fn held_parts_keep_their_bytes_while_staging_moves_on() {
    let pool = pool();
    let mut s = streaming(&pool);
    let held = frames(&mut s, &pool, 0, 100, 600);
    land(&mut s, 60_000, b"tail");
    s.rebase(60_000, 60_004, &pool);
    assert!(s.lends());
    assert_eq!(s.get(0..4), b"tail");
    // The next frames land over byte 0 of another chunk, not the held ones.
    let next = frames(&mut s, &pool, 4, 100, 600);
    for (i, p) in held.iter().chain(&next).enumerate() {
        assert!(p.iter().all(|&b| b == (i % 100) as u8), "part {i} changed");
    }
}

#[test]
fn with_every_chunk_held_staging_copies_then_lends_again_once_one_is_free() {
    let pool = pool();
    let mut s = streaming(&pool);
    let mut held = Vec::new();
    for _ in 0..CHUNKS {
        held.push(frames(&mut s, &pool, 0, 10, 1000));
        land(&mut s, 10_000, b"tail");
        s.rebase(10_000, 10_004, &pool);
    }
    assert!(!s.lends(), "all {CHUNKS} chunks held: staging copies");
    assert_eq!(s.len(), STAGING_MAX);
    assert_eq!(s.get(0..4), b"tail");
    let in_use = pool.stats().buffers_in_use;
    let copied = s.take(0..4, &pool).unwrap();
    assert_eq!(&*copied, b"tail");
    assert_eq!(pool.stats().buffers_in_use, in_use + 1, "a copy is a pool buffer of its own");
    assert_eq!(held.len(), CHUNKS);
    // Held messages pin at most CHUNKS chunks, whatever else comes.
    land(&mut s, 4, b"more");
    s.rebase(4, 8, &pool);
    assert!(!s.lends());
    assert_eq!(pool.stats().buffers_in_use, in_use + 1);
    held.swap_remove(1);
    land(&mut s, 100, b"next");
    s.rebase(100, 104, &pool);
    assert!(s.lends(), "a free chunk is lent from again");
    assert_eq!(s.get(0..4), b"next");
    assert_eq!(pool.stats().buffers_in_use, in_use + 1, "the freed chunk, not a new one");
    for (c, parts) in held.iter().enumerate() {
        for (i, p) in parts.iter().enumerate() {
            assert!(p.iter().all(|&b| b == i as u8), "chunk {c} part {i} changed");
        }
    }
}

#[test]
fn a_pool_with_no_buffer_for_a_chunk_leaves_staging_copying() {
    let pool = Pool::unregistered(PoolConfig::default().with_max_bytes(32 << 20)).unwrap();
    let mut hold = Vec::new();
    while let Ok(b) = pool.alloc(STAGING_MAX, Wait::No) {
        hold.push(b);
    }
    let mut s = Staging::new();
    land(&mut s, 0, b"abc");
    assert_eq!(s.grow(0, 3, &pool), 0);
    assert!(!s.lends());
    assert_eq!(s.len(), STAGING_MAX);
    assert_eq!(s.get(0..3), b"abc");
    drop(hold);
    land(&mut s, 3, b"def");
    s.rebase(3, 6, &pool);
    assert!(s.lends(), "the pool has a buffer again");
    assert_eq!(s.get(0..3), b"def");
}
