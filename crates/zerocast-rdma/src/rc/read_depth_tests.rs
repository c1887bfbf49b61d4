//! Rendezvous READs in flight at once, over both connection setups (guest
//! only).
//!
//! Both ends ask for [`READ_DEPTH`] READs at once (within the device's
//! limits), rdma_cm or the side channel carries that, and the receiver
//! then has that many READs in the device's hands while large messages
//! queue, delivering them, and the small frames between them, in order
//! and intact.

use std::thread;
use std::time::{Duration, Instant};

use zerocast_core::{Connection as _, Endpoint, LinkConfig, Listener as _, Transport as _};
use zerocast_mem::PoolConfig;

use super::guest_test_util::{addr, pattern};
use super::rendezvous::READ_DEPTH;
use super::{RcConfig, RcConnection, RcTransport, Resources};

const WAIT: Duration = Duration::from_secs(30);
const MIB: usize = 1 << 20;
/// Messages sent: every other one of 1 MiB (by rendezvous), the others of
/// 100 bytes and up.
const N: u32 = 24;

fn len_of(n: u32) -> usize {
    if n % 2 == 0 {
        MIB
    } else {
        100 + n as usize
    }
}

fn read_depth(conn: &RcConnection) -> u32 {
    conn.resources::<Resources>().expect("RC resources").0.qp().read_depth()
}

fn peak_reads(conn: &RcConnection) -> usize {
    conn.resources::<Resources>().expect("RC resources").0.rendezvous().peak_reads()
}

/// A transport whose receive buffers are 4 KiB, so messages of 1 MiB go
/// by rendezvous.
fn rendezvous_transport() -> RcTransport {
    let link = LinkConfig::default().with_max_payload(2 * MIB as u64);
    let cfg = RcConfig::default().with_eager_limit(4096).with_link(link);
    let pool = PoolConfig::default().with_max_bytes(256 * MIB);
    RcTransport::new(cfg, pool).expect("RC transport")
}

/// The READ depth two zerocast sides on `t`'s device settle on: ours,
/// within the device's limits.
fn device_depth(t: &RcTransport) -> usize {
    let device = t.device().context().attr();
    READ_DEPTH.min(device.max_qp_init_rd_atom as usize).min(device.max_qp_rd_atom as usize).max(1)
}

