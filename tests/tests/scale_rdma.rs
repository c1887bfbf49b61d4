//! 1 000 `rc://` connections open at once at default settings (the default
//! pool, no query parameters; only `rnr_retry` is 0, so an RNR would fail
//! the connection instead of being retried away), each carrying one
//! checksummed message there and back, while each process runs a handful
//! of threads. The server side is this process, the client side a child
//! process (see `zerocast_tests::many`). Messages of 64 B to 60 KB go
//! eager or by rendezvous, depending on the receive shape each end chose
//! (see `RcConfig::recv_memory`). rxe's RNR counters must not move.
//!
//! Needs a verbs device: ignored on a plain `cargo test`; `scripts/test`
//! runs it inside the Soft-RoCE guest. One test in this binary: it counts
//! the process's threads.

#![cfg(feature = "rdma")]

use std::time::{Duration, Instant};

use zerocast_tests::many::{self, ENGINES, OTHERS, RC as SPEC};
use zerocast_tests::process::Proc;

/// Connections open at the same time.
const CONNS: usize = 1_000;

/// Descriptors a process holds whatever its connections: the device, the
/// engine's epoll and wakeup, event channels, the listener, pipes, libtest.
const FIXED_FDS: usize = 100;

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn a_thousand_rc_connections_at_defaults_run_on_a_few_threads() {
    if many::client_role(&SPEC, many::check_threads_every("client process")) {
        return;
    }
    let rnr_before = zerocast_tests::rnr_counters();
    let start = Instant::now();
    let zc = (SPEC.zerocast)();
    let opened = many::open_and_echo(
        &zc,
        &SPEC,
        "a_thousand_rc_connections_at_defaults_run_on_a_few_threads",
        CONNS,
        many::check_threads_every("server process"),
    );
    let elapsed = start.elapsed();
    let threads = many::check_threads("server process", CONNS);
    let client_threads = opened.clients.proc().threads();
    let (fds, client_fds) = (Proc::me().fds(), opened.clients.proc().fds());
    let rc = zc.rc().expect("the rc transport");
    let memory = rc.recv_memory();
    let pool = rc.pool().stats();
    println!(
        "{CONNS} rc:// connections: opened in {:?}, one echo each in {:?}, {elapsed:?} in all; with all \
         open: {threads} threads in the server process, {client_threads} in the client process (bound \
         {}); {fds} descriptors in the server process, {client_fds} in the client process; receive \
         memory reserved {} MiB of {} MiB; pool {} MiB in {} regions; VmRSS {} MiB",
        opened.open_time,
        opened.echo_time,
        ENGINES + OTHERS,
        memory.reserved >> 20,
        memory.limit >> 20,
        pool.bytes >> 20,
        pool.regions,
        Proc::me().rss_kib() / 1024,
    );
    assert_eq!(opened.servers.len(), CONNS);
    assert!(
        client_threads <= ENGINES + OTHERS,
        "client process: {client_threads} threads with {CONNS} connections open: more than {ENGINES} \
         engine(s) + {OTHERS}"
    );
    let fd_bound = CONNS * SPEC.fds_per_conn as usize + FIXED_FDS;
    assert!(
        fds <= fd_bound && client_fds <= fd_bound,
        "{fds} descriptors in the server process, {client_fds} in the client's, with {CONNS} connections: \
         more than {} per connection and {FIXED_FDS} besides",
        SPEC.fds_per_conn
    );
    assert!(memory.reserved > 0 && memory.reserved <= memory.limit, "{memory:?}");
    assert_eq!(zerocast_tests::rnr_counters(), rnr_before, "RNR counters (received, sent) moved");
    opened.finish();
    // Closed connections give their receive memory back once their QPs
    // are gone: at once for those whose peer's disconnect came, and at
    // the close timeout for any whose peer's process ended before its
    // goodbye or its disconnect went out (its burst of a thousand
    // disconnect requests may overflow the receiving CM's queue, and a
    // process's exit sends them once, without retries), plus the flushes'
    // patience (10 s).
    let close_timeout = zerocast::LinkConfig::default().close_timeout;
    let deadline = Instant::now() + close_timeout + Duration::from_secs(60);
    while rc.recv_memory().reserved > 0 {
        assert!(Instant::now() < deadline, "receive memory still reserved: {:?}", rc.recv_memory());
        std::thread::sleep(Duration::from_millis(20));
    }
}
