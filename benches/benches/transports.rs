//! Every transport side by side, one-way streaming throughput at 64 B,
//! 4 KiB, 64 KiB and 1 MiB on loopback: zerocast over `mem://`, `tcp://` and
//! `ud://` (UDP, up to the largest datagram), raw and typed, against
//! socket2 TCP written by hand (one `write` per message, and batched) and
//! ZeroMQ PUSH/PULL (feature `zeromq`).
//!
//! ```text
//! cargo bench -p zerocast-benches --bench transports --features zeromq
//! cargo bench -p zerocast-benches --bench transports -- 64KiB
//! ```
//!
//! With the `rdma` feature and `ZEROCAST_RDMA_ADDR` set (the Soft-RoCE
//! guest sets it), `rc://` and `rc+oob://` pairs on that address join in:
//! see "RDMA in the Soft-RoCE guest" in BENCHMARKS.md.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use zerocast::datagram::MAX_DATAGRAM;
use zerocast_benches::{
    link_for, msgs_per_batch, run, Baseline, BoxError, Pipe, RawPipe, TypedBytesPipe, UdpPipe, ZcPipe,
};

const SIZES: [usize; 4] = [64, 4096, 65_536, 1 << 20];

fn label(size: usize) -> String {
    match size {
        s if s >= 1 << 20 => format!("{}MiB", s >> 20),
        s if s >= 1024 => format!("{}KiB", s >> 10),
        s => format!("{s}B"),
    }
}

type Make = fn(usize, u64) -> Result<Box<dyn Pipe>, BoxError>;

/// Every contender: its name, and how to build its pipe for a size (or not,
/// for a size it cannot carry).
fn contenders() -> Vec<(&'static str, Make)> {
    #[cfg_attr(not(feature = "zeromq"), allow(unused_mut))]
    let mut v: Vec<(&'static str, Make)> = vec![
        ("zc_mem_raw", |s, n| Ok(Box::new(ZcPipe::with_link("mem://transports", s, n, link_for(s))?))),
        ("zc_mem_typed", |s, n| Ok(Box::new(TypedBytesPipe::new("mem://transports-typed", s, n)?))),
        ("zc_tcp_raw", |s, n| Ok(Box::new(ZcPipe::with_link("tcp://127.0.0.1:0", s, n, link_for(s))?))),
        ("zc_tcp_typed", |s, n| Ok(Box::new(TypedBytesPipe::new("tcp://127.0.0.1:0", s, n)?))),
        ("zc_udp_raw", |s, n| {
            if s > MAX_DATAGRAM {
                return Err(format!("{s} B is above the largest datagram").into());
            }
            Ok(Box::new(UdpPipe::new(s, n)?))
        }),
        ("socket2_tcp_write_per_msg", |s, n| Ok(Box::new(RawPipe::new(Baseline::Naive, s, n)?))),
        ("socket2_tcp_batched", |s, n| Ok(Box::new(RawPipe::new(Baseline::Batched, s, n)?))),
    ];
    #[cfg(feature = "zeromq")]
    v.push(("zmq_push_pull", |s, n| Ok(Box::new(zerocast_benches::ZmqPipe::new(s, n)?))));
    #[cfg(feature = "rdma")]
    if std::env::var_os("ZEROCAST_RDMA_ADDR").is_some() {
        v.push(("zc_rc_raw", |s, n| Ok(Box::new(ZcPipe::with_link(&rdma_uri("rc"), s, n, link_for(s))?))));
        v.push(("zc_rc_typed", |s, n| Ok(Box::new(TypedBytesPipe::new(&rdma_uri("rc"), s, n)?))));
        v.push(("zc_rc_oob_raw", |s, n| {
            Ok(Box::new(ZcPipe::with_link(&rdma_uri("rc+oob"), s, n, link_for(s))?))
        }));
    }
    v
}

/// A listening URI on the RDMA device's address, any port.
#[cfg(feature = "rdma")]
fn rdma_uri(scheme: &str) -> String {
    let addr = std::env::var("ZEROCAST_RDMA_ADDR").unwrap_or_default();
    format!("{scheme}://{addr}:0")
}

fn transports(c: &mut Criterion) {
    let mut g = c.benchmark_group("transports");
    for size in SIZES {
        let n = msgs_per_batch(size);
        g.throughput(Throughput::Bytes(n * size as u64));
        for (name, make) in contenders() {
            let mut pipe = match make(size, n) {
                Ok(p) => p,
                // A size the transport cannot carry (a datagram above 64 KiB).
                Err(e) if e.to_string().contains("largest datagram") => continue,
                Err(e) => panic!("{name} at {size} B: {e:?}"),
            };
            g.bench_function(BenchmarkId::new(name, label(size)), |b| {
                b.iter_custom(|i| run(pipe.as_mut(), i))
            });
        }
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = transports
}
criterion_main!(benches);
