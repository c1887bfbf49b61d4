//! A writer that lingers (see `Driver::linger`) misses no kick: one that
//! came while it let go of the wire, for a backlog that a sending thread's
//! own write left there, makes the step report the backlog, so the engine
//! watches the socket for room. The engine is driven by hand
//! (`Engine::detached`), and the sender's write runs in the writer's yield.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use zerocast_core::ConnError;

use crate::engine::Engine;
use crate::test_writer::{settle, WriterTask};
use crate::{Frame, Link, Wire, WireCtx, Writing};

/// Payloads this large are written by their sender whenever the wire is
/// free (`DIRECT_LARGE`).
const LARGE: usize = 20_000;

/// A test double for a socket's write path: takes every frame whole but a
/// large one, whose tail it keeps as a backlog (the socket was full),
/// until the engine flushes it.
struct Backlogged(Arc<AtomicBool>);

impl Wire for Backlogged {
    fn write(&mut self, frames: &mut [Frame], ctx: &WireCtx<'_>) -> Result<(), ConnError> {
        let large = frames.iter().any(|f| f.payload.as_ref().is_some_and(|p| p.len() >= LARGE));
        if large && !self.0.swap(true, Ordering::SeqCst) {
            // As a socket's wire does when its backlog begins.
            ctx.kick();
        }
        Ok(())
    }

    fn backlog(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    fn flush(&mut self, _ctx: &WireCtx<'_>) -> Result<(), ConnError> {
        self.0.store(false, Ordering::SeqCst);
        Ok(())
    }
}

fn send(link: &Link, len: usize) {
    let buf = link.alloc(len, None).unwrap();
    link.send(buf, None).unwrap();
}

#[test]
fn a_backlog_left_while_the_writer_lingers_is_reported() {
    let (link, driver) = crate::shared::tests::open(64);
    let link = Arc::new(link);
    let (engine, mut progress) = Engine::detached("linger-test").unwrap();
    let (backlog, said) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(Vec::new())));
    let wire = Box::new(Backlogged(backlog.clone()));
    engine.register(Box::new(WriterTask { driver, wire: Some(wire), said: said.clone() }));
    settle(&mut progress);
    // A quiet link's frames go out from their senders; past a few in
    // flight, one is queued for the writer, whose step then lingers.
    for _ in 0..6 {
        send(&link, 100);
    }
    said.lock().unwrap().clear();
    crate::engine::allow_lingers(1);
    let sender = link.clone();
    // While the writer lets go of the wire, a sender writes a large frame
    // itself, and the socket does not take it whole.
    crate::engine::on_linger_yield(Box::new(move || send(&sender, LARGE)));
    progress.progress();
    assert!(backlog.load(Ordering::SeqCst), "the sender's frame left a backlog");
    let said = said.lock().unwrap().clone();
    assert_eq!(said.first(), Some(&Writing::Backlog), "the step reports the backlog: {said:?}");
}
