//! Small frames staged as bytes (see [`crate::staged`]): they reach the
//! wire in the order they were sent, mixed with frames that are written
//! directly or queued (large ones, tagged ones) and with the goodbye; a
//! sender that stages a batch writes it itself. The wire is a test
//! double that records the byte stream a stream socket would carry, and
//! the engine is driven by hand (`Engine::detached`).

use std::sync::{Arc, Mutex};

use zerocast_core::{ConnError, FrameKind, Header, HEADER_LEN};
use zerocast_mem::Wait;

use crate::engine::{Engine, Progress};
use crate::test_writer::{settle, WriterTask};
use crate::{Frame, Link, Wire, WireCtx};

/// Payloads up to this size are staged (a stream socket's choice).
const SMALL: usize = 256;

/// What the recording wire saw.
#[derive(Default)]
struct Seen {
    /// The byte stream, header then payload per frame.
    stream: Vec<u8>,
    /// Staged bytes among them.
    staged: usize,
    /// Frames handed over as frames.
    frames: usize,
}

/// A test double for a stream socket's write path: it takes everything,
/// frames and staged bytes alike, into one recorded byte stream.
struct Recording(Arc<Mutex<Seen>>);

impl Wire for Recording {
    fn write(&mut self, frames: &mut [Frame], ctx: &WireCtx<'_>) -> Result<(), ConnError> {
        self.write_staged(&[], frames, ctx)
    }

    fn stages_up_to(&self) -> usize {
        SMALL
    }

    fn write_staged(
        &mut self,
        bytes: &[u8],
        frames: &mut [Frame],
        _ctx: &WireCtx<'_>,
    ) -> Result<(), ConnError> {
        let mut seen = self.0.lock().unwrap();
        seen.stream.extend_from_slice(bytes);
        seen.staged += bytes.len();
        seen.frames += frames.len();
        for f in frames.iter_mut() {
            seen.stream.extend_from_slice(&f.header.encode());
            if let Some(p) = f.payload.take() {
                seen.stream.extend_from_slice(&p);
            }
        }
        Ok(())
    }
}

/// A recorded frame: its kind, its sequence number, and its payload's
/// first byte and length.
type Decoded = (FrameKind, u32, Option<(u8, usize)>);

struct Fixture {
    link: Link,
    _engine: Engine,
    progress: Progress,
    seen: Arc<Mutex<Seen>>,
}

impl Fixture {
    fn new() -> Self {
        let (link, driver) = crate::shared::tests::open(1024);
        let (engine, progress) = Engine::detached("staged-test").unwrap();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let wire = Box::new(Recording(seen.clone()));
        engine.register(Box::new(WriterTask { driver, wire: Some(wire), said: Arc::default() }));
        let mut f = Self { link, _engine: engine, progress, seen };
        f.settle();
        f
    }

    fn settle(&mut self) {
        settle(&mut self.progress);
    }

    /// Send `len` bytes, each the message's number.
    fn send(&self, n: u8, len: usize) {
        let mut buf = self.link.alloc(len, None).unwrap();
        buf.fill(n);
        self.link.send(buf, None).unwrap();
    }

    fn send_tagged(&self, n: u8, len: usize) {
        let mut buf = self.link.pool().alloc(len, Wait::No).unwrap();
        buf.fill(n);
        self.link.send_tagged(buf, std::num::NonZeroU32::new(9).unwrap(), None).unwrap();
    }

    /// The recorded stream as frames.
    fn frames(&self) -> Vec<Decoded> {
        let seen = self.seen.lock().unwrap();
        let (mut at, mut out) = (0, Vec::new());
        while at < seen.stream.len() {
            let h = Header::decode(&seen.stream[at..], 1 << 20).expect("a header");
            at += HEADER_LEN;
            let len = h.len as usize;
            let payload = (len > 0).then(|| (seen.stream[at], len));
            assert!(seen.stream[at..at + len].iter().all(|&b| Some((b, len)) == payload), "a payload whole");
            at += len;
            out.push((h.kind, h.seq, payload));
        }
        out
    }

    fn staged(&self) -> usize {
        self.seen.lock().unwrap().staged
    }
}

/// Small frames under load are staged; a large frame, a tagged one and the
/// goodbye, written or queued among them, keep the order of the sends.
#[test]
fn staged_frames_keep_their_order_among_queued_ones() {
    let mut f = Fixture::new();
    // (number, length, tagged), sent without the engine running between.
    let plan: Vec<(u8, usize, bool)> = (0..40u8)
        .map(|n| match n {
            12 | 30 => (n, 20_000, false),
            21 => (n, 64, true),
            _ => (n, 16 + usize::from(n) * 5, false),
        })
        .collect();
    for &(n, len, tagged) in &plan {
        if tagged {
            f.send_tagged(n, len);
        } else {
            f.send(n, len);
        }
    }
    f.link.close();
    f.settle();
    let frames = f.frames();
    let data: Vec<_> = frames.iter().filter(|(k, ..)| *k == FrameKind::Data).collect();
    assert_eq!(data.len(), plan.len(), "every frame once");
    for (i, ((_, _, payload), &(n, len, _))) in data.iter().zip(&plan).enumerate() {
        assert_eq!(*payload, Some((n, len)), "frame {i} in order");
    }
    let seqs: Vec<u32> = frames.iter().map(|(_, s, _)| *s).collect();
    assert_eq!(seqs, (0..seqs.len() as u32).collect::<Vec<_>>(), "sequence numbers in wire order");
    assert_eq!(frames.last().map(|f| f.0), Some(FrameKind::Control), "the goodbye last");
    assert!(f.staged() > 0, "small frames under load were staged");
}

/// A sender that stages [`crate::staged::FLUSH_FRAMES`] writes them itself:
/// with the engine not running at all, the frames still reach the wire.
#[test]
fn a_batch_of_staged_frames_is_written_by_its_sender() {
    let f = Fixture::new();
    let sent = crate::staged::FLUSH_FRAMES as usize + 8;
    for n in 0..sent {
        f.send(n as u8, 32);
    }
    let written = f.frames().len();
    assert!(written >= sent - 8, "only {written} of {sent} frames written without the engine");
    assert!(f.staged() > 0, "staged, not queued");
}

/// Staging keeps no pool buffer: each goes back as its frame is staged.
#[test]
fn a_staged_frame_holds_no_pool_buffer() {
    let f = Fixture::new();
    let before = f.link.pool().stats().buffers_in_use;
    for n in 0..20u8 {
        f.send(n, 48);
        // The first few are written directly (a quiet link); the rest are
        // staged, none written yet.
        assert_eq!(f.link.pool().stats().buffers_in_use, before, "frame {n} still holds its buffer");
    }
    assert!(f.staged() == 0 && f.frames().len() < 20, "the staged frames wait for the writer");
}
