//! The datagram conformance suite over RDMA UD (`ud://`, `mcast://`
//! through the facade), the same assertions `datagram.rs` makes over UDP,
//! plus the facade's fallback to UDP for addresses that are not on the
//! RDMA device.
//!
//! Every test needs a verbs device: they are ignored on a plain `cargo
//! test`; `scripts/test` runs them inside the Soft-RoCE guest, serially.

#![cfg(feature = "rdma")]

use zerocast::datagram::Backend;
use zerocast::{Config, Zerocast};
use zerocast_tests::datagram_suite::{self as suite, DatagramEnv};

/// The address rxe0 is bound to in the guest.
fn addr() -> String {
    std::env::var("ZEROCAST_RDMA_ADDR").unwrap_or_else(|_| "10.0.2.15".to_owned())
}

fn env() -> DatagramEnv {
    DatagramEnv { zc: Zerocast::with_config(Config::default()), host: addr(), backend: Backend::RdmaUd }
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn unicast_10k_typed_and_reply() {
    suite::unicast_typed(&env(), 10_000);
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn oversize_is_refused_before_posting() {
    suite::oversize_refused(&env());
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn batches_arrive_in_order_and_a_refused_one_comes_back() {
    suite::batches_in_order(&env(), 100, 32);
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn join_leave_rejoin() {
    suite::join_leave_rejoin(&env());
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn loss_is_accounted() {
    suite::loss_accounting(&env(), 2000);
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn multicast_fanout_to_three_processes() {
    suite::multicast_fanout(&env(), "fanout_child", 3, 10_000);
}

/// A receiver process of `multicast_fanout_to_three_processes` (does
/// nothing unless started as one).
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn fanout_child() {
    suite::fanout_child(&env().zc, Backend::RdmaUd);
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn addresses_off_the_device_fall_back_to_udp() {
    let zc = Zerocast::new();
    let s = zc.bind_datagram("ud://127.0.0.1:0").expect("bind");
    assert_eq!(s.backend(), Backend::Udp, "127.0.0.1 is not an RDMA address");
    let m = zc.bind_datagram("mcast://239.9.9.9:9999").expect("bind");
    assert_eq!(m.backend(), Backend::Udp, "no iface: loopback multicast over UDP");
    let r = zc.bind_datagram(&format!("ud://{}:0", addr())).expect("bind");
    assert_eq!(r.backend(), Backend::RdmaUd);
    assert_eq!(r.max_datagram(), r.as_ud().expect("ud").mtu() as usize - 16);
}
