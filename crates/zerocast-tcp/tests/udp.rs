//! `zerocast_tcp::udp` over loopback: unicast, multicast (in one process and
//! across processes), leave, hostile input, oversize sends, and pool hygiene.
//!
//! Every test uses its own ports (port 0 for unicast; a random group and
//! port in 20000..60000 for multicast) and short, bounded deadlines. A
//! multicast test that gets nothing fails with a message that names the
//! likely cause instead of hanging.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use zerocast_core::{Caps, Datagram, Endpoint, FrameKind, Header, RecvError, TxBuffer, HEADER_LEN};
use zerocast_mem::{Pool, PoolConfig, Wait};
use zerocast_tcp::udp::{RecvDatagram, UdpConfig, UdpError, UdpSocket, MAX_DATAGRAM};

/// Set in the child process of `multicast_across_processes`: `group:port:count`.
const CHILD_ENV: &str = "ZEROCAST_UDP_TEST_CHILD";
const WAIT: Duration = Duration::from_secs(3);

fn random() -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos());
    h.finish()
}

fn pool() -> Pool {
    Pool::unregistered(PoolConfig::default().with_max_bytes(32 << 20)).unwrap()
}

fn ep(s: &str) -> Endpoint {
    Endpoint::parse(s).unwrap()
}

fn unicast() -> UdpSocket {
    UdpSocket::bind(&ep("ud://127.0.0.1:0"), pool(), UdpConfig::default()).unwrap()
}

fn member(group: SocketAddr) -> Result<UdpSocket, UdpError> {
    UdpSocket::multicast(&ep(&format!("mcast://{group}?iface=127.0.0.1")), pool(), UdpConfig::default())
}

/// A random group 239.x.y.z and port, and its first member. Retries if the
/// port is taken by a socket that does not share it.
fn fresh_group() -> (SocketAddr, UdpSocket) {
    let mut last = None;
    for _ in 0..10 {
        let r = random();
        let ip = Ipv4Addr::new(239, 1 + (r % 254) as u8, (r >> 8) as u8, 1 + ((r >> 16) % 254) as u8);
        let group = SocketAddr::new(IpAddr::V4(ip), 20_000 + ((r >> 24) % 40_000) as u16);
        match member(group) {
            Ok(s) => return (group, s),
            Err(e) => last = Some(e),
        }
    }
    panic!("cannot create a multicast member on loopback: {:?}", last.unwrap());
}

fn payload(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|k| (k * 31 + i * 7 + len) as u8).collect()
}

fn send(s: &UdpSocket, data: &[u8], to: SocketAddr) {
    let mut buf = s.alloc(data.len(), None).unwrap();
    buf.copy_from_slice(data);
    s.send_to(buf, &to).unwrap();
}

/// Receive within [`WAIT`], or fail saying what is probably wrong.
fn expect(s: &UdpSocket, what: &str) -> (RecvDatagram, SocketAddr) {
    match s.recv_from(Some(Instant::now() + WAIT)) {
        Ok(r) => r,
        Err(RecvError::Timeout) if s.local_addr().ip().is_multicast() => panic!(
            "{what}: no multicast datagram arrived at {} within {WAIT:?}. Multicast over loopback seems \
             unavailable here: check `ip link show lo` and `ip route get {}`, and that no firewall drops it",
            s.local_addr(),
            s.local_addr().ip()
        ),
        Err(e) => panic!("{what}: {e:?} at {}", s.local_addr()),
    }
}

fn assert_quiet(s: &UdpSocket, what: &str) {
    match s.recv_from(Some(Instant::now() + Duration::from_millis(300))) {
        Err(RecvError::Timeout) => {}
        Ok((d, from)) => panic!("{what}: got {} bytes (seq {}) from {from}", d.len(), d.seq()),
        Err(e) => panic!("{what}: {e:?}"),
    }
}

fn assert_pool_idle(s: &UdpSocket) {
    let st = s.pool().stats();
    assert_eq!((st.buffers_in_use, st.buffers_free), (0, st.buffers_total), "{st:?}");
}

