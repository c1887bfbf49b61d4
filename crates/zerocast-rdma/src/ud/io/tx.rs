//! The send side of a UD socket's data path: posting datagrams, one at a
//! time or as chains of work requests (one system call per chain), and
//! reaping their completions.

use std::mem::MaybeUninit;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use rdma_sys::{ibv_send_flags, ibv_send_wr, ibv_sge, ibv_wc, ibv_wc_status, ibv_wr_opcode};
use zerocast_core::HEADER_LEN;
use zerocast_mem::Buf;

use super::{lock, Io, Route, TxRing, REAP_BATCH};
use crate::rc::wc_status_name;
use crate::send_ring::Reserved;
use crate::ud::UdError;

/// The most datagrams posted as one chain.
pub(in crate::ud) const CHAIN: usize = 32;

/// One datagram to post: its payload, its header (none on a raw socket),
/// and where it goes.
pub(in crate::ud) struct Outgoing {
    pub(in crate::ud) buf: Buf,
    pub(in crate::ud) header: Option<[u8; HEADER_LEN]>,
    pub(in crate::ud) route: Route,
}

impl Io {
    /// Account for completed sends (their buffers go back to the pool).
    fn reap(&self, t: &mut TxRing) {
        let mut wcs = [const { MaybeUninit::<ibv_wc>::uninit() }; REAP_BATCH];
        if t.outstanding() == 0 {
            return;
        }
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
                t.complete_through(wc.wr_id);
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
    /// Sends after the last signalled one are followed by a fence, an
    /// empty signalled send over `fence_route` (the socket itself), which
    /// completes after them; without a route, the wait may end `false`.
    pub(in crate::ud) fn flush(&self, deadline: Instant, fence_route: &dyn Fn() -> Option<Route>) -> bool {
        let mut route = None;
        loop {
            let mut t = lock(&self.tx);
            self.reap(&mut t);
            if t.outstanding() == 0 {
                return true;
            }
            if t.fence_due() && !t.is_full() {
                drop(t);
                if route.is_none() {
                    route = fence_route();
                }
                t = lock(&self.tx);
                if let Some(r) = &route {
                    if t.fence_due() && !t.is_full() {
                        if let Err(e) = self.post(&mut t, None, None, r.clone(), true) {
                            tracing::debug!(error = %e.1, "posting a UD send fence failed");
                        }
                    }
                }
            }
            drop(t);
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::yield_now();
        }
    }

    /// The send ring with at least one free slot, waiting for one for up
    /// to `timeout` (the clock is read only then: on some machines a clock
    /// read is a system call); `None` when none came free.
    fn tx_with_room(&self, timeout: Duration) -> Option<MutexGuard<'_, TxRing>> {
        let mut t = lock(&self.tx);
        // Poll only while a signalled send is out, and at most once per
        // signalled send's worth of sends.
        if t.awaits_completion() && t.outstanding() as u64 >= t.signal_every() {
            self.reap(&mut t);
        }
        let mut deadline = None;
        while t.is_full() {
            self.reap(&mut t);
            if !t.is_full() {
                break;
            }
            let now = Instant::now();
            if now >= *deadline.get_or_insert(now + timeout) {
                return None;
            }
            drop(t);
            std::thread::yield_now();
            t = lock(&self.tx);
        }
        Some(t)
    }

    /// Post one datagram: `header` (unless raw) and the payload `buf`.
    /// Waits for a free send slot for up to `timeout`.
    pub(in crate::ud) fn send(
        &self,
        buf: Buf,
        header: Option<[u8; HEADER_LEN]>,
        route: Route,
        timeout: Duration,
    ) -> Result<(), (Buf, UdError)> {
        let Some(mut t) = self.tx_with_room(timeout) else {
            return Err((buf, UdError::SendQueueFull(Duration::ZERO)));
        };
        match self.post(&mut t, Some(buf), header, route, false) {
            Ok(()) => {
                self.counters.sent.fetch_add(1, Relaxed);
                Ok(())
            }
            Err((buf, e)) => Err((buf.expect("a payload was given"), e)),
        }
    }

