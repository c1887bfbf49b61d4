//! The server role: a control listener, and per test a data endpoint shaped
//! by the client's [`Spec`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use zerocast::datagram::DatagramSocket;
use zerocast::{Listener, Receiver, RecvError, Scheme, Sender, Zerocast};

use crate::data::{context_for, DataPath};
use crate::open::Opener;
use crate::spec::{Ctl, Mode, Poll, ServerReport, Spec};

/// How long the server waits for datagrams still on their way once the
/// client says it sent them all.
const UD_DRAIN: Duration = Duration::from_millis(200);

/// Open the control listener at `bind:port` (port 0: any free port).
pub(crate) fn listen(bind: &str, port: u16) -> anyhow::Result<Listener> {
    let host = if bind.contains(':') { format!("[{bind}]") } else { bind.to_owned() };
    let uri = format!("tcp://{host}:{port}");
    Zerocast::new().listen(&uri).with_context(|| format!("cannot listen for clients at {uri}"))
}

/// Serve client sessions: one, or (`forever`) one after another. Data
/// endpoints bind to `bind`. A peer that fails the handshake (one that
/// does not speak zerocast, a port scanner) does not count as the client:
/// the listener skips it (it is counted in the listener's stats).
pub(crate) fn serve(listener: &Listener, bind: &str, forever: bool) -> anyhow::Result<()> {
    loop {
        let conn = listener.accept().context("accepting a client")?;
        let peer = conn.peer().to_string();
        let (tx, rx) = conn.split::<Ctl, Ctl>();
        let r = session(&tx, &rx, bind);
        if !forever {
            return r.with_context(|| format!("serving {peer}"));
        }
        if let Err(e) = r {
            eprintln!("zerocast-perf: session with {peer} failed: {e:#}");
        }
    }
}

/// Run the tests one client asks for, until it disconnects.
fn session(tx: &Sender<Ctl>, rx: &Receiver<Ctl>, bind: &str) -> anyhow::Result<()> {
    loop {
        let spec = match rx.recv() {
            Ok(Ctl::Start(spec)) => spec,
            Ok(other) => bail!("the client sent {other:?} where a test should start"),
            Err(e) if e.is_disconnected() => return Ok(()),
            Err(e) => return Err(e).context("reading the control connection"),
        };
        if let Err(e) = spec.validate().and_then(|()| built_in(spec.transport.scheme())) {
            send(tx, Ctl::Refused(format!("{e:#}")))?;
            continue;
        }
        let r = if spec.transport.is_datagram() {
            datagram_test(&spec, bind, tx, rx)
        } else {
            test(&spec, bind, tx)
        };
        r.with_context(|| format!("{} test over {} at {} B", spec.mode.as_str(), spec.transport, spec.size))?;
    }
}

fn send(tx: &Sender<Ctl>, msg: Ctl) -> anyhow::Result<()> {
    tx.send(msg).map_err(|e| anyhow::anyhow!("control connection: {}", e.map(drop)))
}

/// Whether this build carries the transport.
pub(crate) fn built_in(scheme: Scheme) -> anyhow::Result<()> {
    match scheme {
        Scheme::Rc | Scheme::RcOob if !cfg!(feature = "rdma") => {
            bail!("{scheme}:// is not built into this zerocast-perf; build it with `--features rdma`")
        }
        _ => Ok(()),
    }
}

/// A connection test: listen, tell the client where, accept, then sink
/// (bw, rate) or echo (lat) until the client closes.
fn test(spec: &Spec, bind: &str, tx: &Sender<Ctl>) -> anyhow::Result<()> {
    let zc = Opener::for_spec(spec)?;
    let uri = match spec.transport.scheme() {
        Scheme::Mem => spec.transport.uri(&unique_name(), 0),
        _ => spec.transport.uri(bind, spec.transport.port.unwrap_or(0)),
    };
    let listener = match zc.listen(&uri) {
        Ok(l) => l,
        Err(e) => return send(tx, Ctl::Refused(format!("cannot listen at {uri}: {e}"))),
    };
    let ep = listener.local_endpoint();
    let name = if ep.scheme() == Scheme::Mem { ep.host().to_owned() } else { String::new() };
    send(tx, Ctl::Ready { port: ep.port().unwrap_or(0), name })?;
    let dp = listener.accept(spec).with_context(|| format!("accepting the data connection at {uri}"))?;
    let r = match spec.mode {
        Mode::Lat => echo(&dp),
        Mode::Bw | Mode::Rate => sink(&dp, crate::spec::warmup(spec.window)),
    };
    match r {
        Ok(report) => send(tx, Ctl::Report(report)),
        Err(e) => {
            let why = format!("{e:#}");
            send(tx, Ctl::Failed(why.clone()))?;
            bail!(why)
        }
    }
}

