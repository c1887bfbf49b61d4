//! The datagram assertions over the async API (`zerocast::tokio`): typed
//! datagrams in order with a reply, a receiving task woken by every
//! arrival (each one sent as it re-arms), receives dropped at random points
//! losing nothing, a socket shared with a receiving thread, and a
//! multicast group joined, left and rejoined. Run
//! over UDP on the host and over RDMA UD in the Soft-RoCE guest, on
//! loopback and paced, where nothing is lost unless a receiver is overrun.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use zerocast::datagram::Backend;
use zerocast::tokio::{DatagramSocket, Zerocast};
use zerocast::RecvError;

use crate::datagram_suite::Tick;

/// Long enough that only a hang reaches it.
const HANG: Duration = Duration::from_secs(30);

/// A datagram backend under the async API.
#[derive(Debug, Clone)]
pub struct AsyncDatagramEnv {
    /// Opens the sockets; its engines run on the test's runtime.
    pub zc: Zerocast,
    /// The interface address sockets bind to and join groups on.
    pub host: String,
    /// The backend the sockets must get.
    pub backend: Backend,
}

impl AsyncDatagramEnv {
    /// Run `test` on a fresh two-worker runtime with sockets at `host`.
    pub fn run<F, Fut>(host: &str, backend: Backend, test: F)
    where
        F: FnOnce(AsyncDatagramEnv) -> Fut,
        Fut: Future<Output = ()>,
    {
        crate::async_suite::run_async(|| async {
            test(AsyncDatagramEnv { zc: Zerocast::new(), host: host.to_owned(), backend }).await;
        });
    }

    /// A unicast socket on the interface, port picked.
    pub async fn bind(&self) -> DatagramSocket {
        let s = self.zc.bind_datagram(&format!("ud://{}:0", self.host)).await.expect("bind ud://");
        assert_eq!(s.backend(), self.backend, "the datagram backend chosen");
        s
    }

    /// A member of `group`.
    pub async fn member(&self, group: SocketAddr) -> DatagramSocket {
        let uri = format!("mcast://{group}?iface={}", self.host);
        let s = self.zc.bind_datagram(&uri).await.expect("bind mcast://");
        assert_eq!(s.backend(), self.backend, "the datagram backend chosen");
        s
    }
}

async fn send(s: &DatagramSocket, to: &SocketAddr, bytes: &[u8]) {
    let mut b = s.alloc(bytes.len()).await.expect("alloc");
    b.copy_from_slice(bytes);
    s.send_to(b, to).await.map_err(|(_, e)| e).expect("send");
}

fn tick(i: u64) -> Tick {
    Tick { n: i, note: "x".repeat((i % 200) as usize) }
}

/// `n` typed datagrams arrive in order, the receiving task's reply reaches
/// the sender; the sender stays at most 64 ahead.
pub async fn unicast_typed(env: AsyncDatagramEnv, n: u64) {
    let (a, b) = (env.bind().await, env.bind().await);
    let (a_at, b_at) = (a.local_addr(), b.local_addr());
    let (tx, a_rx) = a.typed::<Tick, String>();
    let (reply_tx, rx) = b.typed::<String, Tick>();
    let got = Arc::new(AtomicU64::new(0));
    let counter = got.clone();
    let receiver = tokio::spawn(async move {
        let mut from = None;
        for i in 0..n {
            let (t, f) = rx.recv_timeout(HANG).await.expect("typed datagram");
            assert_eq!(t, tick(i), "in order on loopback");
            from = Some(f);
            counter.fetch_add(1, Ordering::Relaxed);
        }
        let from = from.expect("a source");
        reply_tx.send_to(&format!("got {n}"), &from).await.expect("reply");
        from
    });
    for i in 0..n {
        while i >= got.load(Ordering::Relaxed) + 64 {
            tokio::task::yield_now().await;
        }
        tx.send_to(&tick(i), &b_at).await.expect("typed send");
    }
    assert_eq!(receiver.await.expect("receiver"), a_at, "the source is the sender's address");
    let (reply, from) = a_rx.recv_timeout(HANG).await.expect("reply");
    assert_eq!((reply, from), (format!("got {n}"), b_at));
}

/// Lost wake-ups: `rounds` datagrams each way, one at a time, each sent as
/// the other side's receiving task has just found its socket empty and
/// armed it. A lost wake-up stops the exchange; the timeout says so.
pub async fn ping_pong_wakes_every_time(env: AsyncDatagramEnv, rounds: u64) {
    let (a, b) = (env.bind().await, env.bind().await);
    let (a_at, b_at) = (a.local_addr(), b.local_addr());
    let echo = tokio::spawn(async move {
        for i in 0..rounds {
            let (d, from) = b.recv_timeout(HANG).await.unwrap_or_else(|e| panic!("round {i}: {e}"));
            assert_eq!(u64::from_le_bytes(d[..8].try_into().expect("8 bytes")), i);
            assert_eq!(from, a_at);
            send(&b, &from, &d).await;
        }
    });
    for i in 0..rounds {
        send(&a, &b_at, &i.to_le_bytes()).await;
        let (d, _) = a.recv_timeout(HANG).await.unwrap_or_else(|e| panic!("round {i}: no echo: {e}"));
        assert_eq!(u64::from_le_bytes(d[..8].try_into().expect("8 bytes")), i);
    }
    echo.await.expect("echo");
}

