//! The assertions every transport must pass.

use std::collections::BTreeMap;
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use zerocast::{AcceptError, Connection, ErrorKind, RecvError, SendError, TypedRecvError};

use crate::checksum;
pub use crate::integrity::{held_messages_keep_their_bytes, integrity};
use crate::Transport;

/// The peer's window in credits, as `stats` report it, checked against the
/// receive window `configured`: equal with one credit per message; more
/// credits, each of 1 KiB or more, on a transport that weighs them
/// (`tcp://`), where a small message takes one.
pub fn credit_window(stats: &zerocast::LinkStats, configured: u32) -> u32 {
    let (window, unit) = (stats.peer_window, stats.peer_credit_unit);
    match unit {
        0 => assert_eq!(window, configured, "one credit per posted buffer"),
        _ => assert!(window > configured && unit >= 1024, "weighted: {window} credits of {unit} bytes"),
    }
    window
}

/// A reader that does not read blocks the sender after exactly one window
/// (less the reserved credit), hands messages back on `try_send` and
/// `send_timeout`, and keeps the receiver's buffers bounded by its window.
/// `configured` is the receive window asked for; a transport that weighs
/// its credits (`tcp://`) announces more of them, one per small message.
pub fn backpressure(t: &Transport, configured: u32) {
    let (client, server) = t.pair();
    let window = credit_window(&client.stats(), configured);
    let mut sent = 0u32;
    // Credits arrive with the handshake: fill the peer's window.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut buf = client.alloc(64).expect("alloc");
        buf.fill(sent as u8);
        match client.try_send(buf) {
            Ok(()) => sent += 1,
            Err(SendError::Full(buf)) => {
                assert_eq!(buf.len(), 64, "the buffer comes back intact");
                break;
            }
            Err(e) => panic!("unexpected {e}"),
        }
        assert!(Instant::now() < deadline, "sender never blocked");
    }
    assert_eq!(sent, window - 1, "one credit stays reserved for credit frames");
    let buf = client.alloc(64).expect("alloc");
    let t0 = Instant::now();
    match client.send_timeout(buf, Duration::from_millis(200)) {
        Err(SendError::Timeout(b)) => assert_eq!(b.len(), 64),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(t0.elapsed() >= Duration::from_millis(200));
    // Give stray frames time to land: the receiver holds exactly `sent`.
    thread::sleep(Duration::from_millis(100));
    let stats = server.stats();
    assert_eq!((stats.held, stats.queued as u32), (sent, sent), "all held, none taken yet");
    // A slow reader: every message read lets the blocked sender go on.
    let total = 5 * window;
    let sender = {
        let client = client.clone();
        thread::spawn(move || {
            for i in sent..total {
                let mut buf = client.alloc(64).expect("alloc");
                buf.fill(i as u8);
                client.send(buf).expect("send");
                let s = client.stats();
                assert!(s.outstanding < window, "sender overran the window: {s:?}");
            }
        })
    };
    for i in 0..total {
        let msg = server.recv_timeout(Duration::from_secs(10)).expect("recv");
        assert!(msg.iter().all(|&b| b == i as u8), "message {i} corrupt");
        if i % 7 == 0 {
            thread::sleep(Duration::from_millis(2));
        }
    }
    sender.join().expect("sender");
    drop((client, server));
    t.assert_pool_drained(Duration::from_secs(10));
}

