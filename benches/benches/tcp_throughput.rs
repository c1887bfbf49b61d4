//! One-way streaming throughput over loopback TCP: zerocast's raw buffer API
//! against a strong hand-written socket2 baseline (batched writes, buffered
//! reads), at 64 B, 4 KiB and 64 KiB.

mod common;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use zerocast_benches::{msgs_per_batch, run, Baseline, Pipe, RawPipe, ZcPipe};

const SIZES: [usize; 3] = [64, 4096, 65_536];

fn label(size: usize) -> String {
    match size {
        s if s >= 1024 => format!("{}KiB", s / 1024),
        s => format!("{s}B"),
    }
}

fn tcp_throughput(c: &mut Criterion) {
    let mut g = c.benchmark_group("tcp_throughput");
    for size in SIZES {
        let n = msgs_per_batch(size);
        let mut zc = ZcPipe::new("tcp://127.0.0.1:0", size, n).expect("zerocast pipe");
        let mut raw = RawPipe::new(Baseline::Batched, size, n).expect("raw pipe");
        g.throughput(Throughput::Bytes(zc.bytes()));
        g.bench_function(BenchmarkId::new("zerocast", label(size)), |b| b.iter_custom(|i| run(&mut zc, i)));
        g.bench_function(BenchmarkId::new("raw_socket", label(size)), |b| {
            b.iter_custom(|i| run(&mut raw, i))
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = common::short();
    targets = tcp_throughput
}
criterion_main!(benches);
