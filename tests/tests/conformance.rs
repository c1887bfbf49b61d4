//! The conformance suite over every transport built into the host build.

use zerocast_tests::{readiness, suite, Transport};

macro_rules! conformance {
    ($name:ident, $uri:expr) => {
        mod $name {
            use super::*;

            const WINDOW: u32 = 16;

            fn transport() -> Transport {
                Transport::new($uri, WINDOW)
            }

            #[test]
            fn integrity_1m_mixed_sizes() {
                suite::integrity(&transport(), 1_000_000);
            }

            #[test]
            fn held_messages_keep_their_bytes() {
                // Held 1,000 messages (~170 KB of stream) apart, 6 at a
                // time: more than a stream's staging keeps, and short of
                // the half window a receiver may owe its sender.
                suite::held_messages_keep_their_bytes(&transport(), 200_000, 1_000, 6);
            }

            #[test]
            fn receivers_take_turns() {
                suite::receivers_take_turns(&transport());
            }

            #[test]
            fn backpressure() {
                suite::backpressure(&transport(), WINDOW);
            }

            #[test]
            fn disconnect() {
                suite::disconnect(&transport());
            }

            #[test]
            fn close_and_wait() {
                suite::close_and_wait(&transport());
            }

            #[test]
            fn drop_right_after_sending() {
                suite::drop_right_after_sending(&transport());
            }

            #[test]
            fn typed_disconnect() {
                suite::typed_disconnect(&transport());
            }

            #[test]
            fn typed_roundtrip() {
                suite::typed_roundtrip(&transport());
            }

            #[test]
            fn borrowed_receive() {
                suite::borrowed_receive(&transport(), WINDOW);
            }

            #[test]
            fn bad_message_is_typed_error() {
                suite::bad_message_is_typed_error(&transport());
            }

            #[test]
            fn poller_two_threads_serve_many() {
                readiness::two_threads_serve_many(&transport(), 200, 20);
            }

            #[test]
            fn poller_no_arrival_untold() {
                readiness::no_arrival_untold(&transport(), 10_000);
            }

            #[test]
            fn poller_end_and_registration() {
                readiness::end_and_registration(&transport());
            }

            #[test]
            fn oversize_is_rejected() {
                suite::oversize_is_rejected(&transport());
            }

            #[test]
            fn listener_close_releases_accept() {
                suite::listener_close_releases_accept(&transport());
            }

            #[test]
            fn try_accept_and_accept_timeout() {
                suite::try_accept_and_accept_timeout(&transport());
            }

            #[test]
            fn handles_close_their_own_side() {
                suite::handles_close_their_own_side(&transport());
            }

            #[test]
            fn iter_results() {
                suite::iter_results(&transport());
            }

            #[test]
            fn typed_check_mismatch() {
                suite::typed_check_mismatch(&transport());
            }

            #[test]
            fn typed_check_match() {
                suite::typed_check_match(&transport(), WINDOW);
            }

            #[test]
            fn typed_check_off() {
                suite::typed_check_off(&transport());
            }
        }
    };
}

conformance!(mem, "mem://conformance-{n}");
conformance!(tcp, "tcp://127.0.0.1:0");
