//! What one test is, and the control messages client and server exchange.
//!
//! The client drives: for each test it sends a [`Ctl::Start`] with the whole
//! [`Spec`] over the control connection (typed zerocast messages over
//! `tcp://`), the server opens a data endpoint shaped for that test and
//! answers [`Ctl::Ready`] with where it listens (or [`Ctl::Refused`] with
//! why it cannot), the client runs the test on a fresh data connection, and
//! the server ends it with a [`Ctl::Report`] of what it received. So the
//! server needs no options that must match the client's, and every test
//! gets a pool and a window sized for its message size.

use std::fmt;
use std::str::FromStr;

use anyhow::{bail, Context as _};
use serde::{Deserialize, Serialize};
use zerocast::core::uri::UriError;
use zerocast::{Endpoint, Scheme};

/// Version of the control protocol; a mismatch is refused.
pub(crate) const PROTOCOL: u32 = 3;

/// The largest message size, and the top of the `-a` sweep.
pub(crate) const MAX_SIZE: usize = 8 << 20;

/// Bytes in flight are capped at this, whatever the window: a window of
/// 64 × 8 MiB would map half a gigabyte on each side.
pub(crate) const MAX_INFLIGHT_BYTES: usize = 32 << 20;

/// The smallest window the link accepts.
pub(crate) const MIN_WINDOW: u32 = 4;

/// What is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Mode {
    /// One-way streaming bandwidth, as `ib_send_bw`.
    Bw,
    /// Ping-pong latency, reported as half the round trip, as `ib_send_lat`.
    Lat,
    /// Small-message rate: `bw` with 64-byte messages and a deep window.
    Rate,
}

impl Mode {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Mode::Bw => "bw",
            Mode::Lat => "lat",
            Mode::Rate => "rate",
        }
    }

    /// Default message size, as perftest's (`rate`: 64 B).
    pub(crate) fn default_size(self) -> usize {
        match self {
            Mode::Bw => 65_536,
            Mode::Lat => 2,
            Mode::Rate => 64,
        }
    }

    /// Default iteration count, as perftest's.
    pub(crate) fn default_iters(self) -> u64 {
        match self {
            Mode::Bw => 5_000,
            Mode::Lat => 1_000,
            Mode::Rate => 100_000,
        }
    }

    /// Default window (messages in flight): for `bw` and `lat` the
    /// library's own, what `zerocast::connect` gives a user; for `rate` a
    /// deep one.
    pub(crate) fn default_window(self) -> u32 {
        match self {
            Mode::Bw | Mode::Lat => zerocast::LinkConfig::default().recv_window,
            Mode::Rate => 256,
        }
    }
}

/// How the application side waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Poll {
    /// Spin on `try_recv`/`try_send`: the receiving thread polls the socket
    /// or CQ itself (RDMA: `CompletionMode::BusyPoll`).
    Busy,
    /// Block in `recv`/`send`: the receiving thread polls briefly, then
    /// sleeps (RDMA: on a completion channel, `CompletionMode::Channel`).
    Event,
}

impl Poll {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Poll::Busy => "busy",
            Poll::Event => "event",
        }
    }
}

/// A transport as given to `--transport`: a scheme, or a full URI whose
/// host is the data address the client connects to, whose non-zero port is
/// the data port the server listens on, and whose query parameters go to
/// both sides.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Transport {
    pub(crate) scheme: String,
    pub(crate) host: Option<String>,
    pub(crate) port: Option<u16>,
    /// `k=v&k2=v2`, or empty.
    pub(crate) query: String,
}

impl Transport {
    pub(crate) fn scheme(&self) -> Scheme {
        self.scheme.parse().expect("checked when parsed")
    }

    /// The URI of the data endpoint at `host:port` (`mem://`: `host` is the name).
    pub(crate) fn uri(&self, host: &str, port: u16) -> String {
        let q = if self.query.is_empty() { String::new() } else { format!("?{}", self.query) };
        match self.scheme() {
            Scheme::Mem => format!("mem://{host}{q}"),
            _ if host.contains(':') => format!("{}://[{host}]:{port}{q}", self.scheme),
            _ => format!("{}://{host}:{port}{q}", self.scheme),
        }
    }

    /// Whether the data path is datagrams (`ud://`).
    pub(crate) fn is_datagram(&self) -> bool {
        self.scheme() == Scheme::Ud
    }
}

