//! A received message lent to a closure: [`Link::recv_with`] and
//! [`Link::try_recv_with`].
//!
//! The closure sees the receive buffer's bytes; when it returns (or
//! unwinds), the buffer goes back and its credits with it, as a dropped
//! [`crate::RecvBuf`]'s do. No handle is made, so the connection is not
//! counted up and down for each message: the two atomic read-modify-writes
//! a handle costs stay out of a receive loop that does not keep its
//! messages.

use std::sync::Arc;
use std::time::Instant;

use zerocast_core::RecvError;
use zerocast_mem::Buf;

use crate::link::Link;
use crate::shared::Shared;

/// A message taken off the delivery queue: its buffer, and the immediate
/// value of an RDMA WRITE with immediate.
pub(crate) type Taken = (Buf, Option<u32>);

/// A lent buffer; it goes back when this is dropped, after the closure or
/// during its unwinding.
struct Lent<'a> {
    buf: Option<Buf>,
    shared: &'a Arc<Shared>,
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            let cost = self.shared.cost_of(buf.len());
            self.shared.give_back(buf, cost);
        }
    }
}

impl Link {
    /// [`Link::recv`], with the message lent to `f` (its bytes and its
    /// immediate value, see [`crate::RecvBuf::immediate`]) instead of
    /// handed out: the buffer and its credits go back when `f` returns.
    /// `f` is not called when no message comes.
    #[inline]
    pub fn recv_with<R>(
        &self,
        deadline: Option<Instant>,
        f: impl FnOnce(&[u8], Option<u32>) -> R,
    ) -> Result<R, RecvError> {
        let taken = self.take(deadline)?;
        Ok(self.lend(taken, f))
    }

    /// [`Link::try_recv`], with the message lent to `f` as
    /// [`Link::recv_with`] lends it.
    #[inline]
    pub fn try_recv_with<R>(&self, f: impl FnOnce(&[u8], Option<u32>) -> R) -> Result<R, RecvError> {
        let taken = self.try_take()?;
        Ok(self.lend(taken, f))
    }

    #[inline(always)]
    fn lend<R>(&self, (buf, imm): Taken, f: impl FnOnce(&[u8], Option<u32>) -> R) -> R {
        let lent = Lent { buf: Some(buf), shared: &self.shared };
        f(lent.buf.as_deref().unwrap_or_default(), imm)
    }
}
