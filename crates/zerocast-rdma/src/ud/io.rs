//! The data path of a UD socket: the queue pair, its two CQs, the posted
//! receives and the sends in flight.
//!
//! Ownership follows the verbs contract: a posted receive buffer sits in
//! the receive table under its `wr_id` until its completion is polled; a
//! sent buffer (and the address handle it was sent with) sits in the send
//! table until its completion is polled. Every send is signalled; senders
//! reap the send CQ as they go. Receivers poll the receive CQ themselves,
//! one at a time, sleeping on its completion channel.

use std::mem::MaybeUninit;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdma_sys::{ibv_recv_wr, ibv_send_flags, ibv_send_wr, ibv_sge, ibv_wc, ibv_wc_status, ibv_wr_opcode};
use zerocast_core::HEADER_LEN;
use zerocast_mem::{Buf, Pool, Wait};

use super::UdError;
use crate::device::ProtectionDomain;
use crate::rc::wc_status_name;
use crate::verbs::{AddressHandle, CompletionQueue, HeaderSlab, QueuePair};

/// Send completions taken per `ibv_poll_cq` call.
const REAP_BATCH: usize = 16;

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Debug)]
struct RxTable {
    slots: Vec<Option<Buf>>,
    free: Vec<u32>,
}

/// One send in flight: its payload and the AH it was sent with.
type InFlight = (Buf, Arc<AddressHandle>);

#[derive(Debug)]
struct TxTable {
    slots: Vec<Option<InFlight>>,
    free: Vec<u32>,
}

/// Counters of the data path.
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) sent: AtomicU64,
    pub(super) send_errors: AtomicU64,
    pub(super) received: AtomicU64,
    pub(super) dropped_malformed: AtomicU64,
    pub(super) recv_errors: AtomicU64,
}

/// Where a send goes.
pub(super) struct Route<'a> {
    pub(super) ah: &'a Arc<AddressHandle>,
    pub(super) qpn: u32,
    pub(super) qkey: u32,
}

/// Everything the socket, its received datagrams and its rdma_cm thread
/// share. Field order is drop order: the QP goes first, so no buffer in
/// the tables is still in the device's hands when the tables drop.
#[derive(Debug)]
pub(crate) struct Io {
    pub(super) qp: QueuePair,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
    send_hdr: HeaderSlab,
    rx: Mutex<RxTable>,
    /// Receivers take turns polling the receive CQ.
    pub(super) rx_turn: Mutex<()>,
    tx: Mutex<TxTable>,
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
        let send_cq = CompletionQueue::new(ctx, sizes.send_depth, false)
            .map_err(|e| UdError::verbs("ibv_create_cq", e))?;
        let recv_cq = CompletionQueue::new(ctx, sizes.recv_depth, true)
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
            rx_turn: Mutex::new(()),
            tx: Mutex::new(TxTable {
                slots: (0..sizes.send_depth).map(|_| None).collect(),
                free: (0..sizes.send_depth as u32).rev().collect(),
            }),
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

    /// Poll one receive completion. `Some((buf, wc))` with the buffer's
    /// length set to the bytes received; failed completions are counted,
    /// reposted and skipped.
    pub(super) fn poll_recv(&self, wc: &mut MaybeUninit<ibv_wc>) -> Result<Option<Buf>, UdError> {
        loop {
            let n =
                self.recv_cq.poll(std::slice::from_mut(wc)).map_err(|e| UdError::verbs("ibv_poll_cq", e))?;
            if n == 0 {
                return Ok(None);
            }
            // SAFETY: the poll wrote one completion.
            let w = unsafe { wc.assume_init_ref() };
            let slot = w.wr_id as usize;
            let buf = lock(&self.rx).slots.get_mut(slot).and_then(Option::take);
            let Some(mut buf) = buf else {
                return Err(UdError::Failed(format!("receive completion for unknown slot {slot}")));
            };
            lock(&self.rx).free.push(slot as u32);
            if w.status != ibv_wc_status::IBV_WC_SUCCESS {
                if !self.closing.load(Relaxed) {
                    self.counters.recv_errors.fetch_add(1, Relaxed);
                    tracing::debug!(status = wc_status_name(w.status), "UD receive failed");
                }
                self.repost(buf);
                continue;
            }
            buf.set_len((w.byte_len as usize).min(self.rx_len));
            return Ok(Some(buf));
        }
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

    /// Free the slots of completed sends (their buffers go back to the pool).
    fn reap(&self, t: &mut TxTable) {
        let mut wcs = [const { MaybeUninit::<ibv_wc>::uninit() }; REAP_BATCH];
        loop {
            let n = match self.send_cq.poll(&mut wcs) {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(error = %e, "polling the UD send CQ failed");
                    return;
                }
            };
            for wc in &wcs[..n] {
                // SAFETY: the poll wrote the first `n` entries.
                let wc = unsafe { wc.assume_init_ref() };
                let slot = wc.wr_id as usize;
                if let Some(entry) = t.slots.get_mut(slot).and_then(Option::take) {
                    drop(entry);
                    t.free.push(slot as u32);
                }
                if wc.status != ibv_wc_status::IBV_WC_SUCCESS {
                    self.counters.send_errors.fetch_add(1, Relaxed);
                    tracing::debug!(status = wc_status_name(wc.status), "UD send failed");
                }
            }
            if n < REAP_BATCH {
                return;
            }
        }
    }

