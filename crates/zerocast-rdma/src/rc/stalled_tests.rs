//! Stalled and hostile peers at an RC listener (guest only).
//!
//! `rc://`: peers that send a connect request with a valid hello and never
//! finish. They connect without a QP, so rdma_cm hands them the
//! listener's answer and waits for them to call `rdma_establish`, which
//! they never do: the listener's side never sees ESTABLISHED.
//!
//! `rc+oob://`: peers that connect the side channel and send one byte of
//! their record, then wait; and peers that send a whole record of junk.
//!
//! Meanwhile good clients connect and exchange a first message. Each must
//! get through in a small fraction of the handshake deadline (10 s), where
//! a listener that ran handshakes one at a time would hold each of them
//! behind every stalled peer before it.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::ptr;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rdma_sys::rdma_cm_event_type as ev;
use zerocast_core::{Connection as _, Endpoint, Listener as _, Transport as _};
use zerocast_mem::PoolConfig;

use super::guest_test_util::addr;
use super::oob::INFO_LEN;
use super::{RcConfig, RcListener, RcTransport};
use crate::cm::{CmId, EventChannel};

/// Good clients, one after another, each timed from connect to reply.
const GOOD: usize = 20;
/// The most a good client may take. The handshake deadline is 10 s: a
/// good client held behind even one stalled handshake would take longer.
const BOUND: Duration = Duration::from_secs(3);

fn soon(secs: u64) -> Instant {
    Instant::now() + Duration::from_secs(secs)
}

/// The listener's transport: small receive windows and buffers, so every
/// stalled `rc://` handshake, which holds a QP with its receives posted,
/// costs little registered memory (the subject here is time, not memory).
fn listener_transport() -> RcTransport {
    let link = zerocast_core::LinkConfig::default().with_recv_window(8);
    let cfg = RcConfig::default().with_link(link).with_eager_limit(4096);
    RcTransport::new(cfg, PoolConfig::default()).expect("RC transport")
}

/// Raise the soft limit on open files to the hard one: each stalled peer
/// holds a descriptor or two.
fn raise_nofile() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: valid out-pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: valid limits, read just above.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    }
}

/// The listener echoes: it accepts on its own thread, and each accepted
/// connection sends its first message back.
fn serve(listener: RcListener) -> thread::JoinHandle<usize> {
    thread::spawn(move || {
        let mut served = 0;
        let mut conns = Vec::new();
        while let Ok(conn) = listener.accept() {
            let msg = conn.recv(Some(soon(20))).expect("first message");
            let mut back = conn.alloc(msg.len(), Some(soon(20))).expect("alloc");
            back.copy_from_slice(&msg);
            drop(msg);
            conn.send(back, Some(soon(20))).map_err(|e| e.to_string()).expect("echo");
            conns.push(conn);
            served += 1;
            if served == GOOD {
                break;
            }
        }
        let stats = listener.stats();
        assert_eq!(stats.accepted, GOOD as u64, "only the good clients were accepted: {stats:?}");
        served
    })
}

/// `GOOD` clients, one after another; each one's time from connect to its
/// echo.
fn good_clients(uri: &str) -> Vec<Duration> {
    let t = RcTransport::new(RcConfig::default(), PoolConfig::default()).expect("client transport");
    let ep = Endpoint::parse(uri).expect("endpoint");
    (0..GOOD)
        .map(|i| {
            let start = Instant::now();
            let conn = t.connect(&ep).expect("good client connects");
            let mut msg = conn.alloc(8, Some(soon(10))).expect("alloc");
            msg.copy_from_slice(&(i as u64).to_le_bytes());
            conn.send(msg, Some(soon(10))).map_err(|e| e.to_string()).expect("send");
            let back = conn.recv(Some(soon(10))).expect("echo");
            assert_eq!(&back[..], &(i as u64).to_le_bytes());
            start.elapsed()
        })
        .collect()
}

