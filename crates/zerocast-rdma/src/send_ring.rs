//! The ring of sends in flight, with selective signalling, shared by RC
//! connections and UD sockets.
//!
//! Send number `seq` (its `wr_id`) lives in slot `seq % depth` with what
//! the device still reads for it (its payload; for UD, the address handle
//! too), from its post until a completion for it or for a later send is
//! polled: a send queue completes in order, so one completion accounts for
//! every send before it. Only every [`SendRing::signal_every`]th send is
//! signalled, plus those a caller forces, so the device writes one
//! completion, and a sender polls the CQ once, per that many sends
//! (`ib_send_bw` does the same). A failed send completes with an error
//! whether it was signalled or not, so no failure goes unseen.
//!
//! No division on the way: the signal interval is a power of two (a mask),
//! and the slots of the oldest and the next send are kept as indices that
//! step and wrap (a 64-bit division is tens of cycles on a CPU, and a
//! helper call under an emulator, on every post).
//!
//! The sends after the last signalled one report nothing on their own.
//! [`SendRing::fence_due`] says when a caller that must know they are done
//! has to post a signalled send behind them (UD: a fence the socket sends
//! to itself, see `UdSocket::flush`; RC: the last frame of a batch that
//! leaves a payload in the ring, and every goodbye or credit frame, is
//! signalled, so nothing waits on such a tail).

#[derive(Debug)]
pub(crate) struct SendRing<T> {
    slots: Vec<Option<T>>,
    /// Oldest send not yet known complete.
    head: u64,
    /// Next send number.
    tail: u64,
    /// The newest signalled send, if any was posted.
    last_signalled: Option<u64>,
    /// `head`'s and `tail`'s slots.
    head_slot: usize,
    tail_slot: usize,
    /// [`SendRing::signal_every`] less one: a power of two's mask.
    signal_mask: u64,
}

impl<T> SendRing<T> {
    pub(crate) fn new(depth: usize) -> Self {
        let depth = depth.max(1);
        // A quarter of the ring, at most 32, rounded down to a power of two.
        let every = 1u64 << (depth as u64 / 4).clamp(1, 32).ilog2();
        Self {
            slots: (0..depth).map(|_| None).collect(),
            head: 0,
            tail: 0,
            last_signalled: None,
            head_slot: 0,
            tail_slot: 0,
            signal_mask: every - 1,
        }
    }

    /// Signal one send per this many: a quarter of the ring (at most 32)
    /// rounded down to a power of two, so a full ring always holds a
    /// signalled send whose completion frees slots.
    pub(crate) fn signal_every(&self) -> u64 {
        self.signal_mask + 1
    }

    /// The most sends one chain may reserve before it is posted. Reserved
    /// sends cannot complete, and neither can the unsignalled tail (fewer
    /// than [`signal_every`](Self::signal_every), at most a quarter of the
    /// ring) until a later signalled send does; so a chain of at most half
    /// the ring always finds its slots once the signalled sends complete,
    /// where a longer one could wait for ever.
    pub(crate) fn max_chain(&self) -> usize {
        (self.slots.len() / 2).max(1)
    }

    pub(crate) fn outstanding(&self) -> usize {
        (self.tail - self.head) as usize
    }

    /// Sends that may be reserved now.
    pub(crate) fn room(&self) -> usize {
        self.slots.len() - self.outstanding()
    }

    pub(crate) fn is_full(&self) -> bool {
        self.outstanding() == self.slots.len()
    }

    /// Whether a poll could free anything: some send is signalled and not
    /// yet known complete (failed unsignalled sends complete too, but only
    /// after an earlier failure made the queue flush, which a signalled
    /// send or the fence also reports).
    pub(crate) fn awaits_completion(&self) -> bool {
        self.last_signalled.is_some_and(|s| s >= self.head)
    }