impl FromStr for Transport {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<Self> {
        let t = if s.contains("://") {
            let ep = Endpoint::parse(s).with_context(|| format!("bad transport URI `{s}`"))?;
            let text = ep.to_string();
            let query = text.split_once('?').map(|(_, q)| q.to_owned()).unwrap_or_default();
            let port = ep.port().filter(|&p| p != 0);
            let host = (ep.scheme() != Scheme::Mem).then(|| ep.host().to_owned());
            Transport { scheme: ep.scheme().as_str().to_owned(), host, port, query }
        } else {
            let scheme: Scheme = s.parse().map_err(|e: UriError| anyhow::anyhow!("{e}"))?;
            Transport { scheme: scheme.as_str().to_owned(), host: None, port: None, query: String::new() }
        };
        match t.scheme() {
            Scheme::Tcp | Scheme::Mem | Scheme::Rc | Scheme::RcOob | Scheme::Ud => {}
            other => bail!("{other}:// cannot be measured; use tcp, mem, rc, rc+oob or ud"),
        }
        if t.query.split('&').any(|kv| kv.starts_with("window=")) {
            bail!("set the window with --inflight, not with `window=` in the transport URI");
        }
        Ok(t)
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.scheme)?;
        if !self.query.is_empty() {
            write!(f, "?{}", self.query)?;
        }
        Ok(())
    }
}

/// One test: everything both sides need to run it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Spec {
    pub(crate) protocol: u32,
    pub(crate) mode: Mode,
    pub(crate) transport: Transport,
    /// Payload bytes per message.
    pub(crate) size: usize,
    /// Messages (bw, rate) or round trips (lat); ignored when `duration_ms` is set.
    pub(crate) iters: u64,
    /// Run for this long instead of a fixed count.
    pub(crate) duration_ms: Option<u64>,
    /// Receive window (credits), already capped by [`MAX_INFLIGHT_BYTES`].
    pub(crate) window: u32,
    pub(crate) typed: bool,
    pub(crate) poll: Poll,
    /// Through the async API (`zerocast::tokio`, on a current-thread
    /// runtime that also drives the engines), both ends.
    pub(crate) async_api: bool,
    /// Datagrams handed to the socket per `send_batch` call (1: `send_to`
    /// each). Only the sending side reads it.
    pub(crate) post_list: u32,
}

impl Spec {
    /// Check what a peer may send: sizes, windows, modes the transport supports.
    pub(crate) fn validate(&self) -> anyhow::Result<()> {
        if self.protocol != PROTOCOL {
            bail!(
                "control protocol {} is not {PROTOCOL}; run the same zerocast-perf on both ends",
                self.protocol
            );
        }
        if self.size == 0 || self.size > MAX_SIZE {
            bail!("message size {} must be within 1..={MAX_SIZE}", self.size);
        }
        if self.mode != Mode::Lat && self.size < 2 {
            bail!("bw and rate need messages of at least 2 bytes");
        }
        if !(MIN_WINDOW..=65_535).contains(&self.window) {
            bail!("window {} must be within {MIN_WINDOW}..=65535", self.window);
        }
        if self.iters == 0 && self.duration_ms.is_none() {
            bail!("iterations must be at least 1");
        }
        if !(1..=1024).contains(&self.post_list) {
            bail!("post list {} must be within 1..=1024", self.post_list);
        }
        if self.duration_ms == Some(0) {
            bail!("duration must be above 0");
        }
        if self.transport.is_datagram() {
            if self.mode == Mode::Lat {
                bail!("ud:// is best-effort; it measures bw and rate, not lat");
            }
            if self.typed {
                bail!("--typed needs a connection (Sender<T>); ud:// is datagrams");
            }
            if self.async_api {
                bail!("--async needs a connection; ud:// is datagrams");
            }
        }
        if self.async_api && (self.typed || self.poll == Poll::Busy) {
            bail!("--async runs the raw API in event mode: it takes neither --typed nor --poll busy");
        }
        Ok(())
    }

    /// Largest payload a data connection of this test must accept: the
    /// message, plus room for a typed message's envelope.
    pub(crate) fn max_payload(&self) -> usize {
        (self.size + 64).next_multiple_of(64)
    }
}

