//! Credit-based flow control as a pure state machine.
//!
//! One credit is one receive buffer posted at the peer. The handshake tells
//! each side how many buffers the other has posted: that is its initial
//! window. Every frame consumes a credit; credits come back piggybacked on
//! every outgoing frame, or in an explicit credit frame once half the window
//! is owed.
//!
//! **Weighted credits.** A receiver whose buffers are sized to each message
//! (a byte stream's, which copies into pool buffers) announces a *credit
//! unit* of `u` bytes instead: a data frame of `len` bytes then takes
//! [`cost`]`(len, u) = 1 + len / u` credits, so the window bounds the bytes
//! in flight as well as the messages. Small messages take one credit each,
//! and a window of many credits lets many of them fly, while a large one
//! takes its share of the same budget. Unit 0 is one credit per frame (a
//! posted buffer per message, RDMA's). Control and credit frames always
//! take one. Each direction uses its receiver's unit.
//!
//! The last credit is reserved for credit frames: data may only be sent
//! while at least two credits remain. So a side whose window is nearly empty
//! can always still tell its peer about freed buffers, and two peers can
//! never deadlock with both windows empty.
//!
//! Sending is **reserve then commit**: [`Credits::reserve`] takes a credit
//! (or reports [`Blocked`]); [`Credits::commit`] stamps the frame's sequence
//! number and piggybacked credits when it is actually written. A reservation
//! that is never sent goes back with [`Credits::cancel`].
//!
//! A heartbeat is an explicit credit frame sent because the writer was idle
//! ([`Credits::poll_heartbeat_frame`]). It pays with a data credit, never the
//! reserved one, so it cannot take the credit a credit frame needs: for the
//! accounting it is a data frame whose buffer is released on arrival. A
//! peer that cannot send one is starved by us, which
//! [`Credits::peer_may_be_starved`] tells, so its silence is not a failure.
//!
//! The machine never reads a clock and never touches I/O.

use crate::frame::{FrameKind, Header};

/// The smallest window that can carry data: one credit reserved for credit
/// frames, and a threshold of two so that credit frames never ping-pong.
pub const MIN_WINDOW: u32 = 3;
/// The largest window: credit counts travel in a `u16`.
pub const MAX_WINDOW: u32 = u16::MAX as u32;
/// The smallest nonzero credit unit, in bytes.
pub const MIN_UNIT: u32 = 1024;

/// Credits a data frame of `len` payload bytes takes from a receiver whose
/// credit unit is `unit` bytes (0: one credit per frame). Saturates at
/// `u32::MAX`, which no window holds.
#[inline]
pub fn cost(len: u64, unit: u32) -> u32 {
    // Every message pays this a few times on each side: a unit that is a
    // power of two (as this crate's own, 4 KiB) divides by a shift, not by
    // a 64-bit division of tens of cycles.
    let units = match unit {
        0 => return 1,
        u if u.is_power_of_two() => len >> u.trailing_zeros(),
        u => len / u64::from(u),
    };
    u32::try_from(1 + units).unwrap_or(u32::MAX)
}

/// The smallest window that lets a receiver with credit unit `unit` take
/// frames of up to `max_payload` bytes without ever stalling its sender:
/// the largest frame's credits must be at most half the window. A sender
/// short of a frame's credits then has at least half the window
/// outstanding, which, once delivered and released, is enough owed for a
/// credit frame (see [`Credits::wants_credit_frame`]).
pub fn min_window(max_payload: u64, unit: u32) -> u32 {
    cost(max_payload, unit).saturating_mul(2).max(MIN_WINDOW)
}

/// No credit for a data frame is available: the peer has no free receive
/// buffer for it. Try again once credits arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("blocked: no credit (the peer has no free receive buffer)")]
pub struct Blocked;

/// Credits taken by [`Credits::reserve`] (one) or [`Credits::reserve_for`]
/// (a frame's cost). Hand it to [`Credits::commit`] when the frame is
/// written, or to [`Credits::cancel`] if it never will be.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a reservation holds a credit; commit or cancel it"]
pub struct Reservation(u32);

