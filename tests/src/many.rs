//! Many connections at once (`tcp://`, or any [`Spec`]): a server in this process, the clients
//! in a child process (this test binary run again), so that each process
//! holds one end of each connection and needs one descriptor per
//! connection, within the usual hard limit of open files (the client role
//! is [`client_role`]). The clients connect one after another from one
//! thread, then each sends one checksummed message, all before any echo is
//! read; one server thread accepts them all and echoes each message; the
//! clients check every echo: intact, and on its own connection. No thread
//! per connection on the test's side: what each process runs beyond that
//! is the transport's.

use std::io::{BufRead, BufReader, Lines, Read};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use zerocast::{Connection, Listener, Zerocast};

use crate::{checksum, process};

/// The size of each message over `tcp://`: its index, length and
/// checksum, and a body.
pub const MSG_LEN: usize = 64;

/// What a many-connections test opens.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// Where the server listens (its port 0).
    pub listen: fn() -> String,
    /// The context each process opens (the same settings on both sides).
    pub zerocast: fn() -> Zerocast,
    /// Descriptors each connection end holds.
    pub fds_per_conn: u64,
    /// The length of the message connection `i` carries (at least 32).
    pub msg_len: fn(usize) -> usize,
}

/// `tcp://` on loopback, at defaults, with [`MSG_LEN`]-byte messages.
pub const TCP: Spec = Spec {
    listen: || "tcp://127.0.0.1:0".to_owned(),
    zerocast: Zerocast::new,
    fds_per_conn: 1,
    msg_len: |_| MSG_LEN,
};

/// `rc://` at the RDMA device's address (`ZEROCAST_RDMA_ADDR`), at default
/// settings but for [`rc_config`], with messages of 64 B to 60 KB (eager
/// or rendezvous, as each end's receive shape decides).
#[cfg(feature = "rdma")]
pub const RC: Spec = Spec {
    listen: || {
        let addr = std::env::var("ZEROCAST_RDMA_ADDR").unwrap_or_else(|_| "10.0.2.15".to_owned());
        format!("rc://{addr}:0")
    },
    zerocast: || Zerocast::with_config(rc_config()),
    // None: completion events come through the engine's one completion
    // channel, which rings a sleeping receiver's own eventfd (one per
    // thread, not per connection), and rdma_cm events through the
    // transport's one event channel.
    fds_per_conn: 0,
    msg_len: |i| [64, 2_000, 20_000, 60_000][i % 4],
};

/// The defaults with `rnr_retry` 0: an RNR fails the connection instead of
/// being retried away.
#[cfg(feature = "rdma")]
pub fn rc_config() -> zerocast::Config {
    zerocast::Config::default().with_rc(zerocast::rdma::RcConfig::default().with_rnr_retry(0))
}

/// The `tcp://` transport's I/O threads in a process: the default
/// transport runs one engine thread that drives every connection and every
/// listener handshake.
pub const ENGINES: usize = 1;

/// Threads beside the engines: libtest's main thread, the test's thread,
/// the server thread, and one to spare.
pub const OTHERS: usize = 4;

/// The thread bound is checked each time this many more connections are
/// open, not only at the end.
const CHECK_EVERY: usize = 1_000;

/// Fails if this process runs more than `ENGINES + OTHERS` threads with
/// `open` connections open; returns how many it runs. `side` names the
/// process in the message.
pub fn check_threads(side: &str, open: usize) -> usize {
    let threads = process::Proc::me().threads();
    assert!(
        threads <= ENGINES + OTHERS,
        "{side}: {threads} threads with {open} connections open: more than {ENGINES} engine(s) + {OTHERS}"
    );
    threads
}

/// A callback for [`open_and_echo`] and [`client_role`] that checks the
/// thread bound after every `CHECK_EVERY` connections: a thread per
/// connection fails early and plainly, rather than when the process runs
/// out of threads.
pub fn check_threads_every(side: &'static str) -> impl FnMut(usize) + Send {
    let mut since = 0;
    move |open| {
        since += 1;
        if since == CHECK_EVERY {
            check_threads(side, open);
            since = 0;
        }
    }
}

/// Descriptors beyond one per connection: the listener, the engine's, the
/// standard streams, `/proc` reads.
const SPARE_FDS: u64 = 1_000;

