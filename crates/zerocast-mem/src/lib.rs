//! The registered slab pool of zerocast.
//!
//! A [`Pool`] hands out [`Buf`]s: owned, fixed-capacity buffers cut out of
//! large regions. Each region is one page-aligned anonymous `mmap`,
//! registered **once** with the transport's device through a [`Registrar`]
//! when it is created, and deregistered before it is unmapped when the pool
//! (the last [`Pool`] clone and the last [`Buf`]) is gone. A buffer's
//! [`addr`](Buf::addr) and [`keys`](Buf::keys) go straight into scatter/gather
//! entries; its bytes never move while it lives. `Buf` is the send buffer of
//! every transport: it implements `zerocast_core::TxBuffer`.
//!
//! Buffers come in size classes ([`PoolConfig::classes`]); a request is
//! served by the smallest class that fits. The pool grows one region at a
//! time, never past [`PoolConfig::max_bytes`]; at the cap, [`Pool::alloc`]
//! fails, waits for a while, or blocks, as [`Wait`] says.
//!
//! # Cost
//!
//! Once a class has its regions, `alloc` and dropping a `Buf` never touch the
//! heap and, in the common case, touch no memory another thread writes and
//! execute no locked instruction: each
//! thread keeps a small LIFO cache of free buffers per class, and moves them
//! to and from the class's depot (a LIFO stack under a mutex) a batch at a
//! time. The buffer handed out is the one released most recently, still
//! warm in the cache. Behind the depot, each class keeps every other free
//! buffer in a preallocated, lock-free `crossbeam_queue::ArrayQueue`. Each `Buf` keeps
//! the pool alive with a reference the pool counts in batches per thread
//! (a thread's cache takes them 32 at a time), not with an `Arc` of its
//! own, so taking and dropping buffers touches no counter shared between
//! threads. Growth (map, prefault, register) happens under a
//! per-class mutex; waiting at the cap uses a per-class mutex and condvar,
//! and a waiter first empties every thread's cache of its class, so no free
//! buffer hides from it. Emptying another thread's cache costs a
//! `membarrier(2)` system call (the other half of the cache's protocol,
//! which spares its owner every lock and fence), paid only on those cold
//! paths. Classes of fewer than 1,024 buffers are not cached.
//!
//! # What it does not do
//!
//! - It does not talk to any device: registration is the [`Registrar`]'s job
//!   (the RDMA crate provides one; TCP and in-process use [`NoopRegistrar`]).
//! - It never gives a region back while the pool lives, and never moves
//!   memory between classes: a class at the cap waits for its own buffers,
//!   even if other classes have free ones.
//! - It does not clear buffers: a reused buffer holds its last user's bytes.
//! - It does not protect memory from a device or a peer: while a buffer's
//!   address is posted to hardware, the owner of the `Buf` (the transport's
//!   in-flight table) must not touch it, and must keep the `Buf` alive.
//! - It does no fork handling (`MADV_DONTFORK`); that belongs with the
//!   registrar that pins memory.
//!
//! ```
//! use zerocast_mem::{Pool, PoolConfig, Wait};
//!
//! let pool = Pool::unregistered(PoolConfig::default().with_max_bytes(16 << 20))?;
//! let mut buf = pool.alloc(5, Wait::No)?;
//! buf.copy_from_slice(b"hello");
//! assert_eq!(buf.capacity(), 512);
//! assert_eq!(pool.stats().buffers_in_use, 1);
//! drop(buf);
//! assert_eq!(pool.stats().buffers_in_use, 0);
//! # Ok::<(), zerocast_mem::PoolError>(())
//! ```
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks, missing_docs)]

mod barrier;
mod buf;
mod cache;
mod chunk;
mod class;
mod config;
#[cfg(feature = "counting-alloc")]
mod counting;
mod error;
mod pool;
mod refs;
mod region;
mod registrar;
mod stats;
mod txbuf;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod wake_tests;

pub use buf::Buf;
pub use chunk::Chunk;
pub use config::PoolConfig;
#[cfg(feature = "counting-alloc")]
pub use counting::CountingAlloc;
pub use error::PoolError;
pub use pool::{Pool, Wait};
pub use registrar::{memlock_limit, Keys, NoopRegistrar, RegisterError, Registrar, Registration};
pub use stats::PoolStats;
