//! RDMA WRITE with immediate: the bytes land in a region the peer exposed,
//! and the peer's application gets an in-order notification carrying a
//! 32-bit value.
//!
//! The operation consumes one receive the peer posted, exactly as a send
//! does, so it travels as a data frame under the link's credits
//! ([`zerocast_link::Link::send_tagged`]): in order with the connection's
//! messages, and never able to cause RNR. The frame's tag names an entry of
//! [`ImmOps`] holding the target region and the value; the sender thread
//! posts it as `IBV_WR_RDMA_WRITE_WITH_IMM` instead of a send.
//!
//! There is no zerocast header on the wire: the immediate is the
//! application's. The frame returns no credits (`Credits::commit_bare`),
//! and the receiver takes it as the next frame in sequence
//! (`Driver::on_immediate`). The peer's application receives an empty
//! message whose [`zerocast_link::RecvBuf::immediate`] is the value; by
//! then the written bytes are in its memory (RC delivers them first).

use std::num::NonZeroU32;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use slab::Slab;
use zerocast_core::{ConnError, SendError};
use zerocast_mem::Buf;

use super::one_sided::RemoteRegion;
use super::RcError;

/// Target and value of a WRITE with immediate between its send and its post.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ImmOp {
    pub(crate) remote: RemoteRegion,
    pub(crate) imm: u32,
}

/// WRITEs with immediate queued on the link and not yet posted, by tag.
#[derive(Debug)]
pub(crate) struct ImmOps {
    ops: Mutex<Slab<ImmOp>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl ImmOps {
    /// `capacity`: entries allocated up front (the peer's credit window
    /// bounds how many are queued at once).
    pub(crate) fn new(capacity: usize) -> Self {
        Self { ops: Mutex::new(Slab::with_capacity(capacity)) }
    }

    fn insert(&self, op: ImmOp) -> NonZeroU32 {
        let key = lock(&self.ops).insert(op);
        // Keys are below the number of queued operations, itself bounded by
        // the peer's credit window (at most 65 535).
        NonZeroU32::new(key as u32 + 1).unwrap_or(NonZeroU32::MIN)
    }

    /// The operation of a tagged frame (the sender thread, at post time).
    pub(crate) fn take(&self, tag: u32) -> Option<ImmOp> {
        let key = (tag as usize).checked_sub(1)?;
        lock(&self.ops).try_remove(key)
    }
}

/// Queue an RDMA WRITE of `local` to `remote` with immediate `imm`, behind
/// the connection's earlier messages, waiting for credit until `deadline`.
pub(crate) fn write_with_imm(
    link: &zerocast_link::Link,
    ops: &ImmOps,
    local: Buf,
    remote: RemoteRegion,
    imm: u32,
    deadline: Option<Instant>,
) -> Result<(), SendError<Buf>> {
    if local.len() as u64 > remote.len {
        let err = RcError::RemoteTooShort { local: local.len(), remote: remote.len };
        return Err(SendError::Rejected(local, std::sync::Arc::new(ConnError::transport(err))));
    }
    let tag = ops.insert(ImmOp { remote, imm });
    link.send_tagged(local, tag, deadline).inspect_err(|_| {
        ops.take(tag.get());
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_non_zero_and_taken_once() {
        let ops = ImmOps::new(4);
        let r = RemoteRegion { addr: 1, len: 2, rkey: 3 };
        let a = ops.insert(ImmOp { remote: r, imm: 7 });
        let b = ops.insert(ImmOp { remote: r, imm: 8 });
        assert_ne!(a, b);
        assert_eq!(ops.take(b.get()).map(|o| o.imm), Some(8));
        assert!(ops.take(b.get()).is_none());
        assert!(ops.take(0).is_none());
        assert_eq!(ops.take(a.get()).map(|o| o.imm), Some(7));
    }
}
