//! Runnable examples of zerocast; see the `[[example]]` targets.
//!
//! - `hello`: typed request/reply over the URI given on the command line.
//! - `swap_transport`: one test body run over mem, tcp (and rc with RDMA).
//! - `multicast`: mckey's options over RDMA UD or UDP multicast.
//! - `async_echo`: a tokio echo server, a task per connection, and its
//!   clients; `async_pubsub`: one publisher task feeding many subscribers.
//! - `rdma_cm_server`/`rdma_cm_client`: the rdma_cm send/receive tutorial
//!   over `rc://`; `verbs_oob`: the verbs client/server with a TCP side
//!   channel over `rc+oob://`; `rdma_read_write`: one-sided READ and WRITE.
//!   `tests/rdma_examples.rs` runs them as processes in the Soft-RoCE guest.

#![forbid(unsafe_code)]
