//! TCP under impairment: two network namespaces joined by a veth pair, with
//! netem loss 5%, delay 5 ms ± 2 ms and reorder 25% on both ends. A typed
//! channel carries 200 000 checksummed messages of mixed sizes; the
//! receiver checks that none is lost, duplicated or out of order.
//!
//! It needs root, network namespaces and `sch_netem`, which the host kernel
//! lacks: it is ignored on a plain `cargo test`, and `scripts/test` runs it
//! inside the Soft-RoCE guest. The receiver is this test re-run in a new
//! network namespace (`unshare --net`), with the veth's other end moved in.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use zerocast::{Config, LinkConfig, TcpConfig, Zerocast};
use zerocast_tests::checksum::fnv1a;

const ROLE_ENV: &str = "ZEROCAST_NETEM_ROLE";
const MESSAGES: u64 = 200_000;
const HOST_DEV: &str = "zcnet0";
const PEER_DEV: &str = "zcnet1";
const HOST_ADDR: &str = "198.18.7.1/24";
const PEER_ADDR: &str = "198.18.7.2/24";
const PEER_URI: &str = "tcp://198.18.7.2:7711";
const NETEM: &[&str] = &["loss", "5%", "delay", "5ms", "2ms", "reorder", "25%"];

#[derive(Debug, Serialize, Deserialize)]
struct Msg {
    seq: u64,
    sum: u64,
    #[serde(with = "serde_bytes")]
    body: Vec<u8>,
}

/// Mostly small, some up to 4 KiB: sizes a lossy link turns into many
/// segments and retransmissions.
fn body(seq: u64) -> Vec<u8> {
    let r = seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40;
    let len = if matches!(r % 50, 0) { 1024 + (r as usize % 3072) } else { 16 + (r as usize % 240) };
    (0..len).map(|k| (k as u64 ^ seq) as u8).collect()
}

fn run(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn capture(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn zc() -> Zerocast {
    let tcp = TcpConfig::default().with_timeouts(Duration::from_secs(10), Duration::from_secs(30));
    let mut cfg = Config::default().with_link(LinkConfig::default().with_recv_window(64));
    cfg.tcp = tcp;
    Zerocast::with_config(cfg)
}

/// Netem's drop count on `dev`, from `tc -s qdisc`.
fn netem_drops(dev: &str) -> u64 {
    let s = capture("tc", &["-s", "qdisc", "show", "dev", dev]);
    s.split("dropped ")
        .nth(1)
        .and_then(|t| t.split(',').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// The receiver, in its own namespace: wait for the veth end, impair it,
/// receive and check every message, print the verdict.
fn receiver() {
    let start = Instant::now();
    while !Command::new("ip").args(["link", "show", PEER_DEV]).output().is_ok_and(|o| o.status.success()) {
        assert!(start.elapsed() < Duration::from_secs(30), "{PEER_DEV} never arrived in this namespace");
        thread::sleep(Duration::from_millis(20));
    }
    run("ip", &["link", "set", "lo", "up"]);
    run("ip", &["addr", "add", PEER_ADDR, "dev", PEER_DEV]);
    run("ip", &["link", "set", PEER_DEV, "up"]);
    let mut netem = vec!["qdisc", "add", "dev", PEER_DEV, "root", "netem"];
    netem.extend_from_slice(NETEM);
    run("tc", &netem);
    let zc = zc();
    let listener = zc.listen(PEER_URI).expect("listen");
    println!("receiver: listening");
    let (_, rx) = listener.accept().expect("accept").split::<(), Msg>();
    let (mut next, mut bad) = (0u64, 0u64);
    loop {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(m) => {
                if m.seq != next || fnv1a(&m.body) != m.sum || m.body != body(m.seq) {
                    bad += 1;
                    eprintln!("receiver: expected {next}, got {} ({} bytes)", m.seq, m.body.len());
                }
                next = m.seq + 1;
            }
            Err(zerocast::TypedRecvError::Recv(zerocast::RecvError::Disconnected)) => break,
            Err(e) => panic!("receiver: failed after {next} messages: {e:?}"),
        }
    }
    println!("receiver: {next} received, {bad} bad, netem dropped {} here", netem_drops(PEER_DEV));
    // The namespace, and with it the veth pair, lives until this process
    // ends: wait until the sender has read its side's counters.
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
}

#[test]
#[ignore = "needs root, network namespaces and sch_netem: scripts/test runs it inside the Soft-RoCE guest"]
fn tcp_typed_channel_through_lossy_veth() {
    if std::env::var_os(ROLE_ENV).is_some() {
        receiver();
        return;
    }
    let _ = Command::new("ip").args(["link", "del", HOST_DEV]).output();
    run("ip", &["link", "add", HOST_DEV, "type", "veth", "peer", "name", PEER_DEV]);
    run("ip", &["addr", "add", HOST_ADDR, "dev", HOST_DEV]);
    run("ip", &["link", "set", HOST_DEV, "up"]);
    let mut netem = vec!["qdisc", "add", "dev", HOST_DEV, "root", "netem"];
    netem.extend_from_slice(NETEM);
    run("tc", &netem);

    let exe = std::env::current_exe().expect("current_exe");
    let exe = exe.to_str().expect("utf-8 path");
    let mut child = Command::new("unshare")
        .args(["--net", "--", exe, "tcp_typed_channel_through_lossy_veth", "--exact", "--ignored"])
        .args(["--nocapture", "--test-threads=1"])
        .env(ROLE_ENV, "receiver")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the receiver in a new network namespace");
    // `unshare` execs the test in place: the child's pid owns the namespace,
    // once it has entered it.
    let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/net")).ok();
    let pid = child.id().to_string();
    let start = Instant::now();
    while ns(&pid) == ns("self") {
        assert!(start.elapsed() < Duration::from_secs(30), "the receiver never entered a new namespace");
        thread::sleep(Duration::from_millis(10));
    }
    run("ip", &["link", "set", PEER_DEV, "netns", &pid]);
    let out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut lines = out.lines().map_while(Result::ok);
    assert!(lines.by_ref().any(|l| l.contains("receiver: listening")), "the receiver never listened");

    let zc = zc();
    let start = Instant::now();
    let (tx, _) = zc.connect(PEER_URI).expect("connect through the veth").split::<Msg, ()>();
    for seq in 0..MESSAGES {
        let body = body(seq);
        tx.send(Msg { seq, sum: fnv1a(&body), body }).expect("send");
    }
    drop(tx);
    let verdict = lines.find(|l| l.starts_with("receiver: ") && l.contains("received")).unwrap_or_default();
    // Read while the receiver waits for its stdin to close: when it exits,
    // its namespace and the veth pair go.
    let drops = netem_drops(HOST_DEV);
    let qdisc = capture("tc", &["-s", "qdisc", "show", "dev", HOST_DEV]);
    drop(child.stdin.take());
    let status = child.wait().expect("receiver exit");
    let _ = Command::new("ip").args(["link", "del", HOST_DEV]).output();
    println!(
        "{verdict}; netem dropped {drops} on the sender's side; {MESSAGES} messages in {:?}",
        start.elapsed()
    );
    assert!(status.success(), "receiver failed: {status}");
    assert!(verdict.contains(&format!("{MESSAGES} received, 0 bad")), "{verdict}");
    assert!(drops > 0, "netem dropped nothing on the sender's side: the link was not impaired\n{qdisc}");
}
