//! RDMA UD and multicast sockets against a real verbs device: resolution,
//! replies, the MTU limit, group membership, loss accounting and interop
//! with rdma-core's `mckey`.
//!
//! Ignored on a plain `cargo test`; `scripts/test` runs them inside the
//! Soft-RoCE guest, serially.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use zerocast_core::{Endpoint, RecvError};
use zerocast_mem::PoolConfig;
use zerocast_rdma::ud::{UdConfig, UdError, UdSocket, UdTransport};

fn addr() -> String {
    std::env::var("ZEROCAST_RDMA_ADDR").unwrap_or_else(|_| "10.0.2.15".to_owned())
}

fn transport() -> UdTransport {
    UdTransport::new(UdConfig::default(), PoolConfig::default().with_max_bytes(64 << 20))
        .expect("UD transport")
}

fn ep(s: &str) -> Endpoint {
    Endpoint::parse(s).expect("endpoint")
}

fn bind(t: &UdTransport) -> UdSocket {
    t.bind(&ep(&format!("ud://{}:0", addr()))).expect("bind")
}

fn send(s: &UdSocket, to: &SocketAddr, bytes: &[u8]) {
    let mut b = s.alloc(bytes.len(), None).expect("alloc");
    b.copy_from_slice(bytes);
    s.send_to(b, to).map_err(|(_, e)| e).expect("send");
}

fn soon() -> Option<Instant> {
    Some(Instant::now() + Duration::from_secs(10))
}

