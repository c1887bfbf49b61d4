//! The RDMA examples run as the programs they reproduce: a server process
//! and a client process, whose printed lines are checked.
//!
//! The example binaries are the ones `cargo test --features rdma` builds
//! next to this test (`target/<profile>/examples/`). The tests need a verbs
//! device: they are ignored on a plain `cargo test`; `scripts/test` runs
//! them inside the Soft-RoCE guest.

#![cfg(feature = "rdma")]
#![forbid(unsafe_code)]

mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::example;

/// How long one example process may run.
const LIMIT: Duration = Duration::from_secs(60);

/// The address rxe0 is bound to in the guest.
fn addr() -> String {
    std::env::var("ZEROCAST_RDMA_ADDR").unwrap_or_else(|_| "10.0.2.15".to_owned())
}

/// A running example: its stdout lines arrive on `lines`.
struct Proc {
    name: &'static str,
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Proc {
    fn spawn(name: &'static str, args: &[&str]) -> Self {
        let mut child = Command::new(example(name))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { name, child, lines, seen: Vec::new() }
    }

    /// Wait for a line that starts with `prefix`; returns it.
    fn expect_line(&mut self, prefix: &str) -> String {
        let deadline = Instant::now() + LIMIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    println!("{}: {line}", self.name);
                    self.seen.push(line.clone());
                    if line.starts_with(prefix) {
                        return line;
                    }
                }
                Err(_) => {
                    let _ = self.child.kill();
                    let stderr = self.stderr();
                    panic!(
                        "{}: no line starting {prefix:?}; printed {:?}; stderr: {stderr}",
                        self.name, self.seen
                    )
                }
            }
        }
    }

    fn stderr(&mut self) -> String {
        let mut s = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut s);
        }
        s
    }

    /// Wait for the process to exit successfully, and return every line it printed.
    fn finish(mut self) -> Vec<String> {
        let deadline = Instant::now() + LIMIT;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("{} did not exit within {LIMIT:?}; printed {:?}", self.name, self.seen);
            }
            thread::sleep(Duration::from_millis(20));
        };
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            println!("{}: {line}", self.name);
            self.seen.push(line);
        }
        let stderr = self.stderr();
        assert!(
            status.success(),
            "{} failed ({status}); printed {:?}; stderr: {stderr}",
            self.name,
            self.seen
        );
        self.seen
    }
}

/// Assert that `lines` holds `expected` as a subsequence, each a prefix of its line.
fn assert_in_order(who: &str, lines: &[String], expected: &[&str]) {
    let mut it = lines.iter();
    for want in expected {
        assert!(it.any(|l| l.starts_with(want)), "{who}: no {want:?} (in order) in {lines:?}");
    }
}

/// The port number at the end of a "... port N..." line.
fn port_in(line: &str) -> String {
    let digits: String =
        line.rsplit("port ").next().unwrap_or_default().chars().take_while(char::is_ascii_digit).collect();
    assert!(!digits.is_empty(), "no port in {line:?}");
    digits
}

/// `verbs_oob`: the server (no host) posts a send over `rc+oob://`, the
/// client (given the host) receives it.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn verbs_oob_server_sends_to_client() {
    let mut server = Proc::spawn("verbs_oob", &["-p", "0"]);
    let port = port_in(&server.expect_line("start to listen on port "));
    let client = Proc::spawn("verbs_oob", &["-p", &port, &addr()]);
    let client_lines = client.finish();
    let server_lines = server.finish();
    assert_in_order(
        "server",
        &server_lines,
        &[
            "[OK] open device ",
            "[OK] query port ",
            "start to listen on port ",
            "successfully accept client, rc+oob://",
            "[OK] create qp.",
            "[OK] modify qp to INIT state.",
            "[OK] modify qp to RTR state.",
            "[OK] modify qp to RTS state.",
            "[OK] reg mr.",
            "[OK] post send.",
            "[OK] poll cq: send completed.",
            "[OK] destroy qp.",
        ],
    );
    assert_in_order(
        "client",
        &client_lines,
        &[
            "[OK] open device ",
            &format!("successfully connect to server, ip: {}, port: {port}", addr()),
            "[OK] modify qp to RTS state.",
            "[OK] post recv.",
            "[OK] poll cq.",
            "\tbuf: hello from server",
            "[OK] destroy qp.",
        ],
    );
}

/// `rdma_cm_server` and `rdma_cm_client` print the tutorial's lines, each
/// side's message carrying the other process's pid.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn rdma_cm_server_and_client() {
    let mut server = Proc::spawn("rdma_cm_server", &["0"]);
    let port = port_in(&server.expect_line("listening on port "));
    let client = Proc::spawn("rdma_cm_client", &[&addr(), &port]);
    let client_pid = client.child.id();
    let server_pid = server.child.id();
    let client_lines = client.finish();
    let server_lines = server.finish();
    assert_in_order(
        "server",
        &server_lines,
        &[
            "listening on port ",
            "received connection request.",
            &format!("received message: message from active/client side with pid {client_pid}"),
            "connected. posting send...",
            "send completed successfully.",
            "peer disconnected.",
        ],
    );
    assert_in_order(
        "client",
        &client_lines,
        &[
            "address resolved.",
            "route resolved.",
            "connected. posting send...",
            "send completed successfully.",
            &format!("received message: message from passive/server side with pid {server_pid}"),
            "disconnected.",
        ],
    );
}
