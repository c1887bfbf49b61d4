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

mod asyncs;
mod blob;
pub mod kv;
mod msg;
mod pingpong;
mod raw;
mod thr;
mod udp;
mod zc;
#[cfg(feature = "zeromq")]
mod zmq;

use std::time::Duration;

pub use asyncs::{AsyncZcPing, AsyncZcPipe, TokioPing};
pub use blob::{Blob, TypedBytesPipe};
pub use msg::{Bytes, Small, SmallBytes, SmallRef};
pub use pingpong::{round_trips, PingPong, RawPing, ZcPing};
pub use raw::{read_frame, socket_pair, Baseline, FrameWriter, RawPipe, WRITE_BATCH};
pub use thr::{local_thr, thr_main, ThrError};
pub use udp::{UdpPipe, UDP_WINDOW};
pub use zc::{bench_link, zc_pair, zc_pair_with, TypedPipe, ZcPipe};
#[cfg(feature = "zeromq")]
pub use zmq::{ZmqPipe, ZmqReqRep};

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
        8193..=262_144 => 500,
        _ => 100,
    }
}

/// Bytes in flight a pipe's window may hold: a window of 256 × 1 MiB would
/// fill the pool, and keep every buffer out of cache.
pub const MAX_INFLIGHT_BYTES: usize = 32 << 20;

/// Link settings for messages of `size` bytes: [`bench_link`], with the
/// window capped at [`MAX_INFLIGHT_BYTES`] and a payload limit of the size
/// (plus room for a typed envelope). RDMA posts `window` receive buffers of
/// the payload limit, so a limit far above the size would fill the pool.
pub fn link_for(size: usize) -> zerocast::LinkConfig {
    let window = (MAX_INFLIGHT_BYTES / size.max(1)).clamp(4, WINDOW as usize) as u32;
    let max_payload = (size as u64 + 64).next_multiple_of(64);
    bench_link().with_recv_window(window).with_max_payload(max_payload)
}

/// The sequence numbers a payload of `size` bytes can tell apart.
pub fn mask(size: usize) -> u64 {
    if size >= 8 {
        u64::MAX
    } else {
        (1u64 << (8 * size)) - 1
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
            Box::new(TypedBytesPipe::new("mem://benches-typed", 1 << 20, 5).unwrap()),
            Box::new(TypedBytesPipe::new("tcp://127.0.0.1:0", 4096, 100).unwrap()),
            Box::new(ZcPipe::with_link("tcp://127.0.0.1:0", 1 << 20, 5, link_for(1 << 20)).unwrap()),
            Box::new(UdpPipe::new(4096, 100).unwrap()),
            #[cfg(feature = "zeromq")]
            Box::new(ZmqPipe::new(64, 100).unwrap()),
        ];
        for p in &mut pipes {
            for _ in 0..3 {
                p.batch();
            }
        }
    }

    #[test]
    fn round_trips_echo_every_message() {
        let mut pings: Vec<Box<dyn PingPong>> = vec![
            Box::new(ZcPing::new("tcp://127.0.0.1:0", 64).unwrap()),
            Box::new(ZcPing::new("mem://benches-ping", 3).unwrap()),
            Box::new(RawPing::new(64).unwrap()),
            #[cfg(feature = "zeromq")]
            Box::new(ZmqReqRep::new(64).unwrap()),
        ];
        let mut out = Vec::new();
        for p in &mut pings {
            round_trips(p.as_mut(), 50, &mut out);
            assert_eq!(out.len(), 50);
            assert!(out.iter().all(|&ns| ns > 0));
        }
    }

    #[test]
    fn raw_frames_read_back_in_order_and_a_wrong_length_is_an_error() {
        let mut bytes = Vec::new();
        FrameWriter::batched(3).send(&mut bytes, 2).unwrap();
        assert_eq!(bytes.len(), 2 * (RAW_PREFIX + 3));
        let (mut prefix, mut payload) = ([0u8; RAW_PREFIX], [0u8; 3]);
        let mut r = &bytes[..];
        for seq in 0..2 {
            read_frame(&mut r, &mut prefix, &mut payload).unwrap();
            assert_eq!(stamp_of(&payload), seq);
        }
        let mut wrong = [0u8; 4];
        let err = read_frame(&mut &bytes[..], &mut prefix, &mut wrong).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    }

    #[test]
    fn windows_shrink_for_large_messages() {
        assert_eq!(link_for(64).recv_window, WINDOW);
        assert_eq!(link_for(1 << 20).recv_window, 32);
        assert!(link_for(8 << 20).max_payload >= 8 << 20);
        assert!(link_for(64).max_payload < 4096, "receive buffers sized for the message");
        assert_eq!(mask(2), 0xffff);
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
