//! Command-line options, and what each role does with them.

use std::io::{self, Write};
use std::path::PathBuf;
use std::thread;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::{Args, CommandFactory, Parser, Subcommand};

use crate::client::{in_process_only, Session};
use crate::clock::ClockKind;
use crate::progress::Progress;
use crate::report::{self, Doc, Run};
use crate::server;
use crate::spec::{capped_window, Mode, Poll, Spec, Transport, MAX_SIZE, PROTOCOL};

const EXAMPLES: &str = "\
Examples:
  zerocast-perf --loopback                          bw over tcp://127.0.0.1, server in this process
  zerocast-perf lat --loopback -a --transport tcp,mem --plot lat.svg
  zerocast-perf                                     serve one client on port 18515
  zerocast-perf bw 10.0.0.2 --transport rc -s 64K   client: RDMA RC bandwidth at 64 KiB
  zerocast-perf rate 10.0.0.2 --json                client: 64 B message rate, as JSON";

/// Bandwidth, latency and message rate of zerocast transports, perftest-style.
///
/// Without HOST this is the server (it serves one client, or every client
/// with --forever); with HOST it is the client, and the client's options
/// decide every test. The mode defaults to bw.
#[derive(Debug, Parser)]
#[command(name = "zerocast-perf", version, args_conflicts_with_subcommands = true, after_help = EXAMPLES)]
pub(crate) struct Cli {
    #[command(subcommand)]
    mode: Option<ModeCmd>,
    #[command(flatten)]
    opts: Opts,
}

#[derive(Debug, Subcommand)]
enum ModeCmd {
    /// Streaming bandwidth, as ib_send_bw (the default mode).
    Bw(Opts),
    /// Ping-pong latency, half the round trip, as ib_send_lat.
    Lat(Opts),
    /// Small-message rate: bw at 64 B with a window of 256.
    Rate(Opts),
}

#[derive(Debug, Clone, Args)]
struct Opts {
    /// The server to connect to. Without it, this process is the server.
    host: Option<String>,
    /// Control port (TCP): where the server listens and the client connects.
    #[arg(short, long, default_value_t = 18515)]
    port: u16,
    /// Server: the address to listen at (control and data endpoints).
    #[arg(long, default_value = "0.0.0.0")]
    bind: String,
    /// Transports, comma-separated: tcp, mem, ud, rc, rc+oob, or a full URI
    /// (its host: the data address; a non-zero port: the data port; its
    /// query: transport settings, e.g. rc://10.0.0.2:7471?dev=mlx5_0).
    #[arg(long, value_delimiter = ',', default_value = "tcp")]
    transport: Vec<Transport>,
    /// Message size in bytes (suffixes K, M: powers of 1024).
    #[arg(short, long, value_parser = parse_size, conflicts_with = "all")]
    size: Option<usize>,
    /// Messages (bw, rate) or round trips (lat) per test.
    #[arg(short = 'n', long = "iters")]
    iters: Option<u64>,
    /// Run each test for this many seconds instead of a count.
    #[arg(short = 'D', long, value_parser = parse_seconds, conflicts_with = "iters")]
    duration: Option<Duration>,
    /// Sweep sizes from 2 B to 8 MiB by powers of two. Without -n, large
    /// sizes run fewer iterations (at most 256 MiB each, at least 100).
    #[arg(short, long)]
    all: bool,
    /// Send and receive typed messages (a typed Sender and Receiver of a byte chunk) instead of raw buffers.
    /// The bw server lends each message to a closure (`Receiver::recv_with`); the echo server holds it
    /// while the reply goes out (`Receiver::recv_ref`).
    #[arg(long)]
    typed: bool,
    /// Messages in flight: the receive window (credits). Capped so that at
    /// most 32 MiB are in flight.
    #[arg(long, visible_alias = "window", value_parser = clap::value_parser!(u32).range(4..=65535))]
    inflight: Option<u32>,
    /// Datagram bw and rate: datagrams per `send_batch` call (one chain of
    /// work requests over RDMA UD, as perftest's --post_list); 1 sends each
    /// with `send_to`.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=1024))]
    post_list: u32,
    /// How to wait: busy spins on try_send/try_recv (and RDMA completion
    /// threads on the CQ); event blocks.
    #[arg(long, value_enum, default_value_t = Poll::Event)]
    poll: Poll,
    /// Use the async API (zerocast::tokio) at both ends, each on a
    /// current-thread tokio runtime that also runs the engines (raw
    /// buffers, event mode).
    #[arg(long = "async")]
    async_api: bool,
    /// Print the results as one JSON document instead of tables.
    #[arg(long)]
    json: bool,
    /// Latency: what times the samples. cycles: the CPU's cycle counter
    /// (x86 TSC, Arm's virtual counter), calibrated against the monotonic
    /// clock over each test, as perftest times ib_send_lat; a read costs a
    /// few ns where the OS clock can cost microseconds (a TCG guest's
    /// HPET). monotonic: the OS clock. CPUs without a counter use it.
    #[arg(long, value_enum, default_value_t = ClockKind::Cycles)]
    clock: ClockKind,
    /// Latency: print the spread of the samples (percentiles 5 to 95) on a
    /// line under each row, as perftest's -H prints its samples. The JSON
    /// document always carries it.
    #[arg(short = 'H', long = "histogram")]
    histogram: bool,
    /// Run server and client in this process, over 127.0.0.1.
    #[arg(long, conflicts_with = "host")]
    loopback: bool,
    /// Draw the results (bandwidth or latency against size) into an SVG.
    #[arg(long, value_name = "OUT.svg")]
    plot: Option<PathBuf>,
    /// Server: keep serving clients instead of exiting after one.
    #[arg(long)]
    forever: bool,
    /// No progress bar.
    #[arg(short, long)]
    quiet: bool,
    /// List the transports and what carries each in this build, then exit.
    #[arg(long)]
    list_transports: bool,
}

