//! The send path of an RC connection: the send queue as a [`Wire`], through
//! which the engine task, or a sending thread itself, turns the link's
//! batches into chained work requests — data frames as sends with
//! immediate of the payload alone (the header in the immediate), other
//! frames as sends of a header slot and their payload, inline when small,
//! rendezvous requests for payloads larger than the peer's receive
//! buffers, RDMA WRITEs with immediate for tagged frames — with selective
//! signalling, and the ring of sends in flight that holds each payload
//! until its completion. Nothing here waits: what the ring has no room
//! for waits in the wire's backlog.

use std::collections::VecDeque;
use std::ptr;
use std::sync::Arc;

use rdma_sys::{ibv_send_flags, ibv_send_wr, ibv_sge, ibv_wr_opcode};
use zerocast_core::{ConnError, FrameKind, Header, HEADER_LEN};
use zerocast_link::{Frame, Wire, WireCtx};
use zerocast_mem::Buf;

use super::completion::short_immediate;
use super::{lock, Io};
use crate::mr::{Access, MemoryRegion};
use crate::rc::rendezvous::{self, Descriptor, Lent, DESC_LEN, MAX_PENDING};
use crate::rc::RcError;
use crate::send_ring::{Reserved, SendRing};

/// Sends in flight: the ring (see [`SendRing`]) holds each payload the
/// device still reads, and signals one send per quarter of the send depth
/// (rounded down to a power of two, at most 32) plus the last of every
/// batch that needs a completion (see [`post_batch`]).
#[derive(Debug)]
pub(super) struct SendTable {
    pub(super) ring: SendRing<Buf>,
}

impl SendTable {
    pub(super) fn new(depth: usize) -> Self {
        Self { ring: SendRing::new(depth) }
    }

    pub(super) fn outstanding(&self) -> usize {
        self.ring.outstanding()
    }
}

/// The send queue as a [`Wire`]: frames are posted by the engine task, or
/// by a sending thread itself (see [`zerocast_link::Wire`]). It never
/// waits: what the send queue, or the rendezvous slots, have no room for
/// stays in its backlog, in order, and later frames queue behind it. The
/// completion that frees room wakes the engine task (see
/// [`Io::wait_for_completion`]), which flushes it. Credits bound the
/// backlog.
pub(super) struct RcWire {
    io: Arc<Io>,
    scratch: Scratch,
    /// The most frames posted as one chain ([`SendRing::max_chain`]).
    max_chain: usize,
    backlog: VecDeque<Frame>,
    /// Frames moved out of the backlog to be posted as one chain.
    part: Vec<Frame>,
}

impl RcWire {
    pub(super) fn new(io: Arc<Io>, peer_window: usize) -> Self {
        let max_chain = lock(&io.send).ring.max_chain();
        Self {
            io,
            scratch: Scratch::for_chains_of(max_chain),
            max_chain,
            // Data frames are bounded by the peer's window; the rest
            // (credits, goodbye, heartbeats) are few.
            backlog: VecDeque::with_capacity(peer_window + 8),
            part: Vec::with_capacity(max_chain),
        }
    }

    /// Post from the front of `frames` as much as the send queue and the
    /// rendezvous slots take now; how many frames were posted. When they
    /// take none, the engine task is to be woken at the next completion.
    fn post_some(&mut self, frames: &mut [Frame]) -> Result<usize, ConnError> {
        let io = &*self.io;
        let mut done = 0;
        let mut flagged = false;
        while done < frames.len() {
            let rest = &mut frames[done..];
            let room = lock(&io.send).ring.room();
            let mut free = io.rendezvous.free();
            let mut n = 0;
            for f in rest.iter().take(self.max_chain.min(room)) {
                if by_rendezvous(io, f) {
                    if free == 0 {
                        break;
                    }
                    free -= 1;
                }
                n += 1;
            }
            if n == 0 {
                if flagged {
                    break;
                }
                // Woken by the completion of a send or of a rendezvous
                // finish; flagged before the room is looked at again, so
                // one that came in between is not missed.
                io.wait_for_completion();
                flagged = true;
                continue;
            }
            flagged = false;
            post_batch(io, &mut rest[..n], &mut self.scratch).map_err(ConnError::transport)?;
            done += n;
        }
        Ok(done)
    }

