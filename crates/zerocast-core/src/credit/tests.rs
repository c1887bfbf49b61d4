//! A deterministic two-endpoint harness for the credit machine: two sides,
//! two in-order wires, applications that read only when told to. Random
//! schedules of sends, deliveries, delays and slow reads must keep the
//! credit invariants.

use super::*;
use proptest::prelude::*;
use std::collections::VecDeque;

#[derive(Debug)]
struct Side {
    credits: Credits,
    /// Data frames the application wants to send and has not sent yet.
    to_send: u64,
    /// Data frames delivered and not yet read by the application.
    unread: u32,
    /// The credits of each of them, oldest first.
    unread_costs: VecDeque<u32>,
    /// Payload sizes of the frames this side sends, in turn.
    sizes: Vec<u64>,
    /// Data frames read by the application.
    read: u64,
    /// Credits returned to this side, summed over its life.
    credits_in: u64,
    /// Frames this side sent.
    frames_out: u64,
    /// This side has sent its goodbye (a control frame).
    said_goodbye: bool,
}

#[derive(Debug)]
struct Pair {
    sides: [Side; 2],
    /// `wires[i]` carries frames from side `i` to side `1 - i`.
    wires: [VecDeque<Header>; 2],
}

#[derive(Debug, Clone, Copy)]
enum Step {
    /// Side tries to send one data frame.
    Send(usize),
    /// Side tries to send one data frame that cannot carry credits (an RDMA
    /// WRITE with immediate: the receiver sees no header).
    SendBare(usize),
    /// Deliver the oldest frame on the wire out of a side.
    Deliver(usize),
    /// The application of a side reads one message.
    Read(usize),
    /// The writer of a side has nothing to send: flush a credit frame if due.
    Flush(usize),
    /// The writer of a side was idle for a heartbeat interval: send a
    /// heartbeat if a data credit allows.
    Heartbeat(usize),
    /// A side with nothing left to send says goodbye.
    Goodbye(usize),
    /// Nothing happens (a delay).
    Idle,
}

fn step() -> impl Strategy<Value = Step> {
    let side = 0usize..2;
    prop_oneof![
        3 => side.clone().prop_map(Step::Send),
        1 => side.clone().prop_map(Step::SendBare),
        3 => side.clone().prop_map(Step::Deliver),
        2 => side.clone().prop_map(Step::Read),
        1 => side.clone().prop_map(Step::Flush),
        1 => side.clone().prop_map(Step::Heartbeat),
        1 => side.prop_map(Step::Goodbye),
        1 => Just(Step::Idle),
    ]
}

impl Pair {
    fn new(w: [u32; 2], to_send: [u64; 2]) -> Self {
        Self::weighted(w, [0, 0], [vec![8], vec![8]], to_send)
    }

    /// Sides with windows `w` and credit units `units`, sending frames of
    /// `sizes` in turn.
    fn weighted(w: [u32; 2], units: [u32; 2], sizes: [Vec<u64>; 2], to_send: [u64; 2]) -> Self {
        let side = |i: usize| Side {
            credits: Credits::weighted((w[i], units[i]), (w[1 - i], units[1 - i])).unwrap(),
            to_send: to_send[i],
            unread: 0,
            unread_costs: VecDeque::new(),
            sizes: sizes[i].clone(),
            read: 0,
            credits_in: 0,
            frames_out: 0,
            said_goodbye: false,
        };
        Pair { sides: [side(0), side(1)], wires: [VecDeque::new(), VecDeque::new()] }
    }

