//! Round-trip latency on loopback at 64 B and 4 KiB: zerocast over
//! `tcp://` and `mem://` (raw buffers, echoed by a thread) against a raw
//! socket2 TCP ping-pong (`TCP_NODELAY`, one `write` each way) and ZeroMQ
//! REQ/REP (feature `zeromq`); and the async API, `zerocast::tokio` over
//! `tcp://`, against a tokio `TcpStream` ping-pong, each timed inside a
//! task of its own two-worker runtime. Criterion reports the mean; the
//! `ratios` bench compares medians (p50).
//!
//! ```text
//! cargo bench -p zerocast-benches --bench latency --features zeromq
//! ```

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use zerocast_benches::{AsyncZcPing, BoxError, PingPong, RawPing, TokioPing, ZcPing};

type Make = fn(usize) -> Result<Box<dyn PingPong>, BoxError>;

fn contenders() -> Vec<(&'static str, Make)> {
    #[cfg_attr(not(feature = "zeromq"), allow(unused_mut))]
    let mut v: Vec<(&'static str, Make)> = vec![
        ("zc_tcp_raw", |s| Ok(Box::new(ZcPing::new("tcp://127.0.0.1:0", s)?))),
        ("zc_mem_raw", |s| Ok(Box::new(ZcPing::new("mem://latency", s)?))),
        ("socket2_tcp_pingpong", |s| Ok(Box::new(RawPing::new(s)?))),
        ("zc_tokio_tcp_raw", |s| Ok(Box::new(AsyncZcPing::new(s)?))),
        ("tokio_tcp_pingpong", |s| Ok(Box::new(TokioPing::new(s)?))),
    ];
    #[cfg(feature = "zeromq")]
    v.push(("zmq_req_rep", |s| Ok(Box::new(zerocast_benches::ZmqReqRep::new(s)?))));
    v
}

fn latency(c: &mut Criterion) {
    let mut g = c.benchmark_group("latency_rtt");
    for size in [64usize, 4096] {
        for (name, make) in contenders() {
            let mut p = make(size).expect("ping-pong pair");
            let label = if size >= 1024 { format!("{}KiB", size >> 10) } else { format!("{size}B") };
            g.bench_function(BenchmarkId::new(name, label), |b| {
                b.iter_custom(|iters| {
                    let mut ns = Vec::new();
                    p.round_trips(iters as usize, &mut ns);
                    Duration::from_nanos(ns.iter().sum())
                })
            });
        }
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = latency
}
criterion_main!(benches);