#[test]
fn unicast_round_trip_of_many_sizes() {
    let (a, b) = (unicast(), unicast());
    let sizes = [0, 1, 15, 16, 17, 511, 512, 1472, 8192, 9000, 65_000, MAX_DATAGRAM];
    for (i, &len) in sizes.iter().enumerate() {
        let data = payload(i, len);
        send(&a, &data, b.local_addr());
        let (d, from) = expect(&b, "unicast");
        assert_eq!(from, a.local_addr());
        assert_eq!(d.seq(), i as u32);
        assert!(*d == data[..], "payload of {len} bytes differs");
        // Received in place: the payload sits right after the header in the pool buffer.
        assert_eq!(d.as_ptr() as u64, d.buf().addr() + HEADER_LEN as u64);
    }
    let n = sizes.len() as u64;
    assert_eq!((a.stats().sent, b.stats().received, b.stats().dropped_malformed), (n, n, 0));
    assert_pool_idle(&a);
    assert_pool_idle(&b);
}

#[test]
fn ipv6_unicast_round_trip() {
    let a = match UdpSocket::bind(&ep("ud://[::1]:0"), pool(), UdpConfig::default()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("skipped: no IPv6 loopback here ({e})");
            return;
        }
    };
    let b = UdpSocket::bind(&ep("ud://[::1]:0"), pool(), UdpConfig::default()).unwrap();
    send(&a, b"over ipv6", b.local_addr());
    let (d, from) = expect(&b, "ipv6");
    assert_eq!((&*d, from), (&b"over ipv6"[..], a.local_addr()));
    // Joining an IPv6 group needs an interface index, which ud://[::1]:0 lacks.
    let group: SocketAddr = "[ff15::9]:1".parse().unwrap();
    assert!(matches!(b.join(&group), Err(UdpError::NoInterface { .. })));
}

fn generic_round_trip<D: Datagram<Addr = SocketAddr>>(a: &D, b: &D) {
    assert_eq!(D::CAPS, Caps::DATAGRAM);
    let mut buf = a.alloc(64, None).unwrap();
    let cap = buf.capacity();
    buf.spare_capacity()[..5].copy_from_slice(b"trait");
    buf.set_len(5);
    if let Err((_, e)) = a.send_to(buf, &b.local_addr()) {
        panic!("send: {e}");
    }
    let (d, from) = b.recv_from(Some(Instant::now() + WAIT)).unwrap();
    assert_eq!((&*d, from), (&b"trait"[..], a.local_addr()));
    // Too large for the datagram: the buffer comes back through the trait too.
    let mut big = a.alloc(a.max_datagram() + 1, None).unwrap();
    big[0] = 42;
    let Err((big, _)) = a.send_to(big, &b.local_addr()) else { panic!("an oversize send went through") };
    assert_eq!((big.len(), big[0]), (a.max_datagram() + 1, 42));
    assert!(cap >= 64);
}

#[test]
fn datagram_trait_round_trip() {
    let cfg = UdpConfig::default().with_max_datagram(1000);
    let a = UdpSocket::bind(&ep("ud://127.0.0.1:0"), pool(), cfg.clone()).unwrap();
    let b = UdpSocket::bind(&ep("ud://127.0.0.1:0"), pool(), cfg).unwrap();
    generic_round_trip(&a, &b);
}

#[test]
fn oversize_send_hands_the_buffer_back() {
    let cfg = UdpConfig::default().with_max_datagram(1000);
    let a = UdpSocket::bind(&ep("ud://127.0.0.1:0"), pool(), cfg.clone()).unwrap();
    let b = UdpSocket::bind(&ep("ud://127.0.0.1:0"), pool(), cfg).unwrap();
    let data = payload(1, 1001);
    let mut buf = a.pool().alloc(1001, Wait::No).unwrap();
    buf.copy_from_slice(&data);
    let (mut buf, e) = a.send_to(buf, &b.local_addr()).unwrap_err();
    assert!(matches!(e, UdpError::TooLarge { len: 1001, max: 1000 }), "{e:?}");
    assert!(e.to_string().contains("max_datagram"), "{e}");
    assert!(buf[..] == data[..], "the buffer came back unchanged");
    // The same buffer, trimmed to the limit, goes through.
    buf.set_len(1000);
    a.send_to(buf, &b.local_addr()).unwrap();
    let (d, _) = expect(&b, "trimmed");
    assert!(*d == data[..1000]);
    assert_eq!(d.seq(), 0, "the refused send took no sequence number");
    drop(d);
    assert_pool_idle(&a);
    assert_pool_idle(&b);
}

