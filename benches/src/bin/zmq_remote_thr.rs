//! ZeroMQ's throughput method, sending side, as libzmq's own
//! `perf/remote_thr` sends: one context with one I/O thread, a PUSH socket
//! connected to `CONNECT` with default options, a fresh message of `SIZE`
//! bytes per send, `COUNT` sends, then close (which lingers until every
//! message is out).
//!
//! `zmq_remote_thr CONNECT SIZE COUNT`.

use std::process::ExitCode;

fn main() -> ExitCode {
    zerocast_benches::thr_main("zmq_remote_thr", "CONNECT-TO", |connect, size, count| {
        let ctx = zmq::Context::new();
        let s = ctx.socket(zmq::PUSH)?;
        s.connect(connect)?;
        for _ in 0..count {
            s.send(zmq::Message::with_size(size), 0)?;
        }
        Ok(())
    })
}
