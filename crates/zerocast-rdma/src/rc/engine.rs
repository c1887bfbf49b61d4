//! The data path of an RC connection: posted buffers, the poller, the
//! sender and the reposter, driving a [`zerocast_link::Driver`].
//!
//! Ownership: every posted buffer sits in an in-flight table keyed by its
//! `wr_id` slot until its completion is polled. Every send and receive is a
//! two-entry scatter list: a 16-byte header slot from a registered slab,
//! then the pool buffer, so a received payload starts at offset 0 of its
//! buffer and is handed to the application without a copy.

use std::mem::MaybeUninit;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use rdma_sys::{ibv_recv_wr, ibv_sge, ibv_wc, ibv_wc_flags, ibv_wc_opcode, ibv_wc_status};
use zerocast_core::{ConnError, FrameKind, Header, HEADER_LEN};
use zerocast_link::{Driver, Reposts};
use zerocast_mem::{Buf, Pool, Wait};

use crate::rc::one_sided::{self, ONE_SIDED_BIT};
use crate::rc::rendezvous::{self, Arrival, Descriptor, Rendezvous, FINISH_WR_ID, READ_WR_ID};
use crate::rc::srq;
use crate::rc::write_imm::ImmOps;
use crate::rc::RcError;
use crate::verbs::{CompletionQueue, HeaderSlab, QueuePair};

pub(crate) const RECV_BIT: u64 = 1 << 63;
/// Completions taken per `ibv_poll_cq` call.
const POLL_BATCH: usize = 32;

#[derive(Debug)]
struct RecvTable {
    slots: Vec<Option<Buf>>,
    free: Vec<u32>,
    posted: usize,
    /// No more receives may be posted: the connection is shutting down.
    closing: bool,
}

mod send;

use send::{sender, SendTable};

/// Everything a connection's threads share. Field order is drop order: the
/// QP goes first, so no buffer in the tables is still in the device's hands
/// when the tables drop.
#[derive(Debug)]
pub(crate) struct Io {
    qp: QueuePair,
    cq: Arc<CompletionQueue>,
    /// Large messages in both directions (see `rendezvous`).
    rendezvous: Rendezvous,
    recv_hdr: HeaderSlab,
    send_hdr: HeaderSlab,
    /// Per send slot: the descriptor a rendezvous frame carries.
    send_desc: HeaderSlab,
    recv: Mutex<RecvTable>,
    send: Mutex<SendTable>,
    send_cv: Condvar,
    /// One-sided requests in flight (see `one_sided`).
    one_sided: one_sided::Table,
    /// WRITEs with immediate queued on the link (see `write_imm`).
    imm_ops: ImmOps,
    pool: Pool,
    buf_size: usize,
    busy_poll: bool,
    ignore_credits: bool,
    peer_disconnected: AtomicBool,
    /// Mirror of `RecvTable::closing`, readable without the lock.
    closing: AtomicBool,
    /// The listener's shared receive queue, when receives come from one
    /// (then `recv` stays empty). Last: its share is released after the QP.
    srq: Option<srq::Member>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Sizes of one connection's queues.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sizes {
    pub(crate) recv_window: usize,
    pub(crate) send_depth: usize,
    pub(crate) buf_size: usize,
}

impl Sizes {
    /// Receives posted per connection: the credit window, plus those kept
    /// for rendezvous finishes.
    pub(crate) fn posted_receives(&self) -> usize {
        self.recv_window + rendezvous::MAX_PENDING
    }
}

