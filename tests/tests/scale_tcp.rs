//! 10 000 `tcp://` connections open at once, each carrying one checksummed
//! message there and back, while each process runs a handful of threads:
//! the transport's engine and the test's own, not a few per connection.
//! The server side is this process, the client side a child process (see
//! `zerocast_tests::many`). Prints the thread counts, the times and the
//! resident memory (for the documentation's figures).
//!
//! One test in this binary: it counts the process's threads.

use std::time::Instant;

use zerocast::Zerocast;
use zerocast_tests::many;
use zerocast_tests::process::Proc;

/// Connections open at the same time.
const CONNS: usize = 10_000;

/// The `tcp://` transport's I/O threads in a process: the default
/// transport runs one engine thread that drives every connection and every
/// listener handshake.
const ENGINES: usize = 1;

/// Threads beside the engines: libtest's main thread, this test's thread,
/// the server thread, and one to spare.
const OTHERS: usize = 4;

/// The thread bound is checked each time this many more connections are
/// open, on both sides, not only at the end.
const CHECK_EVERY: usize = 1_000;

/// Fails if this process runs more than `ENGINES + OTHERS` threads.
fn check_threads(side: &str, open: usize) -> usize {
    let threads = Proc::me().threads();
    assert!(
        threads <= ENGINES + OTHERS,
        "{side}: {threads} threads with {open} connections open: more than {ENGINES} engine(s) + {OTHERS}"
    );
    threads
}

#[test]
fn ten_thousand_connections_run_on_a_few_threads() {
    let every = |side| {
        let mut since = 0;
        move |open: usize| {
            since += 1;
            if since == CHECK_EVERY {
                check_threads(side, open);
                since = 0;
            }
        }
    };
    if many::client_role(every("client process")) {
        return;
    }
    let start = Instant::now();
    let rss_before = Proc::me().rss_kib();
    let opened = many::open_and_echo(
        &Zerocast::new(),
        "ten_thousand_connections_run_on_a_few_threads",
        CONNS,
        every("server process"),
    );
    // All 10 000 open, both sides, and every echo checked.
    let elapsed = start.elapsed();
    let threads = check_threads("server process", CONNS);
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
