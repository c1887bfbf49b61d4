//! Caller-driven I/O on `tcp://` (see `zerocast_tests::direct_io`).

use std::time::Duration;

use zerocast::{Config, LinkConfig, Zerocast};
use zerocast_tests::{direct_io, suite, Transport};

fn tcp() -> Transport {
    Transport::new("tcp://127.0.0.1:0", 64)
}

fn drained(t: &Transport) {
    t.assert_pool_drained(Duration::from_secs(5));
}

#[test]
fn ping_pong_is_written_by_the_caller_and_stays_in_order() {
    direct_io::ping_pong_is_written_by_the_caller(&tcp(), 2_000, drained);
}

#[test]
fn a_burst_goes_through_the_writer_and_arrives_whole() {
    direct_io::a_burst_goes_through_the_writer(&tcp(), 50_000, drained);
}

#[test]
fn large_replies_are_written_by_the_caller() {
    direct_io::large_replies_are_written_by_the_caller(&tcp(), 300, 64 << 10, drained);
}

#[test]
fn a_stream_of_large_messages_is_batched_and_arrives_whole() {
    direct_io::a_stream_of_large_messages_is_batched(&tcp(), 2_000, 64 << 10, drained);
}

#[test]
fn a_stream_that_stops_arrives_whole_before_the_close() {
    for (n, size) in [(64, 4096), (200, 4096), (1_000, 3000), (300, 9000)] {
        direct_io::a_stream_that_stops_arrives_whole_before_the_close(&tcp(), n, size, drained);
    }
}

#[test]
fn senders_on_many_threads_keep_each_threads_order() {
    direct_io::senders_on_many_threads_keep_order(&tcp(), 4, 20_000, drained);
}

#[test]
fn reading_receivers_share_the_stream_and_honour_deadlines() {
    direct_io::reading_receivers_share_the_stream(&tcp(), 20_000, drained);
}

#[test]
fn a_try_recv_loop_reads_the_socket_itself() {
    direct_io::a_try_recv_loop_reads_the_stream(&tcp(), 20_000, drained);
}

#[test]
fn a_try_send_loop_gets_its_credit_back() {
    direct_io::a_try_send_loop_gets_its_credit_back(&tcp(), 20_000, drained);
}

/// Writer batches of up to 1,024 mixed-size frames: each goes out as
/// several `writev` calls, split where the staging buffer or the slice
/// list fills, and every message arrives whole and in order.
#[test]
fn batches_larger_than_one_write_arrive_whole() {
    let link = LinkConfig::default().with_recv_window(1024).with_max_batch(1024);
    let t = Transport {
        zc: Zerocast::with_config(Config::default().with_link(link)),
        listen_uri: "tcp://127.0.0.1:0",
    };
    suite::integrity(&t, 100_000);
}