    /// Keep `frames`, which were not posted, behind the backlog.
    fn defer(&mut self, frames: &mut [Frame]) {
        if frames.is_empty() {
            return;
        }
        for f in frames {
            self.backlog.push_back(Frame { header: f.header, payload: f.payload.take(), tag: f.tag });
        }
        self.io.set_backlogged(true);
    }
}

/// Work requests and scatter lists under construction, kept between posts.
/// Sized once for the longest chain: a post never grows them, so the
/// writer allocates nothing per message, whatever batch sizes it meets.
struct Scratch {
    wrs: Vec<ibv_send_wr>,
    sges: Vec<[ibv_sge; 2]>,
    reserved: Vec<Reserved>,
    inline: Vec<bool>,
    /// The grants of the batch's rendezvous payloads, in frame order (at
    /// most `MAX_PENDING` per batch).
    grants: VecDeque<MemoryRegion>,
}

// SAFETY: the raw pointers in `wrs` point into `sges` and registered
// memory only during one `post_batch`, which rewrites them before posting;
// between posts they are stale and never read.
unsafe impl Send for Scratch {}

impl Scratch {
    fn for_chains_of(max_chain: usize) -> Self {
        Self {
            wrs: Vec::with_capacity(max_chain),
            sges: Vec::with_capacity(max_chain),
            reserved: Vec::with_capacity(max_chain),
            inline: Vec::with_capacity(max_chain),
            grants: VecDeque::with_capacity(MAX_PENDING),
        }
    }
}

impl Wire for RcWire {
    fn write(&mut self, frames: &mut [Frame], _ctx: &WireCtx<'_>) -> Result<(), ConnError> {
        let io = &*self.io;
        if io.is_closing() {
            // Nothing is posted any more: the frames go back to the pool.
            return Ok(());
        }
        if !self.backlog.is_empty() {
            self.defer(frames);
            return Ok(());
        }
        if let [frame] = frames {
            if frame.tag == 0 && !by_rendezvous(io, frame) {
                if post_one(io, frame).map_err(ConnError::transport)? {
                    return Ok(());
                }
                self.defer(frames);
                return Ok(());
            }
        }
        let posted = self.post_some(frames)?;
        self.defer(&mut frames[posted..]);
        Ok(())
    }

    fn backlog(&self) -> bool {
        !self.backlog.is_empty()
    }

    fn flush(&mut self, _ctx: &WireCtx<'_>) -> Result<(), ConnError> {
        let res = self.flush_backlog();
        if self.backlog.is_empty() {
            self.io.set_backlogged(false);
        }
        res
    }
}

impl RcWire {
    /// Post what the send queue takes of the backlog, in order.
    fn flush_backlog(&mut self) -> Result<(), ConnError> {
        if self.io.is_closing() {
            self.backlog.clear();
            return Ok(());
        }
        while !self.backlog.is_empty() {
            let mut part = std::mem::take(&mut self.part);
            let n = self.backlog.len().min(self.max_chain);
            part.extend(self.backlog.drain(..n));
            let res = self.post_some(&mut part);
            // What was not posted goes back to the front, in order.
            let posted = *res.as_ref().unwrap_or(&part.len());
            for f in part.drain(posted..).rev() {
                self.backlog.push_front(f);
            }
            part.clear();
            self.part = part;
            if res? < n {
                break;
            }
        }
        Ok(())
    }
}

/// Post `batch` as one chain, taking each payload into the send ring (or
/// the rendezvous queue) until the device is done with it.
///
/// Signalling: the ring signals one send per quarter of its depth (see
/// [`SendRing::signal_every`]). The
/// last of the batch is signalled too when something waits for its
/// completion: a payload left in the ring (one not copied inline), or a
/// frame that is not data (a goodbye, which the writer waits on before it
/// disconnects, or a credit frame, which may follow it). A lone small
/// message, copied inline, goes unsignalled, as `ib_send_lat` sends: no
/// completion for the device to write or for a receiving thread to poll.
///
/// Grants not handed to the rendezvous queue (a batch not posted) are
/// revoked before this returns, so the link may recycle those payloads.
fn post_batch(io: &Io, batch: &mut [Frame], scratch: &mut Scratch) -> Result<(), RcError> {
    let result = post_chain(io, batch, scratch);
    scratch.grants.clear();
    result
}

