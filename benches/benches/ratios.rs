//! The same-run ratio harness: each zerocast pipe and its baseline run
//! alternately, several rounds each, in one process; what is printed is the
//! median (and spread) of the per-round throughput ratios, never an absolute
//! rate. On a noisy two-core machine this is the number to trust.
//!
//! ```text
//! cargo bench -p zerocast-benches --bench ratios            # every case
//! cargo bench -p zerocast-benches --bench ratios -- 64KiB   # cases whose name contains "64KiB"
//! ZEROCAST_BENCH_ROUNDS=9 cargo bench -p zerocast-benches --bench ratios
//! cargo bench -p zerocast-benches --bench ratios --features zeromq   # with the ZeroMQ rows
//! ```
//!
//! Round trips are compared the same way, as the ratio of the two sides'
//! medians (p50) in each round.

use std::time::{Duration, Instant};

use zerocast_benches::{
    bench_link, median, msgs_per_batch, round_trips, run, AsyncZcPing, AsyncZcPipe, Baseline, BoxError,
    PingPong, Pipe, RawPing, RawPipe, Small, TokioPing, TypedPipe, ZcPing, ZcPipe,
};

/// Time each side runs per round (and before the first round, to warm up).
const PER_ROUND: Duration = Duration::from_millis(500);
/// The same, as a smoke test under `cargo test --benches`.
const PER_ROUND_TEST: Duration = Duration::from_millis(20);

type Pair = (Box<dyn Pipe>, Box<dyn Pipe>);

struct Case {
    name: &'static str,
    /// What is compared: "A / B" as throughput(A) / throughput(B).
    what: &'static str,
    /// The ratio the project aims for, at least.
    goal: Option<f64>,
    make: fn() -> Result<Pair, BoxError>,
}

const TCP: &str = "tcp://127.0.0.1:0";

fn zc_vs_raw(size: usize, mode: Baseline) -> Result<Pair, BoxError> {
    let n = msgs_per_batch(size);
    Ok((Box::new(ZcPipe::new(TCP, size, n)?), Box::new(RawPipe::new(mode, size, n)?)))
}

fn mem_vs_raw(size: usize, mode: Baseline) -> Result<Pair, BoxError> {
    let n = msgs_per_batch(size);
    Ok((Box::new(ZcPipe::new("mem://ratios-raw", size, n)?), Box::new(RawPipe::new(mode, size, n)?)))
}

fn raw_vs_raw(size: usize, a: Baseline, b: Baseline) -> Result<Pair, BoxError> {
    let n = msgs_per_batch(size);
    Ok((Box::new(RawPipe::new(a, size, n)?), Box::new(RawPipe::new(b, size, n)?)))
}

fn zc_window_vs_raw(size: usize, window: u32) -> Result<Pair, BoxError> {
    let n = msgs_per_batch(size);
    let link = bench_link().with_recv_window(window);
    Ok((
        Box::new(ZcPipe::with_link(TCP, size, n, link)?),
        Box::new(RawPipe::new(Baseline::Batched, size, n)?),
    ))
}

fn typed_vs_raw(uri: &str) -> Result<Pair, BoxError> {
    let template = Small::sample(0, 24);
    let size = template.encoded_len();
    let n = msgs_per_batch(size);
    Ok((Box::new(TypedPipe::new(uri, template, n)?), Box::new(ZcPipe::new(uri, size, n)?)))
}

/// Messages ZeroMQ's PUSH/PULL pair queues in user space at its default
/// high-water marks: 1,000 at the sender and 1,000 at the receiver (and
/// more in the kernel's socket buffers, which zerocast's window counts).
#[cfg(feature = "zeromq")]
const ZMQ_QUEUED: u32 = 2000;

/// zerocast with a receive window of `window` messages against ZeroMQ.
#[cfg(feature = "zeromq")]
fn zc_vs_zmq(size: usize, window: u32) -> Result<Pair, BoxError> {
    let n = msgs_per_batch(size);
    let link = bench_link().with_recv_window(window);
    Ok((Box::new(ZcPipe::with_link(TCP, size, n, link)?), Box::new(zerocast_benches::ZmqPipe::new(size, n)?)))
}

