//! Small data frames as bytes: a sender that cannot write its frame itself
//! stamps it and copies header and payload into the connection's staging
//! area, instead of queueing its buffer for the writer.
//!
//! A stream of small messages then costs, per message, one state lock, a
//! credit reservation, a header and a copy: no slot in the writer's queue,
//! no [`crate::Frame`], and the pool buffer goes back on the sender's own
//! thread at once. The writer takes the whole area under the state lock
//! and writes it ahead of whatever it stamps next, with one system call.
//!
//! Only a wire that asks for it ([`crate::Wire::stages_up_to`]: a stream
//! socket, whose wire format is header then payload) gets staged frames,
//! and only payloads up to the size it names.
//!
//! Order: a frame is staged only while no data frame waits in the queue,
//! and a sending thread writes its frame itself only while nothing is
//! staged. Every writer takes the staging area before it stamps anything
//! else (all under the state lock), so frames reach the wire in the order
//! they were stamped.
//!
//! Memory: two areas of [`CAP`] bytes per connection, both made when its
//! first frame is staged and never grown: the one senders fill, and the
//! one the writer swapped out last. A frame that does not fit is queued as usual
//! (and frames after it queue behind it until the queue drains), and a
//! sender that finds eight rings' worth staged writes them itself when the
//! wire is free. So staging allocates nothing per message.

use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

use zerocast_core::{FrameKind, Reservation, HEADER_LEN};
use zerocast_mem::Buf;

use crate::shared::{Shared, State};

/// A sender that staged this many frames (or [`FLUSH_BYTES`]) writes the
/// area itself when the wire is free. Eight rings' worth: a stream of small
/// frames then goes out in writes of about 32 KiB (the bytes bound it
/// first at 64-byte payloads, at 455 frames), where the system call and
/// the loopback's or the NIC's per-segment work are paid once for many
/// messages, and the peer's reads take as many at a time.
pub(crate) const FLUSH_FRAMES: u32 = 8 * crate::queue::FAST as u32;

/// Bytes staged past which the sender writes them itself.
const FLUSH_BYTES: usize = CAP / 2;

/// A staging area's fixed size.
const CAP: usize = 64 * 1024;

/// The stamped small frames waiting for the writer, in wire order.
#[derive(Debug, Default)]
pub(crate) struct Staged {
    bytes: Vec<u8>,
    frames: u32,
    /// The second area, made with the first: it replaces a writer's buffer
    /// that comes back in exchange without an area's capacity (the first
    /// time a writer takes the area), so that no area is ever made after
    /// the first frame.
    spare: Vec<u8>,
}

impl Staged {
    /// Nothing is staged.
    pub(crate) fn is_empty(&self) -> bool {
        self.frames == 0
    }
}

/// What a sender that staged its frame does next.
pub(crate) enum Next {
    /// The writer already knows: nothing.
    Nothing,
    /// The area was empty: wake the writer.
    Kick,
    /// Four rings' worth is staged: write it here if the wire is free, else
    /// wake the writer.
    Write,
}

impl Shared {
    /// Whether a data frame of `len` bytes may be staged now: the wire
    /// takes it as bytes, there is room, and nothing is queued ahead of it
    /// (see the module docs). If not, the caller queues it.
    #[inline]
    pub(crate) fn may_stage(&self, st: &State, len: usize) -> bool {
        len <= self.stage_max.load(Ordering::Relaxed)
            && st.queued_data == 0
            && !st.goodbye_sent
            && st.failed.is_none()
            && st.staged.bytes.len() + HEADER_LEN + len <= CAP
    }

    /// Stage `buf`'s frame (after [`Shared::may_stage`], under the same
    /// lock); the buffer goes back to the pool here.
    #[inline]
    pub(crate) fn stage(&self, mut st: MutexGuard<'_, State>, buf: Buf, r: Reservation) -> Next {
        debug_assert!(self.may_stage(&st, buf.len()));
        if self.heartbeat.is_some() && st.credits.peer_may_be_starved() {
            // The credits this frame returns may end the peer's
            // starvation: its silence counts from now (as for a batch).
            st.last_rx = st.last_rx.max(std::time::Instant::now());
        }
        let first = st.staged.is_empty();
        let stamp = st.credits.commit(r);
        let header = stamp.header(FrameKind::Data, buf.len() as u64).encode();
        let staged = &mut st.staged;
        if staged.bytes.capacity() < CAP {
            // The first frame staged here: both areas are made now.
            staged.bytes.reserve_exact(CAP);
            staged.spare.reserve_exact(CAP);
        }
        staged.bytes.extend_from_slice(&header);
        staged.bytes.extend_from_slice(&buf);
        staged.frames += 1;
        let full = staged.frames >= FLUSH_FRAMES || staged.bytes.len() >= FLUSH_BYTES;
        if first {
            // Raised under the lock, before the kick: a writer that clears
            // it does so under the lock as it takes the area.
            self.staged_hint.store(true, Ordering::SeqCst);
        }
        drop(st);
        drop(buf);
        if full {
            Next::Write
        } else if first {
            Next::Kick
        } else {
            Next::Nothing
        }
    }

    /// Something may be staged (a hint, read without the lock).
    #[inline]
    pub(crate) fn maybe_staged(&self) -> bool {
        self.staged_hint.load(Ordering::SeqCst)
    }

    /// Nothing waits for the writer, queued or staged (read without the
    /// lock).
    #[inline]
    pub(crate) fn nothing_to_write(&self) -> bool {
        self.tx.is_empty() && !self.maybe_staged()
    }
}

/// For the writer, with the state locked, before it stamps anything else:
/// move the staged frames into `out` (empty; its capacity goes back to the
/// staging area in exchange).
pub(crate) fn take(shared: &Shared, st: &mut State, out: &mut Vec<u8>) {
    if st.staged.is_empty() {
        return;
    }
    debug_assert!(out.is_empty(), "the writer's bytes were not written");
    std::mem::swap(&mut st.staged.bytes, out);
    if st.staged.bytes.capacity() < CAP {
        // The writer's first exchange: it had no area of its own yet.
        std::mem::swap(&mut st.staged.bytes, &mut st.staged.spare);
    }
    st.staged.frames = 0;
    shared.staged_hint.store(false, Ordering::SeqCst);
}
