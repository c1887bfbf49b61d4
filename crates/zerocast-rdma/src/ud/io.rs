//! The data path of a UD socket: the queue pair, its two CQs, the posted
//! receives and the sends in flight.
//!
//! Ownership follows the verbs contract: a posted receive buffer sits in
//! the receive table under its `wr_id` until its completion is polled; a
//! sent buffer (and the address handle it was sent with) sits in the send
//! ring until a completion for it or a later send is polled (see `tx`).
//! Senders reap the send CQ as they go. Receivers poll the receive CQ
//! themselves, one at a time and a batch of completions per poll, sleeping
//! on its completion channel.

use std::mem::MaybeUninit;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rdma_sys::{ibv_recv_wr, ibv_sge, ibv_wc, ibv_wc_flags, ibv_wc_status};
use zerocast_link::TurnLock;
use zerocast_mem::{Buf, Pool, Wait};

mod tx;

pub(super) use tx::{Outgoing, CHAIN};

use super::UdError;
use crate::device::ProtectionDomain;
use crate::rc::wc_status_name;
use crate::send_ring::SendRing;
use crate::verbs::{AddressHandle, CompletionQueue, HeaderSlab, QueuePair};

/// One send in flight: its payload (none for a fence) and the AH it was
/// sent with, both kept until the device is done with them.
type InFlight = (Option<Buf>, Arc<AddressHandle>);
type TxRing = SendRing<InFlight>;

/// Send completions taken per `ibv_poll_cq` call.
const REAP_BATCH: usize = 16;
/// Receive completions taken per `ibv_poll_cq` call.
const RECV_BATCH: usize = 16;

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Debug)]
struct RxTable {
    slots: Vec<Option<Buf>>,
    free: Vec<u32>,
}

/// Receive completions polled and not yet handed out, with their buffers.
/// Owned by whichever receiver holds [`Io::rx_turn`].
pub(super) struct RxBatch {
    wcs: [MaybeUninit<ibv_wc>; RECV_BATCH],
    bufs: [Option<Buf>; RECV_BATCH],
    next: usize,
    len: usize,
}

impl RxBatch {
    fn new() -> Self {
        Self { wcs: [const { MaybeUninit::uninit() }; RECV_BATCH], bufs: Default::default(), next: 0, len: 0 }
    }

    /// Completion `i` of the batch, as handed out by [`Io::poll_recv`].
    pub(super) fn wc(&self, i: usize) -> &ibv_wc {
        assert!(i < self.len);
        // SAFETY: the poll that filled this batch wrote its first `len` entries.
        unsafe { self.wcs[i].assume_init_ref() }
    }
}

impl std::fmt::Debug for RxBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxBatch").field("next", &self.next).field("len", &self.len).finish()
    }
}

// SAFETY: `ibv_wc` is plain data (integers and a union of integers).
unsafe impl Send for RxBatch {}

/// Counters of the data path.
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) sent: AtomicU64,
    pub(super) send_errors: AtomicU64,
    pub(super) received: AtomicU64,
    pub(super) dropped_malformed: AtomicU64,
    pub(super) recv_errors: AtomicU64,
}

/// Where a send goes. Its address handle moves into the send ring with
/// the send, which keeps it until the device is done.
#[derive(Clone)]
pub(super) struct Route {
    pub(super) ah: Arc<AddressHandle>,
    pub(super) qpn: u32,
    pub(super) qkey: u32,
}

/// Everything the socket and its received datagrams share. Field order is
/// drop order: the QP goes first, so no buffer in the tables is still in
/// the device's hands when the tables drop.
#[derive(Debug)]
pub(crate) struct Io {
    pub(super) qp: QueuePair,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
    send_hdr: HeaderSlab,
    rx: Mutex<RxTable>,
    /// Receivers take turns polling the receive CQ, and share what a
    /// poll took; one waiting for its turn sleeps until it comes or its
    /// deadline passes.
    pub(super) rx_turn: TurnLock<RxBatch>,
    tx: Mutex<TxRing>,
    pub(super) pool: Pool,
    pub(super) pd: Arc<ProtectionDomain>,
    pub(super) port: u8,
    /// Bytes each receive takes: the GRH and an MTU.
    rx_len: usize,
    closing: AtomicBool,
    pub(super) counters: Counters,
}