    /// Sends after the newest signalled one are outstanding: only a later
    /// signalled send can tell when they are done.
    pub(crate) fn fence_due(&self) -> bool {
        self.outstanding() > 0 && self.last_signalled.is_none_or(|s| s + 1 < self.tail)
    }

    /// Take the next send number and its slot; `None` when the ring is
    /// full. `signal`: whether this send must be signalled.
    pub(crate) fn reserve(&mut self, force_signal: bool) -> Option<Reserved> {
        if self.is_full() {
            return None;
        }
        let seq = self.tail;
        let slot = self.tail_slot;
        self.tail += 1;
        self.tail_slot = self.next(slot);
        let signal = force_signal || (seq + 1) & self.signal_mask == 0;
        Some(Reserved { seq, slot, signal })
    }

    /// The post of `r` succeeded: keep `entry` (what the device still
    /// reads) until it completes.
    pub(crate) fn posted(&mut self, r: &Reserved, entry: Option<T>) {
        self.slots[r.slot] = entry;
        if r.signal {
            self.last_signalled = Some(r.seq);
        }
    }

    /// The post of `r`, the newest reservation, failed: give its number back.
    pub(crate) fn unreserve(&mut self, r: &Reserved) {
        debug_assert_eq!(r.seq + 1, self.tail);
        self.unreserve_from(r.seq);
    }

    /// The sends numbered `seq` and after were reserved but never posted
    /// (a chain whose post stopped there): give their numbers back, and
    /// drop anything kept for them.
    pub(crate) fn unreserve_from(&mut self, seq: u64) {
        debug_assert!(self.head <= seq && seq <= self.tail);
        let from = seq.max(self.head);
        let from_slot = self.slot(from);
        let mut i = from_slot;
        for _ in from..self.tail {
            drop(self.slots[i].take());
            i = self.next(i);
        }
        self.tail = from;
        self.tail_slot = from_slot;
    }

    /// Sends up to and including `seq` completed: their payloads go back to
    /// the pool and their slots are free. Numbers outside the ring are
    /// ignored.
    pub(crate) fn complete_through(&mut self, seq: u64) {
        if seq < self.head || seq >= self.tail {
            return;
        }
        let mut i = self.head_slot;
        for _ in self.head..=seq {
            drop(self.slots[i].take());
            i = self.next(i);
        }
        self.head = seq + 1;
        self.head_slot = i;
    }

    /// The slot of send number `seq`, by division: for the rare paths (a
    /// post that failed). The hot ones step [`SendRing::next`].
    fn slot(&self, seq: u64) -> usize {
        (seq % self.slots.len() as u64) as usize
    }

    /// The slot after `i`.
    #[inline]
    fn next(&self, i: usize) -> usize {
        if i + 1 == self.slots.len() {
            0
        } else {
            i + 1
        }
    }
}