    /// Wait until every send posted so far has completed (or `deadline`).
    pub(super) fn flush(&self, deadline: Instant) -> bool {
        loop {
            let mut t = lock(&self.tx);
            self.reap(&mut t);
            if t.free.len() == t.slots.len() {
                return true;
            }
            drop(t);
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::yield_now();
        }
    }

    /// Post one datagram: `header` (unless raw) and the payload `buf`.
    /// Waits for a free send slot until `deadline`.
    pub(super) fn send(
        &self,
        buf: Buf,
        header: Option<[u8; HEADER_LEN]>,
        route: &Route<'_>,
        deadline: Instant,
    ) -> Result<(), (Buf, UdError)> {
        let mut t = lock(&self.tx);
        let slot = loop {
            self.reap(&mut t);
            if let Some(s) = t.free.pop() {
                break s;
            }
            if Instant::now() >= deadline {
                return Err((buf, UdError::SendQueueFull(Duration::ZERO)));
            }
            drop(t);
            std::thread::yield_now();
            t = lock(&self.tx);
        };
        let mut sges = [ibv_sge { addr: 0, length: 0, lkey: 0 }; 2];
        let mut n = 0;
        if let Some(h) = header {
            self.send_hdr.write(slot as usize, &h);
            sges[0] = ibv_sge {
                addr: self.send_hdr.addr(slot as usize),
                length: HEADER_LEN as u32,
                lkey: self.send_hdr.lkey(),
            };
            n = 1;
        }
        if !buf.is_empty() {
            sges[n] = ibv_sge { addr: buf.addr(), length: buf.len() as u32, lkey: buf.keys().lkey };
            n += 1;
        }
        // SAFETY: all-zero is a valid `ibv_send_wr` (null pointers, zero counts).
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = u64::from(slot);
        wr.sg_list = sges.as_mut_ptr();
        wr.num_sge = n as i32;
        // With immediate data, the sender's QPN, as rdma_cm multicast peers expect.
        wr.opcode = ibv_wr_opcode::IBV_WR_SEND_WITH_IMM;
        wr.imm_data_invalidated_rkey_union.imm_data = self.qp.qp_num().to_be();
        wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        wr.wr.ud = rdma_sys::ud_t { ah: route.ah.as_ptr(), remote_qpn: route.qpn, remote_qkey: route.qkey };
        t.slots[slot as usize] = Some((buf, route.ah.clone()));
        // SAFETY: the SGEs point into the registered header slab (kept in
        // `self`) and a registered pool buffer, which stays in the send table
        // (with the AH) until this send's completion is polled.
        match unsafe { self.qp.post_send(std::slice::from_mut(&mut wr)) } {
            Ok(()) => {
                self.counters.sent.fetch_add(1, Relaxed);
                Ok(())
            }
            Err((_, e)) => {
                let (buf, _) = t.slots[slot as usize].take().expect("just stored");
                t.free.push(slot);
                Err((buf, UdError::verbs("ibv_post_send", e)))
            }
        }
    }
}