    fn apply(&mut self, step: Step) -> bool {
        match step {
            Step::Send(i) | Step::SendBare(i) => {
                let s = &mut self.sides[i];
                if s.to_send == 0 {
                    return false;
                }
                let len = s.sizes[(s.frames_out % s.sizes.len() as u64) as usize];
                match s.credits.reserve_for(len) {
                    Ok(r) => {
                        let stamp = match step {
                            Step::SendBare(_) => s.credits.commit_bare(r),
                            _ => s.credits.commit(r),
                        };
                        let h = stamp.header(FrameKind::Data, len);
                        s.to_send -= 1;
                        s.frames_out += 1;
                        self.wires[i].push_back(h);
                        true
                    }
                    Err(Blocked) => false,
                }
            }
            Step::Deliver(i) => {
                let Some(h) = self.wires[i].pop_front() else { return false };
                let r = &mut self.sides[1 - i];
                if h.credits == 0 {
                    // What a receiver of a headerless frame assumes.
                    assert_eq!(h.seq, r.credits.next_rx_seq());
                }
                r.credits.on_receive(&h).expect("peer followed the protocol");
                r.credits_in += u64::from(h.credits);
                if h.kind == FrameKind::Data {
                    r.unread += 1;
                    r.unread_costs.push_back(r.credits.cost_of(h.len));
                }
                true
            }
            Step::Read(i) => {
                let s = &mut self.sides[i];
                if s.unread == 0 {
                    return false;
                }
                s.unread -= 1;
                s.read += 1;
                let cost = s.unread_costs.pop_front().expect("one cost per unread frame");
                s.credits.release_many(cost).unwrap();
                true
            }
            Step::Flush(i) => {
                let s = &mut self.sides[i];
                match s.credits.poll_credit_frame() {
                    Some(stamp) => {
                        s.frames_out += 1;
                        self.wires[i].push_back(stamp.header(FrameKind::Credit, 0));
                        true
                    }
                    None => false,
                }
            }
            Step::Heartbeat(i) => {
                let s = &mut self.sides[i];
                let before = s.credits.avail;
                match s.credits.poll_heartbeat_frame() {
                    Some(stamp) => {
                        // Never from the credit reserved for credit frames.
                        assert!(before >= 2);
                        s.frames_out += 1;
                        self.wires[i].push_back(stamp.header(FrameKind::Credit, 0));
                        true
                    }
                    None => {
                        assert!(before < 2);
                        false
                    }
                }
            }
            Step::Goodbye(i) => {
                let s = &mut self.sides[i];
                if s.to_send > 0 || s.said_goodbye {
                    return false;
                }
                match s.credits.poll_control_frame() {
                    Some(stamp) => {
                        s.said_goodbye = true;
                        s.frames_out += 1;
                        self.wires[i].push_back(stamp.header(FrameKind::Control, 0));
                        true
                    }
                    None => false,
                }
            }
            Step::Idle => false,
        }
    }

    /// Invariants that hold after every step.
    fn check(&self) {
        for i in 0..2 {
            let (s, peer) = (&self.sides[i], &self.sides[1 - i]);
            // Never more credits outstanding than the peer's window.
            assert!(s.credits.outstanding() <= peer.credits.window());
            // Conservation: each of the peer's credits is exactly one of
            // available here, on the wire towards the peer (a data frame
            // holds its cost), held or owed by the peer, or returning on a
            // credit in flight.
            let in_flight_frames: u32 = self.wires[i]
                .iter()
                .map(|h| if h.kind == FrameKind::Data { peer.credits.cost_of(h.len) } else { 1 })
                .sum();
            let returning: u32 = self.wires[1 - i].iter().map(|h| u32::from(h.credits)).sum();
            assert_eq!(
                s.credits.avail + in_flight_frames + peer.credits.held() + peer.credits.owed() + returning,
                peer.credits.window(),
                "credit leaked or duplicated: {self:#?}"
            );
            assert_eq!(peer.credits.held(), peer.unread_costs.iter().sum::<u32>());
            // A side that can send a heartbeat is never one its peer thinks
            // it starves; with nothing in flight the peer knows exactly, so
            // a heartbeat-silent side is always a starved one.
            let can_heartbeat = s.credits.avail >= 2;
            if can_heartbeat {
                assert!(!peer.credits.peer_may_be_starved(), "starvation misjudged: {self:#?}");
            }
            if self.wires.iter().all(VecDeque::is_empty) {
                assert_eq!(can_heartbeat, !peer.credits.peer_may_be_starved(), "{self:#?}");
            }
        }
    }

