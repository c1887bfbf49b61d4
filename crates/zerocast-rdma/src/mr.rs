//! Memory registration: [`MemoryRegion`] and the pool's [`VerbsRegistrar`].

use std::fmt;
use std::os::raw::c_int;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys::{ibv_access_flags, ibv_dereg_mr, ibv_mr, ibv_reg_mr};
use zerocast_mem::{Keys, RegisterError, Registrar, Registration};

use crate::device::ProtectionDomain;
use crate::error::errno_from_rc;

/// The access every zerocast region gets: the device may write received data
/// into it, and peers may read and write it one-sidedly.
fn default_access() -> ibv_access_flags {
    ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
        | ibv_access_flags::IBV_ACCESS_REMOTE_READ
        | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
}

/// A registered memory region (`ibv_mr`). Deregistered on drop, before its
/// protection domain can be freed.
///
/// The region does not own the memory it covers: whoever registered it keeps
/// that memory alive and in place until the region is dropped.
pub struct MemoryRegion {
    raw: NonNull<ibv_mr>,
    pd: Arc<ProtectionDomain>,
    len: usize,
}

// SAFETY: an MR is an immutable handle once registered; deregistering it is a
// thread-safe verb, so it may be moved to and dropped on any thread.
unsafe impl Send for MemoryRegion {}
// SAFETY: `&self` methods only read the keys, which never change.
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    /// Register `len` bytes at `addr` in `pd`, for local write and remote
    /// read and write.
    ///
    /// Fails with [`RegisterError::MemLock`] when the locked-memory limit is
    /// too small (`ulimit -l`), [`RegisterError::Device`] otherwise.
    ///
    /// # Safety
    /// `addr..addr + len` must be memory of this process that stays allocated,
    /// and is not unmapped or moved, until the returned region is dropped: the
    /// device, and through it remote peers, may read and write it all that time.
    pub unsafe fn register(
        pd: &Arc<ProtectionDomain>,
        addr: NonNull<u8>,
        len: usize,
    ) -> Result<Self, RegisterError> {
        // The flags are small bit values (0x1 | 0x2 | 0x4): the cast is lossless.
        let access = default_access().0 as c_int;
        let device = pd.context().name();
        // SAFETY: `pd` is a live PD (held by the returned region); the caller
        // guarantees the memory range stays valid while the region lives.
        let raw = unsafe { ibv_reg_mr(pd.as_ptr(), addr.as_ptr().cast(), len, access) };
        match NonNull::new(raw) {
            Some(raw) => Ok(Self { raw, pd: Arc::clone(pd), len }),
            None => Err(RegisterError::from_os(device, len, std::io::Error::last_os_error())),
        }
    }

    /// The region's local and remote keys.
    pub fn keys(&self) -> Keys {
        // SAFETY: `self.raw` points to the live `ibv_mr` filled in by
        // `ibv_reg_mr`; its keys are plain fields that never change.
        let mr = unsafe { self.raw.as_ref() };
        Keys { lkey: mr.lkey, rkey: mr.rkey }
    }

    /// Length of the region in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The protection domain the region belongs to.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: `self.raw` is a live MR, deregistered exactly once, while
        // `self.pd` still keeps its PD and context alive.
        let rc = unsafe { ibv_dereg_mr(self.raw.as_ptr()) };
        if rc != 0 {
            tracing::warn!(
                device = %self.pd.context().name(),
                error = %errno_from_rc(rc),
                "ibv_dereg_mr failed"
            );
        }
    }
}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("device", &self.pd.context().name())
            .field("len", &self.len)
            .field("keys", &self.keys())
            .finish()
    }
}

/// Registers a zerocast pool's regions with a verbs device.
///
/// Each registration keeps its [`MemoryRegion`], which keeps the protection
/// domain, so the pool can outlive the registrar itself.
#[derive(Debug, Clone)]
pub struct VerbsRegistrar {
    pd: Arc<ProtectionDomain>,
}

impl VerbsRegistrar {
    /// A registrar that registers into `pd`.
    pub fn new(pd: Arc<ProtectionDomain>) -> Self {
        Self { pd }
    }

    /// The protection domain regions are registered in.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }
}

impl Registrar for VerbsRegistrar {
    fn register(&self, addr: NonNull<u8>, len: usize) -> Result<Registration, RegisterError> {
        // SAFETY: the `Registrar` contract: the pool keeps the region allocated
        // and in place until the returned `Registration` (which owns the MR)
        // has been dropped.
        let mr = unsafe { MemoryRegion::register(&self.pd, addr, len) }?;
        tracing::debug!(device = %self.name(), len, keys = ?mr.keys(), "registered region");
        Ok(Registration::new(mr.keys(), mr))
    }

    fn name(&self) -> &str {
        self.pd.context().name()
    }
}