fn post_chain(io: &Io, batch: &mut [Frame], scratch: &mut Scratch) -> Result<(), RcError> {
    let Scratch { wrs, sges, reserved, inline, grants } = scratch;
    wrs.clear();
    sges.clear();
    reserved.clear();
    inline.clear();
    grants.clear();
    let n = batch.len();
    if n == 0 {
        return Ok(());
    }
    let max_inline = io.qp.max_inline() as usize;
    let mut signal_last = false;
    for f in batch.iter() {
        let large = by_rendezvous(io, f);
        let inl = is_inline(f, large, max_inline);
        inline.push(inl);
        signal_last |= wants_signal(f, large, inl);
        // Each rendezvous payload gets a grant of its own bytes before
        // anything is reserved: a failed registration fails the connection
        // with nothing posted (and the grants so far revoked).
        if let Some(b) = f.payload.as_ref().filter(|_| large) {
            // SAFETY: every grant is dropped before its buffer: `Lent`
            // drops the grant first, and `post_batch` drops unposted
            // grants before its frames go back. Remote READ only: the
            // device never writes the payload.
            let grant = unsafe { rendezvous::grant(io, b, Access::RemoteRead, "a rendezvous payload") }?;
            grants.push_back(grant);
        }
    }
    // A slot per frame: `post_some` made sure there is room.
    {
        let mut t = lock(&io.send);
        for i in 0..n {
            let Some(r) = t.ring.reserve(signal_last && i + 1 == n) else {
                if let Some(first) = reserved.first() {
                    t.ring.unreserve_from(first.seq);
                }
                return Err(RcError::Config("a chain longer than the send queue's room".into()));
            };
            reserved.push(r);
        }
    }
    let mut large_seen = 0;
    for (i, frame) in batch.iter().enumerate() {
        let r = reserved[i];
        let large = by_rendezvous(io, frame);
        if frame.tag != 0 {
            match io.imm_ops.take(frame.tag) {
                Some(op) => {
                    wrs.push(write_imm_wr(&r, frame, op, sges, inline[i]));
                    continue;
                }
                // Unreachable: every tag is taken once, here. Sent as a
                // plain message rather than lost.
                None => tracing::error!(tag = frame.tag, "write with immediate without its operation"),
            }
        }
        let mut pair = [ibv_sge { addr: 0, length: 0, lkey: 0 }; 2];
        let wr = match &frame.payload {
            Some(b) if large => {
                // Grants are in frame order, one per rendezvous frame.
                let grant = &grants[large_seen];
                large_seen += 1;
                io.send_desc.write(r.slot, &Descriptor::of(b, grant).encode());
                let h = &frame.header;
                let header = Header::new(FrameKind::Rendezvous, h.credits, h.seq, DESC_LEN as u64);
                io.send_hdr.write(r.slot, &header.encode());
                pair = [
                    header_sge(io, r.slot),
                    ibv_sge {
                        addr: io.send_desc.addr(r.slot),
                        length: DESC_LEN as u32,
                        lkey: io.send_desc.lkey(),
                    },
                ];
                let mut wr = base_wr(&r, inline[i]);
                wr.num_sge = 2;
                wr.opcode = ibv_wr_opcode::IBV_WR_SEND;
                wr
            }
            _ => plain_wr(io, &r, frame, &mut pair, inline[i]),
        };
        sges.push(pair);
        wrs.push(wr);
    }
    for i in 0..n {
        wrs[i].sg_list = sges[i].as_mut_ptr();
        wrs[i].next = if i + 1 < n { &mut wrs[i + 1] as *mut ibv_send_wr } else { ptr::null_mut() };
    }
    // A rendezvous payload waits for the peer's finish, queued in post
    // order before the post, so that finish always finds it.
    for frame in batch.iter_mut().filter(|f| by_rendezvous(io, f)) {
        if let (Some(buf), Some(grant)) = (frame.payload.take(), grants.pop_front()) {
            io.rendezvous.push_outbound(Lent { grant, buf });
        }
    }
    // Posted under the ring's lock, so no completion of this chain is
    // polled before its payloads are in the ring; until then they stay in
    // `batch`, alive.
    let mut t = lock(&io.send);
    // SAFETY: the chain's SGEs point into the registered header and
    // descriptor slabs (kept in `io`) and registered pool buffers, kept in
    // `batch` during the call and in the send ring (or the rendezvous
    // queue) after it until each completion is polled; inline payloads
    // are copied by the call.
    let result = unsafe { io.qp.post_send(wrs) };
    let posted = match &result {
        Ok(()) => n,
        Err((posted, _)) => *posted,
    };
    for ((frame, r), &inl) in batch.iter_mut().zip(reserved.iter()).take(posted).zip(inline.iter()) {
        // Inline data was copied by the post: that payload goes back to
        // the pool when `batch` drops.
        let keep = if inl { None } else { frame.payload.take() };
        t.ring.posted(r, keep);
    }
    if let Err((_, e)) = result {
        // The WRs from `posted` on never reached the queue: give their
        // numbers back. The posted ones complete (or flush once the
        // connection fails and its QP enters the error state).
        t.ring.unreserve_from(reserved[posted].seq);
        return Err(RcError::verbs("ibv_post_send", e));
    }
    Ok(())
}

