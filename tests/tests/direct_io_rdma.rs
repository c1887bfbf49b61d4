//! Caller-driven I/O on `rc://` and `rc+oob://`, in both completion modes
//! (see `zerocast_tests::direct_io`): a send posts its own work request
//! when the link is quiet, a receive polls the CQ itself, a released
//! message's buffer is reposted by the thread that drops it.
//!
//! Every test needs a verbs device: they are ignored on a plain `cargo
//! test`; `scripts/test` runs them inside the Soft-RoCE guest.

#![cfg(feature = "rdma")]

use std::time::Duration;

use zerocast::rdma::{CompletionMode, RcConfig};
use zerocast::{Config, LinkConfig, Zerocast};
use zerocast_tests::{direct_io, Transport};

fn transport(scheme: &str, mode: CompletionMode) -> Transport {
    transport_with(
        scheme,
        LinkConfig::default().with_recv_window(32),
        RcConfig::default().with_completion(mode),
    )
}

fn transport_with(scheme: &str, link: LinkConfig, rc: RcConfig) -> Transport {
    let addr = std::env::var("ZEROCAST_RDMA_ADDR").unwrap_or_else(|_| "10.0.2.15".to_owned());
    let uri: &'static str = Box::leak(format!("{scheme}://{addr}:0").into_boxed_str());
    let cfg = Config::default().with_link(link).with_rc(rc);
    Transport { zc: Zerocast::with_config(cfg), listen_uri: uri }
}

fn drained(t: &Transport) {
    zerocast_tests::assert_pool_drained(t.zc.rc().expect("rc transport").pool(), Duration::from_secs(10));
}

macro_rules! caller_driven {
    ($name:ident, $scheme:expr, $mode:expr) => {
        mod $name {
            use super::*;

            fn t() -> Transport {
                transport($scheme, $mode)
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn ping_pong_is_posted_by_the_caller_and_reposted_on_release() {
                direct_io::ping_pong_is_written_by_the_caller(&t(), 1_000, drained);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn a_burst_goes_through_the_writer_and_arrives_whole() {
                direct_io::a_burst_goes_through_the_writer(&t(), 10_000, drained);
            }

            /// Writer batches of up to 256 frames into a send queue of 8:
            /// each batch is posted as chains short enough to find their
            /// slots, none waits for a completion that cannot come.
            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn batches_longer_than_the_send_queue_are_posted_in_parts() {
                let link = LinkConfig::default().with_recv_window(256).with_max_batch(256);
                let t = transport_with(
                    $scheme,
                    link,
                    RcConfig::default().with_completion($mode).with_send_depth(8),
                );
                direct_io::a_burst_goes_through_the_writer(&t, 5_000, drained);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn senders_on_many_threads_keep_each_threads_order() {
                direct_io::senders_on_many_threads_keep_order(&t(), 3, 3_000, drained);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn polling_receivers_share_the_stream_and_honour_deadlines() {
                direct_io::reading_receivers_share_the_stream(&t(), 5_000, drained);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn a_try_recv_loop_polls_the_cq_itself() {
                direct_io::a_try_recv_loop_reads_the_stream(&t(), 5_000, drained);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn a_try_send_loop_gets_its_credit_back() {
                direct_io::a_try_send_loop_gets_its_credit_back(&t(), 5_000, drained);
            }
        }
    };
}

caller_driven!(rc_busy, "rc", CompletionMode::BusyPoll);
caller_driven!(rc_channel, "rc", CompletionMode::Channel);
caller_driven!(rc_oob_channel, "rc+oob", CompletionMode::Channel);

/// A data frame's header travels in the immediate, so a message whose size
/// is a multiple of the path MTU fills whole packets: 4096-byte messages
/// cost as many packets as 4080-byte ones, where a 16-byte header in front
/// would add one each, as 4097-byte messages do (which shows that the
/// counter sees the difference). rxe's `sent_pkts` counts both sides'
/// packets: requests, acknowledgements and credit frames.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn a_message_of_whole_packets_costs_no_extra_packet() {
    const N: u64 = 400;
    let t = transport("rc", CompletionMode::Channel);
    let (a, b) = t.pair();
    let packets = |size: usize| {
        let before = zerocast_tests::hw_counter("sent_pkts");
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..N {
                    assert_eq!(b.recv().expect("recv").len(), size);
                }
            });
            for _ in 0..N {
                a.send(a.alloc(size).expect("alloc")).expect("send");
            }
        });
        // The last acknowledgements and credit frames.
        std::thread::sleep(Duration::from_millis(300));
        zerocast_tests::hw_counter("sent_pkts") - before
    };
    let (p4080, p4096, p4097) = (packets(4080), packets(4096), packets(4097));
    let seen = format!("packets for {N} messages: {p4080} at 4080 B, {p4096} at 4096 B, {p4097} at 4097 B");
    eprintln!("{seen}");
    assert!(p4097 >= p4096 + N * 3 / 4, "one more packet per message is counted: {seen}");
    assert!(p4096.abs_diff(p4080) < N / 4, "4096 B takes no extra packet: {seen}");
    drop((a, b));
    drained(&t);
}
