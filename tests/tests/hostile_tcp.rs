//! Hostile peers at a TCP listener: garbage, lies and silence get a typed
//! error on that one connection; the listener and every other connection
//! keep working.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use zerocast::core::frame::{MAGIC, VERSION};
use zerocast::core::{CreditError, FrameError, FrameKind, Header, HEADER_LEN};
use zerocast::{AcceptError, Config, ConnError, ErrorKind, Listener, RecvError, TcpConfig, Zerocast};
use zerocast_tests::raw_tcp::{handshaken, handshaken_hello};

fn zc() -> Zerocast {
    let mut cfg = Config::default();
    cfg.tcp = TcpConfig::default().with_timeouts(Duration::from_millis(500), Duration::from_millis(300));
    cfg.link = cfg.link.with_recv_window(8);
    Zerocast::with_config(cfg)
}

/// A context whose frames may take 10 s to arrive whole, at the default
/// window: for peers that write a stream in pieces.
fn patient_zc() -> Zerocast {
    let mut cfg = Config::default();
    cfg.tcp = TcpConfig::default().with_timeouts(Duration::from_millis(500), Duration::from_secs(10));
    Zerocast::with_config(cfg)
}

fn listen(zc: &Zerocast) -> (Listener, SocketAddr) {
    let l = zc.listen("tcp://127.0.0.1:0").expect("listen");
    let addr = l.local_endpoint().authority().parse().expect("addr");
    (l, addr)
}

fn data(seq: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = Header::new(FrameKind::Data, 0, seq, payload.len() as u64).encode().to_vec();
    v.extend_from_slice(payload);
    v
}

/// A well-behaved zerocast connection to check the listener still works.
fn check_good_peer(zc: &Zerocast, listener: &Listener) {
    let at = listener.local_endpoint().to_string();
    let zc2 = zc.clone();
    let client = thread::spawn(move || {
        let c = zc2.connect(&at).expect("good client connects");
        let mut b = c.alloc(4).expect("alloc");
        b.copy_from_slice(b"ping");
        c.send(b).expect("send");
        c
    });
    let server = listener.accept().expect("listener still accepts");
    assert_eq!(&*server.recv_timeout(Duration::from_secs(5)).expect("recv"), b"ping");
    drop(client.join());
}

/// Wait until the listener counted `n` failed handshakes (counted by the
/// handshake threads, so a moment after the peers are gone).
fn wait_failed(listener: &Listener, n: u64, within: Duration) {
    let start = Instant::now();
    while listener.stats().handshakes_failed < n {
        assert!(start.elapsed() < within, "{n} failed handshakes not counted: {:?}", listener.stats());
        thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(listener.stats().handshakes_failed, n, "{:?}", listener.stats());
}

fn expect_failure(conn: &zerocast::Connection) -> ConnError {
    let start = Instant::now();
    loop {
        match conn.recv_timeout(Duration::from_secs(5)) {
            Err(RecvError::Failed(e)) => return e,
            Ok(_) => assert!(start.elapsed() < Duration::from_secs(5)),
            other => panic!("expected a failed connection, got {other:?}"),
        }
    }
}

#[test]
fn garbage_instead_of_a_handshake_is_refused() {
    let zc = zc();
    let (listener, addr) = listen(&zc);
    for (i, junk) in
        [&b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..], &[0u8; 40], &[0x5a; 40]].into_iter().enumerate()
    {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.write_all(junk).expect("write");
        // Counted, never handed to accept.
        wait_failed(&listener, i as u64 + 1, Duration::from_secs(5));
        assert!(listener.try_accept().expect("the listener is fine").is_none());
    }
    check_good_peer(&zc, &listener);
    assert_eq!(listener.stats().accepted, 1);
}

#[test]
fn silent_peer_times_out_the_handshake() {
    let zc = zc();
    let (listener, addr) = listen(&zc);
    let _silent = TcpStream::connect(addr).expect("connect");
    let t0 = Instant::now();
    match listener.accept_timeout(Duration::from_millis(300)) {
        Err(AcceptError::Timeout) => {}
        other => panic!("the silent peer is no connection: {other:?}"),
    }
    wait_failed(&listener, 1, Duration::from_secs(5));
    assert!(t0.elapsed() >= Duration::from_millis(500), "failed at the handshake timeout, not before");
    check_good_peer(&zc, &listener);
}

