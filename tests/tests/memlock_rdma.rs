//! The memlock limit, as an unprivileged process meets it: under
//! `ulimit -l 8192` (8 MiB) and without CAP_IPC_LOCK, asking for a pool of
//! 64 MiB regions is a typed error that names the limit and the size; the
//! process's existing RC connection keeps working, and a smaller pool
//! still works.
//!
//! The test re-runs itself through `prlimit` and `setpriv` as uid 65534.
//! Run inside the Soft-RoCE guest by `scripts/test`.

#![cfg(feature = "rdma")]

use std::process::Command;
use std::time::Duration;

use zerocast::rdma::RcConfig;
use zerocast::{Config, Connection, LinkConfig, PoolConfig, Zerocast};
use zerocast_mem::{PoolError, RegisterError, Wait};
use zerocast_tests::Transport;

const CHILD_ENV: &str = "ZEROCAST_MEMLOCK_CHILD";
const LIMIT: u64 = 8 << 20;
const BIG_REGION: usize = 64 << 20;

fn transport(pool: PoolConfig) -> Transport {
    let addr = std::env::var("ZEROCAST_RDMA_ADDR").unwrap_or_else(|_| "10.0.2.15".to_owned());
    let link = LinkConfig::default().with_recv_window(8).with_max_payload(64 << 10);
    let cfg =
        Config::default().with_link(link).with_pool(pool).with_rc(RcConfig::default().with_eager_limit(4096));
    let uri = Box::leak(format!("rc://{addr}:0").into_boxed_str());
    Transport { zc: Zerocast::with_config(cfg), listen_uri: uri }
}

/// A pool whose regions are `region` bytes, capped at `max`.
fn pool(region: usize, max: usize) -> PoolConfig {
    PoolConfig::default().with_classes([4096, 64 << 10]).with_region_size(region).with_max_bytes(max)
}

/// A connected pair, or why not. Accepts on a thread of its own, so a
/// failed connect cannot leave the caller blocked in `accept`.
fn pair(t: &Transport) -> Result<(Connection, Connection), String> {
    let l = t.zc.listen(t.listen_uri).map_err(|e| error_chain(&e))?;
    let at = l.local_endpoint().to_string();
    let server = std::thread::spawn(move || l.accept().map_err(|e| error_chain(&e)));
    let client = t.zc.connect(&at).map_err(|e| error_chain(&e))?;
    let server = server.join().map_err(|_| "accept thread panicked".to_owned())??;
    Ok((client, server))
}

fn exchange(client: &Connection, server: &Connection, n: u32) {
    for i in 0..n {
        let mut buf = client.alloc(64).expect("alloc");
        buf[..4].copy_from_slice(&i.to_le_bytes());
        client.send(buf).expect("send");
        let msg = server.recv_timeout(Duration::from_secs(10)).expect("recv");
        assert_eq!(msg[..4], i.to_le_bytes());
    }
}

fn child() {
    let limit = zerocast_mem::memlock_limit();
    println!("child: uid {}, memlock limit {limit:?}", unsafe_free_uid());
    assert_eq!(limit, Some(LIMIT), "the parent set the limit");

    // A small pool (1 MiB regions, 4 MiB cap) works under the limit.
    let small = transport(pool(1 << 20, 4 << 20));
    let (client, server) = pair(&small).expect("a connection on a small pool");
    exchange(&client, &server, 100);
    println!("child: small pool connected");

    // Regions of 64 MiB cannot be registered: a typed error naming both.
    let big = transport(pool(BIG_REGION, BIG_REGION));
    let rc = big.zc.rc().expect("opening the device needs no locked memory");
    match rc.pool().alloc(4096, Wait::No) {
        Err(PoolError::Register(RegisterError::MemLock { limit, requested, .. })) => {
            assert_eq!((limit, requested), (Some(LIMIT), BIG_REGION));
        }
        other => panic!("expected a memlock error, got {other:?}"),
    }
    let chain = match pair(&big) {
        Ok(_) => panic!("an RC connection came up on a pool that cannot be registered"),
        Err(e) => e,
    };
    assert!(chain.contains("ulimit -l") && chain.contains(&BIG_REGION.to_string()), "{chain}");
    println!("child: memlock error: {chain}");

    // The existing connection is unaffected, and a smaller pool still works.
    exchange(&client, &server, 100);
    let other = transport(pool(1 << 20, 2 << 20));
    let (c2, s2) = pair(&other).expect("a connection on another small pool");
    exchange(&c2, &s2, 10);
    println!("child: existing and new small connections work");
}

fn unsafe_free_uid() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(str::to_owned))
        .unwrap_or_default()
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn memlock_limit_in_an_unprivileged_process() {
    if std::env::var_os(CHILD_ENV).is_some() {
        child();
        return;
    }
    let exe = std::env::current_exe().expect("current_exe");
    let limit = format!("--memlock={LIMIT}:{LIMIT}");
    let out = Command::new("timeout")
        .args(["120", "prlimit", &limit, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(exe)
        .args(["memlock_limit_in_an_unprivileged_process", "--exact", "--ignored", "--nocapture"])
        .env(CHILD_ENV, "1")
        .output()
        .expect("run the child through prlimit and setpriv");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("child stdout:\n{stdout}\nchild stderr:\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "child failed: {}", out.status);
    assert!(stdout.contains("Uid:\t65534"), "the child did not run unprivileged");
    assert!(stdout.contains("child: memlock error:"), "the child did not reach the check");
    assert!(stdout.contains("child: existing and new small connections work"));
}
