//! Large messages by rendezvous: the receiver reads them, nothing is copied.
//!
//! A data frame whose payload is larger than the peer's receive buffers
//! (its `Hello::recv_buf_size`) is not sent. The sender instead:
//!
//! 1. registers exactly the payload's bytes for remote READ, a *grant*
//!    (pool regions themselves carry no remote access), and keeps the
//!    payload's pool buffer with its grant in its outbound queue, oldest
//!    first;
//! 2. sends a `Rendezvous` frame whose 16-byte payload is a [`Descriptor`]
//!    (address and length of the payload, the grant's rkey). The frame
//!    carries the data frame's sequence number and returned credits, and
//!    consumes its credit.
//!
//! The receiver, in frame order:
//!
//! 3. allocates a pool buffer of the announced length and RDMA-READs the
//!    payload into it. Frames arriving meanwhile wait behind it, so messages
//!    are delivered in order. Up to the connection's READ depth of requests
//!    are read at once (see [`READ_DEPTH`]): the next READ is in the
//!    device's hands when one completes, so neither the wake-up of the
//!    thread that polls the CQ nor a READ's round trip leaves the link idle
//!    between two large messages;
//! 4. when a READ completes (READs complete in the order they were posted),
//!    sends a `Rendezvous` frame with no payload: the *finish*;
//! 5. delivers the read buffer as the data frame, once every frame ahead of
//!    it is delivered. Its release reposts a receive buffer and returns the
//!    credit, as for any message.
//!
//! On the finish, the sender revokes the oldest grant (deregisters it) and
//! then drops its buffer: a READ never races the buffer's reuse, and the
//! rkey the peer was given reaches nothing once the finish arrived (or the
//! connection ended, which revokes every grant). A peer can therefore
//! read only the bytes of a message sent to it, only until it finishes
//! it, and write none of our memory.
//!
//! Finishes are outside the credit window and need no credit. A side has at
//! most [`MAX_PENDING`] rendezvous unfinished (its sender waits for a
//! finish beyond that), and every side posts [`MAX_PENDING`] receives beyond
//! its credit window, reposted as soon as a finish lands in one. So a
//! finish always finds a receive. A peer that sends more rendezvous than
//! that is a protocol error.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdma_sys::{ibv_send_flags, ibv_send_wr, ibv_sge, ibv_wc_status, ibv_wr_opcode};
use zerocast_core::{ConnError, FrameKind, Header, HEADER_LEN};
use zerocast_link::Driver;
use zerocast_mem::{Buf, PoolError};

use crate::mr::{Access, MemoryRegion};
use crate::rc::engine::Io;
use crate::rc::RcError;
use crate::verbs::HeaderSlab;

/// `wr_id` of the RDMA READ of a rendezvous payload.
pub(crate) const READ_WR_ID: u64 = 1 << 61;
/// `wr_id` of a finish send.
pub(crate) const FINISH_WR_ID: u64 = 1 << 60;
/// Rendezvous a side may have unfinished, and receives each side posts
/// beyond its credit window for their finishes.
pub(crate) const MAX_PENDING: usize = 8;
/// Finish sends one side may have in flight. Twice [`MAX_PENDING`]: a
/// finish's send completion may be polled after the peer, having received
/// it, already sent the next rendezvous.
const MAX_FINISHES: usize = 2 * MAX_PENDING;
/// RDMA READs a connection has in flight at most, and the READ depth it
/// asks the device and the peer for (each side's responder resources and
/// initiator depth, within the device's limits; the connection reads with
/// what the setup granted, at least one). Four keep the link busy across a
/// READ's round trip and the wake-up between two; more would hold more
/// receive buffers for messages not yet delivered.
pub(crate) const READ_DEPTH: usize = 4;
/// Send-queue (and CQ) entries rendezvous adds to a connection: the READs,
/// plus the finishes.
pub(crate) const SQ_EXTRA: usize = READ_DEPTH + MAX_FINISHES;
/// Length of a [`Descriptor`] on the wire.
pub(crate) const DESC_LEN: usize = 16;
/// A rendezvous request on the wire: its header, then the descriptor.
pub(crate) const REQUEST_LEN: usize = HEADER_LEN + DESC_LEN;
/// How long a rendezvous may wait for a pool buffer to be read into
/// before the connection fails. Nobody blocks for it: the request waits at
/// the front of the held frames and every pump tries again.
const ALLOC_PATIENCE: Duration = Duration::from_secs(5);