/// A send number taken from the ring, and where it lives.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reserved {
    pub(crate) seq: u64,
    pub(crate) slot: usize,
    pub(crate) signal: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reserve and post a send with no payload (no device here).
    fn post(t: &mut SendRing<()>, force_signal: bool) -> Option<Reserved> {
        let r = t.reserve(force_signal)?;
        t.posted(&r, None);
        Some(r)
    }

    #[test]
    fn signals_a_quarter_of_the_ring_and_a_completion_frees_everything_before_it() {
        let mut t = SendRing::<()>::new(16);
        assert_eq!(t.signal_every(), 4);
        let sig: Vec<bool> = (0..8).map(|_| post(&mut t, false).unwrap().signal).collect();
        assert_eq!(sig, [false, false, false, true, false, false, false, true]);
        assert_eq!(t.outstanding(), 8);
        assert!(!t.fence_due(), "the newest send is signalled");
        t.complete_through(3);
        assert_eq!(t.outstanding(), 4);
        t.complete_through(2); // already accounted for
        t.complete_through(99); // never sent
        assert_eq!(t.outstanding(), 4);
        t.complete_through(7);
        assert_eq!(t.outstanding(), 0);
        assert!(!t.awaits_completion());
    }

    #[test]
    fn trailing_unsignalled_sends_need_a_fence() {
        let mut t = SendRing::<()>::new(8);
        // signal_every is 2: send 1 is signalled, send 2 is not.
        for _ in 0..3 {
            post(&mut t, false);
        }
        assert!(t.fence_due());
        t.complete_through(1);
        assert!(t.fence_due() && !t.awaits_completion());
        let fence = post(&mut t, true).unwrap();
        assert!(fence.signal && !t.fence_due() && t.awaits_completion());
        t.complete_through(fence.seq);
        assert_eq!(t.outstanding(), 0);
        assert!(!t.fence_due());
    }

    #[test]
    fn a_full_ring_always_holds_a_signalled_send() {
        for depth in [1, 2, 3, 5, 8, 128, 1000] {
            let mut t = SendRing::<()>::new(depth);
            while post(&mut t, false).is_some() {}
            assert!(t.is_full() && t.awaits_completion(), "depth {depth}");
        }
    }

    #[test]
    fn a_chain_of_max_chain_always_finds_its_slots() {
        for depth in [1, 2, 3, 4, 5, 8, 13, 128, 1000] {
            let mut t = SendRing::<()>::new(depth);
            for round in 0..3 * depth {
                // Only signalled sends complete: the unsignalled tail stays.
                if let Some(s) = t.last_signalled {
                    t.complete_through(s);
                }
                let chain: Vec<_> = (0..t.max_chain()).map(|_| t.reserve(false)).collect();
                assert!(chain.iter().all(Option::is_some), "depth {depth}, round {round}");
                for r in chain.iter().flatten() {
                    t.posted(r, None);
                }
            }
        }
    }

    #[test]
    fn slots_follow_send_numbers_across_wraps_and_give_backs() {
        for depth in [1, 3, 5, 8, 13] {
            let mut t = SendRing::<u64>::new(depth);
            assert!(t.signal_every().is_power_of_two() && t.signal_every() <= (depth as u64 / 4).max(1));
            for round in 0..4 * depth as u64 {
                // Fill the ring, give the last send back, complete half.
                while let Some(r) = t.reserve(false) {
                    assert_eq!(r.slot as u64, r.seq % depth as u64, "depth {depth}, round {round}");
                    assert_eq!(r.signal, (r.seq + 1) % t.signal_every() == 0);
                    t.posted(&r, Some(r.seq));
                }
                let last = t.tail - 1;
                t.unreserve_from(last);
                let upto = t.head + (t.outstanding() as u64).div_ceil(2);
                if upto > t.head {
                    t.complete_through(upto - 1);
                }
                // What is left in the ring is exactly the outstanding sends.
                let mut kept: Vec<u64> = t.slots.iter().flatten().copied().collect();
                kept.sort_unstable();
                assert_eq!(kept, (t.head..t.tail).collect::<Vec<_>>(), "depth {depth}, round {round}");
            }
        }
    }

    #[test]
    fn a_failed_post_gives_its_number_back() {
        let mut t = SendRing::<()>::new(4);
        let r = t.reserve(false).unwrap();
        t.unreserve(&r);
        assert_eq!(t.outstanding(), 0);
        assert_eq!(t.reserve(false).unwrap().seq, 0);
    }

    #[test]
    fn a_chain_that_stopped_half_way_gives_the_rest_back() {
        let mut t = SendRing::<u32>::new(8);
        let rs: Vec<Reserved> = (0..4).map(|_| t.reserve(false).unwrap()).collect();
        t.posted(&rs[0], Some(10));
        t.posted(&rs[1], Some(11));
        t.unreserve_from(rs[2].seq);
        assert_eq!(t.outstanding(), 2);
        assert_eq!(t.reserve(false).unwrap().seq, 2, "numbers 2 and 3 come back");
        t.complete_through(1);
        assert_eq!(t.outstanding(), 1);
    }
}
