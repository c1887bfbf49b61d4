//! ZeroMQ's throughput method, receiving side, as libzmq's own
//! `perf/local_thr` measures it: one context with one I/O thread, a PULL
//! socket bound at `BIND` with default options, one reused message; the
//! clock starts at the first message and stops at the last.
//!
//! `zmq_local_thr BIND SIZE COUNT` prints `mean throughput: N [msg/s]`.

use std::process::ExitCode;

use zerocast_benches::{local_thr, thr_main, ThrError};

fn main() -> ExitCode {
    thr_main("zmq_local_thr", "BIND-TO", run)
}

fn run(bind: &str, size: usize, count: u64) -> Result<(), ThrError> {
    let ctx = zmq::Context::new();
    let s = ctx.socket(zmq::PULL)?;
    s.bind(bind)?;
    let mut msg = zmq::Message::new();
    local_thr(size, count, |_| {
        s.recv(&mut msg, 0)?;
        if msg.len() != size {
            return Err(format!("message of {} bytes, not {size}", msg.len()).into());
        }
        Ok(())
    })
}
