//! What each work completion means: a received frame (or write with
//! immediate) handed to the link, a send or one-sided request done, a
//! rendezvous READ or finish done, or an error that fails the connection.
//! Called by whichever thread polls the CQ (see `poll`).

use std::sync::atomic::Ordering;

use rdma_sys::{ibv_wc, ibv_wc_flags, ibv_wc_opcode, ibv_wc_status};
use zerocast_core::{ConnError, FrameKind, Header, HEADER_LEN};
use zerocast_link::Driver;
use zerocast_mem::Buf;

use super::{lock, Io, RECV_BIT};
use crate::rc::one_sided::ONE_SIDED_BIT;
use crate::rc::rendezvous::{self, Arrival, Descriptor, FINISH_WR_ID, READ_WR_ID};
use crate::rc::RcError;

/// Act on one work completion.
pub(super) fn on_completion(io: &Io, driver: &Driver, wc: &ibv_wc) {
    if wc.wr_id & RECV_BIT != 0 {
        let slot = (wc.wr_id & !RECV_BIT) as usize;
        let buf = match &io.srq {
            // The slot is in the listener's shared table.
            Some(m) => m.shared().take(slot),
            None => {
                let mut t = lock(&io.recv);
                let buf = t.slots.get_mut(slot).and_then(Option::take);
                if buf.is_some() {
                    t.posted -= 1;
                    t.free.push(slot as u32);
                }
                buf
            }
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
            on_receive(io, driver, wc, buf)
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
        lock(&io.send).ring.complete_through(wc.wr_id);
        io.completed(driver);
        if wc.status != ibv_wc_status::IBV_WC_SUCCESS {
            on_error(io, driver, wc.status, wc.vendor_err);
        }
    }
}

/// The peer's RDMA WRITE with immediate consumed this receive: its bytes
/// are in our memory; the application gets an empty message carrying the
/// immediate, in order.
fn on_write_imm(io: &Io, driver: &Driver, wc: &ibv_wc, mut buf: Buf) -> Result<(), ConnError> {
    let Some(imm) = immediate(wc) else {
        return Err(ConnError::transport(RcError::BadFrame("write with immediate without immediate".into())));
    };
    buf.try_set_len(0).map_err(ConnError::transport)?;
    rendezvous::arrive(io, driver, Arrival::Immediate(imm, buf))
}

/// The immediate value a completion carries, if any.
fn immediate(wc: &ibv_wc) -> Option<u32> {
    if wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 == 0 {
        return None;
    }
    // SAFETY: `IBV_WC_WITH_IMM` is set, so the union holds the immediate.
    Some(u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data }))
}

/// A send landed in `buf`. A data frame comes with its header in the
/// immediate (see `engine/send.rs`) and its payload alone in the buffer;
/// any other frame comes whole, its header first.
fn on_receive(io: &Io, driver: &Driver, wc: &ibv_wc, mut buf: Buf) -> Result<(), ConnError> {
    let byte_len = wc.byte_len as usize;
    buf.try_set_len(byte_len).map_err(ConnError::transport)?;
    if let Some(imm) = immediate(wc) {
        let (credits, seq_low) = short_header(imm);
        return rendezvous::arrive(io, driver, Arrival::Short(credits, seq_low, buf));
    }
    let header = Header::decode(&buf[..byte_len.min(HEADER_LEN)], driver.max_payload())?;
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
            let msg = "a data frame with its header in the payload (data frames carry it in the immediate)";
            Err(ConnError::transport(RcError::BadFrame(msg.into())))
        }
        FrameKind::Rendezvous if header.len == 0 => {
            // A finish: outside the credit window, its receive is one of
            // those kept for finishes and goes back at once.
            repost_now(buf)?;
            io.rendezvous.on_finish().map_err(ConnError::transport)?;
            io.completed(driver);
            Ok(())
        }
        FrameKind::Rendezvous => {
            let d =
                Descriptor::decode(&buf[HEADER_LEN..], driver.max_payload()).map_err(ConnError::transport)?;
            // The message will arrive in a buffer of its own; this one goes
            // back to the pool, and its release reposts a fresh one.
            drop(buf);
            rendezvous::arrive(io, driver, Arrival::Request(header, d))
        }
        FrameKind::Credit | FrameKind::Control => {
            // The buffer carried only the header: post it again at once
            // (the core counts the credit as owed already).
            repost_now(buf)?;
            rendezvous::arrive(io, driver, Arrival::Frame(header))
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

/// The immediate of a data frame sent with its header in it: the credits
/// returned (high 16 bits) and the low 16 bits of its sequence number.
pub(super) fn short_immediate(credits: u16, seq: u32) -> u32 {
    (u32::from(credits) << 16) | (seq & 0xffff)
}

/// [`short_immediate`] read back.
fn short_header(imm: u32) -> (u16, u16) {
    ((imm >> 16) as u16, imm as u16)
}

#[cfg(test)]
mod tests {
    use super::{short_header, short_immediate};

    #[test]
    fn a_short_header_keeps_the_credits_and_the_low_bits_of_the_sequence() {
        assert_eq!(short_header(short_immediate(0, 0)), (0, 0));
        assert_eq!(short_header(short_immediate(513, 7)), (513, 7));
        assert_eq!(short_header(short_immediate(u16::MAX, u32::MAX)), (u16::MAX, u16::MAX));
        assert_eq!(short_header(short_immediate(3, 0x1_2345)), (3, 0x2345), "the low 16 bits");
    }
}
