//! The conformance assertions over the async API (`zerocast::tokio`), and
//! what only an async API must show: no lost wake-up when a burst arrives
//! while a task re-arms, and futures dropped at any point losing or
//! duplicating nothing.
//!
//! Each function runs inside a tokio runtime (see
//! [`AsyncTransport::run`]): the transport's engines are tasks of it.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use zerocast::tokio::{Connection, Listener, Zerocast};
use zerocast::{AcceptError, Config, ErrorKind, LinkConfig, RecvError, SendError, TypedRecvError};

use crate::checksum;
use crate::suite::{order, Order, Record};

/// Long enough that only a hang reaches it.
const HANG: Duration = Duration::from_secs(30);

/// Run the future `make` gives on a fresh runtime of two worker threads
/// (made in it, so that contexts made there run their engines on it),
/// failing it after five minutes.
pub fn run_async<Fut: Future<Output = ()>>(make: impl FnOnce() -> Fut) {
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(300), make()).await.expect("the test hung");
    });
}

/// A transport under the async API.
#[derive(Debug, Clone)]
pub struct AsyncTransport {
    /// The async context; its engines run on the test's runtime.
    pub zc: Zerocast,
    /// URI to listen at; `{n}` is replaced by a unique number.
    pub listen_uri: &'static str,
}

