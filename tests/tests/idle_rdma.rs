//! Idle `rc://` and `rc+oob://` connections cost no thread of their own,
//! and the engine that drives them sleeps (see `zerocast_tests::idle`): in
//! `epoll_wait` on its completion channel and the rdma_cm event channel
//! (or the `rc+oob://` side channels), until something happens. So does
//! the engine that reads an idle `ud://` socket's rdma_cm events.
//!
//! They need a verbs device: ignored on a plain `cargo test`;
//! `scripts/test` runs them inside the Soft-RoCE guest, one at a time.

#![cfg(feature = "rdma")]

use std::time::Duration;

use zerocast::datagram::Backend;
use zerocast::rdma::{CompletionMode, RcConfig};
use zerocast::{Config, LinkConfig, Zerocast};
use zerocast_tests::datagram_suite::DatagramEnv;
use zerocast_tests::{idle, Transport};

fn addr() -> String {
    std::env::var("ZEROCAST_RDMA_ADDR").unwrap_or_else(|_| "10.0.2.15".to_owned())
}

fn check(scheme: &str, threads: usize) {
    check_at(&format!("{scheme}://{}:0", addr()), threads);
}

/// A pair of connections over `uri` starts exactly `threads` threads, and
/// they sleep.
fn check_at(uri: &str, threads: usize) {
    let uri: &'static str = Box::leak(uri.to_owned().into_boxed_str());
    let rc = RcConfig::default().with_completion(CompletionMode::Channel);
    let cfg = Config::default().with_link(LinkConfig::default().with_recv_window(32)).with_rc(rc);
    let t = Transport { zc: Zerocast::with_config(cfg), listen_uri: uri };
    let n = idle::an_idle_connection_sleeps(&t, Duration::from_millis(500), Duration::from_secs(2), 3);
    assert_eq!(n, threads, "threads started for a pair of connections");
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn an_idle_rc_connection_does_not_wake() {
    // The engine, for both sides.
    check("rc", 1);
}

/// Event-mode completions and a window of 32.
fn cfg_channel() -> Config {
    let rc = RcConfig::default().with_completion(CompletionMode::Channel);
    Config::default().with_link(LinkConfig::default().with_recv_window(32)).with_rc(rc)
}

/// In event mode, an application thread blocked in `recv` on an idle
/// connection sleeps until a completion event rings its eventfd or
/// something else happens, and so does one blocked in `send` for credit a
/// silent peer never returns: no timed slices. A local close ends that
/// send (its thread's interrupt, on which it sleeps, is rung).
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn threads_blocked_on_an_idle_rc_connection_do_not_wake() {
    for scheme in ["rc", "rc+oob"] {
        let uri: &'static str = Box::leak(format!("{scheme}://{}:0", addr()).into_boxed_str());
        let t = Transport { zc: Zerocast::with_config(cfg_channel()), listen_uri: uri };
        // The receiving thread and the engine.
        assert_eq!(idle::a_blocked_receiver_sleeps(&t, Duration::from_secs(2), 3), 2, "{scheme}");
        // The sending thread (the engine is counted above).
        assert_eq!(idle::a_sender_blocked_on_credit_sleeps(&t, Duration::from_secs(2), 3), 1, "{scheme}");
    }
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn an_idle_rc_oob_connection_does_not_wake() {
    // The engine, for both sides.
    check("rc+oob", 1);
}

/// With a shared receive queue, the transport's async event reader runs
/// too (one per transport), asleep on the device's event queue.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn an_idle_rc_connection_on_a_shared_receive_queue_does_not_wake() {
    check_at(&format!("rc://{}:0?srq=256", addr()), 2);
}

/// The engine that reads an idle `ud://` socket's rdma_cm events sleeps,
/// and so do two threads blocked in `recv_from` with no deadline: one in
/// the completion channel's wait, the other waiting for its turn at the
/// receive queue. A datagram each then wakes them.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn an_idle_ud_socket_does_not_wake() {
    let env =
        DatagramEnv { zc: Zerocast::with_config(Config::default()), host: addr(), backend: Backend::RdmaUd };
    let open = || {
        let socket = std::sync::Arc::new(env.bind());
        let receivers: Vec<_> = (0..2)
            .map(|i| {
                let s = socket.clone();
                std::thread::Builder::new()
                    .name(format!("zerocast-test-ud-recv-{i}"))
                    .spawn(move || s.recv_from(None).map(|(d, _)| d.to_vec()).expect("a datagram"))
                    .expect("spawning a receiver")
            })
            .collect();
        (socket, receivers)
    };
    let ((socket, receivers), n) =
        idle::stays_asleep(open, Duration::from_millis(500), Duration::from_secs(2), 3);
    assert!(n >= 3, "the engine and the two receivers: {n}");
    let sender = env.bind();
    for byte in [1u8, 2] {
        let mut b = sender.alloc(1, None).expect("alloc");
        b[0] = byte;
        sender.send_to(b, &socket.local_addr()).map_err(|(_, e)| e).expect("send");
    }
    let mut got: Vec<Vec<u8>> = receivers.into_iter().map(|r| r.join().expect("receiver")).collect();
    got.sort();
    assert_eq!(got, [vec![1], vec![2]], "each receiver woke with a datagram");
}
