//! The credit machine driven by a hostile peer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| zerocast_core::fuzzing::credit_peer(data));
