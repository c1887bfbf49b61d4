//! The frame decoder over a byte stream from a hostile peer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| zerocast_core::fuzzing::frame_stream(data));
