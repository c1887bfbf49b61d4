//! zerocast-perf as a user runs it: loopback tables and JSON with sane
//! figures, a separate server process, and clear errors on bad input.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStderr, Command, Output, Stdio};

use serde_json::Value;

fn perf(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zerocast-perf")).args(args).output().expect("run zerocast-perf")
}

fn ok(args: &[&str]) -> String {
    let out = perf(args);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{args:?} failed ({}):\n{stdout}\n{stderr}", out.status);
    stdout.into_owned()
}

/// The rows under the table header that starts with `#bytes`, as numbers.
fn rows(table: &str) -> Vec<Vec<f64>> {
    let mut lines = table.lines().skip_while(|l| !l.trim_start().starts_with("#bytes")).skip(1);
    let mut rows = Vec::new();
    for l in lines.by_ref() {
        if l.starts_with("---") {
            break;
        }
        rows.push(
            l.split_whitespace().map(|c| c.parse().unwrap_or_else(|_| panic!("`{c}` in `{l}`"))).collect(),
        );
    }
    rows
}

fn check_bw_row(r: &[f64], bytes: f64, iters: f64) {
    assert_eq!(r.len(), 5, "{r:?}");
    let (b, n, peak, avg, mpps) = (r[0], r[1], r[2], r[3], r[4]);
    assert_eq!((b, n), (bytes, iters));
    assert!(avg > 0.0 && avg < 10_000.0, "BW average {avg} Gb/s");
    assert!(peak >= avg * 0.99, "peak {peak} below average {avg}");
    // MsgRate and BW average describe the same run.
    let from_bw = avg * 1e9 / (8.0 * bytes) / 1e6;
    assert!((mpps - from_bw).abs() <= from_bw * 0.02 + 1e-6, "MsgRate {mpps} vs {from_bw} from BW");
}

#[test]
fn loopback_with_no_other_argument_runs_bw_over_tcp() {
    let out = ok(&["--loopback", "-q"]);
    assert!(out.contains("Send BW") && out.contains("Transport       : tcp"), "{out}");
    assert!(out.contains("#bytes     #iterations    BW peak[Gb/s]    BW average[Gb/s]   MsgRate[Mpps]"));
    let rows = rows(&out);
    assert_eq!(rows.len(), 1, "{out}");
    check_bw_row(&rows[0], 65536.0, 5000.0);
}

#[test]
fn loopback_bw_table_per_transport() {
    let out = ok(&["bw", "--loopback", "-s", "4K", "-n", "3000", "--transport", "tcp,mem"]);
    assert_eq!(out.matches("#bytes").count(), 2, "{out}");
    for table in out.split("Send BW Test").skip(1) {
        let rows = rows(table);
        assert_eq!(rows.len(), 1);
        check_bw_row(&rows[0], 4096.0, 3000.0);
    }
}

#[test]
fn loopback_lat_table_is_ordered() {
    let out = ok(&["lat", "--loopback", "-s", "64", "-n", "400"]);
    assert!(out.contains("t_min[usec]") && out.contains("99.9% percentile[usec]"), "{out}");
    let rows = rows(&out);
    assert_eq!(rows.len(), 1);
    let r = &rows[0];
    assert_eq!(r.len(), 9, "{r:?}");
    let (min, max, typical, avg, stdev, p99, p999) = (r[2], r[3], r[4], r[5], r[6], r[7], r[8]);
    assert_eq!((r[0], r[1]), (64.0, 400.0));
    assert!(min > 0.0 && min < 100_000.0, "t_min {min} us");
    assert!(min <= typical && typical <= p99 && p99 <= p999 && p999 <= max, "{r:?}");
    assert!(min <= avg && avg <= max && stdev >= 0.0, "{r:?}");
}

