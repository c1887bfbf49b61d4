//! The client role: ask the server for a test, run it, turn it into a row.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use zerocast::{Receiver, Scheme, Sender, Zerocast};

use crate::clock::{Calibration, ClockKind, SampleClock};
use crate::data::{context_for, early, DataPath};
use crate::open::Opener;
use crate::progress::Progress;
use crate::report::Row;
use crate::spec::{Ctl, Mode, ServerReport, Spec};
use crate::stats::{bw_row, LatSamples, Slices};

/// How long to wait for the server's word on a test that failed here.
const WHY_WAIT: Duration = Duration::from_secs(2);

/// A control connection to a server.
#[derive(Debug)]
pub(crate) struct Session {
    tx: Sender<Ctl>,
    rx: Receiver<Ctl>,
    host: String,
    /// What latency samples are timed with.
    clock: ClockKind,
}

impl Session {
    pub(crate) fn connect(host: &str, port: u16, clock: ClockKind) -> anyhow::Result<Self> {
        let h = if host.contains(':') { format!("[{host}]") } else { host.to_owned() };
        let uri = format!("tcp://{h}:{port}");
        let conn = Zerocast::new().connect(&uri).with_context(|| {
            format!("cannot reach a zerocast-perf server at {uri} (is one running there?)")
        })?;
        let (tx, rx) = conn.split();
        Ok(Self { tx, rx, host: host.to_owned(), clock })
    }

    /// Run one test; `data` receives where the data endpoint is, once known.
    pub(crate) fn run(&self, spec: &Spec, progress: &Progress, data: &mut String) -> anyhow::Result<Row> {
        self.tx.send(Ctl::Start(spec.clone())).map_err(|e| anyhow!("control connection: {}", e.map(drop)))?;
        let (port, name) = match self.rx.recv().context("waiting for the server to accept the test")? {
            Ctl::Ready { port, name } => (port, name),
            Ctl::Refused(why) => bail!("the server refused the test: {why}"),
            other => bail!("the server sent {other:?} where Ready was expected"),
        };
        let host = spec.transport.host.as_deref().unwrap_or(&self.host);
        *data = match spec.transport.scheme() {
            Scheme::Mem => spec.transport.uri(&name, 0),
            _ => spec.transport.uri(host, port),
        };
        let r = if spec.transport.is_datagram() {
            self.datagrams(spec, host, port, progress)
        } else {
            self.connection(spec, data, progress)
        };
        r.map_err(|e| self.server_side(e))
    }

    /// A failed test may have failed at the server first: prefer its reason.
    fn server_side(&self, e: anyhow::Error) -> anyhow::Error {
        match self.rx.recv_timeout(WHY_WAIT) {
            Ok(Ctl::Failed(why)) => e.context(format!("the server failed: {why}")),
            _ => e,
        }
    }

    fn report(&self) -> anyhow::Result<ServerReport> {
        match self.rx.recv().context("waiting for the server's report")? {
            Ctl::Report(r) => Ok(r),
            Ctl::Failed(why) => bail!("the server failed: {why}"),
            other => bail!("the server sent {other:?} where a report was expected"),
        }
    }

    fn connection(&self, spec: &Spec, uri: &str, progress: &Progress) -> anyhow::Result<Row> {
        let dp = Opener::for_spec(spec)?.connect(uri, spec)?;
        match spec.mode {
            Mode::Lat => self.lat(&dp, spec, progress),
            Mode::Bw | Mode::Rate => self.bw(&dp, spec, progress),
        }
    }

