//! Runnable examples of zerocast; see the `[[example]]` targets.
//!
//! - `hello`: typed request/reply over the URI given on the command line.
//! - `swap_transport`: one test body run over mem, tcp (and rc with RDMA).
//! - `multicast`: mckey's options over RDMA UD or UDP multicast.

#![forbid(unsafe_code)]