#[test]
fn hostile_bytes_are_dropped_and_counted() {
    let rx = unicast();
    let raw = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let good = Header::new(FrameKind::Data, 0, 0, 3).encode();
    let mut junk: Vec<Vec<u8>> = vec![
        vec![],
        vec![0x5A],
        good[..15].to_vec(),
        good.to_vec(),                                             // announces 3 bytes, has 0
        [&good[..], b"ab"].concat(),                               // announces 3, has 2
        [&good[..], b"abcd"].concat(),                             // announces 3, has 4
        Header::new(FrameKind::Credit, 5, 0, 0).encode().to_vec(), // not a datagram kind
        [&Header::new(FrameKind::Control, 0, 0, 1).encode()[..], b"x"].concat(),
        Header::new(FrameKind::Data, 0, 0, u64::MAX).encode().to_vec(), // absurd length
        [&good[..1], &[0x90], &good[2..], b"abc"].concat(),             // bad version
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
    ];
    let mut r = random() | 1;
    for _ in 0..200 {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        let len = (r % 300) as usize;
        let mut d: Vec<u8> = (0..len).map(|k| (r >> (k % 56)) as u8 ^ k as u8).collect();
        if let Some(b0) = d.first_mut() {
            if *b0 == 0x5A {
                *b0 = 0; // Keep it junk for sure.
            }
        }
        junk.push(d);
    }
    // In small batches, each drained before the next: a burst of hundreds of
    // datagrams could overflow a small SO_RCVBUF, and the kernel would drop
    // them before zerocast ever saw them.
    for (n, batch) in junk.chunks(16).enumerate() {
        for d in batch {
            raw.send_to(d, rx.local_addr()).unwrap();
        }
        let sent = (n * 16 + batch.len()) as u64;
        let deadline = Instant::now() + WAIT;
        while rx.stats().dropped_malformed < sent {
            assert!(matches!(rx.try_recv_from(), Err(RecvError::Empty)), "junk was taken as a datagram");
            assert!(Instant::now() < deadline, "only {:?} of {sent} junk datagrams seen", rx.stats());
            std::thread::yield_now();
        }
    }
    let tx = unicast();
    send(&tx, b"still here", rx.local_addr());
    let (d, from) = expect(&rx, "the good datagram after the junk");
    assert_eq!((&*d, d.seq(), from), (&b"still here"[..], 0, tx.local_addr()));
    let st = rx.stats();
    assert_eq!((st.received, st.dropped_malformed), (1, junk.len() as u64));
    assert!(matches!(rx.try_recv_from(), Err(RecvError::Empty)));
    drop(d);
    assert_pool_idle(&rx);
}

#[test]
fn multicast_two_receivers_in_one_process() {
    const N: usize = 32;
    let (group, r1) = fresh_group();
    let r2 = member(group).unwrap();
    let tx = unicast();
    for i in 0..N {
        send(&tx, &payload(i, 100 + i), group);
    }
    for (name, r) in [("first member", &r1), ("second member", &r2)] {
        let mut seqs = Vec::new();
        for _ in 0..N {
            let (d, from) = expect(r, name);
            let i = d.seq() as usize;
            assert!(*d == payload(i, 100 + i)[..], "{name}: datagram {i} differs");
            assert_eq!(from, tx.local_addr());
            seqs.push(i);
        }
        seqs.sort_unstable();
        assert_eq!(seqs, (0..N).collect::<Vec<_>>(), "{name}");
        assert_eq!(r.stats().received, N as u64);
        assert_pool_idle(r);
    }
}

#[test]
fn multicast_across_processes() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        return child_receiver(&spec);
    }
    const N: usize = 20;
    let (group, mine) = fresh_group();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "multicast_across_processes", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, format!("{group}:{N}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let (lines_tx, lines) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            // The harness may print "test … ... " on the same line first.
            if let Some((_, l)) = line.split_once("ZC-CHILD ") {
                if lines_tx.send(l.to_owned()).is_err() {
                    break;
                }
            }
        }
    });
    let next = |what: &str, child: &mut std::process::Child| match lines.recv_timeout(Duration::from_secs(10))
    {
        Ok(l) => l,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("child receiver said nothing while {what} ({e}); it may have failed to start or join");
        }
    };
    let ready = next("joining", &mut child);
    assert_eq!(ready, "READY", "child: {ready}");

    let tx = unicast();
    for i in 0..N {
        send(&tx, &payload(i, 200 + i), group);
    }
    let mut mine_got: Vec<usize> = (0..N).map(|_| expect(&mine, "parent member").0.seq() as usize).collect();
    mine_got.sort_unstable();
    assert_eq!(mine_got, (0..N).collect::<Vec<_>>());

    let mut child_got = Vec::new();
    loop {
        let l = next("receiving", &mut child);
        let f: Vec<&str> = l.split(' ').collect();
        match f[..] {
            ["GOT", seq, ok] => {
                assert_eq!(ok, "ok", "child: datagram {seq} differs");
                child_got.push(seq.parse::<usize>().unwrap());
            }
            ["DONE", n] => {
                assert_eq!(n.parse::<usize>().unwrap(), child_got.len());
                break;
            }
            _ => {
                let _ = child.kill();
                panic!("child: {l}");
            }
        }
    }
    assert!(child.wait().unwrap().success(), "child receiver failed");
    child_got.sort_unstable();
    assert_eq!(child_got, (0..N).collect::<Vec<_>>(), "the other process missed datagrams");
}

