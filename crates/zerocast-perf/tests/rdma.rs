//! zerocast-perf over RDMA RC: a server process and a client process,
//! inside the Soft-RoCE guest (`scripts/test` runs the ignored tests there).

#![cfg(feature = "rdma")]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

fn addr() -> String {
    std::env::var("ZEROCAST_RDMA_ADDR").unwrap_or_else(|_| "10.0.2.15".to_owned())
}

/// A server bound to the RDMA address on a free control port, and that port.
fn server() -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_zerocast-perf"))
        .args(["-p", "0", "--bind", &addr()])
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the server");
    let mut line = String::new();
    BufReader::new(child.stderr.take().unwrap()).read_line(&mut line).unwrap();
    assert!(line.contains("listening on tcp://"), "{line}");
    let port = line.trim().rsplit(':').next().unwrap().to_owned();
    (child, port)
}

/// Run a client against a fresh server (a server serves one client), and
/// check that the server exits cleanly after it.
fn client(mode: &str, args: &[&str]) -> Value {
    let (mut srv, port) = server();
    let host = addr();
    let args: Vec<&str> = [mode, &host, "-p", &port].into_iter().chain(args.iter().copied()).collect();
    let args = &args[..];
    let out = Command::new(env!("CARGO_BIN_EXE_zerocast-perf")).args(args).output().expect("run the client");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{args:?}: {}\n{stdout}\n{stderr}", out.status);
    let status = srv.wait().unwrap();
    assert!(status.success(), "the server exits cleanly after its client: {status}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn perf_server_and_client_over_rc() {
    // bw over rc:// (rdma_cm) and rc+oob://, then lat with busy polling, typed.
    let bw = client(
        "bw",
        &["--transport", "rc,rc+oob", "-s", "4K", "-n", "2000", "--inflight", "32", "--json", "-q"],
    );
    let runs = bw["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for (run, t) in runs.iter().zip(["rc", "rc+oob"]) {
        assert_eq!(run["transport"], t);
        let r = &run["results"][0];
        assert_eq!(
            (r["bytes"].as_u64(), r["iterations"].as_u64(), r["lost"].as_u64()),
            (Some(4096), Some(2000), Some(0))
        );
        let (avg, peak) = (r["bw_avg_gbps"].as_f64().unwrap(), r["bw_peak_gbps"].as_f64().unwrap());
        assert!(avg > 0.0 && peak >= avg, "{r}");
        let secs = r["seconds"].as_f64().unwrap();
        assert!((avg * 1e9 * secs / 8.0 - 2000.0 * 4096.0).abs() < 4096.0 * 20.0, "bw × time = bytes: {r}");
    }
    let lat = client(
        "lat",
        &["--transport", "rc", "-s", "64", "-n", "300", "--poll", "busy", "--typed", "--json", "-q"],
    );
    let r = &lat["runs"][0]["results"][0];
    assert_eq!(r["iterations"], 300);
    let f = |k: &str| r[k].as_f64().unwrap();
    assert!(
        f("t_min_us") > 0.0 && f("t_min_us") <= f("t_typical_us") && f("t_typical_us") <= f("p99_us"),
        "{r}"
    );
    assert!(f("p99_us") <= f("p999_us") && f("p999_us") <= f("t_max_us"), "{r}");
}