/// What carries each scheme in this build: `rc://` and `rc+oob://` need the
/// `rdma` feature; so does RDMA UD, which carries `ud://` on an RDMA
/// device's address (elsewhere, and without the feature, it is UDP).
fn transports() -> [(&'static str, &'static str); 5] {
    let (rdma, ud) = if cfg!(feature = "rdma") {
        ("rdma", "rdma UD on an RDMA device's address, udp elsewhere")
    } else {
        ("not built in (build with --features rdma)", "udp")
    };
    [("tcp", "tcp"), ("mem", "in-process"), ("ud", ud), ("rc", rdma), ("rc+oob", rdma)]
}

fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, shift) = match t.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        None => (t, 0),
        Some((i, _)) => {
            let shift = match t[i..].to_ascii_lowercase().as_str() {
                "k" | "kb" | "kib" => 10,
                "m" | "mb" | "mib" => 20,
                "b" => 0,
                other => return Err(format!("unknown size suffix `{other}`; use K or M")),
            };
            (&t[..i], shift)
        }
    };
    let n: usize = num.trim().parse().map_err(|_| format!("`{s}` is not a size"))?;
    let n = n.checked_shl(shift).filter(|v| v >> shift == n).ok_or_else(|| format!("`{s}` is too large"))?;
    if n == 0 || n > MAX_SIZE {
        return Err(format!("{n} B is outside 1..={MAX_SIZE} (8 MiB)"));
    }
    Ok(n)
}

