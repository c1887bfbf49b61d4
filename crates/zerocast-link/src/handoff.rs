//! A message handed straight to the application thread that read it off
//! the backend's source, past the delivery queue.
//!
//! A thread in [`crate::Link::try_recv`] or [`crate::Link::recv`] that
//! pumps the source itself opens a [`Handoff`] for its connection first.
//! The driver, taking a data frame during that pump with nothing queued
//! before it, leaves it in the handoff instead of the delivery queue
//! ([`wanted`], [`keep`]), and the receiving thread takes it when the pump returns:
//! a queue push and pop less on every message a polling thread receives,
//! which is most of them.
//!
//! Order is kept. The handoff takes only the first frame of the pump, and
//! only when the queue is empty; every frame after it goes to the queue
//! behind it. Only the thread that holds the source hands frames over, so
//! nothing is pushed in between but `End`, which may overtake nothing: a
//! message in the handoff arrived before it. A handoff dropped with its
//! message still in it (the pump panicked) queues the message, so it is
//! not lost, though it may then come after frames the pump queued.

use std::cell::{Cell, RefCell};

use crate::shared::{Delivery, Shared};

thread_local! {
    /// The connection (its `Shared`'s address) whose pump on this thread
    /// wants a message handed over; 0: none.
    static WANT: Cell<usize> = const { Cell::new(0) };
    /// The message handed over.
    static SLOT: RefCell<Option<Delivery>> = const { RefCell::new(None) };
}

fn key(shared: &Shared) -> usize {
    shared as *const Shared as usize
}

/// An open handoff: this thread is about to pump `shared`'s source.
pub(crate) struct Handoff<'a> {
    shared: &'a Shared,
}

impl<'a> Handoff<'a> {
    pub(crate) fn open(shared: &'a Shared) -> Self {
        WANT.set(key(shared));
        Self { shared }
    }

    /// The message the pump handed over, if any.
    pub(crate) fn take(self) -> Option<Delivery> {
        WANT.set(0);
        let d = SLOT.take();
        // Closed and emptied: the drop would only do both again (it
        // holds a reference, nothing to release).
        std::mem::forget(self);
        d
    }
}

impl Drop for Handoff<'_> {
    fn drop(&mut self) {
        WANT.set(0);
        if let Some(d) = SLOT.take() {
            let _ = self.shared.push_delivery(d);
        }
    }
}

/// From the driver, with the state locked: whether this thread's receive
/// takes the next delivery for `shared` ([`keep`] it then): it opened a
/// handoff for `shared` and nothing is queued before it. Asked before the
/// delivery is made, so a message that is queued instead moves only once.
#[inline(always)]
pub(crate) fn wanted(shared: &Shared) -> bool {
    WANT.get() == key(shared) && shared.delivered.is_empty()
}