/// Queue sizes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sizes {
    pub(super) recv_depth: usize,
    pub(super) send_depth: usize,
    pub(super) rx_len: usize,
}

impl Io {
    /// A UD QP in RTS with `recv_depth` receives posted.
    pub(super) fn new(
        pd: &Arc<ProtectionDomain>,
        port: u8,
        qkey: u32,
        pool: Pool,
        sizes: Sizes,
    ) -> Result<Arc<Self>, UdError> {
        let ctx = pd.context();
        let send_cq = CompletionQueue::new::<()>(ctx, sizes.send_depth, None, None)
            .map_err(|e| UdError::verbs("ibv_create_cq", e))?;
        let recv_cq = CompletionQueue::with_own_channel(ctx, sizes.recv_depth)
            .map_err(|e| UdError::verbs("ibv_create_cq", e))?;
        let caps = crate::verbs::QpCaps {
            send_wr: sizes.send_depth as u32,
            recv_wr: sizes.recv_depth as u32,
            max_inline: 0,
            srq: None,
        };
        let qp = QueuePair::create_ud(pd, &send_cq, &recv_cq, caps)
            .map_err(|e| UdError::verbs("ibv_create_qp(UD)", e))?;
        qp.ud_ready(port, qkey).map_err(|e| UdError::verbs("ibv_modify_qp(UD → RTS)", e))?;
        let send_hdr = HeaderSlab::new(pd, sizes.send_depth).map_err(UdError::Register)?;
        let io = Arc::new(Self {
            qp,
            send_cq,
            recv_cq,
            send_hdr,
            rx: Mutex::new(RxTable {
                slots: (0..sizes.recv_depth).map(|_| None).collect(),
                free: (0..sizes.recv_depth as u32).rev().collect(),
            }),
            rx_turn: TurnLock::new(RxBatch::new()),
            tx: Mutex::new(TxRing::new(sizes.send_depth)),
            pool,
            pd: pd.clone(),
            port,
            rx_len: sizes.rx_len,
            closing: AtomicBool::new(false),
            counters: Counters::default(),
        });
        for _ in 0..sizes.recv_depth {
            let buf = io
                .pool
                .alloc(io.rx_len, Wait::For(Duration::from_secs(5)))
                .map_err(|e| UdError::Config(format!("no receive buffer of {} bytes: {e}", io.rx_len)))?;
            io.post_recv(buf)?;
        }
        Ok(io)
    }

    /// Post `buf` as a receive of `rx_len` bytes in a free slot.
    fn post_recv(&self, mut buf: Buf) -> Result<(), UdError> {
        let mut t = lock(&self.rx);
        let Some(slot) = t.free.pop() else {
            return Err(UdError::Failed("more receives posted than the receive queue holds".into()));
        };
        buf.set_len(0);
        let mut sge = ibv_sge { addr: buf.addr(), length: self.rx_len as u32, lkey: buf.keys().lkey };
        let mut wr =
            ibv_recv_wr { wr_id: u64::from(slot), next: ptr::null_mut(), sg_list: &mut sge, num_sge: 1 };
        t.slots[slot as usize] = Some(buf);
        // SAFETY: the SGE lies in a pool buffer registered in the QP's PD
        // (its capacity is at least `rx_len`); the buffer stays in the
        // table until the completion for `slot` is polled.
        match unsafe { self.qp.post_recv(&mut wr) } {
            Ok(()) => Ok(()),
            Err(e) => {
                t.slots[slot as usize] = None;
                t.free.push(slot);
                Err(UdError::verbs("ibv_post_recv", e))
            }
        }
    }

