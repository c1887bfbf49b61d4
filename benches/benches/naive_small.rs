//! Message rate at 64 B over loopback TCP: zerocast (whose writer gathers
//! queued frames into one `writev`) against the naive hand-written protocol,
//! one `write` per message and two `read_exact` calls per message.

mod common;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use zerocast_benches::{msgs_per_batch, run, Baseline, Pipe, RawPipe, ZcPipe};

const SIZE: usize = 64;

fn naive_small(c: &mut Criterion) {
    let n = msgs_per_batch(SIZE);
    let mut zc = ZcPipe::new("tcp://127.0.0.1:0", SIZE, n).expect("zerocast pipe");
    let mut naive = RawPipe::new(Baseline::Naive, SIZE, n).expect("naive pipe");
    let mut g = c.benchmark_group("naive_small");
    g.throughput(Throughput::Elements(zc.msgs()));
    g.bench_function("zerocast/64B", |b| b.iter_custom(|i| run(&mut zc, i)));
    g.bench_function("naive_socket/64B", |b| b.iter_custom(|i| run(&mut naive, i)));
    g.finish();
}

criterion_group! {
    name = benches;
    config = common::short();
    targets = naive_small
}
criterion_main!(benches);