fn reads_in_flight_and_in_order(scheme: &str) {
    let addr = addr();
    let t = rendezvous_transport();
    let ep = Endpoint::parse(&format!("{scheme}://{addr}:0")).expect("endpoint");
    let listener = t.listen(&ep).expect("listen");
    let at = listener.local_endpoint().clone();
    let t2 = t.clone();
    let client = thread::spawn(move || t2.connect(&at).expect("connect"));
    let server = listener.accept().expect("accept");
    let client = client.join().expect("client");

    let device = t.device().context().attr().clone();
    let want = device_depth(&t);
    println!(
        "{scheme}: device max_qp_rd_atom {}, max_qp_init_rd_atom {}; depths: client {}, server {}",
        device.max_qp_rd_atom,
        device.max_qp_init_rd_atom,
        read_depth(&client),
        read_depth(&server)
    );
    assert_eq!(read_depth(&server) as usize, want, "the server's READ depth");
    assert_eq!(read_depth(&client) as usize, want, "the client's READ depth");

    // Write every message first, then send them all before the server
    // reads any: the requests arrive together, faster than a READ
    // completes, so the server's READs overlap.
    let msgs: Vec<_> = (0..N)
        .map(|n| {
            let mut m = client.alloc(len_of(n), Some(Instant::now() + WAIT)).expect("alloc");
            m[..4].copy_from_slice(&n.to_le_bytes());
            for (i, b) in m[4..].iter_mut().enumerate() {
                *b = pattern(i, n);
            }
            m
        })
        .collect();
    for m in msgs {
        client.send(m, Some(Instant::now() + WAIT)).map_err(|e| e.to_string()).expect("send");
    }
    for n in 0..N {
        let m = server.recv(Some(Instant::now() + WAIT)).unwrap_or_else(|e| panic!("message {n}: {e}"));
        let seed = u32::from_le_bytes(m[..4].try_into().expect("4 bytes"));
        assert_eq!((seed, m.len()), (n, len_of(n)), "lost, reordered or resized");
        assert!(m[4..].iter().enumerate().all(|(i, &b)| b == pattern(i, seed)), "message {n} corrupted");
    }
    let peak = peak_reads(&server);
    println!("{scheme}: {N} messages in order, at most {peak} READs in flight at once");
    assert_eq!(peak, want, "READs in flight at once");
    client.close();
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn rdma_cm_negotiates_the_read_depth_and_the_receiver_reads_that_many_at_once_in_order() {
    reads_in_flight_and_in_order("rc");
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn the_side_channel_carries_the_read_depth_and_the_receiver_reads_that_many_at_once_in_order() {
    reads_in_flight_and_in_order("rc+oob");
}

/// A listener that says it serves no READs (0 responder resources in its
/// rdma_cm answer): rdma_cm gives the connecting QP no READ depth, so it
/// may not issue the READs that bring that peer's large messages. The
/// connect fails with a typed error naming the cause instead; the same
/// transport connects again once the peer serves READs.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn a_peer_that_serves_no_reads_is_refused_at_connect() {
    use std::sync::atomic::Ordering;
    use zerocast_core::{ConnError, ConnectError, ErrorKind, RecvError};

    use super::RcError;

    let addr = addr();
    let peer = RcTransport::new(RcConfig::default(), PoolConfig::default()).expect("RC transport");
    peer.inner.reads_served.store(0, Ordering::Relaxed);
    let ep = Endpoint::parse(&format!("rc://{addr}:0")).expect("endpoint");
    let listener = peer.listen(&ep).expect("listen");
    let at = listener.local_endpoint().clone();
    let us = RcTransport::new(RcConfig::default(), PoolConfig::default()).expect("RC transport");
    let err = us.connect(&at).expect_err("a peer that serves no READs is refused");
    let ConnectError::Handshake { source: ConnError::Transport { kind, source }, .. } = &err else {
        panic!("not a handshake error of the transport: {err:?}")
    };
    assert_eq!(*kind, ErrorKind::Protocol, "the peer's breach: {err:?}");
    assert!(
        matches!(source.downcast_ref::<RcError>(), Some(RcError::NoReads)),
        "the cause is named: {err:?}"
    );

    // The listener goes on: serving READs again, the next connect succeeds.
    peer.inner.reads_served.store(u8::MAX, Ordering::Relaxed);
    let t2 = us.clone();
    let client = thread::spawn(move || {
        let c = t2.connect(&at).map_err(|e| e.to_string())?;
        let mut m = c.alloc(64, Some(Instant::now() + WAIT)).map_err(|e| e.to_string())?;
        m[..4].copy_from_slice(&7u32.to_le_bytes());
        c.send(m, Some(Instant::now() + WAIT)).map_err(|e| e.to_string())?;
        Ok::<_, String>(c)
    });
    let deadline = Instant::now() + WAIT;
    loop {
        let conn = listener.accept_until(Some(deadline)).expect("a connection within the deadline");
        // The refused connect may have reached this listener first: it
        // ends at once (its peer went away); the next one is ours.
        match conn.recv(Some(deadline)) {
            Ok(m) => {
                assert_eq!(&m[..4], &7u32.to_le_bytes(), "the message over the new connection");
                break;
            }
            Err(RecvError::Disconnected | RecvError::Failed(_)) => continue,
            Err(e) => panic!("the new connection's message: {e}"),
        }
    }
    let client = client.join().expect("client thread").expect("connect once the peer serves READs");
    assert!(read_depth(&client) >= 1, "a READ depth of at least one");
}

/// The other way round: a peer whose connect request serves no READs (0
/// responder resources), whose large messages the listener could never
/// read. The listener refuses it, says why in its rejection, and counts a
/// failed handshake; the connect fails with a refusal naming the cause;
/// the same two transports connect once that peer serves READs.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn a_connecting_peer_that_serves_no_reads_is_refused_by_the_listener() {
    use std::sync::atomic::Ordering;
    use zerocast_core::{ConnectError, ErrorKind};

    let addr = addr();
    let server = RcTransport::new(RcConfig::default(), PoolConfig::default()).expect("RC transport");
    let ep = Endpoint::parse(&format!("rc://{addr}:0")).expect("endpoint");
    let listener = server.listen(&ep).expect("listen");
    let at = listener.local_endpoint().clone();
    let peer = RcTransport::new(RcConfig::default(), PoolConfig::default()).expect("RC transport");
    peer.inner.reads_served.store(0, Ordering::Relaxed);
    let err = peer.connect(&at).expect_err("a peer that serves no READs is refused");
    assert!(matches!(err, ConnectError::Refused(_)), "a refusal: {err:?}");
    assert_eq!(err.kind(), ErrorKind::Refused, "{err:?}");
    assert!(err.to_string().contains("serves none"), "the cause is named: {err}");
    let deadline = Instant::now() + WAIT;
    while listener.stats().handshakes_failed == 0 {
        assert!(Instant::now() < deadline, "the listener counts the refused handshake");
        thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(listener.stats().accepted, 0, "nothing accepted");

    // Serving READs again, the same peer connects, and a large message (by
    // rendezvous: the listener READs it) arrives whole.
    peer.inner.reads_served.store(u8::MAX, Ordering::Relaxed);
    let client = thread::spawn(move || {
        let c = peer.connect(&at).map_err(|e| e.to_string())?;
        let mut m = c.alloc(MIB, Some(Instant::now() + WAIT)).map_err(|e| e.to_string())?;
        for (i, b) in m.iter_mut().enumerate() {
            *b = pattern(i, 3);
        }
        c.send(m, Some(Instant::now() + WAIT)).map_err(|e| e.to_string())?;
        Ok::<_, String>(c)
    });
    let conn = listener.accept_until(Some(deadline)).expect("a connection within the deadline");
    let m = conn.recv(Some(deadline)).expect("the large message");
    assert_eq!(m.len(), MIB, "its length");
    assert!(m.iter().enumerate().all(|(i, &b)| b == pattern(i, 3)), "intact");
    let client = client.join().expect("client thread").expect("connect once the peer serves READs");
    assert!(read_depth(&client) >= 1 && read_depth(&conn) >= 1, "READ depths of at least one");
}

/// A connecting peer that serves fewer READs than it issues (1 against
/// the usual depth): rdma_cm hands the listener the request's two depths
/// swapped, its own way round, and the listener must read no deeper than
/// that peer serves while the peer reads as deep as the listener serves.
/// Large messages both ways then arrive whole and in order, with at most
/// that many READs in flight on each side.
///
/// Before the listener read the two depths the right way round, it
/// answered this peer with one READ served and took four to issue.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn the_listener_reads_no_deeper_than_the_connecting_peer_serves() {
    use std::sync::atomic::Ordering;

    let addr = addr();
    let server = rendezvous_transport();
    let ep = Endpoint::parse(&format!("rc://{addr}:0")).expect("endpoint");
    let listener = server.listen(&ep).expect("listen");
    let at = listener.local_endpoint().clone();
    let peer = rendezvous_transport();
    peer.inner.reads_served.store(1, Ordering::Relaxed);
    let client = thread::spawn(move || peer.connect(&at).expect("connect"));
    let server_conn = listener.accept().expect("accept");
    let client = client.join().expect("client");

    let deep = device_depth(&server);
    assert!(deep > 1, "the device allows more than one READ at once ({deep})");
    assert_eq!(read_depth(&server_conn), 1, "the listener reads no deeper than the peer serves");
    assert_eq!(read_depth(&client) as usize, deep, "the peer reads as deep as the listener serves");

    // Every message sent before any is received, so the READs could
    // overlap up to each side's depth.
    let stream = |from: &RcConnection, to: &RcConnection| {
        for n in 0..8u32 {
            let mut m = from.alloc(MIB, Some(Instant::now() + WAIT)).expect("alloc");
            for (i, b) in m.iter_mut().enumerate() {
                *b = pattern(i, n);
            }
            from.send(m, Some(Instant::now() + WAIT)).map_err(|e| e.to_string()).expect("send");
        }
        for n in 0..8u32 {
            let m = to.recv(Some(Instant::now() + WAIT)).unwrap_or_else(|e| panic!("message {n}: {e}"));
            assert_eq!(m.len(), MIB, "message {n}'s length");
            assert!(
                m.iter().enumerate().all(|(i, &b)| b == pattern(i, n)),
                "message {n} lost, reordered or corrupted"
            );
        }
    };
    stream(&client, &server_conn);
    stream(&server_conn, &client);
    let (ours, theirs) = (peak_reads(&server_conn), peak_reads(&client));
    println!("READs in flight at once: listener {ours} (depth 1), peer {theirs} (depth {deep})");
    assert_eq!(ours, 1, "the listener's READs in flight at once");
    // How many of the peer's overlap depends on how fast the listener's
    // requests come; never more than its depth.
    assert!((1..=deep).contains(&theirs), "the peer's READs in flight at once: {theirs}");
    client.close();
}