    /// Streaming: two windows of untimed warm-up (the pools map their
    /// regions on first use), then the timed messages, from a full pipe
    /// until the server has every one. The time is the receiver's (see
    /// [`receiver_elapsed`]); this side's clock, which also runs while the
    /// warm-up still in flight is delivered, only when the server has none.
    fn bw(&self, dp: &DataPath, spec: &Spec, progress: &Progress) -> anyhow::Result<Row> {
        let warmup = crate::spec::warmup(spec.window);
        let until = Until::new(spec);
        let mut slices = Slices::new(spec.window, spec.duration_ms.is_none().then_some(spec.iters));
        // The whole stream is one loop, which the async API runs in one
        // task, as an async application would (see `DataPath::drive`).
        let (i, start) = dp.drive(async {
            for seq in 0..warmup {
                dp.send_async(seq).await.with_context(|| format!("sending warm-up message {seq}"))?;
            }
            let start = Instant::now();
            let mut i = 0u64;
            while !until.done(i, start) {
                let seq = warmup + i;
                dp.send_async(seq).await.with_context(|| format!("sending message {seq}"))?;
                slices.sent(i);
                i += 1;
                if i % 1024 == 0 {
                    progress.test_at(until.fraction(i, start));
                }
            }
            Ok((i, start))
        })?;
        dp.close();
        let report = self.report()?;
        let elapsed = receiver_elapsed(report.timed_ns, i).unwrap_or_else(|| start.elapsed());
        let total = warmup + i;
        if report.msgs != total || report.bytes != total * spec.size as u64 {
            bail!("the server received {} messages ({} B) of {total} sent", report.msgs, report.bytes);
        }
        Ok(Row::Bw(bw_row(spec.size, i, i, elapsed, &slices)))
    }

    fn lat(&self, dp: &DataPath, spec: &Spec, progress: &Progress) -> anyhow::Result<Row> {
        let warmup = match spec.duration_ms {
            Some(_) => 100,
            None => (spec.iters / 10).min(100),
        };
        let until = Until::new(spec);
        let mut samples = LatSamples::new();
        let (i, cal) = match dp.raw() {
            Some(conn) => self.lat_raw(dp, conn, warmup, &until, &mut samples, progress)?,
            None => self.lat_async(dp, warmup, &until, &mut samples, progress)?,
        };
        dp.close();
        let report = self.report()?;
        if report.msgs != warmup + i {
            bail!("the server echoed {} of {} messages", report.msgs, warmup + i);
        }
        cal.check().map_err(|why| anyhow!("{why}: time the samples with --clock monotonic"))?;
        Ok(Row::Lat(samples.row(spec.size, cal.ns_per_tick)))
    }

    /// The ping-pong of [`Session::lat`] as one future, which the async API
    /// runs in one task, as an async application would (see
    /// `DataPath::drive`); round trips timed and how the clock ran.
    fn lat_async(
        &self,
        dp: &DataPath,
        warmup: u64,
        until: &Until,
        samples: &mut LatSamples,
        progress: &Progress,
    ) -> anyhow::Result<(u64, Calibration)> {
        dp.drive(async {
            for seq in 0..warmup {
                dp.send_async(seq).await?;
                dp.recv_expect(seq).await?;
            }
            // Each reply is held until the next message is sent (see
            // `DataPath::recv_then`): neither giving the buffer back nor
            // taking the next message's buffer from the pool
            // (`DataPath::prepare`) is on the round trip.
            let mut trips = RoundTrips::start(self.clock, until);
            let mut more = trips.goes_on();
            if more {
                dp.send_async(warmup).await.with_context(|| format!("sending message {warmup}"))?;
            }
            trips.sent_first();
            while more {
                // The next request's buffer, taken while this reply travels.
                dp.prepare().await?;
                let seq = warmup + trips.done;
                // Decided before the reply arrives, and once: whether message
                // `seq + 1` goes out is what the server will have echoed.
                more = trips.goes_on_after_this();
                let next = more;
                dp.recv_expect_then(seq, |_| async move {
                    match next {
                        true => dp
                            .send_async(seq + 1)
                            .await
                            .with_context(|| format!("sending message {}", seq + 1)),
                        false => Ok(()),
                    }
                })
                .await?;
                trips.replied(samples, progress);
            }
            Ok(trips.finish())
        })
    }

