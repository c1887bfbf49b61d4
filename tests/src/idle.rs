//! An idle connection costs no CPU: once set up, and with heartbeats off,
//! its I/O threads sleep until something happens (a frame, a send, a
//! close), instead of waking on a timer to look around.
//!
//! A thread's wake-ups are read from `/proc/self/task/<tid>/status` (its
//! voluntary and involuntary context switches). Only the threads created
//! for the pair are counted, so run these in a process of their own, or
//! with one test at a time.

use std::collections::HashMap;
use std::thread;
use std::time::Duration;

use crate::Transport;

/// A thread of this process: its name and its context switches so far.
#[derive(Debug, Clone)]
struct Task {
    name: String,
    switches: u64,
}

/// Every thread of this process, by thread id.
fn tasks() -> HashMap<u32, Task> {
    let mut out = HashMap::new();
    let dir = std::fs::read_dir("/proc/self/task").expect("reading /proc/self/task");
    for entry in dir.flatten() {
        let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        // A thread may end between the listing and the reads.
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else { continue };
        let field = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0)
        };
        let name = status.lines().find_map(|l| l.strip_prefix("Name:")).unwrap_or("").trim().to_owned();
        let switches = field("voluntary_ctxt_switches:") + field("nonvoluntary_ctxt_switches:");
        out.insert(tid, Task { name, switches });
    }
    out
}

/// Open a pair, exchange one message each way, then check that it sleeps
/// (see [`stays_asleep`]). Returns how many threads were watched.
pub fn an_idle_connection_sleeps(t: &Transport, settle: Duration, watch: Duration, max_wakes: u64) -> usize {
    let open = || {
        let (a, b) = t.pair();
        let limit = Duration::from_secs(10);
        for (from, to) in [(&a, &b), (&b, &a)] {
            let mut buf = from.alloc(8).expect("alloc");
            buf.copy_from_slice(b"are you?");
            from.send_timeout(buf, limit).expect("send");
            assert_eq!(&*to.recv_timeout(limit).expect("recv"), b"are you?");
        }
        (a, b)
    };
    stays_asleep(open, settle, watch, max_wakes).1
}

/// Name of the application thread [`a_blocked_receiver_sleeps`] watches
/// (a `zerocast` prefix, so that [`stays_asleep`] counts it).
const RECEIVER: &str = "zerocast-test-blocked-recv";

/// An application thread blocked in `recv` (no deadline) on an idle
/// connection sleeps too: it wakes at most `max_wakes` times in `watch`,
/// and then at once for the peer's close. Returns the threads watched
/// (the receiving one and the engine's).
pub fn a_blocked_receiver_sleeps(t: &Transport, watch: Duration, max_wakes: u64) -> usize {
    let open = || {
        let (a, b) = t.pair();
        let limit = Duration::from_secs(10);
        let mut buf = a.alloc(8).expect("alloc");
        buf.copy_from_slice(b"are you?");
        a.send_timeout(buf, limit).expect("send");
        assert_eq!(&*b.recv_timeout(limit).expect("recv"), b"are you?");
        let receiver = thread::Builder::new()
            .name(RECEIVER.into())
            .spawn(move || b.recv().map(|m| m.len()))
            .expect("spawning the receiver");
        (a, receiver)
    };
    let ((a, receiver), n) = stays_asleep(open, Duration::from_millis(300), watch, max_wakes);
    a.close();
    match receiver.join().expect("receiving thread") {
        Err(zerocast::RecvError::Disconnected) => {}
        other => panic!("the blocked receive ended with {other:?}, not the peer's close"),
    }
    n
}

/// Name of the application thread [`a_sender_blocked_on_credit_sleeps`]
/// watches.
const SENDER: &str = "zerocast-test-blocked-send";

/// An application thread blocked in `send` (no deadline) for credit that
/// a silent peer never returns sleeps: it wakes at most `max_wakes` times
/// in `watch`, and a local `close` from another thread then ends its send
/// with `Disconnected`, handing the buffer back. Returns the threads
/// watched.
pub fn a_sender_blocked_on_credit_sleeps(t: &Transport, watch: Duration, max_wakes: u64) -> usize {
    let open = || {
        let (a, b) = t.pair();
        // Fill the peer's window; it never reads.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let buf = a.alloc(8).expect("alloc");
            match a.try_send(buf) {
                Ok(()) => {}
                Err(zerocast::SendError::Full(_)) => break,
                Err(e) => panic!("filling the window: {e}"),
            }
            assert!(std::time::Instant::now() < deadline, "the window never filled");
        }
        let sender = {
            let a = a.clone();
            thread::Builder::new()
                .name(SENDER.into())
                .spawn(move || match a.send(a.alloc(8).expect("alloc")) {
                    Err(zerocast::SendError::Disconnected(buf)) => buf.len(),
                    other => panic!("the blocked send ended with {other:?}, not the local close"),
                })
                .expect("spawning the sender")
        };
        (a, b, sender)
    };
    let ((a, b, sender), n) = stays_asleep(open, Duration::from_millis(300), watch, max_wakes);
    a.close();
    assert_eq!(sender.join().expect("sending thread"), 8, "the buffer comes back");
    drop(b);
    n
}