impl Io {
    /// Wrap a fresh QP (at least in INIT) and pre-post `recv_window`
    /// receives, plus [`rendezvous::MAX_PENDING`] for rendezvous finishes,
    /// before connecting.
    pub(crate) fn new(
        qp: QueuePair,
        cq: Arc<CompletionQueue>,
        pool: Pool,
        sizes: Sizes,
        busy_poll: bool,
        ignore_credits: bool,
        srq: Option<srq::Member>,
    ) -> Result<Arc<Self>, RcError> {
        let reg = |e: zerocast_mem::RegisterError| RcError::Config(format!("registering header slots: {e}"));
        let posted = sizes.posted_receives();
        let recv_hdr = HeaderSlab::new(qp.pd(), posted).map_err(reg)?;
        let send_hdr = HeaderSlab::new(qp.pd(), sizes.send_depth).map_err(reg)?;
        let send_desc = HeaderSlab::new(qp.pd(), sizes.send_depth).map_err(reg)?;
        let rendezvous = Rendezvous::new(HeaderSlab::new(qp.pd(), 1).map_err(reg)?, posted);
        let io = Arc::new(Self {
            qp,
            cq,
            rendezvous,
            recv_hdr,
            send_hdr,
            send_desc,
            recv: Mutex::new(RecvTable {
                slots: (0..posted).map(|_| None).collect(),
                free: (0..posted as u32).rev().collect(),
                posted: 0,
                closing: false,
            }),
            send: Mutex::new(SendTable {
                slots: (0..sizes.send_depth).map(|_| None).collect(),
                head: 0,
                tail: 0,
            }),
            send_cv: Condvar::new(),
            one_sided: one_sided::Table::new(),
            imm_ops: ImmOps::new(sizes.send_depth),
            pool,
            buf_size: sizes.buf_size,
            busy_poll,
            ignore_credits,
            peer_disconnected: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            srq,
        });
        // With a shared receive queue, the listener posted this
        // connection's share when it admitted it.
        let own_receives = if io.srq.is_some() { 0 } else { posted };
        for _ in 0..own_receives {
            let buf = io.fresh_buf()?;
            let mut t = lock(&io.recv);
            io.post_recv_locked(&mut t, buf)?;
        }
        Ok(io)
    }

    pub(crate) fn qp(&self) -> &QueuePair {
        &self.qp
    }

    pub(crate) fn one_sided(&self) -> &one_sided::Table {
        &self.one_sided
    }

    pub(crate) fn imm_ops(&self) -> &ImmOps {
        &self.imm_ops
    }

    pub(crate) fn rendezvous(&self) -> &Rendezvous {
        &self.rendezvous
    }

    pub(crate) fn pool(&self) -> &Pool {
        &self.pool
    }

    fn fresh_buf(&self) -> Result<Buf, RcError> {
        self.pool.alloc(self.buf_size, Wait::For(Duration::from_secs(5))).map_err(|source| RcError::Pool {
            what: "a receive",
            len: self.buf_size,
            source,
        })
    }

    /// Post `buf` as a receive, in a free slot. The table lock is held, so
    /// the poller cannot see the completion before the slot is filled.
    fn post_recv_locked(&self, t: &mut RecvTable, buf: Buf) -> Result<(), RcError> {
        if let Some(m) = &self.srq {
            return m.shared().repost(buf);
        }
        let Some(slot) = t.free.pop() else {
            return Err(RcError::Config("more receives posted than the window".into()));
        };
        let cap = u32::try_from(buf.capacity()).unwrap_or(u32::MAX);
        let mut sges = [
            ibv_sge {
                addr: self.recv_hdr.addr(slot as usize),
                length: HEADER_LEN as u32,
                lkey: self.recv_hdr.lkey(),
            },
            ibv_sge { addr: buf.addr(), length: cap, lkey: buf.keys().lkey },
        ];
        let mut wr = ibv_recv_wr {
            wr_id: RECV_BIT | u64::from(slot),
            next: ptr::null_mut(),
            sg_list: sges.as_mut_ptr(),
            num_sge: 2,
        };
        t.slots[slot as usize] = Some(buf);
        // SAFETY: both SGEs are registered in the QP's PD (the slab, and the
        // pool registered through the same PD); the buffer stays in the
        // table, and the slab in `self`, until the completion is polled.
        match unsafe { self.qp.post_recv(&mut wr) } {
            Ok(()) => {
                t.posted += 1;
                Ok(())
            }
            Err(e) => {
                t.slots[slot as usize] = None;
                t.free.push(slot);
                Err(RcError::verbs("ibv_post_recv", e))
            }
        }
    }

