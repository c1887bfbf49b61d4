//! A tail that a sending thread's ring write keeps back
//! (`WireCtx::may_keep_tail`) goes out: with the next frames the engine's
//! writer sends, or, when none follow, on its own (`Wire::flush_tail`).
//! The engine is driven by hand (`Engine::detached`).

use std::sync::{Arc, Mutex};

use zerocast_core::ConnError;

use crate::engine::Engine;
use crate::test_writer::{settle, WriterTask};
use crate::{Frame, Link, Wire, WireCtx};

/// What the wire double did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Seen {
    /// Frames out.
    written: usize,
    /// Frames kept back.
    kept: usize,
    /// `flush_tail` calls that had a tail to send.
    tails: usize,
}

/// A test double for a byte stream's write path: a write that may keep a
/// tail back keeps its last frame, and kicks the engine, as the TCP wire
/// keeps the bytes past its last whole packet; any later write sends the
/// kept frame first.
struct Tailing(Arc<Mutex<Seen>>);

impl Wire for Tailing {
    fn write(&mut self, frames: &mut [Frame], ctx: &WireCtx<'_>) -> Result<(), ConnError> {
        let mut s = self.0.lock().unwrap();
        s.written += s.kept + frames.len();
        s.kept = 0;
        if ctx.may_keep_tail() && !frames.is_empty() {
            s.written -= 1;
            s.kept = 1;
            ctx.kick();
        }
        Ok(())
    }

    fn flush_tail(&mut self, _ctx: &WireCtx<'_>) -> Result<(), ConnError> {
        let mut s = self.0.lock().unwrap();
        if s.kept > 0 {
            s.written += s.kept;
            s.kept = 0;
            s.tails += 1;
        }
        Ok(())
    }
}

/// A link whose engine has run once (attached), and what its wire saw.
fn attached() -> (Link, Engine, crate::engine::Progress, Arc<Mutex<Seen>>) {
    let (link, driver, engine, progress, seen) = attached_with_driver();
    drop(driver);
    (link, engine, progress, seen)
}

/// [`attached`], with a clone of the writer's driver, to step it by hand.
fn attached_with_driver() -> (Link, crate::Driver, Engine, crate::engine::Progress, Arc<Mutex<Seen>>) {
    let (link, driver) = crate::shared::tests::open(4096);
    let by_hand = driver.clone();
    let (engine, mut progress) = Engine::detached("tail-test").unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let wire = Box::new(Tailing(seen.clone()));
    engine.register(Box::new(WriterTask { driver, wire: Some(wire), said: Arc::default() }));
    settle(&mut progress);
    (link, by_hand, engine, progress, seen)
}

/// Send `n` frames from this thread without running the engine: past a
/// few in flight they queue, and each ring's worth is written here.
fn send(link: &Link, n: usize) {
    for _ in 0..n {
        link.try_send(link.pool().alloc(8, zerocast_mem::Wait::No).unwrap()).unwrap();
    }
}

/// Send one frame at a time, up to the send whose ring write left nothing
/// queued behind its tail: how many were sent.
fn send_until_a_tail_is_kept(link: &Link, seen: &Mutex<Seen>) -> usize {
    let mut total = 0;
    while seen.lock().unwrap().kept == 0 || !link.shared.tx.is_empty() {
        send(link, 1);
        total += 1;
        assert!(total < 10 * crate::queue::FAST, "no ring was written here");
    }
    assert_eq!(seen.lock().unwrap().written + 1, total);
    total
}

#[test]
fn a_kept_tail_with_nothing_behind_it_goes_out_on_its_own() {
    let (link, _engine, mut progress, seen) = attached();
    let total = send_until_a_tail_is_kept(&link, &seen);
    settle(&mut progress);
    let s = *seen.lock().unwrap();
    assert_eq!((s.written, s.kept), (total, 0), "the engine wrote everything: {s:?}");
    assert_eq!(s.tails, 1, "the tail went out alone: {s:?}");
}

#[test]
fn a_kept_tail_goes_out_with_the_frames_queued_behind_it() {
    let (link, _engine, mut progress, seen) = attached();
    let total = 2 * crate::queue::FAST;
    send(&link, total);
    // No ring's worth more: queued for the engine, behind the tail.
    let queued = link.shared.tx.len();
    send(&link, 3);
    assert_eq!(link.shared.tx.len(), queued + 3);
    settle(&mut progress);
    let s = *seen.lock().unwrap();
    assert_eq!((s.written, s.kept), (total + 3, 0), "{s:?}");
    assert_eq!(s.tails, 0, "the tail went out with the frames behind it: {s:?}");
}

/// The writer's step at a heartbeat tick that finds both goodbyes out and
/// in (the state a sending thread's ring write leaves when its kept tail
/// is our goodbye, and the peer's comes next) stops the writer: the kept
/// tail goes out first, or the peer would never see the goodbye.
#[test]
fn a_kept_tail_goes_out_when_the_writer_stops_at_a_tick() {
    let (link, writer, _engine, _progress, seen) = attached_with_driver();
    let total = send_until_a_tail_is_kept(&link, &seen);
    {
        let mut st = link.shared.lock();
        st.goodbye_sent = true;
        st.peer_closed = true;
    }
    assert_eq!(writer.drive_writer(true), crate::Writing::Finished);
    let s = *seen.lock().unwrap();
    assert_eq!((s.written, s.kept, s.tails), (total, 0, 1), "the tail went out before the stop: {s:?}");
}
