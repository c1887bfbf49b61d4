//! The tasks waiting to receive on one connection: the connection's
//! readiness registration wakes them.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use zerocast_core::RecvError;
use zerocast_link::{Notify, Wakers};

use crate::poller::AlreadyRegistered;

/// Wakes every task waiting to receive when the connection's engine
/// delivers; each then tries again (one of them takes the message, the
/// others find nothing and wait anew).
#[derive(Debug, Default)]
pub(crate) struct RecvWakers(Mutex<Wakers>);

impl Notify for RecvWakers {
    fn notify(&self, _token: usize) {
        let waiting: Vec<_> = self.0.lock().unwrap_or_else(|p| p.into_inner()).take().collect();
        waiting.into_iter().for_each(Waker::wake);
    }
}

impl RecvWakers {
    /// Register `conn` with a new set: its engine reads it from now on.
    pub(crate) fn register(conn: &crate::Connection) -> Result<Arc<Self>, AlreadyRegistered> {
        let wakers = Arc::new(Self::default());
        let notify: Arc<dyn Notify> = wakers.clone();
        if conn.link().notify_on_ready(notify, 0) {
            Ok(wakers)
        } else {
            Err(AlreadyRegistered)
        }
    }

    /// Take with `try_recv` what is there; otherwise register the task and
    /// look once more. A `try_recv` that finds nothing arms the
    /// registration, so whatever comes after the second look is reported,
    /// and whatever came between the two looks is found by the second.
    pub(crate) fn poll<T, E: Empty>(
        &self,
        cx: &mut Context<'_>,
        mut try_recv: impl FnMut() -> Result<T, E>,
    ) -> Poll<Result<T, E>> {
        match try_recv() {
            Err(e) if e.is_empty() => {}
            r => return Poll::Ready(r),
        }
        self.0.lock().unwrap_or_else(|p| p.into_inner()).add(cx.waker());
        match try_recv() {
            Err(e) if e.is_empty() => Poll::Pending,
            r => Poll::Ready(r),
        }
    }
}

/// An error that means "nothing to receive yet".
pub(crate) trait Empty {
    fn is_empty(&self) -> bool;
}

impl Empty for RecvError {
    fn is_empty(&self) -> bool {
        matches!(self, RecvError::Empty)
    }
}

impl Empty for crate::TypedRecvError {
    fn is_empty(&self) -> bool {
        matches!(self, crate::TypedRecvError::Recv(RecvError::Empty))
    }
}