#[test]
fn garbage_frames_fail_only_that_connection() {
    let zc = zc();
    let (listener, addr) = listen(&zc);
    // A good connection, opened first, must survive the bad one.
    let at = listener.local_endpoint().to_string();
    let zc2 = zc.clone();
    let good_client = thread::spawn(move || zc2.connect(&at).expect("connect"));
    let good_server = listener.accept().expect("accept");
    let good_client = good_client.join().expect("join");

    let (mut bad, bad_server) = handshaken(&listener, addr, 8);
    // The magic and this build's version, then kind 15, which does not exist.
    bad.write_all(&[MAGIC, (VERSION << 4) | 0xf]).expect("write");
    bad.write_all(b" this is not a frame at all").expect("write");
    let err = expect_failure(&bad_server);
    assert!(matches!(err, ConnError::Frame(FrameError::UnknownKind { .. })), "{err:?}");
    assert_eq!(err.kind(), ErrorKind::Protocol);

    let mut b = good_client.alloc(2).expect("alloc");
    b.copy_from_slice(b"ok");
    good_client.send(b).expect("send");
    assert_eq!(&*good_server.recv_timeout(Duration::from_secs(5)).expect("recv"), b"ok");
    check_good_peer(&zc, &listener);
}

#[test]
fn huge_length_is_an_error_not_an_allocation() {
    let zc = zc();
    let (listener, addr) = listen(&zc);
    let (mut bad, server) = handshaken(&listener, addr, 8);
    bad.write_all(&Header::new(FrameKind::Data, 0, 0, 1 << 60).encode()).expect("write");
    match expect_failure(&server) {
        ConnError::Frame(FrameError::TooLong { len, .. }) => assert_eq!(len, 1 << 60),
        other => panic!("expected TooLong, got {other:?}"),
    }
}

#[test]
fn peer_stopping_mid_frame_times_out() {
    let zc = zc();
    let (listener, addr) = listen(&zc);
    let (mut bad, server) = handshaken(&listener, addr, 8);
    let frame = data(0, &[1u8; 1000]);
    bad.write_all(&frame[..500]).expect("write half a frame");
    let t0 = Instant::now();
    let err = expect_failure(&server);
    assert!(matches!(err, ConnError::TimedOut(_)), "{err:?}");
    assert_eq!(err.kind(), ErrorKind::PeerSilent, "a peer stalled mid-frame is silent");
    assert!(t0.elapsed() < Duration::from_secs(5));
    drop(bad);
}

#[test]
fn peer_closing_mid_frame_is_truncation() {
    let zc = zc();
    let (listener, addr) = listen(&zc);
    let (mut bad, server) = handshaken(&listener, addr, 8);
    let frame = data(0, &[1u8; 1000]);
    bad.write_all(&frame[..700]).expect("write");
    drop(bad);
    let err = expect_failure(&server);
    assert!(matches!(err, ConnError::Truncated { .. }), "{err:?}");
    assert_eq!(err.kind(), ErrorKind::PeerGone, "a peer that closed mid-frame is gone");
}

/// Small frames that arrive together, in one read, are each checked and
/// delivered in order: a credit frame among them is accounted for in its
/// place, and a frame that breaks the protocol after them fails the
/// connection only after every good frame before it is delivered.
#[test]
fn frames_read_together_are_each_checked_in_order() {
    let zc = zc();
    let (listener, addr) = listen(&zc);
    let (mut bad, server) = handshaken(&listener, addr, 8);
    let mut bytes = Vec::new();
    for seq in 0..300u32 {
        if seq == 150 {
            bytes.extend_from_slice(&Header::new(FrameKind::Credit, 0, seq, 0).encode());
            continue;
        }
        bytes.extend_from_slice(&data(seq, &seq.to_le_bytes()));
    }
    // The magic and this build's version, then kind 15, which does not
    // exist: one write with the rest, so it waits in staging behind them.
    bytes.extend_from_slice(&[MAGIC, (VERSION << 4) | 0xf]);
    bytes.extend_from_slice(&[0u8; 14]);
    bad.write_all(&bytes).expect("write");
    let mut got = Vec::new();
    let err = loop {
        match server.recv_timeout(Duration::from_secs(5)) {
            Ok(m) => got.push(u32::from_le_bytes(m[..4].try_into().expect("four bytes"))),
            Err(RecvError::Failed(e)) => break e,
            Err(e) => panic!("expected the frames, then a failure: {e}"),
        }
    };
    let sent: Vec<u32> = (0..300).filter(|&s| s != 150).collect();
    assert_eq!(got, sent, "every data frame, once, in order");
    assert!(matches!(err, ConnError::Frame(FrameError::UnknownKind { .. })), "{err:?}");
    check_good_peer(&zc, &listener);
}

