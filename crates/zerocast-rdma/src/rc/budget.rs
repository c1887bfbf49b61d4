//! Registered receive memory, reserved per connection against a budget.
//!
//! Every connection posts its credit window of receives, plus
//! [`MAX_PENDING`] for rendezvous finishes, each of one receive-buffer
//! size. At the configured shape (64 receives of 64 KiB) that is 4.5 MiB a
//! connection, so a few dozen connections would exhaust a pool. Instead,
//! each connection reserves its receive memory from the transport's budget
//! when its QP is created, and returns it when its [`Io`](super::engine::Io)
//! drops (after its QP is destroyed):
//!
//! - while the full shape keeps the committed bytes within a quarter of the
//!   budget, a connection gets it: the first connections of a transport
//!   stream as fast as configured. A first connection gets it whenever it
//!   fits the budget at all, so a small pool still serves one connection
//!   at the configured shape;
//! - after that, a connection gets the lean shape: a window of
//!   [`LEAN_WINDOW`] and receive buffers of [`LEAN_BUF`] bytes (128 KiB in
//!   all). Its larger messages go by rendezvous, which copies nothing;
//! - a connection whose lean shape would pass the budget is refused with
//!   [`RcError::ReceiveMemory`]: a clear error, never a pool failure later.
//!
//! Each side picks its own shape and announces it in its hello (its window
//! and receive-buffer size), so the two ends of a connection need not
//! agree. With the default pool (256 MiB) the budget is 192 MiB: 10
//! connections at the full shape, then about 1,170 lean ones.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::rendezvous::MAX_PENDING;
use super::RcError;

/// The lean shape's credit window.
pub(crate) const LEAN_WINDOW: usize = 8;
/// The lean shape's receive-buffer size (rounded up to a pool class).
pub(crate) const LEAN_BUF: usize = 8192;

/// The receives of one connection: its window and buffer size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    pub(crate) window: usize,
    pub(crate) buf_size: usize,
}

impl Shape {
    /// Registered bytes of the receives this shape posts.
    pub(crate) fn bytes(&self) -> usize {
        (self.window + MAX_PENDING) * self.buf_size
    }
}

/// Receive memory of an RC transport: what its connections reserved, and
/// the budget ([`RcTransport::recv_memory`](super::RcTransport::recv_memory)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecvMemory {
    /// Bytes the open connections' receives hold.
    pub reserved: usize,
    /// The budget ([`RcConfig::recv_memory`](super::RcConfig::recv_memory)).
    pub limit: usize,
}

/// A transport's receive-memory budget.
#[derive(Debug)]
pub(crate) struct RecvBudget {
    limit: usize,
    committed: AtomicUsize,
}

/// Receive memory reserved by one connection, returned on drop.
#[derive(Debug)]
pub(crate) struct Reservation {
    budget: Arc<RecvBudget>,
    bytes: usize,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.committed.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

impl RecvBudget {
    pub(crate) fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self { limit, committed: AtomicUsize::new(0) })
    }

    /// Bytes reserved now, and the limit.
    pub(crate) fn usage(&self) -> RecvMemory {
        RecvMemory { reserved: self.committed.load(Ordering::Acquire), limit: self.limit }
    }

    /// Reserve `full` while it keeps the committed bytes within a quarter
    /// of the budget (or for a first connection it fits), else `lean` while
    /// it keeps them within the budget.
    pub(crate) fn reserve(
        self: &Arc<Self>,
        full: Shape,
        lean: Shape,
    ) -> Result<(Shape, Reservation), RcError> {
        let mut got = full;
        let pick = |committed: usize| {
            let alone = committed == 0 && full.bytes() <= self.limit;
            if alone || committed + full.bytes() <= self.limit / 4 {
                Some(full)
            } else if committed + lean.bytes() <= self.limit {
                Some(lean)
            } else {
                None
            }
        };
        let taken = self.committed.fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
            pick(c).map(|s| {
                got = s;
                c + s.bytes()
            })
        });
        match taken {
            Ok(_) => Ok((got, Reservation { budget: self.clone(), bytes: got.bytes() })),
            Err(committed) => {
                Err(RcError::ReceiveMemory { needed: lean.bytes(), committed, limit: self.limit })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{RecvBudget, Shape, MAX_PENDING};
    use crate::rc::RcError;

    const FULL: Shape = Shape { window: 64, buf_size: 64 << 10 };
    const LEAN: Shape = Shape { window: 8, buf_size: 8 << 10 };

    #[test]
    fn a_shape_costs_its_window_and_the_finish_receives() {
        assert_eq!(FULL.bytes(), (64 + MAX_PENDING) * (64 << 10));
        assert_eq!(LEAN.bytes(), 128 << 10);
    }

    #[test]
    fn full_shapes_fill_a_quarter_then_lean_ones_the_rest_then_refusal() {
        let budget = RecvBudget::new(192 << 20);
        let mut held = Vec::new();
        let mut shapes = Vec::new();
        let refused = loop {
            match budget.reserve(FULL, LEAN) {
                Ok((s, r)) => {
                    shapes.push(s);
                    held.push(r);
                }
                Err(e) => break e,
            }
        };
        let full = shapes.iter().filter(|&&s| s == FULL).count();
        assert_eq!(full, (48 << 20) / FULL.bytes(), "full shapes up to a quarter");
        assert!(shapes[..full].iter().all(|&s| s == FULL), "the full ones come first");
        let lean = shapes.len() - full;
        assert_eq!(lean, ((192 << 20) - full * FULL.bytes()) / LEAN.bytes());
        assert!(shapes.len() > 1_000, "{} connections fit", shapes.len());
        assert!(matches!(refused, RcError::ReceiveMemory { limit, .. } if limit == 192 << 20));
        assert!(budget.usage().reserved <= 192 << 20);

        // Closing connections gives their memory back: the full shape again.
        held.clear();
        assert_eq!(budget.usage().reserved, 0);
        assert_eq!(budget.reserve(FULL, LEAN).expect("room again").0, FULL);
    }

    #[test]
    fn a_first_connection_gets_the_full_shape_if_it_fits_at_all() {
        let budget = RecvBudget::new(FULL.bytes() + LEAN.bytes());
        let (first, _a) = budget.reserve(FULL, LEAN).expect("first");
        let (second, _b) = budget.reserve(FULL, LEAN).expect("second");
        assert_eq!((first, second), (FULL, LEAN));
        assert!(budget.reserve(FULL, LEAN).is_err(), "the budget is full");
    }

    #[test]
    fn a_lean_shape_larger_than_the_budget_is_refused_at_once() {
        let budget = RecvBudget::new(64 << 10);
        assert!(
            matches!(budget.reserve(FULL, LEAN), Err(RcError::ReceiveMemory { needed, .. }) if needed == LEAN.bytes())
        );
        assert_eq!(budget.usage().reserved, 0);
    }
}
