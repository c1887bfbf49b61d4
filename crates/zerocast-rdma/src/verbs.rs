//! Queue pairs, address handles and registered header slabs.

use std::fmt;
use std::io;
use std::os::raw::c_int;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use rdma_sys::{
    ibv_ah, ibv_ah_attr, ibv_attach_mcast, ibv_create_ah, ibv_destroy_ah, ibv_detach_mcast, ibv_gid,
};
use rdma_sys::{
    ibv_create_qp, ibv_destroy_qp, ibv_modify_qp, ibv_qp, ibv_qp_attr, ibv_qp_attr_mask, ibv_qp_init_attr,
    ibv_qp_state, ibv_qp_type, ibv_query_qp, ibv_recv_wr, ibv_send_wr, ibv_wc, rdma_create_qp,
    rdma_destroy_qp,
};

use crate::cm::CmId;
use crate::device::ProtectionDomain;
use crate::error::errno_from_rc;
use crate::mr::{Access, MemoryRegion};
use crate::srq::Srq;

pub(crate) use crate::cq::CompletionQueue;

/// Queue sizes of an RC queue pair.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QpCaps<'a> {
    pub(crate) send_wr: u32,
    pub(crate) recv_wr: u32,
    /// Inline data asked for (0: none).
    pub(crate) max_inline: u32,
    /// The shared receive queue the QP takes its receives from (then
    /// `recv_wr` is ignored).
    pub(crate) srq: Option<&'a Arc<Srq>>,
}

/// A queue pair (reliable connected, or unreliable datagram). Holds its
/// CQs and PD (and, when rdma_cm created it, its CM id), so they outlive it.
pub(crate) struct QueuePair {
    raw: NonNull<ibv_qp>,
    cm: Option<Arc<CmId>>,
    _cq: Arc<CompletionQueue>,
    /// The receive CQ, when it is not `_cq`.
    _recv_cq: Option<Arc<CompletionQueue>>,
    pd: Arc<ProtectionDomain>,
    /// The shared receive queue it takes receives from, if any.
    _srq: Option<Arc<Srq>>,
    /// Bytes a send may carry inline (what the provider granted).
    max_inline: u32,
}

// SAFETY: posting and modifying are thread-safe verbs (the provider locks
// each queue).
unsafe impl Send for QueuePair {}
// SAFETY: as above.
unsafe impl Sync for QueuePair {}

fn init_attr(cq: &CompletionQueue, caps: QpCaps<'_>) -> ibv_qp_init_attr {
    // SAFETY: all-zero is a valid `ibv_qp_init_attr` (pointers null, counts 0).
    let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
    attr.send_cq = cq.as_ptr();
    attr.recv_cq = cq.as_ptr();
    attr.cap.max_send_wr = caps.send_wr;
    if let Some(srq) = caps.srq {
        attr.srq = srq.as_ptr();
    } else {
        attr.cap.max_recv_wr = caps.recv_wr;
    }
    attr.cap.max_send_sge = 2;
    attr.cap.max_recv_sge = 2;
    attr.cap.max_inline_data = caps.max_inline;
    attr.qp_type = ibv_qp_type::IBV_QPT_RC;
    attr.sq_sig_all = 0;
    attr
}

/// What a device does with inline data, found by creating probe QPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InlineProbe {
    /// The largest `max_inline_data` a QP creation accepts (up to
    /// [`INLINE_PROBE_MAX`]): the device's real limit, which
    /// `ibv_query_device` does not report.
    pub(crate) device_max: u32,
    /// What the provider grants (writes back into the QP caps) for the
    /// configured request, capped at `device_max`.
    pub(crate) granted: u32,
}

/// The probe's upper bound: no provider inlines more than this.
pub(crate) const INLINE_PROBE_MAX: u32 = 4096;

/// The `max_inline_data` granted to an RC QP that asks for `want`, or
/// `None` when the provider refuses the request. The QP is destroyed at once.
fn inline_granted(pd: &ProtectionDomain, cq: &CompletionQueue, want: u32) -> Option<u32> {
    let mut attr = init_attr(cq, QpCaps { send_wr: 1, recv_wr: 1, max_inline: want, srq: None });
    // SAFETY: live PD and CQ; the QP is destroyed below, before either drops.
    let raw = unsafe { ibv_create_qp(pd.as_ptr(), &mut attr) };
    if raw.is_null() {
        return None;
    }
    // SAFETY: the QP was just created here and is destroyed once.
    unsafe { ibv_destroy_qp(raw) };
    Some(attr.cap.max_inline_data)
}