/// A frame whose payload finds the receiver's pool at its cap waits for
/// a buffer asleep: the receiving side's engine (nobody receives yet) is
/// woken by the release of a buffer, not by a timer, and the message
/// arrives whole then. Each end has a pool of its own, the receiver's
/// 16 buffers of 512 bytes, all held. Returns the threads watched.
pub fn a_payload_waiting_for_a_buffer_sleeps(scheme: &str, watch: Duration, max_wakes: u64) -> usize {
    use zerocast::{Config, LinkConfig, PoolConfig, Wait, Zerocast};
    let open = || {
        let tiny =
            PoolConfig::default().with_classes([512]).with_region_size(16 * 512).with_max_bytes(16 * 512);
        let link = LinkConfig::default().with_max_payload(512);
        let server = Zerocast::with_config(Config::default().with_pool(tiny).with_link(link));
        let listener = server.listen(&format!("{scheme}://127.0.0.1:0")).expect("listen");
        let at = listener.local_endpoint().to_string();
        let client =
            thread::spawn(move || Zerocast::with_config(Config::default()).connect(&at).expect("connect"));
        let receiving = listener.accept().expect("accept");
        let sending = client.join().expect("connect thread");
        let pool = server.pool().expect("pool");
        let held: Vec<_> = std::iter::from_fn(|| pool.alloc(512, Wait::No).ok()).collect();
        assert_eq!(held.len(), 16, "the receiver's pool is held whole");
        let mut msg = sending.alloc(300).expect("alloc");
        msg.fill(0x5a);
        sending.send(msg).expect("send");
        (listener, sending, receiving, held)
    };
    let ((_listener, sending, receiving, held), n) =
        stays_asleep(open, Duration::from_millis(300), watch, max_wakes);
    drop(held);
    let got = receiving.recv_timeout(Duration::from_secs(5)).expect("the message, once a buffer is back");
    assert!(got.len() == 300 && got.iter().all(|&b| b == 0x5a), "the message arrives whole");
    drop((got, sending, receiving));
    n
}

/// Handshaken connections a `tcp://` listener holds for `accept` before it
/// stops taking peers (its backlog).
pub const TCP_ACCEPT_BACKLOG: usize = 1024;

/// A `tcp://` listener whose application does not `accept` fills its
/// backlog and stops taking peers: its engine then sleeps, with no timer,
/// until an `accept` makes room, and the peer that waited is taken at once.
/// Returns how many threads were watched.
pub fn a_listener_held_by_its_backlog_sleeps(watch: Duration, max_wakes: u64) -> usize {
    use std::sync::mpsc;
    use zerocast::Zerocast;
    crate::process::raise_open_files(4 * TCP_ACCEPT_BACKLOG as u64 + 256);
    let client = Zerocast::new();
    let (done_tx, done) = mpsc::channel();
    let open = || {
        let server = Zerocast::new();
        let listener = server.listen("tcp://127.0.0.1:0").expect("listen");
        let at = listener.local_endpoint().to_string();
        let held: Vec<_> = (0..TCP_ACCEPT_BACKLOG)
            .map(|i| client.connect(&at).unwrap_or_else(|e| panic!("connection {i}: {e}")))
            .collect();
        // One more: its handshake waits until the listener takes it.
        let (client, at) = (client.clone(), at.clone());
        let waiting = thread::spawn(move || {
            let r = client.connect(&at);
            let _ = done_tx.send(());
            r
        });
        (server, listener, held, waiting)
    };
    let ((server, listener, held, waiting), n) =
        stays_asleep(open, Duration::from_millis(300), watch, max_wakes);
    assert!(done.try_recv().is_err(), "a peer beyond the backlog was taken while accept was behind");
    let first = listener.accept().expect("accept");
    done.recv_timeout(Duration::from_secs(4)).expect("the waiting peer, once accept made room");
    waiting.join().expect("connect thread").expect("the waiting peer's connect");
    drop((first, held, listener, server));
    n
}

/// Run `open`, let what it opened settle for `settle`, then watch it idle
/// for `watch`: every thread zerocast started meanwhile wakes at most
/// `max_wakes` times. Returns what `open` returned, and how many threads
/// were watched (at least one, or the check would be empty).
pub fn stays_asleep<T>(
    open: impl FnOnce() -> T,
    settle: Duration,
    watch: Duration,
    max_wakes: u64,
) -> (T, usize) {
    let before = tasks();
    let opened = open();
    thread::sleep(settle);
    let start = tasks();
    thread::sleep(watch);
    let end = tasks();
    let mut watched = Vec::new();
    for (tid, task) in &end {
        if before.contains_key(tid) || !task.name.starts_with("zerocast") {
            continue;
        }
        let Some(at_start) = start.get(tid) else { continue };
        watched.push((task.name.clone(), *tid, task.switches - at_start.switches));
    }
    watched.sort();
    assert!(!watched.is_empty(), "no zerocast thread was started: {end:?}");
    let busy: Vec<_> = watched.iter().filter(|(_, _, n)| *n > max_wakes).collect();
    assert!(
        busy.is_empty(),
        "threads that woke more than {max_wakes} times in {watch:?} of idling: {busy:?} (all: {watched:?})"
    );
    (opened, watched.len())
}