fn check(times: &[Duration], stalled: usize) {
    let worst = times.iter().max().copied().unwrap_or_default();
    eprintln!("{stalled} stalled peers: {GOOD} good clients, slowest {worst:?}, all {times:?}");
    assert!(worst < BOUND, "a good client took {worst:?} behind {stalled} stalled peers: {times:?}");
}

/// An `rc://` peer that asks to connect, with a valid hello, and never
/// finishes: its id and channel must stay alive for the stall to last.
fn stalled_cm_peer(to: SocketAddr, hello: &[u8], qpn: u32) -> (CmId, Arc<EventChannel>) {
    let ch = EventChannel::new().expect("event channel");
    let id = CmId::new(&ch).expect("cm id");
    let dst = CmId::sockaddr(to);
    let wait = |want: ev::Type| {
        let e = ch.get(Some(Duration::from_secs(10))).expect("event").expect("an event in time");
        assert_eq!(e.kind(), want, "{}", e.name());
    };
    // SAFETY: live id; `dst` is valid for the call.
    let rc =
        unsafe { rdma_sys::rdma_resolve_addr(id.as_ptr(), ptr::null_mut(), dst.as_ptr() as *mut _, 5000) };
    assert_eq!(rc, 0, "rdma_resolve_addr");
    wait(ev::RDMA_CM_EVENT_ADDR_RESOLVED);
    // SAFETY: live id with a resolved address.
    assert_eq!(unsafe { rdma_sys::rdma_resolve_route(id.as_ptr(), 5000) }, 0);
    wait(ev::RDMA_CM_EVENT_ROUTE_RESOLVED);
    // SAFETY: all-zero is a valid `rdma_conn_param`.
    let mut p: rdma_sys::rdma_conn_param = unsafe { std::mem::zeroed() };
    p.private_data = hello.as_ptr().cast();
    p.private_data_len = hello.len() as u8;
    p.responder_resources = 1;
    p.initiator_depth = 1;
    p.retry_count = 7;
    p.rnr_retry_count = 7;
    // No QP on the id: rdma_cm takes this number for the request and
    // leaves the rest of the handshake to us. Each peer's is its own (the
    // listener's CM takes a repeated QP number for a stale connection),
    // and far from the device's own.
    p.qp_num = qpn;
    // SAFETY: live id with a resolved route; `p` and `hello` outlive the call.
    assert_eq!(unsafe { rdma_sys::rdma_connect(id.as_ptr(), &mut p) }, 0, "rdma_connect");
    (id, ch)
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn stalled_rdma_cm_peers_do_not_delay_good_clients() {
    const STALLED: usize = 100;
    raise_nofile();
    let t = listener_transport();
    let listener = t.listen(&Endpoint::parse(&format!("rc://{}:0", addr())).unwrap()).expect("listen");
    let uri = listener.local_endpoint().to_string();
    let to: SocketAddr = listener.local_endpoint().authority().parse().expect("address");
    let server = serve(listener);
    let hello = zerocast_link::hello_for(&zerocast_core::LinkConfig::default(), 65536).encode();
    let stalled: Vec<_> = (0..STALLED).map(|i| stalled_cm_peer(to, &hello, 0x80_0000 + i as u32)).collect();
    // Every stalled request got the listener's answer: each is now a
    // handshake waiting for an ESTABLISHED that never comes.
    for (_, ch) in &stalled {
        let e = ch.get(Some(Duration::from_secs(20))).expect("event").expect("the listener's answer");
        assert_eq!(e.kind(), ev::RDMA_CM_EVENT_CONNECT_RESPONSE, "{}", e.name());
    }
    let times = good_clients(&uri);
    assert_eq!(server.join().expect("server"), GOOD);
    check(&times, STALLED);
    drop(stalled);
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn stalled_and_junk_side_channel_peers_do_not_delay_good_clients() {
    const STALLED: usize = 500;
    const JUNK: usize = 500;
    raise_nofile();
    let t = listener_transport();
    let listener = t.listen(&Endpoint::parse(&format!("rc+oob://{}:0", addr())).unwrap()).expect("listen");
    let uri = listener.local_endpoint().to_string();
    let to: SocketAddr = listener.local_endpoint().authority().parse().expect("address");
    let server = serve(listener);
    let stalled: Vec<_> = (0..STALLED)
        .map(|_| {
            let mut s = TcpStream::connect(to).expect("stalled peer connects");
            s.write_all(b"Z").expect("one byte");
            s
        })
        .collect();
    let junk = thread::spawn(move || {
        for i in 0..JUNK {
            if let Ok(mut s) = TcpStream::connect(to) {
                let _ = s.write_all(&[i as u8; INFO_LEN]);
            }
        }
    });
    let times = good_clients(&uri);
    junk.join().expect("junk peers");
    assert_eq!(server.join().expect("server"), GOOD);
    check(&times, STALLED);
    drop(stalled);
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").expect("/proc/self/task").count()
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn a_nonblocking_side_channel_connect_to_a_stalled_or_junk_listener_fails_by_its_deadline_on_no_thread() {
    const PEERS: usize = 100;
    const DEADLINE: Duration = Duration::from_millis(1500);
    raise_nofile();
    // Listeners that accept and then say nothing, or say junk.
    let silent = std::net::TcpListener::bind(format!("{}:0", addr())).expect("silent listener");
    let junk = std::net::TcpListener::bind(format!("{}:0", addr())).expect("junk listener");
    let junk_at = junk.local_addr().expect("address");
    let answering = thread::spawn(move || {
        let mut held = Vec::new();
        for s in junk.incoming().take(PEERS) {
            let mut s = s.expect("accept");
            let _ = s.write_all(&[0x5a; INFO_LEN + 1]);
            held.push(s);
        }
        held
    });
    let cfg = RcConfig { connect_timeout: DEADLINE, ..RcConfig::default() };
    let t = RcTransport::new(cfg, PoolConfig::default()).expect("client transport");
    let ep = |at: SocketAddr| Endpoint::parse(&format!("rc+oob://{at}")).expect("endpoint");
    let silent_at = silent.local_addr().expect("address");
    // One first, so that the engines' threads exist before the count.
    let first = t.connect_nonblocking_to(&ep(silent_at), silent_at).expect("started");
    let before = threads();
    let start = Instant::now();
    let mut pending: Vec<_> = (0..PEERS)
        .flat_map(|_| {
            [
                t.connect_nonblocking_to(&ep(silent_at), silent_at).expect("started"),
                t.connect_nonblocking_to(&ep(junk_at), junk_at).expect("started"),
            ]
        })
        .collect();
    let after = threads();
    assert!(after <= before, "connecting took threads: {before} before, {after} after");
    pending.push(first);
    let (mut timed_out, mut refused) = (0, 0);
    for c in pending {
        let ended =
            crate::cm::wait_until(c, Instant::now() + DEADLINE * 10).expect("the attempt ended in time");
        match ended.expect("the engine ended the attempt") {
            Ok(_) => panic!("connected to a listener that never answered"),
            Err(e) if e.kind() == zerocast_core::ErrorKind::Timeout => timed_out += 1,
            Err(e) => {
                assert!(
                    matches!(e, zerocast_core::ConnectError::Handshake { .. }),
                    "a junk answer is a handshake error: {e:?}"
                );
                refused += 1;
            }
        }
    }
    let took = start.elapsed();
    eprintln!("{timed_out} timed out, {refused} refused as junk, in {took:?}");
    assert_eq!((timed_out, refused), (PEERS + 1, PEERS));
    assert!(took < DEADLINE * 4, "the attempts ran one after another: {took:?}");
    drop(answering.join().expect("junk listener"));
    drop(silent);
}