const CASES: &[Case] = &[
    Case {
        name: "tcp_throughput/64B",
        what: "zerocast / raw socket (batched)",
        goal: None,
        make: || zc_vs_raw(64, Baseline::Batched),
    },
    Case {
        name: "tcp_throughput/4KiB",
        what: "zerocast / raw socket (batched)",
        goal: None,
        make: || zc_vs_raw(4096, Baseline::Batched),
    },
    Case {
        name: "tcp_throughput/64KiB",
        what: "zerocast / raw socket (batched)",
        goal: Some(0.95),
        make: || zc_vs_raw(65_536, Baseline::Batched),
    },
    Case {
        name: "naive_small/64B",
        what: "zerocast / naive socket (write per msg)",
        goal: Some(5.0),
        make: || zc_vs_raw(64, Baseline::Naive),
    },
    // The same buffering on both sides: zerocast's window is what ZeroMQ
    // queues at its default high-water marks.
    #[cfg(feature = "zeromq")]
    Case {
        name: "zmq_push_pull/64B",
        what: "zerocast / ZeroMQ PUSH/PULL (msg/s)",
        goal: Some(1.0),
        make: || zc_vs_zmq(64, ZMQ_QUEUED),
    },
    // The benches' usual window, an eighth of that, for reference.
    #[cfg(feature = "zeromq")]
    Case {
        name: "zmq_push_pull/64B/window256",
        what: "zerocast (window 256) / ZeroMQ PUSH/PULL",
        goal: None,
        make: || zc_vs_zmq(64, zerocast_benches::WINDOW),
    },
    Case {
        name: "typed_vs_raw/tcp/60B",
        what: "typed Sender<Small> / raw buffers",
        goal: None,
        make: || typed_vs_raw(TCP),
    },
    Case {
        name: "typed_vs_raw/mem/60B",
        what: "typed Sender<Small> / raw buffers",
        goal: None,
        make: || typed_vs_raw("mem://ratios"),
    },
    // Diagnostics: where the gaps above come from.
    Case {
        name: "async/tcp/64B",
        what: "async (zerocast::tokio) / blocking zerocast",
        goal: Some(0.9),
        make: || {
            let n = msgs_per_batch(64);
            Ok((Box::new(AsyncZcPipe::new(64, n)?), Box::new(ZcPipe::new(TCP, 64, n)?)))
        },
    },
    Case {
        name: "diag/64B/zc_vs_writev",
        what: "zerocast / socket with zerocast's writev shape",
        goal: None,
        make: || zc_vs_raw(64, Baseline::Gathered),
    },
    Case {
        name: "diag/64B/writev_vs_batched",
        what: "writev of 64 x [16 B hdr, 64 B] / batched socket",
        goal: None,
        make: || raw_vs_raw(64, Baseline::Gathered, Baseline::Batched),
    },
    Case {
        name: "diag/64B/mem_vs_naive",
        what: "zerocast over mem:// (no socket) / naive socket",
        goal: None,
        make: || mem_vs_raw(64, Baseline::Naive),
    },
    Case {
        name: "diag/64KiB/window32",
        what: "zerocast, recv_window 32 / raw socket (batched)",
        goal: None,
        make: || zc_window_vs_raw(65_536, 32),
    },
];

type PingPair = (Box<dyn PingPong>, Box<dyn PingPong>);

/// A round-trip comparison: the ratio of medians (p50), lower is better.
struct RttCase {
    name: &'static str,
    what: &'static str,
    /// The ratio the project aims for, at most.
    goal: Option<f64>,
    make: fn() -> Result<PingPair, BoxError>,
}

const RTT_CASES: &[RttCase] = &[
    RttCase {
        name: "rtt/tcp/64B",
        what: "zerocast p50 / raw socket ping-pong p50",
        goal: Some(1.10),
        make: || Ok((Box::new(ZcPing::new(TCP, 64)?), Box::new(RawPing::new(64)?))),
    },
    RttCase {
        name: "rtt/async/tcp/64B",
        what: "zerocast::tokio p50 / tokio TcpStream ping-pong p50",
        goal: Some(1.10),
        make: || Ok((Box::new(AsyncZcPing::new(64)?), Box::new(TokioPing::new(64)?))),
    },
    #[cfg(feature = "zeromq")]
    RttCase {
        name: "rtt/zmq/64B",
        what: "zerocast p50 / ZeroMQ REQ/REP p50",
        goal: None,
        make: || Ok((Box::new(ZcPing::new(TCP, 64)?), Box::new(zerocast_benches::ZmqReqRep::new(64)?))),
    },
];

/// Round trips per side per round.
const RTT_PER_ROUND: usize = 5_000;

fn p50(samples: &mut [u64]) -> f64 {
    samples.sort_unstable();
    samples[samples.len() / 2] as f64
}

