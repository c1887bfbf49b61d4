//! zerocast-perf: bandwidth, latency and message rate of zerocast
//! transports, in the shape of perftest's `ib_send_bw` / `ib_send_lat`.
//!
//! Without a host it is the server; with one it is the client, which sends
//! each test's whole description to the server, so the server needs no
//! matching options. `--loopback` runs both in this process over
//! `tcp://127.0.0.1` (or any transport given), which needs no setup.
//!
//! A stream (`bw`, `rate`) sends two windows of untimed messages first,
//! then the timed ones; its time is the server's, from the arrival of the
//! first timed message to the end of the stream, as ZeroMQ's `local_thr`
//! times its receiver. The peak is the sender's best slice of the run.
//!
//! It does **not** tune the machine (CPU pinning, frequency, IRQs) or
//! report absolute figures as anything but what this run measured.

#![forbid(unsafe_code)]

mod cli;
mod client;
mod clock;
mod data;
mod open;
mod plot;
mod progress;
mod report;
mod server;
mod spec;
mod stats;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args = cli::parse();
    match cli::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("zerocast-perf: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
