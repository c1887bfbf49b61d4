//! The `poll_server` example runs as a user runs it: 300 clients over
//! `tcp://` and `mem://`, every reply checked by the example itself, and a
//! thread count that does not grow with the clients.
//!
//! The example binary is the one `cargo test` builds next to this test
//! (`target/<profile>/examples/`).

#![forbid(unsafe_code)]

mod common;

use std::process::Command;

use common::example;

#[test]
fn poll_server_serves_300_clients_on_two_threads() {
    for uri in ["tcp://127.0.0.1:0", "mem://poll-server-test"] {
        let out =
            Command::new(example("poll_server")).args(["300", uri]).output().expect("running poll_server");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{uri}: {}\n{stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("300 clients x 20 pings") && stdout.contains("every reply right"),
            "{uri}: {stdout}"
        );
        // Main, two serving threads, the engine.
        assert!(stdout.contains(" 4 threads in this process"), "{uri}: {stdout}");
    }
}
