//! Datagram endpoints through the facade over UDP on loopback: the
//! datagram conformance suite (the same one `ud_rdma.rs` runs over RDMA UD
//! in the Soft-RoCE guest), and the facade's URI checks.

use zerocast::datagram::Backend;
use zerocast::{Config, Zerocast};
use zerocast_tests::datagram_suite::{self as suite, DatagramEnv};

fn env() -> DatagramEnv {
    DatagramEnv {
        zc: Zerocast::with_config(Config::default()),
        host: "127.0.0.1".into(),
        backend: Backend::Udp,
    }
}

#[test]
fn unicast_10k_typed_and_reply() {
    suite::unicast_typed(&env(), 10_000);
}

#[test]
fn oversize_is_refused() {
    suite::oversize_refused(&env());
}

#[test]
fn batches_arrive_in_order_and_a_refused_one_comes_back() {
    suite::batches_in_order(&env(), 100, 32);
}

#[test]
fn join_leave_rejoin() {
    suite::join_leave_rejoin(&env());
}

#[test]
fn loss_is_accounted() {
    let cfg = zerocast::datagram::UdpConfig { recv_buffer: Some(4096), ..Default::default() };
    let env = DatagramEnv { zc: Zerocast::with_config(Config::default().with_udp(cfg)), ..env() };
    suite::loss_accounting(&env, 2000);
}

#[test]
fn multicast_fanout_to_three_processes() {
    suite::multicast_fanout(&env(), "fanout_child", 3, 10_000);
}

/// A receiver process of `multicast_fanout_to_three_processes` (does
/// nothing unless started as one).
#[test]
fn fanout_child() {
    suite::fanout_child(&env().zc, Backend::Udp);
}

#[test]
fn connection_schemes_are_refused() {
    assert!(zerocast::datagram::bind("tcp://127.0.0.1:0").is_err());
    assert!(zerocast::connect("ud://127.0.0.1:9").is_err());
}
