//! The batched raw socket, receiving side, measured the way libzmq's
//! `perf/local_thr` measures ZeroMQ: a TCP listener bound at `BIND`
//! (`host:port`), one connection with `TCP_NODELAY`, frames (an 8-byte
//! length, then the payload) read through a 64 KiB `BufReader` into one
//! reused buffer; the clock starts at the first message and stops at the
//! last. Each message's sequence number is checked.
//!
//! `raw_local_thr BIND SIZE COUNT` prints `mean throughput: N [msg/s]`.

use std::io::BufReader;
use std::net::TcpListener;
use std::process::ExitCode;

use zerocast_benches::{local_thr, mask, read_frame, stamp_of, thr_main, ThrError, RAW_PREFIX, WRITE_BATCH};

fn main() -> ExitCode {
    thr_main("raw_local_thr", "BIND-TO", run)
}

fn run(bind: &str, size: usize, count: u64) -> Result<(), ThrError> {
    let (conn, _) = TcpListener::bind(bind)?.accept()?;
    conn.set_nodelay(true)?;
    let mut r = BufReader::with_capacity(WRITE_BATCH, conn);
    let (mut prefix, mut payload) = ([0u8; RAW_PREFIX], vec![0u8; size]);
    local_thr(size, count, |seq| {
        read_frame(&mut r, &mut prefix, &mut payload)?;
        if stamp_of(&payload) != seq & mask(size) {
            return Err(format!("message {seq} out of order").into());
        }
        Ok(())
    })
}
