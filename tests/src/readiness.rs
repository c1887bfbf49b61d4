//! The [`zerocast::Poller`] over a transport: many connections served by
//! two threads, no arrival untold, the end reported, one registration per
//! connection.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use zerocast::{AlreadyRegistered, Connection, Events, Poller, RecvError};

use crate::checksum;
use crate::Transport;

/// A token no connection uses: tells a serving thread to stop.
const STOP: usize = usize::MAX;

/// How long a serving thread waits for a report before it calls the
/// silence a lost wake-up (every test here keeps traffic going until it
/// stops the servers).
const SILENCE: Duration = Duration::from_secs(20);

/// `n` connected pairs through one listener: (clients, servers). One at a
/// time: a connect completes its handshake without `accept` (the
/// listener's engine runs it), and a listener's backlog is bounded.
fn pairs(t: &Transport, n: usize) -> (Vec<Connection>, Vec<Connection>) {
    let listener = t.listen();
    let at = listener.local_endpoint().to_string();
    (0..n)
        .map(|i| {
            let client = t.zc.connect(&at).unwrap_or_else(|e| panic!("connect {i}: {e}"));
            let server = listener.accept_timeout(SILENCE).unwrap_or_else(|e| panic!("accept {i}: {e}"));
            (client, server)
        })
        .unzip()
}

/// What the serving threads saw.
#[derive(Debug, Default)]
struct Served {
    /// Messages taken, over all connections.
    messages: AtomicU64,
    /// Per connection, the next sequence number expected.
    next: Mutex<Vec<u64>>,
}

/// Run `threads` serving threads on `poller` over `servers` (token = index):
/// each drains a reported connection with `try_recv`, checks every
/// message's checksum and order, and with `echo` sends it back. They stop
/// at [`STOP`]; a wait of [`SILENCE`] with no report fails the test.
fn serve(
    poller: &Poller,
    servers: Arc<Vec<Connection>>,
    threads: usize,
    echo: bool,
) -> (Arc<Served>, Vec<thread::JoinHandle<()>>) {
    let served = Arc::new(Served { next: Mutex::new(vec![0; servers.len()]), ..Served::default() });
    let handles = (0..threads)
        .map(|_| {
            let (poller, servers, served) = (poller.clone(), servers.clone(), served.clone());
            thread::spawn(move || {
                let mut events = Events::with_capacity(32);
                loop {
                    if poller.wait(&mut events, Some(SILENCE)) == 0 {
                        panic!("no report for {SILENCE:?} with traffic going on: a lost wake-up");
                    }
                    for token in events.iter() {
                        if token == STOP {
                            poller.wake(STOP);
                            return;
                        }
                        drain(&servers[token], token, &served, echo);
                    }
                }
            })
        })
        .collect();
    (served, handles)
}

/// Take everything `conn` holds, which arms it again.
fn drain(conn: &Connection, token: usize, served: &Served, echo: bool) {
    loop {
        match conn.try_recv() {
            Ok(msg) => {
                let seq = checksum::verify(&msg).unwrap_or_else(|e| panic!("connection {token}: {e}"));
                {
                    let mut next = served.next.lock().expect("next");
                    assert_eq!(seq, next[token], "connection {token}: lost, duplicated or reordered");
                    next[token] += 1;
                }
                served.messages.fetch_add(1, Ordering::Relaxed);
                if echo {
                    let mut reply = conn.alloc(msg.len()).expect("alloc");
                    reply.copy_from_slice(&msg);
                    drop(msg);
                    conn.send(reply).expect("echo");
                }
            }
            Err(RecvError::Empty) => return,
            // The peer closed: reported like a message; nothing more comes.
            Err(RecvError::Disconnected) => return,
            Err(e) => panic!("connection {token} failed: {e}"),
        }
    }
}

/// `conns` connections, each echoing `rounds` checksummed messages of mixed
/// sizes, served by two threads through one poller: every echo comes back
/// intact and in order.
pub fn two_threads_serve_many(t: &Transport, conns: usize, rounds: u64) {
    let (clients, servers) = pairs(t, conns);
    let poller = Poller::new();
    for (token, conn) in servers.iter().enumerate() {
        poller.register(conn, token).expect("register");
    }
    let servers = Arc::new(servers);
    let (served, handles) = serve(&poller, servers.clone(), 2, true);
    let max = clients[0].max_message().min(64 * 1024);
    for seq in 0..rounds {
        for c in &clients {
            let mut buf = c.alloc(checksum::size_for(seq, max)).expect("alloc");
            checksum::write(seq, &mut buf);
            c.send(buf).expect("send");
        }
        for (i, c) in clients.iter().enumerate() {
            let echo = c.recv_timeout(SILENCE).unwrap_or_else(|e| panic!("connection {i}, echo {seq}: {e}"));
            assert_eq!(checksum::verify(&echo), Ok(seq), "connection {i}: a wrong echo");
        }
    }
    poller.wake(STOP);
    for h in handles {
        h.join().expect("serving thread");
    }
    assert_eq!(served.messages.load(Ordering::Relaxed), conns as u64 * rounds);
    drop(clients);
    drop(servers);
    t.assert_pool_drained(Duration::from_secs(10));
}