    /// [`Session::lat_async`] over the blocking raw API: the same steps, one
    /// call after another, with no future between them.
    fn lat_raw(
        &self,
        dp: &DataPath,
        conn: &zerocast::Connection,
        warmup: u64,
        until: &Until,
        samples: &mut LatSamples,
        progress: &Progress,
    ) -> anyhow::Result<(u64, Calibration)> {
        // Receive message `seq`, then send `next`, if any, while it is held.
        let expect_then = |seq: u64, next: Option<u64>| -> anyhow::Result<()> {
            let reply = dp.recv_raw_then(conn, |got| {
                dp.check(got, seq)?;
                match next {
                    Some(n) => dp.send_raw(conn, n).with_context(|| format!("sending message {n}")),
                    None => Ok(()),
                }
            })?;
            reply.ok_or_else(|| early(seq))
        };
        for seq in 0..warmup {
            dp.send_raw(conn, seq)?;
            expect_then(seq, None)?;
        }
        let mut trips = RoundTrips::start(self.clock, until);
        let mut more = trips.goes_on();
        if more {
            dp.send_raw(conn, warmup).with_context(|| format!("sending message {warmup}"))?;
        }
        trips.sent_first();
        while more {
            dp.prepare_raw(conn)?;
            let seq = warmup + trips.done;
            more = trips.goes_on_after_this();
            expect_then(seq, more.then_some(seq + 1))?;
            trips.replied(samples, progress);
        }
        Ok(trips.finish())
    }

    fn datagrams(&self, spec: &Spec, host: &str, port: u16, progress: &Progress) -> anyhow::Result<Row> {
        let to: SocketAddr = (host, port)
            .to_socket_addrs()
            .with_context(|| format!("resolving {host}"))?
            .next()
            .ok_or_else(|| anyhow!("{host} has no address"))?;
        let zc = context_for(spec);
        // Bind on the address that reaches the server, so that on an RDMA
        // device ud:// is RDMA UD, as at the server (the wildcard is UDP).
        let local = local_ip_towards(to).with_context(|| format!("finding the local address for {to}"))?;
        let uri = match local {
            IpAddr::V6(ip) => format!("ud://[{ip}]:0"),
            IpAddr::V4(ip) => format!("ud://{ip}:0"),
        };
        let sock = zc.bind_datagram(&uri).with_context(|| format!("binding {uri}"))?;
        // The route is resolved before the clock starts, as perftest
        // exchanges its addresses before timing.
        sock.resolve(&to).with_context(|| format!("resolving the route to {to}"))?;
        // So is the send pool grown (mapped and registered) beforehand: more
        // buffers than a send queue holds in flight.
        sock.pool()
            .reserve(spec.size, DATAGRAM_BUFFERS + spec.post_list as usize)
            .context("growing the send pool")?;
        let until = Until::new(spec);
        let mut slices = Slices::new(spec.window, spec.duration_ms.is_none().then_some(spec.iters));
        let start = Instant::now();
        let mut i = 0u64;
        let post_list = u64::from(spec.post_list);
        let mut batch = Vec::with_capacity(spec.post_list as usize);
        while !until.done(i, start) {
            // A whole list, unless a count ends the run first. A duration
            // is checked at multiples of 64, so the list stays aligned.
            let k = if until.duration.is_some() {
                post_list.min(64 - i % 64)
            } else {
                post_list.min(until.iters - i)
            };
            for j in i..i + k {
                let mut buf = sock.alloc(spec.size, None)?;
                let n = buf.len().min(8);
                buf[..n].copy_from_slice(&j.to_le_bytes()[..n]);
                batch.push((buf, to));
            }
            if k == 1 {
                let (buf, to) = batch.pop().expect("one datagram");
                sock.send_to(buf, &to)
                    .map_err(|(_, e)| anyhow!(e).context(format!("sending datagram {i}")))?;
            } else {
                sock.send_batch(&mut batch)
                    .map_err(|e| anyhow!(e).context(format!("sending datagrams {i}..")))?;
            }
            for j in i..i + k {
                slices.sent(j);
                if (j + 1) % 1024 == 0 {
                    progress.test_at(until.fraction(j + 1, start));
                }
            }
            i += k;
        }
        let elapsed = start.elapsed();
        self.tx.send(Ctl::Sent(i)).map_err(|e| anyhow!("control connection: {}", e.map(drop)))?;
        let report = self.report()?;
        if report.msgs > i {
            bail!("the server counted {} datagrams of {i} sent", report.msgs);
        }
        Ok(Row::Bw(bw_row(spec.size, i, report.msgs, elapsed, &slices)))
    }
}

/// Send buffers the datagram sender's pool is grown to before timing.
const DATAGRAM_BUFFERS: usize = 1024;

