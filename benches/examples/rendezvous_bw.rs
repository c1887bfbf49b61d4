//! Rendezvous throughput over `rc://`, one process, inside the Soft-RoCE
//! guest: messages of the given sizes, every one by rendezvous (the eager
//! limit is 4 KiB), streamed from one connection end to the other.
//!
//! ```text
//! cargo build --release -p zerocast-benches --features rdma --example rendezvous_bw
//! scripts/softroce-run target/release/examples/rendezvous_bw 65536 1048576 16777216
//! ```
//!
//! Prints one line per size: the size, the messages timed and MiB/s, from
//! the first send to the last receive. Build it from two commits and run
//! the two binaries alternately in one guest session to compare them.

use std::thread;
use std::time::Instant;

use zerocast::rdma::RcConfig;
use zerocast::{Config, LinkConfig, Zerocast};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), BoxError> {
    let sizes: Vec<usize> = std::env::args().skip(1).map(|s| s.parse()).collect::<Result<_, _>>()?;
    if sizes.is_empty() {
        return Err("usage: rendezvous_bw SIZE...".into());
    }
    let addr = std::env::var("ZEROCAST_RDMA_ADDR").unwrap_or_else(|_| "10.0.2.15".to_owned());
    let max = *sizes.iter().max().unwrap_or(&0) as u64;
    let link = LinkConfig::default().with_max_payload(max.max(1 << 20));
    let zc = Zerocast::with_config(
        Config::default().with_link(link).with_rc(RcConfig::default().with_eager_limit(4096)),
    );
    let listener = zc.listen(&format!("rc://{addr}:0"))?;
    let at = listener.local_endpoint().to_string();
    let zc2 = zc.clone();
    let client = thread::spawn(move || zc2.connect(&at));
    let server = listener.accept()?;
    let client = client.join().map_err(|_| "connect thread panicked")??;
    for size in sizes {
        // About 256 MiB per size, at least 16 messages; 4 more warm up.
        let n = ((256usize << 20) / size).clamp(16, 20_000) as u64;
        let tx = client.clone();
        let start = Instant::now();
        let sender = thread::spawn(move || -> Result<(), BoxError> {
            for i in 0..n + 4 {
                let mut buf = tx.alloc(size)?;
                buf[..8].copy_from_slice(&i.to_le_bytes());
                tx.send(buf).map_err(|e| e.to_string())?;
            }
            Ok(())
        });
        let mut timed_from = start;
        for i in 0..n + 4 {
            let m = server.recv()?;
            if i == 3 {
                timed_from = Instant::now();
            }
            if m.len() != size || m[..8] != i.to_le_bytes() {
                return Err(format!("message {i} of {size} bytes arrived wrong").into());
            }
        }
        let secs = timed_from.elapsed().as_secs_f64();
        sender.join().map_err(|_| "sender panicked")??;
        let mib = n as f64 * size as f64 / (1 << 20) as f64 / secs;
        println!("{size} {n} {mib:.1}");
    }
    Ok(())
}
