//! The conformance suite: one set of assertions, run over every transport.
//!
//! Each function here takes a [`Transport`] under test and checks one
//! promise zerocast makes whatever the URI: integrity, backpressure,
//! disconnect semantics, typed round-trips, no leaked buffers. The test
//! binaries in `tests/` instantiate the suite for `mem://` and `tcp://`
//! (and, inside the Soft-RoCE guest, `rc://`).

#![forbid(unsafe_code)]

pub mod async_datagram_suite;
pub mod async_suite;
pub mod checksum;
pub mod datagram_suite;
pub mod direct_io;
pub mod failure;
pub mod idle;
pub mod integrity;
pub mod many;
pub mod many_async;
pub mod process;
pub mod raw_tcp;
pub mod readiness;
pub mod suite;

use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use zerocast::{Config, Connection, LinkConfig, Listener, Zerocast};

/// A transport under test: how to make a connected pair.
#[derive(Debug, Clone)]
pub struct Transport {
    /// Opens connections; its pool is the one checked for leaks.
    pub zc: Zerocast,
    /// URI to listen at; `{n}` is replaced by a unique number.
    pub listen_uri: &'static str,
}

impl Transport {
    /// `scheme` with default settings and the given receive window.
    pub fn new(listen_uri: &'static str, window: u32) -> Self {
        let cfg = Config::default().with_link(LinkConfig::default().with_recv_window(window));
        Transport { zc: Zerocast::with_config(cfg), listen_uri }
    }

    /// A listener at [`Transport::listen_uri`].
    pub fn listen(&self) -> Listener {
        static N: AtomicU64 = AtomicU64::new(0);
        let uri = self.listen_uri.replace("{n}", &N.fetch_add(1, Ordering::Relaxed).to_string());
        self.zc.listen(&uri).expect("listen")
    }

    /// A connected pair: (client, server).
    pub fn pair(&self) -> (Connection, Connection) {
        let listener = self.listen();
        let at = listener.local_endpoint().to_string();
        let zc = self.zc.clone();
        let client = thread::spawn(move || zc.connect(&at).expect("connect"));
        let server = listener.accept().expect("accept");
        (client.join().expect("connect thread"), server)
    }

    /// Wait until every pool buffer is back (I/O threads release theirs
    /// asynchronously), or fail after `timeout`.
    pub fn assert_pool_drained(&self, timeout: Duration) {
        assert_pool_drained(&self.zc.pool().expect("pool"), timeout);
    }
}

/// Wait until every buffer of `pool` is back, or fail after `timeout`.
pub fn assert_pool_drained(pool: &zerocast::Pool, timeout: Duration) {
    let start = Instant::now();
    loop {
        let s = pool.stats();
        if s.buffers_in_use == 0 {
            assert_eq!(s.buffers_free, s.buffers_total);
            return;
        }
        assert!(start.elapsed() < timeout, "buffers leaked: {s:?}");
        thread::sleep(Duration::from_millis(10));
    }
}

/// One more client of `zc` is refused by `listener`, which has no room
/// left: the client sees `Refused` with `why` in its message, the listener
/// counts the refusal (its accept goes on waiting, and neither an accept
/// nor a failed handshake is counted), and keeps working.
pub fn assert_one_more_refused(zc: &zerocast::Zerocast, listener: &zerocast::Listener, why: &str) {
    let (zc, at) = (zc.clone(), listener.local_endpoint().to_string());
    let before = listener.stats();
    let client = thread::spawn(move || zc.connect(&at));
    let start = Instant::now();
    while listener.stats().refused == before.refused {
        assert!(start.elapsed() < Duration::from_secs(60), "the listener never refused the client");
        match listener.accept_timeout(Duration::from_millis(200)) {
            Err(zerocast::AcceptError::Timeout) => {}
            other => panic!("the listener has no room left, yet accept gave {other:?}"),
        }
    }
    let after = listener.stats();
    assert_eq!(after.refused, before.refused + 1, "{after:?}");
    assert_eq!((after.accepted, after.handshakes_failed), (before.accepted, before.handshakes_failed));
    match client.join().expect("connect thread") {
        Err(zerocast::ConnectError::Refused(msg)) => {
            println!("client: {msg}");
            assert!(msg.contains(why), "{msg}");
        }
        other => panic!("the client was not refused: {other:?}"),
    }
}

/// rxe's RNR counters, `(rcvd_rnr_err, send_rnr_err)`, of the device in
/// `ZEROCAST_RDMA_DEV` (default `rxe0`): unchanged across a test, they show
/// that no receiver-not-ready happened.
pub fn rnr_counters() -> (u64, u64) {
    (hw_counter("rcvd_rnr_err"), hw_counter("send_rnr_err"))
}

/// One of rxe's port counters (`hw_counters/NAME`) of the device in
/// `ZEROCAST_RDMA_DEV` (default `rxe0`).
pub fn hw_counter(name: &str) -> u64 {
    let dev = std::env::var("ZEROCAST_RDMA_DEV").unwrap_or_else(|_| "rxe0".to_owned());
    let path = format!("/sys/class/infiniband/{dev}/ports/1/hw_counters/{name}");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {path}: {e}"))
        .trim()
        .parse::<u64>()
        .unwrap_or_else(|e| panic!("parsing {path}: {e}"))
}
