//! What the two-process throughput tools share, the tools that measure the
//! way libzmq's `perf/local_thr` and `perf/remote_thr` do
//! (`zmq_local_thr`/`zmq_remote_thr` and the raw socket's
//! `raw_local_thr`/`raw_remote_thr`): their command line, their exit, and
//! the receiving side's clock and report.

use std::process::ExitCode;
use std::time::Instant;

/// A tool's error.
pub type ThrError = Box<dyn std::error::Error>;

/// `ENDPOINT SIZE COUNT` from the command line. Exits with status 2 and a
/// message on anything else.
fn thr_args(tool: &str, endpoint: &str) -> (String, usize, u64) {
    let args: Vec<String> = std::env::args().collect();
    let [_, at, size, count] = &args[..] else {
        eprintln!("usage: {tool} {endpoint} MESSAGE-SIZE MESSAGE-COUNT");
        std::process::exit(2);
    };
    match (size.parse(), count.parse::<u64>()) {
        (Ok(size), Ok(count)) => (at.clone(), size, count.max(1)),
        _ => {
            eprintln!("{tool}: MESSAGE-SIZE and MESSAGE-COUNT must be numbers");
            std::process::exit(2);
        }
    }
}

/// A tool's `main`: `run` on the command line's `ENDPOINT SIZE COUNT`
/// (exit status 2 on a malformed one); on an error, the error and exit
/// status 1.
pub fn thr_main(
    tool: &str,
    endpoint: &str,
    run: impl FnOnce(&str, usize, u64) -> Result<(), ThrError>,
) -> ExitCode {
    let (at, size, count) = thr_args(tool, endpoint);
    match run(&at, size, count) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{tool}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The receiving side's loop, as `perf/local_thr` times it: `recv(seq)`
/// takes message `seq`, `count` times; the clock starts at the first
/// message and stops at the last. Prints `mean throughput: N [msg/s]`
/// (what the scripts read) and the rest of libzmq's report.
pub fn local_thr(
    size: usize,
    count: u64,
    mut recv: impl FnMut(u64) -> Result<(), ThrError>,
) -> Result<(), ThrError> {
    recv(0)?;
    let start = Instant::now();
    for seq in 1..count {
        recv(seq)?;
    }
    let elapsed = start.elapsed().as_micros().max(1) as f64;
    let throughput = count as f64 / elapsed * 1e6;
    println!("message size: {size} [B]");
    println!("message count: {count}");
    println!("mean throughput: {} [msg/s]", throughput as u64);
    println!("mean throughput: {:.3} [Mb/s]", throughput * size as f64 * 8.0 / 1e6);
    Ok(())
}