/// A group for this test and process.
fn group(n: u8) -> SocketAddr {
    format!("239.{}.{}.{n}:7000", 100 + std::process::id() % 100, std::process::id() % 250).parse().unwrap()
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn unicast_roundtrip_and_reply() {
    let t = transport();
    let (a, b) = (bind(&t), bind(&t));
    assert!(a.max_datagram() > 0 && a.max_datagram() == a.mtu() as usize - 16);
    send(&a, &b.local_addr(), b"over UD");
    let (d, from) = b.recv_from(soon()).expect("b receives");
    assert_eq!((&*d, d.seq(), from), (&b"over UD"[..], 0, a.local_addr()));
    drop(d);
    // The reply goes to the source the receive reported, without resolving.
    send(&b, &from, b"reply");
    let (d, from_b) = a.recv_from(soon()).expect("a receives the reply");
    assert_eq!((&*d, from_b), (&b"reply"[..], b.local_addr()));
    assert_eq!(b.source_stats(&a.local_addr()).map(|s| (s.received, s.lost)), Some((1, 0)));
    drop(d);
    assert!(a.flush(Duration::from_secs(5)) && b.flush(Duration::from_secs(5)));
}

/// The threads of this process.
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").expect("/proc/self/task").count()
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn sockets_add_no_threads() {
    const SOCKETS: usize = 32;
    let t = transport();
    let first = bind(&t);
    let before = threads();
    let socks: Vec<UdSocket> = (0..SOCKETS).map(|_| bind(&t)).collect();
    let during = threads();
    assert!(during <= before, "{SOCKETS} more sockets took {during} threads, from {before}");
    // Each one's rdma_cm events are read: every socket resolves the first
    // (and answers its resolution), and its datagram arrives.
    for (i, s) in socks.iter().enumerate() {
        send(s, &first.local_addr(), &(i as u32).to_le_bytes());
        let (d, from) = first.recv_from(soon()).expect("the first socket receives");
        assert_eq!((&d[..], from), (&(i as u32).to_le_bytes()[..], s.local_addr()));
        drop(d);
        send(&first, &s.local_addr(), b"back");
        let (d, _) = s.recv_from(soon()).expect("each socket receives");
        assert_eq!(&d[..], b"back");
    }
    assert!(threads() <= before, "resolving added threads");
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn a_full_send_buffer_goes_with_the_header_from_a_slot_and_arrives_the_same() {
    let t = transport();
    let (a, b) = (bind(&t), bind(&t));
    let to = b.local_addr();
    // A buffer whose payload fills its capacity has no room for the header
    // behind it: the send gathers the header from a slot instead. Both
    // shapes arrive as the same datagram.
    for (i, fill) in [false, true, false].into_iter().enumerate() {
        let mut buf = a.alloc(40, None).expect("alloc");
        assert!(buf.capacity() >= 40 + 16, "alloc leaves room for the header");
        if fill {
            let cap = buf.capacity();
            assert!(cap <= a.max_datagram(), "the smallest class ({cap} B) fits a datagram");
            buf.set_len(cap);
        }
        let len = buf.len();
        for (j, byte) in buf.iter_mut().enumerate() {
            *byte = (i * 31 + j) as u8;
        }
        a.send_to(buf, &to).map_err(|(_, e)| e).expect("send");
        let (d, from) = b.recv_from(soon()).expect("receive");
        assert_eq!((d.len(), d.seq(), from), (len, i as u32, a.local_addr()), "datagram {i}");
        assert!(d.iter().enumerate().all(|(j, &byte)| byte == (i * 31 + j) as u8), "datagram {i}");
    }
    assert_eq!(b.stats().dropped_malformed, 0);
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn flush_fences_the_unsignalled_tail_and_every_send_buffer_comes_back() {
    let t = transport();
    // A send depth of 16 signals one send in 4: of 7 sends, the fourth is
    // signalled and the last three report nothing on their own.
    let tx =
        t.bind_with(&ep(&format!("ud://{}:0", addr())), UdConfig::default().with_send_depth(16)).expect("tx");
    let rx = bind(&t);
    let in_use = t.pool().stats().buffers_in_use;
    for i in 0..7u32 {
        send(&tx, &rx.local_addr(), &i.to_le_bytes());
    }
    assert!(tx.flush(Duration::from_secs(10)), "the fence accounts for the unsignalled tail");
    assert_eq!(t.pool().stats().buffers_in_use, in_use, "every send buffer is back in the pool");
    for i in 0..7u32 {
        let (d, from) = rx.recv_from(soon()).expect("rx receives");
        assert_eq!((u32::from_le_bytes(d[..4].try_into().unwrap()), d.seq(), from), (i, i, tx.local_addr()));
    }
    // The fence went to tx itself, which skipped it: no datagram, nothing
    // counted as malformed.
    assert!(matches!(tx.try_recv_from(), Err(RecvError::Empty)));
    let s = tx.stats();
    assert_eq!((s.sent, s.received, s.dropped_malformed, s.send_errors), (7, 0, 0, 0));
    // Nothing is outstanding now: a flush returns at once, with no fence.
    assert!(tx.flush(Duration::ZERO));
    send(&tx, &rx.local_addr(), b"after");
    assert!(tx.flush(Duration::from_secs(10)));
    assert_eq!(&*rx.recv_from(soon()).expect("after the fence").0, b"after");
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn oversized_send_is_refused_before_posting() {
    let t = transport();
    let (a, b) = (bind(&t), bind(&t));
    let max = a.max_datagram();
    let buf = a.alloc(max + 1, None).expect("alloc");
    let (back, err) = a.send_to(buf, &b.local_addr()).expect_err("too large");
    assert_eq!(back.len(), max + 1, "the buffer comes back");
    assert!(matches!(err, UdError::TooLarge { len, max: m, .. } if len == max + 1 && m == max), "{err}");
    assert_eq!(a.stats().sent, 0, "nothing was posted");
    // Exactly the limit goes through.
    send(&a, &b.local_addr(), &vec![7u8; max]);
    let (d, _) = b.recv_from(soon()).expect("max-size datagram");
    assert!(d.len() == max && d.iter().all(|&x| x == 7));
    assert!(matches!(b.try_recv_from(), Err(RecvError::Empty)));
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn multicast_members_receive_and_leave_stops_delivery() {
    let t = transport();
    let g = group(1);
    let uri = format!("mcast://{}?iface={}", g, addr());
    let m1 = t.multicast(&ep(&uri)).expect("member 1");
    let m2 = t.multicast(&ep(&uri)).expect("member 2");
    let sender = bind(&t);
    send(&sender, &g, b"one");
    for m in [&m1, &m2] {
        let (d, from) = m.recv_from(soon()).expect("member receives");
        assert_eq!((&*d, from), (&b"one"[..], sender.local_addr()));
    }
    m2.leave(&g).expect("leave");
    assert!(matches!(m2.leave(&g), Err(UdError::NotMember { .. })));
    send(&sender, &g, b"two");
    assert_eq!(&*m1.recv_from(soon()).expect("m1 still receives").0, b"two");
    assert!(matches!(
        m2.recv_from(Some(Instant::now() + Duration::from_millis(500))),
        Err(RecvError::Timeout)
    ));
    m2.join(&g).expect("rejoin");
    send(&sender, &g, b"three");
    assert_eq!(&*m2.recv_from(soon()).expect("m2 receives again").0, b"three");
    assert_eq!(&*m1.recv_from(soon()).expect("m1").0, b"three");
    let s = m2.source_stats(&sender.local_addr()).expect("stats");
    assert_eq!((s.received, s.lost), (2, 1), "the datagram sent while m2 was out reads as lost");
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn overrun_receiver_counts_every_loss_and_nothing_hangs() {
    const DEPTH: u32 = 32;
    const BURST: usize = 300;
    let t = transport();
    let rx = t
        .bind_with(&ep(&format!("ud://{}:0", addr())), UdConfig::default().with_recv_depth(DEPTH))
        .expect("rx");
    let tx = bind(&t);
    // The receiver does not receive (so nothing is reposted) while a burst
    // far larger than its receive queue arrives.
    for i in 0..BURST {
        send(&tx, &rx.local_addr(), &(i as u32).to_le_bytes());
    }
    assert!(tx.flush(Duration::from_secs(10)));
    let mut got = 0u64;
    while let Ok((d, _)) = rx.recv_from(Some(Instant::now() + Duration::from_millis(300))) {
        assert_eq!(u32::from_le_bytes(d[..4].try_into().unwrap()), d.seq(), "payload matches its number");
        got += 1;
    }
    assert!(got >= 1 && got <= u64::from(DEPTH), "the queue held at most {DEPTH}, got {got}");
    // A last datagram after the drain closes the span.
    send(&tx, &rx.local_addr(), &(BURST as u32).to_le_bytes());
    rx.recv_from(soon()).expect("the last datagram");
    got += 1;
    let s = rx.source_stats(&tx.local_addr()).expect("stats");
    let sent = BURST as u64 + 1;
    assert_eq!((s.received, s.lost, s.reordered), (got, sent - got, 0), "{s:?}");
    assert_eq!(tx.stats().sent, sent);
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn source_cap_evicts_idle_sources_with_their_address_handles() {
    const CAP: u64 = 4;
    const SENDERS: usize = 16;
    let t = transport();
    let rx = t.bind(&ep(&format!("ud://{}:0?max_sources={CAP}", addr()))).expect("rx");
    let active = bind(&t);
    let senders: Vec<UdSocket> = (0..SENDERS).map(|_| bind(&t)).collect();
    let to = rx.local_addr();
    for (i, s) in senders.iter().enumerate() {
        // The active source sends between every two new ones: CLOCK keeps it.
        send(&active, &to, b"active");
        let (d, from) = rx.recv_from(soon()).expect("the active source's datagram");
        assert_eq!((&*d, from), (&b"active"[..], active.local_addr()));
        drop(d);
        send(s, &to, &(i as u32).to_le_bytes());
        let (d, from) = rx.recv_from(soon()).expect("a new source's datagram arrives");
        assert_eq!((&d[..], from), (&(i as u32).to_le_bytes()[..], s.local_addr()));
        drop(d);
        // A reply over the route learned from it: still in flight, maybe,
        // when the next new source evicts that route. The send holds the
        // address handle until its completion is polled.
        send(&rx, &from, b"reply");
        let st = rx.stats();
        assert!(st.sources_tracked <= CAP, "{st:?}");
        assert!(st.address_handles <= CAP, "learned routes leave with their sources: {st:?}");
    }
    let st = rx.stats();
    let distinct = SENDERS as u64 + 1;
    assert_eq!((st.received, st.dropped_malformed), (2 * SENDERS as u64, 0));
    assert_eq!(
        (st.sources_tracked, st.sources_evicted, st.address_handles),
        (CAP, distinct - CAP, CAP),
        "{st:?}"
    );
    let mine = rx.source_stats(&active.local_addr()).expect("the active source is kept");
    assert_eq!((mine.received, mine.lost, mine.duplicates, mine.restarts), (SENDERS as u64, 0, 0, 0));
    assert!(rx.source_stats(&senders[0].local_addr()).is_none(), "the first new source was evicted");
    assert!(rx.source_stats(&senders[SENDERS - 1].local_addr()).is_some());
    assert_eq!(rx.sources().len() as u64, CAP);
    // Every reply completes, those whose route was evicted in flight too,
    // and arrives.
    assert!(rx.flush(Duration::from_secs(10)), "every reply completed");
    for s in &senders {
        let (d, from) = s.recv_from(soon()).expect("the reply arrives");
        assert_eq!((&*d, from), (&b"reply"[..], to));
    }
    // A source whose route was evicted is resolved again for a send.
    send(&rx, &senders[0].local_addr(), b"again");
    assert_eq!(&*senders[0].recv_from(soon()).expect("after eviction").0, b"again");
    assert!(rx.flush(Duration::from_secs(10)));
    assert_eq!(rx.stats().sent, SENDERS as u64 + 1);
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn one_socket_joins_several_groups_up_to_its_limit() {
    let t = transport();
    let cfg = UdConfig::default().with_max_groups(3);
    let m = t.bind_with(&ep(&format!("ud://{}:0", addr())), cfg).expect("member");
    let sender = bind(&t);
    let groups: Vec<SocketAddr> = (10..14).map(group).collect();
    for g in &groups[..3] {
        m.join(g).expect("join");
    }
    let err = m.join(&groups[3]).expect_err("over the limit");
    assert!(matches!(err, UdError::TooManyGroups { joined: 3, max: 3 }), "{err}");
    for (i, g) in groups[..3].iter().enumerate() {
        send(&sender, g, &[i as u8]);
        let (d, from) = m.recv_from(soon()).expect("group datagram");
        assert_eq!((&*d, from), (&[i as u8][..], sender.local_addr()));
    }
    m.leave(&groups[0]).expect("leave");
    m.join(&groups[3]).expect("room again");
    send(&sender, &groups[3], b"g3");
    assert_eq!(&*m.recv_from(soon()).expect("fourth group").0, b"g3");
    let mut joined = m.groups();
    joined.sort();
    let mut want: Vec<_> = groups[1..].iter().map(|g| g.ip()).collect();
    want.sort();
    assert_eq!(joined, want);
}

/// Run `mckey` with `args`; its output lines arrive on the returned channel.
fn mckey(args: &[&str]) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    use std::io::BufRead;
    let mut child = Command::new("stdbuf")
        .args(["-oL", "mckey"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mckey (rdma-core's librdmacm-utils) runs");
    let (tx, rx) = std::sync::mpsc::channel();
    for out in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                println!("mckey: {line}");
                let _ = tx.send(line);
            }
        });
    }
    (child, rx)
}

fn wait_exit(child: &mut std::process::Child, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(st) = child.try_wait().expect("wait") {
            return st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("mckey did not finish within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `mckey` sends its datagrams unpaced, and UD may drop some of such a
/// burst below the receiver (a loaded guest did: 73 of 100 arrived once).
/// Every datagram that arrives must be well formed and counted, in every
/// burst; up to three bursts are sent until one arrives whole.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn raw_receiver_counts_every_mckey_datagram() {
    const COUNT: usize = 100;
    let t = transport();
    let g = group(20);
    let uri = format!("mcast://{}?iface={}", g, addr());
    let rx = t.multicast_with(&ep(&uri), UdConfig::default().with_raw(true)).expect("raw member");
    let ip = g.ip().to_string();
    let mut bursts = Vec::new();
    for _ in 0..3 {
        let before = rx.stats().received;
        let (mut child, _lines) =
            mckey(&["-m", &ip, "-b", &addr(), "-s", "-C", &COUNT.to_string(), "-S", "100"]);
        let mut got = 0;
        let mut exited = false;
        while got < COUNT {
            // Until mckey is done, then until the stragglers stop coming.
            let wait = if exited { Duration::from_secs(2) } else { Duration::from_secs(20) };
            match rx.recv_from(Some(Instant::now() + wait)) {
                Ok((d, from)) => {
                    assert_eq!((d.len(), from.ip().to_string(), from.port()), (100, addr(), 0));
                    got += 1;
                }
                Err(_) if !exited => {
                    assert!(wait_exit(&mut child, Duration::from_secs(30)).success(), "mckey failed");
                    exited = true;
                }
                Err(_) => break,
            }
        }
        if !exited {
            assert!(wait_exit(&mut child, Duration::from_secs(30)).success(), "mckey failed");
        }
        assert_eq!(rx.stats().received - before, got as u64, "every datagram received is counted");
        bursts.push(got);
        if got == COUNT {
            break;
        }
    }
    assert_eq!(bursts.last(), Some(&COUNT), "no burst of {COUNT} arrived whole: {bursts:?}");
    assert_eq!(rx.stats().dropped_malformed, 0);
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn raw_sender_reaches_mckey_receiver() {
    const COUNT: usize = 50;
    let t = transport();
    let g = group(21);
    let ip = g.ip().to_string();
    let (mut child, lines) = mckey(&["-m", &ip, "-b", &addr(), "-C", &COUNT.to_string(), "-S", "100"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(l) if l.contains("receiving data") => break,
            Ok(_) => {}
            Err(e) => panic!("mckey receiver did not join: {e}"),
        }
    }
    let tx =
        t.bind_with(&ep(&format!("ud://{}:0", addr())), UdConfig::default().with_raw(true)).expect("raw");
    assert_eq!(tx.max_datagram(), tx.mtu() as usize, "raw datagrams have no header");
    for i in 0..COUNT {
        send(&tx, &g, &[i as u8; 100]);
        std::thread::sleep(Duration::from_millis(2));
    }
    let st = wait_exit(&mut child, Duration::from_secs(30));
    let out: Vec<String> = lines.try_iter().collect();
    assert!(st.success(), "mckey receiver failed: {out:?}");
    assert!(out.iter().any(|l| l.contains("data transfers complete")), "{out:?}");
}