    /// Repost a released buffer (or a fresh one) and return its credit.
    /// A rendezvous message's buffer is of another size: it goes back to
    /// the pool, and a receive buffer takes its place.
    fn repost(&self, driver: &Driver, buf: Option<Buf>) -> Result<(), RcError> {
        let buf = match buf {
            Some(b) if b.capacity() == self.buf_size => b,
            _ => self.fresh_buf()?,
        };
        {
            let mut t = lock(&self.recv);
            if t.closing {
                return Ok(());
            }
            if self.ignore_credits {
                // Test-only: return the credit without a receive behind it.
                drop(buf);
            } else {
                self.post_recv_locked(&mut t, buf)?;
            }
        }
        driver.on_reposted();
        Ok(())
    }

    /// Stop posting receives and put the QP into the error state, so every
    /// posted work request completes (flushed) and its buffer comes back.
    pub(crate) fn close(&self) {
        // The flag first: whoever sees `RecvTable::closing` (the poller,
        // deciding it is drained) also sees this, so a one-sided request
        // checking it under its table's lock is either refused or counted
        // as outstanding, never posted after the poller stopped.
        self.closing.store(true, Ordering::Release);
        lock(&self.recv).closing = true;
        if let Some(id) = self.qp.cm() {
            // SAFETY: live id (held by the QP).
            unsafe { rdma_sys::rdma_disconnect(id.as_ptr()) };
        }
        if let Err(e) = self.qp.to_error() {
            tracing::debug!(error = %e, "moving the QP to the error state failed");
        }
        self.send_cv.notify_all();
        self.one_sided.wake();
        self.rendezvous.wake();
    }

    pub(crate) fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    pub(crate) fn mark_peer_disconnected(&self) {
        self.peer_disconnected.store(true, Ordering::Release);
    }

    fn drained(&self) -> bool {
        let recv_done = {
            let r = lock(&self.recv);
            r.closing && r.posted == 0
        };
        recv_done
            && lock(&self.send).outstanding() == 0
            && self.one_sided.outstanding() == 0
            && self.rendezvous.is_idle()
    }
}

/// Start the threads of an established connection.
pub(crate) fn spawn(io: &Arc<Io>, driver: Driver, reposts: Reposts, max_batch: usize) -> std::io::Result<()> {
    let name = |n: &str| format!("zerocast-rc-{n}");
    let (i, d) = (io.clone(), driver.clone());
    // Each thread sets up its buffer caches before its first message.
    thread::Builder::new().name(name("poll")).spawn(move || {
        d.pool().prepare_thread();
        poller(&i, &d)
    })?;
    let (i, d) = (io.clone(), driver.clone());
    thread::Builder::new().name(name("repost")).spawn(move || {
        d.pool().prepare_thread();
        reposter(&i, &d, &reposts)
    })?;
    let i = io.clone();
    thread::Builder::new().name(name("tx")).spawn(move || {
        driver.pool().prepare_thread();
        sender(&i, &driver, max_batch)
    })?;
    Ok(())
}

fn reposter(io: &Io, driver: &Driver, reposts: &Reposts) {
    loop {
        match reposts.recv_timeout(Duration::from_millis(50)) {
            Ok(buf) => {
                if let Err(e) = io.repost(driver, buf) {
                    driver.fail(ConnError::transport(e));
                    io.close();
                }
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                if io.is_closing() {
                    return;
                }
            }
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
        }
    }
}

fn poller(io: &Io, driver: &Driver) {
    poll_until_drained(io, driver);
    // The QP is in the error state and flushed: no READ can reach a
    // buffer held for rendezvous any more.
    io.rendezvous.clear();
}

