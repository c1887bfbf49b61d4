//! The send path of an RC connection: the send queue as a [`Wire`], through
//! which the writer thread, or a sending thread itself, turns the link's
//! batches into chained work requests — two-SGE sends (header slot, then
//! the pool buffer), inline when small, rendezvous requests for payloads
//! larger than the peer's receive buffers, RDMA WRITEs with immediate for
//! tagged frames — with selective signalling, and the ring of sends in
//! flight that holds each payload until its completion.

use std::ptr;
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use rdma_sys::{ibv_send_flags, ibv_send_wr, ibv_sge, ibv_wr_opcode};
use zerocast_core::{ConnError, FrameKind, Header, HEADER_LEN};
use zerocast_link::{Driver, Frame, Wire, WireCtx};
use zerocast_mem::Buf;

use super::{lock, Io};
use crate::rc::rendezvous::{Descriptor, DESC_LEN};
use crate::rc::RcError;

/// Sends in flight, as a ring: send number `seq` (its `wr_id`) lives in
/// slot `seq % len` with its payload, from its post until a completion
/// for it or a later send is polled. Only every [`SIGNAL_EVERY`]th send,
/// and the last of each batch, is signalled: an RC send queue completes in
/// order, so one completion accounts exactly for every send before it.
#[derive(Debug)]
pub(super) struct SendTable {
    pub(super) slots: Vec<Option<Buf>>,
    /// Oldest send not yet known complete.
    pub(super) head: u64,
    /// Next send number.
    pub(super) tail: u64,
    /// Threads waiting on `Io::send_cv` for sends to complete: completions
    /// notify only when there are some (a notify is a system call).
    pub(super) waiters: u32,
}

impl SendTable {
    pub(super) fn outstanding(&self) -> usize {
        (self.tail - self.head) as usize
    }

    fn slot(&self, seq: u64) -> usize {
        (seq % self.slots.len() as u64) as usize
    }

    /// Sends up to and including `seq` completed: their payloads go back to
    /// the pool (a lock-free push, fine under this lock).
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
}

/// One signalled send per this many (plus the last of every batch).
const SIGNAL_EVERY: u64 = 16;

/// The send queue as a [`Wire`]: frames are posted by the writer thread,
/// or by a sending thread itself (see [`zerocast_link::Wire`]).
pub(super) struct RcWire {
    io: Arc<Io>,
    scratch: Scratch,
}

/// Work requests and scatter lists under construction, kept between posts.
#[derive(Default)]
struct Scratch {
    wrs: Vec<ibv_send_wr>,
    sges: Vec<[ibv_sge; 2]>,
    slots: Vec<u64>,
    inline: Vec<bool>,
}

// SAFETY: the raw pointers in `wrs` point into `sges` and registered
// memory only during one `post_batch`, which rewrites them before posting;
// between posts they are stale and never read.
unsafe impl Send for Scratch {}

impl Wire for RcWire {
    fn write(&mut self, frames: &mut [Frame], ctx: &WireCtx<'_>) -> Result<(), ConnError> {
        let io = &*self.io;
        let mut rest = frames;
        // Post in parts, each with no more rendezvous than may be started.
        while !rest.is_empty() {
            let large = |f: &Frame| by_rendezvous(io, f);
            let mut free = usize::MAX;
            if rest.iter().any(large) {
                match io.rendezvous.wait_free(|| io.is_closing() || ctx.check_heartbeat().is_err()) {
                    Some(n) => free = n,
                    // Closing: the frames go back to the pool.
                    None => return Ok(()),
                }
            }
            let mut n = 0;
            for f in rest.iter() {
                if large(f) {
                    if free == 0 {
                        break;
                    }
                    free -= 1;
                }
                n += 1;
            }
            let (part, tail) = std::mem::take(&mut rest).split_at_mut(n);
            post_batch(io, part, &mut self.scratch).map_err(ConnError::transport)?;
            rest = tail;
        }
        Ok(())
    }
}

