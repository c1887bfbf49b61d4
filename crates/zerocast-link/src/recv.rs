//! Received messages as handles that give their buffer back on drop.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use zerocast_mem::Buf;

use crate::shared::Shared;

/// A received message. It is the receive buffer itself, not a copy.
///
/// Dropping it returns the buffer (to the pool, or to the backend to be
/// reposted) and, with that, its credits to the peer.
pub struct RecvBuf {
    buf: Option<Buf>,
    /// `None` once [`RecvBuf::into_parts`] moved it into the token.
    shared: Option<Arc<Shared>>,
    immediate: Option<u32>,
    /// Credits the message took, given back with it.
    cost: u32,
}

impl RecvBuf {
    pub(crate) fn new(buf: Buf, shared: Arc<Shared>) -> Self {
        Self::with_immediate(buf, shared, None)
    }

    #[inline]
    pub(crate) fn with_immediate(buf: Buf, shared: Arc<Shared>, immediate: Option<u32>) -> Self {
        let cost = shared.cost_of(buf.len());
        Self { buf: Some(buf), shared: Some(shared), immediate, cost }
    }

    /// The immediate value, if this message is the notification of an RDMA
    /// WRITE with immediate (its payload is then empty: the data went
    /// straight to the written region, and is visible there now).
    pub fn immediate(&self) -> Option<u32> {
        self.immediate
    }

    /// The underlying pool buffer (for its registration keys and address).
    pub fn buf(&self) -> &Buf {
        self.buf.as_ref().expect("present until drop")
    }

    /// Split into the buffer and the token that must give it back. Used by
    /// handles that need to own the buffer itself (a borrowing decoder's
    /// cart); [`ReleaseToken::release`] does what dropping a `RecvBuf` does.
    pub fn into_parts(mut self) -> (Buf, ReleaseToken) {
        let buf = self.buf.take().expect("present until drop");
        // The link's handle moves into the token: no reference is counted
        // up here and down again as `self` drops.
        (buf, ReleaseToken { shared: self.shared.take(), cost: self.cost })
    }
}

/// The obligation to give a received buffer back. See [`RecvBuf::into_parts`].
///
/// Dropping the token without [`ReleaseToken::release`] still returns the
/// credit (a reposting backend posts a fresh buffer); the buffer, dropped
/// elsewhere, goes back to the pool.
#[derive(Debug)]
#[must_use = "release the buffer with ReleaseToken::release"]
pub struct ReleaseToken {
    shared: Option<Arc<Shared>>,
    /// The credits of the message the token stands for.
    cost: u32,
}

impl ReleaseToken {
    /// Give the buffer back, exactly as dropping its `RecvBuf` would.
    pub fn release(mut self, buf: Buf) {
        if let Some(shared) = self.shared.take() {
            shared.give_back(buf, self.cost);
        }
    }
}

impl Drop for ReleaseToken {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            match &shared.reposts {
                // The backend posts a fresh buffer in its place.
                Some(tx) => {
                    let _ = tx.try_send(None);
                }
                None => shared.release(self.cost),
            }
        }
    }
}

impl Deref for RecvBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.buf()
    }
}

impl AsRef<[u8]> for RecvBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl Drop for RecvBuf {
    fn drop(&mut self) {
        if let (Some(buf), Some(shared)) = (self.buf.take(), &self.shared) {
            shared.give_back(buf, self.cost);
        }
    }
}

impl fmt::Debug for RecvBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecvBuf").field("len", &self.len()).finish()
    }
}