/// Bursts of 1 to 8 messages sent with random gaps, 10,000 of them by
/// default, while one thread drains and re-arms: many arrive while it is
/// between its last `try_recv` and its next `wait`. A lost wake-up leaves
/// the sender blocked on credit and the server waiting: the server's
/// `SILENCE` fails the test. Every message arrives once, in order.
pub fn no_arrival_untold(t: &Transport, bursts: u64) {
    let (clients, servers) = pairs(t, 1);
    let poller = Poller::new();
    poller.register(&servers[0], 0).expect("register");
    let (served, handles) = serve(&poller, Arc::new(servers), 1, false);
    let client = &clients[0];
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut seq = 0;
    for _ in 0..bursts {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        for _ in 0..=(rng % 8) {
            let mut buf = client.alloc(checksum::HEADER + (seq as usize % 64)).expect("alloc");
            checksum::write(seq, &mut buf);
            client.send_timeout(buf, SILENCE).expect("send: the server stopped taking messages");
            seq += 1;
        }
        // A gap of 0 to about 20 µs, spun: sometimes none at all.
        let spin = Instant::now() + Duration::from_nanos((rng >> 8) % 20_000);
        while Instant::now() < spin {
            std::hint::spin_loop();
        }
    }
    let deadline = Instant::now() + SILENCE;
    while served.messages.load(Ordering::Relaxed) < seq {
        assert!(
            Instant::now() < deadline,
            "{} of {seq} messages taken",
            served.messages.load(Ordering::Relaxed)
        );
        thread::sleep(Duration::from_millis(1));
    }
    poller.wake(STOP);
    for h in handles {
        h.join().expect("serving thread");
    }
}

/// A peer's close is reported like a message, and `try_recv` then says
/// `Disconnected`; a registration is for life, one per connection; a
/// blocking `recv` on a registered connection gets the engine's
/// deliveries; what was queued before registering is reported at once.
pub fn end_and_registration(t: &Transport) {
    let (clients, servers) = pairs(t, 1);
    let (client, server) = (&clients[0], &servers[0]);
    let mut buf = client.alloc(checksum::HEADER).expect("alloc");
    checksum::write(0, &mut buf);
    client.send(buf).expect("send");
    // Queued before registering: wait until the server has it.
    let deadline = Instant::now() + SILENCE;
    while server.stats().queued == 0 {
        assert!(Instant::now() < deadline, "the first message never arrived");
        thread::sleep(Duration::from_millis(1));
    }
    let poller = Poller::new();
    poller.register(server, 1).expect("register");
    assert_eq!(poller.register(server, 2), Err(AlreadyRegistered));
    assert_eq!(Poller::new().register(server, 3), Err(AlreadyRegistered), "one poller per connection");
    let mut events = Events::with_capacity(8);
    assert_eq!(poller.wait(&mut events, Some(SILENCE)), 1, "what was queued is reported at once");
    assert_eq!(events.iter().collect::<Vec<_>>(), [1]);
    // The blocking receive takes it (the engine read it).
    assert_eq!(checksum::verify(&server.recv_timeout(SILENCE).expect("recv")), Ok(0));
    assert!(matches!(server.try_recv(), Err(RecvError::Empty)), "drained: armed again");
    // Blocking receive of a later message, read by the engine.
    let mut buf = client.alloc(checksum::HEADER).expect("alloc");
    checksum::write(1, &mut buf);
    client.send(buf).expect("send");
    assert_eq!(checksum::verify(&server.recv_timeout(SILENCE).expect("recv")), Ok(1));
    // That delivery was reported too, since the connection was armed.
    assert_eq!(poller.wait(&mut events, Some(SILENCE)), 1);
    assert!(matches!(server.try_recv(), Err(RecvError::Empty)));
    // Nothing more comes: the wait times out.
    assert_eq!(poller.wait(&mut events, Some(Duration::from_millis(50))), 0);
    client.close();
    assert_eq!(poller.wait(&mut events, Some(SILENCE)), 1, "the end is reported");
    assert!(matches!(server.try_recv(), Err(RecvError::Disconnected)));
    let stopped = Arc::new(AtomicBool::new(false));
    // A thread waiting with no limit is woken by `wake`.
    let waiter = {
        let (poller, stopped) = (poller.clone(), stopped.clone());
        thread::spawn(move || {
            let mut events = Events::with_capacity(1);
            poller.wait(&mut events, None);
            stopped.store(true, Ordering::SeqCst);
            let first = events.iter().next();
            first
        })
    };
    poller.wake(STOP);
    assert_eq!(waiter.join().expect("waiter"), Some(STOP));
    assert!(stopped.load(Ordering::SeqCst));
}