fn poll_until_drained(io: &Io, driver: &Driver) {
    let mut wcs: [MaybeUninit<ibv_wc>; POLL_BATCH] = std::array::from_fn(|_| MaybeUninit::uninit());
    let mut idle_since: Option<Instant> = None;
    let mut armed = false;
    loop {
        let n = match io.cq.poll(&mut wcs) {
            Ok(n) => n,
            Err(e) => {
                driver.fail(ConnError::transport(RcError::verbs("ibv_poll_cq", e)));
                io.close();
                0
            }
        };
        for wc in &wcs[..n] {
            // SAFETY: `ibv_poll_cq` initialised the first `n` entries.
            let wc = unsafe { wc.assume_init_ref() };
            on_completion(io, driver, wc);
        }
        if n > 0 {
            idle_since = None;
            armed = false;
            continue;
        }
        if io.drained() {
            break;
        }
        let idle = *idle_since.get_or_insert_with(Instant::now);
        if io.is_closing() && idle.elapsed() > Duration::from_secs(10) {
            tracing::warn!(
                recv_posted = lock(&io.recv).posted,
                send_outstanding = lock(&io.send).outstanding(),
                "RC connection: flush completions missing after close; giving up on them"
            );
            io.one_sided.abandon();
            break;
        }
        if io.busy_poll || !io.cq.has_channel() {
            if idle.elapsed() > Duration::from_micros(200) {
                thread::sleep(Duration::from_micros(50));
            } else {
                std::hint::spin_loop();
            }
            continue;
        }
        if idle.elapsed() < Duration::from_micros(50) {
            std::hint::spin_loop();
            continue;
        }
        if !armed {
            if let Err(e) = io.cq.arm() {
                tracing::debug!(error = %e, "ibv_req_notify_cq failed");
            }
            armed = true;
            // Poll once more: a completion may have landed before arming.
            continue;
        }
        match io.cq.wait(20) {
            Ok(true) => armed = false,
            Ok(false) => {}
            Err(e) => tracing::debug!(error = %e, "waiting for a completion event failed"),
        }
    }
}

fn on_completion(io: &Io, driver: &Driver, wc: &ibv_wc) {
    if wc.wr_id & RECV_BIT != 0 {
        let slot = (wc.wr_id & !RECV_BIT) as usize;
        if let Some(m) = &io.srq {
            // The slot is in the listener's shared table.
            let Some((buf, raw)) = m.shared().take(slot) else {
                tracing::warn!(slot, "receive completion for an empty shared slot");
                return;
            };
            if wc.status != ibv_wc_status::IBV_WC_SUCCESS {
                drop(buf);
                on_error(io, driver, wc.status, wc.vendor_err);
            } else if let Err(e) = on_receive(io, driver, &raw, wc.byte_len as usize, buf) {
                driver.fail(e);
                io.close();
            }
            return;
        }
        // Read the header before the slot is freed: once free, the reposter
        // may post a new receive into it, and the device may overwrite it.
        let (buf, raw) = {
            let mut t = lock(&io.recv);
            let buf = t.slots.get_mut(slot).and_then(Option::take);
            let raw = io.recv_hdr.read(slot.min(t.slots.len().saturating_sub(1)));
            if buf.is_some() {
                t.posted -= 1;
                t.free.push(slot as u32);
            }
            (buf, raw)
        };
        let Some(buf) = buf else {
            tracing::warn!(slot, "receive completion for an empty slot");
            return;
        };
        if wc.status != ibv_wc_status::IBV_WC_SUCCESS {
            drop(buf);
            on_error(io, driver, wc.status, wc.vendor_err);
            return;
        }
        let done = if wc.opcode == ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM {
            on_write_imm(io, driver, wc, buf)
        } else {
            on_receive(io, driver, &raw, wc.byte_len as usize, buf)
        };
        if let Err(e) = done {
            driver.fail(e);
            io.close();
        }
    } else if wc.wr_id & ONE_SIDED_BIT != 0 {
        io.one_sided.complete(wc.wr_id, wc.status, wc.vendor_err);
        if wc.status != ibv_wc_status::IBV_WC_SUCCESS {
            on_error(io, driver, wc.status, wc.vendor_err);
        }
    } else if wc.wr_id == READ_WR_ID {
        if let Err(e) = rendezvous::on_read_done(io, driver, wc.status, wc.vendor_err) {
            if wc.status == ibv_wc_status::IBV_WC_SUCCESS {
                driver.fail(e);
                io.close();
            } else {
                on_error(io, driver, wc.status, wc.vendor_err);
            }
        }
    } else if wc.wr_id == FINISH_WR_ID {
        if rendezvous::on_finish_sent(io, wc.status, wc.vendor_err).is_err() {
            on_error(io, driver, wc.status, wc.vendor_err);
        }
    } else {
        lock(&io.send).complete_through(wc.wr_id);
        io.send_cv.notify_all();
        if wc.status != ibv_wc_status::IBV_WC_SUCCESS {
            on_error(io, driver, wc.status, wc.vendor_err);
        }
    }
}