/// After the peer closes, buffered messages drain first, then
/// `Disconnected`; sending to a closed connection hands the buffer back.
pub fn disconnect(t: &Transport) {
    let (client, server) = t.pair();
    // Nothing sent yet: nothing is ready, and a deadline passes.
    assert!(matches!(server.try_recv(), Err(RecvError::Empty)));
    assert_eq!(RecvError::Empty.kind(), None, "an empty try_recv is no failure");
    match server.recv_timeout(Duration::from_millis(5)) {
        Err(e @ RecvError::Timeout) => assert_eq!(e.kind(), Some(ErrorKind::Timeout)),
        other => panic!("expected a timeout, got {other:?}"),
    }
    for i in 0..10u8 {
        let mut buf = client.alloc(1).expect("alloc");
        buf[0] = i;
        client.send(buf).expect("send");
    }
    client.close();
    let buf = client.alloc(1).expect("alloc");
    match client.send(buf) {
        Err(e @ SendError::Disconnected(_)) => assert_eq!(e.kind(), Some(ErrorKind::Closed)),
        other => panic!("send after close: {other:?}"),
    }
    for i in 0..10u8 {
        assert_eq!(server.recv_timeout(Duration::from_secs(10)).expect("buffered")[0], i);
    }
    match server.recv_timeout(Duration::from_secs(10)) {
        Err(e @ RecvError::Disconnected) => assert_eq!(e.kind(), Some(ErrorKind::Closed), "an orderly close"),
        other => panic!("receive after the peer's close: {other:?}"),
    }
    assert!(matches!(server.try_recv(), Err(RecvError::Disconnected)), "stays disconnected");
    // The other direction still works until the server closes too.
    let mut buf = server.alloc(3).expect("alloc");
    buf.copy_from_slice(b"bye");
    server.send(buf).expect("half-closed connection still sends the other way");
    assert_eq!(&*client.recv_timeout(Duration::from_secs(10)).expect("reply"), b"bye");
    assert!(matches!(client.try_recv(), Err(RecvError::Empty)));
    drop(server);
    assert!(matches!(client.recv_timeout(Duration::from_secs(10)), Err(RecvError::Disconnected)));
    drop(client);
    t.assert_pool_drained(Duration::from_secs(10));
}

/// `close_and_wait`: a side that closes first waits for the peer's goodbye
/// (false at its deadline while the peer stays open), then both end
/// cleanly, every message delivered.
pub fn close_and_wait(t: &Transport) {
    let (client, server) = t.pair();
    for i in 0..5u8 {
        let mut buf = client.alloc(1).expect("alloc");
        buf[0] = i;
        client.send(buf).expect("send");
    }
    assert!(!client.close_and_wait(Duration::from_millis(300)), "the server has not closed yet");
    for i in 0..5u8 {
        assert_eq!(server.recv_timeout(Duration::from_secs(10)).expect("buffered")[0], i);
    }
    assert!(matches!(server.recv_timeout(Duration::from_secs(10)), Err(RecvError::Disconnected)));
    let waiter = thread::spawn(move || {
        let clean = client.close_and_wait(Duration::from_secs(10));
        (clean, client.recv_timeout(Duration::from_millis(1)).err(), client.stats())
    });
    assert!(server.close_and_wait(Duration::from_secs(10)), "server: clean end");
    let (clean, end, stats) = waiter.join().expect("client thread");
    assert!(clean, "client: clean end; then {end:?}, {stats:?}");
    drop(server);
    t.assert_pool_drained(Duration::from_secs(10));
}

/// A sender that drops its last handle straight after its last send, to a
/// peer that closed its own sending side first and reads slowly, loses
/// nothing: the connection outlives its handles until the peer has read
/// everything (on `tcp://`, the socket is not closed under the peer's
/// credit frames, which would reset it and discard what the kernel still
/// held), then the peer sees a clean end.
pub fn drop_right_after_sending(t: &Transport) {
    const N: u64 = 64;
    let (client, server) = t.pair();
    server.close();
    let size = client.max_message().min(1 << 20);
    let sender = thread::spawn(move || {
        for seq in 0..N {
            let mut buf = client.alloc(size).expect("alloc");
            checksum::write(seq, &mut buf);
            client.send(buf).expect("send");
        }
    });
    for next in 0..N {
        match server.recv_timeout(Duration::from_secs(10)) {
            Ok(msg) => assert_eq!(checksum::verify(&msg), Ok(next), "lost, duplicated or reordered"),
            Err(e) => panic!("receive failed after {next} of {N} messages: {e:?}"),
        }
    }
    match server.recv_timeout(Duration::from_secs(10)) {
        Err(e @ RecvError::Disconnected) => assert_eq!(e.kind(), Some(ErrorKind::Closed), "an orderly close"),
        other => panic!("after the last message: {other:?}"),
    }
    sender.join().expect("sender");
    drop(server);
    t.assert_pool_drained(Duration::from_secs(10));
}