/// The child side of `multicast_across_processes`: join, say so, report
/// what arrives.
fn child_receiver(spec: &str) {
    let (group, n) = spec.rsplit_once(':').unwrap();
    let (group, n): (SocketAddr, usize) = (group.parse().unwrap(), n.parse().unwrap());
    let s = member(group).unwrap();
    println!("ZC-CHILD READY");
    let deadline = Instant::now() + Duration::from_secs(8);
    let mut got = 0;
    while got < n {
        match s.recv_from(Some(deadline)) {
            Ok((d, _)) => {
                let i = d.seq() as usize;
                let ok = *d == payload(i, 200 + i)[..];
                println!("ZC-CHILD GOT {i} {}", if ok { "ok" } else { "bad" });
                got += 1;
            }
            Err(e) => {
                println!("ZC-CHILD ERR {e}");
                break;
            }
        }
    }
    println!("ZC-CHILD DONE {got}");
}

#[test]
fn leave_stops_delivery_and_join_resumes_it() {
    let (group, r1) = fresh_group();
    let r2 = member(group).unwrap();
    let tx = unicast();
    send(&tx, b"zero", group);
    assert_eq!(&*expect(&r1, "r1 before leave").0, b"zero");
    assert_eq!(&*expect(&r2, "r2 before leave").0, b"zero");

    r1.leave(&group).unwrap();
    send(&tx, b"one", group);
    assert_eq!(&*expect(&r2, "r2 after r1 left").0, b"one");
    assert_quiet(&r1, "r1 left the group but still receives");

    r1.join(&group).unwrap();
    send(&tx, b"two", group);
    assert_eq!(&*expect(&r1, "r1 after joining again").0, b"two");
    assert_eq!(&*expect(&r2, "r2").0, b"two");
}

#[test]
fn any_socket_can_join_a_group() {
    // A unicast socket on a wildcard address and an OS-picked port joins a
    // group; datagrams to group:that_port arrive, on loopback.
    let (group, _first) = fresh_group();
    let s = UdpSocket::bind(&ep("ud://0.0.0.0:0"), pool(), UdpConfig::default()).unwrap();
    let to = SocketAddr::new(group.ip(), s.local_addr().port());
    s.join(&to).unwrap();
    let tx = unicast();
    send(&tx, b"to the group", to);
    let (d, _) =
        s.recv_from(Some(Instant::now() + WAIT)).expect("the joined unicast socket received nothing");
    assert_eq!(&*d, b"to the group");
    s.leave(&to).unwrap();
    send(&tx, b"after leave", to);
    assert_quiet(&s, "left, yet received");
}

#[test]
fn hostile_bytes_to_a_group_are_dropped() {
    let (group, r) = fresh_group();
    let raw = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    socket2::SockRef::from(&raw).set_multicast_if_v4(&Ipv4Addr::LOCALHOST).unwrap();
    for d in [&b""[..], b"junk", &[0x5A; 40]] {
        raw.send_to(d, group).unwrap();
    }
    let tx = unicast();
    send(&tx, b"good", group);
    assert_eq!(&*expect(&r, "the good datagram").0, b"good");
    assert_eq!(r.stats().dropped_malformed, 3);
}

