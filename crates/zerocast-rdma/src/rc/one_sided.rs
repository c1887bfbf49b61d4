//! One-sided operations on an RC connection: RDMA READ and RDMA WRITE
//! between a local pool buffer and a [`RemoteRegion`] the peer exposed.
//!
//! Each operation is one signalled work request on the connection's QP,
//! with `wr_id = ONE_SIDED_BIT | slot`. The caller blocks while the request
//! is in flight and holds the local buffer meanwhile, so the buffer cannot
//! be dropped or reused before the CQ has yielded the
//! request's completion (or the engine task gave up on a dead QP). At most [`ONE_SIDED_SLOTS`] operations are
//! in flight per connection: the slots are the semaphore, and the send
//! queue and CQ are sized with that many extra entries, so a one-sided
//! request can neither overflow the send queue nor overrun the CQ.
//!
//! Access is scoped: [`OneSided::expose`] registers exactly the buffer's
//! bytes (read only, or read and write with
//! [`OneSided::expose_writable`]) and the returned [`Exposure`] revokes
//! the registration when it drops. Pool regions carry no remote access.
//!
//! Failure is RC failure: a bad rkey or an access outside the region comes
//! back as `IBV_WC_REM_ACCESS_ERR` ([`RcError::RemoteAccess`]); the QP
//! enters the error state, so the whole connection fails, and every other
//! posted request flushes and returns its buffer to the pool.
//!
//! RDMA WRITE with immediate consumes a receive the peer posted, so it is
//! not one of these: it travels under the link's credits (see `write_imm`).

use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use rdma_sys::{ibv_send_flags, ibv_send_wr, ibv_sge, ibv_wc_status, ibv_wr_opcode};
use zerocast_core::SendError;
use zerocast_mem::Buf;

use super::engine::Io;
use super::rendezvous;
use super::{RcConnection, RcError, Resources};
use crate::mr::{Access, MemoryRegion};

/// Marks a one-sided work request's `wr_id` (receives use bit 63, sends
/// their sequence number).
pub(crate) const ONE_SIDED_BIT: u64 = 1 << 62;
/// One-sided operations in flight per connection, at most.
pub(crate) const ONE_SIDED_SLOTS: usize = 16;

/// A memory range of the peer that RDMA READ and WRITE may target: its
/// virtual address, length and remote key. Plain data, so it can travel
/// inside a typed message. It is valid while the peer's [`Exposure`] lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RemoteRegion {
    /// Start address in the peer's address space.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Remote key of the registration that covers exactly this range.
    pub rkey: u32,
}

#[derive(Debug, Default, Clone, Copy)]
enum SlotState {
    #[default]
    Free,
    /// Posted, waiting for its completion.
    Posted,
    /// Completed with this `ibv_wc_status` and vendor error (or, for
    /// `None`, abandoned once the CQ is no longer polled).
    Done(Option<(u32, u32)>),
}

#[derive(Debug)]
pub(crate) struct Table {
    slots: Mutex<Vec<SlotState>>,
    cv: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Table {
    pub(crate) fn new() -> Self {
        Self { slots: Mutex::new(vec![SlotState::Free; ONE_SIDED_SLOTS]), cv: Condvar::new() }
    }

    /// Requests posted and not yet completed.
    pub(crate) fn outstanding(&self) -> usize {
        lock(&self.slots).iter().filter(|s| matches!(s, SlotState::Posted)).count()
    }

    /// Request `wr_id` was polled off the CQ.
    pub(crate) fn complete(&self, wr_id: u64, status: u32, vendor_err: u32) {
        let i = (wr_id & !ONE_SIDED_BIT) as usize;
        let mut t = lock(&self.slots);
        match t.get_mut(i) {
            Some(s @ SlotState::Posted) => *s = SlotState::Done(Some((status, vendor_err))),
            _ => tracing::warn!(slot = i, "one-sided completion for a slot not in flight"),
        }
        drop(t);
        self.cv.notify_all();
    }

    /// The CQ is no longer polled (the QP is in the error state and
    /// its flushes never came): wake every waiter.
    pub(crate) fn abandon(&self) {
        let mut t = lock(&self.slots);
        for s in t.iter_mut().filter(|s| matches!(s, SlotState::Posted)) {
            *s = SlotState::Done(None);
        }
        drop(t);
        self.cv.notify_all();
    }

    /// Wake waiters for a free slot (the connection is closing). The lock
    /// is taken between the caller's closing flag and the notification: a
    /// waiter looked at the flag before it, under the lock, and so is
    /// asleep by now (and woken), or looks after it and sees the flag.
    pub(crate) fn wake(&self) {
        drop(lock(&self.slots));
        self.cv.notify_all();
    }
}

/// A buffer exposed to the peer: a registration of exactly the buffer's
/// bytes, whose rkey is in [`Exposure::region`]. Dropping it (or
/// [`Exposure::revoke`]) deregisters it: from then on the rkey reaches
/// nothing, and a peer's READ or WRITE with it fails with a remote access
/// error that fails the peer's connection.
///
/// The guard borrows the buffer, so the buffer can be neither sent nor
/// dropped while the peer may reach it; a writable exposure borrows it
/// mutably, so nothing reads it while the peer may be writing. Revoke, then
/// read what the peer wrote.
#[must_use = "the peer's access is revoked when the exposure drops"]
#[derive(Debug)]
pub struct Exposure<'a> {
    grant: MemoryRegion,
    region: RemoteRegion,
    writable: bool,
    /// The exposed bytes (the borrowed buffer's).
    base: NonNull<u8>,
    _buf: PhantomData<&'a mut Buf>,
}

