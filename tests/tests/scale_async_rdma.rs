//! One tokio runtime with two worker threads serves 1,000 concurrent
//! `rc://` clients at default settings through `zerocast::tokio` (only
//! `rnr_retry` is 0, so an RNR would fail the connection): a task per
//! accepted connection echoes its checksummed message of 64 B to 60 KB,
//! the engines — their completion channel and rdma_cm event channel
//! included — are tasks of the runtime, and the process runs no thread per
//! connection. rxe's RNR counters must not move. The clients are a child
//! process (see `zerocast_tests::many`).
//!
//! Needs a verbs device: ignored on a plain `cargo test`; `scripts/test`
//! runs it inside the Soft-RoCE guest. One test in this binary: it counts
//! the process's threads.

#![cfg(feature = "rdma")]

use std::time::Instant;

use zerocast_tests::many::{self, rc_config, RC as SPEC};
use zerocast_tests::many_async;

/// Connections open at the same time.
const CONNS: usize = 1_000;
/// The runtime's worker threads.
const WORKERS: usize = 2;

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn a_thousand_async_rc_clients_on_two_workers() {
    if many::client_role(&SPEC, many::check_threads_every("client process")) {
        return;
    }
    let rnr_before = zerocast_tests::rnr_counters();
    let start = Instant::now();
    let served = many_async::open_and_echo(
        &SPEC,
        rc_config(),
        "a_thousand_async_rc_clients_on_two_workers",
        CONNS,
        WORKERS,
    );
    println!(
        "{CONNS} async rc:// clients: opened in {:?}, one echo each in {:?}, {:?} in all; with all \
         open: {} threads in the server process ({WORKERS} workers), {} in the client process",
        served.open_time,
        served.echo_time,
        start.elapsed(),
        served.threads,
        served.clients.proc().threads(),
    );
    assert_eq!(zerocast_tests::rnr_counters(), rnr_before, "RNR counters (received, sent) moved");
    let stats = served.finish();
    assert_eq!(stats.accepted, CONNS as u64);
}
