//! Typed `Sender<Small>` / `Receiver<Small>` (bincode, owned decode) against
//! raw buffer sends of the same encoded size, over `tcp://` and `mem://`.

mod common;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use zerocast_benches::{msgs_per_batch, run, Pipe, Small, TypedPipe, ZcPipe};

fn typed_vs_raw(c: &mut Criterion) {
    let template = Small::sample(0, 24);
    let size = template.encoded_len();
    let n = msgs_per_batch(size);
    let mut g = c.benchmark_group("typed_vs_raw");
    g.throughput(Throughput::Elements(n));
    for (name, uri) in [("tcp", "tcp://127.0.0.1:0"), ("mem", "mem://bench-typed")] {
        let mut typed = TypedPipe::new(uri, template.clone(), n).expect("typed pipe");
        let mut raw = ZcPipe::new(uri, size, n).expect("raw pipe");
        assert_eq!(typed.bytes(), raw.bytes(), "same bytes on the wire");
        g.bench_function(BenchmarkId::new("typed", format!("{name}/{size}B")), |b| {
            b.iter_custom(|i| run(&mut typed, i))
        });
        g.bench_function(BenchmarkId::new("raw", format!("{name}/{size}B")), |b| {
            b.iter_custom(|i| run(&mut raw, i))
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = common::short();
    targets = typed_vs_raw
}
criterion_main!(benches);