/// A socket that a thread receives on too: while the thread's blocking
/// receive holds the socket's receive side, a task's receive waits to be
/// woken when the thread is done (a handful of polls, not a spin), and
/// then takes the next datagram.
pub async fn shared_with_a_receiving_thread(env: AsyncDatagramEnv) {
    const HOLD: Duration = Duration::from_millis(400);
    let (rx, tx) = (Arc::new(env.bind().await), env.bind().await);
    let at = rx.local_addr();
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let held = Arc::clone(&rx);
    let thread = std::thread::spawn(move || {
        entered_tx.send(()).expect("the test waits");
        // Nothing is sent while it waits: it times out, having held the
        // receive side all along.
        held.as_blocking().recv_from(Some(std::time::Instant::now() + HOLD)).map(drop)
    });
    entered.recv().expect("the thread started");
    // Let the thread's receive take the socket before the task's first
    // look (if it has not, the task waits on the socket instead, and the
    // poll count below holds all the same).
    tokio::time::sleep(Duration::from_millis(50)).await;
    let polls = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&polls);
    let task_rx = Arc::clone(&rx);
    let task = tokio::spawn(async move {
        let mut recv = std::pin::pin!(task_rx.recv_timeout(HANG));
        std::future::poll_fn(|cx| {
            counted.fetch_add(1, Ordering::SeqCst);
            recv.as_mut().poll(cx)
        })
        .await
        .map(|(d, from)| (d.to_vec(), from))
    });
    let done = tokio::task::spawn_blocking(move || thread.join()).await.expect("join").expect("thread");
    assert!(matches!(done, Err(RecvError::Timeout)), "the thread's receive: {done:?}");
    let during = polls.load(Ordering::SeqCst);
    send(&tx, &at, b"after the thread").await;
    let (d, from) = task.await.expect("task").expect("the task's receive");
    assert_eq!((&d[..], from), (&b"after the thread"[..], tx.local_addr()));
    assert!(during <= 4, "the task's receive was polled {during} times while the thread held the socket");
}

/// Receives dropped at random points (raced against a short timer) lose
/// nothing: every datagram of a paced stream arrives once, in order.
pub async fn cancelled_receives_lose_nothing(env: AsyncDatagramEnv, n: u64) {
    let (a, b) = (env.bind().await, env.bind().await);
    let b_at = b.local_addr();
    // One receive is dropped for sure, waiting, before anything is sent:
    // the timers below drop others only when the receiver catches up.
    let early = tokio::time::timeout(Duration::from_millis(2), b.recv_from()).await;
    assert!(early.is_err(), "a datagram before any was sent");
    let got = Arc::new(AtomicU64::new(0));
    let counter = got.clone();
    let sender = tokio::spawn(async move {
        for i in 0..n {
            while i >= counter.load(Ordering::Relaxed) + 32 {
                tokio::time::sleep(Duration::from_micros(100)).await;
            }
            send(&a, &b_at, &i.to_le_bytes()).await;
        }
    });
    let mut next = 0u64;
    while next < n {
        let wait = Duration::from_micros(30 + (next * 37) % 300);
        tokio::select! {
            r = b.recv_from() => {
                let (d, _) = r.expect("recv");
                assert_eq!(u64::from_le_bytes(d[..8].try_into().expect("8 bytes")), next, "lost or duplicated");
                next += 1;
                got.store(next, Ordering::Relaxed);
            }
            () = tokio::time::sleep(wait) => {}
        }
    }
    sender.await.expect("sender");
    assert!(matches!(b.try_recv_from(), Err(RecvError::Empty)), "nothing left over");
}

/// A member receives a group's datagrams; after it leaves nothing reaches
/// it (while another member still gets them); rejoined, it receives again.
pub async fn group_join_leave_rejoin(env: AsyncDatagramEnv, group: SocketAddr) {
    let (m, other, sender) = (env.member(group).await, env.member(group).await, env.bind().await);
    send(&sender, &group, b"first").await;
    assert_eq!(&*m.recv_timeout(HANG).await.expect("member").0, b"first");
    assert_eq!(&*other.recv_timeout(HANG).await.expect("other member").0, b"first");
    m.leave(&group).expect("leave");
    send(&sender, &group, b"while out").await;
    assert_eq!(&*other.recv_timeout(HANG).await.expect("other member").0, b"while out");
    assert!(matches!(m.recv_timeout(Duration::from_millis(500)).await, Err(RecvError::Timeout)));
    m.join(&group).await.expect("rejoin");
    send(&sender, &group, b"back").await;
    assert_eq!(&*m.recv_timeout(HANG).await.expect("member again").0, b"back");
}

/// A group unique to this process and `n`.
pub fn group(n: u8) -> SocketAddr {
    let pid = std::process::id();
    format!("239.{}.{}.{n}:{}", 10 + pid % 200, 100 + pid % 150, 21_000 + pid % 20_000)
        .parse()
        .expect("group")
}
