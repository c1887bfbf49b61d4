//! Soak: peers that stream checksummed messages and get killed at random.
//!
//! ```sh
//! cargo run --release --example soak -- tcp://127.0.0.1:0 60
//! ```
//!
//! The process listens at the URI (any transport) and keeps `PEERS` child
//! processes (this example again, with `--peer`) connected, each streaming
//! checksummed, numbered messages. Every one to three seconds it SIGKILLs a
//! random child and starts another. It checks that every connection's
//! messages arrive intact and in order until the connection fails with a
//! typed error within 5 s of its peer's death, and it samples its own RSS.
//! At the end it prints one `soak:` line with the figures, and exits
//! non-zero if a check failed. `scripts/soak` runs it on the host and in the
//! Soft-RoCE guest.

use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use zerocast::{Connection, RecvError, Zerocast};

const PEERS: usize = 3;

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// Message `seq`: its number, then a body of 8..1032 bytes, then the body's checksum.
fn fill(seq: u64, buf: &mut [u8]) {
    let n = buf.len();
    buf[..8].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in buf[8..n - 8].iter_mut().enumerate() {
        *b = (seq as usize).wrapping_add(i) as u8;
    }
    let sum = fnv(&buf[8..n - 8]);
    buf[n - 8..].copy_from_slice(&sum.to_le_bytes());
}

fn len_of(seq: u64) -> usize {
    24 + (seq.wrapping_mul(0x9e37_79b9) % 1024) as usize
}

fn peer(uri: &str) -> Result<()> {
    let conn = Zerocast::new().connect(uri).context("peer connect")?;
    for seq in 0.. {
        let mut buf = conn.alloc(len_of(seq))?;
        fill(seq, &mut buf);
        conn.send(buf).map_err(|e| anyhow::anyhow!("peer send: {e}"))?;
    }
    Ok(())
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).map(str::to_owned))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}

#[derive(Default)]
struct Figures {
    messages: AtomicU64,
    connections: AtomicU64,
    typed_errors: AtomicU64,
    failures: Mutex<Vec<String>>,
    /// When each killed peer died, by connection number.
    killed_at: Mutex<Vec<(u64, Instant)>>,
}

/// Receive one connection's stream until it ends; check order and checksums.
fn drain(id: u64, conn: Connection, figs: &Figures) {
    let mut next = 0u64;
    loop {
        match conn.recv_timeout(Duration::from_secs(30)) {
            Ok(msg) => {
                let n = msg.len();
                let seq = u64::from_le_bytes(msg[..8].try_into().unwrap_or_default());
                let sum = u64::from_le_bytes(msg[n - 8..].try_into().unwrap_or_default());
                if seq != next || n != len_of(seq) || fnv(&msg[8..n - 8]) != sum {
                    figs.failures
                        .lock()
                        .unwrap()
                        .push(format!("connection {id}: bad message {seq} (want {next})"));
                    return;
                }
                next += 1;
                figs.messages.fetch_add(1, Relaxed);
            }
            Err(RecvError::Failed(_)) | Err(RecvError::Disconnected) => {
                figs.typed_errors.fetch_add(1, Relaxed);
                let died = figs.killed_at.lock().unwrap().iter().find(|(c, _)| *c == id).map(|(_, t)| *t);
                if let Some(t) = died {
                    if t.elapsed() > Duration::from_secs(5) {
                        let msg = format!("connection {id}: error {:?} after its peer died", t.elapsed());
                        figs.failures.lock().unwrap().push(msg);
                    }
                }
                return;
            }
            Err(e) => {
                figs.failures.lock().unwrap().push(format!("connection {id}: {e:?} after {next} messages"));
                return;
            }
        }
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--peer") {
        return peer(args.get(1).context("usage: soak --peer URI")?);
    }
    let uri = args.first().map_or("tcp://127.0.0.1:0", String::as_str);
    let secs: u64 = args.get(1).map_or(Ok(30), |s| s.parse()).context("seconds")?;
    let zc = Zerocast::new();
    let listener = zc.listen(uri).context("listen")?;
    let at = listener.local_endpoint().to_string();
    let exe = std::env::current_exe()?;
    let figs = Arc::new(Figures::default());
    let spawn = || Command::new(&exe).args(["--peer", &at]).spawn();
    let mut children: Vec<(u64, Child)> = Vec::new();
    let mut drains = Vec::new();
    let start = Instant::now();
    let mut rss = (0, 0);
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next_kill = start + Duration::from_secs(1);
    let mut kills = 0u64;
    while start.elapsed() < Duration::from_secs(secs) {
        while children.len() < PEERS {
            let child = spawn().context("spawn a peer")?;
            let conn = listener.accept().context("accept")?;
            let id = figs.connections.fetch_add(1, Relaxed);
            let f = figs.clone();
            drains.push(thread::spawn(move || drain(id, conn, &f)));
            children.push((id, child));
        }
        if rss.0 == 0 && start.elapsed() > Duration::from_secs(secs.min(10) / 2) {
            rss.0 = rss_kib(); // After warm-up: pools and threads are in place.
        }
        if Instant::now() >= next_kill {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let (id, mut child) = children.swap_remove(rng as usize % children.len());
            child.kill()?;
            child.wait()?;
            figs.killed_at.lock().unwrap().push((id, Instant::now()));
            kills += 1;
            next_kill = Instant::now() + Duration::from_millis(1000 + rng % 2000);
        }
        thread::sleep(Duration::from_millis(50));
    }
    rss.1 = rss_kib();
    for (id, mut child) in children {
        child.kill()?;
        child.wait()?;
        figs.killed_at.lock().unwrap().push((id, Instant::now()));
    }
    for d in drains {
        d.join().map_err(|_| anyhow::anyhow!("a receiving thread panicked"))?;
    }
    // I/O threads hand their last buffers back asynchronously.
    let in_use = || {
        #[cfg(feature = "rdma")]
        let rc =
            if uri.starts_with("rc") { zc.rc().map_or(0, |t| t.pool().stats().buffers_in_use) } else { 0 };
        #[cfg(not(feature = "rdma"))]
        let rc = 0;
        zc.pool().map(|p| p.stats().buffers_in_use).unwrap_or(0) + rc
    };
    let settle = Instant::now();
    while in_use() != 0 && settle.elapsed() < Duration::from_secs(10) {
        thread::sleep(Duration::from_millis(50));
    }
    let in_use = in_use();
    let failures = figs.failures.lock().unwrap();
    println!(
        "soak: {uri} {secs}s: {} connections, {kills} peers killed, {} messages verified, {} typed errors, \
         rss {} KiB -> {} KiB, pool buffers in use at the end: {in_use}, failures: {}",
        figs.connections.load(Relaxed),
        figs.messages.load(Relaxed),
        figs.typed_errors.load(Relaxed),
        rss.0,
        rss.1,
        failures.len()
    );
    for f in failures.iter() {
        eprintln!("soak: {f}");
    }
    if !failures.is_empty() || in_use != 0 {
        bail!("soak failed");
    }
    Ok(())
}
