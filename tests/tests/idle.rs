//! Idle `tcp://` and `mem://` connections' threads sleep (see
//! `zerocast_tests::idle`). One test in this binary, the transports one
//! after the other, so no other test's threads are counted.

use std::time::Duration;

use zerocast_tests::{idle, Transport};

#[test]
fn idle_connections_do_not_wake() {
    // The engine thread that drives both sides, on each transport.
    for (uri, at_least) in [("tcp://127.0.0.1:0", 1), ("mem://idle-{n}", 1)] {
        let t = Transport::new(uri, 64);
        let n = idle::an_idle_connection_sleeps(&t, Duration::from_millis(300), Duration::from_secs(2), 3);
        assert!(n >= at_least, "{uri}: {n} threads watched");
        // And an application thread blocked in `recv` (the engine started
        // above is not counted again).
        let n = idle::a_blocked_receiver_sleeps(&t, Duration::from_secs(2), 3);
        assert_eq!(n, 1, "{uri}: threads watched");
        // And one blocked in `send` for credit the peer never returns.
        let n = idle::a_sender_blocked_on_credit_sleeps(&t, Duration::from_secs(2), 3);
        assert_eq!(n, 1, "{uri}: threads watched");
    }
    // And a payload waiting for a pool buffer: the engines of the two
    // contexts it opens.
    let n = idle::a_payload_waiting_for_a_buffer_sleeps("tcp", Duration::from_secs(2), 3);
    assert_eq!(n, 2, "tcp: threads watched");
    // And a listener whose backlog is full (`accept` is behind): the
    // engines of the server, which an `accept` wakes, and of the clients.
    let n = idle::a_listener_held_by_its_backlog_sleeps(Duration::from_secs(2), 3);
    assert_eq!(n, 2, "tcp listener: threads watched");
}
