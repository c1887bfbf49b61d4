//! Failure detection and cleanup, written once for every connection
//! transport (`tcp://` on the host; `rc://` and `rc+oob://` in the Soft-RoCE
//! guest): a peer process killed mid-stream, a peer that goes silent without
//! a FIN or RST, reconnecting to a restarted peer.
//!
//! Peers are child processes: the test binary runs itself again, for the one
//! test, with [`CHILD_ENV`] set to a role and a URI. Every test function that
//! spawns peers starts with `if failure::child_main() { return; }`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use zerocast::{ConnError, Connection, ErrorKind, Pool, RecvError, SendError, Zerocast};

use crate::{checksum, Transport};

/// Set in a peer process: `ROLE URI`.
pub const CHILD_ENV: &str = "ZEROCAST_FAILURE_CHILD";
/// A peer that listens prints this, then its bound endpoint, on a line.
const ENDPOINT_LINE: &str = "zerocast-peer-endpoint ";
/// Largest message the streams here send.
const MAX_MSG: usize = 4096;

/// Play the peer's part if this process is one; `true` if it was.
///
/// Roles: `reader` connects and reads until killed; `streamer` connects
/// and sends checksummed messages until the connection ends; `echo` listens,
/// prints its endpoint, and echoes one connection's messages back;
/// `netns-streamer` first configures the veth end `zcv1` it is given (as
/// `10.77.0.2/24`) in its own network namespace, then streams.
pub fn child_main() -> bool {
    let Ok(spec) = std::env::var(CHILD_ENV) else { return false };
    let (role, uri) = spec.split_once(' ').expect("peer spec: ROLE URI");
    let zc = Zerocast::new();
    match role {
        "reader" => {
            let conn = zc.connect(uri).expect("peer connect");
            while conn.recv_timeout(Duration::from_secs(60)).is_ok() {}
        }
        "streamer" => stream_until_closed(&zc.connect(uri).expect("peer connect")),
        "netns-streamer" => {
            setup_netns_end();
            stream_until_closed(&zc.connect(uri).expect("peer connect"));
        }
        "echo" => {
            let listener = zc.listen(uri).expect("peer listen");
            let mut out = std::io::stdout().lock();
            writeln!(out, "{ENDPOINT_LINE}{}", listener.local_endpoint()).expect("stdout");
            out.flush().expect("stdout");
            drop(out);
            let conn = listener.accept().expect("peer accept");
            while let Ok(msg) = conn.recv_timeout(Duration::from_secs(60)) {
                let mut buf = conn.alloc(msg.len()).expect("peer alloc");
                buf.copy_from_slice(&msg);
                drop(msg);
                if conn.send(buf).is_err() {
                    break;
                }
            }
        }
        other => panic!("unknown peer role {other}"),
    }
    true
}

fn stream_until_closed(conn: &Connection) {
    for seq in 0.. {
        let mut buf = conn.alloc(checksum::size_for(seq, MAX_MSG)).expect("peer alloc");
        checksum::write(seq, &mut buf);
        match conn.send_timeout(buf, Duration::from_secs(60)) {
            Ok(()) => {}
            Err(_) => return,
        }
    }
}

/// Run `ip` with `args` (in this process's network namespace); panic on failure.
pub fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

fn setup_netns_end() {
    let start = Instant::now();
    // The parent moves zcv1 into our namespace once we run.
    while !Command::new("ip").args(["link", "show", "zcv1"]).output().is_ok_and(|o| o.status.success()) {
        assert!(start.elapsed() < Duration::from_secs(20), "zcv1 never arrived");
        thread::sleep(Duration::from_millis(20));
    }
    ip(&["link", "set", "lo", "up"]);
    ip(&["addr", "add", "10.77.0.2/24", "dev", "zcv1"]);
    ip(&["link", "set", "zcv1", "up"]);
}

/// A peer process: this test binary, run again in a role.
#[derive(Debug)]
pub struct Peer {
    child: Child,
    /// The endpoint an `echo` peer listens at.
    pub endpoint: Option<String>,
}