// SAFETY: the guard owns a registration (Send + Sync) and points at bytes
// of a buffer it borrows; `read_into` only copies from them with volatile
// reads, which is sound from any thread while the borrow lives.
unsafe impl Send for Exposure<'_> {}
// SAFETY: as above: `&Exposure` allows only volatile copies out.
unsafe impl Sync for Exposure<'_> {}

impl Exposure<'_> {
    /// What to send the peer: address, length and rkey of the exposed bytes.
    pub fn region(&self) -> RemoteRegion {
        self.region
    }

    /// Whether the peer may write the bytes too.
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// Copy `out.len()` exposed bytes from `offset` into `out`, while the
    /// peer may still be writing others (after a WRITE with immediate
    /// announced the ones asked for, say). Each byte is read with a
    /// volatile load: the device writes this memory behind the compiler's
    /// back. A range outside the exposed bytes is [`RcError::OutOfRange`].
    pub fn read_into(&self, offset: usize, out: &mut [u8]) -> Result<(), RcError> {
        let exposed = self.region.len as usize;
        if offset.checked_add(out.len()).is_none_or(|end| end > exposed) {
            return Err(RcError::OutOfRange { offset, len: out.len(), exposed });
        }
        for (i, o) in out.iter_mut().enumerate() {
            // SAFETY: `offset + i < len`, inside the borrowed buffer, which
            // lives and stays in place while `self` does; a volatile read
            // through a raw pointer makes no claim that nobody else writes.
            *o = unsafe { self.base.as_ptr().add(offset + i).read_volatile() };
        }
        Ok(())
    }

    /// Revoke the peer's access now (the same as dropping the guard).
    pub fn revoke(self) {
        drop(self.grant);
    }
}

/// A one-sided READ or WRITE that failed: the error, and the local buffer
/// unless the device may still own it.
///
/// The buffer is withheld only when the connection's completions stopped
/// coming after a close (the QP never reported the request's flush): the
/// device may still write a READ's target, so the buffer stays with the
/// connection until its QP is destroyed, and is counted there.
#[derive(Debug)]
pub struct OneSidedError {
    op: &'static str,
    buf: Option<Buf>,
    source: RcError,
}

impl OneSidedError {
    /// The reason.
    pub fn error(&self) -> &RcError {
        &self.source
    }

    /// The local buffer, when it is safe to use again.
    pub fn into_buf(self) -> Option<Buf> {
        self.buf
    }

    /// The local buffer (when safe to use again) and the reason.
    pub fn into_parts(self) -> (Option<Buf>, RcError) {
        (self.buf, self.source)
    }
}

impl fmt::Display for OneSidedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed", self.op)?;
        if self.buf.is_none() {
            f.write_str(" (the local buffer stays with the connection until its QP is destroyed)")?;
        }
        Ok(())
    }
}

