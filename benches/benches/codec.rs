//! The default codec on its own: bincode encode into a slice, and decode
//! owned and borrowed, through `zerocast::Codec`, for a 60-byte and a
//! 4 KiB record. The `bytes_form` rows serialize `data` as a byte string
//! (the same wire bytes) to show what a serde call per byte costs.

mod common;

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use zerocast::{Bincode, Codec};
use zerocast_benches::{Small, SmallBytes, SmallRef};

fn codec(c: &mut Criterion) {
    let mut g = c.benchmark_group("codec");
    for (label, data_len) in [("60B", 24), ("4KiB", Small::data_len_for(4096))] {
        let msg = Small::sample(0, data_len);
        let bytes_form = msg.to_bytes_form();
        let len = msg.encoded_len();
        let mut out = vec![0u8; len];
        Bincode.encode(&msg, &mut out).expect("encode");
        let wire = out.clone();
        g.throughput(Throughput::Bytes(len as u64));

        g.bench_function(BenchmarkId::new("encode", label), |b| {
            b.iter(|| Bincode.encode(black_box(&msg), &mut out).expect("encode"))
        });
        g.bench_function(BenchmarkId::new("decode_owned", label), |b| {
            b.iter(|| Bincode.decode::<Small>(black_box(&wire)).expect("decode"))
        });
        g.bench_function(BenchmarkId::new("decode_borrowed", label), |b| {
            b.iter(|| Bincode.decode::<SmallRef<'_>>(black_box(&wire)).expect("decode").id)
        });
        g.bench_function(BenchmarkId::new("encode_bytes_form", label), |b| {
            b.iter(|| Bincode.encode(black_box(&bytes_form), &mut out).expect("encode"))
        });
        g.bench_function(BenchmarkId::new("decode_owned_bytes_form", label), |b| {
            b.iter(|| Bincode.decode::<SmallBytes>(black_box(&wire)).expect("decode"))
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = common::short();
    targets = codec
}
criterion_main!(benches);