/// Typed channels: dropping the sender ends the receiver's iteration after
/// every message; a dropped receiver makes sends fail, message handed back.
pub fn typed_disconnect(t: &Transport) {
    let (client, server) = t.pair();
    let (tx, _rx_unused) = client.split::<String, ()>();
    let (_tx_unused, rx) = server.split::<(), String>();
    let sender = thread::spawn(move || {
        for i in 0..100 {
            tx.send(format!("m{i}")).expect("send");
        }
        // Dropping the last Sender closes the channel.
    });
    let got: Vec<String> = rx.iter().collect();
    sender.join().expect("sender");
    assert_eq!(got.len(), 100);
    assert_eq!(got[99], "m99");
    assert!(matches!(rx.recv(), Err(e) if e.is_disconnected()));
}

/// A nested serde type with every kind of field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Order {
    /// Identifier.
    pub id: u64,
    /// Customer.
    pub customer: Option<Customer>,
    /// Lines, by product.
    pub lines: BTreeMap<String, Vec<Line>>,
    /// State.
    pub state: State,
    /// Raw bytes, up to hundreds of KiB: one byte string (`serde_bytes`),
    /// as an application would send a blob, not a sequence of 200,000
    /// elements (which costs a debug build seconds a message under TCG).
    #[serde(with = "serde_bytes")]
    pub blob: Vec<u8>,
    /// A tuple and a float.
    pub extra: (i32, f64, bool, char),
}

/// A nested struct.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Customer {
    /// Name.
    pub name: String,
    /// Tags.
    pub tags: Vec<String>,
}

/// A line of an order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Line {
    /// Quantity.
    pub qty: u32,
    /// Price in cents.
    pub cents: i64,
}

/// An enum with data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum State {
    /// New.
    New,
    /// Shipped, with a tracking number.
    Shipped(String),
    /// Cancelled, with a reason code.
    Cancelled {
        /// Why.
        code: u16,
    },
}

/// An order of roughly `size` bytes, varied by `i`.
pub fn order(i: u64, size: usize) -> Order {
    let mut lines = BTreeMap::new();
    lines.insert(format!("sku-{i}"), vec![Line { qty: i as u32, cents: -(i as i64) }]);
    Order {
        id: i,
        customer: (i % 3 >= 1)
            .then(|| Customer { name: format!("customer {i}"), tags: vec!["vip".into(); (i % 4) as usize] }),
        lines,
        state: match i % 3 {
            0 => State::New,
            1 => State::Shipped(format!("TRK{i:08}")),
            _ => State::Cancelled { code: i as u16 },
        },
        blob: (0..size).map(|k| (k as u64 ^ i) as u8).collect(),
        extra: (
            -(i as i32),
            i as f64 / 3.0,
            i & 1 == 0,
            char::from_u32(0x41 + (i % 26) as u32).unwrap_or('A'),
        ),
    }
}

/// Nested serde types round-trip both ways at once, small and large.
pub fn typed_roundtrip(t: &Transport) {
    let (client, server) = t.pair();
    let (ctx, crx) = client.split::<Order, Order>();
    let (stx, srx) = server.split::<Order, Order>();
    let echo = thread::spawn(move || {
        for o in srx.iter() {
            stx.send(o).expect("echo");
        }
    });
    let max = 200 * 1024;
    for i in 0..300u64 {
        let size = [0, 10, 1000, 60_000, max][(i % 5) as usize];
        let o = order(i, size);
        ctx.send(o.clone()).expect("send");
        assert_eq!(crx.recv_timeout(Duration::from_secs(10)).expect("reply"), o);
    }
    drop(ctx);
    echo.join().expect("echo thread");
    assert!(matches!(
        crx.recv_timeout(Duration::from_secs(10)),
        Err(TypedRecvError::Recv(RecvError::Disconnected))
    ));
}

/// Borrowed message type for [`borrowed_receive`].
#[derive(Debug, Serialize, Deserialize, yoke::Yokeable)]
pub struct Record<'a> {
    /// Key.
    pub key: &'a str,
    /// Value bytes.
    #[serde(with = "serde_bytes_compat")]
    pub value: &'a [u8],
    /// Counter.
    pub n: u64,
}

