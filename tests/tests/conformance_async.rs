//! The conformance suite over the async API (`zerocast::tokio`), on every
//! transport built into the host build, each test on its own runtime of
//! two worker threads that also drives the transport's engines.

use zerocast_tests::async_suite::{self, AsyncTransport};

macro_rules! conformance_async {
    ($name:ident, $uri:expr) => {
        mod $name {
            use super::*;

            const WINDOW: u32 = 16;

            #[test]
            fn integrity_mixed_sizes() {
                AsyncTransport::run($uri, WINDOW, |t| async_suite::integrity(t, 200_000));
            }

            #[test]
            fn backpressure() {
                AsyncTransport::run($uri, WINDOW, |t| async_suite::backpressure(t, WINDOW));
            }

            #[test]
            fn disconnect() {
                AsyncTransport::run($uri, WINDOW, async_suite::disconnect);
            }

            #[test]
            fn close_and_wait() {
                AsyncTransport::run($uri, WINDOW, async_suite::close_and_wait);
            }

            #[test]
            fn typed_roundtrip() {
                AsyncTransport::run($uri, WINDOW, async_suite::typed_roundtrip);
            }

            #[test]
            fn borrowed_receive() {
                AsyncTransport::run($uri, WINDOW, |t| async_suite::borrowed_receive(t, WINDOW));
            }

            #[test]
            fn bad_and_oversized() {
                AsyncTransport::run($uri, WINDOW, async_suite::bad_and_oversized);
            }

            #[test]
            fn accepting() {
                AsyncTransport::run($uri, WINDOW, async_suite::accepting);
            }

            #[test]
            fn receivers_share() {
                AsyncTransport::run($uri, WINDOW, async_suite::receivers_share);
            }

            #[test]
            fn bursts_while_rearming_10k() {
                AsyncTransport::run($uri, WINDOW, |t| async_suite::bursts_while_rearming(t, 10_000));
            }

            #[test]
            fn bursts_while_rearming_4_pairs() {
                AsyncTransport::run($uri, WINDOW, |t| async_suite::bursts_while_rearming_many(t, 4, 5_000));
            }

            #[test]
            fn cancelled_receives_lose_nothing() {
                AsyncTransport::run($uri, WINDOW, |t| {
                    async_suite::cancelled_receives_lose_nothing(t, 20_000)
                });
            }

            #[test]
            fn cancelled_sends_half_send_nothing() {
                AsyncTransport::run($uri, WINDOW, |t| {
                    async_suite::cancelled_sends_half_send_nothing(t, 20_000)
                });
            }

            #[test]
            fn sink_and_stream() {
                AsyncTransport::run($uri, WINDOW, async_suite::sink_and_stream);
            }

            #[test]
            fn blocking_and_async_mix() {
                AsyncTransport::run($uri, WINDOW, async_suite::blocking_and_async_mix);
            }

            #[test]
            fn connect_refused_and_abandoned() {
                AsyncTransport::run($uri, WINDOW, async_suite::connect_refused_and_abandoned);
            }
        }
    };
}

conformance_async!(mem, "mem://conformance-async-{n}");
conformance_async!(tcp, "tcp://127.0.0.1:0");