/// Find the device's inline limit by bisection over probe QPs (a dozen
/// QP creations), and what a request of `want` bytes is granted.
pub(crate) fn probe_inline(pd: &Arc<ProtectionDomain>, want: u32) -> io::Result<InlineProbe> {
    let cq = CompletionQueue::new::<()>(pd.context(), 4, None, None)?;
    let (mut lo, mut hi) = (0u32, INLINE_PROBE_MAX);
    if inline_granted(pd, &cq, 0).is_none() {
        return Err(io::Error::last_os_error());
    }
    if inline_granted(pd, &cq, hi).is_some() {
        lo = hi;
    }
    // Invariant: `lo` is accepted, `hi` refused (or `lo == hi`).
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        match inline_granted(pd, &cq, mid) {
            Some(_) => lo = mid,
            None => hi = mid,
        }
    }
    let granted = inline_granted(pd, &cq, want.min(lo)).unwrap_or(0);
    Ok(InlineProbe { device_max: lo, granted })
}

impl QueuePair {
    /// A QP made with `ibv_create_qp` (out-of-band connections), in RESET.
    pub(crate) fn create(
        pd: &Arc<ProtectionDomain>,
        cq: &Arc<CompletionQueue>,
        caps: QpCaps<'_>,
    ) -> io::Result<Self> {
        let mut attr = init_attr(cq, caps);
        // SAFETY: live PD and CQ (kept alive by the returned QP).
        let mut raw = unsafe { ibv_create_qp(pd.as_ptr(), &mut attr) };
        if raw.is_null() && caps.max_inline > 0 {
            // The device may not do inline data at all: ask for none.
            attr = init_attr(cq, QpCaps { max_inline: 0, ..caps });
            // SAFETY: as above.
            raw = unsafe { ibv_create_qp(pd.as_ptr(), &mut attr) };
        }
        let raw = NonNull::new(raw).ok_or_else(io::Error::last_os_error)?;
        let max_inline = attr.cap.max_inline_data;
        Ok(Self {
            raw,
            cm: None,
            _cq: cq.clone(),
            _recv_cq: None,
            pd: pd.clone(),
            _srq: caps.srq.cloned(),
            max_inline,
        })
    }

    /// A QP made by rdma_cm on `id` (`rdma_create_qp`); rdma_cm moves it
    /// through its states on connect/accept.
    pub(crate) fn create_cm(
        id: &Arc<CmId>,
        pd: &Arc<ProtectionDomain>,
        cq: &Arc<CompletionQueue>,
        caps: QpCaps<'_>,
    ) -> io::Result<Self> {
        let mut attr = init_attr(cq, caps);
        // SAFETY: live id bound to the PD's device (checked by the caller),
        // live PD and CQ kept alive by the returned QP.
        let mut rc = unsafe { rdma_create_qp(id.as_ptr(), pd.as_ptr(), &mut attr) };
        if rc != 0 && caps.max_inline > 0 {
            attr = init_attr(cq, QpCaps { max_inline: 0, ..caps });
            // SAFETY: as above.
            rc = unsafe { rdma_create_qp(id.as_ptr(), pd.as_ptr(), &mut attr) };
        }
        if rc != 0 {
            return Err(errno_from_rc(rc));
        }
        // SAFETY: live id; `rdma_create_qp` set its `qp`.
        let raw = unsafe { (*id.as_ptr()).qp };
        let raw = NonNull::new(raw).ok_or_else(|| io::Error::other("rdma_create_qp made no QP"))?;
        let max_inline = attr.cap.max_inline_data;
        Ok(Self {
            raw,
            cm: Some(id.clone()),
            _cq: cq.clone(),
            _recv_cq: None,
            pd: pd.clone(),
            _srq: caps.srq.cloned(),
            max_inline,
        })
    }

