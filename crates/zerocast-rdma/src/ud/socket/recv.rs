//! A [`UdSocket`]'s receive path: one receiving thread (or task) at a
//! time takes the turn, polls the receive CQ, checks each datagram and
//! learns its source's route; what it drops goes straight back to the
//! receive queue.

use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use rdma_sys::ibv_wc;
use zerocast_core::{ConnError, RecvError, SeqTracker, HEADER_LEN};
use zerocast_mem::Buf;

use super::super::datagram::{self, grh_source, UdDatagram, GRH_LEN};
use super::super::io::lock;
use super::super::{UdError, RDMA_UDP_QKEY};
use super::{Dest, UdSocket};
use crate::verbs::AddressHandle;

/// How a receive waits.
#[derive(Clone, Copy)]
enum Mode {
    Block(Option<Instant>),
    Try,
    /// As `Try`, but leave the receive CQ armed when empty.
    Arm,
}

impl UdSocket {
    /// Receive one datagram and its source, waiting until `deadline`
    /// (`None`: forever). Malformed datagrams are dropped and counted on
    /// the way.
    ///
    /// # Errors
    ///
    /// [`RecvError::Timeout`] when the deadline passes (also while another
    /// thread is receiving); [`RecvError::Failed`] on a verbs error.
    pub fn recv_from(&self, deadline: Option<Instant>) -> Result<(UdDatagram, SocketAddr), RecvError> {
        self.recv(Mode::Block(deadline))
    }

    /// Receive a datagram if one has arrived, else [`RecvError::Empty`]
    /// (also while another thread is receiving).
    pub fn try_recv_from(&self) -> Result<(UdDatagram, SocketAddr), RecvError> {
        self.recv(Mode::Try)
    }

    /// Receive a datagram if one has arrived; otherwise
    /// [`RecvError::Empty`] with the receive CQ armed, so that the next
    /// arrival makes [`UdSocket::readiness_fd`] readable (the completion
    /// events already on it are taken first, so it is readable only for
    /// what comes after). [`RecvError::Timeout`] while another thread is
    /// receiving: try again, nothing was armed. For an event loop.
    pub fn try_recv_armed(&self) -> Result<(UdDatagram, SocketAddr), RecvError> {
        self.recv(Mode::Arm)
    }

    /// After [`UdSocket::try_recv_armed`] found another thread receiving:
    /// have `waker` woken when that receive is over. `false` if it is
    /// over already (try again now).
    pub fn wake_when_free(&self, waker: &std::task::Waker) -> bool {
        self.io.rx_turn.wake_when_free(waker)
    }

    /// A duplicate of the receive CQ's completion channel descriptor,
    /// readable once a completion arrives on a CQ that
    /// [`UdSocket::try_recv_armed`] left armed.
    pub fn readiness_fd(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        self.io.recv_readiness_fd()
    }