/// The peer's RDMA WRITE with immediate consumed this receive: its bytes
/// are in our memory; the application gets an empty message carrying the
/// immediate, in order.
fn on_write_imm(io: &Io, driver: &Driver, wc: &ibv_wc, mut buf: Buf) -> Result<(), ConnError> {
    if wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 == 0 {
        return Err(ConnError::transport(RcError::BadFrame("write with immediate without immediate".into())));
    }
    // SAFETY: `IBV_WC_WITH_IMM` is set, so the union holds the immediate.
    let imm = u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data });
    buf.try_set_len(0).map_err(ConnError::transport)?;
    rendezvous::arrive(io, driver, Arrival::Immediate(imm, buf))
}

fn on_receive(
    io: &Io,
    driver: &Driver,
    raw: &[u8; HEADER_LEN],
    byte_len: usize,
    mut buf: Buf,
) -> Result<(), ConnError> {
    let header = Header::decode(&raw[..byte_len.min(HEADER_LEN)], driver.max_payload())?;
    if byte_len < HEADER_LEN || header.len != (byte_len - HEADER_LEN) as u64 {
        let msg = format!("{byte_len} bytes received for a frame of {} payload bytes", header.len);
        return Err(ConnError::transport(RcError::BadFrame(msg)));
    }
    let repost_now = |buf: Buf| -> Result<(), ConnError> {
        let mut t = lock(&io.recv);
        if !t.closing {
            io.post_recv_locked(&mut t, buf).map_err(ConnError::transport)?;
        }
        Ok(())
    };
    match header.kind {
        FrameKind::Data => {
            buf.try_set_len(header.len as usize).map_err(ConnError::transport)?;
            rendezvous::arrive(io, driver, Arrival::Frame(header, Some(buf)))
        }
        FrameKind::Rendezvous if header.len == 0 => {
            // A finish: outside the credit window, its receive is one of
            // those kept for finishes and goes back at once.
            repost_now(buf)?;
            io.rendezvous.on_finish().map_err(ConnError::transport)
        }
        FrameKind::Rendezvous => {
            buf.try_set_len(header.len as usize).map_err(ConnError::transport)?;
            let d = Descriptor::decode(&buf, driver.max_payload()).map_err(ConnError::transport)?;
            // The message will arrive in a buffer of its own; this one goes
            // back to the pool, and its release reposts a fresh one.
            drop(buf);
            rendezvous::arrive(io, driver, Arrival::Request(header, d))
        }
        FrameKind::Credit | FrameKind::Control => {
            // The buffer carried nothing: post it again at once (the core
            // counts the credit as owed already).
            repost_now(buf)?;
            rendezvous::arrive(io, driver, Arrival::Frame(header, None))
        }
    }
}

fn on_error(io: &Io, driver: &Driver, status: u32, vendor_err: u32) {
    if driver.is_finished() {
        // Flushes after both goodbyes: the normal end.
        return;
    }
    let err = if status == ibv_wc_status::IBV_WC_WR_FLUSH_ERR && io.peer_disconnected.load(Ordering::Acquire)
    {
        RcError::PeerDisconnected
    } else {
        RcError::from_wc_status(status, vendor_err)
    };
    tracing::debug!(error = %err, "RC work completion failed");
    driver.fail(ConnError::transport(err));
    io.close();
}