impl AsyncTransport {
    /// Run `test` on a fresh runtime with two worker threads, with a
    /// transport at `listen_uri` and the given receive window made on it.
    pub fn run<F, Fut>(listen_uri: &'static str, window: u32, test: F)
    where
        F: FnOnce(AsyncTransport) -> Fut,
        Fut: Future<Output = ()>,
    {
        let cfg = Config::default().with_link(LinkConfig::default().with_recv_window(window));
        Self::run_with(listen_uri, cfg, test);
    }

    /// [`AsyncTransport::run`] with settings of the caller's.
    pub fn run_with<F, Fut>(listen_uri: &'static str, cfg: Config, test: F)
    where
        F: FnOnce(AsyncTransport) -> Fut,
        Fut: Future<Output = ()>,
    {
        run_async(|| async {
            let t = AsyncTransport { zc: Zerocast::with_config(cfg), listen_uri };
            let start = Instant::now();
            test(t).await;
            println!("{listen_uri}: {:?}", start.elapsed());
        });
    }

    /// A listener at [`AsyncTransport::listen_uri`].
    pub async fn listen(&self) -> Listener {
        static N: AtomicU64 = AtomicU64::new(0);
        let uri = self.listen_uri.replace("{n}", &N.fetch_add(1, Ordering::Relaxed).to_string());
        self.zc.listen(&uri).await.expect("listen")
    }

    /// A connected pair: (client, server), connected and accepted at once.
    pub async fn pair(&self) -> (Connection, Connection) {
        let listener = self.listen().await;
        let at = listener.local_endpoint().to_string();
        let (client, server) = tokio::join!(self.zc.connect(&at), listener.accept());
        (client.expect("connect"), server.expect("accept"))
    }

    /// The pool this transport's buffers come from: RC's own registered
    /// one for `rc://` and `rc+oob://`, the context's otherwise.
    pub fn pool(&self) -> zerocast::Pool {
        #[cfg(feature = "rdma")]
        if self.listen_uri.starts_with("rc") {
            return self.zc.blocking().rc().expect("rc transport").pool().clone();
        }
        self.zc.blocking().pool().expect("pool")
    }

    /// Wait until every pool buffer is back, or fail.
    pub async fn assert_pool_drained(&self) {
        let pool = self.pool();
        let start = Instant::now();
        loop {
            let s = pool.stats();
            if s.buffers_in_use == 0 {
                return;
            }
            assert!(start.elapsed() < HANG, "buffers leaked: {s:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

async fn send_bytes(conn: &Connection, bytes: &[u8]) {
    let mut buf = conn.alloc(bytes.len()).await.expect("alloc");
    buf.copy_from_slice(bytes);
    conn.send(buf).await.expect("send");
}

/// `n` checksummed messages of mixed sizes arrive intact, once each, in
/// order, sender and receiver in their own tasks.
pub async fn integrity(t: AsyncTransport, n: u64) {
    let (client, server) = t.pair().await;
    let max = client.max_message().min(64 * 1024);
    let sender = tokio::spawn(async move {
        for seq in 0..n {
            let mut buf = client.alloc(checksum::size_for(seq, max)).await.expect("alloc");
            checksum::write(seq, &mut buf);
            client.send(buf).await.expect("send");
        }
        client.close();
    });
    let mut next = 0u64;
    loop {
        match server.recv().await {
            Ok(msg) => {
                let seq = checksum::verify(&msg).unwrap_or_else(|e| panic!("corrupt message: {e}"));
                assert_eq!(seq, next, "lost, duplicated or reordered");
                assert_eq!(msg.len(), checksum::size_for(seq, max));
                next += 1;
            }
            Err(RecvError::Disconnected) => break,
            Err(e) => panic!("receive failed after {next} messages: {e}"),
        }
    }
    sender.await.expect("sender");
    assert_eq!(next, n);
    drop(server);
    t.assert_pool_drained().await;
}

/// A peer that does not read stops the sender after one window (less the
/// reserved credit; a window in credits, see
/// [`crate::suite::credit_window`]); `try_send` and `send_timeout` hand
/// the buffer back; a slow reader lets a waiting `send` go on, one message
/// at a time, never past the window.
pub async fn backpressure(t: AsyncTransport, configured: u32) {
    let (client, server) = t.pair().await;
    let window = crate::suite::credit_window(&client.stats(), configured);
    let mut sent = 0u32;
    loop {
        let mut buf = client.alloc(64).await.expect("alloc");
        buf.fill(sent as u8);
        match client.try_send(buf) {
            Ok(()) => sent += 1,
            Err(SendError::Full(buf)) => {
                assert_eq!(buf.len(), 64, "the buffer comes back intact");
                break;
            }
            Err(e) => panic!("unexpected {e}"),
        }
        assert!(sent <= window, "the sender never ran out of credit");
    }
    assert_eq!(sent, window - 1, "one credit stays reserved for credit frames");
    let buf = client.alloc(64).await.expect("alloc");
    let t0 = Instant::now();
    match client.send_timeout(buf, Duration::from_millis(200)).await {
        Err(SendError::Timeout(b)) => assert_eq!(b.len(), 64, "handed back at the deadline"),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(t0.elapsed() >= Duration::from_millis(200));
    // `ready` waits too, and is released by the reader below.
    assert!(tokio::time::timeout(Duration::from_millis(50), client.ready()).await.is_err(), "no credit yet");
    let total = 5 * window;
    let sender = {
        let client = client.clone();
        tokio::spawn(async move {
            for i in sent..total {
                let mut buf = client.alloc(64).await.expect("alloc");
                buf.fill(i as u8);
                client.send(buf).await.expect("send");
                let s = client.stats();
                assert!(s.outstanding < window, "sender overran the window: {s:?}");
            }
        })
    };
    for i in 0..total {
        let msg = server.recv_timeout(HANG).await.expect("recv");
        assert!(msg.iter().all(|&b| b == i as u8), "message {i} corrupt");
        if i % 7 == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    sender.await.expect("sender");
    drop((client, server));
    t.assert_pool_drained().await;
}

/// After the peer closes, buffered messages come first, then
/// `Disconnected`; sending after a close hands the buffer back; the other
/// direction goes on until its own close.
pub async fn disconnect(t: AsyncTransport) {
    let (client, server) = t.pair().await;
    assert!(matches!(server.try_recv(), Err(RecvError::Empty)));
    match server.recv_timeout(Duration::from_millis(5)).await {
        Err(e @ RecvError::Timeout) => assert_eq!(e.kind(), Some(ErrorKind::Timeout)),
        other => panic!("expected a timeout, got {other:?}"),
    }
    for i in 0..10u8 {
        send_bytes(&client, &[i]).await;
    }
    client.close();
    let buf = client.alloc(1).await.expect("alloc");
    match client.send(buf).await {
        Err(e @ SendError::Disconnected(_)) => assert_eq!(e.kind(), Some(ErrorKind::Closed)),
        other => panic!("send after close: {other:?}"),
    }
    for i in 0..10u8 {
        assert_eq!(server.recv().await.expect("buffered")[0], i);
    }
    match server.recv().await {
        Err(e @ RecvError::Disconnected) => assert_eq!(e.kind(), Some(ErrorKind::Closed)),
        other => panic!("receive after the peer's close: {other:?}"),
    }
    assert!(matches!(server.try_recv(), Err(RecvError::Disconnected)), "stays disconnected");
    send_bytes(&server, b"bye").await;
    assert_eq!(&*client.recv().await.expect("reply"), b"bye");
    drop(server);
    assert!(matches!(client.recv().await, Err(RecvError::Disconnected)));
    drop(client);
    t.assert_pool_drained().await;
}

/// `close_and_wait` waits for the peer's goodbye (a timeout bounds it
/// while the peer stays open), then both sides end cleanly.
pub async fn close_and_wait(t: AsyncTransport) {
    let (client, server) = t.pair().await;
    for i in 0..5u8 {
        send_bytes(&client, &[i]).await;
    }
    let early = tokio::time::timeout(Duration::from_millis(300), client.close_and_wait()).await;
    assert!(early.is_err(), "the server has not closed yet: {early:?}");
    for i in 0..5u8 {
        assert_eq!(server.recv().await.expect("buffered")[0], i);
    }
    assert!(matches!(server.recv().await, Err(RecvError::Disconnected)));
    // A receive abandoned part-way (over tcp:// it reads the socket
    // itself) leaves nobody reading but the close: the close still sees
    // the peer's end at once, not at the linger deadline (10 s).
    let abandoned = tokio::time::timeout(Duration::from_millis(20), client.recv()).await;
    assert!(abandoned.is_err(), "nothing to receive yet: {abandoned:?}");
    let both = async { tokio::join!(client.close_and_wait(), server.close_and_wait()) };
    let (a, b) = tokio::time::timeout(Duration::from_secs(5), both).await.expect("the closes end promptly");
    assert!(a && b, "both end cleanly: client {a}, server {b}");
    drop((client, server));
    t.assert_pool_drained().await;
}

/// Nested serde types round-trip both ways, small and large, and the
/// receiver's stream ends at the peer's close.
pub async fn typed_roundtrip(t: AsyncTransport) {
    use futures_util::StreamExt;
    let (client, server) = t.pair().await;
    let (ctx, crx) = client.split::<Order, Order>();
    let (stx, mut srx) = server.split::<Order, Order>();
    let echo = tokio::spawn(async move {
        while let Some(o) = srx.next().await {
            stx.send(o.expect("decodes")).await.expect("echo");
        }
    });
    for i in 0..300u64 {
        let o = order(i, [0, 10, 1000, 60_000, 200 * 1024][(i % 5) as usize]);
        ctx.send(o.clone()).await.expect("send");
        assert_eq!(crx.recv().await.expect("reply"), o);
    }
    drop(ctx);
    echo.await.expect("echo task");
    assert!(matches!(crx.recv().await, Err(TypedRecvError::Recv(RecvError::Disconnected))));
}

/// The borrowing receive: fields point into the receive buffer, which goes
/// back with its credit when the guard drops, or when `recv_with`'s
/// closure returns (more messages than the window; every other one each
/// way).
pub async fn borrowed_receive(t: AsyncTransport, window: u32) {
    let (client, server) = t.pair().await;
    let (server_tx, rx) = server.split::<(), Record<'static>>();
    let (tx, client_rx) = client.split::<Record<'static>, ()>();
    let payload = vec![7u8; 3000];
    assert!(matches!(rx.try_recv_with(|_| ()), Err(TypedRecvError::Recv(RecvError::Empty))));
    // A `recv_with` dropped while it waits takes nothing (cancel-safe):
    // the message sent after it goes to the next receive.
    let waited = tokio::time::timeout(Duration::from_millis(20), rx.recv_with(|rec| rec.n)).await;
    assert!(waited.is_err(), "nothing was sent yet: {waited:?}");
    tx.send_borrowed(&Record { key: "first", value: b"", n: u64::MAX }).await.expect("send");
    assert_eq!(
        rx.recv_with(|rec| (rec.key.to_owned(), rec.n)).await.expect("recv_with"),
        ("first".into(), u64::MAX)
    );
    for n in 0..(3 * u64::from(window)) {
        let key = format!("key-{n}");
        tx.send_borrowed(&Record { key: &key, value: &payload, n }).await.expect("send");
        if n % 2 == 1 {
            let got = rx
                .recv_with(|rec| (rec.key.to_owned(), rec.n, rec.value == &payload[..]))
                .await
                .expect("recv_with");
            assert_eq!(got, (key, n, true));
            continue;
        }
        let guard = rx.recv_ref().await.expect("recv_ref");
        let rec = guard.get();
        assert_eq!((rec.key, rec.n), (key.as_str(), n));
        assert_eq!(rec.value, &payload[..]);
        let range = guard.bytes().as_ptr_range();
        assert!(range.contains(&rec.key.as_ptr()), "key is borrowed from the receive buffer");
        assert!(range.contains(&rec.value.as_ptr()), "value is borrowed from the receive buffer");
    }
    // Every handle gone: the connection ends, and on RDMA its posted
    // receive buffers go back too.
    drop((tx, rx, server_tx, client_rx));
    t.assert_pool_drained().await;
}

/// A message that does not decode is a typed error and the connection goes
/// on; an oversized one is refused before it is sent, handed back.
pub async fn bad_and_oversized(t: AsyncTransport) {
    let (client, server) = t.pair().await;
    send_bytes(&client, &[0xff, 0xff, 0xff]).await;
    let max = client.max_message();
    let (tx, _r) = client.split::<Order, ()>();
    tx.send(order(1, 8)).await.expect("send typed");
    let (_s, rx) = server.split::<(), Order>();
    match rx.recv().await {
        Err(e @ TypedRecvError::Decode(_)) => assert_eq!(e.kind(), Some(ErrorKind::Protocol)),
        other => panic!("expected a decode error, got {other:?}"),
    }
    assert_eq!(rx.recv().await.expect("next message"), order(1, 8));
    let (client, _server) = t.pair().await;
    assert!(matches!(client.alloc(max + 1).await, Err(zerocast::PoolError::TooLarge { .. })));
    let (tx, _r) = client.split::<Vec<u8>, ()>();
    match tx.send(vec![1u8; max + 10]).await {
        Err(SendError::Rejected(back, e)) => {
            assert_eq!(back.len(), max + 10, "handed back");
            assert_eq!(SendError::Rejected((), e).kind(), Some(ErrorKind::InvalidInput));
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
}

/// `close` releases a waiting accept with `Closed`, ends `incoming`, and
/// every later accept says the same; `try_accept` says `None` while nobody
/// connects and gives the connection once a peer did.
pub async fn accepting(t: AsyncTransport) {
    use futures_util::StreamExt;
    let listener = std::sync::Arc::new(t.listen().await);
    assert!(listener.try_accept().expect("idle").is_none());
    let at = listener.local_endpoint().to_string();
    let client = t.zc.connect(&at).await.expect("connect");
    let server = loop {
        if let Some(c) = listener.try_accept().expect("try_accept") {
            break c;
        }
        tokio::task::yield_now().await;
    };
    send_bytes(&client, b"hi").await;
    assert_eq!(&*server.recv().await.expect("recv"), b"hi");
    // A second peer, through the stream.
    let (_c2, s2) = tokio::join!(t.zc.connect(&at), async { listener.incoming().next().await });
    assert!(matches!(s2, Some(Ok(_))), "{s2:?}");
    let waiting = {
        let listener = listener.clone();
        tokio::spawn(async move { listener.accept().await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    listener.close();
    assert!(matches!(waiting.await.expect("task"), Err(AcceptError::Closed)));
    assert!(matches!(listener.accept().await, Err(AcceptError::Closed)));
    assert!(listener.incoming().next().await.is_none(), "the stream ends at the close");
    assert_eq!(listener.stats().accepted, 2);
}

/// Several tasks receive on one connection: each message goes to exactly
/// one of them, and none waits forever while another took its message.
pub async fn receivers_share(t: AsyncTransport) {
    const N: u64 = 20_000;
    let (client, server) = t.pair().await;
    let receivers: Vec<_> = (0..4)
        .map(|_| {
            let server = server.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                while let Ok(m) = server.recv().await {
                    got.push(checksum::verify(&m).expect("intact"));
                }
                got
            })
        })
        .collect();
    for seq in 0..N {
        let mut buf = client.alloc(checksum::size_for(seq, 256)).await.expect("alloc");
        checksum::write(seq, &mut buf);
        client.send(buf).await.expect("send");
    }
    client.close();
    let mut all = Vec::new();
    for r in receivers {
        let got = r.await.expect("receiver");
        assert!(got.windows(2).all(|w| w[0] < w[1]), "each receiver sees its messages in order");
        all.extend(got);
    }
    all.sort_unstable();
    assert_eq!(all, (0..N).collect::<Vec<_>>(), "each message once");
}

/// Lost wake-ups: `rounds` bursts of 1 to 8 messages, each sent as the
/// receiving task has just drained the connection and is arming it again
/// (the burst's last message asks for an ack, and the next burst follows
/// the ack at once), in both directions at once. A lost wake-up hangs a
/// round; the test's timeout turns that into a failure.
pub async fn bursts_while_rearming(t: AsyncTransport, rounds: u64) {
    let (client, server) = t.pair().await;
    bursts_on(client, server, rounds, 0).await;
}

/// [`bursts_while_rearming`] on `pairs` connected pairs at once, each in
/// its own tasks: an engine's completion channel then announces many CQs,
/// and a reader's look at it may find several armed, or one armed while
/// another's event waits.
pub async fn bursts_while_rearming_many(t: AsyncTransport, pairs: u64, rounds: u64) {
    let mut all = Vec::new();
    for _ in 0..pairs {
        all.push(t.pair().await);
    }
    let runs: Vec<_> = all
        .into_iter()
        .enumerate()
        .map(|(i, (client, server))| tokio::spawn(bursts_on(client, server, rounds, i as u64)))
        .collect();
    for run in runs {
        run.await.expect("a pair's bursts");
    }
}

/// The bursts of [`bursts_while_rearming`] from `client` to `server`'s
/// echo; `pair` names the pair in a failure.
async fn bursts_on(client: Connection, server: Connection, rounds: u64, pair: u64) {
    let server = std::sync::Arc::new(server);
    // What the echo is doing, for the report of a hang: messages seen, and
    // whether it waits to receive (even) or sends an ack (odd).
    let (seen_at, step_at) = (std::sync::Arc::new(AtomicU64::new(0)), std::sync::Arc::new(AtomicU64::new(0)));
    let echo = tokio::spawn({
        let (server, seen_at, step_at) = (server.clone(), seen_at.clone(), step_at.clone());
        async move {
            let mut seen = 0u64;
            loop {
                match server.recv().await {
                    Ok(m) => {
                        assert_eq!(checksum::verify(&m), Ok(seen), "lost, duplicated or reordered");
                        seen += 1;
                        seen_at.store(seen, Ordering::SeqCst);
                        if m.len() % 2 == 1 {
                            // The burst's last: ack it while the client drains.
                            step_at.fetch_add(1, Ordering::SeqCst);
                            send_bytes(&server, &seen.to_le_bytes()).await;
                            step_at.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    Err(RecvError::Disconnected) => return seen,
                    Err(e) => panic!("{e}"),
                }
            }
        }
    });
    let mut seq = 0u64;
    for round in 0..rounds {
        let burst = 1 + (round * 7 + round / 3 + pair) % 8;
        for k in 0..burst {
            // Odd length marks the burst's last message.
            let last = k + 1 == burst;
            let len = checksum::HEADER + 2 * (seq % 32) as usize + usize::from(last);
            let mut buf = client.alloc(len).await.expect("alloc");
            checksum::write(seq, &mut buf);
            client.send(buf).await.expect("send");
            seq += 1;
        }
        let ack = match tokio::time::timeout(HANG, client.recv()).await {
            Ok(ack) => ack.expect("ack"),
            Err(_) => {
                // Which side lost it: the echo's state, then each side's
                // link as a look at its source finds it.
                let (seen, step) = (seen_at.load(Ordering::SeqCst), step_at.load(Ordering::SeqCst));
                let doing = if step % 2 == 1 { "sending an ack" } else { "receiving" };
                panic!(
                    "pair {pair}, round {round}: no ack: a lost wake-up; the echo saw {seen} of {seq} \
                     and is {doing}; client {:?}; server {:?}; the client's next look: {:?}",
                    client.stats(),
                    server.stats(),
                    client.try_recv().map(|m| m.len()),
                );
            }
        };
        assert_eq!(u64::from_le_bytes(ack[..8].try_into().expect("8 bytes")), seq);
    }
    client.close();
    assert_eq!(echo.await.expect("echo"), seq);
}

/// Receives dropped at random points lose nothing: a receiving loop races
/// each `recv` against a short timer (`select!`), so most receives are
/// dropped while waiting, some just as a message comes; every message
/// still arrives once, in order.
pub async fn cancelled_receives_lose_nothing(t: AsyncTransport, n: u64) {
    let (client, server) = t.pair().await;
    // One receive is dropped for sure, waiting, before anything is sent:
    // the timers below drop others only when the receiver catches up.
    let early = tokio::time::timeout(Duration::from_millis(2), server.recv()).await;
    assert!(early.is_err(), "a message before any was sent");
    let sender = tokio::spawn(async move {
        for seq in 0..n {
            let mut buf = client.alloc(checksum::size_for(seq, 512)).await.expect("alloc");
            checksum::write(seq, &mut buf);
            client.send(buf).await.expect("send");
            if seq % 64 == 0 {
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
        }
        client.close();
    });
    let (mut next, mut dropped) = (0u64, 1u64);
    loop {
        let wait = Duration::from_micros(50 + (next * 37) % 400);
        tokio::select! {
            r = server.recv() => match r {
                Ok(m) => {
                    assert_eq!(checksum::verify(&m), Ok(next), "lost, duplicated or reordered");
                    next += 1;
                }
                Err(RecvError::Disconnected) => break,
                Err(e) => panic!("{e}"),
            },
            () = tokio::time::sleep(wait) => dropped += 1,
        }
    }
    sender.await.expect("sender");
    assert_eq!(next, n);
    println!("{n} messages, {dropped} receives dropped");
    drop(server);
    t.assert_pool_drained().await;
}

/// Sends dropped at random points, on a window the reader keeps full: a
/// send whose future is dropped sent nothing (it is retried with the same
/// message), one that completed sent its message whole. The receiver gets
/// each sequence number once, in order, and every credit and buffer is
/// accounted for at the end.
pub async fn cancelled_sends_half_send_nothing(t: AsyncTransport, n: u64) {
    let (client, server) = t.pair().await;
    let (tx, client_rx) = client.split::<(u64, Vec<u8>), ()>();
    let (server_tx, rx) = server.split::<(), (u64, Vec<u8>)>();
    let reader = tokio::spawn(async move {
        let mut next = 0u64;
        while let Ok((seq, body)) = rx.recv().await {
            assert_eq!(seq, next, "lost, duplicated or reordered");
            assert!(body.iter().all(|&b| b == seq as u8), "message {seq} corrupt");
            next += 1;
            if next & 15 == 0 {
                tokio::time::sleep(Duration::from_micros(300)).await;
            }
        }
        next
    });
    let (mut seq, mut dropped) = (0u64, 0u64);
    while seq < n {
        let body = vec![seq as u8; (seq % 700) as usize];
        let wait = Duration::from_micros(20 + (seq * 53) % 300);
        tokio::select! {
            r = tx.send((seq, body)) => {
                r.expect("send");
                seq += 1;
            }
            () = tokio::time::sleep(wait) => dropped += 1,
        }
    }
    drop(tx);
    assert_eq!(reader.await.expect("reader"), n);
    assert!(dropped > 0, "no send was dropped: the test did not test");
    println!("{n} messages, {dropped} sends dropped");
    drop((client_rx, server_tx));
    t.assert_pool_drained().await;
}

/// A typed `Sink` and `Stream`: `send_all` of a stream of messages, read
/// back as a stream that ends at the close.
pub async fn sink_and_stream(t: AsyncTransport) {
    use futures_util::{SinkExt, StreamExt};
    let (client, server) = t.pair().await;
    let (mut tx, _r) = client.split::<u64, ()>();
    let (_s, rx) = server.split::<(), u64>();
    let reader = tokio::spawn(async move { rx.map(|r| r.expect("decodes")).collect::<Vec<u64>>().await });
    let mut items = futures_util::stream::iter((0..5_000u64).map(Ok));
    tx.send_all(&mut items).await.expect("send_all");
    tx.close().await.expect("close");
    assert_eq!(reader.await.expect("reader"), (0..5_000).collect::<Vec<_>>());
}

/// A connection moves between the APIs: one opened blocking is used from
/// a task, and a task's connection from a thread outside the runtime.
pub async fn blocking_and_async_mix(t: AsyncTransport) {
    let listener = t.listen().await;
    let at = listener.local_endpoint().to_string();
    let blocking_zc = t.zc.blocking().clone();
    // A thread outside the runtime connects with the blocking API and
    // talks to a task.
    let thread = std::thread::spawn(move || {
        let conn = blocking_zc.connect(&at).expect("blocking connect");
        let (tx, rx) = conn.split::<String, String>();
        for i in 0..100 {
            tx.send(format!("ping {i}")).expect("send");
            assert_eq!(rx.recv().expect("recv"), format!("PING {i}"));
        }
    });
    let server = listener.accept().await.expect("accept");
    let (tx, rx) = server.split::<String, String>();
    while let Ok(s) = rx.recv().await {
        tx.send(s.to_uppercase()).await.expect("reply");
    }
    tokio::task::spawn_blocking(move || thread.join()).await.expect("join").expect("thread");
    // A blocking connection made async, and an async one made blocking.
    let (client, server) = t.pair().await;
    let blocking = server.into_blocking();
    let again = Connection::from_blocking(blocking.clone()).err();
    assert!(again.is_some(), "one registration per connection");
    let echo = tokio::task::spawn_blocking(move || {
        let m = blocking.recv().expect("blocking recv of an engine-read connection");
        let reversed: Vec<u8> = m.iter().rev().copied().collect();
        let mut b = blocking.alloc(reversed.len()).expect("alloc");
        b.copy_from_slice(&reversed);
        blocking.send(b)
    });
    send_bytes(&client, b"abc").await;
    echo.await.expect("task").expect("send");
    assert_eq!(&*client.recv().await.expect("reply"), b"cba");
}

/// A connect to an endpoint nobody listens at fails with a typed error
/// (refused, or the peer's address gone); a connect whose future is
/// dropped part-way leaves nothing behind: the next connect works, and
/// once every connection is closed every pool buffer is back.
pub async fn connect_refused_and_abandoned(t: AsyncTransport) {
    let listener = t.listen().await;
    let at = listener.local_endpoint().to_string();
    drop(listener);
    match t.zc.connect(&at).await {
        Err(e) => {
            println!("connect to a closed listener: {e} ({:?})", e.kind());
            assert!(
                matches!(e.kind(), ErrorKind::Refused | ErrorKind::PeerGone | ErrorKind::Timeout),
                "a connect to nobody is refused: {e:?}"
            );
        }
        Ok(c) => panic!("connected to a closed listener: {:?}", c.peer()),
    }
    let listener = t.listen().await;
    let at = listener.local_endpoint().to_string();
    let mut abandoned = 0;
    for i in 0..20 {
        // Poll the connect a few times, letting the engines move it on in
        // between, then drop it: at a different point of the handshake
        // each time (or done, and the connection dropped at once).
        let mut connecting = std::pin::pin!(t.zc.connect(&at));
        let mut pending = true;
        for _ in 0..=(i % 5) {
            let polled =
                std::future::poll_fn(|cx| std::task::Poll::Ready(connecting.as_mut().poll(cx))).await;
            pending = polled.is_pending();
            if !pending {
                break;
            }
            tokio::task::yield_now().await;
        }
        abandoned += usize::from(pending);
    }
    println!("{abandoned} of 20 connects abandoned part-way");
    let client = t.zc.connect(&at).await.expect("a connect after the abandoned ones");
    send_bytes(&client, b"after").await;
    // The listener may have finished handshakes whose client gave up: those
    // connections end at once; the good one carries the message.
    let mut ended = 0;
    let server = loop {
        let c = listener.accept().await.expect("accept");
        match c.recv_timeout(HANG).await {
            Ok(m) => {
                assert_eq!(&*m, b"after");
                break c;
            }
            Err(e) => {
                assert!(matches!(e, RecvError::Disconnected | RecvError::Failed(_)), "{e:?}");
                ended += 1;
            }
        }
    };
    println!("{ended} connections of the 20 ended at the listener");
    assert!(ended <= 20, "{ended} ended of 20");
    // `mem://` connects within the first poll: nothing to abandon there.
    assert!(
        abandoned > 0 || t.listen_uri.starts_with("mem://"),
        "no connect was dropped part-way: the test did not test"
    );
    drop((client, server, listener));
    t.assert_pool_drained().await;
}
