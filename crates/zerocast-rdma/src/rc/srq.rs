//! A listener's shared receive queue: one SRQ whose receives serve every
//! connection the listener accepts, as in the SRQ example of the Mellanox
//! manual.
//!
//! **Credits stay exact.** Let `c_i` be the receives connection `i`'s peer
//! may still consume: its credits plus its frames in flight (at most its
//! window), plus the rendezvous finishes it may still send us (at most
//! [`RENDEZVOUS_RECEIVES`](super::RENDEZVOUS_RECEIVES)). Their sum `W` is
//! the connection's *share*. The SRQ is safe from RNR while
//! `posted ≥ Σ c_i`. That holds because:
//!
//! - a received frame consumes one posted receive and one of `c_i`;
//! - a released buffer is posted to the SRQ *before* its credit returns
//!   (the connection's reposter does both, in that order); when the SRQ is
//!   already full the buffer goes back to the pool instead, and then
//!   `posted = capacity ≥ live·W ≥ Σ c_i` still;
//! - admission: at most `capacity / W` connections, and before one is
//!   admitted the SRQ is filled until `posted ≥ (live + 1)·W`, so the
//!   newcomer's `W` credits are backed even if every other peer spends all
//!   of its own. A connection over the limit is refused
//!   ([`RcError::SrqFull`]); the SRQ does not grow;
//! - a connection's share is released only when its QP is destroyed, so
//!   its peer can no longer consume anything.
//!
//! A receive completes on the CQ of the QP that consumed it, so the slot
//! table (`wr_id` → buffer) lives here, shared by every connection.
//! Buffers can leave the SRQ for good (released after their connection
//! closed, or completed on a QP that is being torn down): nothing is
//! unsafe then, the SRQ just runs lower. The SRQ limit
//! (`IBV_EVENT_SRQ_LIMIT_REACHED`, armed with `ibv_modify_srq`) fires when
//! fewer than `limit` receives are posted; the handler refills the SRQ from
//! the pool and re-arms it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use rdma_sys::{ibv_recv_wr, ibv_sge, ibv_wc};
use zerocast_mem::{Buf, Pool, Wait};

use super::engine::RECV_BIT;
use super::RcError;
use crate::device::ProtectionDomain;
use crate::srq::{AsyncEvents, LimitHandler, Srq};
use crate::verbs::CompletionQueue;

/// Counters of a listener's shared receive queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SrqStats {
    /// Receives the SRQ holds when full.
    pub capacity: usize,
    /// Receives (credits) each connection is given.
    pub share: usize,
    /// Connections the SRQ can serve (`capacity / share`).
    pub max_connections: usize,
    /// Connections admitted now.
    pub connections: usize,
    /// Receives posted now.
    pub posted: usize,
    /// The low watermark the SRQ limit event is armed with.
    pub limit: u32,
    /// `IBV_EVENT_SRQ_LIMIT_REACHED` events handled.
    pub limit_events: u64,
    /// Fresh buffers posted by those events' refills.
    pub event_refills: u64,
    /// Fresh buffers posted when connections were admitted (and at creation).
    pub admission_refills: u64,
    /// Released buffers returned to the pool because the SRQ was full.
    pub dropped_when_full: u64,
}

#[derive(Debug)]
struct Table {
    slots: Vec<Option<Buf>>,
    free: Vec<u32>,
    posted: usize,
    connections: usize,
}

/// One SRQ, its receive slots and their header slab.
#[derive(Debug)]
pub(crate) struct SharedRecv {
    // Drop order: the SRQ goes first (no QP holds it any more: each
    // connection holding one holds this), then the buffers it pointed at.
    srq: Arc<Srq>,
    table: Mutex<Table>,
    /// Serialises admissions (each fills, then counts itself in).
    admit: Mutex<()>,
    pool: Pool,
    buf_size: usize,
    share: usize,
    limit: u32,
    limit_events: AtomicU64,
    event_refills: AtomicU64,
    admission_refills: AtomicU64,
    dropped_when_full: AtomicU64,
    /// Told when this goes, so its reader can end (see `AsyncEvents`).
    events: Arc<AsyncEvents>,
}