/// Payloads on both sides of each read path's bounds (copied through the
/// reader's staging, or read straight into their buffer past 16 KiB), in a
/// stream cut at awkward places (a piece of 100 KiB among them, which
/// fills the staging and makes it grow with a frame part-way), each piece
/// read before the next is written: every message arrives whole, unchanged
/// and in order.
#[test]
fn frames_of_every_size_arrive_whole_however_the_stream_is_cut() {
    let zc = patient_zc();
    let (listener, addr) = listen(&zc);
    let (mut bad, server) = handshaken(&listener, addr, 8);
    let sizes = [1usize, 2047, 2049, 4096, 12 << 10, (16 << 10) - 1, 16 << 10, (16 << 10) + 1, 40 << 10, 64];
    let payloads: Vec<Vec<u8>> = (0..3 * sizes.len())
        .map(|i| (0..sizes[i % sizes.len()]).map(|j| (i * 31 + j * 7 + j / 253) as u8).collect())
        .collect();
    let mut bytes = Vec::new();
    for (seq, p) in payloads.iter().enumerate() {
        bytes.extend_from_slice(&data(seq as u32, p));
    }
    let mut got: Vec<Vec<u8>> = Vec::new();
    let cuts = [1usize, 15, 17, 4095, 4097, 16 << 10, 3, (64 << 10) + 1, 9000, 100 << 10];
    let mut at = 0;
    for &cut in cuts.iter().cycle() {
        if at == bytes.len() {
            break;
        }
        let end = (at + cut).min(bytes.len());
        bad.write_all(&bytes[at..end]).expect("write a piece");
        at = end;
        loop {
            match server.try_recv() {
                Ok(m) => got.push(m.to_vec()),
                Err(RecvError::Empty) => break,
                Err(e) => panic!("after {at} bytes: {e}"),
            }
        }
    }
    while got.len() < payloads.len() {
        let m = server.recv_timeout(Duration::from_secs(10)).expect("the rest of the messages");
        got.push(m.to_vec());
    }
    assert_eq!(got.len(), payloads.len());
    for (i, (g, p)) in got.iter().zip(&payloads).enumerate() {
        assert!(g == p, "message {i} ({} bytes) arrived as {} bytes, or changed", p.len(), g.len());
    }
    check_good_peer(&zc, &listener);
}

