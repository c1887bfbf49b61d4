//! The send side of a UD socket: the ring of sends in flight, with
//! selective signalling.
//!
//! Send number `seq` (its `wr_id`) lives in slot `seq % depth` with its
//! payload and the address handle it was sent with, from its post until a
//! completion for it or for a later send is polled: a send queue completes
//! in order, so one completion accounts for every send before it. Only
//! every [`TxRing::signal_every`]th send is signalled, so the device writes
//! one completion, and a sender polls the CQ once, per that many sends
//! (`ib_send_bw` does the same). A failed send completes with an error
//! whether it was signalled or not, so no failure goes unseen.
//!
//! The sends after the last signalled one report nothing on their own.
//! [`TxRing::fence_due`] says when a flush must post a signalled, empty
//! send behind them (the socket sends it to itself, see
//! `UdSocket::flush`) to learn that they are done.

use std::sync::Arc;

use zerocast_mem::Buf;

use crate::verbs::AddressHandle;

/// One send in flight: its payload (none for a fence) and the AH it was
/// sent with, both kept until the device is done with them.
type InFlight = (Option<Buf>, Arc<AddressHandle>);

#[derive(Debug)]
pub(super) struct TxRing {
    slots: Vec<Option<InFlight>>,
    /// Oldest send not yet known complete.
    head: u64,
    /// Next send number.
    tail: u64,
    /// The newest signalled send, if any was posted.
    last_signalled: Option<u64>,
}

impl TxRing {
    pub(super) fn new(depth: usize) -> Self {
        Self { slots: (0..depth.max(1)).map(|_| None).collect(), head: 0, tail: 0, last_signalled: None }
    }

    /// Signal one send per this many: a quarter of the ring (at most 32),
    /// so a full ring always holds a signalled send whose completion frees
    /// slots.
    pub(super) fn signal_every(&self) -> u64 {
        (self.slots.len() as u64 / 4).clamp(1, 32)
    }

    pub(super) fn outstanding(&self) -> usize {
        (self.tail - self.head) as usize
    }

    pub(super) fn is_full(&self) -> bool {
        self.outstanding() == self.slots.len()
    }

    /// Whether a poll could free anything: some send is signalled and not
    /// yet known complete (failed unsignalled sends complete too, but only
    /// after an earlier failure made the queue flush, which a signalled
    /// send or the fence also reports).
    pub(super) fn awaits_completion(&self) -> bool {
        self.last_signalled.is_some_and(|s| s >= self.head)
    }

    /// Sends after the newest signalled one are outstanding: only a later
    /// signalled send can tell when they are done.
    pub(super) fn fence_due(&self) -> bool {
        self.outstanding() > 0 && self.last_signalled.is_none_or(|s| s + 1 < self.tail)
    }

    /// Take the next send number and its slot; `None` when the ring is
    /// full. `signal`: whether this send must be signalled.
    pub(super) fn reserve(&mut self, force_signal: bool) -> Option<Reserved> {
        if self.is_full() {
            return None;
        }
        let seq = self.tail;
        self.tail += 1;
        let signal = force_signal || (seq + 1) % self.signal_every() == 0;
        Some(Reserved { seq, slot: self.slot(seq), signal })
    }

    /// The post of `r` succeeded: keep its payload and AH (`entry`) until
    /// it completes.
    pub(super) fn posted(&mut self, r: &Reserved, entry: Option<InFlight>) {
        self.slots[r.slot] = entry;
        if r.signal {
            self.last_signalled = Some(r.seq);
        }
    }

    /// The post of `r`, the newest reservation, failed: give its number back.
    pub(super) fn unreserve(&mut self, r: &Reserved) {
        debug_assert_eq!(r.seq + 1, self.tail);
        self.tail = r.seq;
    }

    /// Sends up to and including `seq` completed: their payloads go back to
    /// the pool and their slots are free. Numbers outside the ring are
    /// ignored.
    pub(super) fn complete_through(&mut self, seq: u64) {
        if seq < self.head || seq >= self.tail {
            return;
        }
        for s in self.head..=seq {
            let i = self.slot(s);
            drop(self.slots[i].take());
        }
        self.head = seq + 1;
    }

    fn slot(&self, seq: u64) -> usize {
        (seq % self.slots.len() as u64) as usize
    }
}

/// A send number taken from the ring, and where it lives.
#[derive(Debug, Clone, Copy)]
pub(super) struct Reserved {
    pub(super) seq: u64,
    pub(super) slot: usize,
    pub(super) signal: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reserve and post a send with no payload (no device here).
    fn post(t: &mut TxRing, force_signal: bool) -> Option<Reserved> {
        let r = t.reserve(force_signal)?;
        t.posted(&r, None);
        Some(r)
    }

    #[test]
    fn signals_a_quarter_of_the_ring_and_a_completion_frees_everything_before_it() {
        let mut t = TxRing::new(16);
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
        let mut t = TxRing::new(8);
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
            let mut t = TxRing::new(depth);
            while post(&mut t, false).is_some() {}
            assert!(t.is_full() && t.awaits_completion(), "depth {depth}");
        }
    }

    #[test]
    fn a_failed_post_gives_its_number_back() {
        let mut t = TxRing::new(4);
        let r = t.reserve(false).unwrap();
        t.unreserve(&r);
        assert_eq!(t.outstanding(), 0);
        assert_eq!(t.reserve(false).unwrap().seq, 0);
    }
}
