//! Unit tests that need a socket: loopback only, short deadlines.

use std::time::{Duration, Instant};

use zerocast_core::{Endpoint, RecvError, HEADER_LEN};
use zerocast_mem::{Pool, PoolConfig, Wait};

use super::*;

fn pool() -> Pool {
    Pool::unregistered(PoolConfig::default().with_max_bytes(32 << 20)).unwrap()
}

fn socket(cfg: UdpConfig) -> UdpSocket {
    UdpSocket::bind(&Endpoint::parse("ud://127.0.0.1:0").unwrap(), pool(), cfg).unwrap()
}

fn soon(ms: u64) -> Option<Instant> {
    Some(Instant::now() + Duration::from_millis(ms))
}

#[test]
fn config_is_checked_against_the_pool() {
    let small =
        Pool::unregistered(PoolConfig::default().with_classes([512, 8192]).with_max_bytes(8 << 20)).unwrap();
    let msg = match UdpConfig::default().validate(&small) {
        Err(UdpError::Config(m)) => m,
        other => panic!("{other:?}"),
    };
    assert!(msg.contains("PoolConfig::classes") && msg.contains("lower max_datagram to 8175"), "{msg}");
    UdpConfig::default().with_max_datagram(8175).validate(&small).unwrap();
    assert!(UdpConfig::default().with_max_datagram(8176).validate(&small).is_err());
    assert!(UdpConfig::default().with_max_datagram(0).validate(&small).is_err());
    assert!(UdpConfig::default().with_max_datagram(MAX_DATAGRAM + 1).validate(&pool()).is_err());
    let ttl = UdpConfig { multicast_ttl: 256, ..UdpConfig::default() };
    assert!(matches!(ttl.validate(&pool()), Err(UdpError::Config(_))));
    UdpConfig::default().validate(&pool()).unwrap();
}

#[test]
fn empty_socket_try_recv_and_timeout() {
    let s = socket(UdpConfig::default());
    assert!(matches!(s.try_recv_from(), Err(RecvError::Empty)));
    let start = Instant::now();
    assert!(matches!(s.recv_from(soon(60)), Err(RecvError::Timeout)));
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(60) && took < Duration::from_secs(2), "{took:?}");
    assert!(matches!(s.recv_from(Some(Instant::now())), Err(RecvError::Timeout)));
    assert_eq!(s.pool().stats().buffers_in_use, 0);
}

