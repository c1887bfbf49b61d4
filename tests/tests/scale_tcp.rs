//! 10 000 `tcp://` connections open at once, each carrying one checksummed
//! message there and back, while each process runs a handful of threads:
//! the transport's engine and the test's own, not a few per connection.
//! The bound, `many::ENGINES` + `many::OTHERS`, is checked every 1 000
//! connections on the way up and with all open. The server side is this
//! process, the client side a child process (see `zerocast_tests::many`).
//! Prints the thread counts, the times and the resident memory (for the
//! documentation's figures).
//!
//! One test in this binary: it counts the process's threads.

use std::time::Instant;

use zerocast::Zerocast;
use zerocast_tests::many::{self, ENGINES, OTHERS};
use zerocast_tests::process::Proc;

/// Connections open at the same time.
const CONNS: usize = 10_000;

#[test]
fn ten_thousand_connections_run_on_a_few_threads() {
    if many::client_role(&many::TCP, many::check_threads_every("client process")) {
        return;
    }
    let start = Instant::now();
    let rss_before = Proc::me().rss_kib();
    let opened = many::open_and_echo(
        &Zerocast::new(),
        &many::TCP,
        "ten_thousand_connections_run_on_a_few_threads",
        CONNS,
        many::check_threads_every("server process"),
    );
    // All 10 000 open, both sides, and every echo checked.
    let elapsed = start.elapsed();
    let threads = many::check_threads("server process", CONNS);
    let clients = opened.clients.proc();
    let client_threads = clients.threads();
    let (rss, client_rss) = (Proc::me().rss_kib(), clients.rss_kib());
    println!(
        "{CONNS} tcp:// connections: opened in {:?}, one echo each in {:?}, {elapsed:?} in all; \
         with all open: {threads} threads in the server process, {client_threads} in the client \
         process (bound {}); VmRSS {} MiB (+{} MiB) in the server process, {} MiB in the client \
         process; {:?}",
        opened.open_time,
        opened.echo_time,
        ENGINES + OTHERS,
        rss / 1024,
        rss.saturating_sub(rss_before) / 1024,
        client_rss / 1024,
        opened.listener.stats(),
    );
    assert_eq!(opened.servers.len(), CONNS);
    assert!(
        client_threads <= ENGINES + OTHERS,
        "client process: {client_threads} threads with {CONNS} connections open: more than \
         {ENGINES} engine(s) + {OTHERS}"
    );
    let closing = Instant::now();
    opened.finish();
    println!("closing them took {:?}", closing.elapsed());
}