mod serde_bytes_compat {
    //! Borrow `&[u8]` as a length-prefixed byte string (not a sequence).
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(v)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<&'de [u8], D::Error> {
        <&'de [u8]>::deserialize(d)
    }
}

/// `recv_ref` gives fields that point into the receive buffer itself, and
/// the buffer goes back (and its credit with it) when the guard drops;
/// `recv_with` runs a closure on the borrowed message and gives the buffer
/// back when it returns. Every other message is received each way.
pub fn borrowed_receive(t: &Transport, window: u32) {
    let (client, server) = t.pair();
    let (tx, _r) = client.split::<Record<'static>, ()>();
    let (_s, rx) = server.split::<(), Record<'static>>();
    let payload = vec![7u8; 3000];
    assert!(matches!(rx.try_recv_with(|_| ()), Err(TypedRecvError::Recv(RecvError::Empty))));
    assert!(matches!(
        rx.recv_with_timeout(Duration::from_millis(20), |_| ()),
        Err(TypedRecvError::Recv(RecvError::Timeout))
    ));
    // More messages than the window: guards and closures must give their
    // credit back.
    for n in 0..(3 * u64::from(window)) {
        let key = format!("key-{n}");
        tx.send_borrowed(&Record { key: &key, value: &payload, n }).expect("send");
        if n % 2 == 1 {
            let got = rx
                .recv_with_timeout(Duration::from_secs(10), |rec| {
                    (rec.key.to_owned(), rec.n, rec.value == &payload[..])
                })
                .expect("recv_with");
            assert_eq!(got, (key, n, true));
            continue;
        }
        let guard = rx.recv_ref_timeout(Duration::from_secs(10)).expect("recv_ref");
        let rec = guard.get();
        assert_eq!((rec.key, rec.n), (key.as_str(), n));
        assert_eq!(rec.value, &payload[..]);
        let range = guard.bytes().as_ptr_range();
        assert!(range.contains(&rec.key.as_ptr()), "key is borrowed from the receive buffer");
        assert!(range.contains(&rec.value.as_ptr()), "value is borrowed from the receive buffer");
    }
    // Both halves of each side: a live connection may keep its staging
    // in the pool.
    drop((tx, _r, _s, rx));
    // Raw buffers lent to a closure: each gives its credit back when the
    // closure returns, or unwinds.
    let (client, server) = t.pair();
    assert!(matches!(server.try_recv_with(|_| ()), Err(RecvError::Empty)));
    assert!(matches!(server.recv_with_timeout(Duration::from_millis(20), |_| ()), Err(RecvError::Timeout)));
    for n in 0..(3 * u64::from(window)) {
        let mut buf = client.alloc(3000).expect("alloc");
        buf[..8].copy_from_slice(&n.to_le_bytes());
        client.send(buf).expect("send raw");
        let got = if n == 5 {
            let lent = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                server.recv_with_timeout(Duration::from_secs(10), |_| panic!("a closure that unwinds"))
            }));
            assert!(lent.is_err(), "the closure's panic reaches the caller");
            continue;
        } else {
            server.recv_with_timeout(Duration::from_secs(10), |m| {
                (m.len(), u64::from_le_bytes(m[..8].try_into().unwrap()))
            })
        };
        assert_eq!(got.expect("recv_with"), (3000, n));
    }
    drop((client, server));
    t.assert_pool_drained(Duration::from_secs(10));
}