/// [`post_batch`] for one plain frame (not tagged, not by rendezvous), the
/// usual write of a sending thread on a quiet link: one work request, built
/// on the stack while the ring is locked once, and signalled on the same
/// terms. `false`: the send queue is full, nothing was posted (the engine
/// task is woken at the next completion).
fn post_one(io: &Io, frame: &mut Frame) -> Result<bool, RcError> {
    let inline = is_inline(frame, false, io.qp.max_inline() as usize);
    let signal = wants_signal(frame, false, inline);
    let mut t = lock(&io.send);
    let r = match t.ring.reserve(signal) {
        Some(r) => r,
        None => {
            drop(t);
            io.wait_for_completion();
            t = lock(&io.send);
            match t.ring.reserve(signal) {
                Some(r) => r,
                None => return Ok(false),
            }
        }
    };
    let mut sges = [ibv_sge { addr: 0, length: 0, lkey: 0 }; 2];
    let mut wr = plain_wr(io, &r, frame, &mut sges, inline);
    wr.sg_list = sges.as_mut_ptr();
    // SAFETY: the SGEs point into the registered header slab (kept in
    // `io`) and a registered pool buffer, kept in `frame` during the call
    // and in the send ring after it until its completion is polled (an
    // inline payload is copied by the call); `sges` outlives the call. The
    // ring stays locked from the post until the payload is in it.
    match unsafe { io.qp.post_send(std::slice::from_mut(&mut wr)) } {
        Ok(()) => {
            let keep = if inline { None } else { frame.payload.take() };
            t.ring.posted(&r, keep);
            Ok(true)
        }
        Err((_, e)) => {
            t.ring.unreserve(&r);
            Err(RcError::verbs("ibv_post_send", e))
        }
    }
}

/// The work request (its scatter list in `sges`, to be pointed at) of a
/// plain frame, neither tagged nor a rendezvous, in send slot `r`. A data
/// frame goes as a send with immediate of its payload alone, the credits it
/// returns and its sequence number's low 16 bits in the immediate: no
/// header bytes, so a message of a power-of-two size fills whole packets.
/// Any other frame goes as a send of its header, written into the slot,
/// and its payload (none, for credit frames and goodbyes). Inlined into
/// both posts: it is on the send path of every message.
#[inline(always)]
fn plain_wr(io: &Io, r: &Reserved, frame: &Frame, sges: &mut [ibv_sge; 2], inline: bool) -> ibv_send_wr {
    let payload = frame.payload.as_ref().filter(|b| !b.is_empty());
    let mut wr = base_wr(r, inline);
    if frame.header.kind == FrameKind::Data {
        if let Some(b) = payload {
            sges[0] = payload_sge(b, inline);
        }
        wr.num_sge = i32::from(payload.is_some());
        wr.opcode = ibv_wr_opcode::IBV_WR_SEND_WITH_IMM;
        let h = &frame.header;
        wr.imm_data_invalidated_rkey_union.imm_data = short_immediate(h.credits, h.seq).to_be();
    } else {
        io.send_hdr.write(r.slot, &frame.header.encode());
        sges[0] = header_sge(io, r.slot);
        if let Some(b) = payload {
            sges[1] = payload_sge(b, inline);
        }
        wr.num_sge = if payload.is_some() { 2 } else { 1 };
        wr.opcode = ibv_wr_opcode::IBV_WR_SEND;
    }
    wr
}