fn unique_name() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!("zerocast-perf-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// Receive and check every message until the client's goodbye, timing
/// the stream from the arrival of message `warmup`, the first the client
/// times, to its end. The clock is read twice in all, never per message.
fn sink(dp: &DataPath, warmup: u64) -> anyhow::Result<ServerReport> {
    // One loop, which the async API runs in one task (see
    // `DataPath::drive`).
    dp.drive(async {
        let mut report = ServerReport { msgs: 0, bytes: 0, timed_ns: 0 };
        let mut first = None;
        while let Some(got) = dp.recv_then(false, |got| async move { Ok(got) }).await? {
            dp.check(got, report.msgs)?;
            if report.msgs == warmup {
                first = Some(Instant::now());
            }
            report.msgs += 1;
            report.bytes += got.len as u64;
        }
        report.timed_ns = first.map_or(0, |t| t.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64);
        Ok(report)
    })
}

/// Send every message back until the client's goodbye.
fn echo(dp: &DataPath) -> anyhow::Result<ServerReport> {
    if let Some(conn) = dp.raw() {
        return echo_raw(dp, conn);
    }
    let mut report = ServerReport { msgs: 0, bytes: 0, timed_ns: 0 };
    // The reply goes out before the request's buffer is given back (see
    // `DataPath::recv_then`), and the next reply's buffer is taken while
    // the next request is on its way (`DataPath::prepare`).
    // One loop, which the async API runs in one task (see
    // `DataPath::drive`).
    dp.drive(async {
        dp.prepare().await?;
        loop {
            let seq = report.msgs;
            let got = dp
                .recv_then(true, |got| async move {
                    dp.check(got, seq)?;
                    dp.send_async(seq).await?;
                    Ok(got)
                })
                .await?;
            let Some(got) = got else { return Ok(()) };
            report.msgs += 1;
            report.bytes += got.len as u64;
            dp.prepare().await?;
        }
    })?;
    dp.close();
    Ok(report)
}

/// [`echo`] over the blocking raw API: the same steps, one call after
/// another.
fn echo_raw(dp: &DataPath, conn: &zerocast::Connection) -> anyhow::Result<ServerReport> {
    let mut report = ServerReport { msgs: 0, bytes: 0, timed_ns: 0 };
    dp.prepare_raw(conn)?;
    loop {
        let seq = report.msgs;
        let echoed = dp.recv_raw_then(conn, |got| {
            dp.check(got, seq)?;
            dp.send_raw(conn, seq)?;
            Ok(got)
        })?;
        let Some(got) = echoed else { break };
        report.msgs += 1;
        report.bytes += got.len as u64;
        dp.prepare_raw(conn)?;
    }
    dp.close();
    Ok(report)
}

/// A datagram test: count what arrives until the client says how many it
/// sent, then wait for stragglers.
fn datagram_test(spec: &Spec, bind: &str, tx: &Sender<Ctl>, rx: &Receiver<Ctl>) -> anyhow::Result<()> {
    let zc = context_for(spec);
    let uri = spec.transport.uri(bind, spec.transport.port.unwrap_or(0));
    let sock = match zc.bind_datagram(&uri) {
        Ok(s) => s,
        Err(e) => return send(tx, Ctl::Refused(format!("cannot bind {uri}: {e}"))),
    };
    if spec.size > sock.max_datagram() {
        let why = format!("{} B is above the largest datagram, {} B", spec.size, sock.max_datagram());
        return send(tx, Ctl::Refused(why));
    }
    send(tx, Ctl::Ready { port: sock.local_addr().port(), name: String::new() })?;
    let msgs = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let busy = spec.poll == Poll::Busy;
    let report = thread::scope(|s| {
        let counter = s.spawn(|| count_datagrams(&sock, spec.size, busy, &msgs, &stop));
        let sent = match rx.recv() {
            Ok(Ctl::Sent(n)) => Ok(n),
            Ok(other) => Err(anyhow::anyhow!("the client sent {other:?} where a datagram count should be")),
            Err(e) => Err(anyhow::Error::from(e).context("reading the control connection")),
        };
        if let Ok(sent) = sent {
            // Until all arrived, or none arrived for a while.
            let (mut last, mut seen) = (Instant::now(), msgs.load(Ordering::Relaxed));
            while seen < sent && last.elapsed() < UD_DRAIN {
                thread::sleep(Duration::from_millis(5));
                let now = msgs.load(Ordering::Relaxed);
                if now != seen {
                    (last, seen) = (Instant::now(), now);
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        let counted = counter.join().map_err(|_| anyhow::anyhow!("the datagram counter panicked"))?;
        sent.and(counted)
    })?;
    send(tx, Ctl::Report(report))
}

/// Count the datagrams of `size` bytes that arrive until `stop`. `busy`:
/// spin on `try_recv_from` (the device's CQ is polled on this thread, as
/// perftest's server does); otherwise block, waking every 20 ms to look at
/// `stop` (the deadline is renewed only when it passes, so a stream of
/// datagrams costs no clock read each).
fn count_datagrams(
    sock: &DatagramSocket,
    size: usize,
    busy: bool,
    msgs: &AtomicU64,
    stop: &AtomicBool,
) -> anyhow::Result<ServerReport> {
    const SLICE: Duration = Duration::from_millis(20);
    let mut bytes = 0u64;
    let mut deadline = Instant::now() + SLICE;
    let mut spins = 0u32;
    while !stop.load(Ordering::Relaxed) {
        let got = if busy {
            spins = spins.wrapping_add(1);
            // Let the sender in this guest have the core now and then.
            if spins % 64 == 0 {
                std::thread::yield_now();
            }
            sock.try_recv_from()
        } else {
            let r = sock.recv_from(Some(deadline));
            if matches!(r, Err(RecvError::Timeout)) {
                deadline = Instant::now() + SLICE;
            }
            r
        };
        match got {
            Ok((d, _)) if d.len() == size => {
                bytes += d.len() as u64;
                msgs.fetch_add(1, Ordering::Relaxed);
            }
            Ok((d, from)) => bail!("a datagram of {} B from {from}, not {size} B", d.len()),
            Err(RecvError::Timeout | RecvError::Empty) => {}
            Err(e) => return Err(e).context("receiving datagrams"),
        }
    }
    Ok(ServerReport { msgs: msgs.load(Ordering::Relaxed), bytes, timed_ns: 0 })
}
