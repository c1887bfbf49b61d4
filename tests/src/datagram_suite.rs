//! The datagram conformance suite: one set of assertions for `ud://` and
//! `mcast://`, run over UDP on the host and over RDMA UD in the Soft-RoCE
//! guest.
//!
//! Datagrams are unreliable by contract, so the tests that expect every
//! datagram pace their sends and run on loopback (UDP) or rxe's loopback
//! (RDMA), where nothing is lost unless a receiver is overrun; the loss
//! test overruns one on purpose and checks the accounting.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use zerocast::datagram::{Backend, DatagramSocket};
use zerocast::{RecvError, Zerocast};

/// A datagram backend under test.
#[derive(Debug, Clone)]
pub struct DatagramEnv {
    /// Opens the sockets.
    pub zc: Zerocast,
    /// The interface address sockets bind to and join groups on.
    pub host: String,
    /// The backend the sockets must get.
    pub backend: Backend,
}

/// A typed test message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tick {
    /// Its number.
    pub n: u64,
    /// Some text, so the size varies.
    pub note: String,
}

impl DatagramEnv {
    /// A unicast socket on the interface, port picked.
    pub fn bind(&self) -> DatagramSocket {
        let s = self.zc.bind_datagram(&format!("ud://{}:0", self.host)).expect("bind ud://");
        assert_eq!(s.backend(), self.backend, "the datagram backend chosen");
        s
    }

    /// A group unique to this process and `n`, as an address.
    pub fn group(&self, n: u8) -> SocketAddr {
        let pid = std::process::id();
        format!("239.{}.{}.{n}:{}", 10 + pid % 200, pid % 250, 20_000 + pid % 20_000).parse().unwrap()
    }

    /// A member of `group`.
    pub fn member(&self, group: SocketAddr) -> DatagramSocket {
        let s =
            self.zc.bind_datagram(&format!("mcast://{group}?iface={}", self.host)).expect("bind mcast://");
        assert_eq!(s.backend(), self.backend, "the datagram backend chosen");
        s
    }
}

fn soon() -> Option<Instant> {
    Some(Instant::now() + Duration::from_secs(10))
}

fn send(s: &DatagramSocket, to: &SocketAddr, bytes: &[u8]) {
    let mut b = s.alloc(bytes.len(), None).expect("alloc");
    b.copy_from_slice(bytes);
    s.send_to(b, to).map_err(|(_, e)| e).expect("send");
}

/// `n` typed datagrams arrive, intact and counted, and the receiver's
/// reply to the reported source reaches the sender.
pub fn unicast_typed(env: &DatagramEnv, n: u64) {
    let (a, b) = (env.bind(), env.bind());
    let (a_at, b_at) = (a.local_addr(), b.local_addr());
    let pool = b.pool().clone();
    let (tx, a_rx) = a.typed::<Tick, String>();
    let (reply_tx, rx) = b.typed::<String, Tick>();
    let got = Arc::new(AtomicU64::new(0));
    let counter = got.clone();
    let receiver = thread::spawn(move || {
        let mut from_seen = None;
        for i in 0..n {
            let (t, from) = rx.recv_timeout(Duration::from_secs(20)).expect("typed datagram");
            assert_eq!(t, Tick { n: i, note: "x".repeat((i % 200) as usize) }, "in order on loopback");
            from_seen = Some(from);
            counter.fetch_add(1, Ordering::Relaxed);
        }
        let from = from_seen.expect("a source");
        let st = rx.socket().source_stats(&from).expect("source stats");
        assert_eq!((st.received, st.lost, st.reordered), (n, 0, 0));
        reply_tx.send_to(&format!("got {n}"), &from).expect("reply");
        from
    });
    for i in 0..n {
        // Paced: at most 64 datagrams ahead of the receiver.
        let start = Instant::now();
        while i >= got.load(Ordering::Relaxed) + 64 {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "receiver stalled at {}",
                got.load(Ordering::Relaxed)
            );
            thread::yield_now();
        }
        tx.send_to(&Tick { n: i, note: "x".repeat((i % 200) as usize) }, &b_at).expect("typed send");
    }
    let from = receiver.join().expect("receiver");
    assert_eq!(from, a_at, "the source is the sender's bound address");
    let (reply, from) = a_rx.recv_timeout(Duration::from_secs(10)).expect("reply");
    assert_eq!((reply.as_str(), from), (format!("got {n}").as_str(), b_at));
    assert!(tx.socket().flush(Duration::from_secs(10)));
    drop((tx, a_rx));
    crate::assert_pool_drained(&pool, Duration::from_secs(10));
}

