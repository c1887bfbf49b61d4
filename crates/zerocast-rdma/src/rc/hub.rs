//! What the transport-wide channels (`cm_hub`'s rdma_cm events,
//! `comp_hub`'s completion events) share: one engine task reads each, and
//! lives as long as anything holds its hub.

use std::sync::{Arc, OnceLock};

use zerocast_link::engine::{Cx, Waker};

/// A hub read by one engine task, which ends once it alone holds the hub.
pub(crate) trait Hub {
    /// The reading task's waker, set at its first run.
    fn reader(&self) -> &OnceLock<Waker>;

    /// Let go of the hub and wake its reading task, which ends once
    /// nothing else holds the hub.
    fn retire(self: Arc<Self>) {
        let waker = self.reader().get().cloned();
        // Before the wake: the task counts the holders when it runs.
        drop(self);
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// At the start of each of the reading task's runs: keep its waker,
    /// and say whether the task alone holds `hub` (then it ends).
    fn reader_alone(hub: &Arc<Self>, cx: &Cx<'_>) -> bool {
        let _ = hub.reader().set(cx.waker());
        Arc::strong_count(hub) == 1
    }
}
