//! ZeroMQ's throughput method, receiving side, as libzmq's own
//! `perf/local_thr` measures it: one context with one I/O thread, a PULL
//! socket bound at `BIND` with default options, one reused message; the
//! clock starts at the first message and stops at the last.
//!
//! `zmq_local_thr BIND SIZE COUNT` prints `mean throughput: N [msg/s]`.

use std::process::ExitCode;
use std::time::Instant;

fn main() -> ExitCode {
    let (bind, size, count) = zerocast_benches::thr_args("zmq_local_thr", "BIND-TO");
    match run(&bind, size, count) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("zmq_local_thr: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(bind: &str, size: usize, count: u64) -> Result<(), Box<dyn std::error::Error>> {
    let ctx = zmq::Context::new();
    let s = ctx.socket(zmq::PULL)?;
    s.bind(bind)?;
    let mut msg = zmq::Message::new();
    let recv = |msg: &mut zmq::Message| -> Result<(), Box<dyn std::error::Error>> {
        s.recv(msg, 0)?;
        if msg.len() != size {
            return Err(format!("message of {} bytes, not {size}", msg.len()).into());
        }
        Ok(())
    };
    recv(&mut msg)?;
    let start = Instant::now();
    for _ in 1..count {
        recv(&mut msg)?;
    }
    let elapsed = start.elapsed().as_micros().max(1) as f64;
    let throughput = count as f64 / elapsed * 1e6;
    println!("message size: {size} [B]");
    println!("message count: {count}");
    println!("mean throughput: {} [msg/s]", throughput as u64);
    println!("mean throughput: {:.3} [Mb/s]", throughput * size as f64 * 8.0 / 1e6);
    Ok(())
}