#[test]
fn credit_overrun_and_bad_sequence_are_detected() {
    let zc = zc();
    let (listener, addr) = listen(&zc);
    // The server announced its window in credits (one per small frame):
    // one unreturned frame more overruns it.
    let (mut bad, server, hello) = handshaken_hello(&listener, addr, 8);
    let window = hello.window;
    assert!(hello.credit_unit > 0 && window >= 8, "{hello:?}");
    for seq in 0..=window {
        bad.write_all(&data(seq, b"x")).expect("write");
    }
    thread::sleep(Duration::from_millis(200));
    let mut held = Vec::new();
    let err = loop {
        match server.try_recv() {
            // Hold the buffers: no credit goes back.
            Ok(m) => held.push(m),
            Err(RecvError::Failed(e)) => break e,
            Err(RecvError::Empty) => thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(held.len() as u32, window, "the frames within the window are delivered first");
    assert!(matches!(err, ConnError::Credit(CreditError::Overrun { window: w }) if w == window), "{err}");
    assert_eq!(err.kind(), ErrorKind::Protocol);

    let (mut bad, server) = handshaken(&listener, addr, 8);
    bad.write_all(&data(0, b"a")).expect("write");
    bad.write_all(&data(5, b"b")).expect("write");
    assert!(matches!(
        expect_failure(&server),
        ConnError::Credit(CreditError::Sequence { expected: 1, got: 5 })
    ));
}

/// A peer that claims a large window of small messages cannot spend it on
/// large ones: each frame costs a credit per unit begun past its first, so
/// the bytes it can make the listener hold are bounded by the window times
/// the unit, and the frame past that is an overrun.
#[test]
fn credits_bound_the_bytes_a_peer_can_park() {
    let zc = zc();
    let (listener, addr) = listen(&zc);
    let (mut bad, server, hello) = handshaken_hello(&listener, addr, 8);
    let unit = u64::from(hello.credit_unit);
    let payload = vec![7u8; 64 << 10];
    let cost = u64::from(zerocast::core::credit::cost(payload.len() as u64, hello.credit_unit));
    let fit = u64::from(hello.window) / cost;
    assert!(fit >= 2, "the window holds two of the largest frames: {hello:?}");
    for seq in 0..=fit {
        bad.write_all(&data(seq as u32, &payload)).expect("write");
    }
    let mut held = Vec::new();
    let err = loop {
        match server.recv_timeout(Duration::from_secs(5)) {
            // Hold every buffer: no credit goes back.
            Ok(m) => held.push(m),
            Err(RecvError::Failed(e)) => break e,
            Err(e) => panic!("expected an overrun, got {e}"),
        }
    };
    assert_eq!(held.len() as u64, fit, "the frames within the window are delivered first");
    let bytes: usize = held.iter().map(|m| m.len()).sum();
    assert!(bytes as u64 <= u64::from(hello.window) * unit, "{bytes} bytes held past the window's budget");
    assert!(matches!(err, ConnError::Credit(CreditError::Overrun { .. })), "{err}");
    assert_eq!(err.kind(), ErrorKind::Protocol);
    drop(held);
    check_good_peer(&zc, &listener);
}

/// A peer that takes our goodbye and never answers it, nor ends its
/// stream, holds a connection the application let go of only until the
/// close timeout: then the listener's side shuts the socket.
#[test]
fn a_peer_that_never_answers_our_goodbye_is_cut_off_at_the_close_timeout() {
    let timeout = Duration::from_millis(300);
    let mut cfg = Config::default();
    cfg.link = cfg.link.with_close_timeout(timeout);
    let zc = Zerocast::with_config(cfg);
    let (listener, addr) = listen(&zc);
    let (mut peer, server) = handshaken(&listener, addr, 8);
    peer.set_read_timeout(Some(Duration::from_secs(10))).expect("read timeout");
    let dropped = Instant::now();
    drop(server);
    // Frames up to our goodbye (credit frames may come first)...
    loop {
        let mut h = [0u8; HEADER_LEN];
        peer.read_exact(&mut h).expect("frames up to the goodbye");
        let header = Header::decode(&h, 1 << 20).expect("a valid frame");
        let mut payload = vec![0u8; header.len as usize];
        peer.read_exact(&mut payload).expect("its payload");
        if header.kind == FrameKind::Control {
            break;
        }
    }
    // ...then nothing until the close timeout, and then the end of stream.
    let mut rest = [0u8; 64];
    let n = peer.read(&mut rest).expect("the end of stream, within 10 s");
    let waited = dropped.elapsed();
    assert_eq!(n, 0, "nothing after the goodbye");
    assert!(waited >= timeout, "cut off after {waited:?}, before the close timeout of {timeout:?}");
    check_good_peer(&zc, &listener);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_after_handshake_never_panic_or_hang(junk in proptest::collection::vec(any::<u8>(), 1..600)) {
        let zc = zc();
        let (listener, addr) = listen(&zc);
        let (mut bad, server) = handshaken(&listener, addr, 8);
        bad.write_all(&junk).expect("write");
        drop(bad);
        // Whatever the bytes, the connection ends with a typed outcome.
        let start = Instant::now();
        loop {
            match server.recv_timeout(Duration::from_secs(5)) {
                Ok(_) => {}
                Err(RecvError::Failed(_)) | Err(RecvError::Disconnected) => break,
                Err(e) => panic!("no typed end within 5 s: {e}"),
            }
            prop_assert!(start.elapsed() < Duration::from_secs(5));
        }
    }
}

#[test]
fn silent_peer_does_not_delay_others() {
    let mut cfg = Config::default();
    cfg.tcp = TcpConfig::default().with_timeouts(Duration::from_secs(3), Duration::from_secs(3));
    let zc = Zerocast::with_config(cfg);
    let (listener, addr) = listen(&zc);
    let _silent = TcpStream::connect(addr).expect("connect");
    thread::sleep(Duration::from_millis(50));
    let at = listener.local_endpoint().to_string();
    let zc2 = zc.clone();
    let good = thread::spawn(move || zc2.connect(&at).expect("good peer connects"));
    // The good peer's handshake finishes first although it arrived second.
    let first = listener.accept().expect("the good peer is accepted first");
    let good = good.join().expect("join");
    let mut b = good.alloc(2).expect("alloc");
    b.copy_from_slice(b"hi");
    good.send(b).expect("send");
    assert_eq!(&*first.recv_timeout(Duration::from_secs(5)).expect("recv"), b"hi");
    // The silent peer times out, counted and never handed to accept.
    wait_failed(&listener, 1, Duration::from_secs(10));
    assert!(listener.try_accept().expect("the listener is fine").is_none());
}

/// Hostile cases run against one listener by
/// [`hostile_cases_fail_only_their_connection`]; `ZEROCAST_HOSTILE_CASES`
/// overrides the count.
const HOSTILE_CASES: u64 = 100_000;

/// The bytes of hostile case `i` (after a good handshake), and whether the
/// peer broke the protocol (so the connection must fail, not just end).
fn hostile_case(i: u64, rng: &mut u64) -> (Vec<u8>, bool) {
    let mut next = || {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        *rng
    };
    let lie = |kind: u8, credits: u16, seq: u32, len: u64| {
        let mut h = Header::new(FrameKind::Data, credits, seq, len).encode();
        h[1] = (h[1] & 0xf0) | kind;
        h.to_vec()
    };
    match i % 8 {
        // Random bytes, never starting with the magic byte.
        0 => {
            let n = 1 + (next() % 300) as usize;
            let mut v: Vec<u8> = (0..n).map(|_| next() as u8).collect();
            if v[0] == 0x5A {
                v[0] = 0;
            }
            (v, true)
        }
        // A truncated header, then the end of the stream.
        1 => (data(0, b"x")[..1 + (next() % 15) as usize].to_vec(), true),
        2 => (lie(0, 0, 0, 1 << 32), true),
        3 => (lie(0, 0, 0, 1 << 60), true),
        // An unknown frame kind.
        4 => (lie(4 + (next() % 12) as u8, 0, 0, 0), true),
        // A credit frame returning credits never granted.
        5 => (lie(1, 1 + (next() % 100) as u16, 0, 0), true),
        // Data beyond the granted window of 8 (nothing is ever returned).
        6 => ((0..9).flat_map(|s| data(s, b"d")).collect(), true),
        // A well-formed frame, then a clean end of stream: no failure needed.
        _ => (data(0, b"fine"), false),
    }
}

/// 100 000 hostile connections, one after another, against one listener
/// while a good connection streams beside them: each ends with a typed
/// outcome (a failure when it broke the protocol), nothing panics or hangs,
/// the good connection's data arrives intact and in order, memory stays
/// bounded and the pool drains.
#[test]
fn hostile_cases_fail_only_their_connection() {
    let cases =
        std::env::var("ZEROCAST_HOSTILE_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(HOSTILE_CASES);
    let zc = zc();
    let (listener, addr) = listen(&zc);
    // The bystander: a good connection that keeps streaming.
    let at = listener.local_endpoint().to_string();
    let zc2 = zc.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let good = thread::spawn(move || {
        let c = zc2.connect(&at).expect("good client connects");
        let mut n = 0u32;
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            let mut b = c.alloc(4).expect("alloc");
            b.copy_from_slice(&n.to_le_bytes());
            c.send(b).expect("the good connection keeps sending");
            n += 1;
            thread::sleep(Duration::from_micros(200));
        }
        c.close();
        n
    });
    let good_server = listener.accept().expect("accept the good peer");
    let reader = thread::spawn(move || {
        let mut next = 0u32;
        loop {
            match good_server.recv_timeout(Duration::from_secs(30)) {
                Ok(m) => {
                    assert_eq!(m[..], next.to_le_bytes(), "the good connection lost or reordered data");
                    next += 1;
                }
                Err(RecvError::Disconnected) => return next,
                Err(e) => panic!("the good connection failed after {next} messages: {e:?}"),
            }
        }
    });
    let rss = || {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).map(str::to_owned))
            .and_then(|l| l.split_whitespace().nth(1).and_then(|n| n.parse::<u64>().ok()))
            .unwrap_or(0)
    };
    let start = Instant::now();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let (mut failed, mut rss_warm) = (0u64, 0u64);
    for i in 0..cases {
        if i == 1000 {
            rss_warm = rss();
        }
        let (bytes, broken) = hostile_case(i, &mut rng);
        let (bad, server) = handshaken(&listener, addr, 8);
        let bad = socket2::Socket::from(bad);
        // Reset, not FIN, on close: no TIME_WAIT pile-up over many cases.
        bad.set_linger(Some(Duration::ZERO)).expect("SO_LINGER");
        let _ = std::io::Write::write_all(&mut &bad, &bytes);
        let _ = bad.shutdown(std::net::Shutdown::Write);
        let outcome = loop {
            match server.recv_timeout(Duration::from_secs(5)) {
                Ok(_) => {}
                Err(RecvError::Failed(e)) => break Some(e),
                Err(RecvError::Disconnected) => break None,
                Err(e) => panic!("case {i}: no typed end within 5 s: {e:?}"),
            }
        };
        drop(bad);
        match outcome {
            Some(_) => failed += 1,
            None => assert!(!broken, "case {i}: a protocol violation ended as a clean disconnect"),
        }
    }
    let elapsed = start.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent = good.join().expect("good sender");
    assert_eq!(reader.join().expect("good reader"), sent, "the good connection's messages");
    let growth = rss().saturating_sub(rss_warm);
    println!("{cases} hostile connections in {elapsed:?}: {failed} failed with a typed error; {sent} good messages beside them; RSS grew {growth} KiB after warm-up");
    assert!(growth < 64 * 1024, "memory grew by {growth} KiB over {cases} hostile connections");
    zerocast_tests::assert_pool_drained(&zc.pool().expect("pool"), Duration::from_secs(10));
}