/// The timed round trips of a latency test. One clock read per round trip,
/// each sample the time between two consecutive reads, as perftest does;
/// the clock is the cycle counter unless asked otherwise (see `clock`). The
/// read comes after the next message is sent, while its reply is on the way.
struct RoundTrips<'a> {
    until: &'a Until,
    start: Instant,
    clock: SampleClock,
    /// The last clock read.
    last: u64,
    /// Round trips timed so far.
    done: u64,
}

impl<'a> RoundTrips<'a> {
    fn start(kind: ClockKind, until: &'a Until) -> Self {
        let start = Instant::now();
        let clock = SampleClock::start(kind);
        Self { until, start, clock, last: 0, done: 0 }
    }

    /// Whether the test sends its first timed message.
    fn goes_on(&self) -> bool {
        !self.until.done(self.done, self.start)
    }

    /// Whether the test sends a message after the one now awaited.
    fn goes_on_after_this(&self) -> bool {
        !self.until.done(self.done + 1, self.start)
    }

    /// The first timed message is sent: its round trip starts now.
    fn sent_first(&mut self) {
        self.last = self.clock.now();
    }

    /// A reply came (and the next message, if any, is sent): one sample.
    fn replied(&mut self, samples: &mut LatSamples, progress: &Progress) {
        let now = self.clock.now();
        samples.record(self.clock.between(self.last, now));
        self.last = now;
        self.done += 1;
        if self.done % 256 == 0 {
            progress.test_at(self.until.fraction(self.done, self.start));
        }
    }

    /// Round trips timed, and how the clock ran.
    fn finish(&self) -> (u64, Calibration) {
        (self.done, self.clock.finish())
    }
}

/// When a run ends: after a count, or after a duration (checked every 64
/// messages, so the clock costs nothing per message).
#[derive(Debug, Clone, Copy)]
struct Until {
    iters: u64,
    duration: Option<Duration>,
}

impl Until {
    fn new(spec: &Spec) -> Self {
        Self { iters: spec.iters, duration: spec.duration_ms.map(Duration::from_millis) }
    }

    #[inline]
    fn done(&self, i: u64, start: Instant) -> bool {
        match self.duration {
            Some(d) => i % 64 == 0 && start.elapsed() >= d,
            None => i >= self.iters,
        }
    }

    fn fraction(&self, i: u64, start: Instant) -> f64 {
        match self.duration {
            Some(d) => start.elapsed().as_secs_f64() / d.as_secs_f64(),
            None => i as f64 / self.iters as f64,
        }
    }
}

/// Whether `scheme` only works with the server in this process (`--loopback`).
pub(crate) fn in_process_only(scheme: Scheme) -> bool {
    scheme == Scheme::Mem
}

/// The local address the kernel would send from to reach `to`.
fn local_ip_towards(to: SocketAddr) -> std::io::Result<IpAddr> {
    let probe = std::net::UdpSocket::bind(if to.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" })?;
    probe.connect(to)?;
    Ok(probe.local_addr()?.ip())
}

/// The time a stream of `timed` messages took, by the receiver's clock:
/// `timed_ns` runs from the first timed message's arrival to the stream's
/// end, which is the time of the other `timed - 1`, so it is scaled to
/// `timed`. The sender's clock would start while up to a window of warm-up
/// messages is still to be delivered, and count that time against the
/// timed messages. `None` for fewer than two timed messages, or a server
/// that timed nothing.
fn receiver_elapsed(timed_ns: u64, timed: u64) -> Option<Duration> {
    (timed_ns > 0 && timed >= 2)
        .then(|| Duration::from_nanos(timed_ns).mul_f64(timed as f64 / (timed - 1) as f64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_receivers_clock_covers_the_messages_after_the_first() {
        // 99 intervals of 1 µs after the first timed message: 100 messages
        // took 100 µs.
        assert_eq!(receiver_elapsed(99_000, 100), Some(Duration::from_micros(100)));
        assert_eq!(receiver_elapsed(0, 100), None, "a server that timed nothing");
        assert_eq!(receiver_elapsed(5_000, 1), None, "one message has no interval");
    }
}
