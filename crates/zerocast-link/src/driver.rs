//! The backend's side of a connection: what to write, what was read.

use std::fmt;
use std::sync::Arc;

use crossbeam_channel::Receiver;
use zerocast_core::{ConnError, FrameKind, Header};
use zerocast_mem::{Buf, Pool};

use crate::shared::{Delivery, Outgoing, Shared, State};

/// One frame for the writer: a stamped header and, for data, its payload.
///
/// Dropping the payload returns it to the pool: a stream backend drops it
/// once written; an RDMA backend keeps it in its in-flight table until the
/// send completes.
#[derive(Debug)]
pub struct Frame {
    /// The header to put in front of the payload.
    pub header: Header,
    /// The payload (data frames only).
    pub payload: Option<Buf>,
    /// 0 for a plain frame. Otherwise the tag the application gave
    /// [`crate::Link::send_tagged`]: the backend carries this data frame in
    /// its own way (an RDMA WRITE with immediate, say). The header then
    /// returns no credits.
    pub tag: u32,
}

/// The handle a backend's I/O threads use. Clone it for each thread.
#[derive(Clone)]
pub struct Driver {
    shared: Arc<Shared>,
    outgoing: Receiver<Outgoing>,
}

impl fmt::Debug for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Driver").field("peer", &self.shared.peer).finish_non_exhaustive()
    }
}

impl Driver {
    pub(crate) fn new(shared: Arc<Shared>, outgoing: Receiver<Outgoing>) -> Self {
        Self { shared, outgoing }
    }

    /// Wait for work and fill `batch` with up to `max_batch` stamped frames.
    ///
    /// Returns `false` when the writer should stop: the connection failed,
    /// or both sides said goodbye. Frames already in `batch` on a `true`
    /// return must be written; on `false` the batch is empty.
    pub fn next_batch(&self, batch: &mut Vec<Frame>) -> bool {
        loop {
            {
                // Both goodbyes are out (ours in the previous batch, after
                // the peer's): nothing will be sent or woken for any more.
                let st = self.shared.lock();
                if st.failed.is_some() || (st.goodbye_sent && st.peer_closed) {
                    return false;
                }
            }
            let first = match self.outgoing.recv() {
                Ok(item) => item,
                // Unreachable while `Shared` holds the sender; stop anyway.
                Err(_) => return false,
            };
            let mut st = self.shared.lock();
            self.stamp(&mut st, first, batch);
            while batch.len() < self.shared.max_batch {
                match self.outgoing.try_recv() {
                    Ok(item) => self.stamp(&mut st, item, batch),
                    Err(_) => break,
                }
            }
            if st.failed.is_some() {
                batch.clear();
                return false;
            }
            if batch.is_empty() {
                if let Some(stamp) = st.credits.poll_credit_frame() {
                    batch.push(Frame { header: stamp.header(FrameKind::Credit, 0), payload: None, tag: 0 });
                }
            }
            if st.local_closed && !st.goodbye_sent && self.outgoing.is_empty() {
                if let Some(stamp) = st.credits.poll_control_frame() {
                    st.goodbye_sent = true;
                    batch.push(Frame { header: stamp.header(FrameKind::Control, 0), payload: None, tag: 0 });
                }
            }
            if !batch.is_empty() {
                return true;
            }
            if st.goodbye_sent && st.peer_closed {
                return false;
            }
        }
    }

    fn stamp(&self, st: &mut State, item: Outgoing, batch: &mut Vec<Frame>) {
        match item {
            Outgoing::Data(buf, r, tag) => {
                let stamp = if tag == 0 { st.credits.commit(r) } else { st.credits.commit_bare(r) };
                let header = stamp.header(FrameKind::Data, buf.len() as u64);
                batch.push(Frame { header, payload: Some(buf), tag });
            }
            Outgoing::Wake => st.wake_queued = false,
        }
    }

    /// Account for a frame the reader decoded. Data payloads go to the
    /// application. An error means the peer broke the protocol; the
    /// connection is already marked failed when it is returned.
    pub fn on_frame(&self, header: Header, payload: Option<Buf>) -> Result<(), ConnError> {
        self.on_frame_inner(header, payload, None)
    }

