//! Received messages as handles that give their buffer back on drop.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use zerocast_mem::Buf;

use crate::shared::Shared;

/// A received message. It is the receive buffer itself, not a copy.
///
/// Dropping it returns the buffer (to the pool, or to the backend to be
/// reposted) and, with that, one credit to the peer.
pub struct RecvBuf {
    buf: Option<Buf>,
    shared: Arc<Shared>,
}

impl RecvBuf {
    pub(crate) fn new(buf: Buf, shared: Arc<Shared>) -> Self {
        Self { buf: Some(buf), shared }
    }

    /// The underlying pool buffer (for its registration keys and address).
    pub fn buf(&self) -> &Buf {
        self.buf.as_ref().expect("present until drop")
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
        let Some(buf) = self.buf.take() else { return };
        match &self.shared.reposts {
            // The backend reposts it and then returns the credit.
            Some(tx) => {
                if let Err(e) = tx.try_send(buf) {
                    // The backend is gone: the buffer simply returns to the pool.
                    drop(e.into_inner());
                }
            }
            None => {
                drop(buf);
                self.shared.release_one();
            }
        }
    }
}

impl fmt::Debug for RecvBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecvBuf").field("len", &self.len()).finish()
    }
}