    /// Run every side to completion with a reader that keeps draining.
    /// Returns the number of rounds it took, or `None` on a deadlock.
    fn drain(&mut self) -> Option<usize> {
        for round in 0..100_000 {
            let mut progress = false;
            for i in 0..2 {
                for st in [Step::Send(i), Step::Deliver(i), Step::Read(i), Step::Goodbye(i)] {
                    progress |= self.apply(st);
                    self.check();
                }
            }
            for i in 0..2 {
                // A writer with nothing else to do flushes credits.
                progress |= self.apply(Step::Flush(i));
                self.check();
            }
            if !progress {
                let done = self.sides.iter().all(|s| s.to_send == 0 && s.unread == 0 && s.said_goodbye)
                    && self.wires.iter().all(VecDeque::is_empty);
                return done.then_some(round);
            }
        }
        None
    }
}

/// Apply `steps` to `pair`, checking the invariants after each, then drain
/// it: no deadlock, and each side read every message the other sent, in
/// order (`on_receive` checks sequence numbers) and with every credit
/// accounted for (the conservation check).
fn run_to_the_end(mut pair: Pair, steps: Vec<Step>, sent: [u64; 2]) -> Result<(), TestCaseError> {
    for st in steps {
        pair.apply(st);
        pair.check();
    }
    prop_assert!(pair.drain().is_some(), "deadlock: {pair:#?}");
    prop_assert_eq!(pair.sides[0].read, sent[1]);
    prop_assert_eq!(pair.sides[1].read, sent[0]);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_schedules_keep_credit_invariants(
        w0 in MIN_WINDOW..12,
        w1 in MIN_WINDOW..12,
        n0 in 0u64..200,
        n1 in 0u64..200,
        steps in proptest::collection::vec(step(), 0..600),
    ) {
        run_to_the_end(Pair::new([w0, w1], [n0, n1]), steps, [n0, n1])?;
    }

    /// Weighted credits (a unit of 1 KiB) with frames of any size up to
    /// what the receiver's window allows: the same invariants, no deadlock
    /// however the sizes mix, and a side that weighs talking to one that
    /// does not.
    #[test]
    fn weighted_schedules_keep_credit_invariants(
        w0 in 8u32..40,
        w1 in 8u32..40,
        weigh in 0usize..3,
        picks in proptest::collection::vec((0u64..1000, 0u64..1000), 1..8),
        n0 in 0u64..150,
        n1 in 0u64..150,
        steps in proptest::collection::vec(step(), 0..600),
    ) {
        let units = [[1024, 1024], [1024, 0], [0, 1024]][weigh];
        // Each side's frames fit what its peer's window allows (see
        // `min_window`): at most w/2 credits.
        let largest = |w: u32, unit: u32| if unit == 0 { 1 << 20 } else { u64::from(w / 2 - 1) * u64::from(unit) + 1023 };
        let max = [largest(w1, units[1]), largest(w0, units[0])];
        prop_assert!(min_window(max[0], units[1]) <= w1 && min_window(max[1], units[0]) <= w0);
        let sizes = [
            picks.iter().map(|p| p.0 * max[0] / 999).collect::<Vec<_>>(),
            picks.iter().map(|p| p.1 * max[1] / 999).collect::<Vec<_>>(),
        ];
        run_to_the_end(Pair::weighted([w0, w1], units, sizes, [n0, n1]), steps, [n0, n1])?;
    }

    #[test]
    fn slow_reader_blocks_sender_within_window(w in MIN_WINDOW..40, n in 1u64..500) {
        let mut pair = Pair::new([w, w], [n, 0]);
        // The reader never reads: the sender must stop at w - 1 data frames.
        for _ in 0..(4 * n + 10) {
            pair.apply(Step::Send(0));
            pair.apply(Step::Deliver(0));
            pair.apply(Step::Flush(1));
            pair.apply(Step::Deliver(1));
            pair.check();
        }
        let sent = n - pair.sides[0].to_send;
        prop_assert_eq!(sent, n.min(u64::from(w) - 1));
        prop_assert_eq!(pair.sides[1].unread as u64, sent);
        prop_assert!(pair.drain().is_some());
        prop_assert_eq!(pair.sides[1].read, n);
    }
}