    /// Account for a data frame that arrived without a header, as the
    /// immediate value `imm` of an RDMA WRITE with immediate: it takes the
    /// next sequence number and returns no credits. `buf` is the receive
    /// buffer it consumed (empty); the application sees `imm` through
    /// [`crate::RecvBuf::immediate`].
    pub fn on_immediate(&self, imm: u32, buf: Buf) -> Result<(), ConnError> {
        let seq = self.shared.lock().credits.next_rx_seq();
        let header = Header::new(FrameKind::Data, 0, seq, buf.len() as u64);
        self.on_frame_inner(header, Some(buf), Some(imm))
    }

    fn on_frame_inner(
        &self,
        header: Header,
        payload: Option<Buf>,
        imm: Option<u32>,
    ) -> Result<(), ConnError> {
        let mut st = self.shared.lock();
        if let Err(e) = st.credits.on_receive(&header) {
            drop(st);
            return Err(self.fail(e.into()));
        }
        if header.credits > 0 {
            self.shared.credit_cv.notify_all();
        }
        match header.kind {
            FrameKind::Data => {
                let Some(buf) = payload else {
                    drop(st);
                    return Err(self.fail(ConnError::Unsupported("payload-less data")));
                };
                if st.receiver_gone {
                    drop(buf);
                    let _ = st.credits.release();
                } else if self.shared.delivered_tx.try_send(Delivery::Msg(buf, imm)).is_err() {
                    // Credits make this impossible; a full queue means the
                    // peer overran its window.
                    drop(st);
                    let window = self.shared.lock().credits.window();
                    return Err(self.fail(zerocast_core::CreditError::Overrun { window }.into()));
                }
            }
            FrameKind::Credit => {}
            FrameKind::Control => {
                st.peer_closed = true;
                self.shared.end(&mut st);
            }
            FrameKind::Rendezvous => {
                drop(st);
                return Err(self.fail(ConnError::Unsupported("rendezvous")));
            }
        }
        let goodbye_due = st.local_closed && !st.goodbye_sent;
        if st.credits.wants_credit_frame() || (goodbye_due && header.credits > 0) {
            self.shared.wake_writer(&mut st);
        }
        Ok(())
    }

    /// A released receive buffer was reposted (backends created with
    /// `repost`): return its credit to the peer.
    pub fn on_reposted(&self) {
        self.shared.release_one();
    }

    /// The peer's stream ended cleanly at a frame boundary.
    pub fn on_end(&self) {
        let mut st = self.shared.lock();
        st.peer_closed = true;
        self.shared.end(&mut st);
    }

    /// The connection failed. Senders and receivers see `err` (receivers
    /// after the messages already delivered). Returns `err` for convenience.
    pub fn fail(&self, err: ConnError) -> ConnError {
        let mut st = self.shared.lock();
        if st.failed.is_none() {
            tracing::debug!(peer = %self.shared.peer, error = %err, "connection failed");
            st.failed = Some(err.clone());
        }
        self.shared.end(&mut st);
        err
    }

    /// The writer stopped: what it was given is out (on RDMA: acknowledged).
    /// Wakes [`crate::Link::wait_closed`].
    pub fn writer_done(&self) {
        self.shared.lock().writer_done = true;
        self.shared.credit_cv.notify_all();
    }

    /// Largest payload this side accepts (for the reader's decoder).
    pub fn max_payload(&self) -> u64 {
        self.shared.max_payload
    }

    /// The pool receive buffers come from.
    pub fn pool(&self) -> &Pool {
        &self.shared.pool
    }

    /// The peer, for logs.
    pub fn peer(&self) -> &zerocast_core::Endpoint {
        &self.shared.peer
    }

    /// Whether the connection failed or both sides said goodbye.
    pub fn is_finished(&self) -> bool {
        let st = self.shared.lock();
        st.failed.is_some() || (st.goodbye_sent && st.peer_closed)
    }
}