/// `batches` batches of `per` datagrams sent with `send_batch` to a
/// destination resolved ahead arrive in order, each intact; a batch with
/// an oversize datagram in the middle sends the ones before it and hands
/// back that one and the rest, in order.
pub fn batches_in_order(env: &DatagramEnv, batches: u64, per: u64) {
    let (a, b) = (env.bind(), env.bind());
    let b_at = b.local_addr();
    // Resolved ahead of the first send; resolving again does nothing.
    a.resolve(&b_at).expect("resolve");
    a.resolve(&b_at).expect("resolve again");
    let n = batches * per;
    let got = Arc::new(AtomicU64::new(0));
    let counter = got.clone();
    let receiver = thread::spawn(move || {
        let mut from_seen = None;
        for i in 0..n + 3 {
            let (d, from) = b.recv_from(Some(Instant::now() + Duration::from_secs(20))).expect("datagram");
            let want = if i < n { i } else { 1_000_000 + i - n };
            assert_eq!(d.len(), 8 + (want % 300) as usize, "datagram {i}: length");
            assert_eq!(u64::from_le_bytes(d[..8].try_into().unwrap()), want, "in order on loopback");
            assert!(d[8..].iter().all(|&x| x == want as u8), "datagram {i}: payload");
            from_seen = Some(from);
            counter.fetch_add(1, Ordering::Relaxed);
        }
        let st = b.source_stats(&from_seen.expect("a source")).expect("source stats");
        assert_eq!((st.received, st.lost, st.reordered), (n + 3, 0, 0));
    });
    let datagram = |k: u64| {
        let mut buf = a.alloc(8 + (k % 300) as usize, None).expect("alloc");
        buf[..8].copy_from_slice(&k.to_le_bytes());
        buf[8..].fill(k as u8);
        (buf, b_at)
    };
    let mut batch = Vec::with_capacity(per as usize);
    for first in (0..n).step_by(per as usize) {
        // Paced: at most 64 datagrams ahead of the receiver.
        let start = Instant::now();
        while first + per > got.load(Ordering::Relaxed) + 64 {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "receiver stalled at {}",
                got.load(Ordering::Relaxed)
            );
            thread::yield_now();
        }
        batch.extend((first..first + per).map(datagram));
        a.send_batch(&mut batch).expect("send_batch");
        assert!(batch.is_empty(), "every datagram was taken");
    }
    assert_eq!(a.stats().sent, n);
    let max = a.max_datagram();
    let oversize = (a.alloc(max + 1, None).expect("alloc"), b_at);
    batch.extend([datagram(1_000_000), datagram(1_000_001), oversize, datagram(1_000_002)]);
    let e = a.send_batch(&mut batch).expect_err("an oversize datagram");
    assert!(e.is_too_large(), "{e}");
    assert_eq!(batch.len(), 2, "the oversize datagram and the one after it come back");
    assert_eq!((batch[0].0.len(), batch[1].0.len()), (max + 1, 8 + (1_000_002 % 300)));
    assert_eq!(a.stats().sent, n + 2, "the two before it were sent");
    batch.remove(0);
    a.send_batch(&mut batch).expect("the rest");
    receiver.join().expect("receiver");
    assert!(a.flush(Duration::from_secs(10)));
}

/// A payload over the limit is refused with its buffer back, nothing sent;
/// the limit itself goes through.
pub fn oversize_refused(env: &DatagramEnv) {
    let (a, b) = (env.bind(), env.bind());
    let max = a.max_datagram();
    let buf = a.alloc(max + 1, None).expect("alloc");
    let (back, e) = a.send_to(buf, &b.local_addr()).expect_err("too large");
    assert!(e.is_too_large(), "{e}");
    assert_eq!(back.len(), max + 1);
    assert_eq!(a.stats().sent, 0);
    drop(back);
    send(&a, &b.local_addr(), &vec![0xA5; max]);
    let (d, _) = b.recv_from(soon()).expect("max-size datagram");
    assert!(d.len() == max && d.iter().all(|&x| x == 0xA5));
}

/// Leave, send: nothing arrives; rejoin: it arrives again.
pub fn join_leave_rejoin(env: &DatagramEnv) {
    let g = env.group(1);
    let m = env.member(g);
    let other = env.member(g);
    let sender = env.bind();
    send(&sender, &g, b"first");
    assert_eq!(&*m.recv_from(soon()).expect("member").0, b"first");
    assert_eq!(&*other.recv_from(soon()).expect("other member").0, b"first");
    m.leave(&g).expect("leave");
    send(&sender, &g, b"while out");
    assert_eq!(&*other.recv_from(soon()).expect("other member").0, b"while out");
    assert!(matches!(
        m.recv_from(Some(Instant::now() + Duration::from_millis(500))),
        Err(RecvError::Timeout)
    ));
    m.join(&g).expect("rejoin");
    send(&sender, &g, b"back");
    assert_eq!(&*m.recv_from(soon()).expect("member again").0, b"back");
    let st = m.source_stats(&sender.local_addr()).expect("stats");
    assert_eq!((st.received, st.lost), (2, 1), "the datagram sent while out reads as lost");
}

