//! Datagram sequence accounting: received, lost, reordered and duplicate
//! datagrams of one sender, from the sequence numbers alone.
//!
//! A datagram sender numbers what it sends to each destination 0, 1, 2, …
//! (wrapping at `u32::MAX`). A receiver feeds each number it sees from one
//! source to that source's [`SeqTracker`], which counts:
//!
//! - **received**: distinct datagrams;
//! - **lost**: numbers inside the span seen so far (from the lowest to the
//!   highest) that have not arrived. A late datagram takes its loss back;
//! - **reordered**: datagrams that arrived after a higher number;
//! - **duplicates**: numbers seen twice (not counted as received).
//!
//! While no sender restarts, `lost == span - received` holds after every
//! step, where `span` is the number of sequence numbers from the lowest to
//! the highest seen. Duplicates are recognised within the last
//! [`SeqTracker::WINDOW`] numbers; a datagram further behind than that is
//! taken as the sender starting its numbering again (a new socket on the
//! same address), and the tracker restarts from it (counted in
//! [`SeqStats::restarts`]).
//!
//! Pure state, no I/O, no clock, no allocation.

/// A snapshot of one source's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct SeqStats {
    /// Distinct datagrams received.
    pub received: u64,
    /// Datagrams missing from the span seen so far.
    pub lost: u64,
    /// Datagrams that arrived after one with a higher number.
    pub reordered: u64,
    /// Datagrams whose number was already seen.
    pub duplicates: u64,
    /// Times the sender's numbering started again.
    pub restarts: u64,
}

/// What one arrival was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// The next number expected (or the first seen).
    InOrder,
    /// Ahead of the next expected: `missing` numbers were skipped.
    Gap {
        /// How many numbers were skipped.
        missing: u32,
    },
    /// Behind the highest seen and not seen before: it had been counted lost.
    Late,
    /// Already seen.
    Duplicate,
    /// Too far behind to be a late datagram: the sender started again.
    Restart,
}

/// The sequence accounting of one sender, as seen by one receiver.
#[derive(Debug, Clone, Default)]
pub struct SeqTracker {
    started: bool,
    /// Lowest number of the span.
    lo: u32,
    /// One past the highest number seen.
    next: u32,
    /// Bit `i` is set when `next - 1 - i` has been seen.
    seen: u64,
    stats: SeqStats,
}

impl SeqTracker {
    /// How many numbers behind the highest a datagram can be and still be
    /// told apart as late or duplicate.
    pub const WINDOW: u32 = 64;

    /// A tracker that has seen nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Account for the arrival of number `seq`.
    pub fn on_arrival(&mut self, seq: u32) -> Arrival {
        if !self.started {
            self.start(seq);
            return Arrival::InOrder;
        }
        let ahead = seq.wrapping_sub(self.next);
        if ahead < 1 << 31 {
            // At or past the next expected number.
            self.stats.lost += u64::from(ahead);
            let shift = u64::from(ahead) + 1;
            self.seen = if shift >= 64 { 1 } else { (self.seen << shift) | 1 };
            self.next = seq.wrapping_add(1);
            self.stats.received += 1;
            return if ahead == 0 { Arrival::InOrder } else { Arrival::Gap { missing: ahead } };
        }
        let back = self.next.wrapping_sub(1).wrapping_sub(seq);
        if back >= Self::WINDOW {
            self.stats.restarts += 1;
            self.start(seq);
            return Arrival::Restart;
        }
        let bit = 1u64 << back;
        if self.seen & bit != 0 {
            self.stats.duplicates += 1;
            return Arrival::Duplicate;
        }
        self.seen |= bit;
        self.stats.received += 1;
        self.stats.reordered += 1;
        let span = self.next.wrapping_sub(self.lo);
        if back < span {
            // Inside the span: it was counted lost.
            self.stats.lost = self.stats.lost.saturating_sub(1);
        } else {
            // Below the span: the span grows down to it, and the numbers
            // between it and the old lowest are missing.
            self.stats.lost += u64::from(self.lo.wrapping_sub(seq)) - 1;
            self.lo = seq;
        }
        Arrival::Late
    }

    fn start(&mut self, seq: u32) {
        self.started = true;
        self.lo = seq;
        self.next = seq.wrapping_add(1);
        self.seen = 1;
        self.stats.received += 1;
    }

    /// The counters so far.
    pub fn stats(&self) -> SeqStats {
        self.stats
    }