    /// Give a received buffer back to the receive queue (the pool, once
    /// the socket is closing or the post fails).
    pub(super) fn repost(&self, buf: Buf) {
        if self.closing.load(Relaxed) {
            return;
        }
        if let Err(e) = self.post_recv(buf) {
            tracing::warn!(error = %e, "cannot repost a UD receive; the receive queue shrinks by one");
        }
    }

    /// Stop reposting: the socket is going away.
    pub(super) fn close(&self) {
        self.closing.store(true, Relaxed);
    }

    /// The next receive completion: from `batch`, or from a fresh poll of
    /// up to [`RECV_BATCH`]. `Some((buf, i))`: the buffer, its length set to
    /// the bytes received, and its completion, `batch.wc(i)`. Failed
    /// completions are counted, reposted and skipped; so are this socket's
    /// own fences (see `post_fence`).
    pub(super) fn poll_recv(&self, batch: &mut RxBatch) -> Result<Option<(Buf, usize)>, UdError> {
        loop {
            if batch.next == batch.len && !self.refill(batch)? {
                return Ok(None);
            }
            let i = batch.next;
            batch.next += 1;
            let Some(mut buf) = batch.bufs[i].take() else {
                let slot = batch.wc(i).wr_id;
                return Err(UdError::Failed(format!("receive completion for unknown slot {slot}")));
            };
            let w = batch.wc(i);
            if w.status != ibv_wc_status::IBV_WC_SUCCESS {
                if !self.closing.load(Relaxed) {
                    self.counters.recv_errors.fetch_add(1, Relaxed);
                    tracing::debug!(status = wc_status_name(w.status), "UD receive failed");
                }
                self.repost(buf);
                continue;
            }
            if w.src_qp == self.qp.qp_num() && w.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 == 0 {
                // A fence this socket sent itself: every datagram it sends
                // carries an immediate.
                self.repost(buf);
                continue;
            }
            buf.set_len((w.byte_len as usize).min(self.rx_len));
            return Ok(Some((buf, i)));
        }
    }

    /// Poll a batch of receive completions and take their buffers out of
    /// the receive table; `false` when there were none.
    fn refill(&self, batch: &mut RxBatch) -> Result<bool, UdError> {
        let n = self.recv_cq.poll(&mut batch.wcs).map_err(|e| UdError::verbs("ibv_poll_cq", e))?;
        batch.next = 0;
        batch.len = n;
        if n == 0 {
            return Ok(false);
        }
        let mut t = lock(&self.rx);
        for i in 0..n {
            let slot = batch.wc(i).wr_id as usize;
            batch.bufs[i] = t.slots.get_mut(slot).and_then(Option::take);
            if batch.bufs[i].is_some() {
                t.free.push(slot as u32);
            }
        }
        Ok(true)
    }

    /// Wait up to `ms` for a receive completion event (after arming).
    pub(super) fn wait_recv(&self, ms: i32) -> Result<(), UdError> {
        self.recv_cq.arm().map_err(|e| UdError::verbs("ibv_req_notify_cq", e))?;
        self.recv_cq.wait(ms).map_err(|e| UdError::verbs("ibv_get_cq_event", e))?;
        Ok(())
    }

    /// Whether a completion may be waiting (armed CQs miss nothing polled after arming).
    pub(super) fn arm_recv(&self) -> Result<(), UdError> {
        self.recv_cq.arm().map_err(|e| UdError::verbs("ibv_req_notify_cq", e))
    }

    /// Take the completion events already on the receive CQ's channel,
    /// then arm it: the channel is readable again only for a completion
    /// after this.
    pub(super) fn rearm_recv(&self) -> Result<(), UdError> {
        self.recv_cq.take_events();
        self.arm_recv()
    }

    /// A duplicate of the receive CQ's channel descriptor.
    pub(super) fn recv_readiness_fd(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        match self.recv_cq.channel_fd() {
            Some(fd) => fd.try_clone_to_owned(),
            None => Err(std::io::Error::other("the UD receive CQ has no completion channel")),
        }
    }
}
