//! The close timeout (`Driver::close_deadline`, time passed in): it runs
//! once the application let go of both sides of a connection, until the
//! goodbye exchange ends, restarting whenever the peer returns credits;
//! past its deadline the connection fails with `ConnError::TimedOut`.

use std::time::{Duration, Instant};

use zerocast_core::{ConnError, FrameKind, Header};

use crate::driver::{Batch, Fill};
use crate::shared::tests::open;

/// The default close timeout.
const TIMEOUT: Duration = Duration::from_secs(30);

#[test]
fn it_runs_from_the_let_go_and_fails_the_connection_at_its_deadline() {
    let (link, driver) = open(8);
    let now = Instant::now();
    assert!(matches!(driver.close_deadline(now), Ok(None)), "an open connection");
    link.close();
    assert!(matches!(driver.close_deadline(now), Ok(None)), "closed, but still receiving");
    let before = Instant::now();
    link.close_receiver();
    let after = Instant::now();
    let deadline = match driver.close_deadline(after) {
        Ok(Some(d)) => d,
        other => panic!("let go of: the timeout runs, got {other:?}"),
    };
    assert!((before + TIMEOUT..=after + TIMEOUT).contains(&deadline), "counted from the let-go");
    let just_before = deadline - Duration::from_millis(1);
    assert!(matches!(driver.close_deadline(just_before), Ok(Some(d)) if d == deadline));
    assert!(driver.error().is_none(), "not failed before the deadline");
    assert!(matches!(driver.close_deadline(deadline), Err(ConnError::TimedOut(_))));
    assert!(matches!(driver.error(), Some(ConnError::TimedOut(_))), "the connection failed");
    assert!(!link.wait_closed(Some(Instant::now())), "not a clean end");
    assert!(matches!(driver.close_deadline(deadline + TIMEOUT), Ok(None)), "over: no timeout runs");
}

#[test]
fn the_order_of_the_two_closes_does_not_matter() {
    let (link, driver) = open(8);
    link.close_receiver();
    assert!(matches!(driver.close_deadline(Instant::now()), Ok(None)), "still sending");
    link.close();
    assert!(matches!(driver.close_deadline(Instant::now()), Ok(Some(_))));
}

#[test]
fn an_exchange_that_ends_in_time_stops_it() {
    let (link, driver) = open(8);
    link.close();
    link.close_receiver();
    // Our goodbye goes out...
    let mut batch = Batch::with_capacity(8);
    assert!(matches!(driver.fill_from(None, &mut batch, true), Fill::Ready));
    assert_eq!(batch.frames.last().map(|f| f.header.kind), Some(FrameKind::Control), "our goodbye");
    assert!(matches!(driver.close_deadline(Instant::now()), Ok(Some(_))), "the peer's is due");
    // ...and the peer's comes in.
    driver.on_frame(Header::new(FrameKind::Control, 0, 0, 0), None).unwrap();
    let late = Instant::now() + 2 * TIMEOUT;
    assert!(matches!(driver.close_deadline(late), Ok(None)), "the exchange ended");
    assert!(driver.error().is_none(), "a clean end");
}

#[test]
fn credits_the_peer_returns_restart_it() {
    let (link, driver) = open(8);
    for _ in 0..2 {
        let buf = link.alloc(10, None).unwrap();
        link.send(buf, None).unwrap();
    }
    link.close();
    link.close_receiver();
    let first = match driver.close_deadline(Instant::now()) {
        Ok(Some(d)) => d,
        other => panic!("let go of: the timeout runs, got {other:?}"),
    };
    // Let the clock move past the let-go, so a restart shows.
    std::thread::sleep(Duration::from_millis(5));
    // The peer takes one of our messages and returns its credit: it still
    // makes progress, so the timeout counts from now.
    let before = Instant::now();
    driver.on_frame(Header::new(FrameKind::Credit, 1, 0, 0), None).unwrap();
    let restarted = match driver.close_deadline(Instant::now()) {
        Ok(Some(d)) => d,
        other => panic!("still running, got {other:?}"),
    };
    assert!(
        restarted >= before + TIMEOUT && restarted > first,
        "restarted at the credit: {first:?} {restarted:?}"
    );
    assert!(matches!(driver.close_deadline(first), Ok(Some(_))), "the first deadline no longer ends it");
    // A frame without credits (a peer that only holds on) does not.
    driver.on_frame(Header::new(FrameKind::Credit, 0, 1, 0), None).unwrap();
    assert!(matches!(driver.close_deadline(Instant::now()), Ok(Some(d)) if d == restarted));
    assert!(matches!(driver.close_deadline(restarted), Err(ConnError::TimedOut(_))));
}