/// A message that does not decode as `T` is a typed error, and the
/// connection keeps working.
pub fn bad_message_is_typed_error(t: &Transport) {
    let (client, server) = t.pair();
    let mut buf = client.alloc(3).expect("alloc");
    buf.copy_from_slice(&[0xff, 0xff, 0xff]);
    client.send(buf).expect("send raw");
    let (tx, _r) = client.split::<Order, ()>();
    tx.send(order(1, 8)).expect("send typed");
    let (_s, rx) = server.split::<(), Order>();
    match rx.recv_timeout(Duration::from_secs(10)) {
        Err(e @ TypedRecvError::Decode(_)) => {
            assert_eq!(e.kind(), Some(ErrorKind::Protocol));
            let why = std::error::Error::source(&e).map(ToString::to_string).unwrap_or_default();
            assert!(why.contains("Order"), "the error names the type it expected: {why}");
        }
        other => panic!("expected a decode error, got {other:?}"),
    }
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).expect("next message"), order(1, 8));
    // The same through `recv_with`, whose closure sees only good messages.
    let (client, server) = t.pair();
    let mut buf = client.alloc(3).expect("alloc");
    buf.copy_from_slice(&[0xff, 0xff, 0xff]);
    client.send(buf).expect("send raw");
    let (tx, _r) = client.split::<Record<'static>, ()>();
    tx.send_borrowed(&Record { key: "k", value: b"v", n: 2 }).expect("send typed");
    let (_s, rx) = server.split::<(), Record<'static>>();
    let mut called = 0;
    let got = rx.recv_with_timeout(Duration::from_secs(10), |_| called += 1);
    assert!(matches!(got, Err(TypedRecvError::Decode(_))), "{got:?}");
    assert_eq!(called, 0, "the closure is not called on a message that does not decode");
    let next =
        rx.recv_with_timeout(Duration::from_secs(10), |r| (r.key.to_owned(), r.n)).expect("next message");
    assert_eq!(next, ("k".to_owned(), 2));
}

