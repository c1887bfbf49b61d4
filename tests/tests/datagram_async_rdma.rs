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