    /// An unreliable-datagram QP (`ibv_create_qp`) with separate send and
    /// receive CQs and one SGE per receive, in RESET; see [`ud_ready`](Self::ud_ready).
    pub(crate) fn create_ud(
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        caps: QpCaps<'_>,
    ) -> io::Result<Self> {
        let mut attr = init_attr(send_cq, caps);
        attr.recv_cq = recv_cq.as_ptr();
        attr.cap.max_recv_sge = 1;
        attr.qp_type = ibv_qp_type::IBV_QPT_UD;
        // SAFETY: live PD and CQs (kept alive by the returned QP).
        let mut raw = unsafe { ibv_create_qp(pd.as_ptr(), &mut attr) };
        if raw.is_null() && caps.max_inline > 0 {
            attr.cap.max_inline_data = 0;
            // SAFETY: as above.
            raw = unsafe { ibv_create_qp(pd.as_ptr(), &mut attr) };
        }
        let raw = NonNull::new(raw).ok_or_else(io::Error::last_os_error)?;
        let max_inline = attr.cap.max_inline_data;
        Ok(Self {
            raw,
            cm: None,
            _cq: send_cq.clone(),
            _recv_cq: Some(recv_cq.clone()),
            pd: pd.clone(),
            _srq: None,
            max_inline,
        })
    }

    /// Drive a UD QP from RESET to RTS on `port` with Q_Key `qkey` (P_Key index 0).
    pub(crate) fn ud_ready(&self, port: u8, qkey: u32) -> io::Result<()> {
        use ibv_qp_attr_mask as m;
        // SAFETY: all-zero is a valid `ibv_qp_attr`.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ibv_qp_state::IBV_QPS_INIT;
        attr.pkey_index = 0;
        attr.port_num = port;
        attr.qkey = qkey;
        self.modify(&mut attr, m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_QKEY)?;
        attr.qp_state = ibv_qp_state::IBV_QPS_RTR;
        self.modify(&mut attr, m::IBV_QP_STATE)?;
        attr.qp_state = ibv_qp_state::IBV_QPS_RTS;
        attr.sq_psn = 0;
        self.modify(&mut attr, m::IBV_QP_STATE | m::IBV_QP_SQ_PSN)
    }

    /// Attach this (UD) QP to the multicast group `mgid`/`mlid`.
    pub(crate) fn attach_mcast(&self, mgid: &ibv_gid, mlid: u16) -> io::Result<()> {
        // SAFETY: live QP; `mgid` is a valid GID for the call.
        let rc = unsafe { ibv_attach_mcast(self.raw.as_ptr(), mgid, mlid) };
        if rc != 0 {
            return Err(errno_from_rc(rc));
        }
        Ok(())
    }

    /// Detach this QP from a group it was attached to.
    pub(crate) fn detach_mcast(&self, mgid: &ibv_gid, mlid: u16) -> io::Result<()> {
        // SAFETY: live QP; `mgid` is a valid GID for the call.
        let rc = unsafe { ibv_detach_mcast(self.raw.as_ptr(), mgid, mlid) };
        if rc != 0 {
            return Err(errno_from_rc(rc));
        }
        Ok(())
    }

    pub(crate) fn qp_num(&self) -> u32 {
        // SAFETY: live QP; `qp_num` never changes.
        unsafe { (*self.raw.as_ptr()).qp_num }
    }

    pub(crate) fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// Bytes (header included) a send may carry inline.
    pub(crate) fn max_inline(&self) -> u32 {
        self.max_inline
    }

    pub(crate) fn cm(&self) -> Option<&Arc<CmId>> {
        self.cm.as_ref()
    }

    /// `ibv_modify_qp` with `attr` and `mask`.
    pub(crate) fn modify(&self, attr: &mut ibv_qp_attr, mask: ibv_qp_attr_mask) -> io::Result<()> {
        // SAFETY: live QP; `attr` is a valid attribute struct for `mask`.
        let rc = unsafe { ibv_modify_qp(self.raw.as_ptr(), attr, mask.0 as c_int) };
        if rc != 0 {
            return Err(errno_from_rc(rc));
        }
        Ok(())
    }

    /// How many RDMA READs this QP may have outstanding as their initiator
    /// (`max_rd_atomic`, as the connection's setup negotiated it); 1, the
    /// depth every setup asks for at least, when the query fails.
    pub(crate) fn read_depth(&self) -> u32 {
        // SAFETY: all-zero is a valid `ibv_qp_attr` and `ibv_qp_init_attr`.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        let mask = ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC.0 as c_int;
        // SAFETY: live QP; both structs are writable and outlive the call.
        let rc = unsafe { ibv_query_qp(self.raw.as_ptr(), &mut attr, mask, &mut init) };
        if rc != 0 {
            return 1;
        }
        u32::from(attr.max_rd_atomic)
    }