impl Drop for SharedRecv {
    fn drop(&mut self) {
        self.events.handler_gone();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The SRQ settings of a listener.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SrqSizes {
    pub(crate) capacity: usize,
    pub(crate) share: usize,
    pub(crate) limit: u32,
    pub(crate) buf_size: usize,
}

impl SharedRecv {
    /// Create the SRQ, post `capacity` receives and arm its limit.
    pub(crate) fn new(
        pd: &Arc<ProtectionDomain>,
        pool: Pool,
        sizes: SrqSizes,
        events: &Arc<AsyncEvents>,
    ) -> Result<Arc<Self>, RcError> {
        let SrqSizes { capacity, share, limit, buf_size } = sizes;
        if share == 0 || capacity < share {
            return Err(RcError::Config(format!(
                "an SRQ of {capacity} receives cannot give a connection its window of {share}"
            )));
        }
        let max_wr = pd.context().attr().max_srq_wr as usize;
        if capacity > max_wr {
            return Err(RcError::Config(format!("srq={capacity} exceeds the device's max_srq_wr {max_wr}")));
        }
        let srq = Srq::new(pd, capacity as u32).map_err(|e| RcError::verbs("ibv_create_srq", e))?;
        let shared = Arc::new(Self {
            srq,
            table: Mutex::new(Table {
                slots: (0..capacity).map(|_| None).collect(),
                free: (0..capacity as u32).rev().collect(),
                posted: 0,
                connections: 0,
            }),
            admit: Mutex::new(()),
            pool,
            buf_size,
            share,
            limit,
            limit_events: AtomicU64::new(0),
            event_refills: AtomicU64::new(0),
            admission_refills: AtomicU64::new(0),
            dropped_when_full: AtomicU64::new(0),
            events: events.clone(),
        });
        shared.fill(Wait::For(Duration::from_secs(5)), &shared.admission_refills)?;
        let handler: Weak<dyn LimitHandler> = Arc::downgrade(&shared) as Weak<dyn LimitHandler>;
        events.register(&shared.srq, handler).map_err(|e| RcError::verbs("reading async events", e))?;
        shared.srq.arm(limit).map_err(|e| RcError::verbs("ibv_modify_srq(srq_limit)", e))?;
        tracing::debug!(capacity, share, limit, "shared receive queue ready");
        Ok(shared)
    }

    pub(crate) fn srq(&self) -> &Arc<Srq> {
        &self.srq
    }

    fn capacity(&self) -> usize {
        lock(&self.table).slots.len()
    }

    /// Admit one more connection, or refuse it when the SRQ has no share
    /// left (or the pool cannot back one).
    pub(crate) fn admit(self: &Arc<Self>) -> Result<Member, RcError> {
        let _one = lock(&self.admit);
        let capacity = self.capacity();
        let live = lock(&self.table).connections;
        let full = || RcError::SrqFull { connections: live, capacity, share: self.share };
        if (live + 1) * self.share > capacity {
            return Err(full());
        }
        self.fill(Wait::For(Duration::from_secs(5)), &self.admission_refills)?;
        let mut t = lock(&self.table);
        // Every live peer may spend its whole share; the newcomer's must be
        // posted on top of that.
        if t.posted < (t.connections + 1) * self.share {
            return Err(RcError::Config(format!(
                "the pool could not back a connection's {} shared receives ({} posted)",
                self.share, t.posted
            )));
        }
        t.connections += 1;
        Ok(Member { shared: self.clone(), cq: None })
    }

    /// Post fresh pool buffers into every free slot; returns how many.
    fn fill(&self, wait: Wait, counter: &AtomicU64) -> Result<usize, RcError> {
        let want = {
            let t = lock(&self.table);
            t.slots.len() - t.posted
        };
        let mut bufs = Vec::with_capacity(want);
        for _ in 0..want {
            match self.pool.alloc(self.buf_size, wait) {
                Ok(b) => bufs.push(b),
                Err(e) => {
                    tracing::debug!(error = %e, "SRQ refill: pool has no more receive buffers");
                    break;
                }
            }
        }
        let mut n = 0;
        let mut t = lock(&self.table);
        for buf in bufs {
            // A slot taken meanwhile by a repost: the buffer goes back to the pool.
            if self.post_locked(&mut t, buf)? {
                n += 1;
            }
        }
        counter.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }

    /// Post `buf` into a free slot; `false` (and the buffer back to the
    /// pool) when the SRQ is full.
    fn post_locked(&self, t: &mut Table, buf: Buf) -> Result<bool, RcError> {
        let Some(slot) = t.free.pop() else {
            drop(buf);
            return Ok(false);
        };
        let cap = u32::try_from(buf.capacity()).unwrap_or(u32::MAX);
        let mut sge = ibv_sge { addr: buf.addr(), length: cap, lkey: buf.keys().lkey };
        let mut wr = ibv_recv_wr {
            wr_id: RECV_BIT | u64::from(slot),
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        t.slots[slot as usize] = Some(buf);
        // SAFETY: the SGE covers a pool buffer registered in the SRQ's PD;
        // the buffer stays in the table until a completion for the slot is
        // polled or the SRQ (destroyed first) is gone.
        match unsafe { self.srq.post_recv(&mut wr) } {
            Ok(()) => {
                t.posted += 1;
                Ok(true)
            }
            Err(e) => {
                t.slots[slot as usize] = None;
                t.free.push(slot);
                Err(RcError::verbs("ibv_post_srq_recv", e))
            }
        }
    }

    /// Post a released buffer again (before its credit returns).
    pub(crate) fn repost(&self, buf: Buf) -> Result<(), RcError> {
        let mut t = lock(&self.table);
        if !self.post_locked(&mut t, buf)? {
            self.dropped_when_full.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// The buffer of a completed receive in `slot`.
    pub(crate) fn take(&self, slot: usize) -> Option<Buf> {
        let mut t = lock(&self.table);
        let buf = t.slots.get_mut(slot).and_then(Option::take)?;
        t.posted -= 1;
        t.free.push(slot as u32);
        Some(buf)
    }

    /// The counters.
    pub(crate) fn stats(&self) -> SrqStats {
        let t = lock(&self.table);
        let capacity = t.slots.len();
        SrqStats {
            capacity,
            share: self.share,
            max_connections: capacity / self.share,
            connections: t.connections,
            posted: t.posted,
            limit: self.limit,
            limit_events: self.limit_events.load(Ordering::Relaxed),
            event_refills: self.event_refills.load(Ordering::Relaxed),
            admission_refills: self.admission_refills.load(Ordering::Relaxed),
            dropped_when_full: self.dropped_when_full.load(Ordering::Relaxed),
        }
    }
}

impl LimitHandler for SharedRecv {
    fn limit_reached(&self) {
        self.limit_events.fetch_add(1, Ordering::Relaxed);
        // Never block the event thread on the pool: take what is free now.
        match self.fill(Wait::No, &self.event_refills) {
            Ok(n) => tracing::debug!(refilled = n, "SRQ limit reached: refilled"),
            Err(e) => tracing::warn!(error = %e, "SRQ limit reached: refill failed"),
        }
        if let Err(e) = self.srq.arm(self.limit) {
            tracing::warn!(error = %e, "re-arming the SRQ limit failed");
        }
    }
}

/// One admitted connection's hold on the SRQ. Lives in the connection's
/// `Io` after its QP, so the share is released only once the QP is gone.
#[derive(Debug)]
pub(crate) struct Member {
    shared: Arc<SharedRecv>,
    /// The connection's CQ, drained of leftover receive completions on drop.
    cq: Option<Arc<CompletionQueue>>,
}

impl Member {
    /// Attach the connection's CQ.
    pub(crate) fn with_cq(mut self, cq: &Arc<CompletionQueue>) -> Self {
        self.cq = Some(cq.clone());
        self
    }

    pub(crate) fn shared(&self) -> &Arc<SharedRecv> {
        &self.shared
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        // Receives this QP consumed whose completions were never polled (a
        // connection torn down mid-stream) free their slots here.
        if let Some(cq) = &self.cq {
            let mut wcs: [std::mem::MaybeUninit<ibv_wc>; 16] =
                std::array::from_fn(|_| std::mem::MaybeUninit::uninit());
            while let Ok(n @ 1..) = cq.poll(&mut wcs) {
                for wc in &wcs[..n] {
                    // SAFETY: `ibv_poll_cq` initialised the first `n` entries.
                    let wr_id = unsafe { wc.assume_init_ref() }.wr_id;
                    if wr_id & RECV_BIT != 0 {
                        drop(self.shared.take((wr_id & !RECV_BIT) as usize));
                    }
                }
            }
        }
        let mut t = lock(&self.shared.table);
        t.connections = t.connections.saturating_sub(1);
    }
}
