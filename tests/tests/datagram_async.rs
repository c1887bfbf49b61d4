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
fn async_socket_shared_with_a_receiving_thread() {
    run(suite::shared_with_a_receiving_thread);
}

#[test]
fn async_group_join_leave_rejoin() {
    run(|env| suite::group_join_leave_rejoin(env, suite::group(7)));
}

/// A receive that finds the pool at its cap (every buffer of the receive
/// size held by the application) waits for a buffer, as a blocking receive
/// would, rather than failing; the datagram waits in the socket and comes
/// once a buffer is back.
#[test]
fn async_receive_waits_for_a_pool_buffer() {
    use std::time::Duration;
    use zerocast::tokio::Zerocast;
    use zerocast::{Config, PoolConfig, Wait};

    zerocast_tests::async_suite::run_async(|| async {
        let small = PoolConfig::default().with_region_size(1 << 20).with_max_bytes(4 << 20);
        let rx_zc = Zerocast::with_config(Config::default().with_pool(small));
        let rx = rx_zc.bind_datagram("ud://127.0.0.1:0").await.expect("bind");
        assert_eq!(rx.backend(), Backend::Udp);
        let tx = Zerocast::new().bind_datagram("ud://127.0.0.1:0").await.expect("bind");
        let mut held = Vec::new();
        loop {
            match rx.pool().alloc(rx.max_datagram(), Wait::No) {
                Ok(b) => held.push(b),
                Err(zerocast::PoolError::Exhausted { .. }) => break,
                Err(e) => panic!("filling the pool: {e}"),
            }
        }
        assert!(!held.is_empty());
        let mut b = tx.alloc(3).await.expect("alloc");
        b.copy_from_slice(b"abc");
        tx.send_to(b, &rx.local_addr()).await.map_err(|(_, e)| e).expect("send");
        let mut recv = std::pin::pin!(rx.recv_from());
        let early = tokio::time::timeout(Duration::from_millis(200), recv.as_mut()).await;
        assert!(early.is_err(), "no buffer to receive into: it waits, and does not fail: {early:?}");
        held.pop();
        let (d, from) =
            tokio::time::timeout(Duration::from_secs(30), recv).await.expect("woken").expect("recv");
        assert_eq!((&*d, from), (&b"abc"[..], tx.local_addr()));
    });
}