#[test]
fn weighted_credits_bound_bytes_and_messages() {
    // The receiver charges one credit per KiB begun past the first.
    assert_eq!((cost(0, 1024), cost(1023, 1024), cost(1024, 1024), cost(64 << 10, 1024)), (1, 1, 2, 65));
    assert_eq!(cost(u64::MAX, 1024), u32::MAX, "saturates");
    // A unit that is not a power of two divides; one that is shifts: the
    // same count either way.
    assert_eq!((cost(2999, 1500), cost(3000, 1500), cost(u64::MAX, 1500)), (2, 3, u32::MAX));
    for unit in [1024u32, 1500, 4096, 4097, 1 << 20] {
        for len in [0u64, 1, 1023, 1024, 4095, 4096, 4097, 65_535, 65_536, 1 << 30, (1 << 40) + 7] {
            let want = u32::try_from(1 + len / u64::from(unit)).unwrap_or(u32::MAX);
            assert_eq!(cost(len, unit), want, "len {len}, unit {unit}");
        }
    }
    assert_eq!((cost(1 << 30, 0), min_window(1 << 20, 0)), (1, MIN_WINDOW));
    assert_eq!(min_window(64 << 10, 1024), 2 * 65);
    let (mut a, mut b) =
        (Credits::weighted((64, 0), (64, 1024)).unwrap(), Credits::weighted((64, 1024), (64, 0)).unwrap());
    // 64 credits: a 10 KiB frame takes 11; small ones one each.
    let big = a.reserve_for(10 << 10).unwrap();
    assert_eq!(a.available(), 63 - 11);
    assert!(a.is_blocked_for(52 << 10) && !a.is_blocked_for(51 << 10));
    let h = a.commit(big).header(FrameKind::Data, 10 << 10);
    b.on_receive(&h).unwrap();
    assert_eq!(b.held(), 11);
    // A peer that lies about the size it may send overruns: 53 credits
    // are left, a 53 KiB frame takes 54.
    let mut liar = b.clone();
    let lie = Header::new(FrameKind::Data, 0, 1, 53 << 10);
    assert_eq!(liar.on_receive(&lie), Err(CreditError::Overrun { window: 64 }));
    let fits = Header::new(FrameKind::Data, 0, 1, (53 << 10) - 1);
    assert_eq!(liar.on_receive(&fits), Ok(()));
    // Released, the frame's credits come back on the next frame the other way.
    assert_eq!(b.release_many(b.cost_of(10 << 10)), Ok(false));
    let back = b.reserve_for(100 << 10).unwrap();
    let stamp = b.commit(back);
    assert_eq!(stamp.credits, 11);
    a.on_receive(&stamp.header(FrameKind::Data, 100 << 10)).unwrap();
    assert_eq!(a.available(), 63);
    assert_eq!(Credits::weighted((8, 100), (8, 0)).unwrap_err(), CreditError::BadUnit(100));
}

#[test]
fn windows_are_validated() {
    assert_eq!(Credits::new(2, 8).unwrap_err(), CreditError::BadWindow(2));
    assert_eq!(Credits::new(8, 70_000).unwrap_err(), CreditError::BadWindow(70_000));
}

