//! The failure tests over `rc://` and `rc+oob://`, inside the Soft-RoCE guest.

use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use zerocast::rdma::{RcConfig, RcError};
use zerocast::{Config, ConnError, LinkConfig, Zerocast};
use zerocast_tests::failure;
use zerocast_tests::Transport;

use super::HB;

fn addr() -> String {
    std::env::var("ZEROCAST_RDMA_ADDR").unwrap_or_else(|_| "10.0.2.15".to_owned())
}

fn rc(scheme: &str, heartbeat: Option<Duration>) -> Transport {
    let link = LinkConfig::default().with_recv_window(16).with_heartbeat(heartbeat);
    let cfg = Config::default().with_link(link).with_rc(RcConfig::default());
    let listen_uri = Box::leak(format!("{scheme}://{}:0", addr()).into_boxed_str());
    Transport { zc: Zerocast::with_config(cfg), listen_uri }
}

fn pool(t: &Transport) -> zerocast::Pool {
    t.zc.rc().expect("rc transport").pool().clone()
}

fn rc_error(e: &ConnError) -> Option<&RcError> {
    match e {
        ConnError::Transport { source, .. } => source.downcast_ref::<RcError>(),
        _ => None,
    }
}

/// `ibv_wc_status::IBV_WC_REM_OP_ERR`.
const IBV_WC_REM_OP_ERR: u32 = 11;

fn killed(scheme: &str, name: &str) {
    let t = rc(scheme, None);
    let r = failure::peer_killed(&t, &pool(&t), name, Duration::from_secs(5));
    println!(
        "{scheme}: peer killed, typed error after {:?}: {} ({:?})",
        r.detected,
        r.error,
        rc_error(&r.error).map(ToString::to_string)
    );
    println!("{scheme}: bystander verified {} messages after the kill", r.bystander_after);
    // Over rdma_cm the peer's death is a disconnect event; over rc+oob there
    // is none, and a send that reaches the peer's QP as the kernel destroys
    // it is refused (remote operation error), or, later, not acknowledged.
    assert!(
        matches!(rc_error(&r.error), Some(RcError::PeerDisconnected | RcError::RetryExceeded))
            || matches!(rc_error(&r.error), Some(RcError::Completion { status, .. }) if *status == IBV_WC_REM_OP_ERR),
        "not a peer-gone error: {:?}",
        r.error
    );
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn rc_peer_killed_mid_stream() {
    if failure::child_main() {
        return;
    }
    killed("rc", "rdma::rc_peer_killed_mid_stream");
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn rc_oob_peer_killed_mid_stream() {
    if failure::child_main() {
        return;
    }
    killed("rc+oob", "rdma::rc_oob_peer_killed_mid_stream");
}

fn stopped(scheme: &str, name: &str) {
    let t = rc(scheme, Some(HB));
    let took = failure::peer_stopped(&t, &pool(&t), name, HB);
    println!("{scheme}: SIGSTOPped peer detected after {took:?} (heartbeat {HB:?})");
}

/// rxe acknowledges for a stopped process: only heartbeats notice.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn rc_peer_stopped_detected_by_heartbeat() {
    if failure::child_main() {
        return;
    }
    stopped("rc", "rdma::rc_peer_stopped_detected_by_heartbeat");
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn rc_oob_peer_stopped_detected_by_heartbeat() {
    if failure::child_main() {
        return;
    }
    stopped("rc+oob", "rdma::rc_oob_peer_stopped_detected_by_heartbeat");
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn rc_reconnect_to_restarted_peer() {
    if failure::child_main() {
        return;
    }
    let t = rc("rc", None);
    let listen = format!("rc://{}:0", addr());
    failure::reconnect(
        &t,
        &pool(&t),
        "rdma::rc_reconnect_to_restarted_peer",
        &listen,
        Duration::from_secs(5),
    );
}

/// `rdma resource show` counts of qp, cq, mr and pd on the test device,
/// with the memory regions of `pool` (registered once, kept while the pool
/// lives, and grown on demand) taken out of mr.
fn rdma_counts(pool: &zerocast::Pool) -> [u64; 4] {
    let dev = std::env::var("ZEROCAST_RDMA_DEV").unwrap_or_else(|_| "rxe0".to_owned());
    let out = Command::new("rdma").args(["resource", "show"]).output().expect("run rdma");
    assert!(out.status.success(), "rdma resource show: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(&format!("{dev}:")))
        .unwrap_or_else(|| panic!("no {dev} in rdma resource show: {text}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    let count = |key: &str| {
        let i = words.iter().position(|w| *w == key).unwrap_or_else(|| panic!("no {key} in {line}"));
        words[i + 1].parse::<u64>().expect("count")
    };
    let regions = pool.stats().regions as u64;
    [count("qp"), count("cq"), count("mr") - regions, count("pd")]
}

/// Wait (at most 20 s) until the counts equal `want`; the last reading.
fn settle(pool: &zerocast::Pool, want: [u64; 4]) -> [u64; 4] {
    let start = Instant::now();
    loop {
        let now = rdma_counts(pool);
        if now == want || start.elapsed() > Duration::from_secs(20) {
            return now;
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// Counts that hold still for half a second (teardown is asynchronous).
fn stable_counts(pool: &zerocast::Pool) -> [u64; 4] {
    let mut last = rdma_counts(pool);
    for _ in 0..100 {
        thread::sleep(Duration::from_millis(500));
        let now = rdma_counts(pool);
        if now == last {
            return now;
        }
        last = now;
    }
    panic!("RDMA resource counts never settled: {last:?}");
}

/// 1,000 connect / one message each way / disconnect cycles over `rc://`:
/// afterwards qp, cq, mr (less the pool's own regions) and pd counts are
/// back to their baseline.
/// `ZEROCAST_RC_CYCLES` changes the number of cycles.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn rc_resources_back_to_baseline_after_cycles() {
    let cycles: u32 = std::env::var("ZEROCAST_RC_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000);
    let t = rc("rc", None);
    let listener = t.zc.listen(t.listen_uri).expect("listen");
    let at = listener.local_endpoint().to_string();
    let cycle = || {
        let (zc, at) = (t.zc.clone(), at.clone());
        let client = thread::spawn(move || zc.connect(&at).expect("connect"));
        let server = listener.accept().expect("accept");
        let client = client.join().expect("connect thread");
        for (a, b) in [(&client, &server), (&server, &client)] {
            let mut buf = a.alloc(8).expect("alloc");
            buf.copy_from_slice(b"cycle...");
            a.send(buf).expect("send");
            assert_eq!(&*b.recv_timeout(Duration::from_secs(10)).expect("recv"), b"cycle...");
        }
    };
    // Warm up: the pool registers its regions with the first connections.
    for _ in 0..3 {
        cycle();
    }
    let pool = pool(&t);
    let baseline = stable_counts(&pool);
    println!("baseline qp/cq/mr(-pool)/pd: {baseline:?}");
    let start = Instant::now();
    for i in 0..cycles {
        cycle();
        if i % 100 == 99 {
            println!("{} cycles, {:?}, now {:?}", i + 1, start.elapsed(), rdma_counts(&pool));
        }
    }
    let took = start.elapsed();
    let after = settle(&pool, baseline);
    println!(
        "rc: {cycles} connect/disconnect cycles in {took:?} ({:?} each); qp/cq/mr(-pool)/pd {baseline:?} -> {after:?}",
        took / cycles
    );
    assert_eq!(after, baseline, "RDMA resources leaked (qp, cq, mr, pd)");
    drop(listener);
    zerocast_tests::assert_pool_drained(&pool, Duration::from_secs(10));
}