/// Alternate the two sides of each round-trip case, `rounds` times.
fn rtt_cases(filters: &[&String], rounds: usize, per_round: usize) -> Result<(), BoxError> {
    for case in
        RTT_CASES.iter().filter(|c| filters.is_empty() || filters.iter().any(|f| c.name.contains(f.as_str())))
    {
        let (mut a, mut b) = (case.make)()?;
        let (mut sa, mut sb) = (Vec::with_capacity(per_round), Vec::with_capacity(per_round));
        round_trips(a.as_mut(), per_round / 5, &mut sa);
        round_trips(b.as_mut(), per_round / 5, &mut sb);
        let mut ratios = Vec::with_capacity(rounds);
        for round in 0..rounds {
            if round % 2 == 0 {
                round_trips(a.as_mut(), per_round, &mut sa);
                round_trips(b.as_mut(), per_round, &mut sb);
            } else {
                round_trips(b.as_mut(), per_round, &mut sb);
                round_trips(a.as_mut(), per_round, &mut sa);
            }
            ratios.push(p50(&mut sa) / p50(&mut sb));
        }
        let (lo, hi) = ratios.iter().fold((f64::MAX, f64::MIN), |(lo, hi), &r| (lo.min(r), hi.max(r)));
        let med = median(&ratios);
        let goal = match case.goal {
            Some(g) if med <= g => format!("≤ {g}: met"),
            Some(g) => format!("≤ {g}: MISSED"),
            None => "-".to_owned(),
        };
        println!("| {} | {} | {med:.2}x | {lo:.2}x | {hi:.2}x | {goal} |", case.name, case.what);
    }
    Ok(())
}

/// Batches of `p` that take about `t`, measured by running it for `t`.
fn calibrate(p: &mut dyn Pipe, t: Duration) -> u64 {
    let start = Instant::now();
    let mut batches = 0u64;
    while start.elapsed() < t {
        p.batch();
        batches += 1;
    }
    batches.max(1)
}

fn rate(p: &dyn Pipe, reps: u64, took: Duration) -> f64 {
    (p.msgs() * reps) as f64 / took.as_secs_f64()
}

fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    // `cargo bench` passes `--bench`; without it (`cargo test --benches`)
    // this is a quick smoke test whose numbers mean nothing.
    let bench = args.iter().any(|a| a == "--bench");
    let (mut rounds, per_round) = if bench { (5, PER_ROUND) } else { (1, PER_ROUND_TEST) };
    if let Ok(s) = std::env::var("ZEROCAST_BENCH_ROUNDS") {
        rounds = s.parse().map_err(|_| format!("ZEROCAST_BENCH_ROUNDS={s} is not a number"))?;
    }
    if !bench {
        println!("smoke test (run with `cargo bench` for real numbers)");
    }
    println!("same-run throughput ratios, {rounds} alternating rounds of ~{per_round:?} per side (median [min..max])");
    println!();
    println!("| case | ratio | median | min | max | goal |");
    println!("|---|---|---:|---:|---:|---|");
    for case in
        CASES.iter().filter(|c| filters.is_empty() || filters.iter().any(|f| c.name.contains(f.as_str())))
    {
        let (mut a, mut b) = (case.make)()?;
        let reps_a = calibrate(a.as_mut(), per_round);
        let reps_b = calibrate(b.as_mut(), per_round);
        let mut ratios = Vec::with_capacity(rounds);
        for round in 0..rounds {
            // Alternate who goes first, so a drift in machine load hits both.
            let (ta, tb) = if round % 2 == 0 {
                let ta = run(a.as_mut(), reps_a);
                (ta, run(b.as_mut(), reps_b))
            } else {
                let tb = run(b.as_mut(), reps_b);
                (run(a.as_mut(), reps_a), tb)
            };
            ratios.push(rate(a.as_ref(), reps_a, ta) / rate(b.as_ref(), reps_b, tb));
        }
        let (lo, hi) = ratios.iter().fold((f64::MAX, f64::MIN), |(lo, hi), &r| (lo.min(r), hi.max(r)));
        let med = median(&ratios);
        let goal = match case.goal {
            Some(g) if med >= g => format!("≥ {g}: met"),
            Some(g) => format!("≥ {g}: MISSED"),
            None => "-".to_owned(),
        };
        println!("| {} | {} | {med:.2}x | {lo:.2}x | {hi:.2}x | {goal} |", case.name, case.what);
    }
    println!();
    println!("same-run round-trip ratios (medians of p50 per round; lower is better)");
    println!();
    println!("| case | ratio | median | min | max | goal |");
    println!("|---|---|---:|---:|---:|---|");
    rtt_cases(&filters, rounds, if bench { RTT_PER_ROUND } else { 100 })?;
    Ok(())
}
