//! The async datagram assertions (`zerocast::tokio::DatagramSocket`) over
//! UDP and UDP multicast on loopback; `datagram_async_rdma.rs` runs the
//! same over RDMA UD in the Soft-RoCE guest.

use zerocast::datagram::Backend;
use zerocast_tests::async_datagram_suite::{self as suite, AsyncDatagramEnv};

fn run<Fut: std::future::Future<Output = ()>>(test: impl FnOnce(AsyncDatagramEnv) -> Fut) {
    AsyncDatagramEnv::run("127.0.0.1", Backend::Udp, test);
}

#[test]
fn async_unicast_10k_typed_and_reply() {
    run(|env| suite::unicast_typed(env, 10_000));
}

#[test]
fn async_ping_pong_wakes_every_time_10k() {
    run(|env| suite::ping_pong_wakes_every_time(env, 10_000));
}

#[test]
fn async_cancelled_receives_lose_nothing() {
    run(|env| suite::cancelled_receives_lose_nothing(env, 5_000));
}

#[test]
fn async_group_join_leave_rejoin() {
    run(|env| suite::group_join_leave_rejoin(env, suite::group(7)));
}