impl std::error::Error for OneSidedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// RDMA READ, WRITE and `expose` on an RC connection.
pub trait OneSided {
    /// Let the peer RDMA READ `buf`'s bytes (`addr`, `len()`) until the
    /// returned guard drops. The rkey covers exactly those bytes, read
    /// only; pool regions themselves carry no remote access.
    ///
    /// Fails with [`RcError::Register`] when the device refuses the
    /// registration (a memlock limit, say).
    fn expose<'a>(&self, buf: &'a Buf) -> Result<Exposure<'a>, RcError>;

    /// Let the peer RDMA READ and WRITE `buf`'s bytes until the returned
    /// guard drops. The buffer stays borrowed mutably meanwhile: read what
    /// the peer wrote once the guard is dropped.
    fn expose_writable<'a>(&self, buf: &'a mut Buf) -> Result<Exposure<'a>, RcError>;

    /// RDMA READ `local.len()` bytes from `remote` into `local`, blocking
    /// until the completion is polled. On failure the buffer comes back
    /// with the error (see [`OneSidedError`]); a device error fails the
    /// connection.
    fn read(&self, local: Buf, remote: RemoteRegion) -> Result<Buf, OneSidedError>;

    /// RDMA WRITE the bytes of `local` to the start of `remote`, blocking
    /// until the completion is polled (the data is then in the peer's
    /// memory).
    fn write(&self, local: Buf, remote: RemoteRegion) -> Result<Buf, OneSidedError>;

    /// RDMA WRITE the bytes of `local` to the start of `remote` with the
    /// immediate value `imm`. The peer's application receives, in order
    /// with this connection's messages, an empty message whose
    /// `immediate()` is `imm`; the bytes are in its memory by then.
    ///
    /// It takes a credit like a send (waiting for one until `deadline`,
    /// `None`: forever), and like a send it hands `local` over: the buffer
    /// returns to the pool once the write completed. Every failure hands it
    /// back; a `local` longer than `remote` is
    /// [`SendError::Rejected`] before anything is queued.
    fn write_with_imm(
        &self,
        local: Buf,
        remote: RemoteRegion,
        imm: u32,
        deadline: Option<Instant>,
    ) -> Result<(), SendError<Buf>>;
}

fn io_of(conn: &RcConnection) -> Result<Arc<Io>, RcError> {
    conn.resources::<Resources>()
        .map(|r| r.0.clone())
        .ok_or_else(|| RcError::Config("not an RC connection's resources".into()))
}

fn exposure<'a>(conn: &RcConnection, buf: &Buf, access: Access) -> Result<Exposure<'a>, RcError> {
    let io = io_of(conn)?;
    // SAFETY: the returned guard borrows `buf` for its whole life (the
    // caller's signature ties the lifetimes), so the registration is
    // dropped before the buffer can be. A writable exposure is made only
    // from `&mut Buf`, so no reader holds the bytes while the peer may
    // write them.
    let grant = unsafe { rendezvous::grant(&io, buf, access, "an exposed buffer") }?;
    let region = RemoteRegion { addr: buf.addr(), len: buf.len() as u64, rkey: grant.keys().rkey };
    let base = NonNull::from(&**buf).cast::<u8>();
    Ok(Exposure { grant, region, writable: access == Access::RemoteReadWrite, base, _buf: PhantomData })
}

impl OneSided for RcConnection {
    fn expose<'a>(&self, buf: &'a Buf) -> Result<Exposure<'a>, RcError> {
        exposure(self, buf, Access::RemoteRead)
    }

    fn expose_writable<'a>(&self, buf: &'a mut Buf) -> Result<Exposure<'a>, RcError> {
        exposure(self, buf, Access::RemoteReadWrite)
    }

    fn read(&self, local: Buf, remote: RemoteRegion) -> Result<Buf, OneSidedError> {
        match io_of(self) {
            Ok(io) => run(&io, Op::Read, local, remote),
            Err(source) => Err(OneSidedError { op: Op::Read.name(), buf: Some(local), source }),
        }
    }

    fn write(&self, local: Buf, remote: RemoteRegion) -> Result<Buf, OneSidedError> {
        match io_of(self) {
            Ok(io) => run(&io, Op::Write, local, remote),
            Err(source) => Err(OneSidedError { op: Op::Write.name(), buf: Some(local), source }),
        }
    }

    fn write_with_imm(
        &self,
        local: Buf,
        remote: RemoteRegion,
        imm: u32,
        deadline: Option<Instant>,
    ) -> Result<(), SendError<Buf>> {
        match self.resources::<Resources>() {
            Some(r) => {
                super::write_imm::write_with_imm(self.link(), r.0.imm_ops(), local, remote, imm, deadline)
            }
            None => {
                let err = zerocast_core::ConnError::Unsupported("not an RC connection's resources");
                Err(SendError::Rejected(local, std::sync::Arc::new(err)))
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Read,
    Write,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Read => "RDMA READ",
            Op::Write => "RDMA WRITE",
        }
    }
}