#[test]
fn rate_json_over_tcp_and_mem_busy_polling() {
    let out =
        ok(&["rate", "--loopback", "-n", "20000", "--transport", "tcp,mem", "--poll", "busy", "--json"]);
    let doc: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(doc["tool"], "zerocast-perf");
    let runs = doc["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for (run, t) in runs.iter().zip(["tcp", "mem"]) {
        assert_eq!(
            (run["mode"].as_str(), run["transport"].as_str(), run["poll"].as_str()),
            (Some("rate"), Some(t), Some("busy"))
        );
        let r = &run["results"][0];
        assert_eq!(
            (r["bytes"].as_u64(), r["iterations"].as_u64(), r["lost"].as_u64()),
            (Some(64), Some(20000), Some(0))
        );
        let (mpps, secs) = (r["msg_rate_mpps"].as_f64().unwrap(), r["seconds"].as_f64().unwrap());
        assert!(mpps > 0.0 && secs > 0.0);
        assert!((mpps * 1e6 * secs - 20000.0).abs() < 200.0, "rate × time = messages: {r}");
    }
}

#[test]
fn lat_spread_under_each_row_with_h_and_always_in_json() {
    let out = ok(&["lat", "--loopback", "-s", "64", "-n", "400", "-H", "--transport", "tcp,mem"]);
    let spreads: Vec<&str> = out.lines().filter(|l| l.trim_start().starts_with("spread[usec]:")).collect();
    assert_eq!(spreads.len(), 2, "one per transport: {out}");
    for (table, line) in out.split("Send Latency Test").skip(1).zip(&spreads) {
        let typical = {
            let lines = table.lines().skip_while(|l| !l.trim_start().starts_with("#bytes")).nth(1).unwrap();
            lines.split_whitespace().nth(4).unwrap().parse::<f64>().unwrap()
        };
        let at: Vec<(String, f64)> = line
            .split_whitespace()
            .skip(1)
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap_or_else(|| panic!("`{kv}` in `{line}`"));
                (k.to_owned(), v.parse().unwrap())
            })
            .collect();
        let names: Vec<&str> = at.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["p5", "p10", "p25", "p50", "p75", "p90", "p95"], "{line}");
        assert!(at.windows(2).all(|w| w[0].1 <= w[1].1), "in order: {line}");
        assert_eq!(at[3].1, typical, "p50 is t_typical: {line} / {table}");
    }
    // Without -H the table has no such line; JSON always has the spread.
    assert!(!ok(&["lat", "--loopback", "-s", "64", "-n", "200"]).contains("spread"));
    let doc: Value =
        serde_json::from_str(&ok(&["lat", "--loopback", "-s", "64", "-n", "200", "--json"])).unwrap();
    let r = &doc["runs"][0]["results"][0];
    let spread: Vec<f64> = r["spread_us"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    assert_eq!(spread.len(), 7, "{r}");
    assert_eq!(spread[3], r["t_typical_us"].as_f64().unwrap(), "{r}");
}

#[test]
fn lat_samples_are_timed_by_the_cycle_counter_unless_asked_otherwise() {
    let counter = cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));
    let default = if counter { "cycles" } else { "monotonic" };
    for (args, clock) in [(&[][..], default), (&["--clock", "monotonic"][..], "monotonic")] {
        let mut all = vec!["lat", "--loopback", "-s", "64", "-n", "300", "--json"];
        all.extend_from_slice(args);
        let doc: Value = serde_json::from_str(&ok(&all)).unwrap();
        let run = &doc["runs"][0];
        assert_eq!(run["clock"], clock, "{run}");
        let r = &run["results"][0];
        let (min, typical, max) = (
            r["t_min_us"].as_f64().unwrap(),
            r["t_typical_us"].as_f64().unwrap(),
            r["t_max_us"].as_f64().unwrap(),
        );
        // A loopback round trip over TCP: microseconds, not nanoseconds or seconds.
        assert!(0.1 < min && min <= typical && typical <= max && typical < 100_000.0, "{clock}: {r}");
    }
    let table = ok(&["lat", "--loopback", "-s", "64", "-n", "100", "--clock", "monotonic"]);
    assert!(table.contains("Clock           : the monotonic clock"), "{table}");
    let doc: Value = serde_json::from_str(&ok(&["bw", "--loopback", "-n", "100", "--json"])).unwrap();
    assert!(doc["runs"][0].get("clock").is_none(), "bandwidth is timed by the run, not per sample");
}