/// A receiver that does not receive while a burst arrives loses some; its
/// lost counter is then exactly sent − received, and nothing hangs.
pub fn loss_accounting(env: &DatagramEnv, burst: usize) {
    let (tx, rx) = (env.bind(), env.bind());
    let to = rx.local_addr();
    for i in 0..burst {
        send(&tx, &to, &(i as u64).to_le_bytes());
    }
    assert!(tx.flush(Duration::from_secs(10)));
    let mut got = 0u64;
    while let Ok((d, _)) = rx.recv_from(Some(Instant::now() + Duration::from_millis(500))) {
        assert_eq!(u64::from_le_bytes(d[..8].try_into().unwrap()), u64::from(d.seq()));
        got += 1;
    }
    assert!(got < burst as u64, "the receiver was not overrun ({got} of {burst}); raise the burst");
    send(&tx, &to, &(burst as u64).to_le_bytes());
    rx.recv_from(soon()).expect("the datagram after the drain");
    got += 1;
    let st = rx.source_stats(&tx.local_addr()).expect("stats");
    let sent = burst as u64 + 1;
    assert_eq!((st.received, st.lost), (got, sent - got), "{st:?}");
    assert_eq!(tx.stats().sent, sent);
}

/// The environment variable that makes a test binary a fan-out receiver.
pub const FANOUT_CHILD_ENV: &str = "ZEROCAST_DGRAM_FANOUT_CHILD";

/// One sender, `receivers` receiver processes (this test binary run again
/// as `child_test`), `n` datagrams at a paced rate: every receiver gets
/// all of them, and its counters agree.
pub fn multicast_fanout(env: &DatagramEnv, child_test: &str, receivers: usize, n: u64) {
    let g = env.group(2);
    let exe = std::env::current_exe().expect("test binary");
    let mut kids = Vec::new();
    for _ in 0..receivers {
        let mut c = Command::new(&exe)
            .args([child_test, "--exact", "--nocapture", "--include-ignored", "--test-threads=1"])
            .env(FANOUT_CHILD_ENV, format!("{g},{},{n}", env.host))
            .stdout(Stdio::piped())
            .spawn()
            .expect("receiver process");
        let out = BufReader::new(c.stdout.take().expect("stdout"));
        let (tx, rx) = std::sync::mpsc::channel();
        thread::spawn(move || {
            for l in out.lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        kids.push((c, rx));
    }
    for (_, lines) in &kids {
        wait_line(lines, "joined", Duration::from_secs(60));
    }
    let sender = env.bind();
    for i in 0..n {
        send(&sender, &g, &i.to_le_bytes());
        if i % 32 == 31 {
            thread::sleep(Duration::from_millis(4));
        }
    }
    for (mut c, lines) in kids {
        let line = wait_line(&lines, "result", Duration::from_secs(120));
        assert!(c.wait().expect("child").success(), "receiver failed: {line}");
        let want = format!("result received={n} lost=0 reordered=0 from={}", sender.local_addr());
        assert_eq!(line, want);
    }
}

fn wait_line(lines: &std::sync::mpsc::Receiver<String>, prefix: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            // libtest's "test name ... " may precede the line.
            Ok(l) if l.contains(prefix) => return l[l.find(prefix).unwrap_or(0)..].to_owned(),
            Ok(_) => {}
            Err(e) => panic!("no `{prefix}` line from a receiver process: {e}"),
        }
    }
}

/// The receiver side of [`multicast_fanout`], in the child process: join,
/// say `joined`, receive `n`, print the counters.
pub fn fanout_child(zc: &Zerocast, backend: Backend) {
    let Ok(spec) = std::env::var(FANOUT_CHILD_ENV) else { return };
    let mut it = spec.split(',');
    let (g, host, n) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
    let n: u64 = n.parse().unwrap();
    let m = zc.bind_datagram(&format!("mcast://{g}?iface={host}")).expect("join");
    assert_eq!(m.backend(), backend);
    println!("joined");
    let mut from = None;
    for i in 0..n {
        let (d, f) = m.recv_from(Some(Instant::now() + Duration::from_secs(30))).expect("datagram");
        assert_eq!(u64::from_le_bytes(d[..8].try_into().unwrap()), i, "in order on loopback");
        from = Some(f);
    }
    let from = from.expect("a source");
    let st = m.source_stats(&from).expect("stats");
    println!("result received={} lost={} reordered={} from={from}", st.received, st.lost, st.reordered);
}
