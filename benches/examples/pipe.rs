//! Run one pipe for a fixed number of batches, for profilers and syscall
//! counters (`strace -c -f`, `perf record`, `valgrind --tool=callgrind`).
//!
//! ```text
//! cargo build --release -p zerocast-benches --example pipe
//! strace -c -f target/release/examples/pipe zc 64 20
//! ```
//!
//! `KIND` is `zc` (raw buffers over tcp), `zc-mem`, `async` (raw buffers
//! over tcp through `zerocast::tokio`), `typed`, `typed-mem`, `raw`
//! (batched socket baseline), `naive`, `gathered`, or `zmq` (ZeroMQ
//! PUSH/PULL, with `--features zeromq`). Prints messages per batch and
//! batches run, so syscall counts can be divided per message; it prints no
//! rate.

use zerocast_benches::{
    bench_link, msgs_per_batch, run, AsyncZcPipe, Baseline, BoxError, Pipe, RawPipe, Small, TypedPipe, ZcPipe,
};

fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (kind, size, batches) = match args.as_slice() {
        [k, s, b] => (k.as_str(), s.parse::<usize>()?, b.parse::<u64>()?),
        _ => return Err(
            "usage: pipe KIND SIZE BATCHES (KIND: zc, zc-mem, async, typed, typed-mem, raw, naive, gathered)"
                .into(),
        ),
    };
    let n = msgs_per_batch(size);
    let tcp = "tcp://127.0.0.1:0";
    // Link settings to try, from the environment: ZC_WINDOW, ZC_BATCH.
    let mut link = bench_link();
    if let Ok(w) = std::env::var("ZC_WINDOW") {
        link = link.with_recv_window(w.parse()?);
    }
    if let Ok(b) = std::env::var("ZC_BATCH") {
        link = link.with_max_batch(b.parse()?);
    }
    if kind == "zc" {
        let mut p = ZcPipe::with_link(tcp, size, n, link)?;
        run(&mut p, batches);
        let s = p.stats();
        println!(
            "zc: {n} messages of {size} B per batch, {batches} batches; sender blocked on credit {} times, \
             {} credit frames sent by the sender",
            s.credits.blocked, s.credits.credit_frames_sent
        );
        return Ok(());
    }
    let mut p: Box<dyn Pipe> = match kind {
        "zc-mem" => Box::new(ZcPipe::new("mem://pipe", size, n)?),
        "async" => Box::new(AsyncZcPipe::new(size, n)?),
        "typed" => Box::new(TypedPipe::new(tcp, Small::sample(0, size.saturating_sub(36)), n)?),
        "typed-mem" => Box::new(TypedPipe::new("mem://pipe", Small::sample(0, size.saturating_sub(36)), n)?),
        "raw" => Box::new(RawPipe::new(Baseline::Batched, size, n)?),
        "naive" => Box::new(RawPipe::new(Baseline::Naive, size, n)?),
        "gathered" => Box::new(RawPipe::new(Baseline::Gathered, size, n)?),
        #[cfg(feature = "zeromq")]
        "zmq" => Box::new(zerocast_benches::ZmqPipe::new(size, n)?),
        other => return Err(format!("unknown kind {other}").into()),
    };
    run(p.as_mut(), batches);
    println!("{kind}: {} messages of {size} B per batch, {batches} batches", p.msgs());
    Ok(())
}
