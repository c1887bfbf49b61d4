//! A receiving thread's pump takes one batch ([`Driver::batch_done`]): a
//! ring of frames or [`BATCH_BYTES`] of them; every other pump takes
//! everything there is.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use zerocast_core::{FrameKind, Header, RecvError, HEADER_LEN};
use zerocast_mem::{Pool, Wait};

use crate::queue::FAST;
use crate::{Driver, Link, Pumped, Source, BATCH_BYTES};

/// A test double for a socket holding `left` data frames of `size` bytes
/// (4 unless set; the sequence number first): each pump
/// hands the driver frames in order until they run out or the driver says
/// the batch is done, and notes the delivery queue's length after it.
struct Backlogged {
    pool: Pool,
    next: u32,
    left: u32,
    size: usize,
    queued_after: Arc<Mutex<Vec<usize>>>,
}

impl Source for Backlogged {
    fn pump(&mut self, driver: &Driver, _until: Option<Instant>) -> Pumped {
        let (mut frames, mut bytes) = (0, 0);
        while self.left > 0 {
            let mut buf = self.pool.alloc(self.size, Wait::No).unwrap();
            buf[..4].copy_from_slice(&self.next.to_le_bytes());
            let header = Header::new(FrameKind::Data, 0, self.next, self.size as u64);
            driver.on_frame(header, Some(buf)).unwrap();
            self.next += 1;
            self.left -= 1;
            frames += 1;
            bytes += HEADER_LEN + self.size;
            if driver.batch_done(frames, bytes) {
                break;
            }
        }
        self.queued_after.lock().unwrap().push(driver.shared.delivered.len());
        if frames > 0 {
            Pumped::Frames
        } else {
            Pumped::Idle
        }
    }
}

/// A link with room for `n` messages in flight whose source holds `n`
/// frames, and the queue lengths its pumps leave.
fn backlogged(n: u32) -> (Link, Driver, Arc<Mutex<Vec<usize>>>) {
    backlogged_of(n, 4)
}

/// [`backlogged`] with frames of `size` bytes.
fn backlogged_of(n: u32, size: usize) -> (Link, Driver, Arc<Mutex<Vec<usize>>>) {
    let (link, driver, pool) = crate::test_link_of(n);
    let queued_after = Arc::default();
    let source = Backlogged { pool, next: 0, left: n, size, queued_after: Arc::clone(&queued_after) };
    driver.install_source(Box::new(source));
    (link, driver, queued_after)
}

fn seq(m: &[u8]) -> u32 {
    u32::from_le_bytes(m[..4].try_into().unwrap())
}

#[test]
fn a_receiving_thread_takes_a_window_of_small_messages_a_ring_at_a_time() {
    let n = 1000;
    for blocking in [true, false] {
        let (link, _driver, queued_after) = backlogged(n);
        for i in 0..n {
            let m = if blocking { link.recv(None) } else { link.try_recv() };
            assert_eq!(seq(&m.unwrap()), i, "blocking: {blocking}");
        }
        assert!(matches!(link.recv(Some(Instant::now())), Err(RecvError::Timeout)));
        let queued_after = queued_after.lock().unwrap();
        // Each pump hands its first frame over and queues the rest of its
        // batch: the ring, never the spill list behind it.
        assert!(queued_after.iter().all(|&q| q < FAST), "blocking: {blocking}: {queued_after:?}");
        let pumps = queued_after.iter().filter(|&&q| q > 0).count();
        assert_eq!(pumps, (n as usize).div_ceil(FAST), "blocking: {blocking}: one pump per batch");
    }
}