/// Keep `d` for this thread's receive (after [`wanted`] said so).
#[inline(always)]
pub(crate) fn keep(d: Delivery) {
    WANT.set(0);
    // Not `SLOT.set`: `LocalKey::set` goes through the key's lazy
    // initialisation, a call on every message.
    SLOT.with_borrow_mut(|slot| *slot = Some(d));
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    use zerocast_core::{FrameKind, Header, RecvError};
    use zerocast_mem::{Pool, Wait};

    use super::*;
    use crate::{Driver, Link, Pumped, Source};

    /// A test double for a backend's read path: each pump hands the driver
    /// the next batch of data frames, numbered in order, and notes how many
    /// of them went to the delivery queue.
    struct ScriptedSource {
        pool: Pool,
        batches: VecDeque<std::ops::Range<u32>>,
        queued: Arc<Mutex<Vec<usize>>>,
    }

    impl Source for ScriptedSource {
        fn pump(&mut self, driver: &Driver, _until: Option<Instant>) -> Pumped {
            let Some(batch) = self.batches.pop_front() else { return Pumped::Idle };
            for seq in batch {
                let mut buf = self.pool.alloc(4, Wait::No).unwrap();
                buf.copy_from_slice(&seq.to_le_bytes());
                driver.on_frame(Header::new(FrameKind::Data, 0, seq, 4), Some(buf)).unwrap();
            }
            self.queued.lock().unwrap().push(driver.shared.delivered.len());
            Pumped::Frames
        }
    }

    /// A link whose source pumps `batches`, and the queue lengths its
    /// pumps left.
    fn open(batches: &[std::ops::Range<u32>]) -> (Link, Driver, Arc<Mutex<Vec<usize>>>) {
        let (link, driver, pool) = crate::test_link();
        let queued = Arc::default();
        let batches = batches.iter().cloned().collect();
        driver.install_source(Box::new(ScriptedSource { pool, batches, queued: Arc::clone(&queued) }));
        (link, driver, queued)
    }

    fn seq(link: &Link) -> u32 {
        let m = link.try_recv().unwrap();
        u32::from_le_bytes(m[..4].try_into().unwrap())
    }

    #[test]
    fn a_polling_receiver_gets_the_first_frame_of_its_pump_directly_and_the_rest_in_order() {
        let (link, _driver, queued) = open(&[0..3, 3..4]);
        assert_eq!(seq(&link), 0);
        assert_eq!((seq(&link), seq(&link)), (1, 2), "the queued ones come next, before another pump");
        assert_eq!(seq(&link), 3);
        assert_eq!(*queued.lock().unwrap(), [2, 0], "the first frame of each pump was handed over");
        assert!(matches!(link.try_recv(), Err(RecvError::Empty)));
        assert!(matches!(link.recv(Some(Instant::now())), Err(RecvError::Timeout)));
    }

    #[test]
    fn a_blocking_receiver_that_pumps_gets_its_frame_directly() {
        let (link, _driver, queued) = open(&[0..1, 1..3]);
        let m = link.recv(None).unwrap();
        assert_eq!(u32::from_le_bytes(m[..4].try_into().unwrap()), 0);
        let m = link.recv(None).unwrap();
        assert_eq!(u32::from_le_bytes(m[..4].try_into().unwrap()), 1);
        assert_eq!(seq(&link), 2);
        assert_eq!(*queued.lock().unwrap(), [0, 1]);
    }

    /// What the driver does with a message: keep it if it is wanted.
    fn offer(shared: &Shared, d: Delivery) -> Result<(), Delivery> {
        if !wanted(shared) {
            return Err(d);
        }
        keep(d);
        Ok(())
    }

    fn msg(link: &Link) -> Delivery {
        Delivery::Msg(link.pool().alloc(1, Wait::No).unwrap(), None)
    }

    #[test]
    fn only_the_first_frame_with_nothing_queued_for_the_same_connection_is_handed_over() {
        let (link, driver, _) = open(&[]);
        let (other, other_driver, _) = open(&[]);
        let shared = &*driver.shared;
        let h = Handoff::open(shared);
        assert!(offer(&other_driver.shared, msg(&other)).is_err(), "another connection's frame");
        assert!(offer(shared, msg(&link)).is_ok());
        assert!(offer(shared, msg(&link)).is_err(), "one per pump");
        assert!(h.take().is_some());
        let h = Handoff::open(shared);
        shared.delivered.push(msg(&link)).unwrap();
        assert!(offer(shared, msg(&link)).is_err(), "a message is queued before it");
        assert!(h.take().is_none());
        assert!(offer(shared, msg(&link)).is_err(), "no handoff open");
    }

    #[test]
    fn a_handoff_dropped_with_its_message_queues_it() {
        let (link, driver, _) = open(&[]);
        let h = Handoff::open(&driver.shared);
        assert!(offer(&driver.shared, msg(&link)).is_ok());
        drop(h);
        assert_eq!(driver.shared.delivered.len(), 1);
        assert!(link.try_recv().is_ok());
    }
}