/// How long any one step (an accept, a send, a receive) may take before the
/// test gives up on it.
pub const STEP: Duration = Duration::from_secs(30);

/// The environment variable that makes a test binary the client process:
/// "ENDPOINT N".
const CLIENT_ENV: &str = "ZEROCAST_MANY_CLIENT";

/// What the client process prints once every echo is checked, then its
/// times to open the connections and to exchange the messages, in µs.
const READY: &str = "zerocast-many-clients-ready";

/// The server side of `n` connections, each having carried one message
/// there and back, and the client process that holds the other side.
#[derive(Debug)]
pub struct Opened {
    /// The listener they came through (still open).
    pub listener: Listener,
    /// The server sides, in the order they were accepted.
    pub servers: Vec<Connection>,
    /// The client process, holding its connections until [`Opened::finish`].
    pub clients: Clients,
    /// From the client's first connect to its last.
    pub open_time: Duration,
    /// From the client's first send to its last echo checked.
    pub echo_time: Duration,
}

/// The client process.
#[derive(Debug)]
pub struct Clients {
    child: Child,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl Clients {
    /// Start the client process (this binary's test `test_name`, which
    /// must call [`client_role`] first) for `n` connections to `at`.
    pub fn start(spec: &Spec, at: &str, test_name: &str, n: usize) -> Clients {
        process::raise_open_files(n as u64 * spec.fds_per_conn + SPARE_FDS);
        let mut child = Command::new(std::env::current_exe().expect("the test binary"))
            .args(["--exact", test_name, "--include-ignored", "--nocapture", "--test-threads=1"])
            .env(CLIENT_ENV, format!("{at} {n}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting the client process");
        let stdout = BufReader::new(child.stdout.take().expect("piped")).lines();
        Clients { child, stdout }
    }

    /// Wait until the client process has checked every echo: its times to
    /// open the connections and to exchange the messages. `None` if it
    /// ended first.
    pub fn wait_ready(&mut self) -> Option<(Duration, Duration)> {
        let times = loop {
            let Some(Ok(line)) = self.stdout.next() else { return None };
            // libtest may have written "test NAME ... " before it.
            match line.split_once(READY) {
                Some((_, times)) => break times.to_owned(),
                None => println!("client process: {line}"),
            }
        };
        let us: Vec<u64> = times.split_whitespace().map(|t| t.parse().expect("a time in µs")).collect();
        Some((Duration::from_micros(us[0]), Duration::from_micros(us[1])))
    }

    /// The client process ended before it was ready: fail with its status.
    pub fn ended_early(&mut self) -> ! {
        let status = self.child.wait().expect("waiting for the client process");
        panic!("the client process ended before all echoes were checked: {status}");
    }

    /// Let the client process close its connections and end; it must end
    /// well.
    pub fn finish(mut self) {
        drop(self.child.stdin.take());
        for line in self.stdout.by_ref().map_while(Result::ok) {
            println!("client process: {line}");
        }
        let status = self.child.wait().expect("waiting for the client process");
        assert!(status.success(), "the client process failed: {status}");
    }

    /// Its process, to measure.
    pub fn proc(&self) -> process::Proc {
        process::Proc::pid(self.child.id())
    }
}

impl Opened {
    /// Let the client process close its connections and end; it must end
    /// well.
    pub fn finish(self) {
        let Opened { clients, servers, listener, .. } = self;
        clients.finish();
        drop((servers, listener));
    }
}

impl Drop for Clients {
    fn drop(&mut self) {
        // Not finished (a failure on this side): do not leave it behind.
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Closes the listener if this side panics, so the server thread's accept
/// ends at once instead of at its timeout.
struct CloseOnPanic<'a>(&'a Listener);

impl Drop for CloseOnPanic<'_> {
    fn drop(&mut self) {
        if thread::panicking() {
            self.0.close();
        }
    }
}

/// Listen on `spec.listen` and start the client process (this binary's
/// test `test_name`, which must call [`client_role`] with the same `spec`
/// first), which opens `n` connections and sends message `i` on the `i`th.
/// The server thread calls `accepted(k)` after the `k`th accept, then
/// echoes every message. Returns once the client process has checked every
/// echo.
pub fn open_and_echo(
    zc: &Zerocast,
    spec: &Spec,
    test_name: &str,
    n: usize,
    accepted: impl FnMut(usize) + Send,
) -> Opened {
    let listener = zc.listen(&(spec.listen)()).expect("listen");
    let at = listener.local_endpoint().to_string();
    let mut clients = Clients::start(spec, &at, test_name, n);
    let (servers, (open_time, echo_time)) = thread::scope(|s| {
        let server = s.spawn(|| serve(&listener, n, accepted));
        let _close = CloseOnPanic(&listener);
        let Some(times) = clients.wait_ready() else {
            // Whichever side failed first is the cause: the server thread
            // if it has ended, else the client process (whose error is on
            // stderr, above).
            let server_first = server.is_finished();
            listener.close();
            if let (true, Err(panic)) = (server_first, server.join()) {
                std::panic::resume_unwind(panic);
            }
            clients.ended_early();
        };
        (server.join().expect("the server thread panicked"), times)
    });
    Opened { listener, servers, clients, open_time, echo_time }
}

/// The server thread: accept `n` connections, then echo each one's message.
fn serve(listener: &Listener, n: usize, mut accepted: impl FnMut(usize)) -> Vec<Connection> {
    let mut conns = Vec::with_capacity(n);
    for i in 0..n {
        let conn = listener
            .accept_timeout(STEP)
            .unwrap_or_else(|e| panic!("server: accepting connection {i} of {n}: {e}"));
        conns.push(conn);
        accepted(i + 1);
    }
    // Every client sends before it reads, so waiting on each connection in
    // turn holds up no one.
    for (i, conn) in conns.iter().enumerate() {
        let msg = conn
            .recv_timeout(STEP)
            .unwrap_or_else(|e| panic!("server: no message on accepted connection {i}: {e}"));
        let mut echo = conn.alloc(msg.len()).expect("server: alloc");
        echo.copy_from_slice(&msg);
        drop(msg);
        conn.send_timeout(echo, STEP)
            .unwrap_or_else(|e| panic!("server: echo on accepted connection {i}: {e}"));
    }
    conns
}

/// In the client process (started by [`open_and_echo`]), play the clients
/// and return `true`: the test then returns at once. `opened(k)` runs
/// after the `k`th connection is up. Elsewhere, return `false`.
pub fn client_role(spec: &Spec, mut opened: impl FnMut(usize)) -> bool {
    let Ok(how) = std::env::var(CLIENT_ENV) else { return false };
    let (at, n) = how.split_once(' ').expect("ENDPOINT N");
    let n: usize = n.parse().expect("N");
    process::raise_open_files(n as u64 * spec.fds_per_conn + SPARE_FDS);
    let zc = (spec.zerocast)();
    let start = Instant::now();
    let mut conns = Vec::with_capacity(n);
    for i in 0..n {
        conns.push(
            zc.connect(at).unwrap_or_else(|e| panic!("client: connection {i} of {n} (to {at}): {e:?}")),
        );
        opened(i + 1);
    }
    let open_time = start.elapsed();
    let start = Instant::now();
    for (i, conn) in conns.iter().enumerate() {
        let mut msg = conn.alloc((spec.msg_len)(i)).expect("alloc");
        checksum::write(i as u64, &mut msg);
        conn.send_timeout(msg, STEP).unwrap_or_else(|e| panic!("client: send on connection {i}: {e}"));
    }
    for (i, conn) in conns.iter().enumerate() {
        let echo =
            conn.recv_timeout(STEP).unwrap_or_else(|e| panic!("client: no echo on connection {i}: {e}"));
        let seq =
            checksum::verify(&echo).unwrap_or_else(|e| panic!("client: the echo on connection {i}: {e}"));
        assert_eq!(seq, i as u64, "client: connection {i} got the echo of connection {seq}");
        assert_eq!(echo.len(), (spec.msg_len)(i), "client: the echo on connection {i} changed length");
    }
    println!("{READY} {} {}", open_time.as_micros(), start.elapsed().as_micros());
    // Hold every connection until the server side is done measuring: it
    // closes our stdin.
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    drop(conns);
    true
}