#[test]
fn round_trip_and_seq_and_stats() {
    let a = socket(UdpConfig::default());
    let b = socket(UdpConfig::default());
    for (i, msg) in [&b"one"[..], b"", b"three"].into_iter().enumerate() {
        let mut buf = a.alloc(msg.len(), None).unwrap();
        buf.copy_from_slice(msg);
        a.send_to(buf, &b.local_addr()).unwrap();
        let (d, from) = b.recv_from(soon(2000)).unwrap();
        assert_eq!((&*d, d.seq(), from), (msg, i as u32, a.local_addr()));
        assert_eq!(d.buf().len(), HEADER_LEN + msg.len());
    }
    // try_recv_from sees a queued datagram, and the socket blocks again after.
    let buf = a.alloc(4, None).unwrap();
    a.send_to(buf, &b.local_addr()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    let d = loop {
        match b.try_recv_from() {
            Ok((d, _)) => break d,
            Err(RecvError::Empty) if Instant::now() < deadline => std::thread::yield_now(),
            Err(e) => panic!("{e:?}"),
        }
    };
    assert_eq!(d.seq(), 3);
    drop(d);
    assert!(matches!(b.recv_from(soon(30)), Err(RecvError::Timeout)));
    assert_eq!(a.stats(), UdpStats { sent: 4, ..UdpStats::default() });
    assert_eq!(b.stats(), UdpStats { received: 4, sources_tracked: 1, ..UdpStats::default() });
    assert!(format!("{b:?}").contains("received: 4"));
    assert_eq!(b.pool().stats().buffers_in_use, 0);
}

#[test]
fn oversize_send_hands_the_buffer_back() {
    let s = socket(UdpConfig::default().with_max_datagram(100));
    let mut buf = s.pool().alloc(101, Wait::No).unwrap();
    buf.fill(7);
    let (buf, e) = s.send_to(buf, &s.local_addr()).unwrap_err();
    assert!(matches!(e, UdpError::TooLarge { len: 101, max: 100 }), "{e:?}");
    assert_eq!((buf.len(), buf[100]), (101, 7));
    assert_eq!(s.stats().sent, 0);
}

#[test]
fn datagram_too_long_for_this_receiver_is_dropped() {
    let big = socket(UdpConfig::default());
    let small = socket(UdpConfig::default().with_max_datagram(100));
    for len in [101, 5000, 100] {
        let buf = big.alloc(len, None).unwrap();
        big.send_to(buf, &small.local_addr()).unwrap();
    }
    let (d, _) = small.recv_from(soon(2000)).unwrap();
    assert_eq!((d.len(), d.seq()), (100, 2));
    assert_eq!(small.stats().dropped_malformed, 2);
}

#[test]
fn membership_checks() {
    let s = socket(UdpConfig::default());
    let unicast: SocketAddr = "10.0.0.1:1".parse().unwrap();
    assert!(matches!(s.join(&unicast), Err(UdpError::NotMulticast(_))));
    let v6: SocketAddr = "[ff15::1]:1".parse().unwrap();
    assert!(matches!(s.join(&v6), Err(UdpError::FamilyMismatch { .. })));
    // Leaving a group never joined is the OS's error, with the group named.
    let g: SocketAddr = "239.255.0.1:1".parse().unwrap();
    let e = s.leave(&g).unwrap_err();
    assert!(e.to_string().contains("239.255.0.1"), "{e}");
}

#[test]
fn sequence_numbers_count_per_destination_and_sources_are_tracked() {
    let (a, b, c) =
        (socket(UdpConfig::default()), socket(UdpConfig::default()), socket(UdpConfig::default()));
    let send = |to: &UdpSocket| {
        let buf = a.alloc(1, None).unwrap();
        a.send_to(buf, &to.local_addr()).map_err(|(_, e)| e).unwrap();
    };
    send(&b);
    send(&c);
    send(&b);
    let seqs = |s: &UdpSocket, n: usize| -> Vec<u32> {
        (0..n).map(|_| s.recv_from(soon(2000)).unwrap().0.seq()).collect()
    };
    assert_eq!(seqs(&b, 2), [0, 1]);
    assert_eq!(seqs(&c, 1), [0], "a gap at c would read as loss");
    let st = b.source_stats(&a.local_addr()).unwrap();
    assert_eq!((st.received, st.lost, st.reordered), (2, 0, 0));
    assert_eq!(b.sources().len(), 1);
    assert!(b.source_stats(&c.local_addr()).is_none());
}

#[test]
fn sources_beyond_the_cap_evict_idle_ones_and_are_counted() {
    let rx = socket(UdpConfig::default().with_max_sources(2));
    let senders: Vec<UdpSocket> = (0..4).map(|_| socket(UdpConfig::default())).collect();
    let send = |s: &UdpSocket| {
        let buf = s.alloc(1, None).unwrap();
        s.send_to(buf, &rx.local_addr()).map_err(|(_, e)| e).unwrap();
        rx.recv_from(soon(2000)).unwrap();
    };
    // 0 is seen twice (a second chance); 1 once. 2 evicts 1, 3 evicts 2.
    send(&senders[0]);
    send(&senders[0]);
    send(&senders[1]);
    for s in &senders[2..] {
        send(s);
        send(&senders[0]);
    }
    let st = rx.stats();
    assert_eq!((st.received, st.sources_tracked, st.sources_evicted), (7, 2, 2));
    assert_eq!(rx.sources().len(), 2);
    let kept = rx.source_stats(&senders[0].local_addr()).expect("the active source is kept");
    assert_eq!((kept.received, kept.lost, kept.duplicates), (4, 0, 0));
    assert!(rx.source_stats(&senders[1].local_addr()).is_none());
    assert!(rx.source_stats(&senders[3].local_addr()).is_some());
    let zero = UdpConfig::default().with_max_sources(0);
    assert!(matches!(zero.validate(&pool()), Err(UdpError::Config(_))));
}
