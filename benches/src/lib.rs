//! What the zerocast benchmarks share: the pipes they time and the messages
//! they send.
//!
//! A [`Pipe`] is one sender (the calling thread) and one receiver thread in
//! this process, over loopback TCP or `mem://`. [`Pipe::batch`] sends a fixed
//! number of messages and returns only when the receiver has all of them, so
//! what is timed is delivered throughput, never bytes parked in a socket
//! buffer or a queue.
//!
//! The baselines are written here, on plain `socket2` sockets, so that every
//! ratio compares zerocast with something a careful programmer would write
//! by hand:
//!
//! - [`RawPipe`] with [`Baseline::Batched`]: length-prefixed frames gathered
//!   into 64 KiB writes (one `write_all` per frame at 64 KiB), read back
//!   through a 64 KiB `BufReader` into one reused buffer;
//! - [`RawPipe`] with [`Baseline::Naive`]: one `write` per message and two
//!   unbuffered `read_exact` calls per message on the receiving side.
//! - [`RawPipe`] with [`Baseline::Gathered`], a diagnostic: zerocast's own
//!   wire shape (one `writev` per 64 frames, two iovecs each) without the
//!   framework, to tell the cost of the shape from the cost of the engine.
//!
//! This crate does **not** print absolute rates as results: on a shared
//! two-core machine only ratios measured in one run mean anything. See
//! `BENCHMARKS.md` at the repository root.

#![forbid(unsafe_code)]

mod msg;
mod raw;
mod zc;

use std::time::Duration;

pub use msg::{Bytes, Small, SmallBytes, SmallRef};
pub use raw::{socket_pair, Baseline, RawPipe};
pub use zc::{bench_link, zc_pair, zc_pair_with, TypedPipe, ZcPipe};

/// The error type of pipe construction.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Receive window (credits) every zerocast pipe is built with.
pub const WINDOW: u32 = 256;

/// Bytes of the length prefix the raw baselines put before each message.
pub const RAW_PREFIX: usize = 8;

/// One sender and one receiver thread, timed a batch at a time.
pub trait Pipe {
    /// Send one batch of [`Pipe::msgs`] messages and wait until the
    /// receiver has taken every one; the time that took.
    fn batch(&mut self) -> Duration;
    /// Messages per batch.
    fn msgs(&self) -> u64;
    /// Payload bytes per batch (prefixes and headers not counted).
    fn bytes(&self) -> u64;
}

/// Messages per batch for a message size: enough that one batch is many
/// writer batches, few enough that a criterion sample stays short.
pub fn msgs_per_batch(size: usize) -> u64 {
    match size {
        0..=256 => 10_000,
        257..=8192 => 2_000,
        _ => 500,
    }
}

/// Time `reps` batches of `pipe`.
pub fn run(pipe: &mut dyn Pipe, reps: u64) -> Duration {
    (0..reps).map(|_| pipe.batch()).sum()
}

/// The median of `xs` (the mean of the middle two for an even count).
///
/// # Panics
///
/// If `xs` is empty or holds a NaN.
pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// The first up-to-8 bytes of a payload as a little-endian number: what the
/// receivers read from every message so that no side can skip touching it.
pub fn stamp_of(payload: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = payload.len().min(8);
    b[..n].copy_from_slice(&payload[..n]);
    u64::from_le_bytes(b)
}

/// Write `seq` into the first up-to-8 bytes of a payload.
pub fn stamp(payload: &mut [u8], seq: u64) {
    let n = payload.len().min(8);
    payload[..n].copy_from_slice(&seq.to_le_bytes()[..n]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipes_deliver_every_message() {
        let mut pipes: Vec<Box<dyn Pipe>> = vec![
            Box::new(RawPipe::new(Baseline::Batched, 64, 100).unwrap()),
            Box::new(RawPipe::new(Baseline::Batched, 70_000, 3).unwrap()),
            Box::new(RawPipe::new(Baseline::Naive, 64, 100).unwrap()),
            Box::new(RawPipe::new(Baseline::Gathered, 64, 100).unwrap()),
            Box::new(RawPipe::new(Baseline::Gathered, 70_000, 3).unwrap()),
            Box::new(ZcPipe::new("tcp://127.0.0.1:0", 64, 100).unwrap()),
            Box::new(ZcPipe::new("mem://benches-test", 4096, 100).unwrap()),
            Box::new(TypedPipe::new("tcp://127.0.0.1:0", Small::sample(0, 24), 100).unwrap()),
        ];
        for p in &mut pipes {
            for _ in 0..3 {
                p.batch();
            }
        }
    }

    #[test]
    fn median_and_stamps() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        let mut p = [0u8; 5];
        stamp(&mut p, 0x0102_0304_0506);
        assert_eq!(stamp_of(&p), 0x02_0304_0506);
    }
}