/// The window for a message size: `requested`, but at most
/// [`MAX_INFLIGHT_BYTES`] in flight and at least [`MIN_WINDOW`].
pub(crate) fn capped_window(requested: u32, size: usize) -> u32 {
    let by_bytes = (MAX_INFLIGHT_BYTES / size.max(1)).min(u32::MAX as usize) as u32;
    requested.min(by_bytes).max(MIN_WINDOW)
}

/// Untimed messages a stream (bw, rate) sends first: two windows, so the
/// pools have mapped their regions and the pipe is full when the clock
/// starts.
pub(crate) fn warmup(window: u32) -> u64 {
    2 * u64::from(window)
}

/// What the server measured on its side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ServerReport {
    /// Messages received (bw, rate) or echoed (lat).
    pub(crate) msgs: u64,
    /// Payload bytes received.
    pub(crate) bytes: u64,
    /// Streams: nanoseconds from the arrival of the first timed message
    /// (the one after the [`warmup`]) to the end of the stream, the
    /// receiver's clock, as ZeroMQ's `local_thr` keeps it; 0 if none came.
    pub(crate) timed_ns: u64,
}

/// A control message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Ctl {
    /// Client → server: run this test.
    Start(Spec),
    /// Server → client: the data endpoint listens at this port (`mem://`: this name).
    Ready { port: u16, name: String },
    /// Server → client: the test cannot run, and why.
    Refused(String),
    /// Client → server (datagrams only): every datagram was sent; this many.
    Sent(u64),
    /// Server → client: the test is over on this side.
    Report(ServerReport),
    /// Server → client: the test failed on this side.
    Failed(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transports_parse_from_schemes_and_uris() {
        let t: Transport = "tcp".parse().unwrap();
        assert_eq!(t.uri("10.0.0.1", 7), "tcp://10.0.0.1:7");
        let t: Transport = "rc://10.0.2.15:7471?dev=rxe0".parse().unwrap();
        assert_eq!((t.host.as_deref(), t.port), (Some("10.0.2.15"), Some(7471)));
        assert_eq!(t.uri("h", 9), "rc://h:9?dev=rxe0");
        assert_eq!(t.to_string(), "rc?dev=rxe0");
        let t: Transport = "mem".parse().unwrap();
        assert_eq!(t.uri("perf-1", 0), "mem://perf-1");
        assert_eq!("tcp".parse::<Transport>().unwrap().uri("::1", 5), "tcp://[::1]:5");
        assert!("bogus".parse::<Transport>().unwrap_err().to_string().contains("unknown transport scheme"));
        assert!("mcast".parse::<Transport>().is_err());
        assert!("tcp://h:1?window=9".parse::<Transport>().unwrap_err().to_string().contains("--inflight"));
        assert!("tcp://h:1?nope=1".parse::<Transport>().is_err());
    }

    #[test]
    fn window_is_capped_by_bytes_in_flight() {
        assert_eq!(capped_window(64, 64), 64);
        assert_eq!(capped_window(64, 1 << 20), 32);
        assert_eq!(capped_window(64, 8 << 20), MIN_WINDOW);
        assert_eq!(capped_window(1, 64), MIN_WINDOW);
    }

    #[test]
    fn specs_from_a_peer_are_checked() {
        let ok = Spec {
            protocol: PROTOCOL,
            mode: Mode::Bw,
            transport: "tcp".parse().unwrap(),
            size: 4096,
            iters: 10,
            duration_ms: None,
            window: 16,
            typed: false,
            poll: Poll::Event,
            async_api: false,
            post_list: 1,
        };
        ok.validate().unwrap();
        let bad = |f: &dyn Fn(&mut Spec)| {
            let mut s = ok.clone();
            f(&mut s);
            s.validate().unwrap_err().to_string()
        };
        assert!(bad(&|s| s.size = 0).contains("message size"));
        assert!(bad(&|s| s.size = MAX_SIZE + 1).contains("message size"));
        assert!(bad(&|s| s.window = 1).contains("window"));
        assert!(bad(&|s| s.protocol = 99).contains("protocol"));
        assert!(bad(&|s| s.iters = 0).contains("iterations"));
        assert!(bad(&|s| {
            s.transport = "ud".parse().unwrap();
            s.mode = Mode::Lat;
        })
        .contains("ud://"));
    }
}