impl Peer {
    /// Start a peer for `test_name` (the running test, found with `--exact`)
    /// in `role`, talking to (or listening at) `uri`. `prefix` runs it under
    /// another command (`unshare --net`, say).
    pub fn spawn(test_name: &str, role: &str, uri: &str, prefix: &[&str]) -> Peer {
        let exe = std::env::current_exe().expect("current exe");
        let mut cmd = match prefix.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(exe);
                c
            }
            None => Command::new(exe),
        };
        cmd.args(["--include-ignored", "--exact", test_name, "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, format!("{role} {uri}"))
            .stdout(if role == "echo" { Stdio::piped() } else { Stdio::null() });
        let mut child = cmd.spawn().expect("spawn peer");
        let mut endpoint = None;
        if role == "echo" {
            let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
            for line in lines.by_ref() {
                let line = line.expect("peer stdout");
                // libtest may have written "test NAME ... " before it.
                if let Some((_, ep)) = line.split_once(ENDPOINT_LINE) {
                    endpoint = Some(ep.trim().to_owned());
                    break;
                }
            }
            assert!(endpoint.is_some(), "the echo peer never listened");
            // Keep reading, so the peer's later output never hits a closed pipe.
            thread::spawn(move || lines.for_each(drop));
        }
        Peer { child, endpoint }
    }

    /// The peer's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL it and reap it.
    pub fn kill(&mut self) {
        self.child.kill().expect("kill peer");
        let _ = self.child.wait();
    }

    /// Send it a signal by name (`STOP`, `CONT`).
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill").arg(format!("-{sig}")).arg(self.pid().to_string()).status();
        assert!(ok.is_ok_and(|s| s.success()), "kill -{sig} failed");
    }

    /// Wait for it to exit on its own, within `timeout`; whether it succeeded.
    pub fn wait(&mut self, timeout: Duration) -> bool {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status.success();
            }
            if start.elapsed() > timeout {
                self.kill();
                return false;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A second, unrelated connection streaming checksummed messages in order
/// the whole time, to show that one connection's failure touches no other.
#[derive(Debug)]
pub struct Bystander {
    stop: Arc<AtomicBool>,
    received: Arc<AtomicU64>,
    tx: JoinHandle<u64>,
    rx: JoinHandle<Result<u64, String>>,
}

impl Bystander {
    /// Open a pair over `t` and start streaming.
    pub fn start(t: &Transport) -> Bystander {
        let (client, server) = t.pair();
        let stop = Arc::new(AtomicBool::new(false));
        let received = Arc::new(AtomicU64::new(0));
        let s = stop.clone();
        let tx = thread::spawn(move || {
            let mut seq = 0;
            while !s.load(Ordering::Relaxed) {
                let mut buf = client.alloc(checksum::size_for(seq, MAX_MSG)).expect("bystander alloc");
                checksum::write(seq, &mut buf);
                client.send_timeout(buf, Duration::from_secs(20)).expect("bystander send");
                seq += 1;
            }
            client.close();
            seq
        });
        let r = received.clone();
        let rx = thread::spawn(move || {
            let mut next = 0;
            loop {
                match server.recv_timeout(Duration::from_secs(20)) {
                    Ok(msg) => {
                        let seq = checksum::verify(&msg)?;
                        if seq != next {
                            return Err(format!("bystander: expected {next}, got {seq}"));
                        }
                        next += 1;
                        r.store(next, Ordering::Relaxed);
                    }
                    Err(RecvError::Disconnected) => return Ok(next),
                    Err(e) => return Err(format!("bystander receive: {e:?}")),
                }
            }
        });
        Bystander { stop, received, tx, rx }
    }

    /// Messages received and verified so far.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// Wait (at most `timeout`) until `n` more messages than `since` arrived.
    pub fn wait_for_more(&self, since: u64, n: u64, timeout: Duration) {
        let start = Instant::now();
        while self.received() < since + n {
            assert!(start.elapsed() < timeout, "the bystander stalled at {} messages", self.received());
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// Stop, and check that every message sent arrived intact and in order.
    pub fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let sent = self.tx.join().expect("bystander sender");
        let got = self.rx.join().expect("bystander receiver").expect("bystander data");
        assert_eq!(sent, got, "bystander lost messages");
        got
    }
}

/// What [`peer_killed`] measured.
#[derive(Debug)]
pub struct KillReport {
    /// From SIGKILL to the typed error on the sending side.
    pub detected: Duration,
    /// The error.
    pub error: ConnError,
    /// Bystander messages verified after the kill.
    pub bystander_after: u64,
}

/// A peer process reading a stream is SIGKILLed mid-stream, after a
/// random number of messages (1 to 4,000: early, while credits are still
/// in their first window, or late). The sending side gets a typed error
/// within `limit`, receiving reports the failure too, each of [kind
/// `PeerGone`](ErrorKind::PeerGone) whatever the transport and the timing,
/// nothing hangs, a bystander connection keeps streaming during and after,
/// and every buffer of `pool` comes back.
pub fn peer_killed(t: &Transport, pool: &Pool, test_name: &str, limit: Duration) -> KillReport {
    let bystander = Bystander::start(t);
    let listener = t.zc.listen(&t.listen_uri.replace("{n}", "kill")).expect("listen");
    let mut peer = Peer::spawn(test_name, "reader", &listener.local_endpoint().to_string(), &[]);
    let conn = listener.accept().expect("accept");
    let sending = Arc::new(AtomicU64::new(0));
    let streamer = {
        let (conn, sending) = (conn.clone(), sending.clone());
        thread::spawn(move || {
            let start = Instant::now();
            for seq in 0.. {
                let mut buf = conn.alloc(checksum::size_for(seq, MAX_MSG)).expect("alloc");
                checksum::write(seq, &mut buf);
                match conn.send_timeout(buf, Duration::from_millis(50)) {
                    Ok(()) => {
                        sending.store(seq + 1, Ordering::Relaxed);
                    }
                    Err(SendError::Timeout(_)) => {}
                    Err(SendError::Failed(_, e)) => return (e, Instant::now()),
                    Err(e) => panic!("expected a failure, got {e:?}"),
                }
                assert!(start.elapsed() < Duration::from_secs(60), "no failure after a minute");
            }
            unreachable!()
        })
    };
    // Mid-stream, at a random point: the peer is reading what we send.
    let kill_after = 1 + random_below(4_000);
    println!("killing the peer after {kill_after} messages");
    let start = Instant::now();
    while sending.load(Ordering::Relaxed) < kill_after {
        assert!(start.elapsed() < Duration::from_secs(30), "the stream to the peer never got going");
        thread::sleep(Duration::from_millis(5));
    }
    let before = bystander.received();
    let killed = Instant::now();
    peer.kill();
    let (error, at) = streamer.join().expect("streamer");
    let detected = at.saturating_duration_since(killed);
    assert!(detected < limit, "typed error after {detected:?}, over {limit:?}: {error}");
    assert_eq!(error.kind(), ErrorKind::PeerGone, "the send's error: {error:?}");
    // Receiving ends with the failure too, at once, of the same kind.
    match conn.recv_timeout(limit) {
        Err(e @ RecvError::Failed(_)) => assert_eq!(e.kind(), Some(ErrorKind::PeerGone), "{e:?}"),
        other => panic!("receive after the peer's death: {other:?}"),
    }
    let buf = conn.alloc(16).expect("alloc");
    match conn.send(buf) {
        Err(e @ SendError::Failed(..)) => assert_eq!(e.kind(), Some(ErrorKind::PeerGone), "{e:?}"),
        other => panic!("send on the failed connection: {other:?}"),
    }
    drop(conn);
    drop(listener);
    // The bystander streamed through the kill and keeps streaming.
    bystander.wait_for_more(before, 1_000, Duration::from_secs(30));
    let bystander_after = bystander.received() - before;
    bystander.finish();
    crate::assert_pool_drained(pool, Duration::from_secs(10));
    KillReport { detected, error, bystander_after }
}

/// A peer process streaming to us is stopped with SIGSTOP: its kernel (or
/// its RDMA device) keeps the connection up, but nothing more comes. With
/// heartbeats every `hb` (set on `t`), receiving fails with
/// [`ConnError::HeartbeatTimeout`] within three intervals and half a
/// second; every buffer of `pool` comes back. Returns the time from the stop.
pub fn peer_stopped(t: &Transport, pool: &Pool, test_name: &str, hb: Duration) -> Duration {
    let listener = t.zc.listen(&t.listen_uri.replace("{n}", "stop")).expect("listen");
    let peer = Peer::spawn(test_name, "streamer", &listener.local_endpoint().to_string(), &[]);
    let conn = listener.accept().expect("accept");
    let (took, err) = receive_until_silent(&conn, || peer.signal("STOP"));
    peer.signal("CONT");
    drop(peer);
    check_silence_detected(took, &err, hb);
    drop(conn);
    drop(listener);
    crate::assert_pool_drained(pool, Duration::from_secs(10));
    took
}

/// Receive and verify a stream; after 2,000 messages call `silence` (which
/// stops the peer or cuts the path) and keep receiving until the
/// connection fails. Returns the time from `silence` to the failure.
pub fn receive_until_silent(conn: &Connection, silence: impl FnOnce()) -> (Duration, ConnError) {
    let mut silence = Some(silence);
    let mut silenced = None;
    let mut next = 0u64;
    loop {
        match conn.recv_timeout(Duration::from_secs(30)) {
            Ok(msg) => {
                let seq = checksum::verify(&msg).expect("intact message");
                assert_eq!(seq, next, "message order");
                next += 1;
            }
            Err(RecvError::Failed(e)) => {
                let Some(at) = silenced else { panic!("failed before the peer was silenced: {e}") };
                return (Instant::now().duration_since(at), e);
            }
            Err(e) => panic!("expected a heartbeat failure, got {e:?}"),
        }
        if next == 2_000 {
            (silence.take().expect("once"))();
            silenced = Some(Instant::now());
        }
    }
}

/// The failure is the heartbeat's, within three intervals and half a
/// second, and of kind [`ErrorKind::PeerSilent`] on every transport.
pub fn check_silence_detected(took: Duration, err: &ConnError, hb: Duration) {
    assert!(matches!(err, ConnError::HeartbeatTimeout { .. }), "not a heartbeat timeout: {err:?}");
    assert_eq!(err.kind(), ErrorKind::PeerSilent);
    let bound = hb * 3 + Duration::from_millis(500);
    assert!(took <= bound, "silence detected after {took:?}, over {bound:?}");
    // Not before three intervals either (less a little: a heartbeat that
    // was already on its way before the peer stopped counts).
    assert!(took >= hb * 2, "detected after only {took:?}: {err}");
}

/// Send `n` checksummed messages through an echo peer and check each reply.
pub fn echo_roundtrips(conn: &Connection, n: u64) {
    for seq in 0..n {
        let mut buf = conn.alloc(checksum::size_for(seq, MAX_MSG)).expect("alloc");
        checksum::write(seq, &mut buf);
        conn.send_timeout(buf, Duration::from_secs(20)).expect("send to the echo peer");
        let back = conn.recv_timeout(Duration::from_secs(20)).expect("echo");
        assert_eq!(checksum::verify(&back), Ok(seq));
    }
}

/// Connect to an echo peer, kill it, see the failure; start a new peer at
/// the same endpoint and connect again: the new connection works, and every
/// buffer of `pool` comes back. `listen_uri` is where the first peer listens
/// (port 0: any); the restarted one takes the same port.
pub fn reconnect(t: &Transport, pool: &Pool, test_name: &str, listen_uri: &str, limit: Duration) {
    let mut first = Peer::spawn(test_name, "echo", listen_uri, &[]);
    let at = first.endpoint.clone().expect("endpoint");
    let conn = t.zc.connect(&at).expect("connect");
    echo_roundtrips(&conn, 100);
    first.kill();
    match conn.recv_timeout(limit) {
        Err(RecvError::Failed(e)) => assert_eq!(e.kind(), ErrorKind::PeerGone, "{e:?}"),
        other => panic!("receive after the peer's death: {other:?}"),
    }
    drop(conn);
    // The application's reconnect loop, written against error kinds only,
    // starts while the server is down; each failure it sees is reported.
    let (failures_tx, failures) = std::sync::mpsc::channel();
    let (zc, target) = (t.zc.clone(), at.clone());
    let looper = thread::spawn(move || {
        connect_retrying(&zc, &target, Instant::now() + Duration::from_secs(60), |kind| {
            let _ = failures_tx.send(kind);
        })
    });
    let kind =
        failures.recv_timeout(Duration::from_secs(30)).expect("a failed attempt while the server is down");
    println!("reconnecting while the server is down: {kind}");
    let mut second = Peer::spawn(test_name, "echo", &at, &[]);
    assert_eq!(second.endpoint.as_deref(), Some(at.as_str()), "restarted at the same endpoint");
    let (conn, attempts) = looper.join().expect("reconnect loop");
    let kinds: Vec<ErrorKind> = failures.try_iter().chain([kind]).collect();
    println!("reconnected after {attempts} attempts; failures were {kinds:?}");
    assert!(kinds.iter().all(|k| k.is_retryable()), "{kinds:?}");
    echo_roundtrips(&conn, 1_000);
    drop(conn);
    assert!(second.wait(Duration::from_secs(30)), "the restarted peer did not end cleanly");
    crate::assert_pool_drained(pool, Duration::from_secs(10));
}

/// How an application reconnects, using nothing but [`ErrorKind`]: retry
/// what may succeed (a peer that is down, refusing or restarting), give up
/// at once on what will not. Returns the connection and the attempts made.
pub fn connect_retrying(
    zc: &Zerocast,
    at: &str,
    deadline: Instant,
    mut on_failure: impl FnMut(ErrorKind),
) -> (Connection, u32) {
    let mut attempts = 0;
    loop {
        attempts += 1;
        match zc.connect(at) {
            Ok(conn) => return (conn, attempts),
            Err(e) if e.kind().is_retryable() && Instant::now() < deadline => {
                on_failure(e.kind());
                thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("gave up reconnecting after {attempts} attempts: {e} ({})", e.kind()),
        }
    }
}

/// A number below `n`, different from run to run (the clock's nanoseconds
/// mixed with the process id): where to inject a fault.
pub fn random_below(n: u64) -> u64 {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let x =
        (nanos as u64 ^ u64::from(std::process::id()).rotate_left(32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x >> 11) % n
}