/// A work request for send slot `r`, numbered and flagged, with no opcode or
/// scatter list yet.
fn base_wr(r: &Reserved, inline: bool) -> ibv_send_wr {
    // SAFETY: all-zero is a valid `ibv_send_wr` (null pointers, zero counts).
    let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
    wr.wr_id = r.seq;
    wr.send_flags = send_flags(r, inline);
    wr
}

/// The scatter entry of send slot `slot`'s header.
fn header_sge(io: &Io, slot: usize) -> ibv_sge {
    ibv_sge { addr: io.send_hdr.addr(slot), length: HEADER_LEN as u32, lkey: io.send_hdr.lkey() }
}

/// The scatter entry of a payload sent from its pool buffer, whole. An
/// inline payload is copied by the post, which does not check its key
/// (`ibv_post_send(3)`), so its buffer's registration is not looked up.
fn payload_sge(b: &Buf, inline: bool) -> ibv_sge {
    let lkey = if inline { 0 } else { b.keys().lkey };
    ibv_sge { addr: b.addr(), length: b.len() as u32, lkey }
}

/// Whether `frame`, last in its post, must be signalled: its payload stays
/// in the ring until the device has read it (not inline, not a rendezvous
/// request (`large`), not empty), or it is a goodbye or credit frame, which
/// the writer waits for.
fn wants_signal(frame: &Frame, large: bool, inline: bool) -> bool {
    let held = !inline && !large && frame.payload.as_ref().is_some_and(|b| !b.is_empty());
    held || (frame.tag == 0 && frame.header.kind != FrameKind::Data)
}

/// Whether the device copies `frame` into the work request at post time
/// (`large`: it goes as a rendezvous request). A tagged frame (no header
/// on the wire) is counted with one all the same, so the fallback that
/// sends it as a plain message stays inline.
fn is_inline(frame: &Frame, large: bool, max_inline: usize) -> bool {
    let len = frame.payload.as_ref().map_or(0, |b| b.len());
    let bytes = if large {
        HEADER_LEN + DESC_LEN
    } else if frame.header.kind == FrameKind::Data {
        len
    } else {
        HEADER_LEN + len
    };
    bytes <= max_inline
}

/// Whether `frame` goes as a rendezvous request: a plain data frame larger
/// than the peer's receive buffers.
fn by_rendezvous(io: &Io, frame: &Frame) -> bool {
    frame.tag == 0 && frame.payload.as_ref().is_some_and(|b| io.rendezvous.is_large(b.len()))
}

/// The flags of reserved send `r`: signalled as the ring decided.
fn send_flags(r: &Reserved, inline: bool) -> u32 {
    let mut flags = 0;
    if r.signal {
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
    r: &Reserved,
    frame: &Frame,
    op: crate::rc::write_imm::ImmOp,
    sges: &mut Vec<[ibv_sge; 2]>,
    inline: bool,
) -> ibv_send_wr {
    let none = ibv_sge { addr: 0, length: 0, lkey: 0 };
    let payload = match &frame.payload {
        Some(b) if !b.is_empty() => payload_sge(b, inline),
        _ => none,
    };
    sges.push([payload, none]);
    // Signalled as the ring decided: it sits in the ring like a send.
    let mut wr = base_wr(r, inline);
    wr.num_sge = i32::from(payload.length > 0);
    wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.imm_data_invalidated_rkey_union.imm_data = op.imm.to_be();
    wr.wr.rdma.remote_addr = op.remote.addr;
    wr.wr.rdma.rkey = op.remote.rkey;
    wr
}
