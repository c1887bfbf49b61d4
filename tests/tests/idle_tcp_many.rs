//! Idle is free: 10 000 idle `tcp://` connections (heartbeats off, the
//! default), after one message there and back on each, cost less than 1% of
//! one core. The server side is this process, the client side a child
//! process (see `zerocast_tests::many`); the CPU time of both is counted.
//!
//! One test in this binary: it measures the process's CPU time.

use std::thread;
use std::time::{Duration, Instant};

use zerocast::Zerocast;
use zerocast_tests::many;
use zerocast_tests::process::Proc;

/// Connections held open.
const CONNS: usize = 10_000;

/// Time given, after the last echo, to what the exchange left to do (the
/// credits of the echoed messages going back): anything still running
/// after it counts as the cost of idling.
const SETTLE: Duration = Duration::from_secs(1);

/// The measurement: both processes idle this long.
const WINDOW: Duration = Duration::from_secs(10);

/// CPU time allowed per second of idling, all threads of both processes:
/// 1% of one core.
const BUDGET_PER_SEC: Duration = Duration::from_millis(10);

#[test]
fn ten_thousand_idle_connections_cost_no_cpu() {
    let zc = Zerocast::new();
    assert_eq!(zc.config().link.heartbeat, None, "heartbeats are off by default");
    // A thread per connection fails here, early, not by running the
    // process out of threads (see `scale_tcp` for the bound).
    if many::client_role(&many::TCP, many::check_threads_every("client process")) {
        return;
    }
    let opened = many::open_and_echo(
        &zc,
        &many::TCP,
        "ten_thousand_idle_connections_cost_no_cpu",
        CONNS,
        many::check_threads_every("server process"),
    );
    // No thread of the test's is busy now: the server thread has ended, the
    // client process waits for its stdin to close, and this thread sleeps.
    thread::sleep(SETTLE);
    let (me, clients) = (Proc::me(), opened.clients.proc());
    let cpu = || (me.cpu_time(), clients.cpu_time());
    let (server_start, client_start) = cpu();
    let start = Instant::now();
    thread::sleep(WINDOW);
    let (server_end, client_end) = cpu();
    let idled = start.elapsed();
    let (server_cpu, client_cpu) = (server_end - server_start, client_end - client_start);
    let used = server_cpu + client_cpu;
    let budget = BUDGET_PER_SEC.mul_f64(idled.as_secs_f64());
    println!(
        "{CONNS} idle tcp:// connections (opened in {:?}, one echo each in {:?}) over {idled:?}: \
         {used:?} of CPU ({:?} per second; server process {server_cpu:?}, client process \
         {client_cpu:?}; budget {budget:?}); threads: {} in the server process, {} in the client \
         process; VmRSS {} MiB and {} MiB",
        opened.open_time,
        opened.echo_time,
        used.div_f64(idled.as_secs_f64()),
        me.threads(),
        clients.threads(),
        me.rss_kib() / 1024,
        clients.rss_kib() / 1024,
    );
    assert!(
        used < budget,
        "{CONNS} idle connections used {used:?} of CPU in {idled:?} (server process {server_cpu:?}, \
         client process {client_cpu:?}): more than {BUDGET_PER_SEC:?} per second"
    );
    opened.finish();
}