/// What goes into the header of a frame about to be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// The frame's sequence number.
    pub seq: u32,
    /// Credits returned to the peer with this frame.
    pub credits: u16,
}

impl Stamp {
    /// The header for a frame of `kind` and `len` bytes with this stamp.
    pub fn header(self, kind: FrameKind, len: u64) -> Header {
        Header::new(kind, self.credits, self.seq, len)
    }
}

/// The peer broke the credit protocol. The connection must be closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CreditError {
    /// A window outside `MIN_WINDOW..=MAX_WINDOW`.
    #[error("credit window {0} out of range {MIN_WINDOW}..={MAX_WINDOW}")]
    BadWindow(u32),
    /// A credit unit neither 0 nor at least [`MIN_UNIT`].
    #[error("credit unit {0} must be 0 (one credit per frame) or at least {MIN_UNIT} bytes")]
    BadUnit(u32),
    /// The peer sent a frame while it had no credit.
    #[error("peer overran its credit window of {window} credits")]
    Overrun {
        /// Our window.
        window: u32,
    },
    /// The peer returned more credits than were ever taken.
    #[error("peer returned {returned} credits but only {outstanding} were outstanding")]
    Duplicated {
        /// Credits in the frame.
        returned: u16,
        /// Credits we had taken and not yet got back.
        outstanding: u32,
    },
    /// A frame arrived out of sequence: lost, duplicated or reordered.
    #[error("frame out of sequence: expected {expected}, got {got}")]
    Sequence {
        /// The sequence number expected.
        expected: u32,
        /// The sequence number received.
        got: u32,
    },
    /// The application released more buffers than were delivered.
    #[error("released more receive buffers than were delivered")]
    ReleaseUnderflow,
}

/// Counters, for stats and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CreditStats {
    /// Data frames sent.
    pub data_sent: u64,
    /// Credit frames sent (heartbeats included).
    pub credit_frames_sent: u64,
    /// Heartbeats sent: credit frames sent only because the writer was idle.
    pub heartbeats_sent: u64,
    /// Times [`Credits::reserve`] reported [`Blocked`].
    pub blocked: u64,
    /// Data frames received.
    pub data_received: u64,
}

/// The credit state of one connection, both directions.
#[derive(Debug, Clone)]
pub struct Credits {
    // Send direction: the peer's receive buffers.
    peer_window: u32,
    peer_unit: u32,
    avail: u32,
    next_tx_seq: u32,
    // Receive direction: our receive buffers.
    window: u32,
    unit: u32,
    held: u32,
    owed: u32,
    threshold: u32,
    /// A control frame (the peer's goodbye) arrived: return its credit even
    /// below the threshold, since the peer may have spent its last credit on it.
    forced: bool,
    next_rx_seq: u32,
    stats: CreditStats,
}

impl Credits {
    /// A connection whose side has posted `local_window` receive buffers and
    /// whose peer announced `peer_window` in the handshake: one credit per
    /// frame both ways.
    pub fn new(local_window: u32, peer_window: u32) -> Result<Self, CreditError> {
        Self::weighted((local_window, 0), (peer_window, 0))
    }

    /// A connection with weighted credits (see the module docs): `local`
    /// is this side's window and credit unit, `peer` the peer's, as the
    /// handshake announced them.
    pub fn weighted(local: (u32, u32), peer: (u32, u32)) -> Result<Self, CreditError> {
        let ((local_window, unit), (peer_window, peer_unit)) = (local, peer);
        for w in [local_window, peer_window] {
            if !(MIN_WINDOW..=MAX_WINDOW).contains(&w) {
                return Err(CreditError::BadWindow(w));
            }
        }
        for u in [unit, peer_unit] {
            if u != 0 && u < MIN_UNIT {
                return Err(CreditError::BadUnit(u));
            }
        }
        Ok(Self {
            peer_window,
            peer_unit,
            avail: peer_window,
            next_tx_seq: 0,
            window: local_window,
            unit,
            held: 0,
            owed: 0,
            threshold: local_window.div_ceil(2).max(2),
            forced: false,
            next_rx_seq: 0,
            stats: CreditStats::default(),
        })
    }