/// Oversized messages are refused before sending and handed back.
pub fn oversize_is_rejected(t: &Transport) {
    let (client, _server) = t.pair();
    let max = client.max_message();
    assert!(matches!(client.alloc(max + 1), Err(zerocast::PoolError::TooLarge { .. })));
    let (tx, _r) = client.split::<Vec<u8>, ()>();
    let big = vec![1u8; max + 10];
    match tx.send(big) {
        Err(SendError::Rejected(back, e)) => {
            assert_eq!(back.len(), max + 10);
            let kind = SendError::Rejected((), e).kind();
            assert_eq!(
                kind,
                Some(ErrorKind::InvalidInput),
                "refused input is the caller's, on every transport"
            );
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
}

/// `close` from another thread releases an `accept` blocked in its own,
/// with `AcceptError::Closed`; every later accept says the same.
pub fn listener_close_releases_accept(t: &Transport) {
    let listener = t.listen();
    let (entering, entered) = std::sync::mpsc::channel();
    thread::scope(|s| {
        let blocked = s.spawn(|| {
            entering.send(()).expect("main thread");
            listener.accept()
        });
        entered.recv().expect("the accepting thread started");
        listener.close();
        match blocked.join().expect("accept thread") {
            Err(AcceptError::Closed) => {}
            other => panic!("close must release the accept with Closed, got {other:?}"),
        }
    });
    assert!(matches!(listener.accept(), Err(AcceptError::Closed)));
    assert!(matches!(listener.try_accept(), Err(AcceptError::Closed)));
    assert!(matches!(listener.accept_timeout(Duration::from_secs(5)), Err(AcceptError::Closed)));
    listener.close();
    assert_eq!(listener.stats().accepted, 0);
}

/// `try_accept` says `None` while nobody connects and gives the connection
/// once a peer did; `accept_timeout` gives up with `Timeout` at its
/// deadline, and the listener goes on working after it.
pub fn try_accept_and_accept_timeout(t: &Transport) {
    let listener = t.listen();
    assert!(listener.try_accept().expect("an idle listener is fine").is_none());
    let start = Instant::now();
    match listener.accept_timeout(Duration::from_millis(100)) {
        Err(AcceptError::Timeout) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(start.elapsed() >= Duration::from_millis(100), "{:?}", start.elapsed());
    assert!(listener.try_accept().expect("still fine after a timeout").is_none());

    let at = listener.local_endpoint().to_string();
    let zc = t.zc.clone();
    let client = thread::spawn(move || zc.connect(&at).expect("connect"));
    // The handshake may still be under way (on RDMA, `try_accept` runs the
    // listener's half of it): poll until the connection is there.
    let start = Instant::now();
    let server = loop {
        if let Some(c) = listener.try_accept().expect("try_accept") {
            break c;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "the connection never became ready");
        thread::sleep(Duration::from_millis(1));
    };
    let client = client.join().expect("connect thread");
    let mut buf = client.alloc(2).expect("alloc");
    buf.copy_from_slice(b"hi");
    client.send(buf).expect("send");
    assert_eq!(&*server.recv_timeout(Duration::from_secs(10)).expect("recv"), b"hi");
    assert!(listener.try_accept().expect("try_accept").is_none(), "one peer, one connection");
    assert_eq!(listener.stats().accepted, 1);
    drop((client, server));
    t.assert_pool_drained(Duration::from_secs(10));
}

/// Each side of a connection closes with the last handle that uses it: a
/// `Connection` clone holds both, a `Sender` the sending side, a
/// `Receiver` the receiving side. Dropping one `Sender` of a split clone
/// closes nothing while other handles can still send; the last one going
/// makes the peer see `Disconnected`, while a `Receiver` left over still
/// receives.
pub fn handles_close_their_own_side(t: &Transport) {
    let (client, server) = t.pair();
    let timeout = Duration::from_secs(10);
    let a = client.clone();
    let b = client.clone();
    let (tx_a, rx_a) = a.split::<u32, u32>();
    let (tx_b, rx_b) = b.split::<u32, u32>();
    let (peer_tx, peer_rx) = server.split::<u32, u32>();

    drop(tx_a);
    tx_b.send(1).expect("the other Sender still sends");
    send_raw(&client, 2);
    assert_eq!(peer_rx.recv_timeout(timeout).expect("peer receives from the Sender"), 1);
    assert_eq!(peer_rx.recv_timeout(timeout).expect("peer receives from the Connection"), 2);

    let tx_c = tx_b.clone();
    drop(tx_b);
    drop(client);
    tx_c.send(3).expect("the last Sender still sends");
    assert_eq!(peer_rx.recv_timeout(timeout).expect("peer receives"), 3);
    assert!(matches!(peer_rx.try_recv(), Err(TypedRecvError::Recv(RecvError::Empty))), "still open");

    // The receiving side is still held by the Receivers.
    peer_tx.send(4).expect("peer sends");
    assert_eq!(rx_a.recv_timeout(timeout).expect("a Receiver receives"), 4);

    drop(tx_c);
    match peer_rx.recv_timeout(timeout) {
        Err(TypedRecvError::Recv(RecvError::Disconnected)) => {}
        other => panic!("the last sending handle is gone: expected Disconnected, got {other:?}"),
    }
    // Half closed: the Receivers still receive.
    peer_tx.send(5).expect("peer sends");
    assert_eq!(rx_b.recv_timeout(timeout).expect("a Receiver receives after sending closed"), 5);
    drop((rx_a, rx_b, peer_tx, peer_rx));
    t.assert_pool_drained(timeout);
}

fn send_raw(conn: &Connection, n: u32) {
    // The bincode encoding of a small u32 is one byte.
    let mut buf = conn.alloc(1).expect("alloc");
    buf[0] = n as u8;
    conn.send(buf).expect("the Connection still sends");
}

/// `iter_results` yields every message and every message that does not
/// decode, in order, and ends at the peer's clean close; `iter` stops at
/// the first error.
pub fn iter_results(t: &Transport) {
    let (client, server) = t.pair();
    let mut raw = client.alloc(3).expect("alloc");
    raw.copy_from_slice(&[0xff, 0xff, 0xff]);
    let (tx, _rx) = client.split::<String, ()>();
    tx.send("one".into()).expect("send");
    tx.connection().send(raw).expect("send raw");
    tx.send("two".into()).expect("send");
    drop(tx);
    let (_tx, rx) = server.split::<(), String>();
    let got: Vec<Result<String, TypedRecvError>> = rx.iter_results().collect();
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(got[0].as_ref().expect("first"), "one");
    assert!(matches!(got[1], Err(TypedRecvError::Decode(_))), "{:?}", got[1]);
    assert_eq!(got[2].as_ref().expect("third"), "two");
    assert!(rx.iter_results().next().is_none(), "ended for good after Disconnected");

    // `iter` ends quietly at the bad message.
    let (client, server) = t.pair();
    let (tx, _rx) = client.split::<String, ()>();
    tx.send("one".into()).expect("send");
    let mut raw = tx.connection().alloc(3).expect("alloc");
    raw.copy_from_slice(&[0xff, 0xff, 0xff]);
    tx.connection().send(raw).expect("send raw");
    tx.send("two".into()).expect("send");
    let (_tx, rx) = server.split::<(), String>();
    let got: Vec<String> = rx.iter().collect();
    assert_eq!(got, ["one"]);
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).expect("the connection is fine"), "two");
}

/// A small message: one `u64`, encoded as one varint, like [`SmallB`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, yoke::Yokeable)]
pub struct SmallA {
    /// Whose.
    pub user_id: u64,
}

/// Another type whose encoding [`SmallA`]'s bytes happen to fit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, yoke::Yokeable)]
pub struct SmallB {
    /// Degrees.
    pub temperature: u64,
}

/// Wait until `conn` has `n` messages queued for the application.
fn wait_queued(conn: &zerocast::Connection, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while conn.stats().queued < n {
        assert!(Instant::now() < deadline, "{n} messages never arrived: {:?}", conn.stats());
        thread::sleep(Duration::from_millis(1));
    }
}

fn assert_mismatch<T: std::fmt::Debug>(r: Result<T, TypedRecvError>) {
    match r {
        Err(e @ TypedRecvError::TypeMismatch { .. }) => {
            let TypedRecvError::TypeMismatch { sent, expected } = &e else { unreachable!() };
            assert!(sent.ends_with("SmallA"), "sent: {sent}");
            assert!(expected.ends_with("SmallB"), "expected: {expected}");
            let text = e.to_string();
            assert!(text.contains("SmallA") && text.contains("SmallB"), "{text}");
            assert_eq!(e.kind(), Some(ErrorKind::Protocol));
            assert!(!e.is_disconnected());
        }
        other => panic!("expected a type mismatch, got {other:?}"),
    }
}

/// With the type check on, a receiver of another type fails at once with
/// both names, even though the bytes would decode, on every receive
/// (owned, borrowed, polling, iterating) and from then on.
pub fn typed_check_mismatch(t: &Transport) {
    {
        let (client, server) = t.pair();
        let (tx, _r) = client.with_typed_check(true).split::<SmallA, ()>();
        let (_s, rx) = server.split::<(), SmallB>();
        tx.send(SmallA { user_id: 42 }).expect("send");
        tx.send(SmallA { user_id: 43 }).expect("send");
        assert_mismatch(rx.recv_timeout(Duration::from_secs(10)));
        // What follows would be misread: the receiver stays failed.
        assert_mismatch(rx.try_recv());
        assert_mismatch(rx.recv());
        assert_mismatch(rx.clone().recv_ref_timeout(Duration::from_secs(10)));
        assert_eq!(rx.iter().count(), 0, "iteration ends at the mismatch");
    }
    {
        // The borrowing receive sees it first too.
        let (client, server) = t.pair();
        let (tx, _r) = client.with_typed_check(true).split::<SmallA, ()>();
        let (_s, rx) = server.split::<(), SmallB>();
        tx.send(SmallA { user_id: 42 }).expect("send");
        assert_mismatch(rx.recv_ref_timeout(Duration::from_secs(10)));
    }
    {
        // And a polling receive, once the announcement is there.
        let (client, server) = t.pair();
        let (tx, _r) = client.with_typed_check(true).split::<SmallA, ()>();
        let (_s, rx) = server.clone().split::<(), SmallB>();
        tx.send(SmallA { user_id: 42 }).expect("send");
        wait_queued(&server, 2);
        assert_mismatch(rx.try_recv());
    }
    t.assert_pool_drained(Duration::from_secs(10));
}

/// With the type check on and the same type at both ends, messages arrive
/// as sent and the announcement is never seen: not by `try_recv` (which
/// does not report an empty channel while a message waits behind it), not
/// by `recv_ref`, not by iteration; its credit comes back.
pub fn typed_check_match(t: &Transport, window: u32) {
    let (client, server) = t.pair();
    // On the wire: the announcement, then the message.
    {
        let (tx, _r) = client.clone().with_typed_check(true).split::<SmallA, ()>();
        tx.send(SmallA { user_id: 7 }).expect("send");
        let first = server.recv_timeout(Duration::from_secs(10)).expect("announcement");
        assert!(first.starts_with(b"\0zerocast:type\0\x01"), "{:?}", &first[..]);
        assert!(String::from_utf8_lossy(&first).ends_with("SmallA"));
        assert_eq!(&*server.recv_timeout(Duration::from_secs(10)).expect("message"), &[7]);
    }
    let (client, server) = t.pair();
    let (tx, _r) = client.with_typed_check(true).split::<SmallA, ()>();
    let (_s, rx) = server.clone().split::<(), SmallA>();
    assert!(matches!(rx.try_recv(), Err(TypedRecvError::Recv(RecvError::Empty))));
    let tx2 = tx.clone();
    tx2.send(SmallA { user_id: 0 }).expect("send");
    wait_queued(&server, 2);
    assert_eq!(rx.try_recv().expect("the message behind the announcement"), SmallA { user_id: 0 });
    assert!(matches!(rx.try_recv(), Err(TypedRecvError::Recv(RecvError::Empty))));
    // More messages than the window, from both clones: credits keep
    // flowing, and only one announcement went out.
    let n = 3 * u64::from(window);
    for i in 1..=n {
        let tx = if i % 2 == 0 { &tx } else { &tx2 };
        tx.send(SmallA { user_id: i }).expect("send");
        if i % 3 == 0 {
            let g = rx.recv_ref_timeout(Duration::from_secs(10)).expect("recv_ref");
            assert_eq!(g.get(), &SmallA { user_id: i });
        } else {
            assert_eq!(rx.recv_timeout(Duration::from_secs(10)).expect("recv"), SmallA { user_id: i });
        }
    }
    drop((tx, tx2));
    assert!(rx.iter().next().is_none(), "nothing but the messages sent");
    assert!(matches!(rx.recv(), Err(e) if e.is_disconnected()));
    drop((rx, _r, _s, server));
    t.assert_pool_drained(Duration::from_secs(10));
}

/// With the type check off on the sender, nothing is announced: the
/// message is the first thing on the wire, and a receiver of another type
/// whose encoding the bytes fit decodes it (the old behaviour).
pub fn typed_check_off(t: &Transport) {
    let (client, server) = t.pair();
    let (tx, _r) = client.clone().with_typed_check(false).split::<SmallA, ()>();
    assert!(!tx.connection().typed_check());
    tx.send(SmallA { user_id: 42 }).expect("send");
    assert_eq!(&*server.recv_timeout(Duration::from_secs(10)).expect("message"), &[42]);
    tx.send(SmallA { user_id: 42 }).expect("send");
    let (_s, rx) = server.split::<(), SmallB>();
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).expect("decodes"), SmallB { temperature: 42 });
}