    fn recv(&self, mode: Mode) -> Result<(UdDatagram, SocketAddr), RecvError> {
        let failed = |e: UdError| RecvError::Failed(ConnError::transport(e));
        let mut batch = match mode {
            Mode::Try => self.io.rx_turn.try_lock().ok_or(RecvError::Empty)?,
            Mode::Arm => self.io.rx_turn.try_lock().ok_or(RecvError::Timeout)?,
            Mode::Block(d) => self.io.rx_turn.lock(d).ok_or(RecvError::Timeout)?,
        };
        let mut armed = false;
        loop {
            if let Some((buf, i)) = self.io.poll_recv(&mut batch).map_err(failed)? {
                armed = false;
                if let Some(r) = self.accept(buf, batch.wc(i)) {
                    return Ok(r);
                }
                continue;
            }
            let deadline = match mode {
                Mode::Block(deadline) => deadline,
                Mode::Arm if !armed => {
                    self.io.rearm_recv().map_err(failed)?;
                    armed = true;
                    continue;
                }
                Mode::Arm | Mode::Try => return Err(RecvError::Empty),
            };
            if !armed {
                // Arm, then poll once more: a completion that came before
                // the arm is found by that poll, one after it wakes the wait.
                self.io.arm_recv().map_err(failed)?;
                armed = true;
                continue;
            }
            // Nothing else needs this thread: the socket cannot close
            // while it receives (it is borrowed), so the wait lasts until a
            // datagram or the deadline.
            let ms = match deadline {
                None => -1,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(RecvError::Timeout);
                    }
                    left.as_millis().clamp(1, i32::MAX as u128) as i32
                }
            };
            self.io.wait_recv(ms).map_err(failed)?;
            armed = false;
        }
    }

    /// Turn a received buffer into a datagram and its source, or drop it.
    fn accept(&self, buf: Buf, wc: &ibv_wc) -> Option<(UdDatagram, SocketAddr)> {
        let c = &self.io.counters;
        let mut grh = [0u8; GRH_LEN];
        let ip = match buf.get(..GRH_LEN) {
            Some(g) => {
                grh.copy_from_slice(g);
                grh_source(&grh)
            }
            None => None,
        };
        let Some(ip) = ip else {
            c.dropped_malformed.fetch_add(1, Relaxed);
            tracing::debug!(len = buf.len(), "dropped UD datagram without a usable GRH");
            self.io.repost(buf);
            return None;
        };
        if self.cfg.raw {
            c.received.fetch_add(1, Relaxed);
            let from = SocketAddr::new(ip, 0);
            return Some((UdDatagram::new(buf, GRH_LEN, 0, self.io.clone()), from));
        }
        let h = match datagram::check(&buf[GRH_LEN..], self.max_datagram) {
            Ok(h) => h,
            Err(why) => {
                c.dropped_malformed.fetch_add(1, Relaxed);
                tracing::debug!(%ip, len = buf.len(), %why, "dropped malformed UD datagram");
                self.io.repost(buf);
                return None;
            }
        };
        let from = SocketAddr::new(ip, h.credits);
        let evicted = {
            let mut sources = lock(&self.sources);
            let (tracker, evicted) = sources.touch(from, SeqTracker::default);
            tracker.on_arrival(h.seq);
            evicted
        };
        if let Some((gone, _)) = evicted {
            self.forget_route(&gone);
        }
        self.learn_route(from, wc, &grh);
        c.received.fetch_add(1, Relaxed);
        // The header trails the payload: out of sight.
        let mut buf = buf;
        buf.set_len(buf.len() - HEADER_LEN);
        Some((UdDatagram::new(buf, GRH_LEN, h.seq, self.io.clone()), from))
    }

    /// Cache a route back to `from` built from its completion and GRH, so a
    /// reply needs no resolution. A new QPN at the same address (a new
    /// socket there) replaces the route and restarts its numbering.
    fn learn_route(&self, from: SocketAddr, wc: &ibv_wc, grh: &[u8; GRH_LEN]) {
        if from.port() == 0 {
            return;
        }
        let mut dests = lock(&self.dests);
        if dests.get_mut(&from).is_some_and(|d| d.qpn == wc.src_qp) {
            return;
        }
        match AddressHandle::from_wc(&self.io.pd, wc, grh, self.io.port) {
            Ok(ah) => {
                let d = Dest { ah: Arc::new(ah), qpn: wc.src_qp, qkey: RDMA_UDP_QKEY, seq: 0, learned: true };
                dests.insert(from, d);
            }
            Err(e) => tracing::debug!(%from, error = %e, "cannot build a reply route from a UD completion"),
        }
    }

    /// Drop the reply route learned from `source`, evicted from the source
    /// table, so that sources from the network cannot grow the routes
    /// either. Routes resolved for sends stay. A send in flight on the
    /// route holds its own `Arc` of the address handle (in the send ring,
    /// until its completion is polled), so the handle is destroyed only
    /// once no send uses it; a later send to `source` resolves it again.
    fn forget_route(&self, source: &SocketAddr) {
        let mut dests = lock(&self.dests);
        let gone = if dests.get(source).is_some_and(|d| d.learned) { dests.remove(source) } else { None };
        drop(dests);
        drop(gone);
    }
}