    /// Take a credit for one data frame of at most one credit unit (an
    /// empty one, say), keeping the last one for credit frames.
    pub fn reserve(&mut self) -> Result<Reservation, Blocked> {
        self.reserve_for(0)
    }

    /// Take the credits of a data frame of `len` payload bytes (one, unless
    /// the peer weighs them), keeping the last one for credit frames.
    #[inline]
    pub fn reserve_for(&mut self, len: u64) -> Result<Reservation, Blocked> {
        let n = cost(len, self.peer_unit);
        if self.avail > n {
            self.avail -= n;
            Ok(Reservation(n))
        } else {
            self.stats.blocked += 1;
            Err(Blocked)
        }
    }

    /// Whether a data frame of `len` bytes would be [`Blocked`] now.
    pub fn is_blocked_for(&self, len: u64) -> bool {
        self.avail <= cost(len, self.peer_unit)
    }

    /// Give back a reservation whose frame will never be sent.
    pub fn cancel(&mut self, r: Reservation) {
        let Reservation(n) = r;
        self.avail += n;
    }

    /// Stamp a reserved data frame as it is written: its sequence number and
    /// every credit owed to the peer.
    pub fn commit(&mut self, r: Reservation) -> Stamp {
        let Reservation(_) = r;
        self.stats.data_sent += 1;
        self.stamp()
    }

    /// Stamp the frame of reservation `r` without returning credits on it:
    /// for a frame that has no room for them, such as an RDMA WRITE with
    /// immediate, whose 32-bit immediate is the application's. Owed credits
    /// stay owed for a later frame.
    pub fn commit_bare(&mut self, r: Reservation) -> Stamp {
        let Reservation(_) = r;
        self.stats.data_sent += 1;
        let seq = self.next_tx_seq;
        self.next_tx_seq = seq.wrapping_add(1);
        Stamp { seq, credits: 0 }
    }

    /// The sequence number the next received frame must carry: what a
    /// frame without a header (an RDMA WRITE with immediate) is taken to
    /// carry.
    pub fn next_rx_seq(&self) -> u32 {
        self.next_rx_seq
    }

    /// Whether an explicit credit frame should be sent now: half the window
    /// (at least two buffers) is owed, or the peer said goodbye, and a credit
    /// is available for it.
    pub fn wants_credit_frame(&self) -> bool {
        (self.owed >= self.threshold || (self.forced && self.owed > 0)) && self.avail >= 1
    }

    /// Take the credit for, and stamp, an explicit credit frame if one is
    /// due. Call it when no data frame is about to carry the credits.
    pub fn poll_credit_frame(&mut self) -> Option<Stamp> {
        if !self.wants_credit_frame() {
            return None;
        }
        self.avail -= 1;
        self.stats.credit_frames_sent += 1;
        Some(self.stamp())
    }

    /// Take a credit for a control frame (the goodbye), which may use the
    /// reserved credit. `None` until a credit is available.
    pub fn poll_control_frame(&mut self) -> Option<Stamp> {
        if self.avail == 0 {
            return None;
        }
        self.avail -= 1;
        Some(self.stamp())
    }

    /// Take a data credit for, and stamp, a heartbeat: an explicit credit
    /// frame (returning whatever is owed) that a writer idle for a heartbeat
    /// interval sends. `None` while a data frame would be [`Blocked`]: the
    /// reserved credit stays for credit frames.
    pub fn poll_heartbeat_frame(&mut self) -> Option<Stamp> {
        if self.avail < 2 {
            return None;
        }
        self.avail -= 1;
        self.stats.credit_frames_sent += 1;
        self.stats.heartbeats_sent += 1;
        Some(self.stamp())
    }

