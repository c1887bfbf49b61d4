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
use std::time::Instant;

use zerocast_benches::{read_frame, stamp_of, RAW_PREFIX, WRITE_BATCH};

fn main() -> ExitCode {
    let (bind, size, count) = zerocast_benches::thr_args("raw_local_thr", "BIND-TO");
    match run(&bind, size, count) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("raw_local_thr: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(bind: &str, size: usize, count: u64) -> Result<(), Box<dyn std::error::Error>> {
    let (conn, _) = TcpListener::bind(bind)?.accept()?;
    conn.set_nodelay(true)?;
    let mut r = BufReader::with_capacity(WRITE_BATCH, conn);
    let (mut prefix, mut payload) = ([0u8; RAW_PREFIX], vec![0u8; size]);
    let mut recv = |seq: u64| -> Result<(), Box<dyn std::error::Error>> {
        read_frame(&mut r, &mut prefix, &mut payload)?;
        let mask = zerocast_benches::mask(size);
        if stamp_of(&payload) != seq & mask {
            return Err(format!("message {seq} out of order").into());
        }
        Ok(())
    };
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