    /// One past the highest number seen (0 before the first arrival).
    pub fn next_expected(&self) -> u32 {
        self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn feed(seqs: &[u32]) -> (SeqTracker, Vec<Arrival>) {
        let mut t = SeqTracker::new();
        let a = seqs.iter().map(|&s| t.on_arrival(s)).collect();
        (t, a)
    }

    #[test]
    fn in_order_has_no_loss() {
        let (t, a) = feed(&[0, 1, 2, 3]);
        assert!(a.iter().all(|&x| x == Arrival::InOrder));
        assert_eq!(t.stats(), SeqStats { received: 4, ..SeqStats::default() });
    }

    #[test]
    fn gaps_count_as_lost_until_the_late_one_comes() {
        let (t, a) = feed(&[0, 3, 4]);
        assert_eq!(a[1], Arrival::Gap { missing: 2 });
        assert_eq!((t.stats().received, t.stats().lost), (3, 2));
        let mut t = t;
        assert_eq!(t.on_arrival(1), Arrival::Late);
        assert_eq!(t.on_arrival(1), Arrival::Duplicate);
        let s = t.stats();
        assert_eq!((s.received, s.lost, s.reordered, s.duplicates), (4, 1, 1, 1));
    }

    #[test]
    fn late_before_the_first_extends_the_span() {
        // 5 first, then 2: 3 and 4 are now missing too.
        let (t, a) = feed(&[5, 2]);
        assert_eq!(a[1], Arrival::Late);
        let s = t.stats();
        assert_eq!((s.received, s.lost, s.reordered), (2, 2, 1));
        let (t, _) = feed(&[5, 2, 3, 4]);
        assert_eq!((t.stats().received, t.stats().lost), (4, 0));
    }

    #[test]
    fn wraps_around() {
        let (t, a) = feed(&[u32::MAX - 1, u32::MAX, 0, 2]);
        assert_eq!(a[2], Arrival::InOrder);
        assert_eq!(a[3], Arrival::Gap { missing: 1 });
        assert_eq!((t.stats().received, t.stats().lost), (4, 1));
        assert_eq!(t.next_expected(), 3);
    }

    #[test]
    fn far_behind_is_a_restart() {
        let (t, a) = feed(&[1000, 1001, 0, 1]);
        assert_eq!(a[2], Arrival::Restart);
        assert_eq!(a[3], Arrival::InOrder);
        let s = t.stats();
        assert_eq!((s.received, s.lost, s.restarts), (4, 0, 1));
    }

    #[test]
    fn big_gaps_clear_the_window() {
        let (t, a) = feed(&[0, 200, 150]);
        assert_eq!(a[1], Arrival::Gap { missing: 199 });
        // 150 is 49 behind 200: inside the window, not seen: late.
        assert_eq!(a[2], Arrival::Late);
        assert_eq!((t.stats().received, t.stats().lost), (3, 198));
    }

    proptest! {
        /// Drop any datagrams, move the rest by up to 31 places: every
        /// counter matches what was done, and `lost == span - received`.
        #[test]
        fn counts_match_drops_and_reorders(
            start: u32,
            n in 1usize..400,
            drop_mask in proptest::collection::vec(any::<bool>(), 400),
            jitter in proptest::collection::vec(0usize..32, 400),
        ) {
            let mut kept: Vec<(usize, u32)> = (0..n)
                .filter(|&i| !drop_mask[i] || i == 0)
                .map(|i| (i + jitter[i], start.wrapping_add(i as u32)))
                .collect();
            kept.sort_by_key(|&(k, _)| k);
            let order: Vec<u32> = kept.iter().map(|&(_, s)| s).collect();
            let (t, _) = feed(&order);
            let s = t.stats();
            let offsets: Vec<u32> = order.iter().map(|&x| x.wrapping_sub(start)).collect();
            let lo = *offsets.iter().min().unwrap();
            let hi = *offsets.iter().max().unwrap();
            let span = u64::from(hi - lo) + 1;
            prop_assert_eq!(s.received, order.len() as u64);
            prop_assert_eq!(s.lost, span - s.received);
            prop_assert_eq!((s.duplicates, s.restarts), (0, 0));
            let mut highest = None::<u32>;
            let mut late = 0u64;
            for &o in &offsets {
                match highest {
                    Some(h) if o < h => late += 1,
                    _ => highest = Some(o),
                }
            }
            prop_assert_eq!(s.reordered, late);
        }

        /// Repeats within the window are duplicates and change nothing else.
        #[test]
        fn duplicates_change_nothing_else(n in 1u32..100, dup in 0u32..100) {
            let mut t = SeqTracker::new();
            for s in 0..n { t.on_arrival(s); }
            let before = t.stats();
            let d = dup % n;
            let arrival = t.on_arrival(d);
            let back = n - 1 - d;
            if back < SeqTracker::WINDOW {
                prop_assert_eq!(arrival, Arrival::Duplicate);
                prop_assert_eq!(t.stats(), SeqStats { duplicates: 1, ..before });
            } else {
                prop_assert_eq!(arrival, Arrival::Restart);
            }
        }
    }
}