#[test]
fn last_credit_is_reserved_for_credit_frames() {
    let mut a = Credits::new(4, 3).unwrap();
    let r1 = a.reserve().unwrap();
    let r2 = a.reserve().unwrap();
    assert_eq!(a.reserve(), Err(Blocked));
    assert!(a.is_blocked());
    a.cancel(r2);
    let _ = a.commit(r1);
    // Owe the peer enough to want a credit frame; the reserved credit pays.
    let mut b = Credits::new(3, 4).unwrap();
    for seq in 0..2 {
        b.on_receive(&Header::new(FrameKind::Data, 0, seq, 1)).unwrap();
        b.release().unwrap();
    }
    let _ = b.reserve().unwrap();
    let _ = b.reserve().unwrap();
    let _ = b.reserve().unwrap();
    assert_eq!(b.reserve(), Err(Blocked));
    assert_eq!(b.poll_credit_frame(), Some(Stamp { seq: 0, credits: 2 }));
    assert_eq!(b.poll_credit_frame(), None);
}

#[test]
fn heartbeats_use_a_data_credit_and_return_owed_credits() {
    let mut a = Credits::new(3, 3).unwrap();
    let mut b = Credits::new(3, 3).unwrap();
    let h0 = a.poll_heartbeat_frame().unwrap().header(FrameKind::Credit, 0);
    let h1 = a.poll_heartbeat_frame().unwrap().header(FrameKind::Credit, 0);
    assert_eq!(a.poll_heartbeat_frame(), None, "the reserved credit is not for heartbeats");
    assert!(a.poll_credit_frame().is_none() && a.poll_control_frame().is_some(), "still reserved");
    b.on_receive(&h0).unwrap();
    assert!(!b.peer_may_be_starved());
    b.on_receive(&h1).unwrap();
    // Two owed, not yet returned: one buffer free, so `a` may be starved.
    assert_eq!(b.owed(), 2);
    assert!(b.peer_may_be_starved());
    let back = b.poll_heartbeat_frame().unwrap();
    assert_eq!(back.credits, 2);
    assert!(!b.peer_may_be_starved());
    a.on_receive(&back.header(FrameKind::Credit, 0)).unwrap();
    assert_eq!(a.available(), 1);
    assert_eq!(a.stats().heartbeats_sent, 2);
}

#[test]
fn hostile_peer_is_detected() {
    let mut a = Credits::new(3, 3).unwrap();
    let data = |seq| Header::new(FrameKind::Data, 0, seq, 1);
    a.on_receive(&data(0)).unwrap();
    assert_eq!(a.on_receive(&data(5)), Err(CreditError::Sequence { expected: 1, got: 5 }));
    a.on_receive(&data(1)).unwrap();
    a.on_receive(&data(2)).unwrap();
    assert_eq!(a.on_receive(&data(3)), Err(CreditError::Overrun { window: 3 }));
    let mut b = Credits::new(3, 3).unwrap();
    let forged = Header::new(FrameKind::Credit, 1, 0, 0);
    assert_eq!(b.on_receive(&forged), Err(CreditError::Duplicated { returned: 1, outstanding: 0 }));
    assert_eq!(b.release(), Err(CreditError::ReleaseUnderflow));
}

#[test]
fn a_batch_of_releases_is_the_same_as_one_at_a_time() {
    let data = |seq| Header::new(FrameKind::Data, 0, seq, 1);
    let mut one = Credits::new(8, 8).unwrap();
    let mut many = one.clone();
    for seq in 0..6 {
        one.on_receive(&data(seq)).unwrap();
        many.on_receive(&data(seq)).unwrap();
    }
    let due: Vec<bool> = (0..5).map(|_| one.release().unwrap()).collect();
    assert_eq!(due, [false, false, false, true, true], "due at half the window");
    assert_eq!(many.release_many(0), Ok(false));
    assert_eq!(many.release_many(5), Ok(true));
    assert_eq!((many.held(), many.owed()), (one.held(), one.owed()));
    assert_eq!(many.poll_credit_frame(), one.poll_credit_frame());
    assert_eq!(many.release_many(2), Err(CreditError::ReleaseUnderflow), "one held, two released");
    assert_eq!((many.held(), many.owed()), (1, 0), "a refused batch changes nothing");
}