    /// Whether the peer may lack the two credits a heartbeat takes because
    /// of us: fewer than two of our buffers are free for it (the rest are
    /// held by our application or owed back). Its silence then proves
    /// nothing. Exact when nothing is in flight either way; with frames or
    /// credits in flight the peer has at most this much, and those arrive.
    pub fn peer_may_be_starved(&self) -> bool {
        self.window.saturating_sub(self.held + self.owed) < 2
    }

    fn stamp(&mut self) -> Stamp {
        let credits = self.owed.min(u32::from(u16::MAX));
        self.owed -= credits;
        self.forced = false;
        let seq = self.next_tx_seq;
        self.next_tx_seq = seq.wrapping_add(1);
        Stamp { seq, credits: credits as u16 }
    }

    /// Account for a received frame: check its sequence number and window,
    /// and take the credits it returns. A data or rendezvous frame is now
    /// held by the application until [`Credits::release`]; the buffer of a
    /// credit or control frame is reposted at once.
    pub fn on_receive(&mut self, h: &Header) -> Result<(), CreditError> {
        if h.seq != self.next_rx_seq {
            return Err(CreditError::Sequence { expected: self.next_rx_seq, got: h.seq });
        }
        let n = if h.kind.holds_buffer() { self.cost_of(h.len) } else { 1 };
        if u64::from(self.held) + u64::from(self.owed) + u64::from(n) > u64::from(self.window) {
            return Err(CreditError::Overrun { window: self.window });
        }
        let outstanding = self.peer_window - self.avail;
        if u32::from(h.credits) > outstanding {
            return Err(CreditError::Duplicated { returned: h.credits, outstanding });
        }
        self.next_rx_seq = self.next_rx_seq.wrapping_add(1);
        self.avail += u32::from(h.credits);
        if h.kind.holds_buffer() {
            self.held += n;
            self.stats.data_received += 1;
        } else {
            self.owed += 1;
            self.forced |= h.kind == FrameKind::Control;
        }
        Ok(())
    }

    /// The application released (or the backend reposted) one received data
    /// buffer of one credit. Returns whether a credit frame is now due.
    pub fn release(&mut self) -> Result<bool, CreditError> {
        self.release_many(1)
    }

    /// Credits a received data frame of `len` bytes took (and gives back
    /// when released): [`cost`] at this side's unit.
    #[inline]
    pub fn cost_of(&self, len: u64) -> u32 {
        cost(len, self.unit)
    }

    /// The application released received data frames worth `n` credits
    /// at once (each frame's [`Credits::cost_of`], summed; all or none).
    /// Returns whether a credit frame is now due.
    pub fn release_many(&mut self, n: u32) -> Result<bool, CreditError> {
        if self.held < n {
            return Err(CreditError::ReleaseUnderflow);
        }
        self.held -= n;
        self.owed += n;
        Ok(self.wants_credit_frame())
    }

    /// Credits available for data frames (the reserved one excluded).
    pub fn available(&self) -> u32 {
        self.avail.saturating_sub(1)
    }

    /// Whether a data frame of one credit would be [`Blocked`] now.
    pub fn is_blocked(&self) -> bool {
        self.is_blocked_for(0)
    }

    /// Credits of frames sent that the peer has not yet returned.
    pub fn outstanding(&self) -> u32 {
        self.peer_window - self.avail
    }

    /// Credits of received data frames the application still holds.
    pub fn held(&self) -> u32 {
        self.held
    }

    /// Reposted buffers not yet reported to the peer.
    pub fn owed(&self) -> u32 {
        self.owed
    }

    /// Our receive window.
    pub fn window(&self) -> u32 {
        self.window
    }

    /// Our credit unit (0: one credit per frame).
    pub fn unit(&self) -> u32 {
        self.unit
    }

    /// The peer's credit unit (0: one credit per frame).
    pub fn peer_unit(&self) -> u32 {
        self.peer_unit
    }

    /// The peer's receive window.
    pub fn peer_window(&self) -> u32 {
        self.peer_window
    }

    /// Counters.
    pub fn stats(&self) -> CreditStats {
        self.stats
    }
}

#[cfg(test)]
mod tests;