/// Where a rendezvous payload waits to be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Descriptor {
    pub(crate) addr: u64,
    pub(crate) rkey: u32,
    pub(crate) len: u32,
}

impl Descriptor {
    /// The descriptor of `buf`'s payload, readable through `grant`.
    pub(crate) fn of(buf: &Buf, grant: &MemoryRegion) -> Self {
        // A payload fits in u32: the link caps messages at `LinkConfig`'s
        // `max_payload`, which is at most `u32::MAX`.
        Self { addr: buf.addr(), rkey: grant.keys().rkey, len: buf.len() as u32 }
    }

    pub(crate) fn encode(&self) -> [u8; DESC_LEN] {
        let mut b = [0u8; DESC_LEN];
        b[..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_le_bytes());
        b[12..].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Decode and check against this side's message limit.
    pub(crate) fn decode(b: &[u8], max_payload: u64) -> Result<Self, RcError> {
        let b: &[u8; DESC_LEN] = b.try_into().map_err(|_| {
            RcError::BadFrame(format!("rendezvous descriptor of {} bytes, not {DESC_LEN}", b.len()))
        })?;
        let word =
            |r: std::ops::Range<usize>| b[r].iter().rev().fold(0u64, |acc, &x| acc << 8 | u64::from(x));
        let d = Self { addr: word(0..8), rkey: word(8..12) as u32, len: word(12..16) as u32 };
        if d.len == 0 || u64::from(d.len) > max_payload {
            return Err(RcError::BadFrame(format!(
                "rendezvous of {} bytes; this side accepts 1..={max_payload}",
                d.len
            )));
        }
        Ok(d)
    }
}

/// Register exactly the bytes of `buf` (its `len()`) for the peer, with
/// `access`: the rkey of the result reaches nothing else, and nothing once
/// it is dropped. Rendezvous payloads and exposed buffers both go through
/// here; `what` names which in an error.
///
/// # Safety
/// The registration must be dropped before `buf` is. With remote write
/// access, nothing may read `buf` through a reference while it lives.
pub(crate) unsafe fn grant(
    io: &Io,
    buf: &Buf,
    access: Access,
    what: &'static str,
) -> Result<MemoryRegion, RcError> {
    let addr = std::ptr::NonNull::new(buf.addr() as *mut u8)
        .ok_or_else(|| RcError::Config("null pool buffer".into()))?;
    // SAFETY: `buf` is a live pool buffer, mapped and in place while it
    // lives; our caller drops the registration before the buffer and
    // keeps readers away while the peer may write.
    unsafe { MemoryRegion::register(io.qp().pd(), addr, buf.len(), access) }
        .map_err(|source| RcError::Register { what, source })
}

/// A payload lent to the peer until its finish. Field order is drop order:
/// the grant is revoked before the buffer goes back to the pool.
#[derive(Debug)]
#[expect(dead_code, reason = "held for their drop order, never read")]
pub(crate) struct Lent {
    pub(crate) grant: MemoryRegion,
    pub(crate) buf: Buf,
}

/// A received frame, in sequence order, on its way to the link.
#[derive(Debug)]
pub(crate) enum Arrival {
    /// A credit or control frame: only its header counts.
    Frame(Header),
    /// A rendezvous request: read the payload first.
    Request(Header, Descriptor),
    /// An RDMA WRITE with this immediate value consumed this (empty) buffer.
    Immediate(u32, Buf),
    /// A data frame sent with its header in the immediate: the credits it
    /// returns, the low 16 bits of its sequence number, and the payload.
    Short(u16, u16, Buf),
}

/// A frame held behind a rendezvous, in sequence order.
#[derive(Debug)]
enum Held {
    /// A frame that waits only for those ahead of it (never a request).
    Frame(Arrival),
    /// A request whose READ is not posted yet: as many READs as the
    /// connection may have are in flight, or the pool has no buffer.
    Request(Header, Descriptor),
    /// A request whose READ is posted into `buf`, with the header of the
    /// data frame to deliver; `done` once the READ completed and the
    /// finish is posted: then it is delivered when it reaches the front.
    Read { header: Header, buf: Buf, done: bool },
}

#[derive(Debug)]
struct Inbound {
    /// Frames not yet handed on, in sequence order: a rendezvous (read or
    /// not) and what arrived behind it.
    held: VecDeque<Held>,
    /// READs posted whose completion has not been polled yet. While the
    /// connection is healthy these are the first `reading` of `held`'s
    /// `Held::Read` entries not `done` (READs are posted in order and
    /// complete in order); a READ that completes in error leaves its entry
    /// as it was, and is counted off all the same, so the count, not the
    /// entries, says when the device is done (`Rendezvous::is_idle`).
    reading: usize,
    /// READs this connection may have in flight (see [`READ_DEPTH`]).
    depth: usize,
    /// The most READs it has had in flight at once.
    #[cfg(test)]
    peak: usize,
    /// Finish sends posted and not yet completed.
    finishes: usize,
    /// Since when the first request not yet read waits for a pool buffer
    /// to be read into.
    starved_since: Option<Instant>,
}

/// A connection's rendezvous state, both directions.
#[derive(Debug)]
pub(crate) struct Rendezvous {
    /// Our payloads the peer reads, with their grants, oldest first.
    outbound: Mutex<VecDeque<Lent>>,
    /// Grants taken out of `outbound` whose deregistration has not
    /// returned yet: until it has, the peer may still reach them, so
    /// [`Rendezvous::has_outbound`] counts them.
    revoking: AtomicUsize,
    inbound: Mutex<Inbound>,
    /// Frames are held behind a rendezvous: `inbound` holds frames (a
    /// request among them). Written and read only by the thread polling the CQ,
    /// under the source's lock (as every arrival, READ start and READ
    /// completion is), so it is exact there: an arrival that finds it
    /// clear goes straight to the link without taking `inbound`'s lock.
    holding: AtomicBool,
    /// A request waits for a pool buffer (`Inbound::starved_since`): every
    /// pump tries again ([`retry`]). Kept like `holding`.
    starved: AtomicBool,
    /// The peer's receive-buffer size: larger payloads go by rendezvous.
    /// `usize::MAX` until the handshake is done.
    peer_eager: AtomicUsize,
    /// The finish frame, written once (every finish is the same 16 bytes).
    finish: HeaderSlab,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Rendezvous {
    pub(crate) fn new(finish: HeaderSlab, held_capacity: usize) -> Self {
        finish.write(0, &Header::new(FrameKind::Rendezvous, 0, 0, 0).encode());
        Self {
            outbound: Mutex::new(VecDeque::with_capacity(MAX_PENDING)),
            revoking: AtomicUsize::new(0),
            inbound: Mutex::new(Inbound {
                held: VecDeque::with_capacity(held_capacity),
                reading: 0,
                depth: 1,
                #[cfg(test)]
                peak: 0,
                finishes: 0,
                starved_since: None,
            }),
            holding: AtomicBool::new(false),
            starved: AtomicBool::new(false),
            peer_eager: AtomicUsize::new(usize::MAX),
            finish,
        }
    }

    /// The handshake told us the peer's receive-buffer size.
    pub(crate) fn set_peer_eager(&self, bytes: usize) {
        self.peer_eager.store(bytes, Ordering::Release);
    }

    /// The connection is up with this READ depth (its QP's): read that
    /// many requests at once, at least one and at most [`READ_DEPTH`].
    pub(crate) fn set_read_depth(&self, depth: usize) {
        lock(&self.inbound).depth = depth.clamp(1, READ_DEPTH);
    }

    /// The most READs this connection has had in flight at once.
    #[cfg(test)]
    pub(crate) fn peak_reads(&self) -> usize {
        lock(&self.inbound).peak
    }

    /// Whether a payload of `len` bytes goes by rendezvous.
    pub(crate) fn is_large(&self, len: usize) -> bool {
        len > self.peer_eager.load(Ordering::Acquire)
    }

    /// How many rendezvous may be started now.
    pub(crate) fn free(&self) -> usize {
        MAX_PENDING.saturating_sub(lock(&self.outbound).len())
    }

    /// Keep a payload and its grant until the peer's finish for it
    /// (called in post order).
    pub(crate) fn push_outbound(&self, lent: Lent) {
        lock(&self.outbound).push_back(lent);
    }

    /// The peer finished reading our oldest payload: revoke its grant, then
    /// release it (outside the lock: deregistering is a system call).
    pub(crate) fn on_finish(&self) -> Result<(), RcError> {
        let lent = {
            let mut out = lock(&self.outbound);
            let lent = out.pop_front();
            if lent.is_some() {
                self.revoking.fetch_add(1, Ordering::AcqRel);
            }
            lent
        };
        match lent {
            Some(lent) => {
                drop(lent);
                self.revoking.fetch_sub(1, Ordering::AcqRel);
                Ok(())
            }
            None => Err(RcError::BadFrame("rendezvous finish with no rendezvous pending".into())),
        }
    }

    /// Whether the peer may still reach a payload of ours: one is lent, or
    /// its grant is being revoked right now.
    pub(crate) fn has_outbound(&self) -> bool {
        let out = lock(&self.outbound);
        !out.is_empty() || self.revoking.load(Ordering::Acquire) > 0
    }

    /// No READ or finish of ours is in the device's hands.
    pub(crate) fn is_idle(&self) -> bool {
        let st = lock(&self.inbound);
        st.reading == 0 && st.finishes == 0
    }

    /// The connection is over: revoke every grant and release what is held
    /// here. With `flushed`, every work request of the QP has completed;
    /// without, READs may still be in the device's hands, so their target
    /// buffers stay here until the connection's `Io` drops, after its QP
    /// is destroyed. Grants are revoked either way: a revoked grant reaches
    /// nothing, so its buffer may go back to the pool.
    pub(crate) fn clear(&self, flushed: bool) {
        let lent = {
            let mut out = lock(&self.outbound);
            self.revoking.fetch_add(out.len(), Ordering::AcqRel);
            std::mem::take(&mut *out)
        };
        let n = lent.len();
        drop(lent);
        self.revoking.fetch_sub(n, Ordering::AcqRel);
        let mut st = lock(&self.inbound);
        if flushed {
            st.held.clear();
            st.reading = 0;
        } else {
            st.held.retain(|h| matches!(h, Held::Read { done: false, .. }));
        }
        st.starved_since = None;
        self.holding.store(false, Ordering::Relaxed);
        self.starved.store(false, Ordering::Relaxed);
    }

    /// A rendezvous waits for a pool buffer: pumps must try again (the
    /// pool wakes the connection when one comes back: see
    /// [`Io::pool_waker`]).
    #[inline]
    pub(crate) fn is_starved(&self) -> bool {
        self.starved.load(Ordering::Relaxed)
    }

    /// When a starved rendezvous fails the connection, if no pool buffer
    /// has come by then.
    pub(crate) fn starved_until(&self) -> Option<Instant> {
        if !self.is_starved() {
            return None;
        }
        lock(&self.inbound).starved_since.map(|t| t + ALLOC_PATIENCE)
    }
}

/// Hand a received frame on in sequence order: at once, or behind a
/// rendezvous being read.
///
/// Nothing held (see `Rendezvous::holding`) is the usual case, on every
/// message: the frame goes to the link with no lock taken, inlined into
/// the completion's handling. A request, or a frame that may have to wait,
/// takes the lock in [`arrive_in_order`].
#[inline(always)]
pub(crate) fn arrive(io: &Io, driver: &Driver, a: Arrival) -> Result<(), ConnError> {
    if !io.rendezvous().holding.load(Ordering::Relaxed) {
        match a {
            Arrival::Short(credits, seq_low, buf) => return driver.on_short(credits, seq_low, buf),
            Arrival::Frame(h) => return driver.on_frame(h, None),
            Arrival::Immediate(imm, buf) => return driver.on_immediate(imm, buf),
            Arrival::Request(..) => {}
        }
    }
    arrive_in_order(io, driver, a)
}

#[inline(never)]
fn arrive_in_order(io: &Io, driver: &Driver, a: Arrival) -> Result<(), ConnError> {
    let r = io.rendezvous();
    let mut st = lock(&r.inbound);
    let request = matches!(a, Arrival::Request(..));
    st.held.push_back(match a {
        Arrival::Request(h, d) => Held::Request(h, d),
        a => Held::Frame(a),
    });
    if request || st.held.len() == 1 {
        // A request may start its READ now; a frame alone may go on now.
        return drain_held(io, driver, &mut st);
    }
    Ok(())
}

/// Hand the held frames on in order until the front one waits for its READ
/// (or for a pool buffer to be read into), start the READs the connection
/// may have in flight, in order; then record what is held.
fn drain_held(io: &Io, driver: &Driver, st: &mut Inbound) -> Result<(), ConnError> {
    let r = io.rendezvous();
    let result = deliver_front(driver, st).and_then(|()| start_reads(io, st).map_err(ConnError::transport));
    // Left set on an error: the connection has failed, and what arrives
    // after it stays held.
    r.holding.store(result.is_err() || !st.held.is_empty(), Ordering::Relaxed);
    r.starved.store(st.starved_since.is_some(), Ordering::Relaxed);
    result
}

/// Hand on the frames at the front that wait for nothing: frames, and
/// rendezvous read and finished.
fn deliver_front(driver: &Driver, st: &mut Inbound) -> Result<(), ConnError> {
    loop {
        match st.held.front() {
            Some(Held::Frame(_) | Held::Read { done: true, .. }) => {}
            _ => return Ok(()),
        }
        match st.held.pop_front() {
            Some(Held::Frame(Arrival::Frame(h))) => driver.on_frame(h, None)?,
            Some(Held::Frame(Arrival::Immediate(imm, buf))) => driver.on_immediate(imm, buf)?,
            Some(Held::Frame(Arrival::Short(credits, seq_low, buf))) => {
                driver.on_short(credits, seq_low, buf)?
            }
            Some(Held::Read { header, buf, .. }) => driver.on_frame(header, Some(buf))?,
            // Requests are held as `Held::Request`, never as frames.
            Some(Held::Frame(Arrival::Request(..)) | Held::Request(..)) | None => {
                unreachable!("only deliverable frames are popped")
            }
        }
    }
}

/// Post the READs of the requests not yet read, oldest first, while the
/// connection may have more in flight and the pool has buffers for them.
fn start_reads(io: &Io, st: &mut Inbound) -> Result<(), RcError> {
    let mut i = 0;
    while st.reading < st.depth && i < st.held.len() {
        if let Held::Request(h, d) = st.held[i] {
            match start_read(io, st, d)? {
                Some(buf) => {
                    let header = Header::new(FrameKind::Data, h.credits, h.seq, u64::from(d.len));
                    st.held[i] = Held::Read { header, buf, done: false };
                    st.reading += 1;
                    #[cfg(test)]
                    {
                        st.peak = st.peak.max(st.reading);
                    }
                }
                // No buffer yet: it waits, and so do the requests behind it.
                None => return Ok(()),
            }
        }
        i += 1;
    }
    Ok(())
}

/// Try again to start a rendezvous that waits for a pool buffer (called by
/// the thread polling the CQ on every pump while one does).
#[inline(never)]
pub(crate) fn retry(io: &Io, driver: &Driver) -> Result<(), ConnError> {
    let mut st = lock(&io.rendezvous().inbound);
    drain_held(io, driver, &mut st)
}

/// Post the READ of a rendezvous into a new pool buffer, returned: `None`
/// when the pool has no buffer for it now (the caller keeps the request
/// and tries again), an error once it has waited [`ALLOC_PATIENCE`] or the
/// pool refuses for good.
fn start_read(io: &Io, st: &mut Inbound, d: Descriptor) -> Result<Option<Buf>, RcError> {
    let len = d.len as usize;
    let pool_error = |source| RcError::Pool { what: "a rendezvous read", len, source };
    let buf = match io.pool().alloc_or_wake(len, io.pool_waker()) {
        Ok(buf) => buf,
        Err(e @ (PoolError::Exhausted { .. } | PoolError::Timeout { .. })) => {
            let since = *st.starved_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= ALLOC_PATIENCE {
                return Err(pool_error(e));
            }
            return Ok(None);
        }
        Err(e) => return Err(pool_error(e)),
    };
    st.starved_since = None;
    let mut sge = ibv_sge { addr: buf.addr(), length: d.len, lkey: buf.keys().lkey };
    // SAFETY: all-zero is a valid `ibv_send_wr` (null pointers, zero counts).
    let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
    wr.wr_id = READ_WR_ID;
    wr.sg_list = &mut sge;
    wr.num_sge = 1;
    wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_READ;
    wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
    wr.wr.rdma.remote_addr = d.addr;
    wr.wr.rdma.rkey = d.rkey;
    // SAFETY: the SGE covers `d.len` bytes of a registered pool buffer of
    // this QP's PD; our caller keeps the buffer in `st.held` until the
    // READ's completion is polled (or the connection is over and the QP
    // flushed); `sge` outlives the call, which copies the WR.
    unsafe { io.qp().post_send(std::slice::from_mut(&mut wr)) }
        .map_err(|(_, e)| RcError::verbs("ibv_post_send (rendezvous read)", e))?;
    Ok(Some(buf))
}

/// The oldest READ in flight completed: finish its rendezvous, then deliver
/// what it and the READs before it let through, and start the next READs.
pub(crate) fn on_read_done(io: &Io, driver: &Driver, status: u32, vendor_err: u32) -> Result<(), ConnError> {
    let r = io.rendezvous();
    let mut st = lock(&r.inbound);
    let st = &mut *st;
    let oldest = st.held.iter_mut().find_map(|h| match h {
        Held::Read { header, buf, done: done @ false } => Some((header, buf, done)),
        _ => None,
    });
    let Some((header, buf, done)) = oldest else {
        return Err(ConnError::transport(RcError::BadFrame(
            "rendezvous read completion with none in flight".into(),
        )));
    };
    st.reading = st.reading.saturating_sub(1);
    if status != ibv_wc_status::IBV_WC_SUCCESS {
        return Err(ConnError::transport(RcError::from_wc_status(status, vendor_err)));
    }
    buf.try_set_len(header.len as usize).map_err(ConnError::transport)?;
    *done = true;
    // The finish goes before the delivery: its send is queued ahead of any
    // credit this message's release returns, so the sender always has the
    // finish before the credit.
    post_finish(io, &r.finish, &mut st.finishes).map_err(ConnError::transport)?;
    drain_held(io, driver, st)
}

fn post_finish(io: &Io, slab: &HeaderSlab, finishes: &mut usize) -> Result<(), RcError> {
    if *finishes >= MAX_FINISHES {
        return Err(RcError::BadFrame(format!(
            "the peer has more than {MAX_PENDING} rendezvous unfinished, the protocol's limit"
        )));
    }
    let mut sge = ibv_sge { addr: slab.addr(0), length: HEADER_LEN as u32, lkey: slab.lkey() };
    // SAFETY: all-zero is a valid `ibv_send_wr` (null pointers, zero counts).
    let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
    wr.wr_id = FINISH_WR_ID;
    wr.sg_list = &mut sge;
    wr.num_sge = 1;
    wr.opcode = ibv_wr_opcode::IBV_WR_SEND;
    wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
    // SAFETY: the SGE is the registered finish slot, never written again
    // and kept alive with the connection's `Io`; `sge` outlives the call.
    unsafe { io.qp().post_send(std::slice::from_mut(&mut wr)) }
        .map_err(|(_, e)| RcError::verbs("ibv_post_send (rendezvous finish)", e))?;
    *finishes += 1;
    Ok(())
}

/// A finish send completed.
pub(crate) fn on_finish_sent(io: &Io, status: u32, vendor_err: u32) -> Result<(), RcError> {
    let mut st = lock(&io.rendezvous().inbound);
    st.finishes = st.finishes.saturating_sub(1);
    if status != ibv_wc_status::IBV_WC_SUCCESS {
        return Err(RcError::from_wc_status(status, vendor_err));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_round_trip_and_limits() {
        let d = Descriptor { addr: 0x1234_5678_9abc_def0, rkey: 0xdead_beef, len: 16 << 20 };
        assert_eq!(Descriptor::decode(&d.encode(), 16 << 20).unwrap(), d);
        assert!(matches!(Descriptor::decode(&d.encode(), (16 << 20) - 1), Err(RcError::BadFrame(_))));
        let zero = Descriptor { len: 0, ..d };
        assert!(matches!(Descriptor::decode(&zero.encode(), 1 << 30), Err(RcError::BadFrame(_))));
        assert!(matches!(Descriptor::decode(&d.encode()[..15], 1 << 30), Err(RcError::BadFrame(_))));
    }
}
