//! One tokio runtime with two worker threads serves 10,000 concurrent
//! `tcp://` clients through `zerocast::tokio`: a task per accepted
//! connection echoes its checksummed message, and the process runs no
//! thread per connection — its engines are tasks of the runtime, so the
//! bound is the two workers plus the test's own threads. The clients are a
//! child process (see `zerocast_tests::many`), which checks every echo.
//!
//! One test in this binary: it counts the process's threads.

use std::time::Instant;

use zerocast_tests::many;
use zerocast_tests::many_async;
use zerocast_tests::process::Proc;

/// Connections open at the same time.
const CONNS: usize = 10_000;
/// The runtime's worker threads.
const WORKERS: usize = 2;

#[test]
fn ten_thousand_async_clients_on_two_workers() {
    if many::client_role(&many::TCP, many::check_threads_every("client process")) {
        return;
    }
    let start = Instant::now();
    let rss_before = Proc::me().rss_kib();
    let served = many_async::open_and_echo(
        &many::TCP,
        zerocast::Config::default(),
        "ten_thousand_async_clients_on_two_workers",
        CONNS,
        WORKERS,
    );
    let client = served.clients.proc();
    println!(
        "{CONNS} async tcp:// clients: opened in {:?}, one echo each in {:?}, {:?} in all; with all \
         open: {} threads in the server process ({WORKERS} workers), {} in the client process; VmRSS \
         {} MiB (+{} MiB) in the server process, {} MiB in the client process",
        served.open_time,
        served.echo_time,
        start.elapsed(),
        served.threads,
        client.threads(),
        Proc::me().rss_kib() / 1024,
        Proc::me().rss_kib().saturating_sub(rss_before) / 1024,
        client.rss_kib() / 1024,
    );
    let closing = Instant::now();
    let stats = served.finish();
    println!("closing them took {:?}; {stats:?}", closing.elapsed());
    assert_eq!(stats.accepted, CONNS as u64);
}
