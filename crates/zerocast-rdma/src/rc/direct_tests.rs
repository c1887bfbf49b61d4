//! A connection its application reads directly, watched the way an async
//! runtime's reactor watches it: its engine's completion channel in an
//! edge-triggered epoll set, dispatched on each readiness (guest only).
//!
//! The client's transport has the only CQ on its channel, so every wake is
//! one the dispatch takes ahead of its event ([`super::comp_hub`]): the
//! test checks that no wake is lost and that the events owed are taken,
//! not left to pile up in the channel.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use zerocast_core::RecvError;
use zerocast_core::{Connection as _, Endpoint, Listener as _, Transport as _};
use zerocast_link::{Notify, SharedSource};
use zerocast_mem::PoolConfig;

use super::guest_test_util::addr;
use super::{RcConfig, RcTransport};

const ROUNDS: u64 = 2_000;
/// The epoll tokens.
const CHANNEL: u64 = 0;
const TOLD: u64 = 1;

fn soon(secs: u64) -> Instant {
    Instant::now() + Duration::from_secs(secs)
}

/// What the link reports (a message the engine delivered at its timer,
/// the end), as a byte on a socket the waiting loop watches too, as a
/// runtime's task is woken by it.
struct Told(UnixStream);

impl Notify for Told {
    fn notify(&self, _token: usize) {
        let _ = (&self.0).write(&[1]);
    }
}

/// An edge-triggered epoll set.
struct EdgeWatch(libc::c_int);

impl EdgeWatch {
    fn new() -> Self {
        // SAFETY: a plain system call.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(ep >= 0, "epoll_create1");
        Self(ep)
    }

    fn add(&self, fd: libc::c_int, token: u64) {
        let mut ev = libc::epoll_event { events: (libc::EPOLLIN | libc::EPOLLET) as u32, u64: token };
        // SAFETY: live epoll descriptor and a valid event.
        assert_eq!(unsafe { libc::epoll_ctl(self.0, libc::EPOLL_CTL_ADD, fd, &mut ev) }, 0, "epoll_ctl");
    }

    /// The tokens of the edges that came within `ms`.
    fn wait(&self, ms: i32) -> Vec<u64> {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 2];
        // SAFETY: live epoll descriptor, room for two events.
        let n = unsafe { libc::epoll_wait(self.0, evs.as_mut_ptr(), 2, ms) };
        evs[..n.max(0) as usize].iter().map(|e| e.u64).collect()
    }
}

impl Drop for EdgeWatch {
    fn drop(&mut self) {
        // SAFETY: ours, closed once.
        unsafe { libc::close(self.0) };
    }
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn a_directly_read_connection_loses_no_wake_and_takes_every_event_it_was_woken_ahead_for() {
    let server_t = RcTransport::new(RcConfig::default(), PoolConfig::default()).expect("server transport");
    let listener = server_t.listen(&Endpoint::parse(&format!("rc://{}:0", addr())).unwrap()).expect("listen");
    let ep = listener.local_endpoint().clone();
    let echo = thread::spawn(move || {
        let conn = listener.accept().expect("accept");
        let mut echoed = 0u64;
        while let Ok(msg) = conn.recv(Some(soon(30))) {
            let mut back = conn.alloc(msg.len(), Some(soon(10))).expect("alloc");
            back.copy_from_slice(&msg);
            drop(msg);
            conn.send(back, Some(soon(10))).map_err(|e| e.to_string()).expect("echo");
            echoed += 1;
        }
        echoed
    });

    let client_t = RcTransport::new(RcConfig::default(), PoolConfig::default()).expect("client transport");
    let conn = client_t.connect(&ep).expect("connect");
    let link = conn.link();
    let (told, mut heard) = UnixStream::pair().expect("a socket pair");
    heard.set_nonblocking(true).expect("non-blocking");
    assert!(link.read_directly(Arc::new(Told(told)), 0), "an RC connection can be read directly");
    let source: Arc<dyn SharedSource> = link.shared_source().expect("an RC connection's engine channel");
    let watch = EdgeWatch::new();
    watch.add(source.as_fd().as_raw_fd(), CHANNEL);
    watch.add(heard.as_raw_fd(), TOLD);
    let mut edges = 0u64;

    for i in 0..ROUNDS {
        let mut msg = conn.alloc(8 + (i % 200) as usize, Some(soon(10))).expect("alloc");
        msg[..8].copy_from_slice(&i.to_le_bytes());
        conn.send(msg, Some(soon(10))).map_err(|e| e.to_string()).expect("send");
        loop {
            match link.try_recv() {
                Ok(back) => {
                    assert_eq!(back.len(), 8 + (i % 200) as usize);
                    assert_eq!(&back[..8], &i.to_le_bytes(), "round {i}: lost, duplicated or reordered");
                    break;
                }
                Err(RecvError::Empty) => {
                    let woken = watch.wait(10_000);
                    assert!(!woken.is_empty(), "round {i}: no edge within 10 s: a lost wake-up");
                    if woken.contains(&CHANNEL) {
                        edges += 1;
                        source.dispatch();
                    }
                    while heard.read(&mut [0; 64]).is_ok_and(|n| n > 0) {}
                }
                Err(e) => panic!("round {i}: {e}"),
            }
        }
    }
    // The next look finds nothing, and arms the CQ: the CQ takes what it
    // was owed first.
    assert!(matches!(link.try_recv(), Err(RecvError::Empty)));
    // Count what is left in the channel. A CQ that never took what it was owed would leave
    // one per round; a completion that came after the last arming (a
    // credit frame) may leave one.
    let hub = client_t.inner.comp_hubs.lock().unwrap()[0].clone().expect("the engine's channel");
    let mut left = 0;
    while hub.take_one() {
        left += 1;
    }
    assert!(left <= 1, "{left} events were left in the channel after {ROUNDS} rounds ({edges} edges)");
    assert!(edges >= ROUNDS / 2, "the receives waited for edges: {edges} in {ROUNDS} rounds");

    drop(conn);
    assert_eq!(echo.join().expect("echo thread"), ROUNDS);
}