/// The writer thread: posts what sending threads queued, then waits for
/// the last sends to complete and closes the QP.
pub(super) fn sender(io: &Arc<Io>, driver: &Driver) {
    driver.run_writer(Box::new(RcWire { io: io.clone(), scratch: Scratch::default() }));
    // Let our last sends (the goodbye) be acknowledged, and the peer read
    // our rendezvous payloads, before disconnecting. A peer that fails
    // meanwhile closes the connection, which ends the wait.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut t = lock(&io.send);
    while (t.outstanding() > 0 || io.rendezvous.has_outbound())
        && !io.is_closing()
        && Instant::now() < deadline
    {
        t = wait_send(io, t);
    }
    drop(t);
    // Done: the goodbye completed, or the peer, having both goodbyes, went
    // away before acknowledging it (a failure would have failed the link).
    driver.writer_done();
    io.close();
}

/// Wait (at most 20 ms) for a send completion, counted in
/// [`SendTable::waiters`].
fn wait_send<'a>(io: &'a Io, mut t: MutexGuard<'a, SendTable>) -> MutexGuard<'a, SendTable> {
    t.waiters += 1;
    let mut t = io
        .send_cv
        .wait_timeout(t, Duration::from_millis(20))
        .map(|(g, _)| g)
        .unwrap_or_else(|p| p.into_inner().0);
    t.waiters -= 1;
    t
}

/// Post `batch` as one chain, taking each payload into the send table (or
/// the rendezvous queue) until the device is done with it.
fn post_batch(io: &Io, batch: &mut [Frame], scratch: &mut Scratch) -> Result<(), RcError> {
    let Scratch { wrs, sges, slots, inline } = scratch;
    wrs.clear();
    sges.clear();
    slots.clear();
    let n = batch.len();
    // Take a slot per frame first, waiting while the send queue is full.
    {
        let mut t = lock(&io.send);
        for _ in 0..n {
            loop {
                if t.outstanding() < t.slots.len() {
                    slots.push(t.tail);
                    t.tail += 1;
                    break;
                }
                if io.is_closing() {
                    // Nothing was posted: give the send numbers back.
                    t.tail -= slots.len() as u64;
                    slots.clear();
                    return Ok(());
                }
                t = wait_send(io, t);
            }
        }
    }
    let max_inline = io.qp.max_inline() as usize;
    inline.clear();
    let ring = lock(&io.send).slots.len() as u64;
    for (i, frame) in batch.iter().enumerate() {
        let seq = slots[i];
        let slot = (seq % ring) as usize;
        let len = frame.payload.as_ref().map_or(0, |b| b.len());
        let large = by_rendezvous(io, frame);
        if frame.tag != 0 {
            match io.imm_ops.take(frame.tag) {
                Some(op) => {
                    inline.push(len <= max_inline);
                    wrs.push(write_imm_wr(seq, frame, op, sges, inline[i]));
                    continue;
                }
                // Unreachable: every tag is taken once, here. Sent as a
                // plain message rather than lost.
                None => tracing::error!(tag = frame.tag, "write with immediate without its operation"),
            }
        }
        inline.push(HEADER_LEN + if large { DESC_LEN } else { len } <= max_inline);
        let header = match &frame.payload {
            Some(b) if large => {
                io.send_desc.write(slot, &Descriptor::of(b).encode());
                let h = &frame.header;
                Header::new(FrameKind::Rendezvous, h.credits, h.seq, DESC_LEN as u64)
            }
            _ => frame.header,
        };
        io.send_hdr.write(slot, &header.encode());
        let hdr =
            ibv_sge { addr: io.send_hdr.addr(slot), length: HEADER_LEN as u32, lkey: io.send_hdr.lkey() };
        let (payload, num) = match &frame.payload {
            _ if large => (
                ibv_sge { addr: io.send_desc.addr(slot), length: DESC_LEN as u32, lkey: io.send_desc.lkey() },
                2,
            ),
            Some(b) if !b.is_empty() => {
                (ibv_sge { addr: b.addr(), length: b.len() as u32, lkey: b.keys().lkey }, 2)
            }
            _ => (ibv_sge { addr: 0, length: 0, lkey: 0 }, 1),
        };
        sges.push([hdr, payload]);
        // SAFETY: all-zero is a valid `ibv_send_wr` (null pointers, zero counts).
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = seq;
        wr.num_sge = num;
        wr.opcode = ibv_wr_opcode::IBV_WR_SEND;
        wr.send_flags = send_flags(seq, i + 1 == n, inline[i]);
        wrs.push(wr);
    }
    for i in 0..n {
        wrs[i].sg_list = sges[i].as_mut_ptr();
        wrs[i].next = if i + 1 < n { &mut wrs[i + 1] as *mut ibv_send_wr } else { ptr::null_mut() };
    }
    // Buffers move into the in-flight table before the post, so a fast
    // completion always finds them; a rendezvous payload waits for the
    // peer's finish instead, in post order.
    {
        let mut t = lock(&io.send);
        for (frame, &seq) in batch.iter_mut().zip(slots.iter()) {
            let large = by_rendezvous(io, frame);
            match frame.payload.take() {
                Some(b) if large => io.rendezvous.push_outbound(b),
                payload => {
                    let i = t.slot(seq);
                    t.slots[i] = payload;
                }
            }
        }
    }
    if n == 0 {
        return Ok(());
    }
    // SAFETY: the chain's SGEs point into the registered header slab and
    // registered pool buffers, both kept (slab in `io`, buffers in the
    // send table) until each completion is polled.
    if let Err((posted, e)) = unsafe { io.qp.post_send(wrs) } {
        // The WRs from `posted` on never reached the queue: take their
        // send numbers and buffers back. The posted ones complete (or
        // flush once the connection fails and its QP enters the error state).
        let mut t = lock(&io.send);
        for &seq in &slots[posted..] {
            let i = t.slot(seq);
            drop(t.slots[i].take());
        }
        t.tail -= (n - posted) as u64;
        return Err(RcError::verbs("ibv_post_send", e));
    }
    // Inline data was copied by the post: those buffers go back now.
    if inline.iter().any(|&b| b) {
        let mut t = lock(&io.send);
        for (&seq, _) in slots.iter().zip(inline.iter()).filter(|(_, &b)| b) {
            let i = t.slot(seq);
            drop(t.slots[i].take());
        }
    }
    Ok(())
}

