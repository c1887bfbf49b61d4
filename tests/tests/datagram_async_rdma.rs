//! The async datagram assertions (`zerocast::tokio::DatagramSocket`) over
//! RDMA UD and UD multicast: a receiving task waits on the receive CQ's
//! completion channel through the engine.
//!
//! Every test needs a verbs device: ignored on a plain `cargo test`;
//! `scripts/test` runs them inside the Soft-RoCE guest, serially.

#![cfg(feature = "rdma")]

use zerocast::datagram::Backend;
use zerocast_tests::async_datagram_suite::{self as suite, AsyncDatagramEnv};

fn run<Fut: std::future::Future<Output = ()>>(test: impl FnOnce(AsyncDatagramEnv) -> Fut) {
    let addr = std::env::var("ZEROCAST_RDMA_ADDR").unwrap_or_else(|_| "10.0.2.15".to_owned());
    AsyncDatagramEnv::run(&addr, Backend::RdmaUd, test);
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn async_unicast_10k_typed_and_reply() {
    run(|env| suite::unicast_typed(env, 10_000));
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn async_ping_pong_wakes_every_time_10k() {
    run(|env| suite::ping_pong_wakes_every_time(env, 10_000));
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn async_cancelled_receives_lose_nothing() {
    run(|env| suite::cancelled_receives_lose_nothing(env, 5_000));
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn async_socket_shared_with_a_receiving_thread() {
    run(suite::shared_with_a_receiving_thread);
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn async_group_join_leave_rejoin() {
    run(|env| suite::group_join_leave_rejoin(env, suite::group(8)));
}

/// Resolving a destination that never answers (an address nothing on the
/// link owns, so rdma_cm's address resolution runs to its timeout) does
/// not hold the runtime: on a one-thread runtime, another task keeps
/// ticking all along, and the resolve (and a send to the same
/// destination) fails with the resolve error once the timeout passes.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn async_resolve_to_nobody_waits_without_holding_the_runtime() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    use zerocast::datagram::{DatagramError, UdConfig, UdError};
    use zerocast::tokio::Zerocast;
    use zerocast::Config;

    const TIMEOUT: Duration = Duration::from_millis(1500);
    let addr = std::env::var("ZEROCAST_RDMA_ADDR").unwrap_or_else(|_| "10.0.2.15".to_owned());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let mut ud = UdConfig::default();
        ud.resolve_timeout = TIMEOUT;
        let zc = Zerocast::with_config(Config::default().with_ud(ud));
        let sock = zc.bind_datagram(&format!("ud://{addr}:0")).await.expect("bind");
        assert_eq!(sock.backend(), Backend::RdmaUd);
        let ticks = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&ticks);
        let ticker = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
                counter.fetch_add(1, Ordering::SeqCst);
            }
        });
        // On eth0's subnet, owned by no one: its ARP goes unanswered.
        let nobody: std::net::SocketAddr = "10.0.2.213:4791".parse().expect("address");
        let start = Instant::now();
        let resolved = sock.resolve(&nobody).await;
        let took = start.elapsed();
        let ticked = ticks.load(Ordering::SeqCst);
        println!("resolve to nobody: {resolved:?} after {took:?}, {ticked} ticks meanwhile");
        let e = resolved.expect_err("nobody answered");
        assert!(matches!(e, DatagramError::Ud(UdError::Resolve { .. })), "{e:?}");
        assert!(took >= TIMEOUT / 2 && took < TIMEOUT * 4, "the resolve took {took:?}");
        assert!(
            ticked * 10 >= took.as_millis() as u64 / 4,
            "the runtime was held: {ticked} ticks in {took:?}"
        );
        // A send to it resolves the same way and hands the buffer back.
        let mut b = sock.alloc(8).await.expect("alloc");
        b.copy_from_slice(b"to nobod");
        let (back, e) = sock.send_to(b, &nobody).await.expect_err("nobody answered");
        assert_eq!(&back[..], b"to nobod");
        assert!(matches!(e, DatagramError::Ud(UdError::Resolve { .. })), "{e:?}");
        ticker.abort();
    });
}