/// A port scan against a listener with an application blocked in
/// `accept`: 10 000 raw connections that hang up at once or send garbage.
/// The accept never returns for them; each is counted as a failed
/// handshake; a good client that then connects is accepted and talks.
#[test]
fn accept_survives_ten_thousand_failed_handshakes() {
    const SCANS: u64 = 10_000;
    let zc = zc();
    let (listener, addr) = listen(&zc);
    thread::scope(|s| {
        let acceptor = s.spawn(|| listener.accept());
        let scanners: Vec<_> = (0..2u64)
            .map(|t| {
                s.spawn(move || {
                    for i in 0..SCANS / 2 {
                        let mut c = TcpStream::connect(addr).expect("connect");
                        if (i + t) % 2 == 0 {
                            // Whether the write lands before the server
                            // gives up does not matter.
                            let _ = c.write_all(b"SSH-2.0-OpenSSH_9.6\r\n");
                        }
                    }
                })
            })
            .collect();
        for scanner in scanners {
            scanner.join().expect("scanner");
        }
        assert!(!acceptor.is_finished(), "accept returned during the scan");
        let at = listener.local_endpoint().to_string();
        let client = zc.connect(&at).expect("a good client connects after the scan");
        let server = acceptor.join().expect("accept thread").expect("the good client is accepted");
        let (tx, rx) = client.split::<u64, u64>();
        let (reply, requests) = server.split::<u64, u64>();
        for n in 0..100u64 {
            tx.send(n).expect("send");
            let got = requests.recv_timeout(Duration::from_secs(5)).expect("the server receives");
            reply.send(got * 2).expect("reply");
            assert_eq!(rx.recv_timeout(Duration::from_secs(5)).expect("the client receives"), n * 2);
        }
    });
    wait_failed(&listener, SCANS, Duration::from_secs(60));
    let stats = listener.stats();
    assert_eq!(stats.accepted, 1, "{stats:?}");
    println!("after the scan: {stats:?}");
}