#[test]
fn typed_bw_and_lat() {
    let out = ok(&["bw", "--loopback", "--typed", "-s", "1K", "-n", "2000", "--json"]);
    let doc: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["runs"][0]["typed"], true);
    assert!(doc["runs"][0]["results"][0]["bw_avg_gbps"].as_f64().unwrap() > 0.0);
    let out = ok(&["lat", "--loopback", "--typed", "-s", "3", "-n", "300"]);
    assert!(out.contains("typed Sender<T>"), "{out}");
    assert_eq!(rows(&out)[0][..2], [3.0, 300.0]);
}

#[test]
fn async_bw_and_lat_over_tcp_and_mem() {
    let out =
        ok(&["bw", "--loopback", "--async", "--transport", "tcp,mem", "-s", "64", "-n", "5000", "--json"]);
    let doc: Value = serde_json::from_str(&out).unwrap();
    for run in doc["runs"].as_array().unwrap() {
        assert_eq!(run["async_api"], true, "{run}");
        let r = &run["results"][0];
        assert_eq!(r["iterations"], 5000, "{run}");
        assert!(r["msg_rate_mpps"].as_f64().unwrap() > 0.0, "{run}");
    }
    assert_eq!(doc["runs"].as_array().unwrap().len(), 2);
    let out = ok(&["lat", "--loopback", "--async", "-s", "64", "-n", "300"]);
    assert_eq!(rows(&out)[0][..2], [64.0, 300.0]);
}