#[test]
fn concurrent_receivers_take_turns_without_hanging() {
    let rx = Arc::new(unicast());
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let rx = Arc::clone(&rx);
            std::thread::spawn(move || rx.recv_from(Some(Instant::now() + WAIT)).map(|(d, _)| d.to_vec()))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(50));
    let tx = unicast();
    send(&tx, b"a", rx.local_addr());
    send(&tx, b"b", rx.local_addr());
    let mut got: Vec<Vec<u8>> = threads.into_iter().map(|t| t.join().unwrap().unwrap()).collect();
    got.sort();
    assert_eq!(got, [b"a".to_vec(), b"b".to_vec()]);
    // A short deadline is honoured even while another thread holds the turn.
    let rx2 = Arc::clone(&rx);
    let long =
        std::thread::spawn(move || rx2.recv_from(Some(Instant::now() + Duration::from_millis(500))).is_err());
    std::thread::sleep(Duration::from_millis(50));
    let start = Instant::now();
    assert!(matches!(rx.recv_from(Some(start + Duration::from_millis(50))), Err(RecvError::Timeout)));
    assert!(start.elapsed() < Duration::from_millis(400), "{:?}", start.elapsed());
    assert!(matches!(rx.try_recv_from(), Err(RecvError::Empty)));
    assert!(long.join().unwrap());
}

#[test]
fn received_buffers_are_held_until_dropped() {
    let (a, b) = (unicast(), unicast());
    for i in 0..10 {
        send(&a, &payload(i, 1000), b.local_addr());
    }
    let held: Vec<_> = (0..10).map(|_| expect(&b, "held").0).collect();
    assert_eq!(b.pool().stats().buffers_in_use, 10);
    drop(held);
    assert_pool_idle(&b);
    // The pool outlives the socket and gets everything back.
    let p = b.pool().clone();
    send(&a, b"last", b.local_addr());
    let (d, _) = expect(&b, "last");
    drop(b);
    assert_eq!(p.stats().buffers_in_use, 1);
    drop(d);
    assert_eq!(p.stats().buffers_in_use, 0);
}

#[test]
fn bad_endpoints_are_typed_errors() {
    let bad = |r: Result<UdpSocket, UdpError>| match r {
        Err(e @ UdpError::BadEndpoint { .. }) => e.to_string(),
        other => panic!("expected BadEndpoint, got {other:?}"),
    };
    let m = bad(UdpSocket::multicast(&ep("mcast://10.1.1.1:5000"), pool(), UdpConfig::default()));
    assert!(m.contains("not a multicast group"), "{m}");
    let m = bad(UdpSocket::bind(&ep("mcast://239.1.1.1:5000"), pool(), UdpConfig::default()));
    assert!(m.contains("ud://host:port"), "{m}");
    // An interface that is no local address: the join says what to check.
    let r = random();
    let ip = Ipv4Addr::new(239, 200, (r >> 8) as u8, 1 + (r % 250) as u8);
    let port = 20_000 + ((r >> 16) % 40_000) as u16;
    let e = UdpSocket::multicast(
        &ep(&format!("mcast://{ip}:{port}?iface=192.0.2.123")),
        pool(),
        UdpConfig::default(),
    )
    .unwrap_err();
    assert!(matches!(e, UdpError::Join { .. }), "{e:?}");
    assert!(e.to_string().contains("is multicast enabled on that interface"), "{e}");
    // A pool too small for the configured datagrams is refused up front.
    let small =
        Pool::unregistered(PoolConfig::default().with_classes([512]).with_max_bytes(8 << 20)).unwrap();
    let e = UdpSocket::bind(&ep("ud://127.0.0.1:0"), small, UdpConfig::default()).unwrap_err();
    assert!(matches!(e, UdpError::Config(_)), "{e:?}");
}

#[test]
fn ipv6_group_membership_on_loopback() {
    // IPv6 multicast *delivery* over lo needs a route Linux does not set up;
    // membership (IPV6_JOIN_GROUP with an interface index) works.
    let Ok(index) = std::fs::read_to_string("/sys/class/net/lo/ifindex") else {
        eprintln!("skipped: no /sys/class/net/lo/ifindex");
        return;
    };
    let index: u32 = index.trim().parse().unwrap();
    let r = random();
    let group = format!("ff15::{:x}:{:x}", (r >> 16) as u16, r as u16 | 1);
    let port = 20_000 + ((r >> 32) % 40_000) as u16;
    let s = match UdpSocket::multicast(
        &ep(&format!("mcast://[{group}]:{port}?iface={index}")),
        pool(),
        UdpConfig::default(),
    ) {
        Ok(s) => s,
        Err(UdpError::Bind { source, .. }) => {
            eprintln!("skipped: no IPv6 here ({source})");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let g = s.local_addr();
    assert_eq!(g.ip(), group.parse::<IpAddr>().unwrap());
    s.leave(&g).unwrap();
    s.join(&g).unwrap();
    assert!(matches!(s.join(&"239.1.1.1:1".parse().unwrap()), Err(UdpError::FamilyMismatch { .. })));
}
