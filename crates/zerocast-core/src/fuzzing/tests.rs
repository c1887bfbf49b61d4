//! The fuzz targets' corpus, replayed on stable, and a seeded run of
//! generated inputs through the same entry points.

use std::path::PathBuf;

use super::*;

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus").join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("corpus entry").path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "empty corpus at {}", dir.display());
    files.into_iter().map(|p| (p.clone(), std::fs::read(&p).expect("corpus file"))).collect()
}

fn replay(target: &str, f: fn(&[u8])) {
    for (path, data) in corpus(target) {
        if std::panic::catch_unwind(|| f(&data)).is_err() {
            panic!("{target}: input {} broke an invariant", path.display());
        }
    }
}

#[test]
fn frame_stream_corpus() {
    replay("frame_stream", frame_stream);
}

#[test]
fn credit_peer_corpus() {
    replay("credit_peer", credit_peer);
}

/// xorshift64*: deterministic inputs, so a failure names its case.
fn inputs(seed: u64, n: usize, max_len: usize, mut f: impl FnMut(&[u8])) {
    let mut x = seed;
    let mut next = move || {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let mut buf = Vec::with_capacity(max_len);
    for _ in 0..n {
        buf.clear();
        let len = (next() as usize) % max_len;
        while buf.len() < len {
            buf.extend_from_slice(&next().to_le_bytes());
        }
        buf.truncate(len);
        f(&buf);
    }
}

/// 100 000 byte streams: random bytes, and valid headers with one field
/// broken (length 2^32 or 2^60, unknown kind, bad magic or version).
#[test]
fn frame_stream_100k_hostile_inputs() {
    inputs(0x5eed_f4a3, 50_000, 200, frame_stream);
    let lies: [fn(&mut [u8; HEADER_LEN]); 5] = [
        |h| h[8..16].copy_from_slice(&(1u64 << 32).to_le_bytes()),
        |h| h[8..16].copy_from_slice(&(1u64 << 60).to_le_bytes()),
        |h| h[1] = (h[1] & 0xf0) | 0x0c,
        |h| h[0] ^= 0xff,
        |h| h[1] ^= 0x30,
    ];
    let mut case = 0usize;
    inputs(0x0bad_c0de, 50_000, 64, |tail| {
        let mut h = Header::new(FrameKind::Data, 1, case as u32, tail.len() as u64).encode();
        lies[case % lies.len()](&mut h);
        case += 1;
        let mut data = vec![4u8];
        data.extend_from_slice(&h);
        data.extend_from_slice(tail);
        frame_stream(&data);
    });
}

/// 100 000 hostile peers against the credit machine.
#[test]
fn credit_peer_100k_hostile_peers() {
    inputs(0x0c4e_d175, 100_000, 120, credit_peer);
}
