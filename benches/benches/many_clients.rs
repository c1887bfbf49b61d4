//! Many clients of a small key-value service, request/reply: two zerocast
//! servers against a plain `std::net` server (see `zerocast_benches::kv`):
//! zerocast with a thread per accepted connection, as the std one has, and
//! zerocast with two serving threads and a `Poller` (`zc-poll`). The
//! three alternate in one run, each round starting with the next server;
//! each round opens its own connections, runs every request, checks every
//! reply and closes them. What is printed is each round's requests per
//! second, the per-round ratios of each zerocast server to std and their
//! median, and the most threads the process ran during each server's
//! requests.
//!
//! ```text
//! cargo bench -p zerocast-benches --bench many_clients                 # 200x500 and 2000x500
//! cargo bench -p zerocast-benches --bench many_clients -- 9900x50      # CLIENTSxREQUESTS, any
//! cargo bench -p zerocast-benches --bench many_clients -- all          # 200x500, 2000x500, 9900x50
//! ZEROCAST_BENCH_ROUNDS=5 cargo bench -p zerocast-benches --bench many_clients -- 2000x500
//! ZEROCAST_KV_THREADS=clients cargo bench ... -- 2000x500              # one client thread per client
//! ```
//!
//! Client threads: `ZEROCAST_KV_THREADS` (default 8), each driving an equal
//! share of the connections, all of them with a request in flight at once.
//! One process holds both ends of every connection, so it needs two
//! descriptors per client: the soft limit of open files is raised to the
//! hard limit first. With a hard limit of 20,000, 9,900 clients is about
//! the most that fits (10,000 would need 20,000 for the sockets alone). Under `cargo test --benches` (no `--bench` argument)
//! this does nothing.

use std::time::Duration;

use zerocast_benches::kv::{raise_open_files, run_round, threads_now, Contexts, Outcome, Server, Shape};
use zerocast_benches::{median, BoxError};

/// Client threads unless `ZEROCAST_KV_THREADS` says otherwise.
const THREADS: usize = 8;

/// The servers compared, std last (the baseline of both ratios).
const SERVERS: [Server; 3] = [Server::Zerocast, Server::Polled, Server::Std];

/// Alternating rounds unless `ZEROCAST_BENCH_ROUNDS` says otherwise.
const ROUNDS: usize = 3;

/// Descriptors beyond two per client: the listener, the engines', the
/// standard streams, `/proc` reads.
const SPARE_FDS: u64 = 64;

fn parse_shape(s: &str) -> Option<(usize, u64)> {
    let (c, r) = s.split_once('x')?;
    Some((c.parse().ok()?, r.parse().ok()?))
}

fn print_round(round: usize, server: Server, o: &Outcome) {
    println!(
        "  round {round} {:>8}: {:>9.0} req/s  ({:.2?} for the requests, {:.2?} to connect, {} threads at peak{})",
        server.name(),
        o.rate,
        o.elapsed,
        o.connect,
        o.peak_threads,
        if o.connect_retries > 0 { format!(", {} connects retried", o.connect_retries) } else { String::new() },
    );
}

fn spread(xs: &[f64]) -> (f64, f64) {
    xs.iter().fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)))
}

fn run_shape(shape: Shape, rounds: usize, zc: &Contexts) -> Result<(), BoxError> {
    println!(
        "{} clients x {} requests, {} client threads, {rounds} alternating rounds ({} requests per server per round)",
        shape.clients,
        shape.requests,
        shape.threads,
        shape.clients as u64 * shape.requests,
    );
    // Warm up every server (code, allocator, the engines' first connections).
    let warm = Shape { clients: shape.clients.min(200), requests: 20, threads: shape.threads };
    for server in SERVERS {
        run_round(server, warm, zc)?;
    }
    // Per server (in `SERVERS`' order): each round's rate, and the most
    // threads seen.
    let mut rates = [Vec::new(), Vec::new(), Vec::new()];
    let mut peaks = [0; 3];
    for round in 1..=rounds {
        // Each round starts with the next server, so none always runs first.
        for k in 0..SERVERS.len() {
            let i = (round + k) % SERVERS.len();
            let o = run_round(SERVERS[i], shape, zc)?;
            print_round(round, SERVERS[i], &o);
            rates[i].push(o.rate);
            peaks[i] = peaks[i].max(o.peak_threads);
        }
    }
    let std = &rates[2];
    for i in 0..2 {
        let ratios: Vec<f64> = rates[i].iter().zip(std).map(|(z, s)| z / s).collect();
        let per_round: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        let (lo, hi) = spread(&ratios);
        println!(
            "  {} / std: median {:.2}x [{lo:.2}-{hi:.2}], per round [{}]",
            SERVERS[i].name(),
            median(&ratios),
            per_round.join(" ")
        );
    }
    println!(
        "  median req/s: {}; threads at peak: {}",
        (0..3)
            .map(|i| format!("{} {:.0}", SERVERS[i].name(), median(&rates[i])))
            .collect::<Vec<_>>()
            .join(", "),
        (0..3).map(|i| format!("{} {}", SERVERS[i].name(), peaks[i])).collect::<Vec<_>>().join(", "),
    );
    println!();
    Ok(())
}

fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `cargo bench` passes `--bench`; `cargo test --benches` does not, and
    // thousands of connections are no smoke test.
    if !args.iter().any(|a| a == "--bench") {
        println!("many_clients: run it with `cargo bench -p zerocast-benches --bench many_clients`");
        return Ok(());
    }
    let rounds = match std::env::var("ZEROCAST_BENCH_ROUNDS") {
        Ok(s) => s.parse().map_err(|_| format!("ZEROCAST_BENCH_ROUNDS={s} is not a number"))?,
        Err(_) => ROUNDS,
    };
    let threads = match std::env::var("ZEROCAST_KV_THREADS") {
        Ok(s) if s == "clients" => None,
        Ok(s) => Some(s.parse().map_err(|_| format!("ZEROCAST_KV_THREADS={s}: a number, or `clients`"))?),
        Err(_) => Some(THREADS),
    };
    let mut shapes = Vec::new();
    for a in args.iter().filter(|a| !a.starts_with('-')) {
        match a.as_str() {
            "all" => shapes.extend([(200, 500), (2_000, 500), (9_900, 50)]),
            s => {
                shapes.push(parse_shape(s).ok_or_else(|| format!("{s}: expected CLIENTSxREQUESTS or `all`"))?)
            }
        }
    }
    if shapes.is_empty() {
        shapes = vec![(200, 500), (2_000, 500)];
    }
    let limit = raise_open_files();
    let most = shapes.iter().map(|&(c, _)| c).max().unwrap_or(0) as u64;
    if limit < 2 * most + SPARE_FDS {
        return Err(format!(
            "{most} clients need {} open files in this process (both ends of each connection), but the \
             limit is {limit}: raise the hard limit (`ulimit -Hn`)",
            2 * most + SPARE_FDS
        )
        .into());
    }
    let zc = Contexts::default();
    println!(
        "many clients, request/reply to a key-value service, zerocast / std::net (open files limit {limit}, \
         {} threads before the first round)",
        threads_now()
    );
    println!();
    for (clients, requests) in shapes {
        let shape = Shape { clients, requests, threads: threads.unwrap_or(clients) };
        run_shape(shape, rounds, &zc)?;
        // Let the last round's sockets and threads go before the next shape.
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}
