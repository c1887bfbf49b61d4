//! [`crate::many`] with an async server: one tokio runtime of a few worker
//! threads accepts `n` connections through `zerocast::tokio`, and a task
//! per connection echoes its checksummed message, while the client process
//! (blocking zerocast, [`crate::many::client_role`]) checks every echo.
//! The engines are tasks of the runtime, so this process's thread count
//! must stay at the workers plus the test's own threads, whatever `n`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use zerocast::tokio::Zerocast;
use zerocast::ListenerStats;

use crate::many::{Clients, Spec, OTHERS, STEP};
use crate::process::Proc;

/// What [`open_and_echo`] measured, with everything still open.
#[derive(Debug)]
pub struct Served {
    /// The client process, holding its connections until [`Served::finish`].
    pub clients: Clients,
    /// From the client's first connect to its last.
    pub open_time: Duration,
    /// From the client's first send to its last echo checked.
    pub echo_time: Duration,
    /// This process's threads with every connection open.
    pub threads: usize,
    runtime: tokio::runtime::Runtime,
    server: tokio::task::JoinHandle<ListenerStats>,
}

impl Served {
    /// Let the client process close its connections and end (it must end
    /// well), and the server's tasks see each close; the listener's
    /// counters.
    pub fn finish(self) -> ListenerStats {
        self.clients.finish();
        self.runtime.block_on(self.server).expect("the server task panicked")
    }
}

/// Fails if this process runs more than `workers + OTHERS` threads with
/// `open` connections open; returns how many it runs.
pub fn check_threads(workers: usize, open: usize) -> usize {
    let threads = Proc::me().threads();
    assert!(
        threads <= workers + OTHERS,
        "server process: {threads} threads with {open} connections open: more than {workers} workers \
         + {OTHERS}"
    );
    threads
}

/// Listen with `cfg` on a runtime of `workers` threads and serve `n`
/// clients of the child process (this binary's test `test_name`, which
/// must call [`crate::many::client_role`] with the same `spec` first).
/// Returns once the client process has checked every echo; the thread
/// bound is checked every 1,000 accepts and with all open.
pub fn open_and_echo(
    spec: &Spec,
    cfg: zerocast::Config,
    test_name: &str,
    n: usize,
    workers: usize,
) -> Served {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("runtime");
    let zc = Zerocast::with_runtime(cfg, runtime.handle().clone());
    let listener = runtime.block_on(zc.listen(&(spec.listen)())).expect("listen");
    let at = listener.local_endpoint().to_string();
    let mut clients = Clients::start(spec, &at, test_name, n);
    let echoed = Arc::new(AtomicUsize::new(0));
    let server = runtime.spawn(serve(listener, n, workers, echoed.clone()));
    let Some((open_time, echo_time)) = clients.wait_ready() else {
        if server.is_finished() {
            if let Err(e) = runtime.block_on(server) {
                std::panic::resume_unwind(e.into_panic());
            }
        }
        clients.ended_early();
    };
    assert_eq!(echoed.load(Ordering::SeqCst), n, "the clients checked echoes the server did not send");
    let threads = check_threads(workers, n);
    Served { clients, open_time, echo_time, threads, runtime, server }
}

/// Accept `n` connections, a task each: echo one message, then hold the
/// connection until the client closes it.
async fn serve(
    listener: zerocast::tokio::Listener,
    n: usize,
    workers: usize,
    echoed: Arc<AtomicUsize>,
) -> ListenerStats {
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let conn = tokio::time::timeout(STEP, listener.accept())
            .await
            .unwrap_or_else(|_| panic!("server: no connection {i} of {n} after {:?}", start.elapsed()))
            .unwrap_or_else(|e| panic!("server: accepting connection {i} of {n}: {e}"));
        if (i + 1) % 1_000 == 0 {
            check_threads(workers, i + 1);
        }
        let echoed = echoed.clone();
        tasks.spawn(async move {
            let msg = conn.recv().await.unwrap_or_else(|e| panic!("server: no message on {i}: {e}"));
            let mut echo = conn.alloc(msg.len()).await.expect("server: alloc");
            echo.copy_from_slice(&msg);
            drop(msg);
            // Counted before it goes: once the echo is written, the client
            // may see it and report before this task runs again (a send
            // that finds the wire free writes the frame itself and returns).
            echoed.fetch_add(1, Ordering::SeqCst);
            conn.send(echo).await.unwrap_or_else(|e| panic!("server: echo on {i}: {e}"));
            assert!(conn.recv().await.is_err(), "server: a second message on {i}");
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("a connection's task panicked");
    }
    listener.stats()
}
