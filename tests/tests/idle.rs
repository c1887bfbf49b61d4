//! An idle `tcp://` connection's threads sleep (see `zerocast_tests::idle`).
//! One test in this binary, so no other test's threads are counted.

use std::time::Duration;

use zerocast_tests::{idle, Transport};

#[test]
fn an_idle_tcp_connection_does_not_wake() {
    let t = Transport::new("tcp://127.0.0.1:0", 64);
    // Reader and writer threads on both sides.
    let n = idle::an_idle_connection_sleeps(&t, Duration::from_millis(300), Duration::from_secs(2), 3);
    assert!(n >= 4, "{n} threads watched");
}