#[test]
fn sweep_writes_json_and_a_plot() {
    let dir = std::env::temp_dir().join(format!("zerocast-perf-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("lat.svg");
    let out = ok(&[
        "lat",
        "--loopback",
        "-a",
        "-n",
        "20",
        "--transport",
        "mem,tcp",
        "--json",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    let doc: Value = serde_json::from_str(&out).unwrap();
    for run in doc["runs"].as_array().unwrap() {
        let sizes: Vec<u64> =
            run["results"].as_array().unwrap().iter().map(|r| r["bytes"].as_u64().unwrap()).collect();
        assert_eq!(sizes, (1..=23).map(|i| 1u64 << i).collect::<Vec<_>>());
    }
    let text = std::fs::read_to_string(&svg).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        text.starts_with("<svg")
            && text.contains("\nmem\n")
            && text.contains("\ntcp\n")
            && text.contains("\n8M\n")
    );
}

#[test]
fn datagrams_report_what_arrived() {
    let out = ok(&["--loopback", "--transport", "ud", "-s", "512", "-n", "2000", "--json"]);
    let doc: Value = serde_json::from_str(&out).unwrap();
    let r = &doc["runs"][0]["results"][0];
    let lost = r["lost"].as_u64().unwrap();
    assert!(lost < 2000, "some datagrams must arrive: {r}");
    let delivered = (2000 - lost) as f64;
    let secs = r["seconds"].as_f64().unwrap();
    assert!((r["msg_rate_mpps"].as_f64().unwrap() * 1e6 * secs - delivered).abs() < 2.0, "{r}");
}

/// A server process on a free port of 127.0.0.1: the process, the rest of
/// its stderr, and its port.
fn server() -> (Child, BufReader<ChildStderr>, String) {
    let mut server = Command::new(env!("CARGO_BIN_EXE_zerocast-perf"))
        .args(["-p", "0", "--bind", "127.0.0.1"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(server.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    assert!(line.contains("listening on tcp://127.0.0.1:"), "{line}");
    let port = line.trim().rsplit(':').next().unwrap().to_owned();
    (server, stderr, port)
}

#[test]
fn a_separate_server_process_serves_one_client() {
    let (mut server, _stderr, port) = server();
    let out = ok(&["lat", "127.0.0.1", "-p", &port, "-n", "200", "-s", "2K", "--json"]);
    let doc: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["runs"][0]["results"][0]["iterations"], 200);
    let status = server.wait().unwrap();
    assert!(status.success(), "the server exits cleanly after its client: {status}");
}

#[test]
fn a_peer_that_does_not_speak_zerocast_is_not_the_client() {
    let (mut server, _stderr, port) = server();
    // Bytes that are no zerocast handshake, then a peer that says nothing:
    // the listener skips both (they are counted, not reported).
    let mut junk = std::net::TcpStream::connect(format!("127.0.0.1:{port}")).unwrap();
    std::io::Write::write_all(&mut junk, &[0xAA; 512]).unwrap();
    let silent = std::net::TcpStream::connect(format!("127.0.0.1:{port}")).unwrap();
    // The server is still there, for a real client.
    let out = ok(&["127.0.0.1", "-p", &port, "-n", "500", "-s", "64", "--json"]);
    let doc: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["runs"][0]["results"][0]["iterations"], 500);
    let status = server.wait().unwrap();
    assert!(status.success(), "the server exits cleanly after its client: {status}");
    drop((junk, silent));
}

#[test]
fn transports_are_listed_with_their_backend() {
    let out = ok(&["--list-transports"]);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines.contains(&"tcp\ttcp"), "{out}");
    let (rc, ud) = if cfg!(feature = "rdma") {
        ("rc\trdma", "ud\trdma UD on an RDMA device's address, udp elsewhere")
    } else {
        ("rc\tnot built in", "ud\tudp")
    };
    assert!(lines.iter().any(|l| l.starts_with(rc)), "{out}");
    assert!(lines.contains(&ud), "{out}");
}

fn fails(args: &[&str], code: i32, says: &str) {
    let out = perf(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
    assert!(stderr.contains(says), "{args:?}: expected `{says}` in:\n{stderr}");
    assert!(rows(&String::from_utf8_lossy(&out.stdout)).is_empty(), "{args:?}: no result rows");
}

#[test]
fn bad_arguments_are_clear_errors() {
    // Rejected while parsing the command line (clap: exit 2).
    fails(&["--loopback", "-s", "0"], 2, "outside 1..=8388608");
    fails(&["--loopback", "-s", "9M"], 2, "outside 1..=8388608");
    fails(&["--loopback", "-s", "12Q"], 2, "unknown size suffix");
    fails(&["--loopback", "--transport", "bogus"], 2, "unknown transport scheme `bogus`");
    fails(&["--loopback", "--transport", "tcp://h:1?window=8"], 2, "--inflight");
    fails(&["--loopback", "--poll", "sometimes"], 2, "invalid value 'sometimes'");
    fails(&["lat", "--loopback", "--clock", "sundial"], 2, "invalid value 'sundial'");
    fails(&["--loopback", "-n", "5", "-D", "1"], 2, "cannot be used with");
    fails(&["--loopback", "-a", "-s", "64"], 2, "cannot be used with");
    fails(&["--loopback", "--inflight", "2"], 2, "--inflight");
    fails(&["--loopback", "-D", "-1"], 2, "-1");
    // A mode after an option reads as HOST to clap; it is named instead.
    fails(&["--loopback", "lat", "-s", "1"], 2, "`lat` is a mode, and a mode goes first");
    fails(&["-p", "1", "rate"], 2, "`rate` is a mode, and a mode goes first");
    // Rejected when planned or run (exit 1).
    fails(&["--transport", "mem", "127.0.0.1"], 1, "in-process only: use it with --loopback");
    fails(&["lat", "--loopback", "--transport", "ud"], 1, "not lat");
    fails(&["--loopback", "--transport", "ud", "--typed"], 1, "--typed needs a connection");
    fails(&["--loopback", "--transport", "ud", "-s", "1M"], 1, "above the largest datagram");
    fails(&["127.0.0.1", "-p", "1"], 1, "cannot reach a zerocast-perf server at tcp://127.0.0.1:1");
    #[cfg(not(feature = "rdma"))]
    fails(&["--loopback", "--transport", "rc"], 1, "build it with `--features rdma`");
}