/// Two threads receive on one connection, taking turns: the one that
/// reads the connection takes a message and stops receiving, and the other
/// — waiting behind it for deliveries — still gets the next message. Then
/// the same with the roles swapped, many times.
pub fn receivers_take_turns(t: &Transport) {
    let (client, server) = t.pair();
    let wait = Duration::from_secs(10);
    for round in 0..20u8 {
        let (a, b) = (server.clone(), server.clone());
        let first = thread::spawn(move || a.recv_timeout(wait).map(|m| m[0]));
        // Give the first thread a moment to be the one reading, so the
        // second waits behind it (the outcome is checked either way).
        thread::sleep(Duration::from_millis(5));
        let second = thread::spawn(move || b.recv_timeout(wait).map(|m| m[0]));
        thread::sleep(Duration::from_millis(5));
        for i in 0..2u8 {
            let mut buf = client.alloc(1).expect("alloc");
            buf[0] = 2 * round + i;
            client.send_timeout(buf, wait).expect("send");
            // One receiver takes this message and stops receiving; the
            // next is for the other.
            thread::sleep(Duration::from_millis(2));
        }
        let mut got = [
            first.join().expect("first receiver").expect("a message for the first receiver"),
            second.join().expect("second receiver").expect("a message for the second receiver"),
        ];
        got.sort_unstable();
        assert_eq!(got, [2 * round, 2 * round + 1], "round {round}: each message once");
    }
}