/// Whether `frame` goes as a rendezvous request: a plain data frame larger
/// than the peer's receive buffers.
fn by_rendezvous(io: &Io, frame: &Frame) -> bool {
    frame.tag == 0 && frame.payload.as_ref().is_some_and(|b| io.rendezvous.is_large(b.len()))
}

/// Selective signalling: every [`SIGNAL_EVERY`]th send and the last of a
/// batch are signalled.
fn send_flags(seq: u64, last: bool, inline: bool) -> u32 {
    let mut flags = 0;
    if last || seq % SIGNAL_EVERY == SIGNAL_EVERY - 1 {
        flags |= ibv_send_flags::IBV_SEND_SIGNALED.0;
    }
    if inline {
        flags |= ibv_send_flags::IBV_SEND_INLINE.0;
    }
    flags
}

/// The work request of a tagged frame: an RDMA WRITE with immediate of its
/// payload, with no zerocast header. Its SGE goes into `sges`.
fn write_imm_wr(
    seq: u64,
    frame: &Frame,
    op: crate::rc::write_imm::ImmOp,
    sges: &mut Vec<[ibv_sge; 2]>,
    inline: bool,
) -> ibv_send_wr {
    let none = ibv_sge { addr: 0, length: 0, lkey: 0 };
    let payload = match &frame.payload {
        Some(b) if !b.is_empty() => ibv_sge { addr: b.addr(), length: b.len() as u32, lkey: b.keys().lkey },
        _ => none,
    };
    sges.push([payload, none]);
    // SAFETY: all-zero is a valid `ibv_send_wr` (null pointers, zero counts).
    let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
    wr.wr_id = seq;
    wr.num_sge = i32::from(payload.length > 0);
    wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.imm_data_invalidated_rkey_union.imm_data = op.imm.to_be();
    wr.wr.rdma.remote_addr = op.remote.addr;
    wr.wr.rdma.rkey = op.remote.rkey;
    // Signalled like a send: it sits in the send table's ring.
    wr.send_flags = send_flags(seq, false, inline);
    wr
}
