//! The async conformance suite (`zerocast::tokio`) over `rc://` (rdma_cm)
//! and `rc+oob://` (TCP side channel): the engines, their completion and
//! rdma_cm event channels included, run as tasks of a two-worker runtime.
//! The bursts tests are the lost-wake-up check on RC: 10,000 bursts, each
//! arriving as the receiving task re-arms the connection; then 4 pairs at
//! once, whose 8 CQs share the engine's completion channel.
//!
//! Every test needs a verbs device: ignored on a plain `cargo test`;
//! `scripts/test` runs them inside the Soft-RoCE guest, serially.

#![cfg(feature = "rdma")]

use zerocast::{Config, LinkConfig};
use zerocast_tests::async_suite::{self, AsyncTransport};

/// The address rxe0 is bound to in the guest.
fn uri(scheme: &str) -> &'static str {
    let addr = std::env::var("ZEROCAST_RDMA_ADDR").unwrap_or_else(|_| "10.0.2.15".to_owned());
    Box::leak(format!("{scheme}://{addr}:0").into_boxed_str())
}

const WINDOW: u32 = 16;

fn cfg() -> Config {
    Config::default().with_link(LinkConfig::default().with_recv_window(WINDOW))
}

macro_rules! conformance_async_rdma {
    ($name:ident, $scheme:expr) => {
        mod $name {
            use super::*;

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn integrity_mixed_sizes() {
                AsyncTransport::run_with(uri($scheme), cfg(), |t| async_suite::integrity(t, 20_000));
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn backpressure() {
                AsyncTransport::run_with(uri($scheme), cfg(), |t| async_suite::backpressure(t, WINDOW));
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn disconnect() {
                AsyncTransport::run_with(uri($scheme), cfg(), async_suite::disconnect);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn close_and_wait() {
                AsyncTransport::run_with(uri($scheme), cfg(), async_suite::close_and_wait);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn typed_roundtrip() {
                AsyncTransport::run_with(uri($scheme), cfg(), async_suite::typed_roundtrip);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn borrowed_receive() {
                AsyncTransport::run_with(uri($scheme), cfg(), |t| async_suite::borrowed_receive(t, WINDOW));
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn bad_and_oversized() {
                AsyncTransport::run_with(uri($scheme), cfg(), async_suite::bad_and_oversized);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn accepting() {
                AsyncTransport::run_with(uri($scheme), cfg(), async_suite::accepting);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn receivers_share() {
                AsyncTransport::run_with(uri($scheme), cfg(), async_suite::receivers_share);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn bursts_while_rearming_10k() {
                AsyncTransport::run_with(uri($scheme), cfg(), |t| {
                    async_suite::bursts_while_rearming(t, 10_000)
                });
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn bursts_while_rearming_4_pairs() {
                AsyncTransport::run_with(uri($scheme), cfg(), |t| {
                    async_suite::bursts_while_rearming_many(t, 4, 5_000)
                });
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn cancelled_receives_lose_nothing() {
                AsyncTransport::run_with(uri($scheme), cfg(), |t| {
                    async_suite::cancelled_receives_lose_nothing(t, 5_000)
                });
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn cancelled_sends_half_send_nothing() {
                AsyncTransport::run_with(uri($scheme), cfg(), |t| {
                    async_suite::cancelled_sends_half_send_nothing(t, 5_000)
                });
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn sink_and_stream() {
                AsyncTransport::run_with(uri($scheme), cfg(), async_suite::sink_and_stream);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn blocking_and_async_mix() {
                AsyncTransport::run_with(uri($scheme), cfg(), async_suite::blocking_and_async_mix);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn connect_refused_and_abandoned() {
                AsyncTransport::run_with(uri($scheme), cfg(), async_suite::connect_refused_and_abandoned);
            }
        }
    };
}

conformance_async_rdma!(async_rc, "rc");
conformance_async_rdma!(async_rc_oob, "rc+oob");