    /// Post the datagrams of `items`, in order, as chains of up to
    /// [`CHAIN`] work requests (each as long as the free slots allow),
    /// waiting for free slots for up to `timeout` each time. Each posted
    /// datagram is taken out of its entry; on error the entries from the
    /// first that was not posted on are left as they were.
    pub(in crate::ud) fn send_chain(
        &self,
        items: &mut [Option<Outgoing>],
        timeout: Duration,
    ) -> Result<(), UdError> {
        // Written one by one below, not zeroed here as a whole: the list
        // is 4 KiB.
        let mut wrs = [const { MaybeUninit::<ibv_send_wr>::uninit() }; CHAIN];
        let mut sges = [[ibv_sge { addr: 0, length: 0, lkey: 0 }; 2]; CHAIN];
        let mut reserved: [Option<Reserved>; CHAIN] = [None; CHAIN];
        let mut done = 0;
        while done < items.len() {
            let Some(mut t) = self.tx_with_room(timeout) else {
                return Err(UdError::SendQueueFull(Duration::ZERO));
            };
            let rest = &mut items[done..];
            let mut n = 0;
            while n < rest.len().min(t.max_chain()).min(CHAIN) {
                let Some(o) = rest[n].as_mut() else { break };
                let Some(r) = t.reserve(false) else { break };
                wrs[n].write(self.prepare(&r, Some(&mut o.buf), o.header.as_ref(), &o.route, &mut sges[n]));
                reserved[n] = Some(r);
                n += 1;
            }
            // SAFETY: the first `n` entries were written just above.
            let wrs = unsafe { std::slice::from_raw_parts_mut(wrs.as_mut_ptr().cast::<ibv_send_wr>(), n) };
            for i in 0..n {
                wrs[i].sg_list = sges[i].as_mut_ptr();
                wrs[i].next =
                    if i + 1 < n { &mut wrs[i + 1] as *mut ibv_send_wr } else { std::ptr::null_mut() };
            }
            // SAFETY: as in `post`, for each WR of the chain: its SGEs
            // point into a registered pool buffer held in `rest` until
            // the ring takes it below, or into the header slab.
            let result = unsafe { self.qp.post_send(wrs) };
            let posted = match &result {
                Ok(()) => n,
                Err((posted, _)) => *posted,
            };
            for (entry, r) in rest.iter_mut().zip(reserved.iter_mut()).take(posted) {
                if let (Some(o), Some(r)) = (entry.take(), r.take()) {
                    t.posted(&r, Some((Some(o.buf), o.route.ah)));
                }
            }
            self.counters.sent.fetch_add(posted as u64, Relaxed);
            if let Err((_, e)) = result {
                if let Some(r) = reserved[posted].take() {
                    t.unreserve_from(r.seq);
                }
                return Err(UdError::verbs("ibv_post_send", e));
            }
            if n == 0 {
                return Err(UdError::Failed("an empty entry in a send chain".into()));
            }
            done += n;
        }
        Ok(())
    }

    /// Post one send in the next slot of `t` (not full): a datagram, or,
    /// with no header and no buffer, a fence (an empty send without
    /// immediate data, which receivers of this socket skip).
    fn post(
        &self,
        t: &mut TxRing,
        buf: Option<Buf>,
        header: Option<[u8; HEADER_LEN]>,
        route: Route,
        force_signal: bool,
    ) -> Result<(), (Option<Buf>, UdError)> {
        let Some(r) = t.reserve(force_signal) else {
            return Err((buf, UdError::SendQueueFull(Duration::ZERO)));
        };
        let mut buf = buf;
        let mut sges = [ibv_sge { addr: 0, length: 0, lkey: 0 }; 2];
        let mut wr = self.prepare(&r, buf.as_mut(), header.as_ref(), &route, &mut sges);
        wr.sg_list = sges.as_mut_ptr();
        // SAFETY: the SGEs point into a registered pool buffer (its payload,
        // and a trailer only within its capacity) and the registered header
        // slab (kept in `self`); the ring holds the buffer (with the AH)
        // until a completion for this send or a later one is polled.
        match unsafe { self.qp.post_send(std::slice::from_mut(&mut wr)) } {
            Ok(()) => {
                t.posted(&r, Some((buf, route.ah)));
                Ok(())
            }
            Err((_, e)) => {
                t.unreserve(&r);
                Err((buf, UdError::verbs("ibv_post_send", e)))
            }
        }
    }

    /// The work request of reserved send `r`, with its scatter list filled
    /// in `sges` (`sg_list` is the caller's to set): the payload, then the
    /// header, in the spare room of the payload's buffer when there is
    /// some (one scatter entry, as `ib_send_bw` posts), else from the
    /// header slab (two).
    fn prepare(
        &self,
        r: &Reserved,
        buf: Option<&mut Buf>,
        header: Option<&[u8; HEADER_LEN]>,
        route: &Route,
        sges: &mut [ibv_sge; 2],
    ) -> ibv_send_wr {
        let mut trailer_in_buf = false;
        let has_buf = buf.is_some();
        let mut n = 0;
        if let Some(b) = buf {
            if let Some(h) = header {
                let len = b.len();
                if let Some(room) = b.spare_capacity().get_mut(len..len + HEADER_LEN) {
                    room.copy_from_slice(h);
                    trailer_in_buf = true;
                }
            }
            if !b.is_empty() || trailer_in_buf {
                let len = b.len() + if trailer_in_buf { HEADER_LEN } else { 0 };
                sges[0] = ibv_sge { addr: b.addr(), length: len as u32, lkey: b.keys().lkey };
                n = 1;
            }
        }
        if let Some(h) = header.filter(|_| !trailer_in_buf) {
            self.send_hdr.write(r.slot, h);
            sges[n] = ibv_sge {
                addr: self.send_hdr.addr(r.slot),
                length: HEADER_LEN as u32,
                lkey: self.send_hdr.lkey(),
            };
            n += 1;
        }
        let mut wr = zeroed_wr();
        wr.wr_id = r.seq;
        wr.num_sge = n as i32;
        if has_buf {
            // With immediate data, the sender's QPN, as rdma_cm multicast peers expect.
            wr.opcode = ibv_wr_opcode::IBV_WR_SEND_WITH_IMM;
            wr.imm_data_invalidated_rkey_union.imm_data = self.qp.qp_num().to_be();
        } else {
            wr.opcode = ibv_wr_opcode::IBV_WR_SEND;
        }
        if r.signal {
            wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        wr.wr.ud = rdma_sys::ud_t { ah: route.ah.as_ptr(), remote_qpn: route.qpn, remote_qkey: route.qkey };
        wr
    }
}

fn zeroed_wr() -> ibv_send_wr {
    // SAFETY: all-zero is a valid `ibv_send_wr` (null pointers, zero counts).
    unsafe { std::mem::zeroed() }
}
