//! Messages that borrow their receive buffer.

use std::fmt;

use yoke::{Yoke, Yokeable};
use zerocast_link::ReleaseToken;
use zerocast_mem::Buf;

/// A received message whose borrowed fields point into the registered
/// receive buffer. [`Guard::get`] gives the message with the buffer's
/// lifetime; dropping the guard reposts the buffer and returns its credit.
pub struct Guard<T: for<'a> Yokeable<'a>> {
    yoke: Option<Yoke<T, Buf>>,
    token: Option<ReleaseToken>,
}

impl<T: for<'a> Yokeable<'a>> Guard<T> {
    pub(crate) fn new(yoke: Yoke<T, Buf>, token: ReleaseToken) -> Self {
        Self { yoke: Some(yoke), token: Some(token) }
    }

    /// The message, borrowing from the receive buffer.
    pub fn get(&self) -> &<T as Yokeable<'_>>::Output {
        self.yoke.as_ref().expect("present until drop").get()
    }

    /// The receive buffer's bytes.
    pub fn bytes(&self) -> &[u8] {
        self.yoke.as_ref().expect("present until drop").backing_cart()
    }
}

impl<T: for<'a> Yokeable<'a>> Drop for Guard<T> {
    fn drop(&mut self) {
        if let (Some(yoke), Some(token)) = (self.yoke.take(), self.token.take()) {
            token.release(yoke.into_backing_cart());
        }
    }
}

impl<T: for<'a> Yokeable<'a>> fmt::Debug for Guard<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard").field("len", &self.bytes().len()).finish()
    }
}