    /// Move the QP to the error state: every posted WR completes, flushed.
    pub(crate) fn to_error(&self) -> io::Result<()> {
        // SAFETY: all-zero is a valid `ibv_qp_attr`.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ibv_qp_state::IBV_QPS_ERR;
        self.modify(&mut attr, ibv_qp_attr_mask::IBV_QP_STATE)
    }

    /// Post the chain of send WRs `wrs` (linked in slice order).
    ///
    /// On failure, returns how many WRs at the front of the chain were
    /// posted (the provider's `bad_wr`) with the error.
    ///
    /// # Safety
    /// `wrs` is a valid chain whose SGEs point into registered memory of
    /// this QP's PD that stays valid until each WR's completion is polled.
    pub(crate) unsafe fn post_send(&self, wrs: &mut [ibv_send_wr]) -> Result<(), (usize, io::Error)> {
        if wrs.is_empty() {
            return Ok(());
        }
        let mut bad: *mut ibv_send_wr = ptr::null_mut();
        // SAFETY: live QP; the caller vouches for the chain.
        let rc = unsafe { rdma_sys::ibv_post_send(self.raw.as_ptr(), wrs.as_mut_ptr(), &mut bad) };
        if rc != 0 {
            let base = wrs.as_ptr() as usize;
            let size = std::mem::size_of::<ibv_send_wr>();
            let posted = (bad as usize).checked_sub(base).map_or(0, |d| d / size).min(wrs.len());
            return Err((posted, errno_from_rc(rc)));
        }
        Ok(())
    }

    /// Post one receive WR.
    ///
    /// # Safety
    /// As [`post_send`](Self::post_send), for the receive's SGEs.
    pub(crate) unsafe fn post_recv(&self, wr: *mut ibv_recv_wr) -> io::Result<()> {
        let mut bad: *mut ibv_recv_wr = ptr::null_mut();
        // SAFETY: live QP; the caller vouches for the WR.
        let rc = unsafe { rdma_sys::ibv_post_recv(self.raw.as_ptr(), wr, &mut bad) };
        if rc != 0 {
            return Err(errno_from_rc(rc));
        }
        Ok(())
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        match &self.cm {
            // SAFETY: the id is live (held here) and owns this QP.
            Some(id) => unsafe { rdma_destroy_qp(id.as_ptr()) },
            None => {
                // SAFETY: live QP, destroyed once; CQ and PD outlive it.
                let rc = unsafe { ibv_destroy_qp(self.raw.as_ptr()) };
                if rc != 0 {
                    tracing::warn!(error = %errno_from_rc(rc), "ibv_destroy_qp failed");
                }
            }
        }
    }
}

impl fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePair").field("qp_num", &self.qp_num()).field("cm", &self.cm.is_some()).finish()
    }
}

/// Size of one frame-header slot.
pub(crate) const SLOT: usize = zerocast_core::HEADER_LEN;

/// A registered array of 16-byte slots for what sends carry besides a
/// payload buffer: frame headers, and RC rendezvous descriptors.
pub(crate) struct HeaderSlab {
    ptr: NonNull<u8>,
    /// Bytes mapped: the slots, rounded up to whole pages.
    len: usize,
    slots: usize,
    mr: Option<MemoryRegion>,
}

// SAFETY: the slab is plain memory; each slot is used by one WR at a time,
// whose owner (the in-flight table) serialises access.
unsafe impl Send for HeaderSlab {}
// SAFETY: as above.
unsafe impl Sync for HeaderSlab {}