/// `Receiver::iter_results` hands a server the failure: a peer that sends
/// a good message, then a broken frame, gives `Ok`, then the typed
/// failure as the last item; `iter` would have stopped without a word.
#[test]
fn iter_results_ends_with_the_failure() {
    let zc = zc();
    let (listener, addr) = listen(&zc);
    let (mut bad, server) = handshaken(&listener, addr, 8);
    // bincode's encoding of the u32 7 is the byte 7.
    bad.write_all(&data(0, &[7])).expect("write");
    bad.write_all(&[MAGIC, (VERSION << 4) | 0xf]).expect("write");
    bad.write_all(b" this is not a frame at all").expect("write");
    let (_tx, rx) = server.split::<(), u32>();
    let got: Vec<_> = rx.iter_results().collect();
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(*got[0].as_ref().expect("the good message"), 7);
    match &got[1] {
        Err(zerocast::TypedRecvError::Recv(RecvError::Failed(ConnError::Frame(
            FrameError::UnknownKind { .. },
        )))) => {}
        other => panic!("expected the frame failure, got {other:?}"),
    }
    assert!(rx.iter_results().next().is_some(), "a new iteration reports the failure again");
}

/// A 1 MiB frame that trickles in, 64 KiB at a time: while it is partial,
/// every `try_recv` returns at once with `Empty` (a partial frame stays
/// partial; it is not finished with blocking reads), a `recv_timeout`
/// keeps its deadline, and the message arrives whole with its last byte.
#[test]
fn try_recv_never_waits_for_a_frame_that_trickles_in() {
    let zc = patient_zc();
    let (listener, addr) = listen(&zc);
    let (mut bad, server) = handshaken(&listener, addr, 8);
    let payload: Vec<u8> = (0..1usize << 20).map(|i| (i * 7 + i / 251) as u8).collect();
    let frame = data(0, &payload);
    let chunks: Vec<&[u8]> = frame.chunks(64 << 10).collect();
    let mut tries = Vec::new();
    let mut waits = Vec::new();
    for (k, chunk) in chunks.iter().enumerate() {
        bad.write_all(chunk).expect("write a chunk");
        if k + 1 == chunks.len() {
            break;
        }
        for _ in 0..3 {
            let t = Instant::now();
            let r = server.try_recv();
            tries.push(t.elapsed());
            assert!(matches!(r, Err(RecvError::Empty)), "chunk {k}: {:?}", r.map(|m| m.len()));
        }
        let t = Instant::now();
        let r = server.recv_timeout(Duration::from_millis(20));
        waits.push(t.elapsed());
        assert!(matches!(r, Err(RecvError::Timeout)), "chunk {k}: {:?}", r.map(|m| m.len()));
    }
    let got = server.recv_timeout(Duration::from_secs(10)).expect("the whole message");
    assert!(*got == payload[..], "the message arrived changed");
    tries.sort();
    waits.sort();
    let (median, max) = (tries[tries.len() / 2], tries[tries.len() - 1]);
    println!("try_recv while a 1 MiB frame trickles in: median {median:?}, max {max:?}; recv_timeout(20 ms) max {:?}", waits[waits.len() - 1]);
    assert!(median < Duration::from_millis(1), "try_recv took {median:?} (median)");
    // A blocking read would wait for the next chunk, which only comes
    // after this loop: anything near the frame timeout is a wait.
    assert!(max < Duration::from_millis(100), "try_recv took {max:?}");
    assert!(
        waits[waits.len() - 1] < Duration::from_millis(500),
        "recv_timeout(20 ms) took {:?}",
        waits[waits.len() - 1]
    );
}