#[test]
fn a_receiving_thread_takes_a_window_of_larger_messages_64_kib_at_a_time() {
    let (n, size) = (300, 4096);
    let (link, _driver, queued_after) = backlogged_of(n, size);
    for i in 0..n {
        assert_eq!(seq(&link.recv(None).unwrap()), i);
    }
    // The rest of the window waits at the source, not in pool buffers:
    // each batch is the first frame to reach BATCH_BYTES.
    assert_eq!(link.stats().queued, 0);
    let per_batch = BATCH_BYTES.div_ceil(HEADER_LEN + size);
    let queued_after = queued_after.lock().unwrap();
    assert!(queued_after.iter().all(|&q| q < per_batch), "{queued_after:?}");
    let pumps = queued_after.iter().filter(|&&q| q > 0).count();
    assert_eq!(pumps, (n as usize).div_ceil(per_batch), "one pump per batch: {queued_after:?}");
}

#[test]
fn the_engine_and_a_look_at_the_counters_take_everything() {
    let n = 300;
    for size in [4, 4096] {
        let (_link, driver, queued_after) = backlogged_of(n, size);
        assert_eq!(driver.try_pump(None), Some(Pumped::Frames));
        assert_eq!(
            *queued_after.lock().unwrap(),
            [n as usize],
            "the engine read the whole backlog of {size} B"
        );
    }

    let (link, _driver, _) = backlogged(n);
    assert_eq!(link.stats().queued, n as usize, "stats counts every message that has arrived");
    for i in 0..n {
        assert_eq!(seq(&link.try_recv().unwrap()), i);
    }
}

#[test]
fn a_registration_after_a_batch_reports_what_the_batch_left_behind() {
    for direct in [false, true] {
        let n = 200;
        let (link, driver, _) = backlogged(n);
        driver.set_source_fd(Arc::new(std::io::stdin()));
        assert_eq!(seq(&link.recv(None).unwrap()), 0);
        let told = Arc::new(crate::direct_tests::Count::default());
        let registered =
            if direct { link.read_directly(told.clone(), 7) } else { link.notify_on_ready(told.clone(), 7) };
        assert!(registered);
        // The frames the batch left are queued and reported, with no
        // readiness of the descriptor and no further pump.
        assert_eq!(told.0.load(std::sync::atomic::Ordering::SeqCst), 1, "direct: {direct}");
        for i in 1..n {
            assert_eq!(seq(&link.try_recv().unwrap()), i, "direct: {direct}");
        }
    }
}

/// A link read directly by its tasks, as the async API reads `tcp://`,
/// whose descriptor was just seen readable.
fn read_directly(n: u32) -> (Link, Driver, Arc<Mutex<Vec<usize>>>) {
    let (link, driver, queued_after) = backlogged(n);
    driver.set_source_fd(Arc::new(std::io::stdin()));
    assert!(link.read_directly(Arc::new(crate::direct_tests::Count::default()), 0));
    link.source_readable();
    (link, driver, queued_after)
}

#[test]
fn a_task_that_reads_directly_takes_a_ring_at_a_time_with_no_readiness_for_the_rest() {
    let n = 1000;
    let (link, _driver, queued_after) = read_directly(n);
    // One readiness of the descriptor; what each batch leaves is read by
    // the next look all the same.
    for i in 0..n {
        assert_eq!(seq(&link.try_recv().unwrap()), i);
    }
    assert!(matches!(link.try_recv(), Err(RecvError::Empty)));
    let queued_after = queued_after.lock().unwrap();
    assert!(queued_after.iter().all(|&q| q < FAST), "{queued_after:?}");
    let pumps = queued_after.iter().filter(|&&q| q > 0).count();
    assert_eq!(pumps, (n as usize).div_ceil(FAST), "one pump per batch");
}

#[test]
fn a_wait_for_credit_reads_what_a_direct_readers_batch_left() {
    let n = 300;
    let (link, _driver, _) = read_directly(n);
    assert_eq!(seq(&link.try_recv().unwrap()), 0);
    // A task that now waits for credit (which may be among the frames the
    // batch left, with no readiness to come) reads them all.
    assert!(link.pump_for_credit());
    assert_eq!(link.stats().queued, n as usize - 1);
    for i in 1..n {
        assert_eq!(seq(&link.try_recv().unwrap()), i);
    }
}