fn parse_seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s.parse().map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !(secs > 0.0 && secs <= 86_400.0) {
        return Err(format!("{secs} s is outside (0, 86400]"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Sizes of `-a`: 2 B … 8 MiB.
fn sweep() -> Vec<usize> {
    (1..=23).map(|i| 1usize << i).collect()
}

/// The mode names, which are subcommands: they go before every option.
const MODES: [&str; 3] = ["bw", "lat", "rate"];

/// Parse the command line, or exit with clap's message (status 2). A mode
/// written after an option (`zerocast-perf --loopback lat`) reads as the
/// HOST to clap; say where it goes instead of connecting to a host of that
/// name or reporting a conflict with HOST.
pub(crate) fn parse() -> Cli {
    let args: Vec<String> = std::env::args().collect();
    let hint = misplaced_mode(&args)
        .map(|m| format!("`{m}` is a mode, and a mode goes first: zerocast-perf {m} [OPTIONS] [HOST]"));
    match Cli::try_parse_from(&args) {
        Ok(cli) if cli.mode.is_none() && cli.opts.host.as_deref().is_some_and(|h| MODES.contains(&h)) => {
            let hint = hint.unwrap_or_default();
            Cli::command().error(clap::error::ErrorKind::ArgumentConflict, hint).exit()
        }
        Ok(cli) => cli,
        Err(e) => {
            let shown = e.use_stderr();
            let _ = e.print();
            if let Some(hint) = hint.filter(|_| shown) {
                eprintln!("\nhint: {hint}");
            }
            std::process::exit(e.exit_code())
        }
    }
}

/// The mode word in `args` (the program name first) when it is not the
/// first argument.
fn misplaced_mode(args: &[String]) -> Option<&str> {
    let first = args.get(1)?;
    if MODES.contains(&first.as_str()) {
        return None;
    }
    args[2..].iter().map(String::as_str).find(|a| MODES.contains(a))
}

pub(crate) fn run(cli: Cli) -> anyhow::Result<()> {
    let (mode, opts) = match cli.mode {
        None => (Mode::Bw, cli.opts),
        Some(ModeCmd::Bw(o)) => (Mode::Bw, o),
        Some(ModeCmd::Lat(o)) => (Mode::Lat, o),
        Some(ModeCmd::Rate(o)) => (Mode::Rate, o),
    };
    if opts.list_transports {
        for (scheme, backend) in transports() {
            println!("{scheme}\t{backend}");
        }
        return Ok(());
    }
    if opts.loopback {
        let plan = plan(mode, &opts)?;
        return loopback(mode, &opts, &plan);
    }
    match opts.host.clone() {
        Some(host) => client(mode, &opts, &host, opts.port, &plan(mode, &opts)?),
        None => {
            let listener = server::listen(&opts.bind, opts.port)?;
            eprintln!("zerocast-perf: listening on {}", listener.local_endpoint());
            server::serve(&listener, &opts.bind, opts.forever)
        }
    }
}

/// Server in a thread, client here, both on 127.0.0.1.
fn loopback(mode: Mode, opts: &Opts, plan: &[Vec<Spec>]) -> anyhow::Result<()> {
    let listener = server::listen("127.0.0.1", 0)?;
    let port = listener.local_endpoint().port().expect("tcp has a port");
    let server = thread::Builder::new()
        .name("zerocast-perf-server".into())
        .spawn(move || server::serve(&listener, "127.0.0.1", false))?;
    // On success the client's session is closed by now, so the server's
    // ends too. On failure the server may still wait for a client that
    // never came: the error is reported without waiting for it.
    client(mode, opts, "127.0.0.1", port, plan)?;
    server.join().map_err(|_| anyhow::anyhow!("the server thread panicked"))?.context("server")
}

/// The tests the options ask for, one list per transport.
fn plan(mode: Mode, opts: &Opts) -> anyhow::Result<Vec<Vec<Spec>>> {
    let sizes = match (opts.all, opts.size) {
        (true, _) => sweep(),
        (false, Some(s)) => vec![s],
        (false, None) => vec![mode.default_size()],
    };
    let inflight = opts.inflight.unwrap_or(mode.default_window());
    let mut out = Vec::new();
    for t in &opts.transport {
        server::built_in(t.scheme())?;
        if in_process_only(t.scheme()) && !opts.loopback {
            bail!("{}:// is in-process only: use it with --loopback", t.scheme);
        }
        let specs = sizes
            .iter()
            .map(|&size| {
                let iters = match opts.iters {
                    Some(n) => n,
                    None if opts.all => mode.default_iters().min(((256 << 20) / size as u64).max(100)),
                    None => mode.default_iters(),
                };
                let spec = Spec {
                    protocol: PROTOCOL,
                    mode,
                    transport: t.clone(),
                    size,
                    iters,
                    duration_ms: opts.duration.map(|d| d.as_millis().max(1) as u64),
                    window: capped_window(inflight, size),
                    typed: opts.typed,
                    poll: opts.poll,
                    async_api: opts.async_api,
                    post_list: opts.post_list,
                };
                spec.validate()?;
                Ok(spec)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        out.push(specs);
    }
    Ok(out)
}

fn client(mode: Mode, opts: &Opts, host: &str, port: u16, plan: &[Vec<Spec>]) -> anyhow::Result<()> {
    let session = Session::connect(host, port, opts.clock)?;
    let total = plan.iter().map(Vec::len).sum();
    let progress = Progress::new(total, !opts.quiet);
    let mut runs = Vec::new();
    let mut out = io::stdout().lock();
    let mut index = 0;
    for specs in plan {
        let first = &specs[0];
        let inflight = opts.inflight.unwrap_or(mode.default_window());
        let mut run = Run {
            mode: mode.as_str(),
            transport: first.transport.to_string(),
            typed: opts.typed,
            poll: opts.poll.as_str(),
            async_api: opts.async_api,
            inflight,
            clock: (mode == Mode::Lat).then(|| opts.clock.as_str()),
            results: Vec::new(),
        };
        if !opts.json {
            let shown = Spec { window: inflight, ..first.clone() };
            progress.suspend(|| report::header(&mut out, mode, &shown, opts.clock))?;
        }
        for spec in specs {
            progress.test_start(index, format!("{} {} B", spec.transport, spec.size));
            index += 1;
            let mut data = String::new();
            let row = session.run(spec, &progress, &mut data).with_context(|| {
                format!("{} test over {} at {} B", mode.as_str(), data_or(&data, &spec.transport), spec.size)
            })?;
            if !opts.json {
                progress.suspend(|| {
                    report::row(&mut out, &row)?;
                    if opts.histogram {
                        report::spread(&mut out, &row)?;
                    }
                    out.flush()
                })?;
            }
            run.results.push(row);
        }
        if !opts.json {
            progress.suspend(|| report::footer(&mut out))?;
        }
        runs.push(run);
    }
    progress.finish();
    drop(session);
    if opts.json {
        let doc = Doc {
            tool: "zerocast-perf",
            version: env!("CARGO_PKG_VERSION"),
            latency: Doc::LATENCY,
            runs: &runs,
        };
        serde_json::to_writer_pretty(&mut out, &doc)?;
        writeln!(out)?;
    }
    if let Some(path) = &opts.plot {
        let title = format!("zerocast-perf {} ({})", mode.as_str(), if opts.typed { "typed" } else { "raw" });
        crate::plot::svg(path, &runs, &title)?;
        eprintln!("zerocast-perf: plot written to {}", path.display());
    }
    Ok(())
}

fn data_or(data: &str, t: &Transport) -> String {
    if data.is_empty() {
        t.to_string()
    } else {
        data.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("8m"), Ok(8 << 20));
        assert!(parse_size("0").is_err());
        assert!(parse_size("9M").unwrap_err().contains("outside"));
        assert!(parse_size("4X").unwrap_err().contains("suffix"));
        assert!(parse_size("abc").is_err());
        assert_eq!(sweep().first(), Some(&2));
        assert_eq!(sweep().last(), Some(&MAX_SIZE));
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn a_mode_after_an_option_is_named() {
        let args = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        assert_eq!(misplaced_mode(&args("zerocast-perf --loopback lat -s 1")), Some("lat"));
        assert_eq!(misplaced_mode(&args("zerocast-perf -p 1 rate")), Some("rate"));
        assert_eq!(misplaced_mode(&args("zerocast-perf lat --loopback")), None);
        assert_eq!(misplaced_mode(&args("zerocast-perf bw 10.0.0.2 -s 64")), None);
        assert_eq!(misplaced_mode(&args("zerocast-perf --loopback")), None);
        assert_eq!(misplaced_mode(&args("zerocast-perf")), None);
        // What clap makes of it: the mode as HOST, which `parse` refuses.
        let cli = Cli::try_parse_from(args("zerocast-perf -p 1 lat")).unwrap();
        assert!(cli.mode.is_none());
        assert_eq!(cli.opts.host.as_deref(), Some("lat"));
    }
}