fn run(io: &Io, op: Op, local: Buf, remote: RemoteRegion) -> Result<Buf, OneSidedError> {
    let fail = |buf, source| Err(OneSidedError { op: op.name(), buf: Some(buf), source });
    let len = local.len();
    if len as u64 > remote.len {
        return fail(local, RcError::RemoteTooShort { local: len, remote: remote.len });
    }
    let Ok(length) = u32::try_from(len) else {
        return fail(local, RcError::Config(format!("one-sided transfer of {len} bytes exceeds 4 GiB")));
    };
    let table = io.one_sided();
    // Take a free slot: the semaphore bounding requests in flight.
    let mut t = lock(&table.slots);
    let slot = loop {
        if io.is_closing() {
            return fail(local, RcError::Closed);
        }
        if let Some(i) = t.iter().position(|s| matches!(s, SlotState::Free)) {
            break i;
        }
        t = wait(&table.cv, t);
    };
    let mut sge = ibv_sge { addr: local.addr(), length, lkey: local.keys().lkey };
    // SAFETY: all-zero is a valid `ibv_send_wr` (null pointers, zero counts).
    let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
    wr.wr_id = ONE_SIDED_BIT | slot as u64;
    wr.sg_list = &mut sge;
    wr.num_sge = 1;
    wr.opcode = match op {
        Op::Read => ibv_wr_opcode::IBV_WR_RDMA_READ,
        Op::Write => ibv_wr_opcode::IBV_WR_RDMA_WRITE,
    };
    wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
    wr.wr.rdma.remote_addr = remote.addr;
    wr.wr.rdma.rkey = remote.rkey;
    // The buffer stays with this (blocked) caller until the request
    // completes: nothing else can drop or reuse it meanwhile.
    t[slot] = SlotState::Posted;
    // SAFETY: the SGE points into a registered pool buffer of this QP's PD
    // (the transport's pool); `local` is not touched or dropped until the
    // request's completion is polled (the wait below); `sge` outlives the
    // call, which copies the WR.
    if let Err((_, e)) = unsafe { io.qp().post_send(std::slice::from_mut(&mut wr)) } {
        t[slot] = SlotState::Free;
        drop(t);
        table.cv.notify_all();
        return fail(local, RcError::verbs("ibv_post_send (one-sided)", e));
    }
    // Wait for the thread polling the CQ to route the completion here. The QP
    // always completes or flushes a posted request, and the engine polls
    // while one is outstanding, even for a connection whose receiving
    // thread claims the CQ (it may be this caller, now not receiving).
    io.wake_tasks();
    let status = loop {
        if let SlotState::Done(status) = t[slot] {
            t[slot] = SlotState::Free;
            break status;
        }
        t = wait(&table.cv, t);
    };
    drop(t);
    table.cv.notify_all();
    match status {
        Some((ibv_wc_status::IBV_WC_SUCCESS, _)) => Ok(local),
        Some((s, vendor_err)) => fail(local, RcError::from_wc_status(s, vendor_err)),
        // No completion came, not even a flush: the device may still own
        // the buffer. It stays with the connection until the QP is gone.
        None => {
            io.keep_until_destroyed(local);
            Err(OneSidedError { op: op.name(), buf: None, source: RcError::Flushed })
        }
    }
}

/// Wait for a change of the table: every one (a slot freed, a completion
/// routed, the connection closing or abandoned) notifies under or after
/// the lock, so the wait needs no timeout.
fn wait<'a>(cv: &Condvar, g: MutexGuard<'a, Vec<SlotState>>) -> MutexGuard<'a, Vec<SlotState>> {
    cv.wait(g).unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_track_completions_and_abandonment() {
        let t = Table::new();
        {
            let mut s = lock(&t.slots);
            s[0] = SlotState::Posted;
            s[3] = SlotState::Posted;
        }
        assert_eq!(t.outstanding(), 2);
        t.complete(ONE_SIDED_BIT | 3, ibv_wc_status::IBV_WC_REM_ACCESS_ERR, 7);
        assert_eq!(t.outstanding(), 1);
        assert!(matches!(
            lock(&t.slots)[3],
            SlotState::Done(Some((ibv_wc_status::IBV_WC_REM_ACCESS_ERR, 7)))
        ));
        // A completion for a slot not in flight (or out of range) is ignored.
        t.complete(ONE_SIDED_BIT | 5, ibv_wc_status::IBV_WC_SUCCESS, 0);
        t.complete(ONE_SIDED_BIT | 999, ibv_wc_status::IBV_WC_SUCCESS, 0);
        assert!(matches!(lock(&t.slots)[5], SlotState::Free));
        t.abandon();
        assert_eq!(t.outstanding(), 0);
        assert!(matches!(lock(&t.slots)[0], SlotState::Done(None)));
    }
}