impl HeaderSlab {
    pub(crate) fn new(pd: &Arc<ProtectionDomain>, slots: usize) -> Result<Self, zerocast_mem::RegisterError> {
        let slots = slots.max(1);
        // Whole pages of their own, kept out of forked children like the
        // pool's regions: no other data shares a page the device writes.
        let len = (slots * SLOT).next_multiple_of(page_size());
        let mapping_failed = |source| zerocast_mem::RegisterError::Device {
            device: pd.context().name().to_owned(),
            requested: len,
            source,
        };
        // SAFETY: an anonymous private mapping at an address of the kernel's
        // choosing touches no existing memory; every argument is valid.
        let raw = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(mapping_failed(io::Error::last_os_error()));
        }
        // SAFETY: mmap succeeded, so `raw` is a non-null page address.
        let ptr = unsafe { NonNull::new_unchecked(raw.cast::<u8>()) };
        let mut slab = Self { ptr, len, slots, mr: None };
        // SAFETY: `ptr..ptr + len` is the mapping just made; the advice only
        // changes what a future fork copies.
        if unsafe { libc::madvise(raw, len, libc::MADV_DONTFORK) } != 0 {
            return Err(mapping_failed(io::Error::last_os_error()));
        }
        // SAFETY: the memory stays mapped until `slab` drops, and the MR
        // (a field of `slab`) is dropped first, in `Drop`.
        slab.mr = Some(unsafe { MemoryRegion::register(pd, ptr, len, Access::Local) }?);
        Ok(slab)
    }

    pub(crate) fn addr(&self, slot: usize) -> u64 {
        debug_assert!(slot < self.slots);
        self.ptr.as_ptr() as u64 + (slot * SLOT) as u64
    }

    pub(crate) fn lkey(&self) -> u32 {
        self.mr.as_ref().map_or(0, |m| m.keys().lkey)
    }

    /// Write a header into `slot` (no WR may be using it).
    pub(crate) fn write(&self, slot: usize, bytes: &[u8; SLOT]) {
        assert!(slot < self.slots, "header slot out of range");
        // SAFETY: in bounds; the slot is owned by the caller's table entry,
        // so no posted WR reads or writes it now.
        unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.as_ptr().add(slot * SLOT), SLOT) };
    }
}

/// The system's page size.
fn page_size() -> usize {
    // SAFETY: sysconf only reads a system constant.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

impl Drop for HeaderSlab {
    fn drop(&mut self) {
        drop(self.mr.take());
        // SAFETY: `ptr`/`len` are the live mapping made in `new`; the MR
        // covering it was deregistered just above, and nothing else
        // refers to it.
        let rc = unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        if rc != 0 {
            tracing::error!(bytes = self.len, error = %io::Error::last_os_error(), "munmap of a header slab failed");
        }
    }
}

impl fmt::Debug for HeaderSlab {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeaderSlab").field("slots", &self.slots).finish()
    }
}

/// An address handle (`ibv_ah`): where a UD send goes. Holds its PD.
pub(crate) struct AddressHandle {
    raw: NonNull<ibv_ah>,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: an AH is an immutable handle once created; creating, using and
// destroying AHs are thread-safe verbs.
unsafe impl Send for AddressHandle {}
// SAFETY: as above; `&self` only hands out the pointer for posting.
unsafe impl Sync for AddressHandle {}

impl AddressHandle {
    /// An AH for the attributes rdma_cm resolved (`ibv_create_ah`).
    pub(crate) fn new(pd: &Arc<ProtectionDomain>, attr: &ibv_ah_attr) -> io::Result<Self> {
        let mut attr = *attr;
        // SAFETY: live PD; `attr` is a valid attribute struct for the call.
        let raw = unsafe { ibv_create_ah(pd.as_ptr(), &mut attr) };
        let raw = NonNull::new(raw).ok_or_else(io::Error::last_os_error)?;
        Ok(Self { raw, _pd: pd.clone() })
    }

    /// An AH back to the sender of a received datagram
    /// (`ibv_create_ah_from_wc`), from its completion and its 40-byte GRH.
    pub(crate) fn from_wc(
        pd: &Arc<ProtectionDomain>,
        wc: &ibv_wc,
        grh: &[u8; 40],
        port: u8,
    ) -> io::Result<Self> {
        // SAFETY: `ibv_wc` is plain data (no pointers, no drop glue); a
        // bitwise copy is a valid value.
        let mut wc = unsafe { ptr::read(wc) };
        let mut grh = *grh;
        // SAFETY: live PD; `wc` and `grh` are valid, writable copies (the
        // call only reads them); `ibv_grh` is 40 bytes of plain data.
        let raw =
            unsafe { rdma_sys::ibv_create_ah_from_wc(pd.as_ptr(), &mut wc, grh.as_mut_ptr().cast(), port) };
        let raw = NonNull::new(raw).ok_or_else(io::Error::last_os_error)?;
        Ok(Self { raw, _pd: pd.clone() })
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_ah {
        self.raw.as_ptr()
    }
}

impl Drop for AddressHandle {
    fn drop(&mut self) {
        // SAFETY: live AH, destroyed once; every send posted with it holds
        // an `Arc` of it until its completion is polled.
        let rc = unsafe { ibv_destroy_ah(self.raw.as_ptr()) };
        if rc != 0 {
            tracing::warn!(error = %errno_from_rc(rc), "ibv_destroy_ah failed");
        }
    }
}

impl fmt::Debug for AddressHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AddressHandle").finish_non_exhaustive()
    }
}
