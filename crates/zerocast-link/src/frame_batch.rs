//! Data frames accounted for under one lock of the connection's state.
//!
//! A stream reader that finds many small frames whole in its staging hands
//! them over in a [`FrameBatch`]: the state is locked at the first frame
//! and let go when the batch ends (dropped, or [`FrameBatch::finish`]),
//! and the releases folded in, the credit frame asked for and the writer
//! woken once for the batch, not once a frame; so is a receiver asleep on
//! the delivery queue (one fence for the batch). Each frame is accounted
//! exactly as [`Driver::on_frame`] would (credits, sequence number,
//! delivery, in order); only the lock and the settling are shared.
//!
//! A reader must end the batch before anything that may wait or read:
//! a system call, a pool wait. Senders and receivers of the connection
//! wait for the lock meanwhile.

use std::sync::MutexGuard;

use zerocast_core::{ConnError, Header};
use zerocast_mem::Buf;

use crate::driver::{Arrived, Driver};
use crate::shared::State;

/// Frames of one connection accounted for under one lock; see the module
/// docs. Made by [`Driver::batch`].
#[must_use = "a batch that is not used takes no lock"]
pub struct FrameBatch<'a> {
    driver: &'a Driver,
    st: Option<MutexGuard<'a, State>>,
    /// A frame of the batch returned credits.
    credited: bool,
    /// Frames were accounted: a receiver asleep on them is to be woken.
    accounted: bool,
}

impl std::fmt::Debug for FrameBatch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameBatch").field("locked", &self.st.is_some()).finish()
    }
}

impl Driver {
    /// A batch of data frames for this connection (see [`FrameBatch`]).
    #[inline]
    pub fn batch(&self) -> FrameBatch<'_> {
        FrameBatch { driver: self, st: None, credited: false, accounted: false }
    }
}

impl FrameBatch<'_> {
    /// Account for a data frame the reader decoded, as
    /// [`Driver::on_frame`] does with `Some(payload)`. An error means the
    /// peer broke the protocol: the batch is over (its lock let go), and
    /// the connection is already marked failed when it is returned.
    #[inline]
    pub fn on_data(&mut self, header: Header, payload: Buf) -> Result<(), ConnError> {
        let driver = self.driver;
        let st = match &mut self.st {
            Some(st) => st,
            None => {
                let mut st = driver.shared.lock();
                driver.note_rx(&mut st);
                self.st.insert(st)
            }
        };
        self.accounted = true;
        match driver.accept(st, Arrived::Header(header), Some(payload), None, false) {
            Ok(credited) => {
                self.credited |= credited;
                Ok(())
            }
            Err(e) => {
                self.st = None;
                self.credited = false;
                self.wake_receivers();
                Err(driver.fail(e))
            }
        }
    }

    /// End the batch now: settle what it accounted for and let go of the
    /// lock. A batch may go on after this (it locks again at its next
    /// frame).
    #[inline]
    pub fn finish(&mut self) {
        if let Some(st) = self.st.take() {
            self.driver.settle(st, std::mem::take(&mut self.credited));
        }
        self.wake_receivers();
    }

    /// Wake a receiver asleep on the delivery queue for the frames
    /// accounted so far (queued without a wake).
    #[inline]
    fn wake_receivers(&mut self) {
        if std::mem::take(&mut self.accounted) {
            self.driver.shared.delivered.wake(true);
        }
    }
}

impl Drop for FrameBatch<'_> {
    fn drop(&mut self) {
        self.finish();
    }
}
